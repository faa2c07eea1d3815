//! `sparsa serve`: the OpenAI-compatible HTTP server ([`sparsa::serve`]). This module loads
//! the model, opens one session per slot and hands them to the library's server.

use super::chat::{default_ctx, load_model, load_template};
use super::{interrupt, open_source, ExpertArgs, ModelArgs};
use clap::Args;
use sparsa::cache::{CacheFormat, Caches};
use sparsa::chat::ChatFormat;
use sparsa::{Error, Result};
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    m: ModelArgs,
    #[command(flatten)]
    x: ExpertArgs,
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/ requests (default: the SPARSA_API_KEY
    /// environment variable, else no key).
    #[arg(long)]
    api_key: Option<String>,
    /// Requests generated at the same time, each in a slot with its own caches of --ctx
    /// tokens (allocated at start, in one pool); their decode steps run as one batched step.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Requests that may wait for a free slot; beyond that the server answers 429.
    #[arg(long, default_value_t = 32)]
    queue: usize,
    /// The model id clients send (default: the model directory's name, or sparsa-bard-12m).
    #[arg(long)]
    model_id: Option<String>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_body: usize,
    /// Seconds running requests may take to finish after Ctrl-C or SIGTERM.
    #[arg(long, default_value_t = 10.0)]
    grace: f64,
    /// Ask the model to reason first by default (templates with an enable_thinking / thinking
    /// switch; a request's chat_template_kwargs override it).
    #[arg(long, conflicts_with = "no_think")]
    think: bool,
    /// Ask the model to answer without reasoning by default.
    #[arg(long)]
    no_think: bool,
    /// Speculative decoding in every slot: draft N tokens per step with the model's
    /// multi-token-prediction layer and verify them in one forward (0: off). Greedy replies
    /// are unchanged; sampled ones keep their distribution. docs/MTP.md says when it pays.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = super::sampling::parse_count)]
    draft: usize,
}

pub fn run(a: ServeArgs) -> Result<()> {
    if a.parallel == 0 {
        return Err(Error::msg("--parallel: expected at least 1"));
    }
    if !(a.grace.is_finite() && a.grace >= 0.0) {
        return Err(Error::msg("--grace: expected a number of seconds ≥ 0"));
    }
    let mut src = open_source(&a.m)?;
    // The MTP layer loads only to draft with.
    src.config.keep_mtp(a.draft > 0);
    if !src.has_tokenizer() {
        return Err(Error::msg(format!(
            "{}: no tokenizer.json (sparsa serve needs the model's tokenizer)",
            src.label
        )));
    }
    let tokenizer = src.tokenizer()?;
    let mut format = ChatFormat::new(load_template(&src)?);
    if (a.think || a.no_think) && !format.set_thinking(a.think) {
        eprintln!(
            "warning: the chat template has no thinking switch; --think / --no-think ignored"
        );
    }
    let builtin = a.m.model.is_none();
    let gpu = super::open_gpu(&a.m)?;
    // Without --ctx: the chat default, lowered so that every slot's caches fit the memory.
    let ctx = match a.m.ctx {
        Some(c) => c,
        None => {
            // The room one slot has: the room before loading shared by the slots.
            let (room, name) = super::info::room_before_loading(&a.m, &src, &gpu)?;
            let per_slot = room / a.parallel.max(1) as u64;
            let (ctx, _) = default_ctx(
                &src.config,
                builtin,
                a.m.cache_type(),
                per_slot,
                gpu.max_binding(),
                &name,
            );
            ctx
        }
    };
    // Under --gpu-memory the plan keeps room for every slot's caches.
    let budget = super::budget(&a.m, &a.x, ctx.saturating_mul(a.parallel));
    let (model, secs) = load_model(&src, gpu, budget.as_ref())?;
    // The caches grow with each conversation, so the slots' format is chosen up front for
    // all of them at their full context (--cache-type auto: the most precise that fits).
    let cache = a.m.cache_type().unwrap_or_else(|| {
        CacheFormat::auto(
            &model.config,
            ctx.saturating_mul(a.parallel),
            model.cache_room(ctx),
        )
    });
    // The slots' caches in one pool, allocated now, so that their decode steps run as one
    // batched step; else (a pool past one storage binding) each slot's own caches, growing
    // with its conversation, and steps one slot at a time.
    let pooled = if a.parallel > 1 {
        model.pooled_sessions(ctx, cache, a.parallel).map_err(|e| {
            e.context(format!(
                "the caches of --parallel {} slots of --ctx {ctx}",
                a.parallel
            ))
        })?
    } else {
        None
    };
    if pooled.is_none() && a.parallel > 1 {
        eprintln!(
            "note: {} slots × {ctx} tokens of caches exceed one storage binding ({} bytes): the slots decode one at a time, not batched (lower --ctx to batch them)",
            a.parallel,
            model.gpu.max_binding()
        );
    }
    let batched = pooled.is_some();
    let mut sessions = match pooled {
        Some(s) => s,
        None => (0..a.parallel)
            .map(|i| {
                let slot = if a.parallel > 1 {
                    model.slot_session(ctx, cache)
                } else {
                    model.session_in(ctx, cache)
                };
                slot.map_err(|e| {
                    e.context(format!(
                        "slot {} of --parallel {} (--ctx {ctx})",
                        i + 1,
                        a.parallel
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    for s in &mut sessions {
        s.set_drafts(a.draft)?;
    }
    // The slots share the device's pipelines: one warms them for all.
    if let Some(s) = sessions.first_mut() {
        // The server's slots run the host's rounds (src/serve/engine.rs).
        pollster::block_on(s.warm_decode(false))?;
    }
    let need = Caches::bytes_per_token(&model.config, cache)
        .saturating_mul(ctx as u64)
        .saturating_mul(a.parallel as u64);
    if need > model.cache_room(ctx) + sessions.iter().map(|s| s.caches.bytes()).sum::<u64>() {
        eprintln!(
            "warning: {} slots of {ctx} tokens in {} may not all fit in GPU memory when full; a request that outgrows it fails (lower --ctx or --parallel, or --cache-type fp8/i8)",
            a.parallel,
            cache.name()
        );
    }
    let model_id = a.model_id.clone().unwrap_or_else(|| match &a.m.model {
        Some(dir) => dir
            .canonicalize()
            .unwrap_or_else(|_| dir.clone())
            .file_name()
            .map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned()),
        None => "sparsa-bard-12m".to_string(),
    });
    let ad = &model.gpu.adapter;
    eprintln!(
        "{} as '{model_id}' | {} ({}) | loaded in {secs:.2} s | {} slots of {ctx} tokens{}, caches {} | template: {}",
        src.label,
        ad.name,
        ad.backend,
        a.parallel,
        if batched { " (batched)" } else { "" },
        cache.name(),
        format.template().origin()
    );
    let opts = sparsa::serve::Options {
        host: a.host.clone(),
        port: a.port,
        api_key: a
            .api_key
            .clone()
            .or_else(|| std::env::var("SPARSA_API_KEY").ok())
            .filter(|k| !k.is_empty()),
        queue: a.queue,
        model_id,
        max_body: a.max_body,
        grace: Duration::from_secs_f64(a.grace),
    };
    let served = sparsa::serve::Served {
        sessions,
        tokenizer,
        format,
        eos: model.config.eos_token_ids.clone(),
    };
    // Ctrl-C sets a flag that the server polls (a second one exits at once).
    let _ctrl_c = interrupt::Polling::start();
    sparsa::serve::serve(opts, served, Box::new(interrupt::requested), |addr| {
        eprintln!("listening on http://{addr}");
    })
}
