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
//! - [`tensor_list`] is that list of tensors without the values, and [`ConfigDir`] a directory
//!   holding only a release's `config.json` (and perhaps its shard index): `sparsa info`
//!   plans a model from them before it is downloaded.
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

mod config;
mod config_dir;
mod tensors;
mod values;

pub use config::{release_config, Like, ReleaseConfig};
pub use config_dir::{check_index, has_weights, tensor_list, ConfigDir, IndexCheck, ShardIndex};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::quantize::{
    check_out_empty, write_sharded, write_sharded_holes, TensorHeader, WriteErr,
};
use crate::weights::QFormat;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::{Condvar, Mutex};
use tensors::{stored_tensors, ue8m0, Store, Tensor};
use values::{block_rows, fnv1a, gen_block, splitmix64, Pool, PoolState};

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
    /// Every tensor all zeros, written as holes (the shards' headers are the same as
    /// without; the data takes no disk and no time): for benchmarks where only the shapes
    /// matter, such as a full-depth model on a small disk. In a quantized format the scales
    /// are zero too, so every weight is zero.
    pub zeros: bool,
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
    for i in 0..cfg.cache_layers() {
        let p = format!("model.layers.{i}");
        let mtp = i == cfg.num_hidden_layers;
        if mtp {
            for n in ["enorm", "hnorm", "eh_proj", "shared_head.norm"] {
                m.push(format!("{p}.{n}"));
            }
        }
        m.push(format!("{p}.input_layernorm"));
        m.push(format!("{p}.post_attention_layernorm"));
        m.push(format!("{p}.self_attn.q_a_layernorm"));
        m.push(format!("{p}.self_attn.kv_a_layernorm"));
        if mtp || !cfg.is_dense_layer(i) {
            m.push(format!("{p}.mlp.gate"));
            m.push(format!("{p}.mlp.gate.e_score_correction_bias"));
        }
        if cfg.has_keys(i) {
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
    let headers: Vec<TensorHeader> = tensors.iter().map(|t| t.header.clone()).collect();
    let mut meta = serde_json::Map::new();
    meta.insert("format".into(), "pt".into());
    if let Some(q @ (QFormat::Q8 { .. } | QFormat::Q4 { .. })) = opts.format {
        meta.insert("sparsa_quant".into(), q.name().into());
        meta.insert("block_size".into(), q.block().to_string().into());
    }
    if opts.zeros {
        let written = write_sharded_holes(out, &headers, opts.shard_bytes, true, &meta)?;
        progress(written.bytes, report.bytes);
        return Ok(Report {
            shards: written.shards,
            bytes: written.bytes,
            ..report
        });
    }

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
