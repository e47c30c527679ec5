//! Running a turn: the CLI started for a [`Prepared`] turn, its [`AgentEvent`]s turned
//! into the Response object and OpenAI's stream events (in OpenAI's names and order,
//! numbered from 0), the stored response and the conversation updated as it goes.
//! Events go to a [`Sink`]: the routes' event stream, or nowhere for a whole answer.

use std::ffi::OsString;
use std::future::Future;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::error::AgentError;
use super::events::{AgentEvent, Item, Usage};
use super::objects::{output_item, usage_json};
use super::records::{ObjectStore, Scope, Transaction};
use super::responses::{response_object, InputItem, Prepared, ResponseRecord, TurnGuard};
use super::runtime::{Runtime, Session, TurnSession};
use super::surface::Agents;
use super::turn::Turn;
use crate::process::ChildRegistry;

/// How long a CLI may take to exit after its last event before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// One event of a response's stream: its name and its data (with `type` and
/// `sequence_number`).
#[derive(Debug)]
pub struct Event {
    pub name: &'static str,
    pub data: Value,
}

/// Nobody reads the stream any more.
#[derive(Debug)]
pub struct Gone;

/// Where a turn's events go.
pub trait Sink {
    fn send(&mut self, event: Event) -> impl Future<Output = Result<(), Gone>>;
    /// Resolves when nobody reads any more.
    fn gone(&mut self) -> impl Future<Output = ()>;
}

/// A whole answer's sink: its caller is watched by the engine, which drops the turn.
struct Discard;

impl Sink for Discard {
    async fn send(&mut self, _: Event) -> Result<(), Gone> {
        Ok(())
    }

    async fn gone(&mut self) {
        std::future::pending::<()>().await
    }
}

/// Numbers the events of one stream.
struct Events<'a, K: Sink> {
    sink: &'a mut K,
    sequence: u64,
}

impl<K: Sink> Events<'_, K> {
    async fn send(&mut self, name: &'static str, mut data: Value) -> Result<(), Gone> {
        data["type"] = Value::String(name.to_string());
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.sink.send(Event { name, data }).await
    }
}

/// What the CLI of a turn needs from the server.
pub struct Launch<'a> {
    /// The CLI's path (found on the children's `PATH`).
    pub program: PathBuf,
    /// The working directory: the base directory.
    pub cwd: OwnedFd,
    pub env: Vec<(OsString, OsString)>,
    pub children: &'a Arc<ChildRegistry>,
    /// Where Claude Code's per-session config directories go
    /// (`<ABX_STATE_DIR>/claude-code`).
    pub claude_home: PathBuf,
    /// Where the CLI reaches this server (`http://host:port`), for the model relay.
    pub relay_base: Option<String>,
}

/// A started turn.
pub struct TurnRun<S: ObjectStore> {
    agents: Arc<Agents<S>>,
    turn: Turn,
    response: Value,
    owner: String,
    id: String,
    runtime: Runtime,
    stored: bool,
    conversation: Option<String>,
    input_items: Vec<Value>,
    /// Raised by a cancel or a delete of the response.
    cancelled: Arc<AtomicBool>,
    guard: TurnGuard<S>,
    /// The model relay's capability of this turn's Claude Code, closed with the turn.
    _model_relay: Option<super::claude::relay::Opened>,
}

/// What a turn's events left once it ended.
#[derive(Default)]
struct Outcome {
    output: Vec<Value>,
    other: Vec<Value>,
    session: Option<String>,
    result: Option<Result<Usage, Failure>>,
    client_gone: bool,
}

/// Why a turn failed, as a Response's `error`.
struct Failure {
    /// OpenAI's `ResponseError.code`.
    code: &'static str,
    message: String,
    /// The model provider's HTTP status, when it refused.
    provider_status: Option<u16>,
}

impl Failure {
    fn cli(message: String) -> Failure {
        Failure {
            code: "server_error",
            message,
            provider_status: None,
        }
    }

    /// The provider's refusal in OpenAI's terms: a 400 is the prompt's fault, a 429 a
    /// rate limit, anything else the server's.
    fn provider(status: u16, message: String) -> Failure {
        let code = match status {
            400 | 413 | 422 => "invalid_prompt",
            429 => "rate_limit_exceeded",
            _ => "server_error",
        };
        Failure {
            code,
            message,
            provider_status: Some(status),
        }
    }

    fn json(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(status) = self.provider_status {
            error["type"] = json!(match status {
                400 | 413 | 422 => "invalid_request_error",
                401 => "authentication_error",
                403 => "permission_error",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                _ => "api_error",
            });
            error["x_agent_sandbox"] = json!({"provider_status": status});
        }
        error
    }
}

/// An assistant message whose text is streaming now.
struct Writing {
    index: usize,
    value: Value,
    text: String,
}

/// Starts the CLI of `turn` and keeps its response (unless `store: false`). A
/// refused response kills the CLI it started and frees the turn's conversation. A
/// function, not a method of [`Agents`], for the reason [`super::responses::prepare`]
/// is.
pub async fn start<S: ObjectStore>(
    agents: &Arc<Agents<S>>,
    owner: &str,
    mut turn: Prepared<S>,
    launch: Launch<'_>,
) -> Result<TurnRun<S>, AgentError> {
    let runtime = turn.runtime;
    let named = runtime
        .names_new_sessions()
        .then(super::claude::new_session_id);
    let session = match (turn.resume.as_deref(), named.as_deref()) {
        (Some(id), _) => TurnSession::Resume(id),
        (None, Some(id)) => TurnSession::Named(id),
        (None, None) => TurnSession::New,
    };
    let mut argv = runtime.turn_argv(session, turn.cli_model.as_deref());
    argv[0] = launch.program.display().to_string();
    let mut env = launch.env;
    let mut model_relay = None;
    if runtime == Runtime::ClaudeCode {
        let id = turn
            .resume
            .as_deref()
            .or(named.as_deref())
            .unwrap_or_default();
        let prepared = super::claude::environment(&launch.claude_home, id, &mut env)
            .await
            .and_then(|()| relay_env(launch.relay_base.as_deref(), &mut env));
        match prepared {
            Ok(opened) => model_relay = opened,
            Err(e) => {
                turn.abandon().await;
                return Err(e);
            }
        }
    }
    let id = turn.id.clone();
    let response = response_object(&id, &turn);
    let started = Turn::start(
        runtime,
        argv,
        &turn.prompt,
        launch.cwd,
        env,
        launch.children,
    )
    .await;
    let cli = match started {
        Ok(cli) => cli,
        Err(e) => {
            turn.abandon().await;
            return Err(AgentError::Failed(format!(
                "The {} CLI could not be started: {e}",
                runtime.name()
            )));
        }
    };
    let cancelled = Arc::new(AtomicBool::new(false));
    if turn.store {
        let record = ResponseRecord {
            object: response.clone(),
            session: turn.resume.clone().map(|id| Session { runtime, id }),
            running: true,
        };
        let items = turn.input_items.clone();
        let (owner_of, id_of) = (owner.to_string(), id.clone());
        let kept = agents
            .transact(move |t| {
                t.create(Scope::owner(&owner_of), record)?;
                let items = items.into_iter().map(InputItem).collect();
                t.create_all(Scope::within(&owner_of, &id_of), items)
            })
            .await;
        if let Err(refused) = kept {
            drop(cli);
            turn.abandon().await;
            return Err(AgentError::store("response", &id, "input")(refused));
        }
        agents.register(&id, owner, cli.pgid(), cancelled.clone());
        turn.guard.registered = Some(id.clone());
        turn.guard.response = Some(id.clone());
    }
    Ok(TurnRun {
        agents: agents.clone(),
        turn: cli,
        response,
        owner: owner.to_string(),
        id,
        runtime,
        stored: turn.store,
        conversation: turn.guard.conversation.clone(),
        input_items: turn.input_items,
        cancelled,
        guard: turn.guard,
        _model_relay: model_relay,
    })
}

/// Points Claude Code at the model relay when the server holds the model API's key
/// (`super::claude::relay`); the capability lives as long as what it returns.
pub(super) fn relay_env(
    relay_base: Option<&str>,
    env: &mut Vec<(OsString, OsString)>,
) -> Result<Option<super::claude::relay::Opened>, AgentError> {
    let Some(upstream) = super::claude::relay::Upstream::configured() else {
        return Ok(None);
    };
    let Some(base) = relay_base else {
        return Err(AgentError::Failed(
            "the server's address is not known yet: send the request again".into(),
        ));
    };
    Ok(Some(super::claude::relay::open(upstream, base, env)))
}

impl<S: ObjectStore> TurnRun<S> {
    /// Runs the turn to its end and returns the final Response.
    pub async fn whole(self) -> Value {
        self.drive(&mut Events {
            sink: &mut Discard,
            sequence: 0,
        })
        .await
    }

    /// Runs the turn to its end, streaming its events to `sink`.
    pub async fn stream(self, sink: &mut impl Sink) {
        let mut events = Events { sink, sequence: 0 };
        let created = json!({"response": self.response});
        if events.send("response.created", created).await.is_err() {
            return;
        }
        self.stream_on(events).await;
    }

    /// Continues a stream that already carried `response.created` and `sent` events in
    /// all (the CLI's install progress, see [`crate::agents::install`]).
    pub async fn stream_after(self, sink: &mut impl Sink, sent: u64) {
        let events = Events {
            sink,
            sequence: sent,
        };
        self.stream_on(events).await;
    }

    async fn stream_on<K: Sink>(self, mut events: Events<'_, K>) {
        let running = json!({"response": self.response});
        let _ = events.send("response.in_progress", running).await;
        self.drive(&mut events).await;
    }

    async fn drive<K: Sink>(mut self, events: &mut Events<'_, K>) -> Value {
        let mut outcome = Outcome::default();
        let mut writing: Option<Writing> = None;
        loop {
            // A stream's reader that leaves ends the turn at once, not at the next item.
            let next = monoio::select! {
                event = self.turn.next() => event,
                _ = events.sink.gone() => {
                    outcome.client_gone = true;
                    None
                }
            };
            let Some(event) = next else {
                break;
            };
            match event {
                AgentEvent::Session(id) => {
                    self.keep_session(&id).await;
                    outcome.session = Some(id);
                }
                AgentEvent::Item(Item::Other(value)) => outcome.other.push(value),
                AgentEvent::Delta(piece) => {
                    let sent = match writing.as_mut() {
                        Some(open) => {
                            open.text.push_str(&piece);
                            text_delta(events, open, &piece).await
                        }
                        None => {
                            let index = outcome.output.len();
                            let value = output_item(
                                &Item::Message {
                                    text: String::new(),
                                },
                                self.runtime,
                            );
                            let mut open = Writing {
                                index,
                                value,
                                text: piece.clone(),
                            };
                            let sent = match open_message(events, open.index, &open.value).await {
                                Ok(()) => text_delta(events, &mut open, &piece).await,
                                Err(gone) => Err(gone),
                            };
                            writing = Some(open);
                            sent
                        }
                    };
                    if sent.is_err() {
                        outcome.client_gone = true;
                        break;
                    }
                }
                AgentEvent::Item(item) => {
                    // A streamed message ends with its whole text; anything else ends
                    // the one streaming (with what it streamed) before it is shown.
                    let closing = match (&item, writing.take()) {
                        (Item::Message { text }, Some(open)) => Some((open, text.clone(), true)),
                        (_, Some(open)) => {
                            let text = open.text.clone();
                            Some((open, text, false))
                        }
                        (_, None) => None,
                    };
                    let mut sent = Ok(());
                    let mut shown = false;
                    if let Some((open, text, is_this)) = closing {
                        shown = is_this;
                        sent = close_message(events, &mut outcome, open, &text, "completed").await;
                    }
                    if !shown && sent.is_ok() {
                        let value = output_item(&item, self.runtime);
                        let index = outcome.output.len();
                        outcome.output.push(value.clone());
                        sent = item_events(events, index, &item, &value).await;
                    }
                    if sent.is_err() {
                        // Nobody reads the stream: the turn is not finished for anyone.
                        outcome.client_gone = true;
                        break;
                    }
                }
                AgentEvent::Completed(usage) => outcome.result = Some(Ok(usage)),
                AgentEvent::Failed(message) => outcome.result = Some(Err(Failure::cli(message))),
                AgentEvent::ProviderError { status, message } => {
                    outcome.result = Some(Err(Failure::provider(status, message)))
                }
                AgentEvent::Notice(_) => {}
            }
        }
        if let Some(open) = writing.take() {
            // The turn ended under it (a cancel, a failure): kept as far as it came.
            let text = open.text.clone();
            let _ = close_message(events, &mut outcome, open, &text, "incomplete").await;
        }
        if outcome.client_gone {
            self.turn.kill().await;
        } else {
            // The CLI may still be saving its session, which the next turn resumes.
            self.turn.wait_exit(EXIT_GRACE).await;
        }
        let final_event = self.finish(&mut outcome);
        self.record_end(&outcome).await;
        let response = std::mem::take(&mut self.response);
        // Finished properly: the guard only frees the conversation now, before the
        // last event, so whoever reads it finds the conversation free.
        let TurnRun { turn, guard, .. } = self;
        drop(turn);
        guard.finish().await;
        if !outcome.client_gone {
            let _ = events
                .send(final_event, json!({"response": response}))
                .await;
        }
        response
    }

    /// Kept at once: a turn cut short still leaves the session to resume.
    async fn keep_session(&self, session: &str) {
        let runtime = self.runtime;
        if self.stored {
            let id = session.to_string();
            let _ = self
                .agents
                .update(
                    Scope::owner(&self.owner),
                    &self.id,
                    move |r: &mut ResponseRecord| r.session = Some(Session { runtime, id }),
                )
                .await;
        }
        if let Some(conversation) = &self.conversation {
            self.agents
                .keep_session(&self.owner, conversation, runtime, session)
                .await;
        }
    }

    /// The final status of the Response; returns the name of its last event.
    fn finish(&mut self, outcome: &mut Outcome) -> &'static str {
        let response = &mut self.response;
        response["output"] = Value::Array(outcome.output.clone());
        if !outcome.other.is_empty() {
            response["x_agent_sandbox"]["other_items"] =
                Value::Array(std::mem::take(&mut outcome.other));
        }
        let cancelled = self.cancelled.load(Ordering::Relaxed) || outcome.client_gone;
        match (&outcome.result, cancelled) {
            (_, true) => {
                response["status"] = json!("cancelled");
                "response.incomplete"
            }
            (Some(Ok(usage)), false) => {
                response["status"] = json!("completed");
                response["usage"] = usage_json(*usage);
                "response.completed"
            }
            (Some(Err(failure)), false) => {
                response["status"] = json!("failed");
                response["error"] = failure.json();
                "response.failed"
            }
            (None, false) => {
                response["status"] = json!("failed");
                response["error"] =
                    json!({"code": "server_error", "message": "the CLI ended without a result"});
                "response.failed"
            }
        }
    }

    /// The stored response and the conversation get what the turn did.
    async fn record_end(&mut self, outcome: &Outcome) {
        if self.stored {
            let finished = self.response.clone();
            let _ = self
                .agents
                .update(
                    Scope::owner(&self.owner),
                    &self.id,
                    move |r: &mut ResponseRecord| {
                        r.object = finished;
                        r.running = false;
                    },
                )
                .await;
        }
        if let Some(conversation) = &self.conversation {
            let mut items = std::mem::take(&mut self.input_items);
            items.extend(outcome.output.iter().cloned());
            self.agents
                .end_turn(
                    &self.owner,
                    conversation,
                    self.runtime,
                    outcome.session.as_deref(),
                    items,
                )
                .await;
        }
    }
}

/// The events of one finished output item, in OpenAI's order.
async fn item_events<K: Sink>(
    events: &mut Events<'_, K>,
    index: usize,
    item: &Item,
    value: &Value,
) -> Result<(), Gone> {
    let Item::Message { text } = item else {
        let added = json!({"output_index": index, "item": value});
        events.send("response.output_item.added", added).await?;
        let done = json!({"output_index": index, "item": value});
        return events.send("response.output_item.done", done).await;
    };
    // A message the CLI gave whole: its text is one delta.
    open_message(events, index, value).await?;
    let mut delta = text_at(value, index, "delta", json!(text));
    delta["logprobs"] = json!([]);
    events.send("response.output_text.delta", delta).await?;
    message_done(events, index, value).await
}

/// The fields of a message's text events, with `key` set to `value`.
fn text_at(item: &Value, index: usize, key: &str, value: Value) -> Value {
    let mut data = json!({"item_id": item["id"], "output_index": index, "content_index": 0});
    data[key] = value;
    data
}

/// A message's `output_item.added` (in progress, no content yet) and its
/// `content_part.added`.
async fn open_message<K: Sink>(
    events: &mut Events<'_, K>,
    index: usize,
    value: &Value,
) -> Result<(), Gone> {
    let mut opened = value.clone();
    opened["status"] = json!("in_progress");
    opened["content"] = json!([]);
    events
        .send(
            "response.output_item.added",
            json!({"output_index": index, "item": opened}),
        )
        .await?;
    let empty = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
    events
        .send(
            "response.content_part.added",
            text_at(value, index, "part", empty),
        )
        .await
}

async fn text_delta<K: Sink>(
    events: &mut Events<'_, K>,
    open: &mut Writing,
    piece: &str,
) -> Result<(), Gone> {
    let mut delta = text_at(&open.value, open.index, "delta", json!(piece));
    delta["logprobs"] = json!([]);
    events.send("response.output_text.delta", delta).await
}

/// A message's `output_text.done`, `content_part.done` and `output_item.done`
/// (`value` holds its final text).
async fn message_done<K: Sink>(
    events: &mut Events<'_, K>,
    index: usize,
    value: &Value,
) -> Result<(), Gone> {
    let text = value["content"][0]["text"].clone();
    let mut done = text_at(value, index, "text", text);
    done["logprobs"] = json!([]);
    events.send("response.output_text.done", done).await?;
    events
        .send(
            "response.content_part.done",
            text_at(value, index, "part", value["content"][0].clone()),
        )
        .await?;
    events
        .send(
            "response.output_item.done",
            json!({"output_index": index, "item": value}),
        )
        .await
}

/// Ends the streaming message `open` with `text`, kept in the output.
async fn close_message<K: Sink>(
    events: &mut Events<'_, K>,
    outcome: &mut Outcome,
    open: Writing,
    text: &str,
    status: &str,
) -> Result<(), Gone> {
    let mut value = open.value;
    value["status"] = json!(status);
    value["content"][0]["text"] = json!(text);
    outcome.output.push(value.clone());
    message_done(events, open.index, &value).await
}
