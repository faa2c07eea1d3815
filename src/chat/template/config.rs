//! The template and the named special tokens from the text of `tokenizer_config.json`.

use crate::error::{Error, Result};

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

pub(super) fn special_tokens(
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

pub(super) fn default_of_list(list: &[serde_json::Value]) -> Result<String> {
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

pub(super) fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}
