#include "gdn-decode.cuh"
#include "pdl.cuh"

constexpr int head_dim     = FRT_GDN_HEAD_DIM;
constexpr int max_seqs     = FRT_GDN_MAX_SEQS;
constexpr int conv_taps    = 4;
constexpr int copy_blocks  = 32;  // prep blocks that copy aside the states read from another row

static __device__ __forceinline__ float gdn_silu(float x) {
    return x / (1.0f + expf(-x));  // ggml_cuda_op_silu_single
}

static __device__ __forceinline__ float gdn_warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffff, x, offset, 32);
    }
    return x;
}

// Stock's rms_norm runs 128 columns as a 256-thread block: four warps' butterfly sums, then a
// butterfly over the eight warps' sums (the last four zero), which adds them as (w0 + w2) + (w1 + w3).
static __device__ __forceinline__ float gdn_sum_of_warps(const float * w) {
    return (w[0] + w[2]) + (w[1] + w[3]);
}

// Scratch per sequence: the conv outputs (q and k normalised, v), then g and beta per value head.
static __host__ __device__ int64_t gdn_seq_floats(int k_heads, int v_heads) {
    return (int64_t) (2 * k_heads + v_heads) * head_dim + 2 * v_heads;
}

static __host__ __device__ int64_t gdn_state_floats(int v_heads) {
    return (int64_t) v_heads * head_dim * head_dim;
}

static __host__ __device__ size_t gdn_states_offset(int n_seqs, int k_heads, int v_heads) {
    const size_t bytes = (size_t) n_seqs * gdn_seq_floats(k_heads, v_heads) * sizeof(float);
    return (bytes + 255) / 256 * 256;
}

size_t frt_gdn_decode_scratch_bytes(int n_seqs, int k_heads, int v_heads) {
    return gdn_states_offset(n_seqs, k_heads, v_heads) + (size_t) n_seqs * gdn_state_floats(v_heads) * sizeof(float);
}

// Block b < 2*H_k + H_v takes 128 channels (a q head, a k head or a value head), one thread a
// channel, for every sequence: the thread reads its channel's old conv columns in all sequences'
// rows before it writes any (no other thread touches that channel, so a sequence reading a row
// another one writes still sees the old values). Later blocks copy states aside.
static __global__ void __launch_bounds__(head_dim) frt_gdn_prep_kernel(const frt_gdn_decode_args a) {
    const int  t           = threadIdx.x;
    const int  lane        = t % 32;
    const int  warp        = t / 32;
    const int  qk_blocks   = 2 * a.k_heads;
    const int  conv_blocks = qk_blocks + a.v_heads;
    const int  channels    = conv_blocks * head_dim;
    float *    scratch     = (float *) a.scratch;
    const int64_t seq_floats = gdn_seq_floats(a.k_heads, a.v_heads);

    if ((int) blockIdx.x >= conv_blocks) {
        // States read from another sequence's row: copied before recur overwrites that row.
        frt_pdl_wait();
        const int64_t state_floats = gdn_state_floats(a.v_heads);
        float * states = (float *) ((char *) a.scratch + gdn_states_offset(a.n_seqs, a.k_heads, a.v_heads));
        const int64_t chunk = state_floats / copy_blocks;  // a multiple of 4: 128 * 128 * H_v / 32
        const int64_t begin = (blockIdx.x - conv_blocks) * chunk;
        for (int s = 0; s < a.n_seqs; ++s) {
            const int row = a.ids[s];
            if (row == a.dst_row + s) {
                continue;
            }
            const float4 * src = (const float4 *) (a.ssm_state + row * a.ssm_row + begin);
            float4 *       dst = (float4 *) (states + s * state_floats + begin);
            for (int64_t k = t; k < chunk / 4; k += blockDim.x) {
                dst[k] = src[k];
            }
        }
        frt_pdl_launch_dependents();
        return;
    }

    const int c = blockIdx.x * head_dim + t;
    float     w[conv_taps];
    if (a.weights_constant) {
#pragma unroll
        for (int j = 0; j < conv_taps; ++j) {
            w[j] = a.conv_w[c * conv_taps + j];
        }
    }
    // The window [old0, old1, old2, new] of every sequence, all reads first. A sequence's old
    // columns are read from its own row before the wait: the window runs only when no node of the
    // graph writes the caches before it (llama.cpp's zeroing of a new sequence's row makes it
    // miss), so their last writer is this kernel a step earlier. After the wait the ids (an input)
    // say which sequences read another row instead (a sequence copy): those are read again.
    float x[max_seqs][conv_taps];
#pragma unroll
    for (int s = 0; s < max_seqs; ++s) {
        if (s < a.n_seqs) {
            const float * old = a.conv_state + (a.dst_row + s) * a.conv_row + c * (conv_taps - 1);
#pragma unroll
            for (int j = 0; j < conv_taps - 1; ++j) {
                x[s][j] = old[j];
            }
        }
    }
    frt_pdl_wait();
    if (!a.weights_constant) {
#pragma unroll
        for (int j = 0; j < conv_taps; ++j) {
            w[j] = a.conv_w[c * conv_taps + j];
        }
    }
#pragma unroll
    for (int s = 0; s < max_seqs; ++s) {
        if (s < a.n_seqs) {
            const int row = a.ids[s];
            if (row != a.dst_row + s) {
                const float * old = a.conv_state + row * a.conv_row + c * (conv_taps - 1);
#pragma unroll
                for (int j = 0; j < conv_taps - 1; ++j) {
                    x[s][j] = old[j];
                }
            }
            x[s][conv_taps - 1] = a.qkv[s * a.qkv_seq + c];
        }
    }
    float y[max_seqs];
#pragma unroll
    for (int s = 0; s < max_seqs; ++s) {
        if (s < a.n_seqs) {
            float * next = a.conv_state + (a.dst_row + s) * a.conv_row + c * (conv_taps - 1);
#pragma unroll
            for (int j = 0; j < conv_taps - 1; ++j) {
                next[j] = x[s][j + 1];
            }
            // ssm_conv_f32: the taps in order from 0, then the (absent) bias, then SiLU.
            float sumf = 0.0f;
#pragma unroll
            for (int j = 0; j < conv_taps; ++j) {
                sumf += x[s][j] * w[j];
            }
            sumf += 0.0f;
            y[s] = gdn_silu(sumf);
        }
    }

    if ((int) blockIdx.x < qk_blocks) {
        // q or k head: rms_norm(y, eps / 128) then the SCALE, as stock's fused rms_norm + scale.
        __shared__ float warp_sums[max_seqs][4];
#pragma unroll
        for (int s = 0; s < max_seqs; ++s) {
            if (s < a.n_seqs) {
                float tmp = 0.0f;
                tmp += y[s] * y[s];
                tmp = gdn_warp_sum(tmp);
                if (lane == 0) {
                    warp_sums[s][warp] = tmp;
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int s = 0; s < max_seqs; ++s) {
            if (s < a.n_seqs) {
                const float mean  = gdn_sum_of_warps(warp_sums[s]) / head_dim;
                const float scale = rsqrtf(mean + a.l2_eps);
                scratch[s * seq_floats + c] = a.l2_scale * (scale * y[s]);
            }
        }
    } else {
#pragma unroll
        for (int s = 0; s < max_seqs; ++s) {
            if (s < a.n_seqs) {
                scratch[s * seq_floats + c] = y[s];
            }
        }
        // The value head's gates, one thread a sequence.
        const int h = blockIdx.x - qk_blocks;
        if (t < a.n_seqs) {
            const float x_alpha  = a.alpha[t * a.alpha_seq + h] + a.dt_bias[h];
            const float softplus = (x_alpha > 20.0f) ? x_alpha : logf(1.0f + expf(x_alpha));
            scratch[t * seq_floats + channels + h]             = softplus * a.a[h];
            scratch[t * seq_floats + channels + a.v_heads + h] = 1.0f / (1.0f + expf(-a.beta[t * a.beta_seq + h]));
        }
    }
    frt_pdl_launch_dependents();
}

// One block per (value head, sequence), 32 warps; warp w takes the state's columns w + 32 j
// (j < 4), each as gated_delta_net_cuda takes one: lane l holds rows l + 32 r. Then the head's
// 128 outputs go through the gated norm.
static __global__ void __launch_bounds__(1024, 1) frt_gdn_recur_kernel(const frt_gdn_decode_args a) {
    constexpr int cols_per_warp = head_dim / 32;
    constexpr int rows_per_lane = head_dim / 32;
    const int     h             = blockIdx.x;
    const int     s             = blockIdx.y;
    const int     lane          = threadIdx.x;
    const int     warp          = threadIdx.y;
    const int     channels      = (2 * a.k_heads + a.v_heads) * head_dim;
    const int64_t state_floats  = gdn_state_floats(a.v_heads);

    __shared__ float attn[head_dim];
    __shared__ float warp_sums[4];

    // The state from the sequence's own row before the wait (as prep's conv columns: its last
    // writer is this kernel a step earlier); a sequence that reads another row (ids, after the
    // wait) loads prep's copy of that row instead.
    float *       dst = a.ssm_state + (a.dst_row + s) * a.ssm_row + h * head_dim * head_dim;
    float state[cols_per_warp][rows_per_lane];
#pragma unroll
    for (int j = 0; j < cols_per_warp; ++j) {
        const int col = warp + 32 * j;
#pragma unroll
        for (int r = 0; r < rows_per_lane; ++r) {
            state[j][r] = dst[col * head_dim + r * 32 + lane];
        }
    }
    float norm_w = 0.0f;
    if (a.weights_constant && warp < 4) {
        norm_w = a.norm_w[warp * 32 + lane];
    }
    frt_pdl_wait();
    if (!a.weights_constant && warp < 4) {
        norm_w = a.norm_w[warp * 32 + lane];
    }
    if (a.ids[s] != a.dst_row + s) {
        const float * copy = (const float *) ((const char *) a.scratch + gdn_states_offset(a.n_seqs, a.k_heads, a.v_heads)) +
                             s * state_floats + h * head_dim * head_dim;
#pragma unroll
        for (int j = 0; j < cols_per_warp; ++j) {
            const int col = warp + 32 * j;
#pragma unroll
            for (int r = 0; r < rows_per_lane; ++r) {
                state[j][r] = copy[col * head_dim + r * 32 + lane];
            }
        }
    }
    // z now, so that its load overlaps the recurrence rather than following the norm.
    const int col_out = warp * 32 + lane;
    const float z = warp < 4 ? a.z[s * a.z_seq + h * a.z_head + col_out] : 0.0f;

    const float * sc = (const float *) a.scratch + s * gdn_seq_floats(a.k_heads, a.v_heads);
    const int     kh = h % a.k_heads;
    float q[rows_per_lane], k[rows_per_lane];
#pragma unroll
    for (int r = 0; r < rows_per_lane; ++r) {
        q[r] = sc[kh * head_dim + r * 32 + lane];
        k[r] = sc[(a.k_heads + kh) * head_dim + r * 32 + lane];
    }
    const float g_val    = expf(sc[channels + h]);
    const float beta_val = sc[channels + a.v_heads + h];

#pragma unroll
    for (int j = 0; j < cols_per_warp; ++j) {
        const int col = warp + 32 * j;
        // gated_delta_net_cuda, scalar gate: kv = S^T k, delta = (v - g kv) beta,
        // S = g S + k delta, o = S^T q.
        float kv_shard = 0.0f;
#pragma unroll
        for (int r = 0; r < rows_per_lane; r++) {
            kv_shard += state[j][r] * k[r];
        }
        const float kv_col    = gdn_warp_sum(kv_shard);
        const float v_col     = sc[(2 * a.k_heads + h) * head_dim + col];
        const float delta_col = (v_col - g_val * kv_col) * beta_val;
        float attn_partial = 0.0f;
#pragma unroll
        for (int r = 0; r < rows_per_lane; r++) {
            state[j][r]  = g_val * state[j][r] + k[r] * delta_col;
            attn_partial += state[j][r] * q[r];
        }
        const float attn_col = gdn_warp_sum(attn_partial);
#pragma unroll
        for (int r = 0; r < rows_per_lane; r++) {
            dst[col * head_dim + r * 32 + lane] = state[j][r];
        }
        if (lane == 0) {
            attn[col] = attn_col * a.attn_scale;
        }
    }
    __syncthreads();
    frt_pdl_launch_dependents();

    // rms_norm(o) * w, then silu(z) times it: stock's fused rms_norm + mul and silu + mul.
    float o = 0.0f;
    if (warp < 4) {
        o = attn[warp * 32 + lane];
        float tmp = 0.0f;
        tmp += o * o;
        tmp = gdn_warp_sum(tmp);
        if (lane == 0) {
            warp_sums[warp] = tmp;
        }
    }
    __syncthreads();
    if (warp < 4) {
        const float mean   = gdn_sum_of_warps(warp_sums) / head_dim;
        const float scale  = rsqrtf(mean + a.norm_eps);
        const float normed = scale * o * norm_w;
        a.out[s * a.out_seq + h * a.out_head + col_out] = gdn_silu(z) * normed;
    }
}

cudaError_t frt_gdn_decode(const frt_gdn_decode_args & a, cudaStream_t stream) {
    if (a.n_seqs < 1 || a.n_seqs > max_seqs || a.k_heads < 1 || a.v_heads % a.k_heads != 0) {
        return cudaErrorInvalidValue;
    }
    const int   conv_blocks = 2 * a.k_heads + a.v_heads;
    cudaError_t err = frt_launch(frt_gdn_prep_kernel, dim3(conv_blocks + copy_blocks), dim3(head_dim), 0, stream, a);
    if (err != cudaSuccess) {
        return err;
    }
    return frt_launch(frt_gdn_recur_kernel, dim3(a.v_heads, a.n_seqs), dim3(32, 32), 0, stream, a);
}
