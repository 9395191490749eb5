#pragma once

// Decode GEMV v2 experiments (docs/perf-notes.md, "decode GEMV v2: hypotheses"), timed by
// `gemv-bench --lab` next to frt_gemv v1. Not part of the overlay: a candidate design with its
// choices as compile-time knobs, so that one device run compares them side by side, plus probes of
// what the GPU allows at all (an empty kernel, a pure streaming read of the same bytes).
//
// The candidate ("lab kernel"): one dense matrix of a direct-path type (v1's per-type item loads and
// products, gemv-impl.cuh), 1..8 tokens. A team (split warps of a block) owns a contiguous range of
// row groups (32 / lpr rows each) and walks it in rounds of U items a lane. Knobs:
//   PRE    before griddepcontrol.wait: nothing, an L2 prefetch of the first row group (v1), or the
//          first round's loads into registers (the weights are constant, so they may come first)
//   X      x into shared memory by every block in one round of loads (new), one float4 a thread at
//          a time (v1's prologue loop as measured in bench/results/*-decode-gemv-v1), read from
//          global memory quantized by a separate tiny kernel, or not read at all (timing only)
//   MATH   the products, or only an XOR of the loaded words (timing only: what the math costs)
//   DB     the next round's loads issued before this round's products (double buffering)
//   GRID   every team resident at once (grid <= SMs x BPS) or one row group a team (more blocks)
//   LPR    the fewest lanes a row that balance the work (8, 16 or 32), or always 32 (a row a warp)
//   TRIG   griddepcontrol.launch_dependents after the x prologue (v1) or at the start
//   WARPS, BPS  warps a block and blocks an SM in the grid. Every lab kernel keeps to 128 registers a
//          thread, so with BPS 1 and 8 warps half the register file stays free and the next
//          launch's blocks can start (and load their weights) while this one runs; BPS 2 fills it.

#include "gemv-impl.cuh"

#include <cstring>
#include <type_traits>

namespace lab {

enum pre_mode { PRE_NONE = 0, PRE_L2 = 1, PRE_REGS = 2 };
enum x_mode { X_BLOCK = 0, X_SERIAL = 1, X_GLOBAL = 2, X_NONE = 3 };
enum grid_mode { GRID_RESIDENT = 0, GRID_ONE = 1 };
enum lpr_mode { LPR_AUTO = 0, LPR_32 = 1 };
enum trig_mode { TRIG_LATE = 0, TRIG_EARLY = 1 };

template <int WARPS, int BPS, int U, int PRE, int X, int MATH, int DB, int GRID, int LPR, int TRIG> struct cfg {
    static constexpr int kWarps = WARPS, kBps = BPS, kU = U, kPre = PRE, kX = X, kMath = MATH, kDb = DB,
                         kGrid = GRID, kLpr = LPR, kTrig = TRIG;
};

// Items a lane loads in one round: U for 16-byte items with 4 registers (Q4_K's header is shared
// by shuffle), 3/8 of it for Q6_K_R/Q8_0_R (9-10 registers an item), halved above 2 tokens: two
// rounds (double buffering) within 128 registers without spilling (ptxas -v).
static constexpr __host__ __device__ int items_per_round(int type, int u, int tokens_max) {
    const int base = type == FRT_GEMV_Q6_K_R || type == FRT_GEMV_Q8_0_R ? (3 * u / 8 > 1 ? 3 * u / 8 : 1) : u;
    return tokens_max <= 2 ? base : (base / 2 > 1 ? base / 2 : 1);
}

// What a launch needs: one dense matrix times tokens input vectors.
struct args {
    const float *   x;
    int64_t         x_stride;
    int             k, tokens;
    frt_gemv_type   type;  // F32, Q4_K, Q6_K_R or Q8_0_R (the types of the lab shapes; `run`)
    const void *    w;
    int64_t         row_stride;
    int             rows;
    float *         out;
    int64_t         out_stride;
    uint8_t *       scratch;  // X_GLOBAL: >= scratch_bytes(k, tokens), 16-byte aligned
};

static inline int64_t scratch_bytes(int k, int tokens) {
    return (int64_t) tokens * k + (int64_t) tokens * (k / 32) * 8;
}

struct params {
    const float *   x;
    int64_t         x_stride;
    int             k, nt;
    const uint8_t * w;
    int64_t         row_stride;
    int             rows, units_per_row;
    float *         out;
    int64_t         out_stride;
    int             lpr, ipl, split, rounds_per_group;
    int             groups, teams;
    const int8_t *  gx_q;  // X_GLOBAL
    const uint2 *   gx_m;
    int             smem_xq, smem_xm, smem_xf, smem_team;
};

// ---- device ----

// One float4 of x (chunk i of the launch's tokens x k / 4): stored as float, and/or as int8 with
// per-32 scale and per-16 sums (8 consecutive lanes hold a 32-value block). v1's rounding, bit for
// bit.
static __device__ __forceinline__ void x_store(float4 v, int i, int lane, int8_t * xq, uint2 * xm, float * xf,
                                               bool need_q8, bool need_f32) {
    if (need_f32) {
        ((float4 *) xf)[i] = v;
    }
    if (need_q8) {
        float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
        for (int offset = 1; offset < 8; offset <<= 1) {
            amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, offset));
        }
        const float d   = __fdiv_rn(amax, 127.0f);
        const float inv = amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
        const int   q0 = __float2int_rn(v.x * inv), q1 = __float2int_rn(v.y * inv);
        const int   q2 = __float2int_rn(v.z * inv), q3 = __float2int_rn(v.w * inv);
        ((int *) xq)[i] = (q0 & 0xff) | (q1 & 0xff) << 8 | (q2 & 0xff) << 16 | (q3 & 0xff) << 24;
        int sum = q0 + q1 + q2 + q3;
        sum += __shfl_xor_sync(kFull, sum, 1);
        sum += __shfl_xor_sync(kFull, sum, 2);  // lanes 8m + 0..3: values 0..15 of the block, 8m + 4..7: 16..31
        const int hi = __shfl_xor_sync(kFull, sum, 4);
        if (lane % 8 == 0) {
            xm[i / 8] = make_uint2(__float_as_uint(d), (uint32_t) (sum & 0xffff) | (uint32_t) hi << 16);
        }
    }
}

// x into shared memory one float4 a thread at a time: each load waits for the one before (v1's
// prologue as first measured).
template <int WARPS>
static __device__ void x_serial(const params & p, uint8_t * smem, bool need_q8, bool need_f32) {
    constexpr int kThr = 32 * WARPS;
    const int     k4   = p.k / 4;
    for (int i = threadIdx.x; i < p.nt * k4; i += kThr) {
        const float4 v = ((const float4 *) (p.x + (i / k4) * p.x_stride))[i % k4];
        x_store(v, i, threadIdx.x % 32, (int8_t *) (smem + p.smem_xq), (uint2 *) (smem + p.smem_xm),
                (float *) (smem + p.smem_xf), need_q8, need_f32);
    }
}

// x into shared memory in one round: every thread issues all its loads (up to 16 float4) before it
// quantizes.
template <int WARPS>
static __device__ void x_block(const params & p, uint8_t * smem, bool need_q8, bool need_f32) {
    constexpr int kThr = 32 * WARPS, kMax = 16;
    const int     tid = threadIdx.x, lane = tid % 32;
    const int     k4 = p.k / 4, total = p.nt * k4;
    int8_t *      xq = (int8_t *) (smem + p.smem_xq);
    uint2 *       xm = (uint2 *) (smem + p.smem_xm);
    float *       xf = (float *) (smem + p.smem_xf);
    for (int base = 0; base < total; base += kMax * kThr) {
        float4 xv[kMax];
#pragma unroll
        for (int c = 0; c < kMax; ++c) {
            const int i = base + c * kThr + tid;
            if (i < total) {
                xv[c] = ((const float4 *) (p.x + (i / k4) * p.x_stride))[i % k4];
            }
        }
#pragma unroll
        for (int c = 0; c < kMax; ++c) {
            const int i = base + c * kThr + tid;
            if (i - lane >= total) {
                break;  // whole warps: total is a multiple of 64
            }
            x_store(xv[c], i, lane, xq, xm, xf, need_q8, need_f32);
        }
    }
}

// X_GLOBAL's pre-kernel: x quantized into `scratch` in the shared-memory layout (int8 values of
// every token, then the per-32 metadata), one float4 a thread. It triggers the GEMV at once, so
// that the GEMV's weight loads overlap it.
static __global__ void quantize_kernel(const float * x, int64_t x_stride, int k, int nt, int8_t * q, uint2 * m) {
    frt_pdl_wait();
    frt_pdl_launch_dependents();
    const int k4 = k / 4, i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
    if (i - lane >= nt * k4) {
        return;  // whole warps: nt * k4 is a multiple of 64
    }
    x_store(((const float4 *) (x + (i / k4) * x_stride))[i % k4], i, lane, q, m, nullptr, true, false);
}

// XOR of an item's words (MATH = 0): keeps every load without the products.
template <typename I> static __device__ __forceinline__ uint32_t fold(const I & item) {
    uint32_t words[sizeof(I) / 4];
    memcpy(words, &item, sizeof(I));
    uint32_t h = 0;
#pragma unroll
    for (int i = 0; i < (int) (sizeof(I) / 4); ++i) {
        h ^= words[i];
    }
    return h;
}

// One round's loads: lane li of row `sub` takes items ((j0 + u) * split + slice) * lpr + li of
// its row; for Q4_K/Q5_K, lane u of each 8-lane group also loads the header of item u's block.
template <int TYPE, int UR> struct round_regs {
    typename gemv_direct<TYPE>::item items[UR];
    uint4                            head;
};

template <int TYPE, int UR>
static __device__ __forceinline__ void load_round(const params & p, int group, int j0, int slice, int lane,
                                                  round_regs<TYPE, UR> & r) {
    using tr         = gemv_direct<TYPE>;
    const int sub    = lane / p.lpr, li = lane % p.lpr;
    const int row    = group * (32 / p.lpr) + sub;
    const bool row_ok = row < p.rows;
    const uint8_t * w = p.w + (int64_t) (row_ok ? row : 0) * p.row_stride;
    if constexpr (tr::kSharedHead > 0) {
        r.head       = make_uint4(0, 0, 0, 0);
        const int jh = j0 + (li & 7);
        const int bh = (jh * p.split + slice) * (p.lpr / 8) + (li >> 3);
        if (row_ok && (li & 7) < UR && jh < p.ipl && bh < p.units_per_row / 8) {
            r.head = gemv_ldg16(w + tr::kSharedHead * bh);
        }
    }
#pragma unroll
    for (int u = 0; u < UR; ++u) {
        const int it = ((j0 + u) * p.split + slice) * p.lpr + li;
        if (row_ok && j0 + u < p.ipl && it < p.units_per_row) {
            r.items[u] = tr::load(w, it, p.k);
        }
    }
}

template <int TYPE, int T, int UR, int MATH>
static __device__ __forceinline__ void compute_round(const params & p, const gemv_x & x, int group, int j0,
                                                     int slice, int lane, const round_regs<TYPE, UR> & r,
                                                     float (&acc)[T], uint32_t & hash) {
    using tr          = gemv_direct<TYPE>;
    const int  sub    = lane / p.lpr, li = lane % p.lpr;
    const bool row_ok = group * (32 / p.lpr) + sub < p.rows;
    const bool swap   = lane & 4;
#pragma unroll
    for (int u = 0; u < UR; ++u) {
        uint4 head_u = r.head;
        if constexpr (tr::kSharedHead > 0) {
            const int src = (lane & ~7) | u;
            head_u        = make_uint4(__shfl_sync(kFull, r.head.x, src), __shfl_sync(kFull, r.head.y, src),
                                       __shfl_sync(kFull, r.head.z, src), __shfl_sync(kFull, r.head.w, src));
        }
        const int it = ((j0 + u) * p.split + slice) * p.lpr + li;
        if (row_ok && j0 + u < p.ipl && it < p.units_per_row) {
            if constexpr (MATH) {
                tr::template dot<T>(r.items[u], head_u, it, swap, x, p.nt, acc);
            } else {
                hash ^= fold(r.items[u]) ^ head_u.x;
            }
        }
    }
}

// Before the wait: this slice's share of the team's first row group into L2 (v1's prefetch).
static __device__ void prefetch_group(const params & p, int group, int slice, int lane) {
    const int row0  = group * (32 / p.lpr);
    const int row1  = min(row0 + 32 / p.lpr, p.rows);
    const int lines = (int) ((p.row_stride + 127) / 128);
    for (int row = row0; row < row1; ++row) {
        for (int line = lane + 32 * slice; line < lines; line += 32 * p.split) {
#if defined(__CUDA_ARCH__)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p.w + row * p.row_stride + 128 * line));
#endif
        }
    }
}

template <int TYPE, int T, class C>
__launch_bounds__(32 * C::kWarps, 16 / C::kWarps) static __global__ void gemv_kernel(const __grid_constant__ params p) {
    extern __shared__ __align__(16) uint8_t smem[];
    constexpr int UR   = items_per_round(TYPE, C::kU, T);
    const int     warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int     team = warp / p.split, slice = warp % p.split;
    const int     tpb  = C::kWarps / p.split;
    const int64_t tg   = (int64_t) blockIdx.x * tpb + team;
    const int     g0   = (int) (tg * p.groups / p.teams), g1 = (int) ((tg + 1) * p.groups / p.teams);
    const int     R    = p.rounds_per_group;
    const int     n_rounds = (g1 - g0) * R;

    round_regs<TYPE, UR> cur, nxt;
    if constexpr (C::kPre == PRE_REGS) {
        if (n_rounds > 0) {
            load_round<TYPE, UR>(p, g0, 0, slice, lane, cur);
        }
    } else if constexpr (C::kPre == PRE_L2) {
        if (n_rounds > 0) {
            prefetch_group(p, g0, slice, lane);
        }
    }
    if constexpr (C::kTrig == TRIG_EARLY) {
        frt_pdl_launch_dependents();
    }
    frt_pdl_wait();

    constexpr bool quantized = TYPE != FRT_GEMV_F32 && TYPE != FRT_GEMV_F16 && TYPE != FRT_GEMV_BF16;
    gemv_x         x;
    x.k = p.k;
    x.q = (const int8_t *) (smem + p.smem_xq);
    x.m = (const uint2 *) (smem + p.smem_xm);
    x.f = (const float *) (smem + p.smem_xf);
    if constexpr (C::kX == X_BLOCK) {
        x_block<C::kWarps>(p, smem, quantized, !quantized);
        __syncthreads();
    } else if constexpr (C::kX == X_SERIAL) {
        x_serial<C::kWarps>(p, smem, quantized, !quantized);
        __syncthreads();
    } else if constexpr (C::kX == X_GLOBAL) {
        x.q = p.gx_q;
        x.m = p.gx_m;
        x.f = p.x;  // float weights read x where it is (x_stride == k)
    }
    if constexpr (C::kTrig == TRIG_LATE) {
        frt_pdl_launch_dependents();
    }

    float    acc[T];
    uint32_t hash = 0;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        acc[t] = 0.0f;
    }
    for (int r = 0; r < n_rounds; ++r) {
        const int g = g0 + r / R, j0 = (r % R) * UR;
        if (r == 0 ? C::kPre != PRE_REGS : !C::kDb) {
            load_round<TYPE, UR>(p, g, j0, slice, lane, cur);
        }
        if constexpr (C::kDb) {
            if (r + 1 < n_rounds) {
                load_round<TYPE, UR>(p, g0 + (r + 1) / R, ((r + 1) % R) * UR, slice, lane, nxt);
            }
        }
        compute_round<TYPE, T, UR, C::kMath>(p, x, g, j0, slice, lane, cur, acc, hash);
        if (r % R == R - 1) {
            if constexpr (!C::kMath) {
                acc[0] = (float) (hash & 0xff);
                hash   = 0;
            }
            gemv_batch c{};
            c.rows         = p.rows;
            c.row0         = g * (32 / p.lpr);
            c.lpr          = p.lpr;
            c.split        = p.split;
            c.slice        = slice;
            c.nt           = p.nt;
            c.out          = p.out;
            c.out_stride   = p.out_stride;
            c.epilogue     = FRT_GEMV_STORE;
            c.team         = (float *) (smem + p.smem_team) + team * kMaxSplit * kMaxRps * T;
            c.team_barrier = 1 + team;
            gemv_flush<T>(c, lane / p.lpr, lane % p.lpr, acc);
#pragma unroll
            for (int t = 0; t < T; ++t) {
                acc[t] = 0.0f;
            }
        }
        if constexpr (C::kDb) {
            cur = nxt;
        }
    }
}

// ---- probes ----

// The least a launch costs: wait for the previous kernel, let the next one start.
static __global__ void empty_kernel(uint32_t * sink) {
    frt_pdl_wait();
    frt_pdl_launch_dependents();
    if (threadIdx.x == 1023) {
        sink[0] = 0;  // never (256 threads): keeps the kernel from being empty to the compiler
    }
}

// A pure streaming read of n16 16-byte units: a chunk is U units a thread (consecutive threads,
// consecutive units; PAIR: two adjacent units a thread, 32 bytes), PRE: the first chunk loaded
// before the wait, DB: the next chunk's loads before this one is folded.
template <int U, int PRE, int DB, int PAIR, int BPS>
__launch_bounds__(256, BPS) static __global__ void stream_kernel(const uint4 * w, int64_t n16, uint32_t * sink) {
    const int64_t tid = (int64_t) blockIdx.x * 256 + threadIdx.x, nth = (int64_t) gridDim.x * 256;
    const int64_t chunks = (n16 + nth * U - 1) / (nth * U);
    auto unit = [&](int64_t c, int u) -> int64_t {
        return PAIR ? c * nth * U + 2 * ((u / 2) * nth + tid) + (u & 1) : c * nth * U + u * nth + tid;
    };
    auto load = [&](int64_t c, uint4 (&v)[U]) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t i = unit(c, u);
            v[u]            = i < n16 ? __ldg(w + i) : make_uint4(0, 0, 0, 0);
        }
    };
    uint4 cur[U], nxt[U];
    if (PRE && chunks > 0) {
        load(0, cur);
    }
    frt_pdl_wait();
    frt_pdl_launch_dependents();
    uint32_t h = 0;
    for (int64_t c = 0; c < chunks; ++c) {
        if (c == 0 ? !PRE : !DB) {
            load(c, cur);
        }
        if (DB && c + 1 < chunks) {
            load(c + 1, nxt);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            h ^= cur[u].x ^ cur[u].y ^ cur[u].z ^ cur[u].w;
        }
        if (DB) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                cur[u] = nxt[u];
            }
        }
    }
    if (h == 0x9e3779b9u) {
        sink[tid & 1023] = h;  // almost never: the loads must not be dead
    }
}

// ---- host ----

template <typename K, typename... Args>
static cudaError_t launch(K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl, Args... a) {
    cudaLaunchAttribute attr                         = {};
    attr.id                                          = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg                           = {};
    cfg.gridDim                                      = grid;
    cfg.blockDim                                     = block;
    cfg.dynamicSmemBytes                             = smem;
    cfg.stream                                       = stream;
    cfg.attrs                                        = &attr;
    cfg.numAttrs                                     = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, a...);
}

static inline int units_per_row(int type, int k) {
    switch (type) {
        case FRT_GEMV_F32:  return k / 4;
        case FRT_GEMV_F16:
        case FRT_GEMV_BF16: return k / 8;
        default:            return k / 32;
    }
}

static inline int sm_count() {
    static const int sms = [] {
        int device = 0, n = 0;
        cudaGetDevice(&device);
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
        return n;
    }();
    return sms;
}

// The plan: lanes a row and split with the fewest rounds a lane on the critical path when every
// team is resident; ties: the most warps busy (the bytes spread over more SMs), then the smaller
// split. GRID_ONE keeps that shape and gives each team one row group.
template <class C, int UR> static void plan(const args & a, params & p, int & blocks) {
    const int units = units_per_row(a.type, a.k), sms = sm_count();
    int64_t   best_rounds = -1, best_warps = 0;
    for (int split = 1; split <= kMaxSplit && split <= C::kWarps; split *= 2) {
        for (int lpr = C::kLpr == LPR_32 ? 32 : 8; lpr <= 32; lpr *= 2) {
            if (units < lpr * split) {
                continue;
            }
            const int     ipl    = (units + lpr * split - 1) / (lpr * split);
            const int64_t groups = (a.rows + 32 / lpr - 1) / (32 / lpr);
            const int64_t teams  = std::min<int64_t>(groups, (int64_t) sms * C::kBps * (C::kWarps / split));
            const int64_t rounds = (groups + teams - 1) / teams * ((ipl + UR - 1) / UR);
            const int64_t warps  = teams * split;
            if (best_rounds < 0 || rounds < best_rounds || (rounds == best_rounds && warps > best_warps)) {
                best_rounds = rounds;
                best_warps  = warps;
                p.lpr       = lpr;
                p.split     = split;
                p.ipl       = ipl;
            }
        }
    }
    p.units_per_row    = units;
    p.rounds_per_group = (p.ipl + UR - 1) / UR;
    p.groups           = (a.rows + 32 / p.lpr - 1) / (32 / p.lpr);
    const int tpb      = C::kWarps / p.split;
    blocks             = (p.groups + tpb - 1) / tpb;
    if (C::kGrid == GRID_RESIDENT) {
        blocks = std::min(blocks, sms * C::kBps);
    }
    p.teams = blocks * tpb;
}

template <class C, int TYPE, int T> static cudaError_t run_gemv(const args & a, cudaStream_t stream) {
    constexpr int  UR        = items_per_round(TYPE, C::kU, T);
    constexpr bool quantized = TYPE != FRT_GEMV_F32 && TYPE != FRT_GEMV_F16 && TYPE != FRT_GEMV_BF16;
    params         p{};
    int            blocks = 0;
    plan<C, UR>(a, p, blocks);
    p.x          = a.x;
    p.x_stride   = a.x_stride;
    p.k          = a.k;
    p.nt         = a.tokens;
    p.w          = (const uint8_t *) a.w;
    p.row_stride = a.row_stride;
    p.rows       = a.rows;
    p.out        = a.out;
    p.out_stride = a.out_stride;
    int at       = 0;
    auto take    = [&](int64_t bytes) {
        const int start = at;
        at += (int) ((bytes + 15) / 16 * 16);
        return start;
    };
    // X_NONE: the same buffers, never written (the products take whatever they hold).
    const bool in_smem = C::kX != X_GLOBAL;
    p.smem_xm   = take(in_smem && quantized ? 8 * (int64_t) a.tokens * (a.k / 32) : 0);
    p.smem_xq   = take(in_smem && quantized ? (int64_t) a.tokens * a.k : 0);
    p.smem_xf   = take(in_smem && !quantized ? 4 * (int64_t) a.tokens * a.k : 0);
    p.smem_team = take(p.split > 1 ? 4 * (int64_t) C::kWarps * kMaxSplit * kMaxRps * T : 0);
    if (C::kX == X_GLOBAL && quantized) {
        p.gx_q = (const int8_t *) a.scratch;
        p.gx_m = (const uint2 *) (a.scratch + (int64_t) a.tokens * a.k);
    }
    if (C::kX == X_GLOBAL && !quantized && a.x_stride != a.k) {
        return cudaErrorInvalidValue;
    }
    auto kernel = gemv_kernel<TYPE, T, C>;
    // Once (the first launch comes before any graph capture: gemv-bench checks or warms up first).
    static const cudaError_t allowed =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 99 * 1024);
    cudaError_t err = allowed;
    if (err != cudaSuccess) {
        return err;
    }
    if (C::kX == X_GLOBAL && quantized) {
        const int threads = a.tokens * a.k / 4;
        err = launch(quantize_kernel, dim3((threads + 255) / 256), dim3(256), 0, stream, true, a.x, a.x_stride, a.k,
                     a.tokens, (int8_t *) a.scratch, (uint2 *) (a.scratch + (int64_t) a.tokens * a.k));
        if (err != cudaSuccess) {
            return err;
        }
    }
    return launch(kernel, dim3(blocks), dim3(32 * C::kWarps), (size_t) at, stream, true, p);
}

static inline int tokens_max(int tokens) {
    return tokens == 1 ? 1 : tokens == 2 ? 2 : tokens <= 4 ? 4 : 8;
}

// A variant's launch for the types and token counts it is built for (TYPES: bit per frt_gemv_type;
// TMAX: the most tokens). Anything else is cudaErrorNotSupported.
template <class C, unsigned TYPES, int TMAX> static cudaError_t run(const args & a, cudaStream_t stream) {
    const int tm = tokens_max(a.tokens);
    if (tm > TMAX || a.type < 0 || !(TYPES >> a.type & 1u)) {
        return cudaErrorNotSupported;
    }
    auto by_tokens = [&](auto type_tag) -> cudaError_t {
        constexpr int TYPE = decltype(type_tag)::value;
        if constexpr (TYPES >> TYPE & 1u) {
            switch (tm) {
                case 1: return run_gemv<C, TYPE, 1>(a, stream);
                case 2: if constexpr (TMAX >= 2) { return run_gemv<C, TYPE, 2>(a, stream); } break;
                case 4: if constexpr (TMAX >= 4) { return run_gemv<C, TYPE, 4>(a, stream); } break;
                default: if constexpr (TMAX >= 8) { return run_gemv<C, TYPE, 8>(a, stream); } break;
            }
        }
        return cudaErrorNotSupported;
    };
    switch (a.type) {
        case FRT_GEMV_F32:    return by_tokens(std::integral_constant<int, FRT_GEMV_F32>{});
        case FRT_GEMV_Q4_K:   return by_tokens(std::integral_constant<int, FRT_GEMV_Q4_K>{});
        case FRT_GEMV_Q6_K_R: return by_tokens(std::integral_constant<int, FRT_GEMV_Q6_K_R>{});
        case FRT_GEMV_Q8_0_R: return by_tokens(std::integral_constant<int, FRT_GEMV_Q8_0_R>{});
        default:              return cudaErrorNotSupported;
    }
}

// Registers, local memory (spills) and resident blocks an SM of one lab kernel.
struct kernel_facts {
    int regs = 0, local_bytes = 0, blocks_per_sm = 0;
};

template <class C, int TYPE, int T> static kernel_facts facts_of(size_t smem) {
    kernel_facts          f;
    cudaFuncAttributes    fa{};
    auto                  kernel = gemv_kernel<TYPE, T, C>;
    if (cudaFuncGetAttributes(&fa, kernel) == cudaSuccess) {
        f.regs        = fa.numRegs;
        f.local_bytes = (int) fa.localSizeBytes;
    }
    if (smem > 0) {
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&f.blocks_per_sm, kernel, 32 * C::kWarps, smem);
    }
    return f;
}

// The 1-token kernel of a variant for `type` when that is TYPE and the variant is built for it.
template <class C, unsigned TYPES, int TYPE> static bool facts_if(int type, size_t smem, kernel_facts & f) {
    if constexpr (TYPES >> TYPE & 1u) {
        if (type == TYPE) {
            f = facts_of<C, TYPE, 1>(smem);
            return true;
        }
    }
    return false;
}

// The 1-token kernel of a variant for `type`; false when the variant is not built for it.
template <class C, unsigned TYPES> static bool facts(int type, size_t smem, kernel_facts & f) {
    return facts_if<C, TYPES, FRT_GEMV_F32>(type, smem, f) || facts_if<C, TYPES, FRT_GEMV_Q4_K>(type, smem, f) ||
           facts_if<C, TYPES, FRT_GEMV_Q6_K_R>(type, smem, f) || facts_if<C, TYPES, FRT_GEMV_Q8_0_R>(type, smem, f);
}

}  // namespace lab
