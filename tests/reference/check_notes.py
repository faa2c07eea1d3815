#!/usr/bin/env python3
"""Independent re-implementation of HF_NOTES.md (no transformers modules), run against the goldens.

It reads tests/data/<family>/ like an engine would (config.json + raw safetensors, per-expert names,
skipping the MTP layer), computes the forward in float64 from the stored weights exactly as HF_NOTES.md
describes, and compares with reference.safetensors: prefill logits (sparse and dense), the per-layer
prefill indexer selections, and 24 greedy tokens decoded one at a time with MLA + indexer-key caches.
FP8 directories (make_fp8_goldens.py) are dequantized with the e4m3 rule and the 128x128 block scales.
Needs only torch + safetensors (same pins as make_goldens.py).  Run: python3 tests/reference/check_notes.py
(all families; or name them: python3 tests/reference/check_notes.py glm52-fp8 dsv32-fp8)
"""
import glob
import json
import math
import os
import sys

import torch
from safetensors import safe_open

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
DT = torch.float64


def e4m3_table():
    """float8_e4m3fn byte -> value, from the format's definition (not from torch's cast)."""
    t = torch.empty(256, dtype=DT)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 15, b & 7
        t[b] = math.nan if (e, m) == (15, 7) else sign * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return t


def load(fam):
    """Weights in f64. FP8 tensors (F8_E4M3 + F32 `<name>_scale_inv`, 128x128 blocks, partial edge blocks)
    are dequantized: W[i, j] = e4m3(W8[i, j]) * S[i // 128, j // 128], rounded to f32 (one f32 multiply)."""
    d = os.path.join(DATA, fam)
    cfg = json.load(open(os.path.join(d, "config.json")))
    L = cfg["num_hidden_layers"]
    raw = {}
    for f in sorted(glob.glob(os.path.join(d, "model*.safetensors"))):
        with safe_open(f, "pt") as s:
            for k in s.keys():
                parts = k.split(".")
                if len(parts) > 2 and parts[1] == "layers" and int(parts[2]) >= L:
                    continue  # MTP layer
                raw[k] = s.get_tensor(k)
    w, table = {}, None
    for k, t in raw.items():
        if k.endswith("_scale_inv"):
            assert raw[k[: -len("_scale_inv")]].dtype == torch.float8_e4m3fn, k
            continue
        if t.dtype == torch.float8_e4m3fn:
            table = e4m3_table() if table is None else table
            S = raw[k + "_scale_inv"].to(DT)
            R, C = t.shape
            assert S.shape == ((R + 127) // 128, (C + 127) // 128), (k, t.shape, S.shape)
            rows, cols = torch.arange(R) // 128, torch.arange(C) // 128
            v = table[t.view(torch.uint8).long()] * S[rows[:, None], cols[None, :]]
            w[k] = v.to(torch.float32).to(DT)
        else:
            w[k] = t.to(DT)
    return cfg, w


def rope_tables(cfg, pos, no_att=False):
    d = cfg["qk_rope_head_dim"]
    rp = cfg["rope_parameters"]
    theta = rp["rope_theta"]
    # f32 like HF (G:101 / R:471), then used in f64
    pos_freqs = theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    att = 1.0
    if rp.get("rope_type", "default") == "default":
        inv = 1.0 / pos_freqs
    else:
        assert rp["rope_type"] == "yarn"
        factor, orig = rp["factor"], rp["original_max_position_embeddings"]
        bf, bs = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

        def corr(b):
            return d * math.log(orig / (b * 2 * math.pi)) / (2 * math.log(theta))

        low, high = corr(bf), corr(bs)
        if rp.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        ef = 1 - ramp
        inv = (1.0 / (factor * pos_freqs)) * (1 - ef) + (1.0 / pos_freqs) * ef

        def gm(s, m=1.0):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

        if rp.get("attention_factor") is not None:
            att = rp["attention_factor"]
        elif rp.get("mscale") and rp.get("mscale_all_dim"):
            att = gm(factor, rp["mscale"]) / gm(factor, rp["mscale_all_dim"])
        else:
            att = gm(factor)
    ang = pos.to(torch.float32)[:, None] * inv[None, :]  # [T, d/2], f32 as HF
    if no_att:
        att = 1.0
    return (ang.cos().to(DT) * att, ang.sin().to(DT) * att)


def rope_interleaved(x, cos, sin):  # x [..., T, heads?, d] with cos [T, d/2] broadcast by caller
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x2 * cos + x1 * sin
    return out


def rope_half(x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rms(x, w, eps):
    return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))


def layernorm(x, w, b, eps=1e-6):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def lin(x, W):
    return x @ W.T


def swiglu(x, g, u, d):
    return lin(torch.nn.functional.silu(lin(x, g)) * lin(x, u), d)


class Engine:
    def __init__(self, fam, dense=False, mut=frozenset()):
        self.cfg, self.w = load(fam)
        c = self.cfg
        self.mut = mut
        self.fam = fam
        self.L = c["num_hidden_layers"]
        self.interleave_indexer = c.get("indexer_rope_interleave", c["model_type"] == "glm_moe_dsa")
        self.types = c.get("indexer_types") or ["full"] * self.L
        self.mlp_types = c.get("mlp_layer_types") or (
            ["dense"] * c["first_k_dense_replace"] + ["sparse"] * (self.L - c["first_k_dense_replace"]))
        self.topk = 10 ** 9 if dense else c["index_topk"]
        rp = c["rope_parameters"]
        qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        self.scale = qk ** -0.5
        if rp.get("rope_type", "default") != "default" and rp.get("mscale_all_dim") and "no_mscale" not in mut:
            ms = rp["mscale"] if "mscale_not_all_dim" in mut else rp["mscale_all_dim"]
            m = 0.1 * ms * math.log(rp["factor"]) + 1.0 if rp["factor"] > 1 else 1.0
            self.scale *= m * m
        if "idx_rope_swap" in mut:
            self.interleave_indexer = not self.interleave_indexer
        self.reset()

    def reset(self):
        self.n = 0
        self.ckv = [None] * self.L
        self.kpe = [None] * self.L
        self.kidx = [None] * self.L
        self.selections = {}

    @staticmethod
    def _cat(a, b):
        return b if a is None else torch.cat([a, b], 0)

    def forward(self, ids):
        c, w = self.cfg, self.w
        T = ids.numel()
        pos = torch.arange(self.n, self.n + T)
        cos, sin = rope_tables(c, pos, "no_attention_factor" in self.mut)
        mut = self.mut
        eps_a = c["rms_norm_eps"] if "qa_kva_eps_from_config" in mut else 1e-6
        eps = (1e-6 if c["rms_norm_eps"] != 1e-6 else 1e-5) if "rms_eps_swapped" in mut else c["rms_norm_eps"]
        mla_rope = rope_half if "mla_rope_half_split" in mut else rope_interleaved
        nk = self.n + T
        causal = torch.arange(nk)[None, :] <= pos[:, None]  # [T, nk]
        h = w["model.embed_tokens.weight"][ids]
        H, nope, rd, vd = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        kvr = c["kv_lora_rank"]
        sel = None
        for i in range(self.L):
            p = f"model.layers.{i}."
            a = rms(h, w[p + "input_layernorm.weight"], eps)
            qr = rms(lin(a, w[p + "self_attn.q_a_proj.weight"]), w[p + "self_attn.q_a_layernorm.weight"], eps_a)
            q = lin(qr, w[p + "self_attn.q_b_proj.weight"]).view(T, H, nope + rd)
            q_nope, q_pe = q[..., :nope], q[..., nope:]
            q_pe = mla_rope(q_pe, cos[:, None, :], sin[:, None, :])
            kv = lin(a, w[p + "self_attn.kv_a_proj_with_mqa.weight"])
            ckv = rms(kv[:, :kvr], w[p + "self_attn.kv_a_layernorm.weight"], eps_a)
            kpe = mla_rope(kv[:, kvr:], cos, sin)
            self.ckv[i] = self._cat(self.ckv[i], ckv)
            self.kpe[i] = self._cat(self.kpe[i], kpe)
            # indexer
            if self.types[i] == "full" or "shared_layers_run_own_indexer" in mut:
                if self.types[i] != "full":
                    p = f"model.layers.{self.last_full(i)}."  # borrow weights (there are none of its own)
                HI, DI = c["index_n_heads"], c["index_head_dim"]
                rope = rope_interleaved if self.interleave_indexer else rope_half
                iq = lin(qr, w[p + "self_attn.indexer.wq_b.weight"]).view(T, HI, DI)
                if "idx_rope_on_last_dims" in mut:
                    iq = torch.cat([iq[..., :DI - rd], rope(iq[..., DI - rd:], cos[:, None, :], sin[:, None, :])], -1)
                else:
                    iq = torch.cat([rope(iq[..., :rd], cos[:, None, :], sin[:, None, :]), iq[..., rd:]], -1)
                kb = w[p + "self_attn.indexer.k_norm.bias"] * (0 if "k_norm_no_bias" in mut else 1)
                ik = layernorm(lin(a, w[p + "self_attn.indexer.wk.weight"]), w[p + "self_attn.indexer.k_norm.weight"], kb)
                if "idx_rope_on_last_dims" in mut:
                    ik = torch.cat([ik[:, :DI - rd], rope(ik[:, DI - rd:], cos, sin)], -1)
                else:
                    ik = torch.cat([rope(ik[:, :rd], cos, sin), ik[:, rd:]], -1)
                self.kidx[i] = self._cat(self.kidx[i], ik)
                s = torch.einsum("thd,sd->ths", iq, self.kidx[i]) * DI ** -0.5
                s = s if "indexer_no_relu" in mut else torch.relu(s)
                wt = lin(a, w[p + "self_attn.indexer.weights_proj.weight"]) * HI ** -0.5
                I = torch.einsum("th,ths->ts", wt, s)
                if "topk_before_causal_mask" not in mut:
                    I = I.masked_fill(~causal, float("-inf"))
                k = min(self.topk, nk)
                idx = I.topk(k, dim=-1).indices
                sel = torch.zeros(T, nk, dtype=torch.bool).scatter(1, idx, True) & causal
                self.selections[i] = sel
                p = f"model.layers.{i}."
            # MLA (non-absorbed)
            kvb = lin(self.ckv[i], w[p + "self_attn.kv_b_proj.weight"]).view(nk, H, nope + vd)
            k_nope, v = kvb[..., :nope], kvb[..., nope:]
            sc = (torch.einsum("thd,shd->hts", q_nope, k_nope) + torch.einsum("thd,sd->hts", q_pe, self.kpe[i]))
            sc = (sc * self.scale).masked_fill(~sel[None], float("-inf"))
            o = torch.einsum("hts,shd->thd", sc.softmax(-1), v).reshape(T, H * vd)
            h = h + lin(o, w[p + "self_attn.o_proj.weight"])
            x = rms(h, w[p + "post_attention_layernorm.weight"], eps)
            if self.mlp_types[i] == "dense":
                h = h + swiglu(x, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"])
            else:
                h = h + self.moe(x, p)
        self.n = nk
        return lin(rms(h, w["model.norm.weight"], eps), w["lm_head.weight"])

    def last_full(self, i):
        return max(j for j in range(i) if self.types[j] == "full")

    def moe(self, x, p):
        c, w = self.cfg, self.w
        E, k, ng, tg = c["n_routed_experts"], c["num_experts_per_tok"], c["n_group"], c["topk_group"]
        s = torch.sigmoid(lin(x, w[p + "mlp.gate.weight"]))
        b = s + w[p + "mlp.gate.e_score_correction_bias"]
        gs = b.view(-1, ng, E // ng).topk(2, dim=-1).values.sum(-1)
        if "group_score_max" in self.mut:
            gs = b.view(-1, ng, E // ng).max(-1).values
        keep = torch.zeros_like(gs, dtype=torch.bool).scatter(1, gs.topk(tg, dim=-1).indices, True)
        b = b.masked_fill(~keep.repeat_interleave(E // ng, dim=1), 0.0 if "group_mask_zero" in self.mut else float("-inf"))
        idx = b.topk(k, dim=-1).indices
        wt = (b if "router_weights_biased" in self.mut else s).gather(1, idx)
        if c["norm_topk_prob"] and "no_norm_topk" not in self.mut:
            wt = wt / (wt.sum(-1, keepdim=True) + 1e-20)
        wt = wt * c["routed_scaling_factor"]
        out = swiglu(x, w[p + "mlp.shared_experts.gate_proj.weight"], w[p + "mlp.shared_experts.up_proj.weight"],
                     w[p + "mlp.shared_experts.down_proj.weight"])
        for t in range(x.shape[0]):
            for j in range(k):
                e = f"{p}mlp.experts.{int(idx[t, j])}."
                out[t] += wt[t, j] * swiglu(x[t], w[e + "gate_proj.weight"], w[e + "up_proj.weight"],
                                            w[e + "down_proj.weight"])
        return out


MUTATIONS = ["qa_kva_eps_from_config", "rms_eps_swapped", "mla_rope_half_split", "idx_rope_swap",
             "idx_rope_on_last_dims", "no_attention_factor", "no_mscale", "mscale_not_all_dim", "k_norm_no_bias",
             "indexer_no_relu", "topk_before_causal_mask", "shared_layers_run_own_indexer", "group_score_max",
             "group_mask_zero", "router_weights_biased", "no_norm_topk"]


def mutation_report(fams):
    """How far each deliberate mistake moves the prefill logits (sparse and dense) from the goldens."""
    print(f"{'mutation':32s}" + "".join(f"{f:>22s}" for f in fams))
    refs = {}
    for fam in fams:
        with safe_open(os.path.join(DATA, fam, "reference.safetensors"), "pt") as s:
            refs[fam] = {k: s.get_tensor(k) for k in s.keys()}
    for m in MUTATIONS:
        row = f"{m:32s}"
        for fam in fams:
            ref = refs[fam]
            eng, dense = Engine(fam, mut=frozenset([m])), Engine(fam, dense=True, mut=frozenset([m]))
            ds = dd = 0.0
            for i in range(3):
                ids = ref[f"tokens_{i}"].long()
                eng.reset(); dense.reset()
                ds = max(ds, (eng.forward(ids) - ref[f"logits_{i}"].to(DT)).abs().nan_to_num(math.inf).max().item())
                dd = max(dd, (dense.forward(ids) - ref[f"logits_dense_{i}"].to(DT)).abs().nan_to_num(math.inf).max().item())
            row += f"   {ds:8.1e} / {dd:8.1e}"
        print(row, flush=True)


def main():
    if sys.argv[1:2] == ["--mutations"]:
        mutation_report(sys.argv[2:] or ["glm5", "glm52", "dsv32"])
        return
    ok = True
    for fam in sys.argv[1:] or ["glm5", "glm52", "dsv32", "glm52-fp8", "dsv32-fp8"]:
        ref = {}
        with safe_open(os.path.join(DATA, fam, "reference.safetensors"), "pt") as s:
            for k in s.keys():
                ref[k] = s.get_tensor(k)
        eng, dense = Engine(fam), Engine(fam, dense=True)
        n_prompts = sum(1 for k in ref if k.startswith("tokens_"))
        for i in range(n_prompts):
            ids = ref[f"tokens_{i}"].long()
            eng.reset()
            lg = eng.forward(ids)
            d_sparse = (lg - ref[f"logits_{i}"].to(DT)).abs().max().item()
            sel_ok = True
            for li, sel in eng.selections.items():
                r = ref[f"topk_{i}_l{li}"]
                for t in range(ids.numel()):
                    want = set(x for x in r[t].tolist() if x >= 0)
                    if set(torch.nonzero(sel[t]).squeeze(-1).tolist()) != want:
                        sel_ok = False
            dense.reset()
            d_dense = (dense.forward(ids) - ref[f"logits_dense_{i}"].to(DT)).abs().max().item()
            toks = [int(lg[-1].argmax())]
            for _ in range(23):
                toks.append(int(eng.forward(torch.tensor([toks[-1]]))[-1].argmax()))
            g_ok = toks == ref[f"greedy_{i}"].tolist()
            good = d_sparse < 2e-3 and d_dense < 2e-3 and sel_ok and g_ok
            ok &= good
            print(f"{fam} prompt {i} (T={ids.numel()}): max|dlogit| sparse {d_sparse:.2e} dense {d_dense:.2e} "
                  f"topk sets {'ok' if sel_ok else 'DIFFER'} greedy {'ok' if g_ok else 'DIFFER'}")
    print("ALL OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
