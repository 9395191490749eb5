#pragma once
// For the vendor kernel tests: CHECK stops on the first failing CUDA call, naming it and where
// (exit status 2, apart from a test's own failures); upload, download and upload_poisoned move
// host vectors to and from the device.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        const cudaError_t err_ = (call);                                                           \
        if (err_ != cudaSuccess) {                                                                 \
            std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(err_), __FILE__, __LINE__); \
            std::exit(2);                                                                          \
        }                                                                                          \
    } while (0)

constexpr uint32_t kPoison = 0xffffffffu;  // a NaN

template <typename T> T * upload(const std::vector<T> & v) {
    T * d = nullptr;
    CHECK(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * sizeof(T)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

// n floats on the device, every one the poison NaN: what a kernel leaves unwritten shows.
static inline float * upload_poisoned(size_t n) {
    return (float *) upload(std::vector<uint32_t>(n, kPoison));
}

template <typename T> std::vector<T> download(const T * d, size_t n) {
    std::vector<T> v(n);
    CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}
