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
//! An actor that sees no command and runs no turn for [`idle`] stops its app-server;
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

use super::channel::{Channels, Subscription};
use super::inputs::{codex_input, Input, Part};
use super::outputs::{changed, snapshot, Snapshot, OUTPUTS};
use super::records::{
    Artifact, Item, Session, Status, Trace, Turn, TurnStatus, MAX_ITEMS_PER_TURN, MAX_TURNS,
};
use super::trace::TraceBuilder;
use crate::agents::app_server::{AppServer, AppServerLaunch, Incoming, Message, RpcError};
use crate::agents::codex_map::{self, EventMapper, Fact, Mapped, ThreadPlan, ToolResult, Totals};
use crate::agents::error::AgentError;
use crate::agents::objects::{now_unix, Object};
use crate::agents::records::{new_id, Scope, StoreError, Transaction};
use crate::agents::surface::Agents;
use crate::agents::webhooks;
use crate::process::ChildRegistry;

mod subagents;

/// How long an actor with nothing to do keeps its app-server, by default.
pub const IDLE: Duration = Duration::from_secs(600);

/// `ABX_AGENTS_SESSION_IDLE_SECONDS` (a positive integer), else [`IDLE`]: a sandbox
/// short of memory lets idle codex processes go sooner; the next input resumes the
/// thread either way.
pub fn idle() -> Duration {
    static IDLE_SET: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *IDLE_SET.get_or_init(|| {
        std::env::var("ABX_AGENTS_SESSION_IDLE_SECONDS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|v| *v > 0)
            .map_or(IDLE, Duration::from_secs)
    })
}
/// After a cancel, how long codex may take to end the turn before the interrupt is
/// sent again (codex drops one that comes before its turn has started)...
const CANCEL_RESEND: Duration = Duration::from_secs(2);
/// ...and before the server ends the turn itself, stopping codex's app-server (the next
/// input starts a new one on the same thread).
const CANCEL_GIVE_UP: Duration = Duration::from_secs(10);
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
    /// The agent's whole configuration as codex takes it (`codex_map::thread_plan`),
    /// its MCP servers' bearers resolved from the session's vaults.
    pub agent: Value,
    /// Where codex reaches this server (`http://host:port`), for the MCP relay; `None`
    /// before the server is bound (then codex would get the bearers: never started).
    pub relay_base: Option<String>,
}

/// Why inputs were not applied: the session's refusal, or why its actor could not be
/// started (the caller's own error type: a CLI being installed, a workspace gone).
#[derive(Debug)]
pub enum SendError<E> {
    Agent(AgentError),
    Launch(E),
}

/// What an actor answers a command's inputs with.
enum Outcome {
    Applied(Result<(), AgentError>),
    /// It stopped before it read them (it idled out, its codex ended): another actor
    /// is to take them.
    NotRead(Vec<Input>),
}

enum Command {
    Inputs(Vec<Input>, oneshot::Sender<Outcome>),
    Stop,
}

/// Every running session's actor, and every session's subscribers.
#[derive(Default)]
pub struct Hub {
    pub channels: Channels,
    /// The MCP relay's open capabilities (see [`super::relay`]).
    pub relay: super::relay::Relay,
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
    /// what `launch` makes: called only then, so an input to a running actor builds no
    /// launch) and waits until it has applied them.
    pub async fn send<E, L>(
        self: &Arc<Self>,
        agents: &Arc<Agents>,
        owner: &str,
        session: &Session,
        inputs: Vec<Input>,
        launch: impl FnOnce() -> L,
    ) -> Result<(), SendError<E>>
    where
        L: std::future::Future<Output = Result<Launch, E>>,
    {
        let mut launch = Some(launch);
        let mut inputs = inputs;
        // An actor that stops before it reads them hands the inputs back: a new one
        // takes them (twice at most: an actor stops at once only when it idled out).
        for _ in 0..3 {
            let (reply, answer) = oneshot::channel();
            let command = Command::Inputs(inputs, reply);
            let outcome = self
                .deliver(agents, owner, session, command, answer, &mut launch)
                .await?;
            match outcome {
                Outcome::Applied(result) => return result.map_err(SendError::Agent),
                Outcome::NotRead(back) => inputs = back,
            }
        }
        Err(SendError::Agent(gone()))
    }

    /// Hands `command` to the session's actor, starting one (with `launch`, once) if
    /// none runs, and awaits its `answer`.
    async fn deliver<E, L>(
        self: &Arc<Self>,
        agents: &Arc<Agents>,
        owner: &str,
        session: &Session,
        mut command: Command,
        answer: oneshot::Receiver<Outcome>,
        launch: &mut Option<impl FnOnce() -> L>,
    ) -> Result<Outcome, SendError<E>>
    where
        L: std::future::Future<Output = Result<Launch, E>>,
    {
        let heard = |answer: Result<Outcome, oneshot::Canceled>| async move {
            match answer {
                Ok(outcome) => Ok(outcome),
                Err(_) => Err(SendError::Agent(stopped(agents, owner, &session.id).await)),
            }
        };
        let running = self.actors().get(&session.id).cloned();
        if let Some(actor) = running {
            match actor.unbounded_send(command) {
                Ok(()) => return heard(answer.await).await,
                // It stopped meanwhile: start another.
                Err(e) => command = e.into_inner(),
            }
        }
        let launch = match launch.take() {
            Some(launch) => launch().await.map_err(SendError::Launch)?,
            None => return Err(SendError::Agent(gone())),
        };
        let (tx, rx) = mpsc::unbounded();
        // Looked up and registered under one lock: two inputs that both found no actor
        // start one, and the second joins it.
        let joined = {
            let mut actors = self.actors();
            let sent = match actors.get(&session.id) {
                Some(actor) => actor.unbounded_send(command).map_err(|e| e.into_inner()),
                None => Err(command),
            };
            match sent {
                Ok(()) => true,
                Err(command) => {
                    tx.unbounded_send(command)
                        .map_err(|_| SendError::Agent(gone()))?;
                    actors.insert(session.id.clone(), tx);
                    false
                }
            }
        };
        if !joined {
            let actor = Actor {
                hub: self.clone(),
                agents: agents.clone(),
                owner: owner.to_string(),
                session: session.id.clone(),
                app: None,
                thread: session.thread_id.clone(),
                turn: None,
                model: session.agent["model"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                plan: None,
                totals: Totals::default(),
                children: HashMap::new(),
                relayed: Vec::new(),
            };
            monoio::spawn(actor.run(rx, launch));
        }
        heard(answer.await).await
    }

    /// Stops `session`'s actor and ends its streams (the session was deleted).
    pub fn forget(&self, session: &str) {
        if let Some(actor) = self.actors().remove(session) {
            let _ = actor.unbounded_send(Command::Stop);
        }
        self.relay.close_session(session);
        self.channels.close(session);
    }

    /// Stops every actor (the server is shutting down): their app-servers exit.
    pub fn stop_all(&self) {
        self.relay.close_all();
        for (_, actor) in self.actors().drain() {
            let _ = actor.unbounded_send(Command::Stop);
        }
    }

    /// The actor reading `commands` ends: it leaves the table (unless a newer actor
    /// took its place) and takes no more commands, so a later input starts a new one.
    fn finished(&self, session: &str, commands: &mut mpsc::UnboundedReceiver<Command>) {
        let mut actors = self.actors();
        if actors
            .get(session)
            .is_some_and(|sender| sender.is_connected_to(commands))
        {
            actors.remove(session);
        }
        commands.close();
    }
}

/// Why an actor stopped before it answered an input: its session was deleted meanwhile
/// (404, as for any unknown session: the input raced a DELETE), or it failed (say so,
/// and that the input may be sent again).
async fn stopped(agents: &Arc<Agents>, owner: &str, session: &str) -> AgentError {
    let (owner, id) = (owner.to_string(), session.to_string());
    let exists = agents
        .transact(move |t| t.get::<Session>(Scope::owner(&owner), &id))
        .await;
    match exists {
        Err(error @ StoreError::NotFound) => {
            AgentError::store("session", session, "session_id")(error)
        }
        _ => gone(),
    }
}

fn gone() -> AgentError {
    AgentError::Failed(
        "The session's runner stopped before it answered; send the input again.".into(),
    )
}

/// A turn's end as kept: the session as it now is, and the `error` event saying what of
/// the turn the store refused, if anything.
struct Ended {
    session: Session,
    refusal: Option<Value>,
}

/// The `error` event (the SDK's `AgentSessionErrorEvent`) for a turn whose `what`
/// (items, artifacts, trace) the store refused, the first for `why`.
fn not_kept_error(session: &str, turn: &str, what: &[&str], why: &StoreError) -> Value {
    let (code, reason) = match why {
        StoreError::OverQuota(_) => (
            "agents_store_quota_exceeded",
            "your share of the agents store is full: delete sessions, responses or files to make room",
        ),
        StoreError::TooLarge { .. } => (
            "agents_object_too_large",
            "this session holds the most one session may: start a new session",
        ),
        _ => ("server_error", "the agents store failed"),
    };
    json!({
        "type": "error",
        "session_id": session,
        "error": {
            "type": if code == "server_error" { "server_error" } else { "invalid_request_error" },
            "code": code,
            "param": null,
            "message": format!("Turn {turn} ended, but its {} were not kept: {reason}.", what.join(", ")),
        },
    })
}

/// Logged when codex did not end a cancelled turn in time.
fn tracing_cancel(session: &str) {
    crate::log::line(format_args!(
        "session {session}: codex did not end a cancelled turn within {}s; ending it here and stopping its app-server",
        CANCEL_GIVE_UP.as_secs()
    ));
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
    mapper: EventMapper,
    trace: TraceBuilder,
    outputs_before: Option<Snapshot>,
    pending: HashMap<String, PendingCall>,
    /// When each codex item started (ms), for its span.
    started: HashMap<String, u64>,
    items: usize,
    /// When a cancel was asked for, and how many interrupts went to codex since.
    cancel: Option<(std::time::Instant, u32)>,
    /// What of the turn the store refused (items when the owner's share or the
    /// session's bound was full), said when the turn ends.
    not_kept: Vec<(&'static str, StoreError)>,
}

impl ActiveTurn {
    /// When the cancel's next step is due: resending the interrupt, or giving up on
    /// codex ending the turn.
    fn cancel_due(&self) -> Option<std::time::Instant> {
        self.cancel.map(|(at, sent)| match sent {
            0 | 1 => at + CANCEL_RESEND,
            _ => at + CANCEL_GIVE_UP,
        })
    }
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
    /// What `turn/start` adds (`codex_map::ThreadPlan::turn_start`).
    plan: Option<ThreadPlan>,
    /// The thread's cumulative token counts: the next turn's usage starts from them.
    totals: Totals,
    /// codex sub-agents (child threads) this session's turns opened, by thread id.
    children: HashMap<String, ChildThread>,
    /// The MCP relay's capabilities this actor's codex was given, closed when it stops.
    relayed: Vec<String>,
}

/// A sub-agent's thread and the turn it runs now.
struct ChildThread {
    subagent: String,
    turn: Option<(String, EventMapper)>,
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
        let workspace_fd = launch
            .workspace
            .as_ref()
            .and_then(|(fd, _)| fd.try_clone().ok());
        let started = self.start(launch).await;
        let mut incoming = match started {
            Ok(incoming) => incoming,
            Err(error) => {
                // The input that started it hears why; any later one hears what became
                // of the session (404 once it was deleted), or that it may send again.
                self.hub.relay.close(&self.relayed);
                self.hub.finished(&self.session, &mut commands);
                let mut error = Some(error);
                while let Ok(command) = commands.try_recv() {
                    if let Command::Inputs(_, reply) = command {
                        let outcome = match error.take() {
                            Some(error) => error,
                            None => stopped(&self.agents, &self.owner, &self.session).await,
                        };
                        let _ = reply.send(Outcome::Applied(Err(outcome)));
                    }
                }
                return;
            }
        };
        let workspace = Rc::new(RefCell::new(workspace_fd));
        // Stopped by the hub (a delete, shutdown) rather than by itself (idle, codex
        // gone): then queued inputs hear what became of the session.
        let mut stopped_by_hub = false;
        loop {
            let idle = self.turn.is_none();
            let cancel_due = self.turn.as_ref().and_then(ActiveTurn::cancel_due);
            let next = {
                let command =
                    std::future::poll_fn(|cx| std::pin::Pin::new(&mut commands).poll_next(cx));
                let message = incoming.next();
                let wait = match cancel_due {
                    Some(due) => due.saturating_duration_since(std::time::Instant::now()),
                    None if idle => self::idle(),
                    None => Duration::from_secs(86_400),
                };
                let timeout = monoio::time::sleep(wait);
                monoio::select! {
                    c = command => Next::Command(c),
                    m = message => Next::Message(m),
                    _ = timeout => match cancel_due {
                        Some(_) => Next::CancelDue,
                        None => Next::Idle,
                    },
                }
            };
            match next {
                Next::Command(Some(Command::Inputs(inputs, reply))) => {
                    let result = self
                        .apply(inputs, &workspace, workspace_path.as_deref())
                        .await;
                    let _ = reply.send(Outcome::Applied(result));
                }
                Next::Command(Some(Command::Stop)) | Next::Command(None) => {
                    stopped_by_hub = true;
                    break;
                }
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
                        stderr_tail
                            .last()
                            .map(|l| format!(": {l}"))
                            .unwrap_or_default()
                    );
                    self.fail_turn("connection_failed", &why, &workspace).await;
                    self.app = None;
                    break;
                }
                Next::Message(None) => break,
                Next::Idle => break,
                Next::CancelDue => {
                    if !self.cancel_step(&workspace).await {
                        break;
                    }
                }
            }
        }
        self.hub.relay.close(&self.relayed);
        self.hub.finished(&self.session, &mut commands);
        // Inputs queued before it closed: a new actor takes them, unless the hub
        // stopped this one (then they hear what became of the session: 404 once it was
        // deleted).
        while let Ok(command) = commands.try_recv() {
            if let Command::Inputs(inputs, reply) = command {
                let outcome = match stopped_by_hub {
                    false => Outcome::NotRead(inputs),
                    true => {
                        Outcome::Applied(Err(
                            stopped(&self.agents, &self.owner, &self.session).await
                        ))
                    }
                };
                let _ = reply.send(outcome);
            }
        }
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
                .map_err(|e| {
                    AgentError::Failed(format!(
                        "The session's scratch directory cannot be made: {e}"
                    ))
                })?;
                (fd, launch.scratch.clone(), "read-only")
            }
        };
        let mut agent = launch.agent;
        let Some(base) = launch.relay_base.as_deref() else {
            return Err(AgentError::Failed(
                "the server's address is not known yet: send the input again".into(),
            ));
        };
        self.relayed = super::relay::relay_tools(&self.hub.relay, &self.session, base, &mut agent);
        let mut plan = codex_map::thread_plan(&agent, &cwd_path.to_string_lossy())
            .map_err(|u| AgentError::invalid(u.param, u.message))?;
        let mut env = launch.env;
        for (name, token) in &plan.env {
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
        let mut params = plan.thread_start.clone();
        params["sandbox"] = json!(sandbox);
        if session.review.as_deref() == Some("auto_review") {
            params["approvalsReviewer"] = json!("auto_review");
        }
        let app = Rc::new(app);
        let thread = match &self.thread {
            Some(thread) => {
                params["threadId"] = json!(thread);
                params["excludeTurns"] = json!(true);
                // codex keeps a thread's tools; resume takes none.
                if let Some(p) = params.as_object_mut() {
                    p.remove("dynamicTools");
                }
                app.request("thread/resume", params).await.map_err(|e| {
                    AgentError::Failed(format!(
                        "codex could not resume the session's thread {thread}: {}",
                        e.message
                    ))
                })?;
                thread.clone()
            }
            None => {
                let started = app.request("thread/start", params).await.map_err(|e| {
                    AgentError::Failed(format!("codex could not start a thread: {}", e.message))
                })?;
                let thread = started["thread"]["id"]
                    .as_str()
                    .ok_or_else(|| {
                        AgentError::Failed("codex started a thread without an id".into())
                    })?
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
        plan.env.clear();
        self.plan = Some(plan);
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
    /// Changes the stored turn `turn_id` of this session with `f`. What cannot be kept
    /// is not the caller's to answer: the events already said it.
    async fn update_turn(&self, turn_id: &str, f: impl FnOnce(&mut Turn) + Send + 'static) {
        let (owner, session, tid) = (
            self.owner.clone(),
            self.session.clone(),
            turn_id.to_string(),
        );
        let _ = self
            .agents
            .transact(move |t| t.update::<Turn, _>(Scope::within(&owner, &session), &tid, f))
            .await;
    }

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
        self.hub.channels.publish(
            &self.session,
            json!({"type": kind, "session": session.object()}),
            ends_turn,
        );
    }

    /// Tells the owner's webhook endpoints (after the status is committed and
    /// published, as every announcement of it is).
    async fn announce(&self, kind: &'static str, session: &Session) {
        let data = webhooks::session_data(&self.session, session.environment["id"].as_str());
        webhooks::emit(&self.agents, &self.owner, kind, data).await;
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
                    result,
                } => self.tool_result(&turn_id, &call_id, result).await?,
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
        let agent_id = self.load().await?.agent["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let turn = Turn {
            id: turn_id.clone(),
            session_id: self.session.clone(),
            agent_id,
            status: TurnStatus::InProgress,
            created_at: now,
            started_at: Some(now),
            completed_at: None,
            error: None,
            subagent_id: None,
            usage: None,
            codex_turn_id: None,
            items: Vec::new(),
            started_ms,
            not_kept: Vec::new(),
        };
        let (owner, id) = (self.owner.clone(), self.session.clone());
        let kept_turn = turn.clone();
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
                t.create(Scope::within(&owner, &id), kept_turn)?;
                Ok::<_, AgentError>(session)
            })
            .await?;
        let fd = workspace
            .borrow()
            .as_ref()
            .and_then(|fd| fd.try_clone().ok());
        let outputs_before = match fd {
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
        self.announce("agent.session.in_progress", &session).await;
        let thread = self.thread.clone().unwrap_or_default();
        self.turn = Some(ActiveTurn {
            id: turn_id.clone(),
            codex_turn: None,
            mapper: EventMapper::new(turn.object(), &thread, None, self.totals),
            trace: TraceBuilder::new(started_ms),
            outputs_before,
            pending: HashMap::new(),
            started: HashMap::new(),
            items: 0,
            cancel: None,
            not_kept: Vec::new(),
        });
        if let Some(model) = session.agent["model"].as_str() {
            self.model = model.to_string();
        }
        let (Some(app), Some(plan)) = (self.app.clone(), self.plan.as_ref()) else {
            self.fail_turn(
                "connection_failed",
                "codex app-server is not running",
                workspace,
            )
            .await;
            return Ok(());
        };
        let mut params = codex_map::turn_start_params(&thread, codex_input(&messages), plan);
        // What an update changed since the thread started applies from this turn on
        // (codex keeps a turn's overrides for the later ones).
        if let Some(model) = session.agent["model"].as_str() {
            params["model"] = json!(model);
        }
        if let Some(effort) = session.agent["reasoning"]["effort"].as_str() {
            params["effort"] = json!(effort);
        }
        // The answer comes while notifications flow; `turn/started` may come first.
        match app.request("turn/start", params).await {
            Ok(answer) => {
                let codex = answer["turn"]["id"].as_str().map(str::to_string);
                if let Some(turn) = self.turn.as_mut() {
                    turn.codex_turn = codex.clone();
                }
                self.update_turn(&turn_id, |turn| turn.codex_turn_id = codex)
                    .await;
            }
            Err(e) => {
                self.fail_turn(
                    "server_error",
                    &format!("codex refused the turn: {}", e.message),
                    workspace,
                )
                .await;
            }
        }
        Ok(())
    }

    async fn steer(&mut self, messages: Vec<Vec<Part>>) -> Result<(), AgentError> {
        let Some(turn) = self.turn.as_ref() else {
            return Ok(());
        };
        let codex_turn = turn.codex_turn.clone();
        let app = self.app.clone().ok_or_else(gone)?;
        // The steered input is a user message item of the running turn: codex reports
        // it, and the mapper shows and keeps it like the first.
        app.request(
            "turn/steer",
            json!({"threadId": self.thread, "input": codex_input(&messages), "expectedTurnId": codex_turn}),
        )
        .await
        .map_err(|e| AgentError::Busy {
            id: format!("{} ({})", self.session, e.message),
            param: "events",
        })?;
        Ok(())
    }

    /// Asks codex to interrupt the running turn, and remembers the cancel until the turn
    /// ends: the interrupt is sent again when codex reports the turn started (one sent
    /// before is dropped) and when [`CANCEL_RESEND`] passes; after [`CANCEL_GIVE_UP`]
    /// the server ends the turn itself. So no cancel is lost, whenever it comes.
    async fn cancel(&mut self) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if turn.cancel.is_none() {
            turn.cancel = Some((std::time::Instant::now(), 0));
        }
        // A waiting function call is answered first, so codex can stop.
        let pending: Vec<PendingCall> = turn.pending.drain().map(|(_, p)| p).collect();
        if let Some(app) = self.app.clone() {
            for call in pending {
                app.respond(
                    call.request,
                    Err(RpcError::new(-32000, "the turn was cancelled")),
                );
            }
        }
        self.interrupt();
    }

    /// Sends codex `turn/interrupt` for the running turn (its answer waits until codex
    /// aborted the turn; the turn's end says the rest).
    fn interrupt(&mut self) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if let Some((_, sent)) = turn.cancel.as_mut() {
            *sent += 1;
        }
        let Some(app) = self.app.clone() else {
            return;
        };
        let params =
            json!({"threadId": self.thread, "turnId": turn.codex_turn.clone().unwrap_or_default()});
        monoio::spawn(async move {
            let _ = app.request("turn/interrupt", params).await;
        });
    }

    /// A cancelled turn that has not ended in time: the interrupt again, or, past
    /// [`CANCEL_GIVE_UP`], the turn ended here as cancelled and codex's app-server
    /// stopped with everything it runs. False when the actor is to stop.
    async fn cancel_step(&mut self, workspace: &Rc<RefCell<Option<OwnedFd>>>) -> bool {
        let Some((_, sent)) = self.turn.as_ref().and_then(|t| t.cancel) else {
            return true;
        };
        if sent < 2 {
            self.interrupt();
            return true;
        }
        tracing_cancel(&self.session);
        self.end_here("cancelled", None, workspace).await;
        if let Some(app) = self.app.take() {
            if let Ok(app) = Rc::try_unwrap(app) {
                app.shutdown().await;
            }
        }
        false
    }

    async fn tool_result(
        &mut self,
        turn_id: &str,
        call_id: &str,
        result: ToolResult,
    ) -> Result<(), AgentError> {
        let unknown =
            || AgentError::invalid("events", format!("Unknown pending tool call: {call_id}"));
        let turn = self.turn.as_mut().ok_or_else(unknown)?;
        match turn.pending.get(call_id) {
            Some(call) if call.turn_id == turn_id => {}
            _ => return Err(unknown()),
        }
        let call = turn.pending.remove(call_id).ok_or_else(unknown)?;
        let (answer, mapped) = turn.mapper.tool_result(call_id, &result);
        let waiting = !turn.pending.is_empty();
        let app = self.app.clone().ok_or_else(gone)?;
        app.respond(call.request, Ok(answer));
        let call_id = call_id.to_string();
        let tid = turn_id.to_string();
        let (session, _) = self
            .update_session(move |s| {
                s.required_actions
                    .retain(|a| a["call_id"].as_str() != Some(&call_id));
                if !waiting {
                    s.status = Status::InProgress;
                }
                true
            })
            .await?;
        if !waiting {
            self.update_turn(&tid, |turn| turn.status = TurnStatus::InProgress)
                .await;
        }
        self.apply_mapped(mapped, None).await;
        if !waiting {
            self.publish_session("agent.session.in_progress", &session, false);
            self.announce("agent.session.in_progress", &session).await;
        }
        Ok(())
    }

    /// Keeps `items` of the running root turn (as many as its bound allows).
    async fn store_items(&mut self, items: Vec<Value>) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        turn.items += items.len();
        if turn.items > MAX_ITEMS_PER_TURN {
            return;
        }
        let (owner, session, tid) = (self.owner.clone(), self.session.clone(), turn.id.clone());
        let result = self
            .agents
            .transact(move |t| {
                let within = Scope::within(&owner, &session);
                let ids: Vec<String> = items
                    .iter()
                    .map(|i| i["id"].as_str().unwrap_or_default().to_string())
                    .collect();
                for item in items {
                    // codex reports an item again when it changes: the last word is kept.
                    let id = item["id"].as_str().unwrap_or_default().to_string();
                    match t.get::<Item>(within, &id) {
                        Ok(_) => t.put(within, Item(item))?,
                        Err(StoreError::NotFound) => t.create(within, Item(item))?,
                        Err(e) => return Err(e),
                    }
                }
                t.update::<Turn, _>(within, &tid, |turn| {
                    for id in ids {
                        if !turn.items.contains(&id) {
                            turn.items.push(id);
                        }
                    }
                })?;
                Ok::<_, StoreError>(())
            })
            .await;
        if let Err(e) = result {
            // Full: the stream showed the item; the turn's end says it was not kept.
            if let Some(turn) = self.turn.as_mut() {
                if !turn.not_kept.iter().any(|(what, _)| *what == "items") {
                    turn.not_kept.push(("items", e));
                }
            }
        }
    }

    /// Applies what the mapper said: facts first (stored, calls registered), then its
    /// events, so no event announces what the store does not hold yet.
    async fn apply_mapped(
        &mut self,
        mapped: Mapped,
        workspace: Option<&Rc<RefCell<Option<OwnedFd>>>>,
    ) {
        let mut ended = None;
        let mut calls = Vec::new();
        let mut items = Vec::new();
        for fact in mapped.facts {
            match fact {
                Fact::Item(item) => items.push(truncated(item)),
                Fact::ToolCall(call) => calls.push(call),
                Fact::TurnEnded(end) => ended = Some(end),
            }
        }
        if !items.is_empty() {
            self.store_items(items).await;
        }
        let mut requires_action = None;
        for call in calls {
            let action = call.required_action.clone();
            let tid = self.turn.as_ref().map(|t| t.id.clone()).unwrap_or_default();
            if let Ok((session, _)) = self
                .update_session(move |s| {
                    s.required_actions.push(action);
                    s.status = Status::RequiresAction;
                    true
                })
                .await
            {
                requires_action = Some(session);
            }
            self.update_turn(&tid, |turn| turn.status = TurnStatus::Waiting)
                .await;
        }
        let failed = ended.as_ref().is_some_and(|end| end.status == "failed");
        let end_state = match (ended, workspace) {
            (Some(end), Some(workspace)) => self.end_turn(end, workspace).await,
            _ => None,
        };
        for event in mapped.events {
            self.publish(event);
        }
        if let Some(session) = requires_action {
            self.publish_session("agent.session.requires_action", &session, false);
        }
        if let Some(Ended { session, refusal }) = end_state {
            if let Some(event) = refusal {
                self.publish(event);
            }
            self.publish_session("agent.session.idle", &session, true);
            if failed {
                self.announce("agent.session.failed", &session).await;
            }
            self.announce("agent.session.idle", &session).await;
        }
    }

    async fn notification(
        &mut self,
        method: &str,
        params: Value,
        workspace: &Rc<RefCell<Option<OwnedFd>>>,
    ) {
        if method == "thread/tokenUsage/updated"
            && params["threadId"].as_str() == self.thread.as_deref()
        {
            if let Some(turn) = self.turn.as_mut() {
                turn.trace
                    .model_request(now_ms(), &self.model, &params["tokenUsage"]["last"]);
            } else {
                // Replayed after a resume: where the next turn's usage counts from.
                self.totals = Totals::of(&params["tokenUsage"]["total"]);
            }
        }
        if params["threadId"].as_str() != self.thread.as_deref() || method == "thread/started" {
            self.child_notification(method, &params).await;
            return;
        }
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if method == "turn/started" && turn.cancel.is_some() {
            self.interrupt();
        }
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        let item = &params["item"];
        let item_id = item["id"].as_str().unwrap_or_default().to_string();
        match method {
            "item/started" => {
                let at = params["startedAtMs"].as_u64().unwrap_or_else(now_ms);
                turn.started.insert(item_id, at);
            }
            "item/completed" => {
                let span = match item["type"].as_str() {
                    Some("commandExecution") => Some("command_execution"),
                    Some("dynamicToolCall") => Some("function_call"),
                    Some("mcpToolCall") => Some("mcp_call"),
                    Some("webSearch") => Some("web_search_call"),
                    _ => None,
                };
                if let Some(name) = span {
                    let end = params["completedAtMs"].as_u64().unwrap_or_else(now_ms);
                    let start = turn.started.get(&item_id).copied().unwrap_or(end);
                    let mut attributes = vec![("agent.item.id".to_string(), json!(item_id))];
                    if let Some(command) = item["command"].as_str() {
                        attributes.push(("process.command".into(), json!(command)));
                    }
                    if let Some(tool) = item["tool"].as_str() {
                        attributes.push(("tool.name".into(), json!(tool)));
                    }
                    let failed = matches!(item["status"].as_str(), Some("failed" | "declined"));
                    turn.trace.tool_call(name, start, end, attributes, failed);
                }
            }
            _ => {}
        }
        let mapped = turn.mapper.notification(method, &params);
        self.apply_mapped(mapped, Some(workspace)).await;
    }

    async fn request(&mut self, id: Value, method: &str, params: Value) {
        let Some(app) = self.app.clone() else {
            return;
        };
        let mapped = match (method, self.turn.as_mut()) {
            ("item/tool/call", Some(turn)) => {
                turn.mapper.tool_call(&params).map(|m| (m, turn.id.clone()))
            }
            _ => None,
        };
        let Some((mapped, turn_id)) = mapped else {
            // Approvals never reach a client: the thread runs with approvalPolicy never,
            // and anything else codex asks is refused so the turn never blocks on it.
            app.respond(
                id,
                Err(RpcError::new(
                    -32601,
                    format!("agent-sandbox answers no {method} request"),
                )),
            );
            return;
        };
        for fact in &mapped.facts {
            if let Fact::ToolCall(call) = fact {
                if let Some(turn) = self.turn.as_mut() {
                    turn.pending.insert(
                        call.call_id.clone(),
                        PendingCall {
                            request: id.clone(),
                            turn_id: turn_id.clone(),
                        },
                    );
                }
            }
        }
        self.apply_mapped(mapped, None).await;
    }

    async fn fail_turn(
        &mut self,
        code: &str,
        message: &str,
        workspace: &Rc<RefCell<Option<OwnedFd>>>,
    ) {
        let error = json!({"code": code, "message": message});
        self.end_here("failed", Some(error), workspace).await;
    }

    /// Ends the running turn from this side (codex did not or cannot): `failed` with
    /// its `error`, or `cancelled`.
    async fn end_here(
        &mut self,
        status: &'static str,
        error: Option<Value>,
        workspace: &Rc<RefCell<Option<OwnedFd>>>,
    ) {
        let Some(turn) = self.turn.as_ref() else {
            return;
        };
        let mut object = turn.mapper.turn().clone();
        object["status"] = json!(status);
        object["error"] = error.clone().unwrap_or(Value::Null);
        let end = codex_map::TurnEnd {
            status,
            error,
            usage: Totals::default().usage(),
            thread_total: self.totals,
            turn: object.clone(),
        };
        let kind = match status {
            "cancelled" => "agent.session.turn.cancelled",
            _ => "agent.session.turn.failed",
        };
        let event = json!({"type": kind, "session_id": self.session,
                           "turn_id": turn.id, "turn": object, "usage": end.usage});
        let mapped = Mapped {
            events: vec![event],
            facts: vec![Fact::TurnEnded(end)],
        };
        self.apply_mapped(mapped, Some(workspace)).await;
    }

    /// Stores the end of the running turn (its record, the session idle, its artifacts
    /// and trace) and answers the session as it now is.
    async fn end_turn(
        &mut self,
        end: codex_map::TurnEnd,
        workspace: &Rc<RefCell<Option<OwnedFd>>>,
    ) -> Option<Ended> {
        let mut turn = self.turn.take()?;
        self.totals = end.thread_total;
        let status = match end.status {
            "completed" => TurnStatus::Completed,
            "cancelled" => TurnStatus::Cancelled,
            _ => TurnStatus::Failed,
        };
        let (error, usage) = (end.error, Some(end.usage));
        let end_ms = now_ms();
        let fd = workspace
            .borrow()
            .as_ref()
            .and_then(|fd| fd.try_clone().ok());
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
        let workspace_rel = session_for_paths
            .as_ref()
            .and_then(|s| s.workspace.clone())
            .unwrap_or_default();
        let shown_root = session_for_paths
            .as_ref()
            .and_then(|s| {
                s.environment["workspace_directory"]
                    .as_str()
                    .map(str::to_string)
            })
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
        let otlp = turn
            .trace
            .finish(end_ms, &self.session, &turn.id, status.name());
        let trace = Trace {
            id: turn.id.clone(),
            session_id: self.session.clone(),
            created_at: now,
            otlp,
        };
        let (owner, sid, tid) = (self.owner.clone(), self.session.clone(), turn.id.clone());
        let (kept_error, kept_usage) = (error.clone(), usage.clone());
        // First, alone: the turn's end and the session back to idle. These only rewrite
        // records that exist, which no quota refuses, so a full store never leaves a
        // session in progress (nor its stream without `idle`).
        let essential = self
            .agents
            .transact(move |t| {
                let scope = Scope::owner(&owner);
                let within = Scope::within(&owner, &sid);
                t.update::<Turn, _>(within, &tid, |turn| {
                    turn.status = status;
                    turn.completed_at = Some(now);
                    turn.error = kept_error;
                    turn.usage = kept_usage.clone();
                })?;
                t.update::<Session, _>(scope, &sid, |s| {
                    s.status = Status::Idle;
                    s.active_turn = None;
                    s.required_actions.clear();
                    s.last_active_at = now;
                    if let Some(usage) = &kept_usage {
                        s.usage = Some(add_usage(s.usage.take(), usage));
                    }
                    s.clone()
                })
            })
            .await;
        let session = match essential {
            Ok(session) => session,
            Err(e) => {
                crate::log::line(format_args!(
                    "session {}: the turn's end was not kept: {e:?}",
                    self.session
                ));
                return None;
            }
        };
        // Then what the turn made, each on its own: what the store refuses is said.
        let mut not_kept = std::mem::take(&mut turn.not_kept);
        let within = (self.owner.clone(), self.session.clone());
        if !artifacts.is_empty() {
            let (owner, sid) = within.clone();
            let kept = self
                .agents
                .transact(move |t| t.create_all(Scope::within(&owner, &sid), artifacts))
                .await;
            if let Err(e) = kept {
                not_kept.push(("artifacts", e));
            }
        }
        let (owner, sid) = within.clone();
        let kept = self
            .agents
            .transact(move |t| t.create(Scope::within(&owner, &sid), trace))
            .await;
        if let Err(e) = kept {
            not_kept.push(("trace", e));
        }
        let refusal = match not_kept.is_empty() {
            true => None,
            false => {
                let what: Vec<&str> = not_kept.iter().map(|(w, _)| *w).collect();
                let noted: Vec<String> = what.iter().map(|w| w.to_string()).collect();
                self.update_turn(&turn.id, |kept| kept.not_kept = noted)
                    .await;
                Some(not_kept_error(
                    &self.session,
                    &turn.id,
                    &what,
                    &not_kept[0].1,
                ))
            }
        };
        Some(Ended { session, refusal })
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
    /// A cancelled turn has not ended in time.
    CancelDue,
}
