//! The agents surface itself: the object store and the turns running now. Its own
//! module, not `agents`' root, so the resource modules that operate on it need nothing
//! of a root that re-exports them.
//!
//! The store is synchronous and a durable commit waits for the disk, which a worker
//! thread must never do: every store call goes through [`Agents::transact`] (one
//! transaction on the blocking pool, awaited) or the one-operation helpers beside it.
//! The store itself is private to this module, so nothing can call it another way.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

use super::automations::wake::Wake;
use super::durable::DurableStore;
use super::records::{ListQuery, ObjectStore, Page, Record, Scope, StoreError, Transaction};
use super::webhooks::queue::Queue;

/// The store of the running server: redb, in `<ABX_STATE_DIR>/agents.redb` (or in
/// memory when that cannot be opened; see `agents::store`).
pub type AgentsStore = DurableStore;

/// The agents surface: its object store, and the turns running now (their CLIs'
/// process groups live here, not in the store: a process is not a record).
pub struct Agents<S: ObjectStore = AgentsStore> {
    store: OnceLock<S>,
    /// Opens the store at first use, for a server whose agents group is off at startup
    /// (it may be switched on by a policy later): no file is opened, and no memory
    /// held, for a group nobody uses.
    opener: Mutex<Option<Opener<S>>>,
    running: Mutex<HashMap<String, Running>>,
    /// The thread that delivers the webhook outbox (started at its first delivery).
    webhooks: Queue,
    /// The automations thread's queue (started with the server).
    automations: Wake,
}

type Opener<S> = Box<dyn FnOnce() -> S + Send>;

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

/// A [`Scope`] that owns its strings, to move into a transaction.
struct Owned {
    owner: String,
    parent: Option<String>,
}

impl Owned {
    fn of(scope: Scope<'_>) -> Owned {
        Owned {
            owner: scope.owner.to_string(),
            parent: scope.parent.map(str::to_string),
        }
    }

    fn scope(&self) -> Scope<'_> {
        Scope {
            owner: &self.owner,
            parent: self.parent.as_deref(),
        }
    }
}

impl<S: ObjectStore> Agents<S> {
    pub fn new(store: S) -> Agents<S> {
        Agents {
            store: OnceLock::from(store),
            opener: Mutex::new(None),
            running: Mutex::default(),
            webhooks: Queue::default(),
            automations: Wake::default(),
        }
    }

    /// A surface whose store `open` makes when it is first used (on the blocking pool,
    /// as every store call runs).
    pub fn opened_on_first_use(open: impl FnOnce() -> S + Send + 'static) -> Agents<S> {
        Agents {
            store: OnceLock::new(),
            opener: Mutex::new(Some(Box::new(open))),
            running: Mutex::default(),
            webhooks: Queue::default(),
            automations: Wake::default(),
        }
    }

    /// The store itself (opened now if it was not yet).
    pub fn into_store(self) -> S {
        self.store();
        match self.store.into_inner() {
            Some(store) => store,
            None => unreachable!("store() has just made it"),
        }
    }

    fn store(&self) -> &S {
        self.store.get_or_init(|| {
            let open = self.opener.lock().unwrap_or_else(|e| e.into_inner()).take();
            // `OnceLock` runs one initializer at a time, so the opener is there once.
            match open {
                Some(open) => open(),
                None => unreachable!("the agents store has neither a store nor an opener"),
            }
        })
    }

    /// Runs `f` as one store transaction on the blocking pool and awaits it. A durable
    /// commit waits for the disk (about 0.55 ms, `docs/architecture.md`), which a worker
    /// thread must never do; the closure owns what it needs, so it can move there.
    pub async fn transact<R, E, F>(self: &Arc<Self>, f: F) -> Result<R, E>
    where
        F: FnOnce(&mut S::Txn<'_>) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        self.on_pool(move |store| store.transact(f)).await
    }

    /// `run` against the store, on the blocking pool.
    async fn on_pool<R, E>(
        self: &Arc<Self>,
        run: impl FnOnce(&S) -> Result<R, E> + Send + 'static,
    ) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let agents = Arc::clone(self);
        match crate::runtime::file::blocking(move || run(agents.store())).await {
            Ok(result) => result,
            Err(e) => Err(E::from(StoreError::Storage(e.to_string()))),
        }
    }

    /// Runs `f`, which only reads, on the blocking pool against a snapshot of the store
    /// ([`ObjectStore::read`]): it waits for no writer, so reads never queue behind
    /// commits.
    pub async fn read<R, E, F>(self: &Arc<Self>, f: F) -> Result<R, E>
    where
        F: FnOnce(&mut S::Txn<'_>) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        self.on_pool(move |store| store.read(f)).await
    }

    /// Runs `f` as one store transaction from where nothing can await (a `Drop`): on a
    /// worker it is spawned there (and runs on the blocking pool, as
    /// [`Agents::transact`]); on any other thread, which may block, it runs at once.
    /// Nobody hears how it went.
    pub fn transact_detached<R, F>(self: &Arc<Self>, f: F)
    where
        F: FnOnce(&mut S::Txn<'_>) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        if crate::runtime::on_worker() {
            let agents = Arc::clone(self);
            monoio::spawn(async move {
                let _ = agents.transact(f).await;
            });
        } else {
            let _ = self.store().transact(f);
        }
    }

    /// The record `id` of the scope.
    pub async fn get<T: Record>(
        self: &Arc<Self>,
        scope: Scope<'_>,
        id: &str,
    ) -> Result<T, StoreError> {
        let (scope, id) = (Owned::of(scope), id.to_string());
        self.read(move |t| t.get(scope.scope(), &id)).await
    }

    /// One page of the scope's records of `T`.
    pub async fn list<T: Record>(
        self: &Arc<Self>,
        scope: Scope<'_>,
        query: &ListQuery<'_>,
    ) -> Result<Page<T>, StoreError> {
        let scope = Owned::of(scope);
        let (after, limit, order) = (query.after.map(str::to_string), query.limit, query.order);
        self.read(move |t| {
            let query = ListQuery {
                after: after.as_deref(),
                limit,
                order,
            };
            t.list(scope.scope(), &query)
        })
        .await
    }

    /// Changes the record `id` of the scope with `f`; returns what `f` returned.
    pub async fn update<T: Record, R: Send + 'static>(
        self: &Arc<Self>,
        scope: Scope<'_>,
        id: &str,
        f: impl FnOnce(&mut T) -> R + Send + 'static,
    ) -> Result<R, StoreError> {
        let (scope, id) = (Owned::of(scope), id.to_string());
        self.transact(move |t| t.update(scope.scope(), &id, f))
            .await
    }

    /// Forgets the record `id` of the scope (and its children); returns it.
    pub async fn delete<T: Record>(
        self: &Arc<Self>,
        scope: Scope<'_>,
        id: &str,
    ) -> Result<T, StoreError> {
        let (scope, id) = (Owned::of(scope), id.to_string());
        self.transact(move |t| t.delete(scope.scope(), &id)).await
    }

    /// One transaction right here, for unit tests (which run on no worker).
    #[cfg(test)]
    pub(crate) fn transact_now<R, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&mut S::Txn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        self.store().transact(f)
    }

    /// The webhook deliverer's queue ([`super::webhooks::outbox`]).
    pub fn webhooks(&self) -> &Queue {
        &self.webhooks
    }

    /// The automations thread's queue ([`super::automations::scheduler`]).
    pub fn automations(&self) -> &Wake {
        &self.automations
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
