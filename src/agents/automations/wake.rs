//! The handle of the automations thread that the agents surface keeps: the sending end
//! of its queue, once the thread runs. Its own module, importing nothing of the agents
//! surface, so the surface can hold it while the thread (`super::scheduler`) uses the
//! surface.

use std::sync::{Mutex, MutexGuard, OnceLock};

use futures_channel::mpsc;

/// What the thread is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// The automation `id` of `owner` is next due at `at` (Unix seconds), or no longer
    /// (`at: None`: paused, completed, deleted).
    Due {
        owner: String,
        id: String,
        at: Option<i64>,
    },
    /// Deliver the queued invocation `invocation` of automation `id`.
    Deliver {
        owner: String,
        id: String,
        invocation: String,
    },
    /// A delivery ended: its place is free (the thread's own).
    Delivered,
}

/// Starts the thread (it reads the store's schedule), once the server can deliver.
pub type Restart = Box<dyn Fn() + Send + Sync>;

/// The thread's queue, `None` while no thread runs: before it is started, and after it
/// ended with nothing scheduled and nothing to deliver.
#[derive(Default)]
pub struct Wake {
    pub sender: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    restart: OnceLock<Restart>,
}

impl Wake {
    /// The queue's lock: held while a job is sent, and while the thread decides to
    /// end, so none falls between.
    pub fn lock(&self) -> MutexGuard<'_, Option<mpsc::UnboundedSender<Job>>> {
        self.sender.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How [`Wake::send`] starts a thread when none runs (the routes', which hold
    /// what a delivery needs); the first one given stays.
    pub fn set_restart(&self, restart: Restart) {
        let _ = self.restart.set(restart);
    }

    /// Tells the thread, starting one if none runs (it reads the schedule, so what was
    /// committed before this job is in it, and then takes the job). Without a way to
    /// start one (a store the server's routes never set up), the job waits for the
    /// next thread's read of the store.
    pub fn send(&self, job: Job) {
        {
            let sender = self.lock();
            if let Some(tx) = sender.as_ref() {
                let _ = tx.unbounded_send(job);
                return;
            }
        }
        let Some(restart) = self.restart.get() else {
            return;
        };
        restart();
        let sender = self.lock();
        if let Some(tx) = sender.as_ref() {
            let _ = tx.unbounded_send(job);
        }
    }
}
