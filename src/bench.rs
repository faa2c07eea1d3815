//! `sparsa bench`: prefill and decode speed, per-kernel GPU time, and the adapter's measured
//! copy bandwidth and FMA rate, all in one process so every figure can be a ratio.
//!
//! - Prefill: random token ids (seeded) run through the model in its normal chunks.
//! - Decode at context L: the caches of positions `0..L` are either filled with seeded
//!   random values ([`Fill::Synthetic`], so a 128K step needs no 128K prefill) or prefilled
//!   with random tokens ([`Fill::Prefill`]); then greedy tokens are generated as `sparsa run`
//!   and `chat` generate them ([`crate::generate::generate`]: argmax on the GPU, the next step
//!   queued before the token is read) and the time between tokens is taken. For comparison,
//!   single steps are also timed synchronously (forward pass, 1 row of logits read back,
//!   argmax on the host, GPU idle while the host works), and one more step is profiled per
//!   kernel.
//! - Dense: the same model and caches with attention over every cached position (no
//!   indexer, no top-k), the baseline DSA is compared with.

use crate::error::{Error, Result};
use crate::generate::{argmax, generate, Sampler, SamplingParams};
use crate::gpu::{kernel_params, Gpu, KernelStat, Recorder, Shader};
use crate::model::{Model, Session};
use serde::Serialize;
use std::time::Instant;

/// The adapter's measured limits.
#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    /// A compute-shader copy (vec4 loads and stores), bytes read + bytes written per
    /// second: the bandwidth kernels can reach; percentages of bandwidth use it.
    pub copy_bytes_per_s: f64,
    /// `copy_buffer_to_buffer` (may run on a copy engine), bytes read + written per second.
    pub transfer_copy_bytes_per_s: f64,
    /// f32 fused multiply-add rate, FLOP/s (an FMA is 2 FLOP).
    pub fma_flops_per_s: f64,
    /// Packed 8-bit integer dot products (`dot4I8Packed`, 4 multiply-adds each) per second:
    /// what bounds the integer-dot GEMVs at several rows of x. None in the browser, whose
    /// WGSL may lack them.
    pub int_dots_per_s: Option<f64>,
    /// Tensor-core rate, FLOP/s: 16×16×16 cooperative-matrix multiply-adds with f16 inputs
    /// and f32 accumulation (what the GEMM tile runs), on devices whose tile uses them; None
    /// elsewhere. Prefill kernels on tensor cores report their % of it.
    pub mma_flops_per_s: Option<f64>,
    /// Bytes of one copy and the number of copies timed.
    pub copy_bytes: u64,
    pub copies: u32,
}

impl Calibration {
    /// The compute rates in words: "f32 FMA 57.90 TFLOP/s, 8-bit dot4 13.35 T/s, f16 tensor
    /// cores 300.00 TFLOP/s" (the last two where measured).
    pub fn rates(&self) -> String {
        let mut s = format!("f32 FMA {:.2} TFLOP/s", self.fma_flops_per_s / 1e12);
        if let Some(d) = self.int_dots_per_s {
            s += &format!(", 8-bit dot4 {:.2} T/s", d / 1e12);
        }
        if let Some(m) = self.mma_flops_per_s {
            s += &format!(", f16 tensor cores {:.2} TFLOP/s", m / 1e12);
        }
        s
    }
}

/// The shortest wall time of three submissions of what `record` records, after one
/// untimed warm-up submission.
fn best_time(gpu: &Gpu, mut record: impl FnMut(&mut Recorder)) -> Result<f64> {
    let mut best = f64::MAX;
    for run in 0..4 {
        let mut rec = gpu.recorder();
        record(&mut rec);
        gpu.sync()?;
        let t = Instant::now();
        rec.finish()?;
        if run > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    Ok(best)
}

kernel_params! {
    struct CalibrateParams {
        a: f32,
        b: f32,
        iters: u32,
        pad: u32,
    }
}

const CALIBRATE: Shader<CalibrateParams> =
    Shader::new("calibrate", include_str!("../shaders/calibrate.wgsl"));

const CALIBRATE_DOT: Shader<CalibrateParams> = Shader::new(
    "calibrate_dot",
    include_str!("../shaders/calibrate_dot.wgsl"),
);

const CALIBRATE_COOP: Shader<CalibrateParams> = Shader::new(
    "calibrate_coop",
    include_str!("../shaders/calibrate_coop.wgsl"),
);

/// The calibration shaders (the backend test translates them with the kernels' shaders).
pub const SHADERS: &[crate::gpu::ShaderCode] = &[
    CALIBRATE.code(),
    CALIBRATE_DOT.code(),
    CALIBRATE_COOP.code(),
];

/// Copy bandwidth and the FMA, integer-dot and (on tensor cores) cooperative-matrix rates,
/// each the best of a few timed runs after a warm-up.
pub fn calibrate(gpu: &Gpu) -> Result<Calibration> {
    let size = gpu.max_binding().min(1 << 30) & !((1 << 20) - 1);
    let a = gpu.buffer(size, "calibrate src")?;
    let b = gpu.buffer(size, "calibrate dst")?;
    let copies = 8u32;
    let ping_pong = |i: u32| {
        if i.is_multiple_of(2) {
            (&a, &b)
        } else {
            (&b, &a)
        }
    };
    let best = best_time(gpu, |rec| {
        for i in 0..copies {
            let (s, d) = ping_pong(i);
            rec.copy(s, 0, d, 0, size);
        }
    })?;
    let transfer_copy_bytes_per_s = 2.0 * size as f64 * copies as f64 / best;
    // The same bytes copied by a kernel.
    let cp = gpu.pipeline(&CALIBRATE, "copy", &[]);
    let pc = CalibrateParams {
        a: 0.0,
        b: 0.0,
        iters: (size / 16) as u32,
        pad: 0,
    };
    let groups = ((size / 16 / 256) as u32).min(65535);
    let best = best_time(gpu, |rec| {
        for i in 0..copies {
            let (s, d) = ping_pong(i);
            rec.dispatch(&cp, &pc, &[d, s], [groups, 1, 1]);
        }
    })?;
    let copy_bytes_per_s = 2.0 * size as f64 * copies as f64 / best;
    drop((a, b));

    let out = gpu.buffer(16, "calibrate out")?;
    let fma_flops_per_s = 64.0 * rate_probe(gpu, &CALIBRATE, "fma_rate", &out)?;
    let int_dots_per_s = if cfg!(target_arch = "wasm32") {
        None
    } else {
        Some(32.0 * rate_probe(gpu, &CALIBRATE_DOT, "dot_rate", &out)?)
    };
    // A round is 8 multiply-adds of 16 × 16 × 16 (8,192 FLOP each) per subgroup of 32
    // invocations (the only subgroup size the tile runs on).
    let mma_flops_per_s = match gpu.tensor_cores() {
        true => Some(2048.0 * rate_probe(gpu, &CALIBRATE_COOP, "mma_rate", &out)?),
        false => None,
    };
    Ok(Calibration {
        copy_bytes_per_s,
        transfer_copy_bytes_per_s,
        fma_flops_per_s,
        int_dots_per_s,
        mma_flops_per_s,
        copy_bytes: size,
        copies,
    })
}

/// Rounds per second of a peak-rate probe `entry` (each invocation runs `iters` rounds):
/// the grid grows until one dispatch takes ≥ 100 ms (GPUs raise their clocks under
/// sustained load), then the best of three at that size.
fn rate_probe(
    gpu: &Gpu,
    shader: &'static Shader<CalibrateParams>,
    entry: &'static str,
    out: &wgpu::Buffer,
) -> Result<f64> {
    let pipe = gpu.pipeline(shader, entry, &[]);
    let iters = 512u32;
    let p = CalibrateParams {
        a: 0.999,
        b: 1e-4,
        iters,
        pad: 0,
    };
    let mut groups = 64u32;
    loop {
        let best = best_time(gpu, |rec| rec.dispatch(&pipe, &p, &[out], gpu.grid(groups)))?;
        if best >= 0.1 || groups >= 1 << 20 {
            return Ok(iters as f64 * 256.0 * groups as f64 / best);
        }
        groups *= 2;
    }
}

/// How the caches reach the context of a decode measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fill {
    /// Seeded random cache entries (no prefill).
    Synthetic,
    /// A real prefill of random tokens.
    Prefill,
}

#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub prompt_lens: Vec<usize>,
    pub contexts: Vec<usize>,
    pub decode: usize,
    /// Draft lengths k whose verification (a forward of k + 1 positions) is timed at each
    /// context.
    pub verify: Vec<usize>,
    pub dense: bool,
    pub fill: Fill,
    pub profile: bool,
    pub seed: u64,
    /// Cache formats (`None`: the model's default).
    pub cache: Option<crate::cache::CacheFormat>,
    /// Batch widths to time batched decode steps at (several sequences, one step; what
    /// `sparsa serve` runs), each against one sequence's step in the same run.
    pub batch: Vec<usize>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Kernel {
    pub name: String,
    pub ms: f64,
    pub count: u64,
    pub bytes: u64,
    pub flops: u64,
}

impl From<KernelStat> for Kernel {
    fn from(k: KernelStat) -> Kernel {
        Kernel {
            name: k.name,
            ms: k.seconds * 1e3,
            count: k.count,
            bytes: k.bytes,
            flops: k.flops,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PrefillResult {
    pub tokens: usize,
    /// Rows per chunk the prompt ran in (the last chunk may have fewer).
    pub chunk_rows: usize,
    pub seconds: f64,
    pub tok_per_s: f64,
    /// Per-kernel times of the same prefill, run again with profiling on.
    pub kernels: Vec<Kernel>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DecodeResult {
    pub context: usize,
    /// "dsa" or "dense".
    pub attention: &'static str,
    /// The cache formats, `latent/keys` (e.g. `fp8/bf16`), and their bytes per token.
    pub cache: String,
    pub cache_bytes_per_token: u64,
    pub fill: Fill,
    pub steps: usize,
    /// Time between generated tokens (greedy, pipelined as in `run` and `chat`).
    pub ms_median: f64,
    pub ms_min: f64,
    pub ms_max: f64,
    pub tok_per_s: f64,
    /// Median of single synchronous steps (logits read back and argmax on the host, the GPU
    /// idle meanwhile): what the host adds when it does not run ahead.
    pub ms_sync_median: f64,
    /// Median host time of a greedy step: recording it and submitting it, without waiting
    /// for the GPU (which runs behind). Where it reaches `ms_median`, the host bounds the
    /// step, not the GPU.
    pub ms_host_median: f64,
    /// Compute dispatches a greedy step records (the embedding, every layer, the head and
    /// the pick), and that divided by the layers.
    pub dispatches_per_token: u64,
    pub dispatches_per_layer: f64,
    /// Time between tokens sampled with `chat`'s defaults (temperature 0.8, top-p 0.95,
    /// top-k 40, repetition penalty 1.1 over 64 tokens; picked on the GPU as well).
    pub ms_sampled_median: f64,
    /// Per-kernel times of one more step, profiled.
    pub kernels: Vec<Kernel>,
    /// Speculative verification at this context, one entry per `--verify` draft length.
    pub verify: Vec<VerifyResult>,
    /// With `--verify` on a model with an MTP layer: the median of one draft step (the MTP
    /// layer on one row and its token read back), synchronous like `ms_sync_median`.
    pub ms_draft_step: Option<f64>,
    /// Expert offloading during the greedy generation (None when every expert is resident).
    pub experts: Option<ExpertReport>,
}

/// The cost of verifying `positions - 1` draft tokens: one synchronous forward of
/// `positions` rows at the context with every row's logits read back, as a speculative
/// step does, against a single synchronous decode step measured the same way.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyResult {
    pub positions: usize,
    pub ms_median: f64,
    /// `ms_median` over the single synchronous step's median.
    pub vs_step: f64,
    /// Per-kernel times of one more verification, profiled.
    pub kernels: Vec<Kernel>,
}

/// What the routed-expert cache did during a decode measurement.
#[derive(Clone, Debug, Serialize)]
pub struct ExpertReport {
    pub policy: String,
    /// Exponent of the synthetic Zipf routing replayed instead of the routers' choices.
    pub replay_zipf: Option<f64>,
    pub stats: crate::experts::ExpertStats,
    /// Host→GPU bandwidth measured in the same process: bytes from (pre-faulted) host
    /// memory through the path uploads take, submitted and waited for; bytes per second.
    pub h2d_bytes_per_s: f64,
    /// `copy_buffer_to_buffer` from a mappable (MAP_WRITE) buffer into a GPU buffer, bytes
    /// per second: above the PCIe link's rate where the driver puts mappable buffers in GPU
    /// memory behind a resizable BAR (the H200 does), so the host's writes into the mapping
    /// are the transfer.
    pub mappable_copy_bytes_per_s: f64,
    /// `copy_buffer_to_buffer` from a buffer in host memory (MAP_READ | COPY_SRC, natively
    /// mappable primary buffers) into a GPU buffer, bytes per second: the GPU's own DMA read
    /// of host memory, with no host copy in its path; 0 where the adapter cannot.
    pub host_copy_bytes_per_s: f64,
    /// The same copies while the CPU executor's threads read RAM ([`host_copy_contention`]):
    /// (copy rate, RAM read rate), bytes per second; whether the two add up.
    pub host_copy_with_ram: Option<(f64, f64)>,
    /// Time per token the uploads alone need at `h2d_bytes_per_s`: a lower bound on the
    /// step.
    pub ms_upload_bound: f64,
    /// Hybrid runs (`--cpu-experts`): the RAM read rate on the CPU executor's threads,
    /// bytes per second, and the time per token the CPU's expert reads need at it.
    pub ram_bytes_per_s: Option<f64>,
    pub ms_cpu_bound: Option<f64>,
    /// The host's round trip through the GPU with no work in it, ms (median; see
    /// [`round_trip_ms`]): the least an offloaded layer's routing wait can cost.
    pub ms_empty_round_trip: f64,
    /// Hit rates other policies (and Belady's optimum) reach on the same routing, replayed
    /// with the same slots: (policy, hit rate).
    pub policies: Vec<(String, f64)>,
}

/// Host→GPU upload bandwidth: 256 MiB from host memory in 16 MiB pieces through the path
/// expert uploads take ([`Gpu::write_batch`]), submitted and waited for; best of three
/// after a warm-up.
pub fn h2d_bandwidth(gpu: &Gpu) -> Result<f64> {
    let piece = 16usize << 20;
    let total = (gpu.max_binding() as usize).min(256 << 20) / piece * piece;
    let host: Vec<u8> = (0..piece).map(|i| (i * 31 % 251) as u8).collect();
    let dst = gpu.buffer(total as u64, "h2d bandwidth")?;
    let mut best = f64::MAX;
    for run in 0..4 {
        gpu.sync()?;
        let t = Instant::now();
        let writes: Vec<crate::gpu::Write> = (0..total)
            .step_by(piece)
            .map(|off| crate::gpu::Write {
                buf: dst.clone(),
                offset: off as u64,
                bytes: std::borrow::Cow::Borrowed(&host),
            })
            .collect();
        gpu.write_batch(&writes);
        gpu.submit([]);
        gpu.sync()?;
        if run > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    Ok(total as f64 / best)
}

/// The host's round trip through the GPU with nothing to run, ms: a 4-byte copy staged in a
/// submission of its own and read back as an offloaded layer's routing is
/// ([`Gpu::read_staged`], polling on a GPU); the median of 64 after a warm-up. An offloaded
/// layer's routing wait is this plus the GPU's work on the layer's attention and router.
#[cfg(not(target_arch = "wasm32"))]
pub fn round_trip_ms(gpu: &Gpu) -> Result<f64> {
    let buf = gpu.buffer(4, "round trip")?;
    let mut t = Vec::with_capacity(64);
    for i in 0..65 {
        let t0 = Instant::now();
        let mut rec = gpu.recorder();
        let read = rec.stage_read(&[(&buf, 0, 4)]);
        rec.flush();
        gpu.read_staged(read)?;
        rec.finish()?;
        if i > 0 {
            t.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// `copy_buffer_to_buffer` of 256 MiB from a mappable (MAP_WRITE, filled) buffer into a
/// GPU buffer, best of three after a warm-up (see [`ExpertReport::mappable_copy_bytes_per_s`]).
pub fn mappable_copy_bandwidth(gpu: &Gpu) -> Result<f64> {
    let size = gpu.max_binding().min(256 << 20) & !((1 << 20) - 1);
    let src = gpu.create_buffer(&wgpu::BufferDescriptor {
        label: Some("dma src"),
        size,
        usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: true,
    });
    match src.slice(..).get_mapped_range_mut() {
        Ok(mut v) => v.slice(..).fill(7),
        Err(e) => return Err(Error::msg(format!("DMA bandwidth: mapping failed: {e:?}"))),
    }
    src.unmap();
    let dst = gpu.buffer(size, "dma dst")?;
    let t = best_time(gpu, |rec| rec.copy(&src, 0, &dst, 0, size))?;
    Ok(size as f64 / t)
}

/// A 256 MiB buffer in host memory (MAP_READ | COPY_SRC | COPY_DST: with natively mappable
/// primary buffers such a buffer lives in system RAM) filled through the queue, and a GPU
/// buffer of the same size to copy it into; None where the adapter lacks the feature.
fn host_copy_buffers(gpu: &Gpu) -> Result<Option<(wgpu::Buffer, wgpu::Buffer, u64)>> {
    if !gpu.host_buffers() {
        return Ok(None);
    }
    let size = gpu.max_binding().min(256 << 20) & !((1 << 20) - 1);
    let src = gpu.host_buffer(size, "host copy src")?;
    let fill: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 29 % 253) as u8).collect();
    for off in (0..size).step_by(1 << 20) {
        gpu.write(&src, off, &fill);
    }
    let dst = gpu.buffer(size, "host copy dst")?;
    gpu.sync()?;
    Ok(Some((src, dst, size)))
}

/// `copy_buffer_to_buffer` from host memory into GPU memory ([`host_copy_buffers`]), bytes
/// per second, best of three after a warm-up; 0 where the adapter cannot.
pub fn host_copy_bandwidth(gpu: &Gpu) -> Result<f64> {
    let Some((src, dst, size)) = host_copy_buffers(gpu)? else {
        return Ok(0.0);
    };
    let t = best_time(gpu, |rec| rec.copy(&src, 0, &dst, 0, size))?;
    Ok(size as f64 / t)
}

/// Host-memory copies ([`host_copy_buffers`]) submitted back to back while the CPU
/// executor's threads measure their RAM read ([`crate::experts::cpu::ram_read_bandwidth`]):
/// (copy rate over that time, the RAM read rate), bytes per second. Whether the GPU's DMA
/// reads of RAM and the CPU's add up says whether uploading some misses from a host copy
/// while the CPU computes the others can beat the CPU alone.
#[cfg(not(target_arch = "wasm32"))]
pub fn host_copy_contention(
    gpu: &Gpu,
    off: &crate::experts::Offload,
) -> Result<Option<(f64, f64)>> {
    let Some((src, dst, size)) = host_copy_buffers(gpu)? else {
        return Ok(None);
    };
    let done = std::sync::atomic::AtomicBool::new(false);
    let (copied, secs, ram) = std::thread::scope(|sc| -> Result<(u64, f64, Option<f64>)> {
        let ram = sc.spawn(|| {
            // The copies start first: the read is measured while they run.
            std::thread::sleep(std::time::Duration::from_millis(5));
            let r = off.ram_bandwidth();
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            r
        });
        let t = Instant::now();
        let mut copied = 0u64;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            let mut rec = gpu.recorder();
            rec.copy(&src, 0, &dst, 0, size);
            rec.finish()?;
            copied += size;
        }
        let secs = t.elapsed().as_secs_f64();
        let ram = ram
            .join()
            .map_err(|_| Error::msg("RAM read thread panicked"))?;
        Ok((copied, secs, ram))
    })?;
    Ok(ram.map(|r| (copied as f64 / secs, r)))
}

/// Hit rates of LRU, LFU (a few decays) and Belady on the routing `trace` (per layer, the
/// decode steps' choices) with each layer's slots.
fn compare_policies(off: &crate::experts::Offload, trace: &[Vec<Vec<u32>>]) -> Vec<(String, f64)> {
    use crate::experts::policy::{belady, simulate, Policy};
    let e = off.slots.n_experts;
    let mut out = Vec::new();
    let policies = [
        Policy::Lru,
        Policy::Lfu { decay: 0.8 },
        Policy::Lfu { decay: 0.95 },
        Policy::Lfu { decay: 0.99 },
        Policy::Lfu { decay: 1.0 },
    ];
    let per_layer = |f: &dyn Fn(&[Vec<u32>], usize) -> f64| -> f64 {
        let (mut sum, mut n) = (0.0, 0);
        for (i, t) in trace.iter().enumerate() {
            if off.offloaded(i) && !t.is_empty() {
                sum += f(t, off.slots.per_layer[i]);
                n += 1;
            }
        }
        sum / n.max(1) as f64
    };
    for p in policies {
        out.push((p.to_string(), per_layer(&|t, s| simulate(t, e, s, p))));
    }
    out.push(("belady".into(), per_layer(&|t, s| belady(t, s))));
    out
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub model: String,
    pub adapter: String,
    pub date: String,
    /// The `SPARSA_*` environment variables set (`NAME=value`): the knobs the figures ran
    /// under.
    pub environment: Vec<String>,
    pub profile_clock: String,
    pub calibration: Option<Calibration>,
    pub prefill: Vec<PrefillResult>,
    pub decode: Vec<DecodeResult>,
    pub batch: Vec<BatchResult>,
}

/// Batched decode steps: `width` sequences at `context` positions each, one token each per
/// step (pooled caches, [`Session::step_batch`]), queued a step ahead as `sparsa serve` runs
/// them.
#[derive(Clone, Debug, Serialize)]
pub struct BatchResult {
    pub context: usize,
    pub width: usize,
    pub ms_step_median: f64,
    /// Tokens per second, all sequences together.
    pub tok_per_s: f64,
    /// `tok_per_s` over one sequence's (a batch of one, same run).
    pub vs_one: f64,
    /// One batched step, synchronous, profiled.
    pub kernels: Vec<Kernel>,
}

/// Times batched decode steps of each width in `widths` (and of one sequence, the base) at
/// each context of `opts`: `width` pooled sessions, caches filled synthetically.
fn batched(
    model: &Model,
    opts: &BenchOptions,
    log: &mut dyn FnMut(&str),
) -> Result<Vec<BatchResult>> {
    use crate::model::{BatchRow, Pick};
    let gpu = &*model.gpu;
    let widest = opts.batch.iter().copied().max().unwrap_or(1);
    let mut out = Vec::new();
    for &ctx in &opts.contexts {
        let need = ctx + opts.decode + 8;
        let cache = opts.cache.unwrap_or_else(|| model.default_cache(need));
        let mut ss = model.pooled_sessions(need, cache, widest)?.ok_or_else(|| {
            Error::msg(format!(
                "--batch {widest} at {ctx}: the pooled caches exceed one storage binding"
            ))
        })?;
        let toks = random_tokens(widest, model.config.vocab_size, opts.seed ^ 0xba7c);
        let mut base = None;
        let mut widths: Vec<usize> = std::iter::once(1).chain(opts.batch.clone()).collect();
        widths.sort_unstable();
        widths.dedup();
        // One batched step of the sessions `ss`, their picks into `slot`.
        let step = |ss: &mut [Session], slot: usize| {
            let mut rows: Vec<BatchRow> = ss
                .iter_mut()
                .map(|session| BatchRow {
                    session,
                    slot,
                    pick: Pick::Argmax,
                })
                .collect();
            Session::step_batch(&mut rows)
        };
        // Waits for the picks of the sessions `ss` in `slot`.
        let read = |ss: &mut [Session], slot: usize| -> Result<()> {
            for s in ss {
                pollster::block_on(s.picked_token(slot))?;
            }
            Ok(())
        };
        for width in widths {
            for (i, s) in ss.iter_mut().enumerate().take(width) {
                s.fill_synthetic(ctx, opts.seed as u32 ^ i as u32)?;
                s.forward_pick(&toks[i..=i], Some((0, &Pick::Argmax)))?;
            }
            // Pipelined: each step queued (pick slots alternating) before the tokens of the
            // one before it are read.
            let mut slot = 1;
            let mut times = Vec::with_capacity(opts.decode);
            for i in 0..opts.decode + 2 {
                let t = Instant::now();
                step(&mut ss[..width], slot)?;
                read(&mut ss[..width], 1 - slot)?;
                slot = 1 - slot;
                if i >= 2 {
                    times.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            read(&mut ss[..width], 1 - slot)?;
            times.sort_by(f64::total_cmp);
            let ms = median(&times);
            let (_, kernels) = profiled(gpu, opts.profile, || {
                step(&mut ss[..width], 0)?;
                read(&mut ss[..width], 0)
            })?;
            let tok_per_s = width as f64 * 1e3 / ms;
            let one = *base.get_or_insert(tok_per_s);
            log(&format!(
                "batched decode at {ctx}, {width} sequences: {ms:.3} ms a step, {tok_per_s:.1} tok/s together, {:.2}x one sequence's",
                tok_per_s / one
            ));
            out.push(BatchResult {
                context: ctx,
                width,
                ms_step_median: ms,
                tok_per_s,
                vs_one: tok_per_s / one,
                kernels,
            });
        }
    }
    Ok(out)
}

/// The middle of sorted times (NaN when empty).
fn median(v: &[f64]) -> f64 {
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The median of `steps` timed runs of `f` in milliseconds, after two untimed warm-up runs.
fn median_ms(steps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut v = Vec::with_capacity(steps);
    for i in 0..steps + 2 {
        let t = Instant::now();
        f()?;
        if i >= 2 {
            v.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    v.sort_by(f64::total_cmp);
    Ok(median(&v))
}

/// Deterministic token ids below `vocab` (splitmix64).
fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_add(0x9e3779b97f4a7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
            ((z ^ (z >> 31)) % vocab as u64) as u32
        })
        .collect()
}

fn profiled<T>(gpu: &Gpu, on: bool, f: impl FnOnce() -> Result<T>) -> Result<(T, Vec<Kernel>)> {
    if !on {
        return Ok((f()?, Vec::new()));
    }
    gpu.set_profiling(true);
    let r = f();
    let k = gpu.take_profile();
    gpu.set_profiling(false);
    Ok((r?, k.into_iter().map(Kernel::from).collect()))
}

/// Today's date (UTC) as YYYY-MM-DD.
pub fn today() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86400)
        .unwrap_or(0) as i64;
    // Civil-from-days (proleptic Gregorian).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Run the benchmark; `log` receives progress lines.
pub fn run(
    model: &Model,
    opts: &BenchOptions,
    calibration: Option<Calibration>,
    log: &mut dyn FnMut(&str),
) -> Result<BenchReport> {
    let gpu = &*model.gpu;
    let cfg = &model.config;
    let vocab = cfg.vocab_size;
    let need = opts
        .contexts
        .iter()
        .map(|c| c + opts.decode + 4 + opts.verify.iter().max().map_or(0, |k| k + 1))
        .chain(opts.prompt_lens.iter().copied())
        .max()
        .unwrap_or(1);
    let mut report = BenchReport {
        model: model.label.clone(),
        adapter: gpu.adapter.line(),
        date: today(),
        environment: crate::knobs::environment(),
        profile_clock: gpu.profile_clock().describe().to_string(),
        calibration,
        prefill: Vec::new(),
        decode: Vec::new(),
        batch: Vec::new(),
    };
    if !opts.batch.is_empty() {
        report.batch = batched(model, opts, log)?;
        return Ok(report);
    }
    let mut modes = vec![false];
    if opts.dense {
        modes.push(true);
    }
    for dense in modes {
        let attention = if dense { "dense" } else { "dsa" };
        let cache = opts.cache.unwrap_or_else(|| model.default_cache(need));
        let mut s = Session::open(model, need, dense, cache)?;
        // Warm-up: compile the pipelines of prefill and decode.
        s.forward(
            &random_tokens(s.chunk.min(need - 1).max(1), vocab, opts.seed),
            false,
        )?;
        s.forward(&random_tokens(1, vocab, opts.seed + 1), false)?;
        if !dense {
            for &n in &opts.prompt_lens {
                let toks = random_tokens(n, vocab, opts.seed ^ n as u64);
                s.reset();
                let t = Instant::now();
                s.forward(&toks, false)?;
                let seconds = t.elapsed().as_secs_f64();
                log(&format!(
                    "prefill {n} tokens: {seconds:.3} s, {:.1} tok/s (chunks of {} rows)",
                    n as f64 / seconds,
                    s.chunk
                ));
                let kernels = if opts.profile {
                    s.reset();
                    profiled(gpu, true, || s.forward(&toks, false))?.1
                } else {
                    Vec::new()
                };
                report.prefill.push(PrefillResult {
                    tokens: n,
                    chunk_rows: s.chunk,
                    seconds,
                    tok_per_s: n as f64 / seconds,
                    kernels,
                });
            }
        }
        for &ctx in &opts.contexts {
            s.reset();
            match opts.fill {
                Fill::Synthetic => s.fill_synthetic(ctx, opts.seed as u32)?,
                Fill::Prefill => {
                    if ctx > 0 {
                        s.forward(&random_tokens(ctx, vocab, opts.seed ^ 0x5eed), false)?;
                    }
                }
            }
            let mut tok = random_tokens(1, vocab, opts.seed)[0];
            // Synchronous single steps: two warm-up steps, then the timed ones; each starts
            // at the same context.
            let sync_med = median_ms(opts.decode, || {
                s.truncate(ctx);
                tok = argmax(s.forward(&[tok], false)?.last());
                Ok(())
            })?;
            let mut verify = Vec::with_capacity(opts.verify.len());
            for &k in &opts.verify {
                let toks = random_tokens(k + 1, vocab, opts.seed ^ 0xd4af7);
                let host0 = gpu.host_times();
                let ms = median_ms(opts.decode, || {
                    s.truncate(ctx);
                    s.forward(&toks, true).map(drop)
                })?;
                // median_ms runs two warm-up calls first.
                let host = gpu.host_times().since(&host0, opts.decode as u64 + 2);
                s.truncate(ctx);
                let (_, kernels) = profiled(gpu, opts.profile, || s.forward(&toks, true))?;
                log(&format!(
                    "verify {} positions at {ctx}: {ms:.3} ms, {:.2}x a single synchronous step ({sync_med:.3} ms); {}",
                    k + 1,
                    ms / sync_med,
                    host.line()
                ));
                verify.push(VerifyResult {
                    positions: k + 1,
                    ms_median: ms,
                    vs_step: ms / sync_med,
                    kernels,
                });
            }
            let mut ms_draft_step = None;
            if !opts.verify.is_empty() && model.weights.mtp.is_some() {
                let ms = median_ms(opts.decode, || {
                    s.truncate(ctx);
                    pollster::block_on(s.mtp_step(tok, ctx)).map(drop)
                })?;
                log(&format!(
                    "draft step at {ctx} (the MTP layer on one row): {ms:.3} ms, {:.2}x a single synchronous step",
                    ms / sync_med
                ));
                ms_draft_step = Some(ms);
            }
            // The host's share: steps recorded and submitted back to back without waiting
            // (each picks its token on the GPU for the next), then one wait for all.
            s.truncate(ctx);
            s.forward_pick(&[tok], Some((0, &crate::model::Pick::Argmax)))?;
            let mut host = Vec::with_capacity(opts.decode);
            let d0 = gpu.dispatches_recorded();
            let host0 = gpu.host_times();
            for i in 0..opts.decode {
                let t = Instant::now();
                s.step_pick(i % 2, &crate::model::Pick::Argmax)?;
                host.push(t.elapsed().as_secs_f64() * 1e3);
            }
            let dispatches = (gpu.dispatches_recorded() - d0) / opts.decode.max(1) as u64;
            log(&format!(
                "decode step at {ctx}, {}",
                gpu.host_times().since(&host0, opts.decode as u64).line()
            ));
            gpu.sync()?;
            host.sort_by(f64::total_cmp);
            // Generation: one token of prompt at the context, then decode + 2 tokens; the
            // first two intervals are warm-up.
            s.truncate(ctx);
            let mut gen = |params: SamplingParams| -> Result<Vec<f64>> {
                s.truncate(ctx);
                let mut sampler = Sampler::new(params);
                let mut stamps = Vec::with_capacity(opts.decode + 2);
                generate(&mut s, &[tok], opts.decode + 2, &mut sampler, &[], |_| {
                    stamps.push(Instant::now());
                    true
                })?;
                let mut t: Vec<f64> = stamps
                    .windows(2)
                    .skip(1)
                    .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
                    .collect();
                t.sort_by(f64::total_cmp);
                Ok(t)
            };
            let off = model.offload.as_ref();
            let before = off.map(|o| {
                o.record_trace(true);
                o.stats()
            });
            let times = gen(SamplingParams::default())?;
            let experts = match (off, before) {
                (Some(o), Some(b)) => {
                    let trace = o.record_trace(false).unwrap_or_default();
                    let stats = o.stats().since(&b);
                    let h2d = h2d_bandwidth(gpu)?;
                    let mappable = mappable_copy_bandwidth(gpu)?;
                    let host_copy = host_copy_bandwidth(gpu)?;
                    #[cfg(not(target_arch = "wasm32"))]
                    let host_copy_with_ram = match stats.cpu_bytes > 0 {
                        true => host_copy_contention(gpu, o)?,
                        false => None,
                    };
                    #[cfg(target_arch = "wasm32")]
                    let host_copy_with_ram = None;
                    let ms_upload_bound = stats.bytes_per_token() / h2d * 1e3;
                    #[cfg(not(target_arch = "wasm32"))]
                    let ram = o.ram_bandwidth().filter(|_| stats.cpu_bytes > 0);
                    #[cfg(target_arch = "wasm32")]
                    let ram: Option<f64> = None;
                    let cpu_per_token = stats.cpu_bytes as f64 / stats.tokens.max(1) as f64;
                    Some(ExpertReport {
                        ram_bytes_per_s: ram,
                        ms_cpu_bound: ram.map(|r| cpu_per_token / r * 1e3),
                        #[cfg(not(target_arch = "wasm32"))]
                        ms_empty_round_trip: round_trip_ms(gpu)?,
                        #[cfg(target_arch = "wasm32")]
                        ms_empty_round_trip: 0.0,
                        policy: o.policy.to_string(),
                        replay_zipf: o.replay_exponent(),
                        stats,
                        h2d_bytes_per_s: h2d,
                        mappable_copy_bytes_per_s: mappable,
                        host_copy_bytes_per_s: host_copy,
                        host_copy_with_ram,
                        ms_upload_bound,
                        policies: compare_policies(o, &trace),
                    })
                }
                _ => None,
            };
            let sampled = gen(SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                top_k: 40,
                seed: opts.seed,
                repeat_penalty: 1.1,
                repeat_last_n: 64,
                ..Default::default()
            })?;
            s.truncate(ctx);
            let (_, kernels) = profiled(gpu, opts.profile, || {
                s.forward_pick(&[tok], Some((0, &crate::model::Pick::Argmax)))?;
                pollster::block_on(s.picked_token(0))
            })?;
            let (med, smp_med) = (median(&times), median(&sampled));
            let host_med = median(&host);
            let per_layer = dispatches as f64 / model.config.num_hidden_layers.max(1) as f64;
            log(&format!(
                "decode at {ctx} ({attention}): {med:.3} ms/token median of {} (sampled {smp_med:.3} ms; single synchronous steps {sync_med:.3} ms; host {host_med:.3} ms to record and submit a step; {dispatches} dispatches, {per_layer:.1} per layer)",
                times.len()
            ));
            report.decode.push(DecodeResult {
                context: ctx,
                attention,
                cache: s.caches.format.name(),
                cache_bytes_per_token: crate::cache::Caches::bytes_per_token(
                    &model.config,
                    s.caches.format,
                ),
                fill: opts.fill,
                steps: times.len(),
                ms_median: med,
                ms_min: times.first().copied().unwrap_or(f64::NAN),
                ms_max: times.last().copied().unwrap_or(f64::NAN),
                tok_per_s: 1e3 / med,
                ms_sync_median: sync_med,
                ms_host_median: host_med,
                dispatches_per_token: dispatches,
                dispatches_per_layer: per_layer,
                ms_sampled_median: smp_med,
                kernels,
                verify,
                ms_draft_step,
                experts,
            });
        }
    }
    Ok(report)
}

/// Kernels of the attention path of a decode step (indexer, top-k, attention).
pub fn is_attention_kernel(name: &str) -> bool {
    name.starts_with("indexer::") || name.starts_with("topk") || name.starts_with("mla::")
}

/// The report as text tables. Percentages are of the calibrated copy bandwidth (bytes)
/// and FMA rate (FLOPs) when a calibration is present.
pub fn format_report(r: &BenchReport) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "model:   {}\nadapter: {}\ndate:    {}\nknobs:   {}",
        r.model,
        r.adapter,
        r.date,
        if r.environment.is_empty() {
            "none set".to_string()
        } else {
            r.environment.join(" ")
        }
    );
    let _ = writeln!(o, "kernel times: {}", r.profile_clock);
    if let Some(c) = &r.calibration {
        let _ = writeln!(
            o,
            "calibration: kernel copy {:.1} GB/s (read+write, {} × {} MiB; copy_buffer_to_buffer {:.1} GB/s), {}",
            c.copy_bytes_per_s / 1e9,
            c.copies,
            c.copy_bytes >> 20,
            c.transfer_copy_bytes_per_s / 1e9,
            c.rates()
        );
    }
    for p in &r.prefill {
        let _ = writeln!(
            o,
            "\nprefill {} tokens: {:.3} s, {:.1} tok/s (chunks of {} rows)",
            p.tokens, p.seconds, p.tok_per_s, p.chunk_rows
        );
        kernel_table(&mut o, &p.kernels, r.calibration.as_ref());
    }
    for d in &r.decode {
        let _ = writeln!(
            o,
            "\ndecode at context {} ({}, caches {} at {} B/token, {:?} fill): {:.3} ms/token median ({:.3}–{:.3}, {} steps), {:.1} tok/s; sampled (chat defaults) {:.3} ms; single synchronous steps {:.3} ms; host {:.3} ms to record and submit a step; {} dispatches per token, {:.1} per layer",
            d.context, d.attention, d.cache, d.cache_bytes_per_token, d.fill, d.ms_median, d.ms_min, d.ms_max, d.steps, d.tok_per_s, d.ms_sampled_median, d.ms_sync_median, d.ms_host_median, d.dispatches_per_token, d.dispatches_per_layer
        );
        for v in &d.verify {
            let _ = writeln!(
                o,
                "  verify {} positions (k = {} drafts): {:.3} ms, {:.2}x a single synchronous step, {:.2}x the pipelined step (what a round of drafts replaces)",
                v.positions,
                v.positions - 1,
                v.ms_median,
                v.vs_step,
                v.ms_median / d.ms_median
            );
            kernel_table(&mut o, &v.kernels, r.calibration.as_ref());
        }
        if let Some(ms) = d.ms_draft_step {
            let _ = writeln!(
                o,
                "  draft step (MTP layer, one row): {ms:.3} ms, {:.2}x a single synchronous step",
                ms / d.ms_sync_median
            );
        }
        if let Some(x) = &d.experts {
            let st = &x.stats;
            let _ = writeln!(
                o,
                "  expert offloading ({}{}): {}\n  host→GPU {:.1} GB/s measured through the upload path (a mappable buffer copies at {:.1} GB/s, one in host memory at {:.1} GB/s): the uploads alone need {:.3} ms per token, so tok/s is {:.0} % of that bound",
                x.policy,
                x.replay_zipf
                    .map(|z| format!(", Zipf {z} routing replayed"))
                    .unwrap_or_default(),
                st.line(),
                x.h2d_bytes_per_s / 1e9,
                x.mappable_copy_bytes_per_s / 1e9,
                x.host_copy_bytes_per_s / 1e9,
                x.ms_upload_bound,
                100.0 * x.ms_upload_bound / d.ms_median,
            );
            if let (Some(ram), Some(ms)) = (x.ram_bytes_per_s, x.ms_cpu_bound) {
                let both = ms + x.ms_upload_bound;
                let _ = writeln!(
                    o,
                    "  CPU experts: RAM read {:.1} GB/s on the executor's threads: their reads alone need {ms:.3} ms per token; with the uploads {both:.3} ms, so tok/s is {:.0} % of that bound",
                    ram / 1e9,
                    100.0 * both / d.ms_median,
                );
            }
            if let Some((copy, ram)) = x.host_copy_with_ram {
                let _ = writeln!(
                    o,
                    "  together: host-memory copies {:.1} GB/s while the executor's threads read RAM at {:.1} GB/s ({:.1} GB/s in all)",
                    copy / 1e9,
                    ram / 1e9,
                    (copy + ram) / 1e9,
                );
            }
            // Where a token's host time went (totals over the measured tokens).
            let per = |secs: f64| 1e3 * secs / st.tokens.max(1) as f64;
            let readbacks = st.syncs as f64 / st.tokens.max(1) as f64;
            let _ = writeln!(
                o,
                "  routing waits: {:.3} ms each ({readbacks:.1} a token); a round trip through the GPU with no work in it takes {:.3} ms (median of 64)",
                per(st.wait_s) / readbacks.max(1.0),
                x.ms_empty_round_trip,
            );
            let (cpu, wait, up) = (per(st.cpu_s), per(st.wait_s), per(st.upload_s));
            let cpu_wait = per(st.cpu_wait_s);
            let _ = writeln!(
                o,
                "  a token's time, host clock ({:.3} ms median step): CPU experts {cpu:.3} ms (the host recording meanwhile, then waiting {cpu_wait:.3} ms for them), waiting for each offloaded layer's routing {wait:.3} ms, stalled on uploads {up:.3} ms; the rest {:.3} ms (GPU work no wait covered, recording, submitting)",
                d.ms_median,
                d.ms_median - cpu - wait - up
            );
            let cmp: Vec<String> = x
                .policies
                .iter()
                .map(|(p, h)| format!("{p} {:.1} %", 100.0 * h))
                .collect();
            let _ = writeln!(o, "  hit rates on the same routing: {}", cmp.join(", "));
        }
        if !d.kernels.is_empty() {
            let total: f64 = d.kernels.iter().map(|k| k.ms).sum();
            let attn: f64 = d
                .kernels
                .iter()
                .filter(|k| is_attention_kernel(&k.name))
                .map(|k| k.ms)
                .sum();
            let bytes: u64 = d.kernels.iter().map(|k| k.bytes).sum();
            let _ = write!(
                o,
                "  GPU time {total:.3} ms (indexer + top-k + attention {attn:.3} ms), {:.1} MB moved",
                bytes as f64 / 1e6
            );
            if let Some(c) = &r.calibration {
                let bound = bytes as f64 / c.copy_bytes_per_s * 1e3;
                let _ = write!(
                    o,
                    "; bandwidth bound {bound:.3} ms = {:.0} % of the measured step",
                    100.0 * bound / d.ms_median
                );
            }
            let _ = writeln!(o);
            kernel_table(&mut o, &d.kernels, r.calibration.as_ref());
        }
    }
    for b in &r.batch {
        let _ = writeln!(
            o,
            "\nbatched decode at {}, {} sequences: {:.3} ms a step, {:.1} tok/s together ({:.2}x one sequence's)",
            b.context, b.width, b.ms_step_median, b.tok_per_s, b.vs_one
        );
        if !b.kernels.is_empty() {
            kernel_table(&mut o, &b.kernels, r.calibration.as_ref());
        }
    }
    o
}

fn kernel_table(o: &mut String, ks: &[Kernel], cal: Option<&Calibration>) {
    use std::fmt::Write;
    if ks.is_empty() {
        return;
    }
    // % of the tensor-core rate, where the device has one (the GEMMs' tile runs there).
    let mma = cal.and_then(|c| c.mma_flops_per_s);
    let _ = writeln!(
        o,
        "  {:<34} {:>6} {:>10} {:>10} {:>10} {:>7} {:>7}{}",
        "kernel",
        "calls",
        "ms",
        "MB",
        "GFLOP",
        "%bw",
        "%fma",
        if mma.is_some() { "     %tc" } else { "" }
    );
    for k in ks {
        let s = k.ms * 1e-3;
        // `amount` per second of this kernel as % of `rate`.
        let pct = |amount: u64, rate: f64| match s > 0.0 {
            true => format!("{:.0}", 100.0 * amount as f64 / s / rate),
            false => "-".into(),
        };
        let (bw, fl) = match cal {
            Some(c) => (
                pct(k.bytes, c.copy_bytes_per_s),
                pct(k.flops, c.fma_flops_per_s),
            ),
            None => ("-".into(), "-".into()),
        };
        let tc = mma.map_or(String::new(), |m| format!(" {:>7}", pct(k.flops, m)));
        let _ = writeln!(
            o,
            "  {:<34} {:>6} {:>10.4} {:>10.2} {:>10.3} {:>7} {:>7}{tc}",
            k.name,
            k.count,
            k.ms,
            k.bytes as f64 / 1e6,
            k.flops as f64 / 1e9,
            bw,
            fl
        );
    }
}

/// Checks a list of context lengths against the model.
pub fn check_contexts(model: &Model, contexts: &[usize], decode: usize) -> Result<()> {
    // What a session of the longest could hold in the smallest caches, the scratch and the
    // memory the weights left counted (the same room chat and `sparsa info` size from).
    let need = contexts
        .iter()
        .max()
        .map_or(0, |c| c.saturating_add(decode + 4));
    let max = model.longest_ctx(crate::cache::CacheFormat::SMALLEST, need);
    for &c in contexts {
        if c + decode + 4 > max {
            return Err(Error::msg(format!(
                "--context {c}: this adapter holds at most {max} positions for this model"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tensor-core probe runs only on adapters with tensor cores (the H200 runs in
    /// BENCHMARKS.md); this keeps it compiling everywhere, through the path those devices
    /// use (naga, then the memory-model patch).
    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn tensor_core_probe_compiles() {
        let src = crate::gpu::shader_source(
            "",
            <CalibrateParams as crate::gpu::KernelParams>::WGSL,
            "",
            CALIBRATE_COOP.source,
        );
        let c = crate::gpu::spirv::compile(&src, "mma_rate").unwrap();
        assert!(c.words.len() > 100);
        let bindings: Vec<u32> = c.layout.iter().map(|e| e.binding).collect();
        assert_eq!(bindings, [0, 1]);
        assert!(c.workgroup_bytes <= crate::gpu::COOP_WORKGROUP_BYTES);
    }
}
