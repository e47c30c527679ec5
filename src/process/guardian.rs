//! The guardian: a small process forked at startup that ends every child group when the
//! server dies without ending them itself (SIGKILL, a crash, the OOM killer).
//!
//! `PR_SET_PDEATHSIG` does not fit: `posix_spawn` cannot set it, it fires when the
//! *thread* that spawned the child exits (blocking-pool threads retire when idle), and it
//! reaches only the direct child, not the members of its group. The guardian instead
//! learns every group the registry records (4-byte messages on a pipe: `+pgid` when a
//! group starts, `-pgid` once it is known to be empty) and reads the pipe until end of
//! file, which comes when the last write end closes, i.e. when the server process is
//! gone however it went. Then it sends SIGTERM to every group still recorded, SIGKILL
//! 200 ms later, and exits.
//!
//! It is forked when the first child is about to start, by the thread starting it
//! (every spawn waits for that), so a server that never starts a process forks none and
//! start-up does not pay for the fork (0.16-0.24 ms, plus copy-on-write faults on the
//! pages start-up writes next). The server has threads by then; the guardian still runs
//! only async-signal-safe calls after the fork (no allocation: its table is allocated
//! before), so no lock another thread held at the fork can matter to it. A server that
//! is a container's PID 1 starts none: when PID 1 dies the kernel kills the whole PID
//! namespace.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;

/// Most groups the guardian keeps track of at once; later ones are not covered.
const CAPACITY: usize = 4096;

/// The write end of the guardian's pipe; `None` when there is no guardian (PID 1, or
/// the fork failed and was reported).
static GUARDIAN: OnceLock<Option<OwnedFd>> = OnceLock::new();

/// Starts the guardian unless it runs (or cannot): call before starting a child, so no
/// child starts without it.
pub(super) fn ensure_started() {
    GUARDIAN.get_or_init(|| {
        if std::process::id() == 1 {
            return None;
        }
        match start() {
            Ok(writer) => Some(writer),
            Err(e) => {
                crate::log!("warning: cannot start the guardian ({e}); children will outlive a server that is killed");
                None
            }
        }
    });
}

/// Forks the guardian; the write end of its pipe.
fn start() -> std::io::Result<OwnedFd> {
    use rustix::io::fcntl_dupfd_cloexec;
    let (reader, writer) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    // A write must never block the thread that records a group (a worker): a full
    // pipe (a guardian that stopped reading) loses the message instead.
    super::pipe::set_nonblocking(&writer)?;
    let dev_null = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    // Above the numbers the child moves them to, so no dup2 overwrites a source.
    let reader = fcntl_dupfd_cloexec(&reader, 10)?;
    let dev_null = fcntl_dupfd_cloexec(&dev_null, 10)?;
    let mut table: Vec<i32> = Vec::with_capacity(CAPACITY);
    // The guardian needs no environment, and its copy of the server's would still hold
    // whatever the server had not yet moved out of it (a policy's token_env).
    let environment = super::secrets::environment_block();
    // SAFETY: the child runs only async-signal-safe calls (`guard` below) and exits
    // with `_exit`, never returning into Rust code that could take a lock or allocate.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => unsafe {
            if let Some(block) = environment {
                super::secrets::wipe_environment_block(block);
            }
            guard(reader.as_raw_fd(), dev_null.as_raw_fd(), &mut table)
        },
        _ => {
            drop(reader);
            Ok(writer)
        }
    }
}

/// Records that group `pgid` runs.
pub(super) fn watch(pgid: i32) {
    send(pgid);
}

/// Records that group `pgid` has ended.
pub(super) fn forget(pgid: i32) {
    send(-pgid);
}

fn send(message: i32) {
    if let Some(Some(writer)) = GUARDIAN.get() {
        // Four bytes are below PIPE_BUF: written whole or not at all, never interleaved.
        let _ = rustix::io::write(writer, &message.to_le_bytes());
    }
}

/// The guardian's whole life.
///
/// # Safety
/// Only in the child of `fork`: it never returns.
unsafe fn guard(reader: i32, dev_null: i32, table: &mut Vec<i32>) -> ! {
    let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    libc::sigfillset(all.as_mut_ptr());
    libc::sigprocmask(libc::SIG_SETMASK, all.as_ptr(), std::ptr::null_mut());
    libc::prctl(
        libc::PR_SET_NAME,
        c"abx-guardian".as_ptr() as libc::c_ulong,
        0,
        0,
        0,
    );
    // Out of the server's group, so a signal to that group does not end the guardian
    // with it.
    libc::setpgid(0, 0);
    for fd in 0..3 {
        libc::dup2(dev_null, fd);
    }
    libc::dup2(reader, 3);
    libc::close_range(4, u32::MAX, 0);
    let mut buffer = [0u8; 4096];
    loop {
        let n = libc::read(3, buffer.as_mut_ptr().cast(), buffer.len());
        if n < 0 && *libc::__errno_location() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            break;
        }
        // Whole messages only: every write is 4 bytes and atomic, the buffer a multiple.
        for message in buffer[..n as usize].chunks_exact(4) {
            let value = i32::from_le_bytes([message[0], message[1], message[2], message[3]]);
            if value > 0 {
                if table.len() < table.capacity() && !table.contains(&value) {
                    table.push(value);
                }
            } else if let Some(at) = table.iter().position(|p| *p == -value) {
                table.swap_remove(at);
            }
        }
    }
    for pgid in table.iter() {
        libc::kill(-*pgid, libc::SIGTERM);
    }
    if !table.is_empty() {
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        libc::nanosleep(&pause, std::ptr::null_mut());
        for pgid in table.iter() {
            libc::kill(-*pgid, libc::SIGKILL);
        }
    }
    libc::_exit(0)
}
