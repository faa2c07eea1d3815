//! `sparsa info`: a model's architecture, parameters, bytes per tensor class, memory plan,
//! adapter limits and whether the model fits this adapter.
//!
//! A directory holding only `config.json` (and perhaps `model.safetensors.index.json`) is
//! planned before anything is downloaded: its tensors are derived from the config (the list
//! `sparsa synth` writes) in the format the user intends to download or convert to
//! (`--format`), and the same summary and `--gpu-memory` plan run on that list.

use super::{open_source, ModelArgs};
use clap::Args;
use sparsa::cache::{CacheFormat, Caches};
use sparsa::config::{Config, IndexerKind};
use sparsa::error::Error;
use sparsa::experts::HostCopy;
use sparsa::gpu::Gpu;
use sparsa::model::info::{summarize, summarize_tensors, Summary, TensorClass};
use sparsa::model::plan::{gib, placing_embeddings};
use sparsa::model::{
    free_memory, longest_ctx, plan_sized, session_room, GpuMemory, ModelSource, Plan, Session,
};
use sparsa::synth::{check_index, has_weights, tensor_list, ConfigDir};
use sparsa::weights::quant::DEFAULT_BLOCK;
use sparsa::weights::QFormat;
use sparsa::Result;

#[derive(Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub m: ModelArgs,
    /// Describe the model as stored in this format, derived from its config.json: bf16, fp8
    /// (the official FP8 release layout), q8 or q4 (as `sparsa quantize` writes them).
    /// Default: the format of the files; for a directory without weights, the format its
    /// shard index shows, else its quantization_config, else bf16.
    #[arg(long, value_parser = ["bf16", "fp8", "q8", "q4"])]
    format: Option<String>,
    /// Columns per scale for --format q8 / q4: 32, 64, 128 or 256.
    #[arg(long, default_value_t = DEFAULT_BLOCK)]
    block: usize,
}

/// The storage binding assumed for the scratch when there is no adapter (an H200's).
const NO_ADAPTER_BINDING: u64 = 2 << 30;

/// The share of the adapter's memory suggested for `--gpu-memory` when the model does not fit.
const SUGGESTED_PERCENT: f64 = 90.0;

fn format_of(name: &str, block: usize) -> Option<QFormat> {
    match name {
        "fp8" => Some(QFormat::Fp8),
        "q8" => Some(QFormat::Q8 { block }),
        "q4" => Some(QFormat::Q4 { block }),
        _ => None,
    }
}

fn format_name(f: Option<QFormat>) -> String {
    match f {
        None => "bf16".into(),
        Some(QFormat::Fp8) => "fp8 (128×128 blocks)".into(),
        Some(q) => format!("{} (block {})", q.name(), q.block()),
    }
}

/// Bytes as MB below 1 GB, else GB.
fn size(b: u64) -> String {
    if b < 1_000_000_000 {
        format!("{:.1} MB", b as f64 / 1e6)
    } else {
        format!("{:.1} GB", b as f64 / 1e9)
    }
}

fn params(p: u64) -> String {
    if p >= 1_000_000_000 {
        format!("{:.2}B", p as f64 / 1e9)
    } else {
        format!("{:.2}M", p as f64 / 1e6)
    }
}

/// The summary of `cfg`'s tensors as stored in `format`, derived from the config.
fn derived(cfg: &Config, format: Option<QFormat>) -> Result<(Config, Summary)> {
    let mut c = cfg.clone();
    c.quant = format;
    let s = summarize_tensors(&c, &tensor_list(&c, format)?)?;
    Ok((c, s))
}

fn file_bytes(s: &Summary) -> u64 {
    s.classes.iter().map(|c| c.file_bytes).sum()
}

/// The adapter as the room for a session is sized: its free memory now
/// ([`free_memory`]), its memory size (its largest buffer where it does not report one) and
/// whether it reports one.
struct Memory {
    free: u64,
    size: u64,
    reported: bool,
}

impl Memory {
    fn of(gpu: &Gpu) -> Memory {
        let reported = gpu.memory_size();
        Memory {
            free: free_memory(gpu),
            size: reported.unwrap_or(gpu.limits.max_buffer_size),
            reported: reported.is_some(),
        }
    }
}

/// The GPU bytes a session's caches and scratch get once the weights are placed
/// ([`session_room`]), and whose they are: under `--gpu-memory`, the budget's; else the
/// adapter's. `None` without a budget or an adapter.
fn room_of(
    cfg: &Config,
    s: &Summary,
    budget: Option<GpuMemory>,
    memory: Option<&Memory>,
) -> Result<Option<(u64, String)>> {
    Ok(match (budget, memory) {
        (Some(b), m) => {
            let bytes = b.bytes(m.filter(|m| m.reported).map(|m| m.size))?;
            Some((
                session_room(cfg, s, 0, Some(bytes)),
                format!("--gpu-memory {}", gib(bytes)),
            ))
        }
        (None, Some(m)) => Some((
            session_room(cfg, s, m.free, None),
            if m.reported {
                format!("the adapter's {}", gib(m.size))
            } else {
                format!("the adapter's largest buffer ({})", gib(m.size))
            },
        )),
        (None, None) => None,
    })
}

/// [`room_of`] for chat before it loads the model: the same figure `sparsa info` sizes
/// contexts with.
pub(crate) fn room_before_loading(
    m: &ModelArgs,
    src: &ModelSource,
    gpu: &Gpu,
) -> Result<(u64, String)> {
    let s = summarize(&src.config, &src.weights)?;
    let r = room_of(&src.config, &s, m.gpu_memory, Some(&Memory::of(gpu)))?;
    Ok(r.unwrap_or_default())
}

/// Where the model's description comes from.
enum Source {
    /// A directory holding config.json but no weights.
    Config(ConfigDir),
    /// Model files (or the built-in model).
    Files(ModelSource),
}

pub fn run(a: InfoArgs) -> Result<()> {
    let m = &a.m;
    let want = a.format.as_deref().map(|f| format_of(f, a.block));
    if let Some(Some(q @ (QFormat::Q8 { .. } | QFormat::Q4 { .. }))) = want {
        QFormat::check_block(q.block(), "--block")?;
    }
    // A directory with config.json and no weights (yet) is planned from the config.
    let source = match &m.model {
        Some(dir) if dir.join("config.json").is_file() && !has_weights(dir) => {
            m.set_prefill_chunk();
            Source::Config(ConfigDir::open(dir).map_err(|e| {
                if e.0.starts_with(&dir.display().to_string()) {
                    Error::msg(format!("--model {e}"))
                } else {
                    Error::msg(format!("--model {}: {e}", dir.display()))
                }
            })?)
        }
        _ => Source::Files(open_source(m)?),
    };
    // What a run without --draft loads: no MTP layer, no caches for one.
    let mut source = source;
    match &mut source {
        Source::Config(cd) => cd.config.keep_mtp(false),
        Source::Files(src) => src.config.keep_mtp(false),
    }
    // The format described and why (None: the files as they are), and the summary.
    let (label, config) = match &source {
        Source::Config(cd) => (
            format!(
                "{} (config.json only: sizes and plan derived from the config)",
                cd.dir.display()
            ),
            &cd.config,
        ),
        Source::Files(src) => (src.label.clone(), &src.config),
    };
    let planned: Option<(Option<QFormat>, &str)> = match (want, &source) {
        (Some(f), _) => Some((f, "--format")),
        (None, Source::Config(cd)) => Some(match (&cd.index, cd.stored_format()) {
            (Some(_), f) => (f, "the shard index"),
            (None, Some(f)) => (Some(f), "quantization_config"),
            (None, None) => (None, "no shard index or quantization_config: bf16"),
        }),
        (None, Source::Files(_)) => None,
    };
    let (c, s) = match (&planned, &source) {
        (None, Source::Files(src)) => (config.clone(), summarize(config, &src.weights)?),
        (p, _) => derived(config, p.and_then(|p| p.0))?,
    };
    let c = &c;

    println!("model: {label}");
    println!(
        "architecture: {:?}, {} layers ({} dense MLP), hidden {}, vocab {}, max positions {}",
        c.family,
        c.num_hidden_layers,
        c.dense_layers.iter().filter(|d| **d).count(),
        c.hidden_size,
        c.vocab_size,
        c.max_position_embeddings
    );
    println!(
        "attention: MLA, {} heads, q_lora {}, kv_lora {}, nope {} + rope {}, v {}; RoPE {:?}",
        c.num_attention_heads,
        c.q_lora_rank,
        c.kv_lora_rank,
        c.qk_nope_head_dim,
        c.qk_rope_head_dim,
        c.v_head_dim,
        c.rope.kind
    );
    let pattern: String = c
        .indexer_types
        .iter()
        .map(|k| if *k == IndexerKind::Full { 'F' } else { 'S' })
        .collect();
    println!(
        "indexer: {} heads × {}, top-{}, RoPE {}; layers (F = full, S = IndexShare): {pattern}",
        c.index_n_heads,
        c.index_head_dim,
        c.index_topk,
        if c.indexer_rope_interleave {
            "interleaved"
        } else {
            "half-split"
        }
    );
    println!(
        "MoE: {} routed experts, top-{} (groups {} / top {}), {} shared, expert width {}",
        c.n_routed_experts,
        c.num_experts_per_tok,
        c.n_group,
        c.topk_group,
        c.n_shared_experts,
        c.moe_intermediate_size
    );
    match &planned {
        None => println!(
            "parameters: {} total, {} active per token; stored as {}{}",
            params(s.params_total),
            params(s.params_active),
            s.formats.join(" + "),
            c.quant
                .map(|q| format!(" (quantization_config: {} block {})", q.name(), q.block()))
                .unwrap_or_default()
        ),
        Some((f, why)) => {
            println!(
                "parameters: {} total, {} active per token; planned as {} ({why}; tensors {})",
                params(s.params_total),
                params(s.params_active),
                format_name(*f),
                s.formats.join(" + ")
            );
            println!(
                "size by format ({} layers; a release's MTP layer is downloaded too, but not run):",
                c.num_hidden_layers
            );
            println!("  {:<22} {:>12} {:>12}", "format", "files", "GPU");
            for f in [
                None,
                Some(QFormat::Fp8),
                Some(QFormat::Q8 { block: a.block }),
                Some(QFormat::Q4 { block: a.block }),
            ] {
                let (_, fs) = derived(config, f)?;
                println!(
                    "  {:<22} {:>12} {:>12}",
                    format_name(f),
                    size(file_bytes(&fs)),
                    size(fs.gpu_weight_bytes())
                );
            }
        }
    }
    if let Source::Config(cd) = &source {
        report_index(cd, c)?;
    }
    println!(
        "{:<16} {:>10} {:>12} {:>12}",
        "tensors", "params", "file", "GPU"
    );
    for class in TensorClass::ALL {
        let cl = s.class(class);
        if cl.file_bytes == 0 {
            continue;
        }
        println!(
            "{:<16} {:>10} {:>12} {:>12}",
            class.name(),
            params(cl.params),
            size(cl.file_bytes),
            size(cl.gpu_bytes)
        );
    }
    if s.skipped_tensors > 0 {
        println!(
            "({} tensors past num_hidden_layers (the MTP layer) are not counted: it loads for --draft where every expert is resident)",
            s.skipped_tensors
        );
    }
    let ctx = m.ctx.unwrap_or(c.max_position_embeddings);
    let gpu = Gpu::new(m.adapter.as_deref());
    let (binding, memory) = match &gpu {
        Ok(gpu) => {
            println!("adapter: {}", gpu.adapter.line());
            if let Some(b) = gpu.memory_size() {
                println!(
                    "adapter memory (largest device-local heap): {:.2} GiB",
                    b as f64 / (1u64 << 30) as f64
                );
            }
            (gpu.max_binding(), Some(Memory::of(gpu)))
        }
        Err(e) => {
            println!("adapter: none ({e})");
            (NO_ADAPTER_BINDING, None)
        }
    };
    // What a session's caches and scratch get after the weights; a --gpu-memory share of no
    // adapter is reported by the plan below.
    let room = room_of(c, &s, m.gpu_memory, memory.as_ref()).unwrap_or(None);
    let in_range = u32::try_from(ctx).is_ok();
    let scratch = if in_range {
        Session::scratch_bytes(c, ctx, binding, false)
    } else {
        0
    };
    let (format, how) = match (m.cache_type.0, &room) {
        (Some(f), _) => {
            f.check(c)?;
            (f, "--cache-type".to_string())
        }
        (None, Some((r, name))) => (
            CacheFormat::auto(c, ctx, r.saturating_sub(scratch)),
            format!("auto: the most precise whose caches fit {name} after the weights"),
        ),
        (None, None) => (
            CacheFormat::F32,
            "auto; no adapter or --gpu-memory to size against".into(),
        ),
    };
    let per_token = Caches::bytes_per_token(c, format);
    let cache = per_token.saturating_mul(ctx as u64);
    let full = c
        .indexer_types
        .iter()
        .filter(|k| **k == IndexerKind::Full)
        .count();
    println!(
        "memory plan at --ctx {ctx}: weights {} + caches {} (caches {} ({how}): {per_token} B per token, a latent row on each of {} layers and an indexer key on each of {full} full layers) = {}",
        size(s.gpu_weight_bytes()),
        size(cache),
        format.name(),
        c.num_hidden_layers,
        size(s.gpu_weight_bytes().saturating_add(cache))
    );
    match &room {
        Some((r, name)) => println!(
            "cache formats: bytes per token, and the longest context whose caches and scratch fit {name} after the weights ({}):",
            gib(*r)
        ),
        None => println!("cache formats: bytes per token (no adapter: no memory to fit contexts in):"),
    }
    for f in CacheFormat::LADDER {
        let per = Caches::bytes_per_token(c, f);
        let fits = match (&room, f.check(c)) {
            (_, Err(_)) => "not for this model's shapes".to_string(),
            (None, _) => String::new(),
            (Some((r, _)), _) => match longest_ctx(c, f, *r, binding, usize::MAX) {
                0 => "fits: no".into(),
                n => format!(
                    "fits {n} tokens{}",
                    if n >= c.max_position_embeddings {
                        " (max positions: yes)"
                    } else {
                        ""
                    }
                ),
            },
        };
        println!(
            "  {:<10} {:>10} B/token  {fits}{}",
            f.name(),
            per,
            if f == format { "  <- used" } else { "" }
        );
    }
    if let Some((r, name)) = &room {
        let (n, why) =
            super::chat::default_ctx(c, m.model.is_none(), m.cache_type.0, *r, binding, name);
        println!("chat's default context (without --ctx): {n} ({why})");
    }
    let fit = Fit {
        cfg: c,
        s: &s,
        ctx,
        binding,
        memory: memory.as_ref().filter(|m| m.reported).map(|m| m.size),
        free: memory.as_ref().map_or(0, |m| m.free),
        adapter: gpu.is_ok(),
        // As a load with --gpu-memory places the embedding table (--host-embeddings auto);
        // without the files, the config says whether the LM head is the table.
        host_embed_ok: gpu
            .as_ref()
            .is_ok_and(|g| HostCopy::Auto.wanted(g, s.embed_bytes)),
        format,
        explicit: m.cache_type.0,
    };
    fit.report(m.gpu_memory)
}

/// What the shard index of a config-only directory says, beside what the config implies.
fn report_index(cd: &ConfigDir, c: &Config) -> Result<()> {
    let Some(ix) = &cd.index else {
        println!("shard index: none (model.safetensors.index.json would name the release's tensors and its total size)");
        return Ok(());
    };
    let stored = cd.stored_format();
    println!(
        "shard index: {} tensors in {} shards ({} present here); its names show {}",
        ix.names.len(),
        ix.shards.len(),
        ix.shards_present,
        format_name(stored)
    );
    let list = tensor_list(&cd.config, stored)?;
    let check = check_index(&cd.config, ix, &list);
    let last = c.num_hidden_layers.saturating_sub(1);
    if check.matches() {
        println!(
            "  every tensor the config implies is in the index ({}), and {} more past layer {last} (the MTP layer: downloaded, not run)",
            list.len(),
            check.past_layers,
        );
    } else {
        let few = |v: &[String]| v.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
        println!(
            "  the index differs from the tensors the config implies: {} missing (e.g. {}), {} unexpected (e.g. {}), {} past layer {last} (MTP); the sizes here are the config's",
            check.missing.len(),
            few(&check.missing),
            check.unexpected.len(),
            few(&check.unexpected),
            check.past_layers,
        );
    }
    if let Some(total) = ix.total_size {
        let ours: u64 = list.iter().map(|t| t.bytes).sum();
        let rest = if total >= ours {
            format!(
                "leaving {} for the tensors past them (MTP)",
                size(total - ours)
            )
        } else {
            format!("{} more than the index counts", size(ours - total))
        };
        println!(
            "  metadata.total_size {}; the config's {} layers in {} come to {}, {rest}",
            size(total),
            c.num_hidden_layers,
            format_name(stored),
            size(ours),
        );
    }
    Ok(())
}

/// Whether the model fits, and with what `--gpu-memory`.
struct Fit<'a> {
    cfg: &'a Config,
    s: &'a Summary,
    ctx: usize,
    binding: u64,
    memory: Option<u64>,
    adapter: bool,
    /// The adapter would keep the embedding table in host memory where the plan offloads
    /// experts (see [`sparsa::model::plan::placing_embeddings`]).
    host_embed_ok: bool,
    /// What the adapter has free for sparsa now ([`free_memory`]).
    free: u64,
    /// The caches' formats at `ctx` without a budget or with the one given.
    format: CacheFormat,
    /// `--cache-type`, unless auto.
    explicit: Option<CacheFormat>,
}

impl Fit<'_> {
    fn yes(&self, how: &str) {
        println!("fits this adapter: yes, {how}");
    }

    /// The plan for `budget` bytes, with caches in `cache` (`None`: chosen for the budget).
    fn plan(&self, budget: u64, ctx: usize, cache: Option<CacheFormat>) -> Result<Plan> {
        let sized = |s: &Summary| plan_sized(self.cfg, s, budget, ctx, self.binding, cache);
        let tied = self.cfg.tie_word_embeddings;
        placing_embeddings(self.s, tied, HostCopy::Auto, self.host_embed_ok, sized)
    }

    /// The longest context (up to `self.ctx`) whose plan fits `budget`, if any, and the
    /// caches' formats it is counted in (auto: the smallest).
    fn longest_ctx(&self, budget: u64) -> (Option<usize>, CacheFormat) {
        let f = self.explicit.unwrap_or(CacheFormat::SMALLEST);
        let room = session_room(self.cfg, self.s, 0, Some(budget));
        let n = longest_ctx(self.cfg, f, room, self.binding, self.ctx);
        ((n > 0).then_some(n), f)
    }

    /// What streaming the non-resident experts costs the host.
    fn streaming(&self, p: &Plan) {
        let sl = &p.slots;
        let total = (sl.moe_layers() * sl.n_experts) as u64;
        if !sl.offloads() || total == 0 {
            return;
        }
        let away = total - sl.resident_experts() as u64;
        let file = self.s.class(TensorClass::RoutedExperts).file_bytes;
        let ram = (file as u128 * away as u128 / total as u128) as u64;
        let k = self.cfg.num_experts_per_tok as f64;
        let per_token: f64 = sl
            .per_layer
            .iter()
            .filter(|&&n| n > 0)
            .map(|&n| k * (1.0 - n as f64 / sl.n_experts as f64) * sl.expert_bytes as f64)
            .sum();
        println!(
            "host memory: the {away} routed experts not on the GPU stream from the model files; {} of RAM (page cache) keeps them in memory, with less they are read from disk again on each miss",
            size(ram)
        );
        println!(
            "streaming: with uniform routing (the worst case; trained routers reuse experts) about {} uploaded per token",
            size(per_token as u64)
        );
    }

    fn report(&self, budget: Option<GpuMemory>) -> Result<()> {
        let ctx = self.ctx;
        let fits_u32 = u32::try_from(ctx).is_ok();
        if !fits_u32
            || Caches::bytes_per_token(self.cfg, self.format)
                .checked_mul(ctx as u64)
                .is_none()
        {
            println!("fits this adapter: no, --ctx {ctx} is beyond any adapter's memory");
            return Ok(());
        }
        // Everything resident, and the least that runs with routed experts streamed.
        let all = self.plan(u64::MAX, ctx, Some(self.format))?;
        let sl = &all.slots;
        let n_moe = sl.moe_layers() as u64;
        let need_all = all.fixed() + sl.resident_experts() as u64 * sl.expert_bytes;
        let need_min = all.fixed() + n_moe * sl.expert_bytes;
        if n_moe > 0 {
            println!(
                "GPU memory at --ctx {ctx}: {} with every routed expert resident; at least {} with routed experts streamed (everything else and one expert slot per MoE layer)",
                gib(need_all),
                gib(need_min)
            );
        } else {
            println!("GPU memory at --ctx {ctx}: {}", gib(need_all));
        }
        let adapter = match (self.adapter, self.memory) {
            (false, _) => None,
            (true, m) => Some(m),
        };
        match budget {
            Some(mem) => {
                let bytes = match (mem, adapter) {
                    (GpuMemory::Percent(p), None) => {
                        println!(
                            "fits this adapter: no adapter (--gpu-memory {p}% is a share of one)"
                        );
                        return Ok(());
                    }
                    (mem, a) => mem.bytes(a.flatten())?,
                };
                self.with_budget(bytes, adapter, &format!("--gpu-memory {}", gib(bytes)))
            }
            None => match adapter {
                None => {
                    println!("fits this adapter: no adapter");
                    Ok(())
                }
                Some(None) => {
                    println!(
                        "fits this adapter: cannot tell (the adapter does not report its memory size); it needs {} with every weight resident, or pass --gpu-memory SIZE",
                        gib(need_all)
                    );
                    Ok(())
                }
                Some(Some(have)) if need_all <= self.free => {
                    self.yes(&format!(
                        "every weight resident ({} of its {})",
                        gib(need_all),
                        gib(have)
                    ));
                    Ok(())
                }
                Some(Some(have)) => {
                    println!(
                        "every weight resident: no, {} needed and the adapter has {} ({} free for sparsa, which leaves 5 % to others); with routed experts streamed:",
                        gib(need_all),
                        gib(have),
                        gib(self.free)
                    );
                    let bytes = GpuMemory::Percent(SUGGESTED_PERCENT).bytes(Some(have))?;
                    self.with_budget(
                        bytes,
                        adapter,
                        &format!("--gpu-memory {SUGGESTED_PERCENT}% ({})", gib(bytes)),
                    )
                }
            },
        }
    }

    /// The plan for `bytes` of GPU memory and whether the adapter has them.
    fn with_budget(&self, bytes: u64, adapter: Option<Option<u64>>, what: &str) -> Result<()> {
        match self.plan(bytes, self.ctx, self.explicit) {
            Ok(p) => {
                println!("{}", p.describe());
                self.streaming(&p);
                let sl = &p.slots;
                let total = sl.moe_layers() * sl.n_experts;
                let how = if sl.offloads() {
                    format!(
                        "{:.1} % of the routed experts resident, the rest streamed",
                        100.0 * sl.resident_experts() as f64 / total.max(1) as f64
                    )
                } else {
                    "every weight resident".into()
                };
                match adapter {
                    None => println!("fits this adapter: no adapter (with {what}: {how})"),
                    Some(None) => println!(
                        "fits this adapter: cannot tell (the adapter does not report its memory size); with {what}: {how}"
                    ),
                    Some(Some(have)) if bytes > have => println!(
                        "fits this adapter: no, {what} is more than its {}",
                        gib(have)
                    ),
                    Some(Some(_)) => self.yes(&format!("with {what}: {how}")),
                }
            }
            Err(e) => {
                let room = match self.longest_ctx(bytes) {
                    (Some(n), f) => format!("at most --ctx {n} fits in it (caches {})", f.name()),
                    (None, _) => "it does not fit at any --ctx".into(),
                };
                let verdict = match adapter {
                    None => "no adapter; and",
                    _ => "no,",
                };
                println!("fits this adapter: {verdict} {e}; {room}");
            }
        }
        Ok(())
    }
}
