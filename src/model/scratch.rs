//! A session's GPU working memory, declared once.
//!
//! [`Scratch`] lists every buffer a forward chunk works in, each with its size for chunks of
//! `c` rows. The one list gives the struct's fields, their allocation ([`Scratch::new`]) and
//! the byte total the `--gpu-memory` planner reserves ([`Scratch::bytes`]), so the three
//! cannot disagree. Activations are f32 (`ids` holds u32 token ids in f32-sized words).

use crate::config::Config;
use crate::error::Result;
use crate::gpu::Gpu;
use crate::kernels::sample::SampleScratch;
use crate::kernels::topk::TopkScratch;

/// Rows per prefill chunk at most, for a model whose hidden size is at least
/// [`LARGE_HIDDEN`]. Larger chunks read each weight once for more rows and give the GEMMs
/// more tiles to spread over the GPU: on an H200 (4-layer GLM-5 q4 synth), prefill of 2,048
/// tokens ran at 4,371 tok/s in chunks of 128 rows, 5,069 in chunks of 512, 5,134 in chunks
/// of 1,024 and 5,113 in chunks of 2,048 (BENCHMARKS.md, "Prefill on tensor cores: the tile
/// restaged, chunks of 512 rows"). At full depth chunks of 2,048 are faster still (H100,
/// 78-layer GLM-5 q4 synth: 450 → 481 tok/s at 2,048 tokens, 364 → 388 at 8,192; each expert
/// sees four times the rows: BENCHMARKS.md, "2026-12-06 (fourth session)"), but the scratch
/// grows with the chunk (about 1.2 MB a row for GLM-5's shapes, besides the scores), per
/// session: a server's slots each hold one, so they keep these; a session of its own takes
/// [`WIDE_CHUNK_ROWS`] without a `--gpu-memory` plan where the memory left holds them
/// beside the context's caches (`Session::open`). Smaller models keep [`SMALL_CHUNK_ROWS`]: their
/// GEMMs are small, and the scratch of 512 rows would outweigh the built-in model's weights.
/// The browser, where memory is tight and GEMMs run on the f32 tile, keeps it too.
/// `--prefill-chunk` ([`set_prefill_chunk`]) overrides, else `SPARSA_PREFILL_CHUNK` (a
/// measurement knob).
pub(super) const CHUNK_ROWS: usize = 512;
/// Rows per prefill chunk of a large model in the wide chunks. Where its routed experts
/// stream from the files (a `--gpu-memory` plan that offloads them), a chunk uploads each
/// missed expert once per layer, so larger chunks upload less. On an H200, full-depth GLM-5 q4 synth under
/// `--gpu-memory 24GiB`, 8,192 tokens: 185.7 tok/s in chunks of 512 rows, 224.2 in chunks
/// of 1,024, 238.2 in chunks of 2,048 (the resident model's speed, 237.4), and decode
/// after it 243.6 / 248.9 / 251.7 ms a token: the larger scratch leaves fewer expert slots
/// (BENCHMARKS.md, "Per-head GEMMs and prefill chunks under a memory budget"). The planner
/// takes them only where the budget still holds the same caches ([`super::plan::plan_sized`]);
/// a session of its own without a plan takes them where the memory left holds them beside its
/// caches (`Session::open`).
pub(super) const WIDE_CHUNK_ROWS: usize = 2048;
pub(super) const SMALL_CHUNK_ROWS: usize = 128;
pub(super) const LARGE_HIDDEN: usize = 2048;

/// Rows per prefill chunk that `--prefill-chunk` asked for (0: the defaults above).
static CHUNK_OVERRIDE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Rows per prefill chunk for the sessions and plans made after it (`--prefill-chunk`; 0
/// restores the defaults). Still at most what one storage binding holds of the widest
/// per-row scratch. Larger chunks prefill faster where experts stream (fewer uploads) and
/// take about 1.2 MB of GPU memory a row for GLM-5's shapes.
pub fn set_prefill_chunk(rows: usize) {
    CHUNK_OVERRIDE.store(rows, std::sync::atomic::Ordering::Relaxed);
}

/// Rows whose logits one chunk leaves at most: a prompt wants its last row's, a
/// verification k + 1, a batched step one a sequence; callers that want every row's
/// (`Session::forward` with all logits) run chunks of that many rows (`Session::logit_room`).
/// A vocabulary of 154,880 takes 620 KB a row.
pub(super) const LOGIT_ROWS: usize = 128;

/// What the scratch sizes depend on.
pub(super) struct Shape<'a> {
    pub cfg: &'a Config,
    /// Rows per chunk ([`Shape::chunk_rows`]).
    pub c: usize,
    /// Positions a query can score: the context.
    pub ctx: usize,
    /// Positions a query attends: `min(index_topk, ctx)`, or `ctx` when dense.
    pub sel: usize,
    /// Rows whose logits one chunk can leave ([`Shape::logit_rows`]).
    pub logits: usize,
}

impl<'a> Shape<'a> {
    /// `wide`: chunks of [`WIDE_CHUNK_ROWS`] for a large model (where its routed experts
    /// stream, or a session of its own has the room).
    pub fn new(
        cfg: &'a Config,
        ctx: usize,
        dense: bool,
        max_binding: u64,
        wide: bool,
    ) -> Shape<'a> {
        let c = Self::chunk_rows(cfg, ctx, max_binding, wide);
        Shape {
            cfg,
            c,
            ctx,
            sel: if dense { ctx } else { cfg.index_topk.min(ctx) },
            logits: Self::logit_rows(cfg, c, max_binding),
        }
    }

    /// Rows per prefill chunk: at most [`CHUNK_ROWS`] ([`WIDE_CHUNK_ROWS`] where `wide`) or
    /// [`SMALL_CHUNK_ROWS`], and the widest per-row scratch
    /// (scores are `[chunk, ctx]`, the absorbed queries `[chunk, heads * kv_lora]`, …) fits
    /// one binding.
    fn chunk_rows(cfg: &Config, ctx: usize, max_binding: u64, wide: bool) -> usize {
        let lim = max_binding as usize / 4;
        let widest = [
            ctx,
            cfg.num_attention_heads * cfg.kv_lora_rank,
            pairs(cfg) * 2 * cfg.moe_intermediate_size.max(1),
            pairs(cfg) * cfg.hidden_size,
            2 * cfg.intermediate_size,
        ]
        .into_iter()
        .fold(1, usize::max);
        let cap = match CHUNK_OVERRIDE.load(std::sync::atomic::Ordering::Relaxed) {
            0 => crate::knobs::knob!("SPARSA_PREFILL_CHUNK", |v| (1..=8192).contains(&v)),
            n => Some(n as u32),
        };
        let large = cfg.hidden_size >= LARGE_HIDDEN && !cfg!(target_arch = "wasm32");
        let default = match (large, wide) {
            (true, true) => WIDE_CHUNK_ROWS,
            (true, false) => CHUNK_ROWS,
            (false, _) => SMALL_CHUNK_ROWS,
        };
        (lim / widest).clamp(1, cap.map_or(default, |c| c as usize))
    }

    /// Rows whose logits one chunk of `c` rows can leave: at most [`LOGIT_ROWS`], and as
    /// many as one binding holds.
    fn logit_rows(cfg: &Config, c: usize, max_binding: u64) -> usize {
        let fit = (max_binding as usize / 4 / cfg.vocab_size.max(1)).max(1);
        c.min(LOGIT_ROWS).min(fit)
    }

    /// Columns of the dense MLP buffers: the dense layers' or the shared experts' width.
    fn mlp_inter(&self) -> usize {
        let cfg = self.cfg;
        cfg.intermediate_size
            .max(cfg.moe_intermediate_size * cfg.n_shared_experts)
    }
}

/// Expert pairs per row at most: the router's picks, and the shared expert where it runs
/// as a routed one (`load::Moe::shared_routed`).
fn pairs(cfg: &Config) -> usize {
    cfg.num_experts_per_tok + (cfg.n_shared_experts == 1) as usize
}

/// Declares the scratch struct from one list: f32 buffers by element count, then other
/// parts by constructor and byte count.
macro_rules! scratch {
    (
        $(#[$sm:meta])*
        struct $name:ident for $z:ident, $gpu:ident;
        f32 { $( $(#[$fm:meta])* $f:ident: $len:expr, )* }
        other { $( $(#[$om:meta])* $o:ident: $ot:ty = $new:expr, bytes $bytes:expr; )* }
    ) => {
        $(#[$sm])*
        pub(super) struct $name {
            $( $(#[$fm])* pub $f: wgpu::Buffer, )*
            $( $(#[$om])* pub $o: $ot, )*
        }

        impl $name {
            pub fn new($gpu: &Gpu, $z: &Shape) -> Result<$name> {
                Ok($name {
                    $( $f: $gpu.buffer(4 * ($len) as u64, stringify!($f))?, )*
                    $( $o: $new, )*
                })
            }

            /// GPU bytes [`Self::new`] allocates (a buffer takes at least 4 bytes).
            pub fn bytes($z: &Shape) -> u64 {
                0 $( + 4 * (($len) as u64).max(1) )* $( + $bytes )*
            }
        }
    };
}

scratch! {
    /// Everything one forward chunk of up to `z.c` rows works in.
    struct Scratch for z, gpu;
    f32 {
        /// Token ids of the chunk (u32); a token picked on the GPU lands in `ids[0]`.
        ids: z.c,
        /// RoPE's cos/sin for the chunk's positions.
        cos_sin: z.c * z.cfg.qk_rope_head_dim,
        /// Where each row sits (u32 pairs: its cache row of position 0, its position; see
        /// `crate::kernels::Causal::places`).
        places: 2 * z.c,
        /// The residual stream.
        h: z.c * z.cfg.hidden_size,
        /// The normalized input of the current block.
        x: z.c * z.cfg.hidden_size,
        /// A block's output before it is added to `h`.
        tmp_h: z.c * z.cfg.hidden_size,
        /// `[q_a | kv_a | indexer key]` of each row (the layer's `qkv_a`).
        qkv: z.c * qkv_cols(z.cfg),
        qa: z.c * z.cfg.q_lora_rank,
        /// `[q | indexer queries]` of each row (the layer's `q_b`).
        qi: z.c * qi_cols(z.cfg),
        q_abs: z.c * z.cfg.num_attention_heads * z.cfg.kv_lora_rank,
        o_lat: z.c * z.cfg.num_attention_heads * z.cfg.kv_lora_rank,
        attn: z.c * z.cfg.num_attention_heads * z.cfg.v_head_dim,
        /// Indexer head weights.
        iw: z.c * z.cfg.index_n_heads,
        /// Indexer scores, `[c, ctx]`.
        scores: z.c * z.ctx,
        /// The selected positions per query row (u32) and their count.
        sel_idx: z.c * z.sel,
        sel_cnt: z.c,
        router_logits: z.c * z.cfg.n_routed_experts.max(1),
        /// The fused router's counts and logits, a block per row of up to 8 (`router::route_gemv`;
        /// counts zero between uses).
        router_tally: crate::kernels::router::tally_words(z.cfg.n_routed_experts.max(1)),
        /// The routed experts of each row (u32) and their weights.
        router_idx: z.c * pairs(z.cfg),
        router_weights: z.c * pairs(z.cfg),
        /// The expert slot of each routed pair, for layers that stream their experts
        /// (natively; the browser never streams).
        #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
        expert_slots: z.c * z.cfg.num_experts_per_tok,
        /// The next layer's predicted experts and their weights (prefetch).
        #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
        prefetch_idx: z.c * z.cfg.num_experts_per_tok,
        #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
        prefetch_weights: z.c * z.cfg.num_experts_per_tok,
        moe_gate_up: z.c * pairs(z.cfg) * 2 * z.cfg.moe_intermediate_size.max(1),
        moe_act: z.c * pairs(z.cfg) * z.cfg.moe_intermediate_size.max(1),
        /// Each routed pair's expert output, before the weighted sum.
        moe_out: z.c * pairs(z.cfg) * z.cfg.hidden_size,
        /// A hybrid round's CPU outputs, one write in the CPU's pair order; copies put each
        /// into its pair's row of `moe_out` (natively; the browser has no CPU experts).
        #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
        cpu_out: z.c.min(crate::experts::CPU_MAX_ROWS) * pairs(z.cfg) * z.cfg.hidden_size,
        mlp_gate_up: z.c * 2 * z.mlp_inter(),
        mlp_act: z.c * z.mlp_inter(),
        logits: z.logits * z.cfg.vocab_size,
        /// Speculative decoding (draft.rs), where the model runs an MTP layer: the main
        /// model's hidden rows after its final norm (then the MTP layer's own, after
        /// `shared_head.norm`), and the MTP input `[enorm(embedding) | hnorm(hidden)]`.
        mtp_h: z.c * z.cfg.hidden_size * mtp(z.cfg),
        mtp_cat: z.c * 2 * z.cfg.hidden_size * mtp(z.cfg),
        /// x quantized once for the integer-dot GEMVs that read it (`matmul::quantize_x`)
        /// at a decode step or a verification's few rows: the block input, then the q LoRA
        /// row or the attention output, then the SwiGLU output (one row per routed pair).
        xq_x: xq_words(z.cfg.hidden_size, xq_rows(z.c)),
        xq_qa: xq_words(
            z.cfg.q_lora_rank.max(z.cfg.num_attention_heads * z.cfg.v_head_dim),
            xq_rows(z.c),
        ),
        xq_act: xq_words(z.mlp_inter(), xq_rows(z.c))
            .max(xq_words(z.cfg.moe_intermediate_size, xq_rows(z.c) * pairs(z.cfg))),
    }
    other {
        /// The indexer's top-k over `[c, ctx]` scores.
        topk: TopkScratch = TopkScratch::new(gpu, z.c as u32)?,
            bytes TopkScratch::bytes_for(z.c as u32);
        /// GPU picking: the penalized logits row, its candidates, the argmax partials.
        sample: SampleScratch = SampleScratch::new(gpu, z.cfg.vocab_size as u32)?,
            bytes SampleScratch::bytes_for(z.cfg.vocab_size as u32);
        /// Where steps that pick their token on the GPU leave it for the host (two, so one
        /// can be read while the next step writes the other).
        picked: [wgpu::Buffer; 2] = [0, 1].map(|_| picked_slot(gpu)),
            bytes 2 * 4;
        /// Sparse MLA's GEMMs at a prefill chunk's rows: the device scratch they take on
        /// first use (`attention::sparse_mla`), counted here so memory plans hold it.
        #[allow(dead_code)]
        mla_gemm: () = (),
            bytes crate::kernels::attention::gemm_scratch_bytes(
                &crate::kernels::attention::MlaDims::of(z.cfg),
                z.c as u32,
                z.sel as u32,
            );
    }
}

impl Scratch {
    /// Where a session's next input token lies (`ids[0]`): a step's pick goes there.
    pub(super) fn next_token(&self) -> crate::kernels::sample::TokenSlot<'_> {
        crate::kernels::sample::TokenSlot {
            ids: &self.ids,
            index: 0,
        }
    }
}

/// 1 where the model runs an MTP layer, else 0.
fn mtp(cfg: &Config) -> usize {
    cfg.num_nextn_predict_layers.min(1)
}

/// Columns of `qkv`: q_a, kv_a and the indexer's key of a row.
pub(super) fn qkv_cols(c: &Config) -> usize {
    c.q_lora_rank + c.kv_lora_rank + c.qk_rope_head_dim + c.index_head_dim
}

/// Columns of `qi`: a row's queries and the indexer's queries.
pub(super) fn qi_cols(c: &Config) -> usize {
    c.num_attention_heads * c.qk_head_dim() + c.index_n_heads * c.index_head_dim
}

/// Token rows a forward quantizes x for at most (`c` rows per chunk).
fn xq_rows(c: usize) -> usize {
    c.min(crate::kernels::matmul::GEMV_MAX_ROWS as usize)
}

/// f32 words of `rows` quantized rows of `k` columns.
fn xq_words(k: usize, rows: usize) -> usize {
    (crate::kernels::matmul::xq_bytes(k as u32, rows as u32) / 4) as usize
}

/// A mappable 4-byte slot for one picked token.
fn picked_slot(gpu: &Gpu) -> wgpu::Buffer {
    gpu.create_buffer(&wgpu::BufferDescriptor {
        label: Some("picked token"),
        size: 4,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bard() -> Config {
        let dir = crate::config::bard_dir();
        Config::from_dir(&dir).unwrap()
    }

    /// The built-in model's config with GLM-5's widths.
    fn glm5_widths() -> Config {
        let mut c = bard();
        c.hidden_size = 6144;
        c.vocab_size = 154880;
        c.num_attention_heads = 64;
        c.kv_lora_rank = 512;
        c.intermediate_size = 12288;
        c.moe_intermediate_size = 2048;
        c.num_experts_per_tok = 8;
        c.n_shared_experts = 1;
        c
    }

    /// Large models prefill in chunks of 512 rows and leave at most 128 rows of logits; the
    /// built-in model keeps chunks of 128; a binding too small for 512 rows of the widest
    /// scratch takes fewer.
    #[test]
    fn chunks_are_512_rows_for_large_models_and_logits_128() {
        let glm = glm5_widths();
        let s = Shape::new(&glm, 4096, false, 2047 << 20, false);
        assert_eq!((s.c, s.logits), (CHUNK_ROWS, LOGIT_ROWS));
        // Streamed experts: chunks of 2,048 rows, still 128 rows of logits.
        let s = Shape::new(&glm, 4096, false, 2047 << 20, true);
        assert_eq!((s.c, s.logits), (WIDE_CHUNK_ROWS, LOGIT_ROWS));
        let bard = bard();
        for wide in [false, true] {
            let s = Shape::new(&bard, 1024, false, 2047 << 20, wide);
            assert_eq!((s.c, s.logits), (SMALL_CHUNK_ROWS, SMALL_CHUNK_ROWS));
        }
        // 128 MiB bindings: the absorbed queries (64 heads × 512 a row) allow 1,024 rows,
        // the scores of a 131,072 context 256.
        let s = Shape::new(&glm, 131072, false, 128 << 20, true);
        assert_eq!(s.c, 256);
        // The planner's scratch bytes count the logits of 128 rows, not 512.
        let rows = |z: &Shape| z.logits * glm.vocab_size * 4;
        assert_eq!(
            rows(&Shape::new(&glm, 4096, false, 2047 << 20, false)),
            128 * 154880 * 4
        );
        // A binding of 64 MiB holds 108 rows of GLM-5's logits.
        assert_eq!(Shape::new(&glm, 4096, false, 64 << 20, false).logits, 108);
    }
}
