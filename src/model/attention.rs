//! One layer's attention: `h += o_proj(SparseMLA(RMSNorm(h)))`.
//!
//! MLA with q/kv LoRA: the queries go through `q_a` → RMSNorm → `q_b`, RoPE on each head's
//! last `qk_rope_head_dim` dims; the key/value side is one latent row per token,
//! `[RMSNorm(c_kv) | RoPE(k_pe)]`, stored in the layer's cache in its format. The positions each query
//! attends are picked by the lightning indexer on full layers, or reused from the last full
//! layer on IndexShare layers ([`Session::select`]); attention runs in absorbed form over
//! those latent rows only.

use super::forward::{gemv_add, project};
use super::load::{Indexer, Layer};
use super::scratch::{qi_cols, qkv_cols};
use super::session::Session;
use crate::gpu::Recorder;
use crate::kernels::attention::{MlaDims, MlaQueries};
use crate::kernels::cache::{self, Prepare, Source};
use crate::kernels::rope::QueryRope;
use crate::kernels::topk::Selection;
use crate::kernels::{attention, indexer, matmul, rope, topk, Causal, View};

/// eps of `q_a_layernorm` / `kv_a_layernorm` (transformers builds them with the default 1e-6,
/// not `rms_norm_eps`) and of the indexer's `k_norm` LayerNorm.
const LATENT_NORM_EPS: f32 = 1e-6;
const K_NORM_EPS: f32 = 1e-6;

impl Session {
    /// `h += o_proj(SparseMLA(RMSNorm(h)))` for layer `i` over the chunk's rows (`span`: how
    /// many, where each sits, and the positions they cover: see [`Session::place_rows`]).
    pub(super) fn attention(&self, rec: &mut Recorder, i: usize, layer: &Layer, span: Causal) {
        let t = span.rows;
        let cfg = &self.model.config;
        let (s, d) = (&self.s, &self.dims);
        let hd = cfg.hidden_size as u32;
        let ql = cfg.q_lora_rank as u32;
        let MlaDims {
            heads,
            dn,
            dr,
            dv,
            kv_lora: kl,
            ..
        } = d.mla;
        let row = kl + dr;
        let (h, x) = (View::rows(&s.h, hd), View::rows(&s.x, hd));

        // Queries: q_resid = RMSNorm(x·W_qa), q = q_resid·W_qb, RoPE on the last dr dims per head.
        // One matrix each (or a few, where formats differ) for the projections that share
        // an input: [q_a | kv_a | indexer key] of x, [q | indexer queries] of the q LoRA row.
        let qkv = View::rows(&s.qkv, qkv_cols(cfg) as u32);
        let qi = View::rows(&s.qi, qi_cols(cfg) as u32);
        let (qa_raw, qa) = (qkv, View::rows(&s.qa, ql));
        let q = qi;
        // At decode, the norms also quantize x and the q LoRA row for the GEMVs that read them.
        let norm = (&layer.input_norm, cfg.rms_norm_eps);
        let xq = self.norm_for(rec, h, norm, x, t, layer.qkv_a.first(), &s.xq_x);
        project(rec, xq.as_ref(), x, &layer.qkv_a, qkv, t);
        let norm = (&layer.q_a_norm, LATENT_NORM_EPS);
        let qaq = self.norm_for(rec, qa_raw, norm, qa, t, layer.q_b.first(), &s.xq_qa);
        project(rec, qaq.as_ref(), qa, &layer.q_b, qi, t);
        // RoPE on the queries' last dr dims per head and on the indexer's queries: done by
        // the kernels that read them, as they read them (sparse MLA, the indexer's scores).
        let iq = qi.col(heads * (dn + dr));
        // Latent cache rows [RMSNorm(c_kv) | RoPE(k_pe)], normalized and rotated by the
        // store itself.
        let latent = Prepare {
            rows: qkv.col(ql),
            norm_dim: kl,
            weight: &layer.kv_a_norm,
            bias: None,
            eps: LATENT_NORM_EPS,
            rope: &d.rope_k_pe,
            cos_sin: &s.cos_sin,
        };
        let cache = self.caches.latent(i, span.n_keys as usize);
        cache::store_latent(rec, Source::Prepared(latent), &cache, span, (kl, dr));

        // Which positions each row attends: this layer's indexer on a full layer; on an
        // IndexShare layer s.sel_idx / s.sel_cnt keep the last full layer's selection.
        let sel = Selection {
            idx: &s.sel_idx,
            cnt: &s.sel_cnt,
            k: self.topk as u32,
        };
        if let Some(ix) = &layer.indexer {
            let ik = qkv.col(ql + row);
            self.select(rec, i, ix, span, &sel, (iq, ik));
        }

        // Absorbed sparse MLA over the selected latent rows.
        let q_abs = View::rows(&s.q_abs, heads * kl);
        let o_lat = View::rows(&s.o_lat, heads * kl);
        let attn = View::rows(&s.attn, heads * dv);
        let out = View::rows(&s.tmp_h, hd);
        attention::absorb_q(rec, q, &layer.kv_b, q_abs, t, &d.mla);
        let queries = MlaQueries {
            absorbed: q_abs,
            q,
            rows: t,
            rope: Some(QueryRope {
                slice: d.rope_q,
                cos_sin: &s.cos_sin,
            }),
        };
        let most = sel.k.min(span.n_keys);
        // Where the whole context fits the top-k, the selections of a chunk of one sequence
        // (this layer's or, on an IndexShare layer, the last full layer's: same span) are
        // select_all's, each row's positions from the first in order. A session's chunks
        // are placed, so `span.places` alone would never allow it.
        let prefix = span.of_one_sequence() && self.selects_all(span, &sel);
        let plan = attention::MlaPlan::for_rows(queries.rows).with_prefix(prefix);
        attention::sparse_mla(rec, &queries, &cache, &sel, most, o_lat, &d.mla, plan);
        attention::up_v(rec, o_lat, &layer.kv_b, attn, t, &d.mla);
        let aq = self.quantize(rec, attn, t, 1, &layer.o, &s.xq_qa);
        gemv_add(rec, aq.as_ref(), attn, &layer.o, out, h, t);
    }

    /// Whether a full layer selects every position for `span` (`topk::select_all`, no
    /// scores): the whole context fits `sel`'s top-k, and the indexer is not kept warm.
    fn selects_all(&self, span: Causal, sel: &Selection) -> bool {
        span.n_keys <= sel.k && !self.warm_indexer
    }

    /// The lightning indexer of full layer `i`: writes the chunk's key rows into the layer's
    /// key cache, scores every cached position for each row and keeps the top-k in `sel`
    /// (every position, while there are no more than k). `(iq, ik)`: the chunk's indexer
    /// queries (RoPE applied) and raw key rows, computed with the layer's other projections.
    fn select(
        &self,
        rec: &mut Recorder,
        i: usize,
        ix: &Indexer,
        span: Causal,
        sel: &Selection,
        (iq, ik): (View, View),
    ) {
        let t = span.rows;
        let cfg = &self.model.config;
        let (s, d) = (&self.s, &self.dims);
        let hd = cfg.hidden_size as u32;
        let (ih, id) = (d.indexer.heads, d.indexer.dim);
        let x = View::rows(&s.x, hd);
        let n_keys = span.n_keys;
        let keys = self
            .caches
            .keys(i, n_keys as usize)
            .expect("full layer has a key cache");
        // Key rows: RoPE(LayerNorm(k)), normalized and rotated by the store itself.
        let key_rows = Prepare {
            rows: ik,
            norm_dim: id,
            weight: &ix.k_norm_w,
            bias: Some(&ix.k_norm_b),
            eps: K_NORM_EPS,
            rope: &d.rope_index_k,
            cos_sin: &s.cos_sin,
        };
        cache::store_keys(rec, Source::Prepared(key_rows), &keys, span, id);
        if self.selects_all(span, sel) {
            topk::select_all(rec, span, sel);
        } else {
            let iw = View::rows(&s.iw, ih);
            matmul::matmul(rec, x, &ix.weights_proj, iw, t);
            let scores = View::rows(&s.scores, n_keys);
            // The scores kernel rotates the queries as it reads them, but for keys rotated
            // before rounding (Hadamard): the queries take RoPE, then the same rotation (q·k
            // unchanged), beforehand.
            let rotated = keys.format.rotated();
            if rotated {
                rope::rope(rec, iq, t, &d.rope_index_q, &s.cos_sin);
                cache::rotate(rec, iq, t, ih, id);
            }
            let rope = (!rotated).then_some(QueryRope {
                slice: d.rope_index_q,
                cos_sin: &s.cos_sin,
            });
            indexer::indexer_scores(rec, iq, iw, &keys, scores, span, &d.indexer, rope);
            topk::topk(rec, scores, span, sel, &s.topk);
        }
    }
}
