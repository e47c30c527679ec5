//! Graceful shutdown: SIGTERM/SIGINT stop the listeners, in-flight requests get a bounded
//! grace period, child process groups are ended, then the process exits.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};

use crate::state::AppState;

/// Shared shutdown flag, in-flight request count, and duplicates of the listening sockets
/// (duplicates, so shutting them down can never hit an fd number a worker has reused).
#[derive(Default)]
pub struct Shutdown {
    flag: AtomicBool,
    in_flight: AtomicUsize,
    listeners: Mutex<Vec<OwnedFd>>,
}

/// Counts one request as in flight until dropped.
pub struct InFlight<'a>(&'a Shutdown);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shutdown {
    pub fn is_shutting_down(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    pub fn request_started(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Remembers a listening socket so shutdown can stop its accept loop.
    pub fn track_listener(&self, fd: OwnedFd) {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(fd);
    }

    /// Sets the flag and wakes every accept loop: `shutdown(SHUT_RD)` on a listening
    /// socket makes pending and future accepts fail, under epoll and io_uring alike.
    pub fn begin(&self) {
        self.flag.store(true, Ordering::Release);
        for fd in self
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Read);
        }
    }
}

/// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread it spawns
/// later) so that only the dedicated signal thread receives them.
pub fn block_termination_signals() {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    let _ = set.thread_block();
}

/// Starts the thread that waits for SIGTERM/SIGINT and performs the shutdown.
pub fn spawn_signal_thread(shutdown: Arc<Shutdown>, state: Arc<AppState>) {
    std::thread::Builder::new()
        .name("abx-signals".into())
        .spawn(move || {
            let mut set = SigSet::empty();
            set.add(Signal::SIGTERM);
            set.add(Signal::SIGINT);
            let signal = set.wait().unwrap_or(Signal::SIGTERM);
            eprintln!("agent-sandbox: {signal} received, shutting down");
            shutdown.begin();
            let deadline = Instant::now() + state.config.shutdown_grace;
            while shutdown.in_flight() > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let left = shutdown.in_flight();
            if left > 0 {
                eprintln!("agent-sandbox: {left} request(s) still running after the grace period; exiting");
            }
            let groups = state.children.signal_all(Signal::SIGTERM);
            if groups > 0 {
                std::thread::sleep(Duration::from_millis(200));
                state.children.signal_all(Signal::SIGKILL);
            }
            eprintln!("agent-sandbox: stopped");
            std::process::exit(0);
        })
        .expect("spawn signal thread");
}
