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
        let bytes = (max_ctx * row * 4) as u64;
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
                        (max_ctx * cfg.index_head_dim * 4) as u64,
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

    /// GPU bytes held by the caches.
    pub fn bytes(&self) -> u64 {
        self.latent.iter().map(|b| b.size()).sum::<u64>()
            + self.keys.iter().flatten().map(|b| b.size()).sum::<u64>()
    }
}
