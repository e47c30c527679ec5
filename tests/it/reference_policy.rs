//! Policy documents written for the published reference server (`agent-sandbox-server`,
//! its `agent_sandbox.server.policy` schema) against the real binary: the same scopes,
//! sources, presets, refusal bodies and enforced knobs as there.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::on_both_drivers;
use crate::support::{Launch, Reply, Server, TempDir};

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn call(server: &Server, token: &str, method: &str, path: &str, body: Option<Value>) -> Reply {
    let auth = format!("Bearer {token}");
    let body = body.map(|b| b.to_string());
    server.request(
        method,
        path,
        &[("Authorization", auth.as_str())],
        body.as_deref().map(str::as_bytes),
    )
}

/// A narrow identity given as the reference's own JSON document, inline in
/// `ABX_SERVER_POLICY`, is as narrow as there on every route.
fn a_reference_document_governs_every_route(driver: &'static str) {
    let policy = json!({
        "version": 1,
        "description": "written for agent-sandbox-server",
        "auth": {"tokens": [
            {"id": "ci", "scopes": ["files:read"], "token_env": "CI_TOKEN"},
            {"id": "admin", "scopes": ["*"], "token_sha256": sha256_hex("admin-secret")}
        ]},
        "endpoints": {
            "process_signal": {"params": {"allowed_signals": [15]}},
            "shell_stream": {"limits": {"max_output_bytes": 64}},
            "files_*": {"paths": {"deny": ["*.pem"]}},
            "files_list": {"limits": {"max_entries": 3}}
        }
    });
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", &policy.to_string())
        .env("CI_TOKEN", "ci-secret")
        .env("ABX_SERVER_TOKEN", "plain-secret")
        .start();
    std::fs::write(server.base_dir().join("notes.txt"), "hi").unwrap();

    let refused = call(
        &server,
        "ci-secret",
        "POST",
        "/shell",
        Some(json!({"command": "id"})),
    );
    assert_eq!(refused.status, 403);
    assert_eq!(
        refused.json(),
        json!({"error": "Identity 'ci' lacks scope 'process:run' required by endpoint 'shell'",
               "type": "PolicyDenied", "code": "missing_scope", "endpoint": "shell",
               "scope": "process:run", "identity": "ci"})
    );
    let listed = call(&server, "ci-secret", "GET", "/files/list?path=.", None);
    assert_eq!(listed.status, 200, "{}", listed.text());
    // max_entries: the caller's, capped by the policy's (3); one that is not a number
    // is the default, capped likewise.
    for name in ["b.txt", "c.txt", "d.txt", "e.txt"] {
        std::fs::write(server.base_dir().join(name), "x").unwrap();
    }
    for (query, count) in [
        ("", 3),
        ("&max_entries=100", 3),
        ("&max_entries=2", 2),
        ("&max_entries=x", 3),
    ] {
        let listed = call(
            &server,
            "ci-secret",
            "GET",
            &format!("/files/list?path=.{query}"),
            None,
        );
        assert_eq!(
            listed.json()["entries"].as_array().map(Vec::len),
            Some(count),
            "{query}: {}",
            listed.text()
        );
    }

    // Every endpoint the discovery document lists is allowed to `ci` exactly when its
    // scopes are `files:read` (or the implicit `core:read`), and a real request agrees.
    let caps = call(&server, "ci-secret", "GET", "/capabilities", None).json();
    assert_eq!(
        caps["identity"],
        json!({"id": "ci", "scopes": ["files:read"]})
    );
    assert_eq!(
        caps["endpoints"]["files_move"]["scopes"],
        json!(["files:write", "files:delete"])
    );
    assert_eq!(caps["endpoints"]["health"]["scopes"], json!([]));
    assert_eq!(
        caps["endpoints"]["pty_connect"]["scopes"],
        json!(["terminal:use"])
    );
    // A path endpoint discloses how its paths are confined (the deny list by count).
    assert_eq!(
        caps["endpoints"]["files_stat"]["paths"],
        json!({"allow": [], "read_only": false, "deny_count": 1, "symlinks": "within"})
    );
    let endpoints = caps["endpoints"].as_object().unwrap();
    let mut narrow = 0;
    for (id, entry) in endpoints {
        if entry["enabled"] != json!(true) {
            continue;
        }
        let scopes: Vec<&str> = entry["scopes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        let may = scopes
            .iter()
            .all(|s| *s == "files:read" || *s == "core:read");
        assert_eq!(entry["allowed"], json!(may), "{id}: {entry}");
        if !may {
            assert_eq!(entry["reason"], json!("missing_scope"), "{id}");
            narrow += 1;
            let method = entry["method"].as_str().unwrap();
            if method == "WS" {
                continue;
            }
            let path = entry["path"]
                .as_str()
                .unwrap()
                .replace("{pid}", "1")
                .replace("{id}", "x")
                .replace("{name}", "x");
            let body = (method != "GET").then(|| json!({}));
            let reply = call(&server, "ci-secret", method, &path, body);
            assert_eq!(
                (
                    reply.status,
                    reply.json()["code"].clone(),
                    reply.json()["identity"].clone()
                ),
                (403, json!("missing_scope"), json!("ci")),
                "{id}: {method} {path}"
            );
        }
    }
    assert!(
        narrow >= 25,
        "only {narrow} endpoints need more than files:read"
    );

    // A credential comes before any limit: no token and a body over the limit is 401.
    let oversized = server.request("POST", "/shell", &[("Content-Length", "20000000")], None);
    assert_eq!(oversized.status, 401, "{}", oversized.text());
    let oversized = server.request(
        "POST",
        "/shell",
        &[
            ("Content-Length", "20000000"),
            ("Authorization", "Bearer admin-secret"),
        ],
        None,
    );
    assert_eq!(oversized.status, 413);
    // The policy names its tokens: ABX_SERVER_TOKEN is no way in.
    assert_eq!(
        call(&server, "plain-secret", "GET", "/files/list?path=.", None).status,
        401
    );
    // The server's warnings are shown to an identity holding every scope, never to a
    // narrow one (as on the reference, which shows a narrow identity none).
    assert_eq!(
        caps["warnings"],
        json!([]),
        "a narrow identity sees no warnings"
    );
    let admin_caps = call(&server, "admin-secret", "GET", "/capabilities", None).json();
    let warnings = admin_caps["warnings"].to_string();
    assert!(
        warnings.contains("ABX_SERVER_TOKEN is not accepted")
            && warnings.contains("identity holds the wildcard scope '*'"),
        "{warnings}"
    );

    // Knobs the reference enforces.
    let started = call(
        &server,
        "admin-secret",
        "POST",
        "/process/start",
        Some(json!({"command": "sleep 30"})),
    );
    assert_eq!(started.status, 200, "{}", started.text());
    let pid = started.json()["pid"].as_i64().unwrap();
    let kill = call(
        &server,
        "admin-secret",
        "POST",
        &format!("/process/{pid}/signal"),
        Some(json!({"signal": 9})),
    );
    assert_eq!(
        (kill.status, kill.json()["code"].clone()),
        (403, json!("signal_not_allowed"))
    );
    let term = call(
        &server,
        "admin-secret",
        "POST",
        &format!("/process/{pid}/signal"),
        Some(json!({"signal": 15})),
    );
    assert_eq!(term.status, 200, "{}", term.text());
    let env = call(
        &server,
        "admin-secret",
        "POST",
        "/shell",
        Some(json!({"command": "true", "env": {"ABX_SERVER_BASE_DIR": "/"}})),
    );
    assert_eq!(
        (
            env.status,
            env.json()["code"].clone(),
            env.json()["type"].clone()
        ),
        (403, json!("env_var_denied"), json!("PolicyDenied"))
    );
    let own = call(
        &server,
        "admin-secret",
        "POST",
        "/shell",
        Some(json!({"command": "/proc/self/exe --version"})),
    );
    assert_eq!(
        (own.status, own.json()["code"].clone()),
        (403, json!("process_denied"))
    );
    let link = server.base_dir().join("again");
    std::os::unix::fs::symlink("/proc/self/exe", &link).unwrap();
    let own = call(
        &server,
        "admin-secret",
        "POST",
        "/shell",
        Some(json!({"command": link.to_str().unwrap()})),
    );
    assert_eq!(
        (own.status, own.json()["code"].clone()),
        (403, json!("process_denied"))
    );
    let stream = call(
        &server,
        "admin-secret",
        "POST",
        "/shell/stream",
        Some(json!({"command": "seq 1 1000"})),
    );
    let text = stream.text();
    assert!(
        text.contains("event: error\ndata: {\"error\":\"output_limit\"}"),
        "{text}"
    );
    assert!(text.contains("event: exit"), "{text}");
    assert!(!text.contains("\"1000\""), "{text}");
    let denied = call(
        &server,
        "ci-secret",
        "GET",
        "/files/stat?path=keys/server.pem",
        None,
    );
    assert_eq!(
        (denied.status, denied.json()["code"].clone()),
        (403, json!("path_denied"))
    );
}

/// Where a document comes from, and what stops the server.
fn sources_and_refusals(driver: &'static str) {
    let dir = TempDir::new("policy-sources");
    for (doc, says) in [
        (json!({"frobnicate": 1}), "frobnicate: unknown policy key"),
        (
            json!({"endpoints": {"shel": {"enabled": false}}}),
            "unknown endpoint (did you mean 'shell'?)",
        ),
        (
            json!({"endpoints": {"process_list": {"params": {"allowed_signals": [1]}}}}),
            "allowed_signals is not applied by endpoint 'process_list'",
        ),
        (
            json!({"endpoints": {"files_list": {"paths": {"allow": ["/elsewhere"]}}}}),
            "is outside the base directory",
        ),
        (json!({"version": 2}), "version: unsupported 2"),
        (json!({"preset": "lockd"}), "did you mean 'locked'?"),
    ] {
        let (code, stderr) = Launch::new(driver)
            .env("ABX_SERVER_POLICY", &doc.to_string())
            .fail();
        assert_eq!(code, 2, "{doc}: {stderr}");
        assert!(stderr.contains(says), "{doc}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
    let file = dir.path().join("transfer.json");
    std::fs::write(
        &file,
        json!({"preset": "transfer-only", "groups": ["process"]}).to_string(),
    )
    .unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY_FILE", file.to_str().unwrap())
        .start();
    let (status, body) = server.post_json("/shell", json!({"command": "true"}));
    assert_eq!(
        (status, body["code"].clone(), body["rule"].clone()),
        (
            404,
            json!("endpoint_disabled"),
            json!("preset:transfer-only:endpoints.*")
        )
    );
    let (status, _) = server.get_json("/files/download-stream?path=nothing");
    assert_eq!(status, 404, "enabled: the file is missing");
    let (_, caps) = server.get_json("/capabilities");
    assert_eq!(caps["policy"]["preset"], json!("transfer-only"));
    assert_eq!(
        caps["endpoints"]["files_upload_stream"]["enabled"],
        json!(true)
    );
    drop(server);
    // `--policy` beats ABX_SERVER_POLICY, which beats ABX_SERVER_POLICY_FILE.
    let locked = dir.path().join("locked.json");
    std::fs::write(&locked, json!({"preset": "locked"}).to_string()).unwrap();
    let server = Launch::new(driver)
        .arg("--policy")
        .arg(locked.to_str().unwrap())
        .env(
            "ABX_SERVER_POLICY",
            &json!({"preset": "hardened"}).to_string(),
        )
        .env("ABX_SERVER_POLICY_FILE", file.to_str().unwrap())
        .start();
    assert_eq!(
        server.get_json("/capabilities").1["policy"]["preset"],
        json!("locked")
    );
    drop(server);
    let server = Launch::new(driver)
        .env(
            "ABX_SERVER_POLICY",
            &json!({"preset": "hardened"}).to_string(),
        )
        .env("ABX_SERVER_POLICY_FILE", file.to_str().unwrap())
        .start();
    let (_, caps) = server.get_json("/capabilities");
    assert_eq!(caps["policy"]["preset"], json!("hardened"));
    std::fs::write(server.base_dir().join(".env"), "SECRET=1").unwrap();
    let (status, body) = server.get_json("/files/stat?path=.env");
    assert_eq!(
        (status, body["code"].clone()),
        (403, json!("path_denied")),
        "{body}"
    );
    // What a caller may not name, a listing, search or archive does not show, and a
    // directory that holds it cannot be deleted or moved as a whole.
    std::fs::create_dir_all(server.base_dir().join("proj/.ssh")).unwrap();
    std::fs::write(server.base_dir().join("proj/.env"), "TOKEN=1").unwrap();
    std::fs::write(server.base_dir().join("proj/a.txt"), "a").unwrap();
    let listing = server.get("/files/list?path=.&recursive=true").text();
    assert!(
        listing.contains("a.txt") && !listing.contains(".env") && !listing.contains(".ssh"),
        "{listing}"
    );
    let (_, found) = server.post_json("/files/search", json!({"path": ".", "pattern": "*"}));
    let found = found.to_string();
    assert!(
        found.contains("a.txt") && !found.contains(".env"),
        "{found}"
    );
    let (status, archive) = server.post_json(
        "/files/archive",
        json!({"paths": ["proj"], "format": "zip"}),
    );
    assert_eq!(status, 200, "{archive}");
    let zip = base64_simd::STANDARD
        .decode_to_vec(archive["content_base64"].as_str().unwrap())
        .unwrap();
    let names = String::from_utf8_lossy(&zip);
    assert!(
        names.contains("proj/a.txt") && !names.contains(".env"),
        "the archive holds a denied file"
    );
    let reply = server.request("DELETE", "/files?path=proj", &[], None);
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (403, json!("path_denied")),
        "{}",
        reply.text()
    );
    assert!(server.base_dir().join("proj/.env").exists());
    let (status, body) = server.post_json(
        "/files/move",
        json!({"source": "proj", "destination": "elsewhere"}),
    );
    assert_eq!(
        (status, body["code"].clone()),
        (403, json!("path_denied")),
        "{body}"
    );
    let (status, body) = server.get_json("/process/list");
    assert_eq!(
        (status, body["rule"].clone()),
        (404, json!("preset:hardened:groups.process"))
    );
    // The shell's environment does not show how it is governed.
    drop(server);
    let server = Launch::new(driver)
        .env(
            "ABX_SERVER_POLICY",
            &json!({"endpoints": {"commands_run": {"enabled": false}}}).to_string(),
        )
        .env("ABX_SERVER_HOST", "127.0.0.1")
        .start();
    let (status, body) = server.post_json("/commands/hello", json!({}));
    assert_eq!(
        (status, body["endpoint"].clone()),
        (404, json!("run_command")),
        "a former id still names its endpoint"
    );
    let (_, caps) = server.get_json("/capabilities");
    assert!(
        caps["warnings"].to_string().contains("former id"),
        "{}",
        caps["warnings"]
    );
    let (status, body) = server.post_json("/shell", json!({"command": "env"}));
    assert_eq!(status, 200);
    assert!(
        !body["stdout"]
            .as_str()
            .unwrap()
            .contains("ABX_SERVER_POLICY"),
        "{body}"
    );
    // GET /env does not show the server's own settings (ABX_SERVER_*), as the reference.
    let (status, env) = server.get_json("/env");
    assert_eq!(status, 200);
    let names: Vec<&String> = env["variables"].as_object().unwrap().keys().collect();
    assert!(
        names.iter().any(|n| n.as_str() == "ABX_STATE_DIR"),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|n| n.as_str() == "ABX_SERVER_HOST"),
        "{names:?}"
    );
    assert!(
        !names
            .iter()
            .any(|n| n.to_uppercase().starts_with("ABX_SERVER_")),
        "{names:?}"
    );
}

/// `ABX_SERVER_TOKEN` alone is the identity `server`; `allow_anonymous` admits a caller
/// without a credential with `anonymous_scopes`.
fn plain_token_and_anonymous_identities(driver: &'static str) {
    let server = Launch::new(driver)
        .env("ABX_SERVER_TOKEN", "s3cret")
        .start();
    let caps = call(&server, "s3cret", "GET", "/capabilities", None).json();
    assert_eq!(caps["identity"], json!({"id": "server", "scopes": ["*"]}));
    drop(server);
    let policy = json!({"auth": {
        "tokens": [{"id": "ops", "scopes": ["*"], "token_env": "OPS_TOKEN"}],
        "allow_anonymous": true,
        "anonymous_scopes": ["files:read"]
    }});
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", &policy.to_string())
        .env("OPS_TOKEN", "ops")
        .start();
    let (status, caps) = server.get_json("/capabilities");
    assert_eq!(
        (status, caps["identity"].clone()),
        (200, json!({"id": "anonymous", "scopes": ["files:read"]}))
    );
    assert_eq!(server.get_json("/files/list?path=.").0, 200);
    let (status, body) = server.post_json("/shell", json!({"command": "true"}));
    assert_eq!(
        (status, body["identity"].clone()),
        (403, json!("anonymous"))
    );
    // A wrong credential is not anonymous.
    assert_eq!(
        call(&server, "wrong", "GET", "/files/list?path=.", None).status,
        401
    );
}

/// The knobs the reference declares on the run, terminal and watch routes, each applied
/// (they stopped the server before, "not applied by endpoint"), and the common
/// `max_concurrency`, counted until a streamed answer ends.
fn the_reference_knobs_are_applied(driver: &'static str) {
    let policy = json!({
        "auth": {"tokens": [
            {"id": "admin", "scopes": ["*"], "token_sha256": sha256_hex("admin-secret")},
            {"id": "other", "scopes": ["*"], "token_env": "OTHER_TOKEN"}
        ]},
        "endpoints": {
            "pty_create_session": {
                "limits": {"max_sessions": 1},
                "params": {"shells": ["/bin/sh"], "env_deny": ["NOT_FOR_TERMINALS"]}
            },
            "process_start": {"limits": {"max_processes": 1, "timeout_seconds": 1, "max_output_bytes": 60}},
            "shell": {"limits": {"max_concurrency": 1}},
            "shell_stream": {"limits": {"max_processes": 1}},
            "files_watch": {"limits": {"max_duration_seconds": 1}}
        }
    });
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", &policy.to_string())
        .env("OTHER_TOKEN", "other-secret")
        .start();
    let admin = |method: &str, path: &str, body: Option<Value>| {
        call(&server, "admin-secret", method, path, body)
    };

    // pty_create_session: shells, env_deny, token_env names, ABX_*, max_sessions.
    for (body, status, code) in [
        (json!({"shell": "/bin/bash"}), 403, "shell_not_allowed"),
        (
            json!({"shell": "/bin/sh", "env": {"NOT_FOR_TERMINALS": "1"}}),
            403,
            "env_var_not_allowed",
        ),
        (
            json!({"shell": "/bin/sh", "env": {"OTHER_TOKEN": "x"}}),
            403,
            "env_var_not_allowed",
        ),
        (
            json!({"shell": "/bin/sh", "env": {"ABX_ANYTHING": "x"}}),
            403,
            "env_var_denied",
        ),
    ] {
        let reply = admin("POST", "/pty/sessions", Some(body.clone()));
        assert_eq!(
            (reply.status, reply.json()["code"].clone()),
            (status, json!(code)),
            "{body}: {}",
            reply.text()
        );
    }
    let first = admin("POST", "/pty/sessions", Some(json!({"shell": "/bin/sh"})));
    assert_eq!(first.status, 200, "{}", first.text());
    let second = admin("POST", "/pty/sessions", Some(json!({"shell": "/bin/sh"})));
    assert_eq!(second.status, 429, "{}", second.text());
    assert!(second.json()["error"]
        .as_str()
        .unwrap()
        .contains("Session limit"));

    // A token_env name in a command's env is protected on the run routes too.
    let reply = admin(
        "POST",
        "/shell",
        Some(json!({"command": "true", "env": {"OTHER_TOKEN": "x"}})),
    );
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (403, json!("env_var_not_allowed")),
        "{}",
        reply.text()
    );

    // process_start: max_processes 1, and timeout_seconds ends a process nobody gave a
    // timeout, which frees its place.
    let started = admin(
        "POST",
        "/process/start",
        Some(json!({"command": "sleep 30"})),
    );
    assert_eq!(started.status, 200, "{}", started.text());
    let pid = started.json()["pid"].as_i64().unwrap();
    let refused = admin(
        "POST",
        "/process/start",
        Some(json!({"command": "sleep 30"})),
    );
    assert_eq!(refused.status, 429, "{}", refused.text());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let state = admin("GET", &format!("/process/{pid}"), None).json()["state"].clone();
        if state == "exited" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timeout_seconds did not end {pid}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // max_output_bytes: the oldest captured output is dropped past 60 bytes.
    let line = "a".repeat(49);
    let started = admin(
        "POST",
        "/process/start",
        Some(
            json!({"command": format!("sh -c 'for i in 1 2 3 4 5; do echo {line}; done'"), "capture_output": true}),
        ),
    );
    assert_eq!(started.status, 200, "{}", started.text());
    let pid = started.json()["pid"].as_i64().unwrap();
    let output = loop {
        let output = admin("GET", &format!("/process/{pid}/output?wait=1"), None).json();
        if output["state"] == "exited" {
            break output;
        }
    };
    let kept: usize = output["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["data"].as_str().unwrap().len())
        .sum();
    assert!(kept <= 60 && output["dropped"] == true, "{output}");

    // max_concurrency on shell: a second call while one runs is 429; then it is free.
    let addr = server.addr;
    std::thread::scope(|scope| {
        let slow = scope.spawn(|| {
            post_closing(
                addr,
                "admin-secret",
                "/shell",
                json!({"command": "sleep 2"}),
            )
        });
        std::thread::sleep(std::time::Duration::from_millis(500));
        let busy = admin("POST", "/shell", Some(json!({"command": "true"})));
        assert_eq!(
            (busy.status, busy.json()["code"].clone()),
            (429, json!("concurrency_limited")),
            "{}",
            busy.text()
        );
        assert_eq!(slow.join().unwrap(), 200);
    });
    assert_eq!(
        admin("POST", "/shell", Some(json!({"command": "true"}))).status,
        200
    );

    // max_processes on shell_stream holds its place until the stream has ended.
    std::thread::scope(|scope| {
        let slow = scope.spawn(|| {
            post_closing(
                addr,
                "admin-secret",
                "/shell/stream",
                json!({"command": "sleep 2"}),
            )
        });
        std::thread::sleep(std::time::Duration::from_millis(500));
        let busy = admin("POST", "/shell/stream", Some(json!({"command": "true"})));
        assert_eq!(busy.status, 429, "{}", busy.text());
        assert!(busy.json()["error"]
            .as_str()
            .unwrap()
            .contains("Process limit reached (1)"));
        assert_eq!(slow.join().unwrap(), 200);
    });
    assert_eq!(
        admin("POST", "/shell/stream", Some(json!({"command": "true"}))).status,
        200
    );

    // files_watch: max_duration_seconds cuts the caller's timeout.
    let started = std::time::Instant::now();
    let watched = admin("GET", "/files/watch?path=.&timeout=60", None);
    assert_eq!(watched.status, 200);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10)
            && watched.text().contains("event: end"),
        "{}",
        watched.text()
    );
}

/// A POST on a connection of its own, read to its end (the server closes it as asked):
/// its status.
fn post_closing(addr: std::net::SocketAddr, token: &str, path: &str, body: Value) -> u16 {
    use std::io::{Read, Write};
    let body = body.to_string();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// `/capabilities/check` takes the reference's `paths` and `op` and checks them first.
fn check_takes_paths_and_op(driver: &'static str) {
    let policy =
        json!({"endpoints": {"files_stat": {"paths": {"read_only": true, "deny": ["*.pem"]}}}});
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", &policy.to_string())
        .start();
    for bad in [
        json!({"endpoint": "x", "paths": "no"}),
        json!({"endpoint": "x", "paths": [1]}),
        json!({"endpoint": "x", "op": "fly"}),
    ] {
        assert_eq!(
            server.post_json("/capabilities/check", bad.clone()).0,
            400,
            "{bad}"
        );
    }
    let (_, answer) = server.post_json(
        "/capabilities/check",
        json!({"endpoint": "files_stat", "paths": ["a.txt", "key.pem"]}),
    );
    assert_eq!(answer["code"], "path_denied", "{answer}");
    let (_, answer) = server.post_json(
        "/capabilities/check",
        json!({"endpoint": "files_stat", "path": "a.txt", "op": "write"}),
    );
    assert_eq!(answer["code"], "read_only", "{answer}");
    let (_, answer) = server.post_json(
        "/capabilities/check",
        json!({"endpoint": "files_stat", "path": "a.txt", "op": "read"}),
    );
    assert_eq!(answer["allowed"], true, "{answer}");
}

/// Every limit and param the reference declares, on each endpoint that declares it, is
/// one this build applies: a document naming it starts (`--check-policy`).
#[test]
fn every_knob_the_reference_declares_is_applied() {
    let table = std::process::Command::new(&crate::support::tools().reference_python)
        .args(["-c", "import json\nfrom agent_sandbox.server import endpoints as E\nprint(json.dumps({n: {'limits': sorted(e.spec.limits), 'params': sorted(e.spec.params)} for n, e in E.ENDPOINTS.items()}))"])
        .output()
        .unwrap();
    assert!(
        table.status.success(),
        "{}",
        String::from_utf8_lossy(&table.stderr)
    );
    let table: Value = serde_json::from_slice(&table.stdout).unwrap();
    let scratch = TempDir::new("knobs");
    let mut refused = Vec::new();
    let mut checked = 0;
    for (endpoint, knobs) in table.as_object().unwrap() {
        for section in ["limits", "params"] {
            for knob in knobs[section].as_array().unwrap() {
                let knob = knob.as_str().unwrap();
                let value = match knob {
                    "overwrite" => json!(false),
                    "block_private_networks" => json!(true),
                    "allowed_signals" => json!([15]),
                    "timeout_seconds" | "max_duration_seconds" => json!(5),
                    k if k.starts_with("allow_")
                        || k.starts_with("deny_")
                        || k.starts_with("url_")
                        || ["env_deny", "shells", "languages"].contains(&k) =>
                    {
                        json!(["x"])
                    }
                    _ => json!(100),
                };
                let document = json!({
                    "groups": {"dev_tools": true, "browser": true, "agents": true},
                    "endpoints": {endpoint: {section: {knob: value}}}
                });
                let path = scratch.path().join("policy.json");
                std::fs::write(&path, document.to_string()).unwrap();
                let output = std::process::Command::new(crate::support::MAIN_BIN)
                    .arg("--check-policy")
                    .arg(&path)
                    .env_remove("ABX_SERVER_POLICY")
                    .env("ABX_SERVER_BASE_DIR", scratch.path())
                    .output()
                    .unwrap();
                checked += 1;
                if !output.status.success() {
                    refused.push(format!(
                        "{endpoint}.{section}.{knob}: {}",
                        String::from_utf8_lossy(&output.stderr).trim()
                    ));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} knobs in the reference's table"
    );
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
}

on_both_drivers!(
    a_reference_document_governs_every_route,
    sources_and_refusals,
    plain_token_and_anonymous_identities,
    the_reference_knobs_are_applied,
    check_takes_paths_and_op,
);
