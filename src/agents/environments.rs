//! Environments (`/v1/agents/environments`): this sandbox, as the Agents API's
//! execution environment, its files, and environment templates.
//!
//! **One environment.** An agent here runs in this sandbox, so the API lists exactly
//! one environment, `self_hosted`, always `ready`, whose id is derived from the
//! machine's host name and the base directory ([`environment_id`]: the same across
//! restarts, the same for every caller). Its `/workspace` is the base directory:
//! `/workspace/src/a.py` is `<base>/src/a.py`, confined beneath the base as every
//! caller path is (`openat2(RESOLVE_BENEATH)`; a `..` or a symlink out is refused).
//!
//! **Creating one** (`environments.create`, whose SDK type is `openai_hosted`) applies
//! what a sandbox can honour to this one and answers its `EnvironmentInfo`: an
//! `environment_template_id`'s configuration first, then the body's own, each as
//! inline `files` written into the workspace (atomically), `env` kept for the agents
//! the caller runs here (sealed, never returned; [`agent_env`] hands them to a
//! session), and `setup_commands` run in order with `/bin/sh -c` (their output is
//! not kept: the commands are confidential). What only a hosted environment has is
//! refused with `param`: packages, plugins, skills, capability directories, a desktop,
//! a network policy (the sandbox's network is the container's), `file_id` files (no
//! Files API here) and `vault_ids` (vaults reach MCP servers through a session's own
//! `vault_ids`). An `Idempotency-Key` is kept with the answer: the same key and body
//! answer the same `EnvironmentInfo` without applying anything again; the same key
//! with another body is refused; a key whose first request is still running is 409.
//!
//! **Templates** are stored configurations (the same fields and refusals); their `env`,
//! `setup_commands` and file contents are write-only, kept sealed
//! ([`super::seal`]).

use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustix::fs::OFlags;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::body::{index, invalid, join, unsupported, Fields};
use super::error::AgentError;
use super::objects::{label, now_unix, Object, LIST_DIFFERENCES};
use super::records::{new_id, Collection, ObjectStore, Record, Scope, StoreError, Transaction};
use super::seal;
use super::surface::Agents;
use crate::fs::walk::{self, Entry, Order as WalkOrder, Rules, Visit, Visitor};
use crate::fs::{BaseDir, CallerPath, FsError};
use crate::process::{ChildRegistry, Spawn};
use crate::runtime::IoDriver;

/// Environment templates one identity keeps at most.
pub const MAX_TEMPLATES_PER_OWNER: usize = 100;
/// Environment templates kept at most.
pub const MAX_TEMPLATES: usize = 10_000;
/// Decoded bytes of one template's inline files, all together.
pub const MAX_TEMPLATE_FILE_BYTES: usize = 4 * 1024 * 1024;
/// Files, setup commands or variables one configuration holds at most.
pub const MAX_CONFIG_ENTRIES: usize = 100;
/// Idempotency keys one identity's creates keep (the oldest answered one is forgotten
/// past it).
pub const MAX_KEYS_PER_OWNER: usize = 1_000;
/// How long one setup command may run.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(600);
/// A claimed key whose request never finished (the server stopped meanwhile) may be
/// claimed again after this long.
const ABANDONED_CLAIM_SECS: u64 = 900;
/// Files an environment's info lists (the most recent ones the caller installed).
const MAX_LISTED_FILES: usize = 1_000;

/// What environments differ in from OpenAI's: the one environment is this sandbox.
pub const DIFFERENCES: [&str; 2] = ["environment_is_this_sandbox", "store_limits"];

pub static TEMPLATES: Collection = Collection {
    name: "environment_template",
    parent: None,
    max_total: MAX_TEMPLATES,
    max_per_owner: MAX_TEMPLATES_PER_OWNER,
    evicts: false,
};

pub static STATES: Collection = Collection {
    name: "environment_state",
    parent: None,
    max_total: usize::MAX,
    max_per_owner: 1,
    evicts: false,
};

pub static REQUESTS: Collection = Collection {
    name: "environment_request",
    parent: None,
    max_total: usize::MAX,
    max_per_owner: MAX_KEYS_PER_OWNER,
    evicts: true,
};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// This sandbox's environment id: `env_` and 24 hex digits of a hash of the host name
/// and the base directory.
pub fn environment_id(base: &Path) -> String {
    let host = rustix::system::uname();
    let digest = Sha256::new()
        .chain_update(b"agent-sandbox environment\0")
        .chain_update(host.nodename().to_bytes())
        .chain_update(b"\0")
        .chain_update(base.as_os_str().as_encoded_bytes())
        .finalize();
    format!("env_{}", &hex(&digest)[..24])
}

/// A record id of `owner`'s: ids are unique per collection, not per owner.
fn owner_key(owner: &str, what: &str) -> String {
    let digest = Sha256::new()
        .chain_update(owner.as_bytes())
        .chain_update(b"\0")
        .chain_update(what.as_bytes())
        .finalize();
    hex(&digest[..16])
}

/// A destination `/workspace/...` as a path beneath the base directory, refused as the
/// SDK's own helper refuses it (`lib/beta/agents/_files.py`): outside `/workspace/`, a
/// NUL or a backslash, an empty, `.` or `..` component, or a reserved path
/// (`/workspace/.codex`, `/workspace/.managed-agents*`, `/workspace/outputs`).
pub fn workspace_rel(path: &str, param: &str) -> Result<String, AgentError> {
    let Some(rel) = path.strip_prefix("/workspace/") else {
        return Err(invalid(param, format!("{param} must be an absolute path under /workspace/ (the sandbox's base directory).")));
    };
    if path.contains(['\0', '\\'])
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(invalid(
            param,
            format!(
                "{param} must be an absolute POSIX path without empty, '.' or '..' components."
            ),
        ));
    }
    let first = rel.split('/').next().unwrap_or_default();
    if first == ".codex"
        || first == ".managed-agents"
        || first.starts_with(".managed-agents-")
        || path == "/workspace/outputs"
    {
        return Err(invalid(
            param,
            format!("{param} is a reserved environment path."),
        ));
    }
    Ok(rel.to_string())
}

/// A directory `/workspace` or `/workspace/...` (a listing's `path`, a setup command's
/// `cwd`) beneath the base (`""` for the base itself).
pub fn workspace_dir(path: &str, param: &str) -> Result<String, AgentError> {
    let trimmed = path.trim_end_matches('/');
    if trimmed == "/workspace" {
        return Ok(String::new());
    }
    let rel = trimmed.strip_prefix("/workspace/").ok_or_else(|| {
        invalid(
            param,
            format!("{param} must be /workspace or a directory beneath it."),
        )
    })?;
    if trimmed.contains('\0')
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(invalid(
            param,
            format!(
                "{param} must be an absolute POSIX path without empty, '.' or '..' components."
            ),
        ));
    }
    Ok(rel.to_string())
}

/// The environment as the API shows it.
pub fn info(id: &str, files: &[Value], base: &Path) -> Value {
    let mut labelled = label("agent-sandbox", &DIFFERENCES);
    labelled["workspace_directory"] = json!(base.to_string_lossy());
    json!({
        "id": id,
        "object": "agent.environment",
        "type": "self_hosted",
        "status": "ready",
        "files": files,
        "plugins": [],
        "skills": [],
        "x_agent_sandbox": labelled,
    })
}

/// One inline file of a configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InlineFile {
    /// `/workspace/...`.
    pub path: String,
    /// Standard base64, as sent.
    pub data: String,
    pub size_bytes: u64,
}

/// A setup command; `cwd` beneath the base (`""`: the base).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SetupCommand {
    pub command: String,
    pub cwd: String,
}

/// What a sandbox can honour of a hosted environment configuration (a create body's
/// `environment`, a template's body).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HostedConfig {
    pub files: Vec<InlineFile>,
    pub env: Vec<(String, String)>,
    pub setup_commands: Vec<SetupCommand>,
}

/// Whether `name` may be given to an agent: a shell variable name, not one that loads
/// code (`LD_PRELOAD`, ...), nor the server's (`ABX_*`) or codex's own (`CODEX_*`),
/// nor `PATH` and `HOME`, which the CLI needs as the server gives them.
fn env_name_ok(name: &str) -> bool {
    let mut bytes = name.bytes();
    let starts = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    let upper = name.to_ascii_uppercase();
    starts
        && name.len() <= 256
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !crate::process::env::loads_code(name)
        && !upper.starts_with("ABX_")
        && !upper.starts_with("CODEX_")
        && upper != "PATH"
        && upper != "HOME"
}

/// Decoded size of standard base64 `data`, or `None` when it is not base64.
fn decoded_size(data: &str) -> Option<u64> {
    base64_simd::STANDARD
        .decode_to_vec(data)
        .ok()
        .map(|d| d.len() as u64)
}

impl HostedConfig {
    /// Reads the fields of a configuration object at `at` (`environment` or `""` for a
    /// template), refusing what a sandbox cannot honour; `max_file` bounds one file's
    /// decoded bytes and `max_files` all of them. The caller reads (or refuses) the
    /// other keys of `f` and calls `done`.
    pub fn parse(
        f: &mut Fields<'_>,
        max_file: u64,
        max_files: u64,
    ) -> Result<HostedConfig, AgentError> {
        let mut config = HostedConfig::default();
        if f.strings("capability_directories")?
            .is_some_and(|d| !d.is_empty())
        {
            return Err(unsupported(f.param("capability_directories"), "capability_directories cannot be honoured: a sandbox has no hosted capability mounts."));
        }
        if let Some(mut desktop) = f.object("desktop")? {
            let enabled = desktop.bool("enabled")?.ok_or_else(|| {
                invalid(
                    desktop.param("enabled"),
                    format!("{} is required.", desktop.param("enabled")),
                )
            })?;
            if enabled {
                return Err(unsupported(desktop.param("enabled"), "A desktop cannot be honoured: this sandbox provisions no desktop or browser proxy."));
            }
            desktop.done()?;
        }
        if f.get("network").is_some() {
            return Err(unsupported(f.param("network"), "network cannot be honoured: this sandbox's network is the container's, which the server does not restrict or open."));
        }
        if let Some(mut packages) = f.object("packages")? {
            for key in ["npm", "python", "system"] {
                if packages.strings(key)?.is_some_and(|p| !p.is_empty()) {
                    return Err(unsupported(packages.param(key), format!("{} cannot be honoured: install packages with a setup command (or POST /shell) instead.", packages.param(key))));
                }
            }
            packages.done()?;
        }
        for key in ["plugins", "skills"] {
            if f.array(key)?.is_some_and(|p| !p.is_empty()) {
                return Err(unsupported(
                    f.param(key),
                    format!(
                        "{} cannot be honoured: codex here has no hosted {key}.",
                        f.param(key)
                    ),
                ));
            }
        }
        if let Some(env) = f.string_map("env")? {
            if env.len() > MAX_CONFIG_ENTRIES {
                return Err(invalid(
                    f.param("env"),
                    format!(
                        "{} holds at most {MAX_CONFIG_ENTRIES} variables.",
                        f.param("env")
                    ),
                ));
            }
            for (name, value) in env {
                let value = value.as_str().unwrap_or_default();
                if !env_name_ok(&name) {
                    return Err(invalid(join(&f.param("env"), &name), format!("{} is not a variable an agent may be given (letters, digits and '_'; not PATH, HOME, ABX_*, CODEX_* or one that makes programs load code).", join(&f.param("env"), &name))));
                }
                if value.contains('\0') {
                    return Err(invalid(
                        join(&f.param("env"), &name),
                        "A variable's value cannot hold a NUL byte.",
                    ));
                }
                config.env.push((name, value.to_string()));
            }
        }
        let mut total = 0u64;
        if let Some(files) = f.array("files")? {
            if files.len() > MAX_CONFIG_ENTRIES {
                return Err(invalid(
                    f.param("files"),
                    format!(
                        "{} holds at most {MAX_CONFIG_ENTRIES} files.",
                        f.param("files")
                    ),
                ));
            }
            for (i, file) in files.iter().enumerate() {
                let mut file = Fields::of(file, &index(&f.param("files"), i))?;
                match file.choice("type", &["inline", "file_id"])?.as_deref() {
                    Some("inline") => {}
                    Some(_) => return Err(unsupported(file.param("type"), "file_id files cannot be honoured: this server has no Files API; send the contents inline (type inline, base64 data).")),
                    None => return Err(invalid(file.param("type"), format!("{} is required.", file.param("type")))),
                }
                let path = file.required_string("path")?;
                workspace_rel(&path, &file.param("path"))?;
                let data = file.required_string("data")?;
                let size = decoded_size(&data).ok_or_else(|| {
                    invalid(
                        file.param("data"),
                        format!("{} must be standard base64.", file.param("data")),
                    )
                })?;
                if size > max_file {
                    return Err(too_large(&file.param("data"), max_file));
                }
                total += size;
                if total > max_files {
                    return Err(too_large(&f.param("files"), max_files));
                }
                file.done()?;
                config.files.push(InlineFile {
                    path,
                    data,
                    size_bytes: size,
                });
            }
        }
        if let Some(commands) = f.array("setup_commands")? {
            if commands.len() > MAX_CONFIG_ENTRIES {
                return Err(invalid(
                    f.param("setup_commands"),
                    format!(
                        "{} holds at most {MAX_CONFIG_ENTRIES} commands.",
                        f.param("setup_commands")
                    ),
                ));
            }
            for (i, command) in commands.iter().enumerate() {
                let mut c = Fields::of(command, &index(&f.param("setup_commands"), i))?;
                let text = c.required_string("command")?;
                if text.contains('\0') {
                    return Err(invalid(
                        c.param("command"),
                        "A setup command cannot hold a NUL byte.",
                    ));
                }
                let cwd = match c.string("cwd")? {
                    Some(cwd) => workspace_dir(&cwd, &c.param("cwd"))?,
                    None => String::new(),
                };
                c.done()?;
                config
                    .setup_commands
                    .push(SetupCommand { command: text, cwd });
            }
        }
        Ok(config)
    }
}

fn too_large(param: &str, limit: u64) -> AgentError {
    AgentError::Rejected {
        status: 413,
        code: "agents_object_too_large",
        param: Some(param.to_string()),
        message: format!("{param} would hold more than {limit} bytes, the most this server takes."),
    }
}

/// What applying a configuration touches: this sandbox's base directory, its
/// children's environment and process registry, and the endpoint's policy.
pub struct Workspace<'a> {
    pub base: &'a BaseDir,
    pub driver: IoDriver,
    /// Decoded bytes one file may hold (`ABX_MAX_UPLOAD_SIZE`).
    pub max_file_bytes: u64,
    pub environment: &'a crate::process::env::Environment,
    pub children: &'a Arc<ChildRegistry>,
    /// The endpoint's policy `paths` rule: why it refuses a path, if it does.
    pub path_rule: &'a dyn Fn(&CallerPath) -> Option<String>,
    /// This sandbox's environment id.
    pub id: String,
}

impl Workspace<'_> {
    /// `rel` (beneath the base) confined, or the refusal naming `param`.
    pub fn confine(&self, rel: &str, param: &str) -> Result<CallerPath, AgentError> {
        let caller = self.base.confine(rel).map_err(|error| AgentError::File {
            error,
            param: param.to_string(),
        })?;
        match (self.path_rule)(&caller) {
            Some(message) => Err(AgentError::Rejected {
                status: 403,
                code: "path_not_allowed",
                param: Some(param.to_string()),
                message,
            }),
            None => Ok(caller),
        }
    }

    /// Writes one file (base64 `data`) at `/workspace/...` `path`, atomically; returns
    /// its size. A large file is decoded on the blocking pool.
    pub async fn write(&self, path: &str, data: String, param: &str) -> Result<u64, AgentError> {
        let rel = workspace_rel(path, param)?;
        let caller = self.confine(&rel, param)?;
        let large = data.len() > 64 * 1024;
        let decode = move || base64_simd::STANDARD.decode_to_vec(data.as_bytes()).ok();
        let decoded = match large {
            // Decoding megabytes takes milliseconds a worker must not spend.
            true => crate::runtime::blocking(decode).await.ok().flatten(),
            false => decode(),
        };
        let bytes = decoded.ok_or_else(|| {
            invalid(
                join(param.trim_end_matches("path"), "data"),
                "data must be standard base64.",
            )
        })?;
        let (written, _) =
            crate::fs::write::write_atomic(self.base, caller, bytes, self.driver, true)
                .await
                .map_err(|error| AgentError::File {
                    error,
                    param: param.to_string(),
                })?;
        Ok(written as u64)
    }

    /// Runs a setup command to its end; a non-zero exit refuses the request.
    async fn run(
        &self,
        command: &SetupCommand,
        env: &[(String, String)],
        param: &str,
    ) -> Result<(), AgentError> {
        let caller = self.confine(&command.cwd, &join(param, "cwd"))?;
        let cwd = if caller.is_base() {
            crate::fs::tree::open_base_creating(self.base).await
        } else {
            crate::fs::tree::open_dir(self.base, &caller).await
        }
        .map_err(|error| AgentError::File {
            error,
            param: join(param, "cwd"),
        })?;
        let spec = Spawn {
            user: None,
            argv: vec!["/bin/sh".into(), "-c".into(), command.command.clone()],
            cwd,
            env: self.environment.with(env),
            stdin: false,
            capture: true,
            terminal: None,
        };
        let child = crate::process::Child::spawn(spec, self.children)
            .await
            .map_err(|e| AgentError::Failed(format!("The setup command could not start: {e}")))?;
        // The output is dropped unread: setup commands are confidential, and so may be
        // what they print.
        let end = crate::process::run::run_to_end(child, SETUP_TIMEOUT, 64 * 1024)
            .await
            .map_err(|e| AgentError::Failed(format!("The setup command failed: {e}")))?;
        match end {
            crate::process::run::RunEnd::Completed(done) if done.exit.0 == 0 => Ok(()),
            crate::process::run::RunEnd::Completed(done) => Err(AgentError::Rejected {
                status: 400,
                code: "setup_command_failed",
                param: Some(param.to_string()),
                message: format!("{param} exited with status {}; nothing after it ran (files and variables before it stay applied).", done.exit.0),
            }),
            crate::process::run::RunEnd::TimedOut => Err(AgentError::Rejected {
                status: 400,
                code: "setup_command_timed_out",
                param: Some(param.to_string()),
                message: format!("{param} ran longer than {} s and was killed.", SETUP_TIMEOUT.as_secs()),
            }),
        }
    }
}

/// What one caller installed into this environment: the files its creates wrote (for
/// `EnvironmentInfo.files`) and the variables its agents get (sealed).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EnvironmentState {
    pub id: String,
    pub files: Vec<Value>,
    /// Sealed JSON object of the variables, when any were given.
    pub sealed_env: Option<String>,
}

impl Record for EnvironmentState {
    fn collection() -> &'static Collection {
        &STATES
    }
    fn id(&self) -> &str {
        &self.id
    }
}

fn state_id(owner: &str) -> String {
    format!("envstate_{}", owner_key(owner, "environment"))
}

fn env_binding(id: &str) -> String {
    format!("environment_state:{id}:env")
}

fn sealing_failed(e: seal::SealError) -> AgentError {
    AgentError::Failed(format!("The vault key is unusable: {}", e.0))
}

/// `owner`'s state, or an empty one.
fn state_of<T: Transaction>(t: &mut T, owner: &str) -> Result<EnvironmentState, AgentError> {
    let id = state_id(owner);
    match t.get::<EnvironmentState>(Scope::owner(owner), &id) {
        Ok(state) => Ok(state),
        Err(StoreError::NotFound) => Ok(EnvironmentState {
            id,
            files: Vec::new(),
            sealed_env: None,
        }),
        Err(e) => Err(e.into()),
    }
}

fn save_state<T: Transaction>(
    t: &mut T,
    owner: &str,
    state: EnvironmentState,
) -> Result<(), AgentError> {
    match t.get::<EnvironmentState>(Scope::owner(owner), &state.id) {
        Ok(_) => t.put(Scope::owner(owner), state)?,
        Err(_) => t.create(Scope::owner(owner), state)?,
    }
    Ok(())
}

/// The variables `owner`'s environment creates gave the agents it runs here (for a
/// session's children).
pub fn agent_env<T: Transaction>(
    t: &mut T,
    owner: &str,
) -> Result<Vec<(String, String)>, AgentError> {
    let state = state_of(t, owner)?;
    let Some(sealed) = state.sealed_env else {
        return Ok(Vec::new());
    };
    let env = seal::open_json(&env_binding(&state.id), &sealed).map_err(sealing_failed)?;
    Ok(env
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default())
}

/// An `Idempotency-Key` of `environments.create` and what it answered.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateRequest {
    pub id: String,
    /// SHA-256 of the body (not the body: it may hold secrets).
    pub fingerprint: String,
    pub claimed_at: u64,
    /// `None` while the first request runs.
    pub answer: Option<Value>,
}

impl Record for CreateRequest {
    fn collection() -> &'static Collection {
        &REQUESTS
    }
    fn id(&self) -> &str {
        &self.id
    }
    fn evictable(&self) -> bool {
        self.answer.is_some()
    }
}

/// An environment template.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Template {
    pub id: String,
    pub created_at: u64,
    pub updated_at: u64,
    pub name: Option<String>,
    /// `desktop.enabled` when given (only `false` can be).
    pub desktop: Option<bool>,
    /// The public side of its files: `{type: "inline", path, size_bytes}`.
    pub files: Vec<Value>,
    /// Its [`HostedConfig`] (file contents, `env`, `setup_commands`), sealed.
    pub sealed: String,
}

fn template_binding(id: &str) -> String {
    format!("environment_template:{id}:config")
}

impl Template {
    pub fn config(&self) -> Result<HostedConfig, AgentError> {
        let value =
            seal::open_json(&template_binding(&self.id), &self.sealed).map_err(sealing_failed)?;
        serde_json::from_value(value)
            .map_err(|_| AgentError::Failed(format!("The template '{}' is damaged.", self.id)))
    }

    fn seal(&mut self, config: &HostedConfig) -> Result<(), AgentError> {
        self.files = config
            .files
            .iter()
            .map(|f| json!({"type": "inline", "path": f.path, "size_bytes": f.size_bytes}))
            .collect();
        let value = serde_json::to_value(config).map_err(|e| AgentError::Failed(e.to_string()))?;
        self.sealed =
            seal::seal_json(&template_binding(&self.id), &value).map_err(sealing_failed)?;
        Ok(())
    }
}

impl Record for Template {
    fn collection() -> &'static Collection {
        &TEMPLATES
    }
    fn id(&self) -> &str {
        &self.id
    }
}

impl Object for Template {
    fn object(&self) -> Value {
        let mut labelled = label("agent-sandbox", &LIST_DIFFERENCES);
        if let Some(differences) = labelled["differences"].as_array_mut() {
            differences.push(json!("environment_is_this_sandbox"));
        }
        json!({
            "id": self.id,
            "object": "agent.environment.template",
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "name": self.name,
            "capability_directories": [],
            "desktop": self.desktop.map(|enabled| json!({"enabled": enabled})),
            "files": self.files,
            // What the sandbox has: the server neither restricts nor opens it.
            "network": {"access": "enabled", "allowed_domains": []},
            "packages": {"npm": [], "python": [], "system": []},
            "plugins": [],
            "skills": [],
            "x_agent_sandbox": labelled,
        })
    }
}

/// A template body's fields: its name (`Some(None)` clears), desktop and config.
pub struct TemplateBody {
    pub name: Option<Option<String>>,
    pub desktop: Option<Option<bool>>,
    pub config: HostedConfig,
    /// Which of `files`, `env`, `setup_commands` the body names (an update replaces
    /// only those).
    pub named: Vec<&'static str>,
}

/// Checks a template body (create or update).
pub fn parse_template(body: &Map<String, Value>) -> Result<TemplateBody, AgentError> {
    let mut f = Fields::new(body, "");
    let name = if f.has("name") {
        Some(f.bounded_string("name", 256)?)
    } else {
        None
    };
    let desktop = if f.has("desktop") {
        Some(body.get("desktop").filter(|d| !d.is_null()).map(|_| false))
    } else {
        None
    };
    let named = ["files", "env", "setup_commands"]
        .into_iter()
        .filter(|k| f.has(k))
        .collect();
    let max = MAX_TEMPLATE_FILE_BYTES as u64;
    let config = HostedConfig::parse(&mut f, max, max)?;
    f.get("name");
    f.done()?;
    Ok(TemplateBody {
        name,
        desktop,
        config,
        named,
    })
}

/// A page of files, as `TokenPage` answers it.
pub struct FilePage {
    /// `(path beneath the base, size)`.
    pub files: Vec<(String, u64)>,
    pub next: Option<String>,
}

/// Compares two `/`-separated paths component by component.
fn by_components(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    a.split(|c| *c == b'/').cmp(b.split(|c| *c == b'/'))
}

struct FileLister {
    descending: bool,
    /// The last path of the previous page, beneath the listed directory.
    after: Option<Vec<u8>>,
    want: usize,
    found: Vec<(Vec<u8>, u64)>,
}

impl Visitor for FileLister {
    fn visit(&mut self, entry: &Entry<'_>) -> io::Result<Visit> {
        let rel = entry.rel_path().into_os_string().into_encoded_bytes();
        let beyond = |after: &[u8]| {
            let order = by_components(&rel, after);
            if self.descending {
                order.is_lt()
            } else {
                order.is_gt()
            }
        };
        match entry.kind {
            crate::fs::resolve::Kind::Directory => match &self.after {
                // Entered only when something past the cursor may lie beneath it.
                Some(after) => {
                    let holds_cursor =
                        after.starts_with(&rel) && after.get(rel.len()) == Some(&b'/');
                    match holds_cursor || beyond(after) {
                        true => Ok(Visit::Continue),
                        false => Ok(Visit::Skip),
                    }
                }
                _ => Ok(Visit::Continue),
            },
            crate::fs::resolve::Kind::File => {
                if self.after.as_deref().is_some_and(|a| !beyond(a)) {
                    return Ok(Visit::Continue);
                }
                let size = entry.lstat().map(|s| s.st_size as u64).unwrap_or(0);
                self.found.push((rel, size));
                Ok(if self.found.len() > self.want {
                    Visit::Stop
                } else {
                    Visit::Continue
                })
            }
            // Symlinks and special files are not files of the workspace.
            _ => Ok(Visit::Continue),
        }
    }

    fn unreadable(&mut self, rel: &str, error: io::Error) -> io::Result<()> {
        if rel.is_empty() {
            Err(error)
        } else {
            Ok(())
        }
    }
}

fn page_token(dir: &str, last: &[u8]) -> String {
    let mut raw = dir.as_bytes().to_vec();
    raw.push(0);
    raw.extend_from_slice(last);
    base64_simd::URL_SAFE_NO_PAD.encode_to_string(&raw)
}

/// The regular files beneath `dir` (a path beneath the base), in path order, `limit`
/// of them after the page `token` (from the previous page's `next`). On the blocking
/// pool: one directory read at a time, skipping whole subtrees before the cursor.
pub async fn list_files(
    base: &BaseDir,
    dir: String,
    descending: bool,
    limit: usize,
    token: Option<&str>,
) -> Result<FilePage, AgentError> {
    let after = match token {
        None => None,
        Some(token) => {
            let raw = base64_simd::URL_SAFE_NO_PAD.decode_to_vec(token).ok();
            let split = raw
                .as_ref()
                .and_then(|r| r.iter().position(|b| *b == 0).map(|at| r.split_at(at)));
            match split {
                Some((d, last)) if d == dir.as_bytes() => Some(last[1..].to_vec()),
                _ => return Err(invalid(
                    "page",
                    "page is not a token of this listing (keep the same path, order and limit).",
                )),
            }
        }
    };
    let base = base.clone();
    let caller = base.confine(&dir).map_err(|error| AgentError::File {
        error,
        param: "path".into(),
    })?;
    let listed = dir.clone();
    let found = crate::runtime::blocking(move || -> Result<Vec<(Vec<u8>, u64)>, FsError> {
        let beneath = base.open()?;
        let root = beneath.open_dir(&caller, OFlags::RDONLY)?;
        let mut lister = FileLister {
            descending,
            after,
            want: limit,
            found: Vec::new(),
        };
        let rules = Rules {
            max_depth: walk::MAX_TREE_DEPTH,
            order: if descending {
                WalkOrder::Descending
            } else {
                WalkOrder::Interleaved
            },
        };
        walk::walk(root.as_fd(), rules, &mut lister)
            .map_err(|e| FsError::io(e, caller.display()))?;
        Ok(lister.found)
    })
    .await
    .map_err(|e| AgentError::Failed(e.to_string()))?
    .map_err(|error| AgentError::File {
        error,
        param: "path".into(),
    })?;
    let more = found.len() > limit;
    let files: Vec<(Vec<u8>, u64)> = found.into_iter().take(limit).collect();
    let next = more.then(|| {
        page_token(
            &listed,
            &files.last().map(|f| f.0.clone()).unwrap_or_default(),
        )
    });
    let prefix = if listed.is_empty() {
        String::new()
    } else {
        format!("{listed}/")
    };
    Ok(FilePage {
        files: files
            .into_iter()
            .map(|(rel, size)| (format!("{prefix}{}", String::from_utf8_lossy(&rel)), size))
            .collect(),
        next,
    })
}

/// An `EnvironmentFile`.
pub fn file_object(environment_id: &str, rel: &str, size: u64) -> Value {
    json!({
        "environment_id": environment_id,
        "object": "agent.environment.file",
        "path": format!("/workspace/{rel}"),
        "size_bytes": size,
        "x_agent_sandbox": label("agent-sandbox", &["environment_is_this_sandbox"]),
    })
}

/// A checked `environments.create` body.
pub struct CreateBody {
    pub template_id: Option<String>,
    pub config: HostedConfig,
}

/// Checks an `environments.create` body (`max_file`: one file's decoded bytes).
pub fn parse_create(body: &Map<String, Value>, max_file: u64) -> Result<CreateBody, AgentError> {
    let mut top = Fields::new(body, "");
    if top.strings("vault_ids")?.is_some_and(|v| !v.is_empty()) {
        return Err(unsupported("vault_ids", "vault_ids cannot be honoured on an environment: vaults reach MCP servers through a session (vault_ids of POST /v1/agents/sessions), and environment_variable credentials are not kept here."));
    }
    let mut env = top
        .object("environment")?
        .ok_or_else(|| invalid("environment", "environment is required."))?;
    let kind = env.required_string("type")?;
    if kind != "openai_hosted" && kind != "self_hosted" {
        return Err(invalid("environment.type", "environment.type must be openai_hosted (applied to this sandbox, the one environment)."));
    }
    let template_id = env.string("environment_template_id")?;
    let config = HostedConfig::parse(&mut env, max_file, max_file)?;
    env.done()?;
    top.done()?;
    Ok(CreateBody {
        template_id,
        config,
    })
}

/// How a create's key stands.
enum Claim {
    /// Answered before: the same answer.
    Done(Value),
    /// This request claimed it (or there is none).
    Mine,
}

/// Applies a create body to this sandbox and answers its `EnvironmentInfo` (see the
/// module docs for `key`).
pub async fn create_environment<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    workspace: &Workspace<'_>,
    owner: &str,
    key: Option<&str>,
    body: &Map<String, Value>,
) -> Result<Value, AgentError> {
    let request = parse_create(body, workspace.max_file_bytes)?;
    let fingerprint = hex(&Sha256::digest(
        serde_json::to_vec(body).unwrap_or_default(),
    ));
    let claim_id = key.map(|k| format!("envreq_{}", owner_key(owner, k)));
    if let Some(id) = claim_id.clone() {
        let (owner, fingerprint) = (owner.to_string(), fingerprint.clone());
        let claim = agents
            .transact(move |t| {
                let scope = Scope::owner(&owner);
                match t.get::<CreateRequest>(scope, &id) {
                    Ok(r) if r.fingerprint != fingerprint => Err(AgentError::Rejected {
                        status: 400,
                        code: "idempotency_key_reused",
                        param: None,
                        message: "This Idempotency-Key was used with another request body; send a new key for a new request.".into(),
                    }),
                    Ok(CreateRequest { answer: Some(answer), .. }) => Ok(Claim::Done(answer)),
                    Ok(r) if now_unix().saturating_sub(r.claimed_at) < ABANDONED_CLAIM_SECS => Err(AgentError::Rejected {
                        status: 409,
                        code: "idempotency_key_in_use",
                        param: None,
                        message: "A request with this Idempotency-Key is still being applied; retry shortly for its answer.".into(),
                    }),
                    Ok(mut r) => {
                        r.claimed_at = now_unix();
                        t.put(scope, r)?;
                        Ok(Claim::Mine)
                    }
                    Err(StoreError::NotFound) => {
                        t.create(scope, CreateRequest { id, fingerprint, claimed_at: now_unix(), answer: None })?;
                        Ok(Claim::Mine)
                    }
                    Err(e) => Err(e.into()),
                }
            })
            .await?;
        if let Claim::Done(answer) = claim {
            return Ok(answer);
        }
    }
    let applied = apply_environment(agents, workspace, owner, request).await;
    if let Some(id) = claim_id {
        let owner = owner.to_string();
        let answer = applied.as_ref().ok().cloned();
        // An answer is kept for the key; a failure frees it for a corrected retry.
        agents
            .transact(move |t| {
                let scope = Scope::owner(&owner);
                match answer {
                    Some(answer) => t
                        .update(scope, &id, |r: &mut CreateRequest| r.answer = Some(answer))
                        .map(drop),
                    None => t.delete::<CreateRequest>(scope, &id).map(drop),
                }
                .map_err(AgentError::from)
            })
            .await?;
    }
    applied
}

async fn apply_environment<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    workspace: &Workspace<'_>,
    owner: &str,
    request: CreateBody,
) -> Result<Value, AgentError> {
    let mut steps: Vec<(String, HostedConfig)> = Vec::new();
    if let Some(template) = request.template_id {
        let (o, id) = (owner.to_string(), template.clone());
        let record = agents
            .transact(move |t| {
                t.get::<Template>(Scope::owner(&o), &id)
                    .map_err(AgentError::store(
                        "environment template",
                        &id,
                        "environment.environment_template_id",
                    ))
            })
            .await?;
        steps.push(("environment_template".into(), record.config()?));
    }
    steps.push(("environment".into(), request.config));
    let mut written = Vec::new();
    let mut env: Vec<(String, String)> = Vec::new();
    for (at, config) in &steps {
        for (i, file) in config.files.iter().enumerate() {
            let param = format!("{at}.files[{i}].path");
            let size = workspace
                .write(&file.path, file.data.clone(), &param)
                .await?;
            written.push((file.path.clone(), size));
        }
        for (name, value) in &config.env {
            env.retain(|(n, _)| n != name);
            env.push((name.clone(), value.clone()));
        }
    }
    // Variables are kept before the commands run, so the commands see them and a
    // failed one leaves them as the files are: applied.
    let owner_s = owner.to_string();
    let state = agents
        .transact(move |t| {
            let mut state = state_of(t, &owner_s)?;
            for (path, size) in written {
                state.files.retain(|f| f["path"] != json!(path));
                state.files.push(json!({"type": "inline", "id": new_id("envfile_"), "path": path, "size_bytes": size}));
            }
            let excess = state.files.len().saturating_sub(MAX_LISTED_FILES);
            state.files.drain(..excess);
            if !env.is_empty() {
                let mut all = match &state.sealed_env {
                    Some(sealed) => seal::open_json(&env_binding(&state.id), sealed).map_err(sealing_failed)?,
                    None => json!({}),
                };
                for (name, value) in env {
                    all[name] = json!(value);
                }
                state.sealed_env = Some(seal::seal_json(&env_binding(&state.id), &all).map_err(sealing_failed)?);
            }
            save_state(t, &owner_s, state.clone())?;
            Ok::<_, AgentError>(state)
        })
        .await?;
    let owner_s = owner.to_string();
    let agent_vars = agents.transact(move |t| agent_env(t, &owner_s)).await?;
    for (at, config) in &steps {
        for (i, command) in config.setup_commands.iter().enumerate() {
            workspace
                .run(command, &agent_vars, &format!("{at}.setup_commands[{i}]"))
                .await?;
        }
    }
    Ok(info(&workspace.id, &state.files, workspace.base.path()))
}

/// This sandbox's `EnvironmentInfo` as `owner` sees it.
pub async fn environment_info<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    id: &str,
    base: &Path,
) -> Result<Value, AgentError> {
    let owner = owner.to_string();
    let state = agents.transact(move |t| state_of(t, &owner)).await?;
    Ok(info(id, &state.files, base))
}

pub async fn create_template<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    body: TemplateBody,
) -> Result<Value, AgentError> {
    let now = now_unix();
    let mut template = Template {
        id: new_id("envtpl_"),
        created_at: now,
        updated_at: now,
        name: body.name.flatten(),
        desktop: body.desktop.flatten(),
        files: Vec::new(),
        sealed: String::new(),
    };
    let config = body.config;
    let (owner, id) = (owner.to_string(), template.id.clone());
    agents
        .transact(move |t| {
            // Sealed here, on the blocking pool: the key's first use reads (or makes and
            // fsyncs) its file.
            template.seal(&config)?;
            let object = template.object();
            t.create(Scope::owner(&owner), template)
                .map_err(AgentError::store(
                    "environment template",
                    &id,
                    "environment_template_id",
                ))?;
            Ok::<_, AgentError>(object)
        })
        .await
}

/// Replaces what the body names.
pub async fn update_template<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    id: &str,
    body: TemplateBody,
) -> Result<Value, AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    agents
        .transact(move |t| {
            let scope = Scope::owner(&owner);
            let mut template = t.get::<Template>(scope, &id).map_err(AgentError::store(
                "environment template",
                &id,
                "environment_template_id",
            ))?;
            let mut config = template.config()?;
            if body.named.contains(&"files") {
                config.files = body.config.files;
            }
            if body.named.contains(&"env") {
                config.env = body.config.env;
            }
            if body.named.contains(&"setup_commands") {
                config.setup_commands = body.config.setup_commands;
            }
            if let Some(name) = body.name {
                template.name = name;
            }
            if let Some(desktop) = body.desktop {
                template.desktop = desktop;
            }
            template.seal(&config)?;
            template.updated_at = now_unix().max(template.created_at);
            let object = template.object();
            t.put(scope, template)?;
            Ok(object)
        })
        .await
}

pub async fn delete_template<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    id: &str,
) -> Result<(), AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    agents
        .transact(move |t| {
            t.delete::<Template>(Scope::owner(&owner), &id)
                .map(drop)
                .map_err(AgentError::store(
                    "environment template",
                    &id,
                    "environment_template_id",
                ))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_paths_map_beneath_the_base() {
        assert_eq!(
            workspace_rel("/workspace/a/b.txt", "path").unwrap(),
            "a/b.txt"
        );
        for bad in [
            "/etc/passwd",
            "/workspace/../x",
            "/workspace/a//b",
            "/workspace/.codex/x",
            "/workspace/.managed-agents-1/x",
            "/workspace/outputs",
            "/workspace/a\\b",
            "workspace/a",
        ] {
            assert!(workspace_rel(bad, "path").is_err(), "{bad}");
        }
        assert!(workspace_rel("/workspace/outputs/report.md", "path").is_ok());
        assert_eq!(workspace_dir("/workspace", "path").unwrap(), "");
        assert_eq!(workspace_dir("/workspace/src/", "path").unwrap(), "src");
        assert!(workspace_dir("/tmp", "path").is_err());
    }

    #[test]
    fn the_id_is_stable_and_depends_on_the_base() {
        let a = environment_id(Path::new("/home/user"));
        assert_eq!(a, environment_id(Path::new("/home/user")));
        assert_ne!(a, environment_id(Path::new("/srv")));
        assert!(a.starts_with("env_") && a.len() == 28);
    }

    #[test]
    fn what_a_sandbox_cannot_honour_is_refused_with_its_path() {
        let refused = |body: Value| match parse_create(body.as_object().unwrap(), 1024) {
            Err(e) => e.param().unwrap_or_default().to_string(),
            Ok(_) => "accepted".into(),
        };
        let env = |e: Value| json!({"environment": e});
        assert_eq!(
            refused(env(
                json!({"type": "openai_hosted", "packages": {"npm": ["x"]}})
            )),
            "environment.packages.npm"
        );
        assert_eq!(
            refused(env(
                json!({"type": "openai_hosted", "network": {"access": "disabled"}})
            )),
            "environment.network"
        );
        assert_eq!(
            refused(env(
                json!({"type": "openai_hosted", "desktop": {"enabled": true}})
            )),
            "environment.desktop.enabled"
        );
        assert_eq!(
            refused(env(
                json!({"type": "openai_hosted", "files": [{"type": "file_id", "file_id": "f", "path": "/workspace/a"}]})
            )),
            "environment.files[0].type"
        );
        assert_eq!(
            refused(env(
                json!({"type": "openai_hosted", "env": {"LD_PRELOAD": "x"}})
            )),
            "environment.env.LD_PRELOAD"
        );
        assert_eq!(
            refused(env(
                json!({"type": "openai_hosted", "files": [{"type": "inline", "path": "/workspace/big", "data": base64_simd::STANDARD.encode_to_string([0u8; 2048])}]})
            )),
            "environment.files[0].data"
        );
        assert_eq!(
            refused(json!({"environment": {"type": "openai_hosted"}, "vault_ids": ["v"]})),
            "vault_ids"
        );
        assert_eq!(
            refused(env(
                json!({"type": "openai_hosted", "skills": [{"type": "skill_reference", "skill_id": "s"}]})
            )),
            "environment.skills"
        );
        assert_eq!(
            refused(env(
                json!({"type": "openai_hosted", "files": [{"type": "inline", "path": "/workspace/a", "data": "aGk="}],
            "env": {"A": "1"}, "setup_commands": [{"command": "true"}], "packages": {"npm": []}, "desktop": {"enabled": false}})
            )),
            "accepted"
        );
    }

    #[test]
    fn listing_pages_follow_path_components() {
        let dir = std::env::temp_dir().join(format!("abx-envfiles-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for f in ["a/x", "a/y/z", "a-b", "b", "c/d"] {
            let p = dir.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, f).unwrap();
        }
        std::os::unix::fs::symlink("/etc", dir.join("link")).unwrap();
        let base = BaseDir::new(dir.clone());
        crate::testing::run(async {
            let all = |descending| {
                let base = base.clone();
                async move {
                    let mut seen = Vec::new();
                    let mut token: Option<String> = None;
                    loop {
                        let page =
                            list_files(&base, String::new(), descending, 2, token.as_deref())
                                .await
                                .unwrap();
                        seen.extend(page.files.into_iter().map(|f| f.0));
                        match page.next {
                            Some(next) => token = Some(next),
                            None => break,
                        }
                    }
                    seen
                }
            };
            assert_eq!(all(false).await, ["a/x", "a/y/z", "a-b", "b", "c/d"]);
            assert_eq!(all(true).await, ["c/d", "b", "a-b", "a/y/z", "a/x"]);
            let sub = list_files(&base, "a".into(), false, 10, None)
                .await
                .unwrap();
            assert_eq!(
                sub.files.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
                ["a/x", "a/y/z"]
            );
            assert_eq!(sub.files[0].1, 3);
            assert!(list_files(&base, "a".into(), false, 10, Some("bogus"))
                .await
                .is_err());
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
}
