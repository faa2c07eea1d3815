"""Shared pieces of the sparsa demo-model recipe: the model config, data windows, the differentiable lightning
indexer (same math as transformers' GlmMoeDsaIndexer, HF_NOTES §5) and the taps that read what transformers'
own GlmMoeDsaForCausalLM computes (indexer inputs, top-k selections, attention probabilities, router choices).

Pinned: torch==2.15.0 (CPU tests) / the H200 image's torch 2.11.0+cu130, transformers==5.24.0 (carried as a wheel
to the GPU machine), numpy==2.4.6, safetensors==0.8.0.
"""
import os

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "work")
GMASK, SOP, EOT = 2, 4, 0  # token ids (see tokenizer.py)
USER, OBSERVATION = 7, 9

# 8 layers; IndexShare like GLM-5.2 with freq 3 / offset 2: full iff max(i - 1, 0) % 3 == 0  ->  F F S S F S S F
INDEXER_TYPES = ["full", "full", "shared", "shared", "full", "shared", "shared", "full"]

FULL_CONFIG = dict(
    vocab_size=6144, hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
    num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
    q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
    first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
    index_n_heads=16, index_head_dim=32, index_topk=64, indexer_types=INDEXER_TYPES,
    rms_norm_eps=1e-5, max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 1.0e4},
    attention_bias=False, tie_word_embeddings=False, hidden_act="silu", initializer_range=0.02,
    bos_token_id=None, eos_token_id=[EOT, USER, OBSERVATION], pad_token_id=EOT, use_cache=True,
)
# CPU smoke test: same structure, tiny widths
TINY_CONFIG = dict(FULL_CONFIG, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_attention_heads=2,
                   num_key_value_heads=2, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, v_head_dim=16,
                   index_n_heads=16, index_head_dim=24, num_hidden_layers=4, indexer_types=INDEXER_TYPES[:3] + ["full"],
                   index_topk=16)


def make_config(tiny=False, **over):
    from transformers import GlmMoeDsaConfig
    kw = dict(TINY_CONFIG if tiny else FULL_CONFIG)
    kw.update(over)
    cfg = GlmMoeDsaConfig(**kw)
    cfg._attn_implementation = "eager"          # the index mask is applied to the eager/sdpa masks; eager gives probs
    cfg._experts_implementation = "eager"       # per-expert loop (as the goldens); grouped_mm needs bf16 weights
    return cfg


def set_topk(model, k):
    model.config.index_topk = k
    for layer in model.model.layers:
        ind = layer.self_attn.indexer
        if ind is not None:
            ind.index_topk = k


def full_layers(model):
    return [i for i, l in enumerate(model.model.layers) if l.self_attn.indexer is not None]


def served_layers(model):
    """full layer -> the layers that use its selection (itself + following shared layers)."""
    out, cur = {}, None
    for i, l in enumerate(model.model.layers):
        if l.self_attn.indexer is not None:
            cur = i
            out[i] = [i]
        else:
            out[cur].append(i)
    return out


# ---------------------------------------------------------------- data
class Stream:
    def __init__(self, tokens_dir=None, val_tokens=40960):
        d = tokens_dir or os.path.join(WORK, "tokens")
        train = np.load(os.path.join(d, "train.npy")).astype(np.int64)
        chat = np.load(os.path.join(d, "chat.npy")).astype(np.int64)
        self.heldout = torch.from_numpy(np.load(os.path.join(d, "heldout.npy")).astype(np.int64))
        self.val = torch.from_numpy(train[-val_tokens:])   # early-stopping slice (end of the last train work)
        self.train = torch.from_numpy(np.concatenate([train[:-val_tokens], chat]))

    def batch(self, gen, B, T):
        """B random windows of T tokens: [gMASK] <sop> b0 .. b_{T-3}; labels -100, b0 .. b_{T-2} (next token)."""
        n = T - 2
        off = torch.randint(0, self.train.numel() - n - 2, (B,), generator=gen)
        body = torch.stack([self.train[o:o + n + 1] for o in off.tolist()])
        x = torch.cat([torch.tensor([GMASK, SOP]).expand(B, 2), body[:, :n]], 1)
        y = torch.cat([torch.full((B, 1), -100), body], 1)
        return x, y

    @staticmethod
    def windows(tokens, T, max_windows=None):
        """Non-overlapping evaluation windows over a token stream, same framing as training: every stream token
        is predicted exactly once (the first one of a window from <sop>, i.e. with no left context)."""
        n = T - 2
        xs, ys = [], []
        for o in range(0, tokens.numel() - n - 1, n + 1):
            body = tokens[o:o + n + 1]
            xs.append(torch.cat([torch.tensor([GMASK, SOP]), body[:n]]))
            ys.append(torch.cat([torch.tensor([-100]), body]))
            if max_windows and len(xs) >= max_windows:
                break
        return torch.stack(xs), torch.stack(ys)


# ---------------------------------------------------------------- taps
class Taps:
    """Forward hooks on transformers' modules. Records, per forward: indexer inputs and HF's top-k per full layer,
    attention probabilities per layer (eager returns them), router choices per MoE layer."""

    def __init__(self, model, attn=True, indexer=True, router=True):
        self.model, self.handles = model, []
        self.want_attn = attn
        self.clear()
        for i, layer in enumerate(model.model.layers):
            sa = layer.self_attn
            if attn:
                self.handles.append(sa.register_forward_hook(self._attn_hook(i)))
            if indexer and sa.indexer is not None:
                self.handles.append(sa.indexer.register_forward_pre_hook(self._ind_in(i)))
                self.handles.append(sa.indexer.register_forward_hook(self._ind_out(i)))
            if router and hasattr(layer.mlp, "gate"):
                self.handles.append(layer.mlp.gate.register_forward_hook(self._router(i)))

    def clear(self):
        self.attn, self.ind_in, self.topk, self.route = {}, {}, {}, {}

    def _attn_hook(self, i):
        def f(mod, args, out):
            if self.want_attn:
                self.attn[i] = out[1]
        return f

    def _ind_in(self, i):
        def f(mod, args):
            hidden, q_resid, pos_emb, mask = args[:4]
            self.ind_in[i] = (hidden, q_resid, pos_emb, mask)
        return f

    def _ind_out(self, i):
        def f(mod, args, out):
            self.topk[i] = out
        return f

    def _router(self, i):
        def f(mod, args, out):
            self.route[i] = out[2]
        return f

    def remove(self):
        for h in self.handles:
            h.remove()


# ---------------------------------------------------------------- differentiable indexer
def indexer_scores(ind, hidden, q_resid, pos_emb, mask):
    """Same computation as GlmMoeDsaIndexer.forward (transformers 5.24.0, HF_NOTES §5) up to the top-k, with
    gradients: I[b,t,s] = sum_h w[b,t,h] * relu(q[b,t,h].k[b,s] / sqrt(D)) + mask[b,t,s], in fp32."""
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave
    B, S, _ = hidden.shape
    cos, sin = pos_emb
    q = ind.wq_b(q_resid).view(B, S, ind.n_heads, ind.head_dim)
    q_rot, q_pass = torch.split(q, [ind.qk_rope_head_dim, ind.head_dim - ind.qk_rope_head_dim], dim=-1)
    k = ind.k_norm(ind.wk(hidden)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [ind.qk_rope_head_dim, ind.head_dim - ind.qk_rope_head_dim], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ind.softmax_scale)
    w = ind.weights_proj(hidden.to(ind.weights_proj.weight.dtype)).float() * (ind.n_heads ** -0.5)
    I = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)  # [B, S, T]
    if mask.dtype == torch.bool:
        return I.masked_fill(~mask, float("-inf"))
    return I + mask.float()


def head_summed(attn):
    """[B, H, S, T] attention probs -> sum over heads, L1-normalised over keys, fp32 [B, S, T]."""
    p = attn.float().sum(1)
    return p / p.sum(-1, keepdim=True).clamp_min(1e-30)


def kl_rows(p, logits, keep=None):
    """mean over rows of KL(p || softmax(logits)) where logits are restricted to `keep` (bool [B,S,T]) if given.
    p must be zero outside keep / the causal mask."""
    if keep is not None:
        logits = logits.masked_fill(~keep, torch.finfo(torch.float32).min)
    logq = torch.log_softmax(logits, dim=-1)
    pos = p > 0
    term = torch.where(pos, p * (torch.log(p.clamp_min(1e-30)) - logq), torch.zeros_like(p))
    return term.sum(-1).mean()


def selection_mask(topk, T, causal_mask):
    """bool [B,S,T]: key s selected for query t and s <= t."""
    B, S, _ = topk.shape
    sel = torch.zeros(B, S, T, dtype=torch.bool, device=topk.device).scatter(-1, topk.long(), True)
    causal = causal_mask == 0 if causal_mask.dtype != torch.bool else causal_mask
    return sel & causal


def indexer_params(model):
    return [p for n, p in model.named_parameters() if ".indexer." in n]


def main_params(model):
    return [p for n, p in model.named_parameters() if ".indexer." not in n]
