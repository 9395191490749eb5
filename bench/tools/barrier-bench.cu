// What a grid-wide barrier costs against a kernel boundary, on the GPU at hand: the first question
// of the layer-as-one-launch design (docs/perf-notes.md, "a layer as one launch"). One wave of
// blocks (2 an SM, 512 threads, as the exact GEMV kernel runs), PHASES phases, each block reading
// BYTES of its own slice of a large buffer into shared memory per phase (cp.async), timed from CUDA
// graphs (median of replays):
//   launches   one kernel a phase, programmatic dependent launch as the overlay launches: each
//              block copies its slice before griddepcontrol.wait (weights), then lets the next
//              kernel start
//   barrier    one kernel, a grid barrier between phases (a counter and an epoch in global memory),
//              each phase's slice copied after the barrier
//   prefetch   one kernel, phase p + 1's slice copied before barrier p (two buffers), as the design
//              stages the next phase's rows while it waits
//   flags      one kernel, a barrier of one flag a block: each block stores the phase it finished
//              into its own word (a release), thread t of every block waits for block t's word (an
//              acquire): no atomics, no block singled out, one round trip to L2 after the last
//              arrival instead of barrier's chain (fence, returning atomic, the last block's
//              store and fence, the others' polls)
//   red        one kernel, one counter that every block adds to without waiting for the result
//              (red.release) and then polls until it holds the phase's count
//   flags+pf   flags, with phase p + 1's slice copied before barrier p
// The one-kernel modes are launched with the cooperative attribute (all blocks resident, which the
// barrier needs) and PDL together, captured in a graph: that the capture and instantiation work is
// the second question. Every block checks that each phase saw every block's previous phase (a
// counter per phase), so a barrier that lets a block through early fails the run.
//
// Usage: barrier-bench [--phases 64] [--bytes 0,32768] [--replays 50]
// Build: nvcc -std=c++17 -O3 -arch=sm_90a -I vendor/csrc -I bench/tools bench/tools/barrier-bench.cu vendor/csrc/pdl.cu -o barrier-bench

#include "cuda-check.cuh"
#include "pdl.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>


constexpr int kThreads   = 512;
constexpr int kMaxStage  = 48 * 1024;  // bytes a buffer

struct bench_args {
    const uint8_t * src;        // blocks x phases x bytes
    int             bytes;      // a block's slice a phase
    int             phases;
    unsigned *      counter;    // barrier arrivals (barrier: reset by the last block; red: only grows)
    unsigned *      flags;      // flags: the phases each block has finished (gridDim.x words)
    unsigned *      epoch;      // barrier generation
    unsigned *      seen;       // per phase: blocks that finished it
    unsigned *      errors;     // blocks that saw a phase unfinished by others
    float *         sink;       // keeps the copies alive
};

static __device__ __forceinline__ void copy_async(uint8_t * dst, const uint8_t * src, int bytes) {
    for (int at = 16 * threadIdx.x; at < bytes; at += 16 * kThreads) {
        const unsigned d = (unsigned) __cvta_generic_to_shared(dst + at);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src + at) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

static __device__ __forceinline__ void copy_wait() {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
}

static __device__ __forceinline__ unsigned load_acquire(const unsigned * p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Every block arrives; the last one resets the counter and moves the epoch on; the others spin on
// the epoch. `epoch` is this block's view of the current generation.
static __device__ __forceinline__ void grid_barrier(const bench_args & a, unsigned & epoch) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(a.counter, 1u) == gridDim.x - 1) {
            *a.counter = 0;
            __threadfence();
            atomicExch(a.epoch, epoch + 1);
        } else {
            while (load_acquire(a.epoch) == epoch) {
            }
        }
    }
    ++epoch;
    __syncthreads();
}

static __device__ __forceinline__ void store_release(unsigned * p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Block b's flag holds how many phases it has finished; `done` is that count for every block once
// all have arrived. The block's barrier orders its threads' writes before thread 0's release; the
// acquiring threads' barrier orders the other blocks' writes before this block's next reads.
static __device__ __forceinline__ void flag_barrier(const bench_args & a, unsigned done) {
    __syncthreads();
    if (threadIdx.x == 0) {
        store_release(a.flags + blockIdx.x, done);
    }
    if (threadIdx.x < gridDim.x) {
        while (load_acquire(a.flags + threadIdx.x) < done) {
        }
    }
    __syncthreads();
}

// The counter holds gridDim.x arrivals a finished phase (zeroed before the launch).
static __device__ __forceinline__ void red_barrier(const bench_args & a, unsigned done) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(a.counter) : "memory");
        while (load_acquire(a.counter) < done * gridDim.x) {
        }
    }
    __syncthreads();
}

enum barrier_kind { kEpoch, kFlags, kRed };

// A phase's work: the staged slice summed (so the copy is used), the block's arrival counted, and
// the previous phase checked complete.
static __device__ void phase_work(const bench_args & a, int phase, const uint8_t * stage, float & acc) {
    for (int at = 4 * threadIdx.x; at < a.bytes; at += 4 * kThreads) {
        acc += (float) *(const uint32_t *) (stage + at);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (phase > 0 && load_acquire(&a.seen[phase - 1]) != gridDim.x) {
            atomicAdd(a.errors, 1u);
        }
        __threadfence();
        atomicAdd(&a.seen[phase], 1u);
    }
}

static __device__ const uint8_t * slice(const bench_args & a, int phase) {
    return a.src + ((int64_t) phase * gridDim.x + blockIdx.x) * a.bytes;
}

__global__ void __launch_bounds__(kThreads, 2) launch_kernel(const bench_args a, int phase) {
    extern __shared__ __align__(16) uint8_t smem[];
    copy_async(smem, slice(a, phase), a.bytes);  // weights: before the wait
    frt_pdl_wait();
    copy_wait();
    frt_pdl_launch_dependents();
    float acc = 0.0f;
    phase_work(a, phase, smem, acc);
    if (acc == -1.0f) {
        a.sink[blockIdx.x] = acc;
    }
}

template <bool PREFETCH, int KIND> __global__ void __launch_bounds__(kThreads, 2) barrier_kernel(const bench_args a) {
    extern __shared__ __align__(16) uint8_t smem[];
    frt_pdl_wait();
    __shared__ unsigned start_epoch;
    if (threadIdx.x == 0) {
        start_epoch = load_acquire(a.epoch);
    }
    __syncthreads();
    unsigned epoch = start_epoch;
    float    acc   = 0.0f;
    if (PREFETCH) {
        copy_async(smem, slice(a, 0), a.bytes);
    }
    for (int phase = 0; phase < a.phases; ++phase) {
        uint8_t * stage = smem + (PREFETCH ? (phase % 2) * kMaxStage : 0);
        if (!PREFETCH) {
            copy_async(stage, slice(a, phase), a.bytes);
        }
        copy_wait();
        phase_work(a, phase, stage, acc);
        if (PREFETCH && phase + 1 < a.phases) {
            copy_async(smem + ((phase + 1) % 2) * kMaxStage, slice(a, phase + 1), a.bytes);
        }
        if (phase + 1 < a.phases) {
            if (KIND == kEpoch) {
                grid_barrier(a, epoch);
            } else if (KIND == kFlags) {
                flag_barrier(a, (unsigned) phase + 1);
            } else {
                red_barrier(a, (unsigned) phase + 1);
            }
        }
    }
    if (acc == -1.0f) {
        a.sink[blockIdx.x] = acc;
    }
}

// Launches one kernel with PDL, plus the cooperative attribute when `cooperative`.
template <typename... Args>
static void launch(void (*kernel)(Args...), int blocks, size_t smem, cudaStream_t stream, bool cooperative,
                   Args... args) {
    cudaLaunchAttribute attrs[2] = {};
    attrs[0].id                                         = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[0].val.programmaticStreamSerializationAllowed = 1;
    attrs[1].id                                         = cudaLaunchAttributeCooperative;
    attrs[1].val.cooperative                            = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim            = dim3(blocks);
    cfg.blockDim           = dim3(kThreads);
    cfg.dynamicSmemBytes   = smem;
    cfg.stream             = stream;
    cfg.attrs              = attrs;
    cfg.numAttrs           = cooperative ? 2 : 1;
    CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

int main(int argc, char ** argv) {
    int              phases = 64, replays = 50;
    std::vector<int> byte_list = { 0, 32768 };
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--phases" && i + 1 < argc) {
            phases = std::atoi(argv[++i]);
        } else if (arg == "--replays" && i + 1 < argc) {
            replays = std::atoi(argv[++i]);
        } else if (arg == "--bytes" && i + 1 < argc) {
            byte_list.clear();
            for (char * t = std::strtok(argv[++i], ","); t != nullptr; t = std::strtok(nullptr, ",")) {
                byte_list.push_back(std::atoi(t));
            }
        } else {
            std::fprintf(stderr, "usage: barrier-bench [--phases 64] [--bytes 0,32768] [--replays 50]\n");
            return 2;
        }
    }
    int device = 0, sms = 0;
    CHECK(cudaGetDevice(&device));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int blocks = 2 * sms;
    if (blocks > kThreads) {  // flags: a thread a block waits
        std::fprintf(stderr, "barrier-bench: %d blocks, more than the %d threads a block that the flags barrier needs\n",
                     blocks, kThreads);
        return 2;
    }
    for (int bytes : byte_list) {
        if (bytes < 0 || bytes > kMaxStage || bytes % 16 != 0) {
            std::fprintf(stderr, "barrier-bench: --bytes from 0 to %d, multiples of 16\n", kMaxStage);
            return 2;
        }
    }
    const int max_bytes = *std::max_element(byte_list.begin(), byte_list.end());
    uint8_t * src = nullptr;
    CHECK(cudaMalloc(&src, std::max<size_t>(16, (size_t) phases * blocks * max_bytes)));
    CHECK(cudaMemset(src, 1, std::max<size_t>(16, (size_t) phases * blocks * max_bytes)));
    unsigned *counter = nullptr, *epoch = nullptr, *seen = nullptr, *errors = nullptr, *flags = nullptr;
    float *   sink    = nullptr;
    CHECK(cudaMalloc(&counter, sizeof(unsigned)));
    CHECK(cudaMalloc(&epoch, sizeof(unsigned)));
    CHECK(cudaMalloc(&seen, phases * sizeof(unsigned)));
    CHECK(cudaMalloc(&errors, sizeof(unsigned)));
    CHECK(cudaMalloc(&flags, blocks * sizeof(unsigned)));
    CHECK(cudaMalloc(&sink, blocks * sizeof(float)));
    CHECK(cudaMemset(counter, 0, sizeof(unsigned)));
    CHECK(cudaMemset(epoch, 0, sizeof(unsigned)));
    // The one-kernel modes: each a barrier_kernel instance, its shared memory (two buffers with
    // the next slice prefetched), and whether its flags and counter must be zeroed before it
    // (barrier's counter is left at zero by its last block).
    struct one_kernel_mode {
        const char * name;
        void (*kernel)(const bench_args);
        size_t smem;
        bool   zeroed;
    };
    const one_kernel_mode one_kernel_modes[] = {
        { "barrier", barrier_kernel<false, kEpoch>, kMaxStage, false },
        { "prefetch", barrier_kernel<true, kEpoch>, 2 * kMaxStage, false },
        { "flags", barrier_kernel<false, kFlags>, kMaxStage, true },
        { "red", barrier_kernel<false, kRed>, kMaxStage, true },
        { "flags+pf", barrier_kernel<true, kFlags>, 2 * kMaxStage, true },
    };
    constexpr int n_modes = 1 + sizeof(one_kernel_modes) / sizeof(one_kernel_modes[0]);  // launches first
    CHECK(cudaFuncSetAttribute(launch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxStage));
    for (const one_kernel_mode & m : one_kernel_modes) {
        CHECK(cudaFuncSetAttribute(m.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) m.smem));
    }
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, device));
    std::printf("%s, %d SMs: %d blocks of %d threads, %d phases, median of %d graph replays\n\n", prop.name, sms,
                blocks, kThreads, phases, replays);
    std::printf("| mode | bytes a block a phase | MB a phase | µs a phase | phases seen early |\n|---|---:|---:|---:|---:|\n");
    int failed = 0;
    for (int bytes : byte_list) {
        for (int mode = 0; mode < n_modes; ++mode) {
            const bench_args a = { src, bytes, phases, counter, flags, epoch, seen, errors, sink };
            const auto       record = [&](cudaStream_t s) {
                CHECK(cudaMemsetAsync(seen, 0, phases * sizeof(unsigned), s));
                if (mode == 0) {
                    for (int p = 0; p < phases; ++p) {
                        launch(launch_kernel, blocks, (size_t) kMaxStage, s, false, a, p);
                    }
                    return;
                }
                const one_kernel_mode & m = one_kernel_modes[mode - 1];
                if (m.zeroed) {
                    CHECK(cudaMemsetAsync(flags, 0, blocks * sizeof(unsigned), s));
                    CHECK(cudaMemsetAsync(counter, 0, sizeof(unsigned), s));
                }
                launch(m.kernel, blocks, m.smem, s, true, a);
            };
            cudaGraph_t graph;
            CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            record(stream);
            CHECK(cudaStreamEndCapture(stream, &graph));
            cudaGraphExec_t exec;
            CHECK(cudaGraphInstantiate(&exec, graph, 0));
            CHECK(cudaMemset(errors, 0, sizeof(unsigned)));
            cudaEvent_t start, stop;
            CHECK(cudaEventCreate(&start));
            CHECK(cudaEventCreate(&stop));
            std::vector<float> ms;
            for (int r = 0; r < replays + 3; ++r) {
                CHECK(cudaEventRecord(start, stream));
                CHECK(cudaGraphLaunch(exec, stream));
                CHECK(cudaEventRecord(stop, stream));
                CHECK(cudaEventSynchronize(stop));
                float t = 0.0f;
                CHECK(cudaEventElapsedTime(&t, start, stop));
                if (r >= 3) {
                    ms.push_back(t);
                }
            }
            std::sort(ms.begin(), ms.end());
            unsigned early = 0;
            CHECK(cudaMemcpy(&early, errors, sizeof(unsigned), cudaMemcpyDeviceToHost));
            failed += early != 0;
            const char * name = mode == 0 ? "launches" : one_kernel_modes[mode - 1].name;
            std::printf("| %s | %d | %.2f | %.2f | %u |\n", name, bytes, (double) bytes * blocks / 1e6,
                        1000.0 * ms[ms.size() / 2] / phases, early);
            CHECK(cudaGraphExecDestroy(exec));
            CHECK(cudaGraphDestroy(graph));
            CHECK(cudaEventDestroy(start));
            CHECK(cudaEventDestroy(stop));
        }
    }
    std::printf("\n%s\n", failed ? "FAIL: a block passed a barrier before every block finished the phase" : "ok");
    return failed ? 1 : 0;
}
