//! envd's processes (`process.Process`): what callers started, each with its output as
//! bytes, its stdin or terminal, a tag, and the identity that started it.
//!
//! Output is a log of chunks with sequence numbers. A `Start` stream reads it from the
//! first chunk, a `Connect` stream from the moment it attached (envd replays nothing).
//! The process's pipes (or its terminal) are read only while every attached stream is
//! within [`LOG_BYTES`] of the newest output, so a stream that keeps reading loses
//! nothing and a program that writes faster than its readers take waits on its full
//! pipe, as it would on envd. A stream that takes nothing for [`STALL`] while the
//! program waits on it is cut off (its stream ends with an error) and the others go
//! on. With no stream attached the log keeps the newest [`LOG_BYTES`].

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::process::child::{Child, ExitCode};
use crate::process::followers::{Followers, Place};
use crate::process::output::Notify;
use crate::process::pipe::PipeReader;

/// Output kept per process beyond what every attached stream has taken.
pub const LOG_BYTES: usize = 4 * 1024 * 1024;
/// How long a stream that takes nothing may hold its program back.
pub const STALL: Duration = Duration::from_secs(30);
/// Most processes one server holds (running, and exited ones still being read).
pub const MAX_PROCESSES: usize = 1024;

/// One piece of output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chunk {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Pty(Vec<u8>),
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Chunk::Stdout(b) | Chunk::Stderr(b) | Chunk::Pty(b) => b.len(),
        }
    }
}

/// How a process ended, as envd reports it (Go's `ProcessState`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct End {
    /// The exit status, or -1 when a signal ended it.
    pub exit_code: i32,
    /// Whether it exited by itself (not by a signal).
    pub exited: bool,
    /// `exit status 1`, `signal: killed`.
    pub status: String,
    pub error: Option<String>,
}

impl End {
    pub fn of(code: ExitCode) -> End {
        if code.0 < 0 {
            End {
                exit_code: -1,
                exited: false,
                status: format!("signal: {}", signal_name(-code.0)),
                error: None,
            }
        } else {
            End {
                exit_code: code.0,
                exited: true,
                status: format!("exit status {}", code.0),
                error: None,
            }
        }
    }
}

/// The words Go's `syscall.Signal.String()` uses, which envd's status carries.
fn signal_name(signal: i32) -> String {
    match signal {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        13 => "broken pipe".into(),
        14 => "alarm clock".into(),
        15 => "terminated".into(),
        other => format!("signal {other}"),
    }
}

/// What a caller asked to run, as `List` reports it.
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: std::collections::HashMap<String, String>,
    pub cwd: Option<String>,
}

/// Every process envd's routes started.
#[derive(Default)]
pub struct Processes {
    rows: Mutex<BTreeMap<u32, Arc<Process>>>,
}

/// Why a process could not be added.
#[derive(Debug)]
pub enum AddError {
    Full,
    TagTaken(String),
}

impl Processes {
    /// Adds a started child and starts reading its output on this worker.
    pub fn add(
        &self,
        mut child: Child,
        owner: &str,
        tag: Option<String>,
        config: Config,
        terminal: Option<OwnedFd>,
    ) -> Result<Arc<Process>, AddError> {
        let pid = child.pid() as u32;
        let process = Arc::new(Process {
            pid,
            owner: owner.to_string(),
            tag: tag.clone(),
            config,
            state: Mutex::new(State::default()),
            changed: Notify::default(),
            followers: Followers::default(),
            stdin: Mutex::new(child.stdin.take()),
            terminal,
        });
        {
            let mut rows = lock(&self.rows);
            rows.retain(|_, p| !p.finished());
            if rows.len() >= MAX_PROCESSES {
                return Err(AddError::Full);
            }
            if let Some(tag) = &tag {
                if rows.values().any(|p| p.tag.as_deref() == Some(tag)) {
                    return Err(AddError::TagTaken(tag.clone()));
                }
            }
            rows.insert(pid, process.clone());
        }
        let readers = Readers {
            stdout: child.stdout.take().map(PipeReader::new).transpose(),
            stderr: child.stderr.take().map(PipeReader::new).transpose(),
            terminal: process
                .terminal
                .as_ref()
                .map(|fd| rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(io::Error::from))
                .transpose()
                .and_then(|fd| fd.map(PipeReader::new).transpose()),
        };
        monoio::spawn(supervise(child, readers, process.clone()));
        Ok(process)
    }

    /// `owner`'s running process with `pid`; another identity's is not found.
    pub fn by_pid(&self, pid: u32, owner: &str) -> Option<Arc<Process>> {
        lock(&self.rows)
            .get(&pid)
            .filter(|p| p.owner == owner && p.end().is_none())
            .cloned()
    }

    /// `owner`'s running process tagged `tag`.
    pub fn by_tag(&self, tag: &str, owner: &str) -> Option<Arc<Process>> {
        lock(&self.rows)
            .values()
            .find(|p| p.owner == owner && p.tag.as_deref() == Some(tag) && p.end().is_none())
            .cloned()
    }

    /// `owner`'s running processes, by pid.
    pub fn running(&self, owner: &str) -> Vec<Arc<Process>> {
        let mut rows = lock(&self.rows);
        rows.retain(|_, p| !p.finished());
        rows.values()
            .filter(|p| p.owner == owner && p.end().is_none())
            .cloned()
            .collect()
    }
}

/// One process.
pub struct Process {
    pub pid: u32,
    pub owner: String,
    pub tag: Option<String>,
    pub config: Config,
    state: Mutex<State>,
    /// Bumped when output is added or the process ends.
    changed: Notify,
    /// The attached streams' places in the output.
    followers: Followers,
    stdin: Mutex<Option<OwnedFd>>,
    /// The terminal's master side, for a process started with a PTY.
    terminal: Option<OwnedFd>,
}

#[derive(Default)]
struct State {
    /// Chunks with their sequence numbers, oldest first.
    log: VecDeque<(u64, Chunk)>,
    /// The sequence number the next chunk gets.
    next: u64,
    bytes: usize,
    end: Option<End>,
}

/// What a stream reads next.
pub enum Item {
    Output(Chunk),
    End(End),
    /// It held the program back for [`STALL`] without taking anything.
    CutOff,
}

/// An attached stream; detached when dropped.
pub struct Stream {
    process: Arc<Process>,
    place: Arc<Place>,
    ended: bool,
}

impl Stream {
    /// The next item, waiting for one.
    pub async fn next(&mut self) -> Option<Item> {
        loop {
            let seen = self.process.changed.version();
            if let Some(item) = self.try_next() {
                return Some(item);
            }
            if self.ended {
                return None;
            }
            self.process.changed.changed(seen).await;
        }
    }

    /// The next item if there is one now.
    pub fn try_next(&mut self) -> Option<Item> {
        if self.ended {
            return None;
        }
        if self.place.cut_off() {
            self.ended = true;
            return Some(Item::CutOff);
        }
        let state = lock(&self.process.state);
        let wanted = self.place.next();
        let found = state
            .log
            .iter()
            .find(|(seq, _)| *seq >= wanted)
            .map(|(seq, chunk)| (*seq, chunk.clone()));
        match found {
            Some((seq, chunk)) => {
                drop(state);
                self.process.followers.took(&self.place, seq + 1);
                Some(Item::Output(chunk))
            }
            None => {
                let end = state.end.clone()?;
                self.ended = true;
                Some(Item::End(end))
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.process.followers.detach(&self.place);
    }
}

impl Process {
    /// Attaches a stream: from the first output kept (`Start`), or from now (`Connect`).
    pub fn attach(self: &Arc<Self>, from_start: bool) -> Stream {
        let state = lock(&self.state);
        let next = if from_start {
            state.log.front().map_or(state.next, |(seq, _)| *seq)
        } else {
            state.next
        };
        // Attached under the state's lock: no output lands between reading `next` and
        // the place being counted.
        let place = self.followers.attach(next);
        drop(state);
        Stream {
            process: self.clone(),
            place,
            ended: false,
        }
    }

    pub fn end(&self) -> Option<End> {
        lock(&self.state).end.clone()
    }

    /// Ended, and no stream is left to read it.
    fn finished(&self) -> bool {
        lock(&self.state).end.is_some() && self.followers.is_empty()
    }

    pub fn has_terminal(&self) -> bool {
        self.terminal.is_some()
    }

    /// Sends `signal` to the process's group.
    pub fn signal(&self, signal: rustix::process::Signal) -> io::Result<()> {
        let pid = rustix::process::Pid::from_raw(self.pid as i32)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
        match rustix::process::kill_process_group(pid, signal) {
            Ok(()) => Ok(()),
            // Its own group is gone (it left it): the process itself.
            Err(rustix::io::Errno::SRCH) => Ok(rustix::process::kill_process(pid, signal)?),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `data` to the process's stdin (or its terminal), waiting for room at most
    /// `wait`. `Err(NotFound)`: stdin is closed or was never open.
    pub async fn write_input(
        &self,
        data: &[u8],
        to_terminal: bool,
        wait: Duration,
    ) -> io::Result<()> {
        let fd = if to_terminal {
            match &self.terminal {
                Some(master) => rustix::io::fcntl_dupfd_cloexec(master, 0)?,
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "the process has no terminal: send stdin instead of pty",
                    ))
                }
            }
        } else {
            let stdin = lock(&self.stdin);
            match stdin.as_ref() {
                Some(fd) => rustix::io::fcntl_dupfd_cloexec(fd, 0)?,
                None => return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "stdin is not open: start the process with stdin: true, and do not close it",
                )),
            }
        };
        crate::process::pipe::set_nonblocking(&fd)?;
        match monoio::time::timeout(wait, crate::process::pipe::write_all(&fd, data)).await {
            Ok((_, result)) => result,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the process did not read its input for {} s; some of it was not delivered",
                    wait.as_secs()
                ),
            )),
        }
    }

    /// Closes stdin (end of file for the process). `false`: it was not open.
    pub fn close_stdin(&self) -> bool {
        lock(&self.stdin).take().is_some()
    }

    /// Resizes the terminal.
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        let Some(master) = &self.terminal else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the process has no terminal to resize",
            ));
        };
        let size = rustix::termios::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        rustix::termios::tcsetwinsize(master, size)?;
        Ok(())
    }

    fn append(&self, chunk: Chunk) {
        if chunk.len() == 0 {
            return;
        }
        let mut state = lock(&self.state);
        let seq = state.next;
        state.next += 1;
        state.bytes += chunk.len();
        state.log.push_back((seq, chunk));
        // Drop what every attached stream has taken, and beyond the cap what nobody
        // attached still needs.
        let lowest = self.followers.lowest();
        while let Some((seq, chunk)) = state.log.front() {
            let taken = lowest.is_some_and(|low| *seq < low);
            let over = lowest.is_none() && state.bytes > LOG_BYTES;
            if !(taken || over) {
                break;
            }
            let len = chunk.len();
            state.log.pop_front();
            state.bytes -= len;
        }
        drop(state);
        self.changed.notify();
    }

    fn finish(&self, end: End) {
        lock(&self.state).end = Some(end);
        self.changed.notify();
    }

    /// Waits until the log holds less than [`LOG_BYTES`] that an attached stream has not
    /// taken. A stream that takes nothing for [`STALL`] meanwhile is cut off.
    async fn room(&self) {
        let fits = |lowest: u64| {
            let held: usize = lock(&self.state)
                .log
                .iter()
                .filter(|(seq, _)| *seq >= lowest)
                .map(|(_, chunk)| chunk.len())
                .sum();
            held < LOG_BYTES
        };
        self.followers
            .wait_for_room(STALL, fits, || self.changed.notify())
            .await;
    }
}

struct Readers {
    stdout: io::Result<Option<PipeReader>>,
    stderr: io::Result<Option<PipeReader>>,
    terminal: io::Result<Option<PipeReader>>,
}

/// Reads the output until every source is at its end and the child has exited, then
/// records the end.
async fn supervise(mut child: Child, readers: Readers, process: Arc<Process>) {
    let mut problems = Vec::new();
    let mut take = |reader: io::Result<Option<PipeReader>>| match reader {
        Ok(reader) => reader,
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    };
    let mut stdout = take(readers.stdout);
    let mut stderr = take(readers.stderr);
    let mut terminal = take(readers.terminal);
    let mut exit: Option<ExitCode> = None;
    loop {
        if stdout.is_none() && stderr.is_none() && terminal.is_none() {
            break;
        }
        process.room().await;
        // A terminal's master reads EIO once no process holds the slave: its end.
        monoio::select! {
            piece = read_some(&mut stdout) => match piece {
                Some(bytes) => process.append(Chunk::Stdout(bytes)),
                None => stdout = None,
            },
            piece = read_some(&mut stderr) => match piece {
                Some(bytes) => process.append(Chunk::Stderr(bytes)),
                None => stderr = None,
            },
            piece = read_some(&mut terminal) => match piece {
                Some(bytes) => process.append(Chunk::Pty(bytes)),
                None => terminal = None,
            },
            code = child.wait(), if exit.is_none() => {
                if let Ok(code) = code {
                    exit = Some(code);
                    // What the process wrote before it exited; a descendant still
                    // holding the pipes does not keep the end back.
                    for (reader, wrap) in [
                        (&mut stdout, Chunk::Stdout as fn(Vec<u8>) -> Chunk),
                        (&mut stderr, Chunk::Stderr),
                        (&mut terminal, Chunk::Pty),
                    ] {
                        drain_now(reader, wrap, &process);
                        *reader = None;
                    }
                }
            },
        }
    }
    let code = match exit {
        Some(code) => Ok(code),
        None => child.wait().await,
    };
    let mut end = match code {
        Ok(code) => End::of(code),
        Err(e) => End {
            exit_code: -1,
            exited: false,
            status: "unknown".into(),
            error: Some(e.to_string()),
        },
    };
    if end.error.is_none() && !problems.is_empty() {
        end.error = Some(problems.join("; "));
    }
    lock(&process.stdin).take();
    process.finish(end);
}

async fn read_some(reader: &mut Option<PipeReader>) -> Option<Vec<u8>> {
    match reader {
        Some(r) => match r.read().await {
            Ok(Some(bytes)) => Some(bytes.to_vec()),
            // End of file, EIO from a terminal nobody holds, or a read error.
            Ok(None) | Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

/// What one source holds right now, at most a pipe's worth.
fn drain_now(reader: &mut Option<PipeReader>, wrap: fn(Vec<u8>) -> Chunk, process: &Process) {
    let Some(reader) = reader else {
        return;
    };
    let mut taken = 0;
    while taken < crate::process::run::TAKE_READY_LIMIT {
        match reader.read_now() {
            Ok(Some(bytes)) if !bytes.is_empty() => {
                taken += bytes.len();
                process.append(wrap(bytes.to_vec()));
            }
            _ => break,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
