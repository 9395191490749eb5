#!/usr/bin/env python3
"""Compare flashrt-logits files (bench/tools/logits.cpp) against a base run, position by position,
with cargo xtask parity's measures: NMSE = sum((a-b)^2) / sum(b^2) per position (b: the base),
its value at position 0 and its mean, and top-1 agreement.

Usage: logits-compare.py BASE NAME=FILE [NAME=FILE ...]   (prints a Markdown table)
"""
import struct
import sys

import numpy as np


def read_logits(path):
    with open(path, "rb") as f:
        if f.read(9) != b"FRTLOGITS":
            sys.exit(f"{path}: not a flashrt-logits file")
        version, n_vocab, n_tokens = struct.unpack("<iii", f.read(12))
        if version != 1:
            sys.exit(f"{path}: format version {version}, this script reads 1")
        f.read(4 * n_tokens)  # token ids
        logits = np.frombuffer(f.read(4 * n_vocab * n_tokens), dtype="<f4")
    if logits.size != n_vocab * n_tokens:
        sys.exit(f"{path}: truncated")
    return logits.reshape(n_tokens, n_vocab).astype(np.float64)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    base = read_logits(sys.argv[1])
    print("| run vs base | NMSE at position 0 | mean NMSE | max NMSE | top-1 agreement |")
    print("|---|---:|---:|---:|---:|")
    for arg in sys.argv[2:]:
        name, path = arg.split("=", 1)
        test = read_logits(path)
        if test.shape != base.shape:
            sys.exit(f"{path}: {test.shape} logits, base {base.shape}")
        nmse = ((test - base) ** 2).sum(axis=1) / (base**2).sum(axis=1)
        top1 = (test.argmax(axis=1) == base.argmax(axis=1)).sum()
        print(f"| {name} | {nmse[0]:.3e} | {nmse.mean():.3e} | {nmse.max():.3e} | {top1}/{len(nmse)} |")


if __name__ == "__main__":
    main()
