//! The agents store across restarts of the real binary: what a server with
//! `ABX_STATE_DIR` kept (a conversation with items, a stored response with its input
//! items) is back, the same and still its owner's alone, after SIGTERM and after
//! `kill -9`; a response that was running when the server was killed is `failed`
//! afterwards, saying why, and its conversation is free; the state directory and the
//! file are private (0700, 0600); and a state directory that cannot hold the file
//! leaves a server that warns and keeps its objects in memory. The CLI is the real
//! codex, talking to the scripted stub of `tests/it/agents.rs` (`SAY`, `SLOW`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::agents::{agents_server, output_text};
use crate::support::{read_event, tools, Server, TempDir};
use crate::upstream::{serve_upstream, Upstream};

/// What `POST /v1/responses` says of a response whose turn the restart cut short.
const STOPPED: &str = "The server stopped while this response was running, so its turn did not finish. Send the request again.";

/// A server of the agents group on `state` (its `ABX_STATE_DIR`) that knows alice and
/// bob (tokens `alice-secret`, `bob-secret`).
fn server_on(upstream: &Upstream, home: &TempDir, state: &Path) -> Server {
    let policy = home.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "groups: {agents: true}\nidentities:\n  - {id: alice, scopes: [\"*\"], token_env: ALICE_TOKEN}\n  - {id: bob, scopes: [\"*\"], token_env: BOB_TOKEN}\n",
    )
    .unwrap();
    agents_server(
        upstream,
        home,
        &[
            ("ABX_STATE_DIR", state.to_str().unwrap()),
            ("ABX_SERVER_POLICY", policy.to_str().unwrap()),
            ("ALICE_TOKEN", "alice-secret"),
            ("BOB_TOKEN", "bob-secret"),
        ],
    )
}

/// `method path` as the identity of `token`: the status and the JSON answer.
fn call(
    server: &Server,
    token: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let auth = format!("Bearer {token}");
    let bytes = body.map(|b| b.to_string().into_bytes());
    let reply = server.request(method, path, &[("Authorization", &auth)], bytes.as_deref());
    assert_eq!(reply.header("x-agent-sandbox-local"), Some("1"), "{path}");
    (reply.status, reply.json())
}

fn alice(server: &Server, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    call(server, "alice-secret", method, path, body)
}

/// Everything alice's objects answer, by path: what a restart must give back.
fn snapshot(server: &Server, paths: &[String]) -> Vec<Value> {
    paths
        .iter()
        .map(|path| {
            let (status, body) = alice(server, "GET", path, None);
            assert_eq!(status, 200, "{path}: {body}");
            body
        })
        .collect()
}

/// The processes the server started (the CLIs of running turns), which a `kill -9` of
/// the server leaves behind in their own process groups.
fn children_of(pid: u32) -> Vec<i32> {
    let mut children = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        children.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    children
}

/// `kill -9` of the server, and of the process groups of the CLIs it ran.
fn kill_9(mut server: Server) {
    let children = children_of(server.child.id());
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    for child in children {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(child),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// SIGTERM, and the server's exit.
fn stop(mut server: Server) {
    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while server.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "SIGTERM did not stop the server");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the server's log has a line with `text` (at startup, or within 2 s).
fn logged(server: &Server, text: &str) -> bool {
    server.startup.iter().any(|l| l.contains(text))
        || std::iter::from_fn(|| server.output.recv_timeout(Duration::from_secs(2)).ok())
            .any(|l| l.contains(text))
}

/// `GET /capabilities` as alice.
fn capabilities(server: &Server) -> Value {
    let reply = server.request(
        "GET",
        "/capabilities",
        &[("Authorization", "Bearer alice-secret")],
        None,
    );
    assert_eq!(reply.status, 200);
    reply.json()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A conversation with items and a stored response (with its input items) are back
/// after SIGTERM and after `kill -9`, the same ids and contents, still alice's alone;
/// the state directory is 0700 and the file 0600.
#[test]
fn objects_survive_sigterm_and_kill_9_and_stay_their_owners() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-store-home");
    let root = TempDir::new("agents-store-state");
    // Missing: the server makes it.
    let state = root.path().join("state");
    let server = server_on(&upstream, &home, &state);
    let (status, conversation) = alice(
        &server,
        "POST",
        "/v1/conversations",
        Some(
            json!({"metadata": {"topic": "kept"}, "items": [{"role": "user", "content": "The code word is PLUM."}]}),
        ),
    );
    assert_eq!(status, 200, "{conversation}");
    let conv = conversation["id"].as_str().unwrap().to_string();
    assert_eq!(
        conversation["x_agent_sandbox"]["differences"],
        json!(["cli_session", "store_limits"])
    );
    let (status, added) = alice(
        &server,
        "POST",
        &format!("/v1/conversations/{conv}/items"),
        Some(
            json!({"items": [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]}),
        ),
    );
    assert_eq!(status, 200, "{added}");
    let (status, response) = alice(
        &server,
        "POST",
        "/v1/responses",
        Some(json!({"input": "SAY kept answer", "conversation": conv, "metadata": {"k": "v"}})),
    );
    assert_eq!(
        (status, output_text(&response)),
        (200, "kept answer".to_string()),
        "{response}"
    );
    assert_eq!(response["status"], "completed");
    let resp = response["id"].as_str().unwrap().to_string();
    let (status, loose) = alice(
        &server,
        "POST",
        "/v1/responses",
        Some(json!({"input": "SAY on its own"})),
    );
    assert_eq!(status, 200, "{loose}");
    let loose = loose["id"].as_str().unwrap().to_string();
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("agents.redb")), 0o600);

    let paths = [
        format!("/v1/conversations/{conv}"),
        format!("/v1/conversations/{conv}/items?order=asc"),
        format!(
            "/v1/conversations/{conv}/items/{}",
            added["data"][0]["id"].as_str().unwrap()
        ),
        format!("/v1/responses/{resp}"),
        format!("/v1/responses/{resp}/input_items"),
        format!("/v1/responses/{loose}"),
        "/v1/conversations/{conv}/items?limit=2".replace("{conv}", &conv),
    ];
    let before = snapshot(&server, &paths);
    // Five items: the one it started with, two added, the turn's input and answer.
    assert_eq!(
        before[1]["data"].as_array().unwrap().len(),
        5,
        "{}",
        before[1]
    );
    assert_eq!(
        before[3], response,
        "a stored response answers as it was answered"
    );
    let bobs = |server: &Server| {
        for path in &paths {
            let (status, body) = call(server, "bob-secret", "GET", path, None);
            assert_eq!(status, 404, "{path}: {body}");
            assert_eq!(body["error"]["type"], "not_found_error");
        }
        let (status, list) = call(
            server,
            "bob-secret",
            "GET",
            "/v1/conversations/x/items",
            None,
        );
        assert_eq!(status, 404, "{list}");
    };
    bobs(&server);

    stop(server);
    let server = server_on(&upstream, &home, &state);
    assert_eq!(snapshot(&server, &paths), before, "after SIGTERM");
    bobs(&server);
    // Written after the restart, then killed: kept too.
    let (status, more) = alice(
        &server,
        "POST",
        &format!("/v1/conversations/{conv}/items"),
        Some(json!({"items": [{"role": "user", "content": "after the restart"}]})),
    );
    assert_eq!(status, 200, "{more}");
    let (status, updated) = alice(
        &server,
        "POST",
        &format!("/v1/conversations/{conv}"),
        Some(json!({"metadata": {"topic": "changed"}})),
    );
    assert_eq!(status, 200, "{updated}");
    let expected = snapshot(&server, &paths);
    kill_9(server);

    let server = server_on(&upstream, &home, &state);
    let after = snapshot(&server, &paths);
    assert_eq!(after, expected, "after kill -9");
    assert_eq!(after[0]["metadata"], json!({"topic": "changed"}));
    let texts: Vec<&str> = after[1]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["content"][0]["text"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        texts,
        [
            "The code word is PLUM.",
            "one",
            "two",
            "SAY kept answer",
            "kept answer",
            "after the restart"
        ]
    );
    bobs(&server);
    // The conversation carries on: the turn resumes codex's session from before.
    let (status, next) = alice(
        &server,
        "POST",
        "/v1/responses",
        Some(json!({"input": "SAY still here", "conversation": conv})),
    );
    assert_eq!(
        (status, output_text(&next)),
        (200, "still here".to_string()),
        "{next}"
    );
    let resumed = upstream.seen.lock().unwrap().last().unwrap().to_string();
    assert!(
        resumed.contains("kept answer"),
        "the turn resumed the session of before the restarts"
    );
    // And deleting still deletes.
    let (status, _) = alice(&server, "DELETE", &format!("/v1/responses/{loose}"), None);
    assert_eq!(status, 200);
    stop(server);
    let server = server_on(&upstream, &home, &state);
    assert_eq!(
        alice(&server, "GET", &format!("/v1/responses/{loose}"), None).0,
        404
    );
}

/// A response whose turn was running (the stub never finishes `SLOW`) when the server
/// was killed is `failed` after the restart, with an error that says why, and valid to
/// the pinned SDK; the conversation it ran in is free again.
#[test]
fn a_response_running_at_kill_9_is_failed_after_the_restart() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-store-home");
    let root = TempDir::new("agents-store-state");
    let state = root.path().join("state");
    let server = server_on(&upstream, &home, &state);
    let (status, conversation) = alice(&server, "POST", "/v1/conversations", Some(json!({})));
    assert_eq!(status, 200, "{conversation}");
    let conv = conversation["id"].as_str().unwrap().to_string();
    let mut slow = server.connect();
    let body = json!({"input": "SLOW", "conversation": conv, "stream": true}).to_string();
    write!(
        slow,
        "POST /v1/responses HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer alice-secret\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(slow);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
    }
    let (name, created) = read_event(&mut reader);
    assert_eq!(name, "response.created");
    let id = created["response"]["id"].as_str().unwrap().to_string();
    let (_, running) = alice(&server, "GET", &format!("/v1/responses/{id}"), None);
    assert_eq!(running["status"], "in_progress", "{running}");
    kill_9(server);
    drop(reader);

    let server = server_on(&upstream, &home, &state);
    let (status, failed) = alice(&server, "GET", &format!("/v1/responses/{id}"), None);
    assert_eq!(status, 200, "{failed}");
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(
        failed["error"],
        json!({"code": "server_error", "message": STOPPED})
    );
    assert!(
        logged(&server, "agents: 2 records"),
        "the restart says what it changed: {:?}",
        server.startup
    );
    // Nothing runs it: it cannot be cancelled, and the conversation takes turns again.
    let (status, refused) = alice(
        &server,
        "POST",
        &format!("/v1/responses/{id}/cancel"),
        Some(json!({})),
    );
    assert_eq!(status, 400, "{refused}");
    let (status, added) = alice(
        &server,
        "POST",
        &format!("/v1/conversations/{conv}/items"),
        Some(json!({"items": [{"role": "user", "content": "free again"}]})),
    );
    assert_eq!(status, 200, "the conversation is free: {added}");
    let (status, next) = alice(
        &server,
        "POST",
        "/v1/responses",
        Some(json!({"input": "SAY after", "conversation": conv})),
    );
    assert_eq!(
        (status, output_text(&next)),
        (200, "after".to_string()),
        "{next}"
    );
    // The pinned SDK reads the failed response as its own Response, strictly.
    let check = r#"
import json, sys
import openai
from openai.types.responses import Response
client = openai.OpenAI(base_url=sys.argv[1], api_key="alice-secret")
raw = client.responses.with_raw_response.retrieve(sys.argv[2]).http_response.json()
Response.model_validate(raw, strict=True)
parsed = client.responses.retrieve(sys.argv[2])
assert parsed.status == "failed" and parsed.error.code == "server_error", parsed
print("ok", openai.__version__, parsed.error.message)
"#;
    let output = std::process::Command::new(&tools().python)
        .args(["-c", check, &format!("http://{}/v1", server.addr), &id])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.starts_with("ok") && stdout.contains(STOPPED),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A state directory that cannot be one (a file is where it should be): the server
/// starts, warns in its log and in `/capabilities` why and what to do, and its objects
/// work, in memory.
#[test]
fn an_unusable_state_dir_warns_and_keeps_objects_in_memory() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-store-home");
    let root = TempDir::new("agents-store-state");
    let state = root.path().join("a-file");
    std::fs::write(&state, "not a directory").unwrap();
    let server = server_on(&upstream, &home, &state);
    let caps = capabilities(&server);
    let warning = caps["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find(|w| w.starts_with("agents: the store"))
        .unwrap_or_else(|| panic!("no store warning: {}", caps["warnings"]))
        .to_string();
    let path = state.join("agents.redb");
    for words in [
        path.to_str().unwrap(),
        "in memory",
        "lost when it stops",
        "Point ABX_STATE_DIR at a writable directory",
    ] {
        assert!(warning.contains(words), "{words}: {warning}");
    }
    assert!(
        logged(&server, "warning: agents: the store"),
        "the warning is in the log: {:?}",
        server.startup
    );
    // Objects work, owner-scoped as ever.
    let (status, conversation) = alice(
        &server,
        "POST",
        "/v1/conversations",
        Some(json!({"items": [{"role": "user", "content": "in memory"}]})),
    );
    assert_eq!(status, 200, "{conversation}");
    let conv = conversation["id"].as_str().unwrap();
    let (status, items) = alice(
        &server,
        "GET",
        &format!("/v1/conversations/{conv}/items"),
        None,
    );
    assert_eq!(
        (status, items["data"][0]["content"][0]["text"].clone()),
        (200, json!("in memory"))
    );
    let (status, response) = alice(
        &server,
        "POST",
        "/v1/responses",
        Some(json!({"input": "SAY from memory"})),
    );
    assert_eq!(
        (status, output_text(&response)),
        (200, "from memory".to_string()),
        "{response}"
    );
    let id = response["id"].as_str().unwrap();
    assert_eq!(
        alice(&server, "GET", &format!("/v1/responses/{id}"), None).0,
        200
    );
    assert_eq!(
        call(
            &server,
            "bob-secret",
            "GET",
            &format!("/v1/responses/{id}"),
            None
        )
        .0,
        404
    );
    // A policy reload keeps the warning: it stays true until a restart.
    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let reloaded = std::iter::from_fn(|| server.output.recv_timeout(Duration::from_secs(5)).ok())
        .any(|l| l.contains("SIGHUP: policy reloaded"));
    assert!(reloaded, "the policy was not reloaded");
    let caps = capabilities(&server);
    assert!(
        caps["warnings"].to_string().contains("agents: the store"),
        "{}",
        caps["warnings"]
    );
    // Nothing was written where the state directory should be.
    assert_eq!(std::fs::read_to_string(&state).unwrap(), "not a directory");
}
