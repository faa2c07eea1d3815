"""Reader for sparsa's own quantized model directories (`sparsa quantize --format q8|q4`), in numpy.

Independent of the sparsa binary: the safetensors files are parsed here (8-byte header length, JSON header,
raw little-endian data) and the quantized tensors decoded by the rule of src/weights/quant.rs:

    q8  <name>        I8  [N, K]            value[i, j] = q[i, j] * S[i, j // B]
    q4  <name>        U8  [N, ceil(K/2)]    element 2m in the LOW nibble of byte m, 2m+1 in the high one;
                                            value[i, j] = (nibble[i, j] - 8) * S[i, j // B]
        <name>_scale  BF16 [N, ceil(K/B)]    (B = quantization_config.block_size)

Decoding is exact in float32 (an integer of <= 8 bits times an f16 scale: at most 19 significant bits), so
these are exactly the weights a correct engine computes with. Every other tensor (embeddings, norms, router,
correction bias, indexer weights_proj, anything kept with --keep) is returned as stored, converted to float32.
Sharded directories are read through model.safetensors.index.json.

A q4 row of odd length K has a padding nibble (stored 8, value 0) in the high half of its last byte, so K
cannot be read off the U8 shape: it comes from config.json (in_features below, the shapes sparsa's loader
expects), or from an `in_features` mapping / callable passed by the caller.

    load_dequantized(model_dir)                     -> {HF state-dict name: float32 tensor}, experts fused
    load_dequantized(model_dir, fuse_experts=False) -> checkpoint names (mlp.experts.{e}.{gate,up,down}_proj)
    read_safetensors(path)                          -> ({name: (dtype string, shape, numpy array)}, metadata)

Fused experts: transformers 5.24's GlmMoeDsa / DeepseekV32 modules hold one `mlp.experts.gate_up_proj`
[E, 2I, H] (each expert's gate_proj rows first, then up_proj) and `mlp.experts.down_proj` [E, H, I]; their
from_pretrained converts per-expert checkpoint names, load_state_dict does not, so load_dequantized fuses
them with fuse_expert_tensors (which the golden scripts use too; common.py's hf_to_ckpt is the inverse).
"""
import json
import os
import re
import struct

import numpy as np
import torch

_NP = {"F32": np.float32, "F16": np.float16, "I8": np.int8, "U8": np.uint8, "I32": np.int32, "I64": np.int64,
       "BF16": np.uint16, "F64": np.float64, "I16": np.int16, "U16": np.uint16, "BOOL": np.bool_}


def read_safetensors(path):
    """{name: (dtype, shape, numpy array)} and the __metadata__ dict. BF16 comes back as its raw uint16."""
    with open(path, "rb") as fh:
        blob = fh.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, h in header.items():
        dt, shape, (a, b) = h["dtype"], h["shape"], h["data_offsets"]
        if dt not in _NP:
            raise ValueError(f"{path}: tensor {name} has dtype {dt}, not one sparsa's q8/q4 directories hold")
        arr = np.frombuffer(blob, dtype=np.dtype(_NP[dt]).newbyteorder("<"), count=(b - a) // np.dtype(_NP[dt]).itemsize,
                            offset=base + a)
        out[name] = (dt, list(shape), arr.reshape(shape))
    return out, meta


def weight_files(model_dir):
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as fh:
            return sorted(set(json.load(fh)["weight_map"].values()))
    if os.path.exists(os.path.join(model_dir, "model.safetensors")):
        return ["model.safetensors"]
    raise FileNotFoundError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")


def quant_config(model_dir):
    """(format, block) from config.json's quantization_config, or (None, None) for a float directory."""
    with open(os.path.join(model_dir, "config.json")) as fh:
        cfg = json.load(fh)
    q = cfg.get("quantization_config") or {}
    if q.get("quant_method") != "sparsa":
        return None, None, cfg
    fmt, block = q["format"], int(q["block_size"])
    if fmt not in ("q8", "q4"):
        raise ValueError(f"{model_dir}: quantization_config.format {fmt!r} (expected q8 or q4)")
    return fmt, block, cfg


def in_features(name, cfg):
    """Columns (input features) of a `.weight` matrix, from the model config; None when unknown."""
    h = cfg["hidden_size"]
    rules = [
        (r"lm_head\.weight$", h),
        (r"self_attn\.(q_a_proj|q_proj|kv_a_proj_with_mqa)\.weight$", h),
        (r"self_attn\.q_b_proj\.weight$", cfg.get("q_lora_rank")),
        (r"self_attn\.kv_b_proj\.weight$", cfg.get("kv_lora_rank")),
        (r"self_attn\.o_proj\.weight$", cfg["num_attention_heads"] * cfg.get("v_head_dim", 0)),
        (r"indexer\.wq_b\.weight$", cfg.get("q_lora_rank")),
        (r"indexer\.(wk|weights_proj)\.weight$", h),
        (r"mlp\.gate\.weight$", h),
        (r"(gate_proj|up_proj)\.weight$", h),
        (r"mlp\.experts\.\d+\.down_proj\.weight$", cfg.get("moe_intermediate_size")),
        (r"mlp\.shared_experts\.down_proj\.weight$",
         (cfg.get("moe_intermediate_size") or 0) * (cfg.get("n_shared_experts") or 1)),
        (r"mlp\.down_proj\.weight$", cfg.get("intermediate_size")),
        (r"eh_proj\.weight$", 2 * h),
    ]
    for pat, k in rules:
        if re.search(pat, name):
            return k
    return None


def dequantize(fmt, block, w, s, k):
    """Decode one quantized matrix: w (int8 [N, K] or uint8 [N, ceil(K/2)]), s (bf16 bits as uint16
    [N, ceil(K/B)]) -> f32 [N, K]."""
    n = w.shape[0]
    nb = -(-k // block)
    assert s.dtype == np.uint16 and s.shape == (n, nb), (s.dtype, s.shape, (n, nb))
    s = (s.astype(np.uint32) << 16).view(np.float32)  # bf16 -> f32 is exact
    if fmt == "q8":
        assert w.dtype == np.int8 and w.shape == (n, k), (w.dtype, w.shape, k)
        q = w.astype(np.float32)
    else:
        assert w.dtype == np.uint8 and w.shape == (n, -(-k // 2)), (w.dtype, w.shape, k)
        nib = np.empty((n, 2 * w.shape[1]), dtype=np.uint8)
        nib[:, 0::2] = w & 0x0F
        nib[:, 1::2] = w >> 4
        if k % 2:
            pad = nib[:, k]
            assert (pad == 8).all(), "q4: the padding nibble of an odd-length row is not 8 (value 0)"
        q = nib[:, :k].astype(np.float32) - np.float32(8.0)
    scale = np.repeat(s, block, axis=1)[:, :k]
    return q * scale  # one f32 multiply per element, exact


def _to_f32(dt, arr):
    if dt == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    if dt in ("F32", "F16", "F64"):
        return arr.astype(np.float32)
    return arr  # integer tensors that are not quantized weights: as stored


def fuse_expert_tensors(sd):
    """Per-expert names -> transformers' fused mlp.experts.gate_up_proj [E, 2I, H] / down_proj [E, H, I]."""
    pat = re.compile(r"^(.*\.mlp\.experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    groups, out = {}, {}
    for name, t in sd.items():
        m = pat.match(name)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = t
        else:
            out[name] = t
    for base, g in groups.items():
        n_exp = 1 + max(e for e, _ in g)
        assert len(g) == 3 * n_exp, f"{base}: incomplete experts"
        out[base + "gate_up_proj"] = torch.stack(
            [torch.cat([g[(e, "gate_proj")], g[(e, "up_proj")]], dim=0) for e in range(n_exp)])
        out[base + "down_proj"] = torch.stack([g[(e, "down_proj")] for e in range(n_exp)])
    return out


def load_dequantized(model_dir, fuse_experts=True, in_features=in_features):
    """Every tensor of a sparsa q8 / q4 (or plain float) directory as float32 torch tensors, quantized ones
    decoded, `_scale` tensors consumed. Keys are HF state-dict names (experts fused) unless fuse_experts=False.
    `in_features(name, cfg)` gives a matrix's column count (needed for q4 rows of odd length)."""
    fmt, block, cfg = quant_config(model_dir)
    raw = {}
    for f in weight_files(model_dir):
        tensors, meta = read_safetensors(os.path.join(model_dir, f))
        if fmt is not None and meta.get("sparsa_quant") is not None:
            assert meta["sparsa_quant"] == fmt and int(meta["block_size"]) == block, (f, meta, fmt, block)
        for k, v in tensors.items():
            assert k not in raw, f"{k} stored twice"
            raw[k] = v
    out = {}
    for name, (dt, shape, arr) in raw.items():
        if name.endswith("_scale") and name[: -len("_scale")] in raw and fmt is not None:
            continue  # consumed with its weight
        sname = name + "_scale"
        if fmt is not None and sname in raw:
            sdt, _, s = raw[sname]
            want = {"q8": "I8", "q4": "U8"}[fmt]
            assert dt == want and sdt == "BF16", f"{name}: {dt} with {sdt} scales in a {fmt} directory"
            k = in_features(name, cfg) if callable(in_features) else in_features.get(name)
            if k is None:
                k = shape[1] if fmt == "q8" else None
            if k is None:
                raise ValueError(f"{name}: cannot tell the column count of a q4 matrix (pass in_features)")
            val = dequantize(fmt, block, arr, s, k)
        else:
            assert dt not in ("I8", "U8") or fmt is None, f"{name}: {dt} without {sname}"
            val = _to_f32(dt, arr)
        out[name] = torch.from_numpy(np.ascontiguousarray(val)).clone()
    return fuse_expert_tensors(out) if fuse_experts else out
