#include "gemv-bulk.cuh"
#include "gemv-impl.cuh"
#include "moe-ffn-tail.cuh"

#include <algorithm>
#include <cstdint>

// The host side of frt_gemv: checks and plans a launch; the kernels are in gemv-impl.cuh.

static constexpr int kStageWant  = 4096;       // bytes a warp stages at once (staged path)
static constexpr int kStageSlack = 16;  // Q8_0 blocks are read as 9 aligned words: up to 2 bytes past a batch

static bool gemv_repacked(int type) {
    return type == FRT_GEMV_Q6_K_R || type == FRT_GEMV_Q8_0_R;
}

// The direct-path type of a launch: the one type besides GGUF Q6_K/Q8_0 and, when there is none,
// the repacked type with the most bytes (Q6_K_R/Q8_0_R also go through shared memory in a pack
// of another type); -1: none; -2: two direct types (not supported).
static int gemv_direct_type(const frt_gemv_args & a) {
    int     direct = -1;
    int64_t bytes[FRT_GEMV_TYPE_COUNT] = {};
    for (int i = 0; i < a.n_segments; ++i) {
        const int t = a.seg[i].type;
        if (t == FRT_GEMV_Q6_K || t == FRT_GEMV_Q8_0) {
            continue;
        }
        if (!gemv_repacked(t)) {
            if (direct >= 0 && direct != t) {
                return -2;
            }
            direct = t;
        }
        bytes[t] += (int64_t) a.seg[i].rows * frt_gemv_row_bytes((frt_gemv_type) t, a.k) *
                    (a.seg[i].ids ? a.tokens * a.seg[i].n_used : 1);
    }
    if (direct < 0 && (bytes[FRT_GEMV_Q6_K_R] > 0 || bytes[FRT_GEMV_Q8_0_R] > 0)) {
        direct = bytes[FRT_GEMV_Q6_K_R] >= bytes[FRT_GEMV_Q8_0_R] ? FRT_GEMV_Q6_K_R : FRT_GEMV_Q8_0_R;
    }
    return direct;
}

static bool gemv_quantized(int type) {
    return type != FRT_GEMV_F32 && type != FRT_GEMV_F16 && type != FRT_GEMV_BF16;
}

// Direct path: 16-byte items a row. Staged path: blocks a row.
static int gemv_units_per_row(int type, int k) {
    switch (type) {
        case FRT_GEMV_F32:  return k / 4;
        case FRT_GEMV_F16:
        case FRT_GEMV_BF16: return k / 8;
        case FRT_GEMV_Q6_K: return k / 256;
        default:            return k / 32;  // Q4_K, Q5_K, Q6_K_R (8 items a 256-block), Q8_0, Q8_0_R
    }
}

frt_gemv_type frt_gemv_repacked_type(frt_gemv_type type) {
    return type == FRT_GEMV_Q6_K ? FRT_GEMV_Q6_K_R : type == FRT_GEMV_Q8_0 ? FRT_GEMV_Q8_0_R : type;
}

int64_t frt_gemv_row_bytes(frt_gemv_type type, int k) {
    const int64_t nb = k / 256;
    switch (type) {
        case FRT_GEMV_F32:    return 4 * (int64_t) k;
        case FRT_GEMV_F16:
        case FRT_GEMV_BF16:   return 2 * (int64_t) k;
        case FRT_GEMV_Q4_K:   return 144 * nb;
        case FRT_GEMV_Q5_K:   return 176 * nb;
        case FRT_GEMV_Q6_K:   return 210 * nb;
        case FRT_GEMV_Q8_0:   return 34 * (int64_t) (k / 32);
        case FRT_GEMV_Q6_K_R: return 208 * nb + (2 * nb + 15) / 16 * 16;
        case FRT_GEMV_Q8_0_R: return (int64_t) k + ((int64_t) k / 16 + 15) / 16 * 16;
        default:              return 0;
    }
}

static bool gemv_aligned16(const void * p) {
    return (uintptr_t) p % 16 == 0;
}

// Shared memory of a launch (bytes), and its layout into p (the offsets).
static int gemv_layout(const frt_gemv_args & a, int split, int tokens_max, int stage_bytes, gemv_params & p) {
    auto take = [](int & at, int64_t bytes) {
        const int start = at;
        at += (int) ((bytes + 15) / 16 * 16);
        return start;
    };
    int at       = 0;
    p.smem_ids   = take(at, 4 * (int64_t) p.n_ids);
    p.smem_xm    = take(at, p.need_q8 ? 8 * (int64_t) p.n_vec * (a.k / 32) : 0);
    p.smem_xq    = take(at, p.need_q8 ? (int64_t) p.n_vec * a.k : 0);
    p.smem_xf    = take(at, p.need_f32 ? 4 * (int64_t) p.n_vec * a.k : 0);
    p.smem_team  = take(at, split > 1 ? 4 * (int64_t) kWarps * kMaxSplit * kMaxRps * tokens_max : 0);
    p.smem_stage = take(at, (int64_t) kWarps * stage_bytes);
    return at;
}

static int gemv_tokens_max(int tokens) {
    return tokens == 1 ? 1 : tokens == 2 ? 2 : tokens <= 4 ? 4 : 8;
}

// Rows a staged batch takes: a multiple of the rows that keep its start 16-byte aligned.
static int gemv_staged_rows(int64_t row_bytes) {
    int aligned = 1;
    while ((aligned * row_bytes) % 16 != 0) {
        ++aligned;
    }
    return aligned * (int) std::max<int64_t>(1, kStageWant / (aligned * row_bytes));
}

// Everything but the split and the grid: which needs what, staging, ids.
static const char * gemv_check(const frt_gemv_args & a, int & stage_bytes, int & direct, gemv_params & p) {
    if (a.k <= 0 || a.k % 256 != 0) {
        return "frt_gemv: k must be a positive multiple of 256";
    }
    if (a.tokens < 1 || a.tokens > FRT_GEMV_MAX_TOKENS) {
        return "frt_gemv: 1 to 8 tokens";
    }
    if (a.n_segments < 1 || a.n_segments > FRT_GEMV_MAX_SEGMENTS) {
        return "frt_gemv: 1 to 8 segments";
    }
    if (a.x == nullptr || !gemv_aligned16(a.x) || a.x_stride % 4 != 0 || a.x_stride < a.k) {
        return "frt_gemv: x must be 16-byte aligned with a stride of k or more, a multiple of 4";
    }
    if (a.norm != nullptr && !gemv_aligned16(a.norm)) {
        return "frt_gemv: norm must be 16-byte aligned";
    }
    if (a.x_normed != nullptr &&
        (a.norm == nullptr || !gemv_aligned16(a.x_normed) || a.x_normed_stride % 4 != 0 || a.x_normed_stride < a.k)) {
        return "frt_gemv: x_normed needs norm, 16-byte alignment and a stride of k or more, a multiple of 4";
    }
    if (a.x_per_token < 1 || a.x_per_token > FRT_GEMV_MAX_SLOTS) {
        return "frt_gemv: x_per_token must be 1 or the experts a token";
    }
    p.n_vec = a.tokens * a.x_per_token;
    if (a.norm != nullptr && p.n_vec > FRT_GEMV_MAX_TOKENS) {
        return "frt_gemv: the RMS norm prologue takes at most 8 input vectors";
    }
    p.need_q8 = p.need_f32 = 0;
    p.n_ids     = 0;
    stage_bytes = 0;
    for (int i = 0; i < a.n_segments; ++i) {
        if (a.seg[i].type < 0 || a.seg[i].type >= FRT_GEMV_TYPE_COUNT) {
            return "frt_gemv: unknown weight type";
        }
    }
    direct = gemv_direct_type(a);
    if (direct == -2) {
        return "frt_gemv: one launch takes one of F32/F16/BF16/Q4_K/Q5_K (Q6_K and Q8_0, GGUF or repacked, may join "
               "any): split the pack by type";
    }
    for (int i = 0; i < a.n_segments; ++i) {
        const frt_gemv_segment & s = a.seg[i];
        if (s.w == nullptr || !gemv_aligned16(s.w) || s.out == nullptr || s.rows < 1) {
            return "frt_gemv: a segment needs 16-byte aligned weights, an output and rows >= 1";
        }
        if (s.epilogue == FRT_GEMV_SWIGLU) {
            if (s.w_gate == nullptr || !gemv_aligned16(s.w_gate)) {
                return "frt_gemv: FRT_GEMV_SWIGLU needs 16-byte aligned gate weights";
            }
        } else if (s.epilogue != FRT_GEMV_STORE && (s.epilogue != FRT_GEMV_ADD || s.residual == nullptr)) {
            return "frt_gemv: unknown epilogue, or FRT_GEMV_ADD without a residual";
        }
        const int64_t row_bytes = frt_gemv_row_bytes(s.type, a.k);
        const bool    staged    = s.type != direct;
        if (staged ? s.row_stride != row_bytes : s.row_stride < row_bytes || s.row_stride % 16 != 0) {
            return "frt_gemv: row stride: GGUF Q6_K/Q8_0 rows (and repacked ones in a pack of another type) must be "
                   "contiguous, the others a multiple of 16 bytes no smaller than the row";
        }
        if (s.ids != nullptr) {
            if (s.n_used < 1 || a.tokens * s.n_used > FRT_GEMV_MAX_SLOTS || s.n_experts < 1 ||
                s.expert_stride % 16 != 0 || (a.x_per_token != 1 && a.x_per_token != s.n_used)) {
                return "frt_gemv: experts: 1 <= tokens x n_used <= 64, n_experts >= 1, expert stride a multiple of 16, "
                       "x_per_token 1 or n_used";
            }
            p.n_ids += a.tokens * s.n_used;
        } else if (a.x_per_token != 1 && s.x == nullptr) {
            return "frt_gemv: a dense segment reads one input a token (x_per_token == 1)";
        }
        if (s.x != nullptr && (s.ids != nullptr || !gemv_aligned16(s.x))) {
            return "frt_gemv: a segment's own input is a dense segment's, 16-byte aligned";
        }
        if (gemv_quantized(s.type)) {
            p.need_q8 = 1;
        } else {
            p.need_f32 = 1;
        }
        if (staged) {
            stage_bytes = std::max<int>(stage_bytes, (int) (gemv_staged_rows(row_bytes) * row_bytes));
        }
    }
    if (stage_bytes > 0) {
        stage_bytes = (stage_bytes + 15) / 16 * 16 + kStageSlack;
    }
    return nullptr;
}

static const char * gemv_registers_unsupported(const frt_gemv_args & a) {
    gemv_params p;
    int         stage_bytes = 0, direct = -1;
    if (const char * why = gemv_check(a, stage_bytes, direct, p)) {
        return why;
    }
    // The largest split gives the largest layout.
    if (gemv_layout(a, kMaxSplit, gemv_tokens_max(a.tokens), stage_bytes, p) > kMaxSmem) {
        return "frt_gemv: the inputs do not fit in shared memory (fewer tokens, or a smaller k with float weights)";
    }
    return nullptr;
}

static const char * gemv_bulk_unsupported(const frt_gemv_args & a) {
    int         device = 0;
    gemv_device dev;
    if (cudaGetDevice(&device) != cudaSuccess || frt_gemv_device_info(device, dev) != cudaSuccess) {
        return "frt_gemv: no CUDA device";
    }
    if (dev.cc_major < 9) {
        return "frt_gemv: the bulk kernel needs sm_90 or newer";
    }
    bulk_params p;
    int         smem = 0;
    return frt_gemv_bulk_plan(a, dev.smem_optin - kBulkStatic, dev.sms, p, smem);
}

// The exact kernel's routing (frt_gemv_args::route_logits): one warp's selection as ggml-cuda's
// instances make it (a multiple of 32 experts, a lane's share a power of two), at most a warp of
// selected experts, every expert segment reading the selection.
static const char * gemv_route_unsupported(const frt_gemv_args & a) {
    if (a.guess_logits != nullptr) {
        if (a.route_logits != nullptr) {
            return "frt_gemv: a launch routes or guesses, not both";
        }
        const frt_gemv_segment * first = nullptr;
        for (int i = 0; i < a.n_segments; ++i) {
            const frt_gemv_segment & s = a.seg[i];
            if (s.ids == nullptr) {
                continue;
            }
            const int n = s.n_experts;
            if (n != 32 && n != 64 && n != 128 && n != 256 && n != 512) {
                return "frt_gemv: a guess over 32, 64, 128, 256 or 512 experts";
            }
            if (s.n_used < 1 || s.n_used > 32) {
                return "frt_gemv: a guess selects 1 to 32 experts";
            }
            if (first != nullptr && (s.ids != first->ids || s.n_experts != first->n_experts || s.n_used != first->n_used)) {
                return "frt_gemv: a guessing launch's expert segments read the same ids";
            }
            if (s.epilogue == FRT_GEMV_SWIGLU || s.type == FRT_GEMV_F32) {
                return "frt_gemv: a guess stages quantized rows without the SwiGLU epilogue";
            }
            first = &s;
        }
        return first == nullptr ? "frt_gemv: a guess without expert segments" : nullptr;
    }
    if (a.route_logits == nullptr) {
        return nullptr;
    }
    const int n = a.route_n_experts;
    if (n != 32 && n != 64 && n != 128 && n != 256 && n != 512) {
        return "frt_gemv: routing over 32, 64, 128, 256 or 512 experts";
    }
    if (a.route_ids == nullptr || a.route_weights == nullptr) {
        return "frt_gemv: routing writes ids and weights";
    }
    int n_used = 0;
    for (int i = 0; i < a.n_segments; ++i) {
        const frt_gemv_segment & s = a.seg[i];
        if (s.ids == nullptr) {
            continue;
        }
        if (s.ids != a.route_ids || s.n_experts != n || (n_used != 0 && s.n_used != n_used)) {
            return "frt_gemv: a routed launch's expert segments read the routed ids";
        }
        n_used = s.n_used;
    }
    if (n_used < 1 || n_used > 32) {
        return "frt_gemv: routing selects 1 to 32 experts for at least one expert segment";
    }
    return nullptr;
}

// The fused MoE tail (frt_gemv_args::tail), exact kernel only.
static const char * gemv_tail_unsupported(const frt_gemv_args & a) {
    const frt_gemv_moe_tail & t = a.tail;
    if (t.out == nullptr) {
        return nullptr;
    }
    if (t.weights == nullptr || t.gate == nullptr || t.residual == nullptr) {
        return "frt_gemv: the MoE tail reads routing weights, a gate and a residual";
    }
    if (a.n_segments != 2 || t.experts_seg < 0 || t.experts_seg >= 2 || t.shexp_seg < 0 || t.shexp_seg >= 2 ||
        t.experts_seg == t.shexp_seg) {
        return "frt_gemv: the MoE tail's segments are not the launch's two segments";
    }
    const frt_gemv_segment & e = a.seg[t.experts_seg];
    const frt_gemv_segment & d = a.seg[t.shexp_seg];
    if (e.ids == nullptr || d.ids != nullptr) {
        return "frt_gemv: the MoE tail adds an expert segment's slots and a dense segment";
    }
    if (e.rows != d.rows || e.type == FRT_GEMV_F32 || d.type == FRT_GEMV_F32 || e.epilogue != FRT_GEMV_STORE ||
        d.epilogue != FRT_GEMV_STORE) {
        return "frt_gemv: the MoE tail's segments are quantized matrices of as many rows, plain stores";
    }
    if (e.n_used < 1 || e.n_used > FRT_MOE_TAIL_MAX_USED) {
        return "frt_gemv: the MoE tail adds 1 to 16 slots";
    }
    return nullptr;
}

static const char * gemv_exact_unsupported(const frt_gemv_args & a) {
    gemv_params p;
    int         stage_bytes = 0, direct = -1;
    if (const char * why = gemv_check(a, stage_bytes, direct, p)) {
        return why;
    }
    if (a.tokens != 1) {
        return "frt_gemv: the exact kernel takes one token";
    }
    if (a.x_q8 != nullptr) {
        if (a.x_normed != nullptr || a.x_per_token != 1 || a.k > FRT_X_Q8_MAX_K || (uintptr_t) a.x_q8 % 16 != 0) {
            return "frt_gemv: x already quantized needs no x_normed, one vector, k <= FRT_X_Q8_MAX_K, 16-byte alignment";
        }
        for (int i = 0; i < a.n_segments; ++i) {
            if (a.seg[i].x != nullptr) {
                return "frt_gemv: x already quantized goes without a segment's own input";
            }
        }
        for (int i = 0; i < a.n_segments; ++i) {
            if (a.seg[i].type == FRT_GEMV_F32) {
                return "frt_gemv: x already quantized goes without F32 weights (they read x in float)";
            }
        }
    }
    if (a.x_normed_q8 != nullptr) {
        if (a.x_normed == nullptr || a.k > FRT_X_Q8_MAX_K || (uintptr_t) a.x_normed_q8 % 16 != 0) {
            return "frt_gemv: the normed x's image needs x_normed, k <= FRT_X_Q8_MAX_K, 16-byte alignment";
        }
        if (!frt_gemv_exact_on_router(a)) {
            return "frt_gemv: only a launch on frt_router_f32 (an input norm and F32 rows, one token) writes the "
                   "normed x's image";
        }
    }
    if (a.prefetch.n < 0 || a.prefetch.n > FRT_GEMV_MAX_PREFETCH) {
        return "frt_gemv: 0 to FRT_GEMV_MAX_PREFETCH prefetch ranges";
    }
    for (int i = 0; i < a.prefetch.n; ++i) {
        if ((uintptr_t) a.prefetch.ptr[i] % 16 != 0 || a.prefetch.bytes[i] < 0 || a.prefetch.bytes[i] % 16 != 0) {
            return "frt_gemv: a prefetch range 16-byte aligned, a multiple of 16 bytes";
        }
    }
    if (a.prefetch.experts != nullptr) {
        const frt_gemv_prefetch & f = a.prefetch;
        if (a.route_logits == nullptr) {
            return "frt_gemv: experts' prefetch in a launch that routes";
        }
        if ((uintptr_t) f.experts % 16 != 0 || f.expert_stride % 16 != 0 || f.expert_bytes <= 0 ||
            f.expert_bytes % 16 != 0 || f.expert_bytes > f.expert_stride) {
            return "frt_gemv: experts' prefetch 16-byte aligned, multiples of 16 bytes, within an expert";
        }
    }
    for (int i = 0; i < a.n_segments; ++i) {
        const frt_gemv_type t = a.seg[i].type;
        if (t != FRT_GEMV_Q4_K && t != FRT_GEMV_Q6_K && t != FRT_GEMV_Q8_0 && t != FRT_GEMV_F32) {
            return "frt_gemv: the exact kernel takes GGUF Q4_K, Q6_K, Q8_0 and F32 weights";
        }
        if (t == FRT_GEMV_F32 && a.seg[i].epilogue == FRT_GEMV_SWIGLU) {
            return "frt_gemv: the exact kernel's FRT_GEMV_SWIGLU takes quantized weights";
        }
        if ((a.seg[i].epilogue == FRT_GEMV_SWIGLU) != (a.seg[0].epilogue == FRT_GEMV_SWIGLU)) {
            return "frt_gemv: FRT_GEMV_SWIGLU on every segment of a launch or on none";
        }
        if (a.seg[i].row_stride != frt_gemv_row_bytes(t, a.k)) {
            return "frt_gemv: the exact kernel takes contiguous rows";
        }
        if (a.seg[i].x != nullptr && a.norm != nullptr) {
            return "frt_gemv: a segment's own input goes without a norm";
        }
    }
    if (const char * why = gemv_route_unsupported(a)) {
        return why;
    }
    if (const char * why = gemv_tail_unsupported(a)) {
        return why;
    }
    int smem_xm = 0, smem_xf = 0;
    if (frt_gemv_exact_layout(a, smem_xm, smem_xf) > kMaxSmem) {
        return "frt_gemv: the inputs do not fit in shared memory";
    }
    return nullptr;
}

// AUTO runs the head kernel on a matrix of at least this many rows: its grid keeps every warp of
// the device on rows (2112 warps on an H200) for more than a few batches, where the register
// kernel's ~2.5 TB/s holds it back (docs/perf-notes.md, the LM head).
static constexpr int kHeadMinRows = 65536;

// GGML_FLASHRT_HEAD_KERNEL=0 leaves such matrices to the register kernel, as before (to bisect).
static bool gemv_auto_takes_head(const frt_gemv_args & a) {
    static const bool on = frt_env_flag("GGML_FLASHRT_HEAD_KERNEL", true);
    return on && a.n_segments == 1 && a.seg[0].rows >= kHeadMinRows && frt_gemv_head_unsupported(a) == nullptr;
}

const char * frt_gemv_unsupported(const frt_gemv_args & a, frt_gemv_kernel kernel) {
    if (kernel != FRT_GEMV_KERNEL_EXACT) {
        if (a.route_logits != nullptr || a.guess_logits != nullptr) {
            return "frt_gemv: only the exact kernel selects the routed experts";
        }
        for (int i = 0; i < a.n_segments; ++i) {
            if (a.seg[i].x != nullptr) {
                return "frt_gemv: only the exact kernel takes a segment's own input";
            }
        }
        if (a.tail.out != nullptr) {
            return "frt_gemv: only the exact kernel computes an MoE tail";
        }
        if (a.prefetch.n != 0 || a.prefetch.experts != nullptr) {
            return "frt_gemv: only the exact kernel prefetches later launches' weights";
        }
        if (a.x_q8 != nullptr || a.x_normed_q8 != nullptr) {
            return "frt_gemv: only the exact kernel takes x already quantized or writes its image";
        }
        for (int i = 0; i < a.n_segments; ++i) {
            if (a.seg[i].epilogue == FRT_GEMV_SWIGLU) {
                return "frt_gemv: only the exact kernel has the FRT_GEMV_SWIGLU epilogue";
            }
        }
    }
    switch (kernel) {
        case FRT_GEMV_KERNEL_AUTO:
            return gemv_auto_takes_head(a) ? nullptr : gemv_registers_unsupported(a);
        case FRT_GEMV_KERNEL_REGISTERS: return gemv_registers_unsupported(a);
        case FRT_GEMV_KERNEL_HEAD:      return frt_gemv_head_unsupported(a);
        case FRT_GEMV_KERNEL_BULK:      return gemv_bulk_unsupported(a);
        case FRT_GEMV_KERNEL_EXACT:     return gemv_exact_unsupported(a);
        default:                        return "frt_gemv: unknown kernel";
    }
}

// The bulk kernel's plan: which rows a stage holds, how the items of a row spread over lanes.
const char * frt_gemv_bulk_plan(const frt_gemv_args & a, int smem_optin, int sms, bulk_params & p, int & smem) {
    if (a.tokens != 1) {
        return "frt_gemv: the bulk kernel takes 1 token";
    }
    // The register kernel's checks hold for the bulk kernel at 1 token (one item type a launch,
    // staged rows contiguous, the experts' limits); it adds that a staged matrix is a multiple
    // of 16 bytes (its copies move 16-byte multiples).
    gemv_params checked;
    int         stage_bytes = 0;
    if (const char * why = gemv_check(a, stage_bytes, p.direct, checked)) {
        return why;
    }
    p.x          = { a.x, a.norm, a.x_stride, a.eps, a.k, a.x_per_token, checked.need_q8, checked.need_f32,
                     a.x_normed, a.x_normed_stride };
    p.n_segments = a.n_segments;
    int64_t bytes = 0, stage = 0;
    int     part_rows = 0;  // the most rows of a tensor-core chunk: a stage's partial sums, a block each
    for (int i = 0; i < a.n_segments; ++i) {
        const frt_gemv_segment & s = a.seg[i];
        bulk_seg &               q = p.seg[i];
        const int64_t row_bytes = frt_gemv_row_bytes(s.type, a.k);
        q.staged                = s.type != p.direct;
        if (q.staged && (int64_t) s.rows * row_bytes % 16 != 0) {
            return "frt_gemv: the bulk kernel needs GGUF Q6_K/Q8_0 matrices (and repacked ones in a pack of another "
                   "type) of a multiple of 16 bytes";
        }
        q.w               = (const uint8_t *) s.w;
        q.out             = s.out;
        q.residual        = s.residual;
        q.ids             = s.ids;
        q.row_stride      = s.row_stride;
        q.out_stride      = s.out_stride;
        q.residual_stride = s.residual_stride;
        q.ids_stride      = s.ids_stride;
        q.expert_stride   = s.expert_stride;
        q.type            = s.type;
        q.rows            = s.rows;
        q.epilogue        = s.epilogue;
        q.n_used          = s.n_used;
        q.n_experts       = s.n_experts;
        q.n_inst          = s.ids ? s.n_used : 1;
        q.x_per_token     = a.x_per_token;
        q.quantum         = 1;
        while (q.quantum * s.row_stride % 16 != 0) {
            ++q.quantum;
        }
        q.units         = (s.rows + q.quantum - 1) / q.quantum;
        q.inst_bytes    = (int64_t) s.rows * s.row_stride;
        q.bytes_begin   = bytes;
        bytes += q.n_inst * q.inst_bytes;
        q.units_per_row = gemv_units_per_row(s.type, a.k);
        // Lanes a row: the fewest (8 at least) that give a lane at most kBulkItems items, or a warp
        // a row when a block's share of the rows would leave warps idle.
        q.lpr = 8;
        while (q.lpr < 32 && (q.units_per_row + q.lpr - 1) / q.lpr > kBulkItems) {
            q.lpr *= 2;
        }
        if ((int64_t) q.n_inst * s.rows < (int64_t) sms * kBulkWarps * (32 / q.lpr)) {
            q.lpr = 32;
        }
        q.ipl = (q.units_per_row + q.lpr - 1) / q.lpr;
        // The quantized types on the tensor cores: a chunk is whole 16-row tiles, enough (row tile,
        // 256-column block) tasks for every warp; rows whose size is a multiple of 16 bytes are
        // copied one by one to a pitch of 16 past a multiple of 128 (the 8 rows of a fragment
        // load then fall in different banks).
        q.mma       = gemv_quantized(s.type);  // every quantized type (Q4_K/Q5_K are never staged)
        q.row_bytes = (int) row_bytes;
        q.pitch     = q.mma && row_bytes % 16 == 0 ? (int) (row_bytes + (144 - row_bytes % 128) % 128)
                                                  : (int) s.row_stride;
        if (q.mma) {
            const int nb = a.k / 256;
            q.chunk_rows = 16 * std::max(1, (kBulkWarps + nb - 1) / nb);  // a multiple of every quantum here
            stage        = std::max(stage, (int64_t) q.chunk_rows * q.pitch);
            part_rows    = std::max(part_rows, q.chunk_rows);
            continue;
        }
        // Chunks: the rows every consumer warp takes at once (a row group each, or a quantum each
        // for staged rows), as many of those as kBulkStageWant holds (one if it holds none but
        // twice it does); else the quanta kBulkStageWant holds (one at least).
        const int64_t group_rows = (int64_t) kBulkWarps * (q.staged ? q.quantum : 32 / q.lpr);
        const int64_t group      = group_rows * s.row_stride;
        const int64_t unit       = (int64_t) q.quantum * s.row_stride;
        if (unit > 2 * kBulkStageWant) {
            return "frt_gemv: the bulk kernel's stages hold no row of this matrix";
        }
        q.chunk_rows = group <= 2 * kBulkStageWant
                           ? (int) (std::max<int64_t>(1, kBulkStageWant / group) * group_rows)
                           : (int) (std::max<int64_t>(1, kBulkStageWant / unit) * q.quantum);
        stage = std::max(stage, (int64_t) q.chunk_rows * s.row_stride);
    }
    p.total_bytes = bytes;
    p.lab         = 0;
    auto take     = [](int & at, int64_t n) {
        const int start = at;
        at += (int) ((n + 127) / 128 * 128);
        return start;
    };
    const int64_t n_vec = a.x_per_token;
    int           at    = 0;
    p.smem_xm           = take(at, p.x.need_q8 ? 8 * n_vec * (a.k / 32) : 0);
    p.smem_xq           = take(at, p.x.need_q8 ? n_vec * a.k : 0);
    p.smem_xf           = take(at, p.x.need_f32 ? 4 * n_vec * a.k : 0);
    // Stages: what a block's share needs (all of it in flight before the wait for the previous
    // kernel when it fits), at most what shared memory holds; each with the partial sums of its
    // tensor-core chunk, which stay until the producer adds them up before refilling the stage.
    p.stage_bytes       = (int) ((stage + 15) / 16 * 16) + kBulkSlack;
    p.part_bytes        = (int) ((4 * (int64_t) part_rows * (a.k / 256) + 127) / 128 * 128);
    const int64_t want  = (bytes / std::max(sms, 1) + stage - 1) / stage + 1;
    p.stages            = (int) std::min<int64_t>({ std::max<int64_t>(want, 2), kBulkMaxStages,
                                                    (smem_optin - at) / (p.stage_bytes + p.part_bytes) });
    if (p.stages < 2) {
        return "frt_gemv: the inputs leave the bulk kernel too little shared memory";
    }
    p.smem_part  = at;
    p.smem_stage = at + p.stages * p.part_bytes;
    smem         = p.smem_stage + p.stages * p.stage_bytes;
    return nullptr;
}

const char * frt_gemv_plan(const frt_gemv_args & a, int warps_available, gemv_params & p, int & smem) {
    int stage_bytes = 0, direct = -1;
    if (const char * why = gemv_check(a, stage_bytes, direct, p)) {
        return why;
    }
    p.x           = a.x;
    p.norm        = a.norm;
    p.x_stride    = a.x_stride;
    p.eps         = a.eps;
    p.x_out        = a.x_normed;
    p.x_out_stride = a.x_normed_stride;
    p.lab          = 0;
    p.k           = a.k;
    p.tokens      = a.tokens;
    p.x_per_token = a.x_per_token;
    p.n_segments  = a.n_segments;
    p.stage_bytes = stage_bytes;

    // Lanes a row and split. "fill": the fewest lanes a row (>= 8) whose items fill U loads a lane;
    // "wide": 32 lanes a row, for launches with few rows. Of the candidates, the fewest rounds of
    // warps over the rows, then the most warps busy, then the smallest split.
    const int tokens_max = gemv_tokens_max(a.tokens);
    bool      staged     = false;
    for (int i = 0; i < a.n_segments; ++i) {
        staged = staged || a.seg[i].type != direct;
    }
    auto lanes_a_row = [&](const frt_gemv_segment & s, bool wide, int split) {
        if (wide) {
            return 32;
        }
        const int units = gemv_units_per_row(s.type, a.k);
        const int want  = (units + gemv_items_in_flight(s.type, tokens_max) * split - 1) /
                         (gemv_items_in_flight(s.type, tokens_max) * split);
        int lpr = 8;
        while (lpr < want && lpr < 32) {
            lpr *= 2;
        }
        return lpr;
    };
    // Warps busy at once for a candidate, or -1 when a slice would get no item.
    auto warps_for = [&](bool wide, int split) -> int64_t {
        int64_t warps = 0;
        for (int i = 0; i < a.n_segments; ++i) {
            const frt_gemv_segment & s      = a.seg[i];
            const int                n_inst = s.ids ? a.tokens * s.n_used : 1;
            if (s.type != direct) {
                warps += (int64_t) n_inst * ((s.rows + gemv_staged_rows(frt_gemv_row_bytes(s.type, a.k)) - 1) /
                                             gemv_staged_rows(frt_gemv_row_bytes(s.type, a.k)));
                continue;
            }
            const int lpr = lanes_a_row(s, wide, split);
            if (gemv_units_per_row(s.type, a.k) < lpr * split) {
                return -1;
            }
            warps += (int64_t) n_inst * ((s.rows + 32 / lpr - 1) / (32 / lpr)) * split;
        }
        return warps;
    };
    bool    wide = false;
    int64_t best_rounds = 0, best_busy = 0;
    p.split = 0;
    for (int split = 1; split <= (staged ? 1 : kMaxSplit); split *= 2) {
        for (const bool w : { false, true }) {
            const int64_t warps = warps_for(w, split);
            if (warps < 0) {
                continue;
            }
            const int64_t rounds = (warps + warps_available - 1) / warps_available;
            const int64_t busy   = std::min<int64_t>(warps, warps_available);
            if (p.split == 0 || rounds < best_rounds || (rounds == best_rounds && busy > best_busy)) {
                p.split     = split;
                wide        = w;
                best_rounds = rounds;
                best_busy   = busy;
            }
        }
    }

    int batches = 0, ids_at = 0;
    for (int i = 0; i < a.n_segments; ++i) {
        const frt_gemv_segment & s = a.seg[i];
        gemv_seg_plan &          q = p.seg[i];
        q.w               = (const uint8_t *) s.w;
        q.out             = s.out;
        q.residual        = s.residual;
        q.ids             = s.ids;
        q.row_stride      = s.row_stride;
        q.out_stride      = s.out_stride;
        q.residual_stride = s.residual_stride;
        q.ids_stride      = s.ids_stride;
        q.expert_stride   = s.expert_stride;
        q.type            = s.type;
        q.rows            = s.rows;
        q.epilogue        = s.epilogue;
        q.n_used          = s.n_used;
        q.n_experts       = s.n_experts;
        q.row_bytes       = (int) frt_gemv_row_bytes(s.type, a.k);
        q.n_inst          = s.ids ? a.tokens * s.n_used : 1;
        q.units_per_row   = gemv_units_per_row(s.type, a.k);
        q.ids_smem        = ids_at;
        ids_at += s.ids ? q.n_inst : 0;
        q.staged          = s.type != direct;
        if (q.staged) {
            q.lpr = q.ipl = 1;
            q.rows_per_batch      = gemv_staged_rows(q.row_bytes);
        } else {
            q.lpr            = lanes_a_row(s, wide, p.split);
            q.ipl            = (q.units_per_row + q.lpr * p.split - 1) / (q.lpr * p.split);
            q.rows_per_batch = 32 / q.lpr;
        }
        q.batches_per_inst = (s.rows + q.rows_per_batch - 1) / q.rows_per_batch;
        q.batch_begin      = batches;
        batches += q.n_inst * q.batches_per_inst;
    }
    p.total_batches = batches;
    // The preload of dense direct segments' first chunks shares the warps' buffers with staging;
    // without room for it, those chunks are prefetched into L2 instead.
    bool dense_direct = false;
    for (int i = 0; i < a.n_segments; ++i) {
        dense_direct = dense_direct || (a.seg[i].type == direct && a.seg[i].ids == nullptr);
    }
    if (dense_direct) {
        const int with_preload = std::max(stage_bytes, gemv_preload_bytes(direct, tokens_max));
        smem                   = gemv_layout(a, p.split, tokens_max, with_preload, p);
        if (smem <= kMaxSmem) {
            p.preload     = 1;
            p.stage_bytes = with_preload;
            return nullptr;
        }
    }
    p.preload = 0;
    smem      = gemv_layout(a, p.split, tokens_max, stage_bytes, p);
    if (smem > kMaxSmem) {
        return "frt_gemv: the inputs do not fit in shared memory (fewer tokens, or a smaller k with float weights)";
    }
    return nullptr;
}

cudaError_t frt_gemv_device_info(int device, gemv_device & info) {
    const auto ask = [](int d, gemv_device & out) {
        cudaError_t err = cudaDeviceGetAttribute(&out.sms, cudaDevAttrMultiProcessorCount, d);
        if (err == cudaSuccess) {
            err = cudaDeviceGetAttribute(&out.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, d);
        }
        if (err == cudaSuccess) {
            err = cudaDeviceGetAttribute(&out.smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, d);
        }
        if (err == cudaSuccess) {
            err = cudaDeviceGetAttribute(&out.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d);
        }
        if (err == cudaSuccess) {
            err = cudaDeviceGetAttribute(&out.cc_major, cudaDevAttrComputeCapabilityMajor, d);
        }
        return err;
    };
    if (device < 0 || device >= kMaxDevices) {
        return ask(device, info);
    }
    static std::once_flag once[kMaxDevices];
    static gemv_device    known[kMaxDevices];
    static cudaError_t    result[kMaxDevices];
    std::call_once(once[device], [&] { result[device] = ask(device, known[device]); });
    info = known[device];
    return result[device];
}

cudaError_t frt_gemv(const frt_gemv_args & args, cudaStream_t stream, frt_gemv_kernel kernel) {
    if (kernel == FRT_GEMV_KERNEL_AUTO && gemv_auto_takes_head(args)) {
        kernel = FRT_GEMV_KERNEL_HEAD;  // decided once: the checks below are the head kernel's
    }
    if (frt_gemv_unsupported(args, kernel) != nullptr) {
        return cudaErrorInvalidValue;
    }
    if (kernel == FRT_GEMV_KERNEL_BULK) {
        return frt_gemv_bulk_launch(args, stream);
    }
    if (kernel == FRT_GEMV_KERNEL_EXACT) {
        return frt_gemv_exact_launch(args, stream);
    }
    if (kernel == FRT_GEMV_KERNEL_HEAD) {
        return frt_gemv_head_launch(args, stream);
    }
    const int direct = gemv_direct_type(args);
    switch (gemv_tokens_max(args.tokens)) {
        case 1:  return frt_gemv_launch_tokens1(args, direct, stream);
        case 2:  return frt_gemv_launch_tokens2(args, direct, stream);
        case 4:  return frt_gemv_launch_tokens4(args, direct, stream);
        default: return frt_gemv_launch_tokens8(args, direct, stream);
    }
}
