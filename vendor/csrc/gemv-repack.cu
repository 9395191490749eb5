#include "gemv.cuh"
#include "pdl.cuh"

// GGUF Q6_K / Q8_0 rows into the repacked layouts of gemv.cuh, one thread a block with byte copies:
// it runs once per weight tensor, before CUDA graph capture, so simplicity beats speed here.

static constexpr int kRepackThreads = 256;

// Q6_K_R row: per block [ql 128][qh 64][scales in pairs (s[8h+j], s[8h+j+4]) for q = 4h + j], then
// the row's d (2 bytes a block), then zeros up to the padded row size.
static __global__ void frt_gemv_repack_q6_k(const uint8_t * src, int64_t src_row_stride, int rows, int nb,
                                            uint8_t * dst, int64_t dst_row_bytes) {
    frt_pdl_wait();
    const int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x;
    if (i >= (int64_t) rows * nb) {
        return;
    }
    const int64_t   row  = i / nb;
    const int       b    = (int) (i % nb);
    const uint8_t * s    = src + row * src_row_stride + 210 * b;
    uint8_t *       drow = dst + row * dst_row_bytes;
    uint8_t *       d    = drow + 208 * b;
    for (int j = 0; j < 192; ++j) {
        d[j] = s[j];
    }
    for (int q = 0; q < 8; ++q) {
        const int lo     = 8 * (q >> 2) + (q & 3);
        d[192 + 2 * q]     = s[192 + lo];
        d[192 + 2 * q + 1] = s[192 + lo + 4];
    }
    drow[208 * nb + 2 * b]     = s[208];
    drow[208 * nb + 2 * b + 1] = s[209];
    if (b == 0) {
        for (int64_t j = 210 * (int64_t) nb; j < dst_row_bytes; ++j) {
            drow[j] = 0;
        }
    }
}

// Q8_0_R row: the quants of every block (32 bytes each), then the row's d (2 bytes a block).
static __global__ void frt_gemv_repack_q8_0(const uint8_t * src, int64_t src_row_stride, int rows, int nb,
                                            uint8_t * dst, int64_t dst_row_bytes) {
    frt_pdl_wait();
    const int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x;
    if (i >= (int64_t) rows * nb) {
        return;
    }
    const int64_t   row  = i / nb;
    const int       b    = (int) (i % nb);
    const uint8_t * s    = src + row * src_row_stride + 34 * b;
    uint8_t *       drow = dst + row * dst_row_bytes;
    for (int j = 0; j < 32; ++j) {
        drow[32 * b + j] = s[2 + j];
    }
    drow[32 * nb + 2 * b]     = s[0];
    drow[32 * nb + 2 * b + 1] = s[1];
}

cudaError_t frt_gemv_repack(frt_gemv_type type, const void * src, int64_t src_row_stride, int rows, int k, void * dst,
                            cudaStream_t stream) {
    if ((type != FRT_GEMV_Q6_K && type != FRT_GEMV_Q8_0) || k <= 0 || k % 256 != 0 || rows < 1 || src == nullptr ||
        dst == nullptr || (uintptr_t) dst % 16 != 0 || src_row_stride < frt_gemv_row_bytes(type, k)) {
        return cudaErrorInvalidValue;
    }
    const int     nb        = type == FRT_GEMV_Q6_K ? k / 256 : k / 32;
    const int64_t dst_row   = frt_gemv_row_bytes(frt_gemv_repacked_type(type), k);
    const int64_t n_threads = (int64_t) rows * nb;
    const dim3    grid((unsigned) ((n_threads + kRepackThreads - 1) / kRepackThreads));
    const auto *  s         = (const uint8_t *) src;
    auto *        d         = (uint8_t *) dst;
    if (type == FRT_GEMV_Q6_K) {
        return frt_launch(frt_gemv_repack_q6_k, grid, dim3(kRepackThreads), 0, stream, s, src_row_stride, rows, nb, d,
                          dst_row);
    }
    return frt_launch(frt_gemv_repack_q8_0, grid, dim3(kRepackThreads), 0, stream, s, src_row_stride, rows, nb, d,
                      dst_row);
}
