// Window GDN's kernels alone (vendor/csrc/gdn-decode): one decode step of a qwen36 Gated DeltaNet
// layer (16 key heads, 32 value heads, head 128) at 1, 2, 4 and 8 sequences. Each setting is a CUDA
// graph of 30 steps, each on its own layer's caches (30 layers: the states, 2 MiB a sequence, leave
// L2 between a layer's steps as in decode); the time per step is the median over 20 replays of the
// graph's time / 30. Prints a markdown table. For A/B of kernel versions: build this file with each
// version's gdn-decode.cu and run both on one GPU.
//   nvcc -std=c++17 -O3 -arch=sm_90a -I vendor/csrc bench/tools/gdn-bench.cu vendor/csrc/gdn-decode.cu \
//        vendor/csrc/pdl.cu -o gdn-bench && ./gdn-bench

#include "cuda-check.cuh"
#include "gdn-decode.cuh"

#include <algorithm>
#include <cstdio>
#include <vector>

int main() {
    constexpr int layers = 30, H_k = 16, H_v = 32, D = FRT_GDN_HEAD_DIM, steps = layers, replays = 20;
    const int     C        = (2 * H_k + H_v) * D;
    const int64_t conv_row = 3 * C, ssm_row = (int64_t) H_v * D * D;
    std::printf("| sequences | µs a layer step | state MiB read + written |\n|---:|---:|---:|\n");
    for (int n : { 1, 2, 4, 8 }) {
        // Per layer: both caches (n rows); the projections and weights shared; all zero (timing only).
        std::vector<void *> buffers;
        const auto zeroed = [&](size_t bytes) {
            void * p = nullptr;
            CHECK(cudaMalloc(&p, bytes));
            CHECK(cudaMemset(p, 0, bytes));
            buffers.push_back(p);
            return (float *) p;
        };
        std::vector<float *> conv(layers), ssm(layers);
        for (int l = 0; l < layers; ++l) {
            conv[l] = zeroed(n * conv_row * sizeof(float));
            ssm[l]  = zeroed(n * ssm_row * sizeof(float));
        }
        float *qkv = zeroed(n * C * 4), *z = zeroed(n * H_v * D * 4), *alpha = zeroed(n * H_v * 4);
        float *beta = zeroed(n * H_v * 4), *conv_w = zeroed(C * 4 * 4), *dt = zeroed(H_v * 4), *a = zeroed(H_v * 4);
        float *norm_w = zeroed(D * 4), *out = zeroed(n * H_v * D * 4);
        int32_t * ids = (int32_t *) zeroed(n * sizeof(int32_t));
        void *    scratch = zeroed(frt_gdn_decode_scratch_bytes(n, H_k, H_v));
        std::vector<int32_t> rows(n);
        for (int s = 0; s < n; ++s) rows[s] = s;
        CHECK(cudaMemcpy(ids, rows.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice));

        frt_gdn_decode_args args = {};
        args.n_seqs = n, args.k_heads = H_k, args.v_heads = H_v;
        args.qkv = qkv, args.qkv_seq = C, args.z = z, args.z_seq = H_v * D, args.z_head = D;
        args.alpha = alpha, args.alpha_seq = H_v, args.beta = beta, args.beta_seq = H_v;
        args.conv_w = conv_w, args.dt_bias = dt, args.a = a, args.norm_w = norm_w, args.weights_constant = true;
        args.ids = ids, args.conv_row = conv_row, args.ssm_row = ssm_row, args.dst_row = 0;
        args.out = out, args.out_seq = H_v * D, args.out_head = D;
        args.l2_eps = 1e-6f / D, args.l2_scale = 0.0883883f, args.norm_eps = 1e-6f, args.attn_scale = 0.0883883f;
        args.scratch = scratch;

        cudaStream_t stream;
        CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        cudaGraph_t graph;
        CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        for (int l = 0; l < steps; ++l) {
            args.conv_state = conv[l], args.ssm_state = ssm[l];
            CHECK(frt_gdn_decode(args, stream));
        }
        CHECK(cudaStreamEndCapture(stream, &graph));
        cudaGraphExec_t exec;
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        cudaEvent_t t0, t1;
        CHECK(cudaEventCreate(&t0));
        CHECK(cudaEventCreate(&t1));
        CHECK(cudaGraphLaunch(exec, stream));  // warm-up
        std::vector<float> us;
        for (int r = 0; r < replays; ++r) {
            CHECK(cudaEventRecord(t0, stream));
            CHECK(cudaGraphLaunch(exec, stream));
            CHECK(cudaEventRecord(t1, stream));
            CHECK(cudaEventSynchronize(t1));
            float ms = 0.0f;
            CHECK(cudaEventElapsedTime(&ms, t0, t1));
            us.push_back(ms * 1000.0f / steps);
        }
        std::sort(us.begin(), us.end());
        std::printf("| %d | %.2f | %.1f |\n", n, us[us.size() / 2], 2.0 * n * ssm_row * 4 / 1048576.0);
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
        CHECK(cudaStreamDestroy(stream));
        for (void * p : buffers) {
            CHECK(cudaFree(p));
        }
    }
    return 0;
}
