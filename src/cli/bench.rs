//! `sparsa bench`: speed of a model on this adapter, against its measured limits.

use clap::Args;
use sparsa::bench::{self, BenchOptions, Fill};
use sparsa::error::{Error, Result};

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub m: crate::ModelArgs,
    #[command(flatten)]
    pub x: crate::ExpertArgs,
    /// Prompt lengths to time prefill at (comma-separated; 0 or empty: no prefill run).
    #[arg(long, value_delimiter = ',', default_value = "512")]
    prompt_len: Vec<usize>,
    /// Context lengths to time a decode step at (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "4096,32768,131072")]
    context: Vec<usize>,
    /// Decode steps timed at each context (after two warm-up steps).
    #[arg(long, default_value_t = 16)]
    decode: usize,
    /// Draft lengths k to time speculative verification at (comma-separated): at each
    /// context, one forward of k + 1 positions with every row's logits read back (what
    /// verifying k draft tokens costs), against a single synchronous decode step.
    #[arg(long, value_delimiter = ',')]
    verify: Vec<usize>,
    /// Also run the dense baseline: the same model and caches with attention over every
    /// cached position (no indexer, no top-k).
    #[arg(long)]
    dense: bool,
    /// How the caches reach each context: `synthetic` (seeded random entries, no prefill)
    /// or `prefill` (a real prefill of random tokens).
    #[arg(long, default_value = "synthetic", value_parser = ["synthetic", "prefill"])]
    fill: String,
    /// Measure the adapter's copy bandwidth and FMA rate first (percentages need it).
    #[arg(long)]
    calibrate: bool,
    /// Skip the per-kernel breakdown.
    #[arg(long)]
    no_profile: bool,
    /// Afterwards, the driver's statistics of every kernel variant the run compiled
    /// (registers, spills, ...: what VK_KHR_pipeline_executable_properties reports; Vulkan
    /// adapters only), one line each.
    #[arg(long)]
    shader_stats: bool,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// With --gpu-memory: replace the routers' choices by a synthetic skewed routing, Zipf
    /// with this exponent over a fixed random order of each layer's experts (`zipf:1.0`).
    /// Random weights route near-uniformly; real models do not.
    #[arg(long, requires = "gpu_memory")]
    expert_routing: Option<String>,
    /// Batched decode instead of the other measurements: at each context, steps that run
    /// this many sequences at once (comma-separated widths, e.g. 2,4,8; pooled caches
    /// filled synthetically, as `sparsa serve` batches its slots), each against one
    /// sequence's step in the same run (--prompt-len does not apply; --dense and --verify
    /// are refused with it).
    #[arg(long, value_name = "WIDTHS", value_delimiter = ',', allow_hyphen_values = true, value_parser = parse_width, conflicts_with_all = ["dense", "verify"])]
    batch: Vec<usize>,
    /// Seed of the random tokens and synthetic caches.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(a: BenchArgs) -> Result<()> {
    let mut src = crate::open_source(&a.m)?;
    src.config.keep_mtp(!a.verify.is_empty());
    // Under --gpu-memory the caches are planned for the longest context measured.
    let longest = a.context.iter().max().copied().unwrap_or(0);
    let need = longest + a.decode.max(1) + 4;
    let ctx = a.m.ctx.unwrap_or(need);
    let model = crate::open_model(&a.m, &a.x, &src, ctx)?;
    if let Some(r) = &a.expert_routing {
        let z = r
            .strip_prefix("zipf:")
            .and_then(|z| z.parse::<f64>().ok())
            .filter(|z| z.is_finite() && *z >= 0.0)
            .ok_or_else(|| {
                Error::msg(format!(
                    "--expert-routing {r}: expected zipf:S with S ≥ 0 (e.g. zipf:1.0)"
                ))
            })?;
        let off = model.offload.as_ref().ok_or_else(|| {
            Error::msg("--expert-routing: --gpu-memory holds every expert, so nothing streams")
        })?;
        let cfg = &model.config;
        off.set_replay(Some(sparsa::experts::Replay::zipf(
            z,
            cfg.num_hidden_layers,
            cfg.n_routed_experts,
            a.seed,
        )));
    }
    let prompt_lens: Vec<usize> = a.prompt_len.iter().copied().filter(|n| *n > 0).collect();
    if a.context.is_empty() && prompt_lens.is_empty() {
        return Err(Error::msg(
            "--context and --prompt-len are both empty: nothing to measure",
        ));
    }
    if let Some(k) = a.verify.iter().find(|k| **k == 0 || **k > 64) {
        return Err(Error::msg(format!(
            "--verify {k}: draft lengths must be 1 to 64"
        )));
    }
    let extra = a.verify.iter().max().map_or(0, |k| k + 1);
    bench::check_contexts(&model, &a.context, a.decode + extra)?;
    let opts = BenchOptions {
        prompt_lens,
        contexts: a.context.clone(),
        decode: a.decode.max(1),
        verify: a.verify.clone(),
        dense: a.dense,
        fill: if a.fill == "prefill" {
            Fill::Prefill
        } else {
            Fill::Synthetic
        },
        profile: !a.no_profile,
        seed: a.seed,
        cache: a.m.cache_type.0,
        batch: a.batch.clone(),
    };
    let mut log = |s: &str| eprintln!("bench: {s}");
    let cal = if a.calibrate {
        let c = bench::calibrate(&model.gpu)?;
        log(&format!(
            "calibration: copy {:.1} GB/s, {}",
            c.copy_bytes_per_s / 1e9,
            c.rates()
        ));
        Some(c)
    } else {
        None
    };
    let report = bench::run(&model, &opts, cal, &mut log)?;
    print!("{}", bench::format_report(&report));
    if a.shader_stats {
        shader_stats(&model.gpu)?;
    }
    if let Some(path) = &a.json {
        let s = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::msg(format!("--json: {e}")))?;
        std::fs::write(path, s)
            .map_err(|e| Error::msg(format!("--json {}: {e}", path.display())))?;
    }
    Ok(())
}

/// Prints the driver's statistics of every compiled kernel variant (`--shader-stats`).
fn shader_stats(gpu: &sparsa::gpu::Gpu) -> Result<()> {
    println!("\nshader statistics (the driver's, per compiled variant):");
    for s in gpu.shader_stats()? {
        println!("  {}", s.line());
    }
    Ok(())
}

/// A `--batch` width (sequences per batched step, 1 to 64), checked as the flag is parsed:
/// a bad one is refused before the model loads, with what the flag takes.
fn parse_width(s: &str) -> std::result::Result<usize, String> {
    let allowed = "expected batch widths from 1 to 64, comma-separated (e.g. 2,4,8)";
    match s.trim().parse::<usize>() {
        Ok(w) if (1..=64).contains(&w) => Ok(w),
        _ => Err(allowed.into()),
    }
}
