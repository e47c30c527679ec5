//! The blocking pool: a bounded set of OS threads for work that must not run on a monoio
//! event loop (fork/exec, waitpid, PTY reads, file I/O in epoll mode). It implements
//! monoio's `ThreadPool`, so `monoio::spawn_blocking` hands work here and the result comes
//! back to the calling runtime as an awaited `JoinHandle`, without blocking it.
//!
//! Idle threads wait in a stack and a new task wakes the one that went idle last. With a
//! shared condition variable instead, every task woke some idle thread, round-robin, so
//! under a trickle of tasks no thread was ever idle for the whole retirement time and a
//! pool grown by a burst never shrank again (14 → 19 threads in a soak, for good). With
//! the stack, the threads at its bottom stay untouched and retire.
//!
//! At most one thread is being woken at a time: a task queued while one is on its way
//! wakes nobody, and that thread, taking a task and finding more queued, wakes the next.
//! Waking one thread per task put, on a busy worker's CPU, one context switch and one
//! contended lock per task (34 % of a small upload's CPU time was `finish_task_switch`);
//! with the relay, a burst of tasks is drained by the threads already running, and a
//! long task still never holds up the next one for more than one wake-up.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use monoio::blocking::{BlockingTask, ThreadPool};

struct Queue {
    tasks: VecDeque<BlockingTask>,
    threads: usize,
    /// Idle threads, the most recently idle last.
    idle: Vec<Arc<Sleeper>>,
    /// Threads woken (or spawned) that have not looked at the queue yet.
    waking: usize,
}

/// One idle thread's wake-up call. `woken` is only touched under the queue's lock.
struct Sleeper {
    wake: Condvar,
    woken: std::sync::atomic::AtomicBool,
}

struct Inner {
    queue: Mutex<Queue>,
    max_threads: usize,
    idle_exit: Duration,
}

/// A cloneable handle to the shared pool; every worker runtime attaches one.
#[derive(Clone)]
pub struct BlockingPool {
    inner: Arc<Inner>,
}

impl BlockingPool {
    /// A pool that runs at most `max_threads` tasks at once (more wait in a queue), and
    /// whose threads exit after `idle_exit` without work (`ABX_BLOCKING_IDLE_TIMEOUT`);
    /// it grows again on demand.
    pub fn new(max_threads: usize, idle_exit: Duration) -> BlockingPool {
        BlockingPool {
            inner: Arc::new(Inner {
                queue: Mutex::new(Queue {
                    tasks: VecDeque::new(),
                    threads: 0,
                    idle: Vec::new(),
                    waking: 0,
                }),
                max_threads: max_threads.max(1),
                idle_exit,
            }),
        }
    }

    /// Threads currently alive (busy or idle).
    #[cfg(test)]
    pub fn threads(&self) -> usize {
        self.inner.lock().threads
    }

    fn spawn_thread(&self) {
        let inner = self.inner.clone();
        // Tree walks recurse (bounded by MAX_TREE_DEPTH); give them room.
        let spawned = std::thread::Builder::new()
            .name("abx-blocking".into())
            .stack_size(8 * 1024 * 1024)
            .spawn(move || worker(inner));
        if spawned.is_err() {
            // Could not grow: the queued task waits for an existing thread.
            let mut queue = self.inner.lock();
            queue.threads -= 1;
            queue.waking -= 1;
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ThreadPool for BlockingPool {
    fn schedule_task(&self, task: BlockingTask) {
        let mut queue = self.inner.lock();
        queue.tasks.push_back(task);
        if queue.waking > 0 {
            // That thread takes a task and, finding this one, wakes the next.
            return;
        }
        if super::on_worker() {
            drop(queue);
            self.call_after_this_turn();
            return;
        }
        let call = self.inner.call_one(&mut queue);
        drop(queue);
        self.answer(call);
    }
}

thread_local! {
    /// A [`Call`] is queued on this worker's runtime.
    static CALL_QUEUED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Wakes a pool thread for the queued tasks when polled, or when dropped unpolled (a
/// runtime going away), so a queued task is never left without one.
struct Call(Option<BlockingPool>);

impl Call {
    fn now(&mut self) {
        if let Some(pool) = self.0.take() {
            let _ = CALL_QUEUED.try_with(|queued| queued.set(false));
            let mut queue = pool.inner.lock();
            let call = if queue.waking == 0 && !queue.tasks.is_empty() {
                pool.inner.call_one(&mut queue)
            } else {
                Called::Nobody
            };
            drop(queue);
            pool.answer(call);
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.now();
    }
}

impl BlockingPool {
    /// On a worker, the pool thread is woken by a task queued behind the tasks that are
    /// ready now, not at once: woken at once, it preempted the worker on its CPU for
    /// each task (two context switches a task); woken after, it takes every task this
    /// turn queued in one go. A turn runs only ready tasks, none of them waits.
    fn call_after_this_turn(&self) {
        if CALL_QUEUED.with(|queued| queued.replace(true)) {
            return;
        }
        let mut call = Call(Some(self.clone()));
        monoio::spawn(async move { call.now() });
    }
}

impl Inner {
    /// Picks the most recently idle thread to wake, or, with none idle and room left, a
    /// thread to spawn (both counted as waking). [`BlockingPool::answer`] does it once
    /// the queue's lock is released: woken under it, the thread preempted the caller on
    /// a shared CPU only to wait for the lock the caller still held.
    fn call_one(&self, queue: &mut Queue) -> Called {
        if let Some(sleeper) = queue.idle.pop() {
            sleeper
                .woken
                .store(true, std::sync::atomic::Ordering::Relaxed);
            queue.waking += 1;
            return Called::Idle(sleeper);
        }
        if queue.threads < self.max_threads {
            queue.threads += 1;
            queue.waking += 1;
            return Called::New;
        }
        Called::Nobody
    }
}

/// Which thread [`Inner::call_one`] picked.
enum Called {
    Idle(Arc<Sleeper>),
    New,
    Nobody,
}

impl BlockingPool {
    /// Wakes or spawns the thread `call` picked; the queue's lock must not be held.
    fn answer(&self, call: Called) {
        match call {
            // `woken` was set under the lock, which the sleeper checks before waiting
            // again: a notification after the unlock is never lost.
            Called::Idle(sleeper) => sleeper.wake.notify_one(),
            Called::New => self.spawn_thread(),
            Called::Nobody => {}
        }
    }
}

fn worker(inner: Arc<Inner>) {
    use std::sync::atomic::Ordering::Relaxed;
    let me = Arc::new(Sleeper {
        wake: Condvar::new(),
        woken: std::sync::atomic::AtomicBool::new(false),
    });
    let mut queue = inner.lock();
    // Spawned as the thread being woken.
    let mut arriving = true;
    loop {
        if std::mem::take(&mut arriving) {
            queue.waking -= 1;
            // More queued than this thread takes, and nobody else on the way: the relay.
            if queue.tasks.len() > 1 && queue.waking == 0 {
                let call = inner.call_one(&mut queue);
                if !matches!(call, Called::Nobody) {
                    drop(queue);
                    BlockingPool {
                        inner: inner.clone(),
                    }
                    .answer(call);
                    queue = inner.lock();
                }
            }
        }
        if let Some(task) = queue.tasks.pop_front() {
            drop(queue);
            // A panicking task reports `Canceled` to its awaiter when dropped; the thread
            // itself keeps serving.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.run()));
            queue = inner.lock();
            continue;
        }
        me.woken.store(false, Relaxed);
        queue.idle.push(me.clone());
        // The retirement clock starts when the thread goes idle and is not reset by a
        // spurious wake-up.
        let deadline = Instant::now() + inner.idle_exit;
        loop {
            if me.woken.load(Relaxed) {
                arriving = true;
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                queue.idle.retain(|s| !Arc::ptr_eq(s, &me));
                queue.threads -= 1;
                return;
            }
            queue = me
                .wake
                .wait_timeout(queue, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tasks queued together on a worker (where the wake waits for the turn's end) are
    /// not held up behind a long one: the thread taking the first wakes another.
    #[test]
    fn a_long_task_never_holds_up_the_tasks_queued_with_it() {
        for driver in [
            super::super::IoDriver::Epoll,
            super::super::IoDriver::IoUring,
        ] {
            let pool = BlockingPool::new(4, Duration::from_secs(10));
            let (release, held) = std::sync::mpsc::channel::<()>();
            let finished = super::super::block_on(driver, pool.clone(), async move {
                let long = monoio::spawn_blocking(move || held.recv().is_ok());
                let short: Vec<_> = (0..6u32)
                    .map(|i| monoio::spawn_blocking(move || i * 3))
                    .collect();
                let mut results = Vec::new();
                for task in short {
                    // Queued behind the long task, this would never finish: it waits
                    // for `release`, sent only after these.
                    let waited = monoio::time::timeout(Duration::from_secs(10), task).await;
                    results.push(waited.expect("held up behind the long task").unwrap());
                }
                release.send(()).unwrap();
                (results, long.await.unwrap())
            });
            let Ok(finished) = finished else {
                continue; // No io_uring on this kernel.
            };
            assert_eq!(finished, (vec![0, 3, 6, 9, 12, 15], true));
            assert!(pool.threads() <= 4);
        }
    }

    #[test]
    fn results_come_back_to_the_runtime_and_threads_are_bounded() {
        let pool = BlockingPool::new(2, Duration::from_secs(10));
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .attach_thread_pool(Box::new(pool.clone()))
            .build()
            .unwrap();
        let results = rt.block_on(async {
            let handles: Vec<_> = (0..8u64)
                .map(|i| {
                    monoio::spawn_blocking(move || {
                        std::thread::sleep(Duration::from_millis(5));
                        i * 2
                    })
                })
                .collect();
            let mut out = Vec::new();
            for h in handles {
                out.push(h.await.unwrap());
            }
            out
        });
        assert_eq!(results, (0..8).map(|i| i * 2).collect::<Vec<_>>());
        assert!(pool.threads() <= 2);
    }

    #[test]
    fn a_trickle_of_tasks_lets_surplus_threads_retire() {
        let pool = BlockingPool::new(8, Duration::from_millis(300));
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .attach_thread_pool(Box::new(pool.clone()))
            .build()
            .unwrap();
        rt.block_on(async {
            let burst: Vec<_> = (0..8)
                .map(|_| monoio::spawn_blocking(|| std::thread::sleep(Duration::from_millis(50))))
                .collect();
            for task in burst {
                task.await.unwrap();
            }
            assert_eq!(pool.threads(), 8);
            // One short task every 20 ms for 1.5 s: one thread is enough for it, and the
            // other seven must not be kept alive by being woken in turn.
            for _ in 0..75 {
                monoio::spawn_blocking(|| ()).await.unwrap();
                monoio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        assert!(pool.threads() <= 2, "{} threads", pool.threads());
    }
}
