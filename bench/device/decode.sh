#!/usr/bin/env bash
# The decode GEMV work on one H200, in three calls that follow each other within the device's warm
# period (the build directory stays between them):
#   check    build (flashrt: test-backend-ops, llama-bench, llama-completion) while the vendor kernel
#            tests and gemv-bench run; then the FlashRT test-backend-ops cases REPEAT times in a row
#            (default 10), every window forced on; FULL=1 then runs the whole upstream suite too
#            (cargo xtask test-backend-ops --full). GEMV=0 skips the kernel tests and gemv-bench,
#            GEMV_ARGS passes options to gemv-bench (e.g. "--tokens 1")
#   profile  the synthetic qwen36 GGUF; gemv-stock (stock ggml-cuda per matvec shape, joined with
#            gemv-bench's table); cargo xtask profile, stock vs the overlay's default configuration
#            (switches in the environment reach the overlay's runs)
#   bench    cargo xtask bench --rounds 3 (tg128, pp512, tg128@d8192), the default configuration;
#            parity on the 4-layer model, then on the 40-layer one when under 7 minutes have passed;
#            TESTS=tg128 (say) times fewer tests for a quicker A/B, PARITY=0 skips parity
#   debug    llama-bench tg4 on the synthetic qwen36 GGUF with GGML_FLASHRT_DEBUG=1 (each
#            "declined" line on stderr, counted) and GGML_FLASHRT_DUMP (the decode graph's nodes
#            in the overlay's order, with the window that takes each)
# Usage (device, repository root): bench/device/decode.sh check|profile|bench|debug
# Needs .xtask/device/ carried (see bench/README.md). Each phase prints a short table last and
# leaves its files in $OUT.
set -euo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
phase=${1:?usage: decode.sh check|profile|bench|debug}
. bench/device/lib.sh
device_setup "decode-$phase"
# Few files come back from the device: whatever happens, everything in one archive plus the summary.
pack_out() {
    tar -czf "/tmp/decode-$phase.tgz" -C "$out" . && cp "$out/summary.txt" "/tmp/decode-$phase-summary.txt" \
        && find "$out" -mindepth 1 -delete && mv "/tmp/decode-$phase.tgz" "/tmp/decode-$phase-summary.txt" "$out/"
}
trap pack_out EXIT
keep=/tmp/decode-keep   # survives between the phases' calls on a warm machine
mkdir -p "$keep"
model=/tmp/models/qwen36.gguf
bin=.xtask/build/llama.cpp-flashrt-sm90a/bin

case $phase in
check)
    start=$(date +%s)
    "$xtask" build --arch 90a --targets test-backend-ops,llama-bench > "$out/build.log" 2>&1 &
    build=$!
    # Vendor tests and gemv-bench meanwhile (nvcc, their own binaries): bench/device/gemv.sh.
    # GEMV=0 skips them (a run that only checks the overlay).
    if [ "${GEMV:-1}" != 0 ]; then
        # shellcheck disable=SC2086  # GEMV_ARGS: gemv-bench options (e.g. --tokens 1)
        if OUT=$out/gemv bash bench/device/gemv.sh ${GEMV_ARGS:-} > "$out/gemv.log" 2>&1; then r=ok; else r=FAILED; fi
        cat "$out/gemv/summary.txt" >> "$out/summary.txt" || true
        say "vendor tests + gemv-bench: $r"
        cp "$out/gemv/gemv-bench.jsonl" "$keep/gemv-ours.jsonl" 2>/dev/null || true
        tail -40 "$out/gemv.log"
    fi
    wait $build || { tail -40 "$out/build.log"; exit 1; }
    say "flashrt build: $(( $(date +%s) - start )) s"
    # The FlashRT cases, REPEAT times: a case that fails by the draw of its inputs shows up here.
    for w in "${gemv_windows[@]}" SHEXP_GATE MOE_TAIL ATTN_ROPE MOE_TOPK ATTN_DECODE PREFILL_FA4 VIT_FA4; do export "FRT_${w}_SWAP=1"; done
    export GGML_CUDA_FLASHRT_NO_CACHE=1
    passes=0
    for round in $(seq 1 "${REPEAT:-10}"); do
        if FRT_STATS=1 "$bin/test-backend-ops" test -b CUDA0 -o 'FLASHRT_.*' > "$out/tbo-$round.txt" 2>&1; then
            passes=$((passes + 1))
        else
            grep -E "FAIL|ERR" "$out/tbo-$round.txt" | head -10
        fi
        say "test-backend-ops FLASHRT round $round: $(grep -m1 'tests passed' "$out/tbo-$round.txt" | xargs)"
    done
    { grep -E "FlashRT stats:   " "$out/tbo-1.txt" || true; } | awk '{print "hits", $3, $5}' | tee -a "$out/summary.txt"
    # Norm-fed packs computing each matvec where it stands (the path the allocator's reuse takes).
    if GGML_FLASHRT_GEMV_LATE=1 "$bin/test-backend-ops" test -b CUDA0 -o 'FLASHRT_.*' > "$out/tbo-late.txt" 2>&1; then
        say "test-backend-ops FLASHRT, GGML_FLASHRT_GEMV_LATE=1: $(grep -m1 'tests passed' "$out/tbo-late.txt" | xargs)"
    else
        say "test-backend-ops FLASHRT, GGML_FLASHRT_GEMV_LATE=1: FAILED"; grep -E "FAIL" "$out/tbo-late.txt" | head
    fi
    # The paths off the default that move rows, not bits: no guessed experts, the MoE tail in the
    # down launch.
    if GGML_FLASHRT_GUESS_EXPERTS=0 GGML_FLASHRT_DOWN_TAIL=1 GGML_FLASHRT_HEAD_BATCH=1 "$bin/test-backend-ops" test -b CUDA0 -o 'FLASHRT_.*' \
        > "$out/tbo-guess.txt" 2>&1; then
        say "test-backend-ops FLASHRT, GUESS_EXPERTS=0 DOWN_TAIL=1 HEAD_BATCH=1: $(grep -m1 'tests passed' "$out/tbo-guess.txt" | xargs)"
    else
        say "test-backend-ops FLASHRT, GUESS_EXPERTS=0 DOWN_TAIL=1 HEAD_BATCH=1: FAILED"; grep -E "FAIL" "$out/tbo-guess.txt" | head
    fi
    say "FLASHRT cases: $passes of ${REPEAT:-10} rounds passed"
    # The FA4 modules linked into the build (fa4_aot/objects/sm_90a), each against a float64 attention.
    if compgen -G "fa4_aot/objects/sm_90a/*.o" > /dev/null; then
        if "$xtask" build --arch 90a --targets test-fa4 > "$out/build-fa4.log" 2>&1; then
            "$bin/test-fa4" > "$out/test-fa4.txt" 2>&1 || true
            grep -E "^FAIL|error" "$out/test-fa4.txt" | head -10 || true
            say "test-fa4: $(tail -1 "$out/test-fa4.txt")"
        else
            say "test-fa4: build FAILED"; tail -20 "$out/build-fa4.log"
        fi
    fi
    if [ "${FULL:-0}" = 1 ]; then
        "$xtask" test-backend-ops --arch 90a --full -j 16 > "$out/tbo-full.txt" 2>&1 || true
        say "test-backend-ops --full: $(grep -m1 'tests passed' "$out/tbo-full.txt" | xargs)"
        grep -E "FAIL" "$out/tbo-full.txt" | head -10 | tee -a "$out/summary.txt" || true
    fi
    ;;
profile)
    mkdir -p /tmp/models
    [ -f "$model" ] || "$xtask" synth --preset qwen36-35b-a3b --out "$model" > "$out/synth.log" 2>&1
    if [ -f "$keep/gemv-ours.jsonl" ]; then
        GEMV_OURS=$keep/gemv-ours.jsonl OUT=$out/gemv-stock bash bench/device/gemv-stock.sh flashrt \
            > "$out/gemv-stock.log" 2>&1 || say "gemv-stock FAILED (gemv-stock.log)"
        cp "$out/gemv-stock/gemv-table.md" "$out/" 2>/dev/null && tail -25 "$out/gemv-table.md"
        cp "$out/gemv-stock/gemv-table-bulk.md" "$out/" 2>/dev/null && tail -6 "$out/gemv-table-bulk.md"
    fi
    traces=/tmp/profile-traces
    rm -rf "$traces"
    "$xtask" profile --model "$model" --arch 90a --save-traces "$traces" 2>&1 | tee "$out/profile.log" \
        | grep -v '^\[' | tail -60 || say "profile FAILED"
    [ -f "$traces/inputs.json" ] && tar -czf "$out/traces.tgz" -C "$traces" .
    results=$(results_dir "$out/profile.log")
    [ -n "$results" ] && [ -d "$results" ] && tar -czf "$out/profile.tgz" -C "$(dirname "$results")" "$(basename "$results")"
    ;;
bench)
    start=$(date +%s)
    mkdir -p /tmp/models
    [ -f "$model" ] || "$xtask" synth --preset qwen36-35b-a3b --out "$model" > "$out/synth.log" 2>&1
    # TESTS: llama-bench tests for a quicker A/B (e.g. TESTS=tg128); default tg128, pp512, tg128@d8192.
    # ROUNDS (default 3); ALSO=ENV=VALUE[,...]: the overlay with those switches in every round too.
    "$xtask" bench --model "$model" --arch 90a --rounds "${ROUNDS:-3}" ${TESTS:+--tests "$TESTS"} ${ALSO:+--also "$ALSO"} \
        2>&1 | tee "$out/bench.log" | grep -v '^\[' | tail -30
    cp bench/results/*.json "$out/" 2>/dev/null || true
    # PARITY=0: no parity runs (an A/B of a switch whose path parity checked elsewhere).
    if [ "${PARITY:-1}" != 0 ]; then
        small=/tmp/models/qwen36-l4-e8.gguf
        [ -f "$small" ] || "$xtask" synth --preset qwen36-35b-a3b --layers 4 --experts 8 --out "$small" > "$out/synth-small.log" 2>&1
        "$xtask" parity --model "$small" --arch 90a 2>&1 | tee "$out/parity-small.log" | grep -v '^\[' | tail -12 \
            || say "parity (4-layer) FAILED"
        # The 40-layer parity when the call has time left for it (a device call stops at 10 minutes).
        if [ $(( $(date +%s) - start )) -lt 420 ]; then
            "$xtask" parity --model "$model" --arch 90a 2>&1 | tee "$out/parity-40.log" | grep -v '^\[' | tail -12 \
                || say "parity (40-layer) FAILED"
        else
            say "parity (40-layer) skipped: $(( $(date +%s) - start )) s spent"
        fi
    fi
    ;;
debug)
    mkdir -p /tmp/models
    [ -f "$model" ] || "$xtask" synth --preset qwen36-35b-a3b --out "$model" > "$out/synth.log" 2>&1
    [ -x "$bin/llama-bench" ] || "$xtask" build --arch 90a --targets llama-bench > "$out/build.log" 2>&1
    # GGML_FLASHRT_DUMP_MAX: the first graphs are the warm-up's and the prompt's; decode's follow.
    GGML_FLASHRT_DEBUG=1 GGML_FLASHRT_DUMP="$out/graphs.tsv" GGML_FLASHRT_DUMP_MAX=6 \
        "$bin/llama-bench" -m "$model" -ngl 99 -fa 1 -p 0 -n 4 -r 1 > "$out/debug.log" 2>&1 || say "llama-bench FAILED"
    grep -E "declined|before its turn" "$out/debug.log" | sed 's/node [0-9]* /node N /' | sort | uniq -c | sort -rn \
        | head -30 | tee -a "$out/summary.txt"
    ;;
*)
    echo "usage: decode.sh check|profile|bench|debug"; exit 2 ;;
esac
echo
cat "$out/summary.txt"
