#!/usr/bin/env python3
"""Where the exact GEMV kernel's blocks spend a decode step, from GGML_FLASHRT_EXACT_TRACE's file.

The overlay writes the file when a context ends (overlay/diagnostics.cuh): the launches' names
(`launch` lines: first segment's weights, window, tensor names) and one `block` line per block of
the latest ~2^19 exact blocks (vendor/csrc/gemv.cuh, frt_gemv_trace_record): %globaltimer at the
block's start and end, and SM clock cycles from its start to each phase. This prints, per launch
of a step (the same launch in every layer taken together, medians over layers and steps):

  blocks    the launch's blocks
  span      first block's start to last block's end, µs
  chain     its end minus the previous exact launch's end, µs (kernels between them included)
  resident  when its median block started, µs after the launch's first block started
  then, per block (median over the launch's blocks; `crit` = the block that ended last): µs from
  the block's start to its wait's end (wait), then to its rows' copies issued (issue: expert rows
  after the routing), to the norm's scales summed (norm: x's first pass; nothing where the launch
  has no norm; traces from before this mark show none), to x in shared memory (prologue), to its
  rows landed (landed), to its products summed (products), to its rows stored (store).
  The wait mark reads the SM clock right after `griddepcontrol.wait`; a dense launch's issue mark
  (nothing between the two) comes ~1 µs later, so read the issue mark as the wait's real end.

Cycles become µs at the clock measured from the records themselves (cycles over globaltimer
nanoseconds, blocks of at least 4 µs). The globaltimer may tick coarsely (~1 µs on some GPUs), so
span, chain and resident are good to about that; the phases, from the SM clock, are exact.

usage: exact-trace.py TRACE.tsv [--steps N] [--launches OUT.tsv]
"""

import argparse
import re
import statistics
import sys
from collections import defaultdict

PHASES = ["waited", "issued", "normed", "prologue", "landed", "products", "stored"]
PHASE_NAMES = ["wait", "issue", "norm", "prologue", "landed", "products", "store"]


def parse(path):
    names, blocks = {}, []
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            if cols[0] == "launch":
                names[int(cols[1], 16)] = (cols[2], cols[3] if len(cols) > 3 else "")
            elif cols[0] == "block":
                tag = int(cols[1], 16)
                block, grid, sm, kind, start, end = (int(c) for c in cols[2:8])
                marks = [int(c) for c in cols[8:]]
                if len(marks) == len(PHASES) - 1:  # a trace from before the norm mark: none there
                    marks.insert(2, marks[1])
                blocks.append((tag, block, grid, sm, kind, start, end, marks))
    return names, blocks


def clock_per_ns(blocks):
    ratios = [b[7][-1] / (b[6] - b[5]) for b in blocks if b[6] - b[5] >= 4000]
    if not ratios:
        sys.exit("exact-trace: no block of 4 µs or more to measure the clock by")
    return statistics.median(ratios)


def launches(blocks):
    """Complete launches: a tag's blocks split where starts lie over 200 µs apart, kept when every
    block of the grid is there once."""
    by_tag = defaultdict(list)
    for b in blocks:
        by_tag[b[0]].append(b)
    out = []
    for tag, bs in by_tag.items():
        bs.sort(key=lambda b: b[5])
        group = [bs[0]]
        for b in bs[1:]:
            if b[5] - group[-1][5] > 200_000:
                out.append(group)
                group = []
            group.append(b)
        out.append(group)
    complete = []
    for g in out:
        grid = g[0][2]
        if len(g) == grid and len({b[1] for b in g}) == grid:
            complete.append(g)
    complete.sort(key=lambda g: min(b[5] for b in g))
    return complete


def steps(occurrences):
    """Launches split into decode steps where the GPU idled over 50 µs between two of them."""
    out, step, last_end = [], [], None
    for g in occurrences:
        start = min(b[5] for b in g)
        if last_end is not None and start - last_end > 50_000:
            out.append(step)
            step = []
        step.append(g)
        last_end = max(last_end or 0, max(b[6] for b in g))
    if step:
        out.append(step)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=8, help="the last N complete steps (default 8)")
    ap.add_argument("--launches", help="also write one line per launch of those steps here (TSV)")
    args = ap.parse_args()
    names, blocks = parse(args.trace)
    if not blocks:
        sys.exit("exact-trace: no block records in the file")
    ghz = clock_per_ns(blocks)
    all_steps = steps(launches(blocks))
    if not all_steps:
        sys.exit("exact-trace: no launch with a record from each of its blocks (a ring too small for a step?)")
    sizes = [len(s) for s in all_steps]
    modal = statistics.mode(sizes)
    chosen = [s for s in all_steps if len(s) == modal][-args.steps:]
    us = lambda cycles: cycles / ghz / 1000.0  # noqa: E731
    rows = defaultdict(list)  # label -> per-launch measurements
    order = []
    lines = []
    for si, step in enumerate(chosen):
        prev_end = None
        for li, g in enumerate(step):
            tag = g[0][0]
            window, weights = names.get(tag, ("?", f"{tag:x}"))
            label = f"{window}: {re.sub(r'blk[.][0-9]+[.]', '', weights)}"  # every layer's launch together
            if label not in rows:
                order.append(label)
            start = min(b[5] for b in g)
            end = max(b[6] for b in g)
            crit = max(g, key=lambda b: b[6])
            med = [statistics.median(us(b[7][i]) for b in g) for i in range(len(PHASES))]
            m = {
                "blocks": len(g),
                "span": (end - start) / 1000.0,
                "chain": (end - prev_end) / 1000.0 if prev_end is not None else float("nan"),
                "resident": statistics.median((b[5] - start) / 1000.0 for b in g),
                "med": med,
                "crit": [us(c) for c in crit[7]],
                "crit_start": (crit[5] - start) / 1000.0,
            }
            rows[label].append(m)
            lines.append([si, li, label, m["blocks"], m["span"], m["chain"], m["resident"], *med, m["crit_start"], *m["crit"]])
            prev_end = end
    print(f"# Exact GEMV blocks in decode: {len(chosen)} steps of {modal} exact launches "
          f"(of {len(all_steps)} found), SM clock {ghz:.3f} GHz\n")
    print("µs; per block from its start (medians over the launch's blocks, then over layers and steps);"
          " crit: the block that ended last, from its start (`@` when it started after the launch's first block).\n")
    head = ["launch", "n", "blocks", "span", "chain", "resident"] + [f"{p}" for p in PHASE_NAMES] + ["crit @"] + [
        f"crit {p}" for p in PHASE_NAMES]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" + "---:|" * (len(head) - 1))
    total_chain = 0.0
    for label in order:
        ms = rows[label]
        med = lambda f: statistics.median(f(m) for m in ms)  # noqa: E731
        chains = [m["chain"] for m in ms if m["chain"] == m["chain"]]
        chain = statistics.median(chains) if chains else float("nan")
        total_chain += sum(chains) / len(chosen)
        cells = [label, str(len(ms) // len(chosen)), f"{med(lambda m: m['blocks']):.0f}", f"{med(lambda m: m['span']):.2f}",
                 f"{chain:.2f}", f"{med(lambda m: m['resident']):.2f}"]
        cells += [f"{med(lambda m, i=i: m['med'][i]):.2f}" for i in range(len(PHASES))]
        cells += [f"{med(lambda m: m['crit_start']):.2f}"]
        cells += [f"{med(lambda m, i=i: m['crit'][i]):.2f}" for i in range(len(PHASES))]
        print("| " + " | ".join(cells) + " |")
    print(f"\nchain summed over a step's exact launches (their ends apart, kernels between included): {total_chain:.1f} µs")
    if args.launches:
        with open(args.launches, "w") as f:
            f.write("\t".join(["step", "launch", "label", "blocks", "span", "chain", "resident"] + PHASE_NAMES +
                              ["crit_start"] + [f"crit_{p}" for p in PHASE_NAMES]) + "\n")
            for row in lines:
                f.write("\t".join(f"{c:.3f}" if isinstance(c, float) else str(c) for c in row) + "\n")


if __name__ == "__main__":
    main()
