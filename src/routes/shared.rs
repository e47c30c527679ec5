//! Helpers more than one group's routes use: how a domain failure is worded (a file
//! error, a spawn error), the caller path's confinement and the policy's `paths`,
//! `commands` and extension rules, the working directory of a child, running a program
//! to its end. They live here, not in the group that used them first, so no group's
//! routes are another's helper layer.

use std::os::fd::OwnedFd;

use crate::api::errno::os_error;
use crate::api::ApiError;
use crate::app::Call;
use crate::fs::read::open_file;
use crate::fs::FsError;
use crate::http::Response;
use crate::process::{Child, Spawn};
use crate::runtime::{AsyncFile, FileStream};

/// Words a file operation's failure as the contract does.
pub fn fs_error(error: FsError) -> ApiError {
    let message = error.to_string();
    match error {
        FsError::NotAllowed { .. } => {
            ApiError::new(403, "PolicyDenied", message).with_code("path_not_allowed")
        }
        // As the reference: the boundary root itself cannot be modified.
        FsError::BaseDirectory { .. } => {
            ApiError::new(403, "PolicyDenied", message).with_code("path_denied")
        }
        FsError::Invalid(_) => ApiError::bad_request(message),
        FsError::NotFound(_) => ApiError::new(404, "FileNotFoundError", message),
        FsError::TooManyFiles { .. } => ApiError::bad_request(message),
        FsError::TooLarge { .. } => {
            ApiError::new(413, "ValueError", message).with_code("payload_too_large")
        }
        FsError::Io { error, .. } if is_out_of_descriptors(&error) => ApiError::new(
            503,
            "OSError",
            "The server has no file descriptors left for this request; retry shortly",
        )
        .with_code("resource_exhausted")
        .with_header("Retry-After", "1"),
        FsError::Io { error, path } => os_error(&error, Some(&path)),
        FsError::Os { errno, .. } => {
            let mut api =
                ApiError::internal(crate::api::errno::python_exception(Some(errno)), message);
            api.code = crate::api::errno::os_error_code(Some(errno));
            api
        }
    }
}

/// EMFILE or ENFILE: a passing shortage of descriptors, not a fault of the request.
fn is_out_of_descriptors(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(23 | 24))
}

/// Checks a caller path against the base directory, then against the endpoint's
/// policy `paths` rule. A relative path is resolved against the rule's first allowed
/// directory when it names one (as the reference resolves it), else against the base.
pub(crate) fn confine(call: &Call, input: &str) -> Result<crate::fs::CallerPath, ApiError> {
    let base = &call.services().base;
    let rooted = match call.decision().allowed_directories().first() {
        Some(root) if !input.starts_with('/') => format!("{}/{input}", root.trim_end_matches('/')),
        _ => input.to_string(),
    };
    let mut caller = base.confine(&rooted).map_err(fs_error)?;
    caller.input = input.to_string();
    match paths_refusal(call.decision(), &call.spec().id, &caller) {
        Some(refusal) => Err(refusal),
        None => Ok(caller),
    }
}

/// [`confine`], then, when the endpoint has a `paths` rule, the same rule on where the
/// path really leads (symlinks followed, `fs::tree::real_path`): a link inside an
/// allowed directory that leads into a denied one, or out of the allowed ones, is
/// refused as that place would be (as the reference's realpath check does). Without a
/// rule this is `confine` alone, with no extra system call.
pub(crate) async fn confine_followed(
    call: &Call,
    input: &str,
) -> Result<crate::fs::CallerPath, ApiError> {
    let caller = confine(call, input)?;
    let decision = call.decision();
    let no_symlinks = decision.knob_str("paths.symlinks") == Some("never");
    if !no_symlinks
        && decision.knob_list("paths.allow").is_none()
        && decision.knob_list("paths.deny").is_none()
    {
        return Ok(caller);
    }
    let real = crate::fs::tree::real_path(&call.services().base, caller.clone())
        .await
        .map_err(fs_error)?;
    if real.rel != caller.rel {
        let id = &call.spec().id;
        if no_symlinks {
            return Err(ApiError::new(
                403,
                "PolicyDenied",
                format!(
                    "Symlinks are not allowed here: '{}' leads through a symlink (policy endpoints.{id}.paths.symlinks: never)",
                    caller.input
                ),
            )
            .with_code("symlink_denied"));
        }
        if let Some(refusal) = paths_refusal(decision, id, &real) {
            return Err(refusal);
        }
    }
    Ok(caller)
}

/// The body size up to which a raw upload may be held in memory and written in one
/// step (`fs::write::SmallFirst`): the announced `Content-Length` (the connection reads
/// no more), unless the client sent `Expect: 100-continue` and so asked to hear of a
/// target that cannot be written before it sends the body. `None` for a chunked body
/// (whatever length it also claims).
pub(crate) fn holdable_body_length(call: &Call) -> Option<u64> {
    let asks_first = call
        .header("expect")
        .is_some_and(|e| e.trim().eq_ignore_ascii_case("100-continue"));
    if asks_first || call.header("transfer-encoding").is_some() {
        return None;
    }
    call.header("content-length")
        .and_then(|value| value.trim().parse().ok())
}

/// A variable the server keeps secret (an identity's `token_env`) set for a child: 403
/// `env_var_not_allowed`, as the reference refuses it (the child's environment never
/// holds the secret, and a caller may not plant a value under its name either).
pub(crate) fn protected_env_refusal<'a>(
    call: &Call,
    mut names: impl Iterator<Item = &'a str>,
) -> Option<ApiError> {
    let secrets = call.catalog().policy.token_env_names();
    let name = names.find(|name| secrets.iter().any(|s| s == name))?;
    Some(
        ApiError::new(
            403,
            "PolicyDenied",
            format!("Environment variable '{name}' is protected"),
        )
        .with_code("env_var_not_allowed"),
    )
}

/// What the endpoint's `paths` rule keeps a caller from seeing in a listing, search or
/// archive: every entry it would refuse if named on its own (the reference leaves such
/// entries out, `.env` under the `hardened` preset). `None` without a `paths` rule.
pub(crate) fn hidden_by_policy(call: &Call) -> Option<crate::fs::walk::Hidden> {
    let decision = call.decision();
    if decision.knob_list("paths.allow").is_none() && decision.knob_list("paths.deny").is_none() {
        return None;
    }
    let decision = decision.clone();
    let id = call.spec().id.clone();
    let base = call.services().base.path().to_path_buf();
    Some(std::sync::Arc::new(move |rel: &std::path::Path| {
        let caller = crate::fs::CallerPath {
            shown: base.join(rel),
            rel: rel.to_path_buf(),
            input: rel.to_string_lossy().into_owned(),
        };
        paths_refusal(&decision, &id, &caller).is_some()
    }))
}

/// Whether `path` (absolute) is `root` or beneath it.
fn within(path: &str, root: &str) -> bool {
    let root = root.trim_end_matches('/');
    root.is_empty()
        || path == root
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The reference's reading of a `deny` pattern (`guard._deny_matches`): without a `/`
/// it matches any component (`*.pem`, `.env`); an absolute one is a directory prefix
/// (`/home/*/.ssh`: the path or any ancestor); otherwise it matches the tail of the path
/// or of an ancestor (`**/.env`).
fn reference_deny(path: &str, pattern: &str) -> bool {
    use crate::fs::fnmatch::fnmatch;
    if !pattern.contains('/') {
        return path
            .split('/')
            .any(|part| !part.is_empty() && fnmatch(pattern.as_bytes(), part.as_bytes()));
    }
    let stripped = pattern.trim_end_matches('/');
    let mut prefixes = Vec::new();
    let mut current = path.trim_end_matches('/');
    while !current.is_empty() {
        prefixes.push(current);
        current = &current[..current.rfind('/').unwrap_or(0)];
    }
    if pattern.starts_with('/') {
        return prefixes
            .iter()
            .any(|p| *p == stripped || fnmatch(stripped.as_bytes(), p.as_bytes()));
    }
    let tail = stripped.strip_prefix("**/").unwrap_or(stripped);
    let anywhere = format!("*/{tail}");
    prefixes.iter().any(|p| {
        fnmatch(anywhere.as_bytes(), p.as_bytes()) || fnmatch(tail.as_bytes(), p.as_bytes())
    })
}

/// What an endpoint does to the paths it names, for `paths.read_only` (the reference's
/// operation classes).
fn mutates(id: &str) -> bool {
    matches!(
        id,
        "upload" | "files_mkdir" | "files_upload_stream" | "files_delete" | "files_move"
    )
}

/// The policy's `paths` rule for an endpoint. `allow` entries that are directories
/// admit everything beneath them; the others are globs (`fnmatch`: `*` also crosses
/// `/`) matched against the path beneath the base directory (`work/notes.txt`) or, when
/// they start with `/`, the absolute path. A path that matches nothing in `allow` is 403
/// `path_not_allowed`; one that a `deny` pattern matches (as a glob, or as the
/// reference reads deny patterns) is 403 `path_denied`; a change through a `read_only`
/// endpoint is 403 `read_only`. The check is lexical, on the path as written.
pub(crate) fn paths_refusal(
    decision: &crate::app::policy::Decision,
    id: &str,
    caller: &crate::fs::CallerPath,
) -> Option<ApiError> {
    paths_refusal_for(decision, id, caller, mutates(id))
}

/// [`paths_refusal`] for an operation that writes (`mutating`) or not, whatever the
/// endpoint usually does (`/capabilities/check` with its `op`).
pub(crate) fn paths_refusal_for(
    decision: &crate::app::policy::Decision,
    id: &str,
    caller: &crate::fs::CallerPath,
    mutating: bool,
) -> Option<ApiError> {
    let allow = decision.knob_list("paths.allow");
    let deny = decision.knob_list("paths.deny");
    let read_only = decision.knob_bool("paths.read_only") == Some(true);
    if allow.is_none() && deny.is_none() && !read_only {
        return None;
    }
    let rel = caller.rel.to_string_lossy();
    let shown = caller.display();
    let glob_matches = |glob: &str| {
        let target = if glob.starts_with('/') {
            shown.as_str()
        } else {
            rel.as_ref()
        };
        crate::fs::fnmatch::fnmatch(glob.as_bytes(), target.as_bytes())
    };
    let refusal = |code: &'static str, why: String| {
        Some(ApiError::new(403, "PolicyDenied", why).with_code(code))
    };
    if let Some(allow) = allow {
        let allowed = allow.iter().any(|entry| {
            if crate::app::policy::is_directory_entry(entry) {
                within(&shown, entry)
            } else {
                glob_matches(entry)
            }
        });
        if !allowed {
            return refusal(
                "path_not_allowed",
                format!(
                    "Path '{}' is outside the allowed directories of endpoint '{id}' (policy endpoints.{id}.paths.allow)",
                    caller.input
                ),
            );
        }
    }
    if let Some(deny) = deny {
        if deny
            .iter()
            .any(|pattern| glob_matches(pattern) || reference_deny(&shown, pattern))
        {
            return refusal(
                "path_denied",
                format!(
                    "Path '{}' is denied by policy (endpoints.{id}.paths.deny)",
                    caller.input
                ),
            );
        }
    }
    if read_only && mutating {
        return refusal(
            "read_only",
            format!("This endpoint is read-only (policy endpoints.{id}.paths.read_only): '{}' cannot be changed", caller.input),
        );
    }
    None
}

/// Output `/shell` keeps per stream; more is read and dropped and `truncated` is set.
pub const SHELL_MAX_OUTPUT_BYTES: usize = 64 * 1024 * 1024;

/// The refusal [`check_command`] gives, for `/capabilities/check` too.
pub(crate) fn command_refusal(
    decision: &crate::app::policy::Decision,
    id: &str,
    argv: &[String],
) -> Option<ApiError> {
    let program = argv.first().map(String::as_str).unwrap_or_default();
    let name = program.rsplit('/').next().unwrap_or(program);
    let matches = |globs: &[&str]| {
        globs.iter().any(|glob| {
            crate::fs::fnmatch::fnmatch(glob.as_bytes(), name.as_bytes())
                || crate::fs::fnmatch::fnmatch(glob.as_bytes(), program.as_bytes())
        })
    };
    let denied = decision
        .knob_list("commands.deny")
        .is_some_and(|deny| matches(&deny));
    let not_allowed = decision
        .knob_list("commands.allow")
        .is_some_and(|allow| !matches(&allow));
    (denied || not_allowed).then(|| {
        ApiError::new(
            403,
            "PermissionError",
            format!(
                "Command '{name}' is not allowed by policy rule endpoints.{id}.commands ({})",
                if denied {
                    "it matches commands.deny"
                } else {
                    "it matches nothing in commands.allow"
                }
            ),
        )
        .with_code("command_not_allowed")
    })
}

/// The working directory: the caller's (confined, existing directory) or the base.
pub(crate) async fn working_dir(call: &Call, cwd: Option<&str>) -> Result<OwnedFd, ApiError> {
    let base = &call.services().base;
    let input = cwd.unwrap_or(".");
    let caller = confine_followed(call, input).await?;
    match crate::fs::tree::open_dir(base, &caller).await {
        Ok(fd) => Ok(fd),
        // The base directory, made if missing: a caller who sent no cwd is never refused
        // for one it did not send.
        Err(_) if cwd.is_none() => crate::fs::tree::open_base_creating(base)
            .await
            .map_err(fs_error),
        Err(FsError::Io { error, .. }) if matches!(error.raw_os_error(), Some(23 | 24)) => {
            Err(fs_error(FsError::Io {
                error,
                path: input.to_string(),
            }))
        }
        // Missing, not a directory, or outside: the contract's one answer for a cwd.
        Err(_) => Err(ApiError::new(
            403,
            "PermissionError",
            format!(
                "cwd '{input}' is not an existing directory inside the allowed directories ({}); use a directory beneath it",
                base.path().display()
            ),
        )
        .with_code("path_not_allowed")),
    }
}

/// `[Errno 2] No such file or directory: 'nosuch'`, as Python words it. Running out of
/// descriptors (for the pipes) is the same passing 503 the file routes give.
pub(crate) fn spawn_error(error: &std::io::Error, program: &str) -> ApiError {
    if matches!(error.raw_os_error(), Some(23 | 24)) {
        return fs_error(FsError::Io {
            error: std::io::Error::from_raw_os_error(error.raw_os_error().unwrap_or(24)),
            path: program.to_string(),
        });
    }
    let kind = crate::api::errno::python_exception(error.raw_os_error());
    let message = match error.raw_os_error() {
        Some(errno) => {
            let text = std::io::Error::from_raw_os_error(errno).to_string();
            let text = text.split(" (os error").next().unwrap_or(&text).to_string();
            format!("[Errno {errno}] {text}: '{program}'")
        }
        None => error.to_string(),
    };
    ApiError::internal(kind, message)
}

/// How a helper program (git, pip, a language runtime) ended.
pub(crate) enum ProgramRun {
    Completed(crate::process::run::Completed),
    /// The program is not installed (not on the child's `PATH`).
    Missing,
    TimedOut,
}

/// Runs `argv` in `cwd` with the shared environment plus `env`, capturing at most
/// `max_output` bytes of each stream, killing its group after `timeout`.
pub(crate) async fn run_program(
    call: &Call,
    argv: Vec<String>,
    cwd: OwnedFd,
    env: &[(String, String)],
    timeout: std::time::Duration,
    max_output: usize,
) -> Result<ProgramRun, ApiError> {
    let env = call.services().environment.with(env);
    run_program_in(call, argv, cwd, env, timeout, max_output).await
}

/// [`run_program`] with the child's whole environment given.
pub(crate) async fn run_program_in(
    call: &Call,
    argv: Vec<String>,
    cwd: OwnedFd,
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    timeout: std::time::Duration,
    max_output: usize,
) -> Result<ProgramRun, ApiError> {
    let services = call.services();
    let program = argv[0].clone();
    let spec = Spawn {
        user: None,
        argv,
        cwd,
        env,
        stdin: false,
        capture: true,
        terminal: None,
    };
    let child = match Child::spawn(spec, &services.children).await {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ProgramRun::Missing),
        Err(e) => return Err(spawn_error(&e, &program)),
    };
    match crate::process::run::run_to_end(child, timeout, max_output).await {
        Ok(crate::process::run::RunEnd::Completed(done)) => Ok(ProgramRun::Completed(done)),
        Ok(crate::process::run::RunEnd::TimedOut) => Ok(ProgramRun::TimedOut),
        Err(error) => Err(crate::api::errno::os_error(&error, None)),
    }
}

/// The policy's `allow_extensions` / `deny_extensions` for this endpoint, against the
/// file name's extension (case-insensitive, with or without the dot in the policy).
/// 403 `extension_not_allowed` otherwise.
pub fn check_extension(call: &Call, caller: &crate::fs::CallerPath) -> Result<(), ApiError> {
    extension_refusal(call.decision(), &call.spec().id, caller).map_or(Ok(()), |(e, _)| Err(e))
}

/// The refusal [`check_extension`] gives, for `/capabilities/check` too.
/// The name is the confined path's last component (`evil.py/` is `evil.py`). Also
/// returns the knob that refused (`allow_extensions` or `deny_extensions`).
pub fn extension_refusal(
    decision: &crate::app::policy::Decision,
    id: &str,
    caller: &crate::fs::CallerPath,
) -> Option<(ApiError, &'static str)> {
    let input = caller.input.as_str();
    let allow = decision.knob_list("allow_extensions");
    let deny = decision.knob_list("deny_extensions");
    if allow.is_none() && deny.is_none() {
        return None;
    }
    let name = caller
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let extension = name
        .rsplit_once('.')
        .filter(|(stem, _)| !stem.is_empty())
        .map(|(_, ext)| ext.to_ascii_lowercase())
        .unwrap_or_default();
    let listed = |list: &[&str]| {
        list.iter()
            .any(|e| e.trim_start_matches('.').eq_ignore_ascii_case(&extension))
    };
    let denied = deny.as_deref().is_some_and(listed);
    let refused = denied || allow.as_deref().is_some_and(|a| !listed(a));
    let knob = if denied {
        "deny_extensions"
    } else {
        "allow_extensions"
    };
    refused.then(|| {
        let shown = if extension.is_empty() {
            "(none)".to_string()
        } else {
            format!(".{extension}")
        };
        ApiError::new(
            403,
            "PermissionError",
            format!("Extension {shown} of '{input}' is not allowed by policy rule endpoints.{id} (allow_extensions / deny_extensions)"),
        )
        .with_code("extension_not_allowed")
    })
    .map(|error| (error, knob))
}

pub(crate) fn refused_overwrite(error: crate::fs::FsError, overwrite: bool) -> ApiError {
    match &error {
        crate::fs::FsError::Io { error: io, path }
            if !overwrite && io.raw_os_error() == Some(libc::EEXIST) =>
        {
            ApiError::new(
                409,
                "FileExistsError",
                format!(
                    "File exists: '{path}' (the policy sets overwrite: false for this endpoint)"
                ),
            )
            .with_code("file_exists")
        }
        _ => fs_error(error),
    }
}

/// The policy's `limits.max_bytes` on a download (of the whole file, whatever range is
/// asked): 413 `payload_too_large` with the limit, in the reference's words, before a
/// byte is sent.
pub fn over_policy_limit(call: &Call, size: u64) -> Result<(), ApiError> {
    match call.decision().knob_u64("max_bytes") {
        Some(limit) if size > limit => Err(ApiError::new(
            413,
            "ValueError",
            format!("File size {size} exceeds limit {limit}"),
        )
        .with_code("payload_too_large")
        .with_field("limit", limit)),
        _ => Ok(()),
    }
}

/// The bytes of the file `caller` names, as `application/octet-stream` with `ETag` and
/// one `Range` honoured (206, or 416 of type `refusal_type` outside the file), streamed
/// from disk: the raw downloads of the file routes and the agents' artifacts.
pub async fn raw_bytes(
    call: &Call,
    caller: &crate::fs::CallerPath,
    refusal_type: &'static str,
) -> Result<Response, ApiError> {
    let services = call.services();
    let opened = open_file(&services.base, caller, false)
        .await
        .map_err(fs_error)?;
    let shown = caller.display();
    let size = opened.stat.st_size as u64;
    over_policy_limit(call, size)?;
    let etag = format!(
        "\"{:x}-{:x}-{:x}.{:x}\"",
        opened.stat.st_ino, size, opened.stat.st_mtime, opened.stat.st_mtime_nsec
    );
    if let Some(tags) = call.header("if-none-match") {
        if tags.split(',').any(|t| {
            let t = t.trim();
            t == "*" || t.trim_start_matches("W/") == etag
        }) {
            return Ok(
                Response::raw(304, "application/octet-stream", Vec::new()).header("ETag", etag)
            );
        }
    }
    let (status, offset, len) = match call.header("range") {
        None => (200, 0, size),
        Some(range) => match parse_range(range, size) {
            RangeAnswer::Whole => (200, 0, size),
            RangeAnswer::Part(start, end) => (206, start, end - start + 1),
            RangeAnswer::Unsatisfiable => {
                return Err(ApiError::new(
                    416,
                    refusal_type,
                    format!("Range '{range}' is outside the file ({size} bytes)"),
                )
                .with_header("Content-Range", format!("bytes */{size}")));
            }
        },
    };
    let file = AsyncFile::new(opened.fd, services.driver)
        .map_err(|e| fs_error(crate::fs::FsError::io(e, shown)))?;
    let stream = FileStream::new(file, offset, len);
    let mut response = Response::stream(status, "application/octet-stream", Box::new(stream))
        .header("ETag", etag)
        .header("Accept-Ranges", "bytes");
    if status == 206 {
        response = response.header(
            "Content-Range",
            format!("bytes {}-{}/{size}", offset, offset + len - 1),
        );
    }
    Ok(response)
}

enum RangeAnswer {
    Whole,
    Part(u64, u64),
    Unsatisfiable,
}

/// One `bytes=` range (RFC 9110 §14.1.2). Several ranges, or a header we cannot read,
/// are answered with the whole file, which the RFC allows.
fn parse_range(header: &str, size: u64) -> RangeAnswer {
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return RangeAnswer::Whole;
    };
    if spec.contains(',') {
        return RangeAnswer::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeAnswer::Whole;
    };
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        let Ok(suffix) = last.parse::<u64>() else {
            return RangeAnswer::Whole;
        };
        if suffix == 0 || size == 0 {
            return RangeAnswer::Unsatisfiable;
        }
        return RangeAnswer::Part(size.saturating_sub(suffix), size - 1);
    }
    let Ok(start) = first.parse::<u64>() else {
        return RangeAnswer::Whole;
    };
    if start >= size {
        return RangeAnswer::Unsatisfiable;
    }
    let end = if last.is_empty() {
        size - 1
    } else {
        match last.parse::<u64>() {
            Ok(end) if end >= start => end.min(size - 1),
            _ => return RangeAnswer::Whole,
        }
    };
    RangeAnswer::Part(start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert!(matches!(
            parse_range("bytes=0-99", 1000),
            RangeAnswer::Part(0, 99)
        ));
        assert!(matches!(
            parse_range("bytes=900-", 1000),
            RangeAnswer::Part(900, 999)
        ));
        assert!(matches!(
            parse_range("bytes=-100", 1000),
            RangeAnswer::Part(900, 999)
        ));
        assert!(matches!(
            parse_range("bytes=990-5000", 1000),
            RangeAnswer::Part(990, 999)
        ));
        assert!(matches!(
            parse_range("bytes=1000-", 1000),
            RangeAnswer::Unsatisfiable
        ));
        assert!(matches!(
            parse_range("bytes=0-1,5-6", 1000),
            RangeAnswer::Whole
        ));
        assert!(matches!(parse_range("items=0-1", 1000), RangeAnswer::Whole));
        assert!(matches!(parse_range("bytes=5-1", 1000), RangeAnswer::Whole));
    }
}
