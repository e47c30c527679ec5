//! What `POST …/events` may carry (the SDK's `AgentSessionInputParam`), checked before
//! anything runs: a batch is refused whole when one of its events is bad, and is applied
//! in order otherwise.

use serde_json::{json, Value};

use crate::agents::codex_map::ToolResult;
use crate::agents::error::AgentError;

/// Events one request carries at most.
pub const MAX_EVENTS: usize = 32;
/// Messages one input carries at most, and content parts per message.
pub const MAX_MESSAGES: usize = 32;
pub const MAX_PARTS: usize = 64;
/// Bytes of text and image data one input carries at most.
pub const MAX_INPUT_BYTES: usize = 8 * 1024 * 1024;

/// One user content part.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    Text(String),
    /// A `data:` URL (codex refuses remote image URLs).
    Image(String),
}

/// One input event.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// User messages: a turn when the session is idle, a steer of the running one.
    Message(Vec<Vec<Part>>),
    Cancel,
    ToolResult {
        turn_id: String,
        call_id: String,
        result: ToolResult,
    },
}

/// `events` of `POST …/events`.
pub fn parse_events(events: &Value) -> Result<Vec<Input>, AgentError> {
    let list = events
        .as_array()
        .ok_or_else(|| AgentError::invalid("events", "events must be a list of input events."))?;
    if list.is_empty() || list.len() > MAX_EVENTS {
        return Err(AgentError::invalid(
            "events",
            format!("events must hold 1 to {MAX_EVENTS} input events."),
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, event)| parse_event(event, &format!("events[{i}]")))
        .collect()
}

fn parse_event(event: &Value, at: &str) -> Result<Input, AgentError> {
    let field = |name: &str| format!("{at}.{name}");
    let kind = event
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match kind {
        "agent.session.input.message" => Ok(Input::Message(parse_messages(
            event.get("input").unwrap_or(&Value::Null),
            &field("input"),
        )?)),
        "agent.session.input.cancel" => Ok(Input::Cancel),
        "agent.session.input.tool_result" => {
            let text = |name: &str| -> Result<String, AgentError> {
                event
                    .get(name)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| {
                        AgentError::invalid(field(name), format!("{name} is required: a string."))
                    })
            };
            let turn_id = text("turn_id")?;
            let call_id = text("call_id")?;
            let success = event
                .get("success")
                .and_then(Value::as_bool)
                .ok_or_else(|| {
                    AgentError::invalid(field("success"), "success is required: true or false.")
                })?;
            if success {
                check_output(event.get("output").unwrap_or(&Value::Null), &field("output"))?;
            } else if !matches!(event.get("error"), None | Some(Value::Null) | Some(Value::String(_))) {
                return Err(AgentError::invalid(field("error"), "error must be a string."));
            }
            Ok(Input::ToolResult {
                turn_id,
                call_id,
                result: ToolResult::of(event),
            })
        }
        "agent.session.input.mcp_approval_request_result"
        | "agent.session.input.computer_use_approval_request_result" => Err(AgentError::invalid(
            field("type"),
            format!("{kind} answers a required action this server never asks for: MCP tools of a local session are approved, and there is no computer use."),
        )),
        "" => Err(AgentError::invalid(field("type"), "type is required: agent.session.input.message, agent.session.input.cancel or agent.session.input.tool_result.")),
        other => Err(AgentError::invalid(field("type"), format!("Unknown input event type '{other}'."))),
    }
}

/// A tool's output: a string, a list of `input_text` and `input_image` parts, or null.
fn check_output(output: &Value, at: &str) -> Result<(), AgentError> {
    match output {
        Value::Null | Value::String(_) => Ok(()),
        Value::Array(parts) => {
            for (i, part) in parts.iter().enumerate() {
                let ok = match part.get("type").and_then(Value::as_str) {
                    Some("input_text") => part.get("text").is_some_and(Value::is_string),
                    Some("input_image") => part
                        .get("image_url")
                        .and_then(Value::as_str)
                        .is_some_and(|u| u.starts_with("data:image/")),
                    _ => false,
                };
                if !ok {
                    return Err(AgentError::invalid(format!("{at}[{i}]"), "A tool's output parts are input_text parts or input_image parts with a data:image/... URL."));
                }
            }
            Ok(())
        }
        _ => Err(AgentError::invalid(
            at,
            "output must be a string or a list of content parts.",
        )),
    }
}

/// `input` of a session create (a string is one user message) or of a message event.
pub fn parse_messages(input: &Value, at: &str) -> Result<Vec<Vec<Part>>, AgentError> {
    let mut bytes = 0usize;
    let messages = match input {
        Value::String(text) => {
            bytes += text.len();
            vec![vec![Part::Text(text.clone())]]
        }
        Value::Array(list) if !list.is_empty() && list.len() <= MAX_MESSAGES => {
            let mut messages = Vec::with_capacity(list.len());
            for (i, message) in list.iter().enumerate() {
                let here = format!("{at}[{i}]");
                if message.get("role").and_then(Value::as_str) != Some("user") {
                    return Err(AgentError::invalid(
                        format!("{here}.role"),
                        "role must be user.",
                    ));
                }
                if !matches!(message.get("type"), None | Some(Value::Null))
                    && message.get("type").and_then(Value::as_str) != Some("message")
                {
                    return Err(AgentError::invalid(
                        format!("{here}.type"),
                        "type must be message.",
                    ));
                }
                let parts = message
                    .get("content")
                    .and_then(Value::as_array)
                    .filter(|p| !p.is_empty() && p.len() <= MAX_PARTS)
                    .ok_or_else(|| {
                        AgentError::invalid(
                            format!("{here}.content"),
                            format!("content must be a list of 1 to {MAX_PARTS} input_text or input_image parts."),
                        )
                    })?;
                let mut content = Vec::with_capacity(parts.len());
                for (j, part) in parts.iter().enumerate() {
                    let there = format!("{here}.content[{j}]");
                    match part.get("type").and_then(Value::as_str) {
                        Some("input_text") => {
                            let text =
                                part.get("text").and_then(Value::as_str).ok_or_else(|| {
                                    AgentError::invalid(
                                        format!("{there}.text"),
                                        "text is required: a string.",
                                    )
                                })?;
                            bytes += text.len();
                            content.push(Part::Text(text.to_string()));
                        }
                        Some("input_image") => {
                            let url =
                                part.get("image_url")
                                    .and_then(Value::as_str)
                                    .ok_or_else(|| {
                                        AgentError::invalid(
                                            format!("{there}.image_url"),
                                            "image_url is required: a data: URL.",
                                        )
                                    })?;
                            if !url.starts_with("data:image/") {
                                return Err(AgentError::invalid(format!("{there}.image_url"), "image_url must be a data:image/... URL: codex takes no remote image URLs."));
                            }
                            bytes += url.len();
                            content.push(Part::Image(url.to_string()));
                        }
                        _ => {
                            return Err(AgentError::invalid(
                                format!("{there}.type"),
                                "type must be input_text or input_image.",
                            ))
                        }
                    }
                }
                messages.push(content);
            }
            messages
        }
        _ => {
            return Err(AgentError::invalid(
                at,
                format!("{at} must be a string or a list of 1 to {MAX_MESSAGES} user messages."),
            ))
        }
    };
    if bytes > MAX_INPUT_BYTES {
        return Err(AgentError::invalid(
            at,
            format!(
                "One input holds at most {} MiB of text and images.",
                MAX_INPUT_BYTES >> 20
            ),
        ));
    }
    Ok(messages)
}

/// codex's `UserInput[]` for the messages of one input.
pub fn codex_input(messages: &[Vec<Part>]) -> Vec<Value> {
    let mut input = Vec::new();
    for parts in messages {
        for part in parts {
            input.push(match part {
                Part::Text(text) => json!({"type": "text", "text": text}),
                Part::Image(url) => json!({"type": "image", "url": url}),
            });
        }
    }
    input
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_checked_whole_with_the_field_named() {
        let ok = parse_events(&json!([
            {"type": "agent.session.input.message", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]},
            {"type": "agent.session.input.tool_result", "turn_id": "t", "call_id": "c", "success": true, "output": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "agent.session.input.cancel"},
        ]))
        .unwrap();
        assert_eq!(ok[0], Input::Message(vec![vec![Part::Text("hi".into())]]));
        assert!(
            matches!(&ok[1], Input::ToolResult { result, .. } if result.success && result.output == Some(json!([{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}])))
        );
        assert_eq!(ok[2], Input::Cancel);
        let param = |v: Value| match parse_events(&v) {
            Err(AgentError::Invalid { param, .. }) => param,
            other => panic!("{other:?}"),
        };
        assert_eq!(param(json!([])), "events");
        assert_eq!(
            param(json!([{"type": "agent.session.input.cancel"}, {"type": "nope"}])),
            "events[1].type"
        );
        assert_eq!(
            param(
                json!([{"type": "agent.session.input.message", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]}])
            ),
            "events[0].input[0].content[0].image_url"
        );
        assert_eq!(
            param(
                json!([{"type": "agent.session.input.tool_result", "turn_id": "t", "success": true}])
            ),
            "events[0].call_id"
        );
        assert_eq!(parse_messages(&json!("x"), "input").unwrap().len(), 1);
        assert_eq!(
            json!(codex_input(&[vec![
                Part::Text("a".into()),
                Part::Image("data:image/png;base64,AA".into())
            ]])),
            json!([{"type": "text", "text": "a"}, {"type": "image", "url": "data:image/png;base64,AA"}])
        );
    }
}
