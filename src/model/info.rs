//! What a model directory holds, without a GPU: parameters and bytes per tensor class
//! (file and GPU). `sparsa info` prints it (the caches' bytes per token depend on their
//! format: [`crate::cache::Caches::bytes_per_token`]).

use crate::config::Config;
use crate::error::Result;
use crate::weights::{DType, QFormat, WFormat, WeightFiles};

/// What a tensor is for: `sparsa info` prints bytes per class, and the `--gpu-memory` plan
/// places the classes in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorClass {
    Embeddings,
    Attention,
    Indexer,
    DenseMlp,
    Router,
    RoutedExperts,
    SharedExperts,
    Other,
}

impl TensorClass {
    /// Every class, in display order.
    pub const ALL: [TensorClass; 8] = [
        TensorClass::Embeddings,
        TensorClass::Attention,
        TensorClass::Indexer,
        TensorClass::DenseMlp,
        TensorClass::Router,
        TensorClass::RoutedExperts,
        TensorClass::SharedExperts,
        TensorClass::Other,
    ];

    /// How `sparsa info` names the class.
    pub fn name(self) -> &'static str {
        match self {
            TensorClass::Embeddings => "embeddings",
            TensorClass::Attention => "attention",
            TensorClass::Indexer => "indexer",
            TensorClass::DenseMlp => "dense MLP",
            TensorClass::Router => "router",
            TensorClass::RoutedExperts => "routed experts",
            TensorClass::SharedExperts => "shared experts",
            TensorClass::Other => "norms/other",
        }
    }

    /// The class of a Hugging Face tensor name.
    pub fn of(name: &str) -> TensorClass {
        if name.contains("embed_tokens") || name.starts_with("lm_head") {
            TensorClass::Embeddings
        } else if name.contains(".indexer.") {
            TensorClass::Indexer
        } else if name.contains(".mlp.experts.") {
            TensorClass::RoutedExperts
        } else if name.contains(".mlp.shared_experts.") {
            TensorClass::SharedExperts
        } else if name.contains(".mlp.gate.") {
            TensorClass::Router
        } else if name.contains(".mlp.") {
            TensorClass::DenseMlp
        } else if name.contains(".self_attn.") && !name.contains("layernorm") {
            TensorClass::Attention
        } else {
            TensorClass::Other
        }
    }
}

#[derive(Default, Clone, Copy)]
pub struct ClassStats {
    pub params: u64,
    pub file_bytes: u64,
    pub gpu_bytes: u64,
}

#[derive(Clone)]
pub struct Summary {
    /// Per class, in [`TensorClass::ALL`]'s order (see [`Summary::class`]).
    pub classes: [ClassStats; 8],
    pub params_total: u64,
    /// Parameters one token uses: routed experts count `num_experts_per_tok / n_routed_experts`.
    pub params_active: u64,
    /// Storage formats seen (e.g. "BF16", "FP8", "q4").
    pub formats: Vec<String>,
    /// Tensors past num_hidden_layers (the MTP layer): not counted in `classes`.
    pub skipped_tensors: usize,
    /// GPU bytes of the MTP layer where the config runs one (`Config::keep_mtp`; 0 else):
    /// it loads whole, beside streamed experts too, and the `--gpu-memory` planner places
    /// it before the routed-expert slots.
    pub mtp_gpu_bytes: u64,
    /// Bytes of the embedding table (`model.embed_tokens.weight`), counted in the
    /// embeddings' class unless [`Summary::with_host_embeddings`] moved it to host memory.
    pub embed_bytes: u64,
    /// The embedding table is in host memory: not in the GPU bytes.
    pub embed_in_host: bool,
}

/// The layer index in a `model.layers.{i}.` tensor name.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// One stored tensor as [`summarize_tensors`] sees it: a safetensors header entry, read
/// from the model files ([`summarize`]) or derived from `config.json` alone (`sparsa info` on
/// a directory without weights; see `crate::synth`'s tensor list).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorMeta {
    pub name: String,
    pub dtype: safetensors::Dtype,
    /// The stored shape (q4: `[rows, ⌈cols / 2⌉]` bytes).
    pub shape: Vec<usize>,
    /// Bytes in the file.
    pub bytes: u64,
}

/// Summarize the tensors of the model files.
pub fn summarize(cfg: &Config, files: &WeightFiles) -> Result<Summary> {
    let tensors = files
        .names()
        .map(|name| {
            let t = files.get(name)?;
            Ok(TensorMeta {
                name: t.name,
                dtype: t.dtype,
                shape: t.shape,
                bytes: t.bytes.len() as u64,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    summarize_tensors(cfg, &tensors)
}

/// Summarize a list of stored tensors; `cfg.quant` says what `I8` / `U8` tensors hold.
pub fn summarize_tensors(cfg: &Config, tensors: &[TensorMeta]) -> Result<Summary> {
    use safetensors::Dtype as D;
    let names: std::collections::HashSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    let mut classes = [ClassStats::default(); 8];
    let mut formats: Vec<String> = Vec::new();
    let mut skipped = 0;
    let mut embed_bytes = 0;
    for t in tensors {
        let name = t.name.as_str();
        if layer_of(name).is_some_and(|l| l >= cfg.num_hidden_layers) {
            skipped += 1;
            continue;
        }
        if name == "model.embed_tokens.weight" {
            embed_bytes = t.bytes;
        }
        let c = &mut classes[TensorClass::of(name) as usize];
        c.file_bytes += t.bytes;
        let is_scale = (name.ends_with("_scale_inv") || name.ends_with("_scale"))
            && names.contains(name.trim_end_matches("_inv").trim_end_matches("_scale"));
        if is_scale {
            continue; // bytes counted above; GPU bytes with the weight
        }
        let numel: usize = t.shape.iter().product();
        let quant = match t.dtype {
            D::F8_E4M3 => Some(QFormat::Fp8),
            D::I8 | D::U8 => cfg.quant,
            _ => None,
        };
        let (rows, cols) = match t.shape.as_slice() {
            [r, c] => (*r, *c),
            _ => (1, numel),
        };
        let fname = match (quant, DType::from_safetensors(t.dtype, name)) {
            (Some(q), _) => {
                let cols = if matches!(q, QFormat::Q4 { .. }) {
                    cols * 2
                } else {
                    cols
                };
                let f = WFormat::Quant(q);
                c.params += (rows * cols) as u64;
                c.gpu_bytes += (rows * (f.row_bytes(cols) + f.scale_row_bytes(cols))) as u64;
                q.name().to_string()
            }
            (None, Ok(d)) => {
                c.params += numel as u64;
                // Small vectors are widened to f32 on the GPU.
                c.gpu_bytes += if t.shape.len() == 1 {
                    4 * numel as u64
                } else {
                    t.bytes
                };
                d.name().to_string()
            }
            (None, Err(_)) => format!("{:?}", t.dtype),
        };
        if !formats.contains(&fname) {
            formats.push(fname);
        }
    }
    formats.sort();
    let total: u64 = classes.iter().map(|c| c.params).sum();
    let routed = classes[TensorClass::RoutedExperts as usize].params;
    let active = total - routed
        + routed * cfg.num_experts_per_tok as u64 / cfg.n_routed_experts.max(1) as u64;
    // The MTP layer (layer num_hidden_layers), where the config runs one, summarized on its
    // own.
    let n = cfg.num_hidden_layers;
    let mtp: Vec<TensorMeta> = match cfg.num_nextn_predict_layers {
        0 => Vec::new(),
        _ => tensors
            .iter()
            .filter(|t| layer_of(&t.name) == Some(n))
            .cloned()
            .collect(),
    };
    let mtp_gpu_bytes = if mtp.is_empty() {
        0
    } else {
        let mut with = cfg.clone();
        with.num_hidden_layers = n + 1;
        with.num_nextn_predict_layers = 0;
        summarize_tensors(&with, &mtp)?.gpu_weight_bytes()
    };
    Ok(Summary {
        classes,
        params_total: total,
        params_active: active,
        formats,
        skipped_tensors: skipped,
        mtp_gpu_bytes,
        embed_bytes,
        embed_in_host: false,
    })
}

impl Summary {
    pub fn class(&self, c: TensorClass) -> ClassStats {
        self.classes[c as usize]
    }

    /// This summary with the embedding table in host memory, where the kernels read a few
    /// rows of it a step over the bus (`--host-embeddings`): its bytes leave the GPU's.
    pub fn with_host_embeddings(mut self) -> Summary {
        if !self.embed_in_host {
            let c = &mut self.classes[TensorClass::Embeddings as usize];
            c.gpu_bytes = c.gpu_bytes.saturating_sub(self.embed_bytes);
            self.embed_in_host = true;
        }
        self
    }

    /// GPU bytes of every weight that loads, the MTP layer's included where it runs.
    pub fn gpu_weight_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.gpu_bytes).sum::<u64>() + self.mtp_gpu_bytes
    }
}
