//! The CLI a turn runs: found, or installed on first use (`crate::agents::install` has
//! the rules). This adapter looks the CLI up where the domain cannot (the children's
//! `PATH` on the pool, its `--version` through the spawn path), hands the rest to the
//! [`Installer`], and words what the installer reports: 503s with `Retry-After` while
//! an install runs, a code per cause when one failed.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::agents::install::{
    Begin, InstallContext, InstallFailure, InstallSettings, Installer, Located, Watch,
};
use crate::agents::{AgentError, Runtime};
use crate::api::ApiError;
use crate::app::Call;

/// Seconds a client is told to wait before it retries during an install.
const RETRY_DURING_INSTALL_SECS: u64 = 10;

/// The installer this server's settings describe.
pub fn installer(config: &crate::config::Config) -> Installer {
    Installer::new(InstallSettings {
        root: config.state_dir.join("runtimes"),
        auto_install: config.agents_auto_install,
        any_path_version: config.agents_any_path_cli,
        registry: config.agents_npm_registry.clone(),
    })
}

/// What [`find`] came to.
pub enum Found {
    Ready(Located),
    /// An install is running: the caller may watch it (a stream) or wait.
    Installing(Watch),
}

/// The CLI on the children's `PATH` and the version it reports, if there is one.
async fn on_path(call: &Call, runtime: Runtime) -> Option<(PathBuf, String)> {
    let env = call.services().environment.snapshot();
    let path = crate::runtime::blocking(move || runtime.find_cli(&env))
        .await
        .ok()
        .flatten()?;
    let version = version_of(call, &path).await?;
    Some((path, version))
}

/// What `program --version` prints, asked once per path.
pub async fn version_of(call: &Call, program: &std::path::Path) -> Option<String> {
    let cwd = crate::routes::shared::working_dir(call, None).await.ok()?;
    let services = call.services();
    let env = services.environment.with(&[]);
    crate::agents::cli_version(program, cwd, env, &services.children).await
}

/// The managed install of `runtime`, when it is complete (a stat, on the pool).
async fn managed(installer: &Arc<Installer>, runtime: Runtime) -> Option<Located> {
    let installer = installer.clone();
    crate::runtime::blocking(move || installer.managed(runtime))
        .await
        .ok()
        .flatten()
}

/// What `/v1/agents/runtimes` reports of a runtime's CLI, without installing it.
pub struct Status {
    /// The CLI a turn would run now.
    pub usable: Option<Located>,
    /// A CLI on `PATH` at another version, which is not used.
    pub ignored: Option<(PathBuf, String)>,
    pub installing: bool,
    pub last_failure: Option<InstallFailure>,
}

pub async fn status(call: &Call, runtime: Runtime) -> Result<Status, ApiError> {
    let installer = call.group_arc::<Installer>()?;
    let mut status = Status {
        usable: managed(&installer, runtime).await,
        ignored: None,
        installing: installer.installing(runtime),
        last_failure: installer.last_failure(runtime),
    };
    if status.usable.is_none() {
        if let Some((program, version)) = on_path(call, runtime).await {
            let pinned = runtime.cli().is_some_and(|c| c.version == version);
            if pinned || installer.settings().any_path_version {
                status.usable = Some(Located {
                    program,
                    path_prefix: Vec::new(),
                    source: if pinned {
                        crate::agents::install::Source::Path
                    } else {
                        crate::agents::install::Source::PathUnpinned
                    },
                    version,
                });
            } else {
                status.ignored = Some((program, version));
            }
        }
    }
    Ok(status)
}

/// Finds `runtime`'s CLI, starting its install when it is due.
pub async fn find(call: &Call, runtime: Runtime) -> Result<Found, ApiError> {
    let installer = call.group_arc::<Installer>()?;
    let managed = managed(&installer, runtime).await;
    let on_path = match managed {
        Some(_) => None,
        None => on_path(call, runtime).await,
    };
    let context = InstallContext {
        env: call.services().environment.with(&[]),
        children: call.services().children.clone(),
    };
    match installer.begin(runtime, managed, on_path, context) {
        Begin::Ready(located) => Ok(Found::Ready(located)),
        Begin::Installing(watch) => Ok(Found::Installing(watch)),
        Begin::NotInstalled => Err(AgentError::NotInstalled(runtime).into()),
        Begin::Failed(failure) => Err(install_failed(runtime, &failure)),
    }
}

/// Finds `runtime`'s CLI, waiting for an install up to `ABX_AGENTS_INSTALL_WAIT`.
pub async fn ready(call: &Call, runtime: Runtime) -> Result<Located, ApiError> {
    match find(call, runtime).await? {
        Found::Ready(located) => Ok(located),
        Found::Installing(mut watch) => {
            let wait = call.config().agents_install_wait;
            match watch.finish_within(wait).await {
                None => Err(still_installing(runtime, wait.as_secs())),
                Some(Err(failure)) => Err(install_failed(runtime, &failure)),
                Some(Ok(())) => installed(call, runtime).await,
            }
        }
    }
}

/// The CLI once its install ended well.
pub async fn installed(call: &Call, runtime: Runtime) -> Result<Located, ApiError> {
    let installer = call.group_arc::<Installer>()?;
    managed(&installer, runtime).await.ok_or_else(|| {
        ApiError::new(
            500,
            "server_error",
            format!(
                "The {} CLI was installed but is not where it was put; retry.",
                runtime.name()
            ),
        )
    })
}

/// The child environment with the CLI's own directories first on `PATH`.
pub fn environment(call: &Call, located: &Located) -> Vec<(OsString, OsString)> {
    let mut env = call.services().environment.with(&[]);
    if located.path_prefix.is_empty() {
        return env;
    }
    let mut path = OsString::new();
    for dir in &located.path_prefix {
        path.push(dir.as_os_str());
        path.push(":");
    }
    match env.iter_mut().find(|(name, _)| name == "PATH") {
        Some((_, value)) => {
            path.push(&*value);
            *value = path;
        }
        None => {
            path.push("/usr/local/bin:/usr/bin:/bin");
            env.push(("PATH".into(), path));
        }
    }
    env
}

/// What a streamed response shows while the CLI installs: the note in its
/// `x_agent_sandbox`.
pub fn install_note(runtime: Runtime, lines: &[String]) -> Value {
    let cli = runtime.cli();
    json!({
        "runtime": runtime.name(),
        "package": cli.as_ref().map(|c| c.package),
        "version": cli.as_ref().map(|c| c.version),
        "phase": "installing",
        "last_lines": lines,
    })
}

fn still_installing(runtime: Runtime, waited: u64) -> ApiError {
    let cli = runtime.cli();
    ApiError::new(
        503,
        "server_error",
        format!(
            "The {} CLI ({}@{}) is being installed on first use; it was not ready after {waited} s. Retry in a few seconds, or stream the request to follow the install.",
            runtime.name(),
            cli.as_ref().map_or("", |c| c.package),
            cli.as_ref().map_or("", |c| c.version),
        ),
    )
    .with_code("agents.runtime_installing")
    .with_header("Retry-After", RETRY_DURING_INSTALL_SECS.to_string())
}

/// 503 for a failed install: its cause's code, its message and npm's last lines.
pub fn install_failed(runtime: Runtime, failure: &InstallFailure) -> ApiError {
    let mut message = failure.message.clone();
    if !failure.last_lines.is_empty() {
        message.push_str(" npm's last lines: ");
        message.push_str(&failure.last_lines.join(" | "));
    }
    ApiError::new(503, "server_error", message)
        .with_code(failure.code)
        .with_field("x_agent_sandbox", install_details(runtime, failure))
        .with_header(
            "Retry-After",
            crate::agents::install::RETRY_AFTER_FAILURE
                .as_secs()
                .to_string(),
        )
}

fn install_details(runtime: Runtime, failure: &InstallFailure) -> Value {
    json!({
        "runtime": runtime.name(),
        "install_failed": failure.code,
        "last_lines": failure.last_lines,
    })
}
