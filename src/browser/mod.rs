//! The browser: one shared headless Chromium page, driven over the DevTools Protocol.
//!
//! A browser actor on a thread of its own owns Chromium and the pipe to it, and runs
//! one operation at a time; requests reach it over a bounded queue (a full queue is
//! refused at once rather than waited on) and its answers come back to the monoio
//! worker through a oneshot channel, so a worker never blocks on the browser and other
//! routes stay fast while the page is busy. Chromium starts with the first operation
//! (an idle server runs none), runs in its own process group on a temporary profile,
//! and is started again by the next operation after it exits or crashes.

pub mod cdp;
pub mod guard;
pub mod keys;
mod op;
mod page;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use serde_json::{json, Value};

pub use op::{
    paper_size, BrowserError, ElementState, HistoryStep, MouseButton, Op, WaitUntil, VIEWPORT,
};
use page::Chromium;
pub use page::INSTALL_HINT;

use crate::process::ChildRegistry;

/// Operations that may wait for the page at once; one more is refused with 429.
pub const QUEUE_DEPTH: usize = 32;
/// How often an idle actor reads what Chromium sent meanwhile.
const IDLE_DRAIN: Duration = Duration::from_millis(250);

/// What a route hands the actor.
struct Job {
    op: Op,
    timeout: Duration,
    /// The environment Chromium starts with, if this job starts it.
    env: Arc<Vec<(OsString, OsString)>>,
    reply: oneshot::Sender<Result<Value, BrowserError>>,
    /// Raised when the caller stops waiting.
    abandoned: Arc<AtomicBool>,
}

/// An operation's answer to come. Dropping it unanswered (the client disconnected)
/// tells the actor, which stops the operation at its next wait.
pub struct Pending {
    answer: oneshot::Receiver<Result<Value, BrowserError>>,
    abandoned: Arc<AtomicBool>,
    answered: bool,
}

impl Pending {
    /// The operation's result.
    pub async fn wait(mut self) -> Result<Value, BrowserError> {
        let result = (&mut self.answer).await;
        self.answered = true;
        result.unwrap_or_else(|_| {
            Err(BrowserError::Protocol(
                "the browser actor dropped the operation".into(),
            ))
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.answered {
            self.abandoned.store(true, Ordering::Relaxed);
        }
    }
}

/// The pid and temporary directory of the running Chromium, for the shutdown path,
/// which runs on the main thread (it handles signals) while the actor may be
/// mid-operation.
type Live = Arc<Mutex<Option<(i32, PathBuf)>>>;

/// The handle routes use; shared by every worker.
pub struct Browser {
    queue: Mutex<Option<SyncSender<Job>>>,
    executable: Option<PathBuf>,
    children: Arc<ChildRegistry>,
    live: Live,
}

impl Browser {
    /// A browser that will use `executable` (`ABX_BROWSER_PATH`) or find Chromium on
    /// `PATH`, registering its process group in `children`. Starts nothing yet.
    pub fn new(executable: Option<PathBuf>, children: Arc<ChildRegistry>) -> Browser {
        Browser {
            queue: Mutex::new(None),
            executable,
            children,
            live: Arc::default(),
        }
    }

    /// Queues `op` for the page and returns where its answer will arrive. Never blocks:
    /// a full queue is [`BrowserError::Busy`].
    pub fn submit(
        &self,
        op: Op,
        timeout: Duration,
        env: Arc<Vec<(OsString, OsString)>>,
    ) -> Result<Pending, BrowserError> {
        let (reply, answer) = oneshot::channel();
        let abandoned = Arc::new(AtomicBool::new(false));
        let mut job = Job {
            op,
            timeout,
            env,
            reply,
            abandoned: abandoned.clone(),
        };
        let pending = Pending {
            answer,
            abandoned,
            answered: false,
        };
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        // Twice at most: a dead actor (its thread could not be spawned, or it ended)
        // is replaced once.
        for _ in 0..2 {
            let sender = match &*queue {
                Some(sender) => sender.clone(),
                None => {
                    let sender = self.start_actor()?;
                    *queue = Some(sender.clone());
                    sender
                }
            };
            match sender.try_send(job) {
                Ok(()) => return Ok(pending),
                Err(TrySendError::Full(_)) => return Err(BrowserError::Busy(QUEUE_DEPTH)),
                Err(TrySendError::Disconnected(returned)) => {
                    job = returned;
                    *queue = None;
                }
            }
        }
        Err(BrowserError::Protocol(
            "the browser actor could not be started".into(),
        ))
    }

    fn start_actor(&self) -> Result<SyncSender<Job>, BrowserError> {
        let (sender, receiver) = sync_channel(QUEUE_DEPTH);
        let executable = self.executable.clone();
        let children = self.children.clone();
        let live = self.live.clone();
        std::thread::Builder::new()
            .name("abx-browser".into())
            .spawn(move || actor(receiver, executable, children, live))
            .map_err(|e| BrowserError::Protocol(format!("cannot start the browser thread: {e}")))?;
        Ok(sender)
    }

    /// Ends Chromium at server shutdown (its group is killed and its profile removed).
    pub fn stop(&self) {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((pid, dir)) = live {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn actor(
    jobs: Receiver<Job>,
    executable: Option<PathBuf>,
    children: Arc<ChildRegistry>,
    live: Live,
) {
    let mut chromium: Option<Chromium> = None;
    loop {
        let job = match jobs.recv_timeout(IDLE_DRAIN) {
            Ok(job) => job,
            Err(RecvTimeoutError::Timeout) => {
                // Events of a page that keeps working must not pile up in the pipe.
                if let Some(page) = chromium.as_mut() {
                    page.drain();
                    if page.broken || !page.alive() {
                        chromium = None;
                        *live.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    }
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        // The client left while the job waited: nothing to do for it.
        if job.reply.is_canceled() {
            continue;
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(
                &mut chromium,
                &Launcher {
                    executable: &executable,
                    children: &children,
                    live: &live,
                },
                job.op,
                job.timeout,
                &job.env,
                &job.abandoned,
            )
        }));
        let result = outcome.unwrap_or_else(|_| {
            chromium = None;
            Err(BrowserError::Protocol(
                "the browser operation failed unexpectedly; Chromium will be started again".into(),
            ))
        });
        if chromium.is_none() {
            *live.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        let _ = job.reply.send(result);
    }
}

/// What starting a Chromium needs.
struct Launcher<'a> {
    executable: &'a Option<PathBuf>,
    children: &'a Arc<ChildRegistry>,
    live: &'a Live,
}

fn run(
    chromium: &mut Option<Chromium>,
    launcher: &Launcher<'_>,
    op: Op,
    timeout: Duration,
    env: &[(OsString, OsString)],
    abandoned: &Arc<AtomicBool>,
) -> Result<Value, BrowserError> {
    if chromium.as_mut().is_some_and(|c| !c.alive()) {
        *chromium = None;
    }
    match op {
        Op::Info => {
            return Ok(match chromium {
                Some(c) => c.info(),
                None => json!({
                    "running": false, "url": null, "title": null, "version": null,
                    "viewport": {"width": VIEWPORT.0, "height": VIEWPORT.1}, "pid": null,
                }),
            })
        }
        Op::Close => {
            let was_running = chromium.take().is_some();
            return Ok(json!({"closed": was_running}));
        }
        // Nothing was logged by a browser that is not running: not a reason to start one.
        Op::Console if chromium.is_none() => return Ok(json!({"logs": []})),
        _ => {}
    }
    if chromium.is_none() {
        let started = Chromium::launch(launcher.executable.as_deref(), env, launcher.children)?;
        *launcher.live.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((started.pid(), started.dir().to_path_buf()));
        *chromium = Some(started);
    }
    let Some(page) = chromium.as_mut() else {
        return Err(BrowserError::Protocol("Chromium is not running".into()));
    };
    page.abandoned = abandoned.clone();
    // The caller's timeout starts once Chromium is up: a cold start is not its cost.
    let deadline = Instant::now() + timeout;
    let result = page.run(op, deadline);
    if matches!(result, Err(BrowserError::Timeout)) {
        page.interrupt();
    }
    if page.broken {
        *chromium = None;
    }
    result
}
