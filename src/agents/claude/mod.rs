//! Claude Code (`@anthropic-ai/claude-code`), the third runtime: how its CLI is started
//! headless and what it needs around it. [`lines`] reads what one `/v1` turn prints;
//! [`thread`] makes one long-lived CLI serve an Agents API session as a codex thread;
//! [`relay`] keeps the model API's key on the server's side.
//!
//! Facts this rests on (the CLI's behaviour is the spec; `docs/agents.md` has the
//! rest):
//!
//! - **Headless.** `claude -p --output-format stream-json --verbose` prints one JSON
//!   object per line; `--include-partial-messages` adds the model's raw stream events,
//!   which is where text deltas come from. The prompt goes to stdin, never argv.
//! - **Sessions.** The CLI keeps a session as a file under its config directory, found
//!   by id: `--session-id <uuid>` names a new one, `--resume <uuid>` continues it. Each
//!   CLI session gets a config directory of its own (`CLAUDE_CONFIG_DIR`), under the
//!   server's state directory, so nothing of one session (its history, shell
//!   snapshots, settings) is in another's reach, and the id alone finds it again.
//! - **No provider by accident.** With only `ANTHROPIC_BASE_URL` set the CLI still calls
//!   Anthropic's hosts (feature flags, a directory, telemetry);
//!   `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` is what stops that, so every CLI the
//!   server starts gets it, whatever the environment says ([`ENV`]).
//! - **Permissions.** Headless, the CLI's default mode refuses the model's commands
//!   (nobody is there to approve), and as root it refuses to skip permissions unless
//!   `IS_SANDBOX=1` says it runs in a sandbox. The container *is* the sandbox, as for
//!   codex's `--dangerously-bypass-approvals-and-sandbox`: the server says so
//!   deliberately, and runs the CLI in `bypassPermissions` mode.

pub mod lines;
pub mod relay;
pub mod thread;

use std::path::{Path, PathBuf};

use super::runtime::TurnSession;

/// Set on every Claude Code process the server starts, over the environment's values.
pub const ENV: [(&str, &str); 5] = [
    // The one that matters: no flags, directory, telemetry or error-report calls.
    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ("DISABLE_AUTOUPDATER", "1"),
    ("DISABLE_TELEMETRY", "1"),
    ("DISABLE_ERROR_REPORTING", "1"),
    // The container is the sandbox: bypassPermissions is allowed as root.
    ("IS_SANDBOX", "1"),
];

/// The argv of one `/v1` turn (the program's path replaces `claude`).
pub fn turn_argv(session: TurnSession<'_>, model: Option<&str>) -> Vec<String> {
    let mut argv: Vec<String> = [
        "claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--include-partial-messages",
        "--permission-mode",
        "bypassPermissions",
    ]
    .map(String::from)
    .into();
    match session {
        TurnSession::Resume(id) => argv.extend(["--resume".to_string(), id.to_string()]),
        TurnSession::Named(id) => argv.extend(["--session-id".to_string(), id.to_string()]),
        TurnSession::New => {}
    }
    if let Some(model) = model {
        // One word: a model that starts with `-` cannot become an option.
        argv.push(format!("--model={model}"));
    }
    argv
}

/// The arguments (after the program) of the long-lived CLI of an Agents API session
/// ([`thread`]): stream-json both ways, each input echoed when taken up.
pub fn session_args(
    session: TurnSession<'_>,
    model: Option<&str>,
    instructions: Option<&str>,
) -> Vec<String> {
    let mut argv = turn_argv(session, model);
    argv.remove(0);
    let at = argv
        .iter()
        .position(|a| a == "--permission-mode")
        .unwrap_or(0);
    argv.splice(
        at..at,
        ["--input-format", "stream-json", "--replay-user-messages"].map(String::from),
    );
    if let Some(instructions) = instructions.filter(|i| !i.is_empty()) {
        argv.push(format!("--append-system-prompt={instructions}"));
    }
    argv
}

/// The CLI model a session agent's `model` names: `claude-code/<model>` passes
/// `<model>`, `claude-code` (or an alias) the CLI's default.
pub fn agent_model(model: &str) -> Option<&str> {
    model
        .split_once('/')
        .map(|(_, m)| m)
        .filter(|m| !m.is_empty())
}

/// A new session id: a random (version 4) UUID, the form the CLI requires.
pub fn new_session_id() -> String {
    let mut bytes = [0u8; 16];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Whether `id` has the form of a session id (so it can name a directory).
pub fn is_session_id(id: &str) -> bool {
    id.len() == 36
        && id.char_indices().all(|(i, c)| {
            matches!(i, 8 | 13 | 18 | 23) == (c == '-') && (c == '-' || c.is_ascii_hexdigit())
        })
}

/// The config directory of CLI session `id` under `home` (the server's
/// `<ABX_STATE_DIR>/claude-code`, see [`config_root`]); `None` for an id that is not a
/// session id.
pub fn config_dir(home: &Path, id: &str) -> Option<PathBuf> {
    is_session_id(id).then(|| config_root(home).join(id))
}

/// Where the config directories go: `home` (under the state directory, which only the
/// server's user can enter), or, when children run as another user (`ABX_CHILD_USER`),
/// a directory of that user's, `/tmp/agent-sandbox-claude-code-<uid>`: the CLI must
/// write its directory, and opening the state directory to that user would open the
/// store too. Every command of the sandbox runs as that user then, so a session's
/// directory is no more private than its files are.
pub fn config_root(home: &Path) -> PathBuf {
    match crate::process::spawn::child_user() {
        None => home.to_path_buf(),
        Some((uid, _)) => PathBuf::from(format!("/tmp/agent-sandbox-claude-code-{uid}")),
    }
}

/// Makes the config directory `dir` (blocking), owned by the children's user when
/// `ABX_CHILD_USER` sets one. A root in `/tmp` that is a link, not a directory, or
/// another user's is refused: nobody can make the server hand a directory elsewhere to
/// the CLI.
fn make_config_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let Some((uid, gid)) = crate::process::spawn::child_user() else {
        return std::fs::create_dir_all(dir);
    };
    let root = dir.parent().unwrap_or(dir);
    match std::fs::DirBuilder::new().mode(0o700).create(root) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let meta = std::fs::symlink_metadata(root)?;
    if !meta.file_type().is_dir() || (meta.uid() != uid && meta.uid() != 0) {
        return Err(std::io::Error::other(format!(
            "{} is not a directory of the children's user",
            root.display()
        )));
    }
    let own = |path: &Path| {
        rustix::fs::chownat(
            rustix::fs::CWD,
            path,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
    };
    own(root)?;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    own(dir)?;
    Ok(())
}

/// Claude Code's environment: [`ENV`] over the children's, and the config directory of
/// CLI session `id` under `home`, made now (on the pool).
pub async fn environment(
    home: &Path,
    id: &str,
    env: &mut Vec<(std::ffi::OsString, std::ffi::OsString)>,
) -> Result<(), super::AgentError> {
    let Some(dir) = config_dir(home, id) else {
        return Err(super::AgentError::Failed(format!(
            "'{id}' is not a Claude Code session id"
        )));
    };
    let made = dir.clone();
    crate::runtime::file::blocking(move || make_config_dir(&made))
        .await
        .and_then(|r| r)
        .map_err(|e| {
            super::AgentError::Failed(format!(
                "Claude Code's config directory {} cannot be made: {e}",
                dir.display()
            ))
        })?;
    let mut set = |name: &str, value: std::ffi::OsString| {
        env.retain(|(k, _)| k != name);
        env.push((name.into(), value));
    };
    for (name, value) in ENV {
        set(name, value.into());
    }
    set("CLAUDE_CONFIG_DIR", dir.into_os_string());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_uuids_and_name_their_own_directory() {
        let id = new_session_id();
        assert!(is_session_id(&id), "{id}");
        assert_eq!(&id[14..15], "4");
        assert_ne!(id, new_session_id());
        for bad in [
            "../../etc",
            "",
            "908d94dd-c6ac-4df4-b681-fc37b182faa",
            "908d94dd/c6ac-4df4-b681-fc37b182faa9",
        ] {
            assert!(config_dir(Path::new("/s"), bad).is_none(), "{bad}");
        }
        assert_eq!(
            config_dir(Path::new("/s"), "908d94dd-c6ac-4df4-b681-fc37b182faa9").unwrap(),
            Path::new("/s/908d94dd-c6ac-4df4-b681-fc37b182faa9")
        );
    }

    #[test]
    fn turns_name_or_resume_their_session_and_read_stdin() {
        let fresh = turn_argv(TurnSession::Named("S"), Some("opus"));
        assert_eq!(fresh[..2], ["claude", "-p"]);
        assert!(fresh.windows(2).any(|w| w == ["--session-id", "S"]));
        assert!(fresh
            .windows(2)
            .any(|w| w == ["--permission-mode", "bypassPermissions"]));
        assert_eq!(fresh.last().unwrap(), "--model=opus");
        let session = session_args(TurnSession::Resume("S"), None, Some("-Be brief"));
        assert!(session
            .windows(2)
            .any(|w| w == ["--input-format", "stream-json"]));
        assert!(session.contains(&"--replay-user-messages".to_string()));
        assert_eq!(session.last().unwrap(), "--append-system-prompt=-Be brief");
        assert_eq!(agent_model("claude-code/opus"), Some("opus"));
        assert_eq!(agent_model("claude-code"), None);
        let next = turn_argv(TurnSession::Resume("S"), None);
        assert!(next.windows(2).any(|w| w == ["--resume", "S"]));
        assert!(!next.iter().any(|a| a == "--session-id"));
    }
}
