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
// t / per_block + per_iter * m, position t % per_block) and adds its dot products in that order
// from 0; warp 0 then adds warps 1, 2 and 3 lane by lane, in that order; then a butterfly over the
// 32 lanes (xor 16, 8, 4, 2, 1). Here one warp takes a row: lane l computes the sums of threads
// l, l + 32, l + 64 and l + 96 (4 accumulators, each in its own order), adds them as warp 0 does,
// and does the same butterfly. Each item's arithmetic repeats stock's vec_dot expression for
// expression (same operations, same contraction under -use_fast_math/-fmad).
//
// mmvf's order for F32 (ncols_dst = 1): a block of B threads (the smallest B of 32, 64, ... 256
// with the fewest passes over the k / 2 float pairs), thread t adding w * x of pairs t, t + B, ...
// (x then y of each pair, fused), a butterfly in each warp, then the B / 32 warp sums (zeros past
// them) in one more butterfly. Here lane l of the row's warp keeps threads l, l + 32, ... apart.

#include "gemv-impl.cuh"

// One segment as the kernel reads it: rows [row_begin, row_begin + slots x rows) of the launch's
// rows (slots: the experts a token, or 1).
struct exact_seg {
    const uint8_t * w;
    float *         out;
    const float *   residual;
    const int32_t * ids;
    int64_t         row_stride, out_stride, residual_stride, expert_stride;
    int             type, rows, epilogue, n_experts, row_begin;
};

struct exact_params {
    const float * x;
    const float * norm;
    int64_t       x_stride;
    float         eps;
    int           k, n_vec;
    float *       x_out;
    int64_t       x_out_stride;
    int           n_segments, total_rows, smem_xm, smem_xf;
    int           need_q8, need_f32;
    int           f32_block;  // mmvf's block size for k columns
    exact_seg     seg[FRT_GEMV_MAX_SEGMENTS];
};

static constexpr int kExactWarps   = 8;
static constexpr int kExactThreads = 32 * kExactWarps;

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

// A butterfly over the warp's 32 lanes, as ggml-cuda's warp_reduce_sum adds.
static __device__ __forceinline__ float exact_warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(kFull, v, offset);
    }
    return v;
}

// Scale and min (6 bits each) of sub-block j of a Q4_K block whose 12 scale bytes are at q.
static __device__ __forceinline__ void exact_k4_scale_min(const uint8_t * q, int j, int & sc, int & m) {
    if (j < 4) {
        sc = q[j] & 63;
        m  = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        m  = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// One mmvq item of each type: block kbx of the row, position iqs (stock's names), against x.
// per_block: threads a block; per_iter: blocks a pass of 128 threads moves on.
template <int TYPE> struct exact_item;

template <> struct exact_item<FRT_GEMV_Q4_K> {
    static constexpr int per_block = 16, per_iter = 8;
    static __device__ __forceinline__ int iqs(int t) { return 2 * (t % per_block); }
    static __device__ __forceinline__ float dot(const uint8_t * row, int kbx, int iqs, const int8_t * xq,
                                                const uint2 * xm) {
        const uint8_t * blk        = row + 144 * kbx;
        const int       bq8_offset = 2 * ((iqs / 2) / 4);
        const int       r          = (iqs / 2) % 4;
        const int *     q4         = (const int *) (blk + 16 + 16 * bq8_offset + 4 * r);
        const int       v0 = q4[0], v1 = q4[4];
        int             sc[2], m[2];
        exact_k4_scale_min(blk + 4, bq8_offset + 0, sc[0], m[0]);
        exact_k4_scale_min(blk + 4, bq8_offset + 1, sc[1], m[1]);
        float sumf_d = 0.0f;
        float sumf_m = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int   b    = 8 * kbx + bq8_offset + i;
            const float d8   = exact_xd(xm, b);
            const int   u0   = exact_xq(xq, b, r);
            const int   u1   = exact_xq(xq, b, r + 4);
            const int   v0i  = (v0 >> (4 * i)) & 0x0F0F0F0F;
            const int   v1i  = (v1 >> (4 * i)) & 0x0F0F0F0F;
            const int   dot1 = __dp4a(v1i, u1, __dp4a(v0i, u0, 0));
            const int   dot2 = __dp4a(0x01010101, u1, __dp4a(0x01010101, u0, 0));
            sumf_d += d8 * (dot1 * sc[i]);
            sumf_m += d8 * (dot2 * m[i]);
        }
        const float2 dm = __half22float2(*(const half2 *) blk);
        return dm.x * sumf_d - dm.y * sumf_m;
    }
};

template <> struct exact_item<FRT_GEMV_Q6_K> {
    static constexpr int per_block = 32, per_iter = 4;
    static __device__ __forceinline__ int iqs(int t) { return t % per_block; }
    static __device__ __forceinline__ float dot(const uint8_t * row, int kbx, int iqs, const int8_t * xq,
                                                const uint2 * xm) {
        const uint8_t * blk          = row + 210 * kbx;
        const int       bq8_offset   = 4 * (iqs / 16) + (iqs % 16) / 8;
        const int       scale_offset = 8 * (iqs / 16) + (iqs % 16) / 4;
        const int       vh_shift     = 2 * ((iqs % 16) / 8);
        const int       vl           = exact_int_b2(blk + 4 * iqs);
        const int       vh           = exact_int_b2(blk + 128 + 4 * (8 * (iqs / 16) + iqs % 8)) >> vh_shift;
        const int8_t *  scales       = (const int8_t *) (blk + 192) + scale_offset;
        float           sumf         = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int   sc  = scales[4 * i];
            const int   b   = 8 * kbx + bq8_offset + 2 * i;
            const int   u   = exact_xq(xq, b, iqs % 8);
            const float d8  = exact_xd(xm, b);
            const int   vil = (vl >> (4 * i)) & 0x0F0F0F0F;
            const int   vih = ((vh >> (4 * i)) << 4) & 0x30303030;
            const int   vi  = __vsub4((vil | vih), 0x20202020);
            sumf += d8 * (__dp4a(vi, u, 0) * sc);
        }
        const float d = __half2float(*(const half *) (blk + 208));
        return d * sumf;
    }
};

template <> struct exact_item<FRT_GEMV_Q8_0> {
    static constexpr int per_block = 4, per_iter = 32;
    static __device__ __forceinline__ int iqs(int t) { return 2 * (t % per_block); }
    static __device__ __forceinline__ float dot(const uint8_t * row, int kbx, int iqs, const int8_t * xq,
                                                const uint2 * xm) {
        const uint8_t * blk  = row + 34 * kbx;
        int             sumi = 0;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            sumi = __dp4a(exact_int_b2(blk + 2 + 4 * (iqs + i)), exact_xq(xq, kbx, iqs + i), sumi);
        }
        const float d8_0 = __half2float(*(const half *) blk);
        const float d8_1 = exact_xd(xm, kbx);
        return d8_0 * d8_1 * ((float) sumi);
    }
};

// A row of k columns, reduced as mmvq reduces it; every lane returns the row's value.
template <int TYPE>
static __device__ __forceinline__ float exact_row(const uint8_t * row, int k, const int8_t * xq, const uint2 * xm, int lane) {
    using item          = exact_item<TYPE>;
    constexpr int qk    = TYPE == FRT_GEMV_Q8_0 ? 32 : 256;
    const int     nb    = k / qk;
    float         part[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        part[w] = 0.0f;
    }
    // Pass m of every thread at once (its loads in flight together); each accumulator still adds
    // its own items in mmvq's order.
    for (int kb0 = 0; kb0 < nb; kb0 += item::per_iter) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const int t   = lane + 32 * w;
            const int kbx = kb0 + t / item::per_block;
            if (kbx < nb) {
                part[w] += item::dot(row, kbx, item::iqs(t), xq, xm);
            }
        }
    }
    float sum = part[0];
#pragma unroll
    for (int w = 1; w < 4; ++w) {
        sum += part[w];
    }
    return exact_warp_sum(sum);
}

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
            const float v = exact_warp_sum(acc[w]);
            mine          = lane == w ? v : mine;
            if (nw == 1) {
                return v;
            }
        }
    }
    return exact_warp_sum(mine);
}

// The RMS norm's scale of each input vector as ggml-cuda's fused rms_norm + mul computes it
// (rms_norm_f32 with do_multiply): a block of B = 1024 threads (256 below 1024 columns), thread t
// adding the squares of columns t, t + B, ... from 0, a butterfly in each warp, then the B / 32
// warp sums (zeros past them) in one more butterfly; mean = sum / k, scale = rsqrtf(mean + eps).
// The normed value, scale * x * w, is then formed by gemv_prologue_x as stock forms it.
static __device__ void exact_norm_scales(const exact_params & p, float * scales) {
    __shared__ float warp_sums[32];
    const int        warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int        block = p.k < 1024 ? 256 : 1024;
    for (int v = 0; v < p.n_vec; ++v) {
        const float * x = p.x + (int64_t) v * p.x_stride;
        for (int vw = warp; vw < block / 32; vw += kExactWarps) {
            float tmp = 0.0f;
            for (int col = 32 * vw + lane; col < p.k; col += block) {
                const float xi = x[col];
                tmp += xi * xi;
            }
            tmp = exact_warp_sum(tmp);
            if (lane == 0) {
                warp_sums[vw] = tmp;
            }
        }
        __syncthreads();
        const float sum   = exact_warp_sum(lane < block / 32 ? warp_sums[lane] : 0.0f);
        const float mean  = sum / p.k;
        const float scale = rsqrtf(mean + p.eps);
        if (threadIdx.x == 0) {
            scales[v] = scale;
        }
        __syncthreads();  // warp_sums is written again for the next vector; scales is read next
    }
}

// The segment holding row r of the launch.
static __device__ __forceinline__ const exact_seg & exact_segment_of(const exact_params & p, int r) {
    int si = 0;
    while (si + 1 < p.n_segments && r >= p.seg[si + 1].row_begin) {
        ++si;
    }
    return p.seg[si];
}

__launch_bounds__(kExactThreads, 4) static __global__ void frt_gemv_exact_kernel(const __grid_constant__ exact_params p) {
    extern __shared__ __align__(16) uint8_t smem[];
    int8_t *  xq   = (int8_t *) smem;
    uint2 *   xm   = (uint2 *) (smem + p.smem_xm);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // Before the wait for the previous kernel (weights are not written by kernels): the warp's
    // first row into L2, so that its latency overlaps that kernel's tail and the prologue. Expert
    // rows wait: their ids come from an earlier kernel.
    if (const int r0 = blockIdx.x * kExactWarps + warp; r0 < p.total_rows) {
        const exact_seg & s = exact_segment_of(p, r0);
        if (s.ids == nullptr) {
            const uint8_t * w = s.w + (int64_t) (r0 - s.row_begin) * s.row_stride;
            for (int64_t at = 128 * lane; at < s.row_stride; at += 32 * 128) {
                asm volatile("prefetch.global.L2 [%0];" ::"l"(w + at));
            }
        }
    }
    frt_pdl_wait();
    // x, normed first when the launch has a norm (the normed vectors, when kept, written by block 0
    // alone), then quantized as stock's quantize_q8_1 does.
    __shared__ float norm_scales[FRT_GEMV_MAX_TOKENS];
    if (p.norm != nullptr) {
        exact_norm_scales(p, norm_scales);
    }
    const gemv_x_in in = { p.x,      p.norm,   p.x_stride, p.eps, p.k, p.n_vec, p.need_q8, p.need_f32,
                           blockIdx.x == 0 ? p.x_out : nullptr, p.x_out_stride, norm_scales };
    float * xf = (float *) (smem + p.smem_xf);
    gemv_prologue_x<kExactThreads>(in, xq, xm, xf, threadIdx.x, 0);
    __syncthreads();
    frt_pdl_launch_dependents();

    const int k32 = p.k / 32;
    for (int r = blockIdx.x * kExactWarps + warp; r < p.total_rows; r += gridDim.x * kExactWarps) {
        const exact_seg & s    = exact_segment_of(p, r);
        const int         loc  = r - s.row_begin;
        const int         slot = loc / s.rows, row = loc % s.rows;
        const uint8_t *   w    = s.w + (int64_t) row * s.row_stride;
        int               vec  = 0;
        if (s.ids != nullptr) {
            const int expert = s.ids[slot];
            if (expert < 0 || expert >= s.n_experts) {
                if (lane == 0) {
                    s.out[slot * s.out_stride + row] = __int_as_float(0x7fffffff);  // no matrix: NaN, visibly
                }
                continue;
            }
            w += (int64_t) expert * s.expert_stride;
            vec = p.n_vec == 1 ? 0 : slot;
        }
        const int8_t * xv = xq + (int64_t) vec * p.k;
        const uint2 *  mv = xm + (int64_t) vec * k32;
        float          v;
        switch (s.type) {
            case FRT_GEMV_Q4_K: v = exact_row<FRT_GEMV_Q4_K>(w, p.k, xv, mv, lane); break;
            case FRT_GEMV_Q6_K: v = exact_row<FRT_GEMV_Q6_K>(w, p.k, xv, mv, lane); break;
            case FRT_GEMV_Q8_0: v = exact_row<FRT_GEMV_Q8_0>(w, p.k, xv, mv, lane); break;
            default:
                v = exact_row_f32((const float *) w, p.k, xf + (int64_t) vec * p.k, p.f32_block, lane);
                break;
        }
        if (lane == 0) {
            const int64_t at = (int64_t) slot * s.out_stride + row;
            if (s.epilogue == FRT_GEMV_ADD) {
                v += s.residual[(int64_t) slot * s.residual_stride + row];
            }
            s.out[at] = v;
        }
    }
}

int frt_gemv_exact_layout(const frt_gemv_args & a, int & smem_xm, int & smem_xf) {
    bool q8 = false, f32 = false;
    for (int i = 0; i < a.n_segments; ++i) {
        q8  = q8 || a.seg[i].type != FRT_GEMV_F32;
        f32 = f32 || a.seg[i].type == FRT_GEMV_F32;
    }
    // int8 x first, then a uint2 per 32 values, then (F32 weights) x in float.
    const int n_vec = a.tokens * a.x_per_token;
    smem_xm         = q8 ? n_vec * a.k : 0;
    smem_xf         = smem_xm + (q8 ? n_vec * (a.k / 32) * (int) sizeof(uint2) : 0);
    return smem_xf + (f32 ? n_vec * a.k * (int) sizeof(float) : 0);
}

cudaError_t frt_gemv_exact_launch(const frt_gemv_args & a, cudaStream_t stream) {
    int         device = 0;
    gemv_device dev;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) {
        err = frt_gemv_device_info(device, dev);
    }
    if (err != cudaSuccess) {
        return err;
    }
    exact_params p = {};
    p.x            = a.x;
    p.norm         = a.norm;
    p.x_stride     = a.x_stride;
    p.eps          = a.eps;
    p.k            = a.k;
    p.n_vec        = a.tokens * a.x_per_token;
    p.x_out        = a.x_normed;
    p.x_out_stride = a.x_normed_stride;
    p.n_segments   = a.n_segments;
    // mmvf's block: the smallest of 32, 64, ... 256 threads with the fewest passes over k / 2 pairs.
    p.f32_block    = 32;
    for (int block = 64, best = (a.k + 63) / 64; block <= 256; block += 32) {
        const int passes = (a.k + 2 * block - 1) / (2 * block);
        if (passes < best) {
            best        = passes;
            p.f32_block = block;
        }
    }
    int rows       = 0;
    for (int i = 0; i < a.n_segments; ++i) {
        const frt_gemv_segment & s = a.seg[i];
        exact_seg &              q = p.seg[i];
        q.w               = (const uint8_t *) s.w;
        q.out             = s.out;
        q.residual        = s.residual;
        q.ids             = s.ids;
        q.row_stride      = s.row_stride;
        q.out_stride      = s.ids != nullptr ? s.out_stride : 0;
        q.residual_stride = s.ids != nullptr ? s.residual_stride : 0;
        q.expert_stride   = s.expert_stride;
        q.type            = s.type;
        q.rows            = s.rows;
        q.epilogue        = s.epilogue;
        q.n_experts       = s.n_experts;
        q.row_begin       = rows;
        rows += (s.ids != nullptr ? s.n_used : 1) * s.rows;
    }
    p.total_rows = rows;
    const int smem = frt_gemv_exact_layout(a, p.smem_xm, p.smem_xf);
    p.need_q8      = p.smem_xf > 0;     // room for int8 x and its scales
    p.need_f32     = smem > p.smem_xf;  // room for x in float
    err = gemv_allow_smem<frt_gemv_exact_kernel>(device, kMaxSmem);
    if (err != cudaSuccess) {
        return err;
    }
    const int blocks = std::min((rows + kExactWarps - 1) / kExactWarps, dev.sms * 4);
    return frt_launch(frt_gemv_exact_kernel, dim3(blocks), dim3(kExactThreads), (size_t) smem, stream, p);
}
