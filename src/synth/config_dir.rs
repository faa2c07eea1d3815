//! A model that is not on disk yet, planned from its `config.json`: the tensors it stores in
//! a chosen format (the same list [`crate::synth::synth_dir`] writes, so there is one table
//! of names and shapes), and what a directory holding only `config.json`, perhaps with
//! `model.safetensors.index.json`, says about the release. `sparsa info` uses it to tell a
//! user whether a model fits before its hundreds of gigabytes are downloaded.

use super::tensors::stored_tensors;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::info::{layer_of, TensorMeta};
use crate::weights::{parse_shard_index, QFormat};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The tensors a model of `cfg` stores in `format` (None: bf16, the router's correction bias
/// f32; FP8: the release layout; q8 / q4: as `sparsa quantize` writes them), layers
/// `0 .. num_hidden_layers` only (no MTP layer), with their stored dtypes, shapes and bytes.
pub fn tensor_list(cfg: &Config, format: Option<QFormat>) -> Result<Vec<TensorMeta>> {
    use safetensors::Dtype as D;
    stored_tensors(cfg, format)
        .into_iter()
        .map(|t| {
            let h = t.header;
            let dtype = match h.dtype {
                "BF16" => D::BF16,
                "F32" => D::F32,
                "F16" => D::F16,
                "F8_E4M3" => D::F8_E4M3,
                "I8" => D::I8,
                "U8" => D::U8,
                other => {
                    return Err(Error::msg(format!(
                        "tensor {}: no safetensors dtype for {other:?}",
                        h.name
                    )))
                }
            };
            Ok(TensorMeta {
                name: h.name,
                dtype,
                shape: h.shape,
                bytes: h.bytes,
            })
        })
        .collect()
}

/// Whether `dir` holds weights that [`crate::weights::WeightFiles::open`] would open: every
/// shard `model.safetensors.index.json` names, else `model.safetensors`, else any
/// `*.safetensors` (a directory whose index names shards not all present yet is a download
/// in progress: it has no weights to open).
pub fn has_weights(dir: &Path) -> bool {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let Ok(text) = std::fs::read_to_string(&index) else {
            return true; // let the loader say what is wrong with it
        };
        return match parse_shard_index(&text, &index) {
            Ok((shards, _)) => !shards.is_empty() && shards.iter().all(|s| dir.join(s).exists()),
            Err(_) => true,
        };
    }
    if dir.join("model.safetensors").exists() {
        return true;
    }
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
    })
}

/// What `model.safetensors.index.json` says: tensor names (no shapes or dtypes) and
/// `metadata.total_size`.
#[derive(Debug, Clone)]
pub struct ShardIndex {
    pub path: PathBuf,
    /// Tensor names, sorted.
    pub names: Vec<String>,
    /// Shard file names, in order of first mention.
    pub shards: Vec<String>,
    /// How many of them are in the directory.
    pub shards_present: usize,
    /// `metadata.total_size`: the bytes of every tensor, when given.
    pub total_size: Option<u64>,
}

impl ShardIndex {
    /// The stored format its names show: `<weight>_scale_inv` tensors are FP8, `<weight>_scale`
    /// tensors sparsa's q8 / q4 (which one, `quantization_config` says: `config_quant`);
    /// neither: unquantized, None.
    pub fn format(&self, config_quant: Option<QFormat>) -> Option<QFormat> {
        let set: HashSet<&str> = self.names.iter().map(|n| n.as_str()).collect();
        let scaled = |suffix: &str| {
            self.names.iter().any(|n| {
                n.strip_suffix(suffix)
                    .is_some_and(|w| w.ends_with(".weight") && set.contains(w))
            })
        };
        if scaled("_scale_inv") {
            Some(QFormat::Fp8)
        } else if scaled("_scale") {
            config_quant.filter(|q| *q != QFormat::Fp8)
        } else {
            None
        }
    }
}

/// How the index's tensor names compare with the names derived from `config.json`.
#[derive(Debug, Clone, Default)]
pub struct IndexCheck {
    /// Derived names the index does not have.
    pub missing: Vec<String>,
    /// Index names past `num_hidden_layers` (the MTP layer: downloaded, not run).
    pub past_layers: usize,
    /// Other index names that were not derived.
    pub unexpected: Vec<String>,
}

impl IndexCheck {
    pub fn matches(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty()
    }
}

/// A model directory holding `config.json` (and perhaps the shard index) but no weights.
pub struct ConfigDir {
    pub dir: PathBuf,
    pub config: Config,
    pub index: Option<ShardIndex>,
}

impl ConfigDir {
    /// Read `dir/config.json` (validated as for loading; errors name the file) and
    /// `dir/model.safetensors.index.json` when present.
    pub fn open(dir: &Path) -> Result<ConfigDir> {
        let path = dir.join("config.json");
        if !path.is_file() {
            return Err(Error::msg(format!(
                "{}: no config.json (expected a Hugging Face model directory, or one holding just its config.json to plan it)",
                dir.display()
            )));
        }
        let config = Config::from_dir(dir)?;
        let index_path = dir.join("model.safetensors.index.json");
        let index = if index_path.exists() {
            Some(read_index(dir, &index_path)?)
        } else {
            None
        };
        Ok(ConfigDir {
            dir: dir.to_path_buf(),
            config,
            index,
        })
    }

    /// The format the download holds: what the index's names show, else the config's
    /// `quantization_config`, else None (bf16).
    pub fn stored_format(&self) -> Option<QFormat> {
        match &self.index {
            Some(ix) => ix.format(self.config.quant),
            None => self.config.quant,
        }
    }
}

fn read_index(dir: &Path, path: &Path) -> Result<ShardIndex> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::msg(format!("{}: cannot read: {e}", path.display())))?;
    let (shards, map) = parse_shard_index(&text, path)?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::msg(format!("{}: invalid JSON: {e}", path.display())))?;
    let total_size = match v.get("metadata").and_then(|m| m.get("total_size")) {
        None => None,
        Some(t) => Some(t.as_u64().ok_or_else(|| {
            Error::msg(format!(
                "{}: metadata.total_size is {t}, expected a byte count",
                path.display()
            ))
        })?),
    };
    let mut names: Vec<String> = map.into_keys().collect();
    names.sort();
    let shards_present = shards.iter().filter(|s| dir.join(s).is_file()).count();
    Ok(ShardIndex {
        path: path.to_path_buf(),
        names,
        shards,
        shards_present,
        total_size,
    })
}

/// Compare the index's names with `derived` (from [`tensor_list`] in the index's format).
pub fn check_index(cfg: &Config, index: &ShardIndex, derived: &[TensorMeta]) -> IndexCheck {
    let have: HashSet<&str> = index.names.iter().map(|n| n.as_str()).collect();
    let want: HashSet<&str> = derived.iter().map(|t| t.name.as_str()).collect();
    let mut c = IndexCheck::default();
    for t in derived {
        if !have.contains(t.name.as_str()) {
            c.missing.push(t.name.clone());
        }
    }
    for n in &index.names {
        if want.contains(n.as_str()) {
            continue;
        }
        if layer_of(n).is_some_and(|l| l >= cfg.num_hidden_layers) {
            c.past_layers += 1;
        } else {
            c.unexpected.push(n.clone());
        }
    }
    c
}
