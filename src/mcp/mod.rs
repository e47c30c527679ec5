//! The Model Context Protocol's vocabulary as this server speaks it at `/mcp`: JSON-RPC
//! messages, protocol-version negotiation, sessions, and tool schemas built from the
//! route table's declared parameters. No HTTP here: `routes::mcp` adapts it.
//!
//! Revisions: the initialize handshake era, 2025-03-26 through 2025-11-25, over the
//! Streamable HTTP transport. The 2026-07-28 revision (`server/discover`, no sessions)
//! is not spoken: its clients probe `server/discover`, get "method not found" and fall
//! back to `initialize`, as the official SDKs do.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{json, Map, Value};

use crate::api::{Param, ParamIn};

/// Revisions served, newest first.
pub const VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

/// JSON-RPC and MCP error codes.
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;

/// The revision to answer a client that asks for `requested`: the same when served,
/// else the newest (the client then decides whether it can speak it).
pub fn negotiate(requested: Option<&str>) -> &'static str {
    VERSIONS
        .into_iter()
        .find(|v| Some(*v) == requested)
        .unwrap_or(VERSIONS[0])
}

/// Whether `version` is one this server speaks (the `MCP-Protocol-Version` header).
pub fn served(version: &str) -> bool {
    VERSIONS.contains(&version)
}

pub fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

pub fn error(id: &Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// One JSON-RPC message as received.
pub enum Message {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification,
    /// A response to a request of ours (this server sends none), or an invalid message
    /// answered with the error it carries.
    Response,
    Invalid(Value),
}

pub fn classify(message: &Value) -> Message {
    let Some(object) = message.as_object() else {
        return Message::Invalid(error(
            &Value::Null,
            INVALID_REQUEST,
            "a JSON-RPC message is an object",
        ));
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        let id = object.get("id").cloned().unwrap_or(Value::Null);
        return Message::Invalid(error(&id, INVALID_REQUEST, "jsonrpc must be \"2.0\""));
    }
    match (object.get("method"), object.get("id")) {
        (Some(Value::String(method)), Some(id)) if id.is_string() || id.is_number() => {
            Message::Request {
                id: id.clone(),
                method: method.clone(),
                params: object.get("params").cloned().unwrap_or(Value::Null),
            }
        }
        (Some(Value::String(_)), None) => Message::Notification,
        (None, Some(_)) if object.contains_key("result") || object.contains_key("error") => {
            Message::Response
        }
        _ => {
            let id = object.get("id").cloned().unwrap_or(Value::Null);
            Message::Invalid(error(
                &id,
                INVALID_REQUEST,
                "not a JSON-RPC request, notification or response",
            ))
        }
    }
}

/// A session: who opened it (a session is never another identity's) and its revision.
struct Session {
    owner: String,
    version: &'static str,
    /// When it was last used, as a count of uses (strictly increasing, unlike a clock
    /// read twice in one tick): the least recently used has the lowest.
    last_used: u64,
}

/// The next use's number.
fn tick() -> u64 {
    static USES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    USES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Sessions one identity keeps at most unless the policy says otherwise
/// (`endpoints.mcp.limits.max_sessions`); past it, that identity's least recently used
/// session goes. One identity's sessions never push out another's.
pub const MAX_SESSIONS: usize = 1024;

fn sessions() -> &'static Mutex<HashMap<String, Session>> {
    static SESSIONS: std::sync::OnceLock<Mutex<HashMap<String, Session>>> =
        std::sync::OnceLock::new();
    SESSIONS.get_or_init(Mutex::default)
}

/// Opens a session for `owner` and returns its id (128 random bits, hex). When `owner`
/// already holds `limit` sessions, its own least recently used one is ended first.
pub fn open_session(owner: &str, version: &'static str, limit: usize) -> String {
    let mut bytes = [0u8; 16];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut table = sessions().lock().unwrap_or_else(|e| e.into_inner());
    let mut own: Vec<(u64, String)> = table
        .iter()
        .filter(|(_, s)| s.owner == owner)
        .map(|(k, s)| (s.last_used, k.clone()))
        .collect();
    if own.len() >= limit.max(1) {
        own.sort_unstable();
        for (_, oldest) in own.iter().take(own.len() + 1 - limit.max(1)) {
            table.remove(oldest);
        }
    }
    table.insert(
        id.clone(),
        Session {
            owner: owner.to_string(),
            version,
            last_used: tick(),
        },
    );
    id
}

/// The revision of `owner`'s session `id`; `None` for an unknown id or another
/// identity's (the same answer, so ids of others cannot be probed).
pub fn session(id: &str, owner: &str) -> Option<&'static str> {
    let mut table = sessions().lock().unwrap_or_else(|e| e.into_inner());
    let session = table.get_mut(id).filter(|s| s.owner == owner)?;
    session.last_used = tick();
    Some(session.version)
}

/// Ends `owner`'s session `id`; whether there was one.
pub fn close_session(id: &str, owner: &str) -> bool {
    let mut table = sessions().lock().unwrap_or_else(|e| e.into_inner());
    if table.get(id).is_some_and(|s| s.owner == owner) {
        table.remove(id);
        true
    } else {
        false
    }
}

/// A JSON Schema for a declared parameter type.
pub fn schema_of(kind: &str) -> Value {
    match kind {
        "string" | "integer" | "number" | "boolean" | "object" | "array" => json!({"type": kind}),
        _ => json!({}),
    }
}

/// A tool's `inputSchema` from a route's declared parameters: path, query and body
/// parameters are all arguments of the one object.
pub fn input_schema(params: &[Param]) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for param in params {
        let mut schema = param.schema();
        if param.doc.is_empty() {
            schema["description"] = json!(format!("{} parameter", param.location.name()));
        } else {
            schema["description"] = json!(format!(
                "{} ({} parameter)",
                param.doc,
                param.location.name()
            ));
        }
        properties.insert(param.name.to_string(), schema);
        if param.required || param.location == ParamIn::Path {
            required.push(param.name);
        }
    }
    json!({"type": "object", "properties": properties, "required": required})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_negotiated_down_to_one_served() {
        assert_eq!(negotiate(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate(Some("2026-07-28")), "2025-11-25");
        assert_eq!(negotiate(None), "2025-11-25");
        assert!(served("2025-03-26") && !served("2024-11-05"));
    }

    #[test]
    fn messages_are_told_apart() {
        assert!(matches!(
            classify(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})),
            Message::Request { .. }
        ));
        assert!(matches!(
            classify(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
            Message::Notification
        ));
        assert!(matches!(
            classify(&json!({"jsonrpc": "2.0", "id": 1, "result": {}})),
            Message::Response
        ));
        assert!(matches!(
            classify(&json!({"jsonrpc": "1.0", "id": 1, "method": "x"})),
            Message::Invalid(_)
        ));
        assert!(matches!(classify(&json!([1])), Message::Invalid(_)));
    }

    #[test]
    fn sessions_belong_to_their_owner() {
        let id = open_session("alice", "2025-06-18", MAX_SESSIONS);
        assert_eq!(session(&id, "alice"), Some("2025-06-18"));
        assert_eq!(session(&id, "bob"), None);
        assert!(!close_session(&id, "bob"));
        assert!(close_session(&id, "alice"));
        assert_eq!(session(&id, "alice"), None);
    }

    /// Another identity churning sessions never ends yours: each identity's bound
    /// takes only its own least recently used.
    #[test]
    fn each_identity_has_its_own_bound() {
        let mine = open_session("carol", "2025-06-18", 3);
        let theirs: Vec<String> = (0..50)
            .map(|_| open_session("dave", "2025-06-18", 3))
            .collect();
        assert_eq!(session(&mine, "carol"), Some("2025-06-18"));
        let kept: Vec<&String> = theirs
            .iter()
            .filter(|id| session(id, "dave").is_some())
            .collect();
        assert_eq!(kept, theirs[47..].iter().collect::<Vec<_>>());
        // Carol's own bound ends her least recently used, not the one she just used.
        let second = open_session("carol", "2025-06-18", 3);
        let third = open_session("carol", "2025-06-18", 3);
        assert_eq!(session(&mine, "carol"), Some("2025-06-18"));
        let fourth = open_session("carol", "2025-06-18", 3);
        assert_eq!(session(&second, "carol"), None);
        for id in [&mine, &third, &fourth] {
            assert!(session(id, "carol").is_some());
        }
    }

    #[test]
    fn schemas_come_from_declared_params() {
        let schema = input_schema(&[
            Param::query("path", "string", true),
            Param::body("recursive", "boolean", false),
        ]);
        assert_eq!(schema["properties"]["path"]["type"], "string");
        assert_eq!(schema["required"], json!(["path"]));
    }
}
