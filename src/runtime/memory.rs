//! Giving memory back after load. Transfers stream in pieces, so nothing large lives
//! past its request, but glibc's allocator keeps freed pages in each thread's arena (and
//! raises its mmap threshold after large frees, so later large buffers come from the
//! arenas too). Left alone, a burst of uploads leaves tens of MiB resident for good.
//!
//! A small thread samples the resident set twice a second. When it is above the size at
//! rest and the server is quiet (no request in flight, or the size has held steady for
//! two seconds, which covers long-lived streams), it calls `malloc_trim(0)`, which
//! returns every arena's free pages to the kernel. A trim that cannot get back to the
//! size at rest (memory still in use, or freed a moment later) is retried after a wait
//! that doubles, up to half a minute. Trimming only when quiet keeps
//! the cost (well under a millisecond on these heaps) off busy paths, where the pages
//! would be faulted straight back in. Measured in `docs/architecture.md`.

use std::sync::Arc;
use std::time::Duration;

use super::shutdown::Shutdown;

/// How often the resident set is sampled.
const SAMPLE: Duration = Duration::from_millis(500);
/// Growth over the last trim's result that is worth a trim.
const SLACK_KIB: u64 = 1024;
/// Samples at a steady size that count as quiet although requests are in flight.
const STEADY_SAMPLES: u32 = 4;
/// The longest wait, in samples, between trims that cannot reach the floor (a server
/// that legitimately holds memory, such as terminal logs, is trimmed this rarely).
const MAX_BACKOFF: u32 = 64;

/// Starts the trimming thread (glibc only; other allocators manage this themselves).
pub fn spawn_trimmer(shutdown: Arc<Shutdown>) {
    if !cfg!(target_env = "gnu") {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("abx-trim".into())
        .spawn(move || trim_when_quiet(&shutdown));
    if let Err(e) = spawned {
        crate::log!("memory trimming disabled: cannot start its thread: {e}");
    }
}

fn trim_when_quiet(shutdown: &Shutdown) {
    let Some(mut resident) = ResidentSet::open() else {
        crate::log!("memory trimming disabled: /proc/self/status cannot be read");
        return;
    };
    // The resident size at rest: what a trim aims to get back to.
    let mut floor = resident.kib().unwrap_or(0);
    let mut previous = floor;
    let mut after_last_trim = floor;
    let mut steady = 0u32;
    // A trim that could not get back to the floor (buffers still live, or freed just
    // after it) is retried after a wait that doubles up to [`MAX_BACKOFF`] samples, and
    // starts over when the resident set grows again.
    let mut backoff = 1u32;
    let mut countdown = 0u32;
    while !shutdown.is_shutting_down() {
        std::thread::sleep(SAMPLE);
        let Some(now) = resident.kib() else {
            continue;
        };
        steady = if now.abs_diff(previous) < SLACK_KIB / 4 {
            steady + 1
        } else {
            0
        };
        previous = now;
        if now > after_last_trim + SLACK_KIB {
            backoff = 1;
            countdown = 0;
        }
        let quiet = shutdown.in_flight() == 0 || steady >= STEADY_SAMPLES;
        if now <= floor + SLACK_KIB || !quiet {
            floor = floor.min(now);
            continue;
        }
        if countdown > 0 {
            countdown -= 1;
            continue;
        }
        trim();
        after_last_trim = resident.kib().unwrap_or(now);
        previous = after_last_trim;
        steady = 0;
        if after_last_trim > floor + SLACK_KIB {
            countdown = backoff;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        } else {
            floor = floor.min(after_last_trim);
            backoff = 1;
        }
    }
}

#[cfg(target_env = "gnu")]
fn trim() {
    // SAFETY: malloc_trim takes each arena's lock itself; safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(target_env = "gnu"))]
fn trim() {}

/// The process's resident set, read from `/proc/self/status` through one descriptor
/// opened at start. Reopening it on every sample made a descriptor come and go twice a
/// second: with descriptors exhausted the sample failed (and the trimmer stopped for
/// good), and a count of the server's descriptors could include it one moment and not
/// the next.
struct ResidentSet {
    status: std::fs::File,
    text: Vec<u8>,
}

impl ResidentSet {
    fn open() -> Option<ResidentSet> {
        Some(ResidentSet {
            status: std::fs::File::open("/proc/self/status").ok()?,
            text: Vec::with_capacity(4096),
        })
    }

    /// The resident set in KiB now (a read from offset 0 renders the file afresh).
    fn kib(&mut self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        self.text.clear();
        let mut piece = [0u8; 2048];
        loop {
            let n = self
                .status
                .read_at(&mut piece, self.text.len() as u64)
                .ok()?;
            if n == 0 {
                break;
            }
            self.text.extend_from_slice(&piece[..n]);
        }
        let text = std::str::from_utf8(&self.text).ok()?;
        let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resident_size_is_read_again_and_follows_growth() {
        let mut resident = ResidentSet::open().unwrap();
        let before = resident.kib().unwrap();
        assert!(before > 100, "{before} KiB");
        // 64 MiB touched page by page must show in the next read of the same descriptor.
        let grown = vec![1u8; 64 << 20];
        let after = resident.kib().unwrap();
        assert!(
            after >= before + 32 * 1024,
            "{before} KiB, then {after} KiB with 64 MiB more in use"
        );
        drop(std::hint::black_box(grown));
    }
}
