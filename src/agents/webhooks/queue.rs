//! The handle of the webhook deliverer that the agents surface keeps: the sending end
//! of the delivering thread's queue, once the thread runs. Its own module, importing
//! nothing of the agents surface, so the surface can hold it while the deliverer
//! (`super::outbox`) uses the surface.

use std::sync::Mutex;

use futures_channel::mpsc;

/// A delivery the thread should try at `at_ms` (`done:<id>`: a try of `id` ended).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Due {
    pub at_ms: u64,
    pub id: String,
}

/// The delivering thread's queue, `None` until the thread is started.
#[derive(Default)]
pub struct Queue {
    pub sender: Mutex<Option<mpsc::UnboundedSender<Due>>>,
}
