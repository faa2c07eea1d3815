//! sparsa in the browser: the `sparsa` library (same forward pass, same WGSL kernels) on
//! WebGPU, driven from `www/app.js`.
//!
//! The page opens the GPU ([`open`]), hands the model's files over one by one
//! ([`Engine::add_file`]), loads them ([`Engine::load_model`]), then either completes a text
//! ([`Engine::complete`]) or chats with the model's template ([`Engine::chat`]). Generation is
//! async: each token's logits are read back with `mapAsync`, and between tokens the page's
//! event loop runs, so the tokens stream into the page as they come.
//!
//! Every error comes back to JavaScript as an `Error` whose message is shown on the page.

use sparsa::chat::{
    reply_reserve, Chat, ChatEvent, ChatFormat, ChatTemplate, Part, Prepared, ReplyEnd,
    ReplyOptions,
};
use sparsa::generate::{generate_events_async, Event, Sampler, SamplingParams, Stop};
use sparsa::gpu::{Gpu, LimitsRequest};
use sparsa::model::{Model, ModelSource, Session};
use sparsa::tokenizer::{TextStream, Tokenizer};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use wasm_bindgen::prelude::*;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(s: &str);
    #[wasm_bindgen(js_namespace = console, js_name = warn)]
    fn console_warn(s: &str);
    #[wasm_bindgen(js_namespace = console, js_name = log)]
    fn console_log(s: &str);
}

/// The library's `log` records, on the browser console.
struct ConsoleLog;

impl log::Log for ConsoleLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let line = format!("sparsa {}: {}", r.level(), r.args());
        match r.level() {
            log::Level::Error => console_error(&line),
            log::Level::Warn => console_warn(&line),
            _ => console_log(&line),
        }
    }
    fn flush(&self) {}
}

static LOGGER: ConsoleLog = ConsoleLog;

#[wasm_bindgen(start)]
fn start() {
    // A panic is a bug: say where on the console (the page shows the failed call's error).
    std::panic::set_hook(Box::new(|info| {
        console_error(&format!("sparsa panicked: {info}"))
    }));
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}

fn js_err(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

/// Open the browser's WebGPU adapter. `default_limits`: ask for WebGPU's default limits
/// only (what every adapter supports) instead of everything the adapter offers.
#[wasm_bindgen]
pub async fn open(default_limits: bool) -> Result<Engine, JsError> {
    let request = if default_limits {
        LimitsRequest::WebGpuDefault
    } else {
        LimitsRequest::Adapter
    };
    let gpu = Gpu::open(None, request).await.map_err(js_err)?;
    Ok(Engine {
        gpu: Arc::new(gpu),
        files: Vec::new(),
        state: Rc::new(RefCell::new(None)),
    })
}

/// What a loaded model needs between calls ([`Engine::destroy`] frees its GPU memory).
struct Loaded {
    model: Model,
    tokenizer: Rc<Tokenizer>,
    chat: Chat,
    /// The chat's session (its caches hold the conversation), created on the first message.
    session: Option<Session>,
    /// Positions the chat session holds.
    chat_ctx: usize,
    busy: bool,
}

/// The GPU, and the model once loaded.
#[wasm_bindgen]
pub struct Engine {
    gpu: Arc<Gpu>,
    files: Vec<(String, Vec<u8>)>,
    state: Rc<RefCell<Option<Loaded>>>,
}

/// The built-in model's training length: the chat context when the model allows more.
const CHAT_CTX: usize = 1024;

#[wasm_bindgen]
impl Engine {
    /// The adapter and the limits the device was opened with, as JSON.
    pub fn adapter(&self) -> String {
        let a = &self.gpu.adapter;
        let l = &self.gpu.limits;
        serde_json::json!({
            "name": a.name,
            "backend": a.backend,
            "device_type": a.device_type,
            "driver": a.driver,
            "summary": a.line(),
            "adapter": {
                "max_storage_buffer_binding_size": a.max_storage_binding,
                "max_buffer_size": a.max_buffer,
                "max_compute_invocations_per_workgroup": a.max_invocations,
                "max_storage_buffers_per_shader_stage": a.max_storage_buffers_per_stage,
                "max_compute_workgroup_storage_size": a.max_workgroup_storage,
                "shader_f16": a.shader_f16,
                "subgroups": a.subgroups,
                "timestamps": a.timestamps,
            },
            "device": {
                "max_storage_buffer_binding_size": l.max_storage_buffer_binding_size,
                "max_buffer_size": l.max_buffer_size,
                "max_compute_invocations_per_workgroup": l.max_compute_invocations_per_workgroup,
                "max_storage_buffers_per_shader_stage": l.max_storage_buffers_per_shader_stage,
                "max_compute_workgroup_storage_size": l.max_compute_workgroup_storage_size,
                "max_compute_workgroups_per_dimension": l.max_compute_workgroups_per_dimension,
            },
        })
        .to_string()
    }

    /// Hand over one file of the model directory (`config.json`, `tokenizer.json`,
    /// `*.safetensors`, ...), by its name in the directory.
    pub fn add_file(&mut self, name: &str, bytes: Vec<u8>) {
        let base = name.rsplit('/').next().unwrap_or(name).to_string();
        self.files.retain(|(n, _)| *n != base);
        self.files.push((base, bytes));
    }

    /// Load the files handed over onto the GPU (they are dropped afterwards). Returns the
    /// model's description as JSON.
    pub fn load_model(&mut self, label: &str) -> Result<String, JsError> {
        if self.state.borrow().is_some() {
            return Err(js_err(
                "a model is already loaded: open a new engine for another one",
            ));
        }
        let files = std::mem::take(&mut self.files);
        let mut src = ModelSource::from_memory(label, files).map_err(js_err)?;
        // The page does not draft: its MTP layer stays in the file.
        src.config.keep_mtp(false);
        if !src.has_tokenizer() {
            return Err(js_err(format!(
                "{label}: no tokenizer.json (the page needs the model's tokenizer)"
            )));
        }
        let tokenizer = src.tokenizer().map_err(js_err)?;
        let template = if src.tokenizer_config.is_none() && src.chat_template.is_none() {
            None
        } else {
            ChatTemplate::from_config_texts(
                src.tokenizer_config.as_deref().unwrap_or("{}"),
                src.chat_template.as_deref(),
            )
            .map_err(|e| js_err(e.context(label)))?
        };
        let format = ChatFormat::new(template);
        let model = Model::from_source(&src, self.gpu.clone(), &mut |_, _| {}).map_err(js_err)?;
        let cfg = &model.config;
        let chat_ctx = cfg
            .max_position_embeddings
            .clamp(1, CHAT_CTX)
            .min(sparsa::cache::Caches::max_ctx_for(
                cfg,
                sparsa::cache::CacheFormat::SMALLEST,
                self.gpu.limits.max_buffer_size,
            ))
            .max(1);
        let info = serde_json::json!({
            "label": label,
            "model_type": cfg.family.model_type(),
            "layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size,
            "vocab_size": cfg.vocab_size,
            "index_topk": cfg.index_topk,
            "max_position_embeddings": cfg.max_position_embeddings,
            "weight_bytes": src.weights.total_bytes(),
            "chat_ctx": chat_ctx,
            "template": format.template().origin(),
            "plain_template": format.is_plain(),
            "eos": cfg.eos_token_ids,
        })
        .to_string();
        drop(src);
        *self.state.borrow_mut() = Some(Loaded {
            model,
            tokenizer: Rc::new(tokenizer),
            chat: Chat::new(format, None),
            session: None,
            chat_ctx,
            busy: false,
        });
        Ok(info)
    }

    /// Token ids of `text` (with the tokenizer's special tokens, as `sparsa generate` encodes
    /// a prompt).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, JsError> {
        let st = self.state.borrow();
        let l = st.as_ref().ok_or_else(|| js_err("no model loaded"))?;
        l.tokenizer.encode(text).map_err(js_err)
    }

    /// Complete `prompt` as `sparsa generate --prompt` does (a fresh context of prompt +
    /// `max_tokens` positions). `options`: `{max_tokens, temperature, top_p, top_k, seed,
    /// repeat_penalty, repeat_last_n}`. `on_event(kind, a, b)` sees `("prefill", done,
    /// total)` and `("token", id, text)`; returning `false` stops. Resolves to
    /// `{tokens, stop, prompt_tokens}` as JSON.
    pub fn complete(
        &self,
        prompt: String,
        options: JsValue,
        on_event: js_sys::Function,
    ) -> js_sys::Promise {
        let state = self.state.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let opts = Options::from_js(&options)?;
            let (model, tokenizer) = claim(&state)?;
            let r = complete(&model, &tokenizer, &prompt, &opts, &on_event).await;
            release(&state);
            r.map(JsValue::from).map_err(JsValue::from)
        })
    }

    /// One chat turn with the model's template: the conversation so far stays in the caches
    /// and only the new part is prefilled. `options` as for [`Engine::complete`] plus
    /// `system`. `on_event` sees `("prefill", done, total)`, `("token", id, "")` and
    /// `("text", "content" | "reasoning", text)`. Resolves to `{tokens, end, prompt_tokens,
    /// reused, dropped_turns}` as JSON.
    pub fn chat(
        &self,
        message: String,
        options: JsValue,
        on_event: js_sys::Function,
    ) -> js_sys::Promise {
        let state = self.state.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let opts = Options::from_js(&options)?;
            let mut turn = {
                let mut st = state.borrow_mut();
                let l = st.as_mut().ok_or_else(|| js_err("no model loaded"))?;
                if l.busy {
                    return Err(js_err("the model is busy with another request").into());
                }
                l.busy = true;
                ChatTurn {
                    model: l.model.clone(),
                    tokenizer: l.tokenizer.clone(),
                    chat: l.chat.clone(),
                    session: l.session.take(),
                    ctx: l.chat_ctx,
                }
            };
            let r = chat_turn(&mut turn, &message, &opts, &on_event).await;
            if let Some(l) = state.borrow_mut().as_mut() {
                l.busy = false;
                l.chat = turn.chat;
                l.session = turn.session;
            }
            r.map(JsValue::from).map_err(JsValue::from)
        })
    }

    /// Forget the conversation (the system prompt comes with each message's options).
    pub fn reset_chat(&self) -> Result<(), JsError> {
        let mut st = self.state.borrow_mut();
        let l = st.as_mut().ok_or_else(|| js_err("no model loaded"))?;
        if l.busy {
            return Err(js_err("the model is busy with another request"));
        }
        l.chat.conversation.clear();
        l.chat.forget_cache();
        if let Some(s) = l.session.as_mut() {
            s.reset();
        }
        Ok(())
    }

    /// Free the GPU memory (the device is destroyed; this engine cannot be used again).
    pub fn destroy(&self) {
        if let Ok(mut st) = self.state.try_borrow_mut() {
            *st = None;
        }
        self.gpu.device.destroy();
    }
}

/// Generation settings from the page.
struct Options {
    params: SamplingParams,
    max_tokens: usize,
    system: Option<String>,
    /// The cache formats of a completion (`cache_type`: auto, f32, bf16, fp8 or
    /// LATENT/KEYS, as `--cache-type`); `None`: the model's default.
    cache: Option<sparsa::cache::CacheFormat>,
}

impl Options {
    fn from_js(v: &JsValue) -> Result<Options, JsValue> {
        let num = |k: &str, default: f64| -> Result<f64, JsValue> {
            let x = js_sys::Reflect::get(v, &JsValue::from_str(k))?;
            if x.is_undefined() || x.is_null() {
                return Ok(default);
            }
            match x.as_f64() {
                Some(f) if f.is_finite() => Ok(f),
                _ => Err(js_err(format!("option {k}: not a number")).into()),
            }
        };
        let whole = |k: &str, default: f64| -> Result<usize, JsValue> {
            let f = num(k, default)?;
            if f < 0.0 || f.fract() != 0.0 {
                return Err(js_err(format!("option {k}: {f} is not a whole number ≥ 0")).into());
            }
            Ok(f as usize)
        };
        let max_tokens = whole("max_tokens", 128.0)?;
        if max_tokens == 0 {
            return Err(js_err("option max_tokens: must be at least 1").into());
        }
        let temperature = num("temperature", 0.8)? as f32;
        let top_p = num("top_p", 0.95)? as f32;
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(js_err(format!("option top_p: {top_p} is not in (0, 1]")).into());
        }
        let repeat_penalty = num("repeat_penalty", 1.0)? as f32;
        if repeat_penalty <= 0.0 {
            return Err(js_err("option repeat_penalty: must be above 0").into());
        }
        let system = js_sys::Reflect::get(v, &JsValue::from_str("system"))?
            .as_string()
            .filter(|s| !s.trim().is_empty());
        let cache = match js_sys::Reflect::get(v, &JsValue::from_str("cache_type"))?.as_string() {
            None => None,
            Some(s) if s.is_empty() || s == "auto" => None,
            Some(s) => Some(sparsa::cache::CacheFormat::parse(&s).ok_or_else(|| {
                js_err(format!(
                    "option cache_type: '{s}' is not auto, f32, bf16, fp8 or LATENT/KEYS (LATENT f32|bf16|fp8, KEYS f32|bf16|i8)"
                ))
            })?),
        };
        Ok(Options {
            params: SamplingParams {
                temperature,
                top_p,
                top_k: whole("top_k", 40.0)?,
                seed: whole("seed", 0.0)? as u64,
                repeat_penalty,
                repeat_last_n: whole("repeat_last_n", 64.0)?,
                ..Default::default()
            },
            max_tokens,
            system,
            cache,
        })
    }
}

/// Calls `on_event(kind, a, b)`; anything but `false` means go on. A throwing callback
/// stops generation.
fn emit(f: &js_sys::Function, kind: &str, a: JsValue, b: JsValue) -> bool {
    match f.call3(&JsValue::NULL, &JsValue::from_str(kind), &a, &b) {
        Ok(v) => v.as_bool() != Some(false),
        Err(e) => {
            console_error(&format!("on_event threw: {e:?}"));
            false
        }
    }
}

/// Marks the model busy for one request and hands out what the request needs (the
/// future cannot hold a `RefCell` borrow across its awaits).
fn claim(state: &Rc<RefCell<Option<Loaded>>>) -> Result<(Model, Rc<Tokenizer>), JsValue> {
    let mut st = state.borrow_mut();
    let l = st.as_mut().ok_or_else(|| js_err("no model loaded"))?;
    if l.busy {
        return Err(js_err("the model is busy with another request").into());
    }
    l.busy = true;
    Ok((l.model.clone(), l.tokenizer.clone()))
}

fn release(state: &Rc<RefCell<Option<Loaded>>>) {
    if let Some(l) = state.borrow_mut().as_mut() {
        l.busy = false;
    }
}

fn stop_name(s: Stop) -> &'static str {
    match s {
        Stop::Eos => "eos",
        Stop::MaxTokens => "max_tokens",
        Stop::ContextFull => "context_full",
        Stop::Callback => "stopped",
    }
}

async fn complete(
    model: &Model,
    tok: &Tokenizer,
    prompt: &str,
    opts: &Options,
    on_event: &js_sys::Function,
) -> Result<String, JsError> {
    let ids = tok.encode(prompt).map_err(js_err)?;
    if ids.is_empty() {
        return Err(js_err("the prompt is empty after tokenization"));
    }
    let need = ids.len() + opts.max_tokens;
    let limit = model.config.max_position_embeddings.max(1);
    if need > limit {
        return Err(js_err(format!(
            "prompt ({} tokens) + max tokens ({}) exceed the model's {} positions",
            ids.len(),
            opts.max_tokens,
            limit
        )));
    }
    let session = match opts.cache {
        Some(f) => model.session_in(need, f),
        None => model.session(need),
    };
    let mut session = session.map_err(js_err)?;
    let mut sampler = Sampler::new(opts.params.clone());
    let mut stream = TextStream::new(tok);
    let mut err = None;
    let (out, stop) = generate_events_async(
        &mut session,
        &[],
        &ids,
        opts.max_tokens,
        &mut sampler,
        &model.config.eos_token_ids,
        |e| match e {
            Event::Prefill { done, total } => emit(
                on_event,
                "prefill",
                JsValue::from(done as u32),
                JsValue::from(total as u32),
            ),
            Event::Token(id) => {
                let text = match stream.push(id) {
                    Ok(t) => t,
                    Err(e) => {
                        err = Some(e);
                        return false;
                    }
                };
                emit(
                    on_event,
                    "token",
                    JsValue::from(id),
                    JsValue::from_str(&text),
                )
            }
        },
    )
    .await
    .map_err(js_err)?;
    if let Some(e) = err {
        return Err(js_err(e));
    }
    Ok(serde_json::json!({
        "tokens": out,
        "stop": stop_name(stop),
        "prompt_tokens": ids.len(),
        "prompt_ids": ids,
    })
    .to_string())
}

struct ChatTurn {
    model: Model,
    tokenizer: Rc<Tokenizer>,
    chat: Chat,
    session: Option<Session>,
    ctx: usize,
}

async fn chat_turn(
    t: &mut ChatTurn,
    message: &str,
    opts: &Options,
    on_event: &js_sys::Function,
) -> Result<String, JsError> {
    let message = message.trim();
    if message.is_empty() {
        return Err(js_err("the message is empty"));
    }
    if t.session.is_none() {
        t.session = Some(t.model.session(t.ctx).map_err(js_err)?);
        t.chat.forget_cache();
    }
    let Some(session) = t.session.as_mut() else {
        return Err(js_err("no session"));
    };
    if t.chat.conversation.system() != opts.system.as_deref() {
        t.chat.conversation.set_system(opts.system.clone());
    }
    let reserve = reply_reserve(opts.max_tokens, t.ctx);
    let plan = match t
        .chat
        .prepare(&t.tokenizer, message, t.ctx, reserve)
        .map_err(js_err)?
    {
        Prepared::Ready(p) => p,
        Prepared::TooLong { tokens, room } => {
            return Err(js_err(format!(
                "the message does not fit: {tokens} tokens, room for {room} in a context of {}",
                t.ctx
            )))
        }
    };
    let dropped = plan.dropped_turns;
    let mut sampler = Sampler::new(opts.params.clone());
    let ropts = ReplyOptions {
        max_tokens: opts.max_tokens,
        eos: t.model.config.eos_token_ids.clone(),
        stop: Vec::new(),
    };
    let mut tokens = Vec::new();
    let r = t
        .chat
        .reply_async(
            session,
            &t.tokenizer,
            plan,
            &mut sampler,
            &ropts,
            |e| match e {
                ChatEvent::Prefill { done, total } => emit(
                    on_event,
                    "prefill",
                    JsValue::from(done as u32),
                    JsValue::from(total as u32),
                ),
                ChatEvent::Token(id) => {
                    tokens.push(id);
                    emit(on_event, "token", JsValue::from(id), JsValue::from_str(""))
                }
                ChatEvent::Text(part, s) => emit(
                    on_event,
                    "text",
                    JsValue::from_str(match part {
                        Part::Content => "content",
                        Part::Reasoning => "reasoning",
                    }),
                    JsValue::from_str(s),
                ),
            },
        )
        .await
        .map_err(js_err)?;
    let end = match r.end {
        ReplyEnd::Eos => "eos",
        ReplyEnd::StopString => "stop_string",
        ReplyEnd::MaxTokens => "max_tokens",
        ReplyEnd::ContextFull => "context_full",
        ReplyEnd::Interrupted => "stopped",
    };
    Ok(serde_json::json!({
        "tokens": tokens,
        "end": end,
        "prompt_tokens": r.prompt_tokens,
        "reused": r.reused,
        "prefilled": r.prefilled,
        "dropped_turns": dropped,
        "context_used": session.pos,
        "ctx": t.ctx,
    })
    .to_string())
}
