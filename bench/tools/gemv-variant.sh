#!/usr/bin/env bash
# Builds one variant of the vendor GEMV kernels for bench/device/gemv-ab.sh on a machine without a
# GPU (the pip nvcc that `cargo xtask build --overlay-only` installs): test-gemv and gemv-bench,
# stripped, into OUT_DIR. SRC is a checkout (this one, or a worktree of another commit); the
# options after it go to nvcc (-D macros of an experiment).
#   bash bench/tools/gemv-variant.sh . .xtask/gemv-new
#   git worktree add /tmp/base REV && bash bench/tools/gemv-variant.sh /tmp/base .xtask/gemv-base
# About 2 minutes on 2 cores; ~22 MB a variant (a device call carries at most 64 MiB).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: gemv-variant.sh SRC OUT_DIR [nvcc options...]" >&2; exit 2; }
src=$1 out=$2
shift 2
nvcc=${NVCC:-$(pwd)/.xtask/toolchains/cuda-13.0.88/nvidia/cu13/bin/nvcc}
[ -x "$nvcc" ] || { echo "no nvcc at $nvcc: run cargo xtask build --overlay-only first, or set NVCC" >&2; exit 2; }
objs=$(mktemp -d)
trap 'rm -rf "$objs"' EXIT
mkdir -p "$out"
pids=()
for f in "$src"/vendor/csrc/*.cu; do
    "$nvcc" -std=c++17 -arch=sm_90a "$@" -I "$src/vendor/csrc" -c "$f" -o "$objs/$(basename "$f" .cu).o" &
    pids+=($!)
done
for pid in "${pids[@]}"; do
    wait "$pid"
done
"$nvcc" -std=c++17 -arch=sm_90a "$@" -I "$src/vendor/csrc" "$src/vendor/csrc/tests/test-gemv.cu" "$objs"/*.o -o "$out/test-gemv"
"$nvcc" -std=c++17 -O3 -arch=sm_90a "$@" -I "$src/vendor/csrc" -I "$src/bench/tools" "$src/bench/tools/gemv-bench.cu" \
    "$objs"/*.o -o "$out/gemv-bench"
strip "$out/test-gemv" "$out/gemv-bench"
echo "$out: $(du -sh "$out" | cut -f1)"
