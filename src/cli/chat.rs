//! `sparsa chat`: an interactive chat on the terminal, or one reply per input line when stdin
//! is not a terminal.
//!
//! The conversation logic (prefix reuse, the context policy, reasoning, stop strings) lives in
//! the library ([`sparsa::chat::Chat`]); this module is the terminal around it: line editing,
//! Ctrl-C, the progress bar, colours and the in-session commands.

use super::sampling::SamplingArgs;
use super::{interrupt, open_source, ExpertArgs, ModelArgs};
use clap::Args;
use sparsa::cache::{CacheFormat, Caches};
use sparsa::chat::{
    reply_reserve, Chat, ChatEvent, ChatFormat, ChatTemplate, Conversation, Part, Prepared,
    ReplyEnd, ReplyOptions,
};
use sparsa::generate::Sampler;
use sparsa::gpu::Gpu;
use sparsa::model::{Model, ModelSource, Session};
use sparsa::tokenizer::Tokenizer;
use sparsa::{Error, Result};
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Default context of the built-in model: its training length (its config allows 4096, but
/// its quality collapses past 1024; see models/sparsa-bard-12m/README.md).
const BUILTIN_CTX: usize = 1024;

const HELP: &str = "\
commands:
  /help           this list
  /reset          forget the conversation (the system prompt stays)
  /system [TEXT]  set the system prompt (without TEXT: show it)
  /stats [-v]     speed and token counts of the last reply, context use, drafts, experts, the seed
                  (-v: also GPU buffers, allocator and host memory)
  /save FILE      write the conversation as JSON ({\"messages\": [...]})
  /load FILE      replace the conversation with one saved by /save
  /exit           leave (also /quit, /bye, Ctrl-D)
Ctrl-C stops a reply (what was written so far stays in the conversation).";

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    m: ModelArgs,
    #[command(flatten)]
    x: ExpertArgs,
    /// System prompt (change it in the session with /system TEXT).
    #[arg(long)]
    system: Option<String>,
    #[command(flatten)]
    s: SamplingArgs,
    /// Ask the model to reason first (templates with an enable_thinking / thinking switch).
    #[arg(long, conflicts_with = "no_think")]
    think: bool,
    /// Ask the model to answer without reasoning.
    #[arg(long)]
    no_think: bool,
    /// Do not print the reasoning (it is still kept in the conversation and /save).
    #[arg(long)]
    hide_think: bool,
    /// Write each reply as one line of JSON ({"content", "reasoning_content", "finish_reason",
    /// "usage"}) instead of text, so a script reading a pipe can tell replies apart.
    #[arg(long)]
    json: bool,
}

/// Replies per chat when --max-tokens is not given.
const DEFAULT_MAX_TOKENS: usize = 1024;

/// A message was refused (not UTF-8, too long, the template failed): with piped stdin the
/// remaining lines still run, then sparsa exits with status 1.
static FAILED: AtomicBool = AtomicBool::new(false);

/// --json: each message gets one line on stdout, a reply or an error.
static JSON: AtomicBool = AtomicBool::new(false);

/// Prints `error: msg` for one refused message and remembers the failure (with --json, also
/// an `{"error": ...}` line in place of the reply).
fn refuse(msg: &str) {
    FAILED.store(true, Ordering::SeqCst);
    note(&format!("error: {msg}"));
    if JSON.load(Ordering::SeqCst) {
        say(&serde_json::json!({ "error": msg }).to_string());
    }
}

/// Numbers of one reply, for /stats and --verbose.
struct TurnStats {
    prompt: usize,
    prefilled: usize,
    reused: usize,
    generated: usize,
    ttft: f64,
    decode_secs: f64,
    context: usize,
}

impl TurnStats {
    fn line(&self, ctx: usize) -> String {
        let prefill = self.prefilled as f64 / self.ttft.max(1e-9);
        let decode = self.generated.saturating_sub(1) as f64 / self.decode_secs.max(1e-9);
        format!(
            "prompt {} tokens: {} prefilled, {} reused | prefill {:.1} tok/s | first token {:.2} s | {} generated, decode {:.1} tok/s | context {}/{}",
            self.prompt,
            self.prefilled,
            self.reused,
            prefill,
            self.ttft,
            self.generated,
            decode,
            self.context,
            ctx
        )
    }
}

struct Ui {
    /// ANSI styles on stdout.
    color: bool,
    hide_think: bool,
    /// Replies go out as JSON lines once complete, not streamed as text.
    json: bool,
}

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// Writes a streaming reply: reasoning dimmed (or between `<think>` and `</think>` without
/// colour, or not at all with --hide-think), content as it comes.
struct Printer<'u> {
    ui: &'u Ui,
    in_reasoning: bool,
    /// Parts that have shown text (leading whitespace of each part is not printed: the
    /// stored message is trimmed too).
    started: [bool; 2],
    out: std::io::Stdout,
}

impl Printer<'_> {
    fn new(ui: &Ui) -> Printer<'_> {
        Printer {
            ui,
            in_reasoning: false,
            started: [false; 2],
            out: std::io::stdout(),
        }
    }

    fn text(&mut self, part: Part, s: &str) {
        if self.ui.json {
            return;
        }
        let i = usize::from(part == Part::Content);
        let s = if self.started[i] { s } else { s.trim_start() };
        if s.is_empty() {
            return;
        }
        self.started[i] = true;
        let mut o = self.out.lock();
        match part {
            Part::Reasoning => {
                if self.ui.hide_think {
                    return;
                }
                if !self.in_reasoning {
                    let _ = o.write_all(if self.ui.color { DIM } else { "<think>" }.as_bytes());
                    self.in_reasoning = true;
                }
                let _ = o.write_all(s.as_bytes());
            }
            Part::Content => {
                if self.in_reasoning {
                    let _ = o.write_all(if self.ui.color { RESET } else { "</think>" }.as_bytes());
                    self.in_reasoning = false;
                }
                let _ = o.write_all(s.as_bytes());
            }
        }
        let _ = o.flush();
    }

    fn end(&mut self) {
        if self.ui.json {
            return;
        }
        let mut o = self.out.lock();
        if self.in_reasoning {
            let _ = o.write_all(if self.ui.color { RESET } else { "</think>" }.as_bytes());
            self.in_reasoning = false;
        }
        let _ = o.write_all(b"\n");
        let _ = o.flush();
    }
}

/// A line on stderr (status and notices, never part of a reply).
fn note(msg: &str) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{msg}");
    let _ = e.flush();
}

fn say(msg: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{msg}");
    let _ = o.flush();
}

pub(crate) fn load_template(src: &ModelSource) -> Result<Option<ChatTemplate>> {
    if src.tokenizer_config.is_none() && src.chat_template.is_none() {
        return Ok(None);
    }
    ChatTemplate::from_config_texts(
        src.tokenizer_config.as_deref().unwrap_or("{}"),
        src.chat_template.as_deref(),
    )
    .map_err(|e| e.context(&src.label))
}

/// Uploads the weights with a progress bar on stderr when it is a terminal.
pub(crate) fn load_model(
    src: &ModelSource,
    gpu: Arc<Gpu>,
    budget: Option<&sparsa::model::Budget>,
) -> Result<(Model, f64)> {
    let bar = std::io::stderr().is_terminal().then(|| {
        let style = indicatif::ProgressStyle::with_template(
            "loading {msg} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} ({decimal_bytes_per_sec})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        let b = indicatif::ProgressBar::new(src.weights.total_bytes()).with_style(style);
        b.set_message(src.label.clone());
        b
    });
    let t0 = Instant::now();
    let _ctrl_c = interrupt::Loading::start(gpu.interrupt_flag());
    let model = Model::from_source_within(
        src,
        gpu,
        &mut |done, total| {
            if let Some(b) = &bar {
                b.set_length(total);
                b.set_position(done);
            }
        },
        budget,
    );
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok((model?, t0.elapsed().as_secs_f64()))
}

/// The context to allocate when --ctx is not given, and why: the model's
/// max_position_embeddings (the built-in model: its training length) when its caches in
/// `format` (auto: the smallest) and the scratch fit `room`, the bytes a session has once the
/// weights are placed ([`sparsa::model::session_room`]); else the longest context that fits
/// ([`sparsa::model::longest_ctx`]), `room_name` saying whose room it is. `sparsa info`
/// prints the same.
pub(crate) fn default_ctx(
    cfg: &sparsa::config::Config,
    builtin: bool,
    format: Option<CacheFormat>,
    room: u64,
    max_binding: u64,
    room_name: &str,
) -> (usize, String) {
    let (want, why) = if builtin && BUILTIN_CTX < cfg.max_position_embeddings {
        (BUILTIN_CTX, "the built-in model's training length")
    } else {
        (
            cfg.max_position_embeddings.max(1),
            "the model's max_position_embeddings",
        )
    };
    let format = format.unwrap_or(CacheFormat::SMALLEST);
    match sparsa::model::longest_ctx(cfg, format, room, max_binding, want) {
        // Nothing fits: opening the session says what is missing.
        0 => (
            want,
            format!("{why}; no context fits {room_name} after the weights"),
        ),
        n if n < want => (
            n,
            format!(
                "the longest whose {} caches fit {room_name} after the weights; {why} {want} does not",
                format.name()
            ),
        ),
        _ => (want, why.into()),
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

enum Read {
    Line(String),
    Interrupted,
    Eof,
}

enum Input {
    Editor(Box<rustyline::DefaultEditor>),
    Lines(std::io::Lines<std::io::StdinLock<'static>>),
}

impl Input {
    fn new(interactive: bool) -> Input {
        if interactive {
            match rustyline::DefaultEditor::new() {
                Ok(ed) => return Input::Editor(Box::new(ed)),
                Err(e) => log::warn!("line editing unavailable ({e}); reading plain lines"),
            }
        }
        Input::Lines(std::io::stdin().lock().lines())
    }

    fn read(&mut self) -> Result<Read> {
        match self {
            Input::Editor(ed) => match ed.readline(">>> ") {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        let _ = ed.add_history_entry(line.as_str());
                    }
                    Ok(Read::Line(line))
                }
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Read::Interrupted),
                Err(rustyline::error::ReadlineError::Eof) => Ok(Read::Eof),
                Err(e) => Err(Error::msg(format!("reading the terminal: {e}"))),
            },
            Input::Lines(lines) => match lines.next() {
                Some(Ok(line)) => Ok(Read::Line(line)),
                Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                    refuse("stdin: an input line is not UTF-8 text; skipped");
                    Ok(Read::Line(String::new()))
                }
                Some(Err(e)) => Err(Error::msg(format!("reading stdin: {e}"))),
                None => Ok(Read::Eof),
            },
        }
    }
}

struct Repl {
    a: ChatArgs,
    tok: Tokenizer,
    chat: Chat,
    session: Session,
    ctx: usize,
    sampler: Sampler,
    opts: ReplyOptions,
    ui: Ui,
    last: Option<TurnStats>,
    /// The sampler's seed, for /stats (the same seed and messages give the same replies).
    seed: u64,
}

pub fn run(a: ChatArgs) -> Result<()> {
    let params = a.s.params(1.1)?;
    let stops = a.s.stops()?;
    let mut src = open_source(&a.m)?;
    src.config.keep_mtp(a.s.draft > 0);
    if !src.has_tokenizer() {
        return Err(Error::msg(format!(
            "{}: no tokenizer.json (sparsa chat needs the model's tokenizer)",
            src.label
        )));
    }
    let tok = src.tokenizer()?;
    let template = load_template(&src)?;
    let mut format = ChatFormat::new(template);
    if a.think || a.no_think {
        let flag = if a.think { "--think" } else { "--no-think" };
        if !format.set_thinking(a.think) {
            note(&format!(
                "warning: {flag}: the chat template has no thinking switch (enable_thinking / thinking); ignored"
            ));
        }
    }
    let builtin = a.m.model.is_none();
    let gpu = super::open_gpu(&a.m)?;
    let (mut ctx, mut why) = match a.m.ctx {
        Some(c) => (c, "--ctx".to_string()),
        None => {
            let (room, name) = super::info::room_before_loading(&a.m, &src, &gpu)?;
            default_ctx(
                &src.config,
                builtin,
                a.m.cache_type.0,
                room,
                gpu.max_binding(),
                &name,
            )
        }
    };
    let (model, load_secs) = load_model(&src, gpu, super::budget(&a.m, &a.x, ctx).as_ref())?;
    if a.m.ctx.is_none() {
        // The estimate above counted the weights from their headers; what loading left is
        // what a session gets (Session::open refuses a context whose caches could never fit).
        let sizing = a.m.cache_type.0.unwrap_or(CacheFormat::SMALLEST);
        let fits = model.longest_ctx(sizing, ctx);
        if fits == 0 {
            return Err(Error::msg(format!(
                "the GPU memory left after loading the weights ({}) does not hold the scratch and the {} caches of one position; pass --gpu-memory SIZE to stream routed experts from the files",
                sparsa::model::plan::gib(model.session_room()),
                sizing.name()
            )));
        }
        if fits < ctx {
            log::info!("context {ctx} does not fit after loading; {fits} does");
            why = format!(
                "the longest whose {} caches fit the GPU memory left after loading",
                sizing.name()
            );
            ctx = fits;
        }
    }
    let mut session = super::open_session(&a.m, &model, ctx)?;
    session.set_drafts(a.s.draft)?;

    let ad = &model.gpu.adapter;
    let weights = src.weights.total_bytes();
    let cache = session.caches.format;
    let per_token = Caches::bytes_per_token(&model.config, cache);
    note(&format!(
        "{} | {} ({}, {}) | weights {:.1} MB loaded in {:.2} s ({:.0} MB/s) | ctx {ctx} ({why}) | caches {} ({:.1} KB/token): {:.1} MB now, {:.1} MB at {ctx} tokens | template: {}",
        src.label,
        ad.name,
        ad.backend,
        ad.device_type,
        mb(weights),
        load_secs,
        mb(weights) / load_secs.max(1e-9),
        cache.name(),
        per_token as f64 / 1e3,
        mb(session.caches.bytes()),
        mb(per_token.saturating_mul(ctx as u64)),
        format.template().origin(),
    ));
    // After the status line, whose "now" is the caches before the first prompt: the warm
    // chunks reserve the first rows, which the first prompt would.
    pollster::block_on(session.warm_decode(params.is_greedy() && !params.penalizes()))?;
    if let Some(off) = &model.offload {
        let p = &off.slots;
        note(&format!(
            "expert offloading: {} of {} routed experts on the GPU ({}), the rest streamed from the files; /stats shows the cache",
            p.resident_experts(),
            p.moe_layers() * p.n_experts,
            off.policy
        ));
    }
    let interactive = std::io::stdin().is_terminal();
    if format.is_plain() {
        note("note: the model has no chat template; using the plain fallback (\"User: ...\\n\\nAssistant:\")");
    }
    if interactive {
        if builtin {
            note("note: the built-in model is a 12M-parameter Shakespeare model: it answers like a character in a play (use --model DIR for a real chat model)");
        }
        note("Type a message; /help for commands, Ctrl-D or /exit to leave.");
    }
    // Interactive, Ctrl-C stops a reply (or is a key at the prompt); with piped input it
    // stops a reply being generated, and ends the program while waiting for a line.
    let _ctrl_c = interactive.then(interrupt::Polling::start);

    if a.s.verbose {
        note(&format!(
            "seed {} (repeat with --seed {})",
            params.seed, params.seed
        ));
    }
    let seed = params.seed;
    let sampler = Sampler::new(params);
    let opts = ReplyOptions {
        max_tokens: a.s.max_tokens_or(DEFAULT_MAX_TOKENS),
        eos: if a.s.ignore_eos {
            Vec::new()
        } else {
            model.config.eos_token_ids.clone()
        },
        stop: stops,
    };
    let ui = Ui {
        color: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        hide_think: a.hide_think,
        json: a.json,
    };
    JSON.store(a.json, Ordering::SeqCst);
    let chat = Chat::new(format, a.system.clone());
    let mut repl = Repl {
        a,
        tok,
        chat,
        session,
        ctx,
        sampler,
        opts,
        ui,
        last: None,
        seed,
    };
    let mut input = Input::new(interactive);
    loop {
        let line = match input.read()? {
            Read::Line(l) => l,
            // Ctrl-C at the prompt clears the line, as in a shell.
            Read::Interrupted => continue,
            Read::Eof => break,
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if let Some(cmd) = text.strip_prefix('/') {
            if !repl.command(cmd) {
                break;
            }
            continue;
        }
        repl.turn(text)?;
    }
    if !interactive && FAILED.load(Ordering::SeqCst) {
        // The error line of each refused message is already printed; a script piping
        // messages in learns from the status that not all were answered.
        let _ = std::io::stdout().flush();
        std::process::exit(1);
    }
    Ok(())
}

impl Repl {
    /// Runs an in-session command; false means leave.
    fn command(&mut self, cmd: &str) -> bool {
        let (name, arg) = match cmd.split_once(char::is_whitespace) {
            Some((n, r)) => (n, r.trim()),
            None => (cmd, ""),
        };
        match name {
            "exit" | "quit" | "bye" => return false,
            "help" | "?" => say(HELP),
            "reset" | "clear" => {
                self.chat.conversation.clear();
                note("conversation cleared (the system prompt stays)");
            }
            "system" if arg.is_empty() => match self.chat.conversation.system() {
                Some(s) => say(&format!("system prompt: {s}")),
                None => say("no system prompt (set one with /system TEXT)"),
            },
            "system" => {
                self.chat.conversation.set_system(Some(arg.to_string()));
                note("system prompt set");
            }
            "stats" => self.stats(arg == "-v"),
            "save" | "load" if arg.is_empty() => {
                note(&format!("error: /{name} needs a file name: /{name} FILE"))
            }
            "save" => match std::fs::write(arg, self.chat.conversation.to_json() + "\n") {
                Ok(()) => note(&format!(
                    "saved {} messages to {arg}",
                    self.chat.conversation.messages.len()
                )),
                Err(e) => note(&format!("error: /save {arg}: cannot write: {e}")),
            },
            "load" => match load_conversation(Path::new(arg)) {
                Ok(c) => {
                    let n = c.messages.len();
                    self.chat.conversation = c;
                    note(&format!("loaded {n} messages from {arg}"));
                }
                Err(e) => note(&format!("error: /load {arg}: {e}")),
            },
            _ => note(&format!("error: unknown command /{name} (type /help)")),
        }
        true
    }

    /// `/stats`: what a user reads; `verbose` adds the allocator and memory internals.
    fn stats(&self, verbose: bool) {
        match &self.last {
            Some(s) => say(&s.line(self.ctx)),
            None => say("no reply yet"),
        }
        let turns = self.chat.conversation.turns();
        say(&format!(
            "context {}/{} tokens in use, {turns} turn{} in the conversation | seed {}",
            self.session.pos,
            self.ctx,
            if turns == 1 { "" } else { "s" },
            self.seed
        ));
        if self.session.drafts() > 0 {
            say(&self.session.draft_stats().line());
        }
        let model = &self.session.model;
        if let Some(off) = &model.offload {
            let st = off.stats();
            if verbose {
                say(&st.line());
            } else {
                say(&format!(
                    "experts: {:.1} % of uses found on the GPU, {:.1} MiB uploaded per token",
                    100.0 * st.hit_rate(),
                    st.bytes_per_token() / (1u64 << 20) as f64
                ));
            }
        }
        if verbose {
            say(&model.gpu.stats().line());
            if let Some(kib) = host_rss_kib() {
                say(&format!("host RSS: {:.1} MiB", kib as f64 / 1024.0));
            }
        }
    }

    /// One user message and the streamed reply.
    fn turn(&mut self, text: &str) -> Result<()> {
        let reserve = reply_reserve(self.opts.max_tokens, self.ctx);
        let plan = match self.chat.prepare(&self.tok, text, self.ctx, reserve) {
            Ok(Prepared::Ready(p)) => p,
            Ok(Prepared::TooLong { tokens, room }) => {
                refuse(&format!(
                    "message too long: with it the prompt is {tokens} tokens, but --ctx {} leaves room for {room} (it keeps {reserve} for the reply); not sent",
                    self.ctx
                ));
                return Ok(());
            }
            Err(e) => {
                refuse(&e.to_string());
                return Ok(());
            }
        };
        if plan.dropped_turns > 0 {
            note(&format!(
                "note: context full: dropped the oldest {} turn{} to fit --ctx {} (the system prompt is kept)",
                plan.dropped_turns,
                if plan.dropped_turns == 1 { "" } else { "s" },
                self.ctx
            ));
        }
        let mut printer = Printer::new(&self.ui);
        interrupt::clear();
        let generating = interrupt::Polling::start();
        let t0 = Instant::now();
        let mut first: Option<Instant> = None;
        let result = self.chat.reply(
            &mut self.session,
            &self.tok,
            plan,
            &mut self.sampler,
            &self.opts,
            |e| {
                match e {
                    ChatEvent::Prefill { .. } => {}
                    ChatEvent::Token(_) => {
                        first.get_or_insert_with(Instant::now);
                    }
                    ChatEvent::Text(part, s) => printer.text(part, s),
                }
                !interrupt::requested()
            },
        );
        drop(generating);
        let end = Instant::now();
        let r = result?;
        printer.end();
        match r.end {
            ReplyEnd::Interrupted if r.message.is_none() => {
                note("note: interrupted before the reply started; the message was not kept")
            }
            ReplyEnd::Interrupted => note("note: interrupted; the reply so far is kept"),
            ReplyEnd::ContextFull => note(&format!(
                "note: the reply reached the end of the context (--ctx {}); the next turn drops the oldest turns",
                self.ctx
            )),
            ReplyEnd::MaxTokens if self.a.s.verbose => note(&format!(
                "note: reply cut at --max-tokens {}",
                self.opts.max_tokens
            )),
            _ => {}
        }
        let first = first.unwrap_or(end);
        let stats = TurnStats {
            prompt: r.prompt_tokens,
            prefilled: r.prefilled,
            reused: r.reused,
            generated: r.generated,
            ttft: (first - t0).as_secs_f64(),
            decode_secs: end.saturating_duration_since(first).as_secs_f64(),
            context: self.session.pos,
        };
        if self.ui.json {
            let finish = match r.end {
                ReplyEnd::Eos | ReplyEnd::StopString => "stop",
                ReplyEnd::MaxTokens | ReplyEnd::ContextFull => "length",
                ReplyEnd::Interrupted => "interrupted",
            };
            let m = r.message.as_ref();
            let mut j = serde_json::json!({
                "content": m.map_or("", |m| m.content.as_str()),
                "finish_reason": finish,
                "usage": {
                    "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.generated,
                    "cached_tokens": r.reused,
                },
            });
            if let Some(rc) = m.and_then(|m| m.reasoning_content.as_deref()) {
                j["reasoning_content"] = rc.into();
            }
            say(&j.to_string());
        }
        if self.a.s.verbose {
            let line = stats.line(self.ctx);
            if self.ui.color {
                note(&format!("{DIM}{line}{RESET}"));
            } else {
                note(&line);
            }
        }
        self.last = Some(stats);
        // A Ctrl-C that came after the reply ended must not stop the next one.
        interrupt::clear();
        Ok(())
    }
}

/// This process's resident set (VmRSS in /proc/self/status), where the system reports it.
fn host_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn load_conversation(path: &Path) -> Result<Conversation> {
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::msg(format!("cannot read: {e}")))?;
    Conversation::from_json(&text)
}
