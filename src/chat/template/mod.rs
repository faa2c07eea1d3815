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

mod config;
mod python;
mod time;
mod tojson;

use crate::error::{Error, Result};
use config::{default_of_list, json_kind, special_tokens};
use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, ErrorKind, State};
use python::{py_str, python_methods};
use serde::{Deserialize, Serialize};
use time::strftime_now;
use tojson::tojson;

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
        let values = messages.iter().map(message_value).collect::<Vec<_>>();
        let fuel = self.fuel_for(messages, extra);
        self.render_values(values, add_generation_prompt, extra, fuel)
    }

    /// [`ChatTemplate::render`] for messages given as JSON objects, as an OpenAI-style client
    /// sends them: any fields (`tool_calls`, `tool_call_id`, `name`, a list `content`) reach
    /// the template as they are. A `reasoning_content` string is also given as `thinking`, as
    /// transformers does. Each message must be a JSON object.
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut values = Vec::with_capacity(messages.len());
        let mut bytes = serde_json::Value::Object(extra.clone()).to_string().len();
        for (i, m) in messages.iter().enumerate() {
            let Some(o) = m.as_object() else {
                return Err(Error::msg(format!("message {}: not a JSON object", i + 1)));
            };
            bytes += m.to_string().len();
            let mut fields: Vec<(&str, Value)> = Vec::with_capacity(o.len() + 1);
            let reasoning = o.get("reasoning_content").filter(|r| r.is_string());
            if let Some(r) = reasoning {
                fields.push(("thinking", json_value(r)));
            }
            for (k, v) in o {
                if k == "thinking" && reasoning.is_some() {
                    continue;
                }
                fields.push((k.as_str(), json_value(v)));
            }
            values.push(Value::from_pairs(fields));
        }
        let fuel = self
            .fuel_base
            .saturating_add((bytes as u64).saturating_mul(FUEL_PER_BYTE))
            .saturating_add((messages.len() as u64).saturating_mul(FUEL_PER_MESSAGE));
        self.render_values(values, add_generation_prompt, extra, fuel)
    }

    fn render_values(
        &self,
        messages: Vec<Value>,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
        fuel: u64,
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
            ("messages".to_string(), Value::from(messages)),
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
    fn chat_generation_tags_rewritten() {
        assert_eq!(
            rewrite_generation_tags("a{% generation %}b{%- endgeneration -%}c{% generations %}"),
            "a{% with %}b{%- endwith -%}c{% generations %}"
        );
        assert_eq!(rewrite_generation_tags("{%+generation+%}"), "{%+ with +%}");
    }
}
