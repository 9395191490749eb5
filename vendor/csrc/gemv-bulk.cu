// frt_gemv's bulk kernel: 1 token, sm_90 and newer. The design is in gemv.cuh ("Bulk kernel").
// Terms: a quantum is the fewest rows whose bytes are a multiple of 16 (bulk copies move 16-byte
// multiples between 16-byte aligned addresses); a chunk is the rows of one instance (a matrix, or
// one expert slot) that one shared-memory stage holds, shared by all consumer warps; a position
// (segment, instance, quantum) orders the launch's rows the way their bytes are laid end to end.

#include "gemv-bulk.cuh"
#include "bulk-copy.cuh"
#include "env-switch.cuh"

#include <algorithm>

// ---- positions and chunks ----

struct bulk_pos {
    int si, inst, u;
};

static __device__ __forceinline__ bool bulk_before(const bulk_pos & a, const bulk_pos & b) {
    return a.si != b.si ? a.si < b.si : a.inst != b.inst ? a.inst < b.inst : a.u < b.u;
}

// The first quantum whose bytes start at or after `at` (the end of the launch when none does).
// Block b takes the quanta starting in [b, b + 1) x total / blocks: balanced by bytes.
static __device__ bulk_pos bulk_first_at(const bulk_params & p, int64_t at) {
    for (int si = 0; si < p.n_segments; ++si) {
        const bulk_seg & s = p.seg[si];
        if (at >= s.bytes_begin + s.n_inst * s.inst_bytes) {
            continue;
        }
        const int64_t off     = at > s.bytes_begin ? at - s.bytes_begin : 0;
        int           inst    = (int) (off / s.inst_bytes);
        const int64_t quantum = (int64_t) s.quantum * s.row_stride;
        int           u       = (int) ((off - inst * s.inst_bytes + quantum - 1) / quantum);
        if (u >= s.units) {
            u = 0;
            ++inst;
        }
        if (inst < s.n_inst) {
            return { si, inst, u };
        }
    }
    return { p.n_segments, 0, 0 };
}

struct bulk_chunk {
    int si, inst, row0, nrows;
};

// The next chunk from `cur` (advanced past it), or false at `end`.
static __device__ __forceinline__ bool bulk_next(const bulk_params & p, bulk_pos & cur, const bulk_pos & end,
                                                 bulk_chunk & c) {
    if (!bulk_before(cur, end)) {
        return false;
    }
    const bulk_seg & s     = p.seg[cur.si];
    const int        u_end = cur.si == end.si && cur.inst == end.inst ? end.u : s.units;
    const int        u1    = min(u_end, cur.u + s.chunk_rows / s.quantum);
    c                      = { cur.si, cur.inst, cur.u * s.quantum, min(u1 * s.quantum, s.rows) - cur.u * s.quantum };
    cur.u                  = u1;
    if (cur.u >= s.units) {
        cur.u = 0;
        if (++cur.inst >= s.n_inst) {
            cur.inst = 0;
            ++cur.si;
        }
    }
    return true;
}

// ---- the producer warp: its lane 0 issues every copy of the block; the warp finishes chunks ----

static __device__ __forceinline__ void bulk_store(const bulk_seg & s, int inst, int row, float v, int lab) {
    if (lab & 4) {
        if (v == 1234.5f) {
            s.out[0] = v;  // keeps the math
        }
        return;
    }
    if (s.epilogue == FRT_GEMV_ADD) {
        v += s.residual[inst * s.residual_stride + row];
    }
    s.out[inst * s.out_stride + row] = v;  // dense: inst 0
}

// After the consumers released chunk c's stage: a chunk with no matrix (flag -1) becomes NaN rows,
// visibly; a tensor-core chunk's rows are the sums of their blocks' partial sums, added in block
// order (the same order whichever warps computed them). Item chunks were stored by the consumers.
static __device__ void bulk_finish(const bulk_params & p, const bulk_chunk & c, int flag, const float * part,
                                   int lane) {
    const bulk_seg & s = p.seg[c.si];
    if (flag < 0) {
        for (int r = lane; r < c.nrows; r += 32) {
            s.out[c.inst * s.out_stride + c.row0 + r] = __int_as_float(0x7fffffff);
        }
        return;
    }
    if (!s.mma || (p.lab & 1)) {
        return;
    }
    const int nb = p.x.k / 256;
    for (int r = lane; r < c.nrows; r += 32) {
        float v = 0.0f;
        for (int b = 0; b < nb; ++b) {
            v += part[r * nb + b];
        }
        bulk_store(s, c.inst, c.row0 + r, v, p.lab);
    }
}

// Chunk i goes to stage i % stages once the consumers have released the chunk before it there,
// which the warp then finishes (bulk_finish); the last chunks are finished at the end. Expert
// chunks: the expert is read after the wait for the previous kernel (it writes the ids); chunks
// with no valid expert copy nothing and are flagged (-1) for the consumers.
static __device__ void bulk_produce(const bulk_params & p, bulk_pos cur, const bulk_pos & end, uint8_t * stages,
                                    const uint8_t * parts, uint64_t * full, uint64_t * empty, int32_t * flag,
                                    bulk_chunk * ring, int lane) {
    const uint64_t policy = bulk_evict_first_policy();
    bool           waited = false;
    // Before the first read of ids or store of results: the previous kernel writes the one and
    // may still read the other.
    const auto wait_once = [&waited] {
        if (!waited) {
            frt_pdl_wait();
            waited = true;
        }
    };
    const auto finish = [&](int slot) {
        wait_once();
        bulk_finish(p, ring[slot], flag[slot], (const float *) (parts + slot * p.part_bytes), lane);
        __syncwarp();  // every lane has read the slot's chunk and flag before lane 0 rewrites them
    };
    bulk_chunk c;
    int        i = 0;
    for (; bulk_next(p, cur, end, c); ++i) {
        const int slot = i % p.stages;
        if (i >= p.stages) {
            bulk_bar_wait(&empty[slot], (i / p.stages - 1) & 1);
            finish(slot);
        }
        const bulk_seg & s = p.seg[c.si];
        if (s.ids != nullptr) {
            wait_once();
        }
        if (lane == 0) {
            ring[slot]     = c;
            const uint8_t * w = s.w;
            int             expert = 0;
            if (s.ids != nullptr) {
                expert = __ldg(s.ids + (c.inst / s.n_used) * s.ids_stride + c.inst % s.n_used);
                w += (int64_t) expert * s.expert_stride;
            }
            if (s.ids != nullptr && (expert < 0 || expert >= s.n_experts)) {
                flag[slot] = -1;
                bulk_bar_arrive(&full[slot]);
            } else {
                flag[slot]          = 0;
                uint8_t *       dst = stages + slot * p.stage_bytes;
                const uint8_t * src = w + (int64_t) c.row0 * s.row_stride;
                if (s.pitch == s.row_stride) {
                    const uint32_t bytes = (uint32_t) (c.nrows * s.row_stride);
                    bulk_bar_arrive_expect(&full[slot], bytes);
                    bulk_copy(dst, src, bytes, &full[slot], policy);
                } else {
                    // Row by row to its pitch (mma rows: a multiple of 16 bytes each).
                    const int row_bytes = s.row_bytes;
                    bulk_bar_arrive_expect(&full[slot], (uint32_t) (c.nrows * row_bytes));
                    for (int r = 0; r < c.nrows; ++r) {
                        bulk_copy(dst + r * s.pitch, src + r * s.row_stride, (uint32_t) row_bytes, &full[slot],
                                  policy);
                    }
                }
            }
        }
        __syncwarp();
    }
    for (int j = i > p.stages ? i - p.stages : 0; j < i; ++j) {
        const int slot = j % p.stages;
        bulk_bar_wait(&empty[slot], (j / p.stages) & 1);
        finish(slot);
    }
}

// ---- the consumers ----

static __device__ __forceinline__ gemv_x bulk_x_of(const bulk_params & p, const bulk_seg & s, int inst,
                                                   const uint8_t * smem) {
    const int vec = s.x_per_token == 1 ? 0 : inst;
    gemv_x    x;
    x.k = p.x.k;
    x.q = (const int8_t *) (smem + p.smem_xq) + vec * p.x.k;
    x.m = (const uint2 *) (smem + p.smem_xm) + vec * (p.x.k / 32);
    x.f = (const float *) (smem + p.smem_xf) + vec * p.x.k;
    return x;
}

// This warp's rows of a chunk of the launch's item type: row groups warp, warp + kBulkWarps, ...
// (32 / lpr rows a group, lpr lanes a row), lane li multiplying items li, li + lpr, ..., kBulkItems
// of them loaded before any is multiplied so that their shared-memory latencies overlap.
template <int TYPE>
static __device__ void bulk_item_rows(const bulk_params & p, const bulk_seg & s, const bulk_chunk & c,
                                      const uint8_t * buf, const uint8_t * smem, int warp, int lane) {
    using tr          = gemv_direct<TYPE>;
    constexpr int U   = kBulkItems;
    const int     k   = p.x.k;
    const int     rpw = 32 / s.lpr, sub = lane / s.lpr, li = lane % s.lpr;
    const bool    swap = lane & 4;
    const gemv_x  x    = bulk_x_of(p, s, c.inst, smem);
    for (int r0 = warp * rpw; r0 < c.nrows; r0 += kBulkWarps * rpw) {
        const int       r   = r0 + sub;
        const bool      ok  = r < c.nrows;
        const uint8_t * row = buf + (int64_t) (ok ? r : 0) * s.row_stride;
        float           acc[1] = { 0.0f };
        for (int j0 = 0; j0 < s.ipl; j0 += U) {
            typename tr::item items[U];
            uint4             heads[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int it = (j0 + u) * s.lpr + li;
                if (ok && j0 + u < s.ipl && it < s.units_per_row) {
                    uint4    words[tr::kWords];
                    uint32_t smalls[tr::kSmall > 0 ? tr::kSmall : 1];
#pragma unroll
                    for (int i = 0; i < tr::kWords; ++i) {
                        words[i] = *(const uint4 *) tr::word(row, it, k, i);
                    }
#pragma unroll
                    for (int i = 0; i < tr::kSmall; ++i) {
                        smalls[i] = *(const uint32_t *) tr::small(row, it, k, i);
                    }
                    items[u] = tr::from(words, smalls, it, k);
                    heads[u] = tr::kSharedHead > 0 ? *(const uint4 *) (row + tr::kSharedHead * (it >> 3))
                                                   : make_uint4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int it = (j0 + u) * s.lpr + li;
                if (ok && j0 + u < s.ipl && it < s.units_per_row) {
                    tr::template dot<1>(items[u], heads[u], it, swap, x, 1, acc);
                }
            }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            if (offset < s.lpr) {
                acc[0] += __shfl_xor_sync(kFull, acc[0], offset);
            }
        }
        if (ok && li == 0) {
            bulk_store(s, c.inst, c.row0 + r, acc[0], p.lab);
        }
    }
}

// ---- the quantized types on the tensor cores ----

// D = A B (fresh accumulators): A 16 x 32 int8 (row-major fragment a), B 32 x 8 int8 (column-major
// fragment b), D 16 x 8 int32. Thread t holds a0: A[t / 4][4 (t % 4) .. + 3], a1: row + 8, a2/a3:
// the same at k + 16; b0: B[4 (t % 4) .. + 3][t / 4], b1: k + 16; d0/d1: D[t / 4][2 (t % 4) + 0/1],
// d2/d3: row + 8.
static __device__ __forceinline__ void bulk_mma_s8(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
#endif
}

// A Q4_K row's sum over sub-blocks 2c (int dot de, x run me) and 2c + 1 (do_, mo): the kernel's
// other paths compute the same terms per 16 values (gemv_k4_dot).
static __device__ __forceinline__ float bulk_q4k_pair(uint4 head, int c, int de, int do_, uint2 me, uint2 mo) {
    uint32_t sc2, m2;
    gemv_k4_scales(head, c, sc2, m2);
    const float d = gemv_half(head.x), dmin = gemv_half(head.x >> 16);
    const int   se = gemv_run_sum(me, 0) + gemv_run_sum(me, 1), so = gemv_run_sum(mo, 0) + gemv_run_sum(mo, 1);
    return __uint_as_float(me.x) * (d * (float) (sc2 & 0xff) * (float) de - dmin * (float) (m2 & 0xff) * (float) se) +
           __uint_as_float(mo.x) * (d * (float) ((sc2 >> 8) & 0xff) * (float) do_ -
                                    dmin * (float) ((m2 >> 8) & 0xff) * (float) so);
}

// The tasks of a chunk of a quantized type on the tensor cores (rows at s.pitch in the stage): tasks
// of (16-row tile, 256-column block), this warp's being first, first + kBulkWarps, ... TASK::run
// multiplies rows g and g + 8 of the tile (g = lane / 4) by the block with mma, x as column 0 of B
// (the other 7 columns zero), and lanes 4g leave the two rows' sums in part[row][block] (the
// producer adds each row's blocks in order once every warp has released the stage).
template <class TASK>
static __device__ void bulk_mma_rows(const bulk_params & p, const bulk_seg & s, const bulk_chunk & c,
                                     const uint8_t * buf, const uint8_t * smem, float * part, int first, int lane) {
    const int    nb = p.x.k / 256, tiles = (c.nrows + 15) / 16, g = lane >> 2;
    const gemv_x x  = bulk_x_of(p, s, c.inst, smem);
    for (int task = first; task < tiles * nb; task += kBulkWarps) {
        const int  tile = task / nb, blk = task % nb;
        const int  r_lo = 16 * tile + g, r_hi = r_lo + 8;
        const bool ok_lo = r_lo < c.nrows, ok_hi = r_hi < c.nrows;
        float      sum_lo = 0.0f, sum_hi = 0.0f;
        TASK::run(buf + (ok_lo ? r_lo : 0) * s.pitch, buf + (ok_hi ? r_hi : 0) * s.pitch, ok_lo, ok_hi, blk, x, lane,
                  sum_lo, sum_hi);
        if ((lane & 3) == 0) {
            part[r_lo * nb + blk] = sum_lo;
            part[r_hi * nb + blk] = sum_hi;
        }
    }
}

// Tensor-core tasks of a chunk (bulk_mma_rows), 0 for item rows.
static __device__ __forceinline__ int bulk_tasks(const bulk_params & p, const bulk_chunk & c) {
    return p.seg[c.si].mma ? (c.nrows + 15) / 16 * (p.x.k / 256) : 0;
}

// A Q4_K or Q5_K block: 8 mma, one a sub-block. Sub-blocks 2c and 2c + 1 are the low and high
// nibbles of qs bytes 32c .. + 31; Q5_K adds bit 2c (2c + 1) of qh byte l as the value's bit 4.
template <int TYPE> struct bulk_k_task {
    static __device__ __forceinline__ void run(const uint8_t * row_lo, const uint8_t * row_hi, bool ok_lo, bool ok_hi,
                                               int blk, const gemv_x & x, int lane, float & sum_lo, float & sum_hi) {
        constexpr bool  Q5 = TYPE == FRT_GEMV_Q5_K;
        constexpr int   kBlock = Q5 ? 176 : 144, kQs = Q5 ? 48 : 16;
        const int       g = lane >> 2, tig = lane & 3;
        const uint8_t * lo = row_lo + kBlock * blk;
        const uint8_t * hi = row_hi + kBlock * blk;
        uint4           head_lo = make_uint4(0, 0, 0, 0), head_hi = make_uint4(0, 0, 0, 0);
        if (tig == 0) {
            head_lo = *(const uint4 *) lo;
            head_hi = *(const uint4 *) hi;
        }
        // Q5_K: the high bits of all 4 sub-block pairs, values l = 4 tig .. + 3 and 16 + 4 tig ..
        const uint32_t qh_lo0 = Q5 && ok_lo ? *(const uint32_t *) (lo + 16 + 4 * tig) : 0u;
        const uint32_t qh_lo1 = Q5 && ok_lo ? *(const uint32_t *) (lo + 32 + 4 * tig) : 0u;
        const uint32_t qh_hi0 = Q5 && ok_hi ? *(const uint32_t *) (hi + 16 + 4 * tig) : 0u;
        const uint32_t qh_hi1 = Q5 && ok_hi ? *(const uint32_t *) (hi + 32 + 4 * tig) : 0u;
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
            const int      off  = kQs + 32 * cc + 4 * tig;
            const uint32_t lo0  = ok_lo ? *(const uint32_t *) (lo + off) : 0u;
            const uint32_t lo1  = ok_lo ? *(const uint32_t *) (lo + off + 16) : 0u;
            const uint32_t hi0  = ok_hi ? *(const uint32_t *) (hi + off) : 0u;
            const uint32_t hi1  = ok_hi ? *(const uint32_t *) (hi + off + 16) : 0u;
            const int      xoff = 256 * blk + 64 * cc + 4 * tig;
            const uint32_t b_e[2] = { g == 0 ? *(const uint32_t *) (x.q + xoff) : 0u,
                                      g == 0 ? *(const uint32_t *) (x.q + xoff + 16) : 0u };
            const uint32_t b_o[2] = { g == 0 ? *(const uint32_t *) (x.q + xoff + 32) : 0u,
                                      g == 0 ? *(const uint32_t *) (x.q + xoff + 48) : 0u };
            uint32_t       a_e[4] = { lo0 & 0x0f0f0f0fu, hi0 & 0x0f0f0f0fu, lo1 & 0x0f0f0f0fu, hi1 & 0x0f0f0f0fu };
            uint32_t       a_o[4] = { (lo0 >> 4) & 0x0f0f0f0fu, (hi0 >> 4) & 0x0f0f0f0fu, (lo1 >> 4) & 0x0f0f0f0fu,
                                      (hi1 >> 4) & 0x0f0f0f0fu };
            if constexpr (Q5) {
                const uint32_t qh[4] = { qh_lo0, qh_hi0, qh_lo1, qh_hi1 };
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    a_e[i] |= ((qh[i] >> (2 * cc)) & 0x01010101u) << 4;
                    a_o[i] |= ((qh[i] >> (2 * cc + 1)) & 0x01010101u) << 4;
                }
            }
            int de[4], dd[4];
            bulk_mma_s8(de, a_e, b_e);
            bulk_mma_s8(dd, a_o, b_o);
            if (tig == 0) {
                const uint2 me = x.m[8 * blk + 2 * cc], mo = x.m[8 * blk + 2 * cc + 1];
                sum_lo += bulk_q4k_pair(head_lo, cc, de[0], dd[0], me, mo);
                sum_hi += bulk_q4k_pair(head_hi, cc, de[2], dd[2], me, mo);
            }
        }
    }
};

// D = A B for m16n8k16 (s8): A 16 x 16 (a0: A[t / 4][4 (t % 4) .. + 3], a1: row + 8), B 16 x 8
// (b0: B[4 (t % 4) .. + 3][t / 4]), D as in bulk_mma_s8.
static __device__ __forceinline__ void bulk_mma_s8_k16(int (&d)[4], const uint32_t (&a)[2], uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%7, %7, %7, %7};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b), "r"(0));
#endif
}

// 4 bytes at p: 4-byte aligned (ALIGNED), or at least 2-byte aligned (GGUF Q6_K blocks are 210
// bytes: some start 2 past a multiple of 4).
template <bool ALIGNED> static __device__ __forceinline__ uint32_t bulk_lds4(const uint8_t * p) {
    if (ALIGNED) {
        return *(const uint32_t *) p;
    }
    const uint32_t * w = (const uint32_t *) ((uintptr_t) p & ~(uintptr_t) 3);
    return __funnelshift_r(w[0], w[1], 8 * (int) ((uintptr_t) p & 3));
}

// Where the 16 scales of a repacked Q6_K block put GGUF scale n (gemv_direct<FRT_GEMV_Q6_K_R>).
static __device__ __forceinline__ int bulk_q6r_scale_at(int n) {
    return 2 * ((n >> 3) * 4 + (n & 3)) + ((n >> 2) & 1);
}

// One (16-row tile, block) task of Q6_K rows: 16 mma of 16 rows x 16 values, one a scale group.
// Group (h, j, s) is values 128 h + 32 j + 16 s .. + 15 of the block: ql bytes 64 h + 32 (j & 1)
// + 16 s (low nibbles for j < 2, high for j >= 2), qh bytes 128 + 32 h + 16 s (bits 2j, 2j + 1),
// GGUF scale 8 h + s + 2 j. Values are 6 bits (the -32 goes through x's run sums).
template <bool REPACKED> struct bulk_q6k_task {
    static __device__ __forceinline__ void run(const uint8_t * row_lo, const uint8_t * row_hi, bool ok_lo, bool ok_hi,
                                               int blk, const gemv_x & x, int lane, float & sum_lo, float & sum_hi) {
        constexpr int   blk_bytes = REPACKED ? 208 : 210;
        const int       g = lane >> 2, tig = lane & 3, nb = x.k / 256;
        const uint8_t * lo = row_lo + blk_bytes * blk;
        const uint8_t * hi = row_hi + blk_bytes * blk;
        const int8_t *  xq = x.q;
        const uint2 *   xm = x.m;
        float           d_lo = 0.0f, d_hi = 0.0f;
        if (tig == 0) {
            d_lo = gemv_half(REPACKED ? *(const unsigned short *) (row_lo + 208 * nb + 2 * blk)
                                      : *(const unsigned short *) (lo + 208));
            d_hi = gemv_half(REPACKED ? *(const unsigned short *) (row_hi + 208 * nb + 2 * blk)
                                      : *(const unsigned short *) (hi + 208));
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int sg = 0; sg < 2; ++sg) {
                const int      off  = 64 * h + 16 * sg + 4 * tig;
                const uint32_t l0_lo = ok_lo ? bulk_lds4<REPACKED>(lo + off) : 0u;
                const uint32_t l1_lo = ok_lo ? bulk_lds4<REPACKED>(lo + off + 32) : 0u;
                const uint32_t qh_lo = ok_lo ? bulk_lds4<REPACKED>(lo + 128 + 32 * h + 16 * sg + 4 * tig) : 0u;
                const uint32_t l0_hi = ok_hi ? bulk_lds4<REPACKED>(hi + off) : 0u;
                const uint32_t l1_hi = ok_hi ? bulk_lds4<REPACKED>(hi + off + 32) : 0u;
                const uint32_t qh_hi = ok_hi ? bulk_lds4<REPACKED>(hi + 128 + 32 * h + 16 * sg + 4 * tig) : 0u;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int      ns    = 4 * (j >> 1);
                    const uint32_t ql_lo = (j & 1) ? l1_lo : l0_lo, ql_hi = (j & 1) ? l1_hi : l0_hi;
                    const uint32_t a[2]  = {
                        ((ql_lo >> ns) & 0x0f0f0f0fu) | (((qh_lo >> (2 * j)) & 0x03030303u) << 4),
                        ((ql_hi >> ns) & 0x0f0f0f0fu) | (((qh_hi >> (2 * j)) & 0x03030303u) << 4)
                    };
                    const int      xoff  = 256 * blk + 128 * h + 32 * j + 16 * sg;
                    const uint32_t b     = g == 0 ? *(const uint32_t *) (xq + xoff + 4 * tig) : 0u;
                    int            dd[4];
                    bulk_mma_s8_k16(dd, a, b);
                    if ((lane & 3) == 0) {
                        const uint2 m    = xm[xoff / 32];
                        const float xs   = __uint_as_float(m.x);
                        const int   xsum = gemv_run_sum(m, sg);
                        const int   n    = 8 * h + sg + 2 * j;
                        const int   at   = REPACKED ? bulk_q6r_scale_at(n) : n;
                        sum_lo += xs * d_lo * (float) (int8_t) lo[192 + at] * (float) (dd[0] - 32 * xsum);
                        sum_hi += xs * d_hi * (float) (int8_t) hi[192 + at] * (float) (dd[2] - 32 * xsum);
                    }
                }
            }
        }
    }
};

// A Q8_0 block column (GGUF rows: 34-byte blocks, d first; repacked: the quants, then the d's): 8
// mma, one a 32-value block.
template <bool REPACKED> struct bulk_q8_task {
    static __device__ __forceinline__ void run(const uint8_t * row_lo, const uint8_t * row_hi, bool ok_lo, bool ok_hi,
                                               int blk, const gemv_x & x, int lane, float & sum_lo, float & sum_hi) {
        const int g = lane >> 2, tig = lane & 3;
#pragma unroll 2
        for (int bq = 0; bq < 8; ++bq) {
            const int       f     = 8 * blk + bq;
            const uint8_t * qs_lo = REPACKED ? row_lo + 32 * f : row_lo + 34 * f + 2;
            const uint8_t * qs_hi = REPACKED ? row_hi + 32 * f : row_hi + 34 * f + 2;
            const uint32_t  a[4]  = { ok_lo ? bulk_lds4<REPACKED>(qs_lo + 4 * tig) : 0u,
                                      ok_hi ? bulk_lds4<REPACKED>(qs_hi + 4 * tig) : 0u,
                                      ok_lo ? bulk_lds4<REPACKED>(qs_lo + 16 + 4 * tig) : 0u,
                                      ok_hi ? bulk_lds4<REPACKED>(qs_hi + 16 + 4 * tig) : 0u };
            const int       xoff  = 32 * f + 4 * tig;
            const uint32_t  b[2]  = { g == 0 ? *(const uint32_t *) (x.q + xoff) : 0u,
                                      g == 0 ? *(const uint32_t *) (x.q + xoff + 16) : 0u };
            int             dd[4];
            bulk_mma_s8(dd, a, b);
            if (tig == 0) {
                const float xs   = __uint_as_float(x.m[f].x);
                const float d_lo = gemv_half(REPACKED ? *(const unsigned short *) (row_lo + x.k + 2 * f)
                                                      : *(const unsigned short *) (row_lo + 34 * f));
                const float d_hi = gemv_half(REPACKED ? *(const unsigned short *) (row_hi + x.k + 2 * f)
                                                      : *(const unsigned short *) (row_hi + 34 * f));
                sum_lo += xs * d_lo * (float) dd[0];
                sum_hi += xs * d_hi * (float) dd[2];
            }
        }
    }
};

// This warp's share of a chunk: tensor-core tasks from `first` (bulk_mma_rows), or row groups of
// the item type (bulk_item_rows).
template <int DIRECT>
static __device__ void bulk_rows(const bulk_params & p, const bulk_chunk & c, const uint8_t * buf,
                                 const uint8_t * smem, float * part, int first, int warp, int lane) {
    // A copy in registers: the hot loops read its fields, and a dynamically indexed kernel
    // parameter is a slow load each time.
    const bulk_seg s = p.seg[c.si];
    // Q4_K/Q5_K and the float types are only ever the launch's item type (DIRECT); Q6_K and Q8_0,
    // GGUF or repacked, may join any launch.
    switch (s.type) {
        case FRT_GEMV_Q6_K:   bulk_mma_rows<bulk_q6k_task<false>>(p, s, c, buf, smem, part, first, lane); break;
        case FRT_GEMV_Q6_K_R: bulk_mma_rows<bulk_q6k_task<true>>(p, s, c, buf, smem, part, first, lane); break;
        case FRT_GEMV_Q8_0:   bulk_mma_rows<bulk_q8_task<false>>(p, s, c, buf, smem, part, first, lane); break;
        case FRT_GEMV_Q8_0_R: bulk_mma_rows<bulk_q8_task<true>>(p, s, c, buf, smem, part, first, lane); break;
        default:
            if constexpr (DIRECT == FRT_GEMV_Q4_K || DIRECT == FRT_GEMV_Q5_K) {
                bulk_mma_rows<bulk_k_task<DIRECT>>(p, s, c, buf, smem, part, first, lane);
            } else if constexpr (DIRECT == FRT_GEMV_F32 || DIRECT == FRT_GEMV_F16 || DIRECT == FRT_GEMV_BF16) {
                bulk_item_rows<DIRECT>(p, s, c, buf, smem, warp, lane);
            }
            break;
    }
}

// ---- the kernel ----

// One kernel instance a launch type (DIRECT: its Q4_K, Q5_K, F32, F16 or BF16 segments, or a
// repacked type, -1 for none; Q6_K and Q8_0 of either layout may join any), as the register kernel
// does: fewer paths in one kernel keep it within 128 registers without spills.
template <int DIRECT>
__launch_bounds__(kBulkThreads, 1) static __global__ void frt_gemv_bulk_kernel(const __grid_constant__ bulk_params p) {
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ uint64_t   full[kBulkMaxStages], empty[kBulkMaxStages];
    __shared__ int32_t    flag[kBulkMaxStages];
    __shared__ bulk_chunk ring[kBulkMaxStages];  // the chunk in each stage (producer warp)
    const int      warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bulk_pos begin = bulk_first_at(p, p.total_bytes * blockIdx.x / gridDim.x);
    const bulk_pos end   = bulk_first_at(p, p.total_bytes * (blockIdx.x + 1) / gridDim.x);
    uint8_t *      stages = smem + p.smem_stage;
    uint8_t *      parts  = smem + p.smem_part;
    if (threadIdx.x == 0) {
        for (int s = 0; s < p.stages; ++s) {
            bulk_bar_init(&full[s], 1);
            bulk_bar_init(&empty[s], kBulkWarps);
        }
        bulk_bar_init_fence();
    }
    __syncthreads();
    // Every wait below still covers all of this kernel's writes: the next kernel may start now.
    frt_pdl_launch_dependents();
    if (warp == kBulkWarps) {
        // The weights are not written by earlier kernels: their copies start before the wait.
        bulk_produce(p, begin, end, stages, parts, full, empty, flag, ring, lane);
        return;
    }
    frt_pdl_wait();
    gemv_x_in in = p.x;
    if (blockIdx.x != 0) {
        in.x_out = nullptr;  // the normed vectors, when the launch keeps them, are written by block 0 alone
    }
    gemv_prologue_x<32 * kBulkWarps>(in, (int8_t *) (smem + p.smem_xq), (uint2 *) (smem + p.smem_xm),
                                     (float *) (smem + p.smem_xf), threadIdx.x, 1);
#if defined(__CUDA_ARCH__)
    asm volatile("bar.sync 1, %0;" ::"r"(32 * kBulkWarps) : "memory");
#endif
    // Every consumer warp goes through every chunk of the block; the tensor-core tasks are dealt
    // round the warps across chunks (`dealt`: tasks of the chunks before), so that no warp waits
    // for another at a chunk's end.
    bulk_pos   cur   = begin;
    bulk_chunk c;
    int        dealt = 0;
    for (int i = 0; bulk_next(p, cur, end, c); ++i) {
        const int slot = i % p.stages;
        bulk_bar_wait(&full[slot], (i / p.stages) & 1);
        if (flag[slot] >= 0 && !(p.lab & 1)) {
            const int first = ((warp - dealt) % kBulkWarps + kBulkWarps) % kBulkWarps;
            bulk_rows<DIRECT>(p, c, stages + slot * p.stage_bytes, smem, (float *) (parts + slot * p.part_bytes),
                              first, warp, lane);
        }
        dealt += bulk_tasks(p, c);
        __syncwarp();
        if (lane == 0) {
            bulk_bar_arrive(&empty[slot]);
        }
    }
}

// ---- launching (host) ----

template <int DIRECT>
static cudaError_t bulk_launch(const bulk_params & p, int smem, const gemv_device & dev, int device,
                               cudaStream_t stream) {
    const cudaError_t err = frt_allow_smem<frt_gemv_bulk_kernel<DIRECT>>(device, dev.smem_optin - kBulkStatic);
    if (err != cudaSuccess) {
        return err;
    }
    return frt_launch(frt_gemv_bulk_kernel<DIRECT>, dim3(dev.sms), dim3(kBulkThreads), (size_t) smem, stream, p);
}

cudaError_t frt_gemv_bulk_launch(const frt_gemv_args & a, cudaStream_t stream) {
    int         device = 0;
    gemv_device dev;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) {
        err = frt_gemv_device_info(device, dev);
    }
    if (err != cudaSuccess) {
        return err;
    }
    if (dev.cc_major < 9) {
        return cudaErrorNotSupported;
    }
    bulk_params p;
    int         smem = 0;
    if (frt_gemv_bulk_plan(a, dev.smem_optin - kBulkStatic, dev.sms, p, smem) != nullptr) {
        return cudaErrorInvalidValue;
    }
    static const int lab = frt_env_int("FRT_GEMV_BULK_LAB", 0);
    p.lab = lab;
    switch (p.direct) {
        case FRT_GEMV_F32:    return bulk_launch<FRT_GEMV_F32>(p, smem, dev, device, stream);
        case FRT_GEMV_F16:    return bulk_launch<FRT_GEMV_F16>(p, smem, dev, device, stream);
        case FRT_GEMV_BF16:   return bulk_launch<FRT_GEMV_BF16>(p, smem, dev, device, stream);
        case FRT_GEMV_Q4_K:   return bulk_launch<FRT_GEMV_Q4_K>(p, smem, dev, device, stream);
        case FRT_GEMV_Q5_K:   return bulk_launch<FRT_GEMV_Q5_K>(p, smem, dev, device, stream);
        case FRT_GEMV_Q6_K_R: return bulk_launch<FRT_GEMV_Q6_K_R>(p, smem, dev, device, stream);
        case FRT_GEMV_Q8_0_R: return bulk_launch<FRT_GEMV_Q8_0_R>(p, smem, dev, device, stream);
        default:              return bulk_launch<-1>(p, smem, dev, device, stream);
    }
}
