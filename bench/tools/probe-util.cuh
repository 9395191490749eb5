#pragma once
// What the device probes (fifo-probe, pdl-probe) share: their option lists, medians, and a block's
// bytes copied into shared memory by the bulk-copy engine (vendor/csrc/bulk-copy.cuh's helpers).
// Build the probes with -I bench/tools -I vendor/csrc.

#include "bulk-copy.cuh"
#include "cuda-check.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// "1,2,3" as numbers.
static std::vector<int> parse_list(const char * s) {
    std::vector<int> v;
    for (const char * p = s; *p != '\0';) {
        v.push_back(std::atoi(p));
        const char * comma = std::strchr(p, ',');
        if (comma == nullptr) {
            break;
        }
        p = comma + 1;
    }
    return v;
}

template <typename T> static double median(std::vector<T> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : (double) v[v.size() / 2];
}

constexpr int kProbeBulkChunk = 4096;

// `bytes` (a multiple of 16) from src into shared dst by the bulk-copy engine, 4 KB copies from
// warp 0, completing on `bar` (initialised for one arrival, in its first phase). Every thread
// calls it; probe_bulk_wait then waits for the copies.
static __device__ __forceinline__ void probe_bulk_copy(uint8_t * dst, const uint8_t * src, int bytes, uint64_t * bar) {
    if (threadIdx.x == 0) {
        bulk_bar_arrive_expect(bar, (uint32_t) bytes);
    }
    __syncwarp();
    if (threadIdx.x < 32) {
        const uint64_t policy = bulk_evict_first_policy();
        for (int at = kProbeBulkChunk * threadIdx.x; at < bytes; at += kProbeBulkChunk * 32) {
            bulk_copy(dst + at, src + at, (uint32_t) min(kProbeBulkChunk, bytes - at), bar, policy);
        }
    }
}

// The first phase of `bar` is complete: probe_bulk_copy's bytes have landed.
static __device__ __forceinline__ void probe_bulk_wait(uint64_t * bar) {
    bulk_bar_wait(bar, 0);
}

// `bar` ready for one arrival (thread 0), visible to the copy engine; a block barrier follows it.
static __device__ __forceinline__ void probe_bulk_init(uint64_t * bar) {
    if (threadIdx.x == 0) {
        bulk_bar_init(bar, 1);
        bulk_bar_init_fence();
    }
    __syncthreads();
}

// Whether every size is a multiple of 16 in [lo, hi]; else says so (as `tool`) and returns false.
static bool probe_sizes_ok(const std::vector<int> & sizes, int lo, int hi, const char * tool) {
    for (int b : sizes) {
        if (b < lo || b > hi || b % 16 != 0) {
            std::fprintf(stderr, "%s: --bytes: multiples of 16 from %d up to %d\n", tool, lo, hi);
            return false;
        }
    }
    return true;
}

struct probe_gpu {
    int sms = 0, clock_khz = 0;
};

static probe_gpu probe_gpu_info() {
    probe_gpu g;
    CHECK(cudaDeviceGetAttribute(&g.sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaDeviceGetAttribute(&g.clock_khz, cudaDevAttrClockRate, 0));
    return g;
}

// reps regions of `region` bytes (set to 1), so that each repetition copies bytes not in L2.
static uint8_t * probe_fresh_bytes(int64_t region, int reps) {
    uint8_t * w = nullptr;
    CHECK(cudaMalloc(&w, region * reps));
    CHECK(cudaMemset(w, 1, region * reps));
    return w;
}
