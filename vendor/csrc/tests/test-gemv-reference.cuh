#pragma once

// CPU side of the frt_gemv test and benchmark: random valid GGUF rows, a float64 reference that
// dequantizes them (written from ggml's block formats, independently of the kernel's decoding),
// the kernel's int8 rounding of x reproduced bit for bit, and per-output error bounds derived
// from the computation (gemv_ref::bounds).

#include "gemv.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace gemv_ref {

constexpr double kUnit = 1.0 / 16777216.0;  // 2^-24: float rounding, relative

inline const char * type_name(frt_gemv_type t) {
    static const char * names[] = { "f32", "f16", "bf16", "q4_K", "q5_K", "q6_K", "q8_0", "q6_K_R", "q8_0_R" };
    return t >= 0 && t < FRT_GEMV_TYPE_COUNT ? names[t] : "?";
}

// GGUF block of a type: weights and bytes (the formats of ggml-common.h).
struct block_format {
    int weights, bytes;
};

inline block_format gguf_block(frt_gemv_type t) {
    switch (t) {
        case FRT_GEMV_F32:  return { 1, 4 };
        case FRT_GEMV_F16:
        case FRT_GEMV_BF16: return { 1, 2 };
        case FRT_GEMV_Q4_K: return { 256, 144 };
        case FRT_GEMV_Q5_K: return { 256, 176 };
        case FRT_GEMV_Q6_K: return { 256, 210 };
        case FRT_GEMV_Q8_0: return { 32, 34 };
        default:            return { 0, 0 };
    }
}

inline int64_t gguf_row_bytes(frt_gemv_type t, int k) {
    const block_format b = gguf_block(t);
    return (int64_t) k / b.weights * b.bytes;
}

inline bool quantized(frt_gemv_type t) {
    return t != FRT_GEMV_F32 && t != FRT_GEMV_F16 && t != FRT_GEMV_BF16;
}

inline double half_value(uint16_t h) {
    const int    exponent = (h >> 10) & 31, mantissa = h & 1023;
    const double sign     = h & 0x8000 ? -1.0 : 1.0;
    if (exponent == 0) {
        return sign * std::ldexp((double) mantissa, -24);
    }
    if (exponent == 31) {
        return mantissa ? NAN : sign * INFINITY;
    }
    return sign * std::ldexp((double) (1024 + mantissa), exponent - 25);
}

// A finite normal half of magnitude in [2^lo, 2^(hi+1)), random mantissa, negative too when asked.
inline uint16_t random_half(std::mt19937_64 & rng, int lo, int hi, bool negative) {
    const int      exponent = lo + (int) (rng() % (uint64_t) (hi - lo + 1));
    const uint16_t bits     = (uint16_t) (((exponent + 15) << 10) | (rng() & 1023));
    return negative && (rng() & 1) ? (uint16_t) (bits | 0x8000) : bits;
}

inline void put16(uint8_t * p, uint16_t v) {
    std::memcpy(p, &v, 2);
}

inline uint16_t get16(const uint8_t * p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// One GGUF row of k weights: every quant, scale and min byte uniformly random (all bit patterns
// are valid), half scales finite and normal.
inline void random_row(frt_gemv_type t, int k, uint8_t * row, std::mt19937_64 & rng) {
    const int64_t bytes = gguf_row_bytes(t, k);
    for (int64_t i = 0; i < bytes; i += 8) {  // 8 uniform bytes a draw (the expert cases fill GBs)
        const uint64_t r = rng();
        std::memcpy(row + i, &r, (size_t) std::min<int64_t>(8, bytes - i));
    }
    std::normal_distribution<float> normal(0.0f, 1.0f);
    switch (t) {
        case FRT_GEMV_F32:
            for (int i = 0; i < k; ++i) {
                const float v = normal(rng);
                std::memcpy(row + 4 * i, &v, 4);
            }
            break;
        case FRT_GEMV_F16:
            for (int i = 0; i < k; ++i) {
                put16(row + 2 * i, random_half(rng, -6, 0, true));
            }
            break;
        case FRT_GEMV_BF16:
            for (int i = 0; i < k; ++i) {
                const uint32_t exponent = 121 + (uint32_t) (rng() % 7);  // 2^-6 .. 2^1
                put16(row + 2 * i, (uint16_t) ((rng() & 1) << 15 | exponent << 7 | (rng() & 127)));
            }
            break;
        case FRT_GEMV_Q4_K:
        case FRT_GEMV_Q5_K:
            for (int b = 0; b < k / 256; ++b) {
                uint8_t * blk = row + b * gguf_block(t).bytes;
                put16(blk, random_half(rng, -8, -5, false));      // d
                put16(blk + 2, random_half(rng, -9, -6, false));  // dmin
            }
            break;
        case FRT_GEMV_Q6_K:
            for (int b = 0; b < k / 256; ++b) {
                put16(row + b * 210 + 208, random_half(rng, -10, -7, true));
            }
            break;
        case FRT_GEMV_Q8_0:
            for (int b = 0; b < k / 32; ++b) {
                put16(row + b * 34, random_half(rng, -9, -6, true));
            }
            break;
        default: break;
    }
}

// Scale and min (6 bits each) of sub-block j of a Q4_K/Q5_K block, from its 12 packed bytes.
inline void k_scale_min(const uint8_t * s, int j, int & scale, int & min) {
    if (j < 4) {
        scale = s[j] & 63;
        min   = s[j + 4] & 63;
    } else {
        scale = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        min   = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

// A GGUF row as float64 weights w, and per weight the magnitude a that bounds its rounding
// error terms: |w| for single-term weights, |scale part| + |min part| for Q4_K/Q5_K (the kernel
// multiplies the two parts separately).
inline void dequantize_row(frt_gemv_type t, int k, const uint8_t * row, double * w, double * a) {
    switch (t) {
        case FRT_GEMV_F32:
            for (int i = 0; i < k; ++i) {
                float v;
                std::memcpy(&v, row + 4 * i, 4);
                w[i] = v;
            }
            break;
        case FRT_GEMV_F16:
            for (int i = 0; i < k; ++i) {
                w[i] = half_value(get16(row + 2 * i));
            }
            break;
        case FRT_GEMV_BF16:
            for (int i = 0; i < k; ++i) {
                const uint32_t bits = (uint32_t) get16(row + 2 * i) << 16;
                float          v;
                std::memcpy(&v, &bits, 4);
                w[i] = v;
            }
            break;
        case FRT_GEMV_Q4_K:
        case FRT_GEMV_Q5_K:
            for (int b = 0; b < k / 256; ++b) {
                const bool      q5   = t == FRT_GEMV_Q5_K;
                const uint8_t * blk  = row + b * (q5 ? 176 : 144);
                const double    d    = half_value(get16(blk)), dmin = half_value(get16(blk + 2));
                const uint8_t * qh   = blk + 16;
                const uint8_t * qs   = blk + (q5 ? 48 : 16);
                for (int j = 0; j < 8; ++j) {  // sub-blocks of 32
                    int scale, min;
                    k_scale_min(blk + 4, j, scale, min);
                    for (int l = 0; l < 32; ++l) {
                        const uint8_t byte = qs[32 * (j / 2) + l];
                        int           q    = j % 2 ? byte >> 4 : byte & 15;
                        if (q5) {
                            q += (qh[l] >> j & 1) * 16;
                        }
                        const int i = 256 * b + 32 * j + l;
                        w[i]        = d * scale * q - dmin * min;
                        a[i]        = std::fabs(d * scale * q) + std::fabs(dmin * min);
                    }
                }
            }
            return;
        case FRT_GEMV_Q6_K:
            for (int b = 0; b < k / 256; ++b) {
                const uint8_t * blk = row + 210 * b;
                const double    d   = half_value(get16(blk + 208));
                for (int half = 0; half < 2; ++half) {
                    const uint8_t * ql = blk + 64 * half;
                    const uint8_t * qh = blk + 128 + 32 * half;
                    const int8_t *  sc = (const int8_t *) (blk + 192) + 8 * half;
                    for (int l = 0; l < 32; ++l) {
                        const int q[4] = { (ql[l] & 15) | (qh[l] & 3) << 4, (ql[l + 32] & 15) | (qh[l] >> 2 & 3) << 4,
                                           ql[l] >> 4 | (qh[l] >> 4 & 3) << 4, ql[l + 32] >> 4 | (qh[l] >> 6 & 3) << 4 };
                        for (int m = 0; m < 4; ++m) {  // weights l, l + 32, l + 64, l + 96 of the half
                            const int i = 256 * b + 128 * half + 32 * m + l;
                            w[i]        = d * sc[2 * m + l / 16] * (q[m] - 32);
                        }
                    }
                }
            }
            break;
        case FRT_GEMV_Q8_0:
            for (int b = 0; b < k / 32; ++b) {
                const double d = half_value(get16(row + 34 * b));
                for (int l = 0; l < 32; ++l) {
                    w[32 * b + l] = d * (int8_t) row[34 * b + 2 + l];
                }
            }
            break;
        default: break;
    }
    for (int i = 0; i < k; ++i) {
        a[i] = std::fabs(w[i]);
    }
}

// The repacked row frt_gemv_repack writes (gemv.cuh's layout), for a byte-for-byte check.
inline std::vector<uint8_t> repack_row(frt_gemv_type t, int k, const uint8_t * row) {
    std::vector<uint8_t> out((size_t) frt_gemv_row_bytes(frt_gemv_repacked_type(t), k), 0);
    if (t == FRT_GEMV_Q6_K) {
        const int nb = k / 256;
        for (int b = 0; b < nb; ++b) {
            const uint8_t * blk = row + 210 * b;
            std::memcpy(&out[208 * b], blk, 192);
            for (int h = 0; h < 2; ++h) {
                for (int j = 0; j < 4; ++j) {
                    out[208 * b + 192 + 2 * (4 * h + j)]     = blk[192 + 8 * h + j];
                    out[208 * b + 192 + 2 * (4 * h + j) + 1] = blk[192 + 8 * h + j + 4];
                }
            }
            std::memcpy(&out[208 * nb + 2 * b], blk + 208, 2);
        }
    } else {
        const int nb = k / 32;
        for (int b = 0; b < nb; ++b) {
            std::memcpy(&out[32 * b], row + 34 * b + 2, 32);
            std::memcpy(&out[32 * nb + 2 * b], row + 34 * b, 2);
        }
    }
    return out;
}

// x / rms(x) * norm in float64: rms = sqrt(mean(x^2) + eps).
inline std::vector<double> rms_normed(const float * x, const float * norm, int k, float eps) {
    double ss = 0.0;
    for (int i = 0; i < k; ++i) {
        ss += (double) x[i] * x[i];
    }
    const double         scale = 1.0 / std::sqrt(ss / k + eps);
    std::vector<double>  out(k);
    for (int i = 0; i < k; ++i) {
        out[i] = x[i] * scale * norm[i];
    }
    return out;
}

// The relative error of the kernel's RMS-normed x against rms_normed: the sum of squares is
// k / 1024 sequential float additions a thread, then a 5-level warp tree and 8 warp partials in
// turn (at most k / 1024 + 17 roundings of positive terms), then the division by k and + eps (2),
// rsqrtf (2 ulp = 4 units), whose square root halves the error before it; then x * scale * norm
// (2). Doubled for margin.
inline double norm_error(int k) {
    return 2.0 * ((k / 1024.0 + 19.0) / 2.0 + 4.0 + 2.0) * kUnit;
}

// v rounded to the nearest half (ties to even), as a float scale is stored in a half: normal halves
// keep 11 significant bits, subnormal ones are multiples of 2^-24. |v| stays below 65504 here.
inline double to_half(double v) {
    if (v == 0.0) {
        return 0.0;
    }
    int exponent;
    std::frexp(v, &exponent);  // |v| in [2^(exponent-1), 2^exponent)
    const int    e       = std::max(exponent - 1, -14);
    const double spacing = std::ldexp(1.0, e - 10);
    return std::nearbyint(v / spacing) * spacing;
}

// An input vector as the kernel rounds it to int8, which is how stock's quantize_q8_1 does: per
// 32 values d = max|x| / 127 in float, q = round(x / d) (halves away from zero), and d stored as a
// half; xhat = half(d) q. The kernel's divisions are correctly rounded in a plain build and within
// 2 ulp under -use_fast_math (the overlay's flags), so x / d may land on the other side of a
// half-integer where it is within `band` of one (those values are marked: flip), and the half
// scale may be the neighbour of the reference's where d is that close to a rounding boundary of
// halves (d_rel: the relative step to that neighbour, else 0). With the norm the kernel's x also
// differs from the float64 normed x by at most norm_error(k) relatively, which widens both.
struct rounded {
    std::vector<double> xhat;   // the rounded values
    std::vector<double> d;      // per 32-block: the half scale of xhat
    std::vector<double> d_raw;  // per 32-block: the scale before its rounding to half
    std::vector<double> d_rel;  // per 32-block: how far the kernel's half scale may be, relatively
    std::vector<char>   flip;   // may differ by one step d from the kernel's
};

// Rounds x (k values, in double) as described above; delta: the kernel's relative error in x.
inline rounded round_like_kernel(const std::vector<double> & x, int k, double delta) {
    rounded r{ std::vector<double>(k), std::vector<double>(k / 32), std::vector<double>(k / 32),
               std::vector<double>(k / 32, 0.0), std::vector<char>(k, 0) };
    // x / d: the division's 2 ulp, d's own 2 ulp, delta in x and in d; doubled for margin.
    const double rel  = 2.0 * (2.0 * delta + 8.0 * kUnit);
    const double band = 127.0 * rel;
    for (int b = 0; b < k / 32; ++b) {
        double amax = 0.0;
        for (int i = 32 * b; i < 32 * b + 32; ++i) {
            amax = std::max(amax, std::fabs(x[i]));
        }
        // Without the norm x and amax are floats and these two are the correctly rounded results.
        const double d  = delta > 0.0 ? amax / 127.0 : (double) ((float) amax / 127.0f);
        const double dh = to_half(d);
        r.d[b]          = dh;
        r.d_raw[b]      = d;
        if (dh > 0.0) {
            const double lo = to_half(d * (1.0 - rel)), hi = to_half(d * (1.0 + rel));
            r.d_rel[b]      = std::max(std::fabs(lo - dh), std::fabs(hi - dh)) / dh;
        }
        for (int i = 32 * b; i < 32 * b + 32; ++i) {
            const double v = amax > 0.0 ? (delta > 0.0 ? x[i] / d : (double) ((float) x[i] / (float) d)) : 0.0;
            const double a = std::fabs(v);
            r.xhat[i]      = dh * std::copysign(std::floor(a + 0.5), v);
            r.flip[i]      = std::fabs(a - std::floor(a) - 0.5) <= band;
        }
    }
    return r;
}

inline rounded round_like_kernel(const float * x, int k) {
    return round_like_kernel(std::vector<double>(x, x + k), k, 0.0);
}

// One output: the reference values and their error bounds.
struct output {
    double sharp;      // sum w * xhat: what the kernel computes, up to float rounding
    double exact;      // sum w * x: the matvec without rounding x to int8
    double tol_sharp;  // bound on |kernel - sharp|
    double tol_exact;  // bound on |kernel - exact|
};

// w, a: a dequantized row and its magnitudes (dequantize_row); x: the float64 input (normed when
// the launch norms); r: the kernel's rounding of it (quantized weights); delta: norm_error(k)
// with the norm, else 0.
//
// Float rounding in the kernel: every product of a weight (or a 16-value integer dot product
// times its scales) takes at most 4 roundings, then at most k / 32 sequential additions a lane,
// the 5-level lane tree, 8 split slices and 5 scan levels with the carry of the staged path: at
// most k / 32 + 32 roundings on any term's path, each of relative size 2^-24, of terms bounded by
// a |xhat| (the standard gamma_n bound, with 1% for n u > 0). Rounding x to int8 moves each value
// by at most d_raw/2 of its block, and the scale's rounding to half by |q| |d - d_raw| (tol_exact).
// The kernel's half scale may be the neighbour (d_rel) and flipped values differ by one step d;
// with the norm the kernel's x differs by delta relatively and its scales d by 2 delta + 3 units.
inline output reference(frt_gemv_type t, int k, const double * w, const double * a, const std::vector<double> & x,
                        const rounded * r, double delta) {
    double sharp = 0.0, exact = 0.0, abs_sharp = 0.0, abs_exact = 0.0, quant = 0.0, flips = 0.0, scaled = 0.0;
    for (int i = 0; i < k; ++i) {
        const double xs = r ? r->xhat[i] : x[i];
        sharp += w[i] * xs;
        exact += w[i] * x[i];
        abs_sharp += a[i] * std::fabs(xs);
        abs_exact += a[i] * std::fabs(x[i]);
        if (r) {
            const int    b    = i / 32;
            const double step = r->d[b] * (1.0 + r->d_rel[b]);
            // x to d_raw q: half a step; d_raw q to d q: the scale's rounding to half, |q| times.
            quant += a[i] * (r->d_raw[b] / 2.0 + std::fabs(r->d[b] - r->d_raw[b]) * std::fabs(xs) / r->d[b]);
            flips += r->flip[i] ? a[i] * step : 0.0;
            scaled += a[i] * std::fabs(xs) * r->d_rel[b];
        }
    }
    const double fp = (k / 32.0 + 32.0) * kUnit * 1.01 * std::max(abs_sharp, abs_exact);
    const double dd = 2.0 * delta + 3.0 * kUnit;  // relative error of the kernel's block scales
    output       o;
    o.sharp     = sharp;
    o.exact     = exact;
    o.tol_sharp = fp + (quantized(t) ? (delta > 0.0 ? dd * abs_sharp : 0.0) + scaled + (1.0 + dd) * flips
                                     : delta * abs_exact);
    o.tol_exact = fp + (quantized(t) ? (1.0 + dd) * quant : 0.0) + delta * abs_exact;
    return o;
}

// ---- ggml-cuda's mmvq for one token, operation by operation (the exact kernel's bit check) ----
//
// What the exact kernel must equal bit for bit, written from mmvq's arithmetic as ggml-cuda's
// sm_90a build runs it (its SASS: the products of an item fused into its sums as below). Valid in
// a build without -use_fast_math, where x / d and max|x| / 127 are correctly rounded and the host
// can repeat them (under fast math the divisions are approximate); float operations only, each
// fused multiply-add written as std::fma so that the host compiler cannot choose otherwise.

// x as quantize_q8_1 rounds it: per 32 values d = max|x| / 127, q = round(x / d) (halves away from
// zero), d kept as a half.
struct stock_x {
    std::vector<int8_t> q;
    std::vector<float>  d;  // per 32-block, the half as float
};

inline stock_x stock_quantize(const float * x, int k) {
    stock_x r{ std::vector<int8_t>(k), std::vector<float>(k / 32) };
    for (int b = 0; b < k / 32; ++b) {
        float amax = 0.0f;
        for (int i = 32 * b; i < 32 * b + 32; ++i) {
            amax = std::max(amax, std::fabs(x[i]));
        }
        const float d = amax / 127.0f;
        for (int i = 32 * b; i < 32 * b + 32; ++i) {
            r.q[i] = amax == 0.0f ? 0 : (int8_t) std::round(x[i] / d);
        }
        r.d[b] = (float) to_half(d);
    }
    return r;
}

inline int32_t load32(const void * p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// __dp4a(a, b, c) on signed bytes, and __vsub4 (bytewise, wrapping).
inline int32_t dp4a(int32_t a, int32_t b, int32_t c) {
    for (int j = 0; j < 4; ++j) {
        c += (int8_t) (a >> (8 * j)) * (int8_t) (b >> (8 * j));
    }
    return c;
}

inline int32_t vsub4(int32_t a, int32_t b) {
    uint32_t r = 0;
    for (int j = 0; j < 4; ++j) {
        r |= (uint32_t) (((a >> (8 * j)) - (b >> (8 * j))) & 0xff) << (8 * j);
    }
    return (int32_t) r;
}

// warp_reduce_sum's butterfly over 32 lanes (xor 16, 8, 4, 2, 1); every lane ends with the sum.
inline void butterfly32(float * lane) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        float next[32];
        for (int l = 0; l < 32; ++l) {
            next[l] = lane[l] + lane[l ^ offset];
        }
        std::memcpy(lane, next, sizeof next);
    }
}

// Item (kbx, iqs) of a row added to a thread's sum acc, as mmvq's vec_dot and its `tmp +=` do.
inline float mmvq_add_item(frt_gemv_type t, const uint8_t * row, int kbx, int iqs, const stock_x & x, float acc) {
    const auto xq = [&](int b, int i) { return load32(&x.q[32 * b + 4 * i]); };
    if (t == FRT_GEMV_Q4_K) {
        const uint8_t * blk        = row + 144 * kbx;
        const int       bq8_offset = 2 * ((iqs / 2) / 4), r = (iqs / 2) % 4;
        const int32_t   v0 = load32(blk + 16 + 16 * bq8_offset + 4 * r), v1 = load32(blk + 32 + 16 * bq8_offset + 4 * r);
        float           sumf_d = 0.0f, sumf_m = 0.0f;
        for (int i = 0; i < 2; ++i) {
            int sc, m;
            k_scale_min(blk + 4, bq8_offset + i, sc, m);
            const int     b    = 8 * kbx + bq8_offset + i;
            const int32_t v0i  = (v0 >> (4 * i)) & 0x0F0F0F0F, v1i = (v1 >> (4 * i)) & 0x0F0F0F0F;
            const int32_t dot1 = dp4a(v1i, xq(b, r + 4), dp4a(v0i, xq(b, r), 0));
            const int32_t dot2 = dp4a(0x01010101, xq(b, r + 4), dp4a(0x01010101, xq(b, r), 0));
            sumf_d = std::fma(x.d[b], (float) (dot1 * sc), sumf_d);
            sumf_m = std::fma(x.d[b], (float) (dot2 * m), sumf_m);
        }
        const float d = (float) half_value(get16(blk)), dmin = (float) half_value(get16(blk + 2));
        const float dmin_m = dmin * sumf_m;
        return acc + std::fma(d, sumf_d, -dmin_m);
    }
    if (t == FRT_GEMV_Q6_K) {
        const uint8_t * blk          = row + 210 * kbx;
        const int       bq8_offset   = 4 * (iqs / 16) + (iqs % 16) / 8;
        const int       scale_offset = 8 * (iqs / 16) + (iqs % 16) / 4;
        const int       vh_shift     = 2 * ((iqs % 16) / 8);
        const int32_t   vl           = load32(blk + 4 * iqs);
        const int32_t   vh           = load32(blk + 128 + 4 * (8 * (iqs / 16) + iqs % 8)) >> vh_shift;
        float           sumf         = 0.0f;
        for (int i = 0; i < 2; ++i) {
            const int     sc  = (int8_t) blk[192 + scale_offset + 4 * i];
            const int     b   = 8 * kbx + bq8_offset + 2 * i;
            const int32_t vil = (vl >> (4 * i)) & 0x0F0F0F0F;
            const int32_t vih = (int32_t) ((uint32_t) (vh >> (4 * i)) << 4) & 0x30303030;
            const int32_t vi  = vsub4(vil | vih, 0x20202020);
            sumf = std::fma(x.d[b], (float) (dp4a(vi, xq(b, iqs % 8), 0) * sc), sumf);
        }
        return std::fma(sumf, (float) half_value(get16(blk + 208)), acc);
    }
    // Q8_0
    const uint8_t * blk  = row + 34 * kbx;
    int32_t         sumi = 0;
    for (int i = 0; i < 2; ++i) {
        sumi = dp4a(load32(blk + 2 + 4 * (iqs + i)), xq(kbx, iqs + i), sumi);
    }
    const float d01 = (float) half_value(get16(blk)) * x.d[kbx];
    return std::fma(d01, (float) sumi, acc);
}

// A row of k columns as mmvq sums it for one token: 4 warps of 32 threads, thread t adding items
// t, t + 128, ... (per_block threads a block, per_iter blocks a pass), warp 0 adding warps 1..3
// lane by lane, then the butterfly over the lanes.
inline float mmvq_row(frt_gemv_type t, int k, const uint8_t * row, const stock_x & x) {
    const int per_block = t == FRT_GEMV_Q4_K ? 16 : t == FRT_GEMV_Q6_K ? 32 : 4;
    const int per_iter  = t == FRT_GEMV_Q4_K ? 8 : t == FRT_GEMV_Q6_K ? 4 : 32;
    const int nb        = k / (t == FRT_GEMV_Q8_0 ? 32 : 256);
    float     thread[128];
    for (int th = 0; th < 128; ++th) {
        const int iqs = t == FRT_GEMV_Q6_K ? th % per_block : 2 * (th % per_block);
        float     acc = 0.0f;
        for (int kbx = th / per_block; kbx < nb; kbx += per_iter) {
            acc = mmvq_add_item(t, row, kbx, iqs, x, acc);
        }
        thread[th] = acc;
    }
    float lane[32];
    for (int l = 0; l < 32; ++l) {
        lane[l] = thread[l];
        for (int w = 1; w < 4; ++w) {
            lane[l] += thread[32 * w + l];
        }
    }
    butterfly32(lane);
    return lane[0];
}

// An F32 row as mmvf sums it for one token: a block of B threads (the smallest B of 32, 64, ...
// 256 with the fewest passes over the k / 2 float pairs), thread t adding w * x of pairs t, t + B,
// ... (x, then y, fused), a butterfly in each warp, then the warps' sums (zeros up to 32 lanes) in
// one more butterfly when B > 32.
inline float mmvf_row(int k, const float * w, const float * x) {
    int block = 32;
    for (int b = 64, best = (k + 63) / 64; b <= 256; b += 32) {
        const int passes = (k + 2 * b - 1) / (2 * b);
        if (passes < best) {
            best  = passes;
            block = b;
        }
    }
    float warp_sums[32] = {};
    for (int wp = 0; wp < block / 32; ++wp) {
        float lane[32];
        for (int l = 0; l < 32; ++l) {
            float acc = 0.0f;
            for (int c = 32 * wp + l; c < k / 2; c += block) {
                acc = std::fma(w[2 * c], x[2 * c], acc);
                acc = std::fma(w[2 * c + 1], x[2 * c + 1], acc);
            }
            lane[l] = acc;
        }
        butterfly32(lane);
        warp_sums[wp] = lane[0];
    }
    if (block == 32) {
        return warp_sums[0];
    }
    butterfly32(warp_sums);
    return warp_sums[0];
}

}  // namespace gemv_ref
