//! Python's `json.dumps(value, sort_keys=True)` output, byte for byte for the documents a
//! policy holds, so a policy revision computed here equals the one the Python server
//! reports for the same document.

use serde_json::Value;
use std::fmt::Write;

/// Serialises `value` with sorted keys, `", "` and `": "` separators and ASCII escapes.
pub fn dumps_sorted(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value, (", ", ": "));
    out
}

/// `json.dumps(value, sort_keys=True, separators=(",", ":"))`: how the reference server
/// writes a policy to hash it.
pub fn dumps_compact_sorted(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value, (",", ":"));
    out
}

fn write_value(out: &mut String, value: &Value, separators: (&str, &str)) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                crate::pytext::write_float(out, f);
            } else {
                let _ = write!(out, "{n}");
            }
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(separators.0);
                }
                write_value(out, item, separators);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(separators.0);
                }
                write_string(out, key);
                out.push_str(separators.1);
                write_value(out, &map[key], separators);
            }
            out.push('}');
        }
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn matches_python_json_dumps() {
        // Expected strings produced by CPython 3.11: json.dumps(v, sort_keys=True).
        let v = json!({"b": [1, 2.5, true, null], "a": {"z": "é\n", "y": 1.0}});
        assert_eq!(
            dumps_sorted(&v),
            r#"{"a": {"y": 1.0, "z": "\u00e9\n"}, "b": [1, 2.5, true, null]}"#
        );
        assert_eq!(dumps_sorted(&json!(1e-7)), "1e-07");
        assert_eq!(dumps_sorted(&json!(1e16)), "1e+16");
        assert_eq!(dumps_sorted(&json!("😀")), r#""\ud83d\ude00""#);
        assert_eq!(dumps_sorted(&json!({})), "{}");
    }
}
