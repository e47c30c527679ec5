//! Conversations: a thread of items that responses continue. A turn in a conversation
//! resumes the CLI session that conversation started on its runtime (one per runtime)
//! and appends its input and output items; items added through the items API are
//! handed to the CLI, as a transcript ahead of the prompt, by the next turn.
//!
//! A conversation and each of its items are records of the store (the items a child
//! collection of the conversation), so a page of items costs that page.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::error::AgentError;
use super::input::{input_item, parse_messages};
use super::objects::{label, now_unix, Object};
use super::records::{
    new_id, Collection, ListQuery, ObjectStore, Order, Record, Scope, StoreError, Transaction,
};
use super::runtime::{Runtime, Session};
use super::surface::Agents;

/// Conversations kept at most.
pub const MAX_CONVERSATIONS: usize = 1_000;
/// Conversations one identity keeps at most.
pub const MAX_CONVERSATIONS_PER_OWNER: usize = 100;
/// Items one conversation holds at most.
pub const MAX_ITEMS: usize = 10_000;
/// Items one request adds at most.
pub const MAX_ITEMS_AT_ONCE: usize = 20;

/// What conversations and their items differ in.
pub const DIFFERENCES: [&str; 2] = ["cli_session", "store_limits"];

pub static CONVERSATIONS: Collection = Collection {
    name: "conversation",
    parent: None,
    max_total: MAX_CONVERSATIONS,
    max_per_owner: MAX_CONVERSATIONS_PER_OWNER,
    evicts: false,
};

pub static ITEMS: Collection = Collection {
    name: "item",
    parent: Some(&CONVERSATIONS),
    max_total: usize::MAX,
    max_per_owner: usize::MAX,
    evicts: false,
};

/// A conversation, without its items.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Conversation {
    pub id: String,
    pub created_at: u64,
    pub metadata: Value,
    /// The CLI session of each runtime that has taken a turn in it.
    pub sessions: Vec<Session>,
    /// The last item a turn has seen: items after it were added through the items API,
    /// and the next turn's prompt carries them. `None`: no item was seen.
    pub seen_through: Option<String>,
    /// A turn is running in it (a second one is refused until it ends).
    pub busy: bool,
}

impl Conversation {
    pub fn session(&self, runtime: Runtime) -> Option<&str> {
        self.sessions
            .iter()
            .find(|s| s.runtime == runtime)
            .map(|s| s.id.as_str())
    }

    pub fn set_session(&mut self, runtime: Runtime, id: String) {
        self.sessions.retain(|s| s.runtime != runtime);
        self.sessions.push(Session { runtime, id });
    }
}

impl Record for Conversation {
    fn collection() -> &'static Collection {
        &CONVERSATIONS
    }
    fn id(&self) -> &str {
        &self.id
    }
    /// The turn that took it ran in the server before: it is free again.
    fn on_restart(&mut self) -> bool {
        std::mem::take(&mut self.busy)
    }
}

impl Object for Conversation {
    fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
            "x_agent_sandbox": label("agent-sandbox", &DIFFERENCES),
        })
    }
}

/// One item of a conversation, in OpenAI's shape (with its `id`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConversationItem(pub Value);

impl Record for ConversationItem {
    fn collection() -> &'static Collection {
        &ITEMS
    }
    fn id(&self) -> &str {
        self.0["id"].as_str().unwrap_or_default()
    }
}

impl Object for ConversationItem {
    fn object(&self) -> Value {
        self.0.clone()
    }
}

/// `items` of a request (at most [`MAX_ITEMS_AT_ONCE`] message items) as stored items.
pub fn parse_items(items: Option<&Value>) -> Result<Vec<Value>, AgentError> {
    match items {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) if list.len() <= MAX_ITEMS_AT_ONCE => {
            Ok(parse_messages(list, "items")?
                .iter()
                .map(input_item)
                .collect())
        }
        Some(Value::Array(_)) => Err(AgentError::invalid(
            "items",
            format!("At most {MAX_ITEMS_AT_ONCE} items can be added at once."),
        )),
        Some(_) => Err(AgentError::invalid(
            "items",
            "items must be a list of message items.",
        )),
    }
}

/// The text of a stored item, for a transcript.
fn item_text(item: &Value) -> String {
    item.get("content")
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

const PARAM: &str = "conversation_id";

impl<S: ObjectStore> Agents<S> {
    /// A new conversation of `owner`'s, with `items` (from [`parse_items`]).
    pub async fn create_conversation(
        self: &Arc<Self>,
        owner: &str,
        metadata: Value,
        items: Vec<Value>,
    ) -> Result<Value, AgentError> {
        let conversation = Conversation {
            id: new_id("conv_"),
            created_at: now_unix(),
            metadata,
            sessions: Vec::new(),
            seen_through: None,
            busy: false,
        };
        let (id, owner) = (conversation.id.clone(), owner.to_string());
        let object = conversation.object();
        let refused = AgentError::store("conversation", &id, PARAM);
        self.transact(move |t| {
            t.create(Scope::owner(&owner), conversation)?;
            let items = items.into_iter().map(ConversationItem).collect();
            t.create_all(Scope::within(&owner, &id), items)
        })
        .await
        .map_err(refused)?;
        Ok(object)
    }

    /// Replaces the metadata of `owner`'s conversation `id`.
    pub async fn update_conversation(
        self: &Arc<Self>,
        owner: &str,
        id: &str,
        metadata: Value,
    ) -> Result<Value, AgentError> {
        self.update(Scope::owner(owner), id, |c: &mut Conversation| {
            c.metadata = metadata;
            c.object()
        })
        .await
        .map_err(AgentError::store("conversation", id, PARAM))
    }

    /// Forgets a conversation and its items.
    pub async fn delete_conversation(
        self: &Arc<Self>,
        owner: &str,
        id: &str,
    ) -> Result<(), AgentError> {
        self.delete::<Conversation>(Scope::owner(owner), id)
            .await
            .map(drop)
            .map_err(AgentError::store("conversation", id, PARAM))
    }

    /// Adds `items` to a conversation that runs no turn.
    pub async fn add_items(
        self: &Arc<Self>,
        owner: &str,
        id: &str,
        items: Vec<Value>,
    ) -> Result<Vec<Value>, AgentError> {
        let (owner, id) = (owner.to_string(), id.to_string());
        self.transact(move |t| {
            let stored = AgentError::store("conversation", &id, PARAM);
            let conversation = t
                .get::<Conversation>(Scope::owner(&owner), &id)
                .map_err(stored)?;
            // Items added while a turn runs would be marked seen by its end unseen.
            if conversation.busy {
                return Err(AgentError::Busy { id, param: PARAM });
            }
            let within = Scope::within(&owner, &id);
            if t.count::<ConversationItem>(within)? + items.len() > MAX_ITEMS {
                return Err(AgentError::invalid(
                    "items",
                    format!("A conversation holds at most {MAX_ITEMS} items."),
                ));
            }
            let records = items.iter().cloned().map(ConversationItem).collect();
            t.create_all(within, records)
                .map_err(AgentError::store("conversation", &id, PARAM))?;
            Ok(items)
        })
        .await
    }

    /// Removes one item; returns the conversation. The CLI's own session keeps what it
    /// saw.
    pub async fn delete_item(
        self: &Arc<Self>,
        owner: &str,
        id: &str,
        item: &str,
    ) -> Result<Value, AgentError> {
        let (owner, id, item) = (owner.to_string(), id.to_string(), item.to_string());
        self.transact(move |t| {
            let mut conversation = t
                .get::<Conversation>(Scope::owner(&owner), &id)
                .map_err(AgentError::store("conversation", &id, PARAM))?;
            let within = Scope::within(&owner, &id);
            if conversation.seen_through.as_deref() == Some(item.as_str()) {
                // What was seen now ends at the item before it.
                let before = ListQuery {
                    after: Some(&item),
                    limit: 1,
                    order: Order::Desc,
                };
                let page = t.list::<ConversationItem>(within, &before);
                conversation.seen_through = page.ok().and_then(|p| p.first_id);
                t.put(Scope::owner(&owner), conversation.clone())?;
            }
            t.delete::<ConversationItem>(within, &item)
                .map_err(AgentError::store("item", &item, "item_id"))?;
            Ok(conversation.object())
        })
        .await
    }

    /// Takes the conversation for a turn of `runtime`: marks it busy and returns the
    /// CLI session to resume, if any, and what that session has not seen (the whole
    /// conversation for a new session) as transcript lines.
    pub(super) async fn take_conversation(
        self: &Arc<Self>,
        owner: &str,
        id: &str,
        runtime: Runtime,
    ) -> Result<(Option<String>, Vec<String>), AgentError> {
        let (owner, id) = (owner.to_string(), id.to_string());
        self.transact(move |t| {
            let stored = || AgentError::store("conversation", &id, "conversation");
            let mut conversation = t
                .get::<Conversation>(Scope::owner(&owner), &id)
                .map_err(stored())?;
            if conversation.busy {
                return Err(AgentError::Busy {
                    id: id.clone(),
                    param: "conversation",
                });
            }
            let within = Scope::within(&owner, &id);
            if t.count::<ConversationItem>(within)? >= MAX_ITEMS {
                let full = StoreError::Full {
                    collection: "item",
                    limit: MAX_ITEMS,
                };
                return Err(stored()(full));
            }
            conversation.busy = true;
            let session = conversation.session(runtime).map(str::to_string);
            // A CLI session that does not exist yet has seen nothing.
            let after = match session {
                Some(_) => conversation.seen_through.clone(),
                None => None,
            };
            t.put(Scope::owner(&owner), conversation)?;
            let unseen = ListQuery {
                after: after.as_deref(),
                ..ListQuery::all()
            };
            let items = match t.list::<ConversationItem>(within, &unseen) {
                Err(StoreError::UnknownCursor) => t.list(within, &ListQuery::all())?,
                other => other?,
            };
            let lines = items
                .data
                .iter()
                .map(|ConversationItem(item)| {
                    let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                    format!("{role}: {}", item_text(item))
                })
                .collect();
            Ok((session, lines))
        })
        .await
    }

    /// Keeps the CLI session of `runtime` as soon as the CLI reports it.
    pub(super) async fn keep_session(
        self: &Arc<Self>,
        owner: &str,
        id: &str,
        runtime: Runtime,
        session: &str,
    ) {
        let session = session.to_string();
        let _ = self
            .update(Scope::owner(owner), id, move |c: &mut Conversation| {
                c.set_session(runtime, session)
            })
            .await;
    }

    /// A turn's end: its items join the conversation and everything up to them counts
    /// as seen. Items that would push it past a limit are left out (the response holds
    /// them), and what was there before counts as seen.
    pub(super) async fn end_turn(
        self: &Arc<Self>,
        owner: &str,
        id: &str,
        runtime: Runtime,
        session: Option<&str>,
        items: Vec<Value>,
    ) {
        let (owner, id) = (owner.to_string(), id.to_string());
        let session = session.map(str::to_string);
        let (first_owner, first_id, first_session) = (owner.clone(), id.clone(), session.clone());
        let appended = self
            .transact(move |t| {
                let (owner, id) = (first_owner, first_id);
                let mut conversation = t.get::<Conversation>(Scope::owner(&owner), &id)?;
                if let Some(session) = first_session {
                    conversation.set_session(runtime, session);
                }
                let items: Vec<ConversationItem> =
                    items.into_iter().map(ConversationItem).collect();
                if let Some(last) = items.last() {
                    conversation.seen_through = Some(last.id().to_string());
                }
                t.create_all(Scope::within(&owner, &id), items)?;
                t.put(Scope::owner(&owner), conversation)
            })
            .await;
        if appended.is_ok() {
            return;
        }
        // Refused (past a limit), so undone whole: the conversation is kept without them.
        let _ = self
            .transact(move |t| {
                let mut conversation = t.get::<Conversation>(Scope::owner(&owner), &id)?;
                if let Some(session) = session {
                    conversation.set_session(runtime, session);
                }
                let last = ListQuery {
                    after: None,
                    limit: 1,
                    order: Order::Desc,
                };
                let within = Scope::within(&owner, &id);
                conversation.seen_through = t.list::<ConversationItem>(within, &last)?.first_id;
                t.put(Scope::owner(&owner), conversation)
            })
            .await;
    }

    /// Frees the conversation for its next turn.
    pub(super) async fn release_conversation(self: &Arc<Self>, owner: &str, id: &str) {
        let _ = self
            .update(Scope::owner(owner), id, |c: &mut Conversation| {
                c.busy = false
            })
            .await;
    }

    /// [`Agents::release_conversation`] from where nothing can await (a dropped turn).
    pub(super) fn release_conversation_detached(self: &Arc<Self>, owner: &str, id: &str) {
        let (owner, id) = (owner.to_string(), id.to_string());
        self.transact_detached(move |t| {
            t.update(Scope::owner(&owner), &id, |c: &mut Conversation| {
                c.busy = false
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::input::{check_metadata, InputMessage};

    /// Runs `future` on a worker's runtime with a blocking pool, as the server does.
    fn run<F: std::future::Future>(future: F) -> F::Output {
        let pool =
            crate::runtime::blocking::BlockingPool::new(2, std::time::Duration::from_secs(5));
        crate::runtime::block_on(crate::runtime::IoDriver::Epoll, pool, future).unwrap()
    }

    fn message(text: &str) -> Value {
        input_item(&InputMessage {
            role: "user".into(),
            text: text.into(),
        })
    }

    #[test]
    fn a_turn_sees_what_it_has_not_seen() {
        run(async {
            let agents = Arc::new(Agents::<crate::agents::surface::AgentsStore>::default());
            let conversation = agents
                .create_conversation("a", json!({}), vec![message("one")])
                .await
                .unwrap();
            let id = conversation["id"].as_str().unwrap();
            let take = |owner: &'static str, runtime| {
                let agents = agents.clone();
                let id = id.to_string();
                async move { agents.take_conversation(owner, &id, runtime).await }
            };
            // A new session gets everything.
            let (resume, lines) = take("a", Runtime::Codex).await.unwrap();
            assert_eq!((resume, lines), (None, vec!["user: one".to_string()]));
            assert!(matches!(
                take("a", Runtime::Codex).await,
                Err(AgentError::Busy { .. })
            ));
            assert!(matches!(
                agents.add_items("a", id, vec![message("x")]).await,
                Err(AgentError::Busy { .. })
            ));
            agents
                .end_turn("a", id, Runtime::Codex, Some("T1"), vec![message("two")])
                .await;
            agents.release_conversation("a", id).await;
            let added = agents
                .add_items("a", id, vec![message("three")])
                .await
                .unwrap();
            // The session resumes and gets only what was added since.
            let (resume, lines) = take("a", Runtime::Codex).await.unwrap();
            assert_eq!(resume.as_deref(), Some("T1"));
            assert_eq!(lines, ["user: three"]);
            agents.release_conversation("a", id).await;
            // Another runtime has no session: everything.
            let (_, lines) = take("a", Runtime::QwenCode).await.unwrap();
            assert_eq!(lines.len(), 3);
            agents.release_conversation("a", id).await;
            // Deleting the last seen item moves what was seen back by one.
            let seen = agents
                .get::<Conversation>(Scope::owner("a"), id)
                .await
                .unwrap()
                .seen_through
                .unwrap();
            agents.delete_item("a", id, &seen).await.unwrap();
            let (_, lines) = take("a", Runtime::Codex).await.unwrap();
            assert_eq!(lines, ["user: three"]);
            assert_eq!(added.len(), 1);
            // A restart frees a conversation a turn had taken.
            let freed = agents
                .transact(|t| t.restart::<Conversation>())
                .await
                .unwrap();
            assert_eq!(freed, 1);
            assert!(take("a", Runtime::Codex).await.is_ok());
            // Another caller's conversation is an unknown one.
            assert!(matches!(
                take("b", Runtime::Codex).await,
                Err(AgentError::Store {
                    error: StoreError::NotFound,
                    ..
                })
            ));
        });
    }

    #[test]
    fn items_are_message_items_twenty_at_most() {
        let twenty: Vec<Value> = (0..20)
            .map(|i| json!({"role": "user", "content": format!("{i}")}))
            .collect();
        assert_eq!(
            parse_items(Some(&Value::Array(twenty.clone())))
                .unwrap()
                .len(),
            20
        );
        let mut more = twenty;
        more.push(json!("x"));
        assert!(parse_items(Some(&Value::Array(more))).is_err());
        let AgentError::Invalid { param, .. } = parse_items(Some(
            &json!([{"role": "user", "content": "x", "name": "me"}]),
        ))
        .unwrap_err() else {
            panic!("not a 400")
        };
        assert_eq!(param, "items[0].name");
        assert!(check_metadata(Some(json!({"k": 1}))).is_err());
        assert_eq!(check_metadata(None).unwrap(), json!({}));
    }
}
