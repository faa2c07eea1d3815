#!/usr/bin/env python3
"""Evaluates an exported sparsa demo model directory (HF format, as written by train.py) on the held-out works.

Pinned: as train.py (torch 2.15.0 / 2.11.0+cu130, transformers==5.24.0, tokenizers 0.23.x).
Run:    python3 training/evaluate.py MODEL_DIR OUT.json [--device cuda] [--ctx 512 1024]

The weights are loaded in float32 from the stored bf16 values (so the numbers are those of the shipped file), eager
attention, per-expert loop. Measured, at each context length T:
  ppl_dense      held-out perplexity with index_topk = 1e9 (dense causal attention)
  ppl_sparse     same weights, index_topk = 64 (transformers' DSA path: indexer top-k + IndexShare)
  ppl_window     same weights, every indexer replaced by "the 64 most recent keys" (a sliding-window baseline)
  recall[l]      indexer recall per layer: share of layer l's dense head-summed (L1-normalised) attention mass that
                 falls in the top-64 selection layer l uses (its own indexer for "full" layers, the previous full
                 layer's for "shared" ones), averaged over query rows with more than 64 causal keys;
                 recall_recent[l] is the same for the 64 most recent keys.
  indexer_match_hf  share of rows where common.indexer_scores' top-k equals transformers' own selection.
Plus greedy completions (sparse, 64 new tokens) for a few fixed prompts.
Held-out windows: non-overlapping, `[gMASK]<sop>` + T-2 tokens, every held-out token predicted once.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (Stream, Taps, head_summed, indexer_scores, selection_mask, served_layers, set_topk,  # noqa: E402
                    full_layers, WORK)

PROMPTS = [
    ("completion", "ROMEO.\nBut soft, what light through yonder window breaks?\n"),
    ("completion", "Of Man's first disobedience, and the fruit\n"),
    ("completion", "Ham.\nTo be, or not to be, that is the question:\n"),
    ("completion", "Bru.\nFriends, Romans, countrymen, lend me your ears;\n"),   # Julius Caesar: held out
    ("chat", "Good morrow, sir. What news from the court?"),
]


def load(model_dir, dev):
    from transformers import GlmMoeDsaForCausalLM
    m = GlmMoeDsaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager",
                                             experts_implementation="eager")
    m.to(dev).eval()
    return m


def recency_patch(model, k):
    """Replace every indexer's forward by 'the k most recent causal keys' (returns the originals)."""
    saved = {}
    for i in full_layers(model):
        ind = model.model.layers[i].self_attn.indexer
        saved[i] = ind.forward

        def fwd(hidden_states, q_resid, position_embeddings, attention_mask, position_ids, cache=None, _k=k):
            B, S, _ = hidden_states.shape
            T = attention_mask.shape[-1]
            t = torch.arange(S, device=hidden_states.device) + (T - S)
            idx = t[:, None] - torch.arange(min(_k, T), device=t.device)[None, :]
            idx = idx.clamp_min(0)
            return idx.to(torch.int32).expand(B, S, -1)
        ind.forward = fwd
    return saved


def unpatch(model, saved):
    for i, f in saved.items():
        model.model.layers[i].self_attn.indexer.forward = f


@torch.no_grad()
def nll(model, xs, ys, dev, bs):
    tot, n = 0.0, 0
    for i in range(0, xs.shape[0], bs):
        x, y = xs[i:i + bs].to(dev), ys[i:i + bs].to(dev)
        logits = model(input_ids=x, use_cache=False).logits
        tot += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100,
                               reduction="sum").item()
        n += (y != -100).sum().item()
    return tot / n, n


@torch.no_grad()
def recall(model, xs, dev, topk, bs, max_windows):
    """Dense forward; per layer, mass of the dense head-summed attention inside the selection of its full layer."""
    set_topk(model, 10 ** 9)
    taps = Taps(model, router=False)
    serve = {l: f for f, ls in served_layers(model).items() for l in ls}
    acc = {l: [0.0, 0.0, 0] for l in range(len(model.model.layers))}
    for i in range(0, min(xs.shape[0], max_windows), bs):
        taps.clear()
        x = xs[i:i + bs].to(dev)
        model(input_ids=x, use_cache=False)
        T = x.shape[1]
        sels = {}
        for f in full_layers(model):
            hidden, q_resid, pos_emb, mask = taps.ind_in[f]
            I = indexer_scores(model.model.layers[f].self_attn.indexer, hidden, q_resid, pos_emb, mask)
            sels[f] = selection_mask(I.topk(min(topk, T), dim=-1).indices, T, mask)
        tpos = torch.arange(T, device=dev)
        rows = tpos + 1 > topk  # rows where sparsity is real
        recent = (tpos[None, :] <= tpos[:, None]) & (tpos[None, :] > tpos[:, None] - topk)
        for l in acc:
            p = head_summed(taps.attn[l])  # [B, S, T]
            r = (p * sels[serve[l]]).sum(-1)[:, rows]
            rr = (p * recent).sum(-1)[:, rows]
            acc[l][0] += r.sum().item()
            acc[l][1] += rr.sum().item()
            acc[l][2] += r.numel()
    taps.remove()
    return ({str(l): v[0] / v[2] for l, v in acc.items()}, {str(l): v[1] / v[2] for l, v in acc.items()})


@torch.no_grad()
def match_hf(model, xs, dev, topk, bs, max_windows):
    set_topk(model, topk)
    taps = Taps(model, attn=False, router=False)
    same, rows = 0, 0
    for i in range(0, min(xs.shape[0], max_windows), bs):
        taps.clear()
        x = xs[i:i + bs].to(dev)
        model(input_ids=x, use_cache=False)
        for f in full_layers(model):
            hidden, q_resid, pos_emb, mask = taps.ind_in[f]
            I = indexer_scores(model.model.layers[f].self_attn.indexer, hidden, q_resid, pos_emb, mask)
            mine = I.topk(taps.topk[f].shape[-1], dim=-1).indices.sort(-1).values
            hf = taps.topk[f].long().sort(-1).values
            eq = (mine == hf).all(-1)[:, topk:]
            same += eq.sum().item()
            rows += eq.numel()
    taps.remove()
    return same / max(rows, 1)


def samples(model, dev, topk, n_new=64):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(WORK, "tokenizer", "tokenizer.json"))
    set_topk(model, topk)
    out = []
    for kind, text in PROMPTS:
        if kind == "chat":
            ids = [2, 4, 7] + tok.encode("\n" + text, add_special_tokens=False).ids + [8] + \
                tok.encode("\n", add_special_tokens=False).ids
        else:
            ids = tok.encode(text).ids  # post-processor prepends [gMASK]<sop>
        x = torch.tensor([ids], device=dev)
        g = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n_new)
        new = g[0, len(ids):].tolist()
        out.append(dict(kind=kind, prompt=text, prompt_ids=ids, completion_ids=new,
                        completion=tok.decode(new, skip_special_tokens=False)))
        print(json.dumps(out[-1]["prompt"]), "->", json.dumps(out[-1]["completion"]), flush=True)
    return out


def run(model_dir, out_json, dev, ctxs=(512, 1024), topk=64, bs=8, recall_windows=48, max_windows=None):
    t0 = time.time()
    dev = torch.device(dev)
    model = load(model_dir, dev)
    stream = Stream()
    res = dict(model_dir=os.path.basename(os.path.normpath(model_dir)), topk=topk, heldout_tokens=int(stream.heldout.numel()),
               indexer_types=model.config.indexer_types, full_layers=full_layers(model), ctx={})
    for T in ctxs:
        xs, ys = Stream.windows(stream.heldout, T, max_windows)
        r = {}
        set_topk(model, 10 ** 9)
        d, n = nll(model, xs, ys, dev, bs)
        set_topk(model, topk)
        s, _ = nll(model, xs, ys, dev, bs)
        saved = recency_patch(model, topk)
        w, _ = nll(model, xs, ys, dev, bs)
        unpatch(model, saved)
        r.update(tokens=n, windows=int(xs.shape[0]), nll_dense=d, nll_sparse=s, nll_window=w,
                 ppl_dense=float(torch.tensor(d).exp()), ppl_sparse=float(torch.tensor(s).exp()),
                 ppl_window=float(torch.tensor(w).exp()))
        r["recall"], r["recall_recent"] = recall(model, xs, dev, topk, bs, recall_windows)
        r["recall_full_layers_mean"] = sum(r["recall"][str(l)] for l in res["full_layers"]) / len(res["full_layers"])
        r["recall_all_layers_mean"] = sum(r["recall"].values()) / len(r["recall"])
        r["indexer_match_hf"] = match_hf(model, xs, dev, topk, bs, 16)
        res["ctx"][str(T)] = r
        print(json.dumps({"ctx": T, **{k: v for k, v in r.items()}}), flush=True)
    set_topk(model, topk)
    res["samples"] = samples(model, dev, topk)
    res["seconds"] = round(time.time() - t0, 1)
    with open(out_json, "w") as f:
        json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out_json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--ctx", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--recall-windows", type=int, default=48)
    ap.add_argument("--max-windows", type=int, default=0, help="limit held-out windows (smoke test)")
    a = ap.parse_args()
    run(a.model_dir, a.out_json, a.device, tuple(a.ctx), a.topk, recall_windows=a.recall_windows,
        max_windows=a.max_windows or None)
