#!/usr/bin/env bash
# Device check of the overlay runtime and its windows, in one call:
#   1. vendor kernel unit tests (nvcc, float64 CPU reference)
#   2. cargo xtask test-backend-ops: the FlashRT whole-graph cases, CUDA vs CPU, every window must fire
#   3. a tiny random-weight qwen35moe (the host's test-llama-archs): its CUDA-vs-CPU model check,
#      greedy completions and FRT_STATS with the overlay on and with GGML_CUDA_FLASHRT_DISABLE=1,
#      a GGML_FLASHRT_DUMP of the graphs, and llama-bench A/B/A
# Usage (device, repository root): bench/device/overlay-check.sh [--full]
# Needs .xtask/device/ carried, as smoke.sh (see bench/README.md).
set -euo pipefail
# Windows of every tier are checked here, not only the default (safe) ones.
export FRT_SHEXP_GATE_SWAP=1
out=${OUT:-/tmp/overlay-check}
mkdir -p "$out"
xtask=.xtask/device/xtask
# The verified pinned tree, carried: the device cannot download it.
"$xtask" host fetch --host-src .xtask/device/llama.cpp.tar.xz
summary=()

echo "== 1. vendor kernel unit tests"
for test in gated-rms-norm gated-residual; do
    nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/$test.cu vendor/csrc/tests/test-$test.cu \
        -o /tmp/test-$test 2>/dev/null
    /tmp/test-$test | tee -a "$out/vendor-tests.txt"
    summary+=("vendor $test: $(tail -1 "$out/vendor-tests.txt")")
done

echo "== 2. build + test-backend-ops FlashRT cases"
"$xtask" build --arch 90a \
    --targets test-backend-ops,llama-bench,llama-completion,test-llama-archs > "$out/build.log" 2>&1 \
    || { tail -30 "$out/build.log"; exit 1; }
"$xtask" test-backend-ops --arch 90a 2>&1 | tee "$out/tbo-flashrt.txt"
summary+=("test-backend-ops FLASHRT_.*: $(grep -m1 'tests passed' "$out/tbo-flashrt.txt" | xargs)")
if [ "${1:-}" = --full ]; then
    "$xtask" test-backend-ops --arch 90a --full 2>&1 | tee "$out/tbo-full.txt" | tail -12
    summary+=("test-backend-ops full: $(grep -m1 'tests passed' "$out/tbo-full.txt" | xargs)")
fi

echo "== 3. tiny qwen35moe"
bin=.xtask/build/llama.cpp-flashrt-sm90a/bin
models=/tmp/models
mkdir -p "$models"
"$bin/test-llama-archs" -a '^qwen35moe$' -s 42 -o "$models" > /dev/null 2>&1
model=$models/qwen35moe-moe.gguf
sha256sum "$model"
FRT_STATS=1 "$bin/test-llama-archs" -a '^qwen35moe$' -s 42 -b CUDA0 > "$out/archs-cuda-vs-cpu.txt" 2>&1 \
    || { tail -20 "$out/archs-cuda-vs-cpu.txt"; exit 1; }
tail -4 "$out/archs-cuda-vs-cpu.txt"
summary+=("test-llama-archs qwen35moe CUDA vs CPU: $(grep -c 'OK' "$out/archs-cuda-vs-cpu.txt") OK lines, $(grep -ci 'fail' "$out/archs-cuda-vs-cpu.txt" || true) FAIL lines")

complete() {
    "$bin/llama-completion" -m "$model" -ngl 99 -fa on -p "hello world, this is a test" -n 64 --temp 0 -s 1 \
        -no-cnv --no-warmup 2>"$out/completion-$1.err"
}
FRT_STATS=1 GGML_FLASHRT_DUMP="$out/dump.tsv" GGML_FLASHRT_DUMP_MAX=2 complete flashrt > "$out/completion-flashrt.txt"
GGML_CUDA_FLASHRT_DISABLE=1 FRT_STATS=1 complete disabled > "$out/completion-disabled.txt"
grep "FlashRT stats" "$out/completion-flashrt.err" | tee "$out/stats-flashrt.txt"
grep "FlashRT stats" "$out/completion-disabled.err" > "$out/stats-disabled.txt" || echo "(no stats: layer disabled)" > "$out/stats-disabled.txt"
cat "$out/stats-disabled.txt"
if cmp -s "$out/completion-flashrt.txt" "$out/completion-disabled.txt"; then same=identical; else same=DIFFERENT; fi
summary+=("greedy completion overlay vs disabled: $same")
summary+=("stats: $(grep -E 'GDN_GATED_NORM|SHEXP_GATE' "$out/stats-flashrt.txt" | xargs)")

bench() {
    "$bin/llama-bench" -m "$model" -ngl 99 -fa 1 -p 0 -n 128 -r 5 -o jsonl 2>/dev/null \
        | python3 -c 'import json,sys; r=json.loads(sys.stdin.readlines()[-1]); print("%.1f+-%.1f" % (r["avg_ts"], r["stddev_ts"]))'
}
a1=$(GGML_CUDA_FLASHRT_DISABLE=1 bench); b1=$(bench); a2=$(GGML_CUDA_FLASHRT_DISABLE=1 bench); b2=$(bench)
summary+=("tiny qwen35moe tg128 tok/s: disabled $a1 / overlay $b1 / disabled $a2 / overlay $b2")

echo
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
