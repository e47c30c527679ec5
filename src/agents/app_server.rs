//! A client of `codex app-server`: one long-lived codex process that serves threads and
//! turns over JSON-RPC on its stdio, where `codex exec` ([`super::turn`]) is one process
//! per turn. [`super::codex_map`] says what its messages mean in the Agents API; this
//! module only carries them.
//!
//! ```ignore
//! let (server, mut incoming) = AppServer::start(launch, &registry, "agent_sandbox").await?;
//! let started = server.request("thread/start", json!({"cwd": "/work"})).await?;
//! while let Some(message) = incoming.next().await {
//!     match message {
//!         Message::Notification { method, params } => { /* turn/started, item/… */ }
//!         Message::Request { id, method, params } => server.respond(id, Ok(json!({}))),
//!         Message::Exited { code, stderr_tail } => { /* the last one */ }
//!     }
//! }
//! server.shutdown().await;
//! ```
//!
//! - **Start.** [`AppServer::start`] spawns `<program> app-server <args>` through the one
//!   spawn path (own process group, the given working directory and whole environment),
//!   sends `initialize` (with `capabilities.experimentalApi`, which dynamic tools need,
//!   and opting out of bookkeeping notifications nobody maps: [`OPTED_OUT`]), awaits its
//!   answer and sends `initialized`. A failure names codex's exit and its last stderr
//!   lines.
//! - **Framing.** One JSON-RPC message per line, without the `"jsonrpc"` member (codex's
//!   dialect). A line longer than [`MAX_LINE`] is a protocol failure: the process is
//!   killed and everything pending fails saying so. A line that is not JSON is logged
//!   and skipped.
//! - **Requests.** [`AppServer::request`] may be called concurrently (each gets a fresh
//!   numeric id and its own answer); an error answer is an [`RpcError`].
//!   [`AppServer::respond`] answers a server→client [`Message::Request`] (dynamic tool
//!   calls, approvals), [`AppServer::notify`] sends a notification. Writes are queued
//!   and written by one task, awaited on the worker's driver when the pipe is full, so
//!   lines never interleave and the worker never blocks.
//! - **Incoming.** Notifications and server requests, in codex's order, through a
//!   bounded queue ([`INCOMING_QUEUE`] messages). **Backpressure:** while the queue is
//!   full the reader stops reading stdout, so answers behind a notification wait too;
//!   a caller that awaits a request must keep draining [`Incoming`] (select on both).
//!   [`Incoming`] is `Send`; [`AppServer`] is not (it lives on the worker that started
//!   it, and so does its process).
//! - **End.** When the process exits or its stdout ends, every pending and later request
//!   fails with an [`RpcError`] of code [`RpcError::EXITED`] naming the exit and the
//!   stderr tail, and [`Incoming`] yields [`Message::Exited`] once, then `None`.
//!   [`AppServer::shutdown`] closes stdin (codex then exits by itself), waits
//!   [`SHUTDOWN_GRACE`], then kills the process group; the leader is reaped through its
//!   pidfd and what is left of its group is killed too (npm's launcher and the native
//!   codex under it, a helper codex never reaped), then the end waits a little for PID 1
//!   to reap those orphans, so nothing stays behind. Dropping an [`AppServer`] does the
//!   same in the background.
//!
//! Both pipes are read on the worker's own driver ([`crate::process::pipe`]); no pool
//! thread ever waits on them.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::fmt;
use std::future::{pending, poll_fn};
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_channel::{mpsc, oneshot};

use super::claude::thread::ClaudeThread;
use futures_core::Stream;
use serde_json::{json, Value};

use crate::process::pipe::{self, PipeReader};
use crate::process::{Child, ChildRegistry, Spawn};

/// Longest line codex may print: a `thread/resume` answer carries whole turns, an item a
/// command's whole output.
pub const MAX_LINE: usize = 64 * 1024 * 1024;
/// Messages [`Incoming`] holds before the reader stops reading stdout.
pub const INCOMING_QUEUE: usize = 1024;
/// How long [`AppServer::shutdown`] lets codex exit after its stdin closed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// How long `initialize` may take.
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);
/// The most any request waits for codex's answer (a `thread/resume` reads the whole
/// rollout; a `turn/interrupt` waits until the turn aborted).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the pipes may stay open after codex itself exited (a descendant that holds
/// them): then they are given up.
const AFTER_EXIT: Duration = Duration::from_secs(2);
/// How long the end waits for orphaned members of codex's group to be reaped.
const GROUP_GRACE: Duration = Duration::from_secs(2);
/// Stderr lines kept for failure messages, and the longest kept of each.
const STDERR_LINES: usize = 20;
const STDERR_LINE_CHARS: usize = 2000;

/// Notifications asked not to be sent (`optOutNotificationMethods`): account and
/// read-state bookkeeping of codex's own UI, which no Agents API event comes from.
pub const OPTED_OUT: [&str; 3] = [
    "remoteControl/status/changed",
    "account/rateLimits/updated",
    "thread/readState/changed",
];

/// What to start.
pub struct AppServerLaunch {
    /// The codex program (a path, or a name looked up on the environment's `PATH`).
    pub program: PathBuf,
    /// Arguments after `app-server`, such as `-c key=value` overrides.
    pub args: Vec<String>,
    /// The working directory, opened beneath the base directory.
    pub cwd: OwnedFd,
    /// The whole environment of the process (`CODEX_HOME`, the provider's key, `PATH`).
    pub env: Vec<(OsString, OsString)>,
    /// Set for a Claude Code CLI in `--input-format stream-json` mode: `args` is its
    /// whole argv after the program, no handshake is made, and this translator speaks
    /// codex's protocol for it ([`super::claude::thread`]).
    pub claude: Option<ClaudeThread>,
}

/// What the server says, in its order.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Notification {
        method: String,
        params: Value,
    },
    /// A server→client request (`item/tool/call`, approvals): answer it with
    /// [`AppServer::respond`] (codex's turn waits for the answer).
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// The process is gone (the last message, sent once): its exit status as Python's
    /// `returncode` (negative: killed by that signal; `None` if unknown) and its last
    /// stderr lines.
    Exited {
        code: Option<i32>,
        stderr_tail: Vec<String>,
    },
}

/// A JSON-RPC error: codex's answer, or [`RpcError::EXITED`] when there will be none.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    /// The process ended (or was killed) before answering; `data` holds
    /// `{"exit_code", "stderr_tail"}`.
    pub const EXITED: i64 = -32090;
    /// Codex's refusal of a request it cannot serve now (`"no active turn to steer"`,
    /// `"Not initialized"`).
    #[cfg(test)]
    pub const INVALID_REQUEST: i64 = -32600;
    /// The standard code for a failure inside the answering side (for [`AppServer::respond`]).
    pub const INTERNAL_ERROR: i64 = -32603;
    /// codex did not answer within [`REQUEST_TIMEOUT`].
    pub const TIMED_OUT: i64 = -32091;

    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    fn of(error: &Value) -> RpcError {
        RpcError {
            code: error["code"].as_i64().unwrap_or(Self::INTERNAL_ERROR),
            message: error["message"]
                .as_str()
                .map_or_else(|| error.to_string(), str::to_string),
            data: error.get("data").filter(|d| !d.is_null()).cloned(),
        }
    }

    fn to_json(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(data) = &self.data {
            error["data"] = data.clone();
        }
        error
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (JSON-RPC error {})", self.message, self.code)
    }
}

impl std::error::Error for RpcError {}

type Answer = Result<Value, RpcError>;

/// What the client and the reader share (one worker: no locks).
#[derive(Default)]
struct Shared {
    pending: HashMap<u64, oneshot::Sender<Answer>>,
    next_id: u64,
    /// Set once the process is gone: what every later request fails with.
    ended: Option<RpcError>,
    /// The translator of a Claude Code CLI (`None`: codex, which speaks JSON-RPC).
    claude: Option<ClaudeThread>,
}

/// A running `codex app-server`.
pub struct AppServer {
    shared: Rc<RefCell<Shared>>,
    /// Lines for the writer task; dropping it closes codex's stdin.
    outbox: Option<mpsc::UnboundedSender<Vec<u8>>>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<()>>,
    /// How long a request waits for its answer ([`REQUEST_TIMEOUT`]; tests shorten it).
    request_timeout: Duration,
    /// The process group (tests signal it).
    #[cfg(test)]
    pgid: i32,
}

/// What the server says; see [`Message`].
pub struct Incoming {
    messages: mpsc::Receiver<Message>,
}

impl Incoming {
    /// The next message; `None` after [`Message::Exited`].
    pub async fn next(&mut self) -> Option<Message> {
        poll_fn(|cx| Pin::new(&mut self.messages).poll_next(cx)).await
    }
}

impl AppServer {
    /// Starts codex's app-server and completes the handshake as `client_name`. Must run
    /// on a worker (its pipes and its exit are awaited on the worker's driver).
    pub async fn start(
        launch: AppServerLaunch,
        registry: &Arc<ChildRegistry>,
        client_name: &str,
    ) -> io::Result<(AppServer, Incoming)> {
        let mut argv = vec![launch.program.to_string_lossy().into_owned()];
        if launch.claude.is_none() {
            argv.push("app-server".to_string());
        }
        argv.extend(launch.args);
        let speaks_claude = launch.claude.is_some();
        let spec = Spawn {
            user: None,
            argv,
            cwd: launch.cwd,
            env: launch.env,
            stdin: true,
            capture: true,
            terminal: None,
        };
        let mut child = Child::spawn(spec, registry).await?;
        #[cfg(test)]
        let pgid = child.pid();
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(io::Error::other(
                "codex app-server was started without pipes",
            ));
        };
        let stdout = PipeReader::new(stdout)?;
        let stderr = PipeReader::new(stderr)?;
        let shared = Rc::new(RefCell::new(Shared {
            claude: launch.claude,
            ..Shared::default()
        }));
        let (outbox, lines) = mpsc::unbounded();
        let (messages_tx, messages) = mpsc::channel(INCOMING_QUEUE);
        let (stop_tx, stop) = oneshot::channel();
        let (done_tx, done) = oneshot::channel();
        monoio::spawn(write_lines(stdin, lines));
        let reader = Reader {
            child,
            stdout: Some(stdout),
            stderr: Some(stderr),
            line: Vec::new(),
            scanned: 0,
            stderr_partial: Vec::new(),
            stderr_tail: VecDeque::new(),
            shared: shared.clone(),
            incoming: messages_tx,
            outbox: speaks_claude.then(|| outbox.clone()),
            stop,
            stop_at: None,
            exit: None,
            killed: false,
            failure: None,
        };
        monoio::spawn(reader.run(done_tx));
        let server = AppServer {
            shared,
            outbox: Some(outbox),
            stop: Some(stop_tx),
            done: Some(done),
            request_timeout: REQUEST_TIMEOUT,
            #[cfg(test)]
            pgid,
        };
        if speaks_claude {
            // The CLI takes its first input at once: there is no handshake.
            return Ok((server, Incoming { messages }));
        }
        let params = json!({
            "clientInfo": {"name": client_name, "title": null, "version": env!("CARGO_PKG_VERSION")},
            "capabilities": {"experimentalApi": true, "optOutNotificationMethods": OPTED_OUT},
        });
        let answer =
            monoio::time::timeout(INITIALIZE_TIMEOUT, server.request("initialize", params)).await;
        let failure = match answer {
            Ok(Ok(_)) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(_) => Some(format!(
                "no answer to initialize within {} s",
                INITIALIZE_TIMEOUT.as_secs()
            )),
        };
        if let Some(failure) = failure {
            server.shutdown().await;
            return Err(io::Error::other(format!(
                "codex app-server did not start: {failure}"
            )));
        }
        server.notify("initialized", Value::Null);
        Ok((server, Incoming { messages }))
    }

    /// Sends a request and waits for its answer, [`REQUEST_TIMEOUT`] at most (a codex
    /// that stopped answering must not hold its caller). Concurrent requests are fine; dropping the future forgets the answer.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let within = self.request_timeout;
        match monoio::time::timeout(within, self.request_unbounded(method, params)).await {
            Ok(answer) => answer,
            Err(_) => Err(RpcError::new(
                RpcError::TIMED_OUT,
                format!(
                    "codex did not answer {method} within {} ms",
                    within.as_millis()
                ),
            )),
        }
    }

    /// [`AppServer::request`] as a future that does not borrow the server, for a caller
    /// that must keep reading [`Incoming`] while it waits (the session actor awaits it
    /// on a task of its own). The server may be shut down meanwhile: the answer then
    /// fails with [`RpcError::EXITED`].
    pub fn request_detached(
        &self,
        method: &str,
        params: Value,
    ) -> impl std::future::Future<Output = Result<Value, RpcError>> + 'static {
        let shared = self.shared.clone();
        let within = self.request_timeout;
        let method = method.to_string();
        let translated = {
            let mut state = shared.borrow_mut();
            let ended = state.ended.is_some();
            match state.claude.as_mut() {
                Some(thread) if !ended => Some(thread.request(&method, &params)),
                _ => None,
            }
        };
        let translated = translated.map(|(reaction, answer)| {
            for line in reaction.write {
                self.send(line);
            }
            answer.map_err(|(code, message)| RpcError::new(code, message))
        });
        let registered = {
            let mut state = shared.borrow_mut();
            match &state.ended {
                Some(ended) => Err(ended.clone()),
                None if translated.is_some() => Ok((0, None)),
                None => {
                    let id = state.next_id;
                    state.next_id += 1;
                    let (tx, rx) = oneshot::channel();
                    state.pending.insert(id, tx);
                    Ok((id, Some(rx)))
                }
            }
        };
        if let Ok((id, Some(_))) = &registered {
            self.send(json!({"id": id, "method": method, "params": params}));
        }
        async move {
            let (id, answer) = registered?;
            let Some(answer) = answer else {
                // Claude Code's translator answered at once.
                return translated.unwrap_or_else(|| Ok(Value::Null));
            };
            let _forget = Forget {
                shared: &shared,
                id,
            };
            match monoio::time::timeout(within, answer).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => Err(shared.borrow().ended.clone().unwrap_or_else(|| {
                    RpcError::new(RpcError::EXITED, "codex app-server is gone")
                })),
                Err(_) => Err(RpcError::new(
                    RpcError::TIMED_OUT,
                    format!(
                        "codex did not answer {method} within {} ms",
                        within.as_millis()
                    ),
                )),
            }
        }
    }

    async fn request_unbounded(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let (id, answer) = {
            let mut shared = self.shared.borrow_mut();
            if let Some(ended) = &shared.ended {
                return Err(ended.clone());
            }
            let id = shared.next_id;
            shared.next_id += 1;
            let (tx, rx) = oneshot::channel();
            shared.pending.insert(id, tx);
            (id, rx)
        };
        let _forget = Forget {
            shared: &self.shared,
            id,
        };
        self.send(json!({"id": id, "method": method, "params": params}));
        match answer.await {
            Ok(answer) => answer,
            // The reader is gone without answering (the runtime is ending).
            Err(_) => Err(self
                .shared
                .borrow()
                .ended
                .clone()
                .unwrap_or_else(|| RpcError::new(RpcError::EXITED, "codex app-server is gone"))),
        }
    }

    /// Answers a [`Message::Request`] with its result or an error (Claude Code asks
    /// none: nothing is sent to it).
    pub fn respond(&self, id: Value, result: Result<Value, RpcError>) {
        if self.shared.borrow().claude.is_some() {
            return;
        }
        let message = match result {
            Ok(result) => json!({"id": id, "result": result}),
            Err(error) => json!({"id": id, "error": error.to_json()}),
        };
        self.send(message);
    }

    /// Sends a notification (`params` left out when null).
    pub fn notify(&self, method: &str, params: Value) {
        let mut message = json!({ "method": method });
        if !params.is_null() {
            message["params"] = params;
        }
        self.send(message);
    }

    /// The process group, for signals: the pid of the process started (npm's `codex`
    /// launcher runs the native codex as its child when its Node.js cannot `execve`),
    /// which leads the group both are in.
    #[cfg(test)]
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    fn send(&self, message: Value) {
        let mut line = message.to_string().into_bytes();
        line.push(b'\n');
        if let Some(outbox) = &self.outbox {
            // Fails only once the writer is gone (the process exited); the reader then
            // fails whatever waits for an answer.
            let _ = outbox.unbounded_send(line);
        }
    }

    /// Closes codex's stdin, lets it exit for [`SHUTDOWN_GRACE`], then kills its process
    /// group; returns once it is reaped.
    pub async fn shutdown(mut self) {
        let closing = self
            .shared
            .borrow_mut()
            .claude
            .as_mut()
            .map(ClaudeThread::closing)
            .unwrap_or_default();
        for line in closing {
            self.send(line);
        }
        self.outbox = None;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            let _ = done.await;
        }
    }
}

impl Drop for AppServer {
    /// Not shut down: the reader ends the process in the background, as `shutdown` would.
    fn drop(&mut self) {
        self.outbox = None;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Forgets a request's answer slot when its future ends or is dropped.
struct Forget<'a> {
    shared: &'a RefCell<Shared>,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.shared.borrow_mut().pending.remove(&self.id);
    }
}

/// Writes queued lines to codex's stdin (non-blocking, awaited when full) until the
/// queue closes or the pipe breaks; the descriptor closes with it.
async fn write_lines(stdin: OwnedFd, mut lines: mpsc::UnboundedReceiver<Vec<u8>>) {
    while let Some(line) = poll_fn(|cx| Pin::new(&mut lines).poll_next(cx)).await {
        if pipe::write_all(&stdin, &line).await.1.is_err() {
            return;
        }
    }
}

/// Why the reader's loop woke.
enum Wake {
    Stdout(io::Result<Option<Vec<u8>>>),
    Stderr(io::Result<Option<Vec<u8>>>),
    Exit(io::Result<crate::process::ExitCode>),
    Stop,
    Deadline,
}

/// Reads codex's stdout and stderr and watches its exit, on the worker that started it.
struct Reader {
    child: Child,
    stdout: Option<PipeReader>,
    stderr: Option<PipeReader>,
    /// Stdout not yet ended by a newline, and how much of it holds no newline.
    line: Vec<u8>,
    scanned: usize,
    stderr_partial: Vec<u8>,
    stderr_tail: VecDeque<String>,
    shared: Rc<RefCell<Shared>>,
    incoming: mpsc::Sender<Message>,
    /// Claude Code's stdin, for what its translator answers lines with (the interrupt
    /// of a turn nobody waits for); let go at the stop, so the stdin can close.
    outbox: Option<mpsc::UnboundedSender<Vec<u8>>>,
    stop: oneshot::Receiver<()>,
    /// When a stop was asked for (or stdout ended with codex still running): the kill
    /// follows [`SHUTDOWN_GRACE`] later.
    stop_at: Option<Instant>,
    exit: Option<(Option<i32>, Instant)>,
    killed: bool,
    /// A protocol failure the reader ended the process for.
    failure: Option<String>,
}

async fn read_piece(reader: &mut Option<PipeReader>) -> io::Result<Option<Vec<u8>>> {
    match reader {
        Some(r) => r.read().await.map(|piece| piece.map(<[u8]>::to_vec)),
        None => pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => monoio::time::sleep(at.saturating_duration_since(Instant::now())).await,
        None => pending().await,
    }
}

impl Reader {
    async fn run(mut self, done: oneshot::Sender<()>) {
        while !(self.exit.is_some() && self.stdout.is_none() && self.stderr.is_none()) {
            let deadline = match (self.exit, self.stop_at) {
                (Some((_, at)), _) => Some(at + AFTER_EXIT),
                (None, Some(at)) if !self.killed => Some(at + SHUTDOWN_GRACE),
                _ => None,
            };
            let stopping = self.stop_at.is_some();
            let exited = self.exit.is_some();
            let wake = monoio::select! {
                piece = read_piece(&mut self.stdout) => Wake::Stdout(piece),
                piece = read_piece(&mut self.stderr) => Wake::Stderr(piece),
                code = self.child.wait(), if !exited => Wake::Exit(code),
                _ = &mut self.stop, if !stopping => Wake::Stop,
                _ = sleep_until(deadline) => Wake::Deadline,
            };
            match wake {
                Wake::Stdout(Ok(Some(piece))) => self.take_stdout(&piece).await,
                Wake::Stdout(end) => {
                    if let Err(e) = end {
                        self.failure
                            .get_or_insert(format!("its stdout failed: {e}"));
                    }
                    self.stdout = None;
                    let rest = std::mem::take(&mut self.line);
                    self.take_line(&rest).await;
                    // No more protocol: a codex that still runs is ended.
                    self.stop_at.get_or_insert_with(Instant::now);
                }
                Wake::Stderr(Ok(Some(piece))) => self.take_stderr(&piece),
                Wake::Stderr(_) => {
                    self.stderr = None;
                    let rest = std::mem::take(&mut self.stderr_partial);
                    self.keep_stderr_line(&rest);
                }
                Wake::Exit(code) => {
                    self.exit = Some((code.ok().map(|c| c.0), Instant::now()));
                }
                Wake::Stop => {
                    self.stop_at = Some(Instant::now());
                    self.outbox = None;
                }
                Wake::Deadline if self.exit.is_some() => {
                    // A descendant holds the pipes past the grace: codex is gone all
                    // the same.
                    self.stdout = None;
                    self.stderr = None;
                }
                Wake::Deadline => self.kill().await,
            }
        }
        // Nothing of codex's group may outlive it (a command it left running, a helper
        // it never reaped). Members it orphaned are reaped by PID 1, not by us: wait a
        // little for the group to be empty.
        let _ = self.child.signal_group(rustix::process::Signal::KILL);
        let pgid = self.child.pid();
        let deadline = Instant::now() + GROUP_GRACE;
        while crate::process::group::outlives_leader(pgid) && Instant::now() < deadline {
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
        self.end().await;
        let _ = done.send(());
    }

    /// Kills the process and every command it started, those in sessions of their own
    /// too (Claude Code's Bash puts each command in one), while their parent links
    /// still say whose they are.
    async fn kill(&mut self) {
        self.killed = true;
        if self.exit.is_none() {
            let root = self.child.pid();
            let _ =
                crate::runtime::file::blocking(move || crate::process::tree::kill_tree(root)).await;
        }
        let _ = self.child.signal_group(rustix::process::Signal::KILL);
    }

    async fn take_stdout(&mut self, piece: &[u8]) {
        self.line.extend_from_slice(piece);
        let mut start = 0;
        while let Some(at) = memchr::memchr(b'\n', &self.line[self.scanned..]) {
            let end = self.scanned + at;
            let line = self.line[start..end].to_vec();
            start = end + 1;
            self.scanned = start;
            self.take_line(&line).await;
        }
        self.line.drain(..start);
        self.scanned = self.line.len();
        if self.line.len() > MAX_LINE {
            self.line = Vec::new();
            self.scanned = 0;
            self.failure = Some(format!(
                "it printed a line over {} MiB, longer than this server reads",
                MAX_LINE >> 20
            ));
            self.stdout = None;
            self.kill().await;
        }
    }

    async fn take_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        if self.shared.borrow().claude.is_some() {
            return self.take_claude_line(line).await;
        }
        let mut message: Value = match serde_json::from_slice(line) {
            Ok(message) => message,
            Err(e) => {
                crate::log!(
                    "warning: codex app-server printed a line that is not JSON ({e}): {}",
                    String::from_utf8_lossy(&line[..line.len().min(200)])
                );
                return;
            }
        };
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_string);
        let params = message
            .get_mut("params")
            .map(Value::take)
            .unwrap_or(Value::Null);
        let id = message.get_mut("id").map(Value::take);
        match (method, id) {
            (Some(method), Some(id)) => {
                self.forward(Message::Request { id, method, params })
                    .await
            }
            (Some(method), None) => self.forward(Message::Notification { method, params }).await,
            (None, Some(id)) => {
                let answer = match message.get("error") {
                    Some(error) => Err(RpcError::of(error)),
                    None => Ok(message.get_mut("result").map(Value::take).unwrap_or_default()),
                };
                let waiter = id
                    .as_u64()
                    .and_then(|id| self.shared.borrow_mut().pending.remove(&id));
                // No waiter: the request's future was dropped; its answer is not wanted.
                if let Some(waiter) = waiter {
                    let _ = waiter.send(answer);
                }
            }
            (None, None) => crate::log!(
                "warning: codex app-server sent a message that is neither a request, a notification nor an answer: {}",
                String::from_utf8_lossy(&line[..line.len().min(200)])
            ),
        }
    }

    /// A Claude Code line: its notifications go to [`Incoming`], what it makes the
    /// translator write goes to the CLI's stdin.
    async fn take_claude_line(&mut self, line: &[u8]) {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let text = String::from_utf8_lossy(line);
        let reaction = match self.shared.borrow_mut().claude.as_mut() {
            Some(thread) => thread.line(&text, now_ms),
            None => return,
        };
        if !reaction.write.is_empty() {
            if let Some(outbox) = &self.outbox {
                for line in reaction.write {
                    let mut bytes = line.to_string().into_bytes();
                    bytes.push(b'\n');
                    let _ = outbox.unbounded_send(bytes);
                }
            }
        }
        for (method, params) in reaction.notify {
            self.forward(Message::Notification { method, params }).await;
        }
    }

    /// Queues a message for [`Incoming`], waiting while the queue is full (the
    /// backpressure), unless a stop comes first. Once stopping, a message goes only if
    /// there is room: the caller is shutting down and may not read any more.
    async fn forward(&mut self, message: Message) {
        if self.stop_at.is_some() {
            let _ = self.incoming.try_send(message);
            return;
        }
        let incoming = &mut self.incoming;
        let ready = monoio::select! {
            ready = poll_fn(|cx| incoming.poll_ready(cx)) => ready.is_ok(),
            _ = &mut self.stop => {
                self.stop_at = Some(Instant::now());
                self.outbox = None;
                false
            }
        };
        if ready {
            let _ = self.incoming.start_send(message);
        }
    }

    fn take_stderr(&mut self, piece: &[u8]) {
        self.stderr_partial.extend_from_slice(piece);
        let mut start = 0;
        while let Some(at) = memchr::memchr(b'\n', &self.stderr_partial[start..]) {
            let line = self.stderr_partial[start..start + at].to_vec();
            start += at + 1;
            self.keep_stderr_line(&line);
        }
        self.stderr_partial.drain(..start);
        // A line without end is kept only up to what a tail line may hold.
        if self.stderr_partial.len() > STDERR_LINE_CHARS * 4 {
            let partial = std::mem::take(&mut self.stderr_partial);
            self.keep_stderr_line(&partial);
        }
    }

    fn keep_stderr_line(&mut self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end();
        if text.trim().is_empty() {
            return;
        }
        let kept: String = text.chars().take(STDERR_LINE_CHARS).collect();
        if self.stderr_tail.len() == STDERR_LINES {
            self.stderr_tail.pop_front();
        }
        self.stderr_tail.push_back(kept);
    }

    /// Codex is gone: every waiter fails, later requests too, and [`Incoming`] says
    /// [`Message::Exited`], then ends.
    async fn end(&mut self) {
        let code = self.exit.and_then(|(code, _)| code);
        let status = match code {
            Some(c) if c < 0 => format!("was killed by signal {}", -c),
            Some(c) => format!("exited with status {c}"),
            None => "ended".to_string(),
        };
        let tail: Vec<String> = self.stderr_tail.iter().cloned().collect();
        let program = match self.shared.borrow().claude.is_some() {
            true => "claude",
            false => "codex app-server",
        };
        let mut message = format!("{program} {status}");
        if let Some(failure) = &self.failure {
            message.push_str(" because ");
            message.push_str(failure);
        }
        if let Some(last) = tail.last() {
            message.push_str("; its last stderr line: ");
            message.push_str(last);
        }
        let error = RpcError {
            code: RpcError::EXITED,
            message,
            data: Some(json!({"exit_code": code, "stderr_tail": tail})),
        };
        let waiters: Vec<_> = {
            let mut shared = self.shared.borrow_mut();
            shared.ended = Some(error.clone());
            shared.pending.drain().map(|(_, w)| w).collect()
        };
        for waiter in waiters {
            let _ = waiter.send(Err(error.clone()));
        }
        self.forward(Message::Exited {
            code,
            stderr_tail: tail,
        })
        .await;
        self.incoming.close_channel();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::agents::runtime::Runtime;
    use crate::testing::run;

    /// `PATH` with the pinned tools first (`scripts/tools --path`, which installs them
    /// when missing), as the integration tests have it.
    pub(crate) fn tools_path() -> String {
        static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        PATH.get_or_init(|| {
            let root = crate::testing::repo_root();
            let output = std::process::Command::new(root.join("scripts/tools"))
                .arg("--path")
                .output()
                .expect("run scripts/tools");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "scripts/tools could not install the pinned tools (codex among them):\n{stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let own = stdout.lines().last().unwrap_or_default().trim().to_string();
            format!("{own}:{}", std::env::var("PATH").unwrap_or_default())
        })
        .clone()
    }

    /// A home for one test's codex: `CODEX_HOME` whose only provider is a closed port
    /// on 127.0.0.1 (no test reaches a model provider), and a working directory.
    pub(crate) struct Home(pub PathBuf);

    impl Home {
        /// A stand-in for codex: the shell `script`, executable, in this home.
        fn fake_codex(&self, script: &str) -> PathBuf {
            let path = self.0.join("fake-codex");
            std::fs::write(&path, script).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            path
        }

        pub(crate) fn new(tag: &str) -> Home {
            Home::with_provider(tag, "http://127.0.0.1:9/v1")
        }

        /// A home whose provider is `base_url` (a stub on 127.0.0.1).
        pub(crate) fn with_provider(tag: &str, base_url: &str) -> Home {
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let root = std::env::temp_dir().join(format!(
                "abx-unit-codex-{tag}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ));
            std::fs::create_dir_all(root.join("codex")).unwrap();
            std::fs::create_dir_all(root.join("work")).unwrap();
            std::fs::write(
                root.join("codex/config.toml"),
                format!("model = \"stub-model\"\nmodel_provider = \"closed\"\n[model_providers.closed]\nname = \"closed\"\nbase_url = \"{base_url}\"\nwire_api = \"responses\"\nrequest_max_retries = 0\nstream_max_retries = 0\n"),
            )
            .unwrap();
            Home(root)
        }

        pub(crate) fn work(&self) -> PathBuf {
            self.0.join("work")
        }

        pub(crate) fn launch(&self) -> AppServerLaunch {
            let env: Vec<(OsString, OsString)> = vec![
                ("PATH".into(), tools_path().into()),
                ("HOME".into(), self.0.clone().into()),
                ("CODEX_HOME".into(), self.0.join("codex").into()),
            ];
            let program = Runtime::Codex.find_cli(&env).unwrap_or_else(|| {
                panic!(
                    "codex is not on the tools' PATH ({}): run scripts/tools, which installs the pinned @openai/codex into .tools/npm",
                    tools_path()
                )
            });
            let cwd = rustix::fs::open(
                self.work(),
                rustix::fs::OFlags::PATH
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
            AppServerLaunch {
                claude: None,
                program,
                args: Vec::new(),
                cwd,
                env,
            }
        }
    }

    impl Drop for Home {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    pub(crate) async fn started(home: &Home) -> (AppServer, Incoming) {
        let registry = Arc::new(ChildRegistry::default());
        AppServer::start(home.launch(), &registry, "agent_sandbox_test")
            .await
            .expect("codex app-server starts")
    }

    /// The next notification `method`, skipping others; panics after 30 s.
    async fn notification(incoming: &mut Incoming, method: &str) -> Value {
        let wait = async {
            loop {
                match incoming.next().await {
                    Some(Message::Notification { method: m, params }) if m == method => {
                        return params
                    }
                    Some(Message::Exited { code, stderr_tail }) => {
                        panic!("codex exited ({code:?}) before {method}: {stderr_tail:?}")
                    }
                    Some(_) => {}
                    None => panic!("no {method} before the end"),
                }
            }
        };
        monoio::time::timeout(Duration::from_secs(30), wait)
            .await
            .unwrap_or_else(|_| panic!("no {method} within 30 s"))
    }

    fn thread_params(home: &Home) -> Value {
        json!({"cwd": home.work(), "approvalPolicy": "never", "sandbox": "danger-full-access"})
    }

    /// Every process in `/proc` whose process group is `pgid` (zombies included).
    fn group_members(pgid: i32) -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|entry| {
                let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
                let state = fields.next()?;
                let pgrp: i32 = fields.nth(1)?.parse().ok()?;
                (pgrp == pgid).then(|| format!("{} ({state})", entry.file_name().to_string_lossy()))
            })
            .collect()
    }

    #[test]
    fn handshake_then_a_thread_starts() {
        let home = Home::new("start");
        run(async {
            let (server, mut incoming) = started(&home).await;
            // The handshake is done: a second one is refused.
            let again = server
                .request(
                    "initialize",
                    json!({"clientInfo": {"name": "x", "title": null, "version": "0"}}),
                )
                .await
                .unwrap_err();
            assert_eq!(again.code, RpcError::INVALID_REQUEST, "{again}");
            assert!(again.message.contains("Already initialized"), "{again}");
            let result = server
                .request("thread/start", thread_params(&home))
                .await
                .expect("thread/start");
            let thread = result["thread"]["id"]
                .as_str()
                .expect("a thread id")
                .to_string();
            assert_eq!(result["sandbox"]["type"], "dangerFullAccess", "{result}");
            let started = notification(&mut incoming, "thread/started").await;
            assert_eq!(started["thread"]["id"], thread.as_str());
            server.shutdown().await;
        });
    }

    #[test]
    fn concurrent_requests_each_get_their_answer() {
        let home = Home::new("concurrent");
        run(async {
            let (server, _incoming) = started(&home).await;
            let (a, b, c) = monoio::join!(
                server.request("thread/start", thread_params(&home)),
                server.request("config/read", json!({})),
                server.request("thread/start", thread_params(&home)),
            );
            let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
            assert!(a["thread"]["id"].is_string() && c["thread"]["id"].is_string());
            assert_ne!(
                a["thread"]["id"], c["thread"]["id"],
                "two threads, two answers"
            );
            assert_eq!(b["config"]["model_provider"], "closed", "{b}");
            server.shutdown().await;
        });
    }

    #[test]
    fn an_error_answer_is_an_rpc_error() {
        let home = Home::new("error");
        run(async {
            let (server, _incoming) = started(&home).await;
            let thread = server
                .request("thread/start", thread_params(&home))
                .await
                .unwrap();
            let refused = server
                .request(
                    "turn/steer",
                    json!({"threadId": thread["thread"]["id"], "expectedTurnId": "none",
                           "input": [{"type": "text", "text": "hi"}]}),
                )
                .await
                .unwrap_err();
            assert_eq!(refused.code, RpcError::INVALID_REQUEST, "{refused}");
            assert!(refused.message.contains("no active turn"), "{refused}");
            server.shutdown().await;
        });
    }

    #[test]
    fn a_killed_server_fails_what_waits_and_says_it_exited() {
        let home = Home::new("killed");
        run(async {
            let (server, mut incoming) = started(&home).await;
            let pgid = rustix::process::Pid::from_raw(server.pgid()).unwrap();
            // Stopped, codex cannot answer: the request is still pending when it dies.
            rustix::process::kill_process_group(pgid, rustix::process::Signal::STOP).unwrap();
            let request = server.request("thread/start", thread_params(&home));
            let kill = async {
                monoio::time::sleep(Duration::from_millis(200)).await;
                rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL).unwrap();
            };
            let (answer, ()) = monoio::join!(request, kill);
            let error = answer.unwrap_err();
            assert_eq!(error.code, RpcError::EXITED, "{error}");
            assert!(error.message.contains("killed by signal 9"), "{error}");
            let mut last = None;
            while let Some(message) = incoming.next().await {
                last = Some(message);
            }
            assert!(
                matches!(last, Some(Message::Exited { code: Some(-9), .. })),
                "{last:?}"
            );
            assert!(incoming.next().await.is_none(), "Exited comes once");
            let later = server.request("config/read", json!({})).await.unwrap_err();
            assert_eq!(later.code, RpcError::EXITED);
            server.shutdown().await;
        });
    }

    #[test]
    fn shutdown_leaves_no_process() {
        let home = Home::new("shutdown");
        run(async {
            let (server, mut incoming) = started(&home).await;
            server
                .request("thread/start", thread_params(&home))
                .await
                .unwrap();
            let pgid = server.pgid();
            assert!(
                !group_members(pgid).is_empty(),
                "codex runs in its own group {pgid}"
            );
            server.shutdown().await;
            assert_eq!(
                group_members(pgid),
                Vec::<String>::new(),
                "nothing of group {pgid} is left, not even a zombie (orphans are reaped by PID 1)"
            );
            let mut last = None;
            while let Some(message) = incoming.next().await {
                last = Some(message);
            }
            assert!(
                matches!(last, Some(Message::Exited { code: Some(0), .. })),
                "closing stdin ends codex cleanly: {last:?}"
            );
        });
    }

    /// A Responses API stub on 127.0.0.1: odd requests are answered with a call of
    /// `lookup_weather`, even ones with the text `done`; the request bodies are kept.
    pub(crate) fn serve_responses() -> (String, Arc<std::sync::Mutex<Vec<Value>>>) {
        use std::io::{BufRead, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let seen: Arc<std::sync::Mutex<Vec<Value>>> = Arc::default();
        let kept = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = std::io::BufReader::new(stream);
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':') {
                        if name.eq_ignore_ascii_case("content-length") {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let count = {
                    let mut seen = kept.lock().unwrap();
                    seen.push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                    seen.len()
                };
                let item = if count % 2 == 1 {
                    json!({"type": "function_call", "id": format!("fc_{count}"), "call_id": format!("call_{count}"),
                           "name": "lookup_weather", "arguments": "{\"city\":\"Paris\"}"})
                } else {
                    json!({"type": "message", "role": "assistant", "id": format!("msg_{count}"),
                           "content": [{"type": "output_text", "text": "done"}]})
                };
                let mut out = String::from("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n");
                for data in [
                    json!({"type": "response.created", "response": {"id": "r"}}),
                    json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
                    json!({"type": "response.completed", "response": {"id": "r", "usage": {
                        "input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                        "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}}),
                ] {
                    out.push_str(&format!(
                        "event: {}\ndata: {data}\n\n",
                        data["type"].as_str().unwrap()
                    ));
                }
                let mut stream = reader.into_inner();
                let _ = stream.write_all(out.as_bytes());
            }
        });
        (base, seen)
    }

    /// The output the model was given for its last call.
    fn last_tool_output(seen: &std::sync::Mutex<Vec<Value>>) -> Value {
        let seen = seen.lock().unwrap();
        let input = seen.last().unwrap()["input"].as_array().unwrap().clone();
        input
            .iter()
            .rfind(|i| i["type"] == "function_call_output")
            .map(|i| i["output"].clone())
            .unwrap_or_default()
    }

    #[test]
    fn a_server_request_is_answered_with_a_result_or_an_error() {
        let (base, seen) = serve_responses();
        let home = Home::with_provider("respond", &base);
        run(async {
            let (server, mut incoming) = started(&home).await;
            let tool = json!({"type": "function", "name": "lookup_weather", "description": "weather",
                              "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}}});
            let mut params = thread_params(&home);
            params["dynamicTools"] = json!([tool]);
            let thread = server.request("thread/start", params).await.unwrap();
            let thread = thread["thread"]["id"].clone();
            let answers = [
                Ok(
                    json!({"contentItems": [{"type": "inputText", "text": "sunny"}], "success": true}),
                ),
                Err(RpcError::new(
                    RpcError::INTERNAL_ERROR,
                    "the client went away",
                )),
            ];
            for answer in answers {
                let expect_ok = answer.is_ok();
                server
                    .request("turn/start", json!({"threadId": thread, "input": [{"type": "text", "text": "weather?"}]}))
                    .await
                    .unwrap();
                let mut answer = Some(answer);
                let status = loop {
                    let message = monoio::time::timeout(Duration::from_secs(60), incoming.next())
                        .await
                        .expect("the turn goes on")
                        .expect("codex runs");
                    match message {
                        Message::Request { id, method, params } => {
                            assert_eq!(method, "item/tool/call");
                            assert_eq!(params["tool"], "lookup_weather");
                            assert_eq!(params["arguments"], json!({"city": "Paris"}));
                            server.respond(id, answer.take().expect("one call per turn"));
                        }
                        Message::Notification { method, params } if method == "turn/completed" => {
                            break params["turn"]["status"].clone();
                        }
                        Message::Exited { stderr_tail, .. } => {
                            panic!("codex exited: {stderr_tail:?}")
                        }
                        Message::Notification { .. } => {}
                    }
                };
                assert_eq!(status, "completed");
                let output = last_tool_output(&seen);
                if expect_ok {
                    assert_eq!(output, "sunny", "the model got the result");
                } else {
                    assert!(
                        output.to_string().contains("failed"),
                        "the model was told: {output}"
                    );
                }
            }
            server.shutdown().await;
        });
    }

    /// A codex that stops answering: a request gives up after the timeout (120 s in
    /// service, shortened here) instead of holding its caller, and the next one too.
    #[test]
    fn a_request_codex_never_answers_times_out() {
        let home = Home::new("silent");
        let script = home.fake_codex(
            "#!/bin/sh\nread line\nprintf '{\"id\":0,\"result\":{}}\\n'\nexec cat > /dev/null\n",
        );
        run(async {
            let mut launch = home.launch();
            launch.program = script.clone();
            let registry = Arc::new(ChildRegistry::default());
            let (mut server, _incoming) = AppServer::start(launch, &registry, "t").await.unwrap();
            server.request_timeout = Duration::from_millis(300);
            let started = std::time::Instant::now();
            let error = server.request("thread/start", json!({})).await.unwrap_err();
            assert_eq!(error.code, RpcError::TIMED_OUT, "{}", error.message);
            assert!(error.message.contains("thread/start"), "{}", error.message);
            assert!(started.elapsed() < Duration::from_secs(5));
            let again = server.request("turn/start", json!({})).await.unwrap_err();
            assert_eq!(again.code, RpcError::TIMED_OUT);
            server.shutdown().await;
        });
    }

    /// A stand-in for codex (a shell script) that answers the handshake, then prints a
    /// line that is not JSON, a notification written in two pieces, a complaint on
    /// stderr and a line longer than [`MAX_LINE`].
    #[test]
    fn framing_skips_what_is_not_json_and_refuses_an_endless_line() {
        let home = Home::new("framing");
        let script = home.fake_codex(&format!(
                "#!/bin/sh\nread line\nprintf '{{\"id\":0,\"result\":{{}}}}\\n'\nread line\n\
                 printf 'not json\\n{{\"method\":\"a/b\",\"params\":{{\"x\":1}}}}\\n'\n\
                 printf '{{\"method\":\"c/d\",'; sleep 0.2; printf '\"params\":{{\"y\":2}}}}\\n'\n\
                 echo 'fake complaint' >&2\nsleep 0.2\nhead -c {} /dev/zero | tr '\\000' a\nsleep 30\n",
            MAX_LINE + 1024
        ));
        run(async {
            let mut launch = home.launch();
            launch.program = script.clone();
            let registry = Arc::new(ChildRegistry::default());
            let (server, mut incoming) = AppServer::start(launch, &registry, "t").await.unwrap();
            let mut seen = Vec::new();
            while let Some(message) = incoming.next().await {
                seen.push(message);
            }
            assert_eq!(
                seen[..2],
                [
                    Message::Notification {
                        method: "a/b".into(),
                        params: json!({"x": 1})
                    },
                    Message::Notification {
                        method: "c/d".into(),
                        params: json!({"y": 2})
                    },
                ]
            );
            let Some(Message::Exited { code, stderr_tail }) = seen.last() else {
                panic!("{seen:?}")
            };
            assert_eq!(
                (*code, seen.len()),
                (Some(-9), 3),
                "killed for the endless line: {seen:?}"
            );
            assert_eq!(stderr_tail, &["fake complaint".to_string()]);
            let error = server.request("x", json!({})).await.unwrap_err();
            assert_eq!(error.code, RpcError::EXITED);
            assert!(error.message.contains("a line over 64 MiB"), "{error}");
            assert!(error.message.contains("fake complaint"), "{error}");
            assert_eq!(error.data.as_ref().unwrap()["exit_code"], -9);
            server.shutdown().await;
        });
    }

    #[test]
    fn what_crosses_threads_is_send() {
        fn send<T: Send>() {}
        send::<Incoming>();
        send::<Message>();
        send::<RpcError>();
    }

    #[test]
    fn a_missing_program_fails_to_start() {
        let home = Home::new("missing");
        run(async {
            let mut launch = home.launch();
            launch.program = home.0.join("no-such-codex");
            let registry = Arc::new(ChildRegistry::default());
            let error = AppServer::start(launch, &registry, "t")
                .await
                .err()
                .unwrap();
            assert_eq!(error.kind(), io::ErrorKind::NotFound, "{error}");
        });
    }
}
