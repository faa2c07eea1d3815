#!/usr/bin/env python3
"""Trains the sparsa demo model, transformers' own GlmMoeDsaForCausalLM, in the three DSA stages of
DeepSeek-V3.2 (arXiv 2512.02556, §2.1), then exports it (bf16 safetensors) and evaluates it.

Pinned: torch==2.15.0 (CPU smoke test here) / torch 2.11.0+cu130 (H200 image), transformers==5.24.0 (the H200 image
has 5.17.0: the 5.24.0 wheel is carried and put first on PYTHONPATH), numpy==2.4.6, safetensors==0.8.0,
tokenizers 0.23.x. Seed: --seed (default 20251201) seeds torch's init and the window sampler.

Stages (each stops at its wall-clock budget or its epoch cap, whichever comes first; the cosine schedule's length
is fixed after timing the first steps and logged, so `--steps-a/b/c` replays a run):
  a) dense warm-up: index_topk = 1e9 >= context, LM loss, all non-indexer weights (indexers untouched).
  b) indexer warm-up: main model frozen, dense forward under no_grad; each full layer's indexer is trained with
     KL(p || softmax(I)) where p = head-summed, L1-normalised main attention, averaged over the layers that use that
     indexer's selection (the full layer and its IndexShare "shared" followers). I comes from common.indexer_scores,
     a differentiable copy of transformers' no_grad indexer.
  c) sparse training: index_topk = 64; main model on the LM loss through transformers' sparse (index-masked) eager
     attention; indexers keep training with the KL restricted to the selected set, their inputs detached.
Expert balance: DeepSeek's auxiliary-loss-free bias update (gamma 1e-3) on e_score_correction_bias in a) and c).
Early stopping: the weights with the best loss on a validation slice (last 40960 train tokens, never trained on) are
kept at the end of stages a) and c). The held-out works are only used by evaluate.py.

Run (GPU):  python3 training/train.py --out OUT_DIR            # the shipped run (logs/run2) used the defaults
Replay:     python3 training/train.py --out OUT_DIR --steps-a 436 --steps-b 202 --steps-c 155
CPU smoke:  python3 training/train.py --tiny --device cpu --seq 128 --batch 4 --topk 16 --budget-a 30 --budget-b 15 \
                --budget-c 25 --deadline 75 --val-windows 8 --eval-windows 8 --out /tmp/t1
"""
import argparse
import copy
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (Stream, Taps, head_summed, indexer_params, indexer_scores, kl_rows, main_params, make_config,  # noqa
                    selection_mask, served_layers, set_topk, full_layers, EOT, USER, OBSERVATION)

DENSE = 10 ** 9


def log_print(*a):
    print(*a, flush=True)


class Sched:
    """linear warm-up then cosine to `floor` x peak over `total` steps (total fixed after timing)."""

    def __init__(self, opt, peaks, warmup, floor=0.1):
        self.opt, self.peaks, self.warmup, self.floor, self.total = opt, peaks, warmup, floor, None

    def set(self, step):
        if step < self.warmup:
            f = (step + 1) / self.warmup
        else:
            T = max(self.total or 10 ** 9, self.warmup + 1)
            prog = min(1.0, (step - self.warmup) / (T - self.warmup))
            f = self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * prog))
        for g, p in zip(self.opt.param_groups, self.peaks):
            g["lr"] = p * f
        return f


def adamw(groups, lr_list, wd=0.1):
    pg = []
    for params, lr in zip(groups, lr_list):
        decay = [p for p in params if p.dim() >= 2]
        other = [p for p in params if p.dim() < 2]
        pg.append({"params": decay, "weight_decay": wd, "lr": lr})
        pg.append({"params": other, "weight_decay": 0.0, "lr": lr})
    return torch.optim.AdamW(pg, betas=(0.9, 0.95), eps=1e-8, fused=torch.cuda.is_available())


def lm_loss(logits, y):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)


@torch.no_grad()
def val_loss(model, vx, vy, dev, amp, bs=16):
    was = model.training
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, vx.shape[0], bs):
        x, y = vx[i:i + bs].to(dev), vy[i:i + bs].to(dev)
        with amp():
            logits = model(input_ids=x, use_cache=False).logits
        l = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100,
                            reduction="sum")
        tot += l.item()
        n += (y != -100).sum().item()
    model.train(was)
    return tot / n


def update_router_bias(model, taps, gamma):
    stats = []
    with torch.no_grad():
        for i, idx in taps.route.items():
            gate = model.model.layers[i].mlp.gate
            E = gate.num_experts
            cnt = torch.bincount(idx.reshape(-1), minlength=E).float()
            gate.e_score_correction_bias += gamma * torch.sign(cnt.mean() - cnt)
            stats.append((cnt.max() / cnt.mean()).item())
    return max(stats) if stats else 0.0


def indexer_kl(model, taps, sparse):
    """Sum over full layers of the KL between the (served layers') head-summed attention and the indexer."""
    total = 0.0
    per = {}
    for f, layers in served_layers(model).items():
        hidden, q_resid, pos_emb, mask = taps.ind_in[f]
        p = sum(head_summed(taps.attn[l].detach()) for l in layers) / len(layers)
        logits = indexer_scores(model.model.layers[f].self_attn.indexer, hidden.detach(), q_resid.detach(),
                                tuple(t.detach() for t in pos_emb), mask)
        keep = selection_mask(taps.topk[f], logits.shape[-1], mask) if sparse else None
        kl = kl_rows(p, logits, keep)
        per[f] = kl.item()
        total = total + kl
    return total, per


def run_stage(name, args, model, stream, taps, dev, amp, budget, max_steps, opt, sched, step_fn, val=None,
              log=None, deadline=None):
    """Generic time-guarded loop. step_fn(x, y) -> dict of floats (does forward/backward/step)."""
    gen = torch.Generator().manual_seed(args.seed + {"a": 1, "b": 2, "c": 3}[name])
    t0 = time.time()
    if deadline is not None:
        budget = min(budget, deadline - t0)
    fixed = getattr(args, f"steps_{name}")
    sched.total = fixed or max_steps
    best, best_state, step, tokens = float("inf"), None, 0, 0
    val_every = None
    tcal = None
    recs = []
    while True:
        el = time.time() - t0
        if step >= sched.total or (not fixed and el > budget):
            break
        x, y = stream.batch(gen, args.batch, args.seq)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        lrf = sched.set(step)
        r = step_fn(x, y)
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
            by_time = step + int((budget - el) / (t_step * 1.08))  # 8 % margin for validation passes
            sched.total = max(step + 1, min(max_steps, by_time))
            log_print(f"[{name}] {t_step * 1000:.0f} ms/step, {x.numel() / t_step / 1e3:.0f}k tok/s -> "
                      f"{sched.total} steps (cap {max_steps})")
        if val_every is None and sched.total and step >= 13:
            val_every = max(10, sched.total // 12)
        rec = dict(stage=name, step=step, tokens=tokens, lr_factor=round(lrf, 4), t=round(time.time() - t0, 2), **r)
        if val is not None and val_every and (step % val_every == 0 or step == sched.total):
            rec["val"] = val_loss(model, *val, dev, amp)
            if rec["val"] < best:
                best = rec["val"]
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                rec["best"] = True
        recs.append(rec)
        if step % args.print_every == 0 or "val" in rec or step <= 2:
            log_print(json.dumps(rec))
    if val is not None:
        v = val_loss(model, *val, dev, amp)
        recs.append(dict(stage=name, step=step, tokens=tokens, t=round(time.time() - t0, 2), val=v, final=True))
        if v < best:
            best, best_state = v, None
        if best_state is not None:
            model.load_state_dict(best_state)
            log_print(f"[{name}] restored best val {best:.4f}")
    summary = dict(stage=name, steps=step, planned_steps=sched.total, tokens=tokens, seconds=round(time.time() - t0, 1),
                   best_val=best if val is not None else None)
    log_print(json.dumps(summary))
    return recs, summary


def export(model, out_dir, shard):
    """bf16 copy (e_score_correction_bias stays f32), index_topk = 64, HF save_pretrained (per-expert names)."""
    from transformers import GenerationConfig
    m = copy.deepcopy(model).to("cpu")
    set_topk(m, m.config.real_topk)
    orig = {n: b.detach().clone() for n, b in m.named_buffers() if n.endswith("e_score_correction_bias")}
    m.to(torch.bfloat16)
    for n, b in m.named_buffers():
        if n in orig:
            b.data = orig[n]
    del m.config.real_topk
    m.config.use_cache = True
    m.generation_config = GenerationConfig(eos_token_id=[EOT, USER, OBSERVATION], pad_token_id=EOT, do_sample=False)
    os.makedirs(out_dir, exist_ok=True)
    m.save_pretrained(out_dir, max_shard_size=shard)
    return out_dir


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=20251201)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--budget-a", type=float, default=200)
    ap.add_argument("--budget-b", type=float, default=35)
    ap.add_argument("--budget-c", type=float, default=100)
    ap.add_argument("--deadline", type=float, default=360, help="seconds after start by which training must end")
    ap.add_argument("--max-epochs-a", type=float, default=7)
    ap.add_argument("--max-epochs-c", type=float, default=2.5)
    ap.add_argument("--steps-a", type=int, default=0)
    ap.add_argument("--steps-b", type=int, default=0)
    ap.add_argument("--steps-c", type=int, default=0)
    ap.add_argument("--lr-a", type=float, default=2e-3)
    ap.add_argument("--lr-b", type=float, default=2e-3)
    ap.add_argument("--lr-c", type=float, default=6e-4)
    ap.add_argument("--lr-c-indexer", type=float, default=1e-3)
    ap.add_argument("--gamma", type=float, default=1e-3)
    ap.add_argument("--print-every", type=int, default=25)
    ap.add_argument("--shard", default="12MB")
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--val-windows", type=int, default=0, help="limit validation windows (CPU smoke test)")
    ap.add_argument("--eval-windows", type=int, default=0, help="limit held-out windows (CPU smoke test)")
    args = ap.parse_args()
    T0 = time.time()
    import transformers
    from transformers import GlmMoeDsaForCausalLM
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
    log_print(json.dumps(versions))
    assert transformers.__version__ == "5.24.0", "use transformers 5.24.0"
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        amp = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    else:
        import contextlib
        amp = contextlib.nullcontext
    torch.manual_seed(args.seed)
    cfg = make_config(tiny=args.tiny, index_topk=args.topk)
    model = GlmMoeDsaForCausalLM(cfg)
    model.config.real_topk = args.topk
    n_params = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    info = dict(params=n_params, params_active=int(n_params - n_expert * (1 - k / E)),
                params_indexer=sum(p.numel() for p in indexer_params(model)), full_layers=None)
    model.to(dev).train()
    info["full_layers"] = full_layers(model)
    log_print(json.dumps(info))
    stream = Stream()
    vx, vy = Stream.windows(stream.val, args.seq, args.val_windows or None)
    epoch_tokens = stream.train.numel()
    max_steps = lambda ep: max(20, int(ep * epoch_tokens / (args.batch * args.seq)))  # noqa: E731
    taps = Taps(model)
    deadline = T0 + args.deadline
    logs, summaries = [], []

    # ---- stage a: dense warm-up
    set_topk(model, DENSE)
    taps.want_attn = False
    opt = adamw([main_params(model)], [args.lr_a])
    sched = Sched(opt, [args.lr_a] * 2, warmup=60)

    def step_a(x, y):
        taps.clear()
        with amp():
            logits = model(input_ids=x, use_cache=False).logits
        loss = lm_loss(logits, y)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(main_params(model), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        imb = update_router_bias(model, taps, args.gamma)
        return dict(loss=loss.item(), gnorm=round(gn.item(), 3), expert_imbalance=round(imb, 3))

    stage_deadline = deadline - args.budget_b - args.budget_c
    r, s = run_stage("a", args, model, stream, taps, dev, amp, args.budget_a, max_steps(args.max_epochs_a), opt, sched,
                     step_a, val=(vx, vy), deadline=stage_deadline)
    logs += r
    summaries.append(s)
    del opt

    # ---- stage b: indexer warm-up (main model frozen, dense attention)
    taps.want_attn = True
    for p in main_params(model):
        p.requires_grad_(False)
    opt = adamw([indexer_params(model)], [args.lr_b], wd=0.0)
    sched = Sched(opt, [args.lr_b] * 2, warmup=10)

    def step_b(x, y):
        taps.clear()
        with torch.no_grad(), amp():
            logits = model(input_ids=x, use_cache=False).logits
            loss = lm_loss(logits, y)
        with amp():
            kl, per = indexer_kl(model, taps, sparse=False)
        kl.backward()
        gn = torch.nn.utils.clip_grad_norm_(indexer_params(model), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return dict(loss=loss.item(), kl=kl.item(), kl_layers={str(k): round(v, 4) for k, v in per.items()},
                    gnorm=round(gn.item(), 3))

    r, s = run_stage("b", args, model, stream, taps, dev, amp, args.budget_b, 10 ** 9, opt, sched, step_b,
                     deadline=deadline - args.budget_c)
    logs += r
    summaries.append(s)
    del opt
    for p in main_params(model):
        p.requires_grad_(True)

    # ---- stage c: sparse training
    set_topk(model, args.topk)
    opt = adamw([main_params(model), indexer_params(model)], [args.lr_c, args.lr_c_indexer])
    sched = Sched(opt, [args.lr_c, args.lr_c, args.lr_c_indexer, args.lr_c_indexer], warmup=20)

    def step_c(x, y):
        taps.clear()
        with amp():
            logits = model(input_ids=x, use_cache=False).logits
            loss = lm_loss(logits, y)
            kl, per = indexer_kl(model, taps, sparse=True)
        (loss + kl).backward()
        gn = torch.nn.utils.clip_grad_norm_(main_params(model), 1.0)
        torch.nn.utils.clip_grad_norm_(indexer_params(model), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        imb = update_router_bias(model, taps, args.gamma)
        return dict(loss=loss.item(), kl=kl.item(), kl_layers={str(k): round(v, 4) for k, v in per.items()},
                    gnorm=round(gn.item(), 3), expert_imbalance=round(imb, 3))

    r, s = run_stage("c", args, model, stream, taps, dev, amp, args.budget_c, max_steps(args.max_epochs_c), opt, sched,
                     step_c, val=(vx, vy), deadline=deadline)
    logs += r
    summaries.append(s)
    del opt
    taps.remove()

    # ---- export + log
    os.makedirs(args.out, exist_ok=True)
    mdir = export(model, os.path.join(args.out, "model"), args.shard)
    train_log = dict(versions=versions, args=vars(args), model=info, config=json.load(open(os.path.join(mdir, "config.json"))),
                     epoch_tokens=epoch_tokens, stages=summaries, steps=logs, seconds=round(time.time() - T0, 1))
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(train_log, f)
    log_print(f"exported {mdir} at {time.time() - T0:.0f}s")
    if not args.no_eval:
        import evaluate
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        evaluate.run(mdir, os.path.join(args.out, "eval.json"), dev, ctxs=tuple(sorted({512, args.seq, 2 * args.seq})), topk=args.topk,
                     max_windows=args.eval_windows or None)
    log_print(f"done at {time.time() - T0:.0f}s")


if __name__ == "__main__":
    main()
