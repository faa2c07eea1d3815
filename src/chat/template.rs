//! The Jinja engine (MiniJinja) set up to render Hugging Face chat templates the way
//! transformers 5.24 does (`transformers/utils/chat_template_utils.py`).
//!
//! transformers renders with Jinja2's `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True)` plus the `loopcontrols` extension, Jinja2's default `Undefined`, no
//! auto-escaping and the default `keep_trailing_newline=False`. It adds the globals
//! `raise_exception`, `strftime_now`, `dict`, `namespace` and its own `tojson` filter, and a
//! `{% generation %}` block tag that only marks assistant text. The places where MiniJinja differs
//! from Jinja2 and that chat templates meet are bridged here:
//!
//! - Printing a value (`{{ x }}`, `x | string`) gives Python's `str()`, including floats
//!   (`1e-07`, `1e+20`, where MiniJinja prints `0.0000001`, `100000000000000000000.0`), lists,
//!   tuples and dicts with Python's quoting (`['a', 1]`, `('solo',)`, `{'q': "it's"}`).
//! - `tojson` is Python's `json.dumps` with transformers' defaults (`ensure_ascii=False`) and its
//!   `indent`, `separators` and `sort_keys` arguments; floats print as Python's `repr`.
//! - Python string and dict methods (`.strip()`, `.split()`, `.startswith()`, `.items()`,
//!   `.get()`, ...) come from `minijinja-contrib`'s `pycompat`; `strip`/`lstrip`/`rstrip` without
//!   arguments strip Python's whitespace set (which also has U+001C..U+001F).
//! - Maps keep their insertion order (`preserve_order`), as Python dicts do, so `.items()` and
//!   `tojson` list keys in the order of the messages and keyword arguments.
//! - `{% generation %}` / `{% endgeneration %}` are rewritten to a `{% with %}` scope, which keeps
//!   the body's output, whitespace control and local assignments as Jinja2's call block does.
//! - `raise_exception(msg)` fails the render with `msg` in the error.
//!
//! Known differences that the published GLM / DeepSeek templates do not meet: the `~` operator
//! formats values with MiniJinja's own rules (the same as Python's except for floats outside
//! 1e-4..1e16 and for lists and dicts), Python's `%` string formatting is not available,
//! `str.title()` follows MiniJinja's rules, an index past the end of a list is undefined instead
//! of an error, and `strftime_now` uses UTC (Python uses the local time zone) and is not available
//! in the browser build.

use crate::error::{Error, Result};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, ErrorKind, State};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One message of a conversation, as transformers' `apply_chat_template` receives it.
///
/// `reasoning_content` is the assistant's reasoning (thinking) for that turn. As transformers does,
/// the template also sees it under `thinking`. A `None` field is left out of the message, so a
/// template's `message.reasoning_content is defined` is false.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
        }
    }
}

/// A compiled chat template with the special tokens it is rendered with.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    /// Where the template came from, for error messages: `chat_template.jinja`,
    /// `tokenizer_config.json` or `the plain fallback template`.
    origin: String,
    special_tokens: Vec<(String, String)>,
    /// The fuel of a render before the conversation's allowance ([`FUEL_BASE`]).
    fuel_base: u64,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("special_tokens", &self.special_tokens)
            .field("source_len", &self.source.len())
            .finish()
    }
}

/// The work one render may do, in MiniJinja fuel (about one instruction, or 64 bytes of
/// created data, per unit), before the allowance for the size of the conversation: enough for
/// the published templates many times over, while a hostile template (`range` loops, string
/// repetition, runaway recursion) stops within a fraction of a second and some 64 MiB.
pub const FUEL_BASE: u64 = 1_000_000;
/// Fuel allowed per byte of the messages and extra arguments (templates print each message a
/// few times and search it for markers).
const FUEL_PER_BYTE: u64 = 16;
/// Fuel allowed per message (the instructions a template runs for each).
const FUEL_PER_MESSAGE: u64 = 20_000;
/// How deeply macros and `{% include %}`-like calls may nest (real templates: a few levels).
const MAX_RECURSION: usize = 64;

/// The name the template has inside the engine; it appears in error positions
/// (`... (in chat_template:12)`, line 12 of the template text).
const TEMPLATE_NAME: &str = "chat_template";

/// The named special tokens transformers passes to every template (its
/// `SPECIAL_TOKENS_ATTRIBUTES`); only those the tokenizer config sets are defined.
const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// The plain fallback: one paragraph per message, `Role: content`, then `Assistant:` when a
/// generation prompt is asked for. It adds no special tokens.
const PLAIN_TEMPLATE: &str = "{%- for message in messages -%}\n\
{{ message.role | capitalize }}: {{ message.content }}\n\n\
{% endfor -%}\n\
{%- if add_generation_prompt %}Assistant:{% endif -%}";

impl ChatTemplate {
    /// The chat template of a model from the text of its `tokenizer_config.json` and, when the
    /// model has one, of its `chat_template.jinja`.
    ///
    /// As in transformers, `chat_template.jinja` wins over the config's `chat_template`. The
    /// config's `chat_template` may be a string or a list of `{"name", "template"}` entries, of
    /// which the one named `default` is used. The named special tokens (`bos_token`, `eos_token`,
    /// `unk_token`, `sep_token`, `pad_token`, `cls_token`, `mask_token`, and the entries of an
    /// `extra_special_tokens` object) are read as strings or as AddedToken objects
    /// (`{"content": ...}`). Returns `Ok(None)` when the model has no template.
    pub fn from_config_texts(
        tokenizer_config: &str,
        jinja: Option<&str>,
    ) -> Result<Option<ChatTemplate>> {
        let config: serde_json::Value = serde_json::from_str(tokenizer_config)
            .map_err(|e| Error::msg(format!("tokenizer_config.json: not valid JSON: {e}")))?;
        let config = config.as_object().ok_or_else(|| {
            Error::msg("tokenizer_config.json: expected a JSON object at the top level")
        })?;
        let special_tokens = special_tokens(config)?;
        if let Some(source) = jinja {
            return ChatTemplate::new(source.to_string(), "chat_template.jinja", special_tokens)
                .map(Some);
        }
        let source = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => default_of_list(list)?,
            Some(other) => {
                return Err(Error::msg(format!(
                    "tokenizer_config.json: chat_template must be a string or a list of \
                     {{\"name\", \"template\"}} objects, not {}",
                    json_kind(other)
                )))
            }
        };
        ChatTemplate::new(source, "tokenizer_config.json", special_tokens).map(Some)
    }

    /// The chat template of the model directory `dir`: its `chat_template.jinja` if present,
    /// else the `chat_template` of its `tokenizer_config.json`. `Ok(None)` when there is none.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn from_dir(dir: &std::path::Path) -> Result<Option<ChatTemplate>> {
        let read = |name: &str| -> Result<Option<String>> {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::msg(format!("{}: cannot read: {e}", path.display()))),
            }
        };
        let config = read("tokenizer_config.json")?;
        let jinja = read("chat_template.jinja")?;
        if config.is_none() && jinja.is_none() {
            return Ok(None);
        }
        let config = config.unwrap_or_else(|| "{}".to_string());
        ChatTemplate::from_config_texts(&config, jinja.as_deref())
            .map_err(|e| e.context(dir.display()))
    }

    /// The documented plain fallback for a model without a chat template: each message as a
    /// paragraph `Role: content` followed by a blank line (the role capitalized: `System`,
    /// `User`, `Assistant`, ...), and `Assistant:` at the end when `add_generation_prompt` is
    /// set. Reasoning content is left out and no special tokens are added, so encode the result
    /// with [`Tokenizer::encode`](crate::tokenizer::Tokenizer::encode), which adds the
    /// tokenizer's own prefix. For example `[system "Be brief.", user "Hi"]` with a generation
    /// prompt renders as `"System: Be brief.\n\nUser: Hi\n\nAssistant:"`.
    pub fn plain() -> ChatTemplate {
        // The built-in text is fixed and covered by tests, so compiling it cannot fail; should
        // it ever, the error surfaces from `render`.
        match ChatTemplate::new(
            PLAIN_TEMPLATE.to_string(),
            "the plain fallback template",
            Vec::new(),
        ) {
            Ok(t) => t,
            Err(_) => ChatTemplate {
                env: Environment::new(),
                source: PLAIN_TEMPLATE.to_string(),
                origin: "the plain fallback template".to_string(),
                special_tokens: Vec::new(),
                fuel_base: FUEL_BASE,
            },
        }
    }

    fn new(
        source: String,
        origin: &str,
        special_tokens: Vec<(String, String)>,
    ) -> Result<ChatTemplate> {
        let env = environment(&source)
            .map_err(|e| Error::msg(format!("{origin}: invalid chat template: {e}")))?;
        Ok(ChatTemplate {
            env,
            source,
            origin: origin.to_string(),
            special_tokens,
            fuel_base: FUEL_BASE,
        })
    }

    /// Sets the fuel a render may use before the conversation's allowance (default
    /// [`FUEL_BASE`]). The fuzzer lowers it so that hostile templates fail fast.
    pub fn set_fuel_base(&mut self, fuel: u64) {
        self.fuel_base = fuel;
    }

    /// The fuel budget of rendering `messages` with `extra`: the base plus an allowance that
    /// grows with their size, so that long conversations render while the work and memory of
    /// any render stay bounded.
    fn fuel_for(
        &self,
        messages: &[Message],
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> u64 {
        let bytes: usize = messages
            .iter()
            .map(|m| {
                m.role.len() + m.content.len() + m.reasoning_content.as_ref().map_or(0, String::len)
            })
            .sum::<usize>()
            + serde_json::Value::Object(extra.clone()).to_string().len();
        self.fuel_base
            .saturating_add((bytes as u64).saturating_mul(FUEL_PER_BYTE))
            .saturating_add((messages.len() as u64).saturating_mul(FUEL_PER_MESSAGE))
    }

    /// Where the template came from: `chat_template.jinja`, `tokenizer_config.json` or
    /// `the plain fallback template`.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The template text as the model ships it.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The named special tokens the template is rendered with (`("eos_token", "<|endoftext|>")`).
    pub fn special_tokens(&self) -> &[(String, String)] {
        &self.special_tokens
    }

    /// Renders `messages` as transformers' `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=..., **extra)` does. `extra` holds the template's keyword arguments
    /// (for example `{"enable_thinking": false}`); it may also carry `tools` and `documents`,
    /// which transformers takes as named arguments, and it overrides a special token of the
    /// same name. `messages` and `add_generation_prompt` cannot be set through `extra`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        for reserved in ["messages", "add_generation_prompt"] {
            if extra.contains_key(reserved) {
                return Err(Error::msg(format!(
                    "chat template argument `{reserved}` is set by render itself; remove it from \
                     the extra arguments"
                )));
            }
        }
        let mut ctx: Vec<(String, Value)> = vec![
            (
                "messages".to_string(),
                Value::from(messages.iter().map(message_value).collect::<Vec<_>>()),
            ),
            ("tools".to_string(), Value::from(())),
            ("documents".to_string(), Value::from(())),
            (
                "add_generation_prompt".to_string(),
                Value::from(add_generation_prompt),
            ),
        ];
        for (name, token) in &self.special_tokens {
            ctx.push((name.clone(), Value::from(token.as_str())));
        }
        for (key, value) in extra {
            ctx.push((key.clone(), json_value(value)));
        }
        // Later entries win, as `{**special_tokens, **kwargs}` does in transformers.
        let ctx = Value::from_pairs(ctx);
        // A copy of the environment carries this render's budget (templates are shared).
        let mut env = self.env.clone();
        let fuel = self.fuel_for(messages, extra);
        env.set_fuel(Some(fuel));
        let template = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::msg(format!("{}: invalid chat template: {e}", self.origin)))?;
        template
            .render(ctx)
            .map_err(|e| self.render_error(&e, fuel))
    }

    fn render_error(&self, e: &minijinja::Error, fuel: u64) -> Error {
        if e.kind() == ErrorKind::OutOfFuel {
            let at = match (e.name(), e.line()) {
                (Some(name), Some(line)) => format!(" (at {name}:{line})"),
                _ => String::new(),
            };
            return Error::msg(format!(
                "{}: the chat template exceeded its work limit of {fuel} fuel units (about one \
                 per instruction or per 64 bytes of data; a loop, a recursion or a string that \
                 grows without bound?){at}",
                self.origin
            ));
        }
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(err) = source {
            if let Some(raised) = err.downcast_ref::<Raised>() {
                let at = match (e.name(), e.line()) {
                    (Some(name), Some(line)) => format!(" (in {name}:{line})"),
                    _ => String::new(),
                };
                return Error::msg(format!(
                    "{}: the chat template raised an error: {}{at}",
                    self.origin, raised.0
                ));
            }
            source = err.source();
        }
        Error::msg(format!(
            "{}: rendering the chat template failed: {e}",
            self.origin
        ))
    }

    /// Whether the template reads an `enable_thinking` or `thinking` switch (GLM, DeepSeek
    /// V3.1/V3.2), so a caller knows that the switch changes the prompt.
    pub fn supports_thinking(&self) -> bool {
        match self.env.get_template(TEMPLATE_NAME) {
            Ok(t) => {
                let vars = t.undeclared_variables(false);
                vars.contains("enable_thinking") || vars.contains("thinking")
            }
            Err(_) => false,
        }
    }
}

fn special_tokens(
    config: &serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut put = |name: &str, value: &serde_json::Value| -> Result<()> {
        let token = match value {
            serde_json::Value::Null => return Ok(()),
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(o) => match o.get("content") {
                Some(serde_json::Value::String(s)) => s.clone(),
                _ => {
                    return Err(Error::msg(format!(
                        "tokenizer_config.json: {name} is an object without a string \"content\""
                    )))
                }
            },
            other => {
                return Err(Error::msg(format!(
                "tokenizer_config.json: {name} must be a string or an AddedToken object, not {}",
                json_kind(other)
            )))
            }
        };
        match out.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = token,
            None => out.push((name.to_string(), token)),
        }
        Ok(())
    };
    for name in SPECIAL_TOKEN_NAMES {
        if let Some(value) = config.get(name) {
            put(name, value)?;
        }
    }
    // transformers 5 turns an `extra_special_tokens` *object* into more named tokens (a list
    // only adds unnamed special tokens).
    if let Some(serde_json::Value::Object(extra)) = config.get("extra_special_tokens") {
        for (name, value) in extra {
            put(name, value)?;
        }
    }
    Ok(out)
}

fn default_of_list(list: &[serde_json::Value]) -> Result<String> {
    let mut names = Vec::new();
    for entry in list {
        let name = entry.get("name").and_then(|v| v.as_str());
        let template = entry.get("template").and_then(|v| v.as_str());
        match (name, template) {
            (Some("default"), Some(t)) => return Ok(t.to_string()),
            (Some(n), Some(_)) => names.push(n.to_string()),
            _ => {
                return Err(Error::msg(
                    "tokenizer_config.json: each entry of the chat_template list needs a string \
                     \"name\" and a string \"template\"",
                ))
            }
        }
    }
    Err(Error::msg(format!(
        "tokenizer_config.json: the chat_template list has no template named \"default\" \
         (it has: {})",
        names.join(", ")
    )))
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// The message as transformers hands it to the template: `reasoning_content` also appears as
/// `thinking`, first, as `_alias_reasoning_fields` builds `{"thinking": r, **message,
/// "reasoning_content": r}`.
fn message_value(m: &Message) -> Value {
    let mut fields: Vec<(&str, Value)> = Vec::with_capacity(4);
    if let Some(r) = &m.reasoning_content {
        fields.push(("thinking", Value::from(r.as_str())));
    }
    fields.push(("role", Value::from(m.role.as_str())));
    fields.push(("content", Value::from(m.content.as_str())));
    if let Some(r) = &m.reasoning_content {
        fields.push(("reasoning_content", Value::from(r.as_str())));
    }
    Value::from_pairs(fields)
}

fn json_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => Value::from(a.iter().map(json_value).collect::<Vec<_>>()),
        serde_json::Value::Object(o) => {
            Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), json_value(v))))
        }
    }
}

/// The error `raise_exception` fails the render with; found again in the error's source chain.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn environment(source: &str) -> std::result::Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()?,
    );
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_recursion_limit(MAX_RECURSION);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Lenient);
    env.set_formatter(|out, state, value| {
        out.write_str(&py_str(state, value)?)
            .map_err(|_| minijinja::Error::new(ErrorKind::WriteFailure, "cannot write output"))
    });
    env.set_unknown_method_callback(python_methods);
    env.add_filter("tojson", tojson);
    env.add_filter("string", |state: &State, v: Value| py_str(state, &v));
    env.add_function(
        "raise_exception",
        |message: String| -> std::result::Result<Value, minijinja::Error> {
            Err(
                minijinja::Error::new(ErrorKind::InvalidOperation, message.clone())
                    .with_source(Raised(message)),
            )
        },
    );
    env.add_function("strftime_now", strftime_now);
    env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source))?;
    Ok(env)
}

/// `{% generation %}` / `{% endgeneration %}` (transformers' assistant-mask tag) become
/// `{% with %}` / `{% endwith %}`, keeping their whitespace-control marks.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        match generation_tag(tag) {
            Some((len, open_mark, end, close_mark)) => {
                out.push_str("{%");
                out.push_str(open_mark);
                out.push_str(if end { " endwith " } else { " with " });
                out.push_str(close_mark);
                out.push_str("%}");
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// If `tag` (starting at `{%`) is a generation tag: (its length, opening mark, is-end, closing mark).
fn generation_tag(tag: &str) -> Option<(usize, &str, bool, &str)> {
    let body = &tag[2..];
    let open_mark = match body.chars().next() {
        Some('-') => "-",
        Some('+') => "+",
        _ => "",
    };
    let body = &body[open_mark.len()..];
    let trimmed = body.trim_start();
    let (end, after) = if let Some(a) = trimmed.strip_prefix("endgeneration") {
        (true, a)
    } else if let Some(a) = trimmed.strip_prefix("generation") {
        (false, a)
    } else {
        return None;
    };
    if after.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
        return None;
    }
    let after_ws = after.trim_start();
    let (close_mark, after_mark) = match after_ws.chars().next() {
        Some('-') => ("-", &after_ws[1..]),
        Some('+') => ("+", &after_ws[1..]),
        _ => ("", after_ws),
    };
    let rest = after_mark.strip_prefix("%}")?;
    Some((tag.len() - rest.len(), open_mark, end, close_mark))
}

/// Python string methods with Python's whitespace for argument-less strip/lstrip/rstrip; the
/// rest from `minijinja-contrib`'s `pycompat`.
fn python_methods(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    if let (Some(s), "strip" | "lstrip" | "rstrip", true) = (
        value.as_str(),
        method,
        args.is_empty() || (args.len() == 1 && args[0].is_none()),
    ) {
        let out = match method {
            "strip" => s.trim_matches(is_py_space),
            "lstrip" => s.trim_start_matches(is_py_space),
            _ => s.trim_end_matches(is_py_space),
        };
        return Ok(Value::from(out));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Python's `str.isspace()` for one character.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str(value)` for the values a template can hold.
fn py_str(state: &State, value: &Value) -> std::result::Result<String, minijinja::Error> {
    Ok(match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Seq | ValueKind::Map => {
            let mut out = String::new();
            py_repr(state, value, 0, &mut out)?;
            out
        }
        _ => value.to_string(),
    })
}

/// How deeply the printers (`str()`, `tojson`) follow nested lists and maps; deeper values
/// (which only a template that builds them in a loop has) fail the render.
const MAX_VALUE_DEPTH: usize = 100;

/// Charges the render's fuel for one printed item of `bytes` bytes and checks the nesting
/// depth, so that printing a huge (lazy) list or a deeply nested value fails with a clear
/// error instead of exhausting memory or the stack.
fn charge_item(
    state: &State,
    depth: usize,
    bytes: usize,
) -> std::result::Result<(), minijinja::Error> {
    if depth > MAX_VALUE_DEPTH {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("cannot print a value nested deeper than {MAX_VALUE_DEPTH} levels"),
        ));
    }
    state.consume_fuel(1 + bytes as u64 / 64)
}

/// Python's `repr(value)`.
fn py_repr(
    state: &State,
    value: &Value,
    depth: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    charge_item(state, depth, value.as_str().map_or(0, str::len))?;
    match value.kind() {
        ValueKind::Undefined => out.push_str("Undefined"),
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => {
            if value.is_integer() {
                out.push_str(&value.to_string());
            } else {
                out.push_str(&py_float(f64::try_from(value.clone()).unwrap_or(f64::NAN)));
            }
        }
        ValueKind::String => py_repr_str(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            let tuple = value.is_tuple();
            out.push(if tuple { '(' } else { '[' });
            let mut n = 0;
            if let Ok(items) = value.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(state, &item, depth + 1, out)?;
                    n += 1;
                }
            }
            if tuple && n == 1 {
                out.push(',');
            }
            out.push(if tuple { ')' } else { ']' });
        }
        ValueKind::Map => {
            out.push('{');
            if let Some(pairs) = value.as_object().and_then(|o| o.try_iter_pairs()) {
                for (i, (k, v)) in pairs.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(state, &k, depth + 1, out)?;
                    out.push_str(": ");
                    py_repr(state, &v, depth + 1, out)?;
                }
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
    Ok(())
}

/// Python's `repr(str)`: single quotes unless the text has a `'` and no `"`; control and other
/// non-printable characters escaped.
fn py_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !py_printable(c) => {
                let n = c as u32;
                let _ = if n < 0x100 {
                    write!(out, "\\x{n:02x}")
                } else if n < 0x10000 {
                    write!(out, "\\u{n:04x}")
                } else {
                    write!(out, "\\U{n:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable()` for one character, for the categories that occur in text:
/// controls (Cc), separators other than the space (Zs, Zl, Zp), the common format characters
/// (Cf) and private use (Co). Unassigned code points are taken as printable.
fn py_printable(c: char) -> bool {
    let n = c as u32;
    !(n < 0x20
        || (0x7f..=0xa0).contains(&n)
        || n == 0xad
        || n == 0x1680
        || (0x2000..=0x200f).contains(&n)
        || (0x2028..=0x202f).contains(&n)
        || (0x205f..=0x2064).contains(&n)
        || (0x2066..=0x206f).contains(&n)
        || n == 0x3000
        || n == 0xfeff
        || (0xfff9..=0xfffb).contains(&n)
        || (0x0600..=0x0605).contains(&n)
        || n == 0x061c
        || n == 0x06dd
        || n == 0x070f
        || n == 0x180e
        || (0xe000..=0xf8ff).contains(&n)
        || (0xe0001..=0xe007f).contains(&n)
        || n >= 0xf0000)
}

/// Python's `repr(float)`: the shortest digits that read back the same value, positional for
/// exponents -4..16, else `d.ddde+XX`; always with a `.0` or an exponent.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, like Python's repr.
    let sci = format!("{f:e}");
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (sci.as_str(), 0),
    };
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if (point as usize) >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let head = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits.clone()
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{head}e{esign}{:02}", exp.abs())
    }
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`; the first three arguments by position or by name,
/// `sort_keys` by name.
fn tojson(
    state: &State,
    value: &Value,
    args: minijinja::value::Rest<minijinja::value::ValueOrKwargs>,
) -> std::result::Result<String, minijinja::Error> {
    // (A filter takes at most five parameters, so the arguments are split here.)
    let args = args.into_values();
    let (ensure_ascii, indent, separators, kwargs) =
        minijinja::value::from_args::<(Option<Value>, Option<Value>, Option<Value>, Kwargs)>(
            &args,
        )?;
    tojson_impl(state, value, ensure_ascii, indent, separators, kwargs)
}

fn tojson_impl(
    state: &State,
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    separators: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<String, minijinja::Error> {
    let positional = [ensure_ascii, indent, separators];
    let pick = |index: usize, name: &str| -> std::result::Result<Option<Value>, minijinja::Error> {
        match positional.get(index).cloned().flatten() {
            Some(v) => Ok(Some(v)),
            None => kwargs.get::<Option<Value>>(name),
        }
    };
    let ensure_ascii = pick(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(1, "indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_str(), v.as_i64()) {
            (Some(s), _) => Some(s.to_string()),
            (None, Some(n)) if n > MAX_INDENT => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: indent {n} is larger than {MAX_INDENT}"),
                ))
            }
            (None, Some(n)) => Some(" ".repeat(n.max(0) as usize)),
            _ => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ))
            }
        },
    };
    let (item_sep, key_sep) = match pick(2, "separators")? {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let sort_keys = pick(3, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let opts = JsonOpts {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    json_dump(state, value, &opts, 0, &mut out)?;
    Ok(out)
}

/// The largest numeric `indent` of `tojson` (templates use 2 or 4).
const MAX_INDENT: i64 = 64;

struct JsonOpts {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn json_dump(
    state: &State,
    value: &Value,
    opts: &JsonOpts,
    depth: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    // Each item costs its indentation, separators and (for a string) its text.
    let indent = opts
        .indent
        .as_ref()
        .map_or(0, |i| i.len() * (depth + 1) + 1);
    let text = value.as_str().map_or(0, str::len);
    charge_item(
        state,
        depth,
        indent + opts.item_sep.len() + opts.key_sep.len() + text,
    )?;
    let newline = |out: &mut String, depth: usize| {
        if let Some(ind) = &opts.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    };
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                out.push_str(&value.to_string());
            } else {
                let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
                if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else {
                    out.push_str(&py_float(f));
                }
            }
        }
        ValueKind::String => json_str(value.as_str().unwrap_or_default(), opts.ensure_ascii, out),
        ValueKind::Seq => {
            // Iterated, not collected: a repeated list (`[x] * n`) is lazy and may be huge.
            let mut items = value.try_iter()?.peekable();
            if items.peek().is_none() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, depth + 1);
                json_dump(state, &item, opts, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut pairs: Vec<(String, Value)> = Vec::new();
            if let Some(iter) = value.as_object().and_then(|o| o.try_iter_pairs()) {
                for (k, v) in iter {
                    pairs.push((json_key(&k)?, v));
                }
            }
            if opts.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, v)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, depth + 1);
                json_str(k, opts.ensure_ascii, out);
                out.push_str(&opts.key_sep);
                json_dump(state, v, opts, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        kind => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of type {kind} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// A JSON object key as Python's json module writes non-string keys.
fn json_key(k: &Value) -> std::result::Result<String, minijinja::Error> {
    Ok(match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".to_string(),
        ValueKind::Bool => if k.is_true() { "true" } else { "false" }.to_string(),
        ValueKind::Number if k.is_integer() => k.to_string(),
        ValueKind::Number => py_float(f64::try_from(k.clone()).unwrap_or(f64::NAN)),
        kind => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
            ))
        }
    })
}

/// A JSON string as Python's json module writes it.
fn json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// transformers' `strftime_now(format)`: the current time formatted with C's strftime. Here
/// the time is UTC, and the common directives are supported (`%Y %y %m %d %e %j %H %I %M %S
/// %p %a %A %b %B %h %F %T %D %R %%`); another directive is kept as written.
fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        Ok(strftime_utc(&format, secs))
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = format;
        Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            "strftime_now: the current time is not available in the browser build",
        ))
    }
}

/// `format` applied to the UTC time `secs` seconds after the Unix epoch.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
fn strftime_utc(format: &str, secs: i64) -> String {
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (hour, minute, second) = (tod / 3600, tod % 3600 / 60, tod % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let day = doy_mar - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let month_name = MONTHS[(month - 1) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match d {
            'Y' => write!(out, "{year}"),
            'y' => write!(out, "{:02}", year.rem_euclid(100)),
            'm' => write!(out, "{month:02}"),
            'd' => write!(out, "{day:02}"),
            'e' => write!(out, "{day:2}"),
            'j' => write!(out, "{yday:03}"),
            'H' => write!(out, "{hour:02}"),
            'I' => write!(out, "{hour12:02}"),
            'M' => write!(out, "{minute:02}"),
            'S' => write!(out, "{second:02}"),
            'p' => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            'a' => write!(out, "{}", &DAYS[weekday][..3]),
            'A' => write!(out, "{}", DAYS[weekday]),
            'b' | 'h' => write!(out, "{}", &month_name[..3]),
            'B' => write!(out, "{month_name}"),
            'F' => write!(out, "{year}-{month:02}-{day:02}"),
            'T' => write!(out, "{hour:02}:{minute:02}:{second:02}"),
            'R' => write!(out, "{hour:02}:{minute:02}"),
            'D' => write!(out, "{month:02}/{day:02}/{:02}", year.rem_euclid(100)),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hostile(jinja: &str) -> String {
        let t = ChatTemplate::from_config_texts("{}", Some(jinja))
            .unwrap()
            .unwrap();
        let started = std::time::Instant::now();
        let e = t
            .render(&[Message::new("user", "hi")], true, &Default::default())
            .err()
            .unwrap_or_else(|| panic!("{jinja:?} rendered"))
            .0;
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{jinja:?} took {:?}",
            started.elapsed()
        );
        assert!(e.starts_with("chat_template.jinja: "), "{e}");
        e
    }

    #[test]
    fn chat_real_templates_render_long_conversations_within_the_work_limit() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat");
        let mut messages = vec![Message::new("system", "Be brief.")];
        for i in 0..400 {
            let text = format!("turn {i}: {}", "lorem ipsum dolor sit amet ".repeat(80));
            messages.push(Message::new("user", text.clone()));
            messages.push(Message {
                role: "assistant".into(),
                content: text.clone(),
                reasoning_content: Some(text),
            });
        }
        messages.push(Message::new("user", "last"));
        for model in ["glm-4.7", "deepseek-v3.2-exp", "sparsa-bard-12m"] {
            let t = ChatTemplate::from_dir(&dir.join(model)).unwrap().unwrap();
            for gen in [false, true] {
                let out = t.render(&messages, gen, &Default::default());
                assert!(
                    out.as_ref().is_ok_and(|o| o.len() > 800_000),
                    "{model}: {out:?}"
                );
            }
        }
    }

    #[test]
    fn chat_hostile_templates_hit_the_work_limit() {
        for jinja in [
            // Endless work: nested loops, string and list growth.
            "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
            "{{ 'a' * 10000000000 }}",
            "{% set s = namespace(x='ab') %}{% for i in range(100) %}{% set s.x = s.x ~ s.x %}{% endfor %}{{ s.x | length }}",
            "{% for i in range(99999) %}{{ messages | tojson(indent=60) }}{% endfor %}",
            // A huge lazy list printed or serialized.
            "{{ [1] * 1000000000 }}",
            "{{ ([1] * 1000000000) | tojson }}",
            "{{ ([[1, 2], 'x'] * 1000000000) | string }}",
        ] {
            let e = hostile(jinja);
            // (MiniJinja itself refuses to repeat a sequence past its own size limit.)
            assert!(
                e.contains("work limit") || e.contains("repeated sequence is too large"),
                "{jinja:?}: {e}"
            );
        }
    }

    #[test]
    fn chat_hostile_templates_hit_the_depth_limits() {
        let e = hostile("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
        assert!(e.contains("recursion"), "{e}");
        // A value nested deeper than the printers follow.
        let e = hostile(
            "{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}",
        );
        assert!(e.contains("nested deeper than 100 levels"), "{e}");
        let e = hostile(
            "{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v | tojson }}",
        );
        assert!(e.contains("nested deeper than 100 levels"), "{e}");
        let e = hostile("{{ messages | tojson(indent=1000000000000) }}");
        assert!(e.contains("indent 1000000000000 is larger than 64"), "{e}");
    }

    #[test]
    fn chat_py_float_matches_python_repr() {
        let cases = [
            (2.5, "2.5"),
            (3.0, "3.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e20, "1e+20"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1e-7, "1e-07"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123.456, "123.456"),
            (-2.5e300, "-2.5e+300"),
            (f64::INFINITY, "inf"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float(f), want, "{f}");
        }
    }

    #[test]
    fn chat_strftime_utc_known_dates() {
        // 2026-02-17 13:05:09 UTC was a Tuesday, day 48 of the year.
        let t = 1_771_333_509;
        assert_eq!(
            strftime_utc("%Y-%m-%d %H:%M:%S %a %A %b %B %j %y %I%p %%", t),
            "2026-02-17 13:05:09 Tue Tuesday Feb February 048 26 01PM %"
        );
        assert_eq!(strftime_utc("%d %b %Y", 0), "01 Jan 1970");
        // A leap day.
        assert_eq!(strftime_utc("%F %j", 951_782_400), "2000-02-29 060");
        assert_eq!(strftime_utc("%Q|%", 0), "%Q|%");
    }

    #[test]
    fn chat_generation_tags_rewritten() {
        assert_eq!(
            rewrite_generation_tags("a{% generation %}b{%- endgeneration -%}c{% generations %}"),
            "a{% with %}b{%- endwith -%}c{% generations %}"
        );
        assert_eq!(rewrite_generation_tags("{%+generation+%}"), "{%+ with +%}");
    }
}
