//! agent-sandbox: a drop-in, thread-per-core replacement for the `agent_sandbox.server`
//! HTTP API. See `docs/architecture.md` for how the pieces fit.

pub mod auth;
pub mod config;
pub mod error;
pub mod fs;
pub mod http;
pub mod policy;
pub mod process;
pub mod routes;
pub mod runtime;
pub mod server;
pub mod state;
pub mod timefmt;

pub use config::Config;
pub use error::ApiError;
pub use http::{Request, Response};
pub use routes::{handler, Endpoint, Group, Method, Param};
pub use server::Server;
