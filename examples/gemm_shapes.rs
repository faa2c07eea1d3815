//! Prefill GEMMs of the GLM-5 shapes, one weight matrix at a time, at several chunk sizes:
//! GPU time per dispatch (timestamp queries), TFLOP/s and the share of the measured peaks
//! (tensor cores where the tile runs on them, else f32 FMA). For tuning the GEMM tiles on a
//! real GPU; `sparsa bench --prompt-len` reports them per model step.
//!
//!     cargo run --release --example gemm_shapes -- [q4,q8,bf16] [reps] [rows,...]
//!
//! `rows` (default 128,512,2048): token rows per product (a prefill chunk). The routed
//! experts (16 of them, 8 per row, routed at random) run as the forward runs them: gate and
//! up over each row's x, down over each slot's own row. The products are recorded as a
//! prompt's prefill records them (`Recorder::set_prefill`).
use sparsa::gpu::Gpu;
use sparsa::kernels::matmul::{self, Routed};
use sparsa::kernels::View;

#[path = "common/weights.rs"]
mod weights;
use weights::weight;

/// (name, rows, cols) of the dense matrices one GLM-5 layer multiplies a chunk by (the
/// forward's fused ones: `[q_a | kv_a | indexer wk]`, `[q_b | indexer wq_b]`).
const DENSE: &[(&str, usize, usize)] = &[
    ("qkv_a", 2752, 6144),
    ("q_b + wq_b", 20480, 2048),
    ("o", 6144, 16384),
    ("shared gate_up", 4096, 6144),
    ("shared down", 6144, 2048),
];

/// Routed experts: (name, rows per expert, cols, x per slot).
const EXPERTS: &[(&str, usize, usize, bool)] = &[
    ("experts gate_up", 4096, 6144, false),
    ("experts down", 6144, 2048, true),
];
const N_EXPERTS: u32 = 16;
const TOPK: u32 = 8;

fn main() -> sparsa::Result<()> {
    let mut args = std::env::args().skip(1);
    let formats = args.next().unwrap_or_else(|| "q4".into());
    let reps: u32 = args.next().and_then(|r| r.parse().ok()).unwrap_or(5);
    let row_counts: Vec<u32> = args
        .next()
        .map(|r| r.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_else(|| vec![128, 512, 2048]);
    let gpu = Gpu::new(None)?;
    let cal = sparsa::bench::calibrate(&gpu)?;
    println!("{}", gpu.adapter.line());
    println!("{}; {reps} dispatches per shape", cal.rates());
    let peak = cal.mma_flops_per_s.unwrap_or(cal.fma_flops_per_s);
    let max_rows = row_counts.iter().copied().max().unwrap_or(1) as usize;
    // x: the widest per-slot input (2048 columns a slot) or the widest row (16384).
    let x_len = (max_rows * 16384).max(max_rows * TOPK as usize * 2048);
    let xv: Vec<f32> = (0..x_len)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let x = gpu.buffer_from(&xv, "x")?;
    drop(xv);
    let y = gpu.buffer(4 * (max_rows * TOPK as usize * 6144) as u64, "y")?;
    // Routing: each row's 8 distinct experts of 16, at random.
    let mut seed = 12345u64;
    let ids: Vec<u32> = (0..max_rows)
        .flat_map(|_| {
            let mut picked = Vec::with_capacity(TOPK as usize);
            while picked.len() < TOPK as usize {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let e = (seed % N_EXPERTS as u64) as u32;
                if !picked.contains(&e) {
                    picked.push(e);
                }
            }
            picked
        })
        .collect();
    let ids = gpu.buffer_from(&ids, "expert ids")?;
    for fmt in formats.split(',') {
        println!(
            "\n{fmt}: {:<16} {:>6} {:>7} {:>6} {:>9} {:>10} {:>7} {:>5}",
            "matrix", "rows", "n", "k", "GFLOP", "us", "TFLOP/s", "%peak"
        );
        let mut shapes: Vec<(&str, usize, usize, Option<bool>)> =
            DENSE.iter().map(|&(n, r, c)| (n, r, c, None)).collect();
        shapes.extend(EXPERTS.iter().map(|&(n, r, c, ps)| (n, r, c, Some(ps))));
        for (name, rows, cols, routed) in shapes {
            let stacked = if routed.is_some() {
                N_EXPERTS as usize
            } else {
                1
            };
            let w = weight(&gpu, fmt, rows * stacked, cols)?;
            for &m in &row_counts {
                let run = |n: u32| -> sparsa::Result<()> {
                    let mut rec = gpu.recorder();
                    // As a prompt's prefill records them (q4: x as one f16 value, unless
                    // SPARSA_COOP_X_F16=0).
                    rec.set_prefill(true);
                    for _ in 0..n {
                        let xv = View::rows(&x, cols as u32);
                        match routed {
                            None => {
                                matmul::matmul(&mut rec, xv, &w, View::rows(&y, rows as u32), m)
                            }
                            Some(per_slot) => {
                                let r = Routed {
                                    ids: &ids,
                                    n_experts: N_EXPERTS,
                                    topk: TOPK,
                                };
                                let yv = View::rows(&y, rows as u32);
                                matmul::matmul_experts(&mut rec, xv, per_slot, &w, &r, yv, m)
                            }
                        }
                    }
                    rec.finish()
                };
                let t = std::time::Instant::now();
                while t.elapsed().as_secs_f64() < 0.3 {
                    run(reps)?;
                    gpu.sync()?;
                }
                gpu.set_profiling(true);
                run(reps)?;
                let k = gpu.take_profile();
                gpu.set_profiling(false);
                let secs: f64 = k.iter().map(|s| s.seconds).sum::<f64>() / reps as f64;
                let slots = if routed.is_some() { TOPK as f64 } else { 1.0 };
                let flop = 2.0 * m as f64 * slots * rows as f64 * cols as f64;
                println!(
                    "{fmt}: {name:<16} {m:>6} {rows:>7} {cols:>6} {:>9.1} {:>10.1} {:>7.1} {:>5.1}",
                    flop / 1e9,
                    secs * 1e6,
                    flop / secs / 1e12,
                    100.0 * flop / secs / peak
                );
            }
        }
    }
    Ok(())
}
