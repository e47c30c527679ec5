//! Automations of the Agents API (beta) against the real binary and the real codex CLI,
//! whose only model provider is the scripted stub upstream on 127.0.0.1. The official
//! `openai` SDK drives every operation (`tests/fixtures/agents_automations_sdk.py`) and
//! validates every automation and run with its own models; this side kills and
//! restarts the server, and checks what reached the model.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::agents_sessions::{run_fixture, Sandbox};
use crate::upstream::serve_upstream;

const FIXTURE: &str = "agents_automations_sdk.py";

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
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
