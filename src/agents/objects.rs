//! The OpenAI shapes of what this server keeps and streams: every object's
//! `x_agent_sandbox` label, output items, usage. Plain JSON values; answering them is
//! the routes' business.

use serde_json::{json, Value};

use super::events::{Item, Usage};
use super::records::{new_id, Record};
use super::runtime::Runtime;

/// A record answered as an OpenAI object.
pub trait Object: Record {
    fn object(&self) -> Value;
}

/// `x_agent_sandbox`: how an object differs from what OpenAI's API would return (the
/// difference codes are documented in `docs/agents.md`).
pub fn label(compute: &str, differences: &[&str]) -> Value {
    json!({"local": true, "compute": compute, "differences": differences})
}

/// What list pages of stored objects differ in.
pub const LIST_DIFFERENCES: [&str; 1] = ["store_limits"];

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An output item in OpenAI's shape.
pub fn output_item(item: &Item, runtime: Runtime) -> Value {
    let mut value = match item {
        Item::Message { text } => json!({
            "id": new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }),
        Item::Reasoning { text } => json!({
            "id": new_id("rs_"),
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": text}],
        }),
        Item::Shell {
            command,
            output,
            exit_code,
        } => json!({
            "id": new_id("lsh_"),
            "type": "local_shell_call",
            "call_id": new_id("call_"),
            "status": "completed",
            "action": {"type": "exec", "command": ["bash", "-lc", command], "env": {}},
            "x_agent_sandbox": {"output": output, "exit_code": exit_code},
        }),
        Item::ToolCall { name, arguments } => json!({
            "id": new_id("fc_"),
            "type": "function_call",
            "call_id": new_id("call_"),
            "name": name,
            "arguments": arguments,
            "status": "completed",
        }),
        Item::Other(value) => return value.clone(),
    };
    // Every object carries the label; a shell call's output and exit code sit beside it.
    let mut labelled = label(runtime.name(), &["tools_run_locally"]);
    if let Some(extra) = value.get("x_agent_sandbox").and_then(Value::as_object) {
        for (k, v) in extra {
            labelled[k] = v.clone();
        }
    }
    value["x_agent_sandbox"] = labelled;
    value
}

pub fn usage_json(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        // Neither CLI reports cache writes; 0 is the neutral value
        // (`usage_neutral_fields`), and the pinned SDK requires the field.
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_items_take_openai_shapes() {
        let message = output_item(&Item::Message { text: "hi".into() }, Runtime::Codex);
        assert_eq!(message["type"], "message");
        assert_eq!(message["content"][0]["text"], "hi");
        let shell = output_item(
            &Item::Shell {
                command: "ls".into(),
                output: "a\n".into(),
                exit_code: Some(0),
            },
            Runtime::Codex,
        );
        assert_eq!(shell["x_agent_sandbox"]["exit_code"], 0);
        assert_eq!(shell["x_agent_sandbox"]["local"], true);
        assert_eq!(shell["type"], "local_shell_call");
        assert_eq!(shell["action"]["command"][2], "ls");
        assert_eq!(
            usage_json(Usage {
                input_tokens: 3,
                output_tokens: 4,
                ..Usage::default()
            })["total_tokens"],
            7
        );
    }
}
