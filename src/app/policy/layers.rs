//! The rule layers every endpoint's decision is merged from, as the reference server
//! (`agent_sandbox.server.runtime.PolicyEngine`) merges them, so a policy document means
//! the same on both servers.
//!
//! A layer is a selector (`@defaults`, `group:<name>`, a glob over endpoint ids, or one
//! id), a rank (built-in default < the program's group switches < preset < document <
//! `ABX_SERVER_ENABLED_GROUPS`) and a rule. Layers are applied in the order of
//! (selector kind, rank, literal prefix length, position): a more specific selector
//! always beats a less specific one whatever its rank, and among equals the higher rank
//! and then the later one wins. For `enabled`, the layers of the last (kind, rank)
//! bucket that says anything vote, and one `false` among them disables: a glob that
//! turns everything off is not undone by a glob of the same rank that turns one on.

use std::borrow::Cow;

use serde_json::{Map, Value};

use crate::api::{EndpointSpec, Group};

/// Built-in defaults: the opt-in groups start off.
pub const RANK_DEFAULT: u8 = 0;
/// The embedding program's `enable_group` / `disable_group`.
pub const RANK_CODE: u8 = 1;
pub const RANK_PRESET: u8 = 2;
/// The policy document.
pub const RANK_POLICY: u8 = 3;
/// `ABX_SERVER_ENABLED_GROUPS`.
pub const RANK_ENV: u8 = 4;

/// What a layer applies to.
#[derive(Debug, Clone)]
pub enum Selector {
    /// The document's `defaults` block: every endpoint.
    Defaults,
    /// `group:<name>`, or a `groups` switch.
    Group(Group),
    /// A built-in preset's rule over what each endpoint declares (`locked-down`,
    /// `read-only`): it ranks with group selectors, so the document's own group and
    /// endpoint rules still decide over it. `Some(on)` switches the endpoint.
    Declared(fn(&EndpointSpec) -> Option<bool>),
    /// An `fnmatch` glob over endpoint ids (`files_*`, `*`).
    Glob(String),
    /// One endpoint id (or one of its former ids).
    Exact(String),
}

impl Selector {
    /// Reads an `endpoints:` key.
    pub fn parse(key: &str) -> Result<Selector, String> {
        if key == "@defaults" {
            return Ok(Selector::Defaults);
        }
        if let Some(name) = key.strip_prefix("group:") {
            return Group::parse(name).map(Selector::Group).ok_or_else(|| {
                format!(
                    "endpoints.{key}: unknown group '{name}' (known: {})",
                    Group::ALL.map(Group::name).join(", ")
                )
            });
        }
        if key.contains(['*', '?', '[']) {
            return Ok(Selector::Glob(key.to_string()));
        }
        Ok(Selector::Exact(key.to_string()))
    }

    /// 0 defaults, 1 groups, 2 globs, 3 one endpoint: more specific is higher.
    pub fn kind(&self) -> u8 {
        match self {
            Selector::Defaults => 0,
            Selector::Group(_) | Selector::Declared(_) => 1,
            Selector::Glob(_) => 2,
            Selector::Exact(_) => 3,
        }
    }

    /// How much of the selector is literal before its first `*` (a longer literal
    /// prefix is more specific among globs).
    fn literal_prefix(&self) -> usize {
        match self {
            Selector::Glob(g) | Selector::Exact(g) => g.split('*').next().unwrap_or("").len(),
            _ => 0,
        }
    }

    /// Whether the selector names `endpoint` (by its id or a former one).
    pub fn matches(&self, endpoint: &EndpointSpec) -> bool {
        match self {
            Selector::Defaults => true,
            Selector::Group(group) => *group == endpoint.group,
            Selector::Declared(rule) => rule(endpoint).is_some(),
            Selector::Glob(glob) => {
                crate::fs::fnmatch::fnmatch(glob.as_bytes(), endpoint.id.as_bytes())
            }
            Selector::Exact(id) => *id == endpoint.id || endpoint.aliases.iter().any(|a| a == id),
        }
    }
}

/// One rule: what a layer says of the endpoints it selects.
#[derive(Debug, Clone, Default)]
pub struct EndpointRule {
    pub enabled: Option<bool>,
    pub scopes: Option<Vec<String>>,
    /// Limits and rules in this server's vocabulary (`timeout_seconds`,
    /// `commands: {allow, deny}`, `paths: {allow, deny, read_only, symlinks}`, ...),
    /// validated; the reference's `limits` / `params` names are translated per endpoint
    /// when merged ([`super::knobs::canonical`]).
    pub knobs: Map<String, Value>,
    /// The reference's `limits` and `params` sections, validated, kept by their own
    /// names until the endpoint they land on is known.
    pub limits: Map<String, Value>,
    pub params: Map<String, Value>,
    /// `off`, `deny` or `all`.
    pub audit: Option<String>,
}

impl EndpointRule {
    /// Whether the rule sets any knob (most layers only switch endpoints on or off).
    pub fn sets_knobs(&self) -> bool {
        !(self.knobs.is_empty() && self.limits.is_empty() && self.params.is_empty())
    }
}

/// One layer of rules.
#[derive(Debug, Clone)]
pub struct Layer {
    pub selector: Selector,
    pub rank: u8,
    pub rule: EndpointRule,
    /// Where the rule comes from (`policy:endpoints.shell`, `preset:hardened:groups.process`),
    /// named by a refusal it decides. Borrowed where it is fixed: every endpoint an
    /// opt-in group's default decides carries it, and a copy each was start-up work.
    pub origin: Cow<'static, str>,
}

impl Layer {
    pub fn switch(
        selector: Selector,
        rank: u8,
        enabled: bool,
        origin: impl Into<Cow<'static, str>>,
    ) -> Layer {
        Layer {
            selector,
            rank,
            rule: EndpointRule {
                enabled: Some(enabled),
                ..EndpointRule::default()
            },
            origin: origin.into(),
        }
    }
}

/// The merged outcome of every layer for one endpoint.
#[derive(Debug, Clone)]
pub struct Merged {
    pub enabled: bool,
    /// The origin of the layer that decided `enabled` (the first `false` among the
    /// deciding bucket), or `None` when no layer spoke.
    pub enabled_by: Option<Cow<'static, str>>,
    pub scopes: Option<(Vec<String>, String)>,
    pub knobs: Map<String, Value>,
    pub audit: Cow<'static, str>,
}

/// Puts `layers` in application order: by selector kind, rank and specificity, the
/// order they were given in among equals (the sort is stable).
pub fn put_in_order(layers: &mut [Layer]) {
    layers.sort_by_key(|l| (l.selector.kind(), l.rank, l.selector.literal_prefix()));
}

/// Knobs whose lists are joined across layers, not replaced: what one layer denies, a
/// later one cannot silently allow.
const UNION: [&str; 6] = [
    "deny_extensions",
    "deny_vars",
    "env_deny",
    "url_deny",
    "commands.deny",
    "paths.deny",
];

/// The `enabled` votes of one (selector kind, rank): each with the origin of its rule.
type Bucket<'a> = ((u8, u8), Vec<(bool, &'a Cow<'static, str>)>);

/// Merges the layers (in application order) that select `endpoint`. `apply` turns a
/// layer's rule into knobs for this endpoint (translating the reference's names).
pub fn merge(
    endpoint: &EndpointSpec,
    ordered: &[Layer],
    apply: impl Fn(&EndpointRule, &EndpointSpec) -> Map<String, Value>,
) -> Merged {
    let mut buckets: Vec<Bucket<'_>> = Vec::new();
    let mut scopes = None;
    let mut knobs = Map::new();
    let mut audit = Cow::Borrowed("deny");
    for layer in ordered {
        if !layer.selector.matches(endpoint) {
            continue;
        }
        let enabled = match &layer.selector {
            Selector::Declared(rule) => rule(endpoint),
            _ => layer.rule.enabled,
        };
        if let Some(on) = enabled {
            let key = (layer.selector.kind(), layer.rank);
            match buckets.last_mut() {
                Some((k, votes)) if *k == key => votes.push((on, &layer.origin)),
                _ => buckets.push((key, vec![(on, &layer.origin)])),
            }
        }
        if let Some(s) = &layer.rule.scopes {
            scopes = Some((s.clone(), format!("{}.scopes", layer.origin)));
        }
        if let Some(a) = &layer.rule.audit {
            audit = Cow::Owned(a.clone());
        }
        if layer.rule.sets_knobs() {
            for (name, value) in apply(&layer.rule, endpoint) {
                merge_knob(&mut knobs, &name, value);
            }
        }
    }
    let (enabled, enabled_by) = match buckets.last() {
        None => (true, None),
        Some((_, votes)) => match votes.iter().find(|(on, _)| !on) {
            Some((_, origin)) => (false, Some((*origin).clone())),
            None => (true, Some(votes[0].1.clone())),
        },
    };
    Merged {
        enabled,
        enabled_by,
        scopes,
        knobs,
        audit,
    }
}

/// Sets `name` (which may be `paths` or `commands`, objects merged key by key) in
/// `knobs`, joining the lists of [`UNION`] knobs.
fn merge_knob(knobs: &mut Map<String, Value>, name: &str, value: Value) {
    match value {
        Value::Object(inner) if matches!(name, "paths" | "commands") => {
            for (key, value) in inner {
                let slot = knobs
                    .entry(name.to_string())
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(slot) = slot {
                    set_or_join(
                        slot,
                        &key,
                        value,
                        UNION.contains(&format!("{name}.{key}").as_str()),
                    );
                }
            }
        }
        value => set_or_join(knobs, name, value, UNION.contains(&name)),
    }
}

fn set_or_join(map: &mut Map<String, Value>, key: &str, value: Value, join: bool) {
    match (map.get_mut(key), value) {
        (Some(Value::Array(have)), Value::Array(more)) if join => {
            for item in more {
                if !have.contains(&item) {
                    have.push(item);
                }
            }
        }
        (_, value) => {
            map.insert(key.to_string(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Method;
    use serde_json::json;

    fn spec(id: &'static str, group: Group) -> EndpointSpec {
        let mut spec = EndpointSpec::new(Method::Get, "/x", group);
        spec.id = id.into();
        spec
    }

    fn rule(enabled: Option<bool>, knobs: Value) -> EndpointRule {
        EndpointRule {
            enabled,
            knobs: knobs.as_object().cloned().unwrap_or_default(),
            ..EndpointRule::default()
        }
    }

    fn layer(sel: &str, rank: u8, rule: EndpointRule) -> Layer {
        Layer {
            selector: Selector::parse(sel).unwrap(),
            rank,
            rule,
            origin: format!("r{rank}:{sel}").into(),
        }
    }

    fn merged(layers: &[Layer], id: &'static str, group: Group) -> Merged {
        let mut order = layers.to_vec();
        put_in_order(&mut order);
        merge(&spec(id, group), &order, |r, _| r.knobs.clone())
    }

    #[test]
    fn specificity_beats_rank_and_one_false_disables_its_bucket() {
        let layers = [
            layer("*", RANK_PRESET, rule(Some(false), json!({}))),
            layer(
                "files_upload_stream",
                RANK_PRESET,
                rule(Some(true), json!({})),
            ),
            // A group switch of the document does not undo a preset's glob.
            layer("group:process", RANK_POLICY, rule(Some(true), json!({}))),
        ];
        let m = merged(&layers, "files_upload_stream", Group::FileOps);
        assert!(m.enabled);
        let m = merged(&layers, "shell", Group::Process);
        assert_eq!((m.enabled, m.enabled_by.as_deref()), (false, Some("r2:*")));
        let both = [
            layer("files_*", RANK_POLICY, rule(Some(true), json!({}))),
            layer("*_list", RANK_POLICY, rule(Some(false), json!({}))),
        ];
        assert!(!merged(&both, "files_list", Group::FileOps).enabled);
        assert!(merged(&both, "files_stat", Group::FileOps).enabled);
    }

    #[test]
    fn deny_lists_join_and_the_rest_is_replaced() {
        let layers = [
            layer(
                "@defaults",
                RANK_POLICY,
                rule(
                    None,
                    json!({"paths": {"deny": ["/a"], "allow": ["/x"]}, "timeout_seconds": 5}),
                ),
            ),
            layer(
                "shell",
                RANK_POLICY,
                rule(
                    None,
                    json!({"paths": {"deny": ["/b"], "allow": ["/y"]}, "timeout_seconds": 9}),
                ),
            ),
        ];
        let m = merged(&layers, "shell", Group::Process);
        assert_eq!(
            Value::Object(m.knobs),
            json!({"paths": {"deny": ["/a", "/b"], "allow": ["/y"]}, "timeout_seconds": 9})
        );
    }
}
