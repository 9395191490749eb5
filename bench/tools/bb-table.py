"""The table of diagnose.sh multiseq: llama-batched-bench's jsonl rows, tagged with their setting
and round, as each setting's median decode tok/s (all sequences) per sequence count and its ratio
to stock (settings named *-nographs: to stock-nographs).

Usage: python3 bench/tools/bb-table.py bb.jsonl
"""
import json
import statistics
import sys


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    names = list(dict.fromkeys(r["setting"] for r in rows))
    pls = sorted({r["pl"] for r in rows})
    med = {}
    for n in names:
        for p in pls:
            v = [r["speed_tg"] for r in rows if r["setting"] == n and r["pl"] == p]
            if v:
                med[n, p] = statistics.median(v)
    rounds = len({r["round"] for r in rows})
    print(f"\n| setting | " + " | ".join(f"{p} seq" for p in pls) + f" (decode tok/s, all sequences; median of {rounds} round(s); x stock) |")
    print("|---|" + "---:|" * len(pls))
    for n in names:
        base = "stock-nographs" if n.endswith("-nographs") else "stock"
        cells = []
        for p in pls:
            s, b = med.get((n, p)), med.get((base, p))
            cells.append("-" if s is None else f"{s:.1f}" + (f" ({s / b:.3f}x)" if b and n != base else ""))
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
