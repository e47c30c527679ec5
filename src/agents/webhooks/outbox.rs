//! The webhook outbox: every event to deliver is a record of the agents store before
//! anything is sent, so it outlives a receiver that is down and a server that stops;
//! one background thread (`abx-webhooks`, its own monoio runtime on epoll and a small
//! blocking pool: no HTTP worker ever waits for a receiver) sends them, and runs only
//! while something is queued: a server with nothing to deliver has no such thread.
//!
//! A delivery is tried at most [`MAX_ATTEMPTS`] times: again after 1, 2, 4 and 8 s
//! when the receiver cannot be reached or answers anything but 2xx, then dropped (with a
//! log line). Its attempt count and next time are written back after each try, so a
//! restart resumes the schedule (a delivery due while the server was down is sent at
//! once). Delivery is at least once: a send that succeeded just before a crash, whose
//! record was not yet deleted, is sent again with the same `webhook-id`, which is how
//! receivers deduplicate (Standard Webhooks).
//!
//! The records belong to one internal owner ([`OUTBOX`], a name no identity can have:
//! it holds a NUL), so the thread finds them all with one list, no identity ever lists
//! them, and the store's per-owner bounds bound the queue: at most [`MAX_QUEUED`]
//! deliveries, the oldest dropped first to make room.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_channel::mpsc;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::super::records::{
    new_id, Collection, ListQuery, Record, Scope, StoreError, Transaction,
};
use super::super::surface::Agents;
use super::super::RESUME_AFTER_START;
use super::queue::Due;
use super::WebhookEndpoint;

/// The owner of every queued delivery.
pub const OUTBOX: &str = "\0webhook-outbox";

/// Tries of one delivery, and the waits between them.
pub const MAX_ATTEMPTS: u32 = 5;
const BACKOFF_MS: [u64; 4] = [1_000, 2_000, 4_000, 8_000];

/// Deliveries queued at most (the oldest goes first when full).
pub const MAX_QUEUED: usize = 10_000;

/// Deliveries sent at once.
const IN_FLIGHT: usize = 16;

pub static DELIVERIES: Collection = Collection {
    name: "webhook_delivery",
    parent: None,
    max_total: MAX_QUEUED,
    max_per_owner: MAX_QUEUED,
    evicts: true,
};

/// One event for one endpoint, not yet delivered.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Delivery {
    pub id: String,
    /// The endpoint's owner, and the endpoint (looked up at each try: a deleted one
    /// drops the delivery, a rotated secret signs it).
    pub owner: String,
    pub endpoint_id: String,
    /// The event id (`webhook-id`, the same at every try).
    pub event_id: String,
    /// The exact bytes to send.
    pub payload: String,
    pub attempts: u32,
    /// When the next try is due (Unix ms).
    pub next_at_ms: u64,
}

impl Record for Delivery {
    fn collection() -> &'static Collection {
        &DELIVERIES
    }
    fn id(&self) -> &str {
        &self.id
    }
    fn evictable(&self) -> bool {
        true
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Queues `event` for `endpoint_id` of `owner` inside the caller's transaction; the
/// caller hands the returned [`Due`] to [`Deliverer::schedule`] once it committed.
pub fn enqueue<T: Transaction>(
    t: &mut T,
    owner: &str,
    endpoint_id: &str,
    event: &Value,
) -> Result<Due, StoreError> {
    let delivery = Delivery {
        id: new_id("whd_"),
        owner: owner.to_string(),
        endpoint_id: endpoint_id.to_string(),
        event_id: event["id"].as_str().unwrap_or_default().to_string(),
        payload: event.to_string(),
        attempts: 0,
        next_at_ms: now_ms(),
    };
    let due = Due {
        at_ms: delivery.next_at_ms,
        id: delivery.id.clone(),
    };
    t.create(Scope::owner(OUTBOX), delivery)?;
    Ok(due)
}

/// Hands committed deliveries to the delivering thread, starting it if needed (a new
/// thread reads every queued delivery, these committed ones too).
pub fn schedule(agents: &Arc<Agents>, due: Vec<Due>) {
    let mut sender = agents.webhooks().lock();
    match sender.as_ref() {
        None => *sender = start(agents.clone(), Duration::ZERO),
        Some(tx) => {
            for due in due {
                let _ = tx.unbounded_send(due);
            }
        }
    }
}

/// At server start: starts the delivering thread, which reads what the last server
/// left queued once start has settled ([`RESUME_AFTER_START`]). Deliveries scheduled
/// meanwhile wait in its queue.
pub fn resume(agents: &Arc<Agents>) {
    let mut sender = agents.webhooks().lock();
    if sender.is_none() {
        *sender = start(agents.clone(), RESUME_AFTER_START);
    }
}

/// The thread; it touches the store (a first use may open it) only after `settle`.
fn start(agents: Arc<Agents>, settle: Duration) -> Option<mpsc::UnboundedSender<Due>> {
    let (tx, rx) = mpsc::unbounded();
    let wake = tx.clone();
    let started = std::thread::Builder::new()
        .name("abx-webhooks".into())
        .spawn(move || {
            std::thread::sleep(settle);
            let pool = crate::runtime::blocking::BlockingPool::new(4, Duration::from_secs(10));
            let run = deliver_all(agents, rx, wake);
            if let Err(e) = crate::runtime::block_on(crate::runtime::IoDriver::Epoll, pool, run) {
                crate::log!("webhooks: the delivery thread could not start its runtime: {e}");
            }
        });
    match started {
        Ok(_) => Some(tx),
        Err(e) => {
            crate::log!("webhooks: the delivery thread could not start: {e}");
            None
        }
    }
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Due>) -> Option<Due> {
    use futures_core::Stream;
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *rx).poll_next(cx)).await
}

/// The thread's loop: a schedule in memory (rebuilt from the store at start), fed by
/// new deliveries and by retries; it returns when nothing is left to send.
async fn deliver_all(
    agents: Arc<Agents>,
    mut rx: mpsc::UnboundedReceiver<Due>,
    wake: mpsc::UnboundedSender<Due>,
) {
    let mut schedule: BinaryHeap<Reverse<Due>> = BinaryHeap::new();
    let queued = agents
        .transact(|t| t.list::<Delivery>(Scope::owner(OUTBOX), &ListQuery::all()))
        .await;
    match queued {
        Ok(page) => {
            for d in page.data {
                schedule.push(Reverse(Due {
                    at_ms: d.next_at_ms,
                    id: d.id,
                }));
            }
        }
        Err(e) => crate::log!("webhooks: the queued deliveries could not be read: {e:?}"),
    }
    // Ids scheduled or being tried: a delivery is never tried twice at once, however
    // it was announced (the first read of the store and a schedule may both name it).
    let mut known: HashSet<String> = schedule.iter().map(|Reverse(d)| d.id.clone()).collect();
    let in_flight = Rc::new(Cell::new(0usize));
    loop {
        let now = now_ms();
        while in_flight.get() < IN_FLIGHT
            && schedule.peek().is_some_and(|Reverse(d)| d.at_ms <= now)
        {
            let Some(Reverse(due)) = schedule.pop() else {
                break;
            };
            if due.id.is_empty() {
                continue;
            }
            in_flight.set(in_flight.get() + 1);
            let (agents, in_flight, wake) = (agents.clone(), in_flight.clone(), wake.clone());
            monoio::spawn(async move {
                let id = due.id.clone();
                let retry = attempt(&agents, due.id).await;
                in_flight.set(in_flight.get() - 1);
                // Wakes the loop in any case: the id is done with (or due again), a
                // slot is free.
                let _ = wake.unbounded_send(Due {
                    at_ms: 0,
                    id: format!("done:{id}"),
                });
                if let Some(retry) = retry {
                    let _ = wake.unbounded_send(retry);
                }
            });
        }
        if schedule.is_empty() && in_flight.get() == 0 {
            // Nothing to send: the thread ends rather than idle, and the next
            // `schedule` starts another, which reads the store. Decided under the queue's
            // lock, which `schedule` holds while it sends, so no delivery falls between.
            let mut sender = agents.webhooks().lock();
            match rx.try_recv() {
                Ok(due) => {
                    drop(sender);
                    take(&mut schedule, &mut known, due);
                    continue;
                }
                Err(_) => {
                    *sender = None;
                    return;
                }
            }
        }
        let wait = match schedule.peek() {
            Some(Reverse(d)) if in_flight.get() < IN_FLIGHT => d.at_ms.saturating_sub(now),
            _ => 60_000,
        };
        match monoio::time::timeout(Duration::from_millis(wait.max(1)), next(&mut rx)).await {
            Ok(Some(due)) => {
                take(&mut schedule, &mut known, due);
                // Everything else already sent, without waiting again.
                while let Ok(due) = rx.try_recv() {
                    take(&mut schedule, &mut known, due);
                }
            }
            Ok(None) => return,
            Err(_) => {}
        }
    }
}

/// Adds `due` to the schedule unless it is there or being tried; `done:<id>` says a
/// try of `id` ended.
fn take(schedule: &mut BinaryHeap<Reverse<Due>>, known: &mut HashSet<String>, due: Due) {
    if let Some(id) = due.id.strip_prefix("done:") {
        known.remove(id);
    } else if !due.id.is_empty() && known.insert(due.id.clone()) {
        schedule.push(Reverse(due));
    }
}

/// One try of delivery `id`; its retry when there is one.
async fn attempt(agents: &Arc<Agents>, id: String) -> Option<Due> {
    let key = id.clone();
    let loaded = agents
        .transact(move |t| {
            let outbox = Scope::owner(OUTBOX);
            let delivery: Delivery = match t.get(outbox, &key) {
                Ok(d) => d,
                Err(StoreError::NotFound) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            match t.get::<WebhookEndpoint>(Scope::owner(&delivery.owner), &delivery.endpoint_id) {
                Ok(endpoint) => {
                    let secret = endpoint.secret()?;
                    Ok(Some((delivery, endpoint.url, secret)))
                }
                Err(StoreError::NotFound) => {
                    t.delete::<Delivery>(outbox, &key)?;
                    Ok(None)
                }
                Err(e) => Err(e.into()),
            }
        })
        .await;
    let (mut delivery, url, secret) = match loaded {
        Ok(Some(loaded)) => loaded,
        Ok(None) => return None,
        Err(e) => {
            let e: super::AgentError = e;
            crate::log!("webhooks: delivery {id} could not be read: {e:?}");
            // Tried again later rather than lost.
            return Some(Due {
                at_ms: now_ms() + BACKOFF_MS[BACKOFF_MS.len() - 1],
                id,
            });
        }
    };
    let outcome = super::post::deliver(
        &url,
        &secret,
        &delivery.event_id,
        delivery.payload.as_bytes(),
    )
    .await;
    delivery.attempts += 1;
    let delivered = matches!(outcome, Ok(status) if (200..300).contains(&status));
    let last = delivery.attempts >= MAX_ATTEMPTS;
    if !delivered && last {
        let why = match &outcome {
            Ok(status) => format!("answered {status}"),
            Err(e) => e.to_string(),
        };
        crate::log!(
            "webhooks: event {} for endpoint {} dropped after {} attempts (the receiver {why})",
            delivery.event_id,
            delivery.endpoint_id,
            delivery.attempts
        );
    }
    let retry = (!delivered && !last).then(|| {
        delivery.next_at_ms = now_ms() + BACKOFF_MS[(delivery.attempts as usize - 1).min(3)];
        Due {
            at_ms: delivery.next_at_ms,
            id: id.clone(),
        }
    });
    let done = delivered || last;
    let written = agents
        .transact(move |t| {
            let outbox = Scope::owner(OUTBOX);
            match done {
                true => t.delete::<Delivery>(outbox, &delivery.id).map(drop),
                false => t.put(outbox, delivery),
            }
        })
        .await;
    if let Err(e) = written {
        crate::log!("webhooks: delivery {id} could not be updated: {e:?}");
    }
    retry
}
