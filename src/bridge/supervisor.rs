//! The supervisor: starts the Python worker, reads its manifest, pings it, and starts
//! it again when it dies or stops answering. It runs on its own thread ("abx-python"),
//! so its blocking reads and its wait for the worker's exit never touch a server worker
//! or the blocking pool.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::manifest::{ControlLine, Manifest};
use super::{Bridge, BridgeOptions, PythonApp};
use crate::process::{spawn, ChildRegistry};

/// Longest control line accepted (a manifest of thousands of commands fits).
const MAX_CONTROL_LINE: usize = 16 * 1024 * 1024;
/// Pings go out this often, or twice per hang timeout when that is shorter.
const PING_EVERY: Duration = Duration::from_secs(1);
/// A worker that lived at least this long restarts at once; one that keeps dying
/// sooner waits longer each time, up to `MAX_BACKOFF`.
const STABLE_AFTER: Duration = Duration::from_secs(10);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Starts the first worker and the supervisor thread; returns the first manifest.
pub(super) fn start(
    bridge: Arc<Bridge>,
    app: PythonApp,
    options: BridgeOptions,
    children: Arc<ChildRegistry>,
) -> Result<Manifest, String> {
    let (mut worker, manifest) = Worker::start(&app, &options, &children)?;
    let generation = bridge.publish(worker.take_calls());
    let frozen = manifest.clone();
    std::thread::Builder::new()
        .name("abx-python".into())
        .spawn(move || supervise(bridge, app, options, children, worker, generation, frozen))
        .map_err(|e| format!("cannot start the Python supervisor thread: {e}"))?;
    Ok(manifest)
}

fn supervise(
    bridge: Arc<Bridge>,
    app: PythonApp,
    options: BridgeOptions,
    children: Arc<ChildRegistry>,
    mut worker: Worker,
    mut generation: u64,
    frozen: Manifest,
) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let ended = worker.watch(&bridge, generation, options.hang_timeout);
        let status = worker.reap(&children);
        let why = format!("the Python worker {ended} ({status})");
        bridge.retire(generation, why.clone());
        if bridge.stopping.load(Ordering::SeqCst) {
            return;
        }
        if worker.started.elapsed() >= STABLE_AFTER {
            backoff = FIRST_BACKOFF;
        }
        crate::log!("{why}; starting it again");
        loop {
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
            if bridge.stopping.load(Ordering::SeqCst) {
                return;
            }
            match Worker::start(&app, &options, &children) {
                Ok((started, manifest)) => {
                    if manifest != frozen {
                        crate::log!("warning: the restarted Python worker registered different commands or routes; the server keeps serving those it started with");
                    }
                    worker = started;
                    generation = bridge.publish(worker.take_calls());
                    bridge.restarts.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(e) => crate::log!("{e}; trying again"),
            }
        }
    }
}

/// One running worker process.
struct Worker {
    pid: i32,
    control: UnixStream,
    /// Bytes read from `control` after the last complete line.
    pending: Vec<u8>,
    /// The server's ends of the call sockets, until published.
    calls: Vec<OwnedFd>,
    started: Instant,
}

impl Worker {
    /// Spawns the worker and reads its manifest. On failure the worker is ended and
    /// the error says what it did (its own traceback went to stderr).
    fn start(
        app: &PythonApp,
        options: &BridgeOptions,
        children: &Arc<ChildRegistry>,
    ) -> Result<(Worker, Manifest), String> {
        let command = app.argv.join(" ");
        let mut worker = Worker::spawn(app, options.links, children)
            .map_err(|e| format!("cannot start the Python worker `{command}`: {e}"))?;
        match worker.read_manifest(options.startup_timeout) {
            Ok(manifest) if manifest.protocol == 1 => Ok((worker, manifest)),
            Ok(manifest) => {
                worker.kill();
                let status = worker.reap(children);
                Err(format!(
                    "the Python worker speaks bridge protocol {} and this server speaks 1 ({status}); install the agent_sandbox package that came with this server",
                    manifest.protocol
                ))
            }
            Err(e) => {
                worker.kill();
                let status = worker.reap(children);
                Err(format!(
                    "the Python worker `{command}` did not register: {e} ({status}); it must call agent_sandbox's start() or SandboxServer(...).serve()"
                ))
            }
        }
    }

    fn spawn(app: &PythonApp, links: usize, children: &ChildRegistry) -> io::Result<Worker> {
        let (control, control_child) = UnixStream::pair()?;
        let mut calls = Vec::with_capacity(links);
        let mut call_children = Vec::with_capacity(links);
        for _ in 0..links {
            let (ours, theirs) = UnixStream::pair()?;
            calls.push(OwnedFd::from(ours));
            call_children.push(OwnedFd::from(theirs));
        }
        let cwd = rustix::fs::open(
            &app.cwd,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", app.cwd.display())))?;
        let fds: Vec<String> = (3..3 + 1 + links).map(|fd| fd.to_string()).collect();
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(name, _)| name != "ABX_PYTHON_APP" && name != "ABX_BRIDGE_FDS")
            .collect();
        env.push(("ABX_BRIDGE_FDS".into(), fds.join(",").into()));
        // Prints of a command reach the log at once, and are not lost when the worker
        // is killed or leaves with os._exit.
        env.push(("PYTHONUNBUFFERED".into(), "1".into()));
        let path_var = env
            .iter()
            .find(|(name, _)| name == "PATH")
            .map(|(_, value)| value.clone());
        let program = spawn::find_program(&app.argv[0], path_var.as_deref(), cwd.as_fd())?;
        let mut extra = vec![control_child.as_fd()];
        extra.extend(call_children.iter().map(|fd| fd.as_fd()));
        let stdout = io::stdout();
        let stderr = io::stderr();
        let pid = children.spawn_registered(|| {
            spawn::spawn(
                &program,
                &app.argv,
                &env,
                cwd.as_fd(),
                spawn::Stdio {
                    stdin: None,
                    stdout: Some(stdout.as_fd()),
                    stderr: Some(stderr.as_fd()),
                    extra,
                    terminal: None,
                },
                None,
            )
        })?;
        Ok(Worker {
            pid,
            control,
            pending: Vec::new(),
            calls,
            started: Instant::now(),
        })
    }

    fn take_calls(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.calls)
    }

    fn read_manifest(&mut self, timeout: Duration) -> Result<Manifest, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(format!("no manifest within {} s", timeout.as_secs_f64()));
            }
            match self.read_line(remaining) {
                Ok(Some(line)) => {
                    let parsed: ControlLine = serde_json::from_slice(&line)
                        .map_err(|e| format!("its first line is not a manifest: {e}"))?;
                    if let Some(manifest) = parsed.manifest {
                        return Ok(manifest);
                    }
                }
                Ok(None) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Err("it exited before registering".into())
                }
                Err(e) => return Err(format!("reading its manifest failed: {e}")),
            }
        }
    }

    /// Pings the worker until it exits, leaves a ping unanswered for `hang_timeout`
    /// (then it is killed), or a server worker asks for a restart. Returns what
    /// happened, worded for a log line.
    fn watch(&mut self, bridge: &Bridge, generation: u64, hang_timeout: Duration) -> String {
        let every = PING_EVERY
            .min(hang_timeout / 2)
            .max(Duration::from_millis(10));
        // The oldest ping not answered yet: a hang is measured from when it was sent,
        // so a late wake-up of this thread can never make a prompt worker look hung.
        let mut unanswered: Option<(u64, Instant)> = None;
        let mut ping = 0u64;
        let _ = self.control.set_write_timeout(Some(every));
        loop {
            if bridge.stopping.load(Ordering::SeqCst) {
                self.kill();
                return "was stopped".into();
            }
            if bridge.restart_requested(generation) {
                self.kill();
                return "broke the call protocol and was killed".into();
            }
            ping += 1;
            // A full socket (a worker that reads nothing) is a hang, caught below.
            let _ = self
                .control
                .write_all(format!("{{\"ping\":{ping}}}\n").as_bytes());
            unanswered.get_or_insert((ping, Instant::now()));
            let round = Instant::now() + every;
            loop {
                let remaining = round.saturating_duration_since(Instant::now());
                if remaining.is_zero() {
                    break;
                }
                match self.read_line(remaining) {
                    Ok(Some(line)) => {
                        if let Ok(ControlLine {
                            pong: Some(answered),
                            ..
                        }) = serde_json::from_slice(&line)
                        {
                            if unanswered.is_some_and(|(oldest, _)| answered >= oldest) {
                                unanswered = None;
                            }
                        }
                    }
                    Ok(None) => {}
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        // It closed the socket; make sure the rest of it is gone too.
                        self.kill();
                        return "exited".into();
                    }
                    Err(e) => {
                        self.kill();
                        return format!("broke its control socket ({e}) and was killed");
                    }
                }
            }
            if let Some((_, sent)) = unanswered.filter(|(_, sent)| sent.elapsed() > hang_timeout) {
                self.kill();
                return format!(
                    "did not answer for {:.1} s and was killed",
                    sent.elapsed().as_secs_f64()
                );
            }
        }
    }

    /// The next complete line, `None` if `wait` passed first; `UnexpectedEof` at the end.
    fn read_line(&mut self, wait: Duration) -> io::Result<Option<Vec<u8>>> {
        if let Some(line) = self.next_buffered_line() {
            return Ok(Some(line));
        }
        self.control
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
        let mut piece = [0u8; 8192];
        match self.control.read(&mut piece) {
            Ok(0) => Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                self.pending.extend_from_slice(&piece[..n]);
                if self.pending.len() > MAX_CONTROL_LINE {
                    return Err(io::Error::other("a control line over 16 MiB"));
                }
                Ok(self.next_buffered_line())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn next_buffered_line(&mut self) -> Option<Vec<u8>> {
        let end = self.pending.iter().position(|b| *b == b'\n')?;
        let line = self.pending[..end].to_vec();
        self.pending.drain(..=end);
        Some(line)
    }

    /// Kills the worker and its process group; the worker itself by pid too, in case
    /// it left its group (`setsid`), so the wait in `reap` always ends.
    fn kill(&self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }

    /// Waits for the worker's exit (it has exited or been killed) and describes it.
    fn reap(&self, children: &ChildRegistry) -> String {
        let status = rustix::process::Pid::from_raw(self.pid).map(|pid| loop {
            match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()) {
                Err(rustix::io::Errno::INTR) => continue,
                other => break other,
            }
        });
        children.unregister(self.pid);
        match status {
            Some(Ok(Some((_, status)))) => {
                if let Some(signal) = status.terminating_signal() {
                    format!("pid {}, killed by signal {signal}", self.pid)
                } else {
                    format!(
                        "pid {}, exit status {}",
                        self.pid,
                        status.exit_status().unwrap_or(0)
                    )
                }
            }
            _ => format!("pid {}", self.pid),
        }
    }
}
