//! What the pinned codex `app-server` says during real turns, against the scripted
//! upstream ([`crate::upstream`]): each scenario below runs one `codex app-server`
//! process (its own `CODEX_HOME`, whose only provider is the stub), starts a thread with
//! one dynamic tool, runs its turns and records every JSON-RPC message both ways.
//!
//! The records are committed as `tests/fixtures/codex/<scenario>.jsonl` (one
//! `{"sent": …}` or `{"recv": …}` per line), and the unit tests of
//! `src/agents/codex_map.rs` map them onto the Agents API's events. This test checks that
//! the pinned codex still says what the fixtures say, message kind by message kind (ids,
//! times and text aside), so the unit tests cannot drift from the real program. After a
//! codex upgrade, rewrite them:
//!
//! ```text
//! ABX_CODEX_RECAPTURE=1 cargo test --test it codex_app_server
//! ```

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{tools, TempDir};
use crate::upstream::{codex_config, serve_upstream, Upstream};

/// How long one turn may take against the local stub.
const TURN_TIMEOUT: Duration = Duration::from_secs(90);

/// The dynamic tool every captured thread offers.
fn weather_tool() -> Value {
    json!({"type": "function", "name": "lookup_weather",
           "description": "Looks up the weather of a city.",
           "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"], "additionalProperties": false}})
}

/// One `codex app-server` on stdio, and the record of what was said.
struct AppServer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    log: Vec<Value>,
    next_id: u64,
    _home: TempDir,
}

impl AppServer {
    fn start(upstream: &Upstream) -> (AppServer, PathBuf) {
        let home = TempDir::new("codex-capture");
        let codex_home = home.path().join("codex");
        let work = home.path().join("work");
        std::fs::create_dir_all(&codex_home).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(codex_home.join("config.toml"), codex_config(upstream)).unwrap();
        let codex = tools()
            .path
            .split(':')
            .map(|dir| Path::new(dir).join("codex"))
            .find(|p| p.is_file())
            .expect("codex is not on the tools' PATH: run scripts/tools");
        let mut child = Command::new(codex)
            .arg("app-server")
            .env_clear()
            .env("PATH", &tools().path)
            .env("HOME", home.path())
            .env("CODEX_HOME", &codex_home)
            .env("STUB_API_KEY", "stub")
            .current_dir(&work)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start codex app-server");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let server = AppServer {
            child,
            stdin,
            lines,
            log: Vec::new(),
            next_id: 0,
            _home: home,
        };
        (server, work)
    }

    fn send(&mut self, message: Value) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
        self.log.push(json!({ "sent": message }));
    }

    /// The next message, or `None` after `wait` of silence.
    fn recv(&mut self, wait: Duration) -> Option<Value> {
        match self.lines.recv_timeout(wait) {
            Ok(line) => {
                let message: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
                    panic!("codex printed a line that is not JSON ({e}): {line}")
                });
                self.log.push(json!({ "recv": message }));
                Some(message)
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                panic!("codex app-server exited:\n{}", self.transcript())
            }
        }
    }

    /// The record so far, one message a line.
    fn transcript(&self) -> String {
        self.log.iter().map(|entry| format!("{entry}\n")).collect()
    }

    fn request(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"id": id, "method": method, "params": params}));
        id
    }

    /// Sends a request and reads until its answer (what comes first is recorded too).
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.request(method, params);
        let deadline = Instant::now() + TURN_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let message = self
                .recv(left)
                .unwrap_or_else(|| panic!("no answer to {method}:\n{}", self.transcript()));
            if message["id"] == id && message.get("method").is_none() {
                if let Some(result) = message.get("result") {
                    return result.clone();
                }
                panic!("{method} failed: {message}");
            }
        }
    }

    /// Reads until `done` says so, answering dynamic tool calls with `sunny`.
    fn until(&mut self, mut done: impl FnMut(&mut AppServer, &Value) -> bool) {
        let deadline = Instant::now() + TURN_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let message = self
                .recv(left.min(Duration::from_millis(200)))
                .unwrap_or(Value::Null);
            if message["method"] == "item/tool/call" && message.get("id").is_some() {
                let id = message["id"].clone();
                self.send(json!({"id": id, "result": {
                    "contentItems": [{"type": "inputText", "text": "sunny"}], "success": true}}));
            }
            if done(self, &message) {
                return;
            }
            assert!(
                !left.is_zero(),
                "the turn did not end:\n{}",
                self.transcript()
            );
        }
    }

    /// Closes stdin (codex then exits) and waits for the process.
    fn finish(mut self) -> Vec<Value> {
        self.stdin = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.wait();
        std::mem::take(&mut self.log)
    }
}

/// Runs `turns` (the user's text of each) in one thread and returns the record.
fn capture(turns: &[&str], interrupt: bool) -> Vec<Value> {
    let upstream = serve_upstream();
    let (mut codex, work) = AppServer::start(&upstream);
    codex.call(
        "initialize",
        json!({"clientInfo": {"name": "agent_sandbox_capture", "title": null, "version": "0.1.0"},
               // What `src/agents/app_server.rs` asks for (its `OPTED_OUT`).
               "capabilities": {"experimentalApi": true,
                                "optOutNotificationMethods": ["remoteControl/status/changed",
                                    "account/rateLimits/updated", "thread/readState/changed"]}}),
    );
    codex.send(json!({"method": "initialized"}));
    let started = codex.call(
        "thread/start",
        json!({"cwd": work, "approvalPolicy": "never", "sandbox": "danger-full-access",
               "dynamicTools": [weather_tool()]}),
    );
    let thread = started["thread"]["id"].as_str().unwrap().to_string();
    for text in turns {
        let turn = codex.call(
            "turn/start",
            json!({"threadId": thread, "input": [{"type": "text", "text": text}]}),
        );
        let turn_id = turn["turn"]["id"].as_str().unwrap().to_string();
        let mut interrupted = false;
        let (mut completed, mut idle) = (false, false);
        // The turn is over once it completed and the thread is no longer active (codex
        // says so first: `idle`, or `systemError` after a failure).
        codex.until(|codex, message| {
            if interrupt && !interrupted && message["method"] == "item/agentMessage/delta" {
                // The answer has begun and will never finish: cancel the turn.
                interrupted = true;
                codex.request(
                    "turn/interrupt",
                    json!({"threadId": thread, "turnId": turn_id}),
                );
            }
            completed |= message["method"] == "turn/completed";
            idle |= message["method"] == "thread/status/changed"
                && message["params"]["status"]["type"] != "active";
            completed && idle
        });
    }
    codex.finish()
}

/// Notifications that come when they come (advisories, bookkeeping of no use to the
/// mapping): left out of the comparison.
const NOISE: [&str; 4] = [
    "account/rateLimits/updated",
    "thread/readState/changed",
    "warning",
    "configWarning",
];

/// What a record says, kind by kind: the method of each message codex sent (with the
/// item type for `item/*`, and what each answer answered), runs of deltas as one.
fn shape(log: &[Value]) -> Vec<String> {
    let mut asked = std::collections::HashMap::new();
    let mut kinds: Vec<String> = Vec::new();
    for entry in log {
        if let Some(sent) = entry.get("sent") {
            if let (Some(id), Some(method)) = (sent.get("id"), sent["method"].as_str()) {
                asked.insert(id.to_string(), method.to_string());
            }
            continue;
        }
        let message = &entry["recv"];
        if NOISE.contains(&message["method"].as_str().unwrap_or_default()) {
            continue;
        }
        let kind = match message["method"].as_str() {
            Some(method) if message.get("id").is_some() => format!("request {method}"),
            Some(method) => match message["params"]["item"]["type"].as_str() {
                Some(item) => format!("{method} {item}"),
                None => method.to_string(),
            },
            None => {
                let to = asked
                    .get(&message["id"].to_string())
                    .cloned()
                    .unwrap_or_default();
                let outcome = if message.get("error").is_some() {
                    "error"
                } else {
                    "result"
                };
                format!("{outcome} of {to}")
            }
        };
        let delta = kind.to_ascii_lowercase().contains("delta");
        if !(delta && kinds.last() == Some(&kind)) {
            kinds.push(kind);
        }
    }
    kinds
}

/// The answers to requests (sorted), and the other messages in their order.
fn split_answers(kinds: Vec<String>) -> (Vec<String>, Vec<String>) {
    let (mut answers, others): (Vec<String>, Vec<String>) = kinds
        .into_iter()
        .partition(|k| k.starts_with("result of ") || k.starts_with("error of "));
    answers.sort();
    (answers, others)
}

/// How many token-usage updates, and the other messages in their order.
fn split_usage(kinds: Vec<String>) -> (usize, Vec<String>) {
    let (usage, others): (Vec<String>, Vec<String>) = kinds
        .into_iter()
        .partition(|k| k == "thread/tokenUsage/updated");
    (usage.len(), others)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/codex/{name}.jsonl"))
}

/// Records the scenario, or checks it against the committed record.
fn check(name: &str, log: Vec<Value>) {
    let path = fixture(name);
    if std::env::var_os("ABX_CODEX_RECAPTURE").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let text: String = log.iter().map(|entry| format!("{entry}\n")).collect();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let committed: Vec<Value> = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // An answer to a request and the notifications codex sends meanwhile come from
    // different tasks of codex: on a loaded machine an answer may come a notification
    // later. The notifications keep their order; each answer is compared as a set.
    let (live_answers, live) = split_answers(shape(&log));
    let (kept_answers, kept) = split_answers(shape(&committed));
    // Token usage comes from the model stream's task, which codex may still be reading
    // while the tool call it streamed already runs: a usage update can come before or
    // after the command's items (seen once in a full run: before
    // `item/completed commandExecution`). Its count is compared, not its place.
    let (live_usage, live) = split_usage(live);
    let (kept_usage, kept) = split_usage(kept);
    assert_eq!(
        live_usage,
        kept_usage,
        "the pinned codex no longer reports token usage as {} says",
        path.display()
    );
    assert_eq!(
        live_answers,
        kept_answers,
        "the pinned codex no longer answers as {} says",
        path.display()
    );
    assert_eq!(
        live,
        kept,
        "the pinned codex no longer says what {} says; if the change is expected, \
         rewrite the fixtures with ABX_CODEX_RECAPTURE=1 cargo test --test it codex_app_server \
         and check the mapping tests (cargo test --lib codex_map)",
        path.display()
    );
}

#[test]
fn text_answers_in_two_turns() {
    check("text", capture(&["SAY hello there", "SAY again"], false));
}

#[test]
fn a_shell_command() {
    check(
        "shell",
        capture(
            &["SHELL printf 'one\\n'; sleep 0.5; printf 'two\\n'"],
            false,
        ),
    );
}

#[test]
fn a_dynamic_tool_call() {
    check(
        "tool",
        capture(&[r#"CALL lookup_weather {"city":"Paris"}"#], false),
    );
}

#[test]
fn a_reasoning_summary() {
    check("reason", capture(&["REASON checking the sky"], false));
}

#[test]
fn an_interrupted_turn() {
    check("interrupt", capture(&["SLOW thinking hard"], true));
}

#[test]
fn an_upstream_failure() {
    check("fail", capture(&["FAIL"], false));
}
