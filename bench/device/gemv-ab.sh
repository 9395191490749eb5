#!/usr/bin/env bash
# Two builds of the vendor GEMV kernels side by side on one GPU: test-gemv of the candidate (B),
# then gemv-bench of each at 1 token, and a table of the median µs per shape and kernel (A, B,
# B / A). For kernel changes that need no llama.cpp build: the binaries are built on a CPU machine
# with the pip nvcc, as bench/device/gemv.sh builds them, e.g. for a branch in a worktree:
#   for f in vendor/csrc/*.cu; do nvcc -std=c++17 -arch=sm_90a -I vendor/csrc -c $f -o objs/$(basename $f .cu).o; done
#   nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/tests/test-gemv.cu objs/*.o -o B/test-gemv
#   nvcc -std=c++17 -O3 -arch=sm_90a -I vendor/csrc -I bench/tools bench/tools/gemv-bench.cu objs/*.o -o B/gemv-bench
# then strip them and carry both folders (under .xtask/, e.g. .xtask/gemv-a and .xtask/gemv-b).
# gemv-bench options pass through: --between times each kernel after a small PDL kernel, as decode
# runs it (a kernel that wins back to back can lose there: docs/perf-notes.md, exact kernel v3).
# Usage (device, repository root): bench/device/gemv-ab.sh DIR_A DIR_B [gemv-bench options]
set -euo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
a=${1:?usage: gemv-ab.sh DIR_A DIR_B [gemv-bench options]}
b=${2:?usage: gemv-ab.sh DIR_A DIR_B [gemv-bench options]}
shift 2
out=${OUT:-/tmp/gemv-ab}
mkdir -p "$out"
status=0
"$b/test-gemv" > "$out/test-gemv-b.txt" 2>&1 || status=1
echo "test-gemv (B): $(tail -1 "$out/test-gemv-b.txt")"
grep -E "^FAIL" "$out/test-gemv-b.txt" | head -10 || true
for side in a b; do
    dir=$a
    [ $side = b ] && dir=$b
    "$dir/gemv-bench" "$out/bench-$side.jsonl" --tokens 1 "$@" > "$out/bench-$side.md" 2> "$out/bench-$side.err" \
        || { echo "gemv-bench ($side) failed:"; tail -5 "$out/bench-$side.err"; exit 1; }
done
python3 - "$out/bench-a.jsonl" "$out/bench-b.jsonl" <<'PY' | tee "$out/table.md"
import json, sys
def load(path):
    return {(r["shape"], r["impl"]): r for r in map(json.loads, open(path)) if r["tokens"] == 1}
a, b = load(sys.argv[1]), load(sys.argv[2])
print("| shape | kernel | MB | A µs | B µs | B / A |")
print("|---|---|---:|---:|---:|---:|")
for key in a:
    if key in b:
        ra, rb = a[key], b[key]
        print(f"| {key[0]} | {key[1]} | {ra['bytes'] / 1e6:.2f} | {ra['us_median']:.2f} | {rb['us_median']:.2f} | {rb['us_median'] / ra['us_median']:.3f} |")
PY
exit $status
