#pragma once

// Shared glue of the windows that run weight matvecs through the decode GEMV kernel
// (vendor/csrc/gemv.cuh): a *pack* is a set of MUL_MAT nodes of one graph that read the same
// input vector(s), computed by one frt_gemv launch, optionally with the RMS norm that produced
// that input folded into the kernel's prologue. The first node of the pack is where it runs; the
// others are claimed (registry.cuh) and skipped when the node loop reaches them.

#include "window-util.cuh"

#include "gemv.cuh"


struct flashrt_gemv_pack {
    int  n = 0;                            // MUL_MAT nodes, ascending
    int  nodes[FRT_GEMV_MAX_SEGMENTS] = {};
    // Norm-fed packs only: computed at its own node (a launch of its own, norm in the prologue),
    // because the allocator lends its output's memory to nodes before it.
    bool there[FRT_GEMV_MAX_SEGMENTS] = {};
    int  norm = -1;                        // the RMS_NORM node folded into the prologue, or -1
    // Norm-fed packs only: the launch writes the normed value too (the norm's weight MUL), for
    // readers it does not take; it is written at the norm, where the MUL would compute it.
    bool keep_normed = false;
    // Routed experts' packs only: the SOFT_MAX whose top-k run (window MOE_TOPK) the launch
    // computes, or -1 (the ids come from the graph).
    int  routing = -1;
    // Routed experts' down packs only (with the shared expert's down beside): the MOE_TAIL run
    // right after them (its anchor, the MUL of the experts by their weights) that the launch
    // computes too (frt_gemv_args::tail), or -1; while matching, its nodes that launch anything.
    int  tail = -1;
    int  n_tail_nodes = 0;
    int  tail_nodes[FLASHRT_MAX_CLAIMED] = {};
};

// Decode only: at most this many tokens; larger batches run stock. The kernel takes up to
// FRT_GEMV_MAX_TOKENS (speculative verify), but v1 is slower than stock from 2 tokens on
// (bench/results/2026-11-30-fcb4a49-h200-decode-gemv-v1): those batches fall back until it is not.
constexpr int FLASHRT_GEMV_MAX_TOKENS = 1;
// The LM head alone, with GGML_FLASHRT_HEAD_BATCH=1 (experiment): up to this many tokens (a
// server's batched decode), on the register kernel; its output is amplified by nothing, so it
// needs no stock bits, and gemv-bench has the register kernel ahead of stock's mmvq there.
constexpr int FLASHRT_GEMV_HEAD_MAX_TOKENS = 8;

// Why the dense MUL_MAT `mm` cannot be a segment reading `input` (nullptr: it can).
const char * flashrt_gemv_segment_miss(const ggml_tensor * mm, const ggml_tensor * input);

// Every node that reads cgraph->nodes[value] directly, searched after it: all must be segments
// (MUL_MAT with src[1] == value); fills `pack`. nullptr on success, else why not.
const char * flashrt_gemv_collect_all_consumers(const ggml_cgraph * cgraph, int value, flashrt_gemv_pack & pack);


// Whether pack node p can be computed at node `run_at`: nothing in between may read or write its
// memory, which the allocator may lend out until it is computed, and it must not overlap the
// launch's input, a weight or another output of the pack.
bool flashrt_gemv_early_safe(const ggml_cgraph * cgraph, int run_at, const flashrt_gemv_pack & pack, int p,
                             const ggml_tensor * x);

// The match for a pack that runs at node i covering n_nodes nodes from i, claiming the rest.
flashrt_match flashrt_gemv_match(const flashrt_gemv_pack & pack, int i, int n_nodes);

// The pack back from a match made by flashrt_gemv_match: the matvecs in the run (from i, when the
// run is not a folded norm) and the claimed ones.
flashrt_gemv_pack flashrt_gemv_pack_of(const ggml_cgraph * cgraph, const flashrt_match & m, int i, bool norm_folded);

// Runs the pack's nodes computed at the anchor (not those computed there) on ctx.stream(): x is the launch input (the norm's input when folded).
void flashrt_gemv_run_pack(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack,
                           const char * window);

// Computes one node of a norm-fed pack where it stands (pack.there), norm in the prologue.
void flashrt_gemv_run_there(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int norm, int node,
                            const char * window);

// Handoffs: the kernel that computes a GEMV launch's input also quantizes it (normed first for a
// norm-fed pack) as the launch's prologue would, into the context's image (counters.cuh), and the
// launch copies that image (frt_gemv_args::x_q8) instead of reading x after its wait: the same
// bits, a shorter chain. The norm handoff (GGML_FLASHRT_NORM_HANDOFF=0: off): MOE_TAIL's
// kernel for the next layer's INPROJ or ATTNQKV launch; GDN's (GGML_FLASHRT_GDN_HANDOFF=0: off)
// for ssm_out's.
//
// Whether the pack at the RMS_NORM node `norm` (INPROJ's or ATTNQKV's, window on, exact kernel)
// would take its input quantized; if so, the norm's weight and eps, which the image must use.
bool flashrt_gemv_handoff_wanted(const ggml_cgraph * cgraph, int norm, const float ** weight, float * eps);

// Notes that the kernel just launched on ctx's stream writes at `image` the image of the vector
// at x, normed by the RMS_NORM at node `norm` of cgraph (-1: not normed): a launch of this
// evaluation whose input that is takes it, if it is the next GEMV launch (the note lapses there
// either way). Launches run in the order the host makes them, and a later handoff replaces the
// note before its kernel can write the image again.
void flashrt_gemv_hand_off(const ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int norm, const void * x,
                           const void * image);

// Where a kernel writes the image of a k-value vector it hands the next GEMV launch (the
// context's handoff slot), or nullptr: k not a whole number of K-quant blocks (256) or over
// FRT_X_Q8_MAX_K, or the slot not made (no direct evaluation prepared the counters).
void * flashrt_gemv_handoff_slot(const ggml_backend_cuda_context & ctx, int64_t k);

// Begin-graph hook: the repacked copies of the pack's Q6_K / Q8_0 weights.
void flashrt_gemv_prepare_pack(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph,
                               const flashrt_gemv_pack & pack);

// The pack of a norm-fed window at node i: RMS_NORM, its weight MUL, and every reader of the normed
// value a dense matvec (the norm runs in the kernel's prologue). With `leading` (a window name,
// flashrt_gemv_norm_pack_window), only the dense matvecs of that window's weights that read the
// normed value first, up to its first other reader; the launch keeps the normed value for the
// rest (every matvec then in the launch at the norm). nullptr on a hit, else why not.
const char * flashrt_gemv_match_norm_pack(const ggml_cgraph * cgraph, int i, flashrt_gemv_pack & pack,
                                          const char * leading = nullptr);

// How a same-input pack treats dense matvecs that read the vectors of a routed-experts matvec (the
// shared expert's gate and up read the FFN input that the experts' gate and up read).
enum class flashrt_gemv_fold {
    none,     // they form packs of their own, wherever they are
    leave,    // a dense pack stops before them (SHEXP_FOLD takes them with the experts)
    experts,  // an expert pack at node i takes them (SHEXP_FOLD); it must take at least one
};

// The pack of matvecs at node i (MUL_MAT or MUL_MAT_ID) and the later ones reading the same input
// the same way. nullptr on a hit, else why not.
const char * flashrt_gemv_match_same_input(const ggml_cgraph * cgraph, int i, flashrt_gemv_fold fold,
                                           flashrt_gemv_pack & pack);

// The pack of the routed experts' matvec at node j (as SHEXP_FOLD forms it when that window is on,
// else as MATVEC does) with the top-k run at node `softmax` computed in its launch: on the exact
// kernel only. nullptr on a hit, else why not.
const char * flashrt_gemv_match_routed(const ggml_cgraph * cgraph, int softmax, int j, flashrt_gemv_pack & pack);

// The norm-fed window whose pack a matvec of weight `w` joins, by llama.cpp's GGUF tensor names:
// "INPROJ" (a Gated DeltaNet layer's input projections), "ATTNQKV" (q/k/v), "HEAD" (the LM head,
// or the token embeddings when tied), "ROUTER" (an MoE FFN's router and shared-expert gate
// vector), else nullptr. Also what the graph-optimize hook moves.
const char * flashrt_gemv_norm_pack_window(const ggml_tensor * w);

// Whether any weight of the pack belongs to `window` (flashrt_gemv_norm_pack_window): how the
// norm-fed windows tell a layer's projections apart.
bool flashrt_gemv_pack_reads(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack, const char * window);
