//! A runtime's CLI, found or installed on first use.
//!
//! The contract: "The CLIs are not installed until a session uses them." The first
//! request that needs a runtime whose CLI is missing installs the pinned version
//! (`src/pins.env`, the same pin the tests use) with npm into a prefix the server owns,
//! `<ABX_STATE_DIR>/runtimes/<program>-<version>`, never globally. Requests on every
//! worker that arrive meanwhile wait for that one install; later ones use it.
//!
//! What is used, in order:
//! 1. the server's own install of the pinned version (`source: "managed"`);
//! 2. a CLI on the children's `PATH` that reports the pinned version (`"path"`);
//! 3. with `ABX_AGENTS_PATH_CLI=any`, a CLI on `PATH` at any version (`"path_unpinned"`);
//!    without it, a CLI at another version is not used, so what runs does not depend on
//!    what the image happens to carry;
//! 4. an install, unless `ABX_AGENTS_AUTO_INSTALL=0` (then the runtime is not installed,
//!    today's 503 refusal naming the npm command).
//!
//! Nothing half-installed is ever used: npm installs into a temporary prefix beside the
//! final one and only a complete install (its exit status 0 and the CLI's entry point
//! present) is renamed into place; a failed one is removed. Leftover temporary prefixes
//! of a server that died mid-install are removed before the next install. A failure is
//! remembered for [`RETRY_AFTER_FAILURE`], so a burst of requests gets the same answer at
//! once instead of one npm run each; the next request after that tries again.
//!
//! npm's output is read from its pipes on the worker's driver (never a pool thread
//! parked on a pipe); its last lines are kept for progress and for the failure's answer.
//! The installed CLIs need Node.js 22 or later (qwen-code's `engines`): when the
//! machine's `node` is older or missing, npm's `node-linux-<arch>` build of the pinned
//! Node.js goes into the same prefix, and children find it first on `PATH`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::runtime::{node_requirement, pin, Cli, Runtime};
use crate::process::output::Notify;
use crate::process::run::{run_to_end, Outputs, RunEnd};
use crate::process::{Child, ChildRegistry, Spawn};

/// How long a failed install is answered from memory before the next request retries.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(30);
/// The longest an npm install may run before it is killed.
pub const INSTALL_TIMEOUT: Duration = Duration::from_secs(900);
/// npm output lines kept for progress and the failure's answer.
const KEPT_LINES: usize = 20;

/// Where a CLI came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Managed,
    Path,
    PathUnpinned,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Managed => "managed",
            Source::Path => "path",
            Source::PathUnpinned => "path_unpinned",
        }
    }
}

/// A CLI ready to run.
#[derive(Clone, Debug)]
pub struct Located {
    /// The program to exec.
    pub program: PathBuf,
    /// Directories to put first on the child's `PATH` (the managed prefix's `.bin`, so
    /// its `node` is found by the CLI's `#!/usr/bin/env node`).
    pub path_prefix: Vec<PathBuf>,
    pub version: String,
    pub source: Source,
}

/// Why an install failed, with a code per cause.
#[derive(Clone, Debug)]
pub struct InstallFailure {
    /// `agents.install_failed.registry`, `.node`, `.disk_full`, `.npm_missing`, or
    /// `agents.install_failed` for anything else.
    pub code: &'static str,
    pub message: String,
    /// npm's last lines.
    pub last_lines: Vec<String>,
}

/// What the installer's settings are.
#[derive(Clone, Debug)]
pub struct InstallSettings {
    /// Where installs go: `<ABX_STATE_DIR>/runtimes`.
    pub root: PathBuf,
    /// `ABX_AGENTS_AUTO_INSTALL` (default on).
    pub auto_install: bool,
    /// `ABX_AGENTS_PATH_CLI=any`: a CLI on `PATH` at another version is used.
    pub any_path_version: bool,
    /// `ABX_AGENTS_NPM_REGISTRY`: npm's `--registry`.
    pub registry: Option<String>,
}

#[derive(Clone)]
enum Slot {
    Idle,
    /// `lines` keeps the last [`KEPT_LINES`] of the `total` printed so far.
    Installing {
        lines: Vec<String>,
        total: usize,
    },
    Failed {
        failure: InstallFailure,
        at: Instant,
    },
}

/// What [`Installer::begin`] found.
pub enum Begin {
    Ready(Located),
    /// An install is running (perhaps just started by this call): watch it.
    Installing(Watch),
    /// Auto-install is off and no usable CLI is there.
    NotInstalled,
    /// The last install failed less than [`RETRY_AFTER_FAILURE`] ago.
    Failed(InstallFailure),
}

/// The installs of this server, shared by every worker.
pub struct Installer {
    settings: InstallSettings,
    slots: Mutex<Vec<(Runtime, Slot)>>,
    changed: Notify,
}

/// What the caller's request contributes to an install it may start.
pub struct InstallContext {
    /// The children's environment (npm runs with it).
    pub env: Vec<(OsString, OsString)>,
    pub children: Arc<ChildRegistry>,
}

impl Installer {
    pub fn new(settings: InstallSettings) -> Installer {
        Installer {
            settings,
            slots: Mutex::new(Vec::new()),
            changed: Notify::default(),
        }
    }

    pub fn settings(&self) -> &InstallSettings {
        &self.settings
    }

    fn slot(&self, runtime: Runtime) -> Slot {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .iter()
            .find(|(r, _)| *r == runtime)
            .map_or(Slot::Idle, |(_, s)| s.clone())
    }

    fn set_slot(&self, runtime: Runtime, slot: Slot) {
        {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            match slots.iter_mut().find(|(r, _)| *r == runtime) {
                Some(entry) => entry.1 = slot,
                None => slots.push((runtime, slot)),
            }
        }
        self.changed.notify();
    }

    /// The managed prefix of `runtime`'s pinned version.
    pub fn prefix(&self, runtime: Runtime) -> Option<PathBuf> {
        let cli = runtime.cli()?;
        Some(
            self.settings
                .root
                .join(format!("{}-{}", cli.program, cli.version)),
        )
    }

    /// The managed install, when it is complete. Blocking (a stat): call on the pool.
    pub fn managed(&self, runtime: Runtime) -> Option<Located> {
        let cli = runtime.cli()?;
        let bin = self.prefix(runtime)?.join("node_modules/.bin");
        let program = bin.join(cli.program);
        program.is_file().then(|| Located {
            program,
            path_prefix: vec![bin],
            version: cli.version.to_string(),
            source: Source::Managed,
        })
    }

    /// A usable CLI, an install to watch, or why there is none. `on_path` is the CLI
    /// found on the children's `PATH` with the version it reports (the caller looks it
    /// up, on the pool and the driver). Starts the install (on this worker, detached, so
    /// a caller that leaves does not stop it) when one is due.
    pub fn begin(
        self: &Arc<Self>,
        runtime: Runtime,
        managed: Option<Located>,
        on_path: Option<(PathBuf, String)>,
        context: InstallContext,
    ) -> Begin {
        if let Some(located) = managed {
            return Begin::Ready(located);
        }
        let Some(cli) = runtime.cli() else {
            return Begin::NotInstalled;
        };
        if let Some((program, version)) = on_path {
            if version == cli.version || self.settings.any_path_version {
                let source = if version == cli.version {
                    Source::Path
                } else {
                    Source::PathUnpinned
                };
                return Begin::Ready(Located {
                    program,
                    path_prefix: Vec::new(),
                    version,
                    source,
                });
            }
        }
        if !self.settings.auto_install {
            return Begin::NotInstalled;
        }
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let entry = match slots.iter().position(|(r, _)| *r == runtime) {
            Some(at) => at,
            None => {
                slots.push((runtime, Slot::Idle));
                slots.len() - 1
            }
        };
        match &slots[entry].1 {
            Slot::Installing { .. } => {}
            Slot::Failed { failure, at } if at.elapsed() < RETRY_AFTER_FAILURE => {
                return Begin::Failed(failure.clone());
            }
            Slot::Idle | Slot::Failed { .. } => {
                slots[entry].1 = Slot::Installing {
                    lines: Vec::new(),
                    total: 0,
                };
                drop(slots);
                self.changed.notify();
                let installer = self.clone();
                monoio::spawn(async move {
                    let outcome = installer.install(runtime, context).await;
                    let slot = match outcome {
                        Ok(()) => Slot::Idle,
                        Err(failure) => Slot::Failed {
                            failure,
                            at: Instant::now(),
                        },
                    };
                    installer.set_slot(runtime, slot);
                });
                return Begin::Installing(Watch {
                    installer: self.clone(),
                    runtime,
                    seen_lines: 0,
                });
            }
        }
        Begin::Installing(Watch {
            installer: self.clone(),
            runtime,
            seen_lines: 0,
        })
    }

    /// Whether an install of `runtime` is running now (for `/v1/agents/runtimes`).
    pub fn installing(&self, runtime: Runtime) -> bool {
        matches!(self.slot(runtime), Slot::Installing { .. })
    }

    /// The last failure, while it is remembered.
    pub fn last_failure(&self, runtime: Runtime) -> Option<InstallFailure> {
        match self.slot(runtime) {
            Slot::Failed { failure, at } if at.elapsed() < RETRY_AFTER_FAILURE => Some(failure),
            _ => None,
        }
    }

    fn push_line(&self, runtime: Runtime, line: String) {
        {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, Slot::Installing { lines, total })) =
                slots.iter_mut().find(|(r, _)| *r == runtime)
            {
                if lines.len() == KEPT_LINES {
                    lines.remove(0);
                }
                lines.push(line);
                *total += 1;
            }
        }
        self.changed.notify();
    }

    /// One install: npm into a temporary prefix, then a rename into place.
    async fn install(
        &self,
        runtime: Runtime,
        context: InstallContext,
    ) -> Result<(), InstallFailure> {
        let cli = runtime
            .cli()
            .expect("only implemented runtimes are installed");
        let root = self.settings.root.clone();
        let final_prefix = self.prefix(runtime).expect("an implemented runtime");
        let temporary = root.join(format!(
            ".{}-{}.partial-{}",
            cli.program,
            cli.version,
            std::process::id()
        ));
        let prepared = {
            let (root, temporary) = (root.clone(), temporary.clone());
            blocking(move || prepare(&root, &temporary)).await
        };
        let cwd = prepared.map_err(|e| io_failure("cannot prepare the install directory", &e))?;
        let mut packages = vec![format!("{}@{}", cli.package, cli.version)];
        // qwen-code asks for Node.js 22 (`engines`); codex's launcher runs on 16 and
        // later, so it does not pay for a second Node.js.
        if runtime == Runtime::QwenCode && !node_is_new_enough(&context).await {
            packages.push(format!(
                "node-linux-{}@{}",
                node_arch(),
                pin("NODE_VERSION")
            ));
        }
        let mut argv: Vec<String> = [
            "npm",
            "install",
            "--no-save",
            "--no-audit",
            "--no-fund",
            "--no-update-notifier",
            "--loglevel=http",
            "--prefix",
        ]
        .map(String::from)
        .into();
        argv.push(temporary.display().to_string());
        if let Some(registry) = &self.settings.registry {
            argv.push(format!("--registry={registry}"));
        }
        argv.extend(packages.iter().cloned());
        let starting = format!(
            "installing {} into {}",
            packages.join(" "),
            final_prefix.display()
        );
        crate::log!("agents: {starting}");
        self.push_line(runtime, starting);
        let mut child = match spawn_captured(argv, cwd, &context).await {
            Ok(child) => child,
            Err(e) => {
                let _ = remove(temporary).await;
                return Err(if e.kind() == std::io::ErrorKind::NotFound {
                    InstallFailure {
                        code: "agents.install_failed.npm_missing",
                        message: format!(
                            "npm is not installed, so {} {} cannot be installed: install Node.js {} and npm in the image, or install the CLI yourself (`{}`)",
                            cli.package,
                            cli.version,
                            pin("NODE_MINIMUM_MAJOR"),
                            runtime.install_command().unwrap_or_default()
                        ),
                        last_lines: Vec::new(),
                    }
                } else {
                    io_failure("cannot start npm", &e)
                });
            }
        };
        let mut kept: Vec<String> = Vec::new();
        let outcome = self.follow(runtime, &mut child, &mut kept).await;
        let installed = temporary.join("node_modules/.bin").join(cli.program);
        match outcome {
            Ok(0) => {
                let moved = {
                    let (temporary, final_prefix) = (temporary.clone(), final_prefix.clone());
                    blocking(move || {
                        if !installed.is_file() {
                            return Err(std::io::Error::other(format!(
                                "npm succeeded but {} is missing",
                                installed.display()
                            )));
                        }
                        commit(&temporary, &final_prefix)
                    })
                    .await
                };
                match moved {
                    Ok(()) => {
                        crate::log!("agents: installed {} {}", cli.package, cli.version);
                        Ok(())
                    }
                    Err(e) => {
                        let _ = remove(temporary).await;
                        Err(InstallFailure {
                            last_lines: kept,
                            ..io_failure("the install did not complete", &e)
                        })
                    }
                }
            }
            Ok(status) => {
                let _ = remove(temporary).await;
                let failure = classify(&cli, status, kept);
                crate::log!("agents: {} ({})", failure.message, failure.code);
                Err(failure)
            }
            Err(message) => {
                let _ = remove(temporary).await;
                Err(InstallFailure {
                    code: "agents.install_failed",
                    message,
                    last_lines: kept,
                })
            }
        }
    }

    /// Reads npm's output to its end, keeping the last lines, and returns its status.
    async fn follow(
        &self,
        runtime: Runtime,
        child: &mut Child,
        kept: &mut Vec<String>,
    ) -> Result<i32, String> {
        let mut outputs =
            Outputs::of(child).map_err(|e| format!("cannot read npm's output: {e}"))?;
        let deadline = Instant::now() + INSTALL_TIMEOUT;
        let mut lines = crate::process::run::Lines::default();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match monoio::time::timeout(left, outputs.next()).await {
                Err(_) => {
                    let _ = child.kill().await;
                    return Err(format!(
                        "npm did not finish within {} s",
                        INSTALL_TIMEOUT.as_secs()
                    ));
                }
                Ok(None) => break,
                Ok(Some(Err(_))) => continue,
                Ok(Some(Ok((_, text)))) => {
                    for line in lines.push(&text) {
                        self.keep(runtime, kept, line);
                    }
                }
            }
        }
        if let Some(line) = lines.finish() {
            self.keep(runtime, kept, line);
        }
        match child.wait().await {
            Ok(code) => Ok(code.0),
            Err(e) => Err(format!("cannot wait for npm: {e}")),
        }
    }

    fn keep(&self, runtime: Runtime, kept: &mut Vec<String>, line: String) {
        let line = line.trim_end().to_string();
        if line.is_empty() {
            return;
        }
        if kept.len() == KEPT_LINES {
            kept.remove(0);
        }
        kept.push(line.clone());
        self.push_line(runtime, line);
    }
}

/// Follows one install for a waiting request.
pub struct Watch {
    installer: Arc<Installer>,
    runtime: Runtime,
    seen_lines: usize,
}

/// What a [`Watch`] saw next.
pub enum Progress {
    /// npm printed these lines (or the install just started).
    Lines(Vec<String>),
    /// The install ended: ready, or why not.
    Done(Result<(), InstallFailure>),
}

impl Watch {
    /// The next progress: new lines, or the end of the install.
    pub async fn next(&mut self) -> Progress {
        loop {
            let seen = self.installer.changed.version();
            match self.installer.slot(self.runtime) {
                Slot::Installing { lines, total } if total > self.seen_lines => {
                    // Lines that scrolled out of the kept window are skipped.
                    let fresh = (total - self.seen_lines).min(lines.len());
                    self.seen_lines = total;
                    return Progress::Lines(lines[lines.len() - fresh..].to_vec());
                }
                Slot::Installing { .. } => {}
                Slot::Idle => return Progress::Done(Ok(())),
                Slot::Failed { failure, .. } => return Progress::Done(Err(failure)),
            }
            self.installer.changed.changed(seen).await;
        }
    }

    /// Waits for the end of the install, at most `wait`; `None` when it is still
    /// running then.
    pub async fn finish_within(&mut self, wait: Duration) -> Option<Result<(), InstallFailure>> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match monoio::time::timeout(left, self.next()).await {
                Err(_) => return None,
                Ok(Progress::Lines(_)) => continue,
                Ok(Progress::Done(outcome)) => return Some(outcome),
            }
        }
    }
}

/// Creates the root (mode 0700: it is the server's state) and removes leftover
/// temporary prefixes of this runtime; returns the root, opened as a working directory.
fn prepare(root: &Path, temporary: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)?;
    let stem = temporary
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split(".partial-").next())
        .unwrap_or_default()
        .to_string();
    for entry in std::fs::read_dir(root)?.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&format!("{stem}.partial-")) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = rustix::fs::open(
        root,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    Ok(dir)
}

/// Renames the complete temporary prefix into place. Another server sharing the state
/// directory may have finished first: then its install is kept and ours removed.
fn commit(temporary: &Path, final_prefix: &Path) -> std::io::Result<()> {
    match std::fs::rename(temporary, final_prefix) {
        Ok(()) => Ok(()),
        Err(_) if final_prefix.is_dir() => {
            let _ = std::fs::remove_dir_all(temporary);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

async fn remove(path: PathBuf) -> std::io::Result<()> {
    blocking(move || match std::fs::remove_dir_all(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    })
    .await
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    crate::runtime::file::blocking(work).await?
}

fn io_failure(what: &str, error: &std::io::Error) -> InstallFailure {
    let disk_full = error.raw_os_error() == Some(libc_enospc());
    InstallFailure {
        code: if disk_full {
            "agents.install_failed.disk_full"
        } else {
            "agents.install_failed"
        },
        message: format!("{what}: {error}"),
        last_lines: Vec::new(),
    }
}

fn libc_enospc() -> i32 {
    rustix::io::Errno::NOSPC.raw_os_error()
}

/// Names the cause of a failed npm run from what it printed.
fn classify(cli: &Cli, status: i32, last_lines: Vec<String>) -> InstallFailure {
    let text = last_lines.join("\n");
    let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
    let (code, cause) = if has(&["ENOSPC", "no space left"]) {
        (
            "agents.install_failed.disk_full",
            "the disk is full".to_string(),
        )
    } else if has(&[
        "EBADENGINE",
        "Unsupported engine",
        "npm does not support Node.js",
    ]) {
        (
            "agents.install_failed.node",
            format!(
                "npm or the CLI needs {}; this machine's is too old",
                node_requirement()
            ),
        )
    } else if has(&[
        "ENOTFOUND",
        "ECONNREFUSED",
        "ECONNRESET",
        "EAI_AGAIN",
        "ETIMEDOUT",
        "E404",
        "E403",
        "E500",
        "E502",
        "E503",
        "network",
        "registry",
        "Invalid URL",
        "ERR_INVALID_URL",
    ]) {
        (
            "agents.install_failed.registry",
            "the npm registry could not be reached or did not serve the package".to_string(),
        )
    } else {
        (
            "agents.install_failed",
            format!("npm exited with status {status}"),
        )
    };
    InstallFailure {
        code,
        message: format!(
            "Installing {}@{} failed: {cause}. Nothing was installed; the next request tries again after {} s.",
            cli.package,
            cli.version,
            RETRY_AFTER_FAILURE.as_secs()
        ),
        last_lines,
    }
}

/// npm's name for this machine's architecture in `node-linux-<arch>`.
fn node_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        "arm" => "armv7l",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        _ => "x64",
    }
}

/// Starts `argv` with the children's environment and its output captured.
async fn spawn_captured(
    argv: Vec<String>,
    cwd: std::os::fd::OwnedFd,
    context: &InstallContext,
) -> std::io::Result<Child> {
    let spec = Spawn {
        user: None,
        argv,
        cwd,
        env: context.env.clone(),
        stdin: false,
        capture: true,
        terminal: None,
    };
    Child::spawn(spec, &context.children).await
}

/// Whether the machine's `node` (on the children's `PATH`) is new enough for the CLIs.
async fn node_is_new_enough(context: &InstallContext) -> bool {
    let Ok(cwd) = rustix::fs::open(
        "/",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return false;
    };
    let spawned = spawn_captured(vec!["node".into(), "--version".into()], cwd, context).await;
    let Ok(child) = spawned else {
        return false;
    };
    let minimum: u32 = pin("NODE_MINIMUM_MAJOR").parse().unwrap_or(22);
    match run_to_end(child, Duration::from_secs(10), 4096).await {
        Ok(RunEnd::Completed(done)) => node_major(&done.stdout).is_some_and(|m| m >= minimum),
        _ => false,
    }
}

/// `v20.20.2` is 20.
fn node_major(version: &str) -> Option<u32> {
    version
        .trim()
        .strip_prefix('v')?
        .split('.')
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_versions() {
        assert_eq!(node_major("v20.20.2\n"), Some(20));
        assert_eq!(node_major("v22.0.0"), Some(22));
        assert_eq!(node_major("22.0.0"), None);
    }

    #[test]
    fn failures_are_named_by_cause() {
        let cli = Runtime::Codex.cli().unwrap();
        let lines = |l: &str| vec![l.to_string()];
        assert_eq!(
            classify(&cli, 1, lines("npm error code ECONNREFUSED")).code,
            "agents.install_failed.registry"
        );
        assert_eq!(
            classify(
                &cli,
                1,
                lines("npm error nospc ENOSPC: no space left on device")
            )
            .code,
            "agents.install_failed.disk_full"
        );
        assert_eq!(
            classify(&cli, 1, lines("npm warn EBADENGINE Unsupported engine")).code,
            "agents.install_failed.node"
        );
        let other = classify(&cli, 7, lines("something else"));
        assert_eq!(other.code, "agents.install_failed");
        assert!(other.message.contains("status 7"), "{}", other.message);
        assert_eq!(other.last_lines, ["something else"]);
    }

    #[test]
    fn a_complete_install_is_renamed_and_leftovers_removed() {
        let root = std::env::temp_dir().join(format!("abx-install-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join(".codex-1.partial-1/node_modules")).unwrap();
        let temporary = root.join(".codex-1.partial-2");
        prepare(&root, &temporary).unwrap();
        assert!(
            !root.join(".codex-1.partial-1").exists(),
            "a leftover stays"
        );
        std::fs::create_dir_all(temporary.join("node_modules/.bin")).unwrap();
        let final_prefix = root.join("codex-1");
        commit(&temporary, &final_prefix).unwrap();
        assert!(final_prefix.join("node_modules/.bin").is_dir());
        assert!(!temporary.exists());
        // A second finisher keeps the first's install.
        std::fs::create_dir_all(temporary.join("node_modules")).unwrap();
        std::fs::write(final_prefix.join("marker"), b"first").unwrap();
        commit(&temporary, &final_prefix).unwrap();
        assert_eq!(
            std::fs::read(final_prefix.join("marker")).unwrap(),
            b"first"
        );
        assert!(!temporary.exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
