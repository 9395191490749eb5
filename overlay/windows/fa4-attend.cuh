#pragma once

// What the FA4 windows (PREFILL_FA4, VIT_FA4) share: the checks of a FLASH_ATTN_EXT node that any
// FA4 module needs, and the run through one (vendor/csrc/fa4: Q to F16, the module, the output
// back to F32).

#include "../registry.cuh"
#include "fa4.cuh"

// Why node `fa` (FLASH_ATTN_EXT) cannot run on FA4 whatever its mask, or nullptr: F32 Q (columns
// contiguous), F16 K and V of 16-byte aligned rows, F32 contiguous output, one stream, no sinks,
// ALiBi or softcap, equal head sizes, a whole number of query heads per key/value head, at least
// `min_tokens` queries. Fills `shape` (causal as given) on success, and checks that a module of it
// is linked for this device.
const char * flashrt_fa4_node_miss(const ggml_tensor * fa, int64_t min_tokens, bool causal, frt_fa4_shape & shape);

// The module shape node fa asks for (after flashrt_fa4_node_miss accepted it, as a window's run
// knows).
frt_fa4_shape flashrt_fa4_shape_of(const ggml_tensor * fa, bool causal);

// Loads the module of `shape` on this device for window `window` (its begin-graph prepare, outside
// capture); a failure is reported once a call on the log, and the window's runs then fall back.
void flashrt_fa4_load_for(const char * window, const frt_fa4_shape & shape);

// Computes node fa through the module of `shape` (loaded on this device by frt_fa4_load) over the
// first `n_kv` keys and values. Returns false when the module is not loaded (nothing is computed:
// the caller runs stock's flash attention). Capture-safe.
bool flashrt_fa4_attend(ggml_backend_cuda_context & ctx, ggml_tensor * fa, const frt_fa4_shape & shape, int64_t n_kv);
