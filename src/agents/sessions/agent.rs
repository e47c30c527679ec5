//! What codex's `thread/start` and `turn/start` take of a session's agent configuration
//! (`crate::agents::saved::AgentConfig` as JSON): its function tools as dynamic tools,
//! its MCP tools as per-thread servers, its JSON-schema text format as an output schema.

use serde_json::{json, Map, Value};


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
                // Per-thread configuration is not persisted by codex: the server's
                // environment variables reach that server's process alone.
                if transport["env"].is_object() {
                    config.insert(key("env"), transport["env"].clone());
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
    fn tools_become_dynamic_tools_and_thread_mcp_servers() {
        let agent = json!({"model": "m", "text": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
            "tools": [
                {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "defer_loading": false},
                {"type": "mcp", "server_label": "docs", "transport": {"type": "http", "server_url": "http://127.0.0.1:1/mcp"}, "allowed_tools": ["a"]},
                {"type": "mcp", "server_label": "local", "transport": {"type": "stdio", "command": "/bin/tool", "args": ["-x"]}},
            ]});
        assert_eq!(
            dynamic_tools(&agent),
            [json!({"type": "function", "name": "f", "description": "d", "inputSchema": {"type": "object"}})]
        );
        let (config, bearers) = mcp_config(&agent);
        assert_eq!(config["mcp_servers.docs.url"], "http://127.0.0.1:1/mcp");
        assert_eq!(config["mcp_servers.docs.bearer_token_env_var"], "ABX_MCP_BEARER_DOCS");
        assert_eq!(config["mcp_servers.docs.enabled_tools"], json!(["a"]));
        assert_eq!(config["mcp_servers.local.command"], "/bin/tool");
        assert_eq!(bearers.len(), 1, "a stdio server takes no bearer");
        assert_eq!(bearers[0].1, "http://127.0.0.1:1/mcp");
        assert_eq!(output_schema(&agent), Some(json!({"type": "object"})));
    }
}
