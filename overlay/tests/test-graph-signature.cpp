// Unit test of the graph signature that keys the windows' match cache (graph-signature.h). Built
// and run by `cargo xtask ci` (cell overlay-unit) with the host C++ compiler; needs no GPU and no
// ggml: a tensor with ggml_tensor's fields stands in.
//
// Each case changes one thing a predicate reads, in a copy of a graph whose every address stays the
// same, and expects another signature: the same signature would replay the first graph's windows.

#include "../graph-signature.h"
#include "unit-check.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

struct fake_tensor {
    int           type = 0;
    int           op   = 0;
    int32_t       flags = 0;
    int64_t       ne[4] = { 1, 1, 1, 1 };
    size_t        nb[4] = { 0, 0, 0, 0 };
    int32_t       op_params[16] = {};
    fake_tensor * view_src  = nullptr;
    size_t        view_offs = 0;
    void *        data      = nullptr;
    fake_tensor * src[10]   = {};
};

// The tensor kinds and ops the cases use (values as arbitrary as ggml's are to the hash).
enum { type_f32 = 0, type_f16 = 1, type_bf16 = 30 };
enum { op_none = 0, op_view = 1, op_flash_attn = 2, op_mul_mat = 3 };

static void contiguous(fake_tensor & t, size_t elem) {
    t.nb[0] = elem;
    for (int d = 1; d < 4; ++d) {
        t.nb[d] = t.nb[d - 1] * (size_t) t.ne[d - 1];
    }
}

// The one-node graph test-backend-ops computes for a FLASH_ATTN_EXT case: K and V views of a larger
// cache, a mask, the attention node; fixed addresses (a struct's members) and fixed device memory.
struct attention_graph {
    char        device_memory[4096];
    fake_tensor k_cache, v_cache, k, v, q, mask, out;

    // In place: every address stays.
    void reset() {
        for (fake_tensor * t : { &k_cache, &v_cache, &k, &v, &q, &mask, &out }) {
            *t = fake_tensor();
        }
        for (fake_tensor * cache : { &k_cache, &v_cache }) {
            cache->type = type_f16;
            cache->ne[0] = 64; cache->ne[1] = 1024; cache->ne[2] = 4;
            contiguous(*cache, 2);
            cache->data = cache == &k_cache ? device_memory : device_memory + 1024;
        }
        for (fake_tensor * view : { &k, &v }) {
            fake_tensor & cache = view == &k ? k_cache : v_cache;
            *view = cache;
            view->op = op_view;
            view->ne[1] = 512;
            view->view_src = &cache;
            view->src[0] = &cache;
        }
        q.type = type_f32;
        q.ne[0] = 64; q.ne[1] = 1; q.ne[2] = 4;
        contiguous(q, 4);
        q.data = device_memory + 2048;
        mask.type = type_f16;
        mask.ne[0] = 512;
        contiguous(mask, 2);
        mask.data = device_memory + 2560;
        out.type = type_f32;
        out.op = op_flash_attn;
        out.ne[0] = 64; out.ne[1] = 4; out.ne[2] = 1;
        contiguous(out, 4);
        out.data = device_memory + 3072;
        out.op_params[0] = 0x3e000000;  // the scale's bits
        out.src[0] = &q; out.src[1] = &k; out.src[2] = &v; out.src[3] = &mask;
    }

    uint64_t signature() {
        fake_tensor * nodes[] = { &out };
        return flashrt_graph_signature(nodes, 1);
    }
};

int main() {
    unit_check             check;
    static attention_graph g;
    g.reset();
    const uint64_t base = g.signature();
    g.reset();
    check.expect(g.signature() == base, "the same graph twice: the same signature");

    const std::vector<std::pair<std::string, std::function<void(attention_graph &)>>> changes = {
        { "K's type (F16 to BF16, same size)", [](attention_graph & a) { a.k.type = type_bf16; } },
        { "V's type", [](attention_graph & a) { a.v.type = type_bf16; } },
        { "K's cells (a view over more of the cache)", [](attention_graph & a) { a.k.ne[1] = 768; } },
        { "K's row stride", [](attention_graph & a) { a.k.nb[1] = 256; } },
        { "K's view offset", [](attention_graph & a) { a.k.view_offs = 128; } },
        { "K's cache type (a source's source)", [](attention_graph & a) { a.k_cache.type = type_bf16; } },
        { "K's cache size (a source's source)", [](attention_graph & a) { a.k_cache.ne[1] = 2048; } },
        { "the mask's shape", [](attention_graph & a) { a.mask.ne[1] = 2; } },
        { "no mask", [](attention_graph & a) { a.out.src[3] = nullptr; } },
        { "sinks in the mask's place",
          [](attention_graph & a) {
              a.out.src[4] = a.out.src[3];
              a.out.src[3] = nullptr;
          } },
        { "Q's flags", [](attention_graph & a) { a.q.flags = 1; } },
        { "Q's memory", [](attention_graph & a) { a.q.data = a.device_memory + 2304; } },
        { "the node's parameters", [](attention_graph & a) { a.out.op_params[2] = 0x41f00000; } },
        { "the node's op", [](attention_graph & a) { a.out.op = op_mul_mat; } },
        { "the node's type", [](attention_graph & a) { a.out.type = type_f16; } },
    };
    for (const auto & [what, change] : changes) {
        g.reset();
        change(g);
        check.expect(g.signature() != base, "a new signature when only this changes: " + what);
    }

    // Two nodes in either order.
    {
        g.reset();
        fake_tensor   other = g.out;
        other.data       = g.device_memory + 3584;
        fake_tensor * ab[] = { &g.out, &other };
        fake_tensor * ba[] = { &other, &g.out };
        check.expect(flashrt_graph_signature(ab, 2) != flashrt_graph_signature(ba, 2), "the nodes' order");
        check.expect(flashrt_graph_signature(ab, 1) != flashrt_graph_signature(ab, 2), "the node count");
    }
    return check.finish("test-graph-signature");
}
