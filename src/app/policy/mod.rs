//! The policy engine: which endpoint answers, to whom, and under which limits. Every
//! endpoint gets exactly one decision, computed once at startup (and at each reload)
//! by merging rule layers as the reference server does ([`layers`]): the built-in
//! defaults, the program's group switches, the preset, the policy document and
//! `ABX_SERVER_ENABLED_GROUPS`. The decision carries the name of the rule that made it,
//! which `/capabilities`, `/capabilities/check` and the 404 of a disabled endpoint all
//! report.
//!
//! A document may be written in the reference server's schema (`version`, `preset`,
//! `base_dir`, `groups`, `defaults`, `auth`, `endpoints` with `limits`, `params`,
//! `paths`, `audit`, `description`) or in this server's (`identities`, `server`,
//! `allow_origins`, flat knobs on a rule), or both where each key still has one
//! meaning; a key neither knows stops the server. The format is in `docs/policy.md`.

pub mod knobs;
pub mod layers;
pub mod presets;
pub mod pydumps;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::api::{EndpointSpec, Group};
pub use layers::{EndpointRule, Layer, Selector};
use layers::{RANK_CODE, RANK_DEFAULT, RANK_ENV, RANK_POLICY};

/// Where an identity's token comes from: never the token itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `token_sha256`: the SHA-256 of the token, in hex.
    Digest([u8; 32]),
    /// `token_env`: the name of an environment variable holding the token.
    Env(String),
}

/// One `auth.tokens[]` (or `identities[]`) entry.
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
    /// The preset's rules and the document's own.
    pub layers: Vec<Layer>,
    pub base_dir: Option<PathBuf>,
    pub identities: Vec<IdentityRule>,
    /// `auth.allow_anonymous`: a caller without a credential is `anonymous` even when
    /// tokens are configured.
    pub allow_anonymous: bool,
    /// `auth.anonymous_scopes`: what `anonymous` holds (`*` when not given).
    pub anonymous_scopes: Option<Vec<String>>,
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
    pub rule: Cow<'static, str>,
    /// Scopes required of the caller (the endpoint's own, or the policy's override).
    pub scopes: Vec<crate::api::Text>,
    /// The rule that set `scopes` when a layer did (see [`Decision::scopes_rule`]).
    scopes_set_by: Option<String>,
    /// The endpoint's limits with the policy's knobs on top, as `/capabilities` shows
    /// them.
    pub limits: Map<String, Value>,
    /// The knobs the policy set for this endpoint, which its route enforces.
    pub knobs: Map<String, Value>,
    /// Which requests leave an audit line: `off`, `deny` (refusals) or `all`.
    pub audit: Cow<'static, str>,
}

impl Decision {
    /// The 404 message for `endpoint` when this decision keeps it off. Worded when a
    /// refusal needs it, not at start: most of the table is off by default (the opt-in
    /// groups), and wording every one was a fifth of deciding the table.
    pub fn message(&self, endpoint: &EndpointSpec, unavailable: Option<&str>) -> Option<String> {
        if self.enabled {
            return None;
        }
        let (id, g, rule) = (&endpoint.id, endpoint.group.name(), &self.rule);
        Some(match unavailable {
            Some(reason) => format!("Endpoint '{id}' is not available: {reason}"),
            None if rule.starts_with("default:opt-in:") => format!(
                "Endpoint '{id}' is disabled: group '{g}' is opt-in. Enable the group (ABX_SERVER_ENABLED_GROUPS={g}, policy groups: [{g}]) or this endpoint (policy endpoints.{id}.enabled: true)"
            ),
            None => format!("Endpoint '{id}' is disabled by rule {rule}"),
        })
    }

    /// The rule that decided `scopes` for the endpoint `id`: a policy's, or the
    /// endpoint's own declaration.
    pub fn scopes_rule(&self, id: &str) -> Cow<'_, str> {
        match &self.scopes_set_by {
            Some(rule) => Cow::Borrowed(rule),
            None => Cow::Owned(format!("default:scopes:{id}")),
        }
    }

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
        self.knob(name)?
            .as_array()?
            .iter()
            .map(Value::as_str)
            .collect()
    }

    /// A list of whole numbers (`allowed_signals`), if the policy set it.
    pub fn knob_numbers(&self, name: &str) -> Option<Vec<i64>> {
        self.knob(name)?
            .as_array()?
            .iter()
            .map(Value::as_i64)
            .collect()
    }

    /// The `paths.allow` entries that are directories (absolute, no glob character):
    /// the reference's allowed roots, each admitting everything beneath it. The other
    /// entries are globs.
    pub fn allowed_directories(&self) -> Vec<&str> {
        self.knob_list("paths.allow")
            .unwrap_or_default()
            .into_iter()
            .filter(|entry| is_directory_entry(entry))
            .collect()
    }

    /// A switch, if the policy set it (`paths.read_only` reaches inside an object).
    pub fn knob_bool(&self, name: &str) -> Option<bool> {
        self.knob(name).and_then(Value::as_bool)
    }

    /// A text value (`paths.symlinks`), if the policy set it.
    pub fn knob_str(&self, name: &str) -> Option<&str> {
        self.knob(name).and_then(Value::as_str)
    }

    fn knob(&self, name: &str) -> Option<&Value> {
        let mut path = name.split('.');
        let mut value = self.knobs.get(path.next()?)?;
        for key in path {
            value = value.get(key)?;
        }
        Some(value)
    }

    /// `rate_limit` (requests per seconds) or the reference's `rate_per_minute`, if the
    /// policy set one.
    pub fn rate_limit(&self) -> Option<(f64, f64)> {
        if let Some(per_minute) = self.knob_u64("rate_per_minute") {
            return Some((per_minute as f64, 60.0));
        }
        let rate = self.knobs.get("rate_limit")?;
        Some((
            rate.get("requests")?.as_u64()? as f64,
            rate.get("per_seconds")?.as_f64()?,
        ))
    }
}

/// Whether a `paths.allow` entry is a directory (the reference's root) rather than a
/// glob.
pub fn is_directory_entry(entry: &str) -> bool {
    entry.starts_with('/') && !entry.contains(['*', '?', '['])
}

/// Whether `name` is an endpoint-level knob a policy document may set.
#[cfg(test)]
pub(crate) fn is_knob(name: &str) -> bool {
    knobs::OWN.iter().any(|(knob, _)| *knob == name)
        || knobs::LIMITS
            .iter()
            .chain(&knobs::PARAMS)
            .any(|(knob, _)| *knob == name)
}

/// Every top-level key a document may have: the reference's, then this server's own.
const KNOWN_KEYS: [&str; 11] = [
    "version",
    "preset",
    "base_dir",
    "groups",
    "defaults",
    "auth",
    "endpoints",
    "description",
    "server",
    "identities",
    "allow_origins",
];

/// The keys of one rule.
const RULE_KEYS: [&str; 6] = ["enabled", "scopes", "paths", "limits", "params", "audit"];

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

/// The closest of `choices` to `word`, as a hint (`(did you mean 'shell'?)`).
fn suggest<'a>(word: &str, choices: impl IntoIterator<Item = &'a str>) -> String {
    let distance = |a: &str, b: &str| {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut diagonal = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let above = row[j + 1];
                row[j + 1] = (diagonal + usize::from(ca != *cb))
                    .min(above + 1)
                    .min(row[j] + 1);
                diagonal = above;
            }
        }
        row[b.len()]
    };
    choices
        .into_iter()
        .map(|c| (distance(word, c), c))
        .filter(|(d, c)| *d * 3 <= c.len().max(word.len()))
        .min()
        .map(|(_, c)| format!(" (did you mean '{c}'?)"))
        .unwrap_or_default()
}

/// A scope as the reference accepts it: `*`, `ns:*`, `ns:name` or a bare name (lower
/// case letters, digits, `_`, `.`, `-`, and `:` after the namespace).
pub fn valid_scope(scope: &str) -> bool {
    fn word(s: &str, extra: &str) -> bool {
        let mut chars = s.chars();
        chars.next().is_some_and(|c| c.is_ascii_lowercase())
            && chars.all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || extra.contains(c)
            })
    }
    if scope == "*" {
        return true;
    }
    match scope.split_once(':') {
        Some((ns, rest)) => word(ns, "") && (rest == "*" || word(rest, ":.-")),
        None => word(scope, ".-"),
    }
}

fn parse_scopes(value: &Value, at: &str) -> Result<Vec<String>, String> {
    let scopes = value
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .map(|s| s.as_str().map(String::from))
                .collect::<Option<Vec<String>>>()
        })
        .ok_or_else(|| format!("{at} must be a list of strings"))?;
    if let Some(bad) = scopes.iter().find(|s| !valid_scope(s)) {
        return Err(format!(
            "{at}: invalid scope '{bad}' (a scope is '*', 'namespace:*', 'namespace:name' or a lower-case name)"
        ));
    }
    Ok(scopes)
}

/// One rule (`endpoints.<selector>` or `defaults`), in either spelling.
fn parse_rule(value: &Value, at: &str) -> Result<EndpointRule, String> {
    let Value::Object(rule) = value else {
        return Err(format!("{at} must be an object"));
    };
    let mut parsed = EndpointRule::default();
    for (key, value) in rule {
        match key.as_str() {
            "enabled" => {
                parsed.enabled = Some(
                    value
                        .as_bool()
                        .ok_or_else(|| format!("{at}.enabled must be true or false"))?,
                )
            }
            "scopes" => parsed.scopes = Some(parse_scopes(value, &format!("{at}.scopes"))?),
            "audit" => match value.as_str() {
                Some(mode @ ("off" | "deny" | "all")) => parsed.audit = Some(mode.to_string()),
                _ => return Err(format!("{at}.audit must be one of off, deny, all")),
            },
            "limits" => parsed.limits = knobs::check_section("limits", value, at)?,
            "params" => parsed.params = knobs::check_section("params", value, at)?,
            knob => match knobs::OWN.iter().find(|(name, _)| *name == knob) {
                Some((_, kind)) => {
                    let value =
                        knobs::check(*kind, value).map_err(|why| format!("{at}.{knob} {why}"))?;
                    parsed.knobs.insert(knob.to_string(), value);
                }
                None => {
                    let known = RULE_KEYS
                        .iter()
                        .copied()
                        .chain(knobs::OWN.iter().map(|(n, _)| *n));
                    return Err(format!(
                        "{at}.{knob}: unknown key{}; a rule takes {} and this server's knobs (docs/policy.md)",
                        suggest(knob, known),
                        RULE_KEYS.join(", ")
                    ));
                }
            },
        }
    }
    // One meaning per key: the same limit in both spellings is ambiguous.
    for (section, entries) in [("limits", &parsed.limits), ("params", &parsed.params)] {
        for key in entries.keys() {
            let (name, _) = knobs::canonical("", section, key);
            if parsed.knobs.contains_key(name) {
                return Err(format!(
                    "{at}: {name} is set both as {at}.{name} and as {at}.{section}.{key}; keep one"
                ));
            }
        }
    }
    Ok(parsed)
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

    /// Loads the document at `path` (YAML or JSON; see `docs/policy.md`).
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

    /// Reads a document given inline (`ABX_SERVER_POLICY='{"preset": ...}'`), as the
    /// reference does.
    pub fn inline(text: &str) -> Result<Policy, String> {
        let doc = parse_document(text).map_err(|e| format!("ABX_SERVER_POLICY (inline): {e}"))?;
        Policy::from_value(doc, true).map_err(|e| format!("ABX_SERVER_POLICY (inline): {e}"))
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
            configured: configured && !map.keys().all(|k| k == "version"),
            layers: Vec::new(),
            base_dir: None,
            identities: Vec::new(),
            allow_anonymous: false,
            anonymous_scopes: None,
            allow_origins: Vec::new(),
            warnings: Vec::new(),
        };
        // A key this server does not know might be a restriction it would not apply:
        // refuse it rather than run wider than the document means.
        for key in map.keys() {
            if !KNOWN_KEYS.contains(&key.as_str()) {
                return Err(format!(
                    "{key}: unknown policy key{}; allowed: {}",
                    suggest(key, KNOWN_KEYS),
                    KNOWN_KEYS.join(", ")
                ));
            }
        }
        match map.get("version") {
            None => {}
            Some(v) if v.as_u64() == Some(1) && !v.is_boolean() => {}
            Some(v) => {
                return Err(format!(
                    "version: unsupported {v}; this server understands 1"
                ))
            }
        }
        if map.contains_key("auth") && map.contains_key("identities") {
            return Err("auth and identities both name tokens; keep one (auth.tokens is the reference's spelling, identities this server's)".into());
        }
        match map.get("preset") {
            None => {}
            Some(Value::String(s)) if presets::PRESETS.contains(&s.as_str()) => {
                policy.preset = s.clone()
            }
            Some(other) => {
                let name = other.as_str().unwrap_or_default();
                return Err(format!(
                    "preset: unknown {other}{}; allowed: {} (docs/policy.md describes each)",
                    suggest(name, presets::PRESETS),
                    presets::PRESETS.join(", ")
                ));
            }
        }
        policy.layers.extend(presets::layers(&policy.preset));
        match map.get("base_dir") {
            None => {}
            Some(Value::String(s)) if s.starts_with('/') && !s.contains('\0') => {
                policy.base_dir = Some(PathBuf::from(s))
            }
            Some(_) => return Err("base_dir must be an absolute path".into()),
        }
        if let Some(groups) = map.get("groups") {
            parse_groups(groups, "groups", &mut policy.layers)?;
        }
        if let Some(server) = map.get("server") {
            let Value::Object(server) = server else {
                return Err("server must be an object".into());
            };
            for (key, value) in server {
                match key.as_str() {
                    "groups" => parse_groups(value, "server.groups", &mut policy.layers)?,
                    other => {
                        return Err(format!(
                            "server.{other}: unknown key; server: takes groups (the rest of a policy goes at the top level)"
                        ))
                    }
                }
            }
        }
        if let Some(defaults) = map.get("defaults") {
            policy.layers.push(Layer {
                selector: Selector::Defaults,
                rank: RANK_POLICY,
                rule: parse_rule(defaults, "defaults")?,
                origin: "policy:defaults".into(),
            });
        }
        if let Some(endpoints) = map.get("endpoints") {
            let Value::Object(endpoints) = endpoints else {
                return Err("endpoints must be an object of endpoint id to rule".into());
            };
            for (key, rule) in endpoints {
                policy.layers.push(Layer {
                    selector: Selector::parse(key)?,
                    rank: RANK_POLICY,
                    rule: parse_rule(rule, &format!("endpoints.{key}"))?,
                    origin: format!("policy:endpoints.{key}").into(),
                });
            }
        }
        if let Some(identities) = map.get("identities") {
            policy.identities = parse_identities(identities, "identities", false)?;
        }
        if let Some(auth) = map.get("auth") {
            let Value::Object(auth) = auth else {
                return Err("auth must be an object".into());
            };
            for (key, value) in auth {
                match key.as_str() {
                    "tokens" => policy.identities = parse_identities(value, "auth.tokens", true)?,
                    "allow_anonymous" => {
                        policy.allow_anonymous = value
                            .as_bool()
                            .ok_or("auth.allow_anonymous must be true or false")?
                    }
                    "anonymous_scopes" => {
                        policy.anonymous_scopes =
                            Some(parse_scopes(value, "auth.anonymous_scopes")?)
                    }
                    other => {
                        return Err(format!(
                            "auth.{other}: unknown key{}; allowed: allow_anonymous, anonymous_scopes, tokens",
                            suggest(other, ["tokens", "allow_anonymous", "anonymous_scopes"])
                        ))
                    }
                }
            }
        }
        if let Some(origins) = map.get("allow_origins") {
            policy.allow_origins = parse_origins(origins)?;
        }
        Ok(policy)
    }

    /// Checks the rules that need the route table and returns the warnings to publish:
    /// an id no endpoint has, or a limit the endpoint it names does not apply, stops the
    /// server (a limit that is written but not applied reads as a protection that is
    /// not there).
    pub fn validate<'a, I>(&self, endpoints: I) -> Result<Vec<String>, String>
    where
        I: IntoIterator<Item = &'a EndpointSpec>,
        I::IntoIter: Clone,
    {
        let endpoints = endpoints.into_iter();
        let mut warnings = self.warnings.clone();
        for layer in &self.layers {
            if layer.rank != RANK_POLICY {
                continue;
            }
            let at = layer.origin.trim_start_matches("policy:");
            let Selector::Exact(id) = &layer.selector else {
                continue;
            };
            let Some(endpoint) = endpoints
                .clone()
                .find(|e| e.id == *id || e.aliases.iter().any(|a| a == id))
            else {
                return Err(format!(
                    "{at}: unknown endpoint{}; GET /capabilities lists every id",
                    suggest(id, endpoints.clone().map(|e| e.id.as_ref()))
                ));
            };
            if endpoint.id != *id {
                warnings.push(format!(
                    "policy {at} names endpoint '{id}' by its former id; its id is now '{}' (the old one keeps working)",
                    endpoint.id
                ));
            }
            if endpoint.group == Group::Core && layer.rule.enabled == Some(false) {
                warnings.push(format!(
                    "policy {at}.enabled: false is ignored: the core endpoint '{}' is always on",
                    endpoint.id
                ));
            }
            for knob in applied_knobs(&layer.rule, endpoint).keys() {
                if !applies(endpoint, knob) {
                    return Err(format!(
                        "{at}: {knob} is not applied by endpoint '{}' in this build (docs/policy.md lists what each endpoint applies)",
                        endpoint.id
                    ));
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
    /// (`enable_group` / `disable_group` on its route table, in call order).
    pub fn decide_with(
        &self,
        endpoint: &EndpointSpec,
        unavailable: Option<&str>,
        env_groups: &[Group],
        code_groups: &[(Group, bool)],
    ) -> Decision {
        self.decider(env_groups, code_groups)
            .decide(endpoint, unavailable)
    }

    /// What decides every endpoint under this policy with these group switches: the
    /// layers are gathered and put in application order once, not once per endpoint
    /// (which was a third of the time start spent on the route table).
    pub fn decider(&self, env_groups: &[Group], code_groups: &[(Group, bool)]) -> Decider {
        let mut all: Vec<Layer> = Group::ALL
            .into_iter()
            .filter(|g| g.opt_in())
            .map(|g| Layer::switch(Selector::Group(g), RANK_DEFAULT, false, opt_in_rule(g)))
            .collect();
        all.extend(code_groups.iter().map(|(g, on)| {
            let verb = if *on { "enable_group" } else { "disable_group" };
            Layer::switch(
                Selector::Group(*g),
                RANK_CODE,
                *on,
                format!("code:{verb}:{}", g.name()),
            )
        }));
        all.extend(self.layers.iter().cloned());
        all.extend(env_groups.iter().map(|g| {
            Layer::switch(
                Selector::Group(*g),
                RANK_ENV,
                true,
                "env:ABX_SERVER_ENABLED_GROUPS",
            )
        }));
        layers::put_in_order(&mut all);
        Decider { layers: all }
    }
}

/// A policy's layers, with the group switches, in application order
/// ([`Policy::decider`]).
pub struct Decider {
    layers: Vec<Layer>,
}

impl Decider {
    /// Whether `endpoint` answers, with which scopes and knobs, and by which rule.
    pub fn decide(&self, endpoint: &EndpointSpec, unavailable: Option<&str>) -> Decision {
        let merged = layers::merge(endpoint, &self.layers, |rule, endpoint| {
            let mut knobs = applied_knobs(rule, endpoint);
            knobs.retain(|name, _| applies(endpoint, name));
            knobs
        });
        let (scopes, scopes_set_by) = match merged.scopes {
            Some((scopes, rule)) => (scopes.into_iter().map(Cow::Owned).collect(), Some(rule)),
            None => (endpoint.scopes.clone(), None),
        };
        let mut limits = endpoint.limits.clone();
        for (name, value) in &merged.knobs {
            limits.insert(name.clone(), value.clone());
        }
        let (enabled, rule) = if endpoint.group == Group::Core {
            (true, Cow::Borrowed("default:core"))
        } else if unavailable.is_some() {
            (false, Cow::Borrowed("build:unavailable"))
        } else {
            (
                merged.enabled,
                merged
                    .enabled_by
                    .unwrap_or_else(|| default_rule(endpoint.group)),
            )
        };
        Decision {
            enabled,
            rule,
            scopes,
            scopes_set_by,
            limits,
            knobs: merged.knobs,
            audit: merged.audit,
        }
    }
}

/// `default:<group>`: the rule of an endpoint no layer decided. Spelled out, so
/// deciding the table at start copies no string.
fn default_rule(group: Group) -> Cow<'static, str> {
    Cow::Borrowed(match group {
        Group::Core => "default:core",
        Group::Commands => "default:commands",
        Group::FileOps => "default:file_ops",
        Group::Process => "default:process",
        Group::Terminal => "default:terminal",
        Group::System => "default:system",
        Group::DevTools => "default:dev_tools",
        Group::Browser => "default:browser",
        Group::Agents => "default:agents",
        Group::Mcp => "default:mcp",
        Group::K8sRuntime => "default:k8s_runtime",
        Group::Envd => "default:envd",
    })
}

/// `default:opt-in:<group>`: the rule that keeps an opt-in group off.
fn opt_in_rule(group: Group) -> Cow<'static, str> {
    match group {
        Group::DevTools => Cow::Borrowed("default:opt-in:dev_tools"),
        Group::Browser => Cow::Borrowed("default:opt-in:browser"),
        Group::Agents => Cow::Borrowed("default:opt-in:agents"),
        Group::K8sRuntime => Cow::Borrowed("default:opt-in:k8s_runtime"),
        Group::Envd => Cow::Borrowed("default:opt-in:envd"),
        other => Cow::Owned(format!("default:opt-in:{}", other.name())),
    }
}

/// The knobs `rule` sets on `endpoint`, in this server's names.
fn applied_knobs(rule: &EndpointRule, endpoint: &EndpointSpec) -> Map<String, Value> {
    // This server's flat names mean what the reference's do on the same endpoint
    // (`timeout_seconds` on a search is its time limit).
    let mut out: Map<String, Value> = rule
        .knobs
        .iter()
        .map(|(key, value)| {
            let name = match knobs::canonical(&endpoint.id, "limits", key) {
                (renamed, None) if renamed != "unknown" => renamed.to_string(),
                _ => key.clone(),
            };
            (name, value.clone())
        })
        .collect();
    for (section, entries) in [("limits", &rule.limits), ("params", &rule.params)] {
        for (key, value) in entries {
            match knobs::canonical(&endpoint.id, section, key) {
                (name, Some(sub)) => {
                    let slot = out
                        .entry(name.to_string())
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(slot) = slot {
                        slot.insert(sub.to_string(), value.clone());
                    }
                }
                (name, None) => {
                    out.insert(name.to_string(), value.clone());
                }
            }
        }
    }
    out
}

/// Whether `endpoint` applies the knob `name`.
fn applies(endpoint: &EndpointSpec, name: &str) -> bool {
    knobs::EVERY_ENDPOINT.contains(&name) || endpoint.enforces.contains(&name)
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

/// `identities` or `auth.tokens`: a list of `{id, scopes, token_sha256 | token_env}`
/// (the reference requires `scopes` on each entry; this server's own spelling lets it
/// default to none).
fn parse_identities(
    value: &Value,
    key: &str,
    scopes_required: bool,
) -> Result<Vec<IdentityRule>, String> {
    let Value::Array(entries) = value else {
        return Err(format!(
            "{key} must be a list of {{id, scopes, token_sha256 or token_env}}"
        ));
    };
    let mut identities: Vec<IdentityRule> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("{key}[{i}]");
        let Value::Object(entry) = entry else {
            return Err(format!("{at} must be an object"));
        };
        let id = match entry.get("id") {
            Some(Value::String(id)) if !id.trim().is_empty() => id.clone(),
            _ => return Err(format!("{at}.id must be a non-empty string")),
        };
        // `server` stays free: with identities `ABX_SERVER_TOKEN` is not accepted, so no
        // other holder can take that name, and the reference's own documents use it.
        if id == "anonymous" {
            return Err(format!(
                "{at}.id: 'anonymous' is reserved (the caller without a credential)"
            ));
        }
        if identities.iter().any(|known| known.id == id) {
            return Err(format!("{at}.id: duplicate identity '{id}'"));
        }
        let scopes = match entry.get("scopes") {
            None if scopes_required => return Err(format!("{at}.scopes: required")),
            None => Vec::new(),
            Some(value) => parse_scopes(value, &format!("{at}.scopes"))?,
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
        for name in entry.keys() {
            if !["id", "scopes", "token_sha256", "token_env"].contains(&name.as_str()) {
                return Err(format!(
                    "{at}.{name} is not an identity key (id, scopes, token_sha256, token_env)"
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

fn parse_groups(value: &Value, key: &str, out: &mut Vec<Layer>) -> Result<(), String> {
    let mut switch = |name: &str, on: bool| -> Result<(), String> {
        let group = Group::parse(name).ok_or_else(|| {
            format!(
                "{key}: unknown group '{name}'{}; known: {}",
                suggest(name, Group::ALL.map(Group::name)),
                Group::ALL.map(Group::name).join(", ")
            )
        })?;
        if group == Group::Core && !on {
            return Err(format!("{key}.core: the core group cannot be disabled"));
        }
        out.push(Layer::switch(
            Selector::Group(group),
            RANK_POLICY,
            on,
            format!("policy:{key}.{name}"),
        ));
        Ok(())
    };
    match value {
        // A list enables the groups it names.
        Value::Array(names) => {
            for name in names {
                let name = name
                    .as_str()
                    .ok_or_else(|| format!("{key} must list group names"))?;
                switch(name, true)?;
            }
        }
        Value::Object(switches) => {
            for (name, on) in switches {
                let on = on
                    .as_bool()
                    .ok_or_else(|| format!("{key}.{name} must be true or false"))?;
                switch(name, on)?;
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

/// Revision of a policy document: 16 hex chars of SHA-256 over the document as the
/// reference server normalises and writes it (`ServerPolicy.revision`: `version`
/// filled in, a `groups` list as a mapping, sizes in bytes, digests in lower case,
/// compact separators), so both servers report one revision for one document.
pub fn revision_of(doc: &Value) -> String {
    let text = pydumps::dumps_compact_sorted(&normalised(doc));
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The reference's `_normalise_config` of `doc` (keys it does not know, this server's
/// own, are kept as written).
fn normalised(doc: &Value) -> Value {
    let Value::Object(map) = doc else {
        return doc.clone();
    };
    let mut out = map.clone();
    out.entry("version").or_insert(Value::from(1));
    if let Some(Value::Array(names)) = map.get("groups") {
        let groups: Map<String, Value> = names
            .iter()
            .filter_map(|n| Some((n.as_str()?.to_string(), Value::Bool(true))))
            .collect();
        out.insert("groups".into(), Value::Object(groups));
    }
    if let Some(rule) = map.get("defaults") {
        out.insert("defaults".into(), normalised_rule(rule));
    }
    if let Some(Value::Object(endpoints)) = map.get("endpoints") {
        let rules = endpoints
            .iter()
            .map(|(sel, rule)| (sel.clone(), normalised_rule(rule)))
            .collect();
        out.insert("endpoints".into(), Value::Object(rules));
    }
    if let Some(Value::Array(tokens)) = map.get("auth").and_then(|a| a.get("tokens")) {
        let tokens: Vec<Value> = tokens
            .iter()
            .map(|token| {
                let mut token = token.clone();
                if let Some(Value::String(hex)) = token.get_mut("token_sha256") {
                    *hex = hex.to_ascii_lowercase();
                }
                token
            })
            .collect();
        if let Some(Value::Object(auth)) = out.get_mut("auth") {
            auth.insert("tokens".into(), Value::Array(tokens));
        }
    }
    Value::Object(out)
}

fn normalised_rule(rule: &Value) -> Value {
    let mut rule = rule.clone();
    if let Some(Value::Object(limits)) = rule.get_mut("limits") {
        for (key, value) in limits.iter_mut() {
            let size = knobs::LIMITS
                .iter()
                .any(|(name, kind)| name == key && matches!(kind, knobs::Kind::Size));
            if let (true, Ok(bytes)) = (size, knobs::parse_size(value)) {
                *value = Value::from(bytes);
            }
        }
    }
    rule
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Method;
    use serde_json::json;

    fn ep(id: &str, group: Group) -> EndpointSpec {
        let mut spec = EndpointSpec::new(Method::Get, "/x", group);
        spec.id = id.to_string().into();
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
            (true, "env:ABX_SERVER_ENABLED_GROUPS".into()),
            "the environment ranks above the preset, as on the reference server"
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
        assert!(p.layers.iter().any(
            |l| matches!(&l.selector, Selector::Exact(id) if id == "shell")
                && l.rule.enabled == Some(true)
        ));
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
        assert!(p
            .layers
            .iter()
            .any(|l| matches!(l.selector, Selector::Group(Group::Agents))
                && l.rule.enabled == Some(true)));
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
                (decision.enabled, &*decision.rule),
                (enabled, rule),
                "{doc} {}",
                endpoint.id
            );
            assert_eq!(
                decision.message(endpoint, unavailable).is_some(),
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
        // As the reference: sha256('{"version":1}').
        assert_eq!(p.revision, "2430f1a2ad2982d0");
        // The reference's revisions of the same documents (agent-sandbox-server 0.4.0a6).
        for (doc, revision) in [
            (
                json!({"preset": "hardened", "groups": ["dev_tools"]}),
                "00520b90f48ac765",
            ),
            (
                json!({"endpoints": {"shell": {"limits": {"max_output_bytes": "1MiB"}}}}),
                "a3179921debc60e8",
            ),
            (
                json!({"version": 1, "endpoints": {"shell": {"limits": {"max_output_bytes": 1048576}}}}),
                "a3179921debc60e8",
            ),
        ] {
            assert_eq!(revision_of(&doc), revision, "{doc}");
        }
    }

    /// The spelled-out rule names say what the group's name would.
    #[test]
    fn default_rules_name_their_group() {
        for g in Group::ALL {
            assert_eq!(default_rule(g), format!("default:{}", g.name()));
            assert_eq!(opt_in_rule(g), format!("default:opt-in:{}", g.name()));
        }
    }

    #[test]
    fn defaults_enable_all_but_opt_in_groups() {
        let p = Policy::empty();
        let d = p.decide(&ep("code_run", Group::DevTools), None, &[]);
        assert!(!d.enabled);
        assert_eq!(d.rule, "default:opt-in:dev_tools");
        assert_eq!(
            d.message(&ep("code_run", Group::DevTools), None).unwrap(),
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
        assert_eq!((d.enabled, &*d.rule), (false, "policy:groups.process"));
        let d = p.decide(&ep("process_list", Group::Process), None, &[]);
        assert_eq!(
            (d.enabled, &*d.rule),
            (true, "policy:endpoints.process_list")
        );
        let d = p.decide(&ep("code_run", Group::DevTools), None, &[Group::DevTools]);
        assert_eq!((d.enabled, &*d.rule), (false, "policy:endpoints.code_run"));
        let d = p.decide(&ep("git_status", Group::DevTools), None, &[]);
        assert!(d.enabled);
    }

    #[test]
    fn server_groups_list_enables() {
        let p = Policy::from_value(json!({"server": {"groups": ["agents"]}}), true).unwrap();
        let d = p.decide(&ep("agents_x", Group::Agents), None, &[]);
        assert_eq!((d.enabled, &*d.rule), (true, "policy:server.groups.agents"));
    }

    #[test]
    fn core_cannot_be_disabled_and_bad_documents_fail() {
        assert!(Policy::from_value(json!({"groups": {"core": false}}), true).is_err());
        assert!(Policy::from_value(json!({"groups": ["nope"]}), true).is_err());
        assert!(Policy::from_value(json!([1]), true).is_err());
        // As on the reference: accepted, and core stays on (said in a warning).
        let p =
            Policy::from_value(json!({"endpoints": {"health": {"enabled": false}}}), true).unwrap();
        let warnings = p.validate(&[ep("health", Group::Core)]).unwrap();
        assert!(warnings[0].contains("always on"), "{warnings:?}");
        assert!(p.decide(&ep("health", Group::Core), None, &[]).enabled);
    }

    #[test]
    fn unknown_keys_stop_the_server() {
        let err =
            Policy::from_value(json!({"frobnicate": 1, "preset": "read-only"}), true).unwrap_err();
        assert!(err.starts_with("frobnicate: unknown policy key"), "{err}");
        let err = Policy::from_value(json!({"endpoints": {"shell": {"enabeld": true}}}), true)
            .unwrap_err();
        assert!(
            err.contains("endpoints.shell.enabeld: unknown key (did you mean 'enabled'?)"),
            "{err}"
        );
        let err = Policy::from_value(json!({"auth": {"tokens": [], "anonymous": true}}), true)
            .unwrap_err();
        assert!(err.contains("auth.anonymous: unknown key"), "{err}");
        let err = Policy::from_value(json!({"preset": "transfer_only"}), true).unwrap_err();
        assert!(err.contains("did you mean 'transfer-only'"), "{err}");
    }

    /// The reference's own document, as its docs write one, means the same here.
    #[test]
    fn the_reference_schema_is_understood() {
        let doc = json!({
            "version": 1,
            "description": "ci sandbox",
            "preset": "default",
            "groups": ["dev_tools"],
            "defaults": {"limits": {"rate_per_minute": 600}},
            "auth": {
                "tokens": [{"id": "ci", "scopes": ["files:read"], "token_sha256": "90fedcbce452b5a8a6f979579502bffa56b69a8a3543833062e46632f658e0b8"}],
                "allow_anonymous": true,
                "anonymous_scopes": ["core:read"]
            },
            "endpoints": {
                "files_*": {"paths": {"deny": ["**/.env"]}},
                "shell": {"limits": {"timeout_seconds": 5, "max_output_bytes": "1MiB"}, "params": {"deny_commands": ["rm"]}},
                "process_signal": {"params": {"allowed_signals": [15]}},
                "group:browser": {"enabled": false},
                "files_upload_stream": {"limits": {"max_bytes": "5MB"}, "audit": "all"}
            }
        });
        let p = Policy::from_value(doc, true).unwrap();
        assert_eq!(p.identities[0].id, "ci");
        assert!(p.allow_anonymous);
        assert_eq!(
            p.anonymous_scopes.as_deref(),
            Some(&["core:read".to_string()][..])
        );
        let mut shell = ep("shell", Group::Process);
        shell.enforces = vec!["paths", "timeout_seconds", "max_output_bytes", "commands"];
        let d = p.decide(&shell, None, &[]);
        assert_eq!(d.knob_seconds("timeout_seconds"), Some(5.0));
        assert_eq!(d.knob_u64("max_output_bytes"), Some(1 << 20));
        assert_eq!(d.knob_list("commands.deny"), Some(vec!["rm"]));
        assert_eq!(d.rate_limit(), Some((600.0, 60.0)));
        let mut upload = ep("files_upload_stream", Group::FileOps);
        upload.enforces = vec!["paths", "max_upload_bytes"];
        let d = p.decide(&upload, None, &[]);
        assert_eq!(d.knob_u64("max_upload_bytes"), Some(5_000_000));
        assert_eq!(d.knob_list("paths.deny"), Some(vec!["**/.env"]));
        assert_eq!(d.audit, "all");
        let d = p.decide(&ep("browser_navigate", Group::Browser), None, &[]);
        assert_eq!(
            (d.enabled, &*d.rule),
            (false, "policy:endpoints.group:browser")
        );
        // The environment's group switch ranks above the document's, as there.
        let d = p.decide(
            &ep("browser_navigate", Group::Browser),
            None,
            &[Group::Browser],
        );
        assert_eq!(
            (d.enabled, &*d.rule),
            (true, "env:ABX_SERVER_ENABLED_GROUPS")
        );
        // A limit the endpoint does not apply, on that endpoint by name, stops the server.
        let err = p
            .validate(&[
                shell.clone(),
                upload.clone(),
                ep("process_signal", Group::Process),
            ])
            .unwrap_err();
        assert!(
            err.contains("allowed_signals is not applied by endpoint 'process_signal'"),
            "{err}"
        );
        // The two spellings of one limit in one rule are ambiguous.
        let err = Policy::from_value(json!({"endpoints": {"shell": {"timeout_seconds": 1, "limits": {"timeout_seconds": 2}}}}), true).unwrap_err();
        assert!(err.contains("keep one"), "{err}");
        let err = Policy::from_value(json!({"auth": {}, "identities": []}), true).unwrap_err();
        assert!(err.contains("keep one"), "{err}");
    }

    #[test]
    fn reference_presets_mean_what_they_mean_there() {
        let transfer = Policy::from_value(
            json!({"preset": "transfer-only", "groups": ["process"]}),
            true,
        )
        .unwrap();
        assert!(
            transfer
                .decide(&ep("files_upload_stream", Group::FileOps), None, &[])
                .enabled
        );
        let d = transfer.decide(&ep("shell", Group::Process), None, &[]);
        assert_eq!(
            (d.enabled, &*d.rule),
            (false, "preset:transfer-only:endpoints.*"),
            "a group switch does not undo the preset's glob"
        );
        let locked = Policy::from_value(json!({"preset": "locked"}), true).unwrap();
        assert!(
            locked
                .decide(&ep("run_command", Group::Commands), None, &[])
                .enabled
        );
        assert!(
            !locked
                .decide(&ep("files_list", Group::FileOps), None, &[])
                .enabled
        );
        let hardened = Policy::from_value(json!({"preset": "hardened"}), true).unwrap();
        let mut list = ep("files_list", Group::FileOps);
        list.enforces = vec!["paths"];
        let d = hardened.decide(&list, None, &[]);
        assert!(d.enabled);
        assert!(d.knob_list("paths.deny").unwrap().contains(&"**/.ssh"));
        assert!(
            !hardened
                .decide(&ep("process_list", Group::Process), None, &[])
                .enabled
        );
        let read_only = Policy::from_value(json!({"preset": "read-only"}), true).unwrap();
        assert!(
            !read_only
                .decide(&ep("process_list", Group::Process), None, &[])
                .enabled
        );
        // A former id in a document still names its endpoint.
        let renamed = Policy::from_value(
            json!({"endpoints": {"commands_run": {"enabled": false}}}),
            true,
        )
        .unwrap();
        let mut run = ep("run_command", Group::Commands);
        run.aliases = vec!["commands_run".into()];
        assert!(!renamed.decide(&run, None, &[]).enabled);
        let warnings = renamed.validate(&[run]).unwrap();
        assert!(warnings[0].contains("former id"), "{warnings:?}");
    }
}
