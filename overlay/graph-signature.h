#pragma once

// What identifies a graph for the windows (the match cache and the prepared graphs in flashrt.cu):
// a later pass over a graph with the same signature replays the windows found in the first, without
// asking the predicates again. So the signature covers everything a predicate reads:
// - every node: its address, op, type, flags, memory, view offset, shape, strides, parameters;
// - every node's sources the same way (a source need not be a node of this graph: a leaf, or a node
//   outside a graph view such as the one-node graphs test-backend-ops computes);
// - their sources by address, memory, op, type and shape.
// Host memory is reused: a later graph's tensors can sit at an earlier graph's addresses with
// the same device memory, differing only in a source's type or shape (test-backend-ops computes an
// F16 K and then a BF16 K of the same size so). Hashing sources by address alone replayed the F16
// windows on BF16 data.
//
// A template over the tensor type, so that the unit test (tests/test-graph-signature.cpp) runs
// without ggml: Tensor has ggml_tensor's fields op, type, flags, data, view_src, view_offs,
// ne[], nb[], op_params[] and src[].
//
// FNV-1a in four independent lanes: under a server's load the hook hashes every graph it evaluates
// (~2000 nodes), and one multiply chain is four times as long.

#include <cstdint>
#include <type_traits>

class flashrt_signature_lanes {
  public:
    void mix(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
        lane[0] = (lane[0] ^ a) * prime;
        lane[1] = (lane[1] ^ b) * prime;
        lane[2] = (lane[2] ^ c) * prime;
        lane[3] = (lane[3] ^ d) * prime;
    }

    uint64_t value() const {
        uint64_t h = lane[0];
        for (int k = 1; k < 4; ++k) {
            h = (h ^ (lane[k] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2))) * prime;
        }
        return h;
    }

  private:
    static constexpr uint64_t prime   = 1099511628211ull;
    uint64_t                  lane[4] = { 1469598103934665603ull, 0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full,
                                          0x165667b19e3779f9ull };
};

template <typename Tensor> void flashrt_signature_mix_tensor(flashrt_signature_lanes & h, const Tensor * t) {
    constexpr int dims = (int) std::extent<decltype(Tensor::ne)>::value;
    static_assert(dims % 2 == 0, "shapes are mixed two dimensions at a time");
    h.mix((uint64_t) (uintptr_t) t, (uint64_t) t->op | (uint64_t) t->type << 16 | (uint64_t) t->flags << 32,
          (uint64_t) (uintptr_t) t->data, (uint64_t) t->view_offs ^ (uint64_t) (uintptr_t) t->view_src);
    for (int d = 0; d < dims; d += 2) {
        h.mix((uint64_t) t->ne[d], (uint64_t) t->nb[d], (uint64_t) t->ne[d + 1], (uint64_t) t->nb[d + 1]);
    }
    h.mix((uint64_t) (uint32_t) t->op_params[0], (uint64_t) (uint32_t) t->op_params[1],
          (uint64_t) (uint32_t) t->op_params[2], (uint64_t) (uint32_t) t->op_params[3]);
}

// A source's source: address, memory, op and type, and its shape.
template <typename Tensor> void flashrt_signature_mix_brief(flashrt_signature_lanes & h, const Tensor * t) {
    constexpr int dims = (int) std::extent<decltype(Tensor::ne)>::value;
    static_assert(dims == 4, "a brief tensor mixes four dimensions at once");
    h.mix((uint64_t) (uintptr_t) t, (uint64_t) (uintptr_t) t->data, (uint64_t) t->op | (uint64_t) t->type << 16,
          (uint64_t) t->view_offs);
    h.mix((uint64_t) t->ne[0], (uint64_t) t->ne[1], (uint64_t) t->ne[2], (uint64_t) t->ne[3]);
}

// The number of sources up to the last present one (ggml leaves gaps: FLASH_ATTN_EXT's sinks
// without a mask).
template <typename Tensor> int flashrt_signature_n_src(const Tensor * t) {
    int n = (int) std::extent<decltype(Tensor::src)>::value;
    while (n > 0 && t->src[n - 1] == nullptr) {
        --n;
    }
    return n;
}

template <typename Tensor> uint64_t flashrt_graph_signature(Tensor * const * nodes, int n_nodes) {
    flashrt_signature_lanes h;
    h.mix((uint64_t) n_nodes, 0, 0, 0);
    for (int i = 0; i < n_nodes; ++i) {
        const Tensor * t     = nodes[i];
        const int      n_src = flashrt_signature_n_src(t);
        flashrt_signature_mix_tensor(h, t);
        h.mix((uint64_t) n_src, 0, 0, 0);
        for (int j = 0; j < n_src; ++j) {
            const Tensor * s = t->src[j];
            if (s == nullptr) {
                h.mix(0, 0, 0, (uint64_t) j);
                continue;
            }
            flashrt_signature_mix_tensor(h, s);
            const int n_src_src = flashrt_signature_n_src(s);
            h.mix((uint64_t) n_src_src, 0, 0, 0);
            for (int k = 0; k < n_src_src; ++k) {
                if (s->src[k] != nullptr) {
                    flashrt_signature_mix_brief(h, s->src[k]);
                } else {
                    h.mix(0, 0, 0, (uint64_t) k);
                }
            }
        }
    }
    return h.value();
}
