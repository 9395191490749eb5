#!/usr/bin/env bash
# Builds and runs bench/tools/predicate-check.cu on this machine (no GPU needed): the overlay's
# window predicates against small graphs with known answers. Needs, from the repository root:
#   cargo xtask build --overlay-only     (the overlay's objects, and nvcc)
#   cargo xtask build --cpu --targets test-backend-ops   (ggml-base)
set -euo pipefail
root=$(pwd)
host=$root/.xtask/hosts/llama.cpp/pristine
objects=$root/.xtask/build/llama.cpp-flashrt-sm90a-overlay/ggml/src/ggml-cuda/flashrt/CMakeFiles/ggml-cuda-flashrt.dir
ggml_lib=$root/.xtask/build/llama.cpp-flashrt-cpu/bin
nvcc=${NVCC:-$root/.xtask/toolchains/cuda-13.0.88/nvidia/cu13/bin/nvcc}
for need in "$objects" "$ggml_lib/libggml-base.so" "$nvcc"; do
    [ -e "$need" ] || { echo "missing $need: run the two builds this script's header names" >&2; exit 2; }
done
# Everything but the hooks (flashrt.cu, graph-order.cu), which need ggml-cuda's context.
mapfile -t objs < <(find "$objects" -name '*.o' ! -name 'flashrt.cu.o' ! -name 'graph-order.cu.o')
# An overlay built with FA4 (its CMake wrote the module list): fa4.cu's module table needs the objects.
if [ -f "$objects/../../frt-fa4-modules.h" ]; then
    objs+=("$root"/fa4_aot/objects/sm_90a/*.o)
fi
out=$root/.xtask/tmp/predicate-check
mkdir -p "$(dirname "$out")"
"$nvcc" -std=c++17 -arch=sm_90a -I "$host/ggml/include" -I "$host/ggml/src" -I "$host/ggml/src/ggml-cuda" \
    -I vendor/csrc -I overlay -I overlay/windows bench/tools/predicate-check.cu bench/tools/predicate-stubs.cu \
    "${objs[@]}" -L "$ggml_lib" -lggml-base -o "$out"
# Twice: the default, then with the off-default switches its expectations name.
LD_LIBRARY_PATH=$ggml_lib "$out"
LD_LIBRARY_PATH=$ggml_lib GGML_FLASHRT_HEAD_BATCH=1 "$out"
