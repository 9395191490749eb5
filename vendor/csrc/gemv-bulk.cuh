#pragma once

// Internals of frt_gemv's bulk kernel (gemv-bulk.cu; planned in gemv.cu). Design in gemv.cuh,
// "Bulk kernel".

#include "gemv-impl.cuh"

// Consumer warps of a block, and one producer warp: 16 warps, 4 an SM sub-partition at 128
// registers each (13 to 16 warps all get 128).
static constexpr int kBulkWarps     = 15;
static constexpr int kBulkThreads   = 32 * (kBulkWarps + 1);
static constexpr int kBulkItems     = 4;      // items a lane loads before it multiplies them
static constexpr int kBulkStageWant = 32768;  // bytes a stage is sized for
static constexpr int kBulkMaxStages = 16;
static constexpr int kBulkSlack     = 16;     // the staged Q8_0 decoder reads up to 2 bytes past a chunk
static constexpr int kBulkStatic    = 2048;   // static shared memory: barriers, chunk flags and ring, prologue sums

struct bulk_seg {
    const uint8_t * w;
    float *         out;
    const float *   residual;
    const int32_t * ids;
    int64_t         row_stride, out_stride, residual_stride, ids_stride, expert_stride;
    int64_t         bytes_begin;  // bytes of the launch's segments before this one
    int64_t         inst_bytes;   // bytes of one instance: rows x row_stride
    int             type, rows, epilogue, n_used, n_experts, n_inst, x_per_token;
    int             quantum;     // chunks start at multiples of this many rows (16-byte aligned copies)
    int             chunk_rows;  // rows of a full chunk: a multiple of quantum (and, where a stage holds them,
                                 // of the rows all consumer warps take at once)
    int             units;       // quanta an instance: ceil(rows / quantum)
    int             staged;      // GGUF Q6_K/Q8_0: decoded block by block (gemv_staged_*), else item by item
    int             units_per_row, lpr, ipl;  // items: per row, lanes a row, items a lane
    int             mma;    // Q4_K rows on the tensor cores (bulk_q4k_mma_rows), 16 rows a tile
    int             pitch;      // bytes between rows in a stage (row_stride, or a bank-spreading pitch for mma)
    int             row_bytes;  // bytes of a row (copied row by row when pitch != row_stride)
};

struct bulk_params {
    gemv_x_in x;
    int       n_segments, direct, stages, stage_bytes;  // direct: the item type (-1: none)
    int       smem_xq, smem_xm, smem_xf, smem_part, smem_stage;  // smem_part: a stage's mma partial sums each
    int       part_bytes;                                        // of part_bytes
    int64_t   total_bytes;
    int       lab;  // FRT_GEMV_BULK_LAB (experiments, bench only): 1 no math, 4 no stores
    bulk_seg  seg[FRT_GEMV_MAX_SEGMENTS];
};

// nullptr and the plan with its dynamic shared memory, or why the bulk kernel does not take `a`
// (gemv.cu). smem_optin: the most dynamic shared memory a block of the device may have; sms: its
// SMs (one block each).
const char * frt_gemv_bulk_plan(const frt_gemv_args & a, int smem_optin, int sms, bulk_params & p, int & smem);

// Launches the bulk kernel (gemv-bulk.cu); cudaErrorInvalidValue when the plan refuses `a`,
// cudaErrorNotSupported before sm_90.
cudaError_t frt_gemv_bulk_launch(const frt_gemv_args & a, cudaStream_t stream);
