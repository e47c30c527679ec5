//! Sessions of the Agents API (beta) against the real binary and the real codex CLI
//! (`codex app-server`), whose only model provider is the scripted stub upstream of
//! `crate::upstream` on 127.0.0.1. The official `openai` SDK drives every operation
//! (`tests/fixtures/agents_sessions_sdk.py`) and validates every answer and event with
//! its own models; this side checks what only the test can see: what codex sent the
//! model, what is on disk, and a restart.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::support::{pin, tools, Launch, Server, TempDir};
use crate::upstream::{serve_upstream, Upstream};

/// What the servers of one test share, so a restarted one finds everything again.
pub(crate) struct Sandbox {
    pub(crate) home: TempDir,
    pub(crate) base: TempDir,
    pub(crate) policy: std::path::PathBuf,
}

impl Sandbox {
    pub(crate) fn new(upstream: &Upstream) -> Sandbox {
        let home = TempDir::new("sessions-home");
        let base = TempDir::new("sessions-base");
        let codex_home = home.path().join("codex");
        std::fs::create_dir_all(&codex_home).unwrap();
        std::fs::write(
            codex_home.join("config.toml"),
            format!(
                "model = \"stub-model\"\nmodel_provider = \"stub\"\n[model_providers.stub]\nname = \"stub\"\nbase_url = \"http://{}/v1\"\nwire_api = \"responses\"\nenv_key = \"STUB_API_KEY\"\nrequest_max_retries = 0\nstream_max_retries = 0\n",
                upstream.addr
            ),
        )
        .unwrap();
        let policy = home.path().join("policy.yaml");
        std::fs::write(
            &policy,
            "identities:\n  - {id: alice, scopes: [\"*\"], token_env: ALICE_TOKEN}\n  - {id: bob, scopes: [\"*\"], token_env: BOB_TOKEN}\n",
        )
        .unwrap();
        Sandbox { home, base, policy }
    }

    pub(crate) fn server(&self) -> Server {
        self.server_with(&[])
    }

    pub(crate) fn server_with(&self, extra: &[(&str, &str)]) -> Server {
        self.server_on("uring", extra)
    }

    pub(crate) fn server_on(&self, driver: &'static str, extra: &[(&str, &str)]) -> Server {
        let mut launch = Launch::new(driver);
        for (name, value) in extra {
            launch = launch.env(name, value);
        }
        launch
            .base_dir(self.base.path())
            .env("ABX_SERVER_ENABLED_GROUPS", "agents")
            .env("ABX_SERVER_POLICY", self.policy.to_str().unwrap())
            .env("ALICE_TOKEN", "alice-token")
            .env("BOB_TOKEN", "bob-token")
            .env(
                "ABX_STATE_DIR",
                self.home.path().join("state").to_str().unwrap(),
            )
            .env(
                "CODEX_HOME",
                self.home.path().join("codex").to_str().unwrap(),
            )
            .env("STUB_API_KEY", "stub")
            .env("HOME", self.home.path().to_str().unwrap())
            .env("PATH", &tools().path)
            .start()
    }

    fn state_file(&self) -> std::path::PathBuf {
        self.home.path().join("sdk-state.json")
    }
}

/// Runs one phase of the SDK script against `server`.
fn sdk(server: &Server, sandbox: &Sandbox, phase: &str) {
    sdk_with(server, sandbox, phase, &[]);
}

fn sdk_with(server: &Server, sandbox: &Sandbox, phase: &str, env: &[(&str, &str)]) {
    run_fixture("agents_sessions_sdk.py", server, sandbox, phase, env);
}

/// Runs one phase of the SDK script `fixture` (in `tests/fixtures/`) against `server`:
/// it must end with `ok`, validated with the pinned SDK.
pub(crate) fn run_fixture(
    fixture: &str,
    server: &Server,
    sandbox: &Sandbox,
    phase: &str,
    env: &[(&str, &str)],
) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(fixture);
    let output = Command::new(&tools().python)
        .arg(&script)
        .arg(format!("http://{}/v1", server.addr))
        .arg(phase)
        .arg(sandbox.state_file())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "phase {phase}\nstdout: {stdout}\nstderr: {stderr}"
    );
    let version = format!("openai {}", pin("OPENAI_PYTHON_VERSION"));
    assert!(
        stdout.contains(&version),
        "validated with another SDK: {stdout}"
    );
}

/// The user texts of every request the stub received, in order.
fn asked(upstream: &Upstream) -> Vec<String> {
    upstream
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|request: &Value| request["input"].to_string())
        .collect()
}

#[test]
fn the_sdk_drives_sessions_on_codex_threads_and_a_restart_resumes_them() {
    let upstream = serve_upstream();
    let sandbox = Sandbox::new(&upstream);
    let server = sandbox.server();
    sdk(&server, &sandbox, "main");

    // The continuation reached codex with the first turn in its history.
    let requests = asked(&upstream);
    let continued = requests
        .iter()
        .find(|r| r.contains("SAY continued"))
        .expect("the second turn reached the model");
    assert!(
        continued.contains("SAY hello from codex") && continued.contains("hello from codex"),
        "the second turn did not carry the first: {continued}"
    );
    // A session's override of a saved agent's instructions is what codex was given.
    assert!(
        upstream
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|r: &Value| r.to_string().contains("Overridden instructions.")),
        "the overriding instructions never reached the model"
    );
    // The session's new model reached codex for the next turn.
    assert!(
        upstream
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|r: &Value| r["model"] == "stub-model-2"),
        "the updated model was never asked"
    );
    // The artifact's record is gone, its file is not.
    let report = sandbox.base.path().join("outputs/report.txt");
    assert_eq!(std::fs::read_to_string(&report).unwrap(), "report body");

    // The store is on disk, private, and holds no secret in the clear.
    let state = sandbox.home.path().join("state");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "state directory mode {mode:o}");

    // kill -9 in the middle of a turn: after a restart the session is back, its running
    // turn failed with a clear error, and a new input resumes the codex thread.
    sdk(&server, &sandbox, "slow");
    let mut server = server;
    unsafe { libc::kill(server.child.id() as i32, libc::SIGKILL) };
    let _ = server.child.wait();
    drop(server);
    let before = asked(&upstream).len();
    let restarted = sandbox.server();
    sdk(&restarted, &sandbox, "after_restart");
    let resumed = asked(&upstream)[before..]
        .iter()
        .find(|r| r.contains("SAY back again"))
        .cloned()
        .expect("the resumed turn reached the model");
    assert!(
        resumed.contains("SAY hello from codex"),
        "the resumed thread lost its history: {resumed}"
    );
}

/// Runs one phase of the SDK script against a server of its own (with its own stub
/// upstream); the sandbox stays for what the test checks after.
fn phase_alone(phase: &str) -> Sandbox {
    let upstream = serve_upstream();
    let sandbox = Sandbox::new(&upstream);
    let server = sandbox.server();
    sdk(&server, &sandbox, phase);
    sandbox
}

/// Inputs racing a DELETE answer 202, or 404 once the session is gone: never the 500
/// of a runner that stopped before it answered.
#[test]
fn inputs_racing_a_delete_are_accepted_or_not_found() {
    phase_alone("race");
}

/// A cancel sent with its input, right after it, or while it is still being applied ends
/// the turn cancelled and the session idle within seconds; the next turn runs.
#[test]
fn a_cancel_is_never_lost() {
    phase_alone("cancel");
}

/// A session's codex idles out after 1 s (`ABX_AGENTS_SESSION_IDLE_SECONDS`): inputs
/// sent around that moment are each applied and run a turn on the resumed thread; none
/// gets the 500 of an actor that stopped before it read it.
#[test]
fn inputs_as_codex_idles_out_are_applied() {
    let upstream = serve_upstream();
    let sandbox = Sandbox::new(&upstream);
    let server = sandbox.server_with(&[("ABX_AGENTS_SESSION_IDLE_SECONDS", "1")]);
    sdk(&server, &sandbox, "idle");
}

/// A provider that reuses its message ids: every session keeps every assistant item,
/// under ids of ours (before, other sessions kept none and a later turn replaced an
/// earlier one's).
#[test]
fn item_ids_are_ours_whatever_the_provider_reuses() {
    phase_alone("reuse");
}

/// The owner's 64 MiB share fills while a turn runs: the turn ends, the session is idle
/// and deletable, and what was not kept is said (before, the session stayed in
/// progress, its stream never said idle, and DELETE was 409 for good).
#[test]
fn a_full_store_never_leaves_a_session_stuck() {
    let sandbox = phase_alone("full");
    // Its one session was deleted: codex's rollout of its thread went with it.
    let rollouts = rollouts_in(&sandbox.home.path().join("codex").join("sessions"));
    assert!(rollouts.is_empty(), "a deleted session left {rollouts:?}");
}

/// The rollout files under `dir`, at any depth.
fn rollouts_in(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if entry.file_name().to_string_lossy().starts_with("rollout-") {
                found.push(path);
            }
        }
    }
    found
}

/// An agent's `mcp` tool connects codex to that server with the bearer the session's
/// vault holds for its URL (here another agent-sandbox's `/mcp`): the file the model's
/// tool call wrote is in the other sandbox, and the token is in no answer, and in no
/// environment or argv a command the model runs can read: codex reaches the server
/// through the relay, which adds the bearer.
#[test]
fn an_mcp_tool_reaches_its_server_with_the_vaults_bearer() {
    let target = Launch::new("uring")
        .env("ABX_SERVER_TOKEN", "vault-held-mcp-token")
        .start();
    let upstream = serve_upstream();
    let sandbox = Sandbox::new(&upstream);
    let server = sandbox.server();
    let url = format!("http://{}/mcp", target.addr);
    // In a file, not the SDK script's environment: the scan below reads every process
    // it can see, the test's own included.
    let token_file = sandbox.home.path().join("mcp-target-token");
    std::fs::write(&token_file, "vault-held-mcp-token").unwrap();
    sdk_with(
        &server,
        &sandbox,
        "mcp",
        &[
            ("MCP_TARGET_URL", &url),
            ("MCP_TARGET_TOKEN_FILE", token_file.to_str().unwrap()),
        ],
    );
    let written = std::fs::read_to_string(target.base_dir().join("from-session.txt"));
    assert_eq!(
        written.ok().as_deref(),
        Some("written by a session over MCP")
    );
    let command_env =
        std::fs::read_to_string(sandbox.base.path().join("environment-of-a-command.txt"))
            .expect("the command codex ran wrote its environment");
    assert!(command_env.contains("PATH="), "{command_env}");
    assert!(
        !command_env.contains("vault-held-mcp-token"),
        "a command codex ran saw the MCP server's bearer"
    );
    let processes = std::fs::read(sandbox.base.path().join("processes-seen-by-a-command.txt"))
        .expect("the command codex ran read the processes it can see");
    let processes = String::from_utf8_lossy(&processes);
    assert!(
        processes.contains("app-server"),
        "the scan saw codex's app-server: {}",
        processes.len()
    );
    assert!(
        !processes.contains("vault-held-mcp-token"),
        "a process the model's commands can read holds the MCP server's bearer: {}",
        processes
            .split(['\0', '\n'])
            .filter(|entry| entry.contains("vault-held-mcp-token"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    // The target refuses a request without its token, and the file was written: the
    // bearer was added on the way, by the relay, never held by codex.
    let environ = std::fs::read(format!("/proc/{}/environ", server.child.id())).unwrap();
    assert!(
        !String::from_utf8_lossy(&environ).contains("vault-held-mcp-token"),
        "the vault's token is in the server's own environment"
    );
    let offered = asked(&upstream);
    assert!(
        !offered.iter().any(|r| r.contains("vault-held-mcp-token")),
        "the token reached the model"
    );
}

/// A codex sub-agent is a subagent of the session: the child thread codex opened when
/// the model called `spawn_agent` is listed, with its own turns and items, apart from
/// the root agent's, and its events stream on the session.
#[test]
fn codex_sub_agents_are_the_sessions_subagents() {
    let upstream = serve_upstream();
    let sandbox = Sandbox::new(&upstream);
    let server = sandbox.server();
    sdk(&server, &sandbox, "subagents");
    assert!(
        asked(&upstream)
            .iter()
            .any(|r| r.contains("SAY from the child")),
        "the child thread never asked the model"
    );
}
