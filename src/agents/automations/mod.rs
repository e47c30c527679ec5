//! Automations (`/v1/agents/automations`): a session turn that runs on a schedule (a
//! cron `expression` in a `timezone`, or `once` at `run_at`) or on demand, each run an
//! invocation record. The target is a new session per run (its create body kept) or an
//! existing session of the owner, which receives the saved instructions as a user
//! message.
//!
//! Every automation is a record of its owner, like a saved agent; its runs are its
//! children ([`MAX_RUNS_KEPT`] kept, the oldest finished ones forgotten first). Where
//! the next occurrence is, is kept twice: in the automation (`next_at`, the truth) and
//! in one schedule entry per active automation under an internal owner ([`SCHEDULER`],
//! a name no identity can have: it holds a NUL), so the thread ([`scheduler`]) finds
//! every identity's due automations with one list when it starts. Both are written in
//! the transaction that changes the automation.
//!
//! **Never twice.** An occurrence fires in one transaction that records its invocation
//! (`queued`) and moves `next_at` past now; the delivery happens after it commits.
//! Occurrences missed while the server was down are caught up once: one run, its
//! `scheduled_at` the first missed occurrence, and the schedule resumes from now. A
//! delivery the server was in the middle of when it stopped is `failed` with code
//! `interrupted` at the next start, not tried again: it may have reached its session.
//! An occurrence that comes while an earlier run of the automation is still `queued`
//! (its session busy) is recorded `skipped` with `skip_reason: pending_delivery`.
//!
//! The target's delivery body is sealed ([`super::seal`], bound to the automation): an
//! inline agent's MCP tools may carry bearers, which the answered `target` never shows.

pub mod schedule;
pub mod scheduler;
pub mod wake;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::body::{invalid, metadata};
use super::error::AgentError;
use super::objects::{label, now_unix, Object};
use super::records::{
    new_id, Collection, ListQuery, Order, Record, Scope, StoreError, Transaction,
};
use super::seal;
use super::surface::Agents;
use schedule::Schedule;
use wake::Job;

/// Automations one identity keeps, and the whole server.
pub const MAX_AUTOMATIONS_PER_OWNER: usize = 100;
pub const MAX_AUTOMATIONS: usize = 10_000;
/// Invocations kept per automation: the oldest finished one goes when a new one comes.
pub const MAX_RUNS_KEPT: usize = 100;
/// Characters of `name`.
pub const MAX_NAME: usize = 256;
/// Characters of an existing-session target's `instructions`.
pub const MAX_INSTRUCTIONS: usize = 256 * 1024;

/// The owner of the schedule entries.
pub const SCHEDULER: &str = "\0automation-schedule";

pub static AUTOMATIONS: Collection = Collection {
    name: "automation",
    parent: None,
    max_total: MAX_AUTOMATIONS,
    max_per_owner: MAX_AUTOMATIONS_PER_OWNER,
    evicts: false,
};

pub static INVOCATIONS: Collection = Collection {
    name: "invocation",
    parent: Some(&AUTOMATIONS),
    max_total: usize::MAX,
    max_per_owner: usize::MAX,
    evicts: false,
};

pub static SCHEDULE: Collection = Collection {
    name: "automation_schedule",
    parent: None,
    max_total: MAX_AUTOMATIONS,
    max_per_owner: MAX_AUTOMATIONS,
    evicts: false,
};

/// What the objects of this module say about themselves.
fn automation_label() -> Value {
    label("agent-sandbox", &["local_scheduler"])
}

/// When an automation runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum When {
    Periodic {
        expression: String,
        timezone: String,
    },
    Once {
        run_at: i64,
    },
}

impl When {
    /// What is next from `now`: a periodic automation's first occurrence strictly
    /// after it, a one-time one's `run_at`.
    fn next_after(&self, now: i64) -> Option<i64> {
        match self {
            When::Periodic {
                expression,
                timezone,
            } => Schedule::parse(expression, timezone).ok()?.next_after(now),
            When::Once { run_at } => Some(*run_at),
        }
    }
}

/// A checked target, as the routes make it (they check environments, agents and
/// vaults against the caller and the sandbox).
#[derive(Clone, Debug)]
pub struct NewTarget {
    /// `new_session` or `existing_session`.
    pub kind: String,
    /// The target as answered: no secrets.
    pub shown: Value,
    /// What a run sends: a session create body, or `{session_id, instructions}`.
    pub delivery: Value,
    /// The session an existing-session target delivers to.
    pub session_id: Option<String>,
}

/// An automation's target as stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Target {
    pub kind: String,
    pub shown: Value,
    /// The delivery body, sealed for this automation.
    pub sealed: String,
    pub session_id: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Automation {
    pub id: String,
    pub created_at: u64,
    pub name: String,
    pub metadata: Value,
    pub when: When,
    /// `active`, `paused` or `completed` (a one-time automation that has fired).
    pub status: String,
    pub target: Target,
    pub created_by: Value,
    /// The next occurrence (Unix seconds): `None` while paused and once completed.
    pub next_at: Option<i64>,
    /// A one-time automation's scheduled invocation exists: `run_at` is fixed.
    pub fired: bool,
}

impl Record for Automation {
    fn collection() -> &'static Collection {
        &AUTOMATIONS
    }
    fn id(&self) -> &str {
        &self.id
    }
}

impl Object for Automation {
    fn object(&self) -> Value {
        let mut object = json!({
            "id": self.id,
            "object": "agent.automation",
            "created_at": self.created_at,
            "created_by": self.created_by,
            "metadata": self.metadata,
            "name": self.name,
            "status": self.status,
            "target": self.target.shown,
        });
        match &self.when {
            When::Periodic {
                expression,
                timezone,
            } => {
                object["type"] = json!("periodic");
                object["expression"] = json!(expression);
                object["timezone"] = json!(timezone);
            }
            When::Once { run_at } => {
                object["type"] = json!("once");
                object["run_at"] = json!(run_at);
            }
        }
        let mut local = automation_label();
        local["next_run_at"] = json!(self.next_at);
        object["x_agent_sandbox"] = local;
        object
    }
}

/// One run of an automation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Invocation {
    pub id: String,
    pub automation_id: String,
    pub created_at: u64,
    /// `queued`, `completed`, `failed` or `skipped`.
    pub status: String,
    pub error: Option<Value>,
    /// The occurrence it ran for; `None` for a manual run.
    pub scheduled_at: Option<i64>,
    pub session_id: Option<String>,
    pub skip_reason: Option<String>,
    pub source: Value,
}

impl Record for Invocation {
    fn collection() -> &'static Collection {
        &INVOCATIONS
    }
    fn id(&self) -> &str {
        &self.id
    }
    /// A delivery cut off by the stop is not tried again: it may have reached its
    /// session already, and a run must never happen twice.
    fn on_restart(&mut self) -> bool {
        if self.status != "queued" {
            return false;
        }
        self.status = "failed".into();
        self.error = Some(json!({
            "code": "interrupted",
            "message": "The server stopped while this run was being delivered; it is not tried again, so that it cannot run twice.",
        }));
        true
    }
}

impl Object for Invocation {
    fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "agent.automation.invocation",
            "automation_id": self.automation_id,
            "created_at": self.created_at,
            "error": self.error,
            "scheduled_at": self.scheduled_at,
            "session_id": self.session_id,
            "skip_reason": self.skip_reason,
            "source": self.source,
            "status": self.status,
            "x_agent_sandbox": automation_label(),
        })
    }
}

/// Where the scheduler finds an active automation: its id, its owner, when it is due.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    pub id: String,
    pub owner: String,
    pub at: i64,
}

impl Record for Entry {
    fn collection() -> &'static Collection {
        &SCHEDULE
    }
    fn id(&self) -> &str {
        &self.id
    }
}

fn binding(automation_id: &str) -> String {
    format!("automation:{automation_id}:target")
}

fn sealing_failed(e: seal::SealError) -> AgentError {
    AgentError::Failed(format!("The vault key is unusable: {}", e.0))
}

/// 404 for an automation this caller does not own (or nobody does).
fn missing(id: &str) -> AgentError {
    AgentError::Rejected {
        status: 404,
        code: "not_found",
        param: Some("automation_id".into()),
        message: format!("No automation found with id '{id}'."),
    }
}

fn store_refusal(id: &str) -> impl FnOnce(StoreError) -> AgentError + '_ {
    move |e| match e {
        StoreError::NotFound => missing(id),
        e => AgentError::store("automation", id, "automation_id")(e),
    }
}

/// A refusal of the automation's state (pause a completed one): 400, naming nothing.
fn conflict(message: String) -> AgentError {
    AgentError::Rejected {
        status: 400,
        code: "invalid_state",
        param: None,
        message,
    }
}

pub fn now() -> i64 {
    now_unix() as i64
}

fn known_keys(body: &Map<String, Value>, allowed: &[&str]) -> Result<(), AgentError> {
    match body
        .iter()
        .find(|(k, v)| !v.is_null() && !allowed.contains(&k.as_str()))
    {
        Some((key, _)) => Err(AgentError::Unsupported {
            param: key.clone(),
            message: format!("Unsupported parameter: '{key}' is not a field of this request."),
        }),
        None => Ok(()),
    }
}

fn name_of(value: Option<&Value>) -> Result<String, AgentError> {
    match value {
        Some(Value::String(s)) if !s.trim().is_empty() && s.chars().count() <= MAX_NAME => {
            Ok(s.clone())
        }
        _ => Err(invalid(
            "name",
            format!("name is required: a string of 1 to {MAX_NAME} characters."),
        )),
    }
}

fn string_of(body: &Map<String, Value>, key: &str, what: &str) -> Result<String, AgentError> {
    match body.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(invalid(key, format!("{key} is required: {what}."))),
    }
}

/// `run_at`: a whole number of seconds after now.
fn run_at_of(value: Option<&Value>, now: i64) -> Result<i64, AgentError> {
    let at = value.and_then(Value::as_i64).ok_or_else(|| {
        invalid(
            "run_at",
            "run_at is required: a Unix timestamp in seconds, in the future.",
        )
    })?;
    if at <= now {
        return Err(invalid(
            "run_at",
            format!("run_at {at} is not in the future (it is {now} now): give a later Unix timestamp in seconds."),
        ));
    }
    Ok(at)
}

fn checked_schedule(expression: &str, timezone: &str) -> Result<(), AgentError> {
    Schedule::parse(expression, timezone)
        .map(drop)
        .map_err(|r| invalid(r.param, r.message))
}

/// Writes the schedule entry of `automation` (or removes it), in the transaction that
/// changed it.
fn index<T: Transaction>(t: &mut T, owner: &str, a: &Automation) -> Result<(), StoreError> {
    let scope = Scope::owner(SCHEDULER);
    match (a.status.as_str(), a.next_at) {
        ("active", Some(at)) => t.create_or_replace(
            scope,
            Entry {
                id: a.id.clone(),
                owner: owner.to_string(),
                at,
            },
        ),
        _ => unschedule(t, &a.id),
    }
}

/// Removes automation `id`'s schedule entry, if it has one.
fn unschedule<T: Transaction>(t: &mut T, id: &str) -> Result<(), StoreError> {
    match t.delete::<Entry>(Scope::owner(SCHEDULER), id) {
        Ok(_) | Err(StoreError::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes back a changed automation and its schedule entry, in one transaction.
fn save<T: Transaction>(t: &mut T, owner: &str, a: &Automation) -> Result<(), StoreError> {
    t.put(Scope::owner(owner), a.clone())?;
    index(t, owner, a)
}

fn due_job(owner: &str, a: &Automation) -> Job {
    Job::Due {
        owner: owner.to_string(),
        id: a.id.clone(),
        at: (a.status == "active").then_some(a.next_at).flatten(),
    }
}

/// `POST /v1/agents/automations`: `body` without its `target`, which the routes
/// checked.
pub async fn create(
    agents: &Arc<Agents>,
    owner: &str,
    body: Map<String, Value>,
    target: NewTarget,
) -> Result<Value, AgentError> {
    create_by(agents, owner, body, target, json!({"type": "developer"})).await
}

async fn create_by(
    agents: &Arc<Agents>,
    owner: &str,
    body: Map<String, Value>,
    target: NewTarget,
    created_by: Value,
) -> Result<Value, AgentError> {
    let now = now();
    let kind = body.get("type").and_then(Value::as_str).unwrap_or_default();
    let when = match kind {
        "periodic" => {
            known_keys(
                &body,
                &[
                    "type",
                    "name",
                    "target",
                    "expression",
                    "timezone",
                    "metadata",
                ],
            )?;
            let expression = string_of(
                &body,
                "expression",
                "a cron expression such as \"0 9 * * 1-5\"",
            )?;
            let timezone = string_of(&body, "timezone", "an IANA time zone name such as \"UTC\"")?;
            checked_schedule(&expression, &timezone)?;
            When::Periodic {
                expression,
                timezone,
            }
        }
        "once" => {
            known_keys(&body, &["type", "name", "target", "run_at", "metadata"])?;
            When::Once {
                run_at: run_at_of(body.get("run_at"), now)?,
            }
        }
        "" => return Err(invalid("type", "type is required: periodic or once.")),
        other => {
            return Err(invalid(
                "type",
                format!("Unknown automation type '{other}': periodic or once."),
            ))
        }
    };
    let name = name_of(body.get("name"))?;
    let metadata = metadata(body.get("metadata"), "metadata")?;
    let id = new_id("auto_");
    let owner = owner.to_string();
    let automation = agents
        .transact(move |t| {
            check_session(t, &owner, &target)?;
            let a = Automation {
                target: Target {
                    sealed: seal_delivery(&id, &target.delivery)?,
                    kind: target.kind,
                    shown: target.shown,
                    session_id: target.session_id,
                },
                next_at: when.next_after(now),
                id,
                created_at: now as u64,
                name,
                metadata,
                when,
                status: "active".into(),
                created_by,
                fired: false,
            };
            t.create(Scope::owner(&owner), a.clone())
                .map_err(AgentError::store("automation", &a.id, "automation_id"))?;
            index(t, &owner, &a)?;
            Ok::<_, AgentError>((owner, a))
        })
        .await?;
    let (owner, automation) = automation;
    agents.automations().send(due_job(&owner, &automation));
    Ok(automation.object())
}

fn seal_delivery(id: &str, delivery: &Value) -> Result<String, AgentError> {
    seal::seal(&binding(id), delivery.to_string().as_bytes()).map_err(sealing_failed)
}

/// An existing-session target names a session of the caller's.
fn check_session<T: Transaction>(
    t: &mut T,
    owner: &str,
    target: &NewTarget,
) -> Result<(), AgentError> {
    if let Some(session) = &target.session_id {
        t.get::<super::sessions::records::Session>(Scope::owner(owner), session)
            .map_err(|e| match e {
                StoreError::NotFound => AgentError::Rejected {
                    status: 404,
                    code: "not_found",
                    param: Some("target.session_id".into()),
                    message: format!("No session found with id '{session}'."),
                },
                e => AgentError::from(e),
            })?;
    }
    Ok(())
}

pub async fn get(agents: &Arc<Agents>, owner: &str, id: &str) -> Result<Value, AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    agents
        .read(move |t| {
            t.get::<Automation>(Scope::owner(&owner), &id)
                .map(|a| a.object())
                .map_err(store_refusal(&id))
        })
        .await
}

/// `GET /v1/agents/automations`: the caller's, newest first unless `order` says
/// otherwise; `session_id` keeps those whose target is that existing session.
pub async fn list(
    agents: &Arc<Agents>,
    owner: &str,
    after: Option<String>,
    limit: usize,
    order: Order,
    session_id: Option<String>,
) -> Result<(Vec<Value>, bool), AgentError> {
    let owner = owner.to_string();
    agents
        .read(move |t| {
            // An identity keeps at most MAX_AUTOMATIONS_PER_OWNER: one read, filtered.
            let all = t.list::<Automation>(Scope::owner(&owner), &ListQuery::all())?;
            let mut kept: Vec<Automation> = all
                .data
                .into_iter()
                .filter(|a| session_id.is_none() || a.target.session_id == session_id)
                .collect();
            if order == Order::Desc {
                kept.reverse();
            }
            let start = match &after {
                None => 0,
                Some(cursor) => match kept.iter().position(|a| &a.id == cursor) {
                    Some(i) => i + 1,
                    None => {
                        return Err(invalid(
                            "after",
                            format!("No automation '{cursor}' in this list."),
                        ))
                    }
                },
            };
            let rest = &kept[start.min(kept.len())..];
            let page: Vec<Value> = rest.iter().take(limit).map(Object::object).collect();
            Ok((page, rest.len() > limit))
        })
        .await
}

/// `POST /v1/agents/automations/{id}`: every field checked before anything changes.
pub async fn update(
    agents: &Arc<Agents>,
    owner: &str,
    id: &str,
    body: Map<String, Value>,
    target: Option<NewTarget>,
) -> Result<Value, AgentError> {
    known_keys(
        &body,
        &[
            "expression",
            "metadata",
            "name",
            "run_at",
            "target",
            "timezone",
        ],
    )?;
    let name = match body.get("name") {
        None | Some(Value::Null) => None,
        value => Some(name_of(value)?),
    };
    let metadata = match body.get("metadata") {
        None => None,
        value => Some(metadata(value, "metadata")?),
    };
    let text = |key: &str| -> Result<Option<String>, AgentError> {
        match body.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(invalid(key, format!("{key} must be a string."))),
        }
    };
    let expression = text("expression")?;
    let timezone = text("timezone")?;
    let run_at = body.get("run_at").filter(|v| !v.is_null()).cloned();
    let now = now();
    let (owner, id) = (owner.to_string(), id.to_string());
    let (owner, a) = agents
        .transact(move |t| {
            let scope = Scope::owner(&owner);
            let mut a: Automation = t.get(scope, &id).map_err(store_refusal(&id))?;
            match &mut a.when {
                When::Periodic {
                    expression: e,
                    timezone: z,
                } => {
                    if run_at.is_some() {
                        return Err(invalid("run_at", "run_at is only accepted for one-time automations; a periodic one changes its expression or timezone."));
                    }
                    if expression.is_some() || timezone.is_some() {
                        let expression = expression.unwrap_or_else(|| e.clone());
                        let timezone = timezone.unwrap_or_else(|| z.clone());
                        checked_schedule(&expression, &timezone)?;
                        (*e, *z) = (expression, timezone);
                    }
                }
                When::Once { run_at: at } => {
                    if expression.is_some() {
                        return Err(invalid("expression", "expression is only accepted for periodic automations; a one-time one changes its run_at."));
                    }
                    if timezone.is_some() {
                        return Err(invalid("timezone", "timezone is only accepted for periodic automations; a one-time one changes its run_at."));
                    }
                    if let Some(value) = &run_at {
                        if a.fired {
                            return Err(invalid("run_at", "run_at cannot change: this one-time automation's scheduled invocation exists already."));
                        }
                        *at = run_at_of(Some(value), now)?;
                    }
                }
            }
            if let Some(target) = target {
                if target.kind != a.target.kind {
                    return Err(invalid(
                        "target.type",
                        format!(
                            "An automation keeps its target's type: this one's is {}.",
                            a.target.kind
                        ),
                    ));
                }
                check_session(t, &owner, &target)?;
                a.target = Target {
                    sealed: seal_delivery(&a.id, &target.delivery)?,
                    kind: target.kind,
                    shown: target.shown,
                    session_id: target.session_id,
                };
            }
            if let Some(name) = name {
                a.name = name;
            }
            if let Some(metadata) = metadata {
                a.metadata = metadata;
            }
            if a.status == "active" {
                a.next_at = a.when.next_after(now);
            }
            save(t, &owner, &a)?;
            Ok::<_, AgentError>((owner, a))
        })
        .await?;
    agents.automations().send(due_job(&owner, &a));
    Ok(a.object())
}

/// `DELETE /v1/agents/automations/{id}`: the automation and its runs (a delivery under
/// way finishes; its record is gone).
pub async fn delete(agents: &Arc<Agents>, owner: &str, id: &str) -> Result<Value, AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    let (owner, id) = agents
        .transact(move |t| {
            let a: Automation = t
                .delete(Scope::owner(&owner), &id)
                .map_err(store_refusal(&id))?;
            unschedule(t, &a.id)?;
            Ok::<_, AgentError>((owner, id))
        })
        .await?;
    agents.automations().send(Job::Due {
        owner,
        id: id.clone(),
        at: None,
    });
    Ok(json!({
        "id": id,
        "object": "agent.automation.deleted",
        "deleted": true,
        "x_agent_sandbox": automation_label(),
    }))
}

/// `POST …/pause`: no scheduled run until resumed (a run under way goes on).
pub async fn pause(agents: &Arc<Agents>, owner: &str, id: &str) -> Result<Value, AgentError> {
    set_status(agents, owner, id, false).await
}

/// `POST …/resume`: a periodic automation's next occurrence after now (those that
/// passed while it was paused are not run); a one-time one's `run_at`, at once if that
/// passed while it was paused.
pub async fn resume(agents: &Arc<Agents>, owner: &str, id: &str) -> Result<Value, AgentError> {
    set_status(agents, owner, id, true).await
}

async fn set_status(
    agents: &Arc<Agents>,
    owner: &str,
    id: &str,
    active: bool,
) -> Result<Value, AgentError> {
    let now = now();
    let (owner, id) = (owner.to_string(), id.to_string());
    let (owner, a) = agents
        .transact(move |t| {
            let scope = Scope::owner(&owner);
            let mut a: Automation = t.get(scope, &id).map_err(store_refusal(&id))?;
            if a.status == "completed" {
                return Err(conflict(format!(
                    "The automation '{id}' has completed: a one-time automation that has run is neither paused nor resumed (run it again with POST /v1/agents/automations/{id}/invocations)."
                )));
            }
            let wanted = if active { "active" } else { "paused" };
            if a.status != wanted {
                a.status = wanted.into();
                a.next_at = match (active, &a.when) {
                    (false, _) => None,
                    (true, When::Once { run_at }) => Some(*run_at),
                    (true, when) => when.next_after(now),
                };
                save(t, &owner, &a)?;
            }
            Ok::<_, AgentError>((owner, a))
        })
        .await?;
    agents.automations().send(due_job(&owner, &a));
    Ok(a.object())
}

/// `POST …/invocations`: a manual run now, queued for the automation thread; the
/// schedule does not move.
pub async fn invoke(agents: &Arc<Agents>, owner: &str, id: &str) -> Result<Value, AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    let (owner, invocation) = agents
        .transact(move |t| {
            let a: Automation = t
                .get(Scope::owner(&owner), &id)
                .map_err(store_refusal(&id))?;
            let invocation = new_invocation(&a, "queued", None, json!({"type": "manual"}));
            record(t, &owner, invocation.clone())?;
            Ok::<_, AgentError>((owner, invocation))
        })
        .await?;
    agents.automations().send(Job::Deliver {
        owner,
        id: invocation.automation_id.clone(),
        invocation: invocation.id.clone(),
    });
    Ok(invocation.object())
}

fn new_invocation(
    a: &Automation,
    status: &str,
    scheduled_at: Option<i64>,
    source: Value,
) -> Invocation {
    Invocation {
        id: new_id("ainv_"),
        automation_id: a.id.clone(),
        created_at: now_unix(),
        status: status.into(),
        error: None,
        scheduled_at,
        session_id: None,
        skip_reason: None,
        source,
    }
}

/// Stores a new run, forgetting the oldest finished ones beyond [`MAX_RUNS_KEPT`].
fn record<T: Transaction>(
    t: &mut T,
    owner: &str,
    invocation: Invocation,
) -> Result<(), AgentError> {
    let automation = invocation.automation_id.clone();
    let scope = Scope::within(owner, &automation);
    let kept = t.list::<Invocation>(scope, &ListQuery::all())?.data;
    let mut excess = (kept.len() + 1).saturating_sub(MAX_RUNS_KEPT);
    for old in kept.iter().filter(|i| i.status != "queued") {
        if excess == 0 {
            break;
        }
        t.delete::<Invocation>(scope, &old.id)?;
        excess -= 1;
    }
    t.create(scope, invocation)?;
    Ok(())
}

fn invocation_refusal(id: &str) -> impl FnOnce(StoreError) -> AgentError + '_ {
    move |e| match e {
        StoreError::NotFound => AgentError::Rejected {
            status: 404,
            code: "not_found",
            param: Some("invocation_id".into()),
            message: format!("No invocation found with id '{id}'."),
        },
        e => AgentError::store("invocation", id, "invocation_id")(e),
    }
}

pub async fn invocation(
    agents: &Arc<Agents>,
    owner: &str,
    automation: &str,
    id: &str,
) -> Result<Value, AgentError> {
    let (owner, automation, id) = (owner.to_string(), automation.to_string(), id.to_string());
    agents
        .read(move |t| {
            t.get::<Automation>(Scope::owner(&owner), &automation)
                .map_err(store_refusal(&automation))?;
            t.get::<Invocation>(Scope::within(&owner, &automation), &id)
                .map(|i| i.object())
                .map_err(invocation_refusal(&id))
        })
        .await
}

pub async fn invocations(
    agents: &Arc<Agents>,
    owner: &str,
    automation: &str,
    after: Option<String>,
    limit: usize,
    order: Order,
) -> Result<(Vec<Value>, bool), AgentError> {
    let (owner, automation) = (owner.to_string(), automation.to_string());
    agents
        .read(move |t| {
            t.get::<Automation>(Scope::owner(&owner), &automation)
                .map_err(store_refusal(&automation))?;
            let query = ListQuery {
                after: after.as_deref(),
                limit,
                order,
            };
            let page = t
                .list::<Invocation>(Scope::within(&owner, &automation), &query)
                .map_err(|e| match e {
                    StoreError::UnknownCursor => invalid(
                        "after",
                        format!(
                            "No invocation '{}' in this list.",
                            after.as_deref().unwrap_or("")
                        ),
                    ),
                    e => AgentError::from(e),
                })?;
            Ok((
                page.data.iter().map(Object::object).collect(),
                page.has_more,
            ))
        })
        .await
}

/// A call of a session's `automations` tool (`codex_map::AUTOMATIONS_TOOL`): the agent
/// manages its own wakeups. `create` makes an automation whose target is this session
/// (its `instructions` the message of each wakeup) and whose `created_by` is the agent's
/// call; `list` shows the automations that target this session; `pause`, `resume` and
/// `delete` act on one of those. Everything else is the API's rules (limits, refusals),
/// said to the model as the call's failure.
pub async fn agent_tool(
    agents: &Arc<Agents>,
    owner: &str,
    session_id: &str,
    call_id: &str,
    arguments: &Value,
) -> Result<String, String> {
    // codex passes the model's arguments as JSON, or as their text.
    let arguments = match arguments {
        Value::String(text) => serde_json::from_str(text).unwrap_or(Value::Null),
        other => other.clone(),
    };
    let said = |e: AgentError| match e {
        AgentError::Invalid { param, message } | AgentError::Unsupported { param, message } => {
            format!("{param}: {message}")
        }
        AgentError::Rejected { message, .. } => message,
        other => format!("{other:?}"),
    };
    let text = |key: &str| {
        arguments
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let action = text("action").unwrap_or_default();
    let brief = |a: &Value| {
        let mut b = json!({"automation_id": a["id"], "name": a["name"], "type": a["type"],
                           "status": a["status"], "next_run_at": a["x_agent_sandbox"]["next_run_at"]});
        for key in ["expression", "timezone", "run_at"] {
            if let Some(v) = a.get(key) {
                b[key] = v.clone();
            }
        }
        b
    };
    match action.as_str() {
        "create" => {
            let instructions = text("instructions")
                .filter(|i| !i.trim().is_empty() && i.chars().count() <= MAX_INSTRUCTIONS)
                .ok_or("instructions: the message you receive at each wakeup is required")?;
            let mut body = Map::new();
            body.insert(
                "name".into(),
                json!(text("name").unwrap_or_else(|| "wakeup".into())),
            );
            match (
                text("expression"),
                arguments.get("delay_seconds").and_then(Value::as_i64),
            ) {
                (Some(expression), _) => {
                    body.insert("type".into(), json!("periodic"));
                    body.insert("expression".into(), json!(expression));
                    body.insert(
                        "timezone".into(),
                        json!(text("timezone").unwrap_or_else(|| "UTC".into())),
                    );
                }
                (None, Some(delay)) if delay > 0 => {
                    body.insert("type".into(), json!("once"));
                    body.insert("run_at".into(), json!(now() + delay));
                }
                (None, _) => {
                    body.insert("type".into(), json!("once"));
                    body.insert(
                        "run_at".into(),
                        arguments.get("run_at").cloned().unwrap_or(Value::Null),
                    );
                }
            }
            let target = NewTarget {
                kind: "existing_session".into(),
                shown: json!({"type": "existing_session", "session_id": session_id, "instructions": instructions}),
                delivery: json!({"session_id": session_id, "instructions": instructions}),
                session_id: Some(session_id.to_string()),
            };
            let created_by =
                json!({"type": "agent", "session_id": session_id, "tool_call_id": call_id});
            let made = create_by(agents, owner, body, target, created_by)
                .await
                .map_err(said)?;
            Ok(json!({"created": brief(&made)}).to_string())
        }
        "list" => {
            let (page, _) = list(
                agents,
                owner,
                None,
                MAX_AUTOMATIONS_PER_OWNER,
                Order::Asc,
                Some(session_id.to_string()),
            )
            .await
            .map_err(said)?;
            let shown: Vec<Value> = page.iter().map(brief).collect();
            Ok(json!({"automations": shown}).to_string())
        }
        "pause" | "resume" | "delete" => {
            let id = text("automation_id").ok_or("automation_id is required")?;
            // Only what wakes this session: an agent cannot touch its owner's others.
            let found = get(agents, owner, &id).await.map_err(said)?;
            if found["target"]["session_id"] != session_id {
                return Err(format!("No automation '{id}' wakes this session."));
            }
            let done = match action.as_str() {
                "pause" => pause(agents, owner, &id).await,
                "resume" => resume(agents, owner, &id).await,
                _ => delete(agents, owner, &id).await,
            }
            .map_err(said)?;
            Ok(match action.as_str() {
                "delete" => json!({"deleted": id}),
                _ => json!({action.as_str(): brief(&done)}),
            }
            .to_string())
        }
        "" => Err("action is required: create, list, pause, resume or delete".into()),
        other => Err(format!(
            "Unknown action '{other}': create, list, pause, resume or delete"
        )),
    }
}

/// A deleted session's agent-made automations (`created_by` that session): deleted,
/// as the session's own wakeups are nobody else's. Automations a developer pointed at
/// the session stay (they are the developer's to delete).
pub async fn forget_session(
    agents: &Arc<Agents>,
    owner: &str,
    session_id: &str,
) -> Result<(), AgentError> {
    let (owner, session) = (owner.to_string(), session_id.to_string());
    let gone = agents
        .transact(move |t| {
            let all = t.list::<Automation>(Scope::owner(&owner), &ListQuery::all())?;
            let mut gone = Vec::new();
            for a in all.data {
                if a.created_by["type"] == "agent" && a.created_by["session_id"] == session {
                    t.delete::<Automation>(Scope::owner(&owner), &a.id)?;
                    unschedule(t, &a.id)?;
                    gone.push(a.id);
                }
            }
            Ok::<_, AgentError>((owner, gone))
        })
        .await?;
    let (owner, ids) = gone;
    for id in ids {
        agents.automations().send(Job::Due {
            owner: owner.clone(),
            id,
            at: None,
        });
    }
    Ok(())
}

/// What firing an occurrence did.
#[derive(Debug, Default, PartialEq)]
pub struct Fired {
    /// The automation's next occurrence, if it stays scheduled.
    pub next: Option<i64>,
    /// The run to deliver now.
    pub deliver: Option<String>,
}

/// Fires automation `id` of `owner` if an occurrence is due at `now`, in one
/// transaction: the run's record, and the schedule moved past now (a one-time
/// automation `completed`). An automation that is gone, paused or not due yet fires
/// nothing and says when it is due.
pub fn fire<T: Transaction>(
    t: &mut T,
    owner: &str,
    id: &str,
    now: i64,
) -> Result<Fired, AgentError> {
    let scope = Scope::owner(owner);
    let mut a: Automation = match t.get(scope, id) {
        Ok(a) => a,
        Err(StoreError::NotFound) => {
            unschedule(t, id)?;
            return Ok(Fired::default());
        }
        Err(e) => return Err(e.into()),
    };
    let at = match (a.status.as_str(), a.next_at) {
        ("active", Some(at)) => at,
        _ => {
            index(t, owner, &a)?;
            return Ok(Fired::default());
        }
    };
    if at > now {
        return Ok(Fired {
            next: Some(at),
            deliver: None,
        });
    }
    let snapshot = {
        let mut object = a.object();
        if let Some(map) = object.as_object_mut() {
            map.remove("x_agent_sandbox");
        }
        object
    };
    let source = json!({"type": "automation", "automation": snapshot});
    let runs = t.list::<Invocation>(Scope::within(owner, id), &ListQuery::all())?;
    let pending = runs.data.iter().any(|i| i.status == "queued");
    let mut invocation = new_invocation(&a, "queued", Some(at), source);
    if pending {
        invocation.status = "skipped".into();
        invocation.skip_reason = Some("pending_delivery".into());
    }
    match &a.when {
        When::Periodic { .. } => a.next_at = a.when.next_after(now.max(at)),
        When::Once { .. } => {
            a.next_at = None;
            a.status = "completed".into();
            a.fired = true;
        }
    }
    save(t, owner, &a)?;
    let deliver = (!pending).then(|| invocation.id.clone());
    record(t, owner, invocation)?;
    Ok(Fired {
        next: (a.status == "active").then_some(a.next_at).flatten(),
        deliver,
    })
}

/// What a run delivers.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// A session create body.
    NewSession(Value),
    ExistingSession {
        session_id: String,
        instructions: String,
    },
}

/// The delivery of run `invocation`, if the run is still queued (it and its
/// automation may have been deleted meanwhile).
pub fn delivery<T: Transaction>(
    t: &mut T,
    owner: &str,
    id: &str,
    invocation: &str,
) -> Result<Option<Delivery>, AgentError> {
    let a: Automation = match t.get(Scope::owner(owner), id) {
        Ok(a) => a,
        Err(StoreError::NotFound) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    match t.get::<Invocation>(Scope::within(owner, id), invocation) {
        Ok(run) if run.status == "queued" => {}
        Ok(_) | Err(StoreError::NotFound) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let plain = seal::open(&binding(id), &a.target.sealed).map_err(sealing_failed)?;
    let body: Value = serde_json::from_slice(&plain)
        .map_err(|_| AgentError::Failed("a stored automation target is damaged".into()))?;
    Ok(Some(match a.target.kind.as_str() {
        "existing_session" => Delivery::ExistingSession {
            session_id: body["session_id"].as_str().unwrap_or_default().to_string(),
            instructions: body["instructions"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        },
        _ => Delivery::NewSession(body),
    }))
}

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The session was created, or took the message.
    Delivered {
        session_id: String,
    },
    Failed {
        code: String,
        message: String,
    },
}

/// Records how run `invocation` ended (nothing when it is gone).
pub fn settle<T: Transaction>(
    t: &mut T,
    owner: &str,
    id: &str,
    invocation: &str,
    outcome: Outcome,
) -> Result<(), AgentError> {
    let scope = Scope::within(owner, id);
    let mut run: Invocation = match t.get(scope, invocation) {
        Ok(run) => run,
        Err(StoreError::NotFound) | Err(StoreError::ParentNotFound) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    match outcome {
        Outcome::Delivered { session_id } => {
            run.status = "completed".into();
            run.session_id = Some(session_id);
        }
        Outcome::Failed { code, message } => {
            run.status = "failed".into();
            run.error = Some(json!({"code": code, "message": message}));
        }
    }
    t.put(scope, run)?;
    Ok(())
}

/// Every schedule entry (what the thread reads when it starts).
pub fn entries<T: Transaction>(t: &mut T) -> Result<Vec<Entry>, StoreError> {
    Ok(t.list::<Entry>(Scope::owner(SCHEDULER), &ListQuery::all())?
        .data)
}

#[cfg(test)]
mod tests;
