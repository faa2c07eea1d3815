#!/usr/bin/env python3
"""PNG plots for the model card from train.py's train_log.json and evaluate.py's eval.json.

Pinned: matplotlib==3.11.2 (pip install matplotlib), Python >= 3.10.
Run:    python3 training/plots.py RUN_DIR OUT_DIR    # RUN_DIR holds train_log.json and eval.json
Writes: loss_stages.png (one panel per stage), recall.png (indexer vs 64-most-recent recall per layer, per context),
        ppl.png (held-out perplexity dense / DSA sparse / sliding window per context).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def smooth(v, k=15):
    out, acc = [], []
    for x in v:
        acc.append(x)
        if len(acc) > k:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def main(run_dir, out_dir):
    log = json.load(open(os.path.join(run_dir, "train_log.json")))
    ev = json.load(open(os.path.join(run_dir, "eval.json")))
    os.makedirs(out_dir, exist_ok=True)
    steps = log["steps"]
    fig, axs = plt.subplots(1, 3, figsize=(13, 3.6), dpi=90)
    titles = {"a": "a) dense warm-up (LM loss)", "b": "b) indexer warm-up (KL, main frozen)",
              "c": "c) sparse training, top-k 64"}
    for ax, st in zip(axs, "abc"):
        rs = [r for r in steps if r["stage"] == st and "loss" in r]
        vs = [r for r in steps if r["stage"] == st and "val" in r and not r.get("final")]
        x = [r["tokens"] / 1e6 for r in rs]
        if st in "ac":
            ax.plot(x, smooth([r["loss"] for r in rs]), label="train LM loss", lw=1.2)
            ax.plot([r["tokens"] / 1e6 for r in vs], [r["val"] for r in vs], "o-", ms=3, label="validation LM loss")
        if st in "bc":
            ax2 = ax if st == "b" else ax.twinx()
            for f in sorted(rs[0]["kl_layers"], key=int):
                ax2.plot(x, smooth([r["kl_layers"][f] for r in rs]), lw=1, ls="--" if st == "c" else "-",
                         label=f"KL layer {f}")
            ax2.set_yscale("log")
            ax2.set_ylabel("indexer KL (nats / row)")
            ax2.legend(fontsize=7, loc="upper right")
        ax.set_title(titles[st], fontsize=10)
        ax.set_xlabel("tokens (M)")
        if st in "ac":
            ax.set_ylabel("cross-entropy (nats)")
            ax.legend(fontsize=7, loc="lower left" if st == "c" else "upper right")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "loss_stages.png"))
    plt.close(fig)

    ctxs = sorted(ev["ctx"], key=int)
    L = len(ev["ctx"][ctxs[0]]["recall"])
    fig, axs = plt.subplots(1, len(ctxs), figsize=(4.3 * len(ctxs), 3.4), dpi=90, sharey=True)
    for ax, c in zip(axs, ctxs):
        r = ev["ctx"][c]
        xs = range(L)
        ax.bar([i - 0.2 for i in xs], [r["recall"][str(i)] for i in xs], 0.4, label="DSA indexer top-64")
        ax.bar([i + 0.2 for i in xs], [r["recall_recent"][str(i)] for i in xs], 0.4, label="64 most recent")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{i}\n{'F' if t == 'full' else 'S'}" for i, t in enumerate(ev["indexer_types"])])
        ax.set_title(f"context {c}", fontsize=10)
        ax.set_xlabel("layer (F = full indexer, S = shared)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3, axis="y")
    axs[0].set_ylabel("dense attention mass kept")
    axs[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "recall.png"))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 3.4), dpi=90)
    w = 0.26
    for j, (key, lab) in enumerate((("ppl_dense", "dense"), ("ppl_sparse", "DSA top-64"), ("ppl_window", "window 64"))):
        vals = [ev["ctx"][c][key] for c in ctxs]
        b = ax.bar([i + (j - 1) * w for i in range(len(ctxs))], vals, w, label=lab)
        ax.bar_label(b, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(ctxs)))
    ax.set_xticklabels([f"{c}" + (" (>train len)" if int(c) > log["args"]["seq"] else "") for c in ctxs])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("held-out perplexity")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "ppl.png"))
    plt.close(fig)
    print("wrote", [f for f in os.listdir(out_dir) if f.endswith(".png")])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
