//! First run and operations: base-directory handling, shutdown with open streams, and a
//! server whose stderr or stdout is a closed pipe.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::on_both_drivers;
use crate::support::{
    answered_connection, open_watch, read_event, read_reply, Launch, Server, TempDir, MAIN_BIN,
};

fn relative_base_dir_is_resolved_against_the_working_directory(driver: &'static str) {
    let work = TempDir::new("cwd");
    std::fs::create_dir(work.path().join("sub")).unwrap();
    let resolved = work.path().join("sub");
    let mut launch = Launch::new(driver).arg("--base-dir").arg("sub");
    launch.current_dir = Some(work.path().to_path_buf());
    let server = launch.start();
    let banner = server
        .startup
        .iter()
        .find(|l| l.starts_with("agent-sandbox "))
        .unwrap();
    assert!(
        banner.contains(&format!("base_dir={}", resolved.display())),
        "{banner}"
    );
    let reply = server.post("/upload", r#"{"path": "a.txt", "content_base64": "aGk="}"#);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.json()["path"],
        resolved.join("a.txt").to_str().unwrap()
    );
    assert_eq!(std::fs::read(resolved.join("a.txt")).unwrap(), b"hi");
}

fn unusable_base_dirs_refuse_to_start(driver: &'static str) {
    let dir = TempDir::new("notadir");
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let (code, stderr) = Launch::new(driver).base_dir(&file).fail();
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is not a directory"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let (code, stderr) = Launch::new(driver).arg("--base-dir").arg("").fail();
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--base-dir"), "{stderr}");
}

/// As the Python reference: listing a missing base is 404, stat says nothing is there,
/// and an upload or mkdir creates it. (The server creates a missing base directory at
/// startup; this one disappears afterwards.)
fn missing_base_dir_behaves_like_the_reference(driver: &'static str) {
    let dir = TempDir::new("missing");
    let base = dir.path().join("home/user");
    let server = Launch::new(driver).base_dir(&base).start();
    std::fs::remove_dir_all(&base).unwrap();
    let reply = server.get("/files/list?path=.");
    assert_eq!(reply.status, 404, "{}", reply.text());
    assert_eq!(reply.json()["type"], "FileNotFoundError");
    let reply = server.get("/files/stat?path=x");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["exists"], false);
    assert_eq!(server.get("/download?path=x").status, 404);
    let reply = server.post("/upload", r#"{"path": "n.txt", "content_base64": "aGk="}"#);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(std::fs::read(base.join("n.txt")).unwrap(), b"hi");
    std::fs::remove_dir_all(&base).unwrap();
    let reply = server.post("/files/mkdir", r#"{"path": "d/e"}"#);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(base.join("d/e").is_dir());
}

/// SIGTERM ends every open event stream with a final `shutdown` event, and the process
/// exits well inside `docker stop`'s 10 s.
fn shutdown_ends_open_streams_at_once(driver: &'static str) {
    let mut server = Launch::new(driver).start();
    std::fs::create_dir(server.base_dir().join("w")).unwrap();
    let mut readers = Vec::new();
    for _ in 0..10 {
        let mut stream = server.connect();
        stream
            .write_all(b"GET /files/watch?path=w&timeout=300 HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut reader = BufReader::new(stream);
        let mut text = String::new();
        while !text.contains("event: ready") {
            assert!(reader.read_line(&mut text).unwrap() > 0);
        }
        readers.push(reader);
    }
    let started = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    for reader in &mut readers {
        let mut rest = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            rest.push_str(&line);
        }
        assert!(rest.contains("event: shutdown\n"), "{rest:?}");
        assert!(
            rest.ends_with("0\r\n\r\n"),
            "stream not ended cleanly: {rest:?}"
        );
    }
    let status = server.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "shutdown took {took:?}");
}

/// Logging can never stop the server: with stdout and stderr closed pipes it starts,
/// serves, and still exits 0 on SIGTERM.
fn closed_output_pipes_do_not_block_shutdown(driver: &'static str) {
    let dir = TempDir::new("pipes");
    let mut child = Command::new(MAIN_BIN)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--pty-port",
            "0",
            "--io-driver",
            driver,
        ])
        // A missing base directory makes it warn on stderr at startup.
        .arg("--base-dir")
        .arg(dir.path().join("missing"))
        .env("ABX_STATE_DIR", dir.path().join("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    while !first.starts_with("listening on ") {
        first.clear();
        assert!(out.read_line(&mut first).unwrap() > 0, "no 'listening on'");
    }
    let addr = first.trim().trim_start_matches("listening on ").to_string();
    drop(out);
    drop(child.stderr.take());
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut BufReader::new(stream)).unwrap().status, 200);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0));
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("SIGTERM ignored with closed output pipes");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn health_check_flag_probes_the_server(driver: &'static str) {
    let server = Launch::new(driver).start();
    let probe = |port: u16| {
        Command::new(MAIN_BIN)
            .args(["--health-check", "--port", &port.to_string()])
            .output()
            .unwrap()
    };
    let up = probe(server.addr.port());
    assert_eq!(up.status.code(), Some(0), "{up:?}");
    let port = crate::support::unused_addr().port();
    let down = probe(port);
    assert_eq!(down.status.code(), Some(1), "{down:?}");
    assert!(String::from_utf8_lossy(&down.stderr).contains("health check"));
}

/// Memory per idle or trickling connection is a small constant: refused requests that
/// declare 10 MiB bodies and trickle bytes hold no body buffer, and a body that keeps
/// below the minimum rate is cut off about one read timeout after it started.
fn trickling_bodies_hold_no_memory_and_are_cut_off(driver: &'static str) {
    let server = Launch::new(driver)
        .env("ABX_SERVER_TOKEN", "secret")
        .arg("--read-timeout")
        .arg("2")
        .start();
    let mut streams = Vec::new();
    for _ in 0..100 {
        let mut stream = server.connect();
        stream
            .write_all(
                b"POST /files/mkdir HTTP/1.1\r\nHost: t\r\nContent-Length: 10485760\r\n\r\n{",
            )
            .unwrap();
        streams.push(stream);
    }
    std::thread::sleep(Duration::from_millis(500));
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(
        rss_kib < 32 * 1024,
        "RSS {rss_kib} KiB with 100 trickling refusals"
    );
    // A byte every half second is far below the minimum rate: cut off after ~2 s.
    let started = Instant::now();
    let mut stream = server.connect();
    stream
        .write_all(b"POST /files/mkdir HTTP/1.1\r\nHost: t\r\nX-Access-Token: secret\r\nContent-Length: 1000\r\n\r\n")
        .unwrap();
    let mut closed = false;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(500));
        if stream.write_all(b" ").is_err() {
            closed = true;
            break;
        }
        let mut probe = [0u8; 1];
        stream.set_nonblocking(true).unwrap();
        let read = std::io::Read::read(&mut stream, &mut probe);
        stream.set_nonblocking(false).unwrap();
        if matches!(read, Ok(0)) {
            closed = true;
            break;
        }
    }
    assert!(closed, "a trickling body was never cut off");
    assert!(started.elapsed() < Duration::from_secs(8));
    drop(streams);
    assert_eq!(server.get("/health").status, 200);
}

/// Opens keep-alive connections, each answered, until the server holds `limit`
/// descriptors: after this, anything that needs a new descriptor fails with EMFILE.
fn take_every_descriptor(server: &Server, limit: usize) -> Vec<(TcpStream, BufReader<TcpStream>)> {
    let pid = server.child.id();
    let open_fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let mut held = Vec::new();
    while open_fds() < limit {
        assert!(held.len() < limit, "the descriptor limit was not reached");
        held.push(answered_connection(server));
    }
    held
}

/// A watch whose rescan fails (here: no descriptor left to open the directory) says
/// `error` and never claims the directory was deleted.
fn a_failed_rescan_is_an_error_not_a_delete(driver: &'static str) {
    const LIMIT: usize = 64;
    let mut launch = Launch::new(driver);
    launch.nofile = Some(LIMIT as u64);
    let server = launch.start();
    let watched = server.base_dir().join("w");
    std::fs::create_dir(&watched).unwrap();
    std::fs::write(watched.join("a.txt"), b"a").unwrap();
    let mut watch = open_watch(&server, "path=w&interval=0.1&timeout=60");
    let held = take_every_descriptor(&server, LIMIT);
    std::fs::write(watched.join("b.txt"), b"b").unwrap();
    let (name, data) = read_event(&mut watch);
    assert_eq!(name, "error", "{data}");
    assert!(
        data["error"]
            .as_str()
            .unwrap()
            .contains("Too many open files"),
        "{data}"
    );
    assert!(watched.is_dir());
    drop(held);
}

/// With every descriptor in use, a file route answers 503 `resource_exhausted` with
/// `Retry-After` (not a 500 from deep inside), and works again once descriptors free up.
fn descriptor_exhaustion_is_503_with_retry_after(driver: &'static str) {
    const LIMIT: usize = 64;
    let mut launch = Launch::new(driver);
    launch.nofile = Some(LIMIT as u64);
    let server = launch.start();
    let pid = server.child.id();
    let open_fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let mut held = take_every_descriptor(&server, LIMIT);
    let (stream, reader) = held.last_mut().unwrap();
    for path in ["/files/list?path=.", "/files/stat?path=x"] {
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
            .unwrap();
        let reply = read_reply(reader).unwrap();
        assert_eq!(reply.status, 503, "{path}: {}", reply.text());
        assert_eq!(reply.json()["code"], "resource_exhausted");
        assert_eq!(reply.header("retry-after"), Some("1"));
    }
    // Starting a program needs descriptors too (its working directory, its pipes).
    let body = r#"{"command": "true"}"#;
    stream
        .write_all(
            format!(
                "POST /shell HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .unwrap();
    let reply = read_reply(reader).unwrap();
    assert_eq!(reply.status, 503, "/shell: {}", reply.text());
    assert_eq!(reply.json()["code"], "resource_exhausted");
    held.truncate(held.len() - 4);
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_fds() >= LIMIT - 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.get("/files/list?path=.").status, 200);
}

on_both_drivers!(
    descriptor_exhaustion_is_503_with_retry_after,
    a_failed_rescan_is_an_error_not_a_delete,
    relative_base_dir_is_resolved_against_the_working_directory,
    unusable_base_dirs_refuse_to_start,
    missing_base_dir_behaves_like_the_reference,
    shutdown_ends_open_streams_at_once,
    closed_output_pipes_do_not_block_shutdown,
    health_check_flag_probes_the_server,
    trickling_bodies_hold_no_memory_and_are_cut_off,
);

/// A seccomp filter that refuses the three io_uring system calls with EPERM, as
/// Docker's default profile does, installed in the child before it runs the server.
fn refuse_io_uring(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure makes three system calls and touches
    // only its own stack.
    unsafe {
        command.pre_exec(|| {
            const LD_NR: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
            const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
            const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
            let stmt = |code, k| libc::sock_filter {
                code,
                jt: 0,
                jf: 0,
                k,
            };
            let jump_if = |k: i64, jt| libc::sock_filter {
                code: JEQ,
                jt,
                jf: 0,
                k: k as u32,
            };
            let filter = [
                // seccomp_data.nr is the first word.
                stmt(LD_NR, 0),
                jump_if(libc::SYS_io_uring_setup, 3),
                jump_if(libc::SYS_io_uring_enter, 2),
                jump_if(libc::SYS_io_uring_register, 1),
                stmt(RET, libc::SECCOMP_RET_ALLOW),
                stmt(RET, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
            ];
            let program = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0,
                    &program as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Where a seccomp profile refuses io_uring (Docker's default), `auto` serves on epoll
/// and says why, and `--io-driver uring` refuses to start with the reason.
#[test]
fn refused_io_uring_falls_back_to_epoll() {
    let dir = TempDir::new("seccomp");
    let mut command = Command::new(MAIN_BIN);
    command
        .args(["--host", "127.0.0.1", "--port", "0", "--pty-port", "0"])
        .arg("--base-dir")
        .arg(dir.path())
        .env("ABX_STATE_DIR", dir.path().join("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    refuse_io_uring(&mut command);
    let mut child = command.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut banner, mut line) = (String::new(), String::new());
    while !line.starts_with("listening on ") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "no 'listening on'");
        if line.starts_with("agent-sandbox ") {
            banner = line.clone();
        }
    }
    let addr = line.trim().trim_start_matches("listening on ").to_string();
    assert!(banner.contains("io_driver=epoll"), "{banner}");
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut BufReader::new(stream)).unwrap().status, 200);
    child.kill().unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("io_uring is not available (Operation not permitted")
            && stderr.contains("falling back to epoll"),
        "{stderr}"
    );

    let mut command = Command::new(MAIN_BIN);
    command
        .args(["--port", "0", "--pty-port", "0", "--io-driver", "uring"])
        .arg("--base-dir")
        .arg(dir.path())
        .env("ABX_STATE_DIR", dir.path().join("state"));
    refuse_io_uring(&mut command);
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr
            .contains("--io-driver uring: io_uring is not available here (Operation not permitted"),
        "{stderr}"
    );
}
