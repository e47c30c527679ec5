//! Python's text forms of JSON values, for the places the contract promises Python
//! behaviour: `str(value)` (a command's string argument, a `POST /env` value) and
//! `repr` of floats and strings inside it. Values arrive as JSON, so only the types
//! `json.loads` produces matter: `None`, `bool`, `int`, `float`, `str`, `list`, `dict`.

use serde_json::Value;
use std::fmt::Write;

/// `str(value)` for a value `json.loads` produced: a string is itself, everything else
/// is its `repr` (`None`, `True`, `1.0`, `['a', 1]`, `{'k': None}`).
pub fn str_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => {
            let mut out = String::new();
            write_repr(&mut out, other);
            out
        }
    }
}

/// `repr(value)` appended to `out`.
pub fn write_repr(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        Value::Number(n) => match n.as_f64().filter(|_| n.is_f64()) {
            Some(f) => write_float(out, f),
            None => {
                let _ = write!(out, "{n}");
            }
        },
        Value::String(s) => write_str_repr(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str_repr(out, key);
                out.push_str(": ");
                write_repr(out, item);
            }
            out.push('}');
        }
    }
}

/// Python's float repr: shortest round-trip digits, `1.0` for integral values, and
/// exponent form (`1e-07`, `1e+16`) outside [1e-4, 1e16).
pub fn write_float(out: &mut String, f: f64) {
    let abs = f.abs();
    if f == f.trunc() && abs < 1e16 {
        let _ = write!(out, "{f:.1}");
    } else if (1e-4..1e16).contains(&abs) {
        let _ = write!(out, "{f}");
    } else {
        let text = format!("{f:e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let exponent: i32 = exponent.parse().unwrap_or(0);
        let sign = if exponent < 0 { '-' } else { '+' };
        let _ = write!(out, "{mantissa}e{sign}{:02}", exponent.abs());
    }
}

/// `repr(s)`: single quotes unless the text holds a single quote and no double one,
/// backslash escapes for the quote, `\\`, `\n`, `\r`, `\t`, and `\x`/`\u`/`\U` escapes
/// for characters Python does not print.
pub fn str_repr(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    write_str_repr(&mut out, s);
    out
}

fn write_str_repr(out: &mut String, s: &str) {
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
            c if !is_printable(c) => {
                let code = c as u32;
                let _ = if code < 0x100 {
                    write!(out, "\\x{code:02x}")
                } else if code < 0x10000 {
                    write!(out, "\\u{code:04x}")
                } else {
                    write!(out, "\\U{code:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for one character, exactly for Latin-1 and for the
/// separators and format characters that occur in practice; other code points are
/// treated as printable (Python would escape unassigned and private-use ones too).
fn is_printable(c: char) -> bool {
    let code = c as u32;
    !matches!(code,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad
        | 0x1680 | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f
        | 0x3000 | 0xd800..=0xdfff | 0xfeff | 0xfff9..=0xfffb
        | 0xe000..=0xf8ff | 0xf0000..=0x10ffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn str_matches_python() {
        // Expected strings are what CPython 3.11 prints for str(json.loads(text)).
        assert_eq!(str_of(&json!("plain")), "plain");
        assert_eq!(str_of(&json!(null)), "None");
        assert_eq!(str_of(&json!(true)), "True");
        assert_eq!(str_of(&json!(7)), "7");
        assert_eq!(str_of(&json!(-7)), "-7");
        assert_eq!(str_of(&json!(2.5)), "2.5");
        assert_eq!(str_of(&json!(3.0)), "3.0");
        assert_eq!(str_of(&json!(1e16)), "1e+16");
        assert_eq!(str_of(&json!(1.5e-7)), "1.5e-07");
        assert_eq!(
            str_of(&json!({"a": [1, "x", null], "b": {"c": false}})),
            "{'a': [1, 'x', None], 'b': {'c': False}}"
        );
        assert_eq!(str_of(&json!(["it's"])), r#"["it's"]"#);
        assert_eq!(str_of(&json!(["it's \"q\""])), r#"['it\'s "q"']"#);
        assert_eq!(
            str_of(&json!(["a\nb\\\t\u{7}é\u{a0}😀"])),
            r"['a\nb\\\t\x07é\xa0😀']"
        );
        assert_eq!(str_of(&json!(["\u{2028}\u{feff}"])), r"['\u2028\ufeff']");
    }
}
