//! How fast the CPU expert executor (`sparsa::experts::cpu`) reads routed experts, against
//! this machine's RAM read rate measured in the same run.
//!
//! `cargo run --release --example cpu_experts -- [FORMAT] [EXPERTS] [ROUNDS]`: FORMAT q4
//! (default), q8, fp8 or bf16; EXPERTS (default 16) experts of GLM-5's shape (hidden 6144,
//! moe_intermediate 2048) with random weights; each round runs 8 of them on one token row,
//! as a decode step's layer does, cycling through all so the reads come from RAM, not cache.
//! SPARSA_CE_THREADS sets the threads (default: the runtime's default),
//! SPARSA_CE_SPIN_US how long idle threads spin before they sleep (default 5000, as the
//! runtime's on a GPU), SPARSA_CE_PER_ROUND the experts a round runs (default 8) and
//! SPARSA_CE_GAP_US a wait between rounds, the host polling meanwhile as it does for an
//! offloaded layer's routing (default 0). SPARSA_CE_BACKING says where the experts' bytes live:
//! `heap` (default, a Vec), `file` (written to a file in the temporary directory and
//! memory-mapped, as the runtime reads a model's files: the page cache), `anon` (an anonymous
//! mapping) or `thp` (an anonymous mapping advised to use transparent huge pages).
use sparsa::experts::cpu::{run_experts, CpuExpert, CpuMatrix, Scratch};
use sparsa::experts::pool::Pool;
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
    // Every matrix's weight and scale bytes, one after another, in the chosen backing.
    let backing = std::env::var("SPARSA_CE_BACKING").unwrap_or_else(|_| "heap".into());
    let total: usize = mats.iter().flatten().map(|(w, s)| w.len() + s.len()).sum();
    let fill = |dst: &mut [u8]| {
        let mut at = 0;
        for (w, s) in mats.iter().flatten() {
            dst[at..at + w.len()].copy_from_slice(w);
            at += w.len();
            dst[at..at + s.len()].copy_from_slice(s);
            at += s.len();
        }
    };
    let held: Box<dyn std::ops::Deref<Target = [u8]>> = match backing.as_str() {
        "heap" => {
            let mut v = vec![0u8; total];
            fill(&mut v);
            Box::new(v)
        }
        "file" => {
            let path = std::env::temp_dir().join(format!("cpu_experts.{}", std::process::id()));
            let mut v = vec![0u8; total];
            fill(&mut v);
            std::fs::write(&path, &v).expect("writing the experts' file");
            drop(v);
            let f = std::fs::File::open(&path).expect("opening the experts' file");
            // SAFETY: the file is this process's own and nothing writes it while mapped.
            let m = unsafe { memmap2::Mmap::map(&f) }.expect("mapping the experts' file");
            std::fs::remove_file(&path).ok();
            Box::new(m)
        }
        "anon" | "thp" => {
            let mut m = memmap2::MmapMut::map_anon(total).expect("an anonymous mapping");
            #[cfg(target_os = "linux")]
            if backing == "thp" {
                m.advise(memmap2::Advice::HugePage)
                    .expect("madvise(MADV_HUGEPAGE)");
            }
            fill(&mut m);
            Box::new(m.make_read_only().expect("mprotect"))
        }
        other => panic!("SPARSA_CE_BACKING={other}: expected heap, file, anon or thp"),
    };
    // The (weights, scales) slices of each matrix in `held`.
    let mut at = 0;
    let spans: Vec<[(&[u8], &[u8]); 3]> = mats
        .iter()
        .map(|m| {
            std::array::from_fn(|j| {
                let (w, s) = (&held[at..at + m[j].0.len()], m[j].0.len());
                at += s;
                let sc = &held[at..at + m[j].1.len()];
                at += m[j].1.len();
                (w, sc)
            })
        })
        .collect();
    let list: Vec<CpuExpert> = spans
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mat = |j: usize, n, k| {
                CpuMatrix::new(
                    &format!("expert {i} matrix {j}"),
                    format,
                    m[j].0,
                    m[j].1,
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
    let mut scratch = Scratch::default();
    let env = |name: &str, default: u64| -> u64 {
        std::env::var(name).map_or(default, |s| s.parse().expect("a number"))
    };
    let per = env("SPARSA_CE_PER_ROUND", 8) as usize;
    let gap_us = env("SPARSA_CE_GAP_US", 0);
    let threads = env(
        "SPARSA_CE_THREADS",
        sparsa::experts::default_cpu_threads() as u64,
    ) as usize;
    let spin = std::time::Duration::from_micros(env("SPARSA_CE_SPIN_US", 5000));
    let pool = Pool::new(threads, spin).expect("the executor's threads");
    let round = |first: usize, out: &mut [f32], scratch: &mut Scratch| {
        let jobs: Vec<(CpuExpert, &[&[f32]])> = (0..per)
            .map(|i| (list[(first + i) % experts], &rows[..]))
            .collect();
        run_experts(&pool, &jobs, out, scratch);
    };
    round(0, &mut out, &mut scratch);
    let t = Instant::now();
    let mut sum = 0f32;
    let mut busy = 0f64;
    for r in 0..rounds {
        if gap_us > 0 {
            let g = Instant::now();
            while g.elapsed().as_micros() < gap_us as u128 {
                std::hint::spin_loop();
            }
            busy += g.elapsed().as_secs_f64();
        }
        round(per * r, &mut out, &mut scratch);
        sum += out.iter().sum::<f32>();
    }
    let dt = t.elapsed().as_secs_f64() - busy;
    let read = (rounds * per * bytes_per_expert) as f64;
    // RAM read rate on the same threads.
    let ram = sparsa::experts::cpu::ram_read_bandwidth(&pool);
    println!(
        "{format:?} ({backing}): {} threads spinning {} us, {per} experts of {:.1} MB per round, {gap_us} us apart: {:.2} ms per round, {:.1} GB/s; RAM read {:.1} GB/s; {:.0} % of it (checksum {:.3})",
        pool.threads(),
        spin.as_micros(),
        bytes_per_expert as f64 / 1e6,
        dt / rounds as f64 * 1e3,
        read / dt / 1e9,
        ram / 1e9,
        100.0 * read / dt / ram,
        sum
    );
}
