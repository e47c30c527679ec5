//! Graceful shutdown: SIGTERM/SIGINT stop the listeners, in-flight requests get a bounded
//! grace period, child process groups are ended, then the process exits.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};

/// Shared shutdown flag, in-flight request count, and duplicates of the listening sockets
/// (duplicates, so shutting them down can never hit an fd number a worker has reused).
#[derive(Default)]
pub struct Shutdown {
    flag: AtomicBool,
    in_flight: AtomicUsize,
    listeners: Mutex<Vec<OwnedFd>>,
}

/// Counts one request as in flight until dropped.
pub struct InFlight(Arc<Shutdown>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shutdown {
    pub fn is_shutting_down(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    pub fn request_started(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
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

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (and so in every thread it
/// spawns later) so that they wait for [`handle_signals`].
pub fn block_termination_signals() {
    let _ = handled_signals().thread_block();
}

fn handled_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.add(Signal::SIGHUP);
    set
}

/// Handles the server's signals on the calling thread (the main thread, once the
/// workers run: a thread of its own would cost start-up a thread's creation), and
/// never returns: SIGHUP runs `on_hangup` (the policy reload) and waits again;
/// SIGTERM/SIGINT stop accepting, give in-flight requests up to `grace`, run
/// `before_exit` (which ends the children) and exit 0.
pub fn handle_signals(
    shutdown: Arc<Shutdown>,
    grace: Duration,
    on_hangup: Box<dyn Fn()>,
    before_exit: Box<dyn FnOnce()>,
) -> ! {
    let set = handled_signals();
    let signal = loop {
        match set.wait() {
            Ok(Signal::SIGHUP) => on_hangup(),
            Ok(signal) => break signal,
            Err(_) => break Signal::SIGTERM,
        }
    };
    crate::log!("{signal} received, shutting down");
    shutdown.begin();
    let deadline = Instant::now() + grace;
    while shutdown.in_flight() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left = shutdown.in_flight();
    if left > 0 {
        crate::log!("{left} request(s) still running after the grace period; exiting");
    }
    before_exit();
    crate::log!("stopped");
    std::process::exit(0);
}

/// Per-worker notice that the server is draining, for streams that would otherwise
/// wait for their next event until the grace period runs out. A worker's accept loop
/// raises it when shutdown stops the listener; every open stream on that worker is
/// woken at once, with no polling.
mod local_drain {
    use std::cell::RefCell;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    #[derive(Default)]
    struct State {
        raised: bool,
        /// One waker slot per waiting future; freed slots are reused.
        wakers: Vec<Option<Waker>>,
        free: Vec<usize>,
    }

    thread_local! {
        static STATE: RefCell<State> = RefCell::new(State::default());
    }

    pub fn raise() {
        let wakers: Vec<Waker> = STATE.with(|s| {
            let mut s = s.borrow_mut();
            s.raised = true;
            s.wakers.iter_mut().filter_map(Option::take).collect()
        });
        for waker in wakers {
            waker.wake();
        }
    }

    /// Resolves once this worker drains.
    #[derive(Default)]
    pub struct Drained {
        slot: Option<usize>,
    }

    impl Drained {
        pub fn new() -> Drained {
            Drained { slot: None }
        }
    }

    impl Future for Drained {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            STATE.with(|s| {
                let mut s = s.borrow_mut();
                if s.raised {
                    return Poll::Ready(());
                }
                // Re-polls replace this future's waker instead of adding one, so a
                // stream that runs for hours registers once.
                let slot = match self.slot {
                    Some(slot) => slot,
                    None => {
                        let slot = match s.free.pop() {
                            Some(slot) => slot,
                            None => {
                                s.wakers.push(None);
                                s.wakers.len() - 1
                            }
                        };
                        self.slot = Some(slot);
                        slot
                    }
                };
                s.wakers[slot] = Some(cx.waker().clone());
                Poll::Pending
            })
        }
    }

    impl Drop for Drained {
        fn drop(&mut self) {
            if let Some(slot) = self.slot {
                let _ = STATE.try_with(|s| {
                    let mut s = s.borrow_mut();
                    s.wakers[slot] = None;
                    s.free.push(slot);
                });
            }
        }
    }
}

/// Marks the calling worker as draining and wakes every [`Drained`] future on it.
pub fn raise_local_drain() {
    local_drain::raise();
}

pub use local_drain::Drained;
