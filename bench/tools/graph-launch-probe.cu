// What does the host pay to launch a CUDA graph, and what sets it? In decode the overlay's step is
// one graph of 313 kernel nodes, and `cargo xtask profile` measured its cudaGraphLaunch call at
// ~51 µs on the H100 (stock's 1644 nodes: ~257 µs): about 0.16 µs a node, all of it between steps
// while the GPU idles. This times the call for straight-line graphs of N nodes of an empty kernel,
// captured from a stream the way ggml-cuda captures decode, in four forms:
//   plain        launches without attributes
//   pdl          every launch with programmatic stream serialization (ggml-cuda's and the
//                overlay's launches in decode)
//   pdl+params   the same with a 2 KB parameter block a launch (the exact GEMV kernel's
//                exact_params is of that order)
//   plain+params without PDL, with the 2 KB block
// For each: the host time of cudaGraphLaunch (the queue drained before each call: as in decode,
// where the host synchronizes between steps), then the GPU time of a replay (events around it).
// Medians over 200 launches after 20 warm-up launches. Prints a markdown table.
//   nvcc -std=c++17 -O3 -arch=sm_90a bench/tools/graph-launch-probe.cu -o graph-launch-probe

#include "cuda-check.cuh"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

struct big_params {
    unsigned words[512];  // 2 KB
};

__global__ void small_kernel(int * sink, int v) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0 && v < 0) {
        sink[0] = v;  // never taken: the kernel has a side effect the compiler must keep
    }
}

__global__ void big_kernel(int * sink, const big_params p) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0 && (int) p.words[threadIdx.x] < 0) {
        sink[0] = 1;
    }
}

static void launch(cudaStream_t stream, bool pdl, bool params, int * sink, const big_params & p) {
    cudaLaunchAttribute attr = {};
    attr.id                                         = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim            = dim3(1);
    cfg.blockDim           = dim3(32);
    cfg.stream             = stream;
    cfg.attrs              = pdl ? &attr : nullptr;
    cfg.numAttrs           = pdl ? 1 : 0;
    if (params) {
        CHECK(cudaLaunchKernelEx(&cfg, big_kernel, sink, p));
    } else {
        CHECK(cudaLaunchKernelEx(&cfg, small_kernel, sink, 1));
    }
}

int main() {
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    int * sink = nullptr;
    CHECK(cudaMalloc(&sink, sizeof(int)));
    big_params p = {};
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int driver = 0, runtime = 0;
    CHECK(cudaDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    std::printf("%s, driver %d, runtime %d\n\n", prop.name, driver, runtime);
    std::printf("| nodes | form | cudaGraphLaunch µs (host) | µs a node | GPU µs a replay |\n|---:|---|---:|---:|---:|\n");
    for (int nodes : { 32, 128, 313, 1024 }) {
        for (int form = 0; form < 4; ++form) {
            const bool pdl = form == 1 || form == 2, params = form >= 2;
            cudaGraph_t     graph;
            cudaGraphExec_t exec;
            CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < nodes; ++i) {
                launch(stream, pdl, params, sink, p);
            }
            CHECK(cudaStreamEndCapture(stream, &graph));
            CHECK(cudaGraphInstantiate(&exec, graph, 0));
            std::vector<double> host, gpu;
            for (int i = 0; i < 220; ++i) {
                CHECK(cudaStreamSynchronize(stream));
                CHECK(cudaEventRecord(start, stream));
                const auto t0 = std::chrono::steady_clock::now();
                CHECK(cudaGraphLaunch(exec, stream));
                const auto t1 = std::chrono::steady_clock::now();
                CHECK(cudaEventRecord(stop, stream));
                CHECK(cudaEventSynchronize(stop));
                float ms = 0.0f;
                CHECK(cudaEventElapsedTime(&ms, start, stop));
                if (i >= 20) {
                    host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
                    gpu.push_back(1000.0 * ms);
                }
            }
            std::sort(host.begin(), host.end());
            std::sort(gpu.begin(), gpu.end());
            static const char * names[] = { "plain", "pdl", "pdl+params", "plain+params" };
            const double h = host[host.size() / 2];
            std::printf("| %d | %s | %.1f | %.3f | %.1f |\n", nodes, names[form], h, h / nodes, gpu[gpu.size() / 2]);
            CHECK(cudaGraphExecDestroy(exec));
            CHECK(cudaGraphDestroy(graph));
        }
    }
    return 0;
}
