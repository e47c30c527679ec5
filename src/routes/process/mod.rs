//! The process group: `/shell`, `/shell/stream` and background processes. Adapters
//! only: spawning, pipes, reaping and the process table are `crate::process`.

mod background;
mod shell;

use std::os::fd::OwnedFd;

use serde_json::{json, Value};

use crate::api::{ApiError, Group, Method, Param};
use crate::app::policy::pydumps::dumps_sorted;
use crate::app::{handler, Call, Endpoint};
use crate::process::shlex;
use crate::process::{Child, Spawn};
use crate::routes::shared::{command_refusal, spawn_error, working_dir, SHELL_MAX_OUTPUT_BYTES};

/// `timeout` when the caller sends none, or one that is not a positive number.
const DEFAULT_TIMEOUT_SECS: f64 = 300.0;
pub fn endpoints() -> Vec<Endpoint> {
    let run_params = || {
        vec![
            Param::body("command", "string", true)
                .blank_is_absent()
                .doc("The command line, split as shlex.split does; no shell runs it."),
            Param::body("cwd", "string", false)
                .doc("Working directory inside the allowed directories (default: the base)."),
            Param::body("env", "string_map", false)
                .doc("Variables added to the server's environment for this command."),
            Param::body("timeout", "number", false)
                .above(0.0)
                .lenient()
                .default("300")
                .doc("Seconds; a non-positive or non-numeric value is replaced with 300."),
        ]
    };
    let pid = Param::path("pid").doc("The pid /process/start answered.");
    let mut start_params = run_params();
    start_params.extend([
        Param::body("capture_output", "boolean", false)
            .doc("Keep stdout and stderr for GET /process/{pid}/output."),
        Param::body("stdin", "boolean", false)
            .doc("Keep stdin open for POST /process/{pid}/stdin."),
    ]);
    vec![
        Endpoint::new(
            Method::Post,
            "/shell",
            Group::Process,
            handler(shell::shell),
        )
        .id("shell")
        .scopes(&["process:run"])
        .enforces(&[
            "paths",
            "timeout_seconds",
            "max_output_bytes",
            "max_processes",
            "commands",
        ])
        .changes()
        .summary("Run a command (shlex-split, no shell) and return its output and exit code.")
        .returns(schema::shell)
        .also_answers(&[403, 503])
        .params(&run_params())
        .limit("timeout_seconds", DEFAULT_TIMEOUT_SECS as u64)
        .limit("max_output_bytes", SHELL_MAX_OUTPUT_BYTES),
        Endpoint::new(
            Method::Post,
            "/shell/stream",
            Group::Process,
            handler(shell::shell_stream),
        )
        .id("shell_stream")
        .scopes(&["process:run"])
        .enforces(&[
            "paths",
            "timeout_seconds",
            "max_output_bytes",
            "max_processes",
            "commands",
        ])
        .changes()
        .summary("Run a command and stream its output lines as server-sent events.")
        .streaming(true)
        .also_answers(&[403, 503])
        .params(&run_params())
        .limit("timeout_seconds", DEFAULT_TIMEOUT_SECS as u64)
        .limit("max_line_bytes", crate::process::run::MAX_LINE_BYTES),
        Endpoint::new(
            Method::Post,
            "/process/start",
            Group::Process,
            handler(background::start),
        )
        .id("process_start")
        .scopes(&["process:run"])
        .enforces(&[
            "paths",
            "commands",
            "timeout_seconds",
            "max_output_bytes",
            "max_processes",
        ])
        .changes()
        .summary("Start a background process, optionally capturing output and keeping stdin open.")
        .returns(schema::started)
        .also_answers(&[403, 429, 503])
        .params(&start_params)
        .limit("max_processes", crate::process::table::MAX_PROCESSES)
        .limit("max_output_bytes", crate::process::table::OUTPUT_CAP_BYTES),
        Endpoint::new(
            Method::Get,
            "/process/list",
            Group::Process,
            handler(background::list),
        )
        .id("process_list")
        .scopes(&["process:read"])
        .summary("Running background processes.")
        .returns(schema::list),
        Endpoint::new(
            Method::Get,
            "/process/{pid}",
            Group::Process,
            handler(background::get),
        )
        .id("process_detail")
        .formerly("process_get")
        .scopes(&["process:read"])
        .summary("State and exit code of a background process.")
        .returns(schema::process)
        .also_answers(&[404])
        .params(std::slice::from_ref(&pid)),
        Endpoint::new(
            Method::Post,
            "/process/{pid}/signal",
            Group::Process,
            handler(background::signal),
        )
        .id("process_signal")
        .scopes(&["process:manage"])
        .enforces(&["allowed_signals"])
        .changes()
        .summary(
            "Send SIGINT, SIGKILL, SIGTERM, SIGCONT or SIGTSTP to a background process's group.",
        )
        .returns(schema::signalled)
        .also_answers(&[403, 404])
        .params(&[
            pid.clone(),
            Param::body("signal", "integer", true)
                .missing(background::SIGNAL_INVALID)
                .invalid(background::SIGNAL_INVALID)
                .doc("2 (SIGINT), 9 (SIGKILL), 15 (SIGTERM), 18 (SIGCONT) or 20 (SIGTSTP)."),
        ]),
        Endpoint::new(
            Method::Post,
            "/process/{pid}/stdin",
            Group::Process,
            handler(background::stdin),
        )
        .id("process_stdin")
        .scopes(&["process:manage"])
        .changes()
        .summary("Write to (or close) the stdin of a process started with stdin: true.")
        .returns(schema::stdin)
        .also_answers(&[404, 409, 503])
        .watch_peer()
        .limit("max_wait_seconds", background::STDIN_WAIT.as_secs())
        .params(&[
            pid.clone(),
            Param::body("data", "string", false).doc("UTF-8 text to write."),
            Param::body("data_base64", "string", false)
                .doc("Bytes to write, in standard base64 (after data when both are given)."),
            Param::body("eof", "boolean", false)
                .doc("Close stdin after writing. One of data, data_base64 or eof is required."),
        ]),
        Endpoint::new(
            Method::Get,
            "/process/{pid}/output",
            Group::Process,
            handler(background::output),
        )
        .id("process_output")
        .scopes(&["process:read"])
        .summary("Captured output after a cursor, optionally waiting up to 30 s for more.")
        .returns(schema::output)
        .also_answers(&[404, 409])
        .params(&[
            pid,
            Param::query("since", "integer", false)
                .at_least(0.0)
                .default("0")
                .invalid("since must be a non-negative integer (a sequence number)")
                .doc("The sequence number to read from (the last answer's next)."),
            Param::query("wait", "number", false)
                .at_least(0.0)
                .default("0")
                .invalid("wait must be a number of seconds from 0 to 30")
                .doc("Seconds to wait for new output or the exit when there is none; at most 30."),
        ])
        .limit(
            "max_wait_seconds",
            crate::process::table::MAX_WAIT.as_secs(),
        ),
    ]
}

/// The fields `/shell`, `/shell/stream` and `/process/start` share, checked.
struct RunRequest {
    command: String,
    cwd: Option<String>,
    env: Vec<(String, String)>,
    /// Seconds, as the caller wrote them (for the timeout message).
    timeout: Value,
}

impl RunRequest {
    /// The shared fields, already checked against their declarations; what a type
    /// cannot say (a variable name with `=`, one that loads code) is checked here.
    fn parse(args: &crate::api::Args) -> Result<RunRequest, ApiError> {
        let env = args.pairs("env");
        for (name, value) in &env {
            if name.is_empty() || name.contains('=') || name.contains('\0') || value.contains('\0')
            {
                return Err(ApiError::bad_request(format!(
                    "env: '{name}' cannot be set (names must be non-empty without '=', and neither may contain NUL)"
                )));
            }
            // The server's own settings are not a caller's to change, for a child either
            // (as on the reference).
            if name.to_ascii_uppercase().starts_with("ABX_") {
                return Err(ApiError::new(
                    403,
                    "PolicyDenied",
                    format!("Environment variable '{name}' cannot be overwritten (ABX_* names are the server's own)"),
                )
                .with_code("env_var_denied"));
            }
            if crate::process::env::loads_code(name) {
                return Err(ApiError::bad_request(format!(
                    "env: '{name}' cannot be set: it makes a program load code it was not asked to run (LD_*, DYLD_*, BASH_ENV, ENV, NODE_OPTIONS, PYTHONPATH, ... : see docs/api.md)"
                ))
                .with_code("variable_not_allowed"));
            }
        }
        Ok(RunRequest {
            command: args.string("command"),
            cwd: args.str("cwd").map(str::to_string),
            env,
            timeout: args
                .value("timeout")
                .cloned()
                .unwrap_or(json!(DEFAULT_TIMEOUT_SECS as u64)),
        })
    }

    fn timeout_secs(&self) -> f64 {
        self.timeout.as_f64().unwrap_or(DEFAULT_TIMEOUT_SECS)
    }

    /// The contract's timeout error, naming the seconds as the caller wrote them.
    fn timed_out(&self) -> ApiError {
        ApiError::internal(
            "TimeoutError",
            format!("Command timed out after {}s", dumps_sorted(&self.timeout)),
        )
    }

    /// The timeout as the policy allows it: the error names the seconds that applied.
    fn with_timeout(mut self, seconds: f64) -> RunRequest {
        if (seconds - self.timeout_secs()).abs() > f64::EPSILON {
            self.timeout = serde_json::Number::from_f64(seconds)
                .map(|n| {
                    if seconds.fract() == 0.0 {
                        json!(seconds as u64)
                    } else {
                        Value::Number(n)
                    }
                })
                .unwrap_or(self.timeout);
        }
        self
    }
}

/// The policy's `commands` rule for this endpoint: `deny` globs refuse a program,
/// and with `allow` only programs matching one of its globs run. A glob is matched
/// against argv[0] as given and against its last path component, so `rm` catches
/// `/bin/rm` too. 403 `command_not_allowed` otherwise.
async fn check_command(call: &Call, argv: &[String]) -> Result<(), ApiError> {
    command_refusal(call.decision(), &call.spec().id, argv).map_or(Ok(()), Err)?;
    let program = argv.first().cloned().unwrap_or_default();
    // Finding the program and its real path are filesystem lookups: on the pool.
    let protected = crate::runtime::blocking(move || under_system_tree(&program))
        .await
        .unwrap_or(false);
    if protected {
        return Err(ApiError::new(
            403,
            "PolicyDenied",
            format!(
                "Executable '{}' resolves under a protected directory (/proc, /sys, /dev): the server's own binary and the kernel's files are not programs to run",
                argv.first().map(String::as_str).unwrap_or_default()
            ),
        )
        .with_code("process_denied"));
    }
    Ok(())
}

/// Whether `program` (looked up on `PATH` when it has no `/`) is, or resolves to, a
/// file under `/proc`, `/sys` or `/dev` (as the reference's process guard refuses) or
/// this server's own binary: `/proc/self/exe`, or a link to it, would start another
/// server with the caller's arguments and the server's environment.
fn under_system_tree(program: &str) -> bool {
    use std::path::{Component, Path, PathBuf};
    let looked_up: PathBuf = if program.contains('/') {
        PathBuf::from(program)
    } else {
        std::env::var_os("PATH")
            .and_then(|path| {
                std::env::split_paths(&path)
                    .map(|dir| dir.join(program))
                    .find(|candidate| candidate.is_file())
            })
            .unwrap_or_else(|| PathBuf::from(program))
    };
    let under = |path: &Path| {
        let mut normal = PathBuf::from("/");
        for component in path.components() {
            match component {
                Component::ParentDir => {
                    normal.pop();
                }
                Component::Normal(part) => normal.push(part),
                _ => {}
            }
        }
        ["/proc", "/sys", "/dev"]
            .iter()
            .any(|root| normal.starts_with(root))
    };
    let absolute = match looked_up.is_absolute() {
        true => looked_up.clone(),
        false => std::env::current_dir().unwrap_or_default().join(&looked_up),
    };
    // A link to /proc/self/exe resolves (as the reference resolves it) to this
    // server's binary: that is refused too, whatever path leads to it.
    let own = std::env::current_exe().ok();
    under(&absolute)
        || std::fs::canonicalize(&absolute)
            .is_ok_and(|real| under(&real) || own.as_deref() == Some(real.as_path()))
}

/// The seconds a run may take: the caller's (or the default), no more than the
/// policy's `timeout_seconds`, which is also the default when the caller gives none.
fn effective_timeout(call: &Call, request: &RunRequest, given: bool) -> f64 {
    match call.decision().knob_seconds("timeout_seconds") {
        Some(cap) if given => request.timeout_secs().min(cap),
        Some(cap) => cap,
        None => request.timeout_secs(),
    }
}

/// A shlex failure, with the status each route gives it (500 on `/shell`, 400 else).
fn split(command: &str, status: u16) -> Result<Vec<String>, ApiError> {
    shlex::split(command).map_err(|e| ApiError::new(status, "ValueError", e.0))
}

/// Spawns `argv`; an `exec` failure is a 500 named like Python's `Popen` exception.
async fn spawn(
    call: &Call,
    argv: Vec<String>,
    request: &RunRequest,
    stdin: bool,
    capture: bool,
) -> Result<Child, ApiError> {
    let cwd = working_dir(call, request.cwd.as_deref()).await?;
    spawn_in(call, argv, request, cwd, stdin, capture).await
}

/// Spawns `argv` in the working directory `cwd` (from [`working_dir`]).
async fn spawn_in(
    call: &Call,
    argv: Vec<String>,
    request: &RunRequest,
    cwd: OwnedFd,
    stdin: bool,
    capture: bool,
) -> Result<Child, ApiError> {
    let services = call.services();
    let program = argv[0].clone();
    let spec = Spawn {
        user: None,
        argv,
        cwd,
        env: services.environment.with(&request.env),
        stdin,
        capture,
        terminal: None,
    };
    Child::spawn(spec, &services.children)
        .await
        .map_err(|e| spawn_error(&e, &program))
}

/// JSON Schemas of the success bodies, for the OpenAPI document.
mod schema {
    use serde_json::{json, Value};

    use super::super::schema_object as object;

    fn process_properties() -> Value {
        json!({
            "pid": {"type": "integer"}, "command": {"type": "string"},
            "state": {"enum": ["running", "exited"]}, "started_at": {"type": "number"},
            "exit_code": {"type": ["integer", "null"]},
        })
    }
    pub fn shell() -> Value {
        object(
            &["stdout", "stderr", "exit_code"],
            json!({"stdout": {"type": "string"}, "stderr": {"type": "string"}, "exit_code": {"type": "integer"}, "truncated": {"type": "boolean"}}),
        )
    }
    pub fn started() -> Value {
        object(
            &["pid", "command"],
            json!({"pid": {"type": "integer"}, "command": {"type": "string"}}),
        )
    }
    pub fn list() -> Value {
        let row = object(
            &["pid", "command", "state", "started_at"],
            process_properties(),
        );
        object(
            &["processes"],
            json!({"processes": {"type": "array", "items": row}}),
        )
    }
    pub fn process() -> Value {
        object(
            &["pid", "command", "state", "started_at", "exit_code"],
            process_properties(),
        )
    }
    pub fn signalled() -> Value {
        object(
            &["pid", "signal"],
            json!({"pid": {"type": "integer"}, "signal": {"type": "integer"}}),
        )
    }
    pub fn stdin() -> Value {
        object(
            &["pid", "written", "closed"],
            json!({"pid": {"type": "integer"}, "written": {"type": "integer"}, "closed": {"type": "boolean"}}),
        )
    }
    pub fn output() -> Value {
        let event = object(
            &["seq", "stream", "data"],
            json!({"seq": {"type": "integer"}, "stream": {"enum": ["stdout", "stderr"]}, "data": {"type": "string"}}),
        );
        object(
            &["pid", "events", "next", "state", "exit_code", "dropped"],
            json!({
                "pid": {"type": "integer"}, "events": {"type": "array", "items": event},
                "next": {"type": "integer"}, "state": {"enum": ["running", "exited"]},
                "exit_code": {"type": ["integer", "null"]}, "dropped": {"type": "boolean"},
            }),
        )
    }
}

/// The group's state: the table of background processes.
pub fn registrar() -> crate::app::Registrar {
    Box::new(|setup| setup.provide(std::sync::Arc::new(crate::process::ProcessTable::default())))
}
