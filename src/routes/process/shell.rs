//! `POST /shell` and `POST /shell/stream`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{check_command, effective_timeout, spawn, split, RunRequest};
use crate::api::ApiError;
use crate::app::Call;
use crate::http::{sse, BodyStream, LocalFuture, Response, JSON_CONTENT_TYPE};
use crate::process::output::Stream;
use crate::process::run::{run_to_end, timeout_duration, Lines, Outputs, RunEnd};
use crate::process::Child;
use crate::routes::shared::SHELL_MAX_OUTPUT_BYTES;

/// A comment line is sent after this much silence, so a vanished client is noticed
/// even when the connection itself cannot tell.
const HEARTBEAT: Duration = Duration::from_secs(15);

/// Outputs up to this size (both streams) are answered as one JSON document; larger
/// ones are escaped into the answer piece by piece from the captured text, so the
/// answer costs the output once rather than a copy as a JSON value and a serialised
/// body on top (64 MiB of output raised the peak resident set by 3.6 times its size).
const STREAM_ABOVE: usize = 1024 * 1024;
/// The most bytes of answer one piece carries.
const ANSWER_PIECE: usize = 256 * 1024;

/// `POST /shell`: run to completion and answer with both outputs and the exit code.
pub async fn shell(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let request = RunRequest::parse(&args)?;
    let seconds = effective_timeout(&call, &request, args.given("timeout"));
    let request = request.with_timeout(seconds);
    // Python's shlex failure escapes the handler here: the contract's 500.
    let argv = split(&request.command, 500)?;
    check_command(&call, &argv).await?;
    if let Some(refusal) = crate::routes::shared::protected_env_refusal(
        &call,
        request.env.iter().map(|(name, _)| name.as_str()),
    ) {
        return Err(refusal);
    }
    let child = spawn(&call, argv, &request, false, true).await?;
    let timeout = timeout_duration(request.timeout_secs());
    let max_output = call
        .decision()
        .knob_u64("max_output_bytes")
        .map_or(SHELL_MAX_OUTPUT_BYTES, |cap| cap as usize);
    match run_to_end(child, timeout, max_output).await {
        Ok(RunEnd::Completed(done)) if done.stdout.len() + done.stderr.len() <= STREAM_ABOVE => {
            let mut answer = json!({
                "stdout": done.stdout,
                "stderr": done.stderr,
                "exit_code": done.exit.0,
            });
            if done.truncated {
                answer["truncated"] = Value::Bool(true);
            }
            Ok(Response::ok(&answer))
        }
        Ok(RunEnd::Completed(done)) => Ok(Response::stream(
            200,
            JSON_CONTENT_TYPE,
            Box::new(ShellAnswer::new(done)),
        )),
        Ok(RunEnd::TimedOut) => Err(request.timed_out()),
        Err(error) => Err(crate::api::errno::os_error(&error, None)),
    }
}

/// `POST /shell/stream`: one event per output line as the child writes it, then
/// `exit` (or `error` on timeout). See `docs/api.md` for the event format.
pub async fn shell_stream(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let request = RunRequest::parse(&args)?;
    let seconds = effective_timeout(&call, &request, args.given("timeout"));
    let request = request.with_timeout(seconds);
    let argv = split(&request.command, 400)?;
    check_command(&call, &argv).await?;
    if let Some(refusal) = crate::routes::shared::protected_env_refusal(
        &call,
        request.env.iter().map(|(name, _)| name.as_str()),
    ) {
        return Err(refusal);
    }
    let (mut tx, rx) = sse::channel(64);
    // A program that cannot start is said on the stream, as the reference says it (the
    // client reads the stream's `error` event, not a JSON answer).
    let mut child = match spawn(&call, argv, &request, false, true).await {
        Ok(child) => child,
        // A refused cwd or command is the caller's error, answered as JSON; a program
        // that fails to start (a 500 from the spawn) is the stream's.
        Err(error) if error.status < 500 => return Err(error),
        Err(error) => {
            monoio::spawn(async move {
                let _ = tx.send("error", &json!({"error": error.message})).await;
            });
            return Ok(sse::response(rx));
        }
    };
    let outputs = Outputs::of(&mut child).map_err(|e| crate::api::errno::os_error(&e, None))?;
    let deadline = Instant::now() + timeout_duration(request.timeout_secs());
    let limit = call.decision().knob_u64("max_output_bytes");
    monoio::spawn(stream_lines(child, outputs, deadline, limit, tx));
    Ok(sse::response(rx))
}

/// Feeds the stream until the child has exited and both pipes are at end of file. The
/// child is owned here: when the client goes away this task ends and dropping the child
/// kills its process group.
async fn stream_lines(
    mut child: Child,
    mut outputs: Outputs,
    deadline: Instant,
    limit: Option<u64>,
    mut tx: sse::SseSender,
) {
    let mut lines = [Lines::default(), Lines::default()];
    // The policy's `max_output_bytes`: the lines sent (each with its newline) may not
    // exceed it; past it the group is killed and the stream says `output_limit`.
    let mut emitted: u64 = 0;
    let mut last_sent = Instant::now();
    loop {
        let now = Instant::now();
        if now >= deadline {
            return time_out(&mut child, &mut tx).await;
        }
        let wake = (deadline - now).min(HEARTBEAT.saturating_sub(last_sent.elapsed()));
        let next = monoio::select! {
            piece = outputs.next() => Next::Piece(piece),
            _ = monoio::time::sleep(wake) => Next::Tick,
            _ = tx.closed() => Next::ClientGone,
        };
        let (stream, text) = match next {
            Next::Piece(Some(Ok(piece))) => piece,
            // A pipe that failed was given up by `Outputs`; the other is still read.
            Next::Piece(Some(Err(_))) => continue,
            Next::Piece(None) => break,
            Next::Tick => {
                if last_sent.elapsed() >= HEARTBEAT {
                    if tx.send_raw(b": keep-alive\n\n".to_vec()).await.is_err() {
                        return;
                    }
                    last_sent = Instant::now();
                }
                continue;
            }
            // Returning drops the child, which kills its process group.
            Next::ClientGone => return,
        };
        let split = &mut lines[stream as usize];
        for line in split.push(&text) {
            emitted += line.len() as u64 + 1;
            if limit.is_some_and(|limit| emitted > limit) {
                return over_limit(&mut child, &mut tx).await;
            }
            if send_line(&mut tx, stream, line).await.is_err() {
                return;
            }
            // Only what was sent counts: a child printing without newlines still gets
            // its keep-alive comments.
            last_sent = Instant::now();
        }
    }
    for stream in [Stream::Stdout, Stream::Stderr] {
        if let Some(line) = lines[stream as usize].finish() {
            emitted += line.len() as u64 + 1;
            if limit.is_some_and(|limit| emitted > limit) {
                return over_limit(&mut child, &mut tx).await;
            }
            if send_line(&mut tx, stream, line).await.is_err() {
                return;
            }
        }
    }
    let exit = monoio::select! {
        exit = child.wait() => Some(exit),
        _ = monoio::time::sleep(deadline.saturating_duration_since(Instant::now())) => None,
        _ = tx.closed() => return,
    };
    match exit {
        Some(Ok(code)) => {
            let _ = tx.send("exit", &json!({"exit_code": code.0})).await;
        }
        Some(Err(error)) => {
            let _ = tx.send("error", &json!({"error": error.to_string()})).await;
        }
        None => time_out(&mut child, &mut tx).await,
    }
}

/// The output limit passed: kill the group, say so, and end with its exit, as the
/// reference does.
async fn over_limit(child: &mut Child, tx: &mut sse::SseSender) {
    let _ = child.kill().await;
    let _ = tx.send("error", &json!({"error": "output_limit"})).await;
    if let Ok(code) = child.wait().await {
        let _ = tx.send("exit", &json!({"exit_code": code.0})).await;
    }
}

/// The timeout passed: kill the group, say so (`timeout`, which the official client
/// turns into its `CommandTimeoutError`), and end with the exit, as the reference does.
async fn time_out(child: &mut Child, tx: &mut sse::SseSender) {
    let _ = child.kill().await;
    let _ = tx.send("error", &json!({"error": "timeout"})).await;
    if let Ok(code) = child.wait().await {
        let _ = tx.send("exit", &json!({"exit_code": code.0})).await;
    }
}

enum Next {
    Piece(Option<std::io::Result<(Stream, String)>>),
    Tick,
    ClientGone,
}

async fn send_line(
    tx: &mut sse::SseSender,
    stream: Stream,
    line: String,
) -> Result<(), sse::StreamClosed> {
    // `{"data": line}`, the reference's shape, which its client reads.
    tx.send(stream.name(), &json!({"data": line})).await
}

/// A `/shell` answer written from the captured outputs: `{"stdout":"…","stderr":"…",
/// "exit_code":N}` (and `"truncated":true`), byte for byte what serde_json writes for
/// the same object, escaped a piece at a time with its length known up front.
struct ShellAnswer {
    /// The text of each part, in order: literal JSON between the escaped strings.
    parts: [(Vec<u8>, bool); 5],
    part: usize,
    pos: usize,
    length: u64,
}

impl ShellAnswer {
    fn new(done: crate::process::run::Completed) -> ShellAnswer {
        let mut tail = format!("\",\"exit_code\":{}", done.exit.0);
        if done.truncated {
            tail.push_str(",\"truncated\":true");
        }
        tail.push('}');
        let parts = [
            (b"{\"stdout\":\"".to_vec(), false),
            (done.stdout.into_bytes(), true),
            (b"\",\"stderr\":\"".to_vec(), false),
            (done.stderr.into_bytes(), true),
            (tail.into_bytes(), false),
        ];
        let length = parts
            .iter()
            .map(|(text, escaped)| {
                if *escaped {
                    escaped_len(text)
                } else {
                    text.len() as u64
                }
            })
            .sum();
        ShellAnswer {
            parts,
            part: 0,
            pos: 0,
            length,
        }
    }

    /// Appends up to about [`ANSWER_PIECE`] bytes of the answer to `buf`.
    fn fill(&mut self, buf: &mut Vec<u8>) {
        while self.part < self.parts.len() && buf.len() < ANSWER_PIECE {
            let (text, escaped) = &self.parts[self.part];
            if !*escaped {
                buf.extend_from_slice(text);
                self.part += 1;
                continue;
            }
            // An escape is at most 6 bytes per input byte: take what surely fits.
            let take = ((ANSWER_PIECE - buf.len()) / 6).max(1);
            let end = (self.pos + take).min(text.len());
            escape_into(&text[self.pos..end], buf);
            self.pos = end;
            if self.pos == text.len() {
                // Gone once written: the answer holds each output only while it is sent.
                self.parts[self.part].0 = Vec::new();
                self.part += 1;
                self.pos = 0;
            }
        }
    }
}

impl BodyStream for ShellAnswer {
    fn length(&self) -> Option<u64> {
        Some(self.length)
    }

    fn next(&mut self, mut buf: Vec<u8>) -> LocalFuture<'_, std::io::Result<Option<Vec<u8>>>> {
        buf.clear();
        self.fill(&mut buf);
        let piece = (!buf.is_empty()).then_some(buf);
        Box::pin(std::future::ready(Ok(piece)))
    }
}

/// How serde_json writes a string's byte: `None` as it is, else its escape. Escapes are
/// ASCII and every other byte is copied, so text may be cut anywhere, even inside a
/// character.
fn escape(byte: u8) -> Option<&'static [u8]> {
    const CONTROL: [&[u8]; 32] = [
        b"\\u0000", b"\\u0001", b"\\u0002", b"\\u0003", b"\\u0004", b"\\u0005", b"\\u0006",
        b"\\u0007", b"\\b", b"\\t", b"\\n", b"\\u000b", b"\\f", b"\\r", b"\\u000e", b"\\u000f",
        b"\\u0010", b"\\u0011", b"\\u0012", b"\\u0013", b"\\u0014", b"\\u0015", b"\\u0016",
        b"\\u0017", b"\\u0018", b"\\u0019", b"\\u001a", b"\\u001b", b"\\u001c", b"\\u001d",
        b"\\u001e", b"\\u001f",
    ];
    match byte {
        0..=0x1f => Some(CONTROL[byte as usize]),
        b'"' => Some(b"\\\""),
        b'\\' => Some(b"\\\\"),
        _ => None,
    }
}

fn escaped_len(text: &[u8]) -> u64 {
    text.iter()
        .map(|&b| escape(b).map_or(1, <[u8]>::len) as u64)
        .sum()
}

fn escape_into(text: &[u8], out: &mut Vec<u8>) {
    let mut start = 0;
    for (i, &b) in text.iter().enumerate() {
        if let Some(escaped) = escape(b) {
            out.extend_from_slice(&text[start..i]);
            out.extend_from_slice(escaped);
            start = i + 1;
        }
    }
    out.extend_from_slice(&text[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::run::Completed;
    use crate::process::ExitCode;

    fn streamed(done: Completed) -> (Vec<u8>, u64) {
        let mut answer = ShellAnswer::new(done);
        let length = answer.length;
        let mut out = Vec::new();
        loop {
            let mut piece = Vec::new();
            answer.fill(&mut piece);
            if piece.is_empty() {
                return (out, length);
            }
            assert!(piece.len() <= ANSWER_PIECE + 64);
            out.extend_from_slice(&piece);
        }
    }

    #[test]
    fn the_streamed_answer_is_what_serde_json_writes() {
        let every_ascii: String = (0u8..128).map(char::from).collect();
        let text = format!("{every_ascii}é€😀 \u{7f}\u{2028}").repeat(5_000);
        for (stdout, stderr, truncated, code) in [
            (text.clone(), String::new(), false, 0),
            (String::new(), text.clone(), true, -9),
            (text.clone(), "e\"\\".into(), false, 3),
        ] {
            let mut expected = json!({"stdout": stdout, "stderr": stderr, "exit_code": code});
            if truncated {
                expected["truncated"] = json!(true);
            }
            let (out, length) = streamed(Completed {
                stdout,
                stderr,
                exit: ExitCode(code),
                truncated,
            });
            assert_eq!(out.len() as u64, length);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(&expected).unwrap()
            );
        }
    }
}
