#pragma once

// Programmatic dependent launch (PDL, sm_90 and newer). ggml-cuda launches its kernels with PDL,
// so at decode each kernel starts while its predecessor is still finishing and only waits, at
// griddepcontrol.wait, before it reads what the predecessor wrote. A kernel of ours launched
// plainly breaks that chain twice: it cannot start early, and the kernel after it starts late.
//
// Contract of every kernel launched through frt_launch: call frt_pdl_wait() before the first read
// of anything an earlier kernel in the stream writes (activations, ids, state), and before the
// first global write. Reads of data nothing on the stream writes (model weights) may come first:
// that is the point. frt_pdl_launch_dependents() lets the next kernel start its own prologue; its
// wait still covers all of this kernel's writes, so it may come before them.

#include <cuda_runtime.h>

#include <mutex>
#include <utility>

static __device__ __forceinline__ void frt_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void frt_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Whether launches use PDL: like ggml-cuda, on unless GGML_CUDA_PDL=0.
bool frt_pdl_enabled();

// Whether the short kernels that precede a GEMV launch (MOE_TAIL's, GDN's one-launch kernel) let
// their dependents start at their own start rather than near their end, so that the GEMV's blocks
// stage their weights meanwhile. On unless GGML_FLASHRT_EARLY_DEPENDENTS=0 (measured with MOE_TOPK
// and ATTN_ROPE: bench/results/2026-12-01-75c99d4-h200-topk-rope-early).
bool frt_pdl_early_dependents();

// Launches `kernel` on `stream`, with PDL when enabled and, when cluster_x > 1, as thread-block
// clusters of cluster_x blocks along x; returns the launch error. Capture-safe.
template <typename... Params, typename... Args>
cudaError_t frt_launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                 unsigned cluster_x, Args &&... args) {
    cudaLaunchAttribute attrs[2] = {};
    unsigned            n        = 0;
    if (cluster_x > 1) {
        attrs[n].id               = cudaLaunchAttributeClusterDimension;
        attrs[n].val.clusterDim.x = cluster_x;
        attrs[n].val.clusterDim.y = 1;
        attrs[n].val.clusterDim.z = 1;
        ++n;
    }
    if (frt_pdl_enabled()) {
        attrs[n].id                                         = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n].val.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim            = grid;
    cfg.blockDim           = block;
    cfg.dynamicSmemBytes   = smem;
    cfg.stream             = stream;
    cfg.attrs              = attrs;
    cfg.numAttrs           = n;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// Launches `kernel` on `stream`, with PDL when enabled; returns the launch error. Capture-safe.
template <typename... Params, typename... Args>
cudaError_t frt_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args &&... args) {
    return frt_launch_clustered(kernel, grid, block, smem, stream, 1, std::forward<Args>(args)...);
}

// Once per (kernel, device): allow `bytes` of dynamic shared memory (beyond the 48 KB default),
// the most a launch of KERNEL may ask for (the launch's own size decides the occupancy). Devices
// beyond frt_max_devices ask every time.
constexpr int frt_max_devices = 16;
template <auto KERNEL> cudaError_t frt_allow_smem(int device, int bytes) {
    static std::once_flag once[frt_max_devices];
    static cudaError_t    result[frt_max_devices];
    const auto set = [bytes] {
        return cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    };
    if (device < 0 || device >= frt_max_devices) {
        return set();
    }
    std::call_once(once[device], [&] { result[device] = set(); });
    return result[device];
}
