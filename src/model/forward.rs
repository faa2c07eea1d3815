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

use super::load::{Layer, Mlp, SwiGlu};
use super::pick::Pick;
use super::session::{Input, Session};
use crate::error::Result;
use crate::gpu::Recorder;
use crate::kernels::matmul::XQuant;
use crate::kernels::{elementwise, embed, matmul, norm, View};
use crate::weights::GpuWeight;

impl Session {
    /// One chunk; leaves the logits of its last `want_logits` rows in `s.logits`, and with
    /// `pick` the token the last row's logits pick in `ids[0]` and that slot.
    pub(super) fn chunk_forward(
        &mut self,
        input: Input,
        want_logits: usize,
        pick: Option<(usize, &Pick)>,
    ) -> Result<()> {
        let model = self.model.clone();
        let (cfg, gpu) = (&model.config, &*model.gpu);
        let rows = match input {
            Input::Host(tokens) => tokens.len(),
            Input::Previous => 1,
        };
        self.caches.reserve(gpu, self.pos + rows)?;
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

        let mut rec = gpu.recorder();
        // Decode steps (one token) repeat the same dispatches with the same parameter slots,
        // so their bind groups are kept and reused. A prefill's depend on its length (GEMV
        // passes, tile counts): cached, every new length added a few hundred entries that
        // stayed (host memory grew by steps in long chats), so they are made per chunk and
        // dropped with it (a few hundred).
        rec.cache_bind_groups(t == 1);
        let h = View::rows(&s.h, cfg.hidden_size as u32);
        embed::embed(&mut rec, &model.weights.embed, &s.ids, 0, t, h);
        for (i, layer) in model.weights.layers.iter().enumerate() {
            // h += attention(RMSNorm(h))
            self.attention(&mut rec, i, layer, t, pos0);
            // h += MLP(RMSNorm(h)). A MoE layer whose experts stream from the files
            // (`--gpu-memory`) submits what is recorded so far and waits here for its
            // routing (moe.rs); every other layer only records.
            self.mlp(&mut rec, i, layer, t)?;
        }
        if want_logits > 0 {
            self.head(&mut rec, t, want_logits as u32, pick)?;
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

    /// `h += MLP(RMSNorm(h))` with the layer's dense MLP or its experts.
    fn mlp(&self, rec: &mut Recorder, i: usize, layer: &Layer, t: u32) -> Result<()> {
        let cfg = &self.model.config;
        let hd = cfg.hidden_size as u32;
        let (h, x) = (View::rows(&self.s.h, hd), View::rows(&self.s.x, hd));
        norm::rms_norm(rec, h, &layer.post_norm, x, t, hd, cfg.rms_norm_eps);
        match &layer.mlp {
            Mlp::Dense(m) => {
                let xq = self.quantize(rec, x, t, 1, &m.gate_up, &self.s.xq_x);
                self.swiglu(rec, m, t, xq.as_ref())
            }
            Mlp::Moe(m) => self.moe(rec, i, m, t)?,
        }
        Ok(())
    }

    /// `h += down(silu(gate(x)) * up(x))` for a dense MLP or the shared expert (`xq`: x
    /// quantized for its GEMVs, see [`Session::quantize`]).
    pub(super) fn swiglu(&self, rec: &mut Recorder, m: &SwiGlu, t: u32, xq: Option<&XQuant>) {
        let s = &self.s;
        let hd = self.model.config.hidden_size as u32;
        let i = m.inter as u32;
        let gu = View::rows(&s.mlp_gate_up, 2 * i);
        let act = View::rows(&s.mlp_act, i);
        let out = View::rows(&s.tmp_h, hd);
        gemv(rec, xq, View::rows(&s.x, hd), &m.gate_up, gu, t);
        elementwise::swiglu(rec, gu, gu.col(i), act, t, i);
        let aq = self.quantize(rec, act, t, 1, &m.down, &s.xq_act);
        gemv(rec, aq.as_ref(), act, &m.down, out, t);
        elementwise::add(rec, out, View::rows(&s.h, hd), t, hd);
    }

    /// At a decode step (`t` = 1), the `rows` rows of `x` quantized once into `buf` for the
    /// integer-dot GEMVs that read them next, when `w` (one of those weights) takes them;
    /// else None, and each GEMV reads x as it is.
    pub(super) fn quantize<'a>(
        &self,
        rec: &mut Recorder,
        x: View,
        t: u32,
        rows: u32,
        w: &GpuWeight,
        buf: &'a wgpu::Buffer,
    ) -> Option<XQuant<'a>> {
        if t != 1 || !matmul::xq_enabled() {
            return None;
        }
        let order = matmul::takes_xq(x, w)?;
        Some(matmul::quantize_x(rec, x, rows, w.cols as u32, order, buf))
    }

    /// The final RMSNorm and the LM head over the last `rows` of the chunk's `t` rows, into
    /// `s.logits`; with `pick`, the token the last row picks goes to `ids[0]` and its slot.
    fn head(
        &self,
        rec: &mut Recorder,
        t: u32,
        rows: u32,
        pick: Option<(usize, &Pick)>,
    ) -> Result<()> {
        let cfg = &self.model.config;
        let w = &self.model.weights;
        let s = &self.s;
        let (hd, vocab) = (cfg.hidden_size as u32, cfg.vocab_size as u32);
        let first = View::rows(&s.h, hd).row(t - rows);
        let x = View::rows(&s.x, hd);
        norm::rms_norm(rec, first, &w.norm, x, rows, hd, cfg.rms_norm_eps);
        let head = w.lm_head.as_ref().unwrap_or(&w.embed);
        let logits = View::rows(&s.logits, vocab);
        let xq = self.quantize(rec, x, rows, 1, head, &s.xq_x);
        gemv(rec, xq.as_ref(), x, head, logits, rows);
        if let Some((slot, pick)) = pick {
            self.record_pick(rec, logits.row(rows - 1), pick)?;
            rec.copy(&s.ids, 0, &s.picked[slot], 0, 4);
        }
        Ok(())
    }
}

/// `y = x · Wᵀ` for the chunk's `t` rows; from `xq` (x quantized beforehand) where given.
pub(super) fn gemv(rec: &mut Recorder, xq: Option<&XQuant>, x: View, w: &GpuWeight, y: View, t: u32) {
    match xq {
        Some(q) => matmul::matmul_xq(rec, q, x, w, y),
        None => matmul::matmul(rec, x, w, y, t),
    }
}
