#!/usr/bin/env python3
"""The long-context plot of BENCHMARKS.md from `benches/h200_long.sh` results:

    python3 benches/plot_long.py benches/results/2026-12-02-h200-long docs/

Decode ms/token against context at full depth, sparse (DSA) and dense attention, for the
GLM-5, GLM-5.2 and DeepSeek-V3.2 shapes (every cache format measured); writes
bench-long-context.png and prints the table.
"""
import json, sys
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt


def points(path):
    d = json.loads(path.read_text())
    return [(r["context"], r["attention"], r["cache"], r["ms_median"]) for r in d["decode"]]


def main():
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    fig, ax = plt.subplots(figsize=(8, 5))
    rows = []
    for tag, label in (("g5", "GLM-5"), ("g52", "GLM-5.2"), ("ds", "DeepSeek-V3.2")):
        series = {}
        for f in sorted(src.glob(f"{tag}_*.json")):
            for ctx, attn, cache, ms in points(f):
                series.setdefault((attn, cache), {})[ctx] = ms
                rows.append((label, attn, cache, ctx, ms))
        for (attn, cache), pts in sorted(series.items()):
            xs = sorted(pts)
            style = "--" if attn == "dense" else "-"
            ax.plot(xs, [pts[x] for x in xs], style, marker="o", label=f"{label} {attn} {cache}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (positions)")
    ax.set_ylabel("decode ms/token (H200, q4, full depth)")
    ax.set_title("Decode step vs context: sparse attention stays nearly flat")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "bench-long-context.png", dpi=110)
    seen = set()
    for r in sorted(rows):
        if r not in seen:
            seen.add(r)
            print("| %s | %s | %s | %d | %.2f |" % r)


if __name__ == "__main__":
    main()
