// Does an SM serve its copies in flight in order? The question behind the exact GEMV kernel's late
// staging (docs/perf-notes.md, fifteenth session). One wave of blocks (2 an SM, 512 threads, as the
// exact kernel runs), each block in one of two orders:
//   copies-first  cp.async copies of BYTES of its own slice of a large buffer (out of L2: every
//                 repetition reads fresh bytes) into shared memory, then every thread loads 16
//                 bytes of a small vector that is in L2 (x, 8 KB), then it waits for the copies;
//   x-first       x's loads first, then the copies, then the wait;
//   bulk-first    the same bytes copied by the bulk-copy engine (cp.async.bulk, 4 KB a copy, issued
//                 by warp 0, completing on an mbarrier) before x's loads: whether x's loads, which
//                 go through L1 while the bulk copies do not, still queue behind them.
// Thread 0 of each block reads the SM clock before the first request, after a barrier that every
// thread reaches only with its x value stored (x is in), and after the copies have landed. If an
// SM serves its requests in order, copies-first receives x only about when its copies land; if
// not, x arrives at about L2 latency in both orders.
// Prints, per BYTES and order, the medians over blocks and repetitions of x's arrival and of the
// copies' end, in cycles and in µs at the SM clock the driver reports.
//
// Usage: fifo-probe [--bytes 0,8192,32768,55296,98304] [--reps 20]
// Build: nvcc -std=c++17 -O3 -arch=sm_90a -I bench/tools -I vendor/csrc bench/tools/fifo-probe.cu -o fifo-probe

#include "cuda-check.cuh"
#include "probe-util.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

constexpr int kThreads     = 512;
constexpr int kXFloat4s    = 512;  // x: 8 KB
constexpr int kMaxBytes    = 104 * 1024;
constexpr int kSinkBytes   = kThreads * (int) sizeof(float);

enum probe_order : int { kCopiesFirst, kXFirst, kBulkFirst };

template <int ORDER>
static __global__ void __launch_bounds__(kThreads, 2)
    probe_kernel(const uint8_t * w, int64_t slice, int bytes, const float4 * x, long long * times) {
    extern __shared__ __align__(16) uint8_t smem[];
    float *         sink = (float *) (smem + kMaxBytes);
    __shared__ uint64_t bar;
    const uint8_t *     src = w + (int64_t) blockIdx.x * slice;
    if (ORDER == kBulkFirst) {
        probe_bulk_init(&bar);
    }
    __syncthreads();
    const long long t0 = clock64();
    float4          xv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (ORDER == kXFirst) {
        xv = x[threadIdx.x % kXFloat4s];
    }
    if (ORDER == kBulkFirst) {
        probe_bulk_copy(smem, src, bytes, &bar);
    } else {
        for (int at = 16 * threadIdx.x; at < bytes; at += 16 * kThreads) {
            const unsigned dst = (unsigned) __cvta_generic_to_shared(smem + at);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src + at) : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    if (ORDER != kXFirst) {
        xv = x[threadIdx.x % kXFloat4s];
    }
    sink[threadIdx.x] = xv.x + xv.y + xv.z + xv.w;  // needs x's value
    __syncthreads();
    const long long t1 = clock64();
    if (ORDER == kBulkFirst) {
        probe_bulk_wait(&bar);
    } else {
        asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    __syncthreads();
    const long long t2 = clock64();
    if (threadIdx.x == 0) {
        times[2 * blockIdx.x]     = t1 - t0;
        times[2 * blockIdx.x + 1] = t2 - t0;
    }
}

int main(int argc, char ** argv) {
    std::vector<int> sizes = { 0, 8192, 32768, 55296, 98304 };
    int              reps  = 20;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--bytes" && i + 1 < argc) {
            sizes = parse_list(argv[++i]);
        } else if (arg == "--reps" && i + 1 < argc) {
            reps = std::max(1, std::atoi(argv[++i]));
        } else {
            std::fprintf(stderr, "usage: fifo-probe [--bytes 0,8192,...] [--reps 20]\n");
            return 2;
        }
    }
    if (!probe_sizes_ok(sizes, 0, kMaxBytes, "fifo-probe")) {
        return 2;
    }
    const probe_gpu gpu = probe_gpu_info();
    const int       sms = gpu.sms, clock_khz = gpu.clock_khz;
    const int     blocks = 2 * sms;
    const int64_t slice  = kMaxBytes;
    const int64_t region = (int64_t) blocks * slice;  // one repetition's bytes: fresh ones every time
    float4 *      x      = nullptr;
    long long *   d_times = nullptr;
    uint8_t *     w      = probe_fresh_bytes(region, reps);
    CHECK(cudaMalloc(&x, kXFloat4s * sizeof(float4)));
    CHECK(cudaMemset(x, 0, kXFloat4s * sizeof(float4)));
    CHECK(cudaMalloc(&d_times, 2 * blocks * sizeof(long long)));
    const int smem = kMaxBytes + kSinkBytes;
    CHECK(cudaFuncSetAttribute(probe_kernel<kCopiesFirst>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CHECK(cudaFuncSetAttribute(probe_kernel<kXFirst>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CHECK(cudaFuncSetAttribute(probe_kernel<kBulkFirst>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

    std::printf("fifo-probe: %d blocks of %d threads (2 an SM), SM clock %.0f MHz (driver's), medians over %d "
                "repetitions x blocks\n\n",
                blocks, kThreads, clock_khz / 1e3, reps);
    std::printf("| bytes a block | order | x in (cycles) | copies in (cycles) | x in (µs) | copies in (µs) |\n");
    std::printf("|---:|---|---:|---:|---:|---:|\n");
    std::vector<long long> times(2 * blocks);
    for (int bytes : sizes) {
        for (int order = kCopiesFirst; order <= kBulkFirst; ++order) {
            std::vector<long long> x_in, copies_in;
            for (int r = 0; r < reps + 1; ++r) {  // the first one warms up (x into L2, the clocks up)
                const uint8_t * src = w + region * (r % reps);
                if (order == kXFirst) {
                    probe_kernel<kXFirst><<<blocks, kThreads, smem>>>(src, slice, bytes, x, d_times);
                } else if (order == kBulkFirst) {
                    probe_kernel<kBulkFirst><<<blocks, kThreads, smem>>>(src, slice, bytes, x, d_times);
                } else {
                    probe_kernel<kCopiesFirst><<<blocks, kThreads, smem>>>(src, slice, bytes, x, d_times);
                }
                CHECK(cudaGetLastError());
                CHECK(cudaMemcpy(times.data(), d_times, times.size() * sizeof(long long), cudaMemcpyDeviceToHost));
                if (r == 0) {
                    continue;
                }
                for (int b = 0; b < blocks; ++b) {
                    x_in.push_back(times[2 * b]);
                    copies_in.push_back(times[2 * b + 1]);
                }
            }
            const double xc = median(x_in), cc = median(copies_in), mhz = clock_khz / 1e3;
            const char * names[] = { "copies-first", "x-first", "bulk-first" };
            std::printf("| %d | %s | %.0f | %.0f | %.2f | %.2f |\n", bytes, names[order], xc,
                        cc, xc / mhz, cc / mhz);
        }
    }
    CHECK(cudaFree(w));
    CHECK(cudaFree(x));
    CHECK(cudaFree(d_times));
    return 0;
}
