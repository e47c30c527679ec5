//! Responses: one turn of a local CLI as an OpenAI Response, and the stored responses
//! afterwards. What a request asks for ([`TurnRequest`]) is checked and resolved here
//! (the runtime, the input, where the CLI's session continues) into a [`Prepared`]
//! turn, which [`super::run`] starts and runs.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::error::AgentError;
use super::input::{check_metadata, input_item, parse_input, InputMessage};
use super::objects::{label, now_unix, Object};
use super::records::{new_id, Collection, ObjectStore, Record, Scope, Transaction};
use super::runtime::{Runtime, Session};
use super::saved::{AgentConfig, SavedAgent};
use super::surface::Agents;

/// Responses kept before the oldest finished one is forgotten.
pub const MAX_RESPONSES: usize = 10_000;
/// Responses one identity keeps before its oldest finished one is forgotten.
pub const MAX_RESPONSES_PER_OWNER: usize = 1_000;

/// What every local response differs in (codes documented in `docs/agents.md`).
pub const DIFFERENCES: [&str; 5] = [
    "model_is_runtime",
    "tools_run_locally",
    "usage_from_cli",
    "usage_neutral_fields",
    "store_limits",
];

/// The error of a response whose turn was running when its server stopped.
pub const STOPPED_BY_RESTART: &str = "The server stopped while this response was running, so its turn did not finish. Send the request again.";

pub static RESPONSES: Collection = Collection {
    name: "response",
    parent: None,
    max_total: MAX_RESPONSES,
    max_per_owner: MAX_RESPONSES_PER_OWNER,
    evicts: true,
};

pub static INPUT_ITEMS: Collection = Collection {
    name: "input item",
    parent: Some(&RESPONSES),
    max_total: usize::MAX,
    max_per_owner: usize::MAX,
    evicts: false,
};

/// A stored response.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ResponseRecord {
    /// The Response object as served (updated while the turn runs).
    pub object: Value,
    /// Where `previous_response_id` continues.
    pub session: Option<Session>,
    /// Its turn is running (a running response is never forgotten to make room).
    pub running: bool,
}

impl Record for ResponseRecord {
    fn collection() -> &'static Collection {
        &RESPONSES
    }
    fn id(&self) -> &str {
        self.object["id"].as_str().unwrap_or_default()
    }
    fn evictable(&self) -> bool {
        !self.running
    }
    /// A response in flight when the server stopped has nothing running it now: it
    /// failed, and says why.
    fn on_restart(&mut self) -> bool {
        let status = self.object["status"].as_str().unwrap_or_default();
        if !self.running && !matches!(status, "in_progress" | "queued") {
            return false;
        }
        self.running = false;
        self.object["status"] = json!("failed");
        self.object["error"] = json!({"code": "server_error", "message": STOPPED_BY_RESTART});
        true
    }
}

impl Object for ResponseRecord {
    fn object(&self) -> Value {
        self.object.clone()
    }
}

/// One input item of a stored response.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InputItem(pub Value);

impl Record for InputItem {
    fn collection() -> &'static Collection {
        &INPUT_ITEMS
    }
    fn id(&self) -> &str {
        self.0["id"].as_str().unwrap_or_default()
    }
}

impl Object for InputItem {
    fn object(&self) -> Value {
        self.0.clone()
    }
}

/// Which runtime a request selects (its `runtime`, else a `model` that names one, else
/// `default`), and the model its CLI gets.
pub fn select_runtime(
    model: Option<&str>,
    runtime: Option<&str>,
    default: Runtime,
) -> Result<(Runtime, Option<String>), AgentError> {
    let named = match runtime {
        None => None,
        Some(name) => Some(Runtime::parse(name).ok_or_else(|| {
            AgentError::invalid(
                "runtime",
                format!("Unknown runtime '{name}'. GET /v1/agents/runtimes lists them."),
            )
        })?),
    };
    // `model` may name a runtime (`codex`), or a runtime and its model (`codex/gpt-5`),
    // or only the CLI's model.
    let (from_model, cli_model) = match model {
        None => (None, None),
        Some(m) => match Runtime::parse(m) {
            Some(r) => (Some(r), None),
            None => match m.split_once('/') {
                Some((prefix, rest)) if Runtime::parse(prefix).is_some() => {
                    (Runtime::parse(prefix), Some(rest.to_string()))
                }
                _ => (None, Some(m.to_string())),
            },
        },
    };
    if let (Some(a), Some(b)) = (named, from_model) {
        if a != b {
            return Err(AgentError::invalid(
                "model",
                format!(
                    "model names runtime '{}' but runtime is '{}'.",
                    b.name(),
                    a.name()
                ),
            ));
        }
    }
    let runtime = named.or(from_model).unwrap_or(default);
    if !runtime.implemented() {
        return Err(AgentError::NotImplemented(runtime));
    }
    Ok((runtime, cli_model))
}

/// What `POST /v1/responses` asks for, its fields already of the right JSON types.
#[derive(Debug, Default)]
pub struct TurnRequest {
    pub input: Value,
    pub model: Option<String>,
    pub runtime: Option<String>,
    pub instructions: Option<String>,
    /// Keep the response (default true).
    pub store: bool,
    pub metadata: Option<Value>,
    /// An id or `{"id": ...}`.
    pub conversation: Option<Value>,
    pub previous_response_id: Option<String>,
}

/// Where the turn continues from.
pub(super) enum Continuation {
    New,
    Conversation(String),
    Previous(String),
}

/// A turn checked and resolved, ready to start.
pub struct Prepared<S: ObjectStore> {
    /// The response's id, chosen before the CLI starts (a stream may show the response
    /// while the CLI is still being installed).
    pub id: String,
    pub runtime: Runtime,
    pub(super) cli_model: Option<String>,
    pub(super) prompt: String,
    pub(super) resume: Option<String>,
    pub(super) continuation: Continuation,
    pub(super) input_items: Vec<Value>,
    pub(super) instructions: Option<String>,
    pub(super) metadata: Value,
    pub(super) store: bool,
    /// Frees the conversation however the turn ends (or fails to start).
    pub(super) guard: TurnGuard<S>,
}

fn conversation_id(value: Option<Value>) -> Result<Option<String>, AgentError> {
    let refused = || {
        AgentError::invalid(
            "conversation",
            "conversation must be an id or {\"id\": ...}.",
        )
    };
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) => Ok(Some(id)),
        Some(Value::Object(o)) if o.len() == 1 => match o.get("id") {
            Some(Value::String(id)) => Ok(Some(id.clone())),
            _ => Err(refused()),
        },
        Some(_) => Err(refused()),
    }
}

/// The prompt on the CLI's stdin: instructions, the transcript of what its session
/// has not seen, the input.
fn prompt(instructions: Option<&str>, unseen: &[String], messages: &[InputMessage]) -> String {
    let mut prompt = String::new();
    if let Some(instructions) = instructions {
        prompt.push_str(instructions);
        prompt.push_str("\n\n");
    }
    if !unseen.is_empty() {
        prompt.push_str(&format!(
            "Earlier in this conversation:\n{}\n\n",
            unseen.join("\n")
        ));
    }
    if let [only] = messages {
        prompt.push_str(&only.text);
    } else {
        for message in messages {
            prompt.push_str(&format!("{}: {}\n", message.role, message.text));
        }
    }
    prompt
}

/// What names a saved agent where a model is expected (its ids' prefix).
const SAVED_AGENT_PREFIX: &str = "agent_";

/// A saved agent a response may run: its model and instructions; what a one-shot CLI
/// turn cannot honour (tools, reasoning, subagents) is refused rather than dropped.
fn saved_agent_for_a_response(saved: &SavedAgent) -> Result<&AgentConfig, AgentError> {
    let config = &saved.config;
    let unsupported = |what: &str| {
        AgentError::Unsupported {
        param: "model".into(),
        message: format!(
            "The saved agent '{}' sets {what}, which a response cannot honour; run it in a session (POST /v1/agents/sessions with agent_id).",
            saved.id
        ),
    }
    };
    if !config.tools.is_empty() {
        return Err(unsupported("tools"));
    }
    if config.reasoning.effort.is_some() || config.reasoning.summary.is_some() {
        return Err(unsupported("reasoning"));
    }
    if config.multi_agent.enabled {
        return Err(unsupported("multi_agent"));
    }
    Ok(config)
}

/// Checks a turn and resolves where it continues; a conversation is taken (busy)
/// until the returned turn, started or not, is dropped. Not a method of [`Agents`]: an
/// impl counts as part of its type's module, and `surface` must not depend on this
/// module, which depends on it.
pub async fn prepare<S: ObjectStore>(
    agents: &Arc<Agents<S>>,
    owner: &str,
    mut request: TurnRequest,
    default: Runtime,
) -> Result<Prepared<S>, AgentError> {
    if let Some(id) = request
        .model
        .clone()
        .filter(|m| m.starts_with(SAVED_AGENT_PREFIX))
    {
        let saved = agents
            .get::<SavedAgent>(Scope::owner(owner), &id)
            .await
            .map_err(AgentError::store("agent", &id, "model"))?;
        let config = saved_agent_for_a_response(&saved)?;
        request.model = Some(config.model.clone());
        request.instructions = request.instructions.or_else(|| config.instructions.clone());
    }
    let (runtime, cli_model) = select_runtime(
        request.model.as_deref(),
        request.runtime.as_deref(),
        default,
    )?;
    let messages = parse_input(&request.input)?;
    let metadata = check_metadata(request.metadata)?;
    let conversation = conversation_id(request.conversation)?;
    let continuation = match (conversation, request.previous_response_id) {
        (Some(_), Some(_)) => {
            return Err(AgentError::invalid(
                "previous_response_id",
                "Send conversation or previous_response_id, not both.",
            ))
        }
        (Some(c), None) => Continuation::Conversation(c),
        (None, Some(p)) => Continuation::Previous(p),
        (None, None) => Continuation::New,
    };
    let mut guard = TurnGuard::new(agents.clone(), owner);
    let (resume, unseen) = match &continuation {
        Continuation::New => (None, Vec::new()),
        Continuation::Previous(id) => (
            Some(agents.previous_session(owner, id, runtime).await?),
            Vec::new(),
        ),
        Continuation::Conversation(id) => {
            let taken = agents.take_conversation(owner, id, runtime).await?;
            guard.conversation = Some(id.clone());
            taken
        }
    };
    Ok(Prepared {
        id: new_response_id(),
        runtime,
        prompt: prompt(request.instructions.as_deref(), &unseen, &messages),
        cli_model,
        resume,
        continuation,
        input_items: messages.iter().map(input_item).collect(),
        instructions: request.instructions,
        metadata,
        store: request.store,
        guard,
    })
}

/// Frees the conversation when its turn ends, however it ends, and marks a stored
/// response whose turn was dropped unfinished (its client went away; dropping the turn
/// killed the CLI) as cancelled rather than leaving it in progress forever.
pub struct TurnGuard<S: ObjectStore> {
    agents: Arc<Agents<S>>,
    owner: String,
    pub(super) conversation: Option<String>,
    /// The stored response, until its turn has finished properly.
    pub(super) response: Option<String>,
    /// The running turn this guard unregisters.
    pub(super) registered: Option<String>,
}

impl<S: ObjectStore> TurnGuard<S> {
    fn new(agents: Arc<Agents<S>>, owner: &str) -> TurnGuard<S> {
        TurnGuard {
            agents,
            owner: owner.to_string(),
            conversation: None,
            response: None,
            registered: None,
        }
    }
}

impl<S: ObjectStore> TurnGuard<S> {
    /// The turn ended properly (its response is recorded): frees the conversation,
    /// awaited, so a request after the turn's last event finds it free.
    pub(super) async fn finish(mut self) {
        self.response = None;
        if let Some(id) = self.registered.take() {
            self.agents.unregister(&id);
        }
        if let Some(id) = self.conversation.take() {
            self.agents.release_conversation(&self.owner, &id).await;
        }
    }
}

impl<S: ObjectStore> Drop for TurnGuard<S> {
    fn drop(&mut self) {
        if let Some(id) = self.registered.take() {
            self.agents.unregister(&id);
        }
        if let Some(id) = self.conversation.take() {
            self.agents.release_conversation_detached(&self.owner, &id);
        }
        if let Some(id) = self.response.take() {
            let owner = self.owner.clone();
            self.agents.transact_detached(move |t| {
                t.update(Scope::owner(&owner), &id, |r: &mut ResponseRecord| {
                    if std::mem::take(&mut r.running) {
                        r.object["status"] = json!("cancelled");
                    }
                })
            });
        }
    }
}

impl<S: ObjectStore> Agents<S> {
    /// The session `previous_response_id` continues, on the same runtime.
    /// The runtime of the CLI session a stored response continues (`None`: it failed
    /// before its agent started); a response the caller does not own is not found.
    pub async fn session_runtime(
        self: &Arc<Self>,
        owner: &str,
        id: &str,
    ) -> Result<Option<Runtime>, AgentError> {
        let record: ResponseRecord = self
            .get(Scope::owner(owner), id)
            .await
            .map_err(AgentError::store("response", id, "previous_response_id"))?;
        Ok(record.session.map(|s| s.runtime))
    }

    async fn previous_session(
        self: &Arc<Self>,
        owner: &str,
        id: &str,
        runtime: Runtime,
    ) -> Result<String, AgentError> {
        let param = "previous_response_id";
        let record: ResponseRecord = self
            .get(Scope::owner(owner), id)
            .await
            .map_err(AgentError::store("response", id, param))?;
        match record.session {
            Some(s) if s.runtime == runtime => Ok(s.id),
            Some(s) => Err(AgentError::invalid(param, format!("Response '{id}' ran on runtime '{}', not '{}'.", s.runtime.name(), runtime.name()))),
            None => Err(AgentError::invalid(param, format!("Response '{id}' has no session to continue (it failed before the agent started)."))),
        }
    }

    /// Stops a running response: its CLI and everything it started are killed. Answers the
    /// response as cancelled.
    pub async fn cancel(self: &Arc<Self>, owner: &str, id: &str) -> Result<Value, AgentError> {
        let running = self.running_turn(owner, id);
        let record: ResponseRecord = self
            .get(Scope::owner(owner), id)
            .await
            .map_err(AgentError::store("response", id, "response_id"))?;
        match running {
            Some((pgid, cancelled)) if record.running => {
                cancelled.store(true, Ordering::Relaxed);
                kill_tree(pgid).await;
                let mut object = record.object;
                object["status"] = json!("cancelled");
                Ok(object)
            }
            _ => Err(AgentError::invalid(
                "response_id",
                format!(
                    "Response '{id}' is not in progress (status {}); only a running response can be cancelled.",
                    record.object["status"]
                ),
            )),
        }
    }

    /// Forgets a response, cancelling its turn first if it runs.
    pub async fn delete_response(
        self: &Arc<Self>,
        owner: &str,
        id: &str,
    ) -> Result<(), AgentError> {
        let running = self.running_turn(owner, id);
        let record: ResponseRecord = self
            .delete(Scope::owner(owner), id)
            .await
            .map_err(AgentError::store("response", id, "response_id"))?;
        if let (Some((pgid, cancelled)), true) = (running, record.running) {
            cancelled.store(true, Ordering::Relaxed);
            kill_tree(pgid).await;
        }
        Ok(())
    }
}

/// The Response object of a turn that starts now.
impl<S: ObjectStore> Prepared<S> {
    /// The Response object as it is before its turn starts.
    pub fn preview(&self) -> Value {
        response_object(&self.id, self)
    }

    /// The turn will not start (its CLI is missing or cannot be started): frees its
    /// conversation, awaited, so a retry finds it free. Merely dropping it frees the
    /// conversation too, a moment later.
    pub async fn abandon(self) {
        self.guard.finish().await
    }
}

pub(super) fn response_object<S: ObjectStore>(id: &str, turn: &Prepared<S>) -> Value {
    let runtime = turn.runtime;
    let (conversation, previous) = match &turn.continuation {
        Continuation::Conversation(c) => (json!({"id": c}), Value::Null),
        Continuation::Previous(p) => (Value::Null, json!(p)),
        Continuation::New => (Value::Null, Value::Null),
    };
    json!({
        "id": id,
        "object": "response",
        "created_at": now_unix(),
        "status": "in_progress",
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": turn.instructions,
        "max_output_tokens": null,
        "model": match &turn.cli_model { Some(m) => format!("{}/{m}", runtime.name()), None => runtime.name().to_string() },
        "output": [],
        "parallel_tool_calls": true,
        "previous_response_id": previous,
        "conversation": conversation,
        "reasoning": {"effort": null, "summary": null},
        "store": turn.store,
        "temperature": null,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": null,
        "truncation": "disabled",
        "usage": null,
        "user": null,
        "metadata": turn.metadata,
        "x_agent_sandbox": label(runtime.name(), &DIFFERENCES),
    })
}

/// The turn's CLI and every command it started (Claude Code's Bash puts each command in
/// a session of its own, which a group kill misses).
async fn kill_tree(pgid: i32) {
    let _ = crate::runtime::file::blocking(move || crate::process::tree::kill_tree(pgid)).await;
}

/// A new response id.
pub(super) fn new_response_id() -> String {
    new_id("resp_")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(error: AgentError) -> String {
        match error {
            AgentError::Invalid { param, .. } => param,
            other => panic!("not a 400: {other:?}"),
        }
    }

    #[test]
    fn input_is_text_or_messages_of_text() {
        assert_eq!(parse_input(&json!("hi")).unwrap()[0].text, "hi");
        let messages = parse_input(&json!([
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "message", "role": "assistant", "content": "c"},
        ]))
        .unwrap();
        assert_eq!(
            (messages[0].text.as_str(), messages[1].role.as_str()),
            ("a\nb", "assistant")
        );
        let image = parse_input(
            &json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
        );
        assert_eq!(param(image.unwrap_err()), "input[0].content[0].type");
        assert_eq!(param(parse_input(&Value::Null).unwrap_err()), "input");
        assert_eq!(param(parse_input(&json!([])).unwrap_err()), "input");
        assert_eq!(
            param(parse_input(&json!([{"type": "function_call_output"}])).unwrap_err()),
            "input[0].type"
        );
    }

    #[test]
    fn the_runtime_comes_from_runtime_then_model_then_the_default() {
        let pick = |model, runtime| select_runtime(model, runtime, Runtime::Codex);
        assert_eq!(pick(None, None).unwrap(), (Runtime::Codex, None));
        assert_eq!(pick(Some("qwen"), None).unwrap(), (Runtime::QwenCode, None));
        assert_eq!(
            pick(Some("codex/gpt-5"), None).unwrap(),
            (Runtime::Codex, Some("gpt-5".into()))
        );
        assert_eq!(
            pick(Some("gpt-5"), Some("qwen-code")).unwrap(),
            (Runtime::QwenCode, Some("gpt-5".into()))
        );
        assert_eq!(
            param(pick(Some("codex"), Some("qwen")).unwrap_err()),
            "model"
        );
        assert_eq!(param(pick(None, Some("nonesuch")).unwrap_err()), "runtime");
        assert!(matches!(
            pick(None, Some("cursor")),
            Err(AgentError::NotImplemented(Runtime::Cursor))
        ));
    }

    #[test]
    fn a_conversation_is_an_id_or_an_object_with_one() {
        assert_eq!(
            conversation_id(Some(json!("c1"))).unwrap().as_deref(),
            Some("c1")
        );
        assert_eq!(
            conversation_id(Some(json!({"id": "c2"})))
                .unwrap()
                .as_deref(),
            Some("c2")
        );
        assert!(conversation_id(Some(json!({"id": "c", "x": 1}))).is_err());
        assert!(conversation_id(Some(json!(3))).is_err());
    }
}
