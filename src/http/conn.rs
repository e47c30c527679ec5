//! One HTTP/1.1 connection: read heads with httparse, apply the contract's common rules,
//! dispatch through the route table, write answers. Keep-alive and pipelining are served
//! in order; responses to pipelined requests are gathered and leave in one write.

use std::any::Any;
use std::future::Future;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use super::request::{split_target, validate_json_object, Request};
use super::response::{write_chunk, write_head, Body, BodySink, FileBody, Framing, Response};
use crate::config::MAX_JSON_BODY;
use crate::error::ApiError;
use crate::routes::Method;
use crate::runtime::WorkerContext;
use crate::timefmt::with_http_date;

/// Largest request head (request line plus headers) we buffer before answering 431.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header lines in one request (Python's http.server allows 100).
pub const MAX_HEADERS: usize = 100;
/// Bodies up to this size are copied behind the head so both leave in one `send`.
const COALESCE_BODY_BYTES: usize = 16 * 1024;
/// Pending pipelined output is flushed once it reaches this size.
const MAX_PENDING_OUTPUT: usize = 64 * 1024;
const READ_CHUNK: usize = 16 * 1024;

/// The parts of a request head we keep after the read buffer moves on.
struct Head {
    method: String,
    target: String,
    http10: bool,
    headers: Vec<(String, String)>,
    content_length: Option<u64>,
    chunked: bool,
    expect_continue: bool,
    keep_alive: bool,
}

/// Why a connection stops.
enum Stop {
    /// Peer closed, timed out, or the socket failed: nothing more to say.
    Quiet,
}

struct Connection {
    stream: TcpStream,
    /// Received bytes; `buf[pos..]` is not consumed yet.
    buf: Vec<u8>,
    pos: usize,
    /// Responses waiting to be written.
    out: Vec<u8>,
    /// Whether the request being answered spoke HTTP/1.0.
    http10: bool,
    /// Whether it was a HEAD request, whose answer carries no body.
    head_request: bool,
    /// The last answer refused a request whose bytes may still be arriving.
    linger_on_close: bool,
    ctx: Rc<WorkerContext>,
}

/// Serves `stream` until the peer closes, a timeout fires, or the server shuts down.
pub async fn serve(stream: TcpStream, ctx: Rc<WorkerContext>) {
    // monoio does not catch panics in tasks: one would take the worker thread, and every
    // connection on it, down. Handlers have their own guard (a 500); this one covers the
    // engine itself, closing just this connection.
    if let Err(panic) = CatchPanic(Box::pin(serve_connection(stream, ctx))).await {
        eprintln!(
            "agent-sandbox: connection task panicked: {}",
            panic_message(&*panic)
        );
    }
}

async fn serve_connection(stream: TcpStream, ctx: Rc<WorkerContext>) {
    let mut conn = Connection {
        stream,
        buf: Vec::with_capacity(READ_CHUNK),
        pos: 0,
        out: Vec::with_capacity(READ_CHUNK),
        http10: false,
        head_request: false,
        linger_on_close: false,
        ctx,
    };
    let _ = conn.run().await;
    if conn.flush().await.is_ok() && conn.linger_on_close {
        conn.linger().await;
    }
}

/// How long and how much a closing connection drains after an error answer.
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 16 * 1024 * 1024;

enum Deadline {
    Met,
    Missed,
}

/// Runs an I/O future with a deadline. When it passes, the socket is shut down, which
/// completes the pending operation under both drivers (an in-flight io_uring op would
/// otherwise keep the socket open after we drop it), and the operation's buffer is
/// returned as usual.
async fn with_deadline<F: Future>(fd: RawFd, timeout: Duration, io: F) -> (Deadline, F::Output) {
    let mut io = std::pin::pin!(io);
    monoio::select! {
        output = &mut io => return (Deadline::Met, output),
        _ = monoio::time::sleep(timeout) => {}
    }
    let _ = rustix::net::shutdown(borrow(fd), rustix::net::Shutdown::Both);
    (Deadline::Missed, io.await)
}

fn borrow(fd: RawFd) -> BorrowedFd<'static> {
    // The connection owns the socket for as long as any of its futures run.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

impl Connection {
    async fn run(&mut self) -> Result<(), Stop> {
        loop {
            let head = match self.read_head().await? {
                Ok(Some(head)) => head,
                Ok(None) => return Ok(()),
                Err(error) => {
                    self.queue_response(error.closing().into_response(), false)
                        .await?;
                    return Ok(());
                }
            };
            let ctx = self.ctx.clone();
            let _in_flight = ctx.shutdown.request_started();
            self.http10 = head.http10;
            self.head_request = head.method == "HEAD";
            let (response, keep_alive) = self.handle(head).await?;
            let keep_alive = keep_alive && !self.ctx.shutdown.is_shutting_down();
            if !self.queue_response(response, keep_alive).await? {
                return Ok(());
            }
        }
    }

    /// Reads one request head. `Ok(None)` is a clean close between requests; `Err` inside
    /// is a malformed head to answer and close.
    async fn read_head(&mut self) -> Result<Result<Option<Head>, ApiError>, Stop> {
        let mut head_started: Option<std::time::Instant> = None;
        loop {
            if self.pos < self.buf.len() {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut parsed = httparse::Request::new(&mut headers);
                match parsed.parse(&self.buf[self.pos..]) {
                    Ok(httparse::Status::Complete(len)) => {
                        if len > MAX_HEAD_BYTES {
                            return Ok(Err(head_too_large()));
                        }
                        let head = extract_head(&parsed);
                        self.pos += len;
                        return Ok(head.map(Some));
                    }
                    Ok(httparse::Status::Partial) => {
                        if self.buf.len() - self.pos > MAX_HEAD_BYTES {
                            return Ok(Err(head_too_large()));
                        }
                    }
                    Err(httparse::Error::TooManyHeaders) => return Ok(Err(head_too_large())),
                    Err(e) => {
                        return Ok(Err(ApiError::bad_request(format!(
                            "Malformed request: {e}"
                        ))))
                    }
                }
            }
            // Answers to earlier pipelined requests go out before we wait for more input.
            self.flush().await?;
            if self.ctx.shutdown.is_shutting_down() && self.pos == self.buf.len() {
                return Ok(Ok(None));
            }
            // Once a head has started, the whole of it must arrive within read_timeout,
            // however slowly the bytes trickle in.
            let timeout = if self.pos < self.buf.len() {
                let started = *head_started.get_or_insert_with(std::time::Instant::now);
                let left = self
                    .ctx
                    .state
                    .config
                    .read_timeout
                    .saturating_sub(started.elapsed());
                if left.is_zero() {
                    return Err(Stop::Quiet);
                }
                left
            } else {
                self.ctx.state.config.idle_timeout
            };
            if self.fill(timeout).await? == 0 {
                return Ok(Ok(None));
            }
        }
    }

    /// Reads more bytes into the buffer; 0 means the peer closed.
    async fn fill(&mut self, timeout: Duration) -> Result<usize, Stop> {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 0 && self.buf.capacity() - self.buf.len() < READ_CHUNK {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.reserve(READ_CHUNK);
        // monoio reads into a Vec from its start; a slice over the spare capacity appends.
        let filled = self.buf.len();
        let capacity = self.buf.capacity();
        let spare = std::mem::take(&mut self.buf).slice_mut(filled..capacity);
        let fd = self.stream.as_raw_fd();
        let read = self.stream.read(spare);
        let (outcome, (result, spare)) = with_deadline(fd, timeout, read).await;
        self.buf = spare.into_inner();
        match (outcome, result) {
            (Deadline::Met, Ok(n)) => Ok(n),
            _ => Err(Stop::Quiet),
        }
    }

    /// Writes everything queued.
    async fn flush(&mut self) -> Result<(), Stop> {
        if self.out.is_empty() {
            return Ok(());
        }
        let out = std::mem::take(&mut self.out);
        let (result, mut out) = self.write(out).await;
        out.clear();
        self.out = out;
        result
    }

    /// Writes all of `data`, giving a client that stops reading `read_timeout` to drain
    /// it before the connection is torn down.
    async fn write(&mut self, data: Vec<u8>) -> (Result<(), Stop>, Vec<u8>) {
        let fd = self.stream.as_raw_fd();
        let timeout = self.ctx.state.config.read_timeout;
        let write = self.stream.write_all(data);
        let (outcome, (result, data)) = with_deadline(fd, timeout, write).await;
        match (outcome, result) {
            (Deadline::Met, Ok(_)) => (Ok(()), data),
            _ => (Err(Stop::Quiet), data),
        }
    }

    /// Closes after an error answer without losing it: unread request bytes in our receive
    /// queue would make the kernel send RST, which can destroy the answer in flight. So
    /// send FIN first, then swallow what the client still sends, for a bounded time.
    async fn linger(&mut self) {
        let fd = self.stream.as_raw_fd();
        let _ = rustix::net::shutdown(borrow(fd), rustix::net::Shutdown::Write);
        let deadline = std::time::Instant::now() + LINGER_TIME;
        let mut drained = 0usize;
        let mut sink = std::mem::take(&mut self.buf);
        while drained < LINGER_BYTES {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            sink.clear();
            sink.reserve(READ_CHUNK);
            let (outcome, (result, back)) = with_deadline(fd, left, self.stream.read(sink)).await;
            sink = back;
            match (outcome, result) {
                (Deadline::Met, Ok(n)) if n > 0 => drained += n,
                _ => break,
            }
        }
    }

    /// Applies the common rules, reads the body and runs the handler. Returns the response
    /// and whether the connection may stay open.
    async fn handle(&mut self, mut head: Head) -> Result<(Response, bool), Stop> {
        let state = self.ctx.state.clone();
        let keep_alive = head.keep_alive;
        let has_body = head.chunked || head.content_length.is_some_and(|n| n > 0);

        let Some(method) = Method::from_http(&head.method) else {
            let error = ApiError::new(
                405,
                "ValueError",
                format!(
                    "Method {} is not allowed; use GET, POST or DELETE",
                    head.method
                ),
            )
            .with_header("Allow", "GET, POST, DELETE")
            .closing();
            return Ok((self.refuse(error, has_body, &head).await?, false));
        };
        if !head.target.starts_with('/') {
            return Ok((
                ApiError::bad_request("Request target must be a path starting with /")
                    .closing()
                    .into_response(),
                false,
            ));
        }
        let (path, query) = match split_target(&head.target) {
            Ok(parts) => (parts.0, Ok(parts.1)),
            Err(e) => {
                let (path, _) = head.target.split_once('?').unwrap_or((&head.target, ""));
                (path.trim_end_matches('/').to_string(), Err(e))
            }
        };
        let Some(found) = state.router.lookup(method, &path) else {
            let error = ApiError::not_found_path(if path.is_empty() { "/" } else { &path });
            return Ok((self.refuse(error, has_body, &head).await?, keep_alive));
        };
        let endpoint = &state.endpoints[found.index];
        let raw = endpoint.raw_body
            && method == Method::Post
            && head.headers.iter().any(|(n, v)| {
                n == "content-type"
                    && v.split(';')
                        .next()
                        .unwrap_or("")
                        .trim()
                        .eq_ignore_ascii_case("application/octet-stream")
            });
        let body_limit = if raw {
            state.config.max_upload_size
        } else {
            MAX_JSON_BODY as u64
        };
        if head.content_length.is_some_and(|n| n > body_limit) {
            // Refused from the header alone: the body is never read, so the connection
            // cannot be reused.
            return Ok((
                ApiError::payload_too_large(body_limit)
                    .closing()
                    .into_response(),
                false,
            ));
        }
        let identity = match state
            .auth
            .authenticate(&head.headers, None, endpoint.auth_required)
        {
            Ok(identity) => identity,
            Err(error) => return Ok((self.refuse(error, has_body, &head).await?, keep_alive)),
        };
        let access = state.access(found.index, &identity);
        if !access.allowed {
            let status = if access.code == Some("endpoint_disabled") {
                404
            } else {
                403
            };
            let kind = if status == 404 {
                "ValueError"
            } else {
                "PermissionError"
            };
            let mut error = ApiError::new(status, kind, access.reason.clone().unwrap_or_default())
                .with_field("endpoint", endpoint.id.to_string());
            error.code = access.code;
            if status == 404 {
                error = error.with_field("rule", access.rule.unwrap_or_default().to_string());
            }
            return Ok((self.refuse(error, has_body, &head).await?, keep_alive));
        }
        let query = match query {
            Ok(query) => query,
            Err(error) => return Ok((self.refuse(error, has_body, &head).await?, keep_alive)),
        };

        let body = if raw {
            Vec::new()
        } else {
            if head.expect_continue && has_body {
                self.send_continue(head.http10).await?;
            }
            match self.read_body(&head, MAX_JSON_BODY).await? {
                Ok(body) => body,
                Err(error) => return Ok((error.closing().into_response(), false)),
            }
        };
        if matches!(method, Method::Post | Method::Delete) && !raw {
            if let Err(error) = validate_json_object(&body, !endpoint.parses_whole_body) {
                return Ok((error.into_response(), keep_alive));
            }
        }
        let handler = endpoint
            .handler
            .clone()
            .expect("router only indexes endpoints with handlers");
        let request = Request {
            method,
            path,
            query,
            headers: std::mem::take(&mut head.headers),
            body,
            raw_body: raw,
            path_params: found.params,
            identity,
            state: state.clone(),
            endpoint_id: endpoint.id.clone(),
        };
        let response = match CatchUnwind(None, Some((handler, request))).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => with_endpoint(error, &endpoint.id).into_response(),
            Err(panic) => {
                let message = panic_message(&*panic);
                eprintln!(
                    "agent-sandbox: handler for endpoint '{}' panicked: {message}",
                    endpoint.id
                );
                ApiError::internal(
                    "RuntimeError",
                    format!("Internal error in endpoint '{}': {message}", endpoint.id),
                )
                .into_response()
            }
        };
        let response = match response.body {
            Body::Sink(sink) if raw => self.stream_body_into(&head, body_limit, sink).await?,
            Body::Sink(sink) => {
                drop(sink);
                ApiError::internal(
                    "RuntimeError",
                    format!(
                        "Endpoint '{}' accepted a raw body it was not sent",
                        endpoint.id
                    ),
                )
                .into_response()
            }
            // A raw body the handler refused is still on the wire: answer and close.
            _ if raw && has_body => Response {
                close: true,
                ..response
            },
            _ => response,
        };
        let keep = keep_alive && !response.close;
        Ok((response, keep))
    }

    async fn send_continue(&mut self, http10: bool) -> Result<(), Stop> {
        self.out.extend_from_slice(if http10 {
            b"HTTP/1.0 100 Continue\r\n\r\n"
        } else {
            b"HTTP/1.1 100 Continue\r\n\r\n"
        });
        self.flush().await
    }

    /// Streams a raw request body into `sink` in chunks of at most `STREAM_CHUNK` bytes,
    /// so memory stays constant whatever the body size; the sink's answer is the response.
    async fn stream_body_into(
        &mut self,
        head: &Head,
        limit: u64,
        mut sink: Box<dyn BodySink>,
    ) -> Result<Response, Stop> {
        if head.expect_continue && (head.chunked || head.content_length.is_some_and(|n| n > 0)) {
            if let Err(stop) = self.send_continue(head.http10).await {
                sink.abort().await;
                return Err(stop);
            }
        }
        match self.pump_body(head, limit, &mut *sink).await {
            Ok(Ok(())) => Ok(match sink.finish().await {
                Ok(response) => response,
                Err(error) => error.into_response(),
            }),
            Ok(Err(error)) => {
                sink.abort().await;
                Ok(error.closing().into_response())
            }
            Err(stop) => {
                sink.abort().await;
                Err(stop)
            }
        }
    }

    async fn pump_body(
        &mut self,
        head: &Head,
        limit: u64,
        sink: &mut dyn BodySink,
    ) -> Result<Result<(), ApiError>, Stop> {
        let timeout = self.ctx.state.config.read_timeout;
        let mut chunk: Vec<u8> = Vec::with_capacity(STREAM_CHUNK);
        if head.chunked {
            let mut state = ChunkState::default();
            let mut total = 0u64;
            loop {
                chunk.clear();
                // Never read further than one byte past the limit before refusing.
                let room = (limit + 1 - total).min(STREAM_CHUNK as u64) as usize;
                let more = match self
                    .next_chunked_piece(&mut state, &mut chunk, room, timeout)
                    .await?
                {
                    Ok(more) => more,
                    Err(error) => return Ok(Err(error)),
                };
                total += chunk.len() as u64;
                if total > limit {
                    return Ok(Err(ApiError::payload_too_large(limit)));
                }
                if !chunk.is_empty() {
                    chunk = match sink.write(chunk).await {
                        Ok(buf) => buf,
                        Err(error) => return Ok(Err(error)),
                    };
                }
                if !more {
                    return Ok(Ok(()));
                }
            }
        }
        let mut remaining = head.content_length.unwrap_or(0);
        while remaining > 0 {
            chunk.clear();
            let buffered = self.buf.len() - self.pos;
            if buffered > 0 {
                let take = buffered.min(remaining as usize).min(STREAM_CHUNK);
                chunk.extend_from_slice(&self.buf[self.pos..self.pos + take]);
                self.pos += take;
            } else {
                // Straight from the socket into the chunk: no copy through our buffer.
                let want = (remaining as usize).min(STREAM_CHUNK);
                if chunk.capacity() < want {
                    chunk.reserve(want);
                }
                let fd = self.stream.as_raw_fd();
                let read = self
                    .stream
                    .read(std::mem::take(&mut chunk).slice_mut(0..want));
                let (outcome, (result, back)) = with_deadline(fd, timeout, read).await;
                chunk = back.into_inner();
                match (outcome, result) {
                    (Deadline::Met, Ok(n)) if n > 0 => {}
                    _ => return Err(Stop::Quiet),
                }
            }
            remaining -= chunk.len() as u64;
            chunk = match sink.write(chunk).await {
                Ok(buf) => buf,
                Err(error) => return Ok(Err(error)),
            };
        }
        Ok(Ok(()))
    }

    /// Answers `error` for a request whose body we have not read. A small declared body is
    /// read and dropped so the connection stays usable; a client waiting for
    /// `100 Continue` never gets it and the connection closes instead.
    async fn refuse(
        &mut self,
        error: ApiError,
        has_body: bool,
        head: &Head,
    ) -> Result<Response, Stop> {
        if !has_body {
            return Ok(error.into_response());
        }
        if head.expect_continue {
            return Ok(error.closing().into_response());
        }
        match self.read_body(head, MAX_JSON_BODY).await? {
            Ok(_) => Ok(error.into_response()),
            Err(_) => Ok(error.closing().into_response()),
        }
    }

    /// Reads the body framed by Content-Length or chunked encoding, up to `limit` bytes.
    async fn read_body(
        &mut self,
        head: &Head,
        limit: usize,
    ) -> Result<Result<Vec<u8>, ApiError>, Stop> {
        let timeout = self.ctx.state.config.read_timeout;
        if head.chunked {
            let mut body = Vec::new();
            let mut state = ChunkState::default();
            loop {
                let room = limit + 1 - body.len();
                match self
                    .next_chunked_piece(&mut state, &mut body, room, timeout)
                    .await?
                {
                    Err(error) => return Ok(Err(error)),
                    Ok(_) if body.len() > limit => {
                        return Ok(Err(ApiError::payload_too_large(limit as u64)))
                    }
                    Ok(true) => {}
                    Ok(false) => return Ok(Ok(body)),
                }
            }
        }
        let len = head.content_length.unwrap_or(0) as usize;
        if len > limit {
            return Ok(Err(ApiError::payload_too_large(limit as u64)));
        }
        // Whatever already arrived is copied once; the rest is read straight into the
        // body, so the connection buffer never grows to the size of a large body (and
        // does not keep that memory for the connection's life).
        let buffered = (self.buf.len() - self.pos).min(len);
        let mut body = Vec::with_capacity(len);
        body.extend_from_slice(&self.buf[self.pos..self.pos + buffered]);
        self.pos += buffered;
        while body.len() < len {
            let filled = body.len();
            let fd = self.stream.as_raw_fd();
            let read = self.stream.read(body.slice_mut(filled..len));
            let (outcome, (result, back)) = with_deadline(fd, timeout, read).await;
            body = back.into_inner();
            match (outcome, result) {
                (Deadline::Met, Ok(n)) if n > 0 => {}
                _ => return Err(Stop::Quiet),
            }
        }
        Ok(Ok(body))
    }

    /// Appends up to `max` bytes of chunked body data to `out`. `Ok(false)` once the last
    /// chunk and the trailers are consumed.
    async fn next_chunked_piece(
        &mut self,
        state: &mut ChunkState,
        out: &mut Vec<u8>,
        max: usize,
        timeout: Duration,
    ) -> Result<Result<bool, ApiError>, Stop> {
        let start = out.len();
        loop {
            if state.done {
                return Ok(Ok(false));
            }
            if state.remaining == 0 {
                if state.need_crlf {
                    while self.buf.len() - self.pos < 2 {
                        if self.fill(timeout).await? == 0 {
                            return Err(Stop::Quiet);
                        }
                    }
                    if &self.buf[self.pos..self.pos + 2] != b"\r\n" {
                        return Ok(Err(ApiError::bad_request(
                            "Malformed chunked body: missing CRLF after chunk data",
                        )));
                    }
                    self.pos += 2;
                    state.need_crlf = false;
                }
                if out.len() - start >= max {
                    return Ok(Ok(true));
                }
                let line_end = match self.line_end(1024, timeout).await? {
                    Some(end) => end,
                    None => {
                        return Ok(Err(ApiError::bad_request(
                            "Malformed chunked body: chunk-size line too long",
                        )))
                    }
                };
                let line = &self.buf[self.pos..line_end];
                let size_text = line.split(|b| *b == b';').next().unwrap_or(b"");
                let size_text = size_text.trim_ascii_end();
                let size = (!size_text.is_empty()
                    && size_text.len() <= 15
                    && size_text.iter().all(u8::is_ascii_hexdigit))
                .then(|| std::str::from_utf8(size_text).ok())
                .flatten()
                .and_then(|s| usize::from_str_radix(s, 16).ok());
                let Some(size) = size else {
                    return Ok(Err(ApiError::bad_request(
                        "Malformed chunked body: bad chunk size",
                    )));
                };
                self.pos = line_end + 2;
                if size == 0 {
                    // Trailer fields, ended by an empty line; their content is ignored.
                    loop {
                        let end = match self.line_end(MAX_HEAD_BYTES, timeout).await? {
                            Some(end) => end,
                            None => return Ok(Err(head_too_large())),
                        };
                        let empty = end == self.pos;
                        self.pos = end + 2;
                        if empty {
                            state.done = true;
                            return Ok(Ok(false));
                        }
                    }
                }
                state.remaining = size;
            }
            let room = max - (out.len() - start);
            if room == 0 {
                return Ok(Ok(true));
            }
            if self.pos == self.buf.len() && self.fill(timeout).await? == 0 {
                return Err(Stop::Quiet);
            }
            let take = state.remaining.min(self.buf.len() - self.pos).min(room);
            out.extend_from_slice(&self.buf[self.pos..self.pos + take]);
            self.pos += take;
            state.remaining -= take;
            if state.remaining == 0 {
                state.need_crlf = true;
            }
        }
    }

    /// Index of the next CRLF at or after `pos`, reading more as needed; `None` when more
    /// than `max` bytes arrive without one.
    async fn line_end(&mut self, max: usize, timeout: Duration) -> Result<Option<usize>, Stop> {
        loop {
            if let Some(i) = find_crlf(&self.buf[self.pos..]) {
                return Ok(Some(self.pos + i));
            }
            if self.buf.len() - self.pos > max {
                return Ok(None);
            }
            if self.fill(timeout).await? == 0 {
                return Err(Stop::Quiet);
            }
        }
    }

    /// Queues `response`; streams are written to the end here. Returns whether the
    /// connection stays open.
    async fn queue_response(&mut self, response: Response, keep_alive: bool) -> Result<bool, Stop> {
        let http10 = self.http10;
        let keep_alive = keep_alive && !response.close;
        self.linger_on_close = !keep_alive && response.status >= 400;
        match response.body {
            Body::Full(ref body) => {
                let framing = if matches!(response.status, 204 | 304) {
                    Framing::NoBody
                } else {
                    Framing::Length(body.len())
                };
                with_http_date(|date| {
                    write_head(&mut self.out, &response, framing, keep_alive, http10, date)
                });
                let Body::Full(body) = response.body else {
                    unreachable!()
                };
                if framing == Framing::NoBody || self.head_request {
                    // No body on the wire: a HEAD answer only describes one.
                } else if body.len() <= COALESCE_BODY_BYTES {
                    self.out.extend_from_slice(&body);
                } else {
                    self.flush().await?;
                    self.write(body).await.0?;
                }
                let more_pipelined = self.pos < self.buf.len();
                if !keep_alive || !more_pipelined || self.out.len() >= MAX_PENDING_OUTPUT {
                    self.flush().await?;
                }
                Ok(keep_alive)
            }
            Body::Sink(_) => {
                // Only raw-body endpoints may answer with a sink, and handle() resolved it.
                let error =
                    ApiError::internal("RuntimeError", "a body sink reached the response writer");
                Box::pin(self.queue_response(error.into_response(), false)).await
            }
            Body::File(ref file) => {
                let len = file.len;
                with_http_date(|date| {
                    write_head(
                        &mut self.out,
                        &response,
                        Framing::Length(len as usize),
                        keep_alive,
                        http10,
                        date,
                    )
                });
                let Body::File(file) = response.body else {
                    unreachable!()
                };
                self.flush().await?;
                self.send_file(file).await?;
                Ok(keep_alive)
            }
            Body::Sse(_) => {
                let framing = if http10 {
                    Framing::UntilClose
                } else {
                    Framing::Chunked
                };
                let keep_alive = keep_alive && !http10;
                with_http_date(|date| {
                    write_head(&mut self.out, &response, framing, keep_alive, http10, date)
                });
                self.flush().await?;
                let Body::Sse(mut events) = response.body else {
                    unreachable!()
                };
                while let Some(event) = events.next().await {
                    self.frame(&event, framing);
                    while let Some(more) = events.try_next() {
                        self.frame(&more, framing);
                    }
                    self.flush().await?;
                }
                if framing == Framing::Chunked {
                    self.out.extend_from_slice(b"0\r\n\r\n");
                }
                self.flush().await?;
                Ok(keep_alive)
            }
        }
    }

    /// Sends a file region, reading the next chunk from disk while the current one is
    /// being written to the socket.
    async fn send_file(&mut self, body: FileBody) -> Result<(), Stop> {
        let FileBody { file, offset, len } = body;
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        let mut pos = offset;
        let chunk_for = |pos: u64| ((end - pos) as usize).min(STREAM_CHUNK);
        let (mut result, mut current) = file.read_at(Vec::with_capacity(chunk_for(pos)), pos).await;
        let mut spare = Vec::with_capacity(STREAM_CHUNK);
        loop {
            match result_len(&result, &current, end - pos) {
                Some(n) => current.truncate(n),
                // A read error, or the file shrank under us: the promised length cannot be
                // met, so the connection closes.
                None => return Err(Stop::Quiet),
            }
            pos += current.len() as u64;
            if pos >= end {
                return self.write(current).await.0;
            }
            let next = chunk_for(pos);
            spare.clear();
            if spare.capacity() < next {
                spare.reserve(next);
            }
            let (written, (read, filled)) = monoio::join!(
                self.write(current),
                file.read_at(std::mem::take(&mut spare), pos)
            );
            let (write_result, used) = written;
            write_result?;
            spare = used;
            current = filled;
            result = read;
        }
    }

    fn frame(&mut self, data: &[u8], framing: Framing) {
        if framing == Framing::Chunked {
            write_chunk(&mut self.out, data);
        } else {
            self.out.extend_from_slice(data);
        }
    }
}

/// Largest piece of a streamed body held in memory at once.
const STREAM_CHUNK: usize = 256 * 1024;

/// Progress through a chunked body.
#[derive(Default)]
struct ChunkState {
    remaining: usize,
    need_crlf: bool,
    done: bool,
}

/// How many bytes of a file read count: `None` for an error or an early end of file.
fn result_len(result: &std::io::Result<usize>, buf: &[u8], left: u64) -> Option<usize> {
    match result {
        Ok(n) if *n > 0 && !buf.is_empty() => Some(buf.len().min(left as usize)),
        _ => None,
    }
}

/// Policy refusals name the endpoint that refused (the contract's common rules).
fn with_endpoint(error: ApiError, id: &str) -> ApiError {
    const POLICY_CODES: [&str; 6] = [
        "path_not_allowed",
        "command_not_allowed",
        "extension_not_allowed",
        "rate_limited",
        "missing_scope",
        "endpoint_disabled",
    ];
    let is_policy = error.code.is_some_and(|c| POLICY_CODES.contains(&c));
    if is_policy && !error.extra.iter().any(|(name, _)| *name == "endpoint") {
        error.with_field("endpoint", id.to_string())
    } else {
        error
    }
}

fn head_too_large() -> ApiError {
    ApiError::new(
        431,
        "ValueError",
        format!(
            "Request head too large: at most {MAX_HEAD_BYTES} bytes and {MAX_HEADERS} header lines"
        ),
    )
}

fn find_crlf(data: &[u8]) -> Option<usize> {
    data.windows(2).position(|w| w == b"\r\n")
}

/// Copies what we need out of httparse's borrowed view and checks the framing headers.
fn extract_head(parsed: &httparse::Request<'_, '_>) -> Result<Head, ApiError> {
    let http10 = parsed.version == Some(0);
    let mut head = Head {
        method: parsed.method.unwrap_or("").to_string(),
        target: parsed.path.unwrap_or("").to_string(),
        http10,
        headers: Vec::with_capacity(parsed.headers.len()),
        content_length: None,
        chunked: false,
        expect_continue: false,
        keep_alive: !http10,
    };
    let mut transfer_encoding = false;
    for header in parsed.headers.iter() {
        let name = header.name.to_ascii_lowercase();
        let value = String::from_utf8_lossy(header.value).trim().to_string();
        match name.as_str() {
            "content-length" => {
                // Digits only: `+5` or ` 5` parse as numbers but a proxy may read them
                // differently, which is how requests get smuggled.
                let len: u64 = Some(value.as_str())
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| ApiError::bad_request("Invalid Content-Length header"))?;
                if head.content_length.is_some_and(|seen| seen != len) {
                    return Err(ApiError::bad_request("Conflicting Content-Length headers"));
                }
                head.content_length = Some(len);
            }
            "transfer-encoding" => {
                transfer_encoding = true;
                // Only plain chunked: we would not undo any other coding.
                if !value.eq_ignore_ascii_case("chunked") {
                    return Err(ApiError::new(
                        501,
                        "ValueError",
                        format!("Transfer-Encoding '{value}' is not supported; use chunked"),
                    ));
                }
                head.chunked = true;
            }
            "expect" => {
                if value.eq_ignore_ascii_case("100-continue") {
                    head.expect_continue = true;
                } else {
                    return Err(ApiError::new(
                        417,
                        "ValueError",
                        format!("Expectation '{value}' cannot be met"),
                    ));
                }
            }
            "connection" => {
                for token in value.split(',').map(str::trim) {
                    if token.eq_ignore_ascii_case("close") {
                        head.keep_alive = false;
                    } else if token.eq_ignore_ascii_case("keep-alive") && http10 {
                        head.keep_alive = true;
                    }
                }
            }
            _ => {}
        }
        head.headers.push((name, value));
    }
    if transfer_encoding && head.content_length.is_some() {
        // Request smuggling guard (RFC 9112 §6.1): never guess which framing is real.
        return Err(ApiError::bad_request(
            "Content-Length and Transfer-Encoding together are not allowed",
        ));
    }
    Ok(head)
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

/// Polls a future, turning a panic into `Err`.
struct CatchPanic<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = self.0.as_mut();
        match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// Runs a handler, turning a panic (while building or polling its future) into `Err`.
struct CatchUnwind(
    Option<crate::routes::HandlerFuture>,
    Option<(crate::routes::Handler, Request)>,
);

impl Future for CatchUnwind {
    type Output = Result<Result<Response, ApiError>, Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if this.0.is_none() {
            let (handler, request) = this.1.take().expect("polled after completion");
            match catch_unwind(AssertUnwindSafe(|| handler(request))) {
                Ok(future) => this.0 = Some(future),
                Err(panic) => return Poll::Ready(Err(panic)),
            }
        }
        let future = this.0.as_mut().expect("future present");
        match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}
