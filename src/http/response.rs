//! Responses and their serialisation into one output buffer (head and body together, so
//! a small answer leaves in a single `send`).

use std::future::Future;
use std::pin::Pin;

use serde::Serialize;

use super::sse::SseStream;
use crate::error::ApiError;
use crate::fs::aio::AsyncFile;

/// `Content-Type` of every JSON answer, as the contract spells it.
pub const JSON_CONTENT_TYPE: &str = "application/json; charset=utf-8";
/// `Content-Type` of streaming routes.
pub const SSE_CONTENT_TYPE: &str = "text/event-stream";

/// What follows the head.
pub enum Body {
    /// A body known in full; sent with `Content-Length`.
    Full(Vec<u8>),
    /// Server-sent events, each flushed as it is produced.
    Sse(SseStream),
    /// A region of an open file, streamed in constant memory.
    File(FileBody),
    /// Not a body to send: the handler accepts the request's raw body into this sink, and
    /// the response is whatever the sink answers once the body is complete.
    Sink(Box<dyn BodySink>),
}

/// A file region sent as the response body.
pub struct FileBody {
    pub file: AsyncFile,
    pub offset: u64,
    pub len: u64,
}

/// A future a sink returns; sinks run on one worker, so it need not be `Send`.
pub type SinkFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Receives a raw request body chunk by chunk (see `Endpoint::raw_body`).
pub trait BodySink {
    /// Takes one chunk and returns the buffer for reuse.
    fn write(&mut self, chunk: Vec<u8>) -> SinkFuture<'_, Result<Vec<u8>, ApiError>>;
    /// The body arrived whole: commit it and produce the answer.
    fn finish(self: Box<Self>) -> SinkFuture<'static, Result<Response, ApiError>>;
    /// The body did not arrive whole (client gone, too large, malformed): undo.
    fn abort(self: Box<Self>) -> SinkFuture<'static, ()>;
}

/// An HTTP response as handlers build it.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    /// Headers beyond the ones the engine writes itself (Content-Type, Content-Length,
    /// Connection, Date, Transfer-Encoding).
    pub headers: Vec<(&'static str, String)>,
    pub body: Body,
    /// Close the connection after this response.
    pub close: bool,
}

impl Response {
    /// A JSON response with `value` as its body.
    pub fn json<T: Serialize + ?Sized>(status: u16, value: &T) -> Response {
        let mut body = Vec::with_capacity(128);
        // Serialising plain data into a Vec cannot fail; a failing custom Serialize impl
        // is a programming error we still answer without panicking.
        if serde_json::to_writer(&mut body, value).is_err() {
            body.clear();
            body.extend_from_slice(
                br#"{"error":"response could not be serialised","type":"TypeError"}"#,
            );
            return Response::raw(500, JSON_CONTENT_TYPE, body);
        }
        Response::raw(status, JSON_CONTENT_TYPE, body)
    }

    /// 200 with `value` as the JSON body (the contract's `ServerResponse.ok`).
    pub fn ok<T: Serialize + ?Sized>(value: &T) -> Response {
        Response::json(200, value)
    }

    /// A response whose body bytes the caller already produced.
    pub fn raw(status: u16, content_type: &'static str, body: Vec<u8>) -> Response {
        Response {
            status,
            content_type,
            headers: Vec::new(),
            body: Body::Full(body),
            close: false,
        }
    }

    /// A `text/event-stream` response fed by `stream`.
    pub fn sse(stream: SseStream) -> Response {
        Response {
            status: 200,
            content_type: SSE_CONTENT_TYPE,
            headers: vec![("Cache-Control", "no-cache".to_string())],
            body: Body::Sse(stream),
            close: false,
        }
    }

    /// A response that streams `len` bytes of `file` from `offset`.
    pub fn file(
        status: u16,
        content_type: &'static str,
        file: AsyncFile,
        offset: u64,
        len: u64,
    ) -> Response {
        Response {
            status,
            content_type,
            headers: Vec::new(),
            body: Body::File(FileBody { file, offset, len }),
            close: false,
        }
    }

    /// Accepts the request's raw body into `sink` (only for `raw_body` endpoints).
    pub fn accept_body(sink: Box<dyn BodySink>) -> Response {
        Response {
            status: 100,
            content_type: JSON_CONTENT_TYPE,
            headers: Vec::new(),
            body: Body::Sink(sink),
            close: false,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }
}

/// The reason phrase for the status codes this server sends.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        206 => "Partial Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Payload Too Large",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// How the body of a response is framed on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Framing {
    Length(usize),
    Chunked,
    /// HTTP/1.0 streaming: the end of the body is the end of the connection.
    UntilClose,
    /// 204 and 304: the message ends with the head, no length is announced.
    NoBody,
}

/// Appends a status line and headers to `out`.
pub fn write_head(
    out: &mut Vec<u8>,
    response: &Response,
    framing: Framing,
    keep_alive: bool,
    http10: bool,
    date: &[u8],
) {
    out.extend_from_slice(if http10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
    let mut num = itoa::Buffer::new();
    out.extend_from_slice(num.format(response.status).as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason_phrase(response.status).as_bytes());
    out.extend_from_slice(b"\r\nServer: agent-sandbox\r\nDate: ");
    out.extend_from_slice(date);
    out.extend_from_slice(b"\r\nContent-Type: ");
    out.extend_from_slice(response.content_type.as_bytes());
    match framing {
        Framing::Length(len) => {
            out.extend_from_slice(b"\r\nContent-Length: ");
            out.extend_from_slice(num.format(len).as_bytes());
        }
        Framing::Chunked => out.extend_from_slice(b"\r\nTransfer-Encoding: chunked"),
        Framing::UntilClose | Framing::NoBody => {}
    }
    if !keep_alive {
        out.extend_from_slice(b"\r\nConnection: close");
    } else if http10 {
        out.extend_from_slice(b"\r\nConnection: keep-alive");
    }
    for (name, value) in &response.headers {
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        // Header values come from handlers; CR/LF would split the response.
        out.extend(value.bytes().filter(|b| *b != b'\r' && *b != b'\n'));
    }
    out.extend_from_slice(b"\r\n\r\n");
}

/// Appends one chunk of a chunked body.
pub fn write_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    out.extend_from_slice(format!("{:X}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_carries_length_and_type() {
        let response = Response::ok(&serde_json::json!({"status": "ok"}));
        let mut out = Vec::new();
        write_head(&mut out, &response, Framing::Length(15), true, false, b"D");
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(text.contains("Content-Type: application/json; charset=utf-8\r\n"));
        assert!(text.contains("Content-Length: 15\r\n"));
        assert!(!text.contains("Connection"));
        assert!(text.ends_with("\r\n\r\n"));
    }

    #[test]
    fn header_values_cannot_inject_lines() {
        let response = Response::ok(&1).header("X-Test", "a\r\nEvil: 1");
        let mut out = Vec::new();
        write_head(&mut out, &response, Framing::Length(1), false, true, b"D");
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("X-Test: aEvil: 1\r\n"));
        assert!(text.contains("Connection: close"));
        assert!(text.starts_with("HTTP/1.0 200"));
    }

    #[test]
    fn chunks_are_hex_framed() {
        let mut out = Vec::new();
        write_chunk(&mut out, &[b'x'; 26]);
        assert_eq!(out, b"1A\r\nxxxxxxxxxxxxxxxxxxxxxxxxxx\r\n");
    }
}
