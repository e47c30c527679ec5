//! What one Claude Code turn prints (`-p --output-format stream-json --verbose
//! --include-partial-messages`), as [`AgentEvent`]s. A pure reader: lines in, events
//! out, tested on lines the CLI 2.1.328 printed against the test stub
//! (`tests/fixtures/claude/`).
//!
//! | line | events |
//! |---|---|
//! | `system`/`init` | [`AgentEvent::Session`] (its `session_id`) |
//! | `stream_event` with a `text_delta` | [`AgentEvent::Delta`] |
//! | `assistant`, a `text` block | [`Item::Message`] (the whole text of that block) |
//! | `assistant`, a `thinking` block | [`Item::Reasoning`] |
//! | `assistant`, a `tool_use` block | kept until its result |
//! | `user` with a `tool_result` | `Bash`: [`Item::Shell`] with its output and exit code; another tool: [`Item::ToolCall`] |
//! | `result` | [`AgentEvent::Completed`] with the turn's usage, [`AgentEvent::ProviderError`] for the API's refusal, [`AgentEvent::Failed`] otherwise |
//!
//! Lines of sub-agents (a non-null `parent_tool_use_id`) are the `Task` tool's inner
//! work: its call and result are shown, not its steps. An `assistant` line whose model
//! is `<synthetic>` is the CLI's own wording of an API error, which the `result` says
//! again: it is no answer of the model's. Anthropic counts cached input apart from
//! `input_tokens`; OpenAI's `input_tokens` includes it, so the two are added.

use std::collections::HashMap;

use serde_json::Value;

use crate::agents::events::{AgentEvent, Item, Usage};

/// The reader's state: tool calls waiting for their results.
#[derive(Default)]
pub struct ClaudeLines {
    calls: HashMap<String, Call>,
}

struct Call {
    name: String,
    input: Value,
}

pub(super) fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// A message's or a tool result's content: a string, or its text blocks joined.
pub(super) fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| text(b, "type") == "text")
            .map(|b| text(b, "text"))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Bash's result as output and exit code: a failed command's content starts with
/// `Exit code N`; a refused or interrupted one has no exit code.
pub fn shell_outcome(result: &Value) -> (String, Option<i64>) {
    let output = content_text(&result["content"]);
    if result["is_error"] != Value::Bool(true) {
        return (output, Some(0));
    }
    if let Some(rest) = output.strip_prefix("Exit code ") {
        let (code, after) = rest.split_once('\n').unwrap_or((rest, ""));
        if let Ok(code) = code.trim().parse::<i64>() {
            return (after.to_string(), Some(code));
        }
    }
    (output, None)
}

/// The usage of a `result` (or of a model call), OpenAI's way.
pub fn usage_of(usage: &Value) -> Usage {
    let n = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
    let cached = n("cache_read_input_tokens");
    Usage {
        input_tokens: n("input_tokens") + cached + n("cache_creation_input_tokens"),
        cached_tokens: cached,
        output_tokens: n("output_tokens"),
        reasoning_tokens: 0,
    }
}

/// How a `result` line ends the turn.
pub fn result_event(line: &Value) -> AgentEvent {
    let failed = line["is_error"] == Value::Bool(true)
        || line.get("subtype").and_then(Value::as_str) != Some("success");
    if !failed {
        return AgentEvent::Completed(usage_of(&line["usage"]));
    }
    let said = line
        .get("result")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            line["errors"].as_array().map(|errors| {
                errors
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("; ")
            })
        })
        .filter(|m| !m.is_empty());
    match line["api_error_status"].as_u64() {
        Some(status) => AgentEvent::ProviderError {
            status: status.min(u16::MAX as u64) as u16,
            message: said.unwrap_or_else(|| format!("the model API answered {status}")),
        },
        None => AgentEvent::Failed(said.unwrap_or_else(|| {
            format!(
                "claude ended the turn with {} ({})",
                text(line, "subtype"),
                text(line, "terminal_reason")
            )
        })),
    }
}

impl ClaudeLines {
    pub fn line(&mut self, line: &str) -> Vec<AgentEvent> {
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            return Vec::new();
        };
        let nested = !value["parent_tool_use_id"].is_null();
        match text(&value, "type") {
            "system" if text(&value, "subtype") == "init" => value
                .get("session_id")
                .and_then(Value::as_str)
                .map(|id| vec![AgentEvent::Session(id.to_string())])
                .unwrap_or_default(),
            "stream_event" if !nested => {
                let event = &value["event"];
                let delta = &event["delta"];
                if text(event, "type") == "content_block_delta"
                    && text(delta, "type") == "text_delta"
                {
                    let piece = text(delta, "text");
                    if !piece.is_empty() {
                        return vec![AgentEvent::Delta(piece.to_string())];
                    }
                }
                Vec::new()
            }
            "assistant" if !nested => {
                if text(&value["message"], "model") == "<synthetic>" {
                    return Vec::new();
                }
                let mut events = Vec::new();
                let blocks = value["message"]["content"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for block in blocks {
                    match text(&block, "type") {
                        "text" if !text(&block, "text").is_empty() => {
                            events.push(AgentEvent::Item(Item::Message {
                                text: text(&block, "text").to_string(),
                            }))
                        }
                        "thinking" if !text(&block, "thinking").is_empty() => {
                            events.push(AgentEvent::Item(Item::Reasoning {
                                text: text(&block, "thinking").to_string(),
                            }))
                        }
                        "tool_use" => {
                            self.calls.insert(
                                text(&block, "id").to_string(),
                                Call {
                                    name: text(&block, "name").to_string(),
                                    input: block["input"].clone(),
                                },
                            );
                        }
                        _ => {}
                    }
                }
                events
            }
            "user" if !nested => {
                let blocks = value["message"]["content"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                blocks
                    .iter()
                    .filter(|b| text(b, "type") == "tool_result")
                    .filter_map(|result| {
                        let call = self.calls.remove(text(result, "tool_use_id"))?;
                        Some(AgentEvent::Item(if call.name == "Bash" {
                            let (output, exit_code) = shell_outcome(result);
                            Item::Shell {
                                command: text(&call.input, "command").to_string(),
                                output,
                                exit_code,
                            }
                        } else {
                            Item::ToolCall {
                                name: call.name,
                                arguments: call.input.to_string(),
                            }
                        }))
                    })
                    .collect()
            }
            "result" => vec![result_event(&value)],
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(fixture: &str) -> Vec<AgentEvent> {
        let path = crate::testing::repo_root().join(format!("tests/fixtures/claude/{fixture}"));
        let mut reader = ClaudeLines::default();
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .flat_map(|l| reader.line(l))
            .collect()
    }

    #[test]
    fn a_text_turn_streams_deltas_then_the_message_then_usage() {
        let events = read("text.jsonl");
        assert!(matches!(&events[0], AgentEvent::Session(id) if id.len() == 36));
        let deltas: String = events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::Delta(d) => Some(d.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(deltas, "hello there ");
        let message = events.iter().position(
            |e| matches!(e, AgentEvent::Item(Item::Message { text }) if text == "hello there "),
        );
        let last_delta = events
            .iter()
            .rposition(|e| matches!(e, AgentEvent::Delta(_)));
        assert!(message > last_delta, "{events:?}");
        // 10 input, 2 read from the cache (counted in OpenAI's input), 3 output.
        assert_eq!(
            events.last(),
            Some(&AgentEvent::Completed(Usage {
                input_tokens: 12,
                cached_tokens: 2,
                output_tokens: 3,
                reasoning_tokens: 0
            }))
        );
    }

    #[test]
    fn bash_calls_become_shell_items_with_output_and_exit_code() {
        let ok = read("shell.jsonl");
        assert!(ok.contains(&AgentEvent::Item(Item::Shell {
            command: "echo fine".into(),
            output: "fine".into(),
            exit_code: Some(0)
        })));
        let failed = read("shell_failed.jsonl");
        let shell = failed
            .iter()
            .find_map(|e| match e {
                AgentEvent::Item(Item::Shell {
                    output, exit_code, ..
                }) => Some((output, exit_code)),
                _ => None,
            })
            .unwrap();
        assert_eq!(*shell.1, Some(3));
        assert!(shell.0.starts_with("hi\n"), "{shell:?}");
        assert!(matches!(failed.last(), Some(AgentEvent::Completed(_))));
    }

    #[test]
    fn the_apis_refusals_keep_their_status_and_no_synthetic_message() {
        for (fixture, status) in [
            ("fail400.jsonl", 400),
            ("fail429.jsonl", 429),
            ("fail500.jsonl", 500),
        ] {
            let events = read(fixture);
            assert!(
                !events.iter().any(|e| matches!(e, AgentEvent::Item(_))),
                "{fixture}: {events:?}"
            );
            match events.last() {
                Some(AgentEvent::ProviderError { status: s, message }) => {
                    assert_eq!(*s, status, "{fixture}");
                    assert!(message.contains("the stub is down"), "{message}");
                }
                other => panic!("{fixture}: {other:?}"),
            }
        }
    }

    #[test]
    fn other_tools_are_tool_calls_and_nested_lines_are_skipped() {
        let mut reader = ClaudeLines::default();
        let call = r#"{"type":"assistant","parent_tool_use_id":null,"message":{"model":"m","content":[{"type":"tool_use","id":"t1","name":"Write","input":{"file_path":"/w/a.txt","content":"x"}}]}}"#;
        let result = r#"{"type":"user","parent_tool_use_id":null,"message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":"File created"}]}}"#;
        let nested = r#"{"type":"assistant","parent_tool_use_id":"t0","message":{"model":"m","content":[{"type":"text","text":"inner"}]}}"#;
        assert!(reader.line(call).is_empty());
        assert!(reader.line(nested).is_empty());
        assert_eq!(
            reader.line(result),
            vec![AgentEvent::Item(Item::ToolCall {
                name: "Write".into(),
                arguments: r#"{"file_path":"/w/a.txt","content":"x"}"#.into()
            })]
        );
        let interrupted = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"result":null,"terminal_reason":"aborted_streaming"}"#;
        assert!(
            matches!(&reader.line(interrupted)[..], [AgentEvent::Failed(m)] if m.contains("aborted_streaming"))
        );
    }
}
