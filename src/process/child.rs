//! Starting, waiting for and ending one child. This is the only place the server forks.
//!
//! - **Spawn.** glibc's `posix_spawn` on the blocking pool (the one short blocking call
//!   of a child's life; see [`super::spawn`] for exactly what the child gets): its own
//!   process group, so a timeout or a signal reaches its descendants too; a clean signal
//!   mask; only the three descriptors it is given; the working directory entered
//!   through a descriptor opened beneath the base, never by re-resolving a path.
//! - **Wait.** A pidfd, awaited on the worker's driver: a child that runs for hours
//!   costs no thread. The exit is collected with `waitid(P_PIDFD)`, which reaps exactly
//!   this child, so nothing else can steal its status and no zombie stays behind.
//! - **End.** [`Child`] kills its process group and reaps it when dropped unfinished (a
//!   client that went away, a timed-out request), so no path leaves a child running.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use rustix::process::{Pid, PidfdFlags, WaitIdOptions};

use super::registry::ChildRegistry;
use super::spawn;
use crate::runtime::ready::Readiness;

/// What to start.
pub struct Spawn {
    /// The program and its arguments (already split; nothing is interpreted).
    pub argv: Vec<String>,
    /// The working directory, opened beneath the base directory.
    pub cwd: OwnedFd,
    /// The complete environment of the child.
    pub env: Vec<(OsString, OsString)>,
    /// Give the child a pipe for stdin (otherwise `/dev/null`).
    pub stdin: bool,
    /// Give the child pipes for stdout and stderr (otherwise `/dev/null`).
    pub capture: bool,
    /// Run it on this terminal (a PTY's slave path) in a session of its own, instead
    /// of pipes or `/dev/null`.
    pub terminal: Option<std::ffi::CString>,
    /// Run it as this user and group (uid, gid) instead of the server's (or
    /// `ABX_CHILD_USER`'s); the server must be root to change it.
    pub user: Option<(u32, u32)>,
}

/// How a child ended, as Python's `returncode` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitCode(pub i32);

impl ExitCode {
    fn of(status: rustix::process::WaitIdStatus) -> ExitCode {
        if let Some(signal) = status.terminating_signal() {
            ExitCode(-signal)
        } else {
            ExitCode(status.exit_status().unwrap_or(0))
        }
    }
}

/// A started child: its pid (also its process group), a pidfd for its exit, and the
/// parent's ends of the pipes it was given.
pub struct Child {
    pid: i32,
    pidfd: OwnedFd,
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    exit: Option<ExitCode>,
    registry: Arc<ChildRegistry>,
    /// The pidfd's readiness on this worker's driver, registered on the first wait.
    exit_ready: Option<Readiness>,
}

/// What the spawn on the blocking pool hands back (a [`Child`] is tied to its worker).
struct Started {
    pid: i32,
    pidfd: Option<OwnedFd>,
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    registry: Arc<ChildRegistry>,
}

impl Drop for Started {
    /// Not handed over (the request that asked for it was dropped while the pool
    /// spawned): kill and reap here, on the pool thread, where the short wait for a
    /// SIGKILLed child is allowed.
    fn drop(&mut self) {
        let Some(pidfd) = self.pidfd.take() else {
            return;
        };
        if let Some(pid) = Pid::from_raw(self.pid) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        reap_off_the_loop(self.pid, Some(pidfd), self.registry.clone());
    }
}

impl Child {
    /// Starts `spec` on the blocking pool and registers its process group so shutdown
    /// can end it. Errors are what `exec` reported (a missing program is `NotFound`).
    pub async fn spawn(spec: Spawn, registry: &Arc<ChildRegistry>) -> io::Result<Child> {
        let Some(program) = spec.argv.first().cloned() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the command is empty",
            ));
        };
        let registry_for_pool = registry.clone();
        let started = crate::runtime::blocking(move || -> io::Result<Started> {
            let path_var = spec
                .env
                .iter()
                .rev()
                .find(|(name, _)| name == "PATH")
                .map(|(_, value)| value.as_os_str());
            let program_path = spawn::find_program(&program, path_var, spec.cwd.as_fd())?;
            let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
            // (parent's end, child's end) of each pipe asked for.
            let stdin = spec.stdin.then(pipe).transpose()?.map(|(r, w)| (w, r));
            // The server writes stdin on its event loop: its end must never block.
            if let Some((parent, _)) = &stdin {
                super::pipe::set_nonblocking(parent)?;
            }
            let stdout = spec.capture.then(pipe).transpose()?;
            let stderr = spec.capture.then(pipe).transpose()?;
            let pid = registry_for_pool.spawn_registered(|| {
                spawn::spawn(
                    &program_path,
                    &spec.argv,
                    &spec.env,
                    spec.cwd.as_fd(),
                    spawn::Stdio {
                        stdin: stdin.as_ref().map(|(_, child)| child.as_fd()),
                        stdout: stdout.as_ref().map(|(_, child)| child.as_fd()),
                        stderr: stderr.as_ref().map(|(_, child)| child.as_fd()),
                        extra: Vec::new(),
                        terminal: spec.terminal.as_deref(),
                    },
                    spec.user,
                )
            })?;
            let pidfd = match Pid::from_raw(pid)
                .ok_or_else(|| io::Error::other("posix_spawn returned pid 0"))
                .and_then(|p| {
                    rustix::process::pidfd_open(p, PidfdFlags::empty()).map_err(io::Error::from)
                }) {
                Ok(fd) => fd,
                Err(error) => {
                    // Without a pidfd we cannot wait on the driver; do not leak the child.
                    if let Some(p) = Pid::from_raw(pid) {
                        let _ =
                            rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
                        let _ = rustix::process::waitpid(
                            Some(p),
                            rustix::process::WaitOptions::empty(),
                        );
                    }
                    registry_for_pool.unregister(pid);
                    return Err(error);
                }
            };
            // The child's ends close here; the parent keeps its own.
            Ok(Started {
                pid,
                pidfd: Some(pidfd),
                stdin: stdin.map(|(parent, _)| parent),
                stdout: stdout.map(|(parent, _)| parent),
                stderr: stderr.map(|(parent, _)| parent),
                registry: registry_for_pool.clone(),
            })
        })
        .await;
        let mut started =
            started.unwrap_or_else(|_| Err(io::Error::other("the spawn task was cancelled")))?;
        let pidfd = started
            .pidfd
            .take()
            .ok_or_else(|| io::Error::other("the spawned child was handed over twice"))?;
        Ok(Child {
            pid: started.pid,
            pidfd,
            stdin: started.stdin.take(),
            stdout: started.stdout.take(),
            stderr: started.stderr.take(),
            exit: None,
            registry: registry.clone(),
            exit_ready: None,
        })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Collects the exit if the child has ended, without waiting.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitCode>> {
        if self.exit.is_some() {
            return Ok(self.exit);
        }
        let status = rustix::process::waitid(
            rustix::process::WaitId::PidFd(self.pidfd.as_fd()),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
        )?;
        if let Some(status) = status {
            self.exit = Some(ExitCode::of(status));
            self.registry.unregister(self.pid);
        }
        Ok(self.exit)
    }

    /// Waits for the child to end, on the worker's driver, and reaps it.
    /// Cancel-safe: the exit is collected only by the synchronous `waitid`.
    pub async fn wait(&mut self) -> io::Result<ExitCode> {
        loop {
            if let Some(code) = self.try_wait()? {
                return Ok(code);
            }
            if self.exit_ready.is_none() {
                self.exit_ready = Some(Readiness::new(self.pidfd.as_fd())?);
            }
            if let Some(ready) = &self.exit_ready {
                ready.readable().await?;
            }
        }
    }

    /// Sends `signal` to the child's whole process group. Once the leader has been
    /// reaped, only to members still running in its group (see [`super::group`]).
    pub fn signal_group(&self, signal: rustix::process::Signal) -> io::Result<()> {
        if self.exit.is_some() {
            return super::group::signal_leaderless(self.pid, signal).map(drop);
        }
        let pid = Pid::from_raw(self.pid).expect("a child's pid is positive");
        match rustix::process::kill_process_group(pid, signal) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Kills the whole process group and waits for the leader.
    pub async fn kill(&mut self) -> io::Result<ExitCode> {
        self.signal_group(rustix::process::Signal::KILL)?;
        self.wait().await
    }

    /// Kills the child and every descendant, those in sessions of their own included
    /// ([`super::tree`]), and waits for the leader. Once the leader has exited its
    /// descendants cannot be told apart: only its group is killed then.
    pub async fn kill_tree(&mut self) -> io::Result<ExitCode> {
        if self.try_wait()?.is_none() {
            let root = self.pid;
            let _ = crate::runtime::file::blocking(move || super::tree::kill_tree(root)).await;
        }
        self.kill().await
    }
}

/// Reaps a child that was sent SIGKILL, on a short-lived thread of its own: the wait is
/// brief, but it must not block a worker. Without a pidfd the pid itself is waited for
/// (it cannot be reused before this reap).
fn reap_off_the_loop(pid: i32, pidfd: Option<OwnedFd>, registry: Arc<ChildRegistry>) {
    let reap = move || {
        match &pidfd {
            Some(fd) => {
                let _ = rustix::process::waitid(
                    rustix::process::WaitId::PidFd(fd.as_fd()),
                    WaitIdOptions::EXITED,
                );
            }
            None => {
                if let Some(p) = Pid::from_raw(pid) {
                    let _ =
                        rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty());
                }
            }
        }
        registry.unregister(pid);
    };
    if std::thread::Builder::new()
        .name("abx-reap".into())
        .spawn(reap)
        .is_err()
    {
        crate::log!("warning: could not start a thread to reap child {pid}");
    }
}

impl Child {
    /// Whether members of the group still run after the leader was reaped.
    pub fn group_outlives_leader(&self) -> bool {
        self.exit.is_some() && super::group::outlives_leader(self.pid)
    }

    /// Nothing more can be done for this child: its drop must not signal again.
    fn give_up(&mut self) {
        self.exit = Some(ExitCode(-9));
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.exit.is_some() {
            return;
        }
        // Still running, or ended but not reaped: end the group, then reap off to the
        // side so the zombie does not outlive the request that abandoned it.
        let _ = self.signal_group(rustix::process::Signal::KILL);
        let (pid, registry) = (self.pid, self.registry.clone());
        let pidfd = match self.pidfd.try_clone() {
            Ok(fd) => fd,
            Err(_) => return reap_off_the_loop(pid, None, registry),
        };
        if crate::runtime::on_worker() {
            let mut orphan = Child {
                pid,
                pidfd,
                stdin: None,
                stdout: None,
                stderr: None,
                exit: None,
                registry,
                exit_ready: None,
            };
            monoio::spawn(async move {
                if orphan.wait().await.is_err() {
                    // No readiness wait possible (out of descriptors): a thread waits.
                    orphan.give_up();
                    reap_off_the_loop(orphan.pid, None, orphan.registry.clone());
                }
            });
        } else {
            reap_off_the_loop(pid, Some(pidfd), registry);
        }
    }
}
