#!/usr/bin/env python3
"""A CPU model of the bulk GEMV kernel's tensor-core paths (vendor/csrc/gemv-bulk.cu).

    python3 vendor/csrc/tests/gemv-mma-model.py [seed]      (needs numpy; no GPU)

Rebuilds, lane by lane, the A and B fragments that bulk_k_mma_rows (Q4_K, Q5_K),
bulk_q6k_mma_rows (Q6_K GGUF and repacked) and bulk_q8_mma_rows (Q8_0 GGUF and repacked) give
mma.m16n8k32 / m16n8k16 (PTX's fragment layout: lane t holds A rows t/4 and t/4 + 8 at k = 4 (t %
4) .. + 3 (and + 16), B column t/4 at the same k, D rows t/4 and t/4 + 8 at column 2 (t % 4)),
with the same byte offsets, pitches, nibble and bit selection, and the same scale arithmetic, and
compares every row with a float64 dequantize-and-dot of random GGUF rows. It checks the index
arithmetic where the GPU test (test-gemv) would only say that a row is wrong; the kernel's own
numerics are test-gemv's. Exits 1 when a model's relative error exceeds 1e-12.
"""

import struct
import sys

import numpy as np

rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 1)


def lds4(buf, p):
    """4 bytes at a 2-byte aligned offset, as the kernel reads them (two words and a shift)."""
    aligned = p & ~3
    w0, w1 = struct.unpack_from("<2I", buf, aligned)
    shift = 8 * (p & 3)
    return ((w0 >> shift) | (w1 << (32 - shift))) & 0xFFFFFFFF if shift else w0


def unpack4(word):
    return [(word >> (8 * i)) & 0xFF for i in range(4)]


def s8(v):
    return v - 256 if v > 127 else v


def half(buf, at):
    return float(np.frombuffer(bytes(buf[at:at + 2]), dtype=np.float16)[0])


def pitch_of(row_bytes):
    """bulk plan: rows of a multiple of 16 bytes go to 16 past a multiple of 128."""
    return row_bytes + (144 - row_bytes % 128) % 128 if row_bytes % 16 == 0 else row_bytes


def layout(rows_bytes, pitch):
    buf = bytearray()
    for row in rows_bytes:
        buf += row.ljust(pitch, b"\0")
    return buf + bytearray(8)


def mma(frags_a, frags_b, k):
    """D column 0 of a 16 x k by k x 8 product from per-lane fragments (dicts keyed by lane)."""
    a = np.zeros((16, k), dtype=np.int64)
    b = np.zeros((k, 8), dtype=np.int64)
    for lane in range(32):
        g, tig = lane >> 2, lane & 3
        regs = frags_a[lane]
        for reg, (row, col) in enumerate([(g, 4 * tig), (g + 8, 4 * tig), (g, 16 + 4 * tig), (g + 8, 16 + 4 * tig)][: len(regs)]):
            a[row, col:col + 4] = unpack4(regs[reg])
        for reg, col in enumerate([4 * tig, 16 + 4 * tig][: len(frags_b[lane])]):
            b[col:col + 4, g] = [s8(v) for v in unpack4(frags_b[lane][reg])]
    a = np.where(a > 127, a - 256, a) if frags_a.get("signed") else a
    return (a @ b)[:, 0]


# ---- Q4_K / Q5_K ----

def k_scales(q, j):
    """ggml's get_scale_min_k4."""
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def k_scales_pair(head, c):
    """gemv_k4_scales: scales and mins of sub-blocks 2c, 2c + 1 as byte pairs."""
    y, z, w = head[1], head[2], head[3]
    sh = 16 * (c & 1)
    y2, z2, w2 = (y >> sh) & 0xFFFF, (z >> sh) & 0xFFFF, (w >> sh) & 0xFFFF
    if c >= 2:
        return (w2 & 0x0F0F) | ((y2 >> 2) & 0x3030), ((w2 >> 4) & 0x0F0F) | ((z2 >> 2) & 0x3030)
    return y2 & 0x3F3F, z2 & 0x3F3F


def random_k_block(q5):
    b = bytearray(np.array([rng.normal() * 0.01, rng.normal() * 0.01], dtype=np.float16).tobytes())
    sc, mn = rng.integers(0, 64, 8), rng.integers(0, 64, 8)
    packed = bytearray(12)
    for j in range(4):
        packed[j] = sc[j] & 63 | ((sc[j + 4] >> 4) << 6)
        packed[j + 4] = mn[j] & 63 | ((mn[j + 4] >> 4) << 6)
        packed[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4)
    b += packed
    if q5:
        b += bytes(rng.integers(0, 256, 32, dtype=np.uint8))
    return bytes(b + bytes(rng.integers(0, 256, 128, dtype=np.uint8)))


def k_dequant(block, q5):
    d, dmin = np.frombuffer(block[:4], dtype=np.float16).astype(float)
    qs = np.frombuffer(block[48:] if q5 else block[16:], dtype=np.uint8)
    qh = np.frombuffer(block[16:48], dtype=np.uint8) if q5 else None
    out = np.zeros(256)
    for j in range(8):
        sc, mn = k_scales(block[4:16], j)
        c = j // 2
        q = (qs[32 * c:32 * c + 32] & 15) if j % 2 == 0 else (qs[32 * c:32 * c + 32] >> 4)
        if q5:
            q = q + 16 * ((qh >> j) & 1)
        out[32 * j:32 * j + 32] = d * sc * q - dmin * mn
    return out


def model_k(k, rows, q5):
    nb, blk_bytes, qs_at = k // 256, (176 if q5 else 144), (48 if q5 else 16)
    blocks = [[random_k_block(q5) for _ in range(nb)] for _ in range(rows)]
    pitch = pitch_of(blk_bytes * nb)
    buf = layout([b"".join(r) for r in blocks], pitch)
    x, xs = rng.integers(-127, 128, k), rng.random(k // 32)
    ref = np.array([(np.concatenate([k_dequant(b, q5) for b in r]) * x * np.repeat(xs, 32)).sum() for r in blocks])
    xq = bytes(int(v) & 0xFF for v in x)
    got = np.zeros(rows)
    for tile in range((rows + 15) // 16):
        for blk in range(nb):
            for cc in range(4):
                fe, fo, be, bo = {}, {}, {}, {}
                for lane in range(32):
                    g, tig = lane >> 2, lane & 3
                    words = []
                    for r in (16 * tile + g, 16 * tile + g + 8):
                        base = (r if r < rows else 0) * pitch + blk_bytes * blk
                        ok = r < rows
                        w0 = lds4(buf, base + qs_at + 32 * cc + 4 * tig) if ok else 0
                        w1 = lds4(buf, base + qs_at + 32 * cc + 4 * tig + 16) if ok else 0
                        h0 = lds4(buf, base + 16 + 4 * tig) if ok and q5 else 0
                        h1 = lds4(buf, base + 32 + 4 * tig) if ok and q5 else 0
                        words.append((w0, w1, h0, h1))
                    (l0, l1, lh0, lh1), (h0w, h1w, hh0, hh1) = words
                    regs = [(l0, lh0), (h0w, hh0), (l1, lh1), (h1w, hh1)]
                    fe[lane] = [(w & 0x0F0F0F0F) | (((h >> (2 * cc)) & 0x01010101) << 4) for w, h in regs]
                    fo[lane] = [((w >> 4) & 0x0F0F0F0F) | (((h >> (2 * cc + 1)) & 0x01010101) << 4) for w, h in regs]
                    xoff = 256 * blk + 64 * cc + 4 * tig
                    be[lane] = [struct.unpack_from("<I", xq, xoff)[0], struct.unpack_from("<I", xq, xoff + 16)[0]] if g == 0 else [0, 0]
                    bo[lane] = [struct.unpack_from("<I", xq, xoff + 32)[0], struct.unpack_from("<I", xq, xoff + 48)[0]] if g == 0 else [0, 0]
                de, do = mma(fe, be, 32), mma(fo, bo, 32)
                j0 = 8 * blk + 2 * cc
                se, so = x[32 * j0:32 * j0 + 32].sum(), x[32 * j0 + 32:32 * j0 + 64].sum()
                for rr in range(16):
                    r = 16 * tile + rr
                    if r >= rows:
                        continue
                    base = r * pitch + blk_bytes * blk
                    sc2, m2 = k_scales_pair(struct.unpack_from("<4I", buf, base), cc)
                    d, dmin = half(buf, base), half(buf, base + 2)
                    got[r] += xs[j0] * (d * (sc2 & 0xFF) * de[rr] - dmin * (m2 & 0xFF) * se) + \
                        xs[j0 + 1] * (d * ((sc2 >> 8) & 0xFF) * do[rr] - dmin * ((m2 >> 8) & 0xFF) * so)
    return np.max(np.abs(got - ref)) / np.max(np.abs(ref))


# ---- Q6_K ----

def q6_scale_at(n):
    """Where repacked Q6_K (FRT_GEMV_Q6_K_R) puts GGUF scale n."""
    return 2 * ((n >> 3) * 4 + (n & 3)) + ((n >> 2) & 1)


def q6_dequant(block):
    ql, qh = block[:128], block[128:192]
    sc = np.frombuffer(block[192:208], dtype=np.int8)
    d = float(np.frombuffer(block[208:210], dtype=np.float16)[0])
    y = np.zeros(256)
    for h in range(2):
        for l in range(32):
            s = 8 * h + l // 16
            q = [(ql[64 * h + l] & 15) | ((qh[32 * h + l] & 3) << 4), (ql[64 * h + l + 32] & 15) | (((qh[32 * h + l] >> 2) & 3) << 4),
                 (ql[64 * h + l] >> 4) | (((qh[32 * h + l] >> 4) & 3) << 4), (ql[64 * h + l + 32] >> 4) | (((qh[32 * h + l] >> 6) & 3) << 4)]
            for j in range(4):
                y[128 * h + 32 * j + l] = d * sc[s + 2 * j] * (q[j] - 32)
    return y


def model_q6(k, rows, repacked):
    nb = k // 256
    blocks = [[bytes(rng.integers(0, 256, 192, dtype=np.uint8)) + rng.integers(-128, 128, 16).astype(np.int8).tobytes() +
               np.float16(rng.normal() * 0.01).tobytes() for _ in range(nb)] for _ in range(rows)]
    if repacked:
        row_bytes, blk_bytes = 208 * nb + (2 * nb + 15) // 16 * 16, 208

        def row_of(bl):
            out = b""
            for b in bl:
                re = bytearray(16)
                for n in range(16):
                    re[q6_scale_at(n)] = b[192 + n]
                out += b[:192] + bytes(re)
            return (out + b"".join(b[208:210] for b in bl)).ljust(row_bytes, b"\0")
    else:
        row_bytes, blk_bytes = 210 * nb, 210

        def row_of(bl):
            return b"".join(bl)
    pitch = pitch_of(row_bytes)
    buf = layout([row_of(r) for r in blocks], pitch)
    x, xs = rng.integers(-127, 128, k), rng.random(k // 32)
    ref = np.array([(np.concatenate([q6_dequant(bytearray(b)) for b in r]) * x * np.repeat(xs, 32)).sum() for r in blocks])
    xq = bytes(int(v) & 0xFF for v in x)
    got = np.zeros(rows)
    for tile in range((rows + 15) // 16):
        for blk in range(nb):
            for h in range(2):
                for sg in range(2):
                    for j in range(4):
                        fa, fb = {}, {}
                        for lane in range(32):
                            g, tig = lane >> 2, lane & 3
                            regs = []
                            for r in (16 * tile + g, 16 * tile + g + 8):
                                ok = r < rows
                                base = (r if ok else 0) * pitch + blk_bytes * blk
                                ql = lds4(buf, base + 64 * h + 32 * (j & 1) + 16 * sg + 4 * tig) if ok else 0
                                qh = lds4(buf, base + 128 + 32 * h + 16 * sg + 4 * tig) if ok else 0
                                regs.append(((ql >> (4 * (j >> 1))) & 0x0F0F0F0F) | (((qh >> (2 * j)) & 0x03030303) << 4))
                            fa[lane] = regs
                            xoff = 256 * blk + 128 * h + 32 * j + 16 * sg
                            fb[lane] = [struct.unpack_from("<I", xq, xoff + 4 * tig)[0] if g == 0 else 0]
                        dd = mma(fa, fb, 16)
                        xoff = 256 * blk + 128 * h + 32 * j + 16 * sg
                        xsum, n = x[xoff:xoff + 16].sum(), 8 * h + sg + 2 * j
                        for rr in range(16):
                            r = 16 * tile + rr
                            if r >= rows:
                                continue
                            row = r * pitch
                            d = half(buf, row + 208 * nb + 2 * blk) if repacked else half(buf, row + 210 * blk + 208)
                            sc = s8(buf[row + blk_bytes * blk + 192 + (q6_scale_at(n) if repacked else n)])
                            got[r] += xs[xoff // 32] * d * sc * (dd[rr] - 32 * xsum)
    return np.max(np.abs(got - ref)) / np.max(np.abs(ref))


# ---- Q8_0 ----

def model_q8(k, rows, repacked):
    nb, nq = k // 256, k // 32
    qs = rng.integers(-128, 128, (rows, nq, 32))
    d = rng.normal(size=(rows, nq)).astype(np.float16)
    if repacked:
        row_bytes = k + (k // 16 + 15) // 16 * 16
        rows_b = [(qs[r].astype(np.int8).tobytes() + d[r].tobytes()).ljust(row_bytes, b"\0") for r in range(rows)]
    else:
        row_bytes = 34 * nq
        rows_b = [b"".join(d[r][f].tobytes() + qs[r][f].astype(np.int8).tobytes() for f in range(nq)) for r in range(rows)]
    pitch = pitch_of(row_bytes)
    buf = layout(rows_b, pitch)
    x, xs = rng.integers(-127, 128, k), rng.random(nq)
    ref = np.array([sum(float(d[r][f]) * xs[f] * (qs[r][f] * x[32 * f:32 * f + 32]).sum() for f in range(nq)) for r in range(rows)])
    xq = bytes(int(v) & 0xFF for v in x)
    got = np.zeros(rows)
    for tile in range((rows + 15) // 16):
        for f in range(8 * nb):
            fa, fb = {"signed": True}, {}
            for lane in range(32):
                g, tig = lane >> 2, lane & 3
                regs = []
                for off in (4 * tig, 16 + 4 * tig):
                    for r in (16 * tile + g, 16 * tile + g + 8):
                        ok = r < rows
                        base = (r if ok else 0) * pitch + (32 * f if repacked else 34 * f + 2)
                        regs.append(lds4(buf, base + off) if ok else 0)
                fa[lane] = [regs[0], regs[1], regs[2], regs[3]]
                fb[lane] = [struct.unpack_from("<I", xq, 32 * f + 4 * tig)[0], struct.unpack_from("<I", xq, 32 * f + 16 + 4 * tig)[0]] if g == 0 else [0, 0]
            dd = mma(fa, fb, 32)
            for rr in range(16):
                r = 16 * tile + rr
                if r < rows:
                    scale = half(buf, r * pitch + k + 2 * f) if repacked else half(buf, r * pitch + 34 * f)
                    got[r] += xs[f] * scale * dd[rr]
    return np.max(np.abs(got - ref)) / np.max(np.abs(ref))


def main():
    models = [
        ("Q4_K k=2048, 40 rows", lambda: model_k(2048, 40, False)),
        ("Q5_K k=512, 20 rows", lambda: model_k(512, 20, True)),
        ("Q6_K GGUF k=512, 20 rows", lambda: model_q6(512, 20, False)),
        ("Q6_K GGUF k=768 (odd blocks), 19 rows", lambda: model_q6(768, 19, False)),
        ("Q6_K repacked k=512, 20 rows", lambda: model_q6(512, 20, True)),
        ("Q8_0 GGUF k=512, 20 rows", lambda: model_q8(512, 20, False)),
        ("Q8_0 repacked k=512, 19 rows", lambda: model_q8(512, 19, True)),
    ]
    failed = 0
    for name, run in models:
        err = run()
        ok = err < 1e-12
        failed += 0 if ok else 1
        print(f"{'ok' if ok else 'FAIL':4} {name}: relative error {err:.2e}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
