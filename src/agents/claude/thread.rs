//! One long-lived Claude Code CLI (`--input-format stream-json`) as the session actor
//! sees a `codex app-server` thread: the requests the actor's core makes
//! (`thread/start`, `thread/resume`, `turn/start`, `turn/steer`, `turn/interrupt`)
//! become lines on the CLI's stdin, and the lines it prints become codex's
//! notifications (`turn/started`, `item/started`, `item/completed`,
//! `item/agentMessage/delta`, `thread/tokenUsage/updated`, `turn/completed`), so the
//! session core and `codex_map::EventMapper` serve claude-code sessions unchanged: the
//! same events, items and turns as codex's. A pure core (lines and requests in, lines
//! and notifications out, the clock passed in), tested on a session the CLI 2.1.328
//! printed (`tests/fixtures/claude/session.jsonl`, our input lines marked `<<< `).
//!
//! What the CLI does that this rests on (seen):
//!
//! - Each turn prints `system/init` … `result`. With `--replay-user-messages` every
//!   input is echoed as a `user` line when the CLI takes it up, so the core knows which
//!   inputs a turn consumed.
//! - An input written while a turn runs is queued. When a tool call is under way it is
//!   folded into that turn (echoed after the tool's result, one `result` for both);
//!   otherwise it runs as a turn of its own once the current one ends. Either way it
//!   is the Agents API's steer: the Agents API turn ends at the first `result` after
//!   which no input of it waits to be echoed.
//! - An interrupt (`control_request` `interrupt`) ends the running turn at once with a
//!   `result` `error_during_execution`, and kills the running Bash command. Inputs it
//!   left queued still run afterwards: those turns, which nobody waits for, are
//!   interrupted as they start.
//! - Bash calls are `commandExecution` items (a failed command's `Exit code N` line is
//!   its exit code); every other tool (`Write`, `Edit`, `Read`, `Task`, …) is an
//!   `mcpToolCall` of server `claude-code`, whose `arguments` show what a file change
//!   changed, since the SDK has no item for file changes. Usage is counted per
//!   `result` and reported as the thread's running totals, as codex does.

use std::collections::{HashMap, VecDeque};

use serde_json::{json, Value};

use super::lines::{content_text, shell_outcome, text, usage_of};

/// The server every non-Bash tool call is shown as coming from.
pub const TOOL_SERVER: &str = "claude-code";

/// A refused request: a JSON-RPC error code and message.
pub type Refusal = (i64, String);

const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;

/// What a request or a line makes the CLI's side do.
#[derive(Debug, Default, PartialEq)]
pub struct Reaction {
    /// Lines for the CLI's stdin.
    pub write: Vec<Value>,
    /// codex notifications for the actor: method and params.
    pub notify: Vec<(String, Value)>,
}

/// An input written to the CLI and not yet echoed.
struct Sent {
    /// Its text, what the echo is matched by.
    key: String,
    /// Its codex input, what the user message item shows.
    parts: Vec<Value>,
    /// The Agents API turn it belongs to.
    turn: String,
}

/// A tool call waiting for its result.
struct Tool {
    name: String,
    input: Value,
    started_ms: u64,
}

/// The Agents API turn running now.
struct Active {
    id: String,
    started: bool,
    interrupted: bool,
    /// The assistant message streaming now: its item id and text so far.
    message: Option<(String, String)>,
    /// The reasoning streaming now: its item id and text so far.
    reasoning: Option<(String, String)>,
    tools: HashMap<String, Tool>,
    /// Items made up here get `<turn>-<n>` ids.
    next_item: u64,
    /// Why the turn fails whatever the CLI says (a model it refused to switch to).
    failure: Option<String>,
}

/// One CLI session as a codex thread (module docs).
pub struct ClaudeThread {
    thread: String,
    cwd: String,
    /// The model the CLI uses now (`None`: its default).
    model: Option<String>,
    turn: Option<Active>,
    /// Inputs written and not yet echoed, in order.
    sent: VecDeque<Sent>,
    /// The CLI runs an input of a turn that ended (a cancel left it queued): its lines
    /// are nobody's, and it is interrupted.
    running_orphan: bool,
    next_turn: u64,
    next_control: u64,
    totals: [u64; 3],
    /// `set_model` requests awaiting the CLI's answer: their id, the model asked for
    /// and the one before.
    switching: HashMap<String, (Option<String>, Option<String>)>,
}

/// codex's user input as Anthropic content blocks: text, and images as a base64
/// source (a `data:` URL) or a URL source.
fn blocks_of(input: &[Value]) -> Vec<Value> {
    input
        .iter()
        .filter_map(|part| match text(part, "type") {
            "text" => Some(json!({"type": "text", "text": text(part, "text")})),
            "image" => {
                let url = text(part, "url");
                let source = match url
                    .strip_prefix("data:")
                    .and_then(|rest| rest.split_once(";base64,"))
                {
                    Some((media_type, data)) => {
                        json!({"type": "base64", "media_type": media_type, "data": data})
                    }
                    None => json!({"type": "url", "url": url}),
                };
                Some(json!({"type": "image", "source": source}))
            }
            _ => None,
        })
        .collect()
}

/// codex's `codexErrorInfo` for the model API's status.
fn error_info(status: Option<u64>) -> Value {
    match status {
        Some(400 | 413 | 422) => json!("badRequest"),
        Some(401 | 403) => json!("unauthorized"),
        Some(404) => json!("modelNotFound"),
        Some(429) => json!("rateLimitExceeded"),
        Some(529) => json!("serverOverloaded"),
        Some(500..=599) => json!("internalServerError"),
        _ => Value::Null,
    }
}

impl ClaudeThread {
    /// The thread of CLI session `thread` (a UUID), run in `cwd` with `model`.
    pub fn new(thread: &str, cwd: &str, model: Option<&str>) -> ClaudeThread {
        ClaudeThread {
            thread: thread.to_string(),
            cwd: cwd.to_string(),
            model: model.map(str::to_string),
            turn: None,
            sent: VecDeque::new(),
            running_orphan: false,
            next_turn: 0,
            next_control: 0,
            totals: [0; 3],
            switching: HashMap::new(),
        }
    }

    fn control(&mut self, request: Value) -> Value {
        self.next_control += 1;
        json!({"type": "control_request", "request_id": format!("abx-{}", self.next_control),
               "request": request})
    }

    fn note(&self, method: &str, mut params: Value) -> (String, Value) {
        params["threadId"] = json!(self.thread);
        if let Some(turn) = &self.turn {
            params["turnId"] = json!(turn.id);
        }
        (method.to_string(), params)
    }

    /// What the CLI is asked and what the request answers.
    pub fn request(&mut self, method: &str, params: &Value) -> (Reaction, Result<Value, Refusal>) {
        let mut reaction = Reaction::default();
        let answer = match method {
            "thread/start" | "thread/resume" => Ok(json!({"thread": {"id": self.thread}})),
            "turn/start" => {
                if self.turn.is_some() {
                    return (reaction, Err((INVALID_REQUEST, "a turn is running".into())));
                }
                if let Some(model) = params.get("model").and_then(Value::as_str) {
                    // The session's agent model: `claude-code` or `claude-code/<model>`.
                    let wanted = model.split_once('/').map(|(_, m)| m.to_string());
                    if wanted != self.model {
                        // The CLI checks the model with a request of its own first; a
                        // refusal fails the turn (see `control_response`).
                        let request = json!({"subtype": "set_model", "model": wanted});
                        let line = self.control(request);
                        let id = text(&line, "request_id").to_string();
                        let before = std::mem::replace(&mut self.model, wanted.clone());
                        self.switching.insert(id, (wanted, before));
                        reaction.write.push(line);
                    }
                }
                self.next_turn += 1;
                let id = format!("claude-turn-{}", self.next_turn);
                self.turn = Some(Active {
                    id: id.clone(),
                    started: false,
                    interrupted: false,
                    message: None,
                    reasoning: None,
                    tools: HashMap::new(),
                    next_item: 0,
                    failure: None,
                });
                reaction.write.push(self.input(&params["input"]));
                Ok(json!({"turn": {"id": id, "status": "inProgress", "items": []}}))
            }
            "turn/steer" => match &self.turn {
                Some(turn) if params["expectedTurnId"].as_str() == Some(&turn.id) => {
                    let id = turn.id.clone();
                    reaction.write.push(self.input(&params["input"]));
                    Ok(json!({"turnId": id}))
                }
                _ => Err((INVALID_REQUEST, "no turn is running to steer".into())),
            },
            "turn/interrupt" => {
                if let Some(turn) = self.turn.as_mut() {
                    turn.interrupted = true;
                    reaction
                        .write
                        .push(self.control(json!({"subtype": "interrupt"})));
                }
                Ok(json!({}))
            }
            other => Err((
                METHOD_NOT_FOUND,
                format!("claude-code does not serve {other}"),
            )),
        };
        (reaction, answer)
    }

    /// A user input line for the running turn, remembered until the CLI echoes it.
    fn input(&mut self, input: &Value) -> Value {
        let parts: Vec<Value> = input.as_array().cloned().unwrap_or_default();
        let blocks = blocks_of(&parts);
        self.sent.push_back(Sent {
            key: content_text(&Value::Array(blocks.clone())),
            parts,
            turn: self.turn_id().to_string(),
        });
        json!({"type": "user", "message": {"role": "user", "content": blocks},
               "parent_tool_use_id": null, "session_id": ""})
    }

    /// The lines to write before the CLI's stdin closes: a running turn is interrupted
    /// (the CLI would finish it first, and its command would outlive the stop).
    pub fn closing(&mut self) -> Vec<Value> {
        match self.turn.as_mut() {
            Some(turn) => {
                turn.interrupted = true;
                vec![self.control(json!({"subtype": "interrupt"}))]
            }
            None => Vec::new(),
        }
    }

    fn item_id(&mut self) -> String {
        match self.turn.as_mut() {
            Some(turn) => {
                turn.next_item += 1;
                format!("{}-{}", turn.id, turn.next_item)
            }
            None => String::new(),
        }
    }

    fn started(&mut self, reaction: &mut Reaction) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if !turn.started {
            turn.started = true;
            let id = turn.id.clone();
            reaction.notify.push(self.note(
                "turn/started",
                json!({"turn": {"id": id, "status": "inProgress", "items": []}}),
            ));
        }
    }

    /// What one line the CLI printed means; `now_ms` times tool calls.
    pub fn line(&mut self, line: &str, now_ms: u64) -> Reaction {
        let mut reaction = Reaction::default();
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            return reaction;
        };
        let nested = !value["parent_tool_use_id"].is_null();
        match text(&value, "type") {
            "system" if text(&value, "subtype") == "init" => {
                if let Some(turn) = &self.turn {
                    if turn.failure.is_some() {
                        // Its model was refused: it does not run on another.
                        reaction
                            .write
                            .push(self.control(json!({"subtype": "interrupt"})));
                    }
                    self.started(&mut reaction);
                } else {
                    // A turn nobody waits for (an input a cancelled turn left queued).
                    reaction
                        .write
                        .push(self.control(json!({"subtype": "interrupt"})));
                }
            }
            "user" if !nested => self.user_line(&value, now_ms, &mut reaction),
            "stream_event" if !nested && self.turn.is_some() && !self.running_orphan => {
                self.stream_event(&value["event"], &value, &mut reaction)
            }
            // A `<synthetic>` message is the CLI's wording of an API error, which the
            // `result` says again.
            "assistant"
                if !nested
                    && self.turn.is_some()
                    && !self.running_orphan
                    && text(&value["message"], "model") != "<synthetic>" =>
            {
                self.assistant(&value, now_ms, &mut reaction)
            }
            "result" => self.result(&value, &mut reaction),
            "control_response" => self.answered(&value["response"], &mut reaction),
            _ => {}
        }
        reaction
    }

    /// The CLI's answer to a control request: a refused model switch keeps the model
    /// it had, and the turn that asked for it fails saying why (it is interrupted, not
    /// run on a model nobody asked for).
    fn answered(&mut self, response: &Value, reaction: &mut Reaction) {
        let Some((wanted, before)) = self.switching.remove(text(response, "request_id")) else {
            return;
        };
        if text(response, "subtype") != "error" {
            return;
        }
        self.model = before;
        let why = format!(
            "Claude Code did not switch to model '{}': {}",
            wanted.as_deref().unwrap_or("(its default)"),
            text(response, "error")
        );
        if let Some(turn) = self.turn.as_mut() {
            turn.failure = Some(why);
            if turn.started {
                reaction
                    .write
                    .push(self.control(json!({"subtype": "interrupt"})));
            }
        }
    }

    fn user_line(&mut self, value: &Value, now_ms: u64, reaction: &mut Reaction) {
        let content = &value["message"]["content"];
        let results: Vec<Value> = content
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| text(b, "type") == "tool_result")
            .cloned()
            .collect();
        if !results.is_empty() {
            for result in results {
                self.tool_done(&result, now_ms, reaction);
            }
            return;
        }
        let key = content_text(content);
        let Some(at) = self.sent.iter().position(|sent| sent.key == key) else {
            // The CLI's own words ("[Request interrupted by user]").
            return;
        };
        // Echoes come in order: inputs before this one were taken up without one (a
        // turn interrupted as it started).
        self.sent.drain(..at);
        let Some(sent) = self.sent.pop_front() else {
            return;
        };
        if sent.turn != self.turn_id() || self.turn.is_none() {
            self.running_orphan = true;
            reaction
                .write
                .push(self.control(json!({"subtype": "interrupt"})));
            return;
        }
        let parts = sent.parts;
        self.started(reaction);
        let id = self.item_id();
        let item = json!({"type": "userMessage", "id": id, "content": parts});
        reaction
            .notify
            .push(self.note("item/started", json!({"item": item})));
        reaction
            .notify
            .push(self.note("item/completed", json!({"item": item})));
    }

    fn stream_event(&mut self, event: &Value, line: &Value, reaction: &mut Reaction) {
        let index = event["index"].as_u64().unwrap_or(0);
        match text(event, "type") {
            "content_block_start" => {
                let kind = text(&event["content_block"], "type");
                if !matches!(kind, "text" | "thinking") {
                    return;
                }
                let id = format!(
                    "{}-{}-{index}",
                    self.turn_id(),
                    text(line, "api_message_id")
                );
                let item = if kind == "text" {
                    json!({"type": "agentMessage", "id": id, "text": "", "phase": null})
                } else {
                    json!({"type": "reasoning", "id": id, "summary": [], "content": []})
                };
                if let Some(turn) = self.turn.as_mut() {
                    match kind {
                        "text" => turn.message = Some((id, String::new())),
                        _ => turn.reasoning = Some((id, String::new())),
                    }
                }
                reaction
                    .notify
                    .push(self.note("item/started", json!({"item": item})));
            }
            "content_block_delta" => {
                let delta = &event["delta"];
                let Some(turn) = self.turn.as_mut() else {
                    return;
                };
                let (method, open, piece, extra) = match text(delta, "type") {
                    "text_delta" => (
                        "item/agentMessage/delta",
                        turn.message.as_mut(),
                        text(delta, "text"),
                        json!({}),
                    ),
                    "thinking_delta" => (
                        "item/reasoning/summaryTextDelta",
                        turn.reasoning.as_mut(),
                        text(delta, "thinking"),
                        json!({"summaryIndex": 0}),
                    ),
                    _ => return,
                };
                let Some((id, so_far)) = open else {
                    return;
                };
                so_far.push_str(piece);
                let mut params = extra;
                params["itemId"] = json!(id);
                params["delta"] = json!(piece);
                reaction.notify.push(self.note(method, params));
            }
            _ => {}
        }
    }

    fn turn_id(&self) -> &str {
        self.turn.as_ref().map_or("", |t| t.id.as_str())
    }

    fn assistant(&mut self, value: &Value, now_ms: u64, reaction: &mut Reaction) {
        let blocks = value["message"]["content"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for block in blocks {
            match text(&block, "type") {
                "text" => {
                    let open = self.turn.as_mut().and_then(|t| t.message.take());
                    self.block_done(open, reaction, |id| {
                        json!({"type": "agentMessage", "id": id,
                               "text": text(&block, "text"), "phase": null})
                    });
                }
                "thinking" => {
                    let open = self.turn.as_mut().and_then(|t| t.reasoning.take());
                    self.block_done(open, reaction, |id| {
                        json!({"type": "reasoning", "id": id,
                               "summary": [text(&block, "thinking")], "content": []})
                    });
                }
                "tool_use" => {
                    let id = text(&block, "id").to_string();
                    let tool = Tool {
                        name: text(&block, "name").to_string(),
                        input: block["input"].clone(),
                        started_ms: now_ms,
                    };
                    let item = self.tool_item(&id, &tool, None, now_ms);
                    if let Some(turn) = self.turn.as_mut() {
                        turn.tools.insert(id, tool);
                    }
                    reaction
                        .notify
                        .push(self.note("item/started", json!({"item": item})));
                }
                _ => {}
            }
        }
    }

    /// A text or thinking block the CLI printed whole: the item that streamed it (`open`)
    /// completes with the whole text, or one that did not stream starts and completes.
    fn block_done(
        &mut self,
        open: Option<(String, String)>,
        reaction: &mut Reaction,
        item_of: impl FnOnce(String) -> Value,
    ) {
        let (id, fresh) = match open {
            Some((id, _)) => (id, false),
            None => (self.item_id(), true),
        };
        let item = item_of(id);
        if fresh {
            reaction
                .notify
                .push(self.note("item/started", json!({"item": item})));
        }
        reaction
            .notify
            .push(self.note("item/completed", json!({"item": item})));
    }

    /// A tool call as codex's item: running (`result` None) or done.
    fn tool_item(&self, id: &str, tool: &Tool, result: Option<&Value>, now_ms: u64) -> Value {
        if tool.name == "Bash" {
            let mut item = json!({"type": "commandExecution", "id": id,
                "command": text(&tool.input, "command"), "cwd": self.cwd,
                "status": "inProgress", "aggregatedOutput": null, "exitCode": null,
                "durationMs": null});
            if let Some(result) = result {
                let (output, exit_code) = shell_outcome(result);
                item["status"] = json!(if exit_code == Some(0) {
                    "completed"
                } else {
                    "failed"
                });
                item["aggregatedOutput"] = json!(output);
                item["exitCode"] = json!(exit_code);
                item["durationMs"] = json!(now_ms.saturating_sub(tool.started_ms));
            }
            return item;
        }
        let mut item = json!({"type": "mcpToolCall", "id": id, "server": TOOL_SERVER,
            "tool": tool.name, "arguments": tool.input, "status": "inProgress",
            "result": null, "error": null, "durationMs": null});
        if let Some(result) = result {
            let said = content_text(&result["content"]);
            if result["is_error"] == Value::Bool(true) {
                item["status"] = json!("failed");
                item["error"] = json!({"message": said});
            } else {
                item["status"] = json!("completed");
                item["result"] = json!({"content": [{"type": "text", "text": said}],
                                        "structuredContent": null});
            }
            item["durationMs"] = json!(now_ms.saturating_sub(tool.started_ms));
        }
        item
    }

    fn tool_done(&mut self, result: &Value, now_ms: u64, reaction: &mut Reaction) {
        let id = text(result, "tool_use_id").to_string();
        let Some(tool) = self.turn.as_mut().and_then(|t| t.tools.remove(&id)) else {
            return;
        };
        let item = self.tool_item(&id, &tool, Some(result), now_ms);
        reaction
            .notify
            .push(self.note("item/completed", json!({"item": item})));
    }

    fn result(&mut self, value: &Value, reaction: &mut Reaction) {
        let usage = usage_of(&value["usage"]);
        let last = [usage.input_tokens, usage.cached_tokens, usage.output_tokens];
        for (total, add) in self.totals.iter_mut().zip(last) {
            *total += add;
        }
        // The end of a run nobody waits for ends no Agents API turn (its tokens count
        // toward the next turn's usage: they were spent in this session).
        if std::mem::take(&mut self.running_orphan) {
            return;
        }
        let Some(turn) = self.turn.as_ref() else {
            return;
        };
        let breakdown = |[input, cached, output]: [u64; 3]| {
            json!({"inputTokens": input, "cachedInputTokens": cached, "outputTokens": output,
                   "reasoningOutputTokens": 0, "totalTokens": input + output})
        };
        reaction.notify.push(self.note(
            "thread/tokenUsage/updated",
            json!({"tokenUsage": {"total": breakdown(self.totals), "last": breakdown(last)}}),
        ));
        let due = self.sent.iter().any(|sent| sent.turn == turn.id);
        if due && !turn.interrupted && turn.failure.is_none() {
            // An input of this turn is still queued: the CLI runs it next.
            return;
        }
        let aborted = text(value, "terminal_reason").starts_with("aborted");
        let failed = value["is_error"] == Value::Bool(true) || text(value, "subtype") != "success";
        let (status, error) = if let Some(why) = &turn.failure {
            (
                "failed",
                json!({"message": why, "codexErrorInfo": "modelNotFound"}),
            )
        } else if turn.interrupted || (failed && aborted) {
            ("interrupted", Value::Null)
        } else if failed {
            let message = value
                .get("result")
                .and_then(Value::as_str)
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .unwrap_or_else(|| {
                    format!("claude ended the turn with {}", text(value, "subtype"))
                });
            let info = error_info(value["api_error_status"].as_u64());
            (
                "failed",
                json!({"message": message, "codexErrorInfo": info}),
            )
        } else {
            ("completed", Value::Null)
        };
        let id = turn.id.clone();
        reaction.notify.push(self.note(
            "turn/completed",
            json!({"turn": {"id": id, "status": status, "error": error, "items": []}}),
        ));
        self.turn = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The captured session replayed: our input lines (`<<< `) become the requests that
    /// wrote them, the CLI's lines are read; returns every notification in order.
    fn replay() -> (ClaudeThread, Vec<(String, Value)>) {
        let path = crate::testing::repo_root().join("tests/fixtures/claude/session.jsonl");
        let text = std::fs::read_to_string(path).unwrap();
        let mut thread = ClaudeThread::new("T", "/work", None);
        let mut notes = Vec::new();
        let mut turn: Option<String> = None;
        for (n, line) in text.lines().enumerate() {
            let Some(sent) = line.strip_prefix("<<< ") else {
                let reaction = thread.line(line, n as u64 * 10);
                for (method, params) in &reaction.notify {
                    if method == "turn/completed" {
                        turn = None;
                    }
                    notes.push((method.clone(), params.clone()));
                }
                continue;
            };
            let sent: Value = serde_json::from_str(sent).unwrap();
            let (reaction, answer) = match text_of_type(&sent) {
                "control_request" => thread.request("turn/interrupt", &json!({})),
                _ => {
                    let input =
                        json!([{"type": "text", "text": sent["message"]["content"][0]["text"]}]);
                    match &turn {
                        Some(id) => thread
                            .request("turn/steer", &json!({"input": input, "expectedTurnId": id})),
                        None => thread.request("turn/start", &json!({"input": input})),
                    }
                }
            };
            if let Ok(started) = &answer {
                if let Some(id) = started["turn"]["id"].as_str() {
                    turn = Some(id.to_string());
                }
            }
            assert!(answer.is_ok(), "{answer:?}");
            // What the thread writes is what the CLI was sent.
            let written = reaction.write.last().unwrap();
            assert_eq!(written["type"], sent["type"]);
        }
        (thread, notes)
    }

    fn text_of_type(v: &Value) -> &str {
        v["type"].as_str().unwrap_or_default()
    }

    #[test]
    fn four_turns_a_steer_and_an_interrupt_map_onto_codex_notifications() {
        let (thread, notes) = replay();
        let completed: Vec<(&str, &str)> = notes
            .iter()
            .filter(|(m, _)| m == "turn/completed")
            .map(|(_, p)| {
                (
                    p["turn"]["id"].as_str().unwrap(),
                    p["turn"]["status"].as_str().unwrap(),
                )
            })
            .collect();
        // The steer during the command belongs to the second turn: four turns in all.
        assert_eq!(
            completed,
            [
                ("claude-turn-1", "completed"),
                ("claude-turn-2", "completed"),
                ("claude-turn-3", "interrupted"),
                ("claude-turn-4", "completed")
            ]
        );
        assert!(thread.turn.is_none() && thread.sent.is_empty() && !thread.running_orphan);
        // Each turn starts once, before anything else of it.
        for turn in 1..=4 {
            let id = format!("claude-turn-{turn}");
            let of_turn: Vec<&String> = notes
                .iter()
                .filter(|(_, p)| p["turnId"] == id.as_str() || p["turn"]["id"] == id.as_str())
                .map(|(m, _)| m)
                .collect();
            assert_eq!(
                of_turn.first().map(|m| m.as_str()),
                Some("turn/started"),
                "{id}"
            );
            assert_eq!(
                of_turn
                    .iter()
                    .filter(|m| m.as_str() == "turn/started")
                    .count(),
                1
            );
            assert_eq!(of_turn.last().map(|m| m.as_str()), Some("turn/completed"));
        }
        // The second turn: its input, the command, the steer (a user message of the same
        // turn), the answer.
        let second: Vec<Value> = notes
            .iter()
            .filter(|(m, p)| m == "item/completed" && p["turnId"] == "claude-turn-2")
            .map(|(_, p)| p["item"].clone())
            .collect();
        let kinds: Vec<&str> = second.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "userMessage",
                "commandExecution",
                "userMessage",
                "agentMessage"
            ]
        );
        assert_eq!(second[1]["command"], "sleep 2 && echo slept");
        assert_eq!(second[1]["aggregatedOutput"], "slept");
        assert_eq!(second[1]["exitCode"], 0);
        assert_eq!(second[1]["status"], "completed");
        assert_eq!(second[2]["content"][0]["text"], "SAY steered");
        assert_eq!(second[3]["text"], "done ");
        // Deltas stream into the message that completes with the whole text.
        let first_deltas: String = notes
            .iter()
            .filter(|(m, p)| m == "item/agentMessage/delta" && p["turnId"] == "claude-turn-1")
            .map(|(_, p)| p["delta"].as_str().unwrap())
            .collect();
        assert_eq!(first_deltas, "first turn ");
        // Usage: running totals, 12 input (10 + 2 cached) and 3 output per model call.
        let last_usage = notes
            .iter()
            .rev()
            .find(|(m, _)| m == "thread/tokenUsage/updated")
            .unwrap();
        assert_eq!(last_usage.1["tokenUsage"]["last"]["inputTokens"], 12);
        assert!(
            last_usage.1["tokenUsage"]["total"]["inputTokens"]
                .as_u64()
                .unwrap()
                >= 48
        );
    }

    #[test]
    fn refusals_steers_without_a_turn_and_models() {
        let mut thread = ClaudeThread::new("T", "/w", None);
        let (_, answer) = thread.request("thread/start", &json!({}));
        assert_eq!(answer.unwrap()["thread"]["id"], "T");
        let (_, steer) = thread.request("turn/steer", &json!({"expectedTurnId": "x", "input": []}));
        assert!(steer.is_err());
        let (reaction, _) = thread.request(
            "turn/start",
            &json!({"model": "claude-code/opus", "input": [{"type": "text", "text": "hi"},
                    {"type": "image", "url": "data:image/png;base64,AAAA"}]}),
        );
        assert_eq!(
            reaction.write[0]["request"],
            json!({"subtype": "set_model", "model": "opus"})
        );
        let content = &reaction.write[1]["message"]["content"];
        assert_eq!(
            content[1]["source"],
            json!({"type": "base64", "media_type": "image/png", "data": "AAAA"})
        );
        let (_, again) = thread.request("turn/start", &json!({"input": []}));
        assert!(again.is_err(), "one turn at a time");
        let (_, unknown) = thread.request("thread/read", &json!({}));
        assert_eq!(unknown.unwrap_err().0, METHOD_NOT_FOUND);
        assert_eq!(thread.closing()[0]["request"]["subtype"], "interrupt");
    }

    #[test]
    fn a_model_the_cli_refuses_fails_the_turn_and_keeps_the_old_model() {
        let mut thread = ClaudeThread::new("T", "/w", Some("a"));
        let (started, _) = thread.request(
            "turn/start",
            &json!({"model": "claude-code/b", "input": [{"type": "text", "text": "hi"}]}),
        );
        let id = started.write[0]["request_id"].as_str().unwrap().to_string();
        let refused = format!(
            r#"{{"type":"control_response","response":{{"subtype":"error","request_id":"{id}","error":"no such model"}}}}"#
        );
        assert!(thread.line(&refused, 0).write.is_empty());
        assert_eq!(thread.model.as_deref(), Some("a"));
        // The turn is interrupted as soon as the CLI starts it.
        let init = thread.line(r#"{"type":"system","subtype":"init"}"#, 0);
        assert_eq!(init.write[0]["request"]["subtype"], "interrupt");
        let end = thread.line(r#"{"type":"result","subtype":"error_during_execution","is_error":true,"terminal_reason":"aborted_streaming","usage":{}}"#, 1);
        let (_, params) = end.notify.last().unwrap();
        assert_eq!(params["turn"]["status"], "failed");
        assert!(params["turn"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no such model"));
    }

    #[test]
    fn an_input_a_cancelled_turn_left_queued_is_nobodys_and_interrupted() {
        let mut thread = ClaudeThread::new("T", "/w", None);
        let input = |t: &str| json!({"input": [{"type": "text", "text": t}]});
        let echo = |t: &str| {
            format!(
                r#"{{"type":"user","message":{{"role":"user","content":[{{"type":"text","text":"{t}"}}]}}}}"#
            )
        };
        let (_, first) = thread.request("turn/start", &input("SLOW"));
        let id = first.unwrap()["turn"]["id"].as_str().unwrap().to_string();
        let _ = thread.line(&echo("SLOW"), 0);
        // A steer the CLI queues (no tool call under way), then a cancel.
        let _ = thread.request(
            "turn/steer",
            &json!({"input": [{"type": "text", "text": "SAY later"}], "expectedTurnId": id}),
        );
        let _ = thread.request("turn/interrupt", &json!({}));
        let end = thread.line(r#"{"type":"result","subtype":"error_during_execution","is_error":true,"terminal_reason":"aborted_streaming","usage":{}}"#, 1);
        assert_eq!(
            end.notify.last().unwrap().1["turn"]["status"],
            "interrupted"
        );
        // The next Agents API turn starts; the CLI first runs the queued steer.
        let _ = thread.request("turn/start", &input("SAY next"));
        let _ = thread.line(r#"{"type":"system","subtype":"init"}"#, 2);
        let orphan = thread.line(&echo("SAY later"), 3);
        assert_eq!(orphan.write[0]["request"]["subtype"], "interrupt");
        assert!(orphan.notify.is_empty(), "{orphan:?}");
        let said = thread.line(r#"{"type":"assistant","message":{"model":"m","content":[{"type":"text","text":"not ours"}]}}"#, 4);
        assert!(said.notify.is_empty());
        let ended = thread.line(r#"{"type":"result","subtype":"error_during_execution","is_error":true,"terminal_reason":"aborted_streaming","usage":{}}"#, 5);
        assert!(
            !ended.notify.iter().any(|(m, _)| m == "turn/completed"),
            "{ended:?}"
        );
        // Then ours runs, and ends the turn.
        let ours = thread.line(&echo("SAY next"), 6);
        assert_eq!(ours.notify[0].1["item"]["type"], "userMessage");
        let done = thread.line(
            r#"{"type":"result","subtype":"success","is_error":false,"usage":{}}"#,
            7,
        );
        assert_eq!(done.notify.last().unwrap().1["turn"]["status"], "completed");
    }

    #[test]
    fn a_failed_model_call_fails_the_turn_with_codexs_error_info() {
        let mut thread = ClaudeThread::new("T", "/w", None);
        let _ = thread.request(
            "turn/start",
            &json!({"input": [{"type": "text", "text": "FAIL429"}]}),
        );
        let _ = thread.line(r#"{"type":"user","message":{"role":"user","content":[{"type":"text","text":"FAIL429"}]}}"#, 0);
        let end = thread.line(r#"{"type":"result","subtype":"success","is_error":true,"result":"API Error: 429 slow down","api_error_status":429,"terminal_reason":"api_error","usage":{}}"#, 1);
        let (method, params) = end.notify.last().unwrap();
        assert_eq!(method, "turn/completed");
        assert_eq!(params["turn"]["status"], "failed");
        assert_eq!(
            params["turn"]["error"]["codexErrorInfo"],
            "rateLimitExceeded"
        );
        assert_eq!(
            params["turn"]["error"]["message"],
            "API Error: 429 slow down"
        );
    }
}
