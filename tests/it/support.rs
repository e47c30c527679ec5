//! Test support: start the real binary on an ephemeral port, speak raw HTTP to it
//! (every test file's requests go through the helpers here), and serve the stub HTTP
//! servers the binary calls in turn.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const MAIN_BIN: &str = env!("CARGO_BIN_EXE_agent-sandbox");
pub const EXAMPLE_BIN: &str = env!("CARGO_BIN_EXE_embed-example");

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "abx-test-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How to start a server.
pub struct Launch {
    pub bin: &'static str,
    pub driver: &'static str,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub base_dir: Option<PathBuf>,
    /// The server's working directory (the test's own when `None`).
    pub current_dir: Option<PathBuf>,
    /// A hard limit on open files for the server (`ulimit -n`).
    pub nofile: Option<u64>,
    /// Run the server as PID 1 of a new PID namespace (`unshare`), as in a container.
    pub pid1: bool,
    /// Start `python3 <script>` (a template's `commands.py`) instead of the binary; the
    /// script's `start()` execs the binary. Settings go by environment, which outranks
    /// the script's `start(9000)`.
    pub python: Option<PathBuf>,
}

/// The tools the tests drive, at the versions `src/pins.env` names, installed into
/// `.tools/` of this checkout by `scripts/tools` (run once per test process; a warm run
/// takes a fraction of a second). Tests use these, never whatever is first on `PATH`.
pub struct Tools {
    /// `PATH` for a server whose children run the pinned CLIs (and their Node.js)
    /// ahead of anything else.
    pub path: String,
    /// The Python of `.tools/venv` (the pinned `openai` SDK).
    pub python: PathBuf,
    /// The Python of `.tools/reference-venv`: the published `agent-sandbox-server` this
    /// server replaces and its official `agent-sandbox-client` (tests/it/reference.rs).
    pub reference_python: PathBuf,
    /// The Python of `.tools/e2b-venv`: the pinned `e2b` SDK (tests/it/envd.rs).
    pub e2b_python: PathBuf,
}

pub fn tools() -> &'static Tools {
    static TOOLS: std::sync::OnceLock<Tools> = std::sync::OnceLock::new();
    TOOLS.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let output = Command::new(root.join("scripts/tools"))
            .arg("--path")
            .output()
            .expect("run scripts/tools");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "scripts/tools could not install the pinned tools:\n{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let own = stdout.lines().last().unwrap_or_default().trim().to_string();
        Tools {
            path: format!("{own}:{}", std::env::var("PATH").unwrap_or_default()),
            python: root.join(".tools/venv/bin/python3"),
            reference_python: root.join(".tools/reference-venv/bin/python3"),
            e2b_python: root.join(".tools/e2b-venv/bin/python3"),
        }
    })
}

/// A line of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// A server whose policy (`rules` first, then two identities) knows `alice` and `bob`,
/// each with every scope, whose tokens are `alice-secret` and `bob-secret`; with the
/// directory that holds the policy, kept as long as the server.
pub fn alice_and_bob(driver: &'static str, rules: &str) -> (Server, TempDir) {
    let dir = TempDir::new("two-identities");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!("{rules}identities:\n  - {{id: alice, scopes: [\"*\"], token_env: ALICE_TOKEN}}\n  - {{id: bob, scopes: [\"*\"], token_env: BOB_TOKEN}}\n"),
    )
    .unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .env("ALICE_TOKEN", "alice-secret")
        .env("BOB_TOKEN", "bob-secret")
        .start();
    (server, dir)
}

/// A version `src/pins.env` names.
pub fn pin(key: &str) -> String {
    let pins = include_str!("../../src/pins.env");
    pins.lines()
        .filter_map(|line| line.split_once('='))
        .find(|(name, _)| name.trim() == key)
        .map(|(_, value)| value.trim().to_string())
        .unwrap_or_else(|| panic!("src/pins.env names no {key}"))
}

/// The uninstalled `agent_sandbox` package of this repository.
pub fn python_package_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python")
}

impl Launch {
    pub fn new(driver: &'static str) -> Launch {
        Launch {
            bin: MAIN_BIN,
            driver,
            args: Vec::new(),
            env: Vec::new(),
            base_dir: None,
            current_dir: None,
            nofile: None,
            pid1: false,
            python: None,
        }
    }
    /// Serves the template script `script` through the Python bridge.
    pub fn python(driver: &'static str, script: &Path) -> Launch {
        Launch {
            python: Some(script.to_path_buf()),
            current_dir: script.parent().map(Path::to_path_buf),
            ..Launch::new(driver)
        }
    }
    pub fn example(driver: &'static str) -> Launch {
        Launch {
            bin: EXAMPLE_BIN,
            ..Launch::new(driver)
        }
    }
    pub fn arg(mut self, arg: &str) -> Launch {
        self.args.push(arg.to_string());
        self
    }
    pub fn env(mut self, name: &str, value: &str) -> Launch {
        self.env.push((name.to_string(), value.to_string()));
        self
    }
    pub fn base_dir(mut self, dir: &Path) -> Launch {
        self.base_dir = Some(dir.to_path_buf());
        self
    }
    pub fn pid1(mut self) -> Launch {
        self.pid1 = true;
        self
    }
    /// The server's command over its own base directory and state directory (each
    /// test server keeps its `ABX_STATE_DIR` to itself unless the test names one).
    fn command(&self, own_base: &Path, own_state: &Path) -> Command {
        if let Some(script) = &self.python {
            let mut cmd = Command::new("python3");
            cmd.arg(script).args(&self.args);
            cmd.env("PYTHONPATH", python_package_dir())
                .env("ABX_SERVER_BIN", self.bin)
                .env("ABX_SERVER_HOST", "127.0.0.1")
                .env("ABX_SERVER_PORT", "0")
                .env("ABX_PTY_PORT", "0")
                .env("ABX_K8S_RUNTIME_PORT", "0")
                .env("ABX_ENVD_PORT", "0")
                .env("ABX_SERVER_WORKERS", "2")
                .env("ABX_IO_DRIVER", self.driver)
                .env(
                    "ABX_SERVER_BASE_DIR",
                    self.base_dir.as_deref().unwrap_or(own_base),
                )
                .env("ABX_STATE_DIR", own_state);
            return self.finish(cmd);
        }
        let mut cmd = if self.pid1 {
            let mut unshare = Command::new("unshare");
            unshare.args(["--pid", "--fork", "--mount-proc", "--kill-child", self.bin]);
            unshare
        } else {
            Command::new(self.bin)
        };
        cmd.args([
            "--port",
            "0",
            "--pty-port",
            "0",
            "--k8s-runtime-port",
            "0",
            "--envd-port",
            "0",
            "--host",
            "127.0.0.1",
            "--workers",
            "2",
            "--io-driver",
            self.driver,
        ]);
        cmd.arg("--base-dir")
            .arg(self.base_dir.as_deref().unwrap_or(own_base));
        cmd.args(&self.args);
        cmd.env("ABX_STATE_DIR", own_state);
        self.finish(cmd)
    }
    /// The environment, limits and pipes every launch shares.
    fn finish(&self, mut cmd: Command) -> Command {
        for var in [
            "ABX_SERVER_TOKEN",
            "ABX_SERVER_ENABLED_GROUPS",
            "ABX_SERVER_POLICY",
            "ABX_MAX_UPLOAD_SIZE",
            "ABX_TOKEN_FILE",
        ] {
            cmd.env_remove(var);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if let Some(dir) = &self.current_dir {
            cmd.current_dir(dir);
        }
        if let Some(limit) = self.nofile {
            use std::os::unix::process::CommandExt;
            let limit = rustix::process::Rlimit {
                current: Some(limit),
                maximum: Some(limit),
            };
            // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
            unsafe {
                cmd.pre_exec(move || {
                    rustix::process::setrlimit(rustix::process::Resource::Nofile, limit)
                        .map_err(std::io::Error::from)
                });
            }
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
    pub fn start(self) -> Server {
        let base = TempDir::new("base");
        let state = TempDir::new("state");
        let mut child = self
            .command(base.path(), state.path())
            .spawn()
            .expect("spawn server");
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx2.send(line);
            }
        });
        let mut lines = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let addr = loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| {
                    panic!("server did not print 'listening on'; output: {lines:?}")
                });
            if let Some(addr) = line.strip_prefix("listening on ") {
                let addr: SocketAddr = addr.trim().parse().unwrap();
                lines.push(line);
                break addr;
            }
            lines.push(line);
        };
        let pty_addr = lines
            .iter()
            .find_map(|l| l.strip_prefix("pty listening on "))
            .map(|a| a.trim().parse().unwrap());
        let k8s_addr = lines
            .iter()
            .find_map(|l| l.strip_prefix("k8s_runtime listening on "))
            .map(|a| a.trim().parse().unwrap());
        let envd_addr = lines
            .iter()
            .find_map(|l| l.strip_prefix("envd listening on "))
            .map(|a| a.trim().parse().unwrap());
        Server {
            child,
            addr,
            pty_addr,
            k8s_addr,
            envd_addr,
            startup: lines,
            output: rx,
            _base: base,
            _state: state,
        }
    }
    /// Runs the binary expecting it to refuse to start; returns (exit code, stderr).
    pub fn fail(self) -> (i32, String) {
        let base = TempDir::new("base");
        let state = TempDir::new("state");
        let output = self
            .command(base.path(), state.path())
            .output()
            .expect("run server");
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

/// A running server, killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    /// The PTY WebSocket's address, when the terminal group listens.
    pub pty_addr: Option<SocketAddr>,
    /// The k8s_runtime port's address, when that group listens.
    pub k8s_addr: Option<SocketAddr>,
    /// The envd port, while the `envd` group is on.
    pub envd_addr: Option<SocketAddr>,
    pub startup: Vec<String>,
    pub output: mpsc::Receiver<String>,
    _base: TempDir,
    _state: TempDir,
}

impl Server {
    pub fn start(driver: &'static str) -> Server {
        Launch::new(driver).start()
    }
    pub fn base_dir(&self) -> &Path {
        self._base.path()
    }
    pub fn connect(&self) -> TcpStream {
        connect_to(self.addr)
    }
    pub fn get(&self, path: &str) -> Reply {
        self.request("GET", path, &[], None)
    }
    pub fn post(&self, path: &str, body: &str) -> Reply {
        self.request("POST", path, &[], Some(body.as_bytes()))
    }
    /// `GET path`: the status and the JSON answer.
    pub fn get_json(&self, path: &str) -> (u16, Value) {
        let reply = self.get(path);
        (reply.status, reply.json())
    }
    /// `POST path` with `body` as its JSON.
    pub fn post_value(&self, path: &str, body: Value) -> Reply {
        self.post(path, &body.to_string())
    }
    /// `POST path` with `body` as its JSON: the status and the JSON answer.
    pub fn post_json(&self, path: &str, body: Value) -> (u16, Value) {
        let reply = self.post_value(path, body);
        (reply.status, reply.json())
    }
    /// `DELETE path`: the status and the JSON answer.
    pub fn delete_json(&self, path: &str) -> (u16, Value) {
        let reply = self.request("DELETE", path, &[], None);
        (reply.status, reply.json())
    }
    /// [`Server::get_json`] for the agents group's `/v1` routes: the answer must carry
    /// the group's `X-Agent-Sandbox-Local: 1`.
    pub fn v1_get(&self, path: &str) -> (u16, Value) {
        let reply = self.get(path);
        assert_eq!(reply.header("x-agent-sandbox-local"), Some("1"), "{path}");
        (reply.status, reply.json())
    }
    /// [`Server::post_json`] for the agents group's `/v1` routes, as [`Server::v1_get`].
    pub fn v1_post(&self, path: &str, body: Value) -> (u16, Value) {
        let reply = self.post_value(path, body);
        assert_eq!(reply.header("x-agent-sandbox-local"), Some("1"), "{path}");
        (reply.status, reply.json())
    }
    /// One request on a fresh connection.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Reply {
        request_at(self.addr, method, path, headers, body)
    }
}

fn connect_to(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

/// One request on a fresh connection to `addr`: for threads that share a server's
/// address (a [`Server`] itself stays on the test's thread).
pub fn request_at(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Reply {
    request_within(addr, method, path, headers, body, Duration::from_secs(20))
}

/// [`request_at`] for an answer that may take up to `within` (a CLI install).
pub fn request_within(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    within: Duration,
) -> Reply {
    let mut stream = connect_to(addr);
    stream.set_read_timeout(Some(within)).unwrap();
    // A test that names its own Host (the server's own origin) replaces the default.
    let host = headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("host"))
        .map_or("test", |(_, value)| value);
    let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    let headers = headers
        .iter()
        .filter(|(name, _)| !name.eq_ignore_ascii_case("host"));
    for (name, value) in headers {
        raw.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        raw.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    raw.push_str("\r\n");
    let mut bytes = raw.into_bytes();
    if let Some(body) = body {
        bytes.extend_from_slice(body);
    }
    stream.write_all(&bytes).unwrap();
    let mut reader = BufReader::new(stream);
    read_reply(&mut reader).expect("a response")
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A parsed response.
#[derive(Debug)]
pub struct Reply {
    pub version: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// An address on 127.0.0.1 where nothing listens (a port just let go).
pub fn unused_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// One request a stub server received.
pub struct Received {
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    /// Header names in lower case, with their values.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// A stub HTTP server on 127.0.0.1 that the server under test calls (a model API, web
/// pages), and what it kept of each request, in arrival order.
pub struct Stub<T> {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<T>>>,
}

impl<T> Stub<T> {
    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// Serves a stub until the test process ends: a thread per connection, one request
/// each (read by [`read_request`], waiting at most `read_timeout` for it). `record`
/// says what `seen` keeps of the request, kept before the answer is written, so a test
/// that has the answer finds the request in `seen`; `answer` writes the response.
pub fn serve_stub<T: Clone + Send + 'static>(
    read_timeout: Option<Duration>,
    record: impl Fn(&Received) -> T + Send + Sync + 'static,
    answer: impl Fn(TcpStream, &Received, T) + Send + Sync + 'static,
) -> Stub<T> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<T>>> = Arc::default();
    let kept = seen.clone();
    let serve = Arc::new((record, answer));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (kept, serve) = (kept.clone(), serve.clone());
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(read_timeout);
                let mut reader = BufReader::new(stream);
                let mut headers = Vec::new();
                let Some((method, target, body)) = read_request(&mut reader, &mut headers) else {
                    return;
                };
                let received = Received {
                    method,
                    target,
                    headers,
                    body,
                };
                let record = (serve.0)(&received);
                kept.lock().unwrap().push(record.clone());
                (serve.1)(reader.into_inner(), &received, record);
            });
        }
    });
    Stub { addr, seen }
}

/// One request read by a test's stub server: method, target and body (by
/// `Content-Length`); `None` when the client closed before a request line.
/// The headers go into `headers` (names in lower case).
pub fn read_request<R: BufRead>(
    reader: &mut R,
    headers: &mut Vec<(String, String)>,
) -> Option<(String, String, Vec<u8>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut length = 0;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    Some((method, target, body))
}

/// Reads one response (Content-Length, chunked, or until close). `None` on a clean EOF
/// before any byte.
pub fn read_reply<R: BufRead>(reader: &mut R) -> Option<Reply> {
    let mut status_line = String::new();
    if reader.read_line(&mut status_line).ok()? == 0 {
        return None;
    }
    let mut parts = status_line.trim_end().splitn(3, ' ');
    let version = parts.next()?.to_string();
    let status: u16 = parts.next()?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (n, v) = line.split_once(':')?;
        headers.push((n.trim().to_string(), v.trim().to_string()));
    }
    let mut reply = Reply {
        version,
        status,
        headers,
        body: Vec::new(),
    };
    if status == 100 {
        return Some(reply);
    }
    if let Some(len) = reply.header("content-length") {
        let mut body = vec![0; len.parse().ok()?];
        reader.read_exact(&mut body).ok()?;
        reply.body = body;
    } else if reply
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let mut size_line = String::new();
            reader.read_line(&mut size_line).ok()?;
            let size = usize::from_str_radix(size_line.trim(), 16).ok()?;
            if size == 0 {
                let mut end = String::new();
                reader.read_line(&mut end).ok()?;
                break;
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            reply.body.extend_from_slice(&chunk[..size]);
        }
    } else {
        reader.read_to_end(&mut reply.body).ok()?;
    }
    Some(reply)
}

/// Reads until the peer closes; true if it closed within `within`.
pub fn closes_within(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut sink = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
        if Instant::now() > deadline {
            return false;
        }
    }
}

/// Generates one `#[test]` per I/O driver for each listed function `fn(&'static str)`.
#[macro_export]
macro_rules! on_both_drivers {
    ($($name:ident),* $(,)?) => {
        mod uring {
            $( #[test] fn $name() { super::$name("uring") } )*
        }
        mod epoll {
            $( #[test] fn $name() { super::$name("epoll") } )*
        }
    };
}

/// Reads the next server-sent event: its name and its JSON data.
pub fn read_event(reader: &mut impl BufRead) -> (String, Value) {
    let mut name = String::new();
    loop {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "stream ended");
        let line = line.trim_end();
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(data) = line.strip_prefix("data: ") {
            return (name, serde_json::from_str(data).unwrap());
        }
    }
}

/// Reads an event stream (its head included) up to the first `: keep-alive` comment: the
/// lines before it and how long it took to come.
pub fn lines_until_keep_alive(reader: &mut impl BufRead) -> (Vec<String>, Duration) {
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "stream ended: {seen:?}"
        );
        if line.starts_with(": keep-alive") {
            return (seen, started.elapsed());
        }
        seen.push(line);
    }
}

/// Sends `request` (an HTTP/1.0 request, so the body ends when the stream does), checks
/// for a 200 event stream and returns the reader positioned at the first event.
pub fn open_event_stream(server: &Server, request: &[u8]) -> BufReader<TcpStream> {
    let mut stream = server.connect();
    stream.write_all(request).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.contains(" 200 "), "{status}");
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.trim_end().is_empty() {
            return reader;
        }
        if line.to_ascii_lowercase().starts_with("content-type:") {
            assert!(line.contains("text/event-stream"), "{line}");
        }
    }
}

/// Opens `GET /files/watch?<query>` over HTTP/1.0 and waits for its `ready` event.
pub fn open_watch(server: &Server, query: &str) -> BufReader<TcpStream> {
    let request = format!("GET /files/watch?{query} HTTP/1.0\r\n\r\n");
    let mut reader = open_event_stream(server, request.as_bytes());
    let (name, data) = read_event(&mut reader);
    assert_eq!(name, "ready", "{data}");
    reader
}

/// A keep-alive connection that has been answered one `GET /health`.
pub fn answered_connection(server: &Server) -> (TcpStream, BufReader<TcpStream>) {
    let mut stream = server.connect();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    assert_eq!(read_reply(&mut reader).unwrap().status, 200);
    (stream, reader)
}

/// A client frame as a client sends it: text, final, masked.
pub(crate) fn masked_text_frame(text: &str) -> Vec<u8> {
    let payload = text.as_bytes();
    assert!(payload.len() < 126, "a short frame");
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut frame = vec![0x81, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
    frame
}
