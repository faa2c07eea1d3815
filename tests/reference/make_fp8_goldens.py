#!/usr/bin/env python3
"""FP8 (block-quantized float8_e4m3fn) model directories in the official release layout, and transformers
references computed from exactly those FP8 files.

Pinned versions (exactly these, common.py's PINNED as for make_goldens.py; the script refuses to run with others):
    torch==2.15.0  transformers==5.24.0  safetensors==0.8.0  numpy==2.4.6
Fresh machine (Python 3.11, CPU is enough):
    pip install torch==2.15.0 transformers==5.24.0 safetensors==0.8.0 tokenizers numpy==2.4.6
Run (from the repository root; ~65 s on 2 cores: ~10 s import, then per family the seed re-check and
two full evaluations):
    python3 tests/reference/make_fp8_goldens.py                     # writes tests/data/{glm52-fp8,dsv32-fp8}/
    python3 tests/reference/make_fp8_goldens.py --only dsv32-fp8    # one family
    python3 tests/reference/make_fp8_goldens.py --search            # redo the seed search (~2-4 min)
    python3 tests/reference/check_notes.py glm52-fp8 dsv32-fp8      # independent f64 check (~70 s)
Reruns on one machine reproduce every file bit for bit (checked: two runs, identical sha256 of every file;
other CPUs: see common.py).
Recorded seeds: glm52-fp8 5004 (searched from 5000), dsv32-fp8 6064 (from 6000).

Families (built, evaluated and checked by common.py, like make_goldens.py's: CONFIG_DEFAULTS, make_config,
init_weights, evaluate, passes, pick_eos, find_seed):
    glm52-fp8  GlmMoeDsaForCausalLM, IndexShare (F S S F S S), scale = amax/448, one model.safetensors
    dsv32-fp8  DeepseekV32ForCausalLM, router groups + YaRN, UE8M0-style power-of-two scales (except
               o_proj, see below), 2 shards + model.safetensors.index.json
Dims are chosen so that FP8 block edges matter: hidden 200 / 168, q_lora 136 / 152, intermediate 280 / 260,
kv_lora 72 / 132, vocab 400 / 389. Matrices with rows AND columns > 128 and not multiples of 128 (partial
blocks in both directions): q_a_proj, the dense gate/up/down_proj (both), q_b_proj, kv_a_proj_with_mqa,
kv_b_proj (dsv32-fp8). Matrices inside a single block (scale_inv [1, 1]): kv_b_proj of glm52-fp8 [112, 72].
Exact block multiples also occur (glm52-fp8 q_b_proj has 128 rows, indexer.wq_b 512 rows; dsv32-fp8
indexer.wq_b 384 rows).

Layout (what a release directory holds; per stored tensor):
    FP8  <name>            F8_E4M3 [out, in]
         <name>_scale_inv  F32     [ceil(out/128), ceil(in/128)]
         for every `.weight` of: self_attn.{q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj},
         self_attn.indexer.{wq_b, wk}, mlp.{gate,up,down}_proj (dense layers),
         mlp.shared_experts.{gate,up,down}_proj, mlp.experts.{e}.{gate,up,down}_proj (one tensor per expert).
    BF16 model.embed_tokens.weight, lm_head.weight, model.norm.weight, every *layernorm.weight
         (input_, post_attention_, q_a_, kv_a_), mlp.gate.weight (router), self_attn.indexer.weights_proj.weight,
         self_attn.indexer.k_norm.{weight,bias}.
    F32  mlp.gate.e_score_correction_bias.
Sources for that split (no release file was readable here; these are the public traces of them):
  - DeepSeek's reference inference/model.py for V3.2(-Exp): every `Linear` is FP8 when dtype == fp8 (wq_a,
    wq_b, wkv_a, wkv_b, wo, indexer wq_b / wk, MLP/expert w1/w2/w3), "weights_proj in the checkpoint is
    stored in bf16", LayerNorm/RMSNorm weights and the Gate weight are not Linear (not FP8), the Gate bias is
    fp32; embedding and head are plain bf16 tensors.
  - GLM-5 / 5.1 / 5.2-FP8: third-party loaders of the real files (ROCm/ATOM PR #451, sgl-project/sglang-jax
    PR #1111, AWS Neuron and xorl loaders): indexer.wq_b [4096, 2048] and indexer.wk [128, 6144] are FP8,
    indexer.weights_proj [32, 6144] and indexer.k_norm are BF16, kv_a_proj_with_mqa [576, 6144] is FP8 with a
    [5, 48] scale grid, lm_head and embed_tokens are BF16. Their `quantization_config.modules_to_not_convert`
    names `model.layers.{i}.self_attn.indexers_proj` -- a module that does not exist (the tensor is
    `indexer.weights_proj`). The list written here follows those loaders' copies of the real list (norms,
    mlp.gate (+ .e_score_correction_bias), indexers_proj, indexer.k_norm (+ .bias), embed_tokens, model.norm,
    lm_head), for this model's layers. Engines should NOT use modules_to_not_convert: a tensor is FP8 iff its
    safetensors dtype is F8_E4M3, and then `<name>_scale_inv` must exist.
  - quantization_config: GLM {quant_method fp8, fmt e4m3, activation_scheme dynamic, weight_block_size
    [128, 128], modules_to_not_convert [...]}; DeepSeek-V3.2 {same + scale_fmt "ue8m0", no
    modules_to_not_convert} (scale_fmt as third-party code quotes the V3.1 / V3.2 HF configs; DeepSeek's own
    inference/config_671B_v3.2.json has scale_fmt ue8m0). With ue8m0 the
    scale_inv tensors are still F32, holding powers of two; in the V3.1 release the o_proj scales are not
    powers of two (deepseek-ai/DeepSeek-V3 issue #961), so dsv32-fp8 quantizes o_proj with amax/448 too: an
    engine must not assume power-of-two scales.

Quantization (the formula of DeepSeek's act_quant kernel; the releases' own weight converter is not public,
their scales have this form), per 128x128 block B of W (f32; the last block row / column is partial, padding
does not enter amax):
    amax = max |W[B]|                     (asserted > 0)
    S    = amax / 448                     (f32 division; glm52-fp8, and dsv32-fp8 o_proj)
    S    = 2^ceil(log2(amax / 448))       (dsv32-fp8 except o_proj; exact, via frexp)
    W8   = float8_e4m3fn(W[B] / S)        (torch's cast: round to nearest even, saturating to +-448)
    stored <name> = W8, <name>_scale_inv = S
Dequantization (what the references use, and what an engine must do):
    W[i, j] = f32(W8[i, j]) * S[i // 128, j // 128]   (one f32 multiply, correctly rounded; partial blocks
                                                          are the cropped edge of the [128*ceil] grid)
e4m3fn decode rule (a byte b = s eeee mmm; asserted equal to torch's float8_e4m3fn -> float32 for all 256):
    sign = -1 if b & 0x80 else +1;  e = (b >> 3) & 15;  m = b & 7
    e == 15 and m == 7 (0x7F, 0xFF)  -> NaN (no infinities in e4m3fn)
    e == 0                           -> sign * (m / 8) * 2^-6        (subnormals; 0x00 = +0, 0x80 = -0)
    otherwise                        -> sign * (1 + m / 8) * 2^(e - 7)   (max finite 0x7E = 448, 0xFE = -448)
Special bytes: after quantization some raw bytes are overwritten (FAMILIES[...]["specials"]; listed in
reference.json):
+0 (0x00), -0 (0x80), subnormals 0x01 0x06 0x07 0x81 0x87, smallest normal 0x08, +-448 (0x7E, 0xFE), placed
at block corners and in partial edge blocks of large matrices. Each changes one weight to at most the
block's amax, so the logits move only mildly; the references include them.

What it writes, per family, into tests/data/<family>/:
    config.json (model config + quantization_config, dtype bfloat16), generation_config.json,
    model.safetensors (glm52-fp8) or model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json
    (dsv32-fp8; one weight/scale_inv pair deliberately straddles the two shards -- valid per the index
    format, so loaders must look every tensor up in the index), reference.safetensors, reference.json.
    reference.safetensors has the keys of make_goldens.py: tokens_{i} int32 [T], logits_{i} f32 [T, V],
    greedy_{i} int32 [24] (generate with the KV/indexer cache), logits_dense_{i} f32 [T, V] (index_topk = 1e9),
    topk_{i}_l{l} int32 [T, K] (prefill indexer selection of each full layer, rows sorted, -1 padded).

References: the FP8 files are read back with safetensors, dequantized as above (crop of the block grid),
written as an f32 checkpoint with the same per-expert names to a temporary directory, and loaded with
`<Class>.from_pretrained(dtype=float32, attn_implementation="eager", experts_implementation="eager")`
(no quantization_config there, so transformers' own FP8 path is not involved; the script asserts the loaded
state equals the dequantized tensors). transformers 5.24's FP8 dequantization
(`integrations/finegrained_fp8.py`, Fp8Dequantize._dequantize_one) derives the block size as
rows // scale_rows, cols // scale_cols: wrong for partial-block matrices unless the mixed-up blocks happen to
have equal scales, and a ValueError when the division is not exact (see HF_NOTES.md section 12);
reference.json records, per family, which stored tensors it gets right, silently wrong, or rejects.
Robustness: the same checks and thresholds as make_goldens.py (common.py: indexer top-k boundary gaps, router
expert / group gaps, greedy top-1 gaps, sparse != dense, cached greedy == cache-free argmax, -inf group mask
matters), evaluated on the dequantized model, with a seed search (--search) whose first passing seed is recorded in
FAMILIES[...]["seed"]. reference.json also records max |logits(FP8 model) - logits(same weights before
quantization)| per prompt (the bf16-kept tensors are bf16 in both), sparse and dense, the weight relative RMS
error and the residual-stream relative error after each layer, to document the FP8 quality effect (large in
these tiny random models: router / indexer choices flip, so unquantized references are no substitute).
"""
import copy
import json
import math
import os
import re
import struct
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import (
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
    GlmMoeDsaConfig,
    GlmMoeDsaForCausalLM,
)
from transformers.integrations.finegrained_fp8 import Fp8Dequantize

from common import (
    DATA, DSV32_ROPE, GLM52_INDEXER, arg_parser, check_reload, evaluate, final_references, find_seed, finish_dir,
    fresh_dir, fuse_expert_tensors, hf_to_ckpt, make_config, new_model, ordered_names, pick_eos, print_files,
    quality_effect, reference_info, save_configs, setup, write_json,
)
from sparsa_formats import weight_files

BLOCK = 128
E4M3_MAX = 448.0
FP8 = torch.float8_e4m3fn

FP8_RE = re.compile(
    r"^model\.layers\.\d+\.("
    r"self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj|indexer\.wq_b|indexer\.wk)"
    r"|mlp\.(gate_proj|up_proj|down_proj)"
    r"|mlp\.shared_experts\.(gate_proj|up_proj|down_proj)"
    r"|mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)"
    r")\.weight$")

GLM_QCFG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
DS_QCFG = dict(GLM_QCFG, scale_fmt="ue8m0")

FAMILIES = {
    "glm52-fp8": dict(
        cls=(GlmMoeDsaConfig, GlmMoeDsaForCausalLM),
        search_from=5000, seed=5004,  # first passing seed (python3 make_fp8_goldens.py --search)
        prompt_lens=(43, 66, 85),
        shards=1,
        scales="amax/448",
        qcfg=GLM_QCFG, modules_to_not_convert=True,
        config=dict(
            vocab_size=400, hidden_size=200, intermediate_size=280, moe_intermediate_size=24,
            num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=136, kv_lora_rank=72, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=12,
            n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
            first_k_dense_replace=2, index_n_heads=16, index_head_dim=32,
            rms_norm_eps=1e-5, max_position_embeddings=2048,
            rope_parameters={"rope_type": "default", "rope_theta": 8.0e6},
            **GLM52_INDEXER,  # F S S F S S
        ),
        # (tensor, row, col, byte): rows/cols index the [out, in] FP8 matrix
        specials=[
            ("model.layers.0.mlp.down_proj.weight", 0, 0, 0x7E),      # +448, block (0,0) corner
            ("model.layers.0.mlp.down_proj.weight", 199, 279, 0xFE),  # -448, last element (partial block (1,2))
            ("model.layers.0.mlp.down_proj.weight", 128, 256, 0x01),  # +2^-9, first element of block (1,2)
            ("model.layers.0.mlp.down_proj.weight", 127, 127, 0x80),  # -0
            ("model.layers.0.mlp.down_proj.weight", 5, 200, 0x00),    # +0
            ("model.layers.0.mlp.down_proj.weight", 150, 3, 0x07),    # largest subnormal 7*2^-9
            ("model.layers.0.mlp.down_proj.weight", 60, 270, 0x87),   # -7*2^-9 (partial column block)
            ("model.layers.0.mlp.down_proj.weight", 190, 140, 0x81),  # -2^-9
            ("model.layers.0.mlp.down_proj.weight", 100, 150, 0x08),  # smallest normal 2^-6
            ("model.layers.3.self_attn.q_a_proj.weight", 135, 199, 0x7E),  # +448 at the last element
            ("model.layers.3.self_attn.q_a_proj.weight", 0, 199, 0x01),
            ("model.layers.3.self_attn.q_a_proj.weight", 135, 0, 0x80),
            ("model.layers.3.self_attn.q_a_proj.weight", 128, 128, 0xFE),
            ("model.layers.3.self_attn.q_a_proj.weight", 64, 64, 0x00),
            ("model.layers.3.self_attn.q_a_proj.weight", 130, 10, 0x06),
            ("model.layers.5.self_attn.kv_b_proj.weight", 111, 71, 0x7E),  # single-block matrix corner
            ("model.layers.5.self_attn.kv_b_proj.weight", 0, 0, 0x81),
        ],
    ),
    "dsv32-fp8": dict(
        cls=(DeepseekV32Config, DeepseekV32ForCausalLM),
        search_from=6000, seed=6064,  # first passing seed
        prompt_lens=(41, 62, 83),
        shards=2,
        scales="ue8m0 (o_proj: amax/448)",
        qcfg=DS_QCFG, modules_to_not_convert=False,
        config=dict(
            vocab_size=389, hidden_size=168, intermediate_size=260, moe_intermediate_size=16,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=152, kv_lora_rank=132, qk_nope_head_dim=24, qk_rope_head_dim=16, v_head_dim=20,
            n_routed_experts=12, num_experts_per_tok=3, n_group=4, topk_group=2,
            first_k_dense_replace=1, index_n_heads=16, index_head_dim=24,
            rms_norm_eps=1e-6, max_position_embeddings=3840,
            rope_parameters=DSV32_ROPE,
        ),
        specials=[
            ("model.layers.1.self_attn.kv_b_proj.weight", 175, 131, 0xFE),  # -448, last element
            ("model.layers.1.self_attn.kv_b_proj.weight", 128, 128, 0x7E),  # +448, first of partial block (1,1)
            ("model.layers.1.self_attn.kv_b_proj.weight", 3, 130, 0x00),
            ("model.layers.1.self_attn.kv_b_proj.weight", 170, 5, 0x80),
            ("model.layers.1.self_attn.kv_b_proj.weight", 127, 0, 0x01),
            ("model.layers.1.self_attn.kv_b_proj.weight", 0, 127, 0x87),
        ],
    ),
}


# ---------------------------------------------------------------- e4m3
def e4m3_decode(b):
    """The e4m3fn decode rule of the docstring, in plain Python."""
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0xF, b & 0x7
    if e == 0xF and m == 0x7:
        return float("nan")
    if e == 0:
        return sign * (m / 8.0) * 2.0 ** -6
    return sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)


def check_e4m3():
    """Rule == torch for all 256 bytes (bit-exact as f32, incl. -0; NaN for 0x7F/0xFF); plus torch's
    rounding of the cast that the quantizer relies on (nearest-even, saturating)."""
    t = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    for b in range(256):
        want, got = e4m3_decode(b), t[b].item()
        if math.isnan(want):
            assert math.isnan(got), b
        else:
            assert struct.pack("<f", want) == struct.pack("<f", got), (hex(b), want, got)
    enc = torch.tensor([448.0, 464.0, 500.0, 1e9, -1e9, 2.0 ** -10, 3 * 2.0 ** -10, 0.0, -0.0, 9.0, 8.5, 9.5])
    got = enc.to(FP8).view(torch.uint8).tolist()
    # 464 is the 448/480 midpoint: saturates; 2^-10 ties to 0 (even); 3*2^-10 ties to 2^-8 (m=2, even);
    # 9 = 8*(1+1/8) exact; 8.5 (8|9) -> 8 and 9.5 (9|10) -> 10: ties go to the even mantissa
    assert got == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x00, 0x02, 0x00, 0x80, 0x51, 0x50, 0x52], [hex(x) for x in got]
    assert t[0x7E].item() == E4M3_MAX and t[0xFE].item() == -E4M3_MAX


# ---------------------------------------------------------------- quantization
def quantize(w, ue8m0):
    """w f32 [R, C] -> (W8 float8_e4m3fn [R, C], S f32 [ceil(R/128), ceil(C/128)])."""
    R, C = w.shape
    nr, nc = -(-R // BLOCK), -(-C // BLOCK)
    pad = torch.zeros(nr * BLOCK, nc * BLOCK, dtype=torch.float32)
    pad[:R, :C] = w
    blocks = pad.view(nr, BLOCK, nc, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    assert (amax > 0).all()
    s = amax / E4M3_MAX
    if ue8m0:
        m, e = torch.frexp(s)  # s = m * 2^e, m in [0.5, 1)
        s = torch.ldexp(torch.ones_like(s), torch.where(m == 0.5, e - 1, e))  # 2^ceil(log2 s), exact
        assert (s >= amax / E4M3_MAX).all() and (s < 2 * amax / E4M3_MAX).all()
    q = (blocks / s[:, None, :, None]).to(FP8)
    return q.reshape(nr * BLOCK, nc * BLOCK)[:R, :C].contiguous(), s.contiguous()


def dequantize(w8, s):
    R, C = w8.shape
    assert tuple(s.shape) == (-(-R // BLOCK), -(-C // BLOCK)), (tuple(w8.shape), tuple(s.shape))
    S = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:R, :C]
    return w8.float() * S


def kind(name):
    if FP8_RE.match(name):
        return "fp8"
    if name.endswith("e_score_correction_bias"):
        return "f32"
    return "bf16"


def ue8m0_for(fam, name):
    return FAMILIES[fam]["qcfg"].get("scale_fmt") == "ue8m0" and not name.endswith("self_attn.o_proj.weight")


def quantize_ckpt(fam, ck):
    """Checkpoint (f32) -> stored tensors (FP8 + F32 scales, BF16, F32), with the special bytes patched in."""
    stored = {}
    for name, t in ck.items():
        k = kind(name)
        if k == "fp8":
            w8, s = quantize(t, ue8m0_for(fam, name))
            stored[name], stored[name + "_scale_inv"] = w8, s
        elif k == "f32":
            stored[name] = t.clone()
        else:
            stored[name] = t.to(torch.bfloat16)
    for name, r, c, byte in FAMILIES[fam]["specials"]:
        u = stored[name].view(torch.uint8)
        u[r, c] = byte
    return stored


def dequantize_stored(stored):
    ck = {}
    for name, t in stored.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == FP8:
            ck[name] = dequantize(t, stored[name + "_scale_inv"])
        else:
            assert name + "_scale_inv" not in stored
            ck[name] = t.to(torch.float32)
    return ck


# ---------------------------------------------------------------- models
def build(fam, seed):
    """(fp8 model, unquantized model, stored tensors). Both models f32; the bf16-kept tensors are bf16-rounded
    in both, so their difference is the FP8 quantization (incl. special bytes) alone."""
    spec = FAMILIES[fam]
    orig = new_model(spec, seed)
    ck = hf_to_ckpt(orig.state_dict())
    with torch.no_grad():
        for name, t in ck.items():
            if kind(name) == "bf16":
                t.copy_(t.to(torch.bfloat16).float())
        orig.load_state_dict(fuse_expert_tensors(ck), strict=True)
    stored = quantize_ckpt(fam, ck)
    fp8 = new_model(spec, state=fuse_expert_tensors(dequantize_stored(stored)))
    return fp8, orig, stored


# ---------------------------------------------------------------- files
def nbytes(t):
    return t.numel() * t.element_size()


def write_weights(fam, stored, path):
    shards = FAMILIES[fam]["shards"]
    names = ordered_names(stored)
    meta = {"format": "pt"}
    if shards == 1:
        save_file({n: stored[n] for n in names}, os.path.join(path, "model.safetensors"), metadata=meta)
        return {"files": ["model.safetensors"], "straddling_pair": None}
    assert shards == 2
    total = sum(nbytes(stored[n]) for n in names)
    acc, cut = 0, None
    for i, n in enumerate(names):
        acc += nbytes(stored[n])
        if acc >= total // 2 and n.endswith(".weight") and n + "_scale_inv" in stored:
            cut = i + 1  # the weight ends shard 1, its scale_inv opens shard 2
            break
    assert names[cut] == names[cut - 1] + "_scale_inv"
    parts = [names[:cut], names[cut:]]
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {}
    for f, part in zip(files, parts):
        save_file({n: stored[n] for n in part}, os.path.join(path, f), metadata=meta)
        for n in part:
            weight_map[n] = f
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as fh:
        json.dump(index, fh, indent=2, sort_keys=True)
        fh.write("\n")
    return {"files": files + ["model.safetensors.index.json"], "straddling_pair": names[cut - 1]}


def read_weights(path):
    out, dtypes = {}, {}
    for f in weight_files(path):
        with safe_open(os.path.join(path, f), "pt") as sf:
            for k in sf.keys():
                dtypes[k] = sf.get_slice(k).get_dtype()
        out.update(load_file(os.path.join(path, f)))
    return out, dtypes


def modules_to_not_convert(cfg):
    """The GLM-5.x-FP8 style list (see docstring), for this model's layers."""
    mods = {"model.embed_tokens", "model.norm", "lm_head"}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        mods |= {f"{p}.input_layernorm", f"{p}.post_attention_layernorm",
                 f"{p}.self_attn.q_a_layernorm", f"{p}.self_attn.kv_a_layernorm"}
        if cfg.mlp_layer_types[i] == "sparse":
            mods |= {f"{p}.mlp.gate", f"{p}.mlp.gate.e_score_correction_bias"}
        if cfg.indexer_types[i] == "full":
            mods |= {f"{p}.self_attn.indexers_proj", f"{p}.self_attn.indexer.k_norm",
                     f"{p}.self_attn.indexer.k_norm.bias"}
    return sorted(mods)


def write_config(fam, cfg, path, eos):
    cfg = save_configs(FAMILIES[fam], cfg, path, eos)
    p = os.path.join(path, "config.json")
    d = json.load(open(p))
    q = dict(FAMILIES[fam]["qcfg"])
    if FAMILIES[fam]["modules_to_not_convert"]:
        q["modules_to_not_convert"] = modules_to_not_convert(cfg)
    d["quantization_config"] = q
    write_json(p, d, sort_keys=True)
    return d


def load_reference_model(fam, stored, cfg):
    """Dequantized f32 checkpoint (per-expert names) -> temp dir -> from_pretrained."""
    ck = dequantize_stored(stored)
    with tempfile.TemporaryDirectory() as tmp:
        c = copy.deepcopy(cfg)
        c.architectures = [FAMILIES[fam]["cls"][1].__name__]
        c.save_pretrained(tmp)
        save_file(ck, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        m, info = FAMILIES[fam]["cls"][1].from_pretrained(
            tmp, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
            output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    m.eval()
    want = fuse_expert_tensors(ck)
    got = m.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), f"from_pretrained changed {k}"
    return m


def hf_fp8_dequant_report(stored):
    """What transformers 5.24's Fp8Dequantize._dequantize_one makes of each stored FP8 tensor: per outcome,
    shape -> number of tensors. (A partial-block tensor can still come out exact when the blocks it mixes up
    have equal scales, as happens with power-of-two scales.)"""
    d = Fp8Dequantize(None)
    rep = {"exact": {}, "silently_wrong": {}, "raises_ValueError": {}}
    for name in sorted(stored):
        t = stored[name]
        if t.dtype != FP8:
            continue
        s = stored[name + "_scale_inv"]
        shape = f"{list(t.shape)} scale_inv {list(s.shape)}"
        try:
            got = d._dequantize_one(t, s, output_dtype=torch.float32)
        except ValueError:
            out = "raises_ValueError"
        else:
            out = "exact" if torch.equal(got.view(torch.int32), dequantize(t, s).view(torch.int32)) else "silently_wrong"
        rep[out][shape] = rep[out].get(shape, 0) + 1
    return {k: dict(sorted(v.items())) for k, v in rep.items()}


def hf_style_logit_delta(fam, stored, refs):
    """Max |dlogit| (sparse prefill, all prompts) if the weights were dequantized like transformers'
    Fp8Dequantize (block = rows // scale_rows, cols // scale_cols), keeping our result where it raises:
    how far a wrong block mapping moves these references."""
    d = Fp8Dequantize(None)
    ck = dequantize_stored(stored)
    for name, t in stored.items():
        if t.dtype == FP8:
            try:
                ck[name] = d._dequantize_one(t, stored[name + "_scale_inv"], output_dtype=torch.float32)
            except ValueError:
                pass
    m = new_model(FAMILIES[fam], state=fuse_expert_tensors(ck))
    worst = 0.0
    with torch.no_grad():
        for i in range(len(FAMILIES[fam]["prompt_lens"])):
            ids = refs[f"tokens_{i}"].long()
            worst = max(worst, (m(ids[None], use_cache=False).logits[0] - refs[f"logits_{i}"]).abs().max().item())
    return worst


def byte_classes(stored):
    n = {"zero(+0/-0)": 0, "subnormal": 0, "max(+-448)": 0, "nan": 0, "total": 0}
    for t in stored.values():
        if t.dtype != FP8:
            continue
        u = t.view(torch.uint8).flatten().to(torch.int32) & 0x7F
        n["total"] += u.numel()
        n["zero(+0/-0)"] += int((u == 0).sum())
        n["subnormal"] += int(((u >= 1) & (u <= 7)).sum())
        n["max(+-448)"] += int((u == 0x7E).sum())
        n["nan"] += int((u == 0x7F).sum())
    return n


# ---------------------------------------------------------------- main per family
def write_family(fam, seed, versions):
    spec = FAMILIES[fam]
    path = os.path.join(DATA, fam)
    model, orig, stored = build(fam, seed)
    ck0 = hf_to_ckpt(orig.state_dict())
    refs0, eos = pick_eos(model, fam, spec)
    cfg = make_config(spec)

    fresh_dir(path)
    layout = write_weights(fam, stored, path)
    config_json = write_config(fam, cfg, path, eos)

    # read back exactly what was written
    back, dtypes = read_weights(path)
    assert back.keys() == stored.keys()
    for k in stored:
        assert stored[k].dtype == back[k].dtype and torch.equal(stored[k].view(torch.uint8), back[k].view(torch.uint8)), k
        want = {"fp8": "F8_E4M3", "bf16": "BF16", "f32": "F32"}[kind(k)] if not k.endswith("_scale_inv") else "F32"
        assert dtypes[k] == want, (k, dtypes[k], want)
    for name, r, c, byte in spec["specials"]:
        assert back[name].view(torch.uint8)[r, c].item() == byte

    loaded = load_reference_model(fam, back, cfg)
    check_reload(model, loaded)
    refs, stats = final_references(loaded, fam, spec, refs0, eos, path)

    # FP8 vs the same weights before quantization
    num = sum(((dequantize(stored[n], stored[n + "_scale_inv"]) - ck0[n]) ** 2).sum().item()
              for n in stored if stored[n].dtype == FP8)
    den = sum((ck0[n] ** 2).sum().item() for n in stored if stored[n].dtype == FP8)
    effect = quality_effect(orig, loaded, refs, math.sqrt(num / den), (
        "same seed, same bf16-kept tensors; the FP8 tensors at their f32 values before quantization. "
        "Sparse: includes indexer top-k choices that FP8 noise flips; dense (index_topk = 1e9): the "
        "weight rounding alone"))

    fp8_names = [n for n in ordered_names(stored) if stored[n].dtype == FP8]
    info = reference_info(fam, spec, seed, versions, loaded, stats, {
        "eos_token_id": eos,
        "quantization": {
            "quantization_config": config_json["quantization_config"],
            "block": [BLOCK, BLOCK],
            "scale_rule": spec["scales"],
            "dequantize": "W[i,j] = f32(W8[i,j]) * scale_inv[i//128, j//128] (partial edge blocks cropped)",
            "files": layout["files"],
            "weight_and_scale_in_different_shards": layout["straddling_pair"],
            "fp8_tensors": {n: {"shape": list(stored[n].shape), "scale_inv": list(stored[n + "_scale_inv"].shape)}
                            for n in fp8_names},
            "bf16_tensors": [n for n in ordered_names(stored) if stored[n].dtype == torch.bfloat16],
            "f32_tensors": [n for n in ordered_names(stored)
                            if stored[n].dtype == torch.float32 and not n.endswith("_scale_inv")],
            "special_bytes": [{"tensor": n, "row": r, "col": cc, "byte": f"0x{b:02X}", "value": e4m3_decode(b)}
                              for n, r, cc, b in spec["specials"]],
            "fp8_byte_classes": byte_classes(stored),
            "transformers_Fp8Dequantize_on_these_tensors": hf_fp8_dequant_report(stored),
            "max_abs_dlogit_if_dequantized_like_transformers": hf_style_logit_delta(fam, stored, refs),
        },
        "fp8_vs_unquantized": effect,
    })
    finish_dir(path, info)
    print(json.dumps({"family": fam, "weight_seed": seed, "fp8_vs_unquantized": info["fp8_vs_unquantized"],
                      "margins": info["margins"], "greedy_gaps": stats["greedy_gap"],
                      "hf_fp8_dequant": {k: sum(v.values()) for k, v in
                                         info["quantization"]["transformers_Fp8Dequantize_on_these_tensors"].items()}}))
    print_files(path)


def main():
    args = arg_parser(__doc__, FAMILIES, max_tries=500).parse_args()
    versions = setup()
    check_e4m3()
    for fam in args.only or list(FAMILIES):
        spec = FAMILIES[fam]
        seed = find_seed(fam, spec, lambda s: evaluate(build(fam, s)[0], fam, spec, early_exit=True)[1],
                         args.max_tries, search=args.search, print_every=10)
        write_family(fam, seed, versions)


if __name__ == "__main__":
    main()
