//! `/v1/responses`: a turn of a local CLI as an OpenAI Response, answered whole or as
//! server-sent events in OpenAI's names, and the stored responses afterwards.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::{
    body, default_runtime, find_cli, invalid, label, metadata, not_implemented, now_unix,
    only_known, route, store_error,
};
use crate::agents::store::{new_id, ConversationRecord, ResponseRecord, Store, MAX_ITEMS};
use crate::agents::turn::Turn;
use crate::agents::{AgentEvent, Item, Runtime, Usage};
use crate::api::{ApiError, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::{sse, Response};

/// How long a CLI may take to exit after its last event before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// The fields `POST /v1/responses` honours; any other is a 400.
const KNOWN: [&str; 9] = [
    "model",
    "input",
    "instructions",
    "stream",
    "store",
    "metadata",
    "conversation",
    "previous_response_id",
    "runtime",
];

/// What every local response differs in (codes documented in `docs/agents.md`).
const DIFFERENCES: [&str; 5] = [
    "model_is_runtime",
    "tools_run_locally",
    "usage_from_cli",
    "usage_neutral_fields",
    "objects_in_memory",
];

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        route(
            Method::Post,
            "/v1/responses",
            "responses_create",
            "Run one turn of a local coding agent (stream: true for server-sent events).",
            handler(create),
        )
        .params(&[
            Param::body("input", "any", true),
            Param::body("model", "string", false),
            Param::body("runtime", "string", false),
            Param::body("instructions", "string", false),
            Param::body("stream", "boolean", false),
            Param::body("store", "boolean", false),
            Param::body("metadata", "object", false),
            Param::body("conversation", "any", false),
            Param::body("previous_response_id", "string", false),
        ])
        .streaming(true),
        route(
            Method::Get,
            "/v1/responses/{response_id}",
            "responses_get",
            "A stored response.",
            handler(get),
        )
        .params(&[Param::path("response_id")]),
        route(
            Method::Delete,
            "/v1/responses/{response_id}",
            "responses_delete",
            "Forget a response (a running one is cancelled first).",
            handler(delete),
        )
        .params(&[Param::path("response_id")]),
        route(
            Method::Post,
            "/v1/responses/{response_id}/cancel",
            "responses_cancel",
            "Stop a running response: its CLI's process group is killed.",
            handler(cancel),
        )
        .params(&[Param::path("response_id")]),
        route(
            Method::Get,
            "/v1/responses/{response_id}/input_items",
            "responses_input_items",
            "The input items of a response.",
            handler(input_items),
        )
        .params(&[
            Param::path("response_id"),
            Param::query("limit", "integer", false),
            Param::query("order", "string", false),
            Param::query("after", "string", false),
        ]),
    ]
}

/// One input message.
#[derive(Debug)]
struct InputMessage {
    role: String,
    text: String,
}

/// `input`: a string, or a list of message items whose content is text.
fn parse_input(input: Option<&Value>) -> Result<Vec<InputMessage>, ApiError> {
    match input {
        None | Some(Value::Null) => Err(invalid(
            "input",
            "input is required: a string or a list of message items.",
        )),
        Some(Value::String(text)) => Ok(vec![InputMessage {
            role: "user".into(),
            text: text.clone(),
        }]),
        Some(Value::Array(items)) => {
            let mut messages = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let unknown = item.as_object().and_then(|o| {
                    o.keys().find(|k| {
                        !matches!(k.as_str(), "type" | "role" | "content" | "id" | "status")
                    })
                });
                if let Some(key) = unknown {
                    return Err(invalid(
                        &format!("input[{i}].{key}"),
                        format!("Input items cannot carry '{key}' for a local runtime."),
                    ));
                }
                let kind = item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message");
                if kind != "message" {
                    return Err(invalid(&format!("input[{i}].type"), format!("Input items of type '{kind}' cannot be honoured by a local runtime; send message items.")));
                }
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                if !matches!(role, "user" | "system" | "developer" | "assistant") {
                    return Err(invalid(
                        &format!("input[{i}].role"),
                        format!("Unknown role '{role}'."),
                    ));
                }
                let text = match item.get("content") {
                    Some(Value::String(text)) => text.clone(),
                    Some(Value::Array(parts)) => {
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
                                _ => return Err(invalid(&format!("input[{i}].content[{j}].type"), format!("Content of type '{kind}' cannot be honoured by a local runtime; send input_text."))),
                            }
                        }
                        text
                    }
                    _ => {
                        return Err(invalid(
                            &format!("input[{i}].content"),
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
                return Err(invalid("input", "input must hold at least one message."));
            }
            Ok(messages)
        }
        Some(_) => Err(invalid(
            "input",
            "input must be a string or a list of message items.",
        )),
    }
}

fn input_item(message: &InputMessage) -> Value {
    json!({
        "id": new_id("msg_"),
        "type": "message",
        "role": message.role,
        "status": "completed",
        "content": [{"type": "input_text", "text": message.text}],
        "x_agent_sandbox": label("agent-sandbox", &[]),
    })
}

/// The text of a stored item, for a transcript.
fn item_text(item: &Value) -> String {
    item.get("content")
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Which runtime a request selects, and the model its CLI gets.
fn select_runtime(
    call: &Call,
    body: &Map<String, Value>,
) -> Result<(Runtime, Option<String>), ApiError> {
    let model = match body.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(_) => return Err(invalid("model", "model must be a string.")),
    };
    let named = match body.get("runtime") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) => Some(Runtime::parse(name).ok_or_else(|| {
            invalid(
                "runtime",
                format!("Unknown runtime '{name}'. GET /v1/agents/runtimes lists them."),
            )
        })?),
        Some(_) => return Err(invalid("runtime", "runtime must be a string.")),
    };
    // `model` may name a runtime (`codex`), or a runtime and its model (`codex/gpt-5`),
    // or only the CLI's model.
    let (from_model, cli_model) = match &model {
        None => (None, None),
        Some(m) => match Runtime::parse(m) {
            Some(r) => (Some(r), None),
            None => match m.split_once('/') {
                Some((prefix, rest)) if Runtime::parse(prefix).is_some() => {
                    (Runtime::parse(prefix), Some(rest.to_string()))
                }
                _ => (None, Some(m.clone())),
            },
        },
    };
    if let (Some(a), Some(b)) = (named, from_model) {
        if a != b {
            return Err(invalid(
                "model",
                format!(
                    "model names runtime '{}' but runtime is '{}'.",
                    b.name(),
                    a.name()
                ),
            ));
        }
    }
    let runtime = named
        .or(from_model)
        .unwrap_or_else(|| default_runtime(call));
    if !runtime.implemented() {
        return Err(not_implemented(runtime));
    }
    Ok((runtime, cli_model))
}

/// Where the turn continues from.
enum Continuation {
    New,
    Conversation(String),
    Previous(String),
}

async fn create(call: Call) -> Result<Response, ApiError> {
    let body = body(&call)?;
    let (runtime, cli_model) = select_runtime(&call, &body)?;
    only_known(&body, &KNOWN, runtime.name())?;
    let messages = parse_input(body.get("input"))?;
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("stream", "stream must be true or false.")),
    };
    let store_it = match body.get("store") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("store", "store must be true or false.")),
    };
    let instructions = match body.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(invalid("instructions", "instructions must be a string.")),
    };
    let metadata = metadata(&body)?;
    let conversation = match body.get("conversation") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(Value::Object(o)) if o.len() == 1 => Some(
            o.get("id")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    invalid(
                        "conversation",
                        "conversation must be an id or {\"id\": ...}.",
                    )
                })?
                .to_string(),
        ),
        Some(_) => {
            return Err(invalid(
                "conversation",
                "conversation must be an id or {\"id\": ...}.",
            ))
        }
    };
    let previous = match body.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => {
            return Err(invalid(
                "previous_response_id",
                "previous_response_id must be a string.",
            ))
        }
    };
    let continuation = match (conversation, previous) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "previous_response_id",
                "Send conversation or previous_response_id, not both.",
            ))
        }
        (Some(c), None) => Continuation::Conversation(c),
        (None, Some(p)) => Continuation::Previous(p),
        (None, None) => Continuation::New,
    };
    let owner = call.identity.id.clone();
    let store = call.services().agents.clone();

    // Where the CLI's session continues, and what it has not seen yet.
    let mut resume = None;
    let mut transcript = String::new();
    match &continuation {
        Continuation::New => {}
        Continuation::Previous(id) => {
            let session = store
                .with_response(&owner, id, |r| r.session.clone())
                .map_err(|e| store_error(e, "response", id, "previous_response_id"))?;
            match session {
                Some((r, session)) if r == runtime => resume = Some(session),
                Some((r, _)) => return Err(invalid("previous_response_id", format!("Response '{id}' ran on runtime '{}', not '{}'.", r.name(), runtime.name()))),
                None => return Err(invalid("previous_response_id", format!("Response '{id}' has no session to continue (it failed before the agent started)."))),
            }
        }
        Continuation::Conversation(id) => {
            let taken = store
                .with_conversation(&owner, id, |c| {
                    if c.busy {
                        return Err(crate::agents::store::StoreError::Busy);
                    }
                    if c.items.len() >= MAX_ITEMS {
                        return Err(crate::agents::store::StoreError::Full("items"));
                    }
                    c.busy = true;
                    let session = c.sessions.get(&runtime).cloned();
                    // A CLI session that does not exist yet (the first turn, or the first
                    // on this runtime) has seen nothing: it gets the whole conversation.
                    let from = if session.is_some() { c.unseen_from } else { 0 };
                    let unseen: Vec<String> = c.items[from..]
                        .iter()
                        .map(|item| {
                            format!(
                                "{}: {}",
                                item.get("role").and_then(Value::as_str).unwrap_or("user"),
                                item_text(item)
                            )
                        })
                        .collect();
                    Ok((session, unseen))
                })
                .map_err(|e| store_error(e, "conversation", id, "conversation"))?
                .map_err(|e| store_error(e, "conversation", id, "conversation"))?;
            resume = taken.0;
            if !taken.1.is_empty() {
                transcript = format!("Earlier in this conversation:\n{}\n\n", taken.1.join("\n"));
            }
        }
    }
    let mut release = TurnGuard {
        store: store.clone(),
        owner: owner.clone(),
        conversation: match &continuation {
            Continuation::Conversation(id) => Some(id.clone()),
            _ => None,
        },
        response: None,
    };

    let mut prompt = String::new();
    if let Some(instructions) = &instructions {
        prompt.push_str(instructions);
        prompt.push_str("\n\n");
    }
    prompt.push_str(&transcript);
    if let [only] = messages.as_slice() {
        prompt.push_str(&only.text);
    } else {
        for message in &messages {
            prompt.push_str(&format!("{}: {}\n", message.role, message.text));
        }
    }

    let program = {
        let env = call.services().environment.snapshot();
        let found = monoio::spawn_blocking(move || find_cli(runtime, &env))
            .await
            .ok()
            .flatten();
        found.ok_or_else(|| {
            ApiError::new(
                503,
                "server_error",
                format!(
                    "The {} CLI is not installed. Install it with `{}` ({}), then retry.",
                    runtime.name(),
                    runtime.install_command().unwrap_or_default(),
                    crate::agents::node_requirement(),
                ),
            )
            .with_code("agents.runtime_not_installed")
            .with_header("x-should-retry", "false")
        })?
    };
    let mut argv = runtime.turn_argv(resume.as_deref(), cli_model.as_deref());
    argv[0] = program.display().to_string();
    let cwd = super::super::process::working_dir(&call, None)
        .await
        .map_err(|e| {
            ApiError::new(
                500,
                "server_error",
                format!("The base directory cannot be opened: {}", e.message),
            )
        })?;

    let id = new_id("resp_");
    let input_items: Vec<Value> = messages.iter().map(input_item).collect();
    let conversation_id = match &continuation {
        Continuation::Conversation(c) => Some(c.clone()),
        _ => None,
    };
    let mut response = json!({
        "id": id,
        "object": "response",
        "created_at": now_unix(),
        "status": "in_progress",
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": instructions,
        "max_output_tokens": null,
        "model": match &cli_model { Some(m) => format!("{}/{m}", runtime.name()), None => runtime.name().to_string() },
        "output": [],
        "parallel_tool_calls": true,
        "previous_response_id": match &continuation { Continuation::Previous(p) => Value::String(p.clone()), _ => Value::Null },
        "conversation": conversation_id.as_ref().map(|c| json!({"id": c})),
        "reasoning": {"effort": null, "summary": null},
        "store": store_it,
        "temperature": null,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": null,
        "truncation": "disabled",
        "usage": null,
        "user": null,
        "metadata": metadata,
        "x_agent_sandbox": label(runtime.name(), &DIFFERENCES),
    });

    let services = call.services();
    let turn = Turn::start(
        runtime,
        argv,
        &prompt,
        cwd,
        services.environment.with(&[]),
        &services.children,
    )
    .await
    .map_err(|e| {
        ApiError::new(
            500,
            "server_error",
            format!("The {} CLI could not be started: {e}", runtime.name()),
        )
    })?;
    let cancelled = Arc::new(AtomicBool::new(false));
    if store_it {
        // Refused, the turn is dropped here, which kills the CLI it started.
        store
            .insert_response(
                id.clone(),
                ResponseRecord {
                    owner: owner.clone(),
                    object: response.clone(),
                    input_items: input_items.clone(),
                    session: resume.clone().map(|s| (runtime, s)),
                    running: Some(turn.pgid()),
                    cancelled: cancelled.clone(),
                },
            )
            .map_err(|e| store_error(e, "response", &id, "input"))?;
        release.response = Some(id.clone());
    }
    let run = TurnRun {
        cancelled,
        store,
        owner,
        id: id.clone(),
        runtime,
        stored: store_it,
        conversation: conversation_id,
        input_items,
        release,
    };
    if !stream {
        let mut sink = Collect;
        let finished = run.drive(turn, &mut response, &mut sink).await;
        return Ok(Response::ok(&finished));
    }
    let (tx, rx) = sse::channel(64);
    monoio::spawn(async move {
        let mut sink = Events { tx, sequence: 0 };
        let created = response.clone();
        if sink
            .send("response.created", json!({"response": created}))
            .await
            .is_err()
        {
            return;
        }
        let _ = sink
            .send(
                "response.in_progress",
                json!({"response": response.clone()}),
            )
            .await;
        run.drive(turn, &mut response, &mut sink).await;
    });
    Ok(Response::sse(rx))
}

/// Frees the conversation when its turn ends, however it ends, and marks a stored
/// response whose turn was dropped unfinished (its client went away; dropping the turn
/// killed the CLI) as cancelled rather than leaving it in progress forever.
struct TurnGuard {
    store: Arc<Store>,
    owner: String,
    conversation: Option<String>,
    /// The stored response, until its turn has finished properly.
    response: Option<String>,
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        if let Some(id) = &self.conversation {
            let _ = self
                .store
                .with_conversation(&self.owner, id, |c| c.busy = false);
        }
        if let Some(id) = &self.response {
            let _ = self.store.with_response(&self.owner, id, |r| {
                if r.running.take().is_some() {
                    r.object["status"] = json!("cancelled");
                }
            });
        }
    }
}

/// What a running turn updates as it goes.
struct TurnRun {
    /// Raised by a cancel or a delete of the response.
    cancelled: Arc<AtomicBool>,
    store: Arc<Store>,
    owner: String,
    id: String,
    runtime: Runtime,
    stored: bool,
    conversation: Option<String>,
    input_items: Vec<Value>,
    release: TurnGuard,
}

/// Where the events of a turn go: nowhere (collected into the response) or to a
/// stream.
trait Sink {
    async fn send(&mut self, kind: &str, data: Value) -> Result<(), sse::StreamClosed>;
    /// Resolves when nobody reads any more.
    async fn gone(&mut self);
}

struct Collect;

impl Sink for Collect {
    async fn send(&mut self, _: &str, _: Value) -> Result<(), sse::StreamClosed> {
        Ok(())
    }

    // A whole answer's caller is watched by the engine, which drops this turn.
    async fn gone(&mut self) {
        std::future::pending::<()>().await
    }
}

struct Events {
    tx: sse::SseSender,
    sequence: u64,
}

impl Sink for Events {
    async fn send(&mut self, kind: &str, mut data: Value) -> Result<(), sse::StreamClosed> {
        data["type"] = Value::String(kind.to_string());
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.tx.send(kind, &data).await
    }

    async fn gone(&mut self) {
        self.tx.closed().await
    }
}

/// An output item in OpenAI's shape.
fn output_item(item: &Item, runtime: Runtime) -> Value {
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

fn usage_json(usage: Usage) -> Value {
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

impl TurnRun {
    /// Runs the turn to its end, sending events to `sink`, and returns the final
    /// response (also stored, and its items added to the conversation).
    async fn drive(mut self, mut turn: Turn, response: &mut Value, sink: &mut impl Sink) -> Value {
        let mut output: Vec<Value> = Vec::new();
        let mut other: Vec<Value> = Vec::new();
        let mut session: Option<String> = None;
        let mut outcome: Option<Result<Usage, String>> = None;
        let mut client_gone = false;
        loop {
            // A stream's reader that leaves ends the turn at once, not at the next item.
            let next = monoio::select! {
                event = turn.next() => event,
                _ = sink.gone() => {
                    client_gone = true;
                    None
                }
            };
            let Some(event) = next else {
                break;
            };
            match event {
                AgentEvent::Session(id) => {
                    session = Some(id.clone());
                    let runtime = self.runtime;
                    if self.stored {
                        let id = id.clone();
                        let _ = self.store.with_response(&self.owner, &self.id, |r| {
                            r.session = Some((runtime, id))
                        });
                    }
                    // Kept at once: a turn cut short still leaves the thread to resume.
                    if let Some(conversation) = &self.conversation {
                        let _ = self
                            .store
                            .with_conversation(&self.owner, conversation, |c| {
                                c.sessions.insert(runtime, id)
                            });
                    }
                }
                AgentEvent::Item(Item::Other(value)) => other.push(value),
                AgentEvent::Item(item) => {
                    let value = output_item(&item, self.runtime);
                    let index = output.len();
                    output.push(value.clone());
                    if !client_gone && self.item_events(sink, index, &item, &value).await.is_err() {
                        client_gone = true;
                    }
                    if client_gone {
                        // Nobody reads the stream: the turn is not finished for anyone.
                        break;
                    }
                }
                AgentEvent::Completed(usage) => outcome = Some(Ok(usage)),
                AgentEvent::Failed(message) => outcome = Some(Err(message)),
                AgentEvent::Notice(_) => {}
            }
        }
        let cancelled = self.cancelled.load(Ordering::Relaxed);
        if client_gone {
            turn.kill().await;
        } else {
            // The CLI may still be saving its session, which the next turn resumes.
            turn.wait_exit(EXIT_GRACE).await;
        }
        drop(turn);
        response["output"] = Value::Array(output.clone());
        if !other.is_empty() {
            response["x_agent_sandbox"]["other_items"] = Value::Array(other);
        }
        let final_event = match (&outcome, cancelled || client_gone) {
            (_, true) => {
                response["status"] = json!("cancelled");
                "response.incomplete"
            }
            (Some(Ok(usage)), false) => {
                response["status"] = json!("completed");
                response["usage"] = usage_json(*usage);
                "response.completed"
            }
            (Some(Err(message)), false) => {
                response["status"] = json!("failed");
                response["error"] = json!({"code": "server_error", "message": message});
                "response.failed"
            }
            (None, false) => {
                response["status"] = json!("failed");
                response["error"] =
                    json!({"code": "server_error", "message": "the CLI ended without a result"});
                "response.failed"
            }
        };
        if self.stored {
            let finished = response.clone();
            let _ = self.store.with_response(&self.owner, &self.id, |r| {
                r.object = finished;
                r.running = None;
            });
        }
        if let Some(conversation) = &self.conversation {
            let runtime = self.runtime;
            let mut added = self.input_items.clone();
            added.extend(output.iter().cloned());
            let _ = self
                .store
                .with_conversation(&self.owner, conversation, |c| {
                    if let Some(session) = session {
                        c.sessions.insert(runtime, session);
                    }
                    c.items.extend(added);
                    // The CLI has now seen everything up to here.
                    c.unseen_from = c.items.len();
                });
        }
        // Finished properly: the guard only frees the conversation now.
        self.release.response = None;
        drop(self.release);
        if !client_gone {
            let _ = sink
                .send(final_event, json!({"response": response.clone()}))
                .await;
        }
        response.clone()
    }

    /// The events of one finished output item, in OpenAI's order.
    async fn item_events(
        &self,
        sink: &mut impl Sink,
        index: usize,
        item: &Item,
        value: &Value,
    ) -> Result<(), sse::StreamClosed> {
        let id = value["id"].clone();
        let Item::Message { text } = item else {
            sink.send(
                "response.output_item.added",
                json!({"output_index": index, "item": value}),
            )
            .await?;
            return sink
                .send(
                    "response.output_item.done",
                    json!({"output_index": index, "item": value}),
                )
                .await;
        };
        let mut opened = value.clone();
        opened["status"] = json!("in_progress");
        opened["content"] = json!([]);
        sink.send(
            "response.output_item.added",
            json!({"output_index": index, "item": opened}),
        )
        .await?;
        let empty = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
        sink.send(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": empty}),
        )
        .await?;
        sink.send("response.output_text.delta", json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text, "logprobs": []})).await?;
        sink.send("response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []})).await?;
        sink.send("response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": value["content"][0]})).await?;
        sink.send(
            "response.output_item.done",
            json!({"output_index": index, "item": value}),
        )
        .await
    }
}

fn response_id(call: &Call) -> String {
    call.path_param("response_id")
        .unwrap_or_default()
        .to_string()
}

async fn get(call: Call) -> Result<Response, ApiError> {
    let id = response_id(&call);
    let object = call
        .services()
        .agents
        .with_response(&call.identity.id, &id, |r| r.object.clone())
        .map_err(|e| store_error(e, "response", &id, "response_id"))?;
    Ok(Response::ok(&object))
}

fn kill_group(pgid: i32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pgid) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

async fn delete(call: Call) -> Result<Response, ApiError> {
    let id = response_id(&call);
    let running = call
        .services()
        .agents
        .remove_response(&call.identity.id, &id)
        .map_err(|e| store_error(e, "response", &id, "response_id"))?;
    if let Some(pgid) = running {
        kill_group(pgid);
    }
    Ok(Response::ok(&json!({
        "id": id, "object": "response", "deleted": true,
        "x_agent_sandbox": label("agent-sandbox", &[]),
    })))
}

async fn cancel(call: Call) -> Result<Response, ApiError> {
    let id = response_id(&call);
    let store = call.services().agents.clone();
    let running = store
        .with_response(&call.identity.id, &id, |r| {
            if r.running.is_some() {
                r.cancelled.store(true, Ordering::Relaxed);
            }
            (r.running, r.object.clone())
        })
        .map_err(|e| store_error(e, "response", &id, "response_id"))?;
    match running {
        (Some(pgid), mut object) => {
            kill_group(pgid);
            object["status"] = json!("cancelled");
            Ok(Response::ok(&object))
        }
        (None, object) => Err(invalid(
            "response_id",
            format!(
                "Response '{id}' is not in progress (status {}); only a running response can be cancelled.",
                object["status"]
            ),
        )),
    }
}

/// A page of `items` as OpenAI lists them: `limit` (1–100, default 20), `order`
/// (`asc` or `desc`, default `desc`), `after` (an item id).
pub(super) fn list_page(
    call: &Call,
    items: &[Value],
    default_order: &str,
) -> Result<Value, ApiError> {
    let limit = match call.query("limit") {
        None => 20,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=100).contains(n))
            .ok_or_else(|| invalid("limit", "limit must be a whole number from 1 to 100."))?,
    };
    let order = call.query("order").unwrap_or(default_order);
    let mut ordered: Vec<&Value> = items.iter().collect();
    match order {
        "asc" => {}
        "desc" => ordered.reverse(),
        _ => return Err(invalid("order", "order must be asc or desc.")),
    }
    if let Some(after) = call.query("after") {
        let position = ordered
            .iter()
            .position(|i| i["id"] == after)
            .ok_or_else(|| invalid("after", format!("No item '{after}' in this list.")))?;
        ordered.drain(..=position);
    }
    let has_more = ordered.len() > limit;
    ordered.truncate(limit);
    Ok(json!({
        "object": "list",
        "data": ordered,
        "first_id": ordered.first().map(|i| i["id"].clone()),
        "last_id": ordered.last().map(|i| i["id"].clone()),
        "has_more": has_more,
        "x_agent_sandbox": label("agent-sandbox", &["objects_in_memory"]),
    }))
}

async fn input_items(call: Call) -> Result<Response, ApiError> {
    let id = response_id(&call);
    // The page is built under the store's lock: only its items are copied.
    let page = call
        .services()
        .agents
        .with_response(&call.identity.id, &id, |r| {
            list_page(&call, &r.input_items, "desc")
        })
        .map_err(|e| store_error(e, "response", &id, "response_id"))??;
    Ok(Response::ok(&page))
}

/// A conversation record for `POST /v1/conversations`.
pub(super) fn new_conversation(
    owner: &str,
    object: Value,
    items: Vec<Value>,
) -> ConversationRecord {
    let seen = 0;
    ConversationRecord {
        owner: owner.to_string(),
        object,
        unseen_from: seen,
        items,
        sessions: Default::default(),
        busy: false,
    }
}

/// Input items for a conversation, from `items` in OpenAI's message shape.
pub(super) fn conversation_items(
    items: Option<&Value>,
    param: &str,
) -> Result<Vec<Value>, ApiError> {
    match items {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) if list.len() <= 20 => {
            let messages = parse_input(Some(&Value::Array(list.clone()))).map_err(|mut e| {
                if let Some(field) = e.extra.iter_mut().find(|(n, _)| *n == "param") {
                    field.1 =
                        Value::String(field.1.as_str().unwrap_or("").replacen("input", param, 1));
                }
                e
            })?;
            Ok(messages.iter().map(input_item).collect())
        }
        Some(Value::Array(_)) => Err(invalid(param, "At most 20 items can be added at once.")),
        Some(_) => Err(invalid(
            param,
            format!("{param} must be a list of message items."),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_is_text_or_messages_of_text() {
        assert_eq!(parse_input(Some(&json!("hi"))).unwrap()[0].text, "hi");
        let messages = parse_input(Some(&json!([
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "message", "role": "assistant", "content": "c"},
        ])))
        .unwrap();
        assert_eq!(
            (messages[0].text.as_str(), messages[1].role.as_str()),
            ("a\nb", "assistant")
        );
        let image = parse_input(Some(
            &json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
        ))
        .unwrap_err();
        assert_eq!(image.status, 400);
        assert!(image.has_field("param"));
        assert!(parse_input(None).is_err());
        assert!(parse_input(Some(&json!([]))).is_err());
        assert!(parse_input(Some(&json!([{"type": "function_call_output"}]))).is_err());
    }

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
