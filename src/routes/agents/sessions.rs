//! `/v1/agents/sessions` and what hangs off a session: events (posted and streamed),
//! items, turns, subagents, artifacts and traces — resource declarations over the
//! domain's `crate::agents::sessions`. The session actor, its codex thread and the event
//! order are the domain's; these adapters read the declared fields, word refusals in
//! OpenAI's envelope and frame events as server-sent events.

use serde_json::{json, Value};

use super::resource::{Named, Op, Resource};
use super::{agents_of, args, path_value, server_runtime, store_error};
use crate::agents::objects::{label, Object};
use crate::agents::records::{ListQuery, Order, Scope, StoreError, Transaction};
use crate::agents::sessions::records::{
    Artifact, Item, Session, Subagent, SubagentItem, SubagentTurn, Trace, Turn, DIFFERENCES,
};
use crate::agents::sessions::{self, SessionFilter};
use crate::api::{ApiError, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;

pub(super) const SESSION: Named = Named {
    object: "session",
    param: "session_id",
};
const TURN: Named = Named {
    object: "turn",
    param: "turn_id",
};
const SUBAGENT: Named = Named {
    object: "subagent",
    param: "subagent_id",
};
const ARTIFACT: Named = Named {
    object: "artifact",
    param: "artifact_id",
};
const EVENT: Named = Named {
    object: "event",
    param: "event_id",
};
const ITEM: Named = Named {
    object: "item",
    param: "item_id",
};
const TRACE: Named = Named {
    object: "trace",
    param: "trace_id",
};

const BASE: &str = "/v1/agents/sessions";

fn session_fields() -> Vec<Param> {
    vec![
        Param::body("agent", "object", false)
            .invalid("agent must be an object.")
            .doc("The agent's configuration, or what overrides the saved agent's (agent_id)."),
        Param::body("metadata", "object", false)
            .invalid("metadata must be an object of strings.")
            .doc("16 strings at most."),
        Param::body("prompt_cache_options", "object", false)
            .invalid("prompt_cache_options must be an object.")
            .doc("{ttl: 30m | 12h}: kept and shown; codex caches prompts itself."),
        Param::body("review", "string", false)
            .one_of(&["none", "auto_review"])
            .invalid("review must be none or auto_review.")
            .doc("auto_review: codex's reviewer approves what needs approval."),
        Param::body("spend_control", "object", false)
            .invalid("spend_control must be an object.")
            .doc("{limit: null}: no cost meter runs locally, so only null is honoured."),
    ]
}

pub fn endpoints() -> Vec<Endpoint> {
    let mut create_fields = vec![
        Param::body("environment", "object", true)
            .missing("environment is required: {\"type\": \"self_hosted\", \"workspace_directory\": ...} or {\"type\": \"none\"}.")
            .invalid("environment must be an object.")
            .doc("self_hosted: this sandbox (workspace_directory beneath the base directory); none: no files, no commands."),
        Param::body("agent_id", "string", false).doc("A saved agent (GET /v1/agents)."),
        Param::body("input", "any", false)
            .doc("A string (one user message) or user messages: the first turn starts at once."),
        Param::body("stream", "boolean", false)
            .default("false")
            .invalid("stream must be true or false.")
            .doc("Answer with the session's events until its first turn ends."),
        Param::body("stream_options", "object", false)
            .invalid("stream_options must be an object.")
            .doc("{include_obfuscation}: accepted; events carry no obfuscation padding."),
        Param::body("vault_ids", "array", false)
            .invalid("vault_ids must be a list of vault ids.")
            .doc("Vaults whose credentials supply bearers for the agent's MCP servers."),
    ];
    create_fields.extend(session_fields());
    let within = |name: &'static str, path: &'static str, member: Named| {
        Resource::new(name, path, member).within(SESSION)
    };
    let mut endpoints = Resource::new("agents_sessions", BASE, SESSION)
        .op(Op::create(
            "Start a session: one codex thread in this sandbox (stream: true answers its events).",
            handler(create),
        )
        .params(create_fields)
        .streaming())
        .op(Op::get_record::<Session>(
            "A session, its status and pending actions.",
        ))
        .op(Op::update(
            "Change a session's metadata or its agent's model, reasoning or tools.",
            handler(update),
        )
        .params(session_fields()))
        .op(Op::list("The caller's sessions.", handler(list)).params({
            let mut params = super::stored::paging();
            params.push(
                Param::query("agent_id", "string", false).doc("Only this saved agent's sessions."),
            );
            params
        }))
        .op(Op::delete(
            "Forget a session and all it holds (cancel a running turn first).",
            handler(delete),
        ))
        .endpoints();
    endpoints.extend(
        within("agents_session_events", "/v1/agents/sessions/{session_id}/events", EVENT)
            .op(Op::create(
                "Send input events: a message starts or steers a turn, a cancel stops it, a tool result answers a function call (202).",
                handler(events_post),
            )
            .params(vec![Param::body("events", "array", true)
                .missing("events is required: a list of input events.")
                .invalid("events must be a list of input events.")
                .doc("agent.session.input.message, agent.session.input.cancel or agent.session.input.tool_result events.")]))
            .op(Op::list("The session's live events (server-sent events, from now on).", handler(events_stream))
                .params(vec![Param::query("include_obfuscation", "boolean", false)
                    .doc("Accepted; events carry no obfuscation padding.")])
                .streaming())
            .endpoints(),
    );
    endpoints.extend(
        within(
            "agents_session_items",
            "/v1/agents/sessions/{session_id}/items",
            ITEM,
        )
        .op(Op::list_records::<Item>(
            "The root agent's items, its subagent interactions included.",
        ))
        .endpoints(),
    );
    endpoints.extend(
        within(
            "agents_session_turns",
            "/v1/agents/sessions/{session_id}/turns",
            TURN,
        )
        .op(Op::list_records::<Turn>("The root agent's turns."))
        .op(Op::get_record::<Turn>("One turn, with its usage."))
        .op(Op::member(
            "items",
            Method::Get,
            "A turn's items, in order.",
            handler(turn_items),
        )
        .params(super::stored::paging()))
        .endpoints(),
    );
    endpoints.extend(
        within(
            "agents_session_subagents",
            "/v1/agents/sessions/{session_id}/subagents",
            SUBAGENT,
        )
        .op(Op::list_records::<Subagent>(
            "codex sub-agents the session's turns opened.",
        ))
        .op(Op::get_record::<Subagent>("One subagent."))
        .op(Op::member(
            "items",
            Method::Get,
            "A subagent's items.",
            handler(subagent_items),
        )
        .params(super::stored::paging()))
        .endpoints(),
    );
    endpoints.extend(
        Resource::new(
            "agents_session_subagent_turns",
            "/v1/agents/sessions/{session_id}/subagents/{subagent_id}/turns",
            TURN,
        )
        .within(SESSION)
        .op(Op::list("A subagent's turns.", handler(subagent_turns))
            .params(super::stored::paging()))
        .op(Op::get("One turn of a subagent.", handler(subagent_turn)))
        .op(Op::member(
            "items",
            Method::Get,
            "A subagent turn's items.",
            handler(subagent_turn_items),
        )
        .params(super::stored::paging()))
        .endpoints(),
    );
    endpoints.extend(
        within(
            "agents_session_artifacts",
            "/v1/agents/sessions/{session_id}/artifacts",
            ARTIFACT,
        )
        .op(Op::list(
            "Files turns created or changed under outputs/.",
            handler(artifacts_list),
        )
        .params({
            let mut params = super::stored::paging();
            params.push(
                Param::query("environment_id", "string", false)
                    .doc("Only this environment's artifacts."),
            );
            params
        }))
        .op(Op::get_record::<Artifact>("One artifact."))
        .op(Op::delete(
            "Forget an artifact (the file stays).",
            handler(artifact_delete),
        ))
        .op(Op::member(
            "content",
            Method::Get,
            "An artifact's bytes (application/octet-stream, Range honoured).",
            handler(artifact_content),
        ))
        .endpoints(),
    );
    endpoints.extend(
        within(
            "agents_session_traces",
            "/v1/agents/sessions/{session_id}/traces",
            TRACE,
        )
        .op(Op::list_records::<Trace>(
            "One OTLP trace per finished root turn.",
        ))
        .endpoints(),
    );
    endpoints
}

/// The session id of the path.
fn session_id(call: &Call) -> String {
    path_value(call, SESSION.param)
}

async fn create(call: Call) -> Result<Response, ApiError> {
    let mut args = args(&call, server_runtime)?;
    let owner = call.identity.id.clone();
    let agents = agents_of(&call)?;
    let setup = super::session_setup::new_session(&call, &agents, &mut args).await?;
    let session = sessions::create(&agents, &owner, setup.session).await?;
    let hub = super::session_live::hub(&call)?;
    match setup.input {
        None if args.flag("stream") => Err(super::invalid(
            "input",
            "input is required with stream: true: the stream shows the first turn.",
        )),
        None => Ok(Response::ok(&session.object())),
        Some(input) => {
            if args.flag("stream") {
                super::session_live::create_streamed(&call, hub, session, input).await
            } else {
                super::session_live::send(&call, &hub, &session.id, vec![input]).await?;
                let session: Session = agents
                    .transact({
                        let (owner, id) = (owner.clone(), session.id.clone());
                        move |t| t.get(Scope::owner(&owner), &id)
                    })
                    .await
                    .map_err(|e| store_error(e, "session", &session.id, "session_id"))?;
                Ok(Response::ok(&session.object()))
            }
        }
    }
}

async fn update(call: Call) -> Result<Response, ApiError> {
    let mut args = args(&call, server_runtime)?;
    let id = session_id(&call);
    let (changes, agent_changes) = super::session_setup::changes(&mut args)?;
    let session = sessions::update(
        &agents_of(&call)?,
        &call.identity.id,
        &id,
        changes,
        agent_changes,
    )
    .await?;
    Ok(Response::ok(&session.object()))
}

async fn list(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let filter = SessionFilter {
        agent_id: args.str("agent_id").map(str::to_string),
        metadata: metadata_filter(&call),
    };
    let (order, limit, after) = paging(&args);
    let (data, has_more) = sessions::list(
        &agents_of(&call)?,
        &call.identity.id,
        after,
        limit,
        order,
        filter,
    )
    .await?;
    Ok(page(data.iter().map(Object::object).collect(), has_more))
}

/// `metadata[key]=value` pairs of the query.
pub(super) fn metadata_filter(call: &Call) -> Vec<(String, String)> {
    call.query
        .iter()
        .filter_map(|(name, value)| {
            let key = name.strip_prefix("metadata[")?.strip_suffix(']')?;
            Some((key.to_string(), value.clone()))
        })
        .collect()
}

fn paging(args: &crate::api::Args) -> (Order, usize, Option<String>) {
    super::stored::page_query(args)
}

/// A list page in OpenAI's shape.
fn page(data: Vec<Value>, has_more: bool) -> Response {
    super::stored::list_page(data, has_more, &DIFFERENCES)
}

/// Where the children's codex keeps its threads: `CODEX_HOME`, else `~/.codex`.
fn codex_home(call: &Call) -> Option<std::path::PathBuf> {
    let env = call.services().environment.snapshot();
    let var = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| std::path::PathBuf::from(v))
    };
    var("CODEX_HOME").or_else(|| var("HOME").map(|home| home.join(".codex")))
}

async fn delete(call: Call) -> Result<Response, ApiError> {
    let id = session_id(&call);
    let agents = agents_of(&call)?;
    let deleted = sessions::delete(&agents, &call.identity.id, &id)
        .await
        .map_err(|e| match e {
            crate::agents::AgentError::Busy { .. } => ApiError::new(
                409,
                "invalid_request_error",
                format!("The session '{id}' is running a turn: cancel it first (an agent.session.input.cancel event), then delete it."),
            )
            .with_code("session_running")
            .with_field("param", "session_id")
            .with_header("x-should-retry", "false"),
            e => ApiError::from(e),
        })?;
    super::session_live::forget(&call, &id)?;
    // The session's agent's own wakeups go with it (others' stay, their runs failing).
    crate::agents::automations::forget_session(&agents, &call.identity.id, &id).await?;
    let scratch = call.config().state_dir.join("sessions").join(&id);
    if sessions::runtime_of(&deleted.agent) == crate::agents::Runtime::ClaudeCode {
        let home = call.config().state_dir.join("claude-code");
        let config = deleted
            .thread_id
            .as_deref()
            .and_then(|thread| crate::agents::claude::config_dir(&home, thread));
        sessions::remove_claude_leftovers(scratch, config).await;
    } else {
        sessions::remove_leftovers(scratch, codex_home(&call), deleted.thread_id).await;
    }
    Ok(Response::ok(&json!({
        "id": id, "object": "agent.session.deleted", "deleted": true,
        "x_agent_sandbox": label("agent-sandbox", &DIFFERENCES),
    })))
}

async fn events_post(call: Call) -> Result<Response, ApiError> {
    let args = args(&call, server_runtime)?;
    let id = session_id(&call);
    let inputs = crate::agents::sessions::inputs::parse_events(
        args.value("events").unwrap_or(&Value::Null),
    )?;
    let hub = super::session_live::hub(&call)?;
    let claim = match call.header("idempotency-key") {
        Some(key) => {
            let digest = digest(&call.body);
            match super::session_live::claim_key(&call, &id, key, &digest).await? {
                Some(claim) => Some(claim),
                // Applied already: answered as the first time, applied once.
                None => return Ok(accepted()),
            }
        }
        None => None,
    };
    let sent = super::session_live::send(&call, &hub, &id, inputs).await;
    if let Some(claim) = claim {
        claim.settle(sent.is_ok()).await;
    }
    sent?;
    Ok(accepted())
}

fn accepted() -> Response {
    Response::raw(202, "application/json", b"{}".to_vec()).header("X-Agent-Sandbox-Local", "1")
}

/// A short digest of a request body, to tell a repeated request from a reused key.
fn digest(body: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(body);
    hash[..12].iter().map(|b| format!("{b:02x}")).collect()
}

async fn events_stream(call: Call) -> Result<Response, ApiError> {
    let id = session_id(&call);
    // The session must be the caller's: a foreign id streams nothing.
    get_session(&call, &id).await?;
    super::session_live::stream(&call, &id)
}

/// The caller's session `id`.
pub(super) async fn get_session(call: &Call, id: &str) -> Result<Session, ApiError> {
    let (owner, key) = (call.identity.id.clone(), id.to_string());
    agents_of(call)?
        .read(move |t| t.get::<Session>(Scope::owner(&owner), &key))
        .await
        .map_err(|e| store_error(e, "session", id, "session_id"))
}

/// A page of the ids `ids` (in order), looked up as `T` within the session: `after` is
/// an id of the list, `order` reads it from either end.
async fn page_of<T: Object>(call: &Call, ids: Vec<String>) -> Result<Response, ApiError> {
    let args = call.args()?;
    let (order, limit, after) = paging(&args);
    let mut ids = ids;
    if order == Order::Desc {
        ids.reverse();
    }
    let start = match &after {
        None => 0,
        Some(after) => match ids.iter().position(|i| i == after) {
            Some(at) => at + 1,
            None => {
                return Err(super::invalid(
                    "after",
                    format!("No item '{after}' in this list."),
                ))
            }
        },
    };
    let chosen: Vec<String> = ids.iter().skip(start).take(limit).cloned().collect();
    let has_more = start + chosen.len() < ids.len();
    let (owner, session) = (call.identity.id.clone(), session_id(call));
    let records: Vec<T> = agents_of(call)?
        .read(move |t| {
            let scope = Scope::within(&owner, &session);
            let mut found = Vec::with_capacity(chosen.len());
            for id in &chosen {
                match t.get::<T>(scope, id) {
                    Ok(record) => found.push(record),
                    // Forgotten (an item the store had no room for): the list skips it.
                    Err(StoreError::NotFound) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(found)
        })
        .await
        .map_err(|e| store_error(e, "item", "", "after"))?;
    let data: Vec<Value> = records.iter().map(Object::object).collect();
    Ok(page(data, has_more))
}

async fn turn_items(call: Call) -> Result<Response, ApiError> {
    let turn = find_turn(&call).await?;
    page_of::<Item>(&call, turn.items).await
}

/// A lookup within a session that failed, and what it looked up.
struct Lookup(StoreError, &'static str);

impl From<StoreError> for Lookup {
    fn from(error: StoreError) -> Lookup {
        Lookup(error, "session")
    }
}

async fn find_turn(call: &Call) -> Result<Turn, ApiError> {
    let (owner, session, id) = (
        call.identity.id.clone(),
        session_id(call),
        path_value(call, TURN.param),
    );
    let shown = id.clone();
    agents_of(call)?
        .read(move |t| {
            t.get::<Session>(Scope::owner(&owner), &session)
                .map_err(|e| Lookup(e, "session"))?;
            t.get::<Turn>(Scope::within(&owner, &session), &id)
                .map_err(|e| Lookup(e, "turn"))
        })
        .await
        .map_err(|Lookup(e, what)| match what {
            "session" => store_error(e, "session", &session_id(call), "session_id"),
            _ => store_error(e, "turn", &shown, "turn_id"),
        })
}

async fn find_subagent(call: &Call) -> Result<Subagent, ApiError> {
    let (owner, session, id) = (
        call.identity.id.clone(),
        session_id(call),
        path_value(call, SUBAGENT.param),
    );
    let shown = id.clone();
    agents_of(call)?
        .read(move |t| {
            t.get::<Session>(Scope::owner(&owner), &session)
                .map_err(|e| Lookup(e, "session"))?;
            t.get::<Subagent>(Scope::within(&owner, &session), &id)
                .map_err(|e| Lookup(e, "subagent"))
        })
        .await
        .map_err(|Lookup(e, what)| match what {
            "session" => store_error(e, "session", &session_id(call), "session_id"),
            _ => store_error(e, "subagent", &shown, "subagent_id"),
        })
}

async fn subagent_items(call: Call) -> Result<Response, ApiError> {
    let subagent = find_subagent(&call).await?;
    page_of::<SubagentItem>(&call, subagent.items).await
}

async fn subagent_turns(call: Call) -> Result<Response, ApiError> {
    let subagent = find_subagent(&call).await?;
    page_of::<SubagentTurn>(&call, subagent.turns).await
}

/// A turn of the subagent of the path (another subagent's or a root turn is unknown here).
async fn subagent_turn_of(call: &Call) -> Result<Turn, ApiError> {
    let subagent = find_subagent(call).await?;
    let (owner, session, id) = (
        call.identity.id.clone(),
        session_id(call),
        path_value(call, TURN.param),
    );
    let shown = id.clone();
    let SubagentTurn(turn) = agents_of(call)?
        .read(move |t| t.get::<SubagentTurn>(Scope::within(&owner, &session), &id))
        .await
        .map_err(|e| store_error(e, "turn", &shown, "turn_id"))?;
    if turn.subagent_id.as_deref() != Some(subagent.id.as_str()) {
        return Err(store_error(StoreError::NotFound, "turn", &shown, "turn_id"));
    }
    Ok(turn)
}

async fn subagent_turn(call: Call) -> Result<Response, ApiError> {
    Ok(Response::ok(&subagent_turn_of(&call).await?.object()))
}

async fn subagent_turn_items(call: Call) -> Result<Response, ApiError> {
    let turn = subagent_turn_of(&call).await?;
    page_of::<SubagentItem>(&call, turn.items).await
}

async fn artifacts_list(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let (order, limit, after) = paging(&args);
    let environment = args.str("environment_id").map(str::to_string);
    let (owner, session) = (call.identity.id.clone(), session_id(&call));
    let shown = session.clone();
    let (data, has_more) = agents_of(&call)?
        .read(move |t| {
            let scope = Scope::within(&owner, &session);
            let mut found: Vec<Artifact> = Vec::new();
            let mut cursor = after;
            loop {
                let query = ListQuery {
                    after: cursor.as_deref(),
                    limit: 100,
                    order,
                };
                let page = t.list::<Artifact>(scope, &query)?;
                cursor = page.last_id.clone();
                for artifact in page.data {
                    if environment
                        .as_deref()
                        .is_none_or(|e| e == artifact.environment_id)
                    {
                        if found.len() == limit {
                            return Ok((found, true));
                        }
                        found.push(artifact);
                    }
                }
                if !page.has_more {
                    return Ok((found, false));
                }
            }
        })
        .await
        .map_err(|e| match e {
            StoreError::UnknownCursor => {
                super::invalid("after", "No artifact with this id in this list.")
            }
            e => store_error(e, "session", &shown, "session_id"),
        })?;
    Ok(page(data.iter().map(Object::object).collect(), has_more))
}

async fn find_artifact(call: &Call) -> Result<Artifact, ApiError> {
    get_session(call, &session_id(call)).await?;
    let (owner, session, id) = (
        call.identity.id.clone(),
        session_id(call),
        path_value(call, ARTIFACT.param),
    );
    let shown = id.clone();
    agents_of(call)?
        .read(move |t| t.get::<Artifact>(Scope::within(&owner, &session), &id))
        .await
        .map_err(|e| store_error(e, "artifact", &shown, "artifact_id"))
}

async fn artifact_delete(call: Call) -> Result<Response, ApiError> {
    let artifact = find_artifact(&call).await?;
    let (owner, session, id) = (
        call.identity.id.clone(),
        session_id(&call),
        artifact.id.clone(),
    );
    agents_of(&call)?
        .transact(move |t| t.delete::<Artifact>(Scope::within(&owner, &session), &id))
        .await
        .map_err(|e| store_error(e, "artifact", &artifact.id, "artifact_id"))?;
    Ok(Response::ok(&json!({
        "id": artifact.id, "object": "agent.session.artifact.deleted", "deleted": true,
        "x_agent_sandbox": label("agent-sandbox", &["file_kept"]),
    })))
}

async fn artifact_content(call: Call) -> Result<Response, ApiError> {
    let artifact = find_artifact(&call).await?;
    // Confined again at read time: the file may have been replaced by a link since.
    let caller = crate::routes::shared::confine(&call, &artifact.local_path)
        .map_err(|_| super::not_found("artifact", &artifact.id, "artifact_id"))?;
    crate::routes::shared::raw_bytes(&call, &caller, "invalid_request_error")
        .await
        .map_err(|e| match e.status {
            404 | 403 => ApiError::new(
                404,
                "not_found_error",
                format!(
                    "The artifact '{}' is gone from disk: {} no longer exists.",
                    artifact.id, artifact.path
                ),
            )
            .with_code("artifact_file_missing")
            .with_field("param", "artifact_id"),
            _ => e,
        })
}
