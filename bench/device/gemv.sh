#!/usr/bin/env bash
# Decode GEMV kernels on the GPU (issue 10, item 2), in one call:
#   1. every vendor/csrc/*.cu compiled for sm_$GEMV_ARCH (default 90a) with -Xptxas -v (spills),
#      and gemv-bench (the longest compile: started first, beside the others)
#   2. every vendor kernel unit test (test-gemv: frt_gemv against a float64 reference at the qwen36
#      decode shapes, packs, experts by ids, odd shapes, refusals)
#   3. bench/tools/gemv-bench.cu: frt_gemv at every weight matvec shape of a qwen36 decode step and
#      our packs, 1..8 tokens, from CUDA graphs over > L2-sized rotating weights, against the budget
#      bytes / (0.7 x 4.38 TB/s) + 1.5 us
# Prints step 3's table at 1 token (all rows: $OUT/gemv-bench.md).
#
# Usage (device, repository root): bench/device/gemv.sh [gemv-bench options for step 3, e.g. --tokens 1,2]
#   GEMV_SWEEP=0 skips step 3 (gemv-bench is then not compiled).
#   GEMV_SETTINGS (default none): settings test-gemv and gemv-bench (its frt-exact rows) run again
#   under, ';' between settings, e.g. "GGML_FLASHRT_EXACT_EVICT_FIRST=0;GGML_FLASHRT_L2_PREFETCH=1".
# GEMV_PREBUILT=DIR: the test binaries and gemv-bench already built (e.g. on a CPU machine with the
# pip nvcc, same flags, carried in .xtask/device): step 1 is skipped, nothing is compiled here.
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
# Step 3 off (GEMV_SWEEP=0): the tests alone, without gemv-bench's compile.
with_bench=1
[ "${GEMV_SWEEP:-1}" = 0 ] && with_bench=0
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
# test-gemv under each of GEMV_SETTINGS, bit for bit as well.
IFS=';' read -r -a settings <<< "${GEMV_SETTINGS:-}"
for i in "${!settings[@]}"; do
    [ -x "$build/test-gemv" ] || break
    read -r -a setting <<< "${settings[$i]}"
    set +e
    env "${setting[@]}" "$build/test-gemv" > "$build/test-gemv-setting$i.txt" 2>&1
    rc=$?
    set -e
    cat "$build/test-gemv-setting$i.txt" >> "$out/tests.txt"
    grep -E "^FAIL|^CUDA error" "$build/test-gemv-setting$i.txt" | head -10 || true
    say "test-gemv, ${setting[*]}: $(tail -1 "$build/test-gemv-setting$i.txt") (exit $rc)"
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
say "gemv-bench compiled in $(( $(date +%s) - start )) s"
fi

if [ "${GEMV_SWEEP:-1}" != 0 ]; then
    echo "== 3. gemv-bench"
    start=$(date +%s)
    "$build/gemv-bench" "$out/gemv-bench.jsonl" "$@" 2> "$out/gemv-bench.err" > "$out/gemv-bench.md" \
        || { tail -20 "$out/gemv-bench.err"; exit 1; }
    say "gemv-bench: $(tail -1 "$out/gemv-bench.md") ($(( $(date +%s) - start )) s)"
    # The exact kernel under each of GEMV_SETTINGS, its rows only: gemv-bench-setting<i>.md beside the table.
    for i in "${!settings[@]}"; do
        read -r -a setting <<< "${settings[$i]}"
        env "${setting[@]}" "$build/gemv-bench" "$out/gemv-bench-setting$i.jsonl" "$@" \
            --impls frt-exact 2>> "$out/gemv-bench.err" > "$out/gemv-bench-setting$i.md" \
            || { tail -20 "$out/gemv-bench.err"; exit 1; }
        say "gemv-bench, ${setting[*]}: $(tail -1 "$out/gemv-bench-setting$i.md")"
    done
fi

echo
if [ -f "$out/gemv-bench.md" ]; then
    # The table, 1-token rows (all rows in gemv-bench.md).
    awk -F'|' '!/^\|/ || /^\| shape/ || /^\|---/ || $4 + 0 == 1' "$out/gemv-bench.md"
fi
exit $tests_failed
