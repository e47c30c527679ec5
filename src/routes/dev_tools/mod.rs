//! `dev_tools` (opt-in): `POST /code/run` and git's status and diff of a directory
//! beneath the base. Every program goes through the one spawn path, with a timeout
//! that kills its whole process group.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::schema_object;
use crate::api::{ApiError, Group, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::git;
use crate::http::Response;
use crate::routes::shared::{run_program, run_program_in, working_dir, ProgramRun};
use crate::system::round_to;

const CODE_DEFAULT_TIMEOUT: f64 = 30.0;
const CODE_MAX_TIMEOUT: f64 = 300.0;
/// Each of stdout and stderr of a code run is kept up to this (as `/shell`).
const CODE_MAX_OUTPUT: usize = crate::routes::shared::SHELL_MAX_OUTPUT_BYTES;
const GIT_TIMEOUT: Duration = Duration::from_secs(30);
/// `GET /git/diff` cuts the patch here and says so on a last line.
const DIFF_LIMIT: usize = 1024 * 1024;
const SECURITY_NOTE: &str =
    "Security relies on container isolation, not application-level restrictions";

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::new(Method::Post, "/code/run", Group::DevTools, handler(code_run))
            .id("code_run").scopes(&["devtools:run"])
            .enforces(&["paths", "timeout_seconds", "max_output_bytes", "languages"])
            .changes()
            .summary("Run a snippet of Python, Node.js or bash and answer with its output.")
            .params(&[
                Param::body("code", "string", true).doc("The snippet to run."),
                Param::body("language", "string", false)
                    .default("\"python\"")
                    .doc("python (python3 -c), node (node -e) or bash (bash -c); a policy's languages list may allow fewer."),
                Param::body("timeout", "number", false)
                    .above(0.0)
                    .lenient()
                    .default("30")
                    .doc("Seconds; more than 300 (or the policy's timeout_seconds) is cut to it, and a non-positive or non-numeric value is replaced with 30, as on the reference."),
            ])
            .limit("timeout_seconds", CODE_MAX_TIMEOUT as u64)
            .returns(|| schema_object(
                &["stdout", "stderr", "exit_code", "language", "execution_time_ms", "_security_note"],
                json!({
                    "stdout": {"type": "string"}, "stderr": {"type": "string"}, "exit_code": {"type": "integer"},
                    "language": {"type": "string"}, "execution_time_ms": {"type": "number"},
                    "_security_note": {"type": "string"},
                }),
            ))
            .also_answers(&[400, 408, 500]),
        Endpoint::new(Method::Get, "/git/status", Group::DevTools, handler(git_status))
            .id("git_status").scopes(&["devtools:read"])
            .enforces(&["paths"])
            .changes()
            .summary("Branch and changed files of the repository containing path.")
            .params(&[git_path()])
            .returns(|| schema_object(&["branch", "clean", "files"], json!({
                "branch": {"type": "string"}, "clean": {"type": "boolean"}, "files": {"type": "array"},
            })))
            .also_answers(&[400, 403, 408, 500]),
        Endpoint::new(Method::Get, "/git/diff", Group::DevTools, handler(git_diff))
            .id("git_diff").scopes(&["devtools:read"])
            .enforces(&["paths"])
            .changes()
            .summary("Unified diff (cut at 1 MiB) and its stats, of the worktree or the index.")
            .params(&[
                git_path(),
                // The contract's words, not the general truthy ones (`on` is not one).
                Param::query("staged", "string", false)
                    .doc("true, yes or 1 (any case) diffs the index against HEAD instead of the work tree."),
                Param::query("file", "string", false)
                    .doc("A pathspec limiting the diff (one file or directory)."),
            ])
            .returns(|| schema_object(&["diff", "stats"], json!({
                "diff": {"type": "string"}, "stats": {"type": "object"},
            })))
            .also_answers(&[400, 403, 408, 500]),
    ]
}

fn git_path() -> Param {
    Param::query("path", "string", false)
        .doc("A directory beneath the base, inside the repository (default: the base directory).")
}

/// `POST /code/run`.
async fn code_run(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let code = args.string("code");
    // An empty snippet is no snippet (the contract's `if not code`); blanks still run.
    if code.is_empty() {
        return Err(ApiError::bad_request("code is required"));
    }
    let language = args.string("language");
    let (program, flag) = match language.as_str() {
        "python" => ("python3", "-c"),
        "node" => ("node", "-e"),
        "bash" => ("bash", "-c"),
        _ => {
            return Err(ApiError::bad_request(format!(
                "Unsupported language: {language} (use python, node or bash)"
            )))
        }
    };
    if let Some(languages) = call.decision().knob_list("languages") {
        if !languages.contains(&language.as_str()) {
            return Err(ApiError::new(
                403,
                "PermissionError",
                format!(
                    "Language {language} is not allowed by policy rule endpoints.code_run.languages (allowed: {})",
                    languages.join(", ")
                ),
            )
            .with_code("language_not_allowed"));
        }
    }
    let timeout = args
        .number("timeout")
        .unwrap_or(CODE_DEFAULT_TIMEOUT)
        .min(CODE_MAX_TIMEOUT);
    if code.contains('\0') {
        return Err(ApiError::bad_request("code contains a NUL byte"));
    }
    // The policy's timeout_seconds lowers the maximum (and the default with it).
    let timeout = match call.decision().knob_seconds("timeout_seconds") {
        Some(cap) => timeout.min(cap),
        None => timeout,
    };
    let cwd = working_dir(&call, None).await?;
    let argv = vec![program.to_string(), flag.to_string(), code];
    let started = Instant::now();
    let run = run_program(
        &call,
        argv,
        cwd,
        &[],
        Duration::from_secs_f64(timeout),
        // The policy's max_output_bytes lowers the cut of each stream.
        call.decision()
            .knob_u64("max_output_bytes")
            .map_or(CODE_MAX_OUTPUT, |most| {
                most.min(CODE_MAX_OUTPUT as u64) as usize
            }),
    )
    .await?;
    let elapsed_ms = round_to(started.elapsed().as_secs_f64() * 1000.0, 2);
    match run {
        ProgramRun::Completed(done) => {
            let mut answer = json!({
                "stdout": done.stdout,
                "stderr": done.stderr,
                "exit_code": done.exit.0,
                "language": language,
                "execution_time_ms": elapsed_ms,
                "_security_note": SECURITY_NOTE,
            });
            if done.truncated {
                answer["truncated"] = Value::Bool(true);
            }
            Ok(Response::ok(&answer))
        }
        ProgramRun::TimedOut => Err(ApiError::new(
            408,
            "TimeoutError",
            format!("Execution timed out after {}s", crate::pytext::str_of(&json!(timeout))),
        )),
        ProgramRun::Missing => Err(ApiError::internal(
            "FileNotFoundError",
            format!("Runtime not found: {program} (install it in the sandbox image to run {language} code)"),
        )),
    }
}

/// The repository holding the confined directory `path`, found without looking above
/// the base directory (`git::repo`), with the environment and `-c` overrides under which
/// git runs nothing the repository or the environment names.
struct GitRun {
    cwd: std::os::fd::OwnedFd,
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

async fn prepare_git(call: &Call, path: Option<&str>) -> Result<GitRun, ApiError> {
    use git::repo::{self, RepoError};
    let cwd = working_dir(call, path).await?;
    let base = call.services().base.clone();
    let caller = base
        .confine(path.unwrap_or("."))
        .map_err(crate::routes::shared::fs_error)?;
    let found = crate::runtime::file::blocking(move || {
        let beneath = base.open()?;
        let found = repo::discover(&beneath, &caller).map(|repository| {
            let plain = repo::config_names_no_program(&beneath, &repository);
            (repository, plain)
        });
        Ok::<_, crate::fs::FsError>(found)
    })
    .await
    .map_err(|e| crate::api::errno::os_error(&e, None))?
    .map_err(crate::routes::shared::fs_error)?;
    let (repository, plain_config) = match found {
        Ok(found) => found,
        Err(RepoError::NotARepository) => {
            return Err(ApiError::bad_request(
                "fatal: not a git repository (or any of the parent directories up to the base directory): .git",
            )
            .with_kind("GitError"))
        }
        Err(RepoError::Outside(what)) => {
            return Err(ApiError::new(
                403,
                "PermissionError",
                format!("Path not allowed: the repository names {what}, outside the allowed directories"),
            )
            .with_code("path_not_allowed"))
        }
        Err(RepoError::Io(error, path)) => {
            return Err(crate::api::errno::os_error(&error, Some(&path)))
        }
    };
    let mut env = repo::environment(&call.services().environment.snapshot(), Some(&repository));
    if plain_config {
        // Nothing in the configuration can name a program: the listing would add no
        // override to the fixed ones.
        repo::add_overrides(&mut env, &repo::fixed_overrides());
        return Ok(GitRun { cwd, env });
    }
    let argv = ["git", "config", "--null", "--list"]
        .map(String::from)
        .to_vec();
    let listed = finish_git(
        run_program_in(
            call,
            argv,
            dup(&cwd)?,
            env.clone(),
            GIT_TIMEOUT,
            1024 * 1024,
        )
        .await?,
    )?;
    let overrides = repo::config_overrides(&listed.0, listed.1).map_err(|why| {
        let why = match why {
            repo::ConfigRefusal::NotUtf8 => "names a key that is not UTF-8",
            repo::ConfigRefusal::TooLarge => "is larger than 1 MiB",
        };
        ApiError::new(
            403,
            "PermissionError",
            format!("The repository's configuration {why}; git does not run on it here"),
        )
        .with_code("path_not_allowed")
    })?;
    repo::add_overrides(&mut env, &overrides);
    Ok(GitRun { cwd, env })
}

fn dup(fd: &std::os::fd::OwnedFd) -> Result<std::os::fd::OwnedFd, ApiError> {
    rustix::io::fcntl_dupfd_cloexec(fd, 0)
        .map_err(|e| crate::api::errno::os_error(&std::io::Error::from(e), None))
}

/// Runs `git <args>` for a prepared repository and returns its stdout; git's own
/// failure is 400 `GitError` with what it said.
async fn run_git(
    call: &Call,
    prepared: &GitRun,
    args: &[&str],
    limit: usize,
) -> Result<(String, bool), ApiError> {
    let mut argv = vec!["git".to_string(), "--no-pager".into()];
    argv.extend(
        ["-c", "core.quotepath=off", "-c", "color.ui=false"]
            .iter()
            .chain(args)
            .map(|a| a.to_string()),
    );
    let cwd = dup(&prepared.cwd)?;
    finish_git(run_program_in(call, argv, cwd, prepared.env.clone(), GIT_TIMEOUT, limit).await?)
}

fn finish_git(run: ProgramRun) -> Result<(String, bool), ApiError> {
    match run {
        ProgramRun::Completed(done) if done.exit.0 == 0 => Ok((done.stdout, done.truncated)),
        ProgramRun::Completed(done) => {
            let said = done.stderr.trim();
            Err(ApiError::bad_request(if said.is_empty() {
                format!("git exited with status {}", done.exit.0)
            } else {
                said.to_string()
            })
            .with_kind("GitError"))
        }
        ProgramRun::TimedOut => Err(ApiError::new(
            408,
            "TimeoutError",
            format!("git timed out after {}s", GIT_TIMEOUT.as_secs()),
        )),
        ProgramRun::Missing => Err(ApiError::internal(
            "FileNotFoundError",
            "git is not installed (install git in the sandbox image)",
        )),
    }
}

/// `GET /git/status?path=.`.
async fn git_status(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let prepared = prepare_git(&call, args.str("path")).await?;
    let (out, _) = run_git(
        &call,
        &prepared,
        &[
            "status",
            "--porcelain=v2",
            "-z",
            "--branch",
            "--ignore-submodules=all",
        ],
        64 * 1024 * 1024,
    )
    .await?;
    let status = git::parse_status(&out).map_err(|e| {
        ApiError::internal(
            "RuntimeError",
            format!("cannot read git's status output: {e}"),
        )
    })?;
    Ok(Response::ok(&json!({
        "branch": status.branch,
        "clean": status.files.is_empty(),
        "files": status.files,
    })))
}

/// `GET /git/diff?path=.&staged=true&file=...`.
async fn git_diff(call: Call) -> Result<Response, ApiError> {
    let fields = call.args()?;
    let staged = fields
        .str("staged")
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "yes" | "1"));
    let mut args = vec![
        "diff",
        "--no-ext-diff",
        "--no-textconv",
        "--ignore-submodules=all",
    ];
    if staged {
        args.push("--staged");
    }
    let mut numstat = args.clone();
    numstat.extend(["--numstat", "-z"]);
    let mut pathspec = vec!["--"];
    match fields.str("file") {
        Some(file) => {
            // The file is a path like any other: the paths rule sees it where it lies.
            let under = fields.str("path").unwrap_or(".").trim_end_matches('/');
            crate::routes::shared::confine_followed(&call, &format!("{under}/{file}")).await?;
            pathspec.push(file);
        }
        // git's output cannot be filtered path by path: with deny rules, a whole-tree
        // diff could show a denied file's content, so one file must be named (as on
        // the reference).
        None if call.decision().knob_list("paths.deny").is_some() => {
            return Err(ApiError::new(
                403,
                "PolicyDenied",
                "A 'file' filter is required while path deny rules are configured",
            )
            .with_code("path_denied"));
        }
        None => {}
    }
    args.extend(&pathspec);
    numstat.extend(&pathspec);
    let prepared = prepare_git(&call, fields.str("path")).await?;
    let (patch, stats) = monoio::join!(
        run_git(&call, &prepared, &args, DIFF_LIMIT),
        run_git(&call, &prepared, &numstat, 64 * 1024 * 1024)
    );
    let (mut diff, truncated) = patch?;
    let stats = git::parse_numstat(&stats?.0);
    if truncated {
        diff.push_str("\n... diff truncated at 1 MiB ...\n");
    }
    let mut answer = json!({"diff": diff, "stats": stats});
    if truncated {
        answer["truncated"] = Value::Bool(true);
    }
    Ok(Response::ok(&answer))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn code_run_fields() {
        let read = |body| crate::routes::declared_args(&endpoints(), "code_run", &[], body);
        assert_eq!(read(json!({})).unwrap_err(), "code is required");
        assert_eq!(read(json!({"code": null})).unwrap_err(), "code is required");
        assert_eq!(
            read(json!({"code": 1})).unwrap_err(),
            "code must be a string"
        );
        assert_eq!(
            read(json!({"code": "1", "language": 3})).unwrap_err(),
            "language must be a string"
        );
        for timeout in [json!("soon"), json!(-1), json!(0)] {
            let args = read(json!({"code": "1", "timeout": timeout})).unwrap();
            assert_eq!(args.number("timeout"), Some(CODE_DEFAULT_TIMEOUT));
        }
        let args = read(json!({"code": "1"})).unwrap();
        assert_eq!(args.str("language"), Some("python"));
        assert_eq!(args.number("timeout"), Some(CODE_DEFAULT_TIMEOUT));
    }
}
