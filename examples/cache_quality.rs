//! Quality of each cache format against f32 caches (docs/CACHE.md has the numbers):
//!
//! 1. The built-in model, every pair of latent and key formats: greedy continuations of the
//!    reference prompts (tests/data/bard/reference.json) against f32 caches and against
//!    transformers, and over the held-out passage (512 tokens) the perplexity, the top-1
//!    agreement with f32 caches at every position and the largest per-token |ΔNLL|.
//! 2. Synthetic long contexts: the indexer's top-k set over N keys (32K, 128K) scored from
//!    keys stored in bf16 or int8 (rotated), against the set scored from f32 keys; keys and
//!    queries are Gaussian with a spread of per-channel scales and a few outlier channels
//!    (what LayerNorm'd keys look like), GLM-5's indexer shape (32 heads × 128, top 2048).
//!
//! cargo run --release --example cache_quality [-- --long-only | --model-only]
use sparsa::cache::{CacheFormat, KeyFormat, LatentFormat};
use sparsa::generate::{generate, Sampler, SamplingParams};
use sparsa::gpu::Gpu;
use sparsa::kernels::cache::{decode_key, encode_key, hadamard};
use sparsa::model::{Model, ModelSource};
use std::sync::Arc;

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Per-token NLL of the passage and each position's argmax.
fn nll_top1(model: &Model, f: CacheFormat, ids: &[u32]) -> (Vec<f64>, Vec<usize>) {
    let mut s = model.session_in(ids.len(), f).expect("session");
    let l = s.forward(ids, true).expect("forward");
    let mut nll = Vec::new();
    let mut top = Vec::new();
    for j in 0..ids.len() - 1 {
        let row = l.row(j);
        let (am, m) =
            row.iter().enumerate().fold(
                (0, f32::NEG_INFINITY),
                |a, (i, &x)| if x > a.1 { (i, x) } else { a },
            );
        let lse = m as f64
            + row
                .iter()
                .map(|&x| (x as f64 - m as f64).exp())
                .sum::<f64>()
                .ln();
        if j >= 1 {
            nll.push(lse - row[ids[j + 1] as usize] as f64);
        }
        top.push(am);
    }
    (nll, top)
}

fn greedy(model: &Model, f: CacheFormat, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = model.session_in(prompt.len() + n, f).expect("session");
    let mut sampler = Sampler::new(SamplingParams {
        temperature: 0.0,
        ..Default::default()
    });
    generate(&mut s, prompt, n, &mut sampler, &[], |_| true)
        .expect("generate")
        .0
}

fn prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn model_table() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let r: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.join("tests/data/bard/reference.json")).unwrap(),
    )
    .unwrap();
    let gpu = Arc::new(Gpu::new(None).expect("adapter"));
    let model = Model::from_source(&ModelSource::builtin().unwrap(), gpu, &mut |_, _| {}).unwrap();
    let hid = ids(&r["heldout"]["ids"]);
    let (base_nll, base_top) = nll_top1(&model, CacheFormat::F32, &hid);
    let greedy_ref: Vec<(Vec<u32>, Vec<u32>)> = r["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (ids(&g["ids"]), ids(&g["new"])))
        .collect();
    let base_greedy: Vec<Vec<u32>> = greedy_ref
        .iter()
        .map(|(p, w)| greedy(&model, CacheFormat::F32, p, w.len()))
        .collect();
    println!("| latent | keys | bytes/token | greedy = f32 (of 2×64) | greedy = transformers | held-out ppl | Δppl vs f32 | top-1 = f32 | max |ΔNLL| |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let ppl = |n: &[f64]| (n.iter().sum::<f64>() / n.len() as f64).exp();
    for latent in LatentFormat::ALL {
        for keys in KeyFormat::ALL {
            let f = CacheFormat { latent, keys };
            let (nll, top) = nll_top1(&model, f, &hid);
            let agree = top.iter().zip(&base_top).filter(|(a, b)| a == b).count();
            let max_d = nll
                .iter()
                .zip(&base_nll)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            let mut same_f32 = 0;
            let mut same_tf = 0;
            for ((p, want), base) in greedy_ref.iter().zip(&base_greedy) {
                let got = greedy(&model, f, p, want.len());
                same_f32 += prefix(&got, base);
                same_tf += prefix(&got, want);
            }
            println!(
                "| {} | {} | {} | {same_f32} | {same_tf} | {:.4} | {:+.3} % | {agree}/{} | {max_d:.2e} |",
                latent.name(),
                keys.name(),
                sparsa::cache::Caches::bytes_per_token(&model.config, f),
                ppl(&nll),
                (ppl(&nll) / ppl(&base_nll) - 1.0) * 100.0,
                top.len()
            );
        }
    }
}

/// A small deterministic generator (xorshift64*) and Gaussian draws.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545F4914F6CDD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn gauss(&mut self) -> f32 {
        let (u, v) = (self.next().max(1e-12), self.next());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut i: Vec<usize> = (0..scores.len()).collect();
    i.select_nth_unstable_by(k - 1, |a, b| scores[*b].total_cmp(&scores[*a]));
    i.truncate(k);
    i.sort_unstable();
    i
}

fn long_table() {
    let (heads, dim, k) = (32usize, 128usize, 2048usize);
    let mut rng = Rng(0x9E3779B97F4A7C15);
    // Per-channel scales: log-normal spread, and 4 outlier channels ×8.
    let scale: Vec<f32> = (0..dim)
        .map(|c| (0.5 * rng.gauss()).exp() * if c % 37 == 5 { 8.0 } else { 1.0 })
        .collect();
    let mean: Vec<f32> = (0..dim).map(|_| 0.5 * rng.gauss()).collect();
    println!("| keys | format | queries | mean overlap of top-{k} with f32 keys' | min |");
    println!("|---|---|---|---|---|");
    for n in [32768usize, 131072] {
        let keys: Vec<Vec<f32>> = (0..n)
            .map(|_| {
                (0..dim)
                    .map(|c| (rng.gauss() + mean[c]) * scale[c])
                    .collect()
            })
            .collect();
        let queries: Vec<(Vec<f32>, Vec<f32>)> = (0..4)
            .map(|_| {
                let q = (0..heads * dim)
                    .map(|i| rng.gauss() * scale[i % dim])
                    .collect();
                let w = (0..heads).map(|_| rng.gauss()).collect();
                (q, w)
            })
            .collect();
        let score = |q: &[f32], w: &[f32], ks: &[Vec<f32>]| -> Vec<f32> {
            ks.iter()
                .map(|key| {
                    (0..heads)
                        .map(|h| {
                            let d: f32 = q[h * dim..(h + 1) * dim]
                                .iter()
                                .zip(key)
                                .map(|(a, b)| a * b)
                                .sum();
                            w[h] * d.max(0.0)
                        })
                        .sum()
                })
                .collect()
        };
        let base: Vec<Vec<usize>> = queries
            .iter()
            .map(|(q, w)| top_k(&score(q, w, &keys), k))
            .collect();
        for fmt in [KeyFormat::Bf16, KeyFormat::I8] {
            let stored: Vec<Vec<f32>> = keys
                .iter()
                .map(|key| decode_key(fmt, &encode_key(fmt, key), dim))
                .collect();
            let mut overlaps = Vec::new();
            for ((q, w), b) in queries.iter().zip(&base) {
                let mut q = q.clone();
                if fmt.rotated() {
                    q.chunks_mut(dim).for_each(hadamard);
                }
                let got = top_k(&score(&q, w, &stored), k);
                let common = got.iter().filter(|i| b.binary_search(i).is_ok()).count();
                overlaps.push(common as f64 / k as f64);
            }
            let mean = overlaps.iter().sum::<f64>() / overlaps.len() as f64;
            let min = overlaps.iter().cloned().fold(1.0, f64::min);
            println!(
                "| {n} | {} | {} | {:.4} | {:.4} |",
                fmt.name(),
                queries.len(),
                mean,
                min
            );
        }
    }
}

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_default();
    if arg != "--long-only" {
        model_table();
    }
    if arg != "--model-only" {
        long_table();
    }
}
