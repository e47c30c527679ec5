//! Background processes (`/process/*`): the table of what callers started, each row's
//! state, stdin and captured output, and the supervisor task that keeps a row current.
//!
//! The supervisor runs on the worker that started the process and waits on that
//! worker's driver for output and exit; any worker can read a row, write its stdin or
//! long-poll its output. A row becomes `exited` only after the output the process wrote
//! before exiting has been captured, so a caller that sees `exited` has seen everything
//! the process itself wrote (descendants still holding the pipe may add more later).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::child::{Child, ExitCode};
use super::output::{Notify, OutputLog, OutputPage, Stream};
use super::run::Outputs;

/// Most processes held at once (running ones, and exited ones not yet dropped).
pub const MAX_PROCESSES: usize = 100;
/// How long an exited process stays answerable by pid (`GET /process/{pid}`, its
/// output) after it exited, whoever lists the table meanwhile: a client polling one pid
/// must see the exit code even when another client's `/process/list` ran first. Rows
/// whose captured output has not been read to the end stay beyond this, until read;
/// any exited row goes earlier when its slot is needed for a new process.
pub const KEEP_EXITED: Duration = Duration::from_secs(600);
/// Captured output kept per process.
pub const OUTPUT_CAP_BYTES: usize = 1024 * 1024;
/// The longest an output read may wait for news.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// The table every worker shares.
#[derive(Default)]
pub struct ProcessTable {
    rows: Mutex<Rows>,
}

#[derive(Default)]
struct Rows {
    by_pid: BTreeMap<i32, Arc<Managed>>,
    /// Slots promised to starts that are still spawning.
    reserved: usize,
}

/// The table is full of running processes.
#[derive(Debug)]
pub struct TableFull;

/// A promised slot; dropped unused, it is given back.
pub struct Slot<'a> {
    table: &'a ProcessTable,
    used: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.used {
            self.table.lock().reserved -= 1;
        }
    }
}

impl ProcessTable {
    fn lock(&self) -> MutexGuard<'_, Rows> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Promises a row to a process about to start, dropping exited rows first when the
    /// table is full. `running_at_most` (a policy's `max_processes`) bounds the
    /// processes still running, as the reference counts them; exited rows kept for
    /// their output do not count against it.
    pub fn reserve(&self, running_at_most: usize) -> Result<Slot<'_>, TableFull> {
        let mut rows = self.lock();
        let running = rows
            .by_pid
            .values()
            .filter(|m| m.exited_at().is_none())
            .count();
        if running + rows.reserved >= running_at_most {
            return Err(TableFull);
        }
        let now = Instant::now();
        rows.by_pid.retain(|_, m| !m.expired(now));
        if rows.by_pid.len() + rows.reserved >= MAX_PROCESSES {
            // Exited rows whose output was read go first, then any exited row; the
            // longest exited first within each.
            let mut exited: Vec<(bool, Instant, i32)> = rows
                .by_pid
                .values()
                .filter_map(|m| Some((!m.fully_read(), m.exited_at()?, m.pid)))
                .collect();
            exited.sort();
            let excess = rows.by_pid.len() + rows.reserved + 1 - MAX_PROCESSES;
            for (_, _, pid) in exited.into_iter().take(excess) {
                rows.by_pid.remove(&pid);
            }
        }
        if rows.by_pid.len() + rows.reserved >= MAX_PROCESSES {
            return Err(TableFull);
        }
        rows.reserved += 1;
        Ok(Slot {
            table: self,
            used: false,
        })
    }

    /// Adds a started child in its slot and starts its supervisor on this worker.
    pub fn insert(
        &self,
        mut slot: Slot<'_>,
        mut child: Child,
        owner: &str,
        command: String,
        // The bytes of output kept (oldest dropped first), or `None`: not captured.
        capture: Option<usize>,
        timeout: Option<Duration>,
    ) -> io::Result<Arc<Managed>> {
        let outputs = Outputs::of(&mut child)?;
        let managed = Arc::new(Managed {
            pid: child.pid(),
            owner: owner.to_string(),
            command,
            started_at: unix_now(),
            state: Mutex::new(Shared {
                exit: None,
                exited_at: None,
                output: capture.map(OutputLog::new),
                read_through: 0,
                stdin: match child.stdin.take() {
                    Some(fd) => StdinState::Open(fd),
                    None => StdinState::NotEnabled,
                },
            }),
            changed: Notify::default(),
        });
        {
            let mut rows = self.lock();
            rows.reserved -= 1;
            slot.used = true;
            rows.by_pid.insert(managed.pid, managed.clone());
        }
        monoio::spawn(supervise(child, outputs, managed.clone(), timeout));
        Ok(managed)
    }

    /// The row of `pid`, if this server started it and still holds it (an exited row
    /// for [`KEEP_EXITED`], or until its unread output is read).
    pub fn get(&self, pid: i32) -> Option<Arc<Managed>> {
        let mut rows = self.lock();
        let managed = rows.by_pid.get(&pid)?.clone();
        if managed.expired(Instant::now()) {
            rows.by_pid.remove(&pid);
            return None;
        }
        Some(managed)
    }

    /// Running processes, oldest first. Exited rows are left out (the contract's list
    /// drops them) but stay answerable by pid as [`KEEP_EXITED`] says; rows past that
    /// are dropped here.
    pub fn list_running(&self) -> Vec<Arc<Managed>> {
        let mut rows = self.lock();
        let now = Instant::now();
        rows.by_pid.retain(|_, m| !m.expired(now));
        let mut running: Vec<Arc<Managed>> = rows
            .by_pid
            .values()
            .filter(|m| m.exit_code().is_none())
            .cloned()
            .collect();
        running.sort_by(|a, b| a.started_at.total_cmp(&b.started_at));
        running
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One background process.
pub struct Managed {
    pub pid: i32,
    /// The caller identity that started it: only that identity may see or touch it.
    pub owner: String,
    pub command: String,
    /// Unix time of the start, as Python's `time.time()`.
    pub started_at: f64,
    state: Mutex<Shared>,
    changed: Notify,
}

struct Shared {
    exit: Option<ExitCode>,
    /// When the exit was recorded.
    exited_at: Option<Instant>,
    output: Option<OutputLog>,
    /// The cursor of the latest output read, to tell whether output was read to the end.
    read_through: u64,
    stdin: StdinState,
}

enum StdinState {
    NotEnabled,
    Open(OwnedFd),
    /// A write is in progress on another request.
    Busy,
    Closed,
}

/// Why stdin could not be written.
#[derive(Debug)]
pub enum StdinError {
    /// The process was not started with `stdin: true`.
    NotEnabled,
    /// Closed by an earlier `eof`, or the process stopped reading (it exited).
    Closed,
    /// Nothing could be written within the wait: the pipe stayed full (the process
    /// reads nothing), or another request's write held stdin all along.
    Full {
        busy: bool,
    },
    Io(io::Error),
}

/// What a stdin write did.
#[derive(Debug, Clone, Copy)]
pub struct StdinWritten {
    pub written: usize,
    pub closed: bool,
}

/// The row's state as the output route reports it.
pub struct OutputRead {
    pub page: OutputPage,
    pub exit: Option<ExitCode>,
}

impl Managed {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn exit_code(&self) -> Option<ExitCode> {
        self.lock().exit
    }

    fn exited_at(&self) -> Option<Instant> {
        self.lock().exited_at
    }

    /// Whether an exited row has been kept long enough and may be dropped.
    fn expired(&self, now: Instant) -> bool {
        let exited_for = self.exited_at().map(|at| now.saturating_duration_since(at));
        !keep_row(exited_for, self.fully_read())
    }

    fn fully_read(&self) -> bool {
        let state = self.lock();
        state
            .output
            .as_ref()
            .is_none_or(|log| state.read_through >= log.next_seq())
    }

    /// Output at or after `since`, waiting up to `wait` for something new when there is
    /// nothing yet and the process is still running. `None` when output is not captured.
    pub async fn read_output(&self, since: u64, wait: Duration) -> Option<OutputRead> {
        let deadline = Instant::now() + wait.min(MAX_WAIT);
        loop {
            let seen = self.changed.version();
            {
                let mut state = self.lock();
                let page = state.output.as_ref()?.read(since);
                let exit = state.exit;
                let now = Instant::now();
                if !page.events.is_empty() || exit.is_some() || now >= deadline {
                    state.read_through = state.read_through.max(page.next);
                    return Some(OutputRead { page, exit });
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            monoio::select! {
                _ = self.changed.changed(seen) => {},
                _ = monoio::time::sleep(remaining) => {},
            }
        }
    }

    /// Writes `data` to the process's stdin, then closes it when `eof`. Writes from
    /// concurrent requests are kept whole: each waits for the one before it. The whole
    /// call waits at most `wait`: a process that does not read would otherwise hold the
    /// request, and its data, forever. What was written by then is the answer (without
    /// the `eof`); nothing at all is [`StdinError::Full`].
    pub async fn write_stdin(
        &self,
        data: &[u8],
        eof: bool,
        wait: Duration,
    ) -> Result<StdinWritten, StdinError> {
        let deadline = Instant::now() + wait;
        let fd = loop {
            let seen = self.changed.version();
            {
                let mut state = self.lock();
                match std::mem::replace(&mut state.stdin, StdinState::Busy) {
                    StdinState::Open(fd) => break fd,
                    StdinState::Busy => {}
                    other @ (StdinState::NotEnabled | StdinState::Closed) => {
                        let error = match other {
                            StdinState::NotEnabled => StdinError::NotEnabled,
                            _ => StdinError::Closed,
                        };
                        state.stdin = other;
                        return Err(error);
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            monoio::select! {
                _ = self.changed.changed(seen) => {},
                _ = monoio::time::sleep(left) => return Err(StdinError::Full { busy: true }),
            }
        };
        let mut lease = StdinLease {
            managed: self,
            fd: Some(fd),
        };
        let (written, result) = match lease.fd.as_ref() {
            Some(fd) => super::pipe::write_all_until(fd, data, deadline).await,
            None => (0, Ok(())),
        };
        match result {
            Err(e) if e.kind() == io::ErrorKind::TimedOut && written == 0 => {
                Err(StdinError::Full { busy: false })
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Ok(StdinWritten {
                written,
                closed: false,
            }),
            Ok(()) if eof => {
                lease.close();
                Ok(StdinWritten {
                    written,
                    closed: true,
                })
            }
            Ok(()) => Ok(StdinWritten {
                written,
                closed: false,
            }),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::PIPE.raw_os_error()) => {
                lease.close();
                Err(StdinError::Closed)
            }
            Err(e) => Err(StdinError::Io(e)),
        }
    }

    /// Sends `signal` to the process's group. After the process itself has exited, the
    /// signal goes to what is left of its group (members it started that still run);
    /// with nothing left it does nothing, as Python's `Popen.send_signal` does.
    pub fn signal(&self, signal: rustix::process::Signal) -> io::Result<()> {
        let state = self.lock();
        if state.exit.is_some() {
            return super::group::signal_leaderless(self.pid, signal).map(drop);
        }
        // The supervisor records the exit right after reaping, so at worst this signal
        // goes to an id freed microseconds ago; the kernel hands a freed id out again
        // only after cycling through the whole pid space.
        match rustix::process::Pid::from_raw(self.pid)
            .map(|pid| rustix::process::kill_process_group(pid, signal))
        {
            Some(Ok(())) | Some(Err(rustix::io::Errno::SRCH)) | None => Ok(()),
            Some(Err(e)) => Err(e.into()),
        }
    }

    fn record(&self, pieces: Vec<(Stream, String)>, exit: Option<ExitCode>) {
        {
            let mut state = self.lock();
            if let Some(log) = state.output.as_mut() {
                for (stream, text) in pieces {
                    log.push(stream, text);
                }
            }
            if exit.is_some() {
                state.exit = exit;
                state.exited_at = Some(Instant::now());
            }
        }
        self.changed.notify();
    }
}

/// Gives a stdin descriptor back to its row when the write ends (or its request is
/// dropped mid-write), so the next writer can go on.
struct StdinLease<'a> {
    managed: &'a Managed,
    fd: Option<OwnedFd>,
}

impl StdinLease<'_> {
    fn close(&mut self) {
        self.fd = None;
        self.managed.lock().stdin = StdinState::Closed;
    }
}

impl Drop for StdinLease<'_> {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            let mut state = self.managed.lock();
            if matches!(state.stdin, StdinState::Busy) {
                state.stdin = StdinState::Open(fd);
            }
        }
        self.managed.changed.notify();
    }
}

/// Keeps a row current: captures output, records the exit after the output written
/// before it, and enforces the optional timeout by killing the process group, also
/// when the process itself has exited and members of its group still run.
async fn supervise(
    mut child: Child,
    mut outputs: Outputs,
    managed: Arc<Managed>,
    timeout: Option<Duration>,
) {
    let mut deadline = timeout.map(|t| Instant::now() + t);
    let mut exited = false;
    loop {
        if exited && outputs.is_done() && deadline.is_none() {
            return;
        }
        // After the exit, members left in the group are looked for every second, so the
        // task ends soon after they do rather than at a distant deadline.
        let until_deadline = deadline.map(|d| {
            let left = d.saturating_duration_since(Instant::now());
            if exited {
                left.min(Duration::from_secs(1))
            } else {
                left
            }
        });
        monoio::select! {
            piece = outputs.next(), if !outputs.is_done() => {
                // A pipe that failed is given up by `Outputs`; the other is still read,
                // and the exit still comes.
                if let Some(Ok(piece)) = piece {
                    managed.record(vec![piece], None);
                }
            },
            code = child.wait(), if !exited => match code {
                Ok(code) => {
                    let rest = outputs.take_ready().unwrap_or_default();
                    exited = true;
                    managed.record(rest, Some(code));
                    if !child.group_outlives_leader() {
                        deadline = None;
                    }
                }
                // The exit could not be awaited (no descriptor for the readiness wait):
                // the process still runs; look again shortly rather than invent an exit.
                Err(_) => monoio::time::sleep(Duration::from_millis(100)).await,
            },
            _ = sleep_or_never(until_deadline), if deadline.is_some() => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    let _ = child.signal_group(rustix::process::Signal::KILL);
                    // Killed once; the exit follows (a process in uninterruptible sleep
                    // takes its time, and is not signalled again in a loop meanwhile).
                    deadline = None;
                } else if exited && !child.group_outlives_leader() {
                    deadline = None;
                }
            },
        }
    }
}

/// Whether a row stays in the table: running (`exited_for` is `None`), exited less than
/// [`KEEP_EXITED`] ago, or holding output nobody has read to the end.
fn keep_row(exited_for: Option<Duration>, fully_read: bool) -> bool {
    match exited_for {
        None => true,
        Some(age) => age < KEEP_EXITED || !fully_read,
    }
}

async fn sleep_or_never(duration: Option<Duration>) {
    match duration {
        Some(d) => monoio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exited_rows_are_kept_for_a_while_and_unread_ones_until_read() {
        assert!(keep_row(None, true), "running");
        assert!(keep_row(Some(Duration::ZERO), true));
        assert!(keep_row(Some(KEEP_EXITED - Duration::from_secs(1)), true));
        assert!(!keep_row(Some(KEEP_EXITED), true));
        assert!(keep_row(Some(KEEP_EXITED * 10), false), "unread output");
    }
}
