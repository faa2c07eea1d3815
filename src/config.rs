//! `config.json` (and `generation_config.json`) of `glm_moe_dsa` and `deepseek_v32` models.
//!
//! Field names and defaults follow transformers 5.24.0 (see tests/reference/HF_NOTES.md).
//! A missing required field or an unknown `model_type` is an error that names the field.

use crate::error::{Error, Result};
use crate::weights::QFormat;
use serde_json::{Map, Value};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// GLM-5 / 5.1 / 5.2 (`glm_moe_dsa`, `GlmMoeDsaForCausalLM`).
    GlmMoeDsa,
    /// DeepSeek-V3.2 (`deepseek_v32`, `DeepseekV32ForCausalLM`).
    DeepseekV32,
}

impl Family {
    pub fn model_type(self) -> &'static str {
        match self {
            Family::GlmMoeDsa => "glm_moe_dsa",
            Family::DeepseekV32 => "deepseek_v32",
        }
    }
}

/// RoPE frequencies and the YaRN corrections.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub kind: RopeKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeKind {
    Default,
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        /// `mscale` / `mscale_all_dim` as given (transformers tests them for truthiness).
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        attention_factor: Option<f64>,
        truncate: bool,
    },
}

/// Whether a layer runs its own lightning indexer or reuses the previous full layer's top-k.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexerKind {
    Full,
    Shared,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_shared_experts: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f32,
    pub norm_topk_prob: bool,
    pub first_k_dense_replace: usize,
    /// Per layer: true = dense SwiGLU MLP, false = MoE (`mlp_layer_types`, else the first
    /// `first_k_dense_replace` layers are dense).
    pub dense_layers: Vec<bool>,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    /// Indexer RoPE pairing: interleaved (GLM) or half-split (DeepSeek-V3.2).
    pub indexer_rope_interleave: bool,
    /// MLA RoPE pairing.
    pub mla_rope_interleave: bool,
    pub indexer_types: Vec<IndexerKind>,
    /// Multi-token-prediction layers after the decoder (`num_nextn_predict_layers`: layer
    /// `num_hidden_layers`, a full DSA MoE layer behind `enorm` / `hnorm` / `eh_proj`).
    /// sparsa runs the first as a draft model; [`crate::model::Model`] sets this to 0 where
    /// the files lack it or it is not loaded.
    pub num_nextn_predict_layers: usize,
    pub rope: Rope,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    /// `quantization_config`: FP8 (official releases) or sparsa's q8 / q4. Which tensors
    /// are quantized is read from the tensors themselves (dtype + scale tensor).
    pub quant: Option<QFormat>,
}

/// The `quantization_config` of a `config.json` text (`file` names it in errors), without
/// reading the rest of the config: None when absent.
pub fn quantization_config(text: &str, file: &str) -> Result<Option<QFormat>> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| Error::msg(format!("{file}: invalid JSON: {e}")))?;
    let map = v
        .as_object()
        .ok_or_else(|| Error::msg(format!("{file}: expected a JSON object")))?;
    quant_config(&Fields {
        file: file.to_string(),
        map,
    })
}

/// Parse `quantization_config` (None when absent).
fn quant_config(f: &Fields) -> Result<Option<QFormat>> {
    let Some(q) = f.get("quantization_config") else {
        return Ok(None);
    };
    let bad = |what: &str| Error::msg(format!("{}: quantization_config {q}: {what}", f.file));
    let method = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("");
    match method {
        "fp8" => {
            let fmt = q.get("fmt").and_then(|m| m.as_str()).unwrap_or("e4m3");
            if fmt != "e4m3" {
                return Err(bad("only fmt \"e4m3\" FP8 is supported"));
            }
            let blocks: Option<Vec<u64>> = q
                .get("weight_block_size")
                .and_then(|b| b.as_array())
                .map(|a| a.iter().filter_map(|x| x.as_u64()).collect());
            if blocks.as_deref().is_some_and(|b| b != [128, 128]) {
                return Err(bad("only weight_block_size [128, 128] is supported"));
            }
            Ok(Some(QFormat::Fp8))
        }
        "sparsa" => {
            let block = q
                .get("block_size")
                .and_then(|b| b.as_u64())
                .ok_or_else(|| bad("block_size is missing"))? as usize;
            QFormat::check_block(block, &format!("{}: quantization_config", f.file))?;
            match q.get("format").and_then(|m| m.as_str()) {
                Some("q8") => Ok(Some(QFormat::Q8 { block })),
                Some("q4") => Ok(Some(QFormat::Q4 { block })),
                _ => Err(bad("format must be \"q8\" or \"q4\"")),
            }
        }
        _ => Err(bad(
            "unsupported quant_method (sparsa reads \"fp8\" releases and its own \"sparsa\" q8/q4)",
        )),
    }
}

struct Fields<'a> {
    file: String,
    map: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn missing(&self, k: &str, what: &str) -> Error {
        Error::msg(format!(
            "{}: required field `{k}` is missing (expected {what})",
            self.file
        ))
    }
    fn bad(&self, k: &str, what: &str) -> Error {
        // (`k` is always a field that is present; indexing a missing one would panic.)
        let v = self
            .map
            .get(k)
            .map_or_else(|| "null".to_string(), |v| v.to_string());
        Error::msg(format!("{}: field `{k}` = {v} is not {what}", self.file))
    }
    fn get(&self, k: &str) -> Option<&Value> {
        self.map.get(k).filter(|v| !v.is_null())
    }
    fn usize(&self, k: &str) -> Result<usize> {
        let v = self
            .get(k)
            .ok_or_else(|| self.missing(k, "a non-negative integer"))?;
        let n = v
            .as_u64()
            .ok_or_else(|| self.bad(k, "a non-negative integer"))?;
        // Refused here, before anything is sized from it: a dimension past any real model's
        // would ask for terabytes (or overflow the products the loader computes).
        let max = size_limit(k);
        if n > max as u64 {
            return Err(self.bad(
                k,
                &format!("at most {max} (larger than any real model; refused before allocating)"),
            ));
        }
        Ok(n as usize)
    }
    fn usize_or(&self, k: &str, d: usize) -> Result<usize> {
        if self.get(k).is_some() {
            self.usize(k)
        } else {
            Ok(d)
        }
    }
    fn f64_or(&self, k: &str, d: f64) -> Result<f64> {
        match self.get(k) {
            None => Ok(d),
            Some(v) => v.as_f64().ok_or_else(|| self.bad(k, "a number")),
        }
    }
    fn bool_or(&self, k: &str, d: bool) -> Result<bool> {
        match self.get(k) {
            None => Ok(d),
            Some(v) => v.as_bool().ok_or_else(|| self.bad(k, "true or false")),
        }
    }
}

/// The largest value sparsa accepts for a size field of config.json: far beyond every DSA
/// release (GLM-5: hidden 6144, vocab 154880, 78 layers, 256 experts; DeepSeek-V3.2: hidden
/// 7168, 61 layers), small enough that the loader's products of them cannot overflow and that
/// nothing sized from them (per-layer lists, buffers) can be absurd.
fn size_limit(field: &str) -> usize {
    match field {
        "vocab_size" | "max_position_embeddings" | "original_max_position_embeddings" => 1 << 24,
        "hidden_size" | "q_lora_rank" | "kv_lora_rank" => 1 << 16,
        "intermediate_size" | "moe_intermediate_size" | "index_topk" => 1 << 20,
        "num_hidden_layers" | "num_attention_heads" | "num_key_value_heads" => 1 << 12,
        "qk_nope_head_dim" | "qk_rope_head_dim" | "v_head_dim" | "index_head_dim" => 1 << 12,
        "n_routed_experts" | "index_n_heads" => 1 << 12,
        "n_shared_experts" | "num_experts_per_tok" | "n_group" | "topk_group" => 1 << 10,
        _ => 1 << 20,
    }
}

fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => vec![],
    }
}

impl Config {
    /// Read `config.json` (and `generation_config.json` if present) from a model directory.
    pub fn from_dir(dir: &Path) -> Result<Config> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::msg(format!("{}: cannot read: {e}", path.display())))?;
        let gen = dir.join("generation_config.json");
        let gen_text = std::fs::read_to_string(&gen).ok();
        Config::from_texts(
            &text,
            &path.display().to_string(),
            gen_text.as_deref().map(|t| (t, gen.display().to_string())),
        )
    }

    /// Parse `config.json` text plus an optional `generation_config.json` text (whose
    /// eos ids are added); the labels name the files in errors.
    pub fn from_texts(text: &str, file: &str, gen: Option<(&str, String)>) -> Result<Config> {
        let mut cfg = Config::from_json(text, file)?;
        if let Some((t, label)) = gen {
            let v: Value = serde_json::from_str(t)
                .map_err(|e| Error::msg(format!("{label}: invalid JSON: {e}")))?;
            for id in token_ids(v.get("eos_token_id")) {
                if !cfg.eos_token_ids.contains(&id) {
                    cfg.eos_token_ids.push(id);
                }
            }
        }
        Ok(cfg)
    }

    /// Parse the text of a `config.json`; `file` names it in errors.
    pub fn from_json(text: &str, file: &str) -> Result<Config> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::msg(format!("{file}: invalid JSON: {e}")))?;
        let map = v
            .as_object()
            .ok_or_else(|| Error::msg(format!("{file}: expected a JSON object")))?;
        let f = Fields {
            file: file.to_string(),
            map,
        };
        let family = match f.get("model_type").and_then(|m| m.as_str()) {
            Some("glm_moe_dsa") => Family::GlmMoeDsa,
            Some("deepseek_v32") => Family::DeepseekV32,
            Some(other) => {
                return Err(Error::msg(format!(
                    "{file}: model_type `{other}` is not a DSA model sparsa runs (expected `glm_moe_dsa` or `deepseek_v32`)"
                )))
            }
            None => return Err(f.missing("model_type", "`glm_moe_dsa` or `deepseek_v32`")),
        };
        // Per-layer tables are built from this count; `usize` caps it (see `size_limit`).
        let num_hidden_layers = f.usize("num_hidden_layers")?;
        let qk_rope_head_dim = f.usize("qk_rope_head_dim")?;
        let index_head_dim = f.usize("index_head_dim")?;
        let n_routed_experts = f.usize("n_routed_experts")?;
        let num_experts_per_tok = f.usize("num_experts_per_tok")?;
        let n_group = f.usize_or("n_group", 1)?.max(1);
        let topk_group = f.usize_or("topk_group", 1)?.max(1);
        let hidden_size = f.usize("hidden_size")?;
        let num_attention_heads = f.usize("num_attention_heads")?;
        if num_attention_heads == 0 {
            return Err(f.bad("num_attention_heads", "positive"));
        }

        // DeepSeek-V3.2 pairs the indexer RoPE half-split; GLM interleaves it (transformers 5.24
        // reads `indexer_rope_interleave`, default true for glm_moe_dsa).
        let indexer_rope_interleave = match family {
            Family::GlmMoeDsa => f.bool_or("indexer_rope_interleave", true)?,
            Family::DeepseekV32 => f.bool_or("indexer_rope_interleave", false)?,
        };
        let mla_rope_interleave = f.bool_or("rope_interleave", true)?;

        // Variants transformers supports but these checkpoints never use: refuse them rather
        // than compute something else.
        if f.bool_or("attention_bias", false)? {
            return Err(f.bad(
                "attention_bias",
                "false (biases on the attention projections are not supported)",
            ));
        }
        if let Some(act) = f.get("hidden_act") {
            if act.as_str() != Some("silu") {
                return Err(f.bad(
                    "hidden_act",
                    "\"silu\" (the only activation DSA models use)",
                ));
            }
        }
        let heads_kv = f.usize_or("num_key_value_heads", num_attention_heads)?;
        if heads_kv != num_attention_heads {
            return Err(f.bad(
                "num_key_value_heads",
                "equal to num_attention_heads (MLA has one latent KV head)",
            ));
        }
        let indexer_types = indexer_types(&f, family, num_hidden_layers)?;
        let first_k_dense_replace = f.usize_or("first_k_dense_replace", 3)?;
        let dense_layers = match f.get("mlp_layer_types") {
            Some(v) => {
                let a = v
                    .as_array()
                    .ok_or_else(|| f.bad("mlp_layer_types", "a list of \"dense\" / \"sparse\""))?;
                if a.len() < num_hidden_layers {
                    return Err(Error::msg(format!(
                        "{file}: field `mlp_layer_types` has {} entries, expected num_hidden_layers = {num_hidden_layers}",
                        a.len()
                    )));
                }
                a.iter()
                    .take(num_hidden_layers)
                    .map(|x| match x.as_str() {
                        Some("dense") => Ok(true),
                        Some("sparse") => Ok(false),
                        _ => Err(f.bad("mlp_layer_types", "a list of \"dense\" / \"sparse\"")),
                    })
                    .collect::<Result<Vec<bool>>>()?
            }
            None => (0..num_hidden_layers)
                .map(|i| i < first_k_dense_replace)
                .collect(),
        };
        let rope = rope(&f)?;

        let mut eos = token_ids(f.get("eos_token_id"));
        eos.dedup();
        let cfg = Config {
            family,
            vocab_size: f.usize("vocab_size")?,
            hidden_size,
            intermediate_size: f.usize("intermediate_size")?,
            moe_intermediate_size: f.usize("moe_intermediate_size")?,
            num_hidden_layers,
            num_attention_heads,
            q_lora_rank: f.usize("q_lora_rank")?,
            kv_lora_rank: f.usize("kv_lora_rank")?,
            qk_nope_head_dim: f.usize("qk_nope_head_dim")?,
            qk_rope_head_dim,
            v_head_dim: f.usize("v_head_dim")?,
            n_routed_experts,
            num_experts_per_tok,
            n_shared_experts: f.usize_or("n_shared_experts", 0)?,
            n_group,
            topk_group,
            routed_scaling_factor: f.f64_or("routed_scaling_factor", 1.0)? as f32,
            norm_topk_prob: f.bool_or("norm_topk_prob", true)?,
            first_k_dense_replace,
            dense_layers,
            index_n_heads: f.usize("index_n_heads")?,
            index_head_dim,
            index_topk: f.usize("index_topk")?,
            indexer_rope_interleave,
            mla_rope_interleave,
            indexer_types,
            num_nextn_predict_layers: f.usize_or("num_nextn_predict_layers", 0)?,
            rope,
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)? as f32,
            max_position_embeddings: f.usize_or("max_position_embeddings", 4096)?,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            eos_token_ids: eos,
            bos_token_id: token_ids(f.get("bos_token_id")).first().copied(),
            quant: quant_config(&f)?,
        };
        cfg.validate(file)?;
        Ok(cfg)
    }

    fn validate(&self, file: &str) -> Result<()> {
        let chk = |ok: bool, what: &str| -> Result<()> {
            if ok {
                Ok(())
            } else {
                Err(Error::msg(format!("{file}: {what}")))
            }
        };
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("q_lora_rank", self.q_lora_rank),
            ("kv_lora_rank", self.kv_lora_rank),
            ("v_head_dim", self.v_head_dim),
            ("index_n_heads", self.index_n_heads),
            ("index_head_dim", self.index_head_dim),
            ("index_topk", self.index_topk),
        ] {
            chk(v > 0, &format!("field `{name}` must be positive"))?;
        }
        chk(
            self.qk_rope_head_dim.is_multiple_of(2),
            "field `qk_rope_head_dim` must be even",
        )?;
        chk(
            self.index_head_dim >= self.qk_rope_head_dim,
            "field `index_head_dim` must be at least `qk_rope_head_dim` (the indexer ropes its first qk_rope_head_dim dims)",
        )?;
        chk(
            self.n_routed_experts.is_multiple_of(self.n_group),
            "field `n_routed_experts` must be divisible by `n_group`",
        )?;
        chk(
            self.topk_group <= self.n_group,
            "field `topk_group` must be ≤ `n_group`",
        )?;
        chk(
            self.num_experts_per_tok <= self.n_routed_experts && self.num_experts_per_tok > 0,
            "field `num_experts_per_tok` must be in 1..=n_routed_experts",
        )?;
        chk(
            self.num_experts_per_tok <= self.topk_group * (self.n_routed_experts / self.n_group),
            "fields `num_experts_per_tok`, `topk_group`: fewer experts in the kept groups than experts per token",
        )?;
        chk(
            self.n_routed_experts <= 1024,
            "field `n_routed_experts` must be ≤ 1024",
        )?;
        chk(
            self.num_experts_per_tok <= 64,
            "field `num_experts_per_tok` must be ≤ 64",
        )?;
        chk(
            self.index_n_heads <= 256,
            "field `index_n_heads` must be ≤ 256",
        )?;
        chk(self.n_group <= 64, "field `n_group` must be ≤ 64")?;
        chk(
            self.kv_lora_rank + self.qk_rope_head_dim <= 2048,
            "fields `kv_lora_rank` + `qk_rope_head_dim` must be ≤ 2048 (one latent cache row per workgroup)",
        )?;
        chk(
            self.index_head_dim <= 2048,
            "field `index_head_dim` must be ≤ 2048 (one indexer key row per workgroup)",
        )?;
        chk(
            self.indexer_types.first() == Some(&IndexerKind::Full),
            "layer 0 must run its own indexer (indexer_types[0] must be \"full\")",
        )?;
        Ok(())
    }

    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Whether layer `i` uses a dense MLP instead of MoE.
    pub fn is_dense_layer(&self, i: usize) -> bool {
        self.dense_layers[i]
    }

    /// Leaves the multi-token-prediction layer out of what loads (and what the caches and
    /// plans count) unless `keep`: only `--draft` runs it, and GLM-5.x's is a whole MoE
    /// layer, 1/79 of the weights, with caches of its own.
    pub fn keep_mtp(&mut self, keep: bool) {
        if !keep {
            self.num_nextn_predict_layers = 0;
        }
    }

    /// Layers with caches: the decoder's, and the MTP layer where the model runs one (it is
    /// layer `num_hidden_layers`, a full layer).
    pub fn cache_layers(&self) -> usize {
        self.num_hidden_layers + self.num_nextn_predict_layers.min(1)
    }

    /// Whether cache layer `i` has indexer keys (a full layer, or the MTP layer).
    pub fn has_keys(&self, i: usize) -> bool {
        self.indexer_types
            .get(i)
            .is_none_or(|k| *k == IndexerKind::Full)
    }

    /// The MLA softmax scale: qk_head_dim^-0.5, times mscale² under YaRN with mscale_all_dim.
    pub fn softmax_scale(&self) -> f32 {
        let mut s = (self.qk_head_dim() as f64).powf(-0.5);
        if let RopeKind::Yarn {
            factor,
            mscale_all_dim: Some(d),
            ..
        } = self.rope.kind
        {
            if d != 0.0 {
                let m = yarn_get_mscale(factor, d);
                s *= m * m;
            }
        }
        s as f32
    }

    pub fn n_full_layers(&self) -> usize {
        self.indexer_types
            .iter()
            .filter(|k| **k == IndexerKind::Full)
            .count()
    }
}

pub fn yarn_get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// Full / shared per layer, derived as transformers derives it.
fn indexer_types(f: &Fields, family: Family, layers: usize) -> Result<Vec<IndexerKind>> {
    if let Some(v) = f.get("indexer_types") {
        let a = v
            .as_array()
            .ok_or_else(|| f.bad("indexer_types", "a list of \"full\" / \"shared\""))?;
        if a.len() < layers {
            return Err(Error::msg(format!(
                "{}: field `indexer_types` has {} entries, expected num_hidden_layers = {layers}",
                f.file,
                a.len()
            )));
        }
        return a
            .iter()
            .take(layers)
            .map(|x| match x.as_str() {
                Some("full") => Ok(IndexerKind::Full),
                Some("shared") => Ok(IndexerKind::Shared),
                _ => Err(f.bad("indexer_types", "a list of \"full\" / \"shared\"")),
            })
            .collect();
    }
    if family == Family::DeepseekV32 {
        return Ok(vec![IndexerKind::Full; layers]);
    }
    if let Some(v) = f.get("index_topk_pattern") {
        // A string of 'F'/'S', or (as transformers also accepts) a list of "full"/"shared".
        let bad = || {
            f.bad(
                "index_topk_pattern",
                "a string of 'F'/'S' or a list of \"full\"/\"shared\"",
            )
        };
        let items: Vec<String> = match v {
            Value::String(s) => s.chars().map(|c| c.to_string()).collect(),
            Value::Array(a) => a
                .iter()
                .map(|x| x.as_str().map(str::to_string).ok_or_else(bad))
                .collect::<Result<_>>()?,
            _ => return Err(bad()),
        };
        let kinds: Vec<IndexerKind> = items
            .iter()
            .map(|c| match c.as_str() {
                "F" | "full" => Ok(IndexerKind::Full),
                "S" | "shared" => Ok(IndexerKind::Shared),
                _ => Err(bad()),
            })
            .collect::<Result<_>>()?;
        if kinds.len() < layers {
            return Err(Error::msg(format!(
                "{}: field `index_topk_pattern` has {} entries, expected num_hidden_layers = {layers}",
                f.file,
                kinds.len()
            )));
        }
        return Ok(kinds[..layers].to_vec());
    }
    let freq = f.usize_or("index_topk_freq", 1)?.max(1);
    let offset = f.usize_or("index_skip_topk_offset", 2)? as i64;
    Ok((0..layers as i64)
        .map(|i| {
            if (i - offset + 1).max(0) % freq as i64 == 0 {
                IndexerKind::Full
            } else {
                IndexerKind::Shared
            }
        })
        .collect())
}

fn opt_f64(p: &Fields, k: &str) -> Result<Option<f64>> {
    match p.get(k) {
        None => Ok(None),
        Some(v) => Ok(Some(v.as_f64().ok_or_else(|| p.bad(k, "a number"))?)),
    }
}

fn rope(f: &Fields) -> Result<Rope> {
    // transformers 5 folds everything into `rope_parameters`; older configs use
    // `rope_theta` + `rope_scaling`.
    let key = if f.get("rope_parameters").is_some() {
        "rope_parameters"
    } else {
        "rope_scaling"
    };
    let pmap = match f.get(key) {
        Some(Value::Object(m)) => Some(m),
        Some(_) => return Err(f.bad(key, "an object")),
        None => None,
    };
    let pf = pmap.map(|m| Fields {
        file: f.file.clone(),
        map: m,
    });
    let theta = match pf.as_ref().and_then(|p| p.get("rope_theta")) {
        Some(v) => v
            .as_f64()
            .ok_or_else(|| Error::msg(format!("{}: rope_theta is not a number", f.file)))?,
        None => f.f64_or("rope_theta", 10000.0)?,
    };
    let Some(p) = pf else {
        return Ok(Rope {
            theta,
            kind: RopeKind::Default,
        });
    };
    let rtype = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let kind = match rtype {
        "default" => RopeKind::Default,
        "yarn" => RopeKind::Yarn {
            factor: match p.get("factor") {
                Some(v) => v.as_f64().ok_or_else(|| p.bad("factor", "a number"))?,
                None => return Err(p.missing("factor", "the YaRN scaling factor")),
            },
            original_max_position_embeddings: match p.get("original_max_position_embeddings") {
                Some(v) => v
                    .as_f64()
                    .ok_or_else(|| p.bad("original_max_position_embeddings", "a number"))?,
                None => f.f64_or("max_position_embeddings", 4096.0)?,
            },
            // transformers: `get("beta_fast") or 32`, so 0 also means the default.
            beta_fast: Some(p.f64_or("beta_fast", 32.0)?)
                .filter(|v| *v != 0.0)
                .unwrap_or(32.0),
            beta_slow: Some(p.f64_or("beta_slow", 1.0)?)
                .filter(|v| *v != 0.0)
                .unwrap_or(1.0),
            mscale: opt_f64(&p, "mscale")?,
            mscale_all_dim: opt_f64(&p, "mscale_all_dim")?,
            attention_factor: match p.get("attention_factor") {
                Some(v) => Some(
                    v.as_f64()
                        .ok_or_else(|| p.bad("attention_factor", "a number"))?,
                ),
                None => None,
            },
            truncate: p.bool_or("truncate", true)?,
        },
        other => {
            return Err(Error::msg(format!(
                "{}: rope type `{other}` is not supported (expected `default` or `yarn`)",
                f.file
            )))
        }
    };
    Ok(Rope { theta, kind })
}

/// The built-in model's directory in the source tree, for the unit tests that read its files.
#[cfg(test)]
pub(crate) fn bard_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/sparsa-bard-12m")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glm(extra: &str) -> String {
        format!(
            r#"{{"model_type": "glm_moe_dsa", "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288,
            "moe_intermediate_size": 2048, "num_hidden_layers": 78, "num_attention_heads": 64, "q_lora_rank": 2048,
            "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
            "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1, "index_n_heads": 32,
            "index_head_dim": 128, "index_topk": 2048, "rope_theta": 1000000, "eos_token_id": [154820, 154827]{extra}}}"#
        )
    }

    #[test]
    fn glm5_defaults() {
        let c = Config::from_json(&glm(""), "config.json").unwrap();
        assert_eq!(c.family, Family::GlmMoeDsa);
        assert!(c.indexer_rope_interleave && c.mla_rope_interleave);
        assert_eq!(
            c.n_full_layers(),
            78,
            "transformers' defaults (freq 1, offset 2) make every layer full"
        );
        assert_eq!(c.dense_layers.iter().filter(|d| **d).count(), 3);
        assert!((c.softmax_scale() - 0.0625).abs() < 1e-7);
        assert_eq!(c.eos_token_ids, vec![154820, 154827]);
    }

    #[test]
    fn glm52_indexshare_from_freq_offset() {
        let c = Config::from_json(
            &glm(r#", "index_topk_freq": 4, "index_skip_topk_offset": 3"#),
            "c",
        )
        .unwrap();
        let full: Vec<usize> = c
            .indexer_types
            .iter()
            .enumerate()
            .filter(|(_, k)| **k == IndexerKind::Full)
            .map(|(i, _)| i)
            .collect();
        let mut want = vec![0, 1, 2];
        want.extend((6..78).step_by(4));
        assert_eq!(full, want);
        assert_eq!(full.len(), 21);
    }

    #[test]
    fn indexer_types_and_pattern_precedence() {
        let types: Vec<&str> = (0..78)
            .map(|i| if i % 2 == 0 { "full" } else { "shared" })
            .collect();
        let j = format!(
            r#", "indexer_types": {:?}, "index_topk_pattern": "{}""#,
            types,
            "F".repeat(78)
        );
        let c = Config::from_json(&glm(&j), "c").unwrap();
        assert_eq!(
            c.n_full_layers(),
            39,
            "explicit indexer_types wins over the pattern"
        );
        let j = format!(r#", "index_topk_pattern": "FS{}""#, "S".repeat(76));
        assert_eq!(Config::from_json(&glm(&j), "c").unwrap().n_full_layers(), 1);
        let list: Vec<&str> = (0..78)
            .map(|i| if i < 3 { "full" } else { "shared" })
            .collect();
        let j = format!(r#", "index_topk_pattern": {list:?}"#);
        assert_eq!(Config::from_json(&glm(&j), "c").unwrap().n_full_layers(), 3);
        let j = r#", "indexer_types": ["shared"]"#;
        assert!(Config::from_json(&glm(j), "c").is_err());
    }

    #[test]
    fn deepseek_v32_yarn_scale_and_half_split() {
        let j = glm(
            r#", "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
               "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}, "qk_nope_head_dim": 128,
               "n_group": 8, "topk_group": 4"#,
        )
        .replace("glm_moe_dsa", "deepseek_v32");
        let c = Config::from_json(&j, "c").unwrap();
        assert!(
            !c.indexer_rope_interleave,
            "V3.2's indexer RoPE is half-split"
        );
        assert!(c.mla_rope_interleave);
        assert!(
            (c.softmax_scale() - 0.13524).abs() < 1e-4,
            "{}",
            c.softmax_scale()
        );
        assert_eq!(c.n_full_layers(), 78);
    }

    #[test]
    fn errors_name_the_field() {
        let e = Config::from_json(&glm("").replace("glm_moe_dsa", "llama"), "x/config.json")
            .unwrap_err()
            .0;
        assert!(e.contains("x/config.json") && e.contains("llama"), "{e}");
        let e = Config::from_json(&glm("").replace(r#""kv_lora_rank": 512,"#, ""), "c")
            .unwrap_err()
            .0;
        assert!(e.contains("kv_lora_rank"), "{e}");
        let e = Config::from_json(&glm("").replace("64, \"q_lora", "\"x\", \"q_lora"), "c")
            .unwrap_err()
            .0;
        assert!(e.contains("num_attention_heads"), "{e}");
        let e = Config::from_json(&glm(r#", "hidden_act": "gelu""#), "c")
            .unwrap_err()
            .0;
        assert!(e.contains("hidden_act"), "{e}");
        let e = Config::from_json(
            &glm(r#", "rope_parameters": {"rope_type": "longrope"}"#),
            "c",
        )
        .unwrap_err()
        .0;
        assert!(e.contains("longrope"), "{e}");
        assert!(Config::from_json("[1]", "c").is_err());
        // Sizes the kernels cannot take are refused here, not at dispatch time.
        let e = Config::from_json(
            &glm("").replace(r#""kv_lora_rank": 512"#, r#""kv_lora_rank": 2000"#),
            "c",
        )
        .unwrap_err()
        .0;
        assert!(e.contains("kv_lora_rank"), "{e}");
        let j = glm(r#", "n_group": 128, "topk_group": 64"#);
        assert!(Config::from_json(&j, "c")
            .unwrap_err()
            .0
            .contains("n_group"));
    }

    /// Found by fuzzing (fuzz/regressions/config): a `rope_scaling` that is not an object was
    /// reported under the name `rope_parameters`, whose missing value the message then indexed,
    /// which panicked.
    #[test]
    fn fuzz_rope_scaling_not_an_object_is_an_error() {
        let e = Config::from_json(&glm(r#", "rope_scaling": 5"#), "c")
            .unwrap_err()
            .0;
        assert_eq!(e, "c: field `rope_scaling` = 5 is not an object");
        let e = Config::from_json(&glm(r#", "rope_parameters": []"#), "c")
            .unwrap_err()
            .0;
        assert_eq!(e, "c: field `rope_parameters` = [] is not an object");
    }

    /// Found by fuzzing: a huge `num_hidden_layers` allocated per-layer tables of that length
    /// (out of memory) before any other check.
    #[test]
    fn fuzz_huge_layer_count_is_an_error() {
        let j = glm("").replace(
            r#""num_hidden_layers": 78"#,
            r#""num_hidden_layers": 1099511627776"#,
        );
        let e = Config::from_json(&j, "c").unwrap_err().0;
        assert!(
            e.contains("`num_hidden_layers` = 1099511627776") && e.contains("at most 4096"),
            "{e}"
        );
        let j = j.replace("glm_moe_dsa", "deepseek_v32");
        assert!(Config::from_json(&j, "c").is_err());
    }
}
