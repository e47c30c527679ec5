//! The handle of the automations thread that the agents surface keeps: the sending end
//! of its queue, once the thread runs. Its own module, importing nothing of the agents
//! surface, so the surface can hold it while the thread (`super::scheduler`) uses the
//! surface.

use std::sync::Mutex;

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

/// The thread's queue, `None` until the thread is started.
#[derive(Default)]
pub struct Wake {
    pub sender: Mutex<Option<mpsc::UnboundedSender<Job>>>,
}

impl Wake {
    /// Tells the thread, if it runs (a server that runs none reads the store's schedule
    /// when it starts one).
    pub fn send(&self, job: Job) {
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = sender.as_ref() {
            let _ = tx.unbounded_send(job);
        }
    }
}
