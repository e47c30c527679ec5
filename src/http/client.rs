//! A minimal HTTP/1.1 client for exchanges over loopback: the MCP endpoint calls the
//! server's own routes through it, so a tool call takes exactly the path a plain HTTP
//! request takes (authentication, policy, body rules, the handler, its error words).
//! Each worker thread keeps a few idle keep-alive connections per address (a new
//! connection per call cost about a third of a `tools/call`); an answer is read to its
//! `Content-Length`, or to the end of a connection the server closes.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

/// What came back.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Idle connections a worker thread keeps, across all addresses.
const IDLE_PER_THREAD: usize = 8;

/// How long an idle connection is reused: far below the server's own keep-alive
/// timeout, so the server never closes one the pool still holds.
const IDLE_REUSE: std::time::Duration = std::time::Duration::from_secs(10);

thread_local! {
    static IDLE: RefCell<Vec<(SocketAddr, TcpStream, std::time::Instant)>> =
        const { RefCell::new(Vec::new()) };
}

/// Sends `method target` with `headers` and `body` to `addr` and reads the answer, at
/// most `limit` body bytes (more is an error: the caller asked for something too big to
/// hand on).
pub async fn exchange(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    limit: usize,
) -> io::Result<Answer> {
    let mut request = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\n");
    for (name, value) in headers {
        if value.contains(['\r', '\n']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a header value holds a line break",
            ));
        }
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    if let Some(body) = body {
        bytes.extend_from_slice(body);
    }
    let idle = IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        idle.retain(|(_, _, since)| since.elapsed() < IDLE_REUSE);
        let at = idle.iter().rposition(|(a, _, _)| *a == addr)?;
        Some(idle.swap_remove(at).1)
    });
    if let Some(stream) = idle {
        // A pooled connection that answers nothing at all is sent the request again on
        // a new one only for a GET: a request that changes something might have run.
        if let Some(answer) = send(stream, bytes.clone(), limit).await? {
            return Ok(answer);
        }
        if method != "GET" {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection closed before an answer",
            ));
        }
    }
    let stream = TcpStream::connect(addr).await?;
    let _ = stream.set_nodelay(true);
    send(stream, bytes, limit).await?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the connection closed before an answer",
        )
    })
}

/// One request on `stream` and its answer; `None` when the connection failed or closed
/// before a single byte came back (then no handler saw the request). A connection the
/// answer leaves open goes back to the pool.
async fn send(mut stream: TcpStream, bytes: Vec<u8>, limit: usize) -> io::Result<Option<Answer>> {
    let addr = stream.peer_addr()?;
    let (written, _) = stream.write_all(bytes).await;
    if written.is_err() {
        return Ok(None);
    }
    let mut received: Vec<u8> = Vec::with_capacity(16 * 1024);
    loop {
        if let Some(answer) = parse(&received, limit)? {
            let reusable = !answer
                .header("connection")
                .is_some_and(|v| v.eq_ignore_ascii_case("close"));
            if reusable {
                IDLE.with(|idle| {
                    let mut idle = idle.borrow_mut();
                    if idle.len() < IDLE_PER_THREAD {
                        idle.push((addr, stream, std::time::Instant::now()));
                    }
                });
            }
            return Ok(Some(answer));
        }
        let chunk = Vec::with_capacity(64 * 1024);
        let (read, chunk) = stream.read(chunk).await;
        let read = match read {
            Err(_) if received.is_empty() => return Ok(None),
            other => other?,
        };
        if read == 0 {
            if received.is_empty() {
                return Ok(None);
            }
            return finish_at_close(&received, limit).map(Some);
        }
        received.extend_from_slice(&chunk);
        if received.len() > limit + 64 * 1024 {
            return Err(too_big(limit));
        }
    }
}

fn too_big(limit: usize) -> io::Error {
    io::Error::other(format!("the answer is larger than {limit} bytes"))
}

/// The answer once the head and all of a `Content-Length` body are in `received`.
fn parse(received: &[u8], limit: usize) -> io::Result<Option<Answer>> {
    let Some((status, headers, body_at)) = head(received)? else {
        return Ok(None);
    };
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.trim().parse::<usize>().ok());
    let Some(length) = length else {
        return Ok(None);
    };
    if length > limit {
        return Err(too_big(limit));
    }
    if received.len() < body_at + length {
        return Ok(None);
    }
    Ok(Some(Answer {
        status,
        headers,
        body: received[body_at..body_at + length].to_vec(),
    }))
}

fn finish_at_close(received: &[u8], limit: usize) -> io::Result<Answer> {
    let (status, headers, body_at) = head(received)?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the connection closed before an answer",
        )
    })?;
    let body = received[body_at..].to_vec();
    if body.len() > limit {
        return Err(too_big(limit));
    }
    Ok(Answer {
        status,
        headers,
        body,
    })
}

type Head = (u16, Vec<(String, String)>, usize);

fn head(received: &[u8]) -> io::Result<Option<Head>> {
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut slots);
    match response.parse(received) {
        Ok(httparse::Status::Complete(at)) => {
            let headers = response
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            Ok(Some((response.code.unwrap_or(0), headers, at)))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad answer head: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_to_their_length() {
        let whole =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        assert!(parse(&whole[..whole.len() - 1], 100).unwrap().is_none());
        let answer = parse(whole, 100).unwrap().unwrap();
        assert_eq!((answer.status, answer.body.as_slice()), (200, &b"{}"[..]));
        assert_eq!(answer.header("content-type"), Some("application/json"));
        assert!(parse(whole, 1).is_err(), "over the limit");
        let closed = finish_at_close(b"HTTP/1.1 404 Not Found\r\n\r\nnope", 100).unwrap();
        assert_eq!((closed.status, closed.body.as_slice()), (404, &b"nope"[..]));
    }
}
