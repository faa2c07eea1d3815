#!/usr/bin/env python3
"""Check a `sparsa synth` bf16 directory against transformers (manual; not run in CI).

    sparsa synth --like glm-5 --layers 2 --experts 8 --format bf16 --out /tmp/s
    python3 tests/reference/check_synth.py /tmp/s [--sparsa target/release/sparsa] [--tokens 5,17,99,1000]

Loads the directory with AutoModelForCausalLM.from_pretrained (dtype bfloat16, as a user
would, and float32 eager for the comparison: the stored bf16 weights upcast exactly), runs
one prefill over the tokens, runs `sparsa logits` on the same tokens and prints the largest
logit difference and whether the argmax agrees at every position. Needs transformers 5.x
(tested with 5.24.0) and torch.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--sparsa", default="target/release/sparsa")
    ap.add_argument("--tokens", default="5,17,99,1000,3,2047,64,9")
    args = ap.parse_args()
    ids = [int(x) for x in args.tokens.split(",")]
    print("transformers", transformers.__version__)

    m = AutoModelForCausalLM.from_pretrained(args.dir, dtype=torch.bfloat16)
    print("bf16 load ok:", type(m).__name__, sum(p.numel() for p in m.parameters()) / 1e9, "B params")
    del m
    m = AutoModelForCausalLM.from_pretrained(
        args.dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    )
    m.eval()
    with torch.no_grad():
        ref = m(torch.tensor([ids])).logits[0].float()
    del m

    with tempfile.TemporaryDirectory() as t:
        out = os.path.join(t, "logits.safetensors")
        subprocess.run([args.sparsa, "logits", "--model", args.dir, "--tokens", args.tokens, "--out", out], check=True)
        got = load_file(out)["logits"]
    d = (got - ref).abs()
    same = (got.argmax(-1) == ref.argmax(-1)).tolist()
    print("logits std", ref.std().item(), "max |diff|", d.max().item(), "mean |diff|", d.mean().item())
    print("argmax agrees per position:", same)
    ok = all(same) and d.max().item() < 1e-2 * max(1.0, ref.abs().max().item())
    print("OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
