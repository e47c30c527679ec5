//! Waiting for a descriptor to become readable on the worker's own event loop: an
//! io_uring `POLL_ADD` under the io_uring driver, the epoll reactor under the legacy one.
//! Long-lived streams (inotify, pipes, PTY masters, pidfds) wait here, on the worker
//! that serves them, so an open stream costs no blocking-pool thread and a thousand of
//! them cannot starve the pool's short tasks.

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd};

/// Readability of one descriptor, awaited on the current worker's driver.
pub struct Readiness {
    // monoio offers readiness waits on its socket types only; a Unix stream wrapper over
    // a duplicate of the descriptor gets us the same op for any pollable fd without
    // touching the caller's descriptor (dropping the wrapper closes only the duplicate).
    watcher: monoio::net::UnixStream,
}

impl Readiness {
    /// Registers a duplicate of `fd` with the current worker's driver. The descriptor
    /// should be non-blocking: the caller reads it directly after each wake-up.
    pub fn new(fd: BorrowedFd<'_>) -> io::Result<Readiness> {
        let duplicate = rustix::io::fcntl_dupfd_cloexec(fd, 0)?;
        // SAFETY: `duplicate` is an open descriptor we own; ownership moves to the wrapper.
        let std_stream =
            unsafe { std::os::unix::net::UnixStream::from_raw_fd(duplicate.into_raw_fd()) };
        Ok(Readiness {
            watcher: monoio::net::UnixStream::from_std(std_stream)?,
        })
    }

    /// Resolves once the descriptor is readable (or has hung up). Dropping the future
    /// cancels the wait.
    pub async fn readable(&self) -> io::Result<()> {
        self.watcher.readable(false).await
    }

    /// Resolves once the descriptor is writable (or its reader has gone). Dropping the
    /// future cancels the wait.
    pub async fn writable(&self) -> io::Result<()> {
        self.watcher.writable(false).await
    }
}
