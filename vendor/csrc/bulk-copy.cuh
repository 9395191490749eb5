#pragma once

// mbarriers and the bulk-copy engine (cp.async.bulk, sm_90 and newer), for the kernels that stage
// weights into shared memory with it (the bulk GEMV kernel), and the evict-first L2 policy their
// copies and the exact kernel's cp.async copies carry. On older architectures the functions
// compile to nothing.

#include <cstdint>

static __device__ __forceinline__ uint32_t bulk_smem_addr(const void * p) {
    return (uint32_t) __cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void bulk_bar_init(uint64_t * bar, int count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bulk_smem_addr(bar)), "r"(count) : "memory");
#endif
}

// Makes the initialised barriers visible to the copy engine (the async proxy).
static __device__ __forceinline__ void bulk_bar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

static __device__ __forceinline__ void bulk_bar_arrive(uint64_t * bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.shared::cta.b64 state, [%0];\n\t}" ::"r"(
                     bulk_smem_addr(bar))
                 : "memory");
#endif
}

// Arrives and announces `bytes` that copies completing on this barrier will bring.
static __device__ __forceinline__ void bulk_bar_arrive_expect(uint64_t * bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n\t}" ::"r"(
                     bulk_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
#endif
}

// Waits for the completion of the barrier's phase of parity `parity`.
static __device__ __forceinline__ void bulk_bar_wait(uint64_t * bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(bulk_smem_addr(bar)), "r"(parity)
            : "memory");
    } while (!done);
#endif
}

// The copy engine moves `bytes` (a multiple of 16) from global src to shared dst (both 16-byte
// aligned) and completes them on `bar`. The weights are read once a step: they should not push
// the activations out of L2 (evict-first).
static __device__ __forceinline__ void bulk_copy(uint8_t * dst, const uint8_t * src, uint32_t bytes, uint64_t * bar,
                                                 uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
            "r"(bulk_smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(bulk_smem_addr(bar)), "l"(policy)
        : "memory");
#endif
}

static __device__ __forceinline__ uint64_t bulk_evict_first_policy() {
    uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
    return policy;
}
