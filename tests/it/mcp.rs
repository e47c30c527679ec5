//! `/mcp` against the real binary, driven by the official `mcp` SDK
//! (`tests/fixtures/mcp_client.py`, the version `src/pins.env` names, from `.tools/venv`)
//! and by raw HTTP for the transport's refusals.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::on_both_drivers;
use crate::support::{tools, Launch, Server, TempDir};

fn client(server: &Server, token: &str, mode: &str) -> Command {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_client.py");
    let mut command = Command::new(&tools().python);
    command
        .arg(script)
        .arg(format!("http://{}/mcp", server.addr))
        .arg(token)
        .arg(mode);
    command
}

fn walk(server: &Server, token: &str) -> Value {
    let output = client(server, token, "walk").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("the client's JSON")
}

fn names(tools: &Value) -> Vec<String> {
    tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

/// The tools are the routes (ids, declared parameters as `inputSchema`), the commands
/// and the text variants; a call takes the route's own path, a refusal is an `isError`
/// result with the route's error JSON, streams are not tools.
fn tools_are_the_routes_and_calls_take_their_path(driver: &'static str) {
    let server = Launch::example(driver).start();
    let seen = walk(&server, "");
    assert_eq!(seen["version"], "2025-11-25");
    let tools = names(&seen["tools"]);
    for expected in [
        "files_stat",
        "shell",
        "upload",
        "download_text",
        "upload_text",
        "command_hello",
    ] {
        assert!(
            tools.contains(&expected.to_string()),
            "{expected} missing: {tools:?}"
        );
    }
    for streaming in [
        "shell_stream",
        "files_watch",
        "mcp",
        "mcp_events",
        "pty_connect",
    ] {
        assert!(
            !tools.contains(&streaming.to_string()),
            "{streaming} is listed"
        );
    }
    // The schema is the declared parameters, the same source as /capabilities.
    let caps = server.get("/capabilities").json();
    let declared = &caps["endpoints"]["files_search"]["params"];
    let schema = &seen["schemas"]["files_search"];
    assert!(!declared.as_object().unwrap().is_empty());
    for (name, param) in declared.as_object().unwrap() {
        let name = name.as_str();
        assert_eq!(schema["properties"][name]["type"], param["type"], "{name}");
        let required = schema["required"]
            .as_array()
            .unwrap()
            .contains(&json!(name));
        assert_eq!(required, param["required"] == true, "{name}");
    }
    assert_eq!(seen["stat"]["is_error"], false, "{seen}");
    assert_eq!(seen["stat"]["structured"]["type"], "directory");
    assert_eq!(seen["outside"]["is_error"], true);
    assert_eq!(seen["outside"]["structured"]["code"], "path_not_allowed");
    assert_eq!(seen["read"]["structured"]["content"], "h\u{e9}llo\n");
    assert_eq!(
        std::fs::read_to_string(server.base_dir().join("notes/a.txt")).unwrap(),
        "h\u{e9}llo\n"
    );
    assert_eq!(seen["shell"]["structured"]["stdout"], "via-mcp\n");
    assert_eq!(seen["command"]["structured"]["result"], "Hello, MCP!");
    assert_eq!(seen["no_such_tool"]["code"], -32602);
    assert_eq!(seen["shell_stream"]["code"], -32602);
    // The text block carries the same JSON.
    let text: Value = serde_json::from_str(seen["stat"]["text"][0].as_str().unwrap()).unwrap();
    assert_eq!(text, seen["stat"]["structured"]);
}

fn mcp_post(server: &Server, headers: &[(&str, &str)], body: Value) -> crate::support::Reply {
    let mut all = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    all.extend_from_slice(headers);
    server.request("POST", "/mcp", &all, Some(body.to_string().as_bytes()))
}

fn initialize(server: &Server, token: &str) -> String {
    initialize_at(server, token, "2025-06-18")
}

fn initialize_at(server: &Server, token: &str, version: &str) -> String {
    let auth = format!("Bearer {token}");
    let reply = mcp_post(
        server,
        &[("Authorization", &auth)],
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["result"]["protocolVersion"], version);
    reply
        .header("mcp-session-id")
        .expect("a session id")
        .to_string()
}

/// Credentials before JSON-RPC; a policy-disabled endpoint is absent and refused; a
/// scoped identity's tools are what `/capabilities` allows it; sessions belong to the
/// identity that opened them and end with DELETE.
fn policy_scopes_and_sessions(driver: &'static str) {
    let dir = TempDir::new("mcp-policy");
    let policy = dir.path().join("policy.json");
    let digest = |token: &str| {
        use sha2::Digest;
        sha2::Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    std::fs::write(
        &policy,
        json!({
            "endpoints": {"files_stat": {"enabled": false}, "shell": {"scopes": ["exec"]}, "files_list": {"scopes": ["files:read"]}},
            "identities": [
                {"id": "reader", "scopes": ["files:read"], "token_sha256": digest("reader-token")},
                {"id": "admin", "scopes": ["*"], "token_sha256": digest("admin-token")},
            ],
        })
        .to_string(),
    )
    .unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    // No credentials: 401 before any JSON-RPC is read.
    let reply = mcp_post(
        &server,
        &[],
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}),
    );
    assert_eq!(reply.status, 401, "{}", reply.text());
    assert!(reply.json().get("jsonrpc").is_none());

    let reader = walk(&server, "reader-token");
    let tools = names(&reader["tools"]);
    assert!(
        !tools.contains(&"files_stat".to_string()),
        "a disabled endpoint is no tool"
    );
    assert!(
        !tools.contains(&"shell".to_string()),
        "a scope the reader lacks"
    );
    assert!(tools.contains(&"files_list".to_string()));
    assert_eq!(reader["stat"]["is_error"], true, "{}", reader["stat"]);
    assert_eq!(reader["stat"]["structured"]["code"], "endpoint_disabled");
    assert_eq!(reader["shell"]["structured"]["code"], "missing_scope");
    // The list is exactly what /capabilities allows this caller, streams left out.
    let caps = server
        .request(
            "GET",
            "/capabilities",
            &[("Authorization", "Bearer reader-token")],
            None,
        )
        .json();
    let mut allowed: Vec<String> = caps["endpoints"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, e)| {
            e["allowed"] == true
                && e["streaming"] == false
                && e["group"] != "mcp"
                && e["method"] != "WS"
        })
        .map(|(id, _)| id.clone())
        .collect();
    // The text tools stand for the routes they use, with their scopes.
    for (tool, route) in [("download_text", "download"), ("upload_text", "upload")] {
        if allowed.iter().any(|id| id == route) {
            allowed.push(tool.to_string());
        }
    }
    let mut listed = tools.clone();
    listed.sort();
    allowed.sort();
    assert_eq!(listed, allowed);
    let admin = walk(&server, "admin-token");
    assert!(names(&admin["tools"]).contains(&"shell".to_string()));

    // Sessions: another identity's id is unknown; DELETE ends one.
    let session = initialize(&server, "admin-token");
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let with = |token: &str| {
        let auth = format!("Bearer {token}");
        mcp_post(
            &server,
            &[
                ("Authorization", &auth),
                ("Mcp-Session-Id", &session),
                ("MCP-Protocol-Version", "2025-06-18"),
            ],
            list.clone(),
        )
    };
    assert_eq!(with("admin-token").status, 200);
    assert_eq!(with("reader-token").status, 404);
    let reply = mcp_post(
        &server,
        &[("Authorization", "Bearer admin-token")],
        list.clone(),
    );
    assert_eq!(reply.status, 400, "no session header: {}", reply.text());
    let reply = mcp_post(
        &server,
        &[
            ("Authorization", "Bearer admin-token"),
            ("Mcp-Session-Id", &session),
            ("MCP-Protocol-Version", "1999-01-01"),
        ],
        list.clone(),
    );
    assert_eq!(reply.status, 400, "an unserved revision: {}", reply.text());
    let notification = mcp_post(
        &server,
        &[
            ("Authorization", "Bearer admin-token"),
            ("Mcp-Session-Id", &session),
        ],
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert_eq!(notification.status, 202);
    let ended = server.request(
        "DELETE",
        "/mcp",
        &[
            ("Authorization", "Bearer admin-token"),
            ("Mcp-Session-Id", &session),
        ],
        None,
    );
    assert_eq!(ended.status, 200, "{}", ended.text());
    assert_eq!(with("admin-token").status, 404, "an ended session");
}

/// A SIGHUP that changes the policy changes the tools, and the session's stream says
/// `notifications/tools/list_changed`.
fn a_reload_changes_the_tools_and_says_so(driver: &'static str) {
    let dir = TempDir::new("mcp-reload");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "endpoints:\n  shell: {enabled: true}\n").unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    let mut child = client(&server, "", "listen")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready: Value = serde_json::from_str(&lines.next().expect("ready").unwrap()).unwrap();
    assert!(names(&ready["ready"]).contains(&"shell".to_string()));
    std::fs::write(&policy, "endpoints:\n  shell: {enabled: false}\n").unwrap();
    let status = Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let after = lines.next().map(|l| l.unwrap()).unwrap_or_default();
    let exit = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(exit.success(), "{after}\n{stderr}");
    let after: Value = serde_json::from_str(&after).unwrap();
    assert!(
        !names(&after["after"]).contains(&"shell".to_string()),
        "{after}"
    );
}

/// The session's stream, quiet while no policy changes, carries a comment after 15 s:
/// the pinned Python SDK reads it with a 300 s timeout and gives it up after two.
#[test]
fn a_quiet_session_stream_gets_keep_alive_comments() {
    use std::io::Write;
    let server = Launch::new("uring").start();
    let reply = mcp_post(
        &server,
        &[],
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let session = reply
        .header("mcp-session-id")
        .expect("a session id")
        .to_string();
    let mut stream = server.connect();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET /mcp HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\nMcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\n\r\n").unwrap();
    let (seen, waited) = crate::support::lines_until_keep_alive(&mut BufReader::new(stream));
    assert!(seen[0].contains(" 200 "), "{seen:?}");
    assert!(
        waited >= std::time::Duration::from_secs(14),
        "a comment after {waited:?}, not after 15 s of quiet"
    );
}

/// One identity opening session after session ends only its own oldest: another
/// identity's session lives on (the bound is per identity, `limits.max_sessions`).
fn sessions_are_bounded_per_identity(driver: &'static str) {
    let policy = json!({
        "auth": {"tokens": [
            {"id": "alice", "scopes": ["*"], "token_env": "ALICE_MCP"},
            {"id": "bob", "scopes": ["*"], "token_env": "BOB_MCP"}
        ]},
        "endpoints": {"mcp": {"limits": {"max_sessions": 5}}}
    });
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", &policy.to_string())
        .env("ALICE_MCP", "alice-token")
        .env("BOB_MCP", "bob-token")
        .start();
    let caps = server
        .request(
            "GET",
            "/capabilities",
            &[("Authorization", "Bearer alice-token")],
            None,
        )
        .json();
    assert_eq!(
        caps["endpoints"]["mcp"]["limits"]["max_sessions"], 5,
        "{}",
        caps["endpoints"]["mcp"]
    );
    let list = |token: &str, session: &str| {
        let auth = format!("Bearer {token}");
        mcp_post(
            &server,
            &[
                ("Authorization", &auth),
                ("Mcp-Session-Id", session),
                ("MCP-Protocol-Version", "2025-06-18"),
            ],
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        )
        .status
    };
    let alice = initialize(&server, "alice-token");
    let bobs: Vec<String> = (0..40).map(|_| initialize(&server, "bob-token")).collect();
    assert_eq!(
        list("alice-token", &alice),
        200,
        "bob's sessions pushed alice's out"
    );
    let live: Vec<bool> = bobs.iter().map(|s| list("bob-token", s) == 200).collect();
    assert_eq!(live.iter().filter(|l| **l).count(), 5, "{live:?}");
    assert!(
        live[35..].iter().all(|l| *l),
        "bob keeps his newest: {live:?}"
    );
}

on_both_drivers!(
    sessions_are_bounded_per_identity,
    tools_are_the_routes_and_calls_take_their_path,
    policy_scopes_and_sessions,
    a_reload_changes_the_tools_and_says_so,
);
