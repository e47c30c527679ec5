//! The session actor's decisions, without I/O: a state machine fed one [`CoreInput`] at
//! a time (a command from the hub, a codex message, an RPC answer, a store commit's
//! result, time passing) that answers with the [`Effect`]s to carry out, in order.
//! The shell in [`super`] owns codex's process, the store and the channels; it only
//! executes effects and feeds back what they produced. So every behaviour of a session
//! (a turn's life, steer, cancel and its deadlines, tool calls, the end of a turn on a
//! full store, idling out, stopping) is tested here without codex, a store or a runtime,
//! as [`EventMapper`] is on captured codex messages.
//!
//! Contract with the shell:
//! - effects are executed in the order given; a [`Effect::Commit`] is always the last
//!   of its batch, and its result is fed back ([`CoreInput::Committed`]) before any
//!   other input, so a sequence of commits and publishes is one uninterrupted script
//!   and no event goes out before the commit it announces;
//! - an [`Effect::Rpc`]'s answer comes back as [`CoreInput::Answer`] whenever it comes:
//!   the core never waits on one, and a deadline ([`Core::deadline`]) bounds each;
//! - the shell sleeps until [`Core::deadline`] and then feeds [`CoreInput::Tick`];
//! - time is given with each input ([`Now`]); the core reads no clock.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::agents::app_server::{RpcError, REQUEST_TIMEOUT};
use crate::agents::codex_map::{self, EventMapper, Fact, Mapped, ThreadPlan, ToolResult, Totals};
use crate::agents::error::AgentError;
use crate::agents::objects::Object;
use crate::agents::records::{new_id, StoreError};
use crate::agents::sessions::inputs::{codex_input, Input, Part};
use crate::agents::sessions::outputs::Snapshot;
use crate::agents::sessions::records::{Session, Trace, Turn, TurnStatus, MAX_ITEMS_PER_TURN};
use crate::agents::sessions::trace::TraceBuilder;

/// After a cancel, how long codex may take to end the turn before the interrupt is
/// sent again (codex drops one that comes before its turn has started)...
pub const CANCEL_RESEND: Duration = Duration::from_secs(2);
/// ...and before the server ends the turn itself, stopping codex's app-server (the next
/// input starts a new one on the same thread).
pub const CANCEL_GIVE_UP: Duration = Duration::from_secs(10);
/// Bytes of a command's output an item keeps (its stream showed all of it).
pub const ITEM_OUTPUT_BYTES: usize = 64 * 1024;

/// The moment an input is handled: a monotonic instant for deadlines, and the wall
/// clock in milliseconds for records and traces.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub at: Instant,
    pub ms: u64,
}

impl Now {
    fn unix(self) -> u64 {
        self.ms / 1000
    }
}

/// The shell's handle on a command's reply slot.
pub type Waiter = u64;
/// The core's id of an RPC it asked the shell to send.
pub type RpcId = u64;

pub enum CoreInput {
    /// The actor begins: its app-server is to start.
    Start,
    /// The app-server runs (what `thread/start` takes, what each `turn/start` adds), or
    /// why it does not.
    Started(Result<Started, AgentError>),
    /// Inputs from the hub, answered through `waiter`.
    Command {
        waiter: Waiter,
        inputs: Vec<Input>,
    },
    /// The hub stopped the actor: the session was deleted, or the server stops.
    Stop,
    Notification {
        method: String,
        params: Value,
    },
    /// A server→client request of codex (`id` is codex's).
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// codex's app-server is gone.
    Exited {
        why: String,
    },
    Answer {
        id: RpcId,
        result: Result<Value, RpcError>,
    },
    /// The result of the last [`Effect::Commit`].
    Committed(Result<Stored, AgentError>),
    /// Time passed (the shell slept until [`Core::deadline`]).
    Tick,
}

pub struct Started {
    pub thread_params: Value,
    pub plan: ThreadPlan,
}

/// What a commit gives back.
#[derive(Debug)]
pub enum Stored {
    Done,
    /// The session as committed (for the event that announces it).
    Session(Box<Session>),
    /// A turn was begun: the session, and the workspace's outputs when it began.
    Begun {
        session: Box<Session>,
        outputs: Option<Snapshot>,
    },
}

/// A write to the store, as data: the shell runs each as one transaction.
#[derive(Debug)]
pub enum Write {
    /// The session's codex thread, once codex started it.
    ThreadId(String),
    /// The session in progress with `turn` created (refused past `MAX_TURNS`); then
    /// the workspace's outputs are snapshotted. Gives [`Stored::Begun`].
    BeginTurn(Box<Turn>),
    CodexTurn {
        turn: String,
        codex: Option<String>,
    },
    /// Items of the running turn (a later report of one replaces it).
    Items {
        turn: String,
        items: Vec<Value>,
    },
    /// A function call waits for the client: the session requires action and the
    /// turn waits. Gives the session.
    RequiresAction {
        turn: String,
        action: Value,
    },
    /// A function call was answered; `waiting` when others still are. Gives the session.
    Resumed {
        turn: String,
        call_id: String,
        waiting: bool,
    },
    /// The turn's end and the session back to idle, alone: only rewrites of records that
    /// exist, which no quota refuses. Gives the session.
    EndTurn {
        turn: String,
        status: TurnStatus,
        error: Option<Value>,
        usage: Value,
        at: u64,
    },
    /// The files the turn wrote under the outputs directory since `before`.
    Artifacts {
        turn: String,
        before: Snapshot,
    },
    Trace(Trace),
    /// What of the turn the store refused, on the turn.
    NotKept {
        turn: String,
        what: Vec<String>,
    },
}

/// How a command is answered.
#[derive(Debug)]
pub enum Reply {
    Applied(Result<(), AgentError>),
    /// Not read: another actor is to take them.
    NotRead(Vec<Input>),
    /// The actor was stopped (by the hub) before it applied them: the shell says what
    /// became of the session (404 once deleted).
    Stopped,
}

#[derive(Debug)]
pub enum Effect {
    /// Start codex's app-server (then feed [`CoreInput::Started`]).
    StartAppServer,
    /// Send a request to codex; feed its answer back as [`CoreInput::Answer`] with `id`.
    Rpc {
        id: RpcId,
        method: &'static str,
        params: Value,
    },
    /// Answer codex's request `request`.
    Respond {
        request: Value,
        result: Result<Value, RpcError>,
    },
    /// Run `write` (then feed [`CoreInput::Committed`]).
    Commit(Write),
    /// Publish an event on the session's stream (`ends_turn`: a turn's last).
    Publish {
        event: Value,
        ends_turn: bool,
    },
    /// Tell the owner's webhooks.
    Announce {
        kind: &'static str,
        session: Box<Session>,
    },
    Answer {
        waiter: Waiter,
        reply: Reply,
    },
    /// A sub-agent thread opened (codex named it `name`).
    OpenChild {
        thread: String,
        name: Option<String>,
    },
    /// Run the session's own tool (the automations tool) for call `call_id`; feed its
    /// output back as [`CoreInput::Answer`] with `id` (`Ok`: the text the model reads;
    /// `Err`: why it failed).
    RunTool {
        id: RpcId,
        call_id: String,
        arguments: Value,
    },
    /// A notification of an open sub-agent thread.
    Child {
        method: String,
        params: Value,
    },
    Log(String),
    /// The actor ends and its app-server with it. Commands it did not apply were
    /// answered; those still queued in the shell are fed back as commands, which the
    /// core answers as it answered these.
    Stop,
}

/// Why an RPC was sent: what its answer does.
#[derive(Debug)]
enum Purpose {
    ThreadStart,
    ThreadResume,
    TurnStart {
        turn: String,
    },
    Steer,
    Interrupt,
    ReadChild {
        thread: String,
    },
    /// The actor's own tool ran (the shell's [`Effect::RunTool`]).
    Tool {
        turn: String,
        call_id: String,
    },
}

/// What the commit in flight was for.
enum Awaiting {
    ThreadSaved,
    Begin {
        turn: Box<Turn>,
        messages: Vec<Vec<Part>>,
    },
    Items,
    RequiresAction,
    Resumed {
        waiting: bool,
        mapped: Mapped,
    },
    EndTurn,
    Outputs(&'static str),
    Ignored,
}

/// One step of the script a single input set going: commits wait for their result;
/// the lazy ones are decided when reached, from what the commits before them gave.
enum Step {
    Emit(Effect),
    Commit(Write, Awaiting),
    /// End the running turn (codex ended it, or this side does).
    EndTurn(codex_map::TurnEnd),
    /// After the end's commits: note on the turn what was not kept.
    NoteNotKept,
    /// Publish the session the requires-action commit gave.
    RequiresAction,
    /// The turn's end announced: what was not kept, then the session idle.
    Report,
    Stop(LeftoverKind),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum LeftoverKind {
    HandBack,
    Stopped,
}

#[derive(Debug, PartialEq)]
enum Phase {
    /// The app-server or its thread is starting: commands wait.
    Starting,
    Ready,
    Stopped,
}

/// A pending function call: codex's request to answer.
struct PendingCall {
    request: Value,
    turn: String,
    /// A call of the automations tool, which the actor answers itself: no client
    /// sees it as a required action or may answer it.
    internal: bool,
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
    cancel: Option<(Instant, u32)>,
    /// What the store refused while it ran, said when it ends.
    not_kept: Vec<(&'static str, StoreError)>,
    /// Its end is scripted: nothing more of it is mapped.
    ended: bool,
}

impl ActiveTurn {
    /// When the cancel's next step is due: resending the interrupt, or giving up.
    fn cancel_due(&self) -> Option<Instant> {
        self.cancel.map(|(at, sent)| match sent {
            0 | 1 => at + CANCEL_RESEND,
            _ => at + CANCEL_GIVE_UP,
        })
    }
}

/// A turn's end while its commits run.
struct Ending {
    turn: String,
    failed: bool,
    session: Option<Session>,
    not_kept: Vec<(&'static str, StoreError)>,
}

/// A sub-agent thread: opening (its name asked with `thread/read`, its notifications
/// held until then) or open (its notifications go to the shell).
enum Child {
    Opening(Vec<(String, Value)>),
    Open,
}

pub struct Core {
    session: String,
    agent_id: String,
    thread: Option<String>,
    model: String,
    plan: Option<ThreadPlan>,
    /// The thread's cumulative token counts: the next turn's usage starts from them.
    totals: Totals,
    phase: Phase,
    turn: Option<ActiveTurn>,
    children: HashMap<String, Child>,
    rpcs: HashMap<RpcId, (Purpose, Instant)>,
    next_rpc: RpcId,
    /// Commands in order; the first is being applied.
    commands: VecDeque<(Waiter, VecDeque<Input>)>,
    /// The RPC the first command waits on (`turn/start`, `turn/steer`).
    blocked: Option<RpcId>,
    script: VecDeque<Step>,
    awaiting: Option<Awaiting>,
    ending: Option<Ending>,
    required: Option<Session>,
    /// How commands fed after the stop are answered.
    stopped: Option<LeftoverKind>,
    first_error: Option<AgentError>,
    last_input: Instant,
    idle: Duration,
    rpc_timeout: Duration,
}

impl Core {
    /// The core of `session`'s actor, which idles out after `idle` without input.
    pub fn new(session: &Session, idle: Duration, now: Now) -> Core {
        Core {
            session: session.id.clone(),
            agent_id: session.agent["id"].as_str().unwrap_or_default().to_string(),
            thread: session.thread_id.clone(),
            model: session.agent["model"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            plan: None,
            totals: Totals::default(),
            phase: Phase::Starting,
            turn: None,
            children: HashMap::new(),
            rpcs: HashMap::new(),
            next_rpc: 1,
            commands: VecDeque::new(),
            blocked: None,
            script: VecDeque::new(),
            awaiting: None,
            ending: None,
            required: None,
            stopped: None,
            first_error: None,
            last_input: now.at,
            idle,
            rpc_timeout: REQUEST_TIMEOUT,
        }
    }

    /// When [`CoreInput::Tick`] is next due: an RPC's deadline, a cancel's next step, or
    /// idling out.
    pub fn deadline(&self) -> Option<Instant> {
        if self.phase == Phase::Stopped {
            return None;
        }
        let rpcs = self.rpcs.values().map(|(_, at)| *at);
        let cancel = self.turn.as_ref().and_then(ActiveTurn::cancel_due);
        let idle = self.idles().then(|| self.last_input + self.idle);
        rpcs.chain(cancel).chain(idle).min()
    }

    /// Nothing to do: no turn, no command, nothing starting.
    fn idles(&self) -> bool {
        self.phase == Phase::Ready && self.turn.is_none() && self.commands.is_empty()
    }

    pub fn on(&mut self, now: Now, input: CoreInput) -> Vec<Effect> {
        let mut out = Vec::new();
        if !matches!(input, CoreInput::Tick) {
            self.last_input = now.at;
        }
        if self.phase == Phase::Stopped {
            if let CoreInput::Command { waiter, inputs } = input {
                out.push(self.leftover(waiter, inputs));
            }
            return out;
        }
        debug_assert!(
            self.awaiting.is_none() || matches!(input, CoreInput::Committed(_)),
            "a commit's result comes before any other input"
        );
        match input {
            CoreInput::Start => out.push(Effect::StartAppServer),
            CoreInput::Started(Ok(started)) => self.started(now, started, &mut out),
            CoreInput::Started(Err(error)) => self.start_failed(error),
            CoreInput::Command { waiter, inputs } => {
                self.commands.push_back((waiter, inputs.into()));
            }
            CoreInput::Stop => self.script.push_back(Step::Stop(LeftoverKind::Stopped)),
            CoreInput::Notification { method, params } => {
                let steps = self.notification(now, &method, params);
                self.script.extend(steps);
            }
            CoreInput::Request { id, method, params } => {
                let steps = self.request(now, id, &method, params);
                self.script.extend(steps);
            }
            CoreInput::Exited { why } => self.exited(now, why),
            CoreInput::Answer { id, result } => {
                if let Some((purpose, _)) = self.rpcs.remove(&id) {
                    self.answered(now, id, purpose, result);
                }
            }
            CoreInput::Committed(result) => {
                if let Some(awaiting) = self.awaiting.take() {
                    self.committed(now, awaiting, result);
                }
            }
            CoreInput::Tick => self.tick(now),
        }
        self.run(now, &mut out);
        out
    }

    /// Runs the script, then the commands, until a commit's result or an RPC answer is
    /// needed, or nothing is left.
    fn run(&mut self, now: Now, out: &mut Vec<Effect>) {
        loop {
            if self.awaiting.is_some() || self.phase == Phase::Stopped {
                return;
            }
            if let Some(step) = self.script.pop_front() {
                self.step(now, step, out);
                continue;
            }
            if !self.advance(now, out) {
                return;
            }
        }
    }

    fn step(&mut self, now: Now, step: Step, out: &mut Vec<Effect>) {
        match step {
            Step::Emit(effect) => out.push(effect),
            Step::Commit(write, awaiting) => {
                out.push(Effect::Commit(write));
                self.awaiting = Some(awaiting);
            }
            Step::EndTurn(end) => {
                let steps = self.end_turn(now, end);
                self.prepend(steps);
            }
            Step::NoteNotKept => {
                if let Some(ending) = self.ending.as_ref().filter(|e| !e.not_kept.is_empty()) {
                    let what = ending.not_kept.iter().map(|(w, _)| w.to_string()).collect();
                    let write = Write::NotKept {
                        turn: ending.turn.clone(),
                        what,
                    };
                    self.prepend(vec![Step::Commit(write, Awaiting::Ignored)]);
                }
            }
            Step::RequiresAction => {
                if let Some(session) = self.required.take() {
                    out.push(publish_session(
                        "agent.session.requires_action",
                        &session,
                        false,
                    ));
                }
            }
            Step::Report => self.report(out),
            Step::Stop(kind) => self.stop(kind, out),
        }
    }

    fn prepend(&mut self, steps: Vec<Step>) {
        for step in steps.into_iter().rev() {
            self.script.push_front(step);
        }
    }

    /// Applies the first command's next input, or answers it once all are applied.
    /// False when there is nothing to apply now.
    fn advance(&mut self, now: Now, out: &mut Vec<Effect>) -> bool {
        if self.phase != Phase::Ready || self.blocked.is_some() {
            return false;
        }
        let Some((waiter, inputs)) = self.commands.front_mut() else {
            return false;
        };
        let waiter = *waiter;
        match inputs.pop_front() {
            None => {
                self.commands.pop_front();
                out.push(Effect::Answer {
                    waiter,
                    reply: Reply::Applied(Ok(())),
                });
            }
            Some(input) => self.apply(now, input, out),
        }
        true
    }

    /// The first command fails with `error`; its inputs after the failing one are not
    /// applied.
    fn refuse(&mut self, error: AgentError, out: &mut Vec<Effect>) {
        if let Some((waiter, _)) = self.commands.pop_front() {
            out.push(Effect::Answer {
                waiter,
                reply: Reply::Applied(Err(error)),
            });
        }
    }

    fn rpc(
        &mut self,
        now: Now,
        method: &'static str,
        params: Value,
        purpose: Purpose,
    ) -> (RpcId, Effect) {
        let id = self.next_rpc;
        self.next_rpc += 1;
        self.rpcs.insert(id, (purpose, now.at + self.rpc_timeout));
        (id, Effect::Rpc { id, method, params })
    }

    fn started(&mut self, now: Now, started: Started, out: &mut Vec<Effect>) {
        self.plan = Some(started.plan);
        let mut params = started.thread_params;
        let (_, effect) = match self.thread.clone() {
            Some(thread) => {
                params["threadId"] = json!(thread);
                params["excludeTurns"] = json!(true);
                // codex keeps a thread's tools; resume takes none.
                if let Some(p) = params.as_object_mut() {
                    p.remove("dynamicTools");
                }
                self.rpc(now, "thread/resume", params, Purpose::ThreadResume)
            }
            None => self.rpc(now, "thread/start", params, Purpose::ThreadStart),
        };
        out.push(effect);
    }

    /// The actor could not start: the first command hears why, the others what became of
    /// the session.
    fn start_failed(&mut self, error: AgentError) {
        self.first_error = Some(error);
        self.script.push_back(Step::Stop(LeftoverKind::Stopped));
    }

    fn apply(&mut self, now: Now, input: Input, out: &mut Vec<Effect>) {
        match input {
            Input::Message(messages) => match &self.turn {
                None => self.begin_turn(now, messages),
                Some(turn) => {
                    // The steered input is a user message item of the running turn:
                    // codex reports it, and the mapper shows and keeps it like the first.
                    let params = json!({"threadId": self.thread, "input": codex_input(&messages),
                                        "expectedTurnId": turn.codex_turn});
                    let (id, effect) = self.rpc(now, "turn/steer", params, Purpose::Steer);
                    self.blocked = Some(id);
                    out.push(effect);
                }
            },
            Input::Cancel => {
                let steps = self.cancel(now);
                self.script.extend(steps);
            }
            Input::ToolResult {
                turn_id,
                call_id,
                result,
            } => self.tool_result(&turn_id, &call_id, result, out),
        }
    }

    fn begin_turn(&mut self, now: Now, messages: Vec<Vec<Part>>) {
        let turn = Turn {
            id: new_id("turn_"),
            session_id: self.session.clone(),
            agent_id: self.agent_id.clone(),
            status: TurnStatus::InProgress,
            created_at: now.unix(),
            started_at: Some(now.unix()),
            completed_at: None,
            error: None,
            subagent_id: None,
            usage: None,
            codex_turn_id: None,
            items: Vec::new(),
            started_ms: now.ms,
            not_kept: Vec::new(),
        };
        let turn = Box::new(turn);
        let write = Write::BeginTurn(turn.clone());
        self.script
            .push_back(Step::Commit(write, Awaiting::Begin { turn, messages }));
    }

    /// The turn is stored and the session in progress: announce it, then ask codex.
    fn turn_begun(
        &mut self,
        now: Now,
        turn: Box<Turn>,
        messages: Vec<Vec<Part>>,
        session: Box<Session>,
        outputs: Option<Snapshot>,
    ) {
        self.learn(&session);
        let thread = self.thread.clone().unwrap_or_default();
        let mut steps = vec![
            Step::Emit(Effect::Publish {
                event: json!({"type": "agent.session.turn.created", "session_id": self.session,
                              "turn_id": turn.id, "turn": turn.object()}),
                ends_turn: false,
            }),
            Step::Emit(publish_session(
                "agent.session.in_progress",
                &session,
                false,
            )),
            Step::Emit(announce("agent.session.in_progress", &session)),
        ];
        self.turn = Some(ActiveTurn {
            id: turn.id.clone(),
            codex_turn: None,
            mapper: EventMapper::new(turn.object(), &thread, None, self.totals),
            trace: TraceBuilder::new(turn.started_ms),
            outputs_before: outputs,
            pending: HashMap::new(),
            started: HashMap::new(),
            items: 0,
            cancel: None,
            not_kept: Vec::new(),
            ended: false,
        });
        match self.plan.as_ref() {
            Some(plan) => {
                let mut params =
                    codex_map::turn_start_params(&thread, codex_input(&messages), plan);
                // What an update changed since the thread started applies from this turn
                // on (codex keeps a turn's overrides for the later ones).
                if let Some(model) = session.agent["model"].as_str() {
                    params["model"] = json!(model);
                }
                if let Some(effort) = session.agent["reasoning"]["effort"].as_str() {
                    params["effort"] = json!(effort);
                }
                let purpose = Purpose::TurnStart { turn: turn.id };
                let (id, effect) = self.rpc(now, "turn/start", params, purpose);
                self.blocked = Some(id);
                steps.push(Step::Emit(effect));
            }
            None => steps.extend(self.end_here(
                "failed",
                Some(json!({
                "code": "connection_failed", "message": "codex app-server is not running"})),
            )),
        }
        self.prepend(steps);
    }

    /// What a stored session says that the next turn uses.
    fn learn(&mut self, session: &Session) {
        if let Some(model) = session.agent["model"].as_str() {
            self.model = model.to_string();
        }
        if let Some(agent) = session.agent["id"].as_str() {
            self.agent_id = agent.to_string();
        }
    }

    /// Asks codex to interrupt the running turn, and remembers the cancel until the turn
    /// ends: the interrupt is sent again when codex reports the turn started (one sent
    /// before is dropped) and when [`CANCEL_RESEND`] passes; after [`CANCEL_GIVE_UP`]
    /// the turn is ended here. So no cancel is lost, whenever it comes.
    fn cancel(&mut self, now: Now) -> Vec<Step> {
        let Some(turn) = self.turn.as_mut().filter(|t| !t.ended) else {
            return Vec::new();
        };
        if turn.cancel.is_none() {
            turn.cancel = Some((now.at, 0));
        }
        // A waiting function call is answered first, so codex can stop.
        let mut steps: Vec<Step> = turn
            .pending
            .drain()
            .map(|(_, call)| {
                Step::Emit(Effect::Respond {
                    request: call.request,
                    result: Err(RpcError::new(-32000, "the turn was cancelled")),
                })
            })
            .collect();
        steps.extend(self.interrupt(now));
        steps
    }

    /// `turn/interrupt` for the running turn (its answer waits until codex aborted the
    /// turn; the turn's end says the rest).
    fn interrupt(&mut self, now: Now) -> Option<Step> {
        let turn = self.turn.as_mut()?;
        if let Some((_, sent)) = turn.cancel.as_mut() {
            *sent += 1;
        }
        let params = json!({"threadId": self.thread,
                            "turnId": turn.codex_turn.clone().unwrap_or_default()});
        let (_, effect) = self.rpc(now, "turn/interrupt", params, Purpose::Interrupt);
        Some(Step::Emit(effect))
    }

    fn tool_result(
        &mut self,
        turn_id: &str,
        call_id: &str,
        result: ToolResult,
        out: &mut Vec<Effect>,
    ) {
        let unknown =
            || AgentError::invalid("events", format!("Unknown pending tool call: {call_id}"));
        let Some(turn) = self.turn.as_mut().filter(|t| !t.ended) else {
            return self.refuse(unknown(), out);
        };
        if turn
            .pending
            .get(call_id)
            .is_none_or(|call| call.turn != turn_id || call.internal)
        {
            return self.refuse(unknown(), out);
        }
        let Some(call) = turn.pending.remove(call_id) else {
            return self.refuse(unknown(), out);
        };
        let (answer, mapped) = turn.mapper.tool_result(call_id, &result);
        let waiting = !turn.pending.is_empty();
        out.push(Effect::Respond {
            request: call.request,
            result: Ok(answer),
        });
        let write = Write::Resumed {
            turn: turn_id.to_string(),
            call_id: call_id.to_string(),
            waiting,
        };
        self.script
            .push_back(Step::Commit(write, Awaiting::Resumed { waiting, mapped }));
    }

    fn notification(&mut self, now: Now, method: &str, params: Value) -> Vec<Step> {
        let ours = params["threadId"].as_str() == self.thread.as_deref();
        if method == "thread/tokenUsage/updated" && ours {
            match self.turn.as_mut() {
                Some(turn) => {
                    turn.trace
                        .model_request(now.ms, &self.model, &params["tokenUsage"]["last"])
                }
                // Replayed after a resume: where the next turn's usage counts from.
                None => self.totals = Totals::of(&params["tokenUsage"]["total"]),
            }
        }
        if !ours || method == "thread/started" {
            return self.child(now, method, params);
        }
        let Some(turn) = self.turn.as_mut().filter(|t| !t.ended) else {
            return Vec::new();
        };
        let mut steps = Vec::new();
        if method == "turn/started" {
            if turn.codex_turn.is_none() {
                turn.codex_turn = params["turn"]["id"].as_str().map(str::to_string);
            }
            if turn.cancel.is_some() {
                steps.extend(self.interrupt(now));
            }
        }
        let Some(turn) = self.turn.as_mut() else {
            return steps;
        };
        let item = &params["item"];
        let item_id = item["id"].as_str().unwrap_or_default().to_string();
        match method {
            "item/started" => {
                let at = params["startedAtMs"].as_u64().unwrap_or(now.ms);
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
                    let end = params["completedAtMs"].as_u64().unwrap_or(now.ms);
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
        steps.extend(self.apply_mapped(mapped));
        steps
    }

    /// A notification of another thread: a sub-agent's. One app-server runs one session,
    /// so every other thread in it is one its turns opened (codex sends no
    /// `thread/started` for those; its first `turn/started` says so).
    fn child(&mut self, now: Now, method: &str, params: Value) -> Vec<Step> {
        let Some(thread) = params["threadId"].as_str().map(str::to_string) else {
            return Vec::new();
        };
        let mut steps = Vec::new();
        if method == "turn/started" && !self.children.contains_key(&thread) {
            let purpose = Purpose::ReadChild {
                thread: thread.clone(),
            };
            let (_, effect) = self.rpc(now, "thread/read", json!({"threadId": thread}), purpose);
            steps.push(Step::Emit(effect));
            self.children
                .insert(thread.clone(), Child::Opening(Vec::new()));
        }
        match self.children.get_mut(&thread) {
            Some(Child::Opening(held)) => held.push((method.to_string(), params)),
            Some(Child::Open) => {
                if method == "thread/closed" {
                    self.children.remove(&thread);
                }
                steps.push(Step::Emit(Effect::Child {
                    method: method.to_string(),
                    params,
                }));
            }
            None => {}
        }
        steps
    }

    fn request(&mut self, now: Now, id: Value, method: &str, params: Value) -> Vec<Step> {
        let turn = self.turn.as_mut().filter(|t| !t.ended);
        let mapped = match (method, turn) {
            ("item/tool/call", Some(turn)) => turn.mapper.tool_call(&params).map(|m| (m, turn)),
            _ => None,
        };
        let Some((mapped, turn)) = mapped else {
            // Approvals never reach a client: the thread runs with approvalPolicy never,
            // and anything else codex asks is refused so the turn never blocks on it.
            return vec![Step::Emit(Effect::Respond {
                request: id,
                result: Err(RpcError::new(
                    -32601,
                    format!("agent-sandbox answers no {method} request"),
                )),
            })];
        };
        let mut internal = Vec::new();
        for fact in &mapped.facts {
            if let Fact::ToolCall(call) = fact {
                let ours = call.name == codex_map::AUTOMATIONS_TOOL;
                turn.pending.insert(
                    call.call_id.clone(),
                    PendingCall {
                        request: id.clone(),
                        turn: turn.id.clone(),
                        internal: ours,
                    },
                );
                if ours {
                    internal.push((
                        turn.id.clone(),
                        call.call_id.clone(),
                        call.arguments.clone(),
                    ));
                }
            }
        }
        let mut steps = self.apply_mapped(mapped);
        // The call shows as a function_call item like any; the actor answers it.
        for (turn, call_id, arguments) in internal {
            let rpc = self.next_rpc;
            self.next_rpc += 1;
            let purpose = Purpose::Tool {
                turn,
                call_id: call_id.clone(),
            };
            self.rpcs.insert(rpc, (purpose, now.at + self.rpc_timeout));
            steps.push(Step::Emit(Effect::RunTool {
                id: rpc,
                call_id,
                arguments,
            }));
        }
        steps
    }

    /// What the mapper said, as steps: facts first (stored, calls registered), then its
    /// events, so no event announces what the store does not hold yet.
    fn apply_mapped(&mut self, mapped: Mapped) -> Vec<Step> {
        let mut steps = Vec::new();
        let Some(turn) = self.turn.as_mut() else {
            return steps;
        };
        let mut items = Vec::new();
        let mut calls = Vec::new();
        let mut ended = None;
        for fact in mapped.facts {
            match fact {
                Fact::Item(item) => items.push(truncated(item)),
                Fact::ToolCall(call) => calls.push(call),
                Fact::TurnEnded(end) => ended = Some(end),
            }
        }
        if !items.is_empty() {
            turn.items += items.len();
            if turn.items <= MAX_ITEMS_PER_TURN {
                let write = Write::Items {
                    turn: turn.id.clone(),
                    items,
                };
                steps.push(Step::Commit(write, Awaiting::Items));
            }
        }
        // The actor's own tool waits for no client.
        calls.retain(|call| call.name != codex_map::AUTOMATIONS_TOOL);
        let requires_action = !calls.is_empty();
        for call in calls {
            let write = Write::RequiresAction {
                turn: turn.id.clone(),
                action: call.required_action,
            };
            steps.push(Step::Commit(write, Awaiting::RequiresAction));
        }
        let ends = ended.is_some() && !turn.ended;
        if let Some(end) = ended.filter(|_| ends) {
            turn.ended = true;
            steps.push(Step::EndTurn(end));
        }
        steps.extend(mapped.events.into_iter().map(|event| {
            Step::Emit(Effect::Publish {
                event,
                ends_turn: false,
            })
        }));
        if requires_action {
            steps.push(Step::RequiresAction);
        }
        if ends {
            steps.push(Step::Report);
        }
        steps
    }

    /// Ends the running turn from this side (codex did not or cannot): `failed` with
    /// its `error`, or `cancelled`.
    fn end_here(&mut self, status: &'static str, error: Option<Value>) -> Vec<Step> {
        let Some(turn) = self.turn.as_ref().filter(|t| !t.ended) else {
            return Vec::new();
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
        self.apply_mapped(Mapped {
            events: vec![event],
            facts: vec![Fact::TurnEnded(end)],
        })
    }

    /// The turn's end as commits: first, alone, its status and the session idle (so a
    /// full store never leaves a session in progress, nor its stream without `idle`);
    /// then what it made, each on its own.
    fn end_turn(&mut self, now: Now, end: codex_map::TurnEnd) -> Vec<Step> {
        let Some(mut turn) = self.turn.take() else {
            return Vec::new();
        };
        self.totals = end.thread_total;
        let status = match end.status {
            "completed" => TurnStatus::Completed,
            "cancelled" => TurnStatus::Cancelled,
            _ => TurnStatus::Failed,
        };
        self.ending = Some(Ending {
            turn: turn.id.clone(),
            failed: end.status == "failed",
            session: None,
            not_kept: std::mem::take(&mut turn.not_kept),
        });
        let mut steps = vec![Step::Commit(
            Write::EndTurn {
                turn: turn.id.clone(),
                status,
                error: end.error,
                usage: end.usage,
                at: now.unix(),
            },
            Awaiting::EndTurn,
        )];
        if let Some(before) = turn.outputs_before.take() {
            let write = Write::Artifacts {
                turn: turn.id.clone(),
                before,
            };
            steps.push(Step::Commit(write, Awaiting::Outputs("artifacts")));
        }
        let otlp = turn
            .trace
            .finish(now.ms, &self.session, &turn.id, status.name());
        let trace = Trace {
            id: turn.id.clone(),
            session_id: self.session.clone(),
            created_at: now.unix(),
            otlp,
        };
        steps.push(Step::Commit(
            Write::Trace(trace),
            Awaiting::Outputs("trace"),
        ));
        steps.push(Step::NoteNotKept);
        steps
    }

    fn report(&mut self, out: &mut Vec<Effect>) {
        let Some(ending) = self.ending.take() else {
            return;
        };
        let Some(session) = ending.session else {
            return;
        };
        if let Some((_, why)) = ending.not_kept.first() {
            let what: Vec<&str> = ending.not_kept.iter().map(|(w, _)| *w).collect();
            out.push(Effect::Publish {
                event: not_kept_error(&self.session, &ending.turn, &what, why),
                ends_turn: false,
            });
        }
        out.push(publish_session("agent.session.idle", &session, true));
        if ending.failed {
            out.push(announce("agent.session.failed", &session));
        }
        out.push(announce("agent.session.idle", &session));
    }

    fn committed(&mut self, now: Now, awaiting: Awaiting, result: Result<Stored, AgentError>) {
        match (awaiting, result) {
            (Awaiting::ThreadSaved, Ok(_)) => self.phase = Phase::Ready,
            (Awaiting::ThreadSaved, Err(error)) => self.start_failed(error),
            (Awaiting::Begin { turn, messages }, Ok(Stored::Begun { session, outputs })) => {
                self.turn_begun(now, turn, messages, session, outputs);
            }
            (Awaiting::Begin { .. }, Ok(_)) => {}
            (Awaiting::Begin { .. }, Err(error)) => {
                let mut out = Vec::new();
                self.refuse(error, &mut out);
                self.prepend(out.into_iter().map(Step::Emit).collect());
            }
            (Awaiting::Items, Err(error)) => {
                // Full: the stream showed the item; the turn's end says it was not kept.
                if let Some(turn) = self.turn.as_mut() {
                    if !turn.not_kept.iter().any(|(what, _)| *what == "items") {
                        turn.not_kept.push(("items", store_error(error)));
                    }
                }
            }
            (Awaiting::RequiresAction, Ok(Stored::Session(session))) => {
                self.required = Some(*session);
            }
            (Awaiting::Resumed { waiting, mapped }, Ok(stored)) => {
                let mut steps = self.apply_mapped(mapped);
                if let (false, Stored::Session(session)) = (waiting, stored) {
                    steps.push(Step::Emit(publish_session(
                        "agent.session.in_progress",
                        &session,
                        false,
                    )));
                    steps.push(Step::Emit(announce("agent.session.in_progress", &session)));
                }
                self.prepend(steps);
            }
            (Awaiting::Resumed { .. }, Err(error)) => {
                let mut out = Vec::new();
                self.refuse(error, &mut out);
                self.prepend(out.into_iter().map(Step::Emit).collect());
            }
            (Awaiting::EndTurn, Ok(Stored::Session(session))) => {
                if let Some(ending) = self.ending.as_mut() {
                    ending.session = Some(*session);
                }
            }
            (Awaiting::EndTurn, Err(error)) => {
                let line = format!(
                    "session {}: the turn's end was not kept: {error:?}",
                    self.session
                );
                self.prepend(vec![Step::Emit(Effect::Log(line))]);
            }
            (Awaiting::Outputs(what), Err(error)) => {
                if let Some(ending) = self.ending.as_mut() {
                    ending.not_kept.push((what, store_error(error)));
                }
            }
            _ => {}
        }
    }

    fn answered(&mut self, now: Now, id: RpcId, purpose: Purpose, result: Result<Value, RpcError>) {
        if self.blocked == Some(id) {
            self.blocked = None;
        }
        match (purpose, result) {
            (Purpose::ThreadStart, Ok(answer)) => match answer["thread"]["id"].as_str() {
                Some(thread) => {
                    self.thread = Some(thread.to_string());
                    let write = Write::ThreadId(thread.to_string());
                    self.script
                        .push_back(Step::Commit(write, Awaiting::ThreadSaved));
                }
                None => self.start_failed(AgentError::Failed(
                    "codex started a thread without an id".into(),
                )),
            },
            (Purpose::ThreadStart, Err(e)) => self.start_failed(AgentError::Failed(format!(
                "codex could not start a thread: {}",
                e.message
            ))),
            (Purpose::ThreadResume, Ok(_)) => self.phase = Phase::Ready,
            (Purpose::ThreadResume, Err(e)) => self.start_failed(AgentError::Failed(format!(
                "codex could not resume the session's thread {}: {}",
                self.thread.as_deref().unwrap_or_default(),
                e.message
            ))),
            (Purpose::TurnStart { turn }, Ok(answer)) => {
                let codex = answer["turn"]["id"].as_str().map(str::to_string);
                if let Some(running) = self.turn.as_mut().filter(|t| t.id == turn) {
                    running.codex_turn = codex.clone();
                }
                let write = Write::CodexTurn { turn, codex };
                self.script
                    .push_back(Step::Commit(write, Awaiting::Ignored));
            }
            (Purpose::TurnStart { turn }, Err(e)) => {
                if self.turn.as_ref().is_some_and(|t| t.id == turn) {
                    let error = json!({"code": "server_error",
                                       "message": format!("codex refused the turn: {}", e.message)});
                    let steps = self.end_here("failed", Some(error));
                    self.script.extend(steps);
                }
            }
            (Purpose::Steer, Ok(_)) => {}
            (Purpose::Steer, Err(e)) => {
                let error = AgentError::Busy {
                    id: format!("{} ({})", self.session, e.message),
                    param: "events",
                };
                let mut out = Vec::new();
                self.refuse(error, &mut out);
                self.script.extend(out.into_iter().map(Step::Emit));
            }
            (Purpose::Interrupt, _) => {}
            (Purpose::Tool { turn, call_id }, result) => {
                let result = match result {
                    Ok(output) => ToolResult {
                        success: true,
                        output: Some(output),
                        error: None,
                    },
                    Err(e) => ToolResult {
                        success: false,
                        output: None,
                        error: Some(e.message),
                    },
                };
                // A turn that ended meanwhile (cancelled) no longer waits for it.
                let Some(active) = self.turn.as_mut().filter(|t| !t.ended && t.id == turn) else {
                    return;
                };
                let Some(call) = active.pending.remove(&call_id) else {
                    return;
                };
                let (answer, mapped) = active.mapper.tool_result(&call_id, &result);
                self.script.push_back(Step::Emit(Effect::Respond {
                    request: call.request,
                    result: Ok(answer),
                }));
                let steps = self.apply_mapped(mapped);
                self.script.extend(steps);
            }
            (Purpose::ReadChild { thread }, result) => {
                let name = result
                    .ok()
                    .and_then(|read| read["thread"]["agentNickname"].as_str().map(str::to_string));
                if let Some(Child::Opening(held)) =
                    self.children.insert(thread.clone(), Child::Open)
                {
                    self.script.push_back(Step::Emit(Effect::OpenChild {
                        thread: thread.clone(),
                        name,
                    }));
                    for (method, params) in held {
                        let steps = self.child(now, &method, params);
                        self.script.extend(steps);
                    }
                }
            }
        }
    }

    fn exited(&mut self, now: Now, why: String) {
        let error = json!({"code": "connection_failed", "message": why});
        let steps = self.end_here("failed", Some(error));
        self.script.extend(steps);
        // No answer will come: each RPC fails now, in the order they were sent.
        let mut ids: Vec<RpcId> = self.rpcs.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some((purpose, _)) = self.rpcs.remove(&id) {
                let gone = RpcError::new(RpcError::EXITED, why.clone());
                self.answered(now, id, purpose, Err(gone));
            }
        }
        self.script.push_back(Step::Stop(LeftoverKind::HandBack));
    }

    fn tick(&mut self, now: Now) {
        let mut due: Vec<RpcId> = self
            .rpcs
            .iter()
            .filter(|(_, (_, at))| *at <= now.at)
            .map(|(id, _)| *id)
            .collect();
        due.sort_unstable();
        for id in due {
            if let Some((purpose, _)) = self.rpcs.remove(&id) {
                let message = format!(
                    "codex did not answer within {} s",
                    self.rpc_timeout.as_secs()
                );
                self.answered(
                    now,
                    id,
                    purpose,
                    Err(RpcError::new(RpcError::TIMED_OUT, message)),
                );
            }
        }
        if let Some((_, sent)) = self
            .turn
            .as_ref()
            .filter(|t| !t.ended && t.cancel_due().is_some_and(|due| due <= now.at))
            .and_then(|t| t.cancel)
        {
            if sent < 2 {
                let steps: Vec<Step> = self.interrupt(now).into_iter().collect();
                self.script.extend(steps);
            } else {
                let line = format!(
                    "session {}: codex did not end a cancelled turn within {}s; ending it here and stopping its app-server",
                    self.session,
                    CANCEL_GIVE_UP.as_secs()
                );
                self.script.push_back(Step::Emit(Effect::Log(line)));
                let steps = self.end_here("cancelled", None);
                self.script.extend(steps);
                self.script.push_back(Step::Stop(LeftoverKind::HandBack));
            }
        }
        if self.idles() && self.script.is_empty() && self.last_input + self.idle <= now.at {
            self.script.push_back(Step::Stop(LeftoverKind::HandBack));
        }
    }

    /// The actor stops: commands not fully applied are answered as `kind` says (their
    /// inputs not applied yet, for a hand-back).
    fn stop(&mut self, kind: LeftoverKind, out: &mut Vec<Effect>) {
        self.phase = Phase::Stopped;
        self.stopped = Some(kind);
        self.blocked = None;
        for (waiter, inputs) in std::mem::take(&mut self.commands) {
            out.push(self.leftover(waiter, inputs.into()));
        }
        out.push(Effect::Stop);
    }

    /// How a command the actor will not apply is answered.
    fn leftover(&mut self, waiter: Waiter, inputs: Vec<Input>) -> Effect {
        let reply = if let Some(error) = self.first_error.take() {
            Reply::Applied(Err(error))
        } else {
            match self.stopped {
                Some(LeftoverKind::HandBack) if inputs.is_empty() => Reply::Applied(Ok(())),
                Some(LeftoverKind::HandBack) => Reply::NotRead(inputs),
                _ => Reply::Stopped,
            }
        };
        Effect::Answer { waiter, reply }
    }
}

/// The store's refusal in an [`AgentError`], for what a turn did not keep.
fn store_error(error: AgentError) -> StoreError {
    match error {
        AgentError::Store { error, .. } => error,
        other => StoreError::Storage(format!("{other:?}")),
    }
}

fn publish_session(kind: &str, session: &Session, ends_turn: bool) -> Effect {
    Effect::Publish {
        event: json!({"type": kind, "session": session.object()}),
        ends_turn,
    }
}

fn announce(kind: &'static str, session: &Session) -> Effect {
    Effect::Announce {
        kind,
        session: Box::new(session.clone()),
    }
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

/// An item with its command output bounded to [`ITEM_OUTPUT_BYTES`].
pub fn truncated(mut item: Value) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::records::Quota;
    use crate::agents::sessions::records::Status;

    /// A captured codex session of `tests/fixtures/codex/`.
    struct Capture {
        thread: String,
        /// Per turn: `turn/start`'s answer, and the notifications codex sent for it.
        turns: Vec<(Value, Vec<(String, Value)>)>,
    }

    fn capture(text: &str) -> Capture {
        let mut thread = String::new();
        let mut turns: Vec<(Value, Vec<(String, Value)>)> = Vec::new();
        let mut turn_start = None;
        for line in text.lines() {
            let entry: Value = serde_json::from_str(line).unwrap();
            if let Some(sent) = entry.get("sent") {
                if sent["method"] == "turn/start" {
                    turn_start = sent.get("id").cloned();
                    turns.push((Value::Null, Vec::new()));
                }
                continue;
            }
            let message = &entry["recv"];
            match (message["method"].as_str(), message.get("id")) {
                (None, Some(_))
                    if message["result"]["thread"]["id"].is_string() && thread.is_empty() =>
                {
                    thread = message["result"]["thread"]["id"]
                        .as_str()
                        .unwrap()
                        .to_string();
                }
                (None, Some(id)) if Some(id) == turn_start.as_ref() => {
                    turns.last_mut().unwrap().0 = message["result"].clone();
                }
                (Some(method), None) => {
                    if let Some(turn) = turns.last_mut() {
                        turn.1.push((method.to_string(), message["params"].clone()));
                    }
                }
                _ => {}
            }
        }
        Capture { thread, turns }
    }

    fn text() -> Capture {
        capture(include_str!("../../../../tests/fixtures/codex/text.jsonl"))
    }

    fn interrupted() -> Capture {
        capture(include_str!(
            "../../../../tests/fixtures/codex/interrupt.jsonl"
        ))
    }

    fn session(thread: Option<&str>) -> Session {
        Session {
            id: "sess_1".into(),
            created_at: 1,
            last_active_at: 1,
            agent: json!({"id": "agent_1", "model": "stub-model"}),
            config: String::new(),
            environment: json!({"id": "env_1"}),
            workspace: None,
            metadata: json!({}),
            vault_ids: Vec::new(),
            status: Status::Idle,
            error: None,
            required_actions: Vec::new(),
            usage: None,
            review: None,
            prompt_cache_options: None,
            spend_control: None,
            thread_id: thread.map(str::to_string),
            active_turn: None,
            idempotency: Vec::new(),
            pending_keys: Vec::new(),
            turns: 0,
        }
    }

    const IDLE: Duration = Duration::from_secs(600);

    fn over_quota() -> AgentError {
        AgentError::store("session", "sess_1", "session_id")(StoreError::OverQuota(Quota::Bytes {
            limit: 64 << 20,
        }))
    }

    /// The core with a stand-in store (every write answered at once, as the shell
    /// does) and a clock the test moves.
    struct Driver {
        core: Core,
        t0: Instant,
        elapsed: Duration,
        session: Session,
        /// The owner's share is full: creates are refused, rewrites are not.
        full: bool,
        writes: Vec<String>,
    }

    impl Driver {
        /// A core whose app-server runs and whose thread (`thread`, resumed) is ready.
        fn ready(thread: &str) -> Driver {
            let mut d = Driver::new(session(Some(thread)));
            d.feed(CoreInput::Start);
            let effects = d.feed(CoreInput::Started(Ok(started())));
            let id = rpc_id(&effects, "thread/resume");
            d.feed(CoreInput::Answer {
                id,
                result: Ok(json!({})),
            });
            d
        }

        fn new(session: Session) -> Driver {
            let t0 = Instant::now();
            let core = Core::new(
                &session,
                IDLE,
                Now {
                    at: t0,
                    ms: 1_000_000,
                },
            );
            Driver {
                core,
                t0,
                elapsed: Duration::ZERO,
                session,
                full: false,
                writes: Vec::new(),
            }
        }

        fn now(&self) -> Now {
            Now {
                at: self.t0 + self.elapsed,
                ms: 1_000_000 + self.elapsed.as_millis() as u64,
            }
        }

        fn at(&self, elapsed: Duration) -> Instant {
            self.t0 + elapsed
        }

        /// Feeds `input`, answering each commit as the shell would; every effect, the
        /// commits included, in order.
        fn feed(&mut self, input: CoreInput) -> Vec<Effect> {
            let mut out = Vec::new();
            let mut batch = self.core.on(self.now(), input);
            loop {
                let commit = batch.iter().position(|e| matches!(e, Effect::Commit(_)));
                if let Some(at) = commit {
                    assert_eq!(at, batch.len() - 1, "a commit ends its batch: {batch:?}");
                }
                let result = match batch.last() {
                    Some(Effect::Commit(write)) if commit.is_some() => Some(self.store(write)),
                    _ => None,
                };
                out.append(&mut batch);
                match result {
                    Some(result) => batch = self.core.on(self.now(), CoreInput::Committed(result)),
                    None => return out,
                }
            }
        }

        fn tick_at(&mut self, elapsed: Duration) -> Vec<Effect> {
            self.elapsed = elapsed;
            self.feed(CoreInput::Tick)
        }

        fn store(&mut self, write: &Write) -> Result<Stored, AgentError> {
            let name = match write {
                Write::ThreadId(_) => "thread_id",
                Write::BeginTurn(_) => "begin_turn",
                Write::CodexTurn { .. } => "codex_turn",
                Write::Items { .. } => "items",
                Write::RequiresAction { .. } => "requires_action",
                Write::Resumed { .. } => "resumed",
                Write::EndTurn { .. } => "end_turn",
                Write::Artifacts { .. } => "artifacts",
                Write::Trace(_) => "trace",
                Write::NotKept { .. } => "not_kept",
            };
            self.writes.push(name.to_string());
            let s = &mut self.session;
            match write {
                Write::BeginTurn(turn) => {
                    s.status = Status::InProgress;
                    s.active_turn = Some(turn.id.clone());
                    s.turns += 1;
                    Ok(Stored::Begun {
                        session: Box::new(s.clone()),
                        outputs: Some(Snapshot::new()),
                    })
                }
                Write::Items { .. } | Write::Artifacts { .. } | Write::Trace(_) if self.full => {
                    Err(over_quota())
                }
                Write::RequiresAction { action, .. } => {
                    s.status = Status::RequiresAction;
                    s.required_actions.push(action.clone());
                    Ok(Stored::Session(Box::new(s.clone())))
                }
                Write::Resumed { waiting, .. } => {
                    if !waiting {
                        s.status = Status::InProgress;
                    }
                    Ok(Stored::Session(Box::new(s.clone())))
                }
                Write::EndTurn { .. } => {
                    s.status = Status::Idle;
                    s.active_turn = None;
                    Ok(Stored::Session(Box::new(s.clone())))
                }
                Write::NotKept { what, .. } => {
                    self.writes.push(format!("not_kept {}", what.join(",")));
                    Ok(Stored::Done)
                }
                _ => Ok(Stored::Done),
            }
        }

        /// A message from the client, as command `waiter`.
        fn say(&mut self, waiter: Waiter, text: &str) -> Vec<Effect> {
            self.feed(CoreInput::Command {
                waiter,
                inputs: vec![message(text)],
            })
        }

        fn notify(&mut self, notifications: &[(String, Value)]) -> Vec<Effect> {
            let mut out = Vec::new();
            for (method, params) in notifications {
                out.extend(self.feed(CoreInput::Notification {
                    method: method.clone(),
                    params: params.clone(),
                }));
            }
            out
        }

        /// A turn of `capture` begun by command `waiter` and answered by codex (not
        /// started yet).
        fn begin(&mut self, waiter: Waiter, turn_start: &Value) -> Vec<Effect> {
            let mut effects = self.say(waiter, "SAY hello there");
            let id = rpc_id(&effects, "turn/start");
            effects.extend(self.feed(CoreInput::Answer {
                id,
                result: Ok(turn_start.clone()),
            }));
            effects
        }
    }

    fn started() -> Started {
        Started {
            thread_params: json!({"cwd": "/work", "dynamicTools": []}),
            plan: ThreadPlan {
                thread_start: json!({}),
                turn_start: json!({}),
                env: Vec::new(),
            },
        }
    }

    fn message(text: &str) -> Input {
        Input::Message(vec![vec![Part::Text(text.into())]])
    }

    /// The id of the last RPC `method` among `effects`.
    fn rpc_id(effects: &[Effect], method: &str) -> RpcId {
        effects
            .iter()
            .rev()
            .find_map(|e| match e {
                Effect::Rpc { id, method: m, .. } if *m == method => Some(*id),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no {method} in {}", names(effects).join(" | ")))
    }

    /// Each effect in a word or two, to check orders.
    fn names(effects: &[Effect]) -> Vec<String> {
        effects
            .iter()
            .map(|e| match e {
                Effect::StartAppServer => "start".into(),
                Effect::Rpc { method, .. } => format!("rpc {method}"),
                Effect::Respond { result, .. } => {
                    format!("respond {}", if result.is_ok() { "ok" } else { "error" })
                }
                Effect::Commit(write) => format!(
                    "commit {}",
                    match write {
                        Write::ThreadId(_) => "thread_id",
                        Write::BeginTurn(_) => "begin_turn",
                        Write::CodexTurn { .. } => "codex_turn",
                        Write::Items { .. } => "items",
                        Write::RequiresAction { .. } => "requires_action",
                        Write::Resumed { .. } => "resumed",
                        Write::EndTurn { status, .. } => status.name(),
                        Write::Artifacts { .. } => "artifacts",
                        Write::Trace(_) => "trace",
                        Write::NotKept { .. } => "not_kept",
                    }
                ),
                Effect::Publish { event, ends_turn } => {
                    let kind = event["type"].as_str().unwrap_or_default();
                    format!("publish {kind}{}", if *ends_turn { " (end)" } else { "" })
                }
                Effect::Announce { kind, .. } => format!("announce {kind}"),
                Effect::Answer { waiter, reply } => format!(
                    "answer {waiter} {}",
                    match reply {
                        Reply::Applied(Ok(())) => "ok".to_string(),
                        Reply::Applied(Err(e)) => format!("error {e:?}"),
                        Reply::NotRead(inputs) => format!("not read {}", inputs.len()),
                        Reply::Stopped => "stopped".to_string(),
                    }
                ),
                Effect::OpenChild { thread, .. } => format!("open child {thread}"),
                Effect::RunTool { call_id, .. } => format!("run tool {call_id}"),
                Effect::Child { method, .. } => format!("child {method}"),
                Effect::Log(_) => "log".into(),
                Effect::Stop => "stop".into(),
            })
            .collect()
    }

    fn position(names: &[String], prefix: &str) -> usize {
        names
            .iter()
            .position(|n| n.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {names:?}"))
    }

    /// The turn's failure is committed before it is announced, and the session is idle.
    fn assert_failed_then_idle(names: &[String]) {
        assert!(
            position(names, "commit failed") < position(names, "publish agent.session.turn.failed"),
            "{names:?}"
        );
        assert!(has(names, "publish agent.session.idle (end)"), "{names:?}");
    }

    fn has(names: &[String], prefix: &str) -> bool {
        names.iter().any(|n| n.starts_with(prefix))
    }

    #[test]
    fn a_captured_turn_is_committed_before_each_event_that_announces_it() {
        let capture = text();
        let mut d = Driver::ready(&capture.thread);
        let (answer, notifications) = &capture.turns[0];
        let effects = d.say(1, "SAY hello there");
        let begun = names(&effects);
        assert_eq!(
            begun,
            [
                "commit begin_turn",
                "publish agent.session.turn.created",
                "publish agent.session.in_progress",
                "announce agent.session.in_progress",
                "rpc turn/start"
            ]
        );
        // Accepted once codex took the turn, not before.
        let answered = names(&d.feed(CoreInput::Answer {
            id: rpc_id(&effects, "turn/start"),
            result: Ok(answer.clone()),
        }));
        assert_eq!(answered, ["commit codex_turn", "answer 1 ok"]);
        let turn = names(&d.notify(notifications));
        // The answer is stored (with the notification that completed it) before its
        // item.done goes out.
        let done = position(&turn, "publish agent.session.turn.item.done");
        assert_eq!(turn[done - 3], "commit items", "{turn:?}");
        let end = position(&turn, "commit completed");
        let completed = position(&turn, "publish agent.session.turn.completed");
        let idle = position(&turn, "publish agent.session.idle (end)");
        assert!(end < position(&turn, "commit artifacts"), "{turn:?}");
        assert!(
            position(&turn, "commit trace") < completed && completed < idle,
            "{turn:?}"
        );
        assert_eq!(turn.last().unwrap(), "announce agent.session.idle");
        assert!(!has(&turn, "publish error"), "{turn:?}");
        // Idle again: the next deadline is idling out.
        assert_eq!(d.core.deadline(), Some(d.at(IDLE)));
    }

    #[test]
    fn concurrent_inputs_wait_their_turn_and_the_second_starts_after_the_first_ends() {
        let capture = text();
        let mut d = Driver::ready(&capture.thread);
        let (answer, notifications) = &capture.turns[0];
        let first = d.say(1, "SAY hello there");
        // The second arrives while codex has not answered turn/start: it waits.
        assert!(d.say(2, "SAY again").is_empty());
        // codex runs the whole turn before its answer to turn/start comes.
        let turn = names(&d.notify(notifications));
        assert!(
            has(&turn, "commit completed") && has(&turn, "publish agent.session.idle"),
            "{turn:?}"
        );
        assert!(!has(&turn, "answer"), "{turn:?}");
        let next = names(&d.feed(CoreInput::Answer {
            id: rpc_id(&first, "turn/start"),
            result: Ok(answer.clone()),
        }));
        // The first is answered; the second, with no turn running, begins the next.
        assert_eq!(
            next[..5],
            [
                "commit codex_turn",
                "answer 1 ok",
                "commit begin_turn",
                "publish agent.session.turn.created",
                "publish agent.session.in_progress"
            ]
        );
        assert_eq!(next.last().unwrap(), "rpc turn/start");
        assert_eq!(d.writes.iter().filter(|w| *w == "begin_turn").count(), 2);
    }

    #[test]
    fn a_second_input_while_the_turn_runs_steers_it_through_a_flood_of_output() {
        let capture = text();
        let mut d = Driver::ready(&capture.thread);
        let (answer, notifications) = &capture.turns[0];
        d.begin(1, answer);
        let delta = notifications
            .iter()
            .position(|(m, _)| m == "item/agentMessage/delta")
            .unwrap();
        d.notify(&notifications[..delta]);
        let steer = d.say(2, "SAY steered");
        assert_eq!(names(&steer), ["rpc turn/steer"]);
        let Effect::Rpc { params, .. } = &steer[0] else {
            unreachable!()
        };
        assert_eq!(params["expectedTurnId"], answer["turn"]["id"]);
        // codex floods deltas before it answers the steer: each is published as it comes.
        let flood: Vec<(String, Value)> =
            std::iter::repeat_n(notifications[delta].clone(), 5_000).collect();
        let published = names(&d.notify(&flood));
        assert_eq!(published.len(), 5_000, "{:?}", &published[..3]);
        assert!(published
            .iter()
            .all(|n| n == "publish agent.session.turn.output_text.delta"));
        let answered = names(&d.feed(CoreInput::Answer {
            id: rpc_id(&steer, "turn/steer"),
            result: Ok(json!({})),
        }));
        assert_eq!(answered, ["answer 2 ok"]);
        // A third message waits behind a steer codex has not answered; a refusal
        // (the turn ended meanwhile) is the client's 409.
        let third = d.say(3, "SAY third");
        let refused = names(&d.feed(CoreInput::Answer {
            id: rpc_id(&third, "turn/steer"),
            result: Err(RpcError::new(-32600, "no active turn to steer")),
        }));
        assert_eq!(refused.len(), 1);
        assert!(refused[0].starts_with("answer 3 error Busy"), "{refused:?}");
    }

    #[test]
    fn a_full_store_still_ends_the_turn_and_the_session_is_idle_with_what_was_not_kept_said() {
        let capture = text();
        let mut d = Driver::ready(&capture.thread);
        let (answer, notifications) = &capture.turns[0];
        d.begin(1, answer);
        d.full = true;
        let turn = d.notify(notifications);
        let kinds = names(&turn);
        let completed = position(&kinds, "publish agent.session.turn.completed");
        let error = position(&kinds, "publish error");
        let idle = position(&kinds, "publish agent.session.idle (end)");
        assert!(
            position(&kinds, "commit completed") < completed,
            "{kinds:?}"
        );
        assert!(completed < error && error < idle, "{kinds:?}");
        assert!(
            d.writes
                .contains(&"not_kept items,artifacts,trace".to_string()),
            "{:?}",
            d.writes
        );
        let Effect::Publish { event, .. } = &turn[error] else {
            unreachable!()
        };
        assert_eq!(event["error"]["code"], "agents_store_quota_exceeded");
        let said = event["error"]["message"].as_str().unwrap();
        assert!(said.contains("items, artifacts, trace"), "{said}");
        assert_eq!(d.session.status, Status::Idle);
        // The session takes the next input.
        d.full = false;
        assert_eq!(names(&d.say(2, "SAY again"))[0], "commit begin_turn");
    }

    #[test]
    fn a_cancel_before_codex_started_the_turn_is_resent_then_the_turn_is_ended_here() {
        let capture = text();
        let mut d = Driver::ready(&capture.thread);
        let (answer, notifications) = &capture.turns[0];
        d.begin(1, answer);
        let cancel = names(&d.feed(CoreInput::Command {
            waiter: 2,
            inputs: vec![Input::Cancel],
        }));
        assert_eq!(cancel, ["rpc turn/interrupt", "answer 2 ok"]);
        assert_eq!(d.core.deadline(), Some(d.at(CANCEL_RESEND)));
        // codex drops an interrupt that comes before its turn started: sent again then.
        let started = position_of(notifications, "turn/started");
        let again = names(&d.notify(&notifications[..=started]));
        assert!(has(&again, "rpc turn/interrupt"), "{again:?}");
        assert_eq!(d.core.deadline(), Some(d.at(CANCEL_GIVE_UP)));
        assert!(d.tick_at(CANCEL_RESEND).is_empty());
        let given_up = names(&d.tick_at(CANCEL_GIVE_UP));
        assert_eq!(given_up[0], "log");
        let end = position(&given_up, "commit cancelled");
        assert!(
            end < position(&given_up, "publish agent.session.turn.cancelled"),
            "{given_up:?}"
        );
        assert!(
            position(&given_up, "publish agent.session.idle (end)") < position(&given_up, "stop")
        );
        assert_eq!(given_up.last().unwrap(), "stop");
    }

    #[test]
    fn a_cancel_with_no_turn_started_at_all_is_resent_after_two_seconds() {
        let mut d = Driver::ready("thread_1");
        let begun = d.say(1, "SAY slow");
        d.feed(CoreInput::Answer {
            id: rpc_id(&begun, "turn/start"),
            result: Ok(json!({"turn": {"id": "codex_turn_1"}})),
        });
        d.feed(CoreInput::Command {
            waiter: 2,
            inputs: vec![Input::Cancel],
        });
        assert_eq!(names(&d.tick_at(CANCEL_RESEND)), ["rpc turn/interrupt"]);
        assert_eq!(d.core.deadline(), Some(d.at(CANCEL_GIVE_UP)));
        assert_eq!(names(&d.tick_at(CANCEL_GIVE_UP)).last().unwrap(), "stop");
    }

    fn position_of(notifications: &[(String, Value)], method: &str) -> usize {
        notifications.iter().position(|(m, _)| m == method).unwrap()
    }

    #[test]
    fn a_cancel_codex_honours_ends_the_turn_cancelled_and_the_actor_goes_on() {
        let capture = interrupted();
        let mut d = Driver::ready(&capture.thread);
        let (answer, notifications) = &capture.turns[0];
        d.begin(1, answer);
        let delta = position_of(notifications, "item/agentMessage/delta");
        d.notify(&notifications[..=delta]);
        let cancel = d.feed(CoreInput::Command {
            waiter: 2,
            inputs: vec![Input::Cancel],
        });
        let Effect::Rpc { params, .. } = &cancel[0] else {
            panic!("{cancel:?}")
        };
        assert_eq!(params["turnId"], answer["turn"]["id"]);
        let end = names(&d.notify(&notifications[delta + 1..]));
        d.feed(CoreInput::Answer {
            id: rpc_id(&cancel, "turn/interrupt"),
            result: Ok(json!({})),
        });
        assert!(
            position(&end, "commit cancelled")
                < position(&end, "publish agent.session.turn.cancelled"),
            "{end:?}"
        );
        assert!(
            has(&end, "publish agent.session.idle (end)") && !has(&end, "stop"),
            "{end:?}"
        );
        // The cancel's deadlines went with the turn: only idling out is left.
        assert_eq!(d.core.deadline(), Some(d.at(IDLE)));
        assert!(d.tick_at(CANCEL_GIVE_UP).is_empty());
    }

    #[test]
    fn every_rpc_has_a_deadline_and_one_codex_never_answers_ends_as_a_failure() {
        let mut d = Driver::ready("thread_1");
        let begun = d.say(1, "SAY hello");
        assert_eq!(d.core.deadline(), Some(d.at(REQUEST_TIMEOUT)));
        // Meanwhile codex's messages are read: the turn runs.
        let started = d.feed(CoreInput::Notification {
            method: "turn/started".into(),
            params: json!({"threadId": "thread_1", "turn": {"id": "codex_turn_1"}}),
        });
        assert!(
            names(&started)
                .iter()
                .any(|n| n == "publish agent.session.turn.in_progress"),
            "{started:?}"
        );
        let timed_out = names(&d.tick_at(REQUEST_TIMEOUT));
        assert_failed_then_idle(&timed_out);
        assert!(
            has(&timed_out, "announce agent.session.failed"),
            "{timed_out:?}"
        );
        // The input was applied (its turn exists, and failed): accepted.
        assert_eq!(timed_out.last().unwrap(), "answer 1 ok");
        // An answer after the deadline is nobody's.
        let late = d.feed(CoreInput::Answer {
            id: rpc_id(&begun, "turn/start"),
            result: Ok(json!({"turn": {"id": "codex_turn_1"}})),
        });
        assert!(late.is_empty(), "{late:?}");
    }

    #[test]
    fn a_restarted_session_resumes_its_thread_before_it_applies_any_input() {
        // What a restart left of a session whose turn was running: idle, its turn failed
        // (the store did that when it opened), its thread on codex's disk.
        let mut restarted = session(Some("thread_1"));
        restarted.error = Some("restarted".into());
        restarted.turns = 1;
        let mut d = Driver::new(restarted);
        assert_eq!(names(&d.feed(CoreInput::Start)), ["start"]);
        // An input comes while codex starts: it waits for the thread.
        assert!(d.say(1, "SAY back again").is_empty());
        let resume = d.feed(CoreInput::Started(Ok(started())));
        let Effect::Rpc { method, params, .. } = &resume[0] else {
            panic!("{resume:?}")
        };
        assert_eq!(*method, "thread/resume");
        assert_eq!(params["threadId"], "thread_1");
        assert_eq!(params["excludeTurns"], true);
        assert!(params.get("dynamicTools").is_none(), "{params}");
        // The replayed totals are where the next turn's usage counts from.
        d.feed(CoreInput::Notification {
            method: "thread/tokenUsage/updated".into(),
            params: json!({"threadId": "thread_1", "tokenUsage": {"total": {"totalTokens": 70}}}),
        });
        assert_eq!(d.core.totals.total, 70);
        let resumed = names(&d.feed(CoreInput::Answer {
            id: rpc_id(&resume, "thread/resume"),
            result: Ok(json!({})),
        }));
        assert_eq!(resumed[0], "commit begin_turn");
        assert_eq!(resumed.last().unwrap(), "rpc turn/start");
    }

    #[test]
    fn a_new_session_keeps_the_thread_codex_started_before_any_input() {
        let mut d = Driver::new(session(None));
        d.feed(CoreInput::Start);
        let start = d.feed(CoreInput::Started(Ok(started())));
        assert!(d.say(1, "SAY hi").is_empty());
        let ready = names(&d.feed(CoreInput::Answer {
            id: rpc_id(&start, "thread/start"),
            result: Ok(json!({"thread": {"id": "thread_new"}})),
        }));
        assert_eq!(ready[..2], ["commit thread_id", "commit begin_turn"]);
    }

    #[test]
    fn a_codex_that_exits_mid_turn_fails_the_turn_and_hands_queued_inputs_back() {
        let mut d = Driver::ready("thread_1");
        d.say(1, "SAY hello");
        d.say(2, "SAY queued");
        let exited = names(&d.feed(CoreInput::Exited {
            why: "codex app-server exited: boom".into(),
        }));
        assert_failed_then_idle(&exited);
        // The first input's turn exists (failed): applied; the second goes to a new actor.
        let answer_1 = position(&exited, "answer 1 ok");
        let answer_2 = position(&exited, "answer 2 not read 1");
        assert!(
            answer_1 < answer_2 && answer_2 < position(&exited, "stop"),
            "{exited:?}"
        );
        assert_eq!(d.core.deadline(), None);
    }

    #[test]
    fn an_actor_idles_out_and_an_input_racing_it_is_handed_back_not_lost() {
        let mut d = Driver::ready("thread_1");
        assert_eq!(d.core.deadline(), Some(d.at(IDLE)));
        assert!(d.tick_at(IDLE - Duration::from_millis(1)).is_empty());
        assert_eq!(names(&d.tick_at(IDLE)), ["stop"]);
        // The input the shell had queued as it stopped: back to the hub, whole.
        let raced = d.feed(CoreInput::Command {
            waiter: 1,
            inputs: vec![message("SAY raced"), Input::Cancel],
        });
        assert_eq!(names(&raced), ["answer 1 not read 2"]);
        // An input that comes first keeps the actor.
        let mut d = Driver::ready("thread_1");
        d.elapsed = IDLE - Duration::from_millis(1);
        assert_eq!(names(&d.say(1, "SAY just in time"))[0], "commit begin_turn");
        assert!(!has(&names(&d.tick_at(IDLE)), "stop"));
    }

    #[test]
    fn a_delete_during_a_turn_stops_the_actor_and_its_inputs_hear_it() {
        let capture = text();
        let mut d = Driver::ready(&capture.thread);
        d.begin(1, &capture.turns[0].0);
        let steer = d.say(2, "SAY steer");
        d.say(3, "SAY queued");
        let writes = d.writes.len();
        let stopped = names(&d.feed(CoreInput::Stop));
        assert_eq!(stopped, ["answer 2 stopped", "answer 3 stopped", "stop"]);
        // Nothing is written to a session being deleted.
        assert_eq!(d.writes.len(), writes);
        // Nor does anything come of codex's late answer, or of a later input.
        assert!(d
            .feed(CoreInput::Answer {
                id: rpc_id(&steer, "turn/steer"),
                result: Ok(json!({}))
            })
            .is_empty());
        assert_eq!(names(&d.say(4, "SAY late")), ["answer 4 stopped"]);
    }

    /// A call of the automations tool is answered by the actor: it shows as a
    /// function_call item, asks no client for action, and no client may answer it.
    #[test]
    fn the_automations_tool_is_answered_by_the_actor_not_a_client() {
        let capture = capture(
            &include_str!("../../../../tests/fixtures/codex/tool.jsonl")
                .replace("lookup_weather", codex_map::AUTOMATIONS_TOOL),
        );
        let mut d = Driver::ready(&capture.thread);
        d.begin(1, &capture.turns[0].0);
        let notifications = &capture.turns[0].1;
        let call_started = notifications
            .iter()
            .position(|(m, p)| m == "item/started" && p["item"]["type"] == "dynamicToolCall")
            .unwrap();
        d.notify(&notifications[..=call_started]);
        let codex_turn = capture.turns[0].0["turn"]["id"].clone();
        let called = d.feed(CoreInput::Request {
            id: json!(0),
            method: "item/tool/call".into(),
            params: json!({"threadId": capture.thread, "turnId": codex_turn, "callId": "call_up2",
                           "namespace": null, "tool": "automations", "arguments": {"action": "list"}}),
        });
        let said = names(&called);
        assert!(has(&said, "run tool call_up2"), "{said:?}");
        assert!(
            has(&said, "publish agent.session.turn.item.added"),
            "{said:?}"
        );
        assert!(
            !said.iter().any(|n| n.contains("requires_action")),
            "{said:?}"
        );
        let Some(Effect::RunTool { id, arguments, .. }) =
            called.iter().find(|e| matches!(e, Effect::RunTool { .. }))
        else {
            unreachable!()
        };
        assert_eq!(arguments, &json!({"action": "list"}));
        // A client cannot answer it.
        let client = d.feed(CoreInput::Command {
            waiter: 2,
            inputs: vec![Input::ToolResult {
                turn_id: d.session.active_turn.clone().unwrap(),
                call_id: "call_up2".into(),
                result: ToolResult {
                    success: true,
                    output: Some(json!("forged")),
                    error: None,
                },
            }],
        });
        assert!(
            matches!(
                &client[..],
                [Effect::Answer {
                    reply: Reply::Applied(Err(AgentError::Invalid { .. })),
                    ..
                }]
            ),
            "{client:?}"
        );
        // Its answer goes to codex, with no session status change.
        let answered = d.feed(CoreInput::Answer {
            id: *id,
            result: Ok(json!("{\"automations\": []}")),
        });
        let said = names(&answered);
        assert_eq!(
            said.first().map(String::as_str),
            Some("respond ok"),
            "{said:?}"
        );
        assert!(
            !said.iter().any(|n| n.contains("agent.session.in_progress")),
            "{said:?}"
        );
        let Effect::Respond {
            result: Ok(answer), ..
        } = &answered[0]
        else {
            unreachable!()
        };
        assert_eq!(answer["success"], true);
        assert_eq!(answer["contentItems"][0]["text"], "{\"automations\": []}");
    }

    #[test]
    fn a_tool_result_for_no_pending_call_is_refused_by_name() {
        let tool = |waiter| CoreInput::Command {
            waiter,
            inputs: vec![Input::ToolResult {
                turn_id: "turn_x".into(),
                call_id: "call_nope".into(),
                result: ToolResult {
                    success: true,
                    output: Some(json!("x")),
                    error: None,
                },
            }],
        };
        let mut d = Driver::ready("thread_1");
        let idle = d.feed(tool(1));
        let running = {
            d.begin(2, &json!({"turn": {"id": "codex_turn_1"}}));
            d.feed(tool(3))
        };
        for (effects, waiter) in [(idle, 1), (running, 3)] {
            let [Effect::Answer {
                waiter: w,
                reply: Reply::Applied(Err(AgentError::Invalid { param, message })),
            }] = &effects[..]
            else {
                panic!("{effects:?}")
            };
            assert_eq!((*w, param.as_str()), (waiter, "events"));
            assert_eq!(message, "Unknown pending tool call: call_nope");
        }
    }

    #[test]
    fn a_sub_agent_thread_is_opened_once_codex_said_its_name_and_nothing_waits_meanwhile() {
        let mut d = Driver::ready("thread_1");
        let started = json!({"threadId": "child_1", "turn": {"id": "t"}});
        let opening = d.feed(CoreInput::Notification {
            method: "turn/started".into(),
            params: started,
        });
        assert_eq!(names(&opening), ["rpc thread/read"]);
        // Its messages wait for the name; the root's do not.
        let delta = json!({"threadId": "child_1", "turnId": "t", "itemId": "i", "delta": "x"});
        assert!(d
            .feed(CoreInput::Notification {
                method: "item/agentMessage/delta".into(),
                params: delta
            })
            .is_empty());
        let opened = names(&d.feed(CoreInput::Answer {
            id: rpc_id(&opening, "thread/read"),
            result: Ok(json!({"thread": {"agentNickname": "Helper"}})),
        }));
        assert_eq!(
            opened,
            [
                "open child child_1",
                "child turn/started",
                "child item/agentMessage/delta"
            ]
        );
    }
}
