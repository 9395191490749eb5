// Decode-shape latency of the windows' kernels against chains of small kernels shaped like the
// stock ones they replace, all launched from CUDA graphs as ggml-cuda launches them at decode.
// Answers why a window that saves launches did not speed up decode: what a launch costs inside a
// graph, and how long the fused kernel itself takes at one token.
//
//   empty             one empty kernel (the launch cost inside a graph)
//   gated-residual    SHEXP_GATE's kernel, one token, n = 2048 (one block)
//   gated-residual 4  the chain it replaces: mat-vec (one block per output row, as mmvf),
//                     SIGMOID, MUL, ADD+ADD (elementwise, 256-thread blocks)
//   gated-rms-norm    GDN_GATED_NORM's kernel, 32 rows of 128 (one warp per row)
//   gated-rms-norm 2  the pair it replaces: RMS_NORM+MUL (one block per row), SILU+MUL
//   ... v2            candidate rewrites (not used by the windows yet): float4 loads, every load
//                     issued before the reduction, gated-residual spread over n/1024 blocks (each
//                     recomputes the dot product, so out must not alias x); checked against the
//                     windows' kernels on the same random inputs, outputs poisoned first
//
// Each graph holds `reps` launches of the case (in order, on one stream); the time per case is
// the median graph replay time / reps. Inputs are random, inputs and outputs stay L2-resident as
// they do between neighbouring decode kernels. Prints a table.
//
// Build and run (device): nvcc -std=c++17 -O3 -arch=sm_90a -I vendor/csrc \
//     bench/tools/window-latency.cu vendor/csrc/gated-residual.cu vendor/csrc/gated-rms-norm.cu vendor/csrc/pdl.cu \
//     -o /tmp/window-latency && /tmp/window-latency

#include "gated-residual.cuh"
#include "gated-rms-norm.cuh"
#include "cuda-check.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

static __global__ void empty_kernel() {}

// One block per output row, as upstream's mat-vec for F32 weights at one token.
static __global__ void matvec_row(const float * w, const float * x, float * y, int n) {
    float acc = 0.0f;
    for (int c = threadIdx.x; c < n; c += blockDim.x) {
        acc += w[blockIdx.x * (size_t) n + c] * x[c];
    }
    for (int o = 16; o > 0; o >>= 1) {
        acc += __shfl_xor_sync(0xffffffff, acc, o);
    }
    __shared__ float partial[32];
    if (threadIdx.x % 32 == 0) {
        partial[threadIdx.x / 32] = acc;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        acc = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) {
            acc += __shfl_xor_sync(0xffffffff, acc, o);
        }
        if (threadIdx.x == 0) {
            y[blockIdx.x] = acc;
        }
    }
}

static __global__ void sigmoid_kernel(const float * x, float * y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = 1.0f / (1.0f + expf(-x[i]));
    }
}

// out = a * b[0] (the gate broadcast over the row)
static __global__ void mul_broadcast(const float * a, const float * b, float * out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a[i] * b[0];
    }
}

static __global__ void add3(const float * a, const float * b, const float * c, float * out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a[i] + b[i] + c[i];
    }
}

// RMS_NORM fused with the weight MUL, one block per row (as upstream's norm kernel at ncols < 1024).
static __global__ void rms_norm_mul(const float * x, const float * w, float * out, int ncols, float eps) {
    const float * row = x + blockIdx.x * (size_t) ncols;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < ncols; c += blockDim.x) {
        ss += row[c] * row[c];
    }
    for (int o = 16; o > 0; o >>= 1) {
        ss += __shfl_xor_sync(0xffffffff, ss, o);
    }
    const float scale = rsqrtf(ss / ncols + eps);
    for (int c = threadIdx.x; c < ncols; c += blockDim.x) {
        out[blockIdx.x * (size_t) ncols + c] = row[c] * scale * w[c];
    }
}

static __global__ void silu_mul(const float * a, const float * z, float * out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = z[i];
        out[i] = a[i] * (v / (1.0f + expf(-v)));
    }
}

// Candidate: one token, n % 1024 == 0; block b writes elements [1024 b, 1024 (b + 1)).
static __global__ void gated_residual_v2(const float4 * w, const float4 * x, const float4 * s, const float4 * a,
                                         const float4 * r, float4 * out, int n4) {
    const int mine = blockIdx.x * blockDim.x + threadIdx.x;
    // Independent of the gate: in flight while the dot product is reduced.
    const float4 sv = s[mine], av = a[mine], rv = r[mine];
    float dot = 0.0f;
#pragma unroll 2
    for (int c = threadIdx.x; c < n4; c += blockDim.x) {
        const float4 wv = w[c], xv = x[c];
        dot += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
    }
    for (int o = 16; o > 0; o >>= 1) {
        dot += __shfl_xor_sync(0xffffffff, dot, o);
    }
    __shared__ float partial[32];
    if (threadIdx.x % 32 == 0) {
        partial[threadIdx.x / 32] = dot;
    }
    __syncthreads();
    dot = 0.0f;
    for (int k = 0; k < (int) blockDim.x / 32; ++k) {
        dot += partial[k];
    }
    const float g = 1.0f / (1.0f + expf(-dot));
    out[mine] = make_float4(av.x + sv.x * g + rv.x, av.y + sv.y * g + rv.y, av.z + sv.z * g + rv.z,
                            av.w + sv.w * g + rv.w);
}

// Candidate: rows of 128, one warp per row, each lane one float4 of x, z and w, all loaded first.
static __global__ void gated_rms_norm_v2(const float4 * x, const float4 * w, const float4 * z, float4 * out,
                                         float eps) {
    const int i = blockIdx.x * 32 + threadIdx.x;
    const float4 xv = x[i], zv = z[i], wv = w[threadIdx.x];
    float ss = xv.x * xv.x + xv.y * xv.y + xv.z * xv.z + xv.w * xv.w;
    for (int o = 16; o > 0; o >>= 1) {
        ss += __shfl_xor_sync(0xffffffff, ss, o);
    }
    const float scale = rsqrtf(ss / 128.0f + eps);
    const auto gate = [](float v) { return v / (1.0f + expf(-v)); };
    out[i] = make_float4(scale * xv.x * wv.x * gate(zv.x), scale * xv.y * wv.y * gate(zv.y),
                         scale * xv.z * wv.z * gate(zv.z), scale * xv.w * wv.w * gate(zv.w));
}

// Largest |got - want| / max |want| over n floats (NaN: a poisoned element was never written).
static double rel_diff(const float * got, const float * want, size_t n) {
    std::vector<float> g(n), w(n);
    CHECK(cudaMemcpy(g.data(), got, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(w.data(), want, n * sizeof(float), cudaMemcpyDeviceToHost));
    double max_diff = 0.0, max_want = 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(g[i])) {
            return NAN;
        }
        max_diff = std::max(max_diff, (double) std::fabs(g[i] - w[i]));
        max_want = std::max(max_want, (double) std::fabs(w[i]));
    }
    return max_diff / max_want;
}

static void poison(float * d, size_t n) {
    CHECK(cudaMemset(d, 0xff, n * sizeof(float)));  // all-ones bytes: NaN
}

static float * device_random(size_t n, std::mt19937 & rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> host(n);
    for (float & v : host) {
        v = dist(rng);
    }
    float * d = nullptr;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    CHECK(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

// Median microseconds per case: `launch` enqueues one case; a graph holds `reps` of them.
static double us_per_case(cudaStream_t stream, int reps, const std::function<void()> & launch) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int r = 0; r < reps; ++r) {
        launch();
    }
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    for (int w = 0; w < 20; ++w) {
        CHECK(cudaGraphLaunch(exec, stream));
    }
    std::vector<float> ms;
    for (int i = 0; i < 200; ++i) {
        CHECK(cudaEventRecord(start, stream));
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaEventRecord(stop, stream));
        CHECK(cudaEventSynchronize(stop));
        float t = 0.0f;
        CHECK(cudaEventElapsedTime(&t, start, stop));
        ms.push_back(t);
    }
    CHECK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    return 1000.0 * ms[ms.size() / 2] / reps;
}

int main() {
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::mt19937 rng(1234);
    const int reps = 40;  // one per qwen36 layer

    // SHEXP_GATE at one token: w, x, s, a, r of 2048.
    const int n = 2048;
    float * w = device_random(n, rng);
    float * x = device_random(n, rng);
    float * s = device_random(n, rng);
    float * a = device_random(n, rng);
    float * r = device_random(n, rng);
    float * out = device_random(n, rng);
    float * gate_raw = device_random(1, rng);
    float * gate = device_random(1, rng);
    float * gated = device_random(n, rng);

    frt_gated_residual_args gr{};
    gr.w = w, gr.x = x, gr.s = s, gr.a = a, gr.r = r, gr.out = out;
    gr.n = n, gr.n_tokens = 1;
    gr.x_token = gr.s_token = gr.a_token = gr.r_token = gr.out_token = n;

    // GDN_GATED_NORM at one token: 32 value heads of 128.
    const int ncols = 128, nrows = 32, nel = ncols * nrows;
    float * nx = device_random(nel, rng);
    float * nz = device_random(nel, rng);
    float * nw = device_random(ncols, rng);
    float * nnormed = device_random(nel, rng);
    float * nout = device_random(nel, rng);
    frt_gated_rms_norm_args gn{};
    gn.x = nx, gn.w = nw, gn.z = nz, gn.out = nout;
    gn.ncols = ncols, gn.nrows = nrows, gn.nchannels = 1, gn.nsamples = 1;
    gn.x_row = gn.z_row = gn.out_row = ncols;
    gn.x_channel = gn.z_channel = gn.out_channel = nel;
    gn.x_sample = gn.z_sample = gn.out_sample = nel;
    gn.eps = 1e-6f;

    const int eb = 256, eg = (n + eb - 1) / eb;
    struct result {
        const char * name;
        int          launches;
        double       us;
    };
    std::vector<result> results;
    results.push_back({ "empty", 1, us_per_case(stream, reps, [&] { empty_kernel<<<1, 32, 0, stream>>>(); }) });
    results.push_back({ "gated-residual (SHEXP_GATE)", 1, us_per_case(stream, reps, [&] {
                            CHECK(frt_gated_residual_f32(gr, stream));
                        }) });
    results.push_back({ "gated-residual chain (stock-like)", 4, us_per_case(stream, reps, [&] {
                            matvec_row<<<1, 256, 0, stream>>>(w, x, gate_raw, n);
                            sigmoid_kernel<<<1, 32, 0, stream>>>(gate_raw, gate, 1);
                            mul_broadcast<<<eg, eb, 0, stream>>>(s, gate, gated, n);
                            add3<<<eg, eb, 0, stream>>>(a, gated, r, out, n);
                        }) });
    results.push_back({ "gated-rms-norm (GDN_GATED_NORM)", 1, us_per_case(stream, reps, [&] {
                            CHECK(frt_gated_rms_norm_f32(gn, stream));
                        }) });
    results.push_back({ "gated-rms-norm pair (stock-like)", 2, us_per_case(stream, reps, [&] {
                            rms_norm_mul<<<nrows, 32, 0, stream>>>(nx, nw, nnormed, ncols, 1e-6f);
                            silu_mul<<<(nel + eb - 1) / eb, eb, 0, stream>>>(nnormed, nz, nout, nel);
                        }) });

    // The candidates, after checking them against the windows' kernels on these inputs.
    float * want = device_random(n, rng);
    gr.out = want;
    CHECK(frt_gated_residual_f32(gr, stream));
    poison(out, n);
    gated_residual_v2<<<n / 1024, 256, 0, stream>>>((const float4 *) w, (const float4 *) x, (const float4 *) s,
                                                   (const float4 *) a, (const float4 *) r, (float4 *) out, n / 4);
    CHECK(cudaStreamSynchronize(stream));
    const double gr_diff = rel_diff(out, want, n);
    gr.out = out;
    float * nwant = device_random(nel, rng);
    gn.out = nwant;
    CHECK(frt_gated_rms_norm_f32(gn, stream));
    poison(nout, nel);
    gated_rms_norm_v2<<<nrows, 32, 0, stream>>>((const float4 *) nx, (const float4 *) nw, (const float4 *) nz,
                                               (float4 *) nout, 1e-6f);
    CHECK(cudaStreamSynchronize(stream));
    const double gn_diff = rel_diff(nout, nwant, nel);
    gn.out = nout;
    results.push_back({ "gated-residual v2 (candidate)", 1, us_per_case(stream, reps, [&] {
                            gated_residual_v2<<<n / 1024, 256, 0, stream>>>(
                                (const float4 *) w, (const float4 *) x, (const float4 *) s, (const float4 *) a,
                                (const float4 *) r, (float4 *) out, n / 4);
                        }) });
    results.push_back({ "gated-rms-norm v2 (candidate)", 1, us_per_case(stream, reps, [&] {
                            gated_rms_norm_v2<<<nrows, 32, 0, stream>>>((const float4 *) nx, (const float4 *) nw,
                                                                       (const float4 *) nz, (float4 *) nout, 1e-6f);
                        }) });

    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, CUDA graphs of %d cases each, median of 200 replays\n\n", prop.name, reps);
    std::printf("| case | launches | us per case | us per launch |\n|---|---:|---:|---:|\n");
    for (const result & res : results) {
        std::printf("| %s | %d | %.2f | %.2f |\n", res.name, res.launches, res.us, res.us / res.launches);
    }
    std::printf("\ncandidates vs the windows' kernels (max |diff| / max |ref|): gated-residual v2 %.2e, "
                "gated-rms-norm v2 %.2e\n", gr_diff, gn_diff);
    const bool ok = gr_diff < 1e-5 && gn_diff < 1e-5;  // NaN fails too
    if (!ok) {
        std::printf("CANDIDATE MISMATCH\n");
    }
    return ok ? 0 : 1;
}
