//! The PTY WebSocket (`pty_connect`, `/pty?session_id=` on the PTY port).
//!
//! One loop per connection, on the worker that accepted it: take the client's messages
//! that have arrived (input, resize, signal), send the session's output from this
//! connection's cursor, then wait for either. Output is pulled from the session's log
//! only as fast as this client takes it, and the terminal is read only as fast as the
//! slowest attached client takes it (`pty::Session::follow`): a client that keeps
//! reading loses nothing. One that takes nothing for `pty::stall()` while the terminal
//! waits on it is closed with 4008 and the others go on. Text dropped before a client
//! attached (the log keeps the newest 1 MiB while nobody is attached) is announced with
//! `event: dropped`.

use std::os::fd::AsFd;
use std::sync::Arc;

use monoio::net::TcpStream;
use serde_json::{json, Value};

use crate::api::{Group, Param};
use crate::app::{Endpoint, Upgraded};
use crate::http::websocket::{Received, WebSocket};
use crate::pty::Session;
use crate::runtime::ready::Readiness;

/// About the most output one `output` message carries (a single log entry may be a
/// little larger, up to one read of the terminal).
const MESSAGE_TEXT: usize = 64 * 1024;
/// Client messages taken per turn of the loop before output gets its turn.
const MESSAGES_PER_TURN: usize = 64;
/// How long keystrokes may wait for room in the terminal's input queue (a program that
/// reads nothing) before they are refused, so the socket keeps serving signals.
const INPUT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Close codes beyond the contract's 4001 (credentials) and 4003 (policy). 4004 is
/// also what another identity's session gets: it is not found for them.
const CLOSE_NORMAL: u16 = 1000;
const CLOSE_BAD_REQUEST: u16 = 4000;
const CLOSE_NO_SESSION: u16 = 4004;
/// A client that took no output for [`crate::pty::stall`] while the terminal waited.
const CLOSE_TOO_SLOW: u16 = 4008;
const CLOSE_INTERNAL: u16 = 1011;

pub fn endpoint() -> Endpoint {
    Endpoint::websocket(
        "/pty",
        Group::Terminal,
        Arc::new(|upgraded, stream, leftover| Box::pin(serve(upgraded, stream, leftover))),
    )
    .id("pty_connect")
    .scopes(&["terminal:use"])
    .changes()
    .summary("PTY WebSocket on ABX_PTY_PORT (input, resize, signal; output and events).")
    .params(&[
        Param::query("session_id", "string", true)
            .doc("The session to attach to (POST /pty/sessions answers it in ws_url)."),
        Param::query("token", "string", false)
            .doc("The access token, for clients that cannot send headers on a WebSocket."),
    ])
}

async fn serve(upgraded: Upgraded, stream: TcpStream, leftover: Vec<u8>) {
    let mut ws = WebSocket::new(stream, leftover, upgraded.services().write_timeout);
    let owner = match &upgraded.admitted {
        Ok(identity) => identity.id.clone(),
        Err(refusal) => {
            let _ = ws.close(refusal.close_code, &refusal.reason).await;
            return;
        }
    };
    // Taken before anything else: a reload from here on is seen by the loop.
    let mut policy_seen = upgraded.reload_version();
    let id = match upgraded.args() {
        Ok(args) => args.string("session_id"),
        Err(refusal) => {
            let _ = ws.close(CLOSE_BAD_REQUEST, &refusal.message).await;
            return;
        }
    };
    let sessions = match upgraded.group_state::<crate::pty::Sessions>() {
        Ok(sessions) => sessions,
        Err(error) => {
            let _ = ws.close(CLOSE_INTERNAL, &error.message).await;
            return;
        }
    };
    // Another identity's session is closed exactly like an unknown one.
    let Some(session) = sessions.get(&id, &owner) else {
        let _ = ws
            .close(CLOSE_NO_SESSION, &format!("Session not found: {id}"))
            .await;
        return;
    };
    session.touch();
    let started =
        json!({"type": "event", "event": "started", "session_id": id, "pid": session.pid});
    if ws.send_text(started.to_string()).await.is_err() {
        return;
    }
    // From the oldest output kept: a client that reconnects gets what it missed. While
    // attached, the terminal is read no faster than this socket takes its output.
    let following = session.follow();
    // The wait for the client's next message lives across turns: output that wakes the
    // loop leaves it armed, where a wait made per turn was cancelled and made again for
    // every echo.
    let arrivals = match Readiness::new(ws.as_fd()) {
        Ok(arrivals) => arrivals,
        Err(error) => {
            let _ = ws.close(CLOSE_INTERNAL, &error.to_string()).await;
            return;
        }
    };
    let mut arrival = std::pin::pin!(arrivals.readable());
    let mut arrival_pending = true;
    let mut cursor = 0u64;
    let mut first_page = true;
    loop {
        if !arrival_pending {
            arrival.set(arrivals.readable());
            arrival_pending = true;
        }
        let seen = session.changed.version();
        if following.evicted() {
            let reason = format!(
                "too slow: the terminal's output waited {} s for this client",
                crate::pty::stall().as_secs()
            );
            let _ = ws.close(CLOSE_TOO_SLOW, &reason).await;
            return;
        }
        // Read before the output: the reader appends all output before it marks the
        // session exited, so an exit seen here means the page below has the last of it.
        let ended = session.has_exited() || sessions.get(&id, &owner).is_none();
        // A bounded batch of the client's messages, then output: a flood of pings or
        // keystrokes cannot hold the worker.
        let mut client_drained = false;
        for _ in 0..MESSAGES_PER_TURN {
            // Checked before every message: once a reload revokes the caller (or turns
            // the endpoint off), not one more keystroke reaches the terminal.
            if upgraded.reload_version() != policy_seen {
                policy_seen = upgraded.reload_version();
                if let Err(refusal) = upgraded.readmit() {
                    let _ = ws.close(refusal.close_code, &refusal.reason).await;
                    return;
                }
            }
            match ws.try_receive() {
                Ok(Some(Received::Text(text))) => {
                    if let Err(reply) = handle(&session, &text).await {
                        if ws.send_text(reply.to_string()).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(Some(Received::Binary(bytes))) => {
                    if let Err(reply) = give_input(&session, &bytes).await {
                        if ws.send_text(reply.to_string()).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(Some(Received::Closed)) | Err(_) => {
                    let _ = ws.flush().await;
                    return;
                }
                Ok(None) => {
                    client_drained = true;
                    break;
                }
            }
        }
        if ws.flush().await.is_err() {
            return;
        }
        let page = session.read(cursor, MESSAGE_TEXT);
        if page.dropped && !first_page {
            let notice = json!({"type": "event", "event": "dropped", "session_id": id});
            if ws.send_text(notice.to_string()).await.is_err() {
                return;
            }
        }
        first_page = false;
        let sent_output = !page.events.is_empty();
        let text: String = page.events.into_iter().map(|e| e.data).collect();
        if !text.is_empty() && send_output(&mut ws, text).await.is_err() {
            return;
        }
        cursor = page.next;
        following.took(cursor);
        if !client_drained {
            // More messages are waiting (perhaps already inside tungstenite, where a
            // readiness wait would not see them): let others run, then take them.
            crate::runtime::yield_now().await;
            continue;
        }
        if sent_output {
            continue;
        }
        if ended {
            let exited = json!({"type": "event", "event": "exited", "session_id": id});
            let _ = ws.send_text(exited.to_string()).await;
            let _ = ws.close(CLOSE_NORMAL, "session ended").await;
            return;
        }
        monoio::select! {
            ready = &mut arrival, if arrival_pending => {
                if ready.is_err() {
                    return;
                }
                arrival_pending = false;
                ws.readable_again();
            }
            _ = session.changed.changed(seen) => {}
            _ = upgraded.reloaded(policy_seen) => {}
        }
    }
}

/// Writes keystrokes, giving up after [`INPUT_WAIT`] when the terminal's input queue
/// stays full; `Err` is the `error` message to send back.
async fn give_input(session: &Session, data: &[u8]) -> Result<(), Value> {
    let deadline = std::time::Instant::now() + INPUT_WAIT;
    match session.input(data, deadline).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(
            json!({"type": "error", "message": "the terminal's input queue stayed full (the program is not reading); some input was not delivered"}),
        ),
        Err(e) => Err(
            json!({"type": "error", "message": format!("the terminal did not take the input: {e}")}),
        ),
    }
}

async fn send_output(ws: &mut WebSocket, data: String) -> std::io::Result<()> {
    ws.send_text(crate::pty::output_message(&data)).await
}

/// The message a keystroke comes in, read in place. Anything else (or anything odd:
/// a duplicate key, a `data` that is not a string) goes the general way, which words
/// the errors.
#[derive(serde::Deserialize)]
struct Input<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    data: std::borrow::Cow<'a, str>,
}

/// Applies one client message; `Err` is an `error` message to send back.
async fn handle(session: &Session, text: &str) -> Result<(), Value> {
    if let Ok(input) = serde_json::from_str::<Input>(text) {
        if input.kind == "input" {
            return give_input(session, input.data.as_bytes()).await;
        }
    }
    let error = |message: String| json!({"type": "error", "message": message});
    let message: Value =
        serde_json::from_str(text).map_err(|e| error(format!("messages are JSON objects: {e}")))?;
    match message.get("type").and_then(Value::as_str) {
        Some("input") => {
            let data = message
                .get("data")
                .and_then(Value::as_str)
                .ok_or_else(|| error("input needs data (a string)".into()))?;
            give_input(session, data.as_bytes()).await
        }
        Some("resize") => {
            let size = |name: &str| {
                message
                    .get(name)
                    .and_then(Value::as_u64)
                    .filter(|v| (1..=1000).contains(v))
                    .map(|v| v as u16)
                    .ok_or_else(|| error(format!("{name} must be an integer from 1 to 1000")))
            };
            let (cols, rows) = (size("cols")?, size("rows")?);
            session
                .resize(cols, rows)
                .map_err(|e| error(format!("resize failed: {e}")))
        }
        Some("signal") => {
            use rustix::process::Signal;
            let name = message.get("signal").and_then(Value::as_str).unwrap_or("");
            let signal = match name {
                "SIGINT" => Signal::INT,
                "SIGTERM" => Signal::TERM,
                "SIGKILL" => Signal::KILL,
                "SIGHUP" => Signal::HUP,
                "SIGQUIT" => Signal::QUIT,
                _ => {
                    return Err(error(format!(
                        "signal must be SIGINT, SIGTERM, SIGKILL, SIGHUP or SIGQUIT, not '{name}'"
                    )))
                }
            };
            session
                .signal(signal)
                .map_err(|e| error(format!("signal failed: {e}")))
        }
        other => Err(error(format!(
            "unknown message type {}: use input, resize or signal",
            other
                .map(|t| format!("'{t}'"))
                .unwrap_or_else(|| "(none)".into())
        ))),
    }
}
