//! What a CLI's JSON-lines output says, as a neutral stream of [`AgentEvent`]s: one
//! reader per runtime's format.

use serde::Deserialize;
use serde_json::Value;

/// Token counts of a turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
}

/// One thing the agent produced, in neutral terms.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    /// Text for the user.
    Message { text: String },
    /// A summary of the model's reasoning.
    Reasoning { text: String },
    /// A shell command the agent ran, with what it printed.
    Shell {
        command: String,
        output: String,
        exit_code: Option<i64>,
    },
    /// A call of another tool (file edits, searches, MCP tools).
    ToolCall { name: String, arguments: String },
    /// Anything else the CLI reported, as it reported it.
    Other(Value),
}

/// What a turn's output says, line by line.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentEvent {
    /// The CLI's own session id: resume the next turn with it.
    Session(String),
    /// A finished item.
    Item(Item),
    /// The turn ended well, with its token counts.
    Completed(Usage),
    /// The turn failed: the CLI's message.
    Failed(String),
    /// The model provider refused the turn with this HTTP status (Claude Code's
    /// `api_error_status`), and the CLI's message.
    ProviderError { status: u16, message: String },
    /// A piece of the assistant message being written (Claude Code streams them; the
    /// finished [`Item::Message`] follows with the whole text).
    Delta(String),
    /// A complaint the CLI may still recover from (codex retries after an `error`
    /// event); kept to explain a turn that ends without a result.
    Notice(String),
}

impl AgentEvent {
    /// Whether this is the turn's last event.
    pub fn ends_turn(&self) -> bool {
        matches!(
            self,
            AgentEvent::Completed(_) | AgentEvent::Failed(_) | AgentEvent::ProviderError { .. }
        )
    }
}

#[derive(Deserialize)]
struct CodexLine {
    #[serde(rename = "type")]
    kind: String,
    thread_id: Option<String>,
    item: Option<Value>,
    usage: Option<Value>,
    error: Option<Value>,
    message: Option<String>,
}

fn number(value: &Value, name: &str) -> u64 {
    value.get(name).and_then(Value::as_u64).unwrap_or(0)
}

pub(super) fn parse_codex(line: &str) -> Vec<AgentEvent> {
    let Ok(parsed) = serde_json::from_str::<CodexLine>(line) else {
        return Vec::new();
    };
    match parsed.kind.as_str() {
        "thread.started" => parsed
            .thread_id
            .map(AgentEvent::Session)
            .into_iter()
            .collect(),
        "item.completed" => {
            let Some(item) = parsed.item else {
                return Vec::new();
            };
            let text = |name: &str| {
                item.get(name)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            let converted = match item.get("type").and_then(Value::as_str).unwrap_or("") {
                "agent_message" => Item::Message { text: text("text") },
                "reasoning" => Item::Reasoning { text: text("text") },
                "command_execution" => Item::Shell {
                    command: text("command"),
                    output: text("aggregated_output"),
                    exit_code: item.get("exit_code").and_then(Value::as_i64),
                },
                "mcp_tool_call" => Item::ToolCall {
                    name: format!("{}.{}", text("server"), text("tool")),
                    arguments: item
                        .get("arguments")
                        .map(Value::to_string)
                        .unwrap_or_else(|| "{}".into()),
                },
                _ => Item::Other(item.clone()),
            };
            vec![AgentEvent::Item(converted)]
        }
        "turn.completed" => {
            let usage = parsed.usage.unwrap_or(Value::Null);
            vec![AgentEvent::Completed(Usage {
                input_tokens: number(&usage, "input_tokens"),
                cached_tokens: number(&usage, "cached_input_tokens"),
                output_tokens: number(&usage, "output_tokens"),
                reasoning_tokens: number(&usage, "reasoning_output_tokens"),
            })]
        }
        "turn.failed" => {
            let message = parsed
                .error
                .as_ref()
                .and_then(|e| e.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("the turn failed")
                .to_string();
            vec![AgentEvent::Failed(message)]
        }
        // A stream error codex may still recover from (it retries); the turn's end says
        // whether it did.
        "error" => parsed.message.map(AgentEvent::Notice).into_iter().collect(),
        _ => Vec::new(),
    }
}

pub(super) fn parse_qwen(line: &str) -> Vec<AgentEvent> {
    let Ok(value) = serde_json::from_str::<Value>(line) else {
        return Vec::new();
    };
    let kind = value.get("type").and_then(Value::as_str).unwrap_or("");
    let mut events = Vec::new();
    match kind {
        "system" if value.get("subtype").and_then(Value::as_str) == Some("init") => {
            if let Some(id) = value.get("session_id").and_then(Value::as_str) {
                events.push(AgentEvent::Session(id.to_string()));
            }
        }
        "assistant" => {
            let blocks = value
                .pointer("/message/content")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for block in blocks {
                match block.get("type").and_then(Value::as_str).unwrap_or("") {
                    "text" => {
                        let text = block.get("text").and_then(Value::as_str).unwrap_or("");
                        if !text.is_empty() {
                            events.push(AgentEvent::Item(Item::Message { text: text.into() }));
                        }
                    }
                    "thinking" => {
                        let text = block.get("thinking").and_then(Value::as_str).unwrap_or("");
                        events.push(AgentEvent::Item(Item::Reasoning { text: text.into() }));
                    }
                    "tool_use" => events.push(AgentEvent::Item(Item::ToolCall {
                        name: block
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .into(),
                        arguments: block
                            .get("input")
                            .map(Value::to_string)
                            .unwrap_or_else(|| "{}".into()),
                    })),
                    _ => {}
                }
            }
        }
        "result" => {
            let failed = value
                .get("is_error")
                .and_then(Value::as_bool)
                .unwrap_or(false)
                || value.get("subtype").and_then(Value::as_str) != Some("success");
            if failed {
                let message = value
                    .get("error")
                    .and_then(|e| e.get("message").or(Some(e)))
                    .and_then(Value::as_str)
                    .or(value.get("result").and_then(Value::as_str))
                    .unwrap_or("the turn failed");
                events.push(AgentEvent::Failed(message.to_string()));
            } else {
                let usage = value.get("usage").cloned().unwrap_or(Value::Null);
                events.push(AgentEvent::Completed(Usage {
                    input_tokens: number(&usage, "input_tokens"),
                    cached_tokens: number(&usage, "cache_read_input_tokens"),
                    output_tokens: number(&usage, "output_tokens"),
                    reasoning_tokens: 0,
                }));
            }
        }
        _ => {}
    }
    events
}
