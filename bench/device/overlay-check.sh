#!/usr/bin/env bash
# Device check of the overlay runtime and its windows, in one call:
#   1. vendor kernel unit tests (nvcc, float64 CPU reference)
#   2. cargo xtask test-backend-ops: the FlashRT whole-graph cases, CUDA vs CPU, every window must
#      fire (--full: then the whole upstream suite too); a stock build starts meanwhile
#   3. a tiny random-weight qwen35moe (the host's test-llama-archs): its CUDA-vs-CPU model check,
#      greedy completions and FRT_STATS with the overlay on and with GGML_CUDA_FLASHRT_DISABLE=1,
#      a GGML_FLASHRT_DUMP of the graphs, and llama-bench A/B/A/B
#   4. the repack cache: a 4-layer qwen36-shaped synth model whose shared-expert gates are F16
#      (read through the cache), with the cache, with GGML_CUDA_FLASHRT_NO_CACHE=1 and disabled;
#      and the graph split between CPU and GPU (-ngl 2): windows stay inside the GPU's part
#   5. GGML_CUDA_FLASHRT_DISABLE=1 against the stock build (no patches, no overlay): same output
# Usage (device, repository root): bench/device/overlay-check.sh [--full]
# Needs .xtask/device/ carried, as smoke.sh (see bench/README.md). Writes $OUT/summary.txt as it goes.
set -euo pipefail
# Windows of every tier are checked here, not only the default (safe) ones.
export FRT_SHEXP_GATE_SWAP=1
. bench/device/lib.sh
device_setup overlay-check

echo "== 1. vendor kernel unit tests"
for test in gated-rms-norm gated-residual; do
    nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/*.cu vendor/csrc/tests/test-$test.cu \
        -o /tmp/test-$test 2>/dev/null
    /tmp/test-$test | tee -a "$out/vendor-tests.txt"
    say "vendor $test: $(tail -1 "$out/vendor-tests.txt")"
done

echo "== 2. build + test-backend-ops FlashRT cases"
start=$(date +%s)
"$xtask" build --arch 90a \
    --targets test-backend-ops,llama-bench,llama-completion,test-llama-archs > "$out/build.log" 2>&1 \
    || { tail -30 "$out/build.log"; exit 1; }
say "flashrt build: $(( $(date +%s) - start )) s"
# The stock build for step 5 compiles while the tests run (their timing does not matter).
"$xtask" build --arch 90a --stock --targets llama-completion -j 16 > "$out/build-stock.log" 2>&1 &
stock_build=$!
"$xtask" test-backend-ops --arch 90a 2>&1 | tee "$out/tbo-flashrt.txt"
say "test-backend-ops FLASHRT_.*: $(grep -m1 'tests passed' "$out/tbo-flashrt.txt" | xargs)"
grep -E "FlashRT stats:  " "$out/tbo-flashrt.txt" | head -4 >> "$out/summary.txt" || true
if [ "${1:-}" = --full ]; then
    "$xtask" test-backend-ops --arch 90a --full -j 16 2>&1 | tee "$out/tbo-full.txt" | tail -12
    say "test-backend-ops full: $(grep -m1 'tests passed' "$out/tbo-full.txt" | xargs)"
fi

echo "== 3. tiny qwen35moe"
bin=.xtask/build/llama.cpp-flashrt-sm90a/bin
models=/tmp/models
mkdir -p "$models"
"$bin/test-llama-archs" -a '^qwen35moe$' -s 42 -o "$models" > /dev/null 2>&1
tiny=$models/qwen35moe-moe.gguf
FRT_STATS=1 "$bin/test-llama-archs" -a '^qwen35moe$' -s 42 -b CUDA0 > "$out/archs-cuda-vs-cpu.txt" 2>&1 \
    || { tail -20 "$out/archs-cuda-vs-cpu.txt"; exit 1; }
tail -4 "$out/archs-cuda-vs-cpu.txt"
say "test-llama-archs qwen35moe CUDA vs CPU: $(grep -c 'OK' "$out/archs-cuda-vs-cpu.txt") OK lines, $(grep -ci 'fail' "$out/archs-cuda-vs-cpu.txt" || true) FAIL lines"

# complete <binary dir> <model> <tag> [extra llama-completion args]: greedy, 64 tokens.
complete() {
    local dir=$1 model=$2 tag=$3
    shift 3
    "$dir/llama-completion" -m "$model" -ngl 99 -fa on -p "hello world, this is a test" -n 64 --temp 0 -s 1 \
        -no-cnv --no-warmup "$@" > "$out/completion-$tag.txt" 2> "$out/completion-$tag.err"
    grep "FlashRT stats" "$out/completion-$tag.err" > "$out/stats-$tag.txt" || true
}
same() { if cmp -s "$out/completion-$1.txt" "$out/completion-$2.txt"; then echo identical; else echo DIFFERENT; fi; }
hits() { grep -E "FlashRT stats:   " "$out/stats-$1.txt" | awk '{printf "%s %s hits; ", $3, $5}'; }

FRT_STATS=1 GGML_FLASHRT_DUMP="$out/dump.tsv" GGML_FLASHRT_DUMP_MAX=2 complete "$bin" "$tiny" tiny-flashrt
GGML_CUDA_FLASHRT_DISABLE=1 FRT_STATS=1 complete "$bin" "$tiny" tiny-disabled
say "tiny: greedy completion overlay vs disabled: $(same tiny-flashrt tiny-disabled)"
say "tiny: overlay stats: $(hits tiny-flashrt)"
say "tiny: disabled stats: $(hits tiny-disabled)"

bench() {
    "$bin/llama-bench" -m "$tiny" -ngl 99 -fa 1 -p 0 -n 128 -r 5 -o jsonl 2>/dev/null \
        | python3 -c 'import json,sys; r=json.loads(sys.stdin.readlines()[-1]); print("%.1f+-%.1f" % (r["avg_ts"], r["stddev_ts"]))'
}
a1=$(GGML_CUDA_FLASHRT_DISABLE=1 bench); b1=$(bench); a2=$(GGML_CUDA_FLASHRT_DISABLE=1 bench); b2=$(bench)
say "tiny qwen35moe tg128 tok/s: disabled $a1 / overlay $b1 / disabled $a2 / overlay $b2"

echo "== 4. repack cache (F16 shared-expert gates) and a CPU/GPU split"
f16=$models/qwen36-l4-e8-f16gate.gguf
"$xtask" synth --preset qwen36-35b-a3b --layers 4 --experts 8 --tensor-type ffn_gate_inp_shexp=f16 \
    --out "$f16" > "$out/synth-f16gate.log" 2>&1 || { tail -20 "$out/synth-f16gate.log"; exit 1; }
FRT_STATS=1 complete "$bin" "$f16" f16-cache
GGML_CUDA_FLASHRT_NO_CACHE=1 FRT_STATS=1 complete "$bin" "$f16" f16-nocache
GGML_CUDA_FLASHRT_DISABLE=1 complete "$bin" "$f16" f16-disabled
say "f16 gates: cache: $(grep -o 'repack cache.*' "$out/stats-f16-cache.txt"); $(hits f16-cache)"
say "f16 gates: NO_CACHE=1: $(grep -o 'repack cache.*' "$out/stats-f16-nocache.txt")"
say "f16 gates: completion cache vs NO_CACHE: $(same f16-cache f16-nocache); cache vs disabled: $(same f16-cache f16-disabled)"
FRT_STATS=1 complete "$bin" "$f16" split-flashrt -ngl 2
GGML_CUDA_FLASHRT_DISABLE=1 complete "$bin" "$f16" split-disabled -ngl 2
say "-ngl 2 of 4 layers (graph split CPU/GPU): overlay vs disabled: $(same split-flashrt split-disabled); $(hits split-flashrt)"

echo "== 5. disabled vs the stock build"
if wait "$stock_build"; then
    stock=.xtask/build/llama.cpp-stock-sm90a/bin
    complete "$stock" "$tiny" tiny-stock
    complete "$stock" "$f16" f16-stock
    say "stock build vs GGML_CUDA_FLASHRT_DISABLE=1: tiny $(same tiny-stock tiny-disabled), f16-gate model $(same f16-stock f16-disabled)"
else
    tail -20 "$out/build-stock.log"
    say "stock build FAILED (see build-stock.log)"
fi

echo
cat "$out/summary.txt"
archive_out overlay-check
