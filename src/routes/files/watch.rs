//! `GET /files/watch`: server-sent events for changes below a directory. The waiting
//! happens on the worker's event loop (see `crate::fs::watch`), so open watches hold no
//! blocking-pool thread.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::take_string;
use crate::api::{ApiError, Args};
use crate::app::Call;
use crate::fs::resolve::Kind;
use crate::fs::watch::{Change, WatchEnd, Watcher, MAX_TRACKED};
use crate::fs::FsError;
use crate::http::{sse, Response};
use crate::routes::shared::{confine_followed, fs_error};

/// A comment line is sent after this much silence, so a vanished client is noticed.
const HEARTBEAT: Duration = Duration::from_secs(15);

/// A declared number of seconds (positive, with its default), clamped to `min..=max`.
fn seconds(args: &Args, name: &str, min: f64, max: f64) -> Duration {
    Duration::from_secs_f64(args.number(name).unwrap_or(min).clamp(min, max))
}

/// A change as the reference sends it: `change` with `{type, path, is_dir}`, and the
/// entry's `name` beneath the watched directory besides.
fn changed(kind: &str, shown: &Path, name: &str, is_dir: bool) -> (&'static str, Value) {
    let path = if name.is_empty() {
        shown.to_path_buf()
    } else {
        shown.join(name)
    };
    (
        "change",
        json!({"type": kind, "path": path.to_string_lossy(), "is_dir": is_dir, "name": name}),
    )
}

fn event(shown: &Path, change: Change) -> (&'static str, Value) {
    match change {
        Change::Created(name, entry) => {
            changed("created", shown, &name, entry.kind == Kind::Directory)
        }
        Change::Modified(name, entry) => {
            changed("modified", shown, &name, entry.kind == Kind::Directory)
        }
        Change::Deleted(name, kind) => changed("deleted", shown, &name, kind == Kind::Directory),
        Change::Overflow => (
            "overflow",
            json!({"path": shown.to_string_lossy(), "tracked": MAX_TRACKED}),
        ),
    }
}

pub async fn watch(call: Call) -> Result<Response, ApiError> {
    let mut args = call.args()?;
    let input = take_string(&mut args, "path");
    let recursive = args.flag("recursive");
    let interval = seconds(&args, "interval", 0.1, 5.0);
    // The policy's max_duration_seconds caps what the caller asks (the contract's words).
    let most = call
        .decision()
        .knob_seconds("max_duration_seconds")
        .map_or(86_400.0, |cap| cap.min(86_400.0));
    let timeout = seconds(&args, "timeout", 0.1, most);
    let caller = confine_followed(&call, &input).await?;
    let shown = caller.display();
    let (mut tx, rx) = sse::channel(64);
    match Watcher::start(&call.services().base, caller, recursive, interval).await {
        Ok(watcher) => {
            monoio::spawn(stream_changes(watcher, recursive, interval, timeout, tx));
        }
        // What the caller asked for is wrong (missing, not a directory, outside): an
        // HTTP error. The directory exists but could not be read: the stream starts and
        // says so, as it did before this answer was decided.
        Err(error @ FsError::Io { .. }) => {
            monoio::spawn(async move {
                let _ = tx
                    .send(
                        "error",
                        &json!({"error": "the directory could not be read", "detail": error.to_string(), "path": shown}),
                    )
                    .await;
            });
        }
        Err(error) => return Err(fs_error(error)),
    }
    Ok(sse::response(rx))
}

async fn stream_changes(
    mut watcher: Watcher,
    recursive: bool,
    interval: Duration,
    timeout: Duration,
    mut tx: sse::SseSender,
) {
    let shown = watcher.caller().shown.clone();
    let started = Instant::now();
    let deadline = started + timeout;
    let ready = json!({
        "path": shown.to_string_lossy(),
        "recursive": recursive,
        "interval": interval.as_secs_f64(),
        "timeout": timeout.as_secs_f64(),
        "entries": watcher.tracked(),
        "truncated": watcher.truncated(),
        "inotify": watcher.uses_inotify(),
    });
    if tx.send("ready", &ready).await.is_err() {
        return;
    }
    let mut last_sent = Instant::now();
    loop {
        let now = Instant::now();
        if now >= deadline || tx.is_closed() {
            break;
        }
        let wait = HEARTBEAT.min(deadline - now);
        match watcher.next(wait).await {
            Ok(changes) if changes.is_empty() => {}
            Ok(changes) => {
                for change in changes {
                    let (name, data) = event(&shown, change);
                    if tx.send(name, &data).await.is_err() {
                        return;
                    }
                }
                last_sent = Instant::now();
            }
            Err(WatchEnd::RootGone) => {
                let (name, data) = changed("deleted", &shown, "", true);
                let _ = tx.send(name, &data).await;
                let _ = tx.send("end", &json!({"reason": "deleted"})).await;
                return;
            }
            Err(WatchEnd::Failed(error)) => {
                let _ = tx
                    .send(
                        "error",
                        &json!({"path": shown.to_string_lossy(), "error": error.to_string()}),
                    )
                    .await;
                return;
            }
        }
        if last_sent.elapsed() >= HEARTBEAT {
            if tx.send_raw(b": keep-alive\n\n".to_vec()).await.is_err() {
                return;
            }
            last_sent = Instant::now();
        }
    }
    let _ = tx
        .send(
            "end",
            // Exactly the reference's: its own tests compare the whole event.
            &json!({"reason": "timeout"}),
        )
        .await;
}
