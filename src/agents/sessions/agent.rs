//! A session's `agent`: the snapshot the session keeps (a saved agent's fields with the
//! request's overrides on top, or an inline agent), in the SDK's `AgentSession.agent`
//! shape, and what of it codex's `thread/start` and `turn/start` take.

use serde_json::{json, Map, Value};

use crate::agents::error::AgentError;
use crate::agents::records::new_id;

/// The fields a session's agent has, with their defaults.
fn defaults() -> Map<String, Value> {
    let Value::Object(map) = json!({
        "model": null,
        "instructions": null,
        "name": null,
        "multi_agent": {"enabled": false},
        "reasoning": {},
        "service_tier": "auto",
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tools": [],
        "compaction": null,
        "experimental": null,
    }) else {
        unreachable!()
    };
    map
}

/// The snapshot: `saved` (a saved agent's object, whose `id` the session keeps) or the
/// defaults, with `overrides` (already checked) on top. Without a model it is refused.
pub fn snapshot(saved: Option<&Value>, overrides: Map<String, Value>) -> Result<Value, AgentError> {
    let mut agent = defaults();
    let id = match saved {
        Some(saved) => {
            for key in defaults().keys() {
                if let Some(value) = saved.get(key) {
                    agent.insert(key.clone(), value.clone());
                }
            }
            saved["id"].as_str().unwrap_or_default().to_string()
        }
        None => new_id("agent_"),
    };
    for (key, value) in overrides {
        match (key.as_str(), value) {
            ("tools", Value::Null) => {
                agent.insert(key, json!([]));
            }
            ("service_tier", Value::Null) => {
                agent.insert(key, json!("auto"));
            }
            (_, value) => {
                agent.insert(key, value);
            }
        }
    }
    if !agent["model"].is_string() {
        return Err(AgentError::invalid(
            "agent.model",
            "agent.model is required without agent_id: the model codex asks (its provider's model name).",
        ));
    }
    agent.insert("id".into(), json!(id));
    // The session's AgentTool union has no tool_search: a saved agent's is kept out.
    if let Some(Value::Array(tools)) = agent.get_mut("tools") {
        tools.retain(|t| t["type"] != "tool_search");
    }
    Ok(Value::Object(agent))
}

/// The `function` tools of an agent as codex's `dynamicTools`.
pub fn dynamic_tools(agent: &Value) -> Vec<Value> {
    agent["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["type"] == "function")
        .map(|t| {
            json!({
                "type": "function",
                "name": t["name"],
                "description": t["description"].as_str().unwrap_or_default(),
                "inputSchema": if t["parameters"].is_object() { t["parameters"].clone() } else { json!({"type": "object"}) },
            })
        })
        .collect()
}

/// The `mcp` tools of an agent as codex's per-thread configuration (dotted keys, which
/// merge with the server's own), and the bearer each needs from the environment:
/// `(env var name, server URL, credential id)`.
pub fn mcp_config(agent: &Value) -> (Map<String, Value>, Vec<(String, String, Option<String>)>) {
    let mut config = Map::new();
    let mut bearers = Vec::new();
    for tool in agent["tools"].as_array().into_iter().flatten() {
        if tool["type"] != "mcp" {
            continue;
        }
        let label = tool["server_label"].as_str().unwrap_or_default();
        let key = |field: &str| format!("mcp_servers.{label}.{field}");
        let transport = &tool["transport"];
        match transport["type"].as_str() {
            Some("stdio") => {
                config.insert(key("command"), transport["command"].clone());
                if transport["args"].is_array() {
                    config.insert(key("args"), transport["args"].clone());
                }
                if transport["cwd"].is_string() {
                    config.insert(key("cwd"), transport["cwd"].clone());
                }
            }
            _ => {
                let url = transport["server_url"].as_str().unwrap_or_default();
                config.insert(key("url"), json!(url));
                if transport["headers"].is_object() {
                    config.insert(key("http_headers"), transport["headers"].clone());
                }
                let var = format!(
                    "ABX_MCP_BEARER_{}",
                    label
                        .bytes()
                        .map(|b| if b.is_ascii_alphanumeric() { b.to_ascii_uppercase() as char } else { '_' })
                        .collect::<String>()
                );
                config.insert(key("bearer_token_env_var"), json!(var));
                bearers.push((
                    var,
                    url.to_string(),
                    tool["credential_id"].as_str().map(str::to_string),
                ));
            }
        }
        if let Some(allowed) = tool["allowed_tools"].as_array() {
            config.insert(key("enabled_tools"), Value::Array(allowed.clone()));
        }
        config.insert(key("required"), json!(tool["required"].as_bool().unwrap_or(false)));
        config.insert(key("default_tools_approval_mode"), json!("approve"));
    }
    (config, bearers)
}

/// `text.format` as `turn/start`'s `outputSchema`, when it is a JSON schema.
pub fn output_schema(agent: &Value) -> Option<Value> {
    let format = &agent["text"]["format"];
    (format["type"] == "json_schema").then(|| format["schema"].clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_the_saved_agent_with_overrides() {
        let saved = json!({"id": "agent_1", "model": "m1", "instructions": "be brief",
            "tools": [{"type": "tool_search"}, {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "defer_loading": false}]});
        let mut overrides = Map::new();
        overrides.insert("model".into(), json!("m2"));
        let agent = snapshot(Some(&saved), overrides).unwrap();
        assert_eq!(agent["id"], "agent_1");
        assert_eq!(agent["model"], "m2");
        assert_eq!(agent["instructions"], "be brief");
        assert_eq!(agent["tools"].as_array().unwrap().len(), 1);
        assert_eq!(dynamic_tools(&agent)[0]["name"], "f");
        assert!(matches!(
            snapshot(None, Map::new()),
            Err(AgentError::Invalid { param, .. }) if param == "agent.model"
        ));
        let inline = snapshot(None, {
            let mut m = Map::new();
            m.insert("model".into(), json!("m"));
            m.insert("tools".into(), json!([{"type": "mcp", "server_label": "docs", "transport": {"type": "http", "server_url": "http://127.0.0.1:1/mcp"}, "allowed_tools": ["a"]}]));
            m
        })
        .unwrap();
        assert!(inline["id"].as_str().unwrap().starts_with("agent_"));
        let (config, bearers) = mcp_config(&inline);
        assert_eq!(config["mcp_servers.docs.url"], "http://127.0.0.1:1/mcp");
        assert_eq!(config["mcp_servers.docs.bearer_token_env_var"], "ABX_MCP_BEARER_DOCS");
        assert_eq!(config["mcp_servers.docs.enabled_tools"], json!(["a"]));
        assert_eq!(bearers[0].1, "http://127.0.0.1:1/mcp");
    }
}
