#!/usr/bin/env bash
# Device benchmark in one call: build llama-bench with the overlay (sm_90a), write the synthetic
# qwen36-35b-a3b GGUF (20.9 GiB), measure the bandwidth, run llama-bench A/B/A
# (GGML_CUDA_FLASHRT_DISABLE=1 / default / disabled) for tg128, pp512 and tg128@d8192, then
# cargo xtask parity on the same file (overlay vs stock against fusion-off vs stock).
# Usage (device, repository root): bench/device/bench.sh [extra cargo-xtask-bench flags, e.g. --sweep]
# Needs .xtask/device/ carried (see bench/README.md). The result JSON is copied to $OUT.
set -euo pipefail
# One GPU: on a multi-GPU machine the single-device numbers come from the first (multi-gpu.sh
# measures the splits).
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
. bench/device/lib.sh
device_setup bench-out
"$xtask" bench --preset qwen36-35b-a3b --arch 90a "$@" 2>&1 | tee "$out/bench.log" | grep -v '^\[' | tail -40
cp bench/results/*.json "$out/"
status=0
"$xtask" parity --preset qwen36-35b-a3b --arch 90a 2>&1 | tee "$out/parity.log" | grep -v '^\[' | tail -12 || status=$?
# The per-position table is written before the verdict: keep it either way.
cp bench/results/*-parity.tsv "$out/" || true
exit $status
