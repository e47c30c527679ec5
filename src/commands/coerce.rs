//! A command's arguments from a JSON body, as the Python server binds them: each
//! declared argument that is present is coerced to its type with Python's own rules
//! (`int(v)`, `float(v)`, a boolean word, `str(v)`), an omitted one takes its default
//! unless that default is `None`, and a missing required one is refused. Fields the
//! command does not declare are ignored, as Python ignores them.
//!
//! The error messages are Python's, so a caller sees the same text from either server:
//! `Invalid value for count: invalid literal for int() with base 10: 'x'`.

use serde_json::{Map, Number, Value};

use super::{ArgType, CommandArg};
use crate::pytext::{str_of, str_repr, write_repr};

fn repr_of(value: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, value);
    out
}

/// An argument the caller got wrong: the message names it.
#[derive(Debug, PartialEq)]
pub struct ArgError(pub String);

/// How omitted arguments are filled in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Defaults {
    /// With their registered defaults (a Rust command).
    Apply,
    /// Not at all: the implementation applies its own, original objects (a Python
    /// command's default may be a tuple or a `Path`, which JSON would have changed).
    Leave,
}

/// Binds `body` to `args`: the keyword arguments the command is called with.
pub fn bind(
    args: &[CommandArg],
    body: &Map<String, Value>,
    defaults: Defaults,
) -> Result<Map<String, Value>, ArgError> {
    let mut bound = Map::new();
    for arg in args {
        match body.get(&arg.name) {
            Some(value) => {
                let value = coerce(value, arg.kind)
                    .map_err(|why| ArgError(format!("Invalid value for {}: {why}", arg.name)))?;
                bound.insert(arg.name.clone(), value);
            }
            None if arg.required => {
                return Err(ArgError(format!("Missing required argument: {}", arg.name)));
            }
            None if defaults == Defaults::Apply && !arg.default.is_null() => {
                bound.insert(arg.name.clone(), arg.default.clone());
            }
            None => {}
        }
    }
    Ok(bound)
}

/// One value coerced to `kind`; the error is Python's exception message.
pub fn coerce(value: &Value, kind: ArgType) -> Result<Value, String> {
    match kind {
        ArgType::String => Ok(Value::String(str_of(value))),
        ArgType::Integer => to_int(value),
        ArgType::Float => to_float(value).map(|f| {
            // Finite by construction: to_float refuses what JSON cannot carry.
            Value::Number(Number::from_f64(f).unwrap_or_else(|| Number::from(0)))
        }),
        ArgType::Boolean => {
            let word = str_of(value).to_lowercase();
            match word.as_str() {
                "true" | "yes" | "1" => Ok(Value::Bool(true)),
                "false" | "no" | "0" => Ok(Value::Bool(false)),
                _ => Err(format!(
                    "Invalid boolean: {} (use true/false, yes/no or 1/0)",
                    repr_of(value)
                )),
            }
        }
    }
}

/// Python's type name of a JSON value, for `TypeError` messages.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// `int(value)`: integers as they are, floats truncated toward zero, booleans as 0/1,
/// strings parsed as base-10 literals (surrounding whitespace, a sign, and underscores
/// between digits allowed). A result outside 64 bits is refused: the value could not
/// travel on as a JSON integer.
fn to_int(value: &Value) -> Result<Value, String> {
    let out_of_range = || "integer out of the 64-bit range".to_string();
    match value {
        Value::Bool(b) => Ok(Value::from(i64::from(*b))),
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(0.0).trunc();
            if (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f) {
                Ok(Value::from(f as i64))
            } else {
                Err(out_of_range())
            }
        }
        Value::Number(n) => Ok(Value::Number(n.clone())),
        Value::String(s) => {
            let invalid = || format!("invalid literal for int() with base 10: {}", str_repr(s));
            let trimmed = s.trim();
            let (negative, digits) = match trimmed.as_bytes().first() {
                Some(b'-') => (true, &trimmed[1..]),
                Some(b'+') => (false, &trimmed[1..]),
                _ => (false, trimmed),
            };
            let digits = without_digit_underscores(digits).ok_or_else(invalid)?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            let magnitude: u64 = digits.parse().map_err(|_| out_of_range())?;
            if negative {
                0i64.checked_sub_unsigned(magnitude)
                    .map(Value::from)
                    .ok_or_else(out_of_range)
            } else {
                Ok(Value::from(magnitude))
            }
        }
        other => Err(format!(
            "int() argument must be a string, a bytes-like object or a real number, not '{}'",
            type_name(other)
        )),
    }
}

/// `float(value)`, refusing infinities and NaN: Python accepts `"inf"` and `"nan"`, but
/// JSON cannot carry them to the command or back.
fn to_float(value: &Value) -> Result<f64, String> {
    let parsed = match value {
        Value::Bool(b) => f64::from(u8::from(*b)),
        Value::Number(n) => n.as_f64().unwrap_or(0.0),
        Value::String(s) => {
            let invalid = || format!("could not convert string to float: {}", str_repr(s));
            let text = without_digit_underscores(s.trim()).ok_or_else(invalid)?;
            // Rust accepts the same literals as Python's float() (decimal, exponent,
            // inf, infinity, nan, any case), apart from underscores, handled above.
            text.parse::<f64>().map_err(|_| invalid())?
        }
        other => {
            return Err(format!(
                "float() argument must be a string or a real number, not '{}'",
                type_name(other)
            ))
        }
    };
    if parsed.is_finite() {
        Ok(parsed)
    } else {
        Err(format!(
            "{} is not a finite number (JSON cannot carry it)",
            str_repr(&str_of(value))
        ))
    }
}

/// Removes underscores that sit between two digits, as Python's numeric literals allow;
/// `None` if any underscore sits elsewhere.
fn without_digit_underscores(text: &str) -> Option<String> {
    if !text.contains('_') {
        return Some(text.to_string());
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'_' {
            let before = i > 0 && bytes[i - 1].is_ascii_digit();
            let after = bytes.get(i + 1).is_some_and(u8::is_ascii_digit);
            if !(before && after) {
                return None;
            }
        } else {
            out.push(b as char);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn arg(name: &str, kind: ArgType, default: Value) -> CommandArg {
        CommandArg {
            name: name.into(),
            kind,
            required: false,
            default,
            description: String::new(),
        }
    }

    #[test]
    fn integers_follow_python_int() {
        let int = |v: Value| coerce(&v, ArgType::Integer);
        assert_eq!(int(json!(5)), Ok(json!(5)));
        assert_eq!(int(json!(2.9)), Ok(json!(2)));
        assert_eq!(int(json!(-2.9)), Ok(json!(-2)));
        assert_eq!(int(json!(true)), Ok(json!(1)));
        assert_eq!(int(json!(" 42\n")), Ok(json!(42)));
        assert_eq!(int(json!("+7")), Ok(json!(7)));
        assert_eq!(int(json!("-1_000")), Ok(json!(-1000)));
        assert_eq!(int(json!("007")), Ok(json!(7)));
        assert_eq!(int(json!("-9223372036854775808")), Ok(json!(i64::MIN)));
        assert_eq!(
            int(json!("3.5")),
            Err("invalid literal for int() with base 10: '3.5'".into())
        );
        assert!(int(json!("1__0")).is_err());
        assert!(int(json!("_1")).is_err());
        assert!(int(json!("")).is_err());
        assert!(int(json!("-")).is_err());
        assert_eq!(
            int(json!(null)),
            Err("int() argument must be a string, a bytes-like object or a real number, not 'NoneType'".into())
        );
        assert!(int(json!([1])).unwrap_err().ends_with("not 'list'"));
        assert!(int(json!("99999999999999999999")).is_err());
        assert!(int(json!(1e300)).is_err());
    }

    #[test]
    fn floats_follow_python_float() {
        let float = |v: Value| coerce(&v, ArgType::Float);
        assert_eq!(float(json!(2)), Ok(json!(2.0)));
        assert_eq!(float(json!("2.5")), Ok(json!(2.5)));
        assert_eq!(float(json!(" 1e3 ")), Ok(json!(1000.0)));
        assert_eq!(float(json!("1_000.5")), Ok(json!(1000.5)));
        assert_eq!(float(json!(".5")), Ok(json!(0.5)));
        assert_eq!(float(json!(false)), Ok(json!(0.0)));
        assert_eq!(
            float(json!("abc")),
            Err("could not convert string to float: 'abc'".into())
        );
        assert!(float(json!("nan"))
            .unwrap_err()
            .contains("not a finite number"));
        assert!(float(json!("-Infinity")).is_err());
        assert!(float(json!("1e999")).is_err());
        assert!(float(json!({})).unwrap_err().ends_with("not 'dict'"));
    }

    #[test]
    fn booleans_take_six_words_in_any_case() {
        let boolean = |v: Value| coerce(&v, ArgType::Boolean);
        for yes in [
            json!(true),
            json!("TRUE"),
            json!("Yes"),
            json!(1),
            json!("1"),
        ] {
            assert_eq!(boolean(yes), Ok(json!(true)));
        }
        for no in [
            json!(false),
            json!("false"),
            json!("NO"),
            json!(0),
            json!("0"),
        ] {
            assert_eq!(boolean(no), Ok(json!(false)));
        }
        for bad in [
            json!("maybe"),
            json!(1.0),
            json!(null),
            json!(2),
            json!(" true"),
        ] {
            assert!(boolean(bad).unwrap_err().starts_with("Invalid boolean"));
        }
    }

    #[test]
    fn strings_are_python_str() {
        let string = |v: Value| coerce(&v, ArgType::String);
        assert_eq!(string(json!(5)), Ok(json!("5")));
        assert_eq!(string(json!(null)), Ok(json!("None")));
        assert_eq!(string(json!([true])), Ok(json!("[True]")));
    }

    #[test]
    fn binding_applies_defaults_only_when_omitted_and_not_none() {
        let args = vec![
            arg("name", ArgType::String, json!("World")),
            arg("count", ArgType::Integer, json!(null)),
            CommandArg {
                required: true,
                ..arg("must", ArgType::Boolean, Value::Null)
            },
        ];
        let body = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            Value::Object(
                bind(
                    &args,
                    &body(json!({"must": "yes", "extra": 1})),
                    Defaults::Apply
                )
                .unwrap()
            ),
            json!({"name": "World", "must": true}),
            "a None default is not passed; unknown fields are ignored"
        );
        assert_eq!(
            Value::Object(
                bind(
                    &args,
                    &body(json!({"must": 0, "name": null, "count": "3"})),
                    Defaults::Apply
                )
                .unwrap()
            ),
            json!({"name": "None", "count": 3, "must": false}),
            "a present null is coerced, not replaced by the default"
        );
        assert_eq!(
            Value::Object(bind(&args, &body(json!({"must": 1})), Defaults::Leave).unwrap()),
            json!({"must": true}),
            "Python applies its own defaults"
        );
        assert_eq!(
            bind(&args, &body(json!({})), Defaults::Apply),
            Err(ArgError("Missing required argument: must".into()))
        );
        assert_eq!(
            bind(
                &args,
                &body(json!({"must": true, "count": "x"})),
                Defaults::Apply
            ),
            Err(ArgError(
                "Invalid value for count: invalid literal for int() with base 10: 'x'".into()
            ))
        );
    }
}
