//! The automations thread (`abx-automations`): its own monoio runtime and a small
//! blocking pool, so no HTTP worker waits for a schedule, and the session actors its
//! runs start live on its driver. It reads every schedule entry when it starts, keeps
//! the next occurrence of each active automation in memory, fires each when due
//! ([`super::fire`]: the run recorded and the schedule moved in one transaction) and
//! delivers the runs. A thread that finds nothing scheduled and has delivered nothing
//! ends (the next job starts another: [`super::wake::Wake::send`]); one that delivered
//! stays, since the sessions its runs started live on its driver.
//!
//! A delivery is the owner's own request served in-process by the app (the routes'
//! [`Deliver`]): a session create, or a message to the existing session, admitted
//! under the owner's current identity and policy, so an automation can do nothing its
//! owner could not do now. A session that is running a turn it cannot take the message
//! into is tried again every [`BUSY_RETRY`] for up to [`BUSY_WAIT`]; meanwhile the
//! run stays `queued` (and occurrences that come are `skipped`).

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_channel::mpsc;

use super::wake::Job;
use super::{Delivery, Outcome};
use crate::agents::error::AgentError;
use crate::agents::surface::Agents;

/// How long a run waits for a busy session, and how often it asks.
pub const BUSY_WAIT: Duration = Duration::from_secs(600);
pub const BUSY_RETRY: Duration = Duration::from_secs(2);

/// Runs delivered at once; more wait their turn (100 automations due at the same
/// minute do not start 100 sessions at the same instant).
pub const IN_FLIGHT: usize = 8;

/// What a delivery answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivered {
    Done(Outcome),
    /// The session cannot take the message now (a turn it cannot be steered into).
    Busy(String),
}

/// Delivers runs as their owner (the app's in-process dispatcher).
pub trait Deliver: Send + Sync + 'static {
    fn deliver<'a>(
        &'a self,
        owner: &'a str,
        delivery: Delivery,
    ) -> Pin<Box<dyn Future<Output = Delivered> + 'a>>;
}

/// Starts the thread; `read_schedule`: read the store's schedule (false for a server
/// whose agents group is off and has no store file: it would create one), after
/// `settle` (at server start, [`crate::agents::RESUME_AFTER_START`]: the first answers
/// come first). Jobs sent meanwhile wait in its queue.
pub fn start(
    agents: Arc<Agents>,
    deliverer: Arc<dyn Deliver>,
    read_schedule: bool,
    settle: Duration,
) {
    let (tx, rx) = mpsc::unbounded();
    {
        let mut sender = agents.automations().lock();
        // Started once; later calls (each automation route asks) find it running.
        if sender.is_some() {
            return;
        }
        *sender = Some(tx);
    }
    let started = std::thread::Builder::new()
        .name("abx-automations".into())
        .spawn(move || {
            std::thread::sleep(settle);
            let pool = crate::runtime::blocking::BlockingPool::new(4, Duration::from_secs(10));
            let run = run(agents, deliverer, rx, read_schedule);
            if let Err(e) = crate::runtime::block_on(crate::runtime::IoDriver::Epoll, pool, run) {
                crate::log!("automations: the scheduler thread could not start its runtime: {e}");
            }
        });
    if let Err(e) = started {
        crate::log!("automations: the scheduler thread could not start: {e}");
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Job>) -> Option<Job> {
    use futures_core::Stream;
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *rx).poll_next(cx)).await
}

/// The schedule in memory: each automation's next occurrence. A heap entry whose time
/// is not its automation's current one is stale (the automation changed) and dropped.
#[derive(Default)]
pub struct Timetable {
    heap: BinaryHeap<Reverse<(i64, String)>>,
    at: HashMap<String, (i64, String)>,
}

impl Timetable {
    /// Automation `id` of `owner` is due at `at` (`None`: no longer scheduled).
    pub fn set(&mut self, owner: &str, id: &str, at: Option<i64>) {
        match at {
            Some(at) => {
                self.at.insert(id.to_string(), (at, owner.to_string()));
                self.heap.push(Reverse((at, id.to_string())));
            }
            None => {
                self.at.remove(id);
            }
        }
    }

    /// The automations due at `now` (seconds), each once, taken off the timetable.
    pub fn take_due(&mut self, now: i64) -> Vec<(String, String)> {
        let mut due = Vec::new();
        while let Some(Reverse((at, _))) = self.heap.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((at, id))) = self.heap.pop() else {
                break;
            };
            if self.at.get(&id).map(|(t, _)| *t) == Some(at) {
                if let Some((_, owner)) = self.at.remove(&id) {
                    due.push((owner, id));
                }
            }
        }
        due
    }

    /// Milliseconds from `now_ms` to the next occurrence, if any.
    pub fn wait_ms(&mut self, now_ms: u64) -> Option<u64> {
        // Stale entries at the top would wake the loop for nothing.
        while let Some(Reverse((at, id))) = self.heap.peek() {
            if self.at.get(id).map(|(t, _)| t) == Some(at) {
                let due_ms = (*at).max(0) as u64 * 1000;
                return Some(due_ms.saturating_sub(now_ms));
            }
            self.heap.pop();
        }
        None
    }
}

async fn run(
    agents: Arc<Agents>,
    deliverer: Arc<dyn Deliver>,
    mut rx: mpsc::UnboundedReceiver<Job>,
    read_schedule: bool,
) {
    let mut table = Timetable::default();
    if read_schedule {
        match agents
            .read(|t| super::entries(t).map_err(AgentError::from))
            .await
        {
            Ok(entries) => {
                for entry in entries {
                    table.set(&entry.owner, &entry.id, Some(entry.at));
                }
            }
            Err(e) => {
                crate::log!("automations: the schedule could not be read: {e:?}");
            }
        }
    }
    let mut waiting: VecDeque<(String, String, String)> = VecDeque::new();
    let mut in_flight = 0usize;
    // Occurrences being fired: each sends its next one to the queue before it ends.
    let firing = Rc::new(Cell::new(0usize));
    // A delivery may start a session whose actor lives on this thread's driver and
    // outlives the delivery: a thread that delivered anything stays.
    let mut delivered = false;
    loop {
        let now = now_ms();
        for (owner, id) in table.take_due((now / 1000) as i64) {
            firing.set(firing.get() + 1);
            let (agents, firing) = (agents.clone(), firing.clone());
            monoio::spawn(async move {
                fire(agents, owner, id).await;
                firing.set(firing.get() - 1);
            });
        }
        while in_flight < IN_FLIGHT {
            let Some((owner, id, invocation)) = waiting.pop_front() else {
                break;
            };
            in_flight += 1;
            delivered = true;
            let (agents, deliverer) = (agents.clone(), deliverer.clone());
            monoio::spawn(async move {
                deliver(agents.clone(), deliverer, owner, id, invocation).await;
                agents.automations().send(Job::Delivered);
            });
        }
        let next_due = table.wait_ms(now_ms());
        if next_due.is_none()
            && waiting.is_empty()
            && in_flight == 0
            && firing.get() == 0
            && !delivered
        {
            // Nothing scheduled, nothing delivered: the thread ends rather than idle,
            // and the next job starts another (`Wake::send`), which reads the
            // schedule. Decided under the queue's lock, which a send holds, so no job
            // falls between.
            let mut sender = agents.automations().lock();
            match rx.try_recv() {
                Ok(job) => {
                    drop(sender);
                    take(job, &mut table, &mut waiting, &mut in_flight);
                    continue;
                }
                Err(_) => {
                    *sender = None;
                    return;
                }
            }
        }
        let wait = next_due.unwrap_or(60_000).clamp(1, 60_000);
        match monoio::time::timeout(Duration::from_millis(wait), next(&mut rx)).await {
            Ok(Some(job)) => {
                take(job, &mut table, &mut waiting, &mut in_flight);
                while let Ok(job) = rx.try_recv() {
                    take(job, &mut table, &mut waiting, &mut in_flight);
                }
            }
            Ok(None) => return,
            Err(_) => {}
        }
    }
}

/// The loop's part of one job.
fn take(
    job: Job,
    table: &mut Timetable,
    waiting: &mut VecDeque<(String, String, String)>,
    in_flight: &mut usize,
) {
    match job {
        Job::Due { owner, id, at } => table.set(&owner, &id, at),
        Job::Deliver {
            owner,
            id,
            invocation,
        } => waiting.push_back((owner, id, invocation)),
        Job::Delivered => *in_flight = in_flight.saturating_sub(1),
    }
}

/// Fires one due automation; its run and its next occurrence go back to the loop
/// through the queue.
async fn fire(agents: Arc<Agents>, owner: String, id: String) {
    let now = (now_ms() / 1000) as i64;
    let (o, i) = (owner.clone(), id.clone());
    let fired = agents.transact(move |t| super::fire(t, &o, &i, now)).await;
    match fired {
        Ok(fired) => {
            agents.automations().send(Job::Due {
                owner: owner.clone(),
                id: id.clone(),
                at: fired.next,
            });
            if let Some(invocation) = fired.deliver {
                agents.automations().send(Job::Deliver {
                    owner,
                    id,
                    invocation,
                });
            }
        }
        Err(e) => {
            crate::log!("automations: {id} could not fire ({e:?}); trying again in a minute");
            agents.automations().send(Job::Due {
                owner,
                id,
                at: Some(now + 60),
            });
        }
    }
}

/// Delivers run `invocation` and records how it went.
async fn deliver(
    agents: Arc<Agents>,
    deliverer: Arc<dyn Deliver>,
    owner: String,
    id: String,
    invocation: String,
) {
    let (o, i, r) = (owner.clone(), id.clone(), invocation.clone());
    let delivery = match agents.read(move |t| super::delivery(t, &o, &i, &r)).await {
        Ok(Some(delivery)) => delivery,
        Ok(None) => return,
        Err(e) => {
            let e: AgentError = e;
            settle(
                &agents,
                owner,
                id,
                invocation,
                Outcome::Failed {
                    code: "server_error".into(),
                    message: format!("The run's target could not be read: {e:?}"),
                },
            )
            .await;
            return;
        }
    };
    let started = std::time::Instant::now();
    let outcome = loop {
        match deliverer.deliver(&owner, delivery.clone()).await {
            Delivered::Done(outcome) => break outcome,
            Delivered::Busy(why) if started.elapsed() >= BUSY_WAIT => {
                break Outcome::Failed {
                    code: "session_busy".into(),
                    message: format!(
                        "The session could not take the run for {} s: {why}",
                        BUSY_WAIT.as_secs()
                    ),
                }
            }
            Delivered::Busy(_) => monoio::time::sleep(BUSY_RETRY).await,
        }
    };
    settle(&agents, owner, id, invocation, outcome).await;
}

async fn settle(
    agents: &Arc<Agents>,
    owner: String,
    id: String,
    invocation: String,
    outcome: Outcome,
) {
    let run = invocation.clone();
    let settled = agents
        .transact(move |t| super::settle(t, &owner, &id, &invocation, outcome))
        .await;
    if let Err(e) = settled {
        let e: AgentError = e;
        crate::log!("automations: run {run} could not be recorded: {e:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_automation_fires_at_its_new_time_only() {
        let mut table = Timetable::default();
        table.set("alice", "a1", Some(100));
        table.set("alice", "a1", Some(200));
        table.set("bob", "b1", Some(150));
        assert_eq!(table.wait_ms(50_000), Some(100_000));
        assert!(table.take_due(120).is_empty());
        assert_eq!(table.take_due(150), vec![("bob".into(), "b1".into())]);
        assert_eq!(table.take_due(300), vec![("alice".into(), "a1".into())]);
        assert_eq!(table.wait_ms(0), None);
        // Unscheduled: the heap entry is left, and never fires.
        table.set("alice", "a2", Some(400));
        table.set("alice", "a2", None);
        assert!(table.take_due(500).is_empty());
        // The same time twice is one firing.
        table.set("alice", "a3", Some(600));
        table.set("alice", "a3", Some(600));
        assert_eq!(table.take_due(600).len(), 1);
    }
}
