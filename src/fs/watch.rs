//! Watching a directory: a polled snapshot diff, as the contract describes, woken early
//! by inotify so a change is reported within milliseconds and an idle watch costs no CPU
//! and no thread.
//!
//! The wait happens on the worker's own event loop ([`Readiness`] on the inotify
//! descriptor, or a timer when polling); only the rescan itself, a short directory walk,
//! runs on the blocking pool. While inotify covers every tracked directory a quiet tree
//! is not rescanned (only every 30 s, for changes inotify cannot see); without inotify,
//! or past the 5,000-entry cap, the tree is rescanned every `interval`.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use rustix::fs::OFlags;

use super::base::{BaseDir, CallerPath};
use super::error::FsError;
use super::resolve::Kind;
use super::walk::{self, Entry, Order, Rules, Visit, Visitor};
use crate::runtime::blocking;
use crate::runtime::ready::Readiness;

/// Most entries one watch tracks (the contract's cap).
pub const MAX_TRACKED: usize = 5000;
/// With inotify, a full rescan happens at least this often anyway, for changes inotify
/// does not report (writes through mmap, some network and FUSE file systems).
const SAFETY_RESCAN: Duration = Duration::from_secs(30);
/// How long a burst of changes (an editor's write-rename dance) may settle before the
/// rescan, so it is reported once.
const SETTLE: Duration = Duration::from_millis(5);

/// What one tracked entry looked like at the last scan.
#[derive(Clone, Debug, PartialEq)]
pub struct EntryState {
    pub kind: Kind,
    pub size: u64,
    pub mtime: (i64, u32),
}

/// One difference between two scans, `name` relative to the watched directory.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Created(String, EntryState),
    Modified(String, EntryState),
    Deleted(String, Kind),
    /// The tree grew past [`MAX_TRACKED`]; reported once.
    Overflow,
}

/// Why a watch cannot go on.
#[derive(Debug)]
pub enum WatchEnd {
    /// The watched directory is verified gone (it no longer exists, or is no longer a
    /// directory).
    RootGone,
    /// A rescan failed for another reason; the directory may well still be there.
    Failed(FsError),
}

#[derive(Default)]
struct Snapshot {
    entries: BTreeMap<String, EntryState>,
    truncated: bool,
    /// When the cap stopped the scan: the last entry it tracked. Entries after it in
    /// walk order were not looked at, so their absence says nothing.
    horizon: Option<String>,
}

impl Snapshot {
    /// Whether this scan looked at `name` (it is at or before the horizon).
    fn covers(&self, name: &str) -> bool {
        self.horizon
            .as_deref()
            .is_none_or(|horizon| walk_order(name, horizon) != std::cmp::Ordering::Greater)
    }
}

/// The order the walk visits entries in: sorted names, each directory's subtree right
/// after it (`a`, `a/x`, `a-b`), which is the order of the paths' components.
fn walk_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.split('/').cmp(b.split('/'))
}

/// A running watch.
pub struct Watcher {
    base: BaseDir,
    caller: CallerPath,
    recursive: bool,
    interval: Duration,
    snapshot: Snapshot,
    inotify: Option<(Arc<Inotify>, Readiness)>,
    last_scan: Instant,
    warned_truncated: bool,
}

impl Watcher {
    /// Takes the first snapshot (`NotFound` when the path is not a directory).
    pub async fn start(
        base: &BaseDir,
        caller: CallerPath,
        recursive: bool,
        interval: Duration,
    ) -> Result<Watcher, FsError> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .ok()
            .and_then(|inotify| {
                let readiness = Readiness::new(inotify.as_fd()).ok()?;
                Some((Arc::new(inotify), readiness))
            });
        let snapshot = rescan(
            base,
            &caller,
            recursive,
            inotify.as_ref().map(|i| i.0.clone()),
        )
        .await?;
        Ok(Watcher {
            base: base.clone(),
            warned_truncated: snapshot.truncated,
            caller,
            recursive,
            interval,
            snapshot,
            inotify,
            last_scan: Instant::now(),
        })
    }

    /// Entries tracked now.
    pub fn tracked(&self) -> usize {
        self.snapshot.entries.len()
    }

    /// Whether the tree has more entries than are tracked.
    pub fn truncated(&self) -> bool {
        self.snapshot.truncated
    }

    /// Whether inotify wakes this watch (otherwise it polls).
    pub fn uses_inotify(&self) -> bool {
        self.inotify.is_some()
    }

    /// The watched directory as answers show it.
    pub fn caller(&self) -> &CallerPath {
        &self.caller
    }

    /// Waits up to `wait` for changes and returns them (empty when nothing changed).
    pub async fn next(&mut self, wait: Duration) -> Result<Vec<Change>, WatchEnd> {
        let woken = self.inotify.is_some() && !self.snapshot.truncated;
        let rescan_now = if woken {
            let until_safety = SAFETY_RESCAN.saturating_sub(self.last_scan.elapsed());
            let (inotify, readiness) = self.inotify.as_ref().expect("woken implies inotify");
            let changed = monoio::select! {
                ready = readiness.readable() => ready.is_ok(),
                _ = monoio::time::sleep(wait.min(until_safety)) => false,
            };
            if changed {
                monoio::time::sleep(SETTLE).await;
                // Non-blocking reads: they only empty the queue the wake-up reported.
                while inotify.read_events().is_ok_and(|events| !events.is_empty()) {}
            }
            changed || self.last_scan.elapsed() >= SAFETY_RESCAN
        } else {
            monoio::time::sleep(self.interval.min(wait)).await;
            true
        };
        if !rescan_now {
            return Ok(Vec::new());
        }
        let inotify = self.inotify.as_ref().map(|i| i.0.clone());
        let next = match rescan(&self.base, &self.caller, self.recursive, inotify).await {
            Ok(next) => next,
            Err(error) => return Err(self.classify(error).await),
        };
        self.last_scan = Instant::now();
        let mut changes = diff(&self.snapshot, &next);
        if next.truncated && !self.warned_truncated {
            self.warned_truncated = true;
            // First, so a client knows before any other event of this scan that what
            // follows is no longer the whole tree.
            changes.insert(0, Change::Overflow);
        }
        self.snapshot = next;
        Ok(changes)
    }

    /// Reports `RootGone` only when a fresh look confirms the directory is gone.
    async fn classify(&self, error: FsError) -> WatchEnd {
        match super::tree::stat(&self.base, &self.caller).await {
            Ok(None) => WatchEnd::RootGone,
            Ok(Some(st)) if super::resolve::kind_of(&st) != Kind::Directory => WatchEnd::RootGone,
            _ => WatchEnd::Failed(error),
        }
    }
}

/// What changed between two scans. Past the cap a scan covers only the entries up to
/// its horizon: an entry the new scan did not reach has left tracking, not the disk,
/// and one the old scan did not reach is newly tracked, not new. Only entries both
/// scans looked at are compared.
fn diff(before: &Snapshot, after: &Snapshot) -> Vec<Change> {
    let mut changes = Vec::new();
    for (name, entry) in &before.entries {
        match after.entries.get(name) {
            None if after.covers(name) => changes.push(Change::Deleted(name.clone(), entry.kind)),
            None => {}
            Some(now) if now != entry => changes.push(Change::Modified(name.clone(), now.clone())),
            Some(_) => {}
        }
    }
    for (name, entry) in &after.entries {
        if !before.entries.contains_key(name) && before.covers(name) {
            changes.push(Change::Created(name.clone(), entry.clone()));
        }
    }
    changes
}

/// Scans the tree on the blocking pool, registering an inotify watch on every directory
/// it enters (through the descriptor, so the watch follows the confined inode, not a
/// path that could be swapped).
async fn rescan(
    base: &BaseDir,
    caller: &CallerPath,
    recursive: bool,
    inotify: Option<Arc<Inotify>>,
) -> Result<Snapshot, FsError> {
    let base = base.clone();
    let caller = caller.clone();
    let shown = caller.display();
    blocking(move || {
        let beneath = base.open()?;
        let root = beneath.open_dir(&caller, OFlags::RDONLY)?;
        let mut scanner = Scanner {
            snapshot: Snapshot::default(),
            inotify: inotify.as_deref(),
            last: None,
        };
        let rules = Rules {
            max_depth: if recursive { walk::MAX_TREE_DEPTH } else { 0 },
            order: Order::Interleaved,
        };
        walk::walk(root.as_fd(), rules, &mut scanner)
            .map_err(|e| FsError::io(e, caller.display()))?;
        Ok(scanner.snapshot)
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

struct Scanner<'a> {
    snapshot: Snapshot,
    inotify: Option<&'a Inotify>,
    /// The entry tracked last, which becomes the horizon if the cap is reached.
    last: Option<String>,
}

impl Visitor for Scanner<'_> {
    fn visit(&mut self, entry: &Entry<'_>) -> io::Result<Visit> {
        if self.snapshot.entries.len() >= MAX_TRACKED {
            self.snapshot.truncated = true;
            self.snapshot.horizon = self.last.take();
            return Ok(Visit::Stop);
        }
        let Ok(stat) = entry.lstat() else {
            return Ok(Visit::Skip);
        };
        let rel = entry.rel().into_owned();
        self.last = Some(rel.clone());
        self.snapshot.entries.insert(
            rel,
            EntryState {
                kind: entry.kind,
                size: stat.st_size as u64,
                mtime: (stat.st_mtime, stat.st_mtime_nsec as u32),
            },
        );
        Ok(Visit::Continue)
    }

    fn entered(&mut self, _rel: &str, dir: BorrowedFd<'_>) {
        if let Some(inotify) = self.inotify {
            let mask = AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_MODIFY
                | AddWatchFlags::IN_ATTRIB
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF;
            let proc_path = format!("/proc/self/fd/{}", dir.as_raw_fd());
            let _ = inotify.add_watch(OsStr::from_bytes(proc_path.as_bytes()), mask);
        }
    }

    /// A subdirectory deeper than the walk goes counts as past the cap (reported once
    /// as `overflow`, and the tree is polled); one that cannot be read is left out,
    /// as before (its entries are simply not tracked).
    fn unreadable(&mut self, rel: &str, error: io::Error) -> io::Result<()> {
        if rel.is_empty() {
            return Err(error);
        }
        if walk::is_too_deep(&error) {
            self.snapshot.truncated = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(size: u64) -> EntryState {
        EntryState {
            kind: Kind::File,
            size,
            mtime: (0, 0),
        }
    }

    fn snapshot(names: &[&str], horizon: Option<&str>) -> Snapshot {
        Snapshot {
            entries: names.iter().map(|n| (n.to_string(), file(1))).collect(),
            truncated: horizon.is_some(),
            horizon: horizon.map(str::to_string),
        }
    }

    #[test]
    fn walk_order_puts_a_subtree_right_after_its_directory() {
        let mut names = vec!["a-b", "a/x", "a", "b", "a/x/y", "a/z"];
        names.sort_by(|a, b| walk_order(a, b));
        assert_eq!(names, ["a", "a/x", "a/x/y", "a/z", "a-b", "b"]);
    }

    #[test]
    fn entries_past_the_horizon_are_neither_deleted_nor_created() {
        let before = snapshot(&["a", "b", "c", "d"], None);
        // A new entry early in the order pushed `c` and `d` out of tracking.
        let after = snapshot(&["a", "a/new", "b"], Some("b"));
        assert_eq!(
            diff(&before, &after),
            [Change::Created("a/new".into(), file(1))]
        );
        // Back: `a/new` removed, `c` is tracked again, and is not new.
        let later = snapshot(&["a", "b", "c"], Some("c"));
        assert_eq!(
            diff(&after, &later),
            [Change::Deleted("a/new".into(), Kind::File)]
        );
        // A deletion the scan did look at is still one.
        let gone = snapshot(&["b", "c", "d"], Some("d"));
        assert_eq!(
            diff(&later, &gone),
            [Change::Deleted("a".into(), Kind::File)]
        );
    }
}
