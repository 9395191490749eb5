#!/usr/bin/env bash
# Two GPUs (device kind nvidia-h200-x2), in one call:
#   1. the FlashRT test-backend-ops cases on the second GPU (CUDA1)
#   2. correctness across devices: greedy completions of a 4-layer qwen36-shaped synth model with
#      F16 shared-expert gates (read through each device's repack cache), overlay vs
#      GGML_CUDA_FLASHRT_DISABLE=1, for -sm layer and -sm tensor with -ts 1,1
#   3. cargo xtask bench on the full synthetic qwen36-35b-a3b, stock vs overlay A/B/A, for
#      -sm layer, tensor and row with -ts 1,1 (at this pin CUDA has no split buffer type: row is
#      expected to fail to load, for stock as for the overlay; the failure is recorded)
#   4. cargo xtask parity on one GPU: the full synthetic qwen36 and the 4-layer F16-gate model
# Usage (device, repository root): bench/device/multi-gpu.sh
# Needs .xtask/device/ carried (see bench/README.md). Writes $OUT/summary.txt as it goes.
set -euo pipefail
export FRT_SHEXP_GATE_SWAP=1
. bench/device/lib.sh
device_setup multi-gpu
say "GPUs: $(nvidia-smi -L | wc -l) ($(nvidia-smi --query-gpu=name --format=csv,noheader | sort -u | xargs))"

echo "== 1. FlashRT cases on CUDA1"
"$xtask" build --arch 90a --targets test-backend-ops,llama-bench,llama-completion > "$out/build.log" 2>&1 \
    || { tail -30 "$out/build.log"; exit 1; }
"$xtask" test-backend-ops --arch 90a --backend CUDA1 2>&1 | tee "$out/tbo-flashrt-cuda1.txt" | tail -8
say "test-backend-ops FLASHRT_.* on CUDA1: $(grep -m1 'tests passed' "$out/tbo-flashrt-cuda1.txt" | xargs)"

echo "== 2. completions across two devices"
bin=.xtask/build/llama.cpp-flashrt-sm90a/bin
f16=/tmp/models/qwen36-l4-e8-f16gate.gguf
mkdir -p /tmp/models
[ -f "$f16" ] || "$xtask" synth --preset qwen36-35b-a3b --layers 4 --experts 8 \
    --tensor-type ffn_gate_inp_shexp=f16 --out "$f16" > "$out/synth-f16gate.log" 2>&1
complete() {
    local tag=$1
    shift
    "$bin/llama-completion" -m "$f16" -ngl 99 -fa on -p "hello world, this is a test" -n 64 --temp 0 -s 1 \
        -no-cnv --no-warmup -ts 1,1 "$@" > "$out/completion-$tag.txt" 2> "$out/completion-$tag.err"
    grep "FlashRT stats" "$out/completion-$tag.err" > "$out/stats-$tag.txt" || true
}
same() { if cmp -s "$out/completion-$1.txt" "$out/completion-$2.txt"; then echo identical; else echo DIFFERENT; fi; }
hits() { grep -E "FlashRT stats:   " "$out/stats-$1.txt" | awk '{printf "%s %s hits; ", $3, $5}'; }
for sm in layer tensor; do
    if FRT_STATS=1 complete "$sm-flashrt" -sm $sm && GGML_CUDA_FLASHRT_DISABLE=1 complete "$sm-disabled" -sm $sm; then
        devices=$(grep -cE "using device CUDA[01]|CUDA[01] model buffer" "$out/completion-$sm-flashrt.err" || true)
        say "-sm $sm: overlay vs disabled: $(same $sm-flashrt $sm-disabled); $(hits $sm-flashrt)$(grep -o 'repack cache.*' "$out/stats-$sm-flashrt.txt"); CUDA buffer lines $devices"
    else
        say "-sm $sm: llama-completion FAILED: $(tail -1 "$out/completion-$sm-flashrt.err" "$out/completion-$sm-disabled.err" 2>/dev/null | xargs)"
    fi
done

echo "== 3. bench, two GPUs"
for sm in layer tensor row; do
    if "$xtask" bench --preset qwen36-35b-a3b --arch 90a --tests tg128,pp512 --reps 3 \
            --split-mode $sm --tensor-split 1,1 > "$out/bench-$sm.log" 2>&1; then
        say "bench -sm $sm -ts 1,1:"
        grep -E '^\|' "$out/bench-$sm.log" | tee -a "$out/summary.txt"
    else
        say "bench -sm $sm -ts 1,1 FAILED: $(grep -m2 -iE 'error|does not support' "$out/bench-$sm.log" | xargs)"
    fi
done
cp bench/results/*.json "$out/" 2>/dev/null || true

echo "== 4. parity, one GPU"
for model in full f16gate; do
    model_args=(--preset qwen36-35b-a3b)
    [ $model = f16gate ] && model_args=(--model "$f16")
    if CUDA_VISIBLE_DEVICES=0 "$xtask" parity "${model_args[@]}" --arch 90a \
            --out "$out/parity-$model.tsv" > "$out/parity-$model.log" 2>&1; then
        verdict=pass
    else
        verdict="FAIL: $(grep -m1 '^error' "$out/parity-$model.log")"
    fi
    say "parity $model: $verdict"
    grep -E '^\|' "$out/parity-$model.log" | tee -a "$out/summary.txt"
done

echo
cat "$out/summary.txt"
archive_out multi-gpu
