#pragma once

// For the stand-alone device tools here: stop on the first failing CUDA call, naming it.

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                              \
    do {                                                                                         \
        const cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess) {                                                               \
            std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(err_), __FILE__, \
                         __LINE__);                                                              \
            std::exit(2);                                                                        \
        }                                                                                        \
    } while (0)
