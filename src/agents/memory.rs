//! The in-memory [`ObjectStore`]: every record behind one mutex shared by all workers
//! (each operation is a few map operations; turns run outside the lock), as typed
//! values (nothing is serialised but to count a record's bytes). A transaction holds
//! the lock and logs how to undo each change; an error replays the log backwards.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use super::records::{
    json_size, Collection, Limits, ListQuery, ObjectStore, Order, Page, Quota, Record, Scope,
    StoreError, Transaction,
};

type Boxed = Box<dyn Any + Send + Sync>;

/// `(collection, id)`.
type Key = (&'static str, String);

/// `(collection, owner, parent or "", creation order)`: what lists walk.
type ListKey = (&'static str, String, String, u64);

struct Entry {
    collection: &'static Collection,
    owner: String,
    parent: Option<String>,
    seq: u64,
    size: usize,
    evictable: bool,
    value: Boxed,
}

impl Entry {
    fn list_key(&self) -> ListKey {
        (
            self.collection.name,
            self.owner.clone(),
            self.parent.clone().unwrap_or_default(),
            self.seq,
        )
    }

    /// The record whose object this one counts toward: its parent, or itself.
    fn root(&self, id: &str) -> Key {
        match (self.collection.parent, &self.parent) {
            (Some(parent), Some(parent_id)) => (parent.name, parent_id.clone()),
            _ => (self.collection.name, id.to_string()),
        }
    }
}

#[derive(Default)]
struct Tables {
    entries: HashMap<Key, Entry>,
    listed: BTreeMap<ListKey, String>,
    /// `(collection, creation order)` of every record without a parent, for eviction
    /// across owners.
    roots: BTreeMap<(&'static str, u64), String>,
    owner_bytes: HashMap<String, usize>,
    /// Records per `(collection, owner)`.
    owned: HashMap<(&'static str, String), usize>,
    /// Records per collection.
    totals: HashMap<&'static str, usize>,
    /// Bytes of each record with its children, by the record's key.
    tree_bytes: HashMap<Key, usize>,
    /// The child collections seen so far, for deleting a record's children.
    kinds: Vec<&'static Collection>,
    next_seq: u64,
}

fn add<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: K, n: usize) {
    *map.entry(key).or_default() += n;
}

fn sub<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: K, n: usize) {
    if let std::collections::hash_map::Entry::Occupied(mut e) = map.entry(key) {
        *e.get_mut() = e.get().saturating_sub(n);
        if *e.get() == 0 {
            e.remove();
        }
    }
}

fn list_range(name: &'static str, owner: &str, parent: &str) -> (ListKey, ListKey) {
    (
        (name, owner.to_string(), parent.to_string(), 0),
        (name, owner.to_string(), parent.to_string(), u64::MAX),
    )
}

impl Tables {
    /// Keeps `entry` under `id`, with every index and count.
    fn insert(&mut self, id: String, entry: Entry) {
        let name = entry.collection.name;
        self.listed.insert(entry.list_key(), id.clone());
        if entry.parent.is_none() {
            self.roots.insert((name, entry.seq), id.clone());
        } else if !self.kinds.iter().any(|k| k.name == name) {
            self.kinds.push(entry.collection);
        }
        add(&mut self.owner_bytes, entry.owner.clone(), entry.size);
        add(&mut self.owned, (name, entry.owner.clone()), 1);
        add(&mut self.totals, name, 1);
        add(&mut self.tree_bytes, entry.root(&id), entry.size);
        self.entries.insert((name, id), entry);
    }

    /// Forgets one record (not its children), with every index and count.
    fn remove(&mut self, name: &'static str, id: &str) -> Option<Entry> {
        let entry = self.entries.remove(&(name, id.to_string()))?;
        self.listed.remove(&entry.list_key());
        if entry.parent.is_none() {
            self.roots.remove(&(name, entry.seq));
            self.tree_bytes.remove(&(name, id.to_string()));
        } else {
            sub(&mut self.tree_bytes, entry.root(id), entry.size);
        }
        sub(&mut self.owner_bytes, entry.owner.clone(), entry.size);
        sub(&mut self.owned, (name, entry.owner.clone()), 1);
        sub(&mut self.totals, name, 1);
        Some(entry)
    }

    /// Swaps a record's value; returns the old value, size and evictability.
    fn replace(
        &mut self,
        name: &'static str,
        id: &str,
        value: Boxed,
        size: usize,
        evictable: bool,
    ) -> (Boxed, usize, bool) {
        let key = (name, id.to_string());
        let entry = self.entries.get_mut(&key).expect("replaced record exists");
        let old_size = std::mem::replace(&mut entry.size, size);
        let old_evictable = std::mem::replace(&mut entry.evictable, evictable);
        let old = std::mem::replace(&mut entry.value, value);
        let (owner, root) = (entry.owner.clone(), entry.root(id));
        sub(&mut self.owner_bytes, owner.clone(), old_size);
        add(&mut self.owner_bytes, owner, size);
        sub(&mut self.tree_bytes, root.clone(), old_size);
        add(&mut self.tree_bytes, root, size);
        (old, old_size, old_evictable)
    }

    fn owner_bytes(&self, owner: &str) -> usize {
        self.owner_bytes.get(owner).copied().unwrap_or(0)
    }

    fn owned(&self, name: &'static str, owner: &str) -> usize {
        self.owned
            .get(&(name, owner.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// The oldest evictable record of `collection` (of `owner`, or anyone's), other
    /// than `keep`.
    fn oldest_evictable(
        &self,
        collection: &'static Collection,
        owner: Option<&str>,
        keep: Option<&str>,
    ) -> Option<String> {
        let evictable = |id: &String| {
            Some(id.as_str()) != keep
                && self
                    .entries
                    .get(&(collection.name, id.clone()))
                    .is_some_and(|e| e.evictable)
        };
        match owner {
            Some(owner) => {
                let (low, high) = list_range(collection.name, owner, "");
                self.listed
                    .range(low..=high)
                    .map(|(_, id)| id)
                    .find(|id| evictable(id))
                    .cloned()
            }
            None => self
                .roots
                .range((collection.name, 0)..=(collection.name, u64::MAX))
                .map(|(_, id)| id)
                .find(|id| evictable(id))
                .cloned(),
        }
    }
}

/// Every record, in memory.
pub struct MemoryStore {
    tables: Mutex<Tables>,
    limits: Limits,
}

impl Default for MemoryStore {
    fn default() -> MemoryStore {
        MemoryStore::with_limits(Limits::default())
    }
}

impl MemoryStore {
    pub fn with_limits(limits: Limits) -> MemoryStore {
        MemoryStore {
            tables: Mutex::default(),
            limits,
        }
    }
}

enum Undo {
    Inserted(&'static str, String),
    Removed(String, Entry),
    Replaced(&'static str, String, Boxed, usize, bool),
}

/// A transaction of the [`MemoryStore`]: it holds the store's lock.
pub struct MemoryTxn<'a> {
    tables: MutexGuard<'a, Tables>,
    limits: Limits,
    undo: Vec<Undo>,
}

impl ObjectStore for MemoryStore {
    type Txn<'a> = MemoryTxn<'a>;

    fn transact<R, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&mut MemoryTxn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        let mut txn = MemoryTxn {
            tables: self.tables.lock().unwrap_or_else(|e| e.into_inner()),
            limits: self.limits,
            undo: Vec::new(),
        };
        let result = f(&mut txn);
        if result.is_err() {
            txn.rollback();
        }
        result
    }
}

impl MemoryTxn<'_> {
    fn rollback(&mut self) {
        while let Some(undo) = self.undo.pop() {
            match undo {
                Undo::Inserted(name, id) => {
                    self.tables.remove(name, &id);
                }
                Undo::Removed(id, entry) => self.tables.insert(id, entry),
                Undo::Replaced(name, id, value, size, evictable) => {
                    self.tables.replace(name, &id, value, size, evictable);
                }
            }
        }
    }

    fn insert(&mut self, id: String, entry: Entry) {
        self.undo
            .push(Undo::Inserted(entry.collection.name, id.clone()));
        self.tables.insert(id, entry);
    }

    fn remove(&mut self, name: &'static str, id: &str) {
        if let Some(entry) = self.tables.remove(name, id) {
            self.undo.push(Undo::Removed(id.to_string(), entry));
        }
    }

    /// Forgets a record and its children.
    fn remove_tree(&mut self, collection: &'static Collection, owner: &str, id: &str) {
        let kinds: Vec<&'static Collection> = self
            .tables
            .kinds
            .iter()
            .copied()
            .filter(|k| k.parent.is_some_and(|p| p.name == collection.name))
            .collect();
        for kind in kinds {
            let (low, high) = list_range(kind.name, owner, id);
            let children: Vec<String> = self
                .tables
                .listed
                .range(low..=high)
                .map(|(_, child)| child.clone())
                .collect();
            for child in children {
                self.remove(kind.name, &child);
            }
        }
        self.remove(collection.name, id);
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
    ) -> bool {
        loop {
            let tables = &self.tables;
            if tables.owner_bytes(owner) <= bytes && tables.owned(collection.name, owner) < count {
                return true;
            }
            match tables.oldest_evictable(collection, Some(owner), keep) {
                Some(old) => self.remove_tree(collection, owner, &old),
                None => return false,
            }
        }
    }

    fn check_new(&self, collection: &Collection, id: &str) -> Result<(), StoreError> {
        match self
            .tables
            .entries
            .contains_key(&(collection.name, id.to_string()))
        {
            true => Err(StoreError::Exists),
            false => Ok(()),
        }
    }

    /// Keeps a record that was admitted.
    fn insert_new<T: Record>(&mut self, scope: Scope<'_>, record: T, size: usize) {
        let id = record.id().to_string();
        let seq = self.tables.next_seq;
        self.tables.next_seq += 1;
        let entry = Entry {
            collection: T::collection(),
            owner: scope.owner.to_string(),
            parent: scope.parent.map(str::to_string),
            seq,
            size,
            evictable: record.evictable(),
            value: Box::new(record),
        };
        self.insert(id, entry);
    }

    /// The parent the scope names must be the caller's.
    fn check_scope(&self, collection: &Collection, scope: Scope<'_>) -> Result<(), StoreError> {
        match (collection.parent, scope.parent) {
            (None, None) => Ok(()),
            (Some(parent), Some(id)) => match self.tables.entries.get(&(parent.name, id.into())) {
                Some(entry) if entry.owner == scope.owner => Ok(()),
                _ => Err(StoreError::ParentNotFound),
            },
            _ => Err(StoreError::ParentNotFound),
        }
    }

    fn find<T: Record>(&self, scope: Scope<'_>, id: &str) -> Result<&Entry, StoreError> {
        let collection = T::collection();
        self.check_scope(collection, scope)?;
        match self.tables.entries.get(&(collection.name, id.to_string())) {
            Some(e) if e.owner == scope.owner && e.parent.as_deref() == scope.parent => Ok(e),
            _ => Err(StoreError::NotFound),
        }
    }

    /// Refuses (or makes room for) `size` more bytes of `owner`'s in the object rooted
    /// at `root`; `new_root` for a record that starts its own object.
    fn admit(
        &mut self,
        collection: &'static Collection,
        scope: Scope<'_>,
        root: &Key,
        size: usize,
    ) -> Result<(), StoreError> {
        let limits = self.limits;
        let owner = scope.owner;
        let root_collection = collection.parent.unwrap_or(collection);
        let tree = self.tables.tree_bytes.get(root).copied().unwrap_or(0) + size;
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
        if root_collection.evicts {
            if !self.make_room(root_collection, owner, keep, budget, count) {
                return Err(StoreError::OverQuota(Quota::NoRoom {
                    collection: root_collection.name,
                    bytes: limits.owner_bytes,
                    count: root_collection.max_per_owner,
                }));
            }
            let total = self
                .tables
                .totals
                .get(collection.name)
                .copied()
                .unwrap_or(0);
            if new_root && total >= collection.max_total {
                if let Some(old) = self.tables.oldest_evictable(collection, None, None) {
                    let old_owner = self.tables.entries[&(collection.name, old.clone())]
                        .owner
                        .clone();
                    self.remove_tree(collection, &old_owner, &old);
                }
            }
            return Ok(());
        }
        if new_root {
            let total = self
                .tables
                .totals
                .get(collection.name)
                .copied()
                .unwrap_or(0);
            if total >= collection.max_total {
                return Err(StoreError::Full {
                    collection: collection.name,
                    limit: collection.max_total,
                });
            }
            if self.tables.owned(collection.name, owner) >= collection.max_per_owner {
                return Err(StoreError::OverQuota(Quota::Count {
                    collection: collection.name,
                    limit: collection.max_per_owner,
                }));
            }
        }
        if self.tables.owner_bytes(owner) > budget {
            return Err(StoreError::OverQuota(Quota::Bytes {
                limit: limits.owner_bytes,
            }));
        }
        Ok(())
    }
}

impl Transaction for MemoryTxn<'_> {
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
                let size = json_size(&record);
                let root = match (collection.parent, scope.parent) {
                    (Some(parent), Some(parent_id)) => (parent.name, parent_id.to_string()),
                    _ => (collection.name, record.id().to_string()),
                };
                self.check_new(collection, record.id())?;
                self.admit(collection, scope, &root, size)?;
                self.insert_new(scope, record, size);
            }
            return Ok(());
        };
        // Children are admitted as one: the object's bound is met or refused whole.
        let sizes: Vec<usize> = records.iter().map(json_size).collect();
        for record in &records {
            self.check_new(collection, record.id())?;
        }
        let root = (collection.parent.map_or("", |p| p.name), parent.to_string());
        self.admit(collection, scope, &root, sizes.iter().sum())?;
        for (record, size) in records.into_iter().zip(sizes) {
            self.insert_new(scope, record, size);
        }
        Ok(())
    }

    fn get<T: Record>(&mut self, scope: Scope<'_>, id: &str) -> Result<T, StoreError> {
        let entry = self.find::<T>(scope, id)?;
        entry
            .value
            .downcast_ref::<T>()
            .cloned()
            .ok_or(StoreError::NotFound)
    }

    fn put<T: Record>(&mut self, scope: Scope<'_>, record: T) -> Result<(), StoreError> {
        let collection = T::collection();
        let id = record.id().to_string();
        let old_size = self.find::<T>(scope, &id)?.size;
        let size = json_size(&record);
        let evictable = record.evictable();
        let (old, old_size_again, old_evictable) =
            self.tables
                .replace(collection.name, &id, Box::new(record), size, evictable);
        debug_assert_eq!(old_size, old_size_again);
        self.undo.push(Undo::Replaced(
            collection.name,
            id.clone(),
            old,
            old_size,
            old_evictable,
        ));
        // A grown record of an evicting collection stays; older ones make room.
        let root_collection = collection.parent.unwrap_or(collection);
        if size > old_size && root_collection.evicts {
            let root = scope.parent.unwrap_or(&id).to_string();
            let limit = self.limits.owner_bytes;
            self.make_room(root_collection, scope.owner, Some(&root), limit, usize::MAX);
        }
        Ok(())
    }

    fn delete<T: Record>(&mut self, scope: Scope<'_>, id: &str) -> Result<T, StoreError> {
        let record = self.get::<T>(scope, id)?;
        self.remove_tree(T::collection(), scope.owner, id);
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
        let (low, high) = list_range(collection.name, scope.owner, scope.parent.unwrap_or(""));
        let listed = &self.tables.listed;
        let ids: Box<dyn Iterator<Item = &String>> = match (query.order, after) {
            (Order::Asc, None) => Box::new(listed.range(low..=high).map(|(_, id)| id)),
            (Order::Asc, Some(seq)) => {
                let from = (low.0, low.1.clone(), low.2.clone(), seq);
                Box::new(listed.range(from..=high).skip(1).map(|(_, id)| id))
            }
            (Order::Desc, None) => Box::new(listed.range(low..=high).rev().map(|(_, id)| id)),
            (Order::Desc, Some(seq)) => {
                let to = (low.0, low.1.clone(), low.2.clone(), seq);
                Box::new(listed.range(low..to).rev().map(|(_, id)| id))
            }
        };
        let mut data = Vec::new();
        let mut has_more = false;
        for id in ids {
            if data.len() == query.limit {
                has_more = true;
                break;
            }
            let entry = &self.tables.entries[&(collection.name, id.clone())];
            if let Some(record) = entry.value.downcast_ref::<T>() {
                data.push(record.clone());
            }
        }
        Ok(Page::new(data, has_more))
    }

    fn count<T: Record>(&mut self, scope: Scope<'_>) -> Result<usize, StoreError> {
        let collection = T::collection();
        self.check_scope(collection, scope)?;
        Ok(match scope.parent {
            None => self.tables.owned(collection.name, scope.owner),
            Some(parent) => {
                let (low, high) = list_range(collection.name, scope.owner, parent);
                self.tables.listed.range(low..=high).count()
            }
        })
    }
}

/// The store's behaviours, generic over the backend: each backend's tests run them all
/// through [`store_tests`].
#[cfg(test)]
pub(crate) mod cases {
    use serde::{Deserialize, Serialize};

    use super::super::records::{
        json_size, Collection, Limits, ListQuery, ObjectStore, Order, Page, Quota, Record, Scope,
        StoreError, Transaction,
    };

    /// A backend under test: made with bounds, and able to say what an owner is charged
    /// for (checking it against its records' JSON) and how many records it holds.
    pub(crate) trait TestStore: ObjectStore + Sized {
        fn with_limits(limits: Limits) -> Self;
        fn held(&self, owner: &str) -> usize;
        fn records(&self) -> usize;
    }

    static NOTES: Collection = Collection {
        name: "note",
        parent: None,
        max_total: 8,
        max_per_owner: 4,
        evicts: false,
    };
    static LINES: Collection = Collection {
        name: "line",
        parent: Some(&NOTES),
        max_total: usize::MAX,
        max_per_owner: usize::MAX,
        evicts: false,
    };
    static RUNS: Collection = Collection {
        name: "run",
        parent: None,
        max_total: 5,
        max_per_owner: 3,
        evicts: true,
    };
    static STEPS: Collection = Collection {
        name: "step",
        parent: Some(&RUNS),
        max_total: usize::MAX,
        max_per_owner: usize::MAX,
        evicts: false,
    };

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub(crate) struct Note {
        pub(crate) id: String,
        pub(crate) text: String,
    }

    impl Record for Note {
        fn collection() -> &'static Collection {
            &NOTES
        }
        fn id(&self) -> &str {
            &self.id
        }
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub(crate) struct Line {
        pub(crate) id: String,
        pub(crate) text: String,
    }

    impl Record for Line {
        fn collection() -> &'static Collection {
            &LINES
        }
        fn id(&self) -> &str {
            &self.id
        }
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub(crate) struct Run {
        pub(crate) id: String,
        pub(crate) running: bool,
        pub(crate) text: String,
    }

    impl Record for Run {
        fn collection() -> &'static Collection {
            &RUNS
        }
        fn id(&self) -> &str {
            &self.id
        }
        fn evictable(&self) -> bool {
            !self.running
        }
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub(crate) struct Step {
        pub(crate) id: String,
        pub(crate) text: String,
    }

    impl Record for Step {
        fn collection() -> &'static Collection {
            &STEPS
        }
        fn id(&self) -> &str {
            &self.id
        }
    }

    pub(crate) fn note(id: &str, text: &str) -> Note {
        Note {
            id: id.into(),
            text: text.into(),
        }
    }

    pub(crate) fn line(id: &str) -> Line {
        Line {
            id: id.into(),
            text: String::new(),
        }
    }

    fn run(id: &str, running: bool, bytes: usize) -> Run {
        Run {
            id: id.into(),
            running,
            text: "r".repeat(bytes),
        }
    }

    fn small<S: TestStore>() -> S {
        S::with_limits(Limits {
            object_bytes: 1000,
            owner_bytes: 2000,
        })
    }

    fn ids<T: Record>(page: &Page<T>) -> Vec<&str> {
        page.data.iter().map(Record::id).collect()
    }

    const A: Scope<'static> = Scope {
        owner: "alice",
        parent: None,
    };
    const B: Scope<'static> = Scope {
        owner: "bob",
        parent: None,
    };

    pub(crate) fn create_get_update_delete<S: TestStore>() {
        let store = small::<S>();
        store.create(A, note("n1", "first")).unwrap();
        assert_eq!(store.get::<Note>(A, "n1"), Ok(note("n1", "first")));
        assert_eq!(
            store.create(A, note("n1", "again")),
            Err(StoreError::Exists)
        );
        let old = store
            .update::<Note, _>(A, "n1", |n| std::mem::replace(&mut n.text, "second".into()))
            .unwrap();
        assert_eq!(old, "first");
        assert_eq!(store.get::<Note>(A, "n1").unwrap().text, "second");
        assert_eq!(store.delete::<Note>(A, "n1").unwrap().text, "second");
        assert_eq!(store.get::<Note>(A, "n1"), Err(StoreError::NotFound));
        assert_eq!(store.delete::<Note>(A, "n1"), Err(StoreError::NotFound));
    }

    pub(crate) fn a_foreign_id_is_an_unknown_id<S: TestStore>() {
        let store = small::<S>();
        store.create(A, note("n1", "mine")).unwrap();
        store
            .create(Scope::within("alice", "n1"), line("l1"))
            .unwrap();
        assert_eq!(store.get::<Note>(B, "n1"), Err(StoreError::NotFound));
        assert_eq!(
            store.update::<Note, _>(B, "n1", |n| n.text.clear()),
            Err(StoreError::NotFound)
        );
        assert_eq!(store.delete::<Note>(B, "n1"), Err(StoreError::NotFound));
        let theirs = Scope::within("bob", "n1");
        assert_eq!(
            store.get::<Line>(theirs, "l1"),
            Err(StoreError::ParentNotFound)
        );
        assert_eq!(
            store.create(theirs, line("l2")),
            Err(StoreError::ParentNotFound)
        );
        assert_eq!(
            store.list::<Line>(theirs, &ListQuery::all()).unwrap_err(),
            StoreError::ParentNotFound
        );
        // A child is found only within its own parent.
        store.create(A, note("n2", "other")).unwrap();
        assert_eq!(
            store.get::<Line>(Scope::within("alice", "n2"), "l1"),
            Err(StoreError::NotFound)
        );
        assert_eq!(store.get::<Note>(A, "n1").unwrap().text, "mine");
    }

    pub(crate) fn lists_page_by_cursor_in_either_order<S: TestStore>() {
        let store = small::<S>();
        store.create(A, note("n", "")).unwrap();
        let within = Scope::within("alice", "n");
        for i in 0..5 {
            store.create(within, line(&format!("l{i}"))).unwrap();
        }
        // Another owner's and another parent's records are not in the list.
        store.create(B, note("m", "")).unwrap();
        store.create(Scope::within("bob", "m"), line("x")).unwrap();
        let page = |after, limit, order| {
            store
                .list::<Line>(
                    within,
                    &ListQuery {
                        after,
                        limit,
                        order,
                    },
                )
                .unwrap()
        };
        let first = page(None, 2, Order::Asc);
        assert_eq!(ids(&first), ["l0", "l1"]);
        assert!(first.has_more);
        assert_eq!(
            (first.first_id.as_deref(), first.last_id.as_deref()),
            (Some("l0"), Some("l1"))
        );
        let next = page(Some("l1"), 2, Order::Asc);
        assert_eq!(ids(&next), ["l2", "l3"]);
        assert!(next.has_more);
        let last = page(Some("l3"), 2, Order::Asc);
        assert_eq!(ids(&last), ["l4"]);
        assert!(!last.has_more);
        let desc = page(None, 3, Order::Desc);
        assert_eq!(ids(&desc), ["l4", "l3", "l2"]);
        assert!(desc.has_more);
        let rest = page(Some("l2"), 10, Order::Desc);
        assert_eq!(ids(&rest), ["l1", "l0"]);
        assert!(!rest.has_more);
        let exact = page(None, 5, Order::Asc);
        assert!(!exact.has_more, "a page that ends the list has no more");
        let empty = page(Some("l0"), 10, Order::Desc);
        assert!(empty.data.is_empty() && empty.first_id.is_none());
        let unknown = store.list::<Line>(
            within,
            &ListQuery {
                after: Some("x"),
                limit: 1,
                order: Order::Asc,
            },
        );
        assert_eq!(unknown.unwrap_err(), StoreError::UnknownCursor, "bob's id");
        store
            .transact(|t| {
                assert_eq!(t.count::<Line>(within), Ok(5));
                assert_eq!(t.count::<Note>(A), Ok(1));
                Ok::<_, StoreError>(())
            })
            .unwrap();
        // Roots list too.
        store.create(A, note("n9", "")).unwrap();
        assert_eq!(
            ids(&store.list::<Note>(A, &ListQuery::all()).unwrap()),
            ["n", "n9"]
        );
    }

    pub(crate) fn deleting_a_record_takes_its_children_and_gives_its_bytes_back<S: TestStore>() {
        let store = small::<S>();
        store.create(A, note("n", "")).unwrap();
        let within = Scope::within("alice", "n");
        store.create(within, text_line("l", 900)).unwrap();
        // The object (the note and its lines) may hold 1000 bytes.
        let too_large = store.create(within, text_line("l2", 200));
        assert!(matches!(
            too_large,
            Err(StoreError::TooLarge {
                collection: "note",
                ..
            })
        ));
        store.delete::<Note>(A, "n").unwrap();
        assert_eq!(held(&store, "alice"), 0);
        store.create(A, note("n", "")).unwrap();
        assert!(store
            .list::<Line>(within, &ListQuery::all())
            .unwrap()
            .data
            .is_empty());
        store.create(within, text_line("l", 900)).unwrap();
    }

    fn text_line(id: &str, bytes: usize) -> Line {
        Line {
            id: id.into(),
            text: "x".repeat(bytes),
        }
    }

    fn held<S: TestStore>(store: &S, owner: &str) -> usize {
        store.held(owner)
    }

    pub(crate) fn a_refused_transaction_leaves_nothing_behind<S: TestStore>() {
        let store = small::<S>();
        store.create(A, note("n", "kept")).unwrap();
        let before = held(&store, "alice");
        assert_eq!(before, json_size(&note("n", "kept")));
        let within = Scope::within("alice", "n");
        let refused = store.transact(|t| {
            t.update::<Note, _>(A, "n", |n| n.text = "changed".into())?;
            t.create(within, line("a"))?;
            t.delete::<Note>(A, "n")?;
            t.create(A, note("n", "replaced"))?;
            t.create(within, text_line("b", 2000))
        });
        assert!(matches!(refused, Err(StoreError::TooLarge { .. })));
        assert_eq!(store.get::<Note>(A, "n").unwrap().text, "kept");
        assert!(store
            .list::<Line>(within, &ListQuery::all())
            .unwrap()
            .data
            .is_empty());
        assert_eq!(held(&store, "alice"), before);
        assert_eq!(store.records(), 1);
    }

    pub(crate) fn each_owner_has_a_byte_and_count_share<S: TestStore>() {
        let store = small::<S>();
        let big = |id: &str| note(id, &"z".repeat(950));
        store.create(A, big("a0")).unwrap();
        store.create(A, note("a1", &"z".repeat(900))).unwrap();
        store.create(A, note("s", "")).unwrap();
        assert_eq!(
            store.create(A, big("a2")),
            Err(StoreError::OverQuota(Quota::Bytes { limit: 2000 }))
        );
        // Growing by a child is held to the owner's bytes too.
        assert_eq!(
            store.create(Scope::within("alice", "s"), text_line("l", 80)),
            Err(StoreError::OverQuota(Quota::Bytes { limit: 2000 }))
        );
        // A batch of children is sized whole: too large for its object, it is refused
        // as such, though the first of them alone would already exceed the share.
        let batch = (0..3).map(|i| text_line(&format!("b{i}"), 340)).collect();
        let refused = store.transact(|t| t.create_all(Scope::within("alice", "s"), batch));
        assert!(matches!(
            refused,
            Err(StoreError::TooLarge {
                collection: "note",
                ..
            })
        ));
        // Bob's share is his own; his count is bounded as well.
        for i in 0..4 {
            store.create(B, note(&format!("b{i}"), "")).unwrap();
        }
        assert_eq!(
            store.create(B, note("b4", "")),
            Err(StoreError::OverQuota(Quota::Count {
                collection: "note",
                limit: 4
            }))
        );
        // Eight notes kept: the store keeps eight at most.
        store.create(Scope::owner("carol"), note("c", "")).unwrap();
        assert_eq!(
            store.create(Scope::owner("dave"), note("d", "")),
            Err(StoreError::Full {
                collection: "note",
                limit: 8
            })
        );
        // Deleting gives the share back.
        store.delete::<Note>(A, "a1").unwrap();
        store.create(A, big("a2")).unwrap();
    }

    pub(crate) fn an_evicting_collection_forgets_the_oldest_finished_records<S: TestStore>() {
        let store = S::with_limits(Limits {
            object_bytes: 3000,
            owner_bytes: 3000,
        });
        let alice = Scope::owner("alice");
        store.create(alice, run("running", true, 10)).unwrap();
        let step = Step {
            id: "s".into(),
            text: String::new(),
        };
        store
            .create(Scope::within("alice", "running"), step)
            .unwrap();
        for i in 0..3 {
            store
                .create(alice, run(&format!("r{i}"), false, 10))
                .unwrap();
        }
        // Three per owner: the oldest finished one went, the running one stayed.
        assert!(store.get::<Run>(alice, "running").is_ok());
        assert_eq!(store.get::<Run>(alice, "r0"), Err(StoreError::NotFound));
        assert!(store.get::<Run>(alice, "r2").is_ok());
        // Bytes: a big one makes room by forgetting older finished ones.
        store.create(alice, run("big", false, 2880)).unwrap();
        assert_eq!(store.get::<Run>(alice, "r1"), Err(StoreError::NotFound));
        assert_eq!(store.get::<Run>(alice, "r2"), Err(StoreError::NotFound));
        assert!(store.get::<Run>(alice, "running").is_ok());
        assert!(store
            .get::<Step>(Scope::within("alice", "running"), "s")
            .is_ok());
        assert!(held(&store, "alice") <= 3000);
        // Running ones alone fill the share: refused.
        let bob = Scope::owner("bob");
        for i in 0..3 {
            store.create(bob, run(&format!("b{i}"), true, 10)).unwrap();
        }
        assert_eq!(
            store.create(bob, run("b3", true, 10)),
            Err(StoreError::OverQuota(Quota::NoRoom {
                collection: "run",
                bytes: 3000,
                count: 3
            }))
        );
        // Five runs in the store at most: the oldest finished one anywhere goes.
        store
            .create(Scope::owner("carol"), run("c", false, 10))
            .unwrap();
        assert_eq!(store.get::<Run>(alice, "big"), Err(StoreError::NotFound));
        assert!(store.get::<Run>(Scope::owner("carol"), "c").is_ok());
    }

    pub(crate) fn a_grown_record_stays_and_older_ones_make_room<S: TestStore>() {
        let store = S::with_limits(Limits {
            object_bytes: 3000,
            owner_bytes: 3000,
        });
        let carol = Scope::owner("carol");
        store.create(carol, run("c1", false, 10)).unwrap();
        store.create(carol, run("c2", false, 10)).unwrap();
        store.create(carol, run("c3", true, 10)).unwrap();
        store
            .update::<Run, _>(carol, "c3", |r| {
                r.running = false;
                r.text = "g".repeat(2950);
            })
            .unwrap();
        assert_eq!(store.get::<Run>(carol, "c3").unwrap().text.len(), 2950);
        assert_eq!(store.get::<Run>(carol, "c1"), Err(StoreError::NotFound));
        assert_eq!(store.get::<Run>(carol, "c2"), Err(StoreError::NotFound));
        assert_eq!(
            held(&store, "carol"),
            json_size(&store.get::<Run>(carol, "c3").unwrap())
        );
    }

    /// Runs every case against the backend `$store`.
    macro_rules! store_tests {
        ($store:ty) => {
            #[test]
            fn create_get_update_delete() {
                $crate::agents::memory::cases::create_get_update_delete::<$store>();
            }
            #[test]
            fn a_foreign_id_is_an_unknown_id() {
                $crate::agents::memory::cases::a_foreign_id_is_an_unknown_id::<$store>();
            }
            #[test]
            fn lists_page_by_cursor_in_either_order() {
                $crate::agents::memory::cases::lists_page_by_cursor_in_either_order::<$store>();
            }
            #[test]
            fn deleting_a_record_takes_its_children_and_gives_its_bytes_back() {
                $crate::agents::memory::cases::deleting_a_record_takes_its_children_and_gives_its_bytes_back::<$store>();
            }
            #[test]
            fn a_refused_transaction_leaves_nothing_behind() {
                $crate::agents::memory::cases::a_refused_transaction_leaves_nothing_behind::<$store>();
            }
            #[test]
            fn each_owner_has_a_byte_and_count_share() {
                $crate::agents::memory::cases::each_owner_has_a_byte_and_count_share::<$store>();
            }
            #[test]
            fn an_evicting_collection_forgets_the_oldest_finished_records() {
                $crate::agents::memory::cases::an_evicting_collection_forgets_the_oldest_finished_records::<$store>();
            }
            #[test]
            fn a_grown_record_stays_and_older_ones_make_room() {
                $crate::agents::memory::cases::a_grown_record_stays_and_older_ones_make_room::<$store>();
            }
        };
    }
    pub(crate) use store_tests;
}

#[cfg(test)]
mod tests {
    use super::cases::{store_tests, TestStore};
    use super::*;

    impl TestStore for MemoryStore {
        fn with_limits(limits: Limits) -> MemoryStore {
            MemoryStore::with_limits(limits)
        }

        fn held(&self, owner: &str) -> usize {
            let tables = self.tables.lock().unwrap();
            let counted: usize = tables
                .entries
                .values()
                .filter(|e| e.owner == owner)
                .map(|e| e.size)
                .sum();
            assert_eq!(tables.owner_bytes(owner), counted);
            counted
        }

        fn records(&self) -> usize {
            let tables = self.tables.lock().unwrap();
            assert_eq!(tables.listed.len(), tables.entries.len());
            let roots = tables
                .entries
                .values()
                .filter(|e| e.parent.is_none())
                .count();
            assert_eq!(tables.roots.len(), roots);
            tables.entries.len()
        }
    }

    store_tests!(MemoryStore);
}
