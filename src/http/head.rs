//! Request heads: parsed with httparse, then checked for the framing rules that keep a
//! front proxy and this server from reading one request differently (RFC 9112 §6).

/// Largest request head (request line plus headers) we buffer before answering 431.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header lines in one request (Python's http.server allows 100).
pub const MAX_HEADERS: usize = 100;

/// A request head, copied out of the read buffer so the buffer can move on.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: String,
    /// The request target as sent (path and query, not decoded).
    pub target: String,
    pub http10: bool,
    /// Header names in lower case, in arrival order; values trimmed.
    pub headers: Vec<(String, String)>,
    pub content_length: Option<u64>,
    pub chunked: bool,
    pub expect_continue: bool,
    pub keep_alive: bool,
}

impl RequestHead {
    /// Whether a body follows the head.
    pub fn has_body(&self) -> bool {
        self.chunked || self.content_length.is_some_and(|n| n > 0)
    }

    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A request the engine refuses before any application code sees it; the service words
/// the answer in its own envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError {
    pub status: u16,
    pub message: String,
    /// A machine-readable code where the contract names one (`payload_too_large`).
    pub code: Option<&'static str>,
    /// The limit a body went over, which the answer names (`limit`, as the reference).
    pub limit: Option<u64>,
}

impl ProtocolError {
    pub fn bad_request(message: impl Into<String>) -> ProtocolError {
        ProtocolError {
            status: 400,
            message: message.into(),
            code: None,
            limit: None,
        }
    }

    pub fn head_too_large() -> ProtocolError {
        ProtocolError {
            status: 431,
            message: format!(
                "Request head too large: at most {MAX_HEAD_BYTES} bytes and {MAX_HEADERS} header lines"
            ),
            code: None,
            limit: None,
        }
    }

    pub fn body_too_large(limit: u64) -> ProtocolError {
        ProtocolError {
            status: 413,
            message: format!("Request body too large: the limit is {limit} bytes"),
            code: Some("payload_too_large"),
            limit: Some(limit),
        }
    }
}

/// Where the head that starts `buf` ends (the index after its empty line), looking from
/// `from` on; `None` while it is incomplete. A bare-LF empty line counts too, so such a
/// head is refused at once rather than waited for.
pub fn find_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(offset) = buf.get(at..)?.iter().position(|b| *b == b'\n') {
        let lf = at + offset;
        match buf.get(lf + 1) {
            Some(b'\n') => return Some(lf + 2),
            Some(b'\r') if buf.get(lf + 2) == Some(&b'\n') => return Some(lf + 3),
            _ => at = lf + 1,
        }
    }
    None
}

/// Parses a head from the start of `buf`. `Ok(None)`: incomplete, read more.
pub fn parse(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, ProtocolError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD_BYTES => {
            Err(ProtocolError::head_too_large())
        }
        Ok(httparse::Status::Complete(len)) => {
            // httparse accepts a bare LF as a line end; a proxy in front may not, and two
            // readings of one request are how requests get smuggled (RFC 9112 §2.2).
            if buf[..len]
                .iter()
                .enumerate()
                .any(|(i, b)| *b == b'\n' && (i == 0 || buf[i - 1] != b'\r'))
            {
                return Err(ProtocolError::bad_request(
                    "Malformed request: lines must end with CRLF",
                ));
            }
            Ok(Some((extract(&parsed)?, len)))
        }
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => {
            Err(ProtocolError::head_too_large())
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(ProtocolError::head_too_large()),
        Err(e) => Err(ProtocolError::bad_request(format!(
            "Malformed request: {e}"
        ))),
    }
}

/// Copies what we need out of httparse's borrowed view and checks the framing headers.
fn extract(parsed: &httparse::Request<'_, '_>) -> Result<RequestHead, ProtocolError> {
    let http10 = parsed.version == Some(0);
    let mut head = RequestHead {
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
                    .ok_or_else(|| ProtocolError::bad_request("Invalid Content-Length header"))?;
                if head.content_length.is_some_and(|seen| seen != len) {
                    return Err(ProtocolError::bad_request(
                        "Conflicting Content-Length headers",
                    ));
                }
                head.content_length = Some(len);
            }
            "transfer-encoding" => {
                if transfer_encoding {
                    return Err(ProtocolError::bad_request(
                        "Transfer-Encoding appears more than once; send it once",
                    ));
                }
                transfer_encoding = true;
                // Only plain chunked: we would not undo any other coding.
                if !value.eq_ignore_ascii_case("chunked") {
                    return Err(ProtocolError {
                        status: 501,
                        message: format!(
                            "Transfer-Encoding '{value}' is not supported; use chunked"
                        ),
                        code: None,
                        limit: None,
                    });
                }
                head.chunked = true;
            }
            "expect" => {
                if value.eq_ignore_ascii_case("100-continue") {
                    head.expect_continue = true;
                } else {
                    return Err(ProtocolError {
                        status: 417,
                        message: format!("Expectation '{value}' cannot be met"),
                        code: None,
                        limit: None,
                    });
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
        return Err(ProtocolError::bad_request(
            "Content-Length and Transfer-Encoding together are not allowed",
        ));
    }
    if !http10 && !head.headers.iter().any(|(n, _)| n == "host") {
        // RFC 9112 §3.2: a server must refuse an HTTP/1.1 request without Host.
        return Err(ProtocolError::bad_request(
            "HTTP/1.1 requests must carry a Host header",
        ));
    }
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_end_is_found_once_complete() {
        let head = b"GET / HTTP/1.1\r\nHost: h\r\n\r\nBODY";
        assert_eq!(find_end(head, 0), Some(head.len() - 4));
        for cut in 0..head.len() - 4 {
            assert_eq!(find_end(&head[..cut], 0), None, "cut at {cut}");
        }
        assert_eq!(find_end(head, 20), Some(head.len() - 4));
        assert_eq!(find_end(b"GET / HTTP/1.1\nHost: h\n\n", 0), Some(24));
        assert_eq!(find_end(b"\r\n", 0), None);
    }

    #[test]
    fn framing_headers() {
        let (head, len) = parse(
            b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (head.content_length, head.keep_alive, len),
            (Some(3), false, 67)
        );
        assert!(parse(b"GET /x HTTP/1.1\r\nHost: a\r\n").unwrap().is_none());
        let refused = |raw: &[u8]| parse(raw).unwrap_err().status;
        assert_eq!(
            refused(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: +3\r\n\r\n"),
            400
        );
        assert_eq!(
            refused(
                b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"
            ),
            400
        );
        assert_eq!(
            refused(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            refused(b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n"),
            501
        );
        assert_eq!(
            refused(b"POST /x HTTP/1.1\r\nHost: h\r\nExpect: magic\r\n\r\n"),
            417
        );
        assert_eq!(refused(b"GET /x HTTP/1.1\r\n\r\n"), 400, "no Host");
        assert!(parse(b"GET /x HTTP/1.0\r\n\r\n").unwrap().is_some());
        assert_eq!(refused(b"GET /x HTTP/1.1\nHost: h\r\n\r\n"), 400, "bare LF");
        assert_eq!(refused(b"GET /x HTTP/1.1\r\nHost: h\n\r\n"), 400, "bare LF");
        assert_eq!(
            refused(b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
    }

    #[test]
    fn header_lookup_and_body_presence() {
        let (head, _) = parse(
            b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nX-Two: a\r\nX-Two: b\r\nContent-Length: 0\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(head.header("content-type"), Some("application/json"));
        assert_eq!(head.header("x-two"), Some("a"), "the first value");
        assert_eq!(head.header("x-missing"), None);
        assert!(!head.has_body(), "Content-Length: 0 is no body");
        let body = |raw: &[u8]| parse(raw).unwrap().unwrap().0.has_body();
        assert!(body(
            b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\n"
        ));
        assert!(body(
            b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        ));
        assert!(!body(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n"));
    }

    #[test]
    fn keep_alive_defaults_and_tokens() {
        let keep = |raw: &[u8]| parse(raw).unwrap().unwrap().0.keep_alive;
        assert!(keep(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"));
        assert!(!keep(b"GET / HTTP/1.0\r\n\r\n"));
        assert!(keep(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
        assert!(!keep(
            b"GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade, close\r\n\r\n"
        ));
        // keep-alive means nothing new on 1.1, and does not undo a close.
        assert!(!keep(
            b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n"
        ));
        // Host is found among other headers, and only Host counts.
        assert!(parse(b"GET / HTTP/1.1\r\nAccept: x\r\nHost: h\r\n\r\n").is_ok());
        assert!(parse(b"GET / HTTP/1.1\r\nAccept: x\r\nHostile: h\r\n\r\n").is_err());
    }

    /// A head of exactly `MAX_HEAD_BYTES` is served; one byte more is 431, whether it
    /// arrived whole or is still incomplete.
    #[test]
    fn head_size_limit_is_exact() {
        fn head_of(len: usize, complete: bool) -> Vec<u8> {
            let start = b"GET / HTTP/1.1\r\nHost: h\r\nX-Pad: ";
            let end: &[u8] = if complete { b"\r\n\r\n" } else { b"\r\n" };
            let mut raw = start.to_vec();
            raw.resize(len - end.len(), b'a');
            raw.extend_from_slice(end);
            assert_eq!(raw.len(), len);
            raw
        }
        assert!(parse(&head_of(MAX_HEAD_BYTES, true)).unwrap().is_some());
        assert_eq!(
            parse(&head_of(MAX_HEAD_BYTES + 1, true))
                .unwrap_err()
                .status,
            431
        );
        assert!(parse(&head_of(MAX_HEAD_BYTES, false)).unwrap().is_none());
        assert_eq!(
            parse(&head_of(MAX_HEAD_BYTES + 1, false))
                .unwrap_err()
                .status,
            431
        );
        // Well past 1 KiB is still a normal head.
        assert!(parse(&head_of(8 * 1024, true)).unwrap().is_some());
    }
}
