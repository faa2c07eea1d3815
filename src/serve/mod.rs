//! `sparsa serve`: an OpenAI-compatible HTTP server (`/v1/chat/completions`,
//! `/v1/completions`, `/v1/models`, `/health`) on tokio and axum.
//!
//! The GPU engine runs on one thread of its own (`engine.rs`) that owns the sessions, one per
//! slot (`--parallel`); the handlers render and tokenize the request, hand the engine a job
//! and stream what it sends back, as server-sent events or one JSON body. Concurrent requests
//! decode together, one batched step per token across the slots (see `engine.rs`).
//!
//! Errors have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400 for a
//! malformed or ill-typed body and unsupported values, 401 for a missing or wrong API key, 404
//! for an unknown model or route, 413 for a body over the limit, 429 when the queue is full,
//! 503 while shutting down.

pub mod api;
pub mod engine;

use crate::chat::{ChatFormat, Part};
use crate::error::{Error, Result};
use crate::generate::SamplingParams;
use crate::model::Session;
use crate::tokenizer::Tokenizer;
use api::{ApiError, ApiResult, Params, Prompt, ToolStyle};
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use engine::{Done, Job, Kind, Load, Out};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct Options {
    pub host: String,
    /// 0 picks a free port (printed when listening).
    pub port: u16,
    /// Requests to `/v1/…` must send `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Requests that may wait for a slot; beyond that (and the running ones) a 429.
    pub queue: usize,
    /// The model id clients name (`/v1/models`).
    pub model_id: String,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// How long running requests may finish after a shutdown signal.
    pub grace: Duration,
}

/// The model side: a session per slot, the tokenizer, the chat format, the eos ids.
pub struct Served {
    pub sessions: Vec<Session>,
    pub tokenizer: Tokenizer,
    pub format: ChatFormat,
    pub eos: Vec<u32>,
}

struct AppState {
    opts: Options,
    tok: Arc<Tokenizer>,
    format: ChatFormat,
    tools: ToolStyle,
    eos: Vec<u32>,
    ctx: usize,
    vocab: usize,
    slots: usize,
    jobs: std::sync::mpsc::Sender<Job>,
    load: Arc<Load>,
    created: u64,
}

type Shared = Arc<AppState>;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh id suffix (and a fresh seed): the standard library's randomly keyed hasher.
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Serves until `stop()` turns true (polled every 100 ms) or SIGTERM, then stops accepting,
/// gives running requests `grace` to finish and returns. `on_listen` gets the bound address,
/// once the engine has compiled the pipelines of its batched steps ([`engine::warm`]).
pub fn serve(
    opts: Options,
    mut served: Served,
    stop: Box<dyn Fn() -> bool + Send>,
    on_listen: impl FnOnce(SocketAddr),
) -> Result<()> {
    if served.sessions.is_empty() {
        return Err(Error::msg("--parallel must be at least 1"));
    }
    // Before listening: a request never waits on the pipelines of a batch width.
    engine::warm(&mut served.sessions)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::msg(format!("cannot start the async runtime: {e}")))?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind((
            opts.host.as_str(),
            opts.port,
        )))
        .map_err(|e| Error::msg(format!("cannot listen on {}:{}: {e}", opts.host, opts.port)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::msg(format!("cannot read the bound address: {e}")))?;
    let tok = Arc::new(served.tokenizer);
    let ctx = served.sessions[0].max_ctx();
    let vocab = served.sessions[0].model.config.vocab_size;
    let slots = served.sessions.len();
    let load = Arc::new(Load::default());
    let (jobs, rx) = std::sync::mpsc::channel::<Job>();
    let engine = {
        let (tok, load) = (tok.clone(), load.clone());
        let sessions = served.sessions;
        let eopts = engine::EngineOptions { grace: opts.grace };
        std::thread::Builder::new()
            .name("sparsa-engine".into())
            .spawn(move || engine::run(sessions, &tok, rx, load, eopts))
            .map_err(|e| Error::msg(format!("cannot start the engine thread: {e}")))?
    };
    let state = Arc::new(AppState {
        tools: ToolStyle::of_template(served.format.template().source()),
        format: served.format,
        opts: opts.clone(),
        tok,
        eos: served.eos,
        ctx,
        vocab,
        slots,
        jobs,
        load: load.clone(),
        created: now(),
    });
    let app = router(state);
    on_listen(addr);
    let drain = load.clone();
    let shutdown = async move {
        #[cfg(unix)]
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        loop {
            #[cfg(unix)]
            let termed = async {
                match term.as_mut() {
                    Some(t) => {
                        t.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            #[cfg(not(unix))]
            let termed = std::future::pending::<()>();
            tokio::select! {
                _ = termed => break,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {
                    if stop() { break; }
                }
            }
        }
        eprintln!(
            "sparsa serve: shutting down (no new requests; running ones get {:.0} s)",
            opts.grace.as_secs_f64()
        );
        drain.draining.store(true, Ordering::SeqCst);
    };
    // A connection that never finishes (a client stalled mid-request) must not hold the
    // shutdown up: past the grace period and a little more, the server stops regardless.
    let hard = {
        let (load, grace) = (load.clone(), opts.grace);
        async move {
            while !load.draining.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tokio::time::sleep(grace + Duration::from_secs(5)).await;
        }
    };
    let served = rt.block_on(async move {
        tokio::select! {
            r = axum::serve(listener, app).with_graceful_shutdown(shutdown) => r,
            _ = hard => {
                log::warn!("connections still open after the grace period; closing them");
                Ok(())
            }
        }
    });
    // Every task (and with them the job sender) goes: the engine ends once idle.
    rt.shutdown_timeout(Duration::from_secs(1));
    let _ = engine.join();
    served.map_err(|e| Error::msg(format!("server error: {e}")))
}

fn router(state: Shared) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/health", get(health))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.opts.max_body))
        .with_state(state)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        let mut r = (status, axum::Json(self.body())).into_response();
        if self.status == 401 {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        404,
        "invalid_request_error",
        format!("no route {} {}", req.method(), req.uri().path()),
    )
    .code("not_found")
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        405,
        "invalid_request_error",
        format!(
            "method {} is not allowed on {}",
            req.method(),
            req.uri().path()
        ),
    )
    .code("method_not_allowed")
}

/// Constant-time comparison of the bearer token with the key.
async fn auth(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.opts.api_key {
        let got = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let same = got.len() == key.len()
            && got
                .bytes()
                .zip(key.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return ApiError::new(
                401,
                "invalid_request_error",
                "missing or incorrect API key (send Authorization: Bearer KEY)",
            )
            .code("invalid_api_key")
            .into_response();
        }
    }
    next.run(req).await
}

async fn health(State(s): State<Shared>) -> Response {
    let draining = s.load.draining.load(Ordering::SeqCst);
    let jobs = s.load.jobs.load(Ordering::SeqCst);
    let busy = s.load.busy.load(Ordering::SeqCst);
    let mut body = json!({
        "status": if draining { "shutting_down" } else { "ok" },
        "model": s.opts.model_id,
        "slots": s.slots,
        "slots_busy": busy,
        "queued": jobs.saturating_sub(busy),
        "ctx": s.ctx,
    });
    // With --draft: the speculative rounds so far, all slots together.
    if let Some(d) = *crate::gpu::lock(&s.load.drafts) {
        body["drafts"] = json!({
            "rounds": d.rounds,
            "drafted": d.drafted,
            "accepted": d.accepted,
            "tokens_per_verification": d.mean_accepted_length(),
        });
    }
    let status = if draining {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (status, axum::Json(body)).into_response()
}

fn model_card(s: &AppState) -> Value {
    json!({"id": s.opts.model_id, "object": "model", "created": s.created, "owned_by": "sparsa",
           "max_model_len": s.ctx})
}

async fn models(State(s): State<Shared>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_card(&s)]})).into_response()
}

async fn model(
    State(s): State<Shared>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if id != s.opts.model_id {
        return unknown_model(&s, &id).into_response();
    }
    axum::Json(model_card(&s)).into_response()
}

fn unknown_model(s: &AppState, id: &str) -> ApiError {
    ApiError {
        param: Some("model".into()),
        ..ApiError::new(
            404,
            "invalid_request_error",
            format!(
                "the model '{id}' does not exist: this server serves '{}'",
                s.opts.model_id
            ),
        )
    }
    .code("model_not_found")
}

/// The body as JSON, with the extractor's own failures (size, reading) as OpenAI errors.
fn body_json(
    body: std::result::Result<Bytes, BytesRejection>,
) -> ApiResult<serde_json::Map<String, Value>> {
    let bytes = body.map_err(|e| {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                413,
                "invalid_request_error",
                "the request body is too large",
            )
            .code("request_too_large")
        } else {
            ApiError::new(
                status.as_u16(),
                "invalid_request_error",
                format!("cannot read the request body: {}", e.body_text()),
            )
        }
    })?;
    api::parse_body(&bytes)
}

fn check_model(s: &AppState, model: &Option<String>) -> ApiResult<()> {
    match model {
        Some(m) if m != &s.opts.model_id => Err(unknown_model(s, m)),
        _ => Ok(()),
    }
}

/// A place in the engine (running or waiting), taken before the prompt is rendered so that
/// a flood of requests costs no work beyond the 429.
impl Kind {
    /// The request field the prompt comes from, for errors.
    fn param(self) -> &'static str {
        match self {
            Kind::Text => "prompt",
            Kind::Chat { .. } => "messages",
        }
    }
}

fn admit(s: &AppState) -> ApiResult<engine::Ticket> {
    s.load.admit(s.slots + s.opts.queue).ok_or_else(|| {
        ApiError::new(
            429,
            "rate_limit_exceeded",
            format!(
                "the server is busy: {} requests are running and {} waiting; retry later",
                s.slots, s.opts.queue
            ),
        )
        .code("rate_limit_exceeded")
    })
}

fn check_open(s: &AppState) -> ApiResult<()> {
    if s.load.draining.load(Ordering::SeqCst) {
        return Err(
            ApiError::new(503, "server_error", "the server is shutting down").code("unavailable"),
        );
    }
    Ok(())
}

/// A job for `prompt`, queued in the engine; the receiver of its output.
fn submit(
    s: &AppState,
    ticket: engine::Ticket,
    prompt: Vec<u32>,
    p: &Params,
    kind: Kind,
) -> ApiResult<mpsc::UnboundedReceiver<Out>> {
    if prompt.is_empty() {
        return Err(
            ApiError::invalid(kind.param(), "the prompt has no tokens").code("invalid_value")
        );
    }
    let vocab = s.vocab;
    if let Some(t) = prompt.iter().find(|t| **t as usize >= vocab) {
        return Err(ApiError::invalid(
            kind.param(),
            format!("token id {t} is out of range (the vocabulary has {vocab})"),
        )
        .code("invalid_value"));
    }
    if prompt.len() >= s.ctx {
        return Err(ApiError::invalid(
            kind.param(),
            format!(
                "the prompt is {} tokens; this server's context is {} tokens (room for the prompt and at least one generated token is needed)",
                prompt.len(),
                s.ctx
            ),
        )
        .code("context_length_exceeded"));
    }
    let room = s.ctx - prompt.len();
    let params = SamplingParams {
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k,
        seed: p.seed.unwrap_or_else(random),
        repeat_penalty: 1.0,
        // OpenAI's penalties count the whole reply; the engine passes only generated tokens.
        repeat_last_n: s.ctx,
        min_p: p.min_p,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        prompt,
        params,
        max_tokens: p.max_tokens.unwrap_or(usize::MAX).min(room),
        stops: p.stop.clone(),
        eos: if p.ignore_eos {
            Vec::new()
        } else {
            s.eos.clone()
        },
        kind,
        tx,
        _ticket: ticket,
    };
    s.jobs.send(job).map_err(|_| {
        ApiError::new(503, "server_error", "the engine has stopped").code("unavailable")
    })?;
    Ok(rx)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|_| {
        Err(ApiError::new(
            500,
            "server_error",
            "internal error while preparing the prompt",
        ))
    })
}

async fn chat(
    State(s): State<Shared>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    match chat_inner(s, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn chat_inner(
    s: Shared,
    body: std::result::Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    check_open(&s)?;
    let body = body_json(body)?;
    let req = api::chat_request(&body, s.tools)?;
    check_model(&s, &req.model)?;
    let ticket = admit(&s)?;
    let st = s.clone();
    let (messages, extra) = (req.messages, req.extra);
    let (prompt, in_reasoning) = blocking(move || {
        let text = st.format.render_json(&messages, &extra).map_err(|e| {
            ApiError::invalid("messages", format!("cannot apply the chat template: {e}"))
        })?;
        let ids = st
            .format
            .encode(&st.tok, &text)
            .map_err(|e| ApiError::invalid("messages", e.0))?;
        Ok((ids, text.trim_end().ends_with("<think>")))
    })
    .await?;
    let rx = submit(&s, ticket, prompt, &req.params, Kind::Chat { in_reasoning })?;
    let tools = if req.tools { s.tools } else { ToolStyle::None };
    let id = format!("chatcmpl-{:016x}", random());
    let reply = Reply {
        s: s.clone(),
        id,
        created: now(),
        chat: true,
        tools,
        include_usage: req.params.include_usage,
    };
    Ok(if req.params.stream {
        reply.stream(rx, String::new())
    } else {
        reply.collect(rx, String::new()).await
    })
}

async fn completions(
    State(s): State<Shared>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    match completions_inner(s, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn completions_inner(
    s: Shared,
    body: std::result::Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    check_open(&s)?;
    let body = body_json(body)?;
    let req = api::completion_request(&body)?;
    check_model(&s, &req.model)?;
    let ticket = admit(&s)?;
    let st = s.clone();
    let echo = req.echo;
    let (prompt, echoed) = blocking(move || {
        let (ids, text) = match req.prompt {
            Prompt::Text(t) => (
                st.tok
                    .encode(&t)
                    .map_err(|e| ApiError::invalid("prompt", e.0))?,
                t,
            ),
            Prompt::Tokens(ids) => {
                let text = if echo {
                    st.tok.decode(&ids).unwrap_or_default()
                } else {
                    String::new()
                };
                (ids, text)
            }
        };
        Ok((ids, if echo { text } else { String::new() }))
    })
    .await?;
    let rx = submit(&s, ticket, prompt, &req.params, Kind::Text)?;
    let reply = Reply {
        s: s.clone(),
        id: format!("cmpl-{:016x}", random()),
        created: now(),
        chat: false,
        tools: ToolStyle::None,
        include_usage: req.params.include_usage,
    };
    Ok(if req.params.stream {
        reply.stream(rx, echoed)
    } else {
        reply.collect(rx, echoed).await
    })
}

/// Holds back content from the start of a tool call on, to return it as `tool_calls`.
struct ToolSplit {
    style: ToolStyle,
    held: String,
    inside: bool,
}

impl ToolSplit {
    /// The content safe to show now.
    fn push(&mut self, text: &str) -> String {
        let Some(open) = self.style.opener() else {
            return text.to_string();
        };
        if self.inside {
            self.held.push_str(text);
            return String::new();
        }
        self.held.push_str(text);
        if let Some(at) = self.held.find(open) {
            let out = self.held[..at].to_string();
            self.held.drain(..at);
            self.inside = true;
            return out;
        }
        let keep = crate::generate::partial_suffix(&self.held, &[open]);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        out
    }

    /// At the end: the tool calls, or the held text as content when it does not parse.
    fn finish(&mut self) -> (Vec<api::ToolCall>, String) {
        let held = std::mem::take(&mut self.held);
        if self.inside {
            if let Some(calls) = self.style.parse(&held) {
                return (calls, String::new());
            }
        }
        (Vec::new(), held)
    }
}

fn tool_calls_json(calls: &[api::ToolCall], with_index: bool) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = json!({
                    "id": format!("call_{:016x}", random()),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                });
                if with_index {
                    v["index"] = json!(i);
                }
                v
            })
            .collect(),
    )
}

fn usage(d: &Done) -> Value {
    json!({
        "prompt_tokens": d.prompt_tokens,
        "completion_tokens": d.completion_tokens,
        "total_tokens": d.prompt_tokens + d.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": d.cached_tokens},
    })
}

fn engine_error(msg: String) -> ApiError {
    if msg.contains("shutting down") || msg.contains("shut down") {
        return ApiError::new(503, "server_error", msg).code("unavailable");
    }
    ApiError::new(500, "server_error", msg)
}

/// Turns the engine's output into OpenAI's response shapes.
struct Reply {
    s: Shared,
    id: String,
    created: u64,
    chat: bool,
    tools: ToolStyle,
    include_usage: bool,
}

impl Reply {
    fn finish_reason(&self, d: &Done, calls: bool) -> &'static str {
        if calls {
            "tool_calls"
        } else if d.length {
            "length"
        } else {
            "stop"
        }
    }

    async fn collect(self, mut rx: mpsc::UnboundedReceiver<Out>, echo: String) -> Response {
        let (mut content, mut reasoning) = (echo, String::new());
        let mut saw_reasoning = false;
        let done = loop {
            match rx.recv().await {
                Some(Out::Text(Part::Content, t)) => content.push_str(&t),
                Some(Out::Text(Part::Reasoning, t)) => {
                    saw_reasoning = true;
                    reasoning.push_str(&t)
                }
                Some(Out::Done(d)) => break d,
                Some(Out::Error(e)) => return engine_error(e).into_response(),
                None => {
                    return engine_error("the engine dropped the request".into()).into_response()
                }
            }
        };
        let model = &self.s.opts.model_id;
        if !self.chat {
            let body = json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": model,
                "choices": [{"index": 0, "text": content, "logprobs": null,
                             "finish_reason": self.finish_reason(&done, false)}],
                "usage": usage(&done),
            });
            return axum::Json(body).into_response();
        }
        let mut split = ToolSplit {
            style: self.tools,
            held: String::new(),
            inside: false,
        };
        let mut shown = split.push(&content);
        let (calls, rest) = split.finish();
        shown.push_str(&rest);
        let mut message = json!({"role": "assistant", "content": shown.trim()});
        if saw_reasoning {
            message["reasoning_content"] = json!(reasoning.trim());
        }
        if !calls.is_empty() {
            message["tool_calls"] = tool_calls_json(&calls, false);
            if shown.trim().is_empty() {
                message["content"] = Value::Null;
            }
        }
        let body = json!({
            "id": self.id, "object": "chat.completion", "created": self.created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": null,
                         "finish_reason": self.finish_reason(&done, !calls.is_empty())}],
            "usage": usage(&done),
        });
        axum::Json(body).into_response()
    }

    fn chunk(&self, delta: Value, finish: Option<&str>) -> String {
        let model = &self.s.opts.model_id;
        let v = if self.chat {
            json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                   "model": model,
                   "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
        } else {
            json!({"id": self.id, "object": "text_completion", "created": self.created,
                   "model": model,
                   "choices": [{"index": 0, "text": delta, "logprobs": null, "finish_reason": finish}]})
        };
        format!("data: {v}\n\n")
    }

    /// Server-sent events: a chunk per piece of text, the finish reason, usage when asked,
    /// then `data: [DONE]`. When the client goes away the writer stops and the request is
    /// cancelled.
    fn stream(self, mut rx: mpsc::UnboundedReceiver<Out>, echo: String) -> Response {
        let (tx, body_rx) =
            mpsc::channel::<std::result::Result<Bytes, std::convert::Infallible>>(64);
        tokio::spawn(async move {
            let send = |s: String| {
                let tx = tx.clone();
                async move { tx.send(Ok(Bytes::from(s))).await.is_ok() }
            };
            let mut split = ToolSplit {
                style: self.tools,
                held: String::new(),
                inside: false,
            };
            let first = if self.chat {
                self.chunk(json!({"role": "assistant", "content": ""}), None)
            } else if !echo.is_empty() {
                self.chunk(json!(echo), None)
            } else {
                String::new()
            };
            if !first.is_empty() && !send(first).await {
                return;
            }
            loop {
                let out = tokio::select! {
                    o = rx.recv() => o,
                    _ = tx.closed() => return,
                };
                let text = match out {
                    Some(Out::Text(part, t)) => {
                        let delta = match (self.chat, part) {
                            (false, _) => json!(t),
                            (true, Part::Reasoning) => json!({"reasoning_content": t}),
                            (true, Part::Content) => {
                                let shown = split.push(&t);
                                if shown.is_empty() {
                                    continue;
                                }
                                json!({"content": shown})
                            }
                        };
                        self.chunk(delta, None)
                    }
                    Some(Out::Done(d)) => {
                        let mut s = String::new();
                        let (calls, rest) = split.finish();
                        if !rest.is_empty() {
                            s.push_str(&self.chunk(json!({"content": rest}), None));
                        }
                        if !calls.is_empty() {
                            s.push_str(
                                &self.chunk(
                                    json!({"tool_calls": tool_calls_json(&calls, true)}),
                                    None,
                                ),
                            );
                        }
                        let empty = if self.chat { json!({}) } else { json!("") };
                        s.push_str(
                            &self.chunk(empty, Some(self.finish_reason(&d, !calls.is_empty()))),
                        );
                        if self.include_usage {
                            let model = &self.s.opts.model_id;
                            let object = if self.chat {
                                "chat.completion.chunk"
                            } else {
                                "text_completion"
                            };
                            let v = json!({"id": self.id, "object": object, "created": self.created,
                                           "model": model, "choices": [], "usage": usage(&d)});
                            s.push_str(&format!("data: {v}\n\n"));
                        }
                        s.push_str("data: [DONE]\n\n");
                        let _ = send(s).await;
                        return;
                    }
                    Some(Out::Error(e)) => {
                        let body = engine_error(e).body();
                        let _ = send(format!("data: {body}\n\ndata: [DONE]\n\n")).await;
                        return;
                    }
                    None => {
                        let body = engine_error("the engine dropped the request".into()).body();
                        let _ = send(format!("data: {body}\n\ndata: [DONE]\n\n")).await;
                        return;
                    }
                };
                if !send(text).await {
                    return;
                }
            }
        });
        let stream = futures_util::stream::unfold(body_rx, |mut rx| async move {
            rx.recv().await.map(|x| (x, rx))
        });
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        (headers, Body::from_stream(stream)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_markup_is_held_back_and_parsed() {
        let mut t = ToolSplit {
            style: ToolStyle::Glm,
            held: String::new(),
            inside: false,
        };
        let mut shown = String::new();
        for piece in [
            "Let me look.",
            "<tool",
            "_call>get_weather<arg_key>city</arg_key>",
            "<arg_value>Oslo</arg_value></tool_call>",
        ] {
            shown.push_str(&t.push(piece));
        }
        let (calls, rest) = t.finish();
        assert_eq!(shown, "Let me look.");
        assert_eq!(rest, "");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
        // "<to" that is not a tool call comes out at the end; broken markup is content.
        let mut t = ToolSplit {
            style: ToolStyle::Glm,
            held: String::new(),
            inside: false,
        };
        assert_eq!(t.push("a <to"), "a ");
        assert_eq!(t.finish(), (Vec::new(), "<to".to_string()));
        let mut t = ToolSplit {
            style: ToolStyle::Glm,
            held: String::new(),
            inside: false,
        };
        assert_eq!(t.push("x<tool_call>oops"), "x");
        assert_eq!(t.finish(), (Vec::new(), "<tool_call>oops".to_string()));
    }
}
