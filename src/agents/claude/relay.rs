//! The model relay: how the model API's key stays out of the model's reach.
//!
//! Claude Code gives its Bash commands its own environment, so a key in the CLI's
//! environment is one `env` away from the model (seen: a tool call printed it). So the
//! server keeps `ANTHROPIC_API_KEY` and `ANTHROPIC_AUTH_TOKEN` out of every child's
//! environment (`process::secrets`, when the agents group may be on), and each Claude
//! Code it starts gets instead `ANTHROPIC_BASE_URL=http://<API address>/v1/agents/model_relay/<capability>`
//! and a placeholder key. The relay's route adds the real key on the way to the real
//! API (the server's own `ANTHROPIC_BASE_URL`, else Anthropic's) and streams the answer
//! back as it comes, so deltas are not held up. The capability is 128 random bits, valid
//! while that CLI runs (a `/v1` turn, a session's process): the model can learn it and
//! reach the model API through it, as the CLI does anyway, never the key. Both the
//! destination and the key are read from the server's environment at start, never from
//! the children's (which `POST /env` changes), so no caller can send the key elsewhere.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::agents::records::new_id;
use crate::agents::webhooks::post::{Conn, Target, Unreachable};
use crate::http::chunked::ChunkedDecoder;

/// The path of the relay's route, before the capability.
pub const PATH: &str = "/v1/agents/model_relay";

/// What the CLI is given as its key: not a secret.
pub const PLACEHOLDER_KEY: &str = "agent-sandbox-model-relay";

/// The variables that carry the model API's key.
pub const KEY_VARS: [&str; 2] = ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"];

/// Headers of the CLI's request passed on (the rest, its placeholder key among them,
/// are not).
pub const PASSED_ON: [&str; 5] = [
    "anthropic-version",
    "anthropic-beta",
    "x-app",
    "user-agent",
    "x-claude-code-session-id",
];

/// The longest head of an answer read.
const MAX_HEAD: usize = 64 * 1024;

/// Where the relay sends, and with what key: from the server's own environment.
#[derive(Clone)]
pub struct Upstream {
    pub base: String,
    /// `x-api-key: <ANTHROPIC_API_KEY>`, or `authorization: Bearer <ANTHROPIC_AUTH_TOKEN>`.
    pub header: (&'static str, String),
}

impl Upstream {
    /// The server's model API, when a key is configured (`ANTHROPIC_API_KEY` or
    /// `ANTHROPIC_AUTH_TOKEN`, kept by `process::secrets`), at `ANTHROPIC_BASE_URL` of
    /// the server's environment at start, else `https://api.anthropic.com`.
    pub fn configured() -> Option<Upstream> {
        static BASE: OnceLock<Option<String>> = OnceLock::new();
        let base = BASE
            .get_or_init(|| std::env::var("ANTHROPIC_BASE_URL").ok())
            .clone()
            .unwrap_or_else(|| "https://api.anthropic.com".into());
        let header = match crate::process::secrets::get("ANTHROPIC_API_KEY") {
            Some(key) => ("x-api-key", key),
            None => (
                "authorization",
                format!(
                    "Bearer {}",
                    crate::process::secrets::get("ANTHROPIC_AUTH_TOKEN")?
                ),
            ),
        };
        Some(Upstream { base, header })
    }
}

fn routes() -> std::sync::MutexGuard<'static, HashMap<String, Upstream>> {
    static ROUTES: OnceLock<Mutex<HashMap<String, Upstream>>> = OnceLock::new();
    ROUTES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// An open capability; closed when dropped (the CLI it was given to is gone).
pub struct Opened(String);

impl Drop for Opened {
    fn drop(&mut self) {
        routes().remove(&self.0);
    }
}

/// Opens a capability to `upstream` and points the CLI's environment at it: its
/// `ANTHROPIC_BASE_URL` is the relay (`relay_base` is this server's `http://host:port`),
/// its key the placeholder.
pub fn open(
    upstream: Upstream,
    relay_base: &str,
    env: &mut Vec<(std::ffi::OsString, std::ffi::OsString)>,
) -> Opened {
    let capability = new_id("");
    routes().insert(capability.clone(), upstream);
    env.retain(|(k, _)| !(k == "ANTHROPIC_BASE_URL" || KEY_VARS.iter().any(|v| k == *v)));
    env.push((
        "ANTHROPIC_BASE_URL".into(),
        format!("{relay_base}{PATH}/{capability}").into(),
    ));
    env.push(("ANTHROPIC_API_KEY".into(), PLACEHOLDER_KEY.into()));
    Opened(capability)
}

/// Where an open capability leads.
pub fn route(capability: &str) -> Option<Upstream> {
    routes().get(capability).cloned()
}

/// The model API's answer: its head now, its body as it comes.
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: AnswerBody,
}

enum Framing {
    Length(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
}

/// The body of an [`Answer`], piece by piece.
pub struct AnswerBody {
    conn: Conn,
    framing: Framing,
    /// Bytes read and not yet handed on (body bytes after the head, chunk framing).
    pending: Vec<u8>,
    done: bool,
}

impl AnswerBody {
    /// The next piece of the body; `None` at its end.
    pub async fn next(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            if self.done {
                return Ok(None);
            }
            if !self.pending.is_empty() {
                if let Some(piece) = self.take()? {
                    return Ok(Some(piece));
                }
            }
            if self.done {
                return Ok(None);
            }
            match self.conn.read().await? {
                Some(bytes) => self.pending.extend_from_slice(&bytes),
                None => {
                    self.done = true;
                    return match self.framing {
                        Framing::UntilClose => Ok(None),
                        _ => Err(std::io::Error::other(
                            "the model API closed before its answer ended",
                        )),
                    };
                }
            }
        }
    }

    /// Body bytes out of `pending`, per the framing; `None` when more must be read.
    fn take(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        match &mut self.framing {
            Framing::UntilClose => Ok(Some(std::mem::take(&mut self.pending))),
            Framing::Length(left) => {
                let n = (*left).min(self.pending.len() as u64) as usize;
                let piece: Vec<u8> = self.pending.drain(..n).collect();
                *left -= n as u64;
                if *left == 0 {
                    self.done = true;
                }
                Ok((!piece.is_empty()).then_some(piece))
            }
            Framing::Chunked(decoder) => {
                let mut out = Vec::new();
                loop {
                    let decoded = decoder
                        .decode(&self.pending, usize::MAX)
                        .map_err(|e| std::io::Error::other(e.message()))?;
                    out.extend_from_slice(&self.pending[decoded.data.clone()]);
                    self.pending.drain(..decoded.consumed);
                    if decoded.done {
                        self.done = true;
                        break;
                    }
                    if decoded.consumed == 0 {
                        break;
                    }
                }
                Ok((!out.is_empty()).then_some(out))
            }
        }
    }
}

/// Sends the CLI's request (`path_and_query` after the base, `headers` it sent that
/// are passed on, `body`) to `upstream` with the key, and reads the answer's head.
pub async fn forward(
    upstream: &Upstream,
    path_and_query: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Answer, Unreachable> {
    let target = Target::parse_any(&upstream.base).map_err(Unreachable)?;
    // The operator's model API may well be on a private network (a gateway, a stub).
    let conn = Conn::open(&target, true).await?;
    exchange(conn, &target, upstream, path_and_query, headers, body).await
}

/// The exchange of [`forward`] over `conn`, a connection to `target`.
async fn exchange(
    mut conn: Conn,
    target: &Target,
    upstream: &Upstream,
    path_and_query: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Answer, Unreachable> {
    let base_path = target.path.trim_end_matches('/');
    let mut request = format!(
        "POST {base_path}{path_and_query} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\nAccept-Encoding: identity\r\n{}: {}\r\n",
        target.authority(),
        body.len(),
        upstream.header.0,
        upstream.header.1,
    );
    for (name, value) in headers {
        if !value.contains(['\r', '\n']) {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    let failed = |e: std::io::Error| Unreachable(format!("the model API at {}: {e}", target.host));
    conn.write_all(bytes).await.map_err(failed)?;
    let mut head = Vec::new();
    let end = loop {
        if let Some(at) = memchr::memmem::find(&head, b"\r\n\r\n") {
            break at;
        }
        if head.len() > MAX_HEAD {
            return Err(Unreachable(
                "the model API's answer head is too long".into(),
            ));
        }
        match conn.read().await.map_err(failed)? {
            Some(bytes) => head.extend_from_slice(&bytes),
            None => return Err(Unreachable("the model API closed without answering".into())),
        }
    };
    let pending = head.split_off(end + 4);
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| Unreachable("the model API's answer is not HTTP".into()))?;
    let mut content_type = "application/json".to_string();
    let (mut length, mut chunked) = (None, false);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-type" => content_type = value.to_string(),
            "content-length" => length = value.parse::<u64>().ok(),
            "transfer-encoding" => chunked |= value.to_ascii_lowercase().contains("chunked"),
            _ => {}
        }
    }
    // Chunked framing wins over a length (RFC 9112 §6.3).
    let framing = match (chunked, length) {
        (true, _) => Framing::Chunked(ChunkedDecoder::new(u64::MAX)),
        (false, Some(n)) => Framing::Length(n),
        (false, None) => Framing::UntilClose,
    };
    let done = matches!(framing, Framing::Length(0));
    Ok(Answer {
        status,
        content_type,
        body: AnswerBody {
            conn,
            framing,
            pending,
            done,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::Arc;

    /// The server's certificate, signed by [`CA`], which the test's client trusts.
    const CERT: &str = include_str!("../../../tests/fixtures/tls/localhost-cert.pem");
    const CA: &str = include_str!("../../../tests/fixtures/tls/test-ca.pem");
    /// A key made for this test only (`tests/fixtures/tls/`), for a certificate nobody
    /// else trusts.
    const KEY: &str = include_str!("../../../tests/fixtures/tls/localhost-key.pem");

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        #[allow(deprecated)]
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// A TLS server on 127.0.0.1 that answers one request with a chunked event stream,
    /// its pieces apart in time; returns its port and what it read.
    fn tls_server() -> (u16, std::sync::mpsc::Receiver<String>) {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = vec![CertificateDer::from_pem_slice(CERT.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(KEY.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (socket, _) = listener.accept().unwrap();
            let connection = rustls::ServerConnection::new(Arc::new(config)).unwrap();
            let mut tls = rustls::StreamOwned::new(connection, socket);
            let mut reader = BufReader::new(&mut tls);
            let mut head = String::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                head.push_str(&line);
                if line == "\r\n" {
                    break;
                }
            }
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            tx.send(format!("{head}{}", String::from_utf8_lossy(&body)))
                .unwrap();
            tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
            for piece in ["event: a\ndata: {}\n\n", "event: b\ndata: {\"x\":1}\n\n"] {
                tls.write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes())
                    .unwrap();
                tls.flush().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            tls.write_all(b"0\r\n\r\n").unwrap();
            tls.flush().unwrap();
            tls.conn.send_close_notify();
            let _ = tls.flush();
        });
        (port, rx)
    }

    #[test]
    fn the_relay_speaks_tls_adds_the_key_and_hands_on_a_chunked_stream() {
        use rustls::pki_types::pem::PemObject;
        let (port, seen) = tls_server();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from_pem_slice(CA.as_bytes()).unwrap())
            .unwrap();
        let config = Arc::new(
            rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        );
        let upstream = Upstream {
            base: format!("https://localhost:{port}/gateway"),
            header: ("x-api-key", "the-real-key".into()),
        };
        let pieces = crate::testing::run(async move {
            let target = Target::parse_any(&upstream.base).unwrap();
            let conn = Conn::open_with(&target, true, config).await.unwrap();
            let headers = [("anthropic-version", "2023-06-01")];
            let mut answer = exchange(
                conn,
                &target,
                &upstream,
                "/v1/messages?beta=true",
                &headers,
                br#"{"stream":true}"#,
            )
            .await
            .unwrap();
            assert_eq!(answer.status, 200);
            assert_eq!(answer.content_type, "text/event-stream");
            let mut pieces = Vec::new();
            while let Some(piece) = answer.body.next().await.unwrap() {
                pieces.push(String::from_utf8(piece).unwrap());
            }
            pieces
        });
        // Each chunk is handed on as it came, its framing gone.
        assert_eq!(
            pieces.concat(),
            "event: a\ndata: {}\n\nevent: b\ndata: {\"x\":1}\n\n"
        );
        assert!(pieces.len() >= 2, "{pieces:?}");
        let request = seen.recv().unwrap();
        assert!(
            request.starts_with("POST /gateway/v1/messages?beta=true HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(request.contains("x-api-key: the-real-key\r\n"), "{request}");
        assert!(
            request.contains("anthropic-version: 2023-06-01\r\n"),
            "{request}"
        );
        assert!(request.ends_with(r#"{"stream":true}"#), "{request}");
    }
}
