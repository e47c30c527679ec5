//! Automations of the Agents API (beta) against the real binary and the real codex CLI,
//! whose only model provider is the scripted stub upstream on 127.0.0.1. The official
//! `openai` SDK drives every operation (`tests/fixtures/agents_automations_sdk.py`) and
//! validates every automation and run with its own models; this side kills and
//! restarts the server, and checks what reached the model.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::agents_sessions::{run_fixture, Sandbox};
use crate::faults::threads_named;
use crate::support::Server;
use crate::upstream::serve_upstream;

const FIXTURE: &str = "agents_automations_sdk.py";

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `method path` with `body` as alice (every scope): the status and the JSON answer.
fn as_alice(server: &Server, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string());
    let reply = server.request(
        method,
        path,
        &[
            ("Authorization", "Bearer alice-token"),
            ("Content-Type", "application/json"),
        ],
        body.as_deref().map(str::as_bytes),
    );
    (reply.status, reply.json())
}

/// Runs fire by themselves, pause holds them, a restart keeps every automation and
/// run, and the occurrences missed while the server was down are caught up once.
#[test]
fn automations_fire_on_schedule_and_survive_a_kill() {
    let upstream = serve_upstream();
    let sandbox = Sandbox::new(&upstream);
    // Sessions' codex idles out at once: a run every two seconds starts many.
    let idle = [("ABX_AGENTS_SESSION_IDLE_SECONDS", "1")];
    let server = sandbox.server_with(&idle);
    run_fixture(FIXTURE, &server, &sandbox, "main", &[]);
    let seen = |text: &str| {
        upstream
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r["input"].to_string().contains(text))
            .count()
    };
    // Scheduled and manual runs reached the model as session turns.
    assert!(
        seen("SAY from automation") >= 2,
        "no scheduled new-session turn"
    );
    assert!(
        seen("SAY woken by automation") >= 2,
        "no existing-session turn"
    );

    // kill -9 while the survivor runs every 3 s, down for 7 s (two or three
    // occurrences missed), then a new server on the same state.
    let mut server = server;
    let down_from = unix_now();
    unsafe { libc::kill(server.child.id() as i32, libc::SIGKILL) };
    let _ = server.child.wait();
    drop(server);
    std::thread::sleep(Duration::from_secs(7));
    let down_to = unix_now();
    let restarted = sandbox.server_with(&idle);
    let (from, to) = (down_from.to_string(), down_to.to_string());
    run_fixture(
        FIXTURE,
        &restarted,
        &sandbox,
        "after_restart",
        &[("DOWN_FROM", &from), ("DOWN_TO", &to)],
    );
}

/// A run is its owner's request under the policy in force when it runs: narrowed after
/// the automation was made, the owner's run is refused as the owner would be, and no
/// session is created. On epoll, the other driver.
#[test]
fn a_run_is_refused_what_its_owner_is_refused_now() {
    let upstream = serve_upstream();
    let sandbox = Sandbox::new(&upstream);
    let server = sandbox.server_on("epoll", &[]);
    let alice =
        |method: &str, path: &str, body: Option<Value>| as_alice(&server, method, path, body);
    let (status, created) = alice(
        "POST",
        "/v1/agents/automations",
        Some(json!({
            "type": "once", "name": "later", "run_at": unix_now() + 3600,
            "target": {"type": "new_session", "environment": {"type": "self_hosted", "workspace_directory": "/workspace"},
                       "agent": {"model": "stub-model"}, "input": "SAY never"},
        })),
    );
    assert_eq!(status, 200, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["x_agent_sandbox"]["next_run_at"], created["run_at"]);

    // Now alice holds agents:use alone, and session creation needs another scope.
    let revision = || alice("GET", "/capabilities", None).1["policy"]["revision"].clone();
    assert!(revision().is_string(), "no policy revision");
    let first = revision();
    let policy = std::fs::read_to_string(&sandbox.policy).unwrap().replace(
        "{id: alice, scopes: [\"*\"]",
        "{id: alice, scopes: [\"agents:use\"]",
    );
    assert!(policy.contains("agents:use"), "{policy}");
    std::fs::write(
        &sandbox.policy,
        format!(
            "{policy}endpoints:\n  agents_sessions_create: {{scopes: [\"sessions:create\"]}}\n"
        ),
    )
    .unwrap();
    let hung_up = unsafe { libc::kill(server.child.id() as i32, libc::SIGHUP) };
    assert_eq!(hung_up, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while revision() == first && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_ne!(revision(), first, "the policy was not reloaded");

    let (status, run) = alice(
        "POST",
        &format!("/v1/agents/automations/{id}/invocations"),
        None,
    );
    assert_eq!(status, 200, "{run}");
    let run_id = run["id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let settled = loop {
        let (_, run) = alice(
            "GET",
            &format!("/v1/agents/automations/{id}/invocations/{run_id}"),
            None,
        );
        if run["status"] != "queued" || std::time::Instant::now() > deadline {
            break run;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(settled["status"], "failed", "{settled}");
    assert_eq!(settled["error"]["code"], "missing_scope", "{settled}");
    assert!(settled["session_id"].is_null(), "{settled}");
    let (_, sessions) = alice("GET", "/v1/agents/sessions", None);
    assert_eq!(sessions["data"], json!([]), "a refused run made a session");
    // The schedule itself is untouched by a manual run.
    let (_, after) = alice("GET", &format!("/v1/agents/automations/{id}"), None);
    assert_eq!(after["status"], "active");
    assert_eq!(after["x_agent_sandbox"]["next_run_at"], created["run_at"]);
}

/// No automation scheduled and no webhook queued: the server runs neither background
/// thread. Scheduling one starts the automations thread, pausing the last one ends it,
/// and a manual run of the paused automation starts it again and is delivered.
#[test]
fn background_threads_run_only_while_there_is_work() {
    let upstream = serve_upstream();
    let sandbox = Sandbox::new(&upstream);
    let server = sandbox.server_with(&[]);
    let pid = server.child.id();
    let alice =
        |method: &str, path: &str, body: Option<Value>| as_alice(&server, method, path, body);
    let running = |name: &str| threads_named(pid, name) > 0;
    let eventually = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // The threads resume what the last server left shortly after start; here nothing.
    std::thread::sleep(Duration::from_millis(300));
    eventually("an idle automations thread at start", &|| {
        !running("abx-automations")
    });
    assert!(!running("abx-webhooks"), "an idle webhooks thread at start");

    let (status, created) = alice(
        "POST",
        "/v1/agents/automations",
        Some(json!({
            "type": "once", "name": "later", "run_at": unix_now() + 3600,
            "target": {"type": "new_session", "environment": {"type": "self_hosted", "workspace_directory": "/workspace"},
                       "agent": {"model": "stub-model"}, "input": "SAY run by hand"},
        })),
    );
    assert_eq!(status, 200, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    eventually("no automations thread for a scheduled automation", &|| {
        running("abx-automations")
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        running("abx-automations"),
        "the thread ended with work left"
    );

    let (status, paused) = alice("POST", &format!("/v1/agents/automations/{id}/pause"), None);
    assert_eq!(status, 200, "{paused}");
    eventually("the automations thread outlived the last schedule", &|| {
        !running("abx-automations")
    });

    let (status, run) = alice(
        "POST",
        &format!("/v1/agents/automations/{id}/invocations"),
        None,
    );
    assert_eq!(status, 200, "{run}");
    let run_id = run["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let settled = loop {
        let (_, run) = alice(
            "GET",
            &format!("/v1/agents/automations/{id}/invocations/{run_id}"),
            None,
        );
        if run["status"] != "queued" || Instant::now() > deadline {
            break run;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(
        settled["status"], "queued",
        "the manual run was never delivered"
    );
    assert!(settled["session_id"].is_string(), "{settled}");
    // The session the run started lives on the thread's driver: the thread stays.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        running("abx-automations"),
        "the thread ended under its session"
    );
}
