//! Webhook endpoints and `POST /v1/files` against the real binary: a receiver on
//! 127.0.0.1 (a thread with a `TcpListener`) gets the signed events, and the test
//! checks each signature itself (HMAC-SHA256 of `<id>.<timestamp>.<payload>` with the
//! key after `whsec_`), the retries of a receiver that fails, a delivery that waits
//! across a restart, the isolation of identities, and the private-address refusal.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::support::{Launch, Server, TempDir};

/// One request the receiver got: its headers (lowercase names), body and arrival.
#[derive(Clone, Debug)]
struct Hit {
    headers: HashMap<String, String>,
    body: Vec<u8>,
    at: Instant,
}

/// A receiver whose answers are `plan` in order, then `then` for every later request.
struct Receiver {
    url: String,
    hits: Arc<Mutex<Vec<Hit>>>,
    /// The status answered once `plan` is used up (changeable while it runs).
    then: Arc<AtomicU16>,
}

fn receiver(plan: &[u16], then: u16) -> Receiver {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let hits: Arc<Mutex<Vec<Hit>>> = Arc::default();
    let then = Arc::new(AtomicU16::new(then));
    let (kept, after) = (hits.clone(), then.clone());
    let plan = plan.to_vec();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                continue;
            }
            let mut headers = HashMap::new();
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':') {
                    headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
                }
            }
            let length = headers
                .get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let n = {
                let mut hits = kept.lock().unwrap();
                hits.push(Hit {
                    headers,
                    body,
                    at: Instant::now(),
                });
                hits.len()
            };
            let status = plan
                .get(n - 1)
                .copied()
                .unwrap_or_else(|| after.load(Ordering::SeqCst));
            let mut stream = reader.into_inner();
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    Receiver { url, hits, then }
}

impl Receiver {
    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// Waits until `n` requests arrived.
    fn wait_for(&self, n: usize, within: Duration) -> Vec<Hit> {
        let deadline = Instant::now() + within;
        loop {
            let hits = self.hits();
            if hits.len() >= n || Instant::now() > deadline {
                return hits;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether `hit` is signed with `secret`, computed here.
fn verify(secret: &str, hit: &Hit) -> bool {
    let key = base64_simd::STANDARD
        .decode_to_vec(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(
        format!(
            "{}.{}.",
            hit.headers["webhook-id"], hit.headers["webhook-timestamp"]
        )
        .as_bytes(),
    );
    mac.update(&hit.body);
    let expected = format!(
        "v1,{}",
        base64_simd::STANDARD.encode_to_string(mac.finalize().into_bytes())
    );
    hit.headers["webhook-signature"] == expected
}

/// A server with the agents group on, identities alice and bob, the state directory
/// `state`, and `env`.
fn server(state: &TempDir, env: &[(&str, &str)]) -> (Server, TempDir) {
    let dir = TempDir::new("webhooks-policy");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "groups: {agents: true}\nidentities:\n  - {id: alice, scopes: [\"*\"], token_env: ALICE_TOKEN}\n  - {id: bob, scopes: [\"agents:use\"], token_env: BOB_TOKEN}\n",
    )
    .unwrap();
    let mut launch = Launch::new("uring")
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .env("ALICE_TOKEN", "alice-secret")
        .env("BOB_TOKEN", "bob-secret")
        .env("ABX_STATE_DIR", state.path().to_str().unwrap());
    for (name, value) in env {
        launch = launch.env(name, value);
    }
    (launch.start(), dir)
}

const LOCAL: [(&str, &str); 2] = [
    ("ABX_AGENTS_ALLOW_PRIVATE_URLS", "1"),
    ("ABX_AGENTS_WEBHOOK_ALLOW_HTTP", "1"),
];

fn call(server: &Server, who: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let bytes = body.map(|b| b.to_string().into_bytes());
    let auth = format!("Bearer {who}-secret");
    let reply = server.request(method, path, &[("Authorization", &auth)], bytes.as_deref());
    (reply.status, reply.json())
}

fn refused(answer: (u16, Value), status: u16, code: &str, param: &str) {
    assert_eq!(answer.0, status, "{}", answer.1);
    assert_eq!(answer.1["error"]["code"], code, "{}", answer.1);
    assert_eq!(answer.1["error"]["param"], param, "{}", answer.1);
}

fn create_endpoint(server: &Server, url: &str, events: &[&str]) -> Value {
    let (status, created) = call(
        server,
        "alice",
        "POST",
        "/v1/webhook_endpoints",
        Some(json!({"url": url, "event_types": events})),
    );
    assert_eq!(status, 200, "{created}");
    created
}

/// A session of alice's (no turn: creating one starts nothing).
fn create_session(server: &Server) -> String {
    let (status, session) = call(
        server,
        "alice",
        "POST",
        "/v1/agents/sessions",
        Some(json!({
            "environment": {"type": "self_hosted", "workspace_directory": "/workspace"},
            "agent": {"model": "stub-model", "instructions": "Follow the script."},
        })),
    );
    assert_eq!(status, 200, "{session}");
    session["id"].as_str().unwrap().to_string()
}

#[test]
fn endpoints_are_managed_signed_and_kept_per_identity() {
    let state = TempDir::new("webhooks-state");
    let (server, _policy) = server(&state, &LOCAL);
    let hook = receiver(&[], 204);

    let (status, types) = call(&server, "alice", "GET", "/v1/webhook_event_types", None);
    assert_eq!(status, 200);
    assert_eq!(
        types["data"],
        json!([
            "agent.session.created",
            "agent.session.in_progress",
            "agent.session.idle",
            "agent.session.failed"
        ])
    );

    let (status, created) = call(
        &server,
        "alice",
        "POST",
        "/v1/webhook_endpoints",
        Some(
            json!({"url": hook.url, "event_types": ["agent.session.idle", "agent.session.idle"], "name": "w"}),
        ),
    );
    assert_eq!(status, 200, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let secret = created["signing_secret"].as_str().unwrap().to_string();
    assert!(id.starts_with("we_") && id.len() == 27, "{id}");
    assert!(secret.starts_with("whsec_"));
    assert_eq!(created["object"], "webhook_endpoint");
    assert_eq!(created["event_types"], json!(["agent.session.idle"]));
    assert_eq!(created["name"], "w");
    assert_eq!(created["signing_secret_hint"], Value::Null);
    assert_eq!(created["x_agent_sandbox"]["local"], true);
    let member = format!("/v1/webhook_endpoints/{id}");

    // The secret is answered once.
    let (_, got) = call(&server, "alice", "GET", &member, None);
    let (_, listed) = call(&server, "alice", "GET", "/v1/webhook_endpoints", None);
    assert_eq!(got["id"], id.as_str());
    assert_eq!(listed["object"], "list");
    assert_eq!(listed["data"][0]["id"], id.as_str());
    for body in [&got, &listed] {
        let text = body.to_string();
        assert!(
            !text.contains(&secret) && !text.contains("\"signing_secret\""),
            "{text}"
        );
    }
    // Nor is it in any file of the state directory.
    for entry in std::fs::read_dir(state.path()).unwrap().flatten() {
        if let Ok(bytes) = std::fs::read(entry.path()) {
            let needle = &secret.as_bytes()[6..];
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle),
                "{:?}",
                entry.path()
            );
        }
    }

    let (status, updated) = call(
        &server,
        "alice",
        "POST",
        &member,
        Some(json!({"event_types": ["agent.session.idle", "agent.session.failed"], "name": "n"})),
    );
    assert_eq!(status, 200, "{updated}");
    assert_eq!(updated["name"], "n");
    assert_eq!(updated["event_types"].as_array().unwrap().len(), 2);
    refused(
        call(
            &server,
            "alice",
            "POST",
            &member,
            Some(json!({"colour": "red"})),
        ),
        400,
        "invalid_request",
        "colour",
    );
    refused(
        call(
            &server,
            "alice",
            "POST",
            &member,
            Some(json!({"event_types": ["agent.session.action_required"]})),
        ),
        400,
        "invalid_request",
        "event_types",
    );

    let (status, rotated) = call(
        &server,
        "alice",
        "POST",
        &format!("{member}/rotate_secret"),
        Some(json!({})),
    );
    assert_eq!(status, 200, "{rotated}");
    let rotated_secret = rotated["signing_secret"].as_str().unwrap().to_string();
    assert_ne!(rotated_secret, secret);
    refused(
        call(
            &server,
            "alice",
            "POST",
            &format!("{member}/rotate_secret"),
            Some(json!({"keep_old_secret_active_for_24_hours": true})),
        ),
        400,
        "invalid_request",
        "keep_old_secret_active_for_24_hours",
    );

    // The test event: sent now, signed with the current secret.
    let (status, tested) = call(
        &server,
        "alice",
        "POST",
        &format!("{member}/test"),
        Some(json!({"event_type": "agent.session.idle"})),
    );
    assert_eq!(status, 200, "{tested}");
    assert_eq!(tested["object"], "webhook_endpoint.test");
    assert_eq!(tested["status_code"], 204);
    assert_eq!(tested["success"], true);
    assert_eq!(tested["webhook_endpoint_id"], id.as_str());
    let hits = hook.hits();
    assert_eq!(hits.len(), 1);
    assert!(verify(&rotated_secret, &hits[0]), "{:?}", hits[0].headers);
    assert!(!verify(&secret, &hits[0]));
    let event: Value = serde_json::from_slice(&hits[0].body).unwrap();
    assert_eq!(event["type"], "agent.session.idle");
    assert_eq!(event["object"], "event");
    assert_eq!(event["id"], hits[0].headers["webhook-id"].as_str());
    assert!(event["id"].as_str().unwrap().starts_with("evt_"));
    assert_eq!(event["id"].as_str().unwrap().len(), 28);
    assert_eq!(event["data"]["environment_type"], "self_hosted");
    assert_eq!(hits[0].headers["content-type"], "application/json");
    refused(
        call(
            &server,
            "alice",
            "POST",
            &format!("{member}/test"),
            Some(json!({"event_type": "nope"})),
        ),
        400,
        "invalid_request",
        "event_type",
    );

    // Another identity sees nothing and touches nothing.
    for (method, path, body) in [
        ("GET", member.clone(), None),
        ("POST", member.clone(), Some(json!({"name": "x"}))),
        ("DELETE", member.clone(), None),
        ("POST", format!("{member}/rotate_secret"), Some(json!({}))),
        (
            "POST",
            format!("{member}/test"),
            Some(json!({"event_type": "agent.session.idle"})),
        ),
    ] {
        refused(
            call(&server, "bob", method, &path, body),
            404,
            "resource_not_found",
            "webhook_endpoint_id",
        );
    }
    let (_, bobs) = call(&server, "bob", "GET", "/v1/webhook_endpoints", None);
    assert_eq!(bobs["data"], json!([]));
    assert_eq!(hook.hits().len(), 1, "bob's test sent nothing");

    // A receiver that cannot be reached is a refusal, not a fake success.
    let dead = create_endpoint(&server, "http://127.0.0.1:9/hook", &["agent.session.idle"]);
    refused(
        call(
            &server,
            "alice",
            "POST",
            &format!(
                "/v1/webhook_endpoints/{}/test",
                dead["id"].as_str().unwrap()
            ),
            Some(json!({"event_type": "agent.session.idle"})),
        ),
        400,
        "agents.webhook_delivery_failed",
        "url",
    );

    // URLs are admitted strictly even with both settings on.
    for url in [
        "https://user:pw@example.com/h",
        "https://example.com/h?token=1",
        "ftp://example.com/h",
    ] {
        refused(
            call(
                &server,
                "alice",
                "POST",
                "/v1/webhook_endpoints",
                Some(json!({"url": url, "event_types": ["agent.session.idle"]})),
            ),
            400,
            "invalid_request",
            "url",
        );
    }

    let (status, deleted) = call(&server, "alice", "DELETE", &member, None);
    assert_eq!(status, 200);
    assert_eq!(deleted["object"], "webhook_endpoint.deleted");
    assert_eq!(deleted["deleted"], true);
    assert_eq!(deleted["id"], id.as_str());
    refused(
        call(&server, "alice", "GET", &member, None),
        404,
        "resource_not_found",
        "webhook_endpoint_id",
    );
}

#[test]
fn a_failing_receiver_gets_the_event_again_until_it_answers_2xx() {
    let state = TempDir::new("webhooks-state");
    let (server, _policy) = server(&state, &LOCAL);
    let hook = receiver(&[500, 500], 200);
    let created = create_endpoint(&server, &hook.url, &["agent.session.created"]);
    let secret = created["signing_secret"].as_str().unwrap();
    let session = create_session(&server);
    let hits = hook.wait_for(3, Duration::from_secs(15));
    assert_eq!(hits.len(), 3, "{hits:?}");
    for hit in &hits {
        assert!(verify(secret, hit));
        assert_eq!(
            hit.headers["webhook-id"], hits[0].headers["webhook-id"],
            "one event"
        );
        let event: Value = serde_json::from_slice(&hit.body).unwrap();
        assert_eq!(event["type"], "agent.session.created");
        assert_eq!(event["data"]["id"], session.as_str());
    }
    // Backoff: 1 s, then 2 s.
    assert!(hits[1].at - hits[0].at >= Duration::from_millis(900));
    assert!(hits[2].at - hits[1].at >= Duration::from_millis(1900));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(hook.hits().len(), 3, "nothing after the 2xx");
}

#[test]
fn a_delivery_waiting_when_the_server_stops_is_sent_after_the_restart() {
    let state = TempDir::new("webhooks-state");
    let hook = receiver(&[], 503);
    let (event_id, secret) = {
        let (server, _policy) = server(&state, &LOCAL);
        let created = create_endpoint(&server, &hook.url, &["agent.session.created"]);
        create_session(&server);
        let hits = hook.wait_for(1, Duration::from_secs(10));
        assert!(!hits.is_empty());
        // Stopped (killed) while the delivery waits for its retry.
        (
            hits[0].headers["webhook-id"].clone(),
            created["signing_secret"].as_str().unwrap().to_string(),
        )
    };
    let before = hook.hits().len();
    hook.then.store(204, Ordering::SeqCst);
    let (_server, _policy) = server(&state, &LOCAL);
    let hits = hook.wait_for(before + 1, Duration::from_secs(15));
    let last = hits.last().unwrap();
    assert!(hits.len() > before, "nothing delivered after the restart");
    assert_eq!(last.headers["webhook-id"], event_id);
    assert!(verify(&secret, last));
}

#[test]
fn private_destinations_need_the_setting() {
    let state = TempDir::new("webhooks-state");
    let (lax, _policy) = server(&state, &[("ABX_AGENTS_WEBHOOK_ALLOW_HTTP", "1")]);
    for url in [
        "http://127.0.0.1:9/h",
        "http://localhost:9/h",
        "http://[::1]:9/h",
        "http://10.0.0.1/h",
        "http://169.254.169.254/h",
    ] {
        let answer = call(
            &lax,
            "alice",
            "POST",
            "/v1/webhook_endpoints",
            Some(json!({"url": url, "event_types": ["agent.session.idle"]})),
        );
        refused(answer.clone(), 400, "invalid_request", "url");
        assert!(
            answer.1["error"]["message"]
                .as_str()
                .unwrap()
                .contains("private"),
            "{}",
            answer.1
        );
    }
    let (strict, _policy2) = server(
        &TempDir::new("webhooks-state"),
        &[("ABX_AGENTS_ALLOW_PRIVATE_URLS", "1")],
    );
    let answer = call(
        &strict,
        "alice",
        "POST",
        "/v1/webhook_endpoints",
        Some(json!({"url": "http://example.com/h", "event_types": ["agent.session.idle"]})),
    );
    refused(answer, 400, "invalid_request", "url");
}

#[test]
fn files_upload_and_file_ids_write_environment_files() {
    let state = TempDir::new("files-state");
    let (server, _policy) = server(&state, &[("ABX_AGENTS_MAX_FILE_BYTES", "16")]);
    let (status, file) = call(
        &server,
        "alice",
        "POST",
        "/v1/files",
        Some(json!({"purpose": "user_data", "filename": "n.txt", "data": "ZnJvbSBibG9i"})),
    );
    assert_eq!(status, 200, "{file}");
    let file_id = file["id"].as_str().unwrap();
    assert!(
        file_id.starts_with("file-") && file_id.len() == 29,
        "{file_id}"
    );
    assert_eq!(file["object"], "file");
    assert_eq!(file["bytes"], 9);
    assert_eq!(file["filename"], "n.txt");
    assert_eq!(file["purpose"], "user_data");
    assert_eq!(file["status"], "processed");
    assert_eq!(
        file["x_agent_sandbox"]["differences"],
        json!(["local_blob"])
    );
    refused(
        call(
            &server,
            "alice",
            "POST",
            "/v1/files",
            Some(json!({"purpose": "assistants", "data": "eA=="})),
        ),
        400,
        "invalid_request",
        "purpose",
    );
    refused(
        call(
            &server,
            "alice",
            "POST",
            "/v1/files",
            Some(
                json!({"purpose": "user_data", "data": base64_simd::STANDARD.encode_to_string([1u8; 17])}),
            ),
        ),
        400,
        "agents.file_too_large",
        "data",
    );

    let (_, environments) = call(&server, "alice", "GET", "/v1/agents/environments", None);
    let environment = environments["data"][0]["id"].as_str().unwrap().to_string();
    let files = format!("/v1/agents/environments/{environment}/files");
    let (status, written) = call(
        &server,
        "alice",
        "POST",
        &files,
        Some(json!({"type": "file_id", "file_id": file_id, "path": "/workspace/n.txt"})),
    );
    assert_eq!(status, 200, "{written}");
    assert_eq!(written["size_bytes"], 9);
    assert_eq!(
        std::fs::read_to_string(server.base_dir().join("n.txt")).unwrap(),
        "from blob"
    );
    for (who, id) in [("alice", "file-abc123"), ("bob", file_id)] {
        refused(
            call(
                &server,
                who,
                "POST",
                &files,
                Some(json!({"type": "file_id", "file_id": id, "path": "/workspace/z"})),
            ),
            400,
            "agents.file_not_found",
            "file.file_id",
        );
    }
    assert!(!server.base_dir().join("z").exists());
}
