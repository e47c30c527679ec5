//! The core group: liveness and discovery. Always on.

use serde_json::{json, Map, Value};

use crate::api::{ApiError, Group, Listener, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;

/// Version of the discovery document's shape.
pub const API_VERSION: u32 = 2;

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::new(Method::Get, "/health", Group::Core, handler(health))
            .id("health")
            .summary("Liveness probe (anonymous).")
            .auth_required(false)
            .returns(|| json!({"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}})),
        Endpoint::new(
            Method::Get,
            "/capabilities",
            Group::Core,
            handler(capabilities),
        )
        .id("capabilities").scopes(&["core:read"])
        .summary("Discovery document: every endpoint with its state for this caller.")
        .returns(|| json!({"type": "object", "required": ["api_version", "server_version", "groups", "group_summary", "identity", "policy", "endpoints", "warnings"]})),
        Endpoint::new(
            Method::Post,
            "/capabilities/check",
            Group::Core,
            handler(capabilities_check),
        )
        .id("capabilities_check").scopes(&["core:read"])
        .only_reads()
        .summary("Whether this caller may use an endpoint (and a path), without calling it.")
        .params(&[
            Param::body("endpoint", "string", true)
                .at_least(1.0)
                .missing(ENDPOINT_REQUIRED)
                .invalid(ENDPOINT_REQUIRED)
                .doc("An endpoint id from GET /capabilities."),
            Param::body("path", "string", false)
                .invalid("path: must be a string")
                .doc("A path the call would name: checked against the base directory and the endpoint's paths and extension rules."),
            Param::body("paths", "array", false)
                .invalid("'paths' must be a list of strings")
                .doc("Several paths the call would name, each checked as path is."),
            Param::body("op", "string", false)
                .invalid("'op' must be read, write, delete or exec")
                .doc("What the call would do with the paths (read, write, delete or exec); by default what the endpoint does. A write or delete is refused where the paths rule is read_only."),
            Param::body("command", "string", false)
                .invalid("command: must be a string")
                .doc("A command line the call would run: checked against the endpoint's commands rule."),
        ])
        .returns(|| json!({"type": "object", "required": ["endpoint", "allowed", "code", "reason"], "properties": {
            "endpoint": {"type": "string"}, "allowed": {"type": "boolean"},
            "code": {"type": ["string", "null"]}, "reason": {"type": ["string", "null"]},
        }})),
        Endpoint::new(Method::Get, "/openapi.json", Group::Core, handler(openapi))
            .id("openapi").extension().scopes(&["core:read"])
            .summary("This API as an OpenAPI 3.1 document, generated from the route table.")
            .returns(|| json!({"type": "object", "required": ["openapi", "paths"]})),
    ]
}

pub(crate) async fn openapi(call: Call) -> Result<Response, ApiError> {
    let document = crate::app::openapi::document(&call.catalog().endpoints, call.spec().listener);
    Ok(Response::ok(&document))
}

async fn health(_call: Call) -> Result<Response, ApiError> {
    Ok(Response::raw(
        200,
        crate::http::JSON_CONTENT_TYPE,
        br#"{"status":"ok"}"#.to_vec(),
    ))
}

async fn capabilities(call: Call) -> Result<Response, ApiError> {
    // The base directory's state now, not at startup: it may have been made since.
    let base = call.services().base.clone();
    let base_missing = crate::runtime::file::blocking(move || base.missing_warning())
        .await
        .ok()
        .flatten();
    let catalog = call.catalog();
    let identity = &call.identity;
    let mut endpoints = Map::new();
    let mut summary: Vec<(Group, usize, usize)> = Group::ALL.iter().map(|g| (*g, 0, 0)).collect();
    for (index, ep) in catalog.endpoints.iter().enumerate() {
        let ep = &ep.spec;
        let decision = &catalog.decisions[index];
        let access = catalog.access(index, identity);
        let counts = &mut summary[Group::ALL.iter().position(|g| *g == ep.group).unwrap_or(0)];
        counts.2 += 1;
        if decision.enabled {
            counts.1 += 1;
        }
        let mut entry = Map::new();
        entry.insert("method".into(), json!(ep.method_name()));
        entry.insert("path".into(), json!(ep.path));
        entry.insert("group".into(), json!(ep.group.name()));
        entry.insert("summary".into(), json!(ep.summary));
        entry.insert("streaming".into(), json!(ep.streaming));
        // Only on this server's own endpoints: the others keep the reference's shape.
        if ep.extension {
            entry.insert("extension".into(), json!(true));
            // The port of an endpoint served beside the API's (envd's, k8s_runtime's).
            let port = match ep.listener {
                Listener::Envd => Some(
                    call.services()
                        .bound_envd_port
                        .get()
                        .copied()
                        .unwrap_or(call.config().envd_port),
                ),
                Listener::K8sRuntime => Some(call.config().k8s_runtime_port),
                Listener::Api | Listener::Pty => None,
            };
            if let Some(port) = port {
                entry.insert("port".into(), json!(port));
            }
        }
        entry.insert("enabled".into(), json!(decision.enabled));
        entry.insert("allowed".into(), json!(access.allowed));
        entry.insert("reason".into(), json!(access.code));
        entry.insert("rule".into(), json!(access.rule));
        entry.insert("scopes".into(), json!(decision.scopes));
        if access.allowed {
            entry.insert("limits".into(), Value::Object(decision.limits.clone()));
            entry.insert("params".into(), ep.params_json());
            // What confines the endpoint's paths, as the reference discloses it (the
            // deny patterns themselves stay undisclosed: only their count).
            if ep.enforces.contains(&"paths") {
                entry.insert(
                    "paths".into(),
                    json!({
                        "allow": decision.knob_list("paths.allow").unwrap_or_default(),
                        "read_only": decision.knob_bool("paths.read_only").unwrap_or(false),
                        "deny_count": decision.knob_list("paths.deny").map_or(0, |d| d.len()),
                        "symlinks": decision.knob_str("paths.symlinks").unwrap_or("within"),
                    }),
                );
            }
        }
        endpoints.insert(ep.id.to_string(), Value::Object(entry));
    }
    let groups: Map<String, Value> = summary
        .iter()
        .map(|(g, enabled, _)| (g.name().to_string(), json!(*enabled > 0)))
        .collect();
    let group_summary: Map<String, Value> = summary
        .iter()
        .map(|(g, enabled, total)| {
            (
                g.name().to_string(),
                json!({"enabled": enabled, "total": total}),
            )
        })
        .collect();
    // The server's own warnings are its configuration: shown to an identity that holds
    // every scope, not to a narrow one (as the reference shows a narrow identity none).
    let holds_everything = identity.scopes.iter().any(|s| s == "*");
    let mut warnings: Vec<String> = Vec::new();
    if holds_everything {
        warnings.extend(catalog.warnings.iter().cloned().chain(base_missing));
        if catalog.auth.per_identity() {
            warnings.push("identity holds the wildcard scope '*'".to_string());
        }
    }
    let document = json!({
        "api_version": API_VERSION,
        "server_version": env!("CARGO_PKG_VERSION"),
        "groups": groups,
        "group_summary": group_summary,
        // Sorted, as the reference shows them.
        "identity": {"id": identity.id, "scopes": sorted(&identity.scopes)},
        "policy": {
            "preset": catalog.policy.preset,
            "revision": catalog.policy.revision,
            "configured": catalog.policy.configured,
        },
        "endpoints": endpoints,
        "warnings": warnings,
    });
    Ok(Response::ok(&document))
}

/// The refusal for an `endpoint` that is not a non-empty string.
const ENDPOINT_REQUIRED: &str =
    "endpoint: a non-empty string (an endpoint id from GET /capabilities) is required";

async fn capabilities_check(call: Call) -> Result<Response, ApiError> {
    // `command` is read after the endpoint and path checks, as before the fields were
    // declared: an unknown endpoint is answered before a bad command.
    let args = call.args_of(&call.params_named(&["endpoint", "path", "paths", "op"]))?;
    let endpoint = args.string("endpoint");
    let path = args.str("path").map(str::to_string);
    // Every field is checked before the endpoint is looked up, as on the reference.
    let mut paths: Vec<String> = path.into_iter().collect();
    if let Some(listed) = args.value("paths") {
        let listed = listed
            .as_array()
            .filter(|items| items.iter().all(Value::is_string))
            .ok_or_else(|| ApiError::bad_request("'paths' must be a list of strings"))?;
        paths.extend(listed.iter().filter_map(Value::as_str).map(str::to_string));
    }
    let mutating = match args.str("op") {
        None => None,
        Some("read" | "exec") => Some(false),
        Some("write" | "delete") => Some(true),
        Some(_) => {
            return Err(ApiError::bad_request(
                "'op' must be read, write, delete or exec",
            ))
        }
    };
    let catalog = call.catalog();
    let Some((index, _)) = catalog.endpoint(&endpoint) else {
        return Ok(Response::ok(&json!({
            "endpoint": endpoint,
            "allowed": false,
            "code": "unknown_endpoint",
            "reason": format!("No endpoint has the id '{endpoint}'; GET /capabilities lists them"),
        })));
    };
    let access = catalog.access(index, &call.identity);
    if !access.allowed {
        return Ok(Response::ok(&json!({
            "endpoint": endpoint,
            "allowed": false,
            "code": access.code,
            "reason": access.reason,
            "rule": access.rule,
        })));
    }
    for path in &paths {
        if let Err(refusal) = call.services().base.confine(path) {
            let refusal = crate::routes::shared::fs_error(refusal);
            let rule = if catalog.policy.base_dir.is_some() {
                "policy:base_dir"
            } else {
                "default:base_dir"
            };
            return Ok(Response::ok(&json!({
                "endpoint": endpoint,
                "allowed": false,
                "code": refusal.code,
                "reason": refusal.message,
                "rule": rule,
            })));
        }
    }
    // The same refusals the endpoint's route gives, from the same functions.
    let decision = &catalog.decisions[index];
    let refused = |error: ApiError, rule: String| {
        Ok(Response::ok(&json!({
            "endpoint": endpoint,
            "allowed": false,
            "code": error.code,
            "reason": error.message,
            "rule": rule,
        })))
    };
    for path in &paths {
        if let Ok(caller) = call.services().base.confine(path) {
            let refusal = match mutating {
                Some(mutating) => {
                    crate::routes::shared::paths_refusal_for(decision, &endpoint, &caller, mutating)
                }
                None => crate::routes::shared::paths_refusal(decision, &endpoint, &caller),
            };
            if let Some(error) = refusal {
                return refused(error, format!("policy:endpoints.{endpoint}.paths"));
            }
            if let Some((error, knob)) =
                crate::routes::shared::extension_refusal(decision, &endpoint, &caller)
            {
                return refused(error, format!("policy:endpoints.{endpoint}.{knob}"));
            }
        }
    }
    let args = call.args_of(&call.params_named(&["command"]))?;
    if let Some(command) = args.str("command") {
        let argv = crate::process::shlex::split(command)
            .map_err(|e| ApiError::bad_request(format!("command: {}", e.0)))?;
        if let Some(error) = crate::routes::shared::command_refusal(decision, &endpoint, &argv) {
            return refused(error, format!("policy:endpoints.{endpoint}.commands"));
        }
    }
    Ok(Response::ok(
        &json!({"endpoint": endpoint, "allowed": true, "code": null, "reason": null}),
    ))
}

/// `scopes` in sorted order.
fn sorted(scopes: &[String]) -> Vec<&str> {
    let mut out: Vec<&str> = scopes.iter().map(String::as_str).collect();
    out.sort_unstable();
    out
}
