// The FFN norm and the F32 router rows, one row a block (router-f32.cuh).
#include "router-f32.cuh"

#include "pdl.cuh"
#include "q8-x.cuh"
#include "warp-reduce.cuh"

static constexpr int      kThreads     = 256;   // mmvf's block for k >= 1024: thread t sums pairs t, t + 256, ...
static constexpr int      kNormThreads = 1024;  // rms_norm's block for k >= 1024: thread v sums columns v, v + 1024, ...
static constexpr int      kNormPlays   = kNormThreads / kThreads;
static constexpr int      kMaxK        = 4096;

// PAIRS = k / 512: the float pairs a thread multiplies.
template <int PAIRS>
__launch_bounds__(kThreads) static __global__ void frt_router_f32_kernel(const __grid_constant__ frt_router_f32_args a) {
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    int       si = 0, row = blockIdx.x;
    while (row >= a.seg[si].rows) {
        row -= a.seg[si].rows;
        ++si;
    }
    const frt_router_f32_segment & s = a.seg[si];

    // Before the wait: this thread's pairs of the row and of the norm's weight (model weights,
    // which no kernel on the stream writes).
    const float2 * w2 = (const float2 *) (s.w + (int64_t) row * s.row_stride);
    const float2 * n2 = (const float2 *) a.norm;
    float2         w[PAIRS], nw[PAIRS];
#pragma unroll
    for (int j = 0; j < PAIRS; ++j) {
        w[j]  = __ldg(w2 + t + kThreads * j);
        nw[j] = __ldg(n2 + t + kThreads * j);
    }
    // The normed x the launch keeps (x_normed, and its q8 image x_q8) in groups of 32 chunks of 4
    // values (a warp's pass: four whole 32-value blocks, as frt_quantize_q8_chunk takes them),
    // group g by warp 0 of block g (and g + gridDim.x, ...): a warp's pass in each of k / 128
    // blocks, after its row, rather than every pass in block 0, which then ended the launch later.
    // The group's norm weights before the wait, as the row's, parked in shared memory (held in
    // registers to the end, they spilled at k = 2048).
    const float4 *   n4     = (const float4 *) a.norm;
    const int        groups = a.k / 128;
    const bool       keeps  = (a.x_normed != nullptr || a.x_q8 != nullptr) && warp == 0 && (int) blockIdx.x < groups;
    __shared__ float4 nw_group[32];
    if (keeps) {
        nw_group[lane] = __ldg(n4 + 32 * blockIdx.x + lane);
    }
    frt_pdl_wait();

    extern __shared__ float4 xs[];  // k floats
    __shared__ float         warp_sums[kNormThreads / 32];
    const float4 *    x4 = (const float4 *) a.x;
    for (int c = t; c < a.k / 4; c += kThreads) {
        xs[c] = __ldcg(x4 + c);  // the kernel before wrote it: from L2
    }
    __syncthreads();
    frt_pdl_launch_dependents();

    // The norm's scale as rms_norm sums it (exact_norm_scales): virtual thread v = t + 256 m adds
    // the squares of columns v, v + 1024, ... in order; each virtual warp's butterfly; then the 32
    // warp sums in one more.
    const float * xf = (const float *) xs;
    float         tmp[kNormPlays];
#pragma unroll
    for (int m = 0; m < kNormPlays; ++m) {
        tmp[m] = 0.0f;
    }
    for (int c0 = 0; c0 < a.k; c0 += kNormThreads) {
#pragma unroll
        for (int m = 0; m < kNormPlays; ++m) {
            const int col = c0 + t + kThreads * m;
            if (col < a.k) {
                const float xi = xf[col];
                tmp[m] += xi * xi;
            }
        }
    }
#pragma unroll
    for (int m = 0; m < kNormPlays; ++m) {
        const float sum = frt_warp_sum(tmp[m]);
        if (lane == 0) {
            warp_sums[warp + (kThreads / 32) * m] = sum;
        }
    }
    __syncthreads();
    const float sum   = frt_warp_sum(warp_sums[lane]);
    const float mean  = sum / a.k;
    const float scale = rsqrtf(mean + a.eps);

    // The normed value as stock forms it (x * scale * w, frt_norm_chunk's expression), then mmvf's
    // thread t: its pairs in order, two products a pair.
    const float2 * x2  = (const float2 *) xs;
    float          acc = 0.0f;
#pragma unroll
    for (int j = 0; j < PAIRS; ++j) {
        const float2 xv = x2[t + kThreads * j];
        const float2 nx = make_float2(xv.x * scale * nw[j].x, xv.y * scale * nw[j].y);
        acc += w[j].x * nx.x;
        acc += w[j].y * nx.y;
    }
    // mmvf's reduction: each warp's butterfly, then the 8 warp sums (zeros past them) in one more.
    __shared__ float dot_sums[kThreads / 32];
    const float      mine = frt_warp_sum(acc);
    if (lane == 0) {
        dot_sums[warp] = mine;
    }
    __syncthreads();
    if (warp == 0) {
        const float total = frt_warp_sum(lane < kThreads / 32 ? dot_sums[lane] : 0.0f);
        if (lane == 0) {
            s.out[row] = total;
        }
    }
    if (keeps) {
        int8_t * xq = (int8_t *) a.x_q8;
        uint2 *  xm = a.x_q8 != nullptr ? (uint2 *) (xq + a.k) : nullptr;
        for (int g = blockIdx.x; g < groups; g += gridDim.x) {
            const int    i  = 32 * g + lane;
            const float4 nx = frt_norm_chunk(xs[i], scale, g == (int) blockIdx.x ? nw_group[lane] : __ldg(n4 + i));
            if (a.x_normed != nullptr) {
                ((float4 *) a.x_normed)[i] = nx;
            }
            if (a.x_q8 != nullptr) {
                frt_quantize_q8_chunk(nx, i, lane, xq, xm);
            }
        }
    }
}

static bool router_aligned16(const void * p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

const char * frt_router_f32_unsupported(const frt_router_f32_args & a) {
    if (a.k < 1024 || a.k > kMaxK || a.k % 512 != 0) {
        return "k must be a multiple of 512 from 1024 to 4096 (mmvf's block of 256 and rms_norm's of 1024)";
    }
    if (a.x == nullptr || a.norm == nullptr || !router_aligned16(a.x) || !router_aligned16(a.norm)) {
        return "x and the norm's weight must be set and 16-byte aligned";
    }
    if (a.x_normed != nullptr && !router_aligned16(a.x_normed)) {
        return "x_normed must be 16-byte aligned";
    }
    if (a.x_q8 != nullptr && (!router_aligned16(a.x_q8) || a.k > FRT_X_Q8_MAX_K)) {
        return "x_q8 must be 16-byte aligned, k at most FRT_X_Q8_MAX_K";
    }
    if (a.n_segments < 1 || a.n_segments > FRT_ROUTER_F32_MAX_SEGMENTS) {
        return "1 to 4 segments";
    }
    int64_t rows = 0;
    for (int i = 0; i < a.n_segments; ++i) {
        const frt_router_f32_segment & s = a.seg[i];
        if (s.w == nullptr || s.out == nullptr || s.rows < 1 || !router_aligned16(s.w) || s.row_stride < a.k ||
            s.row_stride % 4 != 0) {
            return "a segment needs weights (16-byte aligned, a row stride of at least k floats, a multiple of 4), "
                   "an output and rows";
        }
        rows += s.rows;
    }
    return rows > 65535 ? "at most 65535 rows in all (one block a row)" : nullptr;
}

cudaError_t frt_router_f32(const frt_router_f32_args & a, cudaStream_t stream) {
    if (frt_router_f32_unsupported(a) != nullptr) {
        return cudaErrorInvalidValue;
    }
    int rows = 0;
    for (int i = 0; i < a.n_segments; ++i) {
        rows += a.seg[i].rows;
    }
    const dim3   grid(rows), block(kThreads);
    const size_t smem = (size_t) a.k * sizeof(float);  // at most 16 KB: no attribute needed
    switch (a.k / 512) {
        case 2:  return frt_launch(frt_router_f32_kernel<2>, grid, block, smem, stream, a);
        case 3:  return frt_launch(frt_router_f32_kernel<3>, grid, block, smem, stream, a);
        case 4:  return frt_launch(frt_router_f32_kernel<4>, grid, block, smem, stream, a);
        case 5:  return frt_launch(frt_router_f32_kernel<5>, grid, block, smem, stream, a);
        case 6:  return frt_launch(frt_router_f32_kernel<6>, grid, block, smem, stream, a);
        case 7:  return frt_launch(frt_router_f32_kernel<7>, grid, block, smem, stream, a);
        default: return frt_launch(frt_router_f32_kernel<8>, grid, block, smem, stream, a);
    }
}
