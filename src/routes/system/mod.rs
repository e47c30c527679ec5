//! `system`: facts about the sandbox (`/system/info`, `/system/metrics`), the
//! environment children start with (`GET`/`POST /env`), listening ports and installed
//! packages. `/proc` and `statvfs` are read on the blocking pool; helper programs (pip,
//! npm, python3) go through the one spawn path.

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::schema_object;
use crate::api::{ApiError, Group, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;
use crate::pytext::str_repr as py_repr;
use crate::routes::shared::{run_program, working_dir, ProgramRun};
use crate::system::{self, ports, round_to, Disk, Memory, Uname};

/// How long `GET /packages` lets pip or npm run.
const PACKAGES_TIMEOUT: Duration = Duration::from_secs(10);
/// Words that keep a variable out of `GET /env` (compared in upper case).
const SECRET_WORDS: [&str; 5] = ["TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL"];
/// Variables `POST /env` may not change; any `ABX_` name is refused too.
const PROTECTED_VARS: [&str; 4] = ["PATH", "HOME", "USER", "SHELL"];
/// `POST /env`'s refusal of a `vars` that is not an object (the reference's words).
const VARS_SENTENCE: &str = "'vars' must be an object";

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::new(Method::Get, "/system/info", Group::System, handler(info))
            .id("system_info").scopes(&["system:read"])
            .summary("OS, architecture, CPUs, memory, disk, Python version and host name.")
            .returns(|| schema_object(
                &["os", "arch", "cpu_count", "memory_total_mb", "memory_available_mb", "disk_total_gb", "disk_free_gb", "python_version", "hostname"],
                json!({
                    "os": {"type": "string"}, "arch": {"type": "string"}, "cpu_count": {"type": "integer"},
                    "memory_total_mb": {"type": "integer"}, "memory_available_mb": {"type": "integer"},
                    "disk_total_gb": {"type": "number"}, "disk_free_gb": {"type": "number"},
                    "python_version": {"type": ["string", "null"]}, "hostname": {"type": "string"},
                }),
            )),
        Endpoint::new(Method::Get, "/system/metrics", Group::System, handler(metrics))
            .id("system_metrics").scopes(&["system:read"])
            .summary("Load averages, memory and disk use, and the server's uptime.")
            .returns(|| schema_object(
                &["cpu_load_1m", "cpu_load_5m", "cpu_load_15m", "memory_used_mb", "memory_total_mb", "memory_percent", "disk_used_gb", "disk_total_gb", "disk_percent", "uptime_seconds"],
                json!({
                    "cpu_load_1m": {"type": "number"}, "cpu_load_5m": {"type": "number"}, "cpu_load_15m": {"type": "number"},
                    "memory_used_mb": {"type": "integer"}, "memory_total_mb": {"type": "integer"}, "memory_percent": {"type": "number"},
                    "disk_used_gb": {"type": "number"}, "disk_total_gb": {"type": "number"}, "disk_percent": {"type": "number"},
                    "uptime_seconds": {"type": "number"},
                }),
            )),
        Endpoint::new(Method::Get, "/env", Group::System, handler(env_get))
            .id("env_get").scopes(&["system:read"])
            .enforces(&["allow_vars", "deny_vars"])
            .summary("The environment children start with; names that look like secrets are left out.")
            .params(&[Param::query("filter", "string", false)
                .doc("A comma-separated allow-list of names; without it every variable the policy lets through is listed.")])
            .returns(|| schema_object(&["variables"], json!({"variables": {"type": "object"}}))),
        Endpoint::new(Method::Post, "/env", Group::System, handler(env_set))
            .id("env_set").scopes(&["system:write"])
            .enforces(&["allow_vars", "deny_vars"])
            .changes()
            .summary("Set variables for every child started from now on.")
            .params(&[Param::body("vars", "object", false)
                .invalid(VARS_SENTENCE)
                .doc("Variable names (letters, digits and _, not starting with a digit) to string values; none is an empty update.")])
            .returns(|| schema_object(&["updated"], json!({"updated": {"type": "array"}})))
            .also_answers(&[400, 403]),
        Endpoint::new(Method::Get, "/ports", Group::System, handler(ports_get))
            .id("ports").scopes(&["system:read"])
            .summary("Listening TCP ports, with the pid holding each where it can be seen.")
            .returns(|| schema_object(&["listening"], json!({"listening": {"type": "array"}}))),
        Endpoint::new(Method::Get, "/packages", Group::System, handler(packages))
            .id("packages").scopes(&["system:read"])
            .enforces(&["paths"])
            .changes()
            .summary("Installed pip or npm packages.")
            .params(&[Param::query("manager", "string", false)
                .default("\"pip\"")
                .doc("pip (python3 -m pip list) or npm (npm list --depth=0): whose packages to list.")])
            .returns(|| schema_object(&["manager", "packages"], json!({"manager": {"type": "string"}, "packages": {"type": "array"}})))
            .also_answers(&[400, 500]),
    ]
}

/// Runs `work` on the blocking pool; a failure is a 500 `OSError`.
async fn off_the_loop<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    crate::runtime::blocking(work)
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("the blocking task was cancelled")))
        .map_err(|e| crate::api::errno::os_error(&e, None))
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// `GET /system/info`.
async fn info(call: Call) -> Result<Response, ApiError> {
    let (memory, disk, uname, cpus) = off_the_loop(|| {
        Ok((
            Memory::read()?,
            Disk::of(std::path::Path::new("/"))?,
            Uname::read(),
            system::cpu_count(),
        ))
    })
    .await?;
    Ok(Response::ok(&json!({
        "os": uname.sysname,
        "arch": uname.machine,
        "cpu_count": cpus,
        "memory_total_mb": memory.total_kib / 1024,
        "memory_available_mb": memory.available_kib / 1024,
        "disk_total_gb": round_to(disk.total as f64 / GIB, 2),
        "disk_free_gb": round_to(disk.free as f64 / GIB, 2),
        "python_version": python_version(&call).await,
        "hostname": uname.nodename,
    })))
}

/// The version of `python3` on the children's `PATH` (this server is not Python, so
/// this is the interpreter a template's code would get), or `null` without one.
/// Remembered once found.
async fn python_version(call: &Call) -> Option<String> {
    static FOUND: OnceLock<String> = OnceLock::new();
    if let Some(version) = FOUND.get() {
        return Some(version.clone());
    }
    let cwd = working_dir(call, None).await.ok()?;
    let argv = vec!["python3".to_string(), "--version".to_string()];
    match run_program(call, argv, cwd, &[], Duration::from_secs(10), 4096).await {
        Ok(ProgramRun::Completed(done)) if done.exit.0 == 0 => {
            // "Python 3.11.7" (older versions print it on stderr).
            let text = if done.stdout.trim().is_empty() {
                done.stderr
            } else {
                done.stdout
            };
            let version = text.trim().strip_prefix("Python ")?.to_string();
            Some(FOUND.get_or_init(|| version).clone())
        }
        _ => None,
    }
}

/// `GET /system/metrics`.
async fn metrics(call: Call) -> Result<Response, ApiError> {
    let uptime = call.services().started.elapsed().as_secs_f64();
    let (load, memory, disk) = off_the_loop(|| {
        Ok((
            system::load_average()?,
            Memory::read()?,
            Disk::of(std::path::Path::new("/"))?,
        ))
    })
    .await?;
    let used_kib = memory.total_kib.saturating_sub(memory.available_kib);
    let percent = |part: f64, whole: f64| {
        if whole > 0.0 {
            round_to(part / whole * 100.0, 1)
        } else {
            0.0
        }
    };
    Ok(Response::ok(&json!({
        "cpu_load_1m": load[0],
        "cpu_load_5m": load[1],
        "cpu_load_15m": load[2],
        "memory_used_mb": used_kib / 1024,
        "memory_total_mb": memory.total_kib / 1024,
        "memory_percent": percent(used_kib as f64, memory.total_kib as f64),
        "disk_used_gb": round_to(disk.used as f64 / GIB, 2),
        "disk_total_gb": round_to(disk.total as f64 / GIB, 2),
        "disk_percent": percent(disk.used as f64, disk.total as f64),
        "uptime_seconds": round_to(uptime, 2),
    })))
}

/// The policy's `allow_vars` / `deny_vars` globs for this endpoint: whether `name` may
/// be listed (`GET /env`) or set (`POST /env`).
fn var_allowed(call: &Call, name: &str) -> bool {
    let decision = call.decision();
    let matches = |globs: Vec<&str>| {
        globs
            .iter()
            .any(|g| crate::fs::fnmatch::fnmatch(g.as_bytes(), name.as_bytes()))
    };
    let denied = decision.knob_list("deny_vars").is_some_and(matches);
    let allowed = decision.knob_list("allow_vars").is_none_or(matches);
    allowed && !denied
}

/// A name `GET /env` never shows: one that reads like a secret, or the server's own
/// settings (`ABX_SERVER_*`: how it is configured and governed, as the reference hides
/// them).
fn looks_secret(name: &str) -> bool {
    let upper = name.to_uppercase();
    upper.starts_with("ABX_SERVER_") || SECRET_WORDS.iter().any(|word| upper.contains(word))
}

/// `GET /env`.
async fn env_get(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let allowed: Option<HashSet<&str>> = args.str("filter").map(|list| {
        list.split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect()
    });
    let snapshot = call.services().environment.snapshot();
    let mut variables = Map::new();
    for (name, value) in snapshot.iter() {
        let name = name.to_string_lossy();
        if looks_secret(&name)
            || allowed.as_ref().is_some_and(|a| !a.contains(name.as_ref()))
            || !var_allowed(&call, &name)
        {
            continue;
        }
        variables.insert(
            name.into_owned(),
            Value::String(value.to_string_lossy().into_owned()),
        );
    }
    Ok(Response::ok(&json!({ "variables": variables })))
}

/// Variables that point git at another repository, work tree or configuration (which
/// can name programs to run): refused by `POST /env`, and never passed to the dev tools'
/// git in any case.
fn git_steering(upper: &str) -> bool {
    matches!(
        upper,
        "GIT_DIR"
            | "GIT_WORK_TREE"
            | "GIT_COMMON_DIR"
            | "GIT_INDEX_FILE"
            | "GIT_OBJECT_DIRECTORY"
            | "GIT_ALTERNATE_OBJECT_DIRECTORIES"
            | "GIT_CEILING_DIRECTORIES"
            | "GIT_DISCOVERY_ACROSS_FILESYSTEM"
    ) || upper.starts_with("GIT_CONFIG")
        || upper.starts_with("GIT_SSH")
        || matches!(
            upper,
            "GIT_EXTERNAL_DIFF"
                | "GIT_PAGER"
                | "GIT_EDITOR"
                | "GIT_ASKPASS"
                | "GIT_PROXY_COMMAND"
                | "GIT_EXEC_PATH"
                | "GIT_TEMPLATE_DIR"
        )
}

/// `POST /env`.
async fn env_set(call: Call) -> Result<Response, ApiError> {
    // Optional (none is an empty update, as on the reference) and an object: the
    // declaration checked that.
    let vars = match call.args()?.take("vars") {
        Some(Value::Object(vars)) => vars,
        _ => Map::new(),
    };
    // Every pair is checked before any is set, in the reference's order (the form of
    // each assignment, then the protected names, then the policy): a refused request
    // changes nothing.
    let mut updates = Vec::with_capacity(vars.len());
    for (name, value) in &vars {
        let value = match value {
            Value::String(v) if is_variable_name(name) && !v.contains('\0') => v,
            _ => {
                return Err(ApiError::new(
                    400,
                    "ValueError",
                    format!("Invalid environment assignment {}", py_repr(name)),
                )
                .with_code("env_invalid"))
            }
        };
        if name.to_uppercase().starts_with("ABX_") {
            return Err(ApiError::new(
                403,
                "PolicyDenied",
                format!(
                    "Environment variable {} cannot be overwritten",
                    py_repr(name)
                ),
            )
            .with_code("env_var_denied"));
        }
        updates.push((name.clone(), value.clone()));
    }
    let mut protected: Vec<&str> = vars
        .keys()
        .map(String::as_str)
        .filter(|name| PROTECTED_VARS.contains(name))
        .collect();
    if !protected.is_empty() {
        protected.sort_unstable();
        return Err(ApiError::new(
            403,
            "PermissionError",
            format!(
                "Cannot overwrite protected variable(s): {}",
                protected.join(", ")
            ),
        ));
    }
    for name in vars.keys() {
        // Stricter than the reference: these make every later child load code, or git
        // read another repository (docs/api.md).
        if crate::process::env::loads_code(name) || git_steering(&name.to_uppercase()) {
            return Err(ApiError::new(
                403,
                "PermissionError",
                format!("Cannot set protected variable: {name} (it makes programs load code or git read another repository or configuration: see docs/api.md)"),
            )
            .with_code("variable_not_allowed"));
        }
        if !var_allowed(&call, name) {
            return Err(ApiError::new(
                403,
                "PolicyDenied",
                format!("Environment variable {} is not allowed", py_repr(name)),
            )
            .with_code("env_var_not_allowed"));
        }
    }
    call.services().environment.set(&updates);
    let names: Vec<&String> = vars.keys().collect();
    Ok(Response::ok(&json!({ "updated": names })))
}

/// A name the reference admits: `[A-Za-z_][A-Za-z0-9_]*`.
fn is_variable_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `GET /ports`.
async fn ports_get(_call: Call) -> Result<Response, ApiError> {
    let rows = off_the_loop(|| {
        let mut sockets = ports::listening();
        let inodes: HashSet<u64> = sockets.iter().map(|s| s.inode).collect();
        let owners = ports::owners(&inodes);
        sockets.sort();
        let mut seen = HashSet::new();
        let mut rows = Vec::new();
        for socket in sockets {
            let pid = owners.get(&socket.inode).copied();
            // SO_REUSEPORT listeners (this server has one per worker) are one port.
            if seen.insert((socket.port, socket.protocol, socket.address, pid)) {
                rows.push(json!({
                    "port": socket.port,
                    "protocol": socket.protocol,
                    "address": socket.address.to_string(),
                    "pid": pid,
                }));
            }
        }
        Ok(rows)
    })
    .await?;
    Ok(Response::ok(&json!({ "listening": rows })))
}

/// `GET /packages?manager=pip|npm`.
async fn packages(call: Call) -> Result<Response, ApiError> {
    let manager = call.args()?.string("manager");
    let argv: &[&str] = match manager.as_str() {
        "pip" => &[
            "python3",
            "-m",
            "pip",
            "list",
            "--format",
            "json",
            "--disable-pip-version-check",
        ],
        "npm" => &["npm", "list", "--json", "--depth=0", "--loglevel=silent"],
        _ => {
            return Err(ApiError::bad_request(format!(
                "Unsupported package manager: {manager} (use pip or npm)"
            )))
        }
    };
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    let cwd = working_dir(&call, None).await?;
    let env = [("PIP_NO_INPUT".to_string(), "1".to_string())];
    let done = match run_program(&call, argv, cwd, &env, PACKAGES_TIMEOUT, 64 * 1024 * 1024).await?
    {
        ProgramRun::Missing => {
            return Ok(Response::ok(&json!({"manager": manager, "packages": []})));
        }
        ProgramRun::TimedOut => {
            return Err(ApiError::internal(
                "TimeoutError",
                format!(
                    "{manager} list timed out after {}s",
                    PACKAGES_TIMEOUT.as_secs()
                ),
            ))
        }
        ProgramRun::Completed(done) => done,
    };
    let parsed: Option<Value> = serde_json::from_str(done.stdout.trim()).ok();
    let packages: Vec<Value> = match (manager.as_str(), parsed) {
        ("pip", Some(Value::Array(items))) => items
            .into_iter()
            .filter_map(|item| {
                Some(json!({"name": item.get("name")?.as_str()?, "version": item.get("version")?.as_str()?}))
            })
            .collect(),
        ("npm", Some(doc)) => doc
            .get("dependencies")
            .and_then(Value::as_object)
            .map(|deps| {
                deps.iter()
                    .map(|(name, dep)| {
                        json!({"name": name, "version": dep.get("version").and_then(Value::as_str)})
                    })
                    .collect()
            })
            .unwrap_or_default(),
        // `python3` without pip answers "No module named pip": nothing is installed
        // through it, as with a missing binary.
        ("pip", None) if done.stderr.contains("No module named pip") => Vec::new(),
        _ => {
            let said = done.stderr.trim();
            return Err(ApiError::internal(
                "RuntimeError",
                format!(
                    "{manager} list exited with status {} and no package list{}{said}",
                    done.exit.0,
                    if said.is_empty() { "" } else { ": " }
                ),
            ));
        }
    };
    Ok(Response::ok(
        &json!({"manager": manager, "packages": packages}),
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn declared_fields() {
        let read = |id, query: &[(&str, &str)], body| {
            crate::routes::declared_args(&endpoints(), id, query, body)
        };
        for vars in [json!({"vars": ["A"]}), json!({"vars": "A=1"})] {
            assert_eq!(read("env_set", &[], vars).unwrap_err(), VARS_SENTENCE);
        }
        // None is an empty update (a `null` reads as none).
        for vars in [json!({}), json!({"vars": null})] {
            assert!(read("env_set", &[], vars).unwrap().value("vars").is_none());
        }
        assert!(is_variable_name("_A1") && is_variable_name("a"));
        assert!(!is_variable_name("1A") && !is_variable_name("") && !is_variable_name("A-B"));
        assert_eq!(
            read("packages", &[], json!(null)).unwrap().str("manager"),
            Some("pip")
        );
        assert_eq!(
            read("packages", &[("manager", "npm")], json!(null))
                .unwrap()
                .str("manager"),
            Some("npm")
        );
        assert_eq!(
            read("env_get", &[("filter", "A,B")], json!(null))
                .unwrap()
                .str("filter"),
            Some("A,B")
        );
    }
}
