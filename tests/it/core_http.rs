//! Server core: the HTTP engine, common response rules, auth, the route table and the
//! core routes.

use std::io::{BufReader, Read, Write};
use std::time::Duration;

use serde_json::{json, Value};

use crate::on_both_drivers;
use crate::support::{closes_within, read_reply, request_at, Launch, Server, TempDir};

fn health_is_json_and_trailing_slash_is_stripped(driver: &'static str) {
    let server = Server::start(driver);
    for path in ["/health", "/health/"] {
        let reply = server.get(path);
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.header("content-type"),
            Some("application/json; charset=utf-8")
        );
        assert_eq!(reply.json(), json!({"status": "ok"}));
    }
}

fn startup_line_names_driver_groups_and_auth(driver: &'static str) {
    let server = Server::start(driver);
    let banner = server
        .startup
        .iter()
        .find(|l| l.starts_with("agent-sandbox "))
        .expect("banner");
    let expected_driver = if driver == "uring" {
        "io_driver=io_uring"
    } else {
        "io_driver=epoll"
    };
    assert!(banner.contains(expected_driver), "{banner}");
    assert!(
        banner.contains("workers=2") && banner.contains("auth=local"),
        "{banner}"
    );
    assert!(
        banner.contains(&format!("address={}", server.addr)),
        "{banner}"
    );
    assert!(banner.contains("groups=core"), "{banner}");
    let token = Launch::new(driver).env("ABX_SERVER_TOKEN", "t").start();
    assert!(token.startup.iter().any(|l| l.contains("auth=token")));
}

fn unknown_path_is_the_contract_404(driver: &'static str) {
    let server = Server::start(driver);
    let reply = server.get("/no/such/route/");
    assert_eq!(reply.status, 404);
    assert_eq!(
        reply.json(),
        json!({"error": "Not found: /no/such/route", "type": "ValueError"})
    );
    // A known path with a method it does not serve is an unknown route, as in the Python server.
    let reply = server.request("DELETE", "/health", &[], None);
    assert_eq!(reply.status, 404);
    assert_eq!(reply.json()["error"], "Not found: /health");
}

fn other_methods_are_405_with_allow(driver: &'static str) {
    let server = Server::start(driver);
    // HEAD is answered without a body; framing_is_strict_and_bodiless_answers_have_no_body covers it.
    for method in ["PUT", "PATCH", "OPTIONS", "TRACE"] {
        let reply = server.request(method, "/health", &[], None);
        assert_eq!(reply.status, 405, "{method}");
        assert_eq!(reply.header("allow"), Some("GET, POST, DELETE"));
        assert_eq!(reply.json()["type"], "ValueError");
    }
}

fn keep_alive_and_pipelining_answer_in_order(driver: &'static str) {
    let server = Server::start(driver);
    let mut stream = server.connect();
    let one = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    let two = "POST /capabilities/check HTTP/1.1\r\nHost: x\r\nContent-Length: 22\r\n\r\n{\"endpoint\": \"health\"}";
    let three = "GET /missing HTTP/1.1\r\nHost: x\r\n\r\n";
    stream
        .write_all(format!("{one}{two}{three}").as_bytes())
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let r1 = read_reply(&mut reader).unwrap();
    let r2 = read_reply(&mut reader).unwrap();
    let r3 = read_reply(&mut reader).unwrap();
    assert_eq!((r1.status, r2.status, r3.status), (200, 200, 404));
    assert_eq!(r2.json()["endpoint"], "health");
    assert_eq!(r3.json()["error"], "Not found: /missing");
    // The connection is still usable afterwards.
    stream.write_all(one.as_bytes()).unwrap();
    assert_eq!(read_reply(&mut reader).unwrap().status, 200);
}

fn http10_closes_unless_keep_alive(driver: &'static str) {
    let server = Server::start(driver);
    let mut stream = server.connect();
    stream.write_all(b"GET /health HTTP/1.0\r\n\r\n").unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let reply = read_reply(&mut reader).unwrap();
    assert_eq!((reply.version.as_str(), reply.status), ("HTTP/1.0", 200));
    assert!(closes_within(&mut stream, Duration::from_secs(5)));

    let mut stream = server.connect();
    stream
        .write_all(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let reply = read_reply(&mut reader).unwrap();
    assert_eq!(reply.header("connection"), Some("keep-alive"));
    stream.write_all(b"GET /health HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(read_reply(&mut reader).unwrap().status, 200);
}

fn chunked_request_bodies_are_decoded(driver: &'static str) {
    let server = Server::start(driver);
    let mut stream = server.connect();
    let body = r#"{"endpoint": "capabilities"}"#;
    let (a, b) = body.split_at(10);
    let raw = format!(
        "POST /capabilities/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x};ext=1\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\nX-Trailer: y\r\n\r\n",
        a.len(),
        b.len()
    );
    stream.write_all(raw.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let reply = read_reply(&mut reader).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["endpoint"], "capabilities");
    assert_eq!(reply.json()["allowed"], true);
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut reader).unwrap().status, 200);
}

fn content_length_with_chunked_is_refused_and_closed(driver: &'static str) {
    let server = Server::start(driver);
    let mut stream = server.connect();
    stream
        .write_all(b"POST /capabilities/check HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let reply = read_reply(&mut reader).unwrap();
    assert_eq!(reply.status, 400);
    assert_eq!(reply.header("connection"), Some("close"));
    assert!(closes_within(&mut stream, Duration::from_secs(5)));
}

fn oversized_body_is_413_before_it_is_read(driver: &'static str) {
    let server = Server::start(driver);
    let mut stream = server.connect();
    // Announce 20 MiB and send none of it: the answer must come from the header alone.
    stream
        .write_all(
            b"POST /capabilities/check HTTP/1.1\r\nHost: x\r\nContent-Length: 20971520\r\n\r\n",
        )
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let reply = read_reply(&mut reader).unwrap();
    assert_eq!(reply.status, 413);
    let body = reply.json();
    assert_eq!(body["code"], "payload_too_large");
    assert!(body["error"].is_string() && body["type"].is_string());
    assert!(closes_within(&mut stream, Duration::from_secs(5)));

    // A chunked body that grows past the cap is refused too.
    let mut stream = server.connect();
    stream
        .write_all(
            b"POST /capabilities/check HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .unwrap();
    let chunk = vec![b' '; 1 << 20];
    let mut refused = None;
    for _ in 0..12 {
        let mut data = format!("{:x}\r\n", chunk.len()).into_bytes();
        data.extend_from_slice(&chunk);
        data.extend_from_slice(b"\r\n");
        if stream.write_all(&data).is_err() {
            break;
        }
    }
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    if let Some(reply) = read_reply(&mut reader) {
        refused = Some(reply.status);
    }
    assert_eq!(refused, Some(413));

    // A body of exactly the limit is read and answered on its merits.
    let mut stream = server.connect();
    let limit = 10 * 1024 * 1024;
    let mut body = vec![b' '; limit];
    body[0] = b'{';
    body[limit - 1] = b'}';
    stream
        .write_all(
            format!(
                "POST /capabilities/check HTTP/1.1\r\nHost: t\r\nContent-Length: {limit}\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
    stream.write_all(&body).unwrap();
    let reply = read_reply(&mut BufReader::new(stream.try_clone().unwrap())).unwrap();
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert_ne!(reply.json()["code"], "payload_too_large");
}

fn curl_large_body_with_expect_100_continue(driver: &'static str) {
    let server = Server::start(driver);
    let dir = TempDir::new("curl");
    let padding = "x".repeat(2 * 1024 * 1024);
    let body = json!({"endpoint": "health", "padding": padding}).to_string();
    let file = dir.path().join("body.json");
    std::fs::write(&file, body).unwrap();
    let output = std::process::Command::new("curl")
        .args([
            "-sS",
            "-v",
            "--max-time",
            "30",
            "-H",
            "Content-Type: application/json",
            "-H",
            "Expect: 100-continue",
        ])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(format!("http://{}/capabilities/check", server.addr))
        .output()
        .expect("curl is installed (.ci/run installs it)");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("HTTP/1.1 100 Continue"), "{stderr}");
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        reply,
        json!({"endpoint": "health", "allowed": true, "code": null, "reason": null})
    );
}

fn expect_continue_is_not_sent_for_refused_requests(driver: &'static str) {
    let server = Launch::new(driver)
        .env("ABX_SERVER_TOKEN", "secret")
        .start();
    let mut stream = server.connect();
    stream
        .write_all(b"POST /capabilities/check HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n")
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let reply = read_reply(&mut reader).unwrap();
    assert_eq!(reply.status, 401);
    assert!(closes_within(&mut stream, Duration::from_secs(5)));
}

/// A head sent a few bytes at a time is assembled and answered like any other (it is
/// scanned once for its end and parsed once, not re-parsed per piece).
fn trickled_heads_are_answered(driver: &'static str) {
    let server = Server::start(driver);
    let mut stream = server.connect();
    stream.set_nodelay(true).unwrap();
    let head = b"POST /capabilities/check HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 22\r\n\r\n{\"endpoint\": \"health\"}";
    for piece in head.chunks(3) {
        stream.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let reply = read_reply(&mut BufReader::new(stream)).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["allowed"], true);
}

fn silent_and_slow_clients_are_dropped(driver: &'static str) {
    let server = Launch::new(driver)
        .arg("--read-timeout")
        .arg("0.5")
        .arg("--idle-timeout")
        .arg("0.5")
        .start();
    // Half a request head, then silence.
    let mut stream = server.connect();
    stream.write_all(b"GET /health HTTP/1.1\r\nHost:").unwrap();
    assert!(closes_within(&mut stream, Duration::from_secs(10)));
    // A body that never arrives.
    let mut stream = server.connect();
    stream
        .write_all(b"POST /capabilities/check HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{")
        .unwrap();
    assert!(closes_within(&mut stream, Duration::from_secs(10)));
    // An idle keep-alive connection.
    let (mut stream, _reader) = crate::support::answered_connection(&server);
    assert!(closes_within(&mut stream, Duration::from_secs(10)));
    // The server itself is fine.
    assert_eq!(server.get("/health").status, 200);
}

fn oversized_head_is_431_and_bad_request_line_400(driver: &'static str) {
    let server = Server::start(driver);
    let mut stream = server.connect();
    let big = format!(
        "GET /health HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    let _ = stream.write_all(big.as_bytes());
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    assert_eq!(read_reply(&mut reader).unwrap().status, 431);

    let mut stream = server.connect();
    let many: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    stream
        .write_all(format!("GET /health HTTP/1.1\r\nHost: t\r\n{many}\r\n").as_bytes())
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    assert_eq!(read_reply(&mut reader).unwrap().status, 431);

    let mut stream = server.connect();
    stream.write_all(b"THIS IS NOT HTTP\r\n\r\n").unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let reply = read_reply(&mut reader).unwrap();
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["type"], "ValueError");
    assert!(closes_within(&mut stream, Duration::from_secs(5)));
}

fn json_body_rules(driver: &'static str) {
    let server = Server::start(driver);
    for bad in ["{", "[1, 2]", "\"text\"", "nul"] {
        let reply = server.post("/capabilities/check", bad);
        assert_eq!(reply.status, 400, "{bad}");
        assert_eq!(reply.json()["type"], "ValueError");
    }
    // An empty body is {}: the handler then reports the missing field as a bad body.
    let reply = server.post("/capabilities/check", "");
    assert_eq!(reply.status, 400);
    assert!(reply.json()["error"].as_str().unwrap().contains("endpoint"));
    let reply = server.post("/capabilities/check", r#"{"endpoint": 5}"#);
    assert_eq!(reply.status, 400);
    let reply = server.post(
        "/capabilities/check",
        r#"{"endpoint": "health", "path": 5}"#,
    );
    assert_eq!(reply.status, 400);
}

fn repeated_query_parameter_is_400(driver: &'static str) {
    let server = Server::start(driver);
    let reply = server.get("/capabilities?x=1&x=2");
    assert_eq!(reply.status, 400);
    let body = reply.json();
    assert_eq!(body["code"], "duplicate_parameter");
    assert_eq!(body["type"], "ValueError");
    assert_eq!(server.get("/capabilities?x=1&y=2").status, 200);
}

fn auth_matrix(driver: &'static str) {
    let server = Launch::new(driver)
        .env("ABX_SERVER_TOKEN", "s3cret")
        .start();
    assert_eq!(server.get("/health").status, 200);
    let reply = server.get("/capabilities");
    assert_eq!(reply.status, 401);
    assert_eq!(
        reply.json(),
        json!({"error": "unauthorized", "type": "AuthError", "code": "unauthorized"})
    );
    let ok =
        |headers: &[(&str, &str)]| server.request("GET", "/capabilities", headers, None).status;
    assert_eq!(ok(&[("X-Access-Token", "s3cret")]), 200);
    assert_eq!(ok(&[("Authorization", "Bearer s3cret")]), 200);
    assert_eq!(ok(&[("X-Access-Token", "wrong")]), 401);
    assert_eq!(ok(&[("Authorization", "Bearer wrong")]), 401);
    assert_eq!(ok(&[("Authorization", "s3cret")]), 401);
    assert_eq!(
        ok(&[
            ("X-Access-Token", "gateway"),
            ("Authorization", "Bearer s3cret")
        ]),
        200
    );
    let reply = server.request(
        "GET",
        "/capabilities",
        &[("X-Access-Token", "a"), ("X-Access-Token", "s3cret")],
        None,
    );
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["code"], "ambiguous_credentials");
    let reply = server.request(
        "GET",
        "/capabilities",
        &[
            ("Authorization", "Bearer a"),
            ("Authorization", "Bearer s3cret"),
        ],
        None,
    );
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["code"], "ambiguous_credentials");
    // Empty credentials and prefixes of the token are refused over HTTP too.
    assert_eq!(ok(&[("X-Access-Token", "")]), 401);
    assert_eq!(ok(&[("Authorization", "Bearer ")]), 401);
    assert_eq!(ok(&[("X-Access-Token", "s3cre")]), 401);
    assert_eq!(ok(&[("Authorization", "Bearer s3cret2")]), 401);
    let reply = server.request("POST", "/capabilities/check", &[], Some(b"{}"));
    assert_eq!(reply.status, 401);
    // Identity of a token holder.
    let reply = server.request(
        "GET",
        "/capabilities",
        &[("X-Access-Token", "s3cret")],
        None,
    );
    assert_eq!(reply.json()["identity"]["scopes"], json!(["*"]));

    let local = Launch::new(driver).env("ABX_SERVER_TOKEN", "").start();
    let reply = local.get("/capabilities");
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.json()["identity"],
        json!({"id": "anonymous", "scopes": ["*"]})
    );
}

fn capabilities_document_shape(driver: &'static str) {
    let server = Server::start(driver);
    let doc = server.get("/capabilities").json();
    assert_eq!(doc["api_version"], 2);
    assert_eq!(doc["server_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(doc["identity"], json!({"id": "anonymous", "scopes": ["*"]}));
    assert_eq!(
        doc["policy"],
        json!({"preset": "default", "revision": "2430f1a2ad2982d0", "configured": false})
    );
    assert_eq!(
        doc["endpoints"]["health"],
        json!({
            "method": "GET", "path": "/health", "group": "core",
            "summary": "Liveness probe (anonymous).", "streaming": false,
            "enabled": true, "allowed": true, "reason": null, "rule": null,
            "scopes": [], "limits": {}, "params": {}
        })
    );
    let names: Vec<&str> = doc["groups"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        names,
        [
            "core",
            "commands",
            "file_ops",
            "process",
            "terminal",
            "system",
            "dev_tools",
            "browser",
            "agents",
            "mcp",
            "k8s_runtime",
            "envd"
        ]
    );
    assert_eq!(doc["groups"]["core"], true);
    assert_eq!(
        doc["group_summary"]["core"],
        json!({"enabled": 4, "total": 4})
    );
    assert!(doc["endpoints"]["capabilities_check"]["params"]["endpoint"]["required"] == true);
    assert!(doc["warnings"].is_array());
    // The PTY WebSocket is listed as the contract lists it: method WS, on its own port.
    let pty = &doc["endpoints"]["pty_connect"];
    assert_eq!(
        (
            pty["method"].clone(),
            pty["path"].clone(),
            pty["group"].clone(),
            pty["enabled"].clone()
        ),
        (json!("WS"), json!("/pty"), json!("terminal"), json!(true))
    );
    let check = server
        .post("/capabilities/check", r#"{"endpoint": "pty_connect"}"#)
        .json();
    assert_eq!(
        (check["allowed"].clone(), check["code"].clone()),
        (json!(true), json!(null))
    );
    // Derived fields agree with the endpoint map.
    for (group, summary) in doc["group_summary"].as_object().unwrap() {
        let eps: Vec<&Value> = doc["endpoints"]
            .as_object()
            .unwrap()
            .values()
            .filter(|e| e["group"] == *group)
            .collect();
        assert_eq!(summary["total"], eps.len());
        assert_eq!(
            summary["enabled"],
            eps.iter().filter(|e| e["enabled"] == true).count()
        );
        assert_eq!(
            doc["groups"][group],
            eps.iter().any(|e| e["enabled"] == true)
        );
    }
}

fn custom_routes_appear_and_opt_in_groups_answer_the_contract_404(driver: &'static str) {
    let server = Launch::example(driver).start();
    let reply = server.get("/hello/Ada%20L");
    assert_eq!(reply.json(), json!({"greeting": "Hello, Ada L!"}));
    let doc = server.get("/capabilities").json();
    let hello = &doc["endpoints"]["GET /hello/{name}"];
    assert_eq!(hello["group"], "commands");
    assert_eq!(hello["enabled"], true);
    assert_eq!(doc["groups"]["commands"], true);
    let commands = doc["group_summary"]["commands"].clone();
    assert!(commands["total"].as_u64().unwrap() >= 6, "{commands}");
    assert_eq!(
        doc["endpoints"]["example_scoped"]["scopes"],
        json!(["example:admin"])
    );

    let opt_in = &doc["endpoints"]["example_opt_in"];
    assert_eq!(opt_in["enabled"], false);
    assert_eq!(opt_in["reason"], "endpoint_disabled");
    assert_eq!(opt_in["rule"], "default:opt-in:dev_tools");
    assert!(opt_in.get("limits").is_none() && opt_in.get("params").is_none());
    assert_eq!(doc["groups"]["dev_tools"], false);
    assert_eq!(
        doc["group_summary"]["dev_tools"],
        json!({"enabled": 0, "total": 4}),
        "the three built-in dev_tools endpoints and the example's"
    );

    let reply = server.get("/example/opt-in");
    assert_eq!(reply.status, 404);
    assert_eq!(
        reply.json(),
        json!({
            "error": "Endpoint 'example_opt_in' is disabled: group 'dev_tools' is opt-in. Enable the group (ABX_SERVER_ENABLED_GROUPS=dev_tools, policy groups: [dev_tools]) or this endpoint (policy endpoints.example_opt_in.enabled: true)",
            "type": "ValueError", "code": "endpoint_disabled", "endpoint": "example_opt_in", "rule": "default:opt-in:dev_tools"
        })
    );
    let reply = server.post("/capabilities/check", r#"{"endpoint": "example_opt_in"}"#);
    let body = reply.json();
    assert_eq!(
        (body["allowed"].clone(), body["code"].clone()),
        (json!(false), json!("endpoint_disabled"))
    );
    assert_eq!(body["rule"], "default:opt-in:dev_tools");

    let enabled = Launch::example(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", "dev_tools")
        .start();
    assert_eq!(
        enabled.get("/example/opt-in").json(),
        json!({"opted_in": true})
    );
    assert_eq!(
        enabled.get("/capabilities").json()["groups"]["dev_tools"],
        true
    );

    let token = Launch::example(driver).env("ABX_SERVER_TOKEN", "k").start();
    assert_eq!(token.get("/open/ping").status, 200);
    assert_eq!(token.get("/hello/x").status, 401);
}

/// `/openapi.json` is generated from the same table as `/capabilities`: every endpoint
/// served on this port appears once, with its parameters, body fields and statuses.
fn openapi_document_lists_every_endpoint(driver: &'static str) {
    let server = Server::start(driver);
    let caps = server.get("/capabilities").json();
    let reply = server.get("/openapi.json");
    assert_eq!(reply.status, 200);
    let doc = reply.json();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut operations = std::collections::HashMap::new();
    for (path, methods) in doc["paths"].as_object().unwrap() {
        for (method, op) in methods.as_object().unwrap() {
            operations.insert(
                op["operationId"].as_str().unwrap().to_string(),
                (path.clone(), method.clone(), op.clone()),
            );
        }
    }
    for (id, ep) in caps["endpoints"].as_object().unwrap() {
        // Neither the PTY WebSocket nor the k8s_runtime routes are on the API port, and
        // a declared endpoint this build does not serve has no operation.
        if ep["method"] == "WS"
            || ep["group"] == "k8s_runtime"
            || ep["group"] == "envd"
            || ep["rule"] == "build:unavailable"
        {
            assert!(
                !operations.contains_key(id),
                "{id} is not a route of this port"
            );
            continue;
        }
        let (path, method, op) = operations.get(id).unwrap_or_else(|| panic!("{id} missing"));
        assert_eq!(path, ep["path"].as_str().unwrap());
        assert_eq!(method.to_uppercase(), ep["method"].as_str().unwrap());
        assert!(op["responses"]["200"].is_object(), "{id}");
        assert!(
            op["responses"]["404"]["content"]["application/json"].is_object(),
            "{id}"
        );
    }
    let upload = &operations["upload"].2;
    let body = &upload["requestBody"]["content"]["application/json"]["schema"];
    assert_eq!(body["required"], json!(["path", "content_base64"]));
    assert!(upload["responses"]["413"].is_object());
    let list = &operations["files_list"].2;
    assert_eq!(list["parameters"][0]["name"], "path");
    assert_eq!(list["parameters"][0]["in"], "query");
    let raw = &operations["files_download_stream"].2;
    assert!(raw["responses"]["200"]["content"]["application/octet-stream"].is_object());
    assert!(raw["responses"]["416"].is_object());
}

fn capabilities_check_answers(driver: &'static str) {
    let server = Server::start(driver);
    let check = |body: &str| server.post("/capabilities/check", body).json();
    assert_eq!(
        check(r#"{"endpoint": "health"}"#),
        json!({"endpoint": "health", "allowed": true, "code": null, "reason": null})
    );
    let unknown = check(r#"{"endpoint": "nope"}"#);
    assert_eq!(
        (unknown["allowed"].clone(), unknown["code"].clone()),
        (json!(false), json!("unknown_endpoint"))
    );
    assert!(unknown["reason"].is_string());
    let inside = check(&format!(
        r#"{{"endpoint": "health", "path": "{}/a/../b"}}"#,
        server.base_dir().display()
    ));
    assert_eq!(inside["allowed"], true);
    let outside = check(r#"{"endpoint": "health", "path": "../../etc/passwd"}"#);
    assert_eq!(outside["code"], "path_not_allowed");
    assert_eq!(outside["allowed"], false);
}

fn handler_panic_is_500_and_the_connection_lives_on(driver: &'static str) {
    let server = Launch::example(driver).start();
    let mut stream = server.connect();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    stream
        .write_all(b"GET /debug/panic HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let reply = read_reply(&mut reader).unwrap();
    assert_eq!(reply.status, 500);
    let body = reply.json();
    assert!(body["error"].as_str().unwrap().contains("deliberate panic"));
    assert_eq!(body["type"], "RuntimeError");
    stream
        .write_all(b"POST /debug/panic-later HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut reader).unwrap().status, 500);
    stream
        .write_all(b"GET /hello/again HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(
        read_reply(&mut reader).unwrap().json()["greeting"],
        "Hello, again!"
    );
    let logged: Vec<String> = server.output.try_iter().collect();
    assert!(
        logged
            .iter()
            .any(|l| l.contains("endpoint 'debug_panic' panicked")),
        "{logged:?}"
    );
}

fn sse_events_are_framed_and_flushed_one_by_one(driver: &'static str) {
    let server = Launch::example(driver).start();
    let mut stream = server.connect();
    stream
        .write_all(b"GET /debug/events?gap_ms=3000 HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    // Read until the first event is complete. If events were buffered until the stream
    // ended, the terminating chunk would arrive with it (3 s later).
    while !String::from_utf8_lossy(&seen).contains("\n\n\r\n") {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0);
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen).to_string();
    assert!(text.contains("Content-Type: text/event-stream"), "{text}");
    assert!(text.contains("Transfer-Encoding: chunked"), "{text}");
    assert!(text.contains("event: tick\ndata: {\"n\":0}\n\n"), "{text}");
    assert!(
        !text.contains("\r\n0\r\n\r\n"),
        "stream ended too early: {text}"
    );
    assert!(
        !text.contains("\"n\":1"),
        "second event arrived with the first: {text}"
    );
    drop(stream);

    let mut stream = server.connect();
    stream
        .write_all(b"GET /debug/events?gap_ms=1 HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let reply = read_reply(&mut reader).unwrap();
    assert_eq!(
        reply.text(),
        "event: tick\ndata: {\"n\":0}\n\nevent: tick\ndata: {\"n\":1}\n\nevent: done\ndata: {}\n\n"
    );
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut reader).unwrap().status, 200);
}

fn policy_file_sets_revision_and_switches(driver: &'static str) {
    let dir = TempDir::new("policy");
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, r#"{"preset": "default", "groups": {"commands": false}, "endpoints": {"GET /hello/{name}": {"enabled": true}}}"#).unwrap();
    let server = Launch::example(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    let doc = server.get("/capabilities").json();
    // The reference server's revision of the same document.
    assert_eq!(
        doc["policy"],
        json!({"preset": "default", "revision": expected_revision(), "configured": true})
    );
    assert_eq!(server.get("/hello/a").status, 200);
    let reply = server.get("/open/ping");
    assert_eq!(reply.status, 404);
    assert_eq!(reply.json()["rule"], "policy:groups.commands");
    assert_eq!(doc["endpoints"]["GET /hello/{name}"]["enabled"], true);

    std::fs::write(&policy, r#"{"groups": {"core": false}}"#).unwrap();
    let (code, stderr) = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .fail();
    assert_eq!(code, 2);
    assert!(stderr.contains("core"), "{stderr}");
    std::fs::write(&policy, "groups: [oops").unwrap();
    let (code, stderr) = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .fail();
    assert_eq!(code, 2);
    assert!(
        stderr.contains("policy.json: not a YAML or JSON policy document"),
        "the error names the file: {stderr}"
    );
}

/// The revision the published reference server gives the same document.
fn expected_revision() -> String {
    let output = std::process::Command::new(&crate::support::tools().reference_python)
        .arg("-c")
        .arg(r#"from agent_sandbox.server.policy import ServerPolicy; print(ServerPolicy.from_dict({"preset": "default", "groups": {"commands": False}, "endpoints": {"GET /hello/{name}": {"enabled": True}}}).revision)"#)
        .output()
        .expect("the reference venv's python");
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

fn bad_configuration_exits_2_with_one_line(driver: &'static str) {
    for (flag, value) in [
        ("--port", "70000"),
        ("--workers", "zero"),
        ("--io-driver", "kqueue"),
    ] {
        let (code, stderr) = Launch::new(driver).arg(flag).arg(value).fail();
        assert_eq!(code, 2, "{flag} {value}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
    let (code, stderr) = Launch::new(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", "bogus")
        .fail();
    assert_eq!(code, 2);
    assert!(stderr.contains("bogus"));
    let (code, _) = Launch::new(driver)
        .env("ABX_MAX_UPLOAD_SIZE", "lots")
        .fail();
    assert_eq!(code, 2);
    // An unknown flag alone is named as unknown, not as one missing its value.
    let (code, stderr) = Launch::new(driver).arg("--bogus").fail();
    assert_eq!(code, 2);
    assert_eq!(
        stderr.trim(),
        "agent-sandbox: unknown flag --bogus (see --help)"
    );
    let (code, stderr) = Launch::new(driver)
        .arg("--host")
        .arg("no-such-host.invalid")
        .fail();
    assert_eq!(code, 2);
    assert!(stderr.contains("nor a host name that resolves"), "{stderr}");
}

/// `--host localhost` is a host name that resolves: the server listens on loopback.
fn host_names_resolve(driver: &'static str) {
    let server = Launch::new(driver).arg("--host").arg("localhost").start();
    assert!(server.addr.ip().is_loopback(), "{}", server.addr);
    assert_eq!(server.get("/health").status, 200);
}

/// `SO_REUSEPORT` would let a second server join a port a running one holds, and the
/// kernel would split connections between them: the second exits 2 with one line naming
/// the port, and the first answers every request meanwhile and after.
fn second_server_on_a_held_port_exits_2(driver: &'static str) {
    let first = Launch::new(driver).env("ABX_SERVER_TOKEN", "first").start();
    let port = first.addr.port().to_string();
    let (code, stderr) = Launch::new(driver).arg("--port").arg(&port).fail();
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("port {port} is already in use")),
        "{stderr}"
    );
    // The PTY port likewise.
    let pty = first
        .pty_addr
        .expect("the terminal group is on by default")
        .port()
        .to_string();
    let (code, stderr) = Launch::new(driver).arg("--pty-port").arg(&pty).fail();
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("port {pty} is already in use")),
        "{stderr}"
    );
    for _ in 0..20 {
        let reply = first.request(
            "GET",
            "/capabilities",
            &[("Authorization", "Bearer first")],
            None,
        );
        assert_eq!(reply.status, 200, "a request reached another server");
    }
}

/// A page of another site may change nothing (its browser sends `Origin` and
/// `Sec-Fetch-Site`), in local and token mode alike; clients that send neither, and the
/// server's own origin, pass; a policy's `allow_origins` admits a listed origin.
fn cross_origin_requests_are_refused(driver: &'static str) {
    let dir = TempDir::new("csrf");
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, r#"{"allow_origins": ["https://app.example.com"]}"#).unwrap();
    let local = Launch::new(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", "agents")
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    let token = Launch::new(driver).env("ABX_SERVER_TOKEN", "t0k").start();
    let own = format!("http://{}", local.addr);
    let own_host = local.addr.to_string();
    let shell = br#"{"command": "touch made"}"#;
    let refused = [
        vec![
            ("Origin", "http://evil.example"),
            ("Content-Type", "text/plain"),
        ],
        vec![("Sec-Fetch-Site", "cross-site")],
        vec![
            ("Sec-Fetch-Site", "same-site"),
            ("Origin", "http://sub.localhost"),
        ],
        vec![("Origin", "null")],
    ];
    for headers in &refused {
        let reply = local.request("POST", "/shell", headers, Some(shell));
        assert_eq!(reply.status, 403, "{headers:?}: {}", reply.text());
        assert_eq!(reply.json()["code"], "cross_origin_refused", "{headers:?}");
        let mut with_token = headers.clone();
        with_token.push(("Authorization", "Bearer t0k"));
        let reply = token.request("POST", "/shell", &with_token, Some(shell));
        assert_eq!(
            reply.status,
            403,
            "token mode {headers:?}: {}",
            reply.text()
        );
    }
    assert!(!local.base_dir().join("made").exists());
    // Under /v1 the refusal is OpenAI's envelope.
    let reply = local.request("POST", "/v1/conversations", &refused[0], Some(b"{}"));
    assert_eq!(reply.status, 403, "{}", reply.text());
    assert_eq!(reply.json()["error"]["code"], "cross_origin_refused");
    // GET routes run programs too (git, pip): a foreign page gets none of them.
    let reply = local.request("GET", "/system/info", &refused[0], None);
    assert_eq!(reply.status, 403, "{}", reply.text());
    // A name that is not this machine's own could be rebound to it: its origin is not
    // the server's own, even when Host and Origin agree.
    let reply = local.request(
        "POST",
        "/shell",
        &[
            ("Host", "rebind.example:9000"),
            ("Origin", "http://rebind.example:9000"),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        Some(shell),
    );
    assert_eq!(reply.status, 403, "{}", reply.text());
    // The own origin (an address), no origin, and a listed origin pass.
    for headers in [
        vec![
            ("Host", own_host.as_str()),
            ("Origin", own.as_str()),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        vec![],
        vec![
            ("Origin", "https://app.example.com"),
            ("Sec-Fetch-Site", "cross-site"),
        ],
    ] {
        let reply = local.request("POST", "/shell", &headers, Some(shell));
        assert_eq!(reply.status, 200, "{headers:?}: {}", reply.text());
    }
}

/// Refusals decided before a handler runs are worded by the route they refuse: under
/// `/v1`, OpenAI's envelope with `X-Agent-Sandbox-Local: 1`, for a body announced too
/// large, a malformed chunked body and a disabled endpoint (which names its rule).
fn refusals_before_the_handler_speak_the_routes_envelope(driver: &'static str) {
    let raw = |server: &Server, request: &[u8]| {
        let mut stream = server.connect();
        stream.write_all(request).unwrap();
        read_reply(&mut BufReader::new(stream)).unwrap()
    };
    let openai = |reply: &crate::support::Reply, status: u16, code: Option<&str>| {
        assert_eq!(reply.status, status, "{}", reply.text());
        assert_eq!(
            reply.header("x-agent-sandbox-local"),
            Some("1"),
            "{}",
            reply.text()
        );
        let body = reply.json();
        assert!(body["error"]["message"].is_string(), "{body}");
        assert!(body["error"]["type"].is_string(), "{body}");
        if let Some(code) = code {
            assert_eq!(body["error"]["code"], code, "{body}");
        }
        body
    };
    let off = Server::start(driver);
    let body = openai(
        &off.post("/v1/conversations", "{}"),
        404,
        Some("endpoint_disabled"),
    );
    assert_eq!(body["error"]["rule"], "default:opt-in:agents", "{body}");

    let on = Launch::new(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", "agents")
        .start();
    let reply = raw(
        &on,
        b"POST /v1/conversations HTTP/1.1\r\nHost: t\r\nContent-Length: 20971520\r\n\r\n",
    );
    openai(&reply, 413, Some("payload_too_large"));
    let reply = raw(&on, b"POST /v1/conversations HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n");
    openai(&reply, 400, None);
    // The contract's routes keep the contract's envelope.
    let reply = raw(
        &on,
        b"POST /files/mkdir HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    );
    assert_eq!(reply.status, 400);
    assert!(reply.json()["error"].is_string(), "{}", reply.text());
    assert_eq!(reply.header("x-agent-sandbox-local"), None);
}

/// Whether the server said a line containing all of `words` at startup (stderr and
/// stdout are separate pipes, so such a line may arrive after the banner).
fn said_at_startup(server: &Server, words: &[&str]) -> bool {
    let matches = |l: &String| words.iter().all(|w| l.contains(w));
    server.startup.iter().any(matches)
        || std::iter::from_fn(|| server.output.recv_timeout(Duration::from_secs(2)).ok())
            .any(|l| matches(&l))
}

fn base_dir_warnings(server: &Server) -> Vec<String> {
    let doc = server.get("/capabilities").json();
    doc["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .filter(|w| w.contains("base directory"))
        .map(String::from)
        .collect()
}

/// A base directory that cannot be made (sysfs refuses new directories, even to root)
/// is one warning at startup, and `/capabilities` says so while it is missing.
fn uncreatable_base_dir_is_a_warning(driver: &'static str) {
    let base = std::path::Path::new("/sys/abx-test-base/user");
    let shown = base.to_str().unwrap();
    let server = Launch::new(driver).base_dir(base).start();
    assert!(said_at_startup(
        &server,
        &["warning", shown, "cannot be created"]
    ));
    let warnings = base_dir_warnings(&server);
    assert!(
        warnings.len() == 1 && warnings[0].contains(shown),
        "{warnings:?}"
    );
}

/// The default `/home/user` is often missing: the server creates it at startup (and
/// says so), commands without a cwd run there, and `/capabilities` warns only while it is
/// actually missing. A command without a cwd makes a base directory deleted later again.
fn missing_base_dir_is_created_and_commands_run_there(driver: &'static str) {
    let dir = TempDir::new("absent");
    let base = dir.path().join("home/user");
    let server = Launch::new(driver).base_dir(&base).start();
    assert!(base.is_dir(), "the base directory is made at startup");
    assert!(said_at_startup(
        &server,
        &["created", base.to_str().unwrap()]
    ));
    assert_eq!(base_dir_warnings(&server), Vec::<String>::new());

    std::fs::remove_dir_all(&base).unwrap();
    assert_eq!(
        base_dir_warnings(&server).len(),
        1,
        "the warning is the present state"
    );
    let reply = server.post("/shell", r#"{"command": "pwd"}"#);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.json()["stdout"].as_str().unwrap().trim(),
        base.to_str().unwrap()
    );
    assert_eq!(base_dir_warnings(&server), Vec::<String>::new());
    std::fs::remove_dir_all(&base).unwrap();
    let reply = server.post("/process/start", r#"{"command": "true"}"#);
    assert_eq!(reply.status, 200, "{}", reply.text());
    std::fs::remove_dir_all(&base).unwrap();
    let reply = server.post("/shell/stream", r#"{"command": "pwd"}"#);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        reply.text().contains(base.to_str().unwrap()),
        "{}",
        reply.text()
    );
    // A cwd the caller names must still exist.
    let reply = server.post("/shell", r#"{"command": "pwd", "cwd": "nope"}"#);
    assert_eq!(reply.status, 403, "{}", reply.text());
}

fn sigterm_finishes_in_flight_requests(driver: &'static str) {
    let mut server = Launch::example(driver).start();
    let mut stream = server.connect();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    // An answer proves a worker owns this connection before the slow request starts.
    let mut warm = BufReader::new(stream.try_clone().unwrap());
    assert_eq!(read_reply(&mut warm).unwrap().status, 200);
    stream
        .write_all(b"GET /debug/slow?ms=800 HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let reply = read_reply(&mut reader).unwrap();
    assert_eq!(reply.json(), json!({"slept_ms": 800}));
    let status = server.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    // New connections are refused once it is gone.
    assert!(std::net::TcpStream::connect(server.addr).is_err());
}

fn workers_share_one_port(driver: &'static str) {
    let server = Server::start(driver);
    // Many connections at once land on both workers and all get answers.
    let handles: Vec<_> = (0..32)
        .map(|_| {
            let addr = server.addr;
            std::thread::spawn(move || request_at(addr, "GET", "/health", &[], None).status)
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 200);
    }
}

fn framing_is_strict_and_bodiless_answers_have_no_body(driver: &'static str) {
    let server = Launch::new(driver).env("ABX_SERVER_TOKEN", "t").start();
    for (head, status) in [
        ("POST /capabilities/check HTTP/1.1\r\nHost: t\r\nContent-Length: +2\r\n\r\n{}", 400),
        ("POST /capabilities/check HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{} ", 400),
        ("GET /health HTTP/1.1\r\n\r\n", 400),
        ("GET /health HTTP/1.1\nHost: t\n\n", 400),
        ("POST /capabilities/check HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        ("POST /capabilities/check HTTP/1.1\r\nHost: t\r\nX-Access-Token: t\r\nTransfer-Encoding: chunked\r\n\r\n100000000000000\r\n{}\r\n0\r\n\r\n", 413),
        ("POST /capabilities/check HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
        ("POST /capabilities/check HTTP/1.1\r\nHost: t\r\nX-Access-Token: t\r\nTransfer-Encoding: chunked\r\n\r\n+2\r\n{}\r\n0\r\n\r\n", 400),
    ] {
        let mut stream = server.connect();
        stream.write_all(head.as_bytes()).unwrap();
        let reply = read_reply(&mut BufReader::new(stream.try_clone().unwrap())).unwrap();
        assert_eq!(reply.status, status, "{head:?}");
        assert!(closes_within(&mut stream, Duration::from_secs(5)), "{head:?}");
    }
    // HEAD gets its 405 without a body, and the connection closes.
    let mut stream = server.connect();
    stream
        .write_all(b"HEAD /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut raw = Vec::new();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 405"), "{text}");
    assert!(
        text.ends_with("\r\n\r\n"),
        "a HEAD answer carried a body: {text}"
    );
    // A multi-byte character where "Bearer " would end is a bad credential, not a crash.
    let mut stream = server.connect();
    stream
        .write_all(
            "GET /capabilities HTTP/1.1\r\nHost: t\r\nAuthorization: abcdef\u{e9}\u{e9}x\r\n\r\n"
                .as_bytes(),
        )
        .unwrap();
    assert_eq!(read_reply(&mut BufReader::new(stream)).unwrap().status, 401);
    let handles: Vec<_> = (0..4).map(|_| server.get("/health").status).collect();
    assert_eq!(handles, [200; 4], "a worker died");
}

on_both_drivers!(
    framing_is_strict_and_bodiless_answers_have_no_body,
    health_is_json_and_trailing_slash_is_stripped,
    startup_line_names_driver_groups_and_auth,
    unknown_path_is_the_contract_404,
    other_methods_are_405_with_allow,
    keep_alive_and_pipelining_answer_in_order,
    http10_closes_unless_keep_alive,
    chunked_request_bodies_are_decoded,
    content_length_with_chunked_is_refused_and_closed,
    oversized_body_is_413_before_it_is_read,
    curl_large_body_with_expect_100_continue,
    expect_continue_is_not_sent_for_refused_requests,
    silent_and_slow_clients_are_dropped,
    trickled_heads_are_answered,
    oversized_head_is_431_and_bad_request_line_400,
    json_body_rules,
    repeated_query_parameter_is_400,
    auth_matrix,
    capabilities_document_shape,
    custom_routes_appear_and_opt_in_groups_answer_the_contract_404,
    capabilities_check_answers,
    openapi_document_lists_every_endpoint,
    handler_panic_is_500_and_the_connection_lives_on,
    sse_events_are_framed_and_flushed_one_by_one,
    policy_file_sets_revision_and_switches,
    bad_configuration_exits_2_with_one_line,
    uncreatable_base_dir_is_a_warning,
    second_server_on_a_held_port_exits_2,
    host_names_resolve,
    refusals_before_the_handler_speak_the_routes_envelope,
    cross_origin_requests_are_refused,
    missing_base_dir_is_created_and_commands_run_there,
    sigterm_finishes_in_flight_requests,
    workers_share_one_port,
);

/// The binaries carry their unwinder (build.rs): loading `libgcc_s.so.1` and running its
/// constructor cost every cold start 0.08-0.4 ms here. A handler's panic still unwinds to
/// a 500 (`handler_panic_is_500_and_the_connection_lives_on`, with the embedding example).
#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn the_binaries_do_not_load_libgcc_s() {
    for bin in [crate::support::MAIN_BIN, crate::support::EXAMPLE_BIN] {
        let image = std::fs::read(bin).unwrap();
        assert!(
            !image.windows(8).any(|w| w == b"libgcc_s"),
            "{bin} names libgcc_s: the build no longer links libgcc_eh in its place"
        );
    }
}
