//! Spare [`STREAM_CHUNK`] buffers for streamed bodies, kept per worker thread between
//! responses and given back to the allocator once unused.
//!
//! Why: a streamed response takes two buffers of 256 KiB (and a file encoded as base64 a
//! third). Freed after each response, glibc unmapped them again (it trims an arena's top
//! once more than twice its last large free is free), so every response faulted its
//! pages in afresh: 8 % of a 1 MiB JSON download's time. Fixing glibc's thresholds with
//! `mallopt` kept the pages, but in the worker arenas' tops, which `malloc_trim` cannot
//! return: 2.8 MiB stayed resident after a load for good. Kept here instead, at most
//! [`MAX_SPARE`] per worker, they are freed [`RELEASE_AFTER`] after the last was taken,
//! and the allocator and the trimmer (`runtime::memory`) get them back as before.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::service::STREAM_CHUNK;

/// The most spare buffers one worker keeps (2 MiB).
const MAX_SPARE: usize = 8;
/// How long spare buffers outlive the last one taken.
const RELEASE_AFTER: Duration = Duration::from_millis(500);

struct Spare {
    buffers: Vec<Vec<u8>>,
    last_taken: Instant,
    /// A release task runs on this thread ([`release_unused`]).
    released: bool,
    /// The release task, waiting for buffers to appear.
    waiting: Option<Waker>,
}

thread_local! {
    static SPARE: RefCell<Spare> = RefCell::new(Spare {
        buffers: Vec::new(),
        last_taken: Instant::now(),
        released: false,
        waiting: None,
    });
}

/// An empty buffer with room for [`STREAM_CHUNK`] bytes: a spare one when there is one.
pub fn take() -> Vec<u8> {
    let spare = SPARE.with(|spare| {
        let mut spare = spare.borrow_mut();
        spare.last_taken = Instant::now();
        spare.buffers.pop()
    });
    spare.unwrap_or_else(|| Vec::with_capacity(STREAM_CHUNK))
}

/// Keeps `buffer` for the next [`take`] on this thread. Buffers of another capacity, and
/// buffers beyond [`MAX_SPARE`], are freed. On a thread without [`release_unused`]
/// running, nothing is kept.
pub fn give(mut buffer: Vec<u8>) {
    if buffer.capacity() != STREAM_CHUNK {
        return;
    }
    buffer.clear();
    let wake = SPARE.with(|spare| {
        let mut spare = spare.borrow_mut();
        // Kept only where a release task will free it again.
        if !spare.released || spare.buffers.len() >= MAX_SPARE {
            return None;
        }
        spare.buffers.push(buffer);
        spare.waiting.take()
    });
    if let Some(waker) = wake {
        waker.wake();
    }
}

/// The worker's task that frees its spare buffers once none has been taken for
/// [`RELEASE_AFTER`]. It sleeps while there are none, so an idle worker never wakes for
/// it. Runs for the life of the worker.
pub async fn release_unused() {
    SPARE.with(|spare| spare.borrow_mut().released = true);
    loop {
        Buffered.await;
        loop {
            monoio::time::sleep(RELEASE_AFTER).await;
            let released = SPARE.with(|spare| {
                let mut spare = spare.borrow_mut();
                if spare.last_taken.elapsed() < RELEASE_AFTER {
                    return false;
                }
                spare.buffers = Vec::new();
                true
            });
            if released {
                break;
            }
        }
    }
}

/// Resolves once this thread holds spare buffers; until then it is the waiter [`give`]
/// needs before it keeps one.
struct Buffered;

impl Future for Buffered {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        SPARE.with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.buffers.is_empty() {
                spare.waiting = Some(cx.waker().clone());
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_kept_only_while_a_release_task_runs_and_then_freed() {
        // No release task on this thread: nothing is kept.
        give(Vec::with_capacity(STREAM_CHUNK));
        assert_eq!(SPARE.with(|s| s.borrow().buffers.len()), 0);
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        rt.block_on(async {
            monoio::spawn(release_unused());
            monoio::time::sleep(Duration::from_millis(1)).await;
            let first = take();
            let address = first.as_ptr();
            give(first);
            // Another capacity is not kept.
            give(Vec::with_capacity(STREAM_CHUNK / 2));
            assert_eq!(SPARE.with(|s| s.borrow().buffers.len()), 1);
            // The same allocation comes back, empty.
            let again = take();
            assert_eq!((again.as_ptr(), again.len()), (address, 0));
            give(again);
            for _ in 0..MAX_SPARE + 2 {
                give(Vec::with_capacity(STREAM_CHUNK));
                monoio::time::sleep(Duration::from_millis(1)).await;
            }
            assert_eq!(SPARE.with(|s| s.borrow().buffers.len()), MAX_SPARE);
            monoio::time::sleep(RELEASE_AFTER * 3).await;
            assert_eq!(SPARE.with(|s| s.borrow().buffers.len()), 0);
        });
    }
}
