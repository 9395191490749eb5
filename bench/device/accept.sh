#!/usr/bin/env bash
# The acceptance evidence that is not a bench, in one device call (~10 min cold), for sessions
# whose device time allows one call: the build with the carried vendor tests beside it (and
# gemv-bench's GEMV_AFTER shapes, as ab.sh check runs them), the full test-backend-ops suite with
# every window forced on (at most TBO_LIMIT seconds, 200 by default), cargo xtask profile of the
# default (stock against the overlay), then 40-layer parity while time is left. Each step is
# packed as it ends (all.tgz), so a call cut off at its limit still returns what it had.
# LIMIT: the call's seconds (585 by default): parity gets what is left of them.
# STEPS: the steps to run, of "check tbo profile parity" (the default, in that order). Without
# check, test-backend-ops builds only itself (~200 s cold on the device's 16 cores): STEPS=tbo is
# the suite alone, for a session left with ~5 minutes of device time.
# Usage (device, repository root): [LIMIT=S] [STEPS="..."] [GEMV_AFTER=NAME GEMV_AFTER_SHAPES=...] bench/device/accept.sh
# Needs .xtask/device/ carried (bench/README.md).
set -uo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
. bench/device/lib.sh
device_setup accept || exit 1
start=$(date +%s)
bin=.xtask/build/llama.cpp-flashrt-sm90a/bin
model=/tmp/models/qwen36.gguf

steps=" ${STEPS:-check tbo profile parity} "
runs() { [[ "$steps" == *" $1 "* ]]; }
model_ready() {
    [ -f "$model" ] || "$xtask" synth --preset qwen36-35b-a3b --out "$model" > "$out/synth.log" 2>&1
}

# 1. ab.sh check without the FlashRT cases and the bench: the build, the vendor tests, gemv-bench.
if runs check; then
    OUT=$out/check CASES=0 BENCH=0 TESTS_WITH= timeout 360 bash bench/device/ab.sh check > "$out/check.log" 2>&1
    cat "$out/check/summary.txt" >> "$out/summary.txt" 2>/dev/null
    [ -x "$bin/llama-bench" ] || { say "no build: see check.log"; archive_out accept; exit 1; }
    model_ready
    archive_out accept
fi

# 2. The full test-backend-ops suite, every window forced on (its FlashRT cases first).
if runs tbo; then
    timeout "${TBO_LIMIT:-200}" "$xtask" test-backend-ops --arch 90a --full -j 16 > "$out/tbo-full.txt" 2>&1
    say "test-backend-ops --full (rc $?): $(grep -E 'tests passed|FAIL' "$out/tbo-full.txt" | head -5 | tr '\n' ' ')"
    # Every case's line is in the build's log (passed or not): the lines that are not a pass or a
    # case the backend does not support, kept.
    log=${bin%/bin}/test-backend-ops.log
    [ -f "$log" ] && sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -vE 'OK$|^ *$|not supported|^ggml_backend_cuda_graph_compute' | gzip > "$out/tbo-full-not-ok.txt.gz"
    say "tbo: $(( $(date +%s) - start )) s"
    archive_out accept
fi

# 3. The profile of the default against stock.
if runs profile; then
    model_ready
    "$xtask" profile --model "$model" --arch 90a > "$out/profile.log" 2>&1
    results=$(results_dir "$out/profile.log")
    [ -n "$results" ] && tar -czf "$out/profile.tgz" -C "$(dirname "$results")" "$(basename "$results")"
    say "profile: $(grep -E 'kernels per step|GPU busy|quantize_q8_1' "$out/profile.log" | tr -s ' ' | tr '\n' ' ')"
    say "profile: $(( $(date +%s) - start )) s"
    archive_out accept
fi

# 4. 40-layer parity with what is left of the call.
left=$(( ${LIMIT:-585} - ($(date +%s) - start) ))
if runs parity && [ "$left" -gt 60 ]; then
    model_ready
    timeout "$left" "$xtask" parity --model "$model" --arch 90a > "$out/parity-qwen36.log" 2>&1
    say "parity qwen36 (rc $?): $(grep -E '^\| overlay vs stock' "$out/parity-qwen36.log") $(tail -1 "$out/parity-qwen36.log")"
fi
archive_out accept
rm -rf "$out/check"  # inside all.tgz
find "$out" -mindepth 1 ! -name all.tgz ! -name summary.txt -delete
echo; cat "$out/summary.txt"
