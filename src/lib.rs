//! agent-sandbox: a drop-in, thread-per-core replacement for the `agent_sandbox.server`
//! HTTP API. See `docs/architecture.md` for how the pieces fit.
//!
//! The public surface is the embedding API: [`Server`], [`Config`], [`Endpoint`],
//! [`handler`], [`Call`], [`Response`], [`ApiError`], [`Group`], [`Method`], [`Param`],
//! named commands ([`Command`], [`CommandArg`], [`ArgType`], [`CommandError`]) and the
//! server-sent events channel ([`sse`]). Everything else is internal.

mod agents;
mod api;
mod app;
mod bridge;
mod browser;
mod commands;
pub mod config;
mod fs;
mod git;
mod http;
#[doc(hidden)]
pub mod log;
mod process;
mod pty;
mod pytext;
mod routes;
mod runtime;
mod server;
mod system;
mod timefmt;

pub use api::{ApiError, Group, Method, Param};
pub use app::{handler, Call, Endpoint};
pub use commands::{ArgType, Command, CommandArg, CommandError};
pub use config::Config;
pub use http::Response;
pub use server::Server;

/// Server-sent events for streaming custom routes: `let (tx, rx) = sse::channel(n)`,
/// feed `tx` from a task, answer `Response::sse(rx)`.
pub mod sse {
    pub use crate::http::sse::{channel, format_event, SseSender, SseStream, StreamClosed};
}

/// Internals the micro-benchmarks (`benches/hot_paths.rs`) measure; not an API.
#[doc(hidden)]
pub mod bench_support {
    pub use crate::api::{Group, Listener, Method};
    pub use crate::app::policy::Policy;
    pub use crate::app::router::Router;
    pub use crate::routes::builtin_endpoints;
}
