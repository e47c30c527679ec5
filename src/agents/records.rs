//! The object store's contract: typed records, each owned by the caller identity that
//! created it, kept in collections (responses, conversations) and child collections
//! (a response's input items, a conversation's items) whose records belong to one
//! parent. A caller never sees another's records: a foreign id is looked up exactly
//! like an unknown one, and a list shows only the caller's own.
//!
//! [`ObjectStore`] is what a backend implements: one transaction at a time, in which
//! [`Transaction`]'s operations (create, get, put, delete, list, count) run and which
//! is undone whole when it returns an error. Records are plain serde values and every
//! operation hands out owned copies, so nobody holds a reference into the store (or a
//! lock) across an await, and a backend may keep them serialised on disk. Lists walk a
//! collection in creation order, keyed by `(collection, owner, parent, creation order)`:
//! `after` is an id cursor, so a page costs its own records, not the whole list.
//!
//! What is kept is bounded per identity, in count (per collection) and in bytes (the
//! size of the records' JSON, all collections together), and per object (a record and
//! its children). A full collection that [`Collection::evicts`] forgets its owner's
//! oldest evictable record to make room (finished responses); any other refuses. The
//! bounds are the backend's to enforce, with the same rules (see [`Limits`]).
//!
//! A store outlives the process that wrote it: [`Record::on_restart`] is how a record
//! of work in flight (a running response) is told, once, that nothing runs it any more.
//!
//! The one backend is [`super::durable::DurableStore`] (redb, on disk or in memory).
//! Its transactions are synchronous and a durable commit waits for the disk, so code
//! on a worker thread reaches the store only through
//! [`Agents::transact`](super::surface::Agents::transact) and the helpers beside it.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// One kind of record and its bounds.
#[derive(Debug)]
pub struct Collection {
    /// The record's name in errors: `response`, `conversation`, `item`.
    pub name: &'static str,
    /// The collection whose records own this one's (a conversation owns its items).
    pub parent: Option<&'static Collection>,
    /// Records of this collection the whole store keeps (roots only).
    pub max_total: usize,
    /// Records of this collection one identity keeps (roots only).
    pub max_per_owner: usize,
    /// When full (in count or in its owner's bytes), forget the owner's oldest
    /// evictable record (and its children) instead of refusing the new one.
    pub evicts: bool,
}

/// A record the store keeps: serialisable, with its own id.
pub trait Record: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {
    fn collection() -> &'static Collection;
    /// The record's id (unique within its collection).
    fn id(&self) -> &str;
    /// Whether the store may forget it to make room (in a collection that evicts).
    fn evictable(&self) -> bool {
        false
    }
    /// The server restarted: nothing of what ran in the process before runs any more.
    /// A record that describes work in flight (a response `in_progress`, a conversation
    /// taken by a turn) changes here to what is true now (`failed`, free) and returns
    /// true; the others return false (the default) and are left as they are.
    ///
    /// When the store is opened for a new server process, `agents::store` calls
    /// [`Transaction::restart`] for every record type it lists, all in one transaction,
    /// before any request is served: a new record type whose records can be in flight
    /// implements this and adds itself to that list.
    fn on_restart(&mut self) -> bool {
        false
    }
}

/// Whose records an operation sees: the caller's own, within one parent for a child
/// collection.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    pub owner: &'a str,
    pub parent: Option<&'a str>,
}

impl<'a> Scope<'a> {
    /// The caller's records of a collection without a parent.
    pub fn owner(owner: &'a str) -> Scope<'a> {
        Scope {
            owner,
            parent: None,
        }
    }

    /// The caller's records that belong to `parent`.
    pub fn within(owner: &'a str, parent: &'a str) -> Scope<'a> {
        Scope {
            owner,
            parent: Some(parent),
        }
    }
}

/// The order of a list: creation order, or its reverse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

impl Order {
    pub fn parse(text: &str) -> Option<Order> {
        match text {
            "asc" => Some(Order::Asc),
            "desc" => Some(Order::Desc),
            _ => None,
        }
    }
}

/// Which page of a list: the records after `after` (an id of that list), in `order`,
/// `limit` of them at most.
#[derive(Clone, Copy, Debug)]
pub struct ListQuery<'a> {
    pub after: Option<&'a str>,
    pub limit: usize,
    pub order: Order,
}

impl ListQuery<'_> {
    /// Every record, oldest first.
    pub fn all() -> ListQuery<'static> {
        ListQuery {
            after: None,
            limit: usize::MAX,
            order: Order::Asc,
        }
    }
}

/// One page of a list.
#[derive(Clone, Debug)]
pub struct Page<T> {
    pub data: Vec<T>,
    /// Records follow this page.
    pub has_more: bool,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
}

impl<T: Record> Page<T> {
    pub fn new(data: Vec<T>, has_more: bool) -> Page<T> {
        let first_id = data.first().map(|r| r.id().to_string());
        let last_id = data.last().map(|r| r.id().to_string());
        Page {
            data,
            has_more,
            first_id,
            last_id,
        }
    }
}

/// Byte bounds every backend enforces.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of JSON one record and its children may hold.
    pub object_bytes: usize,
    /// Bytes of JSON all of one identity's records may hold.
    pub owner_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            object_bytes: 16 * 1024 * 1024,
            owner_bytes: 64 * 1024 * 1024,
        }
    }
}

/// A bound of one identity's share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Quota {
    /// Its records hold `limit` bytes.
    Bytes { limit: usize },
    /// It keeps `limit` records of `collection`.
    Count {
        collection: &'static str,
        limit: usize,
    },
    /// An evicting collection found nothing evictable: its records that cannot be
    /// forgotten (running responses) fill the share.
    NoRoom {
        collection: &'static str,
        bytes: usize,
        count: usize,
    },
}

/// Why a store operation was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// No such record for this caller (in this parent).
    NotFound,
    /// The parent the scope names is not the caller's (or does not exist).
    ParentNotFound,
    /// `after` names no record of this list.
    UnknownCursor,
    /// A record with this id exists already.
    Exists,
    /// The store keeps `limit` records of `collection` already.
    Full {
        collection: &'static str,
        limit: usize,
    },
    /// The caller holds as much as it may.
    OverQuota(Quota),
    /// The record and its children would hold `bytes`, more than `limit`.
    TooLarge {
        collection: &'static str,
        bytes: usize,
        limit: usize,
    },
    /// The backend could not read or write its storage (the durable store's file).
    Storage(String),
}

/// Operations inside one transaction. Creating a record checks the bounds (and may
/// forget evictable records to make room); `put` replaces a record, is charged to its
/// owner and is never refused for size (records' updates are bounded by their own
/// fields). `delete` takes the record's children with it.
pub trait Transaction {
    fn create<T: Record>(&mut self, scope: Scope<'_>, record: T) -> Result<(), StoreError>;
    /// Creates several records of one scope. Children of one parent are admitted as one
    /// (their object's bound is checked for all of them before the owner's bytes), so
    /// a batch too large for its object is refused as such, whatever the owner holds.
    fn create_all<T: Record>(
        &mut self,
        scope: Scope<'_>,
        records: Vec<T>,
    ) -> Result<(), StoreError>;
    fn get<T: Record>(&mut self, scope: Scope<'_>, id: &str) -> Result<T, StoreError>;
    fn put<T: Record>(&mut self, scope: Scope<'_>, record: T) -> Result<(), StoreError>;
    fn delete<T: Record>(&mut self, scope: Scope<'_>, id: &str) -> Result<T, StoreError>;
    fn list<T: Record>(
        &mut self,
        scope: Scope<'_>,
        query: &ListQuery<'_>,
    ) -> Result<Page<T>, StoreError>;
    /// How many records of `T` the scope holds.
    fn count<T: Record>(&mut self, scope: Scope<'_>) -> Result<usize, StoreError>;
    /// Applies [`Record::on_restart`] to every record of `T` (every owner's) and writes
    /// back those it changed, charged as `put` is; returns how many changed.
    fn restart<T: Record>(&mut self) -> Result<usize, StoreError>;

    /// Reads, changes and writes back one record.
    fn update<T: Record, R>(
        &mut self,
        scope: Scope<'_>,
        id: &str,
        f: impl FnOnce(&mut T) -> R,
    ) -> Result<R, StoreError> {
        let mut record = self.get::<T>(scope, id)?;
        let result = f(&mut record);
        self.put(scope, record)?;
        Ok(result)
    }

    /// Writes `record` over the one with its id, or creates it (charged as `create`).
    fn create_or_replace<T: Record>(
        &mut self,
        scope: Scope<'_>,
        record: T,
    ) -> Result<(), StoreError> {
        match self.get::<T>(scope, record.id()) {
            Ok(_) => self.put(scope, record),
            Err(StoreError::NotFound) => self.create(scope, record),
            Err(e) => Err(e),
        }
    }
}

/// A backend of the store.
pub trait ObjectStore: Send + Sync + 'static {
    type Txn<'a>: Transaction
    where
        Self: 'a;

    /// Runs `f` as one transaction: what it did is undone when it returns an error.
    fn transact<R, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&mut Self::Txn<'_>) -> Result<R, E>,
    ) -> Result<R, E>;

    /// Runs `f`, which only reads, on a snapshot of the last commit: it waits for no
    /// write transaction (nor its commit's fsync). A write in it is refused.
    fn read<R, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&mut Self::Txn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        self.transact(f)
    }

    // One record in a transaction of its own, synchronously: for the store's own
    // tests. Everything else goes through `Agents::transact` (the blocking pool), so
    // these do not exist outside tests.
    #[cfg(test)]
    fn create<T: Record>(&self, scope: Scope<'_>, record: T) -> Result<(), StoreError> {
        self.transact(|t| t.create(scope, record))
    }

    #[cfg(test)]
    fn get<T: Record>(&self, scope: Scope<'_>, id: &str) -> Result<T, StoreError> {
        self.transact(|t| t.get(scope, id))
    }

    #[cfg(test)]
    fn update<T: Record, R>(
        &self,
        scope: Scope<'_>,
        id: &str,
        f: impl FnOnce(&mut T) -> R,
    ) -> Result<R, StoreError> {
        self.transact(|t| t.update(scope, id, f))
    }

    #[cfg(test)]
    fn delete<T: Record>(&self, scope: Scope<'_>, id: &str) -> Result<T, StoreError> {
        self.transact(|t| t.delete(scope, id))
    }

    #[cfg(test)]
    fn list<T: Record>(
        &self,
        scope: Scope<'_>,
        query: &ListQuery<'_>,
    ) -> Result<Page<T>, StoreError> {
        self.transact(|t| t.list(scope, query))
    }
}

/// The bytes of `value`'s JSON, counted without writing it anywhere.
pub fn json_size<T: Serialize + ?Sized>(value: &T) -> usize {
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
