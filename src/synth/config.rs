//! The releases' `config.json` files ([`Like`], [`release_config`]), cut to fewer layers and
//! experts.

use crate::error::{Error, Result};
use serde_json::{json, Value};

/// The release whose shapes and config a synthetic model copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Like {
    Glm5,
    Glm52,
    DeepseekV32,
}

impl Like {
    pub const ALL: [Like; 3] = [Like::Glm5, Like::Glm52, Like::DeepseekV32];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Like::Glm5 => "glm-5",
            Like::Glm52 => "glm-5.2",
            Like::DeepseekV32 => "deepseek-v3.2",
        }
    }

    pub fn parse(s: &str) -> Result<Like> {
        Like::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                Error::msg(format!(
                    "--like {s}: unknown release (expected glm-5, glm-5.2 or deepseek-v3.2)"
                ))
            })
    }

    /// The release's routed experts.
    pub fn experts(self) -> usize {
        256
    }
}

/// A release's `config.json` for a synthetic model, and what was changed to make it valid.
pub struct ReleaseConfig {
    pub json: Value,
    /// Adjustments made for `--experts` (to print).
    pub notes: Vec<String>,
}

/// Router groups for `e` routed experts: DeepSeek-V3.2 has 8 groups, keeps 4, 8 experts per
/// token. Returns (n_group, topk_group, experts per token).
fn router_groups(n_group: usize, topk_group: usize, per_tok: usize, e: usize) -> [usize; 3] {
    let k = per_tok.min(e);
    // The largest group count ≤ the release's that divides e and leaves at least 2 experts
    // per group (a group's score is the sum of its top-2 experts' scores).
    let g = (1..=n_group.min(e / 2))
        .rev()
        .find(|g| e.is_multiple_of(*g))
        .unwrap_or(1);
    // Keep the release's fraction of groups, but enough groups to hold k experts.
    let t = (topk_group * g)
        .div_ceil(n_group)
        .max(k.div_ceil(e / g))
        .clamp(1, g);
    [g, t, k]
}

/// The keys of `a` then those of `b`.
fn merge(mut a: Value, b: Value) -> Value {
    if let (Some(m), Value::Object(b)) = (a.as_object_mut(), b) {
        m.extend(b);
    }
    a
}

/// `config.json` of `like` cut to `layers` layers (layer 0 dense when `layers` > 1, the rest
/// MoE; the MTP layer after them with `mtp`) with `experts` routed experts (default: the
/// release's 256).
pub fn release_config(
    like: Like,
    layers: usize,
    experts: Option<usize>,
    mtp: bool,
) -> Result<ReleaseConfig> {
    if layers == 0 {
        return Err(Error::msg("--layers: expected at least 1 layer"));
    }
    if layers > 1000 {
        return Err(Error::msg(format!("--layers {layers}: at most 1000")));
    }
    let e = experts.unwrap_or(like.experts());
    if e == 0 || e > 1024 {
        return Err(Error::msg(format!(
            "--experts {e}: expected 1 ..= 1024 routed experts"
        )));
    }
    let mut notes = Vec::new();
    let (n_group, topk_group) = match like {
        Like::DeepseekV32 => (8, 4),
        _ => (1, 1),
    };
    let [g, t, k] = router_groups(n_group, topk_group, 8, e);
    if k != 8 {
        notes.push(format!(
            "num_experts_per_tok 8 -> {k} (only {e} routed experts)"
        ));
    }
    if (g, t) != (n_group, topk_group) {
        notes.push(format!(
            "n_group / topk_group {n_group} / {topk_group} -> {g} / {t} (for {e} routed experts, {k} per token)"
        ));
    }
    let dense = usize::from(layers > 1);
    let mlp_layer_types: Vec<&str> = (0..layers)
        .map(|i| if i < dense { "dense" } else { "sparse" })
        .collect();
    let mut c = match like {
        Like::Glm5 | Like::Glm52 => merge(
            json!({
                "architectures": ["GlmMoeDsaForCausalLM"],
                "model_type": "glm_moe_dsa",
                "attention_bias": false,
                "attention_dropout": 0.0,
                "dtype": "bfloat16",
                "eos_token_id": [154820, 154827, 154829],
                "pad_token_id": 154820,
                "ep_size": 1,
                "first_k_dense_replace": dense,
                "head_dim": 64,
                "hidden_act": "silu",
                "hidden_size": 6144,
                "index_head_dim": 128,
                "index_n_heads": 32,
                "index_topk": 2048,
                "indexer_rope_interleave": true,
                "initializer_range": 0.02,
                "intermediate_size": 12288,
                "kv_lora_rank": 512,
                "max_position_embeddings": if like == Like::Glm52 { 1048576 } else { 202752 },
            }),
            json!({
                "mlp_layer_types": mlp_layer_types,
                "moe_intermediate_size": 2048,
                "moe_layer_freq": 1,
                "n_group": g,
                "n_routed_experts": e,
                "n_shared_experts": 1,
                "norm_topk_prob": true,
                "num_attention_heads": 64,
                "num_experts_per_tok": k,
                "num_hidden_layers": layers,
                "num_key_value_heads": 64,
                "num_nextn_predict_layers": usize::from(mtp),
                "q_lora_rank": 2048,
                "qk_head_dim": 256,
                "qk_nope_head_dim": 192,
                "qk_rope_head_dim": 64,
                "rms_norm_eps": 1e-5,
                "rope_interleave": true,
                "rope_parameters": {
                    "rope_theta": if like == Like::Glm52 { 8_000_000.0 } else { 1_000_000.0 },
                    "rope_type": "default"
                },
                "routed_scaling_factor": 2.5,
                "scoring_func": "sigmoid",
                "tie_word_embeddings": false,
                "topk_group": t,
                "topk_method": "noaux_tc",
                "use_cache": true,
                "v_head_dim": 256,
                "vocab_size": 154880
            }),
        ),
        Like::DeepseekV32 => merge(
            json!({
                "architectures": ["DeepseekV32ForCausalLM"],
                "model_type": "deepseek_v32",
                "attention_bias": false,
                "attention_dropout": 0.0,
                "bos_token_id": 0,
                "eos_token_id": 1,
                "ep_size": 1,
                "first_k_dense_replace": dense,
                "hidden_act": "silu",
                "hidden_size": 7168,
                "index_head_dim": 128,
                "index_n_heads": 64,
                "index_topk": 2048,
                "initializer_range": 0.02,
                "intermediate_size": 18432,
                "kv_lora_rank": 512,
                "max_position_embeddings": 163840,
            }),
            json!({
                "mlp_layer_types": mlp_layer_types,
                "moe_intermediate_size": 2048,
                "moe_layer_freq": 1,
                "n_group": g,
                "n_routed_experts": e,
                "n_shared_experts": 1,
                "norm_topk_prob": true,
                "num_attention_heads": 128,
                "num_experts_per_tok": k,
                "num_hidden_layers": layers,
                "num_key_value_heads": 128,
                "num_nextn_predict_layers": usize::from(mtp),
                "q_lora_rank": 1536,
                "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64,
                "rms_norm_eps": 1e-6,
                "rope_scaling": {
                    "beta_fast": 32,
                    "beta_slow": 1,
                    "factor": 40,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                    "original_max_position_embeddings": 4096,
                    "type": "yarn"
                },
                "rope_theta": 10000,
                "routed_scaling_factor": 2.5,
                "scoring_func": "sigmoid",
                "tie_word_embeddings": false,
                "topk_group": t,
                "topk_method": "noaux_tc",
                "torch_dtype": "bfloat16",
                "use_cache": true,
                "v_head_dim": 128,
                "vocab_size": 129280
            }),
        ),
    };
    if like == Like::Glm52 {
        // IndexShare: full iff max(i − offset + 1, 0) % freq == 0 (layers 0, 1, 2, 6, 10, …).
        let (freq, offset) = (4i64, 3i64);
        let types: Vec<&str> = (0..layers as i64)
            .map(|i| {
                if (i - offset + 1).max(0) % freq == 0 {
                    "full"
                } else {
                    "shared"
                }
            })
            .collect();
        if let Some(m) = c.as_object_mut() {
            m.insert("index_topk_freq".into(), freq.into());
            m.insert("index_skip_topk_offset".into(), offset.into());
            m.insert("indexer_types".into(), json!(types));
        }
    }
    if let Some(m) = c.as_object_mut() {
        m.insert(
            "sparsa_synth".into(),
            json!({"like": like.name(), "note": "random weights written by `sparsa synth`"}),
        );
    }
    Ok(ReleaseConfig { json: c, notes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_groups_stay_valid() {
        assert_eq!(router_groups(8, 4, 8, 256), [8, 4, 8]);
        assert_eq!(router_groups(8, 4, 8, 16), [8, 4, 8]);
        assert_eq!(router_groups(8, 4, 8, 8), [4, 4, 8]);
        assert_eq!(router_groups(8, 4, 8, 12), [6, 4, 8]);
        assert_eq!(router_groups(8, 4, 8, 3), [1, 1, 3]);
        assert_eq!(router_groups(1, 1, 8, 4), [1, 1, 4]);
        for e in 1..=300 {
            let [g, t, k] = router_groups(8, 4, 8, e);
            assert!(e % g == 0 && t <= g && k <= t * (e / g), "{e}: {g} {t} {k}");
            assert!(g == 1 || e / g >= 2, "{e}: {g} groups");
        }
    }
}
