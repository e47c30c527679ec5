//! What `codex app-server` ([`super::app_server`]) says, in the shapes of OpenAI's Agents
//! API (the pinned `openai` SDK's `types/beta/agent_session_*`; `docs/agents-api.md`
//! §5–§9), and what an Agents API agent and its inputs become for codex. Pure
//! functions of JSON values: no process, no store, no HTTP. Written against codex
//! 0.169.0 and the turns captured from it in `tests/fixtures/codex/` (how: the module
//! docs of `tests/it/codex_app_server.rs`).
//!
//! **Items** ([`session_item`]): a codex `ThreadItem` becomes an `AgentSessionItem`, with
//! `id` (codex's), `turn_id` (ours) and `x_agent_sandbox`:
//!
//! | codex | Agents API |
//! |---|---|
//! | `userMessage` | `message`, role `user` (`text` → `input_text`, `image{url}` → `input_image`) |
//! | `agentMessage` | `message`, role `assistant`, `phase` `commentary`/`final_answer` (codex's `partial_answer` has no SDK value: `null`, which the SDK counts as answer text) |
//! | `reasoning` | `reasoning`, its `summary` (raw `content` has no SDK field) |
//! | `commandExecution` | `command_execution` (`declined` is `failed`) |
//! | `dynamicToolCall` | `function_call` (`call_id` = codex's item id = the model's call id; `name` the bare tool name, namespaced or not); its answer is a `function_call_output` ([`function_call_output_item`]) |
//! | `mcpToolCall` | `mcp_call` |
//! | `webSearch` | `web_search_call` |
//! | `collabAgentToolCall` | `create_subagent_call` (`spawnAgent`), `send_subagent_input_call` (`sendInput`, `sendMessage`, `followupTask`), `resume_subagent_call`, `wait_for_subagents_call`, `interrupt_subagent_call`, `close_subagent_call`; agent ids are codex thread ids |
//! | `fileChange`, `plan`, `contextCompaction`, `hookPrompt`, `imageView`, `imageGeneration`, `sleep`, `enteredReviewMode`, `exitedReviewMode`, `functionCallOutput`, `subAgentActivity`, `collabAgentToolCall listAgents` | none (`None`): the SDK has no item for them |
//!
//! Statuses: codex `inProgress|completed|failed|declined|interrupted` → `in_progress|
//! completed|failed|failed|incomplete`; items without a codex status (messages,
//! reasoning, web searches) are `in_progress` when started, `completed` when done.
//!
//! **Events** ([`EventMapper`], one per turn of one thread): the notifications of that
//! turn become the turn's `AgentSessionEvent`s in the order of `docs/agents-api.md` §9.4,
//! each with `type`, `session_id` and `turn_id` (no `event_id`: the session layer numbers
//! them), plus [`Fact`]s for the session layer:
//!
//! - `turn/started` → `agent.session.turn.in_progress`;
//! - `item/started` → `item.added` (`output_index` allocated at first sight, in order;
//!   user messages have none), and for an assistant message `content_part.added`;
//!   a `dynamicToolCall` is held until its `item/tool/call` request
//!   ([`EventMapper::tool_call`]), so the session layer registers the pending call before
//!   any client sees the `function_call` (the SDK answers calls on `item.added`);
//! - `item/agentMessage/delta` → `output_text.delta`; `item/reasoning/summaryPartAdded`
//!   and `summaryTextDelta` → `reasoning_summary_part.added` and `…_text.delta` (a part
//!   is closed with `…_text.done` and `…_part.done` when the next starts or the item
//!   completes); `item/commandExecution/outputDelta` →
//!   `agent.output.command_execution_output.delta`;
//! - `item/completed` → `output_text.done` and `content_part.done` (messages),
//!   `item.done`, and [`Fact::Item`] (the item to store; user messages only get the
//!   fact, the `item.done` union has no user message);
//! - `thread/tokenUsage/updated` → nothing; the turn's usage is the difference of codex's
//!   cumulative totals (the thread's total before the turn, given to [`EventMapper::new`],
//!   and its last total in the turn);
//! - `error` with `willRetry: false` → the turn's error (no `error` event: the SDK raises
//!   on one, and the turn's `failed` event already carries it); `willRetry: true` is a
//!   transient retry and says nothing;
//! - `turn/completed` → items still open are closed `incomplete` (an interrupted turn's
//!   partial answer), then `agent.session.turn.completed|failed|cancelled` (codex
//!   `completed|failed|interrupted`) with the turn and its `usage`, and
//!   [`Fact::TurnEnded`]. `SessionTurnError.code` comes from `codexErrorInfo`
//!   ([`error_code`]).
//!
//! The mapper never emits session-state events (`agent.session.*`: idle, in_progress,
//! requires_action): the session layer owns the session's status and required actions.
//! Notifications of other threads (subagents) and other turns are ignored.
//!
//! **Function tools.** [`tool_call`] turns codex's `item/tool/call` request into the
//! `function_call` required action and item; [`tool_response`] turns the client's
//! `agent.session.input.tool_result` into the JSON-RPC result codex expects
//! (`{contentItems: [{type: "inputText", text}], success}`).
//!
//! **Agent and input** ([`thread_plan`], [`turn_start_params`]; the input's content is
//! `super::sessions::inputs`'): an
//! Agents API `agent` becomes `thread/start` params (to re-send on `thread/resume`: the
//! per-thread `config` is not persisted) and what every `turn/start` adds; a field codex
//! cannot honour is refused ([`Unsupported`], with the `param` to name in a 400), never
//! ignored:
//!
//! - `model` → `model`; `instructions` → `developerInstructions`; `reasoning.effort` /
//!   `.summary` and `text.verbosity` → `config.model_reasoning_effort`,
//!   `model_reasoning_summary`, `model_verbosity`; `service_tier` `default`/`flex` →
//!   `serviceTier` (`auto`: codex's default; other tiers refused: codex drops them
//!   silently); `text.format` json_schema → `turn/start.outputSchema`;
//!   `multi_agent.enabled` → `config.features.multi_agent` (off unless enabled: codex
//!   offers sub-agent tools by default), `max_concurrent_subagents` → `agents.max_threads`;
//! - `function` tools → `dynamicTools` (names `^[a-zA-Z0-9_-]{1,128}$`, not one of
//!   codex's own tools; `defer_loading` ones in the [`DEFERRED_NAMESPACE`] namespace,
//!   which codex requires for them; `async` refused);
//! - `mcp` tools → dotted `config` keys `mcp_servers.<label>.{url, bearer_token_env_var,
//!   http_headers | command, args, env, env_vars, cwd, enabled_tools, required}` and
//!   `default_tools_approval_mode = "approve"` (nobody is there to approve); an
//!   `authorization` token goes to the process environment ([`ThreadPlan::env`]), never
//!   into the thread's config; `credential_id` and `request_metadata` are refused;
//! - `web_search` → `config.web_search` = its mode, and `"disabled"` without one (codex
//!   offers web search by default); other tools are refused;
//! - codex runs with `approvalPolicy: "never"` and `sandbox: "danger-full-access"`: the
//!   container is the sandbox and nobody is there to approve;
//! - input message content: `input_text` → `{type: "text"}`, `input_image` → `{type:
//!   "image", url}` (data: URLs only: codex refuses remote images).

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::objects::label;
use super::records::new_id;

/// What `x_agent_sandbox.compute` says for what codex did.
const COMPUTE: &str = "codex";

// ---------------------------------------------------------------- items

fn labelled(mut item: Value, differences: &[&str]) -> Value {
    item["x_agent_sandbox"] = label(COMPUTE, differences);
    item
}

fn str_of<'a>(value: &'a Value, key: &str) -> &'a str {
    value[key].as_str().unwrap_or_default()
}

/// A codex status as the SDK's `AgentFunctionCallStatus`; codex's own word when it has
/// one, else by whether the item is done.
fn call_status(item: &Value, done: bool) -> &'static str {
    match item["status"].as_str() {
        Some("inProgress") => "in_progress",
        Some("completed") => "completed",
        Some("failed" | "declined") => "failed",
        Some("interrupted") => "incomplete",
        _ if done => "completed",
        _ => "in_progress",
    }
}

/// `AgentOutputItemStatus` of an item codex gives no status (messages, reasoning).
fn output_status(done: bool) -> &'static str {
    if done {
        "completed"
    } else {
        "in_progress"
    }
}

/// The `UserInput[]` of a codex user message as SDK message content.
fn user_content(content: &Value) -> Vec<Value> {
    content
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|part| match part["type"].as_str()? {
            "text" => Some(json!({"type": "input_text", "text": str_of(part, "text")})),
            "image" => Some(json!({"type": "input_image", "image_url": part["url"].as_str()?})),
            // Local files, skills, mentions, audio: no SDK content type.
            _ => None,
        })
        .collect()
}

/// An MCP or subagent content string as `AgentContent[]`.
fn output_texts(text: Option<&str>) -> Vec<Value> {
    text.map(|t| json!({"type": "output_text", "text": t}))
        .into_iter()
        .collect()
}

/// codex's `WebSearchAction` as the SDK's web search action.
fn web_search_action(item: &Value) -> Value {
    let action = &item["action"];
    match action["type"].as_str() {
        Some("search") => {
            json!({"type": "search", "query": action["query"], "queries": action["queries"]})
        }
        Some("openPage") => json!({"type": "open_page", "url": action["url"]}),
        Some("findInPage") => {
            json!({"type": "find_in_page", "url": action["url"], "pattern": action["pattern"]})
        }
        Some(_) => json!({"type": "other"}),
        None => match item["query"].as_str().filter(|q| !q.is_empty()) {
            Some(query) => json!({"type": "search", "query": query}),
            None => Value::Null,
        },
    }
}

/// A codex `ThreadItem` as an `AgentSessionItem` of turn `turn_id`, `done` once codex
/// said `item/completed`; `None` for items the SDK has no type for (module docs).
pub fn session_item(item: &Value, turn_id: &str, done: bool) -> Option<Value> {
    let id = str_of(item, "id");
    let mapped = match str_of(item, "type") {
        "userMessage" => json!({
            "type": "message", "id": id, "role": "user",
            "content": user_content(&item["content"]), "phase": null, "status": "completed",
        }),
        "agentMessage" => {
            let phase = match item["phase"].as_str() {
                Some(p @ ("commentary" | "final_answer")) => json!(p),
                _ => Value::Null,
            };
            let text = str_of(item, "text");
            let content = if done || !text.is_empty() {
                vec![json!({"type": "output_text", "text": text})]
            } else {
                Vec::new()
            };
            json!({"type": "message", "id": id, "role": "assistant", "content": content,
                   "phase": phase, "status": output_status(done)})
        }
        "reasoning" => {
            let summary: Vec<Value> = item["summary"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|text| json!({"type": "summary_text", "text": text}))
                .collect();
            json!({"type": "reasoning", "id": id, "summary": summary, "status": output_status(done)})
        }
        "commandExecution" => {
            let item = json!({
                "type": "command_execution", "id": id, "command": str_of(item, "command"),
                "cwd": item["cwd"], "output": item["aggregatedOutput"], "exit_code": item["exitCode"],
                "duration_ms": item["durationMs"], "status": call_status(item, done),
            });
            return Some(labelled(
                item.merged(json!({"turn_id": turn_id})),
                &["tools_run_locally"],
            ));
        }
        "dynamicToolCall" => json!({
            "type": "function_call", "id": id, "call_id": id, "name": str_of(item, "tool"),
            "arguments": item["arguments"], "status": call_status(item, done),
        }),
        "mcpToolCall" => {
            let output = match &item["result"] {
                Value::Null => Value::Null,
                result => {
                    json!({"content": result["content"], "structured_content": result["structuredContent"]})
                }
            };
            let error = match &item["error"] {
                Value::Null => Value::Null,
                error => error
                    .get("message")
                    .cloned()
                    .unwrap_or_else(|| error.clone()),
            };
            let item = json!({
                "type": "mcp_call", "id": id, "server_label": str_of(item, "server"),
                "name": str_of(item, "tool"), "arguments": item["arguments"], "output": output,
                "error": error, "status": call_status(item, done),
            });
            return Some(labelled(
                item.merged(json!({"turn_id": turn_id})),
                &["tools_run_locally"],
            ));
        }
        "webSearch" => json!({
            "type": "web_search_call", "id": id, "action": web_search_action(item),
            "status": output_status(done),
        }),
        "collabAgentToolCall" => collab_item(item, done)?,
        _ => return None,
    };
    Some(labelled(mapped.merged(json!({"turn_id": turn_id})), &[]))
}

/// A V1 collaboration tool call as the subagent call item it is.
fn collab_item(item: &Value, done: bool) -> Option<Value> {
    let id = str_of(item, "id");
    let sender = str_of(item, "senderThreadId");
    let receivers: Vec<&str> = item["receiverThreadIds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let first = receivers.first().copied().unwrap_or_default();
    let status = call_status(item, done);
    let prompt = item["prompt"].as_str();
    Some(match str_of(item, "tool") {
        "spawnAgent" => json!({
            "type": "create_subagent_call", "id": id, "agent_id": first,
            "content": output_texts(prompt), "model": item["model"],
            "reasoning_effort": item["reasoningEffort"], "status": status,
        }),
        "sendInput" | "sendMessage" | "followupTask" => json!({
            "type": "send_subagent_input_call", "id": id, "sender_agent_id": sender,
            "recipient_agent_id": first, "content": output_texts(prompt), "status": status,
        }),
        "wait" => json!({
            "type": "wait_for_subagents_call", "id": id, "sender_agent_id": sender,
            "recipient_agent_ids": receivers, "status": status,
        }),
        tool @ ("resumeAgent" | "interruptAgent" | "closeAgent") => {
            let kind = match tool {
                "resumeAgent" => "resume_subagent_call",
                "interruptAgent" => "interrupt_subagent_call",
                _ => "close_subagent_call",
            };
            json!({"type": kind, "id": id, "sender_agent_id": sender,
                   "recipient_agent_id": first, "status": status})
        }
        _ => return None,
    })
}

/// `a.merged(b)`: the keys of `b` after those of `a`, `b`'s winning (both objects).
trait Merged {
    fn merged(self, other: Value) -> Value;
}

impl Merged for Value {
    fn merged(mut self, other: Value) -> Value {
        if let (Some(mine), Value::Object(theirs)) = (self.as_object_mut(), other) {
            mine.extend(theirs);
        }
        self
    }
}

// ---------------------------------------------------------------- function tools

/// A dynamic tool call codex waits on: what the session layer keeps until the client's
/// `tool_result`, and what it shows.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingToolCall {
    pub call_id: String,
    pub name: String,
    pub arguments: Value,
    /// The session's `required_actions` entry:
    /// `{type: "function_call", call_id, name, arguments, turn_id}`.
    pub required_action: Value,
    /// The `function_call` item (`in_progress`).
    pub item: Value,
}

/// codex's `item/tool/call` request params (`{threadId, turnId, callId, namespace,
/// tool, arguments}`) as the call of our turn `turn_id`; `None` without a call id or a
/// tool name.
pub fn tool_call(params: &Value, turn_id: &str) -> Option<PendingToolCall> {
    let call_id = params["callId"].as_str().filter(|c| !c.is_empty())?;
    let name = params["tool"].as_str().filter(|t| !t.is_empty())?;
    let arguments = params["arguments"].clone();
    let item = session_item(
        &json!({"type": "dynamicToolCall", "id": call_id, "tool": name,
                "arguments": arguments, "status": "inProgress"}),
        turn_id,
        false,
    )?;
    Some(PendingToolCall {
        call_id: call_id.to_string(),
        name: name.to_string(),
        arguments: arguments.clone(),
        required_action: json!({"type": "function_call", "call_id": call_id, "name": name,
                                "arguments": arguments, "turn_id": turn_id}),
        item,
    })
}

/// What a client's `agent.session.input.tool_result` says.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResult {
    pub success: bool,
    /// A string, or `[{type: "input_text", text} | {type: "input_image", image_url}]`.
    pub output: Option<Value>,
    pub error: Option<String>,
}

impl ToolResult {
    /// The `tool_result` input event's fields (`success`, `output`, `error`).
    pub fn of(event: &Value) -> ToolResult {
        ToolResult {
            success: event["success"].as_bool().unwrap_or(false),
            output: event.get("output").filter(|o| !o.is_null()).cloned(),
            error: event["error"].as_str().map(str::to_string),
        }
    }
}

/// The JSON-RPC result answering codex's `item/tool/call`:
/// `{contentItems: [{type: "inputText", text} | {type: "inputImage", imageUrl}], success}`.
/// A failure's error text is what the model reads.
pub fn tool_response(result: &ToolResult) -> Value {
    let items: Vec<Value> = if result.success {
        match &result.output {
            Some(Value::String(text)) => vec![json!({"type": "inputText", "text": text})],
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|part| match part["type"].as_str()? {
                    "input_text" => {
                        Some(json!({"type": "inputText", "text": str_of(part, "text")}))
                    }
                    "input_image" => {
                        Some(json!({"type": "inputImage", "imageUrl": part["image_url"].as_str()?}))
                    }
                    _ => None,
                })
                .collect(),
            Some(other) => vec![json!({"type": "inputText", "text": other.to_string()})],
            None => Vec::new(),
        }
    } else {
        let text = result
            .error
            .clone()
            .unwrap_or_else(|| "the tool failed".to_string());
        vec![json!({"type": "inputText", "text": text})]
    };
    json!({"contentItems": items, "success": result.success})
}

/// The `function_call_output` item of a client's answer to call `call_id`.
pub fn function_call_output_item(call_id: &str, turn_id: &str, result: &ToolResult) -> Value {
    let (output, error) = if result.success {
        (result.output.clone().unwrap_or(Value::Null), Value::Null)
    } else {
        (
            Value::Null,
            json!(result.error.as_deref().unwrap_or("the tool failed")),
        )
    };
    labelled(
        json!({"type": "function_call_output", "id": format!("{call_id}_output"), "call_id": call_id,
               "output": output, "error": error,
               "status": if result.success { "completed" } else { "failed" },
               "turn_id": turn_id}),
        &[],
    )
}

// ---------------------------------------------------------------- usage and errors

/// codex's cumulative token counts of a thread (`tokenUsage.total`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub input: u64,
    pub cached_input: u64,
    pub output: u64,
    pub reasoning_output: u64,
    pub total: u64,
}

impl Totals {
    /// A codex `TokenUsageBreakdown`.
    pub fn of(breakdown: &Value) -> Totals {
        let n = |key: &str| breakdown[key].as_u64().unwrap_or(0);
        Totals {
            input: n("inputTokens"),
            cached_input: n("cachedInputTokens"),
            output: n("outputTokens"),
            reasoning_output: n("reasoningOutputTokens"),
            total: n("totalTokens"),
        }
    }

    /// What was counted since `earlier`.
    pub fn since(self, earlier: Totals) -> Totals {
        Totals {
            input: self.input.saturating_sub(earlier.input),
            cached_input: self.cached_input.saturating_sub(earlier.cached_input),
            output: self.output.saturating_sub(earlier.output),
            reasoning_output: self
                .reasoning_output
                .saturating_sub(earlier.reasoning_output),
            total: self.total.saturating_sub(earlier.total),
        }
    }

    /// The SDK's `TokenUsage`.
    pub fn usage(self) -> Value {
        json!({
            "input_tokens": self.input,
            "input_tokens_details": {"cached_tokens": self.cached_input},
            "output_tokens": self.output,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_output},
            "total_tokens": self.total,
        })
    }
}

/// `SessionTurnError.code` of a codex `codexErrorInfo` (a string, or an object named by
/// its one key): the SDK's enum mirrors codex's names; what has no counterpart is
/// `internal_error`.
pub fn error_code(info: &Value) -> &'static str {
    let name = match info {
        Value::String(name) => name.as_str(),
        Value::Object(map) => map.keys().next().map_or("", String::as_str),
        _ => "",
    };
    match name {
        "contextWindowExceeded" => "context_length_exceeded",
        "sessionBudgetExceeded" => "session_budget_exceeded",
        "usageLimitExceeded" => "usage_limit_exceeded",
        "rateLimitExceeded" => "rate_limit_exceeded",
        "flexUnavailable" => "flex_unavailable",
        "serverOverloaded" | "policyCapacityUnavailable" => "server_overloaded",
        "cyberPolicy" => "cyber_policy",
        "misalignmentPolicyViolation" => "misalignment_policy_violation",
        "httpConnectionFailed"
        | "responseStreamConnectionFailed"
        | "responseStreamDisconnected"
        | "responseTooManyFailedAttempts" => "connection_failed",
        "internalServerError" => "server_error",
        "unauthorized" => "authentication_error",
        "badRequest" => "invalid_request",
        "modelNotFound" => "resource_not_found",
        "sandboxError" => "sandbox_error",
        "activeTurnNotSteerable" => "active_turn_not_steerable",
        _ => "internal_error",
    }
}

/// A codex `TurnError` as a `SessionTurnError`.
pub fn turn_error(error: &Value) -> Value {
    let message = error["message"]
        .as_str()
        .filter(|m| !m.is_empty())
        .unwrap_or("codex failed the turn without saying why");
    json!({"code": error_code(&error["codexErrorInfo"]), "message": message})
}

// ---------------------------------------------------------------- the event mapper

/// What the session layer learns from a notification besides the events.
#[derive(Clone, Debug, PartialEq)]
pub enum Fact {
    /// An item in its final state, to store (user messages, tool outputs, and every
    /// item done, the ones closed `incomplete` included).
    Item(Value),
    /// A dynamic tool call to register as pending (before the events go out).
    ToolCall(PendingToolCall),
    /// The turn is over.
    TurnEnded(TurnEnd),
}

/// How a turn ended.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnEnd {
    /// `completed`, `failed` or `cancelled`.
    pub status: &'static str,
    /// The `SessionTurnError` of a failed turn.
    pub error: Option<Value>,
    /// The turn's `TokenUsage`.
    pub usage: Value,
    /// The thread's cumulative totals now: the next turn's mapper starts from them.
    pub thread_total: Totals,
    /// The turn object in its final state.
    pub turn: Value,
}

/// The events and facts of one notification.
#[derive(Debug, Default, PartialEq)]
pub struct Mapped {
    pub events: Vec<Value>,
    pub facts: Vec<Fact>,
}

/// How an item streams besides `added` and `done`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stream {
    Message,
    Reasoning,
    Other,
}

/// An item seen in this turn and not done yet.
struct Open {
    output_index: Option<u64>,
    stream: Stream,
    /// Its `item.added` went out.
    added: bool,
    /// codex's latest view of it.
    item: Value,
    /// A message's text so far.
    text: String,
    /// A reasoning item's summary parts: text so far, and whether the part was closed.
    parts: Vec<(String, bool)>,
}

/// Maps the notifications of one turn of one thread onto the Agents API (module docs).
pub struct EventMapper {
    turn: Value,
    session_id: String,
    turn_id: String,
    thread_id: String,
    codex_turn: Option<String>,
    next_index: u64,
    open: HashMap<String, Open>,
    /// Open items in the order first seen, to close them in that order.
    order: Vec<String>,
    prior_total: Totals,
    last_total: Option<Totals>,
    error: Option<Value>,
    ended: bool,
    /// Our id of each codex item id of this turn: codex keeps the provider's ids, which
    /// a provider may reuse (in other sessions, in later turns), so every item gets an
    /// id of ours, unique on this server; codex's stays on the item as
    /// `x_agent_sandbox.codex_item_id`.
    ours_of: HashMap<String, String>,
    /// codex's id of each of ours.
    codex_of: HashMap<String, String>,
    /// codex ids whose item completed: one started again is a new item.
    completed: std::collections::HashSet<String>,
}

impl EventMapper {
    /// `turn` is our `Turn` object (its `id` and `session_id` fill every event; its
    /// status and times are kept current); `thread_id` the codex thread, `codex_turn` the
    /// id `turn/start` answered (when known; else the first `turn/started` of the thread
    /// says it); `prior_total` the thread's totals when the turn began.
    pub fn new(
        turn: Value,
        thread_id: &str,
        codex_turn: Option<&str>,
        prior_total: Totals,
    ) -> EventMapper {
        EventMapper {
            session_id: str_of(&turn, "session_id").to_string(),
            turn_id: str_of(&turn, "id").to_string(),
            turn,
            thread_id: thread_id.to_string(),
            codex_turn: codex_turn.map(str::to_string),
            next_index: 0,
            open: HashMap::new(),
            order: Vec::new(),
            prior_total,
            last_total: None,
            error: None,
            ended: false,
            ours_of: HashMap::new(),
            codex_of: HashMap::new(),
            completed: std::collections::HashSet::new(),
        }
    }

    /// Our id for codex's item id `codex` (a new one when that item `starts` again
    /// after it completed).
    fn our_id(&mut self, codex: &str, starts: bool) -> String {
        let again = starts && self.completed.remove(codex);
        if !again {
            if let Some(ours) = self.ours_of.get(codex) {
                return ours.clone();
            }
        }
        let ours = new_id("item_");
        self.ours_of.insert(codex.to_string(), ours.clone());
        self.codex_of.insert(ours.clone(), codex.to_string());
        ours
    }

    /// `params` with codex's item ids (`itemId`, `item.id`) replaced by ours.
    fn with_our_ids(&mut self, method: &str, params: &Value) -> Option<Value> {
        let item_id = params["itemId"].as_str();
        let nested = params["item"]["id"].as_str();
        if item_id.is_none() && nested.is_none() {
            return None;
        }
        let mut params = params.clone();
        if let Some(codex) = item_id {
            params["itemId"] = json!(self.our_id(codex, false));
        }
        if let Some(codex) = nested.map(str::to_string) {
            params["item"]["id"] = json!(self.our_id(&codex, method == "item/started"));
            if method == "item/completed" {
                self.completed.insert(codex);
            }
        }
        Some(params)
    }

    /// [`session_item`] of an item whose id is ours, labelled with codex's id.
    fn item_of(&self, item: &Value, done: bool) -> Option<Value> {
        let mut mapped = session_item(item, &self.turn_id, done)?;
        if let Some(codex) = self.codex_of.get(str_of(item, "id")) {
            if str_of(item, "type") == "dynamicToolCall" {
                // The call id is the model's, which the client answers with.
                mapped["call_id"] = json!(codex);
            }
            mapped["x_agent_sandbox"]["codex_item_id"] = json!(codex);
        }
        Some(mapped)
    }

    /// The turn object as the events so far left it.
    pub fn turn(&self) -> &Value {
        &self.turn
    }

    fn event(&self, kind: &str, fields: Value) -> Value {
        json!({"type": kind, "session_id": self.session_id, "turn_id": self.turn_id}).merged(fields)
    }

    /// Whether `params` belong to this turn (learning codex's turn id from the first
    /// `turn/started` when it was not given).
    fn ours(&mut self, method: &str, params: &Value) -> bool {
        if self.ended || params["threadId"].as_str() != Some(&self.thread_id) {
            return false;
        }
        let turn = params["turnId"]
            .as_str()
            .or_else(|| params["turn"]["id"].as_str());
        match (&self.codex_turn, turn) {
            (Some(ours), Some(theirs)) => ours == theirs,
            (None, Some(theirs)) if method == "turn/started" => {
                self.codex_turn = Some(theirs.to_string());
                true
            }
            (None, Some(_)) => false,
            // Thread-level notifications without a turn (none are mapped).
            (_, None) => false,
        }
    }

    /// The events and facts of one notification.
    pub fn notification(&mut self, method: &str, params: &Value) -> Mapped {
        let mut out = Mapped::default();
        if !self.ours(method, params) {
            return out;
        }
        let translated = self.with_our_ids(method, params);
        let params = translated.as_ref().unwrap_or(params);
        match method {
            "turn/started" => {
                self.turn["status"] = json!("in_progress");
                if let Some(at) = params["turn"]["startedAt"].as_i64() {
                    self.turn["started_at"] = json!(at);
                }
                let event =
                    self.event("agent.session.turn.in_progress", json!({"turn": self.turn}));
                out.events.push(event);
            }
            "item/started" => self.item_started(&params["item"], &mut out),
            "item/completed" => self.item_completed(&params["item"], &mut out),
            "item/agentMessage/delta" => {
                let id = str_of(params, "itemId");
                let stub = json!({"type": "agentMessage", "id": id, "text": "", "phase": null});
                if let Some(index) = self.ensure_added(id, &stub, &mut out) {
                    let delta = str_of(params, "delta");
                    if let Some(open) = self.open.get_mut(id) {
                        open.text.push_str(delta);
                    }
                    let event = self.event(
                        "agent.session.turn.output_text.delta",
                        json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta}),
                    );
                    out.events.push(event);
                }
            }
            "item/reasoning/summaryPartAdded" => {
                let id = str_of(params, "itemId");
                let part = params["summaryIndex"].as_u64().unwrap_or(0) as usize;
                self.summary_part(id, part, &mut out);
            }
            "item/reasoning/summaryTextDelta" => {
                let id = str_of(params, "itemId");
                let part = params["summaryIndex"].as_u64().unwrap_or(0) as usize;
                if let Some(index) = self.summary_part(id, part, &mut out) {
                    let delta = str_of(params, "delta");
                    if let Some(open) = self.open.get_mut(id) {
                        open.parts[part].0.push_str(delta);
                    }
                    let event = self.event(
                        "agent.session.turn.reasoning_summary_text.delta",
                        json!({"item_id": id, "output_index": index, "summary_index": part, "delta": delta}),
                    );
                    out.events.push(event);
                }
            }
            "item/commandExecution/outputDelta" => {
                let id = str_of(params, "itemId");
                let stub = json!({"type": "commandExecution", "id": id, "command": "", "status": "inProgress"});
                if let Some(index) = self.ensure_added(id, &stub, &mut out) {
                    let event = self.event(
                        "agent.output.command_execution_output.delta",
                        json!({"item_id": id, "output_index": index, "delta": params["delta"]}),
                    );
                    out.events.push(event);
                }
            }
            "thread/tokenUsage/updated" => {
                self.last_total = Some(Totals::of(&params["tokenUsage"]["total"]));
            }
            // `willRetry: true` is a transient retry: nothing to say.
            "error" if params["willRetry"] != json!(true) => {
                self.error = Some(turn_error(&params["error"]));
            }
            "turn/completed" => self.turn_completed(&params["turn"], &mut out),
            _ => {}
        }
        out
    }

    /// The item's output index, allocated at first sight.
    fn index_of(&mut self, id: &str, item: &Value) -> Option<u64> {
        if let Some(open) = self.open.get(id) {
            return open.output_index;
        }
        let stream = match str_of(item, "type") {
            "agentMessage" => Stream::Message,
            "reasoning" => Stream::Reasoning,
            _ => Stream::Other,
        };
        let output_index = (str_of(item, "type") != "userMessage").then(|| {
            self.next_index += 1;
            self.next_index - 1
        });
        self.open.insert(
            id.to_string(),
            Open {
                output_index,
                stream,
                added: false,
                item: item.clone(),
                text: String::new(),
                parts: Vec::new(),
            },
        );
        self.order.push(id.to_string());
        output_index
    }

    /// Emits `item.added` (and a message's `content_part.added`) unless it went out,
    /// and returns the item's output index: `None` for a user message (it has none) and
    /// for items the SDK has no type for (nothing is emitted).
    fn ensure_added(&mut self, id: &str, item: &Value, out: &mut Mapped) -> Option<u64> {
        let mapped = self.item_of(item, false)?;
        let index = self.index_of(id, item);
        let open = self.open.get_mut(id)?;
        if open.added {
            return index;
        }
        open.added = true;
        let stream = open.stream;
        let event = self.event(
            "agent.session.turn.item.added",
            json!({"item": mapped, "output_index": index}),
        );
        out.events.push(event);
        if stream == Stream::Message {
            let event = self.event(
                "agent.session.turn.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": {"type": "output_text", "text": ""}}),
            );
            out.events.push(event);
        }
        index
    }

    fn item_started(&mut self, item: &Value, out: &mut Mapped) {
        let id = str_of(item, "id").to_string();
        if session_item(item, &self.turn_id, false).is_none() {
            return;
        }
        if str_of(item, "type") == "dynamicToolCall" {
            // Held until codex asks for it: the session layer registers the call first.
            self.index_of(&id, item);
            return;
        }
        self.ensure_added(&id, item, out);
        if let Some(open) = self.open.get_mut(&id) {
            open.item = item.clone();
        }
    }

    /// Announces summary part `part` (closing the ones before it), unless it was.
    fn summary_part(&mut self, id: &str, part: usize, out: &mut Mapped) -> Option<u64> {
        let stub = json!({"type": "reasoning", "id": id, "summary": [], "content": []});
        let index = self.ensure_added(id, &stub, out)?;
        let announced = self.open.get(id)?.parts.len();
        if part < announced {
            return Some(index);
        }
        for earlier in 0..announced {
            self.close_part(id, earlier, None, out);
        }
        for new in announced..=part {
            self.open.get_mut(id)?.parts.push((String::new(), false));
            let event = self.event(
                "agent.session.turn.reasoning_summary_part.added",
                json!({"item_id": id, "output_index": index, "summary_index": new,
                       "part": {"type": "summary_text", "text": ""}}),
            );
            out.events.push(event);
        }
        Some(index)
    }

    /// Closes summary part `part` with `text` (or what streamed), unless it was.
    fn close_part(&mut self, id: &str, part: usize, text: Option<&str>, out: &mut Mapped) {
        let Some(open) = self.open.get_mut(id) else {
            return;
        };
        let index = open.output_index;
        let Some((streamed, closed)) = open.parts.get_mut(part) else {
            return;
        };
        if *closed {
            return;
        }
        *closed = true;
        let text = text.map_or_else(|| streamed.clone(), str::to_string);
        // Closed because the turn ended under it.
        let incomplete = self.ended;
        let done = self.event(
            "agent.session.turn.reasoning_summary_text.done",
            json!({"item_id": id, "output_index": index, "summary_index": part, "text": text}),
        );
        let mut part_done = self.event(
            "agent.session.turn.reasoning_summary_part.done",
            json!({"item_id": id, "output_index": index, "summary_index": part,
                   "part": {"type": "summary_text", "text": text}}),
        );
        if incomplete {
            part_done["status"] = json!("incomplete");
        }
        out.events.push(done);
        out.events.push(part_done);
    }

    fn item_completed(&mut self, item: &Value, out: &mut Mapped) {
        let id = str_of(item, "id").to_string();
        let Some(done) = self.item_of(item, true) else {
            return;
        };
        if str_of(item, "type") == "userMessage" {
            // Shown at its start; `item.done` has no user message.
            self.ensure_added(&id, item, out);
            self.forget(&id);
            out.facts.push(Fact::Item(done));
            return;
        }
        let index = self.ensure_added(&id, item, out);
        self.finish(&id, done, index, item, out);
    }

    /// The `done` events of an item (its final codex view `item`), and its fact.
    fn finish(
        &mut self,
        id: &str,
        done: Value,
        index: Option<u64>,
        item: &Value,
        out: &mut Mapped,
    ) {
        let Some(open) = self.open.get(id) else {
            return;
        };
        let (stream, announced) = (open.stream, open.parts.len());
        match stream {
            Stream::Message => {
                let text = done["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let fields = json!({"item_id": id, "output_index": index, "content_index": 0});
                let text_done = self.event(
                    "agent.session.turn.output_text.done",
                    fields.clone().merged(json!({"text": text})),
                );
                let part_done = self.event(
                    "agent.session.turn.content_part.done",
                    fields.merged(json!({"part": {"type": "output_text", "text": text}})),
                );
                out.events.push(text_done);
                out.events.push(part_done);
            }
            Stream::Reasoning => {
                let summary: Vec<String> = item["summary"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect();
                for (part, text) in summary.iter().enumerate() {
                    if part >= announced {
                        self.summary_part(id, part, out);
                    }
                    self.close_part(id, part, Some(text), out);
                }
                for part in summary.len()..announced {
                    self.close_part(id, part, None, out);
                }
            }
            Stream::Other => {}
        }
        let event = self.event(
            "agent.session.turn.item.done",
            json!({"item": done, "output_index": index.unwrap_or(0)}),
        );
        out.events.push(event);
        self.forget(id);
        out.facts.push(Fact::Item(done));
    }

    fn forget(&mut self, id: &str) {
        self.open.remove(id);
        self.order.retain(|o| o != id);
    }

    /// codex's `item/tool/call` request params: the pending call (a fact to register
    /// before the events go out) and its `item.added`. `None` when the request is not
    /// this turn's.
    pub fn tool_call(&mut self, params: &Value) -> Option<Mapped> {
        if !self.ours("item/tool/call", params) {
            return None;
        }
        let mut pending = tool_call(params, &self.turn_id)?;
        let ours = self.our_id(&pending.call_id, false);
        let codex_item = json!({"type": "dynamicToolCall", "id": ours,
                                "tool": pending.name, "arguments": pending.arguments,
                                "status": "inProgress"});
        if let Some(item) = self.item_of(&codex_item, false) {
            pending.item = item;
        }
        let mut out = Mapped::default();
        out.facts.push(Fact::ToolCall(pending.clone()));
        self.ensure_added(&ours, &codex_item, &mut out);
        Some(out)
    }

    /// The client answered call `call_id`: the JSON-RPC result for codex, and the
    /// `function_call_output` item's `item.added` and fact.
    pub fn tool_result(&mut self, call_id: &str, result: &ToolResult) -> (Value, Mapped) {
        let mut item = function_call_output_item(call_id, &self.turn_id, result);
        // The model's call ids may repeat across sessions: the output's id is ours.
        item["id"] = json!(format!("{}_output", self.our_id(call_id, false)));
        let index = self.next_index;
        self.next_index += 1;
        let event = self.event(
            "agent.session.turn.item.added",
            json!({"item": item, "output_index": index}),
        );
        let out = Mapped {
            events: vec![event],
            facts: vec![Fact::Item(item)],
        };
        (tool_response(result), out)
    }

    fn turn_completed(&mut self, turn: &Value, out: &mut Mapped) {
        let status = match turn["status"].as_str() {
            Some("completed") => "completed",
            Some("interrupted") => "cancelled",
            _ => "failed",
        };
        self.ended = true;
        // What never completed is closed as incomplete, in the order it was seen, with
        // what streamed of it.
        for id in std::mem::take(&mut self.order) {
            let Some(open) = self.open.get(&id) else {
                continue;
            };
            let (added, index) = (open.added, open.output_index);
            let mut item = open.item.clone();
            match open.stream {
                Stream::Message => item["text"] = json!(open.text),
                Stream::Reasoning => {
                    let streamed: Vec<&str> = open.parts.iter().map(|(t, _)| t.as_str()).collect();
                    item["summary"] = json!(streamed);
                }
                Stream::Other => {}
            }
            item["status"] = json!("interrupted");
            let Some(mut done) = self.item_of(&item, true) else {
                continue;
            };
            if str_of(&item, "type") == "userMessage" {
                self.open.remove(&id);
                out.facts.push(Fact::Item(done));
                continue;
            }
            if !added {
                // A tool call codex never asked for: nobody saw it, nobody can answer it.
                self.open.remove(&id);
                continue;
            }
            done["status"] = json!("incomplete");
            self.finish(&id, done, index, &item, out);
        }
        let now_total = self.last_total.unwrap_or(self.prior_total);
        let usage = now_total.since(self.prior_total).usage();
        let error = match status {
            "failed" => Some(
                self.error
                    .clone()
                    .or_else(|| (!turn["error"].is_null()).then(|| turn_error(&turn["error"])))
                    .unwrap_or_else(|| turn_error(&Value::Null)),
            ),
            _ => None,
        };
        self.turn["status"] = json!(status);
        if let Some(at) = turn["startedAt"].as_i64() {
            self.turn["started_at"] = json!(at);
        }
        if let Some(at) = turn["completedAt"].as_i64() {
            self.turn["completed_at"] = json!(at);
        }
        self.turn["error"] = error.clone().unwrap_or(Value::Null);
        self.turn["usage"] = usage.clone();
        let kind = match status {
            "completed" => "agent.session.turn.completed",
            "cancelled" => "agent.session.turn.cancelled",
            _ => "agent.session.turn.failed",
        };
        let event = self.event(kind, json!({"turn": self.turn, "usage": usage}));
        out.events.push(event);
        out.facts.push(Fact::TurnEnded(TurnEnd {
            status,
            error,
            usage,
            thread_total: now_total,
            turn: self.turn.clone(),
        }));
    }
}

// ---------------------------------------------------------------- agent and input

/// A field codex cannot honour: `param` names it (`agent.tools[2].name`), `message` says
/// what to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Unsupported {
    pub param: String,
    pub message: String,
}

fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Unsupported {
    Unsupported {
        param: param.into(),
        message: message.into(),
    }
}

/// What an agent becomes for codex.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadPlan {
    /// `thread/start` params. Its `config` is per thread and **not persisted** by codex:
    /// send the same on every `thread/resume` and `thread/fork`.
    pub thread_start: Value,
    /// What every `turn/start` of the session adds (`outputSchema`).
    pub turn_start: Value,
    /// Variables the app-server process's environment must hold (MCP bearer tokens,
    /// under the names `thread_start` refers to).
    pub env: Vec<(String, String)>,
}

/// The environment variables that carry MCP servers' bearers to the app-server.
const MCP_TOKEN_PREFIX: &str = "ABX_MCP_TOKEN_";

/// A name codex accepts for a dynamic tool or a config key: `^[a-zA-Z0-9_-]{1,128}$`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// codex's own function tools (0.169.0 offers these to the model): a dynamic tool of the
/// same name would shadow one of them.
const BUILTIN_TOOLS: [&str; 10] = [
    "exec_command",
    "write_stdin",
    "request_user_input",
    "view_image",
    "get_goal",
    "create_goal",
    "update_goal",
    "apply_patch",
    "shell",
    "update_plan",
];

/// The dynamic tool an agent's `automations` tool becomes: the session's actor answers
/// its calls itself (`super::automations::agent_tool`), no client does. The name is
/// reserved: an application's function may not take it.
pub const AUTOMATIONS_TOOL: &str = "automations";

/// What the model is told of the automations tool, and the arguments it takes.
fn automations_tool() -> Value {
    json!({
        "type": "function",
        "name": AUTOMATIONS_TOOL,
        "description": "Schedule your own wakeups in this session. At each wakeup you receive the automation's instructions as a user message. action=create with name, instructions, and either delay_seconds or run_at (a Unix time in seconds) for one wakeup, or expression (a cron expression, five fields) and timezone (IANA, default UTC) for a periodic one; action=list shows this session's automations; action=pause, resume or delete with automation_id.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["create", "list", "pause", "resume", "delete"]},
                "name": {"type": "string", "description": "create: a short name."},
                "instructions": {"type": "string", "description": "create: the message you receive at each wakeup."},
                "delay_seconds": {"type": "integer", "minimum": 1, "description": "create, once: seconds from now."},
                "run_at": {"type": "integer", "description": "create, once: a Unix time in seconds."},
                "expression": {"type": "string", "description": "create, periodic: a cron expression such as \"0 9 * * 1-5\"."},
                "timezone": {"type": "string", "description": "create, periodic: an IANA time zone (default UTC)."},
                "automation_id": {"type": "string", "description": "pause, resume, delete: which automation."}
            },
            "required": ["action"]
        }
    })
}

/// The namespace deferred function tools are offered in (codex loads deferred tools
/// only from a namespace).
pub const DEFERRED_NAMESPACE: &str = "deferred_tools";

/// Present and not null.
fn given(value: &Value) -> Option<&Value> {
    (!value.is_null()).then_some(value)
}

/// The `thread/start` params of a session of `agent` (the SDK's `AgentSession.agent`, or
/// the create params' agent) in working directory `cwd`. The container is the sandbox:
/// codex runs commands without its own sandbox and never asks for approval (nobody is
/// there to give it). `agent.model` is passed as it is; resolving a runtime alias is
/// the caller's business.
pub fn thread_plan(agent: &Value, cwd: &str) -> Result<ThreadPlan, Unsupported> {
    let mut start = json!({"cwd": cwd, "approvalPolicy": "never", "sandbox": "danger-full-access"});
    let mut config = Map::new();
    let mut turn = json!({});
    let mut env = Vec::new();
    if let Some(model) = agent["model"].as_str().filter(|m| !m.is_empty()) {
        start["model"] = json!(model);
    }
    if let Some(instructions) = agent["instructions"].as_str().filter(|i| !i.is_empty()) {
        start["developerInstructions"] = json!(instructions);
    }
    if let Some(effort) = given(&agent["reasoning"]["effort"]) {
        config.insert("model_reasoning_effort".into(), effort.clone());
    }
    if let Some(summary) = given(&agent["reasoning"]["summary"]) {
        config.insert("model_reasoning_summary".into(), summary.clone());
    }
    match agent["service_tier"].as_str() {
        None | Some("auto") => {}
        Some(tier @ ("default" | "flex")) => start["serviceTier"] = json!(tier),
        Some(tier) => {
            return Err(unsupported(
                "agent.service_tier",
                format!(
                "codex has no {tier:?} service tier here: use \"auto\", \"default\" or \"flex\""
            ),
            ))
        }
    }
    if let Some(verbosity) = given(&agent["text"]["verbosity"]) {
        config.insert("model_verbosity".into(), verbosity.clone());
    }
    match agent["text"]["format"]["type"].as_str() {
        None | Some("text") => {}
        Some("json_schema") => match given(&agent["text"]["format"]["schema"]) {
            Some(schema) => turn["outputSchema"] = schema.clone(),
            None => {
                return Err(unsupported(
                    "agent.text.format.schema",
                    "a json_schema text format needs its schema",
                ))
            }
        },
        Some(other) => {
            return Err(unsupported(
                "agent.text.format.type",
                format!(
                    "codex cannot produce text format {other:?}: use \"text\" or \"json_schema\""
                ),
            ))
        }
    }
    let multi_agent = agent["multi_agent"]["enabled"].as_bool().unwrap_or(false);
    config.insert("features.multi_agent".into(), json!(multi_agent));
    if let Some(max) = given(&agent["multi_agent"]["max_concurrent_subagents"]) {
        config.insert("agents.max_threads".into(), max.clone());
    }
    if agent["compaction"]["async"].as_bool() == Some(true) {
        return Err(unsupported(
            "agent.compaction.async",
            "codex compacts a thread within its turn; asynchronous compaction is not available",
        ));
    }
    if agent["experimental"]["time_awareness"].as_bool() == Some(true) {
        return Err(unsupported(
            "agent.experimental.time_awareness",
            "codex has no time awareness option",
        ));
    }
    // codex offers web search unless told not to: only an agent with the tool gets it.
    config.insert("web_search".into(), json!("disabled"));
    let mut functions = Vec::new();
    let mut deferred = Vec::new();
    for (i, tool) in agent["tools"].as_array().into_iter().flatten().enumerate() {
        let param = format!("agent.tools[{i}]");
        match str_of(tool, "type") {
            "function" => {
                let name = str_of(tool, "name");
                if !valid_name(name) {
                    return Err(unsupported(
                        format!("{param}.name"),
                        format!("function name {name:?} must match ^[a-zA-Z0-9_-]+$ and be at most 128 characters"),
                    ));
                }
                if name == AUTOMATIONS_TOOL {
                    return Err(unsupported(
                        format!("{param}.name"),
                        "\"automations\" is the name of the automations tool's function: rename the function (or use {\"type\": \"automations\"})",
                    ));
                }
                if BUILTIN_TOOLS.contains(&name) {
                    return Err(unsupported(
                        format!("{param}.name"),
                        format!(
                            "{name:?} is the name of one of codex's own tools: rename the function"
                        ),
                    ));
                }
                if tool["async"].as_bool() == Some(true) {
                    return Err(unsupported(
                        format!("{param}.async"),
                        "codex waits for every function's result within the turn: asynchronous functions are not available",
                    ));
                }
                let mut spec = json!({"type": "function", "name": name,
                                      "description": str_of(tool, "description"),
                                      "inputSchema": given(&tool["parameters"]).cloned()
                                          .unwrap_or_else(|| json!({"type": "object"}))});
                if tool["defer_loading"].as_bool() == Some(true) {
                    spec["deferLoading"] = json!(true);
                    deferred.push(spec);
                } else {
                    functions.push(spec);
                }
            }
            "mcp" => mcp_server(tool, &param, &mut config, &mut env)?,
            // Answered by the session itself (the actor runs it).
            "automations" => functions.push(automations_tool()),
            // codex searches the deferred functions itself (their namespace below).
            "tool_search" => {}
            "web_search" => {
                if given(&tool["allowed_domains"]).is_some() || given(&tool["location"]).is_some() {
                    return Err(unsupported(
                        format!("{param}.allowed_domains"),
                        "codex's web search takes no domain list or location",
                    ));
                }
                if !matches!(tool["context_size"].as_str(), None | Some("medium")) {
                    return Err(unsupported(
                        format!("{param}.context_size"),
                        "codex's web search has one context size: \"medium\"",
                    ));
                }
                let mode = tool["mode"].as_str().unwrap_or("live");
                config.insert("web_search".into(), json!(mode));
            }
            other => {
                return Err(unsupported(
                    format!("{param}.type"),
                    format!("codex has no {other:?} tool: use function, mcp or web_search tools"),
                ))
            }
        }
    }
    if !deferred.is_empty() {
        functions.push(json!({"type": "namespace", "name": DEFERRED_NAMESPACE,
                              "description": "Functions of the application, loaded on demand.",
                              "tools": deferred}));
    }
    if !functions.is_empty() {
        start["dynamicTools"] = json!(functions);
    }
    if !env.is_empty() {
        // The bearers are the app-server's, for its MCP clients: the commands codex runs
        // for the model inherit its environment unless told not to.
        config.insert(
            "shell_environment_policy.exclude".into(),
            json!([format!("{MCP_TOKEN_PREFIX}*")]),
        );
    }
    start["config"] = Value::Object(config);
    Ok(ThreadPlan {
        thread_start: start,
        turn_start: turn,
        env,
    })
}

/// An `mcp` tool as per-thread `mcp_servers.<label>.*` dotted keys (dotted keys merge
/// with the servers of `config.toml`; a nested table would replace them).
fn mcp_server(
    tool: &Value,
    param: &str,
    config: &mut Map<String, Value>,
    env: &mut Vec<(String, String)>,
) -> Result<(), Unsupported> {
    let label = str_of(tool, "server_label");
    if !valid_name(label) {
        return Err(unsupported(
            format!("{param}.server_label"),
            format!("MCP server label {label:?} must match ^[a-zA-Z0-9_-]+$"),
        ));
    }
    if given(&tool["credential_id"]).is_some() {
        return Err(unsupported(
            format!("{param}.credential_id"),
            "vault credentials are not available to codex here: pass the token as transport.authorization",
        ));
    }
    if tool["request_metadata"]
        .as_object()
        .is_some_and(|m| !m.is_empty())
    {
        return Err(unsupported(
            format!("{param}.request_metadata"),
            "codex sends no request metadata to MCP servers",
        ));
    }
    let key = |field: &str| format!("mcp_servers.{label}.{field}");
    let transport = &tool["transport"];
    match str_of(transport, "type") {
        "http" => {
            let url = str_of(transport, "server_url");
            if url.is_empty() {
                return Err(unsupported(
                    format!("{param}.transport.server_url"),
                    "an http MCP transport needs its server_url",
                ));
            }
            config.insert(key("url"), json!(url));
            if let Some(token) = transport["authorization"]
                .as_str()
                .filter(|t| !t.is_empty())
            {
                let token = token.strip_prefix("Bearer ").unwrap_or(token);
                let var = format!(
                    "{MCP_TOKEN_PREFIX}{}",
                    label.to_ascii_uppercase().replace('-', "_")
                );
                config.insert(key("bearer_token_env_var"), json!(var));
                env.push((var, token.to_string()));
            }
            if let Some(headers) = given(&transport["headers"]) {
                config.insert(key("http_headers"), headers.clone());
            }
        }
        "stdio" => {
            let command = str_of(transport, "command");
            if command.is_empty() {
                return Err(unsupported(
                    format!("{param}.transport.command"),
                    "a stdio MCP transport needs its command",
                ));
            }
            config.insert(key("command"), json!(command));
            for (field, theirs) in [
                ("args", "args"),
                ("env", "env"),
                ("env_vars", "env_vars"),
                ("cwd", "cwd"),
            ] {
                if let Some(value) = given(&transport[theirs]) {
                    config.insert(key(field), value.clone());
                }
            }
        }
        other => {
            return Err(unsupported(
                format!("{param}.transport.type"),
                format!("codex has no {other:?} MCP transport: use http or stdio"),
            ))
        }
    }
    if let Some(allowed) = given(&tool["allowed_tools"]) {
        config.insert(key("enabled_tools"), allowed.clone());
    }
    config.insert(
        key("required"),
        json!(tool["required"].as_bool().unwrap_or(false)),
    );
    // Nobody is there to approve a call: the agent's own servers are trusted.
    config.insert(key("default_tools_approval_mode"), json!("approve"));
    Ok(())
}

/// `turn/start` params: the thread, the input, and what the plan adds to every turn.
pub fn turn_start_params(thread_id: &str, input: Vec<Value>, plan: &ThreadPlan) -> Value {
    json!({"threadId": thread_id, "input": input}).merged(plan.turn_start.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap as Ids;

    /// One turn of a captured session, mapped.
    struct Run {
        events: Vec<Value>,
        facts: Vec<Fact>,
    }

    /// Our `Turn` object for turn `n` of the replayed session.
    fn turn_object(n: usize) -> Value {
        json!({"id": format!("turn_{n}"), "object": "agent.session.turn", "session_id": "sess_1",
               "agent_id": "agent_1", "created_at": 1, "status": "queued", "subagent_id": null,
               "started_at": null, "completed_at": null, "error": null, "usage": null})
    }

    /// Replays a capture of `tests/fixtures/codex/` through one mapper per turn, as the
    /// session layer would: every notification and server request goes to the turn's
    /// mapper, and each answer the capture sent to a tool call goes through
    /// [`EventMapper::tool_result`] (whose JSON-RPC result must be what was sent).
    fn replay(capture: &str) -> Vec<Run> {
        let mut asked: Ids<String, String> = Ids::new();
        let mut calls: Ids<String, String> = Ids::new();
        let mut thread = String::new();
        let mut runs: Vec<Run> = Vec::new();
        let mut mapper: Option<EventMapper> = None;
        // The thread's totals at the end of the last turn: where the next one starts.
        let mut total = Totals::default();
        let take = |mapper: &mut Option<EventMapper>,
                    runs: &mut Vec<Run>,
                    total: &mut Totals,
                    mapped: Mapped| {
            let run = runs.last_mut().expect("a turn started");
            for fact in &mapped.facts {
                if let Fact::TurnEnded(end) = fact {
                    *total = end.thread_total;
                    *mapper = None;
                }
            }
            run.events.extend(mapped.events);
            run.facts.extend(mapped.facts);
        };
        for line in capture.lines() {
            let entry: Value = serde_json::from_str(line).unwrap();
            if let Some(sent) = entry.get("sent") {
                if let (Some(id), Some(method)) = (sent.get("id"), sent["method"].as_str()) {
                    asked.insert(id.to_string(), method.to_string());
                    if method == "turn/start" {
                        mapper = Some(EventMapper::new(
                            turn_object(runs.len()),
                            &thread,
                            None,
                            total,
                        ));
                        runs.push(Run {
                            events: Vec::new(),
                            facts: Vec::new(),
                        });
                    }
                } else if let Some(call_id) =
                    sent.get("id").and_then(|id| calls.remove(&id.to_string()))
                {
                    // The capture's answer to a tool call: the client's tool_result.
                    let result = &sent["result"];
                    let tool_result = ToolResult {
                        success: result["success"].as_bool().unwrap(),
                        output: Some(result["contentItems"][0]["text"].clone()),
                        error: None,
                    };
                    let m = mapper.as_mut().expect("a running turn");
                    let (answer, mapped) = m.tool_result(&call_id, &tool_result);
                    assert_eq!(&answer, result, "tool_response makes what codex was sent");
                    take(&mut mapper, &mut runs, &mut total, mapped);
                }
                continue;
            }
            let message = &entry["recv"];
            match (message["method"].as_str(), message.get("id")) {
                (None, Some(id))
                    if asked.get(&id.to_string()).map(String::as_str) == Some("thread/start") =>
                {
                    thread = message["result"]["thread"]["id"]
                        .as_str()
                        .unwrap()
                        .to_string();
                }
                (Some("item/tool/call"), Some(id)) => {
                    calls.insert(
                        id.to_string(),
                        message["params"]["callId"].as_str().unwrap().into(),
                    );
                    let m = mapper.as_mut().expect("a running turn");
                    let mapped = m.tool_call(&message["params"]).expect("this turn's call");
                    take(&mut mapper, &mut runs, &mut total, mapped);
                }
                (Some(method), None) => {
                    if let Some(m) = mapper.as_mut() {
                        let mapped = m.notification(method, &message["params"]);
                        take(&mut mapper, &mut runs, &mut total, mapped);
                    }
                }
                _ => {}
            }
        }
        runs
    }

    fn fixture(name: &str) -> &'static str {
        match name {
            "text" => include_str!("../../tests/fixtures/codex/text.jsonl"),
            "shell" => include_str!("../../tests/fixtures/codex/shell.jsonl"),
            "tool" => include_str!("../../tests/fixtures/codex/tool.jsonl"),
            "reason" => include_str!("../../tests/fixtures/codex/reason.jsonl"),
            "interrupt" => include_str!("../../tests/fixtures/codex/interrupt.jsonl"),
            "fail" => include_str!("../../tests/fixtures/codex/fail.jsonl"),
            _ => unreachable!(),
        }
    }

    const FIXTURES: [&str; 6] = ["text", "shell", "tool", "reason", "interrupt", "fail"];

    /// The event types, with the item type for item events, deltas of a run as one.
    fn kinds(events: &[Value]) -> Vec<String> {
        let mut kinds: Vec<String> = Vec::new();
        for event in events {
            let kind = str_of(event, "type").trim_start_matches("agent.session.turn.");
            let kind = match event["item"]["type"].as_str() {
                Some(item) => format!("{kind} {item}"),
                None => kind.to_string(),
            };
            if !(kind.ends_with(".delta") && kinds.last() == Some(&kind)) {
                kinds.push(kind);
            }
        }
        kinds
    }

    fn ended(run: &Run) -> &TurnEnd {
        run.facts
            .iter()
            .find_map(|f| match f {
                Fact::TurnEnded(end) => Some(end),
                _ => None,
            })
            .expect("the turn ended")
    }

    fn stored(run: &Run) -> Vec<&Value> {
        run.facts
            .iter()
            .filter_map(|f| match f {
                Fact::Item(item) => Some(item),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_text_answer_streams_in_the_sdk_order_and_usage_is_per_turn() {
        let runs = replay(fixture("text"));
        assert_eq!(runs.len(), 2);
        for (n, run) in runs.iter().enumerate() {
            assert_eq!(
                kinds(&run.events),
                [
                    "in_progress",
                    "item.added message",
                    "item.added message",
                    "content_part.added",
                    "output_text.delta",
                    "output_text.done",
                    "content_part.done",
                    "item.done message",
                    "completed",
                ],
                "turn {n}"
            );
            for event in &run.events {
                assert_eq!(event["session_id"], "sess_1");
                assert_eq!(event["turn_id"], format!("turn_{n}"));
            }
            let user = &run.events[1];
            assert_eq!(user["item"]["role"], "user");
            assert_eq!(
                user["output_index"],
                Value::Null,
                "user messages have no output index"
            );
            let answer = &run.events[2];
            assert_eq!(answer["item"]["role"], "assistant");
            assert_eq!(answer["item"]["status"], "in_progress");
            assert_eq!(answer["output_index"], 0);
            let done = run
                .events
                .iter()
                .rfind(|e| e["type"] == "agent.session.turn.item.done")
                .unwrap();
            assert_eq!(done["item"]["status"], "completed");
            assert_eq!(
                done["item"]["phase"],
                Value::Null,
                "codex gave no phase: it counts as the answer"
            );
            let streamed: String = run
                .events
                .iter()
                .filter(|e| e["type"] == "agent.session.turn.output_text.delta")
                .map(|e| e["delta"].as_str().unwrap())
                .collect();
            assert_eq!(
                streamed,
                done["item"]["content"][0]["text"].as_str().unwrap()
            );
            let end = ended(run);
            assert_eq!(end.status, "completed");
            // Each stub answer costs 13 tokens; codex reports the thread's running total.
            assert_eq!(end.usage["total_tokens"], 13, "turn {n}: {}", end.usage);
            assert_eq!(end.usage["input_tokens_details"]["cached_tokens"], 2);
            assert_eq!(end.thread_total.total, 13 * (n as u64 + 1));
            let last = run.events.last().unwrap();
            assert_eq!(last["turn"]["status"], "completed");
            assert_eq!(last["usage"], end.usage);
            assert!(last["turn"]["started_at"].is_i64() && last["turn"]["completed_at"].is_i64());
            let items = stored(run);
            assert_eq!(items.len(), 2, "the user message and the answer are stored");
            assert!(items
                .iter()
                .all(|i| i["x_agent_sandbox"]["compute"] == "codex"
                    && i["turn_id"] == format!("turn_{n}")));
        }
        assert_eq!(done_text(&runs[0]), "hello there",);
        assert_eq!(done_text(&runs[1]), "again");
    }

    /// A provider that reuses ids (here: the same captured session replayed twice, as
    /// two sessions would see it) never makes two items share an id: ours are unique,
    /// codex's stays on each item, and every event names the item by our id.
    #[test]
    fn items_get_ids_of_ours_whatever_ids_the_provider_reuses() {
        let mut ours = std::collections::HashSet::new();
        let mut codex = Vec::new();
        for _session in 0..2 {
            for run in replay(fixture("text")) {
                for item in stored(&run) {
                    let id = item["id"].as_str().unwrap().to_string();
                    assert!(id.starts_with("item_"), "{item}");
                    assert!(ours.insert(id), "an id repeats: {item}");
                    codex.push(item["x_agent_sandbox"]["codex_item_id"].clone());
                }
                let named: std::collections::HashSet<&str> = run
                    .events
                    .iter()
                    .filter_map(|e| e["item_id"].as_str().or(e["item"]["id"].as_str()))
                    .collect();
                assert!(named.iter().all(|id| id.starts_with("item_")), "{named:?}");
            }
        }
        let (first, second) = codex.split_at(codex.len() / 2);
        assert_eq!(first, second, "the provider's ids were the same both times");
        assert!(first.iter().all(Value::is_string));
    }

    fn done_text(run: &Run) -> String {
        run.events
            .iter()
            .find(|e| e["type"] == "agent.session.turn.output_text.done")
            .map(|e| e["text"].as_str().unwrap().to_string())
            .unwrap()
    }

    #[test]
    fn a_dynamic_tool_call_is_held_for_its_request_and_answered() {
        let runs = replay(fixture("tool"));
        let run = &runs[0];
        assert_eq!(
            kinds(&run.events),
            [
                "in_progress",
                "item.added message",
                "item.added function_call",
                "item.added function_call_output",
                "item.done function_call",
                "item.added message",
                "content_part.added",
                "output_text.delta",
                "output_text.done",
                "content_part.done",
                "item.done message",
                "completed",
            ]
        );
        let pending = run
            .facts
            .iter()
            .find_map(|f| match f {
                Fact::ToolCall(p) => Some(p),
                _ => None,
            })
            .unwrap();
        assert_eq!(pending.name, "lookup_weather");
        assert_eq!(pending.arguments, json!({"city": "Paris"}));
        assert_eq!(
            pending.required_action,
            json!({"type": "function_call", "call_id": pending.call_id, "name": "lookup_weather",
                   "arguments": {"city": "Paris"}, "turn_id": "turn_0"})
        );
        let added = &run.events[2];
        assert_eq!(added["item"]["call_id"], pending.call_id.as_str());
        assert_eq!(added["item"]["status"], "in_progress");
        let output = &run.events[3];
        assert_eq!(output["item"]["output"], "sunny");
        assert_eq!(output["item"]["call_id"], pending.call_id.as_str());
        let call_done = &run.events[4];
        assert_eq!(call_done["item"]["status"], "completed");
        assert_eq!(call_done["output_index"], added["output_index"]);
        let indexes: Vec<&Value> = run
            .events
            .iter()
            .filter_map(|e| e.get("output_index"))
            .collect();
        assert_eq!(
            indexes.iter().filter_map(|i| i.as_u64()).max(),
            Some(2),
            "call, output and answer: 0, 1, 2: {indexes:?}"
        );
        assert_eq!(done_text(run), "tool said: sunny");
    }

    #[test]
    fn a_shell_command_streams_its_output() {
        let run = &replay(fixture("shell"))[0];
        assert_eq!(
            kinds(&run.events)[..5],
            [
                "in_progress",
                "item.added message",
                "item.added command_execution",
                "agent.output.command_execution_output.delta",
                "item.done command_execution",
            ]
        );
        let done = &run
            .events
            .iter()
            .find(|e| {
                e["item"]["type"] == "command_execution"
                    && e["type"] == "agent.session.turn.item.done"
            })
            .unwrap()["item"];
        assert_eq!(done["exit_code"], 0);
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"], "one\ntwo\n");
        assert!(
            done["command"].as_str().unwrap().contains("printf"),
            "{done}"
        );
        assert!(
            done["duration_ms"].is_u64() && done["cwd"].is_string(),
            "{done}"
        );
        assert_eq!(
            done["x_agent_sandbox"]["differences"],
            json!(["tools_run_locally"])
        );
        let delta = run
            .events
            .iter()
            .find(|e| e["type"] == "agent.output.command_execution_output.delta")
            .unwrap();
        assert_eq!(delta["item_id"], done["id"]);
        assert_eq!(delta["output_index"], 0);
        assert_eq!(done_text(run), "done");
    }

    #[test]
    fn a_reasoning_summary_streams_part_by_part() {
        let run = &replay(fixture("reason"))[0];
        assert_eq!(
            kinds(&run.events)[..8],
            [
                "in_progress",
                "item.added message",
                "item.added reasoning",
                "reasoning_summary_part.added",
                "reasoning_summary_text.delta",
                "reasoning_summary_text.done",
                "reasoning_summary_part.done",
                "item.done reasoning",
            ]
        );
        let done = run
            .events
            .iter()
            .find(|e| e["type"] == "agent.session.turn.item.done")
            .unwrap();
        assert_eq!(
            done["item"]["summary"],
            json!([{"type": "summary_text", "text": "checking the sky"}])
        );
        let text_done = run
            .events
            .iter()
            .find(|e| e["type"] == "agent.session.turn.reasoning_summary_text.done")
            .unwrap();
        assert_eq!(text_done["text"], "checking the sky");
        assert_eq!(text_done["summary_index"], 0);
        assert_eq!(done_text(run), "reasoned");
        let answer = run
            .events
            .iter()
            .rfind(|e| e["type"] == "agent.session.turn.item.done")
            .unwrap();
        assert_eq!(
            answer["output_index"], 1,
            "the answer follows the reasoning"
        );
    }

    #[test]
    fn an_interrupted_turn_closes_its_partial_answer_and_is_cancelled() {
        let run = &replay(fixture("interrupt"))[0];
        assert_eq!(
            kinds(&run.events),
            [
                "in_progress",
                "item.added message",
                "item.added message",
                "content_part.added",
                "output_text.delta",
                "output_text.done",
                "content_part.done",
                "item.done message",
                "cancelled",
            ]
        );
        let done = run
            .events
            .iter()
            .rfind(|e| e["type"] == "agent.session.turn.item.done")
            .unwrap();
        assert_eq!(
            done["item"]["status"], "incomplete",
            "never completed: not a result"
        );
        let streamed: String = run
            .events
            .iter()
            .filter(|e| e["type"] == "agent.session.turn.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(
            done["item"]["content"][0]["text"].as_str().unwrap(),
            streamed
        );
        let end = ended(run);
        assert_eq!((end.status, end.error.is_none()), ("cancelled", true));
        assert_eq!(end.turn["status"], "cancelled");
        assert_eq!(
            stored(run).len(),
            2,
            "the user message and the partial answer"
        );
    }

    #[test]
    fn a_failed_turn_says_why() {
        let run = &replay(fixture("fail"))[0];
        assert_eq!(
            kinds(&run.events),
            ["in_progress", "item.added message", "failed"]
        );
        let end = ended(run);
        let error = end.error.as_ref().unwrap();
        assert_eq!(
            error["code"], "server_error",
            "codex said internalServerError"
        );
        assert!(!error["message"].as_str().unwrap().is_empty());
        assert_eq!(run.events[2]["turn"]["error"], *error);
        assert_eq!(end.usage["total_tokens"], 0);
    }

    #[test]
    fn notifications_of_other_threads_and_turns_are_not_this_turns() {
        let mut mapper = EventMapper::new(turn_object(0), "T", Some("U1"), Totals::default());
        let item = json!({"type": "agentMessage", "id": "m", "text": "", "phase": null});
        for params in [
            json!({"threadId": "child", "turnId": "U1", "item": item}),
            json!({"threadId": "T", "turnId": "U0", "item": item}),
        ] {
            assert_eq!(
                mapper.notification("item/started", &params),
                Mapped::default()
            );
        }
        let mine = mapper.notification(
            "item/started",
            &json!({"threadId": "T", "turnId": "U1", "item": item}),
        );
        assert_eq!(mine.events.len(), 2, "item.added and content_part.added");
        // A delta for an item never started is shown with its item first.
        let mut mapper = EventMapper::new(turn_object(0), "T", Some("U1"), Totals::default());
        let delta = mapper.notification(
            "item/reasoning/summaryTextDelta",
            &json!({"threadId": "T", "turnId": "U1", "itemId": "r", "delta": "x", "summaryIndex": 1}),
        );
        assert_eq!(
            kinds(&delta.events),
            [
                "item.added reasoning",
                "reasoning_summary_part.added",
                "reasoning_summary_part.added",
                "reasoning_summary_text.delta",
            ]
        );
        assert_eq!(delta.events[2]["summary_index"], 1);
        // A tool call: the pending call to register, and its item shown.
        let mut mapper = EventMapper::new(turn_object(0), "T", Some("U1"), Totals::default());
        let params = json!({"threadId": "T", "turnId": "U1", "callId": "c1", "namespace": null,
                            "tool": "lookup", "arguments": {"q": 1}});
        assert_eq!(
            mapper
                .tool_call(&json!({"threadId": "T", "turnId": "U0", "callId": "c1", "tool": "x"})),
            None
        );
        let call = mapper.tool_call(&params).unwrap();
        assert!(
            matches!(&call.facts[..], [Fact::ToolCall(p)] if p.call_id == "c1"),
            "{:?}",
            call.facts
        );
        assert_eq!(kinds(&call.events), ["item.added function_call"]);
        assert_eq!(call.events[0]["output_index"], 0);
        assert!(!mapper.ended);
        let end = mapper.notification(
            "turn/completed",
            &json!({"threadId": "T", "turn": {"id": "U1", "status": "interrupted", "error": null}}),
        );
        // The call never answered is closed incomplete; the turn is cancelled.
        assert_eq!(kinds(&end.events), ["item.done function_call", "cancelled"]);
        assert_eq!(end.events[0]["item"]["status"], "incomplete");
        assert!(mapper.ended);
        assert_eq!(mapper.turn()["status"], "cancelled");
        let late = mapper.notification(
            "item/started",
            &json!({"threadId": "T", "turnId": "U1", "item": item}),
        );
        assert_eq!(late, Mapped::default(), "nothing after the end");
    }

    #[test]
    fn items_take_sdk_shapes() {
        let item = |v: Value| session_item(&v, "t", true).unwrap();
        let mcp = item(
            json!({"type": "mcpToolCall", "id": "c", "server": "srv", "tool": "t1", "status": "failed",
            "arguments": {"a": 1}, "result": null, "error": {"message": "boom"}}),
        );
        assert_eq!(
            (
                mcp["type"].clone(),
                mcp["server_label"].clone(),
                mcp["error"].clone(),
                mcp["status"].clone()
            ),
            (
                json!("mcp_call"),
                json!("srv"),
                json!("boom"),
                json!("failed")
            )
        );
        let search = item(
            json!({"type": "webSearch", "id": "w", "query": "q", "action": {"type": "openPage", "url": "https://x"}}),
        );
        assert_eq!(
            search["action"],
            json!({"type": "open_page", "url": "https://x"})
        );
        assert_eq!(search["status"], "completed");
        let spawn = item(
            json!({"type": "collabAgentToolCall", "id": "s", "tool": "spawnAgent", "status": "interrupted",
            "senderThreadId": "T", "receiverThreadIds": ["C"], "prompt": "go", "model": "m", "reasoningEffort": null, "agentsStates": {}}),
        );
        assert_eq!(spawn["type"], "create_subagent_call");
        assert_eq!(spawn["agent_id"], "C");
        assert_eq!(
            spawn["content"],
            json!([{"type": "output_text", "text": "go"}])
        );
        assert_eq!(spawn["status"], "incomplete");
        let wait = item(
            json!({"type": "collabAgentToolCall", "id": "w", "tool": "wait", "status": "completed",
            "senderThreadId": "T", "receiverThreadIds": ["C", "D"], "prompt": null}),
        );
        assert_eq!(wait["recipient_agent_ids"], json!(["C", "D"]));
        let declined = item(
            json!({"type": "commandExecution", "id": "x", "command": "rm", "cwd": "/", "status": "declined",
            "aggregatedOutput": null, "exitCode": null, "durationMs": null}),
        );
        assert_eq!(declined["status"], "failed");
        let phase =
            item(json!({"type": "agentMessage", "id": "m", "text": "t", "phase": "commentary"}));
        assert_eq!(phase["phase"], "commentary");
        let partial = item(
            json!({"type": "agentMessage", "id": "m", "text": "t", "phase": "partial_answer"}),
        );
        assert_eq!(partial["phase"], Value::Null);
        let user = item(json!({"type": "userMessage", "id": "u", "content": [
            {"type": "text", "text": "hi", "text_elements": []}, {"type": "image", "url": "data:image/png;base64,AA"}]}));
        assert_eq!(
            user["content"][1],
            json!({"type": "input_image", "image_url": "data:image/png;base64,AA"})
        );
        for none in [
            json!({"type": "fileChange", "id": "f", "changes": [], "status": "completed"}),
            json!({"type": "plan", "id": "p", "text": "x"}),
            json!({"type": "contextCompaction", "id": "c"}),
            json!({"type": "collabAgentToolCall", "id": "l", "tool": "listAgents", "status": "completed"}),
        ] {
            assert_eq!(session_item(&none, "t", true), None, "{none}");
        }
    }

    #[test]
    fn tool_results_answer_codex() {
        let ok = ToolResult::of(&json!({"success": true, "output": [
            {"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "data:image/png;base64,AA"}]}));
        assert_eq!(
            tool_response(&ok),
            json!({"contentItems": [{"type": "inputText", "text": "a"},
                                    {"type": "inputImage", "imageUrl": "data:image/png;base64,AA"}],
                   "success": true})
        );
        let failed = ToolResult::of(&json!({"success": false, "error": "Tool handler failed."}));
        assert_eq!(
            tool_response(&failed),
            json!({"contentItems": [{"type": "inputText", "text": "Tool handler failed."}], "success": false})
        );
        let item = function_call_output_item("c1", "t", &failed);
        assert_eq!(
            (item["status"].clone(), item["error"].clone()),
            (json!("failed"), json!("Tool handler failed."))
        );
        assert_eq!(tool_call(&json!({"callId": "", "tool": "x"}), "t"), None);
    }

    #[test]
    fn error_codes_follow_codex_error_info() {
        assert_eq!(
            error_code(&json!("contextWindowExceeded")),
            "context_length_exceeded"
        );
        assert_eq!(
            error_code(&json!({"responseStreamDisconnected": {"httpStatusCode": 502}})),
            "connection_failed"
        );
        assert_eq!(
            error_code(&json!({"activeTurnNotSteerable": {"turnKind": "review"}})),
            "active_turn_not_steerable"
        );
        assert_eq!(error_code(&json!("unauthorized")), "authentication_error");
        assert_eq!(error_code(&json!("somethingNew")), "internal_error");
        assert_eq!(error_code(&Value::Null), "internal_error");
    }

    /// An agent using everything codex can do.
    fn full_agent() -> Value {
        json!({
            "id": "agent_1", "model": "gpt-5.4", "instructions": "Be brief.",
            "multi_agent": {"enabled": false}, "reasoning": {"effort": "high", "summary": "concise"},
            "service_tier": "auto",
            "text": {"format": {"type": "json_schema", "schema": {"type": "object"}}, "verbosity": "low"},
            "tools": [
                {"type": "function", "name": "lookup_weather", "description": "d", "parameters": {"type": "object"}, "defer_loading": false},
                {"type": "function", "name": "get_ticket", "description": "d", "parameters": {"type": "object"}, "defer_loading": true},
                {"type": "mcp", "server_label": "host-tools", "required": false, "connection_origin": "service",
                 "request_metadata": {}, "allowed_tools": ["a"],
                 "transport": {"type": "http", "server_url": "http://127.0.0.1:9/mcp", "authorization": "Bearer sekrit"}},
                {"type": "web_search", "mode": "cached", "context_size": "medium"},
            ],
        })
    }

    #[test]
    fn an_agent_becomes_thread_and_turn_params() {
        let plan = thread_plan(&full_agent(), "/work").unwrap();
        let start = &plan.thread_start;
        assert_eq!(start["model"], "gpt-5.4");
        assert_eq!(start["developerInstructions"], "Be brief.");
        assert_eq!(
            (start["cwd"].clone(), start["approvalPolicy"].clone()),
            (json!("/work"), json!("never"))
        );
        assert_eq!(
            start["dynamicTools"],
            json!([
                {"type": "function", "name": "lookup_weather", "description": "d", "inputSchema": {"type": "object"}},
                {"type": "namespace", "name": DEFERRED_NAMESPACE, "description": "Functions of the application, loaded on demand.",
                 "tools": [{"type": "function", "name": "get_ticket", "description": "d", "inputSchema": {"type": "object"}, "deferLoading": true}]},
            ])
        );
        let config = &start["config"];
        assert_eq!(config["model_reasoning_effort"], "high");
        assert_eq!(config["model_reasoning_summary"], "concise");
        assert_eq!(config["model_verbosity"], "low");
        assert_eq!(config["web_search"], "cached");
        assert_eq!(config["features.multi_agent"], false);
        assert_eq!(
            config["mcp_servers.host-tools.url"],
            "http://127.0.0.1:9/mcp"
        );
        assert_eq!(
            config["mcp_servers.host-tools.bearer_token_env_var"],
            "ABX_MCP_TOKEN_HOST_TOOLS"
        );
        assert_eq!(config["mcp_servers.host-tools.enabled_tools"], json!(["a"]));
        assert_eq!(
            config["mcp_servers.host-tools.default_tools_approval_mode"],
            "approve"
        );
        assert_eq!(
            plan.env,
            [("ABX_MCP_TOKEN_HOST_TOOLS".to_string(), "sekrit".to_string())]
        );
        assert_eq!(plan.turn_start, json!({"outputSchema": {"type": "object"}}));
        let turn = turn_start_params("T", vec![json!({"type": "text", "text": "hi"})], &plan);
        assert_eq!(
            turn,
            json!({"threadId": "T", "input": [{"type": "text", "text": "hi"}], "outputSchema": {"type": "object"}})
        );
        // No web_search tool: codex's own is off.
        let bare = thread_plan(&json!({"model": "m", "tools": []}), "/w").unwrap();
        assert_eq!(bare.thread_start["config"]["web_search"], "disabled");
        assert!(bare.thread_start.get("dynamicTools").is_none());
    }

    #[test]
    fn what_codex_cannot_honour_is_refused_by_name() {
        let refused = |change: &dyn Fn(&mut Value)| {
            let mut agent = full_agent();
            change(&mut agent);
            thread_plan(&agent, "/w").unwrap_err().param
        };
        assert_eq!(
            refused(&|a| a["tools"][0]["name"] = json!("bad.name")),
            "agent.tools[0].name"
        );
        assert_eq!(
            refused(&|a| a["tools"][0]["name"] = json!("exec_command")),
            "agent.tools[0].name"
        );
        assert_eq!(
            refused(&|a| a["tools"][0]["async"] = json!(true)),
            "agent.tools[0].async"
        );
        assert_eq!(
            refused(&|a| a["tools"][3] = json!({"type": "computer_use"})),
            "agent.tools[3].type"
        );
        assert_eq!(
            refused(&|a| a["tools"][2]["server_label"] = json!("a.b")),
            "agent.tools[2].server_label"
        );
        assert_eq!(
            refused(&|a| a["tools"][2]["credential_id"] = json!("cred_1")),
            "agent.tools[2].credential_id"
        );
        assert_eq!(
            refused(&|a| a["tools"][3]["context_size"] = json!("high")),
            "agent.tools[3].context_size"
        );
        assert_eq!(
            refused(&|a| a["service_tier"] = json!("priority")),
            "agent.service_tier"
        );
        assert_eq!(
            refused(&|a| a["compaction"] = json!({"async": true})),
            "agent.compaction.async"
        );
    }

    /// The plan of an agent with every kind of tool is what the pinned codex takes: the
    /// thread starts, the MCP server finds its token in the environment, and the model
    /// is offered the agent's functions and none of codex's web search or sub-agent
    /// tools.
    #[test]
    fn the_pinned_codex_takes_the_plan() {
        use crate::agents::app_server::tests::{serve_responses, Home};
        use crate::agents::app_server::{AppServer, Message};
        let (base, seen) = serve_responses();
        let home = Home::with_provider("plan", &base);
        let mut agent = full_agent();
        agent["text"] = json!({"format": {"type": "text"}});
        let plan = thread_plan(&agent, home.work().to_str().unwrap()).unwrap();
        crate::testing::run(async {
            let mut launch = home.launch();
            launch
                .env
                .extend(plan.env.iter().map(|(k, v)| (k.into(), v.into())));
            let registry = std::sync::Arc::new(crate::process::ChildRegistry::default());
            let (server, mut incoming) = AppServer::start(launch, &registry, "plan_test")
                .await
                .unwrap();
            let started = server
                .request("thread/start", plan.thread_start.clone())
                .await
                .unwrap();
            assert_eq!(started["model"], "gpt-5.4");
            let thread = started["thread"]["id"].as_str().unwrap().to_string();
            let status = server
                .request("mcpServerStatus/list", json!({"threadId": thread}))
                .await
                .unwrap();
            let mcp = &status["data"][0];
            assert_eq!(
                (mcp["name"].clone(), mcp["authStatus"].clone()),
                (json!("host-tools"), json!("bearerToken")),
                "{status}"
            );
            assert!(
                !mcp["toolsError"].to_string().contains("is not set"),
                "the token is in the environment: {status}"
            );
            // The same again for an agent with one function and no web search.
            let lean = json!({"model": "m", "tools": [full_agent()["tools"][0].clone()]});
            let lean = thread_plan(&lean, home.work().to_str().unwrap()).unwrap();
            for plan in [&plan, &lean] {
                let started = server
                    .request("thread/start", plan.thread_start.clone())
                    .await
                    .unwrap();
                let thread = started["thread"]["id"].as_str().unwrap().to_string();
                let turn = turn_start_params(
                    &thread,
                    vec![json!({"type": "text", "text": "weather?"})],
                    plan,
                );
                server.request("turn/start", turn).await.unwrap();
                loop {
                    match incoming.next().await.expect("codex runs") {
                        Message::Request { id, params, .. } => {
                            let result = ToolResult {
                                success: true,
                                output: Some(json!("sunny")),
                                error: None,
                            };
                            assert_eq!(params["tool"], "lookup_weather");
                            server.respond(id, Ok(tool_response(&result)));
                        }
                        Message::Notification { method, .. } if method == "turn/completed" => break,
                        Message::Exited { stderr_tail, .. } => {
                            panic!("codex exited: {stderr_tail:?}")
                        }
                        Message::Notification { .. } => {}
                    }
                }
            }
            server.shutdown().await;
        });
        let seen = seen.lock().unwrap();
        let offered = |request: usize| -> Vec<String> {
            seen[request]["tools"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|t| {
                    t["name"]
                        .as_str()
                        .or(t["type"].as_str())
                        .map(str::to_string)
                })
                .collect()
        };
        // Requests 0 and 1 are the first turn's (a call, then the answer), 2 and 3 the second's.
        for (request, web_search) in [(0, true), (2, false)] {
            let names = offered(request);
            assert!(names.iter().any(|n| n == "lookup_weather"), "{names:?}");
            assert!(
                !names.iter().any(|n| n == "multi_agent_v1"),
                "multi_agent is off: {names:?}"
            );
            assert_eq!(
                names.iter().any(|n| n == "web_search"),
                web_search,
                "{names:?}"
            );
        }
    }

    /// Checks every mapped event, stored item, required action and turn of every
    /// capture against the pinned SDK's own pydantic models (strict validation: every
    /// required field present, every literal one the SDK knows), with the event ids the
    /// session layer would add.
    #[test]
    fn every_mapped_shape_validates_against_the_pinned_sdk() {
        let mut lines = Vec::new();
        for name in FIXTURES {
            for run in replay(fixture(name)) {
                for (i, event) in run.events.iter().enumerate() {
                    let mut event = event.clone();
                    event["event_id"] = json!(format!("evt_{name}_{i}"));
                    lines.push(json!({"kind": "event", "fixture": name, "value": event}));
                }
                for fact in &run.facts {
                    let (kind, value) = match fact {
                        Fact::Item(item) => ("item", item.clone()),
                        Fact::ToolCall(call) => ("required_action", call.required_action.clone()),
                        Fact::TurnEnded(end) => ("turn", end.turn.clone()),
                    };
                    lines.push(json!({"kind": kind, "fixture": name, "value": value}));
                }
            }
        }
        let python = crate::testing::repo_root().join(".tools/venv/bin/python3");
        assert!(
            python.exists(),
            "{} is missing: run scripts/tools, which installs the pinned openai SDK into .tools/venv",
            python.display()
        );
        let input =
            std::env::temp_dir().join(format!("abx-codex-map-{}.jsonl", std::process::id()));
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&input, text).unwrap();
        let output = std::process::Command::new(&python)
            .args(["-c", SDK_CHECK])
            .arg(&input)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&input);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains(&format!("ok {}", lines.len())), "{stdout}");
    }

    /// Validates each line of the file given by the kind's SDK model.
    const SDK_CHECK: &str = r#"
import json, sys
from pydantic import TypeAdapter, ValidationError
from openai.types.beta.agent_session_event import AgentSessionEvent
from openai.types.beta.agent_session_item import AgentSessionItem
from openai.types.beta.agent_session import RequiredAction
from openai.types.beta.agents.sessions.turn import Turn

models = {"event": TypeAdapter(AgentSessionEvent), "item": TypeAdapter(AgentSessionItem),
          "required_action": TypeAdapter(RequiredAction), "turn": TypeAdapter(Turn)}
count = 0
for line in open(sys.argv[1]):
    entry = json.loads(line)
    try:
        parsed = models[entry["kind"]].validate_python(entry["value"], strict=True)
    except ValidationError as error:
        print(f"FAIL {entry['fixture']}: not a valid {entry['kind']}:\n{error}\n{json.dumps(entry['value'])[:1500]}")
        sys.exit(1)
    kind = entry["value"].get("type")
    if kind and getattr(parsed, "type", kind) != kind:
        print(f"FAIL {entry['fixture']}: {kind} parsed as {parsed.type}")
        sys.exit(1)
    count += 1
print(f"ok {count}")
"#;
}
