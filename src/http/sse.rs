//! Server-sent events: the contract's framing (`event: <name>\ndata: <json>\n\n`) and a
//! bounded channel from whatever produces events to the connection that writes them.
//! The channel is thread-safe so producers on the blocking pool can feed it too; a full
//! channel makes the producer wait, so a slow client cannot make the server buffer
//! without bound.

use std::future::poll_fn;
use std::pin::Pin;

use futures_channel::{mpsc, oneshot};
use futures_core::Stream;
use serde::Serialize;

use super::response::{BodyStream, LocalFuture, Response, SSE_CONTENT_TYPE};

/// A `text/event-stream` response fed by `events`. Not a method of `Response`: an impl
/// counts as part of its type's module, so `response` would depend on this module, which
/// depends on `response`.
pub fn response(events: SseStream) -> Response {
    Response::stream(200, SSE_CONTENT_TYPE, Box::new(events)).header("Cache-Control", "no-cache")
}

/// Frames one event exactly as the contract shows it.
pub fn format_event<T: Serialize + ?Sized>(name: &str, data: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"event: ");
    // Event names are ours or a custom route's; a newline would end the field early.
    out.extend(name.bytes().filter(|b| *b != b'\n' && *b != b'\r'));
    out.extend_from_slice(b"\ndata: ");
    if serde_json::to_writer(&mut out, data).is_err() {
        out.extend_from_slice(b"null");
    }
    out.extend_from_slice(b"\n\n");
    out
}

/// The receiving half, owned by the response.
pub struct SseStream {
    rx: mpsc::Receiver<Vec<u8>>,
    /// Dropped with the stream (the connection ended), which resolves
    /// [`SseSender::closed`]; nothing is ever sent on it.
    _alive: oneshot::Sender<()>,
}

/// The producing half. Dropping it ends the stream.
pub struct SseSender {
    tx: mpsc::Sender<Vec<u8>>,
    /// Resolves when the stream is dropped; only the sender [`channel`] returned holds it.
    gone: Option<oneshot::Receiver<()>>,
}

impl Clone for SseSender {
    /// A clone can send but does not get [`SseSender::closed`] notices.
    fn clone(&self) -> SseSender {
        SseSender {
            tx: self.tx.clone(),
            gone: None,
        }
    }
}

/// The client went away; stop producing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamClosed;

/// A stream with room for `capacity` events in flight.
pub fn channel(capacity: usize) -> (SseSender, SseStream) {
    let (tx, rx) = mpsc::channel(capacity);
    let (alive, gone) = oneshot::channel();
    (
        SseSender {
            tx,
            gone: Some(gone),
        },
        SseStream { rx, _alive: alive },
    )
}

impl SseSender {
    /// Sends one framed event, waiting while the client is behind.
    pub async fn send<T: Serialize + ?Sized>(
        &mut self,
        name: &str,
        data: &T,
    ) -> Result<(), StreamClosed> {
        self.send_raw(format_event(name, data)).await
    }

    /// Sends bytes already framed as one or more events.
    pub async fn send_raw(&mut self, framed: Vec<u8>) -> Result<(), StreamClosed> {
        poll_fn(|cx| self.tx.poll_ready(cx))
            .await
            .map_err(|_| StreamClosed)?;
        self.tx.start_send(framed).map_err(|_| StreamClosed)
    }

    /// Whether the connection has stopped listening.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves once the connection has stopped listening (the client went away or the
    /// server is draining), so a producer waiting on something else can stop at once.
    /// On a clone it never resolves.
    pub async fn closed(&mut self) {
        match self.gone.as_mut() {
            Some(gone) => {
                let _ = gone.await;
                // Polling a finished oneshot again is not allowed; later calls return now.
                self.gone = None;
                self.tx.close_channel();
            }
            None if self.tx.is_closed() => {}
            None => std::future::pending().await,
        }
    }
}

impl BodyStream for SseStream {
    /// Events have no length known in advance: the stream is chunked and each event is
    /// flushed as it arrives.
    fn length(&self) -> Option<u64> {
        None
    }

    /// The next framed event, or `None` once every sender is gone.
    fn next(&mut self, _buf: Vec<u8>) -> LocalFuture<'_, std::io::Result<Option<Vec<u8>>>> {
        Box::pin(async move { Ok(poll_fn(|cx| Pin::new(&mut self.rx).poll_next(cx)).await) })
    }

    fn ready(&mut self) -> Option<Vec<u8>> {
        self.rx.try_recv().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_matches_the_contract() {
        let event = format_event("line", &serde_json::json!({"line": "hi"}));
        assert_eq!(event, b"event: line\ndata: {\"line\":\"hi\"}\n\n");
    }
}
