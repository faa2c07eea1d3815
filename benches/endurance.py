#!/usr/bin/env python3
"""Endurance run: a long scripted multi-turn chat through the real `sparsa chat` binary.

    python3 benches/endurance.py --tokens 10000 --out docs/endurance [--bin target/release/sparsa]
    python3 benches/endurance.py --plot-only --out docs/endurance

Feeds user messages (varied, drawn with a fixed seed from the phrases below) on stdin, one turn
at a time, with `/stats` after every turn; `/reset` every 17th turn and a `/save` + `/load`
round trip every 11th. The chat samples with a fixed seed and --ignore-eos, so every reply
runs to --max-tokens (or the end of the context), and the context fills, old turns are
dropped and the rest is prefilled again.

Writes to --out:
  turns.csv   one row per turn, from `/stats`: tokens so far, context, the GPU counters
              (live buffers and bytes, buffers and bind groups created, allocator bytes)
              and the host RSS the process reports itself;
  rss.csv     the host RSS read from /proc/PID/status every --sample seconds, from outside;
  endurance.png (when matplotlib is available) and summary.txt.
"""
import argparse
import csv
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

OPENINGS = [
    "Good morrow, my lord.", "What news from the court?", "Speak, I pray thee.",
    "Alas, poor friend.", "Hark, who goes there?", "Fair lady, hear me.",
    "O gentle cousin,", "Now by my faith,", "Tell me, good fellow,", "Peace, peace!",
]
MIDDLES = [
    "the king is dead and the crown lies empty", "a storm hath broken on the sea",
    "thy brother waits without the gate", "the soldiers march at break of day",
    "love is a madness most discreet", "the night is long and full of dreams",
    "my heart is heavy with thy words", "the duke hath banished all his foes",
    "there is a letter from the queen", "the fool doth sing of better days",
    "we shall meet again in Padua", "the ghost walks upon the battlements",
]
ENDINGS = [
    "What sayest thou?", "How shall we answer?", "Is it not so?", "Wilt thou come?",
    "Say on.", "What dost thou counsel?", "Why dost thou weep?", "Where is the prince?",
]

STATS_TURN = re.compile(r"prompt (\d+) tokens: (\d+) prefilled, (\d+) reused .* (\d+) generated, decode ([\d.]+) tok/s")
STATS_CTX = re.compile(r"context (\d+)/(\d+) tokens in use, (\d+) turns?")
STATS_GPU = re.compile(
    r"GPU buffers: live (\d+) \(([\d.]+) MiB\), created (\d+) \(([\d.]+) MiB\) \| bind groups: live (\d+), created (\d+)"
    r"(?: \| allocator: ([\d.]+) MiB in use, ([\d.]+) MiB reserved)?"
)
STATS_RSS = re.compile(r"host RSS: ([\d.]+) MiB")


def message(rng):
    parts = [rng.choice(OPENINGS)]
    for _ in range(rng.randint(1, 3)):
        parts.append(rng.choice(MIDDLES) + ";")
    parts.append(rng.choice(ENDINGS))
    return " ".join(parts)


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Sampler(threading.Thread):
    """Reads the child's VmRSS every `every` seconds into rows (t, rss_kib, tokens)."""

    def __init__(self, pid, every, t0, progress):
        super().__init__(daemon=True)
        self.pid, self.every, self.t0, self.progress = pid, every, t0, progress
        self.rows = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            r = rss_kib(self.pid)
            if r is not None:
                self.rows.append((round(time.time() - self.t0, 2), r, self.progress[0]))
            self.stop.wait(self.every)


def run(args):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        "nice", "-n", str(args.nice), args.bin, "chat",
        "--temperature", "0.8", "--top-p", "0.95", "--top-k", "40",
        "--seed", str(args.seed), "--max-tokens", str(args.max_tokens), "--ignore-eos",
    ]
    print("command:", " ".join(cmd), file=sys.stderr)
    t0 = time.time()
    child = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, bufsize=1,
    )
    errlog = open(out / "stderr.log", "w")
    threading.Thread(target=lambda: [errlog.write(l) or errlog.flush() for l in child.stderr], daemon=True).start()
    progress = [0]
    sampler = Sampler(child.pid, args.sample, t0, progress)
    sampler.start()
    rng = random.Random(args.seed)
    save_file = Path(tempfile.gettempdir()) / f"sparsa-endurance-{os.getpid()}.json"
    turns = []
    total = 0
    turn = 0

    def send(line):
        child.stdin.write(line + "\n")
        child.stdin.flush()

    def read_stats():
        row = {}
        while True:
            line = child.stdout.readline()
            if not line:
                raise SystemExit(f"sparsa chat ended early (exit {child.wait()}); see {out}/stderr.log")
            if m := STATS_TURN.search(line):
                row.update(prompt=int(m[1]), prefilled=int(m[2]), reused=int(m[3]), generated=int(m[4]), decode_tok_s=float(m[5]))
            elif m := STATS_CTX.search(line):
                row.update(context=int(m[1]), ctx=int(m[2]), conv_turns=int(m[3]))
            elif m := STATS_GPU.search(line):
                row.update(
                    live_buffers=int(m[1]), live_buffer_mib=float(m[2]), buffers_created=int(m[3]),
                    created_mib=float(m[4]), live_bind_groups=int(m[5]), bind_groups_created=int(m[6]),
                    alloc_mib=float(m[7]) if m[7] else "", reserved_mib=float(m[8]) if m[8] else "",
                )
            elif m := STATS_RSS.search(line):
                row["self_rss_mib"] = float(m[1])
                return row

    while total < args.tokens:
        turn += 1
        event = ""
        if turn % 17 == 0:
            send("/reset")
            event = "reset"
        elif turn % 11 == 0:
            send(f"/save {save_file}")
            send(f"/load {save_file}")
            event = "save+load"
        send(message(rng))
        send("/stats")
        row = read_stats()
        total += row.get("generated", 0)
        progress[0] = total
        row.update(turn=turn, t=round(time.time() - t0, 2), tokens=total, event=event,
                   ext_rss_kib=rss_kib(child.pid) or "")
        turns.append(row)
        print(f"turn {turn}: {total} tokens, {row['t']:.0f} s, context {row.get('context')}, "
              f"GPU live {row.get('live_buffer_mib')} MiB, created {row.get('buffers_created')}/"
              f"{row.get('bind_groups_created')}, RSS {row.get('self_rss_mib')} MiB", file=sys.stderr, flush=True)
        # Written every turn, so an interrupted run keeps what it measured.
        write_csv(out / "turns.csv", turns)
        write_csv(out / "rss.csv", [dict(t=t, rss_kib=r, tokens=k) for t, r, k in sampler.rows])
    send("/exit")
    child.stdin.close()
    code = child.wait()
    sampler.stop.set()
    sampler.join()
    wall = time.time() - t0
    write_csv(out / "rss.csv", [dict(t=t, rss_kib=r, tokens=k) for t, r, k in sampler.rows])
    save_file.unlink(missing_ok=True)
    print(f"exit {code}, {total} tokens in {turn} turns, {wall:.0f} s", file=sys.stderr)
    summarize(out, wall)


def write_csv(path, rows):
    if not rows:
        return
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def summarize(out, wall=None):
    turns = read_csv(out / "turns.csv")
    rss = read_csv(out / "rss.csv")
    warm = min(args.warm_turns, len(turns))
    w, last = turns[warm - 1], turns[-1]
    after = [r for r in rss if float(r["t"]) >= float(w["t"])]
    ext = [int(r["rss_kib"]) / 1024 for r in after]
    wall = wall or float(last["t"])
    tokens = int(last["tokens"])
    lines = [
        f"turns {len(turns)}, tokens generated {tokens}, wall {wall:.0f} s ({wall / 60:.1f} min), {tokens / wall:.2f} tok/s overall",
        f"warm-up = the first {warm} turns ({w['tokens']} tokens, {float(w['t']):.0f} s)",
        f"host RSS (external samples every few s): at warm-up {int(after[0]['rss_kib']) / 1024:.1f} MiB, at end {ext[-1]:.1f} MiB, min/max after warm-up {min(ext):.1f}/{max(ext):.1f} MiB ({len(ext)} samples)",
        f"GPU live buffers: at warm-up {w['live_buffers']} ({w['live_buffer_mib']} MiB), at end {last['live_buffers']} ({last['live_buffer_mib']} MiB); "
        f"min/max after warm-up {min(float(r['live_buffer_mib']) for r in turns[warm - 1:])}/{max(float(r['live_buffer_mib']) for r in turns[warm - 1:])} MiB",
        f"allocator in use: at warm-up {w['alloc_mib']} MiB, at end {last['alloc_mib']} MiB",
        f"buffers created: at warm-up {w['buffers_created']}, at end {last['buffers_created']} (+{int(last['buffers_created']) - int(w['buffers_created'])})",
        f"bind groups created: at warm-up {w['bind_groups_created']}, at end {last['bind_groups_created']} (+{int(last['bind_groups_created']) - int(w['bind_groups_created'])}); live at end {last['live_bind_groups']}",
    ]
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    ax[0].plot([int(r["tokens"]) for r in rss], [int(r["rss_kib"]) / 1024 for r in rss], lw=1)
    ax[0].set_ylabel("host RSS (MiB)")
    tk = [int(r["tokens"]) for r in turns]
    ax[1].plot(tk, [float(r["live_buffer_mib"]) for r in turns], label="live buffers (wgpu)")
    if turns[0]["alloc_mib"]:
        ax[1].plot(tk, [float(r["alloc_mib"]) for r in turns], "--", label="allocator in use")
    ax[1].set_ylabel("GPU memory (MiB)")
    ax[1].legend()
    ax[2].plot(tk, [int(r["buffers_created"]) for r in turns], label="buffers created (total)")
    ax[2].plot(tk, [int(r["bind_groups_created"]) for r in turns], label="bind groups created (total)")
    ax[2].plot(tk, [int(r["live_bind_groups"]) for r in turns], label="bind groups alive")
    ax[2].set_ylabel("count")
    ax[2].set_xlabel("tokens generated")
    ax[2].legend()
    for a in ax:
        a.set_ylim(bottom=0)
        a.grid(alpha=0.3)
    fig.suptitle(f"sparsa chat endurance: {tokens} tokens, built-in model, lavapipe")
    fig.tight_layout()
    fig.savefig(out / "endurance.png", dpi=80)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/sparsa")
    p.add_argument("--tokens", type=int, default=10000)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sample", type=float, default=3.0, help="seconds between RSS samples")
    p.add_argument("--nice", type=int, default=5)
    p.add_argument("--warm-turns", type=int, default=3)
    p.add_argument("--out", default="docs/endurance")
    p.add_argument("--plot-only", action="store_true")
    args = p.parse_args()
    if args.plot_only:
        summarize(Path(args.out))
    else:
        run(args)
