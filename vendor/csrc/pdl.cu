#include "pdl.cuh"

#include <cstdlib>

bool frt_pdl_enabled() {
    static const bool enabled = [] {
        const char * env = std::getenv("GGML_CUDA_PDL");
        return env == nullptr || std::atoi(env) != 0;
    }();
    return enabled;
}

bool frt_pdl_early_dependents() {
    static const bool early = [] {
        const char * env = std::getenv("GGML_FLASHRT_EARLY_DEPENDENTS");
        return env == nullptr || std::atoi(env) != 0;
    }();
    return early;
}
