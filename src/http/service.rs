//! The boundary between the engine and the application. The engine parses heads and
//! bodies and writes answers; for each request it asks a [`Service`] what to do (answer
//! now, read the body up to a limit, stream it into a sink, or take over the socket), and
//! writes what it gets back. The engine knows nothing of routes, credentials or policy.

use std::future::Future;

use monoio::net::TcpStream;

use super::head::{ProtocolError, RequestHead};
use super::response::{LocalFuture, Response};

/// Largest piece of a streamed body held in memory at once.
pub const STREAM_CHUNK: usize = 256 * 1024;

/// Connection timing a service asks of the engine.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// How long a keep-alive connection may sit between requests.
    pub idle: std::time::Duration,
    /// How long a started request (head or body) may take to arrive, and how long a
    /// client may take to drain an answer.
    pub read: std::time::Duration,
}

/// Receives a raw request body piece by piece, in constant memory whatever its size.
pub trait BodySink {
    /// Takes one piece and returns the buffer for reuse. An `Err` is the answer to send;
    /// the rest of the body is not read and the connection closes.
    fn write(&mut self, piece: Vec<u8>) -> LocalFuture<'_, Result<Vec<u8>, Response>>;
    /// The body arrived whole: commit it and produce the answer.
    fn finish(self: Box<Self>) -> LocalFuture<'static, Response>;
    /// The body did not arrive whole (client gone, too large, malformed): undo.
    fn abort(self: Box<Self>) -> LocalFuture<'static, ()>;
    /// The most bytes one piece should carry: what the sink holds per body on top of
    /// its own buffers.
    fn piece_size(&self) -> usize {
        STREAM_CHUNK
    }
}

/// Takes over a connection after an upgrade: the socket and the bytes already read
/// past the head.
pub type Upgrade = Box<dyn FnOnce(TcpStream, Vec<u8>) -> LocalFuture<'static, ()>>;

/// What the service wants done with a request once it has seen the head.
pub enum Plan<C> {
    /// Answer now. A body that was sent is discarded (bounded), or the connection closes.
    Answer(Response),
    /// Read the body whole, up to `limit` bytes (413 beyond), then call
    /// [`Service::respond`] with it. `100 Continue` is sent only for this plan and
    /// `Stream`, i.e. only after the service accepted the request.
    Read {
        limit: u64,
        call: C,
        /// While the service responds, watch the socket: a peer that hangs up ends the
        /// request (the response future is dropped, so what it runs stops). For work
        /// that holds a shared resource or is pointless without its caller.
        watch_peer: bool,
    },
    /// Stream the body into `sink`, up to `limit` bytes; the sink's answer is sent.
    Stream { limit: u64, sink: Box<dyn BodySink> },
    /// Hand the connection over (after writing nothing): the PTY WebSocket.
    Upgrade(Upgrade),
}

/// An application served by the engine: one value per listener per worker.
pub trait Service: 'static {
    /// What [`Service::plan`] hands to [`Service::respond`] for a body it asked to read.
    type Call;
    /// Held while a request is in flight (for graceful shutdown's count).
    type InFlight;

    fn timeouts(&self) -> Timeouts;
    /// Whether the server is shutting down: finish the request in hand, keep no
    /// connection alive, accept no more.
    fn draining(&self) -> bool;
    fn request_started(&self) -> Self::InFlight;
    /// Resolves when this worker starts draining: open streams without a length end then
    /// instead of waiting for their next piece.
    fn drained(&self) -> impl Future<Output = ()>;
    /// The last piece a stream without a length sends when the server drains (a final
    /// server-sent event that says the server is stopping).
    fn farewell(&self) -> Option<Vec<u8>>;
    /// Decides from the head alone.
    fn plan(&self, head: &RequestHead) -> impl Future<Output = Plan<Self::Call>>;
    /// Answers a request whose body was read whole.
    fn respond(
        &self,
        call: Self::Call,
        head: RequestHead,
        body: Vec<u8>,
    ) -> impl Future<Output = Response>;
    /// Words a refusal of the engine's own in the service's error envelope; `head` is the
    /// request it refuses when one was read, so the envelope can be its route's.
    fn refuse(&self, error: ProtocolError, head: Option<&RequestHead>) -> Response;
    /// The answer for a connection accepted only to be turned away because the process
    /// has no descriptor left to serve it (a full body; the connection closes after it).
    fn unavailable(&self) -> Response;
}
