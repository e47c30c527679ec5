//! `agents` (opt-in): the OpenAI-compatible `/v1` surface over local coding-agent CLIs
//! (`docs/agents.md` has the whole table): runtimes, models, responses and
//! conversations, the Agents API's saved agents, environments (this sandbox) and
//! templates, vaults and credentials, webhook endpoints, and four routes that exist to refuse. Every route answers errors in
//! OpenAI's envelope, every object carries `x_agent_sandbox`, and the dispatcher adds
//! `X-Agent-Sandbox-Local: 1` to every answer of the group.
//!
//! These are thin adapters over `crate::agents` (the domain: the object store, the turn
//! runner): each resource is one [`resource::Resource`] declaration, each handler reads
//! its declared fields (`call.args()`), calls the domain and shapes the answer; the
//! domain's refusals are worded here.

mod automations;
mod cli;
mod conversations;
mod environments;
mod files;
mod mcp_relay;
mod model_relay;
mod reference_ids;
mod resource;
mod responses;
mod runtimes;
mod saved;
mod session_live;
mod session_setup;
mod sessions;
mod stored;
mod vaults;
mod webhooks;

use std::sync::Arc;

use crate::agents::records::{Quota, StoreError};
use crate::agents::{AgentError, Agents, Runtime};
use crate::api::{ApiError, Args, ErrorStyle, Group, Method, Param};
use crate::app::{handler, Call, Endpoint};

/// The scope every agents route needs by default.
const SCOPE: &str = "agents:use";

fn route(
    method: Method,
    path: impl Into<crate::api::Text>,
    id: impl Into<crate::api::Text>,
    summary: &'static str,
    h: crate::app::Handler,
) -> Endpoint {
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
    // Saved agents' `/v1/agents/{agent_id}` is matched after every literal path of
    // `/v1/agents/...` (runtimes, environments, executors, sessions): the router tries
    // literal segments first, whatever the order here.
    let parts = [
        runtimes::endpoints(),
        responses::endpoints(),
        conversations::endpoints(),
        saved::endpoints(),
        automations::endpoints(),
        environments::endpoints(),
        vaults::endpoints(),
        sessions::endpoints(),
        webhooks::endpoints(),
        files::endpoints(),
        mcp_relay::endpoints(),
        model_relay::endpoints(),
    ];
    // Sized once, as the whole table is (`routes::builtin_endpoints`); the four
    // executor refusals below are the rest.
    let mut endpoints = Vec::with_capacity(parts.iter().map(Vec::len).sum::<usize>() + 4);
    for part in parts {
        endpoints.extend(part);
    }
    endpoints.extend([
        route(
            Method::Post,
            "/v1/agents/executors",
            "agents_executors_register",
            "Refused: no remote executors attach to a local server.",
            handler(|_| async { Err(executor_registration_refused()) }),
        )
        .extension(),
        route(
            Method::Get,
            "/v1/agents/executors/{executor_id}/channel",
            "agents_executors_channel",
            "Refused: no executor channel on a local server.",
            handler(|_| async { Err(executor_channel_refused()) }),
        )
        .params(&[Param::path("executor_id")])
        .extension(),
        // The same refusals where the reference serves them.
        route(
            Method::Post,
            "/v1/agents/environments/{environment_id}/register",
            "agents_cannot_executor_registration",
            "Refused: executor registration.",
            handler(|_| async { Err(executor_registration_refused()) }),
        )
        .params(&[Param::path("environment_id")]),
        route(
            Method::Get,
            "/v1/agents/environments/{environment_id}/connect",
            "agents_cannot_executor_channel",
            "Refused: executor channel.",
            handler(|_| async { Err(executor_channel_refused()) }),
        )
        .params(&[Param::path("environment_id")]),
    ]);
    reference_ids::adopt(endpoints)
}

/// No remote executor registers with a local server (ours at `/v1/agents/executors`,
/// the reference's at `.../environments/{id}/register`).
fn executor_registration_refused() -> ApiError {
    cannot(
        "Executor registration is not available: this server runs agents itself, in this sandbox.",
    )
}

/// No executor channel opens on a local server.
fn executor_channel_refused() -> ApiError {
    cannot("Executor channels are not available: this server runs agents itself, in this sandbox.")
}

/// A path parameter's value.
pub fn path_value(call: &Call, name: &str) -> String {
    call.path_param(name).unwrap_or_default().to_string()
}

/// The agents surface the call's server keeps.
fn agents_of(call: &Call) -> Result<Arc<Agents>, ApiError> {
    call.group_arc::<Agents>()
}

/// The declared fields of the call. A field no declaration names is refused naming the
/// runtime that cannot honour it; `runtime` says which (it may refuse first, as a bad
/// `runtime` or `model` is reported before the fields).
fn args(
    call: &Call,
    runtime: impl FnOnce(&Call) -> Result<&'static str, ApiError>,
) -> Result<Args, ApiError> {
    match call.args() {
        Err(e) if e.code == Some("unsupported_parameter") => {
            let key = e
                .extra
                .iter()
                .find(|(n, _)| *n == "param")
                .and_then(|(_, v)| v.as_str())
                .unwrap_or_default()
                .to_string();
            let runtime = runtime(call)?;
            Err(invalid(
                &key,
                format!("Unsupported parameter: '{key}' cannot be honoured by the local {runtime} runtime."),
            )
            .with_code("unsupported_parameter"))
        }
        other => other,
    }
}

/// The server's own objects are honoured by no runtime but the server's.
fn server_runtime(_: &Call) -> Result<&'static str, ApiError> {
    Ok("agent-sandbox")
}

/// The code of every "this server has no such capability" refusal, and the body's
/// pointer to the runtimes it does have (the reference's shape).
const NOT_IMPLEMENTED_LOCALLY: &str = "agents.not_implemented_locally";

fn not_implemented_label() -> serde_json::Value {
    serde_json::json!({
        "local": true,
        "compute": "none",
        "differences": ["not_implemented_locally"],
        "runtimes": "/v1/agents/runtimes",
    })
}

/// A typed refusal of a route that exists to say the capability is absent (the route's
/// id says which: `agents_cannot_*`).
fn cannot(message: &str) -> ApiError {
    ApiError::new(404, "not_found_error", message)
        .with_code(NOT_IMPLEMENTED_LOCALLY)
        .with_field("x_agent_sandbox", not_implemented_label())
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

fn mib(bytes: usize) -> usize {
    bytes / (1024 * 1024)
}

/// A store refusal about `kind` `id`, which the request named in `param`.
fn store_error(error: StoreError, kind: &str, id: &str, param: &str) -> ApiError {
    let quota = |message: String| {
        ApiError::new(429, "rate_limit_error", message)
            .with_code("agents_store_quota_exceeded")
            .with_header("x-should-retry", "false")
    };
    match error {
        StoreError::NotFound | StoreError::ParentNotFound => not_found(kind, id, param),
        StoreError::UnknownCursor => invalid(param, format!("No item '{id}' in this list.")),
        StoreError::Exists => ApiError::new(500, "server_error", format!("The {kind} '{id}' exists already.")),
        StoreError::Storage(reason) => ApiError::new(500, "server_error", format!("The agents store failed: {reason}")),
        StoreError::Full { collection, limit } => ApiError::new(
            429,
            "rate_limit_error",
            format!("This server keeps at most {limit} {collection}s; delete some first."),
        ),
        StoreError::OverQuota(Quota::Bytes { limit }) => quota(format!(
            "Your conversations and responses hold {} MiB, the most one caller may keep; delete some first.",
            mib(limit)
        )),
        StoreError::OverQuota(Quota::Count { collection, limit }) => quota(format!(
            "You keep {limit} {collection}s, the most one caller may; delete some first."
        )),
        StoreError::OverQuota(Quota::NoRoom { collection, bytes, count }) => quota(format!(
            "Your running {collection}s fill your share of this server ({} MiB, {count} {collection}s); wait for one to end or cancel one.",
            mib(bytes)
        )),
        StoreError::TooLarge { collection, bytes, limit } => ApiError::new(
            413,
            "invalid_request_error",
            format!(
                "This {collection} would hold {} MiB; a {collection} may hold at most {} MiB.",
                mib(bytes),
                mib(limit)
            ),
        )
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
    .with_code(NOT_IMPLEMENTED_LOCALLY)
    .with_field("param", "adapter")
    .with_field("x_agent_sandbox", not_implemented_label())
    .with_header("x-should-retry", "false")
}

impl From<AgentError> for ApiError {
    fn from(error: AgentError) -> ApiError {
        match error {
            AgentError::Store {
                error,
                object,
                id,
                param,
            } => store_error(error, object, &id, param),
            AgentError::Invalid { param, message } => invalid(&param, message),
            AgentError::Unsupported { param, message } => {
                invalid(&param, message).with_code("unsupported_parameter")
            }
            AgentError::Rejected {
                status,
                code,
                param,
                message,
            } => {
                let kind = if status == 404 {
                    "not_found_error"
                } else if status < 500 {
                    "invalid_request_error"
                } else {
                    "server_error"
                };
                let error = ApiError::new(status, kind, message)
                    .with_code(code)
                    .with_field("param", param.map_or(serde_json::Value::Null, Into::into));
                // A conflict the SDK would retry at once (409) says when to.
                match status {
                    409 => error.with_header("Retry-After", "1"),
                    _ => error.with_header("x-should-retry", "false"),
                }
            }
            AgentError::File { error, param } => {
                crate::routes::shared::fs_error(error).with_field("param", param)
            }
            AgentError::Busy { id, param } => ApiError::new(
                409,
                "invalid_request_error",
                format!(
                    "The conversation '{id}' is running a turn; wait for it to end or cancel it."
                ),
            )
            .with_code("conversation_locked")
            .with_field("param", param.to_string()),
            AgentError::NotImplemented(runtime) => not_implemented(runtime),
            AgentError::NotInstalled(runtime) => ApiError::new(
                503,
                "server_error",
                format!(
                    "The {} CLI is not installed. Install it with `{}` ({}), then retry.",
                    runtime.name(),
                    runtime.install_command().unwrap_or_default(),
                    crate::agents::node_requirement(),
                ),
            )
            .with_code("agents.runtime_not_installed")
            .with_header("x-should-retry", "false"),
            AgentError::Failed(message) => ApiError::new(500, "server_error", message),
        }
    }
}

/// The runtime the server uses when a request names none.
fn default_runtime(call: &Call) -> Runtime {
    call.config()
        .agents_default
        .as_deref()
        .and_then(Runtime::parse)
        .unwrap_or(Runtime::Codex)
}

/// The group's state: the `/v1` objects (`<ABX_STATE_DIR>/agents.redb`, or in memory
/// with a startup warning when that cannot be opened) and the turns running now.
pub fn registrar() -> crate::app::Registrar {
    Box::new(|setup| {
        // Vault secrets are sealed with a key from ABX_AGENTS_VAULT_KEY or a key file
        // in the state directory, read on first use.
        crate::agents::seal::configure(&setup.config.state_dir);
        let state_dir = setup.config.state_dir.clone();
        if setup.config.enabled_groups.contains(&Group::Agents) {
            let opened = crate::agents::store::open(&state_dir);
            if let Some(warning) = opened.warning {
                setup.warn(warning);
            }
            announce_restart(opened.restarted);
            let agents = Arc::new(opened.agents);
            setup.provide(agents);
            // Automations fire from the start: a schedule outlives the server, and
            // deliveries the last server left queued go out.
            setup.provide(Arc::new(automations::Starting {
                read_schedule: true,
                resume_webhooks: true,
            }));
        } else {
            // Off at startup (a policy may switch it on later): the store is opened by
            // its first use, and a sandbox that never uses agents gets no file.
            let kept = state_dir.join(crate::agents::store::FILE).exists();
            let agents = Arc::new(Agents::opened_on_first_use(move || {
                let opened = crate::agents::store::open(&state_dir);
                if let Some(warning) = opened.warning {
                    crate::log!("warning: {warning}");
                }
                announce_restart(opened.restarted);
                opened.agents.into_store()
            }));
            setup.provide(agents);
            // The schedule is read, and deliveries the last server left queued go
            // out, only from a store file that exists (reading opens the store); new
            // automations reach the thread through its queue.
            setup.provide(Arc::new(automations::Starting {
                read_schedule: kept,
                resume_webhooks: kept,
            }));
        }
        setup.provide(Arc::new(cli::installer(setup.config)));
        let hub = Arc::new(crate::agents::sessions::live::Hub::default());
        let stopping = hub.clone();
        setup.on_shutdown(move || stopping.stop_all());
        setup.provide(hub);
    })
}

/// The group's background work, once the server serves: the webhooks' and the
/// automations' threads. Started after the workers, so that creating them is not on
/// the way to the first answer.
pub fn started(state: &Arc<crate::app::AppState>) {
    let groups = &state.services.groups;
    if groups
        .get::<automations::Starting>()
        .is_some_and(|s| s.resume_webhooks)
    {
        if let Some(agents) = groups.get_arc::<Agents>() {
            crate::agents::webhooks::outbox::resume(&agents);
        }
    }
    automations::start(state.clone());
}

fn announce_restart(restarted: usize) {
    if restarted > 0 {
        crate::log!(
            "agents: {restarted} records of work that was running when the server stopped now say so (responses and sessions' turns failed, conversations freed)"
        );
    }
}
