//! The session actor: one task per running session, on the worker that started it,
//! owning the session's `codex app-server` (its pipes are awaited on that worker's
//! driver) and its codex thread. Requests on any worker reach it through a thread-safe
//! command queue ([`Hub::send`]) and wait for its answer; what it publishes reaches
//! every open stream through [`super::channel::Channels`].
//!
//! The actor is the only writer of its session's status. Each change is committed to
//! the store before the event that announces it is published, so a client that reads
//! the session after an event never sees an older state. An input is accepted (the
//! POST answers 202) once the actor has applied it: the turn record and the user's
//! message are stored, or the steer, cancel or tool result has reached codex.
//!
//! An actor that sees no command and runs no turn for [`IDLE`] stops its app-server;
//! the next input starts a new one, which resumes the thread (`thread/resume`: codex
//! keeps threads on disk, under `CODEX_HOME`). A server restart is the same, with the
//! turn that was running marked failed when the store opens.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_channel::{mpsc, oneshot};
use serde_json::{json, Value};

use super::agent::{dynamic_tools, mcp_config, output_schema};
use super::channel::{Channels, Subscription};
use super::inputs::{codex_input, user_item, Input, Part};
use super::outputs::{changed, snapshot, Snapshot, OUTPUTS};
use super::records::{
    Artifact, Item, Session, Status, Trace, Turn, TurnStatus, MAX_ITEMS_PER_TURN, MAX_TURNS,
};
use super::trace::TraceBuilder;
use crate::agents::app_server::{AppServer, AppServerLaunch, Incoming, Message, RpcError};
use crate::agents::codex_map::{self, Mapped, TurnMapper};
use crate::agents::error::AgentError;
use crate::agents::objects::{now_unix, Object};
use crate::agents::records::{new_id, Scope, StoreError, Transaction};
use crate::agents::surface::Agents;
use crate::process::ChildRegistry;

/// How long an actor with nothing to do keeps its app-server.
pub const IDLE: Duration = Duration::from_secs(600);
/// Bytes of a command's output an item keeps (its stream showed all of it).
pub const ITEM_OUTPUT_BYTES: usize = 64 * 1024;

/// How a session's app-server is started, should it need one.
pub struct Launch {
    pub program: PathBuf,
    /// The children's environment (with `CODEX_HOME`); bearers are added per session.
    pub env: Vec<(OsString, OsString)>,
    /// The workspace directory, opened beneath the base (`None`: environment `none`).
    pub workspace: Option<(OwnedFd, PathBuf)>,
    /// A private empty directory for a session without a workspace.
    pub scratch: PathBuf,
    pub registry: Arc<ChildRegistry>,
    /// Bearers for the agent's MCP servers: `(env var, token)`.
    pub bearers: Vec<(String, String)>,
}

enum Command {
    Inputs(Vec<Input>, oneshot::Sender<Result<(), AgentError>>),
    Stop,
}

/// Every running session's actor, and every session's subscribers.
#[derive(Default)]
pub struct Hub {
    pub channels: Channels,
    actors: Mutex<HashMap<String, mpsc::UnboundedSender<Command>>>,
}

impl Hub {
    fn actors(&self) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::UnboundedSender<Command>>> {
        self.actors.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn subscribe(&self, session: &str) -> Subscription {
        self.channels.subscribe(session)
    }

    /// Hands `inputs` to `session`'s actor (started on this worker if none runs, with
    /// `launch`) and waits until it has applied them.
    pub async fn send(
        self: &Arc<Self>,
        agents: &Arc<Agents>,
        owner: &str,
        session: &Session,
        inputs: Vec<Input>,
        launch: impl FnOnce() -> Result<Launch, AgentError>,
    ) -> Result<(), AgentError> {
        let (reply, answer) = oneshot::channel();
        let mut command = Command::Inputs(inputs, reply);
        let running = self.actors().get(&session.id).cloned();
        if let Some(actor) = running {
            match actor.unbounded_send(command) {
                Ok(()) => return answer.await.unwrap_or_else(|_| Err(gone())),
                // It stopped meanwhile: start another.
                Err(e) => command = e.into_inner(),
            }
        }
        let launch = launch()?;
        let (tx, rx) = mpsc::unbounded();
        tx.unbounded_send(command).map_err(|_| gone())?;
        self.actors().insert(session.id.clone(), tx);
        let actor = Actor {
            hub: self.clone(),
            agents: agents.clone(),
            owner: owner.to_string(),
            session: session.id.clone(),
            app: None,
            thread: session.thread_id.clone(),
            turn: None,
            model: session.agent["model"].as_str().unwrap_or_default().to_string(),
        };
        monoio::spawn(actor.run(rx, launch));
        answer.await.unwrap_or_else(|_| Err(gone()))
    }

    /// Stops `session`'s actor and ends its streams (the session was deleted).
    pub fn forget(&self, session: &str) {
        if let Some(actor) = self.actors().remove(session) {
            let _ = actor.unbounded_send(Command::Stop);
        }
        self.channels.close(session);
    }

    /// Stops every actor (the server is shutting down): their app-servers exit.
    pub fn stop_all(&self) {
        for (_, actor) in self.actors().drain() {
            let _ = actor.unbounded_send(Command::Stop);
        }
    }

    fn finished(&self, session: &str) {
        self.actors().remove(session);
    }
}

fn gone() -> AgentError {
    AgentError::Failed("The session's runner stopped before it answered; send the input again.".into())
}

/// A pending function call: the app-server request to answer.
struct PendingCall {
    request: Value,
    turn_id: String,
}

/// The root turn running now.
struct ActiveTurn {
    id: String,
    codex_turn: Option<String>,
    mapper: TurnMapper,
    trace: TraceBuilder,
    outputs_before: Option<Snapshot>,
    pending: HashMap<String, PendingCall>,
    /// `item.added` events of function calls held back until their call is registered.
    held: HashMap<String, Value>,
    started_ms: u64,
    items: usize,
}

struct Actor {
    hub: Arc<Hub>,
    agents: Arc<Agents>,
    owner: String,
    session: String,
    app: Option<Rc<AppServer>>,
    thread: Option<String>,
    turn: Option<ActiveTurn>,
    model: String,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Actor {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>, launch: Launch) {
        use futures_core::Stream;
        let workspace_path = launch.workspace.as_ref().map(|(_, p)| p.clone());
        let workspace_fd = launch.workspace.as_ref().and_then(|(fd, _)| fd.try_clone().ok());
        let started = self.start(launch).await;
        let mut incoming = match started {
            Ok(incoming) => incoming,
            Err(error) => {
                // Every input waiting for this actor hears why.
                let message = error.to_string();
                while let Ok(Some(Command::Inputs(_, reply))) = commands.try_next() {
                    let _ = reply.send(Err(AgentError::Failed(message.clone())));
                }
                self.hub.finished(&self.session);
                return;
            }
        };
        let workspace = Rc::new(RefCell::new(workspace_fd));
        loop {
            let idle = self.turn.is_none();
            let next = {
                let command = std::future::poll_fn(|cx| std::pin::Pin::new(&mut commands).poll_next(cx));
                let message = incoming.next();
                let timeout = monoio::time::sleep(if idle { IDLE } else { Duration::from_secs(86_400) });
                monoio::select! {
                    c = command => Next::Command(c),
                    m = message => Next::Message(m),
                    _ = timeout => Next::Idle,
                }
            };
            match next {
                Next::Command(Some(Command::Inputs(inputs, reply))) => {
                    let result = self.apply(inputs, &workspace, workspace_path.as_deref()).await;
                    let _ = reply.send(result);
                }
                Next::Command(Some(Command::Stop)) | Next::Command(None) => break,
                Next::Message(Some(Message::Notification { method, params })) => {
                    self.notification(&method, params, &workspace).await;
                }
                Next::Message(Some(Message::Request { id, method, params })) => {
                    self.request(id, &method, params).await;
                }
                Next::Message(Some(Message::Exited { code, stderr_tail })) => {
                    let _ = code;
                    let why = format!(
                        "codex app-server exited{}",
                        stderr_tail.last().map(|l| format!(": {l}")).unwrap_or_default()
                    );
                    self.fail_turn("connection_failed", &why, &workspace).await;
                    self.app = None;
                    break;
                }
                Next::Message(None) => break,
                Next::Idle => break,
            }
        }
        self.hub.finished(&self.session);
        if let Some(app) = self.app.take() {
            if let Ok(app) = Rc::try_unwrap(app) {
                app.shutdown().await;
            }
        }
    }

    /// Starts the app-server and starts or resumes the thread.
    async fn start(&mut self, launch: Launch) -> Result<Incoming, AgentError> {
        let session = self.load().await?;
        let (cwd_fd, cwd_path, sandbox) = match launch.workspace {
            Some((fd, path)) => (fd, path, "danger-full-access"),
            None => {
                let scratch = launch.scratch.clone();
                let fd = crate::runtime::file::blocking(move || {
                    std::fs::create_dir_all(&scratch)?;
                    crate::fs::resolve::open_base(&scratch)
                })
                .await
                .and_then(|r| r)
                .map_err(|e| AgentError::Failed(format!("The session's scratch directory cannot be made: {e}")))?;
                (fd, launch.scratch.clone(), "read-only")
            }
        };
        let mut env = launch.env;
        for (name, token) in launch.bearers {
            env.push((name.into(), token.into()));
        }
        let spawn = AppServerLaunch {
            program: launch.program,
            args: Vec::new(),
            cwd: cwd_fd,
            env,
        };
        let (app, incoming) = AppServer::start(spawn, &launch.registry, "agent-sandbox")
            .await
            .map_err(|e| AgentError::Failed(format!("codex app-server did not start: {e}")))?;
        let agent = serde_json::to_value(super::open_config(&session)?)
            .map_err(|e| AgentError::Failed(e.to_string()))?;
        let (config, _) = mcp_config(&agent);
        let mut params = json!({
            "model": agent["model"],
            "cwd": cwd_path.to_string_lossy(),
            "approvalPolicy": "never",
            "sandbox": sandbox,
            "config": config,
        });
        if let Some(instructions) = agent["instructions"].as_str() {
            params["developerInstructions"] = json!(instructions);
        }
        if let Some(effort) = agent["reasoning"]["effort"].as_str() {
            params["config"]["model_reasoning_effort"] = json!(effort);
        }
        if session.review.as_deref() == Some("auto_review") {
            params["approvalsReviewer"] = json!("auto_review");
        }
        let app = Rc::new(app);
        let thread = match &self.thread {
            Some(thread) => {
                params["threadId"] = json!(thread);
                params["excludeTurns"] = json!(true);
                app.request("thread/resume", params).await.map_err(|e| {
                    AgentError::Failed(format!("codex could not resume the session's thread {thread}: {}", e.message))
                })?;
                thread.clone()
            }
            None => {
                params["dynamicTools"] = Value::Array(dynamic_tools(&agent));
                let started = app
                    .request("thread/start", params)
                    .await
                    .map_err(|e| AgentError::Failed(format!("codex could not start a thread: {}", e.message)))?;
                let thread = started["thread"]["id"]
                    .as_str()
                    .ok_or_else(|| AgentError::Failed("codex started a thread without an id".into()))?
                    .to_string();
                let kept = thread.clone();
                self.update_session(move |s| {
                    s.thread_id = Some(kept);
                    false
                })
                .await?;
                thread
            }
        };
        self.thread = Some(thread);
        self.app = Some(app);
        Ok(incoming)
    }

    async fn load(&self) -> Result<Session, AgentError> {
        let (owner, id) = (self.owner.clone(), self.session.clone());
        self.agents
            .transact(move |t| t.get::<Session>(Scope::owner(&owner), &id))
            .await
            .map_err(AgentError::store("session", &self.session, "session_id"))
    }

    /// Changes the session record; `f` says whether the change is worth an event.
    async fn update_session(
        &self,
        f: impl FnOnce(&mut Session) -> bool + Send + 'static,
    ) -> Result<(Session, bool), AgentError> {
        let (owner, id) = (self.owner.clone(), self.session.clone());
        self.agents
            .transact(move |t| {
                t.update::<Session, _>(Scope::owner(&owner), &id, |s| {
                    let changed = f(s);
                    s.last_active_at = now_unix();
                    (s.clone(), changed)
                })
            })
            .await
            .map_err(AgentError::store("session", &self.session, "session_id"))
    }

    fn publish(&self, event: Value) {
        self.hub.channels.publish(&self.session, event, false);
    }

    fn publish_session(&self, kind: &str, session: &Session, ends_turn: bool) {
        self.hub
            .channels
            .publish(&self.session, json!({"type": kind, "session": session.object()}), ends_turn);
    }

    async fn apply(
        &mut self,
        inputs: Vec<Input>,
        workspace: &Rc<RefCell<Option<OwnedFd>>>,
        workspace_path: Option<&std::path::Path>,
    ) -> Result<(), AgentError> {
        for input in inputs {
            match input {
                Input::Message(messages) => match self.turn.is_some() {
                    false => self.begin_turn(messages, workspace, workspace_path).await?,
                    true => self.steer(messages).await?,
                },
                Input::Cancel => self.cancel().await,
                Input::ToolResult {
                    turn_id,
                    call_id,
                    success,
                    output,
                } => self.tool_result(&turn_id, &call_id, success, output).await?,
            }
        }
        Ok(())
    }

    async fn begin_turn(
        &mut self,
        messages: Vec<Vec<Part>>,
        workspace: &Rc<RefCell<Option<OwnedFd>>>,
        _workspace_path: Option<&std::path::Path>,
    ) -> Result<(), AgentError> {
        let turn_id = new_id("turn_");
        let started_ms = now_ms();
        let now = now_unix();
        let users: Vec<Value> = messages
            .iter()
            .map(|parts| user_item(&new_id("msg_"), &turn_id, parts))
            .collect();
        let session_snapshot = self.load().await?;
        let turn = Turn {
            id: turn_id.clone(),
            session_id: self.session.clone(),
            agent_id: session_snapshot.agent["id"].as_str().unwrap_or_default().to_string(),
            status: TurnStatus::InProgress,
            created_at: now,
            started_at: Some(now),
            completed_at: None,
            error: None,
            subagent_id: None,
            usage: None,
            codex_turn_id: None,
            items: users.iter().map(|u| u["id"].as_str().unwrap_or_default().to_string()).collect(),
            started_ms,
        };
        let (owner, id) = (self.owner.clone(), self.session.clone());
        let (kept_turn, kept_users) = (turn.clone(), users.clone());
        let session = self
            .agents
            .transact(move |t| {
                let scope = Scope::owner(&owner);
                let mut session: Session = t.get(scope, &id)?;
                if session.turns >= MAX_TURNS {
                    return Err(AgentError::invalid(
                        "events",
                        format!("This session holds {MAX_TURNS} turns, the most one may: start a new session."),
                    ));
                }
                session.status = Status::InProgress;
                session.active_turn = Some(kept_turn.id.clone());
                session.error = None;
                session.turns += 1;
                session.last_active_at = now_unix();
                t.put(scope, session.clone())?;
                let within = Scope::within(&owner, &id);
                t.create(within, kept_turn)?;
                t.create_all(within, kept_users.into_iter().map(Item).collect())?;
                Ok::<_, AgentError>(session)
            })
            .await?;
        let outputs_before = match workspace.borrow().as_ref().and_then(|fd| fd.try_clone().ok()) {
            Some(fd) => crate::runtime::file::blocking(move || {
                use std::os::fd::AsFd;
                snapshot(fd.as_fd())
            })
            .await
            .ok(),
            None => None,
        };
        self.publish(json!({"type": "agent.session.turn.created", "session_id": self.session, "turn_id": turn_id, "turn": turn.object()}));
        self.publish_session("agent.session.in_progress", &session, false);
        self.publish(json!({"type": "agent.session.turn.in_progress", "session_id": self.session, "turn_id": turn_id, "turn": turn.object()}));
        for user in &users {
            self.publish(json!({"type": "agent.session.turn.item.added", "session_id": self.session, "turn_id": turn_id, "item": user, "output_index": null}));
        }
        self.turn = Some(ActiveTurn {
            id: turn_id.clone(),
            codex_turn: None,
            mapper: TurnMapper::new(&self.session, &turn_id),
            trace: TraceBuilder::new(started_ms),
            outputs_before,
            pending: HashMap::new(),
            held: HashMap::new(),
            started_ms,
            items: users.len(),
        });
        let mut params = json!({
            "threadId": self.thread,
            "input": codex_input(&messages),
        });
        if let Some(schema) = output_schema(&session.agent) {
            params["outputSchema"] = schema;
        }
        if let Some(model) = session.agent["model"].as_str() {
            params["model"] = json!(model);
            self.model = model.to_string();
        }
        let Some(app) = self.app.clone() else {
            self.fail_turn("connection_failed", "codex app-server is not running", workspace).await;
            return Ok(());
        };
        match app.request("turn/start", params).await {
            Ok(answer) => {
                if let (Some(turn), Some(id)) = (self.turn.as_mut(), answer["turn"]["id"].as_str()) {
                    turn.codex_turn = Some(id.to_string());
                }
                let codex = answer["turn"]["id"].as_str().map(str::to_string);
                let (owner, session, tid) = (self.owner.clone(), self.session.clone(), turn_id.clone());
                let _ = self
                    .agents
                    .transact(move |t| {
                        t.update::<Turn, _>(Scope::within(&owner, &session), &tid, |turn| {
                            turn.codex_turn_id = codex;
                        })
                    })
                    .await;
            }
            Err(e) => {
                self.fail_turn("server_error", &format!("codex refused the turn: {}", e.message), workspace)
                    .await;
            }
        }
        Ok(())
    }

    async fn steer(&mut self, messages: Vec<Vec<Part>>) -> Result<(), AgentError> {
        let Some(turn) = self.turn.as_ref() else {
            return Ok(());
        };
        let (turn_id, codex_turn) = (turn.id.clone(), turn.codex_turn.clone());
        let app = self.app.clone().ok_or_else(gone)?;
        let answer = app
            .request(
                "turn/steer",
                json!({"threadId": self.thread, "input": codex_input(&messages), "expectedTurnId": codex_turn}),
            )
            .await;
        if let Err(e) = answer {
            return Err(AgentError::Busy {
                id: format!("{} ({})", self.session, e.message),
                param: "events",
            });
        }
        let users: Vec<Value> = messages
            .iter()
            .map(|parts| user_item(&new_id("msg_"), &turn_id, parts))
            .collect();
        self.store_items(&turn_id, users.clone()).await;
        for user in users {
            self.publish(json!({"type": "agent.session.turn.item.added", "session_id": self.session, "turn_id": turn_id, "item": user, "output_index": null}));
        }
        Ok(())
    }

    async fn cancel(&mut self) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        // A waiting function call is answered first, so codex can stop.
        let pending: Vec<PendingCall> = turn.pending.drain().map(|(_, p)| p).collect();
        let codex_turn = turn.codex_turn.clone();
        if let Some(app) = self.app.clone() {
            for call in pending {
                app.respond(
                    call.request,
                    Err(RpcError {
                        code: -32000,
                        message: "the turn was cancelled".into(),
                        data: None,
                    }),
                );
            }
            let params = json!({"threadId": self.thread, "turnId": codex_turn.unwrap_or_default()});
            // Its answer waits until codex aborted the turn; the turn's end says the rest.
            monoio::spawn(async move {
                let _ = app.request("turn/interrupt", params).await;
            });
        }
    }

    async fn tool_result(
        &mut self,
        turn_id: &str,
        call_id: &str,
        success: bool,
        output: String,
    ) -> Result<(), AgentError> {
        let unknown = || AgentError::invalid("events", format!("Unknown pending tool call: {call_id}"));
        let turn = self.turn.as_mut().ok_or_else(unknown)?;
        match turn.pending.get(call_id) {
            Some(call) if call.turn_id == turn_id => {}
            _ => return Err(unknown()),
        }
        let call = turn.pending.remove(call_id).ok_or_else(unknown)?;
        let app = self.app.clone().ok_or_else(gone)?;
        app.respond(call.request, Ok(codex_map::tool_response(success, &output)));
        let waiting = !turn.pending.is_empty();
        let item = codex_map::function_call_output(&new_id("fco_"), turn_id, call_id, success, &output);
        let call_id = call_id.to_string();
        let (session, _) = self
            .update_session(move |s| {
                s.required_actions.retain(|a| a["call_id"].as_str() != Some(&call_id));
                if !waiting {
                    s.status = Status::InProgress;
                }
                true
            })
            .await?;
        let turn_id = turn_id.to_string();
        self.store_items(&turn_id, vec![item.clone()]).await;
        self.publish(json!({"type": "agent.session.turn.item.added", "session_id": self.session, "turn_id": turn_id, "item": item, "output_index": null}));
        if !waiting {
            self.publish_session("agent.session.in_progress", &session, false);
        }
        Ok(())
    }

    /// Keeps `items` of root turn `turn_id` (as many as its bound allows).
    async fn store_items(&mut self, turn_id: &str, items: Vec<Value>) {
        if let Some(turn) = self.turn.as_mut() {
            turn.items += items.len();
            if turn.items > MAX_ITEMS_PER_TURN {
                return;
            }
        }
        let (owner, session, tid) = (self.owner.clone(), self.session.clone(), turn_id.to_string());
        let result = self
            .agents
            .transact(move |t| {
                let within = Scope::within(&owner, &session);
                let ids: Vec<String> = items.iter().map(|i| i["id"].as_str().unwrap_or_default().to_string()).collect();
                t.create_all(within, items.into_iter().map(Item).collect())?;
                t.update::<Turn, _>(within, &tid, |turn| turn.items.extend(ids))?;
                Ok::<_, StoreError>(())
            })
            .await;
        if let Err(e) = result {
            // Full: the stream showed the item; the store keeps what it could.
            crate::log::line(format_args!("session {}: an item was not kept: {e:?}", self.session));
        }
    }

    async fn notification(&mut self, method: &str, params: Value, workspace: &Rc<RefCell<Option<OwnedFd>>>) {
        if params["threadId"].as_str() != self.thread.as_deref() {
            // Another thread's (a sub-agent's): not followed yet.
            return;
        }
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if method == "thread/tokenUsage/updated" {
            turn.trace.model_request(now_ms(), &self.model, &params["tokenUsage"]["last"]);
        }
        let mapped = turn.mapper.notification(method, &params);
        for out in mapped {
            match out {
                Mapped::Event(event) => {
                    // A function call's item.added waits for its call to be registered.
                    if event["type"] == "agent.session.turn.item.added" && event["item"]["type"] == "function_call" {
                        if let (Some(turn), Some(call)) = (self.turn.as_mut(), event["item"]["call_id"].as_str()) {
                            if !turn.pending.contains_key(call) {
                                turn.held.insert(call.to_string(), event);
                                continue;
                            }
                        }
                    }
                    self.publish(event)
                }
                Mapped::ItemDone { item, started_ms, completed_ms } => {
                    if let Some(turn) = self.turn.as_mut() {
                        if let (Some(start), Some(end)) = (started_ms, completed_ms) {
                            let kind = item["type"].as_str().unwrap_or_default();
                            if matches!(kind, "command_execution" | "function_call" | "mcp_call" | "web_search_call") {
                                let mut attributes = vec![("agent.item.id".to_string(), item["id"].clone())];
                                if let Some(command) = item["command"].as_str() {
                                    attributes.push(("process.command".into(), json!(command)));
                                }
                                if let Some(name) = item["name"].as_str() {
                                    attributes.push(("tool.name".into(), json!(name)));
                                }
                                let failed = item["status"] == "failed";
                                turn.trace.tool_call(kind, start, end, attributes, failed);
                            }
                        }
                    }
                    let turn_id = self.turn.as_ref().map(|t| t.id.clone()).unwrap_or_default();
                    self.store_items(&turn_id, vec![truncated(item)]).await;
                }
                Mapped::TurnEnded { status, error, usage } => {
                    self.end_turn(status, error, usage, workspace).await;
                }
            }
        }
    }

    async fn request(&mut self, id: Value, method: &str, params: Value) {
        let Some(app) = self.app.clone() else {
            return;
        };
        if method != "item/tool/call" {
            // Approvals never reach a client: the thread runs with approvalPolicy never,
            // and anything else asked is declined so the turn never blocks on it.
            app.respond(id, codex_map::auto_answer(method, &params));
            return;
        }
        let Some(turn) = self.turn.as_mut() else {
            app.respond(id, Err(RpcError { code: -32000, message: "no turn is running".into(), data: None }));
            return;
        };
        let action = codex_map::required_action(&params, &turn.id);
        let call_id = action["call_id"].as_str().unwrap_or_default().to_string();
        turn.pending.insert(call_id.clone(), PendingCall { request: id, turn_id: turn.id.clone() });
        let (turn_id, held) = (turn.id.clone(), turn.held.remove(&call_id));
        let kept = action.clone();
        let session = self
            .update_session(move |s| {
                s.required_actions.push(kept);
                s.status = Status::RequiresAction;
                true
            })
            .await;
        let (owner, sid, tid) = (self.owner.clone(), self.session.clone(), turn_id.clone());
        let _ = self
            .agents
            .transact(move |t| {
                t.update::<Turn, _>(Scope::within(&owner, &sid), &tid, |turn| turn.status = TurnStatus::Waiting)
            })
            .await;
        let added = held.unwrap_or_else(|| {
            json!({"type": "agent.session.turn.item.added", "session_id": self.session, "turn_id": turn_id,
                   "item": codex_map::function_call_item(&params, &turn_id), "output_index": null})
        });
        self.publish(added);
        if let Ok((session, _)) = session {
            self.publish_session("agent.session.requires_action", &session, false);
        }
    }

    async fn fail_turn(&mut self, code: &str, message: &str, workspace: &Rc<RefCell<Option<OwnedFd>>>) {
        if self.turn.is_some() {
            self.end_turn(
                TurnStatus::Failed,
                Some(json!({"code": code, "message": message})),
                None,
                workspace,
            )
            .await;
        }
    }

    async fn end_turn(
        &mut self,
        status: TurnStatus,
        error: Option<Value>,
        usage: Option<Value>,
        workspace: &Rc<RefCell<Option<OwnedFd>>>,
    ) {
        let Some(mut turn) = self.turn.take() else {
            return;
        };
        for (_, held) in turn.held.drain() {
            self.publish(held);
        }
        let end_ms = now_ms();
        let fd = workspace.borrow().as_ref().and_then(|fd| fd.try_clone().ok());
        let published = match (turn.outputs_before.take(), fd) {
            (Some(before), Some(fd)) => crate::runtime::file::blocking(move || {
                use std::os::fd::AsFd;
                changed(&before, &snapshot(fd.as_fd()))
            })
            .await
            .unwrap_or_default(),
            _ => Vec::new(),
        };
        let session_for_paths = self.load().await.ok();
        let workspace_rel = session_for_paths.as_ref().and_then(|s| s.workspace.clone()).unwrap_or_default();
        let shown_root = session_for_paths
            .as_ref()
            .and_then(|s| s.environment["workspace_directory"].as_str().map(str::to_string))
            .unwrap_or_else(|| "/workspace".into());
        let environment_id = session_for_paths
            .as_ref()
            .and_then(|s| s.environment["id"].as_str().map(str::to_string))
            .unwrap_or_default();
        let now = now_unix();
        let artifacts: Vec<Artifact> = published
            .into_iter()
            .map(|(path, size)| Artifact {
                id: new_id("art_"),
                session_id: self.session.clone(),
                turn_id: turn.id.clone(),
                environment_id: environment_id.clone(),
                path: format!("{}/{OUTPUTS}/{path}", shown_root.trim_end_matches('/')),
                local_path: join_rel(&workspace_rel, &format!("{OUTPUTS}/{path}")),
                size_bytes: size,
                created_at: now,
            })
            .collect();
        let otlp = turn.trace.finish(end_ms, &self.session, &turn.id, status.name());
        let trace = Trace {
            id: turn.id.clone(),
            session_id: self.session.clone(),
            created_at: now,
            otlp,
        };
        let (owner, sid, tid) = (self.owner.clone(), self.session.clone(), turn.id.clone());
        let (kept_error, kept_usage) = (error.clone(), usage.clone());
        let stored = self
            .agents
            .transact(move |t| {
                let scope = Scope::owner(&owner);
                let within = Scope::within(&owner, &sid);
                let turn = t.update::<Turn, _>(within, &tid, |turn| {
                    turn.status = status;
                    turn.completed_at = Some(now);
                    turn.error = kept_error;
                    turn.usage = kept_usage.clone();
                    turn.clone()
                })?;
                let session = t.update::<Session, _>(scope, &sid, |s| {
                    s.status = Status::Idle;
                    s.active_turn = None;
                    s.required_actions.clear();
                    s.last_active_at = now;
                    if let Some(usage) = &kept_usage {
                        s.usage = Some(add_usage(s.usage.take(), usage));
                    }
                    s.clone()
                })?;
                t.create_all(within, artifacts)?;
                t.create(within, trace)?;
                Ok::<_, StoreError>((turn, session))
            })
            .await;
        let (turn_record, session) = match stored {
            Ok(kept) => kept,
            Err(e) => {
                crate::log::line(format_args!("session {}: the turn's end was not kept: {e:?}", self.session));
                return;
            }
        };
        let kind = match status {
            TurnStatus::Completed => "agent.session.turn.completed",
            TurnStatus::Cancelled => "agent.session.turn.cancelled",
            _ => "agent.session.turn.failed",
        };
        self.publish(json!({"type": kind, "session_id": self.session, "turn_id": turn_record.id, "turn": turn_record.object(), "usage": usage}));
        self.publish_session("agent.session.idle", &session, true);
    }
}

/// `rel` joined onto the workspace `base` (both relative to the base directory).
fn join_rel(base: &str, rel: &str) -> String {
    match base.trim_matches('/') {
        "" | "." => rel.to_string(),
        base => format!("{base}/{rel}"),
    }
}

/// An item with its command output bounded to [`ITEM_OUTPUT_BYTES`].
fn truncated(mut item: Value) -> Value {
    if let Some(output) = item["output"].as_str() {
        if output.len() > ITEM_OUTPUT_BYTES {
            let mut end = ITEM_OUTPUT_BYTES;
            while !output.is_char_boundary(end) {
                end -= 1;
            }
            let kept = output[..end].to_string();
            item["output"] = json!(kept);
            item["x_agent_sandbox"]["output_truncated_at"] = json!(ITEM_OUTPUT_BYTES);
        }
    }
    item
}

/// Two `TokenUsage`s added up.
fn add_usage(total: Option<Value>, turn: &Value) -> Value {
    let Some(total) = total else {
        return turn.clone();
    };
    let n = |v: &Value, path: &[&str]| path.iter().fold(v, |v, k| &v[*k]).as_u64().unwrap_or(0);
    let sum = |path: &[&str]| n(&total, path) + n(turn, path);
    json!({
        "input_tokens": sum(&["input_tokens"]),
        "input_tokens_details": {"cached_tokens": sum(&["input_tokens_details", "cached_tokens"])},
        "output_tokens": sum(&["output_tokens"]),
        "output_tokens_details": {"reasoning_tokens": sum(&["output_tokens_details", "reasoning_tokens"])},
        "total_tokens": sum(&["total_tokens"]),
    })
}

enum Next {
    Command(Option<Command>),
    Message(Option<Message>),
    Idle,
}
