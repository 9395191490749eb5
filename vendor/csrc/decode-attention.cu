#include "decode-attention.cuh"
#include "pdl.cuh"

#include <cmath>

constexpr int decode_threads = 256;
constexpr int decode_warps   = decode_threads / 32;
constexpr int decode_cells   = FRT_ATTN_DECODE_CELLS;  // one cell a lane in the scores

static __device__ __forceinline__ float decode_warp_max(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset, 32));
    }
    return x;
}

static __device__ __forceinline__ float decode_warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffff, x, offset, 32);
    }
    return x;
}

// Block (b, g): cells [32 b, 32 b + 32) of key/value head g, for every query token and every query
// head of g (a warp a pair at a time). K's rows are padded by 16 bytes in shared memory so that 32
// lanes reading 32 rows at one column hit distinct banks.
template <int D>
static __global__ void __launch_bounds__(decode_threads) frt_attn_decode_kernel(const frt_attn_decode_args a) {
    constexpr int E    = D / 32;  // output dims a lane
    constexpr int KPAD = D + 8;
    __shared__ __align__(16) __half k_s[decode_cells * KPAD];
    __shared__ __align__(16) __half v_s[decode_cells * D];
    __shared__ __align__(16) float  q_s[decode_warps][D];
    __shared__ bool                 last;

    const int b = blockIdx.x, g = blockIdx.y, n_blocks = gridDim.x;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int gqa = a.heads / a.heads_kv, pairs = gqa * a.n_q;
    const int c0 = b * decode_cells, n_cells = min(decode_cells, a.n_kv - c0);

    // Everything read here is written by earlier kernels (the cache rows of this step included).
    frt_pdl_wait();
    frt_pdl_launch_dependents();

    // K and V rows of the block's cells, 16 bytes a copy; cells past n_kv are zeros.
    constexpr int units = D / 8;
    for (int u = threadIdx.x; u < decode_cells * units; u += decode_threads) {
        const int c = u / units, x = u % units;
        uint4     kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
        if (c < n_cells) {
            kv = *(const uint4 *) (a.k + (int64_t) (c0 + c) * a.k_cell + (int64_t) g * a.k_head + 8 * x);
            vv = *(const uint4 *) (a.v + (int64_t) (c0 + c) * a.v_cell + (int64_t) g * a.v_head + 8 * x);
        }
        *(uint4 *) (k_s + c * KPAD + 8 * x) = kv;
        *(uint4 *) (v_s + c * D + 8 * x)    = vv;
    }
    __syncthreads();

    for (int p = warp; p < pairs; p += decode_warps) {
        const int t = p / gqa, h = g * gqa + p % gqa;
        const float * q = a.q + (int64_t) t * a.q_token + (int64_t) h * a.q_head;
        for (int i = lane; i < D; i += 32) {
            q_s[warp][i] = q[i];
        }
        __syncwarp();
        // Lane l: the score of cell c0 + l.
        float dot = 0.0f;
#pragma unroll 4
        for (int i = 0; i < D; i += 8) {
            const uint4    raw = *(const uint4 *) (k_s + lane * KPAD + i);
            const __half2 * k2 = (const __half2 *) &raw;
            const float4   qa  = *(const float4 *) (&q_s[warp][i]);
            const float4   qb  = *(const float4 *) (&q_s[warp][i + 4]);
            const float2   k0 = __half22float2(k2[0]), k1 = __half22float2(k2[1]);
            const float2   k2f = __half22float2(k2[2]), k3 = __half22float2(k2[3]);
            dot += qa.x * k0.x + qa.y * k0.y + qa.z * k1.x + qa.w * k1.y;
            dot += qb.x * k2f.x + qb.y * k2f.y + qb.z * k3.x + qb.w * k3.y;
        }
        // A hidden cell's score is -inf whatever its row holds (NaN * anything stays NaN).
        float s = -INFINITY;
        if (lane < n_cells) {
            const float mk = a.mask != nullptr ? __half2float(a.mask[(int64_t) t * a.mask_row + c0 + lane]) : 0.0f;
            s              = mk == -INFINITY ? -INFINITY : dot * a.scale + mk;
        }
        const float m   = decode_warp_max(s);
        const float e   = m == -INFINITY ? 0.0f : expf(s - m);
        const float sum = decode_warp_sum(e);
        float       o[E];
#pragma unroll
        for (int j = 0; j < E; ++j) {
            o[j] = 0.0f;
        }
        for (int c = 0; c < n_cells; ++c) {
            const float w = __shfl_sync(0xffffffff, e, c, 32);
            if (w == 0.0f) {
                continue;  // masked: its row may hold anything, even NaN
            }
#pragma unroll
            for (int j = 0; j < E; ++j) {
                o[j] += w * __half2float(v_s[c * D + lane * E + j]);
            }
        }
        if (n_blocks == 1) {
            float * out = a.out + (int64_t) t * a.out_token + (int64_t) h * a.out_head + lane * E;
#pragma unroll
            for (int j = 0; j < E; ++j) {
                out[j] = sum > 0.0f ? o[j] / sum : 0.0f;
            }
        } else {
            float * part = a.partial + (((int64_t) b * a.heads + h) * a.n_q + t) * (D + 2);
            if (lane == 0) {
                part[0] = m;
                part[1] = sum;
            }
#pragma unroll
            for (int j = 0; j < E; ++j) {
                part[2 + lane * E + j] = o[j];
            }
        }
        __syncwarp();  // q_s[warp] is rewritten by the next pair
    }
    if (n_blocks == 1) {
        return;
    }

    // The last block of head g to finish combines the partials of every block.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(&a.counters[g], 1u) == (unsigned) n_blocks - 1;
        if (last) {
            a.counters[g] = 0;  // every block of this launch has counted: ready for the next one
        }
    }
    __syncthreads();
    if (!last) {
        return;
    }
    __threadfence();
    for (int p = warp; p < pairs; p += decode_warps) {
        const int     t = p / gqa, h = g * gqa + p % gqa;
        const int64_t stride = (int64_t) a.heads * a.n_q * (D + 2);  // from one block's partials to the next
        const float * part0  = a.partial + ((int64_t) h * a.n_q + t) * (D + 2);
        float         m = -INFINITY;
        for (int i = lane; i < n_blocks; i += 32) {
            m = fmaxf(m, __ldcg(part0 + i * stride));
        }
        m           = decode_warp_max(m);
        float sum   = 0.0f;
        float o[E];
#pragma unroll
        for (int j = 0; j < E; ++j) {
            o[j] = 0.0f;
        }
        for (int i = 0; i < n_blocks; ++i) {
            const float * part = part0 + i * stride;
            const float   mi   = __ldcg(part);
            if (mi == -INFINITY) {
                continue;  // every cell of that block masked
            }
            const float w = expf(mi - m);
            sum += w * __ldcg(part + 1);
#pragma unroll
            for (int j = 0; j < E; ++j) {
                o[j] += w * __ldcg(part + 2 + lane * E + j);
            }
        }
        float * out = a.out + (int64_t) t * a.out_token + (int64_t) h * a.out_head + lane * E;
#pragma unroll
        for (int j = 0; j < E; ++j) {
            out[j] = sum > 0.0f ? o[j] / sum : 0.0f;
        }
    }
}

const char * frt_attn_decode_unsupported(int d, int heads, int heads_kv, int n_q, int n_kv) {
    if (d != 64 && d != 128 && d != 256) {
        return "head size not 64, 128 or 256";
    }
    if (heads_kv < 1 || heads % heads_kv != 0) {
        return "query heads not a multiple of key/value heads";
    }
    if (n_q < 1 || n_q > FRT_ATTN_DECODE_MAX_TOKENS || n_q * (heads / heads_kv) > FRT_ATTN_DECODE_MAX_PAIRS) {
        return "more than 8 query tokens, or more than 64 query rows a key/value head";
    }
    if (n_kv < 1 || n_kv > FRT_ATTN_DECODE_MAX_KV) {
        return "more than 1024 cells (stock's split kernels suit long caches)";
    }
    return nullptr;
}

cudaError_t frt_attn_decode(const frt_attn_decode_args & a, cudaStream_t stream) {
    if (frt_attn_decode_unsupported(a.d, a.heads, a.heads_kv, a.n_q, a.n_kv) != nullptr ||
        (frt_attn_decode_blocks(a.n_kv) > 1 && (a.partial == nullptr || a.counters == nullptr))) {
        return cudaErrorInvalidValue;
    }
    const dim3 grid(frt_attn_decode_blocks(a.n_kv), a.heads_kv);
    switch (a.d) {
        case 64:
            return frt_launch(frt_attn_decode_kernel<64>, grid, dim3(decode_threads), 0, stream, a);
        case 128:
            return frt_launch(frt_attn_decode_kernel<128>, grid, dim3(decode_threads), 0, stream, a);
        default:
            return frt_launch(frt_attn_decode_kernel<256>, grid, dim3(decode_threads), 0, stream, a);
    }
}
