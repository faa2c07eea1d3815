//! How fast the CPU expert executor (`sparsa::experts::cpu`) reads routed experts, against
//! this machine's RAM read rate measured in the same run.
//!
//! `cargo run --release --example cpu_experts -- [FORMAT] [EXPERTS] [ROUNDS]`: FORMAT q4
//! (default), q8, fp8 or bf16; EXPERTS (default 16) experts of GLM-5's shape (hidden 6144,
//! moe_intermediate 2048) with random weights; each round runs 8 of them on one token row,
//! as a decode step's layer does, cycling through all so the reads come from RAM, not cache.
//! RAYON_NUM_THREADS sets the threads.
use sparsa::experts::cpu::{run_experts, CpuExpert, CpuMatrix};
use sparsa::weights::quant::{quantize_fp8, quantize_rows};
use sparsa::weights::{DType, QFormat, WFormat};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let format = match args.get(1).map(String::as_str).unwrap_or("q4") {
        "q4" => WFormat::Quant(QFormat::Q4 { block: 32 }),
        "q8" => WFormat::Quant(QFormat::Q8 { block: 32 }),
        "fp8" => WFormat::Quant(QFormat::Fp8),
        "bf16" => WFormat::Float(DType::BF16),
        other => panic!("format {other}: expected q4, q8, fp8 or bf16"),
    };
    let experts: usize = args
        .get(2)
        .map_or(16, |s| s.parse().expect("EXPERTS: a number"));
    let rounds: usize = args
        .get(3)
        .map_or(20, |s| s.parse().expect("ROUNDS: a number"));
    let (hidden, inter) = (6144usize, 2048usize);
    // Random values, quantized per row block: one [n, k] matrix's bytes and scales.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut store = |n: usize, k: usize| -> (Vec<u8>, Vec<u8>) {
        let data: Vec<f32> = (0..n * k)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        match format {
            WFormat::Quant(QFormat::Fp8) => quantize_fp8(&data, n, k),
            WFormat::Quant(q) => quantize_rows(q, &data, k),
            WFormat::Float(d) => (d.from_f32(&data), Vec::new()),
        }
    };
    eprintln!("making {experts} {format:?} experts of [{inter}, {hidden}] x3 ...");
    let mats: Vec<[(Vec<u8>, Vec<u8>); 3]> = (0..experts)
        .map(|_| {
            [
                store(inter, hidden),
                store(inter, hidden),
                store(hidden, inter),
            ]
        })
        .collect();
    let bytes_per_expert: usize = mats[0].iter().map(|(w, s)| w.len() + s.len()).sum();
    let list: Vec<CpuExpert> = mats
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mat = |j: usize, n, k| {
                CpuMatrix::new(
                    &format!("expert {i} matrix {j}"),
                    format,
                    &m[j].0,
                    &m[j].1,
                    n,
                    k,
                )
                .unwrap()
            };
            CpuExpert::new(
                &format!("expert {i}"),
                mat(0, inter, hidden),
                mat(1, inter, hidden),
                mat(2, hidden, inter),
            )
            .unwrap()
        })
        .collect();
    let x: Vec<f32> = (0..hidden).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    // A round is one MoE layer of a decode step: 8 experts on the token's row, in one
    // `run_experts` call as the hybrid runtime makes it. Warm the pool first.
    let rows = [x.as_slice()];
    let mut out = vec![0f32; 8 * hidden];
    let mut scratch = Vec::new();
    let round = |first: usize, out: &mut [f32], scratch: &mut Vec<f32>| {
        let jobs: Vec<(CpuExpert, &[&[f32]])> = (0..8)
            .map(|i| (list[(first + i) % experts], &rows[..]))
            .collect();
        run_experts(&jobs, out, scratch);
    };
    round(0, &mut out, &mut scratch);
    let t = Instant::now();
    let mut sum = 0f32;
    for r in 0..rounds {
        round(8 * r, &mut out, &mut scratch);
        sum += out.iter().sum::<f32>();
    }
    let dt = t.elapsed().as_secs_f64();
    let read = (rounds * 8 * bytes_per_expert) as f64;
    // RAM read rate on the same threads.
    let ram = sparsa::experts::cpu::ram_read_bandwidth();
    println!(
        "{format:?}: {} threads, 8 experts of {:.1} MB per round: {:.2} ms per round, {:.1} GB/s; RAM read {:.1} GB/s; {:.0} % of it (checksum {:.3})",
        rayon::current_num_threads(),
        bytes_per_expert as f64 / 1e6,
        dt / rounds as f64 * 1e3,
        read / dt / 1e9,
        ram / 1e9,
        100.0 * read / dt / ram,
        sum
    );
}
