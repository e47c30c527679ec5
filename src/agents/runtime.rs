//! The declared runtimes and their CLIs: how each is found, pinned, started for a turn
//! and read, and the CLI session a next turn resumes.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::events::{parse_codex, parse_qwen, AgentEvent};
use crate::process::{spawn, Child, ChildRegistry, Spawn};

/// How long `--version` of a CLI may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(15);

/// A declared agent runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    Codex,
    QwenCode,
    ClaudeCode,
    Cursor,
    Command,
}

/// `src/pins.env`: the one place the pinned versions are written (the tests' installer,
/// `scripts/tools`, reads the same file).
const PINS: &str = include_str!("../pins.env");

/// The value of `key` in `src/pins.env`. A missing key is a build defect the unit test
/// below catches, so it panics rather than inventing a version.
pub fn pin(key: &str) -> &'static str {
    PINS.lines()
        .filter_map(|line| line.split_once('='))
        .find(|(name, _)| name.trim() == key)
        .map(|(_, value)| value.trim())
        .unwrap_or_else(|| panic!("src/pins.env names no {key}"))
}

/// What the pinned CLIs need to run: "Node.js 22 or later" (their `engines`).
pub fn node_requirement() -> String {
    format!("Node.js {} or later", pin("NODE_MINIMUM_MAJOR"))
}

/// How a runtime's CLI is found and installed.
pub struct Cli {
    /// The program on `PATH`.
    pub program: &'static str,
    /// The npm package and the version the tests run.
    pub package: &'static str,
    pub version: &'static str,
}

impl Runtime {
    /// Every declared runtime, in the order `/v1/agents/runtimes` lists them (the
    /// reference's).
    pub const ALL: [Runtime; 5] = [
        Runtime::Codex,
        Runtime::QwenCode,
        Runtime::ClaudeCode,
        Runtime::Command,
        Runtime::Cursor,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Runtime::Codex => "codex",
            Runtime::QwenCode => "qwen-code",
            Runtime::ClaudeCode => "claude-code",
            Runtime::Cursor => "cursor",
            Runtime::Command => "command",
        }
    }

    /// The other names each runtime answers to: the reference's, so a template that
    /// selects `openai-codex` or `claude_code` there selects the same runtime here.
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            Runtime::Codex => &["openai-codex"],
            Runtime::QwenCode => &["qwen", "qwen_code", "qwencode"],
            Runtime::ClaudeCode => &["claude", "claude_code", "claudecode"],
            Runtime::Cursor => &["cursor-agent", "cursor_agent"],
            Runtime::Command => &["custom"],
        }
    }

    /// The program the runtime runs (declared ones too), as the reference names it.
    pub fn binary(self) -> Option<&'static str> {
        match self {
            Runtime::Codex => Some("codex"),
            Runtime::QwenCode => Some("qwen"),
            Runtime::ClaudeCode => Some("claude"),
            Runtime::Cursor => Some("cursor-agent"),
            Runtime::Command => None,
        }
    }

    /// Whether the reference calls the adapter experimental.
    pub fn experimental(self) -> bool {
        matches!(self, Runtime::QwenCode | Runtime::Cursor)
    }

    /// The runtime a name or alias selects (case-insensitive).
    pub fn parse(name: &str) -> Option<Runtime> {
        let name = name.trim().to_ascii_lowercase();
        Runtime::ALL
            .into_iter()
            .find(|r| r.name() == name || r.aliases().contains(&name.as_str()))
    }

    /// Whether this build has a local backend for it.
    pub fn implemented(self) -> bool {
        matches!(
            self,
            Runtime::Codex | Runtime::QwenCode | Runtime::ClaudeCode
        )
    }

    /// The CLI of an implemented runtime.
    pub fn cli(self) -> Option<Cli> {
        match self {
            Runtime::Codex => Some(Cli {
                program: "codex",
                package: "@openai/codex",
                version: pin("CODEX_VERSION"),
            }),
            Runtime::QwenCode => Some(Cli {
                program: "qwen",
                package: "@qwen-code/qwen-code",
                version: pin("QWEN_CODE_VERSION"),
            }),
            Runtime::ClaudeCode => Some(Cli {
                program: "claude",
                package: "@anthropic-ai/claude-code",
                version: pin("CLAUDE_CODE_VERSION"),
            }),
            _ => None,
        }
    }

    /// The command that installs the CLI at the pinned version.
    pub fn install_command(self) -> Option<String> {
        self.cli()
            .map(|cli| format!("npm install -g {}@{}", cli.package, cli.version))
    }

    /// Whether the server names a new CLI session itself ([`TurnSession::Named`]): Claude
    /// Code's state directory is per session, so its id must be known before the CLI
    /// starts.
    pub fn names_new_sessions(self) -> bool {
        self == Runtime::ClaudeCode
    }

    /// The argv of one turn: a new session, or `resume` of the CLI's own session id.
    /// The prompt goes to stdin.
    pub fn turn_argv(self, session: TurnSession<'_>, model: Option<&str>) -> Vec<String> {
        let resume = match session {
            TurnSession::Resume(id) => Some(id),
            TurnSession::New | TurnSession::Named(_) => None,
        };
        // `--model=VALUE` in one word: a model that starts with `-` cannot become an
        // option of the CLI.
        let mut argv: Vec<String> = Vec::new();
        match self {
            Runtime::Codex => {
                argv.extend(["codex", "exec"].map(String::from));
                if let Some(thread) = resume {
                    argv.extend(["resume".to_string(), thread.to_string()]);
                }
                // The container is the sandbox: codex's own (landlock, seccomp) would
                // stop the commands a caller asked for, and nobody is there to approve.
                argv.extend(
                    [
                        "--json",
                        "--skip-git-repo-check",
                        "--dangerously-bypass-approvals-and-sandbox",
                    ]
                    .map(String::from),
                );
                if let Some(model) = model {
                    argv.push(format!("--model={model}"));
                }
                argv.push("-".into());
            }
            Runtime::QwenCode => {
                argv.extend(
                    [
                        "qwen",
                        "--output-format",
                        "stream-json",
                        "--approval-mode",
                        "yolo",
                    ]
                    .map(String::from),
                );
                if let Some(session) = resume {
                    argv.extend(["--resume".to_string(), session.to_string()]);
                }
                if let Some(model) = model {
                    argv.push(format!("--model={model}"));
                }
            }
            Runtime::ClaudeCode => {
                argv = super::claude::turn_argv(session, model);
            }
            _ => {}
        }
        argv
    }

    /// Where the CLI is on the children's `PATH`, if anywhere. Blocking (stats): call it
    /// on the pool.
    pub fn find_cli(self, env: &[(OsString, OsString)]) -> Option<PathBuf> {
        let cli = self.cli()?;
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone());
        let root = rustix::fs::open(
            "/",
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok()?;
        spawn::find_program(
            cli.program,
            path.as_deref(),
            std::os::fd::AsFd::as_fd(&root),
        )
        .ok()
    }

    /// Reads one line of the CLI's stdout.
    pub fn parse_line(self, line: &str) -> Vec<AgentEvent> {
        match self {
            Runtime::Codex => parse_codex(line),
            Runtime::QwenCode => parse_qwen(line),
            _ => Vec::new(),
        }
    }

    /// What reads this runtime's output, line by line (some formats need state: a
    /// Claude Code command's output comes lines after the command).
    pub fn reader(self) -> LineReader {
        match self {
            Runtime::ClaudeCode => LineReader::Claude(Box::default()),
            other => LineReader::Stateless(other),
        }
    }
}

/// Reads a CLI's stdout, line by line, into [`AgentEvent`]s.
pub enum LineReader {
    Stateless(Runtime),
    Claude(Box<super::claude::lines::ClaudeLines>),
}

impl LineReader {
    pub fn line(&mut self, line: &str) -> Vec<AgentEvent> {
        match self {
            LineReader::Stateless(runtime) => runtime.parse_line(line),
            LineReader::Claude(reader) => reader.line(line),
        }
    }
}

/// Which CLI session a turn runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnSession<'a> {
    /// A new one, named by the CLI.
    New,
    /// A new one with this id ([`Runtime::names_new_sessions`]).
    Named(&'a str),
    /// The CLI's session with this id, continued.
    Resume(&'a str),
}

/// `--version` of each CLI path, once per server.
fn versions() -> &'static Mutex<Vec<(PathBuf, String)>> {
    static VERSIONS: OnceLock<Mutex<Vec<(PathBuf, String)>>> = OnceLock::new();
    VERSIONS.get_or_init(Mutex::default)
}

/// The version a CLI prints (`codex-cli 0.169.0` is `0.169.0`), asked once per path.
pub async fn cli_version(
    program: &Path,
    cwd: std::os::fd::OwnedFd,
    env: Vec<(OsString, OsString)>,
    children: &Arc<ChildRegistry>,
) -> Option<String> {
    if let Some((_, v)) = versions().lock().ok()?.iter().find(|(p, _)| p == program) {
        return Some(v.clone());
    }
    let spec = Spawn {
        user: None,
        argv: vec![program.display().to_string(), "--version".into()],
        cwd,
        env,
        stdin: false,
        capture: true,
        terminal: None,
    };
    let child = Child::spawn(spec, children).await.ok()?;
    let done = match crate::process::run::run_to_end(child, VERSION_TIMEOUT, 64 * 1024)
        .await
        .ok()?
    {
        crate::process::run::RunEnd::Completed(done) => done,
        crate::process::run::RunEnd::TimedOut => return None,
    };
    let version = done
        .stdout
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))?
        .to_string();
    if let Ok(mut cache) = versions().lock() {
        cache.push((program.to_path_buf(), version.clone()));
    }
    Some(version)
}

/// A CLI's own session, which the next turn resumes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub runtime: Runtime,
    pub id: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::events::{Item, Usage};

    #[test]
    fn names_and_aliases_select_runtimes() {
        assert_eq!(Runtime::parse("qwen"), Some(Runtime::QwenCode));
        assert_eq!(Runtime::parse("QwenCode"), Some(Runtime::QwenCode));
        assert_eq!(Runtime::parse("codex"), Some(Runtime::Codex));
        assert_eq!(Runtime::parse("claude-code"), Some(Runtime::ClaudeCode));
        assert_eq!(Runtime::parse("gpt-5"), None);
        // The reference's aliases.
        assert_eq!(Runtime::parse("openai-codex"), Some(Runtime::Codex));
        assert_eq!(Runtime::parse("qwen_code"), Some(Runtime::QwenCode));
        assert_eq!(Runtime::parse("claude"), Some(Runtime::ClaudeCode));
        assert_eq!(Runtime::parse("cursor-agent"), Some(Runtime::Cursor));
        assert_eq!(Runtime::parse("custom"), Some(Runtime::Command));
        assert!(!Runtime::Cursor.implemented());
        assert_eq!(
            Runtime::Codex.install_command().unwrap(),
            format!("npm install -g @openai/codex@{}", pin("CODEX_VERSION"))
        );
    }

    #[test]
    fn every_pin_the_server_reads_is_written() {
        for key in [
            "CODEX_VERSION",
            "QWEN_CODE_VERSION",
            "CLAUDE_CODE_VERSION",
            "NODE_MINIMUM_MAJOR",
        ] {
            assert!(!pin(key).is_empty(), "{key}");
        }
        assert!(pin("CODEX_VERSION")
            .split('.')
            .all(|n| n.parse::<u32>().is_ok()));
        assert_eq!(
            node_requirement(),
            format!("Node.js {} or later", pin("NODE_MINIMUM_MAJOR"))
        );
    }

    #[test]
    fn codex_turns_start_or_resume() {
        let fresh = Runtime::Codex.turn_argv(TurnSession::New, Some("gpt-5"));
        assert_eq!(fresh[..3], ["codex", "exec", "--json"]);
        assert!(fresh.ends_with(&["--model=gpt-5".into(), "-".into()]));
        let next = Runtime::Codex.turn_argv(TurnSession::Resume("T1"), None);
        assert_eq!(next[..4], ["codex", "exec", "resume", "T1"]);
        let qwen = Runtime::QwenCode.turn_argv(TurnSession::Resume("S1"), None);
        assert!(qwen.windows(2).any(|w| w == ["--resume", "S1"]));
    }

    #[test]
    fn codex_lines_become_events() {
        let events: Vec<AgentEvent> = [
            r#"{"type":"thread.started","thread_id":"T1"}"#,
            r#"{"type":"turn.started"}"#,
            r#"{"type":"item.completed","item":{"id":"item_0","type":"command_execution","command":"bash -lc 'echo hi'","aggregated_output":"hi\n","exit_code":0,"status":"completed"}}"#,
            r#"{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"Done."}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":10,"cached_input_tokens":2,"output_tokens":3,"reasoning_output_tokens":1}}"#,
            "not json",
        ]
        .iter()
        .flat_map(|l| Runtime::Codex.parse_line(l))
        .collect();
        assert_eq!(
            events,
            vec![
                AgentEvent::Session("T1".into()),
                AgentEvent::Item(Item::Shell {
                    command: "bash -lc 'echo hi'".into(),
                    output: "hi\n".into(),
                    exit_code: Some(0)
                }),
                AgentEvent::Item(Item::Message {
                    text: "Done.".into()
                }),
                AgentEvent::Completed(Usage {
                    input_tokens: 10,
                    cached_tokens: 2,
                    output_tokens: 3,
                    reasoning_tokens: 1
                }),
            ]
        );
        assert_eq!(
            Runtime::Codex
                .parse_line(r#"{"type":"turn.failed","error":{"message":"upstream 500"}}"#),
            vec![AgentEvent::Failed("upstream 500".into())]
        );
    }

    #[test]
    fn qwen_lines_become_events() {
        let init = r#"{"type":"system","subtype":"init","session_id":"S1","cwd":"/x"}"#;
        let said = r#"{"type":"assistant","session_id":"S1","message":{"content":[{"type":"text","text":"Hi"},{"type":"tool_use","name":"run_shell_command","input":{"command":"ls"}}]}}"#;
        let done = r#"{"type":"result","subtype":"success","is_error":false,"result":"Hi","usage":{"input_tokens":7,"output_tokens":4}}"#;
        let failed = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"error":{"message":"500 upstream"}}"#;
        assert_eq!(
            Runtime::QwenCode.parse_line(init),
            vec![AgentEvent::Session("S1".into())]
        );
        assert_eq!(
            Runtime::QwenCode.parse_line(said),
            vec![
                AgentEvent::Item(Item::Message { text: "Hi".into() }),
                AgentEvent::Item(Item::ToolCall {
                    name: "run_shell_command".into(),
                    arguments: r#"{"command":"ls"}"#.into()
                })
            ]
        );
        assert_eq!(
            Runtime::QwenCode.parse_line(done),
            vec![AgentEvent::Completed(Usage {
                input_tokens: 7,
                output_tokens: 4,
                ..Usage::default()
            })]
        );
        assert_eq!(
            Runtime::QwenCode.parse_line(failed),
            vec![AgentEvent::Failed("500 upstream".into())]
        );
    }
}
