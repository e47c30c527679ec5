//! The agents' [`ObjectStore`]: every record in one redb database, the file
//! `<state_dir>/agents.redb` of the running server (see [`super::store`]), or redb's
//! in-memory backend when that file cannot be opened (and in unit tests). A store
//! transaction is one redb write transaction, committed when it returns `Ok` and
//! something changed, and aborted (nothing written) when it returns an error; its caller
//! hears of it once it is durable, which commits made at the same time share (group
//! commit: one fsync for all of them, see [`Syncs`]). redb takes one writer at a time,
//! which serialises transactions. A read ([`ObjectStore::read`]) is a redb read transaction: a snapshot
//! of the last commit, which waits for no writer (nor its fsync); a write in it is
//! refused.
//!
//! Records are kept as their JSON, with their owner, parent, creation order and
//! evictability beside it; lists are range scans of an index keyed by `(collection,
//! owner, parent, creation order)`, so a page reads its own records and nothing holds
//! a collection in memory. The counts and byte totals the bounds need are kept in the
//! file as well, updated in the same transaction, so they survive a restart.
//!
//! A commit waits for the disk (see `docs/architecture.md`, "Agents store: redb", for
//! what that costs per write): the store is called synchronously, so callers on a
//! worker go through [`Agents::transact`](super::surface::Agents::transact), which runs
//! the transaction on the blocking pool.

use std::fs::{DirBuilder, OpenOptions};
use std::marker::PhantomData;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use redb::backends::InMemoryBackend;
#[cfg(test)]
use redb::ReadableTableMetadata;
use redb::{
    Database, DatabaseError, Durability, ReadTransaction, ReadableDatabase, ReadableTable,
    StorageError as RedbStorage, TableDefinition, WriteTransaction,
};

use super::records::{
    Collection, Limits, ListQuery, ObjectStore, Order, Page, Quota, Record, Scope, StoreError,
    Transaction,
};

/// `(collection, id)` → `(owner, parent or "", creation order, evictable, JSON)`.
const RECORDS: TableDefinition<(&str, &str), Stored> = TableDefinition::new("records");
/// A record on disk: `(owner, parent or "", creation order, evictable, JSON)`.
type Stored = (&'static str, &'static str, u64, bool, &'static str);
/// `(collection, owner, parent or "", creation order)` → id: what lists walk.
const LISTED: TableDefinition<(&str, &str, &str, u64), &str> = TableDefinition::new("listed");
/// `(collection, creation order)` → id of every record without a parent, for eviction
/// across owners.
const ROOTS: TableDefinition<(&str, u64), &str> = TableDefinition::new("roots");
/// The child collections seen so far (child → parent), for deleting a record's children.
const KINDS: TableDefinition<&str, &str> = TableDefinition::new("kinds");
/// `(kind, a, b)` → count: `("bytes", owner, "")`, `("owned", collection, owner)`,
/// `("total", collection, "")`, `("tree", root collection, root id)`, `("seq", "", "")`.
const COUNTERS: TableDefinition<(&str, &str, &str), u64> = TableDefinition::new("counters");

/// The page cache redb may hold: records live on disk, not in memory.
const CACHE_BYTES: usize = 4 * 1024 * 1024;

fn storage(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Storage(e.into().to_string())
}

trait OrStorage<T> {
    fn or_storage(self) -> Result<T, StoreError>;
}

impl<T, E: Into<redb::Error>> OrStorage<T> for Result<T, E> {
    fn or_storage(self) -> Result<T, StoreError> {
        self.map_err(storage)
    }
}

/// What is kept beside a record's JSON.
struct Meta {
    owner: String,
    parent: Option<String>,
    seq: u64,
    size: usize,
    evictable: bool,
}

/// The key of the record whose object a record counts toward: its parent, or itself.
fn root_of<'a>(
    collection: (&'a str, Option<&'a str>),
    parent: Option<&'a str>,
    id: &'a str,
) -> (&'a str, &'a str) {
    match (collection.1, parent) {
        (Some(parent_name), Some(parent_id)) => (parent_name, parent_id),
        _ => (collection.0, id),
    }
}

/// A collection's name and its parent's, which is all the disk keeps of it.
fn names(collection: &'static Collection) -> (&'static str, Option<&'static str>) {
    (collection.name, collection.parent.map(|p| p.name))
}

/// Every record, in one redb database.
pub struct DurableStore {
    db: Database,
    limits: Limits,
    syncs: Syncs,
}

/// Group commit. Each write transaction commits without waiting for the disk
/// (`Durability::None`); before its caller hears of it, one transaction with
/// `Durability::Immediate` (whose fsync makes every commit before it durable) runs for
/// all the commits made meanwhile: the first caller to find none running starts it,
/// the others wait for it. Writers that come while one fsync runs share the next one.
#[derive(Default)]
struct Syncs {
    state: std::sync::Mutex<SyncState>,
    done: std::sync::Condvar,
}

#[derive(Default)]
struct SyncState {
    /// Commits made so far (not yet durable, or durable).
    committed: u64,
    /// Of those, how many a durable commit covers.
    durable: u64,
    /// A durable commit is running.
    syncing: bool,
}

/// The counter the durable commit of a group writes (a commit with nothing changed is
/// not guaranteed to reach the disk).
const SYNC_ROW: (&str, &str, &str) = ("sync", "", "");

/// Why the store's file could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// Its directory or the file itself could not be made or opened (a read-only file
    /// system, a file where the directory should be, no permission).
    Io(std::io::Error),
    /// Another process holds the file open: another server on the same state directory.
    Locked,
    /// The file is not a store this build can read: damaged, or another program's.
    Damaged(String),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Io(e) => write!(f, "{e}"),
            OpenError::Locked => write!(f, "another process has it open"),
            OpenError::Damaged(why) => write!(f, "it is not a readable store ({why})"),
        }
    }
}

/// The in-memory store with the default bounds: unit tests' store.
impl Default for DurableStore {
    fn default() -> DurableStore {
        DurableStore::in_memory(Limits::default())
    }
}

impl DurableStore {
    /// Opens (or creates) the store at `path`, its directory created with mode 0700 and
    /// the file with 0600.
    pub fn open(path: &Path, limits: Limits) -> Result<DurableStore, OpenError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(OpenError::Io)?;
        }
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(OpenError::Io)?;
        // redb checks what it reads, but a damaged file may still make it panic ("where
        // a plain open may panic", its docs say): that is a file to set aside, not a
        // server that cannot start.
        let opened = std::panic::catch_unwind(|| {
            Database::builder().set_cache_size(CACHE_BYTES).create(path)
        });
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(DatabaseError::DatabaseAlreadyOpen)) => return Err(OpenError::Locked),
            // redb words "not a redb file" as invalid data.
            Ok(Err(DatabaseError::Storage(RedbStorage::Io(e))))
                if e.kind() != std::io::ErrorKind::InvalidData =>
            {
                return Err(OpenError::Io(e))
            }
            Ok(Err(e)) => return Err(OpenError::Damaged(e.to_string())),
            Err(_) => return Err(OpenError::Damaged("reading it failed".into())),
        };
        DurableStore::with_tables(db, limits).map_err(|e| match e {
            StoreError::Storage(why) => OpenError::Damaged(why),
            other => OpenError::Damaged(format!("{other:?}")),
        })
    }

    /// A store in memory (redb's in-memory backend): the same rules, nothing kept past
    /// the process.
    pub fn in_memory(limits: Limits) -> DurableStore {
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create_with_backend(InMemoryBackend::new())
            .expect("an in-memory redb database opens");
        DurableStore::with_tables(db, limits).expect("an in-memory redb database takes tables")
    }

    fn with_tables(db: Database, limits: Limits) -> Result<DurableStore, StoreError> {
        // Every table exists from the start, so reads never meet a missing one.
        let txn = db.begin_write().or_storage()?;
        txn.open_table(RECORDS).or_storage()?;
        txn.open_table(LISTED).or_storage()?;
        txn.open_table(ROOTS).or_storage()?;
        txn.open_table(KINDS).or_storage()?;
        txn.open_table(COUNTERS).or_storage()?;
        txn.commit().or_storage()?;
        Ok(DurableStore {
            db,
            limits,
            syncs: Syncs::default(),
        })
    }

    /// Returns once the commit this thread has just made is durable (see [`Syncs`]).
    fn made_durable(&self) -> Result<(), StoreError> {
        let lock = || self.syncs.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut state = lock();
        state.committed += 1;
        let mine = state.committed;
        loop {
            if state.durable >= mine {
                return Ok(());
            }
            if !state.syncing {
                state.syncing = true;
                let covers = state.committed;
                drop(state);
                let synced = self.sync_commit();
                state = lock();
                state.syncing = false;
                if synced.is_ok() {
                    state.durable = state.durable.max(covers);
                }
                self.syncs.done.notify_all();
                // A failed fsync is this caller's answer; a waiter tries again.
                synced?;
                continue;
            }
            state = self
                .syncs
                .done
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// One durable commit: every commit before it is on disk when it returns.
    fn sync_commit(&self) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write().or_storage()?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| StoreError::Storage(e.to_string()))?;
        {
            let mut table = txn.open_table(COUNTERS).or_storage()?;
            let next = table.get(SYNC_ROW).or_storage()?.map_or(0, |v| v.value()) + 1;
            table.insert(SYNC_ROW, next).or_storage()?;
        }
        txn.commit().or_storage()
    }

    /// How many records the file holds (all collections).
    #[cfg(test)]
    fn len(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().or_storage()?;
        txn.open_table(RECORDS).or_storage()?.len().or_storage()
    }
}

/// Which redb transaction a store transaction is.
// One lives on the stack per store transaction: its size costs nothing next to the
// transaction's own work, and boxing the write variant would allocate on every write.
#[allow(clippy::large_enum_variant)]
enum Access {
    Write(WriteTransaction),
    Read(ReadTransaction),
}

/// Runs `$body` with `$table` bound to table `$def` of `$self`'s transaction, whichever
/// kind it is (both kinds' tables read alike).
macro_rules! reading {
    ($self:ident, $def:expr, |$table:ident| $body:block) => {
        match &$self.txn {
            Access::Write(txn) => {
                let $table = txn.open_table($def).or_storage()?;
                $body
            }
            Access::Read(txn) => {
                let $table = txn.open_table($def).or_storage()?;
                $body
            }
        }
    };
}

/// A transaction of the [`DurableStore`]: one redb write transaction, or a read one.
pub struct DurableTxn<'a> {
    txn: Access,
    limits: Limits,
    /// Something was written: commit (and fsync); otherwise abort, which costs nothing.
    dirty: bool,
    _store: PhantomData<&'a DurableStore>,
}

impl ObjectStore for DurableStore {
    type Txn<'a> = DurableTxn<'a>;

    fn transact<R, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&mut DurableTxn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        let mut txn = self.db.begin_write().or_storage()?;
        // Durable once the group's commit is: `made_durable` below, before returning.
        txn.set_durability(Durability::None)
            .map_err(|e| StoreError::Storage(e.to_string()))?;
        let mut txn = DurableTxn {
            txn: Access::Write(txn),
            limits: self.limits,
            dirty: false,
            _store: PhantomData,
        };
        let result = f(&mut txn);
        if let Access::Write(write) = txn.txn {
            match (&result, txn.dirty) {
                (Ok(_), true) => {
                    write.commit().or_storage()?;
                    self.made_durable()?;
                }
                _ => write.abort().or_storage()?,
            }
        }
        result
    }

    fn read<R, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&mut DurableTxn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        let txn = self.db.begin_read().or_storage()?;
        let mut txn = DurableTxn {
            txn: Access::Read(txn),
            limits: self.limits,
            dirty: false,
            _store: PhantomData,
        };
        f(&mut txn)
    }
}

impl DurableTxn<'_> {
    /// The write transaction; a read one refuses every write.
    fn w(&self) -> Result<&WriteTransaction, StoreError> {
        match &self.txn {
            Access::Write(txn) => Ok(txn),
            Access::Read(_) => Err(StoreError::Storage(
                "a write in a read transaction (a store defect)".into(),
            )),
        }
    }

    fn counter(&self, kind: &str, a: &str, b: &str) -> Result<u64, StoreError> {
        reading!(self, COUNTERS, |table| {
            let value = table.get((kind, a, b)).or_storage()?.map(|v| v.value());
            Ok(value.unwrap_or(0))
        })
    }

    fn add(&mut self, kind: &str, a: &str, b: &str, n: u64) -> Result<(), StoreError> {
        let value = self.counter(kind, a, b)? + n;
        self.set(kind, a, b, value)
    }

    fn sub(&mut self, kind: &str, a: &str, b: &str, n: u64) -> Result<(), StoreError> {
        let value = self.counter(kind, a, b)?.saturating_sub(n);
        self.set(kind, a, b, value)
    }

    fn set(&mut self, kind: &str, a: &str, b: &str, value: u64) -> Result<(), StoreError> {
        self.dirty = true;
        let mut table = self.w()?.open_table(COUNTERS).or_storage()?;
        match value {
            0 => table.remove((kind, a, b)).or_storage()?,
            n => table.insert((kind, a, b), n).or_storage()?,
        };
        Ok(())
    }

    fn meta(&self, name: &str, id: &str) -> Result<Option<Meta>, StoreError> {
        reading!(self, RECORDS, |table| {
            let Some(guard) = table.get((name, id)).or_storage()? else {
                return Ok(None);
            };
            let (owner, parent, seq, evictable, json) = guard.value();
            Ok(Some(Meta {
                owner: owner.to_string(),
                parent: (!parent.is_empty()).then(|| parent.to_string()),
                seq,
                size: json.len(),
                evictable,
            }))
        })
    }

    fn value<T: Record>(&self, id: &str) -> Result<T, StoreError> {
        reading!(self, RECORDS, |table| {
            let guard = table
                .get((T::collection().name, id))
                .or_storage()?
                .ok_or(StoreError::NotFound)?;
            let (.., json) = guard.value();
            serde_json::from_str(json).map_err(|e| StoreError::Storage(format!("record {id}: {e}")))
        })
    }

    /// Keeps a record, with every index and count.
    fn insert(
        &mut self,
        collection: &'static Collection,
        id: &str,
        meta: &Meta,
        json: &str,
    ) -> Result<(), StoreError> {
        self.dirty = true;
        let name = collection.name;
        let parent = meta.parent.as_deref().unwrap_or("");
        let owner = meta.owner.as_str();
        let value = (owner, parent, meta.seq, meta.evictable, json);
        self.w()?
            .open_table(RECORDS)
            .or_storage()?
            .insert((name, id), value)
            .or_storage()?;
        self.w()?
            .open_table(LISTED)
            .or_storage()?
            .insert((name, owner, parent, meta.seq), id)
            .or_storage()?;
        match (meta.parent.is_none(), collection.parent) {
            (true, _) => {
                self.w()?
                    .open_table(ROOTS)
                    .or_storage()?
                    .insert((name, meta.seq), id)
                    .or_storage()?;
            }
            (false, Some(p)) => {
                self.w()?
                    .open_table(KINDS)
                    .or_storage()?
                    .insert(name, p.name)
                    .or_storage()?;
            }
            (false, None) => {}
        }
        let size = meta.size as u64;
        self.add("bytes", owner, "", size)?;
        self.add("owned", name, owner, 1)?;
        self.add("total", name, "", 1)?;
        let (root_name, root_id) = root_of(names(collection), meta.parent.as_deref(), id);
        self.add("tree", root_name, root_id, size)
    }

    /// Forgets one record (not its children), with every index and count.
    fn remove(&mut self, collection: (&str, Option<&str>), id: &str) -> Result<(), StoreError> {
        let name = collection.0;
        let Some(meta) = self.meta(name, id)? else {
            return Ok(());
        };
        self.dirty = true;
        let parent = meta.parent.as_deref().unwrap_or("");
        let owner = meta.owner.as_str();
        self.w()?
            .open_table(RECORDS)
            .or_storage()?
            .remove((name, id))
            .or_storage()?;
        self.w()?
            .open_table(LISTED)
            .or_storage()?
            .remove((name, owner, parent, meta.seq))
            .or_storage()?;
        let size = meta.size as u64;
        if meta.parent.is_none() {
            self.w()?
                .open_table(ROOTS)
                .or_storage()?
                .remove((name, meta.seq))
                .or_storage()?;
            self.set("tree", name, id, 0)?;
        } else {
            let (root_name, root_id) = root_of(collection, meta.parent.as_deref(), id);
            self.sub("tree", root_name, root_id, size)?;
        }
        self.sub("bytes", owner, "", size)?;
        self.sub("owned", name, owner, 1)?;
        self.sub("total", name, "", 1)
    }

    /// The ids of a list's range `(collection, owner, parent, low..=high)`.
    fn listed(
        &self,
        name: &str,
        owner: &str,
        parent: &str,
        seqs: std::ops::RangeInclusive<u64>,
        order: Order,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        reading!(self, LISTED, |table| {
            let range = table
                .range((name, owner, parent, *seqs.start())..=(name, owner, parent, *seqs.end()))
                .or_storage()?;
            let mut ids = Vec::new();
            let mut push =
                |entry: Result<(redb::AccessGuard<'_, _>, redb::AccessGuard<'_, &str>), _>| {
                    let (_, id) = entry.or_storage()?;
                    ids.push(id.value().to_string());
                    Ok::<_, StoreError>(ids.len() < limit)
                };
            match order {
                Order::Asc => {
                    for entry in range {
                        if !push(entry)? {
                            break;
                        }
                    }
                }
                Order::Desc => {
                    for entry in range.rev() {
                        if !push(entry)? {
                            break;
                        }
                    }
                }
            }
            Ok(ids)
        })
    }

    /// Forgets a record and its children.
    fn remove_tree(
        &mut self,
        collection: &'static Collection,
        owner: &str,
        id: &str,
    ) -> Result<(), StoreError> {
        let kinds: Vec<String> = {
            let table = self.w()?.open_table(KINDS).or_storage()?;
            let mut kinds = Vec::new();
            for entry in table.iter().or_storage()? {
                let (child, parent) = entry.or_storage()?;
                if parent.value() == collection.name {
                    kinds.push(child.value().to_string());
                }
            }
            kinds
        };
        for kind in kinds {
            let children = self.listed(&kind, owner, id, 0..=u64::MAX, Order::Asc, usize::MAX)?;
            for child in children {
                self.remove((&kind, Some(collection.name)), &child)?;
            }
        }
        self.remove(names(collection), id)
    }

    /// The oldest evictable record of `collection` (of `owner`, or anyone's), other
    /// than `keep`.
    fn oldest_evictable(
        &self,
        collection: &'static Collection,
        owner: Option<&str>,
        keep: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        let name = collection.name;
        let records = self.w()?.open_table(RECORDS).or_storage()?;
        let evictable = |id: &str| -> Result<bool, StoreError> {
            if Some(id) == keep {
                return Ok(false);
            }
            let guard = records.get((name, id)).or_storage()?;
            Ok(guard.is_some_and(|g| g.value().3))
        };
        match owner {
            Some(owner) => {
                let table = self.w()?.open_table(LISTED).or_storage()?;
                let range = table
                    .range((name, owner, "", 0)..=(name, owner, "", u64::MAX))
                    .or_storage()?;
                for entry in range {
                    let (_, id) = entry.or_storage()?;
                    if evictable(id.value())? {
                        return Ok(Some(id.value().to_string()));
                    }
                }
            }
            None => {
                let table = self.w()?.open_table(ROOTS).or_storage()?;
                for entry in table.range((name, 0)..=(name, u64::MAX)).or_storage()? {
                    let (_, id) = entry.or_storage()?;
                    if evictable(id.value())? {
                        return Ok(Some(id.value().to_string()));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Forgets `owner`'s oldest evictable records of `collection` (not `keep`) until it
    /// holds at most `bytes` and fewer than `count` records; false when nothing is left
    /// to forget.
    fn make_room(
        &mut self,
        collection: &'static Collection,
        owner: &str,
        keep: Option<&str>,
        bytes: usize,
        count: usize,
    ) -> Result<bool, StoreError> {
        loop {
            let held = self.counter("bytes", owner, "")? as usize;
            let owned = self.counter("owned", collection.name, owner)? as usize;
            if held <= bytes && owned < count {
                return Ok(true);
            }
            match self.oldest_evictable(collection, Some(owner), keep)? {
                Some(old) => self.remove_tree(collection, owner, &old)?,
                None => return Ok(false),
            }
        }
    }

    fn check_new(&self, collection: &Collection, id: &str) -> Result<(), StoreError> {
        match self.meta(collection.name, id)? {
            Some(_) => Err(StoreError::Exists),
            None => Ok(()),
        }
    }

    /// The parent the scope names must be the caller's.
    fn check_scope(&self, collection: &Collection, scope: Scope<'_>) -> Result<(), StoreError> {
        match (collection.parent, scope.parent) {
            (None, None) => Ok(()),
            (Some(parent), Some(id)) => match self.meta(parent.name, id)? {
                Some(meta) if meta.owner == scope.owner => Ok(()),
                _ => Err(StoreError::ParentNotFound),
            },
            _ => Err(StoreError::ParentNotFound),
        }
    }

    fn find<T: Record>(&self, scope: Scope<'_>, id: &str) -> Result<Meta, StoreError> {
        let collection = T::collection();
        self.check_scope(collection, scope)?;
        match self.meta(collection.name, id)? {
            Some(m) if m.owner == scope.owner && m.parent.as_deref() == scope.parent => Ok(m),
            _ => Err(StoreError::NotFound),
        }
    }

    /// Keeps a record that was admitted.
    fn insert_new<T: Record>(
        &mut self,
        scope: Scope<'_>,
        record: &T,
        json: &str,
    ) -> Result<(), StoreError> {
        let seq = self.counter("seq", "", "")?;
        self.set("seq", "", "", seq + 1)?;
        let meta = Meta {
            owner: scope.owner.to_string(),
            parent: scope.parent.map(str::to_string),
            seq,
            size: json.len(),
            evictable: record.evictable(),
        };
        self.insert(T::collection(), record.id(), &meta, json)
    }

    /// Refuses (or makes room for) `size` more bytes of `owner`'s in the object rooted
    /// at `root`.
    fn admit(
        &mut self,
        collection: &'static Collection,
        scope: Scope<'_>,
        root: (&str, &str),
        size: usize,
    ) -> Result<(), StoreError> {
        let limits = self.limits;
        let owner = scope.owner;
        let root_collection = collection.parent.unwrap_or(collection);
        let tree = self.counter("tree", root.0, root.1)? as usize + size;
        if tree > limits.object_bytes {
            return Err(StoreError::TooLarge {
                collection: root_collection.name,
                bytes: tree,
                limit: limits.object_bytes,
            });
        }
        let new_root = scope.parent.is_none();
        let count = if new_root {
            collection.max_per_owner
        } else {
            usize::MAX
        };
        let keep = scope.parent;
        let budget = limits.owner_bytes.saturating_sub(size);
        let total = self.counter("total", collection.name, "")? as usize;
        if root_collection.evicts {
            if !self.make_room(root_collection, owner, keep, budget, count)? {
                return Err(StoreError::OverQuota(Quota::NoRoom {
                    collection: root_collection.name,
                    bytes: limits.owner_bytes,
                    count: root_collection.max_per_owner,
                }));
            }
            let total = self.counter("total", collection.name, "")? as usize;
            if new_root && total >= collection.max_total {
                if let Some(old) = self.oldest_evictable(collection, None, None)? {
                    let old_owner = self
                        .meta(collection.name, &old)?
                        .map(|m| m.owner)
                        .unwrap_or_default();
                    self.remove_tree(collection, &old_owner, &old)?;
                }
            }
            return Ok(());
        }
        if new_root {
            if total >= collection.max_total {
                return Err(StoreError::Full {
                    collection: collection.name,
                    limit: collection.max_total,
                });
            }
            if self.counter("owned", collection.name, owner)? as usize >= collection.max_per_owner {
                return Err(StoreError::OverQuota(Quota::Count {
                    collection: collection.name,
                    limit: collection.max_per_owner,
                }));
            }
        }
        if self.counter("bytes", owner, "")? as usize > budget {
            return Err(StoreError::OverQuota(Quota::Bytes {
                limit: limits.owner_bytes,
            }));
        }
        Ok(())
    }
}

fn to_json<T: Record>(record: &T) -> Result<String, StoreError> {
    serde_json::to_string(record).map_err(|e| StoreError::Storage(e.to_string()))
}

impl Transaction for DurableTxn<'_> {
    fn create<T: Record>(&mut self, scope: Scope<'_>, record: T) -> Result<(), StoreError> {
        self.create_all(scope, vec![record])
    }

    fn create_all<T: Record>(
        &mut self,
        scope: Scope<'_>,
        records: Vec<T>,
    ) -> Result<(), StoreError> {
        let collection = T::collection();
        self.check_scope(collection, scope)?;
        // Records of their own each start an object, with its own count and bounds.
        let Some(parent) = scope.parent.filter(|_| records.len() > 1) else {
            for record in records {
                let json = to_json(&record)?;
                let root = root_of(names(collection), scope.parent, record.id());
                self.check_new(collection, record.id())?;
                self.admit(collection, scope, root, json.len())?;
                self.insert_new(scope, &record, &json)?;
            }
            return Ok(());
        };
        // Children are admitted as one: the object's bound is met or refused whole.
        let jsons = records.iter().map(to_json).collect::<Result<Vec<_>, _>>()?;
        for record in &records {
            self.check_new(collection, record.id())?;
        }
        let root = (collection.parent.map_or("", |p| p.name), parent);
        self.admit(collection, scope, root, jsons.iter().map(String::len).sum())?;
        for (record, json) in records.iter().zip(jsons) {
            self.insert_new(scope, record, &json)?;
        }
        Ok(())
    }

    fn get<T: Record>(&mut self, scope: Scope<'_>, id: &str) -> Result<T, StoreError> {
        self.find::<T>(scope, id)?;
        self.value(id)
    }

    fn put<T: Record>(&mut self, scope: Scope<'_>, record: T) -> Result<(), StoreError> {
        let collection = T::collection();
        let id = record.id().to_string();
        let old = self.find::<T>(scope, &id)?;
        let json = to_json(&record)?;
        let meta = Meta {
            evictable: record.evictable(),
            size: json.len(),
            ..old
        };
        self.dirty = true;
        let parent = meta.parent.as_deref().unwrap_or("");
        let value = (
            meta.owner.as_str(),
            parent,
            meta.seq,
            meta.evictable,
            json.as_str(),
        );
        self.w()?
            .open_table(RECORDS)
            .or_storage()?
            .insert((collection.name, id.as_str()), value)
            .or_storage()?;
        let (old_size, size) = (old.size as u64, json.len() as u64);
        self.sub("bytes", scope.owner, "", old_size)?;
        self.add("bytes", scope.owner, "", size)?;
        let (root_name, root_id) = root_of(names(collection), scope.parent, &id);
        self.sub("tree", root_name, root_id, old_size)?;
        self.add("tree", root_name, root_id, size)?;
        // A grown record of an evicting collection stays; older ones make room.
        let root_collection = collection.parent.unwrap_or(collection);
        if size > old_size && root_collection.evicts {
            let root = scope.parent.unwrap_or(&id).to_string();
            let limit = self.limits.owner_bytes;
            self.make_room(root_collection, scope.owner, Some(&root), limit, usize::MAX)?;
        }
        Ok(())
    }

    fn delete<T: Record>(&mut self, scope: Scope<'_>, id: &str) -> Result<T, StoreError> {
        let record = self.get::<T>(scope, id)?;
        self.remove_tree(T::collection(), scope.owner, id)?;
        Ok(record)
    }

    fn list<T: Record>(
        &mut self,
        scope: Scope<'_>,
        query: &ListQuery<'_>,
    ) -> Result<Page<T>, StoreError> {
        let collection = T::collection();
        self.check_scope(collection, scope)?;
        let after = match query.after {
            Some(after) => Some(
                self.find::<T>(scope, after)
                    .map_err(|_| StoreError::UnknownCursor)?
                    .seq,
            ),
            None => None,
        };
        let (low, high) = match (query.order, after) {
            (_, None) => (0, u64::MAX),
            (Order::Asc, Some(seq)) if seq == u64::MAX => return Ok(Page::new(vec![], false)),
            (Order::Asc, Some(seq)) => (seq + 1, u64::MAX),
            (Order::Desc, Some(0)) => return Ok(Page::new(vec![], false)),
            (Order::Desc, Some(seq)) => (0, seq - 1),
        };
        let parent = scope.parent.unwrap_or("");
        let limit = query.limit.saturating_add(1);
        let mut ids = self.listed(
            collection.name,
            scope.owner,
            parent,
            low..=high,
            query.order,
            limit,
        )?;
        let has_more = ids.len() > query.limit;
        ids.truncate(query.limit);
        let data = ids
            .iter()
            .map(|id| self.value::<T>(id))
            .collect::<Result<Vec<T>, _>>()?;
        Ok(Page::new(data, has_more))
    }

    fn count<T: Record>(&mut self, scope: Scope<'_>) -> Result<usize, StoreError> {
        let collection = T::collection();
        self.check_scope(collection, scope)?;
        match scope.parent {
            None => Ok(self.counter("owned", collection.name, scope.owner)? as usize),
            Some(parent) => reading!(self, LISTED, |table| {
                let name = collection.name;
                let range = table
                    .range((name, scope.owner, parent, 0)..=(name, scope.owner, parent, u64::MAX))
                    .or_storage()?;
                Ok(range.count())
            }),
        }
    }

    fn restart<T: Record>(&mut self) -> Result<usize, StoreError> {
        let name = T::collection().name;
        // Who holds each record, gathered first: the table is written below.
        let mut held = Vec::new();
        {
            let table = self.w()?.open_table(RECORDS).or_storage()?;
            for entry in table.range((name, "")..).or_storage()? {
                let (key, value) = entry.or_storage()?;
                let (collection, id) = key.value();
                if collection != name {
                    break;
                }
                let (owner, parent, ..) = value.value();
                let parent = (!parent.is_empty()).then(|| parent.to_string());
                held.push((id.to_string(), owner.to_string(), parent));
            }
        }
        let mut changed = 0;
        for (id, owner, parent) in held {
            let mut record = match self.value::<T>(&id) {
                Ok(record) => record,
                // Forgotten to make room for one changed before it.
                Err(StoreError::NotFound) => continue,
                Err(e) => return Err(e),
            };
            if record.on_restart() {
                self.put(
                    Scope {
                        owner: &owner,
                        parent: parent.as_deref(),
                    },
                    record,
                )?;
                changed += 1;
            }
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests;
