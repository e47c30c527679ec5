//! agent-sandbox: a drop-in, thread-per-core replacement for the `agent_sandbox.server`
//! HTTP API. See `docs/architecture.md` for how the pieces fit.
//!
//! The public surface is the embedding API: [`Server`], [`Config`], [`Endpoint`],
//! [`handler`], [`Call`], [`Response`], [`ApiError`], [`Group`], [`Method`], [`Param`],
//! named commands ([`Command`], [`CommandArg`], [`ArgType`], [`CommandError`]) and the
//! server-sent events channel ([`sse`]). Everything else is internal.

// The engine's layers (src/engine.rs), under the names the server's code uses for them.
#[doc(hidden)]
pub use agent_sandbox_engine::log;
use agent_sandbox_engine::{api, fs, http, process, pty, runtime, timefmt};

mod agents;
mod app;
mod bridge;
mod browser;
mod commands;
pub mod config;
mod envd;
mod git;
mod mcp;
#[cfg(test)]
mod module_graph;
mod pytext;
mod routes;
mod server;
mod system;
#[cfg(test)]
mod testing;

pub use api::{ApiError, Group, Method, Param};
pub use app::{handler, Call, Endpoint};
pub use commands::{ArgType, Command, CommandArg, CommandError};
pub use config::Config;
pub use http::Response;
pub use server::Server;

/// Server-sent events for streaming custom routes: `let (tx, rx) = sse::channel(n)`,
/// feed `tx` from a task, answer `sse::response(rx)`.
pub mod sse {
    pub use crate::http::sse::{
        channel, format_event, response, SseSender, SseStream, StreamClosed,
    };
}

/// `ABX_CHILD_USER`: children start as this program in a helper mode that drops to the
/// child user and then executes the program asked for. A program that embeds the server
/// calls [`child_user::run_if_asked`] first thing in its `main` (as `agent-sandbox` does).
pub mod child_user {
    /// When this process was started as the child-user helper, drops to the user and
    /// executes the program (never returning), or returns the exit code to leave with
    /// after a failure it printed. `None`: a normal start.
    pub fn run_if_asked() -> Option<std::process::ExitCode> {
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        if args
            .get(1)
            .is_none_or(|a| a != crate::process::spawn::EXEC_AS)
        {
            return None;
        }
        let error = crate::process::spawn::exec_as_child_user(&args[2..]);
        crate::log::line(format_args!(
            "cannot start the program as ABX_CHILD_USER: {error}"
        ));
        Some(std::process::ExitCode::from(126))
    }
}

/// Internals the micro-benchmarks (`benches/hot_paths.rs`) measure; not an API.
#[doc(hidden)]
pub mod bench_support {
    pub use crate::api::{Group, Listener, Method};
    pub use crate::app::policy::Policy;
    pub use crate::app::router::Router;
    pub use crate::routes::builtin_endpoints;
}
