//! `/process/*`: background processes, their stdin and their captured output.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{check_command, spawn_in, split, RunRequest};
use crate::api::ApiError;
use crate::app::Call;
use crate::http::Response;
use crate::process::run::timeout_duration;
use crate::process::table::{Managed, StdinError, TableFull, MAX_PROCESSES, OUTPUT_CAP_BYTES};
use crate::process::ProcessTable;
use crate::routes::shared::working_dir;

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
    // The policy's timeout_seconds bounds every background process, asked for or not.
    let timeout = match call.decision().knob_seconds("timeout_seconds") {
        Some(cap) => Some(timeout.map_or(Duration::from_secs_f64(cap), |asked| {
            asked.min(Duration::from_secs_f64(cap))
        })),
        None => timeout,
    };
    let argv = split(&request.command, 400)?;
    check_command(&call, &argv).await?;
    if let Some(refusal) = crate::routes::shared::protected_env_refusal(
        &call,
        request.env.iter().map(|(name, _)| name.as_str()),
    ) {
        return Err(refusal);
    }
    // A bad cwd is 403 even when the table is full.
    let cwd = working_dir(&call, request.cwd.as_deref()).await?;
    let table = call.group_state::<ProcessTable>()?;
    let most = call
        .decision()
        .knob_u64("max_processes")
        .map_or(MAX_PROCESSES, |most| (most as usize).min(MAX_PROCESSES));
    let slot = table.reserve(most).map_err(|TableFull| {
        ApiError::new(
            429,
            "ResourceError",
            format!(
                "Too many processes: at most {most} may run at once; wait for one to exit or signal one"
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
            // The policy's max_output_bytes lowers what is kept of the output.
            capture.then(|| {
                call.decision()
                    .knob_u64("max_output_bytes")
                    .map_or(OUTPUT_CAP_BYTES, |most| {
                        (most as usize).min(OUTPUT_CAP_BYTES)
                    })
            }),
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
        .group_state::<ProcessTable>()?
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
    call.group_state::<ProcessTable>()?.get(pid).filter(owned).ok_or_else(|| {
        ApiError::new(
            404,
            "NotFoundError",
            format!("Process {pid} not found: this server did not start it (or it was dropped from the table)"),
        )
    })
}

/// `GET /process/{pid}`.
pub async fn get(call: Call) -> Result<Response, ApiError> {
    Ok(Response::ok(&describe(&row(&call)?)))
}

/// The refusal for a `signal` that is not one of [`ALLOWED_SIGNALS`].
pub const SIGNAL_INVALID: &str =
    "Signal not allowed: signal must be one of 2 (SIGINT), 9 (SIGKILL), 15 (SIGTERM), 18 (SIGCONT), 20 (SIGTSTP)";

/// `POST /process/{pid}/signal`.
pub async fn signal(call: Call) -> Result<Response, ApiError> {
    let text = call.path_param("pid").unwrap_or_default();
    let pid: i32 = text
        .parse()
        .map_err(|_| ApiError::bad_request(format!("pid must be an integer, not '{text}'")))?;
    let args = call.args()?;
    let number = args.int("signal");
    let Some((number, signal)) =
        number.and_then(|n| ALLOWED_SIGNALS.iter().find(|(s, _)| i64::from(*s) == n))
    else {
        return Err(ApiError::bad_request(SIGNAL_INVALID));
    };
    // The policy's `allowed_signals` narrows the contract's five.
    if let Some(allowed) = call.decision().knob_numbers("allowed_signals") {
        if !allowed.contains(&i64::from(*number)) {
            return Err(ApiError::new(
                403,
                "PolicyDenied",
                format!("Signal {number} is not permitted by policy (endpoints.process_signal.params.allowed_signals: {allowed:?})"),
            )
            .with_code("signal_not_allowed"));
        }
    }
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

/// `POST /process/{pid}/stdin`.
pub async fn stdin(mut call: Call) -> Result<Response, ApiError> {
    let managed = row(&call)?;
    let mut args = call.args()?;
    // The data is in its field now: the body goes, so a large write holds the data once,
    // and once more decoded or joined at most.
    drop(call.take_body());
    let text = args.take("data");
    let text = text.as_ref().and_then(Value::as_str);
    let encoded = args.take("data_base64");
    let encoded = encoded.as_ref().and_then(Value::as_str);
    let eof = args.bool("eof");
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
    let data: std::borrow::Cow<'_, [u8]> = match (text, decoded) {
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
    let args = call.args()?;
    let since = args.uint("since").unwrap_or(0);
    let wait = Duration::from_secs_f64(args.number("wait").unwrap_or(0.0).min(30.0));
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
