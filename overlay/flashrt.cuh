#pragma once

// FlashRT overlay: the entry points that ggml-cuda calls (patch 0002), both compiled only with
// -DGGML_CUDA_FLASHRT=ON. Declarations only, so that ggml-cuda.cu can include this header from
// wherever the overlay is mounted.

struct ggml_backend_cuda_context;
struct ggml_cgraph;

// Called for every graph compute before ggml-cuda starts a CUDA graph capture (and also when it
// replays or evaluates without capture). Anything that allocates, synchronizes or loads modules
// belongs here, never in a window's run. node_loop: whether the node loop will run (a capture or
// an evaluation without capture); a replay of a captured graph runs none and needs nothing, so
// decode pays no host time here. Returns false when this evaluation must run without a CUDA graph
// (ggml-cuda then evaluates it directly): a window that reads an input on the host at each
// evaluation (PREFILL_FA4's mask) could not vouch for a replay.
bool ggml_cuda_flashrt_begin_graph(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, bool node_loop);

// Called in the node loop right before ggml_cuda_try_fuse. Returns how many nodes from i on the
// overlay consumed, node i included: a window that matched at i and ran, or a node that a window
// already computed earlier in the pass (1). 0 leaves node i to the stock path. Capture-safe.
int ggml_cuda_flashrt_try_window(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i);

// Called from ggml-cuda's graph_optimize, before the scheduler plans the graph's memory: may
// reorder cgraph's nodes (a valid order: every node after its sources), never anything else.
void ggml_cuda_flashrt_graph_optimize(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph);

// Called when a CUDA backend context is destroyed: frees what the overlay holds for it (repacked
// weights).
void ggml_cuda_flashrt_free_context(ggml_backend_cuda_context & ctx);
