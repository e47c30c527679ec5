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
//! What the actor decides is [`core::Core`]'s, a state machine without I/O; this module is
//! its shell: one loop that always selects on the hub's commands, codex's messages, RPC
//! answers and the core's next deadline, feeds each to the core and carries out the
//! effects it answers with, in order. No RPC is awaited inline (answers are awaited on
//! tasks of their own, so codex's messages keep being read), and each has a deadline.
//!
//! An actor that sees no command and runs no turn for [`idle`] stops its app-server;
//! the next input starts a new one, which resumes the thread (`thread/resume`: codex
//! keeps threads on disk, under `CODEX_HOME`). A server restart is the same, with the
//! turn that was running marked failed when the store opens.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_channel::{mpsc, oneshot};
use serde_json::{json, Value};

use super::channel::{Channels, Subscription};
use super::inputs::Input;
use super::outputs::{changed, snapshot, Snapshot, OUTPUTS};
use super::records::{Artifact, Item, Session, Status, Turn, TurnStatus, MAX_TURNS};
use crate::agents::app_server::{AppServer, AppServerLaunch, Incoming, Message, RpcError};
use crate::agents::codex_map::{self, EventMapper};
use crate::agents::error::AgentError;
use crate::agents::objects::now_unix;
use crate::agents::records::{new_id, Scope, StoreError, Transaction};
use crate::agents::surface::Agents;
use crate::agents::webhooks;
use crate::process::ChildRegistry;
use core::{Core, CoreInput, Effect, Now, Reply, RpcId, Started, Stored, Waiter, Write};

mod core;
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
    /// The runtime whose CLI `program` is: codex, or claude-code (one long-lived
    /// Claude Code translated into codex's protocol, `crate::agents::claude::thread`).
    pub runtime: crate::agents::Runtime,
    /// Where Claude Code's per-session config directories go
    /// (`<ABX_STATE_DIR>/claude-code`).
    pub claude_home: PathBuf,
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
                Err(_) => Err(SendError::Agent(
                    stopped_why(agents, owner, &session.id).await,
                )),
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
                workspace: None,
                children: HashMap::new(),
                relayed: Vec::new(),
                model_relay: None,
                waiters: HashMap::new(),
                next_waiter: 0,
            };
            monoio::spawn(actor.run(rx, launch, session.clone()));
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
async fn stopped_why(agents: &Arc<Agents>, owner: &str, session: &str) -> AgentError {
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

fn now() -> Now {
    Now {
        at: Instant::now(),
        ms: now_ms(),
    }
}

/// The shell around a session's [`Core`]: it owns what the core may not touch (codex's
/// process, the store, the channels, the waiting requests), feeds the core what
/// happens, and carries out what the core decides, in its order.
struct Actor {
    hub: Arc<Hub>,
    agents: Arc<Agents>,
    owner: String,
    session: String,
    app: Option<AppServer>,
    /// The workspace, for the snapshots of its outputs (`None`: environment `none`).
    workspace: Option<OwnedFd>,
    /// codex sub-agents (child threads) this session's turns opened, by thread id.
    children: HashMap<String, ChildThread>,
    /// The MCP relay's capabilities this actor's codex was given, closed when it stops.
    relayed: Vec<String>,
    /// The model relay's capability of this actor's Claude Code, closed when it stops.
    model_relay: Option<crate::agents::claude::relay::Opened>,
    /// The reply slots of the commands the core holds.
    waiters: HashMap<Waiter, oneshot::Sender<Outcome>>,
    next_waiter: Waiter,
}

/// What woke the actor's loop.
enum Next {
    Command(Option<Command>),
    Message(Option<Message>),
    Answer(Option<(RpcId, Result<Value, RpcError>)>),
    Tick,
}

type Answers = mpsc::UnboundedSender<(RpcId, Result<Value, RpcError>)>;

impl Actor {
    /// One loop, always ready for a command, a codex message, an RPC answer or the
    /// core's next deadline; each is fed to the core and its effects carried out before
    /// the next (a commit's result goes straight back to the core).
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        launch: Launch,
        session: Session,
    ) {
        use futures_core::Stream;
        let mut core = Core::new(&session, idle(), now());
        self.workspace = launch
            .workspace
            .as_ref()
            .and_then(|(fd, _)| fd.try_clone().ok());
        let mut launch = Some(launch);
        let mut incoming: Option<Incoming> = None;
        let (answers_tx, mut answers) = mpsc::unbounded();
        let mut next = Some(CoreInput::Start);
        let mut stopped = false;
        loop {
            if let Some(input) = next.take() {
                let mut effects: VecDeque<Effect> = core.on(now(), input).into();
                while let Some(effect) = effects.pop_front() {
                    let fed = self
                        .execute(
                            effect,
                            &mut launch,
                            &mut incoming,
                            &answers_tx,
                            &mut stopped,
                        )
                        .await;
                    if let Some(fed) = fed {
                        effects.extend(core.on(now(), fed));
                    }
                }
            }
            if stopped {
                break;
            }
            let deadline = core.deadline();
            let woke = {
                let command =
                    std::future::poll_fn(|cx| std::pin::Pin::new(&mut commands).poll_next(cx));
                let message = async {
                    match incoming.as_mut() {
                        Some(incoming) => incoming.next().await,
                        None => std::future::pending().await,
                    }
                };
                let answer =
                    std::future::poll_fn(|cx| std::pin::Pin::new(&mut answers).poll_next(cx));
                let timer = async {
                    match deadline {
                        Some(at) => {
                            monoio::time::sleep(at.saturating_duration_since(Instant::now())).await
                        }
                        None => std::future::pending().await,
                    }
                };
                monoio::select! {
                    c = command => Next::Command(c),
                    m = message => Next::Message(m),
                    a = answer => Next::Answer(a),
                    _ = timer => Next::Tick,
                }
            };
            next = Some(match woke {
                Next::Command(Some(Command::Inputs(inputs, reply))) => CoreInput::Command {
                    waiter: self.wait(reply),
                    inputs,
                },
                Next::Command(Some(Command::Stop)) | Next::Command(None) => CoreInput::Stop,
                Next::Message(Some(Message::Notification { method, params })) => {
                    CoreInput::Notification { method, params }
                }
                Next::Message(Some(Message::Request { id, method, params })) => {
                    CoreInput::Request { id, method, params }
                }
                Next::Message(Some(Message::Exited { stderr_tail, .. })) => CoreInput::Exited {
                    why: format!(
                        "codex app-server exited{}",
                        stderr_tail
                            .last()
                            .map(|l| format!(": {l}"))
                            .unwrap_or_default()
                    ),
                },
                Next::Message(None) => {
                    incoming = None;
                    CoreInput::Exited {
                        why: "codex app-server exited".into(),
                    }
                }
                Next::Answer(Some((id, result))) => CoreInput::Answer { id, result },
                Next::Answer(None) | Next::Tick => CoreInput::Tick,
            });
        }
        self.hub.relay.close(&self.relayed);
        self.hub.finished(&self.session, &mut commands);
        // Inputs queued before it closed: the core answers them as it answered its own
        // (handed back to a new actor, or what became of the session).
        while let Ok(command) = commands.try_recv() {
            if let Command::Inputs(inputs, reply) = command {
                let waiter = self.wait(reply);
                for effect in core.on(now(), CoreInput::Command { waiter, inputs }) {
                    let _ = self
                        .execute(effect, &mut None, &mut None, &answers_tx, &mut stopped)
                        .await;
                }
            }
        }
        if let Some(app) = self.app.take() {
            app.shutdown().await;
        }
    }

    fn wait(&mut self, reply: oneshot::Sender<Outcome>) -> Waiter {
        let waiter = self.next_waiter;
        self.next_waiter += 1;
        self.waiters.insert(waiter, reply);
        waiter
    }

    /// Carries out one effect; what it produced for the core, if anything.
    async fn execute(
        &mut self,
        effect: Effect,
        launch: &mut Option<Launch>,
        incoming: &mut Option<Incoming>,
        answers: &Answers,
        stopped: &mut bool,
    ) -> Option<CoreInput> {
        match effect {
            Effect::StartAppServer => {
                let started = match launch.take() {
                    Some(launch) => self.start(launch).await,
                    None => Err(gone()),
                };
                Some(CoreInput::Started(started.map(|(started, messages)| {
                    *incoming = Some(messages);
                    started
                })))
            }
            Effect::Rpc { id, method, params } => {
                let answers = answers.clone();
                match &self.app {
                    Some(app) => {
                        let answer = app.request_detached(method, params);
                        monoio::spawn(async move {
                            let _ = answers.unbounded_send((id, answer.await));
                        });
                    }
                    None => {
                        let error =
                            RpcError::new(RpcError::EXITED, "codex app-server is not running");
                        let _ = answers.unbounded_send((id, Err(error)));
                    }
                }
                None
            }
            Effect::Respond { request, result } => {
                if let Some(app) = &self.app {
                    app.respond(request, result);
                }
                None
            }
            Effect::Commit(write) => Some(CoreInput::Committed(self.commit(write).await)),
            Effect::Publish { event, ends_turn } => {
                self.hub.channels.publish(&self.session, event, ends_turn);
                None
            }
            Effect::Announce { kind, session } => {
                // After the status is committed and published, as every announcement of it.
                let data =
                    webhooks::session_data(&self.session, session.environment["id"].as_str());
                webhooks::emit(&self.agents, &self.owner, kind, data).await;
                None
            }
            Effect::Answer { waiter, reply } => {
                let outcome = match reply {
                    Reply::Applied(result) => Outcome::Applied(result),
                    Reply::NotRead(inputs) => Outcome::NotRead(inputs),
                    Reply::Stopped => {
                        Outcome::Applied(Err(
                            stopped_why(&self.agents, &self.owner, &self.session).await
                        ))
                    }
                };
                if let Some(reply) = self.waiters.remove(&waiter) {
                    let _ = reply.send(outcome);
                }
                None
            }
            Effect::RunTool {
                id,
                call_id,
                arguments,
            } => {
                // On a task of its own, as RPC answers are: the loop goes on reading.
                let (agents, owner, session) = (
                    self.agents.clone(),
                    self.owner.clone(),
                    self.session.clone(),
                );
                let answers = answers.clone();
                monoio::spawn(async move {
                    let output = crate::agents::automations::agent_tool(
                        &agents, &owner, &session, &call_id, &arguments,
                    )
                    .await;
                    let result = output
                        .map(Value::String)
                        .map_err(|why| RpcError::new(RpcError::INTERNAL_ERROR, why));
                    let _ = answers.unbounded_send((id, result));
                });
                None
            }
            Effect::OpenChild { thread, name } => {
                self.open_subagent(&thread, name, now_unix()).await;
                None
            }
            Effect::Child { method, params } => {
                self.child_notification(&method, &params).await;
                None
            }
            Effect::Log(line) => {
                crate::log::line(format_args!("{line}"));
                None
            }
            Effect::Stop => {
                *stopped = true;
                None
            }
        }
    }

    /// Starts the app-server; what `thread/start` (or `thread/resume`) takes.
    async fn start(&mut self, mut launch: Launch) -> Result<(Started, Incoming), AgentError> {
        let session = self.load().await?;
        let (cwd_fd, cwd_path, sandbox) = match launch.workspace.take() {
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
        if launch.runtime == crate::agents::Runtime::ClaudeCode {
            return self.start_claude(launch, &session, cwd_fd, &cwd_path).await;
        }
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
            claude: None,
        };
        let (app, incoming) = AppServer::start(spawn, &launch.registry, "agent-sandbox")
            .await
            .map_err(|e| AgentError::Failed(format!("codex app-server did not start: {e}")))?;
        let mut params = plan.thread_start.clone();
        params["sandbox"] = json!(sandbox);
        if session.review.as_deref() == Some("auto_review") {
            params["approvalsReviewer"] = json!("auto_review");
        }
        self.app = Some(app);
        plan.env.clear();
        let started = Started {
            thread_params: params,
            plan,
        };
        Ok((started, incoming))
    }

    /// Starts the session's Claude Code: its CLI session continues the stored thread id
    /// (a resume) or gets a new one, in a config directory of its own; the agent's model
    /// and instructions are its flags. It takes no tools (refused when the session was
    /// created), so the plan the core reads is a bare one.
    async fn start_claude(
        &mut self,
        launch: Launch,
        session: &Session,
        cwd_fd: OwnedFd,
        cwd_path: &std::path::Path,
    ) -> Result<(Started, Incoming), AgentError> {
        use crate::agents::claude;
        use crate::agents::runtime::TurnSession;
        let resumed = session
            .thread_id
            .clone()
            .filter(|id| claude::is_session_id(id));
        let thread = resumed.clone().unwrap_or_else(claude::new_session_id);
        let cli_session = match &resumed {
            Some(id) => TurnSession::Resume(id),
            None => TurnSession::Named(&thread),
        };
        let model = launch.agent["model"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let instructions = launch.agent["instructions"].as_str();
        let args = claude::session_args(cli_session, claude::agent_model(&model), instructions);
        let mut env = launch.env;
        claude::environment(&launch.claude_home, &thread, &mut env).await?;
        self.model_relay = crate::agents::run::relay_env(launch.relay_base.as_deref(), &mut env)?;
        let cwd = cwd_path.to_string_lossy().into_owned();
        let bare = json!({"model": model, "tools": []});
        let plan = codex_map::thread_plan(&bare, &cwd)
            .map_err(|u| AgentError::invalid(u.param, u.message))?;
        let spawn = AppServerLaunch {
            program: launch.program,
            args,
            cwd: cwd_fd,
            env,
            claude: Some(claude::thread::ClaudeThread::new(
                &thread,
                &cwd,
                claude::agent_model(&model),
            )),
        };
        let (app, incoming) = AppServer::start(spawn, &launch.registry, "agent-sandbox")
            .await
            .map_err(|e| AgentError::Failed(format!("claude did not start: {e}")))?;
        self.app = Some(app);
        let started = Started {
            thread_params: plan.thread_start.clone(),
            plan,
        };
        Ok((started, incoming))
    }

    async fn load(&self) -> Result<Session, AgentError> {
        let (owner, id) = (self.owner.clone(), self.session.clone());
        self.agents
            .transact(move |t| t.get::<Session>(Scope::owner(&owner), &id))
            .await
            .map_err(AgentError::store("session", &self.session, "session_id"))
    }

    /// Runs one of the core's writes as one transaction.
    async fn commit(&mut self, write: Write) -> Result<Stored, AgentError> {
        let (owner, sid) = (self.owner.clone(), self.session.clone());
        let refused = AgentError::store("session", &self.session, "session_id");
        let now = now_unix();
        match write {
            Write::ThreadId(thread) => self
                .agents
                .transact(move |t| {
                    t.update::<Session, _>(Scope::owner(&owner), &sid, |s| {
                        s.thread_id = Some(thread);
                        s.last_active_at = now;
                    })
                })
                .await
                .map(|()| Stored::Done)
                .map_err(refused),
            Write::BeginTurn(turn) => {
                let session = self
                    .agents
                    .transact(move |t| {
                        let scope = Scope::owner(&owner);
                        let mut session: Session = t.get(scope, &sid)?;
                        if session.turns >= MAX_TURNS {
                            return Err(AgentError::invalid(
                                "events",
                                format!("This session holds {MAX_TURNS} turns, the most one may: start a new session."),
                            ));
                        }
                        session.status = Status::InProgress;
                        session.active_turn = Some(turn.id.clone());
                        session.error = None;
                        session.turns += 1;
                        session.last_active_at = now;
                        t.put(scope, session.clone())?;
                        t.create(Scope::within(&owner, &sid), *turn)?;
                        Ok::<_, AgentError>(session)
                    })
                    .await?;
                let outputs = match self.workspace.as_ref().and_then(|fd| fd.try_clone().ok()) {
                    Some(fd) => crate::runtime::file::blocking(move || {
                        use std::os::fd::AsFd;
                        snapshot(fd.as_fd())
                    })
                    .await
                    .ok(),
                    None => None,
                };
                Ok(Stored::Begun {
                    session: Box::new(session),
                    outputs,
                })
            }
            Write::CodexTurn { turn, codex } => {
                self.update_turn(&turn, |turn| turn.codex_turn_id = codex)
                    .await;
                Ok(Stored::Done)
            }
            Write::Items { turn, items } => self
                .agents
                .transact(move |t| {
                    let within = Scope::within(&owner, &sid);
                    let ids: Vec<String> = items
                        .iter()
                        .map(|i| i["id"].as_str().unwrap_or_default().to_string())
                        .collect();
                    for item in items {
                        // codex reports an item again when it changes: the last word is kept.
                        t.create_or_replace(within, Item(item))?;
                    }
                    t.update::<Turn, _>(within, &turn, |turn| {
                        for id in ids {
                            if !turn.items.contains(&id) {
                                turn.items.push(id);
                            }
                        }
                    })
                })
                .await
                .map(|()| Stored::Done)
                .map_err(refused),
            Write::RequiresAction { turn, action } => self
                .agents
                .transact(move |t| {
                    t.update::<Turn, _>(Scope::within(&owner, &sid), &turn, |turn| {
                        turn.status = TurnStatus::Waiting
                    })?;
                    t.update::<Session, _>(Scope::owner(&owner), &sid, |s| {
                        s.required_actions.push(action);
                        s.status = Status::RequiresAction;
                        s.last_active_at = now;
                        s.clone()
                    })
                })
                .await
                .map(|session| Stored::Session(Box::new(session)))
                .map_err(refused),
            Write::Resumed {
                turn,
                call_id,
                waiting,
            } => self
                .agents
                .transact(move |t| {
                    if !waiting {
                        t.update::<Turn, _>(Scope::within(&owner, &sid), &turn, |turn| {
                            turn.status = TurnStatus::InProgress
                        })?;
                    }
                    t.update::<Session, _>(Scope::owner(&owner), &sid, |s| {
                        s.required_actions
                            .retain(|a| a["call_id"].as_str() != Some(&call_id));
                        if !waiting {
                            s.status = Status::InProgress;
                        }
                        s.last_active_at = now;
                        s.clone()
                    })
                })
                .await
                .map(|session| Stored::Session(Box::new(session)))
                .map_err(refused),
            Write::EndTurn {
                turn,
                status,
                error,
                usage,
                at,
            } => self
                .agents
                .transact(move |t| {
                    t.update::<Turn, _>(Scope::within(&owner, &sid), &turn, |turn| {
                        turn.status = status;
                        turn.completed_at = Some(at);
                        turn.error = error;
                        turn.usage = Some(usage.clone());
                    })?;
                    t.update::<Session, _>(Scope::owner(&owner), &sid, |s| {
                        s.status = Status::Idle;
                        s.active_turn = None;
                        s.required_actions.clear();
                        s.last_active_at = at;
                        s.usage = Some(add_usage(s.usage.take(), &usage));
                        s.clone()
                    })
                })
                .await
                .map(|session| Stored::Session(Box::new(session)))
                .map_err(refused),
            Write::Artifacts { turn, before } => {
                let artifacts = self.artifacts(&turn, before).await;
                if artifacts.is_empty() {
                    return Ok(Stored::Done);
                }
                self.agents
                    .transact(move |t| t.create_all(Scope::within(&owner, &sid), artifacts))
                    .await
                    .map(|()| Stored::Done)
                    .map_err(refused)
            }
            Write::Trace(trace) => self
                .agents
                .transact(move |t| t.create(Scope::within(&owner, &sid), trace))
                .await
                .map(|()| Stored::Done)
                .map_err(refused),
            Write::NotKept { turn, what } => {
                self.update_turn(&turn, |kept| kept.not_kept = what).await;
                Ok(Stored::Done)
            }
        }
    }

    /// The files the turn `turn` wrote under the outputs directory since `before`.
    async fn artifacts(&self, turn: &str, before: Snapshot) -> Vec<Artifact> {
        let published = match self.workspace.as_ref().and_then(|fd| fd.try_clone().ok()) {
            Some(fd) => crate::runtime::file::blocking(move || {
                use std::os::fd::AsFd;
                changed(&before, &snapshot(fd.as_fd()))
            })
            .await
            .unwrap_or_default(),
            None => Vec::new(),
        };
        if published.is_empty() {
            return Vec::new();
        }
        let session = self.load().await.ok();
        let workspace_rel = session
            .as_ref()
            .and_then(|s| s.workspace.clone())
            .unwrap_or_default();
        let shown_root = session
            .as_ref()
            .and_then(|s| {
                s.environment["workspace_directory"]
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "/workspace".into());
        let environment_id = session
            .as_ref()
            .and_then(|s| s.environment["id"].as_str().map(str::to_string))
            .unwrap_or_default();
        let now = now_unix();
        published
            .into_iter()
            .map(|(path, size)| Artifact {
                id: new_id("art_"),
                session_id: self.session.clone(),
                turn_id: turn.to_string(),
                environment_id: environment_id.clone(),
                path: format!("{}/{OUTPUTS}/{path}", shown_root.trim_end_matches('/')),
                local_path: join_rel(&workspace_rel, &format!("{OUTPUTS}/{path}")),
                size_bytes: size,
                created_at: now,
            })
            .collect()
    }

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

    fn publish(&self, event: Value) {
        self.hub.channels.publish(&self.session, event, false);
    }
}

/// `rel` joined onto the workspace `base` (both relative to the base directory).
fn join_rel(base: &str, rel: &str) -> String {
    match base.trim_matches('/') {
        "" | "." => rel.to_string(),
        base => format!("{base}/{rel}"),
    }
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
