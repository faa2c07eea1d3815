//! Replacement policies of the routed-expert cache on real routing: the built-in model
//! (trained, so its routing is what a trained MoE does) reads a held-out passage and
//! continues it; every MoE layer's choices are recorded per token and replayed through
//! LRU, LFU with several decays and Belady's optimum, for every slot count; and the
//! prefetch predictor (the next layer's router applied to this layer's input) is scored.
//!
//! `cargo run --release --example expert_policies [decode tokens (default 256)]`

use sparsa::experts::policy::{belady, simulate, Policy};
use sparsa::generate::{generate, Sampler, SamplingParams};
use sparsa::gpu::Gpu;
use sparsa::model::{self, GpuMemory};
use sparsa::model::{Budget, Model, ModelSource};
use std::sync::Arc;

fn main() -> sparsa::Result<()> {
    let decode: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(256);
    let src = ModelSource::builtin()?;
    let cfg = &src.config;
    let (e, k) = (cfg.n_routed_experts, cfg.num_experts_per_tok);
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bard/heldout.txt"),
    )
    .map_err(|err| sparsa::Error::msg(format!("heldout.txt: {err}")))?;
    let prompt = src.tokenizer()?.encode(&text)?;
    let ctx = prompt.len() + decode + 1;
    let gpu = Arc::new(Gpu::new(None)?);
    // One slot fewer than experts on every MoE layer: every layer streams, so every layer's
    // routing is read back and recorded (the trace does not depend on the cache).
    let p = model::plan(cfg, &src.weights, 1 << 50, ctx, gpu.max_binding(), None)?;
    for prefetch in [false, true] {
        let budget = Budget {
            memory: GpuMemory::Bytes(
                p.fixed() + p.slots.moe_layers() as u64 * p.slots.expert_bytes * (e as u64 - 1),
            ),
            ctx,
            cache: None,
            policy: Policy::Lru,
            prefetch,
            cpu: sparsa::experts::CpuExperts::Off,
            cpu_threads: 0,
            placement: Default::default(),
            host_copy: sparsa::experts::HostCopy::Off,
            host_embeddings: sparsa::experts::HostCopy::Off,
        };
        let model = Model::from_source_within(&src, gpu.clone(), &mut |_, _| {}, Some(&budget))?;
        let off = model.offload.as_ref().expect("offloaded");
        off.record_trace(true);
        let mut s = model.session(ctx)?;
        let mut sampler = Sampler::new(SamplingParams::default());
        generate(&mut s, &prompt, decode, &mut sampler, &[], |_| true)?;
        let trace = off.record_trace(false).unwrap_or_default();
        if prefetch {
            println!(
                "\nprefetch predictor over {decode} decode steps: {}",
                off.stats().line()
            );
            break;
        }
        // Per layer, per token.
        let per_token: Vec<Vec<Vec<u32>>> = trace
            .iter()
            .map(|chunks| {
                chunks
                    .iter()
                    .flat_map(|c| c.chunks(k).map(|t| t.to_vec()).collect::<Vec<_>>())
                    .collect()
            })
            .collect();
        let layers: Vec<&Vec<Vec<u32>>> = per_token.iter().filter(|t| !t.is_empty()).collect();
        println!(
            "built-in model: {} MoE layers, {e} experts, {k} per token; {} prompt + {decode} generated tokens",
            layers.len(),
            prompt.len()
        );
        let policies = [
            Policy::Lru,
            Policy::Lfu { decay: 0.5 },
            Policy::Lfu { decay: 0.8 },
            Policy::Lfu { decay: 0.95 },
            Policy::Lfu { decay: 0.99 },
            Policy::Lfu { decay: 1.0 },
        ];
        print!("{:>6}", "slots");
        for p in &policies {
            print!(" {:>9}", p.to_string());
        }
        println!(" {:>9}", "belady");
        for slots in 1..e {
            print!("{slots:>6}");
            let avg = |f: &dyn Fn(&[Vec<u32>]) -> f64| {
                layers.iter().map(|t| f(t)).sum::<f64>() / layers.len() as f64
            };
            for &p in &policies {
                print!(" {:>8.1}%", 100.0 * avg(&|t| simulate(t, e, slots, p)));
            }
            println!(" {:>8.1}%", 100.0 * avg(&|t| belady(t, slots)));
        }
    }
    Ok(())
}
