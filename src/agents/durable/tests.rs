//! The store's behaviours, each case run against both backends, a file and redb's
//! in-memory one (`store_tests!`), and what only a file shows: a reopen keeps every
//! committed record and its counts, `kill -9` after a commit loses nothing, a file
//! another process holds or that is not a store is refused (the server then falls
//! back to memory).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::super::records::{new_id, Page};
use super::*;

/// The bytes of `value`'s JSON: what a record is charged.
fn json_size<T: Serialize>(value: &T) -> usize {
    serde_json::to_string(value).unwrap().len()
}

/// How a case gets its store: on a fresh file, or in memory.
type Open = fn(Limits) -> DurableStore;

/// A fresh state directory under the system's temporary one.
fn state_dir() -> PathBuf {
    std::env::temp_dir().join(new_id("abx-durable-"))
}

fn on_file(limits: Limits) -> DurableStore {
    let dir = state_dir();
    let store = DurableStore::open(&dir.join("agents.redb"), limits).unwrap();
    // The open file outlives its name: nothing is left behind.
    std::fs::remove_dir_all(&dir).unwrap();
    store
}

fn in_memory(limits: Limits) -> DurableStore {
    DurableStore::in_memory(limits)
}

impl DurableStore {
    /// What `owner` is charged for, checked against its records' JSON.
    fn held(&self, owner: &str) -> usize {
        let txn = self.db.begin_read().unwrap();
        let records = txn.open_table(RECORDS).unwrap();
        let mut counted = 0;
        for entry in records.iter().unwrap() {
            let (_, value) = entry.unwrap();
            let (o, .., json) = value.value();
            if o == owner {
                counted += json.len();
            }
        }
        let counters = txn.open_table(COUNTERS).unwrap();
        let charged = counters.get(("bytes", owner, "")).unwrap();
        assert_eq!(charged.map_or(0, |v| v.value()) as usize, counted);
        counted
    }

    /// How many records it holds, checked against the list index.
    fn records(&self) -> usize {
        let txn = self.db.begin_read().unwrap();
        let records = txn.open_table(RECORDS).unwrap().len().unwrap();
        let listed = txn.open_table(LISTED).unwrap().len().unwrap();
        assert_eq!(listed, records);
        records as usize
    }
}

/// Runs every case against both backends.
macro_rules! store_tests {
    ($($case:ident),* $(,)?) => {
        mod on_file {
            $(#[test]
            fn $case() {
                super::$case(super::on_file)
            })*
        }
        mod in_memory {
            $(#[test]
            fn $case() {
                super::$case(super::in_memory)
            })*
        }
    };
}

store_tests!(
    create_get_update_delete,
    a_foreign_id_is_an_unknown_id,
    lists_page_by_cursor_in_either_order,
    deleting_a_record_takes_its_children_and_gives_its_bytes_back,
    a_refused_transaction_leaves_nothing_behind,
    each_owner_has_a_byte_and_count_share,
    an_evicting_collection_forgets_the_oldest_finished_records,
    a_grown_record_stays_and_older_ones_make_room,
    the_restart_hook_changes_what_was_in_flight,
    a_read_sees_the_last_commit_and_writes_nothing,
);

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
struct Note {
    id: String,
    text: String,
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
struct Line {
    id: String,
    text: String,
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
struct Run {
    id: String,
    running: bool,
    text: String,
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
    fn on_restart(&mut self) -> bool {
        std::mem::replace(&mut self.running, false) && {
            self.text = "stopped by the restart".into();
            true
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Step {
    id: String,
    text: String,
}

impl Record for Step {
    fn collection() -> &'static Collection {
        &STEPS
    }
    fn id(&self) -> &str {
        &self.id
    }
}

fn note(id: &str, text: &str) -> Note {
    Note {
        id: id.into(),
        text: text.into(),
    }
}

fn line(id: &str) -> Line {
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

fn small(open: Open) -> DurableStore {
    open(Limits {
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

fn create_get_update_delete(open: Open) {
    let store = small(open);
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

fn a_read_sees_the_last_commit_and_writes_nothing(open: Open) {
    let store = small(open);
    store.create(A, note("n1", "first")).unwrap();
    let seen = store.read(|t| {
        let one = t.get::<Note>(A, "n1")?;
        let listed = t.list::<Note>(A, &ListQuery::all())?;
        let counted = t.count::<Note>(A)?;
        Ok::<_, StoreError>((one.text, listed.data.len(), counted))
    });
    assert_eq!(seen, Ok(("first".to_string(), 1, 1)));
    // A write inside a read is refused (a defect), and nothing changes.
    let refused = store.read(|t| t.create(A, note("n2", "second")));
    assert!(
        matches!(refused, Err(StoreError::Storage(_))),
        "{refused:?}"
    );
    assert_eq!(store.get::<Note>(A, "n2"), Err(StoreError::NotFound));
    assert_eq!(
        store.read(|t| t.get::<Note>(B, "n1")),
        Err(StoreError::NotFound),
        "a read keeps owners apart as a write does"
    );
}

fn a_foreign_id_is_an_unknown_id(open: Open) {
    let store = small(open);
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

fn lists_page_by_cursor_in_either_order(open: Open) {
    let store = small(open);
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

fn deleting_a_record_takes_its_children_and_gives_its_bytes_back(open: Open) {
    let store = small(open);
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

fn held(store: &DurableStore, owner: &str) -> usize {
    store.held(owner)
}

fn a_refused_transaction_leaves_nothing_behind(open: Open) {
    let store = small(open);
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

fn each_owner_has_a_byte_and_count_share(open: Open) {
    let store = small(open);
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

fn an_evicting_collection_forgets_the_oldest_finished_records(open: Open) {
    let store = open(Limits {
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

fn a_grown_record_stays_and_older_ones_make_room(open: Open) {
    let store = open(Limits {
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

fn the_restart_hook_changes_what_was_in_flight(open: Open) {
    let store = open(Limits {
        object_bytes: 3000,
        owner_bytes: 3000,
    });
    store.create(A, run("r1", true, 10)).unwrap();
    store.create(A, run("r2", false, 10)).unwrap();
    store.create(B, run("b1", true, 10)).unwrap();
    // Records of the collections around it are not the hook's (a step is no run).
    let step = Step {
        id: "s".into(),
        text: String::new(),
    };
    let step_bytes = json_size(&step);
    store.create(Scope::within("alice", "r1"), step).unwrap();
    store.create(A, note("n", "")).unwrap();
    assert_eq!(store.transact(|t| t.restart::<Run>()), Ok(2));
    let r1 = store.get::<Run>(A, "r1").unwrap();
    assert_eq!(
        (r1.running, r1.text.as_str()),
        (false, "stopped by the restart")
    );
    assert_eq!(store.get::<Run>(A, "r2").unwrap(), run("r2", false, 10));
    assert!(!store.get::<Run>(B, "b1").unwrap().running);
    // What each owner is charged follows the records' new sizes.
    let alice: usize = [json_size(&r1), json_size(&run("r2", false, 10))]
        .iter()
        .sum::<usize>()
        + step_bytes
        + json_size(&note("n", ""));
    assert_eq!(held(&store, "alice"), alice);
    // Nothing is in flight any more.
    assert_eq!(store.transact(|t| t.restart::<Run>()), Ok(0));
    assert_eq!(store.transact(|t| t.restart::<Note>()), Ok(0));
}

#[test]
fn a_reopened_store_has_every_committed_record_and_its_counts() {
    let dir = state_dir();
    let path = dir.join("state").join("agents.redb");
    let limits = Limits {
        object_bytes: 1000,
        owner_bytes: 2000,
    };
    {
        let store = DurableStore::open(&path, limits).unwrap();
        for i in 0..4 {
            store.create(A, note(&format!("n{i}"), "kept")).unwrap();
        }
        let within = Scope::within("alice", "n0");
        store.create(within, line("l0")).unwrap();
        store.create(within, line("l1")).unwrap();
        store
            .update::<Note, _>(A, "n1", |n| n.text = "changed".into())
            .unwrap();
        store.delete::<Note>(A, "n3").unwrap();
        // Refused whole: nothing of it is written.
        let refused = store.transact(|t| {
            t.create(A, note("n9", ""))?;
            t.create(within, line("l0"))
        });
        assert_eq!(refused, Err(StoreError::Exists));
    }
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    assert_eq!(mode(&path), 0o600);
    let store = DurableStore::open(&path, limits).unwrap();
    let notes = store.list::<Note>(A, &ListQuery::all()).unwrap();
    let ids: Vec<&str> = notes.data.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(ids, ["n0", "n1", "n2"]);
    assert_eq!(notes.data[1].text, "changed");
    let lines = store
        .list::<Line>(Scope::within("alice", "n0"), &ListQuery::all())
        .unwrap();
    assert_eq!(lines.data.len(), 2);
    assert_eq!(store.held("alice"), {
        let notes: usize = notes.data.iter().map(json_size).sum();
        notes + lines.data.iter().map(json_size).sum::<usize>()
    });
    // New records come after the old ones, and the counts held on.
    store.create(A, note("n4", "")).unwrap();
    let last = store
        .list::<Note>(
            A,
            &ListQuery {
                after: None,
                limit: 1,
                order: Order::Desc,
            },
        )
        .unwrap();
    assert_eq!(last.last_id.as_deref(), Some("n4"));
    assert_eq!(store.len().unwrap(), 6);
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An unbounded collection, for the writer and the timing.
#[test]
fn a_file_that_cannot_be_a_store_is_refused_with_the_reason() {
    let dir = state_dir();
    std::fs::create_dir_all(&dir).unwrap();
    // A file where the state directory should be.
    let file = dir.join("not-a-directory");
    std::fs::write(&file, "x").unwrap();
    let refused = DurableStore::open(&file.join("agents.redb"), Limits::default());
    assert!(
        matches!(refused, Err(OpenError::Io(_))),
        "{:?}",
        refused.err()
    );
    // Another program's file.
    let other = dir.join("other.redb");
    std::fs::write(
        &other,
        "not a redb file, but long enough to have a header ".repeat(200),
    )
    .unwrap();
    let refused = DurableStore::open(&other, Limits::default());
    assert!(
        matches!(refused, Err(OpenError::Damaged(_))),
        "{:?}",
        refused.err()
    );
    // A store held open (by this process here; another server in life).
    let path = dir.join("agents.redb");
    let held = DurableStore::open(&path, Limits::default()).unwrap();
    let refused = DurableStore::open(&path, Limits::default());
    assert!(
        matches!(refused, Err(OpenError::Locked)),
        "{:?}",
        refused.err()
    );
    drop(held);
    DurableStore::open(&path, Limits::default()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

static BIG: Collection = Collection {
    name: "note",
    parent: None,
    max_total: usize::MAX,
    max_per_owner: usize::MAX,
    evicts: false,
};
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Resp {
    id: String,
    body: String,
}
impl Record for Resp {
    fn collection() -> &'static Collection {
        &BIG
    }
    fn id(&self) -> &str {
        &self.id
    }
}

fn resp(id: String) -> Resp {
    Resp {
        id,
        body: "kept".into(),
    }
}

/// Writers at the same time share durable commits (group commit), and every commit that
/// returned is in the file after a reopen.
#[test]
fn concurrent_writers_share_durable_commits_and_lose_nothing() {
    let dir = state_dir();
    let path = dir.join("agents.redb");
    let limits = Limits {
        object_bytes: usize::MAX,
        owner_bytes: usize::MAX,
    };
    let store = std::sync::Arc::new(DurableStore::open(&path, limits).unwrap());
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..40 {
                    store.create(A, resp(format!("w{w}-{i:03}"))).unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let syncs = store
        .read(|t| t.counter(SYNC_ROW.0, SYNC_ROW.1, SYNC_ROW.2))
        .unwrap();
    assert!(
        (1..=320).contains(&syncs),
        "{syncs} durable commits for 320 writes"
    );
    drop(store);
    let reopened = DurableStore::open(&path, Limits::default()).unwrap();
    assert_eq!(reopened.read(|t| t.count::<Resp>(A)).unwrap(), 320);
    drop(reopened);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Not a test of its own: the writer `kill -9` stops in the test below. It creates
/// notes, one transaction each, printing each id once its commit returned.
#[test]
#[ignore]
fn child_writer() {
    let Some(path) = std::env::var_os("ABX_DURABLE_CHILD") else {
        return;
    };
    let limits = Limits {
        object_bytes: usize::MAX,
        owner_bytes: usize::MAX,
    };
    let store = DurableStore::open(Path::new(&path), limits).unwrap();
    let mut out = std::io::stdout();
    for i in 0.. {
        store.create(A, resp(format!("n{i:06}"))).unwrap();
        std::io::Write::write_all(&mut out, format!("n{i:06}\n").as_bytes()).unwrap();
        std::io::Write::flush(&mut out).unwrap();
    }
}

#[test]
fn kill_9_after_a_commit_loses_nothing() {
    use std::io::BufRead;
    let dir = state_dir();
    let path = dir.join("agents.redb");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "agents::durable::tests::child_writer",
            "--ignored",
        ])
        .args(["--nocapture", "--test-threads=1"])
        .env("ABX_DURABLE_CHILD", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut committed = Vec::new();
    while committed.len() < 50 {
        let line = lines.next().expect("the writer ended").unwrap();
        // libtest may print the test's name on the same line, before the first id.
        let last = line.rsplit(' ').next().unwrap_or_default();
        if last.len() == 7 && last.starts_with('n') {
            committed.push(last.to_string());
        }
    }
    // SIGKILL, mid-write most likely: no chance to flush anything.
    child.kill().unwrap();
    child.wait().unwrap();
    let store = DurableStore::open(&path, Limits::default()).unwrap();
    let kept = store.list::<Resp>(A, &ListQuery::all()).unwrap();
    let kept: Vec<&str> = kept.data.iter().map(|n| n.id.as_str()).collect();
    assert!(kept.len() >= committed.len());
    assert_eq!(&kept[..committed.len()], committed.as_slice());
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The cost of the workload: 10,000 creates, each its own durable transaction, then
/// 1,000 list pages of 20. `cargo test --release --lib durable::tests::timing --
/// --ignored --nocapture`; set `ABX_BENCH_DIR` to measure another disk.
#[test]
#[ignore]
fn timing() {
    let base = std::env::var_os("ABX_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(new_id("abx-bench-"));
    let limits = Limits {
        object_bytes: usize::MAX,
        owner_bytes: usize::MAX,
    };
    let store = DurableStore::open(&dir.join("agents.redb"), limits).unwrap();
    let n = 10_000;
    let body = "x".repeat(600);
    let start = Instant::now();
    let mut ids = Vec::new();
    for i in 0..n {
        let owner = if i % 10 == 0 { "bob" } else { "alice" };
        let id = new_id("resp_");
        let record = Resp {
            id: id.clone(),
            body: body.clone(),
        };
        store.create(Scope::owner(owner), record).unwrap();
        if owner == "alice" {
            ids.push(id);
        }
    }
    let create = start.elapsed();
    let start = Instant::now();
    let pages = 1_000;
    for i in 0..pages {
        let query = ListQuery {
            after: Some(ids[20 + (i * 7) % (ids.len() - 40)].as_str()),
            limit: 20,
            order: if i % 2 == 0 { Order::Asc } else { Order::Desc },
        };
        let page = store.list::<Resp>(A, &query).unwrap();
        assert_eq!(page.data.len(), 20);
    }
    let list = start.elapsed();
    let size = std::fs::metadata(dir.join("agents.redb")).unwrap().len();
    println!(
        "redb: create {:.1} µs/op (durable commit each), list page of 20 {:.1} µs/op, file {} KiB",
        create.as_secs_f64() * 1e6 / n as f64,
        list.as_secs_f64() * 1e6 / pages as f64,
        size / 1024
    );
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}
