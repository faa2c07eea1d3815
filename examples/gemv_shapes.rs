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
//! GEMV's knobs. After the dense matrices, the routed experts' two products (16 experts
//! stacked, as `synth --experts 16` makes them, 8 routed per row of x at fixed pseudo-random
//! choices): at several rows their kernel reads each expert once for the slots routed to it,
//! and it takes about half of a batched step, so tune on these too. The "all" line sums the
//! dense matrices only. It ends with the cost of a dispatch: chains of dependent small dispatches
//! timed by the host clock, and the same under timestamp queries.
use sparsa::gpu::Gpu;
use sparsa::kernels::{matmul, View};

#[path = "common/weights.rs"]
mod weights;
use weights::{weight, weight_in_chunks};

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

/// (name, rows of one expert, cols) of GLM-5's routed experts' products.
const EXPERT_SHAPES: &[(&str, usize, usize)] =
    &[("routed gate_up", 4096, 6144), ("routed down", 6144, 2048)];
/// Experts stacked, and routed per row of x.
const EXPERTS: usize = 16;
const TOPK: usize = 8;

/// Row t's TOPK distinct experts, pseudo-random and fixed (near-uniform over all rows, as
/// random router weights give).
fn routing(rows: u32) -> Vec<u32> {
    let mut state = 0x9e37_79b9u32;
    let mut ids = Vec::new();
    for _ in 0..rows {
        let mut order: Vec<u32> = (0..EXPERTS as u32).collect();
        for i in (1..order.len()).rev() {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            order.swap(i, state as usize % (i + 1));
        }
        ids.extend_from_slice(&order[..TOPK]);
    }
    ids
}

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
    let xq_len =
        matmul::xq_bytes(16384, max_rows).max(matmul::xq_bytes(2048, max_rows * TOPK as u32));
    let xq_buf = gpu.buffer(xq_len, "xq")?;
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
            let (b, secs) = measure(&gpu, reps, &label, name, &|rec, n| {
                let q =
                    order.map(|o| matmul::quantize_x(rec, xview, x_rows, cols as u32, o, &xq_buf));
                for _ in 0..n {
                    let yv = View::rows(&y, rows as u32);
                    match &q {
                        Some(q) => matmul::matmul_xq(rec, q, xview, &w, yv),
                        None => matmul::matmul(rec, xview, &w, yv, x_rows),
                    }
                }
            })?;
            all_b += b;
            all_t += secs;
            shape_line(&label, name, rows, cols, b, secs, bw);
        }
        let ids = gpu.buffer_from(&routing(x_rows), "expert ids")?;
        let routed = matmul::Routed {
            ids: &ids,
            n_experts: EXPERTS as u32,
            topk: TOPK as u32,
        };
        for (i, &(name, rpe, cols)) in EXPERT_SHAPES.iter().enumerate() {
            // Chunks of as many whole experts as a binding holds, as the loader makes them.
            let row_bytes = match fmt {
                "q4" => cols / 2,
                "q8" => cols,
                _ => 2 * cols,
            };
            let limit = gpu.limits.max_storage_buffer_binding_size as usize;
            let per_chunk = (limit / (rpe * row_bytes)).clamp(1, EXPERTS) * rpe;
            let w = weight_in_chunks(&gpu, fmt, EXPERTS * rpe, cols, Some(per_chunk))?;
            // gate_up reads a row of x per token row, down one per slot.
            let per_slot = i > 0;
            let x_n = if per_slot {
                x_rows * TOPK as u32
            } else {
                x_rows
            };
            let xview = View::rows(&x, cols as u32);
            let order = xq_on.then(|| matmul::takes_xq(xview, &w)).flatten();
            let (b, secs) = measure(&gpu, reps, &label, name, &|rec, n| {
                let q = order.map(|o| matmul::quantize_x(rec, xview, x_n, cols as u32, o, &xq_buf));
                for _ in 0..n {
                    let yv = View::rows(&y, rpe as u32);
                    match &q {
                        Some(q) => matmul::matmul_experts_xq(
                            rec, q, xview, per_slot, &w, &routed, yv, x_rows,
                        ),
                        None => {
                            matmul::matmul_experts(rec, xview, per_slot, &w, &routed, yv, x_rows)
                        }
                    }
                }
            })?;
            shape_line(&label, name, EXPERTS * rpe, cols, b, secs, bw);
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

/// GPU time and bytes per dispatch of what `record(rec, n)` records (`n` products after any
/// quantization of x, which is timed apart and printed), by timestamp queries over `reps`.
fn measure(
    gpu: &Gpu,
    reps: u32,
    label: &str,
    name: &str,
    record: &dyn Fn(&mut sparsa::gpu::Recorder, u32),
) -> sparsa::Result<(f64, f64)> {
    let run = |n: u32| -> sparsa::Result<()> {
        let mut rec = gpu.recorder();
        record(&mut rec, n);
        rec.finish()
    };
    // Keep the GPU busy for a while first: after the host work of making the weight it may
    // have lowered its clocks.
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
    Ok((b, secs))
}

fn shape_line(label: &str, name: &str, rows: usize, cols: usize, b: f64, secs: f64, bw: f64) {
    println!(
        "{label}: {name:<16} {rows:>7} {cols:>6} {:>9.1} {:>9.1} {:>5.0}",
        b / 1e6,
        secs * 1e6,
        100.0 * b / secs / bw
    );
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
