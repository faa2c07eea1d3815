//! A conversation on the GPU: its caches, scratch and position, and the entry points that
//! run tokens through the model (`forward.rs` holds the pass itself).
//!
//! - [`Session::forward`] / [`Session::forward_async`]: tokens in, logits back (prefill in
//!   chunks; the logits of every token or of the last one).
//! - [`Session::forward_pick`] / [`Session::step_pick`] / [`Session::picked_token`]: the
//!   token is picked on the GPU (`pick.rs`) and becomes the next step's input there, so a
//!   decode step can be queued before the previous one's token is read.

use super::dims::Dims;
use super::pick::Pick;
use super::rope::RopeTable;
use super::scratch::{Scratch, Shape};
use super::Model;
use crate::cache::{CacheFormat, Caches};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::gpu::Recorder;
use crate::kernels::cache::{self, Source};
use crate::kernels::{spec, Causal};

/// Logits of the rows asked for, row-major `[rows, vocab]`.
pub struct Logits {
    pub rows: usize,
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.vocab..(r + 1) * self.vocab]
    }
    pub fn last(&self) -> &[f32] {
        self.row(self.rows - 1)
    }
}

/// The tokens a chunk runs: from the host, or the one token the previous pick left in
/// `ids` on the GPU.
#[derive(Clone, Copy)]
pub(super) enum Input<'a> {
    Host(&'a [u32]),
    Previous,
    /// This many tokens already in `ids` (host-written or picked on the GPU: a speculative
    /// round's `[next, drafts]`).
    OnGpu(usize),
}

impl Input<'_> {
    /// The chunk's rows.
    pub(super) fn rows(&self) -> usize {
        match self {
            Input::Host(tokens) => tokens.len(),
            Input::Previous => 1,
            Input::OnGpu(t) => *t,
        }
    }
}

/// Where a chunk's first row sits.
#[derive(Clone, Copy, Debug)]
pub(super) enum At {
    /// At this position, known to the host.
    Host(usize),
    /// At the next round's first position, which the GPU rounds' state holds
    /// ([`spec::POS`]), plus `offset` (draft.rs): the host knows only `most`, a bound on
    /// it, and sizes the chunk's work for that.
    Gpu { offset: u32, most: usize },
    /// At the positions the chunk recorded before it placed, which had as many rows from
    /// the same first position (its places and RoPE rows are still in the scratch): a GPU
    /// round's MTP pass over the rows its verification placed. No dispatch of its own.
    Placed { most: usize },
}

impl At {
    /// The first row's position, or the host's bound on it.
    pub(super) fn most(self) -> usize {
        match self {
            At::Host(p) => p,
            At::Gpu { most, .. } | At::Placed { most } => most,
        }
    }
}

/// One conversation: its caches, scratch and position.
pub struct Session {
    pub model: Model,
    pub caches: Caches,
    /// Tokens already in the caches.
    pub pos: usize,
    /// Rows per prefill chunk.
    pub chunk: usize,
    /// Rows whose logits the scratch holds (see [`Session::logit_room`]).
    logit_rows: usize,
    /// Positions attended per query: `min(index_topk, max_ctx)`, or `max_ctx` when dense.
    pub(super) topk: usize,
    /// Attention over every cached position (no indexer): the baseline DSA is measured
    /// against.
    pub(super) dense: bool,
    pub(super) rope: RopeTable,
    pub(super) dims: Dims,
    pub(super) s: Scratch,
    /// The submission that writes each pick slot's token, until it is read.
    pub(super) pending: [Option<wgpu::SubmissionIndex>; 2],
    /// Draft tokens per step with the MTP layer (draft.rs; 0: off), and what they did.
    pub(super) drafts: usize,
    pub(super) draft_stats: super::draft::DraftStats,
    /// Where a verification's logits and drafts are copied to be read back (draft.rs).
    pub(super) verify_out: Option<wgpu::Buffer>,
    /// The state of greedy rounds queued without waiting (draft.rs), made on first use.
    pub(super) rounds: Option<super::draft::GpuRounds>,
    /// The indexer scores and selects even where every position fits the selection
    /// ([`Session::warm_decode`] compiles its kernels with a short context).
    pub(super) warm_indexer: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        // The cached bind groups hold this session's caches and scratch.
        self.model.gpu.clear_bind_groups();
    }
}

/// Positions are u32 on the GPU.
fn check_ctx(max_ctx: usize) -> Result<()> {
    if max_ctx == 0 {
        return Err(Error::msg("--ctx must be at least 1"));
    }
    if u32::try_from(max_ctx).is_err() {
        return Err(Error::msg(format!(
            "--ctx {max_ctx}: more positions than the GPU kernels index ({})",
            u32::MAX
        )));
    }
    Ok(())
}

/// Whether a session of its own prefills in the wide chunks: not under a `--gpu-memory` plan
/// (`planned`; one that streams experts has them already), and only where the GPU memory
/// left (`room`, after the narrower scratch) holds the full context's caches (`caches`
/// bytes) and the wide scratch's `extra` bytes.
fn wide_chunks(planned: bool, caches: u64, extra: u64, room: u64) -> bool {
    !planned && caches.saturating_add(extra) <= room
}

impl Session {
    /// A session for up to `max_ctx` tokens with the model's default cache formats
    /// ([`Model::default_cache`]).
    pub fn new(model: &Model, max_ctx: usize) -> Result<Session> {
        check_ctx(max_ctx)?;
        Self::open(model, max_ctx, false, model.default_cache(max_ctx))
    }

    /// A session whose attention reads every cached position when `dense` (the indexer and
    /// top-k are skipped), else the indexer's top-k; caches in `cache`'s formats. The
    /// caches grow with the conversation (see [`crate::cache`]).
    pub fn open(model: &Model, max_ctx: usize, dense: bool, cache: CacheFormat) -> Result<Session> {
        Self::open_in(model, max_ctx, dense, cache, true)
    }

    /// [`Session::open`]; `alone`: no other session shares the GPU memory left, so this one
    /// may take the wide prefill chunks (a server's slots are not alone).
    pub(super) fn open_in(
        model: &Model,
        max_ctx: usize,
        dense: bool,
        cache: CacheFormat,
        alone: bool,
    ) -> Result<Session> {
        let cfg = &model.config;
        let gpu = &*model.gpu;
        check_ctx(max_ctx)?;
        // The caches grow as the conversation does; refuse a context whose caches could
        // never fit now rather than fail when it gets there.
        let per_token = Caches::bytes_per_token(cfg, cache);
        let need = per_token.saturating_mul(max_ctx as u64);
        let room = model.cache_room(max_ctx);
        if need > room {
            return Err(Error::msg(format!(
                "--ctx {max_ctx}: its caches ({per_token} B per token in {}) take {}, more than the {} of GPU memory left on {} (out of GPU memory); use a smaller --ctx{}",
                cache.name(),
                super::plan::gib(need),
                super::plan::gib(room),
                gpu.adapter.name,
                if cache == CacheFormat::SMALLEST { "" } else { " or --cache-type fp8/i8" }
            )));
        }
        // A session of its own prefills a large resident model in the wider chunks where the
        // memory left holds their larger scratch beside the full context's caches (about
        // 1.8 GB more for GLM-5's shapes; +6.7-6.9 % prefill at full depth on an H100:
        // BENCHMARKS.md, "2026-12-06 (fourth session)"). A server's slots keep the narrower
        // ones, pooled or not (each has a scratch of its own: `alone` is false for them), and
        // so does a --gpu-memory plan that keeps every expert (its budget counted them).
        let scratch = |wide| Self::scratch_bytes(cfg, max_ctx, gpu.max_binding(), wide);
        let extra = scratch(true).saturating_sub(scratch(model.streams_chunks()));
        let wide = alone && wide_chunks(model.plan.is_some(), need, extra, room);
        let caches = Caches::new(gpu, cfg, max_ctx, cache)?;
        Self::with_caches(model, caches, dense, wide)
    }

    /// A session over `caches` (its own, or a region of a pool); `wide`: prefill chunks of
    /// [`super::scratch::WIDE_CHUNK_ROWS`] for a large model, as where experts stream.
    pub(super) fn with_caches(
        model: &Model,
        caches: Caches,
        dense: bool,
        wide: bool,
    ) -> Result<Session> {
        let (cfg, gpu) = (&model.config, &*model.gpu);
        let max_ctx = caches.max_ctx;
        check_ctx(max_ctx)?;
        let shape = Shape::new(
            cfg,
            max_ctx,
            dense,
            gpu.max_binding(),
            model.streams_chunks() || wide,
        );
        let s = Scratch::new(gpu, &shape)?;
        gpu.check()?;
        Ok(Session {
            model: model.clone(),
            caches,
            pos: 0,
            chunk: shape.c,
            logit_rows: shape.logits,
            topk: shape.sel,
            dense,
            rope: RopeTable::new(cfg),
            dims: Dims::of(cfg),
            s,
            pending: [None, None],
            drafts: 0,
            draft_stats: Default::default(),
            verify_out: None,
            rounds: None,
            warm_indexer: false,
        })
    }

    /// GPU bytes a session's scratch takes (the planner places them before the experts);
    /// `wide`: with the wide prefill chunks (a model whose experts stream, or a session of its
    /// own with the room).
    pub fn scratch_bytes(cfg: &Config, max_ctx: usize, max_binding: u64, wide: bool) -> u64 {
        Scratch::bytes(&Shape::new(cfg, max_ctx, false, max_binding, wide))
    }

    /// Rows whose logits one forward can leave: a verification's k + 1 rows, a batched
    /// step's sessions, the rows of a chunk that wants every row's. At most `chunk`, which
    /// callers may lower.
    pub(super) fn logit_room(&self) -> usize {
        self.chunk.min(self.logit_rows)
    }

    pub fn max_ctx(&self) -> usize {
        self.caches.max_ctx
    }

    /// Whether attention reads every cached position.
    pub fn is_dense(&self) -> bool {
        self.dense
    }

    /// Fill the caches of positions `0 .. len` with seeded pseudo-random unit-variance values
    /// and continue from `len`, so a decode step at a long context can be measured without
    /// prefilling it. The values are not what the model would compute; only for benchmarks.
    pub fn fill_synthetic(&mut self, len: usize, seed: u32) -> Result<()> {
        let cfg = &self.model.config;
        if len > self.max_ctx() {
            return Err(Error::msg(format!(
                "synthetic fill of {len} positions exceeds --ctx {}",
                self.max_ctx()
            )));
        }
        let gpu = &*self.model.gpu;
        let (kl, dr) = (cfg.kv_lora_rank as u32, cfg.qk_rope_head_dim as u32);
        let id = cfg.index_head_dim as u32;
        self.caches.reserve(gpu, len)?;
        let mut rec = gpu.recorder();
        // Cache rows lo .. lo + len (a pooled session's region).
        let (lo, n) = (self.caches.lo() as u32, len as u32);
        for i in 0..cfg.num_hidden_layers {
            let seed = seed ^ (2 * i as u32);
            let latent = self.caches.latent(i, len);
            cache::store_latent(&mut rec, Source::Random(seed), &latent, (lo, n), (kl, dr));
            if let Some(keys) = self.caches.keys(i, len) {
                cache::store_keys(&mut rec, Source::Random(seed ^ 1), &keys, (lo, n), id);
            }
        }
        rec.finish()?;
        self.pos = len;
        Ok(())
    }

    /// Forget the conversation (the caches are overwritten from position 0).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Roll back to `pos` tokens (e.g. to reuse a shared prefix).
    pub fn truncate(&mut self, pos: usize) {
        self.pos = self.pos.min(pos);
    }

    /// Run `tokens` through the model at positions `pos ..`, appending them to the caches.
    /// Returns the logits of every token (`all_logits`) or of the last one.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward(&mut self, tokens: &[u32], all_logits: bool) -> Result<Logits> {
        pollster::block_on(self.forward_async(tokens, all_logits))
    }

    /// [`Session::forward`] for every platform: the browser cannot block on the logits'
    /// readback, so it awaits it (natively the future is ready at once).
    pub async fn forward_async(&mut self, tokens: &[u32], all_logits: bool) -> Result<Logits> {
        self.check_tokens(tokens)?;
        let vocab = self.model.config.vocab_size;
        let mut data = Vec::with_capacity(if all_logits {
            tokens.len() * vocab
        } else {
            vocab
        });
        let mut rows = 0;
        let chunk = if all_logits {
            self.logit_room()
        } else {
            self.chunk
        };
        for part in tokens.chunks(chunk) {
            let last = rows + part.len() == tokens.len();
            let want = if all_logits {
                part.len()
            } else if last {
                1
            } else {
                0
            };
            self.chunk_forward(Input::Host(part), want, None, false, true)?;
            if want > 0 {
                let gpu = &self.model.gpu;
                data.extend(gpu.read_f32_async(&self.s.logits, 0, want * vocab).await?);
            }
            rows += part.len();
        }
        let rows = if all_logits { tokens.len() } else { 1 };
        Ok(Logits { rows, vocab, data })
    }

    /// Refuses an empty input, one that overflows the context, and ids past the vocabulary.
    pub(super) fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let cfg = &self.model.config;
        if tokens.is_empty() {
            return Err(Error::msg("empty prompt: at least one token is needed"));
        }
        if self.pos + tokens.len() > self.max_ctx() {
            return Err(Error::msg(format!(
                "context full: {} cached + {} new tokens exceed --ctx {}",
                self.pos,
                tokens.len(),
                self.max_ctx()
            )));
        }
        if let Some(t) = tokens.iter().find(|t| **t as usize >= cfg.vocab_size) {
            return Err(Error::msg(format!(
                "token id {t} is out of range (vocab_size {})",
                cfg.vocab_size
            )));
        }
        Ok(())
    }

    /// Runs `tokens` like [`Session::forward`] but keeps the logits on the GPU. With a
    /// `pick`, the last token's logits choose the next token there: it becomes the input of
    /// the next [`Session::step_pick`] and is copied to `slot` (0 or 1) for
    /// [`Session::picked_token`]. Waits for the GPU only where an MoE layer streams its
    /// experts (see `forward.rs`).
    pub fn forward_pick(&mut self, tokens: &[u32], pick: Option<(usize, &Pick)>) -> Result<()> {
        self.check_tokens(tokens)?;
        let n = tokens.len().div_ceil(self.chunk);
        for (i, part) in tokens.chunks(self.chunk).enumerate() {
            let last = pick.filter(|_| i + 1 == n);
            let want = usize::from(last.is_some());
            self.chunk_forward(Input::Host(part), want, last, false, true)?;
        }
        Ok(())
    }

    /// One decode step on the token the previous pick left on the GPU (which need not have
    /// finished): `pick` chooses the next one, which goes to `slot`.
    pub fn step_pick(&mut self, slot: usize, pick: &Pick) -> Result<()> {
        self.check_step()?;
        self.chunk_forward(Input::Previous, 1, Some((slot, pick)), false, false)
    }

    /// Refuses a decode step when the caches hold `--ctx` tokens already.
    pub(super) fn check_step(&self) -> Result<()> {
        if self.pos >= self.max_ctx() {
            return Err(Error::msg(format!(
                "context full: {} cached tokens fill --ctx {}",
                self.pos,
                self.max_ctx()
            )));
        }
        Ok(())
    }

    /// The chunk of `t` rows from `at` in this session, placed for the forward `rec`
    /// records: by the host ([`Session::place_rows`]), or on the GPU from the rounds' state
    /// (draft.rs), over as many keys as the host's bound on the position allows.
    pub(super) fn place(&self, rec: &mut Recorder, at: At, t: usize) -> Causal<'_> {
        let lo = self.caches.lo();
        match at {
            At::Host(pos0) => {
                let rows: Vec<(usize, usize)> = (pos0..pos0 + t).map(|p| (lo, p)).collect();
                self.place_rows(&rows)
            }
            At::Gpu { offset, most } => {
                let r = self
                    .rounds
                    .as_ref()
                    .expect("positions on the GPU need the rounds' state");
                let pos = spec::RoundPos {
                    state: &r.state,
                    field: spec::POS,
                    offset,
                };
                let (s, t) = (&self.s, t as u32);
                let table = (&r.table, r.dim, r.last);
                spec::round_places(rec, pos, t, lo as u32, &s.places, &s.cos_sin, table);
                self.placed(most, t)
            }
            At::Placed { most } => self.placed(most, t as u32),
        }
    }

    /// A chunk of `t` rows placed on the GPU in the scratch, its first at most at `most`.
    fn placed(&self, most: usize, t: u32) -> Causal<'_> {
        Causal {
            rows: t,
            n_keys: (most + t as usize) as u32,
            pos0: most as u32,
            places: Some(&self.s.places),
            one_sequence: true,
        }
    }

    /// Writes RoPE's cos/sin rows and the places of a chunk's rows (`rows`: each one's cache
    /// row of position 0 and its position, in this session's scratch) for the next recorded
    /// forward (queue order: after the submissions before it have read what was there), and
    /// returns them as the attention kernels take them.
    pub(super) fn place_rows(&self, rows: &[(usize, usize)]) -> Causal<'_> {
        let gpu = &self.model.gpu;
        let cs = self.rope.cos_sin(rows.iter().map(|r| r.1));
        gpu.write(&self.s.cos_sin, 0, bytemuck::cast_slice(&cs));
        let words: Vec<u32> = rows
            .iter()
            .flat_map(|&(lo, p)| [lo as u32, p as u32])
            .collect();
        gpu.write(&self.s.places, 0, bytemuck::cast_slice(&words));
        Causal {
            rows: rows.len() as u32,
            n_keys: rows.iter().map(|r| r.1 + 1).max().unwrap_or(0) as u32,
            pos0: rows.first().map_or(0, |r| r.1) as u32,
            places: Some(&self.s.places),
            // One lo is one session's rows, which its callers place at consecutive
            // positions (a batched step's rows each have their own lo).
            one_sequence: rows.iter().all(|r| r.0 == rows[0].0),
        }
    }

    /// The token the last pick on `slot` chose (waits for that submission only).
    pub async fn picked_token(&mut self, slot: usize) -> Result<u32> {
        let after = self.pending[slot]
            .take()
            .ok_or_else(|| Error::msg("no picked token is waiting to be read"))?;
        let gpu = &self.model.gpu;
        let b = gpu
            .read_mapped_async(&self.s.picked[slot], 4, Some(after))
            .await?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::wide_chunks;

    #[test]
    fn wide_chunks_only_where_the_memory_left_holds_them_and_no_plan() {
        let gib = 1u64 << 30;
        // Room for the caches and the wider scratch, no plan: wide.
        assert!(wide_chunks(false, 10 * gib, 2 * gib, 40 * gib));
        // Exactly enough is enough.
        assert!(wide_chunks(false, 10 * gib, 2 * gib, 12 * gib));
        // A byte short: the narrower chunks.
        assert!(!wide_chunks(false, 10 * gib, 2 * gib, 12 * gib - 1));
        // A --gpu-memory plan keeps what its budget counted, however much is free.
        assert!(!wide_chunks(true, 10 * gib, 2 * gib, 400 * gib));
        // Sizes near the top of u64 do not wrap into room.
        assert!(!wide_chunks(false, u64::MAX, 2 * gib, u64::MAX - 1));
    }
}
