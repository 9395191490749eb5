#pragma once

// A Gated DeltaNet layer's decode step (Qwen3.5/3.6 linear attention), one token per sequence,
// from its input projections to the gated norm's output, in two launches:
//   prep:  the short convolution (its 3-column state read and shifted in place) and SiLU, q and k
//          L2-normalised per head, the gates g = softplus(alpha + dt_bias) * a and sigmoid(beta),
//          into a scratch buffer; a recurrent state whose sequence reads another sequence's row
//          (after a sequence copy) is copied aside first, since that row is overwritten next.
//   recur: per value head and sequence, the delta rule on the 128x128 state (read and written in
//          place in the cache) and the output's gated RMS norm: rmsnorm(o) * w * silu(z).
// With one sequence and a.flags, both in one launch (each block does prep's work for its head).
// Stock ggml-cuda runs the same step as ~12 kernels (the states gathered, concat, conv, copies,
// norms, gates, gated_delta_net, the output norm). The arithmetic follows stock's kernels
// expression by expression (sum orders included), so the results match stock's.
//
// Plain pointers and strides, no ggml types. Head size 128 (S_k == S_v), conv kernel 4.

#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

constexpr int FRT_GDN_HEAD_DIM = 128;
constexpr int FRT_GDN_MAX_SEQS = 8;

struct frt_gdn_decode_args {
    int n_seqs;   // 1..FRT_GDN_MAX_SEQS
    int k_heads;  // H_k; the value heads read k-head h % H_k (ggml's tiled broadcast)
    int v_heads;  // H_v, a multiple of H_k

    // The token's projections, per sequence s (elements):
    const float * qkv;  // conv channels [q: H_k*128 | k: H_k*128 | v: H_v*128] at qkv + s*qkv_seq
    int64_t       qkv_seq;
    const float * z;    // value head h at z + s*z_seq + h*z_head, 128 contiguous
    int64_t       z_seq, z_head;
    const float * alpha;  // [H_v] at alpha + s*alpha_seq
    int64_t       alpha_seq;
    const float * beta;   // [H_v] at beta + s*beta_seq, before the sigmoid
    int64_t       beta_seq;

    // Weights.
    const float * conv_w;   // [channels][4]
    const float * dt_bias;  // [H_v]
    const float * a;        // [H_v]
    const float * norm_w;   // [128]
    bool          weights_constant;  // nothing on the stream writes them: loaded before the PDL wait

    // The caches: sequence s reads row ids[s] and writes row dst_row + s.
    const int32_t * ids;
    float *         conv_state;  // rows of [channels][3]: channel c's columns at c*3
    int64_t         conv_row;    // row stride, elements
    float *         ssm_state;   // rows of [H_v][128 columns][128]: head h, column j at h*128*128 + j*128
    int64_t         ssm_row;
    int             dst_row;

    float *  out;  // value head h of sequence s at out + s*out_seq + h*out_head, 128 contiguous
    int64_t  out_seq, out_head;
    // One sequence, out contiguous (out_head 128), optional: the output also quantized for the
    // next launch's matvecs (ssm_out) as the exact GEMV's prologue would quantize it, written as
    // frt_gemv_args::x_q8's image of the H_v * 128 values (q8-x.cuh; at most FRT_X_Q8_MAX_K),
    // 16-byte aligned: each warp of a head's output holds one 32-value block of it.
    void *   x_q8;

    float l2_eps;      // q/k rms_norm eps (the graph passes eps / 128)
    float l2_scale;    // the SCALE after it (1 / sqrt(128))
    float norm_eps;    // the output norm's eps
    float attn_scale;  // gated_delta_net's q scale, 1 / sqrt(128)

    // Device scratch of frt_gdn_decode_scratch_bytes(); capture-stable (from the caller's pool).
    void * scratch;
    // One sequence: H_k ints, zero, that nothing else uses while the launch runs (left zero): the
    // whole step in one launch, the value heads sharing a key head handed its q and k through
    // them. nullptr: two launches (prep, recur).
    int * flags;
};

size_t frt_gdn_decode_scratch_bytes(int n_seqs, int k_heads, int v_heads);

// Launches prep and recur on `stream` (PDL when enabled); capture-safe. Returns the launch error.
cudaError_t frt_gdn_decode(const frt_gdn_decode_args & args, cudaStream_t stream);
