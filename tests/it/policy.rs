//! Policy documents against the real binary: YAML and JSON, a template's template.yaml,
//! presets, and `--check-policy`.

use std::process::Command;

use serde_json::json;

use crate::on_both_drivers;
use crate::support::{Launch, TempDir, MAIN_BIN};

fn check_policy(path: &std::path::Path) -> (i32, String, String) {
    let output = Command::new(MAIN_BIN)
        .arg("--check-policy")
        .arg(path)
        .env_remove("ABX_SERVER_POLICY")
        .env_remove("ABX_SERVER_ENABLED_GROUPS")
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The row of `--check-policy`'s table for endpoint `id`: (enabled, rule).
fn row(table: &str, id: &str) -> (String, String) {
    let line = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .unwrap_or_else(|| panic!("no row for {id} in\n{table}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].to_string(), fields[4].to_string())
}

#[test]
fn check_policy_prints_every_preset_and_refuses_bad_documents() {
    let dir = TempDir::new("checkpolicy");
    for (preset, on, off) in [
        (
            "default",
            vec!["upload", "shell", "pty_connect"],
            vec!["code_run"],
        ),
        (
            "locked-down",
            vec![
                "download",
                "files_list",
                "list_commands",
                "run_command",
                "health",
            ],
            vec!["upload", "shell", "pty_create_session", "env_set"],
        ),
        (
            "read-only",
            vec!["download", "files_search", "env_get", "list_commands"],
            vec![
                "upload",
                "shell",
                "process_list",
                "run_command",
                "git_status",
                "pty_connect",
            ],
        ),
    ] {
        let path = dir.path().join(format!("{preset}.yaml"));
        std::fs::write(&path, format!("preset: {preset}\n")).unwrap();
        let (code, table, stderr) = check_policy(&path);
        assert_eq!(code, 0, "{stderr}");
        assert!(table.contains(&format!("preset={preset}")), "{table}");
        for id in on {
            assert_eq!(row(&table, id).0, "true", "{preset}: {id}\n{table}");
        }
        for id in off {
            assert_eq!(row(&table, id).0, "false", "{preset}: {id}\n{table}");
        }
        if preset != "default" {
            assert_eq!(row(&table, "upload").1, format!("preset:{preset}"));
        }
    }
    // Errors name the key and its line, and exit 2.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "preset: default\nendpoints:\n  shell:\n    enabled: sometimes\n",
    )
    .unwrap();
    let (code, _, stderr) = check_policy(&bad);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("line 4: endpoints.shell.enabled must be true or false"),
        "{stderr}"
    );
    std::fs::write(&bad, "groups: [process\n").unwrap();
    let (code, _, stderr) = check_policy(&bad);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("line 2") || stderr.contains("line 1"),
        "{stderr}"
    );
    std::fs::write(&bad, "preset: paranoid\n").unwrap();
    let (code, _, stderr) = check_policy(&bad);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("preset: unknown \"paranoid\"")
            && stderr.contains(
                "allowed: default, transfer-only, read-only, hardened, locked, locked-down"
            ),
        "{stderr}"
    );
}

/// Writes `text` to `policy` and starts a server on it, which must refuse to start
/// (exit 2): its stderr.
fn refused(driver: &'static str, policy: &std::path::Path, text: &str) -> String {
    std::fs::write(policy, text).unwrap();
    let (code, stderr) = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .fail();
    assert_eq!(code, 2, "{stderr}");
    stderr
}

fn yaml_policies_and_template_yaml_are_applied(driver: &'static str) {
    let dir = TempDir::new("yamlpolicy");
    let policy = dir.path().join("policy.yml");
    std::fs::write(
        &policy,
        "# YAML, with comments\npreset: read-only\ngroups:\n  dev_tools: true\nendpoints:\n  code_run: {enabled: false}\n",
    )
    .unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    let caps = server.get("/capabilities").json();
    assert_eq!(caps["policy"]["preset"], "read-only");
    assert_eq!(caps["endpoints"]["upload"]["rule"], "preset:read-only");
    assert_eq!(
        caps["endpoints"]["git_status"]["enabled"], true,
        "the document's group beats the preset"
    );
    assert_eq!(
        caps["endpoints"]["code_run"]["rule"],
        "policy:endpoints.code_run"
    );
    let reply = server.post("/upload", r#"{"path": "x.txt", "content_base64": ""}"#);
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (404, json!("endpoint_disabled"))
    );
    // A knob the endpoint it names does not apply is never accepted and ignored.
    let stderr = refused(
        driver,
        &policy,
        "endpoints:\n  upload: {url_allow: [\"https://x\"]}\n",
    );
    assert!(
        stderr.contains("endpoints.upload: url_allow is not applied by endpoint 'upload'"),
        "{stderr}"
    );

    // A template directory: its template.yaml's server: section is the policy of a
    // server started there without ABX_SERVER_POLICY.
    let template = TempDir::new("templatedir");
    std::fs::write(
        template.path().join("template.yaml"),
        "name: t\nports: [9000, 9001]\nserver:\n  groups: [dev_tools]\n  endpoints:\n    shell: {enabled: false}\n",
    )
    .unwrap();
    let mut launch = Launch::new(driver);
    launch.current_dir = Some(template.path().to_path_buf());
    let server = launch.start();
    let caps = server.get("/capabilities").json();
    assert_eq!(caps["policy"]["configured"], true);
    assert_eq!(caps["endpoints"]["code_run"]["enabled"], true);
    assert_eq!(caps["endpoints"]["shell"]["rule"], "policy:endpoints.shell");
}

fn per_endpoint_knobs_are_enforced(driver: &'static str) {
    let dir = TempDir::new("knobs");
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        json!({
            "groups": ["dev_tools"],
            "endpoints": {
                "shell": {"commands": {"deny": ["rm", "curl*"]}, "timeout_seconds": 1, "max_output_bytes": 10},
                "process_start": {"commands": {"allow": ["sleep", "echo"]}},
                "env_set": {"allow_vars": ["APP_*", "SECRET_*"], "deny_vars": ["SECRET_*"]},
                "env_get": {"deny_vars": ["APP_HIDDEN"]},
                "code_run": {"languages": ["bash"]},
                "upload": {"deny_extensions": [".EXE"], "max_upload_bytes": 4, "overwrite": false},
                "files_upload_stream": {"allow_extensions": ["txt"], "overwrite": false},
                "files_archive": {"max_files": 2},
                "files_search": {"max_depth": 1, "max_files": 1},
            }
        })
        .to_string(),
    )
    .unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    let post = |path: &str, body: serde_json::Value| {
        let reply = server.post(path, &body.to_string());
        (reply.status, reply.json())
    };
    for command in ["rm -rf nothing", "/bin/rm nothing", "curl-config --version"] {
        let (status, body) = post("/shell", json!({"command": command}));
        assert_eq!(
            (status, body["code"].as_str(), body["endpoint"].as_str()),
            (403, Some("command_not_allowed"), Some("shell")),
            "{command}: {body}"
        );
    }
    let (status, body) = post("/shell", json!({"command": "echo 0123456789abcdef"}));
    assert_eq!(
        (status, &body["stdout"], &body["truncated"]),
        (200, &json!("0123456789"), &json!(true)),
        "{body}"
    );
    for body in [
        json!({"command": "sleep 5"}),
        json!({"command": "sleep 5", "timeout": 30}),
    ] {
        let (status, answer) = post("/shell", body);
        assert_eq!(
            (status, answer["error"].as_str()),
            (500, Some("Command timed out after 1s")),
            "{answer}"
        );
    }
    let (status, body) = post("/process/start", json!({"command": "ls"}));
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("command_not_allowed")),
        "{body}"
    );
    assert_eq!(
        post("/process/start", json!({"command": "sleep 0.1"})).0,
        200
    );

    assert_eq!(
        post("/env", json!({"vars": {"APP_X": "1", "APP_HIDDEN": "2"}})).0,
        200
    );
    for name in ["OTHER", "SECRET_A"] {
        let (status, body) = post("/env", json!({"vars": {name: "1"}}));
        assert_eq!(
            (status, body["code"].as_str(), body["endpoint"].as_str()),
            (403, Some("env_var_not_allowed"), Some("env_set")),
            "{name}: {body}"
        );
    }
    assert_eq!(
        server.get("/env?filter=APP_X,APP_HIDDEN").json(),
        json!({"variables": {"APP_X": "1"}})
    );

    let (status, body) = post(
        "/code/run",
        json!({"code": "print(1)", "language": "python"}),
    );
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("language_not_allowed")),
        "{body}"
    );
    assert_eq!(
        post("/code/run", json!({"code": "echo ok", "language": "bash"})).1["stdout"],
        "ok\n"
    );

    // Uploads: extensions (case-insensitive) and the policy's size cap.
    for path in ["tool.exe", "tool.exe/", "sub/../tool.EXE/."] {
        let (status, body) = post("/upload", json!({"path": path, "content_base64": "AA=="}));
        assert_eq!(
            (status, body["code"].as_str()),
            (403, Some("extension_not_allowed")),
            "{path}: {body}"
        );
    }
    let (status, body) = post(
        "/upload",
        json!({"path": "five.bin", "content_base64": "AAAAAAA="}),
    );
    assert_eq!(
        (status, body["code"].as_str()),
        (413, Some("payload_too_large")),
        "{body}"
    );
    assert_eq!(
        post(
            "/upload",
            json!({"path": "four.bin", "content_base64": "AAAAAA=="})
        )
        .0,
        200
    );
    // overwrite: false, decided at the rename itself.
    let (status, body) = post(
        "/upload",
        json!({"path": "four.bin", "content_base64": "AQ=="}),
    );
    assert_eq!(
        (status, body["type"].as_str()),
        (409, Some("FileExistsError")),
        "{body}"
    );
    assert_eq!(
        std::fs::read(server.base_dir().join("four.bin")).unwrap(),
        [0, 0, 0, 0]
    );
    // The refused write's temporary file went with the refusal.
    let left: Vec<_> = std::fs::read_dir(server.base_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with(".four.bin"))
        .collect();
    assert_eq!(left, Vec::<String>::new());
    let raw = server.request(
        "POST",
        "/files/upload-stream?path=notes.md",
        &[("Content-Type", "application/octet-stream")],
        Some(b"hi"),
    );
    assert_eq!(
        (raw.status, raw.json()["code"].clone()),
        (403, json!("extension_not_allowed"))
    );
    assert!(!server.base_dir().join("notes.md").exists());
    let raw = server.request(
        "POST",
        "/files/upload-stream?path=notes.txt",
        &[("Content-Type", "application/octet-stream")],
        Some(b"hi"),
    );
    assert_eq!(raw.status, 200);
    let again = server.request(
        "POST",
        "/files/upload-stream?path=notes.txt",
        &[("Content-Type", "application/octet-stream")],
        Some(b"replaced"),
    );
    assert_eq!(again.status, 409, "{}", again.text());
    assert_eq!(
        std::fs::read(server.base_dir().join("notes.txt")).unwrap(),
        b"hi"
    );
    let leftovers: Vec<_> = std::fs::read_dir(server.base_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".abx-"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file stays behind");

    // Archives and searches under lowered limits.
    let tree = server.base_dir().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    for name in ["a.py", "b.py", "c.py", "sub/deep.py"] {
        std::fs::write(tree.join(name), "x").unwrap();
    }
    let (status, body) = post("/files/archive", json!({"paths": ["tree"]}));
    assert_eq!(status, 400, "more than max_files: {body}");
    assert!(body["error"].as_str().unwrap().contains('2'), "{body}");
    let (status, body) = post(
        "/files/search",
        json!({"path": "tree", "pattern": "*.py", "max_results": 50}),
    );
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "max_files caps the results: {body}");
    assert!(
        !results[0].to_string().contains("deep"),
        "max_depth 1, the directory's own files: {body}"
    );

    // /capabilities/check answers from the same rules.
    for (body, code) in [
        (
            json!({"endpoint": "shell", "command": "rm -rf /"}),
            json!("command_not_allowed"),
        ),
        (
            json!({"endpoint": "process_start", "command": "ls"}),
            json!("command_not_allowed"),
        ),
        (
            json!({"endpoint": "upload", "path": "x.exe"}),
            json!("extension_not_allowed"),
        ),
        (
            json!({"endpoint": "shell", "command": "echo fine"}),
            json!(null),
        ),
        (json!({"endpoint": "upload", "path": "x.txt"}), json!(null)),
    ] {
        let (status, answer) = post("/capabilities/check", body.clone());
        assert_eq!((status, &answer["code"]), (200, &code), "{body}: {answer}");
        assert_eq!(answer["allowed"], code.is_null(), "{answer}");
    }

    let caps = server.get("/capabilities").json();
    let limits = &caps["endpoints"]["shell"]["limits"];
    assert_eq!(
        (&limits["timeout_seconds"], &limits["max_output_bytes"]),
        (&json!(1), &json!(10))
    );
    assert_eq!(limits["commands"], json!({"deny": ["rm", "curl*"]}));
}

fn rate_limits_answer_429_with_retry_after(driver: &'static str) {
    let dir = TempDir::new("ratelimit");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "endpoints:\n  env_get:\n    rate_limit: {requests: 3, per_seconds: 60}\n",
    )
    .unwrap();
    // Two workers, a fresh connection per request (each may land on either): the
    // buckets are shared, so exactly 3 pass, as on the reference.
    let server = Launch::new(driver)
        .arg("--workers")
        .arg("2")
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    let statuses: Vec<u16> = (0..12)
        .map(|_| server.get("/env?filter=HOME").status)
        .collect();
    assert_eq!(&statuses[..4], [200, 200, 200, 429]);
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        3,
        "{statuses:?}"
    );
    let reply = server.get("/env?filter=HOME");
    assert_eq!(reply.json()["code"], "rate_limited");
    assert_eq!(reply.json()["endpoint"], "env_get");
    let retry: u64 = reply.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "{retry}");
    // Other endpoints, and the limit shown where callers look.
    assert_eq!(server.get("/system/metrics").status, 200);
    let caps = server.get("/capabilities").json();
    assert_eq!(
        caps["endpoints"]["env_get"]["limits"]["rate_limit"],
        json!({"requests": 3, "per_seconds": 60})
    );
}

fn sighup_reloads_the_policy_and_keeps_a_bad_one_out(driver: &'static str) {
    let dir = TempDir::new("reload");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "endpoints:\n  shell: {enabled: false}\n").unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    let revision = || server.get("/capabilities").json()["policy"]["revision"].clone();
    let first = revision();
    assert_eq!(server.post("/shell", r#"{"command": "true"}"#).status, 404);
    let hangup = || {
        let status = Command::new("kill")
            .args(["-HUP", &server.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    // A good document: swapped in for the requests that follow.
    std::fs::write(
        &policy,
        "endpoints:\n  shell: {enabled: true, commands: {deny: [rm]}}\n",
    )
    .unwrap();
    hangup();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while revision() == first && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let second = revision();
    assert_ne!(second, first, "the revision changes with the document");
    assert_eq!(
        server.post("/shell", r#"{"command": "echo on"}"#).json()["stdout"],
        "on\n"
    );
    assert_eq!(
        server.post("/shell", r#"{"command": "rm -f x"}"#).json()["code"],
        "command_not_allowed"
    );
    // A bad document, and one that moves the base directory: the current policy stays,
    // and the log says why.
    for (doc, says) in [
        ("endpoints: [\n", "not a YAML or JSON policy document"),
        ("base_dir: /elsewhere\n", "takes a restart"),
    ] {
        std::fs::write(&policy, doc).unwrap();
        hangup();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut logged = false;
        while !logged && std::time::Instant::now() < deadline {
            if let Ok(line) = server
                .output
                .recv_timeout(std::time::Duration::from_millis(200))
            {
                logged = line.contains("policy not reloaded") && line.contains(says);
            }
        }
        assert!(logged, "no log line for {doc:?}");
        assert_eq!(revision(), second);
        assert_eq!(
            server.post("/shell", r#"{"command": "echo still"}"#).status,
            200
        );
    }
}

fn paths_rules_confine_endpoints_further(driver: &'static str) {
    let dir = TempDir::new("paths");
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        json!({"endpoints": {
            "download": {"paths": {"allow": ["public/*"], "deny": ["public/secret*"]}},
            "shell": {"paths": {"deny": ["private*"]}},
            "files_list": {"max_depth": 1},
            "files_move": {"paths": {"deny": ["public/*.py"]}},
            "files_search": {"max_duration_seconds": 0.000001},
            "files_archive": {"max_bytes": 5},
        }})
        .to_string(),
    )
    .unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    let base = server.base_dir();
    std::fs::create_dir_all(base.join("public")).unwrap();
    std::fs::create_dir_all(base.join("private")).unwrap();
    for name in ["public/a.txt", "public/secret.txt", "other.txt"] {
        std::fs::write(base.join(name), "x").unwrap();
    }
    assert_eq!(server.get("/download?path=public/a.txt").status, 200);
    let absolute = format!("/download?path={}/public/a.txt", base.display());
    assert_eq!(
        server.get(&absolute).status,
        200,
        "absolute paths are matched beneath the base"
    );
    // Outside `allow` is path_not_allowed; matched by `deny`, path_denied (as the
    // reference words them).
    for (path, code) in [
        ("public/secret.txt", "path_denied"),
        ("other.txt", "path_not_allowed"),
    ] {
        let reply = server.get(&format!("/download?path={path}"));
        assert_eq!(
            (
                reply.status,
                reply.json()["code"].clone(),
                reply.json()["type"].clone()
            ),
            (403, json!(code), json!("PolicyDenied")),
            "{path}"
        );
    }
    let reply = server.post("/shell", r#"{"command": "true", "cwd": "private"}"#);
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (403, json!("path_denied"))
    );
    assert_eq!(
        server
            .post("/shell", r#"{"command": "true", "cwd": "public"}"#)
            .status,
        200
    );
    assert_eq!(
        server.get("/files/stat?path=other.txt").status,
        200,
        "other endpoints are not limited"
    );
    // max_depth 1: a recursive listing shows the directory's own entries only.
    let listing = server.get("/files/list?path=.&recursive=true").text();
    assert!(
        listing.contains("public") && !listing.contains("a.txt"),
        "{listing}"
    );
    // A move into a directory is checked where the file lands.
    std::fs::create_dir_all(base.join("tmp")).unwrap();
    std::fs::write(base.join("tmp/evil.py"), "x").unwrap();
    let reply = server.post(
        "/files/move",
        r#"{"source": "tmp/evil.py", "destination": "public"}"#,
    );
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (403, json!("path_denied")),
        "{}",
        reply.text()
    );
    assert!(base.join("tmp/evil.py").exists());
    // max_duration_seconds: a search that cannot finish in a microsecond says so.
    let found = server
        .post("/files/search", r#"{"path": ".", "pattern": "*.txt"}"#)
        .json();
    assert_eq!(found["timed_out"], true, "{found}");
    // max_bytes: an archive over 5 bytes of content is refused.
    std::fs::write(base.join("public/big.txt"), "0123456789").unwrap();
    let reply = server.post("/files/archive", r#"{"paths": ["public/big.txt"]}"#);
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (413, json!("payload_too_large")),
        "{}",
        reply.text()
    );
    let check = server
        .post(
            "/capabilities/check",
            r#"{"endpoint": "download", "path": "other.txt"}"#,
        )
        .json();
    assert_eq!(
        (check["code"].clone(), check["rule"].clone()),
        (
            json!("path_not_allowed"),
            json!("policy:endpoints.download.paths")
        )
    );
}

#[test]
fn knob_values_are_checked() {
    let dir = TempDir::new("badknobs");
    let path = dir.path().join("policy.yaml");
    for (doc, says) in [
        (
            "endpoints:\n  shell:\n    timeout_seconds: -1\n",
            "line 3: endpoints.shell.timeout_seconds must be a number of seconds above 0",
        ),
        (
            "endpoints:\n  shell:\n    commands: {allow: rm}\n",
            "endpoints.shell.commands must be {allow",
        ),
        (
            "endpoints:\n  upload:\n    overwrite: no-thanks\n",
            "endpoints.upload.overwrite must be true or false",
        ),
    ] {
        std::fs::write(&path, doc).unwrap();
        let (code, _, stderr) = check_policy(&path);
        assert_eq!(code, 2, "{doc}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// A key written twice would drop a rule silently: the server refuses the document,
/// naming the key and the line, at startup and with `--check-policy`.
fn a_repeated_key_stops_the_server(driver: &'static str) {
    let dir = TempDir::new("dupkey");
    let policy = dir.path().join("policy.yaml");
    let stderr = refused(
        driver,
        &policy,
        "endpoints:\n  shell:\n    enabled: false\n  files_list:\n    enabled: false\n  shell:\n    enabled: true\n",
    );
    assert!(
        stderr.contains("duplicate key 'shell'") && stderr.contains("line 6"),
        "{stderr}"
    );
    let (code, _, stderr) = check_policy(&policy);
    assert_eq!(code, 2);
    assert!(stderr.contains("duplicate key 'shell'"), "{stderr}");
}

on_both_drivers!(
    a_repeated_key_stops_the_server,
    yaml_policies_and_template_yaml_are_applied,
    per_endpoint_knobs_are_enforced,
    rate_limits_answer_429_with_retry_after,
    sighup_reloads_the_policy_and_keeps_a_bad_one_out,
    paths_rules_confine_endpoints_further,
);
