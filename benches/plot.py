#!/usr/bin/env python3
"""Plots and summary numbers for BENCHMARKS.md from `sparsa bench --json` files.

    python3 benches/plot.py benches/results/2026-11-29-h200-run4 docs/

Reads g5q4.json, g52q4.json and dsq4.json (GLM-5 / GLM-5.2 / DeepSeek-V3.2 shapes, DSA and
--dense) and transformers' tf_g5.json; writes bench-decode-vs-context.png and
bench-kernels-128k.png, and prints the attention-path ratios.
"""
import json, sys
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

ATTN = ("indexer::", "topk", "mla::")


def attn_ms(d):
    return sum(k["ms"] for k in d["kernels"] if k["name"].startswith(ATTN))


def main():
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    runs = {name: json.loads((src / f"{name}.json").read_text()) for name in ("g5q4", "g52q4", "dsq4")}
    if (src / "tf_g5.json").exists():
        tf = json.loads((src / "tf_g5.json").read_text())["results"]
    else:
        tf = [json.loads(l) for l in (src / "misc.txt").read_text().splitlines() if l.startswith('{"context"')]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {("g5q4", "dsa"): ("GLM-5 shape, DSA", "C0", "-o"),
              ("g5q4", "dense"): ("GLM-5 shape, dense", "C1", "-s"),
              ("g52q4", "dsa"): ("GLM-5.2 shape (IndexShare), DSA", "C2", "--o"),
              ("g52q4", "dense"): ("GLM-5.2 shape, dense", "C3", "--s")}
    for (run, att), (label, color, style) in styles.items():
        pts = sorted((d["context"], d["ms_median"]) for d in runs[run]["decode"] if d["attention"] == att)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=f"sparsa q4, {label}")
    pts = [(r["context"], r["decode_ms_median"]) for r in tf if "decode_ms_median" in r]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "-^", color="C7",
            label="transformers 5.17 + torch 2.11 (CUDA, bf16, sdpa)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("decode step (ms/token, median)")
    ax.set_title("H200, 4-layer GLM-5-shaped model (1 dense + 3 MoE, 16 experts)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "bench-decode-vs-context.png", dpi=110)

    # Per-kernel breakdown of one decode step at 128K, DSA vs dense (GLM-5 shape).
    fig, ax = plt.subplots(figsize=(7, 4.2))
    steps = [d for d in runs["g5q4"]["decode"] if d["context"] == 131072]
    groups = {"weight GEMVs (q4)": ("matmul::",), "indexer": ("indexer::",), "top-k": ("topk",),
              "attention (mla)": ("mla::",), "absorb_q / up_v": ("attention::",),
              "norms, rope, elementwise, router": ("norm::", "rope::", "elementwise::", "router::", "embed::")}
    bottom = [0.0] * len(steps)
    for i, (g, prefixes) in enumerate(groups.items()):
        vals = [sum(k["ms"] for k in d["kernels"] if k["name"].startswith(prefixes)) for d in steps]
        ax.bar([d["attention"] for d in steps], vals, bottom=bottom, label=g, color=f"C{i}")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("GPU time of one decode step (ms, timestamps)")
    ax.set_title("Decode step at 128K context, GLM-5 shape, q4 (H200)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "bench-kernels-128k.png", dpi=110)

    for run in runs:
        cal = runs[run]["calibration"]
        for ctx in sorted({d["context"] for d in runs[run]["decode"]}):
            ds = {d["attention"]: d for d in runs[run]["decode"] if d["context"] == ctx}
            if "dense" in ds:
                a, b = attn_ms(ds["dsa"]), attn_ms(ds["dense"])
                dense_mla = [k for k in ds["dense"]["kernels"] if k["name"] == "mla::mla"][0]
                idx = [k for k in ds["dsa"]["kernels"] if k["name"] == "indexer::scores"]
                idx_bw = (100 * idx[0]["bytes"] / (idx[0]["ms"] * 1e-3) / cal["copy_bytes_per_s"]) if idx else 0
                print(f"{run} ctx {ctx}: attention path dsa {a:.3f} ms, dense {b:.3f} ms, ratio {b / a:.1f}x; "
                      f"dense mla {100 * dense_mla['bytes'] / (dense_mla['ms'] * 1e-3) / cal['copy_bytes_per_s']:.0f}% bw "
                      f"{100 * dense_mla['flops'] / (dense_mla['ms'] * 1e-3) / cal['fma_flops_per_s']:.0f}% fma; "
                      f"indexer {idx_bw:.0f}% bw; step dsa {ds['dsa']['ms_median']:.2f} dense {ds['dense']['ms_median']:.2f} ms")


if __name__ == "__main__":
    main()
