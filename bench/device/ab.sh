#!/usr/bin/env bash
# The default configuration against experiments, in two device calls made within 30 s of each
# other (the second finds the first's build):
#   ab.sh check     build (test-backend-ops, llama-bench) while the carried vendor tests run (once
#                   more under each experiment's settings) and the synthetic qwen36 GGUF is
#                   written; the FlashRT cases with every window forced on (once more with each
#                   experiment's settings); cargo xtask bench --rounds 3 tg128 of stock, the
#                   default and the experiments interleaved (--also), then 4-layer parity of the
#                   default (~9 min cold)
#   ab.sh bench     the bench and the parity of `check` alone, on a build that `check` left (for
#                   a check run with BENCH=0 when the two do not fit in one call)
#   ab.sh compare   cargo xtask profile of the default and of each experiment, the default's FlashRT
#                   statistics of a short decode (FRT_STATS: the handoffs and gate folds a captured
#                   graph takes), then 40-layer parity of the default (~4 min, +1 a further experiment)
# AB: the experiments' settings, e.g. AB="GGML_FLASHRT_HEAD_KERNEL=0": within one experiment
# space-separated, experiments separated by ';' (AB="A=1;A=1 B=4"). ROUNDS: bench rounds (3).
# TESTS=tg128@d8192: the tests the experiments are benched at (tg128 by default).
# EXTRA_TESTS="pp512,tg128@d8192": bench (and check without BENCH=0) also runs these tests, the
# default against stock only, ROUNDS rounds (bench-extra.log).
# AB_PARITY=1: the 4-layer parity under each experiment too (for one that is not stock's bits).
# PARITY_TOKENS=N: the parity runs feed N tokens (256 by default; issue 11 asks 1024 on the 4-layer
# model, the recurrent state's drift). SWEEP=1: the bench adds a run without each window (--sweep).
# DEPTH=8192: compare's profiles decode after a prompt of that many tokens (cargo xtask profile --depth).
# PARITY=0: compare skips the 40-layer parity (a call short of time).
# TRACE=1: bench and compare end with the exact kernel's trace of a tg64 run (GGML_FLASHRT_EXACT_TRACE,
# summarised by bench/tools/exact-trace.py: each launch's blocks, phase by phase), of the default and
# under TRACE_WITH="ENV=VALUE ..." when set.
# CASES_WITH="ENV=VALUE ...": check runs the FlashRT cases under these settings (beside the
# default) instead of under each experiment. TESTS_WITH: the settings (';' between them) check runs
# the vendor tests under beside the default instead of each experiment's; TESTS_WITH= none (the
# tests under 5 settings outlast the build: ~75 s a setting). GEMV_HOT=1: check runs gemv-bench's
# exact rows once more with the weights resident in L2 between replays (--stream-mib 0: the most a
# launch can gain from weights prefetched into L2). GEMV_AFTER=NAME: check also runs gemv-bench on
# GEMV_AFTER_SHAPES (default router_pack) with each launch behind one of shape NAME (e.g. ssm_out),
# under the default and each experiment. CASES=0: check skips the FlashRT cases (a bench
# of sources whose cases a call just passed, when build + cases + bench do not fit in one call).
# Needs .xtask/device/ carried (bench/README.md) with vendor-tests.tar.xz: the vendor tests built on
# a CPU machine with the pip nvcc (nvcc -std=c++17 -arch=sm_90a -I vendor/csrc TEST vendor objects),
# packed with `tar -cf - test-* | xz -9 -T1` (gemv-bench beside them, bench/tools/gemv-bench.cu
# linked the same way, adds its exact-kernel rows under each setting; tail-bench, from
# bench/tools/tail-bench.cu, MOE_TAIL's µs under each setting; attn-decode-bench, ATTN_DECODE's
# kernels alone from 8 to 16384 cells, and attn-decode-bench-trace, its phase marks; fifo-probe, from
# bench/tools/fifo-probe.cu, its table).
# ARCHIVE_AT=SECONDS: $OUT/all.tgz is also written that many seconds after the start, so that a call
# cut off by its time limit (e.g. ARCHIVE_AT=560 under `timeout 575`) still brings back every file
# it had then, not only the few the device tool returns loose.
# Usage (device, repository root): AB="..." [BENCH=0] bench/device/ab.sh check|bench|compare; a short
# table last, every file in $OUT/all.tgz.
set -uo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
phase=${1:?usage: AB=\"ENV=VALUE ...\" bench/device/ab.sh check|bench|compare}
IFS=';' read -r -a experiments <<< "${AB:-}"
. bench/device/lib.sh
device_setup "ab-$phase" || exit 1
start=$(date +%s)
[ -n "${ARCHIVE_AT:-}" ] && archive_at "$ARCHIVE_AT" "ab-$phase"
bin=.xtask/build/llama.cpp-flashrt-sm90a/bin
model=/tmp/models/qwen36.gguf
mkdir -p /tmp/models /tmp/vendor-tests

profile() {  # NAME [ENV=VALUE ...]: cargo xtask profile under the settings, its results packed
    local name=$1
    shift
    env "$@" "$xtask" profile --model "$model" --arch 90a ${DEPTH:+--depth "$DEPTH"} > "$out/profile-$name.log" 2>&1
    local results
    results=$(results_dir "$out/profile-$name.log")
    [ -n "$results" ] && tar -czf "$out/profile-$name.tgz" -C "$(dirname "$results")" "$(basename "$results")"
    say "profile $name: $(grep -E 'kernels per step|GPU busy|untraced: (median|mean)|a run.s first steps|between steps µs|GPU span of a step' "$out/profile-$name.log" | tr -s ' ' | tr '\n' ' ')"
}

parity() {  # MODEL [NAME ENV=VALUE ...]: cargo xtask parity, under the settings when given
    local model=$1 name=${2:-} log
    shift $(( $# < 2 ? $# : 2 ))
    log="$out/parity-$(basename "$model" .gguf)${name:+-$name}.log"
    env "$@" "$xtask" parity --model "$model" --arch 90a --tokens "${PARITY_TOKENS:-256}" > "$log" 2>&1
    say "parity $(basename "$model")${name:+ ($*)}: $(grep -E '^\| overlay vs stock' "$log") $(tail -1 "$log")"
}

trace() {  # NAME [ENV=VALUE ...]: the exact kernel's blocks in a tg64 run (GGML_FLASHRT_EXACT_TRACE), summarised
    local name=$1 tsv=/tmp/exact-trace-$1.tsv
    shift
    rm -f "$tsv"
    env "$@" GGML_FLASHRT_EXACT_TRACE="$tsv" "$bin/llama-bench" -m "$model" -ngl 99 -fa 1 -r 1 -p 0 -n 64 \
        > "$out/trace-$name.log" 2>&1
    python3 bench/tools/exact-trace.py "$tsv" --launches "$out/exact-trace-$name.tsv" > "$out/exact-trace-$name.md" 2>&1
    say "exact trace $name: $(head -1 "$out/exact-trace-$name.md") $(tail -1 "$out/exact-trace-$name.md")"
}

traces() {  # TRACE=1: the trace of the default, and under TRACE_WITH's settings when set
    [ "${TRACE:-0}" = 1 ] || return 0
    trace default
    if [ -n "${TRACE_WITH:-}" ]; then
        read -r -a ab <<< "$TRACE_WITH"
        trace with "${ab[@]}"
    fi
}

results_file() {  # LOG NAME: the results file LOG names, copied into $out as NAME
    local results
    results=$(results_dir "$1")
    [ -n "$results" ] && [ -f "$results" ] && cp "$results" "$out/$2"
}

bench_and_parity() {  # bench of stock, the default and the experiments interleaved; 4-layer parity
    local also=() e ab
    for e in "${experiments[@]}"; do
        read -r -a ab <<< "$e"
        also+=(--also "$(IFS=,; echo "${ab[*]}")")
    done
    local sweep=()
    [ "${SWEEP:-0}" = 1 ] && sweep=(--sweep)
    "$xtask" bench --model "$model" --arch 90a --rounds "${ROUNDS:-3}" --tests "${TESTS:-tg128}" "${sweep[@]}" "${also[@]}" \
        > "$out/bench.log" 2>&1
    grep -E '^\| (pp|tg)[0-9]' "$out/bench.log" | while read -r line; do say "bench: $line"; done
    # Each bench's JSON kept as it is written: both runs of a call write the same results file.
    results_file "$out/bench.log" bench.json
    if [ -n "${EXTRA_TESTS:-}" ]; then  # the default alone against stock (no experiments)
        "$xtask" bench --model "$model" --arch 90a --rounds "${ROUNDS:-3}" --tests "$EXTRA_TESTS" > "$out/bench-extra.log" 2>&1
        grep -E '^\| (pp|tg)[0-9]' "$out/bench-extra.log" | while read -r line; do say "bench: $line"; done
        results_file "$out/bench-extra.log" bench-extra.json
    fi
    local small=/tmp/models/qwen36-l4-e8.gguf
    "$xtask" synth --preset qwen36-35b-a3b --layers 4 --experts 8 --out "$small" > /dev/null 2>&1
    parity "$small"
    if [ "${AB_PARITY:-0}" = 1 ]; then
        for i in "${!experiments[@]}"; do
            read -r -a ab <<< "${experiments[$i]}"
            parity "$small" "ab$i" "${ab[@]}"
        done
    fi
}

case $phase in
check)
    "$xtask" build --arch 90a --targets test-backend-ops,llama-bench > "$out/build.log" 2>&1 &
    build=$!
    [ -f "$model" ] || "$xtask" synth --preset qwen36-35b-a3b --out "$model" > "$out/synth.log" 2>&1 &
    synth=$!
    tar -xJf .xtask/device/vendor-tests.tar.xz -C /tmp/vendor-tests
    # Each run under a time limit: a kernel that hangs (a barrier never reached) must not take the
    # call's whole device time with it (300 s: test-gemv's float64 references took over 180 s with
    # the build compiling beside it).
    test_settings=("${experiments[@]}")
    [ -n "${TESTS_WITH+set}" ] && IFS=';' read -r -a test_settings <<< "$TESTS_WITH"
    for t in /tmp/vendor-tests/test-*; do
        timeout 300 "$t" > "$out/$(basename "$t").txt" 2>&1 || echo "(exit $?)" >> "$out/$(basename "$t").txt"
        grep -E "^FAIL" "$out/$(basename "$t").txt" | head -5
        say "$(basename "$t"): $(tail -1 "$out/$(basename "$t").txt")"
        for i in "${!test_settings[@]}"; do
            read -r -a ab <<< "${test_settings[$i]}"
            timeout 300 env "${ab[@]}" "$t" > "$out/$(basename "$t")-ab$i.txt" 2>&1 ||
                echo "(exit $?)" >> "$out/$(basename "$t")-ab$i.txt"
            grep -E "^FAIL" "$out/$(basename "$t")-ab$i.txt" | head -5
            say "$(basename "$t") (${ab[*]}): $(tail -1 "$out/$(basename "$t")-ab$i.txt")"
        done
    done
    # fifo-probe, when packed with the tests: whether an SM serves its copies in flight in order.
    if [ -x /tmp/vendor-tests/fifo-probe ]; then
        timeout 120 /tmp/vendor-tests/fifo-probe > "$out/fifo-probe.md" 2>&1
        grep -E '^\| [0-9]' "$out/fifo-probe.md" | while read -r line; do say "fifo-probe $line"; done
    fi
    # tail-bench, when packed with the tests: MOE_TAIL's kernel alone, plain and with the norm
    # handoff, under the default and each experiment (tail-bench-*.md).
    if [ -x /tmp/vendor-tests/tail-bench ]; then
        timeout 60 /tmp/vendor-tests/tail-bench > "$out/tail-bench-default.md" 2>&1
        say "tail-bench default: $(grep -E '^\| (plain|norm)' "$out/tail-bench-default.md" | tr -s ' ' | tr '\n' ' ')"
        for i in "${!experiments[@]}"; do
            read -r -a ab <<< "${experiments[$i]}"
            timeout 60 env "${ab[@]}" /tmp/vendor-tests/tail-bench > "$out/tail-bench-ab$i.md" 2>&1
            say "tail-bench ${ab[*]}: $(grep -E '^\| (plain|norm)' "$out/tail-bench-ab$i.md" | tr -s ' ' | tr '\n' ' ')"
        done
    fi
    # attn-decode-bench, when packed with the tests: ATTN_DECODE's kernels alone at qwen36's shape,
    # 8 to 16384 cells, caches hot and cold (attn-decode-bench.md).
    if [ -x /tmp/vendor-tests/attn-decode-bench ]; then
        timeout 120 /tmp/vendor-tests/attn-decode-bench > "$out/attn-decode-bench.md" 2>&1
        say "attn-decode-bench: $(grep -E '^\| attn n_kv=(1024|2048|8448|16384) .*cold' "$out/attn-decode-bench.md" | tr -s ' ' | tr '\n' ' ')"
    fi
    # Its traced build (the kernels' phase marks, decode-attention.cuh), when packed: where a launch's
    # µs go, block by block (attn-decode-trace.md).
    if [ -x /tmp/vendor-tests/attn-decode-bench-trace ]; then
        timeout 120 /tmp/vendor-tests/attn-decode-bench-trace > "$out/attn-decode-trace.md" 2>&1
        say "attn-decode phases: $(grep -E '^\| n_kv=(256|1024|8448) vis=[0-9]+ cold' "$out/attn-decode-trace.md" | tr -s ' ' | tr '\n' ' ')"
    fi
    # gemv-bench, when packed with the tests: the exact kernel at every decode shape, 1 token, under
    # the default and each experiment (gemv-bench-*.md); with GEMV_AFTER=NAME also the shapes of
    # GEMV_AFTER_SHAPES (default router_pack) each behind a launch of NAME, as decode orders them
    # (gemv-bench-after-*.md).
    if [ -x /tmp/vendor-tests/gemv-bench ]; then
        timeout 180 /tmp/vendor-tests/gemv-bench "$out/gemv-bench-default.jsonl" --tokens 1 --impls frt-exact \
            > "$out/gemv-bench-default.md" 2> "$out/gemv-bench.err"
        for i in "${!experiments[@]}"; do
            read -r -a ab <<< "${experiments[$i]}"
            timeout 180 env "${ab[@]}" /tmp/vendor-tests/gemv-bench "$out/gemv-bench-ab$i.jsonl" --tokens 1 --impls frt-exact \
                > "$out/gemv-bench-ab$i.md" 2>> "$out/gemv-bench.err"
        done
        if [ "${GEMV_HOT:-0}" = 1 ]; then
            timeout 180 /tmp/vendor-tests/gemv-bench "$out/gemv-bench-hot.jsonl" --tokens 1 --impls frt-exact \
                --stream-mib 0 > "$out/gemv-bench-hot.md" 2>> "$out/gemv-bench.err"
        fi
        if [ -n "${GEMV_AFTER:-}" ]; then
            after=(--tokens 1 --impls frt-exact --shapes "${GEMV_AFTER_SHAPES:-router_pack}" --after "$GEMV_AFTER")
            timeout 120 /tmp/vendor-tests/gemv-bench "$out/gemv-bench-after-default.jsonl" "${after[@]}" \
                > "$out/gemv-bench-after-default.md" 2>> "$out/gemv-bench.err"
            for i in "${!experiments[@]}"; do
                read -r -a ab <<< "${experiments[$i]}"
                timeout 120 env "${ab[@]}" /tmp/vendor-tests/gemv-bench "$out/gemv-bench-after-ab$i.jsonl" "${after[@]}" \
                    > "$out/gemv-bench-after-ab$i.md" 2>> "$out/gemv-bench.err"
            done
        fi
        for prefix in gemv-bench ${GEMV_AFTER:+gemv-bench-after}; do
            python3 - "$out" "$prefix" "${GEMV_AFTER:-}" "${experiments[@]}" <<'PY' | while read -r line; do say "$line"; done
import json, sys
out, prefix, after, names = sys.argv[1], sys.argv[2], sys.argv[3], ["default"] + sys.argv[4:]
label = f"gemv-bench after {after}" if prefix.endswith("after") else "gemv-bench"
runs = []
for i, name in enumerate(names):
    path = f"{out}/{prefix}-{'default' if i == 0 else f'ab{i - 1}'}.jsonl"
    rows = {}
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:  # the run did not get that far (its time limit)
        lines = []
    for line in lines:
        r = json.loads(line)
        if r.get("impl") == "frt-exact":
            rows[r["shape"]] = r["us_median"]
    runs.append(rows)
hot = {}
try:
    for line in open(f"{out}/gemv-bench-hot.jsonl").read().splitlines() if prefix == "gemv-bench" else []:
        r = json.loads(line)
        if r.get("impl") == "frt-exact":
            hot[r["shape"]] = r["us_median"]
except FileNotFoundError:  # GEMV_HOT not set, or the run did not get that far
    pass
print(f"{label} frt-exact µs: shape | " + " | ".join(names) + (" | default, weights in L2" if hot else ""))
for shape in runs[0]:
    cells = [f"{r.get(shape, float('nan')):.2f}" for r in runs] + ([f"{hot.get(shape, float('nan')):.2f}"] if hot else [])
    print(f"{label} {shape} | " + " | ".join(cells))
PY
        done
    fi
    wait $build || { tail -30 "$out/build.log"; say "build FAILED"; exit 1; }
    say "build: $(( $(date +%s) - start )) s"
    # The FlashRT cases under the default and each experiment, or (CASES_WITH) under one set of
    # settings beside the default: several experiments together, when one run each does not fit.
    case_settings=("${experiments[@]}")
    [ -n "${CASES_WITH:-}" ] && case_settings=("$CASES_WITH")
    settings=(default "${!case_settings[@]}")
    [ "${CASES:-1}" = 0 ] && settings=()
    for s in "${settings[@]}"; do
        (
            for w in "${gemv_windows[@]}" SHEXP_GATE MOE_TAIL ATTN_ROPE MOE_TOPK ATTN_DECODE; do export "FRT_${w}_SWAP=1"; done
            if [ "$s" != default ]; then
                read -r -a ab <<< "${case_settings[$s]}"
                export "${ab[@]}"
            fi
            GGML_CUDA_FLASHRT_NO_CACHE=1 FRT_STATS=1 timeout 240 "$bin/test-backend-ops" test -b CUDA0 -o 'FLASHRT_.*' \
                > "$out/tbo-$s.txt" 2>&1 || echo "(exit $?)" >> "$out/tbo-$s.txt"
        )
        grep -E "FAIL" "$out/tbo-$s.txt" | head -10
        label=default
        [ "$s" != default ] && label=${case_settings[$s]}
        say "FlashRT cases ($label): $(grep -m1 'tests passed' "$out/tbo-$s.txt" | xargs || tail -1 "$out/tbo-$s.txt")"
    done
    wait $synth
    [ "${BENCH:-1}" = 0 ] || bench_and_parity
    ;;
bench)
    [ -x "$bin/llama-bench" ] || { say "no build here: run 'ab.sh check' first, within 30 s"; exit 1; }
    bench_and_parity
    traces
    ;;
compare)
    [ -x "$bin/llama-bench" ] || { say "no build here: run 'ab.sh check' first, within 30 s"; exit 1; }
    profile default
    for i in "${!experiments[@]}"; do
        read -r -a ab <<< "${experiments[$i]}"
        profile "ab$i" "${ab[@]}"
    done
    FRT_STATS=1 "$bin/llama-bench" -m "$model" -ngl 99 -fa 1 -r 1 -p 0 -n 8 > "$out/stats-default.log" 2>&1
    # graph order against graph compute calls: whether llama.cpp plans each step's graph anew (our
    # node order then runs on the host between steps) or reuses it.
    say "stats: $(grep -E 'norm handoff|attention gate|graph order|graph compute call' "$out/stats-default.log" | tr -s ' ' | tr '\n' ' ')"
    [ "${PARITY:-1}" = 0 ] || parity "$model"
    traces
    ;;
*)
    echo "ab.sh: phase $phase is not check, bench or compare" >&2
    exit 2
    ;;
esac
cp bench/results/*.json "$out/" 2>/dev/null
archive_out "ab-$phase"
find "$out" -mindepth 1 ! -name all.tgz ! -name summary.txt -delete
echo; cat "$out/summary.txt"
