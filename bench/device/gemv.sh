#!/usr/bin/env bash
# Decode GEMV kernels on the GPU (issue 10, item 2), in one call:
#   1. every vendor/csrc/*.cu compiled for sm_$GEMV_ARCH (default 90a) with -Xptxas -v (spills)
#   2. every vendor kernel unit test (test-gemv: frt_gemv against a float64 reference at the qwen36
#      decode shapes, packs, experts by ids, odd shapes, refusals)
#   3. bench/tools/gemv-bench.cu: frt_gemv at every weight matvec shape of a qwen36 decode step and
#      our packs, 1..8 tokens, from CUDA graphs over > L2-sized rotating weights, against the budget
#      bytes / (0.7 x 4.38 TB/s) + 1.5 us
# Prints the table at 1 token last (every token count: $OUT/gemv-bench.md).
#
# Usage (device, repository root): bench/device/gemv.sh [gemv-bench options, e.g. --tokens 1,2]
# Needs nvcc only: no .xtask/device bundle, no network. Writes to $OUT (default /tmp/gemv):
# summary.txt, ptxas.txt, tests.txt, gemv-bench.jsonl (join with gemv-stock's lines:
# bench/tools/gemv-table.py STOCK.jsonl gemv-bench.jsonl), gemv-bench.md, gemv-bench.err.
set -euo pipefail
out=${OUT:-/tmp/gemv}
arch=${GEMV_ARCH:-90a}
mkdir -p "$out"
: > "$out/summary.txt"
say() {
    echo "$*" | tee -a "$out/summary.txt"
}
build=$(mktemp -d /tmp/gemv-build.XXXXXX)
say "nvcc: $(nvcc --version | tail -1)"

echo "== 1. compile vendor/csrc for sm_$arch"
start=$(date +%s)
pids=()
for src in vendor/csrc/*.cu; do
    name=$(basename "$src" .cu)
    nvcc -std=c++17 -arch=sm_$arch -I vendor/csrc -Xptxas -v -c "$src" -o "$build/$name.o" \
        > "$build/$name.ptxas" 2>&1 &
    pids+=($!)
done
compile_failed=0
for pid in "${pids[@]}"; do
    wait "$pid" || compile_failed=1
done
cat "$build"/*.ptxas > "$out/ptxas.txt"
if [ $compile_failed -ne 0 ]; then
    grep -iE "error" "$out/ptxas.txt" | head -20
    exit 1
fi
spilling=$(grep 'bytes spill stores' "$out/ptxas.txt" | grep -vc ' 0 bytes spill stores' || true)
say "compiled in $(( $(date +%s) - start )) s; $(grep -c 'bytes spill stores' "$out/ptxas.txt") functions, $spilling with spills"

echo "== 2. vendor kernel unit tests"
: > "$out/tests.txt"
tests_failed=0
for test in vendor/csrc/tests/test-*.cu; do
    name=$(basename "$test" .cu)
    nvcc -std=c++17 -arch=sm_$arch -I vendor/csrc "$test" "$build"/*.o -o "$build/$name"
    set +e
    "$build/$name" > "$build/$name.txt" 2>&1
    rc=$?
    set -e
    cat "$build/$name.txt" >> "$out/tests.txt"
    grep -E "^FAIL|^CUDA error" "$build/$name.txt" | head -10 || true
    say "$name: $(tail -1 "$build/$name.txt") (exit $rc)"
    [ $rc -eq 0 ] || tests_failed=1
done

echo "== 3. gemv-bench"
nvcc -std=c++17 -O3 -arch=sm_$arch -I vendor/csrc -I bench/tools bench/tools/gemv-bench.cu "$build"/*.o \
    -o "$build/gemv-bench"
start=$(date +%s)
"$build/gemv-bench" "$out/gemv-bench.jsonl" "$@" 2> "$out/gemv-bench.err" > "$out/gemv-bench.md" \
    || { tail -20 "$out/gemv-bench.err"; exit 1; }
say "gemv-bench: $(tail -1 "$out/gemv-bench.md") ($(( $(date +%s) - start )) s)"
echo
# The table, 1-token rows (all rows in gemv-bench.md).
awk -F'|' '!/^\|/ || /^\| shape/ || /^\|---/ || $3 + 0 == 1' "$out/gemv-bench.md"
exit $tests_failed
