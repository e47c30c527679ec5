//! The `/v1` objects this server keeps: responses and conversations with their items,
//! each owned by the caller identity that created it. A caller never sees another's
//! objects: a foreign id is looked up exactly like an unknown one.
//!
//! Objects live in memory, shared by every worker behind one mutex (every operation on
//! them is a few map lookups; turns run outside the lock). What is kept is bounded,
//! overall and per identity, in count and in bytes (the size of the objects' JSON):
//! past [`MAX_RESPONSES`] (or an identity's [`MAX_RESPONSES_PER_OWNER`], or its
//! [`MAX_BYTES_PER_OWNER`]) the oldest finished response is forgotten; a conversation
//! past [`MAX_CONVERSATIONS`], [`MAX_CONVERSATIONS_PER_OWNER`] or the identity's bytes is
//! refused ([`StoreError::OverQuota`]), and an object that would outgrow
//! [`MAX_OBJECT_BYTES`] on its own is refused ([`StoreError::TooLarge`]).

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
/// Conversations one identity keeps at most.
pub const MAX_CONVERSATIONS_PER_OWNER: usize = 100;
/// Responses one identity keeps before its oldest finished one is forgotten.
pub const MAX_RESPONSES_PER_OWNER: usize = 1_000;
/// Bytes of JSON one conversation (its object and items) or one response (its object
/// and input items) may hold.
pub const MAX_OBJECT_BYTES: usize = 16 * 1024 * 1024;
/// Bytes of JSON all of one identity's conversations and responses may hold.
pub const MAX_BYTES_PER_OWNER: usize = 64 * 1024 * 1024;

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
    /// The bytes each object is counted for, by id (conversation and response ids
    /// differ in their prefix).
    sizes: HashMap<String, usize>,
    /// What each identity holds.
    usage: HashMap<String, Usage>,
}

/// One identity's share of the store.
#[derive(Default, Debug, Clone, Copy)]
struct Usage {
    conversations: usize,
    responses: usize,
    bytes: usize,
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
    /// The caller holds as much as it may (a count or its bytes); the message says
    /// which, and how to make room.
    OverQuota(String),
    /// The object would be larger than [`MAX_OBJECT_BYTES`] on its own.
    TooLarge(String),
}

/// The bytes of `value`'s JSON, counted without writing it anywhere.
fn json_size(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

fn conversation_size(record: &ConversationRecord) -> usize {
    json_size(&record.object) + record.items.iter().map(json_size).sum::<usize>()
}

fn response_size(record: &ResponseRecord) -> usize {
    json_size(&record.object) + record.input_items.iter().map(json_size).sum::<usize>()
}

fn mib(bytes: usize) -> usize {
    bytes / (1024 * 1024)
}

impl Inner {
    fn usage(&mut self, owner: &str) -> &mut Usage {
        self.usage.entry(owner.to_string()).or_default()
    }

    /// Forgets response `id`, giving back what its owner was counted for.
    fn forget_response(&mut self, id: &str) -> Option<ResponseRecord> {
        let record = self.responses.remove(id)?;
        self.order.retain(|r| r != id);
        let size = self.sizes.remove(id).unwrap_or(0);
        let usage = self.usage(&record.owner);
        usage.responses = usage.responses.saturating_sub(1);
        usage.bytes = usage.bytes.saturating_sub(size);
        Some(record)
    }

    /// The oldest finished response of `owner` (any owner when `None`), other than
    /// `keep`.
    fn oldest_finished(&self, owner: Option<&str>, keep: &str) -> Option<String> {
        self.order
            .iter()
            .find(|id| {
                id.as_str() != keep
                    && self
                        .responses
                        .get(id.as_str())
                        .is_some_and(|r| r.running.is_none() && owner.is_none_or(|o| r.owner == o))
            })
            .cloned()
    }

    /// Forgets `owner`'s oldest finished responses until it holds at most `bytes` and
    /// fewer than `count` responses; false when its running ones alone exceed that.
    fn make_room(&mut self, owner: &str, keep: &str, bytes: usize, count: usize) -> bool {
        loop {
            let usage = self.usage.get(owner).copied().unwrap_or_default();
            if usage.bytes <= bytes && usage.responses < count {
                return true;
            }
            match self.oldest_finished(Some(owner), keep) {
                Some(old) => {
                    self.forget_response(&old);
                }
                None => return false,
            }
        }
    }
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

    /// Keeps a new response, forgetting the oldest finished one when the store is
    /// full, and the owner's oldest finished ones while the owner is at its count or
    /// byte limit. Refused when the response alone is too large, or when the owner's
    /// running responses alone fill its share.
    pub fn insert_response(&self, id: String, record: ResponseRecord) -> Result<(), StoreError> {
        let size = response_size(&record);
        if size > MAX_OBJECT_BYTES {
            return Err(StoreError::TooLarge(format!(
                "This response's input is {} MiB; a response may hold at most {} MiB.",
                mib(size),
                mib(MAX_OBJECT_BYTES)
            )));
        }
        let mut inner = self.lock();
        let owner = record.owner.clone();
        if !inner.make_room(
            &owner,
            &id,
            MAX_BYTES_PER_OWNER.saturating_sub(size),
            MAX_RESPONSES_PER_OWNER,
        ) {
            return Err(StoreError::OverQuota(format!(
                "Your running responses fill your share of this server ({} MiB, {MAX_RESPONSES_PER_OWNER} responses); wait for one to end or cancel one.",
                mib(MAX_BYTES_PER_OWNER)
            )));
        }
        if inner.responses.len() >= MAX_RESPONSES {
            if let Some(old) = inner.oldest_finished(None, &id) {
                inner.forget_response(&old);
            }
        }
        inner.order.push_back(id.clone());
        inner.sizes.insert(id.clone(), size);
        let usage = inner.usage(&owner);
        usage.responses += 1;
        usage.bytes += size;
        inner.responses.insert(id, record);
        Ok(())
    }

    /// Runs `f` on the caller's response `id`.
    pub fn with_response<T>(
        &self,
        owner: &str,
        id: &str,
        f: impl FnOnce(&mut ResponseRecord) -> T,
    ) -> Result<T, StoreError> {
        let mut inner = self.lock();
        let (result, finished) = match inner.responses.get_mut(id) {
            Some(record) if record.owner == owner => {
                let was_running = record.running.is_some();
                let result = f(record);
                // A turn's end is where a response grows (its output): count it again.
                let finished =
                    (was_running && record.running.is_none()).then(|| response_size(record));
                (result, finished)
            }
            _ => return Err(StoreError::NotFound),
        };
        if let Some(size) = finished {
            let old = inner.sizes.insert(id.to_string(), size).unwrap_or(0);
            let usage = inner.usage(owner);
            usage.bytes = (usage.bytes + size).saturating_sub(old);
            // The turn has happened: its response stays, older ones make room.
            inner.make_room(owner, id, MAX_BYTES_PER_OWNER, usize::MAX);
        }
        Ok(result)
    }

    /// Forgets the caller's response `id`; returns its running process group, if any.
    pub fn remove_response(&self, owner: &str, id: &str) -> Result<Option<i32>, StoreError> {
        let mut inner = self.lock();
        match inner.responses.get(id) {
            Some(record) if record.owner == owner => {}
            _ => return Err(StoreError::NotFound),
        }
        let record = inner.forget_response(id);
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
        let size = conversation_size(&record);
        if size > MAX_OBJECT_BYTES {
            return Err(StoreError::TooLarge(format!(
                "These items are {} MiB; a conversation may hold at most {} MiB.",
                mib(size),
                mib(MAX_OBJECT_BYTES)
            )));
        }
        let mut inner = self.lock();
        if inner.conversations.len() >= MAX_CONVERSATIONS {
            return Err(StoreError::Full("conversations"));
        }
        let usage = inner.usage(&record.owner);
        if usage.conversations >= MAX_CONVERSATIONS_PER_OWNER {
            return Err(StoreError::OverQuota(format!(
                "You keep {MAX_CONVERSATIONS_PER_OWNER} conversations, the most one caller may; delete some first."
            )));
        }
        if usage.bytes + size > MAX_BYTES_PER_OWNER {
            return Err(over_bytes());
        }
        usage.conversations += 1;
        usage.bytes += size;
        inner.sizes.insert(id.clone(), size);
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
        let counted = inner.sizes.get(id).copied().unwrap_or(0);
        let held = inner.usage.get(owner).map_or(0, |u| u.bytes);
        let Some(record) = inner.conversations.get_mut(id) else {
            return Err(StoreError::NotFound);
        };
        if record.owner != owner {
            return Err(StoreError::NotFound);
        }
        let before = record.items.len();
        let result = f(record);
        // Items are only ever appended, or removed: an append is counted by what was
        // added (the common case costs its own size), anything else by a recount.
        let size = if record.items.len() > before {
            counted + record.items[before..].iter().map(json_size).sum::<usize>()
        } else if record.items.len() < before {
            conversation_size(record)
        } else {
            counted
        };
        if size > counted {
            let refusal = if size > MAX_OBJECT_BYTES {
                Some(StoreError::TooLarge(format!(
                    "This conversation would hold {} MiB; a conversation may hold at most {} MiB.",
                    mib(size),
                    mib(MAX_OBJECT_BYTES)
                )))
            } else if held + size - counted > MAX_BYTES_PER_OWNER {
                Some(over_bytes())
            } else {
                None
            };
            if let Some(refusal) = refusal {
                // What was added goes: the store never holds more than it allows.
                record.items.truncate(before);
                record.unseen_from = record.unseen_from.min(before);
                return Err(refusal);
            }
        }
        inner.sizes.insert(id.to_string(), size);
        let usage = inner.usage(owner);
        usage.bytes = (usage.bytes + size).saturating_sub(counted);
        Ok(result)
    }

    /// Forgets the caller's conversation `id`.
    pub fn remove_conversation(&self, owner: &str, id: &str) -> Result<(), StoreError> {
        let mut inner = self.lock();
        match inner.conversations.get(id) {
            Some(record) if record.owner == owner => {
                inner.conversations.remove(id);
                let size = inner.sizes.remove(id).unwrap_or(0);
                let usage = inner.usage(owner);
                usage.conversations = usage.conversations.saturating_sub(1);
                usage.bytes = usage.bytes.saturating_sub(size);
                Ok(())
            }
            _ => Err(StoreError::NotFound),
        }
    }
}

fn over_bytes() -> StoreError {
    StoreError::OverQuota(format!(
        "Your conversations and responses hold {} MiB, the most one caller may keep; delete some first.",
        mib(MAX_BYTES_PER_OWNER)
    ))
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
        store
            .insert_response("resp_1".into(), response("alice"))
            .unwrap();
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
        store.insert_response("first".into(), running).unwrap();
        for i in 0..MAX_RESPONSES {
            // Spread over owners, so the per-owner count does not decide here.
            let owner = format!("o{}", i % 20);
            store
                .insert_response(format!("r{i}"), response(&owner))
                .unwrap();
        }
        assert!(
            store.with_response("a", "first", |_| ()).is_ok(),
            "a running one stays"
        );
        assert!(store.with_response("o0", "r0", |_| ()).is_err());
        assert!(store.with_response("o1", "r1", |_| ()).is_ok());
    }

    fn conversation(owner: &str, item_bytes: usize) -> ConversationRecord {
        ConversationRecord {
            owner: owner.into(),
            object: Value::Null,
            items: vec![Value::String("x".repeat(item_bytes))],
            sessions: HashMap::new(),
            unseen_from: 1,
            busy: false,
        }
    }

    #[test]
    fn each_owner_has_a_byte_and_count_share() {
        let store = Store::default();
        let piece = 10 * 1024 * 1024;
        let fit = MAX_BYTES_PER_OWNER / (piece + 2);
        for i in 0..fit {
            store
                .insert_conversation(format!("conv_{i}"), conversation("a", piece))
                .unwrap();
        }
        assert!(matches!(
            store.insert_conversation("conv_x".into(), conversation("a", piece)),
            Err(StoreError::OverQuota(_))
        ));
        // Another identity has its own share; an object alone may be too large.
        store
            .insert_conversation("conv_b".into(), conversation("b", piece))
            .unwrap();
        assert!(matches!(
            store.insert_conversation("conv_big".into(), conversation("b", MAX_OBJECT_BYTES)),
            Err(StoreError::TooLarge(_))
        ));
        // Growing past the object limit is refused and undone.
        let grown = store.with_conversation("b", "conv_b", |c| {
            c.items.push(Value::String("y".repeat(piece)));
            c.unseen_from = 2;
        });
        assert!(matches!(grown, Err(StoreError::TooLarge(_))));
        assert_eq!(
            store.with_conversation("b", "conv_b", |c| (c.items.len(), c.unseen_from)),
            Ok((1, 1))
        );
        // Deleting gives the share back.
        store.remove_conversation("a", "conv_0").unwrap();
        store
            .insert_conversation("conv_again".into(), conversation("a", piece))
            .unwrap();
        // And the count: a hundred small ones at most.
        for i in 0..MAX_CONVERSATIONS_PER_OWNER {
            store
                .insert_conversation(format!("c_{i}"), conversation("c", 1))
                .unwrap();
        }
        assert!(matches!(
            store.insert_conversation("c_x".into(), conversation("c", 1)),
            Err(StoreError::OverQuota(_))
        ));
    }

    #[test]
    fn an_owner_past_its_share_forgets_its_oldest_finished_responses() {
        let store = Store::default();
        let big = |owner: &str| ResponseRecord {
            input_items: vec![Value::String("z".repeat(10 * 1024 * 1024))],
            ..response(owner)
        };
        for i in 0..10 {
            store.insert_response(format!("r{i}"), big("a")).unwrap();
        }
        assert!(store.with_response("a", "r0", |_| ()).is_err(), "forgotten");
        assert!(store.with_response("a", "r9", |_| ()).is_ok());
        let mut running = big("b");
        running.running = Some(1);
        for i in 0..6 {
            let mut r = big("b");
            r.running = Some(1);
            store.insert_response(format!("b{i}"), r).unwrap();
        }
        assert!(matches!(
            store.insert_response("b_x".into(), running),
            Err(StoreError::OverQuota(_))
        ));
    }
}
