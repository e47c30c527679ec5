//! The MCP relay: how a session's MCP bearers stay out of the model's reach.
//!
//! codex runs the model's commands as its own user, so anything codex holds (its
//! environment in `/proc/<pid>/environ`, its argv, its memory through `ptrace` of a
//! parent) those commands can read. So codex never gets a bearer: each http MCP server
//! of a session's agent that needs one (a vault credential, the tool's own
//! `authorization`, its `headers`) is given to codex as a URL of this server,
//! `http://<API address>/v1/agents/mcp_relay/<capability>`, and the relay adds the
//! bearer and headers on the way to the real server. The capability is 128 random bits,
//! valid for that one server, while the session's codex runs: it is opened when the
//! session's actor starts codex and closed when that actor stops (an idle session, a
//! delete, a restart). What the model can learn is the capability, which reaches the
//! same MCP server codex reaches anyway, for as long as codex runs; never the secret.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{json, Value};

use crate::agents::records::new_id;
use crate::agents::webhooks::post::{self, Answer, Target, Unreachable};

/// The path of the relay's route, before the capability.
pub const PATH: &str = "/v1/agents/mcp_relay";

/// The largest answer of an MCP server the relay hands on.
pub const ANSWER_LIMIT: usize = 16 * 1024 * 1024;

/// How long one exchange with an MCP server may take (a tool call included).
pub const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Where one capability leads.
#[derive(Clone, Debug)]
pub struct Route {
    pub session: String,
    pub url: String,
    /// Sent on every request: `Authorization` and the tool's `headers`.
    pub headers: Vec<(String, String)>,
}

/// The open capabilities of every running session.
#[derive(Default)]
pub struct Relay {
    routes: Mutex<HashMap<String, Route>>,
}

impl Relay {
    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Route>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new capability for `route`.
    pub fn open(&self, route: Route) -> String {
        let capability = new_id("");
        self.routes().insert(capability.clone(), route);
        capability
    }

    pub fn route(&self, capability: &str) -> Option<Route> {
        self.routes().get(capability).cloned()
    }

    /// Closes `capabilities`.
    pub fn close(&self, capabilities: &[String]) {
        let mut routes = self.routes();
        for capability in capabilities {
            routes.remove(capability);
        }
    }

    /// Closes every capability of `session`.
    pub fn close_session(&self, session: &str) {
        self.routes().retain(|_, route| route.session != session);
    }

    /// Closes every capability (the server is stopping).
    pub fn close_all(&self) {
        self.routes().clear();
    }
}

/// Rewrites the http MCP servers of `agent` (as `codex_map::thread_plan` takes it) that
/// carry a bearer or headers to go through the relay at `base` (`http://host:port`):
/// each gets a capability of `session`, and its secrets stay in the relay. Returns the
/// capabilities opened, to close when that codex stops.
pub fn relay_tools(relay: &Relay, session: &str, base: &str, agent: &mut Value) -> Vec<String> {
    let mut opened = Vec::new();
    for tool in agent["tools"].as_array_mut().into_iter().flatten() {
        if tool["type"] != "mcp" || tool["transport"]["type"] != "http" {
            continue;
        }
        let transport = &mut tool["transport"];
        let mut headers: Vec<(String, String)> = Vec::new();
        if let Some(token) = transport["authorization"]
            .as_str()
            .filter(|t| !t.is_empty())
        {
            let token = token.strip_prefix("Bearer ").unwrap_or(token);
            headers.push(("Authorization".into(), format!("Bearer {token}")));
        }
        if let Some(map) = transport["headers"].as_object() {
            for (name, value) in map {
                if let Some(value) = value.as_str() {
                    headers.push((name.clone(), value.to_string()));
                }
            }
        }
        if headers.is_empty() {
            continue;
        }
        let url = transport["server_url"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let capability = relay.open(Route {
            session: session.to_string(),
            url,
            headers,
        });
        if let Some(map) = transport.as_object_mut() {
            map.remove("authorization");
            map.remove("headers");
            map.insert(
                "server_url".into(),
                json!(format!("{base}{PATH}/{capability}")),
            );
        }
        opened.push(capability);
    }
    opened
}

/// The request headers of MCP's Streamable HTTP transport the relay passes on (and no
/// other: the caller's `Authorization`, if any, is not the server's).
pub const PASSED_ON: [&str; 5] = [
    "content-type",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// One exchange with the MCP server of `route`: `method` with `body` and the passed-on
/// `headers`, plus the route's own; the answer read whole.
pub async fn forward(
    route: &Route,
    method: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Answer, Unreachable> {
    let target = Target::parse_any(&route.url).map_err(|why| Unreachable(format!("url: {why}")))?;
    let mut request = format!(
        "{method} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: agent-sandbox-mcp-relay\r\nConnection: close\r\nContent-Length: {}\r\n",
        target.path,
        target.authority(),
        body.len()
    );
    for (name, value) in headers
        .iter()
        .copied()
        .chain(route.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())))
    {
        // A value with CR or LF would split the request: never sent.
        if name.contains(['\r', '\n', ':']) || value.contains(['\r', '\n']) {
            continue;
        }
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let mut request = request.into_bytes();
    request.extend_from_slice(body);
    // The owner configured this server: a loopback or private one is theirs to reach,
    // as codex would.
    match monoio::time::timeout(
        TIMEOUT,
        post::round_trip(&target, request, true, ANSWER_LIMIT),
    )
    .await
    {
        Ok(answer) => answer,
        Err(_) => Err(Unreachable(format!(
            "the MCP server did not answer within {} s",
            TIMEOUT.as_secs()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_leave_the_agent_for_the_relay() {
        let relay = Relay::default();
        let mut agent = json!({"tools": [
            {"type": "mcp", "server_label": "a", "transport": {"type": "http",
                "server_url": "https://mcp.test/mcp", "authorization": "Bearer s3cret",
                "headers": {"X-Key": "k3y"}}},
            {"type": "mcp", "server_label": "b", "transport": {"type": "http",
                "server_url": "https://open.test/mcp"}},
            {"type": "mcp", "server_label": "c", "transport": {"type": "stdio", "command": "x"}},
        ]});
        let opened = relay_tools(&relay, "sess_1", "http://127.0.0.1:9000", &mut agent);
        assert_eq!(opened.len(), 1);
        let shown = agent.to_string();
        assert!(
            !shown.contains("s3cret") && !shown.contains("k3y"),
            "{shown}"
        );
        let url = agent["tools"][0]["transport"]["server_url"]
            .as_str()
            .unwrap();
        let capability = url
            .strip_prefix("http://127.0.0.1:9000/v1/agents/mcp_relay/")
            .unwrap();
        assert_eq!(capability.len(), 32);
        let route = relay.route(capability).unwrap();
        assert_eq!(route.url, "https://mcp.test/mcp");
        assert_eq!(
            route.headers,
            [
                ("Authorization".to_string(), "Bearer s3cret".to_string()),
                ("X-Key".to_string(), "k3y".to_string())
            ]
        );
        // Nothing secret, nothing relayed.
        assert_eq!(
            agent["tools"][1]["transport"]["server_url"],
            "https://open.test/mcp"
        );
        relay.close_session("sess_2");
        assert!(relay.route(capability).is_some());
        relay.close(&opened);
        assert!(relay.route(capability).is_none());
    }
}
