#!/usr/bin/env bash
# The default configuration against one experiment, in two device calls made within 30 s of each
# other (the second finds the first's build):
#   ab.sh check     build (test-backend-ops, llama-bench) while the carried vendor tests run and the
#                   synthetic qwen36 GGUF is written; the FlashRT cases with every window forced on
#                   (once more with the experiment's settings when AB is set); cargo xtask bench
#                   --rounds 3 tg128 of stock, the default and the experiment interleaved (--also),
#                   then 4-layer parity of the default (~9 min cold)
#   ab.sh compare   cargo xtask profile of the default and of the experiment, then 40-layer parity
#                   of the default (~4 min)
# AB: the experiment's settings, e.g. AB="GGML_FLASHRT_HEAD_KERNEL=0" (several: space-separated).
# Needs .xtask/device/ carried (bench/README.md) with vendor-tests.tar.xz: the vendor tests built on
# a CPU machine with the pip nvcc (nvcc -std=c++17 -arch=sm_90a -I vendor/csrc TEST vendor objects),
# packed with `tar -cf - test-* | xz -9 -T1`.
# Usage (device, repository root): AB="..." bench/device/ab.sh check|compare; a short table last,
# every file in $OUT/all.tgz.
set -uo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
phase=${1:?usage: AB=\"ENV=VALUE ...\" bench/device/ab.sh check|compare}
read -r -a ab <<< "${AB:-}"
. bench/device/lib.sh
device_setup "ab-$phase" || exit 1
start=$(date +%s)
bin=.xtask/build/llama.cpp-flashrt-sm90a/bin
model=/tmp/models/qwen36.gguf
mkdir -p /tmp/models /tmp/vendor-tests

profile() {  # NAME [ENV=VALUE ...]: cargo xtask profile under the settings, its results packed
    local name=$1
    shift
    env "$@" "$xtask" profile --model "$model" --arch 90a > "$out/profile-$name.log" 2>&1
    local results
    results=$(results_dir "$out/profile-$name.log")
    [ -n "$results" ] && tar -czf "$out/profile-$name.tgz" -C "$(dirname "$results")" "$(basename "$results")"
    say "profile $name: $(grep -E 'kernels per step|GPU busy' "$out/profile-$name.log" | tr -s ' ' | tr '\n' ' ')"
}

parity() {  # MODEL
    local log
    log="$out/parity-$(basename "$1" .gguf).log"
    "$xtask" parity --model "$1" --arch 90a > "$log" 2>&1
    say "parity $(basename "$1"): $(grep -E '^\| overlay vs stock' "$log") $(tail -1 "$log")"
}

case $phase in
check)
    "$xtask" build --arch 90a --targets test-backend-ops,llama-bench > "$out/build.log" 2>&1 &
    build=$!
    [ -f "$model" ] || "$xtask" synth --preset qwen36-35b-a3b --out "$model" > "$out/synth.log" 2>&1 &
    synth=$!
    tar -xJf .xtask/device/vendor-tests.tar.xz -C /tmp/vendor-tests
    for t in /tmp/vendor-tests/test-*; do
        "$t" > "$out/$(basename "$t").txt" 2>&1
        grep -E "^FAIL" "$out/$(basename "$t").txt" | head -5
        say "$(basename "$t"): $(tail -1 "$out/$(basename "$t").txt")"
    done
    wait $build || { tail -30 "$out/build.log"; say "build FAILED"; exit 1; }
    say "build: $(( $(date +%s) - start )) s"
    settings=(default)
    [ ${#ab[@]} -gt 0 ] && settings+=(ab)
    for s in "${settings[@]}"; do
        (
            for w in "${gemv_windows[@]}" SHEXP_GATE MOE_TAIL ATTN_ROPE MOE_TOPK ATTN_DECODE; do export "FRT_${w}_SWAP=1"; done
            [ $s = ab ] && export "${ab[@]}"
            GGML_CUDA_FLASHRT_NO_CACHE=1 FRT_STATS=1 "$bin/test-backend-ops" test -b CUDA0 -o 'FLASHRT_.*' > "$out/tbo-$s.txt" 2>&1
        )
        grep -E "FAIL" "$out/tbo-$s.txt" | head -10
        say "FlashRT cases ($s): $(grep -m1 'tests passed' "$out/tbo-$s.txt" | xargs)"
    done
    wait $synth
    also=()
    [ ${#ab[@]} -gt 0 ] && also=(--also "$(IFS=,; echo "${ab[*]}")")
    "$xtask" bench --model "$model" --arch 90a --rounds 3 --tests tg128 "${also[@]}" > "$out/bench.log" 2>&1
    grep -E '^\| tg128' "$out/bench.log" | while read -r line; do say "bench: $line"; done
    small=/tmp/models/qwen36-l4-e8.gguf
    "$xtask" synth --preset qwen36-35b-a3b --layers 4 --experts 8 --out "$small" > /dev/null 2>&1
    parity "$small"
    ;;
compare)
    [ -x "$bin/llama-bench" ] || { say "no build here: run 'ab.sh check' first, within 30 s"; exit 1; }
    profile default
    [ ${#ab[@]} -gt 0 ] && profile ab "${ab[@]}"
    parity "$model"
    ;;
*)
    echo "ab.sh: phase $phase is not check or compare" >&2
    exit 2
    ;;
esac
cp bench/results/*.json "$out/" 2>/dev/null
archive_out "ab-$phase"
find "$out" -mindepth 1 ! -name all.tgz ! -name summary.txt -delete
echo; cat "$out/summary.txt"
