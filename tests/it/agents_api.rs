//! The Agents API's CRUD resources (saved agents, environments and their files,
//! environment templates, vaults and credentials) against the real binary, driven by
//! the pinned official `openai` SDK (`tests/fixtures/agents_api_sdk.py`, every answer
//! validated strictly by the SDK's own models) and checked from outside: files land
//! beneath the base directory and nowhere else, secrets are in no answer and in no file
//! of the state directory, the vault key stays out of every environment. No model
//! traffic: these routes run no CLI.

use std::path::Path;

use serde_json::{json, Value};

use crate::support::{pin, tools, Launch, Server, TempDir};

/// A server with the agents group on, two identities (`alice`, `bob`) and its own
/// state directory.
fn server(state: &TempDir, extra: &[(&str, &str)]) -> (Server, TempDir) {
    server_with_rules(state, extra, "")
}

/// [`server`] with policy `rules` ahead of the identities.
fn server_with_rules(state: &TempDir, extra: &[(&str, &str)], rules: &str) -> (Server, TempDir) {
    let dir = TempDir::new("agents-api-policy");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        rules.to_string() + "groups: {agents: true}\nidentities:\n  - {id: alice, scopes: [\"*\"], token_env: ALICE_TOKEN}\n  - {id: bob, scopes: [\"agents:use\"], token_env: BOB_TOKEN}\n",
    )
    .unwrap();
    let mut launch = Launch::new("uring")
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .env("ALICE_TOKEN", "alice-secret")
        .env("BOB_TOKEN", "bob-secret")
        .env("ABX_STATE_DIR", state.path().to_str().unwrap())
        .env("PATH", &tools().path);
    for (name, value) in extra {
        launch = launch.env(name, value);
    }
    (launch.start(), dir)
}

fn as_alice(server: &Server, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let bytes = body.map(|b| b.to_string().into_bytes());
    let reply = server.request(
        method,
        path,
        &[("Authorization", "Bearer alice-secret")],
        bytes.as_deref(),
    );
    assert_eq!(reply.header("x-agent-sandbox-local"), Some("1"), "{path}");
    (reply.status, reply.json())
}

/// Every file's bytes beneath `dir`.
fn all_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                out.push((path.display().to_string(), bytes));
            }
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn the_official_sdk_drives_every_crud_operation() {
    let state = TempDir::new("agents-api-state");
    let (server, _policy) = server(&state, &[]);
    let base = server.base_dir().to_path_buf();
    let outside = TempDir::new("agents-api-outside");
    std::os::unix::fs::symlink(outside.path(), base.join("out")).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agents_api_sdk.py");
    let output = std::process::Command::new(&tools().python)
        .arg(&script)
        .args([
            &format!("http://{}/v1", server.addr),
            "alice-secret",
            "bob-secret",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let version = format!("openai {}", pin("OPENAI_PYTHON_VERSION"));
    assert!(
        stdout.contains(&version),
        "validated with another SDK: {stdout}"
    );

    // What the SDK wrote is beneath the base directory, and the setup command ran once
    // for the key it was sent with twice.
    let read = |rel: &str| std::fs::read_to_string(base.join(rel)).unwrap_or_default();
    assert_eq!(read("sdk/hello.txt"), "hello from the sdk\n");
    assert_eq!(read("sdk/data/b.bin"), "bbb");
    assert_eq!(
        read("sdk/setup.txt"),
        "env-SECRET-value\n",
        "setup commands see env"
    );
    assert_eq!(
        read("sdk/runs.txt"),
        "run\n",
        "one application per Idempotency-Key"
    );
    assert_eq!(read("tpl/t.txt"), "from the template");
    assert_eq!(read("tpl/secret.txt"), "tpl-SECRET-value\n");
    assert!(
        std::fs::read_dir(outside.path()).unwrap().next().is_none(),
        "nothing was written through the symlink out of the base"
    );

    // Secrets are sealed at rest: no file of the state directory (the key file, the
    // store once it is on disk) holds one in clear.
    let files = all_bytes(state.path());
    assert!(
        files.iter().any(|(p, _)| p.ends_with("vault.key")),
        "a key file was made: {:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    for secret in ["tok-SECRET", "oauth-SECRET", "env-SECRET", "tpl-SECRET"] {
        for (path, bytes) in &files {
            assert!(!contains(bytes, secret), "{secret} in clear in {path}");
        }
    }
    // Nor in anything the server printed.
    let printed: Vec<String> = server.output.try_iter().collect();
    for secret in ["tok-SECRET", "oauth-SECRET", "env-SECRET", "tpl-SECRET"] {
        assert!(
            !printed.iter().any(|l| l.contains(secret)),
            "{secret} in the server's output"
        );
    }
}

#[test]
fn literal_agents_paths_win_over_agent_ids() {
    let state = TempDir::new("agents-api-state");
    let (server, _policy) = server(&state, &[]);
    let (status, runtimes) = as_alice(&server, "GET", "/v1/agents/runtimes", None);
    assert_eq!(status, 200, "{runtimes}");
    assert_eq!(runtimes["object"], "list");
    assert_eq!(runtimes["data"][0]["object"], "agent.runtime", "{runtimes}");
    let (status, envs) = as_alice(&server, "GET", "/v1/agents/environments", None);
    assert_eq!(
        (status, envs["data"][0]["object"].clone()),
        (200, json!("agent.environment"))
    );
    let (status, templates) = as_alice(&server, "GET", "/v1/agents/environments/templates", None);
    assert_eq!(
        (status, templates["object"].clone()),
        (200, json!("list")),
        "{templates}"
    );
    let (status, refusal) = as_alice(&server, "POST", "/v1/agents/executors", Some(json!({})));
    assert_eq!(status, 404);
    assert_eq!(refusal["error"]["code"], "agents.not_implemented_locally");
    // An agent id is still an agent id.
    let (status, missing) = as_alice(&server, "GET", "/v1/agents/agent_nope", None);
    assert_eq!(status, 404);
    assert_eq!(missing["error"]["param"], "agent_id", "{missing}");
    let (status, agent) = as_alice(
        &server,
        "POST",
        "/v1/agents",
        Some(json!({"model": "gpt-5"})),
    );
    assert_eq!(status, 200, "{agent}");
    let id = agent["id"].as_str().unwrap();
    let (status, same) = as_alice(&server, "GET", &format!("/v1/agents/{id}"), None);
    assert_eq!((status, same["id"].as_str()), (200, Some(id)));
    // A vault list filter's repeated `status[]` is a list, not a duplicate parameter.
    let (status, page) = as_alice(
        &server,
        "GET",
        "/v1/vaults?status%5B%5D=active&status%5B%5D=archived&metadata%5Bteam%5D=a",
        None,
    );
    assert_eq!(
        (status, page["object"].clone()),
        (200, json!("list")),
        "{page}"
    );
}

#[test]
fn the_vault_key_comes_from_the_environment_and_stays_out_of_it() {
    let state = TempDir::new("agents-api-state");
    let key = "4f".repeat(32);
    let (server, _policy) = server(&state, &[("ABX_AGENTS_VAULT_KEY", &key)]);
    let (status, vault) = as_alice(&server, "POST", "/v1/vaults", Some(json!({"name": "v"})));
    assert_eq!(status, 200, "{vault}");
    let path = format!("/v1/vaults/{}/credentials", vault["id"].as_str().unwrap());
    let body = json!({"name": "c", "auth": {"type": "static_bearer",
        "mcp_server_url": "https://mcp.example.test", "token": "tok-SECRET-env-key"}});
    let (status, credential) = as_alice(&server, "POST", &path, Some(body));
    assert_eq!(status, 200, "{credential}");
    assert!(!credential.to_string().contains("tok-SECRET"));
    assert!(
        !state.path().join("vault.key").exists(),
        "no key file when the key is set"
    );
    // Not in a child's environment, and not in the server's own (scrubbed).
    let reply = server.request(
        "POST",
        "/shell",
        &[("Authorization", "Bearer alice-secret")],
        Some(json!({"command": "env"}).to_string().as_bytes()),
    );
    let shell = reply.json();
    assert_eq!(reply.status, 200, "{shell}");
    let env = shell["stdout"].as_str().unwrap();
    assert!(env.contains("PATH="), "{env}");
    assert!(!env.contains("ABX_AGENTS_VAULT_KEY") && !env.contains(&key));
    let environ = std::fs::read(format!("/proc/{}/environ", server.child.id())).unwrap();
    assert!(
        !contains(&environ, &key),
        "the key is scrubbed from /proc/<pid>/environ"
    );
    // A malformed key is refused at startup, without repeating it.
    let (status, output) = Launch::new("uring")
        .env("ABX_AGENTS_VAULT_KEY", "not-a-key-SECRET")
        .fail();
    assert_eq!(status, 2, "{output}");
    assert!(
        output.contains("ABX_AGENTS_VAULT_KEY") && !output.contains("not-a-key-SECRET"),
        "{output}"
    );
}

#[test]
fn the_policy_paths_rule_confines_workspace_files() {
    let state = TempDir::new("agents-api-state");
    let rules = "endpoints:\n  environment_files_create: {paths: {deny: [\"private*\"]}}\n  environments_create: {paths: {deny: [\"private*\"]}}\n";
    let (server, _policy) = server_with_rules(&state, &[], rules);
    let (_, envs) = as_alice(&server, "GET", "/v1/agents/environments", None);
    let id = envs["data"][0]["id"].as_str().unwrap();
    let path = format!("/v1/agents/environments/{id}/files");
    let file = |p: &str| json!({"type": "inline", "path": p, "data": "aGk="});
    let (status, refusal) = as_alice(&server, "POST", &path, Some(file("/workspace/private/x")));
    assert_eq!(status, 403, "{refusal}");
    assert_eq!(refusal["error"]["code"], "path_not_allowed");
    assert_eq!(refusal["error"]["param"], "path");
    let (status, written) = as_alice(&server, "POST", &path, Some(file("/workspace/public/x")));
    assert_eq!(
        (status, written["size_bytes"].clone()),
        (200, json!(2)),
        "{written}"
    );
    let body = json!({"environment": {"type": "openai_hosted",
        "setup_commands": [{"command": "true", "cwd": "/workspace/private"}]}});
    let (status, refusal) = as_alice(&server, "POST", "/v1/agents/environments", Some(body));
    assert_eq!(
        (status, refusal["error"]["param"].clone()),
        (403, json!("environment.setup_commands[0].cwd")),
        "{refusal}"
    );
    assert!(!server.base_dir().join("private").exists());
}
