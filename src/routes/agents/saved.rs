//! `/v1/agents`: saved agents, one resource declaration over `crate::agents::saved`.

use serde_json::{json, Map, Value};

use super::resource::{Named, Op, Resource};
use super::{agents_of, args, path_value, server_runtime};
use crate::agents::objects::{label, LIST_DIFFERENCES};
use crate::agents::saved::{self, parse_metadata, AgentConfig, SavedAgent};
use crate::api::{ApiError, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;

const AGENT: Named = Named {
    object: "agent",
    param: "agent_id",
};

/// The fields of a saved agent's body (`model` required on create).
fn fields(create: bool) -> Vec<Param> {
    vec![
        Param::body("model", "string", create).doc("The model codex uses (passed as given)."),
        Param::body("instructions", "string", false).doc("Developer instructions added to codex's own."),
        Param::body("name", "string", false).doc("A display name (null clears it)."),
        Param::body("tools", "array", false)
            .doc("function, mcp, web_search and tool_search tools (3 MiB of JSON at most); docs/agents.md lists what is refused."),
        Param::body("reasoning", "object", false).doc("effort and summary."),
        Param::body("text", "object", false).doc("format (text or json_schema) and verbosity."),
        Param::body("multi_agent", "object", false).doc("enabled, max_concurrent_subagents (1 to 64)."),
        Param::body("service_tier", "string", false)
            .one_of(&["auto", "default", "flex", "priority", "fast", "ultrafast"])
            .doc("auto, default, flex or priority (fast and ultrafast are refused)."),
        Param::body("compaction", "object", false).doc("async: background compaction (default true)."),
        Param::body("experimental", "object", false).doc("time_awareness (merged by key on update)."),
        Param::body("metadata", "string_map", false)
            .doc("16 strings at most, keys up to 64 and values up to 512 characters."),
    ]
}

pub fn endpoints() -> Vec<Endpoint> {
    Resource::new("agents", "/v1/agents", AGENT)
        .op(
            Op::create("Save an agent configuration for sessions.", handler(create))
                .params(fields(true)),
        )
        .op(Op::list_records::<SavedAgent>("Your saved agents."))
        .op(Op::get_record::<SavedAgent>("A saved agent."))
        .op(Op::update(
            "Change a saved agent (absent fields are kept).",
            handler(update),
        )
        .params(fields(false)))
        .op(Op::delete("Delete a saved agent.", handler(delete)))
        .endpoints()
}

/// A JSON object body's fields.
type Fields = Map<String, Value>;

/// The body's configuration fields (all but `metadata`) and the whole body, as sent:
/// null and absent differ on update.
fn body(call: &Call) -> Result<(Fields, Fields), ApiError> {
    // Declared fields are checked (types, unknown fields) before the nested ones.
    args(call, server_runtime)?;
    let body: Fields = call.json()?;
    let mut config = body.clone();
    config.remove("metadata");
    Ok((config, body))
}

async fn create(call: Call) -> Result<Response, ApiError> {
    let (config, body) = body(&call)?;
    let config = AgentConfig::new(AgentConfig::parse(&config, "", false)?, "")?;
    let metadata = parse_metadata(&body)?.unwrap_or_else(|| json!({}));
    let object =
        saved::create_agent(&agents_of(&call)?, &call.identity.id, config, metadata).await?;
    Ok(Response::ok(&object))
}

async fn update(call: Call) -> Result<Response, ApiError> {
    let (config, body) = body(&call)?;
    let patch = AgentConfig::parse(&config, "", true)?;
    let metadata = parse_metadata(&body)?;
    let id = path_value(&call, AGENT.param);
    let object =
        saved::update_agent(&agents_of(&call)?, &call.identity.id, &id, patch, metadata).await?;
    Ok(Response::ok(&object))
}

async fn delete(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, AGENT.param);
    saved::delete_agent(&agents_of(&call)?, &call.identity.id, &id).await?;
    Ok(Response::ok(&json!({
        "id": id, "object": "agent.deleted", "deleted": true,
        "x_agent_sandbox": label("agent-sandbox", &LIST_DIFFERENCES),
    })))
}
