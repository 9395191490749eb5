#!/usr/bin/env bash
# The MoE tail in the experts' down launch (GGML_FLASHRT_DOWN_TAIL=1, an experiment), in one cold
# device call: build (test-backend-ops, llama-bench) while the carried vendor tests run (test-gemv's
# tail case) and the synthetic qwen36 GGUF is written; the FlashRT cases once with every window
# forced on and the tail in the down launch; cargo xtask bench --rounds 3 tg128 of the tail in the
# down launch with 4- and 40-layer parity, the same of the default (no parity), then cargo xtask
# profile with the tail in the down launch when time is left. (At a79dd2b, where the tail in the
# down launch was the default, the two runs were named default and no-down-tail.)
# Needs .xtask/device/ carried (bench/README.md) with vendor-tests.tar.xz: the vendor tests built on
# a CPU machine with the pip nvcc (nvcc -std=c++17 -arch=sm_90a -I vendor/csrc TEST vendor objects).
# Usage (device, repository root): bench/device/down-tail.sh; a short table last, files in $OUT.
set -uo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
. bench/device/lib.sh
device_setup down-tail || exit 1
start=$(date +%s)
bin=.xtask/build/llama.cpp-flashrt-sm90a/bin
model=/tmp/models/qwen36.gguf
mkdir -p /tmp/models /tmp/vendor-tests
"$xtask" build --arch 90a --targets test-backend-ops,llama-bench > "$out/build.log" 2>&1 &
build=$!
[ -f "$model" ] || "$xtask" synth --preset qwen36-35b-a3b --out "$model" > "$out/synth.log" 2>&1 &
synth=$!
tar -xJf .xtask/device/vendor-tests.tar.xz -C /tmp/vendor-tests
for t in test-gemv test-moe-ffn-tail; do
    /tmp/vendor-tests/$t > "$out/$t.txt" 2>&1
    grep -E "^FAIL|tail" "$out/$t.txt" | head -5
    say "$t: $(tail -1 "$out/$t.txt")"
done
wait $build || { tail -30 "$out/build.log"; say "build FAILED"; exit 1; }
say "build: $(( $(date +%s) - start )) s"
(
    for w in "${gemv_windows[@]}" SHEXP_GATE MOE_TAIL ATTN_ROPE MOE_TOPK ATTN_DECODE; do export "FRT_${w}_SWAP=1"; done
    export GGML_FLASHRT_DOWN_TAIL=1
    GGML_CUDA_FLASHRT_NO_CACHE=1 FRT_STATS=1 "$bin/test-backend-ops" test -b CUDA0 -o 'FLASHRT_.*' > "$out/tbo.txt" 2>&1
)
grep -E "FAIL" "$out/tbo.txt" | head -10
say "FlashRT cases: $(grep -m1 'tests passed' "$out/tbo.txt" | xargs)"
wait $synth
for run in down-tail default; do
    env_run=()
    [ $run = down-tail ] && env_run=(GGML_FLASHRT_DOWN_TAIL=1)
    env "${env_run[@]}" "$xtask" bench --model "$model" --arch 90a --rounds 3 --tests tg128 > "$out/bench-$run.log" 2>&1
    say "bench $run: $(grep -E '^\| tg128' "$out/bench-$run.log")"
    if [ $run = down-tail ]; then
        small=/tmp/models/qwen36-l4-e8.gguf
        "$xtask" synth --preset qwen36-35b-a3b --layers 4 --experts 8 --out "$small" > /dev/null 2>&1
        for m in "$small" "$model"; do
            env "${env_run[@]}" "$xtask" parity --model "$m" --arch 90a > "$out/parity-$(basename "$m" .gguf).log" 2>&1
            say "parity $(basename "$m"): $(grep -E '^\| overlay vs stock' "$out/parity-$(basename "$m" .gguf).log") $(tail -1 "$out/parity-$(basename "$m" .gguf).log")"
        done
    fi
done
cp bench/results/*.json "$out/" 2>/dev/null
if [ $(( $(date +%s) - start )) -lt 500 ]; then
    GGML_FLASHRT_DOWN_TAIL=1 "$xtask" profile --model "$model" --arch 90a > "$out/profile.log" 2>&1
    results=$(results_dir "$out/profile.log")
    [ -n "$results" ] && tar -czf "$out/profile.tgz" -C "$(dirname "$results")" "$(basename "$results")"
    say "profile: $(grep -E 'kernels per step|GPU busy' "$out/profile.log" | tr -s ' ' | tr '\n' ' ')"
else
    say "profile skipped: $(( $(date +%s) - start )) s spent"
fi
archive_out down-tail
find "$out" -mindepth 1 ! -name all.tgz ! -name summary.txt -delete
echo; cat "$out/summary.txt"
