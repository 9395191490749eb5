#include "registry.cuh"
#include "windows/gdn-gated-norm.cuh"
#include "windows/shexp-gate.cuh"

const char * const flashrt_miss_anchor = "anchor op";

static const flashrt_window flashrt_registry[] = {
    { "GDN_GATED_NORM", flashrt_tier::safe, 900, flashrt_match_gdn_gated_norm, flashrt_run_gdn_gated_norm, nullptr },
    // full: no measured gain on qwen36 decode, and F16 gates differ from stock (docs/perf-notes.md).
    { "SHEXP_GATE", flashrt_tier::full, 900, flashrt_match_shexp_gate, flashrt_run_shexp_gate,
      flashrt_prepare_shexp_gate },
};

const flashrt_window * flashrt_windows(int * n_windows) {
    *n_windows = (int) (sizeof(flashrt_registry) / sizeof(flashrt_registry[0]));
    return flashrt_registry;
}
