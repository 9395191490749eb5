// The head kernel (FRT_GEMV_KERNEL_HEAD): one token, one dense repacked Q6_K matrix of many rows
// (an LM head: qwen36's 248320 x 2048, 417 MB), k = 2048 or 4096.
//
// Why a kernel of its own: the LM head is the one launch of a decode step that is long enough to
// be bandwidth-bound, and the register kernel reads it at 2.4-2.5 TB/s of the H200's 4.38
// (gemv-bench: 167 us against a 95 us floor). It loads a warp's items, then multiplies them with x
// read back from shared memory item by item, so each warp alternates between waiting for its loads
// and computing, with x's shared loads beside the weights' in the LSU's queue.
//
// Here every lane always takes the same items of every row (two items of each 2048 columns: block
// b = lane / 4 + 8m, the item pair {q, q + 2} sharing one qh word), so its x words (int8 runs,
// scales, run sums) are read from shared memory once and then stay in registers. A warp takes a row
// at a time and loads its next row's words into a second set of registers before it multiplies the
// current one, so its loads stay in flight while it computes (and the first row's loads are issued
// before the wait for the previous kernel: weights are not written by kernels).
// Grid: blocks of 256 threads, as many as the SMs hold at once; warps take rows in turn.
//
// Numerics: x is rounded to int8 as stock's quantize_q8_1 rounds it (gemv_prologue_x), each item's
// two runs of 16 are integer dot products, then float; a row's lanes are added in a butterfly. Not
// stock's order (the LM head's logits are amplified by nothing; test-gemv bounds the float
// rounding against a float64 sum of the same int8 x).

#include "bulk-copy.cuh"
#include "gemv-impl.cuh"
#include "pdl.cuh"

static constexpr int kHeadThreads = 256;
static constexpr int kHeadWarps   = kHeadThreads / 32;

struct head_params {
    const uint8_t * w;
    int64_t         row_stride;
    int             rows;
    float *         out;
    const float *   residual;  // FRT_GEMV_ADD, else nullptr
    gemv_x_in       x;         // the input (normed, quantized) as the other kernels take it
    int             smem_xm;   // where x's per-32 scales and sums start in shared memory
};

// One lane's words of one Q6_K_R block: the ql words of items q and q + 2, their common qh word,
// the two items' scale pairs, the block's d.
struct head_words {
    uint4    ql0, ql1, qh;
    uint32_t sc0, sc1, d;
};

// The x an item multiplies: its two runs of 16 int8 values, each run's float scale, and 32 times
// each run's sum (the Q6_K values are stored plus 32).
struct head_x {
    int4  a, b;
    float fa, fb;
    int   oa, ob;
};

// Item q of block b: (block, item) of lane `lane`'s pair m, q0 in {0, 1, 4, 5} (q0 and q0 + 2
// share a qh word: qh bytes 32 (q0 / 4) + 16 (q0 % 2) hold the high bits of both).
static __device__ __forceinline__ int head_q0(int lane) {
    const int p = lane % 4;
    return (p & 1) + 4 * (p >> 1);
}

// EVICT_FIRST: the loads marked evict-first in L2 (`policy`), so that the head's 417 MB do not
// push out of L2 what the next step reads again (GGML_FLASHRT_HEAD_EVICT_FIRST=1, an experiment).
template <bool EVICT_FIRST>
static __device__ __forceinline__ head_words head_load(const uint8_t * row, int b, int q0, int nb, uint64_t policy) {
    const uint8_t * blk = row + 208 * b;
    return { gemv_ldg16_as<EVICT_FIRST>(blk + 16 * q0, policy), gemv_ldg16_as<EVICT_FIRST>(blk + 16 * (q0 + 2), policy),
             gemv_ldg16_as<EVICT_FIRST>(blk + 128 + 16 * (2 * (q0 >> 2) + (q0 & 1)), policy),
             gemv_ldg_u16_as<EVICT_FIRST>(blk + 192 + 2 * q0, policy),
             gemv_ldg_u16_as<EVICT_FIRST>(blk + 192 + 2 * (q0 + 2), policy),
             gemv_ldg_u16_as<EVICT_FIRST>(row + 208 * nb + 2 * b, policy) };
}

static __device__ __forceinline__ head_x head_x_of(const int8_t * xq, const uint2 * xm, int b, int q) {
    int run_a = 0, run_b = 0;
    gemv_q6_runs(b, q, false, run_a, run_b);
    const uint2 ma = xm[run_a / 32], mb = xm[run_b / 32];
    const int   half = q & 1;
    return { *(const int4 *) (xq + run_a), *(const int4 *) (xq + run_b), __uint_as_float(ma.x),
             __uint_as_float(mb.x), 32 * gemv_run_sum(ma, half), 32 * gemv_run_sum(mb, half) };
}

// One item: values (ql nibble | 2 qh bits << 4) - 32, runs a (low nibbles) and b (high nibbles).
// HS: the qh bit pair of run a (0 for q % 4 < 2, 2 otherwise); run b's is HS + 4.
template <int HS>
static __device__ __forceinline__ float head_item(uint4 ql, uint4 qh, uint32_t sc, float d, const head_x & x) {
    uint4 wa, wb;
    wa.x = (ql.x & 0x0f0f0f0f) | (((qh.x >> HS) & 0x03030303) << 4);
    wa.y = (ql.y & 0x0f0f0f0f) | (((qh.y >> HS) & 0x03030303) << 4);
    wa.z = (ql.z & 0x0f0f0f0f) | (((qh.z >> HS) & 0x03030303) << 4);
    wa.w = (ql.w & 0x0f0f0f0f) | (((qh.w >> HS) & 0x03030303) << 4);
    wb.x = ((ql.x >> 4) & 0x0f0f0f0f) | (((qh.x >> (HS + 4)) & 0x03030303) << 4);
    wb.y = ((ql.y >> 4) & 0x0f0f0f0f) | (((qh.y >> (HS + 4)) & 0x03030303) << 4);
    wb.z = ((ql.z >> 4) & 0x0f0f0f0f) | (((qh.z >> (HS + 4)) & 0x03030303) << 4);
    wb.w = ((ql.w >> 4) & 0x0f0f0f0f) | (((qh.w >> (HS + 4)) & 0x03030303) << 4);
    const int da = gemv_dot16(wa, x.a, -x.oa), db = gemv_dot16(wb, x.b, -x.ob);
    return x.fa * (d * (float) (int8_t) (sc & 0xff)) * (float) da +
           x.fb * (d * (float) (int8_t) (sc >> 8)) * (float) db;
}

template <int NB8>
static __device__ __forceinline__ float head_row(const head_words (&w)[NB8], const head_x (&x)[NB8][2]) {
    float acc = 0.0f;
#pragma unroll
    for (int m = 0; m < NB8; ++m) {
        const float d = gemv_half(w[m].d);
        acc += head_item<0>(w[m].ql0, w[m].qh, w[m].sc0, d, x[m][0]);
        acc += head_item<2>(w[m].ql1, w[m].qh, w[m].sc1, d, x[m][1]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        acc += __shfl_xor_sync(kFull, acc, o);
    }
    return acc;
}

// NB8: k / 2048 (a lane's items a row: 2 NB8). BLOCKS: blocks an SM holds (the register bound).
template <int NB8, int BLOCKS, bool EVICT_FIRST>
__launch_bounds__(kHeadThreads, BLOCKS) static __global__ void frt_gemv_head_kernel(const __grid_constant__ head_params p) {
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x % 32, q0 = head_q0(lane);
    const int warps = gridDim.x * kHeadWarps, warp = blockIdx.x * kHeadWarps + threadIdx.x / 32;
    const int nb = 8 * NB8;

    const uint64_t policy = EVICT_FIRST ? bulk_evict_first_policy() : 0;
    head_words cur[NB8], nxt[NB8];
    const auto load = [&](head_words (&w)[NB8], int row) {
        const uint8_t * w_row = p.w + (int64_t) row * p.row_stride;
#pragma unroll
        for (int m = 0; m < NB8; ++m) {
            w[m] = head_load<EVICT_FIRST>(w_row, lane / 4 + 8 * m, q0, nb, policy);
        }
    };
    if (warp < p.rows) {
        load(cur, warp);
    }

    frt_pdl_wait();
    gemv_x_in in = p.x;
    in.x_out     = blockIdx.x == 0 ? in.x_out : nullptr;  // the normed copy: block 0's
    gemv_prologue_x<kHeadThreads>(in, (int8_t *) smem, (uint2 *) (smem + p.smem_xm), nullptr, threadIdx.x, 0);
    __syncthreads();
    frt_pdl_launch_dependents();

    head_x x[NB8][2];
#pragma unroll
    for (int m = 0; m < NB8; ++m) {
        const int b = lane / 4 + 8 * m;
        x[m][0]     = head_x_of((const int8_t *) smem, (const uint2 *) (smem + p.smem_xm), b, q0);
        x[m][1]     = head_x_of((const int8_t *) smem, (const uint2 *) (smem + p.smem_xm), b, q0 + 2);
    }

    const auto multiply = [&](const head_words (&w)[NB8], int row) {
        const float v = head_row<NB8>(w, x);
        if (lane == 0) {
            p.out[row] = p.residual != nullptr ? v + p.residual[row] : v;
        }
    };
    // Two register sets in turn: each row's words load while the one before is multiplied.
    for (int row = warp; row < p.rows; row += 2 * warps) {
        const int next = row + warps;
        if (next < p.rows) {
            load(nxt, next);
        }
        multiply(cur, row);
        if (next >= p.rows) {
            break;
        }
        if (next + warps < p.rows) {
            load(cur, next + warps);
        }
        multiply(nxt, next);
    }
}

template <int NB8, int BLOCKS>
static cudaError_t head_launch(const head_params & p, int sms, int smem, cudaStream_t stream) {
    static const bool evict_first = frt_env_flag("GGML_FLASHRT_HEAD_EVICT_FIRST", false);
    const int blocks = std::min(sms * BLOCKS, (p.rows + kHeadWarps - 1) / kHeadWarps);
    return evict_first ? frt_launch(frt_gemv_head_kernel<NB8, BLOCKS, true>, dim3(blocks), dim3(kHeadThreads),
                                    (size_t) smem, stream, p)
                       : frt_launch(frt_gemv_head_kernel<NB8, BLOCKS, false>, dim3(blocks), dim3(kHeadThreads),
                                    (size_t) smem, stream, p);
}

const char * frt_gemv_head_unsupported(const frt_gemv_args & a) {
    if (a.tokens != 1 || a.x_per_token != 1) {
        return "frt_gemv: the head kernel takes 1 token, one input vector";
    }
    if (a.n_segments != 1 || a.seg[0].type != FRT_GEMV_Q6_K_R || a.seg[0].ids != nullptr) {
        return "frt_gemv: the head kernel takes one dense FRT_GEMV_Q6_K_R matrix";
    }
    if (a.k != 2048 && a.k != 4096) {
        return "frt_gemv: the head kernel takes k = 2048 or 4096";
    }
    const frt_gemv_segment & s = a.seg[0];
    if (s.epilogue != FRT_GEMV_STORE && s.epilogue != FRT_GEMV_ADD) {
        return "frt_gemv: the head kernel stores or adds a residual";
    }
    if (s.rows < 1 || s.row_stride < frt_gemv_row_bytes(FRT_GEMV_Q6_K_R, a.k) || s.row_stride % 16 != 0 ||
        (uintptr_t) s.w % 16 != 0) {
        return "frt_gemv: the head kernel takes 16-byte aligned rows";
    }
    if ((uintptr_t) a.x % 16 != 0 || (a.norm != nullptr && (uintptr_t) a.norm % 16 != 0) ||
        (a.x_normed != nullptr && (uintptr_t) a.x_normed % 16 != 0)) {
        return "frt_gemv: x, the norm and the normed copy must be 16-byte aligned";
    }
    return nullptr;
}

cudaError_t frt_gemv_head_launch(const frt_gemv_args & a, cudaStream_t stream) {
    int         device = 0;
    gemv_device dev;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) {
        err = frt_gemv_device_info(device, dev);
    }
    if (err != cudaSuccess) {
        return err;
    }
    const frt_gemv_segment & s = a.seg[0];
    head_params              p = {};
    p.w                        = (const uint8_t *) s.w;
    p.row_stride               = s.row_stride;
    p.rows                     = s.rows;
    p.out                      = s.out;
    p.residual                 = s.epilogue == FRT_GEMV_ADD ? s.residual : nullptr;
    // Every block norms and quantizes x; block 0 also writes the normed copy the graph keeps.
    p.x       = { a.x, a.norm, a.x_stride, a.eps, a.k, 1, 1, 0, a.x_normed, a.x_normed_stride };
    p.smem_xm = a.k;
    const int smem = a.k + (a.k / 32) * (int) sizeof(uint2);
    // One row a batch, 3 blocks an SM (80 registers, no spills): gemv-bench on the H200 measured it
    // against 2 rows at 2 blocks (120 registers) and 1 row at 4 (64, spilling): 101.1, 102.3 and
    // 140.9 us for qwen36's head. k = 4096 holds twice the x words a lane: 2 blocks an SM.
    return a.k == 2048 ? head_launch<1, 3>(p, dev.sms, smem, stream) : head_launch<2, 2>(p, dev.sms, smem, stream);
}
