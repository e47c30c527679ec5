//! The agents surface itself: the object store and the turns running now. Its own
//! module, not `agents`' root, so the resource modules that operate on it need nothing
//! of a root that re-exports them.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use super::memory::MemoryStore;
use super::records::{ObjectStore, StoreError};

/// The agents surface: its object store, and the turns running now (their CLIs'
/// process groups live here, not in the store: a process is not a record).
pub struct Agents<S: ObjectStore = MemoryStore> {
    pub store: S,
    running: Mutex<HashMap<String, Running>>,
}

/// A running turn of a stored response.
struct Running {
    owner: String,
    pgid: i32,
    /// Raised by cancel or delete; the turn reports `cancelled` even when its record
    /// is gone.
    cancelled: Arc<AtomicBool>,
}

impl<S: ObjectStore + Default> Default for Agents<S> {
    fn default() -> Agents<S> {
        Agents::new(S::default())
    }
}

impl<S: ObjectStore> Agents<S> {
    pub fn new(store: S) -> Agents<S> {
        Agents {
            store,
            running: Mutex::default(),
        }
    }

    /// Runs `f` as one store transaction on the blocking pool and awaits it. A durable
    /// commit waits for the disk (about 0.55 ms, `docs/architecture.md`), which a worker
    /// thread must never do; the closure owns what it needs, so it can move there.
    #[allow(dead_code)] // the routes move onto it with the durable store (issue 27)
    pub async fn transact<R, E, F>(self: &Arc<Self>, f: F) -> Result<R, E>
    where
        F: FnOnce(&mut S::Txn<'_>) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let agents = Arc::clone(self);
        match crate::runtime::file::blocking(move || agents.store.transact(f)).await {
            Ok(result) => result,
            Err(e) => Err(E::from(StoreError::Storage(e.to_string()))),
        }
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn register(&self, id: &str, owner: &str, pgid: i32, cancelled: Arc<AtomicBool>) {
        let run = Running {
            owner: owner.to_string(),
            pgid,
            cancelled,
        };
        self.runs().insert(id.to_string(), run);
    }

    pub(super) fn unregister(&self, id: &str) {
        self.runs().remove(id);
    }

    /// The process group and cancel flag of `owner`'s running response `id`.
    pub(super) fn running_turn(&self, owner: &str, id: &str) -> Option<(i32, Arc<AtomicBool>)> {
        let runs = self.runs();
        let run = runs.get(id).filter(|r| r.owner == owner)?;
        Some((run.pgid, run.cancelled.clone()))
    }
}
