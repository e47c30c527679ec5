//! The commands group against the real binary: Rust commands registered by an
//! embedding program, and a template's `commands.py` served through the Python bridge
//! (real `python3`, the repository's uninstalled `agent_sandbox` package).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::on_both_drivers;
use crate::support::{open_event_stream, read_event, request_at, Launch, Server, TempDir};

fn run(server: &Server, name: &str, body: Value) -> (u16, Value) {
    server.post_json(&format!("/commands/{name}"), body)
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bridge_app.py")
}

fn example_template() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/templates/python-hello")
}

fn bridge_server(driver: &'static str) -> Server {
    Launch::python(driver, &fixture())
        .env("ABX_BRIDGE_HANG_TIMEOUT", "1")
        .start()
}

/// `POST /commands/{name}` with `body` from `calls` threads at once: each (status, JSON).
fn run_at_once(server: &Server, name: &str, body: &str, calls: usize) -> Vec<(u16, Value)> {
    let addr = server.addr;
    let path = format!("/commands/{name}");
    let threads: Vec<_> = (0..calls)
        .map(|_| {
            let (path, body) = (path.clone(), body.to_string());
            std::thread::spawn(move || {
                let reply = request_at(addr, "POST", &path, &[], Some(body.as_bytes()));
                (reply.status, reply.json())
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// The listing entry of command `name`.
fn listed(listing: &Value, name: &str) -> Value {
    listing["commands"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not listed: {listing}"))
        .clone()
}

fn names(listing: &Value) -> Vec<String> {
    listing["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

/// The contract's `hello` example and the binding rules, whichever language the
/// commands are written in.
fn check_contract_examples(server: &Server) {
    let listing = server.get("/commands").json();
    let listed = names(&listing);
    assert!(listed.contains(&"hello".to_string()), "{listing}");
    assert!(
        !listed.contains(&"_debug_info".to_string()),
        "hidden commands are not listed: {listing}"
    );
    let hello = &listing["commands"][listed.iter().position(|n| n == "hello").unwrap()];
    assert_eq!(
        hello,
        &json!({"name": "hello", "description": "Say hello.", "args": [
            {"name": "name", "type": "string", "required": false, "default": "World", "description": ""}
        ]})
    );
    assert_eq!(
        run(server, "hello", json!({"name": "Ada"})),
        (200, json!({"result": "Hello, Ada!"}))
    );
    assert_eq!(
        run(server, "hello", json!({})),
        (200, json!({"result": "Hello, World!"}))
    );
    // An empty body is {}.
    let reply = server.request("POST", "/commands/hello", &[], None);
    assert_eq!(reply.json(), json!({"result": "Hello, World!"}));
    let (status, body) = run(server, "_debug_info", json!({}));
    assert_eq!(
        (status, &body["result"]["ok"]),
        (200, &json!(true)),
        "{body}"
    );
    let (status, body) = run(server, "no_such_command", json!({}));
    assert_eq!((status, body["type"].as_str()), (404, Some("ValueError")));
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("Unknown command: no_such_command"),
        "{body}"
    );
    // A body that is not a JSON object is refused before any command runs.
    let reply = server.post("/commands/hello", "[1, 2]");
    assert_eq!(reply.status, 400);
    let caps = server.get("/capabilities").json();
    assert_eq!(caps["endpoints"]["list_commands"]["enabled"], true);
    assert_eq!(caps["endpoints"]["run_command"]["path"], "/commands/{name}");
}

fn rust_commands_follow_the_contract(driver: &'static str) {
    let server = Launch::example(driver).start();
    check_contract_examples(&server);
    let listing = server.get("/commands").json();
    let types = listed(&listing, "types");
    assert_eq!(
        types["args"][0],
        json!({"name": "count", "type": "integer", "required": true, "default": null, "description": "How many."})
    );
    assert_eq!(types["args"][2]["type"], "boolean");
    // Coercion as Python's int(), float(), the boolean words and str().
    for (body, expected) in [
        (
            json!({"count": "12", "ratio": "1e3", "loud": "YES", "label": [1, null]}),
            json!({"count": 12, "ratio": 1000.0, "loud": true, "label": "[1, None]"}),
        ),
        (
            json!({"count": 2.9, "ratio": 2, "loud": 0, "label": 7}),
            json!({"count": 2, "ratio": 2.0, "loud": false, "label": "7"}),
        ),
        (
            json!({"count": true, "loud": "no", "label": null}),
            json!({"count": 1, "ratio": 0.5, "loud": false, "label": "None"}),
        ),
        (
            json!({"count": " -1_000 ", "loud": "False"}),
            json!({"count": -1000, "ratio": 0.5, "loud": false}),
        ),
    ] {
        assert_eq!(
            run(&server, "types", body.clone()),
            (200, json!({ "result": expected })),
            "{body}"
        );
    }
    for (body, message) in [
        (json!({}), "Missing required argument: count"),
        (
            json!({"count": "3.5"}),
            "Invalid value for count: invalid literal for int() with base 10: '3.5'",
        ),
        (
            json!({"count": 1, "ratio": "fast"}),
            "Invalid value for ratio: could not convert string to float: 'fast'",
        ),
        (json!({"count": 1, "loud": "maybe"}), "Invalid value for loud: Invalid boolean: 'maybe'"),
        (
            json!({"count": null}),
            "Invalid value for count: int() argument must be a string, a bytes-like object or a real number, not 'NoneType'",
        ),
    ] {
        let (status, reply) = run(&server, "types", body.clone());
        assert_eq!(status, 400, "{body}: {reply}");
        assert!(
            reply["error"].as_str().unwrap().starts_with(message),
            "{body}: {reply}"
        );
    }
    assert_eq!(
        run(&server, "divide", json!({"a": 1, "b": 0})),
        (
            500,
            json!({"error": "division by zero", "type": "ZeroDivisionError"})
        )
    );
    assert_eq!(
        run(&server, "divide", json!({"a": "9", "b": 2})),
        (200, json!({"result": 4}))
    );
}

fn python_commands_bind_like_rust_commands(driver: &'static str) {
    let server = bridge_server(driver);
    check_contract_examples(&server);
    let listing = server.get("/commands").json();
    let types = listed(&listing, "types");
    assert_eq!(
        types,
        json!({"name": "types", "description": "Report what arrived, with Python's type names.", "args": [
            {"name": "count", "type": "integer", "required": true, "default": null, "description": ""},
            {"name": "ratio", "type": "float", "required": false, "default": 0.5, "description": ""},
            {"name": "loud", "type": "boolean", "required": false, "default": false, "description": ""},
            {"name": "label", "type": "string", "required": false, "default": "unset", "description": ""},
            {"name": "nothing", "type": "string", "required": false, "default": null, "description": ""},
        ]})
    );
    let described = listed(&listing, "described");
    assert_eq!(
        described["args"],
        json!([{"name": "who", "type": "string", "required": true, "default": null, "description": "Whom to greet."}])
    );
    // The Python function receives Python values of the declared types; a None
    // default is not passed, so the function's own default (None) applies.
    let (status, body) = run(
        &server,
        "types",
        json!({"count": "12", "ratio": "1e3", "loud": "YES", "label": {"a": [true]}}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["result"],
        json!({
            "count": [12, "int"], "ratio": [1000.0, "float"], "loud": [true, "bool"],
            "label": ["{'a': [True]}", "str"], "nothing": [null, "NoneType"],
        })
    );
    let (status, body) = run(&server, "types", json!({"count": "x"}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"],
        "Invalid value for count: invalid literal for int() with base 10: 'x'"
    );
    // An exception is a 500 with its message and class name.
    assert_eq!(
        run(&server, "fail", json!({"reason": "no more"})),
        (500, json!({"error": "no more", "type": "QuotaExceeded"}))
    );
    // Omitted arguments get the function's own default objects, listed as their str().
    assert_eq!(
        run(&server, "defaults", json!({})),
        (200, json!({"result": ["PosixPath", "tuple", true]}))
    );
    let listed = listed(&listing, "defaults");
    assert_eq!(
        listed["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["default"].clone())
            .collect::<Vec<_>>(),
        [json!("/tmp"), json!("('a', 'b')"), json!("inf")]
    );
    // An exception outside Exception (a BaseException) is still an answer.
    assert_eq!(
        run(&server, "cancelled", json!({})),
        (500, json!({"error": "gone", "type": "CancelledError"}))
    );
    // Values json cannot encode are stringified, as the contract's encoder does.
    let (status, body) = run(&server, "not_json", json!({}));
    assert_eq!(status, 200, "{body}");
    assert!(
        body["result"]["when"]
            .as_str()
            .unwrap()
            .starts_with("<object object at"),
        "{body}"
    );
}

fn worker_pid(server: &Server) -> i64 {
    let (status, body) = run(server, "_debug_info", json!({}));
    assert_eq!(status, 200, "{body}");
    body["result"]["pid"].as_i64().unwrap()
}

/// Runs `command`, which ends the worker: the call is a 500 `worker_lost` whose message
/// contains `says`, and the next call waits for a new worker instead of failing.
/// Returns the new worker's pid.
fn ends_the_worker(server: &Server, command: &str, says: &str) -> i64 {
    let first_pid = worker_pid(server);
    let (status, body) = run(server, command, json!({}));
    assert_eq!(
        (status, body["code"].as_str()),
        (500, Some("worker_lost")),
        "{body}"
    );
    assert!(body["error"].as_str().unwrap().contains(says), "{body}");
    let second_pid = worker_pid(server);
    assert_ne!(second_pid, first_pid);
    assert!(
        !Path::new(&format!("/proc/{first_pid}")).exists(),
        "the ended worker was reaped"
    );
    second_pid
}

fn a_crashing_python_worker_is_restarted(driver: &'static str) {
    let server = bridge_server(driver);
    ends_the_worker(&server, "crash", "exit status 3");
    assert_eq!(
        run(&server, "hello", json!({"name": "again"})).1,
        json!({"result": "Hello, again!"})
    );
}

fn a_hung_python_worker_is_killed_and_restarted(driver: &'static str) {
    let server = bridge_server(driver);
    // The worker stops itself (SIGSTOP): it answers neither this call nor pings.
    let second_pid = ends_the_worker(&server, "freeze", "did not answer");
    // A worker that answers its pings is left alone, even with a 1 s hang timeout.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(worker_pid(&server), second_pid);
}

fn python_calls_run_concurrently(driver: &'static str) {
    let server = bridge_server(driver);
    // `rendezvous` returns only when 8 calls are inside it at once (a barrier), so
    // calls that were serialised anywhere on the way would break it.
    let mut positions: Vec<i64> = run_at_once(&server, "rendezvous", "{}", 8)
        .into_iter()
        .map(|(status, body)| {
            assert_eq!(status, 200, "{body}");
            body["result"].as_i64().unwrap()
        })
        .collect();
    positions.sort();
    assert_eq!(positions, (0..8).collect::<Vec<i64>>());
}

fn python_routes_are_endpoints(driver: &'static str) {
    let server = Launch::python(driver, &fixture())
        .env("ABX_SERVER_TOKEN", "sesame")
        .env("BRIDGE_ENABLE_DEV_TOOLS", "1")
        .start();
    let auth = [("X-Access-Token", "sesame")];
    let reply = server.request("GET", "/hello/Bob?x=1", &auth, None);
    assert_eq!(
        (reply.status, reply.json()),
        (200, json!({"greeting": "Hello, Bob!", "query": {"x": "1"}}))
    );
    assert_eq!(
        server.get("/hello/Bob").status,
        401,
        "auth is required by default"
    );
    assert_eq!(
        server.get("/open/ping").json(),
        json!({"pong": true}),
        "auth_required=False stays open with a token set"
    );
    let reply = server.request("POST", "/echo", &auth, Some(br#"{"a": [1, 2]}"#));
    assert_eq!(
        reply.json(),
        json!({"body": {"a": [1, 2]}, "method": "POST", "identity": "server"})
    );
    let reply = server.request("POST", "/echo", &auth, Some(br#"{"fail": true}"#));
    assert_eq!(
        (reply.status, reply.json()),
        (
            418,
            json!({"error": "asked to fail", "type": "TeapotError"})
        )
    );
    let caps = server.request("GET", "/capabilities", &auth, None).json();
    let route = &caps["endpoints"]["GET /hello/{name}"];
    assert_eq!(
        (route["group"].as_str(), route["enabled"].as_bool()),
        (Some("commands"), Some(true)),
        "{route}"
    );
    assert_eq!(caps["endpoints"]["echo"]["summary"], "Echo the body.");
    assert_eq!(caps["endpoints"]["GET /ticks"]["streaming"], true);
    assert!(caps["group_summary"]["commands"]["total"].as_u64().unwrap() >= 6);
    // enable_group / disable_group on the route table end in the same per-endpoint rules.
    let reply = server.request("GET", "/opt-in/thing", &auth, None);
    assert_eq!(reply.json(), json!({"opted_in": true}));
    assert_eq!(caps["endpoints"]["GET /opt-in/thing"]["enabled"], true);
    assert_eq!(
        caps["groups"]["dev_tools"], true,
        "dev_tools is opt-in: on only by enable_group"
    );
    let reply = server.request("GET", "/off/thing", &auth, None);
    assert_eq!(reply.status, 404);
    assert_eq!(reply.json()["code"], "endpoint_disabled");
    assert_eq!(reply.json()["rule"], "code:disable_group:file_ops");
    // Custom routes are not commands.
    let listing = server.request("GET", "/commands", &auth, None).json();
    assert!(!names(&listing).iter().any(|n| n.contains("hello/")));
}

fn python_streams_pass_through_and_stop_when_the_client_leaves(driver: &'static str) {
    let markers = TempDir::new("markers");
    let server = Launch::python(driver, &fixture())
        .env("BRIDGE_MARKERS", markers.path().to_str().unwrap())
        .start();
    let reply = server.get("/ticks?n=3");
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    assert_eq!(
        reply.text(),
        "event: tick\ndata: {\"n\": 0}\n\nevent: tick\ndata: {\"n\": 1}\n\nevent: tick\ndata: {\"n\": 2}\n\n"
    );
    // An iterator that raises ends the stream with an error event.
    let text = server.get("/ticks?n=1&then=raise").text();
    assert!(
        text.ends_with(
            "event: error\ndata: {\"error\":\"the iterator broke\",\"type\":\"RuntimeError\"}\n\n"
        ),
        "{text}"
    );
    // A client that leaves an endless stream: the Python iterator is closed.
    let marker = markers.path().join("ticks-closed");
    let _ = std::fs::remove_file(&marker);
    let mut stream = open_event_stream(
        &server,
        b"GET /ticks?n=1&then=forever HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(read_event(&mut stream).0, "tick");
    assert_eq!(read_event(&mut stream).0, "tick");
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !marker.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        marker.exists(),
        "the iterator was not closed after the client left"
    );
    // The worker is still fine.
    assert_eq!(
        run(&server, "hello", json!({})).1,
        json!({"result": "Hello, World!"})
    );
}

fn a_script_that_never_starts_is_a_clear_error(driver: &'static str) {
    let dir = TempDir::new("nostart");
    let script = dir.path().join("commands.py");
    std::fs::write(
        &script,
        "import os\nfrom agent_sandbox.server import command, start\n\
         if os.environ.get('ABX_BRIDGE_FDS'):\n    raise SystemExit('no start in the worker')\n\
         start(9000)\n",
    )
    .unwrap();
    let (code, stderr) = Launch::python(driver, &script).fail();
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("did not register"), "{stderr}");
}

fn python_commands_see_post_env(driver: &'static str) {
    let server = bridge_server(driver);
    assert_eq!(
        run(&server, "getenv", json!({"name": "BRIDGE_SET_LATER"})).1["result"],
        json!({"os_environ": null, "child": null})
    );
    let reply = server.post("/env", r#"{"vars": {"BRIDGE_SET_LATER": "42"}}"#);
    assert_eq!(reply.status, 200, "{}", reply.text());
    // Whichever server worker takes the call, its link passes the change on first.
    for _ in 0..4 {
        assert_eq!(
            run(&server, "getenv", json!({"name": "BRIDGE_SET_LATER"})).1["result"],
            json!({"os_environ": "42", "child": "42"})
        );
    }
    let reply = server.post("/env", r#"{"vars": {"BRIDGE_SET_LATER": "43"}}"#);
    assert_eq!(reply.status, 200, "{}", reply.text());
    // Concurrent calls reach both server workers' links; none sees the old value.
    for (_, body) in run_at_once(&server, "getenv", r#"{"name": "BRIDGE_SET_LATER"}"#, 6) {
        assert_eq!(body["result"], json!({"os_environ": "43", "child": "43"}));
    }
}

fn a_private_registry_is_served(driver: &'static str) {
    let dir = TempDir::new("private");
    let script = dir.path().join("commands.py");
    std::fs::write(
        &script,
        "from agent_sandbox.server import CommandRegistry, SandboxServer, command\n\
         @command()\ndef global_one():\n    return 'not served'\n\
         registry = CommandRegistry()\n\
         @registry.command('private', description='Mine.')\ndef private(n: int = 2):\n    return n * 'x'\n\
         SandboxServer(registry=registry).serve(port=9000)\n",
    )
    .unwrap();
    let server = Launch::python(driver, &script).start();
    assert_eq!(names(&server.get("/commands").json()), ["private"]);
    assert_eq!(
        run(&server, "private", json!({"n": "3"})),
        (200, json!({"result": "xxx"}))
    );
    assert_eq!(run(&server, "global_one", json!({})).0, 404);
}

fn scopes_hide_and_refuse_commands_per_identity(driver: &'static str) {
    let dir = TempDir::new("identities");
    let policy = dir.path().join("policy.json");
    // sha256("r-token"), as `printf r-token | sha256sum` prints it.
    let reader_digest = "90fedcbce452b5a8a6f979579502bffa56b69a8a3543833062e46632f658e0b8";
    std::fs::write(
        &policy,
        json!({
            "identities": [
                {"id": "reader", "scopes": ["files:read", "commands:list", "commands:run", "terminal:use"], "token_sha256": reader_digest},
                {"id": "admin", "scopes": ["example:admin", "commands:*"], "token_env": "TEST_ADMIN_TOKEN"},
            ],
            "endpoints": {"shell": {"scopes": ["shell:run"]}},
        })
        .to_string(),
    )
    .unwrap();
    let policy_path = policy.to_str().unwrap();
    let check_as = |server: &Server, token: &str| {
        let auth = [("X-Access-Token", token)];
        let listed = names(&server.request("GET", "/commands", &auth, None).json());
        let run = server.request("POST", "/commands/admin_only", &auth, Some(b"{}"));
        let shell = server.request("POST", "/shell", &auth, Some(br#"{"command": "true"}"#));
        let identity =
            server.request("GET", "/capabilities", &auth, None).json()["identity"].clone();
        (listed, run.status, run.json(), shell.status, identity)
    };
    for server in [
        Launch::example(driver)
            .env("ABX_SERVER_POLICY", policy_path)
            .env("TEST_ADMIN_TOKEN", "a-token")
            .start(),
        Launch::python(driver, &fixture())
            .env("ABX_SERVER_POLICY", policy_path)
            .env("TEST_ADMIN_TOKEN", "a-token")
            .start(),
    ] {
        let (listed, status, body, shell, identity) = check_as(&server, "r-token");
        assert!(!listed.contains(&"admin_only".to_string()), "{listed:?}");
        assert!(listed.contains(&"hello".to_string()));
        assert_eq!(
            (status, body["code"].as_str()),
            (403, Some("missing_scope")),
            "{body}"
        );
        assert_eq!(shell, 403, "the policy's endpoint scope");
        assert_eq!(
            identity,
            json!({"id": "reader", "scopes": ["commands:list", "commands:run", "files:read", "terminal:use"]})
        );
        let (listed, status, body, shell, identity) = check_as(&server, "a-token");
        assert!(listed.contains(&"admin_only".to_string()), "{listed:?}");
        assert_eq!((status, body), (200, json!({"result": "secret"})));
        assert_eq!(shell, 403);
        assert_eq!(identity["id"], "admin");
        let wrong = server.request("GET", "/commands", &[("X-Access-Token", "wrong")], None);
        assert_eq!(wrong.status, 401);
        // Each caller has a token of their own: a terminal's ws_url carries none.
        let auth = [("X-Access-Token", "r-token")];
        let created = server.request(
            "POST",
            "/pty/sessions",
            &auth,
            Some(br#"{"shell": "/bin/sh"}"#),
        );
        let url = created.json()["ws_url"].as_str().unwrap().to_string();
        assert!(!url.contains("token="), "{url}");
    }
    // A token's variable that is not set, or a plain token in the file, stops the server.
    let (code, stderr) = Launch::example(driver)
        .env("ABX_SERVER_POLICY", policy_path)
        .fail();
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("TEST_ADMIN_TOKEN"), "{stderr}");
    std::fs::write(
        &policy,
        r#"{"identities": [{"id": "x", "token": "plain"}]}"#,
    )
    .unwrap();
    let (code, stderr) = Launch::example(driver)
        .env("ABX_SERVER_POLICY", policy_path)
        .fail();
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("never holds a token itself"), "{stderr}");
}

on_both_drivers!(
    scopes_hide_and_refuse_commands_per_identity,
    python_commands_see_post_env,
    a_private_registry_is_served,
    rust_commands_follow_the_contract,
    python_commands_bind_like_rust_commands,
    a_crashing_python_worker_is_restarted,
    a_hung_python_worker_is_killed_and_restarted,
    python_calls_run_concurrently,
    python_routes_are_endpoints,
    python_streams_pass_through_and_stop_when_the_client_leaves,
    a_script_that_never_starts_is_a_clear_error,
);

/// The example template as a user adopts it: a fresh virtual environment, `pip install
/// ./python` (maturin builds the wheel with the binary), `python3 commands.py`, and
/// `call_api.py` against it.
#[test]
fn example_template_runs_from_a_pip_installed_package() {
    let venv = TempDir::new("venv");
    let python = venv.path().join("bin/python3");
    let status = std::process::Command::new("python3")
        .args(["-m", "venv"])
        .arg(venv.path())
        .status()
        .unwrap();
    assert!(status.success());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = std::process::Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "./python"])
        .current_dir(root)
        // Reuse this checkout's build cache: the wheel's binary is a release build.
        .env("CARGO_TARGET_DIR", root.join("target"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "pip install ./python failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let installed = venv.path().join("bin/agent-sandbox");
    assert!(
        installed.exists(),
        "the wheel installs the binary into the venv's bin/"
    );
    let workdir = TempDir::new("template");
    std::fs::copy(
        example_template().join("commands.py"),
        workdir.path().join("commands.py"),
    )
    .unwrap();
    let mut server = std::process::Command::new(&python)
        .arg("commands.py")
        .current_dir(workdir.path())
        // No ABX_SERVER_BIN and no PYTHONPATH: the module finds the binary it came with.
        .env_remove("ABX_SERVER_BIN")
        .env_remove("PYTHONPATH")
        .env("ABX_SERVER_HOST", "127.0.0.1")
        .env("ABX_SERVER_PORT", "0")
        .env("ABX_PTY_PORT", "0")
        .env("ABX_SERVER_WORKERS", "1")
        .env("ABX_SERVER_BASE_DIR", workdir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = server.id();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("the server printed its address")
            .unwrap();
        if let Some(addr) = line.strip_prefix("listening on ") {
            break addr.to_string();
        }
    };
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(
        std::fs::canonicalize(&installed).unwrap(),
        exe,
        "python3 commands.py became the installed server (same pid)"
    );
    let client = std::process::Command::new(&python)
        .arg(example_template().join("call_api.py"))
        .env("ABX_TEMPLATE_URL", format!("http://{addr}"))
        .env_remove("ABX_SERVER_TOKEN")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&client.stdout).into_owned();
    let _ = server.kill();
    let _ = server.wait();
    assert!(client.status.success(), "call_api.py failed: {said}");
    assert!(
        said.contains("hello: 200 {'result': 'Hello, Ada!'}"),
        "{said}"
    );
    assert!(said.contains("commands: 200 ['hello']"), "{said}");
}
