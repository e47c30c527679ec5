//! Terminal sessions: a shell on a pseudo-terminal, its output kept in a bounded log
//! that any number of WebSocket clients read at their own pace, and the table of live
//! sessions (at most [`MAX_SESSIONS`], idle ones reaped).
//!
//! - **Start.** `openpt` + `grantpt` + `unlockpt`; the shell is spawned through the
//!   one spawn path in a session of its own with the slave as its controlling terminal.
//!   The server keeps only the master.
//! - **Output.** A task on the worker that created the session reads the master on
//!   that worker's driver (no pool thread), decodes it as UTF-8 without splitting a
//!   character across reads, and appends it to the session's [`OutputLog`] (1 MiB;
//!   older text is dropped). Readers on any thread follow it by sequence number and
//!   wait on a cross-thread [`Notify`]. The shell never waits for a slow client, and a
//!   client that stops reading costs nothing beyond the fixed log.
//! - **Input, resize, signals** go straight to the master (`write`, `TIOCSWINSZ`) or to
//!   the terminal's foreground process group (`tcgetpgrp`), so SIGINT reaches the
//!   program running in the shell, as Ctrl-C would.
//! - **End.** When the shell exits and its output is drained, the session is marked
//!   exited (readers see it after the last output). Deleting a session kills its
//!   process group.

use std::collections::HashMap;
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::process::followers::{Followers, Place};
use crate::process::output::{Notify, OutputLog, OutputPage, Stream};
use crate::process::pipe::{self, Utf8Pieces};
use crate::process::{Child, ChildRegistry, Spawn};
use crate::runtime::ready::Readiness;

/// Live sessions at once (the contract's limit).
pub const MAX_SESSIONS: usize = 10;
/// A session without input, output or a resize for this long is reaped when sessions
/// are next created or listed.
pub const IDLE_REAP: Duration = Duration::from_secs(1800);
/// Output kept per session for clients that connect later or fall behind.
pub const OUTPUT_LOG_BYTES: usize = 1024 * 1024;
/// How long an attached reader may hold a terminal's output back without taking any
/// before it is evicted (its socket closed with 4008) and the others go on, by default.
pub const STALL: Duration = Duration::from_secs(30);

/// `ABX_PTY_STALL_SECONDS` (a positive integer), else [`STALL`].
pub fn stall() -> Duration {
    static SET: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SET.get_or_init(|| {
        std::env::var("ABX_PTY_STALL_SECONDS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|v| *v > 0)
            .map_or(STALL, Duration::from_secs)
    })
}
/// A read of the master shorter than this most likely emptied it: a terminal hands out
/// up to its line discipline's 4 KiB buffer per read, so a program writing faster than
/// we read fills the reads, and one that wrote less is caught up with. Either way the
/// readiness wait that follows a short read answers at once if more is there.
const SHORT_READ: usize = 1024;
/// What one log entry costs beyond its text (entry and allocation), counted against
/// the log's size so a program writing a byte at a time cannot hold more memory.
const LOG_EVENT_OVERHEAD: usize = 64;
/// Shells a session may run.
pub const ALLOWED_SHELLS: [&str; 5] = [
    "/bin/bash",
    "/bin/sh",
    "/bin/zsh",
    "/usr/bin/bash",
    "/usr/bin/zsh",
];
/// Variables never passed to a session's shell (they would load code into it).
pub const STRIPPED_VARS: [&str; 3] = ["LD_PRELOAD", "LD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES"];

/// One terminal session.
pub struct Session {
    pub id: String,
    /// The caller identity that created it: the only one that may see or use it.
    pub owner: String,
    pub pid: i32,
    /// Unix time of creation.
    pub created_at: f64,
    master: OwnedFd,
    size: Mutex<(u16, u16)>,
    output: Mutex<OutputLog>,
    /// Bumped on new output and on exit.
    pub changed: Notify,
    exited: AtomicBool,
    last_activity: Mutex<Instant>,
    /// The attached sockets, each with how far it has taken the output. The terminal is
    /// read only while the log has room for a piece without dropping what the slowest
    /// of them has not taken: a program that writes faster than its readers take waits
    /// on its full terminal, and a reader that keeps reading loses nothing.
    followers: Followers,
}

/// A follower's registration, undone when dropped (the socket closed).
pub struct Following {
    session: Arc<Session>,
    place: Arc<Place>,
}

impl Following {
    /// It has taken everything before `next`.
    pub fn took(&self, next: u64) {
        self.session.followers.took(&self.place, next);
    }

    /// Whether it held the terminal back for [`stall`] without taking anything: it is
    /// no longer waited for, and its socket must close.
    pub fn evicted(&self) -> bool {
        self.place.cut_off()
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        self.session.followers.detach(&self.place);
    }
}

/// What a session looks like in the HTTP API.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub id: String,
    pub pid: i32,
    pub created_at: f64,
    pub cols: u16,
    pub rows: u16,
    pub alive: bool,
}

impl Session {
    pub fn info(&self) -> SessionInfo {
        let (cols, rows) = *lock(&self.size);
        SessionInfo {
            id: self.id.clone(),
            pid: self.pid,
            created_at: self.created_at,
            cols,
            rows,
            alive: !self.has_exited(),
        }
    }

    pub fn has_exited(&self) -> bool {
        self.exited.load(Ordering::SeqCst)
    }

    /// Output from sequence number `since` on, at most about `max_bytes` of it (see
    /// [`OutputLog::read_at_most`]).
    pub fn read(&self, since: u64, max_bytes: usize) -> OutputPage {
        lock(&self.output).read_at_most(since, max_bytes)
    }

    /// Registers an attached reader that starts from the oldest output kept.
    pub fn follow(self: &Arc<Self>) -> Following {
        Following {
            session: self.clone(),
            place: self.followers.attach(0),
        }
    }

    /// Waits until `wanted` more bytes fit in the log without dropping output an
    /// attached reader has not taken. A reader that takes nothing for [`stall`] while
    /// the terminal waits on it is evicted (its socket closes with 4008) and no longer
    /// waited for. Without attached readers the log keeps the newest output, as before.
    async fn room_for(&self, wanted: usize) {
        let fits = |lowest: u64| {
            let log = lock(&self.output);
            log.held_from(lowest) + wanted <= log.cap()
        };
        self.followers
            .wait_for_room(stall(), fits, || self.changed.notify())
            .await;
    }

    /// Marks the session as used now (it is not idle).
    pub fn touch(&self) {
        *lock(&self.last_activity) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        lock(&self.last_activity).elapsed()
    }

    /// Sets the terminal size; the kernel sends SIGWINCH to the foreground program.
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        set_size(&self.master, cols, rows)?;
        *lock(&self.size) = (cols, rows);
        self.touch();
        Ok(())
    }

    /// Writes keystrokes to the terminal, waiting (on this worker's driver) while the
    /// terminal's input queue is full, until `deadline` (then `TimedOut`). The deadline
    /// arms a timer only if the queue is full: a keystroke that fits costs one `write`.
    pub async fn input(&self, data: &[u8], deadline: Instant) -> io::Result<()> {
        self.touch();
        let (_, written) = pipe::write_all_until(&self.master, data, deadline).await;
        written
    }

    /// Sends `signal` to the terminal's foreground process group (the program the
    /// shell is running, or the shell), as the terminal's own keys would.
    pub fn signal(&self, signal: rustix::process::Signal) -> io::Result<()> {
        if self.has_exited() {
            return Ok(());
        }
        self.touch();
        let group = rustix::termios::tcgetpgrp(&self.master)
            .ok()
            .or_else(|| rustix::process::Pid::from_raw(self.pid));
        match group {
            Some(group) => match rustix::process::kill_process_group(group, signal) {
                Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
                Err(e) => Err(e.into()),
            },
            None => Ok(()),
        }
    }

    /// Kills every process of the session: the shell's group, and every other group
    /// of its terminal session (an interactive shell gives each job a group of its own,
    /// and background jobs outlive the shell). Blocking: it scans `/proc`, so run it
    /// on the blocking pool.
    pub fn kill(&self) {
        kill_session(self.pid);
    }
}

/// What `create` needs.
pub struct NewSession {
    /// The identity creating it.
    pub owner: String,
    pub shell: String,
    pub cols: u16,
    pub rows: u16,
    /// The environment the shell starts with (already stripped and extended).
    pub env: Vec<(OsString, OsString)>,
    /// The working directory, opened beneath the base directory.
    pub cwd: OwnedFd,
    /// The most sessions that may be live with this one (a policy's `max_sessions`,
    /// never above [`MAX_SESSIONS`]).
    pub most: usize,
}

/// Why a session could not be created.
#[derive(Debug)]
pub enum CreateError {
    /// [`MAX_SESSIONS`] are live.
    Full,
    Io(io::Error),
}

/// The table of sessions, shared by every worker.
#[derive(Default)]
pub struct Sessions {
    table: Mutex<HashMap<String, Arc<Session>>>,
}

impl Sessions {
    /// Starts a shell on a new terminal. Must run on a worker: the session's output
    /// task runs on it.
    pub async fn create(
        &self,
        request: NewSession,
        children: &Arc<ChildRegistry>,
    ) -> Result<Arc<Session>, CreateError> {
        let most = request.most.min(MAX_SESSIONS);
        // Counted again on insertion; this early check spares a spawn.
        if lock(&self.table).len() >= most {
            return Err(CreateError::Full);
        }
        let (master, slave_path) = open_pty().map_err(CreateError::Io)?;
        set_size(&master, request.cols, request.rows).map_err(CreateError::Io)?;
        pipe::set_nonblocking(&master).map_err(CreateError::Io)?;
        let ready = Readiness::new(master.as_fd()).map_err(CreateError::Io)?;
        let spec = Spawn {
            user: None,
            argv: vec![request.shell.clone()],
            cwd: request.cwd,
            env: request.env,
            stdin: false,
            capture: false,
            terminal: Some(slave_path),
        };
        let child = Child::spawn(spec, children)
            .await
            .map_err(CreateError::Io)?;
        let created_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let session = {
            let mut table = lock(&self.table);
            if table.len() >= most {
                // Another create won the last place meanwhile; `child` is dropped and
                // killed here.
                return Err(CreateError::Full);
            }
            // Unique under the lock: a repeated id would replace a live session.
            let id = loop {
                let id = new_id().map_err(CreateError::Io)?;
                if !table.contains_key(&id) {
                    break id;
                }
            };
            let session = Arc::new(Session {
                id: id.clone(),
                owner: request.owner,
                pid: child.pid(),
                created_at,
                master,
                size: Mutex::new((request.cols, request.rows)),
                output: Mutex::new(OutputLog::with_event_overhead(
                    OUTPUT_LOG_BYTES,
                    LOG_EVENT_OVERHEAD,
                )),
                changed: Notify::default(),
                exited: AtomicBool::new(false),
                last_activity: Mutex::new(Instant::now()),
                followers: Followers::default(),
            });
            table.insert(id, session.clone());
            session
        };
        monoio::spawn(follow(session.clone(), child, ready));
        Ok(session)
    }

    /// `owner`'s session `id`. Another identity's session is not found, exactly like an
    /// unknown id, so ids cannot be probed across identities.
    pub fn get(&self, id: &str, owner: &str) -> Option<Arc<Session>> {
        lock(&self.table)
            .get(id)
            .filter(|s| s.owner == owner)
            .cloned()
    }

    /// `owner`'s sessions, oldest first.
    pub fn list(&self, owner: &str) -> Vec<Arc<Session>> {
        let mut sessions: Vec<Arc<Session>> = lock(&self.table)
            .values()
            .filter(|s| s.owner == owner)
            .cloned()
            .collect();
        sessions.sort_by(|a, b| a.created_at.total_cmp(&b.created_at));
        sessions
    }

    /// Removes `owner`'s session `id`; the caller kills its processes
    /// ([`Session::kill`], off the event loop). Its sockets are told at once.
    pub fn remove(&self, id: &str, owner: &str) -> Option<Arc<Session>> {
        let removed = {
            let mut table = lock(&self.table);
            match table.get(id) {
                Some(s) if s.owner == owner => table.remove(id),
                _ => None,
            }
        };
        if let Some(session) = &removed {
            session.changed.notify();
        }
        removed
    }

    /// Removes the sessions idle for [`IDLE_REAP`]; the caller kills them.
    pub fn take_idle(&self) -> Vec<Arc<Session>> {
        let mut table = lock(&self.table);
        let idle: Vec<String> = table
            .values()
            .filter(|s| s.idle_for() >= IDLE_REAP)
            .map(|s| s.id.clone())
            .collect();
        let removed: Vec<Arc<Session>> = idle.iter().filter_map(|id| table.remove(id)).collect();
        drop(table);
        for session in &removed {
            session.changed.notify();
        }
        removed
    }

    /// Every session, for shutdown.
    pub fn all(&self) -> Vec<Arc<Session>> {
        lock(&self.table).values().cloned().collect()
    }
}

/// The session's output task: master to log until the shell exits (or the terminal
/// closes), then what is left in the terminal, then the exit.
async fn follow(session: Arc<Session>, mut child: Child, ready: Readiness) {
    let mut text = Utf8Pieces::default();
    let mut piece = vec![0u8; pipe::READ_PIECE];
    {
        let reading = read_until_closed(&session, &ready, &mut text, &mut piece);
        monoio::select! {
            _ = reading => {}
            _ = child.wait() => {}
        }
    }
    // The shell has exited (or the terminal closed): take what it wrote last, but no
    // more than a log's worth, since a background job may still be writing.
    let mut drained = 0;
    while drained < OUTPUT_LOG_BYTES {
        session.room_for(piece.len() + LOG_EVENT_OVERHEAD).await;
        match rustix::io::read(&session.master, &mut piece[..]) {
            Ok(n) if n > 0 => {
                drained += n;
                append(&session, text.decode(&piece[..n]));
            }
            _ => break,
        }
    }
    append(&session, text.finish());
    let _ = child.wait().await;
    session.exited.store(true, Ordering::SeqCst);
    session.changed.notify();
}

/// Reads the master into the log until the terminal reports end of file (EIO: no
/// process holds the slave any more).
async fn read_until_closed(
    session: &Session,
    ready: &Readiness,
    text: &mut Utf8Pieces,
    piece: &mut [u8],
) {
    // A terminal hands out at most about 4 KiB per read; what one wake-up finds is
    // gathered into one log entry (up to a read piece), so a fast writer costs one
    // append and one notification per 64 KiB, not per 4 KiB.
    let mut gathered = String::new();
    let mut reads_without_waiting = 0u32;
    loop {
        if gathered.is_empty() {
            // What one gathering may append: up to a piece, plus the read that ends it.
            session.room_for(2 * piece.len() + LOG_EVENT_OVERHEAD).await;
        }
        match rustix::io::read(&session.master, &mut *piece) {
            Ok(0) => break,
            Ok(n) if n < SHORT_READ => {
                // The terminal had no more than this (an echo, a prompt): the readiness
                // wait below answers at once if more came meanwhile, and a keystroke's
                // echo costs one `read` instead of two.
                gathered.push_str(&text.decode(&piece[..n]));
                append(session, std::mem::take(&mut gathered));
                reads_without_waiting = 0;
                if ready.readable().await.is_err() {
                    break;
                }
            }
            Ok(n) => {
                gathered.push_str(&text.decode(&piece[..n]));
                if gathered.len() >= piece.len() {
                    append(session, std::mem::take(&mut gathered));
                    reads_without_waiting += 1;
                    // monoio has no scheduling budget: a program that writes as fast as
                    // we read (`yes`) must not hold the worker.
                    if reads_without_waiting >= 16 {
                        reads_without_waiting = 0;
                        crate::runtime::yield_now().await;
                    }
                }
            }
            Err(rustix::io::Errno::AGAIN) => {
                append(session, std::mem::take(&mut gathered));
                reads_without_waiting = 0;
                if ready.readable().await.is_err() {
                    break;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
    }
    append(session, gathered);
}

fn append(session: &Session, decoded: String) {
    if !decoded.is_empty() {
        lock(&session.output).push(Stream::Stdout, decoded);
        session.touch();
        session.changed.notify();
    }
}

/// A new pseudo-terminal: the master (close-on-exec) and the slave's path.
fn open_pty() -> io::Result<(OwnedFd, CString)> {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let path = ptsname(&master, Vec::new())?;
    Ok((master, path))
}

fn set_size(master: &OwnedFd, cols: u16, rows: u16) -> io::Result<()> {
    let size = rustix::termios::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(master, size)?;
    Ok(())
}

/// 12 hex characters from the kernel's random source (never blocking: the pool is
/// initialised long before a session is created, and an error is reported, not hidden).
fn new_id() -> io::Result<String> {
    let mut bytes = [0u8; 6];
    let n = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::NONBLOCK)?;
    if n < bytes.len() {
        return Err(io::Error::other(
            "the kernel's random source returned too few bytes",
        ));
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// SIGKILL to every process whose session is `sid` (a terminal session's shell pid),
/// found in `/proc`, and to the shell's own group first.
pub fn kill_session(sid: i32) {
    use rustix::process::{kill_process, kill_process_group, Pid, Signal};
    if let Some(pid) = Pid::from_raw(sid) {
        let _ = kill_process_group(pid, Signal::KILL);
    }
    for process in crate::process::processes().filter(|p| p.session == sid) {
        if let Some(pid) = Pid::from_raw(process.pid) {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing here can leave the data inconsistent on a panic.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The terminal socket's `output` message for `data`, `{"type":"output","data":...}`,
/// written without building a JSON object first. It escapes every byte a program prints,
/// so it lives here, in the engine built for speed, not in the size-built routes above
/// (docs/architecture.md, "Packages").
pub fn output_message(data: &str) -> String {
    #[derive(serde::Serialize)]
    struct Output<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        data: &'a str,
    }
    let message = Output {
        kind: "output",
        data,
    };
    // A struct of two strings always serialises.
    serde_json::to_string(&message).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::output_message;

    #[test]
    fn output_message_escapes_what_a_terminal_prints() {
        let printed = "\x1b[1mbold\x1b[0m \"quoted\" back\\slash\r\n\u{7f}é\u{0}";
        let message: serde_json::Value =
            serde_json::from_str(&output_message(printed)).expect("valid JSON");
        assert_eq!(
            message,
            serde_json::json!({"type": "output", "data": printed})
        );
        assert_eq!(output_message("a"), r#"{"type":"output","data":"a"}"#);
    }
}
