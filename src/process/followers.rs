//! The readers attached to one output log, each at its own place, and the wait that
//! keeps a producer from outrunning the slowest of them: a terminal's reader (the PTY
//! WebSocket) and an envd process's pipes both read their source only while the log has
//! room for more without dropping what an attached reader has not taken. A reader that
//! takes nothing for the stall time while the producer waits on it is cut off (it is no
//! longer waited for, and learns it from [`Place::cut_off`]); the others go on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::output::Notify;

/// Every reader attached to one log.
#[derive(Default)]
pub struct Followers {
    places: Mutex<Vec<Arc<Place>>>,
    /// Bumped when a reader takes output or detaches.
    consumed: Notify,
}

/// One reader's place: the sequence number of the next output it has not taken.
pub struct Place {
    next: AtomicU64,
    cut_off: AtomicBool,
}

impl Place {
    pub fn next(&self) -> u64 {
        self.next.load(Ordering::SeqCst)
    }

    /// Whether it held the producer back too long and is no longer waited for.
    pub fn cut_off(&self) -> bool {
        self.cut_off.load(Ordering::SeqCst)
    }
}

impl Followers {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Place>>> {
        self.places.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attaches a reader whose next output is `from`.
    pub fn attach(&self, from: u64) -> Arc<Place> {
        let place = Arc::new(Place {
            next: AtomicU64::new(from),
            cut_off: AtomicBool::new(false),
        });
        self.lock().push(place.clone());
        place
    }

    /// Detaches a reader (its socket or stream closed).
    pub fn detach(&self, place: &Arc<Place>) {
        self.lock().retain(|p| !Arc::ptr_eq(p, place));
        self.consumed.notify();
    }

    /// The reader has taken everything before `next`.
    pub fn took(&self, place: &Place, next: u64) {
        place.next.store(next, Ordering::SeqCst);
        self.consumed.notify();
    }

    /// The place of the slowest reader still waited for; `None` without one.
    pub fn lowest(&self) -> Option<u64> {
        self.lock()
            .iter()
            .filter(|p| !p.cut_off())
            .map(|p| p.next())
            .min()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Waits until `fits(lowest)` says the log has room (or no reader is attached). A
    /// reader that stays the slowest, at one place, for `stall` is cut off, and
    /// `on_cut_off` runs so the readers look.
    pub async fn wait_for_room(
        &self,
        stall: Duration,
        fits: impl Fn(u64) -> bool,
        on_cut_off: impl Fn(),
    ) {
        let mut slowest_since: Option<(u64, Instant)> = None;
        loop {
            let seen = self.consumed.version();
            let Some(lowest) = self.lowest() else {
                return;
            };
            if fits(lowest) {
                return;
            }
            let since = match slowest_since {
                Some((place, since)) if place == lowest => since,
                _ => {
                    let now = Instant::now();
                    slowest_since = Some((lowest, now));
                    now
                }
            };
            let left = stall.saturating_sub(since.elapsed());
            if left.is_zero() {
                for place in self.lock().iter() {
                    if place.next() == lowest {
                        place.cut_off.store(true, Ordering::SeqCst);
                    }
                }
                on_cut_off();
                slowest_since = None;
                continue;
            }
            let _ = monoio::time::timeout(left, self.consumed.changed(seen)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_place_ignores_readers_cut_off() {
        let followers = Followers::default();
        assert_eq!(followers.lowest(), None);
        let slow = followers.attach(3);
        let fast = followers.attach(5);
        assert_eq!(followers.lowest(), Some(3));
        slow.cut_off.store(true, Ordering::SeqCst);
        assert_eq!(followers.lowest(), Some(5));
        followers.took(&fast, 9);
        assert_eq!(followers.lowest(), Some(9));
        followers.detach(&fast);
        followers.detach(&slow);
        assert!(followers.is_empty());
    }

    /// Runs `future` on an epoll worker runtime, as the server's unit tests do
    /// (`testing::run` is the server package's, above this one).
    fn run<F: std::future::Future>(future: F) -> F::Output {
        let pool = crate::runtime::blocking::BlockingPool::new(2, Duration::from_secs(5));
        crate::runtime::block_on(crate::runtime::IoDriver::Epoll, pool, future)
            .expect("a monoio runtime")
    }

    #[test]
    fn a_reader_that_takes_nothing_is_cut_off_and_the_wait_ends() {
        run(async {
            let followers = Followers::default();
            let stuck = followers.attach(0);
            let cut = std::cell::Cell::new(0);
            followers
                .wait_for_room(
                    Duration::from_millis(50),
                    |lowest| lowest > 0,
                    || cut.set(cut.get() + 1),
                )
                .await;
            assert!(stuck.cut_off());
            assert_eq!(cut.get(), 1);
        });
    }
}
