// The exact kernel's launch (FRT_GEMV_KERNEL_EXACT): the launch's shape (rows a block, shared
// memory, blocks) and the kernel instance; the kernel and the order of its sums are described
// in gemv-exact-impl.cuh.

#include "gemv-exact-impl.cuh"
#include "router-f32.cuh"
#include "env-switch.cuh"

#include <algorithm>
#include <atomic>
#include <mutex>

// Matrices a row multiplies: 2 when the segments have the FRT_GEMV_SWIGLU epilogue (the gate rows
// are staged and summed beside the up rows; all segments or none, gemv.cu checks), else 1.
static int exact_row_copies(const frt_gemv_args & a) {
    for (int i = 0; i < a.n_segments; ++i) {
        if (a.seg[i].epilogue == FRT_GEMV_SWIGLU) {
            return 2;
        }
    }
    return 1;
}

// Shared memory: x as int8 (vectors x k), a uint2 per 32 values, x in float (F32 rows), then the
// cross-warp sums of up to kExactMaxRows rows (of each matrix a row multiplies). Only the vector a
// block multiplies is kept, unless the launch writes the normed vectors (then all of them).
static int exact_layout(const frt_gemv_args & a, int & smem_xm, int & smem_xf, int & smem_part, bool & q8,
                        bool & f32) {
    q8 = f32 = false;
    for (int i = 0; i < a.n_segments; ++i) {
        q8  = q8 || a.seg[i].type != FRT_GEMV_F32;
        f32 = f32 || a.seg[i].type == FRT_GEMV_F32;
    }
    const int n_vec = a.x_normed != nullptr ? a.tokens * a.x_per_token : 1;
    smem_xm         = q8 ? n_vec * a.k : 0;
    smem_xf         = smem_xm + (q8 ? n_vec * (a.k / 32) * (int) sizeof(uint2) : 0);
    smem_part       = (smem_xf + (f32 ? n_vec * a.k * (int) sizeof(float) : 0) + 15) / 16 * 16;
    return smem_part + exact_row_copies(a) * kExactMaxRows * kStockThreads * (int) sizeof(float);
}

int frt_gemv_exact_layout(const frt_gemv_args & a, int & smem_xm, int & smem_xf) {
    int  smem_part = 0;
    bool q8 = false, f32 = false;
    return exact_layout(a, smem_xm, smem_xf, smem_part, q8, f32);
}

// The staged rows' copies are marked evict-first in L2 unless GGML_FLASHRT_EXACT_EVICT_FIRST=0.
static bool exact_evict_first() {
    static const bool evict_first = frt_env_flag("GGML_FLASHRT_EXACT_EVICT_FIRST", true);
    return evict_first;
}

// Blocks of at least this many rows add them across the lanes by reduce-scatter (exact_sum_rows;
// the same bits): GGML_FLASHRT_EXACT_SCATTER_ROWS, 33 by default (more rows than two a warp), 1 for
// every block, 0 for none.
static int exact_scatter_rows() {
    static const int rows = std::max(0, frt_env_int("GGML_FLASHRT_EXACT_SCATTER_ROWS", 33));
    return rows;
}

// GGML_FLASHRT_EXACT_CHUNKS=N (N >= 2): where the caller gives chunk counters
// (frt_gemv_args::chunk_counters), the launch's rows in chunks of about 1/N of a block's share,
// taken from a counter past each block's first (exact_params::chunk_counter). 0 (the default) or
// 1: a block a chunk.
static int exact_chunk_split() {
    static const int split = std::max(0, frt_env_int("GGML_FLASHRT_EXACT_CHUNKS", 0));
    return split;
}

// The next launch's pair of chunk counters (frt_gemv_args::chunk_counters): launches in turn, so
// that a launch whose blocks start while the previous one's still claim chunks counts apart.
static unsigned * exact_next_chunk_counter(unsigned * counters) {
    static std::atomic<unsigned> turn{ 0 };
    constexpr int words = FRT_GEMV_CHUNK_COUNTER_WORDS / FRT_GEMV_CHUNK_SLOTS;
    return counters + words * (turn.fetch_add(1, std::memory_order_relaxed) % FRT_GEMV_CHUNK_SLOTS);
}

// A block takes further chunks of its first chunk's type only (the row code it runs), so each
// quantized type starts a share of the grid's `wave` blocks in proportion to its chunks (at least
// one block for a type that has chunks, at most one a chunk).
static void exact_type_blocks(const frt_gemv_args & a, const int * chunk_rows, int wave, int * type_blocks) {
    int chunks[kExactChunkTypes] = {}, total = 0;
    for (int i = 0; i < a.n_segments; ++i) {
        const frt_gemv_segment & s = a.seg[i];
        const int n = (s.ids != nullptr ? s.n_used : 1) * ((s.rows + chunk_rows[i] - 1) / chunk_rows[i]);
        chunks[exact_chunk_type(s.type)] += n;
        total += n;
    }
    int given = 0, largest = 0;
    for (int t = 0; t < kExactChunkTypes; ++t) {
        type_blocks[t] = chunks[t] == 0 ? 0 : std::min(chunks[t], std::max(1, (int) ((int64_t) wave * chunks[t] / total)));
        given += type_blocks[t];
        largest = chunks[t] > chunks[largest] ? t : largest;
    }
    type_blocks[largest] = std::min(chunks[largest], type_blocks[largest] + wave - given);  // the rounding's rest
}

// A launch of an input norm and F32 rows only (the ROUTER window's: the router and the shared
// expert's gate vector) runs on frt_router_f32, one row a block with the rows in registers before
// the wait (router-f32.cuh), the same bits; GGML_FLASHRT_ROUTER_F32=0 keeps it here.
static bool exact_router_f32() {
    static const bool on = frt_env_flag("GGML_FLASHRT_ROUTER_F32", true);
    return on;
}

// The launch as frt_router_f32's arguments, when it is one that kernel computes alike: one token,
// a norm, dense F32 rows stored plainly, nothing else asked of the exact kernel.
static bool exact_as_router_f32(const frt_gemv_args & a, frt_router_f32_args & r) {
    if (a.tokens != 1 || a.x_per_token != 1 || a.norm == nullptr || a.x_q8 != nullptr || a.route_logits != nullptr ||
        a.guess_logits != nullptr || a.tail.out != nullptr || a.prefetch.n != 0 || a.prefetch.experts != nullptr ||
        a.n_segments > FRT_ROUTER_F32_MAX_SEGMENTS) {
        return false;
    }
    r            = {};
    r.x          = a.x;
    r.norm       = a.norm;
    r.eps        = a.eps;
    r.k          = a.k;
    r.x_normed   = a.x_normed;
    r.x_q8       = a.x_normed_q8;
    r.n_segments = a.n_segments;
    for (int i = 0; i < a.n_segments; ++i) {
        const frt_gemv_segment & s = a.seg[i];
        if (s.type != FRT_GEMV_F32 || s.ids != nullptr || s.epilogue != FRT_GEMV_STORE || s.x != nullptr ||
            s.row_stride % 16 != 0) {
            return false;
        }
        r.seg[i] = { (const float *) s.w, s.rows, s.row_stride / (int64_t) sizeof(float), s.out };
    }
    return frt_router_f32_unsupported(r) == nullptr;
}

bool frt_gemv_exact_on_router(const frt_gemv_args & a) {
    frt_router_f32_args r;
    return exact_router_f32() && exact_as_router_f32(a, r);
}

// frt_gemv_trace's ring (one a process).
struct exact_trace_ring {
    std::mutex              mutex;
    frt_gemv_trace_record * records = nullptr;
    unsigned long long *    cursor  = nullptr;
    int                     capacity = 0;
};

static exact_trace_ring & trace_ring() {
    static exact_trace_ring ring;
    return ring;
}

cudaError_t frt_gemv_trace(int capacity) {
    exact_trace_ring &          r = trace_ring();
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto                  release = [&r]() {
        cudaFree(r.records);
        cudaFree(r.cursor);
        r.records  = nullptr;
        r.cursor   = nullptr;
        r.capacity = 0;
    };
    release();
    if (capacity <= 0) {
        return cudaSuccess;
    }
    cudaError_t err = cudaMalloc(&r.records, (size_t) capacity * sizeof(frt_gemv_trace_record));
    if (err == cudaSuccess) {
        err = cudaMalloc(&r.cursor, sizeof(unsigned long long));
    }
    if (err == cudaSuccess) {
        err = cudaMemset(r.cursor, 0, sizeof(unsigned long long));
    }
    if (err == cudaSuccess) {
        err = cudaMemset(r.records, 0, (size_t) capacity * sizeof(frt_gemv_trace_record));
    }
    if (err != cudaSuccess) {
        release();
        return err;
    }
    r.capacity = capacity;
    return cudaDeviceSynchronize();
}

cudaError_t frt_gemv_trace_records(frt_gemv_trace_record * out, int max, int * n) {
    exact_trace_ring &          r = trace_ring();
    std::lock_guard<std::mutex> lock(r.mutex);
    *n = 0;
    if (r.records == nullptr) {
        return cudaSuccess;
    }
    cudaError_t err = cudaDeviceSynchronize();
    unsigned long long written = 0;
    if (err == cudaSuccess) {
        err = cudaMemcpy(&written, r.cursor, sizeof(written), cudaMemcpyDeviceToHost);
    }
    if (err != cudaSuccess) {
        return err;
    }
    // Oldest first: once the ring has wrapped, from the cursor on.
    const unsigned long long held  = std::min<unsigned long long>(written, (unsigned long long) r.capacity);
    const unsigned long long count = std::min<unsigned long long>(held, (unsigned long long) std::max(max, 0));
    const unsigned long long first = written - count;  // the latest `count` records
    for (unsigned long long i = 0; i < count && err == cudaSuccess;) {
        const unsigned long long at  = (first + i) % (unsigned long long) r.capacity;
        const unsigned long long run = std::min(count - i, (unsigned long long) r.capacity - at);
        err = cudaMemcpy(out + i, r.records + at, run * sizeof(frt_gemv_trace_record), cudaMemcpyDeviceToHost);
        i += run;
    }
    if (err == cudaSuccess) {
        *n = (int) count;
    }
    return err;
}

// The plain or the SwiGLU instance (no tail; the SwiGLU one reading x or the launch's image), with
// the trace's records or without, a block a chunk or taking chunks from counters.
template <bool TRACE, bool CHUNKS>
static cudaError_t exact_launch_glu(bool glu, int device, int blocks, int smem, cudaStream_t stream,
                                    const exact_params & p) {
    if (glu && p.x_q8 != nullptr) {
        return exact_launch<frt_gemv_exact_kernel<true, false, TRACE, true, CHUNKS>>(device, blocks, smem, stream, p);
    }
    return glu ? exact_launch<frt_gemv_exact_kernel<true, false, TRACE, false, CHUNKS>>(device, blocks, smem, stream, p)
               : exact_launch<frt_gemv_exact_kernel<false, false, TRACE, false, CHUNKS>>(device, blocks, smem, stream, p);
}

cudaError_t frt_gemv_exact_launch(const frt_gemv_args & a, cudaStream_t stream) {
    int         device = 0;
    gemv_device dev;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) {
        err = frt_gemv_device_info(device, dev);
    }
    if (err != cudaSuccess) {
        return err;
    }
    exact_params p = {};
    p.x            = a.x;
    p.norm         = a.norm;
    p.x_stride     = a.x_stride;
    p.eps          = a.eps;
    p.k            = a.k;
    p.n_vec        = a.tokens * a.x_per_token;
    p.x_out        = a.x_normed;
    p.x_out_stride = a.x_normed_stride;
    p.x_q8         = (const uint8_t *) a.x_q8;
    p.n_segments   = a.n_segments;
    p.evict_first         = exact_evict_first() ? 1 : 0;
    p.scatter_rows        = exact_scatter_rows();
    {
        exact_trace_ring &          r = trace_ring();
        std::lock_guard<std::mutex> lock(r.mutex);
        p.trace          = r.records;
        p.trace_cursor   = r.cursor;
        p.trace_capacity = r.capacity;
    }
    // A traced launch stays here (it writes records), unless it writes the normed x's image, which
    // only frt_router_f32 does.
    if (exact_router_f32() && (p.trace == nullptr || a.x_normed_q8 != nullptr)) {
        frt_router_f32_args r;
        if (exact_as_router_f32(a, r)) {
            return frt_router_f32(r, stream);
        }
    }
    if (a.x_normed_q8 != nullptr) {  // frt_gemv_unsupported refuses it
        return cudaErrorInvalidValue;
    }
    p.prefetch            = a.prefetch;
    if (a.route_logits != nullptr) {
        p.route_logits  = a.route_logits;
        p.route_ids     = a.route_ids;
        p.route_weights = a.route_weights;
        p.route_ept     = a.route_n_experts / 32;
        p.route_norm    = a.route_norm ? 1 : 0;
        p.route_clamp   = a.route_clamp;
        p.route_scale   = a.route_scale;
        for (int i = 0; i < a.n_segments; ++i) {
            if (a.seg[i].ids != nullptr) {
                p.route_n_used = a.seg[i].n_used;
            }
        }
    } else if (a.guess_logits != nullptr) {
        p.guess_logits = a.guess_logits;
        for (int i = 0; i < a.n_segments; ++i) {
            if (a.seg[i].ids != nullptr) {
                p.route_ept    = a.seg[i].n_experts / 32;
                p.route_n_used = a.seg[i].n_used;
            }
        }
    }
    // mmvf's block: the smallest of 32, 64, ... 256 threads with the fewest passes over k / 2 pairs.
    p.f32_block    = 32;
    for (int block = 64, best = (a.k + 63) / 64; block <= 256; block += 32) {
        const int passes = (a.k + 2 * block - 1) / (2 * block);
        if (passes < best) {
            best        = passes;
            p.f32_block = block;
        }
    }
    // Rows a block: the launch's rows over one wave of blocks, a multiple of 4 (rows of k = 512
    // go 2 or 4 to a block side by side), as many as shared memory takes when staged. The segment
    // with the most rows sets that number; a segment of wider rows takes fewer a block (the INPROJ
    // pack's 32-row Q8_0 alpha and beta, 2176 bytes a row, had cut every block to 36 Q4_K rows and
    // the launch to 1.3 waves).
    int     total = 0;
    int64_t main_width = 0, main_rows = 0;  // the staged segment with the most rows
    int     units[FRT_GEMV_MAX_SEGMENTS];
    bool    q8 = false, f32 = false;
    exact_layout(a, p.smem_xm, p.smem_xf, p.smem_part, q8, f32);
    for (int i = 0; i < a.n_segments; ++i) {
        const frt_gemv_segment & s = a.seg[i];
        const int64_t seg_rows = (int64_t) (s.ids != nullptr ? s.n_used : 1) * s.rows;
        total += (int) seg_rows;
        // Staged in 16-byte copies when every row start (and expert matrix) is 16-byte aligned, else
        // 4-byte ones; 2-byte aligned GGUF rows are read in place, and so are F32 rows in a launch
        // with quantized ones (their width would cut the quantized rows a block takes).
        const uint64_t align = (uint64_t) (uintptr_t) s.w | (uint64_t) s.row_stride |
                               (uint64_t) (s.ids != nullptr ? s.expert_stride : 0) |
                               (uint64_t) (s.type == FRT_GEMV_F32 ? a.k * sizeof(float) : 0);  // the copy's length
        units[i] = s.type == FRT_GEMV_F32 && q8 ? 0 : align % 16 == 0 ? 16 : align % 4 == 0 ? 4 : 0;
        if (units[i] != 0 && seg_rows > main_rows) {
            main_rows  = seg_rows;
            main_width = s.row_stride;
        }
    }
    p.need_q8        = q8;
    p.need_f32       = f32;
    const int wave   = dev.sms * kExactBlocksPerSm;  // every slot: two blocks fill an SM's registers
    const int copies = exact_row_copies(a);
    // The launch's shape at `rows` rows a block: each staged segment's rows a block (`rows`, or as
    // many of its wider rows as fit, at least 4: else its rows are read in place), the shared
    // memory, the blocks.
    struct exact_shape {
        int rows, stage, smem, blocks;  // stage: where the staged rows start in shared memory
        int chunk_rows[FRT_GEMV_MAX_SEGMENTS], units[FRT_GEMV_MAX_SEGMENTS];
    };
    const auto shape_at = [&](int rows) {
        exact_shape sh = {};
        sh.rows        = rows;
        const int stage_at = p.smem_part + copies * rows * kStockThreads * (int) sizeof(float);  // after the sums
        sh.stage           = stage_at;
        sh.smem            = stage_at;
        for (int i = 0; i < a.n_segments; ++i) {
            const frt_gemv_segment & s = a.seg[i];
            sh.units[i]                = units[i];
            sh.chunk_rows[i]           = rows;
            if (units[i] != 0) {
                const int64_t fit = (kMaxSmem - stage_at) / (copies * s.row_stride) / 4 * 4;
                if (fit < 4) {
                    sh.units[i] = 0;  // rows of over 20 KB
                } else {
                    sh.chunk_rows[i] = (int) std::min<int64_t>(rows, fit);
                    sh.smem = std::max(sh.smem, stage_at + (int) (copies * sh.chunk_rows[i] * s.row_stride));
                }
            }
            sh.blocks += (s.ids != nullptr ? s.n_used : 1) * ((s.rows + sh.chunk_rows[i] - 1) / sh.chunk_rows[i]);
        }
        return sh;
    };
    int rows = std::min(kExactMaxRows, std::max(4, ((total + wave - 1) / wave + 3) / 4 * 4));
    if (main_width > 0) {  // as many as fit in shared memory with their sums
        rows = std::max(4, std::min<int>(rows, (kMaxSmem - p.smem_part) / (copies * (main_width + kStockThreads * 4)) / 4 * 4));
    }
    exact_shape shape = shape_at(rows);
    // A launch a little over one wave (the experts' down projection with the shared expert's: 18432
    // rows, 288 blocks of 64 where a wave is 264) pays a whole block's time for the few blocks of
    // its second wave: it takes up to kExactWaveRows rows a block instead when that brings it into
    // one wave and fits in shared memory. Every row's sum is computed as before.
    for (int more = rows + 4; shape.blocks > wave && more <= kExactWaveRows; more += 4) {
        const exact_shape wider = shape_at(more);
        if (wider.smem > kMaxSmem) {
            break;
        }
        if (wider.blocks <= wave) {
            shape = wider;
        }
    }
    // Chunks taken from a counter: the same search at 1/N of the rows a block, two stage buffers of
    // such chunks (about the one buffer of a block's share), one wave of blocks. Only where the
    // blocks share one x (one token, no segment's own input) and every segment is staged
    // quantized rows; and only if there are more chunks than a wave.
    bool chunked = false;
    if (exact_chunk_split() >= 2 && a.chunk_counters != nullptr && p.n_vec == 1 && !f32 && a.tail.out == nullptr) {
        const exact_shape part   = shape_at(std::max(4, (shape.rows / exact_chunk_split() + 3) / 4 * 4));
        const int         buffer = (part.smem - part.stage + 15) / 16 * 16;
        bool              plain  = true;  // every segment reads x and is staged at the chunk size
        for (int i = 0; i < a.n_segments; ++i) {
            plain = plain && a.seg[i].x == nullptr && part.units[i] != 0;
        }
        if (plain && part.blocks > wave && part.stage + 2 * buffer <= kMaxSmem) {
            shape          = part;
            shape.smem     = part.stage + 2 * buffer;
            p.stage_buffer = buffer;
            chunked        = true;
            exact_type_blocks(a, part.chunk_rows, wave, p.type_blocks);
        }
    }
    if (a.tail.out != nullptr) {
        // Groups of rows never straddle two chunks of a slot.
        for (const int seg : { a.tail.experts_seg, a.tail.shexp_seg }) {
            if (shape.chunk_rows[seg] % FRT_GEMV_TAIL_ROWS_A_COUNTER != 0 ||
                shape.chunk_rows[seg] > kExactWaveRows) {
                return cudaErrorInvalidValue;
            }
        }
        if (a.tail.counters == nullptr) {
            return cudaErrorInvalidValue;
        }
        p.tail        = a.tail;
        p.tail_n_used = a.seg[a.tail.experts_seg].n_used;
        p.tail_rows   = a.seg[a.tail.experts_seg].rows;
    }
    p.smem_stage     = shape.stage;
    p.rows_per_block = shape.rows;
    const int smem   = shape.smem;
    int blocks         = 0;
    for (int i = 0; i < a.n_segments; ++i) {
        const frt_gemv_segment & s = a.seg[i];
        exact_seg &              q = p.seg[i];
        q.w               = (const uint8_t *) s.w;
        q.out             = s.out;
        q.residual        = s.residual;
        q.ids             = s.ids;
        q.w_gate          = (const uint8_t *) s.w_gate;
        q.x               = s.x;
        q.row_stride      = s.row_stride;
        q.out_stride      = s.ids != nullptr ? s.out_stride : 0;
        q.residual_stride = s.ids != nullptr ? s.residual_stride : 0;
        q.expert_stride   = s.expert_stride;
        q.type            = s.type;
        q.rows            = s.rows;
        q.epilogue        = s.epilogue;
        q.n_experts       = s.n_experts;
        q.chunk_rows      = shape.chunk_rows[i];
        q.chunks          = (s.rows + q.chunk_rows - 1) / q.chunk_rows;
        q.block_begin     = blocks;
        q.stage_unit      = shape.units[i];
        blocks += (s.ids != nullptr ? s.n_used : 1) * q.chunks;
    }
    p.n_chunks = blocks;
    if (chunked) {
        p.chunk_counter = exact_next_chunk_counter(a.chunk_counters);
        blocks          = p.type_blocks[0] + p.type_blocks[1] + p.type_blocks[2];
    }
    const bool glu = a.seg[0].epilogue == FRT_GEMV_SWIGLU;
    if (a.tail.out != nullptr) {  // no SwiGLU (gemv.cu checks)
        return exact_launch<frt_gemv_exact_kernel<false, true>>(device, blocks, smem, stream, p);
    }
    // frt_gemv_trace: the instances that write records (not the tail's).
    const auto launch = p.trace != nullptr ? (chunked ? exact_launch_glu<true, true> : exact_launch_glu<true, false>)
                                           : (chunked ? exact_launch_glu<false, true> : exact_launch_glu<false, false>);
    return launch(glu, device, blocks, smem, stream, p);
}
