//! The scripted stub of the upstream model API that the agent CLIs talk to in these
//! tests, served by the test process on 127.0.0.1, so no test reaches a model provider.
//! It speaks the Responses API (`POST …/responses`, what codex asks), Chat
//! Completions (`POST …/chat/completions`, what qwen-code asks) and Anthropic's
//! Messages API (`POST /v1/messages`, what Claude Code asks), all streamed.
//!
//! The stub reads the last line of the user's text that starts with a keyword (the CLIs
//! wrap context around the prompt) and follows it:
//!
//! | script | the model … |
//! |---|---|
//! | `SAY <text>` | answers `<text>` (streamed as deltas on the Responses API) |
//! | `REUSE <text>` | answers `<text>` as `SAY` does, under the message id every `REUSE` answer has (a provider that reuses ids) |
//! | `SHELL <command>` | asks the agent to run `<command>` (codex's `exec_command`, qwen's `run_shell_command`, Claude Code's `Bash`), then answers `done` |
//! | `MCP <tool> <json-args>` | calls the MCP tool `<tool>` (in codex's `mcp__<server>` namespace), then answers `done` |
//! | `CALL <tool> <json-args>` | calls the function tool `<tool>` the request offers (a codex dynamic tool: a top-level `function`, or one inside a `namespace`), then, once the tool's output is in the input, answers `tool said: <output>` |
//! | `REASON <text>` | streams a reasoning item whose summary is `<text>`, then answers `reasoned` |
//! | `SLOW` / `SLOW <text>` | starts an answer (streams `<text>`, on the Responses API) and never finishes it (for cancels) |
//! | `FAIL` / `FAIL400` / `FAIL429` | is an upstream 500 / 400 / 429 |
//! | `WRITE <path> <text>` | asks Claude Code's `Write` tool to write `<text>` to the absolute `<path>`, then answers `written` (Messages API only) |
//!
//! A chat request whose system message is qwen-code's summariser (its `/compress`) is
//! answered with a short summary, whatever the history's scripts say.
//!
//! "Then" means: a tool's output (`function_call_output`, a chat `tool` message) is in
//! the input after the user message that holds the script, so a tool called in an
//! earlier turn of the same conversation does not count.

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{serve_stub, Stub};

/// The stub, with the bodies of the requests it received.
pub(crate) type Upstream = Stub<Value>;

/// The words a script starts with.
const KEYWORDS: [&str; 9] = [
    "SAY ", "REUSE ", "SHELL ", "MCP ", "CALL ", "REASON ", "SLOW", "FAIL", "WRITE ",
];

/// The message id of every `REUSE` answer: a provider that reuses ids.
pub(crate) const REUSED_ID: &str = "msg_reused";

/// What a request asks the stub for.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Script {
    /// The script line (`SAY hi`), empty when none was found.
    pub line: String,
    /// A tool's output follows the user message that holds the script.
    pub tool_done: bool,
    /// That output's text (the last one), when it has text.
    pub tool_output: Option<String>,
}

/// The text of a message's or a tool output's content: a string, or the texts of its
/// parts joined by newlines.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The script of a Responses API or Chat Completions request.
pub(crate) fn script_of(request: &Value) -> Script {
    let mut script = Script::default();
    let items = request["input"]
        .as_array()
        .or(request["messages"].as_array())
        .cloned()
        .unwrap_or_default();
    for item in items {
        if matches!(item["type"].as_str(), Some("function_call_output")) {
            script.tool_done = true;
            script.tool_output = Some(text_of(&item["output"]));
        } else if item["role"] == "tool" {
            script.tool_done = true;
            script.tool_output = Some(text_of(&item["content"]));
        }
        let anthropic_result = item["content"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|block| block["type"] == "tool_result");
        if let Some(result) = anthropic_result {
            script.tool_done = true;
            script.tool_output = Some(text_of(&result["content"]));
        }
        if item["role"] == "user" {
            let text = text_of(&item["content"]);
            if let Some(line) = text
                .lines()
                .rev()
                .find(|l| KEYWORDS.iter().any(|k| l.trim_start().starts_with(k)))
            {
                script = Script {
                    line: line.trim().to_string(),
                    ..Script::default()
                };
            }
        }
    }
    script
}

/// A fresh id for an output item (`msg_up7`): the Responses API never repeats one, and
/// codex keeps the model's ids for its items (a tool call's id is its `call_id`).
fn fresh_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{prefix}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn sse(stream: &mut TcpStream, event: &str, data: Value) -> std::io::Result<()> {
    write!(stream, "event: {event}\ndata: {data}\n\n")?;
    stream.flush()
}

/// A whole streamed chat completion: one delta, the finish with usage, `[DONE]`.
/// One chat answer; `prompt_tokens` grows with the request (about 4 bytes a token), as a
/// real model's count does, so qwen-code's `/compress` sees a long history as long.
fn chat_reply(
    stream: &mut TcpStream,
    delta: Value,
    finish: &str,
    prompt_tokens: u64,
) -> std::io::Result<()> {
    chat_chunk(stream, delta, None, None)?;
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": 4, "total_tokens": prompt_tokens + 4});
    chat_chunk(stream, json!({}), Some(finish), Some(usage))?;
    write!(stream, "data: [DONE]\n\n")
}

fn chat_chunk(
    stream: &mut TcpStream,
    delta: Value,
    finish: Option<&str>,
    usage: Option<Value>,
) -> std::io::Result<()> {
    let mut chunk = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "stub-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    if let Some(usage) = usage {
        chunk["usage"] = usage;
    }
    write!(stream, "data: {chunk}\n\n")?;
    stream.flush()
}

/// The namespace the request offers `tool` in (codex offers MCP tools and namespaced
/// dynamic tools that way), if any.
fn namespace_of(request: &Value, tool: &str) -> Option<String> {
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| {
            t["type"] == "namespace"
                && t["tools"]
                    .as_array()
                    .is_some_and(|tools| tools.iter().any(|f| f["name"] == tool))
        })
        .and_then(|t| t["name"].as_str())
        .map(str::to_string)
}

/// A function call, as one finished output item.
fn function_call(
    stream: &mut TcpStream,
    name: &str,
    namespace: Option<String>,
    arguments: &str,
) -> std::io::Result<()> {
    let mut call = json!({"type": "function_call", "id": fresh_id("fc_up"), "call_id": fresh_id("call_up"),
        "name": name, "arguments": arguments});
    if let Some(namespace) = namespace {
        call["namespace"] = json!(namespace);
    }
    sse(
        stream,
        "response.output_item.done",
        json!({"type": "response.output_item.done", "output_index": 0, "item": call}),
    )
}

/// An assistant message as the Responses API streams one: the item and its part
/// announced, the text in word-sized deltas, then the finished item.
fn message(
    stream: &mut TcpStream,
    output_index: u32,
    text: &str,
    reuse: bool,
) -> std::io::Result<()> {
    let id = match reuse {
        true => REUSED_ID.to_string(),
        false => fresh_id("msg_up"),
    };
    message_start(stream, output_index, &id, text)?;
    let item = json!({"type": "message", "role": "assistant", "id": id, "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}]});
    sse(
        stream,
        "response.output_item.done",
        json!({"type": "response.output_item.done", "output_index": output_index, "item": item}),
    )
}

/// The message announced and its text streamed, not yet finished.
fn message_start(
    stream: &mut TcpStream,
    output_index: u32,
    id: &str,
    text: &str,
) -> std::io::Result<()> {
    let added = json!({"type": "message", "role": "assistant", "id": id, "status": "in_progress", "content": []});
    sse(
        stream,
        "response.output_item.added",
        json!({"type": "response.output_item.added", "output_index": output_index, "item": added}),
    )?;
    sse(
        stream,
        "response.content_part.added",
        json!({"type": "response.content_part.added", "item_id": id, "output_index": output_index,
               "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
    )?;
    for piece in text.split_inclusive(' ') {
        sse(
            stream,
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "item_id": id, "output_index": output_index,
                   "content_index": 0, "delta": piece}),
        )?;
    }
    Ok(())
}

/// A reasoning item with one summary part, streamed.
fn reasoning(stream: &mut TcpStream, summary: &str) -> std::io::Result<()> {
    let id = fresh_id("rs_up");
    sse(
        stream,
        "response.output_item.added",
        json!({"type": "response.output_item.added", "output_index": 0,
               "item": {"type": "reasoning", "id": id, "summary": []}}),
    )?;
    sse(
        stream,
        "response.reasoning_summary_part.added",
        json!({"type": "response.reasoning_summary_part.added", "item_id": id, "output_index": 0,
               "summary_index": 0, "part": {"type": "summary_text", "text": ""}}),
    )?;
    for piece in summary.split_inclusive(' ') {
        sse(
            stream,
            "response.reasoning_summary_text.delta",
            json!({"type": "response.reasoning_summary_text.delta", "item_id": id, "output_index": 0,
                   "summary_index": 0, "delta": piece}),
        )?;
    }
    sse(
        stream,
        "response.reasoning_summary_text.done",
        json!({"type": "response.reasoning_summary_text.done", "item_id": id, "output_index": 0,
               "summary_index": 0, "text": summary}),
    )?;
    sse(
        stream,
        "response.reasoning_summary_part.done",
        json!({"type": "response.reasoning_summary_part.done", "item_id": id, "output_index": 0,
               "summary_index": 0, "part": {"type": "summary_text", "text": summary}}),
    )?;
    sse(
        stream,
        "response.output_item.done",
        json!({"type": "response.output_item.done", "output_index": 0,
               "item": {"type": "reasoning", "id": id,
                        "summary": [{"type": "summary_text", "text": summary}]}}),
    )
}

/// Answers one request by its script.
pub(crate) fn respond(mut stream: TcpStream, path: &str, request: &Value) -> std::io::Result<()> {
    let Script {
        line: script,
        tool_done,
        tool_output,
    } = script_of(request);
    if let Some(kind) = script.strip_prefix("FAIL") {
        // FAIL is a 500; FAIL400 a refusal no client retries (qwen retries 5xx itself for
        // about 105 s, 28 attempts, before it gives up).
        let status = match kind {
            "400" => "400 Bad Request",
            "429" => "429 Too Many Requests",
            _ => "500 Internal Server Error",
        };
        let body = if path.starts_with("/v1/messages") {
            r#"{"type":"error","error":{"type":"api_error","message":"the stub is down"}}"#
        } else {
            r#"{"error":{"message":"the stub is down","type":"server_error"}}"#
        };
        return write!(stream, "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    }
    if path.starts_with("/v1/messages") && request["stream"] != json!(true) {
        // Claude Code asks without streaming only to check a model it is switched to.
        let body = json!({"id": fresh_id("msg_up"), "type": "message", "role": "assistant",
            "model": request["model"], "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 1, "output_tokens": 1}})
        .to_string();
        return write!(stream, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    }
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    )?;
    let text = if is_summary_request(request) {
        "<state_snapshot><primary_request_and_intent>said things</primary_request_and_intent></state_snapshot>".to_string()
    } else if let Some(t) = script
        .strip_prefix("SAY ")
        .or(script.strip_prefix("REUSE "))
    {
        t.to_string()
    } else if (script.starts_with("SHELL ") || script.starts_with("MCP ")) && tool_done {
        "done".to_string()
    } else if script.starts_with("CALL ") && tool_done {
        format!("tool said: {}", tool_output.unwrap_or_default())
    } else if script.starts_with("REASON ") {
        "reasoned".to_string()
    } else {
        String::new()
    };
    if path.starts_with("/v1/messages") {
        return anthropic(&mut stream, &script, tool_done, &text);
    }
    if path.ends_with("/chat/completions") {
        let prompt_tokens = (request.to_string().len() as u64 / 4).max(7);
        if script.starts_with("SLOW") {
            chat_chunk(
                &mut stream,
                json!({"role": "assistant", "content": "thinking"}),
                None,
                None,
            )?;
            std::thread::sleep(Duration::from_secs(60));
            return Ok(());
        }
        if let (Some(command), false) = (script.strip_prefix("SHELL "), tool_done) {
            let call = json!({"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "run_shell_command", "arguments": json!({"command": command}).to_string()}});
            return chat_reply(
                &mut stream,
                json!({"role": "assistant", "tool_calls": [call]}),
                "tool_calls",
                prompt_tokens,
            );
        }
        return chat_reply(
            &mut stream,
            json!({"role": "assistant", "content": text}),
            "stop",
            prompt_tokens,
        );
    }
    sse(
        &mut stream,
        "response.created",
        json!({"type": "response.created", "response": {"id": "resp_up"}}),
    )?;
    if let Some(rest) = script.strip_prefix("SLOW") {
        if let Some(text) = rest.strip_prefix(' ') {
            message_start(&mut stream, 0, &fresh_id("msg_up"), text)?;
        }
        std::thread::sleep(Duration::from_secs(60));
        return Ok(());
    }
    let tool_call = ["MCP ", "CALL "]
        .iter()
        .find_map(|verb| script.strip_prefix(verb))
        .filter(|_| !tool_done)
        .and_then(|rest| rest.split_once(' '));
    if let Some((tool, arguments)) = tool_call {
        function_call(&mut stream, tool, namespace_of(request, tool), arguments)?;
    } else if let (Some(command), false) = (script.strip_prefix("SHELL "), tool_done) {
        let arguments = json!({"cmd": command}).to_string();
        function_call(&mut stream, "exec_command", None, &arguments)?;
    } else if let Some(summary) = script.strip_prefix("REASON ") {
        reasoning(&mut stream, summary)?;
        message(&mut stream, 1, &text, false)?;
    } else {
        message(&mut stream, 0, &text, script.starts_with("REUSE "))?;
    }
    sse(
        &mut stream,
        "response.completed",
        json!({"type": "response.completed", "response": {"id": "resp_up",
        "usage": {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13,
                  "input_tokens_details": {"cached_tokens": 2}, "output_tokens_details": {"reasoning_tokens": 0}}}}),
    )
}

/// One answer of the Messages API, streamed as Anthropic specifies: `message_start`,
/// one content block (a `tool_use` of `Bash`, or text in word-sized `text_delta`s),
/// `message_delta` with the stop reason and output tokens, `message_stop`.
fn anthropic(
    stream: &mut TcpStream,
    script: &str,
    tool_done: bool,
    text: &str,
) -> std::io::Result<()> {
    let event = |stream: &mut TcpStream, name: &str, mut data: Value| {
        data["type"] = json!(name);
        sse(stream, name, data)
    };
    let usage = json!({"input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 2,
                       "cache_creation_input_tokens": 0});
    event(
        stream,
        "message_start",
        json!({"message": {"id": fresh_id("msg_up"), "type": "message",
        "role": "assistant", "model": "stub-model", "content": [], "stop_reason": null,
        "stop_sequence": null, "usage": usage}}),
    )?;
    let tool = match (
        script.strip_prefix("SHELL "),
        script.strip_prefix("WRITE "),
        tool_done,
    ) {
        (Some(command), _, false) => Some((
            "Bash",
            json!({"command": command, "description": "the script's command"}),
        )),
        (_, Some(rest), false) => {
            let (path, content) = rest.split_once(' ').unwrap_or((rest, ""));
            Some(("Write", json!({"file_path": path, "content": content})))
        }
        _ => None,
    };
    if let Some((name, input)) = tool {
        event(
            stream,
            "content_block_start",
            json!({"index": 0, "content_block": {"type": "tool_use",
            "id": fresh_id("toolu_up"), "name": name, "input": {}}}),
        )?;
        let input = input.to_string();
        event(
            stream,
            "content_block_delta",
            json!({"index": 0,
            "delta": {"type": "input_json_delta", "partial_json": input}}),
        )?;
        event(stream, "content_block_stop", json!({"index": 0}))?;
        event(
            stream,
            "message_delta",
            json!({"delta": {"stop_reason": "tool_use", "stop_sequence": null},
            "usage": {"output_tokens": 5}}),
        )?;
        return event(stream, "message_stop", json!({}));
    }
    let slow = script.strip_prefix("SLOW");
    let text = match slow {
        Some(rest) => rest.trim_start(),
        None if script.starts_with("WRITE ") => "written",
        None => text,
    };
    event(
        stream,
        "content_block_start",
        json!({"index": 0, "content_block": {"type": "text", "text": ""}}),
    )?;
    for piece in text.split_inclusive(' ') {
        event(
            stream,
            "content_block_delta",
            json!({"index": 0,
            "delta": {"type": "text_delta", "text": piece}}),
        )?;
    }
    if slow.is_some() {
        std::thread::sleep(Duration::from_secs(60));
        return Ok(());
    }
    event(stream, "content_block_stop", json!({"index": 0}))?;
    event(
        stream,
        "message_delta",
        json!({"delta": {"stop_reason": "end_turn", "stop_sequence": null},
        "usage": {"output_tokens": 3}}),
    )?;
    event(stream, "message_stop", json!({}))
}

/// qwen-code's `/compress` asks its model for a summary with this system prompt.
fn is_summary_request(request: &Value) -> bool {
    request["messages"].as_array().is_some_and(|messages| {
        messages.iter().any(|m| {
            m["role"] == "system" && text_of(&m["content"]).contains("summarizes a conversation")
        })
    })
}

/// The scripted upstream: each request's JSON body is kept, and answered by its script.
pub(crate) fn serve_upstream() -> Upstream {
    serve_stub(
        None,
        |received| {
            let mut request: Value = serde_json::from_slice(&received.body).unwrap_or(Value::Null);
            // The Messages API's key, kept beside the body (what the model relay added).
            if let Some((_, key)) = received.headers.iter().find(|(n, _)| n == "x-api-key") {
                request["_x_api_key"] = json!(key);
            }
            request
        },
        |stream, received, request| {
            let _ = respond(stream, &received.target, &request);
        },
    )
}

/// A codex `config.toml` whose only provider is `upstream` (its key is read from
/// `STUB_API_KEY`), with retries off so a failure is one request.
pub(crate) fn codex_config(upstream: &Upstream) -> String {
    format!(
        "model = \"stub-model\"\nmodel_provider = \"stub\"\n[model_providers.stub]\nname = \"stub\"\nbase_url = \"http://{}/v1\"\nwire_api = \"responses\"\nenv_key = \"STUB_API_KEY\"\nrequest_max_retries = 0\nstream_max_retries = 0\n",
        upstream.addr
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_is_the_last_keyword_line_and_a_tool_counts_after_it() {
        let request = json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": "CALL lookup {}"}]},
            {"type": "function_call", "call_id": "c0"},
            {"type": "function_call_output", "call_id": "c0", "output": "old"},
            {"role": "user", "content": [{"type": "input_text", "text": "<ctx/>\nSAY hi\nCALL lookup {\"q\":1}"}]},
        ]});
        assert_eq!(
            script_of(&request),
            Script {
                line: "CALL lookup {\"q\":1}".into(),
                tool_done: false,
                tool_output: None
            }
        );
        let mut answered = request.clone();
        answered["input"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "function_call_output", "call_id": "c1",
                   "output": [{"type": "input_text", "text": "sunny"}]}));
        let script = script_of(&answered);
        assert!(script.tool_done);
        assert_eq!(script.tool_output.as_deref(), Some("sunny"));
        let chat = json!({"messages": [{"role": "user", "content": "SHELL ls"}, {"role": "tool", "content": "a"}]});
        assert!(script_of(&chat).tool_done);
    }
}
