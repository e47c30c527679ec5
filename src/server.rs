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
use crate::app::{AppState, Endpoint, Handler};
use crate::config::{Config, IoDriverChoice};
use crate::routes::builtin_endpoints;
use crate::runtime::{self, blocking::BlockingPool, shutdown, shutdown::Shutdown, DriverChoice};

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
        let choice = match self.config.io_driver {
            IoDriverChoice::Auto => DriverChoice::Auto,
            IoDriverChoice::Uring => DriverChoice::Uring,
            IoDriverChoice::Epoll => DriverChoice::Epoll,
        };
        let (driver, fallback_note) = runtime::choose_driver(choice)?;
        let mut endpoints = builtin_endpoints();
        endpoints.extend(self.custom);
        let state = Arc::new(AppState::build(self.config, endpoints, driver)?);
        let config = &state.config;
        let addr = SocketAddr::new(config.host, config.port);
        let (listeners, bound) = runtime::bind_all(addr, config.workers)
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        if let Some(note) = fallback_note {
            crate::log!("{note}");
        }
        for warning in &state.catalog.warnings {
            crate::log!("warning: {warning}");
        }
        println!(
            "agent-sandbox {} address={} workers={} io_driver={} groups={} auth={}",
            env!("CARGO_PKG_VERSION"),
            bound,
            config.workers,
            driver.name(),
            state.catalog.enabled_groups_line(),
            state.catalog.auth.mode(),
        );
        println!("listening on {bound}");
        let shutdown = Arc::new(Shutdown::default());
        let pool = BlockingPool::new(config.blocking_threads);
        // Slot 0 of every worker is the API port; the PTY port joins as slot 1 when the
        // terminal group is built.
        let slots = vec![Listener::Api];
        let per_worker = listeners.into_iter().map(|l| vec![(0, l)]).collect();
        let factory = Arc::new(service_factory(state.clone(), shutdown.clone(), slots));
        let workers = runtime::start_workers(per_worker, driver, shutdown.clone(), pool, factory)
            .map_err(|e| format!("cannot start worker threads: {e}"))?;
        let children_state = state.clone();
        shutdown::spawn_signal_thread(
            shutdown,
            state.config.shutdown_grace,
            Box::new(move || {
                let children = &children_state.services.children;
                if children.signal_all(nix::sys::signal::Signal::SIGTERM) > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    children.signal_all(nix::sys::signal::Signal::SIGKILL);
                }
            }),
        )
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
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
