"""What the golden-making scripts of tests/reference/ share (make_goldens.py, make_fp8_goldens.py,
make_quant_goldens.py, make_bard_reference.py, make_chat_refs.py), so that each definition exists once.

The scripts, run as `python3 tests/reference/<script>.py` from the repository root, import it as `common` (a
script's own folder is the first entry of sys.path). It needs the pinned oracle (PINNED; install line in
make_goldens.py); without torch only check_versions and the paths work, which is all make_chat_refs.py uses.

    PINNED, check_versions, setup    the pinned versions (checked exactly, recorded in reference.json) and
                                     the run setup: one thread, deterministic algorithms, transformers quiet
    REPO, DATA                       the repository root and tests/data
    CONFIG_DEFAULTS, make_config     the config fields every random family shares; eager attention / experts
    GLM52_INDEXER, DSV32_ROPE        config parts shared by the GLM-5.2-style / DeepSeek-V3.2-style families
    init_weights, new_model          the deterministic weight init and a family's fresh f32 model
    evaluate, passes, pick_eos       the references (tokens_i, logits_i, greedy_i, logits_dense_i, topk_i_l{l})
                                     with the margin recorders, the acceptance thresholds (MARGIN_*), an eos id
                                     that no greedy continuation produces
    find_seed, arg_parser            the seed search / recorded-seed re-check; the flags --only, --max-tries,
                                     --search
    hf_to_ckpt, ordered_names        fused experts -> per-expert checkpoint names (the inverse is
                                     sparsa_formats.fuse_expert_tensors, importable from here); release order
    fresh_dir, save_configs,         writing a family directory: emptied, config.json + generation_config.json,
    check_reload, final_references,  the reload check, the final references (greedy and eos re-checked,
    reference_info, finish_dir,      reference.safetensors), the reference.json fields every family has,
    write_json, print_files, sha     JSON as the scripts write it, file modes, the closing file listing
    quality_effect, layer_outputs    a quantized (FP8, q8 / q4) model vs the same seed's unquantized one

A family is a dict `spec` in its script's FAMILIES: cls (config class, model class), config (the family's
dims, over CONFIG_DEFAULTS), prompt_lens, search_from and seed (the recorded first passing seed, or None),
plus the script's own fields. Functions that need the family's name (prompt seed, messages) take it too.

Reproducibility: reruns on one machine give the same files bit for bit. torch's f32 CPU kernels depend on the
instruction set, though: on an AVX-512 machine weights, configs, token ids and top-k selections come out as
checked in, but the f32 logits and the float margins in reference.safetensors / reference.json differ in the
last bits (|dlogit| up to ~3e-5), and so do the NLLs and gaps of tests/data/bard/reference.json.
"""
import argparse
import copy
import hashlib
import importlib
import inspect
import json
import math
import os
import re
import shutil
import sys

import numpy as np

try:
    import torch
except ModuleNotFoundError:  # make_chat_refs.py: only check_versions and the paths are used
    torch = None
else:
    import transformers
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    from sparsa_formats import fuse_expert_tensors  # noqa: F401  (re-exported for the scripts)

PINNED = {"torch": "2.15.0", "transformers": "5.24.0", "safetensors": "0.8.0", "numpy": "2.4.6"}

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(REPO, "tests", "data")

N_NEW = 24
ROUTER_GAIN = 1.5  # router logits std ~ ROUTER_GAIN
RESID = 0.01       # rms of embeddings and of each block's output
LATENT = 0.01      # rms of q_a_proj and c_kv outputs (inputs of q_a_layernorm / kv_a_layernorm)
BIAS_MEAN, BIAS_STD = -0.25, 0.3  # e_score_correction_bias
PROMPT_SEED = 20240917
# Acceptance thresholds (see reference.json for the values reached).
MARGIN_INDEXER_REL = 1e-4   # (k-th - (k+1)-th score) / term magnitude at the boundary, every indexer row (*)
MARGIN_ROUTER_ABS = 1e-4    # sigmoid-score gap at the expert and group top-k boundary, every routed token
MARGIN_GREEDY_ABS = 5e-3    # top-1 minus top-2 logit at every generated token
MIN_SPARSE_DENSE = 0.05     # max |logits - logits_dense| per prompt must exceed this
# (*) term magnitude A[t,j] = sum_h |w[t,h]| * relu(q[t,h].k[j]) / sqrt(D_I), the larger of the two boundary
#     keys; an f32 score's rounding and upstream error scale with A, not with the (possibly cancelling) score.
#     Measured f32-vs-f64 noise of this ratio is 3e-6..9e-6, so 1e-4 leaves >= 10x headroom. A 1e-3 margin is
#     not attainable with random weights: ~700-1000 rows per family each have a continuous gap distribution.
#     reference.json also reports the gap relative to the row's max |score|.

CONFIG_DEFAULTS = dict(
    attention_bias=False,
    tie_word_embeddings=False,
    hidden_act="silu",
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    n_shared_experts=1,
    index_topk=16,
    bos_token_id=0,
    pad_token_id=None,
)
# Shared by the GLM-5.2-style families: IndexShare, full iff max(i - offset + 1, 0) % freq == 0 -> F S S F S S
GLM52_INDEXER = dict(index_topk_freq=3, index_skip_topk_offset=1, indexer_rope_interleave=True)
# Shared by the DeepSeek-V3.2-style families: YaRN with mscale != mscale_all_dim
DSV32_ROPE = {
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
    "original_max_position_embeddings": 96, "beta_fast": 32, "beta_slow": 1,
    "mscale": 1.0, "mscale_all_dim": 0.8,
}

DIM_KEYS = [
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
    "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "n_routed_experts", "num_experts_per_tok", "n_shared_experts", "n_group", "topk_group",
    "first_k_dense_replace", "index_n_heads", "index_head_dim", "index_topk", "rms_norm_eps",
    "routed_scaling_factor", "norm_topk_prob", "max_position_embeddings", "rope_parameters"]
MARGIN_KEYS = [
    "indexer_min_rel_gap", "indexer_min_abs_gap", "indexer_rows_checked", "indexer_median_scale",
    "router_min_expert_gap", "router_min_group_gap", "router_tokens_checked",
    "router_zero_mask_changes", "indexer_min_gap_over_row_max"]


# ---------------------------------------------------------------- versions, run setup, flags
def check_versions(pins=PINNED):
    """{package: installed version} for the packages of `pins`, in their order; exits unless every one is
    exactly the pinned version."""
    got = {name: importlib.import_module(name).__version__.split("+")[0] for name in pins}
    bad = {k: (v, pins[k]) for k, v in got.items() if v != pins[k]}
    if bad:
        sys.exit(f"{os.path.basename(sys.argv[0])}: version mismatch (got, want): {bad}; install the pinned "
                 "versions: pip install " + " ".join(f"{k}=={v}" for k, v in pins.items()))
    return got


def setup(pins=PINNED, quiet=True):
    """check_versions, then single-threaded torch with deterministic algorithms (and transformers' warnings
    off unless quiet=False). Returns the versions."""
    versions = check_versions(pins)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if quiet:
        transformers.logging.set_verbosity_error()
    return versions


def arg_parser(doc, families, max_tries):
    """The flags of the family scripts: --only FAMILY (repeatable), --max-tries N, --search."""
    ap = argparse.ArgumentParser(description=doc.strip().split("\n\n")[0],
                                 epilog="Usage, pins and outputs: the script's docstring.")
    ap.add_argument("--only", action="append", choices=list(families), help="one family (repeatable; default: all)")
    ap.add_argument("--max-tries", type=int, default=max_tries, help=f"seeds tried by a search (default {max_tries})")
    ap.add_argument("--search", action="store_true", help="ignore the recorded seeds and search again")
    return ap


# ---------------------------------------------------------------- models
def make_config(spec):
    kw = dict(CONFIG_DEFAULTS)
    kw.update(json.loads(json.dumps(spec["config"])))  # deep copy
    kw["eos_token_id"] = 1  # replaced later by an id the greedy continuations never produce
    cfg = spec["cls"][0](**kw)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # the per-expert loop (G:525-549); default would be grouped_mm
    return cfg


def new_model(spec, seed=None, state=None):
    """A fresh f32 model of the family in eval mode, with init_weights(seed) and / or the state dict `state`
    (loaded strictly)."""
    model = spec["cls"][1](make_config(spec))
    model.eval()
    if seed is not None:
        init_weights(model, seed)
    if state is not None:
        with torch.no_grad():
            model.load_state_dict(state, strict=True)
    return model


def init_weights(model, seed):
    """Deterministic init. Block inputs are normalised, so everything inside a block is O(1) and every
    softmax / top-k is non-trivial. The residual stream is kept small (embeddings and block outputs
    ~RESID), like real checkpoints, so the RMSNorm eps values matter (1e-5 vs 1e-6 changes the logits);
    likewise q_a_proj and the c_kv rows of kv_a_proj_with_mqa output ~LATENT so that the eps of
    q_a_layernorm / kv_a_layernorm (1e-6, not rms_norm_eps) is visible. The router bias has a negative
    mean so that some kept-group experts score below 0 and the -inf group mask matters."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std + mean

    cfg = model.config
    hidden = cfg.hidden_size
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            shape = tuple(p.shape)
            fan_in = shape[-1]
            if name.endswith("embed_tokens.weight"):
                v = normal(shape, RESID)
            elif name.endswith("k_norm.bias"):
                v = normal(shape, 0.2)
            elif name.endswith("norm.weight"):  # every RMSNorm + indexer LayerNorm weight
                v = normal(shape, 0.15, 1.0)
            elif name.endswith("mlp.gate.weight"):  # router: logits std ~ROUTER_GAIN
                v = normal(shape, ROUTER_GAIN / math.sqrt(hidden))
            elif name.endswith("experts.gate_up_proj"):
                v = normal(shape, 1.0 / math.sqrt(fan_in))
            elif name.endswith("down_proj") or name.endswith("down_proj.weight") or name.endswith("o_proj.weight"):
                v = normal(shape, RESID / math.sqrt(fan_in))  # block outputs ~RESID
            elif name.endswith("lm_head.weight"):
                v = normal(shape, 2.5 / math.sqrt(fan_in))
            elif name.endswith("q_a_proj.weight"):
                v = normal(shape, LATENT / math.sqrt(fan_in))
            elif name.endswith("kv_a_proj_with_mqa.weight"):
                v = normal(shape, 1.0 / math.sqrt(fan_in))
                v[: cfg.kv_lora_rank] *= LATENT  # c_kv small, k_pe O(1)
            elif name.endswith("q_b_proj.weight") or name.endswith("kv_b_proj.weight"):
                v = normal(shape, 1.6 / math.sqrt(fan_in))  # sharper attention
            elif name.endswith("indexer.wq_b.weight") or name.endswith("indexer.wk.weight"):
                v = normal(shape, 1.3 / math.sqrt(fan_in))
            elif name.endswith("indexer.weights_proj.weight"):
                v = normal(shape, 1.5 / math.sqrt(fan_in))
            elif name.endswith(".weight") and p.dim() == 2:
                v = normal(shape, 1.0 / math.sqrt(fan_in))
            else:
                raise RuntimeError(f"no init rule for {name} {shape}")
            p.copy_(v)
        for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
            if name.endswith("e_score_correction_bias"):
                b.copy_(normal(tuple(b.shape), BIAS_STD, BIAS_MEAN))


# ---------------------------------------------------------------- checkpoint names
def hf_to_ckpt(sd):
    """HF state dict (fused experts) -> checkpoint names (per expert), f32 copies. The inverse is
    sparsa_formats.fuse_expert_tensors."""
    out = {}
    for name, t in sd.items():
        t = t.detach().to(torch.float32).clone()
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                gate, up = t[e].chunk(2, dim=0)  # gate rows first (HF_NOTES section 1)
                out[f"{base}{e}.gate_proj.weight"] = gate.contiguous()
                out[f"{base}{e}.up_proj.weight"] = up.contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t
    return out


def ordered_names(stored):
    """Release-like order: embed, layers in numeric order (each weight followed by its scale), norm, lm_head."""
    def key(n):
        m = re.match(r"^model\.layers\.(\d+)\.(.*)$", n)
        if n.startswith("model.embed_tokens"):
            return (0, 0, n)
        if m:
            return (1, int(m.group(1)), m.group(2))
        return (2, 0, n)
    return sorted(stored, key=key)


# ---------------------------------------------------------------- margin recording
class Recorder:
    def __init__(self):
        self.active = True
        self.idx_rel = []     # (rel gap, abs gap, scale) per row with > K valid keys
        self.router_e = []    # expert gaps
        self.router_g = []    # group gaps
        self.router_zero_mask_changes = 0  # tokens whose expert set would differ with a 0 group mask
        self.prefill_topk = None  # layer -> [T, K] selection (set while capturing)


def attach_recorders(model, rec):
    cfg = model.config
    for li, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        ind = getattr(attn, "indexer", None)
        if ind is not None:
            ind.forward = _wrap_indexer(ind, li, rec)
        mlp = layer.mlp
        if hasattr(mlp, "gate"):
            mlp.gate.forward = _wrap_router(mlp.gate, cfg, rec)


def _wrap_indexer(ind, li, rec):
    orig = ind.forward
    mod = inspect.getmodule(type(ind))
    if type(ind).__name__.startswith("GlmMoeDsa"):
        apply_rope = mod.apply_rotary_pos_emb_interleave
    else:
        apply_rope = mod.apply_rotary_pos_emb

    def fwd(hidden_states, q_resid, position_embeddings, attention_mask, position_ids, cache=None):
        out = orig(hidden_states, q_resid, position_embeddings, attention_mask, position_ids, cache=cache)
        if not rec.active:
            return out
        with torch.no_grad():
            # replica of the HF scoring (G:212-242) to measure the top-k boundary gap
            b, s, _ = hidden_states.shape
            cos, sin = position_embeddings
            q = ind.wq_b(q_resid).view(b, s, ind.n_heads, ind.head_dim)
            q_rot, q_pass = torch.split(q, [ind.qk_rope_head_dim, ind.head_dim - ind.qk_rope_head_dim], dim=-1)
            k = ind.k_norm(ind.wk(hidden_states)).unsqueeze(2)
            k_rot, k_pass = torch.split(k, [ind.qk_rope_head_dim, ind.head_dim - ind.qk_rope_head_dim], dim=-1)
            q_rot, k_rot = apply_rope(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
            q = torch.cat([q_rot, q_pass], dim=-1)
            k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
            if cache is not None:
                kc = cache.layers[li].indexer_keys
                assert torch.equal(kc[:, -s:], k)
                k = kc
            scores = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ind.softmax_scale)
            w = ind.weights_proj(hidden_states).float() * (ind.n_heads ** -0.5)
            sc = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)[0]  # [S, T]
            # magnitude of the terms summed into each score: sum_h |w_h| * relu(q_h.k / sqrt(d));
            # f32 rounding / upstream error of a score is proportional to this, not to the score itself
            mag = torch.matmul(w.abs().unsqueeze(-2), scores).squeeze(-2)[0]  # [S, T]
            valid = (attention_mask[0] == 0) if attention_mask.dtype != torch.bool else attention_mask[0]
            K = ind.index_topk
            sel_rows = []
            for t in range(s):
                v = sc[t][valid[t]]
                vidx = torch.nonzero(valid[t]).squeeze(-1)
                hf = set(out[0, t].tolist())
                if v.numel() > K:
                    sv, order = torch.sort(v, descending=True)
                    gap = (sv[K - 1] - sv[K]).item()
                    mv = mag[t][valid[t]]
                    scale = max(mv[order[K - 1]].item(), mv[order[K]].item())
                    rec.idx_rel.append((gap / scale, gap, scale, gap / v.abs().max().item()))
                    mine = set(vidx[order[:K]].tolist())
                    if mine != hf:  # only possible with an (almost) exact tie at the boundary: reject
                        rec.idx_rel.append((-1.0, 0.0, scale, -1.0))
                    row = sorted(hf & set(vidx.tolist()))
                else:
                    row = sorted(vidx.tolist())
                    assert set(row) <= hf
                sel_rows.append(row + [-1] * (K - len(row)))
            if rec.prefill_topk is not None and s > 1:
                rec.prefill_topk[li] = torch.tensor(sel_rows, dtype=torch.int32)
        return out

    return fwd


def _wrap_router(gate, cfg, rec):
    orig = gate.forward

    def fwd(hidden_states):
        out = orig(hidden_states)
        if not rec.active:
            return out
        logits, _, idx = out
        with torch.no_grad():
            s = logits.sigmoid()
            bsc = s + gate.e_score_correction_bias
            ng, tg, k = gate.num_group, gate.topk_group, gate.top_k
            E = gate.num_experts
            gs = bsc.view(-1, ng, E // ng).topk(2, dim=-1)[0].sum(-1)
            if ng > tg:
                gsv = gs.sort(dim=-1, descending=True)[0]
                rec.router_g.extend((gsv[:, tg - 1] - gsv[:, tg]).tolist())
                keep = gs.topk(tg, dim=-1)[1]
                m = torch.zeros_like(gs).scatter(1, keep, 1).bool()
                m = m.unsqueeze(-1).expand(-1, ng, E // ng).reshape(-1, E)
                # would masking dropped groups with 0 instead of -inf change the choice? (want: sometimes)
                alt = bsc.masked_fill(~m, 0.0).topk(k, dim=-1)[1]
                rec.router_zero_mask_changes += sum(
                    set(alt[r].tolist()) != set(idx[r].tolist()) for r in range(alt.shape[0]))
                bsc = bsc.masked_fill(~m, float("-inf"))
            sv, order = bsc.sort(dim=-1, descending=True)
            rec.router_e.extend((sv[:, k - 1] - sv[:, k]).tolist())
            for r in range(bsc.shape[0]):
                if set(order[r, :k].tolist()) != set(idx[r].tolist()):  # exact tie: reject
                    rec.router_e.append(-1.0)
        return out

    return fwd


def set_topk(model, k):
    for layer in model.model.layers:
        ind = getattr(layer.self_attn, "indexer", None)
        if ind is not None:
            ind.index_topk = k


# ---------------------------------------------------------------- references
def prompt_seed(fam):
    return PROMPT_SEED + sum(map(ord, fam))


def prompts_for(fam, spec, vocab):
    g = torch.Generator().manual_seed(prompt_seed(fam))
    return [torch.randint(2, vocab, (n,), generator=g) for n in spec["prompt_lens"]]


def greedy(model, ids):
    out = model.generate(
        ids[None], attention_mask=torch.ones_like(ids)[None], do_sample=False, max_new_tokens=N_NEW,
        return_dict_in_generate=True, output_logits=True)
    seq = out.sequences[0, ids.numel():]
    logits = torch.stack([l[0] for l in out.logits])  # [N_NEW, V]
    return seq, logits


def evaluate(model, fam, spec, capture=False, early_exit=False):
    """Runs every reference computation with the recorders on. Returns (refs, stats).
    Phase 1: prefill forwards (sparse). Phase 2: cached greedy generation, cache-free cross-check, dense."""
    cfg = model.config
    rec = Recorder()
    attach_recorders(model, rec)
    prompts = prompts_for(fam, spec, cfg.vocab_size)
    refs, stats = {}, {"greedy_gap": [], "sparse_dense": [], "greedy_vs_forward_argmax": True}
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    full_layers = [i for i, l in enumerate(model.model.layers) if getattr(l.self_attn, "indexer", None) is not None]
    with torch.no_grad():
        set_topk(model, cfg.index_topk)
        for i, ids in enumerate(prompts):
            rec.active = True
            rec.prefill_topk = {} if capture else None
            refs[f"tokens_{i}"] = ids.to(torch.int32)
            refs[f"logits_{i}"] = model(ids[None], use_cache=False).logits[0].float()
            if capture:
                for li in full_layers:
                    refs[f"topk_{i}_l{li}"] = rec.prefill_topk[li]
            rec.prefill_topk = None
            summarize(rec, stats)
            if early_exit and passes(stats, partial=True):
                return refs, stats
        for i, ids in enumerate(prompts):
            rec.active = True
            seq, glog = greedy(model, ids)
            assert seq.numel() == N_NEW
            top2 = glog.topk(2, dim=-1)[0]
            stats["greedy_gap"].append((top2[:, 0] - top2[:, 1]).min().item())
            refs[f"greedy_{i}"] = seq.to(torch.int32)
            rec.active = False
            # cross-check: the cached greedy continuation equals the argmax of a cache-free forward
            full = torch.cat([ids, seq])
            flog = model(full[None], use_cache=False).logits[0]
            if not torch.equal(flog[ids.numel() - 1:-1].argmax(-1), seq):
                stats["greedy_vs_forward_argmax"] = False
            set_topk(model, 10 ** 9)
            dense = model(ids[None], use_cache=False).logits[0].float()
            set_topk(model, cfg.index_topk)
            refs[f"logits_dense_{i}"] = dense
            stats["sparse_dense"].append((refs[f"logits_{i}"] - dense).abs().max().item())
    summarize(rec, stats)
    stats["logit_abs_max"] = max(refs[f"logits_{i}"].abs().max().item() for i in range(len(prompts)))
    stats["logit_std"] = float(np.mean([refs[f"logits_{i}"].std().item() for i in range(len(prompts))]))
    return refs, stats


def summarize(rec, stats):
    stats["indexer_min_rel_gap"] = min(r[0] for r in rec.idx_rel)
    stats["indexer_min_abs_gap"] = min(r[1] for r in rec.idx_rel)
    stats["indexer_rows_checked"] = len(rec.idx_rel)
    stats["indexer_median_scale"] = float(np.median([r[2] for r in rec.idx_rel]))
    stats["indexer_min_gap_over_row_max"] = min(r[3] for r in rec.idx_rel)
    stats["router_min_expert_gap"] = min(rec.router_e)
    stats["router_min_group_gap"] = min(rec.router_g) if rec.router_g else None
    stats["router_tokens_checked"] = len(rec.router_e)
    stats["router_zero_mask_changes"] = rec.router_zero_mask_changes if rec.router_g else None


def passes(stats, partial=False):
    why = []
    if stats["indexer_min_rel_gap"] < MARGIN_INDEXER_REL:
        why.append(f"indexer gap {stats['indexer_min_rel_gap']:.2e}")
    if stats["router_min_expert_gap"] < MARGIN_ROUTER_ABS:
        why.append(f"router expert gap {stats['router_min_expert_gap']:.2e}")
    if stats["router_min_group_gap"] is not None and stats["router_min_group_gap"] < MARGIN_ROUTER_ABS:
        why.append(f"router group gap {stats['router_min_group_gap']:.2e}")
    if partial or not stats["greedy_gap"]:  # phase 2 skipped after an early rejection
        return why
    if stats["router_zero_mask_changes"] == 0:
        why.append("group mask -inf vs 0 never matters")
    if min(stats["greedy_gap"]) < MARGIN_GREEDY_ABS:
        why.append(f"greedy gap {min(stats['greedy_gap']):.2e}")
    if min(stats["sparse_dense"]) < MIN_SPARSE_DENSE:
        why.append(f"sparse-dense {min(stats['sparse_dense']):.3f}")
    if not stats["greedy_vs_forward_argmax"]:
        why.append("cached greedy != forward argmax")
    return why


def pick_eos(model, fam, spec):
    """(references of the in-memory model, an eos id that none of its greedy continuations produces)."""
    refs = evaluate(model, fam, spec)[0]
    used = set()
    for k, v in refs.items():
        if k.startswith("greedy_"):
            used |= set(v.tolist())
    for cand in range(model.config.vocab_size - 1, 1, -1):
        if cand not in used:
            return refs, cand
    raise RuntimeError("no free eos id")


# ---------------------------------------------------------------- seed search
def find_seed(fam, spec, stats_of, max_tries, search=False, explore=0, print_every=1):
    """The recorded seed spec["seed"], which must still pass every check; or, with search (or no recorded
    seed), the first passing seed from spec["search_from"] upwards. stats_of(seed) builds the family's model
    for that seed and returns evaluate()'s stats. explore=N prints the stats of N seeds from search_from on and
    returns None. A line is printed for every passing seed, every print_every-th try, and every seed that got
    to phase 2 (greedy generation)."""
    recorded = spec["seed"] is not None and not (search or explore)
    start = spec["seed"] if recorded else spec["search_from"]
    for attempt in range(explore or (1 if recorded else max_tries)):
        s = start + attempt
        try:
            stats = stats_of(s)
        except ZeroDivisionError:  # the indexer recorder: both top-k boundary keys score exactly 0 (a tie)
            why = ["indexer top-k boundary is a tie at score 0"]
            print(f"[{fam}] seed {s}: {why[0]} -> rejected", flush=True)
        else:
            why = passes(stats)
            if explore or not why or attempt % print_every == 0 or stats["greedy_gap"]:
                print(f"[{fam}] seed {s}: idx_rel {stats['indexer_min_rel_gap']:.2e} "
                      f"(rows {stats['indexer_rows_checked']}) router e {stats['router_min_expert_gap']:.2e} "
                      f"g {stats['router_min_group_gap']} greedy {min(stats['greedy_gap'] or [0]):.3f} "
                      f"sd {[round(x, 3) for x in stats['sparse_dense']]} logit std {stats.get('logit_std', 0):.2f} "
                      f"-> {'OK' if not why else why}", flush=True)
        if not why and not explore:
            return s
        if recorded:
            sys.exit(f"[{fam}] recorded seed {s} fails: {why} (run with --search)")
    if explore:
        return None
    sys.exit(f"[{fam}] no seed passed in {max_tries} tries")


# ---------------------------------------------------------------- family directories
def fresh_dir(path):
    """An empty family directory (whatever was there is the script's own output)."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)


def write_json(path, obj, sort_keys=False):
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=sort_keys)
        fh.write("\n")


def save_configs(spec, cfg, path, eos):
    """config.json (architectures, eos, dtype bfloat16) and generation_config.json (bos 0, eos, no pad) of a
    directory whose weights are written by hand. Returns the config written."""
    c = copy.deepcopy(cfg)
    c.architectures = [spec["cls"][1].__name__]
    c.eos_token_id = eos
    c.dtype = torch.bfloat16
    c.save_pretrained(path)
    gen = GenerationConfig.from_model_config(c)
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = 0, eos, None
    gen.save_pretrained(path)
    return c


def check_reload(model, loaded):
    """The model read back from the written files holds exactly the in-memory model's weights."""
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), f"reload mismatch {k}"


def final_references(loaded, fam, spec, refs0, eos, path):
    """The references from the model read back from `path` (with the prefill top-k selections), checked: the
    same greedy tokens as the in-memory model (refs0), the same tokens when generation stops at the stored
    eos, and every margin. Writes path/reference.safetensors; returns (refs, stats)."""
    loaded.config.eos_token_id = eos
    loaded.generation_config.eos_token_id = eos
    refs, stats = evaluate(loaded, fam, spec, capture=True)
    for k in refs:
        if k.startswith("greedy_"):
            assert torch.equal(refs[k], refs0[k])
    loaded.generation_config.eos_token_id = eos  # (evaluate cleared it)
    for i in range(len(spec["prompt_lens"])):
        ids = refs[f"tokens_{i}"].long()
        out = loaded.generate(ids[None], attention_mask=torch.ones_like(ids)[None], do_sample=False,
                              max_new_tokens=N_NEW)[0, ids.numel():]
        assert torch.equal(out.to(torch.int32), refs[f"greedy_{i}"]), "eos changed the continuation"
    why = passes(stats)
    assert not why, why
    refs = {k: v.contiguous() for k, v in sorted(refs.items())}
    save_file(refs, os.path.join(path, "reference.safetensors"), metadata={"format": "pt"})
    return refs, stats


def reference_info(fam, spec, seed, versions, loaded, stats, middle, rope_inv_freq=False):
    """reference.json: the family's identity (seeds, versions, prompts), then the script's own fields
    (`middle`, in its order), then dims, derived constants, thresholds and the margins reached."""
    cfg = loaded.config
    info = {
        "family": fam,
        "model_type": cfg.model_type,
        "architecture": spec["cls"][1].__name__,
        "versions": versions,
        "weight_seed": seed,
        "weight_seed_search": {"searched_upward_from": spec["search_from"],
                               "seeds_rejected": seed - spec["search_from"]},
        "prompt_seed": prompt_seed(fam),
        "prompt_lens": list(spec["prompt_lens"]),
        "n_new_tokens": N_NEW,
    }
    info.update(middle)
    info.update({
        "dims": {k: getattr(cfg, k) for k in DIM_KEYS},
        "indexer_types": getattr(cfg, "indexer_types", ["full"] * cfg.num_hidden_layers),
        "mlp_layer_types": cfg.mlp_layer_types,
        "indexer_rope": "interleaved" if cfg.model_type == "glm_moe_dsa" else "half-split",
        "mla_softmax_scale": loaded.model.layers[0].self_attn.scaling,
        "rope_attention_factor": float(loaded.model.rotary_emb.attention_scaling),
    })
    if rope_inv_freq:
        info["rope_inv_freq"] = [float(x) for x in loaded.model.rotary_emb.inv_freq]
    info.update({
        "thresholds": {"indexer_rel": MARGIN_INDEXER_REL, "router_abs": MARGIN_ROUTER_ABS,
                       "greedy_abs": MARGIN_GREEDY_ABS, "sparse_dense_min": MIN_SPARSE_DENSE},
        "margins": {k: stats[k] for k in MARGIN_KEYS},
        "greedy_min_top1_gap_per_prompt": stats["greedy_gap"],
        "sparse_vs_dense_max_abs_dlogit": stats["sparse_dense"],
        "logit_abs_max": stats["logit_abs_max"],
        "logit_std": stats["logit_std"],
    })
    return info


def finish_dir(path, info):
    """Writes path/reference.json and makes every file of the directory 0644."""
    write_json(os.path.join(path, "reference.json"), info)
    for root, _, files in os.walk(path):
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def print_files(path):
    """Each file of the directory with its size and the start of its sha256, and the total size."""
    total = 0
    for root, _, fs in sorted(os.walk(path)):
        for f in sorted(fs):
            p = os.path.join(root, f)
            total += os.path.getsize(p)
            print(f"  {os.path.relpath(p, path):40s} {os.path.getsize(p):9d}  {sha(p)[:16]}")
    print(f"  {'total':40s} {total:9d}")


# ---------------------------------------------------------------- quantized vs unquantized
def layer_outputs(model, ids):
    """Residual stream after each decoder layer (forward hooks), one prefill without cache."""
    outs = []
    hooks = [layer.register_forward_hook(lambda mod, inp, out: outs.append(out[0].detach().clone()))
             for layer in model.model.layers]
    try:
        model(ids[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    assert len(outs) == len(model.model.layers)
    return outs


def quality_effect(orig, loaded, refs, weight_relative_rms_error, note):
    """How far the quantized model `loaded` (whose references are `refs`) is from `orig`, the same seed's
    model before quantization: max |dlogit| per prompt (sparse and dense), the residual-stream relative error
    after each layer (dense, worst prompt) and how many greedy tokens agree before the first difference."""
    delta, delta_dense, greedy_agree, hidden_rel = [], [], [], []
    n_prompts = sum(1 for k in refs if k.startswith("tokens_"))
    with torch.no_grad():
        orig.generation_config.eos_token_id = None
        orig.generation_config.pad_token_id = None
        for i in range(n_prompts):
            ids = refs[f"tokens_{i}"].long()
            delta.append((refs[f"logits_{i}"] - orig(ids[None], use_cache=False).logits[0]).abs().max().item())
            set_topk(orig, 10 ** 9)
            set_topk(loaded, 10 ** 9)
            dense = orig(ids[None], use_cache=False).logits[0]
            delta_dense.append((refs[f"logits_dense_{i}"] - dense).abs().max().item())
            ha, hb = layer_outputs(loaded, ids), layer_outputs(orig, ids)
            set_topk(orig, orig.config.index_topk)
            set_topk(loaded, loaded.config.index_topk)
            rel = [((a - b).norm() / b.norm()).item() for a, b in zip(ha, hb)]
            hidden_rel = rel if not hidden_rel else [max(x, y) for x, y in zip(hidden_rel, rel)]
            seq = orig.generate(ids[None], attention_mask=torch.ones_like(ids)[None], do_sample=False,
                                max_new_tokens=N_NEW)[0, ids.numel():]
            same = (seq.to(torch.int32) == refs[f"greedy_{i}"]).tolist()
            greedy_agree.append(same.index(False) if False in same else len(same))
    return {
        "max_abs_dlogit_per_prompt": delta,
        "max_abs_dlogit_dense_per_prompt": delta_dense,
        "weight_relative_rms_error": weight_relative_rms_error,
        "hidden_state_relative_error_after_each_layer_dense": hidden_rel,
        "greedy_tokens_agreeing_before_first_difference": greedy_agree,
        "note": note,
    }
