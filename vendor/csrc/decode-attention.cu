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

// Cluster (r, g) of SPLIT blocks: block r scores the r-th run of cells of key/value head g for
// every query row p of g (token t, query head h), a warp a row at a time, and stores the row's
// partial into the shared memory of the block that combines it (block p % SPLIT, slot
// (p / SPLIT) * SPLIT + r): remote stores do not wait, where remote loads in the combine cost a
// round trip each (4.9 µs of a 12 µs launch, attn-decode-bench's phase marks). After the cluster
// barrier warp w of block r combines row r + SPLIT * w from its own shared memory into the output.
template <int D>
static __global__ void __launch_bounds__(decode_threads) frt_attn_decode_kernel(const frt_attn_decode_args a) {
    constexpr int E = D / 32, KPAD = D + 8, PS = D + 4, CL = decode_cells_lane;
    extern __shared__ __align__(16) uint8_t smem[];
    cg::cluster_group cluster = cg::this_cluster();

    const int r = (int) cluster.block_rank(), g = blockIdx.y;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int gqa = a.heads / a.heads_kv, pairs = gqa * a.n_q;
    const int cells = frt_attn_decode_cells_a_block(a.n_kv);
    const int c0 = r * cells, n_cells = max(0, min(cells, a.n_kv - c0));
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
    if (a.gate != nullptr && p < pairs) {
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
        float * out = a.out + (int64_t) t * a.out_token + (int64_t) h * a.out_head + lane * E;
#pragma unroll
        for (int i = 0; i < E; ++i) {
            const float attention = sum > 0.0f ? o[i] / sum : 0.0f;
            out[i] = a.gate != nullptr ? gate_sigmoid[i] * attention : attention;  // stock's SIGMOID-MUL order
        }
    }
    decode_mark(9);
    // No barrier before leaving: after the cluster barrier no block touches another's memory.
}

// ---- The split kernels: caches past the cluster's cells ----
//
// Grid (chunks, heads_kv) of independent blocks, no clusters: block (z, g) takes the z-th run of
// `cells` cells of key/value head g. It asks L2 for its K and V rows before its PDL wait (they lie
// still in the cache; only this step's rows are written by the kernel before, and L2 serves the
// newest bytes), then copies them into shared memory, K in split_stages groups so that scoring
// starts on the first while the rest land. Per group of split_rows query rows:
//   scores  a warp scores split_batch cells at a time: lane l multiplies its D/32 dims of the K
//           rows by the same dims of the 8 query rows (held in registers), and one reduce-scatter
//           over the warp leaves lane l the score of cell l / 8, row l % 8;
//   softmax warp r: row r's maximum and sum over the block's cells, the weights in place;
//   sums    warp (dims, rows) adds its 2 dims of the V rows times the rows' weights;
// and the row's partial (maximum, sum, weighted V) goes to the scratch. The combine kernel then folds
// each row's chunks in a fixed order (the same bits launch after launch).
constexpr int split_threads = 256;
constexpr int split_warps   = split_threads / 32;
constexpr int split_rows    = 8;    // query rows a pass: a lane's accumulators
constexpr int split_batch   = 4;    // cells a warp scores at once: 4 x 8 sums, one a lane after the reduce
constexpr int split_stages  = 4;    // groups of K rows landing one after another
constexpr int split_max_cells  = 192;
constexpr int split_max_chunks = 4096;
static_assert(split_batch * split_rows == 32, "the reduce-scatter leaves one sum a lane");
static_assert(split_warps == split_rows, "a warp a row in the softmax");

// Shared memory of a split block: K and V rows, the scores and weights [cell][row], the mask
// [token][cell].
static size_t split_smem_bytes(int d, int cells) {
    const size_t padded = (size_t) (cells + split_batch - 1) / split_batch * split_batch;
    return padded * d * sizeof(__half) * 2 + padded * split_rows * sizeof(float) +
           padded * FRT_ATTN_DECODE_MAX_TOKENS * sizeof(float);
}

template <int N> static __device__ __forceinline__ void split_wait_groups() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Until K's stage s has landed (the groups are K's stages in order, then V).
static __device__ __forceinline__ void split_wait_stage(int s) {
    static_assert(split_stages == 4, "one wait a stage");
    switch (s) {
        case 0:  split_wait_groups<4>(); break;
        case 1:  split_wait_groups<3>(); break;
        case 2:  split_wait_groups<2>(); break;
        default: split_wait_groups<1>(); break;
    }
}

template <int D>
static __global__ void __launch_bounds__(split_threads) frt_attn_split_kernel(const frt_attn_decode_args a,
                                                                              int cells) {
    constexpr int E  = D / 32;                              // dims a lane scores
    constexpr int DG = D / 64;                              // warps across the dims in the sums
    constexpr int RW = split_rows / (split_warps / DG);     // rows a lane sums
    constexpr int PS = D + 4;
    static_assert(RW == 1 || RW == 2 || RW == 4, "a lane's rows");
    extern __shared__ __align__(16) uint8_t smem[];

    const int z = blockIdx.x, g = blockIdx.y, chunks = gridDim.x;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int gqa = a.heads / a.heads_kv, pairs = gqa * a.n_q;
    const int c0 = z * cells, n_cells = max(0, min(cells, a.n_kv - c0));
    const int batches = (n_cells + split_batch - 1) / split_batch;
    const int padded  = (cells + split_batch - 1) / split_batch * split_batch;
    __half *  k_s    = (__half *) smem;
    __half *  v_s    = k_s + (size_t) padded * D;
    float *   w_s    = (float *) (v_s + (size_t) padded * D);  // [cell][row]: scores, then weights
    float *   mask_s = w_s + (size_t) padded * split_rows;     // [token][cell]
    // The block's first K and V rows of head g; cell c's at + c * k_cell (v_cell).
    const __half * k_rows = a.k + (int64_t) c0 * a.k_cell + (int64_t) g * a.k_head;
    const __half * v_rows = a.v + (int64_t) c0 * a.v_cell + (int64_t) g * a.v_head;

    decode_mark(0);
    for (int i = threadIdx.x; i < 2 * n_cells; i += split_threads) {
        const int      c   = i / 2;
        const __half * row = i % 2 == 0 ? k_rows + (int64_t) c * a.k_cell : v_rows + (int64_t) c * a.v_cell;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(row), "r"((int) (D * sizeof(__half))) : "memory");
    }
    frt_pdl_wait();
    frt_pdl_launch_dependents();
    decode_mark(1);

    constexpr int units = D / 8;  // 16-byte copies a row
    for (int s = 0; s < split_stages; ++s) {
        const int ca = min(n_cells, s * batches / split_stages * split_batch);
        const int cb = min(n_cells, (s + 1) * batches / split_stages * split_batch);
        for (int u = threadIdx.x; u < (cb - ca) * units; u += split_threads) {
            const int c = ca + u / units, x = u % units;
            decode_cp_async16(k_s + (size_t) c * D + 8 * x, k_rows + (int64_t) c * a.k_cell + 8 * x);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    for (int u = threadIdx.x; u < n_cells * units; u += split_threads) {
        const int c = u / units, x = u % units;
        decode_cp_async16(v_s + (size_t) c * D + 8 * x, v_rows + (int64_t) c * a.v_cell + 8 * x);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    // The block's mask (0 without one; cells past the block's -inf), loading while the rows land; the
    // first stage's barrier publishes it.
    for (int i = threadIdx.x; i < a.n_q * padded; i += split_threads) {
        const int t = i / padded, c = i % padded;
        mask_s[i]   = c >= n_cells      ? -INFINITY :
                      a.mask != nullptr ? __half2float(a.mask[(int64_t) t * a.mask_row + c0 + c]) :
                                          0.0f;
    }
    decode_mark(2);

    for (int p0 = 0; p0 < pairs; p0 += split_rows) {
        // This group's query rows, a lane's dims of each; rows past the head's: zeros, hidden below.
        float q[split_rows][E];
#pragma unroll
        for (int r = 0; r < split_rows; ++r) {
            const int p = p0 + r;
            if (p < pairs) {
                const float * qp = a.q + (int64_t) (p / gqa) * a.q_token + (int64_t) (g * gqa + p % gqa) * a.q_head + lane * E;
#pragma unroll
                for (int i = 0; i < E; ++i) {
                    q[r][i] = qp[i];
                }
            } else {
#pragma unroll
                for (int i = 0; i < E; ++i) {
                    q[r][i] = 0.0f;
                }
            }
        }
        for (int s = 0; s < split_stages; ++s) {
            if (p0 == 0) {
                split_wait_stage(s);
                __syncthreads();
                if (s == 0) {
                    decode_mark(3);
                }
            }
            const int b1 = (s + 1) * batches / split_stages;
            for (int b = s * batches / split_stages + warp; b < b1; b += split_warps) {
                float acc[32];
#pragma unroll
                for (int j = 0; j < split_batch; ++j) {
                    float kf[E];
                    decode_load_halves<E>(k_s + (size_t) (b * split_batch + j) * D + lane * E, kf);
#pragma unroll
                    for (int r = 0; r < split_rows; ++r) {
                        float dot = 0.0f;
#pragma unroll
                        for (int i = 0; i < E; ++i) {
                            dot = fmaf(q[r][i], kf[i], dot);
                        }
                        acc[j * split_rows + r] = dot;
                    }
                }
                const float dot = frt_warp_sum_rows<32>(acc);  // lane l: the warp's sum of acc[l]
                const int   c = b * split_batch + lane / split_rows, r = lane % split_rows, p = p0 + r;
                // A hidden cell's score is -inf whatever its row holds (its dot may be NaN).
                const float mk = p < pairs ? mask_s[(p / gqa) * padded + c] : -INFINITY;
                w_s[c * split_rows + r] = mk == -INFINITY ? -INFINITY : dot * a.scale + mk;
            }
        }
        __syncthreads();
        if (p0 == 0) {
            decode_mark(4);
        }

        {  // softmax of row p0 + warp over the block's cells
            const int r = warp, p = p0 + r;
            float     m = -INFINITY;
            for (int c = lane; c < n_cells; c += 32) {
                m = fmaxf(m, w_s[c * split_rows + r]);
            }
            m       = frt_warp_max(m);
            float l = 0.0f;
            for (int c = lane; c < n_cells; c += 32) {
                const float sc = w_s[c * split_rows + r];
                const float e  = m == -INFINITY || sc == -INFINITY ? 0.0f : expf(sc - m);
                w_s[c * split_rows + r] = e;
                l += e;
            }
            l = frt_warp_sum(l);
            if (p0 == 0) {
                decode_mark(5, l);
            }
            if (p < pairs && lane == 0) {
                float * pp = a.scratch + ((int64_t) (g * chunks + z) * pairs + p) * PS;
                pp[0] = m;
                pp[1] = l;
            }
        }
        if (p0 == 0) {
            split_wait_groups<0>();
            __syncthreads();
            // Cells no query row sees: their V rows zeros (an unused cache row may hold NaN, and
            // 0 x NaN is NaN); every other row the contract keeps finite.
            for (int u = threadIdx.x; u < n_cells * units; u += split_threads) {
                const int c    = u / units;
                bool      seen = false;
                for (int t = 0; t < a.n_q; ++t) {
                    seen |= mask_s[t * padded + c] != -INFINITY;
                }
                if (!seen) {
                    *(uint4 *) (v_s + (size_t) c * D + 8 * (u % units)) = make_uint4(0, 0, 0, 0);
                }
            }
        }
        __syncthreads();
        if (p0 == 0) {
            decode_mark(6);
        }

        {  // weighted V: warp (dims, rows) sums dims dg * 64 + 2 * lane, + 1 of rows rs * RW, ...
            const int dg = warp % DG, rs = warp / DG, dim = dg * 64 + 2 * lane;
            float     o[RW][2];
#pragma unroll
            for (int i = 0; i < RW; ++i) {
                o[i][0] = o[i][1] = 0.0f;
            }
#pragma unroll 4
            for (int c = 0; c < n_cells; ++c) {
                float w[RW];
                if constexpr (RW == 4) {
                    const float4 w4 = *(const float4 *) (w_s + c * split_rows + rs * RW);
                    w[0] = w4.x, w[1] = w4.y, w[2] = w4.z, w[3] = w4.w;
                } else if constexpr (RW == 2) {
                    const float2 w2 = *(const float2 *) (w_s + c * split_rows + rs * RW);
                    w[0] = w2.x, w[1] = w2.y;
                } else {
                    w[0] = w_s[c * split_rows + rs];
                }
                const float2 vf = __half22float2(*(const __half2 *) (v_s + (size_t) c * D + dim));
#pragma unroll
                for (int i = 0; i < RW; ++i) {
                    o[i][0] = fmaf(w[i], vf.x, o[i][0]);
                    o[i][1] = fmaf(w[i], vf.y, o[i][1]);
                }
            }
#pragma unroll
            for (int i = 0; i < RW; ++i) {
                const int p = p0 + rs * RW + i;
                if (p < pairs) {
                    float * pp = a.scratch + ((int64_t) (g * chunks + z) * pairs + p) * PS + 4 + dim;
                    *(float2 *) pp = make_float2(o[i][0], o[i][1]);
                }
            }
        }
        __syncthreads();  // the next group's scores overwrite w_s
    }
    decode_mark(7);
}

// The chunks' partials of query row R (blockIdx.y: key/value head R / pairs), 32 dims a block
// (blockIdx.x), in one round of loads: warp w folds chunks w, w + 8, ... in order into its own
// maximum, sum and weighted V (each rescaled to the larger maximum as it goes), then warp 0 folds
// the warps' in order; divided and gated as the cluster kernel writes its rows. Every output
// element is written here, after the split kernel is done (the wait), so Q and the gate may lie
// under the output.
template <int D>
static __global__ void __launch_bounds__(split_threads) frt_attn_split_combine_kernel(const frt_attn_decode_args a,
                                                                                      int chunks) {
    constexpr int PS = D + 4;
    __shared__ float max_s[split_warps], sum_s[split_warps], part_s[split_warps][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int gqa = a.heads / a.heads_kv, pairs = gqa * a.n_q;
    const int row = blockIdx.y, g = row / pairs, p = row % pairs, t = p / gqa, h = g * gqa + p % gqa;
    const int dim = blockIdx.x * 32 + lane;
    const int64_t chunk_stride = (int64_t) pairs * PS;
    const float * part = a.scratch + ((int64_t) g * chunks * pairs + p) * PS;
    frt_pdl_wait();
    frt_pdl_launch_dependents();
    decode_mark(8);

    // (m, l, o) folded with (m2, l2, o2); a chunk no cell of which the row sees wrote a maximum of
    // -inf and zeros, and takes weight 0.
    const auto fold = [](float & m, float & l, float & o, float m2, float l2, float o2) {
        const float mx = fmaxf(m, m2);
        const float w1 = m == -INFINITY ? 0.0f : expf(m - mx);
        const float w2 = m2 == -INFINITY ? 0.0f : expf(m2 - mx);
        l              = l * w1 + l2 * w2;
        o              = o * w1 + o2 * w2;
        m              = mx;
    };
    float m = -INFINITY, l = 0.0f, o = 0.0f;
#pragma unroll 4
    for (int c = warp; c < chunks; c += split_warps) {
        const float * pc = part + c * chunk_stride;
        fold(m, l, o, pc[0], pc[1], pc[4 + dim]);
    }
    if (lane == 0) {
        max_s[warp] = m;
        sum_s[warp] = l;
    }
    part_s[warp][lane] = o;
    __syncthreads();
    if (warp == 0) {
        m = max_s[0], l = sum_s[0], o = part_s[0][lane];
        for (int w = 1; w < split_warps; ++w) {
            fold(m, l, o, max_s[w], sum_s[w], part_s[w][lane]);
        }
        const float attention = l > 0.0f ? o / l : 0.0f;
        float *     out = a.out + (int64_t) t * a.out_token + (int64_t) h * a.out_head + dim;
        if (a.gate != nullptr) {
            const float x = a.gate[(int64_t) t * a.gate_token + (int64_t) h * a.gate_head + dim];
            *out          = (1.0f / (1.0f + expf(-x))) * attention;  // ggml-cuda's op_sigmoid, then stock's MUL order
        } else {
            *out = attention;
        }
        decode_mark(9, attention);
    }
}

// A launch's plan: chunks a key/value head (1: the cluster kernel; more: the split kernels) and
// cells a block (the split kernel's).
struct decode_plan {
    int chunks = 0, cells = 0;
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

// The split kernels' plan: as many blocks as one wave of the SMs takes (a block an SM), each of at
// least 32 cells and at most what the device's shared memory holds (up to split_max_cells, or
// `most` when set); more cells than a wave holds take more blocks (and blocks of fewer cells share
// an SM).
static decode_plan split_plan_of(int d, int heads_kv, int n_kv, int most, const decode_device & dev) {
    decode_plan  plan;
    const auto   ceil_div = [](int x, int y) { return (x + y - 1) / y; };
    const size_t per_cell = split_smem_bytes(d, split_batch) / split_batch;
    const int    fit      = std::min(split_max_cells, (int) ((size_t) dev.smem / per_cell) / split_batch * split_batch);
    if (fit < 32) {
        return plan;
    }
    const int cap    = most > 0 ? std::min(fit, ceil_div(most, split_batch) * split_batch) : fit;
    const int wave   = std::max(1, dev.sms / heads_kv);
    const int chunks = std::max(ceil_div(n_kv, cap), std::min(wave, ceil_div(n_kv, 32)));
    if (chunks > split_max_chunks) {
        return plan;
    }
    plan.chunks = chunks;
    plan.cells  = ceil_div(n_kv, chunks);
    return plan;
}

// Up to FRT_ATTN_DECODE_MAX_KV cells (or below split_from): one cluster a head, its blocks' cells
// within the device's shared memory (sm_120's 99 KB take fewer cells than sm_90's 227 KB); longer
// caches: the split kernels. No plan (chunks 0): a shape the device cannot take.
static decode_plan decode_plan_of(int d, int heads_kv, int pairs, int n_kv, int split_from, int split_cells,
                                  const decode_device & dev) {
    const int from = split_from > 0 ? split_from : FRT_ATTN_DECODE_MAX_KV + 1;
    if (n_kv >= from) {
        decode_plan plan = split_plan_of(d, heads_kv, n_kv, split_cells, dev);
        if (plan.chunks == 1) {  // the combine kernel reads the scratch either way
            plan.chunks = 2;
            plan.cells  = (n_kv + 1) / 2;
        }
        return plan;
    }
    decode_plan plan;
    if (decode_smem_bytes(d, frt_attn_decode_cells_a_block(n_kv), pairs) <= (size_t) dev.smem) {
        plan.chunks = 1;
        plan.cells  = frt_attn_decode_cells_a_block(n_kv);
    }
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
    if ((int64_t) n_q * heads > 65535) {
        return "more than 65535 query rows (the combine kernel's grid)";
    }
    decode_device dev;
    dev.sms  = sms;
    dev.smem = smem;
    if (decode_plan_of(d, heads_kv, n_q * (heads / heads_kv), n_kv, 0, 0, dev).chunks == 0) {
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
    return decode_plan_of(a.d, a.heads_kv, a.n_q * (a.heads / a.heads_kv), a.n_kv, a.split_from, a.split_cells, dev);
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

// The shared memory a kernel may use, set once a device: for the cluster kernel the most a launch
// asks (128 cells a block, 64 query rows) or the device's most; for the split kernel the device's
// (its plan keeps every launch within it).
template <int D> static cudaError_t decode_allow_smem(bool split) {
    int         device = 0;
    cudaError_t err    = cudaGetDevice(&device);
    if (err != cudaSuccess) {
        return err;
    }
    if (!split) {
        const int most = (int) decode_smem_bytes(D, FRT_ATTN_DECODE_MAX_KV / decode_split, FRT_ATTN_DECODE_MAX_PAIRS);
        return frt_allow_smem<frt_attn_decode_kernel<D>>(device, std::min(most, decode_device_now().smem));
    }
    return frt_allow_smem<frt_attn_split_kernel<D>>(device, decode_device_now().smem);
}

template <int D> static int decode_resident_blocks(const frt_attn_decode_args & a, const decode_plan & plan) {
    const bool split = plan.chunks > 1;
    if (decode_allow_smem<D>(split) != cudaSuccess) {
        return -1;
    }
    if (split) {
        int n = 0;
        return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, frt_attn_split_kernel<D>, split_threads,
                                                             split_smem_bytes(D, plan.cells)) == cudaSuccess ?
                   n * decode_device_now().sms :
                   -1;
    }
    cudaLaunchAttribute cluster = {};
    cluster.id                  = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x    = decode_split;
    cluster.val.clusterDim.y    = 1;
    cluster.val.clusterDim.z    = 1;
    cudaLaunchConfig_t cfg      = {};
    cfg.gridDim                 = dim3(decode_split, a.heads_kv);
    cfg.blockDim                = dim3(decode_threads);
    cfg.dynamicSmemBytes        = decode_smem_bytes(D, plan.cells, a.n_q * (a.heads / a.heads_kv));
    cfg.attrs                   = &cluster;
    cfg.numAttrs                = 1;
    int n = 0;
    return cudaOccupancyMaxActiveClusters(&n, frt_attn_decode_kernel<D>, &cfg) == cudaSuccess ? n * decode_split : -1;
}

int frt_attn_decode_resident_blocks(const frt_attn_decode_args & a) {
    const decode_plan plan = decode_plan_of(a);
    if (plan.chunks == 0) {
        return -1;
    }
    switch (a.d) {
        case 64:  return decode_resident_blocks<64>(a, plan);
        case 128: return decode_resident_blocks<128>(a, plan);
        default:  return decode_resident_blocks<256>(a, plan);
    }
}

// The split kernels' combine: 32 dims a block, a block row a query row of every key/value head.
static dim3 decode_combine_grid(const frt_attn_decode_args & a) {
    return dim3(a.d / 32, a.n_q * (a.heads / a.heads_kv) * a.heads_kv);
}

template <int D> static cudaError_t decode_launch(const frt_attn_decode_args & a, const decode_plan & plan,
                                                  cudaStream_t stream) {
    const int   pairs = a.n_q * (a.heads / a.heads_kv);
    cudaError_t err   = decode_allow_smem<D>(plan.chunks > 1);
    if (err != cudaSuccess) {
        return err;
    }
    if (plan.chunks == 1) {
        return frt_launch_clustered(frt_attn_decode_kernel<D>, dim3(decode_split, a.heads_kv), dim3(decode_threads),
                                    decode_smem_bytes(D, plan.cells, pairs), stream, decode_split, a);
    }
    err = frt_launch(frt_attn_split_kernel<D>, dim3(plan.chunks, a.heads_kv), dim3(split_threads),
                     split_smem_bytes(D, plan.cells), stream, a, plan.cells);
    if (err == cudaSuccess) {
        err = frt_launch(frt_attn_split_combine_kernel<D>, decode_combine_grid(a), dim3(split_threads), 0, stream, a,
                         plan.chunks);
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

#ifdef FRT_ATTN_DECODE_TRACE
void frt_attn_decode_trace_blocks(const frt_attn_decode_args & a, int * early, int * late) {
    const int chunks = frt_attn_decode_chunks(a);
    if (chunks <= 1) {
        *early = *late = decode_split * a.heads_kv;
    } else {
        const dim3 combine = decode_combine_grid(a);
        *early             = chunks * a.heads_kv;
        *late              = (int) (combine.x * combine.y);
    }
}
#endif
