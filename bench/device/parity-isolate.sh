#!/usr/bin/env bash
# Which window moves the logits? cargo xtask parity on one GPU with one window at a time, on the
# 4-layer qwen36-shaped synth model (less chaotic than 40 layers), with F32 and with F16
# shared-expert gates. Usage (device, repository root): bench/device/parity-isolate.sh
set -euo pipefail
export CUDA_VISIBLE_DEVICES=0
. bench/device/lib.sh
device_setup parity-isolate
models=/tmp/models
mkdir -p "$models"
"$xtask" synth --preset qwen36-35b-a3b --layers 4 --experts 8 --out "$models/f32gate.gguf" > /dev/null 2>&1
"$xtask" synth --preset qwen36-35b-a3b --layers 4 --experts 8 --tensor-type ffn_gate_inp_shexp=f16 \
    --out "$models/f16gate.gguf" > /dev/null 2>&1
# run <model> <tag> <env...>: one parity run, its verdict and table.
run() {
    local model=$1 tag=$2
    shift 2
    local verdict=pass
    env "$@" "$xtask" parity --model "$models/$model.gguf" --arch 90a --out "$out/$model-$tag.tsv" \
        > "$out/$model-$tag.log" 2>&1 || verdict="FAIL ($(grep -m1 '^error' "$out/$model-$tag.log" | cut -c1-120))"
    {
        echo "$model, $tag: $verdict"
        grep -E '^\| (overlay|fusion)' "$out/$model-$tag.log" || true
    } | tee -a "$out/summary.txt"
}
for model in f32gate f16gate; do
    run $model gdn-only FRT_SHEXP_GATE_SWAP=0
    run $model shexp-only FRT_SHEXP_GATE_SWAP=1 GGML_FLASHRT_NO_GDN_GATED_NORM=1
done
archive_out parity-isolate
