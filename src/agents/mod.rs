//! Coding-agent CLIs behind the OpenAI-compatible `/v1` surface, as domain code (no
//! HTTP types here; `routes::agents` adapts it): which runtimes exist, how each CLI is
//! started for a turn (a new session or a resumed one), how its JSON-lines output
//! becomes a neutral stream of [`events::AgentEvent`]s, and what the surface keeps and
//! does. This root only declares and re-exports; its modules import each other:
//!
//! - [`surface`] ([`Agents`]): the object store and the turns running now; every store
//!   call goes through [`Agents::transact`] (the blocking pool);
//! - [`records`]: the object store's contract (typed, owner-scoped records behind the
//!   [`records::ObjectStore`] trait), [`durable`] its backend (redb, on disk or in
//!   memory), [`store`] the running server's store (`<ABX_STATE_DIR>/agents.redb`, the
//!   fallback, what a restart does to work in flight);
//! - [`responses`] and [`conversations`]: the records and operations of each resource,
//!   [`input`] what requests hand them;
//! - [`run`]: a turn run to its end, producing the Response and its stream events;
//!   [`turn`]: the CLI process of one turn;
//! - [`runtime`]: the declared runtimes and their CLIs, [`events`] what their output
//!   says; [`claude`]: how Claude Code is started and read;
//! - [`saved`] (saved agents and [`saved::AgentConfig`], which sessions start from),
//!   [`environments`] (this sandbox as the Agents API's environment, its files, and
//!   environment templates), [`vaults`] (credentials for MCP servers, sealed by
//!   [`seal`]): the Agents API's CRUD resources, [`body`] how their nested fields are
//!   checked;
//! - [`app_server`]: a client of `codex app-server` (one long-lived codex serving
//!   threads over JSON-RPC), and [`codex_map`] what it says in the Agents API's
//!   shapes (items, events, an agent's thread params), for the sessions of issue 27;
//! - [`files`]: `POST /v1/files` uploads, named by `file_id` in environment files;
//! - [`webhooks`]: webhook endpoints, the events sessions announce to them, and the
//!   outbox their deliveries wait in (delivered by a thread of their own, retried);
//! - [`automations`]: scheduled and manual runs of sessions, fired and delivered by a
//!   thread of their own;
//! - [`objects`]: the OpenAI shapes; [`error`]: why an operation was refused.
//!
//! Three runtimes have a local backend. **codex** runs `codex exec --json` per turn and
//! `codex exec resume <thread_id>` for the next one (the CLI keeps the thread on disk).
//! **qwen-code** runs `qwen --output-format stream-json --approval-mode yolo`, and
//! `--resume <session_id>` for the next turn. **claude-code** runs `claude -p
//! --output-format stream-json` with a session id the server names, in a config
//! directory of that session's own, and `--resume <id>` for the next turn. All read the
//! prompt on stdin (no argv length limit) and run in the base directory, in their own
//! process group; a cancel kills the CLI and every command it started.

pub mod app_server;
pub mod automations;
pub mod body;
pub mod claude;
pub mod codex_map;
pub mod conversations;
pub mod durable;
pub mod environments;
pub mod error;
pub mod events;
pub mod files;
pub mod input;
pub mod install;
pub mod objects;
pub mod records;
pub mod responses;
pub mod run;
pub mod runtime;
pub mod saved;
pub mod seal;
pub mod sessions;
pub mod store;
pub mod surface;
pub mod turn;
pub mod vaults;
pub mod webhooks;

pub use error::AgentError;

/// How long after the server starts its background threads resume what the last server
/// left (queued webhook deliveries, the automations' schedule). Resuming opens and reads
/// the store (a file lock, header writes, an `fdatasync`): started at once, that work
/// shares the CPU with the workers' start and delayed the first answer by about 2 ms.
/// Nothing resumed is due to the millisecond: a delivery is tried at least once, an
/// automation fires on whole minutes. Half of the trimmer's settling time, so the pages
/// the resume maps go with the start-up code it releases then (done after it, they
/// stayed resident until the next quiet-time trim: 4.8 against 1.8 MiB for the
/// first half second).
pub const RESUME_AFTER_START: std::time::Duration =
    std::time::Duration::from_millis(crate::runtime::memory::SETTLE.as_millis() as u64 / 2);
pub use runtime::{cli_version, node_requirement, Runtime};
pub use surface::Agents;
