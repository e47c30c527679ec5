//! The k8s_runtime group: the runtime contract kubernetes-sigs/agent-sandbox's Python
//! client (`k8s-agent-sandbox`) speaks to a sandbox pod, on its own port
//! (`ABX_K8S_RUNTIME_PORT`, default 8888, the port the sandbox router forwards to).
//! Shapes follow the upstream reference runtime (`examples/python-runtime-sandbox/
//! main.py`); the work is the same code the other groups use: `process` for
//! `/execute`, the atomic upload for `/upload`, the `openat2` confinement for paths.

use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::pin::Pin;

use rustix::fs::{AtFlags, Mode, OFlags};
use serde_json::{json, Value};

use crate::api::{ApiError, Group, Listener, Method, Param};
use crate::app::endpoint::HandlerFuture;
use crate::app::{handler, sink_handler, Call, Endpoint, RawSink};
use crate::fs::read::open_file;
use crate::fs::resolve;
use crate::fs::write::SmallFirst;
use crate::fs::{BaseDir, CallerPath, FsError};
use crate::http::multipart::{self, Event, Scanner};
use crate::http::{LocalFuture, Response};
use crate::routes::shared::{
    check_extension, command_refusal, confine_followed, fs_error, holdable_body_length,
    refused_overwrite, run_program, working_dir, ProgramRun,
};
use crate::runtime::{blocking, AsyncFile, FileStream};

/// The reference runtime's default (`SANDBOX_EXEC_TIMEOUT_SECONDS`).
const DEFAULT_TIMEOUT_SECS: f64 = 300.0;

pub fn endpoints() -> Vec<Endpoint> {
    let path = Param::path("path").doc("A path beneath the base directory (percent-decoded).");
    let mut endpoints = vec![
        Endpoint::new(Method::Get, "/", Group::K8sRuntime, handler(health))
            .id("k8s_health").extension()
            .summary("Health of the runtime (the pod's probes; no token needed).")
            .auth_required(false),
        Endpoint::new(Method::Post, "/execute", Group::K8sRuntime, handler(execute))
            .id("k8s_execute").extension().scopes(&["process:run"])
            .summary("Run a command (shlex-split, no shell) in the base directory: stdout, stderr, exit_code.")
            .also_answers(&[403])
            .params(&[
                Param::body("command", "string", true)
                    .doc("The command line, split as shlex.split does; no shell runs it."),
                Param::body("timeout_seconds", "number", false)
                    .above(0.0)
                    .invalid("timeout_seconds must be a positive number")
                    .doc("Seconds above 0; without it 300, or the policy's timeout_seconds, which also caps it."),
            ])
            .limit("timeout_seconds", DEFAULT_TIMEOUT_SECS as u64)
            .limit("max_output_bytes", crate::routes::shared::SHELL_MAX_OUTPUT_BYTES),
        Endpoint::streamed(
            Method::Post,
            "/upload",
            Group::K8sRuntime,
            sink_handler(open_upload),
        )
        .id("k8s_upload").extension().scopes(&["files:write"])
        .multipart()
        .summary("Write a file: multipart field 'file', its filename the path beneath the base directory.")
        // Read by the multipart scanner as the body streams in, not by `Call::args`.
        .params(&[Param::body("file", "string", true).doc(
            "The multipart/form-data part holding the file's bytes; its filename is the path to write, beneath the base directory.",
        )])
        .also_answers(&[403, 409]),
        Endpoint::new(
            Method::Get,
            "/download/{path}",
            Group::K8sRuntime,
            handler(download),
        )
        .id("k8s_download").extension().scopes(&["files:read"])
        .summary("A file's raw bytes.")
        .also_answers(&[403])
        .params(std::slice::from_ref(&path)),
        Endpoint::new(Method::Get, "/list/{path}", Group::K8sRuntime, handler(list))
            .id("k8s_list").extension().scopes(&["files:read"])
            .summary("A directory's entries: name, size, type, mod_time.")
            .also_answers(&[403])
            .params(std::slice::from_ref(&path)),
        // `list("")` and `list(".")` reach the server as `/list/` (the client's URL
        // library removes a `.` segment), which is the base directory.
        Endpoint::new(Method::Get, "/list", Group::K8sRuntime, handler(list))
            .id("k8s_list_base").extension().scopes(&["files:read"])
            .summary("The base directory's entries.")
            .also_answers(&[403]),
        Endpoint::new(
            Method::Get,
            "/exists/{path}",
            Group::K8sRuntime,
            handler(exists),
        )
        .id("k8s_exists").extension().scopes(&["files:read"])
        .summary("Whether a path exists beneath the base directory.")
        .also_answers(&[403])
        .params(&[path]),
    ];
    for endpoint in &mut endpoints {
        endpoint.spec.listener = Listener::K8sRuntime;
    }
    endpoints
}

/// `GET /`: the reference runtime's answer.
async fn health(_call: Call) -> Result<Response, ApiError> {
    Ok(Response::ok(
        &json!({"status": "ok", "message": "Sandbox Runtime is active."}),
    ))
}

/// What `/execute` answers when the command did not run: the reference runtime says it
/// in `stderr` with exit code 1 rather than with an error status, and the client reads
/// only those fields.
fn not_run(why: impl std::fmt::Display) -> Response {
    Response::ok(&json!({
        "stdout": "",
        "stderr": format!("Failed to execute command: {why}"),
        "exit_code": 1,
    }))
}

/// `POST /execute {command, timeout_seconds?}`.
async fn execute(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let command = args.string("command");
    let asked = args.number("timeout_seconds");
    let cap = call.decision().knob_seconds("timeout_seconds");
    let seconds = match (asked, cap) {
        (Some(asked), Some(cap)) => asked.min(cap),
        (Some(asked), None) => asked,
        (None, Some(cap)) => cap,
        (None, None) => DEFAULT_TIMEOUT_SECS,
    };
    let argv = match crate::process::shlex::split(&command) {
        Ok(argv) if !argv.is_empty() => argv,
        Ok(_) => return Ok(not_run("the command is empty")),
        Err(e) => return Ok(not_run(e.0)),
    };
    if let Some(refusal) = command_refusal(call.decision(), &call.spec().id, &argv) {
        return Err(refusal);
    }
    let cwd = working_dir(&call, None).await?;
    let max_output = call
        .decision()
        .knob_u64("max_output_bytes")
        .map_or(crate::routes::shared::SHELL_MAX_OUTPUT_BYTES, |cap| {
            cap as usize
        });
    let program = argv[0].clone();
    let timeout = crate::process::run::timeout_duration(seconds);
    match run_program(&call, argv, cwd, &[], timeout, max_output).await {
        Ok(ProgramRun::Completed(done)) => Ok(Response::ok(&json!({
            "stdout": done.stdout,
            "stderr": done.stderr,
            "exit_code": done.exit.0,
        }))),
        Ok(ProgramRun::Missing) => Ok(not_run(format!(
            "[Errno 2] No such file or directory: '{program}'"
        ))),
        // The client's `ExecutionResult.timed_out`, with `timeout`'s exit status.
        Ok(ProgramRun::TimedOut) => Ok(Response::ok(&json!({
            "stdout": "",
            "stderr": format!("Command timed out after {seconds} seconds"),
            "exit_code": 124,
            "timed_out": true,
        }))),
        Err(error) => Ok(not_run(error.message)),
    }
}

/// The `{path}` segment, percent-decoded by the router.
fn path_param(call: &Call) -> String {
    call.path_param("path").unwrap_or(".").to_string()
}

/// `GET /download/{path}`: the bytes, as `application/octet-stream`.
async fn download(call: Call) -> Result<Response, ApiError> {
    let input = path_param(&call);
    let caller = confine_followed(&call, &input).await?;
    let services = call.services();
    let opened = open_file(&services.base, &caller, false)
        .await
        .map_err(fs_error)?;
    let size = opened.stat.st_size as u64;
    let file = AsyncFile::new(opened.fd, services.driver)
        .map_err(|e| fs_error(FsError::io(e, caller.display())))?;
    Ok(Response::stream(
        200,
        "application/octet-stream",
        Box::new(FileStream::new(file, 0, size)),
    ))
}

/// `GET /list/{path}`: `[{name, size, type, mod_time}]`, sorted by name. A symlink is
/// described by what it points to when that is beneath the base directory, else as
/// the link itself (a file), so a listing never reads outside.
async fn list(call: Call) -> Result<Response, ApiError> {
    let input = path_param(&call);
    let caller = confine_followed(&call, &input).await?;
    let base = call.services().base.clone();
    let shown = caller.display();
    let entries = blocking(move || list_dir(&base, &caller))
        .await
        .map_err(|e| fs_error(FsError::io(e, shown)))?
        .map_err(fs_error)?;
    Ok(Response::ok(&Value::Array(entries)))
}

fn list_dir(base: &BaseDir, caller: &CallerPath) -> Result<Vec<Value>, FsError> {
    let beneath = base.open()?;
    let dir = beneath.open_dir(caller, OFlags::RDONLY)?;
    let io = |e: rustix::io::Errno| FsError::io(e.into(), caller.display());
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(std::ffi::OsStr::from_bytes(name).to_os_string());
        }
    }
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let Ok(link) = rustix::fs::statat(dir.as_fd(), name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
        else {
            // Gone since the directory was read.
            continue;
        };
        let mut stat = link;
        if resolve::kind_of(&link) == resolve::Kind::Symlink {
            let target = beneath.open(
                &caller.rel.join(&name),
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
            );
            if let Ok(stat_of) = target.and_then(|fd| Ok(rustix::fs::fstat(&fd)?)) {
                stat = stat_of;
            }
        }
        let is_dir = resolve::kind_of(&stat) == resolve::Kind::Directory;
        out.push(json!({
            "name": name.to_string_lossy(),
            "size": stat.st_size,
            "type": if is_dir { "directory" } else { "file" },
            "mod_time": stat.st_mtime as f64 + stat.st_mtime_nsec as f64 / 1e9,
        }));
    }
    Ok(out)
}

/// `GET /exists/{path}`: `{path, exists}`. Following symlinks, as the reference's
/// `os.path.exists` does, but only beneath the base: one that leads outside is 403.
async fn exists(call: Call) -> Result<Response, ApiError> {
    let input = path_param(&call);
    let caller = confine_followed(&call, &input).await?;
    let base = call.services().base.clone();
    let shown = caller.display();
    let found = blocking(move || -> Result<bool, FsError> {
        let beneath = match base.open() {
            Ok(beneath) => beneath,
            Err(FsError::NotFound(_)) => return Ok(false),
            Err(e) => return Err(e),
        };
        match beneath.open(&caller.rel, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()) {
            Ok(_) => Ok(true),
            Err(e) if e.is_missing() => Ok(false),
            // An escape (a symlink out) is 403, not "absent".
            Err(e) => Err(base.open_error(e, &caller)),
        }
    })
    .await
    .map_err(|e| fs_error(FsError::io(e, shown)))?
    .map_err(fs_error)?;
    Ok(Response::ok(&json!({"path": input, "exists": found})))
}

/// `POST /upload`: opens the sink the multipart body streams into. The target is known
/// only once the file part's headers have arrived, so the upload opens then.
async fn open_upload(call: Call) -> Result<Box<dyn RawSink>, ApiError> {
    let boundary = call
        .header("content-type")
        .and_then(multipart::boundary)
        .ok_or_else(|| {
            ApiError::bad_request(
                "the body must be multipart/form-data with a boundary, holding a part named 'file'",
            )
        })?;
    let limit = {
        let configured = call.services().max_upload_size;
        call.decision()
            .knob_u64("max_upload_bytes")
            .map_or(configured, |cap| cap.min(configured))
    };
    Ok(Box::new(MultipartUpload {
        scanner: Scanner::new(&boundary),
        call,
        upload: None,
        in_file: false,
        target: None,
        written: 0,
        limit,
    }))
}

struct MultipartUpload {
    scanner: Scanner,
    call: Call,
    upload: Option<SmallFirst>,
    /// The part being read is the file part.
    in_file: bool,
    /// The filename, as the client sent it.
    target: Option<String>,
    written: u64,
    limit: u64,
}

impl MultipartUpload {
    async fn take(&mut self, event: Event) -> Result<(), ApiError> {
        match event {
            Event::Part { name, filename } => {
                if name.as_deref() != Some("file") || self.target.is_some() {
                    return Ok(());
                }
                let filename = filename.filter(|f| !f.is_empty()).ok_or_else(|| {
                    ApiError::bad_request("the part 'file' has no filename (the target path)")
                })?;
                let caller = confine_followed(&self.call, &filename).await?;
                check_extension(&self.call, &caller)?;
                let services = self.call.services();
                // No part is larger than the body.
                let expected = holdable_body_length(&self.call);
                let mut upload =
                    SmallFirst::open(&services.base, caller, services.driver, expected)
                        .await
                        .map_err(fs_error)?;
                if self.call.decision().knob_bool("overwrite") == Some(false) {
                    upload.keep_existing();
                }
                self.upload = Some(upload);
                self.target = Some(filename);
                self.in_file = true;
            }
            Event::Data(data) if self.in_file => {
                self.written += data.len() as u64;
                if self.written > self.limit {
                    return Err(ApiError::new(
                        413,
                        "ValueError",
                        format!("Upload too large: the limit is {} bytes (ABX_MAX_UPLOAD_SIZE, or the policy's max_upload_bytes when lower)", self.limit),
                    )
                    .with_code("payload_too_large"));
                }
                if let Some(upload) = self.upload.as_mut() {
                    upload.write(data).await.map_err(fs_error)?;
                }
            }
            Event::Data(_) => {}
            Event::PartEnd => self.in_file = false,
        }
        Ok(())
    }
}

impl RawSink for MultipartUpload {
    fn write(&mut self, mut piece: Vec<u8>) -> LocalFuture<'_, Result<Vec<u8>, ApiError>> {
        Box::pin(async move {
            let events = self
                .scanner
                .feed(&piece)
                .map_err(|e| ApiError::bad_request(format!("Invalid multipart body: {}", e.0)))?;
            for event in events {
                self.take(event).await?;
            }
            piece.clear();
            Ok(piece)
        })
    }

    fn finish(self: Box<Self>) -> HandlerFuture<Response> {
        Box::pin(async move {
            let this = *self;
            let (Some(upload), Some(target)) = (this.upload, this.target) else {
                return Err(ApiError::bad_request(
                    "the multipart body has no part named 'file'",
                ));
            };
            if !this.scanner.is_done() {
                upload.abort().await;
                return Err(ApiError::bad_request(
                    "the multipart body ends before its closing boundary",
                ));
            }
            let overwrite = this.call.decision().knob_bool("overwrite") != Some(false);
            upload
                .commit()
                .await
                .map_err(|e| refused_overwrite(e, overwrite))?;
            Ok(Response::ok(&json!({
                "message": format!("File '{target}' uploaded successfully.")
            })))
        })
    }

    fn abort(self: Box<Self>) -> Pin<Box<dyn std::future::Future<Output = ()>>> {
        Box::pin(async move {
            if let Some(upload) = self.upload {
                upload.abort().await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn execute_fields() {
        let read = |body| crate::routes::declared_args(&endpoints(), "k8s_execute", &[], body);
        assert_eq!(read(json!({})).unwrap_err(), "command is required");
        assert_eq!(
            read(json!({"command": 1})).unwrap_err(),
            "command must be a string"
        );
        for timeout in [json!(0), json!(-2), json!("5")] {
            assert_eq!(
                read(json!({"command": "ls", "timeout_seconds": timeout})).unwrap_err(),
                "timeout_seconds must be a positive number"
            );
        }
        let args = read(json!({"command": "", "timeout_seconds": null})).unwrap();
        assert_eq!(
            (args.str("command"), args.number("timeout_seconds")),
            (Some(""), None)
        );
    }
}
