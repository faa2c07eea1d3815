//! DSA models: GLM-5 family (`glm_moe_dsa`) and DeepSeek-V3.2 (`deepseek_v32`).
//!
//! Both families share one forward pass (`forward.rs`); what differs is data in
//! [`Config`]: the indexer RoPE pairing (GLM interleaved, V3.2 half-split), IndexShare
//! (GLM-5.2: shared layers reuse the previous full layer's top-k), router groups
//! (V3.2: n_group 8 / topk_group 4) and YaRN (V3.2's mscale in the softmax scale).

mod forward;
pub mod info;
pub mod load;
pub mod rope;
pub mod source;

pub use forward::{Logits, Pick, Session};
pub use source::ModelSource;

use crate::config::Config;
#[cfg(not(target_arch = "wasm32"))]
use crate::error::Error;
use crate::error::Result;
use crate::experts::{GpuMemory, Offload, Policy};
use crate::gpu::Gpu;
use crate::weights::WeightFiles;
#[cfg(not(target_arch = "wasm32"))]
use std::path::Path;
use std::sync::Arc;

/// A GPU memory budget for loading: `memory` must hold the model's non-expert weights, the
/// caches for `ctx` tokens and scratch; the rest caches routed experts under `policy`.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub memory: GpuMemory,
    pub ctx: usize,
    pub policy: Policy,
    /// Upload the next layer's predicted experts ahead (see [`crate::experts`]).
    pub prefetch: bool,
}

pub struct Model {
    pub config: Config,
    pub gpu: Arc<Gpu>,
    pub weights: load::Weights,
    /// The routed-expert cache when loaded under a `--gpu-memory` budget that streams
    /// experts.
    pub offload: Option<Offload>,
    /// How logs and errors name the model (its directory, or the built-in model's name).
    pub label: String,
}

impl Model {
    /// Load a Hugging Face model directory onto `gpu`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(dir: &Path, gpu: Arc<Gpu>, progress: load::Progress) -> Result<Model> {
        if !dir.is_dir() {
            return Err(Error::msg(format!(
                "{}: not a directory (expected a model directory with config.json)",
                dir.display()
            )));
        }
        let config = Config::from_dir(dir)?;
        let files = WeightFiles::open(dir)?;
        Self::from_parts(config, &files, gpu, dir.display().to_string(), progress)
    }

    /// Load a [`ModelSource`] (directory, built-in model or in-memory files) onto `gpu`.
    pub fn from_source(
        src: &ModelSource,
        gpu: Arc<Gpu>,
        progress: load::Progress,
    ) -> Result<Model> {
        Self::from_source_with(src, gpu, progress, None)
    }

    pub fn from_parts(
        config: Config,
        files: &WeightFiles,
        gpu: Arc<Gpu>,
        label: String,
        progress: load::Progress,
    ) -> Result<Model> {
        Self::from_parts_with(config, files, gpu, label, progress, None)
    }

    /// [`Model::from_source`] within a GPU memory budget: the routed experts that do not fit
    /// stay in the files and stream through a cache (see [`crate::experts`]).
    pub fn from_source_with(
        src: &ModelSource,
        gpu: Arc<Gpu>,
        progress: load::Progress,
        budget: Option<&Budget>,
    ) -> Result<Model> {
        Self::from_parts_with(
            src.config.clone(),
            &src.weights,
            gpu,
            src.label.clone(),
            progress,
            budget,
        )
    }

    fn from_parts_with(
        config: Config,
        files: &WeightFiles,
        gpu: Arc<Gpu>,
        label: String,
        progress: load::Progress,
        budget: Option<&Budget>,
    ) -> Result<Model> {
        let plan = match budget {
            Some(b) => {
                let bytes = b.memory.bytes(gpu.memory_size())?;
                let scratch = Session::scratch_bytes(&config, b.ctx, gpu.max_binding());
                let p = crate::experts::plan(&config, files, bytes, b.ctx, scratch)?;
                log::info!("{}", p.describe());
                Some(p)
            }
            None => None,
        };
        let slots = plan
            .as_ref()
            .filter(|p| p.offloads())
            .map(|p| p.slots.clone());
        let weights = load::load(&gpu, &config, files, progress, slots.as_deref())?;
        gpu.sync()?;
        files.check_unchanged()?;
        let offload = match (plan, budget) {
            (Some(p), Some(b)) if p.offloads() => {
                Some(Offload::new(p, b.policy, b.prefetch, files.clone()))
            }
            _ => None,
        };
        Ok(Model {
            config,
            gpu,
            weights,
            offload,
            label,
        })
    }

    /// Start a conversation with caches for `max_ctx` tokens.
    pub fn session(&self, max_ctx: usize) -> Result<Session<'_>> {
        Session::new(self, max_ctx)
    }
}
