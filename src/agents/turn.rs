//! One turn of a CLI: spawned through the one spawn path (own process group, in the
//! base directory), the prompt written to its stdin, its stdout read line by line on
//! the worker's driver and turned into [`AgentEvent`]s. A turn that ends without
//! saying how (the CLI crashed, or was killed by a cancel) ends with a `Failed` event
//! carrying the exit status and the last line of stderr.

use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::{AgentEvent, Runtime};
use crate::process::output::Stream;
use crate::process::run::{Lines, Outputs};
use crate::process::{pipe, Child, ChildRegistry, Spawn};

/// Longest stderr kept for the failure message.
const STDERR_KEPT: usize = 2048;

/// A running turn.
pub struct Turn {
    runtime: Runtime,
    child: Child,
    outputs: Outputs,
    stdout_lines: Lines,
    pending: std::collections::VecDeque<AgentEvent>,
    stderr_tail: String,
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
            child,
            outputs,
            stdout_lines: Lines::default(),
            pending: Default::default(),
            stderr_tail: String::new(),
            ended: false,
        })
    }

    /// The CLI's process group, for a cancel.
    pub fn pgid(&self) -> i32 {
        self.child.pid()
    }

    /// The next event; `None` after the turn's last one.
    pub async fn next(&mut self) -> Option<AgentEvent> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                if matches!(event, AgentEvent::Completed(_) | AgentEvent::Failed(_)) {
                    self.ended = true;
                }
                return Some(event);
            }
            if self.ended {
                return None;
            }
            match self.outputs.next().await {
                Some(Ok((Stream::Stdout, text))) => {
                    for line in self.stdout_lines.push(&text) {
                        self.pending.extend(self.runtime.parse_line(&line));
                    }
                }
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
                None => {
                    if let Some(line) = self.stdout_lines.finish() {
                        self.pending.extend(self.runtime.parse_line(&line));
                    }
                    if self
                        .pending
                        .iter()
                        .any(|e| matches!(e, AgentEvent::Completed(_) | AgentEvent::Failed(_)))
                    {
                        continue;
                    }
                    let status = match self.child.wait().await {
                        Ok(code) if code.0 < 0 => format!("was killed by signal {}", -code.0),
                        Ok(code) => format!("exited with status {}", code.0),
                        Err(e) => format!("could not be waited for: {e}"),
                    };
                    let last = self
                        .stderr_tail
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or("")
                        .to_string();
                    let program = self.runtime.cli().map_or("the CLI", |c| c.program);
                    let mut message = format!("{program} {status} without finishing the turn");
                    if !last.is_empty() {
                        message.push_str(": ");
                        message.push_str(&last);
                    }
                    self.pending.push_back(AgentEvent::Failed(message));
                }
            }
        }
    }

    /// Ends the CLI's whole process group now.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}
