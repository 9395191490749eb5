#pragma once

// The exact kernel (FRT_GEMV_KERNEL_EXACT): one token, GGUF Q4_K/Q6_K/Q8_0 and F32 rows, every row
// added up in the order ggml-cuda adds it for one token (mmvq for the quantized types, mmvf for
// F32), so that its outputs are bit-identical to stock's (x is quantized as stock's quantize_q8_1
// quantizes it: gemv_prologue_x).
//
// Why: a decode step of a recurrent model amplifies last-bit differences. The register kernel's
// sums, associated its own way, move the synthetic qwen36 logits 6x as far from stock's as
// ggml's fusions do (cargo xtask parity, docs/perf-notes.md); a sum in stock's order moves them
// not at all.
//
// mmvq's order for one token (ncols_dst = 1, 4 warps a row on NVIDIA): thread t of 128 takes the
// items t, t + 128, ... of the row (an item: `per_block` threads share a block, item t is block
// t / per_block, position t % per_block) and adds its dot products in that order from 0; warp 0
// then adds warps 1, 2 and 3 lane by lane, in that order; then a butterfly over the 32 lanes (xor
// 16, 8, 4, 2, 1). Each item's arithmetic here repeats stock's vec_dot expression for expression
// (same operations, same contraction under -use_fast_math/-fmad).
//
// Thread t of each 128 computes stock's thread t of a row; what differs is what a block does
// around that:
// - a block (512 threads) takes a run of contiguous rows of one matrix (one expert slot) and
//   copies them into shared memory with cp.async in one go, before the wait for the previous
//   kernel (weights are not written by kernels; expert rows right after the wait, their ids come
//   from an earlier kernel): the whole launch's weights are in flight at once, while the previous
//   kernel ends and the block norms and quantizes x (which stock runs as separate kernels);
// - x's words for a thread's items are read once and reused for every row;
// - rows of at most 64 items (k = 512) take 64 or 32 threads each, side by side, where stock
//   leaves those threads idle (their sums, zeros, are still added in the same place);
// - the cross-warp sums of all of a block's rows go through shared memory behind one barrier.
// Measured against one warp a row (every lane playing 4 of stock's threads) in gemv-bench on the
// H200 (docs/perf-notes.md): 1.1-1.8x faster at every decode shape but the shared expert's down.
//
// mmvf's order for F32 (ncols_dst = 1): a block of B threads (the smallest B of 32, 64, ... 256
// with the fewest passes over the k / 2 float pairs), thread t adding w * x of pairs t, t + B, ...
// (x then y of each pair, fused), a butterfly in each warp, then the B / 32 warp sums (zeros past
// them) in one more butterfly. Here one warp takes a row, lane l keeping threads l, l + 32, ... apart.

// The kernel and its device code are here; gemv-exact.cu plans the launch (its shape and the
// instance) and instantiates it.

#include "bulk-copy.cuh"
#include "gemv-impl.cuh"
#include "moe-ffn-tail.cuh"
#include "warp-reduce.cuh"

#include <cfloat>

static constexpr int kStockThreads = 128;  // stock mmvq's block for one token: the threads of a row
// A block: 4 rows' worth of stock's threads side by side, 2 blocks an SM. Large blocks because
// every block norms and quantizes x itself: 2 blocks an SM do that 264 times a launch on the H200
// where 128-thread blocks did it over a thousand times (gemv-bench: attn_qkv 7.2 µs against 11-12).
static constexpr int kExactThreads = 512;
static constexpr int kExactMaxRows = 64;  // rows a block, when that makes a launch of at least a wave
static constexpr int kExactWaveRows = 96;  // rows a block, when that brings a launch into one wave
static constexpr int kExactBlocksPerSm = 2;  // at most 64 registers a thread

// One segment as the kernel reads it: blocks [block_begin, block_begin + slots x chunks) of the
// launch, chunk c of slot s holding rows [c x chunk_rows, ...) of matrix `slot s`.
struct exact_seg {
    const uint8_t * w;
    float *         out;
    const float *   residual;
    const int32_t * ids;
    const uint8_t * w_gate;  // FRT_GEMV_SWIGLU: the gate matrix (its rows staged after w's)
    const float *   x;       // the segment's own input (frt_gemv_segment::x), or nullptr
    int64_t         row_stride, out_stride, residual_stride, expert_stride;
    int             type, rows, epilogue, n_experts, chunks, block_begin;
    int             chunk_rows;  // rows a block (at most exact_params::rows_per_block)
    int             stage_unit;  // bytes a cp.async copies when the rows are staged (16 or 4), 0: read in place
};

struct exact_params {
    const float * x;
    const float * norm;
    int64_t       x_stride;
    float         eps;
    int           k, n_vec;
    float *       x_out;
    int64_t       x_out_stride;
    const uint8_t * x_q8;  // frt_gemv_args::x_q8: x normed and quantized by the kernel before
    int           n_segments, rows_per_block, smem_xm, smem_xf, smem_part, smem_stage;
    int           need_q8, need_f32;
    int           f32_block;  // mmvf's block size for k columns
    // The routed experts' selection computed in the launch (frt_gemv_args::route_logits): experts
    // a lane (n_experts / 32), 0 when the launch does not route.
    const float * route_logits;
    int32_t *     route_ids;
    float *       route_weights;
    int           route_ept, route_n_used, route_norm;
    // frt_gemv_args::guess_logits: the expert blocks select from these before their wait (route_ept
    // and route_n_used describe the selection), write nothing, and stage the rows guessed.
    const float * guess_logits;
    float         route_clamp, route_scale;
    // frt_gemv_args::tail (out non-null): its segments' blocks count their rows and complete it.
    frt_gemv_moe_tail tail;
    int               tail_n_used, tail_rows;
    int           evict_first;  // the staged rows' copies marked evict-first in L2 (exact_stager)
    // Chunks: the launch's rows as n_chunks ids (exact_chunk_of), block b taking id b. With
    // chunk_counter (this launch's words of frt_gemv_args::chunk_counters), a block then takes
    // more chunks of its first chunk's type (the same kernel code) from that type's counter, each
    // staged into the other of two buffers (stage_buffer bytes apart) while it multiplies the one
    // before. Without it n_chunks is the grid.
    unsigned *    chunk_counter;
    int           n_chunks, stage_buffer;
    int           type_blocks[3];  // with chunk_counter: the grid's blocks that start with a chunk of each type
    int           scatter_rows;  // blocks of at least this many rows add them by reduce-scatter (0: none)
    frt_gemv_prefetch prefetch;  // frt_gemv_args::prefetch
    // frt_gemv_trace: non-null, each block writes a record at its end.
    frt_gemv_trace_record * trace;
    unsigned long long *    trace_cursor;
    int                     trace_capacity;
    exact_seg     seg[FRT_GEMV_MAX_SEGMENTS];
};

// The trace's marks (frt_gemv_trace_record), noted by thread 0 in shared memory, so that no
// register is held across the kernel for them.
enum exact_mark : int { kMarkWaited, kMarkIssued, kMarkNormed, kMarkPrologue, kMarkLanded, kMarkProducts, kMarks };
struct exact_trace_marks {
    uint64_t start_ns;
    unsigned start, at[kMarks];  // %clock (32 bits: a mark costs one register; differences wrap alike)
};

static __device__ __forceinline__ exact_trace_marks & exact_marks() {
    __shared__ exact_trace_marks marks;
    return marks;
}

static __device__ __forceinline__ unsigned exact_clock() {
    unsigned c = 0;
#if defined(__CUDA_ARCH__)
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c)::"memory");  // no load or store moves across a mark
#endif
    return c;
}

static __device__ __forceinline__ uint64_t exact_globaltimer() {
    uint64_t t = 0;
#if defined(__CUDA_ARCH__)
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
#endif
    return t;
}

// TRACE: the kernel instance that writes them (its own instance: the marks' registers made ptxas
// spill in the others).
template <bool TRACE> static __device__ __forceinline__ void exact_trace_start() {
    if (TRACE && threadIdx.x == 0) {
        exact_trace_marks & m = exact_marks();
        m.start               = exact_clock();
        m.start_ns            = exact_globaltimer();
#pragma unroll
        for (int i = 0; i < kMarks; ++i) {
            m.at[i] = m.start;
        }
    }
}

template <bool TRACE> static __device__ __forceinline__ void exact_trace_mark(int mark) {
    if (TRACE && threadIdx.x == 0) {
        exact_marks().at[mark] = exact_clock();
    }
}

// The block's record, once its rows are stored (thread 0's stores: its view of the block's end).
template <bool TRACE> static __device__ void exact_trace_end(const exact_params & p, const exact_seg & s, bool glu) {
    if (!TRACE || threadIdx.x != 0) {
        return;
    }
    const exact_trace_marks & m = exact_marks();
    frt_gemv_trace_record     r;
    r.stored   = exact_clock() - m.start;
    r.end_ns   = exact_globaltimer();
    r.tag      = (uint64_t) (uintptr_t) p.seg[0].w;
    r.block    = (uint16_t) blockIdx.x;
    r.grid     = (uint16_t) gridDim.x;
    unsigned sm = 0;
#if defined(__CUDA_ARCH__)
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
#endif
    r.sm       = sm;
    r.kind     = (unsigned) s.type | (unsigned) p.n_segments << 8 | (glu ? 1u : 0u) << 16 |
             (p.route_logits != nullptr ? 1u : 0u) << 17 | (p.guess_logits != nullptr ? 1u : 0u) << 18 |
             (p.norm != nullptr ? 1u : 0u) << 19;
    r.start_ns = m.start_ns;
    r.waited   = m.at[kMarkWaited] - m.start;
    r.issued   = m.at[kMarkIssued] - m.start;
    r.normed   = m.at[kMarkNormed] - m.start;
    r.prologue = m.at[kMarkPrologue] - m.start;
    r.landed   = m.at[kMarkLanded] - m.start;
    r.products = m.at[kMarkProducts] - m.start;
    const unsigned long long at = atomicAdd(p.trace_cursor, 1ull) % (unsigned long long) p.trace_capacity;
    p.trace[at]                 = r;
}

// A 4-byte word of weights at a 2-byte aligned address (GGUF Q6_K and Q8_0 blocks are 210 and 34
// bytes), as two 16-bit loads.
static __device__ __forceinline__ int exact_int_b2(const uint8_t * p) {
    const uint16_t * h = (const uint16_t *) p;
    return (int) ((uint32_t) h[0] | ((uint32_t) h[1] << 16));
}

// Word i (4 int8 values) of x's 32-value block b, and the block's scale (half-rounded, as float).
static __device__ __forceinline__ int exact_xq(const int8_t * xq, int b, int i) {
    return ((const int *) (xq + 32 * b))[i];
}

static __device__ __forceinline__ float exact_xd(const uint2 * xm, int b) {
    return __uint_as_float(xm[b].x);
}

// The block's routed experts in selection order (exact_route), kept for every chunk it takes.
static __device__ __forceinline__ int * exact_routed() {
    __shared__ int routed[32];
    return routed;
}

// The chunk the block takes after the current one (n_chunks or more: none): written by thread 0,
// read by every thread after a barrier. In shared memory: a register held across the products
// is one the products' loop has not.
static __device__ __forceinline__ int & exact_claimed() {
    __shared__ int claimed;
    return claimed;
}

// The chunk in each of the two stage buffers: written by thread 0 once the copies into the buffer
// are issued, read by every thread after the barrier that follows. Each chunk's rows, matrix and
// validity are found again from it where they are used: held in registers across the products,
// they made ptxas spill there.
static __device__ __forceinline__ int * exact_staged() {
    __shared__ int staged[2];
    return staged;
}

// A launch's words of chunk counters: one claim counter for each quantized type (a block takes
// chunks of its first chunk's type, which its instance of the row code multiplies), then the count
// of blocks done.
constexpr int kExactChunkTypes = 3;
static_assert(FRT_GEMV_CHUNK_COUNTER_WORDS == FRT_GEMV_CHUNK_SLOTS * (kExactChunkTypes + 1), "a launch's words");

static __host__ __device__ __forceinline__ int exact_chunk_type(int type) {
    return type == FRT_GEMV_Q4_K ? 0 : type == FRT_GEMV_Q6_K ? 1 : 2;
}

// The id of chunk `k` of the type's chunks (every segment of the type, in order); n_chunks past
// the last.
static __device__ int exact_type_chunk(const exact_params & p, int type, int k) {
    for (int i = 0; i < p.n_segments; ++i) {
        const exact_seg & s    = p.seg[i];
        const int         from = s.block_begin;
        const int         to   = i + 1 < p.n_segments ? p.seg[i + 1].block_begin : p.n_chunks;
        if (exact_chunk_type(s.type) != type) {
            continue;
        }
        if (k < to - from) {
            return from + k;
        }
        k -= to - from;
    }
    return p.n_chunks;
}

// The block's first chunk: its own index, or, when blocks take chunks from counters, the next of
// the type whose share of the grid (exact_params::type_blocks) it is in.
static __device__ __forceinline__ int exact_first_chunk(const exact_params & p) {
    int b = blockIdx.x;
    if (p.chunk_counter == nullptr) {
        return b;
    }
    for (int t = 0; t < kExactChunkTypes; ++t) {
        if (b < p.type_blocks[t]) {
            return exact_type_chunk(p, t, b);
        }
        b -= p.type_blocks[t];
    }
    return p.n_chunks;
}

// Thread 0: the next chunk of the type past those the grid's blocks start with, from the type's
// counter; n_chunks when none is left.
static __device__ int exact_claim(const exact_params & p, int type) {
    const int t = exact_chunk_type(type);
    return exact_type_chunk(p, t, p.type_blocks[t] + (int) atomicAdd(p.chunk_counter + t, 1u));
}

// Thread 0, once the block has taken its last chunk: the last block to get here sets the launch's
// counters back to zero for a later launch (every block's claims are made by then).
static __device__ __forceinline__ void exact_chunks_done(const exact_params & p) {
    if (p.chunk_counter == nullptr || threadIdx.x != 0) {
        return;
    }
    __threadfence();
    if (atomicAdd(p.chunk_counter + kExactChunkTypes, 1u) == gridDim.x - 1) {
        for (int i = 0; i <= kExactChunkTypes; ++i) {
            atomicExch(p.chunk_counter + i, 0u);
        }
    }
}

// A probability's place in the argmax's order as an unsigned key (any float but NaN; -0 counts as
// +0, as the float comparison does), and back: equal keys for equal floats, so ties still go to
// the lower expert. The routing's probabilities are +0 or more, -FLT_MAX (a NaN) or -inf (taken).
static __device__ __forceinline__ uint32_t exact_route_key(float v) {
    const uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

static __device__ __forceinline__ float exact_route_value(uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

// The routed experts of the launch's token, with one warp, as ggml-cuda's fused top-k
// (topk-moe.cu: topk_moe_cuda with a softmax gate, no bias, no delayed softmax) selects them:
// lane l holds experts l, l + 32, ... (EPT of them); the softmax (maximum, then exp(v - max)
// summed in a lane in order and across the warp by the butterfly, then times 1 / sum); a NaN
// probability made -FLT_MAX; n_used (<= 32) rounds of an argmax (a lane's own experts in order,
// then the butterfly, ties to the lower expert), each round's winner taken out, its weight kept by
// lane `round` and added, when normalising, to the sum of the lane that owns the expert; that sum
// across the warp, max(sum, clamp), the weights times 1 / sum; the written weight times the scale.
// ids[] (shared memory) receives the experts in selection order; block 0 writes the weights.
template <int EPT>
static __device__ void exact_route_warp(const exact_params & p, const float * logits, bool publish, int * ids) {
    const int lane = threadIdx.x % 32;
    float     wt[EPT];
#pragma unroll
    for (int i = 0; i < EPT; ++i) {
        wt[i] = __ldcg(logits + i * 32 + lane);  // L2: a guess reads them before the wait
    }
    float max_val = -INFINITY;
#pragma unroll
    for (int i = 0; i < EPT; ++i) {
        max_val = fmaxf(max_val, wt[i]);
    }
    max_val   = frt_warp_max(max_val);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < EPT; ++i) {
        const float val = expf(wt[i] - max_val);
        wt[i]           = val;
        sum += val;
    }
    sum                 = frt_warp_sum(sum);
    const float inv_sum = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < EPT; ++i) {
        wt[i] *= inv_sum;
    }
#pragma unroll
    for (int i = 0; i < EPT; ++i) {
        if (__isnanf(wt[i])) {
            wt[i] = -FLT_MAX;
        }
    }
    float weight = 0.0f;  // round `lane`'s (stock's output_weights[0]: n_used <= 32 leaves the rest zero)
    float wt_sum = 0.0f;
    uint32_t taken  = 0;  // bit i: expert lane + 32 i chosen (stock sets its probability to -inf)
    const auto prob = [&](int i) { return (taken >> i) & 1 ? -INFINITY : wt[i]; };
    for (int k = 0; k < p.route_n_used; ++k) {
        float max_v = prob(0);
        int   max_e = lane;
#pragma unroll
        for (int i = 1; i < EPT; ++i) {
            if (prob(i) > max_v) {
                max_v = prob(i);
                max_e = lane + i * 32;
            }
        }
        // The warp's largest (value, then lowest expert): what stock's butterfly of (value,
        // expert) pairs finds, as two warp reductions instead of five shuffle rounds.
        const uint32_t key  = exact_route_key(max_v);
        const uint32_t best = __reduce_max_sync(kFull, key);
        max_e               = (int) __reduce_min_sync(kFull, key == best ? (uint32_t) max_e : 0xffffffffu);
        max_v               = exact_route_value(best);
        if ((max_e & 31) == lane) {
            taken |= 1u << (max_e / 32);
        }
        if (k == lane) {
            weight = max_v;
        }
        if ((max_e & 31) == lane) {
            ids[k] = max_e;
            if (p.route_norm) {
                wt_sum += max_v;
            }
        }
    }
    if (p.route_norm) {
        wt_sum             = frt_warp_sum(wt_sum);
        wt_sum             = fmaxf(wt_sum, p.route_clamp);
        const float inv    = 1.0f / wt_sum;
        weight *= inv;
    }
    if (publish && lane < p.route_n_used) {
        p.route_weights[lane] = weight * p.route_scale;
    }
}

// The selection from `logits` into ids[] for the whole block; with `publish` (block 0 of a launch
// that routes) also written out for the kernels after the launch. Every thread of the block calls
// it.
static __device__ void exact_route(const exact_params & p, const float * logits, bool publish, int * ids) {
    if (threadIdx.x < 32) {
        switch (p.route_ept) {
            case 1:  exact_route_warp<1>(p, logits, publish, ids); break;
            case 2:  exact_route_warp<2>(p, logits, publish, ids); break;
            case 4:  exact_route_warp<4>(p, logits, publish, ids); break;
            case 8:  exact_route_warp<8>(p, logits, publish, ids); break;
            default: exact_route_warp<16>(p, logits, publish, ids); break;
        }
    }
    __syncthreads();
    if (publish && (int) threadIdx.x < p.route_n_used) {
        p.route_ids[threadIdx.x] = ids[threadIdx.x];
    }
}

// The scales and mins (6 bits each) of sub-blocks j and j + 1 of a Q4_K block (j even), packed as
// bytes (scale j, scale j + 1, min j, min j + 1), from its 12 scale bytes q held as three words:
// q[j] & 63 and q[j + 4] & 63 below j = 4; above, the low nibble (scale) or high nibble (min) of
// q[j + 4] with the top two bits of q[j - 4] (scale) or q[j] (min) as bits 4 and 5. Byte
// permutes instead of byte loads: the same integers, a few instructions.
static __device__ __forceinline__ uint32_t exact_k4_scales_mins(uint32_t s0, uint32_t s1, uint32_t s2, int j) {
    const uint32_t jj = j % 4;  // 0 or 2
    const uint32_t t  = __byte_perm(s0, s1, jj | (jj + 1) << 4 | (jj + 4) << 8 | (jj + 5) << 12);  // q[j - 4 or j], q[j or j + 4]
    if (j < 4) {
        return t & 0x3F3F3F3F;
    }
    const uint32_t u = __byte_perm(s2, s2, jj | (jj + 1) << 4 | jj << 8 | (jj + 1) << 12);  // q[j + 4], q[j + 5], twice
    return (u & 0x00000F0F) | ((u >> 4) & 0x0F0F0000) | ((t >> 2) & 0x30303030);
}

// One mmvq item of each type, in three steps: load (the item's weight words, block kbx of a row at
// position iqs, stock's names), load_x (x's words the item multiplies, the same for every row of
// a matrix) and dot (stock's vec_dot arithmetic on them). per_block: threads a block.
template <int TYPE> struct exact_item;

template <> struct exact_item<FRT_GEMV_Q4_K> {
    static constexpr int per_block = 16, qk = 256;
    struct w_t {
        int      v0, v1;
        uint32_t dm, s0, s1, s2;  // the block's d and dmin (half2), then its 12 scale bytes
    };
    struct x_t {
        int   u[2][2], dot2[2];
        float d8[2];
    };
    static __device__ __forceinline__ int iqs(int t) { return 2 * (t % per_block); }
    static __device__ __forceinline__ w_t load(const uint8_t * row, int kbx, int iqs) {
        const uint8_t * blk        = row + 144 * kbx;
        const int       bq8_offset = 2 * ((iqs / 2) / 4);
        const int       r          = (iqs / 2) % 4;
        const int *     q4         = (const int *) (blk + 16 + 16 * bq8_offset + 4 * r);
        const uint4     h          = *(const uint4 *) blk;
        return { q4[0], q4[4], h.x, h.y, h.z, h.w };
    }
    static __device__ __forceinline__ x_t load_x(const int8_t * xq, const uint2 * xm, int kbx, int iqs) {
        const int bq8_offset = 2 * ((iqs / 2) / 4);
        const int r          = (iqs / 2) % 4;
        x_t       x;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int b = 8 * kbx + bq8_offset + i;
            x.d8[i]     = exact_xd(xm, b);
            x.u[i][0]   = exact_xq(xq, b, r);
            x.u[i][1]   = exact_xq(xq, b, r + 4);
            x.dot2[i]   = __dp4a(0x01010101, x.u[i][1], __dp4a(0x01010101, x.u[i][0], 0));
        }
        return x;
    }
    static __device__ __forceinline__ float dot(const w_t & w, const x_t & x, int iqs) {
        const uint32_t sm = exact_k4_scales_mins(w.s0, w.s1, w.s2, 2 * ((iqs / 2) / 4));
        const int      sc[2] = { (int) (sm & 0xff), (int) ((sm >> 8) & 0xff) };
        const int      m[2]  = { (int) ((sm >> 16) & 0xff), (int) (sm >> 24) };
        float sumf_d = 0.0f;
        float sumf_m = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int v0i  = (w.v0 >> (4 * i)) & 0x0F0F0F0F;
            const int v1i  = (w.v1 >> (4 * i)) & 0x0F0F0F0F;
            const int dot1 = __dp4a(v1i, x.u[i][1], __dp4a(v0i, x.u[i][0], 0));
            sumf_d += x.d8[i] * (dot1 * sc[i]);
            sumf_m += x.d8[i] * (x.dot2[i] * m[i]);
        }
        const float2 dm = __half22float2(*(const half2 *) &w.dm);
        return dm.x * sumf_d - dm.y * sumf_m;
    }
};

template <> struct exact_item<FRT_GEMV_Q6_K> {
    static constexpr int per_block = 32, qk = 256;
    struct w_t {
        int      vl, vh, sc[2];
        uint32_t d;  // the block's half scale
    };
    struct x_t {
        int   u[2];
        float d8[2];
    };
    static __device__ __forceinline__ int iqs(int t) { return t % per_block; }
    static __device__ __forceinline__ w_t load(const uint8_t * row, int kbx, int iqs) {
        const uint8_t * blk          = row + 210 * kbx;
        const int       scale_offset = 8 * (iqs / 16) + (iqs % 16) / 4;
        const int       vh_shift     = 2 * ((iqs % 16) / 8);
        const int8_t *  scales       = (const int8_t *) (blk + 192) + scale_offset;
        return { exact_int_b2(blk + 4 * iqs), exact_int_b2(blk + 128 + 4 * (8 * (iqs / 16) + iqs % 8)) >> vh_shift,
                 { scales[0], scales[4] }, *(const uint16_t *) (blk + 208) };
    }
    static __device__ __forceinline__ x_t load_x(const int8_t * xq, const uint2 * xm, int kbx, int iqs) {
        const int bq8_offset = 4 * (iqs / 16) + (iqs % 16) / 8;
        x_t       x;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int b = 8 * kbx + bq8_offset + 2 * i;
            x.u[i]      = exact_xq(xq, b, iqs % 8);
            x.d8[i]     = exact_xd(xm, b);
        }
        return x;
    }
    static __device__ __forceinline__ float dot(const w_t & w, const x_t & x, int) {
        float sumf = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int vil = (w.vl >> (4 * i)) & 0x0F0F0F0F;
            const int vih = ((w.vh >> (4 * i)) << 4) & 0x30303030;
            const int vi  = __vsub4((vil | vih), 0x20202020);
            sumf += x.d8[i] * (__dp4a(vi, x.u[i], 0) * w.sc[i]);
        }
        const float d = __half2float(__ushort_as_half((unsigned short) w.d));
        return d * sumf;
    }
};

template <> struct exact_item<FRT_GEMV_Q8_0> {
    static constexpr int per_block = 4, qk = 32;
    struct w_t {
        int      q[2];
        uint32_t d;  // the block's half scale
    };
    struct x_t {
        int   u[2];
        float d8;
    };
    static __device__ __forceinline__ int iqs(int t) { return 2 * (t % per_block); }
    static __device__ __forceinline__ w_t load(const uint8_t * row, int kbx, int iqs) {
        const uint8_t * blk = row + 34 * kbx;
        return { { exact_int_b2(blk + 2 + 4 * iqs), exact_int_b2(blk + 2 + 4 * (iqs + 1)) }, *(const uint16_t *) blk };
    }
    static __device__ __forceinline__ x_t load_x(const int8_t * xq, const uint2 * xm, int kbx, int iqs) {
        return { { exact_xq(xq, kbx, iqs), exact_xq(xq, kbx, iqs + 1) }, exact_xd(xm, kbx) };
    }
    static __device__ __forceinline__ float dot(const w_t & w, const x_t & x, int) {
        int sumi = 0;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            sumi = __dp4a(w.q[i], x.u[i], sumi);
        }
        const float d8_0 = __half2float(__ushort_as_half((unsigned short) w.d));
        return d8_0 * x.d8 * ((float) sumi);
    }
};

// An F32 row (k floats) as mmvf sums it with a block of `block` threads (32..256).
static __device__ __forceinline__ float exact_row_f32(const float * row, int k, const float * xf, int block, int lane) {
    const float2 * w2 = (const float2 *) row;
    const float2 * x2 = (const float2 *) xf;
    const int      nw = block / 32;
    float          acc[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) {
        acc[w] = 0.0f;
    }
    for (int c0 = 0; c0 < k / 2; c0 += block) {
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const int c = c0 + 32 * w + lane;
            if (w < nw && c < k / 2) {
                const float2 tw = w2[c], tx = x2[c];
                acc[w] += tw.x * tx.x;
                acc[w] += tw.y * tx.y;
            }
        }
    }
    float mine = 0.0f;  // lane l: warp l's sum (zero past the block's warps)
#pragma unroll
    for (int w = 0; w < 8; ++w) {
        if (w < nw) {
            const float v = frt_warp_sum(acc[w]);
            mine          = lane == w ? v : mine;
            if (nw == 1) {
                return v;
            }
        }
    }
    return frt_warp_sum(mine);
}

// The RMS norm's scale of n vectors (vector v at x + v * x_stride) as ggml-cuda's fused rms_norm +
// mul computes it (rms_norm_f32 with do_multiply): a block of B = 1024 threads (256 below 1024
// columns), thread t adding the squares of columns t, t + B, ... from 0, a butterfly in each warp,
// then the B / 32 warp sums (zeros past them) in one more butterfly; mean = sum / k, scale =
// rsqrtf(mean + eps). Real warp w plays stock's warps w, w + 4, ..., their loads issued together
// (each virtual thread still adds its columns in order). The normed value, scale * x * w, is then
// formed by gemv_prologue_x as stock forms it.
static __device__ void exact_norm_scales(const float * x0, int64_t x_stride, int n, int k, float eps, float * scales) {
    constexpr int    kWarps = kExactThreads / 32, kVirtual = 1024 / 32 / kWarps;
    __shared__ float warp_sums[32];
    const int        warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int        block = k < 1024 ? 256 : 1024;
    for (int v = 0; v < n; ++v) {
        const float * x = x0 + (int64_t) v * x_stride;
        float         tmp[kVirtual];
#pragma unroll
        for (int i = 0; i < kVirtual; ++i) {
            tmp[i] = 0.0f;
        }
        for (int c0 = 0; c0 < k; c0 += block) {
#pragma unroll
            for (int i = 0; i < kVirtual; ++i) {
                const int vw = warp + kWarps * i, col = c0 + 32 * vw + lane;
                if (vw < block / 32 && col < k) {
                    const float xi = x[col];
                    tmp[i] += xi * xi;
                }
            }
        }
#pragma unroll
        for (int i = 0; i < kVirtual; ++i) {
            const int   vw  = warp + kWarps * i;
            const float sum = frt_warp_sum(tmp[i]);
            if (vw < block / 32 && lane == 0) {
                warp_sums[vw] = sum;
            }
        }
        __syncthreads();
        const float sum   = frt_warp_sum(lane < block / 32 ? warp_sums[lane] : 0.0f);
        const float mean  = sum / k;
        const float scale = rsqrtf(mean + eps);
        if (threadIdx.x == 0) {
            scales[v] = scale;
        }
        __syncthreads();  // warp_sums is written again for the next vector; scales is read next
    }
}

// After the wait for the previous kernel: x into shared memory, normed first when the launch has a
// norm, then quantized as stock's quantize_q8_1 does (and/or kept in float for F32 rows). Only the
// block's vector `vec` (or its segment's own input), unless the launch keeps the normed vectors
// (block 0 writes them all).
// Returns where vec is among the vectors in shared memory.
// X_Q8: the instance takes x_q8 (not the SwiGLU one: its code there made ptxas spill 72 bytes).
// IMAGE: the instance takes x_q8 only (the SwiGLU launches handed an image: an instance of their
// own, so that the plain SwiGLU one keeps its registers).
template <bool TRACE, bool X_Q8, bool IMAGE = false>
static __device__ int exact_prologue(const exact_params & p, int vec, uint8_t * smem, const float * own_x) {
    if (IMAGE || (X_Q8 && p.x_q8 != nullptr)) {
        // The image lies as the prologue would write it (one vector: xq, then xm at smem_xm = k):
        // one 16-byte load a thread, from L2 (the kernel before wrote it).
        const int4 * image = (const int4 *) p.x_q8;
        const int    n_q   = p.k / 16, n_units = frt_x_q8_bytes(p.k) / 16;
        for (int u = threadIdx.x; u < n_units; u += kExactThreads) {
            const int4 v = __ldcg(image + u);
            if (u < n_q) {
                ((int4 *) smem)[u] = v;
            } else {
                ((int4 *) (smem + p.smem_xm))[u - n_q] = v;
            }
        }
        exact_trace_mark<TRACE>(kMarkNormed);
        __syncthreads();
        frt_pdl_launch_dependents();
        return 0;
    }
    const bool       all   = p.x_out != nullptr;
    const int        first = all ? 0 : vec, n = all ? p.n_vec : 1;
    const float *    x     = own_x != nullptr ? own_x : p.x + (int64_t) first * p.x_stride;
    __shared__ float norm_scales[FRT_GEMV_MAX_TOKENS];
    if (p.norm != nullptr) {
        exact_norm_scales(x, p.x_stride, n, p.k, p.eps, norm_scales);
    }
    exact_trace_mark<TRACE>(kMarkNormed);
    const gemv_x_in in = { x,        p.norm,   p.x_stride, p.eps, p.k, n, p.need_q8, p.need_f32,
                           blockIdx.x == 0 ? p.x_out : nullptr, p.x_out_stride, norm_scales };
    gemv_prologue_x<kExactThreads>(in, (int8_t *) smem, (uint2 *) (smem + p.smem_xm), (float *) (smem + p.smem_xf),
                                   threadIdx.x, 0);
    __syncthreads();
    frt_pdl_launch_dependents();
    return vec - first;
}

// Bytes [from, to) of `total` that part `part` of `parts` takes: shares of 16-byte multiples.
static __device__ __forceinline__ void exact_share(int64_t total, int parts, int part, int64_t & from, int64_t & to) {
    const int64_t share = (total / parts + 15) / 16 * 16;
    from                = (int64_t) part * share;
    to                  = min(total, from + share);
}

// Bytes [src, src + bytes) into L2 (16-byte aligned, a multiple of 16), in bulk prefetches of at
// most 1 MB (the size operand is 32-bit).
static __device__ __forceinline__ void exact_prefetch_l2(const uint8_t * src, int64_t bytes) {
    for (int64_t at = 0; at < bytes; at += 1 << 20) {
        const uint32_t size = (uint32_t) min(bytes - at, (int64_t) 1 << 20);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src + at), "r"(size) : "memory");
    }
}

// The block's share of the launch's prefetch ranges (frt_gemv_args::prefetch) into L2: the ranges
// end to end, split over the blocks, thread 0 prefetching what its share covers of each. After the
// wait, so that these reads queue behind the block's own copies.
static __device__ __forceinline__ void exact_prefetch_later(const exact_params & p) {
    if (p.prefetch.n == 0 || threadIdx.x != 0) {
        return;
    }
    int64_t total = 0;
    for (int i = 0; i < p.prefetch.n; ++i) {
        total += p.prefetch.bytes[i];
    }
    int64_t from, to;
    exact_share(total, gridDim.x, blockIdx.x, from, to);
    int64_t at = 0;  // where range i starts, end to end
    for (int i = 0; i < p.prefetch.n && at < to; at += p.prefetch.bytes[i], ++i) {
        const int64_t lo = max(from, at), hi = min(to, at + p.prefetch.bytes[i]);
        if (lo < hi) {
            exact_prefetch_l2((const uint8_t *) p.prefetch.ptr[i] + (lo - at), hi - lo);
        }
    }
}

// Chunk `local`'s share of the selected experts' prefetch (frt_gemv_prefetch::experts), for the
// chunks of an expert segment, whose blocks know the selection (`routed`): the n_used experts'
// expert_bytes end to end, split over the segment's chunks.
static __device__ __forceinline__ void exact_prefetch_experts(const exact_params & p, const exact_seg & s, int local,
                                                              const int * routed) {
    if (p.prefetch.experts == nullptr || threadIdx.x != 0) {
        return;
    }
    const int64_t each = p.prefetch.expert_bytes;
    int64_t       from, to;
    exact_share((int64_t) p.route_n_used * each, p.route_n_used * s.chunks, local, from, to);
    for (int64_t at = from; at < to;) {  // at: in expert slot at / each
        const int64_t in = at % each, bytes = min(to - at, each - in);
        const int     e  = routed[at / each];
        if (e >= 0 && e < p.route_ept * 32) {
            exact_prefetch_l2((const uint8_t *) p.prefetch.experts + (int64_t) e * p.prefetch.expert_stride + in, bytes);
        }
        at += bytes;
    }
}

// Writes a row's value (plus its residual with FRT_GEMV_ADD; times silu of its gate row's value
// with FRT_GEMV_SWIGLU, as mmvq's fused GLU epilogue multiplies).
static __device__ __forceinline__ void exact_store(const exact_seg & s, int slot, int row, float v, float gate = 0.0f) {
    if (s.epilogue == FRT_GEMV_ADD) {
        v += s.residual[(int64_t) slot * s.residual_stride + row];
    } else if (s.epilogue == FRT_GEMV_SWIGLU) {
        v *= gate / (1.0f + expf(-gate));
    }
    s.out[(int64_t) slot * s.out_stride + row] = v;
}

// Copies `bytes` from global src into shared dst with cp.async, `unit` (16 or 4) bytes a copy,
// the block's threads in turn, with L2 policy `policy` when `hint`; gemv_cp_async_wait_all waits
// for them.
static __device__ __forceinline__ void exact_copy(uint8_t * dst, const uint8_t * src, int64_t bytes, int unit,
                                                  bool hint, uint64_t policy) {
    for (int64_t at = (int64_t) unit * threadIdx.x; at < bytes; at += (int64_t) unit * kExactThreads) {
        if (unit == 16) {
            if (hint) {
                gemv_cp_async16_hint(dst + at, src + at, policy);
            } else {
                gemv_cp_async16(dst + at, src + at, 16);
            }
        } else if (hint) {
            gemv_cp_async4_hint(dst + at, src + at, policy);
        } else {
            gemv_cp_async4(dst + at, src + at);
        }
    }
}

// How a block stages its rows: cp.async from every thread. The weights are read once a step, so
// their copies are marked evict-first in L2 (exact_params::evict_first; GGML_FLASHRT_EXACT_EVICT_FIRST=0:
// no hint): they then do not push out of L2 what the step reads again (measured: +8% decode).
// Every thread of the block makes the same calls.
struct exact_stager {
    bool     hint   = false;
    uint64_t policy = 0;

    __device__ __forceinline__ explicit exact_stager(bool evict_first) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // bulk_evict_first_policy's architectures
        hint = evict_first;
        if (evict_first) {
            policy = bulk_evict_first_policy();
        }
#else
        (void) evict_first;
#endif
    }

    __device__ __forceinline__ void copy(uint8_t * dst, const uint8_t * src, int64_t bytes, int unit) {
        exact_copy(dst, src, bytes, unit, hint, policy);
    }

    // Every copy this thread issued has landed (a barrier after it for the block).
    __device__ __forceinline__ void wait_all() { gemv_cp_async_wait_all(); }
};

// The matrix of slot `slot` (after the wait: expert ids come from an earlier kernel): adds its
// offset in the stacked tensor to `off` and returns true, or false for an expert id out of range
// (its rows are then NaN).
static __device__ __forceinline__ bool exact_matrix(const exact_seg & s, int slot, int64_t & off, const int * routed) {
    if (s.ids == nullptr) {
        return true;
    }
    const int expert = routed != nullptr ? routed[slot] : s.ids[slot];
    if (expert < 0 || expert >= s.n_experts) {
        return false;
    }
    off += (int64_t) expert * s.expert_stride;
    return true;
}

// Waits for the previous kernel and stages the block's rows with `copy` (issuing their cp.async
// copies from s.w + off): dense rows before the wait (no kernel writes weights), so that their
// latency overlaps that kernel's tail; expert rows after it, once their matrix is known
// (exact_matrix, which moves `off` to it). Returns whether the slot has a matrix. A launch that
// routes selects the experts here, in the blocks of expert segments and in block 0 (which writes
// the selection out); with chunks from a counter, in every block (a later chunk may be an
// expert's).
//
// A launch that guesses (guess_logits) stages its expert rows before the wait too: the experts
// are selected from the router's logits, written two or more kernels back. The ids the graph holds
// decide after the wait; rows staged for another expert (logits overwritten meanwhile, a top-k of
// other bits) are copied again, once this thread's copies in flight have landed.
// GUESS: the instance has the guessing path (not the SwiGLU gate/up's, which routes in its launch
// and spills with it).
template <bool STAGED, bool GUESS, bool TRACE, typename STAGER, typename COPY>
static __device__ __forceinline__ bool exact_wait_and_stage(const exact_params & p, const exact_seg & s, int local,
                                                            int slot, int64_t & off, STAGER & stager, COPY copy) {
    int * routed = exact_routed();
    if (STAGED && s.ids == nullptr) {
        copy();
    } else if (STAGED && GUESS && p.guess_logits != nullptr) {
        const int64_t base = off;
        exact_route(p, p.guess_logits, false, routed);
        const bool    guessed     = exact_matrix(s, slot, off, routed);
        const int64_t guessed_off = off;
        if (guessed) {
            copy();
        }
        frt_pdl_wait();
        exact_trace_mark<TRACE>(kMarkWaited);
        off              = base;
        const bool valid = exact_matrix(s, slot, off, nullptr);
        if (valid && !(guessed && off == guessed_off)) {
            stager.wait_all();
            copy();
        }
        return valid;
    }
    frt_pdl_wait();
    exact_trace_mark<TRACE>(kMarkWaited);
    const bool route =
        p.route_logits != nullptr && (s.ids != nullptr || blockIdx.x == 0 || p.chunk_counter != nullptr);
    if (route) {
        exact_route(p, p.route_logits, blockIdx.x == 0, routed);
    }
    const bool valid = exact_matrix(s, slot, off, route ? routed : nullptr);
    if (STAGED && valid && s.ids != nullptr) {
        copy();
    }
    if (route && s.ids != nullptr) {  // behind this block's own copies
        exact_prefetch_experts(p, s, local, routed);
    }
    return valid;
}

// The block's rows [row0, row0 + n) summed and stored, from their partial sums `part` ([row][stock
// warp][lane]; with GLU the gate rows' from row gpart on): for each row, warp 0's lanes plus warps
// 1, 2, 3 (zeros where a row has fewer threads, added as stock adds them), then the butterfly over
// the lanes. A warp a row, or, in a block of at least scatter_rows rows, 4 rows a warp by
// reduce-scatter (frt_warp_sum_rows: the same bits, 6 shuffles for 4 rows instead of 20; 8 rows a
// warp made ptxas spill). Measured in decode (H100 trace): the reduce-scatter shortens the store
// phase of blocks of 36-70 rows (INPROJ, ATTNQKV, the experts' down: -0.4 to -0.55 µs) and
// lengthens it slightly where a block has 8-20 (ssm_out, attn_output, the SwiGLU gate/up: +0.1 to
// +0.2 µs: 16 warps a row each are then more parallel than 2-5 warps of 4 rows). Not inlined: in
// the kernel's body it made ptxas spill in the products' loop.
template <bool GLU>
static __device__ __noinline__ void exact_sum_rows(const exact_params & p, const exact_seg & s, int slot, int row0,
                                                      int n, bool valid, int per_row, const float * part, int gpart) {
    const int   lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float nan  = __int_as_float(0x7fffffff);  // no matrix: NaN, visibly
    const auto  lanes = [&](int j) {
        float v = part[(j * 4) * 32 + lane];
#pragma unroll
        for (int sw = 1; sw < 4; ++sw) {
            v += 32 * sw < per_row ? part[(j * 4 + sw) * 32 + lane] : 0.0f;
        }
        return v;
    };
    if (p.scatter_rows == 0 || n < p.scatter_rows) {
        for (int j = warp; j < n; j += kExactThreads / 32) {
            const float v    = valid ? frt_warp_sum(lanes(j)) : nan;
            float       gate = 0.0f;
            if constexpr (GLU) {
                gate = valid ? frt_warp_sum(lanes(gpart + j)) : nan;
            }
            if (lane == 0) {
                exact_store(s, slot, row0 + j, v, gate);
            }
        }
        return;
    }
    constexpr int R = 4;  // rows a warp; lanes 8i to 8i + 7 end with row i
    for (int j0 = warp * R; j0 < n; j0 += kExactThreads / 32 * R) {
        float v = nan, gate = 0.0f;
        if (valid) {
            float rows[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                rows[r] = j0 + r < n ? lanes(j0 + r) : 0.0f;
            }
            v = frt_warp_sum_rows<R>(rows);
            if constexpr (GLU) {
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    rows[r] = j0 + r < n ? lanes(gpart + j0 + r) : 0.0f;
                }
                gate = frt_warp_sum_rows<R>(rows);
            }
        } else if (GLU) {
            gate = nan;
        }
        const int j = j0 + lane / (32 / R);
        if (lane % (32 / R) == 0 && j < n) {
            exact_store(s, slot, row0 + j, v, gate);
        }
    }
}

// One row of the MoE tail (frt_gemv_args::tail), from other blocks' rows: through L2 (ld.cg), not
// this SM's L1.
static __device__ __forceinline__ void exact_tail_row(const exact_params & p, int r) {
    const exact_seg & e = p.seg[p.tail.experts_seg];
    const exact_seg & d = p.seg[p.tail.shexp_seg];
    p.tail.out[r] = frt_moe_tail_value([&](int k) { return __ldcg(e.out + (int64_t) k * e.out_stride + r); },
                                       p.tail.weights, p.tail_n_used, __ldcg(p.tail.gate), __ldcg(d.out + r),
                                       __ldcg(p.tail.residual + r));
}

// The MoE tail for a block that stored rows [row0, row0 + n) (row0 a multiple of the group size)
// of one of its segments. By groups of rows: the block counts each group it stored; the count that
// completes a group (n_used slots and the shared expert) makes this block compute the group's rows,
// which every other block has stored by then. Release and acquire as a grid barrier does them
// (a barrier, then one thread's fence and atomic); nothing spins, so the launch needs no
// co-residency.
static __device__ void exact_tail(const exact_params & p, int row0, int n) {
    constexpr int group = FRT_GEMV_TAIL_ROWS_A_COUNTER;
    __shared__ int owned[kExactWaveRows / group];
    __shared__ int n_owned;
    if (threadIdx.x == 0) {
        n_owned = 0;
    }
    __syncthreads();  // the block's rows are stored, n_owned is zero
    const int groups = (n + group - 1) / group;
    if ((int) threadIdx.x < groups) {
        const int g = row0 / group + (int) threadIdx.x;
        __threadfence();
        if (atomicAdd(p.tail.counters + g, 1u) == (unsigned) p.tail_n_used) {  // the n_used + 1th arrival
            p.tail.counters[g] = 0;                                              // for the next launch
            __threadfence();
            owned[atomicAdd(&n_owned, 1)] = g;
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < group * n_owned; t += kExactThreads) {
        const int r = owned[t / group] * group + t % group;
        if (r < p.tail_rows) {
            exact_tail_row(p, r);
        }
    }
}

// Chunk `id`: rows [row0, row0 + n) of segment si's matrix in slot `slot`; local: its index among
// the segment's chunks (slot-major).
struct exact_chunk {
    int si, local, slot, row0, n;
};

static __device__ __forceinline__ exact_chunk exact_chunk_of(const exact_params & p, int id) {
    int si = 0;
    while (si + 1 < p.n_segments && id >= p.seg[si + 1].block_begin) {
        ++si;
    }
    const exact_seg & s = p.seg[si];
    exact_chunk       c;
    c.si    = si;
    c.local = id - s.block_begin;
    c.slot  = c.local / s.chunks;
    c.row0  = c.local % s.chunks * s.chunk_rows;
    c.n     = min(s.chunk_rows, s.rows - c.row0);
    return c;
}

// The chunk's rows as the products and the stores use them: its matrix (after the wait; false for
// an expert id out of range) and where its rows start in s.w (or in the stage buffer).
struct exact_chunk_rows {
    exact_chunk       c;
    const exact_seg * s;
    int64_t           off;
    bool              valid;
};

static __device__ __forceinline__ exact_chunk_rows exact_rows_of(const exact_params & p, int id) {
    exact_chunk_rows r;
    r.c     = exact_chunk_of(p, id);
    r.s     = &p.seg[r.c.si];
    r.off   = (int64_t) r.c.row0 * r.s->row_stride;
    r.valid = exact_matrix(*r.s, r.c.slot, r.off, p.route_logits != nullptr ? exact_routed() : nullptr);
    return r;
}

// The block's rows [row0, row0 + n) of a quantized matrix (slot `slot`). STAGED: the rows are
// contiguous bytes that the block copies into shared memory in one go (exact_wait_and_stage), so
// that their latency overlaps the previous kernel's tail and the prologue; otherwise each item is
// read from global memory where it is used. IMAGE: x is the launch's x_q8 (exact_prologue).
// One stock thread's share of a row's sum (thread ts of a row's per_row): x's words for its first
// two passes read once and kept for every row (k <= 4096 at Q4_K, 2048 at Q6_K/Q8_0); later passes
// read them again a row. `valid`: a block without rows reads no x.
template <int TYPE> struct exact_row_summer {
    using item = exact_item<TYPE>;
    const int8_t *     xq;
    const uint2 *      xm;
    int                n_items, passes, ts, iqs;
    bool               has0, has1;
    typename item::x_t x0, x1;

    __device__ __forceinline__ exact_row_summer(const int8_t * xq, const uint2 * xm, int n_items, int ts, bool valid) :
        xq(xq),
        xm(xm),
        n_items(n_items),
        passes((n_items + kStockThreads - 1) / kStockThreads),
        ts(ts),
        iqs(item::iqs(ts)),  // the same at every pass (128 is a multiple of per_block)
        has0(valid && ts < n_items),
        has1(valid && ts + kStockThreads < n_items) {
        if (has0) {
            x0 = item::load_x(xq, xm, ts / item::per_block, iqs);
        }
        if (has1) {
            x1 = item::load_x(xq, xm, (ts + kStockThreads) / item::per_block, iqs);
        }
    }

    // The sum as stock's thread ts adds it: items ts, ts + 128, ... in order.
    __device__ __forceinline__ float operator()(const uint8_t * row) const {
        float acc = 0.0f;
        if (has0) {
            acc += item::dot(item::load(row, ts / item::per_block, iqs), x0, iqs);
        }
        if (has1) {
            acc += item::dot(item::load(row, (ts + kStockThreads) / item::per_block, iqs), x1, iqs);
        }
        for (int m = 2; m < passes; ++m) {
            const int it = ts + kStockThreads * m;
            if (it >= n_items) {
                break;
            }
            const int kbx = it / item::per_block;
            acc += item::dot(item::load(row, kbx, iqs), item::load_x(xq, xm, kbx, iqs), iqs);
        }
        return acc;
    }
};

template <int TYPE, bool STAGED, bool GLU, bool TRACE, bool IMAGE>
static __device__ void exact_rows(const exact_params & p, const exact_seg & s, int local, int slot, int row0, int n,
                                  int vec, uint8_t * smem) {
    using item        = exact_item<TYPE>;
    const int n_items = p.k / item::qk * item::per_block;
    const int per_row = n_items <= 32 ? 32 : n_items <= 64 ? 64 : 128;  // threads a row
    const int together = kExactThreads / per_row;                        // rows side by side
    const int tid = threadIdx.x, lane = tid % 32;
    const int sub = tid / per_row, ts = tid % per_row;                   // ts: stock's thread
    uint8_t * stage  = smem + p.smem_stage;

    // With FRT_GEMV_SWIGLU the gate matrix's same rows too, staged after them; their sums go to
    // the partial sums' second half.
    constexpr bool glu  = GLU;  // the launch's segments all have FRT_GEMV_SWIGLU
    const int64_t bytes = (int64_t) n * s.row_stride;
    int64_t       off   = (int64_t) row0 * s.row_stride;  // of the block's first row in s.w (and s.w_gate)
    exact_trace_start<TRACE>();
    exact_stager stager(p.evict_first != 0);
    const bool    valid = exact_wait_and_stage<STAGED, !GLU, TRACE>(p, s, local, slot, off, stager, [&]() {
        stager.copy(stage, s.w + off, bytes, s.stage_unit);
        if constexpr (glu) {
            stager.copy(stage + bytes, s.w_gate + off, bytes, s.stage_unit);
        }
    });
    exact_trace_mark<TRACE>(kMarkIssued);
    exact_prefetch_later(p);
    const int at = exact_prologue<TRACE, !GLU, IMAGE>(p, vec, smem, s.x);
    exact_trace_mark<TRACE>(kMarkPrologue);
    const int8_t * xq   = (const int8_t *) smem + (int64_t) at * p.k;
    const uint2 *  xm   = (const uint2 *) (smem + p.smem_xm) + (int64_t) at * (p.k / 32);
    float *        part = (float *) (smem + p.smem_part);  // [row][stock warp][lane]
    const uint8_t * rows  = STAGED ? stage : s.w + off;
    const uint8_t * grows = STAGED ? stage + bytes : glu ? s.w_gate + off : nullptr;
    const int       gpart = p.rows_per_block;  // the gate rows' partial sums start at this row

    {
        const exact_row_summer<TYPE> row_sum(xq, xm, n_items, ts, valid);
        if (STAGED) {
            stager.wait_all();
            __syncthreads();
        }
        exact_trace_mark<TRACE>(kMarkLanded);
        if (valid) {
            if constexpr (!glu) {
#pragma unroll 4
                for (int j = sub; j < n; j += together) {
                    part[(j * 4 + ts / 32) * 32 + lane] = row_sum(rows + (int64_t) j * s.row_stride);
                }
            } else {
                for (int j = sub; j < n; j += together) {
                    part[(j * 4 + ts / 32) * 32 + lane]           = row_sum(rows + (int64_t) j * s.row_stride);
                    part[((gpart + j) * 4 + ts / 32) * 32 + lane] = row_sum(grows + (int64_t) j * s.row_stride);
                }
            }
        }
    }
    __syncthreads();
    exact_trace_mark<TRACE>(kMarkProducts);
    exact_sum_rows<glu>(p, s, slot, row0, n, valid, per_row, part, gpart);
    exact_trace_end<TRACE>(p, s, glu);
}

// Issues the cp.async copies of chunk `id`'s rows (and its gate rows) into `stage`, after the
// wait: an expert's matrix is known then (from the launch's routing, else from the ids). Nothing
// for a slot without a matrix (exact_rows finds it again and stores NaN).
static __device__ __forceinline__ void exact_stage_chunk(const exact_params & p, int id, uint8_t * stage,
                                                         exact_stager & stager) {
    const exact_chunk_rows r = exact_rows_of(p, id);
    if (!r.valid) {
        return;
    }
    const int64_t bytes = (int64_t) r.c.n * r.s->row_stride;
    stager.copy(stage, r.s->w + r.off, bytes, r.s->stage_unit);
    if (r.s->epilogue == FRT_GEMV_SWIGLU) {
        stager.copy(stage + bytes, r.s->w_gate + r.off, bytes, r.s->stage_unit);
    }
    if (r.s->ids != nullptr && p.route_logits != nullptr) {  // behind the block's own copies
        exact_prefetch_experts(p, *r.s, r.c.local, exact_routed());
    }
}

// exact_rows for a launch whose blocks take chunks from counters (exact_params::chunk_counter):
// the block's chunk c of a quantized matrix (rows [row0, row0 + n) of segment si's matrix in slot
// `slot`), then any more chunks of the type that it takes from the type's counter. The first
// chunk's rows are staged in exact_wait_and_stage, each later chunk's into the other of two buffers
// while the block multiplies the chunk before. x is put in shared memory once, and its words for a
// thread's items read once, for every chunk. IMAGE: x is the launch's x_q8 (exact_prologue).
// Kernel instances of their own: the chunk loop cost the others registers (ptxas spilled in their
// products' loops).
template <int TYPE, bool GLU, bool TRACE, bool IMAGE>
static __device__ void exact_rows_chunked(const exact_params & p, exact_chunk c, int vec, uint8_t * smem) {
    using item        = exact_item<TYPE>;
    const int n_items = p.k / item::qk * item::per_block;
    const int per_row = n_items <= 32 ? 32 : n_items <= 64 ? 64 : 128;  // threads a row
    const int together = kExactThreads / per_row;                        // rows side by side
    const int tid = threadIdx.x, lane = tid % 32;
    const int sub = tid / per_row, ts = tid % per_row;                   // ts: stock's thread
    uint8_t * stage  = smem + p.smem_stage;

    // With FRT_GEMV_SWIGLU the gate matrix's same rows too, staged after them; their sums go to
    // the partial sums' second half.
    constexpr bool glu = GLU;  // the launch's segments all have FRT_GEMV_SWIGLU
    exact_trace_start<TRACE>();
    exact_stager stager(p.evict_first != 0);
    {
        const exact_seg & s     = p.seg[c.si];
        const int64_t     bytes = (int64_t) c.n * s.row_stride;
        int64_t           off   = (int64_t) c.row0 * s.row_stride;  // of the chunk's first row in s.w (and s.w_gate)
        exact_wait_and_stage<true, !GLU, TRACE>(p, s, c.local, c.slot, off, stager, [&]() {
            stager.copy(stage, s.w + off, bytes, s.stage_unit);
            if constexpr (glu) {
                stager.copy(stage + bytes, s.w_gate + off, bytes, s.stage_unit);
            }
        });
    }
    exact_trace_mark<TRACE>(kMarkIssued);
    exact_prefetch_later(p);
    // A barrier: the chunk claimed and the one staged are seen.
    const int at = exact_prologue<TRACE, !GLU, IMAGE>(p, vec, smem, p.seg[c.si].x);
    exact_trace_mark<TRACE>(kMarkPrologue);
    const int8_t * xq    = (const int8_t *) smem + (int64_t) at * p.k;
    const uint2 *  xm    = (const uint2 *) (smem + p.smem_xm) + (int64_t) at * (p.k / 32);
    float *        part  = (float *) (smem + p.smem_part);  // [row][stock warp][lane]
    const int      gpart = p.rows_per_block;  // the gate rows' partial sums start at this row

    const exact_row_summer<TYPE> row_sum(xq, xm, n_items, ts, true);
    for (int buffer = 0;; buffer ^= 1) {
        const bool more = exact_claimed() < p.n_chunks;  // read by every thread before the barrier
        if (more) {
            // This chunk's copies as one group, the next chunk's (into the other buffer, whose chunk
            // the barrier after the last products freed) as another: wait for the first.
            gemv_cp_async_commit();
            exact_stage_chunk(p, exact_claimed(), smem + p.smem_stage + (buffer ^ 1) * p.stage_buffer, stager);
            gemv_cp_async_commit();
            gemv_cp_async_wait_group<1>();
        } else {
            stager.wait_all();
        }
        __syncthreads();
        if (more && threadIdx.x == 0) {  // seen after the products' barrier
            exact_staged()[buffer ^ 1] = exact_claimed();
            exact_claimed()            = exact_claim(p, TYPE);
        }
        exact_trace_mark<TRACE>(kMarkLanded);
        {
            const exact_chunk_rows r     = exact_rows_of(p, exact_staged()[buffer]);
            const uint8_t *        stage = smem + p.smem_stage + buffer * p.stage_buffer;
            const int64_t          bytes = (int64_t) r.c.n * r.s->row_stride;
            if (r.valid) {
                if constexpr (!glu) {
#pragma unroll 4
                    for (int j = sub; j < r.c.n; j += together) {
                        part[(j * 4 + ts / 32) * 32 + lane] = row_sum(stage + (int64_t) j * r.s->row_stride);
                    }
                } else {  // the gate rows after the up rows
                    for (int j = sub; j < r.c.n; j += together) {
                        part[(j * 4 + ts / 32) * 32 + lane]           = row_sum(stage + (int64_t) j * r.s->row_stride);
                        part[((gpart + j) * 4 + ts / 32) * 32 + lane] = row_sum(stage + bytes + (int64_t) j * r.s->row_stride);
                    }
                }
            }
        }
        __syncthreads();
        exact_trace_mark<TRACE>(kMarkProducts);
        {
            const exact_chunk_rows r = exact_rows_of(p, exact_staged()[buffer]);
            exact_sum_rows<glu>(p, *r.s, r.c.slot, r.c.row0, r.c.n, r.valid, per_row, part, gpart);
        }
        if (!more) {
            break;
        }
    }
    exact_trace_end<TRACE>(p, p.seg[exact_chunk_of(p, exact_first_chunk(p)).si], glu);
}

// The block's rows [row0, row0 + n) of an F32 matrix: one warp a row. STAGED as for the quantized
// rows: a warp's row in global memory takes one load latency per pass of mmvf's loop (4 at k =
// 2048), which set the router pack's time; copied before the wait, the latency overlaps the
// previous kernel and the prologue.
template <bool STAGED, bool TRACE>
static __device__ void exact_rows_f32(const exact_params & p, const exact_seg & s, int local, int slot, int row0, int n,
                                      int vec, uint8_t * smem) {
    uint8_t *     stage = smem + p.smem_stage;
    int64_t       off   = (int64_t) row0 * s.row_stride;  // of the block's first row in s.w
    const int64_t bytes = (int64_t) (n - 1) * s.row_stride + (int64_t) p.k * (int64_t) sizeof(float);  // not past the last row
    exact_trace_start<TRACE>();
    exact_stager stager(p.evict_first != 0);
    const bool    valid = exact_wait_and_stage<STAGED, false, TRACE>(p, s, local, slot, off, stager, [&]() {
        stager.copy(stage, s.w + off, bytes, s.stage_unit);
    });
    exact_trace_mark<TRACE>(kMarkIssued);
    exact_prefetch_later(p);
    const int at = exact_prologue<TRACE, false>(p, vec, smem, s.x);
    exact_trace_mark<TRACE>(kMarkPrologue);
    const float * xf   = (const float *) (smem + p.smem_xf) + (int64_t) at * p.k;
    const int     lane = threadIdx.x % 32;
    if (STAGED) {
        stager.wait_all();
        __syncthreads();
    }
    exact_trace_mark<TRACE>(kMarkLanded);
    const uint8_t * rows = STAGED ? stage : s.w + off;
    for (int j = threadIdx.x / 32; j < n; j += kExactThreads / 32) {
        const float v = valid ? exact_row_f32((const float *) (rows + (int64_t) j * s.row_stride), p.k, xf, p.f32_block, lane)
                              : __int_as_float(0x7fffffff);
        if (lane == 0) {
            exact_store(s, slot, row0 + j, v);
        }
    }
    exact_trace_mark<TRACE>(kMarkProducts);  // products and stores go row by row here
    exact_trace_end<TRACE>(p, s, false);
}

// GLU: every segment has the FRT_GEMV_SWIGLU epilogue (its own instance: the gate rows' registers
// would make the plain one spill). TAIL: the launch computes an MoE tail (frt_gemv_args::tail; its
// own instance too: the tail's code made ptxas spill in the plain one). IMAGE (with GLU): x is the
// launch's x_q8. CHUNKS: the blocks take chunks from counters (exact_rows_chunked; quantized
// staged rows only), else a block a chunk.
template <bool GLU, bool TAIL = false, bool TRACE = false, bool IMAGE = false, bool CHUNKS = false>
__launch_bounds__(kExactThreads, kExactBlocksPerSm) static __global__ void frt_gemv_exact_kernel(
    const __grid_constant__ exact_params p) {
    extern __shared__ __align__(16) uint8_t smem[];
    static_assert(!(CHUNKS && TAIL), "a tail launch takes a chunk a block (gemv-exact.cu)");
    if constexpr (CHUNKS) {
        const int         id = exact_first_chunk(p);
        const exact_chunk c  = exact_chunk_of(p, id);
        const int         type = p.seg[c.si].type;
        if (threadIdx.x == 0) {  // the block's second chunk, claimed before the wait (seen after the prologue)
            exact_staged()[0] = id;
            exact_claimed()   = exact_claim(p, type);
        }
        switch (type) {  // quantized rows only
            case FRT_GEMV_Q4_K: exact_rows_chunked<FRT_GEMV_Q4_K, GLU, TRACE, IMAGE>(p, c, 0, smem); break;
            case FRT_GEMV_Q6_K: exact_rows_chunked<FRT_GEMV_Q6_K, GLU, TRACE, IMAGE>(p, c, 0, smem); break;
            default:            exact_rows_chunked<FRT_GEMV_Q8_0, GLU, TRACE, IMAGE>(p, c, 0, smem); break;
        }
        exact_chunks_done(p);
        return;
    }
    int si = 0;
    while (si + 1 < p.n_segments && (int) blockIdx.x >= p.seg[si + 1].block_begin) {
        ++si;
    }
    const exact_seg & s     = p.seg[si];
    const int         local = blockIdx.x - s.block_begin;
    const int         slot = local / s.chunks, row0 = local % s.chunks * s.chunk_rows;
    const int         n    = min(s.chunk_rows, s.rows - row0);
    const int         vec  = s.ids != nullptr && p.n_vec > 1 ? slot : 0;
    switch (s.type) {
        case FRT_GEMV_Q4_K:
            s.stage_unit ? exact_rows<FRT_GEMV_Q4_K, true, GLU, TRACE, IMAGE>(p, s, local, slot, row0, n, vec, smem)
                         : exact_rows<FRT_GEMV_Q4_K, false, GLU, TRACE, IMAGE>(p, s, local, slot, row0, n, vec, smem);
            break;
        case FRT_GEMV_Q6_K:
            s.stage_unit ? exact_rows<FRT_GEMV_Q6_K, true, GLU, TRACE, IMAGE>(p, s, local, slot, row0, n, vec, smem)
                         : exact_rows<FRT_GEMV_Q6_K, false, GLU, TRACE, IMAGE>(p, s, local, slot, row0, n, vec, smem);
            break;
        case FRT_GEMV_Q8_0:
            s.stage_unit ? exact_rows<FRT_GEMV_Q8_0, true, GLU, TRACE, IMAGE>(p, s, local, slot, row0, n, vec, smem)
                         : exact_rows<FRT_GEMV_Q8_0, false, GLU, TRACE, IMAGE>(p, s, local, slot, row0, n, vec, smem);
            break;
        default:
            s.stage_unit ? exact_rows_f32<true, TRACE>(p, s, local, slot, row0, n, vec, smem)
                         : exact_rows_f32<false, TRACE>(p, s, local, slot, row0, n, vec, smem);
            break;
    }
    if (TAIL) {  // a tail launch's two segments are the tail's
        exact_tail(p, row0, n);
    }
}

// One instance of the kernel, with the shared memory it may use.
template <auto KERNEL>
static cudaError_t exact_launch(int device, int blocks, int smem, cudaStream_t stream, const exact_params & p) {
    const cudaError_t err = frt_allow_smem<KERNEL>(device, kMaxSmem);
    return err != cudaSuccess ? err : frt_launch(KERNEL, dim3(blocks), dim3(kExactThreads), (size_t) smem, stream, p);
}
