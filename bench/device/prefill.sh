#!/usr/bin/env bash
# Issue 13 on one H200: PREFILL_FA4 (FA4's ahead-of-time attention for prompts) on against off.
#   1. cargo xtask bench --rounds ROUNDS (default 2) of TESTS (default pp512,pp4096,pp16384,
#      pp512@d8192) on the synthetic qwen36 GGUF: the overlay's default (PREFILL_FA4 off) against
#      stock, then with FRT_PREFILL_FA4_SWAP=1 against stock
#   2. cargo xtask parity --prompt 512 with the window on, on the 4-layer model and, when under
#      8 minutes have passed, on the 40-layer one (the prompt's logits, then decode from its cache)
# FRT_STATS from one llama-bench pp512 run shows the window's hits. Prints a short table last.
# Usage (device, repository root): bench/device/prefill.sh. Needs .xtask/device/ carried.
set -euo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
. bench/device/lib.sh
device_setup prefill
model=/tmp/models/qwen36.gguf
small=/tmp/models/qwen36-l4-e8.gguf
tests=${TESTS:-pp512,pp4096,pp16384,pp512@d8192}
start=$(date +%s)
mkdir -p /tmp/models
[ -f "$model" ] || "$xtask" synth --preset qwen36-35b-a3b --out "$model" > "$out/synth.log" 2>&1
[ -f "$small" ] || "$xtask" synth --preset qwen36-35b-a3b --layers 4 --experts 8 --out "$small" > "$out/synth-small.log" 2>&1

for mode in off on; do
    swap=0; [ $mode = on ] && swap=1
    FRT_PREFILL_FA4_SWAP=$swap "$xtask" bench --model "$model" --arch 90a --rounds "${ROUNDS:-2}" --tests "$tests" \
        > "$out/bench-$mode.log" 2>&1 || say "bench, PREFILL_FA4 $mode: FAILED"
    sed -n '/^| test/,/^$/p' "$out/bench-$mode.log" > "$out/bench-$mode.md"
    say "bench done, PREFILL_FA4 $mode: $(( $(date +%s) - start )) s"
done
cp bench/results/*.json "$out/" 2>/dev/null || true

# The window's hits in a prefill (FRT_STATS at exit).
FRT_PREFILL_FA4_SWAP=1 FRT_STATS=1 .xtask/build/llama.cpp-flashrt-sm90a/bin/llama-bench -m "$model" -p 512 -n 0 -r 1 \
    -fa 1 > "$out/stats-run.txt" 2>&1 || say "llama-bench with FRT_STATS: FAILED"
grep -E "FlashRT stats: .*(graph evaluation|PREFILL_FA4|FA4 modules)" "$out/stats-run.txt" | tee -a "$out/summary.txt" || true

FRT_PREFILL_FA4_SWAP=1 "$xtask" parity --model "$small" --arch 90a --prompt 512 --tokens 640 > "$out/parity-small.log" 2>&1 \
    || say "parity --prompt 512 (4-layer): FAILED"
if [ $(( $(date +%s) - start )) -lt 480 ]; then
    FRT_PREFILL_FA4_SWAP=1 "$xtask" parity --model "$model" --arch 90a --prompt 512 --tokens 640 > "$out/parity-40.log" 2>&1 \
        || say "parity --prompt 512 (40-layer): FAILED"
else
    say "parity (40-layer) skipped: $(( $(date +%s) - start )) s spent"
fi

for mode in off on; do
    echo; echo "PREFILL_FA4 $mode:"; cat "$out/bench-$mode.md"
done | tee -a "$out/summary.txt"
for f in parity-small parity-40; do
    [ -f "$out/$f.log" ] && sed -n '/^| pair/,/^parity/p' "$out/$f.log" | tee -a "$out/summary.txt"
done
true
