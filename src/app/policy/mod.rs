//! The policy engine: which endpoint answers, and why. Every endpoint gets exactly one
//! decision, computed once at startup from (most specific first) the policy document's
//! `endpoints.<id>` rule, its `groups` rule, `ABX_SERVER_ENABLED_GROUPS`, and the
//! built-in default (opt-in groups off, the rest on). The decision carries the name of
//! the rule that made it, which `/capabilities`, `/capabilities/check` and the 404 of a
//! disabled endpoint all report. The document format is in `docs/policy.md`.

pub mod presets;
pub mod pydumps;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::api::{EndpointSpec, Group};

/// One `endpoints.<id>` rule of the policy document.
#[derive(Debug, Clone, Default)]
pub struct EndpointRule {
    pub enabled: Option<bool>,
    pub scopes: Option<Vec<String>>,
    /// Per-endpoint limits and rules (`timeout_seconds`, `commands`, ...), validated.
    pub knobs: serde_json::Map<String, Value>,
}

/// Where an identity's token comes from: never the token itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `token_sha256`: the SHA-256 of the token, in hex.
    Digest([u8; 32]),
    /// `token_env`: the name of an environment variable holding the token.
    Env(String),
}

/// One `identities[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityRule {
    pub id: String,
    pub scopes: Vec<String>,
    pub token: TokenSource,
}

/// The loaded policy document (or the empty one).
#[derive(Debug, Clone)]
pub struct Policy {
    pub preset: String,
    /// First 16 hex chars of SHA-256 over the document as Python's
    /// `json.dumps(doc, sort_keys=True)` writes it.
    pub revision: String,
    pub configured: bool,
    /// Group switches, with the document key that set them (for the rule name).
    pub groups: Vec<(Group, bool, String)>,
    pub endpoints: HashMap<String, EndpointRule>,
    pub base_dir: Option<PathBuf>,
    pub identities: Vec<IdentityRule>,
    /// Origins (`scheme://host[:port]`, lower case) whose pages may send requests that
    /// change something; `*` admits every origin (`docs/policy.md`, cross-origin
    /// requests).
    pub allow_origins: Vec<String>,
    pub warnings: Vec<String>,
}

/// What the engine decided for one endpoint.
#[derive(Debug, Clone)]
pub struct Decision {
    pub enabled: bool,
    /// The rule that decided, reported whenever the endpoint is off.
    pub rule: String,
    /// The 404 message for a disabled endpoint.
    pub message: Option<String>,
    /// Scopes required of the caller (the endpoint's own, or the policy's override).
    pub scopes: Vec<String>,
    pub scopes_rule: String,
    /// The endpoint's limits with the policy's knobs on top, as `/capabilities` shows
    /// them.
    pub limits: serde_json::Map<String, Value>,
    /// The knobs the policy set for this endpoint, which its route enforces.
    pub knobs: serde_json::Map<String, Value>,
}

impl Decision {
    /// A whole-number knob (a byte count, a depth), if the policy set it.
    pub fn knob_u64(&self, name: &str) -> Option<u64> {
        self.knobs.get(name).and_then(Value::as_u64)
    }

    /// A number of seconds, if the policy set it.
    pub fn knob_seconds(&self, name: &str) -> Option<f64> {
        self.knobs.get(name).and_then(Value::as_f64)
    }

    /// A list of strings (globs, names) such as `languages` or `commands.allow`, if the
    /// policy set it.
    pub fn knob_list(&self, name: &str) -> Option<Vec<&str>> {
        let mut path = name.split('.');
        let mut value = self.knobs.get(path.next()?)?;
        for key in path {
            value = value.get(key)?;
        }
        value.as_array()?.iter().map(Value::as_str).collect()
    }

    /// A switch, if the policy set it.
    pub fn knob_bool(&self, name: &str) -> Option<bool> {
        self.knobs.get(name).and_then(Value::as_bool)
    }

    /// `rate_limit`: (requests, per seconds), if the policy set it.
    pub fn rate_limit(&self) -> Option<(f64, f64)> {
        let rate = self.knobs.get("rate_limit")?;
        Some((
            rate.get("requests")?.as_u64()? as f64,
            rate.get("per_seconds")?.as_f64()?,
        ))
    }
}

/// How a knob's value is checked.
enum KnobKind {
    /// A number above 0 (seconds).
    Seconds,
    /// A whole number above 0 (bytes, counts).
    Count,
    /// A whole number, 0 included (a depth: 0 is the directory itself).
    Depth,
    Switch,
    /// A list of strings.
    Strings,
    /// `{allow: [...], deny: [...]}` of strings.
    AllowDeny,
    /// `{requests: N, per_seconds: S}`.
    Rate,
}

/// Every per-endpoint knob the document may set; the route of an endpoint enforces the
/// ones that concern it (`docs/policy.md`).
const KNOBS: [(&str, KnobKind); 19] = [
    ("paths", KnobKind::AllowDeny),
    ("rate_limit", KnobKind::Rate),
    ("timeout_seconds", KnobKind::Seconds),
    ("max_duration_seconds", KnobKind::Seconds),
    ("max_output_bytes", KnobKind::Count),
    ("max_upload_bytes", KnobKind::Count),
    ("max_depth", KnobKind::Depth),
    ("max_files", KnobKind::Count),
    ("max_bytes", KnobKind::Count),
    ("overwrite", KnobKind::Switch),
    ("block_private_networks", KnobKind::Switch),
    ("allow_extensions", KnobKind::Strings),
    ("deny_extensions", KnobKind::Strings),
    ("languages", KnobKind::Strings),
    ("allow_vars", KnobKind::Strings),
    ("deny_vars", KnobKind::Strings),
    ("url_allow", KnobKind::Strings),
    ("url_deny", KnobKind::Strings),
    ("commands", KnobKind::AllowDeny),
];

/// Whether `name` is an endpoint-level knob a policy document may set.
#[cfg(test)]
pub(crate) fn is_knob(name: &str) -> bool {
    name == "rate_limit" || KNOBS.iter().any(|(knob, _)| *knob == name)
}

/// Checks one knob's value; `Err` is the message after the key.
fn check_knob(kind: &KnobKind, value: &Value) -> Result<(), &'static str> {
    let strings = |v: &Value| v.as_array().is_some_and(|a| a.iter().all(Value::is_string));
    let ok = match kind {
        KnobKind::Seconds => value.as_f64().is_some_and(|v| v > 0.0),
        KnobKind::Count => value.as_u64().is_some_and(|v| v > 0),
        KnobKind::Depth => value.as_u64().is_some(),
        KnobKind::Switch => value.is_boolean(),
        KnobKind::Strings => strings(value),
        KnobKind::AllowDeny => value.as_object().is_some_and(|m| {
            m.iter()
                .all(|(k, v)| matches!(k.as_str(), "allow" | "deny") && strings(v))
        }),
        KnobKind::Rate => value.as_object().is_some_and(|m| {
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
        return Ok(());
    }
    Err(match kind {
        KnobKind::Seconds => "must be a number of seconds above 0",
        KnobKind::Count => "must be a whole number above 0",
        KnobKind::Depth => "must be a whole number (0 or more)",
        KnobKind::Switch => "must be true or false",
        KnobKind::Strings => "must be a list of strings",
        KnobKind::AllowDeny => "must be {allow: [...], deny: [...]} with lists of strings",
        KnobKind::Rate => {
            "must be {requests: <whole number above 0>, per_seconds: <seconds above 0>}"
        }
    })
}

const KNOWN_KEYS: [&str; 7] = [
    "preset",
    "groups",
    "server",
    "endpoints",
    "base_dir",
    "identities",
    "allow_origins",
];

/// `allow_origins`: a list of origins as a browser sends them (`https://app.example.com`,
/// `http://localhost:3000`), or `*`.
fn parse_origins(value: &Value) -> Result<Vec<String>, String> {
    let why = "allow_origins must be a list of origins (scheme://host[:port], no path) or \"*\"";
    let Value::Array(items) = value else {
        return Err(why.into());
    };
    items
        .iter()
        .map(|item| {
            let origin = item.as_str().ok_or(why)?.trim().to_ascii_lowercase();
            let origin = origin.trim_end_matches('/').to_string();
            let valid = origin == "*"
                || origin.split_once("://").is_some_and(|(scheme, rest)| {
                    !scheme.is_empty() && !rest.is_empty() && !rest.contains('/')
                });
            if valid {
                Ok(origin)
            } else {
                Err(format!("{why}: {item}"))
            }
        })
        .collect()
}

impl Policy {
    /// The environment variables the identities take their tokens from (`token_env`):
    /// secrets, kept from every child.
    pub fn token_env_names(&self) -> Vec<String> {
        self.identities
            .iter()
            .filter_map(|rule| match &rule.token {
                TokenSource::Env(name) => Some(name.clone()),
                TokenSource::Digest(_) => None,
            })
            .collect()
    }

    /// The policy in force when no document is configured.
    pub fn empty() -> Policy {
        Policy::from_value(Value::Object(Default::default()), false).expect("empty policy is valid")
    }

    /// Loads the document at `path` (JSON; see `docs/policy.md`).
    pub fn load(path: &Path) -> Result<Policy, String> {
        let shown = path.display();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("policy {shown}: cannot read it: {e}"))?;
        let mut doc = parse_document(&text).map_err(|e| format!("policy {shown}: {e}"))?;
        if is_template(path) {
            // A template's template.yaml: its `server:` section is the policy.
            doc = match doc.get("server") {
                Some(server @ Value::Object(_)) => server.clone(),
                None | Some(Value::Null) => Value::Object(Default::default()),
                Some(_) => {
                    return Err(format!(
                        "policy {shown}: server (line {}) must be a mapping of policy keys",
                        line_of(&text, "server").unwrap_or(1)
                    ))
                }
            };
        }
        Policy::from_value(doc, true).map_err(|e| match line_of(&text, key_of(&e)) {
            Some(line) => format!("policy {shown}, line {line}: {e}"),
            None => format!("policy {shown}: {e}"),
        })
    }

    /// Builds a policy from a parsed document.
    pub fn from_value(doc: Value, configured: bool) -> Result<Policy, String> {
        let Value::Object(map) = &doc else {
            return Err("the policy document must be a JSON object".into());
        };
        let revision = revision_of(&doc);
        let mut policy = Policy {
            preset: "default".into(),
            revision,
            configured,
            groups: Vec::new(),
            endpoints: HashMap::new(),
            base_dir: None,
            identities: Vec::new(),
            allow_origins: Vec::new(),
            warnings: Vec::new(),
        };
        for key in map.keys() {
            if !KNOWN_KEYS.contains(&key.as_str()) {
                policy.warnings.push(format!(
                    "policy key '{key}' is not understood by this server and was ignored"
                ));
            }
        }
        match map.get("preset") {
            None => {}
            Some(Value::String(s)) if presets::PRESETS.contains(&s.as_str()) => {
                policy.preset = s.clone()
            }
            Some(_) => {
                return Err(format!(
                    "preset must be one of {} (docs/policy.md describes each)",
                    presets::PRESETS.join(", ")
                ))
            }
        }
        match map.get("base_dir") {
            None => {}
            Some(Value::String(s)) if s.starts_with('/') => {
                policy.base_dir = Some(PathBuf::from(s))
            }
            Some(_) => return Err("base_dir must be an absolute path".into()),
        }
        if let Some(groups) = map.get("groups") {
            parse_groups(groups, "groups", &mut policy.groups)?;
        }
        if let Some(server) = map.get("server") {
            let Value::Object(server) = server else {
                return Err("server must be an object".into());
            };
            for (key, value) in server {
                match key.as_str() {
                    "groups" => parse_groups(value, "server.groups", &mut policy.groups)?,
                    other => policy.warnings.push(format!(
                        "policy key 'server.{other}' is not understood by this server and was ignored"
                    )),
                }
            }
        }
        if let Some(endpoints) = map.get("endpoints") {
            let Value::Object(endpoints) = endpoints else {
                return Err("endpoints must be an object of endpoint id to rule".into());
            };
            for (id, rule) in endpoints {
                let Value::Object(rule) = rule else {
                    return Err(format!("endpoints.{id} must be an object"));
                };
                let mut parsed = EndpointRule::default();
                for (key, value) in rule {
                    match (key.as_str(), value) {
                        ("enabled", Value::Bool(b)) => parsed.enabled = Some(*b),
                        ("enabled", _) => return Err(format!("endpoints.{id}.enabled must be true or false")),
                        ("scopes", Value::Array(items)) => {
                            let scopes: Option<Vec<String>> =
                                items.iter().map(|s| s.as_str().map(String::from)).collect();
                            parsed.scopes = Some(
                                scopes.ok_or_else(|| format!("endpoints.{id}.scopes must be a list of strings"))?,
                            );
                        }
                        ("scopes", _) => return Err(format!("endpoints.{id}.scopes must be a list of strings")),
                        (knob, value) if KNOBS.iter().any(|(name, _)| *name == knob) => {
                            let (_, kind) = KNOBS.iter().find(|(name, _)| *name == knob).expect("just found");
                            check_knob(kind, value).map_err(|why| format!("endpoints.{id}.{knob} {why}"))?;
                            parsed.knobs.insert(knob.to_string(), value.clone());
                        }
                        (other, _) => policy.warnings.push(format!(
                            "policy key 'endpoints.{id}.{other}' is not understood by this server and was ignored"
                        )),
                    }
                }
                policy.endpoints.insert(id.clone(), parsed);
            }
        }
        if let Some(identities) = map.get("identities") {
            policy.identities = parse_identities(identities)?;
        }
        if let Some(origins) = map.get("allow_origins") {
            policy.allow_origins = parse_origins(origins)?;
        }
        if policy
            .groups
            .iter()
            .any(|(g, on, _)| *g == Group::Core && !on)
        {
            return Err("the core group cannot be disabled".into());
        }
        Ok(policy)
    }

    /// Checks rules that need the route table, and returns the warnings to publish.
    pub fn validate(&self, endpoints: &[EndpointSpec]) -> Result<Vec<String>, String> {
        let mut warnings = self.warnings.clone();
        for (id, rule) in &self.endpoints {
            match endpoints.iter().find(|e| e.id == *id) {
                None => warnings.push(format!(
                    "policy endpoints.{id} names no endpoint of this server"
                )),
                Some(e) if e.group == Group::Core && rule.enabled == Some(false) => {
                    return Err(format!("endpoints.{id}: core endpoints cannot be disabled"));
                }
                Some(endpoint) => {
                    // Said out loud: a limit that is listed but not applied would read as
                    // a protection that is not there.
                    for knob in rule.knobs.keys() {
                        // The dispatcher applies rate limits to every endpoint.
                        let enforced =
                            knob == "rate_limit" || endpoint.enforces.contains(&knob.as_str());
                        if !enforced {
                            warnings.push(format!(
                                "policy endpoints.{id}.{knob} is accepted but not applied by this build of agent-sandbox (docs/policy.md lists what is)"
                            ));
                        }
                    }
                }
            }
        }
        Ok(warnings)
    }

    /// Decides whether `endpoint` answers, given the opt-in groups enabled by environment.
    pub fn decide(
        &self,
        endpoint: &EndpointSpec,
        unavailable: Option<&str>,
        env_groups: &[Group],
    ) -> Decision {
        self.decide_with(endpoint, unavailable, env_groups, &[])
    }

    /// [`Policy::decide`] with the embedding program's own group switches
    /// (`enable_group` / `disable_group` on its route table, in call order), which rank
    /// below the policy document and the environment and above the defaults.
    pub fn decide_with(
        &self,
        endpoint: &EndpointSpec,
        unavailable: Option<&str>,
        env_groups: &[Group],
        code_groups: &[(Group, bool)],
    ) -> Decision {
        let id = endpoint.id.as_str();
        let group = endpoint.group;
        let (scopes, scopes_rule) = match self.endpoints.get(id).and_then(|r| r.scopes.clone()) {
            Some(scopes) => (scopes, format!("policy:endpoints.{id}.scopes")),
            None => (endpoint.scopes.clone(), format!("default:scopes:{id}")),
        };
        let knobs = self
            .endpoints
            .get(id)
            .map(|rule| rule.knobs.clone())
            .unwrap_or_default();
        let mut limits = endpoint.limits.clone();
        for (name, value) in &knobs {
            limits.insert(name.clone(), value.clone());
        }
        let decided = |enabled: bool, rule: String, message: Option<String>| Decision {
            enabled,
            rule,
            message,
            scopes: scopes.clone(),
            scopes_rule: scopes_rule.clone(),
            limits: limits.clone(),
            knobs: knobs.clone(),
        };
        if group == Group::Core {
            return decided(true, "default:core".into(), None);
        }
        if let Some(reason) = unavailable {
            return decided(
                false,
                "build:unavailable".into(),
                Some(format!("Endpoint '{id}' is not available: {reason}")),
            );
        }
        let g = group.name();
        if let Some(enabled) = self.endpoints.get(id).and_then(|r| r.enabled) {
            let message = (!enabled).then(|| {
                format!("Endpoint '{id}' is disabled by policy rule endpoints.{id}.enabled: false. Set it to true in the policy to enable this endpoint")
            });
            return decided(enabled, format!("policy:endpoints.{id}"), message);
        }
        if let Some((_, enabled, key)) = self.groups.iter().rev().find(|(gr, _, _)| *gr == group) {
            let message = (!enabled).then(|| {
                format!("Endpoint '{id}' is disabled: policy {key} turns group '{g}' off. Enable the group (policy {key}: true) or this endpoint (policy endpoints.{id}.enabled: true)")
            });
            return decided(*enabled, format!("policy:{key}"), message);
        }
        if let Some(enabled) = presets::decide(&self.preset, endpoint) {
            let preset = &self.preset;
            let message = (!enabled).then(|| {
                format!("Endpoint '{id}' is disabled by preset '{preset}'. Enable it with policy endpoints.{id}.enabled: true, or its group with policy groups")
            });
            return decided(enabled, format!("preset:{preset}"), message);
        }
        if env_groups.contains(&group) {
            return decided(true, "env:ABX_SERVER_ENABLED_GROUPS".into(), None);
        }
        if let Some((_, enabled)) = code_groups.iter().rev().find(|(gr, _)| *gr == group) {
            if *enabled {
                return decided(true, format!("code:enable_group:{g}"), None);
            }
            let message = format!(
                "Endpoint '{id}' is disabled: the server's route table turns group '{g}' off (disable_group). Enable the group (policy groups: {{{g}: true}}) or this endpoint (policy endpoints.{id}.enabled: true)"
            );
            return decided(false, format!("code:disable_group:{g}"), Some(message));
        }
        if group.opt_in() {
            let message = format!(
                "Endpoint '{id}' is disabled: group '{g}' is opt-in. Enable the group (ABX_SERVER_ENABLED_GROUPS={g}, policy groups: [{g}]) or this endpoint (policy endpoints.{id}.enabled: true)"
            );
            return decided(false, format!("default:opt-in:{g}"), Some(message));
        }
        decided(true, format!("default:{g}"), None)
    }
}

/// A policy document: YAML (which includes JSON). YAML's own errors carry their line.
const DUPLICATE: &str = "duplicate key ";

/// A document value whose mappings never repeat a key: a repeated key in YAML or JSON
/// is a rule silently dropped (the later one wins), so the loader refuses it.
struct Unique(Value);

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a YAML or JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Unique(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!("{DUPLICATE}'{key}'")));
            }
            let Unique(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// The line (1-based) where `key` is written as a key for the second time, counting from
/// the line where its mapping starts.
fn repeated_key_line(text: &str, key: &str, from_line: usize) -> Option<usize> {
    let quoted = format!("\"{key}\"");
    let mut seen = 0;
    for (index, line) in text.lines().enumerate().skip(from_line.saturating_sub(1)) {
        let mut rest = line;
        while let Some(at) = rest.find(&quoted) {
            rest = &rest[at + quoted.len()..];
            if rest.trim_start().starts_with(':') {
                seen += 1;
                if seen == 2 {
                    return Some(index + 1);
                }
            }
        }
        if line
            .trim_start()
            .strip_prefix(key)
            .is_some_and(|r| r.starts_with(':'))
        {
            seen += 1;
            if seen == 2 {
                return Some(index + 1);
            }
        }
    }
    None
}

fn parse_document(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    let doc: Value = yaml_serde::from_str::<Unique>(text)
        .map(|unique| unique.0)
        .map_err(|e| {
            let e = e.to_string();
            match e.find(DUPLICATE) {
                Some(at) => {
                    // "<path>: duplicate key 'k' at line N column M", N the mapping's
                    // first line: the key is named with the line of its second writing.
                    let rest = &e[at + DUPLICATE.len()..];
                    let key = rest.split('\'').nth(1).unwrap_or_default();
                    let from = rest
                        .split_once(" line ")
                        .and_then(|(_, n)| n.split_whitespace().next()?.parse::<usize>().ok())
                        .unwrap_or(1);
                    let line = repeated_key_line(text, key, from)
                        .map(|n| format!(" at line {n}"))
                        .unwrap_or_default();
                    format!("duplicate key '{key}'{line}: the later one would silently replace the earlier, so neither is taken")
                }
                None => format!("not a YAML or JSON policy document: {e}; see docs/policy.md"),
            }
        })?;
    match doc {
        Value::Object(_) => Ok(doc),
        Value::Null => Ok(Value::Object(Default::default())),
        _ => Err("the policy document must be a mapping of policy keys".into()),
    }
}

/// Whether `path` is a template's `template.yaml`, whose `server:` section is the policy.
pub fn is_template(path: &Path) -> bool {
    matches!(
        path.file_name().and_then(|n| n.to_str()),
        Some("template.yaml" | "template.yml")
    )
}

/// The key path an error message starts with (`endpoints.shell.enabled must be ...`).
fn key_of(message: &str) -> &str {
    message
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_end_matches(':')
}

/// The line (1-based) of the key path `key` (`endpoints.shell.enabled`,
/// `identities[1].id`) in a YAML or JSON text: each segment is looked for as a key after
/// the line of the one before it. `None` when a segment cannot be found.
pub fn line_of(text: &str, key: &str) -> Option<usize> {
    let segments: Vec<&str> = key
        .split(['.', '['])
        .map(|s| s.trim_end_matches(']'))
        .filter(|s| !s.is_empty() && !s.bytes().all(|b| b.is_ascii_digit()))
        .collect();
    if segments.is_empty() {
        return None;
    }
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0;
    let mut found = None;
    for segment in segments {
        let hit = (from..lines.len()).find(|&i| {
            let line = lines[i]
                .trim_start()
                .trim_start_matches(['-', '{', ',', ' ']);
            [
                format!("{segment}:"),
                format!("\"{segment}\":"),
                format!("\"{segment}\" :"),
                format!("'{segment}':"),
            ]
            .iter()
            .any(|k| {
                line.starts_with(k.as_str())
                    || lines[i].contains(&format!(" {k}"))
                    || lines[i].contains(&format!("{{{k}"))
            })
        })?;
        found = Some(hit + 1);
        from = hit;
    }
    found
}

/// `identities`: a list of `{id, scopes, token_sha256 | token_env}`.
fn parse_identities(value: &Value) -> Result<Vec<IdentityRule>, String> {
    let Value::Array(entries) = value else {
        return Err("identities must be a list of {id, scopes, token_sha256 or token_env}".into());
    };
    let mut identities: Vec<IdentityRule> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("identities[{i}]");
        let Value::Object(entry) = entry else {
            return Err(format!("{at} must be an object"));
        };
        let id = match entry.get("id") {
            Some(Value::String(id)) if !id.trim().is_empty() => id.clone(),
            _ => return Err(format!("{at}.id must be a non-empty string")),
        };
        if id == "anonymous" || id == "token" {
            return Err(format!(
                "{at}.id: '{id}' is reserved (the caller without a credential, and the ABX_SERVER_TOKEN holder)"
            ));
        }
        if identities.iter().any(|known| known.id == id) {
            return Err(format!("{at}.id: '{id}' is listed twice"));
        }
        let scopes = match entry.get("scopes") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|s| s.as_str().map(String::from))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| format!("{at}.scopes must be a list of strings"))?,
            Some(_) => return Err(format!("{at}.scopes must be a list of strings")),
        };
        if entry.contains_key("token") {
            return Err(format!(
                "{at}.token: a policy never holds a token itself; store its SHA-256 as token_sha256 (sha256sum of the token) or name an environment variable with token_env"
            ));
        }
        let token = match (entry.get("token_sha256"), entry.get("token_env")) {
            (Some(Value::String(hex)), None) => {
                TokenSource::Digest(parse_digest(hex).ok_or_else(|| {
                    format!("{at}.token_sha256 must be 64 hex digits (the SHA-256 of the token)")
                })?)
            }
            (None, Some(Value::String(name))) if !name.is_empty() => TokenSource::Env(name.clone()),
            (Some(_), Some(_)) => {
                return Err(format!("{at}: give token_sha256 or token_env, not both"))
            }
            _ => {
                return Err(format!(
                    "{at} needs token_sha256 (64 hex digits) or token_env (a variable name)"
                ))
            }
        };
        for key in entry.keys() {
            if !["id", "scopes", "token_sha256", "token_env"].contains(&key.as_str()) {
                return Err(format!(
                    "{at}.{key} is not an identity key (id, scopes, token_sha256, token_env)"
                ));
            }
        }
        identities.push(IdentityRule { id, scopes, token });
    }
    Ok(identities)
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(digest)
}

fn parse_groups(
    value: &Value,
    key: &str,
    out: &mut Vec<(Group, bool, String)>,
) -> Result<(), String> {
    let group = |name: &str| {
        Group::parse(name).ok_or_else(|| {
            format!(
                "{key}: unknown group '{name}' (known: {})",
                Group::ALL.map(Group::name).join(", ")
            )
        })
    };
    match value {
        // A list enables the groups it names.
        Value::Array(names) => {
            for name in names {
                let name = name
                    .as_str()
                    .ok_or_else(|| format!("{key} must list group names"))?;
                out.push((group(name)?, true, format!("{key}.{name}")));
            }
        }
        Value::Object(switches) => {
            for (name, on) in switches {
                let on = on
                    .as_bool()
                    .ok_or_else(|| format!("{key}.{name} must be true or false"))?;
                out.push((group(name)?, on, format!("{key}.{name}")));
            }
        }
        _ => {
            return Err(format!(
                "{key} must be a list of group names or an object of group: true/false"
            ))
        }
    }
    Ok(())
}

/// Revision of a policy document: 16 hex chars of SHA-256 over its canonical text.
pub fn revision_of(doc: &Value) -> String {
    let text = pydumps::dumps_sorted(doc);
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Method;
    use serde_json::json;

    fn ep(id: &str, group: Group) -> EndpointSpec {
        let mut spec = EndpointSpec::new(Method::Get, "/x", group);
        spec.id = id.to_string();
        // What the real declarations say of the ids these tests name (the table
        // itself is pinned by `routes::tests::presets_follow_the_declarations`).
        match id {
            "upload" | "files_mkdir" | "shell" => {
                spec.method = Method::Post;
                spec.effect = crate::api::Effect::Changes;
            }
            "download" | "files_list" => spec.kept_locked_down = true,
            _ => {}
        }
        spec
    }

    #[test]
    fn a_repeated_key_is_refused_with_its_line() {
        let dir = std::env::temp_dir().join(format!("abx-dup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in [
            (
                "p.yaml",
                "endpoints:\n  shell:\n    enabled: false\n  shell:\n    enabled: true\n",
            ),
            (
                "p.json",
                "{\"endpoints\": {\"shell\": {\"enabled\": false}},\n \"endpoints\": {}}",
            ),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            let err = Policy::load(&path).unwrap_err();
            assert!(
                err.contains("duplicate key 'endpoints'") || err.contains("duplicate key 'shell'"),
                "{err}"
            );
            assert!(err.contains("line"), "{err}");
        }
        let path = dir.join("ok.yaml");
        std::fs::write(
            &path,
            "endpoints:\n  shell: {enabled: false}\n  shell_stream: {enabled: false}\n",
        )
        .unwrap();
        assert!(Policy::load(&path).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn presets_rank_below_the_documents_own_rules() {
        let locked = Policy::from_value(json!({"preset": "locked-down", "groups": {"process": true}, "endpoints": {"upload": {"enabled": true}}}), true).unwrap();
        let d = |p: &Policy, id: &str, g: Group| {
            let decision = p.decide(&ep(id, g), None, &[Group::DevTools]);
            (decision.enabled, decision.rule)
        };
        assert_eq!(
            d(&locked, "download", Group::FileOps),
            (true, "preset:locked-down".into())
        );
        assert_eq!(
            d(&locked, "files_mkdir", Group::FileOps),
            (false, "preset:locked-down".into())
        );
        assert_eq!(
            d(&locked, "upload", Group::FileOps),
            (true, "policy:endpoints.upload".into())
        );
        assert_eq!(
            d(&locked, "shell", Group::Process),
            (true, "policy:groups.process".into())
        );
        assert_eq!(
            d(&locked, "code_run", Group::DevTools),
            (false, "preset:locked-down".into()),
            "the preset beats the environment"
        );
        assert_eq!(
            d(&locked, "health", Group::Core),
            (true, "default:core".into())
        );
        let read_only = Policy::from_value(json!({"preset": "read-only"}), true).unwrap();
        assert_eq!(
            d(&read_only, "files_list", Group::FileOps),
            (true, "default:file_ops".into())
        );
        assert_eq!(
            d(&read_only, "upload", Group::FileOps),
            (false, "preset:read-only".into())
        );
        let mut search = ep("files_search", Group::FileOps);
        search.method = Method::Post;
        assert!(
            read_only.decide(&search, None, &[]).enabled,
            "a read that takes a body"
        );
        let custom = EndpointSpec::new(Method::Post, "/custom", Group::Commands);
        assert!(!read_only.decide(&custom, None, &[]).enabled);
        assert!(Policy::from_value(json!({"preset": "lenient"}), true).is_err());
    }

    #[test]
    fn yaml_documents_templates_and_error_lines() {
        let dir = std::env::temp_dir().join(format!("abx-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let yaml = dir.join("policy.yaml");
        std::fs::write(&yaml, "# comment\npreset: read-only\ngroups: [dev_tools]\nendpoints:\n  shell:\n    enabled: true\n").unwrap();
        let p = Policy::load(&yaml).unwrap();
        assert_eq!(p.preset, "read-only");
        assert_eq!(p.endpoints["shell"].enabled, Some(true));
        std::fs::write(
            &yaml,
            "endpoints:\n  shell:\n    scopes: x\n  code_run:\n    enabled: maybe\n",
        )
        .unwrap();
        let err = Policy::load(&yaml).unwrap_err();
        assert!(
            err.contains("line 3: endpoints.shell.scopes must be a list"),
            "{err}"
        );
        let json_doc = dir.join("policy.json");
        std::fs::write(
            &json_doc,
            "{\n  \"groups\": {\n    \"core\": false\n  }\n}\n",
        )
        .unwrap();
        let err = Policy::load(&json_doc).unwrap_err();
        assert!(err.contains("core group cannot be disabled"), "{err}");
        std::fs::write(
            &json_doc,
            "{\"identities\": [{\"id\": \"a\", \"token_sha256\": \"00\"}]}",
        )
        .unwrap();
        let err = Policy::load(&json_doc).unwrap_err();
        assert!(
            err.contains("line 1: identities[0].token_sha256 must be 64 hex digits"),
            "{err}"
        );
        let template = dir.join("template.yaml");
        std::fs::write(
            &template,
            "name: t\nports: [9000, 9001]\nserver:\n  groups: [agents]\n  preset: locked-down\n",
        )
        .unwrap();
        let p = Policy::load(&template).unwrap();
        assert_eq!(p.preset, "locked-down");
        assert!(p.groups.iter().any(|(g, on, _)| *g == Group::Agents && *on));
        std::fs::write(&template, "name: t\n").unwrap();
        assert_eq!(
            Policy::load(&template).unwrap().preset,
            "default",
            "no server: section"
        );
        assert_eq!(line_of("a:\n  b:\n    c: 1\n", "a.b.c"), Some(3));
        assert_eq!(line_of("a: 1\n", "z"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A document, an endpoint, why the build lacks it, the environment's groups, the
    /// program's group switches; then the expected state and rule.
    type Case<'a> = (
        Value,
        &'a EndpointSpec,
        Option<&'a str>,
        &'a [Group],
        &'a [(Group, bool)],
        bool,
        &'a str,
    );

    /// Every rule name, from a table of documents × endpoints × switches: the most
    /// specific layer that applies decides, and names itself.
    #[test]
    fn every_rule_name_from_a_table() {
        let shell = ep("shell", Group::Process);
        let code_run = ep("code_run", Group::DevTools);
        let upload = ep("upload", Group::FileOps);
        let cases: [Case<'_>; 11] = [
            (
                json!({}),
                &ep("health", Group::Core),
                None,
                &[],
                &[],
                true,
                "default:core",
            ),
            (
                json!({"endpoints": {"shell": {"enabled": true}}}),
                &shell,
                Some("not built"),
                &[],
                &[],
                false,
                "build:unavailable",
            ),
            (
                json!({"endpoints": {"shell": {"enabled": false}}, "groups": {"process": true}}),
                &shell,
                None,
                &[],
                &[],
                false,
                "policy:endpoints.shell",
            ),
            (
                json!({"groups": {"process": false}}),
                &shell,
                None,
                &[],
                &[(Group::Process, true)],
                false,
                "policy:groups.process",
            ),
            (
                json!({"server": {"groups": ["dev_tools"]}}),
                &code_run,
                None,
                &[],
                &[],
                true,
                "policy:server.groups.dev_tools",
            ),
            (
                json!({"preset": "read-only"}),
                &upload,
                None,
                &[],
                &[(Group::FileOps, true)],
                false,
                "preset:read-only",
            ),
            (
                json!({}),
                &code_run,
                None,
                &[Group::DevTools],
                &[(Group::DevTools, false)],
                true,
                "env:ABX_SERVER_ENABLED_GROUPS",
            ),
            (
                json!({}),
                &code_run,
                None,
                &[],
                &[(Group::DevTools, true)],
                true,
                "code:enable_group:dev_tools",
            ),
            (
                json!({}),
                &shell,
                None,
                &[],
                &[(Group::Process, true), (Group::Process, false)],
                false,
                "code:disable_group:process",
            ),
            (
                json!({}),
                &code_run,
                None,
                &[],
                &[],
                false,
                "default:opt-in:dev_tools",
            ),
            (json!({}), &upload, None, &[], &[], true, "default:file_ops"),
        ];
        for (doc, endpoint, unavailable, env, code, enabled, rule) in cases {
            let policy = Policy::from_value(doc.clone(), true).unwrap();
            let decision = policy.decide_with(endpoint, unavailable, env, code);
            assert_eq!(
                (decision.enabled, decision.rule.as_str()),
                (enabled, rule),
                "{doc} {}",
                endpoint.id
            );
            assert_eq!(
                decision.message.is_some(),
                !enabled,
                "a refusal says why: {rule}"
            );
        }
    }

    proptest::proptest! {
        /// Arbitrary text, and arbitrary JSON-shaped documents with policy keys at
        /// random places, load to a policy or an error: never a panic.
        #[test]
        fn the_loader_never_panics_on_any_text(text in ".{0,400}") {
            if let Ok(doc) = parse_document(&text) {
                let _ = Policy::from_value(doc, true);
            }
            let _ = line_of(&text, "endpoints.shell.enabled");
        }

        #[test]
        fn the_loader_never_panics_on_any_shape(
            keys in proptest::collection::vec("(preset|groups|endpoints|identities|server|shell|enabled|scopes|commands|allow|deny|rate_limit|requests|per_seconds|timeout_seconds|paths|[a-z_]{1,8})", 1..6),
            leaf in "(true|false|null|0|-1|1e400|\\[\\]|\\{\\}|\"x\"|\\[\"rm\"\\])",
        ) {
            let mut doc = leaf.clone();
            for key in keys.iter().rev() {
                doc = format!("{{\"{key}\": {doc}}}");
            }
            if let Ok(value) = parse_document(&doc) {
                if let Ok(policy) = Policy::from_value(value, true) {
                    let _ = policy.validate(&[ep("shell", Group::Process)]);
                    let _ = policy.decide(&ep("shell", Group::Process), None, &[]);
                }
            }
        }
    }

    #[test]
    fn empty_policy_revision_is_the_hash_of_an_empty_object() {
        let p = Policy::empty();
        assert!(!p.configured);
        assert_eq!(p.preset, "default");
        // sha256("{}") = 44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a
        assert_eq!(p.revision, "44136fa355b3678a");
    }

    #[test]
    fn defaults_enable_all_but_opt_in_groups() {
        let p = Policy::empty();
        let d = p.decide(&ep("code_run", Group::DevTools), None, &[]);
        assert!(!d.enabled);
        assert_eq!(d.rule, "default:opt-in:dev_tools");
        assert_eq!(
            d.message.unwrap(),
            "Endpoint 'code_run' is disabled: group 'dev_tools' is opt-in. Enable the group (ABX_SERVER_ENABLED_GROUPS=dev_tools, policy groups: [dev_tools]) or this endpoint (policy endpoints.code_run.enabled: true)"
        );
        assert!(p.decide(&ep("shell", Group::Process), None, &[]).enabled);
        assert!(
            p.decide(&ep("code_run", Group::DevTools), None, &[Group::DevTools])
                .enabled
        );
    }

    #[test]
    fn endpoint_rule_beats_group_rule_beats_env() {
        let p = Policy::from_value(
            json!({"groups": {"process": false, "dev_tools": true},
                   "endpoints": {"process_list": {"enabled": true}, "code_run": {"enabled": false}}}),
            true,
        )
        .unwrap();
        let d = p.decide(&ep("shell", Group::Process), None, &[]);
        assert_eq!(
            (d.enabled, d.rule.as_str()),
            (false, "policy:groups.process")
        );
        let d = p.decide(&ep("process_list", Group::Process), None, &[]);
        assert_eq!(
            (d.enabled, d.rule.as_str()),
            (true, "policy:endpoints.process_list")
        );
        let d = p.decide(&ep("code_run", Group::DevTools), None, &[Group::DevTools]);
        assert_eq!(
            (d.enabled, d.rule.as_str()),
            (false, "policy:endpoints.code_run")
        );
        let d = p.decide(&ep("git_status", Group::DevTools), None, &[]);
        assert!(d.enabled);
    }

    #[test]
    fn server_groups_list_enables() {
        let p = Policy::from_value(json!({"server": {"groups": ["agents"]}}), true).unwrap();
        let d = p.decide(&ep("agents_x", Group::Agents), None, &[]);
        assert_eq!(
            (d.enabled, d.rule.as_str()),
            (true, "policy:server.groups.agents")
        );
    }

    #[test]
    fn core_cannot_be_disabled_and_bad_documents_fail() {
        assert!(Policy::from_value(json!({"groups": {"core": false}}), true).is_err());
        assert!(Policy::from_value(json!({"groups": ["nope"]}), true).is_err());
        assert!(Policy::from_value(json!([1]), true).is_err());
        let p =
            Policy::from_value(json!({"endpoints": {"health": {"enabled": false}}}), true).unwrap();
        assert!(p.validate(&[ep("health", Group::Core)]).is_err());
    }

    #[test]
    fn unknown_keys_are_warnings() {
        let p = Policy::from_value(json!({"frobnicate": 1, "preset": "read-only"}), true).unwrap();
        assert_eq!(p.preset, "read-only");
        assert_eq!(p.warnings.len(), 1);
        assert_ne!(p.revision, Policy::empty().revision);
    }
}
