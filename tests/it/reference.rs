//! The published Python server this one replaces (`agent-sandbox-server`) and its official
//! client (`agent-sandbox-client`), both at the version `src/pins.env` names, from
//! `.tools/reference-venv`:
//! - `tests/fixtures/reference_client.py` drives every public method of the client's
//!   `ServerClient` against the real binary, through the client's own models and typed
//!   errors (local mode, a plain `ABX_SERVER_TOKEN`, and a `files:read`-only identity);
//! - `tests/fixtures/reference_diff.py` starts the reference server with the same settings
//!   as the binary and compares, per identity and for every endpoint id the reference
//!   lists, the `/capabilities` entry, `POST /capabilities/check` and whether the policy
//!   refuses the request itself;
//! - `tests/fixtures/reference_answers.py` sends both servers the same requests on the
//!   same fixture trees and compares the answers; the differences must be exactly the
//!   table `docs/api.md` keeps (section 11.1);
//! - the reference's own tests (`tests/test_server` of its sdist, fetched by
//!   `scripts/tools`) run against the binary through `tests/fixtures/reference_suite/`:
//!   every one that starts a server must pass, but those `expected.json` lists (not
//!   applicable: they test the reference's Python process; or a documented difference,
//!   which must still fail).
//!
//! The fixtures print one JSON line per method or difference; a failure shows them all.

use std::path::Path;
use std::process::Command;

use crate::support::{tools, Launch, Server, TempDir};

/// The policy document of the narrow test: one identity holding only `files:read`.
const NARROW_POLICY: &str =
    r#"{"auth": {"tokens": [{"id": "ci", "scopes": ["files:read"], "token_env": "CI_TOKEN"}]}}"#;

/// The identities of the differential tests: every scope, only `files:read`, only
/// `process:run` (each token in its own variable).
const IDENTITIES: &str = r#"{"tokens": [
    {"id": "full", "scopes": ["*"], "token_env": "REF_FULL_TOKEN"},
    {"id": "reader", "scopes": ["files:read"], "token_env": "REF_READER_TOKEN"},
    {"id": "runner", "scopes": ["process:run"], "token_env": "REF_RUNNER_TOKEN"}]}"#;

const TOKENS: [(&str, &str, &str); 3] = [
    ("full", "REF_FULL_TOKEN", "full-secret"),
    ("reader", "REF_READER_TOKEN", "reader-secret"),
    ("runner", "REF_RUNNER_TOKEN", "runner-secret"),
];

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Runs a fixture with the reference venv's Python; it must exit 0.
fn run(mut command: Command, what: &str) {
    let output = command.output().expect("run the reference venv's python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The failing lines first: a CI log keeps only the head and tail of a long message.
    let failing: Vec<&str> = stdout
        .lines()
        .filter(|line| line.contains("\"ok\": false"))
        .collect();
    assert!(
        output.status.success(),
        "{what} failed ({}):\nfailing:\n{}\nall:\n{stdout}\nstderr:\n{}",
        output.status,
        failing.join("\n"),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `reference_client.py` against `server`, with `extra` arguments.
fn client(server: &Server, extra: &[&str]) {
    let mut command = Command::new(&tools().reference_python);
    command
        .arg(fixture("reference_client.py"))
        .arg(format!("http://{}", server.addr))
        .arg("--base")
        .arg(server.base_dir())
        .args(extra);
    if let Some(pty) = server.pty_addr {
        command.arg("--pty-port").arg(pty.port().to_string());
    }
    run(command, "reference_client.py");
}

/// No token: the anonymous identity may do everything.
fn client_in_local_mode(driver: &'static str) {
    let server = Launch::new(driver).start();
    client(&server, &["--expect-identity", "anonymous"]);
}

/// The opt-in groups on: the client's dev tools and browser methods, `pdf` and
/// `console` included (Debian's Chromium, as the browser tests use).
fn client_with_the_opt_in_groups(driver: &'static str) {
    let server = Launch::new(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", "dev_tools,browser")
        .start();
    client(
        &server,
        &[
            "--expect-identity",
            "anonymous",
            "--groups",
            "dev_tools,browser",
        ],
    );
}

/// `ABX_SERVER_TOKEN`: the one identity `server`, holding `*`.
fn client_with_a_token(driver: &'static str) {
    let server = Launch::new(driver)
        .env("ABX_SERVER_TOKEN", "reference-token")
        .start();
    client(
        &server,
        &["--token", "reference-token", "--expect-identity", "server"],
    );
}

/// The reference's JSON document inline in `ABX_SERVER_POLICY`: an identity holding only
/// `files:read` reads, and everything else is the client's PolicyDeniedError (403
/// missing_scope), from the server and from the client's pre-check.
fn client_with_a_files_read_identity(driver: &'static str) {
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", NARROW_POLICY)
        .env("CI_TOKEN", "ci-secret")
        .start();
    client(
        &server,
        &[
            "--token",
            "ci-secret",
            "--narrow",
            "--expect-identity",
            "ci",
        ],
    );
}

/// `reference_diff.py`: the binary started with `env`, the reference started by the
/// fixture with the same `env`, compared for `identities` (`id=token`).
fn differential(driver: &'static str, env: &[(&str, &str)], identities: &[String]) {
    let mut launch = Launch::new(driver);
    for (name, value) in env {
        launch = launch.env(name, value);
    }
    let server = launch.start();
    let reference_base = TempDir::new("reference-base");
    let mut command = Command::new(&tools().reference_python);
    command
        .arg(fixture("reference_diff.py"))
        .arg("--ours")
        .arg(format!("http://{}", server.addr))
        .arg("--start-reference")
        .arg("--reference-base")
        .arg(reference_base.path());
    if let Some(pty) = server.pty_addr {
        command.arg("--ours-pty-port").arg(pty.port().to_string());
    }
    for (name, value) in env {
        command.arg("--env").arg(format!("{name}={value}"));
    }
    for identity in identities {
        command.arg("--identity").arg(identity);
    }
    run(command, "reference_diff.py");
}

fn identity_args() -> Vec<String> {
    let mut out: Vec<String> = TOKENS
        .iter()
        .map(|(id, _, token)| format!("{id}={token}"))
        .collect();
    // No credentials, and a token no identity holds: 401 everywhere but /health.
    out.push("anonymous=".to_string());
    out.push("stranger=not-a-token".to_string());
    out
}

fn identities_env(document: &str) -> Vec<(&'static str, String)> {
    let mut env = vec![("ABX_SERVER_POLICY", document.to_string())];
    for (_, var, token) in TOKENS {
        env.push((var, token.to_string()));
    }
    env
}

fn borrowed<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// Three identities (`*`, `files:read`, `process:run`) under the default groups.
fn differential_identities(driver: &'static str) {
    let env = identities_env(&format!(r#"{{"auth": {IDENTITIES}}}"#));
    differential(driver, &borrowed(&env), &identity_args());
}

/// The same identities under a document that disables the process group and enables the
/// opt-in dev_tools group.
fn differential_groups(driver: &'static str) {
    let env = identities_env(&format!(
        r#"{{"groups": {{"process": false, "dev_tools": true}}, "auth": {IDENTITIES}}}"#
    ));
    differential(driver, &borrowed(&env), &identity_args());
}

/// No settings at all (anonymous holds `*`; a token matching nothing is anonymous too),
/// and a plain `ABX_SERVER_TOKEN` (the identity `server`).
fn differential_local_and_plain_token(driver: &'static str) {
    differential(
        driver,
        &[],
        &["anonymous=".to_string(), "stranger=not-a-token".to_string()],
    );
    differential(
        driver,
        &[("ABX_SERVER_TOKEN", "plain-token")],
        &[
            "server=plain-token".to_string(),
            "anonymous=".to_string(),
            "stranger=not-a-token".to_string(),
        ],
    );
}

/// `reference_answers.py`: the same requests on the same trees to the binary and to the
/// reference (dev_tools and agents on for both, each with a state directory of its own);
/// the differences must be exactly the table of `docs/api.md` section 11.1.
fn answers(driver: &'static str, browser: bool) {
    let groups = match browser {
        true => "dev_tools,agents,browser",
        false => "dev_tools,agents",
    };
    let state = TempDir::new("answers-state");
    let reference_state = TempDir::new("answers-reference-state");
    let server = Launch::new(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", groups)
        .env("ABX_STATE_DIR", state.path().to_str().unwrap())
        .start();
    let mut command = Command::new(&tools().reference_python);
    command
        .arg(fixture("reference_answers.py"))
        .arg("--ours")
        .arg(format!("http://{}", server.addr))
        .arg("--ours-base")
        .arg(server.base_dir())
        .arg("--documented")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/api.md"))
        .arg("--env")
        .arg(format!("ABX_SERVER_ENABLED_GROUPS={groups}"))
        .arg("--env")
        .arg(format!(
            "ABX_AGENTS_STATE_DIR={}",
            reference_state.path().display()
        ));
    if browser {
        command.arg("--browser").arg(chromium());
    }
    run(command, "reference_answers.py");
}

/// Debian's Chromium, which this server's browser tests use too.
fn chromium() -> String {
    ["chromium", "chromium-headless-shell"]
        .iter()
        .flat_map(|name| {
            std::env::var_os("PATH")
                .map(|path| {
                    std::env::split_paths(&path)
                        .map(|d| d.join(name))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
        .find(|candidate| candidate.is_file())
        .expect("Chromium is installed (apt-get install chromium), as the browser tests need")
        .display()
        .to_string()
}

// Answers go through each I/O driver's file and process paths. The browser cases start a
// reference each, so they run once: the browser's pipe to Chromium is the same code on
// both drivers, which tests/it/browser.rs runs on each.
#[test]
fn reference_answers_uring() {
    answers("uring", true)
}

#[test]
fn reference_answers_epoll() {
    answers("epoll", false)
}

// One driver: each test also starts the Python reference, and the policy decisions do not
// depend on the I/O driver.
#[test]
fn reference_client_local_mode() {
    client_in_local_mode("uring")
}

#[test]
fn reference_client_with_the_opt_in_groups() {
    client_with_the_opt_in_groups("uring");
}

#[test]
fn reference_client_with_a_token() {
    client_with_a_token("uring")
}

#[test]
fn reference_client_with_a_files_read_identity() {
    client_with_a_files_read_identity("uring")
}

#[test]
fn reference_diff_identities() {
    differential_identities("uring")
}

#[test]
fn reference_diff_groups() {
    differential_groups("uring")
}

#[test]
fn reference_diff_local_and_plain_token() {
    differential_local_and_plain_token("uring")
}

/// The reference's own tests against the binary (`tests/fixtures/reference_suite/`).
#[test]
fn reference_own_tests() {
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("reference_suite/expected.json")).unwrap(),
    )
    .unwrap();
    let pins = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/pins.env"))
        .unwrap();
    let version = pins
        .lines()
        .find_map(|l| l.strip_prefix("AGENT_SANDBOX_SERVER_VERSION="))
        .unwrap()
        .trim();
    let sdist = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".tools/reference-src")
        .join(format!("agent_sandbox_server-{version}"));
    let _ = tools();
    let scratch = TempDir::new("reference-suite");
    let results = scratch.path().join("results.json");
    let mut command = Command::new(&tools().reference_python);
    command
        .current_dir(&sdist)
        .args(["-m", "pytest", "-p", "abx_shim", "-p", "no:cacheprovider"])
        .args(["-p", "no:warnings", "-q", "tests/test_server"])
        .env("PYTHONPATH", fixture("reference_suite"))
        .env("ABX_SHIM_BINARY", crate::support::MAIN_BIN)
        .env("ABX_SHIM_RESULTS", &results)
        .env("TMPDIR", scratch.path())
        .env_remove("ABX_SERVER_TOKEN");
    for prefix in expected["not_applicable"].as_object().unwrap().keys() {
        command.arg("--deselect").arg(prefix);
    }
    let output = command.output().expect("run pytest in the reference venv");
    let outcomes: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&results).unwrap_or_else(|e| {
            panic!(
                "pytest wrote no results ({e}):\n{}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )
        }))
        .unwrap();
    let differs = expected["differs"].as_object().unwrap();
    let mut problems = Vec::new();
    let mut drove = 0;
    for (id, outcome) in &outcomes {
        let failed = outcome["outcome"] == "failed";
        if outcome["drove"] != true {
            continue;
        }
        drove += 1;
        match (differs.contains_key(id), failed) {
            (false, true) => problems.push(format!(
                "{id} failed:\n{}",
                outcome["message"].as_str().unwrap_or_default()
            )),
            (true, false) => problems.push(format!(
                "{id} passes now: remove it from expected.json's differs, and its row from the docs"
            )),
            _ => {}
        }
    }
    for id in differs.keys() {
        if outcomes.get(id).is_none_or(|o| o["drove"] != true) {
            problems.push(format!(
                "{id} is listed as a difference but did not run against the server"
            ));
        }
    }
    assert!(
        problems.is_empty() && drove >= 280,
        "{} of the reference's tests that drove the server went wrong ({drove} drove it):\n{}",
        problems.len(),
        problems.join("\n\n")
    );
}
