#pragma once
// For the vendor kernel tests: stop on the first failing CUDA call, naming it and where (exit
// status 2, apart from a test's own failures).

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        const cudaError_t err_ = (call);                                                           \
        if (err_ != cudaSuccess) {                                                                 \
            std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(err_), __FILE__, __LINE__); \
            std::exit(2);                                                                          \
        }                                                                                          \
    } while (0)
