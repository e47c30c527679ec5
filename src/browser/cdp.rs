//! The DevTools Protocol over `--remote-debugging-pipe`: Chromium reads commands from
//! its fd 3 and writes replies and events to its fd 4, each message one JSON object
//! followed by a NUL byte. A pipe, unlike `--remote-debugging-port`, is reachable by no
//! other process in the sandbox.
//!
//! The pipe belongs to the browser actor's own thread, so reads and writes may block
//! that thread; both wait with `poll` against the call's deadline, so a hung Chromium
//! costs a timeout, never a stuck actor.

use std::io;
use std::os::fd::OwnedFd;
use std::time::Instant;

use serde::Deserialize;
use serde_json::Value;

/// The largest message accepted: a full-page screenshot of a long page is tens of MiB
/// of base64.
const MAX_MESSAGE: usize = 256 * 1024 * 1024;

/// The read buffer's capacity kept between messages.
const INBOX_KEPT: usize = 64 * 1024;

/// Why a call got no answer.
#[derive(Debug)]
pub enum PipeError {
    /// The deadline passed first.
    Timeout,
    /// Chromium closed its end (it exited or crashed), or the pipe broke.
    Closed(String),
}

/// Chromium's `error` member of a reply.
#[derive(Debug, Clone, Deserialize)]
pub struct ProtocolError {
    #[serde(default)]
    pub message: String,
}

/// One message from Chromium.
#[derive(Debug, Deserialize)]
pub struct Incoming {
    pub id: Option<u64>,
    pub result: Option<Value>,
    pub error: Option<ProtocolError>,
    pub method: Option<String>,
    #[serde(default)]
    pub params: Value,
}

/// Our two ends of Chromium's fds 3 and 4, both non-blocking.
pub struct Pipe {
    to_chromium: OwnedFd,
    from_chromium: OwnedFd,
    inbox: Vec<u8>,
    /// Where the next unread message starts in `inbox`.
    consumed: usize,
    /// How far `inbox` has been searched for a NUL without finding one.
    scanned: usize,
    next_id: u64,
}

fn wait_for(
    fd: &OwnedFd,
    events: rustix::event::PollFlags,
    deadline: Instant,
) -> Result<(), PipeError> {
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(PipeError::Timeout);
        }
        let timeout = rustix::event::Timespec {
            tv_sec: remaining.as_secs() as i64,
            tv_nsec: remaining.subsec_nanos() as i64,
        };
        let mut fds = [rustix::event::PollFd::new(fd, events)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => continue,
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(PipeError::Closed(format!("poll failed: {e}"))),
        }
    }
}

impl Pipe {
    /// Wraps our ends of the two pipes (the write end of Chromium's fd 3, the read end
    /// of its fd 4).
    pub fn new(to_chromium: OwnedFd, from_chromium: OwnedFd) -> io::Result<Pipe> {
        for fd in [&to_chromium, &from_chromium] {
            let flags = rustix::fs::fcntl_getfl(fd)?;
            rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)?;
        }
        Ok(Pipe {
            to_chromium,
            from_chromium,
            inbox: Vec::with_capacity(INBOX_KEPT),
            consumed: 0,
            scanned: 0,
            next_id: 1,
        })
    }

    /// Sends one command and returns its id.
    pub fn send(
        &mut self,
        method: &str,
        params: &Value,
        session: Option<&str>,
        deadline: Instant,
    ) -> Result<u64, PipeError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = serde_json::json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = Value::String(session.to_string());
        }
        let mut bytes = serde_json::to_vec(&message)
            .map_err(|e| PipeError::Closed(format!("cannot encode {method}: {e}")))?;
        bytes.push(0);
        let mut written = 0;
        while written < bytes.len() {
            match rustix::io::write(&self.to_chromium, &bytes[written..]) {
                Ok(n) => written += n,
                Err(rustix::io::Errno::AGAIN) => {
                    match wait_for(&self.to_chromium, rustix::event::PollFlags::OUT, deadline) {
                        Ok(()) => {}
                        // Half a message in the pipe leaves no way to frame the next one.
                        Err(PipeError::Timeout) if written > 0 => {
                            return Err(PipeError::Closed(
                                "Chromium stopped reading its pipe mid-message".into(),
                            ))
                        }
                        Err(e) => return Err(e),
                    }
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(PipeError::Closed(format!("writing to Chromium: {e}"))),
            }
        }
        Ok(id)
    }

    /// The next message, waiting for it until `deadline`.
    pub fn receive(&mut self, deadline: Instant) -> Result<Incoming, PipeError> {
        loop {
            // Only bytes not searched before: a message of tens of MiB arrives in many
            // reads, and rescanning it after each one would be quadratic.
            let from = self.scanned.max(self.consumed);
            if let Some(offset) = self.inbox[from..].iter().position(|b| *b == 0) {
                let start = self.consumed;
                let end = from + offset;
                self.consumed = end + 1;
                self.scanned = self.consumed;
                let parsed = serde_json::from_slice::<Incoming>(&self.inbox[start..end]);
                if self.consumed == self.inbox.len() {
                    self.inbox.clear();
                    self.consumed = 0;
                    self.scanned = 0;
                    // A full-page screenshot leaves a buffer of tens of MiB; an idle
                    // browser should not keep it.
                    if self.inbox.capacity() > INBOX_KEPT {
                        self.inbox = Vec::with_capacity(INBOX_KEPT);
                    }
                }
                match parsed {
                    Ok(message) => return Ok(message),
                    // Not ours to understand; the protocol has no other framing to lose.
                    Err(_) => continue,
                }
            }
            self.scanned = self.inbox.len();
            if self.consumed > 0 {
                self.inbox.drain(..self.consumed);
                self.scanned -= self.consumed;
                self.consumed = 0;
            }
            if self.inbox.len() > MAX_MESSAGE {
                return Err(PipeError::Closed(format!(
                    "Chromium sent a message over {} MiB",
                    MAX_MESSAGE >> 20
                )));
            }
            let before = self.inbox.len();
            // Larger reads while a large message arrives.
            let chunk = (before / 4).clamp(64 * 1024, 4 * 1024 * 1024);
            self.inbox.resize(before + chunk, 0);
            let read = rustix::io::read(&self.from_chromium, &mut self.inbox[before..]);
            match read {
                Ok(0) => {
                    self.inbox.truncate(before);
                    return Err(PipeError::Closed("Chromium closed the pipe".into()));
                }
                Ok(n) => self.inbox.truncate(before + n),
                Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => {
                    self.inbox.truncate(before);
                    wait_for(&self.from_chromium, rustix::event::PollFlags::IN, deadline)?;
                }
                Err(e) => {
                    self.inbox.truncate(before);
                    return Err(PipeError::Closed(format!("reading from Chromium: {e}")));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pair() -> (Pipe, OwnedFd, OwnedFd) {
        let (their_read, our_write) = rustix::pipe::pipe().unwrap();
        let (our_read, their_write) = rustix::pipe::pipe().unwrap();
        (
            Pipe::new(our_write, our_read).unwrap(),
            their_read,
            their_write,
        )
    }

    #[test]
    fn messages_are_split_on_nul_and_partial_ones_wait() {
        let (mut pipe, _their_read, their_write) = pair();
        rustix::io::write(
            &their_write,
            b"{\"id\":1,\"result\":{}}\0{\"method\":\"Page.lo",
        )
        .unwrap();
        let soon = Instant::now() + Duration::from_millis(200);
        let first = pipe.receive(soon).unwrap();
        assert_eq!(first.id, Some(1));
        assert!(matches!(
            pipe.receive(Instant::now() + Duration::from_millis(50)),
            Err(PipeError::Timeout)
        ));
        rustix::io::write(
            &their_write,
            b"adEventFired\",\"params\":{\"timestamp\":1}}\0",
        )
        .unwrap();
        let event = pipe.receive(soon + Duration::from_secs(1)).unwrap();
        assert_eq!(event.method.as_deref(), Some("Page.loadEventFired"));
        drop(their_write);
        assert!(matches!(
            pipe.receive(Instant::now() + Duration::from_secs(1)),
            Err(PipeError::Closed(_))
        ));
    }

    #[test]
    fn commands_are_framed_with_ids_and_sessions() {
        let (mut pipe, their_read, _their_write) = pair();
        let deadline = Instant::now() + Duration::from_secs(1);
        let id = pipe
            .send("Page.enable", &serde_json::json!({}), Some("S1"), deadline)
            .unwrap();
        let second = pipe
            .send("Browser.getVersion", &serde_json::json!({}), None, deadline)
            .unwrap();
        assert_eq!(second, id + 1);
        let mut buf = [0u8; 512];
        let n = rustix::io::read(&their_read, &mut buf).unwrap();
        let frames: Vec<&[u8]> = buf[..n]
            .split(|b| *b == 0)
            .filter(|f| !f.is_empty())
            .collect();
        assert_eq!(frames.len(), 2);
        let first: Value = serde_json::from_slice(frames[0]).unwrap();
        assert_eq!(first["sessionId"], "S1");
        assert_eq!(first["method"], "Page.enable");
    }

    #[test]
    fn a_reader_that_stops_mid_message_breaks_the_pipe() {
        let (mut pipe, _their_read, _their_write) = pair();
        let big = Value::String("x".repeat(1 << 20));
        let err = pipe
            .send(
                "Runtime.evaluate",
                &big,
                None,
                Instant::now() + Duration::from_millis(100),
            )
            .unwrap_err();
        assert!(matches!(err, PipeError::Closed(_)), "{err:?}");
    }
}
