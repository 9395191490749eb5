#pragma once

// Attention of a decode step over an F16 cache: for each query token t and query head h
// (key/value head h / (heads / heads_kv)),
//   out[t][h] = softmax_c(scale * q[t][h] . k[c] + mask[t][c]) . v[c]      over cells c < n_kv
// Up to FRT_ATTN_DECODE_MAX_KV cells, one kernel: a thread-block cluster of FRT_ATTN_DECODE_SPLIT
// blocks a key/value head. Block r takes the r-th run of cells (at most 128), copies their K and V
// rows into shared memory in one go, and stores a partial softmax (max, sum, weighted V) per query
// row of the head into the shared memory of the block that combines that row; after a cluster
// barrier block r combines query rows r, r + SPLIT, ... from its own shared memory. No scratch in
// global memory, no counters, no second kernel. Scores, softmax and sums in float from
// F16 K and V; not stock's order of summation (stock's flash attention is not bit-stable across
// its own kernels either).
//
// Optionally multiplies the output by sigmoid(gate) (frt_attn_decode_args::gate) as it writes it.
//
// Longer caches (up to FRT_ATTN_DECODE_MAX_KV_LONG cells): the split kernels. Independent blocks,
// as many as one wave of the SMs takes (up to 192 cells each), each over its run of cells of one
// key/value head for all the head's query rows: the rows asked of L2 before the PDL wait, copied
// into shared memory, scored by warps holding 8 query rows in registers (a reduce-scatter over the
// warp leaves one cell and row's score a lane), their softmax, the weighted V; each row's partial
// (max, sum, weighted V) goes to a scratch buffer, and a second kernel combines a row's chunks in a
// fixed order (the same bits launch after launch) and applies the gate.
//
// Cells no query row sees may hold anything (an unused cache row: even NaN); a cell some row sees
// must hold finite K and V (it is a written row), whichever rows it is hidden from.
//
// Plain pointers and strides (elements), no ggml types. out must not overlap any input, except Q
// or the gate element for element (each element of out at the address of the same element of Q or
// of the gate): a cluster writes its query rows only after its barrier, and Q's rows of a key/value
// head are read only by that head's cluster, before it; each gate value only by the lane that
// writes the same element, before. The split kernels write out only in the second kernel, after
// the first has read Q.

#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

constexpr int FRT_ATTN_DECODE_MAX_TOKENS = 8;
constexpr int FRT_ATTN_DECODE_SPLIT      = 8;     // blocks a key/value head (a portable cluster)
constexpr int FRT_ATTN_DECODE_MAX_KV     = 1024;  // one cluster a key/value head, 128 cells a block
constexpr int FRT_ATTN_DECODE_MAX_KV_LONG = 32768; // the split kernels
constexpr int FRT_ATTN_DECODE_MAX_PAIRS  = 64;    // query tokens x query heads of one key/value head

struct frt_attn_decode_args {
    int d;          // 64, 128 or 256
    int heads;      // query heads, a multiple of heads_kv
    int heads_kv;
    int n_q;        // query tokens, 1..FRT_ATTN_DECODE_MAX_TOKENS; n_q x heads / heads_kv <= MAX_PAIRS
    int n_kv;       // cells, 1..FRT_ATTN_DECODE_MAX_KV_LONG

    const float * q;  // head h of token t: q + t*q_token + h*q_head, d contiguous floats
    int64_t       q_token, q_head;
    const __half * k;  // cell c of key/value head g: k + c*k_cell + g*k_head, d contiguous halves
    int64_t        k_cell, k_head;
    const __half * v;
    int64_t        v_cell, v_head;
    const __half * mask;  // query t's row: mask + t*mask_row, n_kv values added to the scores; or nullptr
    int64_t        mask_row;
    float *        out;  // head h of token t: out + t*out_token + h*out_head, d floats
    int64_t        out_token, out_head;
    float          scale;
    // The output gate of qwen35's full-attention layers, or nullptr: out then holds
    // sigmoid(gate) * attention, with ggml-cuda's expressions for SIGMOID and MUL (1 / (1 + expf(-g)),
    // then the product), so the same bits as stock's kernels applied to the ungated output. Element
    // i of head h of token t at gate + t*gate_token + h*gate_head + i.
    const float *  gate;
    int64_t        gate_token, gate_head;
    // The split kernels' partials: frt_attn_decode_scratch_bytes(*this) bytes of device memory
    // (nothing else reads or writes them meanwhile).
    float *        scratch;
    // Caches of at least this many cells take the split kernels; 0: those of more than
    // FRT_ATTN_DECODE_MAX_KV cells (tests and tools set it to time or check them on short caches).
    int            split_from;
    // The most cells a split block takes (0: as many as shared memory holds, up to 192); fewer make
    // more, smaller blocks (tools time both).
    int            split_cells;
};

// Cells a block of the cluster takes (caches of at most FRT_ATTN_DECODE_MAX_KV cells).
__host__ __device__ inline int frt_attn_decode_cells_a_block(int n_kv) {
    return (n_kv + FRT_ATTN_DECODE_SPLIT - 1) / FRT_ATTN_DECODE_SPLIT;
}

// Chunks a key/value head a launch on the current device uses (1: the cluster kernel; more: the
// split kernels' blocks a head), or 0 for a shape the kernels do not take.
int frt_attn_decode_chunks(const frt_attn_decode_args & a);

// Scratch the launch needs (frt_attn_decode_args::scratch): 0 for the cluster kernel.
size_t frt_attn_decode_scratch_bytes(const frt_attn_decode_args & a);

// For tests and tools: how many of the launch's blocks the current device holds at once (the
// occupancy of its clusters or blocks at the launch's shared memory), against the 8 x heads_kv
// (cluster kernel) or chunks x heads_kv (split kernel) it launches; -1 if the device cannot say.
int frt_attn_decode_resident_blocks(const frt_attn_decode_args & a);

// Whether the kernel takes this shape on the current device (nullptr) or why not: its blocks' shared
// memory must fit the device's (a short cache's 128 cells a block do not fit sm_120's 99 KB).
const char * frt_attn_decode_unsupported(int d, int heads, int heads_kv, int n_q, int n_kv);
// The same for a device of `sms` SMs and `smem` bytes of opt-in shared memory a block.
const char * frt_attn_decode_unsupported_on(int d, int heads, int heads_kv, int n_q, int n_kv, int sms, int smem);

// Launches the kernel (the split kernels: both) on `stream` (PDL when enabled);
// capture-safe. Returns the launch error (cudaErrorInvalidValue for shapes it does not take, and
// for a long cache without scratch).
cudaError_t frt_attn_decode(const frt_attn_decode_args & a, cudaStream_t stream);

#ifdef FRT_ATTN_DECODE_TRACE
// Measurement builds only: the global timer (ns) at the phases of the last launch, per block
// (blockIdx.y * gridDim.x + blockIdx.x, the first FRT_ATTN_DECODE_TRACE_BLOCKS). The cluster kernel:
// 0 start, 1 past the PDL wait, 2 copies and loads issued, 3 copies landed, 4 past the cluster wait
// (every block runs), 5 the first row's scores and their maximum, 6 its weighted V, 7 every row's
// partial stored, 8 past the cluster barrier, 9 combined and written (the end). The split kernel
// (phases 0-7 of its blocks): 0 start, 1 past the PDL wait, 2 copies issued and the mask in shared
// memory, 3 K's first stage landed, 4 the first row group scored, 5 its softmax, 6 V landed (and
// unseen rows zeroed), 7 every row group's partials stored (the end); its combine kernel (phases
// 8-9 of its own blocks): 8 past the PDL wait, 9 written (the end).
constexpr int FRT_ATTN_DECODE_TRACE_BLOCKS = 512;
constexpr int FRT_ATTN_DECODE_TRACE_PHASES = 10;
cudaError_t frt_attn_decode_trace(unsigned long long * marks);  // BLOCKS x PHASES
// The blocks of a launch of this shape that mark phases 0-7 (*early) and 8-9 (*late): the
// cluster's blocks both, or the split kernel's blocks and its combine's.
void frt_attn_decode_trace_blocks(const frt_attn_decode_args & a, int * early, int * late);
#endif
