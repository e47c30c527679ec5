//! The per-endpoint limits and rules a policy may set, in both spellings it may use:
//! this server's own (flat keys on the rule: `timeout_seconds`, `commands: {allow,
//! deny}`) and the reference server's (`limits: {...}`, `params: {...}`). Each key has
//! one meaning; the reference's names are translated to this server's when a rule lands
//! on an endpoint ([`canonical`]), because one of them (`max_bytes`) means the upload
//! limit on an upload and the archive limit on an archive.

use serde_json::{Map, Value};

/// How a value is checked.
#[derive(Clone, Copy)]
pub enum Kind {
    /// A number above 0 (seconds).
    Seconds,
    /// A whole number above 0 (bytes, counts).
    Count,
    /// A byte size: a whole number above 0, or a string such as `5MB` or `1GiB`.
    Size,
    /// A whole number, 0 included (a depth: 0 is the directory itself).
    Depth,
    Switch,
    /// A list of strings.
    Strings,
    /// A list of whole numbers.
    Numbers,
    /// `{allow: [...], deny: [...]}` of strings.
    AllowDeny,
    /// `{allow, deny, read_only, symlinks}`.
    Paths,
    /// `{requests: N, per_seconds: S}`.
    Rate,
}

/// This server's flat knobs (`endpoints.<id>.<knob>`).
pub const OWN: [(&str, Kind); 20] = [
    ("paths", Kind::Paths),
    ("rate_limit", Kind::Rate),
    ("timeout_seconds", Kind::Seconds),
    ("max_duration_seconds", Kind::Seconds),
    ("max_output_bytes", Kind::Count),
    ("max_upload_bytes", Kind::Count),
    ("max_depth", Kind::Depth),
    ("max_files", Kind::Count),
    ("max_bytes", Kind::Count),
    ("overwrite", Kind::Switch),
    ("block_private_networks", Kind::Switch),
    ("allow_private_networks", Kind::Switch),
    ("allow_extensions", Kind::Strings),
    ("deny_extensions", Kind::Strings),
    ("languages", Kind::Strings),
    ("allow_vars", Kind::Strings),
    ("deny_vars", Kind::Strings),
    ("url_allow", Kind::Strings),
    ("url_deny", Kind::Strings),
    ("commands", Kind::AllowDeny),
];

/// The reference's `limits` (`agent_sandbox.server.policy._LIMIT_TYPES`).
pub const LIMITS: [(&str, Kind); 13] = [
    ("max_request_bytes", Kind::Size),
    ("max_bytes", Kind::Size),
    ("max_output_bytes", Kind::Size),
    ("rate_per_minute", Kind::Count),
    ("max_concurrency", Kind::Count),
    ("max_entries", Kind::Count),
    ("max_depth", Kind::Count),
    ("max_results", Kind::Count),
    ("max_files", Kind::Count),
    ("max_processes", Kind::Count),
    ("max_sessions", Kind::Count),
    ("timeout_seconds", Kind::Seconds),
    ("max_duration_seconds", Kind::Seconds),
];

/// The reference's `params` (`_PARAM_TYPES`).
pub const PARAMS: [(&str, Kind); 14] = [
    ("overwrite", Kind::Switch),
    ("allow_extensions", Kind::Strings),
    ("deny_extensions", Kind::Strings),
    ("allow_commands", Kind::Strings),
    ("deny_commands", Kind::Strings),
    ("allowed_signals", Kind::Numbers),
    ("shells", Kind::Strings),
    ("env_deny", Kind::Strings),
    ("allow_vars", Kind::Strings),
    ("deny_vars", Kind::Strings),
    ("languages", Kind::Strings),
    ("url_allow", Kind::Strings),
    ("url_deny", Kind::Strings),
    ("block_private_networks", Kind::Switch),
];

/// Knobs the dispatcher applies to every endpoint, whatever the endpoint enforces.
pub const EVERY_ENDPOINT: [&str; 4] = [
    "rate_limit",
    "rate_per_minute",
    "max_request_bytes",
    "max_concurrency",
];

/// This server's name for the reference's `section.key` on `endpoint`, as
/// (knob, sub-key): `params.allow_commands` is `commands.allow`.
pub fn canonical(endpoint: &str, section: &str, key: &str) -> (&'static str, Option<&'static str>) {
    let name = match (section, key) {
        ("limits", "max_bytes") if matches!(endpoint, "files_upload_stream" | "upload") => {
            "max_upload_bytes"
        }
        ("limits", "max_results") => "max_files",
        ("limits", "timeout_seconds") if endpoint == "files_search" => "max_duration_seconds",
        ("params", "allow_commands") => return ("commands", Some("allow")),
        ("params", "deny_commands") => return ("commands", Some("deny")),
        _ => {
            return (
                LIMITS
                    .iter()
                    .chain(PARAMS.iter())
                    .find(|(name, _)| *name == key)
                    .map(|(name, _)| *name)
                    .unwrap_or("unknown"),
                None,
            )
        }
    };
    (name, None)
}

/// Checks (and normalises: sizes become bytes) one value; `Err` is what must be true.
pub fn check(kind: Kind, value: &Value) -> Result<Value, &'static str> {
    let strings = |v: &Value| v.as_array().is_some_and(|a| a.iter().all(Value::is_string));
    let ok = match kind {
        Kind::Size => return parse_size(value).map(Value::from),
        Kind::Seconds => value.as_f64().is_some_and(|v| v > 0.0) && !value.is_boolean(),
        Kind::Count => value.as_u64().is_some_and(|v| v > 0),
        Kind::Depth => value.as_u64().is_some(),
        Kind::Switch => value.is_boolean(),
        Kind::Strings => strings(value),
        Kind::Numbers => value
            .as_array()
            .is_some_and(|a| a.iter().all(|v| v.as_i64().is_some())),
        Kind::AllowDeny => value.as_object().is_some_and(|m| {
            m.iter()
                .all(|(k, v)| matches!(k.as_str(), "allow" | "deny") && strings(v))
        }),
        Kind::Paths => value.as_object().is_some_and(|m| {
            m.iter().all(|(k, v)| match k.as_str() {
                "allow" | "deny" => {
                    strings(v)
                        && v.as_array().is_some_and(|a| {
                            a.iter().all(|p| !p.as_str().unwrap_or("").contains('\0'))
                        })
                }
                "read_only" => v.is_boolean(),
                "symlinks" => matches!(v.as_str(), Some("within" | "never")),
                _ => false,
            })
        }),
        Kind::Rate => value.as_object().is_some_and(|m| {
            m.len() == 2
                && m.get("requests")
                    .and_then(Value::as_u64)
                    .is_some_and(|n| n > 0)
                && m.get("per_seconds")
                    .and_then(Value::as_f64)
                    .is_some_and(|s| s > 0.0)
        }),
    };
    if ok {
        return Ok(value.clone());
    }
    Err(match kind {
        Kind::Size => unreachable!(),
        Kind::Seconds => "must be a number of seconds above 0",
        Kind::Count => "must be a whole number above 0",
        Kind::Depth => "must be a whole number (0 or more)",
        Kind::Switch => "must be true or false",
        Kind::Strings => "must be a list of strings",
        Kind::Numbers => "must be a list of whole numbers",
        Kind::AllowDeny => "must be {allow: [...], deny: [...]} with lists of strings",
        Kind::Paths => {
            "must be {allow: [...], deny: [...], read_only: true/false, symlinks: within|never} (lists of strings, no NUL)"
        }
        Kind::Rate => {
            "must be {requests: <whole number above 0>, per_seconds: <seconds above 0>}"
        }
    })
}

/// A byte size as the reference reads it: a whole number of bytes, or a number with
/// `B`, `KB`, `MB`, `GB` (powers of 1000) or `KiB`, `MiB`, `GiB` (powers of 1024).
pub fn parse_size(value: &Value) -> Result<u64, &'static str> {
    const WHY: &str = "must be a positive byte size: a whole number, or e.g. '5MB', '1GiB'";
    match value {
        Value::Number(n) => n.as_u64().filter(|n| *n > 0).ok_or(WHY),
        Value::String(text) => {
            let text = text.trim();
            let split = text
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(text.len());
            let (number, unit) = text.split_at(split);
            let number: f64 = number.parse().map_err(|_| WHY)?;
            let unit = match unit.trim().to_ascii_lowercase().as_str() {
                "" | "b" => 1.0,
                "kb" => 1e3,
                "mb" => 1e6,
                "gb" => 1e9,
                "kib" => 1024.0,
                "mib" => 1024.0 * 1024.0,
                "gib" => 1024.0 * 1024.0 * 1024.0,
                _ => return Err(WHY),
            };
            let bytes = (number * unit) as u64;
            (bytes > 0).then_some(bytes).ok_or(WHY)
        }
        _ => Err(WHY),
    }
}

/// Checks a reference `limits` or `params` section; `Err` names the key.
pub fn check_section(section: &str, value: &Value, at: &str) -> Result<Map<String, Value>, String> {
    let table: &[(&str, Kind)] = if section == "limits" {
        &LIMITS
    } else {
        &PARAMS
    };
    let Value::Object(entries) = value else {
        return Err(format!("{at}.{section} must be an object"));
    };
    let mut out = Map::new();
    for (key, value) in entries {
        let Some((_, kind)) = table.iter().find(|(name, _)| name == key) else {
            let known: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "{at}.{section}.{key}: unknown key; allowed: {}",
                known.join(", ")
            ));
        };
        let value = check(*kind, value).map_err(|why| format!("{at}.{section}.{key} {why}"))?;
        out.insert(key.clone(), value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sizes_read_as_the_reference_reads_them() {
        assert_eq!(parse_size(&json!(10)), Ok(10));
        assert_eq!(parse_size(&json!("5MB")), Ok(5_000_000));
        assert_eq!(parse_size(&json!("1GiB")), Ok(1 << 30));
        assert_eq!(parse_size(&json!(" 2 kib ")), Ok(2048));
        assert!(parse_size(&json!(0)).is_err());
        assert!(parse_size(&json!("5 parsecs")).is_err());
        assert!(parse_size(&json!(true)).is_err());
    }

    #[test]
    fn names_land_on_the_endpoint_that_means_them() {
        assert_eq!(
            canonical("files_upload_stream", "limits", "max_bytes").0,
            "max_upload_bytes"
        );
        assert_eq!(
            canonical("files_archive", "limits", "max_bytes").0,
            "max_bytes"
        );
        assert_eq!(
            canonical("files_search", "limits", "max_results").0,
            "max_files"
        );
        assert_eq!(
            canonical("files_search", "limits", "timeout_seconds").0,
            "max_duration_seconds"
        );
        assert_eq!(
            canonical("shell", "params", "deny_commands"),
            ("commands", Some("deny"))
        );
        assert_eq!(
            canonical("process_signal", "params", "allowed_signals").0,
            "allowed_signals"
        );
    }
}
