//! The HTTP/1.1 engine, protocol only: request heads (`head`), chunked bodies
//! (`chunked`), responses (`response`), server-sent events (`sse`), the connection loop
//! (`conn`) that serves any [`Service`], and one request served from memory (`memory`).
//! Nothing here knows routes, credentials or policy; the application answers through
//! the [`Service`] trait.

pub mod chunked;
pub mod chunks;
pub mod conn;
pub mod connect;
pub mod head;
pub mod memory;
pub mod multipart;
pub mod response;
pub mod service;
pub mod sse;
pub mod websocket;

pub use head::{ProtocolError, RequestHead};
pub use response::{BodyStream, LocalFuture, Response, JSON_CONTENT_TYPE};
pub use service::{BodySink, Plan, Service, Timeouts};
