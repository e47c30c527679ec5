//! Threads, listeners and the choice of I/O driver. One OS thread per worker, each
//! running its own monoio runtime and accepting on its own `SO_REUSEPORT` sockets, so the
//! kernel spreads connections across cores and no connection ever changes thread. The
//! accept loop is generic over the HTTP [`Service`](crate::http::Service), so a worker
//! can serve several listeners (the API port and the PTY WebSocket port) with one
//! service each.

pub mod blocking;
pub mod driver;
pub mod file;
pub mod memory;
pub mod ready;
pub mod shutdown;

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use std::os::fd::AsRawFd;

use monoio::net::{TcpListener, TcpStream};
use socket2::{Domain, Protocol, Socket, Type};

use crate::http::Service;
use blocking::BlockingPool;
use shutdown::Shutdown;

pub use driver::{choose_driver, DriverChoice, IoDriver};
pub use file::{blocking, push_base64, AsyncFile, Base64FileStream, FileStream};

/// Binds `addr` with `SO_REUSEPORT` (and `SO_REUSEADDR`), non-blocking, ready for monoio.
pub fn bind_reuseport(addr: SocketAddr) -> io::Result<StdListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Proves that no other process listens on `addr`'s port before this server makes its own
/// `SO_REUSEPORT` group there. `SO_REUSEPORT` lets any process of the same user join a
/// port, and the kernel then splits connections between the two servers; a bind without
/// it conflicts with every listener on the port (while `SO_REUSEADDR` still ignores a
/// previous run's `TIME_WAIT` connections), so it fails exactly when another server holds
/// the port. The probe is closed before the real listeners bind: two servers started in
/// the same instant can still both pass it.
fn ensure_port_free(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    probe.set_reuse_address(true)?;
    if addr.is_ipv6() {
        probe.set_only_v6(false)?;
    }
    match probe.bind(&addr.into()) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "port {} is already in use (another agent-sandbox or another program listens there); stop it or choose another port",
                addr.port()
            ),
        )),
        other => other,
    }
}

/// Binds one listener per worker on the same port, once no other process listens there
/// (see `ensure_port_free`). With port 0 the first bind picks the port and the others
/// reuse it.
pub fn bind_all(addr: SocketAddr, workers: usize) -> io::Result<(Vec<StdListener>, SocketAddr)> {
    ensure_port_free(addr)?;
    let first = bind_reuseport(addr)?;
    let bound = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..workers {
        listeners.push(bind_reuseport(bound)?);
    }
    Ok((listeners, bound))
}

/// One worker's sockets, each with the slot number its service is made for.
pub type WorkerListeners = Vec<(usize, StdListener)>;

/// Starts one worker thread per entry of `listeners`. Each worker calls `make_service`
/// once per listener slot, on its own thread, and serves that listener with it until
/// the process exits.
pub fn start_workers<S, F>(
    listeners: Vec<WorkerListeners>,
    driver: IoDriver,
    shutdown: Arc<Shutdown>,
    pool: BlockingPool,
    make_service: Arc<F>,
) -> io::Result<()>
where
    S: Service,
    F: Fn(usize) -> S + Send + Sync + 'static,
{
    let workers = listeners.len();
    let (armed, arming) = std::sync::mpsc::sync_channel(workers);
    for (index, sockets) in listeners.into_iter().enumerate() {
        for (_, listener) in &sockets {
            shutdown.track_listener(listener.as_fd().try_clone_to_owned()?);
        }
        let shutdown = shutdown.clone();
        let pool = pool.clone();
        let make_service = make_service.clone();
        let armed = armed.clone();
        std::thread::Builder::new()
            .name(format!("abx-worker-{index}"))
            .spawn(move || {
                let run = || run_worker(sockets, driver, shutdown, pool, make_service, armed);
                // A worker serves until the process exits. One that ends anyway (a panic
                // outside every handler) takes the server down rather than leave its
                // listener unserved.
                let why = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
                    Ok(()) => "its runtime returned",
                    Err(_) => "it panicked",
                };
                crate::log!("worker {index} stopped ({why}); exiting");
                std::process::exit(1);
            })?;
    }
    // Threads the caller starts next (the groups' background work, the trimmer) would
    // otherwise preempt a worker still setting up its ring: on a server pinned to one
    // CPU, three thread starts put 0.25 ms on the way to the first answer
    // (docs/benchmarks.md, "Memory, start and size"). A worker that never reports is
    // not waited for past a second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    for _ in 0..workers {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if arming.recv_timeout(left).is_err() {
            break;
        }
    }
    Ok(())
}

thread_local! {
    static ON_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Lets every other ready task on this worker run once before continuing (monoio has
/// no scheduling budget, so a loop whose I/O never waits must step aside itself).
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

/// Whether the calling thread is a worker running its monoio runtime, where tasks may
/// be spawned (code that also runs in plain threads, such as `Drop`, asks first).
pub fn on_worker() -> bool {
    ON_WORKER.with(|flag| flag.get())
}

fn run_worker<S, F>(
    sockets: WorkerListeners,
    driver: IoDriver,
    shutdown: Arc<Shutdown>,
    pool: BlockingPool,
    make_service: Arc<F>,
    armed: std::sync::mpsc::SyncSender<()>,
) where
    S: Service,
    F: Fn(usize) -> S + Send + Sync + 'static,
{
    let serve = async move {
        for (slot, listener) in sockets {
            let service = Rc::new(make_service(slot));
            monoio::spawn(accept_loop(listener, service, shutdown.clone(), driver));
        }
        monoio::spawn(crate::http::chunks::release_unused());
        // The accept loops ran once (monoio submits their operations between rounds):
        // the listeners are armed.
        yield_now().await;
        let _ = armed.send(());
        drop(armed);
        // Connections already accepted keep being served until the main thread, handling
        // a signal, exits the process; this future never returns so the runtime keeps
        // polling them.
        std::future::pending::<()>().await;
    };
    if let Err(e) = block_on(driver, pool, serve) {
        crate::log!("worker could not start its {} runtime: {e}", driver.name());
        std::process::exit(1);
    }
}

/// Runs `future` to its end on this thread's own runtime, built as a worker's is (the
/// driver, timers, `pool` for blocking work) with the thread counted as a worker
/// meanwhile: what handlers need to run, with or without a listener (the workers
/// themselves, and unit tests driving the dispatcher in-process).
pub fn block_on<F: std::future::Future>(
    driver: IoDriver,
    pool: BlockingPool,
    future: F,
) -> io::Result<F::Output> {
    // Cleared before the runtime (and any task left on it) is dropped: a `Drop` that
    // asks must not spawn onto a runtime that is going away.
    struct Worker;
    impl Drop for Worker {
        fn drop(&mut self) {
            ON_WORKER.with(|flag| flag.set(false));
        }
    }
    let future = async move {
        ON_WORKER.with(|flag| flag.set(true));
        let _worker = Worker;
        future.await
    };
    match driver {
        IoDriver::IoUring => {
            let build = |ring: io_uring::Builder| {
                monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
                    .with_entries(1024)
                    .uring_builder(ring)
                    .enable_timer()
                    .attach_thread_pool(Box::new(pool.clone()))
                    .build()
            };
            // Kernels before 5.19 refuse the flags: a plain ring there.
            build(ring_setup())
                .or_else(|_| build(io_uring::IoUring::builder()))
                .map(|mut rt| rt.block_on(future))
        }
        IoDriver::Epoll => monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .attach_thread_pool(Box::new(pool))
            .build()
            .map(|mut rt| rt.block_on(future)),
    }
}

/// The worker's ring. `COOP_TASKRUN` (5.19+) lets the kernel run a completion's task
/// work when the worker next enters it (monoio enters on every loop turn) instead of
/// interrupting the worker with an IPI per completion: /health at 64 connections goes
/// from 0.75x to about 1.05x nginx. `DEFER_TASKRUN` measured no better and worse at one
/// connection (`docs/architecture.md`).
fn ring_setup() -> io_uring::Builder {
    let mut ring = io_uring::IoUring::builder();
    ring.setup_coop_taskrun().setup_taskrun_flag();
    ring
}

/// A descriptor held in reserve so that an accept failing with EMFILE or ENFILE can
/// still take the connection and answer it: without it, connections past the
/// descriptor limit sat in the listen backlog unanswered, and a client without a
/// timeout waited forever. Each accept loop holds one. It is a duplicate of the
/// listener (any open file would do; this one needs no path and lives exactly as long
/// as the loop).
struct Reserve(Option<std::os::fd::OwnedFd>);

/// What shedding one connection did.
enum Shed {
    /// A connection was taken, answered 503 and closed; there may be more.
    Answered,
    /// No connection was waiting (the accept failed only for want of a descriptor).
    Empty,
    /// No reserve to free (not yet taken back, because descriptors are still short).
    NoReserve,
}

impl Reserve {
    fn take(listener: std::os::fd::BorrowedFd<'_>) -> Reserve {
        Reserve(rustix::io::fcntl_dupfd_cloexec(listener, 0).ok())
    }

    /// Frees the reserve, accepts one connection with it, answers `unavailable`, then
    /// turns the connection's descriptor back into the reserve with `dup3`, which
    /// closes the connection and takes its number in one step: the slot is never free
    /// for another thread to take (or for a count of open descriptors to see). Every
    /// call is non-blocking: the socket's pending bytes are read and dropped first, so
    /// that closing sends a FIN rather than a reset that could destroy the answer.
    fn shed<S: Service>(&mut self, listener: std::os::fd::BorrowedFd<'_>, service: &S) -> Shed {
        use rustix::net::{RecvFlags, SendFlags, SocketFlags};
        if self.0.is_none() {
            *self = Reserve::take(listener);
            return Shed::NoReserve;
        }
        self.0 = None;
        let accepted =
            rustix::net::accept_with(listener, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK);
        let mut socket = match accepted {
            Ok(socket) => socket,
            Err(_) => {
                *self = Reserve::take(listener);
                return Shed::Empty;
            }
        };
        let mut sink = [0u8; 4096];
        for _ in 0..16 {
            match rustix::net::recv(&socket, &mut sink, RecvFlags::DONTWAIT) {
                Ok((n, _)) if n > 0 => {}
                _ => break,
            }
        }
        let answer = crate::http::conn::encode_closing(service.unavailable());
        let _ = rustix::net::send(&socket, &answer, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
        let _ = rustix::net::shutdown(&socket, rustix::net::Shutdown::Write);
        *self = match rustix::io::dup3(listener, &mut socket, rustix::io::DupFlags::CLOEXEC) {
            Ok(()) => Reserve(Some(socket)),
            Err(_) => {
                drop(socket);
                Reserve::take(listener)
            }
        };
        note_shed();
        Shed::Answered
    }
}

/// Logs turned-away connections at most once every ten seconds (a flood of them must not
/// become a flood of log lines).
fn note_shed() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SHED: AtomicU64 = AtomicU64::new(0);
    static LOGGED_AT: AtomicU64 = AtomicU64::new(0);
    let count = SHED.fetch_add(1, Ordering::Relaxed) + 1;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LOGGED_AT.load(Ordering::Relaxed);
    if now >= last + 10
        && LOGGED_AT
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        crate::log!("warning: out of file descriptors: {count} connections answered 503 so far (raise ulimit -n)");
    }
}

/// Accepts connections with `accept4(SOCK_CLOEXEC)` after the driver reports the
/// listener readable. (monoio's io_uring accept passes no flags, so each connection
/// socket would be inheritable until a later `fcntl`, and a child spawned in between
/// would keep the client's connection open.) The queue is drained on every wake-up.
async fn accept_loop<S: Service>(
    listener: StdListener,
    service: Rc<S>,
    shutdown: Arc<Shutdown>,
    driver: IoDriver,
) {
    use rustix::net::SocketFlags;
    let registered = listener
        .set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(listener));
    let listener = match registered {
        Ok(l) => l,
        Err(e) => {
            crate::log!("cannot register listener: {e}");
            std::process::exit(1);
        }
    };
    // The epoll driver expects non-blocking sockets; io_uring waits inside the kernel.
    let flags = match driver {
        IoDriver::Epoll => SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        IoDriver::IoUring => SocketFlags::CLOEXEC,
    };
    // SAFETY: the listener outlives this loop, which is the only user of the borrow.
    let listener_fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(listener.as_raw_fd()) };
    let mut reserve = Reserve::take(listener_fd);
    loop {
        match rustix::net::accept_with(listener_fd, flags) {
            Ok(fd) => {
                if shutdown.is_shutting_down() {
                    shutdown::raise_local_drain();
                    break;
                }
                match TcpStream::from_std(std::net::TcpStream::from(fd)) {
                    Ok(stream) => {
                        let _ = stream.set_nodelay(true);
                        monoio::spawn(crate::http::conn::serve(stream, service.clone()));
                    }
                    Err(e) => crate::log!("cannot register a connection: {e}"),
                }
            }
            Err(rustix::io::Errno::AGAIN) => {
                let _ = listener.readable(false).await;
                if shutdown.is_shutting_down() {
                    shutdown::raise_local_drain();
                    break;
                }
            }
            Err(rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED) => {}
            Err(e) => {
                if shutdown.is_shutting_down() {
                    shutdown::raise_local_drain();
                    break;
                }
                if matches!(e, rustix::io::Errno::MFILE | rustix::io::Errno::NFILE) {
                    match reserve.shed(listener_fd, &*service) {
                        Shed::Answered => continue,
                        Shed::Empty => {
                            let _ = listener.readable(false).await;
                            continue;
                        }
                        Shed::NoReserve => {}
                    }
                }
                // Never spin on a failing accept: without a reserve, EMFILE/ENFILE wait
                // for descriptors to free up; anything else (ENOBUFS, ENOMEM) gets a short
                // pause.
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}
