// Do a kernel's copies issued before its wait for the previous kernel (programmatic dependent launch)
// land while that kernel still runs? The question behind the exact GEMV kernel's decode trace
// (bench/results/2026-12-02-8709b87-h200-exact-trace): in every launch the staged rows landed only
// just after x, which is read after the wait, however long the blocks had waited with their copies
// issued (ssm_out's: 4.4 µs of waiting, 18 KB a block, and still in flight after x).
// Two kernels back to back on one stream, the second launched with programmatic stream
// serialization (as ggml-cuda and the overlay launch):
//   busy    32 blocks of 1024 threads (one an SM, like GDN's kernel) that let their dependents
//           launch at once, spin BUSY_US on the SM clock without touching memory, then note the
//           global timer;
//   staged  2 blocks an SM of 512 threads (the exact kernel's shape; those on the busy SMs start
//           when the busy blocks leave), each copying BYTES of fresh memory (not in L2) into shared
//           memory, in one of three orders:
//     land-first   cp.async copies, cp.async.wait_all (landed), griddepcontrol.wait (waited)
//     wait-first   cp.async copies, griddepcontrol.wait (waited), cp.async.wait_all (landed): the
//                  exact kernel's order
//     l2-first     cp.async.bulk.prefetch.L2 of its bytes, griddepcontrol.wait (waited), then the
//                  cp.async copies and their wait (landed): copies from L2 after the wait
//     bulk-first   the bytes copied by the bulk-copy engine (cp.async.bulk, 4 KB copies from warp 0,
//                  an mbarrier), the mbarrier's wait (landed), then griddepcontrol.wait (waited)
//   and, with no copies (once, whatever BYTES), whether the first read after the wait of what the
//   kernel before wrote is slower than a read of older data (in the exact kernel's trace every
//   prologue took 2-6 µs after the wait, also where nothing was in flight):
//     fresh-x      griddepcontrol.wait (waited), then every thread loads 16 bytes of an 8 KB vector
//                  the busy kernel wrote at its end (landed: x in)
//     old-x        the same loads of an 8 KB vector written before the busy kernel ran
// Thread 0 of each block notes the global timer at its start and at both marks. Prints, over the
// blocks that started at least 2 µs before the busy kernel ended (medians over blocks and
// repetitions), when the copies landed (or x was in) and the wait ended, in µs after the busy
// kernel's end (negative: before it). If copies are served before the wait, land-first lands well before the busy end; if
// the hardware holds them until the wait, it lands after it.
//
// Usage: pdl-probe [--bytes 18432,55296] [--busy-us 8] [--reps 20]
// Build: nvcc -std=c++17 -O3 -arch=sm_90a -I bench/tools -I vendor/csrc bench/tools/pdl-probe.cu -o pdl-probe

#include "cuda-check.cuh"
#include "probe-util.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

constexpr int kThreads   = 512;
constexpr int kMaxBytes  = 104 * 1024;
constexpr int kBusy      = 32;
constexpr int kBusyThreads = 1024;

enum probe_order : int { kLandFirst, kWaitFirst, kL2First, kBulkFirst, kFreshX, kOldX };
constexpr int kXFloat4s = 512;  // x: 8 KB

static __device__ __forceinline__ unsigned long long globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}

// Spins, then writes its part of `fresh` (kBusy x kBusyThreads floats) and notes its end.
static __global__ void __launch_bounds__(kBusyThreads)
    busy_kernel(long long cycles, float * fresh, unsigned long long * end) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    fresh[blockIdx.x * kBusyThreads + threadIdx.x] = (float) t0;
    __syncthreads();
    if (threadIdx.x == 0) {
        end[blockIdx.x] = globaltimer();
    }
}

// times[4 b ..]: start, landed, waited (global timer, ns), SM.
template <int ORDER>
static __global__ void __launch_bounds__(kThreads, 2)
    staged_kernel(const uint8_t * w, int64_t slice, int bytes, const float4 * x, float * sink, unsigned long long * times) {
    extern __shared__ __align__(16) uint8_t smem[];
    const uint8_t *    src   = w + (int64_t) blockIdx.x * slice;
    unsigned long long start = 0, landed = 0, waited = 0;
    if (threadIdx.x == 0) {
        start = globaltimer();
    }
    const auto copy = [&]() {
        for (int at = 16 * threadIdx.x; at < bytes; at += 16 * kThreads) {
            const unsigned dst = (unsigned) __cvta_generic_to_shared(smem + at);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src + at) : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    const auto land = [&]() {
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads();
        if (threadIdx.x == 0) {
            landed = globaltimer();
        }
    };
    const auto wait = [&]() {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        __syncthreads();
        if (threadIdx.x == 0) {
            waited = globaltimer();
        }
    };
    if (ORDER == kFreshX || ORDER == kOldX) {
        wait();
        const float4 v = x[threadIdx.x % kXFloat4s];
        sink[blockIdx.x * kThreads + threadIdx.x] = v.x + v.y + v.z + v.w;  // needs x's value
        __syncthreads();
        if (threadIdx.x == 0) {
            landed = globaltimer();
        }
    } else if (ORDER == kBulkFirst) {
        __shared__ uint64_t bar;
        probe_bulk_init(&bar);
        probe_bulk_copy(smem, src, bytes, &bar);
        probe_bulk_wait(&bar);
        __syncthreads();
        if (threadIdx.x == 0) {
            landed = globaltimer();
        }
        wait();
    } else if (ORDER == kLandFirst) {
        copy();
        land();
        wait();
    } else if (ORDER == kWaitFirst) {
        copy();
        wait();
        land();
    } else {
        if (threadIdx.x == 0) {
            for (int at = 0; at < bytes; at += 16384) {
                const unsigned n = (unsigned) min(16384, bytes - at);
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src + at), "r"(n) : "memory");
            }
        }
        wait();
        copy();
        land();
    }
    if (threadIdx.x == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        times[4 * blockIdx.x]     = start;
        times[4 * blockIdx.x + 1] = landed;
        times[4 * blockIdx.x + 2] = waited;
        times[4 * blockIdx.x + 3] = sm;
    }
}

template <int ORDER>
static void launch_staged(int blocks, int smem, cudaStream_t stream, const uint8_t * w, int64_t slice, int bytes,
                          const float4 * x, float * sink, unsigned long long * times) {
    cudaLaunchAttribute attr = {};
    attr.id                                         = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg                          = {};
    cfg.gridDim                                     = dim3(blocks);
    cfg.blockDim                                    = dim3(kThreads);
    cfg.dynamicSmemBytes                            = (size_t) smem;
    cfg.stream                                      = stream;
    cfg.attrs                                       = &attr;
    cfg.numAttrs                                    = 1;
    CHECK(cudaLaunchKernelEx(&cfg, staged_kernel<ORDER>, w, slice, bytes, x, sink, times));
}

int main(int argc, char ** argv) {
    std::vector<int> sizes   = { 18432, 55296 };
    double           busy_us = 8.0;
    int              reps    = 20;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--bytes" && i + 1 < argc) {
            sizes = parse_list(argv[++i]);
        } else if (arg == "--busy-us" && i + 1 < argc) {
            busy_us = std::atof(argv[++i]);
        } else if (arg == "--reps" && i + 1 < argc) {
            reps = std::max(1, std::atoi(argv[++i]));
        } else {
            std::fprintf(stderr, "usage: pdl-probe [--bytes 18432,55296] [--busy-us 8] [--reps 20]\n");
            return 2;
        }
    }
    if (!probe_sizes_ok(sizes, 16, kMaxBytes, "pdl-probe")) {
        return 2;
    }
    const probe_gpu gpu = probe_gpu_info();
    const int       sms = gpu.sms, clock_khz = gpu.clock_khz;
    const int     blocks = 2 * sms;
    const int64_t slice  = kMaxBytes;
    const int64_t region = (int64_t) blocks * slice;
    unsigned long long *d_times = nullptr, *d_end = nullptr;
    uint8_t *     w      = probe_fresh_bytes(region, reps);
    CHECK(cudaMalloc(&d_times, 4 * blocks * sizeof(unsigned long long)));
    CHECK(cudaMalloc(&d_end, kBusy * sizeof(unsigned long long)));
    float *fresh = nullptr, *old = nullptr, *sink = nullptr;
    CHECK(cudaMalloc(&fresh, kBusy * kBusyThreads * sizeof(float)));
    CHECK(cudaMalloc(&old, kXFloat4s * sizeof(float4)));
    CHECK(cudaMemset(old, 0, kXFloat4s * sizeof(float4)));
    CHECK(cudaMalloc(&sink, (size_t) blocks * kThreads * sizeof(float)));
    const int smem = kMaxBytes;
    CHECK(cudaFuncSetAttribute(staged_kernel<kLandFirst>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CHECK(cudaFuncSetAttribute(staged_kernel<kWaitFirst>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CHECK(cudaFuncSetAttribute(staged_kernel<kL2First>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CHECK(cudaFuncSetAttribute(staged_kernel<kBulkFirst>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CHECK(cudaFuncSetAttribute(staged_kernel<kFreshX>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CHECK(cudaFuncSetAttribute(staged_kernel<kOldX>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const long long cycles = (long long) (busy_us * clock_khz / 1e3);

    std::printf("pdl-probe: busy %d blocks x %d threads for %.1f µs, then %d staged blocks of %d threads (2 an SM) "
                "launched as its programmatic dependents; medians over %d repetitions x the blocks that started at "
                "least 2 µs before the busy kernel ended; µs after the busy kernel's end\n\n",
                kBusy, kBusyThreads, busy_us, blocks, kThreads, reps);
    std::printf("| bytes a block | order | early blocks | block start | copies landed | wait ended |\n");
    std::printf("|---:|---|---:|---:|---:|---:|\n");
    const char * names[] = { "land-first", "wait-first", "l2-first", "bulk-first", "fresh-x", "old-x" };
    std::vector<unsigned long long> times(4 * blocks), end(kBusy);
    for (size_t si = 0; si < sizes.size(); ++si) {
        const int bytes = sizes[si];
        for (int order = kLandFirst; order <= (si + 1 == sizes.size() ? kOldX : kBulkFirst); ++order) {
            std::vector<double> starts, lands, waits;
            int                 early = 0;
            for (int r = 0; r < reps + 1; ++r) {  // the first one warms up
                const uint8_t * src = w + region * (r % reps);
                busy_kernel<<<kBusy, kBusyThreads, 0, stream>>>(cycles, fresh, d_end);
                const float4 * x = (const float4 *) (order == kFreshX ? fresh : old);
                CHECK(cudaGetLastError());
                switch (order) {
                    case kLandFirst: launch_staged<kLandFirst>(blocks, smem, stream, src, slice, bytes, x, sink, d_times); break;
                    case kWaitFirst: launch_staged<kWaitFirst>(blocks, smem, stream, src, slice, bytes, x, sink, d_times); break;
                    case kL2First:   launch_staged<kL2First>(blocks, smem, stream, src, slice, bytes, x, sink, d_times); break;
                    case kBulkFirst: launch_staged<kBulkFirst>(blocks, smem, stream, src, slice, bytes, x, sink, d_times); break;
                    case kFreshX:    launch_staged<kFreshX>(blocks, smem, stream, src, slice, bytes, x, sink, d_times); break;
                    default:         launch_staged<kOldX>(blocks, smem, stream, src, slice, bytes, x, sink, d_times); break;
                }
                CHECK(cudaStreamSynchronize(stream));
                CHECK(cudaMemcpy(times.data(), d_times, times.size() * sizeof(times[0]), cudaMemcpyDeviceToHost));
                CHECK(cudaMemcpy(end.data(), d_end, end.size() * sizeof(end[0]), cudaMemcpyDeviceToHost));
                if (r == 0) {
                    continue;
                }
                const unsigned long long busy_end = *std::max_element(end.begin(), end.end());
                for (int b = 0; b < blocks; ++b) {
                    const double start = (double) times[4 * b] - (double) busy_end;
                    if (start > -2000.0) {
                        continue;  // started when the busy kernel had (almost) ended
                    }
                    ++early;
                    starts.push_back(start / 1e3);
                    lands.push_back(((double) times[4 * b + 1] - (double) busy_end) / 1e3);
                    waits.push_back(((double) times[4 * b + 2] - (double) busy_end) / 1e3);
                }
            }
            std::printf("| %d | %s | %d | %.2f | %.2f | %.2f |\n", order >= kFreshX ? 0 : bytes, names[order], early / reps, median(starts),
                        median(lands), median(waits));
        }
    }
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(w));
    CHECK(cudaFree(d_times));
    CHECK(cudaFree(d_end));
    CHECK(cudaFree(fresh));
    CHECK(cudaFree(old));
    CHECK(cudaFree(sink));
    return 0;
}
