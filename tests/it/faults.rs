//! Faults found by the second soak (issue 30): descriptor limits, a full disk and a
//! blocking pool that never shrank. Process groups and exited records are in
//! `process.rs`.

use std::time::{Duration, Instant};

use crate::on_both_drivers;
use crate::support::{request_at, Launch};

/// Threads of `pid` named `name` (`/proc/<pid>/task/*/comm`).
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|comm| comm.trim_end() == name)
                })
                .count()
        })
        .unwrap_or(0)
}

/// A burst grows the blocking pool; afterwards a trickle of requests, which one thread
/// serves, must not keep the rest alive: idle threads retire after
/// `ABX_BLOCKING_IDLE_TIMEOUT`.
fn idle_pool_threads_retire_under_a_trickle(driver: &'static str) {
    let server = Launch::new(driver)
        .env("ABX_BLOCKING_THREADS", "16")
        .env("ABX_BLOCKING_IDLE_TIMEOUT", "1")
        .start();
    let pid = server.child.id();
    let addr = server.addr;
    // Uploads under 64 KiB are one pool task each (create, write, rename).
    let body = format!(
        r#"{{"path": "burst/f.bin", "content_base64": "{}"}}"#,
        "QUJD".repeat(10_000)
    );
    let mut peak = 0;
    for _ in 0..5 {
        let clients: Vec<_> = (0..24)
            .map(|i| {
                let body = body.replace("f.bin", &format!("f{i}.bin"));
                std::thread::spawn(move || {
                    for _ in 0..10 {
                        let reply = request_at(addr, "POST", "/upload", &[], Some(body.as_bytes()));
                        assert_eq!(reply.status, 200, "{}", reply.text());
                    }
                })
            })
            .collect();
        for client in clients {
            client.join().unwrap();
        }
        peak = peak.max(threads_named(pid, "abx-blocking"));
        if peak >= 4 {
            break;
        }
    }
    assert!(peak >= 4, "the burst grew the pool to only {peak} threads");
    // Ten pool tasks a second for four seconds.
    let until = Instant::now() + Duration::from_secs(4);
    let mut n = 0;
    while Instant::now() < until {
        let reply = server.post("/files/mkdir", &format!(r#"{{"path": "trickle/{n}"}}"#));
        assert_eq!(reply.status, 200, "{}", reply.text());
        n += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = threads_named(pid, "abx-blocking");
    assert!(
        left <= 2,
        "{left} pool threads still alive after 4 s of a trickle (peak {peak}, idle timeout 1 s)"
    );
}

on_both_drivers!(idle_pool_threads_retire_under_a_trickle);
