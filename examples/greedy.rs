//! The library API in a dozen lines: load a model directory, prefill token ids, decode greedily.
//!
//!     cargo run --example greedy -- tests/data/glm52 1,2,3,4,5
use sparsa::generate::{generate, Sampler, SamplingParams};
use sparsa::gpu::Gpu;
use sparsa::model::Model;
use std::sync::Arc;

fn main() -> sparsa::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "tests/data/glm52".into());
    let ids: Vec<u32> = args
        .next()
        .unwrap_or_else(|| "1,2,3".into())
        .split(',')
        .filter_map(|x| x.parse().ok())
        .collect();
    let gpu = Arc::new(Gpu::new(None)?);
    let model = Model::load(std::path::Path::new(&dir), gpu, &mut |_, _| {})?;
    let mut session = model.session(ids.len() + 16)?;
    let mut sampler = Sampler::new(SamplingParams::default());
    let (out, _) = generate(
        &mut session,
        &ids,
        16,
        &mut sampler,
        &model.config.eos_token_ids,
        |_| true,
    )?;
    println!("{out:?}");
    Ok(())
}
