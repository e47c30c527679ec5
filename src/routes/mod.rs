//! The route table: one declaration per endpoint, grouped by capability group. Each
//! group's folder holds thin adapters: parse the request, call the domain code, shape
//! the answer. Adding an endpoint means adding one [`Endpoint`] to its group's
//! `endpoints()`; the router, `/capabilities`, `/capabilities/check` and the policy
//! engine all read the same list.

pub mod agents;
pub mod browser;
pub mod commands;
pub mod core;
pub mod dev_tools;
pub mod envd;
pub mod files;
pub mod k8s_runtime;
pub mod mcp;
pub mod process;
pub mod shared;
pub mod system;
pub mod terminal;

use crate::app::{Endpoint, Registrar};

/// A JSON Schema object with `required` fields and `properties`, for the OpenAPI
/// document's success bodies.
fn schema_object(required: &[&str], properties: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"type": "object", "required": required, "properties": properties})
}

/// The built-in groups' state registrars (see [`crate::app::groups`]), in the order
/// their shutdown hooks run. The commands group's is [`commands::registrar`]: it
/// takes the embedding program's commands.
pub fn builtin_registrars() -> Vec<Registrar> {
    vec![
        process::registrar(),
        terminal::registrar(),
        browser::registrar(),
        agents::registrar(),
        envd::registrar(),
    ]
}

/// Starts the built-in groups' background work that needs the whole app state (it
/// calls routes in-process): the server calls it once it serves.
pub fn started(state: &std::sync::Arc<crate::app::AppState>) {
    agents::started(state);
}

/// Every built-in endpoint, in the order `/capabilities` lists them.
pub fn builtin_endpoints() -> Vec<Endpoint> {
    let groups = [
        core::endpoints(),
        commands::endpoints(),
        files::endpoints(),
        process::endpoints(),
        system::endpoints(),
        dev_tools::endpoints(),
        terminal::endpoints(),
        browser::endpoints(),
        agents::endpoints(),
        mcp::endpoints(),
        k8s_runtime::endpoints(),
        envd::endpoints(),
    ];
    // Sized once: grown by doubling, the table (about 400 bytes an endpoint) touched
    // 120 KiB of fresh heap for 74 KiB of endpoints, each new page a fault at start.
    let mut endpoints = Vec::with_capacity(groups.iter().map(Vec::len).sum());
    for group in groups {
        endpoints.extend(group);
    }
    endpoints
}

/// What endpoint `id` of `endpoints` makes of a request with `query` and the JSON
/// object `body`, read against its declared fields as `Call::args` reads them: the
/// fields, or the refusal's sentence.
#[cfg(test)]
pub(crate) fn declared_args(
    endpoints: &[Endpoint],
    id: &str,
    query: &[(&str, &str)],
    body: serde_json::Value,
) -> Result<crate::api::Args, String> {
    let spec = &endpoints
        .iter()
        .find(|e| e.spec.id == id)
        .unwrap_or_else(|| panic!("no endpoint {id}"))
        .spec;
    let query: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let body = match body {
        serde_json::Value::Object(map) => Some(map),
        _ => None,
    };
    crate::api::fields::parse(&spec.params, spec.errors, spec.unknown_fields, &query, body)
        .map_err(|e| e.message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Effect;

    /// Every `{name}` of a path is declared as a path parameter (the OpenAPI document,
    /// `/capabilities` and the fuzzer read the declarations).
    #[test]
    fn every_path_segment_is_a_declared_parameter() {
        for endpoint in builtin_endpoints() {
            let spec = &endpoint.spec;
            for segment in spec.path.split('/') {
                let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) else {
                    continue;
                };
                assert!(
                    spec.params
                        .iter()
                        .any(|p| p.name == name && p.location == crate::api::ParamIn::Path),
                    "{} {}: {{{name}}} is not declared",
                    spec.id,
                    spec.path
                );
            }
        }
    }

    fn ids(pick: impl Fn(&crate::api::EndpointSpec) -> bool) -> Vec<String> {
        let mut ids: Vec<String> = builtin_endpoints()
            .into_iter()
            .filter(|e| pick(&e.spec))
            .map(|e| e.spec.id.into_owned())
            .collect();
        ids.sort();
        ids
    }

    /// The presets read the declarations; these are the sets docs/policy.md promises.
    #[test]
    fn presets_follow_the_declarations() {
        assert_eq!(
            ids(|s| s.kept_locked_down),
            [
                "download",
                "files_archive",
                "files_download_stream",
                "files_list",
                "files_search",
                "files_stat",
                "files_watch",
                "list_commands",
                "run_command",
            ]
        );
        let off = ids(|s| s.effect == Effect::Changes && s.group != crate::api::Group::K8sRuntime);
        for id in [
            "upload",
            "files_mkdir",
            "files_delete",
            "files_move",
            "files_upload_stream",
            "shell",
            "shell_stream",
            "process_start",
            "process_signal",
            "process_stdin",
            "run_command",
            "env_set",
            "packages",
            "code_run",
            "git_status",
            "git_diff",
            "pty_create_session",
            "pty_resize",
            "pty_delete_session",
            "pty_connect",
            "browser_navigate",
            "browser_screenshot",
            "agents_responses_create",
        ] {
            assert!(
                off.contains(&id.to_string()),
                "{id} stays on under read-only"
            );
        }
        for id in [
            "files_search",
            "files_archive",
            "capabilities_check",
            "download",
        ] {
            assert!(
                !off.contains(&id.to_string()),
                "{id} is off under read-only"
            );
        }
    }

    /// A knob an endpoint declares it applies must be one a policy can set, or the
    /// "accepted but not applied" warning would never fire for a misspelt one.
    #[test]
    fn enforced_knobs_are_policy_knobs() {
        for endpoint in builtin_endpoints() {
            for knob in &endpoint.spec.enforces {
                assert!(
                    crate::app::policy::is_knob(knob),
                    "{} enforces unknown knob {knob}",
                    endpoint.spec.id
                );
            }
        }
        assert_eq!(
            ids(|s| s.enforces.contains(&"commands")),
            [
                "envd_process_start",
                "process_start",
                "shell",
                "shell_stream"
            ]
        );
    }
}
