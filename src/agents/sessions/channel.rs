//! A session's live events: every open `GET …/events` (and a streamed create) is a
//! subscriber, on whichever worker its connection lives; the session's actor publishes
//! each event once, to all of them. Nothing is replayed: a stream shows what happens
//! after it opened (the SDK's helpers open it before they post the input).
//!
//! Publishing never waits for a subscriber: each has room for [`BACKLOG`] events and
//! [`BACKLOG_BYTES`] of them, and one that falls that far behind is dropped (its stream
//! ends), so a stalled client can neither stall the turn nor make the server buffer
//! without bound. A subscription dropped (its client left) frees what it had queued at
//! once, not at the session's next event.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_channel::mpsc;
use serde_json::Value;

use crate::agents::records::new_id;

/// Events a subscriber may be behind by before it is dropped.
pub const BACKLOG: usize = 4096;
/// Bytes of events a subscriber may be behind by before it is dropped (command output
/// deltas run to 64 KiB each: 4,096 of them would be 256 MiB).
pub const BACKLOG_BYTES: usize = 16 * 1024 * 1024;

/// One event as published: its type (the SSE event name) and its JSON.
#[derive(Debug)]
pub struct Published {
    pub kind: String,
    pub json: String,
    /// The session went idle or failed after the turn a streamed create waits for.
    pub ends_turn: bool,
}

/// The receiving half of a subscription: a stream of the session's events.
pub struct Subscription {
    rx: mpsc::Receiver<Arc<Published>>,
    /// Bytes queued for it and not yet taken.
    queued: Arc<AtomicUsize>,
}

impl futures_core::Stream for Subscription {
    type Item = Arc<Published>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = Pin::new(&mut self.rx).poll_next(cx);
        if let Poll::Ready(Some(event)) = &next {
            self.queued.fetch_sub(event.json.len(), Ordering::Relaxed);
        }
        next
    }
}

#[cfg(test)]
impl Subscription {
    /// The next event if one is queued.
    fn try_recv(&mut self) -> Result<Arc<Published>, mpsc::TryRecvError> {
        let event = self.rx.try_recv()?;
        self.queued.fetch_sub(event.json.len(), Ordering::Relaxed);
        Ok(event)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // The queued events live as long as the sender, which the next publish drops:
        // freed now, whether or not the session publishes again.
        self.rx.close();
        while self.rx.try_recv().is_ok() {}
    }
}

struct Subscriber {
    tx: mpsc::Sender<Arc<Published>>,
    queued: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Subscribers {
    next: u64,
    open: Vec<(u64, Subscriber)>,
}

/// Every session's subscribers.
#[derive(Default)]
pub struct Channels {
    sessions: Mutex<HashMap<String, Subscribers>>,
    published: AtomicU64,
}

impl Channels {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Subscribers>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new subscriber of `session`'s events.
    pub fn subscribe(&self, session: &str) -> Subscription {
        let (tx, rx) = mpsc::channel(BACKLOG);
        let queued = Arc::new(AtomicUsize::new(0));
        let mut sessions = self.lock();
        let subscribers = sessions.entry(session.to_string()).or_default();
        subscribers.next += 1;
        let key = subscribers.next;
        let subscriber = Subscriber {
            tx,
            queued: queued.clone(),
        };
        subscribers.open.push((key, subscriber));
        Subscription { rx, queued }
    }

    /// Gives `event` an `event_id` and sends it to every subscriber of `session`.
    pub fn publish(&self, session: &str, mut event: Value, ends_turn: bool) -> Value {
        event["event_id"] = Value::String(new_id("evt_"));
        self.published.fetch_add(1, Ordering::Relaxed);
        let kind = event["type"].as_str().unwrap_or("message").to_string();
        let published = Arc::new(Published {
            kind,
            json: event.to_string(),
            ends_turn,
        });
        let mut sessions = self.lock();
        if let Some(subscribers) = sessions.get_mut(session) {
            // A closed or hopelessly behind subscriber is forgotten here.
            let size = published.json.len();
            subscribers.open.retain_mut(|(_, subscriber)| {
                if subscriber.queued.load(Ordering::Relaxed) + size > BACKLOG_BYTES {
                    return false;
                }
                let sent = subscriber.tx.try_send(published.clone()).is_ok();
                if sent {
                    subscriber.queued.fetch_add(size, Ordering::Relaxed);
                }
                sent
            });
            if subscribers.open.is_empty() {
                sessions.remove(session);
            }
        }
        event
    }

    /// Ends every stream of a deleted session.
    pub fn close(&self, session: &str) {
        self.lock().remove(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_subscriber_gets_each_event_once_with_a_unique_id() {
        let channels = Channels::default();
        let mut a = channels.subscribe("s");
        let mut b = channels.subscribe("s");
        let mut other = channels.subscribe("t");
        let first = channels.publish("s", json!({"type": "x"}), false);
        let second = channels.publish("s", json!({"type": "y"}), true);
        assert_ne!(first["event_id"], second["event_id"]);
        for rx in [&mut a, &mut b] {
            let got: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
            assert_eq!(got.len(), 2);
            assert_eq!(got[0].kind, "x");
            assert!(got[1].ends_turn);
        }
        assert!(other.try_recv().is_err(), "nothing for another session");
        drop(a);
        channels.publish("s", json!({"type": "z"}), false);
        assert_eq!(b.try_recv().unwrap().kind, "z", "the other stream goes on");
    }

    #[test]
    fn a_subscriber_that_falls_behind_is_dropped() {
        let channels = Channels::default();
        let mut slow = channels.subscribe("s");
        for _ in 0..BACKLOG + 2 {
            channels.publish("s", json!({"type": "x"}), false);
        }
        let mut got = 0;
        while slow.try_recv().is_ok() {
            got += 1;
        }
        assert!(got <= BACKLOG + 1, "{got}");
        // The stream ended: the sender was dropped.
        assert!(matches!(slow.try_recv(), Err(mpsc::TryRecvError::Closed)));
    }

    #[test]
    fn a_subscriber_too_many_bytes_behind_is_dropped_and_one_that_reads_is_not() {
        let channels = Channels::default();
        let mut slow = channels.subscribe("s");
        let mut reader = channels.subscribe("s");
        let big = "x".repeat(1024 * 1024);
        for _ in 0..BACKLOG_BYTES / big.len() + 1 {
            channels.publish("s", json!({"type": "x", "delta": big}), false);
            // The reader keeps up: what it took no longer counts against it.
            assert!(reader.try_recv().is_ok());
        }
        let mut got = 0;
        while slow.try_recv().is_ok() {
            got += 1;
        }
        assert!(got < BACKLOG_BYTES / big.len(), "{got}");
        assert!(matches!(slow.try_recv(), Err(mpsc::TryRecvError::Closed)));
        channels.publish("s", json!({"type": "y"}), false);
        assert_eq!(
            reader.try_recv().unwrap().kind,
            "y",
            "the reader is still there"
        );
    }

    #[test]
    fn a_dropped_subscription_frees_its_queue_at_once() {
        let channels = Channels::default();
        let gone = channels.subscribe("s");
        let mut kept = channels.subscribe("s");
        channels.publish("s", json!({"type": "x"}), false);
        let event = kept.try_recv().unwrap();
        assert_eq!(Arc::strong_count(&event), 2, "also queued for the other");
        drop(gone);
        assert_eq!(
            Arc::strong_count(&event),
            1,
            "freed with the subscription, before any next publish"
        );
    }
}
