
#pragma once

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdio.h>
#include <stdint.h>


// Macro to check for cuda errors.
#ifndef CUTE_DSL_CUDA_ERROR_CHECK
#define CUTE_DSL_CUDA_ERROR_CHECK(err) { \
    if ((err) != cudaSuccess) { \
        printf("Got Cuda Error %s: %s\n", cudaGetErrorName(err), cudaGetErrorString(err)); \
    } \
}

#endif

typedef struct {
    cudaLibrary_t module;
} frt_fa4_sm90a_f16_hd80_mha_Kernel_Module_t;

#ifdef __cplusplus
extern "C" {
#endif
void _mlir_frt_fa4_sm90a_f16_hd80_mha_cuda_init(void **);
void _mlir_frt_fa4_sm90a_f16_hd80_mha_cuda_load_to_device(void **);
static inline void frt_fa4_sm90a_f16_hd80_mha_Kernel_Module_Load(frt_fa4_sm90a_f16_hd80_mha_Kernel_Module_t *module) {
    cudaLibrary_t *libraryPtr = &(module->module);
    cudaError_t ret = cudaSuccess;
    struct {
        cudaLibrary_t **libraryPtr;
        cudaError_t *ret;
    } initArgs = {&libraryPtr, &ret};
    _mlir_frt_fa4_sm90a_f16_hd80_mha_cuda_init((void **)(&initArgs));
    CUTE_DSL_CUDA_ERROR_CHECK(ret);
    int32_t device_id = 0;
    struct {
        cudaLibrary_t **library;
        int32_t *device_id;
        cudaError_t *ret;
    } loadArgs = {&libraryPtr, &device_id, &ret};
    int32_t device_count;
    CUTE_DSL_CUDA_ERROR_CHECK(cudaGetDeviceCount(&device_count));
    for (int32_t i = 0; i < device_count; i++) {
        device_id = i;
        _mlir_frt_fa4_sm90a_f16_hd80_mha_cuda_load_to_device((void **)(&loadArgs));
        CUTE_DSL_CUDA_ERROR_CHECK(ret);
    }
}

static inline void frt_fa4_sm90a_f16_hd80_mha_Kernel_Module_Unload(frt_fa4_sm90a_f16_hd80_mha_Kernel_Module_t *module) {
    CUTE_DSL_CUDA_ERROR_CHECK(cudaLibraryUnload(module->module));
}

#ifdef __cplusplus
}
#endif

typedef struct {
    void *data;
    int32_t dynamic_shapes[3];
    int64_t dynamic_strides[3];
} frt_fa4_sm90a_f16_hd80_mha_Tensor_mQ_t;


typedef struct {
    void *data;
    int32_t dynamic_shapes[3];
    int64_t dynamic_strides[3];
} frt_fa4_sm90a_f16_hd80_mha_Tensor_mK_t;


typedef struct {
    void *data;
    int32_t dynamic_shapes[3];
    int64_t dynamic_strides[3];
} frt_fa4_sm90a_f16_hd80_mha_Tensor_mV_t;


typedef struct {
    void *data;
    int32_t dynamic_shapes[3];
    int64_t dynamic_strides[3];
} frt_fa4_sm90a_f16_hd80_mha_Tensor_mO_t;

#ifdef __cplusplus
extern "C"
#endif
void _mlir_frt_fa4_sm90a_f16_hd80_mha__mlir_ciface_cutlass_entry_FakeTensorFloat16div1div1div180i64div8i64div8i64div81_FakeTensorFloat16div1div1div180i64div8i64div8i64div81_FakeTensorFloat16div1div1div180i64div8i64div8i64div81_Fake(void **args, int32_t num_args);

static inline int32_t cute_dsl_frt_fa4_sm90a_f16_hd80_mha_wrapper(frt_fa4_sm90a_f16_hd80_mha_Kernel_Module_t *module, frt_fa4_sm90a_f16_hd80_mha_Tensor_mQ_t *mQ, frt_fa4_sm90a_f16_hd80_mha_Tensor_mK_t *mK, frt_fa4_sm90a_f16_hd80_mha_Tensor_mV_t *mV, frt_fa4_sm90a_f16_hd80_mha_Tensor_mO_t *mO, float softmax_scale, cudaStream_t stream) {
    int32_t ret = 0;
    void *args[7] = {
        mQ, mK, mV, mO, &softmax_scale, &stream,
        &ret
    };
    _mlir_frt_fa4_sm90a_f16_hd80_mha__mlir_ciface_cutlass_entry_FakeTensorFloat16div1div1div180i64div8i64div8i64div81_FakeTensorFloat16div1div1div180i64div8i64div8i64div81_FakeTensorFloat16div1div1div180i64div8i64div8i64div81_Fake(args, 7);
    return ret;
}
