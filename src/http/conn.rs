//! One HTTP/1.1 connection: read heads, ask the service what to do, move bodies, write
//! answers. Keep-alive and pipelining are served in order; answers to pipelined requests
//! are gathered and leave in one write.
//!
//! A request's life, in named phases: `read_head` → `Service::plan` → one of answer /
//! read body / stream body / upgrade → `queue_response`.

use std::any::Any;
use std::future::Future;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use super::chunked::{ChunkedDecoder, ChunkedError};
use super::chunks;
use super::head::{self, ProtocolError, RequestHead};
use super::response::{write_chunk, write_head, Body, BodyStream, Framing, Response};
use super::service::{BodySink, Plan, Service, Upgrade, STREAM_CHUNK};
use crate::timefmt::with_http_date;

/// Bodies up to this size are copied behind the head so both leave in one `send`.
const COALESCE_BODY_BYTES: usize = 16 * 1024;
/// Pending pipelined output is flushed once it reaches this size.
const MAX_PENDING_OUTPUT: usize = 64 * 1024;
const READ_CHUNK: usize = 16 * 1024;
/// Most bytes of an unwanted body read (through the connection's small read buffer, so
/// it costs no memory) and thrown away to keep the connection usable; past this the
/// connection closes instead. The contract's JSON body cap.
const MAX_DISCARD: u64 = 10 * 1024 * 1024;
/// A body may take the read timeout plus one second per this many bytes: a client
/// trickling a byte now and then is cut off after about the read timeout, whatever it
/// declared, while a real upload on a slow link is not.
const MIN_BODY_RATE: f64 = 16.0 * 1024.0;
/// How long and how much a closing connection drains after an error answer.
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 16 * 1024 * 1024;

/// The connection stops: peer closed, timed out, or the socket failed.
struct Stop;

struct Connection<S: Service> {
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
    /// When the current request's body started, and the bytes read since: a body must
    /// keep a minimum average rate (see [`MIN_BODY_RATE`]).
    body_started: Instant,
    body_bytes: u64,
    service: Rc<S>,
}

/// Serves `stream` until the peer closes, a timeout fires, the server drains, or an
/// upgrade takes the socket over.
pub async fn serve<S: Service>(stream: TcpStream, service: Rc<S>) {
    // monoio does not catch panics in tasks: one would take the worker thread, and every
    // connection on it, down. This guard closes just this connection.
    if let Err(panic) = CatchPanic(Box::pin(serve_connection(stream, service))).await {
        crate::log::line(format_args!(
            "connection task panicked: {}",
            panic_message(&*panic)
        ));
    }
}

async fn serve_connection<S: Service>(stream: TcpStream, service: Rc<S>) {
    let mut conn = Connection {
        stream,
        buf: Vec::with_capacity(READ_CHUNK),
        pos: 0,
        out: Vec::with_capacity(READ_CHUNK),
        http10: false,
        head_request: false,
        linger_on_close: false,
        body_started: Instant::now(),
        body_bytes: 0,
        service,
    };
    let upgrade = conn.run().await.ok().flatten();
    if conn.flush().await.is_err() {
        return;
    }
    if let Some(upgrade) = upgrade {
        let leftover = conn.buf.split_off(conn.pos);
        upgrade(conn.stream, leftover).await;
    } else if conn.linger_on_close {
        conn.linger().await;
    }
}

enum Deadline {
    Met,
    Missed,
}

/// Runs an I/O future with a deadline. When it passes, the socket is shut down, which
/// completes the pending operation under both drivers and returns its buffer as usual.
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
    // SAFETY: the connection owns the socket for as long as any of its futures run.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// How the rest of a request body is framed.
enum BodyFraming {
    Length(u64),
    /// The decoder and the body limit it refuses chunks above.
    Chunked(ChunkedDecoder, u64),
}

impl BodyFraming {
    fn of(head: &RequestHead, limit: u64) -> BodyFraming {
        if head.chunked {
            // A chunk larger than what may still arrive is refused as soon as announced.
            BodyFraming::Chunked(ChunkedDecoder::new(limit.saturating_add(1)), limit)
        } else {
            BodyFraming::Length(head.content_length.unwrap_or(0))
        }
    }
}

impl<S: Service> Connection<S> {
    /// Serves requests until one ends the connection; `Some` hands the socket over.
    async fn run(&mut self) -> Result<Option<Upgrade>, Stop> {
        loop {
            let head = match self.read_head().await? {
                Ok(Some(head)) => head,
                Ok(None) => return Ok(None),
                Err(error) => {
                    let answer = self.service.refuse(error, None).closing();
                    self.queue_response(answer, false).await?;
                    return Ok(None);
                }
            };
            let _in_flight = self.service.request_started();
            self.http10 = head.http10;
            self.head_request = head.method == "HEAD";
            let plan = self.service.plan(&head).await;
            let keep_alive = head.keep_alive;
            let response = match plan {
                Plan::Answer(response) => self.answer_without_body(&head, response).await?,
                Plan::Read {
                    limit,
                    call,
                    watch_peer,
                } => match self.read_whole_body(&head, limit).await? {
                    Ok(body) if watch_peer => {
                        let mut respond = std::pin::pin!(self.service.respond(call, head, body));
                        let hung_up = monoio::select! {
                            response = &mut respond => Err(response),
                            gone = peer_hung_up(&self.stream) => Ok(gone),
                        };
                        match hung_up {
                            Err(response) => response,
                            Ok(true) => return Ok(None),
                            // The peer sent more (a pipelined request): it is still there.
                            Ok(false) => respond.await,
                        }
                    }
                    Ok(body) => self.service.respond(call, head, body).await,
                    Err(error) => self.service.refuse(error, Some(&head)).closing(),
                },
                Plan::Stream { limit, sink } => self.stream_body(&head, limit, sink).await?,
                Plan::Upgrade(upgrade) => return Ok(Some(upgrade)),
            };
            let keep_alive = keep_alive && !self.service.draining();
            if !self.queue_response(response, keep_alive).await? {
                return Ok(None);
            }
        }
    }

    /// Reads one request head. `Ok(None)` is a clean close between requests.
    async fn read_head(&mut self) -> Result<Result<Option<RequestHead>, ProtocolError>, Stop> {
        let mut head_started: Option<Instant> = None;
        // Bytes after `pos` already known to hold no end of head: a head trickled in
        // small pieces is scanned once and parsed once, not re-parsed per piece.
        let mut scanned = 0usize;
        loop {
            if self.pos < self.buf.len() {
                let pending = &self.buf[self.pos..];
                if head::find_end(pending, scanned.saturating_sub(2)).is_some() {
                    match head::parse(pending) {
                        Ok(Some((head, len))) => {
                            self.pos += len;
                            return Ok(Ok(Some(head)));
                        }
                        Ok(None) => {}
                        Err(error) => return Ok(Err(error)),
                    }
                } else if pending.len() > head::MAX_HEAD_BYTES {
                    return Ok(Err(ProtocolError::head_too_large()));
                }
                scanned = pending.len();
            }
            // Answers to earlier pipelined requests go out before we wait for more input.
            self.flush().await?;
            if self.service.draining() && self.pos == self.buf.len() {
                return Ok(Ok(None));
            }
            // Once a head has started, the whole of it must arrive within the read
            // timeout, however slowly the bytes trickle in.
            let timeouts = self.service.timeouts();
            let timeout = if self.pos < self.buf.len() {
                let started = *head_started.get_or_insert_with(Instant::now);
                let left = timeouts.read.saturating_sub(started.elapsed());
                if left.is_zero() {
                    return Err(Stop);
                }
                left
            } else {
                timeouts.idle
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
            (Deadline::Met, Ok(n)) => {
                self.body_bytes += n as u64;
                Ok(n)
            }
            _ => Err(Stop),
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

    /// Writes all of `data`, giving a client that stops reading the read timeout to
    /// drain it before the connection is torn down.
    async fn write(&mut self, data: Vec<u8>) -> (Result<(), Stop>, Vec<u8>) {
        let fd = self.stream.as_raw_fd();
        let timeout = self.service.timeouts().read;
        let write = self.stream.write_all(data);
        let (outcome, (result, data)) = with_deadline(fd, timeout, write).await;
        match (outcome, result) {
            (Deadline::Met, Ok(_)) => (Ok(()), data),
            _ => (Err(Stop), data),
        }
    }

    /// Closes after an error answer without losing it: unread request bytes in our
    /// receive queue would make the kernel send RST, which can destroy the answer in
    /// flight. So send FIN first, then swallow what the client still sends, bounded.
    async fn linger(&mut self) {
        let fd = self.stream.as_raw_fd();
        let _ = rustix::net::shutdown(borrow(fd), rustix::net::Shutdown::Write);
        let deadline = Instant::now() + LINGER_TIME;
        let mut drained = 0usize;
        let mut sink = std::mem::take(&mut self.buf);
        while drained < LINGER_BYTES {
            let left = deadline.saturating_duration_since(Instant::now());
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

    /// Starts the clock of a request body.
    fn start_body(&mut self) {
        self.body_started = Instant::now();
        self.body_bytes = 0;
    }

    /// How long the next body read may wait: the read timeout, shortened so the whole
    /// body keeps [`MIN_BODY_RATE`] on average after a read timeout's grace.
    fn body_timeout(&self) -> Result<Duration, Stop> {
        let grace = self.service.timeouts().read;
        let allowed = grace + Duration::from_secs_f64(self.body_bytes as f64 / MIN_BODY_RATE);
        let left = allowed.saturating_sub(self.body_started.elapsed());
        if left.is_zero() {
            return Err(Stop);
        }
        Ok(left.min(grace))
    }

    async fn send_continue(&mut self, head: &RequestHead) -> Result<(), Stop> {
        if head.expect_continue && head.has_body() {
            self.out.extend_from_slice(if head.http10 {
                b"HTTP/1.0 100 Continue\r\n\r\n"
            } else {
                b"HTTP/1.1 100 Continue\r\n\r\n"
            });
            self.flush().await?;
        }
        Ok(())
    }

    /// An answer decided from the head alone. A body the client sends anyway is read into
    /// a small buffer and dropped, so the connection stays usable; a large one, or one
    /// the client waits to be invited to send (`Expect: 100-continue`), closes it.
    async fn answer_without_body(
        &mut self,
        head: &RequestHead,
        response: Response,
    ) -> Result<Response, Stop> {
        // A response that closes the connection need not read the body first: the
        // lingering close swallows what the client still sends.
        if !head.has_body() || response.close {
            return Ok(response);
        }
        if head.expect_continue || head.content_length.is_some_and(|n| n > MAX_DISCARD) {
            return Ok(response.closing());
        }
        self.start_body();
        let mut framing = BodyFraming::of(head, MAX_DISCARD);
        let mut total = 0u64;
        loop {
            match self.next_piece(&mut framing, READ_CHUNK).await? {
                Ok(Some((start, end, next))) => {
                    self.pos = next;
                    total += (end - start) as u64;
                    if total > MAX_DISCARD {
                        return Ok(response.closing());
                    }
                }
                Ok(None) => return Ok(response),
                Err(_) => return Ok(response.closing()),
            }
        }
    }

    /// The next piece of body data, as a range `start..end` of `self.buf` and the position
    /// the caller moves `self.pos` to once it has taken the data; `Ok(None)` once the
    /// body is complete.
    async fn next_piece(
        &mut self,
        framing: &mut BodyFraming,
        max: usize,
    ) -> Result<Result<Option<(usize, usize, usize)>, ProtocolError>, Stop> {
        loop {
            match framing {
                BodyFraming::Length(0) => return Ok(Ok(None)),
                BodyFraming::Length(remaining) => {
                    if self.pos == self.buf.len() && self.fill(self.body_timeout()?).await? == 0 {
                        return Err(Stop);
                    }
                    let take = (*remaining)
                        .min((self.buf.len() - self.pos) as u64)
                        .min(max as u64) as usize;
                    *remaining -= take as u64;
                    let end = self.pos + take;
                    return Ok(Ok(Some((self.pos, end, end))));
                }
                BodyFraming::Chunked(decoder, limit) => {
                    if decoder.is_done() {
                        return Ok(Ok(None));
                    }
                    let decoded = match decoder.decode(&self.buf[self.pos..], max) {
                        Ok(decoded) => decoded,
                        // A chunk announced beyond what the body may hold is the body's
                        // size refused, as a Content-Length over the limit would be.
                        Err(ChunkedError::ChunkTooLarge) => {
                            return Ok(Err(ProtocolError::body_too_large(*limit)))
                        }
                        Err(e) => return Ok(Err(ProtocolError::bad_request(e.message()))),
                    };
                    if !decoded.data.is_empty() {
                        let start = self.pos + decoded.data.start;
                        let end = self.pos + decoded.data.end;
                        return Ok(Ok(Some((start, end, self.pos + decoded.consumed))));
                    }
                    self.pos += decoded.consumed;
                    if decoded.done {
                        return Ok(Ok(None));
                    }
                    if decoded.consumed == 0 && self.fill(self.body_timeout()?).await? == 0 {
                        return Err(Stop);
                    }
                }
            }
        }
    }

    /// Reads a body whole, up to `limit` bytes.
    async fn read_whole_body(
        &mut self,
        head: &RequestHead,
        limit: u64,
    ) -> Result<Result<Vec<u8>, ProtocolError>, Stop> {
        if head.content_length.is_some_and(|n| n > limit) {
            // Refused from the header alone: the body is never read.
            return Ok(Err(ProtocolError::body_too_large(limit)));
        }
        self.send_continue(head).await?;
        self.start_body();
        if head.chunked {
            let mut body = Vec::new();
            let mut framing = BodyFraming::of(head, limit);
            loop {
                match self.next_piece(&mut framing, STREAM_CHUNK).await? {
                    Ok(Some((start, end, next))) => {
                        if (body.len() + (end - start)) as u64 > limit {
                            return Ok(Err(ProtocolError::body_too_large(limit)));
                        }
                        body.extend_from_slice(&self.buf[start..end]);
                        self.pos = next;
                    }
                    Ok(None) => return Ok(Ok(body)),
                    Err(error) => return Ok(Err(error)),
                }
            }
        }
        let len = head.content_length.unwrap_or(0) as usize;
        // Whatever already arrived is copied once; the rest is read straight into the
        // body, so the connection buffer never grows to the size of a large body.
        let buffered = (self.buf.len() - self.pos).min(len);
        // The declared size is reserved once body bytes have arrived (usually they came
        // with the head), never for a head alone: a client that announces a large body
        // and sends nothing holds no memory for it. One reservation then reads the rest
        // without growing and copying the buffer (measured: a staged reservation cost
        // 15% on 7 MiB uploads, docs/benchmarks.md).
        let first = if buffered > 0 {
            len
        } else {
            len.min(READ_CHUNK)
        };
        let mut body = Vec::with_capacity(first);
        body.extend_from_slice(&self.buf[self.pos..self.pos + buffered]);
        self.pos += buffered;
        while body.len() < len {
            let want = if body.is_empty() {
                first
            } else {
                len - body.len()
            };
            body.reserve_exact(want);
            let filled = body.len();
            let upto = filled + want;
            let fd = self.stream.as_raw_fd();
            let timeout = self.body_timeout()?;
            let read = self.stream.read(body.slice_mut(filled..upto));
            let (outcome, (result, back)) = with_deadline(fd, timeout, read).await;
            body = back.into_inner();
            match (outcome, result) {
                (Deadline::Met, Ok(n)) if n > 0 => self.body_bytes += n as u64,
                _ => return Err(Stop),
            }
        }
        Ok(Ok(body))
    }

    /// Streams a body into `sink` in pieces of at most `STREAM_CHUNK` bytes, so memory
    /// stays constant whatever the body size; the sink's answer is the response.
    async fn stream_body(
        &mut self,
        head: &RequestHead,
        limit: u64,
        mut sink: Box<dyn BodySink>,
    ) -> Result<Response, Stop> {
        if head.content_length.is_some_and(|n| n > limit) {
            sink.abort().await;
            return Ok(self
                .service
                .refuse(ProtocolError::body_too_large(limit), Some(head))
                .closing());
        }
        if let Err(stop) = self.send_continue(head).await {
            sink.abort().await;
            return Err(stop);
        }
        match self.pump(head, limit, &mut *sink).await {
            Ok(Ok(())) => Ok(sink.finish().await),
            Ok(Err(answer)) => {
                sink.abort().await;
                Ok(answer.closing())
            }
            Err(stop) => {
                sink.abort().await;
                Err(stop)
            }
        }
    }

    async fn pump(
        &mut self,
        head: &RequestHead,
        limit: u64,
        sink: &mut dyn BodySink,
    ) -> Result<Result<(), Response>, Stop> {
        self.start_body();
        let chunk = sink.piece_size().clamp(1, STREAM_CHUNK);
        // No bigger than the body: a 128 KiB piece for a 1 KiB body cost glibc a
        // `malloc_consolidate` per request when freed.
        let first = match head.content_length {
            Some(len) if !head.chunked => chunk.min(len as usize),
            _ => chunk,
        };
        let mut piece: Vec<u8> = Vec::with_capacity(first);
        if head.chunked {
            let mut framing = BodyFraming::of(head, limit);
            let mut total = 0u64;
            loop {
                piece.clear();
                while piece.len() < chunk {
                    match self.next_piece(&mut framing, chunk - piece.len()).await? {
                        Ok(Some((start, end, next))) => {
                            piece.extend_from_slice(&self.buf[start..end]);
                            self.pos = next;
                            if self.pos == self.buf.len() {
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(error) => return Ok(Err(self.service.refuse(error, Some(head)))),
                    }
                }
                total += piece.len() as u64;
                if total > limit {
                    return Ok(Err(self
                        .service
                        .refuse(ProtocolError::body_too_large(limit), Some(head))));
                }
                let finished = matches!(&framing, BodyFraming::Chunked(d, _) if d.is_done());
                if !piece.is_empty() {
                    piece = match sink.write(piece).await {
                        Ok(buf) => buf,
                        Err(answer) => return Ok(Err(answer)),
                    };
                }
                if finished {
                    return Ok(Ok(()));
                }
            }
        }
        let mut remaining = head.content_length.unwrap_or(0);
        while remaining > 0 {
            piece.clear();
            let buffered = self.buf.len() - self.pos;
            if buffered > 0 {
                let take = buffered.min(remaining as usize).min(chunk);
                piece.extend_from_slice(&self.buf[self.pos..self.pos + take]);
                self.pos += take;
            } else {
                // Straight from the socket into the piece: no copy through our buffer.
                let want = (remaining as usize).min(chunk);
                if piece.capacity() < want {
                    piece.reserve(want);
                }
                let fd = self.stream.as_raw_fd();
                let timeout = self.body_timeout()?;
                let read = self
                    .stream
                    .read(std::mem::take(&mut piece).slice_mut(0..want));
                let (outcome, (result, back)) = with_deadline(fd, timeout, read).await;
                piece = back.into_inner();
                match (outcome, result) {
                    (Deadline::Met, Ok(n)) if n > 0 => self.body_bytes += n as u64,
                    _ => return Err(Stop),
                }
            }
            remaining -= piece.len() as u64;
            piece = match sink.write(piece).await {
                Ok(buf) => buf,
                Err(answer) => return Ok(Err(answer)),
            };
        }
        Ok(Ok(()))
    }

    /// Queues `response`; streams are written to the end here. Returns whether the
    /// connection stays open.
    async fn queue_response(&mut self, response: Response, keep_alive: bool) -> Result<bool, Stop> {
        let http10 = self.http10;
        let keep_alive = keep_alive && !response.close;
        self.linger_on_close = !keep_alive && response.status >= 400;
        let bodiless = matches!(response.status, 204 | 304);
        let (head_only, body) = split_body(response);
        match body {
            Body::Full(body) => {
                let framing = if bodiless {
                    Framing::NoBody
                } else {
                    Framing::Length(body.len() as u64)
                };
                with_http_date(|date| {
                    write_head(&mut self.out, &head_only, framing, keep_alive, http10, date)
                });
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
            Body::Stream(stream) => match stream.length() {
                Some(len) => {
                    with_http_date(|date| {
                        write_head(
                            &mut self.out,
                            &head_only,
                            Framing::Length(len),
                            keep_alive,
                            http10,
                            date,
                        )
                    });
                    self.flush().await?;
                    if !self.head_request {
                        self.send_sized(stream, len).await?;
                    }
                    Ok(keep_alive)
                }
                None => {
                    let framing = if http10 {
                        Framing::UntilClose
                    } else {
                        Framing::Chunked
                    };
                    let keep_alive = keep_alive && !http10;
                    with_http_date(|date| {
                        write_head(&mut self.out, &head_only, framing, keep_alive, http10, date)
                    });
                    self.flush().await?;
                    self.send_events(stream, framing).await?;
                    Ok(keep_alive)
                }
            },
        }
    }

    /// Sends a body of known length, producing the next piece while the current one is
    /// being written to the socket.
    async fn send_sized(&mut self, mut stream: Box<dyn BodyStream>, len: u64) -> Result<(), Stop> {
        let mut sent = 0u64;
        // Buffers come from and go back to the worker's spares (`chunks`): fresh ones
        // per response were faulted in afresh each time.
        let mut current = match stream.next(chunks::take()).await {
            Ok(Some(piece)) => piece,
            Ok(None) if len == 0 => return Ok(()),
            _ => return Err(Stop),
        };
        let mut spare = chunks::take();
        loop {
            if current.is_empty() || sent + current.len() as u64 > len {
                // The stream broke its promise: the announced length cannot be met.
                return Err(Stop);
            }
            sent += current.len() as u64;
            if sent == len {
                let (result, used) = self.write(current).await;
                chunks::give(used);
                chunks::give(spare);
                return result;
            }
            let (written, produced) =
                monoio::join!(self.write(current), stream.next(std::mem::take(&mut spare)));
            let (write_result, mut used) = written;
            write_result?;
            used.clear();
            spare = used;
            current = match produced {
                Ok(Some(piece)) => piece,
                _ => return Err(Stop),
            };
        }
    }

    /// Sends a body of unknown length, each piece flushed as soon as it exists.
    async fn send_events(
        &mut self,
        mut stream: Box<dyn BodyStream>,
        framing: Framing,
    ) -> Result<(), Stop> {
        let service = self.service.clone();
        let mut drained = std::pin::pin!(service.drained());
        // A quiet stream would notice a vanished client only at its next write; watching
        // the socket ends the stream (and whatever feeds it) at once. Bytes of a
        // pipelined request stop the watch and stay unread for after this answer.
        let mut watch_peer = self.pos == self.buf.len();
        loop {
            let next = monoio::select! {
                piece = stream.next(Vec::new()) => Some(piece),
                _ = &mut drained => None,
                hung_up = peer_hung_up(&self.stream), if watch_peer => {
                    if hung_up {
                        return Err(Stop);
                    }
                    watch_peer = false;
                    continue;
                },
            };
            let Some(next) = next else {
                if let Some(last) = service.farewell() {
                    self.frame(&last, framing);
                }
                break;
            };
            match next {
                Ok(Some(piece)) => {
                    self.frame(&piece, framing);
                    while let Some(more) = stream.ready() {
                        self.frame(&more, framing);
                    }
                    self.flush().await?;
                }
                Ok(None) => break,
                Err(_) => return Err(Stop),
            }
        }
        if framing == Framing::Chunked {
            self.out.extend_from_slice(b"0\r\n\r\n");
        }
        self.flush().await
    }

    fn frame(&mut self, data: &[u8], framing: Framing) {
        if framing == Framing::Chunked {
            write_chunk(&mut self.out, data);
        } else {
            self.out.extend_from_slice(data);
        }
    }
}

/// Resolves `true` when the peer has closed or reset the connection, `false` when it
/// sent data (which stays in the socket for the next read). Only peeks.
async fn peer_hung_up(stream: &TcpStream) -> bool {
    use rustix::net::RecvFlags;
    loop {
        if stream.readable(false).await.is_err() {
            return true;
        }
        let mut byte = [0u8; 1];
        match rustix::net::recv(
            borrow(stream.as_raw_fd()),
            &mut byte,
            RecvFlags::PEEK | RecvFlags::DONTWAIT,
        ) {
            Ok((0, _)) => return true,
            Ok(_) => return false,
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return true,
        }
    }
}

/// The bytes of a whole answer with a full body, for a connection that is closed right
/// after it (HTTP/1.1, `Connection: close`). A streamed body is sent as empty.
pub fn encode_closing(response: Response) -> Vec<u8> {
    let (head_only, body) = split_body(response);
    let body = match body {
        Body::Full(bytes) => bytes,
        Body::Stream(_) => Vec::new(),
    };
    let mut out = Vec::with_capacity(256 + body.len());
    with_http_date(|date| {
        write_head(
            &mut out,
            &head_only,
            Framing::Length(body.len() as u64),
            false,
            false,
            date,
        )
    });
    out.extend_from_slice(&body);
    out
}

/// Separates a response's body from the rest, which `write_head` needs.
fn split_body(mut response: Response) -> (Response, Body) {
    let body = std::mem::replace(&mut response.body, Body::Full(Vec::new()));
    (response, body)
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
pub struct CatchPanic<F>(pub F);

impl<F: Future + Unpin> Future for CatchPanic<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = Pin::new(&mut self.0);
        match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// The message a panic carried, for logs and 500 answers.
pub fn describe_panic(panic: &(dyn Any + Send)) -> String {
    panic_message(panic)
}
