#!/usr/bin/env bash
# Decode with several sequences at once, as llama-server runs it under load: llama-batched-bench on
# the synthetic qwen36 GGUF (prompts of 128 tokens, then TG steps of one token a sequence), stock
# against the overlay's default and against variants of it, the variants interleaved in each round
# so that drift hits all alike. The table gives S_TG (decoded tokens a second over all sequences),
# the median over the rounds, and each variant's ratio to stock at the same parallel count.
#   VARIANTS   space-separated NAME=ENV[,ENV...] (default below: the windows that take several
#              tokens kept to one (GGML_FLASHRT_MULTI_TOKEN=0), ATTN_ROPE off, and both modes with
#              CUDA graphs off, the way a server whose batch composition keeps changing evaluates
#              most steps)
#   NPL        parallel sequences (default 1,2,4,8); TG tokens a sequence (default 32); ROUNDS (2)
# Usage (device, repository root): bench/device/batched.sh. Needs .xtask/device/ carried.
set -euo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
. bench/device/lib.sh
device_setup batched
bin=.xtask/build/llama.cpp-flashrt-sm90a/bin
model=/tmp/models/qwen36.gguf

start=$(date +%s)
"$xtask" build --arch 90a --targets llama-batched-bench > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
mkdir -p /tmp/models
[ -f "$model" ] || "$xtask" synth --preset qwen36-35b-a3b --out "$model" > "$out/synth.log" 2>&1
say "build + model: $(( $(date +%s) - start )) s"

variants=${VARIANTS:-"stock=GGML_CUDA_FLASHRT_DISABLE=1 overlay= one-token=GGML_FLASHRT_MULTI_TOKEN=0 no-rope=GGML_FLASHRT_NO_ATTN_ROPE=1 stock-nographs=GGML_CUDA_FLASHRT_DISABLE=1,GGML_CUDA_DISABLE_GRAPHS=1 overlay-nographs=GGML_CUDA_DISABLE_GRAPHS=1"}
npl=${NPL:-1,2,4,8}
tg=${TG:-32}
: > "$out/batched.jsonl"
for round in $(seq 1 "${ROUNDS:-2}"); do
    for v in $variants; do
        name=${v%%=*}
        IFS=, read -r -a envs <<< "${v#*=}"
        if env ${envs[@]+"${envs[@]}"} "$bin/llama-batched-bench" -m "$model" -ngl 99 -c $(( 8 * (128 + tg) + 64 )) \
            -b 2048 -ub 512 -npp 128 -ntg "$tg" -npl "$npl" --output-format jsonl \
            > "$out/run.txt" 2> "$out/run-$name.err"; then
            grep '^{' "$out/run.txt" | sed "s/^{/{\"variant\": \"$name\", \"round\": $round, /" >> "$out/batched.jsonl"
        else
            say "$name round $round FAILED"; tail -5 "$out/run-$name.err"
        fi
    done
    say "round $round: $(( $(date +%s) - start )) s"
done
rm -f "$out/run.txt"

python3 - "$out/batched.jsonl" <<'EOF' | tee -a "$out/summary.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
variants = list(dict.fromkeys(r["variant"] for r in rows))
pls = sorted({r["pl"] for r in rows})
med = {(v, p): statistics.median(r["speed_tg"] for r in rows if r["variant"] == v and r["pl"] == p)
       for v in variants for p in pls if any(r["variant"] == v and r["pl"] == p for r in rows)}
print("\nllama-batched-bench, S_TG tok/s (median of rounds; x: against stock, or stock-nographs for *-nographs)\n")
print("| variant | " + " | ".join(f"{p} seq" for p in pls) + " |")
print("|---|" + "---:|" * len(pls))
for v in variants:
    base = "stock-nographs" if v.endswith("-nographs") else "stock"
    cells = []
    for p in pls:
        s = med.get((v, p))
        b = med.get((base, p))
        cells.append("-" if s is None else f"{s:.1f}" + (f" ({s / b:.3f}x)" if b and v != base else ""))
    print(f"| {v} | " + " | ".join(cells) + " |")
EOF
