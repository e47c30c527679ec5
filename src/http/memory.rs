//! One request served from memory, without a socket: what a connection does for a
//! request (`conn`), done on bytes the caller hands over. The head is written out and
//! parsed by [`head::parse`], so the same framing rules hold (Host on HTTP/1.1, digits-
//! only Content-Length, no Content-Length beside Transfer-Encoding, the head size limit);
//! the service's plan is carried out on the body given (read whole up to the plan's
//! limit, or streamed into the plan's sink in the sink's pieces); refusals are the
//! service's own (`Service::refuse`). The answer comes back unserialised, its body whole
//! or as the stream it is, to collect or to take piece by piece.
//!
//! What a socket adds and memory has not: no `100 Continue`, no timeouts, no peer that
//! hangs up (dropping the future or the [`Answer`] is the hang-up), and no upgrade.

use std::io;

use super::chunked::{ChunkedDecoder, ChunkedError};
use super::head::{self, ProtocolError, RequestHead};
use super::response::{Body, Response};
use super::service::{BodySink, Plan, Service, STREAM_CHUNK};

/// A request as a client would send it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// Path and query, as sent (percent-encoded).
    pub target: String,
    /// In the order sent. `Host` is added when absent, and `Content-Length` when the body
    /// is not empty and no header names the framing.
    pub headers: Vec<(String, String)>,
    /// The bytes after the head: the body, chunk-encoded if a `Transfer-Encoding:
    /// chunked` header says so.
    pub body: Vec<u8>,
}

impl Request {
    pub fn new(method: &str, target: &str) -> Request {
        Request {
            method: method.to_string(),
            target: target.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    fn names(&self, name: &str) -> bool {
        self.headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name))
    }

    /// The head's bytes, as a client writes them.
    fn head_bytes(&self) -> io::Result<Vec<u8>> {
        let line_break = |text: &str| text.contains(['\r', '\n']);
        if line_break(&self.method)
            || line_break(&self.target)
            || self
                .headers
                .iter()
                .any(|(n, v)| line_break(n) || line_break(v))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a line break in the method, target or a header would split the request",
            ));
        }
        let mut raw = format!("{} {} HTTP/1.1\r\n", self.method, self.target);
        if !self.names("host") {
            raw.push_str("Host: in-process\r\n");
        }
        for (name, value) in &self.headers {
            raw.push_str(name);
            raw.push_str(": ");
            raw.push_str(value);
            raw.push_str("\r\n");
        }
        let framed = self.names("content-length") || self.names("transfer-encoding");
        if !self.body.is_empty() && !framed {
            raw.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        raw.push_str("\r\n");
        Ok(raw.into_bytes())
    }
}

/// What the service answered.
pub struct Answer {
    pub status: u16,
    /// Names in lower case: `content-type` first (unless the response names none), then
    /// the response's own headers in order. The engine's framing headers (Content-Length,
    /// Transfer-Encoding, Connection, Date, Server) are not here; [`Answer::length`]
    /// tells the body's size when it is known.
    pub headers: Vec<(String, String)>,
    /// Whether a connection would close after this answer.
    pub close: bool,
    body: Body,
    /// The body's announced length (a full body's, or a sized stream's).
    length: Option<u64>,
    /// Bytes handed out so far, and whether the body has ended.
    taken: u64,
    ended: bool,
    /// Held while the answer lives, as a connection holds it while it writes one.
    _in_flight: Box<dyn std::any::Any>,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("close", &self.close)
            .field("length", &self.length)
            .field("streamed", &self.is_streamed())
            .finish()
    }
}

impl Answer {
    fn new(
        response: Response,
        keep_alive: bool,
        bodiless: bool,
        in_flight: Box<dyn std::any::Any>,
    ) -> Answer {
        let mut headers = Vec::with_capacity(response.headers.len() + 1);
        if !response.content_type.is_empty() {
            headers.push((
                "content-type".to_string(),
                response.content_type.to_string(),
            ));
        }
        for (name, value) in response.headers {
            headers.push((name.to_ascii_lowercase(), value));
        }
        // 204 and 304 carry no body on the wire, whatever the response held.
        let body = match response.body {
            _ if bodiless || matches!(response.status, 204 | 304) => Body::Full(Vec::new()),
            body => body,
        };
        let length = match &body {
            Body::Full(bytes) => Some(bytes.len() as u64),
            Body::Stream(stream) => stream.length(),
        };
        Answer {
            status: response.status,
            headers,
            close: response.close || !keep_alive,
            body,
            length,
            taken: 0,
            ended: false,
            _in_flight: in_flight,
        }
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether the body is produced piece by piece (a file region, server-sent events).
    pub fn is_streamed(&self) -> bool {
        matches!(self.body, Body::Stream(_))
    }

    /// The body's size when known before its first byte (a socket sends it as
    /// `Content-Length`); `None` for a stream without one, such as server-sent events.
    pub fn length(&self) -> Option<u64> {
        self.length
    }

    /// The next piece of the body, `Ok(None)` at its end. A stream that breaks its
    /// announced length is an error (a socket would close the connection). For a stream
    /// without a length (server-sent events) this waits for the next event.
    pub async fn next(&mut self) -> io::Result<Option<Vec<u8>>> {
        if self.ended {
            return Ok(None);
        }
        let stream = match &mut self.body {
            Body::Full(bytes) => {
                self.ended = true;
                let bytes = std::mem::take(bytes);
                return Ok((!bytes.is_empty()).then_some(bytes));
            }
            Body::Stream(stream) => stream,
        };
        if self.length == Some(0) {
            self.ended = true;
            return Ok(None);
        }
        loop {
            let piece = match stream.ready() {
                Some(piece) => Some(piece),
                None => stream.next(Vec::with_capacity(STREAM_CHUNK)).await?,
            };
            let broken = || {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the body stream broke its announced length",
                )
            };
            match (piece, self.length) {
                (Some(piece), Some(length)) => {
                    if piece.is_empty() || self.taken + piece.len() as u64 > length {
                        self.ended = true;
                        return Err(broken());
                    }
                    self.taken += piece.len() as u64;
                    self.ended = self.taken == length;
                    return Ok(Some(piece));
                }
                // An empty piece of a stream without a length is no chunk on the wire.
                (Some(piece), None) if piece.is_empty() => continue,
                (Some(piece), None) => {
                    self.taken += piece.len() as u64;
                    return Ok(Some(piece));
                }
                (None, length) => {
                    self.ended = true;
                    return match length {
                        Some(_) => Err(broken()),
                        None => Ok(None),
                    };
                }
            }
        }
    }

    /// The whole body, at most `limit` bytes (more is an error: too big to hand on). A
    /// stream without a length is read to its end, so an endless one (a watch) never
    /// finishes: take such a body with [`Answer::next`].
    pub async fn body(mut self, limit: usize) -> io::Result<Vec<u8>> {
        let too_big = || io::Error::other(format!("the answer is larger than {limit} bytes"));
        let length = self.length();
        if length.is_some_and(|n| n > limit as u64) {
            return Err(too_big());
        }
        let mut body = Vec::with_capacity(length.unwrap_or(0) as usize);
        while let Some(piece) = self.next().await? {
            if body.len() + piece.len() > limit {
                return Err(too_big());
            }
            if body.is_empty() {
                body = piece;
            } else {
                body.extend_from_slice(&piece);
            }
        }
        Ok(body)
    }
}

/// Serves `request` with `service` as a connection would serve it. `Err` where a
/// connection would end without an answer: the body is shorter than its framing says,
/// bytes follow it (on a socket, the next request), or the service takes the
/// connection over (an upgrade needs a socket).
pub async fn serve<S: Service>(service: &S, request: Request) -> io::Result<Answer>
where
    S::InFlight: 'static,
{
    let raw = request.head_bytes()?;
    let head = match head::parse(&raw) {
        Ok(Some((head, _))) => head,
        Ok(None) => unreachable!("a head written whole parses whole"),
        Err(error) => {
            let answer = service.refuse(error, None).closing();
            return Ok(Answer::new(answer, false, false, Box::new(())));
        }
    };
    // Counted from its head on, as a connection counts a request.
    let in_flight = Box::new(service.request_started());
    let bodiless = head.method == "HEAD";
    let keep_alive = head.keep_alive;
    let response = match service.plan(&head).await {
        // A body sent anyway is discarded: nothing reads it.
        Plan::Answer(response) => response,
        Plan::Read { limit, call, .. } => {
            if head.content_length.is_some_and(|n| n > limit) {
                // Refused from the header alone, as a connection refuses it.
                service
                    .refuse(ProtocolError::body_too_large(limit), Some(&head))
                    .closing()
            } else {
                match whole_body(&head, request.body, limit)? {
                    Ok(body) => service.respond(call, head, body).await,
                    Err(error) => service.refuse(error, Some(&head)).closing(),
                }
            }
        }
        Plan::Stream { limit, sink } => {
            stream_body(service, &head, request.body, limit, sink).await?
        }
        Plan::Upgrade(_) => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the service takes the connection over (an upgrade), which needs a socket",
            ))
        }
    };
    let keep_alive = keep_alive && !service.draining();
    Ok(Answer::new(response, keep_alive, bodiless, in_flight))
}

/// The body as its framing delimits it, decoded; the inner `Err` is a refusal (a
/// malformed chunked body, one over `limit`).
fn whole_body(
    head: &RequestHead,
    bytes: Vec<u8>,
    limit: u64,
) -> io::Result<Result<Vec<u8>, ProtocolError>> {
    if !head.chunked {
        let len = head.content_length.unwrap_or(0);
        return match (bytes.len() as u64).cmp(&len) {
            std::cmp::Ordering::Equal => Ok(Ok(bytes)),
            std::cmp::Ordering::Less => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the body has {} of its {len} bytes", bytes.len()),
            )),
            std::cmp::Ordering::Greater => Err(past_the_body()),
        };
    }
    // A chunk announced beyond what the body may hold is the body's size refused.
    let mut decoder = ChunkedDecoder::new(limit.saturating_add(1));
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let decoded = match decoder.decode(&bytes[at..], STREAM_CHUNK) {
            Ok(decoded) => decoded,
            Err(ChunkedError::ChunkTooLarge) => {
                return Ok(Err(ProtocolError::body_too_large(limit)))
            }
            Err(e) => return Ok(Err(ProtocolError::bad_request(e.message()))),
        };
        body.extend_from_slice(&bytes[at + decoded.data.start..at + decoded.data.end]);
        if body.len() as u64 > limit {
            return Ok(Err(ProtocolError::body_too_large(limit)));
        }
        at += decoded.consumed;
        if decoded.done {
            return match at == bytes.len() {
                true => Ok(Ok(body)),
                false => Err(past_the_body()),
            };
        }
        if decoded.consumed == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the chunked body ends before its last chunk",
            ));
        }
    }
}

fn past_the_body() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "bytes follow the body its framing delimits (on a socket, the next request)",
    )
}

/// Streams the body into `sink` in the sink's pieces; the sink's answer, or the
/// refusal (after which the sink is aborted).
async fn stream_body<S: Service>(
    service: &S,
    head: &RequestHead,
    bytes: Vec<u8>,
    limit: u64,
    mut sink: Box<dyn BodySink>,
) -> io::Result<Response> {
    let too_large = || {
        service
            .refuse(ProtocolError::body_too_large(limit), Some(head))
            .closing()
    };
    if head.content_length.is_some_and(|n| n > limit) {
        sink.abort().await;
        return Ok(too_large());
    }
    let body = match whole_body(head, bytes, limit) {
        Ok(Ok(body)) => body,
        Ok(Err(error)) => {
            sink.abort().await;
            return Ok(service.refuse(error, Some(head)).closing());
        }
        Err(e) => {
            sink.abort().await;
            return Err(e);
        }
    };
    let chunk = sink.piece_size().clamp(1, STREAM_CHUNK);
    let mut spare = Vec::with_capacity(chunk);
    for piece in body.chunks(chunk) {
        spare.clear();
        spare.extend_from_slice(piece);
        spare = match sink.write(spare).await {
            Ok(buffer) => buffer,
            Err(answer) => {
                sink.abort().await;
                return Ok(answer.closing());
            }
        };
    }
    Ok(sink.finish().await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::service::Timeouts;
    use crate::http::{BodyStream, LocalFuture};

    /// Echoes the body (read whole up to 8 bytes); `/stream` streams it into a sink;
    /// `/broken` announces 4 bytes and sends 2; `/ws` upgrades.
    struct Echo;

    struct Collect(Vec<u8>);

    impl BodySink for Collect {
        fn write(&mut self, piece: Vec<u8>) -> LocalFuture<'_, Result<Vec<u8>, Response>> {
            self.0.push(piece.len() as u8);
            Box::pin(async move { Ok(piece) })
        }
        fn finish(self: Box<Self>) -> LocalFuture<'static, Response> {
            Box::pin(async move { Response::raw(200, "text/plain", self.0) })
        }
        fn abort(self: Box<Self>) -> LocalFuture<'static, ()> {
            Box::pin(async {})
        }
        fn piece_size(&self) -> usize {
            3
        }
    }

    struct Short(bool);

    impl BodyStream for Short {
        fn length(&self) -> Option<u64> {
            Some(4)
        }
        fn next(&mut self, _: Vec<u8>) -> LocalFuture<'_, io::Result<Option<Vec<u8>>>> {
            let first = !std::mem::replace(&mut self.0, true);
            Box::pin(async move { Ok(first.then(|| b"ab".to_vec())) })
        }
    }

    impl Service for Echo {
        type Call = ();
        type InFlight = ();
        fn timeouts(&self) -> Timeouts {
            let second = std::time::Duration::from_secs(1);
            Timeouts {
                idle: second,
                read: second,
            }
        }
        fn draining(&self) -> bool {
            false
        }
        fn request_started(&self) {}
        async fn drained(&self) {}
        fn farewell(&self) -> Option<Vec<u8>> {
            None
        }
        async fn plan(&self, head: &RequestHead) -> Plan<()> {
            match head.target.as_str() {
                "/stream" => Plan::Stream {
                    limit: 8,
                    sink: Box::new(Collect(Vec::new())),
                },
                "/broken" => {
                    Plan::Answer(Response::stream(200, "text/plain", Box::new(Short(false))))
                }
                "/ws" => Plan::Upgrade(Box::new(|_, _| Box::pin(async {}))),
                _ => Plan::Read {
                    limit: 8,
                    call: (),
                    watch_peer: false,
                },
            }
        }
        async fn respond(&self, _: (), _: RequestHead, body: Vec<u8>) -> Response {
            Response::raw(200, "text/plain", body)
        }
        fn refuse(&self, error: ProtocolError, _: Option<&RequestHead>) -> Response {
            Response::raw(error.status, "text/plain", error.message.into_bytes())
        }
        fn unavailable(&self) -> Response {
            Response::raw(503, "text/plain", Vec::new())
        }
    }

    async fn body_of(request: Request) -> (u16, Vec<u8>) {
        let answer = serve(&Echo, request).await.unwrap();
        (answer.status, answer.body(64).await.unwrap())
    }

    #[test]
    fn bodies_are_framed_as_on_a_socket() {
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .build()
            .unwrap();
        runtime.block_on(async {
            let post = |target: &str| Request::new("POST", target);
            assert_eq!(body_of(post("/").body("hi")).await, (200, b"hi".to_vec()));
            // Chunked bodies are decoded, and held to the limit as they are.
            let chunked = post("/").header("Transfer-Encoding", "chunked");
            let two = chunked.clone().body("2\r\nhi\r\n1\r\n!\r\n0\r\n\r\n");
            assert_eq!(body_of(two).await, (200, b"hi!".to_vec()));
            let nine = chunked.clone().body("9\r\n123456789\r\n0\r\n\r\n");
            assert_eq!(body_of(nine).await.0, 413);
            assert_eq!(body_of(chunked.body("zz\r\n")).await.0, 400);
            assert_eq!(body_of(post("/").body("123456789")).await.0, 413);
            // A sink gets the body in its own pieces.
            let pieces = body_of(post("/stream").body("1234567")).await;
            assert_eq!(pieces, (200, vec![3, 3, 1]));
            assert_eq!(body_of(post("/stream").body("123456789")).await.0, 413);
            // What a connection would end without an answer is an error.
            let short = post("/").header("Content-Length", "5").body("hi");
            let error = serve(&Echo, short).await.unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
            let long = post("/").header("Content-Length", "1").body("hi");
            assert!(serve(&Echo, long).await.is_err());
            assert!(serve(&Echo, Request::new("GET", "/ws")).await.is_err());
            let split = Request::new("GET", "/").header("X-A", "1\r\nX-B: 2");
            assert!(serve(&Echo, split).await.is_err());
            // A stream that breaks its announced length is an error too.
            let broken = serve(&Echo, Request::new("GET", "/broken")).await.unwrap();
            assert_eq!(broken.length(), Some(4));
            assert!(broken.body(64).await.is_err());
        });
    }
}
