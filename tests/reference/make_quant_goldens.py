#!/usr/bin/env python3
"""sparsa's own quantized formats (q8 / q4, `sparsa quantize`): model directories as the sparsa binary writes
them, and transformers references computed from exactly those quantized weights.

Pinned versions (exactly these, common.py's PINNED as for make_goldens.py; the script refuses to run with others):
    torch==2.15.0  transformers==5.24.0  safetensors==0.8.0  numpy==2.4.6
Fresh machine (Python 3.11, CPU is enough):
    pip install torch==2.15.0 transformers==5.24.0 safetensors==0.8.0 tokenizers numpy==2.4.6
It runs the sparsa binary (`quantize` only), so build it first:
    cargo build --release
Run (from the repository root; ~40 s on 2 cores: ~10 s import, then per family the seed re-check and two
full evaluations):
    python3 tests/reference/make_quant_goldens.py                     # writes tests/data/{glm52-q4,dsv32-q8}/
    python3 tests/reference/make_quant_goldens.py --only dsv32-q8     # one family
    python3 tests/reference/make_quant_goldens.py --search            # redo the seed search (~1-3 min)
    python3 tests/reference/make_quant_goldens.py --sparsa PATH       # another sparsa binary
Reruns on one machine reproduce every file bit for bit (checked: two runs, identical sha256 of every file;
other CPUs: see common.py).
Recorded seeds: glm52-q4 7012 (searched from 7000), dsv32-q8 8036 (from 8000).

Families (configs, init, evaluation, margin checks, seed search and checkpoint <-> HF conversion are
common.py's, as for make_goldens.py and make_fp8_goldens.py):
    glm52-q4  GlmMoeDsaForCausalLM, IndexShare (F S S F), `sparsa quantize --format q4 --block 32`,
              one model.safetensors
    dsv32-q8  DeepseekV32ForCausalLM, router groups + YaRN, `sparsa quantize --format q8 --block 32
              --shard-gb 0.0002`: 2 shards + model.safetensors.index.json
Dims are chosen so that the 32-column blocks have partial tails in most matrices: hidden 100 / 84, q_lora 52 /
60, kv_lora 44 / 52, o_proj input 48 / 80, intermediate 119 / 108, moe_intermediate 19 / 12 (expert
down_proj: one partial block per row), vocab 211 / 229 (lm_head rows); none of these is a multiple of 32.
glm52-q4's dense and expert down_proj rows have an odd length (119, 19): their last q4 byte holds one element
and the padding nibble 8 (value 0) in its high half.

What it writes, per family, into tests/data/<family>/:
    source/       the bf16 HF directory that was quantized (config.json, generation_config.json,
                  model.safetensors; e_score_correction_bias f32 as in the releases; experts per expert),
                  so a test can re-run `sparsa quantize` on it and compare bytes (tests/golden.rs).
    config.json, generation_config.json, model*.safetensors (+ index): `sparsa quantize`'s output, unchanged.
    reference.safetensors: the keys of make_goldens.py (tokens_i, logits_i, greedy_i, logits_dense_i,
                  topk_i_l{l}), computed on the dequantized weights.
    reference.json: seeds, versions, dims, margins, the quantize command line (`quantize_args`, relative to
                  the family directory), sha256 of the bf16 source and of every file sparsa wrote, a
                  per-tensor list of quantized / kept tensors, and the q8/q4-vs-bf16 quality effect.

References: the quantized directory is read back by sparsa_formats.py (its own safetensors parser; q8 / q4
decoded as src/weights/quant.rs defines, exact in f32), loaded with load_state_dict(strict=True) into the
transformers class in f32, eager attention, eager experts. Independently, every quantized tensor is
re-quantized here from the bf16 source with a numpy transcription of quant.rs's quantize_rows (f32 block
min/max, scale = amax/127 (q8) or -lo/8 | hi/7 (q4), bf16 rounding of the scale, x / scale rounded half away
from zero, clamped) and must equal sparsa's bytes (weights and scales); this pins down the format from both
sides. Robustness: the same checks and thresholds as make_goldens.py (common.py: indexer top-k boundary gaps,
router expert / group gaps, greedy top-1 gaps, sparse != dense, cached greedy == cache-free argmax, -inf group
mask matters), evaluated on the dequantized model, with a seed search (--search) whose first passing seed is
recorded in FAMILIES[...]["seed"]. Each candidate seed is quantized by the sparsa binary itself.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM, GlmMoeDsaConfig, GlmMoeDsaForCausalLM

from common import (
    DATA, DSV32_ROPE, GLM52_INDEXER, REPO, arg_parser, check_reload, evaluate, final_references, find_seed,
    finish_dir, fresh_dir, fuse_expert_tensors, hf_to_ckpt, make_config, new_model, ordered_names, pick_eos, print_files,
    quality_effect, reference_info, save_configs, setup, sha,
)
from sparsa_formats import load_dequantized, read_safetensors

BLOCK = 32

FAMILIES = {
    "glm52-q4": dict(
        cls=(GlmMoeDsaConfig, GlmMoeDsaForCausalLM),
        search_from=7000, seed=7012,  # first passing seed (python3 make_quant_goldens.py --search)
        prompt_lens=(43, 66, 85),
        quantize_args=["--format", "q4", "--block", "32"],
        config=dict(
            vocab_size=211, hidden_size=100, intermediate_size=119, moe_intermediate_size=19,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=52, kv_lora_rank=44, qk_nope_head_dim=20, qk_rope_head_dim=16, v_head_dim=12,
            n_routed_experts=6, num_experts_per_tok=2, n_group=1, topk_group=1,
            first_k_dense_replace=1, index_n_heads=16, index_head_dim=24,
            rms_norm_eps=1e-5, max_position_embeddings=2048,
            rope_parameters={"rope_type": "default", "rope_theta": 8.0e6},
            **GLM52_INDEXER,  # F S S F
        ),
    ),
    "dsv32-q8": dict(
        cls=(DeepseekV32Config, DeepseekV32ForCausalLM),
        search_from=8000, seed=8036,  # first passing seed
        prompt_lens=(41, 62, 83),
        quantize_args=["--format", "q8", "--block", "32", "--shard-gb", "0.0002"],
        config=dict(
            vocab_size=229, hidden_size=84, intermediate_size=108, moe_intermediate_size=12,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=60, kv_lora_rank=52, qk_nope_head_dim=24, qk_rope_head_dim=16, v_head_dim=20,
            n_routed_experts=12, num_experts_per_tok=3, n_group=4, topk_group=2,
            first_k_dense_replace=1, index_n_heads=8, index_head_dim=24,
            rms_norm_eps=1e-6, max_position_embeddings=3840,
            rope_parameters=DSV32_ROPE,
        ),
    ),
}

SPARSA = os.path.join(REPO, "target", "release", "sparsa")


# ---------------------------------------------------------------- quant.rs's quantizer, transcribed
def fmt_of(fam):
    a = FAMILIES[fam]["quantize_args"]
    return a[a.index("--format") + 1]


def quantize_rows(fmt, x, block):
    """quant.rs quantize_rows in numpy: x f32 [N, K] -> (stored weight [N, K] int8 | [N, ceil(K/2)] uint8,
    bf16 scales as uint16 bits [N, ceil(K/B)])."""
    n, k = x.shape
    nb = -(-k // block)
    pad = np.zeros((n, nb * block), np.float32)
    pad[:, :k] = x
    b = pad.reshape(n, nb, block)  # the zero padding does not change min(0, ...) / max(0, ...)
    lo = np.minimum(b.min(-1), np.float32(0))
    hi = np.maximum(b.max(-1), np.float32(0))
    if fmt == "q4":
        scale = np.where(-lo > hi, -lo / np.float32(8), hi / np.float32(7)).astype(np.float32)
        qmin, qmax = -8, 7
    else:
        scale = (np.maximum(-lo, hi) / np.float32(127)).astype(np.float32)
        qmin, qmax = -127, 127
    bits = scale.astype(np.float32).view(np.uint32).astype(np.uint64)
    sh = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # RNE, as half::bf16::from_f32
    sf = (sh.astype(np.uint32) << 16).view(np.float32)
    ok = (sf > 0) & np.isfinite(sf)
    v = (b / np.where(ok, sf, np.float32(1))[..., None]).astype(np.float32)  # f32 division
    r = np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5)  # f32::round: half away from zero
    q = np.where(ok[..., None], np.clip(r, qmin, qmax), 0).astype(np.int32).reshape(n, nb * block)[:, :k]
    if fmt == "q4":
        u = (q + 8).astype(np.uint8)
        if k % 2:
            u = np.concatenate([u, np.full((n, 1), 8, np.uint8)], axis=1)  # odd row: padding nibble 8
        return (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8), sh
    return q.astype(np.int8), sh


# ---------------------------------------------------------------- directories
def source_tensors(ck):
    """bf16 source checkpoint (f32 e_score_correction_bias, as the releases store it)."""
    return {n: (t.clone() if n.endswith("e_score_correction_bias") else t.to(torch.bfloat16))
            for n, t in ck.items()}


def write_source(fam, cfg, src, path, eos):
    os.makedirs(path, exist_ok=True)
    save_configs(FAMILIES[fam], cfg, path, eos)
    save_file({n: src[n].contiguous() for n in ordered_names(src)}, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})


def run_quantize(sparsa, fam, src_dir, out_dir):
    cmd = [sparsa, "quantize", "--model", src_dir, "--out", out_dir] + FAMILIES[fam]["quantize_args"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip().splitlines()[-1]


def load_quantized(fam, qdir):
    sd = load_dequantized(qdir)
    m = new_model(FAMILIES[fam], state=sd)
    for k, v in m.state_dict().items():
        assert torch.equal(v, sd[k]), k
    return m


def build(fam, seed, tmp, sparsa, eos=1):
    """(dequantized model, bf16 model, bf16 source tensors, quantized dir) for one seed; the source is written
    to tmp/src and quantized by the sparsa binary into tmp/q."""
    spec = FAMILIES[fam]
    orig = new_model(spec, seed)
    src = source_tensors(hf_to_ckpt(orig.state_dict()))
    with torch.no_grad():
        orig.load_state_dict(fuse_expert_tensors({n: t.float() for n, t in src.items()}), strict=True)
    for d in ("src", "q"):
        shutil.rmtree(os.path.join(tmp, d), ignore_errors=True)
    write_source(fam, orig.config, src, os.path.join(tmp, "src"), eos)
    run_quantize(sparsa, fam, os.path.join(tmp, "src"), os.path.join(tmp, "q"))
    return load_quantized(fam, os.path.join(tmp, "q")), orig, src, os.path.join(tmp, "q")


def stored_files(path):
    """Files `sparsa quantize` writes into a directory (everything but side files we add)."""
    return sorted(f for f in os.listdir(path) if os.path.isfile(os.path.join(path, f)))


def check_requantization(fam, src, qdir):
    """sparsa's q8/q4 bytes == this file's transcription of quant.rs, for every quantized tensor; returns
    (per-tensor table, scale statistics)."""
    fmt = fmt_of(fam)
    stored = {}
    for f in stored_files(qdir):
        if f.endswith(".safetensors"):
            t, meta = read_safetensors(os.path.join(qdir, f))
            assert meta == {"format": "pt", "sparsa_quant": fmt, "block_size": str(BLOCK)}, meta
            stored.update({k: v + (f,) for k, v in t.items()})
    quantized, kept = {}, {}
    n_sub = n_scales = 0
    for name in ordered_names(src):
        x = src[name].float().numpy()
        if name + "_scale" in stored:
            dt, shape, w, f = stored[name]
            sdt, sshape, s, sf = stored[name + "_scale"]
            qw, qs = quantize_rows(fmt, x, BLOCK)
            assert np.array_equal(qw.view(np.uint8), w.view(np.uint8)), f"{name}: sparsa's {fmt} weights differ"
            assert np.array_equal(qs.view(np.uint16), s.view(np.uint16)), f"{name}: sparsa's {fmt} scales differ"
            sa = s.astype(np.float32)
            n_sub += int(((sa != 0) & (np.abs(sa) < 2.0 ** -14)).sum())
            n_scales += sa.size
            quantized[name] = f"{list(x.shape)} -> {dt} {shape} + BF16 {sshape}"
        else:
            dt, shape, w, f = stored[name]
            kept[name] = dt
            want = {torch.bfloat16: "BF16", torch.float32: "F32"}[src[name].dtype]
            assert dt == want and np.array_equal(w.view(np.uint8).ravel(), src[name].view(torch.uint8).numpy().ravel()), name
    assert set(stored) == set(quantized) | set(kept) | {n + "_scale" for n in quantized}
    return quantized, kept, {"f16_subnormal_scales": n_sub, "scales": n_scales}


def compact(table):
    """Per-expert entries folded into one `experts.*` entry per layer and projection (all experts alike)."""
    out = {}
    for name, v in table.items():
        key = re.sub(r"\.experts\.\d+\.", ".experts.*.", name)
        assert out.get(key, v) == v, (name, v, out[key])
        out[key] = v
    return out


# ---------------------------------------------------------------- main per family
def write_family(fam, seed, versions, sparsa):
    spec = FAMILIES[fam]
    path = os.path.join(DATA, fam)
    with tempfile.TemporaryDirectory() as tmp:
        model, orig, src, qdir0 = build(fam, seed, tmp, sparsa)
        refs0, eos = pick_eos(model, fam, spec)
        cfg = make_config(spec)
        first = {f: sha(os.path.join(qdir0, f)) for f in stored_files(qdir0) if f.endswith("safetensors")}

        fresh_dir(path)
        sdir = os.path.join(path, "source")
        write_source(fam, cfg, src, sdir, eos)
        qdir = os.path.join(tmp, "final")
        summary = run_quantize(sparsa, fam, sdir, qdir)
        files = stored_files(qdir)
        for f in files:
            shutil.copyfile(os.path.join(qdir, f), os.path.join(path, f))
    for f in first:
        assert sha(os.path.join(path, f)) == first[f], f"{f}: quantize output changed between runs"
    quantized, kept, scale_stats = check_requantization(fam, src, path)

    loaded = load_quantized(fam, path)
    check_reload(model, loaded)
    refs, stats = final_references(loaded, fam, spec, refs0, eos, path)

    # quantized vs the bf16 source
    ck = load_dequantized(path, fuse_experts=False)
    num = sum(((ck[n] - src[n].float()) ** 2).sum().item() for n in quantized)
    den = sum((src[n].float() ** 2).sum().item() for n in quantized)
    effect = quality_effect(orig, loaded, refs, math.sqrt(num / den), (
        "the same seed's bf16 source model (kept tensors identical); sparse includes flipped top-k choices"))

    with open(os.path.join(path, "config.json")) as fh:
        qcfg = json.load(fh)["quantization_config"]
    info = reference_info(fam, spec, seed, versions, loaded, stats, {
        "eos_token_id": eos,
        "quantization": {
            "quantization_config": qcfg,
            "quantize_args": ["quantize", "--model", "source", "--out", "<new dir>"] + spec["quantize_args"],
            "quantize_flags": spec["quantize_args"],
            "quantize_summary": summary.split(", ", 1)[0].split(": ", 1)[-1] if summary else "",
            "source_sha256": {f"source/{f}": sha(os.path.join(path, "source", f))
                              for f in stored_files(os.path.join(path, "source"))},
            "quantized_sha256": {f: sha(os.path.join(path, f)) for f in files},
            "dequantize": ("q8: W[i,j] = i8[i,j] * f16 scale[i, j//B]; q4: W[i,j] = (nibble[i,j] - 8) * scale[i, j//B], "
                           "element 2m in the low nibble of byte m (src/weights/quant.rs; tests/reference/sparsa_formats.py)"),
            "requantized_by_python_identical": True,
            "scale_stats": scale_stats,
            "quantized_tensors": compact(quantized),
            "kept_tensors": compact(kept),
        },
        "quant_vs_bf16_source": effect,
    })
    finish_dir(path, info)
    print(json.dumps({"family": fam, "weight_seed": seed, "quant_vs_bf16_source": info["quant_vs_bf16_source"],
                      "margins": info["margins"], "greedy_gaps": stats["greedy_gap"], "scale_stats": scale_stats}))
    print_files(path)


def main():
    ap = arg_parser(__doc__, FAMILIES, max_tries=500)
    ap.add_argument("--sparsa", default=SPARSA, help="the sparsa binary (default target/release/sparsa)")
    args = ap.parse_args()
    if not os.access(args.sparsa, os.X_OK):
        sys.exit(f"{args.sparsa}: not an executable (cargo build --release, or pass --sparsa)")
    sparsa = os.path.abspath(args.sparsa)
    versions = setup()
    for fam in args.only or list(FAMILIES):
        spec = FAMILIES[fam]
        with tempfile.TemporaryDirectory() as tmp:
            def stats_of(s):  # each candidate seed is quantized by the sparsa binary itself
                return evaluate(build(fam, s, tmp, sparsa)[0], fam, spec, early_exit=True)[1]
            seed = find_seed(fam, spec, stats_of, args.max_tries, search=args.search)
        write_family(fam, seed, versions, sparsa)


if __name__ == "__main__":
    main()
