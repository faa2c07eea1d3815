//! DSA models: GLM-5 family (`glm_moe_dsa`) and DeepSeek-V3.2 (`deepseek_v32`).
//!
//! Both families share one forward pass (`forward.rs`: per layer `attention.rs`, then a dense
//! MLP or the MoE of `moe.rs`); what differs is data in
//! [`Config`]: the indexer RoPE pairing (GLM interleaved, V3.2 half-split), IndexShare
//! (GLM-5.2: shared layers reuse the previous full layer's top-k), router groups
//! (V3.2: n_group 8 / topk_group 4) and YaRN (V3.2's mscale in the softmax scale).

mod attention;
mod batch;
mod dims;
mod draft;
mod forward;
pub mod info;
pub mod load;
mod moe;
mod pick;
pub mod plan;
pub mod rope;
mod scratch;
mod session;
pub mod source;

pub use batch::BatchRow;
pub use draft::DraftStats;
pub use pick::Pick;
pub use plan::{
    free_memory, longest_ctx, plan, plan_sized, plan_summary, session_room, GpuMemory, Placement,
    Plan,
};
pub use scratch::set_prefill_chunk;
pub use session::{Logits, Session};
pub use source::ModelSource;

use crate::cache::CacheFormat;
use crate::config::Config;
#[cfg(not(target_arch = "wasm32"))]
use crate::error::Error;
use crate::error::Result;
use crate::experts::{CpuExperts, HostCopy, Offload, Policy};
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
    /// The caches' formats; `None` (`--cache-type auto`): chosen by the plan
    /// ([`plan::plan`]), and the model's sessions default to what it chose.
    pub cache: Option<CacheFormat>,
    pub policy: Policy,
    /// Upload the next layer's predicted experts ahead (see [`crate::experts`]).
    pub prefetch: bool,
    /// Where decode steps' missed experts run, and the CPU's threads (0: one per logical
    /// CPU).
    pub cpu: CpuExperts,
    pub cpu_threads: usize,
    /// How the expert slots are laid over the MoE layers.
    pub placement: Placement,
    /// Whether the offloaded experts also get a copy in host memory for the GPU to copy
    /// slots from (see [`crate::experts::HostCopy`]).
    pub host_copy: HostCopy,
    /// Whether the embedding table lives in host memory, where the kernels read the few rows
    /// a step needs over the bus (`--host-embeddings`; `Auto`: where the plan offloads
    /// experts, on the terms of [`HostCopy::wanted`]): its GPU bytes become expert slots.
    pub host_embeddings: HostCopy,
}

/// A model on the GPU. Cloning is cheap (the weights are shared): every [`Session`] holds a
/// clone, so a session needs no borrow and lives as long as its owner wants (the browser
/// keeps one between JavaScript calls).
#[derive(Clone)]
pub struct Model(Arc<Loaded>);

/// What a [`Model`] holds (its fields are reached through the model: `model.config`).
pub struct Loaded {
    pub config: Config,
    pub gpu: Arc<Gpu>,
    pub weights: load::Weights,
    /// Where the GPU memory went, when loaded under a `--gpu-memory` budget.
    pub plan: Option<Plan>,
    /// The routed-expert cache when that budget streams experts.
    pub offload: Option<Offload>,
    /// How logs and errors name the model (its directory, or the built-in model's name).
    pub label: String,
}

impl std::ops::Deref for Model {
    type Target = Loaded;
    fn deref(&self) -> &Loaded {
        &self.0
    }
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
        Self::from_source_within(src, gpu, progress, None)
    }

    /// [`Model::from_source`] within a GPU memory budget: the routed experts that do not fit
    /// stay in the files and stream through a cache (see [`crate::experts`]). `None` loads
    /// everything.
    pub fn from_source_within(
        src: &ModelSource,
        gpu: Arc<Gpu>,
        progress: load::Progress,
        budget: Option<&Budget>,
    ) -> Result<Model> {
        let label = src.label.clone();
        Self::from_parts_within(
            src.config.clone(),
            &src.weights,
            gpu,
            label,
            progress,
            budget,
        )
    }

    pub fn from_parts(
        config: Config,
        files: &WeightFiles,
        gpu: Arc<Gpu>,
        label: String,
        progress: load::Progress,
    ) -> Result<Model> {
        Self::from_parts_within(config, files, gpu, label, progress, None)
    }

    fn from_parts_within(
        mut config: Config,
        files: &WeightFiles,
        gpu: Arc<Gpu>,
        label: String,
        progress: load::Progress,
        budget: Option<&Budget>,
    ) -> Result<Model> {
        let plan = match budget {
            Some(b) => Some(Self::plan_for(&config, files, &gpu, b)?),
            None => None,
        };
        let streamed = plan.as_ref().map(|p| &p.slots).filter(|s| s.offloads());
        let slots = streamed.map(|s| s.per_layer.as_slice());
        let host_embed = plan.as_ref().is_some_and(|p| p.host_embed > 0);
        let weights = load::load(&gpu, &config, files, progress, slots, host_embed)?;
        // What runs is what was loaded: no MTP layer, no caches for one.
        config.keep_mtp(weights.mtp.is_some());
        // Submit the last writes and wait, so that their staging memory is freed now: what
        // is live after loading is what the weights take (sessions are sized from it).
        gpu.submit([]);
        gpu.sync()?;
        files.check_unchanged()?;
        let mut offload = match (streamed, budget) {
            (Some(s), Some(b)) => Some(Offload::new(
                s.clone(),
                b.policy,
                b.prefetch,
                files.clone(),
                b.cpu,
                b.cpu_threads,
                gpu.adapter.is_cpu(),
            )?),
            _ => None,
        };
        if let (Some(off), Some(b)) = (&mut offload, budget) {
            let layers: Vec<_> = weights
                .layers
                .iter()
                .enumerate()
                .filter_map(|(i, l)| match &l.mlp {
                    load::Mlp::Moe(m) if off.offloaded(i) => {
                        m.source.as_ref().map(|s| (i, s, &m.gate_up, &m.down))
                    }
                    _ => None,
                })
                .collect();
            #[cfg(not(target_arch = "wasm32"))]
            let t0 = std::time::Instant::now();
            let held = off.make_host_copy(&gpu, b.host_copy, &layers)?;
            #[cfg(not(target_arch = "wasm32"))]
            if held > 0 {
                let (rate, start) = off.host_copy_rate().unwrap_or_default();
                log::info!(
                    "the offloaded experts' host copy: {:.1} GiB of host memory, made in {:.1} s, copied to the GPU at {:.1} GB/s ({:.0} µs a round besides)",
                    held as f64 / (1u64 << 30) as f64,
                    t0.elapsed().as_secs_f64(),
                    rate / 1e9,
                    start * 1e6
                );
            }
            #[cfg(target_arch = "wasm32")]
            let _ = held;
        }
        if let Some(off) = &offload {
            // The experts the CPU may read: their pages faulted in ahead, in the background.
            let sources = weights
                .layers
                .iter()
                .enumerate()
                .filter_map(|(i, l)| match &l.mlp {
                    load::Mlp::Moe(m) if off.offloaded(i) => {
                        let src = m.source.clone()?;
                        Some((src, m.gate_up.format, m.down.format))
                    }
                    _ => None,
                });
            off.prefault(sources.collect());
        }
        Ok(Model(Arc::new(Loaded {
            config,
            gpu,
            weights,
            plan,
            offload,
            label,
        })))
    }

    /// The plan for `budget` on `gpu`, the embedding table in host memory where
    /// `--host-embeddings` says so (`Auto`: where the plan with it on the GPU offloads
    /// experts).
    fn plan_for(config: &Config, files: &WeightFiles, gpu: &Gpu, b: &Budget) -> Result<Plan> {
        let bytes = b.memory.bytes(gpu.memory_size())?;
        let s = info::summarize(config, files)?;
        let sized = |s: &info::Summary| {
            plan::plan_sized(config, s, bytes, b.ctx, gpu.max_binding(), b.cache)
        };
        // Where the LM head is the embedding table, every step reads all of it.
        let tied = load::lm_head_is_table(config, files);
        let mode = b.host_embeddings;
        let host_ok = mode.wanted(gpu, s.embed_bytes);
        let p = plan::placing_embeddings(&s, tied, mode, host_ok, sized)?.placed(b.placement);
        log::info!("{}", p.describe());
        Ok(p)
    }

    /// Start a conversation with caches for `max_ctx` tokens in the default formats.
    pub fn session(&self, max_ctx: usize) -> Result<Session> {
        Session::new(self, max_ctx)
    }

    /// Start a conversation with caches for `max_ctx` tokens in `cache`'s formats.
    pub fn session_in(&self, max_ctx: usize, cache: CacheFormat) -> Result<Session> {
        Session::open(self, max_ctx, false, cache)
    }

    /// [`Model::session_in`] for one of several sessions that share the GPU (a server's
    /// slots when their caches are not pooled): prefill chunks of the narrower default, as
    /// the pooled slots have.
    pub fn slot_session(&self, max_ctx: usize, cache: CacheFormat) -> Result<Session> {
        Session::open_in(self, max_ctx, false, cache, false)
    }

    /// `n` sessions of up to `max_ctx` positions whose caches are regions of one pool,
    /// allocated now, so their decode steps can run as one ([`Session::step_batch`]); `None`
    /// when a layer's pool would not fit one storage binding.
    pub fn pooled_sessions(
        &self,
        max_ctx: usize,
        cache: CacheFormat,
        n: usize,
    ) -> Result<Option<Vec<Session>>> {
        let Some(pool) = crate::cache::Caches::pool(&self.gpu, &self.config, max_ctx, n, cache)?
        else {
            return Ok(None);
        };
        let sessions = pool
            .into_iter()
            .map(|caches| Session::with_caches(self, caches, false, false))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(sessions))
    }

    /// The cache formats a session of `ctx` positions gets unless told otherwise: the ones
    /// the `--gpu-memory` plan reserved room for (when `ctx` is within its context), else
    /// [`CacheFormat::auto`] with [`Model::cache_room`].
    pub fn default_cache(&self, ctx: usize) -> CacheFormat {
        match &self.plan {
            Some(p) if ctx <= p.ctx => p.cache,
            _ => CacheFormat::auto(&self.config, ctx, self.cache_room(ctx)),
        }
    }

    /// GPU bytes left for a session's caches and scratch: the adapter's
    /// [`plan::free_memory`] (85 % of its memory size less what is allocated now); under a
    /// `--gpu-memory` plan, at least what the plan reserved for them.
    /// [`plan::session_room`] estimates it before loading.
    pub fn session_room(&self) -> u64 {
        plan::free_memory(&self.gpu).max(self.plan.as_ref().map_or(0, |p| p.session_bytes))
    }

    /// GPU bytes left for the caches of a session of `ctx` positions: [`Model::session_room`]
    /// less the session's scratch.
    pub fn cache_room(&self, ctx: usize) -> u64 {
        self.session_room().saturating_sub(Session::scratch_bytes(
            &self.config,
            ctx,
            self.gpu.max_binding(),
            self.streams_chunks(),
        ))
    }

    /// Whether sessions prefill in the larger chunks of streamed experts: the plan
    /// offloads experts and reserved the scratch for them ([`plan::plan_sized`]).
    pub fn streams_chunks(&self) -> bool {
        self.plan.as_ref().is_some_and(|p| p.streamed_chunks)
    }

    /// The longest context, at most `cap`, whose caches in `format` a session could open now
    /// ([`plan::longest_ctx`] with [`Model::session_room`]).
    pub fn longest_ctx(&self, format: CacheFormat, cap: usize) -> usize {
        plan::longest_ctx(
            &self.config,
            format,
            self.session_room(),
            self.gpu.max_binding(),
            cap,
        )
    }
}
