#!/usr/bin/env python3
"""transformers' reference outputs for the built-in model, models/sparsa-bard-12m (tests/bard.rs).

Pinned versions (exactly these; the script refuses to run with others):
    torch==2.15.0  transformers==5.24.0  safetensors==0.8.0
Run from the repository root (CPU, ~30 s on 2 cores):
    python3 tests/reference/make_bard_reference.py             # writes tests/data/bard/reference.json
    python3 tests/reference/make_bard_reference.py --passage   # also re-cuts tests/data/bard/heldout.txt
                                                               # from training/work/data/heldout.txt (data.py)

The model is loaded with transformers' own GlmMoeDsaForCausalLM from the shipped directory, upcast to float32,
eager attention, single thread, deterministic algorithms. Where the shipped weights are in one of sparsa's own
quantized formats (config.json `quantization_config.quant_method == "sparsa"`), they are dequantized here to
float32 first, exactly (scale x integer is exact in f32), so the reference is for the same weights sparsa runs.

reference.json:
    greedy[i]: {prompt, ids (prompt ids with [gMASK]<sop>), new (64 greedy ids, eos ignored),
                min_gap (smallest top-1 minus top-2 logit over the 64 steps)}
    heldout:   {ids (the passage tokenized, [gMASK]<sop> first), nll (per predicted token, predicting ids[j+1]
                from ids[..=j] for j >= 1, i.e. every passage token once), ppl (exp of the mean),
                nll_dense, ppl_dense (same weights with index_topk = 1e9: dense causal attention)}
The greedy prompts are a short one ("KING RICHARD:", mostly dense: fewer keys than index_topk) and a long one
(a held-out passage of ~200 tokens, so most steps select 64 of >200 keys).
"""
import argparse
import json
import math
import os

import torch
import transformers

from common import DATA, PINNED, REPO, setup
from sparsa_formats import load_dequantized

PINS = {k: PINNED[k] for k in ("torch", "transformers", "safetensors")}  # (numpy: only for quantized weights)
MODEL = os.path.join(REPO, "models", "sparsa-bard-12m")
OUT = os.path.join(DATA, "bard")
N_NEW = 64
PASSAGE_TOKENS = 512  # tokens of the held-out passage (plus [gMASK]<sop>); > index_topk so attention is sparse


def load_model(topk=None):
    from transformers import AutoConfig, GlmMoeDsaForCausalLM
    cfg = AutoConfig.from_pretrained(MODEL)
    q = getattr(cfg, "quantization_config", None)
    if topk is not None:
        cfg.index_topk = topk
    if isinstance(q, dict) and q.get("quant_method") == "sparsa":  # sparsa's q8/q4 formats (sparsa_formats.py)
        del cfg.quantization_config
        model = GlmMoeDsaForCausalLM(cfg).float().eval()
        sd = load_dequantized(MODEL)
        missing, unexpected = model.load_state_dict(sd, strict=False)
        assert not unexpected and all("mtp" in m for m in missing), (missing, unexpected)
    else:
        model = GlmMoeDsaForCausalLM.from_pretrained(MODEL, config=cfg, dtype=torch.float32,
                                                     attn_implementation="eager").eval()
    model.config._attn_implementation = "eager"
    model.generation_config.eos_token_id = None  # fixed-length continuations
    return model


@torch.no_grad()
def greedy(model, ids):
    x = torch.tensor([ids])
    out = model.generate(x, max_new_tokens=N_NEW, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
    new = out.sequences[0, len(ids):].tolist()
    gaps = []
    for s in out.scores:
        top = torch.topk(s[0].float(), 2).values
        gaps.append(float(top[0] - top[1]))
    # The cached path must agree with a cache-free forward over the whole sequence.
    full = model(out.sequences).logits[0, len(ids) - 1:-1].argmax(-1).tolist()
    assert full == new, "cached greedy differs from a cache-free forward"
    return new, min(gaps)


@torch.no_grad()
def nll(model, ids):
    logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    tgt = torch.tensor(ids[2:])
    return (-lp[1:-1].gather(1, tgt[:, None])[:, 0]).tolist()


def cut_passage(tok):
    text = open(os.path.join(REPO, "training", "work", "data", "heldout.txt")).read()
    start = text.index("BRUTUS.\nBe patient till the last.")  # Julius Caesar III.2 (held out from training)
    chunk = text[start:start + 12000]
    ids = tok(chunk, add_special_tokens=False)["input_ids"][:PASSAGE_TOKENS]
    passage = tok.decode(ids)
    assert tok(passage, add_special_tokens=False)["input_ids"] == ids, "passage does not round-trip"
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "heldout.txt"), "w") as f:
        f.write(passage)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--passage", action="store_true", help="re-cut tests/data/bard/heldout.txt")
    args = ap.parse_args()
    setup(PINS, quiet=False)
    torch.manual_seed(0)
    tok = transformers.AutoTokenizer.from_pretrained(MODEL)
    if args.passage:
        cut_passage(tok)
    passage = open(os.path.join(OUT, "heldout.txt")).read()
    model = load_model()
    topk = model.config.index_topk

    res = {"versions": PINS, "model": "models/sparsa-bard-12m", "index_topk": topk, "greedy": []}
    long_prompt = passage[:800]  # ~236 tokens
    for prompt in ["KING RICHARD:", long_prompt]:
        ids = tok(prompt)["input_ids"]
        new, gap = greedy(model, ids)
        res["greedy"].append({"prompt": prompt, "ids": ids, "new": new, "min_gap": gap})
        print(f"greedy: {len(ids)} prompt tokens, min top-1 gap {gap:.4f}: {tok.decode(new)[:60]!r}")

    ids = tok(passage)["input_ids"]
    assert len(ids) == PASSAGE_TOKENS + 2 and ids[:2] == tok("")["input_ids"], "passage ids"
    per = nll(model, ids)
    ppl = math.exp(sum(per) / len(per))
    dense = load_model(topk=10**9)
    per_dense = nll(dense, ids)
    ppl_dense = math.exp(sum(per_dense) / len(per_dense))
    res["heldout"] = {"ids": ids, "nll": per, "ppl": ppl, "nll_dense": per_dense, "ppl_dense": ppl_dense}
    print(f"held-out passage: {len(per)} predicted tokens, ppl {ppl:.4f} (sparse, top-{topk}), {ppl_dense:.4f} (dense)")
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
