#include "fa4.cuh"

#ifndef FRT_FA4

const char * frt_fa4_unavailable(const frt_fa4_shape &) {
    return "FA4: no ahead-of-time objects in this build (fa4_aot/objects/sm_<arch> for none of its architectures)";
}

cudaError_t frt_fa4_load(const frt_fa4_shape &) {
    return cudaErrorNotSupported;
}

cudaError_t frt_fa4_forward(const frt_fa4_shape &, const frt_fa4_tensor &, const frt_fa4_tensor &, const frt_fa4_tensor &,
                            const frt_fa4_tensor &, float, cudaStream_t) {
    return cudaErrorNotSupported;
}

const char * frt_fa4_summary() {
    return frt_fa4_unavailable(frt_fa4_shape{});
}

#else

// The generated headers leave a parameter unused: not our warning.
#    pragma GCC diagnostic push
#    pragma GCC diagnostic ignored "-Wunused-parameter"
#    include "frt-fa4-modules.h"  // FRT_FA4_MODULES(X): X(name, arch, head_dim, qhead_per_kvhead, causal)
#    pragma GCC diagnostic pop

#    include <mutex>
#    include <string>

// The CuTe DSL's objects call the CUDA runtime through 8 forwarding symbols that its static runtime
// library (libcuda_dialect_runtime_static.a, in a Python wheel) defines; defined here instead, as
// that library defines them (fa4_aot/README.md), so that a build needs no Python package.
extern "C" {
cudaError_t _cudaFuncSetAttribute(const void * func, cudaFuncAttribute attr, int value);
cudaError_t _cudaKernelSetAttributeForDevice(cudaKernel_t kernel, cudaFuncAttribute attr, int value, int device);
cudaError_t _cudaGetDevice(int * device);
cudaError_t _cudaDeviceGetAttribute(int * value, cudaDeviceAttr attr, int device);
cudaError_t _cudaLaunchKernelEx(const cudaLaunchConfig_t * config, const void * func, void ** args);
cudaError_t _cudaLibraryGetKernel(cudaKernel_t * kernel, cudaLibrary_t library, const char * name);
cudaError_t _cudaLibraryLoadData(cudaLibrary_t * library, const void * code, cudaJitOption * jit_options,
                                 void ** jit_values, unsigned int n_jit, cudaLibraryOption * options, void ** values,
                                 unsigned int n_options);
int         _cuKernelGetAttribute(int * value, int attribute, void * kernel, int ordinal);

cudaError_t _cudaFuncSetAttribute(const void * func, cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute(func, attr, value);
}
cudaError_t _cudaKernelSetAttributeForDevice(cudaKernel_t kernel, cudaFuncAttribute attr, int value, int device) {
    return cudaKernelSetAttributeForDevice(kernel, attr, value, device);
}
cudaError_t _cudaGetDevice(int * device) {
    return cudaGetDevice(device);
}
cudaError_t _cudaDeviceGetAttribute(int * value, cudaDeviceAttr attr, int device) {
    return cudaDeviceGetAttribute(value, attr, device);
}
cudaError_t _cudaLaunchKernelEx(const cudaLaunchConfig_t * config, const void * func, void ** args) {
    return cudaLaunchKernelExC(config, func, args);
}
cudaError_t _cudaLibraryGetKernel(cudaKernel_t * kernel, cudaLibrary_t library, const char * name) {
    return cudaLibraryGetKernel(kernel, library, name);
}
cudaError_t _cudaLibraryLoadData(cudaLibrary_t * library, const void * code, cudaJitOption * jit_options,
                                 void ** jit_values, unsigned int n_jit, cudaLibraryOption * options, void ** values,
                                 unsigned int n_options) {
    return cudaLibraryLoadData(library, code, jit_options, jit_values, n_jit, options, values, n_options);
}
// cuKernelGetAttribute(value, attribute, kernel, device) with a device ordinal, through the driver
// entry points cudart hands out (no link against libcuda); CUDA_ERROR_UNKNOWN when they are missing.
int _cuKernelGetAttribute(int * value, int attribute, void * kernel, int ordinal) {
    using device_get_t    = int (*)(int *, int);
    using kernel_attr_t   = int (*)(int *, int, void *, int);
    static device_get_t  device_get  = nullptr;
    static kernel_attr_t kernel_attr = nullptr;
    static std::once_flag once;
    std::call_once(once, [] {
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        void *                          fn    = nullptr;
        if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &fn, 12000, cudaEnableDefault, &found) == cudaSuccess &&
            found == cudaDriverEntryPointSuccess) {
            device_get = (device_get_t) fn;
        }
        if (cudaGetDriverEntryPointByVersion("cuKernelGetAttribute", &fn, 12000, cudaEnableDefault, &found) ==
                cudaSuccess &&
            found == cudaDriverEntryPointSuccess) {
            kernel_attr = (kernel_attr_t) fn;
        }
    });
    constexpr int unknown = 999;  // CUDA_ERROR_UNKNOWN, as the DSL's runtime answers
    int           device  = 0;
    if (device_get == nullptr || kernel_attr == nullptr || device_get(&device, ordinal) != 0) {
        return unknown;
    }
    return kernel_attr(value, attribute, kernel, device);
}
}

static constexpr int max_devices = 16;

struct fa4_module {
    const char * name;
    int          arch;  // compute capability x 10 (90: sm_90a)
    frt_fa4_shape shape;
    void (*init)(void **);
    void (*load_to_device)(void **);
    int32_t (*run)(cudaLibrary_t, const frt_fa4_tensor &, const frt_fa4_tensor &, const frt_fa4_tensor &,
                   const frt_fa4_tensor &, float, cudaStream_t);
    cudaLibrary_t library = nullptr;  // after init (once a process)
    bool          loaded[max_devices] = {};
};

// A generated tensor type from ours (they share the layout: data, 3 sizes, 3 strides).
template <typename T> static T fa4_tensor_of(const frt_fa4_tensor & t) {
    T out;
    out.data               = t.data;
    out.dynamic_shapes[0]  = t.batch;
    out.dynamic_shapes[1]  = t.seq;
    out.dynamic_shapes[2]  = t.heads;
    out.dynamic_strides[0] = t.stride_batch;
    out.dynamic_strides[1] = t.stride_seq;
    out.dynamic_strides[2] = t.stride_head;
    return out;
}

#    define FRT_FA4_RUN(name, arch, head_dim, qhead_per_kvhead, causal)                                                \
        static int32_t run_##name(cudaLibrary_t library, const frt_fa4_tensor & q, const frt_fa4_tensor & k,                  \
                           const frt_fa4_tensor & v, const frt_fa4_tensor & o, float scale, cudaStream_t stream) {     \
            name##_Kernel_Module_t module = { library };                                                               \
            name##_Tensor_mQ_t     mq     = fa4_tensor_of<name##_Tensor_mQ_t>(q);                                      \
            name##_Tensor_mK_t     mk     = fa4_tensor_of<name##_Tensor_mK_t>(k);                                      \
            name##_Tensor_mV_t     mv     = fa4_tensor_of<name##_Tensor_mV_t>(v);                                      \
            name##_Tensor_mO_t     mo     = fa4_tensor_of<name##_Tensor_mO_t>(o);                                      \
            return cute_dsl_##name##_wrapper(&module, &mq, &mk, &mv, &mo, scale, stream);                              \
        }
FRT_FA4_MODULES(FRT_FA4_RUN)
#    undef FRT_FA4_RUN

#    define FRT_FA4_ENTRY(name, arch, head_dim, qhead_per_kvhead, causal) \
        { #name, arch, { head_dim, qhead_per_kvhead, causal }, _mlir_##name##_cuda_init, _mlir_##name##_cuda_load_to_device, run_##name },
static fa4_module fa4_modules[] = { FRT_FA4_MODULES(FRT_FA4_ENTRY) };
#    undef FRT_FA4_ENTRY

static std::mutex fa4_mutex;  // loading

// The current device's compute capability x 10, or -1.
static int fa4_device_arch(int & device) {
    int major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        return -1;
    }
    return 10 * major + minor;
}

static fa4_module * fa4_find(const frt_fa4_shape & shape, int arch) {
    for (fa4_module & m : fa4_modules) {
        if (m.arch == arch && m.shape.head_dim == shape.head_dim && m.shape.qhead_per_kvhead == shape.qhead_per_kvhead &&
            m.shape.causal == shape.causal) {
            return &m;
        }
    }
    return nullptr;
}

const char * frt_fa4_unavailable(const frt_fa4_shape & shape) {
    int device = 0;
    const int arch = fa4_device_arch(device);
    if (arch < 0) {
        return "FA4: no current CUDA device";
    }
    if (fa4_find(shape, arch) != nullptr) {
        return nullptr;
    }
    for (const fa4_module & m : fa4_modules) {
        if (m.arch == arch) {
            return "FA4: no module of this head dimension, head ratio and causality for this architecture "
                   "(add one to fa4_aot/manifest.toml and run cargo xtask fa4-aot)";
        }
    }
    return "FA4: no module for this device's architecture in this build";
}

cudaError_t frt_fa4_load(const frt_fa4_shape & shape) {
    int       device = 0;
    const int arch   = fa4_device_arch(device);
    fa4_module * m   = arch < 0 ? nullptr : fa4_find(shape, arch);
    if (m == nullptr || device < 0 || device >= max_devices) {
        return cudaErrorNotSupported;
    }
    std::lock_guard<std::mutex> lock(fa4_mutex);
    if (m->loaded[device]) {
        return cudaSuccess;
    }
    // The generated Module_Load, for this device only (it loads on every device there is).
    cudaLibrary_t * library = &m->library;
    cudaError_t     ret     = cudaSuccess;
    if (m->library == nullptr) {
        struct {
            cudaLibrary_t ** library;
            cudaError_t *    ret;
        } init_args = { &library, &ret };
        m->init((void **) &init_args);
        if (ret != cudaSuccess) {
            m->library = nullptr;
            return ret;
        }
    }
    int32_t device_id = device;
    struct {
        cudaLibrary_t ** library;
        int32_t *        device_id;
        cudaError_t *    ret;
    } load_args = { &library, &device_id, &ret };
    m->load_to_device((void **) &load_args);
    if (ret == cudaSuccess) {
        m->loaded[device] = true;
    }
    return ret;
}

cudaError_t frt_fa4_forward(const frt_fa4_shape & shape, const frt_fa4_tensor & q, const frt_fa4_tensor & k,
                            const frt_fa4_tensor & v, const frt_fa4_tensor & o, float scale, cudaStream_t stream) {
    int       device = 0;
    const int arch   = fa4_device_arch(device);
    fa4_module * m   = arch < 0 ? nullptr : fa4_find(shape, arch);
    if (m == nullptr || device < 0 || device >= max_devices || !m->loaded[device]) {
        return cudaErrorNotSupported;
    }
    return (cudaError_t) m->run(m->library, q, k, v, o, scale, stream);  // the launch's error
}

const char * frt_fa4_summary() {
    static const std::string line = [] {
        std::string s = "FA4 modules linked:";
        for (const fa4_module & m : fa4_modules) {
            s += " ";
            s += m.name;
        }
        return s;
    }();
    return line.c_str();
}

#endif  // FRT_FA4
