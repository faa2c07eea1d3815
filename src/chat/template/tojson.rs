//! transformers' `tojson` filter: Python's `json.dumps` of template values.

use super::python::{charge_item, py_float};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{ErrorKind, State};
use std::fmt::Write as _;

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`; the first three arguments by position or by name,
/// `sort_keys` by name.
pub(super) fn tojson(
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
