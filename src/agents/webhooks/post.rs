//! The outgoing HTTP requests of the agents group: a signed webhook POST, and the MCP
//! relay's exchanges ([`round_trip`]). Plain HTTP/1.1 over a monoio `TcpStream` on the
//! calling thread's driver, with rustls for https (the Mozilla roots of
//! `webpki-roots`, so a container without a CA bundle still verifies). No redirects are
//! followed (a 3xx is the peer's answer). A webhook's exchange has 5 s, and only its
//! status line is read.
//!
//! The destination is checked after resolution: the name is resolved once (on the
//! blocking pool: `getaddrinfo` blocks), every address must be public unless
//! `ABX_AGENTS_ALLOW_PRIVATE_URLS=1`, and the connection goes to a checked address, so
//! a name that resolves differently a moment later cannot reach a private one.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

/// The whole exchange: connect, TLS, request, status line.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Bytes of a response head read at most (only the status line matters).
const MAX_HEAD: usize = 16 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// A webhook URL, taken apart.
#[derive(Clone, Debug)]
pub struct Target {
    pub scheme: Scheme,
    /// Lowercase, without brackets for IPv6.
    pub host: String,
    pub port: u16,
    /// The path (`/` when the URL has none).
    pub path: String,
    /// What `Host:` says.
    authority: String,
}

impl Target {
    /// What `Host:` says.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Refuses what the reference refuses: another scheme, no host, credentials, a
    /// query or a fragment (where tokens end up in logs), a bad port.
    pub fn parse(url: &str) -> Result<Target, String> {
        if url.contains('?') || url.contains('#') {
            return Err("must not contain a query string or fragment".into());
        }
        Target::parse_any(url)
    }

    /// Any http or https URL with a host, a query included (in `path`); for a server
    /// the caller configured (an MCP server's URL), not for a webhook.
    pub fn parse_any(url: &str) -> Result<Target, String> {
        let url = url.split('#').next().unwrap_or_default();
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (Scheme::Https, rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (Scheme::Http, rest)
        } else {
            return Err("must be an http or https URL".into());
        };
        if url.len() > 2048 || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("must be a URL of at most 2048 characters without spaces".into());
        }
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'?' => (&rest[..i], format!("/{}", &rest[i..])),
            Some(i) => (&rest[..i], rest[i..].to_string()),
            None => (rest, "/".to_string()),
        };
        if authority.contains('@') {
            return Err("must not contain credentials".into());
        }
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or("invalid host")?;
                (host, after.strip_prefix(':'))
            }
            None => match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            },
        };
        if host.is_empty() {
            return Err("must be an http or https URL with a host".into());
        }
        let port = match port {
            None => match scheme {
                Scheme::Https => 443,
                Scheme::Http => 80,
            },
            Some(text) => match text.parse::<u16>() {
                Ok(port) if port > 0 && text.bytes().all(|b| b.is_ascii_digit()) => port,
                _ => return Err("invalid port".into()),
            },
        };
        Ok(Target {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
            path,
            authority: authority.to_string(),
        })
    }
}

/// `ABX_AGENTS_ALLOW_PRIVATE_URLS=1`: private and loopback destinations are allowed
/// (tests, a receiver in the same pod).
pub fn allow_private() -> bool {
    std::env::var("ABX_AGENTS_ALLOW_PRIVATE_URLS").as_deref() == Ok("1")
}

/// A host name that is private by its spelling: `localhost`, `*.localhost`, `*.local`,
/// `*.internal`, or a literal address that is not public.
pub fn private_name(host: &str) -> bool {
    let host = host.trim_end_matches('.');
    if host == "localhost"
        || [".localhost", ".local", ".internal"]
            .iter()
            .any(|s| host.ends_with(s))
    {
        return true;
    }
    host.parse::<IpAddr>()
        .is_ok_and(crate::browser::guard::is_private)
}

/// Why a receiver could not be reached (never a status: that is an answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreachable(pub String);

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The addresses to connect to, every one checked (private ones refused unless
/// `private_ok`).
pub async fn resolve(target: &Target, private_ok: bool) -> Result<Vec<SocketAddr>, Unreachable> {
    let (host, port) = (target.host.clone(), target.port);
    let resolved = crate::runtime::file::blocking(move || {
        (host.as_str(), port)
            .to_socket_addrs()
            .map(Iterator::collect::<Vec<_>>)
    })
    .await;
    let addrs = match resolved {
        Ok(Ok(addrs)) if !addrs.is_empty() => addrs,
        _ => return Err(Unreachable("the webhook host does not resolve".into())),
    };
    if !private_ok
        && addrs
            .iter()
            .any(|a| crate::browser::guard::is_private(a.ip()))
    {
        return Err(Unreachable(
            "the webhook host resolves to a private address".into(),
        ));
    }
    Ok(addrs)
}

/// POSTs `payload` (the event `msg_id`) to `url`, signed with `secret` and timestamped
/// now; returns the receiver's status.
pub async fn deliver(
    url: &str,
    secret: &str,
    msg_id: &str,
    payload: &[u8],
) -> Result<u16, Unreachable> {
    let target = Target::parse(url).map_err(|why| Unreachable(format!("url: {why}")))?;
    let timestamp = super::super::objects::now_unix();
    let signature = super::sign(secret, msg_id, timestamp, payload);
    let mut request = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nUser-Agent: agent-sandbox-agents-local\r\nwebhook-id: {msg_id}\r\nwebhook-timestamp: {timestamp}\r\nwebhook-signature: {signature}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        target.path,
        target.authority,
        payload.len()
    )
    .into_bytes();
    request.extend_from_slice(payload);
    match monoio::time::timeout(TIMEOUT, exchange(&target, request)).await {
        Ok(result) => result,
        Err(_) => Err(Unreachable(
            "the webhook receiver did not answer within 5 s".into(),
        )),
    }
}

async fn exchange(target: &Target, request: Vec<u8>) -> Result<u16, Unreachable> {
    let unreachable = || Unreachable("the webhook receiver could not be reached".into());
    let stream = connect(target, allow_private()).await?;
    let head = match target.scheme {
        Scheme::Http => plain(stream, request, &head_complete).await,
        Scheme::Https => tls(stream, &target.host, request, &head_complete).await,
    }
    .map_err(|_| unreachable())?;
    status_of(&head).ok_or_else(|| Unreachable("the webhook receiver's answer is not HTTP".into()))
}

/// A connection to one of `target`'s checked addresses.
async fn connect(target: &Target, private_ok: bool) -> Result<TcpStream, Unreachable> {
    for addr in resolve(target, private_ok).await? {
        if let Ok(stream) = TcpStream::connect_addr(addr).await {
            let _ = stream.set_nodelay(true);
            return Ok(stream);
        }
    }
    Err(Unreachable(format!(
        "{}:{} could not be reached",
        target.host, target.port
    )))
}

/// An answer, read whole.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// Names in lower case, in arrival order.
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

/// Sends `request` (which asks for `Connection: close`) to `target` and reads the whole
/// answer, until the peer closes or `limit` bytes came; a private destination only
/// when `private_ok`.
pub async fn round_trip(
    target: &Target,
    request: Vec<u8>,
    private_ok: bool,
    limit: usize,
) -> Result<Answer, Unreachable> {
    let stream = connect(target, private_ok).await?;
    let enough = |read: &[u8]| read.len() > limit;
    let raw = match target.scheme {
        Scheme::Http => plain(stream, request, &enough).await,
        Scheme::Https => tls(stream, &target.host, request, &enough).await,
    }
    .map_err(|e| Unreachable(format!("the exchange with {} failed: {e}", target.host)))?;
    if raw.len() > limit {
        return Err(Unreachable(format!(
            "{} answered more than {limit} bytes",
            target.host
        )));
    }
    parse_answer(&raw).ok_or_else(|| Unreachable(format!("{}'s answer is not HTTP", target.host)))
}

/// A whole HTTP/1.x answer: its status, headers and body (a chunked body decoded, a
/// `Content-Length` one cut to its length).
pub fn parse_answer(raw: &[u8]) -> Option<Answer> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(at) = response.parse(raw).ok()? else {
        return None;
    };
    let status = response.code?;
    let headers: Vec<(String, String)> = response
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let rest = &raw[at..];
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let body = if find("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        dechunk(rest)?
    } else if let Some(length) = find("content-length").and_then(|l| l.trim().parse::<usize>().ok())
    {
        rest.get(..length)?.to_vec()
    } else {
        rest.to_vec()
    };
    Some(Answer {
        status,
        headers,
        body,
    })
}

/// A chunked body's bytes.
fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = memchr::memmem::find(rest, b"\r\n")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

/// The status of a response head, once its status line is complete.
fn status_of(head: &[u8]) -> Option<u16> {
    let line_end = memchr::memchr(b'\n', head)?;
    let line = std::str::from_utf8(&head[..line_end]).ok()?;
    let mut parts = line.split_whitespace();
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    parts
        .next()?
        .parse::<u16>()
        .ok()
        .filter(|s| (100..1000).contains(s))
}

fn head_complete(head: &[u8]) -> bool {
    memchr::memchr(b'\n', head).is_some() || head.len() >= MAX_HEAD
}

/// Sends `request` and reads until the peer closes or `enough` says so.
async fn plain(
    mut stream: TcpStream,
    request: Vec<u8>,
    enough: &dyn Fn(&[u8]) -> bool,
) -> std::io::Result<Vec<u8>> {
    let (written, _) = stream.write_all(request).await;
    written?;
    let mut head = Vec::new();
    while !enough(&head) {
        let (read, buf) = stream.read(Vec::with_capacity(4096)).await;
        if read? == 0 {
            break;
        }
        head.extend_from_slice(&buf);
    }
    Ok(head)
}

/// A connection to a peer, plain or TLS, for an exchange read piece by piece (the
/// model relay streams what the model API answers as it comes).
pub struct Conn {
    stream: TcpStream,
    tls: Option<Box<rustls::ClientConnection>>,
}

impl Conn {
    /// Connects to one of `target`'s checked addresses (a private one only when
    /// `private_ok`), with TLS for https.
    pub async fn open(target: &Target, private_ok: bool) -> Result<Conn, Unreachable> {
        Conn::open_with(target, private_ok, tls_config()).await
    }

    /// [`Conn::open`] verifying TLS with `config` (tests trust a certificate of their own).
    pub async fn open_with(
        target: &Target,
        private_ok: bool,
        config: Arc<rustls::ClientConfig>,
    ) -> Result<Conn, Unreachable> {
        let stream = connect(target, private_ok).await?;
        let tls = match target.scheme {
            Scheme::Http => None,
            Scheme::Https => {
                let name = rustls::pki_types::ServerName::try_from(target.host.clone())
                    .map_err(|e| Unreachable(format!("{}: {e}", target.host)))?;
                let connection = rustls::ClientConnection::new(config, name)
                    .map_err(|e| Unreachable(format!("{}: {e}", target.host)))?;
                Some(Box::new(connection))
            }
        };
        Ok(Conn { stream, tls })
    }

    pub async fn write_all(&mut self, bytes: Vec<u8>) -> std::io::Result<()> {
        match self.tls.as_mut() {
            None => self.stream.write_all(bytes).await.0.map(drop),
            Some(tls) => {
                tls.writer().write_all(&bytes)?;
                flush(&mut self.stream, tls).await
            }
        }
    }

    /// The next bytes the peer sent (decrypted); `None` once it closed.
    pub async fn read(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let Some(tls) = self.tls.as_mut() else {
            let (read, buf) = self.stream.read(Vec::with_capacity(16 * 1024)).await;
            return Ok((read? > 0).then_some(buf));
        };
        loop {
            let mut plain = Vec::new();
            let mut chunk = [0u8; 16 * 1024];
            loop {
                match tls.reader().read(&mut chunk) {
                    Ok(0) => return Ok((!plain.is_empty()).then_some(plain)),
                    Ok(n) => plain.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
            if !plain.is_empty() {
                return Ok(Some(plain));
            }
            flush(&mut self.stream, tls).await?;
            if !fill(&mut self.stream, tls).await? {
                return Ok(None);
            }
        }
    }
}

fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            // ring's provider (deprecated in 0.23.48 for lacking post-quantum key
            // exchange): aws-lc-rs, which has it, needs cmake and a long C build.
            #[allow(deprecated)]
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = match rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
            {
                Ok(builder) => builder.with_root_certificates(roots).with_no_client_auth(),
                // ring supports the default versions.
                Err(e) => unreachable!("rustls' ring provider refused its defaults: {e}"),
            };
            Arc::new(config)
        })
        .clone()
}

fn io_error(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Sends what rustls has to send.
async fn flush(stream: &mut TcpStream, tls: &mut rustls::ClientConnection) -> std::io::Result<()> {
    while tls.wants_write() {
        let mut out = Vec::new();
        tls.write_tls(&mut out)?;
        let (written, _) = stream.write_all(out).await;
        written?;
    }
    Ok(())
}

/// Reads what the peer sent into rustls; false at the end of the stream.
async fn fill(stream: &mut TcpStream, tls: &mut rustls::ClientConnection) -> std::io::Result<bool> {
    let (read, buf) = stream.read(Vec::with_capacity(16 * 1024)).await;
    if read? == 0 {
        return Ok(false);
    }
    let mut rest: &[u8] = &buf;
    while !rest.is_empty() {
        tls.read_tls(&mut rest)?;
        tls.process_new_packets().map_err(io_error)?;
    }
    Ok(true)
}

async fn tls(
    mut stream: TcpStream,
    host: &str,
    request: Vec<u8>,
    enough: &dyn Fn(&[u8]) -> bool,
) -> std::io::Result<Vec<u8>> {
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(io_error)?;
    let mut tls = rustls::ClientConnection::new(tls_config(), name).map_err(io_error)?;
    tls.writer().write_all(&request)?;
    let mut head = Vec::new();
    loop {
        flush(&mut stream, &mut tls).await?;
        let mut chunk = [0u8; 4096];
        loop {
            match tls.reader().read(&mut chunk) {
                Ok(0) => return Ok(head),
                Ok(n) => head.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        if enough(&head) {
            return Ok(head);
        }
        if !fill(&mut stream, &mut tls).await? {
            return Ok(head);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_come_apart() {
        let t = Target::parse("https://Example.com:8443/a/b").unwrap();
        assert_eq!(
            (t.scheme, t.host.as_str(), t.port, t.path.as_str()),
            (Scheme::Https, "example.com", 8443, "/a/b")
        );
        let t = Target::parse("http://[::1]:9/h").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 9));
        assert_eq!(Target::parse("https://example.com").unwrap().path, "/");
        assert!(private_name("127.0.0.1") && private_name("::1") && private_name("db.internal"));
        assert!(!private_name("example.com") && !private_name("8.8.8.8"));
    }

    #[test]
    fn status_lines_are_read() {
        assert_eq!(status_of(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(status_of(b"HTTP/1.0 500\r\n"), Some(500));
        assert_eq!(status_of(b"SSH-2.0\r\n"), None);
        assert_eq!(status_of(b"HTTP/1.1 2"), None);
    }
}
