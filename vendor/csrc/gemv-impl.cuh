#pragma once

// Internals of frt_gemv shared by gemv.cu (planning, host) and gemv-tokens{1,2,4,8}.cu (the kernel
// instances for up to 1, 2, 4 and 8 tokens, compiled apart so that they build in parallel).

#include "env-switch.cuh"
#include "gemv.cuh"
#include "pdl.cuh"
#include "q8-x.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

// The design is in gemv.cuh. Terms used here:
//   direct     the path that loads weights straight into registers (every type but GGUF Q6_K/Q8_0)
//   staged     GGUF Q6_K/Q8_0 (2-byte aligned blocks): rows are copied to shared memory first
//   item       16 bytes of weights one lane multiplies at a time (direct path)
//   lpr        lanes a row (8, 16 or 32); a warp multiplies 32 / lpr rows at once (a row group)
//   batch      what a team takes at a time: one row group (direct), or whole rows (staged)
//   team       split warps of a block that share each batch (split > 1 for launches of few rows)
//   slice      the warp of a team that takes every split-th run of lpr items of a row

static constexpr int kWarps     = 8;
static constexpr int kThreads   = 32 * kWarps;
static constexpr int kMaxSplit  = 8;
static constexpr int kMaxRps    = 4;     // rows of a row group: lpr >= 8 (every type has >= 8 items a row)
static constexpr unsigned kFull = 0xffffffffu;

// Items a lane loads before it computes: as many as fit in 128 registers without spilling
// (sm_90a, ptxas 13.0: `-Xptxas -v` shows 0 bytes spilled for every instance), fewer with more
// tokens (each token has its accumulator and its x in flight).
static constexpr __host__ __device__ int gemv_items_in_flight(int type, int tokens_max) {
    if (tokens_max <= 2) {
        switch (type) {
            case FRT_GEMV_Q4_K:   return 8;  // at most 8: one shared header a lane of 8 (gemv_direct_batch)
            case FRT_GEMV_Q5_K:   return 4;
            case FRT_GEMV_Q6_K_R: return 4;  // rows of 2^n items use 4 of 5 or 6 anyway (lanes a row: 2^n)
            case FRT_GEMV_Q8_0_R: return 4;
            case FRT_GEMV_F32:    return 12;
            default:              return 10;  // F16, BF16
        }
    }
    if (tokens_max <= 4) {
        switch (type) {
            case FRT_GEMV_Q4_K: return 8;
            case FRT_GEMV_Q5_K:
            case FRT_GEMV_Q6_K_R: return 3;
            case FRT_GEMV_F32:
            case FRT_GEMV_F16:
            case FRT_GEMV_BF16: return 8;
            default:            return 4;
        }
    }
    // 8 tokens: the unrolled token loops take the registers (sm_120a spills 4-12 bytes in the Q6_K_R,
    // Q8_0_R and BF16 instances whatever their U; sm_90a none).
    switch (type) {
        case FRT_GEMV_Q4_K: return 4;
        case FRT_GEMV_F32:
        case FRT_GEMV_F16:
        case FRT_GEMV_BF16: return 8;
        default:            return 2;
    }
}

// 16-byte and 4-byte words of a direct-path item (the traits' kWords, kSmall), and the bytes of a
// warp's preload buffer for its first chunk (gemv_direct_preload).
static constexpr __host__ __device__ int gemv_item_words(int type) {
    return type == FRT_GEMV_Q5_K || type == FRT_GEMV_Q6_K_R || type == FRT_GEMV_Q8_0_R ? 2 : 1;
}

static constexpr __host__ __device__ int gemv_item_smalls(int type) {
    return type == FRT_GEMV_Q6_K_R ? 2 : type == FRT_GEMV_Q8_0_R ? 1 : 0;
}

static constexpr __host__ __device__ int gemv_preload_bytes(int type, int tokens_max) {
    return (gemv_items_in_flight(type, tokens_max) * gemv_item_words(type) + 1) * 512 +
           gemv_items_in_flight(type, tokens_max) * gemv_item_smalls(type) * 128;
}

// ---- plan: what the host computes once per launch, read by every warp ----

struct gemv_seg_plan {
    const uint8_t * w;
    float *         out;
    const float *   residual;
    const int32_t * ids;
    int64_t         row_stride, out_stride, residual_stride, ids_stride, expert_stride;
    int             type, rows, epilogue, n_used, n_experts;
    int             staged;            // read through shared memory (else: the launch's direct type)
    int             row_bytes;         // bytes of a row that are read (L2 prefetch, staging)
    int             n_inst;            // matrices: 1, or expert slots (tokens x n_used)
    int             units_per_row;     // items (direct) or blocks (staged)
    int             lpr, ipl;          // direct: lanes a row, items a lane a row (in its slice)
    int             rows_per_batch;    // direct: 32 / lpr; staged: a multiple that keeps batches 16-byte aligned
    int             batches_per_inst;
    int             batch_begin;       // first batch index of this segment
    int             ids_smem;          // this segment's ids in the shared table
};

struct gemv_params {
    const float * x;
    const float * norm;
    int64_t       x_stride;
    float         eps;
    float *       x_out;  // frt_gemv_args::x_normed
    int64_t       x_out_stride;
    int           k, tokens, x_per_token, n_vec;
    int           n_segments, split, total_batches;
    int           need_q8, need_f32;
    int           n_ids;
    int           smem_ids, smem_xm, smem_xq, smem_xf, smem_team, smem_stage;
    int           stage_bytes;  // a warp's buffer: staged rows, and the preloaded first chunk
    int           preload;      // the buffer holds a direct type's first chunk (gemv_direct_preload)
    int           lab;          // FRT_GEMV_LAB (experiments): 1 dependents launched at exit, 2 nothing before the wait
    gemv_seg_plan seg[FRT_GEMV_MAX_SEGMENTS];
};

// The quantized (or float) input of one matrix instance, token t at offset t * k.
struct gemv_x {
    const int8_t * q;  // int8 values
    const uint2 *  m;  // per 32 values: x = float scale d, y = int16 sums of the two halves (lo | hi << 16)
    const float *  f;  // float values (float weights)
    int            k;
};

struct gemv_batch {
    const uint8_t * w;  // this instance's matrix
    int64_t         row_stride;
    int             rows, row0, nrows;  // batch: rows [row0, row0 + nrows), clipped at rows
    int             k, units_per_row, lpr, ipl, split, slice, nt;
    gemv_x          x;
    float *         out;
    int64_t         out_stride;
    const float *   residual;
    int64_t         residual_stride;
    int             epilogue;
    float *         team;        // split > 1: partial sums [split][kMaxRps][T]
    int             team_barrier;
};

// ---- small device helpers ----

static __device__ __forceinline__ uint4 gemv_ldg16(const uint8_t * p) {
    return __ldg((const uint4 *) p);
}

static __device__ __forceinline__ uint32_t gemv_ldg_u16(const uint8_t * p) {
    return __ldg((const unsigned short *) p);
}

// The same loads with an L2 policy (createpolicy), e.g. evict-first for weights read once a step.
static __device__ __forceinline__ uint4 gemv_ldg16_hint(const uint8_t * p, uint64_t policy) {
    uint4 v;
    asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(policy));
    return v;
}

static __device__ __forceinline__ uint32_t gemv_ldg_u16_hint(const uint8_t * p, uint64_t policy) {
    unsigned short v;
    asm("ld.global.nc.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(v) : "l"(p), "l"(policy));
    return v;
}

// The plain loads, or with HINT the loads with `policy`.
template <bool HINT> static __device__ __forceinline__ uint4 gemv_ldg16_as(const uint8_t * p, uint64_t policy) {
    if constexpr (HINT) {
        return gemv_ldg16_hint(p, policy);
    } else {
        return gemv_ldg16(p);
    }
}

template <bool HINT> static __device__ __forceinline__ uint32_t gemv_ldg_u16_as(const uint8_t * p, uint64_t policy) {
    if constexpr (HINT) {
        return gemv_ldg_u16_hint(p, policy);
    } else {
        return gemv_ldg_u16(p);
    }
}

static __device__ __forceinline__ float gemv_half(uint32_t bits) {
    return __half2float(__ushort_as_half((unsigned short) (bits & 0xffff)));
}

static __device__ __forceinline__ int gemv_dot16(uint4 w, int4 x, int acc) {
    acc = __dp4a((int) w.x, x.x, acc);
    acc = __dp4a((int) w.y, x.y, acc);
    acc = __dp4a((int) w.z, x.z, acc);
    return __dp4a((int) w.w, x.w, acc);
}

// The two 16-byte runs of int8 x an item multiplies, read as "a" first: lanes with bit 2 set read
// their second run first, which spreads every 8-lane phase of a 16-byte shared load over all 32
// banks for the item orders used here (lane q of a block: runs 16q apart within 64 or 128).
static __device__ __forceinline__ void gemv_runs(const gemv_x & x, int t, int run_a, int run_b, int4 & xa, int4 & xb,
                                                 uint2 & ma, uint2 & mb) {
    const int8_t * q = x.q + t * x.k;
    const uint2 *  m = x.m + t * (x.k / 32);
    xa               = *(const int4 *) (q + run_a);
    xb               = *(const int4 *) (q + run_b);
    ma               = m[run_a / 32];
    mb               = m[run_b / 32];
}

// The runs of x (16 int8 each) that an item multiplies, "a" first (gemv_runs).
static __device__ __forceinline__ void gemv_k4_runs(int b, int q, bool swap, int & run_a, int & run_b) {
    const int lo = 256 * b + 64 * (q >> 1) + 16 * (q & 1);
    run_a        = swap ? lo + 32 : lo;
    run_b        = swap ? lo : lo + 32;
}

static __device__ __forceinline__ void gemv_q6_runs(int b, int q, bool swap, int & run_a, int & run_b) {
    const int lo = 256 * b + 128 * (q >> 2) + 16 * (q & 3);
    run_a        = swap ? lo + 64 : lo;
    run_b        = swap ? lo : lo + 64;
}

static __device__ __forceinline__ void gemv_q8_runs(int b, bool swap, int & run_a, int & run_b) {
    run_a = swap ? 32 * b + 16 : 32 * b;
    run_b = swap ? 32 * b : 32 * b + 16;
}

// Sum of the 16 int8 x values of a run (half h of its 32-block), from the shared metadata.
static __device__ __forceinline__ int gemv_run_sum(uint2 m, int half) {
    return (int16_t) (m.y >> (16 * half));
}

// Q4_K/Q5_K scales and mins (6 bits each, packed in 12 bytes) of sub-blocks 2c and 2c + 1: bytes
// sc = lo | hi << 8, m likewise.
static __device__ __forceinline__ void gemv_k4_scales(uint4 head, int c, uint32_t & sc2, uint32_t & m2) {
    const int      sh = 16 * (c & 1);
    const uint32_t y2 = (head.y >> sh) & 0xffff;  // scales[j] for j < 4 (and the top bits of j + 4)
    const uint32_t z2 = (head.z >> sh) & 0xffff;  // mins[j] for j < 4 (and the top bits of j + 4)
    const uint32_t w2 = (head.w >> sh) & 0xffff;  // low nibbles of scale and min for j >= 4
    if (c >= 2) {
        sc2 = (w2 & 0x0f0f) | ((y2 >> 2) & 0x3030);
        m2  = ((w2 >> 4) & 0x0f0f) | ((z2 >> 2) & 0x3030);
    } else {
        sc2 = y2 & 0x3f3f;
        m2  = z2 & 0x3f3f;
    }
}

// One Q4_K or Q5_K item: 16 bytes of nibbles (and high bits) of sub-blocks 2c (low nibbles) and
// 2c + 1 (high nibbles), positions 16 (q & 1) .. + 16 of each. wa/wb: the weights of runs a/b.
template <int T>
static __device__ __forceinline__ void gemv_k4_dot(uint4 head, uint4 wa, uint4 wb, int b, int q, bool swap,
                                                   const gemv_x & x, int nt, float (&acc)[T]) {
    const int c = q >> 1;
    uint32_t  sc2, m2;
    gemv_k4_scales(head, c, sc2, m2);
    const float d = gemv_half(head.x), dmin = gemv_half(head.x >> 16);
    const int   sa = swap ? 8 : 0;
    const float dsc_a = d * (float) ((sc2 >> sa) & 0xff), dsc_b = d * (float) ((sc2 >> (8 - sa)) & 0xff);
    const float dm_a = dmin * (float) ((m2 >> sa) & 0xff), dm_b = dmin * (float) ((m2 >> (8 - sa)) & 0xff);
    int         run_a, run_b;
    gemv_k4_runs(b, q, swap, run_a, run_b);
    const int half = q & 1;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        if (t < nt) {
            int4  xa, xb;
            uint2 ma, mb;
            gemv_runs(x, t, run_a, run_b, xa, xb, ma, mb);
            const int da = gemv_dot16(wa, xa, 0), db = gemv_dot16(wb, xb, 0);
            acc[t] += __uint_as_float(ma.x) * (dsc_a * (float) da - dm_a * (float) gemv_run_sum(ma, half)) +
                      __uint_as_float(mb.x) * (dsc_b * (float) db - dm_b * (float) gemv_run_sum(mb, half));
        }
    }
}

// One Q6_K item: ql word q of a block (q = 4h + j: half h, ql bytes 16j..16j+15 of it), its qh
// word, and the scales of its two runs: lo = 128h + 16j (low nibbles, qh bits 2(j/2)..+1) and
// lo + 64 (high nibbles, qh bits 2(j/2)+4..+5). Values are 6 bits minus 32.
template <int T>
static __device__ __forceinline__ void gemv_q6_dot(uint4 ql, uint4 qh, int sc_lo, int sc_hi, float d, int b, int q,
                                                   bool swap, const gemv_x & x, int nt, float (&acc)[T]) {
    const int j = q & 3;
    const int ns = swap ? 4 : 0;           // nibble of run a
    const int hs = 2 * (j >> 1) + ns;      // qh bits of run a
    const int hb = 2 * (j >> 1) + 4 - ns;  // qh bits of run b
    uint4     wa, wb;
    wa.x = ((ql.x >> ns) & 0x0f0f0f0f) | (((qh.x >> hs) & 0x03030303) << 4);
    wa.y = ((ql.y >> ns) & 0x0f0f0f0f) | (((qh.y >> hs) & 0x03030303) << 4);
    wa.z = ((ql.z >> ns) & 0x0f0f0f0f) | (((qh.z >> hs) & 0x03030303) << 4);
    wa.w = ((ql.w >> ns) & 0x0f0f0f0f) | (((qh.w >> hs) & 0x03030303) << 4);
    wb.x = ((ql.x >> (4 - ns)) & 0x0f0f0f0f) | (((qh.x >> hb) & 0x03030303) << 4);
    wb.y = ((ql.y >> (4 - ns)) & 0x0f0f0f0f) | (((qh.y >> hb) & 0x03030303) << 4);
    wb.z = ((ql.z >> (4 - ns)) & 0x0f0f0f0f) | (((qh.z >> hb) & 0x03030303) << 4);
    wb.w = ((ql.w >> (4 - ns)) & 0x0f0f0f0f) | (((qh.w >> hb) & 0x03030303) << 4);
    const float ds_a = d * (float) (swap ? sc_hi : sc_lo), ds_b = d * (float) (swap ? sc_lo : sc_hi);
    int         run_a, run_b;
    gemv_q6_runs(b, q, swap, run_a, run_b);
    const int half = j & 1;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        if (t < nt) {
            int4  xa, xb;
            uint2 ma, mb;
            gemv_runs(x, t, run_a, run_b, xa, xb, ma, mb);
            const int da = gemv_dot16(wa, xa, 0) - 32 * gemv_run_sum(ma, half);
            const int db = gemv_dot16(wb, xb, 0) - 32 * gemv_run_sum(mb, half);
            acc[t] += __uint_as_float(ma.x) * ds_a * (float) da + __uint_as_float(mb.x) * ds_b * (float) db;
        }
    }
}

// One Q8_0 block (32 int8 weights, qa = values 0..15, qb = 16..31), block b of its row.
template <int T>
static __device__ __forceinline__ void gemv_q8_dot(uint4 qa, uint4 qb, float d, int b, bool swap, const gemv_x & x,
                                                   int nt, float (&acc)[T]) {
    const uint4 wa = swap ? qb : qa, wb = swap ? qa : qb;
    int         run_a, run_b;
    gemv_q8_runs(b, swap, run_a, run_b);
#pragma unroll
    for (int t = 0; t < T; ++t) {
        if (t < nt) {
            int4  xa, xb;
            uint2 ma, mb;
            gemv_runs(x, t, run_a, run_b, xa, xb, ma, mb);
            const int dot = gemv_dot16(wa, xa, gemv_dot16(wb, xb, 0));
            acc[t] += d * __uint_as_float(ma.x) * (float) dot;
        }
    }
}

// ---- shared-memory copies (cp.async: no registers while in flight) ----

static __device__ __forceinline__ void gemv_cp_async16(uint8_t * dst, const uint8_t * src, int src_bytes) {
    const unsigned dst_shared = (unsigned) __cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst_shared), "l"(src), "r"(src_bytes)
                 : "memory");
}

static __device__ __forceinline__ void gemv_cp_async4(uint8_t * dst, const uint8_t * src) {
    const unsigned dst_shared = (unsigned) __cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst_shared), "l"(src) : "memory");
}

// The same copies with an L2 policy (createpolicy; sm_80 and newer), e.g. evict-first for weights
// read once a step.
static __device__ __forceinline__ void gemv_cp_async16_hint(uint8_t * dst, const uint8_t * src, uint64_t policy) {
    const unsigned dst_shared = (unsigned) __cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst_shared), "l"(src), "l"(policy)
                 : "memory");
}

static __device__ __forceinline__ void gemv_cp_async4_hint(uint8_t * dst, const uint8_t * src, uint64_t policy) {
    const unsigned dst_shared = (unsigned) __cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2;" ::"r"(dst_shared), "l"(src), "l"(policy)
                 : "memory");
}

// Waits for this thread's copies (each thread reads back only what it copied).
static __device__ __forceinline__ void gemv_cp_async_wait_all() {
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

// This thread's copies issued since the last commit as one group (gemv_cp_async_wait_group).
static __device__ __forceinline__ void gemv_cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most N of this thread's committed groups are still in flight (the latest ones).
template <int N> static __device__ __forceinline__ void gemv_cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---- direct path: one type's item loads and products ----

template <int TYPE> struct gemv_direct;

// kSharedHead: the bytes of a block whose first 16 bytes (d, dmin, scales) the 8 lanes of a block
// share: each lane loads one block's header and the others come by shuffle (gemv_direct_batch),
// 4 registers an item fewer. 0: no shared header.
// An item is kWords 16-byte words and kSmall 4-byte words (holding its 2-byte fields) at word()
// and small(); from() makes it of them (the preload of a warp's first chunk copies those words to
// shared memory before the kernel waits for its predecessor).
template <> struct gemv_direct<FRT_GEMV_Q4_K> {
    static constexpr int kSharedHead = 144, kWords = 1, kSmall = 0;
    struct item {
        uint4 qs;
    };
    static __device__ __forceinline__ const uint8_t * word(const uint8_t * row, int it, int /*k*/, int /*i*/) {
        return row + 144 * (it >> 3) + 16 + 16 * (it & 7);
    }
    static __device__ __forceinline__ const uint8_t * small(const uint8_t * row, int, int, int) { return row; }
    static __device__ __forceinline__ item from(const uint4 * w, const uint32_t *, int, int) { return { w[0] }; }
    static __device__ __forceinline__ item load(const uint8_t * row, int it, int k) {
        return { gemv_ldg16(word(row, it, k, 0)) };
    }
    template <int T>
    static __device__ __forceinline__ void dot(const item & w, uint4 head, int it, bool swap, const gemv_x & x, int nt,
                                               float (&acc)[T]) {
        const int ns = swap ? 4 : 0;
        uint4     wa, wb;
        wa.x = (w.qs.x >> ns) & 0x0f0f0f0f;
        wa.y = (w.qs.y >> ns) & 0x0f0f0f0f;
        wa.z = (w.qs.z >> ns) & 0x0f0f0f0f;
        wa.w = (w.qs.w >> ns) & 0x0f0f0f0f;
        wb.x = (w.qs.x >> (4 - ns)) & 0x0f0f0f0f;
        wb.y = (w.qs.y >> (4 - ns)) & 0x0f0f0f0f;
        wb.z = (w.qs.z >> (4 - ns)) & 0x0f0f0f0f;
        wb.w = (w.qs.w >> (4 - ns)) & 0x0f0f0f0f;
        gemv_k4_dot<T>(head, wa, wb, it >> 3, it & 7, swap, x, nt, acc);
    }
};

template <> struct gemv_direct<FRT_GEMV_Q5_K> {
    static constexpr int kSharedHead = 176, kWords = 2, kSmall = 0;
    struct item {
        uint4 qh, qs;
    };
    static __device__ __forceinline__ const uint8_t * word(const uint8_t * row, int it, int /*k*/, int i) {
        const uint8_t * blk = row + 176 * (it >> 3);
        const int       q   = it & 7;
        return i == 0 ? blk + 16 + 16 * (q & 1) : blk + 48 + 16 * q;
    }
    static __device__ __forceinline__ const uint8_t * small(const uint8_t * row, int, int, int) { return row; }
    static __device__ __forceinline__ item from(const uint4 * w, const uint32_t *, int, int) { return { w[0], w[1] }; }
    static __device__ __forceinline__ item load(const uint8_t * row, int it, int k) {
        return { gemv_ldg16(word(row, it, k, 0)), gemv_ldg16(word(row, it, k, 1)) };
    }
    template <int T>
    static __device__ __forceinline__ void dot(const item & w, uint4 head, int it, bool swap, const gemv_x & x, int nt,
                                               float (&acc)[T]) {
        const int q  = it & 7;
        const int ns = swap ? 4 : 0;
        const int ha = 2 * (q >> 1) + (swap ? 1 : 0), hb = ha ^ 1;  // qh bit of sub-block 2c (+1)
        uint4     wa, wb;
        wa.x = ((w.qs.x >> ns) & 0x0f0f0f0f) | (((w.qh.x >> ha) & 0x01010101) << 4);
        wa.y = ((w.qs.y >> ns) & 0x0f0f0f0f) | (((w.qh.y >> ha) & 0x01010101) << 4);
        wa.z = ((w.qs.z >> ns) & 0x0f0f0f0f) | (((w.qh.z >> ha) & 0x01010101) << 4);
        wa.w = ((w.qs.w >> ns) & 0x0f0f0f0f) | (((w.qh.w >> ha) & 0x01010101) << 4);
        wb.x = ((w.qs.x >> (4 - ns)) & 0x0f0f0f0f) | (((w.qh.x >> hb) & 0x01010101) << 4);
        wb.y = ((w.qs.y >> (4 - ns)) & 0x0f0f0f0f) | (((w.qh.y >> hb) & 0x01010101) << 4);
        wb.z = ((w.qs.z >> (4 - ns)) & 0x0f0f0f0f) | (((w.qh.z >> hb) & 0x01010101) << 4);
        wb.w = ((w.qs.w >> (4 - ns)) & 0x0f0f0f0f) | (((w.qh.w >> hb) & 0x01010101) << 4);
        gemv_k4_dot<T>(head, wa, wb, it >> 3, q, swap, x, nt, acc);
    }
};

template <> struct gemv_direct<FRT_GEMV_Q6_K_R> {
    static constexpr int kSharedHead = 0, kWords = 2, kSmall = 2;
    struct item {
        uint4    ql, qh;
        uint32_t sc, d;
    };
    static __device__ __forceinline__ const uint8_t * word(const uint8_t * row, int it, int /*k*/, int i) {
        const int       q   = it & 7;
        const uint8_t * blk = row + 208 * (it >> 3);
        return i == 0 ? blk + 16 * q : blk + 128 + 16 * (2 * (q >> 2) + (q & 1));
    }
    // The 4-byte words holding the item's scale pair and its block's d (rows are 16-byte aligned).
    static __device__ __forceinline__ const uint8_t * small(const uint8_t * row, int it, int k, int i) {
        return i == 0 ? row + 208 * (it >> 3) + 192 + 4 * ((it & 7) >> 1) : row + 208 * (k / 256) + 4 * ((it >> 3) >> 1);
    }
    static __device__ __forceinline__ item from(const uint4 * w, const uint32_t * sm, int it, int /*k*/) {
        return { w[0], w[1], (sm[0] >> (16 * (it & 1))) & 0xffff, (sm[1] >> (16 * ((it >> 3) & 1))) & 0xffff };
    }
    static __device__ __forceinline__ item load(const uint8_t * row, int it, int k) {
        const int       b = it >> 3, q = it & 7;
        const uint8_t * blk = row + 208 * b;
        return { gemv_ldg16(blk + 16 * q), gemv_ldg16(blk + 128 + 16 * (2 * (q >> 2) + (q & 1))),
                 gemv_ldg_u16(blk + 192 + 2 * q), gemv_ldg_u16(row + 208 * (k / 256) + 2 * b) };
    }
    template <int T>
    static __device__ __forceinline__ void dot(const item & w, uint4 /*head*/, int it, bool swap, const gemv_x & x,
                                               int nt, float (&acc)[T]) {
        gemv_q6_dot<T>(w.ql, w.qh, (int8_t) (w.sc & 0xff), (int8_t) (w.sc >> 8), gemv_half(w.d), it >> 3, it & 7,
                       swap, x, nt, acc);
    }
};

template <> struct gemv_direct<FRT_GEMV_Q8_0_R> {
    static constexpr int kSharedHead = 0, kWords = 2, kSmall = 1;
    struct item {
        uint4    qa, qb;
        uint32_t d;
    };
    static __device__ __forceinline__ const uint8_t * word(const uint8_t * row, int it, int /*k*/, int i) {
        return row + 32 * it + 16 * i;
    }
    static __device__ __forceinline__ const uint8_t * small(const uint8_t * row, int it, int k, int /*i*/) {
        return row + k + 4 * (it >> 1);
    }
    static __device__ __forceinline__ item from(const uint4 * w, const uint32_t * sm, int it, int /*k*/) {
        return { w[0], w[1], (sm[0] >> (16 * (it & 1))) & 0xffff };
    }
    static __device__ __forceinline__ item load(const uint8_t * row, int it, int k) {
        return { gemv_ldg16(row + 32 * it), gemv_ldg16(row + 32 * it + 16), gemv_ldg_u16(row + k + 2 * it) };
    }
    template <int T>
    static __device__ __forceinline__ void dot(const item & w, uint4 /*head*/, int it, bool swap, const gemv_x & x,
                                               int nt, float (&acc)[T]) {
        gemv_q8_dot<T>(w.qa, w.qb, gemv_half(w.d), it, swap, x, nt, acc);
    }
};

template <> struct gemv_direct<FRT_GEMV_F32> {
    static constexpr int kSharedHead = 0, kWords = 1, kSmall = 0;
    struct item {
        float4 w;
    };
    static __device__ __forceinline__ const uint8_t * word(const uint8_t * row, int it, int, int) { return row + 16 * it; }
    static __device__ __forceinline__ const uint8_t * small(const uint8_t * row, int, int, int) { return row; }
    static __device__ __forceinline__ item from(const uint4 * w, const uint32_t *, int, int) {
        return { make_float4(__uint_as_float(w[0].x), __uint_as_float(w[0].y), __uint_as_float(w[0].z),
                             __uint_as_float(w[0].w)) };
    }
    static __device__ __forceinline__ item load(const uint8_t * row, int it, int /*k*/) {
        return { __ldg((const float4 *) row + it) };
    }
    template <int T>
    static __device__ __forceinline__ void dot(const item & w, uint4 /*head*/, int it, bool /*swap*/,
                                               const gemv_x & x, int nt, float (&acc)[T]) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (t < nt) {
                const float4 v = ((const float4 *) (x.f + t * x.k))[it];
                acc[t] += w.w.x * v.x + w.w.y * v.y + w.w.z * v.z + w.w.w * v.w;
            }
        }
    }
};

// F16 and BF16: 8 weights an item, x in two float4 runs.
template <bool BF16> struct gemv_direct_half {
    static constexpr int kSharedHead = 0, kWords = 1, kSmall = 0;
    struct item {
        uint4 w;
    };
    static __device__ __forceinline__ const uint8_t * word(const uint8_t * row, int it, int, int) { return row + 16 * it; }
    static __device__ __forceinline__ const uint8_t * small(const uint8_t * row, int, int, int) { return row; }
    static __device__ __forceinline__ item from(const uint4 * w, const uint32_t *, int, int) { return { w[0] }; }
    static __device__ __forceinline__ item load(const uint8_t * row, int it, int /*k*/) {
        return { gemv_ldg16(row + 16 * it) };
    }
    static __device__ __forceinline__ float2 pair(uint32_t u) {
        if (BF16) {
            return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
        }
        return make_float2(gemv_half(u), gemv_half(u >> 16));
    }
    template <int T>
    static __device__ __forceinline__ void dot(const item & w, uint4 /*head*/, int it, bool swap, const gemv_x & x,
                                               int nt, float (&acc)[T]) {
        const float2 a0 = pair(swap ? w.w.z : w.w.x), a1 = pair(swap ? w.w.w : w.w.y);
        const float2 b0 = pair(swap ? w.w.x : w.w.z), b1 = pair(swap ? w.w.y : w.w.w);
        const int    run_a = 2 * it + (swap ? 1 : 0), run_b = 2 * it + (swap ? 0 : 1);
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (t < nt) {
                const float4 * f  = (const float4 *) (x.f + t * x.k);
                const float4   va = f[run_a], vb = f[run_b];
                acc[t] += a0.x * va.x + a0.y * va.y + a1.x * va.z + a1.y * va.w + b0.x * vb.x + b0.y * vb.y +
                          b1.x * vb.z + b1.y * vb.w;
            }
        }
    }
};

template <> struct gemv_direct<FRT_GEMV_F16> : gemv_direct_half<false> {};

template <> struct gemv_direct<FRT_GEMV_BF16> : gemv_direct_half<true> {};

// ---- stores ----

static __device__ __forceinline__ void gemv_store(const gemv_batch & c, int row, int t, float v) {
    if (c.epilogue == FRT_GEMV_ADD) {
        v += c.residual[t * c.residual_stride + row];
    }
    c.out[t * c.out_stride + row] = v;
}

static __device__ __forceinline__ void gemv_team_sync(const gemv_batch & c) {
#if defined(__CUDA_ARCH__)
    asm volatile("bar.sync %0, %1;" ::"r"(c.team_barrier), "r"(32 * c.split) : "memory");
#endif
}

// End of a row group: sums the lpr lanes of each row, then (split > 1) the team's slices in slice
// order, and stores; lane li of a row stores token li.
template <int T>
static __device__ __forceinline__ void gemv_flush(const gemv_batch & c, int sub, int li, float (&acc)[T]) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        if (offset < c.lpr) {
#pragma unroll
            for (int t = 0; t < T; ++t) {
                acc[t] += __shfl_xor_sync(kFull, acc[t], offset);
            }
        }
    }
    float mine = 0.0f;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        mine = li == t ? acc[t] : mine;
    }
    const int row = c.row0 + sub;
    if (c.split == 1) {
        if (li < c.nt && row < c.rows) {
            gemv_store(c, row, li, mine);
        }
        return;
    }
    if (li < T) {
        c.team[(c.slice * kMaxRps + sub) * T + li] = mine;
    }
    gemv_team_sync(c);
    if (c.slice == 0 && li < c.nt && row < c.rows) {
        float sum = 0.0f;
        for (int s = 0; s < c.split; ++s) {
            sum += c.team[(s * kMaxRps + sub) * T + li];
        }
        gemv_store(c, row, li, sum);
    }
    gemv_team_sync(c);  // the slots are written again by the next row group
}

// Where a lane's words of its first chunk go in its warp's preload buffer (gemv_preload_bytes):
// 16-byte words of item u at ((u * kWords + i) * 32 + lane) * 16, then the shared header, then the
// 4-byte words at ((u * kSmall + i) * 32 + lane) * 4: conflict-free reads back.
static __device__ __forceinline__ int gemv_pre_word(int u, int i, int words, int lane) {
    return ((u * words + i) * 32 + lane) * 16;
}

static __device__ __forceinline__ int gemv_pre_small(int u, int i, int U, int words, int smalls, int lane) {
    return (U * words + 1) * 512 + ((u * smalls + i) * 32 + lane) * 4;
}

// Before the kernel's wait (weights are not written by earlier kernels): copies the first chunk
// of this warp's first batch into its buffer; gemv_direct_batch reads it back after the prologue,
// so the weights' latency overlaps the previous kernel's tail and the prologue, with no register
// held meanwhile.
template <int TYPE, int T>
static __device__ __forceinline__ void gemv_direct_preload(const gemv_batch & c, int lane, uint8_t * buf) {
    using tr        = gemv_direct<TYPE>;
    constexpr int U = gemv_items_in_flight(TYPE, T);
    static_assert(tr::kWords == gemv_item_words(TYPE) && tr::kSmall == gemv_item_smalls(TYPE), "preload layout");
    const int       li = lane % c.lpr, row = c.row0 + lane / c.lpr;
    const bool      row_ok = row < c.rows;
    const uint8_t * w      = c.w + (int64_t) (row_ok ? row : c.row0) * c.row_stride;
    if constexpr (tr::kSharedHead > 0) {
        const int bh = ((li & 7) * c.split + c.slice) * (c.lpr / 8) + (li >> 3);
        if (row_ok && (li & 7) < U && (li & 7) < c.ipl && bh < c.units_per_row / 8) {
            gemv_cp_async16(buf + gemv_pre_word(U, 0, tr::kWords, lane), w + tr::kSharedHead * bh, 16);
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int it = (u * c.split + c.slice) * c.lpr + li;
        if (row_ok && u < c.ipl && it < c.units_per_row) {
#pragma unroll
            for (int i = 0; i < tr::kWords; ++i) {
                gemv_cp_async16(buf + gemv_pre_word(u, i, tr::kWords, lane), tr::word(w, it, c.k, i), 16);
            }
#pragma unroll
            for (int i = 0; i < tr::kSmall; ++i) {
                gemv_cp_async4(buf + gemv_pre_small(u, i, U, tr::kWords, tr::kSmall, lane), tr::small(w, it, c.k, i));
            }
        }
    }
}

// A row group of a direct-path type: lane li of row `sub` multiplies items (j * split + slice) *
// lpr + li of its row, U of them loaded at once, then one flush. lpr is chosen so that a lane's
// items of a row fill U where the row is long enough. pre: this warp's preload buffer holding the
// first chunk (gemv_direct_preload), or nullptr.
template <int TYPE, int T>
static __device__ __forceinline__ void gemv_direct_batch(const gemv_batch & c, int lane, const uint8_t * pre) {
    using tr         = gemv_direct<TYPE>;
    constexpr int U  = gemv_items_in_flight(TYPE, T);
    const int     sub = lane / c.lpr, li = lane % c.lpr;
    const bool    swap   = lane & 4;
    const int     row    = c.row0 + sub;
    const bool    row_ok = row < c.rows;
    const uint8_t * w    = c.w + (int64_t) (row_ok ? row : c.row0) * c.row_stride;
    float         acc[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
        acc[t] = 0.0f;
    }
    for (int j0 = 0; j0 < c.ipl; j0 += U) {
        typename tr::item items[U];
        // Shared headers: the 8 lanes of a block group (same row, same block for each item u) load
        // the header of item u's block in lane u of the group.
        uint4 head = make_uint4(0, 0, 0, 0);
        if (pre != nullptr && j0 == 0) {
            gemv_cp_async_wait_all();
            if constexpr (tr::kSharedHead > 0) {
                head = *(const uint4 *) (pre + gemv_pre_word(U, 0, tr::kWords, lane));
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int it = (u * c.split + c.slice) * c.lpr + li;
                if (row_ok && u < c.ipl && it < c.units_per_row) {
                    uint4    words[tr::kWords];
                    uint32_t smalls[tr::kSmall > 0 ? tr::kSmall : 1];
#pragma unroll
                    for (int i = 0; i < tr::kWords; ++i) {
                        words[i] = *(const uint4 *) (pre + gemv_pre_word(u, i, tr::kWords, lane));
                    }
#pragma unroll
                    for (int i = 0; i < tr::kSmall; ++i) {
                        smalls[i] = *(const uint32_t *) (pre + gemv_pre_small(u, i, U, tr::kWords, tr::kSmall, lane));
                    }
                    items[u] = tr::from(words, smalls, it, c.k);
                }
            }
        } else {
            if constexpr (tr::kSharedHead > 0) {
                static_assert(U <= 8, "one shared header a lane of an 8-lane group");
                const int jh = j0 + (li & 7);
                const int bh = (jh * c.split + c.slice) * (c.lpr / 8) + (li >> 3);
                if (row_ok && (li & 7) < U && jh < c.ipl && bh < c.units_per_row / 8) {
                    head = gemv_ldg16(w + tr::kSharedHead * bh);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int it = ((j0 + u) * c.split + c.slice) * c.lpr + li;
                if (row_ok && j0 + u < c.ipl && it < c.units_per_row) {
                    items[u] = tr::load(w, it, c.k);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            uint4 head_u = head;
            if constexpr (tr::kSharedHead > 0) {
                const int src = (lane & ~7) | u;
                head_u        = make_uint4(__shfl_sync(kFull, head.x, src), __shfl_sync(kFull, head.y, src),
                                           __shfl_sync(kFull, head.z, src), __shfl_sync(kFull, head.w, src));
            }
            const int it = ((j0 + u) * c.split + c.slice) * c.lpr + li;
            if (row_ok && j0 + u < c.ipl && it < c.units_per_row) {
                tr::template dot<T>(items[u], head_u, it, swap, c.x, c.nt, acc);
            }
        }
    }
    gemv_flush<T>(c, sub, li, acc);
}

// ---- staged path (GGUF Q6_K, Q8_0) ----

// 16 bytes from shared memory at p, which is 4-byte aligned (ODD2 = false) or 2 bytes past a
// multiple of 4 (ODD2 = true).
template <bool ODD2> static __device__ __forceinline__ uint4 gemv_lds16_2(const uint8_t * p) {
    if (!ODD2) {
        const uint32_t * w = (const uint32_t *) p;
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
    const uint32_t * w = (const uint32_t *) (p - 2);
    return make_uint4(__funnelshift_r(w[0], w[1], 16), __funnelshift_r(w[1], w[2], 16), __funnelshift_r(w[2], w[3], 16),
                      __funnelshift_r(w[3], w[4], 16));
}

// Lanes 0..nl-1 hold the partial sums v of blocks f0 .. f0 + nl - 1 of the batch, in order; a row
// is nb consecutive blocks. A segmented scan adds the blocks of each row, the row carried over
// from the previous group is completed, the rows that end here are stored, and the partial row
// at the end becomes the carry.
template <int T>
static __device__ __forceinline__ void gemv_rows_of_blocks(const gemv_batch & c, int f0, int nl, int nblocks, int nb,
                                                           float (&v)[T], int & carry_row, float (&carry)[T],
                                                           int lane) {
    const int  f     = f0 + lane;
    const bool valid = lane < nl && f < nblocks;
    const int  row   = valid ? f / nb : -2 - lane;  // invalid lanes: a row nobody else has
    for (int offset = 1; offset < nl; offset <<= 1) {
        const int up_row = __shfl_up_sync(kFull, row, offset);
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float up = __shfl_up_sync(kFull, v[t], offset);
            if (lane >= offset && up_row == row) {
                v[t] += up;
            }
        }
    }
    if (row == carry_row) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            v[t] += carry[t];
        }
    }
    const bool row_end = valid && f % nb == nb - 1;
    if (row_end) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (t < c.nt) {
                gemv_store(c, c.row0 + row, t, v[t]);
            }
        }
    }
    const int  last     = min(nl, nblocks - f0) - 1;
    const int  last_row = __shfl_sync(kFull, row, last);
    const bool last_end = __shfl_sync(kFull, (int) row_end, last);
#pragma unroll
    for (int t = 0; t < T; ++t) {
        carry[t] = __shfl_sync(kFull, v[t], last);
    }
    carry_row = last_end ? -1 : last_row;
}

// Q6_K from shared memory, in groups of 8 blocks; lane group k (8 lanes) takes blocks 2k then
// 2k + 1. GGUF layout: a group is 1680 bytes (16-byte aligned), so the 4 blocks of a step start at
// 4-byte words 0, 105, 210, 315 of it (+52 for odd blocks): distinct banks modulo 4. REPACKED: the
// Q6_K_R rows of a pack whose direct type is another (every read 16-byte aligned).
template <int T, bool REPACKED>
static __device__ void gemv_staged_q6_k(const gemv_batch & c, const uint8_t * buf, int nr, int row_bytes, int lane) {
    const int  nb = c.k / 256, nblocks = nr * nb;
    const int  grp = lane >> 3, q = lane & 7, h = q >> 2, j = q & 3;
    const bool swap      = lane & 4;
    int        carry_row = -1;
    float      carry[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
        carry[t] = 0.0f;
    }
    for (int f0 = 0; f0 < nblocks; f0 += 8) {
        float part[2][T];
#pragma unroll
        for (int s = 0; s < 2; ++s) {
#pragma unroll
            for (int t = 0; t < T; ++t) {
                part[s][t] = 0.0f;
            }
            const int f = f0 + 2 * grp + s;
            if (f < nblocks && REPACKED) {
                const int       r   = f / nb, b = f - r * nb;
                const uint8_t * row = buf + r * row_bytes;
                const uint8_t * blk = row + 208 * b;
                const uint4     ql  = *(const uint4 *) (blk + 16 * q);
                const uint4     qh  = *(const uint4 *) (blk + 128 + 16 * (2 * h + (j & 1)));
                const uint32_t  sc  = *(const unsigned short *) (blk + 192 + 2 * q);
                const float     d   = gemv_half(*(const unsigned short *) (row + 208 * nb + 2 * b));
                gemv_q6_dot<T>(ql, qh, (int8_t) (sc & 0xff), (int8_t) (sc >> 8), d, b, q, swap, c.x, c.nt, part[s]);
            } else if (f < nblocks) {
                const uint8_t * blk = buf + 210 * f;  // 4-byte aligned for even f, 2 past that for odd f
                const uint4     ql  = s ? gemv_lds16_2<true>(blk + 16 * q) : gemv_lds16_2<false>(blk + 16 * q);
                const uint8_t * qhp = blk + 128 + 16 * (2 * h + (j & 1));
                const uint4     qh  = s ? gemv_lds16_2<true>(qhp) : gemv_lds16_2<false>(qhp);
                const int       sc_lo = (int8_t) blk[192 + 8 * h + j], sc_hi = (int8_t) blk[192 + 8 * h + j + 4];
                const float     d     = gemv_half(*(const unsigned short *) (blk + 208));
                gemv_q6_dot<T>(ql, qh, sc_lo, sc_hi, d, f % nb, q, swap, c.x, c.nt, part[s]);
            }
#pragma unroll
            for (int t = 0; t < T; ++t) {
                for (int offset = 1; offset < 8; offset <<= 1) {
                    part[s][t] += __shfl_xor_sync(kFull, part[s][t], offset);
                }
            }
        }
        // Lane i < 8 takes block f0 + i: step i & 1 of lane group i / 2.
        const int src = 8 * ((lane >> 1) & 3);
        float     v[T];
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float even = __shfl_sync(kFull, part[0][t], src), odd = __shfl_sync(kFull, part[1][t], src);
            v[t]             = lane & 1 ? odd : even;
        }
        gemv_rows_of_blocks<T>(c, f0, 8, nblocks, nb, v, carry_row, carry, lane);
    }
}

// Q8_0 from shared memory: one block a lane, 32 blocks a group. GGUF layout: a block (34 bytes)
// starts 0 or 2 bytes past a 4-byte word: 9 aligned words, funnel-shifted. REPACKED: Q8_0_R rows
// of a pack whose direct type is another.
template <int T, bool REPACKED>
static __device__ void gemv_staged_q8_0(const gemv_batch & c, const uint8_t * buf, int nr, int row_bytes, int lane) {
    const int  nb = c.k / 32, nblocks = nr * nb;
    const bool swap      = lane & 4;
    int        carry_row = -1;
    float      carry[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
        carry[t] = 0.0f;
    }
    for (int f0 = 0; f0 < nblocks; f0 += 32) {
        const int f = f0 + lane;
        float     v[T];
#pragma unroll
        for (int t = 0; t < T; ++t) {
            v[t] = 0.0f;
        }
        if (f < nblocks && REPACKED) {
            const int       r   = f / nb, b = f - r * nb;
            const uint8_t * row = buf + r * row_bytes;
            gemv_q8_dot<T>(*(const uint4 *) (row + 32 * b), *(const uint4 *) (row + 32 * b + 16),
                           gemv_half(*(const unsigned short *) (row + 32 * nb + 2 * b)), b, swap, c.x, c.nt, v);
        } else if (f < nblocks) {
            const int        phase = (34 * f) & 2;  // bytes past a word (buf is 16-byte aligned)
            const uint32_t * wd    = (const uint32_t *) (buf + 34 * f - phase);
            uint32_t         wv[9];
#pragma unroll
            for (int i = 0; i < 9; ++i) {
                wv[i] = wd[i];
            }
            const int shift = phase ? 32 : 16;  // the quants start 2 bytes after the scale
            const uint4 qa  = make_uint4(__funnelshift_rc(wv[0], wv[1], shift), __funnelshift_rc(wv[1], wv[2], shift),
                                         __funnelshift_rc(wv[2], wv[3], shift), __funnelshift_rc(wv[3], wv[4], shift));
            const uint4 qb  = make_uint4(__funnelshift_rc(wv[4], wv[5], shift), __funnelshift_rc(wv[5], wv[6], shift),
                                         __funnelshift_rc(wv[6], wv[7], shift), __funnelshift_rc(wv[7], wv[8], shift));
            gemv_q8_dot<T>(qa, qb, gemv_half(wv[0] >> (8 * phase)), f % nb, swap, c.x, c.nt, v);
        }
        gemv_rows_of_blocks<T>(c, f0, 32, nblocks, nb, v, carry_row, carry, lane);
    }
}

// A batch of whole rows of a staged segment (GGUF Q6_K/Q8_0, or Q6_K_R/Q8_0_R that are not the
// launch's direct type): copied to this warp's buffer (the batch starts 16-byte aligned:
// rows_per_batch is chosen so), then decoded.
template <int TYPE, int T>
static __device__ __forceinline__ void gemv_staged_batch(const gemv_batch & c, uint8_t * buf, int row_bytes, int lane) {
    const int       nr     = min(c.nrows, c.rows - c.row0);
    const int       nbytes = nr * row_bytes;
    const uint8_t * src    = c.w + (int64_t) c.row0 * row_bytes;
    for (int offset = 16 * lane; offset < nbytes; offset += 16 * 32) {
        gemv_cp_async16(buf + offset, src + offset, min(16, nbytes - offset));
    }
    gemv_cp_async_wait_all();
    __syncwarp();
    if (TYPE == FRT_GEMV_Q6_K || TYPE == FRT_GEMV_Q6_K_R) {
        gemv_staged_q6_k<T, TYPE == FRT_GEMV_Q6_K_R>(c, buf, nr, row_bytes, lane);
    } else {
        gemv_staged_q8_0<T, TYPE == FRT_GEMV_Q8_0_R>(c, buf, nr, row_bytes, lane);
    }
    __syncwarp();  // every lane is done with buf before the next batch overwrites it
}

// ---- the kernel ----

static __device__ __forceinline__ int gemv_segment_of(const gemv_params & p, int batch) {
    int si = 0;
    while (si + 1 < p.n_segments && batch >= p.seg[si + 1].batch_begin) {
        ++si;
    }
    return si;
}

// Before the wait for the previous kernel: this warp's share of a dense batch's rows into L2.
static __device__ void gemv_prefetch_l2(const gemv_params & p, int batch, int slice, int lane) {
    const gemv_seg_plan & s = p.seg[gemv_segment_of(p, batch)];
    if (s.ids != nullptr) {
        return;  // which matrix is known only after the wait
    }
    const int row0  = (batch - s.batch_begin) * s.rows_per_batch;
    const int row1  = min(row0 + s.rows_per_batch, s.rows);
    const int lines = (s.row_bytes + 127) / 128;
    for (int row = row0; row < row1; ++row) {
        const uint8_t * w = s.w + row * s.row_stride;
        for (int line = lane + 32 * slice; line < lines; line += 32 * p.split) {
#if defined(__CUDA_ARCH__)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(w + 128 * line));
#endif
        }
    }
}

// Chunks of 4 floats of x a thread loads before it uses them: the prologue's time is one L2 round
// trip per group, not per chunk.
static constexpr int kPrologueLoads = 4;

// The input vectors x_v = x + v * x_stride (v < n_vec <= 8 with a norm), RMS-normed when norm is
// set, into shared memory: as int8 with per-32 scales and per-16 sums (need_q8: xq, xm) and/or as
// float (need_f32: xf). Run by THREADS threads (tid < THREADS) of the block; ends with their
// values written but no barrier after them.
struct gemv_x_in {
    const float * x;
    const float * norm;
    int64_t       x_stride;
    float         eps;
    int           k, n_vec, need_q8, need_f32;
    float *       x_out;  // non-null: the normed vectors are written here too (one block of the launch)
    int64_t       x_out_stride;
    // With norm, non-null: each vector's norm scale 1 / rms, computed by the caller (the exact
    // kernel sums as ggml-cuda's rms_norm does); else the prologue computes it.
    const float * scale = nullptr;
};

template <int THREADS>
static __device__ void gemv_prologue_x(const gemv_x_in & p, int8_t * xq, uint2 * xm, float * xf, int tid,
                                       int barrier) {
    constexpr int kW   = THREADS / 32;
    const int     lane = tid % 32, warp = tid / 32;
    const int     k4   = p.k / 4;
    __shared__ float partial[kW][FRT_GEMV_MAX_TOKENS];  // sums of squares (norm: n_vec <= 8)
    if (p.norm != nullptr && p.scale == nullptr) {
        for (int v = 0; v < p.n_vec; ++v) {
            const float4 * x  = (const float4 *) (p.x + v * p.x_stride);
            float          ss = 0.0f;
            for (int c0 = tid; c0 < k4; c0 += kPrologueLoads * THREADS) {
                float4 xv[kPrologueLoads];
#pragma unroll
                for (int j = 0; j < kPrologueLoads; ++j) {
                    const int c = c0 + j * THREADS;
                    xv[j]       = c < k4 ? x[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
#pragma unroll
                for (int j = 0; j < kPrologueLoads; ++j) {
                    ss += xv[j].x * xv[j].x + xv[j].y * xv[j].y + xv[j].z * xv[j].z + xv[j].w * xv[j].w;
                }
            }
            for (int offset = 16; offset > 0; offset >>= 1) {
                ss += __shfl_xor_sync(kFull, ss, offset);
            }
            if (lane == 0) {
                partial[warp][v] = ss;
            }
        }
#if defined(__CUDA_ARCH__)
        asm volatile("bar.sync %0, %1;" ::"r"(barrier), "r"(THREADS) : "memory");
#endif
    }

    const int total = p.n_vec * k4;
    // 8 consecutive lanes hold the 32 values of one block (k4 is a multiple of 64, so a warp's
    // 32 chunks are all in range or all out, and never straddle two vectors).
    for (int i0 = tid; i0 < total; i0 += kPrologueLoads * THREADS) {
        float4 xs[kPrologueLoads];
#pragma unroll
        for (int j = 0; j < kPrologueLoads; ++j) {
            const int i = i0 + j * THREADS;
            if (i < total) {
                xs[j] = ((const float4 *) (p.x + (i / k4) * p.x_stride))[i % k4];
            }
        }
#pragma unroll
        for (int j = 0; j < kPrologueLoads; ++j) {
            const int i = i0 + j * THREADS;
            if (i >= total) {
                break;  // the same for the whole warp
            }
            const int v = i / k4, c = i % k4;
            float4    xv = xs[j];
            if (p.norm != nullptr) {
                float scale;
                if (p.scale != nullptr) {
                    scale = p.scale[v];
                } else {
                    float ss = 0.0f;
                    for (int w = 0; w < kW; ++w) {
                        ss += partial[w][v];
                    }
                    scale = rsqrtf(__fdiv_rn(ss, (float) p.k) + p.eps);
                }
                xv = frt_norm_chunk(xv, scale, ((const float4 *) p.norm)[c]);
                if (p.x_out != nullptr) {
                    ((float4 *) (p.x_out + v * p.x_out_stride))[c] = xv;
                }
            }
            if (p.need_f32) {
                ((float4 *) xf)[i] = xv;
            }
            if (p.need_q8) {
                frt_quantize_q8_chunk(xv, i, lane, xq, xm);
            }
        }
    }
}

// Every block: the experts' ids, then the input vectors (gemv_prologue_x).
static __device__ void gemv_prologue(const gemv_params & p, uint8_t * smem) {
    const int tid = threadIdx.x;
    int32_t * ids = (int32_t *) (smem + p.smem_ids);
    for (int si = 0; si < p.n_segments; ++si) {
        const gemv_seg_plan & s = p.seg[si];
        if (s.ids != nullptr) {
            for (int i = tid; i < s.n_inst; i += kThreads) {
                ids[s.ids_smem + i] = s.ids[(i / s.n_used) * s.ids_stride + i % s.n_used];
            }
        }
    }
    // The normed vectors, when the launch keeps them, are written by block 0 alone.
    const gemv_x_in in = { p.x,        p.norm,    p.x_stride, p.eps, p.k, p.n_vec, p.need_q8, p.need_f32,
                           blockIdx.x == 0 ? p.x_out : nullptr, p.x_out_stride };
    gemv_prologue_x<kThreads>(in, (int8_t *) (smem + p.smem_xq), (uint2 *) (smem + p.smem_xm),
                              (float *) (smem + p.smem_xf), tid, 0);
}

// One direct-path type an instance (DIRECT, or -1 for none): all direct types in one kernel make
// ptxas spill in the hot loops; one direct type plus the staged path does not. The other segments
// of a launch are staged (GGUF Q6_K/Q8_0, and Q6_K_R/Q8_0_R when DIRECT is another type).
// The batch `batch` (of segment s) as this warp takes it. expert: the matrix of an expert slot, read
// from the table the prologue puts in shared memory (so only after it); -1 for a dense segment.
template <int T>
static __device__ __forceinline__ gemv_batch gemv_batch_of(const gemv_params & p, const gemv_seg_plan & s, int batch,
                                                           int team, int slice, const uint8_t * smem, int & expert) {
    const int  local = batch - s.batch_begin;
    const int  inst  = local / s.batches_per_inst;
    gemv_batch c;
    c.w               = s.w;
    c.row_stride      = s.row_stride;
    c.rows            = s.rows;
    c.row0            = (local - inst * s.batches_per_inst) * s.rows_per_batch;
    c.nrows           = s.rows_per_batch;
    c.k               = p.k;
    c.units_per_row   = s.units_per_row;
    c.lpr             = s.lpr;
    c.ipl             = s.ipl;
    c.split           = p.split;
    c.slice           = slice;
    c.nt              = p.tokens;
    c.out             = s.out;
    c.out_stride      = s.out_stride;
    c.residual        = s.residual;
    c.residual_stride = s.residual_stride;
    c.epilogue        = s.epilogue;
    c.team            = (float *) (smem + p.smem_team) + team * kMaxSplit * kMaxRps * T;
    c.team_barrier    = 1 + team;
    int vec           = 0;
    expert            = -1;
    if (s.ids != nullptr) {
        const int t = inst / s.n_used, j = inst % s.n_used;
        expert      = ((const int32_t *) (smem + p.smem_ids))[s.ids_smem + inst];
        vec         = t * p.x_per_token + (p.x_per_token == 1 ? 0 : j);
        c.nt        = 1;
        c.out += inst * s.out_stride;
        if (c.residual != nullptr) {
            c.residual += inst * s.residual_stride;
        }
        c.w += (int64_t) expert * s.expert_stride;
    }
    c.x.k = p.k;
    c.x.q = (const int8_t *) (smem + p.smem_xq) + vec * p.k;
    c.x.m = (const uint2 *) (smem + p.smem_xm) + vec * (p.k / 32);
    c.x.f = (const float *) (smem + p.smem_xf) + vec * p.k;
    return c;
}

// One direct-path type an instance (DIRECT, or -1 for none): all direct types in one kernel make
// ptxas spill in the hot loops; one direct type plus the staged path does not. The other segments
// of a launch are staged (GGUF Q6_K/Q8_0, and Q6_K_R/Q8_0_R when DIRECT is another type).
template <int DIRECT, int T>
__launch_bounds__(kThreads, 2) static __global__ void frt_gemv_registers_kernel(
    const __grid_constant__ gemv_params p) {
    extern __shared__ __align__(16) uint8_t smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int team = warp / p.split, slice = warp % p.split;
    const int teams_per_block = kWarps / p.split;
    const int first = blockIdx.x * teams_per_block + team, n_teams = gridDim.x * teams_per_block;
    uint8_t * buf   = smem + p.smem_stage + warp * p.stage_bytes;  // staging and the preload

    // Before the wait for the previous kernel (weights are not written by kernels): the first
    // chunk of a dense direct first batch into this warp's buffer, else the batch into L2.
    bool preloaded = false;
    if (first < p.total_batches && !(p.lab & 2)) {
        const gemv_seg_plan & s = p.seg[gemv_segment_of(p, first)];
        if constexpr (DIRECT >= 0) {
            if (p.preload && !s.staged && s.ids == nullptr) {
                int expert;
                gemv_direct_preload<DIRECT, T>(gemv_batch_of<T>(p, s, first, team, slice, smem, expert), lane, buf);
                preloaded = true;
            }
        }
        if (!preloaded) {
            gemv_prefetch_l2(p, first, slice, lane);
        }
    }
    frt_pdl_wait();
    gemv_prologue(p, smem);
    __syncthreads();
    if (!(p.lab & 1)) {
        frt_pdl_launch_dependents();
    }

    for (int batch = first; batch < p.total_batches; batch += n_teams) {
        const gemv_seg_plan & s = p.seg[gemv_segment_of(p, batch)];
        int                   expert;
        const gemv_batch      c = gemv_batch_of<T>(p, s, batch, team, slice, smem, expert);
        if (s.ids != nullptr && (expert < 0 || expert >= s.n_experts)) {
            // No matrix to read: the rows of this slot become NaN, visibly.
            const int row1 = min(c.row0 + c.nrows, c.rows);
            for (int row = c.row0 + lane; row < row1 && slice == 0; row += 32) {
                c.out[row] = __int_as_float(0x7fffffff);
            }
            continue;
        }
        if (s.staged) {
            switch (s.type) {
                case FRT_GEMV_Q6_K:   gemv_staged_batch<FRT_GEMV_Q6_K, T>(c, buf, s.row_bytes, lane); break;
                case FRT_GEMV_Q8_0:   gemv_staged_batch<FRT_GEMV_Q8_0, T>(c, buf, s.row_bytes, lane); break;
                case FRT_GEMV_Q6_K_R: gemv_staged_batch<FRT_GEMV_Q6_K_R, T>(c, buf, s.row_bytes, lane); break;
                default:              gemv_staged_batch<FRT_GEMV_Q8_0_R, T>(c, buf, s.row_bytes, lane); break;
            }
        } else if constexpr (DIRECT >= 0) {
            gemv_direct_batch<DIRECT, T>(c, lane, preloaded && batch == first ? buf : nullptr);
        }
    }
}

// ---- launching (host) ----

static constexpr int kMaxSmem    = 99 * 1024;  // dynamic shared memory a launch may use: sm_120's most
static constexpr int kStaticSmem = 256;        // gemv_prologue's partial sums
static constexpr int kMaxDevices = 16;

// The plan of a launch (gemv.cu): nullptr, or why frt_gemv does not take it. smem: its bytes of
// shared memory. warps_available: resident warps of the device.
const char * frt_gemv_plan(const frt_gemv_args & a, int warps_available, gemv_params & p, int & smem);

// What a launch needs to know of a device, asked once per device (gemv.cu).
struct gemv_device {
    int sms, smem_per_sm, smem_reserved, smem_optin, cc_major;
};
cudaError_t frt_gemv_device_info(int device, gemv_device & info);

template <int DIRECT, int T> static cudaError_t gemv_launch(const frt_gemv_args & a, cudaStream_t stream) {
    int         device = 0;
    gemv_device dev;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) {
        err = frt_gemv_device_info(device, dev);
    }
    if (err == cudaSuccess) {
        err = frt_allow_smem<frt_gemv_registers_kernel<DIRECT, T>>(device, kMaxSmem);
    }
    if (err != cudaSuccess) {
        return err;
    }
    gemv_params p;
    int         smem = 0;
    if (frt_gemv_plan(a, dev.sms * 2 * kWarps, p, smem) != nullptr) {
        return cudaErrorInvalidValue;
    }
    static const int lab = frt_env_int("FRT_GEMV_LAB", 0);
    p.lab = lab;
    // Blocks an SM holds: 2 by registers (__launch_bounds__), fewer when shared memory is short.
    const int per_sm = std::max(1, std::min(2, dev.smem_per_sm / (smem + kStaticSmem + dev.smem_reserved)));
    const int teams_per_block = kWarps / p.split;
    const int blocks = std::min((p.total_batches + teams_per_block - 1) / teams_per_block, dev.sms * per_sm);
    return frt_launch(frt_gemv_registers_kernel<DIRECT, T>, dim3(blocks), dim3(kThreads), (size_t) smem, stream, p);
}

// The instance for launches of up to T tokens whose direct-path type is `direct` (-1: none).
template <int T> static cudaError_t gemv_launch_tokens(const frt_gemv_args & a, int direct, cudaStream_t stream) {
    switch (direct) {
        case FRT_GEMV_F32:    return gemv_launch<FRT_GEMV_F32, T>(a, stream);
        case FRT_GEMV_F16:    return gemv_launch<FRT_GEMV_F16, T>(a, stream);
        case FRT_GEMV_BF16:   return gemv_launch<FRT_GEMV_BF16, T>(a, stream);
        case FRT_GEMV_Q4_K:   return gemv_launch<FRT_GEMV_Q4_K, T>(a, stream);
        case FRT_GEMV_Q5_K:   return gemv_launch<FRT_GEMV_Q5_K, T>(a, stream);
        case FRT_GEMV_Q6_K_R: return gemv_launch<FRT_GEMV_Q6_K_R, T>(a, stream);
        case FRT_GEMV_Q8_0_R: return gemv_launch<FRT_GEMV_Q8_0_R, T>(a, stream);
        default:              return gemv_launch<-1, T>(a, stream);
    }
}

// The exact kernel (gemv-exact.cu): args already checked by frt_gemv_unsupported(args, EXACT).
cudaError_t frt_gemv_exact_launch(const frt_gemv_args & a, cudaStream_t stream);
// Whether the launch runs on frt_router_f32 (an input norm and F32 rows only, one token, the switch
// on): the only launch that writes the normed x's image (frt_gemv_args::x_normed_q8).
bool frt_gemv_exact_on_router(const frt_gemv_args & a);
// Its shared memory: the most bytes a launch needs besides staged rows (which shrink to fit), and
// where x's scales and float copy start.
int frt_gemv_exact_layout(const frt_gemv_args & a, int & smem_xm, int & smem_xf);

// The head kernel (gemv-head.cu): why it does not take `a`, or nullptr; its launch.
const char * frt_gemv_head_unsupported(const frt_gemv_args & a);
cudaError_t  frt_gemv_head_launch(const frt_gemv_args & a, cudaStream_t stream);

// Defined in gemv-tokens{1,2,4,8}.cu.
cudaError_t frt_gemv_launch_tokens1(const frt_gemv_args & a, int direct, cudaStream_t stream);
cudaError_t frt_gemv_launch_tokens2(const frt_gemv_args & a, int direct, cudaStream_t stream);
cudaError_t frt_gemv_launch_tokens4(const frt_gemv_args & a, int direct, cudaStream_t stream);
cudaError_t frt_gemv_launch_tokens8(const frt_gemv_args & a, int direct, cudaStream_t stream);

