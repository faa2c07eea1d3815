//! The forward pass, top to bottom, for one chunk of tokens at positions `pos .. pos + T`.
//!
//! Prefill and decode are the same code: a prompt is cut into chunks (GPU memory stays
//! bounded), decode is a chunk of one. Every layer writes its latent cache rows (and, on
//! full layers, its indexer key rows) before attending, so causal attention over the cache
//! covers the chunk itself. Attention reads only the positions that the top-k selected.

use super::load::{Layer, Mlp, SwiGlu};
use super::rope::RopeTable;
use super::Model;
use crate::cache::Caches;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::gpu::Recorder;
use crate::kernels::{
    attention, elementwise, embed, indexer, matmul, norm, rope, router, sample, topk, View,
};

/// eps of `q_a_layernorm` / `kv_a_layernorm` (transformers builds them with the default 1e-6,
/// not `rms_norm_eps`) and of the indexer's `k_norm` LayerNorm.
const LATENT_NORM_EPS: f32 = 1e-6;
const K_NORM_EPS: f32 = 1e-6;

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

/// Activations for one chunk of up to `chunk` rows.
struct Scratch {
    ids: wgpu::Buffer,
    cos_sin: wgpu::Buffer,
    h: wgpu::Buffer,
    x: wgpu::Buffer,
    tmp_h: wgpu::Buffer,
    qa_raw: wgpu::Buffer,
    qa: wgpu::Buffer,
    q: wgpu::Buffer,
    kva: wgpu::Buffer,
    q_abs: wgpu::Buffer,
    o_lat: wgpu::Buffer,
    attn: wgpu::Buffer,
    iq: wgpu::Buffer,
    ik: wgpu::Buffer,
    iw: wgpu::Buffer,
    scores: wgpu::Buffer,
    sel_idx: wgpu::Buffer,
    sel_cnt: wgpu::Buffer,
    topk_scratch: topk::TopkScratch,
    rlogits: wgpu::Buffer,
    ridx: wgpu::Buffer,
    rw: wgpu::Buffer,
    /// The expert slot of each routed pair, for layers that stream their experts (natively;
    /// the browser never streams).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    sidx: wgpu::Buffer,
    /// The next layer's predicted experts and their weights (prefetch).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pidx: wgpu::Buffer,
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pw: wgpu::Buffer,
    moe_gu: wgpu::Buffer,
    moe_act: wgpu::Buffer,
    moe_out: wgpu::Buffer,
    mlp_gu: wgpu::Buffer,
    mlp_act: wgpu::Buffer,
    logits: wgpu::Buffer,
    /// The greedy argmax's per-workgroup partials.
    argmax_part: wgpu::Buffer,
    /// GPU sampling's penalized logits and top-k.
    sample: sample::SampleScratch,
    /// Where steps that pick their token on the GPU leave it for the host (two, so one can
    /// be read while the next step writes the other).
    picked: [wgpu::Buffer; 2],
}

/// How a step picks its token on the GPU (see [`Session::forward_pick`]).
#[derive(Clone, Copy, Debug)]
pub enum Pick<'a> {
    /// The argmax of the logits.
    Argmax,
    /// The argmax after the repetition penalty on the tokens of `window`, and on the token
    /// the previous step picked when `prev` (each token once).
    PenalizedArgmax {
        penalty: f32,
        window: &'a [u32],
        prev: bool,
    },
    /// Top-k / top-p sampling with the draw `s.r`, after the penalty as above.
    Sample {
        s: sample::Sampling,
        window: &'a [u32],
        prev: bool,
    },
}

/// The tokens a chunk runs: from the host, or the one token the previous greedy step left
/// in `ids` on the GPU.
#[derive(Clone, Copy)]
enum Input<'a> {
    Host(&'a [u32]),
    Previous,
}

/// One conversation: its caches, scratch and position.
pub struct Session<'m> {
    pub model: &'m Model,
    pub caches: Caches,
    /// Tokens already in the caches.
    pub pos: usize,
    /// Rows per prefill chunk.
    pub chunk: usize,
    /// Positions attended per query: `min(index_topk, max_ctx)`, or `max_ctx` when dense.
    topk: usize,
    /// Attention over every cached position (no indexer): the baseline DSA is measured
    /// against.
    dense: bool,
    rope: RopeTable,
    s: Scratch,
    /// The submission that writes each pick slot's token, until it is read.
    pending: [Option<wgpu::SubmissionIndex>; 2],
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // The cached bind groups hold this session's caches and scratch.
        self.model.gpu.clear_bind_groups();
    }
}

impl<'m> Session<'m> {
    pub fn new(model: &'m Model, max_ctx: usize) -> Result<Session<'m>> {
        Self::with_attention(model, max_ctx, false)
    }

    /// A session whose attention reads every cached position when `dense` (the indexer and
    /// top-k are skipped), else the indexer's top-k.
    pub fn with_attention(model: &'m Model, max_ctx: usize, dense: bool) -> Result<Session<'m>> {
        let cfg = &model.config;
        let gpu = &*model.gpu;
        if max_ctx == 0 {
            return Err(Error::msg("--ctx must be at least 1"));
        }
        let caches = Caches::new(gpu, cfg, max_ctx)?;
        let c = Self::chunk_for(cfg, max_ctx, gpu.max_binding());
        let sizes = Self::scratch_sizes(cfg, max_ctx, dense, c);
        let f = |name: &'static str| {
            let n = sizes.iter().find(|z| z.0 == name).map_or(0, |z| z.1);
            gpu.buffer((n * 4) as u64, name)
        };
        let s = Scratch {
            ids: f("ids")?,
            cos_sin: f("cos_sin")?,
            h: f("h")?,
            x: f("x")?,
            tmp_h: f("tmp_h")?,
            qa_raw: f("qa_raw")?,
            qa: f("qa")?,
            q: f("q")?,
            kva: f("kva")?,
            q_abs: f("q_abs")?,
            o_lat: f("o_lat")?,
            attn: f("attn")?,
            iq: f("iq")?,
            ik: f("ik")?,
            iw: f("iw")?,
            scores: f("scores")?,
            sel_idx: f("sel_idx")?,
            sel_cnt: f("sel_cnt")?,
            topk_scratch: topk::TopkScratch::new(gpu, c as u32)?,
            rlogits: f("router logits")?,
            ridx: f("router idx")?,
            rw: f("router weights")?,
            sidx: f("expert slots")?,
            pidx: f("prefetch idx")?,
            pw: f("prefetch weights")?,
            moe_gu: f("moe gate_up")?,
            moe_act: f("moe act")?,
            moe_out: f("moe out")?,
            mlp_gu: f("mlp gate_up")?,
            mlp_act: f("mlp act")?,
            logits: f("logits")?,
            argmax_part: f("argmax partials")?,
            sample: sample::SampleScratch::new(gpu, cfg.vocab_size as u32)?,
            picked: [0, 1].map(|_| {
                gpu.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("picked token"),
                    size: 4,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            }),
        };
        gpu.check()?;
        Ok(Session {
            model,
            caches,
            pos: 0,
            chunk: c,
            topk: if dense {
                max_ctx
            } else {
                cfg.index_topk.min(max_ctx)
            },
            dense,
            rope: RopeTable::new(cfg),
            s,
            pending: [None, None],
        })
    }

    /// Rows per prefill chunk: the widest per-row scratch (scores are `[chunk, ctx]`, logits
    /// `[chunk, vocab]`, the absorbed queries `[chunk, heads * kv_lora]`, …) fits one binding.
    fn chunk_for(cfg: &Config, max_ctx: usize, max_binding: u64) -> usize {
        let lim = max_binding as usize / 4;
        let widest = [
            max_ctx,
            cfg.vocab_size,
            cfg.num_attention_heads * cfg.kv_lora_rank,
            cfg.num_experts_per_tok * 2 * cfg.moe_intermediate_size.max(1),
            cfg.num_experts_per_tok * cfg.hidden_size,
            2 * cfg.intermediate_size,
        ]
        .into_iter()
        .fold(1, usize::max);
        (lim / widest).clamp(1, 128)
    }

    /// The f32 scratch buffers of a session, by name: elements for chunks of `c` rows.
    fn scratch_sizes(
        cfg: &Config,
        max_ctx: usize,
        dense: bool,
        c: usize,
    ) -> Vec<(&'static str, usize)> {
        let (h, heads) = (cfg.hidden_size, cfg.num_attention_heads);
        let k = cfg.num_experts_per_tok;
        let mi = cfg.moe_intermediate_size.max(1);
        let inter = cfg
            .intermediate_size
            .max(cfg.moe_intermediate_size * cfg.n_shared_experts);
        let sel = if dense {
            max_ctx
        } else {
            cfg.index_topk.min(max_ctx)
        };
        vec![
            ("ids", c),
            ("cos_sin", c * cfg.qk_rope_head_dim),
            ("h", c * h),
            ("x", c * h),
            ("tmp_h", c * h),
            ("qa_raw", c * cfg.q_lora_rank),
            ("qa", c * cfg.q_lora_rank),
            ("q", c * heads * cfg.qk_head_dim()),
            ("kva", c * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)),
            ("q_abs", c * heads * cfg.kv_lora_rank),
            ("o_lat", c * heads * cfg.kv_lora_rank),
            ("attn", c * heads * cfg.v_head_dim),
            ("iq", c * cfg.index_n_heads * cfg.index_head_dim),
            ("ik", c * cfg.index_head_dim),
            ("iw", c * cfg.index_n_heads),
            ("scores", c * max_ctx),
            ("sel_idx", c * sel),
            ("sel_cnt", c),
            ("router logits", c * cfg.n_routed_experts.max(1)),
            ("router idx", c * k),
            ("router weights", c * k),
            ("expert slots", c * k),
            ("prefetch idx", c * k),
            ("prefetch weights", c * k),
            ("moe gate_up", c * k * 2 * mi),
            ("moe act", c * k * mi),
            ("moe out", c * k * h),
            ("mlp gate_up", c * 2 * inter),
            ("mlp act", c * inter),
            ("logits", c * cfg.vocab_size),
            ("argmax partials", sample::PART_WORDS as usize),
        ]
    }

    /// GPU bytes a session's scratch takes (the planner places them before the experts):
    /// the buffers of [`Session::scratch_sizes`], the sampler's and the top-k's.
    pub fn scratch_bytes(cfg: &Config, max_ctx: usize, max_binding: u64) -> u64 {
        let c = Self::chunk_for(cfg, max_ctx, max_binding);
        let f32s: usize = Self::scratch_sizes(cfg, max_ctx, false, c)
            .iter()
            .map(|z| z.1)
            .sum();
        // Sampling: a logits row, its candidates and a one-row top-k, the two picked-token
        // slots; the indexer's top-k.
        (4 * (f32s + cfg.vocab_size + sample::MAX_TOP_K as usize + 1 + 2)) as u64
            + topk::TopkScratch::bytes_for(1)
            + topk::TopkScratch::bytes_for(c as u32)
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
        let row = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) as u32;
        let id = cfg.index_head_dim as u32;
        let mut rec = gpu.recorder();
        for (i, latent) in self.caches.latent.iter().enumerate() {
            let n = len as u32;
            elementwise::fill_random(
                &mut rec,
                View::rows(latent, row),
                n,
                row,
                seed ^ (2 * i as u32),
            );
            if let Some(keys) = &self.caches.keys[i] {
                elementwise::fill_random(
                    &mut rec,
                    View::rows(keys, id),
                    n,
                    id,
                    seed ^ (2 * i as u32 + 1),
                );
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
        let cfg = &self.model.config;
        self.check_tokens(tokens)?;
        let vocab = cfg.vocab_size;
        let mut data = Vec::with_capacity(if all_logits {
            tokens.len() * vocab
        } else {
            vocab
        });
        let mut rows = 0;
        for part in tokens.chunks(self.chunk) {
            let last = rows + part.len() == tokens.len();
            let want = if all_logits {
                part.len()
            } else if last {
                1
            } else {
                0
            };
            self.chunk_forward(Input::Host(part), want, None)?;
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
    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
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
    /// [`Session::picked_token`]. Nothing waits for the GPU.
    pub fn forward_pick(&mut self, tokens: &[u32], pick: Option<(usize, &Pick)>) -> Result<()> {
        self.check_tokens(tokens)?;
        let n = tokens.len().div_ceil(self.chunk);
        for (i, part) in tokens.chunks(self.chunk).enumerate() {
            let last = pick.filter(|_| i + 1 == n);
            self.chunk_forward(Input::Host(part), usize::from(last.is_some()), last)?;
        }
        Ok(())
    }

    /// One decode step on the token the previous pick left on the GPU (which need not have
    /// finished): `pick` chooses the next one, which goes to `slot`.
    pub fn step_pick(&mut self, slot: usize, pick: &Pick) -> Result<()> {
        if self.pos >= self.max_ctx() {
            return Err(Error::msg(format!(
                "context full: {} cached tokens fill --ctx {}",
                self.pos,
                self.max_ctx()
            )));
        }
        self.chunk_forward(Input::Previous, 1, Some((slot, pick)))
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

    /// One chunk; leaves the logits of its last `want_logits` rows in `s.logits`, and with
    /// `pick` the token the last row's logits pick in `ids[0]` and that slot.
    fn chunk_forward(
        &mut self,
        input: Input,
        want_logits: usize,
        pick: Option<(usize, &Pick)>,
    ) -> Result<()> {
        let model = self.model;
        let cfg = &model.config;
        let gpu = &*model.gpu;
        let w = &model.weights;
        let s = &self.s;
        let t = match input {
            Input::Host(tokens) => {
                gpu.write(&s.ids, 0, bytemuck::cast_slice(tokens));
                tokens.len()
            }
            Input::Previous => 1,
        };
        let pos0 = self.pos as u32;
        let cs = self.rope.cos_sin(self.pos..self.pos + t);
        let t = t as u32;
        gpu.write(&s.cos_sin, 0, bytemuck::cast_slice(&cs));

        let hd = cfg.hidden_size as u32;
        let mut rec = gpu.recorder();
        // Decode steps (one token) repeat the same dispatches with the same parameter slots,
        // so their bind groups are kept and reused. A prefill's depend on its length (GEMV
        // passes, tile counts): cached, every new length added a few hundred entries that
        // stayed (host memory grew by steps in long chats), so they are made per chunk and
        // dropped with it (a few hundred, about a millisecond).
        rec.cache_bind_groups(t == 1);
        embed::embed(&mut rec, &w.embed, &s.ids, 0, t, View::rows(&s.h, hd));
        for (i, layer) in w.layers.iter().enumerate() {
            self.attention(&mut rec, i, layer, t, pos0);
            // h += MLP(RMSNorm(h))
            norm::rms_norm(
                &mut rec,
                View::rows(&s.h, hd),
                &layer.post_norm,
                View::rows(&s.x, hd),
                t,
                hd,
                cfg.rms_norm_eps,
            );
            match &layer.mlp {
                Mlp::Dense(m) => self.swiglu(&mut rec, m, t),
                Mlp::Moe(m) => {
                    let e = cfg.n_routed_experts as u32;
                    let k = cfg.num_experts_per_tok as u32;
                    let mi = cfg.moe_intermediate_size as u32;
                    matmul::matmul(
                        &mut rec,
                        View::rows(&s.x, hd),
                        &m.router,
                        View::rows(&s.rlogits, e),
                        t,
                    );
                    router::route(
                        &mut rec,
                        View::rows(&s.rlogits, e),
                        &m.bias,
                        t,
                        e,
                        cfg.n_group as u32,
                        cfg.topk_group as u32,
                        k,
                        cfg.norm_topk_prob,
                        cfg.routed_scaling_factor,
                        &s.ridx,
                        &s.rw,
                    );
                    let gu = View::rows(&s.moe_gu, 2 * mi);
                    let act = View::rows(&s.moe_act, mi);
                    let out = View::rows(&s.moe_out, hd);
                    let x = View::rows(&s.x, hd);
                    // The routed experts named by `idx` (expert ids, or slots of the cache).
                    let experts = |rec: &mut Recorder, idx: &wgpu::Buffer, n: u32| {
                        matmul::matmul_experts(rec, x, false, &m.gate_up, n, idx, k, gu, t);
                        elementwise::swiglu(rec, gu, gu.col(mi), act, t * k, mi);
                        matmul::matmul_experts(rec, act, true, &m.down, n, idx, k, out, t);
                    };
                    match (&m.source, &model.offload) {
                        (Some(src), Some(off)) => {
                            let n = (m.gate_up.rows / (2 * mi as usize)) as u32;
                            // The next layer, when it streams its experts too: prefetch.
                            let next = match w.layers.get(i + 1).map(|l| &l.mlp) {
                                Some(Mlp::Moe(nm)) if off.prefetch && t == 1 => {
                                    nm.source.as_ref().map(|ns| (&**nm, ns))
                                }
                                _ => None,
                            };
                            self.stream_experts(&mut rec, off, i, src, m, next, t, n, experts)?;
                        }
                        _ => experts(&mut rec, &s.ridx, e),
                    }
                    if let Some(sh) = &m.shared {
                        self.swiglu(&mut rec, sh, t);
                    }
                    elementwise::moe_combine(&mut rec, out, &s.rw, k, View::rows(&s.h, hd), t, hd);
                }
            }
        }
        if want_logits > 0 {
            let first = t - want_logits as u32;
            norm::rms_norm(
                &mut rec,
                View::rows(&s.h, hd).row(first),
                &w.norm,
                View::rows(&s.x, hd),
                want_logits as u32,
                hd,
                cfg.rms_norm_eps,
            );
            let head = w.lm_head.as_ref().unwrap_or(&w.embed);
            matmul::matmul(
                &mut rec,
                View::rows(&s.x, hd),
                head,
                View::rows(&s.logits, cfg.vocab_size as u32),
                want_logits as u32,
            );
            if let Some((slot, pick)) = pick {
                let vocab = cfg.vocab_size as u32;
                let last = View::rows(&s.logits, vocab).row(want_logits as u32 - 1);
                self.record_pick(&mut rec, last, pick)?;
                rec.copy(&s.ids, 0, &s.picked[slot], 0, 4);
            }
        }
        // Submitted without waiting: the logits readback (or the next chunk) is ordered
        // after it and waits; validation errors surface here or at that wait.
        drop(rec);
        if let Some((slot, _)) = pick {
            self.pending[slot] = gpu.last_submission();
        }
        gpu.check()?;
        if let Some(off) = &model.offload {
            off.check_files()?;
        }
        self.pos += t as usize;
        Ok(())
    }

    /// Layer `i`'s routed experts from the expert cache: wait for the router's choices,
    /// upload what is missing into the `n` slots, and run `experts` over the slot table, in as
    /// many rounds as the cache needs (see [`crate::experts`]).
    #[allow(clippy::too_many_arguments)]
    fn stream_experts(
        &self,
        rec: &mut Recorder,
        off: &crate::experts::Offload,
        i: usize,
        src: &crate::experts::ExpertSource,
        m: &super::load::Moe,
        next: Option<(&super::load::Moe, &crate::experts::ExpertSource)>,
        t: u32,
        n: u32,
        experts: impl Fn(&mut Recorder, &wgpu::Buffer, u32),
    ) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let gpu = &*self.model.gpu;
            let cfg = &self.model.config;
            let s = &self.s;
            let k = cfg.num_experts_per_tok;
            if let Some((nm, _)) = next {
                // The next layer's router on this layer's input predicts its choices.
                let (hd, e) = (cfg.hidden_size as u32, cfg.n_routed_experts as u32);
                let logits = View::rows(&s.rlogits, e);
                matmul::matmul(rec, View::rows(&s.x, hd), &nm.router, logits, t);
                router::route(
                    rec,
                    logits,
                    &nm.bias,
                    t,
                    e,
                    cfg.n_group as u32,
                    cfg.topk_group as u32,
                    k as u32,
                    cfg.norm_topk_prob,
                    cfg.routed_scaling_factor,
                    &s.pidx,
                    &s.pw,
                );
            }
            rec.flush();
            let t0 = std::time::Instant::now();
            let ids = gpu.read_u32(&s.ridx, 0, t as usize * k)?;
            // Read while the GPU is idle anyway (a read waits for everything queued).
            let predicted = match next {
                Some(_) => Some(gpu.read_u32(&s.pidx, 0, t as usize * k)?),
                None => None,
            };
            let first = off.first_layer() == Some(i);
            off.count_sync(t as usize, t0.elapsed().as_secs_f64(), first);
            off.serve(gpu, i, src, ids, t as usize, &m.gate_up, &m.down, |slots| {
                gpu.write(&s.sidx, 0, bytemuck::cast_slice(slots));
                experts(rec, &s.sidx, n);
                rec.flush();
                Ok(())
            })?;
            // Staged while the GPU runs this layer's experts and the next layer's attention.
            if let (Some((nm, ns)), Some(p)) = (next, predicted) {
                off.prefetch(gpu, i + 1, ns, p, &nm.gate_up, &nm.down)?;
            }
            Ok(())
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = (rec, off, i, src, m, next, t, n, experts);
            Err(Error::msg(
                "expert offloading needs to wait for the GPU mid-step, which the browser cannot",
            ))
        }
    }

    /// Records `pick` over the logits row `last`; the token goes to `ids[0]`.
    fn record_pick(&self, rec: &mut Recorder, last: View, pick: &Pick) -> Result<()> {
        let s = &self.s;
        let gpu = &*self.model.gpu;
        let vocab = self.model.config.vocab_size as u32;
        // The penalty window, written ahead of the submission (queue order keeps the
        // previous step's reads of it first).
        let window = |w: &[u32]| -> Result<wgpu::Buffer> {
            let buf = gpu.scratch("sample window", 4 * w.len().max(1) as u64)?;
            gpu.write(&buf, 0, bytemuck::cast_slice(w));
            Ok(buf)
        };
        match *pick {
            Pick::Argmax => sample::argmax(rec, last, vocab, &s.argmax_part, &s.ids, 0),
            Pick::PenalizedArgmax {
                penalty,
                window: w,
                prev,
            } => {
                let wb = window(w)?;
                let wl = w.len() as u32;
                sample::argmax_penalized(
                    rec,
                    last,
                    vocab,
                    penalty,
                    &wb,
                    wl,
                    prev,
                    &s.ids,
                    0,
                    &s.sample,
                    &s.argmax_part,
                );
            }
            Pick::Sample {
                s: smp,
                window: w,
                prev,
            } => {
                let wb = window(w)?;
                let wl = w.len() as u32;
                sample::sample(rec, last, vocab, &smp, &wb, wl, prev, &s.ids, 0, &s.sample);
            }
        }
        Ok(())
    }

    /// `h += down(silu(gate(x)) * up(x))` for a dense MLP or the shared expert.
    fn swiglu(&self, rec: &mut Recorder, m: &SwiGlu, t: u32) {
        let s = &self.s;
        let hd = self.model.config.hidden_size as u32;
        let i = m.inter as u32;
        let gu = View::rows(&s.mlp_gu, 2 * i);
        matmul::matmul(rec, View::rows(&s.x, hd), &m.gate_up, gu, t);
        elementwise::swiglu(rec, gu, gu.col(i), View::rows(&s.mlp_act, i), t, i);
        matmul::matmul(
            rec,
            View::rows(&s.mlp_act, i),
            &m.down,
            View::rows(&s.tmp_h, hd),
            t,
        );
        elementwise::add(rec, View::rows(&s.tmp_h, hd), View::rows(&s.h, hd), t, hd);
    }

    /// `h += o_proj(SparseMLA(RMSNorm(h)))`, selecting positions with this layer's indexer
    /// (full layers) or the previous full layer's selection (IndexShare layers).
    fn attention(&self, rec: &mut Recorder, i: usize, layer: &Layer, t: u32, pos0: u32) {
        let cfg = &self.model.config;
        let s = &self.s;
        let hd = cfg.hidden_size as u32;
        let heads = cfg.num_attention_heads as u32;
        let (dn, dr, dv) = (
            cfg.qk_nope_head_dim as u32,
            cfg.qk_rope_head_dim as u32,
            cfg.v_head_dim as u32,
        );
        let (ql, kl) = (cfg.q_lora_rank as u32, cfg.kv_lora_rank as u32);
        let qk = dn + dr;
        let row = kl + dr;
        let latent = View::new(&self.caches.latent[i], pos0 * row, row);

        norm::rms_norm(
            rec,
            View::rows(&s.h, hd),
            &layer.input_norm,
            View::rows(&s.x, hd),
            t,
            hd,
            cfg.rms_norm_eps,
        );
        let x = View::rows(&s.x, hd);
        // Queries: q_resid = RMSNorm(x·W_qa), q = q_resid·W_qb, RoPE on the last dr dims per head.
        matmul::matmul(rec, x, &layer.q_a, View::rows(&s.qa_raw, ql), t);
        norm::rms_norm(
            rec,
            View::rows(&s.qa_raw, ql),
            &layer.q_a_norm,
            View::rows(&s.qa, ql),
            t,
            ql,
            LATENT_NORM_EPS,
        );
        let qa = View::rows(&s.qa, ql);
        let q = View::rows(&s.q, heads * qk);
        matmul::matmul(rec, qa, &layer.q_b, q, t);
        rope::rope(
            rec,
            None,
            q,
            t,
            heads,
            qk,
            dn,
            dr,
            cfg.mla_rope_interleave,
            &s.cos_sin,
        );
        // Latent cache rows: [RMSNorm(c_kv) | RoPE(k_pe)].
        let kva = View::rows(&s.kva, row);
        matmul::matmul(rec, x, &layer.kv_a, kva, t);
        norm::rms_norm(rec, kva, &layer.kv_a_norm, latent, t, kl, LATENT_NORM_EPS);
        rope::rope(
            rec,
            Some(kva.col(kl)),
            latent.col(kl),
            t,
            1,
            row,
            0,
            dr,
            cfg.mla_rope_interleave,
            &s.cos_sin,
        );

        // Top-k selection.
        let k = self.topk as u32;
        if let Some(ix) = &layer.indexer {
            let (ih, id) = (cfg.index_n_heads as u32, cfg.index_head_dim as u32);
            let keys = self.caches.keys[i]
                .as_ref()
                .expect("full layer has a key cache");
            let key_rows = View::new(keys, pos0 * id, id);
            matmul::matmul(rec, qa, &ix.wq_b, View::rows(&s.iq, ih * id), t);
            rope::rope(
                rec,
                None,
                View::rows(&s.iq, ih * id),
                t,
                ih,
                id,
                0,
                dr,
                cfg.indexer_rope_interleave,
                &s.cos_sin,
            );
            matmul::matmul(rec, x, &ix.wk, View::rows(&s.ik, id), t);
            norm::layer_norm(
                rec,
                View::rows(&s.ik, id),
                &ix.k_norm_w,
                &ix.k_norm_b,
                key_rows,
                t,
                id,
                K_NORM_EPS,
            );
            rope::rope(
                rec,
                None,
                key_rows,
                t,
                1,
                id,
                0,
                dr,
                cfg.indexer_rope_interleave,
                &s.cos_sin,
            );
            let n_keys = pos0 + t;
            if n_keys <= k {
                topk::select_all(rec, t, pos0, k, &s.sel_idx, &s.sel_cnt);
            } else {
                matmul::matmul(rec, x, &ix.weights_proj, View::rows(&s.iw, ih), t);
                let scores = View::rows(&s.scores, n_keys);
                indexer::indexer_scores(
                    rec,
                    View::rows(&s.iq, ih * id),
                    View::rows(&s.iw, ih),
                    View::rows(keys, id),
                    scores,
                    t,
                    ih,
                    id,
                    n_keys,
                    pos0,
                    (ih as f32).powf(-0.5),
                    (id as f32).powf(-0.5),
                );
                topk::topk(
                    rec,
                    scores,
                    t,
                    n_keys,
                    pos0,
                    k,
                    &s.sel_idx,
                    &s.sel_cnt,
                    &s.topk_scratch,
                );
            }
        }
        // Shared layers keep s.sel_idx / s.sel_cnt from the last full layer of this chunk.

        // Absorbed sparse MLA over the selected latent rows.
        let q_abs = View::rows(&s.q_abs, heads * kl);
        let o_lat = View::rows(&s.o_lat, heads * kl);
        attention::absorb_q(rec, q, &layer.kv_b, q_abs, t, heads, dn, dr, dv);
        attention::sparse_mla(
            rec,
            q_abs,
            q,
            View::rows(&self.caches.latent[i], row),
            &s.sel_idx,
            &s.sel_cnt,
            k,
            k.min(pos0 + t),
            o_lat,
            t,
            heads,
            dn,
            dr,
            kl,
            cfg.softmax_scale(),
        );
        attention::up_v(
            rec,
            o_lat,
            &layer.kv_b,
            View::rows(&s.attn, heads * dv),
            t,
            heads,
            dn,
            dv,
        );
        matmul::matmul(
            rec,
            View::rows(&s.attn, heads * dv),
            &layer.o,
            View::rows(&s.tmp_h, hd),
            t,
        );
        elementwise::add(rec, View::rows(&s.tmp_h, hd), View::rows(&s.h, hd), t, hd);
    }
}
