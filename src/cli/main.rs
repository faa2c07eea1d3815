//! The `sparsa` command-line tool.

mod chat;

use clap::{Args, Parser, Subcommand};
use sparsa::generate::{generate, Sampler, SamplingParams, Stop};
use sparsa::gpu::{list_adapters, Gpu};
use sparsa::model::{Model, ModelSource};
use sparsa::tokenizer::TextStream;
use sparsa::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What `sparsa generate` writes from when given no prompt and no --model.
const DEFAULT_PROMPT: &str = "KING RICHARD:";
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
    Generate(GenerateArgs),
    /// Chat with the model: an interactive session (one reply per line when stdin is piped).
    Chat(chat::ChatArgs),
    /// Write the logits of every prompt position (one prefill) to a safetensors file.
    Logits(LogitsArgs),
    /// List GPU adapters with their backend and limits.
    Devices,
}

#[derive(Args)]
struct ModelArgs {
    /// Model directory (Hugging Face layout: config.json + safetensors). Default: the
    /// built-in sparsa-bard-12m (a small Shakespeare model; see models/sparsa-bard-12m).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Use the first adapter whose name contains this text (see `sparsa devices`).
    #[arg(long)]
    adapter: Option<String>,
    /// Context length to allocate caches for (default: what the request needs; for chat, the
    /// model's max_position_embeddings (1024 for the built-in model), lowered to what the
    /// adapter's buffer limits allow).
    #[arg(long)]
    ctx: Option<usize>,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Prompt text (needs tokenizer.json in the model directory).
    /// Default with the built-in model: "KING RICHARD:".
    #[arg(long, conflicts_with = "tokens")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids, e.g. 1,2,3.
    #[arg(long, value_parser = parse_ids)]
    tokens: Option<Ids>,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Keep only the K most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the generated ids, comma-separated, on one line (instead of text).
    #[arg(long)]
    print_ids: bool,
    /// Print only the continuation, not the prompt text before it.
    #[arg(long)]
    no_echo: bool,
}

#[derive(Args)]
struct LogitsArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Comma-separated token ids.
    #[arg(long, value_parser = parse_ids)]
    tokens: Ids,
    /// Output file (safetensors with one f32 tensor `logits` of shape [T, vocab]).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Clone)]
struct Ids(Vec<u32>);

fn parse_ids(s: &str) -> std::result::Result<Ids, String> {
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

fn main() {
    quiet_mesa();
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("warn,wgpu_hal=off"),
    )
    .init();
    std::panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error (please report): {info}");
    }));
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Generate(a) => cmd_generate(a),
        Cmd::Chat(a) => chat::run(a),
        Cmd::Logits(a) => cmd_logits(a),
        Cmd::Devices => cmd_devices(),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The model's files, checked (config, weight headers) before any GPU is opened.
fn open_source(m: &ModelArgs) -> Result<ModelSource> {
    match &m.model {
        Some(dir) => ModelSource::open(dir).map_err(|e| Error::msg(format!("--model {e}"))),
        None => ModelSource::builtin(),
    }
}

fn open_model(m: &ModelArgs, src: &ModelSource) -> Result<Model> {
    let gpu = Arc::new(Gpu::new(m.adapter.as_deref())?);
    log::info!("adapter: {}", gpu.adapter.line());
    let t0 = Instant::now();
    let model = Model::from_source(src, gpu, &mut |_, _| {})?;
    log::info!("loaded {} in {:.2}s", src.label, t0.elapsed().as_secs_f64());
    Ok(model)
}

fn ctx_for(m: &ModelArgs, model: &Model, need: usize) -> Result<usize> {
    let ctx = m
        .ctx
        .unwrap_or(need.min(model.config.max_position_embeddings.max(1)));
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

fn cmd_generate(a: GenerateArgs) -> Result<()> {
    // The prompt is tokenized before the model loads, so a missing tokenizer fails fast.
    let src = open_source(&a.m)?;
    let (tok, prompt) = match (&a.prompt, &a.tokens) {
        (Some(p), _) => {
            let t = src.tokenizer()?;
            let ids = t.encode(p)?;
            (Some(t), ids)
        }
        (None, Some(ids)) => (src.tokenizer().ok(), ids.0.clone()),
        (None, None) if a.m.model.is_none() => {
            let t = src.tokenizer()?;
            let ids = t.encode(DEFAULT_PROMPT)?;
            (Some(t), ids)
        }
        (None, None) => {
            return Err(Error::msg(
                "give a prompt with --prompt TEXT or --tokens 1,2,3",
            ))
        }
    };
    if prompt.is_empty() {
        return Err(Error::msg(
            "--prompt: the prompt is empty after tokenization",
        ));
    }
    let model = open_model(&a.m, &src)?;
    let ctx = ctx_for(&a.m, &model, prompt.len() + a.max_tokens)?;
    let mut session = model.session(ctx)?;
    let mut sampler = Sampler::new(SamplingParams {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        seed: a.seed,
        ..Default::default()
    });
    let eos = model.config.eos_token_ids.clone();
    let stdout = std::io::stdout();
    let mut stream = if a.print_ids {
        None
    } else {
        tok.as_ref().map(TextStream::new)
    };
    // The prompt text goes first, so the output reads as one text (not for --tokens).
    let echo = match (&a.prompt, &a.tokens) {
        (Some(p), _) => Some(p.as_str()),
        (None, None) => Some(DEFAULT_PROMPT),
        (None, Some(_)) => None,
    };
    if let (Some(_), Some(text), false) = (&stream, echo, a.no_echo) {
        let mut o = stdout.lock();
        let _ = o.write_all(text.as_bytes());
        let _ = o.flush();
    }
    let t0 = Instant::now();
    let mut first: Option<Instant> = None;
    let mut err: Option<Error> = None;
    let (out, stop) = generate(
        &mut session,
        &prompt,
        a.max_tokens,
        &mut sampler,
        &eos,
        |id| {
            first.get_or_insert_with(Instant::now);
            if let Some(s) = stream.as_mut() {
                match s.push(id) {
                    Ok(text) => {
                        let mut o = stdout.lock();
                        let _ = o.write_all(text.as_bytes());
                        let _ = o.flush();
                    }
                    Err(e) => {
                        err = Some(e);
                        return false;
                    }
                }
            } else if !a.print_ids {
                let mut o = stdout.lock();
                let _ = write!(o, "{id} ");
                let _ = o.flush();
            }
            true
        },
    )?;
    if let Some(e) = err {
        return Err(e);
    }
    if a.print_ids {
        let ids: Vec<String> = out.iter().map(|x| x.to_string()).collect();
        println!("{}", ids.join(","));
    } else {
        println!();
    }
    let total = t0.elapsed().as_secs_f64();
    let ttft = first.map(|f| (f - t0).as_secs_f64()).unwrap_or(total);
    let decode = out.len().saturating_sub(1) as f64 / (total - ttft).max(1e-9);
    if stop == Stop::ContextFull {
        eprintln!("note: stopped at the context limit ({ctx} tokens)");
    }
    log::info!(
        "{} prompt tokens, prefill {:.1} tok/s (ttft {:.3}s), {} generated, decode {:.2} tok/s",
        prompt.len(),
        prompt.len() as f64 / ttft.max(1e-9),
        ttft,
        out.len(),
        decode
    );
    Ok(())
}

fn cmd_logits(a: LogitsArgs) -> Result<()> {
    let src = open_source(&a.m)?;
    let model = open_model(&a.m, &src)?;
    let ctx = ctx_for(&a.m, &model, a.tokens.0.len())?;
    let mut session = model.session(ctx)?;
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
