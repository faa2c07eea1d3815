//! `sparsa synth`: random-weight model directories with the real shapes, tensor names and
//! `config.json` of a release (GLM-5, GLM-5.2, DeepSeek-V3.2), for benchmarks and tests of
//! the loading path at real sizes without downloading hundreds of GB.
//!
//! - [`release_config`] writes the release's `config.json` for the first `layers` layers
//!   (the first one dense when there is more than one, the rest MoE; no MTP layer), with
//!   `n_routed_experts` optionally reduced (router groups adjusted to stay valid).
//! - [`synth_dir`] writes a model directory for any such config: the Hugging Face tensor
//!   names, in bf16, the FP8 release layout (`F8_E4M3` + f32 `_scale_inv` per 128×128 block
//!   on the tensors the releases quantize), or sparsa's q8 / q4 (exactly as `sparsa quantize`
//!   writes them, with its default keep list), sharded with `model.safetensors.index.json`.
//!
//! Values are uniform with std `1/sqrt(fan_in)` for matrices (std 1 for the embedding
//! table), norms 1, small biases, drawn from a counter-based generator seeded by
//! (seed, tensor name, row): the same seed gives byte-identical files whatever the thread
//! count, and a row's values are the same in every format. Generation streams: worker
//! threads produce row blocks that the writer puts on disk in order, with a bounded number
//! of blocks in flight, so host memory stays small whatever the model size.
//!
//! The tokenizer is the built-in model's (`models/sparsa-bard-12m`, 6144 tokens): the real
//! tokenizers are not redistributable here. Ids below 6144 decode to its text; the model's
//! vocabulary (and `config.json`'s `vocab_size`) stays the release's.

use crate::config::{Config, IndexerKind};
use crate::error::{Error, Result};
use crate::quantize::{check_out_empty, default_keep, write_sharded, TensorHeader, WriteErr};
use crate::weights::quant::{quantize_rows, E4M3_MAX, FP8_BLOCK};
use crate::weights::QFormat;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

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
/// MoE; no MTP layer) with `experts` routed experts (default: the release's 256).
pub fn release_config(like: Like, layers: usize, experts: Option<usize>) -> Result<ReleaseConfig> {
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
                "num_nextn_predict_layers": 0,
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
                "num_nextn_predict_layers": 0,
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

/// What to write.
#[derive(Debug, Clone)]
pub struct Options {
    /// None: bf16 (the e_score_correction_bias f32, as released). Some(Fp8): the FP8
    /// release layout. Some(Q8 / Q4): sparsa's formats.
    pub format: Option<QFormat>,
    pub seed: u64,
    /// Target bytes per shard.
    pub shard_bytes: u64,
    /// Worker threads generating row blocks (at least 1).
    pub threads: usize,
}

/// The default seed.
pub const DEFAULT_SEED: u64 = 0x5EED_5A85A;

/// What [`synth_dir`] wrote (or, from [`plan`], would write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub tensors: usize,
    pub params: u64,
    pub bytes: u64,
    pub shards: usize,
}

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy)]
enum Init {
    /// Uniform in (−a, a).
    Uniform(f32),
    Const(f32),
}

/// How its bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Store {
    Bf16,
    F32,
    Fp8,
    Fp8ScaleInv,
    Quant,
    QuantScale,
}

struct Tensor {
    header: TensorHeader,
    /// The values' source: the weight's name (scale tensors share their weight's values).
    seed_name: String,
    rows: usize,
    cols: usize,
    init: Init,
    store: Store,
}

/// FP8 scales as powers of two (DeepSeek's `scale_fmt: ue8m0`) rather than amax / 448.
fn ue8m0(cfg: &Config) -> bool {
    cfg.family == crate::config::Family::DeepseekV32
}

/// Whether the FP8 releases quantize this tensor (see tests/reference/make_fp8_goldens.py).
fn fp8_quantized(name: &str) -> bool {
    let Some(rest) = name
        .strip_prefix("model.layers.")
        .and_then(|r| r.split_once('.'))
        .map(|(_, r)| r)
    else {
        return false;
    };
    let attn = [
        "self_attn.q_a_proj.weight",
        "self_attn.q_b_proj.weight",
        "self_attn.kv_a_proj_with_mqa.weight",
        "self_attn.kv_b_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.indexer.wq_b.weight",
        "self_attn.indexer.wk.weight",
    ];
    attn.contains(&rest)
        || (rest.starts_with("mlp.")
            && ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
                .iter()
                .any(|s| rest.ends_with(&format!(".{s}"))))
}

/// The logical tensors of a model (name, shape, init), in file order.
fn logical_tensors(cfg: &Config) -> Vec<(String, Vec<usize>, Init)> {
    let u = |fan_in: usize| Init::Uniform((3.0 / fan_in as f32).sqrt());
    let ones = Init::Const(1.0);
    let small = Init::Uniform(0.01);
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let heads = cfg.num_attention_heads;
    let (dn, dr, dv) = (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim);
    let (ql, kl) = (cfg.q_lora_rank, cfg.kv_lora_rank);
    let mut t: Vec<(String, Vec<usize>, Init)> = vec![(
        "model.embed_tokens.weight".into(),
        vec![v, h],
        Init::Uniform(3f32.sqrt()),
    )];
    let swiglu = |t: &mut Vec<(String, Vec<usize>, Init)>, p: &str, inter: usize| {
        t.push((format!("{p}.gate_proj.weight"), vec![inter, h], u(h)));
        t.push((format!("{p}.up_proj.weight"), vec![inter, h], u(h)));
        t.push((format!("{p}.down_proj.weight"), vec![h, inter], u(inter)));
    };
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        t.push((format!("{p}.input_layernorm.weight"), vec![h], ones));
        t.push((format!("{a}.q_a_proj.weight"), vec![ql, h], u(h)));
        t.push((format!("{a}.q_a_layernorm.weight"), vec![ql], ones));
        t.push((
            format!("{a}.q_b_proj.weight"),
            vec![heads * (dn + dr), ql],
            u(ql),
        ));
        t.push((
            format!("{a}.kv_a_proj_with_mqa.weight"),
            vec![kl + dr, h],
            u(h),
        ));
        t.push((format!("{a}.kv_a_layernorm.weight"), vec![kl], ones));
        t.push((
            format!("{a}.kv_b_proj.weight"),
            vec![heads * (dn + dv), kl],
            u(kl),
        ));
        t.push((
            format!("{a}.o_proj.weight"),
            vec![h, heads * dv],
            u(heads * dv),
        ));
        if cfg.indexer_types[i] == IndexerKind::Full {
            let x = format!("{a}.indexer");
            let (ih, id) = (cfg.index_n_heads, cfg.index_head_dim);
            t.push((format!("{x}.wq_b.weight"), vec![ih * id, ql], u(ql)));
            t.push((format!("{x}.wk.weight"), vec![id, h], u(h)));
            t.push((format!("{x}.k_norm.weight"), vec![id], ones));
            t.push((format!("{x}.k_norm.bias"), vec![id], small));
            t.push((format!("{x}.weights_proj.weight"), vec![ih, h], u(h)));
        }
        t.push((
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            ones,
        ));
        let m = format!("{p}.mlp");
        if cfg.is_dense_layer(i) {
            swiglu(&mut t, &m, cfg.intermediate_size);
        } else {
            let e = cfg.n_routed_experts;
            t.push((format!("{m}.gate.weight"), vec![e, h], u(h)));
            t.push((format!("{m}.gate.e_score_correction_bias"), vec![e], small));
            for x in 0..e {
                swiglu(
                    &mut t,
                    &format!("{m}.experts.{x}"),
                    cfg.moe_intermediate_size,
                );
            }
            if cfg.n_shared_experts > 0 {
                swiglu(
                    &mut t,
                    &format!("{m}.shared_experts"),
                    cfg.moe_intermediate_size * cfg.n_shared_experts,
                );
            }
        }
    }
    t.push(("model.norm.weight".into(), vec![h], ones));
    if !cfg.tie_word_embeddings {
        t.push(("lm_head.weight".into(), vec![v, h], u(h)));
    }
    t
}

/// The stored tensors of `cfg` in `format`, in file order.
fn stored_tensors(cfg: &Config, format: Option<QFormat>) -> Vec<Tensor> {
    let mut out = Vec::new();
    for (name, shape, init) in logical_tensors(cfg) {
        let (rows, cols) = match shape[..] {
            [r, c] => (r, c),
            _ => (1, shape.iter().product()),
        };
        let f32_bias = name.ends_with("e_score_correction_bias");
        let plain = |store: Store| {
            let es = if store == Store::F32 { 4 } else { 2 };
            Tensor {
                header: TensorHeader {
                    name: name.clone(),
                    dtype: if store == Store::F32 { "F32" } else { "BF16" },
                    shape: shape.clone(),
                    bytes: (rows * cols * es) as u64,
                },
                seed_name: name.clone(),
                rows,
                cols,
                init,
                store,
            }
        };
        if f32_bias {
            out.push(plain(Store::F32));
            continue;
        }
        let matrix = shape.len() == 2;
        match format {
            Some(q) if matrix && quantized(q, &name) => {
                let (weight, scale) = if q == QFormat::Fp8 {
                    (Store::Fp8, Store::Fp8ScaleInv)
                } else {
                    (Store::Quant, Store::QuantScale)
                };
                for (header, store) in TensorHeader::quantized(&name, q, rows, cols)
                    .into_iter()
                    .zip([weight, scale])
                {
                    out.push(Tensor {
                        header,
                        seed_name: name.clone(),
                        rows,
                        cols,
                        init,
                        store,
                    });
                }
            }
            _ => out.push(plain(Store::Bf16)),
        }
    }
    out
}

/// Whether a matrix is stored quantized: the tensors the FP8 releases quantize, or for
/// q8 / q4 everything `sparsa quantize` does not keep by default.
fn quantized(q: QFormat, name: &str) -> bool {
    match q {
        QFormat::Fp8 => fp8_quantized(name),
        QFormat::Q8 { .. } | QFormat::Q4 { .. } => !default_keep(name),
    }
}

fn parse_config(config: &Value) -> Result<Config> {
    Config::from_json(&config.to_string(), "synthetic config.json")
}

/// Tensors, parameters and bytes a synthetic model of `config` takes in `format` (nothing
/// is written).
pub fn plan(config: &Value, format: Option<QFormat>, shard_bytes: u64) -> Result<Report> {
    let cfg = parse_config(config)?;
    let tensors = stored_tensors(&cfg, format);
    Ok(summarize(&tensors, shard_bytes))
}

fn summarize(tensors: &[Tensor], shard_bytes: u64) -> Report {
    let headers: Vec<TensorHeader> = tensors.iter().map(|t| t.header.clone()).collect();
    Report {
        tensors: tensors.len(),
        params: tensors
            .iter()
            .filter(|t| !matches!(t.store, Store::Fp8ScaleInv | Store::QuantScale))
            .map(|t| (t.rows * t.cols) as u64)
            .sum(),
        bytes: headers.iter().map(|h| h.bytes).sum(),
        shards: crate::quantize::plan_shards(&headers, shard_bytes).len(),
    }
}

// ---------------------------------------------------------------------------------------
// Random values.

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The values of one row into `out` (`cols` of them): wyrand seeded by (seed, name, row).
fn gen_row(init: Init, key: u64, row: usize, out: &mut [f32]) {
    match init {
        Init::Const(c) => out.fill(c),
        Init::Uniform(a) => {
            let mut s = splitmix64(key ^ splitmix64(row as u64));
            let scale = 2.0 * a / (1u32 << 24) as f32;
            let mut next = || {
                s = s.wrapping_add(0xa076_1d64_78bd_642f);
                let t = (s as u128).wrapping_mul((s ^ 0xe703_7ed1_a0b4_28db) as u128);
                ((t >> 64) ^ t) as u64
            };
            let mut pairs = out.chunks_exact_mut(2);
            for p in &mut pairs {
                let r = next();
                p[0] = ((r >> 40) as f32 + 0.5) * scale - a;
                p[1] = (((r >> 8) & 0xFF_FFFF) as f32 + 0.5) * scale - a;
            }
            if let [x] = pairs.into_remainder() {
                *x = ((next() >> 40) as f32 + 0.5) * scale - a;
            }
        }
    }
}

/// Nearest e4m3fn code (round to nearest even, saturating at ±448): the same result as
/// [`crate::weights::quant::f32_to_e4m3`], computed from the float's bits.
fn e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a.is_nan() {
        return 0x7F;
    }
    if a >= E4M3_MAX {
        return sign | 0x7E;
    }
    if a < 1.0 / 64.0 {
        // Subnormals m · 2⁻⁹ (m = 8 is the smallest normal, code 0x08).
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let bits = a.to_bits();
    let r = (bits + 0x7_FFFF + ((bits >> 20) & 1)) & !0xF_FFFF;
    let e = (r >> 23) as i32 - 127 + 7;
    let code = ((e as u32) << 3) | ((r >> 20) & 7);
    sign | code.min(0x7E) as u8
}

/// The FP8 scale of a block with largest magnitude `amax`: amax / 448, or (ue8m0) the
/// smallest power of two ≥ that.
fn fp8_scale(amax: f32, ue8m0: bool) -> f32 {
    if amax <= 0.0 || !amax.is_finite() {
        return 1.0;
    }
    let s = amax / E4M3_MAX;
    if !ue8m0 {
        return s;
    }
    let bits = s.to_bits();
    if bits & 0x7F_FFFF == 0 {
        s
    } else {
        f32::from_bits(((bits >> 23) + 1) << 23)
    }
}

/// Rows per generated block of a tensor: a 128-row FP8 block, else about 256K values.
fn block_rows(t: &Tensor) -> usize {
    match t.store {
        Store::Fp8 | Store::Fp8ScaleInv => FP8_BLOCK,
        _ => ((1usize << 18) / t.cols.max(1)).clamp(1, 128),
    }
}

/// The bytes of rows `r0 .. r0 + n` of tensor `t` (scale tensors: the scales of those rows).
fn gen_block(
    t: &Tensor,
    key: u64,
    r0: usize,
    n: usize,
    format: Option<QFormat>,
    ue8m0: bool,
) -> Vec<u8> {
    let k = t.cols;
    let mut row = vec![0f32; k];
    match t.store {
        Store::Bf16 | Store::F32 => {
            let es = if t.store == Store::F32 { 4 } else { 2 };
            let mut out = Vec::with_capacity(n * k * es);
            for r in r0..r0 + n {
                gen_row(t.init, key, r, &mut row);
                if t.store == Store::F32 {
                    out.extend(row.iter().flat_map(|x| x.to_le_bytes()));
                } else {
                    out.extend(
                        row.iter()
                            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()),
                    );
                }
            }
            out
        }
        Store::Quant | Store::QuantScale => {
            let fmt = format.unwrap_or(QFormat::Q8 { block: 32 });
            let mut v = vec![0f32; n * k];
            for (i, r) in (r0..r0 + n).enumerate() {
                gen_row(t.init, key, r, &mut v[i * k..(i + 1) * k]);
            }
            let (w, s) = quantize_rows(fmt, &v, k);
            if t.store == Store::Quant {
                w
            } else {
                s
            }
        }
        Store::Fp8 | Store::Fp8ScaleInv => {
            // One 128-row block row: amax per 128 columns, then (weights) a second pass
            // that regenerates each row and encodes it (no f32 copy of the block is kept).
            let nbk = k.div_ceil(FP8_BLOCK);
            let mut amax = vec![0f32; nbk];
            for r in r0..r0 + n {
                gen_row(t.init, key, r, &mut row);
                for (b, blk) in row.chunks(FP8_BLOCK).enumerate() {
                    amax[b] = blk.iter().fold(amax[b], |m, x| m.max(x.abs()));
                }
            }
            let scales: Vec<f32> = amax.iter().map(|a| fp8_scale(*a, ue8m0)).collect();
            if t.store == Store::Fp8ScaleInv {
                return scales.iter().flat_map(|s| s.to_le_bytes()).collect();
            }
            let mut out = Vec::with_capacity(n * k);
            for r in r0..r0 + n {
                gen_row(t.init, key, r, &mut row);
                for (blk, s) in row.chunks(FP8_BLOCK).zip(&scales) {
                    out.extend(blk.iter().map(|x| e4m3(x / s)));
                }
            }
            out
        }
    }
}

// ---------------------------------------------------------------------------------------
// Writing.

/// Blocks produced ahead of the writer, shared by the workers.
struct Pool {
    next: AtomicUsize,
    state: Mutex<PoolState>,
    produced: Condvar,
    consumed: Condvar,
}

struct PoolState {
    ready: HashMap<usize, Vec<u8>>,
    /// Jobs the writer has taken (all jobs below this index).
    taken: usize,
    stop: bool,
    failed: bool,
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stop(&self) {
        self.lock().stop = true;
        self.produced.notify_all();
        self.consumed.notify_all();
    }

    /// The bytes of job `j`, waiting for a worker to finish it.
    fn take(&self, j: usize) -> Result<Vec<u8>> {
        let mut st = self.lock();
        loop {
            if let Some(b) = st.ready.remove(&j) {
                st.taken = j + 1;
                drop(st);
                self.consumed.notify_all();
                return Ok(b);
            }
            if st.failed {
                return Err(Error::msg("internal error: a generator thread failed"));
            }
            st = self.produced.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn work(&self, jobs: usize, window: usize, run: &(dyn Fn(usize) -> Vec<u8> + Sync)) {
        loop {
            let j = self.next.fetch_add(1, Ordering::Relaxed);
            if j >= jobs {
                return;
            }
            {
                let mut st = self.lock();
                while j >= st.taken + window && !st.stop {
                    st = self.consumed.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.stop {
                    return;
                }
            }
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(j)));
            let mut st = self.lock();
            match out {
                Ok(b) => {
                    st.ready.insert(j, b);
                }
                Err(_) => {
                    st.failed = true;
                    st.stop = true;
                }
            }
            drop(st);
            self.produced.notify_all();
        }
    }
}

/// The built-in model's tokenizer (see the module docs).
const TOKENIZER_JSON: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/models/sparsa-bard-12m/tokenizer.json"
));
const TOKENIZER_CONFIG: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/models/sparsa-bard-12m/tokenizer_config.json"
));

/// GLM-5.x-FP8's `modules_to_not_convert` for this model's layers (the release's list,
/// including its `indexers_proj`, a module that does not exist).
fn modules_to_not_convert(cfg: &Config) -> Vec<String> {
    let mut m: Vec<String> = vec!["lm_head".into(), "model.embed_tokens".into()];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        m.push(format!("{p}.input_layernorm"));
        m.push(format!("{p}.post_attention_layernorm"));
        m.push(format!("{p}.self_attn.q_a_layernorm"));
        m.push(format!("{p}.self_attn.kv_a_layernorm"));
        if !cfg.is_dense_layer(i) {
            m.push(format!("{p}.mlp.gate"));
            m.push(format!("{p}.mlp.gate.e_score_correction_bias"));
        }
        if cfg.indexer_types[i] == IndexerKind::Full {
            m.push(format!("{p}.self_attn.indexer.k_norm"));
            m.push(format!("{p}.self_attn.indexer.k_norm.bias"));
            m.push(format!("{p}.self_attn.indexers_proj"));
        }
    }
    m.push("model.norm".into());
    m.sort();
    m
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes)
        .map_err(|e| Error::msg(format!("{}: cannot write: {e}", path.display())))
}

/// Write a synthetic model of `config` (a `config.json` value, e.g. from [`release_config`])
/// into `out` (created; must be empty if it exists). `progress(done, total)` counts bytes.
pub fn synth_dir(
    config: &Value,
    out: &Path,
    opts: &Options,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Report> {
    if let Some(q) = opts.format {
        if q != QFormat::Fp8 {
            QFormat::check_block(q.block(), "--block")?;
        }
    }
    let cfg = parse_config(config)?;
    check_out_empty(out)?;
    let tensors = stored_tensors(&cfg, opts.format);
    let report = summarize(&tensors, opts.shard_bytes);
    let ue8m0 = ue8m0(&cfg);

    // config.json with quantization_config; generation_config.json; the tokenizer.
    let mut c = config.clone();
    if let Some(m) = c.as_object_mut() {
        m.remove("quantization_config");
        match opts.format {
            None => {}
            Some(QFormat::Fp8) => {
                let mut q = json!({
                    "activation_scheme": "dynamic",
                    "fmt": "e4m3",
                    "quant_method": "fp8",
                    "weight_block_size": [128, 128]
                });
                if let Some(qm) = q.as_object_mut() {
                    if ue8m0 {
                        qm.insert("scale_fmt".into(), "ue8m0".into());
                    } else {
                        qm.insert(
                            "modules_to_not_convert".into(),
                            json!(modules_to_not_convert(&cfg)),
                        );
                    }
                }
                m.insert("quantization_config".into(), q);
            }
            Some(q) => {
                m.insert(
                    "quantization_config".into(),
                    json!({"quant_method": "sparsa", "format": q.name(), "block_size": q.block()}),
                );
            }
        }
        if let Some(s) = m.get_mut("sparsa_synth").and_then(|s| s.as_object_mut()) {
            s.insert("seed".into(), opts.seed.into());
            s.insert(
                "format".into(),
                opts.format.map_or("bf16", |q| q.name()).into(),
            );
        }
    }
    std::fs::create_dir_all(out)
        .map_err(|e| Error::msg(format!("--out {}: cannot create: {e}", out.display())))?;
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
    write_file(&out.join("config.json"), pretty(&c).as_bytes())?;
    let mut gen =
        json!({"eos_token_id": config.get("eos_token_id").cloned().unwrap_or(Value::Null)});
    for k in ["bos_token_id", "pad_token_id"] {
        if let (Some(v), Some(m)) = (config.get(k), gen.as_object_mut()) {
            m.insert(k.into(), v.clone());
        }
    }
    write_file(&out.join("generation_config.json"), pretty(&gen).as_bytes())?;
    write_file(&out.join("tokenizer.json"), TOKENIZER_JSON)?;
    write_file(&out.join("tokenizer_config.json"), TOKENIZER_CONFIG)?;

    // Jobs: row blocks of every tensor, in file order.
    let keys: Vec<u64> = tensors
        .iter()
        .map(|t| splitmix64(opts.seed ^ fnv1a(&t.seed_name)))
        .collect();
    let mut jobs: Vec<(usize, usize, usize)> = Vec::new(); // (tensor, first row, rows)
    let mut first_job = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        first_job.push(jobs.len());
        let b = block_rows(t);
        let mut r0 = 0;
        while r0 < t.rows {
            let n = b.min(t.rows - r0);
            jobs.push((i, r0, n));
            r0 += n;
        }
    }
    let threads = opts.threads.max(1);
    let window = threads + 2;
    let pool = Pool {
        next: AtomicUsize::new(0),
        state: Mutex::new(PoolState {
            ready: HashMap::new(),
            taken: 0,
            stop: false,
            failed: false,
        }),
        produced: Condvar::new(),
        consumed: Condvar::new(),
    };
    let format = opts.format;
    let run = |j: usize| {
        let (ti, r0, n) = jobs[j];
        gen_block(&tensors[ti], keys[ti], r0, n, format, ue8m0)
    };
    let headers: Vec<TensorHeader> = tensors.iter().map(|t| t.header.clone()).collect();
    let mut meta = serde_json::Map::new();
    meta.insert("format".into(), "pt".into());
    if let Some(q @ (QFormat::Q8 { .. } | QFormat::Q4 { .. })) = opts.format {
        meta.insert("sparsa_quant".into(), q.name().into());
        meta.insert("block_size".into(), q.block().to_string().into());
    }
    let total = report.bytes;
    let written = std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| pool.work(jobs.len(), window, &run));
        }
        let mut done = 0u64;
        let r = write_sharded(out, &headers, opts.shard_bytes, true, &meta, &mut |i, w| {
            let end = first_job.get(i + 1).copied().unwrap_or(jobs.len());
            let mut n = 0u64;
            for j in first_job[i]..end {
                let b = pool.take(j)?;
                w.write_all(&b)?;
                n += b.len() as u64;
                done += b.len() as u64;
                progress(done, total);
            }
            Ok::<u64, WriteErr>(n)
        });
        pool.stop();
        r
    })?;
    Ok(Report {
        shards: written.shards,
        bytes: written.bytes,
        ..report
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::quant::{e4m3_to_f32, f32_to_e4m3};

    #[test]
    fn fast_e4m3_matches_the_reference_encoder() {
        // Every code, the midpoints between neighbours (ties) and a sweep of magnitudes.
        let mut xs: Vec<f32> = Vec::new();
        for c in 0u8..=0x7E {
            let v = e4m3_to_f32(c);
            xs.push(v);
            let next = e4m3_to_f32(c + 1);
            if next.is_finite() {
                xs.push((v + next) / 2.0);
                xs.push(v + (next - v) * 0.49);
                xs.push(v + (next - v) * 0.51);
            }
        }
        let mut s = 1u64;
        for _ in 0..20000 {
            s = splitmix64(s);
            let y = f32::from_bits((s as u32) & 0x7FFF_FFFF);
            if y.is_finite() {
                xs.push(y % 600.0);
            }
            xs.push((s >> 40) as f32 / (1u64 << 24) as f32 * 0.05);
        }
        xs.extend([448.0, 449.0, 464.0, 1e9, 0.0, 1e-30]);
        for x in xs {
            for v in [x, -x] {
                assert_eq!(e4m3(v), f32_to_e4m3(v), "{v}");
            }
        }
    }

    #[test]
    fn ue8m0_scales_are_powers_of_two_covering_amax() {
        for amax in [1e-3f32, 0.0377, 1.0, 448.0, 896.0, 3.3e4] {
            let s = fp8_scale(amax, true);
            assert_eq!(s.to_bits() & 0x7F_FFFF, 0, "{s}");
            assert!(amax / s <= 448.0 && amax / s > 224.0, "{amax} {s}");
        }
        assert_eq!(fp8_scale(448.0, false), 1.0);
    }

    #[test]
    fn rows_do_not_depend_on_blocking() {
        let mut a = vec![0f32; 301];
        let mut b = vec![0f32; 301];
        gen_row(Init::Uniform(0.5), 7, 3, &mut a);
        gen_row(Init::Uniform(0.5), 7, 3, &mut b);
        assert_eq!(a, b);
        gen_row(Init::Uniform(0.5), 7, 4, &mut b);
        assert_ne!(a, b);
        assert!(a.iter().all(|x| x.abs() < 0.5));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        let var = a.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / a.len() as f32;
        // Uniform(−0.5, 0.5): variance 1/12.
        assert!((var - 1.0 / 12.0).abs() < 0.02, "{var}");
    }

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
