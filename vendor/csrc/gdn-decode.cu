#include "gdn-decode.cuh"
#include "env-switch.cuh"
#include "q8-x.cuh"
#include "pdl.cuh"
#include "warp-reduce.cuh"

constexpr int head_dim     = FRT_GDN_HEAD_DIM;
constexpr int max_seqs     = FRT_GDN_MAX_SEQS;
constexpr int conv_taps    = 4;
constexpr int copy_blocks  = 32;  // prep blocks that copy aside the states read from another row

static __device__ __forceinline__ float gdn_silu(float x) {
    return x / (1.0f + expf(-x));  // ggml_cuda_op_silu_single
}

// Stock's rms_norm runs 128 columns as a 256-thread block: four warps' butterfly sums, then a
// butterfly over the eight warps' sums (the last four zero), which adds them as (w0 + w2) + (w1 + w3).
static __device__ __forceinline__ float gdn_sum_of_warps(const float * w) {
    return (w[0] + w[2]) + (w[1] + w[3]);
}

// ssm_conv_f32's sum of the window [old0, old1, old2, new] times the taps, in order from 0, then
// the (absent) bias, then SiLU.
static __device__ __forceinline__ float gdn_conv_silu(const float (&x)[conv_taps], const float (&w)[conv_taps]) {
    float sumf = 0.0f;
#pragma unroll
    for (int j = 0; j < conv_taps; ++j) {
        sumf += x[j] * w[j];
    }
    sumf += 0.0f;
    return gdn_silu(sumf);
}

// Channel c's conv taps.
static __device__ __forceinline__ void gdn_load_taps(float (&w)[conv_taps], const float * conv_w, int c) {
#pragma unroll
    for (int j = 0; j < conv_taps; ++j) {
        w[j] = conv_w[c * conv_taps + j];
    }
}

// A value head's gates: g = softplus(alpha + dt_bias) * a (its exp is taken by the delta rule) and
// sigmoid(beta), as stock's add, softplus-mul and sigmoid kernels compute them.
static __device__ __forceinline__ void gdn_gates(float alpha, float dt_bias, float a, float beta, float & g, float & b) {
    const float x_alpha  = alpha + dt_bias;
    const float softplus = (x_alpha > 20.0f) ? x_alpha : logf(1.0f + expf(x_alpha));
    g                    = softplus * a;
    b                    = 1.0f / (1.0f + expf(-beta));
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
        gdn_load_taps(w, a.conv_w, c);
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
        gdn_load_taps(w, a.conv_w, c);
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
            y[s] = gdn_conv_silu(x[s], w);
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
                tmp = frt_warp_sum(tmp);
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
            gdn_gates(a.alpha[t * a.alpha_seq + h], a.dt_bias[h], a.a[h], a.beta[t * a.beta_seq + h],
                      scratch[t * seq_floats + channels + h], scratch[t * seq_floats + channels + a.v_heads + h]);
        }
    }
    frt_pdl_launch_dependents();
}

// The delta rule for value head h on its state (lane l of warp w holds column w + 32 j, rows
// l + 32 r), written back to dst, then the gated norm of the head's 128 outputs: q, k, v and the
// gates as prep leaves them (q_src/k_src: the head's normalised q and k; v_src: its v).
static __device__ __forceinline__ void gdn_head_step(const frt_gdn_decode_args & a, int h, int s,
                                                     float (&state)[head_dim / 32][head_dim / 32], float * dst,
                                                     const float * q_src, const float * k_src, const float * v_src,
                                                     float g_val, float beta_val, float z, float norm_w, float * attn,
                                                     float * warp_sums, bool stream_state) {
    constexpr int cols_per_warp = head_dim / 32;
    constexpr int rows_per_lane = head_dim / 32;
    const int     lane          = threadIdx.x;
    const int     warp          = threadIdx.y;
    float q[rows_per_lane], k[rows_per_lane];
#pragma unroll
    for (int r = 0; r < rows_per_lane; ++r) {
        q[r] = q_src[r * 32 + lane];
        k[r] = k_src[r * 32 + lane];
    }

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
        const float kv_col    = frt_warp_sum(kv_shard);
        const float v_col     = v_src[col];
        const float delta_col = (v_col - g_val * kv_col) * beta_val;
        float attn_partial = 0.0f;
#pragma unroll
        for (int r = 0; r < rows_per_lane; r++) {
            state[j][r]  = g_val * state[j][r] + k[r] * delta_col;
            attn_partial += state[j][r] * q[r];
        }
        const float attn_col = frt_warp_sum(attn_partial);
#pragma unroll
        for (int r = 0; r < rows_per_lane; r++) {
            float * to = dst + col * head_dim + r * 32 + lane;
            if (stream_state) {
                __stcs(to, state[j][r]);
            } else {
                *to = state[j][r];
            }
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
        tmp = frt_warp_sum(tmp);
        if (lane == 0) {
            warp_sums[warp] = tmp;
        }
    }
    __syncthreads();
    if (warp < 4) {
        const float mean   = gdn_sum_of_warps(warp_sums) / head_dim;
        const float scale  = rsqrtf(mean + a.norm_eps);
        const float normed = scale * o * norm_w;
        const float val    = gdn_silu(z) * normed;
        a.out[s * a.out_seq + h * a.out_head + warp * 32 + lane] = val;
        if (a.x_q8 != nullptr && s == 0) {  // block 4h + warp of the image
            const int k = a.v_heads * head_dim;
            frt_quantize_q8_lane(val, lane, (int8_t *) a.x_q8 + h * head_dim + warp * 32,
                                 (uint2 *) ((uint8_t *) a.x_q8 + k) + 4 * h + warp);
        }
    }
}

// The head's state from row `from` (lane l of warp w: columns w + 32 j, rows l + 32 r).
// stream_state: loaded (and in gdn_head_step stored) as streaming, evict-first in L2
// (GGML_FLASHRT_GDN_STATE_STREAM=1, an experiment): the states, 2 MB a layer, are read once a step,
// more than L2 holds over the step, and would otherwise push out what the step reads again.
static __device__ __forceinline__ void gdn_load_state(float (&state)[head_dim / 32][head_dim / 32], const float * from,
                                                      bool stream_state = false) {
#pragma unroll
    for (int j = 0; j < head_dim / 32; ++j) {
        const int col = threadIdx.y + 32 * j;
#pragma unroll
        for (int r = 0; r < head_dim / 32; ++r) {
            const float * at = from + col * head_dim + r * 32 + threadIdx.x;
            state[j][r]      = stream_state ? __ldcs(at) : *at;
        }
    }
}

// One block per (value head, sequence), 32 warps; warp w takes the state's columns w + 32 j
// (j < 4), each as gated_delta_net_cuda takes one: lane l holds rows l + 32 r. Then the head's
// 128 outputs go through the gated norm.
static __global__ void __launch_bounds__(1024, 1) frt_gdn_recur_kernel(const frt_gdn_decode_args a) {
    const int     h            = blockIdx.x;
    const int     s            = blockIdx.y;
    const int     lane         = threadIdx.x;
    const int     warp         = threadIdx.y;
    const int     channels     = (2 * a.k_heads + a.v_heads) * head_dim;
    const int64_t state_floats = gdn_state_floats(a.v_heads);

    __shared__ float attn[head_dim];
    __shared__ float warp_sums[4];

    // The state from the sequence's own row before the wait (as prep's conv columns: its last
    // writer is this kernel a step earlier); a sequence that reads another row (ids, after the
    // wait) loads prep's copy of that row instead.
    float * dst = a.ssm_state + (a.dst_row + s) * a.ssm_row + h * head_dim * head_dim;
    float   state[head_dim / 32][head_dim / 32];
    gdn_load_state(state, dst);
    float norm_w = 0.0f;
    if (a.weights_constant && warp < 4) {
        norm_w = a.norm_w[warp * 32 + lane];
    }
    frt_pdl_wait();
    if (!a.weights_constant && warp < 4) {
        norm_w = a.norm_w[warp * 32 + lane];
    }
    if (a.ids[s] != a.dst_row + s) {
        gdn_load_state(state, (const float *) ((const char *) a.scratch +
                                               gdn_states_offset(a.n_seqs, a.k_heads, a.v_heads)) +
                                  s * state_floats + h * head_dim * head_dim);
    }
    // z now, so that its load overlaps the recurrence rather than following the norm.
    const float z = warp < 4 ? a.z[s * a.z_seq + h * a.z_head + warp * 32 + lane] : 0.0f;

    const float * sc = (const float *) a.scratch + s * gdn_seq_floats(a.k_heads, a.v_heads);
    const int     kh = h % a.k_heads;
    gdn_head_step(a, h, s, state, dst, sc + kh * head_dim, sc + (a.k_heads + kh) * head_dim,
                  sc + (2 * a.k_heads + h) * head_dim, expf(sc[channels + h]), sc[channels + a.v_heads + h], z, norm_w,
                  attn, warp_sums, false);
}

// One sequence in one launch: one block per value head (32 warps, as recur), which also does
// prep's work for its head: the conv of its v channels and, in the first H_k blocks, of the q and
// k channels of key head h (conv state written, L2 norms), handed to the blocks of the value heads
// that share that key head through the scratch and a.flags[h] (set to the number of those blocks,
// each takes one off: it is 0 again when the launch ends). One sequence never reads a row another
// writes, so no state needs copying aside. Same expressions and sum orders as prep and recur.
// early: the dependents may start now (frt_pdl_early_dependents) instead of after the state
// update; their wait covers every write.
// CLUSTER: the value heads sharing a key head run as one thread-block cluster (block b: sharer
// b % sharing of key head b / sharing), and every block computes that key head's q and k itself
// instead of waiting for the first one's through the scratch and a flag; the first still alone
// writes their conv state, once every block of the cluster has read the old one (a cluster
// barrier: arrive after the reads, wait before the writes).
template <bool CLUSTER, bool STREAM_STATE>
static __global__ void __launch_bounds__(1024, 1) frt_gdn_single_kernel(const frt_gdn_decode_args a, bool early) {
    if (early) {
        frt_pdl_launch_dependents();
    }
    const int  sharing  = a.v_heads / a.k_heads;  // value heads reading one key head
    const int  h        = CLUSTER ? (blockIdx.x % sharing) * a.k_heads + blockIdx.x / sharing : blockIdx.x;
    const int  lane     = threadIdx.x;
    const int  warp     = threadIdx.y;
    const int  t        = warp * 32 + lane;
    const int  kh       = h % a.k_heads;
    const bool writer   = h < a.k_heads;          // writes key head kh's q and k conv state
    const bool producer = CLUSTER || writer;      // computes q and k of key head kh
    const int  sharers  = CLUSTER ? 0 : sharing - 1;  // value heads handed q and k through the scratch

    __shared__ float qk[2][head_dim];  // the key head's q and k, normalised
    __shared__ float v[head_dim];
    __shared__ float gates[2];
    __shared__ float qk_sums[2][4];
    __shared__ float attn[head_dim];
    __shared__ float warp_sums[4];

    // This thread's conv channel: v channel t of head h (t < 128); in a producer, q then k channel
    // of key head kh (128 <= t < 384).
    int c = -1;
    if (t < head_dim) {
        c = (2 * a.k_heads + h) * head_dim + t;
    } else if (producer && t < 3 * head_dim) {
        c = t < 2 * head_dim ? kh * head_dim + (t - head_dim) : (a.k_heads + kh) * head_dim + (t - 2 * head_dim);
    }

    // Before the wait, as recur and prep: the state and conv columns of the own row, the weights.
    float * dst = a.ssm_state + a.dst_row * a.ssm_row + h * head_dim * head_dim;
    float   state[head_dim / 32][head_dim / 32];
    gdn_load_state(state, dst, STREAM_STATE);
    float x[conv_taps] = {};
    float w[conv_taps] = {};
    if (c >= 0) {
        const float * old = a.conv_state + a.dst_row * a.conv_row + c * (conv_taps - 1);
#pragma unroll
        for (int j = 0; j < conv_taps - 1; ++j) {
            x[j] = old[j];
        }
    }
    if (CLUSTER) {  // the own row's old conv columns are read (the writer waits for every block's)
        asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    }
    // Weights nothing on the stream writes before the wait, others after it.
    const auto load_weights = [&]() {
        if (c >= 0) {
            gdn_load_taps(w, a.conv_w, c);
        }
        return warp < 4 ? a.norm_w[warp * 32 + lane] : 0.0f;
    };
    float norm_w = a.weights_constant ? load_weights() : 0.0f;
    frt_pdl_wait();
    if (!a.weights_constant) {
        norm_w = load_weights();
    }
    const int row = a.ids[0];
    if (row != a.dst_row) {
        gdn_load_state(state, a.ssm_state + row * a.ssm_row + h * head_dim * head_dim, STREAM_STATE);
    }
    const float z = warp < 4 ? a.z[h * a.z_head + warp * 32 + lane] : 0.0f;
    // The gates' inputs (alpha and beta from the input projection, dt_bias and A), issued with z:
    // read where the gates are computed, behind thread 0's conv input and its conv-state stores
    // (which may alias them), they took the block one more L2 round trip before its barrier.
    float gate_in[4] = {};
    if (t == 0) {
        gate_in[0] = a.alpha[h];
        gate_in[1] = a.dt_bias[h];
        gate_in[2] = a.a[h];
        gate_in[3] = a.beta[h];
    }

    if (CLUSTER && writer) {
        asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    }
    float y = 0.0f;
    if (c >= 0) {
        if (row != a.dst_row) {
            const float * old = a.conv_state + row * a.conv_row + c * (conv_taps - 1);
#pragma unroll
            for (int j = 0; j < conv_taps - 1; ++j) {
                x[j] = old[j];
            }
        }
        x[conv_taps - 1] = a.qkv[c];
        if (t < head_dim || writer) {  // q and k: the key head's first value head alone
            float * next = a.conv_state + a.dst_row * a.conv_row + c * (conv_taps - 1);
#pragma unroll
            for (int j = 0; j < conv_taps - 1; ++j) {
                next[j] = x[j + 1];
            }
        }
        y = gdn_conv_silu(x, w);
        if (t < head_dim) {
            v[t] = y;
        }
    }
    // q and k: rms_norm(y, eps / 128) then the SCALE, over 4 warps each (warps 4-7 q, 8-11 k).
    const int g_qk = (warp - 4) / 4;
    if (producer && warp >= 4 && warp < 12) {
        float tmp = 0.0f;
        tmp += y * y;
        tmp = frt_warp_sum(tmp);
        if (lane == 0) {
            qk_sums[g_qk][(warp - 4) % 4] = tmp;
        }
    }
    if (t == 0) {
        gdn_gates(gate_in[0], gate_in[1], gate_in[2], gate_in[3], gates[0], gates[1]);
    }
    __syncthreads();
    float * shared_qk = (float *) a.scratch;  // [q of every key head | k of every key head], as prep's
    if (producer) {
        if (warp >= 4 && warp < 12) {
            const int   i     = t - head_dim - g_qk * head_dim;
            const float mean  = gdn_sum_of_warps(qk_sums[g_qk]) / head_dim;
            const float scale = rsqrtf(mean + a.l2_eps);
            const float val   = a.l2_scale * (scale * y);
            qk[g_qk][i]       = val;
            if (sharers > 0) {
                shared_qk[(g_qk * a.k_heads + kh) * head_dim + i] = val;
                __threadfence();
            }
        }
        __syncthreads();
        if (sharers > 0 && t == 0) {
            atomicExch(&a.flags[kh], sharers);
        }
    } else {
        if (t == 0) {
            while (atomicAdd(&a.flags[kh], 0) == 0) {
            }
            __threadfence();
        }
        __syncthreads();
        if (t < 2 * head_dim) {
            qk[t / head_dim][t % head_dim] = __ldcg(&shared_qk[((t / head_dim) * a.k_heads + kh) * head_dim + t % head_dim]);
        }
        __syncthreads();
        if (t == 0) {
            atomicSub(&a.flags[kh], 1);
        }
    }
    __syncthreads();
    gdn_head_step(a, h, 0, state, dst, qk[0], qk[1], v, expf(gates[0]), gates[1], z, norm_w, attn, warp_sums,
                  STREAM_STATE);
    if (CLUSTER && !writer) {  // the arrival's wait, before the block leaves
        asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    }
}

// Whether the one-sequence launch runs as clusters (frt_gdn_single_kernel's CLUSTER): on unless
// GGML_FLASHRT_GDN_CLUSTER=0 (tg128 +0.9%, GDN 6.2 -> 5.9 us a layer at beb77b5;
// bench/results/2026-12-01-beb77b5-h200-ab-experiments).
static bool gdn_cluster_enabled() {
    static const bool on = frt_env_flag("GGML_FLASHRT_GDN_CLUSTER", true);
    return on;
}

// GGML_FLASHRT_GDN_STATE_STREAM=1: the one-sequence launch loads and stores the recurrent state as
// streaming (evict-first in L2; an experiment).
static bool gdn_state_stream() {
    static const bool on = frt_env_flag("GGML_FLASHRT_GDN_STATE_STREAM", false);
    return on;
}

cudaError_t frt_gdn_decode(const frt_gdn_decode_args & a, cudaStream_t stream) {
    if (a.n_seqs < 1 || a.n_seqs > max_seqs || a.k_heads < 1 || a.v_heads % a.k_heads != 0) {
        return cudaErrorInvalidValue;
    }
    if (a.x_q8 != nullptr && (a.n_seqs != 1 || a.out_head != head_dim || a.v_heads * head_dim % 256 != 0 ||
                              a.v_heads * head_dim > FRT_X_Q8_MAX_K || (uintptr_t) a.x_q8 % 16 != 0)) {
        return cudaErrorInvalidValue;
    }
    if (a.n_seqs == 1 && a.flags != nullptr) {
        const int sharing = a.v_heads / a.k_heads;
        const bool s = gdn_state_stream();
        if (gdn_cluster_enabled() && sharing >= 2 && sharing <= 8) {
            return frt_launch_clustered(s ? frt_gdn_single_kernel<true, true> : frt_gdn_single_kernel<true, false>,
                                        dim3(a.v_heads), dim3(32, 32), 0, stream, sharing, a, frt_pdl_early_dependents());
        }
        return frt_launch(s ? frt_gdn_single_kernel<false, true> : frt_gdn_single_kernel<false, false>, dim3(a.v_heads),
                          dim3(32, 32), 0, stream, a, frt_pdl_early_dependents());
    }
    const int   conv_blocks = 2 * a.k_heads + a.v_heads;
    cudaError_t err = frt_launch(frt_gdn_prep_kernel, dim3(conv_blocks + copy_blocks), dim3(head_dim), 0, stream, a);
    if (err != cudaSuccess) {
        return err;
    }
    return frt_launch(frt_gdn_recur_kernel, dim3(a.v_heads, a.n_seqs), dim3(32, 32), 0, stream, a);
}
