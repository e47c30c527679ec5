//! The `/v1` objects this server keeps: responses and conversations with their items,
//! each owned by the caller identity that created it. A caller never sees another's
//! objects: a foreign id is looked up exactly like an unknown one.
//!
//! Objects live in memory, shared by every worker behind one mutex (every operation on
//! them is a few map lookups; turns run outside the lock). The number kept is bounded:
//! past [`MAX_RESPONSES`] the oldest finished response is forgotten, and past
//! [`MAX_CONVERSATIONS`] a new conversation is refused.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::Runtime;

/// Responses kept before the oldest finished one is forgotten.
pub const MAX_RESPONSES: usize = 10_000;
/// Conversations kept at most.
pub const MAX_CONVERSATIONS: usize = 1_000;
/// Items one conversation holds at most.
pub const MAX_ITEMS: usize = 10_000;

/// A response and what it needs besides its JSON.
pub struct ResponseRecord {
    pub owner: String,
    /// The Response object as served (updated while the turn runs).
    pub object: Value,
    /// The input items, with ids.
    pub input_items: Vec<Value>,
    /// The runtime and the CLI's own session id, for `previous_response_id`.
    pub session: Option<(Runtime, String)>,
    /// The running CLI's process group, while the turn runs.
    pub running: Option<i32>,
    /// Raised by cancel or delete; the running turn holds the same flag, so it reports
    /// `cancelled` even when the record is gone.
    pub cancelled: Arc<AtomicBool>,
}

/// A conversation: its object, its items, and the CLI sessions that continue it.
pub struct ConversationRecord {
    pub owner: String,
    pub object: Value,
    pub items: Vec<Value>,
    /// The CLI session of each runtime that has taken a turn in it.
    pub sessions: HashMap<Runtime, String>,
    /// Items from this index on were added through the items API, not by a turn: the
    /// CLI has not seen them, and the next turn's prompt carries them.
    pub unseen_from: usize,
    /// A turn is running in it (a second one is refused until it ends).
    pub busy: bool,
}

#[derive(Default)]
struct Inner {
    responses: HashMap<String, ResponseRecord>,
    /// Response ids, oldest first, for eviction.
    order: VecDeque<String>,
    conversations: HashMap<String, ConversationRecord>,
}

/// Why a store operation was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum StoreError {
    /// No such object for this caller.
    NotFound,
    /// The conversation is running a turn already.
    Busy,
    /// A limit of the store.
    Full(&'static str),
}

/// Every `/v1` object of this server.
#[derive(Default)]
pub struct Store {
    inner: Mutex<Inner>,
}

/// A fresh id: `prefix` and 32 hex digits from the kernel's random source.
pub fn new_id(prefix: &str) -> String {
    let mut bytes = [0u8; 16];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    let mut id = String::with_capacity(prefix.len() + 32);
    id.push_str(prefix);
    for b in bytes {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps a new response (forgetting the oldest finished one when full).
    pub fn insert_response(&self, id: String, record: ResponseRecord) {
        let mut inner = self.lock();
        if inner.responses.len() >= MAX_RESPONSES {
            let position = inner
                .order
                .iter()
                .position(|old| inner.responses.get(old).is_none_or(|r| r.running.is_none()));
            if let Some(position) = position {
                if let Some(old) = inner.order.remove(position) {
                    inner.responses.remove(&old);
                }
            }
        }
        inner.order.push_back(id.clone());
        inner.responses.insert(id, record);
    }

    /// Runs `f` on the caller's response `id`.
    pub fn with_response<T>(
        &self,
        owner: &str,
        id: &str,
        f: impl FnOnce(&mut ResponseRecord) -> T,
    ) -> Result<T, StoreError> {
        let mut inner = self.lock();
        match inner.responses.get_mut(id) {
            Some(record) if record.owner == owner => Ok(f(record)),
            _ => Err(StoreError::NotFound),
        }
    }

    /// Forgets the caller's response `id`; returns its running process group, if any.
    pub fn remove_response(&self, owner: &str, id: &str) -> Result<Option<i32>, StoreError> {
        let mut inner = self.lock();
        match inner.responses.get(id) {
            Some(record) if record.owner == owner => {}
            _ => return Err(StoreError::NotFound),
        }
        let record = inner.responses.remove(id);
        inner.order.retain(|r| r != id);
        let running = record.as_ref().and_then(|r| r.running);
        if let (Some(record), Some(_)) = (&record, running) {
            record.cancelled.store(true, Ordering::Relaxed);
        }
        Ok(running)
    }

    /// Keeps a new conversation.
    pub fn insert_conversation(
        &self,
        id: String,
        record: ConversationRecord,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        if inner.conversations.len() >= MAX_CONVERSATIONS {
            return Err(StoreError::Full("conversations"));
        }
        inner.conversations.insert(id, record);
        Ok(())
    }

    /// Runs `f` on the caller's conversation `id`.
    pub fn with_conversation<T>(
        &self,
        owner: &str,
        id: &str,
        f: impl FnOnce(&mut ConversationRecord) -> T,
    ) -> Result<T, StoreError> {
        let mut inner = self.lock();
        match inner.conversations.get_mut(id) {
            Some(record) if record.owner == owner => Ok(f(record)),
            _ => Err(StoreError::NotFound),
        }
    }

    /// Forgets the caller's conversation `id`.
    pub fn remove_conversation(&self, owner: &str, id: &str) -> Result<(), StoreError> {
        let mut inner = self.lock();
        match inner.conversations.get(id) {
            Some(record) if record.owner == owner => {
                inner.conversations.remove(id);
                Ok(())
            }
            _ => Err(StoreError::NotFound),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(owner: &str) -> ResponseRecord {
        ResponseRecord {
            owner: owner.into(),
            object: Value::Null,
            input_items: Vec::new(),
            session: None,
            running: None,
            cancelled: Arc::default(),
        }
    }

    #[test]
    fn a_foreign_id_is_an_unknown_id() {
        let store = Store::default();
        store.insert_response("resp_1".into(), response("alice"));
        assert!(store.with_response("alice", "resp_1", |_| ()).is_ok());
        assert_eq!(
            store.with_response("bob", "resp_1", |_| ()),
            Err(StoreError::NotFound)
        );
        assert_eq!(
            store.remove_response("bob", "resp_1"),
            Err(StoreError::NotFound)
        );
        assert_eq!(store.remove_response("alice", "resp_1"), Ok(None));
        assert_eq!(
            store.with_response("alice", "resp_1", |_| ()),
            Err(StoreError::NotFound)
        );
    }

    #[test]
    fn ids_are_fresh() {
        let a = new_id("resp_");
        assert!(a.starts_with("resp_") && a.len() == 37);
        assert_ne!(a, new_id("resp_"));
    }

    #[test]
    fn the_oldest_finished_response_goes_first() {
        let store = Store::default();
        let mut running = response("a");
        running.running = Some(1);
        store.insert_response("first".into(), running);
        for i in 0..MAX_RESPONSES {
            store.insert_response(format!("r{i}"), response("a"));
        }
        assert!(
            store.with_response("a", "first", |_| ()).is_ok(),
            "a running one stays"
        );
        assert!(store.with_response("a", "r0", |_| ()).is_err());
        assert!(store.with_response("a", "r1", |_| ()).is_ok());
    }
}
