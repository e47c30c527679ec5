//! The state every thread reads: built once before the first worker starts and never
//! mutated afterwards, so it is shared as a plain `Arc` without locks. Handlers see it
//! through two narrow views: [`Services`] (what domain code needs) and [`Catalog`] (the
//! route table and its decisions, for the discovery routes).

use std::sync::Arc;
use std::time::Instant;

use super::auth::{token_digest, Auth, Identity, TokenIdentity};
use super::endpoint::Endpoint;
use super::policy::TokenSource;
use super::policy::{Decision, Policy};
use super::router::Router;
use crate::api::{Group, Listener};
use crate::bridge::Bridge;
use crate::commands::{self, Command};
use crate::config::Config;
use crate::fs::BaseDir;
use crate::process::{ChildRegistry, Environment, ProcessTable};
use crate::runtime::IoDriver;

/// What handlers work with.
pub struct Services {
    /// The directory caller paths are confined to (policy `base_dir` beats config).
    pub base: BaseDir,
    /// The I/O driver the workers run.
    pub driver: IoDriver,
    /// `ABX_MAX_UPLOAD_SIZE`: decoded upload bytes.
    pub max_upload_size: u64,
    /// Process groups of children we started, ended at shutdown.
    pub children: Arc<ChildRegistry>,
    /// The environment children start with (`POST /env` changes it).
    pub environment: Environment,
    /// Background processes started by `/process/start`.
    pub processes: ProcessTable,
    /// Named commands (`/commands`), frozen at startup.
    pub commands: commands::Registry,
    /// The Python worker behind Python commands and routes, when serving a `commands.py`.
    pub bridge: Option<Arc<Bridge>>,
    /// Terminal sessions.
    pub sessions: crate::pty::Sessions,
    /// The shared Chromium page (`/browser/*`); starts nothing until first used.
    pub browser: Arc<crate::browser::Browser>,
    /// The `/v1` responses and conversations.
    pub agents: Arc<crate::agents::Agents>,
    /// How long a write may wait for a client that does not read (the read timeout).
    pub write_timeout: std::time::Duration,
    configured_pty_port: u16,
    /// The PTY WebSocket's port as bound (`--pty-port 0` picks one), set at startup.
    pub bound_pty_port: std::sync::OnceLock<u16>,
    pub started: Instant,
    /// What each group registered for its handlers (see [`super::groups`]).
    pub groups: super::groups::GroupStates,
}

impl Services {
    /// The port of the PTY WebSocket, for the `ws_url`s of new sessions.
    pub fn pty_port(&self) -> u16 {
        self.bound_pty_port
            .get()
            .copied()
            .unwrap_or(self.configured_pty_port)
    }
}

/// The route table, its routers and the policy's decision for every endpoint.
pub struct Catalog {
    pub endpoints: Vec<Endpoint>,
    /// `decisions[i]` is the policy decision for `endpoints[i]`.
    pub decisions: Vec<Decision>,
    pub router: Router,
    /// The k8s_runtime port's own routes (`/`, `/execute`, ... would clash with none of
    /// the API's, but are not the API's).
    pub k8s_router: Router,
    pub policy: Policy,
    pub auth: Auth,
    pub warnings: Vec<String>,
}

/// Shared server state. Everything is immutable but the catalog, which a policy reload
/// replaces as a whole (`AppState::reload_policy`).
pub struct AppState {
    pub config: Config,
    pub services: Services,
    catalog: CatalogCell,
    /// What the catalog is compiled from, kept for reloads.
    group_switches: Vec<(Group, bool)>,
    /// Bumped after each reload that took effect, so connections admitted under an
    /// older policy (terminal sockets) check themselves again at once.
    reloaded: crate::process::output::Notify,
    /// The token last read from `ABX_TOKEN_FILE` (`None`: missing or empty).
    file_token: std::sync::Mutex<Option<String>>,
}

/// A thread's handle on one generation of the catalog: cloning it costs no atomic
/// operation, and a request holds the same generation from its head to its answer.
pub type CatalogRef = std::rc::Rc<Arc<Catalog>>;

/// The current catalog and its generation.
struct CatalogCell {
    current: std::sync::RwLock<Arc<Catalog>>,
    generation: std::sync::atomic::AtomicU64,
    /// Unique for the process's lifetime, so a thread's cache never mistakes a new cell
    /// at a reused address for an old one.
    id: u64,
}

static NEXT_CELL_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

thread_local! {
    /// This thread's handle on the current generation: (cell id, generation, handle).
    static CACHED: std::cell::RefCell<Option<(u64, u64, CatalogRef)>> =
        const { std::cell::RefCell::new(None) };
}

impl CatalogCell {
    fn new(catalog: Catalog) -> CatalogCell {
        CatalogCell {
            current: std::sync::RwLock::new(Arc::new(catalog)),
            generation: std::sync::atomic::AtomicU64::new(0),
            id: NEXT_CELL_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// The current catalog. The request path reads one atomic and, only after a
    /// reload, takes the lock once per thread.
    fn get(&self) -> CatalogRef {
        let key = self.id;
        let generation = self.generation.load(std::sync::atomic::Ordering::Acquire);
        CACHED.with(|cached| {
            let mut cached = cached.borrow_mut();
            if let Some((cell, seen, handle)) = cached.as_ref() {
                if *cell == key && *seen == generation {
                    return handle.clone();
                }
            }
            let current = self
                .current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let handle = std::rc::Rc::new(current);
            *cached = Some((key, generation, handle.clone()));
            handle
        })
    }

    fn replace(&self, catalog: Catalog) {
        let old = std::mem::replace(
            &mut *self.current.write().unwrap_or_else(|e| e.into_inner()),
            Arc::new(catalog),
        );
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        // The old catalog is let go outside the lock.
        drop(old);
    }
}

/// What the embedding program (or the Python worker's manifest) adds to the built-ins.
#[derive(Default)]
pub struct Extras {
    pub commands: Vec<Command>,
    /// `enable_group` / `disable_group` calls, in order.
    pub group_switches: Vec<(Group, bool)>,
    pub bridge: Option<Arc<Bridge>>,
    /// The registry the bridge's worker was registered in, if it already exists.
    pub children: Option<Arc<ChildRegistry>>,
    /// Each group's state, registered in order (see [`super::groups`]).
    pub registrars: Vec<super::groups::Registrar>,
}

/// Whether a caller may use an endpoint, and if not, the refusal's code, rule and reason.
pub struct Access<'a> {
    pub allowed: bool,
    pub code: Option<&'static str>,
    pub rule: Option<&'a str>,
    pub reason: Option<String>,
}

impl AppState {
    /// Builds the state from the configuration and the full endpoint list (built-ins plus
    /// custom routes). Errors are one line for stderr.
    pub fn build(
        config: Config,
        endpoints: Vec<Endpoint>,
        driver: IoDriver,
        extras: Extras,
    ) -> Result<AppState, String> {
        let mut seen = std::collections::HashSet::new();
        for ep in &endpoints {
            if !seen.insert(ep.spec.id.clone()) {
                return Err(format!("two endpoints share the id '{}'", ep.spec.id));
            }
        }
        let policy = match &config.policy_path {
            Some(path) => Policy::load(path)?,
            None => Policy::empty(),
        };
        let base_dir = policy
            .base_dir
            .clone()
            .unwrap_or_else(|| config.base_dir.clone());
        let token_vars = policy.token_env_names();
        let (commands, replaced) = commands::Registry::new(extras.commands);
        let file_token = config.token_file.as_deref().and_then(read_token_file);
        let mut catalog = compile(
            &config,
            endpoints,
            policy,
            &extras.group_switches,
            file_token.as_deref(),
        )?;
        for name in replaced {
            catalog.warnings.push(format!(
                "command '{name}' is registered twice; the later registration wins"
            ));
        }
        let children: Arc<ChildRegistry> = extras.children.unwrap_or_default();
        let groups = super::groups::GroupStates::build(
            extras.registrars,
            &config,
            &children,
            &mut catalog.warnings,
        );
        Ok(AppState {
            services: Services {
                base: BaseDir::new(base_dir),
                driver,
                max_upload_size: config.max_upload_size,
                children: children.clone(),
                agents: Arc::default(),
                browser: Arc::new(crate::browser::Browser::new(
                    config.browser_path.clone(),
                    children,
                )),
                // A policy identity's token variable is the server's secret, not the
                // children's: a caller with /shell could otherwise read it.
                environment: Environment::from_process_without(&token_vars),
                processes: ProcessTable::default(),
                commands,
                bridge: extras.bridge,
                sessions: Default::default(),
                write_timeout: config.read_timeout,
                configured_pty_port: config.pty_port,
                bound_pty_port: std::sync::OnceLock::new(),
                started: Instant::now(),
                groups,
            },
            catalog: CatalogCell::new(catalog),
            group_switches: extras.group_switches,
            reloaded: Default::default(),
            file_token: std::sync::Mutex::new(file_token),
            config,
        })
    }

    /// The server token in force now: `ABX_TOKEN_FILE`'s when that is set (it may
    /// arrive or change after startup), else `ABX_SERVER_TOKEN`.
    pub fn server_token(&self) -> Option<String> {
        match self.config.token_file {
            Some(_) => self
                .file_token
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            None => self.config.token.clone(),
        }
    }

    /// Reads `ABX_TOKEN_FILE` again and, when its token changed (arrived, rotated or
    /// removed), swaps in a catalog with the new credentials for requests from now on.
    /// Returns whether it changed.
    pub fn reload_token(&self) -> Result<bool, String> {
        let Some(path) = self.config.token_file.as_deref() else {
            return Ok(false);
        };
        let token = read_token_file(path);
        let mut stored = self.file_token.lock().unwrap_or_else(|e| e.into_inner());
        if *stored == token {
            return Ok(false);
        }
        let current = self.catalog();
        let mut catalog = compile(
            &self.config,
            current.endpoints.clone(),
            current.policy.clone(),
            &self.group_switches,
            token.as_deref(),
        )?;
        catalog.warnings = current.warnings.clone();
        *stored = token;
        self.catalog.replace(catalog);
        Ok(true)
    }

    /// The current catalog (route table, policy decisions, credentials).
    pub fn catalog(&self) -> CatalogRef {
        self.catalog.get()
    }

    /// Reads the policy document again and swaps the new catalog in, for requests that
    /// start from now on (SIGHUP). A document that does not load, or that would move
    /// the base directory (which needs a restart), keeps the current policy; the error
    /// says why. Returns the new revision.
    pub fn reload_policy(&self) -> Result<String, String> {
        let policy = match &self.config.policy_path {
            Some(path) => Policy::load(path)?,
            None => Policy::empty(),
        };
        let base_dir = policy
            .base_dir
            .clone()
            .unwrap_or_else(|| self.config.base_dir.clone());
        if base_dir != self.services.base.path() {
            return Err(format!(
                "the policy moves base_dir to {}; that takes a restart, so the current policy stays",
                base_dir.display()
            ));
        }
        let current = self.catalog();
        // Held until the swap: a token arriving meanwhile waits, rather than being
        // overwritten by a catalog compiled with the one before it.
        let file_token = self.file_token.lock().unwrap_or_else(|e| e.into_inner());
        let mut catalog = compile(
            &self.config,
            current.endpoints.clone(),
            policy,
            &self.group_switches,
            file_token.as_deref(),
        )?;
        // Warnings about the build itself (commands registered twice) carry over.
        for warning in &current.warnings {
            if warning.starts_with("command '") && !catalog.warnings.contains(warning) {
                catalog.warnings.push(warning.clone());
            }
        }
        // A token_env named for the first time is a secret from now on: out of the view
        // children start with, as at startup.
        self.services
            .environment
            .hide(&catalog.policy.token_env_names());
        let revision = catalog.policy.revision.clone();
        self.catalog.replace(catalog);
        self.reloaded.notify();
        drop(file_token);
        Ok(revision)
    }

    /// Tells of policy reloads: [`Notify::version`](crate::process::output::Notify)
    /// changes after each one.
    pub fn reloads(&self) -> &crate::process::output::Notify {
        &self.reloaded
    }
}

/// The token in `path`: its content without surrounding whitespace (a Secret written
/// with `echo` ends in a newline); `None` when the file is missing, unreadable or blank.
/// Small and local, read at startup and by the watcher thread, never on a worker.
fn read_token_file(path: &std::path::Path) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    let token = String::from_utf8_lossy(&text).trim().to_string();
    (!token.is_empty()).then_some(token)
}

/// Decides every endpoint under `policy` and builds the credentials it names.
fn compile(
    config: &Config,
    endpoints: Vec<Endpoint>,
    policy: Policy,
    group_switches: &[(Group, bool)],
    file_token: Option<&str>,
) -> Result<Catalog, String> {
    // With ABX_TOKEN_FILE the file is the one source of the server token.
    let token = match config.token_file {
        Some(_) => file_token,
        None => config.token.as_deref(),
    };
    let specs: Vec<_> = endpoints.iter().map(|e| e.spec.clone()).collect();
    let mut warnings = policy
        .validate(&specs)
        .map_err(|e| format!("ABX_SERVER_POLICY: {e}"))?;
    let decisions: Vec<Decision> = endpoints
        .iter()
        .map(|ep| {
            policy.decide_with(
                &ep.spec,
                ep.unavailable(),
                &config.enabled_groups,
                group_switches,
            )
        })
        .collect();
    let empty: Vec<&str> = Group::ALL
        .into_iter()
        .filter(|g| {
            !endpoints
                .iter()
                .any(|e| e.spec.group == *g && e.unavailable().is_none())
        })
        .map(Group::name)
        .collect();
    if !empty.is_empty() {
        warnings.push(format!(
            "groups with no endpoints in this build of agent-sandbox: {}",
            empty.join(", ")
        ));
    }
    let router = Router::new(&endpoints, Listener::Api)?;
    let k8s_router = Router::new(&endpoints, Listener::K8sRuntime)?;
    let identities = policy
        .identities
        .iter()
        .map(|rule| {
            let digest = match &rule.token {
                TokenSource::Digest(digest) => *digest,
                TokenSource::Env(name) => match crate::process::secrets::get(name) {
                    Some(token) if !token.is_empty() => token_digest(&token),
                    _ => {
                        return Err(format!(
                            "ABX_SERVER_POLICY: identity '{}' takes its token from ${name}, which is not set",
                            rule.id
                        ))
                    }
                },
            };
            Ok(TokenIdentity {
                id: rule.id.clone(),
                scopes: rule.scopes.clone(),
                digest,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    // One token, one identity: a repeated token would silently take the first's scopes.
    let server_token = token.filter(|t| !t.is_empty()).map(token_digest);
    for (i, identity) in identities.iter().enumerate() {
        let repeated = identities[..i]
            .iter()
            .any(|other| other.digest == identity.digest)
            || server_token == Some(identity.digest);
        if repeated {
            return Err(format!(
                "ABX_SERVER_POLICY: identity '{}' has the same token as another identity (or ABX_SERVER_TOKEN); give each its own",
                identity.id
            ));
        }
    }
    let mut auth = Auth::with_identities(token, &identities);
    if config.token_file.is_some() {
        auth = auth.expecting_token();
    }
    Ok(Catalog {
        endpoints,
        decisions,
        router,
        k8s_router,
        policy,
        auth,
        warnings,
    })
}

impl Catalog {
    /// The endpoint with id `id`, with its index.
    pub fn endpoint(&self, id: &str) -> Option<(usize, &Endpoint)> {
        self.endpoints
            .iter()
            .enumerate()
            .find(|(_, e)| e.spec.id == id)
    }

    /// Whether `identity` may call endpoint `index`.
    pub fn access(&self, index: usize, identity: &Identity) -> Access<'_> {
        let decision = &self.decisions[index];
        if !decision.enabled {
            return Access {
                allowed: false,
                code: Some("endpoint_disabled"),
                rule: Some(&decision.rule),
                reason: decision.message.clone(),
            };
        }
        if let Some(scope) = identity.missing_scope(&decision.scopes) {
            return Access {
                allowed: false,
                code: Some("missing_scope"),
                rule: Some(&decision.scopes_rule),
                reason: Some(format!(
                    "Endpoint '{}' needs scope '{scope}', which the caller '{}' does not have",
                    self.endpoints[index].spec.id, identity.id
                )),
            };
        }
        Access {
            allowed: true,
            code: None,
            rule: None,
            reason: None,
        }
    }

    /// Whether any endpoint of `group` is enabled.
    /// Whether `listener`'s port is bound: while a group that serves an endpoint there
    /// is on, even when that endpoint itself is off (a disabled WebSocket is refused
    /// with a close code, which takes a listening port).
    pub fn listener_enabled(&self, listener: Listener) -> bool {
        self.endpoints
            .iter()
            .filter(|e| e.spec.listener == listener && e.unavailable().is_none())
            .any(|e| self.group_enabled(e.spec.group))
    }

    pub fn group_enabled(&self, group: Group) -> bool {
        self.endpoints
            .iter()
            .zip(&self.decisions)
            .any(|(e, d)| e.spec.group == group && d.enabled)
    }

    /// One line describing the enabled groups, for the startup banner.
    pub fn enabled_groups_line(&self) -> String {
        Group::ALL
            .into_iter()
            .filter(|g| self.group_enabled(*g))
            .map(Group::name)
            .collect::<Vec<_>>()
            .join(",")
    }
}
