//! The forward pass, top to bottom, for one chunk of tokens at positions `pos .. pos + T`.
//!
//! Prefill and decode are the same code: a prompt is cut into chunks (GPU memory stays
//! bounded), decode is a chunk of one. After the embedding, every layer is
//!
//! ```text
//! h = h + attention(rms_norm(h))    attention.rs: sparse MLA over the positions the indexer picks
//! h = h + mlp(rms_norm(h))          a dense SwiGLU, or the routed + shared experts of moe.rs
//! ```
//!
//! then the final norm and the LM head give the logits of the rows asked for, and a token
//! may be picked from them on the GPU (pick.rs). Every layer writes its latent cache rows
//! (and, on full layers, its indexer key rows) before attending, so causal attention over
//! the cache covers the chunk itself.
//!
//! Everything is recorded into one [`Recorder`] and submitted at the end of the chunk; the
//! host waits for the GPU only where the loop says so.

use super::load::{Layer, Mlp, Proj, SwiGlu};
use super::pick::Pick;
use super::session::{At, Input, Session};
use crate::error::Result;
use crate::gpu::Recorder;
use crate::kernels::matmul::XQuant;
use crate::kernels::{elementwise, embed, matmul, norm, Causal, View};
use crate::weights::GpuWeight;

impl Session {
    /// One chunk; leaves the logits of its last `want_logits` rows in `s.logits`, and with
    /// `pick` the token the last row's logits pick in `ids[0]` and that slot. `keep_hidden`:
    /// also every row's hidden after the final norm in `s.mtp_h`, for the MTP layer
    /// (draft.rs). `prefill`: the chunk is part of a prompt ([`Recorder::set_prefill`]).
    pub(super) fn chunk_forward(
        &mut self,
        input: Input,
        want_logits: usize,
        pick: Option<(usize, &Pick)>,
        keep_hidden: bool,
        prefill: bool,
    ) -> Result<()> {
        let at = At::Host(self.pos);
        let t = self.chunk_at(at, input, want_logits, pick, keep_hidden, prefill)?;
        self.pos += t;
        Ok(())
    }

    /// [`Session::chunk_forward`] at `at`, leaving the position alone; returns the rows.
    pub(super) fn chunk_at(
        &mut self,
        at: At,
        input: Input,
        want_logits: usize,
        pick: Option<(usize, &Pick)>,
        keep_hidden: bool,
        prefill: bool,
    ) -> Result<usize> {
        let model = self.model.clone();
        let gpu = &*model.gpu;
        let t = input.rows();
        self.check_logit_room(t, want_logits)?;
        self.caches.reserve(gpu, at.most() + t)?;
        if let Input::Host(tokens) = input {
            self.put_tokens(tokens);
        }
        let mut rec = gpu.recorder();
        rec.set_prefill(prefill);
        // Decode steps (one token) repeat the same dispatches with the same parameter slots,
        // so their bind groups are kept and reused, and so do a speculative round's
        // verifications (k + 1 rows every round). A prefill's depend on its length (GEMV
        // passes, tile counts): cached, every new length added a few hundred entries that
        // stayed (host memory grew by steps in long chats), so they are made per chunk and
        // dropped with it (a few hundred).
        rec.cache_bind_groups(caches_bind_groups(t as u32));
        // A chunk of several rows is waited for once recorded (a verification, a prompt):
        // its first layers run while the host records the rest. A decode step is recorded
        // while the GPU runs the one before.
        if t > 1 && matches!(at, At::Host(_)) {
            rec.submit_every(submit_every());
        }
        self.chunk_record(&mut rec, at, t, want_logits, pick, keep_hidden)?;
        // Submitted without waiting: the logits readback (or the next chunk) is ordered
        // after it and waits; validation errors surface here or at that wait.
        drop(rec);
        if let Some((slot, _)) = pick {
            self.pending[slot] = gpu.last_submission();
        }
        self.check_after_submit()?;
        Ok(t)
    }

    /// Records the chunk of `t` rows at `at` (its tokens already in `s.ids`) into `rec`:
    /// places, layers, and the head as [`Session::chunk_at`] asks. The caches must already
    /// hold its positions (`Caches::reserve`: growing them here would copy them before what
    /// `rec` holds reached them), and `want_logits` fit ([`Session::check_logit_room`]).
    pub(super) fn chunk_record(
        &self,
        rec: &mut Recorder,
        at: At,
        t: usize,
        want_logits: usize,
        pick: Option<(usize, &Pick)>,
        keep_hidden: bool,
    ) -> Result<()> {
        let span = self.place(rec, at, t);
        let t = t as u32;
        self.layers(rec, span)?;
        if keep_hidden {
            self.keep_hidden_rows(rec, t);
        }
        if want_logits > 0 {
            self.head(rec, (t, keep_hidden), want_logits as u32, pick)?;
        }
        Ok(())
    }

    /// Refuses a chunk of `t` rows that should leave more rows' logits than it has or the
    /// scratch holds.
    pub(super) fn check_logit_room(&self, t: usize, want_logits: usize) -> Result<()> {
        let room = t.min(self.logit_room());
        if want_logits > room {
            return Err(crate::Error::msg(format!(
                "a chunk of {t} rows cannot leave the logits of {want_logits} (at most {room})"
            )));
        }
        Ok(())
    }

    /// What a submission may have left to report: a validation error, a streamed expert
    /// file that changed on disk.
    pub(super) fn check_after_submit(&self) -> Result<()> {
        self.model.gpu.check()?;
        if let Some(off) = &self.model.offload {
            off.check_files()?;
        }
        Ok(())
    }

    /// The embedding of the tokens in `s.ids` and every layer over the chunk's rows
    /// (`span`: where each sits, [`Session::place_rows`]).
    pub(super) fn layers(&self, rec: &mut Recorder, span: Causal) -> Result<()> {
        let model = &self.model;
        let (s, t) = (&self.s, span.rows);
        let h = View::rows(&s.h, model.config.hidden_size as u32);
        embed::embed(rec, &model.weights.embed, &s.ids, 0, t, h);
        for (i, layer) in model.weights.layers.iter().enumerate() {
            // h += attention(RMSNorm(h))
            self.attention(rec, i, layer, span);
            // h += MLP(RMSNorm(h)). A MoE layer whose experts stream from the files
            // (`--gpu-memory`) submits what is recorded so far and waits here for its
            // routing (moe.rs); every other layer only records.
            self.mlp(rec, i, layer, t)?;
        }
        Ok(())
    }

    /// Writes `tokens` at `s.ids[0 ..]` for the next recorded forward (queue order: after
    /// the submissions before it have read what was there).
    pub(crate) fn put_tokens(&self, tokens: &[u32]) {
        self.model
            .gpu
            .write(&self.s.ids, 0, bytemuck::cast_slice(tokens));
    }

    /// `h += MLP(RMSNorm(h))` with the layer's dense MLP or its experts.
    pub(super) fn mlp(&self, rec: &mut Recorder, i: usize, layer: &Layer, t: u32) -> Result<()> {
        let cfg = &self.model.config;
        let hd = cfg.hidden_size as u32;
        let (h, x) = (View::rows(&self.s.h, hd), View::rows(&self.s.x, hd));
        // At decode, the norm also quantizes x for the GEMVs that read it.
        let first = match &layer.mlp {
            Mlp::Dense(m) => &m.gate_up,
            Mlp::Moe(m) => &m.gate_up,
        };
        let norm = (&layer.post_norm, cfg.rms_norm_eps);
        let xq = self.norm_for(rec, h, norm, x, t, first, &self.s.xq_x);
        match &layer.mlp {
            Mlp::Dense(m) => self.swiglu(rec, m, t, xq.as_ref()),
            Mlp::Moe(m) => self.moe(rec, i, m, t, xq.as_ref())?,
        }
        Ok(())
    }

    /// `h += down(silu(gate(x)) * up(x))` for a dense MLP or the shared expert (`xq`: x
    /// quantized for its GEMVs, see [`Session::norm_for`]).
    pub(super) fn swiglu(&self, rec: &mut Recorder, m: &SwiGlu, t: u32, xq: Option<&XQuant>) {
        let s = &self.s;
        let hd = self.model.config.hidden_size as u32;
        let i = m.inter as u32;
        let gu = View::rows(&s.mlp_gate_up, 2 * i);
        let act = View::rows(&s.mlp_act, i);
        let out = View::rows(&s.tmp_h, hd);
        gemv(rec, xq, View::rows(&s.x, hd), &m.gate_up, gu, t);
        let aq = self.swiglu_for(rec, gu, act, t, 1, i, &m.down, &s.xq_act);
        gemv_add(rec, aq.as_ref(), act, &m.down, out, View::rows(&s.h, hd), t);
    }

    /// RMSNorm (`norm`: weight and eps) of the chunk's `t` rows of `x` into `y`; at a decode
    /// step or a few rows (a verification) whose next GEMVs (over `w`) take x quantized,
    /// the same dispatch quantizes `y` into `buf` ([`norm::rms_norm_q`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_for<'a>(
        &self,
        rec: &mut Recorder,
        x: View,
        (nw, eps): (&wgpu::Buffer, f32),
        y: View,
        t: u32,
        w: &GpuWeight,
        buf: &'a wgpu::Buffer,
    ) -> Option<XQuant<'a>> {
        let dim = w.cols as u32;
        match self.xq_order(t, y, w) {
            Some(order) => Some(norm::rms_norm_q(rec, x, nw, y, (t, dim), eps, order, buf)),
            None => {
                norm::rms_norm(rec, x, nw, y, t, dim, eps);
                None
            }
        }
    }

    /// `out = silu(gate) * up` over `gu` (`[gate | up]`, `dim` columns each) for `rows`
    /// rows per token row (`t` of them); at a decode step or a few rows whose next GEMV
    /// (over `w`) takes them quantized, the same dispatch quantizes `out` into `buf`
    /// ([`elementwise::swiglu_q`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn swiglu_for<'a>(
        &self,
        rec: &mut Recorder,
        gu: View,
        out: View,
        t: u32,
        rows: u32,
        dim: u32,
        w: &GpuWeight,
        buf: &'a wgpu::Buffer,
    ) -> Option<XQuant<'a>> {
        match self.xq_order(t, out, w) {
            Some(order) => Some(elementwise::swiglu_q(
                rec,
                gu,
                gu.col(dim),
                out,
                t * rows,
                dim,
                order,
                buf,
            )),
            None => {
                elementwise::swiglu(rec, gu, gu.col(dim), out, t * rows, dim);
                None
            }
        }
    }

    /// The element order GEMVs over `w` take x quantized in, at a decode step (`t` = 1) or
    /// a few rows (`t` ≤ [`matmul::xq_max_rows`]: a speculative verification), where they
    /// do.
    fn xq_order(&self, t: u32, x: View, w: &GpuWeight) -> Option<crate::weights::QFormat> {
        if t > matmul::xq_max_rows() || !matmul::xq_enabled() {
            return None;
        }
        matmul::takes_xq(x, w)
    }

    /// At a decode step or a few rows (see [`Session::xq_order`]), the `rows` rows per token
    /// row of `x` (`t` token rows) quantized once into `buf` for the integer-dot GEMVs that
    /// read them next, when `w` (one of those weights) takes them; else None, and each GEMV
    /// reads x as it is.
    pub(super) fn quantize<'a>(
        &self,
        rec: &mut Recorder,
        x: View,
        t: u32,
        rows: u32,
        w: &GpuWeight,
        buf: &'a wgpu::Buffer,
    ) -> Option<XQuant<'a>> {
        let order = self.xq_order(t, x, w)?;
        Some(matmul::quantize_x(
            rec,
            x,
            t * rows,
            w.cols as u32,
            order,
            buf,
        ))
    }

    /// The final RMSNorm and the LM head over the last `rows` of the chunk's `t` rows, into
    /// `s.logits`; with `pick`, the token the last row picks goes to `ids[0]` and its slot.
    /// `kept`: `s.mtp_h` already holds every row after the final norm
    /// ([`Session::keep_hidden_rows`]), which the head reads where its GEMV takes x as it
    /// is (the same kernel's values: one dispatch fewer a verification).
    pub(super) fn head(
        &self,
        rec: &mut Recorder,
        (t, kept): (u32, bool),
        rows: u32,
        pick: Option<(usize, &Pick)>,
    ) -> Result<()> {
        let cfg = &self.model.config;
        let w = &self.model.weights;
        let s = &self.s;
        let (hd, vocab) = (cfg.hidden_size as u32, cfg.vocab_size as u32);
        let head = w.head();
        let logits = View::rows(&s.logits, vocab);
        let normed = View::rows(&s.mtp_h, hd).row(t - rows);
        if kept && self.xq_order(rows, normed, head).is_none() {
            gemv(rec, None, normed, head, logits, rows);
        } else {
            // One row: the norm also quantizes it for the LM head's GEMV.
            let first = View::rows(&s.h, hd).row(t - rows);
            let x = View::rows(&s.x, hd);
            let norm = (&w.norm, cfg.rms_norm_eps);
            let xq = self.norm_for(rec, first, norm, x, rows, head, &s.xq_x);
            gemv(rec, xq.as_ref(), x, head, logits, rows);
        }
        if let Some((slot, pick)) = pick {
            self.record_pick(rec, logits.row(rows - 1), pick, s.next_token())?;
            rec.copy(&s.ids, 0, &s.picked[slot], 0, 4);
        }
        Ok(())
    }
}

/// Whether a chunk of `t` rows keeps its bind groups for the next chunk of that length: a
/// decode step's one row, and the few rows of a speculative round (its verification's k + 1,
/// the MTP layer's passes over 1 ..= k + 1 verified rows), which repeat every round: up to
/// the rows the integer-dot GEMVs take at once, so at most that many lengths stay cached.
/// `SPARSA_CACHE_ROWS` lowers it (1: decode steps only, a measurement aid).
pub(super) fn caches_bind_groups(t: u32) -> bool {
    let most = crate::knobs::knob!("SPARSA_CACHE_ROWS", |v| v <= matmul::GEMV_MAX_ROWS);
    t <= most.unwrap_or(matmul::GEMV_MAX_ROWS)
}

/// Dispatches per submission of a chunk of several rows (see
/// [`Recorder::submit_every`]): about one layer of the built-in model's 18, a few of a
/// 78-layer model's. `SPARSA_SUBMIT_EVERY` overrides (0: one submission per chunk, a
/// measurement aid).
fn submit_every() -> usize {
    crate::knobs::knob!("SPARSA_SUBMIT_EVERY", |_| true).unwrap_or(64) as usize
}

/// `y = x · Wᵀ` for the chunk's `t` rows; from `xq` (x quantized beforehand) where given.
pub(super) fn gemv(
    rec: &mut Recorder,
    xq: Option<&XQuant>,
    x: View,
    w: &GpuWeight,
    y: View,
    t: u32,
) {
    match xq {
        Some(q) => matmul::matmul_xq(rec, q, x, w, y),
        None => matmul::matmul(rec, x, w, y, t),
    }
}

/// `h += x · Wᵀ` for the chunk's `t` rows: in the GEMV's store (x quantized for the
/// integer-dot GEMV where it applies, else the float GEMVs up to `GEMV_MAX_ROWS` rows),
/// else (a GEMM) the product into `tmp` and an add.
pub(super) fn gemv_add(
    rec: &mut Recorder,
    xq: Option<&XQuant>,
    x: View,
    w: &GpuWeight,
    tmp: View,
    h: View,
    t: u32,
) {
    let added = match xq {
        Some(q) => matmul::matmul_xq_add(rec, q, x, w, h),
        None => matmul::matmul_add(rec, x, w, h, t),
    };
    if added {
        return;
    }
    gemv(rec, xq, x, w, tmp, t);
    elementwise::add(rec, tmp, h, t, w.rows as u32);
}

/// `y = x · [W_1 | W_2 | …]ᵀ` for the chunk's `t` rows: each part of `p` into the next
/// columns of `y`.
pub(super) fn project(rec: &mut Recorder, xq: Option<&XQuant>, x: View, p: &Proj, y: View, t: u32) {
    let mut col = 0;
    for w in &p.parts {
        gemv(rec, xq, x, w, y.col(col), t);
        col += w.rows as u32;
    }
}
