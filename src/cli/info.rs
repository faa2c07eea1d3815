//! `sparsa info`: a model's architecture, parameters, bytes per tensor class, memory plan and
//! adapter limits.

use super::{open_source, ModelArgs};
use sparsa::config::IndexerKind;
use sparsa::gpu::Gpu;
use sparsa::model::info::{summarize, TensorClass};
use sparsa::Result;

pub fn run(m: ModelArgs) -> Result<()> {
    let src = open_source(&m)?;
    let c = &src.config;
    let s = summarize(c, &src.weights)?;
    let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
    let gp = |p: u64| {
        if p >= 1_000_000_000 {
            format!("{:.2}B", p as f64 / 1e9)
        } else {
            format!("{:.2}M", p as f64 / 1e6)
        }
    };
    println!("model: {}", src.label);
    println!(
        "architecture: {:?}, {} layers ({} dense MLP), hidden {}, vocab {}, max positions {}",
        c.family,
        c.num_hidden_layers,
        c.dense_layers.iter().filter(|d| **d).count(),
        c.hidden_size,
        c.vocab_size,
        c.max_position_embeddings
    );
    println!(
        "attention: MLA, {} heads, q_lora {}, kv_lora {}, nope {} + rope {}, v {}; RoPE {:?}",
        c.num_attention_heads,
        c.q_lora_rank,
        c.kv_lora_rank,
        c.qk_nope_head_dim,
        c.qk_rope_head_dim,
        c.v_head_dim,
        c.rope.kind
    );
    let pattern: String = c
        .indexer_types
        .iter()
        .map(|k| if *k == IndexerKind::Full { 'F' } else { 'S' })
        .collect();
    println!(
        "indexer: {} heads × {}, top-{}, RoPE {}; layers (F = full, S = IndexShare): {pattern}",
        c.index_n_heads,
        c.index_head_dim,
        c.index_topk,
        if c.indexer_rope_interleave {
            "interleaved"
        } else {
            "half-split"
        }
    );
    println!(
        "MoE: {} routed experts, top-{} (groups {} / top {}), {} shared, expert width {}",
        c.n_routed_experts,
        c.num_experts_per_tok,
        c.n_group,
        c.topk_group,
        c.n_shared_experts,
        c.moe_intermediate_size
    );
    println!(
        "parameters: {} total, {} active per token; stored as {}{}",
        gp(s.params_total),
        gp(s.params_active),
        s.formats.join(" + "),
        c.quant
            .map(|q| format!(" (quantization_config: {} block {})", q.name(), q.block()))
            .unwrap_or_default()
    );
    println!(
        "{:<16} {:>10} {:>12} {:>12}",
        "tensors", "params", "file", "GPU"
    );
    for class in TensorClass::ALL {
        let cl = s.class(class);
        if cl.file_bytes == 0 {
            continue;
        }
        println!(
            "{:<16} {:>10} {:>12} {:>12}",
            class.name(),
            gp(cl.params),
            mb(cl.file_bytes),
            mb(cl.gpu_bytes)
        );
    }
    if s.skipped_tensors > 0 {
        println!(
            "({} tensors past num_hidden_layers (MTP) are not loaded)",
            s.skipped_tensors
        );
    }
    let ctx = m.ctx.unwrap_or(c.max_position_embeddings);
    let cache = s.cache_bytes_per_token.saturating_mul(ctx as u64);
    println!(
        "memory plan at --ctx {ctx}: weights {} + caches {} ({} per token: latent MLA {} floats × {} layers, indexer keys {} floats × {} full layers) = {}",
        mb(s.gpu_weight_bytes()),
        mb(cache),
        s.cache_bytes_per_token,
        c.kv_lora_rank + c.qk_rope_head_dim,
        c.num_hidden_layers,
        c.index_head_dim,
        c.indexer_types.iter().filter(|k| **k == IndexerKind::Full).count(),
        mb(s.gpu_weight_bytes().saturating_add(cache))
    );
    match Gpu::new(m.adapter.as_deref()) {
        Ok(gpu) => {
            println!("adapter: {}", gpu.adapter.line());
            let row = ((c.kv_lora_rank + c.qk_rope_head_dim) * 4) as u64;
            println!(
                "longest context one latent-cache binding allows: {} tokens",
                gpu.max_binding() / row.max(1)
            );
            if let Some(mem) = m.gpu_memory {
                let bytes = mem.bytes(gpu.memory_size())?;
                let scratch = sparsa::model::Session::scratch_bytes(c, ctx, gpu.max_binding());
                let p = sparsa::model::plan(c, &src.weights, bytes, ctx, scratch)?;
                println!("{}", p.describe());
            }
            if let Some(b) = gpu.memory_size() {
                println!(
                    "adapter memory (largest device-local heap): {:.2} GiB",
                    b as f64 / (1u64 << 30) as f64
                );
            }
        }
        Err(e) => println!("adapter: none ({e})"),
    }
    Ok(())
}
