//! The `sparsa` command-line tool.

mod bench;
mod chat;
mod generate;
mod info;
mod interrupt;
mod sampling;
mod serve;

use clap::{Args, Parser, Subcommand};
use sparsa::gpu::{list_adapters, Gpu};
use sparsa::model::{Model, ModelSource};
use sparsa::{Error, Result};
use std::path::{Path, PathBuf};

use std::sync::Arc;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "sparsa",
    version,
    about = "DeepSeek Sparse Attention models (GLM-5, DeepSeek-V3.2) on any GPU, via wgpu"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text (or token ids) from a prompt, streaming as it goes.
    Generate(generate::GenerateArgs),
    /// Chat with the model: an interactive session (one reply per line when stdin is piped).
    Chat(chat::ChatArgs),
    /// Write the logits of every prompt position (one prefill) to a safetensors file.
    Logits(LogitsArgs),
    /// List GPU adapters with their backend and limits.
    Devices,
    /// Convert a model directory (f32 / bf16 / f16 / FP8) to sparsa's q8 or q4 format.
    Quantize(QuantizeArgs),
    /// Architecture, parameters, bytes per tensor class, memory plan and adapter limits.
    Info(info::InfoArgs),
    /// Prefill / decode speed and per-kernel GPU time against the adapter's measured limits.
    Bench(bench::BenchArgs),
    /// Serve the model over HTTP with OpenAI's API (chat and text completions, streaming).
    Serve(serve::ServeArgs),
    /// Write a random-weight model with a release's real shapes, tensor names and config.
    #[command(long_about = SYNTH_ABOUT)]
    Synth(SynthArgs),
}

const SYNTH_ABOUT: &str = "Write a random-weight model directory with the real per-layer shapes, \
Hugging Face tensor names and config.json of a release (GLM-5, GLM-5.2, DeepSeek-V3.2), \
cut to --layers layers (the first one a dense MLP when there are several, the rest MoE; no MTP \
layer), for benchmarks at real sizes. It is an ordinary model directory for `sparsa info`, \
`generate`, `bench`, and (bf16) for transformers' from_pretrained.\n\n\
Weights are seeded random values (uniform, std 1/sqrt(fan_in); norms 1), streamed to disk by \
--threads workers with little host memory. The tokenizer is the built-in model's \
(sparsa-bard-12m, 6144 tokens; the releases' tokenizers are not included): ids below 6144 \
decode to its text, vocab_size stays the release's.";

#[derive(Args)]
struct SynthArgs {
    /// The release to copy: glm-5, glm-5.2 or deepseek-v3.2.
    #[arg(long)]
    like: String,
    /// Decoder layers (layer 0 dense when more than one, the rest MoE).
    #[arg(long)]
    layers: usize,
    /// Also write the release's multi-token-prediction layer (layer `--layers`: a full DSA
    /// MoE layer behind enorm / hnorm / eh_proj, `num_nextn_predict_layers` 1), the draft
    /// model of `--draft`.
    #[arg(long)]
    mtp: bool,
    /// Routed experts per MoE layer (default: the release's 256). Experts per token stay 8
    /// (fewer if E < 8); DeepSeek-V3.2's router groups are adjusted to stay valid.
    #[arg(long)]
    experts: Option<usize>,
    /// bf16, fp8 (the official FP8 release layout), q8 or q4 (sparsa's formats, as
    /// `sparsa quantize` writes them).
    #[arg(long, value_parser = ["bf16", "fp8", "q8", "q4"])]
    format: String,
    /// Columns per scale for q8 / q4: 32, 64, 128 or 256.
    #[arg(long, default_value_t = sparsa::weights::quant::DEFAULT_BLOCK)]
    block: usize,
    /// Output directory (created; must be empty if it exists).
    #[arg(long, required_unless_present = "dry_run")]
    out: Option<PathBuf>,
    /// Random seed (the same seed writes byte-identical files).
    #[arg(long, default_value_t = sparsa::synth::DEFAULT_SEED)]
    seed: u64,
    /// Target size of a shard, in GB.
    #[arg(long, default_value_t = 4.0)]
    shard_gb: f64,
    /// Generator threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print the size it would write, and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Write every tensor as zeros, as holes in the shards (File::set_len): the same headers
    /// and file sizes, no disk space, no time (in a quantized format the scales are zero
    /// too: every weight is zero). For benchmarks where only the shapes matter, e.g. a
    /// full-depth model on a small disk, or beside a peer's zero-weight model.
    #[arg(long)]
    zeros: bool,
}

#[derive(Args)]
struct QuantizeArgs {
    /// Source model directory.
    #[arg(long)]
    model: PathBuf,
    /// Output directory (created; must be empty if it exists). It is written as OUT.partial
    /// next to it and renamed to OUT when complete; an interrupted conversion (Ctrl-C, a full
    /// disk) keeps its finished shards there, and the same command resumes it.
    #[arg(long)]
    out: PathBuf,
    /// q8 (int8) or q4 (4-bit), block-scaled with bf16 scales.
    #[arg(long, value_parser = ["q8", "q4"])]
    format: String,
    /// Columns per scale: 32, 64, 128 or 256 (see docs/QUANTIZATION.md).
    #[arg(long, default_value_t = sparsa::weights::quant::DEFAULT_BLOCK)]
    block: usize,
    /// Also keep these tensors as stored (repeatable; `*` wildcards, else a substring).
    /// Always kept: embeddings, norms, the router and its bias, indexer.weights_proj.
    #[arg(long)]
    keep: Vec<String>,
    /// Target size of an output shard, in GB.
    #[arg(long, default_value_t = 4.0)]
    shard_gb: f64,
    /// Delete an unfinished earlier conversion (OUT.partial) and start over instead of
    /// resuming it (needed when the options or the source changed since).
    #[arg(long)]
    restart: bool,
}

#[derive(Args)]
pub(crate) struct ModelArgs {
    /// Model directory (Hugging Face layout: config.json + safetensors). Default: the
    /// built-in sparsa-bard-12m (a small Shakespeare model; see models/sparsa-bard-12m).
    #[arg(short, long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Use the first adapter whose name contains this text (see `sparsa devices`).
    #[arg(long)]
    adapter: Option<String>,
    /// Context length to allocate caches for (default: what the request needs; for chat, the
    /// model's max_position_embeddings (1024 for the built-in model), or the longest context
    /// whose caches fit the GPU memory left after the weights, if that is less). The caches
    /// grow as the context fills.
    #[arg(long)]
    ctx: Option<usize>,
    /// GPU memory the model may use: bytes, a size (24GiB, 1500MiB, 8e9) or a percentage
    /// of the adapter's memory (90%). Embeddings, attention, dense MLPs, shared experts,
    /// the caches for --ctx and scratch are placed first; the rest holds routed experts, and
    /// those that do not fit stream from the model files through a cache. Default: every
    /// weight on the GPU.
    #[arg(long)]
    gpu_memory: Option<sparsa::model::GpuMemory>,
    /// How the caches store each token: auto (f32 where the context's caches fit in the GPU's
    /// memory, else the most precise compact format that fits), f32, bf16, fp8 (FP8 latent
    /// rows + bf16 indexer keys), or LATENT/KEYS with LATENT f32|bf16|fp8 and KEYS
    /// f32|bf16|i8 (e.g. fp8/i8, the smallest). docs/CACHE.md has their sizes and quality.
    #[arg(long, default_value = "auto", value_parser = parse_cache_type, value_name = "TYPE")]
    cache_type: CacheType,
    /// Rows per prefill chunk (1 to 8192). Default for large models: 2048 where
    /// --gpu-memory streams routed experts and holds the larger scratch (a chunk uploads each
    /// missed expert once per layer), or without --gpu-memory where the memory left after
    /// loading holds it beside the context's caches (not for the server's slots), else 512;
    /// 128 for small models. Larger chunks prefill faster and take more GPU memory (about
    /// 1.2 MB a row for GLM-5), which --gpu-memory takes from the resident experts.
    #[arg(long, value_name = "ROWS", value_parser = clap::value_parser!(u32).range(1..=8192))]
    prefill_chunk: Option<u32>,
    /// Keep the prefill's tensor-core products as precise as f32: the GEMMs of q4 weights
    /// take x as hi and lo f16 halves (64-row tiles) instead of one f16 value (128-row
    /// tiles, about 1.5× the prefill on an H100), and the sparse attention its queries,
    /// cache rows and probabilities as hi and lo halves instead of one f16 value each
    /// (1.14–1.18× more). docs/QUANTIZATION.md has the quality of both. Adapters without
    /// tensor cores are exact either way.
    #[arg(long)]
    exact_gemms: bool,
}

/// `--cache-type`: `None` is auto.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CacheType(pub Option<sparsa::cache::CacheFormat>);

fn parse_cache_type(s: &str) -> std::result::Result<CacheType, String> {
    if s == "auto" {
        return Ok(CacheType(None));
    }
    sparsa::cache::CacheFormat::parse(s).map(|f| CacheType(Some(f))).ok_or_else(|| {
        format!("'{s}': expected auto, f32, bf16, fp8 or LATENT/KEYS (LATENT f32|bf16|fp8, KEYS f32|bf16|i8)")
    })
}

impl ModelArgs {
    /// --prefill-chunk for the sessions and plans that follow (the defaults without it).
    pub(crate) fn set_prefill_chunk(&self) {
        sparsa::model::set_prefill_chunk(self.prefill_chunk.map_or(0, |r| r as usize));
    }

    /// --cache-type, `None` for auto.
    pub(crate) fn cache_type(&self) -> Option<sparsa::cache::CacheFormat> {
        self.cache_type.0
    }
}

/// A session of `ctx` positions with the caches --cache-type asks for; auto: the formats
/// the --gpu-memory plan reserved room for, else the most precise that fits the adapter's
/// memory now ([`Model::default_cache`]).
pub(crate) fn open_session(
    m: &ModelArgs,
    model: &Model,
    ctx: usize,
) -> Result<sparsa::model::Session> {
    match m.cache_type.0 {
        Some(f) => model.session_in(ctx, f),
        None => model.session(ctx),
    }
}

/// How streamed experts are cached: for the commands that run a model (not `info`, which
/// only plans one).
#[derive(Args)]
pub(crate) struct ExpertArgs {
    /// Which routed expert leaves the GPU cache on a miss: lru, lfu (decayed use counts) or
    /// lfu:DECAY (the per-token decay, 0 < DECAY ≤ 1). Only with --gpu-memory.
    #[arg(long, default_value = "lfu", requires = "gpu_memory")]
    expert_policy: sparsa::experts::Policy,
    /// While a layer's experts run, upload the experts the next layer will probably choose
    /// (its router applied to this layer's input) into its cache. Decode steps only; with
    /// --gpu-memory.
    #[arg(long, requires = "gpu_memory")]
    expert_prefetch: bool,
    /// Where the experts a decode step needs but the GPU does not hold run: auto (on the
    /// CPU, from the mapped files, unless the measured rates say uploading them is faster),
    /// on (always the CPU) or off (always uploaded into the GPU cache). Chunks of more than
    /// 16 rows (prefill) upload. Only with --gpu-memory.
    #[arg(long, default_value = "auto", requires = "gpu_memory")]
    cpu_experts: sparsa::experts::CpuExperts,
    /// Threads of the CPU expert executor, 1 to 1024 (default: one per logical CPU but
    /// one, which the host's thread keeps busy; all of them on machines of fewer than 4).
    /// Idle, they poll for the next offloaded layer's work for 5 ms before they sleep (not
    /// where the GPU is a CPU adapter).
    #[arg(long, requires = "gpu_memory", value_parser = clap::value_parser!(u16).range(1..=1024))]
    cpu_threads: Option<u16>,
    /// How the expert slots --gpu-memory leaves are laid over the MoE layers: spread (each
    /// layer the same number, its hottest experts resident) or layers (as many layers as
    /// fit keep all their experts, the others one slot each: fewer offloaded layers, so
    /// fewer waits for routing a token, the same misses under uniform routing; more misses
    /// where routing is skewed, slower prefill). Only with --gpu-memory.
    #[arg(long, default_value = "spread", requires = "gpu_memory")]
    expert_placement: sparsa::model::Placement,
    /// A copy of the offloaded experts in host memory that the GPU copies from (auto, on,
    /// off): an upload is then the GPU's own read over the bus with no host thread copying,
    /// so uploads run at the link's rate and beside the CPU's experts, which leave it a
    /// share of each decode step's misses. It takes host memory of the size of the
    /// offloaded layers' experts (made at load, a layer at a time); auto makes it on a
    /// discrete GPU that keeps buffers in host memory where it takes at most half the memory
    /// available.
    /// Only with --gpu-memory.
    #[arg(long, default_value = "auto", requires = "gpu_memory")]
    expert_host_copy: sparsa::experts::HostCopy,
    /// Keep the embedding table in host memory (auto, on, off), where the GPU reads the one
    /// row a token needs over the bus: its GPU memory (1.8 GiB in GLM-5's bf16) holds expert
    /// slots instead. auto does it where the plan offloads experts, on a discrete GPU that
    /// keeps buffers in host memory; never where the LM head is the embedding table. Only
    /// with --gpu-memory.
    #[arg(long, default_value = "auto", requires = "gpu_memory")]
    host_embeddings: sparsa::experts::HostCopy,
}

#[derive(Args)]
struct LogitsArgs {
    #[command(flatten)]
    m: ModelArgs,
    #[command(flatten)]
    x: ExpertArgs,
    /// Comma-separated token ids.
    #[arg(long, value_parser = parse_ids)]
    tokens: Ids,
    /// Output file (safetensors with one f32 tensor `logits` of shape [T, vocab]).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Clone)]
pub(crate) struct Ids(Vec<u32>);

pub(crate) fn parse_ids(s: &str) -> std::result::Result<Ids, String> {
    let v: std::result::Result<Vec<u32>, _> = s
        .split(',')
        .map(|x| x.trim())
        .filter(|x| !x.is_empty())
        .map(|x| x.parse::<u32>())
        .collect();
    match v {
        Ok(v) if !v.is_empty() => Ok(Ids(v)),
        Ok(_) => Err("expected at least one token id".into()),
        Err(e) => Err(format!(
            "expected comma-separated token ids like 1,2,3 ({e})"
        )),
    }
}

/// Mesa's Vulkan drivers complain on stderr when XDG_RUNTIME_DIR is unset (as in CI and
/// containers); give them a private directory so errors from sparsa stand alone.
fn quiet_mesa() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        return;
    }
    let dir = std::env::temp_dir().join("sparsa-xdg-runtime");
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        if std::fs::DirBuilder::new().mode(0o700).create(&dir).is_err() && !dir.is_dir() {
            return;
        }
    }
    // SAFETY: called first thing in main, before any other thread exists.
    std::env::set_var("XDG_RUNTIME_DIR", &dir);
}

/// `sparsa … | head`: when the reader of stdout goes away, end quietly as other command-line
/// tools do (killed by SIGPIPE on Unix) instead of failing on the next write.
fn quiet_closed_pipe() {
    // SAFETY: called first thing in main, before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Whether a panic is the standard library's failure to print to a closed stdout (how a
/// closed pipe shows where there is no SIGPIPE, as on Windows).
fn is_closed_stdout(info: &std::panic::PanicHookInfo) -> bool {
    let p = info.payload();
    let msg = p
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| p.downcast_ref::<&str>().copied())
        .unwrap_or("");
    msg.starts_with("failed printing to stdout")
}

fn main() {
    quiet_closed_pipe();
    quiet_mesa();
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("warn,wgpu_hal=off"),
    )
    .init();
    std::panic::set_hook(Box::new(|info| {
        if is_closed_stdout(info) {
            std::process::exit(0);
        }
        // A dependency's panic that sparsa catches and reports as an error is not ours.
        if !sparsa::error::catching_panic() {
            eprintln!("error: internal error (please report): {info}");
        }
    }));
    interrupt::install();
    sparsa::weights::mapguard::install();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Generate(a) => generate::run(a),
        Cmd::Chat(a) => chat::run(a),
        Cmd::Logits(a) => cmd_logits(a),
        Cmd::Devices => cmd_devices(),
        Cmd::Quantize(a) => cmd_quantize(a),
        Cmd::Info(a) => info::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Synth(a) => cmd_synth(a),
        Cmd::Serve(a) => serve::run(a),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(if interrupt::requested() {
            interrupt::EXIT_CODE
        } else {
            1
        });
    }
}

/// The model's files, checked (config, weight headers) before any GPU is opened.
pub(crate) fn open_source(m: &ModelArgs) -> Result<ModelSource> {
    m.set_prefill_chunk();
    match &m.model {
        Some(dir) => ModelSource::open(dir).map_err(|e| {
            // Most errors start with the path they are about; the others get the directory.
            if e.0.starts_with(&dir.display().to_string()) {
                Error::msg(format!("--model {e}"))
            } else {
                Error::msg(format!("--model {}: {e}", dir.display()))
            }
        }),
        #[cfg(feature = "embedded-model")]
        None => ModelSource::builtin(),
        #[cfg(not(feature = "embedded-model"))]
        None => Err(Error::msg(
            "--model: this build has no embedded model (built without the `embedded-model` feature); name a model directory",
        )),
    }
}

/// The `--gpu-memory` budget for caches of `ctx` tokens, when one was given.
pub(crate) fn budget(m: &ModelArgs, x: &ExpertArgs, ctx: usize) -> Option<sparsa::model::Budget> {
    m.gpu_memory.map(|memory| sparsa::model::Budget {
        memory,
        ctx,
        cache: m.cache_type.0,
        policy: x.expert_policy,
        prefetch: x.expert_prefetch,
        cpu: x.cpu_experts,
        cpu_threads: x.cpu_threads.map_or(0, usize::from),
        placement: x.expert_placement,
        host_copy: x.expert_host_copy,
        host_embeddings: x.host_embeddings,
    })
}

/// The adapter --adapter names, its GEMMs exact where --exact-gemms asks.
pub(crate) fn open_gpu(m: &ModelArgs) -> Result<Arc<Gpu>> {
    let gpu = Gpu::new(m.adapter.as_deref())?;
    gpu.set_exact_gemms(m.exact_gemms);
    Ok(Arc::new(gpu))
}

/// Load the model onto the adapter; `ctx` is the context the planner reserves caches for
/// under `--gpu-memory`.
pub(crate) fn open_model(
    m: &ModelArgs,
    x: &ExpertArgs,
    src: &ModelSource,
    ctx: usize,
) -> Result<Model> {
    let gpu = open_gpu(m)?;
    log::info!("adapter: {}", gpu.adapter.line());
    let t0 = Instant::now();
    let _ctrl_c = interrupt::Loading::start(gpu.interrupt_flag());
    let model = Model::from_source_within(src, gpu, &mut |_, _| {}, budget(m, x, ctx).as_ref())?;
    log::info!("loaded {} in {:.2}s", src.label, t0.elapsed().as_secs_f64());
    Ok(model)
}

/// The context for a request of `need` positions: --ctx, else `need` (the model's maximum
/// when `fill`: the request runs until the context is full), refused when it needs more.
pub(crate) fn ctx_for(
    m: &ModelArgs,
    cfg: &sparsa::config::Config,
    need: usize,
    fill: bool,
) -> Result<usize> {
    let max = cfg.max_position_embeddings.max(1);
    let ctx = m.ctx.unwrap_or(if fill { max } else { need.min(max) });
    if need > ctx {
        return Err(Error::msg(match m.ctx {
            Some(_) => format!("--ctx {ctx}: the request needs {need} positions"),
            None => format!(
                "the request needs {need} positions, more than the model's max_position_embeddings {ctx} (lower --max-tokens or pass --ctx)"
            ),
        }));
    }
    Ok(ctx)
}

fn cmd_logits(a: LogitsArgs) -> Result<()> {
    let mut src = open_source(&a.m)?;
    src.config.keep_mtp(false);
    let ctx = ctx_for(&a.m, &src.config, a.tokens.0.len(), false)?;
    let model = open_model(&a.m, &a.x, &src, ctx)?;
    let mut session = open_session(&a.m, &model, ctx)?;
    let logits = session.forward(&a.tokens.0, true)?;
    write_f32_safetensors(&a.out, "logits", &[logits.rows, logits.vocab], &logits.data)?;
    Ok(())
}

/// A safetensors file with one f32 tensor.
fn write_f32_safetensors(path: &Path, name: &str, shape: &[usize], data: &[f32]) -> Result<()> {
    let bytes = data.len() * 4;
    let mut header =
        serde_json::json!({ name: { "dtype": "F32", "shape": shape, "data_offsets": [0, bytes] } })
            .to_string();
    while !(header.len() + 8).is_multiple_of(8) {
        header.push(' ');
    }
    let mut out = Vec::with_capacity(8 + header.len() + bytes);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(bytemuck::cast_slice(data));
    std::fs::write(path, out)
        .map_err(|e| Error::msg(format!("--out {}: cannot write: {e}", path.display())))
}

fn cmd_devices() -> Result<()> {
    let list = list_adapters();
    if list.is_empty() {
        return Err(Error::msg(
            "no GPU adapter found: install a Vulkan driver (on Debian/Ubuntu without a GPU: `apt-get install mesa-vulkan-drivers`)",
        ));
    }
    for (i, a) in list.iter().enumerate() {
        println!("{i}: {}", a.line());
        println!("   driver: {}", a.driver);
    }
    Ok(())
}

fn cmd_quantize(a: QuantizeArgs) -> Result<()> {
    use sparsa::weights::QFormat;
    let format = match a.format.as_str() {
        "q8" => QFormat::Q8 { block: a.block },
        _ => QFormat::Q4 { block: a.block },
    };
    if a.shard_gb.is_nan() || a.shard_gb <= 0.0 {
        return Err(Error::msg("--shard-gb: expected a positive size"));
    }
    let opts = sparsa::quantize::Options {
        format,
        keep: a.keep.clone(),
        shard_bytes: (a.shard_gb * 1e9) as u64,
        restart: a.restart,
    };
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {wide_msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let t0 = Instant::now();
    // Ctrl-C stops at the next group of rows; the finished shards stay for a resume.
    let ctrl_c = interrupt::Polling::start();
    let r = sparsa::quantize::quantize_dir(&a.model, &a.out, &opts, &mut |event| {
        use sparsa::quantize::Event;
        match event {
            Event::Resuming {
                kept,
                shards,
                done,
                total,
                redo,
            } => {
                bar.suspend(|| {
                    for r in redo {
                        eprintln!("warning: {r}; writing it again");
                    }
                    eprintln!("resuming: {kept} of {shards} shards already done");
                });
                bar.set_length(total);
                bar.set_position(done);
                bar.reset_eta();
            }
            Event::Progress {
                done,
                total,
                tensor,
                ..
            } => {
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message(tensor.to_string());
            }
        }
        !interrupt::requested()
    })
    .inspect_err(|_| bar.abandon());
    drop(ctrl_c);
    let r = r?;
    bar.finish_and_clear();
    eprintln!(
        "{}: {} tensors quantized to {}, {} kept, {} dropped (layers past num_hidden_layers); {:.1} MB -> {:.1} MB in {} shard(s), {:.1}s",
        a.out.display(),
        r.quantized,
        format.name(),
        r.kept,
        r.dropped,
        r.in_bytes as f64 / 1e6,
        r.out_bytes as f64 / 1e6,
        r.shards,
        t0.elapsed().as_secs_f64()
    );
    if r.resumed > 0 {
        eprintln!(
            "({} of the shards were kept from the interrupted run)",
            r.resumed
        );
    }
    Ok(())
}

/// Peak resident memory of this process (Linux), in bytes.
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn cmd_synth(a: SynthArgs) -> Result<()> {
    use sparsa::synth::{plan, release_config, synth_dir, Like, Options};
    use sparsa::weights::QFormat;
    let like = Like::parse(&a.like)?;
    let format = match a.format.as_str() {
        "bf16" => None,
        "fp8" => Some(QFormat::Fp8),
        "q8" => Some(QFormat::Q8 { block: a.block }),
        _ => Some(QFormat::Q4 { block: a.block }),
    };
    if let Some(q @ (QFormat::Q8 { .. } | QFormat::Q4 { .. })) = format {
        QFormat::check_block(q.block(), "--block")?;
    }
    if a.shard_gb.is_nan() || a.shard_gb <= 0.0 {
        return Err(Error::msg("--shard-gb: expected a positive size"));
    }
    if a.threads == Some(0) {
        return Err(Error::msg("--threads: expected at least 1"));
    }
    let rc = release_config(like, a.layers, a.experts, a.mtp)?;
    for n in &rc.notes {
        eprintln!("note: {n}");
    }
    let shard_bytes = (a.shard_gb * 1e9) as u64;
    let p = plan(&rc.json, format, shard_bytes)?;
    let gp = |x: u64| format!("{:.2}B", x as f64 / 1e9);
    if a.dry_run {
        println!(
            "{} --layers {} --experts {} --format {}: {} parameters, {} tensors, {:.2} GB in {} shard(s)",
            like.name(),
            a.layers,
            a.experts.unwrap_or(like.experts()),
            a.format,
            gp(p.params),
            p.tensors,
            p.bytes as f64 / 1e9,
            p.shards
        );
        return Ok(());
    }
    let Some(out) = a.out.as_ref() else {
        return Err(Error::msg("--out: required (or pass --dry-run)"));
    };
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let opts = Options {
        format,
        seed: a.seed,
        shard_bytes,
        threads,
        zeros: a.zeros,
    };
    eprintln!(
        "writing {} ({} layers, {} parameters, {:.2} GB) to {} with {threads} threads",
        like.name(),
        a.layers,
        gp(p.params),
        p.bytes as f64 / 1e9,
        out.display()
    );
    let bar = indicatif::ProgressBar::new(p.bytes);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let t0 = Instant::now();
    let r = synth_dir(&rc.json, out, &opts, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .inspect_err(|_| bar.abandon())?;
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{}: {} parameters, {} tensors, {:.2} GB in {} shard(s), {:.1}s ({:.0} MB/s){}",
        out.display(),
        gp(r.params),
        r.tensors,
        r.bytes as f64 / 1e9,
        r.shards,
        secs,
        r.bytes as f64 / 1e6 / secs.max(1e-9),
        peak_rss()
            .map(|b| format!(", peak RSS {:.0} MB", b as f64 / 1e6))
            .unwrap_or_default()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every flag of every command says what it does in `--help`.
    #[test]
    fn every_flag_has_a_help_line() {
        let cli = Cli::command();
        let mut missing = Vec::new();
        let mut flags = 0;
        for cmd in cli.get_subcommands() {
            for arg in cmd.get_arguments() {
                if arg.is_hide_set() || arg.get_id() == "help" {
                    continue;
                }
                flags += 1;
                if arg
                    .get_help()
                    .is_none_or(|h| h.to_string().trim().is_empty())
                {
                    missing.push(format!("sparsa {} --{}", cmd.get_name(), arg.get_id()));
                }
            }
        }
        assert!(flags > 50, "only {flags} flags found");
        assert!(missing.is_empty(), "flags without help: {missing:?}");
    }

    /// generate and chat take the same sampling and stopping flags, with the short forms.
    #[test]
    fn generate_and_chat_share_the_sampling_flags() {
        let cli = Cli::command();
        let names = |cmd: &str| -> Vec<(String, Option<char>)> {
            let c = cli.find_subcommand(cmd).expect(cmd);
            let mut v: Vec<_> = c
                .get_arguments()
                .filter_map(|a| Some((a.get_long()?.to_string(), a.get_short())))
                .collect();
            v.sort();
            v
        };
        let (g, c) = (names("generate"), names("chat"));
        for flag in [
            "max-tokens",
            "temperature",
            "top-p",
            "top-k",
            "min-p",
            "repeat-penalty",
            "repeat-last-n",
            "presence-penalty",
            "frequency-penalty",
            "seed",
            "stop",
            "ignore-eos",
            "verbose",
            "model",
        ] {
            let find = |v: &[(String, Option<char>)]| v.iter().find(|x| x.0 == flag).cloned();
            let (a, b) = (find(&g), find(&c));
            assert!(a.is_some(), "generate --{flag}");
            assert_eq!(a, b, "--{flag} differs between generate and chat");
        }
        let short =
            |v: &[(String, Option<char>)], f: &str| v.iter().find(|x| x.0 == f).and_then(|x| x.1);
        let info = names("info");
        for unusable in [
            "expert-policy",
            "expert-prefetch",
            "cpu-experts",
            "cpu-threads",
            "expert-placement",
            "temperature",
            "seed",
        ] {
            assert!(
                info.iter().all(|x| x.0 != unusable),
                "info only plans: --{unusable} does nothing there"
            );
        }
        assert_eq!(short(&g, "model"), Some('m'));
        assert_eq!(short(&g, "prompt"), Some('p'));
        assert_eq!(short(&g, "max-tokens"), Some('n'));
    }
}
