//! `/v1/agents/mcp_relay/{capability}`: the MCP relay's route (`crate::agents::sessions::relay`).
//! codex, started for a session, reaches its MCP servers here; the capability in the
//! path is the only credential (codex sends no token), and the relay adds the bearer and
//! headers that codex never holds.

use super::{path_value, route, session_live};
use crate::agents::sessions::relay;
use crate::api::{ApiError, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;

pub fn endpoints() -> Vec<Endpoint> {
    let path = "/v1/agents/mcp_relay/{capability}";
    let declare = |method, id, summary| {
        route(method, path, id, summary, handler(relayed))
            .params(&[Param::path("capability")
                .doc("What the session's codex was given for one MCP server.")])
            // The capability is the credential: codex sends no token.
            .auth_required(false)
            .scopes::<&str>(&[])
            .extension()
            // The MCP server's own statuses pass through; 502 when it cannot be reached.
            .also_answers(&[202, 405, 502])
    };
    vec![
        declare(
            Method::Post,
            "agents_mcp_relay",
            "A session's codex to one of its MCP servers: the JSON-RPC message, with the bearer added here.",
        )
        .json_rpc(),
        declare(
            Method::Get,
            "agents_mcp_relay_stream",
            "Refused (405): the relay opens no standalone server stream; MCP clients go on without it.",
        ),
        declare(
            Method::Delete,
            "agents_mcp_relay_end",
            "Ends the MCP session at the server (Mcp-Session-Id).",
        ),
    ]
}

async fn relayed(call: Call) -> Result<Response, ApiError> {
    let capability = path_value(&call, "capability");
    let hub = session_live::hub(&call)?;
    let Some(route) = hub.relay.route(&capability) else {
        return Err(ApiError::new(
            404,
            "not_found_error",
            "No MCP relay is open under this capability: it closes when the session's codex stops.",
        ));
    };
    let method = match call.method {
        Method::Post => "POST",
        Method::Delete => "DELETE",
        _ => {
            return Ok(Response::raw(405, "application/json", b"{}".to_vec())
                .header("Allow", "POST, DELETE"))
        }
    };
    let headers: Vec<(&str, &str)> = relay::PASSED_ON
        .iter()
        .filter_map(|name| call.header(name).map(|value| (*name, value)))
        .collect();
    let answer = relay::forward(&route, method, &headers, &call.body)
        .await
        .map_err(|e| ApiError::new(502, "server_error", e.0))?;
    let content_type = match answer.header("content-type") {
        Some(t) if t.starts_with("text/event-stream") => "text/event-stream",
        Some(t) if t.contains("json") => "application/json",
        Some(_) => "application/octet-stream",
        None => "application/json",
    };
    let session = answer.header("mcp-session-id").map(str::to_string);
    let mut response = Response::raw(answer.status, content_type, answer.body);
    if let Some(session) = session {
        response = response.header("Mcp-Session-Id", session);
    }
    Ok(response)
}
