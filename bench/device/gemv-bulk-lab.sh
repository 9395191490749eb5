#!/usr/bin/env bash
# The bulk GEMV kernel's experiments (docs/perf-notes.md, "bulk kernel v1"): gemv-bench at 1 token
# on a few shapes, once per FRT_GEMV_BULK_LAB setting (vendor/csrc/gemv-bulk.cuh: 1 no math,
# 4 no stores; sums combine them). Needs nvcc only.
# Usage (device, repository root): bench/device/gemv-bulk-lab.sh [settings, default "0 1 4"]
#   GEMV_SHAPES: gemv-bench --shapes (default output,attn_qkv,ffn_gate_inp_shexp,ffn_down_exps)
# Writes $OUT (default /tmp/gemv-bulk-lab): lab-<setting>.md and .jsonl, summary.txt (the table).
set -euo pipefail
out=${OUT:-/tmp/gemv-bulk-lab}
mkdir -p "$out"
build=$(mktemp -d /tmp/gemv-bulk-lab.XXXXXX)
objects=()
pids=()
for src in vendor/csrc/*.cu bench/tools/gemv-bench.cu; do
    obj="$build/$(basename "$src" .cu).o"
    nvcc -std=c++17 -O3 -arch=sm_90a -I vendor/csrc -I bench/tools -c "$src" -o "$obj" &
    pids+=($!)
    objects+=("$obj")
done
for pid in "${pids[@]}"; do
    wait "$pid"
done
nvcc -arch=sm_90a "${objects[@]}" -o "$build/gemv-bench"
shapes=${GEMV_SHAPES:-output,attn_qkv,ffn_gate_inp_shexp,ffn_down_exps}
: > "$out/summary.txt"
for setting in ${1:-0 1 4}; do
    FRT_GEMV_BULK_LAB=$setting "$build/gemv-bench" "$out/lab-$setting.jsonl" --tokens 1 --shapes "$shapes" \
        > "$out/lab-$setting.md" 2> "$out/lab-$setting.err" || { tail -5 "$out/lab-$setting.err"; exit 1; }
    awk -F'|' -v s="$setting" '/^\| [a-z_]+ \| frt/ {printf "| %s |%s|%s|%s|\n", s, $2, $3, $8}' \
        "$out/lab-$setting.md" >> "$out/summary.txt"
done
echo "| lab | shape | impl | us |"
echo "|---|---|---|---:|"
cat "$out/summary.txt"
