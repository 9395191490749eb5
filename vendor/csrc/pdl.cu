#include "pdl.cuh"
#include "env-switch.cuh"

bool frt_pdl_enabled() {
    static const bool enabled = frt_env_flag("GGML_CUDA_PDL", true);
    return enabled;
}

bool frt_pdl_early_dependents() {
    static const bool early = frt_env_flag("GGML_FLASHRT_EARLY_DEPENDENTS", true);
    return early;
}
