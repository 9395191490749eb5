// Window MOE_TAIL's kernel alone (vendor/csrc/moe-ffn-tail): one token of a qwen36 MoE FFN's tail
// (2048 columns, 8 experts), plain and with the norm handoff (the output normed and quantized for
// the next layer's matvecs, its 8 blocks meeting at their warp sums). Each setting is a CUDA graph
// of 40 launches one after another (programmatic dependent launch between them, as in decode),
// each on its own layer's buffers; the time per launch is the median over 50 replays of the graph's
// time / 40. The handoff's extra time is its meeting, so versions or switches of the meeting are
// compared by running this under each. Prints a markdown table.
//   nvcc -std=c++17 -O3 -arch=sm_90a -I vendor/csrc -I bench/tools bench/tools/tail-bench.cu vendor/csrc/moe-ffn-tail.cu \
//        vendor/csrc/pdl.cu -o tail-bench && ./tail-bench

#include "cuda-check.cuh"
#include "graph-timing.cuh"
#include "moe-ffn-tail.cuh"
#include "q8-x.cuh"

#include <cstdio>
#include <random>
#include <vector>

int main() {
    constexpr int layers = 40, n = 2048, n_used = 8, replays = 50;
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto upload = [&](size_t count) {
        std::vector<float> host(count);
        for (float & v : host) {
            v = normal(rng);
        }
        float * d = nullptr;
        CHECK(cudaMalloc(&d, count * sizeof(float)));
        CHECK(cudaMemcpy(d, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
        return d;
    };
    // One scratch for all launches, as one context's stream shares it.
    unsigned * scratch = nullptr;
    CHECK(cudaMalloc(&scratch, FRT_MOE_TAIL_NORM_SCRATCH * sizeof(unsigned)));
    CHECK(cudaMemset(scratch, 0, FRT_MOE_TAIL_NORM_SCRATCH * sizeof(unsigned)));
    // Per layer: its own inputs and outputs (a layer's tail reads what its own FFN wrote).
    std::vector<frt_moe_tail_args> plain(layers), handoff(layers);
    for (int l = 0; l < layers; ++l) {
        frt_moe_tail_args & a = plain[l];
        a.n_embd = n, a.n_used = n_used, a.tokens = 1;
        a.experts = upload((size_t) n_used * n), a.experts_token = (int64_t) n_used * n, a.experts_slot = n;
        a.weights = upload(n_used), a.weights_token = n_used;
        a.shexp = upload(n), a.shexp_token = n;
        a.gate = upload(1), a.gate_token = 1;
        a.residual = upload(n), a.residual_token = n;
        a.out = upload(n), a.out_token = n;
        handoff[l]        = a;
        handoff[l].norm_w   = upload(n);
        handoff[l].norm_eps = 1e-6f;
        CHECK(cudaMalloc(&handoff[l].x_q8, frt_x_q8_bytes(n)));
        handoff[l].norm_scratch = scratch;
    }

    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::printf("| tail | µs a launch (median) | least | most |\n|---|---:|---:|---:|\n");
    for (const auto * setting : { &plain, &handoff }) {
        const timing t = time_graph(layers, replays, stream, [&](int l, cudaStream_t st) {
            CHECK(frt_moe_tail((*setting)[l], st));
        });
        std::printf("| %s | %.2f | %.2f | %.2f |\n", setting == &plain ? "plain" : "norm handoff", t.median, t.least,
                    t.most);
    }
    return 0;
}
