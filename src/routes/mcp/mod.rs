//! `mcp` (on by default): the sandbox's routes as Model Context Protocol tools at `/mcp`,
//! over the Streamable HTTP transport (`docs/mcp.md`).
//!
//! The tools are the route table: one per non-streaming endpoint the caller may use now
//! (enabled, scopes held), named by its id, described by its summary, its `inputSchema`
//! built from the endpoint's declared parameters (the source `/capabilities` and the
//! OpenAPI document read); the named commands the caller may run; and two text variants
//! of the base64 file routes. A call is a request to the route itself, served in-process
//! by the same dispatcher (`app::client`) with the caller's own credentials, so it takes
//! exactly the path a plain HTTP request takes: policy, limits, the handler, its error
//! JSON (which becomes an `isError` result).

use serde_json::{json, Map, Value};

use crate::api::{ApiError, BodyMode, Group, Listener, Method, ParamIn};
use crate::app::client::{InProcess, Request};
use crate::app::{handler, Call, Endpoint};
use crate::http::sse::{self, channel, SseSender};
use crate::http::Response;
use crate::mcp::{self, Message};

/// How long the session's stream may stay silent before a `: keep-alive` comment.
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// The largest route answer a tool call hands on.
const ANSWER_LIMIT: usize = 16 * 1024 * 1024;
const SESSION_HEADER: &str = "Mcp-Session-Id";

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::new(Method::Post, "/mcp", Group::Mcp, handler(post))
            .json_rpc()
            .id("mcp").extension().scopes(&["core:read"])
            // Sessions per identity (`limits.max_sessions`, docs/mcp.md).
            .enforces(&["max_sessions"])
            .limit("max_sessions", mcp::MAX_SESSIONS as u64)
            .summary("Model Context Protocol over Streamable HTTP: this caller's routes and commands as tools (JSON-RPC: initialize, tools/list, tools/call, ping).")
            .returns(|| json!({"type": ["object", "array"]}))
            .also_answers(&[202, 400, 404])
            .own_refusals(json_rpc_error),
        Endpoint::new(Method::Get, "/mcp", Group::Mcp, handler(events))
            .id("mcp_events").extension().scopes(&["core:read"])
            .summary("The MCP session's server stream: notifications/tools/list_changed when a policy reload changes the tools.")
            .streaming(true)
            .also_answers(&[400, 404])
            .own_refusals(json_rpc_error),
        Endpoint::new(Method::Delete, "/mcp", Group::Mcp, handler(end))
            .id("mcp_end").extension().scopes(&["core:read"])
            .summary("Ends an MCP session (Mcp-Session-Id).")
            .returns(|| json!({"type": "object"}))
            .also_answers(&[400, 404])
            .own_refusals(json_rpc_error),
    ]
}

/// The transport's refusals: a JSON-RPC response whose `error` is `{code, message}`.
fn json_rpc_error() -> serde_json::Value {
    json!({
        "type": "object",
        "required": ["jsonrpc", "error"],
        "properties": {
            "jsonrpc": {"const": "2.0"},
            "id": {},
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
            },
        },
    })
}

fn rpc(status: u16, message: Value) -> Response {
    Response::json(status, &message)
}

/// The caller's session and its revision, or the transport's refusal: 400 without the
/// header, 404 for an id that is unknown or another identity's.
fn session_of(call: &Call, id: &Value) -> Result<(String, &'static str), Response> {
    let Some(session) = call.header(SESSION_HEADER) else {
        return Err(rpc(
            400,
            mcp::error(
                id,
                mcp::INVALID_REQUEST,
                "Mcp-Session-Id is required: send initialize first",
            ),
        ));
    };
    if let Some(version) = call.header("mcp-protocol-version") {
        if !mcp::served(version) {
            let message = format!(
                "MCP-Protocol-Version {version} is not served (this server speaks {})",
                mcp::VERSIONS.join(", ")
            );
            return Err(rpc(400, mcp::error(id, mcp::INVALID_REQUEST, message)));
        }
    }
    match mcp::session(session, &call.identity.id) {
        Some(version) => Ok((session.to_string(), version)),
        None => Err(rpc(
            404,
            mcp::error(
                id,
                mcp::INVALID_REQUEST,
                "unknown or ended MCP session: initialize again",
            ),
        )),
    }
}

/// `POST /mcp`: one JSON-RPC message, or a batch where the session's revision has them
/// (2025-03-26; later revisions removed batching).
async fn post(call: Call) -> Result<Response, ApiError> {
    let message: Value = serde_json::from_slice(&call.body)
        .map_err(|e| ApiError::bad_request(format!("Invalid JSON body: {e}")))?;
    let Value::Array(batch) = message else {
        return one(&call, message).await;
    };
    let version = match session_of(&call, &Value::Null) {
        Ok((_, version)) => version,
        Err(refusal) => return Ok(refusal),
    };
    if version != "2025-03-26" || batch.is_empty() {
        let why = if batch.is_empty() {
            "an empty batch".to_string()
        } else {
            format!("batches are a 2025-03-26 feature; this session speaks {version}")
        };
        return Ok(rpc(
            400,
            mcp::error(&Value::Null, mcp::INVALID_REQUEST, why),
        ));
    }
    let mut answers = Vec::new();
    for message in batch {
        if matches!(mcp::classify(&message), Message::Request { ref method, .. } if method == "initialize")
        {
            let id = message.get("id").cloned().unwrap_or(Value::Null);
            answers.push(mcp::error(
                &id,
                mcp::INVALID_REQUEST,
                "initialize cannot be part of a batch",
            ));
            continue;
        }
        let answer = one(&call, message).await?;
        if answer.status != 202 {
            if let crate::http::response::Body::Full(bytes) = &answer.body {
                if let Ok(value) = serde_json::from_slice::<Value>(bytes) {
                    answers.push(value);
                }
            }
        }
    }
    if answers.is_empty() {
        return Ok(Response::raw(
            202,
            crate::http::JSON_CONTENT_TYPE,
            Vec::new(),
        ));
    }
    Ok(Response::ok(&Value::Array(answers)))
}

/// One JSON-RPC message.
async fn one(call: &Call, message: Value) -> Result<Response, ApiError> {
    let (id, method, params) = match mcp::classify(&message) {
        Message::Request { id, method, params } => (id, method, params),
        Message::Notification | Message::Response => {
            if let Err(refusal) = session_of(call, &Value::Null) {
                return Ok(refusal);
            }
            return Ok(Response::raw(
                202,
                crate::http::JSON_CONTENT_TYPE,
                Vec::new(),
            ));
        }
        Message::Invalid(answer) => return Ok(rpc(400, answer)),
    };
    if method == "initialize" {
        let requested = params.get("protocolVersion").and_then(Value::as_str);
        let version = mcp::negotiate(requested);
        let limit = call
            .decision()
            .knob_u64("max_sessions")
            .map_or(mcp::MAX_SESSIONS, |n| n as usize);
        let session = mcp::open_session(&call.identity.id, version, limit);
        let answer = mcp::result(
            &id,
            json!({
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": true}},
                "serverInfo": {"name": "agent-sandbox", "version": env!("CARGO_PKG_VERSION")},
                "instructions": "Tools are this sandbox's HTTP routes (named by endpoint id) and its named commands. Files live beneath the base directory; upload_text and download_text read and write text without base64.",
            }),
        );
        return Ok(rpc(200, answer).header(SESSION_HEADER, session));
    }
    if let Err(refusal) = session_of(call, &id) {
        return Ok(refusal);
    }
    let answer = match method.as_str() {
        "ping" => mcp::result(&id, json!({})),
        "tools/list" => mcp::result(&id, json!({"tools": tools(call)})),
        "tools/call" => match call_tool(call, &params).await {
            Ok(result) => mcp::result(&id, result),
            Err(message) => mcp::error(&id, mcp::INVALID_PARAMS, message),
        },
        other => mcp::error(
            &id,
            mcp::METHOD_NOT_FOUND,
            format!("method not found: {other}"),
        ),
    };
    Ok(rpc(200, answer))
}

/// Endpoints that are tools: served on the API port (the in-process call goes to its
/// dispatcher), not streams, not WebSockets, not `/mcp` itself.
fn is_tool(endpoint: &Endpoint) -> bool {
    let spec = &endpoint.spec;
    spec.listener == Listener::Api
        && spec.group != Group::Mcp
        && !spec.streaming
        && spec.body != BodyMode::Upgrade
}

/// The endpoints the text tools and the command tools wrap: each is listed while its
/// caller may use that endpoint, and calls it. (`wrapped_endpoints_exist` checks that
/// every id names a built-in endpoint.)
const DOWNLOAD_ENDPOINT: &str = "download";
const UPLOAD_ENDPOINT: &str = "upload";
const COMMANDS_ENDPOINT: &str = "run_command";

/// The tools `call`'s identity may use under the catalog in force now.
fn tools(call: &Call) -> Vec<Value> {
    let catalog = call.catalog();
    let identity = &call.identity;
    let allowed = |id: &str| {
        catalog
            .endpoints
            .iter()
            .position(|e| e.spec.id == id)
            .is_some_and(|i| catalog.access(i, identity).allowed)
    };
    let mut tools = Vec::new();
    for (index, endpoint) in catalog.endpoints.iter().enumerate() {
        if !is_tool(endpoint) || !catalog.access(index, identity).allowed {
            continue;
        }
        let spec = &endpoint.spec;
        tools.push(json!({
            "name": spec.id,
            "description": format!("{} ({} {})", spec.summary, spec.method_name(), spec.path),
            "inputSchema": mcp::input_schema(&spec.params),
            "annotations": {
                "readOnlyHint": spec.effect == crate::api::Effect::Reads,
                "destructiveHint": spec.method == Method::Delete,
            },
        }));
    }
    if allowed(DOWNLOAD_ENDPOINT) {
        tools.push(json!({
            "name": "download_text",
            "description": "Read a UTF-8 text file beneath the base directory (download, without base64).",
            "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            "annotations": {"readOnlyHint": true},
        }));
    }
    if allowed(UPLOAD_ENDPOINT) {
        tools.push(json!({
            "name": "upload_text",
            "description": "Write a text file beneath the base directory, replacing it (upload, without base64).",
            "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]},
        }));
    }
    if allowed(COMMANDS_ENDPOINT) {
        let registry = match call.group_state::<crate::commands::Registry>() {
            Ok(registry) => registry,
            Err(_) => return tools,
        };
        for command in registry.listed(|scopes| identity.has_scopes(scopes)) {
            let mut properties = Map::new();
            let mut required = Vec::new();
            for arg in &command.args {
                let kind = match arg.kind {
                    crate::commands::ArgType::Integer => "integer",
                    crate::commands::ArgType::Float => "number",
                    crate::commands::ArgType::Boolean => "boolean",
                    crate::commands::ArgType::String => "string",
                };
                let mut schema = mcp::schema_of(kind);
                if !arg.description.is_empty() {
                    schema["description"] = json!(arg.description);
                }
                properties.insert(arg.name.clone(), schema);
                if arg.required {
                    required.push(arg.name.clone());
                }
            }
            tools.push(json!({
                "name": format!("command_{}", command.name),
                "description": if command.description.is_empty() { format!("The named command {}.", command.name) } else { command.description.clone() },
                "inputSchema": {"type": "object", "properties": properties, "required": required},
            }));
        }
    }
    tools
}

/// `tools/call`: the route's answer as a tool result, or the reason there is no such
/// tool (a JSON-RPC error).
async fn call_tool(call: &Call, params: &Value) -> Result<Value, String> {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .ok_or("tools/call needs params.name")?;
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return Err("tools/call arguments must be an object".into()),
    };
    let text_arg = |key: &str| {
        arguments
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("{name} needs the string argument {key}"))
    };
    match name {
        "download_text" => {
            let path = text_arg("path")?;
            let target = format!("/download?path={}", encode(&path));
            let answer = forward(call, "GET", &target, None).await;
            return Ok(match answer {
                Ok((status, Value::Object(body))) if status < 400 => {
                    let decoded = body
                        .get("content_base64")
                        .and_then(Value::as_str)
                        .and_then(|b| base64_simd::STANDARD.decode_to_vec(b).ok())
                        .map(String::from_utf8);
                    match decoded {
                        Some(Ok(content)) => tool_result(
                            false,
                            json!({"path": body.get("path"), "content": content}),
                        ),
                        _ => tool_result(
                            true,
                            json!({"error": format!("{path} is not UTF-8 text: read it with the download tool (base64)"), "type": "ValueError"}),
                        ),
                    }
                }
                Ok((_, body)) => tool_result(true, body),
                Err(error) => tool_result(true, error),
            });
        }
        "upload_text" => {
            let path = text_arg("path")?;
            let content = text_arg("content")?;
            let body = json!({"path": path, "content_base64": base64_simd::STANDARD.encode_to_string(content.as_bytes())});
            return Ok(answer_of(
                forward(call, "POST", "/upload", Some(&body)).await,
            ));
        }
        _ => {}
    }
    if let Some(command) = name.strip_prefix("command_") {
        let target = format!("/commands/{}", encode(command));
        let body = Value::Object(arguments);
        return Ok(answer_of(forward(call, "POST", &target, Some(&body)).await));
    }
    let catalog = call.catalog();
    let endpoint = catalog
        .endpoints
        .iter()
        .find(|e| e.spec.id == name)
        .ok_or_else(|| {
            format!("Unknown tool: {name} (tools/list names the tools this caller may use)")
        })?;
    if !is_tool(endpoint) {
        return Err(format!(
            "{name} streams its answer and is not a tool; call {} {} over HTTP",
            endpoint.spec.method_name(),
            endpoint.spec.path
        ));
    }
    let spec = &endpoint.spec;
    let mut path = spec.path.to_string();
    let mut query = Vec::new();
    let mut body = Map::new();
    for (key, value) in arguments {
        let declared = spec.params.iter().find(|p| p.name == key);
        let as_text = || match &value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        match declared.map(|p| p.location) {
            Some(ParamIn::Path) => path = path.replace(&format!("{{{key}}}"), &encode(&as_text())),
            Some(ParamIn::Query) => query.push(format!("{}={}", encode(&key), encode(&as_text()))),
            Some(ParamIn::Body) => {
                body.insert(key, value);
            }
            None if spec.method == Method::Get => {
                return Err(format!(
                    "{name} has no argument {key} (see its inputSchema)"
                ));
            }
            None => {
                body.insert(key, value);
            }
        }
    }
    if let Some(missing) = spec
        .params
        .iter()
        .find(|p| p.location == ParamIn::Path && path.contains(&format!("{{{}}}", p.name)))
    {
        return Err(format!("{name} needs the argument {}", missing.name));
    }
    let target = if query.is_empty() {
        path
    } else {
        format!("{path}?{}", query.join("&"))
    };
    let body = (spec.method != Method::Get).then_some(Value::Object(body));
    Ok(answer_of(
        forward(call, spec.method_name(), &target, body.as_ref()).await,
    ))
}

fn tool_result(is_error: bool, structured: Value) -> Value {
    let structured = match structured {
        Value::Object(_) => structured,
        other => json!({"result": other}),
    };
    json!({
        "content": [{"type": "text", "text": structured.to_string()}],
        "structuredContent": structured,
        "isError": is_error,
    })
}

fn answer_of(answer: Result<(u16, Value), Value>) -> Value {
    match answer {
        Ok((status, body)) => tool_result(status >= 400, body),
        Err(error) => tool_result(true, error),
    }
}

/// Serves the request in-process, through the same dispatcher a request on the API port
/// goes through, with the caller's own credentials: the route's status and JSON answer
/// (a text answer as `{"text": ...}`).
async fn forward(
    call: &Call,
    method: &str,
    target: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), Value> {
    let mut request = Request::new(method, target).header("Content-Type", "application/json");
    // The caller's own credentials, so the route admits exactly whom /mcp admitted (its
    // scopes, the policy for that identity), and the caller's Host, which the route
    // sees as its own.
    for name in ["host", "authorization", "x-access-token"] {
        if let Some(value) = call.header(name) {
            request = request.header(name, value);
        }
    }
    if let Some(body) = body {
        request = request.body(body.to_string());
    }
    let answer = InProcess::new(call.state.clone())
        .send(request)
        .await
        .map_err(not_called)?;
    let status = answer.status;
    let content_type = answer.header("content-type").map(str::to_string);
    let body = answer.body(ANSWER_LIMIT).await.map_err(not_called)?;
    let json = serde_json::from_slice::<Value>(&body).unwrap_or_else(
        |_| json!({"text": String::from_utf8_lossy(&body), "content_type": content_type}),
    );
    Ok((status, json))
}

/// A route that gave no answer (an answer too large to hand on, a broken stream).
fn not_called(e: std::io::Error) -> Value {
    let error = format!("the route could not be called: {e}");
    json!({"error": error, "type": "OSError"})
}

fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// `GET /mcp`: the session's server stream. A policy reload (a new revision) may change
/// the caller's tools: the stream says `notifications/tools/list_changed`, and the client
/// lists them again.
async fn events(call: Call) -> Result<Response, ApiError> {
    if let Err(refusal) = session_of(&call, &Value::Null) {
        return Ok(refusal);
    }
    let (mut tx, rx) = channel(4);
    let state = call.state.clone();
    let session = call.header(SESSION_HEADER).unwrap_or_default().to_string();
    let owner = call.identity.id.clone();
    let mut revision = call.catalog().policy.revision.clone();
    monoio::spawn(async move {
        let mut quiet_since = std::time::Instant::now();
        loop {
            monoio::select! {
                _ = tx.closed() => return,
                _ = monoio::time::sleep(std::time::Duration::from_millis(500)) => {}
            }
            if mcp::session(&session, &owner).is_none() {
                return;
            }
            // The stream says something only when a policy changes. The pinned Python
            // SDK (mcp 2.3.0) reads it with a 300 s timeout and stops reopening it after
            // two failures: ten quiet minutes, and the client would hear of no later
            // change. A comment every [`KEEPALIVE`] of quiet keeps it (and proxies) open.
            if quiet_since.elapsed() >= KEEPALIVE {
                if tx.send_raw(b": keep-alive\n\n".to_vec()).await.is_err() {
                    return;
                }
                quiet_since = std::time::Instant::now();
            }
            let now = state.catalog().policy.revision.clone();
            if now != revision {
                revision = now;
                let note = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
                if send(&mut tx, &note).await.is_err() {
                    return;
                }
                quiet_since = std::time::Instant::now();
            }
        }
    });
    Ok(sse::response(rx))
}

async fn send(tx: &mut SseSender, message: &Value) -> Result<(), crate::http::sse::StreamClosed> {
    tx.send("message", message).await
}

/// `DELETE /mcp`: ends the session.
async fn end(call: Call) -> Result<Response, ApiError> {
    let Some(session) = call.header(SESSION_HEADER) else {
        return Ok(rpc(
            400,
            mcp::error(
                &Value::Null,
                mcp::INVALID_REQUEST,
                "Mcp-Session-Id is required",
            ),
        ));
    };
    if mcp::close_session(session, &call.identity.id) {
        Ok(Response::ok(&json!({})))
    } else {
        Ok(rpc(
            404,
            mcp::error(
                &Value::Null,
                mcp::INVALID_REQUEST,
                "unknown or ended MCP session",
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    #[test]
    fn wrapped_endpoints_exist() {
        let endpoints = crate::routes::builtin_endpoints();
        for id in [
            super::DOWNLOAD_ENDPOINT,
            super::UPLOAD_ENDPOINT,
            super::COMMANDS_ENDPOINT,
        ] {
            assert!(
                endpoints.iter().any(|e| e.spec.id == id),
                "the MCP tools wrap '{id}', which no endpoint is"
            );
        }
    }

    use crate::testing::{run, TestApp};

    fn digest(token: &str) -> String {
        use sha2::Digest;
        sha2::Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// A tool call is the route served in-process as the caller: a scope the caller lacks
    /// is the route's own refusal, and what the caller may do answers as the route does.
    #[test]
    fn tool_calls_are_the_callers_own_requests() {
        let policy = json!({
            "endpoints": {"shell": {"scopes": ["exec"]}, "files_list": {"scopes": ["files:read"]}},
            "identities": [{"id": "reader", "scopes": ["files:read"], "token_sha256": digest("reader-token")}],
        });
        let app = TestApp::builder()
            .token("server-token")
            .policy(&policy.to_string())
            .build();
        std::fs::write(app.base().join("a.txt"), "hi").unwrap();
        run(async {
            let rpc = |session: Option<String>, message: Value| {
                let app = &app;
                async move {
                    let body = message.to_string();
                    let mut headers = vec![
                        ("Content-Type", "application/json"),
                        ("Authorization", "Bearer reader-token"),
                    ];
                    if let Some(session) = &session {
                        headers.push(("Mcp-Session-Id", session));
                    }
                    let reply = app.request("POST", "/mcp", &headers, body.as_bytes()).await;
                    assert_eq!(reply.status, 200, "{}", reply.json());
                    let session = reply.header("mcp-session-id").map(str::to_string);
                    (session, reply.json())
                }
            };
            let (session, _) = rpc(
                None,
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}),
            )
            .await;
            let call = |name: &str, arguments: Value| json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": arguments}});
            let (_, listed) = rpc(session.clone(), call("files_list", json!({"path": "."}))).await;
            let result = &listed["result"];
            assert_eq!(result["isError"], false, "{listed}");
            assert!(
                result["structuredContent"].to_string().contains("a.txt"),
                "{listed}"
            );
            let (_, shell) = rpc(
                session.clone(),
                call("shell", json!({"command": "echo no"})),
            )
            .await;
            let refused = &shell["result"]["structuredContent"];
            assert_eq!(shell["result"]["isError"], true, "{shell}");
            assert_eq!(refused["code"], "missing_scope", "{shell}");
            assert_eq!(refused["endpoint"], "shell");
            let (_, read) = rpc(session, call("download_text", json!({"path": "a.txt"}))).await;
            assert_eq!(
                read["result"]["structuredContent"]["content"], "hi",
                "{read}"
            );
        });
    }
}
