#include "attn-norm-rope.cuh"
#include "pdl.cuh"
#include "warp-reduce.cuh"

constexpr int attn_rope_threads = 256;  // rms_norm_f32's block below 1024 columns
constexpr int attn_rope_warps   = attn_rope_threads / 32;
constexpr int attn_rope_cols    = (FRT_ATTN_ROPE_MAX_HEAD_DIM + attn_rope_threads - 1) / attn_rope_threads;  // a thread's

// Its block_reduce<SUM, 256>: every warp's sum, lane 0 of each to shared memory, then the same
// butterfly over the 8 sums, the lanes past them holding 0.
static __device__ __forceinline__ float attn_rope_block_sum(float x, float * warp_sums) {
    x              = frt_warp_sum(x);
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (lane == 0) {
        warp_sums[warp] = x;
    }
    __syncthreads();
    x = lane < attn_rope_warps ? warp_sums[lane] : 0.0f;
    return frt_warp_sum(x);
}

static __device__ __forceinline__ int64_t attn_rope_row(const frt_attn_rope_rows & rows, int t) {
    return rows.i32 ? (int64_t) ((const int32_t *) rows.data)[t * rows.stride]
                    : ((const int64_t *) rows.data)[t * rows.stride];
}

// rope_multi's cos/sin of channel pair iw/2 (forward, no frequency factors): the section's
// position (pos: the token's position in each of the 4 sections) times theta_scale^(iw/2), then rope_yarn's interpolation and magnitude scale.
static __device__ __forceinline__ void attn_rope_cos_sin(const frt_attn_rope_args & a, const int (&pos)[4], int iw,
                                                         float & cos_theta, float & sin_theta) {
    const int sect_dims = a.sections[0] + a.sections[1] + a.sections[2] + a.sections[3];
    const int sec_w     = a.sections[1] + a.sections[0];
    const int sector    = (iw / 2) % sect_dims;
    int       section   = 3;
    if (a.imrope) {
        if (sector % 3 == 1 && sector < 3 * a.sections[1]) {
            section = 1;
        } else if (sector % 3 == 2 && sector < 3 * a.sections[2]) {
            section = 2;
        } else if (sector % 3 == 0 && sector < 3 * a.sections[0]) {
            section = 0;
        }
    } else if (sector < a.sections[0]) {
        section = 0;
    } else if (sector < sec_w) {
        section = 1;
    } else if (sector < sec_w + a.sections[2]) {
        section = 2;
    }
    const int   p            = section == 0 ? pos[0] : section == 1 ? pos[1] : section == 2 ? pos[2] : pos[3];
    const float theta_extrap = p * powf(a.theta_scale, iw / 2.0f);

    // rope_yarn: with ext_factor 0 (no YaRN) theta is freq_scale * theta_extrap.
    const float theta_interp = a.freq_scale * theta_extrap;
    float       theta        = theta_interp;
    float       mscale       = a.attn_factor;
    if (a.ext_factor != 0.0f) {
        // rope_yarn_ramp of pair iw/2 between the correction dims.
        const float y        = (iw / 2 - a.corr_dims[0]) / fmaxf(0.001f, a.corr_dims[1] - a.corr_dims[0]);
        const float ramp_mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * a.ext_factor;
        theta                = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0f + 0.1f * logf(1.0f / a.freq_scale);
    }
    cos_theta = cosf(theta) * mscale;
    sin_theta = sinf(theta) * mscale;
}

// One block per head and token: blockIdx.x < n_head_q are query heads, the rest KV heads (which
// also convert their share of the token's V row).
static __global__ void __launch_bounds__(attn_rope_threads) frt_attn_rope_kernel(const frt_attn_rope_args a) {
    __shared__ float warp_sums[32];
    __shared__ float normed[FRT_ATTN_ROPE_MAX_HEAD_DIM];
    const int   t    = blockIdx.y;
    const bool  is_q = (int) blockIdx.x < a.n_head_q;
    const int   h    = is_q ? (int) blockIdx.x : (int) blockIdx.x - a.n_head_q;
    const int   D    = a.head_dim;
    const float * x  = is_q ? a.q + t * a.q_token + h * a.q_head : a.k + t * a.k_token + h * a.k_head;
    const float * w  = is_q ? a.q_weight : a.k_weight;
    const float eps  = is_q ? a.q_eps : a.k_eps;

    // The norm's weights: model weights before the wait, else with the activations after it.
    float      wr[attn_rope_cols];
    const auto load_weights = [&]() {
#pragma unroll
        for (int j = 0; j < attn_rope_cols; ++j) {
            const int col = threadIdx.x + attn_rope_threads * j;
            wr[j]         = col < D ? w[col] : 0.0f;
        }
    };
    if (a.weights_constant) {
        load_weights();
    }

    // Everything read from here on (activations, positions, row ids) an earlier kernel may write.
    // Every read is issued before the first store (the V rows' copy, which may alias them in the
    // compiler's eyes): the head's values, the positions, the cache rows, V, in one round trip.
    frt_pdl_wait();
    if (!a.weights_constant) {
        load_weights();
    }
    float xr[attn_rope_cols];
#pragma unroll
    for (int j = 0; j < attn_rope_cols; ++j) {
        const int col = threadIdx.x + attn_rope_threads * j;
        xr[j]         = col < D ? x[col] : 0.0f;
    }
    int pos[4] = { 0, 0, 0, 0 };
    if (a.n_dims > 0) {
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            pos[s] = a.pos[t + a.tokens * s];
        }
    }
    int64_t k_row = 0;
    if (!is_q) {
        k_row = attn_rope_row(a.k_rows, t);
        // set_rows of V: this KV head's share of the token's row, rounded to nearest as
        // ggml_cuda_cast<half> rounds it.
        const int64_t v_row = attn_rope_row(a.v_rows, t);
        const int     share = (a.v_cols + a.n_head_kv - 1) / a.n_head_kv;
        const int     end   = min(a.v_cols, (h + 1) * share);
        for (int c = h * share + threadIdx.x; c < end; c += attn_rope_threads) {
            a.v_cache[v_row * a.v_cache_row + c] = __float2half(a.v[t * a.v_token + c]);
        }
    }

    // rms_norm_f32<256, true>: the squares summed by column stride, reduced, then (scale * x) * w.
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < attn_rope_cols; ++j) {
        sum += xr[j] * xr[j];  // 0 past D: the same sum
    }
    sum               = attn_rope_block_sum(sum, warp_sums);
    const float mean  = sum / D;
    const float scale = rsqrtf(mean + eps);
#pragma unroll
    for (int j = 0; j < attn_rope_cols; ++j) {
        const int col = threadIdx.x + attn_rope_threads * j;
        if (col < D) {
            normed[col] = scale * xr[j] * wr[j];
        }
    }
    __syncthreads();  // every read of x is done: q_out may alias it from here
    frt_pdl_launch_dependents();

    float *  q_out = a.q_out + t * a.q_out_token + h * a.q_out_head;
    __half * k_out = a.k_cache + k_row * a.k_cache_row + (int64_t) h * D;
    const auto store = [&](int c, float v) {
        if (is_q) {
            q_out[c] = v;
        } else {
            k_out[c] = __float2half(v);
        }
    };
    // rope_multi: thread pair i0 = 2p copies channels i0, i0 + 1 outside [n_offs, n_offs + n_dims),
    // and inside rotates channel i0/2 + n_offs/2 with the one n_dims/2 further (NEOX pairing).
    for (int p = threadIdx.x; p < D / 2; p += attn_rope_threads) {
        const int i0 = 2 * p;
        if (i0 < a.n_offs || i0 >= a.n_offs + a.n_dims) {
            store(i0 + 0, normed[i0 + 0]);
            store(i0 + 1, normed[i0 + 1]);
            continue;
        }
        const int iw = i0 - a.n_offs;
        float     cos_theta, sin_theta;
        attn_rope_cos_sin(a, pos, iw, cos_theta, sin_theta);
        const int   c0 = i0 / 2 + a.n_offs / 2;
        const float x0 = normed[c0];
        const float x1 = normed[c0 + a.n_dims / 2];
        store(c0, x0 * cos_theta - x1 * sin_theta);
        store(c0 + a.n_dims / 2, x0 * sin_theta + x1 * cos_theta);
    }
}

cudaError_t frt_attn_rope(const frt_attn_rope_args & a, cudaStream_t stream) {
    const int sect_dims = a.sections[0] + a.sections[1] + a.sections[2] + a.sections[3];
    if (a.head_dim < 2 || a.head_dim > FRT_ATTN_ROPE_MAX_HEAD_DIM || a.head_dim % 2 != 0 || a.n_head_q < 1 ||
        a.n_head_kv < 1 || a.n_head_q + a.n_head_kv > 65535 || a.tokens < 1 || a.tokens > FRT_ATTN_ROPE_MAX_TOKENS ||
        a.n_dims < 0 || a.n_offs < 0 || a.n_offs + a.n_dims > a.head_dim || (a.n_dims > 0 && sect_dims <= 0) ||
        a.v_cols < 0) {
        return cudaErrorInvalidValue;
    }
    const dim3 grid(a.n_head_q + a.n_head_kv, a.tokens);
    return frt_launch(frt_attn_rope_kernel, grid, dim3(attn_rope_threads), 0, stream, a);
}
