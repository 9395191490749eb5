#!/usr/bin/env bash
# Builds of the vendor GEMV kernels side by side on one GPU: test-gemv of every build that has one,
# then gemv-bench of each at 1 token, and a table of the median µs per shape and kernel (the first
# build, then each other one with its ratio to the first). For kernel changes that need no
# llama.cpp build: each folder is built on a CPU machine by bench/tools/gemv-variant.sh (a
# checkout or worktree, nvcc options), and the folders are
# carried (under .xtask/, e.g. .xtask/gemv-a and .xtask/gemv-b).
# gemv-bench options follow the folders: --between times each kernel after a small PDL kernel, as
# decode runs it (a kernel that wins back to back can lose there: docs/perf-notes.md, exact kernel v3).
# Usage (device, repository root): bench/device/gemv-ab.sh DIR_A DIR_B [DIR ...] [gemv-bench options]
set -euo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
dirs=()
while [ $# -gt 0 ] && [ -d "$1" ]; do
    dirs+=("$1")
    shift
done
[ ${#dirs[@]} -ge 2 ] || { echo "usage: gemv-ab.sh DIR_A DIR_B [DIR ...] [gemv-bench options]"; exit 2; }
out=${OUT:-/tmp/gemv-ab}
mkdir -p "$out"
status=0
for dir in "${dirs[@]}"; do
    name=$(basename "$dir")
    if [ -x "$dir/test-gemv" ]; then
        "$dir/test-gemv" > "$out/test-gemv-$name.txt" 2>&1 || status=1
        echo "test-gemv ($name): $(tail -1 "$out/test-gemv-$name.txt")"
        grep -E "^FAIL" "$out/test-gemv-$name.txt" | head -10 || true
    fi
done
for dir in "${dirs[@]}"; do
    name=$(basename "$dir")
    "$dir/gemv-bench" "$out/bench-$name.jsonl" --tokens 1 "$@" > "$out/bench-$name.md" 2> "$out/bench-$name.err" \
        || { echo "gemv-bench ($name) failed:"; tail -5 "$out/bench-$name.err"; exit 1; }
done
python3 - "$out" "${dirs[@]}" <<'PY' | tee "$out/table.md"
import json, os, sys
out, dirs = sys.argv[1], [os.path.basename(d) for d in sys.argv[2:]]
def load(name):
    return {(r["shape"], r["impl"]): r for r in map(json.loads, open(f"{out}/bench-{name}.jsonl")) if r["tokens"] == 1}
runs = [load(d) for d in dirs]
first = runs[0]
print("| shape | kernel | MB | " + " | ".join(f"{d} µs" + ("" if i == 0 else f" | {d} / {dirs[0]}") for i, d in enumerate(dirs)) + " |")
print("|---|---|---:|" + "---:|" * (2 * len(dirs) - 1))
for key, ra in first.items():
    cells = [f"{ra['us_median']:.2f}"]
    for run in runs[1:]:
        rb = run.get(key)
        cells += [f"{rb['us_median']:.2f}", f"{rb['us_median'] / ra['us_median']:.3f}"] if rb else ["-", "-"]
    print(f"| {key[0]} | {key[1]} | {ra['bytes'] / 1e6:.2f} | " + " | ".join(cells) + " |")
PY
exit $status
