#!/usr/bin/env bash
# Grid barrier against kernel boundary (bench/tools/barrier-bench.cu): compiles it with the
# device's nvcc (~20 s) and runs it (a few seconds); the table goes to $OUT/barrier-bench.md.
# Usage (device, repository root): bench/device/barrier.sh [barrier-bench options]
set -euo pipefail
out=${OUT:-/tmp/barrier}
mkdir -p "$out"
build=$(mktemp -d /tmp/barrier-build.XXXXXX)
# The first errors name the cause; the rest follow from it.
if ! nvcc -std=c++17 -O3 -arch=sm_${GEMV_ARCH:-90a} -I vendor/csrc -I bench/tools bench/tools/barrier-bench.cu \
    vendor/csrc/pdl.cu -o "$build/barrier-bench" > "$out/barrier-build.log" 2>&1; then
    head -40 "$out/barrier-build.log"
    echo "barrier-bench: compile FAILED (whole log: $out/barrier-build.log)"
    exit 1
fi
"$build/barrier-bench" "$@" | tee "$out/barrier-bench.md"
