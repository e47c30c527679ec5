//! `agents` (opt-in): the OpenAI-compatible `/v1` surface over local coding-agent CLIs,
//! phase 1 (`docs/agents.md` has the whole table): runtimes, models, responses and
//! conversations, and four routes that exist to refuse. Every route answers errors in
//! OpenAI's envelope, every object carries `x_agent_sandbox`, and the dispatcher adds
//! `X-Agent-Sandbox-Local: 1` to every answer of the group.

mod conversations;
mod responses;

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::agents::store::StoreError;
use crate::agents::Runtime;
use crate::api::{ApiError, ErrorStyle, Group, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;
use crate::process::{spawn, Child, Spawn};

/// The scope every agents route needs by default.
const SCOPE: &str = "agents:use";
/// How long `--version` of a CLI may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(15);

fn route(method: Method, path: &str, id: &str, summary: &str, h: crate::app::Handler) -> Endpoint {
    Endpoint::new(method, path, Group::Agents, h)
        .id(id)
        .summary(summary)
        .scopes(&[SCOPE])
        .errors(ErrorStyle::OpenAi)
        .also_answers(&[400, 404, 409, 500, 503])
        // Answered here, not by OpenAI: clients can tell.
        .header("X-Agent-Sandbox-Local", "1")
        // A turn runs programs; it is held for its caller alone.
        .changes()
        .watch_peer()
}

pub fn endpoints() -> Vec<Endpoint> {
    let mut endpoints = vec![
        route(
            Method::Get,
            "/v1/agents/runtimes",
            "agents_runtimes",
            "Every declared agent runtime: implemented, installed, version.",
            handler(runtimes),
        ),
        route(
            Method::Get,
            "/v1/models",
            "models_list",
            "The implemented runtimes, as models.",
            handler(models_list),
        ),
        route(
            Method::Get,
            "/v1/models/{model}",
            "models_get",
            "One runtime, as a model.",
            handler(models_get),
        )
        .params(&[Param::path("model")]),
    ];
    endpoints.extend(responses::endpoints());
    endpoints.extend(conversations::endpoints());
    endpoints.extend([
        route(Method::Post, "/v1/responses/input_tokens", "responses_input_tokens", "Refused: the CLIs count no tokens ahead of a turn.", handler(|_| async { Err(cannot("agents_cannot_count_input_tokens", "Counting input tokens is not available: the local runtimes report usage only after a turn (see usage on the response).")) })),
        route(Method::Delete, "/v1/models/{model}", "models_delete", "Refused: local runtimes cannot be deleted.", handler(|_| async { Err(cannot("agents_cannot_delete_models", "Models are the local agent runtimes; they cannot be deleted through the API.")) }))
            .params(&[Param::path("model")]),
        route(Method::Post, "/v1/agents/executors", "agents_executors_register", "Refused: no remote executors attach to a local server.", handler(|_| async { Err(cannot("agents_cannot_register_executors", "Executor registration is not available: this server runs agents itself, in this sandbox.")) })),
        route(Method::Get, "/v1/agents/executors/{executor_id}/channel", "agents_executors_channel", "Refused: no executor channel on a local server.", handler(|_| async { Err(cannot("agents_cannot_open_executor_channels", "Executor channels are not available: this server runs agents itself, in this sandbox.")) }))
            .params(&[Param::path("executor_id")]),
    ]);
    endpoints
}

/// `x_agent_sandbox`: how an object differs from what OpenAI's API would return.
fn label(compute: &str, differences: &[&str]) -> Value {
    json!({"local": true, "compute": compute, "differences": differences})
}

/// A typed refusal of a route that exists to say the capability is absent.
fn cannot(code: &'static str, message: &str) -> ApiError {
    ApiError::new(404, "not_found_error", message)
        .with_code(code)
        .with_header("x-should-retry", "false")
}

/// 400 `invalid_request_error` naming the parameter.
fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(400, "invalid_request_error", message).with_field("param", param.to_string())
}

/// 404 `not_found_error` for an id this caller does not own (or nobody does).
fn not_found(kind: &str, id: &str, param: &str) -> ApiError {
    ApiError::new(
        404,
        "not_found_error",
        format!("No {kind} found with id '{id}'."),
    )
    .with_field("param", param.to_string())
}

fn store_error(error: StoreError, kind: &str, id: &str, param: &str) -> ApiError {
    match error {
        StoreError::NotFound => not_found(kind, id, param),
        StoreError::Busy => ApiError::new(
            409,
            "invalid_request_error",
            format!("The {kind} '{id}' is running a turn; wait for it to end or cancel it."),
        )
        .with_code("conversation_locked")
        .with_field("param", param.to_string()),
        StoreError::Full(what) => ApiError::new(
            429,
            "rate_limit_error",
            format!(
                "This server keeps at most {} {what}; delete some first.",
                match what {
                    "items" => crate::agents::store::MAX_ITEMS,
                    _ => crate::agents::store::MAX_CONVERSATIONS,
                }
            ),
        ),
        StoreError::OverQuota(message) => ApiError::new(429, "rate_limit_error", message)
            .with_code("agents_store_quota_exceeded")
            .with_header("x-should-retry", "false"),
        StoreError::TooLarge(message) => ApiError::new(413, "invalid_request_error", message)
            .with_code("agents_object_too_large")
            .with_field("param", param.to_string()),
    }
}

/// 404 for a runtime that is declared but has no local backend.
fn not_implemented(runtime: Runtime) -> ApiError {
    ApiError::new(
        404,
        "not_found_error",
        format!(
            "The runtime '{}' has no local backend on this server. GET /v1/agents/runtimes lists the runtimes and which are implemented.",
            runtime.name()
        ),
    )
    .with_code("agents.not_implemented_locally")
    .with_header("x-should-retry", "false")
}

/// The JSON body as an object (an empty body is `{}`).
fn body(call: &Call) -> Result<Map<String, Value>, ApiError> {
    if call.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(&call.body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(invalid("body", "The request body must be a JSON object.")),
        Err(e) => Err(invalid(
            "body",
            format!("The request body is not valid JSON: {e}"),
        )),
    }
}

/// Refuses every field not in `known` (a field the runtime cannot honour is never
/// accepted and ignored). `null` counts as absent.
fn only_known(body: &Map<String, Value>, known: &[&str], runtime: &str) -> Result<(), ApiError> {
    match body
        .iter()
        .find(|(k, v)| !v.is_null() && !known.contains(&k.as_str()))
    {
        Some((key, _)) => Err(invalid(
            key,
            format!(
                "Unsupported parameter: '{key}' cannot be honoured by the local {runtime} runtime."
            ),
        )
        .with_code("unsupported_parameter")),
        None => Ok(()),
    }
}

fn metadata(body: &Map<String, Value>) -> Result<Value, ApiError> {
    match body.get("metadata") {
        None | Some(Value::Null) => Ok(json!({})),
        Some(Value::Object(map)) => {
            if map.len() > 16
                || map
                    .iter()
                    .any(|(k, v)| k.len() > 64 || v.as_str().is_none_or(|s| s.len() > 512))
            {
                return Err(invalid("metadata", "metadata holds at most 16 string values, keys up to 64 and values up to 512 characters."));
            }
            Ok(Value::Object(map.clone()))
        }
        Some(_) => Err(invalid(
            "metadata",
            "metadata must be an object of strings.",
        )),
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The runtime the server uses when a request names none.
fn default_runtime(call: &Call) -> Runtime {
    call.config()
        .agents_default
        .as_deref()
        .and_then(Runtime::parse)
        .unwrap_or(Runtime::Codex)
}

/// Where a runtime's CLI is on the children's `PATH`, if anywhere. Blocking (stats):
/// call it on the pool.
fn find_cli(
    runtime: Runtime,
    env: &[(std::ffi::OsString, std::ffi::OsString)],
) -> Option<std::path::PathBuf> {
    let cli = runtime.cli()?;
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone());
    let root = rustix::fs::open(
        "/",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .ok()?;
    spawn::find_program(
        cli.program,
        path.as_deref(),
        std::os::fd::AsFd::as_fd(&root),
    )
    .ok()
}

/// `--version` of each CLI path, once per server.
fn versions() -> &'static Mutex<Vec<(std::path::PathBuf, String)>> {
    static VERSIONS: OnceLock<Mutex<Vec<(std::path::PathBuf, String)>>> = OnceLock::new();
    VERSIONS.get_or_init(Mutex::default)
}

/// The version a CLI prints (`codex-cli 0.169.0` is `0.169.0`).
async fn cli_version(call: &Call, program: &std::path::Path) -> Option<String> {
    if let Some((_, v)) = versions().lock().ok()?.iter().find(|(p, _)| p == program) {
        return Some(v.clone());
    }
    let cwd = super::process::working_dir(call, None).await.ok()?;
    let spec = Spawn {
        argv: vec![program.display().to_string(), "--version".into()],
        cwd,
        env: call.services().environment.with(&[]),
        stdin: false,
        capture: true,
        terminal: None,
    };
    let child = Child::spawn(spec, &call.services().children).await.ok()?;
    let done = match crate::process::run::run_to_end(child, VERSION_TIMEOUT, 64 * 1024)
        .await
        .ok()?
    {
        crate::process::run::RunEnd::Completed(done) => done,
        crate::process::run::RunEnd::TimedOut => return None,
    };
    let version = done
        .stdout
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))?
        .to_string();
    if let Ok(mut cache) = versions().lock() {
        cache.push((program.to_path_buf(), version.clone()));
    }
    Some(version)
}

async fn runtimes(call: Call) -> Result<Response, ApiError> {
    let default = default_runtime(&call);
    let mut data = Vec::new();
    for runtime in Runtime::ALL {
        let found = if runtime.implemented() {
            let env = call.services().environment.snapshot();
            let lookup = monoio::spawn_blocking(move || find_cli(runtime, &env));
            lookup.await.ok().flatten()
        } else {
            None
        };
        let version = match &found {
            Some(path) => cli_version(&call, path).await,
            None => None,
        };
        let cli = runtime.cli();
        data.push(json!({
            "id": runtime.name(),
            "object": "agents.runtime",
            "aliases": runtime.aliases(),
            "implemented": runtime.implemented(),
            "installed": found.is_some(),
            "version": version,
            "default": runtime == default,
            "cli": cli.as_ref().map(|c| c.program),
            "pinned_version": cli.as_ref().map(|c| c.version),
            "install": runtime.install_command(),
            "x_agent_sandbox": label(runtime.name(), &[]),
        }));
    }
    Ok(Response::ok(
        &json!({"object": "list", "data": data, "x_agent_sandbox": label("agent-sandbox", &[])}),
    ))
}

fn model_object(runtime: Runtime, created: u64) -> Value {
    json!({
        "id": runtime.name(),
        "object": "model",
        "created": created,
        "owned_by": "agent-sandbox",
        "x_agent_sandbox": label(runtime.name(), &["model_is_runtime"]),
    })
}

async fn models_list(call: Call) -> Result<Response, ApiError> {
    let created = started_unix(&call);
    let data: Vec<Value> = Runtime::ALL
        .into_iter()
        .filter(|r| r.implemented())
        .map(|r| model_object(r, created))
        .collect();
    Ok(Response::ok(
        &json!({"object": "list", "data": data, "x_agent_sandbox": label("agent-sandbox", &[])}),
    ))
}

async fn models_get(call: Call) -> Result<Response, ApiError> {
    let id = call.path_param("model").unwrap_or_default().to_string();
    match Runtime::parse(&id) {
        Some(runtime) if runtime.implemented() => {
            Ok(Response::ok(&model_object(runtime, started_unix(&call))))
        }
        Some(runtime) => Err(not_implemented(runtime)),
        None => Err(ApiError::new(
            404,
            "not_found_error",
            format!("The model '{id}' does not exist. GET /v1/models lists the local runtimes."),
        )
        .with_code("model_not_found")
        .with_field("param", "model")),
    }
}

/// When the server started, as a Unix time (the models' `created`).
fn started_unix(call: &Call) -> u64 {
    now_unix().saturating_sub(call.services().started.elapsed().as_secs())
}
