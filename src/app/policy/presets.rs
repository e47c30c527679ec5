//! Named starting points for a policy (`preset:` in the document), ranked below the
//! document's own rules of the same kind. The reference server's presets (`default`,
//! `transfer-only`, `read-only`, `hardened`, `locked`) are its own rules, word for word
//! (`agent_sandbox.server.policy.PRESETS`); `locked-down` is this server's, and
//! `read-only` also turns off what this server's declarations say changes the sandbox
//! (a stricter reading of the same name: `docs/policy.md`).

use serde_json::json;

use super::layers::{EndpointRule, Layer, Selector, RANK_PRESET};
use crate::api::{Effect, EndpointSpec, Group};

/// The presets a document may name.
pub const PRESETS: [&str; 6] = [
    "default",
    "transfer-only",
    "read-only",
    "hardened",
    "locked",
    "locked-down",
];

/// What the `hardened` preset denies on every file endpoint.
const HARDENED_DENY: [&str; 9] = [
    "/proc",
    "/sys",
    "/dev",
    "**/.ssh",
    "**/.env",
    "**/.env.*",
    "**/*.pem",
    "**/id_rsa*",
    "**/id_ed25519*",
];

/// The groups `read-only` and `hardened` turn off.
const NO_EXECUTION: [Group; 4] = [
    Group::Process,
    Group::Terminal,
    Group::DevTools,
    Group::Browser,
];

/// The layers of preset `name`.
pub fn layers(name: &str) -> Vec<Layer> {
    let origin = |what: &str| format!("preset:{name}:{what}");
    let endpoint = |id: &str, on: bool| {
        Layer::switch(
            Selector::parse(id).expect("a preset names ids and globs"),
            RANK_PRESET,
            on,
            origin(&format!("endpoints.{id}")),
        )
    };
    let group_off = |g: Group| {
        Layer::switch(
            Selector::Group(g),
            RANK_PRESET,
            false,
            origin(&format!("groups.{}", g.name())),
        )
    };
    match name {
        "transfer-only" => vec![
            endpoint("*", false),
            endpoint("files_upload_stream", true),
            endpoint("files_download_stream", true),
        ],
        "locked" => vec![
            endpoint("*", false),
            endpoint("list_commands", true),
            endpoint("run_command", true),
        ],
        "read-only" => {
            let mut out: Vec<Layer> = NO_EXECUTION.into_iter().map(group_off).collect();
            for id in [
                "files_mkdir",
                "files_delete",
                "files_move",
                "files_upload_stream",
                "env_set",
            ] {
                out.push(endpoint(id, false));
            }
            out.push(declared(name, |e| {
                (e.effect == Effect::Changes).then_some(false)
            }));
            out
        }
        "hardened" => {
            let mut out: Vec<Layer> = NO_EXECUTION.into_iter().map(group_off).collect();
            out.push(endpoint("env_set", false));
            let deny = json!({"deny": HARDENED_DENY, "symlinks": "within"});
            out.push(Layer {
                selector: Selector::Glob("files_*".into()),
                rank: RANK_PRESET,
                rule: EndpointRule {
                    knobs: json!({"paths": deny})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                    ..EndpointRule::default()
                },
                origin: origin("endpoints.files_*").into(),
            });
            out.push(Layer {
                selector: Selector::Defaults,
                rank: RANK_PRESET,
                rule: EndpointRule {
                    audit: Some("deny".into()),
                    ..EndpointRule::default()
                },
                origin: origin("defaults").into(),
            });
            out
        }
        "locked-down" => vec![declared(name, |e| Some(e.kept_locked_down))],
        _ => Vec::new(),
    }
}

/// A rule over what each endpoint declares of itself ([`EndpointSpec::kept_locked_down`],
/// [`EndpointSpec::effect`]).
fn declared(name: &str, rule: fn(&EndpointSpec) -> Option<bool>) -> Layer {
    Layer {
        selector: Selector::Declared(rule),
        rank: RANK_PRESET,
        rule: EndpointRule::default(),
        origin: format!("preset:{name}").into(),
    }
}
