//! envd's directory watches on the file routes' watch engine (`fs::watch`: inotify
//! wakes a snapshot diff). A change becomes envd's `FilesystemEvent`: `CREATE`,
//! `WRITE` or `REMOVE` with the path relative to the watched directory (a rename is
//! the old name's `REMOVE` and the new name's `CREATE`, as a diff sees it), and with
//! `include_entry` the entry as `Stat` reports it.
//!
//! A streamed watch (`WatchDir`) runs in its request. A polled one (`CreateWatcher`,
//! read with `GetWatcherEvents`) runs as a task on the worker that created it and
//! queues its events for any worker to take, up to [`MAX_QUEUED`]: a watcher nobody
//! reads that overflows is ended, and says so on the next read, rather than dropping
//! events silently.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::proto::filesystem::{EntryInfo, EventType, FilesystemEvent};
use crate::fs::watch::{Change, WatchEnd, Watcher};
use crate::fs::{BaseDir, CallerPath};
use crate::process::output::Notify;

/// Events a polled watcher holds for its reader.
pub const MAX_QUEUED: usize = 10_000;
/// Polled watchers one identity may hold.
pub const MAX_PER_OWNER: usize = 64;
/// How long one wait of the engine lasts before it looks again.
const WAIT: Duration = Duration::from_secs(1);

/// A change as envd names it.
pub async fn events_of(
    base: &BaseDir,
    root: &CallerPath,
    changes: Vec<Change>,
    include_entry: bool,
) -> Vec<FilesystemEvent> {
    let mut events = Vec::with_capacity(changes.len());
    for change in changes {
        let (name, kind) = match change {
            Change::Created(name, _) => (name, EventType::Create),
            Change::Modified(name, _) => (name, EventType::Write),
            Change::Deleted(name, _) => (name, EventType::Remove),
            Change::Overflow => continue,
        };
        let entry = if include_entry && kind != EventType::Remove {
            entry_of(base, root, &name).await
        } else {
            None
        };
        events.push(FilesystemEvent {
            name,
            r#type: kind as i32,
            entry,
        });
    }
    events
}

async fn entry_of(base: &BaseDir, root: &CallerPath, name: &str) -> Option<EntryInfo> {
    let caller = root.join(std::ffi::OsStr::new(name));
    super::files::stat(base, caller).await.ok().flatten()
}

/// Why a watch ended, in words for the caller.
pub fn end_message(end: &WatchEnd, root: &CallerPath) -> String {
    match end {
        WatchEnd::RootGone => format!("the watched directory '{}' is gone", root.display()),
        WatchEnd::Failed(error) => format!("the watch of '{}' failed: {error}", root.display()),
    }
}

/// The polled watchers of every identity.
#[derive(Default)]
pub struct Watchers {
    table: Mutex<HashMap<String, Arc<Polled>>>,
}

/// One polled watcher.
pub struct Polled {
    pub owner: String,
    queue: Mutex<Queue>,
    stop: AtomicBool,
    stopped: Notify,
}

#[derive(Default)]
struct Queue {
    events: VecDeque<FilesystemEvent>,
    /// Why it ended, once it has: said on the read after the last events.
    ended: Option<String>,
}

/// Why a polled watcher could not be made.
#[derive(Debug)]
pub struct TooMany;

impl Watchers {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Polled>>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a polled watcher on this worker; answers its id.
    pub fn start(
        self: &Arc<Self>,
        watcher: Watcher,
        owner: &str,
        include_entry: bool,
        base: BaseDir,
    ) -> Result<String, TooMany> {
        let id = new_id();
        let polled = Arc::new(Polled {
            owner: owner.to_string(),
            queue: Mutex::new(Queue::default()),
            stop: AtomicBool::new(false),
            stopped: Notify::default(),
        });
        {
            let mut table = self.lock();
            if table.values().filter(|p| p.owner == owner).count() >= MAX_PER_OWNER {
                return Err(TooMany);
            }
            table.insert(id.clone(), polled.clone());
        }
        monoio::spawn(run(watcher, polled, include_entry, base));
        Ok(id)
    }

    /// `owner`'s watcher `id`; another identity's is not found.
    pub fn get(&self, id: &str, owner: &str) -> Option<Arc<Polled>> {
        self.lock().get(id).filter(|p| p.owner == owner).cloned()
    }

    /// Stops and forgets `owner`'s watcher `id`; `false` when there is none.
    pub fn remove(&self, id: &str, owner: &str) -> bool {
        let mut table = self.lock();
        match table.get(id) {
            Some(polled) if polled.owner == owner => {
                polled.stop.store(true, Ordering::SeqCst);
                polled.stopped.notify();
                table.remove(id);
                true
            }
            _ => false,
        }
    }
}

impl Polled {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The events queued since the last read; `Err` once the watcher has ended and
    /// every event it queued was read.
    pub fn take(&self) -> Result<Vec<FilesystemEvent>, String> {
        let mut queue = self.lock();
        if queue.events.is_empty() {
            if let Some(why) = &queue.ended {
                return Err(why.clone());
            }
        }
        Ok(queue.events.drain(..).collect())
    }
}

async fn run(mut watcher: Watcher, polled: Arc<Polled>, include_entry: bool, base: BaseDir) {
    while !polled.stop.load(Ordering::SeqCst) {
        let seen = polled.stopped.version();
        let next = monoio::select! {
            next = watcher.next(WAIT) => Some(next),
            _ = polled.stopped.changed(seen) => None,
        };
        let changes = match next {
            None => break,
            Some(Ok(changes)) => changes,
            Some(Err(end)) => {
                polled.lock().ended = Some(end_message(&end, watcher.caller()));
                break;
            }
        };
        if changes.is_empty() {
            continue;
        }
        let events = events_of(&base, watcher.caller(), changes, include_entry).await;
        let mut queue = polled.lock();
        queue.events.extend(events);
        if queue.events.len() > MAX_QUEUED {
            queue.events.truncate(MAX_QUEUED);
            queue.ended = Some(format!(
                "the watcher held {MAX_QUEUED} unread events and stopped; read them more often, or create a new watcher"
            ));
            break;
        }
    }
}

fn new_id() -> String {
    let mut bytes = [0u8; 12];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
