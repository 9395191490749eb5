// Where ATTN_DECODE's ~12 µs a layer go (the profile: 11.8 µs exclusive at tg128 against ~5
// predicted from its chain): the kernel alone, launched back to back from a CUDA graph with PDL
// as the overlay launches it, at qwen36's attention shape (head size 256, 16 query heads over 2
// key/value heads, one token), against what it is made of:
//
//   empty                 an empty kernel (a launch inside a graph)
//   empty cluster         the kernel's grid (8 x 2, clusters of 8, its shared memory) doing only
//                         the PDL wait and its two cluster barriers
//   attn n_kv=N vis=V     the kernel over N cells of which the first V are visible (the rest
//                         masked), the caches hot (one layer's, L2-resident up to ~1024 cells) or
//                         cold (a different layer's each launch: read from DRAM); past
//                         FRT_ATTN_DECODE_MAX_KV cells (and on the rows marked split) the split
//                         kernels (independent blocks over runs of cells, then the combine)
//
// Prints µs a launch (median graph replay / launches). The outputs are not checked here:
// test-decode-attention does that.
//
// Build and run (device): nvcc -std=c++17 -O3 -arch=sm_90a -I vendor/csrc -I bench/tools \
//     bench/tools/attn-decode-bench.cu vendor/csrc/decode-attention.cu vendor/csrc/pdl.cu \
//     -o /tmp/attn-decode-bench && /tmp/attn-decode-bench [CELLS[,CELLS...]]
// (CELLS: only the cases over those cache sizes, e.g. 256,1024,8448.)
// With -DFRT_ATTN_DECODE_TRACE (both files) the kernel notes the global timer at its phases and a
// second table gives, per case, when the last launch's blocks passed them (the µs a launch
// include the marks' cost: a few stores a block).

#include "cuda-check.cuh"
#include "decode-attention.cuh"
#include "pdl.cuh"

#include <algorithm>
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace cg = cooperative_groups;

constexpr int d = 256, heads = 16, heads_kv = 2;

static __global__ void empty_kernel() {
    frt_pdl_wait();
    frt_pdl_launch_dependents();
}

static __global__ void empty_cluster_kernel() {
    extern __shared__ uint8_t smem[];
    cg::cluster_group cluster = cg::this_cluster();
    frt_pdl_wait();
    frt_pdl_launch_dependents();
    smem[threadIdx.x] = 0;
    cluster.sync();
    cluster.sync();
}

static double us_per_launch(cudaStream_t stream, int reps, const std::function<void(int)> & launch) {
    cudaGraph_t     graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int r = 0; r < reps; ++r) {
        launch(r);
    }
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    for (int w = 0; w < 10; ++w) {
        CHECK(cudaGraphLaunch(exec, stream));
    }
    std::vector<float> ms;
    for (int i = 0; i < 100; ++i) {
        CHECK(cudaEventRecord(start, stream));
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaEventRecord(stop, stream));
        CHECK(cudaEventSynchronize(stop));
        float t = 0.0f;
        CHECK(cudaEventElapsedTime(&t, start, stop));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    return 1000.0 * ms[ms.size() / 2] / reps;
}

#ifdef FRT_ATTN_DECODE_TRACE
// The kernels' phase marks (decode-attention.cuh) of the last launch as one table row: `blocks`
// blocks mark phases 0-7 (the cluster or the split kernel), `late_blocks` phases 8-9 (the cluster
// kernel's same blocks, or the split kernels' combine).
static std::string phase_row(const std::string & name, int blocks, int late_blocks) {
    constexpr int phases = FRT_ATTN_DECODE_TRACE_PHASES;
    static unsigned long long marks[FRT_ATTN_DECODE_TRACE_BLOCKS][FRT_ATTN_DECODE_TRACE_PHASES];
    CHECK(frt_attn_decode_trace(&marks[0][0]));
    blocks      = std::min(blocks, FRT_ATTN_DECODE_TRACE_BLOCKS);
    late_blocks = std::min(late_blocks, FRT_ATTN_DECODE_TRACE_BLOCKS);
    unsigned long long base = marks[0][1];
    for (int b = 0; b < blocks; ++b) {
        base = std::min(base, marks[b][1]);
    }
    char row[512];
    int  n = std::snprintf(row, sizeof(row), "| %s |", name.c_str());
    for (int p = 0; p < phases; ++p) {
        std::vector<double> us;
        for (int b = 0; b < (p < 8 ? blocks : late_blocks); ++b) {
            us.push_back(((double) marks[b][p] - (double) base) / 1000.0);
        }
        std::sort(us.begin(), us.end());
        n += std::snprintf(row + n, sizeof(row) - n, " %.2f / %.2f |", us[us.size() / 2], us.back());
    }
    return row;
}
#endif

int main(int argc, char ** argv) {
    // Optional: the cache sizes to run, comma-separated (e.g. 256,1024,8448); all by default.
    std::vector<int> only;
    for (const char * p = argc > 1 ? argv[1] : ""; *p != '\0';) {
        char * end = nullptr;
        only.push_back((int) std::strtol(p, &end, 10));
        if (end == p) {
            std::fprintf(stderr, "usage: %s [CELLS[,CELLS...]]\n", argv[0]);
            return 2;
        }
        p = *end == ',' ? end + 1 : end;
    }
    struct shape {
        int  n_kv, visible;
        bool split;        // the split kernels on a cache the cluster kernel takes by default
        int  split_cells;  // the most cells a split block takes (0: the plan's)
    };
    const shape shapes[] = {
        { 8, 1 },
        { 256, 1 },
        { 256, 64 },
        { 256, 128 },
        { 256, 256 },
        { 256, 256, true },
        { 512, 512 },
        { 512, 512, true },
        { 1024, 1024 },
        { 1024, 1024, true },
        { 1024, 1024, true, 16 },
        { 2048, 2048 },
        { 4096, 4096 },
        { 8448, 8448 },
        { 8448, 8448, false, 64 },
        { 8448, 8448, false, 96 },
        { 16384, 16384 },
        { 16384, 16384, false, 96 },
    };
    for (const int n_kv : only) {  // a size no shape has would print an empty table
        if (std::none_of(std::begin(shapes), std::end(shapes), [&](const shape & s) { return s.n_kv == n_kv; })) {
            std::fprintf(stderr, "attn-decode-bench: no case of %d cells; the cases' sizes:", n_kv);
            int last = -1;
            for (const shape & s : shapes) {
                if (s.n_kv != last) {
                    std::fprintf(stderr, " %d", s.n_kv);
                    last = s.n_kv;
                }
            }
            std::fprintf(stderr, "\n");
            return 2;
        }
    }
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::mt19937 rng(std::random_device{}());
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);

    // 192 layers' caches of 16384 cells: 16384 x 2 x 256 x 2 bytes = 16 MB each for K and for V
    // (6.4 GB in all); a cache of fewer cells is the first cells of one.
    constexpr int layers = 192, max_kv = 16384;
    const size_t  cache  = (size_t) max_kv * heads_kv * d;
    std::vector<__half> host(cache);
    for (__half & h : host) {
        h = __float2half(dist(rng));
    }
    __half * k = nullptr;
    __half * v = nullptr;
    CHECK(cudaMalloc(&k, layers * cache * sizeof(__half)));
    CHECK(cudaMalloc(&v, layers * cache * sizeof(__half)));
    for (int l = 0; l < layers; ++l) {
        CHECK(cudaMemcpy(k + l * cache, host.data(), cache * sizeof(__half), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(v + l * cache, host.data(), cache * sizeof(__half), cudaMemcpyHostToDevice));
    }
    std::vector<float> qh((size_t) heads * d);
    for (float & x : qh) {
        x = dist(rng);
    }
    float *  q    = nullptr;
    float *  out  = nullptr;
    __half * mask = nullptr;
    CHECK(cudaMalloc(&q, qh.size() * sizeof(float)));
    CHECK(cudaMalloc(&out, qh.size() * sizeof(float)));
    CHECK(cudaMalloc(&mask, max_kv * sizeof(__half)));
    CHECK(cudaMemcpy(q, qh.data(), qh.size() * sizeof(float), cudaMemcpyHostToDevice));

#ifdef FRT_ATTN_DECODE_TRACE
    std::vector<std::string> phase_rows;
#endif
    std::printf("| case | µs a launch |\n|---|---:|\n");
    const int reps = layers;  // cold: every layer's cache once a replay, 96 MB at 256 cells (L2 50 MB)
    std::printf("| empty | %.2f |\n", us_per_launch(stream, reps, [&](int) {
                    CHECK(frt_launch_clustered(empty_kernel, dim3(1), dim3(256), 0, stream, 1));
                }));
    const int smem_256 = (int) ((size_t) 32 * (d + 8) * 2 + (size_t) 32 * d * 2 + 8 * d * 4 + 8 * (d + 4) * 4);
    CHECK(cudaFuncSetAttribute(empty_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_256));
    std::printf("| empty cluster (8 x 2, %d KB) | %.2f |\n", smem_256 / 1024,
                us_per_launch(stream, reps, [&](int) {
                    CHECK(frt_launch_clustered(empty_cluster_kernel, dim3(FRT_ATTN_DECODE_SPLIT, heads_kv), dim3(256),
                                               smem_256, stream, FRT_ATTN_DECODE_SPLIT));
                }));

    // The long caches' partials: the most any shape above asks.
    float * scratch       = nullptr;
    size_t  scratch_bytes = 0;
    for (const shape & s : shapes) {
        frt_attn_decode_args a = {};
        a.d = d, a.heads = heads, a.heads_kv = heads_kv, a.n_q = 1, a.n_kv = s.n_kv;
        a.split_from = s.split ? 1 : 0, a.split_cells = s.split_cells;
        scratch_bytes = std::max(scratch_bytes, frt_attn_decode_scratch_bytes(a));
    }
    CHECK(cudaMalloc(&scratch, std::max<size_t>(scratch_bytes, 1)));
    std::vector<__half> mh(max_kv);
    for (const shape & s : shapes) {
        if (!only.empty() && std::find(only.begin(), only.end(), s.n_kv) == only.end()) {
            continue;
        }
        for (int c = 0; c < max_kv; ++c) {
            mh[c] = __float2half(c < s.visible ? 0.0f : -INFINITY);
        }
        CHECK(cudaMemcpy(mask, mh.data(), max_kv * sizeof(__half), cudaMemcpyHostToDevice));
        for (const bool cold : { false, true }) {
            const double us = us_per_launch(stream, reps, [&](int r) {
                const size_t         layer = cold ? (size_t) r : 0;
                frt_attn_decode_args a     = {};
                a.d = d, a.heads = heads, a.heads_kv = heads_kv, a.n_q = 1, a.n_kv = s.n_kv;
                a.q = q, a.q_token = (int64_t) heads * d, a.q_head = d;
                a.k = k + layer * cache, a.k_cell = (int64_t) heads_kv * d, a.k_head = d;
                a.v = v + layer * cache, a.v_cell = (int64_t) heads_kv * d, a.v_head = d;
                a.mask = mask, a.mask_row = max_kv;
                a.out = out, a.out_token = (int64_t) heads * d, a.out_head = d;
                a.scale = 0.0625f;
                a.scratch = scratch;
                a.split_from = s.split ? 1 : 0, a.split_cells = s.split_cells;
                CHECK(frt_attn_decode(a, stream));
            });
            frt_attn_decode_args shape_args = {};
            shape_args.d = d, shape_args.heads = heads, shape_args.heads_kv = heads_kv, shape_args.n_q = 1;
            shape_args.n_kv = s.n_kv, shape_args.split_from = s.split ? 1 : 0, shape_args.split_cells = s.split_cells;
            const int         chunks = frt_attn_decode_chunks(shape_args);
            const std::string kind   = chunks <= 1 ? "cluster" :
                                       "split: " + std::to_string(chunks) + " chunks a head" +
                                           (s.split_cells > 0 ? ", at most " + std::to_string(s.split_cells) + " cells" : "");
            std::printf("| attn n_kv=%d vis=%d %s (%s, %d of %d blocks resident) | %.2f |\n", s.n_kv, s.visible,
                        cold ? "cold" : "hot", kind.c_str(),
                        frt_attn_decode_resident_blocks(shape_args),
                        (chunks > 1 ? chunks : FRT_ATTN_DECODE_SPLIT) * heads_kv, us);
#ifdef FRT_ATTN_DECODE_TRACE
            {
                char name[128];
                std::snprintf(name, sizeof(name), "n_kv=%d vis=%d %s %s", s.n_kv, s.visible, cold ? "cold" : "hot",
                              chunks <= 1 ? "cluster" : "split");
                int early = 0, late = 0;
                frt_attn_decode_trace_blocks(shape_args, &early, &late);
                phase_rows.push_back(phase_row(name, early, late));
            }
#endif
        }
    }
#ifdef FRT_ATTN_DECODE_TRACE
    std::printf("\nPhases of the last launch of a replay, µs from the first block past its PDL wait (median "
                "block / last block). Cluster rows: 0 start, 1 past the wait, 2 loads issued, 3 copies landed, 4 past "
                "the cluster wait, 5 first row scored, 6 its V summed, 7 partials stored, 8 past the cluster barrier, "
                "9 combined and written (the end). Split rows: 0 start, 1 past the wait, 2 copies issued and the mask "
                "in shared memory, 3 K's first stage landed, 4 first row group scored, 5 its softmax, 6 V landed, 7 "
                "partials stored (the end); the combine's blocks: 8 past its wait, 9 written (the end)\n\n"
                "| case | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 |\n"
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const std::string & row : phase_rows) {
        std::printf("%s\n", row.c_str());
    }
#endif
    CHECK(cudaGetLastError());
    return 0;
}
