#!/usr/bin/env python3
"""Joins the decode GEMV microbenchmark's two sides into one markdown table.

    gemv-table.py STOCK.jsonl OURS.jsonl [--impl frt] [--bandwidth-tbs 4.38]

STOCK.jsonl comes from bench/tools/gemv-stock.cpp (stock ggml), OURS.jsonl from
bench/tools/gemv-bench.cu. Each line is a JSON object with at least shape, out, in, type, tokens,
bytes and us_median; OURS lines of other impls than --impl (gemv-bench writes "frt", what frt_gemv
picks, and "frt-bulk", its bulk kernel) are left out. Rows join by (shape, tokens); a row of ours whose shape name stock does not
have joins by (out, in, type, tokens, experts) instead when exactly one stock row has those (marked
~ in the table), and rows left over on either side are listed with the other side empty.

Per row: bytes (ours where we have a row: the budget is ours), floor = bytes / bandwidth, budget =
bytes / (0.7 x bandwidth) + 1.5 us, stock and our median us, speed-up = stock / ours, pass = ours
within the budget. Then, per token count that stock covers completely, the matvec time of one
decode step: sum of per_step x us over the shapes both sides measured. Standard library only.
"""

import argparse
import json
import sys

REQUIRED = ("shape", "out", "in", "type", "tokens", "bytes", "us_median")


def read_rows(path):
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}:{number}: not JSON ({e})")
                missing = [k for k in REQUIRED if k not in row]
                if missing:
                    sys.exit(f"{path}:{number}: missing {', '.join(missing)} (each line needs {', '.join(REQUIRED)})")
                rows.append(row)
    except OSError as e:
        sys.exit(f"cannot read {path}: {e.strerror}")
    return rows


def name_key(row):
    return (row["shape"], int(row["tokens"]))


def dims_key(row):
    return (int(row["out"]), int(row["in"]), str(row["type"]).lower(), int(row["tokens"]), int(row.get("experts", 1)))


def join(stock, ours):
    """Pairs (stock row or None, our row or None, joined by dimensions), stock's order first."""
    stock_by_name = {}
    for row in stock:
        if name_key(row) in stock_by_name:
            sys.exit(f"stock has two rows for shape {row['shape']} at {row['tokens']} tokens")
        stock_by_name[name_key(row)] = row
    stock_by_dims = {}
    for row in stock:
        stock_by_dims.setdefault(dims_key(row), []).append(row)

    ours_for = {}  # id(stock row) -> (our row, by dims)
    ours_alone = []
    for row in ours:
        match, by_dims = stock_by_name.get(name_key(row)), False
        if match is None:
            candidates = stock_by_dims.get(dims_key(row), [])
            if len(candidates) == 1:
                match, by_dims = candidates[0], True
        if match is None or id(match) in ours_for:
            ours_alone.append(row)
        else:
            ours_for[id(match)] = (row, by_dims)
    pairs = [(s, *ours_for.get(id(s), (None, False))) for s in stock]
    pairs += [(None, row, False) for row in ours_alone]
    return pairs


def cell(value, digits=2):
    return "—" if value is None else f"{value:.{digits}f}"


def table(pairs, bandwidth):
    lines = [
        "| shape | tokens | bytes | floor us | budget us | stock us | ours us | speed-up | pass |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    notes = []
    for s, o, by_dims in pairs:
        row = o if o is not None else s
        bytes_ = int(row["bytes"])
        floor = bytes_ / bandwidth * 1e6
        budget = bytes_ / (0.7 * bandwidth) * 1e6 + 1.5
        stock_us = float(s["us_median"]) if s else None
        ours_us = float(o["us_median"]) if o else None
        shape = s["shape"] if s else o["shape"]
        if by_dims:
            shape = f"{shape} ~ {o['shape']}"
        if s and o and abs(int(s["bytes"]) - bytes_) > 0.01 * bytes_:
            notes.append(f"{shape} at {row['tokens']} tokens: stock counts {s['bytes']} bytes, ours {bytes_}")
            shape += " !"
        speedup = f"{stock_us / ours_us:.2f}x" if stock_us and ours_us else "—"
        passed = "—" if ours_us is None else ("yes" if ours_us <= budget else "no")
        lines.append(
            f"| {shape} | {row['tokens']} | {bytes_} | {floor:.2f} | {budget:.2f} | {cell(stock_us)} | "
            f"{cell(ours_us)} | {speedup} | {passed} |"
        )
    if any(by_dims for _, _, by_dims in pairs):
        lines.append("")
        lines.append("~: joined by (out, in, type, tokens, experts): the shape names differ.")
    if notes:
        lines.append("")
        lines.append("!: the two sides count different bytes (the table uses ours):")
        lines += [f"- {n}" for n in notes]
    return lines


def step_totals(pairs):
    """Per token count that stock covers with per_step counts: one decode step's matvec time."""
    lines = []
    tokens = sorted({int(s["tokens"]) for s, _, _ in pairs if s and "per_step" in s})
    for t in tokens:
        rows = [(s, o) for s, o, _ in pairs if s and int(s["tokens"]) == t and "per_step" in s]
        stock_all = sum(int(s["per_step"]) * float(s["us_median"]) for s, _ in rows)
        both = [(s, o) for s, o in rows if o]
        stock_both = sum(int(s["per_step"]) * float(s["us_median"]) for s, _ in both)
        ours_both = sum(int(s["per_step"]) * float(o["us_median"]) for s, o in both)
        line = f"- {t} token(s): stock {stock_all:.1f} us over all {len(rows)} shapes"
        if both:
            line += (
                f"; over the {len(both)} shapes both measured: stock {stock_both:.1f} us, "
                f"ours {ours_both:.1f} us ({stock_both / ours_both:.2f}x)"
            )
        lines.append(line)
    if lines:
        lines.insert(0, "Matvec time of one decode step (sum of per_step x us):")
        lines.insert(0, "")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stock", help="JSON lines from bench/tools/gemv-stock.cpp")
    parser.add_argument("ours", help="JSON lines from bench/tools/gemv-bench.cu")
    parser.add_argument(
        "--bandwidth-tbs", type=float, default=4.38, help="DRAM read bandwidth in TB/s (H200 measured: 4.38)"
    )
    parser.add_argument("--impl", default="frt", help='our implementation to join (default "frt"; also "frt-bulk")')
    args = parser.parse_args()
    if not args.bandwidth_tbs > 0:
        sys.exit("--bandwidth-tbs must be positive")
    ours = [row for row in read_rows(args.ours) if row.get("impl", "frt") == args.impl]
    if not ours:
        sys.exit(f"{args.ours}: no rows of impl {args.impl}")
    pairs = join(read_rows(args.stock), ours)
    print("\n".join(table(pairs, args.bandwidth_tbs * 1e12) + step_totals(pairs)))


if __name__ == "__main__":
    main()
