//! The state every thread reads: built once before the first worker starts and never
//! mutated afterwards, so it is shared as a plain `Arc` without locks. Handlers see it
//! through two narrow views: [`Services`] (what domain code needs) and [`Catalog`] (the
//! route table and its decisions, for the discovery routes).

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::auth::{token_digest, Auth, Identity, TokenIdentity};
use super::endpoint::{self, RawSink};
use super::policy::TokenSource;
use super::policy::{Decision, Policy};
use super::router::Router;
use crate::api::{ApiError, Args, EndpointSpec, ErrorStyle, Group, Listener, Method, Param};
use crate::config::Config;
use crate::fs::BaseDir;
use crate::http::Response;
use crate::process::{ChildRegistry, Environment};
use crate::runtime::IoDriver;

/// The route table's entries as this app serves them.
pub type Endpoint = endpoint::Endpoint<Call, Upgraded>;
/// How one is served.
pub type Serve = endpoint::Serve<Call, Upgraded>;
/// A handler of this app.
pub type Handler = endpoint::Handler<Call>;
/// Opens a raw-body sink.
pub type SinkHandler = endpoint::SinkHandler<Call>;

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
    /// How long a write may wait for a client that does not read (the read timeout).
    pub write_timeout: std::time::Duration,
    configured_pty_port: u16,
    /// The PTY WebSocket's port as bound (`--pty-port 0` picks one), set at startup.
    pub bound_pty_port: std::sync::OnceLock<u16>,
    /// The envd port once bound (the configured one may be 0).
    pub bound_envd_port: std::sync::OnceLock<u16>,
    /// The API port's address as bound (`--port 0` picks one), set at startup: where
    /// this machine's own children reach the server (the agents' MCP relay).
    pub bound_api: std::sync::OnceLock<std::net::SocketAddr>,
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
    /// The envd port's routes (its `/health` and `/files` are not the API's).
    pub envd_router: Router,
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
    /// The groups' warnings about how the server was built (a command registered twice,
    /// the agents store in memory): true until a restart, so every catalog carries them.
    setup_warnings: Vec<String>,
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
    /// `enable_group` / `disable_group` calls, in order.
    pub group_switches: Vec<(Group, bool)>,
    /// The registry the bridge's worker was registered in, if it already exists.
    pub children: Option<Arc<ChildRegistry>>,
    /// Each group's state, registered in order (see [`super::groups`]).
    pub registrars: Vec<super::groups::Registrar>,
}

/// Whether a caller may use an endpoint, and if not, the refusal's code, rule and reason.
pub struct Access<'a> {
    pub allowed: bool,
    pub code: Option<&'static str>,
    pub rule: Option<std::borrow::Cow<'a, str>>,
    pub reason: Option<String>,
    /// The scope the caller lacks (`missing_scope`).
    pub scope: Option<&'a str>,
}

impl Access<'_> {
    /// The refusal a caller gets for this outcome, as the reference words it:
    /// `endpoint_disabled` is a 404 naming its rule; `missing_scope` a 403 naming the
    /// scope and the identity.
    pub fn refusal(&self, endpoint: &str, identity: &Identity) -> Option<ApiError> {
        if self.allowed {
            return None;
        }
        let reason = self.reason.clone().unwrap_or_default();
        let error = match self.code {
            Some("endpoint_disabled") => ApiError::new(404, "ValueError", reason)
                .with_field("rule", self.rule.as_deref().unwrap_or_default().to_string()),
            _ => ApiError::new(403, "PolicyDenied", reason)
                .with_field("scope", self.scope.unwrap_or_default().to_string())
                .with_field("identity", identity.id.clone()),
        };
        let mut error = error.with_field("endpoint", endpoint.to_string());
        error.code = self.code;
        Some(error)
    }
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
        // Sorted borrows rather than a set of copies: no allocation per endpoint.
        let mut ids: Vec<&str> = endpoints.iter().map(|ep| ep.spec.id.as_ref()).collect();
        ids.sort_unstable();
        if let Some(pair) = ids.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(format!("two endpoints share the id '{}'", pair[0]));
        }
        let policy = load_policy(&config)?;
        let base_dir = policy
            .base_dir
            .clone()
            .unwrap_or_else(|| config.base_dir.clone());
        let token_vars = policy.token_env_names();
        let file_token = config.token_file.as_deref().and_then(read_token_file);
        let mut catalog = compile(
            &config,
            endpoints,
            policy,
            &extras.group_switches,
            file_token.as_deref(),
        )?;
        refuse_roots_outside(&catalog, &base_dir)?;
        let children: Arc<ChildRegistry> = extras.children.unwrap_or_default();
        let mut setup_warnings = Vec::new();
        let groups = super::groups::GroupStates::build(
            extras.registrars,
            &config,
            &children,
            &mut setup_warnings,
        );
        catalog.warnings.extend(setup_warnings.iter().cloned());
        Ok(AppState {
            services: Services {
                base: BaseDir::new(base_dir),
                driver,
                max_upload_size: config.max_upload_size,
                children: children.clone(),
                // A policy identity's token variable is the server's secret, not the
                // children's: a caller with /shell could otherwise read it.
                environment: Environment::from_process_without(&token_vars),
                write_timeout: config.read_timeout,
                configured_pty_port: config.pty_port,
                bound_pty_port: std::sync::OnceLock::new(),
                bound_envd_port: std::sync::OnceLock::new(),
                bound_api: std::sync::OnceLock::new(),
                started: Instant::now(),
                groups,
            },
            catalog: CatalogCell::new(catalog),
            group_switches: extras.group_switches,
            setup_warnings,
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
        let policy = load_policy(&self.config)?;
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
        // Warnings about the build itself carry over.
        for warning in &self.setup_warnings {
            if !catalog.warnings.contains(warning) {
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

/// Every caller path is confined beneath the base directory, so an allowed directory
/// (`paths.allow: ["/srv/out"]`) outside it could never be reached: refused at startup
/// rather than accepted and never applied.
fn refuse_roots_outside(catalog: &Catalog, base: &std::path::Path) -> Result<(), String> {
    for (endpoint, decision) in catalog.endpoints.iter().zip(&catalog.decisions) {
        for root in decision.allowed_directories() {
            if !std::path::Path::new(root).starts_with(base) {
                return Err(format!(
                    "policy endpoints.{}.paths.allow: '{root}' is outside the base directory {}; every path is confined beneath it (set base_dir to a directory that holds '{root}')",
                    endpoint.spec.id,
                    base.display()
                ));
            }
        }
    }
    Ok(())
}

/// The policy document the configuration names (inline, a file, or none).
pub fn load_policy(config: &Config) -> Result<Policy, String> {
    match (&config.policy_inline, &config.policy_path) {
        (Some(text), _) => Policy::inline(text),
        (None, Some(path)) => Policy::load(path),
        (None, None) => Ok(Policy::empty()),
    }
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
    // Borrowed, not cloned: a copy of every declaration was a third of the heap an idle
    // server kept from its start (1004 KiB before, 648 KiB after).
    let mut warnings = policy
        .validate(endpoints.iter().map(|e| &*e.spec))
        .map_err(|e| format!("ABX_SERVER_POLICY: {e}"))?;
    let decider = policy.decider(&config.enabled_groups, group_switches);
    let decisions: Vec<Decision> = endpoints
        .iter()
        .map(|ep| decider.decide(&ep.spec, ep.unavailable()))
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
    let envd_router = Router::new(&endpoints, Listener::Envd)?;
    let identities = policy
        .identities
        .iter()
        .map(|rule| {
            let (digest, raw) = match &rule.token {
                TokenSource::Digest(digest) => (*digest, None),
                TokenSource::Env(name) => match crate::process::secrets::get(name) {
                    Some(token) if !token.is_empty() => (token_digest(&token), Some(token)),
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
                token: raw,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    // As on the reference server, a policy that names its own tokens is the one source
    // of credentials: ABX_SERVER_TOKEN is then no way in.
    let token = if identities.is_empty() {
        token
    } else {
        if token.is_some_and(|t| !t.is_empty()) {
            warnings.push("ABX_SERVER_TOKEN is not accepted: the policy names its own tokens (auth.tokens / identities)".into());
        }
        None
    };
    // Two identities with one token: the first listed is who presents it, as on the
    // reference server; said, because the second can never be used.
    for (i, identity) in identities.iter().enumerate() {
        if let Some(first) = identities[..i]
            .iter()
            .find(|other| other.digest == identity.digest)
        {
            warnings.push(format!(
                "identity '{}' has the same token as '{}'; that token is '{}' (give each its own)",
                identity.id, first.id, first.id
            ));
        }
    }
    let mut auth = Auth::with_identities(token, &identities)
        .with_anonymous(policy.allow_anonymous, policy.anonymous_scopes.clone());
    if config.token_file.is_some() {
        auth = auth.expecting_token();
    }
    Ok(Catalog {
        endpoints,
        decisions,
        router,
        k8s_router,
        envd_router,
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
        let (endpoint, decision) = (&self.endpoints[index], &self.decisions[index]);
        if !decision.enabled {
            return Access {
                allowed: false,
                code: Some("endpoint_disabled"),
                rule: Some(std::borrow::Cow::Borrowed(&decision.rule)),
                reason: decision.message(&endpoint.spec, endpoint.unavailable()),
                scope: None,
            };
        }
        if let Some(scope) = identity.missing_scope(&decision.scopes) {
            return Access {
                allowed: false,
                code: Some("missing_scope"),
                rule: Some(decision.scopes_rule(&endpoint.spec.id)),
                reason: Some(format!(
                    "Identity '{}' lacks scope '{scope}' required by endpoint '{}'",
                    identity.id, endpoint.spec.id
                )),
                scope: Some(scope),
            };
        }
        Access {
            allowed: true,
            code: None,
            rule: None,
            reason: None,
            scope: None,
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

/// What a handler receives: the request, the caller, its endpoint's spec and policy
/// decision, and the services it may use.
pub struct Call {
    pub method: Method,
    /// The path with the query removed and a trailing slash stripped (`/health/` is
    /// `/health`), not percent-decoded, as the contract matches it.
    pub path: String,
    pub(crate) query: Vec<(String, String)>,
    /// Header names in lower case, in arrival order.
    pub(crate) headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub(crate) path_params: Vec<(String, String)>,
    pub identity: Arc<Identity>,
    pub(crate) endpoint: usize,
    pub(crate) state: Arc<AppState>,
    /// The catalog generation the request was admitted under: it keeps it to the end,
    /// whatever a policy reload does meanwhile.
    pub(crate) catalog: CatalogRef,
}

impl Call {
    /// The single value of query parameter `name`. Blank values count as absent, as with
    /// Python's `parse_qs`; repeats were refused before the handler ran.
    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every query pair, in order (an OpenAI list's `name[]` may repeat; a map's
    /// entries arrive as `name[key]`).
    pub fn query_pairs(&self) -> &[(String, String)] {
        &self.query
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// A `{param}` segment of the route path, percent-decoded.
    pub fn path_param(&self, name: &str) -> Option<&str> {
        self.path_params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The endpoint being served.
    pub fn spec(&self) -> &EndpointSpec {
        &self.catalog.endpoints[self.endpoint].spec
    }

    /// The policy's decision for this endpoint.
    pub fn decision(&self) -> &Decision {
        &self.catalog.decisions[self.endpoint]
    }

    /// What handlers work with: confinement, the I/O driver, limits, children.
    pub fn services(&self) -> &Services {
        &self.state.services
    }

    /// The state of type `T` a group registered (see [`super::groups`]).
    pub fn group_state<T: Send + Sync + 'static>(&self) -> Result<&T, ApiError> {
        self.state.services.groups.require::<T>()
    }

    /// [`Call::group_state`] as a shared handle, for work that outlives the request.
    pub fn group_arc<T: Send + Sync + 'static>(&self) -> Result<Arc<T>, ApiError> {
        self.state.services.groups.require::<T>()?;
        self.state
            .services
            .groups
            .get_arc::<T>()
            .ok_or_else(|| ApiError::internal("RuntimeError", "a group state changed type"))
    }

    /// The server's settings.
    pub fn config(&self) -> &crate::config::Config {
        &self.state.config
    }

    /// The route table and its decisions, for the discovery routes.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The body as a JSON object deserialised into `T`; an empty body is `{}`. The
    /// dispatcher already refused bodies that are not a JSON object, so an error here is
    /// a field of the wrong type, reported as 400 with serde's description.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        parse_json(&self.body)
    }

    /// Like [`Call::json`], but `T` may borrow strings from the body, so a large base64
    /// field is not copied.
    pub fn json_borrowed<'a, T: Deserialize<'a>>(&'a self) -> Result<T, ApiError> {
        parse_json(&self.body)
    }

    /// The endpoint's declared fields, read from the query and the JSON body and checked
    /// against their declarations (see [`crate::api::fields`]); a refusal is worded in
    /// the endpoint's error style.
    pub fn args(&self) -> Result<Args, ApiError> {
        self.args_of(&self.spec().params)
    }

    /// [`Call::args`] for some of the endpoint's declared fields: for a handler that
    /// checks a field only after another check (a lookup, another field's path), as the
    /// contract orders its refusals, or that reads one field by a rule no declaration
    /// states (Python's `int()`).
    pub fn args_of(&self, params: &[Param]) -> Result<Args, ApiError> {
        let spec = self.spec();
        let body = match spec.method.takes_json_body() {
            true => Some(body_object(&self.body, spec.errors)?),
            false => None,
        };
        crate::api::fields::parse(params, spec.errors, spec.unknown_fields, &self.query, body)
    }

    /// The endpoint's declared fields named `names`, in declaration order (for
    /// [`Call::args_of`]).
    pub fn params_named(&self, names: &[&str]) -> Vec<Param> {
        self.spec()
            .params
            .iter()
            .filter(|p| names.contains(&p.name))
            .cloned()
            .collect()
    }

    /// Moves the body out, e.g. to parse it on the blocking pool.
    pub fn take_body(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.body)
    }
}

/// Parses a JSON object body (empty is `{}`), worded as the contract's 400s.
pub fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    let body: &[u8] = if is_blank(body) { b"{}" } else { body };
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => {
            ApiError::bad_request(format!("Invalid request body: {e}"))
        }
        _ => ApiError::bad_request(format!("Invalid JSON body: {e}")),
    })
}

/// The body as a JSON object (empty is `{}`), refused in `style`.
fn body_object(body: &[u8], style: ErrorStyle) -> Result<Map<String, Value>, ApiError> {
    match style {
        ErrorStyle::Contract | ErrorStyle::Connect | ErrorStyle::Envd => parse_json(body),
        ErrorStyle::OpenAi => {
            if is_blank(body) {
                return Ok(Map::new());
            }
            match serde_json::from_slice::<Value>(body) {
                Ok(Value::Object(map)) => Ok(map),
                Ok(_) => Err(crate::api::fields::refusal(
                    style,
                    "body",
                    "The request body must be a JSON object.".into(),
                )),
                Err(e) => Err(crate::api::fields::refusal(
                    style,
                    "body",
                    format!("The request body is not valid JSON: {e}"),
                )),
            }
        }
    }
}

/// Whether a body is empty for the contract's purposes (only whitespace).
pub fn is_blank(body: &[u8]) -> bool {
    body.iter().all(u8::is_ascii_whitespace)
}

/// Wraps an async function as a [`Handler`].
pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(Call) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Response, ApiError>> + 'static,
{
    Arc::new(move |call| Box::pin(f(call)))
}

/// Wraps an async function that opens a raw-body sink as a [`SinkHandler`].
pub fn sink_handler<F, Fut>(f: F) -> SinkHandler
where
    F: Fn(Call) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Box<dyn RawSink>, ApiError>> + 'static,
{
    Arc::new(move |call| Box::pin(f(call)))
}

/// A WebSocket connection the dispatcher took over (it already answered `101`), with
/// the outcome of authentication and policy: a refused connection is closed by the
/// handler with the refusal's close code, since a WebSocket has no status to answer.
pub struct Upgraded {
    pub query: Vec<(String, String)>,
    pub admitted: Result<Arc<Identity>, Refusal>,
    /// What the client presented, to admit it again after a policy reload.
    pub(crate) credentials: super::auth::Credentials,
    /// The endpoint's index in the catalog (stable across reloads).
    pub(crate) endpoint: usize,
    pub(crate) state: Arc<AppState>,
}

impl Upgraded {
    /// The single value of query parameter `name`.
    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn services(&self) -> &Services {
        &self.state.services
    }

    /// The state of type `T` a group registered (see [`super::groups`]).
    pub fn group_state<T: Send + Sync + 'static>(&self) -> Result<&T, ApiError> {
        self.state.services.groups.require::<T>()
    }

    /// The endpoint's declared query fields, checked (see [`Call::args`]).
    pub fn args(&self) -> Result<Args, ApiError> {
        let catalog = self.state.catalog();
        let spec = &catalog.endpoints[self.endpoint].spec;
        crate::api::fields::parse(
            &spec.params,
            spec.errors,
            spec.unknown_fields,
            &self.query,
            None,
        )
    }

    /// The policy reloads seen so far; [`Upgraded::reloaded`] waits for the next.
    pub fn reload_version(&self) -> u64 {
        self.state.reloads().version()
    }

    /// Resolves once a policy reload happened after `seen` (from
    /// [`Upgraded::reload_version`]).
    pub async fn reloaded(&self, seen: u64) {
        self.state.reloads().changed(seen).await
    }

    /// Admits the connection again under the current policy: the same identity must
    /// still present valid credentials and still be allowed this endpoint. A revoked
    /// identity (or token) is a 4001 refusal; a disabled endpoint or a lost scope, 4003.
    pub fn readmit(&self) -> Result<Arc<Identity>, Refusal> {
        let catalog = self.state.catalog();
        let before = self.admitted.as_ref().map_err(Clone::clone)?;
        let required = catalog.endpoints[self.endpoint].spec.auth_required;
        let identity = match catalog.auth.identify(&self.credentials, required) {
            Ok(identity) if identity.id == before.id => identity,
            _ => {
                return Err(Refusal {
                    close_code: 4001,
                    reason: "unauthorized: the credentials were revoked".into(),
                })
            }
        };
        let access = catalog.access(self.endpoint, &identity);
        if !access.allowed {
            return Err(Refusal {
                close_code: 4003,
                reason: access.reason.unwrap_or_else(|| "endpoint disabled".into()),
            });
        }
        Ok(identity)
    }
}

impl Upgraded {
    /// A request to the endpoint `id` with the JSON `body`, made by this connection's
    /// identity (admitted again under the current policy, and it must be allowed that
    /// endpoint too): how a WebSocket's messages run another endpoint's handler.
    pub fn call_to(&self, id: &str, body: Vec<u8>) -> Result<Call, ApiError> {
        let identity = self.readmit().map_err(|refusal| {
            ApiError::new(
                if refusal.close_code == 4001 { 401 } else { 403 },
                "invalid_request_error",
                refusal.reason,
            )
        })?;
        let catalog = self.state.catalog();
        let index = catalog
            .endpoints
            .iter()
            .position(|e| e.spec.id == id)
            .ok_or_else(|| ApiError::internal("RuntimeError", format!("no endpoint {id}")))?;
        if let Some(refusal) = catalog.access(index, &identity).refusal(id, &identity) {
            return Err(refusal);
        }
        let spec = &catalog.endpoints[index].spec;
        Ok(Call {
            method: spec.method,
            path: spec.path.to_string(),
            query: Vec::new(),
            headers: vec![("content-type".into(), "application/json".into())],
            body,
            path_params: Vec::new(),
            identity,
            endpoint: index,
            state: self.state.clone(),
            catalog: catalog.clone(),
        })
    }
}

/// Why a WebSocket is closed right after its handshake.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// 4001 for credentials, 4003 for policy (disabled, or a missing scope).
    pub close_code: u16,
    pub reason: String,
}
