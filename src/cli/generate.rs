//! `sparsa generate`: a prompt (flag, file or stdin) continued as text or token ids, streamed.

use super::sampling::{MaxTokens, SamplingArgs};
use super::{
    ctx_for, interrupt, open_model, open_session, open_source, parse_ids, ExpertArgs, Ids,
    ModelArgs,
};
use clap::Args;
use sparsa::generate::{generate_events, Event, Sampler, Stop, StopStrings};
use sparsa::tokenizer::TextStream;
use sparsa::{Error, Result};
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::Instant;

/// What `sparsa generate` writes from when given no prompt, no --model and no piped stdin.
const DEFAULT_PROMPT: &str = "KING RICHARD:";

/// Tokens written when --max-tokens is not given.
const DEFAULT_MAX_TOKENS: usize = 128;

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    m: ModelArgs,
    #[command(flatten)]
    x: ExpertArgs,
    /// Prompt text (needs tokenizer.json in the model directory). Without --prompt, --file or
    /// --tokens the prompt is read from stdin when it is piped; with the built-in model and a
    /// terminal, it is "KING RICHARD:".
    #[arg(short, long, conflicts_with_all = ["tokens", "file"])]
    prompt: Option<std::ffi::OsString>,
    /// Read the prompt text from this file ("-" for stdin), as it is (newlines included).
    #[arg(short, long, value_name = "PATH", conflicts_with = "tokens")]
    file: Option<PathBuf>,
    /// Prompt as comma-separated token ids, e.g. 1,2,3.
    #[arg(long, value_parser = parse_ids)]
    tokens: Option<Ids>,
    #[command(flatten)]
    s: SamplingArgs,
    /// Print the generated ids, comma-separated, on one line (instead of text).
    #[arg(long)]
    print_ids: bool,
    /// Print only the continuation, not the prompt text before it.
    #[arg(long)]
    no_echo: bool,
}

/// The prompt: token ids (--tokens), or text and where it came from (for error messages).
enum Prompt<'a> {
    Ids(&'a [u32]),
    Text(String, &'static str),
}

fn read_prompt(a: &GenerateArgs, builtin: bool) -> Result<Prompt<'_>> {
    let stdin_text = || -> Result<String> {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|e| Error::msg(format!("reading the prompt from stdin: {e}")))?;
        String::from_utf8(buf).map_err(|_| Error::msg("stdin: the prompt is not UTF-8 text"))
    };
    if let Some(p) = &a.prompt {
        let text = p
            .to_str()
            .ok_or_else(|| Error::msg("--prompt: not UTF-8 text"))?;
        return Ok(Prompt::Text(text.to_string(), "--prompt"));
    }
    if let Some(path) = &a.file {
        if path.as_os_str() == "-" {
            return Ok(Prompt::Text(stdin_text()?, "--file -"));
        }
        let bytes = std::fs::read(path)
            .map_err(|e| Error::msg(format!("--file {}: cannot read: {e}", path.display())))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::msg(format!("--file {}: not UTF-8 text", path.display())))?;
        return Ok(Prompt::Text(text, "--file"));
    }
    if let Some(ids) = &a.tokens {
        return Ok(Prompt::Ids(&ids.0));
    }
    if !std::io::stdin().is_terminal() {
        // Empty stdin (/dev/null, a closed pipe) is no prompt, as with a terminal.
        let text = stdin_text()?;
        if !text.is_empty() {
            return Ok(Prompt::Text(text, "stdin"));
        }
    }
    if builtin {
        return Ok(Prompt::Text(
            DEFAULT_PROMPT.to_string(),
            "the default prompt",
        ));
    }
    Err(Error::msg(
        "give a prompt with --prompt TEXT, --file PATH, --tokens 1,2,3 or on stdin",
    ))
}

/// Writes to stdout; false once the reader has gone (a closed pipe), so generation stops.
fn emit(text: &str) -> bool {
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes()).and_then(|_| o.flush()).is_ok()
}

pub fn run(a: GenerateArgs) -> Result<()> {
    let params = a.s.params(1.0)?;
    let stops = a.s.stops()?;
    let max_tokens = a.s.max_tokens_or(DEFAULT_MAX_TOKENS);
    let input = read_prompt(&a, a.m.model.is_none())?;
    // The prompt text and where it came from; none for --tokens.
    let text = match &input {
        Prompt::Text(t, from) => Some((t.as_str(), *from)),
        Prompt::Ids(_) => None,
    };
    if let Some((t, from)) = text {
        if t.is_empty() {
            return Err(Error::msg(format!("{from}: the prompt is empty")));
        }
    }
    // The prompt is tokenized before the model loads, so a missing tokenizer fails fast.
    let mut src = open_source(&a.m)?;
    src.config.keep_mtp(a.s.draft > 0);
    let (tok, prompt) = match &input {
        Prompt::Text(t, _) => {
            let tk = src.tokenizer()?;
            let ids = tk.encode(t)?;
            (Some(tk), ids)
        }
        Prompt::Ids(ids) => (src.tokenizer().ok(), ids.to_vec()),
    };
    if prompt.is_empty() {
        let from = text.map_or("--tokens", |t| t.1);
        return Err(Error::msg(format!(
            "{from}: the prompt is empty after tokenization"
        )));
    }
    if (!stops.is_empty()) && (tok.is_none() || a.print_ids) {
        return Err(Error::msg(
            "--stop: needs text output (a tokenizer.json, and no --print-ids)",
        ));
    }
    // With no limit, the context decides: --ctx or the model's maximum.
    let unlimited = a.s.max_tokens == Some(MaxTokens::Unlimited);
    let need = prompt
        .len()
        .saturating_add(if unlimited { 1 } else { max_tokens });
    let ctx = ctx_for(&a.m, &src.config, need, unlimited)?;
    let model = open_model(&a.m, &a.x, &src, ctx)?;
    let mut session = open_session(&a.m, &model, ctx)?;
    session.set_drafts(a.s.draft)?;
    pollster::block_on(session.warm_decode(params.is_greedy() && !params.penalizes()))?;
    if a.s.verbose {
        eprintln!("seed {} (repeat with --seed {})", params.seed, params.seed);
    }
    let mut sampler = Sampler::new(params);
    let eos = if a.s.ignore_eos {
        Vec::new()
    } else {
        model.config.eos_token_ids.clone()
    };
    let mut stream = match (&tok, a.print_ids) {
        (Some(t), false) => Some(TextStream::after(t, &prompt)?),
        _ => None,
    };
    let mut stop_strings = StopStrings::new(stops);
    // The prompt text goes first, so the output reads as one text (not for --tokens).
    if let (Some(_), Some((t, _)), false) = (&stream, text, a.no_echo) {
        if !emit(t) {
            return Ok(());
        }
    }
    let t0 = Instant::now();
    let host0 = model.gpu.host_times();
    let mut first: Option<Instant> = None;
    let mut err: Option<Error> = None;
    let mut gone = false;
    let ctrl_c = interrupt::Polling::start();
    let (out, stop) = generate_events(
        &mut session,
        &[],
        &prompt,
        max_tokens,
        &mut sampler,
        &eos,
        |event| {
            if interrupt::requested() {
                return false;
            }
            let Event::Token(id) = event else {
                return true;
            };
            first.get_or_insert_with(Instant::now);
            let shown = match stream.as_mut() {
                Some(_) if eos.contains(&id) => return true,
                Some(s) => match s.push(id) {
                    Ok(piece) => stop_strings.push(&piece),
                    Err(e) => {
                        err = Some(e);
                        return false;
                    }
                },
                None if a.print_ids => return true,
                None => format!("{id} "),
            };
            gone = !emit(&shown);
            !gone && !stop_strings.hit()
        },
    )?;
    drop(ctrl_c);
    if gone {
        return Ok(());
    }
    if let Some(e) = err {
        return Err(e);
    }
    if !stop_strings.hit() && !emit(&stop_strings.finish()) {
        return Ok(());
    }
    if interrupt::requested() {
        emit("\n");
        return Err(Error::msg(format!(
            "interrupted after {} generated token{}",
            out.len(),
            if out.len() == 1 { "" } else { "s" }
        )));
    }
    let line = if a.print_ids {
        let ids: Vec<String> = out.iter().map(|x| x.to_string()).collect();
        ids.join(",") + "\n"
    } else {
        "\n".to_string()
    };
    if !emit(&line) {
        return Ok(());
    }
    let total = t0.elapsed().as_secs_f64();
    let ttft = first.map(|f| (f - t0).as_secs_f64()).unwrap_or(total);
    let decode = out.len().saturating_sub(1) as f64 / (total - ttft).max(1e-9);
    if stop == Stop::ContextFull {
        eprintln!("note: stopped at the context limit ({ctx} tokens)");
    }
    let stats = format!(
        "{} prompt tokens, prefill {:.1} tok/s (first token {:.3} s), {} generated, decode {:.2} tok/s",
        prompt.len(),
        prompt.len() as f64 / ttft.max(1e-9),
        ttft,
        out.len(),
        decode
    );
    if a.s.verbose {
        eprintln!("{stats}");
        if let Some(off) = &model.offload {
            eprintln!("{}", off.stats().line());
        }
    } else {
        log::info!("{stats}");
    }
    if session.drafts() > 0 {
        eprintln!("{}", session.draft_stats().line());
    }
    if a.s.verbose {
        // Per speculative round, or per token.
        let (n, per) = match session.draft_stats().rounds {
            0 => (out.len() as u64, "token"),
            r => (r, "round"),
        };
        let host = model.gpu.host_times().since(&host0, n);
        eprintln!("per {per}: {}", host.line());
    }
    Ok(())
}
