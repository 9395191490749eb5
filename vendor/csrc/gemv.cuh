#pragma once

// Decode GEMV: out = W x for 1..8 tokens (speculative verify), W in GGUF block formats, several
// matrices that read the same input in ONE launch (packs: q/k/v, the Gated DeltaNet input
// projections, gate+up), expert matrices picked by a device-side ids array (capture-safe).
//
// Design (numbers for an H200: 4.38 TB/s read, 132 SMs, ~700 ns DRAM latency under load):
//
// - The activation is quantized inside the kernel. At 4.38 TB/s a Q4_K matvec consumes 7.8e12
//   weights/s; dequantizing each weight to float and multiplying costs ~3 float/int instructions a
//   weight (unpack, convert, FMA), ~2/3 of the H200's fp32 issue rate, with nothing left for the
//   rest. Integer dot products (dp4a) take 4 weights an instruction, so every block of the grid
//   quantizes x (RMS-normed first when asked) to int8 with one float scale per 32 values and int
//   sums per 16 (for the Q4_K/Q5_K mins and the Q6_K offset) into shared memory, like q8_1 but
//   with no separate launch. F32/F16/BF16 weights (routers, gates) are multiplied in float, x kept
//   in float in shared memory.
// - Bytes in flight ("direct" path): a 16-byte item is what one lane multiplies at a time, 32
//   weights (quantized) or 4/8 (F32/F16/BF16). The lanes of a warp take consecutive items of a row
//   (coalesced 16-byte loads), 8, 16 or 32 lanes a row so that each lane's items of the row fill
//   U loads (U = 2..12 by type and tokens, what 128 registers hold without spilling). Q4_K/Q5_K
//   block headers (d, dmin, scales) are loaded once per 8 lanes and passed on by shuffle, so a
//   Q4_K lane holds 8 items. Warps loop over row groups (grid = SMs x 2 blocks of 8 warps, x
//   quantized once per block): ~55-75 KB in flight per SM (Little: 33 GB/s per SM x ~0.8 us =
//   ~27 KB needed).
// - Narrow matrices (router 2048 -> 256, alpha/beta 32 rows): when a launch has too few row groups
//   for the warps, S = 2..8 warps of a block (a "team") split each row and add their partial sums
//   in shared memory in a fixed order, so the grid still covers the SMs.
// - Before waiting for the previous kernel (programmatic dependent launch, pdl.cuh) each warp
//   copies the first chunk of its first dense row group into its shared-memory buffer (cp.async,
//   no registers held) and reads it back after the x prologue, so the weights' latency overlaps
//   it; other first batches are prefetched into L2. ids and x are read after the wait.
// - Layouts. Q4_K (144 B/256) and Q5_K (176 B/256) blocks are 16-byte aligned: read in place.
//   Q6_K (210 B) and Q8_0 (34 B) blocks are only 2-byte aligned. Dense matrices use a repacked
//   layout (FRT_GEMV_Q6_K_R / Q8_0_R, written by frt_gemv_repack; the same bytes in another order,
//   rows padded to 16 bytes):
//     Q6_K_R row: per block [ql 128 B][qh 64 B][scales 16 B, reordered so that the two a lane
//                 needs are adjacent: (s0,s4)(s1,s5)(s2,s6)(s3,s7)(s8,s12)...(s11,s15)],
//                 then the row's block scales d (2 B each), padded to 16 B.
//     Q8_0_R row: the row's quants (32 B a block), then its scales d (2 B each) (k % 256 == 0
//                 makes that a multiple of 16: no padding, the same size as GGUF).
// - "Staged" path: expert matrices stay in place (no copy of 20 GB), so GGUF Q6_K and Q8_0 rows
//   are copied whole by each warp into its shared-memory buffer (cp.async of 16-byte aligned
//   runs), decoded there with 4-byte reads and funnel shifts, and a segmented warp scan adds the
//   blocks of each row (any k). Q6_K_R/Q8_0_R segments in a pack of another type take it too.
// - One kernel instance multiplies one "direct" type (F32, F16, BF16, Q4_K, Q5_K, Q6_K_R or Q8_0_R:
//   two in one kernel make ptxas spill in the hot loops); the other segments of a launch must be
//   Q6_K/Q8_0 (GGUF or repacked), which are staged. That covers the packs of Q4_K_M/Q5_K_M models.
// - Epilogue at the store of each output: plain store or residual add; later SwiGLU of a gate and
//   an up segment and sigmoid gates go there (frt_gemv_epilogue).
//
// Bulk kernel (FRT_GEMV_KERNEL_BULK: 1 token, sm_90+; gemv-bulk.cu), an experiment not yet faster
// than the above (docs/perf-notes.md): one block an SM; a producer warp copies the block's rows
// (balanced by bytes over the blocks) into shared-memory stages with the bulk-copy engine
// (cp.async.bulk, completing on mbarriers), starting before the wait for the previous kernel; the
// consumer warps quantize x meanwhile, then multiply from shared memory: the quantized types
// (Q4_K, Q5_K, Q6_K, Q8_0, GGUF or repacked) on the tensor cores (mma.m16n8k32 / m16n8k16 s8: 16
// rows x one scale group a step, x as column 0 of B, the scales applied per group), F32/F16/BF16
// with the register kernel's item code. Tensor-core tasks (16-row tile, 256-column block) go round
// the consumer warps across chunks, with no barrier between them; each leaves its partial sums
// with the stage, and the producer adds them up in block order and stores the rows before it
// refills the stage.
//
// Numerics: the result is sum_i w_i * xq_i (exact integer dot products of 16 values, then float),
// where xq is x rounded to int8 per 32 values exactly as stock's quantize_q8_1 rounds it:
// q = round(x / d), d = max|x| / 127 of its block, and xq = half(d) q (block_q8_1 keeps d as a
// half), so |xq_i - x_i| <= d/2 + |q_i| |half(d) - d|. The same rounding as stock is what keeps
// decode on stock's logits (cargo xtask parity); a float d would be closer to x and drift.

#include <cstdint>
#include <cuda_runtime.h>

enum frt_gemv_type : int32_t {
    FRT_GEMV_F32 = 0,
    FRT_GEMV_F16,
    FRT_GEMV_BF16,
    FRT_GEMV_Q4_K,    // GGUF rows, read in place
    FRT_GEMV_Q5_K,    // GGUF rows, read in place
    FRT_GEMV_Q6_K,    // GGUF rows, read in place through shared memory (experts)
    FRT_GEMV_Q8_0,    // GGUF rows, read in place through shared memory (experts)
    FRT_GEMV_Q6_K_R,  // repacked by frt_gemv_repack (dense weights)
    FRT_GEMV_Q8_0_R,  // repacked by frt_gemv_repack (dense weights)
    FRT_GEMV_TYPE_COUNT
};

enum frt_gemv_epilogue : int32_t {
    FRT_GEMV_STORE = 0,  // out = W x
    FRT_GEMV_ADD,        // out = W x + residual (residual may be out itself)
    // out = (W x) * silu(W_gate x), silu(g) = g / (1 + expf(-g)): ggml-cuda's gate/up matvec pair
    // fused with its SWIGLU (mmvq's epilogue), each sum in the unfused order. Exact kernel only.
    FRT_GEMV_SWIGLU,
};

constexpr int FRT_GEMV_MAX_SEGMENTS = 8;
constexpr int FRT_GEMV_MAX_TOKENS   = 8;
constexpr int FRT_GEMV_MAX_SLOTS    = 64;  // expert matrices of one segment: tokens x experts used

// One matrix of the launch, or one stacked expert tensor of which `ids` selects n_used a token.
struct frt_gemv_segment {
    frt_gemv_type     type;
    const void *      w;           // row r at w + r * row_stride (experts: of matrix w + e * expert_stride)
    int               rows;
    int64_t           row_stride;  // bytes; GGUF Q6_K/Q8_0 rows must be contiguous (the row size)
    float *           out;         // dense: out[t * out_stride + r]; experts: out[s * out_stride + r]
    int64_t           out_stride;  // elements, between tokens (dense) or slots s = t * n_used + j
    frt_gemv_epilogue epilogue;
    const float *     residual;  // FRT_GEMV_ADD: indexed like out (may be out)
    int64_t           residual_stride;
    const void *      w_gate;    // FRT_GEMV_SWIGLU: the gate matrix, laid out as w (same strides)
    // Exact kernel, dense segments: non-null, the segment multiplies this input vector (k floats,
    // 16-byte aligned) instead of the launch's x: an independent matvec beside the launch's (the
    // shared expert's down projection beside the routed experts'). No norm in such a launch.
    const float *     x;
    // Experts, when ids != nullptr: slot (t, j) multiplies matrix ids[t * ids_stride + j] (0 <= id
    // < n_experts; another id gives NaN rows) with input vector t * x_per_token + (x_per_token == 1
    // ? 0 : j) of the launch.
    const int32_t *   ids;
    int64_t           ids_stride;     // elements between tokens
    int               n_used;         // experts a token
    int               n_experts;      // matrices in the stacked tensor
    int64_t           expert_stride;  // bytes
};

// Exact kernel only: an MoE FFN's tail computed by the launch that computes its inputs (the
// routed experts' down projection and the shared expert's), instead of a kernel of its own:
//   out[r] = (sum over slots j of experts[j][r] * weights[j] + shexp[r] * sigmoid(gate)) + residual[r]
// with frt_moe_tail's expression (moe-ffn-tail.cuh), so the same bits. experts: the slot outputs
// of segment `experts_seg` (an expert segment, one token); shexp: the output of the dense segment
// `shexp_seg`, as many rows. Each block of those segments counts the groups of 4 rows it stored;
// the block that completes a group (all n_used slots and the shared expert stored) computes the
// group's rows. No block waits for another. `out` may alias a slot's or the residual's rows element
// for element (each is read only by the thread that writes it), never another input of the launch
// (x, a segment's own x, the ids, the guess's logits: other blocks may still read them when a
// group's tail is written).
struct frt_gemv_moe_tail {
    float *       out;         // nullptr: no tail
    const float * weights;     // the slots' routing weights, n_used floats
    const float * gate;        // the shared expert's gate logit (one float)
    const float * residual;    // rows floats
    int           experts_seg, shexp_seg;  // the launch's two segments
    // (rows + 3) / 4 counters, zero before the launch, left at zero by it. Needed at launch time
    // only: frt_gemv_unsupported does not look at it (a caller may ask before it has them).
    unsigned *    counters;
};

constexpr int FRT_GEMV_TAIL_ROWS_A_COUNTER = 4;

// Exact kernel only: weights that launches after this one read, prefetched into L2 by this launch's
// blocks (each a share, once its wait is over), so that those launches stage them from L2 instead of
// device memory. A hint: nothing is read into the launch, no result changes. Each range 16-byte
// aligned and a multiple of 16 bytes long, in memory of the launch's device.
constexpr int FRT_GEMV_MAX_PREFETCH = 4;
struct frt_gemv_prefetch {
    const void * ptr[FRT_GEMV_MAX_PREFETCH];
    int64_t      bytes[FRT_GEMV_MAX_PREFETCH];
    int          n;
    // A launch that routes (route_logits) only, non-null: the first expert_bytes of each expert
    // it selects among the matrices at experts + e x expert_stride (a later launch's experts, read
    // with the same ids; as many experts as route_n_experts). 16-byte aligned, multiples of 16.
    const void * experts;
    int64_t      expert_stride, expert_bytes;
};

struct frt_gemv_args {
    const float * x;            // input vectors, vector v at x + v * x_stride (elements), k floats each
    int64_t       x_stride;
    int           k;            // columns of every matrix of the launch
    int           tokens;       // 1..8
    int           x_per_token;  // 1, or n_used of the expert segments (down projections: one input a slot)
    const float * norm;         // non-null: each input vector v is first replaced by v / rms(v) * norm
    float         eps;          // rms(v) = sqrt(mean(v^2) + eps)
    // With norm, non-null: the normed vectors are also written here (vector v at x_normed + v *
    // x_normed_stride, 16-byte aligned, stride a multiple of 4), for a norm whose value the graph
    // keeps (llama.cpp marks its final norm, the LM head's input, as an output).
    float *       x_normed;
    int64_t       x_normed_stride;
    // Exact kernel only, one token: non-null, the kernel before this launch already normed x (as
    // the prologue would, with this norm and eps, when norm is set) and quantized it, and wrote the
    // image here (q8-x.cuh: k int8 values, then k / 32 scales and sums; frt_moe_tail_args::x_q8 and
    // frt_gdn_decode_args::x_q8 write it): the prologue copies it into shared memory instead of
    // reading x. x and norm still describe the input. No x_normed, no F32 segment, no segment with
    // its own input; k at most FRT_X_Q8_MAX_K. 16-byte aligned.
    const void *  x_q8;
    // Exact kernel only, with x_normed, for a launch that frt_router_f32 computes (a norm and F32
    // rows only, one token; gemv-exact.cu): non-null, the normed x also quantized as the prologue
    // quantizes it, its image written here (as x_q8 reads it), so that the next launch, which reads
    // the normed x, copies the image instead (frt_gemv_args::x_q8). k at most FRT_X_Q8_MAX_K;
    // 16-byte aligned, apart from every input.
    void *        x_normed_q8;
    int           n_segments;
    frt_gemv_segment seg[FRT_GEMV_MAX_SEGMENTS];
    // Exact kernel only: non-null, the routed experts are selected in the launch from these
    // route_n_experts router logits (one token), as ggml-cuda's fused top-k selects them for a
    // softmax gate (topk_moe_cuda: softmax, n_used rounds of argmax with ties to the lower expert,
    // the chosen probabilities as weights, divided by max(their sum, route_clamp) when route_norm,
    // times route_scale). Every expert segment must then read its ids from route_ids, where block 0
    // writes the n_used selected experts (and the weights to route_weights) for the kernels after
    // the launch; neither may overlap the logits, x or an output.
    const float * route_logits;
    int           route_n_experts;  // 32, 64, 128, 256 or 512
    bool          route_norm;
    float         route_clamp;
    float         route_scale;
    int32_t *     route_ids;
    float *       route_weights;
    // Exact kernel only, without route_logits: non-null, the router logits (one token) whose
    // softmax top-k (as ggml-cuda's fused top-k selects, see route_logits) chose the ids the expert
    // segments read, written at least two kernels before this launch. The launch selects from them
    // before its wait and stages the chosen experts' rows early; after the wait the ids decide
    // (rows staged for another expert are copied again), so the guess changes no bit, only when the
    // rows start moving. Nothing is written. Every expert segment reads the same ids.
    const float * guess_logits;
    frt_gemv_moe_tail tail;
    frt_gemv_prefetch prefetch;
    // Exact kernel only, a hint: non-null, FRT_GEMV_CHUNK_COUNTER_WORDS words of device memory,
    // zero before the first launch that gets them, which every launch leaves at zero. With
    // GGML_FLASHRT_EXACT_CHUNKS=N (N >= 2), a one-token launch of staged quantized rows read
    // against the launch's x then splits its rows into chunks of about 1/N of a block's share and
    // runs one wave of blocks, each taking more chunks of its first chunk's type from a counter
    // here, so that a block that starts late (resident only as the kernel before leaves its SM)
    // takes fewer. A chunk is whole rows, each summed as before: the same bits. Consecutive
    // launches use different counters (the next launch's blocks may start before this one's last
    // block ends).
    unsigned *        chunk_counters;
};
constexpr int FRT_GEMV_CHUNK_SLOTS        = 8;  // launches in turn, 4 words each (a claim counter a quantized type, a count)
constexpr int FRT_GEMV_CHUNK_COUNTER_WORDS = 4 * FRT_GEMV_CHUNK_SLOTS;

// Exact kernel only, for measurement: where each block of every exact launch spends its time in a
// real decode step (under CUDA graphs and programmatic dependent launch, which a launch alone in a
// benchmark does not reproduce). Launches made while a trace is on (frt_gemv_trace) run instances of
// the kernel built with it (the others stay as they are): thread 0 of each block notes its SM's
// clock at its phases and, at its end, writes one record into a ring in device memory. Launches
// captured into a CUDA graph while the trace is on keep writing at each replay. The MoE tail's
// instance (frt_gemv_args::tail) has no traced twin: its launches write nothing.
struct frt_gemv_trace_record {
    uint64_t tag;          // the launch's first segment's weights (seg[0].w): which launch of a step
    uint16_t block, grid;  // blockIdx.x, gridDim.x (an exact launch has at most a few thousand blocks)
    uint32_t sm;           // %smid
    uint64_t start_ns;     // %globaltimer at the block's start
    uint64_t end_ns;       // %globaltimer once its rows are stored
    uint32_t kind;         // seg type | n_segments << 8 | SwiGLU << 16 | routes << 17 | guesses << 18 | norm << 19
    // SM clock cycles from the block's start to: its wait for the previous kernel returned, its rows'
    // copies issued (expert rows after the routing), the norm's scales summed (x's first pass; the
    // issue mark's time where the launch has no norm), x in shared memory (prologue), its rows
    // landed in shared memory, its products summed, its rows stored.
    uint32_t waited, issued, normed, prologue, landed, products, stored;
};
static_assert(sizeof(frt_gemv_trace_record) == 64, "one record a block, 64 bytes");
// capacity > 0: records into a ring of `capacity` records from the next launch on (allocated here:
// call it outside stream capture); 0: stops and frees the ring. One trace a process.
cudaError_t frt_gemv_trace(int capacity);
// The ring's records, oldest first (at most its capacity: the latest ones), into out[0..max); *n:
// how many. Synchronizes the device.
cudaError_t frt_gemv_trace_records(frt_gemv_trace_record * out, int max, int * n);
// Which kernel frt_gemv runs. AUTO: the fastest measured: the head kernel where it applies (one
// dense Q6_K_R matrix of at least kHeadMinRows rows, gemv.cu), else the register kernel (the bulk
// kernel is slower at every decode shape so far: docs/perf-notes.md). The others are for tests and
// benchmarks.
enum frt_gemv_kernel : int32_t {
    FRT_GEMV_KERNEL_AUTO = 0,
    FRT_GEMV_KERNEL_REGISTERS,  // weights loaded into registers; 1..8 tokens, any arch
    FRT_GEMV_KERNEL_BULK,       // weights copied by the bulk-copy engine into shared memory; 1 token, sm_90+
    FRT_GEMV_KERNEL_EXACT,      // every row added in ggml-cuda mmvq's order: bit-identical to stock; 1 token,
                                // GGUF Q4_K/Q6_K/Q8_0 only (gemv-exact.cu)
    FRT_GEMV_KERNEL_HEAD,       // one dense Q6_K_R matrix of many rows (an LM head), 1 token, k = 2048 or
                                // 4096: each lane's x in registers, the next rows' loads in flight while
                                // a warp multiplies (gemv-head.cu). AUTO takes it where it applies.
};

// nullptr when frt_gemv supports `args` with `kernel` on the current device; otherwise why not
// (the caller then runs its fallback). The register kernel needs: k a positive multiple of 256;
// 1 <= tokens <= 8; 1 <= n_segments <= 8; at most one of F32/F16/BF16/Q4_K/Q5_K among the
// segments; x, norm, weights and expert strides 16-byte aligned, x_stride a multiple of 4, row
// strides multiples of 16 bytes (staged segments: exactly the row size); dense segments only when
// x_per_token == 1; at most 64 expert slots a segment; x (normed, quantized and, for float
// weights, in float) fitting in 99 KB of shared memory (8 tokens x k = 4096 with float weights
// does not). The bulk kernel: the same but 1 token, any mix of types, and GGUF Q6_K/Q8_0
// matrices of a multiple of 16 bytes. The exact kernel: the same checks, 1 token, and only GGUF
// Q4_K, Q6_K and Q8_0 segments (any mix). out and x_normed must not overlap x, norm or w.
const char * frt_gemv_unsupported(const frt_gemv_args & args, frt_gemv_kernel kernel = FRT_GEMV_KERNEL_AUTO);

// Launches on `stream` (capture-safe, programmatic dependent launch like ggml-cuda). Returns
// cudaErrorInvalidValue when frt_gemv_unsupported(args, kernel) says why.
cudaError_t frt_gemv(const frt_gemv_args & args, cudaStream_t stream, frt_gemv_kernel kernel = FRT_GEMV_KERNEL_AUTO);

// The layout frt_gemv reads fastest for dense weights of GGUF type `type`: FRT_GEMV_Q6_K_R for
// FRT_GEMV_Q6_K, FRT_GEMV_Q8_0_R for FRT_GEMV_Q8_0, `type` itself for the others.
frt_gemv_type frt_gemv_repacked_type(frt_gemv_type type);

// Bytes of one row of k columns in `type`'s layout (GGUF row size, or the repacked row size).
int64_t frt_gemv_row_bytes(frt_gemv_type type, int k);

// Converts `rows` GGUF rows of `type` (FRT_GEMV_Q6_K or FRT_GEMV_Q8_0; row r at src + r *
// src_row_stride) into frt_gemv_repacked_type(type)'s layout at dst (row stride
// frt_gemv_row_bytes(repacked type, k), 16-byte aligned, not overlapping src). For the overlay's
// repack cache, before CUDA graph capture.
cudaError_t frt_gemv_repack(frt_gemv_type type, const void * src, int64_t src_row_stride, int rows, int k, void * dst,
                            cudaStream_t stream);
