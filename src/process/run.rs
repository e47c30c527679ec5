//! A child's output as it happens, and the run-to-completion that `/shell` needs.

use std::io;
use std::time::Duration;

use super::child::{Child, ExitCode};
use super::output::Stream;
use super::pipe::TextReader;

/// The longest line `/shell/stream` holds back waiting for its newline; a longer one is
/// sent in pieces of this size, so a child that never writes a newline cannot make the
/// server buffer without bound.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// The most [`Outputs::take_ready`] takes from one pipe: Linux's largest default pipe
/// buffer (`/proc/sys/fs/pipe-max-size`).
pub const TAKE_READY_LIMIT: usize = 1024 * 1024;

/// Timeouts beyond this are treated as this (about 31 years): large enough to mean
/// "never", small enough for every clock.
const LONGEST_TIMEOUT_SECS: f64 = 1e9;

/// A caller's `timeout` in seconds as a duration, clamped to what clocks can hold.
pub fn timeout_duration(seconds: f64) -> Duration {
    Duration::from_secs_f64(seconds.clamp(0.0, LONGEST_TIMEOUT_SECS))
}

/// Both output pipes of a child, read as text in arrival order (each pipe's own order
/// kept).
pub struct Outputs {
    stdout: Option<TextReader>,
    stderr: Option<TextReader>,
}

impl Outputs {
    /// Takes the child's stdout and stderr pipes (if it has them). Must run on a worker.
    pub fn of(child: &mut Child) -> io::Result<Outputs> {
        Ok(Outputs {
            stdout: child.stdout.take().map(TextReader::new).transpose()?,
            stderr: child.stderr.take().map(TextReader::new).transpose()?,
        })
    }

    /// Whether both pipes are at end of file.
    pub fn is_done(&self) -> bool {
        let done = |r: &Option<TextReader>| r.as_ref().is_none_or(TextReader::is_done);
        done(&self.stdout) && done(&self.stderr)
    }

    /// The next piece of text from either pipe, or `None` once both are at end of file.
    /// Cancel-safe: text is consumed only when it is returned.
    pub async fn next(&mut self) -> Option<io::Result<(Stream, String)>> {
        async fn one(reader: &mut Option<TextReader>) -> io::Result<Option<String>> {
            match reader {
                Some(r) if !r.is_done() => r.next().await,
                _ => std::future::pending().await,
            }
        }
        loop {
            if self.is_done() {
                return None;
            }
            let (stream, result) = monoio::select! {
                r = one(&mut self.stdout) => (Stream::Stdout, r),
                r = one(&mut self.stderr) => (Stream::Stderr, r),
            };
            match result {
                Ok(Some(text)) => return Some(Ok((stream, text))),
                Ok(None) => {}
                // A pipe that cannot be read is given up; the other one is still read,
                // so the child never blocks on it.
                Err(e) => {
                    match stream {
                        Stream::Stdout => self.stdout = None,
                        Stream::Stderr => self.stderr = None,
                    }
                    return Some(Err(e));
                }
            }
        }
    }

    /// What is readable right now from both pipes, without waiting: at most
    /// [`TAKE_READY_LIMIT`] bytes per pipe, which covers a full pipe buffer (what a
    /// process that just exited can have left there), so a descendant that keeps writing
    /// cannot hold the caller in this loop.
    pub fn take_ready(&mut self) -> io::Result<Vec<(Stream, String)>> {
        let mut out = Vec::new();
        for (stream, reader) in [
            (Stream::Stdout, &mut self.stdout),
            (Stream::Stderr, &mut self.stderr),
        ] {
            if let Some(reader) = reader {
                let mut taken = 0;
                while taken < TAKE_READY_LIMIT {
                    match reader.next_now()? {
                        Some(text) if !text.is_empty() => {
                            taken += text.len();
                            out.push((stream, text));
                        }
                        _ => break,
                    }
                }
            }
        }
        Ok(out)
    }
}

/// What `/shell` answers with.
#[derive(Debug)]
pub struct Completed {
    pub stdout: String,
    pub stderr: String,
    pub exit: ExitCode,
    /// Output beyond the cap was read and discarded.
    pub truncated: bool,
}

/// How a run to completion ended.
#[derive(Debug)]
pub enum RunEnd {
    Completed(Completed),
    /// The timeout passed; the process group was killed and reaped.
    TimedOut,
}

/// Reads both pipes to their end and waits for the child, as Python's
/// `subprocess.run(capture_output=True, timeout=...)` does, keeping at most
/// `max_output` bytes of each stream (the rest is read and dropped, so the child never
/// blocks on a full pipe). On timeout the whole process group is killed.
pub async fn run_to_end(
    mut child: Child,
    timeout: Duration,
    max_output: usize,
) -> io::Result<RunEnd> {
    let mut outputs = Outputs::of(&mut child)?;
    let mut completed = Completed {
        stdout: String::new(),
        stderr: String::new(),
        exit: ExitCode(0),
        truncated: false,
    };
    let work = async {
        while let Some(piece) = outputs.next().await {
            let (stream, text) = piece?;
            let kept = match stream {
                Stream::Stdout => &mut completed.stdout,
                Stream::Stderr => &mut completed.stderr,
            };
            let room = max_output.saturating_sub(kept.len());
            if text.len() <= room {
                kept.push_str(&text);
            } else {
                let mut cut = room;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                kept.push_str(&text[..cut]);
                completed.truncated = true;
            }
        }
        child.wait().await
    };
    let finished = monoio::select! {
        exit = work => Some(exit),
        _ = monoio::time::sleep(timeout) => None,
    };
    match finished {
        Some(exit) => {
            completed.exit = exit?;
            Ok(RunEnd::Completed(completed))
        }
        None => {
            child.kill().await?;
            Ok(RunEnd::TimedOut)
        }
    }
}

/// Splits text into lines (the newline stripped), holding back an unfinished line.
#[derive(Default)]
pub struct Lines {
    partial: String,
}

impl Lines {
    /// The lines `text` completes; a line that grows past [`MAX_LINE_BYTES`] without a
    /// newline comes out in pieces of that size.
    pub fn push(&mut self, text: &str) -> Vec<String> {
        let mut lines = Vec::new();
        let mut rest = text;
        while let Some(end) = rest.find('\n') {
            self.partial.push_str(&rest[..end]);
            lines.push(std::mem::take(&mut self.partial));
            rest = &rest[end + 1..];
        }
        self.partial.push_str(rest);
        while self.partial.len() > MAX_LINE_BYTES {
            let mut cut = MAX_LINE_BYTES;
            while !self.partial.is_char_boundary(cut) {
                cut -= 1;
            }
            let tail = self.partial.split_off(cut);
            lines.push(std::mem::replace(&mut self.partial, tail));
        }
        lines
    }

    /// The unfinished last line, if any, at end of file.
    pub fn finish(&mut self) -> Option<String> {
        (!self.partial.is_empty()).then(|| std::mem::take(&mut self.partial))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_join_across_pieces_and_long_lines_are_cut() {
        let mut lines = Lines::default();
        assert_eq!(lines.push("a\nb"), ["a"]);
        assert_eq!(lines.push("c\n\nd"), ["bc", ""]);
        assert_eq!(lines.finish().as_deref(), Some("d"));
        assert_eq!(lines.finish(), None);
        let long = "x".repeat(MAX_LINE_BYTES * 2 + 5);
        let pieces = lines.push(&long);
        assert_eq!(pieces.len(), 2);
        assert!(pieces.iter().all(|p| p.len() == MAX_LINE_BYTES));
        assert_eq!(lines.finish().map(|s| s.len()), Some(5));
    }
}
