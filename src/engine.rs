//! The engine under the server, a library of its own (`agent-sandbox-engine`, the
//! `engine/` package): the contract's vocabulary, the HTTP engine, the runtime, and the
//! domain code that moves bytes (files, processes, terminals). It imports nothing of the
//! server built on it (`src/lib.rs`), so Cargo keeps these layers below routes, the app
//! and the agents; and it is built at opt-level 3 while the server is built for size
//! (docs/architecture.md, "Packages").

pub mod api;
pub mod fs;
pub mod http;
#[doc(hidden)]
pub mod log;
pub mod process;
pub mod pty;
pub mod runtime;
pub mod timefmt;
