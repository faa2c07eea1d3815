//! Every kernel's shapes for one model, derived from its [`Config`] once per session, so
//! the forward pass hands each kernel one struct instead of a dozen numbers.

use crate::config::Config;
use crate::kernels::attention::MlaDims;
use crate::kernels::indexer::IndexerDims;
use crate::kernels::rope::RopeSlice;
use crate::kernels::router::Routing;

pub(super) struct Dims {
    pub mla: MlaDims,
    pub indexer: IndexerDims,
    pub routing: Routing,
    /// RoPE on the last `qk_rope_head_dim` dims of each query head.
    pub rope_q: RopeSlice,
    /// RoPE on `k_pe`, the last `qk_rope_head_dim` values of a latent cache row.
    pub rope_k_pe: RopeSlice,
    /// RoPE on the first `qk_rope_head_dim` dims of each indexer query head.
    pub rope_index_q: RopeSlice,
    /// RoPE on the indexer key (one head).
    pub rope_index_k: RopeSlice,
}

impl Dims {
    pub fn of(cfg: &Config) -> Dims {
        let mla = MlaDims::of(cfg);
        let indexer = IndexerDims::of(cfg);
        let (dn, dr) = (mla.dn, mla.dr);
        let mla_rope = |heads, head_stride, rot_off| RopeSlice {
            heads,
            head_stride,
            rot_off,
            rot_dim: dr,
            interleave: cfg.mla_rope_interleave,
        };
        let index_rope = |heads| RopeSlice {
            heads,
            head_stride: indexer.dim,
            rot_off: 0,
            rot_dim: dr,
            interleave: cfg.indexer_rope_interleave,
        };
        Dims {
            mla,
            indexer,
            routing: Routing::of(cfg),
            rope_q: mla_rope(mla.heads, dn + dr, dn),
            rope_k_pe: mla_rope(1, mla.kv_lora + dr, mla.kv_lora),
            rope_index_q: index_rope(indexer.heads),
            rope_index_k: index_rope(1),
        }
    }
}
