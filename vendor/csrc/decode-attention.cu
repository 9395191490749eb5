#include "decode-attention.cuh"
#include "pdl.cuh"
#include "warp-reduce.cuh"

#include <algorithm>
#include <cmath>
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#ifdef FRT_ATTN_DECODE_TRACE
// Measurement builds only (bench/tools/attn-decode-bench.cu): thread 0 of each block notes the
// global timer at the kernel's phases; the last launch's marks are what frt_attn_decode_trace reads.
// `after`: a value the mark is taken after (a mark inside the work, not behind a barrier; the
// asm's operand and memory clobber keep the compiler from hoisting the timer read above it).
static __device__ unsigned long long decode_trace[FRT_ATTN_DECODE_TRACE_BLOCKS][FRT_ATTN_DECODE_TRACE_PHASES];
static __device__ __forceinline__ void decode_mark(int phase, float after = 0.0f) {
    if (threadIdx.x == 0) {
        const int block = blockIdx.y * gridDim.x + blockIdx.x;
        if (block < FRT_ATTN_DECODE_TRACE_BLOCKS) {
            unsigned long long t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "f"(after) : "memory");
            decode_trace[block][phase] = t;
        }
    }
}

cudaError_t frt_attn_decode_trace(unsigned long long * marks) {
    return cudaMemcpyFromSymbol(marks, decode_trace, sizeof(decode_trace));
}
#else
static __device__ __forceinline__ void decode_mark(int, float = 0.0f) {}
#endif

constexpr int decode_threads     = 256;
constexpr int decode_warps       = decode_threads / 32;
constexpr int decode_split       = FRT_ATTN_DECODE_SPLIT;
constexpr int decode_cells_lane  = FRT_ATTN_DECODE_MAX_KV / FRT_ATTN_DECODE_SPLIT / 32;  // cells a lane scores
static_assert(FRT_ATTN_DECODE_MAX_KV % (32 * FRT_ATTN_DECODE_SPLIT) == 0, "a block's cells fill whole warps");
// Long caches: up to 192 cells a block (as shared memory allows), up to 32 clusters a head (a lane
// of the combine's warp each).
constexpr int decode_long_cells_lane = 6;
constexpr int decode_max_chunks      = 32;
static_assert(FRT_ATTN_DECODE_MAX_PAIRS <= decode_split * decode_warps,
              "a warp of the cluster combines at most one query row");

static __device__ __forceinline__ void decode_cp_async16(void * dst, const void * src) {
    const unsigned dst_shared = (unsigned) __cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst_shared), "l"(src) : "memory");
}

// E consecutive halves (E = 2, 4 or 8: 4, 8 or 16 aligned bytes) as floats.
template <int E> static __device__ __forceinline__ void decode_load_halves(const __half * p, float (&f)[E]) {
    static_assert(E == 2 || E == 4 || E == 8, "a lane's dims");
    if constexpr (E == 8) {
        const uint4     raw = *(const uint4 *) p;
        const __half2 * h2  = (const __half2 *) &raw;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 v = __half22float2(h2[i]);
            f[2 * i] = v.x, f[2 * i + 1] = v.y;
        }
    } else if constexpr (E == 4) {
        const uint2     raw = *(const uint2 *) p;
        const __half2 * h2  = (const __half2 *) &raw;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const float2 v = __half22float2(h2[i]);
            f[2 * i] = v.x, f[2 * i + 1] = v.y;
        }
    } else {
        const float2 v = __half22float2(*(const __half2 *) p);
        f[0] = v.x, f[1] = v.y;
    }
}

// Shared memory of a block, in floats' worth of bytes: K rows padded by 16 bytes (lanes reading
// rows lane, lane + 32, ... at one column then hit distinct banks), V rows, a query row a warp,
// the partials (max, sum, 2 floats of padding, weighted V) of the query rows this block combines,
// one from each block of the cluster.
static size_t decode_smem_bytes(int d, int cells, int pairs) {
    const int slots = (pairs + decode_split - 1) / decode_split * decode_split;
    return (size_t) cells * (d + 8) * sizeof(__half) + (size_t) cells * d * sizeof(__half) +
           (size_t) decode_warps * d * sizeof(float) + (size_t) slots * (d + 4) * sizeof(float);
}

// Cluster (r, g, z) of SPLIT blocks: block r scores the cells [b * cells, (b + 1) * cells) of
// key/value head g (b = z * SPLIT + r; z the cluster's chunk of the cache, 0 when one cluster takes
// the head) for every query row p of g (token t, query head h), a warp a row at a time, and stores
// the row's partial into the shared memory of the block that combines it (block p % SPLIT, slot
// (p / SPLIT) * SPLIT + r): remote stores do not wait, where remote loads in the combine cost a
// round trip each (4.9 µs of a 12 µs launch, attn-decode-bench's phase marks). After the cluster
// barrier warp w of block r combines row r + SPLIT * w from its own shared memory, into the output
// (one chunk) or into the chunk's partial in the scratch (frt_attn_decode_combine_kernel's input).
// CL: cells a lane scores (a block's cells at most 32 * CL). CHUNKED: the long caches' instance
// (the grid's z its chunks); the other one's code is the one-cluster kernel's alone.
template <int D, int CL, bool CHUNKED>
static __global__ void __launch_bounds__(decode_threads) frt_attn_decode_kernel(const frt_attn_decode_args a) {
    constexpr int E = D / 32, KPAD = D + 8, PS = D + 4;
    extern __shared__ __align__(16) uint8_t smem[];
    cg::cluster_group cluster = cg::this_cluster();

    const int r = (int) cluster.block_rank(), g = blockIdx.y;
    const int z = CHUNKED ? (int) blockIdx.z : 0, chunks = CHUNKED ? (int) gridDim.z : 1;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int gqa = a.heads / a.heads_kv, pairs = gqa * a.n_q;
    const int cells = (a.n_kv + decode_split * chunks - 1) / (decode_split * chunks);
    const int c0 = (z * decode_split + r) * cells, n_cells = max(0, min(cells, a.n_kv - c0));
    __half *  k_s  = (__half *) smem;
    __half *  v_s  = k_s + (size_t) cells * KPAD;
    float *   q_s  = (float *) (v_s + (size_t) cells * D) + warp * D;  // this warp's query row
    float *   part = (float *) (v_s + (size_t) cells * D) + decode_warps * D;

    decode_mark(0);
    // Remote shared memory may be written only once its block runs: this arrival, and the wait
    // before the first remote store, see to it.
    cluster.barrier_arrive();
    // Everything read here is written by earlier kernels (the cache rows of this step included).
    frt_pdl_wait();
    frt_pdl_launch_dependents();
    decode_mark(1);

    // The block's K and V rows, 16 bytes a copy, all in flight at once; each warp's first query row
    // loads meanwhile.
    constexpr int units = D / 8;
    for (int u = threadIdx.x; u < n_cells * units; u += decode_threads) {
        const int c = u / units, x = u % units;
        decode_cp_async16(k_s + c * KPAD + 8 * x, a.k + (int64_t) (c0 + c) * a.k_cell + (int64_t) g * a.k_head + 8 * x);
        decode_cp_async16(v_s + c * D + 8 * x, a.v + (int64_t) (c0 + c) * a.v_cell + (int64_t) g * a.v_head + 8 * x);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    const auto load_q = [&](int p) {
        const int     t = p / gqa, h = g * gqa + p % gqa;
        const float * q = a.q + (int64_t) t * a.q_token + (int64_t) h * a.q_head;
#pragma unroll
        for (int i = 0; i < E; ++i) {
            q_s[lane + 32 * i] = q[lane + 32 * i];
        }
    };
    // The mask of lane l's cells for query token t (0 without a mask; cells past the block's: -inf).
    float      mk[CL];
    const auto load_mask = [&](int t) {
#pragma unroll
        for (int j = 0; j < CL; ++j) {
            const int c = lane + 32 * j;
            mk[j]       = c >= n_cells      ? -INFINITY :
                          a.mask != nullptr ? __half2float(a.mask[(int64_t) t * a.mask_row + c0 + c]) :
                                              0.0f;
        }
    };
    if (warp < pairs) {
        load_q(warp);
        load_mask(warp / gqa);
    }
    decode_mark(2);
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    decode_mark(3);
    cluster.barrier_wait();  // every block of the cluster runs: its shared memory may be written
    decode_mark(4);

    for (int p = warp; p < pairs; p += decode_warps) {
        if (p != warp) {
            __syncwarp();  // the previous row's reads of q_s are done
            load_q(p);
            load_mask(p / gqa);
        }
        __syncwarp();
        // Lane l scores cells l, l + 32, ... of the block; a hidden cell's score is -inf whatever
        // its row holds (NaN * anything stays NaN), and its dot is never formed.
        float s[CL];
        float m = -INFINITY;
#pragma unroll
        for (int j = 0; j < CL; ++j) {
            const int c = lane + 32 * j;
            s[j]        = -INFINITY;
            if (mk[j] != -INFINITY) {
                float dot = 0.0f;
#pragma unroll 4
                for (int i = 0; i < D; i += 8) {
                    float        kf[8];
                    const float4 qa = *(const float4 *) (q_s + i);
                    const float4 qb = *(const float4 *) (q_s + i + 4);
                    decode_load_halves<8>(k_s + c * KPAD + i, kf);
                    dot += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3];
                    dot += qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                }
                s[j] = dot * a.scale + mk[j];
            }
            m = fmaxf(m, s[j]);
        }
        m = frt_warp_max(m);
        if (p == warp) {
            decode_mark(5, m);
        }
        float e[CL];
        float l = 0.0f;
#pragma unroll
        for (int j = 0; j < CL; ++j) {
            e[j] = m == -INFINITY || s[j] == -INFINITY ? 0.0f : expf(s[j] - m);
            l += e[j];
        }
        l = frt_warp_sum(l);
        // Lane l: the weighted V of dims [l * E, l * E + E).
        float o[E];
#pragma unroll
        for (int i = 0; i < E; ++i) {
            o[i] = 0.0f;
        }
        // Cells 8 at a time: their weights, then their rows' loads, issued together.
#pragma unroll
        for (int j = 0; j < CL; ++j) {
            for (int cc0 = 0; cc0 < 32 && 32 * j + cc0 < n_cells; cc0 += 8) {
                float w[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    w[u] = __shfl_sync(0xffffffff, e[j], cc0 + u, 32);
                }
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    // A hidden cell (weight 0) is skipped: its row may hold anything, even NaN.
                    if (32 * j + cc0 + u < n_cells && w[u] != 0.0f) {
                        float vf[E];
                        decode_load_halves<E>(v_s + (32 * j + cc0 + u) * D + lane * E, vf);
#pragma unroll
                        for (int i = 0; i < E; ++i) {
                            o[i] += w[u] * vf[i];
                        }
                    }
                }
            }
        }
        if (p == warp) {
            decode_mark(6, o[0]);
        }
        float * pp = cluster.map_shared_rank(part, p % decode_split) + ((p / decode_split) * decode_split + r) * PS;
        if (lane == 0) {
            pp[0] = m;
            pp[1] = l;
        }
#pragma unroll
        for (int i = 0; i < E; ++i) {
            pp[4 + lane * E + i] = o[i];
        }
    }

    decode_mark(7);
    // The row this warp combines, and its gate's sigmoid (ggml-cuda's op_sigmoid), read before the
    // barrier: off the chain that waits for the slowest block.
    const int p = r + decode_split * warp;
    const int t = p / gqa, h = g * gqa + p % gqa;
    float     gate_sigmoid[E];
    if (a.gate != nullptr && p < pairs && chunks == 1) {
        const float * gp = a.gate + (int64_t) t * a.gate_token + (int64_t) h * a.gate_head + lane * E;
#pragma unroll
        for (int i = 0; i < E; ++i) {
            gate_sigmoid[i] = 1.0f / (1.0f + expf(-gp[i]));
        }
    }

    // Every block's partials are written (and, with the cluster barrier's release and acquire,
    // visible to the cluster).
    cluster.sync();
    decode_mark(8);
    if (p < pairs) {
        const float * row = part + (size_t) warp * decode_split * PS;  // slots of row p from blocks 0..SPLIT-1
        float         mi = -INFINITY, li = 0.0f;
        if (lane < decode_split) {
            mi = row[lane * PS];
            li = row[lane * PS + 1];
        }
        const float mx = frt_warp_max(mi);
        const float wi = mi == -INFINITY ? 0.0f : expf(mi - mx);
        const float sum = frt_warp_sum(wi * li);
        float       o[E];
#pragma unroll
        for (int i = 0; i < E; ++i) {
            o[i] = 0.0f;
        }
        // A block with no visible cell wrote zeros, so every partial is read (one round of loads).
#pragma unroll
        for (int b = 0; b < decode_split; ++b) {
            const float   w  = __shfl_sync(0xffffffff, wi, b, 32);
            const float * rp = row + b * PS + 4 + lane * E;
#pragma unroll
            for (int i = 0; i < E; ++i) {
                o[i] += w * rp[i];
            }
        }
        if (chunks > 1) {  // the chunk's partial of row p: its maximum, sum and weighted V
            float * pp = a.scratch + ((int64_t) (g * chunks + z) * pairs + p) * PS;
            if (lane == 0) {
                pp[0] = mx;
                pp[1] = sum;
            }
#pragma unroll
            for (int i = 0; i < E; ++i) {
                pp[4 + lane * E + i] = o[i];
            }
        } else {
            float * out = a.out + (int64_t) t * a.out_token + (int64_t) h * a.out_head + lane * E;
#pragma unroll
            for (int i = 0; i < E; ++i) {
                const float attention = sum > 0.0f ? o[i] / sum : 0.0f;
                out[i] = a.gate != nullptr ? gate_sigmoid[i] * attention : attention;  // stock's SIGMOID-MUL order
            }
        }
    }
    decode_mark(9);
    // No barrier before leaving: after the cluster barrier no block touches another's memory.
}

// The chunks' partials of each query row (a warp a row: row R = blockIdx.x * warps + warp, key/value
// head R / pairs) combined as the cluster combines its blocks' (the largest maximum, each chunk's
// sum and weighted V scaled by exp of its maximum's distance to it, added in chunk order), then
// divided and gated as the one-cluster kernel writes its rows. Launched after
// frt_attn_decode_kernel, whose scratch it reads after the wait; every output element is written
// here, so Q and the gate (read by the attention kernel before) may lie under the output.
template <int D>
static __global__ void __launch_bounds__(decode_threads) frt_attn_decode_combine_kernel(const frt_attn_decode_args a,
                                                                                       int chunks) {
    constexpr int E = D / 32, PS = D + 4;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int gqa = a.heads / a.heads_kv, pairs = gqa * a.n_q;
    const int row = blockIdx.x * decode_warps + warp;
    frt_pdl_wait();
    frt_pdl_launch_dependents();
    if (row >= pairs * a.heads_kv) {
        return;
    }
    const int     g = row / pairs, p = row % pairs, t = p / gqa, h = g * gqa + p % gqa;
    const float * part = a.scratch + ((int64_t) g * chunks * pairs + p) * PS;  // chunk z at + z * pairs * PS
    float         mi = -INFINITY, li = 0.0f;
    if (lane < chunks) {
        mi = part[(int64_t) lane * pairs * PS];
        li = part[(int64_t) lane * pairs * PS + 1];
    }
    const float mx  = frt_warp_max(mi);
    const float wi  = mi == -INFINITY ? 0.0f : expf(mi - mx);
    const float sum = frt_warp_sum(wi * li);
    float       o[E];
#pragma unroll
    for (int i = 0; i < E; ++i) {
        o[i] = 0.0f;
    }
    for (int z = 0; z < chunks; ++z) {
        const float   w  = __shfl_sync(0xffffffff, wi, z, 32);
        const float * rp = part + (int64_t) z * pairs * PS + 4 + lane * E;
#pragma unroll
        for (int i = 0; i < E; ++i) {
            o[i] += w * rp[i];
        }
    }
    float * out = a.out + (int64_t) t * a.out_token + (int64_t) h * a.out_head + lane * E;
    const float * gp =
        a.gate != nullptr ? a.gate + (int64_t) t * a.gate_token + (int64_t) h * a.gate_head + lane * E : nullptr;
#pragma unroll
    for (int i = 0; i < E; ++i) {
        const float attention = sum > 0.0f ? o[i] / sum : 0.0f;
        // ggml-cuda's op_sigmoid, then stock's fused SIGMOID-MUL order
        out[i] = gp != nullptr ? (1.0f / (1.0f + expf(-gp[i]))) * attention : attention;
    }
}

// A launch's plan: clusters a key/value head (chunks), cells a block, the instance's cells a lane.
struct decode_plan {
    int chunks = 0, cells = 0, cells_lane = 0;
};

// The current device's SMs and the shared memory a block may opt in to.
struct decode_device {
    int sms = 1, smem = 48 * 1024;
};

static decode_device decode_device_now() {
    decode_device dev;
    int           device = 0;
    if (cudaGetDevice(&device) == cudaSuccess) {
        cudaDeviceGetAttribute(&dev.sms, cudaDevAttrMultiProcessorCount, device);
        cudaDeviceGetAttribute(&dev.smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    }
    return dev;
}

// Up to FRT_ATTN_DECODE_MAX_KV cells: one cluster a head, its blocks' cells within the device's
// shared memory (sm_120's 99 KB take fewer cells than sm_90's 227 KB). Longer caches: as many cells
// a block as the device's shared memory holds beside the query rows and partials (at most
// 32 * decode_long_cells_lane), then as many clusters a head as one wave of its SMs takes (a block
// an SM: its shared memory), each block keeping at least 64 cells. No plan (chunks 0): a shape
// the device cannot take.
static decode_plan decode_plan_of(int d, int heads_kv, int pairs, int n_kv, const decode_device & dev) {
    decode_plan plan;
    if (n_kv <= FRT_ATTN_DECODE_MAX_KV) {
        if (decode_smem_bytes(d, frt_attn_decode_cells_a_block(n_kv), pairs) <= (size_t) dev.smem) {
            plan.chunks     = 1;
            plan.cells      = frt_attn_decode_cells_a_block(n_kv);
            plan.cells_lane = decode_cells_lane;
        }
        return plan;
    }
    const size_t fixed    = decode_smem_bytes(d, 0, pairs);
    const size_t per_cell = (size_t) (d + 8) * sizeof(__half) + (size_t) d * sizeof(__half);
    const int    fit      = fixed >= (size_t) dev.smem ? 0 : (int) (((size_t) dev.smem - fixed) / per_cell);
    const int    cap      = std::min(32 * decode_long_cells_lane, fit);
    if (cap < 32) {
        return plan;
    }
    const auto ceil_div = [](int x, int y) { return (x + y - 1) / y; };
    const int  need     = ceil_div(n_kv, decode_split * cap);
    const int  wave     = std::max(1, dev.sms / (decode_split * heads_kv));
    const int  useful   = ceil_div(n_kv, decode_split * 64);
    const int  chunks   = std::max(need, std::min(wave, useful));
    if (chunks > decode_max_chunks) {
        return plan;
    }
    plan.chunks     = chunks;
    plan.cells      = ceil_div(n_kv, decode_split * chunks);
    plan.cells_lane = decode_long_cells_lane;
    return plan;
}

const char * frt_attn_decode_unsupported_on(int d, int heads, int heads_kv, int n_q, int n_kv, int sms, int smem) {
    if (d != 64 && d != 128 && d != 256) {
        return "head size not 64, 128 or 256";
    }
    if (heads_kv < 1 || heads % heads_kv != 0) {
        return "query heads not a multiple of key/value heads";
    }
    if (n_q < 1 || n_q > FRT_ATTN_DECODE_MAX_TOKENS || n_q * (heads / heads_kv) > FRT_ATTN_DECODE_MAX_PAIRS) {
        return "more than 8 query tokens, or more than 64 query rows a key/value head";
    }
    if (n_kv < 1 || n_kv > FRT_ATTN_DECODE_MAX_KV_LONG) {
        return "more than 32768 cells";
    }
    decode_device dev;
    dev.sms  = sms;
    dev.smem = smem;
    if (decode_plan_of(d, heads_kv, n_q * (heads / heads_kv), n_kv, dev).chunks == 0) {
        return "the blocks' cells do not fit the device's shared memory beside this many query rows";
    }
    return nullptr;
}

const char * frt_attn_decode_unsupported(int d, int heads, int heads_kv, int n_q, int n_kv) {
    const decode_device dev = decode_device_now();
    return frt_attn_decode_unsupported_on(d, heads, heads_kv, n_q, n_kv, dev.sms, dev.smem);
}

static decode_plan decode_plan_of(const frt_attn_decode_args & a) {
    const decode_device dev = decode_device_now();
    if (frt_attn_decode_unsupported_on(a.d, a.heads, a.heads_kv, a.n_q, a.n_kv, dev.sms, dev.smem) != nullptr) {
        return {};
    }
    return decode_plan_of(a.d, a.heads_kv, a.n_q * (a.heads / a.heads_kv), a.n_kv, dev);
}

int frt_attn_decode_chunks(const frt_attn_decode_args & a) {
    return decode_plan_of(a).chunks;
}

size_t frt_attn_decode_scratch_bytes(const frt_attn_decode_args & a) {
    const decode_plan plan = decode_plan_of(a);
    if (plan.chunks <= 1) {
        return 0;
    }
    return (size_t) a.heads_kv * plan.chunks * a.n_q * (a.heads / a.heads_kv) * (a.d + 4) * sizeof(float);
}

// The shared memory the plan's instance may use, set once a device: for the one-cluster instance
// the most a launch asks (128 cells a block, 64 query rows) or the device's most; for the long one
// the device's (decode_plan_of keeps every long launch within it).
template <int D> static cudaError_t decode_allow_smem(const decode_plan & plan) {
    int         device = 0;
    cudaError_t err    = cudaGetDevice(&device);
    if (err != cudaSuccess) {
        return err;
    }
    if (plan.cells_lane == decode_cells_lane) {
        const int most = (int) decode_smem_bytes(D, FRT_ATTN_DECODE_MAX_KV / decode_split, FRT_ATTN_DECODE_MAX_PAIRS);
        return frt_allow_smem<frt_attn_decode_kernel<D, decode_cells_lane, false>>(
            device, std::min(most, decode_device_now().smem));
    }
    return frt_allow_smem<frt_attn_decode_kernel<D, decode_long_cells_lane, true>>(device, decode_device_now().smem);
}

template <int D> static int decode_resident_clusters(const frt_attn_decode_args & a, const decode_plan & plan) {
    const auto kernel = plan.cells_lane == decode_cells_lane ? frt_attn_decode_kernel<D, decode_cells_lane, false> :
                                                               frt_attn_decode_kernel<D, decode_long_cells_lane, true>;
    const size_t smem = decode_smem_bytes(D, plan.cells, a.n_q * (a.heads / a.heads_kv));
    if (decode_allow_smem<D>(plan) != cudaSuccess) {
        return -1;
    }
    cudaLaunchAttribute cluster = {};
    cluster.id                  = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x    = decode_split;
    cluster.val.clusterDim.y    = 1;
    cluster.val.clusterDim.z    = 1;
    cudaLaunchConfig_t cfg      = {};
    cfg.gridDim                 = dim3(decode_split, a.heads_kv, plan.chunks);
    cfg.blockDim                = dim3(decode_threads);
    cfg.dynamicSmemBytes        = smem;
    cfg.attrs                   = &cluster;
    cfg.numAttrs                = 1;
    int n = 0;
    return cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) == cudaSuccess ? n : -1;
}

int frt_attn_decode_resident_clusters(const frt_attn_decode_args & a) {
    const decode_plan plan = decode_plan_of(a);
    if (plan.chunks == 0) {
        return -1;
    }
    switch (a.d) {
        case 64:  return decode_resident_clusters<64>(a, plan);
        case 128: return decode_resident_clusters<128>(a, plan);
        default:  return decode_resident_clusters<256>(a, plan);
    }
}

template <int D> static cudaError_t decode_launch(const frt_attn_decode_args & a, const decode_plan & plan,
                                                  cudaStream_t stream) {
    const int    pairs = a.n_q * (a.heads / a.heads_kv);
    const size_t smem  = decode_smem_bytes(D, plan.cells, pairs);
    cudaError_t  err   = decode_allow_smem<D>(plan);
    if (err == cudaSuccess && plan.cells_lane == decode_cells_lane) {
        return frt_launch_clustered(frt_attn_decode_kernel<D, decode_cells_lane, false>, dim3(decode_split, a.heads_kv),
                                    dim3(decode_threads), smem, stream, decode_split, a);
    }
    if (err == cudaSuccess) {
        err = frt_launch_clustered(frt_attn_decode_kernel<D, decode_long_cells_lane, true>,
                                   dim3(decode_split, a.heads_kv, plan.chunks), dim3(decode_threads), smem, stream,
                                   decode_split, a);
    }
    if (err == cudaSuccess && plan.chunks > 1) {
        const int rows = pairs * a.heads_kv;
        err = frt_launch(frt_attn_decode_combine_kernel<D>, dim3((rows + decode_warps - 1) / decode_warps),
                         dim3(decode_threads), 0, stream, a, plan.chunks);
    }
    return err;
}

cudaError_t frt_attn_decode(const frt_attn_decode_args & a, cudaStream_t stream) {
    const decode_plan plan = decode_plan_of(a);
    if (plan.chunks == 0 || (plan.chunks > 1 && a.scratch == nullptr)) {
        return cudaErrorInvalidValue;
    }
    switch (a.d) {
        case 64:  return decode_launch<64>(a, plan, stream);
        case 128: return decode_launch<128>(a, plan, stream);
        default:  return decode_launch<256>(a, plan, stream);
    }
}
