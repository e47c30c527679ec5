//! The embedding API: build a server from a configuration, add custom routes, run it.
//!
//! ```no_run
//! use agent_sandbox::{Config, Endpoint, Group, Method, Response, Server, handler};
//!
//! let hello = Endpoint::new(Method::Get, "/hello/{name}", Group::Commands, handler(|call| async move {
//!     let name = call.path_param("name").unwrap_or("World").to_string();
//!     Ok(Response::ok(&serde_json::json!({"greeting": format!("Hello, {name}!")})))
//! }));
//! Server::new(Config::default()).endpoint(hello).run().unwrap();
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use crate::api::{Group, Listener, Method};
use crate::app::dispatch::service_factory;
use crate::app::state::Extras;
use crate::app::{AppState, Endpoint, Handler};
use crate::bridge::{Bridge, BridgeOptions, PythonApp};
use crate::commands::Command;
use crate::config::{Config, IoDriverChoice};
use crate::process::ChildRegistry;
use crate::routes::builtin_endpoints;
use crate::runtime::{self, blocking::BlockingPool, shutdown, shutdown::Shutdown, DriverChoice};

/// A server under construction.
pub struct Server {
    config: Config,
    custom: Vec<Endpoint>,
    commands: Vec<Command>,
    group_switches: Vec<(Group, bool)>,
}

impl Server {
    pub fn new(config: Config) -> Server {
        Server {
            config,
            custom: Vec::new(),
            commands: Vec::new(),
            group_switches: Vec::new(),
        }
    }

    /// Registers a named command (`GET /commands`, `POST /commands/{name}`). The
    /// registry is frozen when the server starts; a name registered twice keeps the
    /// later registration.
    pub fn command(mut self, command: Command) -> Server {
        self.commands.push(command);
        self
    }

    /// Turns a group on in code (Python's `default_table().enable_group`): below the
    /// policy document and `ABX_SERVER_ENABLED_GROUPS`, above the defaults.
    pub fn enable_group(mut self, group: Group) -> Server {
        self.group_switches.push((group, true));
        self
    }

    /// Turns a group off in code (`disable_group`). The core group cannot be turned off.
    pub fn disable_group(mut self, group: Group) -> Result<Server, String> {
        if group == Group::Core {
            return Err("the core group cannot be disabled".into());
        }
        self.group_switches.push((group, false));
        Ok(self)
    }

    /// Adds a custom route with the contract's defaults (auth required, not streaming);
    /// its endpoint id is `"METHOD /path"`. Use [`Server::endpoint`] for other options.
    pub fn route(
        self,
        method: Method,
        path: impl Into<crate::api::Text>,
        group: Group,
        handler: Handler,
    ) -> Server {
        self.endpoint(Endpoint::new(method, path, group, handler))
    }

    /// Adds a fully described endpoint. It appears in `/capabilities`, counts in its
    /// group's `group_summary`, and answers only while the policy enables it.
    pub fn endpoint(mut self, endpoint: Endpoint) -> Server {
        self.custom.push(endpoint);
        self
    }

    /// What the configured policy document decides for every endpoint of this server,
    /// as a table (`--check-policy`); the error is one line, as at startup.
    pub fn check_policy(self) -> Result<String, String> {
        let mut endpoints = builtin_endpoints();
        endpoints.extend(self.custom);
        // The commands' registrar alone (its warnings belong in the table): the groups'
        // state is a running server's (the agents store takes its file and holds it
        // locked), and a dry run beside that server must neither take nor warn about it.
        let registrars = vec![crate::routes::commands::registrar(self.commands, None)];
        let extras = Extras {
            group_switches: self.group_switches,
            registrars,
            ..Extras::default()
        };
        let state = AppState::build(
            self.config,
            endpoints,
            crate::runtime::IoDriver::Epoll,
            extras,
        )?;
        let catalog = state.catalog();
        let mut out = format!(
            "policy {} preset={} revision={}\n",
            state
                .config
                .policy_path
                .as_deref()
                .map(|p| p.display().to_string())
                .or_else(|| state
                    .config
                    .policy_inline
                    .as_ref()
                    .map(|_| "(inline ABX_SERVER_POLICY)".into()))
                .unwrap_or_else(|| "(none)".into()),
            catalog.policy.preset,
            catalog.policy.revision
        );
        out.push_str(&format!(
            "{:<24} {:<7} {:<36} {:<7} {:<28} {:<24} {}\n",
            "endpoint", "method", "path", "enabled", "rule", "scopes", "limits"
        ));
        for (endpoint, decision) in catalog.endpoints.iter().zip(&catalog.decisions) {
            let spec = &endpoint.spec;
            let method = match spec.listener {
                Listener::Pty => "WS",
                Listener::Api | Listener::K8sRuntime | Listener::Envd => spec.method.as_str(),
            };
            let scopes = if decision.scopes.is_empty() {
                "-".to_string()
            } else {
                decision.scopes.join(",")
            };
            let limits = if decision.limits.is_empty() {
                "-".to_string()
            } else {
                serde_json::Value::Object(decision.limits.clone()).to_string()
            };
            out.push_str(&format!(
                "{:<24} {:<7} {:<36} {:<7} {:<28} {:<24} {}\n",
                spec.id, method, spec.path, decision.enabled, decision.rule, scopes, limits
            ));
        }
        for warning in &catalog.warnings {
            out.push_str(&format!("warning: {warning}\n"));
        }
        out.pop();
        Ok(out)
    }

    /// Binds, prints the startup lines, and serves until SIGTERM/SIGINT.
    pub fn run(self) -> Result<(), String> {
        // Before any thread exists, so every thread inherits the blocked mask and only
        // `handle_signals`, on this thread at the end, sees SIGTERM/SIGINT.
        shutdown::block_termination_signals();
        // Secrets leave the environment before anything can copy it (the guardian's
        // fork, a child), and the process's memory is closed to its own user.
        // The policy's variables too, as the reference keeps them from children: a
        // caller with /shell learns nothing of how it is governed.
        crate::process::secrets::keep(&[
            "ABX_SERVER_TOKEN",
            "ABX_SERVER_POLICY",
            "ABX_SERVER_POLICY_FILE",
            crate::agents::seal::KEY_VAR,
        ]);
        // The model API's key, when the agents group may run Claude Code (it is named,
        // or a policy may turn it on): the CLI reaches the model through the relay,
        // which holds the key, so the model's commands cannot read it
        // (`agents::claude::relay`).
        let agents_may_run = self
            .config
            .enabled_groups
            .contains(&crate::api::Group::Agents)
            || self.config.policy_path.is_some()
            || self.config.policy_inline.is_some();
        if agents_may_run {
            crate::process::secrets::keep(&crate::agents::claude::relay::KEY_VARS);
        }
        if self.config.policy_path.is_some() || self.config.policy_inline.is_some() {
            // The policy's token_env variables too; a document that does not load is
            // reported once, by the build below.
            if let Ok(policy) = crate::app::state::load_policy(&self.config) {
                let names = policy.token_env_names();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                crate::process::secrets::keep(&names);
            }
        }
        crate::process::secrets::make_undumpable();
        if let Some((uid, gid)) = self.config.child_user {
            crate::process::spawn::set_child_user(uid, gid)?;
        }
        raise_open_file_limit();
        mark_inherited_descriptors_cloexec();
        let choice = match self.config.io_driver {
            IoDriverChoice::Auto => DriverChoice::Auto,
            IoDriverChoice::Uring => DriverChoice::Uring,
            IoDriverChoice::Epoll => DriverChoice::Epoll,
        };
        let (driver, fallback_note) = runtime::choose_driver(choice)?;
        let mut endpoints = builtin_endpoints();
        endpoints.extend(self.custom);
        let mut extras = Extras {
            group_switches: self.group_switches,
            registrars: crate::routes::builtin_registrars(),
            ..Extras::default()
        };
        let mut commands = self.commands;
        let mut bridge = None;
        if let Some(app) = &self.config.python_app {
            let (started, children) = start_python(
                app,
                &self.config,
                &mut endpoints,
                &mut commands,
                &mut extras,
            )?;
            bridge = Some(started);
            extras.children = Some(children);
        }
        extras
            .registrars
            .push(crate::routes::commands::registrar(commands, bridge.clone()));
        let state = Arc::new(AppState::build(self.config, endpoints, driver, extras)?);
        check_kernel()?;
        check_base_dir(state.services.base.path())?;
        create_missing_base_dir(state.services.base.path());
        let config = &state.config;
        let addr = SocketAddr::new(config.host, config.port);
        let (listeners, bound) = runtime::bind_all(addr, config.workers)
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let _ = state.services.bound_api.set(bound);
        if let Some(note) = fallback_note {
            crate::log!("{note}");
        }
        for warning in &state.catalog().warnings {
            crate::log!("warning: {warning}");
        }
        crate::log::stdout_line(format_args!(
            "agent-sandbox {} address={} workers={} io_driver={} groups={} auth={} base_dir={}",
            env!("CARGO_PKG_VERSION"),
            bound,
            config.workers,
            driver.name(),
            state.catalog().enabled_groups_line(),
            state.catalog().auth.mode(),
            state.services.base.path().display(),
        ));
        let shutdown = Arc::new(Shutdown::default());
        let pool = BlockingPool::new(config.blocking_threads, config.blocking_idle_timeout);
        // Slot 0 of every worker is the API port; the PTY WebSocket's port is slot 1,
        // listening only while an endpoint it serves is on.
        let mut slots = vec![Listener::Api];
        let mut per_worker: Vec<Vec<(usize, std::net::TcpListener)>> =
            listeners.into_iter().map(|l| vec![(0, l)]).collect();
        if state.catalog().listener_enabled(Listener::Pty) {
            let pty_addr = SocketAddr::new(config.host, config.pty_port);
            let (pty_listeners, pty_bound) =
                runtime::bind_all(pty_addr, config.workers).map_err(|e| {
                    format!("cannot listen on {pty_addr} (the PTY WebSocket, --pty-port): {e}")
                })?;
            let _ = state.services.bound_pty_port.set(pty_bound.port());
            slots.push(Listener::Pty);
            for (worker, listener) in per_worker.iter_mut().zip(pty_listeners) {
                worker.push((1, listener));
            }
            crate::log::stdout_line(format_args!("pty listening on {pty_bound}"));
        }
        // The k8s_runtime port, the next slot, only while an endpoint it serves is on.
        if state.catalog().listener_enabled(Listener::K8sRuntime) {
            let k8s_addr = SocketAddr::new(config.host, config.k8s_runtime_port);
            let (k8s_listeners, k8s_bound) = runtime::bind_all(k8s_addr, config.workers)
                .map_err(|e| {
                    format!("cannot listen on {k8s_addr} (the k8s_runtime port, --k8s-runtime-port): {e}")
                })?;
            let slot = slots.len();
            slots.push(Listener::K8sRuntime);
            for (worker, listener) in per_worker.iter_mut().zip(k8s_listeners) {
                worker.push((slot, listener));
            }
            crate::log::stdout_line(format_args!("k8s_runtime listening on {k8s_bound}"));
        }
        // The envd port, the next slot, only while an endpoint it serves is on.
        if state.catalog().listener_enabled(Listener::Envd) {
            let envd_addr = SocketAddr::new(config.host, config.envd_port);
            let (envd_listeners, envd_bound) = runtime::bind_all(envd_addr, config.workers)
                .map_err(|e| {
                    format!("cannot listen on {envd_addr} (the envd port, --envd-port): {e}")
                })?;
            let _ = state.services.bound_envd_port.set(envd_bound.port());
            let slot = slots.len();
            slots.push(Listener::Envd);
            for (worker, listener) in per_worker.iter_mut().zip(envd_listeners) {
                worker.push((slot, listener));
            }
            crate::log::stdout_line(format_args!("envd listening on {envd_bound}"));
        }
        crate::log::stdout_line(format_args!("listening on {bound}"));
        let factory = Arc::new(service_factory(state.clone(), shutdown.clone(), slots));
        runtime::start_workers(per_worker, driver, shutdown.clone(), pool, factory)
            .map_err(|e| format!("cannot start worker threads: {e}"))?;
        // Groups' background work that calls routes in-process starts now, with the
        // app state whole.
        crate::routes::started(&state);
        if std::process::id() == 1 {
            start_orphan_reaper(state.clone());
        }
        if state.config.token_file.is_some() {
            start_token_watcher(state.clone());
        }
        runtime::memory::spawn_trimmer(shutdown.clone());
        let children_state = state.clone();
        let reload_state = state.clone();
        shutdown::handle_signals(
            shutdown,
            state.config.shutdown_grace,
            Box::new(move || {
                // A reload must never take the signal handling (and so shutdown) with it.
                let reloaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    reload_state.reload_policy()
                }));
                match reloaded {
                    Ok(Ok(revision)) => crate::log!("SIGHUP: policy reloaded, revision {revision}"),
                    Ok(Err(why)) => {
                        crate::log!("SIGHUP: policy not reloaded, the current one stays: {why}")
                    }
                    Err(_) => crate::log!(
                        "SIGHUP: policy not reloaded, the current one stays: the reload panicked"
                    ),
                }
            }),
            Box::new(move || {
                if let Some(bridge) = &bridge {
                    bridge.stop();
                }
                children_state.services.groups.shut_down();
                let children = &children_state.services.children;
                if children.signal_all(nix::sys::signal::Signal::SIGTERM) > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    children.signal_all(nix::sys::signal::Signal::SIGKILL);
                }
            }),
        )
    }
}

/// Starts the Python worker of `ABX_PYTHON_APP` and declares what its manifest
/// registered: commands, custom routes and group switches.
fn start_python(
    app: &str,
    config: &Config,
    endpoints: &mut Vec<Endpoint>,
    commands: &mut Vec<Command>,
    extras: &mut Extras,
) -> Result<(Arc<Bridge>, Arc<ChildRegistry>), String> {
    let app = PythonApp::from_env_value(app)?;
    let children = Arc::new(ChildRegistry::default());
    let options = BridgeOptions {
        links: config.workers,
        hang_timeout: config.bridge_hang_timeout,
        startup_timeout: std::time::Duration::from_secs(120),
    };
    let (bridge, manifest) = Bridge::start(app, options, children.clone())?;
    let described = |e: String| format!("the Python worker's registrations: {e}");
    commands.extend(manifest.commands().map_err(described)?);
    extras
        .group_switches
        .extend(manifest.group_switches().map_err(described)?);
    endpoints
        .extend(crate::routes::commands::python::endpoints(&manifest.routes).map_err(described)?);
    Ok((bridge, children))
}

/// As a container's PID 1 the server inherits every orphaned descendant (a child's
/// background job outliving it), and nothing else would reap those when they exit.
/// Twice a second is often enough that zombies never pile up, and costs one `/proc`
/// scan; the server's own children are reaped the moment they exit, by their pidfds.
fn start_orphan_reaper(state: Arc<AppState>) {
    let spawned = std::thread::Builder::new()
        .name("abx-reaper".into())
        .spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_millis(500));
            state.services.children.reap_orphans();
        });
    if let Err(e) = spawned {
        crate::log!("warning: cannot start the orphan reaper ({e}); orphaned descendants of children will stay zombies");
    }
}

/// Watches `ABX_TOKEN_FILE` by reading it twice a second. Polling, not inotify: a
/// projected Secret is updated by swapping a `..data` symlink in its directory, which a
/// watch on the file itself never sees, and one small read costs nothing. Never on a
/// worker: the read is a blocking call.
fn start_token_watcher(state: Arc<AppState>) {
    let spawned = std::thread::Builder::new()
        .name("abx-tokenfile".into())
        .spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_millis(500));
            match state.reload_token() {
                Ok(true) => crate::log!(
                    "ABX_TOKEN_FILE changed: auth mode is now {}",
                    state.catalog().auth.mode()
                ),
                Ok(false) => {}
                Err(why) => crate::log!("ABX_TOKEN_FILE changed but was not applied: {why}"),
            }
        });
    if let Err(e) = spawned {
        crate::log!(
            "warning: cannot watch ABX_TOKEN_FILE ({e}); a token written later is not seen"
        );
    }
}

/// Descriptors this process inherited without close-on-exec (a pipe from the shell or
/// supervisor that started us) would otherwise pass on to every child, as Python's
/// `close_fds=True` prevents. Everything the server itself opens is close-on-exec.
fn mark_inherited_descriptors_cloexec() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: only the flag of a descriptor this process holds is changed; one that
        // closed meanwhile (the directory's own) fails harmlessly.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let _ = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC);
    }
}

/// Refuses to start where every file route would fail: `openat2` (Linux 5.6) missing,
/// or refused by a seccomp profile, is said once here instead of as a 500 per request.
fn check_kernel() -> Result<(), String> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    match rustix::fs::openat2(
        rustix::fs::CWD,
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH,
    ) {
        Ok(_) => Ok(()),
        Err(e @ (rustix::io::Errno::NOSYS | rustix::io::Errno::PERM)) => Err(format!(
            "openat2 is not available ({e}): file routes confine paths with it; run on Linux 5.6 or later with a seccomp profile that allows openat2"
        )),
        // Any other answer means the call exists.
        Err(_) => Ok(()),
    }
}

/// A base directory that exists must be a directory the server can read; a missing one
/// is only a warning (writes create it, as the Python server does).
fn check_base_dir(path: &std::path::Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_dir() => Err(format!(
            "base directory {} is not a directory; set --base-dir or ABX_SERVER_BASE_DIR to a directory",
            path.display()
        )),
        Ok(_) => std::fs::read_dir(path).map(drop).map_err(|e| {
            format!(
                "base directory {} cannot be read ({e}); fix its permissions or choose another with --base-dir",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!(
            "base directory {} cannot be reached ({e})",
            path.display()
        )),
    }
}

/// A missing base directory (the default `/home/user` often is) is created when its
/// parent allows, so commands and file routes work from the first request; otherwise one
/// line says what fails until it exists. `/capabilities` repeats that warning for as long
/// as the directory is missing.
fn create_missing_base_dir(path: &std::path::Path) {
    if path.is_dir() {
        return;
    }
    match std::fs::create_dir_all(path) {
        Ok(()) => crate::log!("created the missing base directory {}", path.display()),
        Err(e) => crate::log!(
            "warning: base directory {} does not exist and cannot be created ({e}): file routes, and commands and terminals without a cwd, fail until it exists",
            path.display()
        ),
    }
}

/// Lifts the soft limit on open descriptors to the hard limit: every connection, open
/// file and watched directory holds one, and the usual soft default of 1024 is far below
/// what one busy worker can need.
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        let _ = setrlimit(Resource::Nofile, raised);
    }
}
