//! The OpenAI request bodies, read and checked field by field (so an error names the field,
//! as OpenAI's do), the errors themselves, and the tool-call markup of the chat templates.

use serde_json::{json, Map, Value};

/// An error as OpenAI sends it: `{"error": {"message", "type", "param", "code"}}` with an
/// HTTP status.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// A 400 `invalid_request_error` about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::new(400, "invalid_request_error", message)
        }
    }

    pub fn code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

pub type ApiResult<T> = std::result::Result<T, ApiError>;

/// The generation parameters both endpoints share.
#[derive(Debug, Clone)]
pub struct Params {
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub stream: bool,
    pub include_usage: bool,
    /// Keep generating past end-of-sequence tokens (llama.cpp's and vLLM's `ignore_eos`).
    pub ignore_eos: bool,
}

/// A chat request: the messages (each normalized to a JSON object the template reads) and
/// the template's extra arguments (`tools`, `chat_template_kwargs`).
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<Value>,
    pub extra: Map<String, Value>,
    pub tools: bool,
    pub params: Params,
}

/// What a completion request prompts with.
#[derive(Debug, Clone)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    pub echo: bool,
    pub params: Params,
}

/// The body as a JSON object.
pub fn parse_body(bytes: &[u8]) -> ApiResult<Map<String, Value>> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::new(
            400,
            "invalid_request_error",
            "the request body is empty: expected a JSON object",
        ));
    }
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            400,
            "invalid_request_error",
            format!("the request body is not valid JSON: {e}"),
        )
    })?;
    match v {
        Value::Object(o) => Ok(o),
        _ => Err(ApiError::new(
            400,
            "invalid_request_error",
            "the request body must be a JSON object",
        )),
    }
}

/// Reads fields of a body, with errors naming them.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    /// The field, with `null` read as absent (as OpenAI does).
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    fn bool(&self, k: &str) -> ApiResult<Option<bool>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong_type(k, "a boolean", v)),
        }
    }

    fn string(&self, k: &str) -> ApiResult<Option<String>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(wrong_type(k, "a string", v)),
        }
    }

    fn number(&self, k: &str, lo: f64, hi: f64) -> ApiResult<Option<f32>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                if !(lo..=hi).contains(&x) {
                    return Err(ApiError::invalid(
                        k,
                        format!("{k} is {n}: expected a number from {lo} to {hi}"),
                    )
                    .code("invalid_value"));
                }
                Ok(Some(x as f32))
            }
            Some(v) => Err(wrong_type(k, "a number", v)),
        }
    }

    fn integer(&self, k: &str, lo: i128, hi: i128) -> ApiResult<Option<i128>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n
                    .as_i64()
                    .map(i128::from)
                    .or_else(|| n.as_u64().map(i128::from))
                    .or_else(|| {
                        // 5.0 is 5, as OpenAI reads it.
                        n.as_f64()
                            .filter(|f| f.fract() == 0.0 && f.abs() < 1e18)
                            .map(|f| f as i128)
                    });
                match x {
                    Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
                    Some(_) => Err(ApiError::invalid(
                        k,
                        format!("{k} is {n}: expected a whole number from {lo} to {hi}"),
                    )
                    .code("invalid_value")),
                    None => Err(wrong_type(k, "a whole number", &Value::Number(n.clone()))),
                }
            }
            Some(v) => Err(wrong_type(k, "a whole number", v)),
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong_type(k: &str, want: &str, got: &Value) -> ApiError {
    ApiError::invalid(k, format!("{k}: expected {want}, got {}", type_name(got)))
        .code("invalid_type")
}

/// Most stop strings a request may give, and their longest length in bytes.
const MAX_STOPS: usize = 16;
const MAX_STOP_BYTES: usize = 1024;

fn params(f: &Fields) -> ApiResult<Params> {
    let n = f.integer("n", 1, i64::MAX as i128)?;
    if n.is_some_and(|n| n != 1) {
        return Err(
            ApiError::invalid("n", "only n=1 is supported (one choice per request)")
                .code("unsupported_value"),
        );
    }
    if let Some(b) = f.integer("best_of", 1, i64::MAX as i128)? {
        if b != 1 {
            return Err(ApiError::invalid("best_of", "only best_of=1 is supported")
                .code("unsupported_value"));
        }
    }
    for unsupported in ["logprobs", "top_logprobs", "logit_bias", "suffix"] {
        let set = match f.get(unsupported) {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Object(o)) => !o.is_empty(),
            Some(_) => true,
        };
        if set {
            return Err(ApiError::invalid(
                unsupported,
                format!("{unsupported} is not supported by this server"),
            )
            .code("unsupported_parameter"));
        }
    }
    match f.get("response_format") {
        None => {}
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("text") => {}
        Some(Value::Object(_)) => {
            return Err(ApiError::invalid(
                "response_format",
                "only response_format {\"type\": \"text\"} is supported (no JSON mode)",
            )
            .code("unsupported_value"))
        }
        Some(v) => return Err(wrong_type("response_format", "an object", v)),
    }
    let max_completion = f.integer("max_completion_tokens", 1, i64::MAX as i128)?;
    let max_tokens = f.integer("max_tokens", 1, i64::MAX as i128)?;
    let max_tokens = max_completion
        .or(max_tokens)
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| match s {
                Value::String(s) => Ok(s.clone()),
                v => Err(wrong_type("stop", "a string or a list of strings", v)),
            })
            .collect::<ApiResult<Vec<_>>>()?,
        Some(v) => return Err(wrong_type("stop", "a string or a list of strings", v)),
    };
    if stop.len() > MAX_STOPS || stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOPS} stop strings of at most {MAX_STOP_BYTES} bytes"),
        )
        .code("invalid_value"));
    }
    let stop = stop.into_iter().filter(|s| !s.is_empty()).collect();
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o).bool("include_usage")?.unwrap_or(false),
        Some(v) => return Err(wrong_type("stream_options", "an object", v)),
    };
    Ok(Params {
        max_tokens,
        temperature: f.number("temperature", 0.0, 2.0)?.unwrap_or(1.0),
        top_p: match f.number("top_p", 0.0, 1.0)? {
            Some(p) if p <= 0.0 => {
                return Err(
                    ApiError::invalid("top_p", "top_p must be above 0").code("invalid_value")
                )
            }
            p => p.unwrap_or(1.0),
        },
        top_k: f
            .integer("top_k", -1, u32::MAX as i128)?
            .map_or(0, |k| k.max(0) as usize),
        min_p: f.number("min_p", 0.0, 1.0)?.unwrap_or(0.0),
        seed: f
            .integer("seed", i64::MIN as i128, u64::MAX as i128)?
            .map(|s| s as u64),
        stop,
        presence_penalty: f.number("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        frequency_penalty: f.number("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        stream: f.bool("stream")?.unwrap_or(false),
        include_usage,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
    })
}

const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// How assistant tool calls are handed to the template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolStyle {
    /// GLM: `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`; the
    /// template reads `arguments` as a mapping.
    Glm,
    /// DeepSeek V3: `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`; the
    /// template concatenates `arguments` as a string.
    DeepSeek,
    /// The template defines no tool-call markup.
    None,
}

impl ToolStyle {
    /// The markup a template's source uses.
    pub fn of_template(source: &str) -> ToolStyle {
        if source.contains("<arg_key>") && source.contains("<tool_call>") {
            ToolStyle::Glm
        } else if source.contains("tool▁call▁begin") {
            ToolStyle::DeepSeek
        } else {
            ToolStyle::None
        }
    }
}

pub fn chat_request(body: &Map<String, Value>, style: ToolStyle) -> ApiResult<ChatRequest> {
    let f = Fields(body);
    let model = f.string("model")?;
    let list = match f.get("messages") {
        Some(Value::Array(a)) => a,
        Some(v) => return Err(wrong_type("messages", "an array of messages", v)),
        None => {
            return Err(ApiError::invalid("messages", "messages is required")
                .code("missing_required_parameter"))
        }
    };
    if list.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages is empty: at least one message is needed",
        )
        .code("invalid_value"));
    }
    let mut messages = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        messages.push(message(i, m, style)?);
    }
    let mut extra = Map::new();
    let tool_choice_none = matches!(f.get("tool_choice"), Some(Value::String(s)) if s == "none");
    let mut tools = false;
    match f.get("tools") {
        None => {}
        Some(Value::Array(a)) => {
            for (i, t) in a.iter().enumerate() {
                let ok = t
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .is_some_and(Value::is_string);
                if !ok {
                    return Err(ApiError::invalid(
                        &format!("tools[{i}]"),
                        format!("tools[{i}]: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                    )
                    .code("invalid_value"));
                }
            }
            if !a.is_empty() && !tool_choice_none {
                extra.insert("tools".into(), Value::Array(a.clone()));
                tools = true;
            }
        }
        Some(v) => return Err(wrong_type("tools", "an array of tools", v)),
    }
    match f.get("chat_template_kwargs") {
        None => {}
        Some(Value::Object(o)) => {
            for (k, v) in o {
                if k == "messages" || k == "add_generation_prompt" {
                    return Err(ApiError::invalid(
                        "chat_template_kwargs",
                        format!("chat_template_kwargs cannot set {k}"),
                    ));
                }
                extra.insert(k.clone(), v.clone());
            }
        }
        Some(v) => return Err(wrong_type("chat_template_kwargs", "an object", v)),
    }
    if let Some(b) = f.bool("enable_thinking")? {
        extra.insert("enable_thinking".into(), Value::Bool(b));
        extra.insert("thinking".into(), Value::Bool(b));
    }
    Ok(ChatRequest {
        model,
        messages,
        extra,
        tools,
        params: params(&f)?,
    })
}

/// One message, checked and normalized for the template: a list `content` becomes its text,
/// `developer` becomes `system`, and assistant tool calls take the template's shape.
fn message(i: usize, m: &Value, style: ToolStyle) -> ApiResult<Value> {
    let at = format!("messages[{i}]");
    let Value::Object(o) = m else {
        return Err(wrong_type(&at, "an object", m));
    };
    let role = match o.get("role") {
        Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.as_str(),
        Some(Value::String(r)) => {
            return Err(ApiError::invalid(
                &format!("{at}.role"),
                format!(
                    "{at}.role: unknown role '{r}' (expected one of {})",
                    ROLES.join(", ")
                ),
            )
            .code("invalid_value"))
        }
        Some(v) => return Err(wrong_type(&format!("{at}.role"), "a string", v)),
        None => {
            return Err(ApiError::invalid(
                &format!("{at}.role"),
                format!("{at}: a role is required"),
            )
            .code("missing_required_parameter"))
        }
    };
    let has_calls = o
        .get("tool_calls")
        .is_some_and(|c| c.as_array().is_some_and(|a| !a.is_empty()));
    let content = match o.get("content") {
        Some(Value::String(s)) => Value::String(s.clone()),
        None | Some(Value::Null) if role == "assistant" => {
            if has_calls && style == ToolStyle::DeepSeek {
                Value::Null
            } else {
                Value::String(String::new())
            }
        }
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                &format!("{at}.content"),
                format!("{at}: content is required for role {role}"),
            )
            .code("missing_required_parameter"))
        }
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("{at}.content[{j}]"),
                            format!(
                                "{at}.content[{j}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported"
                            ),
                        )
                        .code("invalid_value"))
                    }
                }
            }
            Value::String(text)
        }
        Some(v) => {
            return Err(wrong_type(
                &format!("{at}.content"),
                "a string or a list of text parts",
                v,
            ))
        }
    };
    let mut out = Map::new();
    out.insert(
        "role".into(),
        Value::String(if role == "developer" { "system" } else { role }.into()),
    );
    out.insert("content".into(), content);
    for k in ["name", "tool_call_id", "reasoning_content"] {
        match o.get(k) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                out.insert(k.into(), Value::String(s.clone()));
            }
            Some(v) => return Err(wrong_type(&format!("{at}.{k}"), "a string", v)),
        }
    }
    if has_calls {
        let Some(Value::Array(calls)) = o.get("tool_calls") else {
            return Err(wrong_type(
                &format!("{at}.tool_calls"),
                "an array",
                &o["tool_calls"],
            ));
        };
        let mut shaped = Vec::with_capacity(calls.len());
        for (j, c) in calls.iter().enumerate() {
            let f = c.get("function");
            let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
            let args = f.and_then(|f| f.get("arguments"));
            let (Some(name), Some(args)) = (name, args) else {
                return Err(ApiError::invalid(
                    &format!("{at}.tool_calls[{j}]"),
                    format!("{at}.tool_calls[{j}]: expected {{\"function\": {{\"name\", \"arguments\"}}}}"),
                )
                .code("invalid_value"));
            };
            // OpenAI sends the arguments as a JSON string; GLM's template iterates them.
            let args = match (style, args) {
                (ToolStyle::Glm, Value::String(s)) => {
                    serde_json::from_str::<Value>(s).unwrap_or_else(|_| json!({}))
                }
                (ToolStyle::Glm, v) => v.clone(),
                (_, Value::String(s)) => Value::String(s.clone()),
                (_, v) => Value::String(v.to_string()),
            };
            let mut call = c.as_object().cloned().unwrap_or_default();
            call.insert("function".into(), json!({"name": name, "arguments": args}));
            shaped.push(Value::Object(call));
        }
        out.insert("tool_calls".into(), Value::Array(shaped));
    }
    Ok(Value::Object(out))
}

pub fn completion_request(body: &Map<String, Value>) -> ApiResult<CompletionRequest> {
    let f = Fields(body);
    let model = f.string("model")?;
    let bad = || {
        ApiError::invalid(
            "prompt",
            "prompt: expected a string, a list of one string, a list of token ids, or a list of one list of token ids",
        )
        .code("invalid_type")
    };
    let ids = |a: &[Value]| -> ApiResult<Vec<u32>> {
        a.iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(bad)
            })
            .collect()
    };
    let prompt = match f.get("prompt") {
        None => {
            return Err(ApiError::invalid("prompt", "prompt is required")
                .code("missing_required_parameter"))
        }
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => Prompt::Text(s.clone()),
            [Value::Array(t)] => Prompt::Tokens(ids(t)?),
            a if !a.is_empty() && a.iter().all(Value::is_number) => Prompt::Tokens(ids(a)?),
            a if a.len() > 1 => {
                return Err(ApiError::invalid(
                    "prompt",
                    "a batch of prompts is not supported: send one prompt per request",
                )
                .code("unsupported_value"))
            }
            _ => return Err(bad()),
        },
        Some(_) => return Err(bad()),
    };
    Ok(CompletionRequest {
        model,
        prompt,
        echo: f.bool("echo")?.unwrap_or(false),
        params: params(&f)?,
    })
}

/// A tool call parsed from a reply.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text (what OpenAI's `function.arguments` holds).
    pub arguments: String,
}

impl ToolStyle {
    /// Where the tool-call markup begins.
    pub fn opener(self) -> Option<&'static str> {
        match self {
            ToolStyle::Glm => Some("<tool_call>"),
            ToolStyle::DeepSeek => Some("<｜tool▁calls▁begin｜>"),
            ToolStyle::None => None,
        }
    }

    /// The tool calls in `text` (which starts at the opener), or `None` when it does not
    /// parse.
    pub fn parse(self, text: &str) -> Option<Vec<ToolCall>> {
        match self {
            ToolStyle::Glm => parse_glm(text),
            ToolStyle::DeepSeek => parse_deepseek(text),
            ToolStyle::None => None,
        }
    }
}

fn parse_glm(text: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let body = rest.strip_prefix("<tool_call>")?;
        let end = body.find("</tool_call>")?;
        let (call, after) = (&body[..end], &body[end + "</tool_call>".len()..]);
        let name_end = call.find("<arg_key>").unwrap_or(call.len());
        let name = call[..name_end].trim();
        if name.is_empty() {
            return None;
        }
        let mut args = Map::new();
        let mut a = &call[name_end..];
        while let Some(k) = a.trim_start().strip_prefix("<arg_key>") {
            let ke = k.find("</arg_key>")?;
            let key = k[..ke].trim().to_string();
            let v = k[ke + "</arg_key>".len()..]
                .trim_start()
                .strip_prefix("<arg_value>")?;
            let ve = v.find("</arg_value>")?;
            let raw = &v[..ve];
            // A value the template wrote with tojson is JSON; a string was written as is.
            let value = serde_json::from_str::<Value>(raw)
                .ok()
                .filter(|v| !v.is_string())
                .unwrap_or_else(|| Value::String(raw.to_string()));
            args.insert(key, value);
            a = &v[ve + "</arg_value>".len()..];
        }
        if !a.trim().is_empty() {
            return None;
        }
        calls.push(ToolCall {
            name: name.to_string(),
            arguments: Value::Object(args).to_string(),
        });
        rest = after.trim();
    }
    (!calls.is_empty()).then_some(calls)
}

fn parse_deepseek(text: &str) -> Option<Vec<ToolCall>> {
    let mut rest = text.trim().strip_prefix("<｜tool▁calls▁begin｜>")?;
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix("<｜tool▁calls▁end｜>") {
            let r = r.trim();
            let tail_ok = r.is_empty() || r == "<｜end▁of▁sentence｜>";
            return (tail_ok && !calls.is_empty()).then_some(calls);
        }
        let body = rest.strip_prefix("<｜tool▁call▁begin｜>")?;
        let end = body.find("<｜tool▁call▁end｜>")?;
        let call = &body[..end];
        let (name, args) = call.split_once("<｜tool▁sep｜>")?;
        let args = args.trim();
        // Older V3 templates wrap the arguments in ```json fences.
        let args = args
            .strip_prefix("```json")
            .and_then(|a| a.strip_suffix("```"))
            .map_or(args, str::trim);
        calls.push(ToolCall {
            name: name.trim().to_string(),
            arguments: args.to_string(),
        });
        rest = &body[end + "<｜tool▁call▁end｜>".len()..];
        if rest.trim().is_empty() {
            return (!calls.is_empty()).then_some(calls);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(s: &str) -> Map<String, Value> {
        parse_body(s.as_bytes()).unwrap()
    }

    #[test]
    fn bodies_and_types_are_checked() {
        assert!(parse_body(b"").is_err());
        assert!(parse_body(b"{")
            .unwrap_err()
            .message
            .contains("not valid JSON"));
        assert!(parse_body(b"[1]").is_err());
        let e = chat_request(&body(r#"{"messages": "hi"}"#), ToolStyle::None).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("messages")));
        let e = chat_request(
            &body(r#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#),
            ToolStyle::None,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = chat_request(
            &body(r#"{"messages": [{"role": "user", "content": "x"}], "n": 2}"#),
            ToolStyle::None,
        )
        .unwrap_err();
        assert!(e.message.contains("n=1"), "{}", e.message);
        let e = chat_request(
            &body(r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}"#),
            ToolStyle::None,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("response_format"));
        let e = chat_request(
            &body(r#"{"messages": [{"role": "wizard", "content": "x"}]}"#),
            ToolStyle::None,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let r = chat_request(
            &body(
                r#"{"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                 "stop": "END", "max_completion_tokens": 5, "max_tokens": 9, "seed": -1, "n": 1}"#,
            ),
            ToolStyle::None,
        )
        .unwrap();
        assert_eq!(r.messages[0], json!({"role": "system", "content": "ab"}));
        assert_eq!(r.params.stop, vec!["END".to_string()]);
        assert_eq!(r.params.max_tokens, Some(5));
        assert_eq!(r.params.seed, Some(u64::MAX));
        let c = completion_request(&body(r#"{"prompt": [[1, 2, 3]], "max_tokens": 2.0}"#)).unwrap();
        assert!(matches!(c.prompt, Prompt::Tokens(ref t) if t == &[1, 2, 3]));
        assert_eq!(c.params.max_tokens, Some(2));
        assert!(completion_request(&body(r#"{"prompt": ["a", "b"]}"#)).is_err());
        assert!(completion_request(&body(r#"{"prompt": [-1]}"#)).is_err());
        assert!(completion_request(&body(r#"{"prompt": "a", "max_tokens": 0}"#)).is_err());
    }

    #[test]
    fn tool_calls_parse_in_both_styles() {
        let glm = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>";
        let calls = ToolStyle::Glm.parse(glm).unwrap();
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
            json!({"city": "Paris", "days": 3})
        );
        assert!(ToolStyle::Glm
            .parse("<tool_call>f<arg_key>x</arg_key>")
            .is_none());
        let ds = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let calls = ToolStyle::DeepSeek.parse(ds).unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, "{\"a\": 1}");
        assert_eq!(calls[1].name, "g");
    }

    #[test]
    fn assistant_tool_calls_take_the_template_shape() {
        let m = json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]});
        let g = message(0, &m, ToolStyle::Glm).unwrap();
        assert_eq!(g["tool_calls"][0]["function"]["arguments"], json!({"x": 1}));
        assert_eq!(g["content"], json!(""));
        let d = message(0, &m, ToolStyle::DeepSeek).unwrap();
        assert_eq!(
            d["tool_calls"][0]["function"]["arguments"],
            json!("{\"x\": 1}")
        );
        assert_eq!(d["content"], Value::Null);
    }
}
