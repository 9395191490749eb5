#pragma once

// FlashRT runtime switches. Plain C++ (no CUDA) so that the precedence rules are unit-tested on
// any machine (tests/test-switches.cpp).
//
// Most specific wins:
//   GGML_CUDA_FLASHRT_DISABLE=1    the whole layer off: every node runs on stock kernels
//   GGML_FLASHRT_NO_<NAME>=1       window <NAME> off
//   FRT_<NAME>_SWAP=0|1            window <NAME> forced off|on, whatever its tier
//   (unset)                        the tier default: safe on, full and archive off
// Values other than 0 and 1 are reported once and ignored, as are switches naming no window.

#include <string>
#include <vector>

enum class flashrt_tier {
    safe,     // on by default, quality-neutral
    full,     // opt-in, may trade accuracy for speed
    archive,  // opt-in, kept for A/B comparisons
};

const char * flashrt_tier_name(flashrt_tier tier);

// Looks up an environment variable (getenv in production, a table in tests).
using flashrt_env_lookup = const char * (*)(const char * name, void * user);

struct flashrt_switch {
    bool        enabled;
    std::string reason;  // which rule decided, e.g. "FRT_X_SWAP=1" or "tier safe"
};

// The whole layer: true when GGML_CUDA_FLASHRT_DISABLE=1.
bool flashrt_layer_disabled(flashrt_env_lookup env, void * user, std::vector<std::string> & warnings);

// One window's state. `name` is the switch key (upper case, e.g. GDN_GATED_NORM).
flashrt_switch flashrt_window_switch(const char * name, flashrt_tier tier, flashrt_env_lookup env, void * user,
                                     std::vector<std::string> & warnings);

// Switch variables in `environment` ("KEY=VALUE" strings) that name no known window.
std::vector<std::string> flashrt_unknown_switches(const std::vector<std::string> & environment,
                                                  const std::vector<std::string> & window_names);
