//! `/process/*`: background processes, their stdin and their captured output.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{check_command, spawn_in, split, working_dir, RunRequest};
use crate::api::ApiError;
use crate::app::Call;
use crate::http::Response;
use crate::process::run::timeout_duration;
use crate::process::table::{Managed, StdinError, TableFull, MAX_PROCESSES};

/// The signals callers may send, as the contract lists them.
const ALLOWED_SIGNALS: [(i32, rustix::process::Signal); 5] = [
    (2, rustix::process::Signal::INT),
    (9, rustix::process::Signal::KILL),
    (15, rustix::process::Signal::TERM),
    (18, rustix::process::Signal::CONT),
    (20, rustix::process::Signal::TSTP),
];

/// `POST /process/start`.
pub async fn start(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let request = RunRequest::parse(&args)?;
    let capture = args.flag("capture_output");
    let stdin = args.flag("stdin");
    // A background process runs until it ends unless the caller asks for a limit (a
    // non-positive one is the contract's 300 s).
    let timeout = args
        .sent("timeout")
        .then(|| timeout_duration(request.timeout_secs()));
    let argv = split(&request.command, 400)?;
    check_command(&call, &argv)?;
    // A bad cwd is 403 even when the table is full.
    let cwd = working_dir(&call, request.cwd.as_deref()).await?;
    let table = &call.services().processes;
    let slot = table.reserve().map_err(|TableFull| {
        ApiError::new(
            429,
            "ResourceError",
            format!(
                "Too many processes: at most {MAX_PROCESSES} may run at once; wait for one to exit or signal one"
            ),
        )
    })?;
    let child = spawn_in(&call, argv, &request, cwd, stdin, capture).await?;
    let managed = table
        .insert(
            slot,
            child,
            &call.identity.id,
            request.command.clone(),
            capture,
            timeout,
        )
        .map_err(|e| crate::api::errno::os_error(&e, None))?;
    Ok(Response::ok(
        &json!({"pid": managed.pid, "command": managed.command}),
    ))
}

fn describe(managed: &Arc<Managed>) -> Value {
    let exit = managed.exit_code();
    json!({
        "pid": managed.pid,
        "command": managed.command,
        "state": if exit.is_some() { "exited" } else { "running" },
        "started_at": managed.started_at,
        "exit_code": exit.map(|c| c.0),
    })
}

/// `GET /process/list`.
pub async fn list(call: Call) -> Result<Response, ApiError> {
    let rows: Vec<Value> = call
        .services()
        .processes
        .list_running()
        .iter()
        .filter(|m| m.owner == call.identity.id)
        .map(|m| {
            json!({"pid": m.pid, "command": m.command, "state": "running", "started_at": m.started_at})
        })
        .collect();
    Ok(Response::ok(&json!({ "processes": rows })))
}

/// The row named by the `{pid}` segment: 400 when it is not an integer, 404 when this
/// server did not start it, or another identity did (a foreign pid is answered exactly
/// like an unknown one, so its existence does not show).
fn row(call: &Call) -> Result<Arc<Managed>, ApiError> {
    let text = call.path_param("pid").unwrap_or_default();
    let pid: i32 = text
        .parse()
        .map_err(|_| ApiError::bad_request(format!("pid must be an integer, not '{text}'")))?;
    let owned = |m: &Arc<Managed>| m.owner == call.identity.id;
    call.services().processes.get(pid).filter(owned).ok_or_else(|| {
        ApiError::new(
            404,
            "ValueError",
            format!("Process {pid} not found: this server did not start it (or it was dropped from the table)"),
        )
    })
}

/// `GET /process/{pid}`.
pub async fn get(call: Call) -> Result<Response, ApiError> {
    Ok(Response::ok(&describe(&row(&call)?)))
}

/// `POST /process/{pid}/signal`.
pub async fn signal(call: Call) -> Result<Response, ApiError> {
    let body: Value = call.json()?;
    let text = call.path_param("pid").unwrap_or_default();
    let pid: i32 = text
        .parse()
        .map_err(|_| ApiError::bad_request(format!("pid must be an integer, not '{text}'")))?;
    let number = body
        .get("signal")
        .filter(|v| !v.is_boolean())
        .and_then(Value::as_i64);
    let Some((number, signal)) =
        number.and_then(|n| ALLOWED_SIGNALS.iter().find(|(s, _)| i64::from(*s) == n))
    else {
        return Err(ApiError::bad_request(
            "signal must be one of 2 (SIGINT), 9 (SIGKILL), 15 (SIGTERM), 18 (SIGCONT), 20 (SIGTSTP)",
        ));
    };
    if pid == 1 || pid == std::process::id() as i32 {
        return Err(ApiError::new(
            403,
            "PermissionError",
            format!("Refusing to signal pid {pid}: it is the container's init or this server"),
        ));
    }
    let managed = row(&call)?;
    managed
        .signal(*signal)
        .map_err(|e| crate::api::errno::os_error(&e, None))?;
    Ok(Response::ok(&json!({"pid": pid, "signal": number})))
}

/// The longest a stdin write waits for the process to take its data (and for an
/// earlier write to the same process to finish).
pub const STDIN_WAIT: Duration = Duration::from_secs(5);

/// The fields of a stdin body, borrowed from it: the data is not copied until it is
/// decoded or joined, so a large write holds the body and one buffer at most.
#[derive(serde::Deserialize)]
struct StdinBody<'a> {
    #[serde(borrow, default)]
    data: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    data_base64: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    eof: Option<&'a serde_json::value::RawValue>,
}

/// A string field: `None` when absent or null, 400 `<name> must be a string` otherwise.
fn text_field<'a>(
    raw: Option<&'a serde_json::value::RawValue>,
    name: &str,
) -> Result<Option<std::borrow::Cow<'a, str>>, ApiError> {
    match raw.map(|r| r.get()) {
        None | Some("null") => Ok(None),
        Some(text) if text.starts_with('"') => serde_json::from_str(text)
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("{name} must be a string"))),
        Some(_) => Err(ApiError::bad_request(format!("{name} must be a string"))),
    }
}

/// `POST /process/{pid}/stdin`.
pub async fn stdin(call: Call) -> Result<Response, ApiError> {
    let body: StdinBody<'_> = call.json_borrowed()?;
    let managed = row(&call)?;
    let text = text_field(body.data, "data")?;
    let encoded = text_field(body.data_base64, "data_base64")?;
    let eof = match body.eof.map(|r| r.get()) {
        None | Some("null") => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(_) => return Err(ApiError::bad_request("eof must be a boolean")),
    };
    if text.is_none() && encoded.is_none() && eof.is_none() {
        return Err(ApiError::bad_request(
            "At least one of data, data_base64, or eof is required",
        ));
    }
    let decoded = match &encoded {
        Some(encoded) => Some(
            base64_simd::STANDARD
                .decode_to_vec(encoded.as_bytes())
                .map_err(|_| ApiError::bad_request("data_base64 is not valid base64"))?,
        ),
        None => None,
    };
    let data: std::borrow::Cow<'_, [u8]> = match (&text, decoded) {
        (Some(text), None) => std::borrow::Cow::Borrowed(text.as_bytes()),
        (None, Some(bytes)) => std::borrow::Cow::Owned(bytes),
        (Some(text), Some(bytes)) => {
            let mut joined = Vec::with_capacity(text.len() + bytes.len());
            joined.extend_from_slice(text.as_bytes());
            joined.extend_from_slice(&bytes);
            std::borrow::Cow::Owned(joined)
        }
        (None, None) => std::borrow::Cow::Borrowed(&[]),
    };
    let pid = managed.pid;
    match managed
        .write_stdin(&data, eof == Some(true), STDIN_WAIT)
        .await
    {
        Ok(done) => Ok(Response::ok(
            &json!({"pid": pid, "written": done.written, "closed": done.closed}),
        )),
        Err(StdinError::NotEnabled) => Err(ApiError::new(
            409,
            "ValueError",
            format!("stdin of process {pid} is not enabled: start it with \"stdin\": true"),
        )),
        Err(StdinError::Closed) => Err(ApiError::new(
            409,
            "ValueError",
            format!("stdin of process {pid} is closed"),
        )),
        Err(StdinError::Full { busy }) => Err(ApiError::new(
            503,
            "BlockingIOError",
            if busy {
                format!(
                    "stdin of process {pid} was busy with another write for {}s; nothing was written, retry",
                    STDIN_WAIT.as_secs()
                )
            } else {
                format!(
                    "stdin of process {pid} took nothing in {}s (the process is not reading it); nothing was written, retry later",
                    STDIN_WAIT.as_secs()
                )
            },
        )
        .with_code("stdin_full")
        .with_header("Retry-After", "1")),
        Err(StdinError::Io(error)) => Err(crate::api::errno::os_error(&error, None)),
    }
}

/// `GET /process/{pid}/output`.
pub async fn output(call: Call) -> Result<Response, ApiError> {
    let managed = row(&call)?;
    let since = match call.query("since") {
        None => 0,
        Some(text) => text.trim().parse::<u64>().map_err(|_| {
            ApiError::bad_request("since must be a non-negative integer (a sequence number)")
        })?,
    };
    let wait = match call.query("wait") {
        None => 0.0,
        Some(text) => text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|w| w.is_finite() && *w >= 0.0)
            .ok_or_else(|| {
                ApiError::bad_request("wait must be a number of seconds from 0 to 30")
            })?,
    };
    let wait = Duration::from_secs_f64(wait.min(30.0));
    let pid = managed.pid;
    let Some(read) = managed.read_output(since, wait).await else {
        return Err(ApiError::new(
            409,
            "ValueError",
            format!(
                "Output of process {pid} is not captured: start it with \"capture_output\": true"
            ),
        ));
    };
    let events: Vec<Value> = read
        .page
        .events
        .iter()
        .map(|e| json!({"seq": e.seq, "stream": e.stream.name(), "data": e.data}))
        .collect();
    Ok(Response::ok(&json!({
        "pid": pid,
        "events": events,
        "next": read.page.next,
        "state": if read.exit.is_some() { "exited" } else { "running" },
        "exit_code": read.exit.map(|c| c.0),
        "dropped": read.page.dropped,
    })))
}
