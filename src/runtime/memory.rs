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
/// How long after start the start-up code is released ([`CodePages`]). Work deferred
/// past the first answers but done once at start (the agents group's resume) is
/// scheduled before this, so what it maps is released with the rest.
pub const SETTLE: Duration = Duration::from_millis(100);
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
    let mut code = CodePages::open();
    // Starting mapped the code that builds the route table and the state, all over the
    // binary: none of it runs again. Released once start has settled, so reading the
    // mappings never competes with the first requests for the CPU.
    std::thread::sleep(SETTLE);
    if let Some(code) = code.as_mut() {
        code.release();
    }
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
        if let Some(code) = code.as_mut() {
            code.release();
        }
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

/// The mapped pages of the program's code and constants (and its libraries'): clean,
/// read-only, private file mappings, which the kernel reads again from the page cache
/// when they are next used. Building the route table at start runs a declaration in
/// every route module, and each first touch maps 64 KiB around it (the kernel's fault
/// around): 3.3 MiB of code, most of it never run again, counted in the resident set
/// for good. Released at start and with each trim (`MADV_DONTNEED`), only the code
/// that runs comes back, a minor fault per 64 KiB. A mapping with a single written page
/// (the relocated `.data.rel.ro`, a writable one) is never touched: its pages are the
/// process's own, not the file's.
struct CodePages {
    smaps: ProcFile,
}

impl CodePages {
    fn open() -> Option<CodePages> {
        Some(CodePages {
            smaps: ProcFile::open("/proc/self/smaps", 64 * 1024)?,
        })
    }

    /// Unmaps the clean read-only file pages; returns how many KiB were mapped.
    fn release(&mut self) -> u64 {
        let Some(text) = self.smaps.read() else {
            return 0;
        };
        let mut released = 0;
        for mapping in clean_file_mappings(text) {
            // SAFETY: the range is a whole mapping of this process, private, read-only
            // and backed by a file, with no page of its own (`Anonymous: 0`): dropping
            // its page-table entries changes no byte anyone reads, the next access
            // faults the file's same pages in again.
            let done = unsafe {
                libc::madvise(
                    mapping.start as *mut libc::c_void,
                    mapping.end - mapping.start,
                    libc::MADV_DONTNEED,
                )
            };
            if done == 0 {
                released += mapping.rss_kib;
            }
        }
        released
    }
}

/// A mapping [`CodePages`] may release.
#[derive(Debug, PartialEq)]
struct CleanMapping {
    start: usize,
    end: usize,
    rss_kib: u64,
}

/// The mappings in `smaps` that are private, not writable, backed by a file, resident,
/// and hold no anonymous (written) page.
fn clean_file_mappings(smaps: &str) -> Vec<CleanMapping> {
    let mut found = Vec::new();
    // The mapping being read, while it still qualifies: (start, end, rss, anonymous).
    let mut current: Option<(usize, usize, Option<u64>, Option<u64>)> = None;
    let mut finish = |current: Option<(usize, usize, Option<u64>, Option<u64>)>| {
        if let Some((start, end, Some(rss), Some(0))) = current {
            if rss > 0 {
                found.push(CleanMapping {
                    start,
                    end,
                    rss_kib: rss,
                });
            }
        }
    };
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-') {
            let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) else {
                continue;
            };
            finish(current.take());
            let perms = fields.next().unwrap_or("").as_bytes();
            let inode = fields.nth(2).unwrap_or("0");
            let path = fields.next().unwrap_or("");
            let qualifies = perms.len() == 4
                && perms[0] == b'r'
                && perms[1] == b'-'
                && perms[3] == b'p'
                && inode != "0"
                && path.starts_with('/');
            if qualifies {
                current = Some((start, end, None, None));
            }
            continue;
        }
        let Some((_, _, rss, anonymous)) = current.as_mut() else {
            continue;
        };
        let mut value = || fields.next().and_then(|v| v.parse::<u64>().ok());
        match first {
            "Rss:" => *rss = value(),
            "Anonymous:" => *anonymous = value(),
            _ => {}
        }
    }
    finish(current.take());
    found
}

/// A file of `/proc/self` read whole again and again through one descriptor opened at
/// start (a read from offset 0 renders it afresh). Reopening it on every sample made a
/// descriptor come and go twice a second: with descriptors exhausted the sample failed
/// (and the trimmer stopped for good), and a count of the server's descriptors could
/// include it one moment and not the next.
struct ProcFile {
    file: std::fs::File,
    text: Vec<u8>,
}

impl ProcFile {
    fn open(path: &str, capacity: usize) -> Option<ProcFile> {
        Some(ProcFile {
            file: std::fs::File::open(path).ok()?,
            text: Vec::with_capacity(capacity),
        })
    }

    /// The file's text now; `None` when a read fails.
    fn read(&mut self) -> Option<&str> {
        use std::os::unix::fs::FileExt;
        self.text.clear();
        let mut piece = [0u8; 4096];
        loop {
            let n = self.file.read_at(&mut piece, self.text.len() as u64).ok()?;
            if n == 0 {
                break;
            }
            self.text.extend_from_slice(&piece[..n]);
        }
        std::str::from_utf8(&self.text).ok()
    }
}

/// The process's resident set, from `/proc/self/status`.
struct ResidentSet {
    status: ProcFile,
}

impl ResidentSet {
    fn open() -> Option<ResidentSet> {
        Some(ResidentSet {
            status: ProcFile::open("/proc/self/status", 4096)?,
        })
    }

    /// The resident set in KiB now.
    fn kib(&mut self) -> Option<u64> {
        let text = self.status.read()?;
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

    /// Mappings as the kernel lists them (a server's, cut short): only the code and
    /// constants of files, never written, qualify.
    const SMAPS: &str = "\
55851946f000-5585196af000 r--p 00000000 08:01 1234 /srv/agent-sandbox
Size:               2304 kB
Rss:                 712 kB
Anonymous:             0 kB
5585196af000-558519fa9000 r-xp 00240000 08:01 1234 /srv/agent-sandbox
Size:               9192 kB
Rss:                3364 kB
Anonymous:             0 kB
558519fa9000-558519fd5000 r--p 00b3a000 08:01 1234 /srv/agent-sandbox
Size:                176 kB
Rss:                 176 kB
Anonymous:           176 kB
558519fd5000-558519fd9000 rw-p 00b66000 08:01 1234 /srv/agent-sandbox
Size:                 16 kB
Rss:                  16 kB
Anonymous:            16 kB
55853de7b000-55853df2a000 rw-p 00000000 00:00 0 [heap]
Size:                700 kB
Rss:                 644 kB
Anonymous:           644 kB
7f92d6d4d000-7f92d6d5d000 rw-s 00000000 00:0f 77 anon_inode:[io_uring]
Size:                 64 kB
Rss:                  64 kB
Anonymous:             0 kB
7f92d73a3000-7f92d74f9000 r-xp 00028000 08:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
Size:               1368 kB
Rss:                 984 kB
Anonymous:             0 kB
7f92d7500000-7f92d7510000 r--p 00000000 08:01 98 /usr/lib/locale/C.utf8/LC_CTYPE
Size:                 64 kB
Rss:                   0 kB
Anonymous:             0 kB
7ffd2a1c4000-7ffd2a1c6000 r-xp 00000000 00:00 0 [vdso]
Size:                  8 kB
Rss:                   8 kB
Anonymous:             0 kB
";

    #[test]
    fn only_clean_read_only_file_pages_are_released() {
        let found = clean_file_mappings(SMAPS);
        assert_eq!(
            found,
            vec![
                CleanMapping {
                    start: 0x55851946f000,
                    end: 0x5585196af000,
                    rss_kib: 712
                },
                CleanMapping {
                    start: 0x5585196af000,
                    end: 0x558519fa9000,
                    rss_kib: 3364
                },
                CleanMapping {
                    start: 0x7f92d73a3000,
                    end: 0x7f92d74f9000,
                    rss_kib: 984
                },
            ]
        );
        // A mapping whose Anonymous line is missing is not known to be clean.
        let unknown = "7f92d73a3000-7f92d74f9000 r-xp 00028000 08:01 99 /lib/x.so\nRss: 8 kB\n";
        assert!(clean_file_mappings(unknown).is_empty());
    }

    /// Released from this very process, code and constants still work: they come back
    /// from the file.
    #[test]
    fn released_code_runs_again() {
        let mut code = CodePages::open().unwrap();
        let released = code.release();
        assert!(released > 0, "nothing released");
        let text: String = (0..1000).map(|n| format!("{n:x}")).collect();
        assert!(text.contains("3e7"));
        assert!(clean_file_mappings(SMAPS).len() == 3);
    }
}
