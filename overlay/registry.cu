#include "registry.cuh"

// No window is registered yet: the runtime (switches, diagnostics, repack cache) and the first
// windows come with the next step. Every node runs on stock kernels.
static const flashrt_window * const flashrt_registry = nullptr;
static const int flashrt_registry_size = 0;

const flashrt_window * flashrt_windows(int * n_windows) {
    *n_windows = flashrt_registry_size;
    return flashrt_registry;
}
