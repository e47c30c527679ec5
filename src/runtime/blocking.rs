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

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use monoio::blocking::{BlockingTask, ThreadPool};

struct Queue {
    tasks: VecDeque<BlockingTask>,
    threads: usize,
    /// Idle threads, the most recently idle last.
    idle: Vec<Arc<Sleeper>>,
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
            self.inner.lock().threads -= 1;
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
        if let Some(sleeper) = queue.idle.pop() {
            sleeper
                .woken
                .store(true, std::sync::atomic::Ordering::Relaxed);
            sleeper.wake.notify_one();
            return;
        }
        let grow = queue.threads < self.inner.max_threads;
        if grow {
            queue.threads += 1;
        }
        drop(queue);
        if grow {
            self.spawn_thread();
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
    loop {
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
