#!/usr/bin/env bash
# Decode GEMV kernels on the GPU (issue 10, item 2), in one call:
#   1. every vendor/csrc/*.cu compiled for sm_$GEMV_ARCH (default 90a) with -Xptxas -v (spills),
#      and gemv-bench (the longest compile: started first, beside the others)
#   2. every vendor kernel unit test (test-gemv: frt_gemv against a float64 reference at the qwen36
#      decode shapes, packs, experts by ids, odd shapes, refusals)
#   3. bench/tools/gemv-bench.cu: frt_gemv at every weight matvec shape of a qwen36 decode step and
#      our packs, 1..8 tokens, from CUDA graphs over > L2-sized rotating weights, against the budget
#      bytes / (0.7 x 4.38 TB/s) + 1.5 us
#   4. gemv-bench --lab: the decode GEMV v2 experiments (docs/perf-notes.md, "decode GEMV v2:
#      hypotheses"): launch and streaming-read probes at 8 KB..50 MB, then v1 and the candidate's
#      variants side by side at the dense shapes (1 token; v1 and C also at 2, 4, 8)
# Prints step 3's table at 1 token, then the lab's tables (all rows: $OUT/gemv-bench.md, gemv-lab.md).
#
# Usage (device, repository root): bench/device/gemv.sh [gemv-bench options for step 3, e.g. --tokens 1,2]
#   GEMV_SWEEP=0 skips step 3, GEMV_LAB=0 step 4 (both: gemv-bench is not compiled); GEMV_LAB_ARGS adds options to step 4 (e.g.
#   "--variants C,pre-l2 --shapes attn_qkv").
# GEMV_PREBUILT=DIR: the test binaries and gemv-bench already built (e.g. on a CPU machine with the
# pip nvcc, same flags, carried in .xtask/device): step 1 is skipped, nothing is compiled here.
# Needs nvcc only: no .xtask/device bundle, no network. Writes to $OUT (default /tmp/gemv):
# summary.txt, ptxas.txt, tests.txt, gemv-bench.jsonl (join with gemv-stock's lines:
# bench/tools/gemv-table.py STOCK.jsonl gemv-bench.jsonl), gemv-bench.md, gemv-bench.err,
# gemv-lab.jsonl, gemv-lab.md, gemv-lab.err.
set -euo pipefail
out=${OUT:-/tmp/gemv}
arch=${GEMV_ARCH:-90a}
mkdir -p "$out"
: > "$out/summary.txt"
say() {
    echo "$*" | tee -a "$out/summary.txt"
}
build=$(mktemp -d /tmp/gemv-build.XXXXXX)
# Steps 3 and 4 both off (GEMV_SWEEP=0 GEMV_LAB=0): the tests alone, without gemv-bench's compile.
with_bench=1
[ "${GEMV_SWEEP:-1}" = 0 ] && [ "${GEMV_LAB:-1}" = 0 ] && with_bench=0
if [ -n "${GEMV_PREBUILT:-}" ]; then
    say "prebuilt binaries from $GEMV_PREBUILT"
    cp "$GEMV_PREBUILT"/* "$build/"
    : > "$out/ptxas.txt"
else
say "nvcc: $(nvcc --version | tail -1)"

echo "== 1. compile vendor/csrc and gemv-bench for sm_$arch"
start=$(date +%s)
if [ $with_bench = 1 ]; then
    nvcc -std=c++17 -O3 -arch=sm_$arch -I vendor/csrc -I bench/tools -Xptxas -v -c bench/tools/gemv-bench.cu \
        -o "$build/gemv-bench.o" > "$build/gemv-bench.ptxas" 2>&1 &
    bench_pid=$!
fi
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
say "vendor compiled in $(( $(date +%s) - start )) s; $(grep -c 'bytes spill stores' "$out/ptxas.txt") functions, $spilling with spills"
vendor_objects=()
for src in vendor/csrc/*.cu; do
    vendor_objects+=("$build/$(basename "$src" .cu).o")
done
fi

echo "== 2. vendor kernel unit tests"
: > "$out/tests.txt"
tests_failed=0
for test in vendor/csrc/tests/test-*.cu; do
    name=$(basename "$test" .cu)
    if [ -n "${GEMV_PREBUILT:-}" ]; then
        [ -x "$build/$name" ] || continue
    else
        nvcc -std=c++17 -arch=sm_$arch -I vendor/csrc "$test" "${vendor_objects[@]}" -o "$build/$name"
    fi
    set +e
    "$build/$name" > "$build/$name.txt" 2>&1
    rc=$?
    set -e
    cat "$build/$name.txt" >> "$out/tests.txt"
    grep -E "^FAIL|^CUDA error" "$build/$name.txt" | head -10 || true
    say "$name: $(tail -1 "$build/$name.txt") (exit $rc)"
    [ $rc -eq 0 ] || tests_failed=1
done

[ $with_bench = 1 ] || exit $tests_failed
if [ -z "${GEMV_PREBUILT:-}" ]; then
bench_compiled=0
wait "$bench_pid" || bench_compiled=1
cat "$build/gemv-bench.ptxas" > "$out/ptxas-gemv-bench.txt"
if [ $bench_compiled -ne 0 ]; then
    grep -iE "error" "$out/ptxas-gemv-bench.txt" | head -20
    exit 1
fi
nvcc -arch=sm_$arch "$build/gemv-bench.o" "${vendor_objects[@]}" -o "$build/gemv-bench"
lab_spilling=$(grep 'bytes spill stores' "$out/ptxas-gemv-bench.txt" | grep -vc ' 0 bytes spill stores' || true)
say "gemv-bench compiled in $(( $(date +%s) - start )) s; its own kernels (lab, probes): $lab_spilling with spills"
fi

if [ "${GEMV_SWEEP:-1}" != 0 ]; then
    echo "== 3. gemv-bench"
    start=$(date +%s)
    "$build/gemv-bench" "$out/gemv-bench.jsonl" "$@" 2> "$out/gemv-bench.err" > "$out/gemv-bench.md" \
        || { tail -20 "$out/gemv-bench.err"; exit 1; }
    say "gemv-bench: $(tail -1 "$out/gemv-bench.md") ($(( $(date +%s) - start )) s)"
fi

if [ "${GEMV_LAB:-1}" != 0 ]; then
    echo "== 4. gemv-bench --lab"
    start=$(date +%s)
    # shellcheck disable=SC2086  # GEMV_LAB_ARGS is a list of options
    "$build/gemv-bench" "$out/gemv-lab.jsonl" --lab ${GEMV_LAB_ARGS:-} 2> "$out/gemv-lab.err" > "$out/gemv-lab.md" \
        || { tail -20 "$out/gemv-lab.err"; exit 1; }
    say "gemv-bench --lab: $(grep -c . "$out/gemv-lab.jsonl") timings ($(( $(date +%s) - start )) s)"
fi

echo
if [ -f "$out/gemv-bench.md" ]; then
    # The table, 1-token rows (all rows in gemv-bench.md).
    awk -F'|' '!/^\|/ || /^\| shape/ || /^\|---/ || $4 + 0 == 1' "$out/gemv-bench.md"
fi
[ -f "$out/gemv-lab.md" ] && cat "$out/gemv-lab.md"
exit $tests_failed
