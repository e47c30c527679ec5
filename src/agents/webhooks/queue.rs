//! The handle of the webhook deliverer that the agents surface keeps: the sending end
//! of the delivering thread's queue, once the thread runs. Its own module, importing
//! nothing of the agents surface, so the surface can hold it while the deliverer
//! (`super::outbox`) uses the surface.

use std::sync::{Mutex, MutexGuard};

use futures_channel::mpsc;

/// A delivery the thread should try at `at_ms` (`done:<id>`: a try of `id` ended).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Due {
    pub at_ms: u64,
    pub id: String,
}

/// The delivering thread's queue, `None` while no thread runs.
#[derive(Default)]
pub struct Queue {
    pub sender: Mutex<Option<mpsc::UnboundedSender<Due>>>,
}

impl Queue {
    /// The queue's lock: held while a delivery is sent, and while the thread decides
    /// to end, so none falls between.
    pub fn lock(&self) -> MutexGuard<'_, Option<mpsc::UnboundedSender<Due>>> {
        self.sender.lock().unwrap_or_else(|e| e.into_inner())
    }
}
