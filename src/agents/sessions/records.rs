//! What a session keeps in the store: the session itself (its agent snapshot, its codex
//! thread, its status and pending actions), and its children — turns, items, subagents,
//! artifacts and traces — each a record whose parent is the session, so deleting the
//! session takes them all and a page of any of them costs that page.
//!
//! A turn lists the ids of its items (in order), so a turn's items are a slice of that
//! list and each item one lookup, without scanning the session's items. Items of a
//! subagent's turns are kept apart from the root agent's (`SUBAGENT_ITEMS`), since the
//! session's item list is "the root agent's items, including its subagent
//! interactions" and nothing more.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::agents::objects::{label, now_unix, Object};
use crate::agents::records::{Collection, Record};

/// Sessions kept at most, and per identity.
pub const MAX_SESSIONS: usize = 1_000;
pub const MAX_SESSIONS_PER_OWNER: usize = 100;
/// Turns one session keeps at most (older ones are not forgotten: the session is full).
pub const MAX_TURNS: usize = 2_000;
/// Items one turn holds at most; past that, its output items are not kept (the turn
/// still runs and its events still stream).
pub const MAX_ITEMS_PER_TURN: usize = 2_000;
/// `Idempotency-Key`s a session remembers (the most recent ones).
pub const IDEMPOTENCY_KEYS: usize = 64;

/// What every session object differs in from OpenAI's (documented in docs/agents.md).
pub const DIFFERENCES: [&str; 2] = ["codex_thread", "tools_run_locally"];
/// What a claude-code session differs in: it runs on a Claude Code CLI session.
pub const CLAUDE_DIFFERENCES: [&str; 2] = ["cli_session", "tools_run_locally"];

pub static SESSIONS: Collection = Collection {
    name: "session",
    parent: None,
    max_total: MAX_SESSIONS,
    max_per_owner: MAX_SESSIONS_PER_OWNER,
    evicts: false,
};

macro_rules! child {
    ($name:ident, $noun:literal) => {
        pub static $name: Collection = Collection {
            name: $noun,
            parent: Some(&SESSIONS),
            max_total: usize::MAX,
            max_per_owner: usize::MAX,
            evicts: false,
        };
    };
}

child!(TURNS, "session_turn");
child!(ITEMS, "session_item");
child!(SUBAGENT_ITEMS, "session_subagent_item");
child!(SUBAGENTS, "session_subagent");
child!(SUBAGENT_TURNS, "session_subagent_turn");
child!(ARTIFACTS, "session_artifact");
child!(TRACES, "session_trace");

/// A session's status, as the SDK names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Idle,
    InProgress,
    RequiresAction,
    Failed,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Idle => "idle",
            Status::InProgress => "in_progress",
            Status::RequiresAction => "requires_action",
            Status::Failed => "failed",
        }
    }
}

/// One session: a codex thread in this sandbox and what the API shows of it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Session {
    pub id: String,
    pub created_at: u64,
    pub last_active_at: u64,
    /// The session's `agent` object (a snapshot: later changes to a saved agent do not
    /// reach it).
    pub agent: Value,
    /// The whole agent configuration (with any secrets of its MCP transports), sealed
    /// (`super::super::seal`, bound to this session): what codex is started with.
    pub config: String,
    /// The `environment` object as answered.
    pub environment: Value,
    /// Where codex runs: a directory beneath the base directory, relative to it ("" is
    /// the base directory itself), or `None` for an environment of type `none`.
    pub workspace: Option<String>,
    pub metadata: Value,
    pub vault_ids: Vec<String>,
    pub status: Status,
    pub error: Option<String>,
    pub required_actions: Vec<Value>,
    /// The session's usage: every turn's, added up.
    pub usage: Option<Value>,
    pub review: Option<String>,
    pub prompt_cache_options: Option<Value>,
    pub spend_control: Option<Value>,
    /// codex's thread, once the first turn started it.
    pub thread_id: Option<String>,
    /// The root turn running now, if any.
    pub active_turn: Option<String>,
    /// Recent `Idempotency-Key`s of `POST …/events` whose inputs were applied, with a
    /// digest of the body each came with (a key reused for another body is refused).
    pub idempotency: Vec<(String, String)>,
    /// Keys whose inputs are being applied now (key, digest). A key leaves this list
    /// when its request ends: into `idempotency` if its inputs were applied, else
    /// forgotten, so a retry applies them. A restart forgets them too.
    #[serde(default)]
    pub pending_keys: Vec<(String, String)>,
    /// How many turns it holds.
    pub turns: usize,
}

impl Record for Session {
    fn collection() -> &'static Collection {
        &SESSIONS
    }
    fn id(&self) -> &str {
        &self.id
    }
    fn on_restart(&mut self) -> bool {
        // A request that was applying a key's inputs ended with the server: nobody was
        // answered, so the client's retry applies them.
        let had_pending = !self.pending_keys.is_empty();
        self.pending_keys.clear();
        // Nothing runs a turn after a restart: the session waits for its next input,
        // which resumes the codex thread. The turn itself is marked failed (see Turn).
        if self.status == Status::Idle && self.active_turn.is_none() {
            return had_pending;
        }
        self.status = Status::Idle;
        self.active_turn = None;
        self.required_actions.clear();
        self.error = Some(RESTARTED.to_string());
        true
    }
}

/// What an `Idempotency-Key` of `POST …/events` says about a request that carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyClaim {
    /// First use (or the first since a failure): the request applies its inputs, and
    /// the key is pending until [`Session::settle_key`].
    Claimed,
    /// The same body was applied already: answer as then, apply nothing.
    Applied,
    /// The same body is being applied by another request now.
    InFlight,
    /// The key came with another body.
    Reused,
}

impl Session {
    /// Claims `key` (sent with a body of `digest`) for applying its inputs.
    pub fn claim_key(&mut self, key: &str, digest: &str) -> KeyClaim {
        let same = |(k, d): &(String, String)| (k == key).then_some(d == digest);
        if let Some(same_body) = self.idempotency.iter().find_map(same) {
            return if same_body {
                KeyClaim::Applied
            } else {
                KeyClaim::Reused
            };
        }
        if let Some(same_body) = self.pending_keys.iter().find_map(same) {
            return if same_body {
                KeyClaim::InFlight
            } else {
                KeyClaim::Reused
            };
        }
        self.pending_keys
            .push((key.to_string(), digest.to_string()));
        KeyClaim::Claimed
    }

    /// Ends a claim: an applied key is remembered (the newest [`IDEMPOTENCY_KEYS`]), a
    /// failed one forgotten, so the same request sent again is applied.
    pub fn settle_key(&mut self, key: &str, digest: &str, applied: bool) {
        let claimed = |(k, d): &(String, String)| k == key && d == digest;
        let Some(at) = self.pending_keys.iter().position(claimed) else {
            return;
        };
        let entry = self.pending_keys.remove(at);
        if applied {
            self.idempotency.push(entry);
            let excess = self.idempotency.len().saturating_sub(IDEMPOTENCY_KEYS);
            self.idempotency.drain(..excess);
        }
    }
}

/// What a turn that was running when the server stopped reports.
pub const RESTARTED: &str =
    "The server stopped while this turn was running, so it did not finish. Send a new input: the session's codex thread resumes with everything before this turn.";

impl Object for Session {
    fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "agent.session",
            "agent": self.agent,
            "created_at": self.created_at,
            "last_active_at": self.last_active_at,
            "environment": self.environment,
            "error": self.error,
            "metadata": self.metadata,
            "required_actions": self.required_actions,
            "status": self.status.name(),
            "usage": self.usage,
            "vault_ids": self.vault_ids,
            "prompt_cache_options": self.prompt_cache_options,
            "review": self.review,
            "spend_control": self.spend_control,
            "x_agent_sandbox": self.label(),
        })
    }
}

impl Session {
    /// The session's label: the runtime it runs on, and that runtime's own session id
    /// (codex's thread, Claude Code's session).
    fn label(&self) -> Value {
        let runtime = super::runtime_of(&self.agent);
        if runtime == crate::agents::Runtime::ClaudeCode {
            let mut label = label(runtime.name(), &CLAUDE_DIFFERENCES);
            label["claude_session_id"] = json!(self.thread_id);
            return label;
        }
        with_thread(label("codex", &DIFFERENCES), self.thread_id.as_deref())
    }
}

fn with_thread(mut label: Value, thread: Option<&str>) -> Value {
    label["codex_thread_id"] = json!(thread);
    label
}

/// A turn's status, as the SDK names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    Queued,
    InProgress,
    Waiting,
    Completed,
    Failed,
    Cancelled,
}

impl TurnStatus {
    pub fn name(self) -> &'static str {
        match self {
            TurnStatus::Queued => "queued",
            TurnStatus::InProgress => "in_progress",
            TurnStatus::Waiting => "waiting",
            TurnStatus::Completed => "completed",
            TurnStatus::Failed => "failed",
            TurnStatus::Cancelled => "cancelled",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            TurnStatus::Completed | TurnStatus::Failed | TurnStatus::Cancelled
        )
    }
}

/// One turn of the root agent or of a subagent.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Turn {
    pub id: String,
    pub session_id: String,
    pub agent_id: String,
    pub status: TurnStatus,
    pub created_at: u64,
    pub started_at: Option<u64>,
    pub completed_at: Option<u64>,
    /// `{code, message}` when failed.
    pub error: Option<Value>,
    pub subagent_id: Option<String>,
    pub usage: Option<Value>,
    /// codex's id of the turn.
    pub codex_turn_id: Option<String>,
    /// Its items' ids, in order.
    pub items: Vec<String>,
    /// When it started, in milliseconds, for its trace.
    pub started_ms: u64,
    /// What of it the store refused when it ended (`items`, `artifacts`, `trace`).
    #[serde(default)]
    pub not_kept: Vec<String>,
}

impl Record for Turn {
    fn collection() -> &'static Collection {
        &TURNS
    }
    fn id(&self) -> &str {
        &self.id
    }
    fn on_restart(&mut self) -> bool {
        if self.status.is_final() {
            return false;
        }
        self.status = TurnStatus::Failed;
        self.completed_at = Some(now_unix());
        self.error = Some(json!({"code": "internal_error", "message": RESTARTED}));
        true
    }
}

impl Object for Turn {
    fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "agent.session.turn",
            "agent_id": self.agent_id,
            "session_id": self.session_id,
            "status": self.status.name(),
            "created_at": self.created_at,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
            "error": self.error,
            "subagent_id": self.subagent_id,
            "usage": self.usage,
            "x_agent_sandbox": with_codex_turn(label("codex", &DIFFERENCES), self.codex_turn_id.as_deref(), &self.not_kept),
        })
    }
}

fn with_codex_turn(mut label: Value, turn: Option<&str>, not_kept: &[String]) -> Value {
    label["codex_turn_id"] = json!(turn);
    if !not_kept.is_empty() {
        label["not_kept"] = json!(not_kept);
    }
    label
}

/// One item, in the SDK's `AgentSessionItem` shape (with its `id` and `turn_id`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Item(pub Value);

impl Record for Item {
    fn collection() -> &'static Collection {
        &ITEMS
    }
    fn id(&self) -> &str {
        self.0["id"].as_str().unwrap_or_default()
    }
}

impl Object for Item {
    fn object(&self) -> Value {
        self.0.clone()
    }
}

/// A turn of a subagent (kept apart from the root agent's, which the session's turn
/// list shows).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SubagentTurn(pub Turn);

impl Record for SubagentTurn {
    fn collection() -> &'static Collection {
        &SUBAGENT_TURNS
    }
    fn id(&self) -> &str {
        &self.0.id
    }
    fn on_restart(&mut self) -> bool {
        self.0.on_restart()
    }
}

impl Object for SubagentTurn {
    fn object(&self) -> Value {
        self.0.object()
    }
}

/// An item of a subagent's turn.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SubagentItem(pub Value);

impl Record for SubagentItem {
    fn collection() -> &'static Collection {
        &SUBAGENT_ITEMS
    }
    fn id(&self) -> &str {
        self.0["id"].as_str().unwrap_or_default()
    }
}

impl Object for SubagentItem {
    fn object(&self) -> Value {
        self.0.clone()
    }
}

/// A codex sub-agent (a child thread) of the session.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Subagent {
    pub id: String,
    pub session_id: String,
    pub parent_agent_id: String,
    pub opened_at: u64,
    pub closed_at: Option<u64>,
    pub name: Option<String>,
    pub instructions: Option<Value>,
    pub thread_id: String,
    /// Its turns' ids, in order.
    pub turns: Vec<String>,
    /// Its items' ids, in order.
    pub items: Vec<String>,
}

impl Record for Subagent {
    fn collection() -> &'static Collection {
        &SUBAGENTS
    }
    fn id(&self) -> &str {
        &self.id
    }
    fn on_restart(&mut self) -> bool {
        // Its thread ended with the app-server that ran it.
        if self.closed_at.is_some() {
            return false;
        }
        self.closed_at = Some(now_unix());
        true
    }
}

impl Object for Subagent {
    fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "agent.session.subagent",
            "parent_agent_id": self.parent_agent_id,
            "session_id": self.session_id,
            "opened_at": self.opened_at,
            "closed_at": self.closed_at,
            "instructions": self.instructions,
            "name": self.name,
            "status": if self.closed_at.is_some() { "closed" } else { "active" },
            "x_agent_sandbox": with_thread(label("codex", &DIFFERENCES), Some(&self.thread_id)),
        })
    }
}

/// A file a turn created or changed under `outputs/` of the session's workspace.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Artifact {
    pub id: String,
    pub session_id: String,
    pub turn_id: String,
    pub environment_id: String,
    /// The file's absolute path as the session sees it.
    pub path: String,
    /// The same file, relative to the base directory (what is opened to read it).
    pub local_path: String,
    pub size_bytes: u64,
    pub created_at: u64,
}

impl Record for Artifact {
    fn collection() -> &'static Collection {
        &ARTIFACTS
    }
    fn id(&self) -> &str {
        &self.id
    }
}

impl Object for Artifact {
    fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "agent.session.artifact",
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "environment_id": self.environment_id,
            "path": self.path,
            "size_bytes": self.size_bytes,
            "created_at": self.created_at,
            "x_agent_sandbox": label("agent-sandbox", &["published_from_outputs"]),
        })
    }
}

/// The OTLP trace of one root turn; its id is the turn's.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Trace {
    pub id: String,
    pub session_id: String,
    pub created_at: u64,
    pub otlp: Value,
}

impl Record for Trace {
    fn collection() -> &'static Collection {
        &TRACES
    }
    fn id(&self) -> &str {
        &self.id
    }
}

impl Object for Trace {
    fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "agent.session.trace",
            "created_at": self.created_at,
            "session_id": self.session_id,
            "otlp": self.otlp,
            "x_agent_sandbox": label("agent-sandbox", &["spans_from_codex_notifications"]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session {
        serde_json::from_value(json!({
            "id": "sess_1", "created_at": 1, "last_active_at": 1, "agent": {}, "config": "",
            "environment": {}, "workspace": null, "metadata": {}, "vault_ids": [],
            "status": "idle", "error": null, "required_actions": [], "usage": null,
            "review": null, "prompt_cache_options": null, "spend_control": null,
            "thread_id": null, "active_turn": null, "idempotency": [], "turns": 0
        }))
        .expect("a session stored before pending keys existed still reads")
    }

    #[test]
    fn a_key_is_bound_to_the_outcome_of_applying_its_inputs() {
        let mut s = session();
        assert_eq!(s.claim_key("k", "body"), KeyClaim::Claimed);
        // A retry while the first is being applied waits; another body is refused.
        assert_eq!(s.claim_key("k", "body"), KeyClaim::InFlight);
        assert_eq!(s.claim_key("k", "other"), KeyClaim::Reused);
        // The inputs failed: the key is free again, and the retry applies them.
        s.settle_key("k", "body", false);
        assert_eq!(s.claim_key("k", "body"), KeyClaim::Claimed);
        s.settle_key("k", "body", true);
        // Applied: a repeat applies nothing; another body is still refused.
        assert_eq!(s.claim_key("k", "body"), KeyClaim::Applied);
        assert_eq!(s.claim_key("k", "other"), KeyClaim::Reused);
        assert!(s.pending_keys.is_empty());
    }

    #[test]
    fn a_restart_frees_keys_whose_request_it_interrupted() {
        let mut s = session();
        assert_eq!(s.claim_key("k", "body"), KeyClaim::Claimed);
        assert!(s.on_restart(), "the freed key is written back");
        assert_eq!(s.claim_key("k", "body"), KeyClaim::Claimed);
    }

    #[test]
    fn only_the_newest_applied_keys_are_remembered() {
        let mut s = session();
        for i in 0..=IDEMPOTENCY_KEYS {
            let key = format!("k{i}");
            assert_eq!(s.claim_key(&key, "b"), KeyClaim::Claimed);
            s.settle_key(&key, "b", true);
        }
        assert_eq!(s.idempotency.len(), IDEMPOTENCY_KEYS);
        assert_eq!(
            s.claim_key("k0", "b"),
            KeyClaim::Claimed,
            "the oldest was forgotten"
        );
        assert_eq!(
            s.claim_key(&format!("k{IDEMPOTENCY_KEYS}"), "b"),
            KeyClaim::Applied
        );
    }
}
