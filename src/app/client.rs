//! The in-process client: a request driven through the real dispatcher from memory. It
//! takes every step a request on a socket takes (the head's framing rules, route,
//! authenticate, authorize, rate limit, body limits, the handler, the error envelope of
//! the route, the group's headers), because it is the same [`ApiService`] driven by
//! `http::memory` in place of a connection; only the socket is missing.
//!
//! It runs on a monoio runtime, as handlers need a worker's I/O driver: on a worker
//! (the MCP endpoint calls routes through it), or in a unit test on the runtime
//! `runtime::block_on` builds (`crate::testing` sets one up with the builtin routes).

use std::io;
use std::sync::{Arc, OnceLock};

use super::dispatch::ApiService;
use super::state::AppState;
use crate::api::Listener;
use crate::runtime::shutdown::Shutdown;

pub use crate::http::memory::{Answer, Request};

/// The dispatcher of one listener, called from memory.
pub struct InProcess {
    service: ApiService,
}

impl InProcess {
    /// The API port's dispatcher over `state`.
    pub fn new(state: Arc<AppState>) -> InProcess {
        InProcess::on(state, Listener::Api)
    }

    /// The dispatcher of `listener`'s port (the k8s_runtime port has its own routes).
    /// The PTY port's WebSocket needs a socket and is not served.
    pub fn on(state: Arc<AppState>, listener: Listener) -> InProcess {
        // Requests served in-process count toward no drain: the caller's own request
        // does, and it waits for them.
        static DETACHED: OnceLock<Arc<Shutdown>> = OnceLock::new();
        let shutdown = DETACHED.get_or_init(Arc::default).clone();
        InProcess {
            service: ApiService::new(state, shutdown, listener),
        }
    }

    /// The API port's dispatcher for requests the server makes itself as identity
    /// `id` (an automation's run): admitted as that identity is in the policy now (its
    /// scopes, its rules), with no credential; refused 401 when the policy no longer
    /// has it.
    pub fn acting_as(state: Arc<AppState>, id: &str) -> InProcess {
        let mut client = InProcess::new(state);
        client.service = client.service.acting_as(id);
        client
    }

    /// Serves `request` and hands back the answer, its body not yet taken (collect it
    /// with [`Answer::body`], or take it piece by piece with [`Answer::next`]). `Err`
    /// where a socket would end without an answer: a line break in the head, a body
    /// shorter or longer than its framing says.
    pub async fn send(&self, request: Request) -> io::Result<Answer> {
        crate::http::memory::serve(&self.service, request).await
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Request;
    use crate::testing::{run, TestApp};

    #[test]
    fn health_is_answered_without_a_socket() {
        let app = TestApp::new();
        run(async {
            let reply = app.get("/health").await;
            assert_eq!(reply.status, 200);
            assert_eq!(
                reply.header("content-type"),
                Some(crate::http::JSON_CONTENT_TYPE)
            );
            assert_eq!(reply.json(), json!({"status": "ok"}));
            // A trailing slash is the same route, as on a socket.
            assert_eq!(app.get("/health/").await.status, 200);
        });
    }

    #[test]
    fn an_unknown_path_is_the_contracts_404() {
        let app = TestApp::new();
        run(async {
            let reply = app.get("/no/such/route").await;
            assert_eq!(reply.status, 404);
            assert_eq!(
                reply.json(),
                json!({"error": "Not found: /no/such/route", "type": "ValueError"})
            );
            // The engine's own refusals happen too: an HTTP/1.1 head needs a Host (the
            // client adds one unless told otherwise), a method must be one we serve.
            let refused = app.request("PUT", "/health", &[], b"").await;
            assert_eq!(refused.status, 405);
            assert_eq!(refused.header("allow"), Some("GET, POST, DELETE"));
            let answer = app
                .send(Request::new("GET", "/health").header("Content-Length", "x"))
                .await;
            assert_eq!((answer.status, answer.close), (400, true));
        });
    }

    #[test]
    fn a_configured_token_is_required() {
        let app = TestApp::builder().token("s3cret").build();
        run(async {
            let reply = app.get("/files/list?path=.").await;
            assert_eq!(reply.status, 401, "{}", reply.json());
            assert_eq!(reply.json()["type"], "AuthError");
            let wrong = app
                .request(
                    "GET",
                    "/files/list?path=.",
                    &[("X-Access-Token", "nope")],
                    b"",
                )
                .await;
            assert_eq!(wrong.status, 401);
            let right = app
                .request(
                    "GET",
                    "/files/list?path=.",
                    &[("Authorization", "Bearer s3cret")],
                    b"",
                )
                .await;
            assert_eq!(right.status, 200, "{}", right.json());
            // /health needs none.
            assert_eq!(app.get("/health").await.status, 200);
        });
    }

    #[test]
    fn a_body_over_the_limit_is_413() {
        let app = TestApp::builder()
            .config(|config| config.max_upload_size = 1024)
            .build();
        run(async {
            let raw = [("Content-Type", "application/octet-stream")];
            let target = "/files/upload-stream?path=big.bin";
            let reply = app.request("POST", target, &raw, &[7u8; 2048]).await;
            assert_eq!(reply.status, 413);
            assert_eq!(reply.json()["code"], "payload_too_large");
            assert_eq!(
                reply.json()["error"],
                "Request body too large: the limit is 1024 bytes"
            );
            // Chunked, the size is known only as the chunks arrive.
            let mut chunked = format!("{:x}\r\n", 2048).into_bytes();
            chunked.extend_from_slice(&[7u8; 2048]);
            chunked.extend_from_slice(b"\r\n0\r\n\r\n");
            let headers = [raw[0], ("Transfer-Encoding", "chunked")];
            let reply = app.request("POST", target, &headers, &chunked).await;
            assert_eq!(reply.status, 413);
            assert_eq!(reply.json()["code"], "payload_too_large");
            assert!(!app.base().join("big.bin").exists());
            // A JSON body's limit is the contract's 10 MiB.
            let json = vec![b' '; crate::config::MAX_JSON_BODY + 1];
            let reply = app.request("POST", "/shell", &[], &json).await;
            assert_eq!(reply.status, 413);
            assert_eq!(reply.json()["code"], "payload_too_large");
        });
    }

    /// A request the server makes for an identity is admitted as the policy has that
    /// identity now: its scopes hold, and an identity the policy lacks is refused.
    #[test]
    fn requests_made_for_an_identity_are_that_identitys_own() {
        use sha2::{Digest, Sha256};
        let digest = |token: &str| -> String {
            Sha256::digest(token.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        };
        let policy = json!({
            "endpoints": {"files_list": {"scopes": ["files:read"]}, "system_info": {"scopes": ["system:read"]}},
            "identities": [
                {"id": "reader", "scopes": ["files:read"], "token_sha256": digest("reader-token")},
                {"id": "admin", "scopes": ["*"], "token_sha256": digest("admin-token")},
            ],
        });
        let app = TestApp::builder().policy(&policy.to_string()).build();
        run(async {
            let status = |id: &'static str, target: &'static str| {
                let client = app.acting_as(id);
                async move {
                    let answer = client.send(Request::new("GET", target)).await.unwrap();
                    let status = answer.status;
                    let body: serde_json::Value =
                        serde_json::from_slice(&answer.body(1 << 20).await.unwrap()).unwrap();
                    (status, body)
                }
            };
            // No credential is sent: the identity itself is admitted, within its scopes.
            assert_eq!(status("reader", "/files/list?path=.").await.0, 200);
            let (refused, body) = status("reader", "/system/info").await;
            assert_eq!(refused, 403, "{body}");
            // An identity with every scope.
            assert_eq!(status("admin", "/system/info").await.0, 200);
            // Nobody the policy names: 401, and no anonymous fallback with tokens.
            let (unknown, body) = status("mallory", "/files/list?path=.").await;
            assert_eq!(unknown, 401, "{body}");
            assert_eq!(body["code"], "unknown_identity");
            assert_eq!(status("anonymous", "/files/list?path=.").await.0, 401);
            // The plain client still needs a credential.
            assert_eq!(app.get("/files/list?path=.").await.status, 401);
        });
        // In local mode the anonymous caller is the one identity.
        let local = TestApp::new();
        run(async {
            let answer = local
                .acting_as("anonymous")
                .send(Request::new("GET", "/health"))
                .await
                .unwrap();
            assert_eq!(answer.status, 200);
        });
    }

    #[test]
    fn v1_routes_refuse_in_openais_envelope() {
        let off = TestApp::new();
        let on = TestApp::builder()
            .policy("groups: {agents: true}\n")
            .build();
        run(async {
            // The group is opt-in: off, the dispatcher's refusal is OpenAI's shape.
            let reply = off.post("/v1/responses", &json!({"input": "hi"})).await;
            assert_eq!(reply.status, 404);
            assert_eq!(reply.header("x-agent-sandbox-local"), Some("1"));
            let error = &reply.json()["error"];
            assert_eq!(error["code"], "endpoint_disabled", "{error}");
            assert_eq!(error["type"], "not_found_error");

            let reply = on.post("/v1/responses/input_tokens", &json!({})).await;
            assert_eq!(reply.status, 404);
            assert_eq!(reply.header("x-agent-sandbox-local"), Some("1"));
            assert_eq!(reply.header("x-should-retry"), Some("false"));
            let body = reply.json();
            assert_eq!(body["error"]["code"], "agents.not_implemented_locally");
            assert_eq!(body["error"]["type"], "not_found_error");
            assert!(body["error"].as_object().unwrap().contains_key("param"));
            // The engine's refusal of the route's body is worded as the route words its
            // errors.
            let json = vec![b' '; crate::config::MAX_JSON_BODY + 1];
            let reply = on.request("POST", "/v1/responses", &[], &json).await;
            assert_eq!(reply.status, 413);
            assert_eq!(reply.header("x-agent-sandbox-local"), Some("1"));
            assert_eq!(reply.json()["error"]["code"], "payload_too_large");
            assert_eq!(reply.json()["error"]["type"], "invalid_request_error");
        });
    }

    #[test]
    fn a_file_goes_up_and_comes_back() {
        let app = TestApp::new();
        // Over two of the sink's pieces, so the body reaches it in several.
        let data: Vec<u8> = (0..600 * 1024).map(|i| (i * 7 % 251) as u8).collect();
        run(async {
            let reply = app
                .request(
                    "POST",
                    "/files/upload-stream?path=dir/data.bin",
                    &[("Content-Type", "application/octet-stream")],
                    &data,
                )
                .await;
            assert_eq!(reply.status, 200, "{}", reply.json());
            assert_eq!(reply.json()["bytes"], data.len());
            assert_eq!(
                std::fs::read(app.base().join("dir/data.bin")).unwrap(),
                data
            );

            // The raw download is a stream of known length, taken piece by piece.
            let mut answer = app
                .send(Request::new(
                    "GET",
                    "/files/download-stream?path=dir/data.bin&raw=true",
                ))
                .await;
            assert_eq!(answer.status, 200);
            assert!(answer.is_streamed());
            assert_eq!(answer.length(), Some(data.len() as u64));
            let mut back = Vec::new();
            let mut pieces = 0;
            while let Some(piece) = answer.next().await.unwrap() {
                back.extend_from_slice(&piece);
                pieces += 1;
            }
            assert_eq!(back, data);
            assert!(pieces > 1, "{pieces}");

            // And the base64 pair.
            let reply = app
                .post(
                    "/upload",
                    &json!({"path": "note.txt", "content_base64": "aMOpbGxvCg=="}),
                )
                .await;
            assert_eq!(reply.status, 200, "{}", reply.json());
            let reply = app.get("/download?path=note.txt").await;
            assert_eq!(reply.status, 200);
            assert_eq!(reply.json()["content_base64"], "aMOpbGxvCg==");
        });
    }

    #[test]
    fn server_sent_events_are_taken_as_they_come() {
        let app = TestApp::new();
        run(async {
            let request = Request::new("POST", "/shell/stream")
                .header("Content-Type", "application/json")
                .body(json!({"command": "echo via-memory"}).to_string());
            let mut answer = app.send(request).await;
            assert_eq!(answer.status, 200);
            assert_eq!(answer.header("content-type"), Some("text/event-stream"));
            assert_eq!(answer.length(), None);
            let mut events = String::new();
            while let Some(piece) = answer.next().await.unwrap() {
                events.push_str(std::str::from_utf8(&piece).unwrap());
            }
            assert!(events.contains("via-memory"), "{events}");
            assert!(events.contains("event: exit"), "{events}");
        });
    }
}
