#!/usr/bin/env bash
# Where the GEMV windows lose decode speed and quality, in one device call.
#   diagnose.sh windows   llama-bench on the synthetic qwen36 GGUF, untraced: tg64 and tg512 for
#                         stock and the GEMV windows forced on (a loss paid per capture shrinks
#                         with more tokens), tg64 for the register kernel's FRT_GEMV_LAB variants,
#                         the overlay's default, every window off (the hooks alone), stock / GEMV
#                         windows with PDL off, each GEMV window alone; then cargo xtask parity on
#                         the 4-layer model with each GEMV window alone
#   diagnose.sh verify    the vendor tests and gemv-bench at 1 token (register vs bulk kernel),
#                         meanwhile the build; parity with the GEMV windows on (4-layer, then
#                         40-layer), tg64 stock vs the GEMV windows with FRT_STATS (window hits,
#                         node-loop passes and host time in the begin-graph hook, the launch log,
#                         why HEAD missed), parity with each GEMV window alone (4-layer)
#   diagnose.sh attribute cargo xtask parity on the 4-layer model with MATVEC alone: PDL off, the
#                         register kernel's PDL variants, then limited to one weight role at a
#                         time (GGML_FLASHRT_GEMV_ONLY): which matvec moves the logits off stock's
#   diagnose.sh yardstick flashrt-logits on the 4-layer model for stock, stock with fusion off,
#                         the GEMV windows, attn_qkv alone (GGML_FLASHRT_GEMV_ONLY) and the CPU
#                         backend, each compared with stock (bench/tools/logits-compare.py): how far
#                         another backend's rounding moves the logits; then tg128 stock vs the
#                         GEMV windows on the 40-layer model
#   diagnose.sh exact     the vendor tests and gemv-bench at 1 token (frt, frt-exact), meanwhile
#                         the build; parity on the 4-layer model with the GEMV windows on (the exact
#                         kernel inside the layers, their default), the FlashRT test-backend-ops
#                         cases with every window on, tg128 stock / default / GEMV
#                         windows / GEMV windows on the register kernel, then 40-layer parity
#   diagnose.sh default   the vendor tests and gemv-bench at 1 token (binaries carried in
#                         .xtask/device/gemv when there, else compiled), meanwhile the build; parity on
#                         the 4-layer model in the default configuration, cargo xtask profile (stock vs
#                         default), then 40-layer parity
#   diagnose.sh serve     cargo xtask serve-check on the 40-layer `synth --stable` model (8 slots,
#                         REQUESTS a round, default 256, ROUNDS rounds, default 4): stock alone as
#                         the reference, then stock and the overlay under load;
#                         PARTS=reference,stock and then PARTS=overlay split it over two calls
#   diagnose.sh serve-stats  a short serve-check (REQUESTS 64, ROUNDS 2) of the reference and the
#                         overlay with FRT_STATS=1: the overlay server's host time per window
#   diagnose.sh multiseq  decode with several sequences, as llama-server runs it under load:
#                         llama-batched-bench (prompts of 128, BB_TG tokens generated, default 32,
#                         1/2/4/8 sequences), ROUNDS rounds (default 2) of: stock, the default,
#                         GGML_FLASHRT_MULTI_TOKEN=0, ATTN_ROPE off, every window off, and stock
#                         and the default without CUDA graphs; medians and ratios to stock
#                         (bench/tools/bb-table.py), the default's FRT_STATS
# Usage (device, repository root): bench/device/diagnose.sh windows|verify|attribute|yardstick|exact|default|serve|serve-stats|multiseq. Needs .xtask/device/
# carried. Steps that would start after DEADLINE seconds (default 330) are skipped and say so.
set -euo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
mode=${1:?usage: diagnose.sh windows|verify|attribute|yardstick|exact|default|serve|serve-stats|multiseq}
. bench/device/lib.sh
device_setup "diagnose-$mode"
start=$(date +%s)
deadline=${DEADLINE:-330}
model=/tmp/models/qwen36.gguf small=/tmp/models/qwen36-l4-e8.gguf
bin=.xtask/build/llama.cpp-flashrt-sm90a/bin
late() { [ $(( $(date +%s) - start )) -gt "$deadline" ] && say "skipped (past ${deadline} s): $*"; }

mkdir -p /tmp/models
[ -f "$model" ] || "$xtask" synth --preset qwen36-35b-a3b --out "$model" > "$out/synth.log" 2>&1 &
synth=$!
[ -f "$small" ] || "$xtask" synth --preset qwen36-35b-a3b --layers 4 --experts 8 --out "$small" >> "$out/synth.log" 2>&1
gemv_tests=0
case $mode in verify | exact | default) gemv_tests=1 ;; esac
if [ $gemv_tests = 1 ]; then
    prebuilt=
    [ -x .xtask/device/gemv/test-gemv ] && prebuilt=.xtask/device/gemv
    GEMV_PREBUILT=$prebuilt OUT=$out/gemv bash bench/device/gemv.sh --tokens 1 > "$out/gemv.log" 2>&1 &
    tests=$!
fi
targets=llama-bench,llama
[ "$mode" = exact ] && targets=$targets,test-backend-ops
case $mode in serve | serve-stats) targets=$targets,llama-server ;; esac
[ "$mode" = multiseq ] && targets=$targets,llama-batched-bench
"$xtask" build --arch 90a --targets "$targets" > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
wait $synth
say "build + models: $(( $(date +%s) - start )) s"
if [ $gemv_tests = 1 ]; then
    if wait $tests; then r=ok; else r=FAILED; fi
    say "vendor tests + gemv-bench: $r"; grep -E "^test-|^gemv-bench" "$out/gemv/summary.txt" | tee -a "$out/summary.txt" || true
    # Register vs bulk kernel per shape, 1 token.
    grep -E "^\|( shape|---| [a-z_]+ \| frt)" "$out/gemv/gemv-bench.md" | cut -d'|' -f2-8,11 | tee -a "$out/summary.txt" || true
fi

all_windows=(GDN GDN_GATED_NORM SHEXP_GATE "${gemv_windows[@]}")
swaps() { for w in "$@"; do printf 'FRT_%s_SWAP=1 ' "$w"; done; }
offs() { for w in "$@"; do printf 'GGML_FLASHRT_NO_%s=1 ' "$w"; done; }
# tg64 (TG_N tokens), 3 repetitions: name, then the environment.
tg() {
    local name=$1; shift
    late "tg $name" && return 0
    local ts
    ts=$(env "$@" "$bin/llama-bench" -m "$model" -ngl 99 -fa 1 -p 0 -n "${TG_N:-64}" -r 3 -o jsonl 2> "$out/tg-$name.err" \
        | python3 -c 'import json,sys; r=[json.loads(l) for l in sys.stdin if l.strip()]; print("%.1f" % r[-1]["avg_ts"])' \
        || echo failed)
    say "| $name | $ts |"
}
# cargo xtask parity: name, model, then the environment.
parity() {
    local name=$1 m=$2; shift 2
    late "parity $name" && return 0
    if env FRT_STATS=1 "$@" "$xtask" parity --model "$m" --arch 90a > "$out/parity-$name.log" 2>&1; then v=pass; else v=FAIL; fi
    # Position 0 has no history: a difference there is the decode step's own.
    row=$(grep '^| overlay vs stock' "$out/parity-$name.log" | awk -F'|' '{print $4 "|" $5 "|" $7}')
    ref=$(grep '^| fusion off vs stock' "$out/parity-$name.log" | awk -F'|' '{print $5}')
    say "| $name | $row | $ref | $v |"
}
# llama-batched-bench's decode tok/s at 1, 2, 4 and 8 sequences: name, then the environment.
# llama-batched-bench, one run: name, then the environment; its rows go to bb.jsonl, tagged.
bb() {
    local name=$1; shift
    late "batched-bench $name" && return 0
    if env "$@" "$bin/llama-batched-bench" -m "$model" -c 4096 -b 2048 -ub 512 -npp 128 -ntg "${BB_TG:-32}" \
        -npl 1,2,4,8 -ngl 99 -fa on --output-format jsonl > "$out/bb-$name.txt" 2>&1; then
        grep '^{"n_kv_max"' "$out/bb-$name.txt" | sed "s/^{/{\"setting\": \"$name\", \"round\": $round, /" >> "$out/bb.jsonl"
    else
        say "batched-bench $name, round $round: FAILED"; tail -5 "$out/bb-$name.txt"
    fi
}
parity_header() {
    say "| parity | NMSE at position 0 | mean NMSE overlay vs stock | top-1 overlay | fusion off vs stock | verdict |"
    say "|---|---:|---:|---:|---:|---|"
}

# shellcheck disable=SC2046  # one word per switch
case $mode in
windows)
    # Most telling first: a step that would start past DEADLINE is skipped.
    say "| setting | tg64 tok/s |"
    say "|---|---:|"
    tg stock GGML_CUDA_FLASHRT_DISABLE=1
    tg gemv-on $(swaps "${gemv_windows[@]}")
    # Captures are paid per run, not per token: if the loss is the windows' host time at capture,
    # it shrinks over 512 tokens.
    TG_N=512 tg stock-tg512 GGML_CUDA_FLASHRT_DISABLE=1
    TG_N=512 tg gemv-on-tg512 FRT_STATS=1 $(swaps "${gemv_windows[@]}")
    grep -h "FlashRT stats: host time" "$out/tg-gemv-on-tg512.err" | tee -a "$out/summary.txt" || true
    # The register kernel's PDL use: dependents launched at its exit instead of after its prologue
    # (FRT_GEMV_LAB=1), nothing read before its wait for the previous kernel (2).
    tg gemv-on-trigger-at-exit FRT_GEMV_LAB=1 $(swaps "${gemv_windows[@]}")
    tg gemv-on-no-preload FRT_GEMV_LAB=2 $(swaps "${gemv_windows[@]}")
    tg default GGML_CUDA_FLASHRT_DISABLE=0
    tg windows-off $(offs "${all_windows[@]}")
    tg stock-pdl0 GGML_CUDA_FLASHRT_DISABLE=1 GGML_CUDA_PDL=0
    tg gemv-on-pdl0 GGML_CUDA_PDL=0 $(swaps "${gemv_windows[@]}")
    for w in "${gemv_windows[@]}"; do
        tg "$w-alone" $(swaps "$w")
    done
    parity_header
    for w in "${gemv_windows[@]}"; do
        parity "$w alone, 4 layers" "$small" $(swaps "$w")
    done
    ;;
verify)
    parity_header
    parity "GEMV windows, 4 layers" "$small" $(swaps "${gemv_windows[@]}")
    say "| setting | tg64 tok/s |"
    say "|---|---:|"
    tg stock GGML_CUDA_FLASHRT_DISABLE=1
    tg gemv-on FRT_STATS=1 GGML_FLASHRT_DEBUG=1 GGML_FLASHRT_LAUNCH_LOG=$out/gemv-on.launches $(swaps "${gemv_windows[@]}")
    # The launches of the last capture: which matvecs each one served (a pack that split shows up
    # as single roles).
    if [ -f "$out/gemv-on.launches" ]; then
        last=$(tail -1 "$out/gemv-on.launches" | cut -f1)
        awk -F'\t' -v p="$last" '$1 == p {r = $4; gsub(/blk\.[0-9]+\./, "", r); gsub(/\.weight/, "", r); n[$2 " | " r]++}
            END {for (k in n) print n[k] " x " k}' \
            "$out/gemv-on.launches" | sort -rn | head -30 | tee -a "$out/summary.txt"
        say "launches in that capture: $(awk -F'\t' -v p="$last" '$1 == p' "$out/gemv-on.launches" | wc -l)"
    fi
    grep -h "FlashRT stats: " "$out/tg-gemv-on.err" | grep -v "hits        0" | tee -a "$out/summary.txt" || true
    # Why the LM head's window missed, if it did.
    grep -h "HEAD" "$out/tg-gemv-on.err" | grep -v "FlashRT stats" | sort | uniq -c | sort -rn | head -5 \
        | tee -a "$out/summary.txt" || true
    parity_header
    for w in "${gemv_windows[@]}"; do
        parity "$w alone, 4 layers" "$small" $(swaps "$w")
    done
    parity "GEMV windows, 40 layers" "$model" $(swaps "${gemv_windows[@]}")
    ;;
attribute)
    parity_header
    parity "MATVEC alone" "$small" FRT_MATVEC_SWAP=1
    parity "MATVEC alone, PDL off" "$small" FRT_MATVEC_SWAP=1 GGML_CUDA_PDL=0
    parity "MATVEC alone, dependents at exit, no preload" "$small" FRT_MATVEC_SWAP=1 FRT_GEMV_LAB=3
    for role in attn_qkv attn_gate ssm_alpha,ssm_beta ssm_out ffn_gate_inp. ffn_gate_inp_shexp \
        ffn_gate_exps,ffn_up_exps ffn_down_exps ffn_gate_shexp,ffn_up_shexp ffn_down_shexp \
        attn_q.,attn_k.,attn_v. attn_output output.weight; do
        parity "MATVEC on $role" "$small" FRT_MATVEC_SWAP=1 GGML_FLASHRT_GEMV_ONLY=$role
    done
    ;;
yardstick)
    parity_header
    parity "GEMV windows, 4 layers" "$small" $(swaps "${gemv_windows[@]}")  # also builds flashrt-logits
    text=.xtask/hosts/llama.cpp/pristine/README.md
    logits() {  # name, then the environment
        local name=$1; shift
        late "logits $name" && return 0
        env "$@" "$bin/flashrt-logits" "$small" "$text" 256 "/tmp/$name.logits" "${NGL:-99}" \
            > "$out/logits-$name.log" 2>&1 || say "logits $name FAILED"
    }
    logits stock GGML_CUDA_FLASHRT_DISABLE=1
    logits fusion-off GGML_CUDA_FLASHRT_DISABLE=1 GGML_CUDA_DISABLE_FUSION=1
    logits gemv-on FRT_STATS=1 GGML_FLASHRT_LAUNCH_LOG=$out/gemv-on.launches $(swaps "${gemv_windows[@]}")
    logits attn-qkv-alone FRT_MATVEC_SWAP=1 GGML_FLASHRT_GEMV_ONLY=attn_qkv
    NGL=0 logits cpu CUDA_VISIBLE_DEVICES=
    runs=()
    for r in fusion-off gemv-on attn-qkv-alone cpu; do
        [ -f "/tmp/$r.logits" ] && runs+=("$r=/tmp/$r.logits")
    done
    python3 bench/tools/logits-compare.py /tmp/stock.logits "${runs[@]}" | tee -a "$out/summary.txt"
    # Which node-loop passes launched GEMV kernels (pass 1 serves position 0).
    [ -f "$out/gemv-on.launches" ] && cut -f1 "$out/gemv-on.launches" | uniq -c | head -5 | tee -a "$out/summary.txt"
    say "| setting | tg128 tok/s |"
    say "|---|---:|"
    TG_N=128 tg stock GGML_CUDA_FLASHRT_DISABLE=1
    TG_N=128 tg default GGML_CUDA_FLASHRT_DISABLE=0
    TG_N=128 tg gemv-on $(swaps "${gemv_windows[@]}")
    ;;
exact)
    parity_header
    parity "GEMV windows, 4 layers" "$small" $(swaps "${gemv_windows[@]}")
    grep -h "FAIL" "$out/gemv/tests.txt" | head -10 | tee -a "$out/summary.txt" || true
    # The FlashRT whole-graph cases with every window on (the GEMV windows on the exact kernel).
    if env GGML_CUDA_FLASHRT_NO_CACHE=1 $(swaps "${all_windows[@]}") "$bin/test-backend-ops" test -b CUDA0 -o 'FLASHRT_.*' > "$out/tbo.txt" 2>&1; then
        say "test-backend-ops FLASHRT: $(grep -m1 'tests passed' "$out/tbo.txt" | xargs)"
    else
        say "test-backend-ops FLASHRT: FAILED"; grep -E "FAIL" "$out/tbo.txt" | head -8 | tee -a "$out/summary.txt"
    fi
    say "| setting | tg128 tok/s |"
    say "|---|---:|"
    TG_N=128 tg stock GGML_CUDA_FLASHRT_DISABLE=1
    TG_N=128 tg default GGML_CUDA_FLASHRT_DISABLE=0
    TG_N=128 tg gemv-on-exact FRT_STATS=1 GGML_FLASHRT_LAUNCH_LOG=$out/gemv-on.launches $(swaps "${gemv_windows[@]}")
    TG_N=128 tg gemv-on-registers GGML_FLASHRT_GEMV_KERNEL=registers $(swaps "${gemv_windows[@]}")
    grep -h "FlashRT stats: " "$out/tg-gemv-on-exact.err" | grep -v "hits        0" | tee -a "$out/summary.txt" || true
    parity_header
    parity "GEMV windows, 40 layers" "$model" $(swaps "${gemv_windows[@]}")
    ;;
default)
    parity_header
    parity "default, 4 layers" "$small"
    grep -h "FAIL" "$out/gemv/tests.txt" | head -10 | tee -a "$out/summary.txt" || true
    if ! late profile; then
        "$xtask" profile --model "$model" --arch 90a > "$out/profile.log" 2>&1 || say "profile FAILED"
        results=$(results_dir "$out/profile.log")
        if [ -n "$results" ] && [ -d "$results" ]; then
            cp -r "$results" "$out/profile"
            sed -n '/^## Per decode step/,/^## Kernel families/p' "$results/profile.md" | grep '^|' | tee -a "$out/summary.txt"
        fi
    fi
    parity_header
    parity "default, 40 layers" "$model"
    ;;
serve)
    if ! late serve-check; then
        # PARTS=reference,stock then PARTS=overlay: the check in two calls (a call stops at 10
        # minutes), its progress kept in .xtask/serve-progress (ignored; carry it to a cold machine).
        "$xtask" serve-check --arch 90a --requests "${REQUESTS:-256}" --rounds "${ROUNDS:-4}" \
            ${PARTS:+--resume .xtask/serve-progress --parts "$PARTS"} \
            > "$out/serve-check.log" 2>&1 || say "serve-check FAILED"
        grep -h "^serve-check: " "$out/serve-check.log" | tee -a "$out/summary.txt" || true
        cp .xtask/serve-progress/*.json "$out/" 2>/dev/null || true
        grep -v '^\[' "$out/serve-check.log" | sed -n '/^| mode/,/^Verdict/p' | tee -a "$out/summary.txt"
        cp bench/results/*serve-check.* "$out/" 2>/dev/null || true
    fi
    ;;
serve-stats)
    # Where the overlay's host time goes under serve-check's load: FRT_STATS from the overlay's
    # server at its exit (predicate and run time per window). A short run of the reference and the
    # overlay in a directory of its own; not an acceptance run.
    if ! late serve-stats; then
        rm -rf /tmp/serve-stats
        FRT_STATS=1 "$xtask" serve-check --arch 90a --requests "${REQUESTS:-64}" --rounds "${ROUNDS:-2}" \
            --resume /tmp/serve-stats --parts reference,overlay > "$out/serve-stats.log" 2>&1 || say "serve-check FAILED"
        cp .xtask/serve-check/overlay.log "$out/" 2>/dev/null || true
        grep -h "FlashRT stats" "$out/overlay.log" | tee -a "$out/summary.txt" || say "no FlashRT stats in overlay.log"
    fi
    ;;
multiseq)
    # Rounds interleave the settings, so that drift between runs hits them alike; the table has
    # each setting's median over the rounds and its ratio to stock (the *-nographs ones to stock
    # without CUDA graphs: a server whose batch keeps changing evaluates most steps directly).
    : > "$out/bb.jsonl"
    for round in $(seq 1 "${ROUNDS:-2}"); do
        bb stock GGML_CUDA_FLASHRT_DISABLE=1
        bb default FRT_STATS=1
        bb one-token GGML_FLASHRT_MULTI_TOKEN=0
        bb head-batch GGML_FLASHRT_HEAD_BATCH=1
        bb no-rope GGML_FLASHRT_NO_ATTN_ROPE=1
        bb windows-off $(offs "${all_windows[@]}" ATTN_ROPE MOE_TOPK MOE_TAIL)
        bb stock-nographs GGML_CUDA_FLASHRT_DISABLE=1 GGML_CUDA_DISABLE_GRAPHS=1
        bb default-nographs GGML_CUDA_DISABLE_GRAPHS=1
        say "batched-bench round $round: $(( $(date +%s) - start )) s"
    done
    python3 bench/tools/bb-table.py "$out/bb.jsonl" | tee -a "$out/summary.txt"
    grep -hE "FlashRT stats" "$out/bb-default.txt" | tail -20 | tee -a "$out/summary.txt" || true
    ;;
*)
    echo "usage: diagnose.sh windows|verify|attribute|yardstick|exact|default|serve|serve-stats|multiseq"; exit 2 ;;
esac
# Few files come back from the device: everything in one archive, beside the summary.
tar -czf /tmp/diagnose.tgz -C "$out" . && cp "$out/summary.txt" /tmp/diagnose-summary.txt \
    && find "$out" -mindepth 1 -delete && mv /tmp/diagnose.tgz "$out/" && mv /tmp/diagnose-summary.txt "$out/summary.txt"
echo; cat "$out/summary.txt"
