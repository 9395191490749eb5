#!/usr/bin/env bash
# Stock side of the decode GEMV microbenchmark: builds llama.cpp's ggml libraries at the pin
# (flashrt: with the overlay, run with GGML_CUDA_FLASHRT_DISABLE=1; stock: the unpatched tree),
# compiles bench/tools/gemv-stock.cpp against them and times stock ggml-cuda on every weight matvec
# shape of a qwen36-35b-a3b decode step at 1..8 tokens (each shape's unit as the model's graph has it,
# quantize_q8_1 included, from CUDA graph replays). Writes $out/gemv-stock.jsonl and the table; when
# GEMV_OURS names gemv-bench's JSON lines (bench/device/gemv.sh), also the joined table
# (bench/tools/gemv-table.py). Prints the table last.
#
# Usage (device, repository root): bench/device/gemv-stock.sh [flashrt|stock] [gemv-stock options]
#   e.g. bench/device/gemv-stock.sh flashrt --shapes output,attn_qkv --tokens 1
# Needs .xtask/device/ carried (see bench/README.md). About two minutes of runs after the build
# (the build itself: ~4.5 min on 16 cores, skipped when already there).
set -euo pipefail
flavor=${1:-flashrt}
case $flavor in
    flashrt | stock) shift || true ;;
    -*) flavor=flashrt ;;
    *) echo "usage: gemv-stock.sh [flashrt|stock] [gemv-stock options]"; exit 2 ;;
esac
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
. bench/device/lib.sh
device_setup gemv-stock-out

stock_flag=()
[ "$flavor" = stock ] && stock_flag=(--stock)
"$xtask" build --host llama.cpp --arch 90a "${stock_flag[@]}" --targets llama-bench \
    > "$out/build-$flavor.log" 2>&1 || { tail -40 "$out/build-$flavor.log"; exit 1; }
build=$PWD/.xtask/build/llama.cpp-$flavor-sm90a
bin=$build/bin
test -f "$bin/libggml.so" || { echo "no $bin/libggml.so: the build made no shared ggml (BUILD_SHARED_LIBS?)"; exit 1; }

# The compiler and link flags the build was configured with (a driver-stub build needs its
# --allow-shlib-undefined), the pin's public ggml headers.
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
read -r -a link_flags <<< "$(sed -n 's/^CMAKE_EXE_LINKER_FLAGS:[A-Z]*=//p' "$build/CMakeCache.txt")"
tool=$bin/gemv-stock
"${cxx:-c++}" -std=c++17 -O2 -Wall -I.xtask/hosts/llama.cpp/src/ggml/include bench/tools/gemv-stock.cpp \
    -o "$tool" -pthread -L"$bin" -lggml -lggml-base -Wl,-rpath,"$bin" "${link_flags[@]}"

GGML_CUDA_FLASHRT_DISABLE=1 "$tool" "$out/gemv-stock.jsonl" "$@" 2> "$out/gemv-stock.err" \
    | tee "$out/gemv-stock.md" || { tail -20 "$out/gemv-stock.err"; exit 1; }
if [ -n "${GEMV_OURS:-}" ]; then
    python3 bench/tools/gemv-table.py "$out/gemv-stock.jsonl" "$GEMV_OURS" | tee "$out/gemv-table.md"
    if grep -q '"impl":"frt-bulk"' "$GEMV_OURS"; then
        python3 bench/tools/gemv-table.py "$out/gemv-stock.jsonl" "$GEMV_OURS" --impl frt-bulk > "$out/gemv-table-bulk.md"
    fi
fi
archive_out gemv-stock
