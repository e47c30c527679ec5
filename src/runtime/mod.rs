//! Threads, listeners and the choice of I/O driver. One OS thread per worker, each running
//! its own monoio runtime and accepting on its own `SO_REUSEPORT` socket, so the kernel
//! spreads connections across cores and no connection ever changes thread.

pub mod blocking;
pub mod shutdown;

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use monoio::net::TcpListener;
use socket2::{Domain, Protocol, Socket, Type};

use crate::config::IoDriverChoice;
use crate::state::AppState;
use blocking::BlockingPool;
use shutdown::Shutdown;

/// The event loop the workers run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoDriver {
    IoUring,
    Epoll,
}

impl IoDriver {
    pub fn name(self) -> &'static str {
        match self {
            IoDriver::IoUring => "io_uring",
            IoDriver::Epoll => "epoll",
        }
    }
}

/// Picks the driver. `auto` probes io_uring (Docker's default seccomp profile refuses
/// `io_uring_setup` with EPERM) and falls back to epoll, saying why.
pub fn choose_driver(choice: IoDriverChoice) -> Result<(IoDriver, Option<String>), String> {
    match choice {
        IoDriverChoice::Epoll => Ok((IoDriver::Epoll, None)),
        IoDriverChoice::Uring => match probe_uring() {
            Ok(()) => Ok((IoDriver::IoUring, None)),
            Err(e) => Err(format!("--io-driver uring: io_uring is not available here ({e}); use --io-driver epoll or auto")),
        },
        IoDriverChoice::Auto => match probe_uring() {
            Ok(()) => Ok((IoDriver::IoUring, None)),
            Err(e) => Ok((IoDriver::Epoll, Some(format!("io_uring is not available ({e}); falling back to epoll")))),
        },
    }
}

fn probe_uring() -> Result<(), String> {
    match io_uring_setup_probe() {
        Ok(()) if monoio::utils::detect_uring() => Ok(()),
        Ok(()) => Err("the kernel lacks io_uring operations monoio needs".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Tries to build an io_uring runtime, which reports the real errno (EPERM under seccomp,
/// ENOSYS on old kernels) rather than a bare yes/no.
fn io_uring_setup_probe() -> io::Result<()> {
    monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .with_entries(8)
        .build()
        .map(drop)
}

/// Per-thread context every connection on a worker shares.
pub struct WorkerContext {
    pub state: Arc<AppState>,
    pub shutdown: Arc<Shutdown>,
}

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

/// Binds one listener per worker on the same port. With port 0 the first bind picks the
/// port and the others reuse it.
pub fn bind_all(addr: SocketAddr, workers: usize) -> io::Result<(Vec<StdListener>, SocketAddr)> {
    let first = bind_reuseport(addr)?;
    let bound = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..workers {
        listeners.push(bind_reuseport(bound)?);
    }
    Ok((listeners, bound))
}

/// Starts one worker thread per listener and returns their join handles.
pub fn start_workers(
    listeners: Vec<StdListener>,
    driver: IoDriver,
    state: Arc<AppState>,
    shutdown: Arc<Shutdown>,
    pool: BlockingPool,
) -> io::Result<Vec<std::thread::JoinHandle<()>>> {
    let mut handles = Vec::new();
    for (index, listener) in listeners.into_iter().enumerate() {
        shutdown.track_listener(listener.as_fd().try_clone_to_owned()?);
        let state = state.clone();
        let shutdown = shutdown.clone();
        let pool = pool.clone();
        let handle = std::thread::Builder::new()
            .name(format!("abx-worker-{index}"))
            .spawn(move || run_worker(listener, driver, state, shutdown, pool))?;
        handles.push(handle);
    }
    Ok(handles)
}

fn run_worker(
    listener: StdListener,
    driver: IoDriver,
    state: Arc<AppState>,
    shutdown: Arc<Shutdown>,
    pool: BlockingPool,
) {
    let context = Rc::new(WorkerContext { state, shutdown });
    let result = match driver {
        IoDriver::IoUring => monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .with_entries(1024)
            .enable_timer()
            .attach_thread_pool(Box::new(pool))
            .build()
            .map(|mut rt| rt.block_on(accept_loop(listener, context))),
        IoDriver::Epoll => monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .attach_thread_pool(Box::new(pool))
            .build()
            .map(|mut rt| rt.block_on(accept_loop(listener, context))),
    };
    if let Err(e) = result {
        eprintln!(
            "agent-sandbox: worker could not start its {} runtime: {e}",
            driver.name()
        );
        std::process::exit(1);
    }
}

async fn accept_loop(listener: StdListener, context: Rc<WorkerContext>) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("agent-sandbox: cannot register listener: {e}");
            std::process::exit(1);
        }
    };
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                if context.shutdown.is_shutting_down() {
                    break;
                }
                let _ = stream.set_nodelay(true);
                monoio::spawn(crate::http::conn::serve(stream, context.clone()));
            }
            Err(e) => {
                if context.shutdown.is_shutting_down() {
                    break;
                }
                // EMFILE/ENFILE: back off instead of spinning; others are per-connection.
                if matches!(e.raw_os_error(), Some(libc_emfile) if libc_emfile == 24 || libc_emfile == 23)
                {
                    monoio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    // Connections already accepted keep being served until the signal thread exits the
    // process; this future never returns so the runtime keeps polling them.
    std::future::pending::<()>().await;
}
