#!/usr/bin/env python3
"""The prefill plot of BENCHMARKS.md (issue 20): prefill tok/s against prompt length on the
H200, the 4-layer GLM-5 shape beside transformers and the full-depth one beside llama.cpp,
read from the results directories each figure came from:

    python3 benches/plot_prefill.py docs/

Writes bench-prefill.png and prints the table.
"""
import json, re, sys
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

R = Path(__file__).resolve().parent / "results"
A = R / "2026-12-04-h200-prefill"
B = R / "2026-12-04-h200-prefill2"
C = R / "2026-12-04-h200-heads"
D = R / "2026-12-04-h200-direct"
E = R / "2026-12-04-h200-mla-gemm"
LINE = re.compile(r"^(?:bench: )?prefill (\d+) tokens: [\d.]+ s, ([\d.]+) tok/s")


def bench_lines(path, section=None):
    """(prompt tokens, tok/s) of each `prefill` line of `path`, in the console section whose
    `== ...` header contains `section` (all of the file without one)."""
    pts, on = {}, section is None
    for line in path.read_text().splitlines():
        if line.startswith("== "):
            on = section is None or section in line
        m = LINE.match(line)
        if on and m:
            pts.setdefault(int(m[1]), float(m[2]))
    return pts


def transformers(path):
    d = json.loads(path.read_text())
    # The first context (512) is the warm-up.
    return {r["context"]: r["prefill_tok_s"] for r in d["results"] if r["context"] > 512}


def llama_pp(path):
    """llama-bench's ppN rows of the Q4_K_M model."""
    pts = {}
    for line in path.read_text().splitlines():
        m = re.search(r"Q4_K - Medium .*\|\s+pp(\d+) \|\s+([\d.]+)", line)
        if m:
            pts[int(m[1])] = float(m[2])
    return pts


PANELS = [
    ("4 layers (GLM-5 shape, 16 experts)", [
        ("sparsa q4, MLA as GEMMs (night)", bench_lines(E / "run2/b4.1.a.txt"), "-"),
        ("sparsa q4, per-head GEMMs (afternoon)", bench_lines(C / "run1/console.txt", "4 layers, new (a)"), "-"),
        ("sparsa q4, K-steps of 64 (noon)", bench_lines(B / "run6/console.txt", "4 layers (a)"), "--"),
        ("sparsa q4, restaged tile (morning)", bench_lines(A / "run4/chunk512-a.txt"), "-."),
        ("transformers bf16, sdpa", transformers(A / "run5/tf.json"), ":"),
    ]),
    ("78 layers (GLM-5 shape, 16 experts, random weights)", [
        ("sparsa q4, MLA as GEMMs (night)", bench_lines(E / "run3/b78.1.txt"), "-"),
        ("sparsa q4, 64 × 128 tensor-core tiles (evening)", bench_lines(D / "run6/bench78.tn128.txt"), "-"),
        ("sparsa q4, per-head GEMMs (afternoon)", bench_lines(C / "run1/full-new.txt"), "-"),
        ("sparsa q4, --gpu-memory 24GiB, chunks of 2,048 (afternoon)", bench_lines(C / "run4/24g.txt"), "-"),
        ("sparsa q4, K-steps of 64 (noon)", bench_lines(B / "run6/full.txt"), "--"),
        ("sparsa q4, --gpu-memory 24GiB, chunks of 512 (noon)", bench_lines(B / "run4/console.txt", "gpu-memory"), "-."),
        ("llama.cpp Q4_K_M (2026-12-02)", llama_pp(R / "2026-12-02-h200-decode/peer3/llama_bench.txt"), ":"),
    ]),
]


def main():
    out = Path(sys.argv[1])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, (title, series) in zip(axes, PANELS):
        for label, pts, style in series:
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], style, marker="o", label=label)
            for x in xs:
                print(f"{title} | {label} | {x} | {pts[x]:.1f}")
        if title.startswith("78"):
            ax.axhline(1500, color="grey", lw=0.8)
            ax.text(2048, 1550, "issue 20 target: 1,500 tok/s", fontsize=8, color="grey")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("prefill tok/s (H200)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "bench-prefill.png", dpi=110)


if __name__ == "__main__":
    main()
