//! `GET /files/watch`: a polled snapshot diff, as the contract describes, woken early by
//! inotify so a change is reported within milliseconds and an idle watch costs no CPU.
//!
//! Each round runs on the blocking pool: wait on the inotify descriptor, then rescan the
//! tree with directory descriptors beneath the base. The diff against the previous
//! snapshot becomes `created` / `modified` / `deleted` events. While inotify covers every
//! tracked directory, a quiet tree is not rescanned (only every 30 s, for changes inotify
//! cannot see); without inotify, or past the 5,000-entry cap, the tree is polled every
//! `interval` as the contract describes.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use rustix::fs::{Mode, OFlags};
use serde_json::{json, Value};

use super::aio::blocking;
use super::resolve::{self, CallerPath, Kind};
use crate::http::sse::SseSender;
use crate::timefmt::iso8601_utc;

/// Most entries one watch tracks (the contract's cap).
pub const MAX_TRACKED: usize = 5000;
/// A comment line is sent after this much silence, so a vanished client is noticed.
const HEARTBEAT: Duration = Duration::from_secs(15);
/// With inotify, a full rescan happens at least this often anyway, for changes inotify
/// does not report (writes through mmap, some network and FUSE file systems).
const SAFETY_RESCAN: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, PartialEq)]
struct Entry {
    kind: Kind,
    size: u64,
    mtime: (i64, u32),
}

#[derive(Default)]
struct Snapshot {
    entries: BTreeMap<String, Entry>,
    /// Directories seen, for inotify watches: (relative name, open descriptor).
    dirs: Vec<(String, OwnedFd)>,
    truncated: bool,
}

/// What a watch was asked to do.
pub struct WatchSpec {
    pub base: PathBuf,
    pub caller: CallerPath,
    pub recursive: bool,
    pub interval: Duration,
    pub timeout: Duration,
}

fn scan(spec_base: &Path, caller: &CallerPath, recursive: bool) -> std::io::Result<Snapshot> {
    let base_fd = resolve::open_base(spec_base)?;
    let root = resolve::open_beneath(
        base_fd.as_fd(),
        spec_base,
        &caller.rel,
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
    .map_err(|e| match e {
        resolve::OpenError::Io(e) => e,
        resolve::OpenError::Escape => std::io::Error::from(std::io::ErrorKind::PermissionDenied),
    })?;
    let mut snapshot = Snapshot::default();
    let root_watch = rustix::io::dup(&root)?;
    snapshot.dirs.push((String::new(), root_watch));
    walk(root.as_fd(), "", recursive, &mut snapshot, 0)?;
    Ok(snapshot)
}

fn walk(
    dir: BorrowedFd<'_>,
    prefix: &str,
    recursive: bool,
    snapshot: &mut Snapshot,
    depth: usize,
) -> std::io::Result<()> {
    for name in resolve::read_dir_sorted(dir)? {
        if snapshot.entries.len() >= MAX_TRACKED {
            snapshot.truncated = true;
            return Ok(());
        }
        let Ok(stat) = resolve::lstat_child(dir, &name) else {
            continue;
        };
        let rel = format!("{prefix}{}", String::from_utf8_lossy(&name));
        let kind = resolve::kind_of(&stat);
        snapshot.entries.insert(
            rel.clone(),
            Entry {
                kind,
                size: stat.st_size as u64,
                mtime: (stat.st_mtime, stat.st_mtime_nsec as u32),
            },
        );
        if recursive && kind == Kind::Directory {
            if depth >= resolve::MAX_TREE_DEPTH {
                snapshot.truncated = true;
                continue;
            }
            if let Ok(child) = resolve::open_child_dir(dir, &name) {
                walk(
                    child.as_fd(),
                    &format!("{rel}/"),
                    recursive,
                    snapshot,
                    depth + 1,
                )?;
                snapshot.dirs.push((rel, child));
            }
        }
    }
    Ok(())
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Directory => "directory",
        Kind::Symlink => "symlink",
        _ => "file",
    }
}

fn describe(shown: &Path, name: &str, entry: &Entry) -> Value {
    json!({
        "path": shown.join(name).to_string_lossy(),
        "name": name,
        "type": kind_name(entry.kind),
        "size": entry.size,
        "modified": iso8601_utc(entry.mtime.0, entry.mtime.1),
    })
}

/// Registers an inotify watch on every tracked directory (via its descriptor, so the
/// watch follows the confined inode, not a path that could be swapped).
fn watch_dirs(inotify: &Inotify, snapshot: &Snapshot) {
    let mask = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF;
    for (_, fd) in &snapshot.dirs {
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let _ = inotify.add_watch(OsStr::from_bytes(proc_path.as_bytes()), mask);
    }
}

/// Blocks until inotify reports something or `wait` passes; drains what arrived and
/// tells whether anything did.
fn wait_for_change(inotify: &Inotify, wait: Duration) -> bool {
    let fd = inotify.as_fd();
    let mut fds = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
    let millis = wait.as_millis().min(u16::MAX as u128) as u16;
    match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(millis)) {
        Ok(n) if n > 0 => {
            // Let a burst (an editor's write-rename dance) settle into one rescan.
            std::thread::sleep(Duration::from_millis(5));
            while inotify
                .read_events()
                .map(|e| !e.is_empty())
                .unwrap_or(false)
            {}
            true
        }
        Ok(_) => false,
        // Interrupted or failed: rescan rather than risk missing something.
        Err(_) => true,
    }
}

/// Runs the watch, sending events until the timeout or until the client goes away.
pub async fn run(spec: WatchSpec, mut tx: SseSender) {
    let shown = spec.caller.shown.clone();
    let started = Instant::now();
    let deadline = started + spec.timeout;
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok();
    let base = spec.base.clone();
    let caller = spec.caller.clone();
    let recursive = spec.recursive;
    let first = blocking(move || {
        let snapshot = scan(&base, &caller, recursive);
        (snapshot, base, caller)
    })
    .await;
    let Ok((Ok(mut snapshot), base, caller)) = first else {
        let _ = tx.send("error", &json!({"error": "the directory could not be read", "path": shown.to_string_lossy()})).await;
        return;
    };
    if let Some(inotify) = &inotify {
        watch_dirs(inotify, &snapshot);
    }
    // Watches follow the inodes; the descriptors are not needed any more.
    snapshot.dirs.clear();
    let ready = json!({
        "path": shown.to_string_lossy(),
        "recursive": spec.recursive,
        "interval": spec.interval.as_secs_f64(),
        "timeout": spec.timeout.as_secs_f64(),
        "entries": snapshot.entries.len(),
        "truncated": snapshot.truncated,
        "inotify": inotify.is_some(),
    });
    if tx.send("ready", &ready).await.is_err() {
        return;
    }
    let mut inotify = inotify;
    let mut base = base;
    let mut caller = caller;
    let mut last_sent = Instant::now();
    let mut last_scan = Instant::now();
    let mut warned_truncated = snapshot.truncated;
    loop {
        let now = Instant::now();
        if now >= deadline || tx.is_closed() {
            break;
        }
        // With every directory under inotify, a rescan happens when something changed
        // (plus a safety rescan now and then); otherwise the contract's polling.
        let woken = inotify.is_some() && !snapshot.truncated;
        let since_scan = last_scan.elapsed();
        let wait = if woken {
            HEARTBEAT
                .min(SAFETY_RESCAN.saturating_sub(since_scan))
                .min(deadline - now)
        } else {
            spec.interval.min(deadline - now)
        };
        let round = blocking(move || {
            let changed = match (&inotify, woken) {
                (Some(inotify), true) => {
                    wait_for_change(inotify, wait) || since_scan + wait >= SAFETY_RESCAN
                }
                _ => {
                    std::thread::sleep(wait);
                    true
                }
            };
            let next = changed.then(|| {
                let mut next = scan(&base, &caller, recursive);
                if let (Some(inotify), Ok(next)) = (&inotify, &next) {
                    watch_dirs(inotify, next);
                }
                if let Ok(next) = &mut next {
                    next.dirs.clear();
                }
                next
            });
            (inotify, base, caller, next)
        })
        .await;
        let Ok((returned_inotify, returned_base, returned_caller, next)) = round else {
            break;
        };
        inotify = returned_inotify;
        base = returned_base;
        caller = returned_caller;
        let Some(next) = next else {
            // Nothing changed: only keep the connection alive.
            if last_sent.elapsed() >= HEARTBEAT {
                if tx.send_raw(b": keep-alive\n\n".to_vec()).await.is_err() {
                    return;
                }
                last_sent = Instant::now();
            }
            continue;
        };
        last_scan = Instant::now();
        let next = match next {
            Ok(next) => next,
            Err(_) => {
                let _ = tx
                    .send(
                        "deleted",
                        &json!({"path": shown.to_string_lossy(), "name": "", "type": "directory"}),
                    )
                    .await;
                break;
            }
        };
        let mut events: Vec<(&str, Value)> = Vec::new();
        for (name, entry) in &snapshot.entries {
            match next.entries.get(name) {
                None => events.push(("deleted", json!({"path": shown.join(name).to_string_lossy(), "name": name, "type": kind_name(entry.kind)}))),
                Some(now) if now != entry => events.push(("modified", describe(&shown, name, now))),
                Some(_) => {}
            }
        }
        for (name, entry) in &next.entries {
            if !snapshot.entries.contains_key(name) {
                events.push(("created", describe(&shown, name, entry)));
            }
        }
        if next.truncated && !warned_truncated {
            warned_truncated = true;
            events.push((
                "overflow",
                json!({"path": shown.to_string_lossy(), "tracked": MAX_TRACKED}),
            ));
        }
        for (name, data) in &events {
            if tx.send(name, data).await.is_err() {
                return;
            }
        }
        if !events.is_empty() {
            last_sent = Instant::now();
        } else if last_sent.elapsed() >= HEARTBEAT {
            if tx.send_raw(b": keep-alive\n\n".to_vec()).await.is_err() {
                return;
            }
            last_sent = Instant::now();
        }
        snapshot = next;
    }
    let _ = tx
        .send(
            "timeout",
            &json!({"path": shown.to_string_lossy(), "elapsed": started.elapsed().as_secs_f64()}),
        )
        .await;
}
