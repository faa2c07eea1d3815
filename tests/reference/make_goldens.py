#!/usr/bin/env python3
"""Golden data for sparsa from Hugging Face transformers' own GLM-5 / GLM-5.2 / DeepSeek-V3.2 classes.

Pinned versions (exactly these; the script refuses to run with others):
    torch==2.15.0  transformers==5.24.0  safetensors==0.8.0  numpy==2.4.6
Fresh machine (Python 3.11, CPU is enough; the torch wheel pulls ~4 GB of CUDA libraries, ~2-5 min):
    pip install torch==2.15.0 transformers==5.24.0 safetensors==0.8.0 tokenizers numpy==2.4.6
Run (from the repository root; ~40 s on 2 cores):
    python3 tests/reference/make_goldens.py                 # writes tests/data/{glm5,glm52,dsv32}/
    python3 tests/reference/make_goldens.py --only dsv32    # one family
    python3 tests/reference/make_goldens.py --search        # redo the seed search (a few minutes)
    python3 tests/reference/make_goldens.py --explore 5     # print margins for 5 seeds, write nothing
    python3 tests/reference/check_notes.py                  # independent check of the data against HF_NOTES.md

What it writes, per family, into tests/data/<family>/:
    config.json, generation_config.json, model*.safetensors (+ model.safetensors.index.json when sharded):
        an HF model directory as written by save_pretrained (glm5: bf16, 3 shards, plus an extra MTP layer
        model.layers.{L}.* appended to the last shard and listed in the index; glm52: f16; dsv32: f32).
        e_score_correction_bias is kept f32 in every directory (as in the real releases). Experts are
        stored per expert (mlp.experts.{e}.{gate,up,down}_proj.weight), as save_pretrained writes them.
        eos_token_id (config + generation_config) is an id that no greedy continuation produces.
    reference.safetensors: for prompts i = 0, 1, 2
        tokens_{i}        int32 [T]       random prompt (ids in [2, vocab))
        logits_{i}        f32   [T, V]    one eager forward over the prompt
        greedy_{i}        int32 [24]      generate(do_sample=False, max_new_tokens=24) with the KV/indexer cache
        logits_dense_{i}  f32   [T, V]    same weights, index_topk = 1e9 (dense causal attention)
        topk_{i}_l{l}     int32 [T, K]    prefill indexer selection of each *full* layer l, rows sorted
                                          ascending, -1 padded where the row has fewer than K causal keys
    reference.json: seeds, versions, dims, derived constants (RoPE inv_freq, attention factor, MLA softmax
        scale), measured margins, sparse-vs-dense deltas.

All references are computed in float32, eager attention, eager experts, from the model reloaded from the
directory just written (so the weights are exactly the stored bf16 / f16 / f32 values; the script asserts
the reloaded state dict equals the in-memory rounded one).

Seed selection: weights for seed s are drawn from torch.Generator().manual_seed(s). With --search, seeds
are tried from the family's `search_from` upwards until every check passes; the first passing seed is
recorded in FAMILIES[...]["seed"] (a plain run only re-checks it). Checks (thresholds below):
indexer top-k boundary gap in every full-layer call (prefill and each decode step), router expert-/group-
top-k gaps for every routed token, top-1 logit gap at every greedy step, sparse vs dense max |dlogit|,
cached greedy == argmax of a cache-free forward, and (n_group > 1) that masking dropped groups with 0
instead of -inf would change some expert choice. Everything runs single-threaded with deterministic
algorithms; reruns reproduce the files bit for bit.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
import safetensors
from safetensors import safe_open
from safetensors.torch import save_file, load_file

PINNED = {"torch": "2.15.0", "transformers": "5.24.0", "safetensors": "0.8.0", "numpy": "2.4.6"}

from transformers import (  # noqa: E402
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
    GlmMoeDsaConfig,
    GlmMoeDsaForCausalLM,
)

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

COMMON = dict(
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

FAMILIES = {
    "glm5": dict(
        cls=(GlmMoeDsaConfig, GlmMoeDsaForCausalLM),
        storage=torch.bfloat16,
        shard="450KB",
        mtp=True,
        search_from=1000, seed=1149,  # first passing seed (python3 make_goldens.py --search)
        prompt_lens=(43, 59, 77),
        config=dict(
            vocab_size=331, hidden_size=112, intermediate_size=176, moe_intermediate_size=16,
            num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=3,
            q_lora_rank=48, kv_lora_rank=40, qk_nope_head_dim=24, qk_rope_head_dim=16, v_head_dim=20,
            n_routed_experts=10, num_experts_per_tok=3, n_group=1, topk_group=1,
            first_k_dense_replace=1, index_n_heads=16, index_head_dim=32,
            rms_norm_eps=1e-5, max_position_embeddings=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 1.0e6},
            indexer_rope_interleave=True, num_nextn_predict_layers=1,
        ),
    ),
    "glm52": dict(
        cls=(GlmMoeDsaConfig, GlmMoeDsaForCausalLM),
        storage=torch.float16,
        shard=None,
        mtp=False,
        search_from=2000, seed=2031,  # first passing seed
        prompt_lens=(43, 66, 85),
        config=dict(
            vocab_size=307, hidden_size=88, intermediate_size=136, moe_intermediate_size=16,
            num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=44, kv_lora_rank=36, qk_nope_head_dim=20, qk_rope_head_dim=16, v_head_dim=28,
            n_routed_experts=12, num_experts_per_tok=2, n_group=1, topk_group=1,
            first_k_dense_replace=2, index_n_heads=20, index_head_dim=24,
            rms_norm_eps=1e-5, max_position_embeddings=2048,
            rope_parameters={"rope_type": "default", "rope_theta": 8.0e6},
            # IndexShare: full iff max(i - offset + 1, 0) % freq == 0  ->  F S S F S S
            index_topk_freq=3, index_skip_topk_offset=1,
            indexer_rope_interleave=True,
        ),
    ),
    "dsv32": dict(
        cls=(DeepseekV32Config, DeepseekV32ForCausalLM),
        storage=torch.float32,
        shard=None,
        mtp=False,
        search_from=3000, seed=3250,  # first passing seed
        prompt_lens=(41, 62, 83),
        config=dict(
            vocab_size=263, hidden_size=96, intermediate_size=128, moe_intermediate_size=16,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=48, kv_lora_rank=40, qk_nope_head_dim=24, qk_rope_head_dim=16, v_head_dim=20,
            n_routed_experts=12, num_experts_per_tok=3, n_group=4, topk_group=2,
            first_k_dense_replace=1, index_n_heads=16, index_head_dim=24,
            rms_norm_eps=1e-6, max_position_embeddings=3840,
            rope_parameters={
                "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                "original_max_position_embeddings": 96, "beta_fast": 32, "beta_slow": 1,
                "mscale": 1.0, "mscale_all_dim": 0.8,
            },
        ),
    ),
}


def check_versions():
    got = {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
           "safetensors": safetensors.__version__, "numpy": np.__version__}
    bad = {k: (v, PINNED[k]) for k, v in got.items() if v != PINNED[k]}
    if bad:
        sys.exit(f"version mismatch (got, want): {bad}")
    return got


def make_config(fam):
    cfg_cls = FAMILIES[fam]["cls"][0]
    kw = dict(COMMON)
    kw.update(json.loads(json.dumps(FAMILIES[fam]["config"])))  # deep copy
    kw["eos_token_id"] = 1  # replaced later by an id the greedy continuations never produce
    cfg = cfg_cls(**kw)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # the per-expert loop (G:525-549); default would be grouped_mm
    return cfg


# ---------------------------------------------------------------- weights
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
    apply_rope = None
    import inspect
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


# ---------------------------------------------------------------- storage
def round_to_storage(model, dtype):
    """Round parameters to the storage dtype and back (e_score_correction_bias stays f32)."""
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(p.to(dtype).to(torch.float32))


def mtp_tensors(model, dtype, seed):
    """A real-named MTP layer model.layers.{L}.*: decoder-layer tensors (copied from the last layer with
    noise) + enorm, hnorm, eh_proj, shared_head.norm. transformers ignores it; the engine must skip it."""
    L = model.config.num_hidden_layers
    H = model.config.hidden_size
    g = torch.Generator().manual_seed(seed + 777)
    sd = model.state_dict()
    out = {}
    src = f"model.layers.{L - 1}."
    for name, t in sd.items():
        if name.startswith(src):
            out[f"model.layers.{L}." + name[len(src):]] = t
    # per-expert names, as in the checkpoint
    exp = {}
    for name in list(out):
        if name.endswith("mlp.experts.gate_up_proj"):
            gu = out.pop(name)
            base = name[: -len("gate_up_proj")]
            for e in range(gu.shape[0]):
                gate, up = gu[e].chunk(2, dim=0)
                exp[f"{base}{e}.gate_proj.weight"] = gate
                exp[f"{base}{e}.up_proj.weight"] = up
        elif name.endswith("mlp.experts.down_proj"):
            d = out.pop(name)
            base = name[: -len("down_proj")]
            for e in range(d.shape[0]):
                exp[f"{base}{e}.down_proj.weight"] = d[e]
    out.update(exp)
    out = {k: (v + 0.01 * torch.randn(v.shape, generator=g)) for k, v in out.items()}
    out[f"model.layers.{L}.enorm.weight"] = 1 + 0.1 * torch.randn(H, generator=g)
    out[f"model.layers.{L}.hnorm.weight"] = 1 + 0.1 * torch.randn(H, generator=g)
    out[f"model.layers.{L}.eh_proj.weight"] = torch.randn(H, 2 * H, generator=g) / math.sqrt(2 * H)
    out[f"model.layers.{L}.shared_head.norm.weight"] = 1 + 0.1 * torch.randn(H, generator=g)
    res = {}
    for k, v in out.items():
        v = v.contiguous()
        res[k] = v if k.endswith("e_score_correction_bias") else v.to(dtype)
    return res


def save_model_dir(model, fam, path):
    spec = FAMILIES[fam]
    dtype = spec["storage"]
    if os.path.isdir(path):
        for f in os.listdir(path):
            if f.endswith(".safetensors") or f.endswith(".json"):
                os.remove(os.path.join(path, f))
    os.makedirs(path, exist_ok=True)
    m = model
    if dtype != torch.float32:
        import copy
        m = copy.deepcopy(model)
        m.to(dtype)
        orig = dict(model.named_buffers())
        for name, b in m.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.data = orig[name].detach().clone()  # stays f32, unrounded
    kw = {}
    if spec["shard"]:
        kw["max_shard_size"] = spec["shard"]
    m.save_pretrained(path, **kw)
    if spec["mtp"]:
        extra = mtp_tensors(model, dtype, 0)
        idx_path = os.path.join(path, "model.safetensors.index.json")
        assert os.path.exists(idx_path), "MTP layer expects a sharded checkpoint"
        index = json.load(open(idx_path))
        last = sorted(set(index["weight_map"].values()))[-1]
        lp = os.path.join(path, last)
        with safe_open(lp, "pt") as f:
            meta = f.metadata()
        tensors = load_file(lp)
        tensors.update(extra)
        save_file(tensors, lp, metadata=meta)
        for k in extra:
            index["weight_map"][k] = last
        index["weight_map"] = dict(sorted(index["weight_map"].items()))
        index["metadata"]["total_size"] = sum(
            os.path.getsize(os.path.join(path, f)) for f in set(index["weight_map"].values()))
        # total_size in HF indices is the tensor bytes; recompute it exactly
        tot = 0
        for f in set(index["weight_map"].values()):
            with safe_open(os.path.join(path, f), "pt") as sf:
                for k in sf.keys():
                    t = sf.get_slice(k)
                    n = 1
                    for d in t.get_shape():
                        n *= d
                    tot += n * {"BF16": 2, "F16": 2, "F32": 4}[t.get_dtype()]
        index["metadata"]["total_size"] = tot
        with open(idx_path, "w") as fh:
            json.dump(index, fh, indent=2, sort_keys=True)
            fh.write("\n")


def load_model_dir(fam, path):
    cls = FAMILIES[fam]["cls"][1]
    m = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                            experts_implementation="eager")
    assert m.config._attn_implementation == "eager" and m.config._experts_implementation == "eager"
    m.eval()
    return m


# ---------------------------------------------------------------- references
def prompts_for(fam, vocab):
    g = torch.Generator().manual_seed(PROMPT_SEED + sum(map(ord, fam)))
    return [torch.randint(2, vocab, (n,), generator=g) for n in FAMILIES[fam]["prompt_lens"]]


def greedy(model, ids):
    out = model.generate(
        ids[None], attention_mask=torch.ones_like(ids)[None], do_sample=False, max_new_tokens=N_NEW,
        return_dict_in_generate=True, output_logits=True)
    seq = out.sequences[0, ids.numel():]
    logits = torch.stack([l[0] for l in out.logits])  # [N_NEW, V]
    return seq, logits


def evaluate(model, fam, capture=False, early_exit=False):
    """Runs every reference computation with the recorders on. Returns (refs, stats).
    Phase 1: prefill forwards (sparse). Phase 2: cached greedy generation, cache-free cross-check, dense."""
    cfg = model.config
    rec = Recorder()
    attach_recorders(model, rec)
    prompts = prompts_for(fam, cfg.vocab_size)
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


def build(fam, seed):
    cfg = make_config(fam)
    model = FAMILIES[fam]["cls"][1](cfg)
    model.eval()
    init_weights(model, seed)
    round_to_storage(model, FAMILIES[fam]["storage"])
    return model


def pick_eos(refs, vocab):
    used = set()
    for k, v in refs.items():
        if k.startswith("greedy_"):
            used |= set(v.tolist())
    for cand in range(vocab - 1, 1, -1):
        if cand not in used:
            return cand
    raise RuntimeError("no free eos id")


def run_family(fam, max_tries, explore=0, search=False):
    """Returns the first seed >= search_from that passes every check. With a recorded `seed` (and no
    --search) only that seed is evaluated; it must still pass."""
    spec = FAMILIES[fam]
    seed = spec["search_from"] if (search or explore or spec["seed"] is None) else spec["seed"]
    tried = []
    for attempt in range(explore or max_tries):
        s = seed + attempt
        model = build(fam, s)
        _, stats = evaluate(model, fam, early_exit=not explore)
        why = passes(stats)
        tried.append((s, why))
        if explore or not why or attempt % 25 == 0 or stats["greedy_gap"]:
            print(f"[{fam}] seed {s}: idx_rel {stats['indexer_min_rel_gap']:.2e} (rows {stats['indexer_rows_checked']}) "
                  f"router e {stats['router_min_expert_gap']:.2e} g {stats['router_min_group_gap']} "
                  f"greedy {min(stats['greedy_gap'] or [0]):.3f} sd {[round(x, 3) for x in stats['sparse_dense']]} "
                  f"logit std {stats.get('logit_std', 0):.2f} -> {'OK' if not why else why}", flush=True)
        if not why and not explore:
            return s, tried
    if explore:
        return None, tried
    sys.exit(f"[{fam}] no seed passed in {max_tries} tries")


def write_family(fam, seed, tried, versions):
    spec = FAMILIES[fam]
    path = os.path.join(DATA, fam)
    model = build(fam, seed)
    # choose an eos id the continuations never hit, with the model in memory, then save
    refs0, _ = evaluate(model, fam)
    eos = pick_eos(refs0, model.config.vocab_size)
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    model.generation_config.bos_token_id = 0
    model.generation_config.pad_token_id = None
    save_model_dir(model, fam, path)
    # references from exactly what was stored
    loaded = load_model_dir(fam, path)
    sd_a, sd_b = model.state_dict(), loaded.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        assert torch.equal(sd_a[k], sd_b[k]), f"reload mismatch {k}"
    assert loaded.generation_config.eos_token_id == eos
    refs, stats = evaluate(loaded, fam, capture=True)
    for k in refs:
        if k.startswith("greedy_"):
            assert torch.equal(refs[k], refs0[k])
    # generation with the stored eos must give the same 24 tokens
    loaded.generation_config.eos_token_id = eos
    for i in range(len(spec["prompt_lens"])):
        ids = refs[f"tokens_{i}"].long()
        out = loaded.generate(ids[None], attention_mask=torch.ones_like(ids)[None], do_sample=False,
                              max_new_tokens=N_NEW)[0, ids.numel():]
        assert torch.equal(out.to(torch.int32), refs[f"greedy_{i}"]), "eos changed the continuation"
    why = passes(stats)
    assert not why, why
    refs = {k: v.contiguous() for k, v in sorted(refs.items())}
    save_file(refs, os.path.join(path, "reference.safetensors"), metadata={"format": "pt"})
    cfg = loaded.config
    info = {
        "family": fam,
        "model_type": cfg.model_type,
        "architecture": FAMILIES[fam]["cls"][1].__name__,
        "versions": versions,
        "weight_seed": seed,
        "weight_seed_search": {"searched_upward_from": spec["search_from"],
                               "seeds_rejected": seed - spec["search_from"]},
        "prompt_seed": PROMPT_SEED + sum(map(ord, fam)),
        "prompt_lens": list(spec["prompt_lens"]),
        "n_new_tokens": N_NEW,
        "storage_dtype": str(spec["storage"]).replace("torch.", ""),
        "sharded": bool(spec["shard"]),
        "mtp_layer_in_files": spec["mtp"],
        "eos_token_id": eos,
        "dims": {k: getattr(cfg, k) for k in [
            "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
            "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "v_head_dim", "n_routed_experts", "num_experts_per_tok", "n_shared_experts", "n_group", "topk_group",
            "first_k_dense_replace", "index_n_heads", "index_head_dim", "index_topk", "rms_norm_eps",
            "routed_scaling_factor", "norm_topk_prob", "max_position_embeddings", "rope_parameters"]},
        "indexer_types": getattr(cfg, "indexer_types", ["full"] * cfg.num_hidden_layers),
        "mlp_layer_types": cfg.mlp_layer_types,
        "indexer_rope": "interleaved" if cfg.model_type == "glm_moe_dsa" else "half-split",
        "mla_softmax_scale": loaded.model.layers[0].self_attn.scaling,
        "rope_attention_factor": float(loaded.model.rotary_emb.attention_scaling),
        "rope_inv_freq": [float(x) for x in loaded.model.rotary_emb.inv_freq],
        "thresholds": {"indexer_rel": MARGIN_INDEXER_REL, "router_abs": MARGIN_ROUTER_ABS,
                       "greedy_abs": MARGIN_GREEDY_ABS, "sparse_dense_min": MIN_SPARSE_DENSE},
        "margins": {k: stats[k] for k in [
            "indexer_min_rel_gap", "indexer_min_abs_gap", "indexer_rows_checked", "indexer_median_scale",
            "router_min_expert_gap", "router_min_group_gap", "router_tokens_checked",
            "router_zero_mask_changes", "indexer_min_gap_over_row_max"]},
        "greedy_min_top1_gap_per_prompt": stats["greedy_gap"],
        "sparse_vs_dense_max_abs_dlogit": stats["sparse_dense"],
        "logit_abs_max": stats["logit_abs_max"],
        "logit_std": stats["logit_std"],
    }
    with open(os.path.join(path, "reference.json"), "w") as fh:
        json.dump(info, fh, indent=2)
        fh.write("\n")
    for f in os.listdir(path):
        os.chmod(os.path.join(path, f), 0o644)
    print(json.dumps({k: info[k] for k in ["family", "weight_seed", "margins", "sparse_vs_dense_max_abs_dlogit"]}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", action="append", choices=list(FAMILIES))
    ap.add_argument("--explore", type=int, default=0, help="print stats for N seeds, write nothing")
    ap.add_argument("--max-tries", type=int, default=3000)
    ap.add_argument("--search", action="store_true", help="ignore the recorded seeds and search again")
    args = ap.parse_args()
    versions = check_versions()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    for fam in args.only or list(FAMILIES):
        seed, tried = run_family(fam, args.max_tries, explore=args.explore, search=args.search)
        if not args.explore:
            write_family(fam, seed, tried, versions)


if __name__ == "__main__":
    main()
