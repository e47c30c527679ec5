//! The HTTP/1.1 engine (on httparse) and the request/response types handlers use.

pub mod conn;
pub mod request;
pub mod response;
pub mod sse;

pub use request::Request;
pub use response::{Body, Response, JSON_CONTENT_TYPE, SSE_CONTENT_TYPE};
