//! Faults found by the second soak (issue 30): descriptor limits, a full disk and a
//! blocking pool that never shrank. Process groups and exited records are in
//! `process.rs`.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::on_both_drivers;
use crate::support::{answered_connection, read_reply, request_at, Launch, Reply, TempDir};

/// Threads of `pid` named `name` (`/proc/<pid>/task/*/comm`).
pub(crate) fn threads_named(pid: u32, name: &str) -> usize {
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

/// Opens keep-alive connections, each answered, until the server holds `limit`
/// descriptors.
fn hold_every_descriptor(
    pid: u32,
    server: &crate::support::Server,
    limit: usize,
    held: &mut Vec<(TcpStream, BufReader<TcpStream>)>,
) {
    let open_fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    while open_fds() < limit {
        assert!(held.len() < limit, "the descriptor limit was not reached");
        held.push(answered_connection(server));
    }
}

/// Under `ulimit -n 256`, with every descriptor in use, a new connection is answered at
/// once (503 `resource_exhausted`, `Retry-After: 1`, then closed) instead of waiting in
/// the listen backlog; again and again, and the server serves normally once
/// descriptors are free.
fn connections_past_the_descriptor_limit_are_answered_at_once(driver: &'static str) {
    const LIMIT: usize = 256;
    let mut launch = Launch::new(driver);
    launch.nofile = Some(LIMIT as u64);
    let server = launch.start();
    let pid = server.child.id();
    let mut held = Vec::new();
    let mut slowest = Duration::ZERO;
    for round in 0..20 {
        // Topped up each round: the server may let a descriptor go meanwhile (a pool
        // thread retiring), and the point is a server with none left.
        hold_every_descriptor(pid, &server, LIMIT, &mut held);
        let started = Instant::now();
        let mut stream = TcpStream::connect(server.addr).unwrap();
        // Far longer than an answer takes; without the reserve no answer ever came.
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let mut raw = Vec::new();
        let read = stream.read_to_end(&mut raw);
        assert!(
            read.is_ok() || !raw.is_empty(),
            "round {round}: no answer within 10 s ({read:?})"
        );
        slowest = slowest.max(started.elapsed());
        let reply = read_reply(&mut BufReader::new(&raw[..]))
            .unwrap_or_else(|| panic!("round {round}: {:?}", String::from_utf8_lossy(&raw)));
        assert_eq!(reply.status, 503, "round {round}: {}", reply.text());
        assert_eq!(reply.json()["code"], "resource_exhausted");
        assert_eq!(reply.json()["type"], "OSError");
        assert_eq!(reply.header("retry-after"), Some("1"));
        assert_eq!(reply.header("connection"), Some("close"));
    }
    println!("slowest 503 over 20 connections past the limit: {slowest:?}");
    // The held connections still work, and freeing some lets new ones in.
    let (stream, reader) = held.last_mut().unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(reader).unwrap().status, 200);
    held.truncate(held.len() - 8);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = server.get("/health");
        if reply.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "{}", reply.text());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A small tmpfs mounted on a fresh directory, unmounted on drop.
struct SmallFs(TempDir);

impl SmallFs {
    /// `None` (with a note) when this process may not mount.
    fn mount(size: &str) -> Option<SmallFs> {
        if !rustix::process::geteuid().is_root() {
            println!("skipped: mounting a tmpfs needs root");
            return None;
        }
        let dir = TempDir::new("fullfs");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        if !status.success() {
            println!("skipped: mount -t tmpfs failed ({status})");
            return None;
        }
        Some(SmallFs(dir))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

/// The answer to a write into a full disk: 500 `OSError`, `code: "no_space"`, and the
/// message names the path the caller wrote.
fn assert_no_space(reply: &Reply, path: &str, what: &str) {
    assert_eq!(reply.status, 500, "{what}: {}", reply.text());
    let body = reply.json();
    assert_eq!(body["code"], "no_space", "{what}: {body}");
    assert_eq!(body["type"], "OSError", "{what}: {body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.starts_with("No space left on device (os error 28): '")
            && message.ends_with(&format!("/{path}'")),
        "{what}: {message}"
    );
}

/// The base directory is a 1 MiB tmpfs, filled up: every upload form answers
/// `no_space` naming its path (a JSON upload over 64 KiB used to name `''`), nothing is
/// left behind, the old file is intact, and uploads work again once space is freed.
fn a_full_disk_names_the_path_and_says_no_space(driver: &'static str) {
    let Some(fs) = SmallFs::mount("1m") else {
        return;
    };
    let base = fs.0.path().to_path_buf();
    std::fs::write(base.join("old.txt"), b"keep me").unwrap();
    let filled = std::fs::write(base.join("filler"), vec![7u8; 2 * 1024 * 1024]);
    assert_eq!(
        filled.unwrap_err().raw_os_error(),
        Some(libc::ENOSPC),
        "the filler should fill the file system"
    );
    let server = Launch::new(driver).base_dir(&base).start();
    let encoded = |len: usize| base64_simd::STANDARD.encode_to_string(vec![b'x'; len]);
    for (path, len) in [("big.bin", 200 * 1024), ("small.bin", 1024)] {
        let body = format!(
            r#"{{"path": "{path}", "content_base64": "{}"}}"#,
            encoded(len)
        );
        assert_no_space(&server.post("/upload", &body), path, path);
        // The path may come after the content.
        let body = format!(
            r#"{{"content_base64": "{}", "path": "{path}"}}"#,
            encoded(len)
        );
        assert_no_space(&server.post("/upload", &body), path, "path last");
    }
    let raw = server.request(
        "POST",
        "/files/upload-stream?path=raw.bin",
        &[("Content-Type", "application/octet-stream")],
        Some(&vec![b'r'; 200 * 1024]),
    );
    assert_no_space(&raw, "raw.bin", "raw upload");
    let mut names: Vec<String> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["filler", "old.txt"], "nothing partial is left");
    assert_eq!(std::fs::read(base.join("old.txt")).unwrap(), b"keep me");
    std::fs::remove_file(base.join("filler")).unwrap();
    let body = format!(
        r#"{{"path": "big.bin", "content_base64": "{}"}}"#,
        encoded(200 * 1024)
    );
    let reply = server.post("/upload", &body);
    assert_eq!(reply.status, 200, "after freeing space: {}", reply.text());
    drop(server);
}

on_both_drivers!(
    idle_pool_threads_retire_under_a_trickle,
    a_full_disk_names_the_path_and_says_no_space,
    connections_past_the_descriptor_limit_are_answered_at_once,
);
