//! Decode GEMVs of the GLM-5 shapes, one weight matrix at a time: GPU time per dispatch
//! (timestamp queries) and the share of the measured copy bandwidth, per format. For tuning
//! the GEMV kernels on a real GPU; `sparsa bench` reports them per model step.
//!
//!     cargo run --release --example gemv_shapes -- [q4,q8,bf16] [reps] [rows,...]
//!
//! `rows` (default 1): rows of x per product, each list entry a pass over the shapes (a
//! batched decode step's or a verification's several rows: x is then quantized once, as
//! the forward does, and the GEMVs read the weights once for all rows).
//!
//! `SPARSA_GEMV_XQ=1`: x is quantized once beforehand (`matmul::quantize_x`, timed apart)
//! and q4 GEMVs read it; `SPARSA_GEMV_UNROLL` / `SPARSA_GEMV_TPR` override the integer-dot
//! GEMV's knobs. It ends with the cost of a dispatch: chains of dependent small dispatches
//! timed by the host clock, and the same under timestamp queries.
use sparsa::gpu::Gpu;
use sparsa::kernels::{matmul, View};

#[path = "common/weights.rs"]
mod weights;
use weights::weight;

/// (name, rows, cols) of the matrices one GLM-5 decode step multiplies by.
const SHAPES: &[(&str, usize, usize)] = &[
    ("q_a", 2048, 6144),
    ("q_b", 16384, 2048),
    ("kv_a", 576, 6144),
    ("indexer wq_b", 4096, 2048),
    ("indexer wk", 128, 6144),
    ("o", 6144, 16384),
    ("dense gate_up", 24576, 6144),
    ("dense down", 6144, 12288),
    ("shared gate_up", 4096, 6144),
    ("shared down", 6144, 2048),
    ("lm_head", 154880, 6144),
];

fn main() -> sparsa::Result<()> {
    let mut args = std::env::args().skip(1);
    let formats = args.next().unwrap_or_else(|| "q4,q8,bf16".into());
    let reps: u32 = args.next().and_then(|r| r.parse().ok()).unwrap_or(20);
    let row_counts: Vec<u32> = args
        .next()
        .map(|r| r.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_else(|| vec![1]);
    let gpu = Gpu::new(None)?;
    let cal = sparsa::bench::calibrate(&gpu)?;
    let bw = cal.copy_bytes_per_s;
    println!("{}", gpu.adapter.line());
    println!(
        "copy bandwidth {:.1} GB/s, {}; {reps} dispatches per shape",
        bw / 1e9,
        cal.rates()
    );
    let xv: Vec<f32> = (0..154880)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let x = gpu.buffer_from(&xv, "x")?;
    let xq_on = std::env::var("SPARSA_GEMV_XQ").is_ok_and(|v| v == "1");
    let max_rows = row_counts.iter().copied().max().unwrap_or(1);
    let xq_buf = gpu.buffer(matmul::xq_bytes(16384, max_rows), "xq")?;
    let y = gpu.buffer(4 * 154880 * max_rows as u64, "y")?;
    for (fmt, x_rows) in formats
        .split(',')
        .flat_map(|f| row_counts.iter().map(move |&r| (f, r)))
    {
        let xq_on = xq_on || x_rows > 1;
        // Lines are labelled with the format and the rows of x: q4x8.
        let label = format!("{fmt}x{x_rows}");
        println!(
            "\n{label}: {:<16} {:>7} {:>6} {:>9} {:>9} {:>5}",
            "matrix", "rows", "cols", "MB", "us", "%bw"
        );
        let (mut all_b, mut all_t) = (0.0, 0.0);
        for &(name, rows, cols) in SHAPES {
            let w = weight(&gpu, fmt, rows, cols)?;
            let xview = View::rows(&x, cols as u32);
            let order = xq_on.then(|| matmul::takes_xq(xview, &w)).flatten();
            let run = |n: u32| -> sparsa::Result<()> {
                let mut rec = gpu.recorder();
                let q = order
                    .map(|o| matmul::quantize_x(&mut rec, xview, x_rows, cols as u32, o, &xq_buf));
                for _ in 0..n {
                    let yv = View::rows(&y, rows as u32);
                    match &q {
                        Some(q) => matmul::matmul_xq(&mut rec, q, xview, &w, yv),
                        None => matmul::matmul(&mut rec, xview, &w, yv, x_rows),
                    }
                }
                rec.finish()
            };
            // Keep the GPU busy for a while first: after the host work of making the weight
            // it may have lowered its clocks.
            let t = std::time::Instant::now();
            while t.elapsed().as_secs_f64() < 0.3 {
                run(reps)?;
            }
            gpu.set_profiling(true);
            run(reps)?;
            let k = gpu.take_profile();
            gpu.set_profiling(false);
            let gemv = |s: &&sparsa::gpu::KernelStat| !s.name.contains("quantize");
            let secs: f64 = k.iter().filter(gemv).map(|s| s.seconds).sum::<f64>() / reps as f64;
            let b = k.iter().filter(gemv).map(|s| s.bytes).sum::<u64>() as f64 / reps as f64;
            if let Some(q) = k.iter().find(|s| s.name.contains("quantize")) {
                println!(
                    "{label}: {name:<16} x quantized once: {:.1} us",
                    q.seconds * 1e6 / q.count as f64
                );
            }
            all_b += b;
            all_t += secs;
            println!(
                "{label}: {name:<16} {rows:>7} {cols:>6} {:>9.1} {:>9.1} {:>5.0}",
                b / 1e6,
                secs * 1e6,
                100.0 * b / secs / bw
            );
        }
        println!(
            "{label}: {:<16} {:>7} {:>6} {:>9.1} {:>9.1} {:>5.0}",
            "all",
            "",
            "",
            all_b / 1e6,
            all_t * 1e6,
            100.0 * all_b / all_t / bw
        );
    }
    dispatch_cost(&gpu)
}

/// Host-clock time per dispatch of chains of dependent dispatches (each reads what the last
/// wrote): RMSNorm of a 6144 row (one workgroup) and a 1-element add; then the same under
/// timestamp queries (what `sparsa bench`'s kernel table pays on top).
fn dispatch_cost(gpu: &Gpu) -> sparsa::Result<()> {
    use sparsa::kernels::{elementwise, norm};
    let d = 6144u32;
    let a = gpu.buffer_from(&vec![0.5f32; d as usize], "a")?;
    let b = gpu.buffer_from(&vec![0.25f32; d as usize], "b")?;
    let wn = gpu.buffer_from(&vec![1.0f32; d as usize], "norm w")?;
    let n = 1000u32;
    let chain =
        |what: &str, profiled: bool| -> sparsa::Result<()> {
            let run = |n: u32| -> sparsa::Result<()> {
                let mut rec = gpu.recorder();
                for i in 0..n {
                    let (src, dst) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
                    match what {
                        "rms_norm" => norm::rms_norm(
                            &mut rec,
                            View::rows(src, d),
                            &wn,
                            View::rows(dst, d),
                            1,
                            d,
                            1e-6,
                        ),
                        _ => {
                            elementwise::add(&mut rec, View::rows(src, d), View::rows(dst, d), 1, 1)
                        }
                    }
                }
                rec.finish()?;
                gpu.sync()
            };
            run(50)?;
            gpu.set_profiling(profiled);
            let t = std::time::Instant::now();
            run(n)?;
            let secs = t.elapsed().as_secs_f64();
            let k = gpu.take_profile();
            gpu.set_profiling(false);
            let gpu_us: f64 = k.iter().map(|s| s.seconds).sum::<f64>() * 1e6 / n as f64;
            println!(
            "dispatch chain {what:<9} timestamps {:<3}: {:.2} us per dispatch by the host clock{}",
            if profiled { "on" } else { "off" },
            secs * 1e6 / n as f64,
            if profiled { format!(", {gpu_us:.2} us by timestamps") } else { String::new() }
        );
            Ok(())
        };
    println!();
    for what in ["rms_norm", "add"] {
        chain(what, false)?;
        chain(what, true)?;
    }
    Ok(())
}
