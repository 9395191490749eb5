#!/usr/bin/env bash
# Device smoke run: build llama.cpp at the pin with cargo xtask (flashrt = patched + overlay,
# stock = unpatched), generate tiny random-weight GGUFs with the host's own test-llama-archs, and
# run llama-bench and a greedy llama-completion on them. Prints a short table last.
#
# Usage (on the device, from the repository root):  bench/device/smoke.sh flashrt|stock
# Needs .xtask/device/ carried (see bench/README.md): the release xtask binary and the pinned
# tree from `cargo xtask host pack --out .xtask/device/llama.cpp.tar.xz`.
set -euo pipefail
flavor=${1:?usage: smoke.sh flashrt|stock}
. bench/device/lib.sh
device_setup smoke-out

stock_flag=()
[ "$flavor" = stock ] && stock_flag=(--stock)
start=$(date +%s)
"$xtask" build --host llama.cpp --arch 90a "${stock_flag[@]}" \
    --targets llama-bench,llama-completion,test-llama-archs 2>&1 | tee "$out/build-$flavor.log" | grep -v '^\[' || true
build_s=$(( $(date +%s) - start ))
bin=.xtask/build/llama.cpp-$flavor-sm90a/bin
test -x "$bin/llama-bench" || { echo "build failed: no $bin/llama-bench"; tail -40 "$out/build-$flavor.log"; exit 1; }

models=/tmp/models
mkdir -p "$models"
"$bin/test-llama-archs" -a '^(llama|qwen35moe)$' -s 42 -o "$models" > "$out/models-$flavor.log" 2>&1
sha256sum "$models"/*.gguf | tee "$out/models-$flavor.sha256"

{
    for model in "$models"/llama-dense.gguf "$models"/qwen35moe-moe.gguf; do
        "$bin/llama-bench" -m "$model" -ngl 99 -fa 1 -p 64 -n 64 -r 3 -o md
    done
} 2>"$out/bench-$flavor.err" | tee "$out/bench-$flavor.md"

for model in llama-dense qwen35moe-moe; do
    "$bin/llama-completion" -m "$models/$model.gguf" -ngl 99 -fa on -p "hello world, this is a test" \
        -n 48 --temp 0 -s 1 -no-cnv --no-warmup 2>"$out/completion-$flavor-$model.err" \
        > "$out/completion-$flavor-$model.txt" || { echo "completion failed"; tail -20 "$out/completion-$flavor-$model.err"; exit 1; }
done

echo
echo "| flavor | build s | model | completion sha256 |"
echo "|---|---:|---|---|"
for model in llama-dense qwen35moe-moe; do
    echo "| $flavor | $build_s | $model | $(sha256sum < "$out/completion-$flavor-$model.txt" | cut -c1-16) |"
done
