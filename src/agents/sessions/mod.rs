//! Sessions of OpenAI's Agents API (beta) on codex: a session is one codex thread in this
//! sandbox, run by `codex app-server`. What it keeps ([`records`]), what its inputs may
//! be ([`inputs`]), how its events reach every open stream ([`channel`]), the actor that
//! drives its thread ([`live`]), and what a turn publishes ([`outputs`]: artifacts;
//! [`trace`]: its OTLP trace).
//!
//! The session's status is the store's: every change of it is committed before the
//! event that announces it is published, so `GET …/sessions/{id}` never disagrees with
//! a stream that has already said more. Running sessions have an actor on the worker
//! that started them (its app-server's pipes are awaited on that worker's driver);
//! requests on other workers reach it through a thread-safe command queue.

pub mod channel;
pub mod inputs;
pub mod live;
pub mod outputs;
pub mod records;
pub mod relay;
pub mod trace;

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::error::AgentError;
use super::objects::now_unix;
use super::records::{new_id, ListQuery, Order, Scope, StoreError, Transaction};
use super::saved::{AgentConfig, AgentPatch};
use super::seal;
use super::surface::Agents;
use records::{Session, Status};

/// A session about to be created, its fields checked.
pub struct NewSession {
    pub config: AgentConfig,
    /// The saved agent's id (or a fresh one for an inline agent).
    pub agent_id: String,
    pub environment: Value,
    pub workspace: Option<String>,
    pub metadata: Value,
    pub vault_ids: Vec<String>,
    pub review: Option<String>,
    pub prompt_cache_options: Option<Value>,
    pub spend_control: Option<Value>,
}

/// Creates the session record.
pub async fn create(
    agents: &Arc<Agents>,
    owner: &str,
    new: NewSession,
) -> Result<Session, AgentError> {
    let now = now_unix();
    let id = new_id("sess_");
    let mut session = Session {
        agent: new.config.snapshot(&new.agent_id),
        config: String::new(),
        id,
        created_at: now,
        last_active_at: now,
        environment: new.environment,
        workspace: new.workspace,
        metadata: new.metadata,
        vault_ids: new.vault_ids,
        status: Status::Idle,
        error: None,
        required_actions: Vec::new(),
        usage: None,
        review: new.review,
        prompt_cache_options: new.prompt_cache_options,
        spend_control: new.spend_control,
        thread_id: None,
        active_turn: None,
        idempotency: Vec::new(),
        pending_keys: Vec::new(),
        turns: 0,
    };
    let (key, id) = (owner.to_string(), session.id.clone());
    // Sealed on the blocking pool: the first seal may read the key file.
    let session = agents
        .transact(move |t| {
            session.config = seal_config(&session.id, &new.config)?;
            t.create(Scope::owner(&key), session.clone())
                .map_err(AgentError::store("session", &id, "session_id"))?;
            Ok::<_, AgentError>(session)
        })
        .await?;
    let data = super::webhooks::session_data(&session.id, session.environment["id"].as_str());
    super::webhooks::emit(agents, owner, "agent.session.created", data).await;
    Ok(session)
}

/// Changes a session's `metadata`, `review`, `prompt_cache_options`, `spend_control`
/// or its agent's `model`, `reasoning`, `service_tier` or `tools` (what the next turn
/// uses). `agent` is already checked.
pub async fn update(
    agents: &Arc<Agents>,
    owner: &str,
    id: &str,
    changes: Map<String, Value>,
    agent: Option<AgentPatch>,
) -> Result<Session, AgentError> {
    let (owner, key) = (owner.to_string(), id.to_string());
    agents
        .transact(move |t| {
            let scope = Scope::owner(&owner);
            let mut session: Session = t
                .get(scope, &key)
                .map_err(AgentError::store("session", &key, "session_id"))?;
            if let Some(patch) = agent {
                if patch.tools.is_some() && session.thread_id.is_some() {
                    return Err(AgentError::invalid(
                        "agent.tools",
                        "This session's codex thread has started, and codex fixes a thread's tools when it starts: create a new session with these tools.",
                    ));
                }
                let config = open_config(&session)?.overridden(patch);
                let value = serde_json::to_value(&config)
                    .map_err(|e| AgentError::Failed(e.to_string()))?;
                check_runtime(&value, Some(runtime_of(&session.agent)))?;
                super::vaults::check_mcp_credentials(
                    t,
                    &owner,
                    &session.vault_ids,
                    &config.tools,
                    "agent.tools",
                )?;
                let agent_id = session.agent["id"].as_str().unwrap_or_default().to_string();
                session.agent = config.snapshot(&agent_id);
                session.config = seal_config(&session.id, &config)?;
            }
            for (key, value) in changes {
                match key.as_str() {
                    "metadata" => session.metadata = value,
                    "review" => session.review = value.as_str().map(str::to_string),
                    "prompt_cache_options" => session.prompt_cache_options = Some(value).filter(|v| !v.is_null()),
                    "spend_control" => session.spend_control = Some(value).filter(|v| !v.is_null()),
                    _ => {}
                }
            }
            session.last_active_at = now_unix();
            t.put(scope, session.clone())
                .map_err(AgentError::store("session", &key, "session_id"))?;
            Ok(session)
        })
        .await
}

fn binding(session: &str) -> String {
    format!("session:{session}:config")
}

fn seal_config(session: &str, config: &AgentConfig) -> Result<String, AgentError> {
    let value = serde_json::to_value(config).map_err(|e| AgentError::Failed(e.to_string()))?;
    seal::seal_json(&binding(session), &value).map_err(|e| {
        AgentError::Failed(format!(
            "The session's configuration cannot be sealed: {}",
            e.0
        ))
    })
}

/// The session's whole agent configuration.
pub fn open_config(session: &Session) -> Result<AgentConfig, AgentError> {
    let value = seal::open_json(&binding(&session.id), &session.config).map_err(|e| {
        AgentError::Failed(format!(
            "The session's configuration cannot be opened: {}",
            e.0
        ))
    })?;
    serde_json::from_value(value).map_err(|e| AgentError::Failed(e.to_string()))
}

/// Forgets a session and everything it holds; a session running a turn is refused (the
/// SDK: "Running execution must be cancelled first").
pub async fn delete(agents: &Arc<Agents>, owner: &str, id: &str) -> Result<Session, AgentError> {
    let (owner, key) = (owner.to_string(), id.to_string());
    agents
        .transact(move |t| {
            let scope = Scope::owner(&owner);
            let session: Session =
                t.get(scope, &key)
                    .map_err(AgentError::store("session", &key, "session_id"))?;
            if session.active_turn.is_some() {
                return Err(AgentError::Busy {
                    id: key.clone(),
                    param: "session_id",
                });
            }
            t.delete::<Session>(scope, &key).map_err(AgentError::store(
                "session",
                &key,
                "session_id",
            ))?;
            Ok(session)
        })
        .await
}

/// What a deleted session leaves on disk, removed: its scratch directory (a session
/// without a workspace ran there) and codex's rollout files of its thread under
/// `codex_home/sessions` (`rollout-<time>-<thread id>.jsonl`), so a deleted session's
/// conversation is gone from the machine too. Runs on the blocking pool; what cannot be
/// removed is logged, not answered (the session is deleted either way).
pub async fn remove_leftovers(
    scratch: PathBuf,
    codex_home: Option<PathBuf>,
    thread: Option<String>,
) {
    remove_dirs_and_rollouts(vec![scratch], codex_home, thread).await
}

/// [`remove_leftovers`] of a claude-code session: its scratch directory and its CLI
/// session's config directory (its history, shell snapshots, settings).
pub async fn remove_claude_leftovers(scratch: PathBuf, config: Option<PathBuf>) {
    let dirs = std::iter::once(scratch).chain(config).collect();
    remove_dirs_and_rollouts(dirs, None, None).await
}

async fn remove_dirs_and_rollouts(
    dirs: Vec<PathBuf>,
    codex_home: Option<PathBuf>,
    thread: Option<String>,
) {
    let removed = crate::runtime::file::blocking(move || {
        let mut failures = Vec::new();
        for dir in dirs {
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    failures.push(format!("{}: {e}", dir.display()))
                }
                _ => {}
            }
        }
        if let (Some(home), Some(thread)) = (codex_home, thread) {
            let suffix = format!("-{thread}.jsonl");
            let mut dirs = vec![home.join("sessions")];
            // Years, months, days: a few levels, walked without following links.
            while let Some(dir) = dirs.pop() {
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    let Ok(kind) = entry.file_type() else {
                        continue;
                    };
                    let name = entry.file_name();
                    let name = name.to_string_lossy();
                    if kind.is_dir() {
                        dirs.push(entry.path());
                    } else if kind.is_file()
                        && name.starts_with("rollout-")
                        && name.ends_with(&suffix)
                    {
                        if let Err(e) = std::fs::remove_file(entry.path()) {
                            failures.push(format!("{}: {e}", entry.path().display()));
                        }
                    }
                }
            }
        }
        failures
    })
    .await;
    for failure in removed.unwrap_or_default() {
        crate::log::line(format_args!(
            "a deleted session's leftover was not removed: {failure}"
        ));
    }
}

/// Which sessions a list shows.
pub struct SessionFilter {
    pub agent_id: Option<String>,
    pub metadata: Vec<(String, String)>,
}

impl SessionFilter {
    fn admits(&self, session: &Session) -> bool {
        self.agent_id
            .as_deref()
            .is_none_or(|id| session.agent["id"].as_str() == Some(id))
            && self
                .metadata
                .iter()
                .all(|(k, v)| session.metadata[k].as_str() == Some(v))
    }
}

/// A page of the caller's sessions that `filter` admits: the store is read a page at a
/// time until `limit` are found (or it ends).
pub async fn list(
    agents: &Arc<Agents>,
    owner: &str,
    after: Option<String>,
    limit: usize,
    order: Order,
    filter: SessionFilter,
) -> Result<(Vec<Session>, bool), AgentError> {
    let owner = owner.to_string();
    agents
        .transact(move |t| {
            let mut found = Vec::new();
            let mut cursor = after;
            loop {
                let query = ListQuery {
                    after: cursor.as_deref(),
                    limit: 100,
                    order,
                };
                let page =
                    t.list::<Session>(Scope::owner(&owner), &query)
                        .map_err(|e| match e {
                            StoreError::UnknownCursor => AgentError::invalid(
                                "after",
                                format!(
                                    "No session '{}' in this list.",
                                    cursor.as_deref().unwrap_or("")
                                ),
                            ),
                            e => AgentError::from(e),
                        })?;
                let more = page.has_more;
                cursor = page.last_id.clone();
                for session in page.data {
                    if filter.admits(&session) {
                        if found.len() == limit {
                            return Ok((found, true));
                        }
                        found.push(session);
                    }
                }
                if !more {
                    return Ok((found, false));
                }
            }
        })
        .await
}

/// The runtime a session's agent runs on: a `model` that names claude-code (`claude-code`
/// or `claude-code/<model>`, or an alias) runs on Claude Code, anything else on codex
/// (whose model it is).
pub fn runtime_of(agent: &serde_json::Value) -> crate::agents::Runtime {
    use crate::agents::Runtime;
    let model = agent["model"].as_str().unwrap_or_default();
    let named = model.split_once('/').map_or(model, |(runtime, _)| runtime);
    match Runtime::parse(named) {
        Some(Runtime::ClaudeCode) => Runtime::ClaudeCode,
        _ => Runtime::Codex,
    }
}

/// What a claude-code session cannot honour, as the 400 naming it: Claude Code runs its
/// own tools (Bash, file edits) and takes no function, MCP or hosted tools from the
/// Agents API here, nor a reasoning effort, a service tier or codex's sub-agents.
/// `agent` is the serialised `AgentConfig`; a session's runtime is fixed when it is
/// created (`was`: the runtime before an update).
pub fn check_runtime(
    agent: &serde_json::Value,
    was: Option<crate::agents::Runtime>,
) -> Result<(), AgentError> {
    use crate::agents::Runtime;
    let runtime = runtime_of(agent);
    let model = agent["model"].as_str().unwrap_or_default();
    let named = model.split_once('/').map_or(model, |(runtime, _)| runtime);
    if let Some(other) =
        Runtime::parse(named).filter(|r| !matches!(r, Runtime::Codex | Runtime::ClaudeCode))
    {
        return Err(AgentError::invalid(
            "agent.model",
            format!("Sessions run on codex or claude-code; '{model}' names the {} runtime, which serves /v1/responses and conversations.", other.name()),
        ));
    }
    if was.is_some_and(|was| was != runtime) {
        return Err(AgentError::invalid(
            "agent.model",
            format!("A session's runtime is fixed when it is created; this one runs on {}: keep a model of that runtime, or create a new session.", was.map_or("", |r| r.name())),
        ));
    }
    if runtime != Runtime::ClaudeCode {
        return Ok(());
    }
    let refuse = |param: &str, what: &str| {
        Err(AgentError::invalid(
            param,
            format!("Unsupported parameter: a claude-code session takes no {what}; Claude Code runs its own tools (Bash, file edits, search) in the workspace."),
        ))
    };
    if agent["tools"].as_array().is_some_and(|t| !t.is_empty()) {
        return refuse("agent.tools[0]", "tools");
    }
    if !agent["reasoning"]["effort"].is_null() {
        return refuse("agent.reasoning.effort", "reasoning effort");
    }
    if agent["multi_agent"]["enabled"] == serde_json::Value::Bool(true) {
        return refuse("agent.multi_agent.enabled", "codex sub-agents");
    }
    if agent["service_tier"].as_str().is_some_and(|t| t != "auto") {
        return refuse("agent.service_tier", "service tier");
    }
    Ok(())
}
