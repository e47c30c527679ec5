//! `POST /shell` and `POST /shell/stream`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{check_command, effective_timeout, spawn, split, RunRequest, SHELL_MAX_OUTPUT_BYTES};
use crate::api::ApiError;
use crate::app::Call;
use crate::http::{sse, Response};
use crate::process::output::Stream;
use crate::process::run::{run_to_end, timeout_duration, Lines, Outputs, RunEnd};
use crate::process::Child;

/// A comment line is sent after this much silence, so a vanished client is noticed
/// even when the connection itself cannot tell.
const HEARTBEAT: Duration = Duration::from_secs(15);

/// `POST /shell`: run to completion and answer with both outputs and the exit code.
pub async fn shell(call: Call) -> Result<Response, ApiError> {
    let body: Value = call.json()?;
    let request = RunRequest::parse(&body)?;
    let seconds = effective_timeout(&call, &request, RunRequest::timeout_given(&body));
    let request = request.with_timeout(seconds);
    // Python's shlex failure escapes the handler here: the contract's 500.
    let argv = split(&request.command, 500)?;
    check_command(&call, &argv)?;
    let child = spawn(&call, argv, &request, false, true).await?;
    let timeout = timeout_duration(request.timeout_secs());
    let max_output = call
        .decision()
        .knob_u64("max_output_bytes")
        .map_or(SHELL_MAX_OUTPUT_BYTES, |cap| cap as usize);
    match run_to_end(child, timeout, max_output).await {
        Ok(RunEnd::Completed(done)) => {
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
        Ok(RunEnd::TimedOut) => Err(request.timed_out()),
        Err(error) => Err(crate::api::errno::os_error(&error, None)),
    }
}

/// `POST /shell/stream`: one event per output line as the child writes it, then
/// `exit` (or `error` on timeout). See `docs/api.md` for the event format.
pub async fn shell_stream(call: Call) -> Result<Response, ApiError> {
    let body: Value = call.json()?;
    let request = RunRequest::parse(&body)?;
    let seconds = effective_timeout(&call, &request, RunRequest::timeout_given(&body));
    let request = request.with_timeout(seconds);
    let argv = split(&request.command, 400)?;
    check_command(&call, &argv)?;
    let mut child = spawn(&call, argv, &request, false, true).await?;
    let outputs = Outputs::of(&mut child).map_err(|e| crate::api::errno::os_error(&e, None))?;
    let (tx, rx) = sse::channel(64);
    let deadline = Instant::now() + timeout_duration(request.timeout_secs());
    let timed_out = request.timed_out();
    monoio::spawn(stream_lines(child, outputs, deadline, timed_out, tx));
    Ok(Response::sse(rx))
}

/// Feeds the stream until the child has exited and both pipes are at end of file. The
/// child is owned here: when the client goes away this task ends and dropping the child
/// kills its process group.
async fn stream_lines(
    mut child: Child,
    mut outputs: Outputs,
    deadline: Instant,
    timed_out: ApiError,
    mut tx: sse::SseSender,
) {
    let mut lines = [Lines::default(), Lines::default()];
    let mut last_sent = Instant::now();
    loop {
        let now = Instant::now();
        if now >= deadline {
            return time_out(&mut child, &mut tx, &timed_out).await;
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
            let _ = tx
                .send(
                    "error",
                    &json!({"error": error.to_string(), "type": "OSError"}),
                )
                .await;
        }
        None => time_out(&mut child, &mut tx, &timed_out).await,
    }
}

/// The timeout passed: kill the group, then say so as the stream's last event.
async fn time_out(child: &mut Child, tx: &mut sse::SseSender, timed_out: &ApiError) {
    let _ = child.kill().await;
    let _ = tx
        .send(
            "error",
            &json!({"error": timed_out.message, "type": timed_out.kind}),
        )
        .await;
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
    tx.send(
        stream.name(),
        &json!({"stream": stream.name(), "line": line}),
    )
    .await
}
