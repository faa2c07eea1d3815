#!/usr/bin/env python3
"""Trains a multi-token-prediction (MTP) layer for the frozen sparsa demo model (models/sparsa-bard-12m), measures
its drafts against the main model's greedy choices, and exports it as `model.layers.8.*` (`num_nextn_predict_layers`
1), for `sparsa quantize` and `sparsa generate --draft N`.

Pinned: as train.py (torch 2.15.0 on CPU / the H200 image's torch 2.11.0+cu130, transformers==5.24.0 carried as a
wheel, tokenizers 0.23.x, safetensors 0.8.0, numpy 2.4.6). Data: training/work/tokens (data.py + tokenizer.py).

The layer (docs/MTP.md; sparsa's `Mtp` in src/model/load.rs, src/model/draft.rs):
  row i:   x_i = eh_proj([enorm(embed(t_{i+1})) ; hnorm(h_i)])  (embedding first; h_i = the main model's hidden
           after its final norm); out_i = decoder_layer(x_i) at RoPE position i, causal over the layer's own rows,
           with its own DSA indexer (top-64); logits_i = lm_head(shared_head.norm(out_i)) predict t_{i+2}.
  chained: draft step j+1 at row i takes (the drafted token, shared_head.norm(out) of step j at row i-1).
  embed_tokens and lm_head are the main model's (frozen, not exported twice). The decoder layer is transformers'
  GlmMoeDsaDecoderLayer(layer_idx 8), built from a config copy whose per-layer lists have a 9th entry
  (indexed_attention / sparse / full), so its tensors have the names of the main MoE layers.

Main model (frozen, DSA top-64 as sparsa runs it): by default (`--teacher q8`) the shipped q8 file dequantized.
`sparsa quantize --format q8` of the a5586a3 bf16 weights gives those q8 bytes exactly, so this is the main model
that runs next to the exported layer, and the file is in the repository (nothing to carry). `--teacher bf16`: the
a5586a3 bf16 weights (training/work/base/, extracted with git on first use).

Training:
  * K = --steps (3) draft steps unrolled over a window of S tokens (n = S - 1 rows per step). Step-j row p:
    embedding t_{p+1}, hidden = step j-1's normed output at row p-1 (step 1: main h_p), RoPE position p, target =
    the main model's next-token distribution at p+1. The K blocks of rows run as one sequence through the decoder
    layer under a mask that gives each row the keys it has at inference: step-1 rows at positions <= p-j+1 (the
    verified rows in the MTP caches), its own chain (step m at p-j+m) and itself. The indexer gets the same mask, so
    it picks among the same keys as sparsa (replay_check compares with a row-by-row replay). The hidden passed from
    step j to j+1 comes from a no-grad pass: the recurrence is not back-propagated through.
  * Loss per step: KL(main || MTP) over the vocabulary + --hard x CE to the main argmax; steps weighted by
    --step-weights (1, 0.6, 0.4).
  * Phase a (the MTP layer attends densely, index_topk 1e9): the layer learns that loss, its indexer the KL from
    the layer's head-summed dense attention (common.indexer_scores, the differentiable copy of transformers'
    indexer, inputs detached): train.py's stages a and b at once, the main model being frozen anyway.
  * Phase b (DSA, index_topk 64): the same loss through transformers' sparse path, the indexer the KL restricted
    to the keys it selected (train.py's stage c).
  * --own-windows N (on_policy): N windows of the main model's own continuations of corpus prefixes, greedy and
    sampled, make --own-frac of each batch, and --own-val of them (from the validation slice) join validation:
    the text the drafts meet at inference. --init shipped goes on from the shipped layer, keeping its state
    unless a phase validates better.
  * Expert balance: train.update_router_bias. Init: the decoder layer = a copy of the main model's last layer (7,
    a full-indexer MoE layer), shared_head.norm = model.norm, enorm / hnorm ones, eh_proj normal(0.02).
    Validation on the last 40960 train tokens (never trained on), DSA; the state with the most expected tokens per
    verification is kept. bf16 autocast on the GPU (fp32 master weights, fp32 residual stream and RoPE tables).

Evaluation (OUT/mtp_eval.json; float32, no autocast), for the exported values (`mtp_bf16`) and for those values
rounded exactly as `sparsa quantize --format q8` rounds them (`mtp_q8`: with the q8 main model, what sparsa runs):
  * greedy_heldout: --eval-prompts held-out prompts (The Tempest, Julius Caesar, Paradise Regained) of
    --prompt-tokens tokens; the main model greedy-generates --gen-tokens tokens (DSA, KV cache, stops at eos); then
    sparsa's draft loop (src/generate.rs `speculative`) is replayed on that text for k = 1 .. K: rounds, drafts,
    accepted, tokens per verification (= the mean accepted length incl. the main model's own token, as the
    drafts line of `sparsa generate -v`); top1[j]: agreement of step j+1's drafts with the main argmax.
  * fixed_prompts: the same for evaluate.py's prompts. With --gen-tokens 128 the `mtp_q8` numbers are what
    `sparsa generate -m Q8_DIR -p PROMPT -n 128 --temperature 0 --draft 3 -v` prints (checked on lavapipe).
  * heldout_windows: teacher-forced on held-out corpus windows: per-step KL and top-1 agreement with the main argmax.
  * indexer: recall of the MTP layer's top-64 (dense attention mass inside it, rows with > 64 keys) against the
    64 most recent keys.

Outputs: OUT/mtp_layer.safetensors (the layer's 47 tensors, bf16, e_score_correction_bias f32), mtp_eval.json,
mtp_log.json (every step), mtp.log; and where the a5586a3 bf16 base is at hand (--base, or git), the complete bf16
model directory --model-out (default OUT/mtp_model): base + layer in one model.safetensors, config.json = the base
config + "num_nextn_predict_layers": 1, tokenizer and generation config from models/sparsa-bard-12m.
`--assemble LAYER --model-out DIR` writes that directory from a layer file alone.

GPU (one H200, ~4 min):  python3 training/mtp.py --out OUT
CPU smoke test (~1.5 min): python3 training/mtp.py --device cpu --seq 128 --batch 4 --budget-a 25 --budget-b 25 \
    --deadline 70 --val-windows 4 --eval-windows 4 --eval-prompts 4 --gen-tokens 128 --recall-windows 4 --eval-bs 4 \
    --out /tmp/m1
"""
import argparse
import contextlib
import copy
import json
import os
import shutil
import subprocess
import sys
import time
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import (Stream, Taps, head_summed, indexer_scores, kl_rows, selection_mask, set_topk,  # noqa: E402
                    GMASK, SOP, WORK, EOT, USER, OBSERVATION)
from train import Sched, adamw, update_router_bias  # noqa: E402

REPO = os.path.dirname(HERE)
BASE_COMMIT = "a5586a3"
SHIPPED = os.path.join(REPO, "models", "sparsa-bard-12m")
DENSE = 10 ** 9
MTP_INDEX = 8  # num_hidden_layers of the base model: the MTP layer is model.layers.8
MTP_PREFIX = f"model.layers.{MTP_INDEX}."  # its tensors' names
LOG = None


def log_print(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    if LOG is not None:
        LOG.write(s + "\n")
        LOG.flush()


# ---------------------------------------------------------------- main model, file formats
def base_dir(path, required=True):
    """The a5586a3 bf16 weights + config (no quantization_config) in `path`; extracted with git if missing.
    Returns None where that fails and not `required`."""
    st, cfg = os.path.join(path, "model.safetensors"), os.path.join(path, "config.json")
    if not (os.path.exists(st) and os.path.exists(cfg)):
        try:
            os.makedirs(path, exist_ok=True)
            for name, dst in (("model.safetensors", st), ("config.json", cfg)):
                src = f"{BASE_COMMIT}:models/sparsa-bard-12m/{name}"
                blob = subprocess.check_output(["git", "-C", REPO, "show", src], stderr=subprocess.DEVNULL)
                with open(dst + ".tmp", "wb") as f:
                    f.write(blob)
                os.replace(dst + ".tmp", dst)
        except (OSError, subprocess.CalledProcessError) as e:
            if required:
                sys.exit(f"the bf16 base is missing in {path} and `git show {BASE_COMMIT}:...` failed ({e}); "
                         f"extract it where the repository's history is and carry {path}")
            return None
    return path


def q8_quantized(name):
    """Which tensors `sparsa quantize --format q8` turns into I8 + bf16 scales (the rest stays as stored)."""
    return not (name.endswith("_scale") or "embed_tokens" in name or name.endswith(".gate.weight")
                or "weights_proj" in name or "norm" in name or name.endswith("e_score_correction_bias"))


def q8_round(w, block=32):
    """dequant(quant(w)) exactly as sparsa's q8 (src/weights/quant.rs quantize_rows): per row and block of 32
    columns, scale = bf16(amax / 127), q = round-half-away(w / scale) clamped to +-127, value q * scale."""
    q, scale = q8_quantize(w, block)
    return (q.float() * scale.float().repeat_interleave(block, 1)[:, :q.shape[1]]).contiguous()


def read_dequantized(path):
    """A model directory's tensors in float32: sparsa q8 (I8 + `_scale`) dequantized, everything else upcast."""
    from safetensors import safe_open
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    raw = {}
    for fn in files:
        with safe_open(os.path.join(path, fn), "pt") as f:
            raw.update({k: f.get_tensor(k) for k in f.keys()})
    out = {}
    for k, v in raw.items():
        if k.endswith("_scale"):
            continue
        if v.dtype == torch.int8:
            s = raw[k + "_scale"].float()
            blk = -(-v.shape[1] // s.shape[1])
            out[k] = (v.float() * s.repeat_interleave(blk, 1)[:, :v.shape[1]]).contiguous()
        else:
            out[k] = v.float()
    return out


def shipped_split():
    """The shipped q8 model dequantized, as (main model's tensors, its MTP layer's tensors)."""
    t = read_dequantized(SHIPPED)
    return ({k: v for k, v in t.items() if not k.startswith(MTP_PREFIX)},
            {k: v for k, v in t.items() if k.startswith(MTP_PREFIX)})


def to_module_names(tensors):
    """File names (per-expert `experts.{e}.{gate,up,down}_proj.weight`) -> transformers' module names (stacked
    `experts.gate_up_proj` [E, 2I, H] = gate rows then up rows, `experts.down_proj` [E, H, I])."""
    out, experts = {}, {}
    for k, v in tensors.items():
        parts = k.split(".")
        if ".mlp.experts." in k and parts[-1] == "weight" and parts[-2] in ("gate_proj", "up_proj", "down_proj"):
            pre = ".".join(parts[:-3])
            experts.setdefault(pre, {})[(int(parts[-3]), parts[-2])] = v
        else:
            out[k] = v
    for pre, d in experts.items():
        E = 1 + max(e for e, _ in d)
        out[pre + ".gate_up_proj"] = torch.stack([torch.cat([d[(e, "gate_proj")], d[(e, "up_proj")]])
                                                  for e in range(E)])
        out[pre + ".down_proj"] = torch.stack([d[(e, "down_proj")] for e in range(E)])
    return out


def load_main(teacher, base, dev):
    """The frozen main model in float32, DSA top-64: `q8` = the shipped models/sparsa-bard-12m dequantized (what
    sparsa runs after `quantize --format q8` of the bf16 weights: the q8 bytes are identical), `bf16` = a5586a3."""
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM
    if teacher == "bf16":
        m = GlmMoeDsaForCausalLM.from_pretrained(base_dir(base), dtype=torch.float32, attn_implementation="eager",
                                                 experts_implementation="eager")
    else:
        cfg = json.load(open(os.path.join(SHIPPED, "config.json")))
        cfg.pop("quantization_config")
        cfg = GlmMoeDsaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type",
                                                                          "transformers_version")})
        cfg._attn_implementation = "eager"
        cfg._experts_implementation = "eager"
        m = GlmMoeDsaForCausalLM(cfg)
        m.load_state_dict(to_module_names(shipped_split()[0]), strict=True)
        m.generation_config.eos_token_id = [EOT, USER, OBSERVATION]
        m.generation_config.pad_token_id = EOT
    m.float()
    for n_, b in m.named_buffers():
        assert b.dtype == torch.float32 or not b.is_floating_point(), n_
    set_topk(m, m.config.index_topk)  # DSA top-64, as shipped and as sparsa runs it
    m.to(dev).eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


# ---------------------------------------------------------------- the MTP layer
class MtpLayer(nn.Module):
    """enorm, hnorm, eh_proj, the decoder layer (`layer`), shared_head.norm. Names map to model.layers.8.*."""

    def __init__(self, main_cfg):
        super().__init__()
        from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaDecoderLayer, GlmMoeDsaRMSNorm
        cfg = copy.deepcopy(main_cfg)
        n = cfg.num_hidden_layers
        assert n == MTP_INDEX, n
        cfg.layer_types = list(cfg.layer_types) + ["indexed_attention"]
        cfg.mlp_layer_types = list(cfg.mlp_layer_types) + ["sparse"]
        cfg.indexer_types = list(cfg.indexer_types) + ["full"]
        cfg._attn_implementation = "eager"
        cfg._experts_implementation = "eager"
        self.cfg = cfg
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.enorm = GlmMoeDsaRMSNorm(H, eps)
        self.hnorm = GlmMoeDsaRMSNorm(H, eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = GlmMoeDsaRMSNorm(H, eps)
        self.layer = GlmMoeDsaDecoderLayer(cfg, n)
        assert self.layer.self_attn.indexer is not None and hasattr(self.layer.mlp, "gate")

    def init_from(self, main, std=0.02):
        self.layer.load_state_dict(main.model.layers[MTP_INDEX - 1].state_dict())
        self.shared_head.norm.weight.data.copy_(main.model.norm.weight.data)
        nn.init.ones_(self.enorm.weight)
        nn.init.ones_(self.hnorm.weight)
        nn.init.normal_(self.eh_proj.weight, 0.0, std)

    def inputs(self, emb, h):
        return self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h)], dim=-1))

    def run(self, x, mask, pos_emb):
        out, _ = self.layer(x, attention_mask=mask, position_embeddings=pos_emb, position_ids=None, cache=None,
                            use_cache=False)
        return out

    def indexer_params(self):
        return [p for n, p in self.named_parameters() if ".indexer." in n]

    def other_params(self):
        return [p for n, p in self.named_parameters() if ".indexer." not in n]


def set_mtp_topk(mtp, k):
    mtp.cfg.index_topk = k
    mtp.layer.self_attn.indexer.index_topk = k


class Shim:
    """Lets common.Taps and train.update_router_bias see the MTP decoder layer as model.model.layers[0]."""

    def __init__(self, layer):
        self.model = types.SimpleNamespace(layers=[layer])


_MASKS = {}


def chain_mask(n, K, dev):
    """Additive mask [1, 1, K*n, K*n] over K blocks of n rows (block j = draft step j+1, row p = position p).
    Query (j, p) sees: step-1 rows q <= p - j, the chain rows (m, p - j + m) for 1 <= m <= j, itself."""
    key = (n, K, str(dev))
    if key not in _MASKS:
        p = torch.arange(n, device=dev)
        rows = []
        for j in range(K):
            blocks = []
            for m in range(K):
                if m == 0:
                    a = p[None, :] <= p[:, None] - j
                elif m <= j:
                    a = p[None, :] == p[:, None] - (j - m)
                else:
                    a = torch.zeros(n, n, dtype=torch.bool, device=dev)
                blocks.append(a)
            rows.append(torch.cat(blocks, 1))
        allowed = torch.cat(rows, 0)
        allowed |= torch.eye(K * n, dtype=torch.bool, device=dev)
        m = torch.zeros(K * n, K * n, device=dev).masked_fill(~allowed, torch.finfo(torch.float32).min)
        _MASKS[key] = m[None, None]
    return _MASKS[key]


def chain(mtp, main, ids, h, K, grad, taps=None):
    """The MTP layer over a window: ids [B, S] (the main model's input), h [B, S, H] its hiddens after the final norm.
    Returns logits [B, K, n, V] (n = S - 1; step j+1's row p predicts ids[p + 2], target main logits[p + 1]).
    Steps 1 .. K-1 run without gradient to produce the next step's hidden; the last pass runs all K blocks."""
    B, S = ids.shape
    n = S - 1
    dev = ids.device
    emb = main.model.embed_tokens(ids[:, 1:])
    hin = [h[:, :n]]
    pos = torch.arange(n, device=dev)

    def pass_(j, x):
        mask = chain_mask(n, j, dev).expand(B, 1, j * n, j * n)
        cos_sin = main.model.rotary_emb(x.float(), pos.repeat(j)[None])  # fp32 cos / sin
        return mtp.run(x, mask, cos_sin)

    if taps is not None:
        taps.want_attn = False
    with torch.no_grad():
        for j in range(1, K):
            x = torch.cat([mtp.inputs(emb, hin[m]) for m in range(j)], 1).float()
            out = mtp.shared_head.norm(pass_(j, x)[:, (j - 1) * n:])
            hin.append(F.pad(out[:, :-1], (0, 0, 1, 0)))  # row p gets step j's row p-1 (row 0: zeros, invalid)
    if taps is not None:
        taps.clear()
        taps.want_attn = True
    with contextlib.nullcontext() if grad else torch.no_grad():
        x = torch.cat([mtp.inputs(emb, hin[m]) for m in range(K)], 1).float()  # fp32 residual stream, as the
        out = mtp.shared_head.norm(pass_(K, x))                                 # main model's under autocast
        logits = main.lm_head(out)
    return logits.view(B, K, n, -1)


@torch.no_grad()
def main_forward(main, ids):
    out = main.model(input_ids=ids, use_cache=False)
    h = out.last_hidden_state
    return h, main.lm_head(h)


def step_valid(K, n, dev):
    """bool [K, n]: step j+1's row p has a real chain (p >= j)."""
    p = torch.arange(n, device=dev)
    return torch.stack([p >= j for j in range(K)])


def distill(logits, z, weights, hard):
    """logits [B, K, n, V] (MTP), z [B, S, V] main logits. Per step: masked mean of KL(main || mtp) + hard * CE to the
    main argmax. Returns the weighted loss and per-step stats."""
    B, K, n, V = logits.shape
    t = F.log_softmax(z[:, 1:].float(), -1)
    arg = t.argmax(-1)
    valid = step_valid(K, n, logits.device)
    loss, kls, accs = 0.0, [], []
    for j in range(K):
        lq = F.log_softmax(logits[:, j].float(), -1)
        kl = F.kl_div(lq, t, log_target=True, reduction="none").sum(-1)
        ce = -lq.gather(-1, arg[..., None]).squeeze(-1)
        v = valid[j].expand(B, n)
        lj = ((kl + hard * ce) * v).sum() / v.sum()
        loss = loss + weights[j] * lj
        kls.append(((kl * v).sum() / v.sum()).item())
        accs.append((((lq.argmax(-1) == arg) & v).sum() / v.sum()).item())
    return loss, kls, accs


def indexer_kl(mtp, taps, sparse, kb):
    """KL(head-summed attention of the MTP layer || softmax(indexer scores)) over the first kb windows; on the
    selected keys only in DSA mode. Inputs detached: only the indexer learns from it."""
    hidden, q_resid, pos_emb, mask = taps.ind_in[0]
    L = mask.shape[-1]
    p = head_summed(taps.attn[0][:kb].detach())
    logits = indexer_scores(mtp.layer.self_attn.indexer, hidden[:kb].detach(), q_resid[:kb].detach(),
                            tuple(t.detach() for t in pos_emb), mask[:kb])
    keep = selection_mask(taps.topk[0][:kb], L, mask[:kb]) if sparse else None
    return kl_rows(p, logits, keep)


def accepted_expectation(ok):
    """ok [K, n] bool per window (ok[j, p]: step j+1's draft at row p equals the main argmax). Expected accepted
    drafts of a round starting at each position P (drafts at rows P-1, P, P+1 ...), averaged: per k = 1 .. K."""
    K, n = ok.shape
    out = []
    for k in range(1, K + 1):
        m = n - k + 1
        if m <= 0:
            out.append(0.0)
            continue
        run = torch.ones(m, dtype=torch.bool, device=ok.device)
        acc = torch.zeros(m, device=ok.device)
        for j in range(k):
            run = run & ok[j, j:j + m]
            acc += run.float()
        out.append(acc.mean().item())
    return out


@torch.no_grad()
def validate(mtp, main, cache, K, amp):
    """Teacher-forced on cached windows [(ids, h, z)]: per-step KL and top-1 agreement with the main argmax, and
    the expected accepted length (tokens per verification) for k = K."""
    was = mtp.training
    mtp.eval()
    kl, acc, tpv, nw = [0.0] * K, [0.0] * K, 0.0, 0
    for ids, h, z in cache:
        with amp():
            logits = chain(mtp, main, ids, h, K, grad=False)
        _, kls, accs = distill(logits, z, [1.0] * K, 0.0)
        arg = z[:, 1:].float().argmax(-1)
        ok = logits.argmax(-1) == arg[:, None]
        for b in range(ids.shape[0]):
            tpv += 1 + accepted_expectation(ok[b])[-1]
        for j in range(K):
            kl[j] += kls[j] * ids.shape[0]
            acc[j] += accs[j] * ids.shape[0]
        nw += ids.shape[0]
    mtp.train(was)
    return dict(val_kl=[round(x / nw, 4) for x in kl], val_top1=[round(x / nw, 4) for x in acc], val_tpv=tpv / nw)


# ---------------------------------------------------------------- training
def train_phase(name, args, mtp, main, stream, taps, dev, amp, budget, max_steps, opt, sched, sparse, val_cache,
                deadline, seed, own=None, start=None):
    """own: the main model's own windows (on_policy); args.own_frac of each batch's windows are drawn from them.
    start: (val_tpv, state) to beat, where the layer did not start new (--init shipped): a phase never ends worse."""
    gen = torch.Generator().manual_seed(seed)
    set_mtp_topk(mtp, args.topk if sparse else DENSE)
    t0 = time.time()
    budget = min(budget, deadline - t0)
    fixed = getattr(args, f"steps_{name}")
    sched.total = fixed or max_steps
    K, w = args.steps, args.step_weights
    best, best_state = start if start is not None else (-1.0, None)
    step, tokens, recs, tcal, val_every = 0, 0, [], None, None
    other, ind = mtp.other_params(), mtp.indexer_params()
    while True:
        if step >= sched.total or (not fixed and time.time() - t0 > budget):
            break
        x, _ = stream.batch(gen, args.batch, args.seq)
        m = int(round(args.batch * args.own_frac)) if own is not None else 0
        if m:
            x = torch.cat([x[:args.batch - m], own[torch.randint(0, own.shape[0], (m,), generator=gen)]])
        x = x.to(dev, non_blocking=True)
        lrf = sched.set(step)
        with amp():
            h, z = main_forward(main, x)
            logits = chain(mtp, main, x, h, K, grad=True, taps=taps)
            loss, kls, accs = distill(logits, z, w, args.hard)
            ikl = indexer_kl(mtp, taps, sparse, args.kl_batch)
        (loss + ikl).backward()
        gn = torch.nn.utils.clip_grad_norm_(other, 1.0)
        torch.nn.utils.clip_grad_norm_(ind, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        imb = update_router_bias(Shim(mtp.layer), taps, args.gamma)
        step += 1
        tokens += x.numel()
        if step == 3:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            tcal = time.time()
        if step == 13 and not fixed:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t_step = (time.time() - tcal) / 10
            el = time.time() - t0
            by_time = step + int((budget - el) / (t_step * 1.1))  # 10 % margin for validation passes
            sched.total = max(step + 1, min(max_steps, by_time))
            log_print(f"[{name}] {t_step * 1000:.0f} ms/step, {x.numel() / t_step / 1e3:.0f}k tok/s -> "
                      f"{sched.total} steps (cap {max_steps})")
        if val_every is None and (fixed or step >= 13):
            val_every = max(10, sched.total // args.val_times)
        rec = dict(phase=name, step=step, tokens=tokens, lr_factor=round(lrf, 4), t=round(time.time() - t0, 2),
                   loss=round(loss.item(), 4), kl=[round(k, 4) for k in kls], top1=[round(a, 4) for a in accs],
                   indexer_kl=round(ikl.item(), 4), gnorm=round(gn.item(), 3), expert_imbalance=round(imb, 3))
        if val_every and (step % val_every == 0 or step == sched.total):
            set_mtp_topk(mtp, args.topk)
            rec.update(validate(mtp, main, val_cache, K, amp))
            set_mtp_topk(mtp, args.topk if sparse else DENSE)
            taps.clear()
            if rec["val_tpv"] > best:
                best = rec["val_tpv"]
                best_state = {k: v.detach().clone() for k, v in mtp.state_dict().items()}
                rec["best"] = True
        recs.append(rec)
        if step % args.print_every == 0 or "val_tpv" in rec or step <= 2:
            log_print(json.dumps(rec))
    set_mtp_topk(mtp, args.topk)
    v = validate(mtp, main, val_cache, K, amp)
    recs.append(dict(phase=name, step=step, tokens=tokens, t=round(time.time() - t0, 2), final=True, **v))
    if v["val_tpv"] >= best:
        best = v["val_tpv"]
    elif best_state is not None:
        mtp.load_state_dict(best_state)
        log_print(f"[{name}] restored best val_tpv {best:.4f}")
    summary = dict(phase=name, steps=step, planned_steps=sched.total, tokens=tokens,
                   seconds=round(time.time() - t0, 1), best_val_tpv=round(best, 4), final=v)
    log_print(json.dumps(summary))
    return recs, summary


# ---------------------------------------------------------------- evaluation
def simulate_rounds(ok, n0, N, K, budget):
    """sparsa's draft loop (src/generate.rs `speculative`) on a known greedy text s[0 .. N-1] whose prompt is s[:n0]
    (generation stopped at eos or after `budget` tokens): ok[j, p] (step j+1's draft at row p == s[p + 2]).
    `next` = s[P] (P = n0 first); a round drafts k = min(K, budget - emitted - 1) tokens, at rows P-1+j, accepts
    the agreeing prefix and emits it + the main model's token. (Drafts past an eos, which sparsa could still
    count as accepted, are not known here.)"""
    P, out, rounds, drafted, accepted = n0, 1, 0, 0, 0
    G = N - n0
    while out < G:
        k = min(K, budget - out - 1)
        a = 0
        while a < k and P - 1 + a < ok.shape[1] and bool(ok[a, P - 1 + a]):
            a += 1
        emit = min(a + 1, G - out)
        rounds += 1
        drafted += k
        accepted += a
        out += emit
        P += emit
    return rounds, drafted, accepted


@torch.no_grad()
def replay_check(mtp, main, ids, starts, K):
    """chain()'s block mask against sparsa's order of rows, built independently: for a round starting at P, the MTP
    caches hold the step-1 rows 0 .. P-1, then step j+1's row at position P-1+j; each row sees every row before it
    (a plain causal mask over that list). Returns the largest logit difference (float32)."""
    dev = ids.device
    h, _ = main_forward(main, ids)
    ref = chain(mtp, main, ids, h, K, grad=False)[0]  # [K, n, V]
    emb = main.model.embed_tokens(ids[0, 1:])[None]
    worst = 0.0
    for P in starts:
        x1 = mtp.inputs(emb[:, :P], h[:, :P])  # step-1 rows at positions 0 .. P-1
        rows, pos, hj = x1, list(range(P)), None
        for j in range(K):
            if j > 0:
                xj = mtp.inputs(emb[:, P - 1 + j:P + j], hj)
                rows, pos = torch.cat([rows, xj], 1), pos + [P - 1 + j]
            L = rows.shape[1]
            causal = torch.full((L, L), torch.finfo(torch.float32).min, device=dev).triu(1)[None, None]
            out = mtp.run(rows, causal, main.model.rotary_emb(rows, torch.tensor([pos], device=dev)))
            hj = mtp.shared_head.norm(out[:, -1:])
            worst = max(worst, (main.lm_head(hj)[0, 0] - ref[j, P - 1 + j]).abs().max().item())
    return worst


@torch.no_grad()
def greedy(main, prompts, n_new, eos):
    """Greedy continuations (DSA, KV cache); each cut after its first eos. prompts: list of equal-length id lists."""
    dev = main.device
    x = torch.tensor(prompts, device=dev)
    g = main.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n_new,
                      eos_token_id=eos, pad_token_id=eos[0])
    outs = []
    for row in g.tolist():
        new = row[x.shape[1]:]
        for i, t in enumerate(new):
            if t in eos:
                new = new[:i + 1]
                break
        outs.append(new)
    return outs


@torch.no_grad()
def on_policy(main, tokens, n, seq, bs, seed, sampled, temperature):
    """n windows of seq tokens in the training framing ([gMASK] <sop> body), whose body is a random prefix of
    `tokens` (16 .. seq/2 tokens, one length per batch) and then the frozen main model's own continuation (DSA, KV
    cache, eos not stopping it, as `--ignore-eos`): greedy in the first n - round(n * sampled) windows, sampled at
    `temperature` in the rest. The drafts are judged against the main model's choices on its own text, so this is
    the text a draft layer meets at inference; the corpus alone is not (a frozen model's greedy text repeats)."""
    dev = main.device
    g = torch.Generator().manual_seed(seed)
    gc = copy.deepcopy(main.generation_config)
    gc.eos_token_id, gc.pad_token_id = None, EOT
    n_sampled = int(round(n * sampled))
    out = []
    while sum(x.shape[0] for x in out) < n:
        done = sum(x.shape[0] for x in out)
        b = min(bs, n - done)
        do_sample = done >= n - n_sampled
        if not do_sample:
            b = min(b, n - n_sampled - done)
        P = int(torch.randint(16, seq // 2 + 1, (1,), generator=g))
        off = torch.randint(0, tokens.numel() - P, (b,), generator=g).tolist()
        x = torch.stack([torch.cat([torch.tensor([GMASK, SOP]), tokens[o:o + P]]) for o in off]).to(dev)
        kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if do_sample else dict(do_sample=False)
        if do_sample:
            torch.manual_seed(seed + done)
        y = main.generate(x, attention_mask=torch.ones_like(x), generation_config=gc, max_new_tokens=seq - 2 - P, **kw)
        assert y.shape[1] == seq, (y.shape, seq)
        out.append(y.cpu())
    return torch.cat(out)


@torch.no_grad()
def draft_eval(mtp, main, seqs, n0s, K, budget, bs=16):
    """Per sequence (prompt + greedy continuation): drafts from the chained MTP layer teacher-forced on the text,
    per-step agreement with the main argmax (= the next greedy token) on rows that predict generated tokens,
    and the draft loop replayed for k = 1 .. K."""
    dev = main.device
    per = []
    for i in range(0, len(seqs), bs):
        chunk, c0 = seqs[i:i + bs], n0s[i:i + bs]
        S = max(len(s) for s in chunk)
        ids = torch.tensor([s + [0] * (S - len(s)) for s in chunk], device=dev)  # causal: padding never seen
        h, _ = main_forward(main, ids)
        logits = chain(mtp, main, ids, h, K, grad=False)
        d = logits.argmax(-1)  # [B, K, n]
        for b, (s, n0) in enumerate(zip(chunk, c0)):
            N = len(s)
            tgt = torch.tensor(s[2:] + [-1] * (S - N + 1), device=dev)  # row p's draft should be s[p + 2]
            ok = (d[b] == tgt[None]).cpu()
            rows = torch.arange(S - 1)
            gen_rows = (rows + 2 >= n0 + 1) & (rows + 2 <= N - 1)   # predicts a generated token after the first
            r = dict(prompt_tokens=n0, generated=N - n0)
            r["top1"] = [((ok[j] & gen_rows & (rows >= j)).sum() / (gen_rows & (rows >= j)).sum().clamp_min(1)).item()
                         for j in range(K)]
            r["rows"] = [int((gen_rows & (rows >= j)).sum()) for j in range(K)]
            r["sim"] = {}
            for k in range(1, K + 1):
                rounds, drafted, acc = simulate_rounds(ok, n0, N, k, budget)
                r["sim"][str(k)] = dict(rounds=rounds, drafted=drafted, accepted=acc,
                                        tokens_per_verification=(acc + rounds) / max(rounds, 1))
            per.append(r)
    return per


def summarize(per, K):
    rows = [sum(r["rows"][j] for r in per) for j in range(K)]
    top1 = [sum(r["top1"][j] * r["rows"][j] for r in per) / max(rows[j], 1) for j in range(K)]
    sim = {}
    for k in range(1, K + 1):
        R = sum(r["sim"][str(k)]["rounds"] for r in per)
        A = sum(r["sim"][str(k)]["accepted"] for r in per)
        D = sum(r["sim"][str(k)]["drafted"] for r in per)
        sim[str(k)] = dict(rounds=R, drafted=D, accepted=A, acceptance=A / max(D, 1),
                           tokens_per_verification=(A + R) / max(R, 1))
    return dict(sequences=len(per), generated=sum(r["generated"] for r in per), top1=top1, rows=rows, sim=sim)


@torch.no_grad()
def indexer_recall(mtp, main, cache, topk):
    """Step-1 rows of held-out windows, the layer in dense mode: share of its head-summed attention mass inside the
    indexer's top-k (common.indexer_scores, checked against transformers' own selection) and inside the k most
    recent keys, over rows with more than k keys; plus how often the replica's top-k equals transformers'."""
    taps = Taps(Shim(mtp.layer), router=False)
    ind = mtp.layer.self_attn.indexer
    r_sel = r_rec = rows = same = 0.0
    for ids, h, _ in cache:
        set_mtp_topk(mtp, topk)
        taps.clear()
        chain(mtp, main, ids, h, 1, grad=False)
        hf = taps.topk[0].long().sort(-1).values
        set_mtp_topk(mtp, DENSE)
        taps.clear()
        chain(mtp, main, ids, h, 1, grad=False)
        hidden, q_resid, pos_emb, mask = taps.ind_in[0]
        T = mask.shape[-1]
        I = indexer_scores(ind, hidden, q_resid, pos_emb, mask)
        top = I.topk(min(topk, T), dim=-1).indices
        sel = selection_mask(top, T, mask)
        p = head_summed(taps.attn[0])
        t = torch.arange(T, device=p.device)
        keep = t + 1 > topk
        recent = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - topk)
        r_sel += (p * sel).sum(-1)[:, keep].sum().item()
        r_rec += (p * recent).sum(-1)[:, keep].sum().item()
        rows += keep.sum().item() * ids.shape[0]
        same += (top.sort(-1).values == hf).all(-1)[:, keep].sum().item()
    taps.remove()
    set_mtp_topk(mtp, topk)
    return dict(recall=r_sel / max(rows, 1), recall_recent=r_rec / max(rows, 1), rows=int(rows),
                replica_matches_hf=same / max(rows, 1))


def eval_variant(args, mtp, main, seqs, n0s, fixed_seqs, cache, tag):
    K = args.steps
    set_mtp_topk(mtp, args.topk)
    res = {}
    per = draft_eval(mtp, main, seqs, n0s, K, args.gen_tokens)
    res["greedy_heldout"] = summarize(per, K)
    log_print(f"[{tag}] greedy held-out prompts:", json.dumps(res["greedy_heldout"]))
    res["fixed_prompts"] = []
    for kind, text, ids, cont in fixed_seqs:
        r = draft_eval(mtp, main, [ids + cont], [len(ids)], K, args.gen_tokens)[0]
        r.update(kind=kind, prompt=text)
        res["fixed_prompts"].append(r)
        log_print(f"[{tag}]", json.dumps(dict(prompt=text, generated=r["generated"],
                                              top1=[round(a, 3) for a in r["top1"]],
                                              sim3=r["sim"][str(K)])))
    v = validate(mtp, main, cache, K, contextlib.nullcontext)
    res["heldout_windows"] = dict(windows=sum(c[0].shape[0] for c in cache), seq=args.seq, kl=v["val_kl"],
                                  top1=v["val_top1"], expected_tokens_per_verification=v["val_tpv"])
    log_print(f"[{tag}] held-out windows (teacher-forced corpus):", json.dumps(res["heldout_windows"]))
    return res


def evaluate(args, mtp_variants, main, stream, dev, out_json):
    """mtp_variants: {tag: MtpLayer (float32)}; the first one also gets the indexer recall."""
    import evaluate as ev
    from tokenizers import Tokenizer
    t0 = time.time()
    eos = [EOT, USER, OBSERVATION]
    res = dict(main=args.teacher, steps=args.steps, topk=args.topk, gen_tokens=args.gen_tokens,
               prompt_tokens=args.prompt_tokens)
    # greedy continuations of held-out prompts (The Tempest, Julius Caesar, Paradise Regained)
    held = stream.heldout
    L = args.prompt_tokens - 2
    offs = torch.linspace(0, held.numel() - L - 1, args.eval_prompts).long().tolist()
    prompts = [[GMASK, SOP] + held[o:o + L].tolist() for o in offs]
    seqs, n0s = [], []
    for i in range(0, len(prompts), args.gen_batch):
        batch = prompts[i:i + args.gen_batch]
        for p, c in zip(batch, greedy(main, batch, args.gen_tokens, eos)):
            seqs.append(p + c)
            n0s.append(len(p))
    res["heldout_prompt_offsets"] = offs
    # evaluate.py's fixed prompts, encoded as `sparsa generate -p` encodes them
    tok = Tokenizer.from_file(os.path.join(SHIPPED, "tokenizer.json"))
    fixed = []
    for kind, text in ev.PROMPTS:
        if kind == "chat":
            ids = [2, 4, 7] + tok.encode("\n" + text, add_special_tokens=False).ids + [8] + \
                tok.encode("\n", add_special_tokens=False).ids
        else:
            ids = tok.encode(text).ids
        cont = greedy(main, [ids], args.gen_tokens, eos)[0]
        fixed.append((kind, text, ids, cont))
    res["fixed_prompt_completions"] = [dict(kind=k, prompt=t, prompt_ids=i, completion_ids=c,
                                            completion=tok.decode(c, skip_special_tokens=False))
                                       for k, t, i, c in fixed]
    xs, _ = Stream.windows(held, args.seq, args.eval_windows or None)
    cache = []
    for i in range(0, xs.shape[0], args.eval_bs):
        ids = xs[i:i + args.eval_bs].to(dev)
        h, z = main_forward(main, ids)
        cache.append((ids, h, z))
    for n, (tag, mtp) in enumerate(mtp_variants.items()):
        mtp.eval()
        if n == 0:
            ids = torch.tensor([seqs[0]], device=dev)
            L0 = ids.shape[1]
            res["replay_check_max_logit_diff"] = replay_check(mtp, main, ids, [3, L0 // 2, L0 - 3], args.steps)
            log_print(f"[{tag}] block-mask chain vs row-by-row replay: max logit diff "
                      f"{res['replay_check_max_logit_diff']:.2e}")
            res["indexer"] = indexer_recall(mtp, main, cache[:max(1, args.recall_windows // args.eval_bs)], args.topk)
            log_print(f"[{tag}] MTP indexer:", json.dumps(res["indexer"]))
        res["mtp_" + tag] = eval_variant(args, mtp, main, seqs, n0s, fixed, cache, tag)
    res["seconds"] = round(time.time() - t0, 1)
    with open(out_json, "w") as f:
        json.dump(res, f, indent=1)
    return res


# ---------------------------------------------------------------- export
def layer_tensors(mtp, cast=True):
    """The MTP layer's tensors under sparsa / the releases' names (model.layers.8.*), per-expert MoE names as
    save_pretrained writes them; bf16 with e_score_correction_bias f32 (cast), else float32 as trained."""
    p = MTP_PREFIX
    out = {}
    for k, v in mtp.state_dict().items():
        v = v.detach().to("cpu")
        name = p + (k[len("layer."):] if k.startswith("layer.") else k)
        if k.endswith("mlp.experts.gate_up_proj"):
            I = v.shape[1] // 2
            base = name[: -len("gate_up_proj")]
            for e in range(v.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :I].contiguous()
                out[f"{base}{e}.up_proj.weight"] = v[e, I:].contiguous()
            continue
        if k.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = v[e].contiguous()
            continue
        out[name] = v
    if not cast:
        return out
    return {k: (v.float() if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)).contiguous()
            for k, v in out.items()}


def mtp_from_tensors(main_cfg, tensors, q8=False):
    """An MtpLayer (float32) from model.layers.8.* file tensors; q8: rounded as `sparsa quantize --format q8`."""
    p = MTP_PREFIX
    m = MtpLayer(main_cfg)
    t = {k: (q8_round(v) if q8 and q8_quantized(k) else v.float()) for k, v in tensors.items()}
    sd = {}
    for k, v in to_module_names(t).items():
        k = k[len(p):]
        sd[k if k.split(".")[0] in ("enorm", "hnorm", "eh_proj", "shared_head") else "layer." + k] = v
    m.load_state_dict(sd, strict=True)
    return m


def check_names(main, teacher, base):
    """Our name conversion both ways on the main model's layer 7: file -> module (load_main) -> file
    (layer_tensors) gives back the file's layer-7 tensor names and values (float32) exactly."""
    shim = MtpLayer(main.config)
    shim.layer.load_state_dict(main.model.layers[MTP_INDEX - 1].state_dict())
    mine = {k.replace(MTP_PREFIX, f"model.layers.{MTP_INDEX - 1}."): v
            for k, v in layer_tensors(shim, cast=False).items()
            if k.split(".")[3] not in ("enorm", "hnorm", "eh_proj", "shared_head")}
    src = SHIPPED if teacher == "q8" else base_dir(base)
    theirs = {k: v for k, v in read_dequantized(src).items() if k.startswith(f"model.layers.{MTP_INDEX - 1}.")}
    assert set(mine) == set(theirs), sorted(set(mine) ^ set(theirs))
    for k in mine:
        assert torch.equal(mine[k].float(), theirs[k]), k
    return len(mine)


def assemble(layer_file, base, model_out):
    """Complete bf16 model directory: base tensors + the MTP layer, config + num_nextn_predict_layers 1."""
    from safetensors.torch import load_file, save_file
    tensors = load_file(os.path.join(base, "model.safetensors"))
    layer = load_file(layer_file)
    assert not any(k in tensors for k in layer)
    assert all(k.startswith(MTP_PREFIX) for k in layer)
    tensors.update(layer)
    os.makedirs(model_out, exist_ok=True)
    save_file(dict(sorted(tensors.items())), os.path.join(model_out, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(base, "config.json")))
    cfg.pop("quantization_config", None)
    cfg["num_nextn_predict_layers"] = 1
    with open(os.path.join(model_out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(os.path.join(SHIPPED, name), os.path.join(model_out, name))
    return model_out


def q8_quantize(w, block=32):
    """sparsa's q8 bytes of a weight (src/weights/quant.rs quantize_rows): I8 [N, K] and bf16 scales [N, K/32
    rounded up]; q8_round(w) == q * scale."""
    w = w.float()
    N, K = w.shape
    b = F.pad(w, (0, (-K) % block)).view(N, -1, block)
    scale = (b.abs().amax(-1, keepdim=True) / 127.0).to(torch.bfloat16).float()
    r = b / torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (torch.sign(r) * torch.floor(r.abs() + 0.5)).clamp(-127, 127)
    q = torch.where(scale > 0, q, torch.zeros_like(q))
    return q.view(N, -1)[:, :K].to(torch.int8).contiguous(), scale.view(N, -1).to(torch.bfloat16).contiguous()


def splice_q8(layer_file, model_out):
    """The shipped q8 model directory with its MTP layer replaced by `layer_file`'s, quantized as `sparsa quantize
    --format q8` quantizes it: what sparsa runs, written without the a5586a3 bf16 base (on the GPU machine)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    src = os.path.join(SHIPPED, "model.safetensors")
    with safe_open(src, "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys() if not k.startswith(MTP_PREFIX)}
    for k, v in load_file(layer_file).items():
        assert k.startswith(MTP_PREFIX), k
        if q8_quantized(k) and v.dim() == 2:
            tensors[k], tensors[k + "_scale"] = q8_quantize(v)
        else:
            tensors[k] = v
    os.makedirs(model_out, exist_ok=True)
    for name in os.listdir(SHIPPED):
        if name != "model.safetensors":
            shutil.copyfile(os.path.join(SHIPPED, name), os.path.join(model_out, name))
    save_file(dict(sorted(tensors.items())), os.path.join(model_out, "model.safetensors"), metadata=meta)
    return model_out


# ---------------------------------------------------------------- main
def main():
    global LOG
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="run folder: mtp_layer.safetensors, mtp_eval.json, mtp_log.json, mtp.log")
    ap.add_argument("--model-out", help="complete bf16 model directory (default OUT/mtp_model; written where the "
                                        "a5586a3 base is available)")
    ap.add_argument("--assemble", metavar="LAYER", help="only write --model-out from this mtp_layer.safetensors")
    ap.add_argument("--splice-q8", metavar="LAYER", help="only write --model-out: the shipped q8 model with this "
                                                          "mtp_layer.safetensors quantized in place of its MTP layer")
    ap.add_argument("--base", default=os.path.join(WORK, "base"), help="a5586a3 bf16 model (extracted if missing)")
    ap.add_argument("--teacher", choices=["q8", "bf16"], default="q8",
                    help="main model: the shipped q8 file dequantized (what runs after quantizing) or a5586a3 bf16")
    ap.add_argument("--init", choices=["layer7", "shipped"], default="layer7",
                    help="start from the main model's last layer (a new layer) or the shipped MTP layer")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=20251203)
    ap.add_argument("--seq", type=int, default=512, help="window length (tokens incl. [gMASK]<sop>)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="draft steps unrolled in training (and k evaluated)")
    ap.add_argument("--step-weights", default="1,0.6,0.4")
    ap.add_argument("--hard", type=float, default=0.1, help="weight of CE to the main argmax next to the KL")
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--kl-batch", type=int, default=16, help="windows per step in the indexer KL")
    ap.add_argument("--budget-a", type=float, default=65, help="seconds of phase a (dense)")
    ap.add_argument("--budget-b", type=float, default=100, help="seconds of phase b (DSA)")
    ap.add_argument("--deadline", type=float, default=190, help="seconds after start by which training must end")
    ap.add_argument("--max-epochs-a", type=float, default=4)
    ap.add_argument("--max-epochs-b", type=float, default=6)
    ap.add_argument("--steps-a", type=int, default=0, help="fixed step counts (replay), else from the budgets")
    ap.add_argument("--steps-b", type=int, default=0)
    ap.add_argument("--lr-a", type=float, default=1e-3)
    ap.add_argument("--lr-b", type=float, default=5e-4)
    ap.add_argument("--lr-indexer-a", type=float, default=2e-3)
    ap.add_argument("--lr-indexer-b", type=float, default=1e-3)
    ap.add_argument("--gamma", type=float, default=1e-3)
    ap.add_argument("--val-windows", type=int, default=32)
    ap.add_argument("--val-times", type=int, default=8, help="validations per phase")
    ap.add_argument("--print-every", type=int, default=25)
    ap.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts for the greedy replay")
    ap.add_argument("--prompt-tokens", type=int, default=192)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--gen-batch", type=int, default=64)
    ap.add_argument("--eval-windows", type=int, default=0, help="held-out corpus windows (0: all)")
    ap.add_argument("--eval-bs", type=int, default=16)
    ap.add_argument("--recall-windows", type=int, default=32)
    ap.add_argument("--own-windows", type=int, default=0,
                    help="windows of the main model's own text (on_policy) generated before training (0: corpus only)")
    ap.add_argument("--own-val", type=int, default=32, help="such windows from the validation slice, for validation")
    ap.add_argument("--own-frac", type=float, default=0.5, help="share of each batch drawn from the own windows")
    ap.add_argument("--own-sampled", type=float, default=0.25, help="share of own windows sampled (the rest greedy)")
    ap.add_argument("--own-temp", type=float, default=0.8, help="temperature of the sampled own windows")
    ap.add_argument("--own-bs", type=int, default=256, help="generation batch")
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--cpu-autocast", action="store_true", help="bf16 autocast on CPU too (checks the GPU path)")
    args = ap.parse_args()
    args.step_weights = [float(x) for x in args.step_weights.split(",")]
    assert len(args.step_weights) >= args.steps
    if args.assemble:
        if not args.model_out:
            sys.exit("--assemble needs --model-out")
        print(assemble(args.assemble, base_dir(args.base), args.model_out))
        return
    if args.splice_q8:
        if not args.model_out:
            sys.exit("--splice-q8 needs --model-out")
        print(splice_q8(args.splice_q8, args.model_out))
        return
    if not args.out:
        sys.exit("--out is required")
    T0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    LOG = open(os.path.join(args.out, "mtp.log"), "w")
    import transformers
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
    log_print(json.dumps(versions))
    assert transformers.__version__ == "5.24.0", "use transformers 5.24.0"
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        amp = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    elif args.cpu_autocast:  # the GPU run's bf16 autocast path, on CPU (a check, slow)
        amp = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    else:
        amp = contextlib.nullcontext
    torch.manual_seed(args.seed)
    main_m = load_main(args.teacher, args.base, dev)
    log_print(f"main model: {args.teacher}; names check: file -> module -> file gives back the "
              f"{check_names(main_m, args.teacher, args.base)} layer-7 tensors")
    if args.init == "shipped":  # go on from the layer models/sparsa-bard-12m ships (its q8 values)
        mtp = mtp_from_tensors(main_m.config, shipped_split()[1])
    else:
        mtp = MtpLayer(main_m.config)
        mtp.init_from(main_m)
    mtp.to(dev).train()
    info = dict(params=sum(p.numel() for p in mtp.parameters()),
                params_indexer=sum(p.numel() for p in mtp.indexer_params()),
                tensors=len(layer_tensors(mtp)))
    log_print(json.dumps(info))
    stream = Stream()
    vx, _ = Stream.windows(stream.val, args.seq, args.val_windows or None)
    val_cache = []
    with amp():
        for i in range(0, vx.shape[0], args.eval_bs):
            ids = vx[i:i + args.eval_bs].to(dev)
            h, z = main_forward(main_m, ids)
            val_cache.append((ids, h, z))
    own, own_s = None, 0.0
    if args.own_windows:
        t_own = time.time()
        vo = on_policy(main_m, stream.val, args.own_val, args.seq, args.own_bs, args.seed + 3, args.own_sampled,
                       args.own_temp)
        with amp():
            for i in range(0, vo.shape[0], args.eval_bs):
                ids = vo[i:i + args.eval_bs].to(dev)
                h, z = main_forward(main_m, ids)
                val_cache.append((ids, h, z))
        own = on_policy(main_m, stream.train, args.own_windows, args.seq, args.own_bs, args.seed + 4,
                        args.own_sampled, args.own_temp)
        own_s = time.time() - t_own  # the training budgets start after the generation
        log_print(json.dumps(dict(own_windows=own.shape[0], own_val=vo.shape[0], own_frac=args.own_frac,
                                  own_sampled=args.own_sampled, own_temp=args.own_temp,
                                  seconds=round(own_s, 1))))
    taps = Taps(Shim(mtp.layer))
    epoch = stream.train.numel()
    max_steps = lambda ep: max(20, int(ep * epoch / (args.batch * args.seq)))  # noqa: E731
    deadline = T0 + own_s + args.deadline
    v0 = validate(mtp, main_m, val_cache, args.steps, amp)
    log_print("initial:", json.dumps(v0))
    logs, summaries = [dict(phase="init", step=0, **v0)], []

    # a layer that did not start new keeps its state unless a phase beats it
    start = lambda s: (s["best_val_tpv"], {k: v.detach().clone() for k, v in mtp.state_dict().items()}) \
        if args.init == "shipped" else None  # noqa: E731
    s0 = dict(best_val_tpv=v0["val_tpv"])
    opt = adamw([mtp.other_params(), mtp.indexer_params()], [args.lr_a, args.lr_indexer_a])
    sched = Sched(opt, [args.lr_a, args.lr_a, args.lr_indexer_a, args.lr_indexer_a], warmup=20)
    r, s = train_phase("a", args, mtp, main_m, stream, taps, dev, amp, args.budget_a, max_steps(args.max_epochs_a),
                       opt, sched, False, val_cache, deadline - args.budget_b, args.seed + 1, own, start(s0))
    logs += r
    summaries.append(s)
    opt = adamw([mtp.other_params(), mtp.indexer_params()], [args.lr_b, args.lr_indexer_b])
    sched = Sched(opt, [args.lr_b, args.lr_b, args.lr_indexer_b, args.lr_indexer_b], warmup=10)
    r, s = train_phase("b", args, mtp, main_m, stream, taps, dev, amp, args.budget_b, max_steps(args.max_epochs_b),
                       opt, sched, True, val_cache, deadline, args.seed + 2, own, start(s))
    logs += r
    summaries.append(s)
    taps.remove()
    del opt, val_cache
    set_mtp_topk(mtp, args.topk)
    if dev.type == "cuda":
        log_print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2 ** 30:.1f} GiB")

    from safetensors.torch import save_file
    layer_file = os.path.join(args.out, "mtp_layer.safetensors")
    stored = layer_tensors(mtp)
    save_file(stored, layer_file, metadata={"format": "pt"})
    base = base_dir(args.base, required=False)
    model_out = args.model_out or os.path.join(args.out, "mtp_model")
    if base is not None:
        assemble(layer_file, base, model_out)
        log_print(f"exported {layer_file} and the complete bf16 model {model_out} at {time.time() - T0:.0f}s")
    else:
        log_print(f"exported {layer_file} at {time.time() - T0:.0f}s (no a5586a3 base here: write the complete "
                  f"model with `python3 training/mtp.py --assemble {layer_file} --model-out DIR` in the repository)")
    with open(os.path.join(args.out, "mtp_log.json"), "w") as f:
        json.dump(dict(versions=versions, args=vars(args), layer=info, phases=summaries, steps=logs,
                       train_seconds=round(time.time() - T0, 1)), f)
    if not args.no_eval:
        if dev.type == "cuda":  # float32 evaluation: no TF32 (greedy choices and drafts as exact as the CPU's)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.cuda.empty_cache()
        # evaluate what was exported: the stored bf16 values, and those values after sparsa's q8 rounding
        variants = {"q8": mtp_from_tensors(main_m.config, stored, q8=True).to(dev),
                    "bf16": mtp_from_tensors(main_m.config, stored).to(dev)}
        del mtp
        evaluate(args, variants, main_m, stream, dev, os.path.join(args.out, "mtp_eval.json"))
    log_print(f"done at {time.time() - T0:.0f}s")


if __name__ == "__main__":
    main()
