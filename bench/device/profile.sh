#!/usr/bin/env bash
# Device profile in one call: build llama-bench with the overlay (sm_90a) and the CUPTI injection
# library (bench/tools/cupti-trace.cpp), write the synthetic qwen36-35b-a3b GGUF (20.9 GiB),
# measure the bandwidth, then run llama-bench tg64 for stock and the overlay, untraced and traced
# (cargo xtask profile).
# Usage (device, repository root): bench/device/profile.sh [extra cargo-xtask-profile flags, e.g.
# --window-off GDN_GATED_NORM]
# Needs .xtask/device/ carried (see bench/README.md). $OUT gets profile/ (profile.md, .json, .svg),
# profile.log, and traces.tgz: the raw traces, which `cargo xtask profile --from-traces DIR`
# analyses again on a CPU machine.
set -euo pipefail
# One GPU: the profile is of a single device.
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
. bench/device/lib.sh
device_setup profile-out
traces=/tmp/profile-traces
rm -rf "$traces"
status=0
"$xtask" profile --preset qwen36-35b-a3b --arch 90a --save-traces "$traces" "$@" 2>&1 \
    | tee "$out/profile.log" | grep -v '^\[' | tail -80 || status=$?
# The traces whatever happened to the analysis: it can be redone from them.
if [ -f "$traces/inputs.json" ]; then
    tar -czf "$out/traces.tgz" -C "$traces" .
fi
# The directory this run wrote (the tree may hold older profiles).
results=$(results_dir "$out/profile.log")
if [ -n "$results" ] && [ -d "$results" ]; then
    cp -r "$results" "$out/profile"
    say "profile: $(basename "$results")"
fi
exit $status
