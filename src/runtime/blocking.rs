//! The blocking pool: a bounded set of OS threads for work that must not run on a monoio
//! event loop (fork/exec, waitpid, PTY reads, file I/O in epoll mode). It implements
//! monoio's `ThreadPool`, so `monoio::spawn_blocking` hands work here and the result comes
//! back to the calling runtime as an awaited `JoinHandle`, without blocking it.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use monoio::blocking::{BlockingTask, ThreadPool};

/// Threads idle this long exit; the pool grows again on demand.
const IDLE_EXIT: Duration = Duration::from_secs(30);

struct Queue {
    tasks: VecDeque<BlockingTask>,
    threads: usize,
    idle: usize,
}

struct Inner {
    queue: Mutex<Queue>,
    ready: Condvar,
    max_threads: usize,
}

/// A cloneable handle to the shared pool; every worker runtime attaches one.
#[derive(Clone)]
pub struct BlockingPool {
    inner: Arc<Inner>,
}

impl BlockingPool {
    /// A pool that runs at most `max_threads` tasks at once; more wait in a queue.
    pub fn new(max_threads: usize) -> BlockingPool {
        BlockingPool {
            inner: Arc::new(Inner {
                queue: Mutex::new(Queue {
                    tasks: VecDeque::new(),
                    threads: 0,
                    idle: 0,
                }),
                ready: Condvar::new(),
                max_threads: max_threads.max(1),
            }),
        }
    }

    /// Threads currently alive (busy or idle).
    #[cfg(test)]
    pub fn threads(&self) -> usize {
        self.lock().threads
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.inner.queue.lock().unwrap_or_else(|e| e.into_inner())
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
            self.lock().threads -= 1;
        }
    }
}

impl ThreadPool for BlockingPool {
    fn schedule_task(&self, task: BlockingTask) {
        let mut queue = self.lock();
        queue.tasks.push_back(task);
        let grow = queue.idle < queue.tasks.len() && queue.threads < self.inner.max_threads;
        if grow {
            queue.threads += 1;
        }
        drop(queue);
        self.inner.ready.notify_one();
        if grow {
            self.spawn_thread();
        }
    }
}

fn worker(inner: Arc<Inner>) {
    let mut queue = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(task) = queue.tasks.pop_front() {
            drop(queue);
            // A panicking task reports `Canceled` to its awaiter when dropped; the thread
            // itself keeps serving.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.run()));
            queue = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            continue;
        }
        queue.idle += 1;
        let (guard, timeout) = inner
            .ready
            .wait_timeout(queue, IDLE_EXIT)
            .unwrap_or_else(|e| e.into_inner());
        queue = guard;
        queue.idle -= 1;
        if timeout.timed_out() && queue.tasks.is_empty() {
            queue.threads -= 1;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_to_the_runtime_and_threads_are_bounded() {
        let pool = BlockingPool::new(2);
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
}
