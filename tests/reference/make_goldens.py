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
recorded in FAMILIES[...]["seed"] (a plain run only re-checks it, and stops if it fails). Checks
(thresholds in common.py, which also holds the init, the evaluation and the seed search, shared with
make_fp8_goldens.py and make_quant_goldens.py):
indexer top-k boundary gap in every full-layer call (prefill and each decode step), router expert-/group-
top-k gaps for every routed token, top-1 logit gap at every greedy step, sparse vs dense max |dlogit|,
cached greedy == argmax of a cache-free forward, and (n_group > 1) that masking dropped groups with 0
instead of -inf would change some expert choice. Everything runs single-threaded with deterministic
algorithms; reruns on one machine reproduce the files bit for bit (other CPUs: see common.py).
"""
import copy
import json
import math
import os

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import (
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
    GlmMoeDsaConfig,
    GlmMoeDsaForCausalLM,
)

from common import (
    DATA, DSV32_ROPE, GLM52_INDEXER, arg_parser, check_reload, evaluate, final_references, find_seed, finish_dir,
    fresh_dir, hf_to_ckpt, new_model, pick_eos, reference_info, setup, write_json,
)
from sparsa_formats import weight_files

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
            **GLM52_INDEXER,  # F S S F S S
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
            rope_parameters=DSV32_ROPE,
        ),
    ),
}


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
    src = f"model.layers.{L - 1}."
    out = hf_to_ckpt({f"model.layers.{L}." + name[len(src):]: t
                      for name, t in model.state_dict().items() if name.startswith(src)})
    # per-expert names, as in the checkpoint; the noise is drawn for the experts last
    out = dict(sorted(out.items(), key=lambda kv: ".mlp.experts." in kv[0]))
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


def save_model_dir(model, spec, path):
    dtype = spec["storage"]
    fresh_dir(path)
    m = model
    if dtype != torch.float32:
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
        last = weight_files(path)[-1]
        lp = os.path.join(path, last)
        with safe_open(lp, "pt") as f:
            meta = f.metadata()
        tensors = load_file(lp)
        tensors.update(extra)
        save_file(tensors, lp, metadata=meta)
        for k in extra:
            index["weight_map"][k] = last
        index["weight_map"] = dict(sorted(index["weight_map"].items()))
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
        write_json(idx_path, index, sort_keys=True)


def load_model_dir(spec, path):
    m = spec["cls"][1].from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                       experts_implementation="eager")
    assert m.config._attn_implementation == "eager" and m.config._experts_implementation == "eager"
    m.eval()
    return m


# ---------------------------------------------------------------- main per family
def build(spec, seed):
    model = new_model(spec, seed)
    round_to_storage(model, spec["storage"])
    return model


def write_family(fam, seed, versions):
    spec = FAMILIES[fam]
    path = os.path.join(DATA, fam)
    model = build(spec, seed)
    # choose an eos id the continuations never hit, with the model in memory, then save
    refs0, eos = pick_eos(model, fam, spec)
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    model.generation_config.bos_token_id = 0
    model.generation_config.pad_token_id = None
    save_model_dir(model, spec, path)
    # references from exactly what was stored
    loaded = load_model_dir(spec, path)
    check_reload(model, loaded)
    assert loaded.generation_config.eos_token_id == eos
    refs, stats = final_references(loaded, fam, spec, refs0, eos, path)
    info = reference_info(fam, spec, seed, versions, loaded, stats, {
        "storage_dtype": str(spec["storage"]).replace("torch.", ""),
        "sharded": bool(spec["shard"]),
        "mtp_layer_in_files": spec["mtp"],
        "eos_token_id": eos,
    }, rope_inv_freq=True)
    finish_dir(path, info)
    print(json.dumps({k: info[k] for k in ["family", "weight_seed", "margins", "sparse_vs_dense_max_abs_dlogit"]}))


def main():
    ap = arg_parser(__doc__, FAMILIES, max_tries=3000)
    ap.add_argument("--explore", type=int, default=0, help="print stats for N seeds, write nothing")
    args = ap.parse_args()
    versions = setup()
    for fam in args.only or list(FAMILIES):
        spec = FAMILIES[fam]
        seed = find_seed(fam, spec, lambda s: evaluate(build(spec, s), fam, spec, early_exit=not args.explore)[1],
                         args.max_tries, search=args.search, explore=args.explore, print_every=25)
        if not args.explore:
            write_family(fam, seed, versions)


if __name__ == "__main__":
    main()
