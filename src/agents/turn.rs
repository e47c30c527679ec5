//! One turn of a CLI: spawned through the one spawn path (own process group, in the
//! base directory), the prompt written to its stdin, its stdout read line by line on
//! the worker's driver and turned into [`AgentEvent`]s. A turn that ends without
//! saying how (the CLI crashed, or was killed by a cancel) ends with a `Failed` event
//! carrying the exit status and the CLI's last complaint.
//!
//! The CLI's exit ends the turn even when a descendant it started (a tool command left
//! running, in a process group of its own) still holds its stdout or stderr open: the
//! pipes get a short grace to deliver what is left, then they are given up.

use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::events::AgentEvent;
use super::runtime::{LineReader, Runtime};
use crate::process::output::Stream;
use crate::process::run::Outputs;
use crate::process::{pipe, Child, ChildRegistry, ExitCode, Spawn};

/// Longest stderr kept for the failure message.
const STDERR_KEPT: usize = 2048;
/// Longest JSON line a CLI may print: a final answer is repeated whole in some lines
/// (qwen's `result`), and a file the agent wrote may be in a tool call.
const MAX_LINE: usize = 64 * 1024 * 1024;
/// How long the pipes may stay open after the CLI itself exited.
const AFTER_EXIT: Duration = Duration::from_secs(2);

/// A running turn.
pub struct Turn {
    runtime: Runtime,
    reader: LineReader,
    child: Child,
    outputs: Outputs,
    /// Stdout not yet ended by a newline.
    partial: String,
    pending: std::collections::VecDeque<AgentEvent>,
    stderr_tail: String,
    /// The CLI's last error line (codex `error` events), for a failure message.
    last_complaint: Option<String>,
    exited: Option<(ExitCode, Instant)>,
    ended: bool,
}

impl Turn {
    /// Starts `argv` (from [`Runtime::turn_argv`]) and hands it `prompt` on stdin.
    pub async fn start(
        runtime: Runtime,
        argv: Vec<String>,
        prompt: &str,
        cwd: OwnedFd,
        env: Vec<(OsString, OsString)>,
        registry: &Arc<ChildRegistry>,
    ) -> io::Result<Turn> {
        let spec = Spawn {
            user: None,
            argv,
            cwd,
            env,
            stdin: true,
            capture: true,
            terminal: None,
        };
        let mut child = Child::spawn(spec, registry).await?;
        if let Some(stdin) = child.stdin.take() {
            pipe::set_nonblocking(&stdin)?;
            let (_, written) = pipe::write_all(&stdin, prompt.as_bytes()).await;
            written?;
            // Dropping our end is the prompt's end of file.
        }
        let outputs = Outputs::of(&mut child)?;
        Ok(Turn {
            runtime,
            reader: runtime.reader(),
            child,
            outputs,
            partial: String::new(),
            pending: Default::default(),
            stderr_tail: String::new(),
            last_complaint: None,
            exited: None,
            ended: false,
        })
    }

    /// The CLI's process group, for a cancel.
    pub fn pgid(&self) -> i32 {
        self.child.pid()
    }

    fn take_lines(&mut self, text: &str) {
        self.partial.push_str(text);
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            self.parse(line.trim_end());
        }
        if self.partial.len() > MAX_LINE {
            self.partial.clear();
            self.pending.push_back(AgentEvent::Failed(format!(
                "the CLI printed a line over {} MiB",
                MAX_LINE >> 20
            )));
        }
    }

    fn parse(&mut self, line: &str) {
        for event in self.reader.line(line) {
            match event {
                AgentEvent::Notice(message) => self.last_complaint = Some(message),
                other => self.pending.push_back(other),
            }
        }
    }

    /// The next event; `None` after the turn's last one. Cancel-safe.
    pub async fn next(&mut self) -> Option<AgentEvent> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                if event.ends_turn() {
                    self.ended = true;
                    self.pending.clear();
                }
                return Some(event);
            }
            if self.ended {
                return None;
            }
            let piece = match self.exited {
                None => {
                    monoio::select! {
                        piece = self.outputs.next() => piece,
                        code = self.child.wait() => {
                            let code = code.unwrap_or(ExitCode(-1));
                            self.exited = Some((code, Instant::now()));
                            continue;
                        }
                    }
                }
                Some((_, at)) => {
                    let left = (at + AFTER_EXIT).saturating_duration_since(Instant::now());
                    // A descendant that holds the pipes past the grace: the CLI is done
                    // all the same.
                    monoio::time::timeout(left, self.outputs.next())
                        .await
                        .unwrap_or_default()
                }
            };
            match piece {
                Some(Ok((Stream::Stdout, text))) => self.take_lines(&text),
                Some(Ok((Stream::Stderr, text))) => {
                    self.stderr_tail.push_str(&text);
                    if self.stderr_tail.len() > STDERR_KEPT * 2 {
                        let cut = self.stderr_tail.len() - STDERR_KEPT;
                        let cut = (cut..self.stderr_tail.len())
                            .find(|i| self.stderr_tail.is_char_boundary(*i))
                            .unwrap_or(0);
                        self.stderr_tail.drain(..cut);
                    }
                }
                Some(Err(_)) => {}
                None => self.finish().await,
            }
        }
    }

    /// The pipes are done (or given up): what is left of stdout, then the turn's end if
    /// the CLI never said how it ended.
    async fn finish(&mut self) {
        let rest = std::mem::take(&mut self.partial);
        if !rest.trim().is_empty() {
            self.parse(rest.trim_end());
        }
        if self.pending.iter().any(AgentEvent::ends_turn) {
            return;
        }
        let code = match self.exited {
            Some((code, _)) => Ok(code),
            None => self.child.wait().await,
        };
        let status = match code {
            Ok(code) if code.0 < 0 => format!("was killed by signal {}", -code.0),
            Ok(code) => format!("exited with status {}", code.0),
            Err(e) => format!("could not be waited for: {e}"),
        };
        let last = self
            .last_complaint
            .clone()
            .or_else(|| {
                self.stderr_tail
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        let program = self.runtime.cli().map_or("the CLI", |c| c.program);
        let mut message = format!("{program} {status} without finishing the turn");
        if !last.is_empty() {
            message.push_str(": ");
            message.push_str(&last);
        }
        self.pending.push_back(AgentEvent::Failed(message));
    }

    /// Lets the CLI exit by itself after its last event (it may still be writing its
    /// session to disk, which the next turn resumes), for up to `grace`.
    pub async fn wait_exit(&mut self, grace: Duration) {
        if self.exited.is_none() {
            let _ = monoio::time::timeout(grace, self.child.wait()).await;
        }
    }

    /// Ends the CLI and every command it started, now.
    pub async fn kill(&mut self) {
        let _ = self.child.kill_tree().await;
    }
}
