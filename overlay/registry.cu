#include "registry.cuh"
#include "windows/attn-decode.cuh"
#include "windows/attn-out-gate.cuh"
#include "windows/attn-rope.cuh"
#include "windows/attnqkv.cuh"
#include "windows/gdn-gated-norm.cuh"
#include "windows/gdn.cuh"
#include "windows/head.cuh"
#include "windows/inproj.cuh"
#include "windows/matvec.cuh"
#include "windows/moe-tail.cuh"
#include "windows/moe-topk.cuh"
#include "windows/prefill-fa4.cuh"
#include "windows/router.cuh"
#include "windows/shexp-fold.cuh"
#include "windows/shexp-gate.cuh"
#include "windows/vit-fa4.cuh"

const char * const flashrt_miss_anchor = "anchor op";

// Tried in this order at each node. The norm-fed GEMV windows come before MATVEC, which takes
// whatever matvecs they leave.
static const flashrt_window flashrt_registry[] = {
    // Before GDN_GATED_NORM: it takes the gated norm along with the rest of the layer.
    { "GDN", flashrt_tier::safe, 900, { GGML_OP_GET_ROWS, GGML_OP_COUNT },
      flashrt_match_gdn, flashrt_run_gdn, flashrt_prepare_gdn },
    { "GDN_GATED_NORM", flashrt_tier::safe, 900, { GGML_OP_RMS_NORM, GGML_OP_COUNT },
      flashrt_match_gdn_gated_norm, flashrt_run_gdn_gated_norm, nullptr },
    // full: no measured gain on qwen36 decode, and F16 gates differ from stock (docs/perf-notes.md).
    { "SHEXP_GATE", flashrt_tier::full, 900, { GGML_OP_MUL_MAT, GGML_OP_COUNT },
      flashrt_match_shexp_gate, flashrt_run_shexp_gate, flashrt_prepare_shexp_gate },
    // safe: cargo xtask parity passes on the 4- and 40-layer models (the exact kernel inside the
    // layers is bit-identical to stock's matvecs) and tg128 is faster (docs/perf-notes.md).
    { "INPROJ", flashrt_tier::safe, 900, { GGML_OP_RMS_NORM, GGML_OP_COUNT },
      flashrt_match_inproj, flashrt_run_inproj, flashrt_prepare_inproj, flashrt_run_claimed_inproj },
    { "ATTNQKV", flashrt_tier::safe, 900, { GGML_OP_RMS_NORM, GGML_OP_COUNT },
      flashrt_match_attnqkv, flashrt_run_attnqkv, flashrt_prepare_attnqkv, flashrt_run_claimed_attnqkv },
    { "HEAD", flashrt_tier::safe, 900, { GGML_OP_RMS_NORM, GGML_OP_COUNT },
      flashrt_match_head, flashrt_run_head, flashrt_prepare_head, flashrt_run_claimed_head },
    // safe: with MOE_TAIL and GDN's one launch, tg128 1.192x -> 1.236x stock and parity bit-for-bit
    // on the 4- and 40-layer models (bench/results/2026-12-01-8f50942-h200-router-moe-tail).
    { "ROUTER", flashrt_tier::safe, 900, { GGML_OP_RMS_NORM, GGML_OP_COUNT },
      flashrt_match_router, flashrt_run_router, flashrt_prepare_router, flashrt_run_claimed_router },
    // Before MATVEC: at the experts' gate/up it takes the shared expert along (MATVEC leaves it).
    { "SHEXP_FOLD", flashrt_tier::safe, 900, { GGML_OP_MUL_MAT_ID, GGML_OP_COUNT },
      flashrt_match_shexp_fold, flashrt_run_shexp_fold, flashrt_prepare_shexp_fold },
    { "MATVEC", flashrt_tier::safe, 900, { GGML_OP_MUL_MAT, GGML_OP_MUL_MAT_ID },
      flashrt_match_matvec, flashrt_run_matvec, flashrt_prepare_matvec },
    // safe: with ATTN_ROPE and the early dependents, tg128 1.240x -> 1.319x stock, parity
    // bit-for-bit on the 4- and 40-layer models (bench/results/2026-12-01-75c99d4-h200-topk-rope-early).
    { "MOE_TOPK", flashrt_tier::safe, 900, { GGML_OP_SOFT_MAX, GGML_OP_COUNT },
      flashrt_match_moe_topk, flashrt_run_moe_topk, nullptr, flashrt_run_claimed_moe_topk },
    // safe: measured with ROUTER (above).
    { "MOE_TAIL", flashrt_tier::safe, 900, { GGML_OP_MUL, GGML_OP_COUNT },
      flashrt_match_moe_tail, flashrt_run_moe_tail, flashrt_prepare_moe_tail },
    // safe: measured with MOE_TOPK (above). At RMS_NORM after the norm packs, which take only norms
    // that matvecs read: q's and k's are left.
    { "ATTN_ROPE", flashrt_tier::safe, 900, { GGML_OP_RMS_NORM, GGML_OP_COUNT },
      flashrt_match_attn_rope, flashrt_run_attn_rope, nullptr },
    // safe: v2 (a cluster a key/value head) at tg128 +1.1% (flash attention and its fix-up, 13.9 us
    // a layer, -> 11.8 us) and 40-layer parity within the yardstick with GDN's clusters
    // (bench/results/2026-12-01-beb77b5-h200-ab-experiments); float scores and sums, not stock's
    // bits. FRT_ATTN_DECODE_SWAP=0 turns it off.
    { "ATTN_DECODE", flashrt_tier::safe, 900, { GGML_OP_FLASH_ATTN_EXT, GGML_OP_COUNT },
      flashrt_match_attn_decode, flashrt_run_attn_decode, nullptr },
    // safe: tg128 +0.9% interleaved, GPU busy 2127 -> 2105 us a step, 313 -> 304 kernels, 40-layer
    // parity unchanged (bench/results/2026-12-07-072ca12-h200-accept); FRT_ATTN_OUT_GATE_SWAP=0 turns
    // it off. The gate ATTN_DECODE leaves (it folds the gate where its output does not lie over Q,
    // taking these nodes along).
    { "ATTN_OUT_GATE", flashrt_tier::safe, 900, { GGML_OP_CONT, GGML_OP_UNARY },
      flashrt_match_attn_out_gate, flashrt_run_attn_out_gate, flashrt_prepare_attn_out_gate },
    // full: not yet run on a GPU (FRT_PREFILL_FA4_SWAP=1 turns it on); compiled only where the
    // build links FA4 objects (fa4_aot/), else it misses saying so.
    { "PREFILL_FA4", flashrt_tier::full, 900, { GGML_OP_FLASH_ATTN_EXT, GGML_OP_COUNT },
      flashrt_match_prefill_fa4, flashrt_run_prefill_fa4, flashrt_prepare_prefill_fa4 },
    // full: not yet run on a GPU (FRT_VIT_FA4_SWAP=1 turns it on); as PREFILL_FA4, only where the
    // build links FA4 objects.
    { "VIT_FA4", flashrt_tier::full, 900, { GGML_OP_FLASH_ATTN_EXT, GGML_OP_COUNT },
      flashrt_match_vit_fa4, flashrt_run_vit_fa4, flashrt_prepare_vit_fa4 },
};

const flashrt_window * flashrt_windows(int * n_windows) {
    *n_windows = (int) (sizeof(flashrt_registry) / sizeof(flashrt_registry[0]));
    return flashrt_registry;
}
