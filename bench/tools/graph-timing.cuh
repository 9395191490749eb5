#pragma once
// What the kernel benchmarks (gemv-bench, tail-bench) share: the time of a launch inside a CUDA
// graph, as decode runs it.

#include "cuda-check.cuh"

#include <algorithm>
#include <functional>
#include <vector>

// µs a launch over the replays (median, least, most).
struct timing {
    double median, least, most;
};

// Captures launch_i(0) .. launch_i(launches - 1) on `stream` as one graph, replays it 3 times to
// warm up, then `replays` times, each timed by events: the graph's time / launches.
static timing time_graph(int launches, int replays, cudaStream_t stream,
                         const std::function<void(int, cudaStream_t)> & launch_i) {
    cudaGraph_t     graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < launches; ++i) {
        launch_i(i, stream);
    }
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 3; ++i) {
        CHECK(cudaGraphLaunch(exec, stream));
    }
    std::vector<double> us;
    for (int i = 0; i < replays; ++i) {
        CHECK(cudaEventRecord(start, stream));
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaEventRecord(stop, stream));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        us.push_back(1000.0 * ms / launches);
    }
    std::sort(us.begin(), us.end());
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    return { us[us.size() / 2], us.front(), us.back() };
}
