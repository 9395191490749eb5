#!/usr/bin/env bash
# Where the exact kernel's time goes (docs/perf-notes.md, "exact kernel"): gemv-bench's frt-exact
# rows at 1 token, once per FRT_GEMV_EXACT_LAB setting (vendor/csrc/gemv-exact.cu: bits that leave a
# part of the kernel out), after test-gemv (the default must stay bit-identical to stock).
# Usage (device, repository root): bench/device/exact-lab.sh. Binaries carried, built on a CPU
# machine with the pip nvcc (-arch=sm_90a, as bench/device/gemv.sh builds them) into
# .xtask/device/gemv/. Prints one table last: shape, then µs per setting.
set -euo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
out=${OUT:-/tmp/exact-lab}
mkdir -p "$out"
bin=.xtask/device/gemv
shapes=attn_qkv,ssm_out,ffn_gate_up_exps,ffn_down_exps,gdn_in_proj_pack,attn_qkv_pack,ffn_down_shexp_gguf
"$bin/test-gemv" > "$out/test-gemv.txt" 2>&1 || true
echo "test-gemv: $(tail -1 "$out/test-gemv.txt")"
settings=(0 1 2 4 8 10 6)
for lab in "${settings[@]}"; do
    FRT_GEMV_EXACT_LAB=$lab "$bin/gemv-bench" "$out/lab-$lab.jsonl" --tokens 1 --shapes "$shapes" \
        > "$out/lab-$lab.md" 2> "$out/lab-$lab.err" || echo "lab $lab FAILED: $(tail -2 "$out/lab-$lab.err")"
done
python3 - "$out" "${settings[@]}" <<'PY' | tee "$out/table.md"
import json, sys
out, settings = sys.argv[1], sys.argv[2:]
names = {"0": "default", "1": "no prefetch", "2": "no prologue", "4": "loads only", "8": "no rows",
         "10": "no rows, no prologue", "6": "loads only, no prologue"}
rows = {}
for lab in settings:
    try:
        for line in open(f"{out}/lab-{lab}.jsonl"):
            r = json.loads(line)
            if r["impl"] == "frt-exact":
                rows.setdefault((r["shape"], r["bytes"]), {})[lab] = r["us_median"]
    except FileNotFoundError:
        pass
print("| shape | MB | " + " | ".join(names.get(l, l) for l in settings) + " |")
print("|---|---:|" + "---:|" * len(settings))
for (shape, b), us in rows.items():
    print(f"| {shape} | {b / 1e6:.2f} | " + " | ".join(f"{us[l]:.2f}" if l in us else "-" for l in settings) + " |")
PY
