//! The Python bridge: an unchanged `commands.py` keeps its functions as the
//! implementations while this server is the HTTP plane.
//!
//! `python3 commands.py` registers commands and routes, then calls `start(9000)`. The
//! `agent_sandbox` package's `start` execs this binary in the same process (same pid, so
//! the server is still the container's main process) with `ABX_PYTHON_APP` naming the
//! interpreter and script. The server then starts the script again as its **worker**
//! (a child in its own process group), with `ABX_BRIDGE_FDS` naming inherited sockets:
//!
//! - fd 3, the **control** socket: the worker's first line is its manifest (commands,
//!   routes, group switches); afterwards the supervisor thread pings once a second and
//!   the worker answers. A worker that stops answering for `ABX_BRIDGE_HANG_TIMEOUT`
//!   seconds is killed and restarted.
//! - fds 4.., one **call** socket per server worker thread: JSON lines carrying calls
//!   and their answers, many in flight at once, matched by id (the Python side runs
//!   each call on its own thread, as the reference's `ThreadingHTTPServer` does).
//!
//! The wire format is in `docs/python-bridge.md`. A worker that dies or hangs fails the
//! calls in flight with a 500 and is started again; calls that arrive meanwhile wait for
//! it. The route table and command registry come from the first manifest and stay
//! frozen; a restarted worker's manifest is compared with it and a difference is logged.

pub mod link;
pub mod manifest;
mod supervisor;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

pub use manifest::Manifest;

use crate::process::output::Notify;
use crate::process::ChildRegistry;

/// The Python program to run as the worker: the interpreter, its arguments (the script
/// and whatever followed it), and the directory it was started in.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct PythonApp {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
}

impl PythonApp {
    /// Reads `ABX_PYTHON_APP` (JSON `{"argv": [...], "cwd": "..."}`), as `start` sets it.
    pub fn from_env_value(text: &str) -> Result<PythonApp, String> {
        let app: PythonApp = serde_json::from_str(text).map_err(|e| {
            format!("ABX_PYTHON_APP must be JSON {{\"argv\": [...], \"cwd\": \"...\"}} as agent_sandbox.start writes it: {e}")
        })?;
        if app.argv.is_empty() {
            return Err("ABX_PYTHON_APP: argv is empty".into());
        }
        Ok(app)
    }
}

/// Why a call through the bridge has no answer.
#[derive(Debug, Clone, PartialEq)]
pub enum BridgeError {
    /// The worker died or was killed while the call was in flight.
    Lost(String),
    /// No worker came up in time.
    Unavailable(String),
    /// The worker answered something that is not the protocol.
    Protocol(String),
}

impl std::fmt::Display for BridgeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BridgeError::Lost(why) | BridgeError::Unavailable(why) | BridgeError::Protocol(why) => {
                f.write_str(why)
            }
        }
    }
}

/// Settings of the bridge.
#[derive(Clone, Debug)]
pub struct BridgeOptions {
    /// Call sockets to hand out: one per server worker thread.
    pub links: usize,
    /// How long the worker may leave a ping unanswered before it is killed.
    pub hang_timeout: Duration,
    /// How long the first manifest may take (the script's imports).
    pub startup_timeout: Duration,
}

/// The bridge shared by every thread: the supervisor fills `pool` with the current
/// worker's call sockets; each server worker takes one.
pub struct Bridge {
    pool: Mutex<Pool>,
    /// Bumped whenever a new worker's sockets are in the pool, or a worker is gone.
    changed: Notify,
    stopping: AtomicBool,
    restarts: AtomicU64,
    /// A generation a server worker found broken: the supervisor ends it at its next
    /// ping round (it alone kills and reaps its worker, so no pid is ever reused
    /// under it).
    restart_requested: AtomicU64,
}

struct Pool {
    /// Increases with every worker started.
    generation: u64,
    /// Whether that worker is still answering.
    alive: bool,
    sockets: Vec<OwnedFd>,
    /// Why the last worker ended, for the errors of calls that were in flight; written
    /// under the same lock as `alive`, so whoever sees it gone sees why.
    last_exit: String,
}

impl Bridge {
    /// Starts the worker, waits for its manifest, and leaves a supervisor thread
    /// watching it. Errors are one line for stderr (the server does not start).
    pub fn start(
        app: PythonApp,
        options: BridgeOptions,
        children: Arc<ChildRegistry>,
    ) -> Result<(Arc<Bridge>, Manifest), String> {
        let bridge = Arc::new(Bridge {
            pool: Mutex::new(Pool {
                generation: 0,
                alive: false,
                sockets: Vec::new(),
                last_exit: String::new(),
            }),
            changed: Notify::default(),
            stopping: AtomicBool::new(false),
            restarts: AtomicU64::new(0),
            restart_requested: AtomicU64::new(0),
        });
        let manifest = supervisor::start(bridge.clone(), app, options, children)?;
        Ok((bridge, manifest))
    }

    /// Stops restarting the worker (shutdown; the child registry ends the worker).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.retire(0, "the server is shutting down".into());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts a new worker's call sockets in the pool; returns its generation.
    fn publish(&self, sockets: Vec<OwnedFd>) -> u64 {
        let generation = {
            let mut pool = self.lock();
            pool.generation += 1;
            pool.alive = true;
            pool.sockets = sockets;
            pool.generation
        };
        self.changed.notify();
        generation
    }

    /// Asks for worker `generation` to be ended because its protocol broke (a server
    /// worker found no socket left, or read garbage); the supervisor then starts a
    /// fresh one.
    fn restart(&self, generation: u64, why: &str) {
        if self.live_generation() == Some(generation)
            && self.restart_requested.swap(generation, Ordering::SeqCst) != generation
        {
            crate::log!("restarting the Python worker: {why}");
        }
    }

    /// Whether a restart of `generation` was asked for.
    fn restart_requested(&self, generation: u64) -> bool {
        self.restart_requested.load(Ordering::SeqCst) == generation
    }

    /// Marks worker `generation` (0: whichever is current) as gone, with the reason.
    fn retire(&self, generation: u64, why: String) {
        {
            let mut pool = self.lock();
            if generation != 0 && pool.generation != generation {
                return;
            }
            pool.alive = false;
            pool.sockets.clear();
            pool.last_exit = why;
        }
        self.changed.notify();
    }

    /// The current worker's generation, if it is alive.
    fn live_generation(&self) -> Option<u64> {
        let pool = self.lock();
        pool.alive.then_some(pool.generation)
    }

    /// Takes a call socket of the current worker, with its generation.
    fn take_socket(&self) -> Option<(u64, OwnedFd)> {
        let mut pool = self.lock();
        if !pool.alive {
            return None;
        }
        let generation = pool.generation;
        pool.sockets.pop().map(|fd| (generation, fd))
    }

    fn last_exit(&self) -> String {
        self.lock().last_exit.clone()
    }
}
