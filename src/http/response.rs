//! Responses and their serialisation: status line and headers written into one output
//! buffer with the body behind them, so a small answer leaves in a single `send`.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use serde::Serialize;

/// `Content-Type` of every JSON answer, as the contract spells it.
pub const JSON_CONTENT_TYPE: &str = "application/json; charset=utf-8";
/// `Content-Type` of streaming routes.
pub const SSE_CONTENT_TYPE: &str = "text/event-stream";

/// A future that runs on one worker thread, so it need not be `Send`.
pub type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What follows the head.
pub enum Body {
    /// A body known in full; sent with `Content-Length`.
    Full(Vec<u8>),
    /// A body produced piece by piece (a file region, server-sent events).
    Stream(Box<dyn BodyStream>),
}

/// A response body produced piece by piece. With a known length it is sent with
/// `Content-Length` and the engine reads the next piece while the current one is being
/// written; without one it is chunked (or, for HTTP/1.0, ends with the connection) and
/// every piece is flushed as soon as it is produced, which server-sent events need.
pub trait BodyStream {
    /// The exact byte count, when known before the first byte.
    fn length(&self) -> Option<u64>;
    /// The next piece, written into `buf` (whose allocation may be reused); `Ok(None)` at
    /// the end. An error, or a stream that ends short of its announced length, closes the
    /// connection: the promised length cannot be met. For a stream without a length the
    /// future must be cancel-safe: it is dropped when the server drains.
    fn next(&mut self, buf: Vec<u8>) -> LocalFuture<'_, std::io::Result<Option<Vec<u8>>>>;
    /// A piece that is ready now, without waiting, so a burst leaves in one write.
    fn ready(&mut self) -> Option<Vec<u8>> {
        None
    }
}

/// An HTTP response.
pub struct Response {
    pub status: u16,
    pub content_type: Cow<'static, str>,
    /// Headers beyond the ones the engine writes itself (Content-Type, Content-Length,
    /// Connection, Date, Transfer-Encoding, Server).
    pub headers: Vec<(Cow<'static, str>, String)>,
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
            content_type: Cow::Borrowed(content_type),
            headers: Vec::new(),
            body: Body::Full(body),
            close: false,
        }
    }

    /// A response whose body is produced by `stream`.
    pub fn stream(
        status: u16,
        content_type: &'static str,
        stream: Box<dyn BodyStream>,
    ) -> Response {
        Response {
            status,
            content_type: Cow::Borrowed(content_type),
            headers: Vec::new(),
            body: Body::Stream(stream),
            close: false,
        }
    }

    pub fn header(
        mut self,
        name: impl Into<Cow<'static, str>>,
        value: impl Into<String>,
    ) -> Response {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Marks the connection to close after this response.
    pub fn closing(mut self) -> Response {
        self.close = true;
        self
    }
}

/// The reason phrase for the status codes this server sends.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        202 => "Accepted",
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
    Length(u64),
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
    // An empty type is a body-less answer that names none (MCP's 202).
    if !response.content_type.is_empty() {
        out.extend_from_slice(b"\r\nContent-Type: ");
        out.extend_from_slice(response.content_type.as_bytes());
    }
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
        out.extend(
            name.bytes()
                .filter(|b| *b != b'\r' && *b != b'\n' && *b != b':'),
        );
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
