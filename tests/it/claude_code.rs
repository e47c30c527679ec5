//! The claude-code runtime against the real binary and the real Claude Code CLI (the
//! pinned `@anthropic-ai/claude-code`, its native binary from npm's platform package),
//! whose only model API is the scripted stub of [`crate::upstream`] speaking Anthropic's
//! Messages API on 127.0.0.1. The official `openai` SDK drives `/v1` and validates every
//! answer and event (`tests/fixtures/claude_code_sdk.py`); this side checks what only
//! the test sees: what the CLI sent the model, what it wrote, which processes are left,
//! and (traced with strace) every address the CLI tried to reach.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::{pin, tools, Launch, Server, TempDir};
use crate::upstream::{serve_upstream, Upstream};

/// A server with the agents group on whose Claude Code talks to `upstream`; `path` is
/// the children's `PATH` (the pinned CLIs, or a tracing wrapper ahead of them).
fn claude_server(upstream: &Upstream, home: &TempDir, path: &str) -> Server {
    Launch::new("uring")
        .env("ABX_SERVER_ENABLED_GROUPS", "agents")
        .env("ABX_STATE_DIR", home.path().join("state").to_str().unwrap())
        .env("ANTHROPIC_BASE_URL", &format!("http://{}", upstream.addr))
        .env("ANTHROPIC_API_KEY", "stub-key")
        // The CLI retries 429 and 5xx several times by default, seconds apart.
        .env("CLAUDE_CODE_MAX_RETRIES", "0")
        .env("HOME", home.path().to_str().unwrap())
        .env("PATH", path)
        .start()
}

fn run_fixture(server: &Server, phase: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/claude_code_sdk.py");
    let output = Command::new(&tools().python)
        .arg(&script)
        .arg(format!("http://{}/v1", server.addr))
        .arg(phase)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "phase {phase}\nstdout: {stdout}\nstderr: {stderr}"
    );
    stdout
}

/// The user text of a Messages API request, all turns joined.
fn user_text(request: &Value) -> String {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].to_string())
        .collect()
}

#[test]
fn the_sdk_drives_claude_code_on_v1() {
    let upstream = serve_upstream();
    let home = TempDir::new("claude-home");
    let server = claude_server(&upstream, &home, &tools().path);

    let (status, runtimes) = server.v1_get("/v1/agents/runtimes");
    assert_eq!(status, 200, "{runtimes}");
    let claude = runtimes["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "claude-code")
        .unwrap()
        .clone();
    assert_eq!(claude["implemented"], true, "{claude}");
    assert_eq!(claude["installed"], true, "{claude}");
    assert_eq!(claude["version"], pin("CLAUDE_CODE_VERSION"), "{claude}");
    let (_, models) = server.v1_get("/v1/models");
    assert!(
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "claude-code"),
        "{models}"
    );

    run_fixture(&server, "main");
    let seen = upstream.seen.lock().unwrap().clone();
    // Continuing a response resumed the CLI's own session: the model saw the first turn.
    let continued = seen
        .iter()
        .find(|r| user_text(r).contains("SAY second turn"))
        .expect("the second turn reached the model");
    assert!(
        user_text(continued).contains("hello from claude"),
        "{continued}"
    );
    let later = seen
        .iter()
        .find(|r| user_text(r).contains("SAY later in conversation"))
        .unwrap();
    assert!(user_text(later).contains("first in conversation"));
    // The model named in `claude-code/<model>` is what the CLI asked for.
    assert!(seen.iter().any(|r| r["model"] == "stub-model"));
    assert!(seen.iter().any(|r| r["model"] != "stub-model"));
    let made = std::fs::read_to_string(server.base_dir().join("claude.txt"))
        .expect("the CLI ran the command in the base directory");
    assert_eq!(made.trim(), "made-by-claude");
    // The key reached the model API (added by the relay), never the model's commands.
    assert!(seen
        .iter()
        .filter(|r| r.get("messages").is_some())
        .all(|r| r["_x_api_key"] == "stub-key"));
    let (status, shown) = server.v1_post(
        "/v1/responses",
        serde_json::json!({"model": "claude-code", "input": "SHELL env > claude-env.txt; cat /proc/$PPID/environ | tr '\\0' '\\n' >> claude-env.txt"}),
    );
    assert_eq!(
        (status, shown["status"].clone()),
        (200, "completed".into()),
        "{shown}"
    );
    let env = std::fs::read_to_string(server.base_dir().join("claude-env.txt")).unwrap();
    assert!(
        !env.contains("stub-key"),
        "the model's command read the key:\n{env}"
    );
    assert!(
        env.contains("ANTHROPIC_API_KEY=agent-sandbox-model-relay"),
        "{env}"
    );
    assert!(env.contains("/v1/agents/model_relay/"), "{env}");
    // Each CLI session kept its state in a config directory of its own.
    let sessions = std::fs::read_dir(home.path().join("state/claude-code"))
        .unwrap()
        .count();
    assert!(sessions >= 8, "{sessions} session directories");
    assert!(
        !home.path().join(".claude").exists() && !home.path().join(".claude.json").exists(),
        "the CLI wrote into HOME"
    );
}

#[test]
fn a_cancel_or_a_hang_up_ends_the_cli_and_its_command() {
    let upstream = serve_upstream();
    let home = TempDir::new("claude-cancel");
    let server = claude_server(&upstream, &home, &tools().path);
    let said = run_fixture(&server, "cancel");
    assert!(
        said.contains("cancel ended") && said.contains("hang-up ended"),
        "{said}"
    );
}

/// A `claude` ahead of the real one on `PATH` that runs it under strace, logging every
/// connect and send with an address (DNS included) of it and its children.
fn traced_claude(dir: &Path, log: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let strace = root.join(".tools/strace");
    let real = root.join(".tools/npm/node_modules/.bin/claude");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let wrapper = bin.join("claude");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nLD_LIBRARY_PATH={lib} exec {strace} -f -qq -e trace=connect,sendto,sendmsg,sendmmsg -e signal=none -o {log}.$$ {real} \"$@\"\n",
            lib = strace.join("usr/lib/x86_64-linux-gnu").display(),
            strace = strace.join("usr/bin/strace").display(),
            log = log.display(),
            real = real.display(),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("{}:{}", bin.display(), tools().path)
}

/// Every inet address the traced processes tried, as `host:port`.
fn addresses(logs: &[PathBuf]) -> Vec<String> {
    let mut found = Vec::new();
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines() {
            if let Some(at) = line
                .find("sin_addr=inet_addr(\"")
                .or(line.find("inet_pton(AF_INET6, \""))
            {
                let rest = &line[at..];
                let host = rest.split('"').nth(1).unwrap_or("?");
                let port = line
                    .split("htons(")
                    .nth(1)
                    .and_then(|p| p.split(')').next())
                    .unwrap_or("?");
                found.push(format!("{host}:{port}"));
            }
        }
    }
    found
}

fn logs_in(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect()
}

#[test]
fn the_cli_reaches_nothing_but_the_stub() {
    let upstream = serve_upstream();
    let home = TempDir::new("claude-traced");
    let log = home.path().join("trace");
    let path = traced_claude(home.path(), &log);
    let stub = format!("127.0.0.1:{}", upstream.addr.port());

    // The detector works: the bare CLI, without the variable the server always sets,
    // looks up Anthropic's hosts (DNS), and the trace shows it.
    let control = home.path().join("control");
    std::fs::create_dir_all(&control).unwrap();
    let mut bare = Command::new(home.path().join("bin/claude"))
        .args(["-p", "--output-format", "json"])
        .current_dir(&control)
        .env_clear()
        .env("PATH", &path)
        .env("HOME", &control)
        .env("ANTHROPIC_BASE_URL", format!("http://{}", upstream.addr))
        .env("ANTHROPIC_API_KEY", "stub-key")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        bare.stdin
            .take()
            .unwrap()
            .write_all(b"SAY control")
            .unwrap();
    }
    assert!(bare.wait().unwrap().success());
    let control_seen = addresses(&logs_in(home.path(), "trace"));
    assert!(control_seen.contains(&stub), "{control_seen:?}");
    assert!(
        control_seen.iter().any(|a| a != &stub),
        "the trace saw no traffic but the stub's from a CLI that makes some: {control_seen:?}"
    );
    for old in logs_in(home.path(), "trace") {
        std::fs::remove_file(old).unwrap();
    }

    // Through the server: a turn with a shell command, and its continuation. The CLI
    // reaches the model through the server's relay.
    let server = claude_server(&upstream, &home, &path);
    let relay = format!("127.0.0.1:{}", server.addr.port());
    let (status, first) = server.v1_post(
        "/v1/responses",
        serde_json::json!({"model": "claude-code", "input": "SHELL echo traced"}),
    );
    assert_eq!(
        (status, first["status"].clone()),
        (200, "completed".into()),
        "{first}"
    );
    let (status, second) = server.v1_post(
        "/v1/responses",
        serde_json::json!({"model": "claude-code", "input": "SAY again", "previous_response_id": first["id"]}),
    );
    assert_eq!(
        (status, second["status"].clone()),
        (200, "completed".into()),
        "{second}"
    );
    let seen = addresses(&logs_in(home.path(), "trace"));
    assert!(
        seen.contains(&relay),
        "the trace missed the relay: {seen:?}"
    );
    let other: Vec<&String> = seen.iter().filter(|a| *a != &relay).collect();
    assert!(
        other.is_empty(),
        "the CLI reached beyond the relay: {other:?}"
    );
    assert!(
        upstream.seen.lock().unwrap().len() >= 3,
        "the relay reached the stub"
    );
}

/// The Agents API's sessions on claude-code: one long-lived Claude Code per running
/// session (its stream-json input and output translated into codex's protocol), driven
/// by the SDK (`tests/fixtures/claude_sessions_sdk.py`); a restart resumes the CLI's own
/// session, and a delete removes its config directory.
#[test]
fn the_sdk_drives_sessions_on_claude_code_and_a_restart_resumes_them() {
    use crate::agents_sessions::{run_fixture, Sandbox};
    let upstream = serve_upstream();
    let sandbox = Sandbox::new(&upstream);
    // `/workspace` is the base directory itself.
    let written = sandbox.base.path().join("notes.txt");
    let anthropic = format!("http://{}", upstream.addr);
    let extra = [
        ("ANTHROPIC_BASE_URL", anthropic.as_str()),
        ("ANTHROPIC_API_KEY", "stub-key"),
        ("CLAUDE_CODE_MAX_RETRIES", "0"),
    ];
    let write_path = written.to_str().unwrap();
    let mut server = sandbox.server_with(&extra);
    run_fixture(
        "claude_sessions_sdk.py",
        &server,
        &sandbox,
        "main",
        &[("WRITE_PATH", write_path)],
    );
    // kill -9 in the middle of a turn: the restarted server marks it failed.
    run_fixture("claude_sessions_sdk.py", &server, &sandbox, "slow", &[]);
    unsafe { libc::kill(server.child.id() as i32, libc::SIGKILL) };
    let _ = server.child.wait();
    drop(server);
    assert_eq!(
        std::fs::read_to_string(&written).unwrap().trim(),
        "written by claude"
    );
    let seen = upstream.seen.lock().unwrap().clone();
    // The agent's instructions reached the model, and the continuation saw the first turn.
    let continued = seen
        .iter()
        .find(|r| user_text(r).contains("SAY continued"))
        .expect("the continuation reached the model");
    assert!(user_text(continued).contains("hello from claude"));
    assert!(continued["system"]
        .to_string()
        .contains("Follow the script."));
    // The steer reached the model inside the running turn: Claude Code surfaces a
    // message sent mid-turn as a system message after the tool's result.
    let steered = seen
        .iter()
        .find(|r| r["messages"].to_string().contains("SAY steered"))
        .expect("the steer reached the model");
    assert!(
        steered["messages"].to_string().contains("slept"),
        "{steered}"
    );
    // The model named by the update is what the CLI asked for next.
    let switched = seen
        .iter()
        .find(|r| user_text(r).contains("SAY on the second model"))
        .unwrap();
    assert_eq!(switched["model"], "stub-model-2", "{}", switched["model"]);

    let config_dirs = |state: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(state.join("claude-code"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let state = sandbox.home.path().join("state");
    assert_eq!(
        config_dirs(&state).len(),
        1,
        "one CLI session, one config directory"
    );
    let before = seen.len();
    drop(seen);
    // A new server: the session's next turn resumes the CLI session where it was.
    let server = sandbox.server_with(&extra);
    run_fixture(
        "claude_sessions_sdk.py",
        &server,
        &sandbox,
        "after_restart",
        &[],
    );
    let seen = upstream.seen.lock().unwrap().clone();
    let resumed = seen[before..]
        .iter()
        .find(|r| user_text(r).contains("SAY after restart"))
        .unwrap();
    assert!(
        user_text(resumed).contains("hello from claude"),
        "not resumed"
    );
    assert!(
        config_dirs(&state).is_empty(),
        "the deleted session's config directory is left"
    );
}

/// The first request on claude-code installs the pinned CLI into the server's own
/// prefix, npm running the wrapper's postinstall, which puts the native binary (from the
/// platform package) in place of the wrapper's placeholder script; the turn then runs
/// on it. npm reads the packages from the cache `scripts/tools` filled.
#[test]
fn the_cli_is_installed_on_first_use_with_its_native_binary() {
    let upstream = serve_upstream();
    let home = TempDir::new("claude-first-use");
    let cache = std::env::var("HOME").map_or("/root/.npm".to_string(), |h| format!("{h}/.npm"));
    let state = home.path().join("state");
    let server = Launch::new("uring")
        .env("ABX_SERVER_ENABLED_GROUPS", "agents")
        .env("ABX_STATE_DIR", state.to_str().unwrap())
        .env("ANTHROPIC_BASE_URL", &format!("http://{}", upstream.addr))
        .env("ANTHROPIC_API_KEY", "stub-key")
        .env("HOME", home.path().to_str().unwrap())
        // No claude on it: the machine's npm and node only.
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("npm_config_cache", &cache)
        .env("npm_config_fetch_retries", "0")
        .start();
    let entry = |server: &Server| {
        let (_, list) = server.v1_get("/v1/agents/runtimes");
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == "claude-code")
            .unwrap()
            .clone()
    };
    assert_eq!(entry(&server)["installed"], false);
    let (status, answer) = server.v1_post(
        "/v1/responses",
        serde_json::json!({"model": "claude-code", "input": "SAY installed first"}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["status"], "completed", "{answer}");
    let after = entry(&server);
    assert_eq!(
        (after["installed"].clone(), after["source"].clone()),
        (true.into(), "managed".into()),
        "{after}"
    );
    assert_eq!(after["version"], pin("CLAUDE_CODE_VERSION"));
    let binary = state
        .join(format!("runtimes/claude-{}", pin("CLAUDE_CODE_VERSION")))
        .join("node_modules/@anthropic-ai/claude-code/bin/claude.exe");
    let size = std::fs::metadata(&binary).unwrap().len();
    assert!(
        size > 100 << 20,
        "{} is {size} bytes: not the native binary",
        binary.display()
    );
}

/// Under `ABX_CHILD_USER` Claude Code runs as that user (as codex does): its config
/// directory is one of that user's (the state directory stays the server's), and its
/// commands run as that user too.
#[test]
fn under_a_child_user_the_cli_and_its_commands_run_as_that_user() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let upstream = serve_upstream();
    let home = TempDir::new("claude-child-user");
    let base = TempDir::new("claude-child-base");
    // The base directory is the model's workspace: the child user writes there.
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let server = Launch::new("uring")
        .base_dir(base.path())
        .env("ABX_SERVER_ENABLED_GROUPS", "agents")
        .env("ABX_CHILD_USER", "65534:65534")
        .env("ABX_STATE_DIR", home.path().join("state").to_str().unwrap())
        .env("ANTHROPIC_BASE_URL", &format!("http://{}", upstream.addr))
        .env("ANTHROPIC_API_KEY", "stub-key")
        .env("CLAUDE_CODE_MAX_RETRIES", "0")
        .env("HOME", home.path().to_str().unwrap())
        .env("PATH", &tools().path)
        .start();
    let root = Path::new("/tmp/agent-sandbox-claude-code-65534");
    let dirs_in = |root: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(root)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let before = dirs_in(root);
    let (status, answer) = server.v1_post(
        "/v1/responses",
        serde_json::json!({"model": "claude-code", "input": "SHELL id -u > who.txt"}),
    );
    assert_eq!(
        (status, answer["status"].clone()),
        (200, "completed".into()),
        "{answer}"
    );
    let who = std::fs::read_to_string(base.path().join("who.txt")).unwrap();
    assert_eq!(who.trim(), "65534");
    // The turn's CLI session made a directory of its own there, the child user's.
    let dirs: Vec<PathBuf> = dirs_in(root)
        .into_iter()
        .filter(|d| !before.contains(d))
        .collect();
    assert_eq!(
        dirs.len(),
        1,
        "no new config directory in {}",
        root.display()
    );
    for dir in &dirs {
        assert_eq!(
            std::fs::metadata(dir).unwrap().uid(),
            65534,
            "{}",
            dir.display()
        );
    }
    assert!(
        !home.path().join("state/claude-code").exists(),
        "nothing of the CLI's in the server's state directory"
    );
}
