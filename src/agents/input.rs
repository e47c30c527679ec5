//! What a request hands a turn or a conversation, checked: input messages of text and
//! metadata. Shared by [`super::responses`] and [`super::conversations`], so neither
//! needs the other.

use serde_json::{json, Value};

use super::error::AgentError;
use super::objects::label;
use super::records::new_id;

/// One input message.
#[derive(Debug)]
pub struct InputMessage {
    pub role: String,
    pub text: String,
}

/// `input`: a string, or a list of message items whose content is text.
pub fn parse_input(input: &Value) -> Result<Vec<InputMessage>, AgentError> {
    match input {
        Value::Null => Err(AgentError::invalid(
            "input",
            "input is required: a string or a list of message items.",
        )),
        Value::String(text) => Ok(vec![InputMessage {
            role: "user".into(),
            text: text.clone(),
        }]),
        Value::Array(items) => parse_messages(items, "input"),
        _ => Err(AgentError::invalid(
            "input",
            "input must be a string or a list of message items.",
        )),
    }
}

/// A list of message items whose content is text; refusals name `field[i]...`.
pub fn parse_messages(items: &[Value], field: &str) -> Result<Vec<InputMessage>, AgentError> {
    let mut messages = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = |rest: &str| format!("{field}[{i}]{rest}");
        let unknown = item.as_object().and_then(|o| {
            o.keys()
                .find(|k| !matches!(k.as_str(), "type" | "role" | "content" | "id" | "status"))
        });
        if let Some(key) = unknown {
            return Err(AgentError::invalid(
                at(&format!(".{key}")),
                format!("Input items cannot carry '{key}' for a local runtime."),
            ));
        }
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        if kind != "message" {
            return Err(AgentError::invalid(at(".type"), format!("Input items of type '{kind}' cannot be honoured by a local runtime; send message items.")));
        }
        let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
        if !matches!(role, "user" | "system" | "developer" | "assistant") {
            return Err(AgentError::invalid(
                at(".role"),
                format!("Unknown role '{role}'."),
            ));
        }
        let text = match item.get("content") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(parts)) => content_text(parts, &at(".content"))?,
            _ => {
                return Err(AgentError::invalid(
                    at(".content"),
                    "content must be a string or a list of input_text parts.",
                ))
            }
        };
        messages.push(InputMessage {
            role: role.into(),
            text,
        });
    }
    if messages.is_empty() {
        return Err(AgentError::invalid(
            field,
            format!("{field} must hold at least one message."),
        ));
    }
    Ok(messages)
}

/// The text parts of a message's content, one per line.
fn content_text(parts: &[Value], at: &str) -> Result<String, AgentError> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
        match (kind, part.get("text").and_then(Value::as_str)) {
            ("input_text" | "output_text" | "text", Some(t)) => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(t);
            }
            _ => return Err(AgentError::invalid(format!("{at}[{j}].type"), format!("Content of type '{kind}' cannot be honoured by a local runtime; send input_text."))),
        }
    }
    Ok(text)
}

/// A message item with a fresh id, as conversations and responses keep input.
pub fn input_item(message: &InputMessage) -> Value {
    json!({
        "id": new_id("msg_"),
        "type": "message",
        "role": message.role,
        "status": "completed",
        "content": [{"type": "input_text", "text": message.text}],
        "x_agent_sandbox": label("agent-sandbox", &[]),
    })
}

/// metadata: at most 16 strings, keys up to 64 and values up to 512 characters.
pub fn check_metadata(metadata: Option<Value>) -> Result<Value, AgentError> {
    match metadata {
        None | Some(Value::Null) => Ok(json!({})),
        Some(Value::Object(map)) => {
            if map.len() > 16
                || map
                    .iter()
                    .any(|(k, v)| k.len() > 64 || v.as_str().is_none_or(|s| s.len() > 512))
            {
                return Err(AgentError::invalid("metadata", "metadata holds at most 16 string values, keys up to 64 and values up to 512 characters."));
            }
            Ok(Value::Object(map))
        }
        Some(_) => Err(AgentError::invalid(
            "metadata",
            "metadata must be an object of strings.",
        )),
    }
}
