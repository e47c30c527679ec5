//! The application: the route table's runtime form (`endpoint`, `router`), dispatch as
//! named steps (`dispatch`), the same dispatch called from memory (`client`),
//! credentials (`auth`), the policy engine (`policy`), the contract's request rules
//! (`request`) and the shared state (`state`).

pub mod audit;
pub mod auth;
pub mod client;
pub mod dispatch;
pub mod endpoint;
pub mod groups;
pub mod openapi;
pub mod policy;
pub mod request;
pub mod router;
pub mod state;

pub use endpoint::RawSink;
pub use groups::Registrar;
pub use state::AppState;
pub use state::{handler, sink_handler, Call, Endpoint, Handler, Upgraded};
