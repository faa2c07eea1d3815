//! Python's value semantics for templates: `str()` and `repr()` of values (floats, strings,
//! lists, tuples, dicts), `str.isspace()` / `str.isprintable()`, and the string methods.

use minijinja::value::{Value, ValueKind};
use minijinja::{ErrorKind, State};
use std::fmt::Write as _;

/// Python string methods with Python's whitespace for argument-less strip/lstrip/rstrip; the
/// rest from `minijinja-contrib`'s `pycompat`.
pub(super) fn python_methods(
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
pub(super) fn py_str(
    state: &State,
    value: &Value,
) -> std::result::Result<String, minijinja::Error> {
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
pub(super) fn charge_item(
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
pub(super) fn py_float(f: f64) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
