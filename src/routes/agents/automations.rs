//! `/v1/agents/automations`: thin adapters over `crate::agents::automations`, plus the
//! two things only this layer can do. It checks a `target` as a session create would
//! (the workspace beneath the base directory, the saved agent and vaults the caller's,
//! the agent one codex can run), and it is the scheduler's [`Deliver`]: a run is the
//! owner's own request (`POST /v1/agents/sessions`, or a message event to the
//! existing session) served in-process as that identity is in the policy now.
//!
//! These routes are literal paths under `/v1/agents/`, so the router matches them
//! before saved agents' `/v1/agents/{agent_id}`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::stored::{list_page, page_query, paging};
use super::{agents_of, invalid, path_value, route};
use crate::agents::automations::scheduler::{self, Deliver, Delivered};
use crate::agents::automations::{self, Delivery, NewTarget, Outcome, MAX_INSTRUCTIONS};
use crate::agents::body::metadata;
use crate::agents::sessions::inputs::{parse_messages, Part};
use crate::agents::Agents;
use crate::api::{ApiError, Method, Param};
use crate::app::client::{InProcess, Request};
use crate::app::{handler, AppState, Call, Endpoint};
use crate::http::Response;

const COLLECTION: &str = "/v1/agents/automations";
/// Where a new-session run creates its session.
const SESSIONS: &str = "/v1/agents/sessions";
const MEMBER: &str = "/v1/agents/automations/{automation_id}";
const ID: &str = "automation_id";
const RUN_ID: &str = "invocation_id";

fn fields(create: bool) -> Vec<Param> {
    let mut fields = Vec::new();
    if create {
        fields.push(
            Param::body("type", "string", true)
                .one_of(&["periodic", "once"])
                .doc("periodic (expression and timezone) or once (run_at)."),
        );
    }
    fields.extend([
        Param::body("name", "string", create).doc("1 to 256 characters."),
        Param::body("target", "object", create).doc("new_session (environment, input, agent or agent_id, vault_ids, metadata) or existing_session (session_id, instructions); an update keeps its type."),
        Param::body("expression", "string", false).doc("Periodic: a cron expression (five fields, or six with leading seconds) read in timezone."),
        Param::body("timezone", "string", false).doc("Periodic: an IANA time zone name (the database is built in)."),
        Param::body("run_at", "integer", false).doc("Once: a Unix time in seconds, in the future."),
        Param::body("metadata", "string_map", false).doc("16 strings at most, keys up to 64 and values up to 512 characters."),
    ]);
    fields
}

pub fn endpoints() -> Vec<Endpoint> {
    let member = |method, path: &'static str, id: &'static str, summary, h, extra: Vec<Param>| {
        let mut params = vec![Param::path(ID)];
        params.extend(extra);
        route(method, path, id, summary, h)
            .params(&params)
            .extension()
    };
    let mut list_params = paging();
    list_params.push(
        Param::query("session_id", "string", false)
            .doc("Only automations whose target is this existing session."),
    );
    let mut runs_params = vec![Param::path(ID)];
    runs_params.extend(paging());
    vec![
        route(
            Method::Post,
            COLLECTION,
            "agents_automations_create",
            "Schedule session turns: periodic (cron in a time zone) or once at run_at.",
            handler(create),
        )
        .params(&fields(true))
        .extension(),
        route(
            Method::Get,
            COLLECTION,
            "agents_automations_list",
            "Your automations.",
            handler(list),
        )
        .params(&list_params)
        .extension(),
        member(
            Method::Get,
            MEMBER,
            "agents_automations_get",
            "An automation.",
            handler(get),
            Vec::new(),
        ),
        member(
            Method::Post,
            MEMBER,
            "agents_automations_update",
            "Change an automation (target and metadata are replaced whole).",
            handler(update),
            fields(false),
        ),
        member(
            Method::Delete,
            MEMBER,
            "agents_automations_delete",
            "Delete an automation and its runs.",
            handler(delete),
            Vec::new(),
        ),
        member(
            Method::Post,
            "/v1/agents/automations/{automation_id}/pause",
            "agents_automations_pause",
            "No scheduled run until resumed.",
            handler(pause),
            Vec::new(),
        ),
        member(
            Method::Post,
            "/v1/agents/automations/{automation_id}/resume",
            "agents_automations_resume",
            "Scheduled runs again, from the next occurrence.",
            handler(resume),
            Vec::new(),
        ),
        member(
            Method::Post,
            "/v1/agents/automations/{automation_id}/invocations",
            "agents_automations_invocations_create",
            "Run the target now; the schedule does not move.",
            handler(invoke),
            Vec::new(),
        ),
        route(
            Method::Get,
            "/v1/agents/automations/{automation_id}/invocations",
            "agents_automations_invocations_list",
            "An automation's runs.",
            handler(runs),
        )
        .params(&runs_params)
        .extension(),
        route(
            Method::Get,
            "/v1/agents/automations/{automation_id}/invocations/{invocation_id}",
            "agents_automations_invocations_get",
            "One run of an automation.",
            handler(run),
        )
        .params(&[Param::path(ID), Param::path(RUN_ID)])
        .extension(),
    ]
}

async fn create(call: Call) -> Result<Response, ApiError> {
    ensure_started(&call);
    let mut body: Map<String, Value> = call.json()?;
    let target = match body.remove("target") {
        None | Some(Value::Null) => {
            return Err(invalid(
                "target",
                "target is required: {\"type\": \"new_session\", ...} or {\"type\": \"existing_session\", ...}.",
            ))
        }
        Some(value) => check_target(&call, &value).await?,
    };
    let object = automations::create(&agents_of(&call)?, &call.identity.id, body, target).await?;
    Ok(Response::ok(&object))
}

async fn list(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let (order, limit, after) = page_query(&args);
    let session_id = args.str("session_id").map(str::to_string);
    let (data, has_more) = automations::list(
        &agents_of(&call)?,
        &call.identity.id,
        after,
        limit,
        order,
        session_id,
    )
    .await?;
    Ok(list_page(data, has_more, &DIFFERENCES))
}

/// What the lists of this module say about themselves.
const DIFFERENCES: [&str; 1] = ["local_scheduler"];

async fn get(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, ID);
    let object = automations::get(&agents_of(&call)?, &call.identity.id, &id).await?;
    Ok(Response::ok(&object))
}

async fn update(call: Call) -> Result<Response, ApiError> {
    ensure_started(&call);
    let mut body: Map<String, Value> = call.json()?;
    let target = match body.remove("target") {
        None | Some(Value::Null) => None,
        Some(value) => Some(check_target(&call, &value).await?),
    };
    let id = path_value(&call, ID);
    let object =
        automations::update(&agents_of(&call)?, &call.identity.id, &id, body, target).await?;
    Ok(Response::ok(&object))
}

async fn delete(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, ID);
    let object = automations::delete(&agents_of(&call)?, &call.identity.id, &id).await?;
    Ok(Response::ok(&object))
}

async fn pause(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, ID);
    let object = automations::pause(&agents_of(&call)?, &call.identity.id, &id).await?;
    Ok(Response::ok(&object))
}

async fn resume(call: Call) -> Result<Response, ApiError> {
    ensure_started(&call);
    let id = path_value(&call, ID);
    let object = automations::resume(&agents_of(&call)?, &call.identity.id, &id).await?;
    Ok(Response::ok(&object))
}

async fn invoke(call: Call) -> Result<Response, ApiError> {
    ensure_started(&call);
    let id = path_value(&call, ID);
    let object = automations::invoke(&agents_of(&call)?, &call.identity.id, &id).await?;
    Ok(Response::ok(&object))
}

async fn runs(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let id = path_value(&call, ID);
    let (order, limit, after) = page_query(&args);
    let (data, has_more) = automations::invocations(
        &agents_of(&call)?,
        &call.identity.id,
        &id,
        after,
        limit,
        order,
    )
    .await?;
    Ok(list_page(data, has_more, &DIFFERENCES))
}

async fn run(call: Call) -> Result<Response, ApiError> {
    let (id, run) = (path_value(&call, ID), path_value(&call, RUN_ID));
    let object = automations::invocation(&agents_of(&call)?, &call.identity.id, &id, &run).await?;
    Ok(Response::ok(&object))
}

/// Refuses every key of `map` but `allowed` (null counts as absent), naming it.
fn known(map: &Map<String, Value>, at: &str, allowed: &[&str]) -> Result<(), ApiError> {
    match map
        .iter()
        .find(|(k, v)| !v.is_null() && !allowed.contains(&k.as_str()))
    {
        Some((key, _)) => Err(invalid(
            &format!("{at}.{key}"),
            format!("Unsupported parameter: '{at}.{key}' is not a field of this target."),
        )
        .with_code("unsupported_parameter")),
        None => Ok(()),
    }
}

/// A `target`, checked as the session create of each run will check it, and what a
/// run delivers.
async fn check_target(call: &Call, value: &Value) -> Result<NewTarget, ApiError> {
    let Some(map) = value.as_object() else {
        return Err(invalid("target", "target must be an object."));
    };
    match map.get("type").and_then(Value::as_str).unwrap_or_default() {
        "new_session" => new_session(call, map).await,
        "existing_session" => existing_session(map),
        "" => Err(invalid(
            "target.type",
            "target.type is required: new_session or existing_session.",
        )),
        other => Err(invalid(
            "target.type",
            format!("Unknown target type '{other}': new_session or existing_session."),
        )),
    }
}

fn existing_session(map: &Map<String, Value>) -> Result<NewTarget, ApiError> {
    known(map, "target", &["type", "session_id", "instructions"])?;
    let session_id = match map.get("session_id") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        _ => {
            return Err(invalid(
                "target.session_id",
                "target.session_id is required: the id of one of your sessions.",
            ))
        }
    };
    let instructions = match map.get("instructions") {
        Some(Value::String(text))
            if !text.trim().is_empty() && text.chars().count() <= MAX_INSTRUCTIONS =>
        {
            text.clone()
        }
        _ => {
            return Err(invalid(
                "target.instructions",
                format!("target.instructions is required: the message each run sends the session, 1 to {MAX_INSTRUCTIONS} characters."),
            ))
        }
    };
    Ok(NewTarget {
        kind: "existing_session".into(),
        shown: json!({"type": "existing_session", "session_id": session_id, "instructions": instructions}),
        delivery: json!({"session_id": session_id, "instructions": instructions}),
        session_id: Some(session_id),
    })
}

async fn new_session(call: &Call, map: &Map<String, Value>) -> Result<NewTarget, ApiError> {
    known(
        map,
        "target",
        &[
            "type",
            "environment",
            "input",
            "agent",
            "agent_id",
            "metadata",
            "vault_ids",
        ],
    )?;
    let agents = agents_of(call)?;
    let environment = map.get("environment").cloned().unwrap_or(Value::Null);
    if environment.is_null() {
        return Err(invalid(
            "target.environment",
            "target.environment is required: {\"type\": \"self_hosted\", \"workspace_directory\": \"/workspace\"} or {\"type\": \"none\"}.",
        ));
    }
    let (session_environment, _) = super::session_setup::environment_of(call, &environment)
        .await
        .map_err(|e| prefixed(e, "target."))?;
    let shown_environment = match session_environment["type"].as_str() {
        Some("self_hosted") => json!({
            "type": "self_hosted",
            "capability_directories": [],
            "environment_id": null,
            "workspace_directory": session_environment["workspace_directory"],
        }),
        _ => json!({"type": "none"}),
    };
    let input = map.get("input").filter(|v| !v.is_null()).ok_or_else(|| {
        invalid(
            "target.input",
            "target.input is required: the user messages each new session starts with.",
        )
    })?;
    let messages = parse_messages(input, "target.input")?;
    let input: Vec<Value> = messages
        .iter()
        .map(|parts| {
            let content: Vec<Value> = parts
                .iter()
                .map(|part| match part {
                    Part::Text(text) => json!({"type": "input_text", "text": text}),
                    Part::Image(url) => json!({"type": "input_image", "image_url": url}),
                })
                .collect();
            json!({"type": "message", "role": "user", "content": content})
        })
        .collect();
    let agent = map.get("agent").filter(|v| !v.is_null());
    let agent_id = match map.get("agent_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => {
            return Err(invalid(
                "target.agent_id",
                "target.agent_id must be a string.",
            ))
        }
    };
    let overrides = match (agent, &agent_id) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(invalid(
                "target.agent",
                "Provide exactly one of target.agent (an inline agent) and target.agent_id (a saved agent).",
            ))
        }
        (Some(Value::Object(map)), None) => map.clone(),
        (Some(_), None) => return Err(invalid("target.agent", "target.agent must be an object.")),
        (None, Some(_)) => Map::new(),
    };
    let (config, _) =
        super::session_setup::session_agent(call, &agents, agent_id.clone(), overrides.clone())
            .await
            .map_err(|e| prefixed(e, "target."))?;
    let vault_ids: Vec<String> = match map.get("vault_ids") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(ids)) if ids.len() <= 10 && ids.iter().all(Value::is_string) => ids
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        Some(_) => {
            return Err(invalid(
                "target.vault_ids",
                "target.vault_ids holds at most 10 vault ids (strings).",
            ))
        }
    };
    super::session_setup::check_vaults(call, &agents, &vault_ids, &config.tools)
        .await
        .map_err(|e| prefixed(e, "target."))?;
    let metadata = metadata(map.get("metadata"), "target.metadata")?;
    let mut delivery = json!({
        "environment": environment,
        "input": input,
        "vault_ids": vault_ids,
        "metadata": metadata,
    });
    match &agent_id {
        Some(id) => delivery["agent_id"] = json!(id),
        None => delivery["agent"] = Value::Object(overrides),
    }
    Ok(NewTarget {
        kind: "new_session".into(),
        shown: json!({
            "type": "new_session",
            "agent": if agent_id.is_some() { Value::Null } else { config.inline_view() },
            "agent_id": agent_id,
            "environment": shown_environment,
            "input": input,
            "metadata": metadata,
            "vault_ids": vault_ids,
        }),
        delivery,
        session_id: None,
    })
}

/// A session create's refusal, its `param` placed under `target` (`agent.model` is
/// `target.agent.model` here).
fn prefixed(mut error: ApiError, prefix: &str) -> ApiError {
    for (name, value) in error.extra.iter_mut() {
        if *name == "param" {
            if let Some(param) = value.as_str().filter(|p| !p.starts_with(prefix)) {
                *value = json!(format!("{prefix}{param}"));
            }
        }
    }
    error
}

/// Runs are delivered by the app itself, as their owner.
struct AppDeliverer {
    state: Arc<AppState>,
}

/// Bytes of an in-process answer read (a session object, or an error).
const ANSWER_LIMIT: usize = 4 * 1024 * 1024;

impl Deliver for AppDeliverer {
    fn deliver<'a>(
        &'a self,
        owner: &'a str,
        delivery: Delivery,
    ) -> Pin<Box<dyn Future<Output = Delivered> + 'a>> {
        Box::pin(async move {
            let (target, body, session) = match delivery {
                Delivery::NewSession(body) => (SESSIONS.to_string(), body, None),
                Delivery::ExistingSession {
                    session_id,
                    instructions,
                } => (
                    format!(
                        "{SESSIONS}/{}/events",
                        percent_encoding::utf8_percent_encode(
                            &session_id,
                            percent_encoding::NON_ALPHANUMERIC
                        )
                    ),
                    json!({"events": [{
                        "type": "agent.session.input.message",
                        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": instructions}]}],
                    }]}),
                    Some(session_id),
                ),
            };
            let request = Request::new("POST", &target)
                .header("Content-Type", "application/json")
                .header("OpenAI-Beta", "agents=v1")
                .body(body.to_string());
            let failed = |code: &str, message: String| {
                Delivered::Done(Outcome::Failed {
                    code: code.into(),
                    message,
                })
            };
            let answer = match InProcess::acting_as(self.state.clone(), owner)
                .send(request)
                .await
            {
                Ok(answer) => answer,
                Err(e) => return failed("server_error", format!("The run could not be sent: {e}")),
            };
            let status = answer.status;
            let json: Value = match answer.body(ANSWER_LIMIT).await {
                Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                Err(e) => {
                    return failed(
                        "server_error",
                        format!("The run's answer could not be read: {e}"),
                    )
                }
            };
            let error = &json["error"];
            let code = error["code"]
                .as_str()
                .or_else(|| error["type"].as_str())
                .unwrap_or("server_error")
                .to_string();
            let message = error["message"].as_str().map_or_else(
                || format!("The session route answered {status}."),
                str::to_string,
            );
            match (status, session) {
                (200, None) => match json["id"].as_str() {
                    Some(id) => Delivered::Done(Outcome::Delivered {
                        session_id: id.to_string(),
                    }),
                    None => failed("server_error", "The session create answered no id.".into()),
                },
                (202, Some(session_id)) => Delivered::Done(Outcome::Delivered { session_id }),
                (409, Some(_)) if code == "active_turn_not_steerable" => Delivered::Busy(message),
                _ => failed(&code, message),
            }
        })
    }
}

/// How the registrar wants the scheduler started.
pub struct Starting {
    /// The store's schedule may be read at once (reading a store opened on first use
    /// would create its file).
    pub read_schedule: bool,
    /// Deliveries the last server left queued are sent (the store file exists).
    pub resume_webhooks: bool,
}

/// Starts the scheduler once the server serves, when the agents group is on or its
/// store holds automations; otherwise the first automation route starts it
/// ([`ensure_started`]), and a server that never uses agents runs no such thread.
pub fn start(state: Arc<AppState>) {
    // A job for a thread that ended (nothing was scheduled) starts another. Weak: the
    // app state holds the store that holds this.
    if let Some(agents) = state.services.groups.get_arc::<Agents>() {
        let app = Arc::downgrade(&state);
        agents.automations().set_restart(Box::new(move || {
            if let Some(state) = app.upgrade() {
                start_with(state, std::time::Duration::ZERO);
            }
        }));
    }
    let read_schedule = state
        .services
        .groups
        .get::<Starting>()
        .is_some_and(|s| s.read_schedule);
    if read_schedule {
        start_with(state, crate::agents::RESUME_AFTER_START);
    }
}

/// The store is in use: the thread reads its schedule, after `settle`.
fn start_with(state: Arc<AppState>, settle: std::time::Duration) {
    if let Some(agents) = state.services.groups.get_arc::<Agents>() {
        scheduler::start(agents, Arc::new(AppDeliverer { state }), true, settle);
    }
}

/// Starts the scheduler if it does not run yet (a group switched on by a policy
/// after startup), before a route hands it work.
fn ensure_started(call: &Call) {
    start_with(call.state.clone(), std::time::Duration::ZERO);
}
