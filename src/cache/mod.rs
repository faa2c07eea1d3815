//! Per-conversation caches on the GPU.
//!
//! - Latent MLA cache, per layer: `[max_ctx, kv_lora_rank + qk_rope_head_dim]` f32 rows of
//!   `c_kv` (after `kv_a_layernorm`) and the rotated `k_pe` (576 values per token for GLM-5).
//! - Indexer key cache, per *full* layer only: `[max_ctx, index_head_dim]` f32 (after
//!   `k_norm` and RoPE). IndexShare layers have none.

use crate::config::{Config, IndexerKind};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

pub struct Caches {
    pub max_ctx: usize,
    pub latent: Vec<wgpu::Buffer>,
    pub keys: Vec<Option<wgpu::Buffer>>,
}

impl Caches {
    pub fn new(gpu: &Gpu, cfg: &Config, max_ctx: usize) -> Result<Caches> {
        let row = cfg.kv_lora_rank + cfg.qk_rope_head_dim;
        // Saturating: an absurd --ctx must reach the error below, not overflow.
        let bytes = (max_ctx as u64).saturating_mul(row as u64 * 4);
        if bytes > gpu.max_binding() {
            return Err(Error::msg(format!(
                "--ctx {max_ctx}: the latent cache of one layer needs {bytes} bytes, more than the adapter's storage binding limit of {} bytes; use a smaller --ctx",
                gpu.max_binding()
            )));
        }
        let latent = (0..cfg.num_hidden_layers)
            .map(|i| gpu.buffer(bytes, &format!("latent cache {i}")))
            .collect::<Result<Vec<_>>>()?;
        let keys = cfg
            .indexer_types
            .iter()
            .enumerate()
            .map(|(i, k)| match k {
                IndexerKind::Full => gpu
                    .buffer(
                        (max_ctx as u64).saturating_mul(cfg.index_head_dim as u64 * 4),
                        &format!("indexer keys {i}"),
                    )
                    .map(Some),
                IndexerKind::Shared => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Caches {
            max_ctx,
            latent,
            keys,
        })
    }

    /// GPU bytes the caches take per token of context: a latent row on every layer and an
    /// indexer key row on every full layer.
    pub fn bytes_per_token(cfg: &Config) -> u64 {
        let latent = cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim);
        let full = cfg
            .indexer_types
            .iter()
            .filter(|k| matches!(k, IndexerKind::Full))
            .count();
        ((latent + full * cfg.index_head_dim) * 4) as u64
    }

    /// The longest context the adapter can hold for `cfg`, with `max_binding` its largest
    /// storage binding and `max_buffer` its largest buffer: every per-layer cache buffer and
    /// the `[1, ctx]` indexer score row must fit in one binding, and all the caches together
    /// in `max_buffer` bytes (wgpu reports no memory size; the largest buffer the driver
    /// allows is the estimate of what is safe to allocate). Not limited by the model's
    /// `max_position_embeddings`.
    pub fn max_ctx_for(cfg: &Config, max_binding: u64, max_buffer: u64) -> usize {
        let row = ((cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4).max(1) as u64;
        let key = (cfg.index_head_dim * 4).max(1) as u64;
        let per_token = Self::bytes_per_token(cfg).max(1);
        let n = (max_binding / row)
            .min(max_binding / key)
            .min(max_binding / 4)
            .min(max_buffer / per_token);
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// GPU bytes held by the caches.
    pub fn bytes(&self) -> u64 {
        self.latent.iter().map(|b| b.size()).sum::<u64>()
            + self.keys.iter().flatten().map(|b| b.size()).sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_token_and_max_ctx_of_the_bard_model() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/sparsa-bard-12m");
        let cfg = Config::from_dir(&dir).unwrap();
        // 8 layers x (64 + 16) f32 + 4 full indexer layers x 32 f32.
        assert_eq!(Caches::bytes_per_token(&cfg), (8 * 80 + 4 * 32) * 4);
        // The latent row (320 bytes) decides with a 1 MiB binding...
        assert_eq!(Caches::max_ctx_for(&cfg, 1 << 20, 1 << 40), (1 << 20) / 320);
        // ... and the total with a small buffer limit.
        assert_eq!(Caches::max_ctx_for(&cfg, 1 << 30, 3072 * 100), 100);
    }
}
