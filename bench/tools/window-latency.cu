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
//
// Each graph holds `reps` launches of the case (in order, on one stream); the time per case is
// the median graph replay time / reps. Inputs are random, inputs and outputs stay L2-resident as
// they do between neighbouring decode kernels. Prints a table.
//
// Build and run (device): nvcc -std=c++17 -O3 -arch=sm_90a -I vendor/csrc \
//     bench/tools/window-latency.cu vendor/csrc/gated-residual.cu vendor/csrc/gated-rms-norm.cu \
//     -o /tmp/window-latency && /tmp/window-latency

#include "gated-residual.cuh"
#include "gated-rms-norm.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#define CHECK(call)                                                                              \
    do {                                                                                         \
        const cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess) {                                                               \
            std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(err_), __FILE__, \
                         __LINE__);                                                              \
            std::exit(2);                                                                        \
        }                                                                                        \
    } while (0)

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

    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, CUDA graphs of %d cases each, median of 200 replays\n\n", prop.name, reps);
    std::printf("| case | launches | us per case | us per launch |\n|---|---:|---:|---:|\n");
    for (const result & res : results) {
        std::printf("| %s | %d | %.2f | %.2f |\n", res.name, res.launches, res.us, res.us / res.launches);
    }
    return 0;
}
