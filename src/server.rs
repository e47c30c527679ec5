//! The embedding API: build a server from a configuration, add custom routes, run it.
//!
//! ```no_run
//! use agent_sandbox::{Config, Endpoint, Group, Method, Response, Server, handler};
//!
//! let hello = Endpoint::new(Method::Get, "/hello/{name}", Group::Commands, handler(|req| async move {
//!     let name = req.path_param("name").unwrap_or("World").to_string();
//!     Ok(Response::ok(&serde_json::json!({"greeting": format!("Hello, {name}!")})))
//! }));
//! Server::new(Config::default()).endpoint(hello).run().unwrap();
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::Config;
use crate::routes::{builtin_endpoints, Endpoint, Group, Handler, Method};
use crate::runtime::{self, blocking::BlockingPool, shutdown, shutdown::Shutdown};
use crate::state::AppState;

/// A server under construction.
pub struct Server {
    config: Config,
    custom: Vec<Endpoint>,
}

impl Server {
    pub fn new(config: Config) -> Server {
        Server {
            config,
            custom: Vec::new(),
        }
    }

    /// Adds a custom route with the contract's defaults (auth required, not streaming);
    /// its endpoint id is `"METHOD /path"`. Use [`Server::endpoint`] for other options.
    pub fn route(self, method: Method, path: &str, group: Group, handler: Handler) -> Server {
        self.endpoint(Endpoint::new(method, path, group, handler))
    }

    /// Adds a fully described endpoint. It appears in `/capabilities`, counts in its
    /// group's `group_summary`, and answers only while the policy enables it.
    pub fn endpoint(mut self, endpoint: Endpoint) -> Server {
        self.custom.push(endpoint);
        self
    }

    /// Binds, prints the startup lines, and serves until SIGTERM/SIGINT.
    pub fn run(self) -> Result<(), String> {
        // Before any thread exists, so every thread inherits the blocked mask and only the
        // signal thread sees SIGTERM/SIGINT.
        shutdown::block_termination_signals();
        raise_open_file_limit();
        let (driver, fallback_note) = runtime::choose_driver(self.config.io_driver)?;
        let mut endpoints = builtin_endpoints();
        endpoints.extend(self.custom);
        let state = Arc::new(AppState::build(self.config, endpoints, driver.name())?);
        let config = &state.config;
        let addr = SocketAddr::new(config.host, config.port);
        let (listeners, bound) = runtime::bind_all(addr, config.workers)
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        if let Some(note) = fallback_note {
            eprintln!("agent-sandbox: {note}");
        }
        for warning in &state.warnings {
            eprintln!("agent-sandbox: warning: {warning}");
        }
        println!(
            "agent-sandbox {} address={} workers={} io_driver={} groups={} auth={}",
            env!("CARGO_PKG_VERSION"),
            bound,
            config.workers,
            driver.name(),
            state.enabled_groups_line(),
            state.auth.mode(),
        );
        println!("listening on {bound}");
        let shutdown = Arc::new(Shutdown::default());
        let pool = BlockingPool::new(config.blocking_threads);
        let workers =
            runtime::start_workers(listeners, driver, state.clone(), shutdown.clone(), pool)
                .map_err(|e| format!("cannot start worker threads: {e}"))?;
        shutdown::spawn_signal_thread(shutdown, state);
        for worker in workers {
            let _ = worker.join();
        }
        Ok(())
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
