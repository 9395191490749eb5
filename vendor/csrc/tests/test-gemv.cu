// Unit test of frt_gemv (vendor/csrc/gemv.cu) and frt_gemv_repack against a float64 CPU reference
// that dequantizes random GGUF rows (tests/test-gemv-reference.cuh): the decode shapes of a
// Qwen3.6-35B-A3B step (the packs, the experts by ids, the LM head), odd shapes (rows not a
// multiple of anything, k of 256 to 4096 including 768 and 1280, 1..8 tokens, ids with repeats
// and one out of range) and launches frt_gemv must refuse. Fresh random weights and inputs every
// run; every output is poisoned with NaN first and every element is checked twice: against the
// same sum with x rounded to int8 as the kernel rounds it (bound: float rounding only), and
// against the exact sum (bound: plus d/2 of each 32-block times the |w| it multiplies). The
// padding between output rows must stay NaN. The exact kernel (FRT_GEMV_KERNEL_EXACT) must also
// give, without a norm, the very bits of ggml-cuda's mmvq (gemv_ref::mmvq_row emulates it operation
// by operation; this plain build rounds its divisions correctly, so the host repeats them). With
// a norm, its prologue must give the bits of ggml-cuda's rms_norm, written as a reference kernel.
// Needs a GPU; a run prints its seed, which reruns it:
//   nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/*.cu vendor/csrc/tests/test-gemv.cu -o test-gemv
//   ./test-gemv [seed]

#include "env-switch.cuh"
#include "gemv.cuh"
#include "moe-ffn-tail.cuh"
#include "q8-x.cuh"
#include "tests/test-gemv-reference.cuh"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tests/test-device.cuh"

namespace {

struct seg_case {
    frt_gemv_type type;            // as stored in the GGUF (F32/F16/BF16, Q4_K, Q5_K, Q6_K, Q8_0)
    int           rows;
    bool          repack   = false;  // Q6_K/Q8_0: multiply the repacked copy
    int           n_experts = 0;     // > 0: a stacked expert tensor, matrices chosen by ids
    bool          add      = false;  // FRT_GEMV_ADD
    bool          in_place = false;  // the residual is the output itself
};

struct test_case {
    std::string           name;
    int                   k, tokens;
    std::vector<seg_case> segs;
    bool                  norm        = false;
    int                   n_used      = 0;      // experts a token
    bool                  x_per_slot  = false;  // down projections: one input vector a slot
    bool                  repeat_ids  = false;  // the same expert twice in a token and across tokens
    bool                  bad_id      = false;  // one slot's id out of range: its rows must be NaN
    bool                  keep_normed = false;  // norm: the normed vectors written too (x_normed)
};

struct segment_data {
    std::vector<uint8_t> weights;   // GGUF bytes: n_matrices x rows x row_bytes
    int64_t              row_bytes = 0;
    int                  matrices  = 1;
    void *               device    = nullptr;  // what frt_gemv reads (repacked when asked)
    std::vector<void *>  allocations;
    float *              out      = nullptr;
    float *              residual = nullptr;
    int64_t              out_stride = 0;
    int                  n_out      = 0;  // tokens (dense) or slots (experts)
    std::vector<float>   residual_host;
};

const char * kernel_name(frt_gemv_kernel kernel) {
    return kernel == FRT_GEMV_KERNEL_BULK        ? "bulk"
           : kernel == FRT_GEMV_KERNEL_REGISTERS ? "regs"
           : kernel == FRT_GEMV_KERNEL_EXACT     ? "exact"
           : kernel == FRT_GEMV_KERNEL_HEAD      ? "head"
                                                 : "auto";
}


// The exact launches' chunk counters (frt_gemv_args::chunk_counters), zeroed once: every exact
// launch of the test gets them, so that with GGML_FLASHRT_EXACT_CHUNKS=2 in the environment the
// launches that split their rows into chunks taken from a counter are checked by every case as
// they are without it; run_chunk_counters_case checks that they are all back at zero at the end.
static unsigned * chunk_counters() {
    static unsigned * counters = [] {
        unsigned * c = nullptr;
        CHECK(cudaMalloc(&c, FRT_GEMV_CHUNK_COUNTER_WORDS * sizeof(unsigned)));
        CHECK(cudaMemset(c, 0, FRT_GEMV_CHUNK_COUNTER_WORDS * sizeof(unsigned)));
        return c;
    }();
    return counters;
}
// Runs one case with one kernel; returns true when every output is within its bounds.
bool run_case(const test_case & tc, frt_gemv_kernel kernel, std::mt19937_64 & rng) {
    const int k = tc.k, T = tc.tokens;
    const int n_used = tc.n_used, slots = T * std::max(1, n_used);
    const int x_per_token = tc.x_per_slot ? n_used : 1;
    const int n_vec       = T * x_per_token;
    const int64_t x_stride = k + 4 * (int64_t) (rng() % 3);  // padded inputs too
    bool repack_ok = true;

    // Inputs: N(0, 1), every fifth 32-block ten times larger (scales differ between blocks); the
    // norm weight in [0.5, 1.5].
    std::normal_distribution<float>       normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(0.5f, 1.5f);
    std::vector<float> x(n_vec * x_stride, 0.0f), norm(k);
    for (int v = 0; v < n_vec; ++v) {
        for (int i = 0; i < k; ++i) {
            x[v * x_stride + i] = normal(rng) * (i / 32 % 5 == 0 ? 10.0f : 1.0f);
        }
    }
    for (float & n : norm) {
        n = uniform(rng);
    }
    const float eps = 1e-6f;

    // Expert ids: distinct per token, or with repeats; one out of range when asked.
    std::vector<int32_t> ids;
    const int            ids_stride = n_used + 1;
    int                  n_experts  = 0;
    for (const seg_case & sc : tc.segs) {
        n_experts = std::max(n_experts, sc.n_experts);
    }
    if (n_used > 0) {
        ids.assign(T * ids_stride, -7);
        for (int t = 0; t < T; ++t) {
            for (int j = 0; j < n_used; ++j) {
                int id = (int) (rng() % (uint64_t) n_experts);
                if (tc.repeat_ids && j % 3 == 2) {
                    id = ids[t * ids_stride + j - 1];  // the same matrix twice in a token
                }
                if (tc.repeat_ids && t > 0 && j == 0) {
                    id = ids[0];  // and in another token
                }
                ids[t * ids_stride + j] = id;
            }
        }
        if (tc.bad_id) {
            ids[(T - 1) * ids_stride + n_used / 2] = n_experts + 3;
        }
    }

    frt_gemv_args args{};
    args.chunk_counters = kernel == FRT_GEMV_KERNEL_EXACT ? chunk_counters() : nullptr;
    args.x           = nullptr;
    args.x_stride    = x_stride;
    args.k           = k;
    args.tokens      = T;
    args.x_per_token = x_per_token;
    args.eps         = eps;
    args.n_segments  = (int) tc.segs.size();
    float *   d_x    = upload(x);
    float *   d_norm = upload(norm);
    int32_t * d_ids  = n_used > 0 ? upload(ids) : nullptr;
    args.x           = d_x;
    args.norm        = tc.norm ? d_norm : nullptr;
    // The normed vectors, at a stride past k whose padding must stay poisoned.
    const int64_t normed_stride = k + 12;
    float *       d_normed      = nullptr;
    if (tc.keep_normed) {
        d_normed = upload_poisoned((size_t) n_vec * normed_stride);
        args.x_normed        = d_normed;
        args.x_normed_stride = normed_stride;
    }

    std::vector<segment_data> data(tc.segs.size());
    for (size_t si = 0; si < tc.segs.size(); ++si) {
        const seg_case & sc = tc.segs[si];
        segment_data &   sd = data[si];
        sd.row_bytes        = gemv_ref::gguf_row_bytes(sc.type, k);
        sd.matrices         = sc.n_experts > 0 ? sc.n_experts : 1;
        sd.weights.resize((size_t) sd.matrices * sc.rows * sd.row_bytes);
        for (int64_t r = 0; r < (int64_t) sd.matrices * sc.rows; ++r) {
            gemv_ref::random_row(sc.type, k, sd.weights.data() + r * sd.row_bytes, rng);
        }
        uint8_t * d_w = upload(sd.weights);
        sd.allocations.push_back(d_w);
        frt_gemv_segment & s = args.seg[si];
        s.type               = sc.type;
        s.w                  = d_w;
        s.rows               = sc.rows;
        s.row_stride         = sd.row_bytes;
        if (sc.repack) {
            const frt_gemv_type rt        = frt_gemv_repacked_type(sc.type);
            const int64_t       rrow      = frt_gemv_row_bytes(rt, k);
            const int64_t       all_rows  = (int64_t) sd.matrices * sc.rows;
            uint8_t *           d_r       = nullptr;
            CHECK(cudaMalloc(&d_r, all_rows * rrow));
            CHECK(cudaMemset(d_r, 0xa5, all_rows * rrow));  // padding must be rewritten too
            CHECK(frt_gemv_repack(sc.type, d_w, sd.row_bytes, (int) all_rows, k, d_r, 0));
            CHECK(cudaDeviceSynchronize());
            const std::vector<uint8_t> got = download(d_r, (size_t) (all_rows * rrow));
            for (int64_t r = 0; r < all_rows && repack_ok; ++r) {
                const std::vector<uint8_t> want = gemv_ref::repack_row(sc.type, k, sd.weights.data() + r * sd.row_bytes);
                if (std::memcmp(want.data(), got.data() + r * rrow, (size_t) rrow) != 0) {
                    std::printf("     repacked row %" PRId64 " of segment %zu differs from the documented layout\n", r,
                                si);
                    repack_ok = false;
                }
            }
            sd.allocations.push_back(d_r);
            s.type       = rt;
            s.w          = d_r;
            s.row_stride = rrow;
        }
        sd.n_out      = sc.n_experts > 0 ? slots : T;
        sd.out_stride = sc.rows + 3;  // the padding must stay NaN
        std::vector<uint32_t> poison((size_t) sd.n_out * sd.out_stride, kPoison);
        sd.out = (float *) upload(poison);
        s.out        = sd.out;
        s.out_stride = sd.out_stride;
        if (sc.add) {
            sd.residual_host.resize((size_t) sd.n_out * sd.out_stride);
            for (float & v : sd.residual_host) {
                v = normal(rng);
            }
            if (sc.in_place) {
                CHECK(cudaMemcpy(sd.out, sd.residual_host.data(), sd.residual_host.size() * sizeof(float),
                                 cudaMemcpyHostToDevice));
                sd.residual = sd.out;
            } else {
                sd.residual = upload(sd.residual_host);
            }
            s.epilogue        = FRT_GEMV_ADD;
            s.residual        = sd.residual;
            s.residual_stride = sd.out_stride;
        }
        if (sc.n_experts > 0) {
            s.ids           = d_ids;
            s.ids_stride    = ids_stride;
            s.n_used        = n_used;
            s.n_experts     = sc.n_experts;
            s.expert_stride = (int64_t) sc.rows * s.row_stride;
        }
    }

    if (const char * why = frt_gemv_unsupported(args, kernel)) {
        std::printf("FAIL %-34s %s refused: %s\n", tc.name.c_str(), kernel_name(kernel), why);
        return false;
    }
    CHECK(frt_gemv(args, 0, kernel));
    CHECK(cudaDeviceSynchronize());

    // Reference, per input vector: float64 x (normed) and the kernel's int8 rounding of it.
    const double                   delta = tc.norm ? gemv_ref::norm_error(k) : 0.0;
    std::vector<std::vector<double>> xs(n_vec);
    std::vector<gemv_ref::rounded>   rs;
    for (int v = 0; v < n_vec; ++v) {
        const float * xv = x.data() + v * x_stride;
        if (tc.norm) {
            xs[v] = gemv_ref::rms_normed(xv, norm.data(), k, eps);
            rs.push_back(gemv_ref::round_like_kernel(xs[v], k, delta));
        } else {
            xs[v].assign(xv, xv + k);
            rs.push_back(gemv_ref::round_like_kernel(xv, k));
        }
    }

    double worst_sharp = 0.0, worst_exact = 0.0;
    int64_t bad = 0, checked = 0;
    if (tc.keep_normed) {
        // Each normed value within the prologue's bound (norm_error: relative), the padding untouched.
        const std::vector<uint32_t> got = download((const uint32_t *) d_normed, (size_t) n_vec * normed_stride);
        for (int v = 0; v < n_vec; ++v) {
            for (int64_t i = 0; i < normed_stride; ++i) {
                const uint32_t bits = got[(size_t) v * normed_stride + i];
                float          y;
                std::memcpy(&y, &bits, 4);
                const bool ok = i < k ? std::fabs(y - xs[v][i]) <= delta * std::fabs(xs[v][i]) + 1e-30
                                      : bits == kPoison;
                ++checked;
                if (!ok && bad++ < 5) {
                    std::printf("     %s normed vector %d element %" PRId64 ": %.9g, want %.9g\n", tc.name.c_str(), v, i, y,
                                i < k ? xs[v][i] : 0.0);
                }
            }
        }
        CHECK(cudaFree(d_normed));
    }
    std::vector<double> w(k), a(k);
    for (size_t si = 0; si < tc.segs.size(); ++si) {
        const seg_case &     sc = tc.segs[si];
        const segment_data & sd = data[si];
        const std::vector<uint32_t> got = download((const uint32_t *) sd.out, (size_t) sd.n_out * sd.out_stride);
        // For each output column (token or slot): which matrix, which input vector.
        for (int o = 0; o < sd.n_out; ++o) {
            int matrix = 0, vec = o;
            bool nan_rows = false;
            if (sc.n_experts > 0) {
                const int t = o / n_used, j = o % n_used;
                matrix      = ids[t * ids_stride + j];
                vec         = t * x_per_token + (x_per_token == 1 ? 0 : j);
                nan_rows    = matrix < 0 || matrix >= sc.n_experts;
            }
            for (int r = 0; r < sc.rows; ++r) {
                float y;
                std::memcpy(&y, &got[(size_t) o * sd.out_stride + r], 4);
                ++checked;
                if (nan_rows) {
                    if (!std::isnan(y)) {
                        if (bad++ < 5) {
                            std::printf("     %s seg %zu slot %d row %d: %g, expected NaN (expert id out of range)\n",
                                        tc.name.c_str(), si, o, r, y);
                        }
                    }
                    continue;
                }
                gemv_ref::dequantize_row(sc.type, k,
                                         sd.weights.data() + ((int64_t) matrix * sc.rows + r) * sd.row_bytes, w.data(),
                                         a.data());
                gemv_ref::output ref = gemv_ref::reference(sc.type, k, w.data(), a.data(), xs[vec],
                                                            gemv_ref::quantized(sc.type) ? &rs[vec] : nullptr, delta);
                if (sc.add) {
                    const double res = sd.residual_host[(size_t) o * sd.out_stride + r];
                    const double add = 2.0 * gemv_ref::kUnit * (std::fabs(ref.sharp) + std::fabs(res));
                    ref.sharp += res;
                    ref.exact += res;
                    ref.tol_sharp += add;
                    ref.tol_exact += add;
                }
                const double e_sharp = std::fabs(y - ref.sharp) / ref.tol_sharp;
                const double e_exact = std::fabs(y - ref.exact) / ref.tol_exact;
                const bool   ok      = std::isfinite(y) && e_sharp <= 1.0 && e_exact <= 1.0;
                worst_sharp          = std::isfinite(y) ? std::max(worst_sharp, e_sharp) : INFINITY;
                worst_exact          = std::isfinite(y) ? std::max(worst_exact, e_exact) : INFINITY;
                if (!ok && bad++ < 5) {
                    std::printf("     %s seg %zu (%s) out %d row %d: %.9g, want %.9g (+- %.3g), exact %.9g (+- %.3g)\n",
                                tc.name.c_str(), si, gemv_ref::type_name(sc.type), o, r, y, ref.sharp, ref.tol_sharp,
                                ref.exact, ref.tol_exact);
                }
            }
            // The padding after the rows: untouched (NaN, or the residual when in place).
            for (int r = sc.rows; r < sd.out_stride; ++r) {
                const uint32_t want_bits = sc.in_place ? [&] {
                    uint32_t b;
                    std::memcpy(&b, &sd.residual_host[(size_t) o * sd.out_stride + r], 4);
                    return b;
                }()
                                                        : kPoison;
                if (got[(size_t) o * sd.out_stride + r] != want_bits && bad++ < 5) {
                    std::printf("     %s seg %zu out %d: padding element %d was written\n", tc.name.c_str(), si, o, r);
                }
            }
        }
    }
    // The exact kernel, without a norm (rsqrtf has no host twin): every output bit for bit
    // ggml-cuda's mmvq, emulated operation by operation (gemv_ref::mmvq_row).
    int64_t not_identical = 0;
    if (kernel == FRT_GEMV_KERNEL_EXACT && !tc.norm) {
        std::vector<gemv_ref::stock_x> sx;
        for (int v = 0; v < n_vec; ++v) {
            sx.push_back(gemv_ref::stock_quantize(x.data() + v * x_stride, k));
        }
        for (size_t si = 0; si < tc.segs.size(); ++si) {
            const seg_case &            sc  = tc.segs[si];
            const segment_data &        sd  = data[si];
            const std::vector<uint32_t> got = download((const uint32_t *) sd.out, (size_t) sd.n_out * sd.out_stride);
            for (int o = 0; o < sd.n_out; ++o) {
                int matrix = 0, vec = o;
                if (sc.n_experts > 0) {
                    matrix = ids[o];  // 1 token: slot o is ids[o]
                    vec    = x_per_token == 1 ? 0 : o;
                    if (matrix < 0 || matrix >= sc.n_experts) {
                        continue;  // NaN rows, checked above
                    }
                }
                for (int r = 0; r < sc.rows; ++r) {
                    const uint8_t * row = sd.weights.data() + ((int64_t) matrix * sc.rows + r) * sd.row_bytes;
                    float           want =
                        sc.type == FRT_GEMV_F32
                            ? gemv_ref::mmvf_row(k, (const float *) row, x.data() + (int64_t) vec * x_stride)
                            : gemv_ref::mmvq_row(sc.type, k, row, sx[vec]);
                    if (sc.add) {
                        want += sd.residual_host[(size_t) o * sd.out_stride + r];
                    }
                    uint32_t want_bits;
                    std::memcpy(&want_bits, &want, 4);
                    const uint32_t got_bits = got[(size_t) o * sd.out_stride + r];
                    if (got_bits != want_bits && not_identical++ < 5) {
                        float y;
                        std::memcpy(&y, &got_bits, 4);
                        std::printf("     %s seg %zu out %d row %d: %.9g, mmvq's sum %.9g (not bit-identical)\n",
                                    tc.name.c_str(), si, o, r, y, want);
                    }
                }
            }
        }
    }
    const bool ok = bad == 0 && repack_ok && not_identical == 0;
    std::printf("%-4s %-34s %s k=%5d tokens=%d outputs=%9" PRId64 "  err/bound: int8-rounded %.3f, exact %.3f%s\n",
                ok ? "ok" : "FAIL", tc.name.c_str(), kernel_name(kernel), k, T, checked, worst_sharp, worst_exact,
                kernel == FRT_GEMV_KERNEL_EXACT && !tc.norm ? ", bits as mmvq's" : "");

    for (segment_data & sd : data) {
        for (void * p : sd.allocations) {
            CHECK(cudaFree(p));
        }
        CHECK(cudaFree(sd.out));
        if (sd.residual && sd.residual != sd.out) {
            CHECK(cudaFree(sd.residual));
        }
    }
    CHECK(cudaFree(d_x));
    CHECK(cudaFree(d_norm));
    if (d_ids) {
        CHECK(cudaFree(d_ids));
    }
    return ok;
}

// The exact kernel's RMS norm prologue against ggml-cuda's rms_norm_f32 with its multiply (one
// row, a block of 1024 threads, 256 below 1024 columns), written here with the same expressions
// and compiled with the same flags as the kernel under test.
__global__ void rms_norm_reference(const float * x, const float * w, float * dst, int ncols, float eps) {
    const int tid = threadIdx.x, lane = tid % 32, block_size = blockDim.x;
    float     tmp = 0.0f;
    for (int col = tid; col < ncols; col += block_size) {
        const float xi = x[col];
        tmp += xi * xi;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        tmp += __shfl_xor_sync(0xffffffffu, tmp, offset);
    }
    __shared__ float s_sum[32];
    if (lane == 0) {
        s_sum[tid / 32] = tmp;
    }
    __syncthreads();
    tmp = lane < block_size / 32 ? s_sum[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) {
        tmp += __shfl_xor_sync(0xffffffffu, tmp, offset);
    }
    const float mean  = tmp / ncols;
    const float scale = rsqrtf(mean + eps);
    for (int col = tid; col < ncols; col += block_size) {
        dst[col] = scale * x[col] * w[col];
    }
}

// The norm in the exact kernel's prologue must give stock's bits: a launch with the norm (and
// the normed vector written, x_normed) against rms_norm_reference followed by the same launch
// without it. Both prologues: in registers (k a multiple of 512 from 1024 to 4096) and the
// general one (other k).
struct norm_case {
    std::string   name;
    frt_gemv_type type;
    int           k, rows;
};

bool run_norm_case(const norm_case & nc, std::mt19937_64 & rng) {
    const int                       k = nc.k;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float>              x(k), norm(k);
    for (float & v : x) {
        v = 3.0f * normal(rng);
    }
    for (float & v : norm) {
        v = 0.5f + (float) (rng() % 1000) / 1000.0f;
    }
    const int64_t        row_bytes = gemv_ref::gguf_row_bytes(nc.type, k);
    std::vector<uint8_t> w((size_t) nc.rows * row_bytes);
    for (int r = 0; r < nc.rows; ++r) {
        gemv_ref::random_row(nc.type, k, w.data() + r * row_bytes, rng);
    }
    float *   d_x       = upload(x);
    float *   d_norm    = upload(norm);
    uint8_t * d_w       = upload(w);
    float *   d_normed  = upload(std::vector<float>(k, 0.0f));  // the reference's normed x
    float *   d_kept    = upload_poisoned(k);  // the launch's x_normed
    float *   d_out[2]  = { upload_poisoned(nc.rows), upload_poisoned(nc.rows) };
    rms_norm_reference<<<1, k < 1024 ? 256 : 1024>>>(d_x, d_norm, d_normed, k, 1e-6f);
    CHECK(cudaGetLastError());
    bool ok = true;
    for (int fused = 0; fused < 2; ++fused) {
        frt_gemv_args a{};
        a.x           = fused ? d_x : d_normed;
        a.x_stride    = k;
        a.k           = k;
        a.tokens      = 1;
        a.x_per_token = 1;
        a.eps         = 1e-6f;
        if (fused) {
            a.norm            = d_norm;
            a.x_normed        = d_kept;
            a.x_normed_stride = k;
        }
        a.n_segments        = 1;
        a.seg[0].type       = nc.type;
        a.seg[0].w          = d_w;
        a.seg[0].rows       = nc.rows;
        a.seg[0].row_stride = row_bytes;
        a.seg[0].out        = d_out[fused];
        if (const char * why = frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT)) {
            std::printf("     %s: refused: %s\n", nc.name.c_str(), why);
            ok = false;
            continue;
        }
        CHECK(frt_gemv(a, 0, FRT_GEMV_KERNEL_EXACT));
    }
    CHECK(cudaDeviceSynchronize());
    const std::vector<uint32_t> want_x = download((const uint32_t *) d_normed, k);
    const std::vector<uint32_t> got_x  = download((const uint32_t *) d_kept, k);
    const std::vector<uint32_t> want   = download((const uint32_t *) d_out[0], nc.rows);
    const std::vector<uint32_t> got    = download((const uint32_t *) d_out[1], nc.rows);
    int64_t                     bad    = 0;
    for (int c = 0; c < k; ++c) {
        if (got_x[c] != want_x[c] && bad++ < 5) {
            std::printf("     %s: x_normed[%d] is 0x%08x, rms_norm's 0x%08x\n", nc.name.c_str(), c, got_x[c], want_x[c]);
        }
    }
    for (int r = 0; r < nc.rows; ++r) {
        if ((got[r] != want[r] || got[r] == kPoison) && bad++ < 10) {
            std::printf("     %s: row %d is 0x%08x, after rms_norm 0x%08x\n", nc.name.c_str(), r, got[r], want[r]);
        }
    }
    for (void * m : { (void *) d_x, (void *) d_norm, (void *) d_w, (void *) d_normed, (void *) d_kept, (void *) d_out[0],
                      (void *) d_out[1] }) {
        CHECK(cudaFree(m));
    }
    ok = ok && bad == 0;
    std::printf("%-4s %-34s exact k=%5d outputs=%9d  norm bit for bit rms_norm's, then the matvec's\n",
                ok ? "ok" : "FAIL", nc.name.c_str(), k, k + nc.rows);
    return ok;
}

// Launches frt_gemv must refuse (and then not touch the output).
// The SWIGLU epilogue's reference: ggml-cuda's fused GLU, up * silu(gate), on the values the plain
// launches store (the same expression as the kernel's epilogue, compiled the same way).
__global__ void glu_reference(const float * up, const float * gate, float * out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = up[i];
        const float g = gate[i];
        v *= g / (1.0f + expf(-g));
        out[i] = v;
    }
}

// The routing's reference (frt_gemv_args::route_logits), one thread playing ggml-cuda's fused
// top-k warp lane by lane: each lane's partial sums in order and the butterflies spelled out
// (lane l adds lane l ^ offset's value, offsets 16 ... 1), the argmax rounds as the highest
// probability not yet chosen, ties to the lower expert (what the warp's butterfly finds). Writes
// the ids and the weights (normalised by max(sum, clamp), times scale).
__global__ void route_reference(const float * logits, int n_experts, int n_used, float clamp, float scale,
                                int32_t * ids, float * weights) {
    const auto butterfly_sum = [](float * v) {
        for (int offset = 16; offset > 0; offset >>= 1) {
            float next[32];
            for (int l = 0; l < 32; ++l) {
                next[l] = v[l] + v[l ^ offset];
            }
            for (int l = 0; l < 32; ++l) {
                v[l] = next[l];
            }
        }
        return v[0];
    };
    float prob[512];
    float max_val = -INFINITY;
    for (int e = 0; e < n_experts; ++e) {
        max_val = fmaxf(max_val, logits[e]);
    }
    float lane_sum[32] = {};
    for (int i = 0; i < n_experts / 32; ++i) {  // lane l adds its experts l, l + 32, ... in order
        for (int l = 0; l < 32; ++l) {
            prob[i * 32 + l] = expf(logits[i * 32 + l] - max_val);
            lane_sum[l] += prob[i * 32 + l];
        }
    }
    const float inv_sum = 1.0f / butterfly_sum(lane_sum);
    for (int e = 0; e < n_experts; ++e) {
        prob[e] *= inv_sum;
    }
    float chosen_sum[32] = {};
    float chosen[32];
    for (int k = 0; k < n_used; ++k) {
        int best = -1;
        for (int e = 0; e < n_experts; ++e) {
            if (prob[e] != -INFINITY && (best < 0 || prob[e] > prob[best])) {
                best = e;
            }
        }
        ids[k]    = best;
        chosen[k] = prob[best];
        chosen_sum[best % 32] += prob[best];
        prob[best] = -INFINITY;
    }
    const float inv = 1.0f / fmaxf(butterfly_sum(chosen_sum), clamp);
    for (int k = 0; k < n_used; ++k) {
        weights[k] = chosen[k] * inv * scale;
    }
}

// A gate/up pair with the FRT_GEMV_SWIGLU epilogue (exact kernel): every output bit for bit the
// plain launches' up and gate sums (themselves checked against mmvq's order by run_case) put
// through glu_reference; NaN rows for an expert id out of range; the padding untouched. Routed:
// the launch selects 8 of n_experts from logits (distinct values 0.05 apart, shuffled, so the
// selection cannot depend on rounding; or, tied, five values, so that every chosen expert ties with
// others and the lower expert must win), and the plain launches read route_reference's ids; the
// launch's ids and weights must equal route_reference's bit for bit, the ids the 8 largest logits
// in order, and the weights the float64 softmax's within 1e-5.
struct glu_case {
    std::string   name;
    frt_gemv_type type;
    int           k, rows, n_experts;  // n_experts 0: dense
    bool          with_dense;          // a dense pair in the same launch (the shared expert's)
    bool          norm;
    bool          routed      = false;
    bool          dense_first = false;  // the dense pair's segment first (block 0 is a dense block)
    bool          tied        = false;  // routed: logits of 5 values, so the 8 chosen tie (lower expert first)
};

bool run_glu_case(const glu_case & gc, std::mt19937_64 & rng) {
    const int k = gc.k, n_used = gc.n_experts > 0 ? 8 : 0;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float>              x(k), norm(k);
    for (float & v : x) {
        v = normal(rng);
    }
    for (float & v : norm) {
        v = 0.5f + (float) (rng() % 1000) / 1000.0f;
    }
    std::vector<int32_t> ids(n_used);
    for (int j = 0; j < n_used; ++j) {
        ids[j] = (int) (rng() % (uint64_t) gc.n_experts);
    }
    if (n_used > 0 && !gc.routed) {
        ids[n_used / 2] = gc.n_experts + 1;  // out of range: NaN rows
    }
    std::vector<float> logits(gc.routed ? gc.n_experts : 0);
    for (size_t e = 0; e < logits.size(); ++e) {
        logits[e] = gc.tied ? 0.05f * (float) (e % 5) : 0.05f * ((float) e - (float) logits.size() / 2);
    }
    std::shuffle(logits.begin(), logits.end(), rng);
    const float kClamp = 6.103515625e-5f, kScale = 1.0f;  // llama.cpp's clamp of the weights' sum
    float *   d_logits        = gc.routed ? upload(logits) : nullptr;
    int32_t * d_route_ids     = gc.routed ? upload(std::vector<int32_t>(n_used, -7)) : nullptr;
    float *   d_route_weights = gc.routed ? upload_poisoned(n_used) : nullptr;
    float *   d_ref_weights   = gc.routed ? upload_poisoned(n_used) : nullptr;
    float *   d_x    = upload(x);
    float *   d_norm = upload(norm);
    int32_t * d_ids  = n_used > 0 ? upload(ids) : nullptr;
    if (gc.routed) {
        route_reference<<<1, 1>>>(d_logits, gc.n_experts, n_used, kClamp, kScale, d_ids, d_ref_weights);
        CHECK(cudaDeviceSynchronize());
        ids = download(d_ids, n_used);
    }
    struct pair {
        int       rows, slots, matrices;
        bool      experts;
        uint8_t * up, *gate;
        float *   out[3];  // GLU launch, plain up, plain gate
    };
    std::vector<pair> pairs;
    const int64_t     row_bytes = gemv_ref::gguf_row_bytes(gc.type, k);
    const auto        add_pair  = [&](int rows, bool experts) {
        pair p{ rows, experts ? n_used : 1, experts ? gc.n_experts : 1, experts, nullptr, nullptr, {} };
        std::vector<uint8_t> w((size_t) p.matrices * rows * row_bytes);
        for (uint8_t ** dst : { &p.up, &p.gate }) {
            for (int64_t r = 0; r < (int64_t) p.matrices * rows; ++r) {
                gemv_ref::random_row(gc.type, k, w.data() + r * row_bytes, rng);
            }
            *dst = upload(w);
        }
        for (float *& o : p.out) {
            o = upload_poisoned((size_t) p.slots * (rows + 3));
        }
        pairs.push_back(p);
    };
    if (gc.n_experts > 0 && !gc.dense_first) {
        add_pair(gc.rows, true);
    }
    if (gc.with_dense || gc.n_experts == 0) {
        add_pair(gc.rows / 2 + 1, false);
    }
    if (gc.n_experts > 0 && gc.dense_first) {
        add_pair(gc.rows, true);
    }
    // which: 0 the GLU launch, 1 up alone, 2 gate alone.
    const auto launch = [&](int which) {
        frt_gemv_args a{};
        a.chunk_counters = chunk_counters();
        a.x           = d_x;
        a.x_stride    = k;
        a.k           = k;
        a.tokens      = 1;
        a.x_per_token = 1;
        a.norm        = gc.norm ? d_norm : nullptr;
        a.eps         = 1e-6f;
        a.n_segments  = (int) pairs.size();
        for (size_t i = 0; i < pairs.size(); ++i) {
            const pair &       p = pairs[i];
            frt_gemv_segment & s = a.seg[i];
            s.type               = gc.type;
            s.w                  = which == 2 ? p.gate : p.up;
            s.rows               = p.rows;
            s.row_stride         = row_bytes;
            s.out                = p.out[which];
            s.out_stride         = p.rows + 3;
            if (which == 0) {
                s.epilogue = FRT_GEMV_SWIGLU;
                s.w_gate   = p.gate;
            }
            if (p.experts) {
                s.ids           = which == 0 && gc.routed ? d_route_ids : d_ids;
                s.ids_stride    = n_used;
                s.n_used        = n_used;
                s.n_experts     = gc.n_experts;
                s.expert_stride = (int64_t) p.rows * row_bytes;
            }
        }
        if (which == 0 && gc.routed) {
            a.route_logits    = d_logits;
            a.route_n_experts = gc.n_experts;
            a.route_norm      = true;
            a.route_clamp     = kClamp;
            a.route_scale     = kScale;
            a.route_ids       = d_route_ids;
            a.route_weights   = d_route_weights;
            // The selected experts' gate matrices prefetched as another launch's would be (an L2
            // hint: the sums must not move).
            for (const pair & p : pairs) {
                const int64_t stride = (int64_t) p.rows * row_bytes;
                if (p.experts && stride % 16 == 0) {
                    a.prefetch.experts       = p.gate;
                    a.prefetch.expert_stride = stride;
                    a.prefetch.expert_bytes  = stride;
                }
            }
        }
        if (const char * why = frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT)) {
            std::printf("     %s: refused: %s\n", gc.name.c_str(), why);
            return false;
        }
        CHECK(frt_gemv(a, 0, FRT_GEMV_KERNEL_EXACT));
        return true;
    };
    bool ok = launch(0) && launch(1) && launch(2);
    int64_t checked = 0, bad = 0;
    if (gc.routed) {
        CHECK(cudaDeviceSynchronize());
        const std::vector<int32_t>  got_ids = download(d_route_ids, n_used);
        const std::vector<uint32_t> got_w   = download((const uint32_t *) d_route_weights, n_used);
        const std::vector<uint32_t> want_w  = download((const uint32_t *) d_ref_weights, n_used);
        // The float64 view: the n_used largest logits in order, their softmax normalised.
        std::vector<int> order(gc.n_experts);
        for (int e = 0; e < gc.n_experts; ++e) {
            order[e] = e;
        }
        // Equal logits in expert order: ggml-cuda's top-k takes the lower expert first.
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
        double chosen_sum = 0.0;
        for (int j = 0; j < n_used; ++j) {
            chosen_sum += std::exp((double) logits[order[j]]);
        }
        for (int j = 0; j < n_used; ++j) {
            float w;
            std::memcpy(&w, &got_w[j], 4);
            const double want64 = std::exp((double) logits[order[j]]) / chosen_sum;
            const bool   good   = got_ids[j] == ids[j] && got_ids[j] == order[j] && got_w[j] == want_w[j] &&
                              std::fabs(w - want64) <= 1e-5 * want64;
            ++checked;
            if (!good && bad++ < 5) {
                std::printf("     %s routed slot %d: expert %d weight %.9g, want expert %d (largest: %d) weight %.9g\n",
                            gc.name.c_str(), j, got_ids[j], w, ids[j], order[j], want64);
            }
        }
    }
    for (const pair & p : pairs) {
        const size_t n = (size_t) p.slots * (p.rows + 3);
        float *      d_want = nullptr;
        CHECK(cudaMalloc(&d_want, n * sizeof(float)));
        glu_reference<<<(unsigned) ((n + 255) / 256), 256>>>(p.out[1], p.out[2], d_want, (int) n);
        CHECK(cudaDeviceSynchronize());
        const std::vector<uint32_t> got  = download((const uint32_t *) p.out[0], n);
        const std::vector<uint32_t> want = download((const uint32_t *) d_want, n);
        for (int o = 0; o < p.slots; ++o) {
            const bool nan_rows = p.experts && (ids[o] < 0 || ids[o] >= gc.n_experts);
            for (int r = 0; r < p.rows + 3; ++r) {
                const size_t at = (size_t) o * (p.rows + 3) + r;
                float        y;
                std::memcpy(&y, &got[at], 4);
                const bool good = r >= p.rows ? got[at] == kPoison : nan_rows ? std::isnan(y) : got[at] == want[at];
                ++checked;
                if (!good && bad++ < 5) {
                    float w;
                    std::memcpy(&w, &want[at], 4);
                    std::printf("     %s %s slot %d row %d: %.9g, want %.9g\n", gc.name.c_str(),
                                p.experts ? "experts" : "dense", o, r, y, w);
                }
            }
        }
        CHECK(cudaFree(d_want));
        for (void * m : { (void *) p.up, (void *) p.gate, (void *) p.out[0], (void *) p.out[1], (void *) p.out[2] }) {
            CHECK(cudaFree(m));
        }
    }
    CHECK(cudaFree(d_x));
    CHECK(cudaFree(d_norm));
    for (void * m : { (void *) d_ids, (void *) d_logits, (void *) d_route_ids, (void *) d_route_weights,
                      (void *) d_ref_weights }) {
        if (m != nullptr) {
            CHECK(cudaFree(m));
        }
    }
    ok = ok && bad == 0;
    std::printf("%-4s %-34s exact k=%5d outputs=%9" PRId64 "  SWIGLU bit for bit the plain sums' up * silu(gate)\n",
                ok ? "ok" : "FAIL", gc.name.c_str(), k, checked);
    return ok;
}

// A dense segment with its own input (frt_gemv_segment::x) beside the routed experts' down
// projection, one input a slot (exact kernel), as the shared expert's down joins the experts':
// every output bit for bit what the two give launched apart (each checked against mmvq's order by
// run_case), the padding untouched. qwen36's shape, less a few dense rows: on a GPU of 132 SMs the
// launch together is over one wave at 64 rows a block (8 x 32 + 32 blocks, a wave 264) and takes
// 72 (8 x 29 + 29), while each launched apart stays at 64.
bool run_own_input_case(std::mt19937_64 & rng) {
    const int k = 512, rows = 2048, dense_rows = 2043, n_experts = 16, n_used = 8;
    const int64_t                   row_bytes = gemv_ref::gguf_row_bytes(FRT_GEMV_Q6_K, k);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float>              xe((size_t) n_used * k), xd(k);
    for (float & v : xe) {
        v = normal(rng);
    }
    for (float & v : xd) {
        v = normal(rng);
    }
    std::vector<int32_t> ids(n_used);
    for (int32_t & id : ids) {
        id = (int32_t) (rng() % n_experts);
    }
    std::vector<uint8_t> we((size_t) n_experts * rows * row_bytes), wd((size_t) dense_rows * row_bytes);
    for (int64_t r = 0; r < (int64_t) n_experts * rows; ++r) {
        gemv_ref::random_row(FRT_GEMV_Q6_K, k, we.data() + r * row_bytes, rng);
    }
    for (int64_t r = 0; r < dense_rows; ++r) {
        gemv_ref::random_row(FRT_GEMV_Q6_K, k, wd.data() + r * row_bytes, rng);
    }
    float *   d_xe = upload(xe);
    float *   d_xd = upload(xd);
    int32_t * d_ids = upload(ids);
    uint8_t * d_we = upload(we);
    uint8_t * d_wd = upload(wd);
    const size_t n_e = (size_t) n_used * (rows + 3), n_d = (size_t) dense_rows + 3;
    float * together[2] = { upload_poisoned(n_e), upload_poisoned(n_d) };
    float * apart[2]    = { upload_poisoned(n_e), upload_poisoned(n_d) };
    const auto experts = [&](frt_gemv_segment & s, float * out) {
        s.type          = FRT_GEMV_Q6_K;
        s.w             = d_we;
        s.rows          = rows;
        s.row_stride    = row_bytes;
        s.out           = out;
        s.out_stride    = rows + 3;
        s.ids           = d_ids;
        s.ids_stride    = n_used;
        s.n_used        = n_used;
        s.n_experts     = n_experts;
        s.expert_stride = (int64_t) rows * row_bytes;
    };
    const auto dense = [&](frt_gemv_segment & s, float * out) {
        s.type       = FRT_GEMV_Q6_K;
        s.w          = d_wd;
        s.rows       = dense_rows;
        s.row_stride = row_bytes;
        s.out        = out;
        s.out_stride = dense_rows + 3;
    };
    const auto launch = [&](const frt_gemv_args & a) {
        if (const char * why = frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT)) {
            std::printf("     own input: refused: %s\n", why);
            return false;
        }
        CHECK(frt_gemv(a, 0, FRT_GEMV_KERNEL_EXACT));
        return true;
    };
    frt_gemv_args a{};
    a.x = d_xe, a.x_stride = k, a.k = k, a.tokens = 1, a.x_per_token = n_used, a.n_segments = 2;
    experts(a.seg[0], together[0]);
    dense(a.seg[1], together[1]);
    a.seg[1].x = d_xd;
    bool ok = launch(a);
    a.n_segments = 1;
    experts(a.seg[0], apart[0]);
    ok = ok && launch(a);
    a = frt_gemv_args{};
    a.x = d_xd, a.x_stride = k, a.k = k, a.tokens = 1, a.x_per_token = 1, a.n_segments = 1;
    dense(a.seg[0], apart[1]);
    ok = ok && launch(a);
    CHECK(cudaDeviceSynchronize());
    int64_t checked = 0, bad = 0;
    for (int part = 0; part < 2; ++part) {
        const size_t                n    = part == 0 ? n_e : n_d;
        const int                   pad  = part == 0 ? rows : dense_rows;
        const std::vector<uint32_t> got  = download((const uint32_t *) together[part], n);
        const std::vector<uint32_t> want = download((const uint32_t *) apart[part], n);
        for (size_t at = 0; at < n; ++at) {
            const bool padding = (int) (at % (pad + 3)) >= pad;
            const bool good    = padding ? got[at] == kPoison : got[at] == want[at] && got[at] != kPoison;
            ++checked;
            if (!good && bad++ < 5) {
                std::printf("     own input %s element %zu: %08x, apart %08x\n", part == 0 ? "experts" : "dense", at,
                            got[at], want[at]);
            }
        }
    }
    for (void * m : { (void *) d_xe, (void *) d_xd, (void *) d_ids, (void *) d_we, (void *) d_wd, (void *) together[0],
                      (void *) together[1], (void *) apart[0], (void *) apart[1] }) {
        CHECK(cudaFree(m));
    }
    ok = ok && bad == 0;
    std::printf("%-4s %-34s exact k=%5d outputs=%9" PRId64 "  bit for bit the two launched apart\n", ok ? "ok" : "FAIL",
                "experts' down + dense, own input", k, checked);
    return ok;
}

// A launch that guesses its experts (frt_gemv_args::guess_logits) before its wait: the routed
// experts' down projection with the shared expert's beside it, as MATVEC launches it. Logits of
// distinct values 0.05 apart (shuffled): once with the ids their top-k selects (the guess holds),
// once with ids drawn at random (most slots guessed wrong: the rows are copied again after the
// wait). Every output bit for bit the same launch without the guess, the padding untouched.
bool run_guess_case(std::mt19937_64 & rng) {
    const int     k = 512, rows = 2048, dense_rows = 2043, n_experts = 64, n_used = 8;
    const int64_t row_bytes = gemv_ref::gguf_row_bytes(FRT_GEMV_Q6_K, k);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float>              xe((size_t) n_used * k), xd(k), logits(n_experts);
    for (float & v : xe) {
        v = normal(rng);
    }
    for (float & v : xd) {
        v = normal(rng);
    }
    for (int e = 0; e < n_experts; ++e) {
        logits[e] = 0.05f * ((float) e - n_experts / 2);
    }
    std::shuffle(logits.begin(), logits.end(), rng);
    std::vector<int32_t> order(n_experts);
    for (int e = 0; e < n_experts; ++e) {
        order[e] = e;
    }
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    std::vector<uint8_t> we((size_t) n_experts * rows * row_bytes), wd((size_t) dense_rows * row_bytes);
    for (int64_t r = 0; r < (int64_t) n_experts * rows; ++r) {
        gemv_ref::random_row(FRT_GEMV_Q6_K, k, we.data() + r * row_bytes, rng);
    }
    for (int64_t r = 0; r < dense_rows; ++r) {
        gemv_ref::random_row(FRT_GEMV_Q6_K, k, wd.data() + r * row_bytes, rng);
    }
    float *      d_xe     = upload(xe);
    float *      d_xd     = upload(xd);
    float *      d_logits = upload(logits);
    uint8_t *    d_we     = upload(we);
    uint8_t *    d_wd     = upload(wd);
    const size_t n_e = (size_t) n_used * (rows + 3), n_d = (size_t) dense_rows + 3;
    bool         ok  = true;
    int64_t      checked = 0, bad = 0;
    for (int wrong = 0; wrong < 2; ++wrong) {
        std::vector<int32_t> ids(order.begin(), order.begin() + n_used);
        if (wrong) {
            for (int32_t & id : ids) {
                id = (int32_t) (rng() % n_experts);
            }
        }
        int32_t * d_ids      = upload(ids);
        float *   guessed[2] = { upload_poisoned(n_e), upload_poisoned(n_d) };
        float *   plain[2]   = { upload_poisoned(n_e), upload_poisoned(n_d) };
        for (int guess = 0; guess < 2; ++guess) {
            float ** out = guess ? guessed : plain;
            frt_gemv_args a{};
            a.x = d_xe, a.x_stride = k, a.k = k, a.tokens = 1, a.x_per_token = n_used, a.n_segments = 2;
            frt_gemv_segment & e = a.seg[0];
            e.type = FRT_GEMV_Q6_K, e.w = d_we, e.rows = rows, e.row_stride = row_bytes, e.out = out[0];
            e.out_stride = rows + 3, e.ids = d_ids, e.ids_stride = n_used, e.n_used = n_used;
            e.n_experts = n_experts, e.expert_stride = (int64_t) rows * row_bytes;
            frt_gemv_segment & d = a.seg[1];
            d.type = FRT_GEMV_Q6_K, d.w = d_wd, d.rows = dense_rows, d.row_stride = row_bytes, d.out = out[1];
            d.out_stride = dense_rows + 3, d.x = d_xd;
            a.guess_logits = guess ? d_logits : nullptr;
            if (const char * why = frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT)) {
                std::printf("     guess: refused: %s\n", why);
                ok = false;
                break;
            }
            CHECK(frt_gemv(a, 0, FRT_GEMV_KERNEL_EXACT));
        }
        CHECK(cudaDeviceSynchronize());
        for (int part = 0; part < 2; ++part) {
            const size_t                n   = part == 0 ? n_e : n_d;
            const int                   pad = part == 0 ? rows : dense_rows;
            const std::vector<uint32_t> got  = download((const uint32_t *) guessed[part], n);
            const std::vector<uint32_t> want = download((const uint32_t *) plain[part], n);
            for (size_t at = 0; at < n; ++at) {
                const bool padding = (int) (at % (pad + 3)) >= pad;
                const bool good    = padding ? got[at] == kPoison : got[at] == want[at] && got[at] != kPoison;
                ++checked;
                if (!good && bad++ < 5) {
                    std::printf("     guess (%s) %s element %zu: %08x, without %08x\n", wrong ? "wrong" : "right",
                                part == 0 ? "experts" : "dense", at, got[at], want[at]);
                }
            }
        }
        for (void * m : { (void *) d_ids, (void *) guessed[0], (void *) guessed[1], (void *) plain[0], (void *) plain[1] }) {
            CHECK(cudaFree(m));
        }
    }
    for (void * m : { (void *) d_xe, (void *) d_xd, (void *) d_logits, (void *) d_we, (void *) d_wd }) {
        CHECK(cudaFree(m));
    }
    ok = ok && bad == 0;
    std::printf("%-4s %-34s exact k=%5d outputs=%9" PRId64 "  bit for bit the launch without the guess\n",
                ok ? "ok" : "FAIL", "experts guessed, right and wrong", k, checked);
    return ok;
}

// A launch that prefetches later launches' weights into L2 (frt_gemv_args::prefetch): a Q4_K pack
// with a residual, once without and once with three ranges (another matrix, its own weights, a
// range smaller than a block's share). The hint must change no output bit and touch no padding.
bool run_prefetch_case(std::mt19937_64 & rng) {
    const int     k = 2048, rows = 4100, other_rows = 3000;
    const int64_t row_bytes = gemv_ref::gguf_row_bytes(FRT_GEMV_Q4_K, k);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float>              x(k), residual(rows);
    for (float & v : x) {
        v = normal(rng);
    }
    for (float & v : residual) {
        v = normal(rng);
    }
    std::vector<uint8_t> w((size_t) rows * row_bytes), other((size_t) other_rows * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
        gemv_ref::random_row(FRT_GEMV_Q4_K, k, w.data() + r * row_bytes, rng);
    }
    for (int64_t r = 0; r < other_rows; ++r) {
        gemv_ref::random_row(FRT_GEMV_Q4_K, k, other.data() + r * row_bytes, rng);
    }
    float *      d_x        = upload(x);
    float *      d_residual = upload(residual);
    uint8_t *    d_w        = upload(w);
    uint8_t *    d_other    = upload(other);
    const size_t n          = (size_t) rows + 3;
    float *      out[2]     = { upload_poisoned(n), upload_poisoned(n) };
    bool         ok         = true;
    for (int with = 0; with < 2 && ok; ++with) {
        frt_gemv_args a{};
        a.x = d_x, a.x_stride = k, a.k = k, a.tokens = 1, a.x_per_token = 1, a.n_segments = 1;
        frt_gemv_segment & sg = a.seg[0];
        sg.type = FRT_GEMV_Q4_K, sg.w = d_w, sg.rows = rows, sg.row_stride = row_bytes, sg.out = out[with];
        sg.epilogue = FRT_GEMV_ADD, sg.residual = d_residual;
        if (with) {
            a.prefetch.n        = 3;
            a.prefetch.ptr[0]   = d_other;
            a.prefetch.bytes[0] = (int64_t) other.size() / 16 * 16;
            a.prefetch.ptr[1]   = d_w;
            a.prefetch.bytes[1] = (int64_t) w.size() / 16 * 16;
            a.prefetch.ptr[2]   = d_other + 4096;
            a.prefetch.bytes[2] = 48;
        }
        if (const char * why = frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT)) {
            std::printf("     prefetch: refused: %s\n", why);
            ok = false;
            break;
        }
        CHECK(frt_gemv(a, 0, FRT_GEMV_KERNEL_EXACT));
    }
    CHECK(cudaDeviceSynchronize());
    int64_t bad = 0;
    if (ok) {
        const std::vector<uint32_t> got  = download((const uint32_t *) out[1], n);
        const std::vector<uint32_t> want = download((const uint32_t *) out[0], n);
        for (size_t at = 0; at < n; ++at) {
            const bool good = at >= (size_t) rows ? got[at] == kPoison : got[at] == want[at] && got[at] != kPoison;
            if (!good && bad++ < 5) {
                std::printf("     prefetch element %zu: %08x, without %08x\n", at, got[at], want[at]);
            }
        }
    }
    for (void * m : { (void *) d_x, (void *) d_residual, (void *) d_w, (void *) d_other, (void *) out[0], (void *) out[1] }) {
        CHECK(cudaFree(m));
    }
    ok = ok && bad == 0;
    std::printf("%-4s %-34s exact k=%5d outputs=%9d  bit for bit the launch without the prefetch\n", ok ? "ok" : "FAIL",
                "prefetching later weights", k, rows);
    return ok;
}

// The trace (frt_gemv_trace): a Q4_K launch with a norm and a residual and an F32 launch with a
// norm (the router's kind), once directly, then captured in a CUDA graph replayed twice, into a ring
// that holds two rounds and a few records of the first. Each of the last two rounds must hold one
// record for every block of both launches, marks in order, and every output must be the bits of the
// same launches without the trace; once the trace stops, nothing is recorded.
bool run_trace_case(std::mt19937_64 & rng) {
    const int                       k = 2048, rows_q = 4100, rows_f = 257;
    const int64_t                   row_q = gemv_ref::gguf_row_bytes(FRT_GEMV_Q4_K, k), row_f = (int64_t) k * 4;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float>              x(k), norm(k), residual(rows_q), wf((size_t) rows_f * k);
    for (std::vector<float> * v : { &x, &norm, &residual, &wf }) {
        for (float & e : *v) {
            e = normal(rng);
        }
    }
    std::vector<uint8_t> wq((size_t) rows_q * row_q);
    for (int64_t r = 0; r < rows_q; ++r) {
        gemv_ref::random_row(FRT_GEMV_Q4_K, k, wq.data() + r * row_q, rng);
    }
    float *   d_x = upload(x), *d_norm = upload(norm), *d_residual = upload(residual), *d_wf = upload(wf);
    uint8_t * d_wq = upload(wq);
    const size_t nq = (size_t) rows_q + 3, nf = (size_t) rows_f + 3;
    float *   plain[2] = { upload_poisoned(nq), upload_poisoned(nf) };
    float *   traced[2] = { upload_poisoned(nq), upload_poisoned(nf) };
    const auto launch = [&](float * const (&out)[2], cudaStream_t stream) {
        frt_gemv_args a{};
        a.x = d_x, a.x_stride = k, a.k = k, a.tokens = 1, a.x_per_token = 1, a.n_segments = 1;
        a.norm = d_norm, a.eps = 1e-6f;
        frt_gemv_args f = a;
        a.seg[0].type = FRT_GEMV_Q4_K, a.seg[0].w = d_wq, a.seg[0].rows = rows_q, a.seg[0].row_stride = row_q;
        a.seg[0].out = out[0], a.seg[0].epilogue = FRT_GEMV_ADD, a.seg[0].residual = d_residual;
        f.seg[0].type = FRT_GEMV_F32, f.seg[0].w = d_wf, f.seg[0].rows = rows_f, f.seg[0].row_stride = row_f;
        f.seg[0].out = out[1];
        CHECK(frt_gemv(a, stream, FRT_GEMV_KERNEL_EXACT));
        CHECK(frt_gemv(f, stream, FRT_GEMV_KERNEL_EXACT));
    };
    bool ok = true;
    const auto fail = [&](const char * what, long long a0, long long a1) {
        if (ok) {
            std::printf("     trace: %s (%lld, %lld)\n", what, a0, a1);
        }
        ok = false;
    };
    launch(plain, 0);
    // A round's records (every block of both launches), to size the ring.
    CHECK(frt_gemv_trace(1 << 16));
    launch(traced, 0);
    std::vector<frt_gemv_trace_record> rec(1 << 16);
    int                                n = 0;
    CHECK(frt_gemv_trace_records(rec.data(), (int) rec.size(), &n));
    const int round = n;
    CHECK(frt_gemv_trace(2 * round + 7));
    launch(traced, 0);
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    launch(traced, stream);
    CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
        CHECK(cudaGraphLaunch(exec, stream));
    }
    CHECK(cudaStreamSynchronize(stream));
    CHECK(frt_gemv_trace_records(rec.data(), (int) rec.size(), &n));
    if (round < 2 || n != 2 * round + 7) {
        fail("records held (round, held)", round, n);
    }
    for (int r = 0; r < 2 && ok; ++r) {
        const frt_gemv_trace_record * first = rec.data() + 7 + r * round;
        std::vector<int>              seen_q, seen_f;
        for (int i = 0; i < round && ok; ++i) {
            const frt_gemv_trace_record & t  = first[i];
            const bool                    is_q = t.tag == (uint64_t) (uintptr_t) d_wq;
            if (!is_q && t.tag != (uint64_t) (uintptr_t) d_wf) {
                fail("a record of another launch", r, i);
            }
            const unsigned type = is_q ? FRT_GEMV_Q4_K : FRT_GEMV_F32;
            if (t.kind != (type | 1u << 8 | 1u << 19)) {  // one segment, a norm, no SwiGLU or routing
                fail("kind", t.kind, type);
            }
            const unsigned marks[] = { 0, t.waited, t.issued, t.normed, t.prologue, t.landed, t.products, t.stored };
            for (int m = 1; m < 8; ++m) {
                if (marks[m] < marks[m - 1] || marks[m] > (1u << 30)) {
                    fail("marks out of order", m, marks[m]);
                }
            }
            if (t.end_ns < t.start_ns || t.block >= t.grid) {
                fail("times or block", (long long) t.start_ns, (long long) t.end_ns);
            }
            std::vector<int> & seen = is_q ? seen_q : seen_f;
            seen.resize(t.grid, 0);
            if (t.block < seen.size() && seen[t.block]++ != 0) {
                fail("a block recorded twice", r, t.block);
            }
        }
        for (const std::vector<int> * seen : { &seen_q, &seen_f }) {
            if (seen->empty() || std::count(seen->begin(), seen->end(), 1) != (long) seen->size()) {
                fail("a block not recorded", r, (long long) seen->size());
            }
        }
    }
    // Stopped: a launch writes nothing more.
    CHECK(frt_gemv_trace(0));
    launch(traced, 0);
    CHECK(frt_gemv_trace_records(rec.data(), (int) rec.size(), &n));
    if (n != 0) {
        fail("records after the trace stopped", n, 0);
    }
    CHECK(cudaDeviceSynchronize());
    for (int o = 0; o < 2 && ok; ++o) {
        const size_t                rows = o == 0 ? rows_q : rows_f, size = rows + 3;
        const std::vector<uint32_t> got = download((const uint32_t *) traced[o], size);
        const std::vector<uint32_t> want = download((const uint32_t *) plain[o], size);
        for (size_t at = 0; at < size; ++at) {
            const bool good = at >= rows ? got[at] == kPoison : got[at] == want[at] && got[at] != kPoison;
            if (!good) {
                fail(o == 0 ? "q4_K output differs" : "f32 output differs", (long long) at, got[at]);
                break;
            }
        }
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(stream));
    for (void * m : { (void *) d_x, (void *) d_norm, (void *) d_residual, (void *) d_wf, (void *) d_wq,
                      (void *) plain[0], (void *) plain[1], (void *) traced[0], (void *) traced[1] }) {
        CHECK(cudaFree(m));
    }
    std::printf("%-4s %-34s exact k=%5d records=%8d  every block a record a round, bit for bit\n", ok ? "ok" : "FAIL",
                "trace of two launches", k, round);
    return ok;
}

// The MoE FFN's tail in the experts' down launch (frt_gemv_args::tail), as MATVEC launches it:
// every output bit for bit the launch without it followed by frt_moe_tail's kernel. Q8_0 rows, so
// that the row count (2046) leaves a partial group of the counters'. Two launches on the same
// counters: into a buffer of its own, then in place over the residual (element for element): the
// counters left at zero each time.
bool run_tail_case(std::mt19937_64 & rng) {
    const int     k = 512, rows = 2046, n_experts = 16, n_used = 8;
    const frt_gemv_type type = FRT_GEMV_Q8_0;
    const int64_t row_bytes = gemv_ref::gguf_row_bytes(type, k);
    std::normal_distribution<float>       normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> positive(0.0f, 1.0f);
    std::vector<float> xe((size_t) n_used * k), xd(k), residual(rows), weights(n_used), gate(1, normal(rng));
    for (std::vector<float> * v : { &xe, &xd, &residual }) {
        for (float & f : *v) {
            f = normal(rng);
        }
    }
    for (float & w : weights) {
        w = positive(rng);
    }
    std::vector<int32_t> ids(n_used);
    for (int32_t & id : ids) {
        id = (int32_t) (rng() % n_experts);
    }
    std::vector<uint8_t> we((size_t) n_experts * rows * row_bytes), wd((size_t) rows * row_bytes);
    for (int64_t r = 0; r < (int64_t) n_experts * rows; ++r) {
        gemv_ref::random_row(type, k, we.data() + r * row_bytes, rng);
    }
    for (int64_t r = 0; r < rows; ++r) {
        gemv_ref::random_row(type, k, wd.data() + r * row_bytes, rng);
    }
    const int  n_counters = (rows + FRT_GEMV_TAIL_ROWS_A_COUNTER - 1) / FRT_GEMV_TAIL_ROWS_A_COUNTER;
    float *    d_xe = upload(xe), *d_xd = upload(xd), *d_weights = upload(weights), *d_gate = upload(gate);
    int32_t *  d_ids = upload(ids);
    uint8_t *  d_we = upload(we), *d_wd = upload(wd);
    unsigned * d_counters = upload(std::vector<unsigned>(n_counters, 0u));
    const size_t n_e = (size_t) n_used * rows;
    float * experts[2] = { upload_poisoned(n_e), upload_poisoned(n_e) };  // apart, together
    float * shexp[2]   = { upload_poisoned(rows), upload_poisoned(rows) };
    float * want       = upload_poisoned(rows);
    float * out        = upload_poisoned(rows);
    float * in_place   = upload(residual);  // the residual, written over by the second launch
    float * d_residual = upload(residual);
    const auto args = [&](int which) {
        frt_gemv_args a{};
        a.x = d_xe, a.x_stride = k, a.k = k, a.tokens = 1, a.x_per_token = n_used, a.n_segments = 2;
        frt_gemv_segment & e = a.seg[0];
        e.type = type, e.w = d_we, e.rows = rows, e.row_stride = row_bytes, e.out = experts[which];
        e.out_stride = rows, e.ids = d_ids, e.ids_stride = n_used, e.n_used = n_used;
        e.n_experts = n_experts, e.expert_stride = (int64_t) rows * row_bytes;
        frt_gemv_segment & d = a.seg[1];
        d.type = type, d.w = d_wd, d.rows = rows, d.row_stride = row_bytes, d.out = shexp[which];
        d.out_stride = rows, d.x = d_xd;
        return a;
    };
    bool ok = true;
    CHECK(frt_gemv(args(0), 0, FRT_GEMV_KERNEL_EXACT));
    frt_moe_tail_args t{};
    t.n_embd = rows, t.n_used = n_used, t.tokens = 1;
    t.experts = experts[0], t.experts_token = (int64_t) n_used * rows, t.experts_slot = rows;
    t.weights = d_weights, t.shexp = shexp[0], t.gate = d_gate, t.residual = d_residual, t.out = want;
    CHECK(frt_moe_tail(t, 0));
    float * const outs[2] = { out, in_place };
    for (int launch = 0; launch < 2 && ok; ++launch) {
        frt_gemv_args a = args(1);
        a.tail.out = outs[launch];
        a.tail.weights = d_weights, a.tail.gate = d_gate, a.tail.residual = launch == 1 ? in_place : d_residual;
        a.tail.experts_seg = 0, a.tail.shexp_seg = 1, a.tail.counters = d_counters;
        if (const char * why = frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT)) {
            std::printf("     tail: refused: %s\n", why);
            ok = false;
            break;
        }
        CHECK(frt_gemv(a, 0, FRT_GEMV_KERNEL_EXACT));
    }
    CHECK(cudaDeviceSynchronize());
    int64_t checked = 0, bad = 0;
    const std::vector<uint32_t> ref = download((const uint32_t *) want, rows);
    for (float * got_at : outs) {
        const std::vector<uint32_t> got = download((const uint32_t *) got_at, rows);
        for (int r = 0; r < rows; ++r) {
            ++checked;
            if ((got[r] != ref[r] || got[r] == kPoison) && bad++ < 5) {
                std::printf("     tail row %d: %08x, apart %08x\n", r, got[r], ref[r]);
            }
        }
    }
    for (const int part : { 0, 1 }) {  // the down projections' own outputs are still written
        const size_t                n    = part == 0 ? n_e : (size_t) rows;
        const std::vector<uint32_t> got  = download((const uint32_t *) (part == 0 ? experts[1] : shexp[1]), n);
        const std::vector<uint32_t> ref2 = download((const uint32_t *) (part == 0 ? experts[0] : shexp[0]), n);
        for (size_t at = 0; at < n; ++at) {
            ++checked;
            if (got[at] != ref2[at] && bad++ < 5) {
                std::printf("     tail launch's %s element %zu: %08x, apart %08x\n", part == 0 ? "experts" : "shexp", at,
                            got[at], ref2[at]);
            }
        }
    }
    const std::vector<unsigned> left = download(d_counters, n_counters);
    const bool zero = std::all_of(left.begin(), left.end(), [](unsigned c) { return c == 0; });
    if (!zero) {
        std::printf("     tail: counters not left at zero\n");
    }
    for (void * m : { (void *) d_xe, (void *) d_xd, (void *) d_weights, (void *) d_gate, (void *) d_ids, (void *) d_we,
                      (void *) d_wd, (void *) d_counters, (void *) experts[0], (void *) experts[1], (void *) shexp[0],
                      (void *) shexp[1], (void *) want, (void *) out, (void *) in_place, (void *) d_residual }) {
        CHECK(cudaFree(m));
    }
    ok = ok && bad == 0 && zero;
    std::printf("%-4s %-34s exact k=%5d outputs=%9" PRId64 "  bit for bit the launch and frt_moe_tail apart\n",
                ok ? "ok" : "FAIL", "experts' down + shared + MoE tail", k, checked);
    return ok;
}

// The norm handoff: frt_moe_tail with x_q8 (the tail's output normed as the next layer's input
// norm and quantized) and then the pack's launch that copies that image (frt_gemv_args::x_q8),
// against frt_moe_tail alone and the same launch with the norm in its prologue. The tail's output
// and every row must be the same bits, while the handoff launch's x points at NaNs (it must not
// read x); every byte of the image is poisoned first, its integer sums must be its values', and
// its values d * q within quantization (d/2 and half's rounding of d) of the float64 normed output.
struct handoff_case {
    std::string                                    name;
    int                                            n_embd;
    bool                                           in_place;  // the tail's output over its residual
    std::vector<std::pair<frt_gemv_type, int>>     segs;      // the pack's matrices
};

bool run_handoff_case(const handoff_case & hc, std::mt19937_64 & rng) {
    const int   n = hc.n_embd, n_used = 8;
    const float eps = 1e-6f;
    std::normal_distribution<float>       normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> positive(0.0f, 1.0f), around_one(0.5f, 1.5f);
    std::vector<float> experts((size_t) n_used * n), shexp(n), residual(n), weights(n_used), gate(1, normal(rng)), w_norm(n);
    for (std::vector<float> * v : { &experts, &shexp, &residual }) {
        for (float & f : *v) {
            f = normal(rng);
        }
    }
    for (float & w : weights) {
        w = positive(rng);
    }
    for (float & w : w_norm) {
        w = around_one(rng);
    }
    float * d_experts = upload(experts), *d_shexp = upload(shexp), *d_weights = upload(weights), *d_gate = upload(gate);
    float * d_residual = upload(residual), *d_norm = upload(w_norm);
    float * d_in_place = upload(residual);  // the handoff tail's residual and output when in place
    float * d_plain    = upload_poisoned(n);
    float * d_out      = hc.in_place ? d_in_place : upload_poisoned(n);
    float * d_nan_x    = upload_poisoned(n);
    const int bytes    = frt_x_q8_bytes(n);
    uint8_t * d_image  = upload(std::vector<uint8_t>(bytes, 0xff));
    // The norm's scratch as a context leaves it after other launches: its sums another vector's (a
    // launch before the checked one, into its own output and image). It starts where the epoch
    // wraps around during that launch: every tagged sum at the largest epoch with a NaN's bits.
    std::vector<unsigned> scratch(FRT_MOE_TAIL_NORM_SCRATCH, 0u);
    for (int s = 0; s < 32; ++s) {
        scratch[2 * s]     = kPoison;       // the sum's bits
        scratch[2 * s + 1] = 0xffffffffu;  // the epoch
    }
    unsigned * d_scratch = upload(scratch);
    float *    d_before  = upload_poisoned(n);
    uint8_t *  d_image_before = upload(std::vector<uint8_t>(bytes, 0xff));
    bool       ok        = true;

    frt_moe_tail_args t{};
    t.n_embd = n, t.n_used = n_used, t.tokens = 1;
    t.experts = d_experts, t.experts_token = (int64_t) n_used * n, t.experts_slot = n;
    t.weights = d_weights, t.shexp = d_shexp, t.gate = d_gate, t.residual = d_residual, t.out = d_plain;
    t.shexp_token = n, t.residual_token = n, t.out_token = n, t.weights_token = n_used, t.gate_token = 1;
    CHECK(frt_moe_tail(t, 0));
    frt_moe_tail_args before = t;
    before.out = d_before, before.experts = d_residual, before.experts_slot = 0;  // another vector
    before.norm_w = d_norm, before.norm_eps = eps, before.x_q8 = d_image_before, before.norm_scratch = d_scratch;
    CHECK(frt_moe_tail(before, 0));
    frt_moe_tail_args h = t;
    h.out = d_out, h.residual = hc.in_place ? d_in_place : d_residual;
    h.norm_w = d_norm, h.norm_eps = eps, h.x_q8 = d_image, h.norm_scratch = d_scratch;
    CHECK(frt_moe_tail(h, 0));

    // The pack: with the norm in the prologue over the plain tail's output, and from the image.
    std::vector<uint8_t *> d_w;
    std::vector<float *>   outs[2];
    for (const auto & [type, rows] : hc.segs) {
        const int64_t        row_bytes = gemv_ref::gguf_row_bytes(type, n);
        std::vector<uint8_t> w((size_t) rows * row_bytes);
        for (int r = 0; r < rows; ++r) {
            gemv_ref::random_row(type, n, w.data() + r * row_bytes, rng);
        }
        d_w.push_back(upload(w));
        outs[0].push_back(upload_poisoned(rows));
        outs[1].push_back(upload_poisoned(rows));
    }
    for (int handed = 0; handed < 2 && ok; ++handed) {
        frt_gemv_args a{};
        a.x = handed ? d_nan_x : d_plain, a.x_stride = n, a.k = n, a.tokens = 1, a.x_per_token = 1;
        a.norm = d_norm, a.eps = eps;
        a.x_q8 = handed ? d_image : nullptr;
        a.n_segments = (int) hc.segs.size();
        for (size_t i = 0; i < hc.segs.size(); ++i) {
            frt_gemv_segment & sg = a.seg[i];
            sg.type = hc.segs[i].first, sg.w = d_w[i], sg.rows = hc.segs[i].second;
            sg.row_stride = gemv_ref::gguf_row_bytes(sg.type, n), sg.out = outs[handed][i];
        }
        if (const char * why = frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT)) {
            std::printf("     %s: refused: %s\n", hc.name.c_str(), why);
            ok = false;
            break;
        }
        CHECK(frt_gemv(a, 0, FRT_GEMV_KERNEL_EXACT));
    }
    CHECK(cudaDeviceSynchronize());

    int64_t    checked = 0, bad = 0;
    const auto expect_same = [&](const float * got_at, const float * want_at, size_t count, const char * what) {
        const std::vector<uint32_t> got = download((const uint32_t *) got_at, count);
        const std::vector<uint32_t> want = download((const uint32_t *) want_at, count);
        for (size_t i = 0; i < count; ++i) {
            ++checked;
            if ((got[i] != want[i] || got[i] == kPoison) && bad++ < 5) {
                std::printf("     %s: %s[%zu] is 0x%08x, want 0x%08x\n", hc.name.c_str(), what, i, got[i], want[i]);
            }
        }
    };
    expect_same(d_out, d_plain, n, "tail output");
    for (size_t i = 0; i < hc.segs.size(); ++i) {
        expect_same(outs[1][i], outs[0][i], hc.segs[i].second, "row");
    }
    // The image against the float64 norm of the tail's output.
    const std::vector<float>   out   = download(d_plain, n);
    const std::vector<uint8_t> image = download(d_image, bytes);
    double                     ss    = 0.0;
    for (float v : out) {
        ss += (double) v * v;
    }
    const double scale = 1.0 / std::sqrt(ss / n + eps);
    for (int b = 0; b < n / 32; ++b) {
        uint32_t d_bits, sums;
        std::memcpy(&d_bits, image.data() + n + 8 * b, 4);
        std::memcpy(&sums, image.data() + n + 8 * b + 4, 4);
        float d;
        std::memcpy(&d, &d_bits, 4);
        double amax = 0.0, ref[32];
        int    q_sum[2] = { 0, 0 };
        for (int j = 0; j < 32; ++j) {
            ref[j] = out[32 * b + j] * scale * w_norm[32 * b + j];
            amax   = std::max(amax, std::fabs(ref[j]));
            q_sum[j / 16] += (int8_t) image[32 * b + j];
        }
        const double bound = 0.6 * amax / 127.0 + 1e-5 * amax;
        for (int j = 0; j < 32; ++j) {
            ++checked;
            const double got = (double) d * (int8_t) image[32 * b + j];
            if (!(std::fabs(got - ref[j]) <= bound) && bad++ < 5) {
                std::printf("     %s: image value %d is %g, float64 %g (bound %g)\n", hc.name.c_str(), 32 * b + j, got,
                            ref[j], bound);
            }
        }
        ++checked;
        if ((int16_t) (sums & 0xffff) != q_sum[0] || (int16_t) (sums >> 16) != q_sum[1]) {
            if (bad++ < 5) {
                std::printf("     %s: block %d's sums 0x%08x, its values' %d and %d\n", hc.name.c_str(), b, sums,
                            q_sum[0], q_sum[1]);
            }
        }
    }
    for (void * m : { (void *) d_experts, (void *) d_shexp, (void *) d_weights, (void *) d_gate, (void *) d_residual,
                      (void *) d_norm, (void *) d_in_place, (void *) d_plain, (void *) d_nan_x, (void *) d_image,
                      (void *) d_scratch, (void *) d_before, (void *) d_image_before }) {
        CHECK(cudaFree(m));
    }
    if (!hc.in_place) {
        CHECK(cudaFree(d_out));
    }
    for (size_t i = 0; i < hc.segs.size(); ++i) {
        for (void * m : { (void *) d_w[i], (void *) outs[0][i], (void *) outs[1][i] }) {
            CHECK(cudaFree(m));
        }
    }
    ok = ok && bad == 0;
    std::printf("%-4s %-34s exact k=%5d outputs=%9" PRId64 "  tail + image bit for bit the norm in the prologue\n",
                ok ? "ok" : "FAIL", hc.name.c_str(), n, checked);
    return ok;
}

// What the handoff must refuse: the tail's image for more than one token, a width its block does
// not take or a misaligned image; a launch taking x_q8 without the exact kernel, with x_normed, wider
// than an image holds, with F32 weights or the SwiGLU epilogue.
bool run_handoff_refusals() {
    bool ok = true;
    alignas(16) static float dummy[64];
    frt_moe_tail_args t{};
    t.n_embd = 2048, t.n_used = 8, t.tokens = 1, t.experts = dummy, t.weights = dummy, t.shexp = dummy;
    t.gate = dummy, t.residual = dummy, t.out = dummy, t.norm_w = dummy, t.x_q8 = dummy, t.norm_scratch = (unsigned *) dummy;
    const auto tail_refuses = [&](const char * what, frt_moe_tail_args bad) {
        if (frt_moe_tail(bad, 0) != cudaErrorInvalidValue) {
            std::printf("     handoff: frt_moe_tail took %s\n", what);
            ok = false;
        }
        (void) cudaGetLastError();
    };
    frt_moe_tail_args bad = t;
    bad.tokens = 2;
    tail_refuses("2 tokens", bad);
    bad = t, bad.n_embd = 768;
    tail_refuses("768 columns", bad);
    bad = t, bad.n_embd = FRT_MOE_TAIL_NORM_MAX_EMBD + 1024;
    tail_refuses("too many columns", bad);
    bad = t, bad.x_q8 = (char *) dummy + 4;
    tail_refuses("a misaligned image", bad);
    bad = t, bad.norm_w = nullptr;
    tail_refuses("no norm weight", bad);
    bad = t, bad.norm_scratch = nullptr;
    tail_refuses("no scratch", bad);
    bad = t, bad.norm_scratch = (unsigned *) dummy + 1;
    tail_refuses("a misaligned scratch", bad);
    frt_gemv_args a{};
    a.x = dummy, a.x_stride = 2048, a.k = 2048, a.tokens = 1, a.x_per_token = 1, a.norm = dummy, a.x_q8 = dummy;
    a.n_segments = 1;
    a.seg[0].type = FRT_GEMV_Q4_K, a.seg[0].w = dummy, a.seg[0].rows = 16;
    a.seg[0].row_stride = gemv_ref::gguf_row_bytes(FRT_GEMV_Q4_K, 2048), a.seg[0].out = dummy + 32;
    if (const char * why = frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT)) {
        std::printf("     handoff: a plain launch refused: %s\n", why);
        ok = false;
    }
    const auto gemv_refuses = [&](const char * what, const frt_gemv_args & b, frt_gemv_kernel kernel) {
        if (frt_gemv_unsupported(b, kernel) == nullptr) {
            std::printf("     handoff: frt_gemv took x_q8 %s\n", what);
            ok = false;
        }
    };
    gemv_refuses("with the register kernel", a, FRT_GEMV_KERNEL_REGISTERS);
    frt_gemv_args b = a;
    b.x_normed = dummy, b.x_normed_stride = 2048;
    gemv_refuses("with x_normed", b, FRT_GEMV_KERNEL_EXACT);
    b = a, b.k = FRT_X_Q8_MAX_K + 256, b.x_stride = b.k;
    b.seg[0].row_stride = gemv_ref::gguf_row_bytes(FRT_GEMV_Q4_K, b.k);
    gemv_refuses("wider than FRT_X_Q8_MAX_K", b, FRT_GEMV_KERNEL_EXACT);
    b = a, b.seg[0].type = FRT_GEMV_F32, b.seg[0].row_stride = 2048 * sizeof(float);
    gemv_refuses("with F32 weights", b, FRT_GEMV_KERNEL_EXACT);
    b = a, b.seg[0].epilogue = FRT_GEMV_SWIGLU, b.seg[0].w_gate = dummy;
    if (const char * why = frt_gemv_unsupported(b, FRT_GEMV_KERNEL_EXACT)) {
        std::printf("     handoff: a SwiGLU launch refused: %s\n", why);
        ok = false;
    }
    // The normed x's image as an output: only a launch on the router kernel writes it.
    frt_gemv_args r{};
    r.x = dummy, r.x_stride = 2048, r.k = 2048, r.tokens = 1, r.x_per_token = 1, r.norm = dummy;
    r.x_normed = dummy + 16, r.x_normed_stride = 2048, r.x_normed_q8 = dummy + 48;
    r.n_segments = 1;
    r.seg[0].type = FRT_GEMV_F32, r.seg[0].w = dummy, r.seg[0].rows = 4, r.seg[0].row_stride = 2048 * sizeof(float);
    r.seg[0].out = dummy + 32;
    // Taken where such a launch runs on the router kernel (GGML_FLASHRT_ROUTER_F32, on by default).
    const char * router_why = frt_gemv_unsupported(r, FRT_GEMV_KERNEL_EXACT);
    if (frt_env_flag("GGML_FLASHRT_ROUTER_F32", true) ? router_why != nullptr : router_why == nullptr) {
        std::printf("     handoff: a router launch writing the image %s\n", router_why ? router_why : "taken");
        ok = false;
    }
    const auto image_refused = [&](const char * what, const frt_gemv_args & c, frt_gemv_kernel kernel) {
        if (frt_gemv_unsupported(c, kernel) == nullptr) {
            std::printf("     handoff: frt_gemv took x_normed_q8 %s\n", what);
            ok = false;
        }
    };
    image_refused("with the register kernel", r, FRT_GEMV_KERNEL_REGISTERS);
    b = r, b.x_normed = nullptr;
    image_refused("without x_normed", b, FRT_GEMV_KERNEL_EXACT);
    b = r, b.x_normed_q8 = dummy + 49;
    image_refused("misaligned", b, FRT_GEMV_KERNEL_EXACT);
    b = a, b.x_q8 = nullptr, b.x_normed = dummy + 16, b.x_normed_stride = 2048, b.x_normed_q8 = dummy + 48;
    image_refused("on Q4_K rows (not the router kernel)", b, FRT_GEMV_KERNEL_EXACT);
    std::printf("%-4s %-34s\n", ok ? "ok" : "FAIL", "norm handoff refusals");
    return ok;
}

bool run_refusals() {
    std::vector<float> host(4096 * 8, 1.0f);
    float *            d  = upload(host);
    float *            out = upload(std::vector<float>(64, 0.0f));
    auto               base = [&] {
        frt_gemv_args a{};
        a.x             = d;
        a.x_stride      = 2048;
        a.k             = 2048;
        a.tokens        = 1;
        a.x_per_token   = 1;
        a.n_segments    = 1;
        a.seg[0].type   = FRT_GEMV_Q4_K;
        a.seg[0].w      = d;
        a.seg[0].rows   = 8;
        a.seg[0].row_stride = frt_gemv_row_bytes(FRT_GEMV_Q4_K, 2048);
        a.seg[0].out    = out;
        a.seg[0].out_stride = 8;
        return a;
    };
    struct refusal {
        const char *                         what;
        std::function<void(frt_gemv_args &)> change;
        frt_gemv_kernel                      kernel = FRT_GEMV_KERNEL_AUTO;  // the kernel that must refuse
    };
    const refusal cases[] = {
        { "k not a multiple of 256", [](frt_gemv_args & a) { a.k = 2048 + 32; } },
        { "9 tokens", [](frt_gemv_args & a) { a.tokens = 9; } },
        { "x not 16-byte aligned", [](frt_gemv_args & a) { a.x = a.x + 1; } },
        { "Q4_K and F32 in one launch", [](frt_gemv_args & a) {
              a.n_segments        = 2;
              a.seg[1]            = a.seg[0];
              a.seg[1].type       = FRT_GEMV_F32;
              a.seg[1].row_stride = frt_gemv_row_bytes(FRT_GEMV_F32, 2048);
          } },
        { "Q4_K and F32 in one launch (bulk)", [](frt_gemv_args & a) {
              a.n_segments        = 2;
              a.seg[1]            = a.seg[0];
              a.seg[1].type       = FRT_GEMV_F32;
              a.seg[1].row_stride = frt_gemv_row_bytes(FRT_GEMV_F32, 2048);
          }, FRT_GEMV_KERNEL_BULK },
        { "2 tokens (bulk)", [](frt_gemv_args & a) { a.tokens = 2; }, FRT_GEMV_KERNEL_BULK },
        { "Q6_K of 630 B x 37 rows (bulk)", [](frt_gemv_args & a) {
              a.k                 = 768;
              a.seg[0].type       = FRT_GEMV_Q6_K;
              a.seg[0].rows       = 37;
              a.seg[0].row_stride = frt_gemv_row_bytes(FRT_GEMV_Q6_K, 768);
          }, FRT_GEMV_KERNEL_BULK },
        { "F32 rows of 128 KB (bulk)", [](frt_gemv_args & a) {
              a.k                 = 32768;
              a.x_stride          = 32768;
              a.seg[0].type       = FRT_GEMV_F32;
              a.seg[0].row_stride = 4 * 32768;
          }, FRT_GEMV_KERNEL_BULK },
        { "GGUF Q6_K rows not contiguous", [](frt_gemv_args & a) {
              a.seg[0].type       = FRT_GEMV_Q6_K;
              a.seg[0].row_stride = frt_gemv_row_bytes(FRT_GEMV_Q6_K, 2048) + 16;
          } },
        { "norm over 16 input vectors", [](frt_gemv_args & a) {
              a.norm        = a.x;
              a.tokens      = 2;
              a.x_per_token = 8;
          } },
        { "2 tokens (exact)", [](frt_gemv_args & a) { a.tokens = 2; }, FRT_GEMV_KERNEL_EXACT },
        { "BF16 weights (exact)", [](frt_gemv_args & a) {
              a.seg[0].type       = FRT_GEMV_BF16;
              a.seg[0].row_stride = frt_gemv_row_bytes(FRT_GEMV_BF16, 2048);
          }, FRT_GEMV_KERNEL_EXACT },
        { "repacked Q6_K (exact)", [](frt_gemv_args & a) {
              a.seg[0].type       = FRT_GEMV_Q6_K_R;
              a.seg[0].row_stride = frt_gemv_row_bytes(FRT_GEMV_Q6_K_R, 2048);
          }, FRT_GEMV_KERNEL_EXACT },
        { "Q4_K rows (head)", [](frt_gemv_args & a) { (void) a; }, FRT_GEMV_KERNEL_HEAD },
        { "2 tokens of Q6_K_R (head)", [](frt_gemv_args & a) {
              a.tokens            = 2;
              a.seg[0].type       = FRT_GEMV_Q6_K_R;
              a.seg[0].row_stride = frt_gemv_row_bytes(FRT_GEMV_Q6_K_R, 2048);
          }, FRT_GEMV_KERNEL_HEAD },
        { "Q6_K_R, 8 input vectors (head)", [](frt_gemv_args & a) {
              a.x_per_token       = 8;
              a.seg[0].type       = FRT_GEMV_Q6_K_R;
              a.seg[0].row_stride = frt_gemv_row_bytes(FRT_GEMV_Q6_K_R, 2048);
          }, FRT_GEMV_KERNEL_HEAD },
        { "Q6_K_R at k = 1024 (head)", [](frt_gemv_args & a) {
              a.k                 = 1024;
              a.seg[0].type       = FRT_GEMV_Q6_K_R;
              a.seg[0].row_stride = frt_gemv_row_bytes(FRT_GEMV_Q6_K_R, 1024);
          }, FRT_GEMV_KERNEL_HEAD },
        { "SWIGLU on the register kernel", [](frt_gemv_args & a) {
              a.seg[0].epilogue = FRT_GEMV_SWIGLU;
              a.seg[0].w_gate   = a.seg[0].w;
          } },
        { "SWIGLU without gate weights (exact)", [](frt_gemv_args & a) { a.seg[0].epilogue = FRT_GEMV_SWIGLU; },
          FRT_GEMV_KERNEL_EXACT },
        { "SWIGLU on one segment of two (exact)", [](frt_gemv_args & a) {
              a.n_segments      = 2;
              a.seg[1]          = a.seg[0];
              a.seg[0].epilogue = FRT_GEMV_SWIGLU;
              a.seg[0].w_gate   = a.seg[0].w;
          }, FRT_GEMV_KERNEL_EXACT },
        { "routing on the register kernel", [](frt_gemv_args & a) {
              a.route_logits    = a.x;
              a.route_n_experts = 256;
              a.route_ids       = (int32_t *) a.seg[0].out;
              a.route_weights   = a.seg[0].out;
          } },
        { "routing without experts (exact)", [](frt_gemv_args & a) {
              a.route_logits    = a.x;
              a.route_n_experts = 256;
              a.route_ids       = (int32_t *) a.seg[0].out;
              a.route_weights   = a.seg[0].out;
          }, FRT_GEMV_KERNEL_EXACT },
        { "routing over 48 experts (exact)", [](frt_gemv_args & a) {
              a.route_logits    = a.x;
              a.route_n_experts = 48;
              a.route_ids       = (int32_t *) a.seg[0].out;
              a.route_weights   = a.seg[0].out;
          }, FRT_GEMV_KERNEL_EXACT },
        { "a guess without experts (exact)", [](frt_gemv_args & a) { a.guess_logits = a.x; },
          FRT_GEMV_KERNEL_EXACT },
        { "a guess on the register kernel", [](frt_gemv_args & a) { a.guess_logits = a.x; } },
        { "a prefetch on the register kernel", [](frt_gemv_args & a) {
              a.prefetch.n        = 1;
              a.prefetch.ptr[0]   = a.x;
              a.prefetch.bytes[0] = 16;
          } },
        { "a prefetch range of 8 bytes (exact)", [](frt_gemv_args & a) {
              a.prefetch.n        = 1;
              a.prefetch.ptr[0]   = a.x;
              a.prefetch.bytes[0] = 8;
          }, FRT_GEMV_KERNEL_EXACT },
        { "5 prefetch ranges (exact)", [](frt_gemv_args & a) { a.prefetch.n = 5; }, FRT_GEMV_KERNEL_EXACT },
        { "experts' prefetch without routing (exact)", [](frt_gemv_args & a) {
              a.prefetch.experts       = a.x;
              a.prefetch.expert_stride = 16;
              a.prefetch.expert_bytes  = 16;
          }, FRT_GEMV_KERNEL_EXACT },
        { "own input on the register kernel", [](frt_gemv_args & a) { a.seg[0].x = a.x; } },
        { "an MoE tail on the register kernel", [](frt_gemv_args & a) {
              a.tail.residual = a.tail.out = a.seg[0].out;
              a.tail.weights = a.tail.gate = a.x;
              a.tail.shexp_seg = 1;
          } },
        { "an MoE tail without experts (exact)", [](frt_gemv_args & a) {
              a.tail.residual = a.tail.out = a.seg[0].out;
              a.tail.weights = a.tail.gate = a.x;
              a.tail.shexp_seg = 1;
          }, FRT_GEMV_KERNEL_EXACT },
        { "own input with a norm (exact)", [](frt_gemv_args & a) {
              a.seg[0].x = a.x;
              a.norm     = a.x;
          }, FRT_GEMV_KERNEL_EXACT },
        { "float x of 8 tokens x 4096", [](frt_gemv_args & a) {
              a.k                 = 4096;
              a.x_stride          = 4096;
              a.tokens            = 8;
              a.seg[0].type       = FRT_GEMV_F32;
              a.seg[0].row_stride = 4 * 4096;
          } },
    };
    bool ok = true;
    for (const refusal & r : cases) {
        frt_gemv_args a = base();
        r.change(a);
        const char *      why = frt_gemv_unsupported(a, r.kernel);
        const cudaError_t err = frt_gemv(a, 0, r.kernel);
        const bool        refused = why != nullptr && err == cudaErrorInvalidValue;
        ok = ok && refused;
        std::printf("%-4s refuses %-31s %s\n", refused ? "ok" : "FAIL", r.what, why ? why : "(accepted)");
    }
    CHECK(cudaDeviceSynchronize());
    const std::vector<float> after = download(out, 64);
    for (float v : after) {
        ok = ok && v == 0.0f;
    }
    CHECK(cudaFree(d));
    CHECK(cudaFree(out));
    return ok;
}

}  // namespace

// After every exact launch above: each launch that took chunks from a counter left its counters
// at zero for the next (the last block to finish resets them), so all of them are zero now. Then,
// under GGML_FLASHRT_EXACT_CHUNKS=N (N >= 2), a launch of attn_qkv's shape (8192 Q4_K rows, more
// chunks than a wave on any GPU of up to 256 SMs) with every Q4_K claim counter set past any
// chunk: its blocks take their first chunks only, so rows of the chunks they would have claimed
// stay poisoned (the launch did split its rows, and took the rest from the counter), and the
// launch's words are zero again after it.
bool run_chunk_counters_case() {
    std::vector<unsigned> words(FRT_GEMV_CHUNK_COUNTER_WORDS);
    const auto nonzero_words = [&]() {
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(words.data(), chunk_counters(), words.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
        return (int) std::count_if(words.begin(), words.end(), [](unsigned w) { return w != 0; });
    };
    const int    left  = nonzero_words();
    const char * split = std::getenv("GGML_FLASHRT_EXACT_CHUNKS");
    bool         ok    = left == 0;
    std::printf("%-4s %-34s %d of %d words not zero after the cases (GGML_FLASHRT_EXACT_CHUNKS=%s)\n",
                ok ? "ok" : "FAIL", "chunk counters back at zero", left, (int) words.size(), split != nullptr ? split : "unset");
    if (split == nullptr || std::atoi(split) < 2) {
        return ok;
    }
    const int     k = 2048, rows = 8192, words_a_launch = FRT_GEMV_CHUNK_COUNTER_WORDS / FRT_GEMV_CHUNK_SLOTS;
    const int64_t row_bytes = gemv_ref::gguf_row_bytes(FRT_GEMV_Q4_K, k);
    std::mt19937_64                 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float>              x(k);
    for (float & v : x) {
        v = normal(rng);
    }
    std::vector<uint8_t> w((size_t) rows * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
        gemv_ref::random_row(FRT_GEMV_Q4_K, k, w.data() + r * row_bytes, rng);
    }
    float *   d_x   = upload(x);
    uint8_t * d_w   = upload(w);
    float *   d_out = upload_poisoned(rows);
    std::vector<unsigned> past(FRT_GEMV_CHUNK_COUNTER_WORDS, 0);
    for (int slot = 0; slot < FRT_GEMV_CHUNK_SLOTS; ++slot) {
        past[slot * words_a_launch] = 1u << 30;  // Q4_K's claim counter: no chunk that far
    }
    CHECK(cudaMemcpy(chunk_counters(), past.data(), past.size() * sizeof(unsigned), cudaMemcpyHostToDevice));
    frt_gemv_args a{};
    a.chunk_counters = chunk_counters();
    a.x = d_x, a.x_stride = k, a.k = k, a.tokens = 1, a.x_per_token = 1, a.n_segments = 1;
    frt_gemv_segment & sg = a.seg[0];
    sg.type = FRT_GEMV_Q4_K, sg.w = d_w, sg.rows = rows, sg.row_stride = row_bytes, sg.out = d_out;
    CHECK(frt_gemv(a, 0, FRT_GEMV_KERNEL_EXACT));
    CHECK(cudaDeviceSynchronize());
    const std::vector<uint32_t> got = download((const uint32_t *) d_out, rows);
    const int64_t poisoned = std::count(got.begin(), got.end(), kPoison);
    int           reset    = 0;  // slots whose words are all zero: the launch's
    CHECK(cudaMemcpy(words.data(), chunk_counters(), words.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (int slot = 0; slot < FRT_GEMV_CHUNK_SLOTS; ++slot) {
        reset += std::all_of(words.begin() + slot * words_a_launch, words.begin() + (slot + 1) * words_a_launch,
                             [](unsigned v) { return v == 0; });
    }
    CHECK(cudaMemset(chunk_counters(), 0, words.size() * sizeof(unsigned)));
    for (void * m : { (void *) d_x, (void *) d_w, (void *) d_out }) {
        CHECK(cudaFree(m));
    }
    const bool split_ok = poisoned > 0 && poisoned < rows && reset == 1;
    std::printf("%-4s %-34s exact k=%5d rows=%6d  %" PRId64 " rows left by claims past the end, %d launch's words reset\n",
                split_ok ? "ok" : "FAIL", "chunks: claims from the counter", k, rows, poisoned, reset);
    return ok && split_ok;
}

int main(int argc, char ** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::random_device{}();
    std::printf("seed %" PRIu64 " (rerun with: test-gemv %" PRIu64 ")\n", seed, seed);
    std::mt19937_64 rng(seed);

    using S = seg_case;
    const frt_gemv_type F32 = FRT_GEMV_F32, F16 = FRT_GEMV_F16, BF16 = FRT_GEMV_BF16, Q4 = FRT_GEMV_Q4_K,
                        Q5 = FRT_GEMV_Q5_K, Q6 = FRT_GEMV_Q6_K, Q8 = FRT_GEMV_Q8_0;
    std::vector<test_case> cases;
    auto add = [&](test_case c) { cases.push_back(std::move(c)); };
    // Decode shapes of qwen36 (bench/tools/gemv-bench.cu times the same).
    add({ "attn_qkv", 2048, 1, { S{ Q4, 8192 } } });
    add({ "attn_gate", 2048, 1, { S{ Q4, 4096 } } });
    add({ "ssm_out + residual in place", 4096, 1, { S{ Q4, 2048, false, 0, true, true } } });
    add({ "ffn_gate_inp (router)", 2048, 1, { S{ F32, 256 } } });
    add({ "ffn_gate_inp_shexp", 2048, 1, { S{ F32, 1 } } });
    add({ "attn_k", 2048, 1, { S{ Q4, 512 } } });
    add({ "attn_v (repacked)", 2048, 1, { S{ Q6, 512, true } } });
    add({ "ssm_alpha (repacked)", 2048, 1, { S{ Q8, 32, true } } });
    add({ "ffn_down_shexp (repacked)", 512, 1, { S{ Q6, 2048, true } } });
    {
        // llama.cpp keeps the final norm's value (an output): the launch writes it too.
        test_case c{ "output (LM head, normed, kept)", 2048, 1, { S{ Q6, 248320, true } }, true };
        c.keep_normed = true;
        add(c);
    }
    {
        test_case c{ "gate+up experts, repeats", 2048, 1, { S{ Q4, 512, false, 16 }, S{ Q4, 512, false, 16 } } };
        c.n_used = 8, c.repeat_ids = true;
        add(c);
        c.name = "gate+up experts, 2 tokens", c.tokens = 2;
        add(c);
    }
    {
        test_case c{ "down experts (GGUF Q6_K)", 512, 1, { S{ Q6, 2048, false, 16 } } };
        c.n_used = 8, c.x_per_slot = true, c.repeat_ids = true;
        add(c);
        c.name = "down experts, 3 tokens, residual", c.tokens = 3;
        c.segs[0].add = true;
        add(c);
    }
    {
        test_case c{ "experts, one id out of range", 2048, 2, { S{ Q4, 64, false, 4 } } };
        c.n_used = 4, c.bad_id = true;
        add(c);
    }
    add({ "GDN in-proj pack (qkv z alpha beta)", 2048, 1,
          { S{ Q4, 8192 }, S{ Q4, 4096 }, S{ Q8, 32 }, S{ Q8, 32 } }, true });
    add({ "GDN in-proj pack, 2 tokens", 2048, 2, { S{ Q4, 8192 }, S{ Q4, 4096 }, S{ Q8, 32 }, S{ Q8, 32 } }, true });
    add({ "attention q/k/v pack (v GGUF Q6_K)", 2048, 1, { S{ Q4, 8192 }, S{ Q4, 512 }, S{ Q6, 512 } }, true });
    // Repacked Q6_K/Q8_0 in a pack of another type go through shared memory too.
    add({ "GDN pack, alpha beta repacked", 2048, 1,
          { S{ Q4, 8192 }, S{ Q4, 4096 }, S{ Q8, 32, true }, S{ Q8, 32, true } }, true });
    {
        test_case c{ "q/k/v pack, v repacked, 3 tokens, kept", 2048, 3,
                     { S{ Q4, 2048 }, S{ Q4, 512 }, S{ Q6, 512, true } }, true };
        c.keep_normed = true;
        add(c);
    }
    add({ "q6_K_R + q8_0_R + q8_0 GGUF", 768, 2, { S{ Q6, 300, true }, S{ Q8, 70, true }, S{ Q8, 33 } } });
    add({ "router 8 tokens", 2048, 8, { S{ F32, 256 } } });
    // Odd shapes.
    add({ "q5_K 1000 rows, 5 tokens, residual", 768, 5, { S{ Q5, 1000, false, 0, true } } });
    add({ "q6_K GGUF 37 rows, 3 tokens", 768, 3, { S{ Q6, 37 } } });
    add({ "q6_K GGUF k=256, 21 rows", 256, 2, { S{ Q6, 21 } } });
    add({ "q8_0 GGUF 101 rows, 2 tokens", 512, 2, { S{ Q8, 101 } } });
    add({ "q6_K_R 77 rows, 4 tokens, normed", 512, 4, { S{ Q6, 77, true } }, true });
    add({ "q8_0_R 45 rows, 6 tokens", 1280, 6, { S{ Q8, 45, true } } });
    add({ "f16 333 rows, 7 tokens, normed", 256, 7, { S{ F16, 333 } }, true });
    add({ "bf16 129 rows, 2 tokens", 768, 2, { S{ BF16, 129 } } });
    add({ "q4_K 5 rows, 8 tokens", 256, 8, { S{ Q4, 5 } } });
    add({ "q5_K pack + q6_K/q8_0 GGUF, 3 tokens", 1024, 3, { S{ Q5, 300 }, S{ Q6, 70 }, S{ Q8, 9 }, S{ Q5, 3 } } });
    // Packs of several direct-path segments that the planner splits over teams of warps (split > 1:
    // the team barriers and partial sums, batches of different segments side by side).
    add({ "shexp gate+up pack (teams of 2)", 2048, 1, { S{ Q4, 512 }, S{ Q4, 512 } } });
    add({ "shexp gate+up pack, 5 tokens", 2048, 5, { S{ Q4, 512 }, S{ Q4, 512 } } });
    add({ "q4_K pack 512 + 37 rows (teams of 8)", 2048, 1, { S{ Q4, 512 }, S{ Q4, 37 } } });
    add({ "q4_K pack of 3, 3 tokens", 512, 3, { S{ Q4, 100 }, S{ Q4, 7 }, S{ Q4, 100 } } });
    add({ "router + shexp gate (f32 pack)", 2048, 1, { S{ F32, 256 }, S{ F32, 1 } } });
    add({ "router + shexp gate, 4 tokens", 2048, 4, { S{ F32, 256 }, S{ F32, 1 } } });
    add({ "alpha + beta, both repacked", 2048, 1, { S{ Q8, 32, true }, S{ Q8, 32, true } } });
    add({ "q6_K_R pack, 2 tokens", 2048, 2, { S{ Q6, 300, true }, S{ Q6, 77, true } } });
    add({ "bf16 pack, 3 tokens, normed", 768, 3, { S{ BF16, 64 }, S{ BF16, 5 } }, true });
    {
        test_case c{ "shared + routed gate/up, 1 pack", 2048, 1,
                     { S{ Q4, 512 }, S{ Q4, 512 }, S{ Q4, 512, false, 12 }, S{ Q4, 512, false, 12 } } };
        c.n_used = 8;
        add(c);
    }

    // 1-token launches only with the bulk kernel: every case at 1 token with both kernels.
    add({ "pack: q4_K + q6_K_R + GGUF q8_0 + q6_K", 2048, 1,
          { S{ Q4, 700 }, S{ Q6, 300, true }, S{ Q8, 40 }, S{ Q6, 16 } }, true });
    add({ "q5_K 1000 rows, residual", 768, 1, { S{ Q5, 1000, false, 0, true } } });
    add({ "q6_K GGUF k=256, 24 rows", 256, 1, { S{ Q6, 24 } } });
    add({ "q5_K pack + q6_K/q8_0 GGUF, 1 token", 1024, 1, { S{ Q5, 300 }, S{ Q6, 72 }, S{ Q8, 9 }, S{ Q5, 3 } } });
    add({ "q6_K GGUF k=768 (odd blocks), 40 rows", 768, 1, { S{ Q6, 40 } }, true });
    add({ "q8_0 GGUF 104 rows + q6_K 8 rows", 512, 1, { S{ Q8, 104 }, S{ Q6, 8 } } });
    add({ "f16 333 rows, normed", 256, 1, { S{ F16, 333 } }, true });
    add({ "bf16 129 rows + q8_0_R 20 rows", 768, 1, { S{ BF16, 129 }, S{ Q8, 20, true } } });
    add({ "q4_K 5 rows, k=256", 256, 1, { S{ Q4, 5 } } });
    add({ "f32 k=2048, 300 rows", 2048, 1, { S{ F32, 300 } } });
    {
        test_case c{ "down experts + residual, 1 token", 512, 1, { S{ Q6, 2048, false, 16, true } } };
        c.n_used = 8, c.x_per_slot = true, c.bad_id = true;
        add(c);
    }

    // The exact kernel's own cases: the other odd shapes at 1 token (its K loop of several passes,
    // small K with idle threads, a Q8_0 row of 64 passes).
    add({ "q4_K k=4096 (2 passes), 33 rows", 4096, 1, { S{ Q4, 33 } } });
    add({ "q6_K GGUF k=2048 (2 passes), 19 rows + residual", 2048, 1, { S{ Q6, 19, false, 0, true } } });
    add({ "q8_0 GGUF k=2048 (passes of 32 blocks)", 2048, 1, { S{ Q8, 65 } } });
    add({ "q8_0 GGUF k=4096 + q4_K, residual in place", 4096, 1,
          { S{ Q8, 40, false, 0, true, true }, S{ Q4, 24 } } });

    // The head kernel's own: k = 4096 (two pairs of items a lane), a residual, rows that leave the
    // last warps' batches partly empty, x kept after the norm.
    add({ "q6_K_R k=4096, 3001 rows, residual", 4096, 1, { S{ Q6, 3001, true, 0, true } } });
    {
        test_case c{ "q6_K_R k=4096, 20001 rows, normed, kept", 4096, 1, { S{ Q6, 20001, true } }, true };
        c.keep_normed = true;
        add(c);
    }
    add({ "q6_K_R k=2048, 5 rows", 2048, 1, { S{ Q6, 5, true } } });

    add({ "f32 k=256 (mmvf's block of 128)", 256, 1, { S{ F32, 70 } } });
    add({ "f32 k=4096, 33 rows", 4096, 1, { S{ F32, 33 } } });

    // The exact kernel takes 1 token of GGUF Q4_K, Q6_K, Q8_0 and F32 (refusals below).
    const auto exact_takes = [](const test_case & c) {
        if (c.tokens != 1) {
            return false;
        }
        for (const seg_case & sc : c.segs) {
            if (sc.repack || (sc.type != FRT_GEMV_Q4_K && sc.type != FRT_GEMV_Q6_K && sc.type != FRT_GEMV_Q8_0 &&
                              sc.type != FRT_GEMV_F32)) {
                return false;
            }
        }
        return true;
    };
    // The head kernel takes 1 token of one repacked Q6_K matrix at k = 2048 or 4096.
    const auto head_takes = [](const test_case & c) {
        return c.tokens == 1 && c.n_used == 0 && c.segs.size() == 1 && c.segs[0].type == FRT_GEMV_Q6_K &&
               c.segs[0].repack && (c.k == 2048 || c.k == 4096);
    };
    int failed = 0, total = 0;
    for (const test_case & c : cases) {
        for (const frt_gemv_kernel kernel :
             { FRT_GEMV_KERNEL_REGISTERS, FRT_GEMV_KERNEL_BULK, FRT_GEMV_KERNEL_EXACT, FRT_GEMV_KERNEL_HEAD }) {
            if (kernel == FRT_GEMV_KERNEL_HEAD && !head_takes(c)) {
                continue;
            }
            if (kernel == FRT_GEMV_KERNEL_BULK && c.tokens != 1) {
                continue;  // the bulk kernel takes 1 token (refusals below)
            }
            if (kernel == FRT_GEMV_KERNEL_EXACT && !exact_takes(c)) {
                continue;
            }
            failed += run_case(c, kernel, rng) ? 0 : 1;
            ++total;
        }
    }
    // The SWIGLU epilogue: the routed experts' gate/up (16 experts, 8 used, one id out of range),
    // with the shared expert's pair in the same launch and the FFN norm in the prologue as
    // SHEXP_FOLD runs them; a dense pair alone; rows read in place (GGUF Q6_K of 630 bytes).
    const glu_case glu_cases[] = {
        { "SWIGLU experts + shared, normed", FRT_GEMV_Q4_K, 2048, 512, 16, true, true },
        { "SWIGLU dense q6_K k=512", FRT_GEMV_Q6_K, 512, 300, 0, false, false },
        { "SWIGLU experts q8_0 k=1024", FRT_GEMV_Q8_0, 1024, 70, 12, false, false },
        { "SWIGLU q6_K k=768 in place", FRT_GEMV_Q6_K, 768, 40, 10, true, false },
        // Routed in the launch: qwen36's 8 of 256 with the shared pair and the norm; 8 of 64 with
        // the dense pair's blocks first (block 0 then writes the selection without using it).
        { "SWIGLU routed 8 of 256 + shared", FRT_GEMV_Q4_K, 2048, 128, 256, true, true, true },
        { "SWIGLU routed 8 of 64, dense first", FRT_GEMV_Q4_K, 1024, 96, 64, true, false, true, true },
        { "SWIGLU routed 8 of 256, tied logits", FRT_GEMV_Q4_K, 2048, 128, 256, true, true, true, false, true },
    };
    for (const glu_case & gc : glu_cases) {
        failed += run_glu_case(gc, rng) ? 0 : 1;
        ++total;
    }
    const norm_case norm_cases[] = {
        { "norm q4_K k=2048 (in registers)", FRT_GEMV_Q4_K, 2048, 300 },
        { "norm q8_0 k=1024 (in registers)", FRT_GEMV_Q8_0, 1024, 77 },
        { "norm q6_K k=4096 (in registers)", FRT_GEMV_Q6_K, 4096, 50 },
        { "norm f32 k=2048 (in registers)", FRT_GEMV_F32, 2048, 40 },
        { "norm q4_K k=512 (general)", FRT_GEMV_Q4_K, 512, 90 },
        { "norm q4_K k=1280 (general)", FRT_GEMV_Q4_K, 1280, 33 },
    };
    for (const norm_case & nc : norm_cases) {
        failed += run_norm_case(nc, rng) ? 0 : 1;
        ++total;
    }
    for (bool (*run)(std::mt19937_64 &) : { run_own_input_case, run_guess_case, run_prefetch_case, run_tail_case,
                                               run_trace_case }) {
        failed += run(rng) ? 0 : 1;
        ++total;
    }
    const handoff_case handoff_cases[] = {
        { "handoff: INPROJ-like pack", 2048, false,
          { { FRT_GEMV_Q4_K, 300 }, { FRT_GEMV_Q4_K, 64 }, { FRT_GEMV_Q8_0, 32 }, { FRT_GEMV_Q8_0, 32 } } },
        { "handoff: q/k/v-like, in place", 2048, true, { { FRT_GEMV_Q4_K, 256 }, { FRT_GEMV_Q6_K, 40 } } },
        { "handoff: k=1280 (partial columns)", 1280, false, { { FRT_GEMV_Q4_K, 70 } } },
        { "handoff: k=4096 (its widest)", 4096, false, { { FRT_GEMV_Q4_K, 90 }, { FRT_GEMV_Q8_0, 20 } } },
    };
    for (const handoff_case & hc : handoff_cases) {
        failed += run_handoff_case(hc, rng) ? 0 : 1;
        ++total;
    }
    for (bool (*run)() : { run_refusals, run_handoff_refusals, run_chunk_counters_case }) {
        failed += run() ? 0 : 1;
        ++total;
    }
    std::printf("%d passed, %d failed\n", total - failed, failed);
    return failed ? 1 : 0;
}
