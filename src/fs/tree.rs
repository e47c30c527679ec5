//! Operations on paths and trees: list, stat, mkdir, delete, move, search. Each takes
//! the confinement object and a checked caller path, does its blocking work in one
//! blocking-pool task (or on the worker when the kernel's caches can answer without
//! waiting), and reports an [`FsError`].

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, Mode, OFlags};

use super::base::{BaseDir, CallerPath};
use super::error::FsError;
use super::fnmatch::fnmatch;
use super::resolve::{self, Kind};
use super::walk::{self, Entry, Order, Rules, Visit, Visitor};
use crate::runtime::blocking;

/// Levels `/files/list?recursive=true` shows: the directory's entries and two below.
pub const LIST_MAX_DEPTH: usize = 3;

/// Entries `/files/list` shows at most unless asked for fewer (the reference's 1,000):
/// a directory of a million files is not one answer of a million entries.
pub const LIST_MAX_ENTRIES: usize = 1000;

fn pool_error(error: io::Error, caller: &CallerPath) -> FsError {
    FsError::io(error, caller.display())
}

/// Whether the directory `caller` holds an entry `hidden` hides (or more entries than
/// can be checked, 100,000), so that deleting or moving it would reach what the caller
/// may not touch. `false` for anything that is not a directory.
pub async fn holds_hidden(
    base: &BaseDir,
    caller: &CallerPath,
    hidden: walk::Hidden,
) -> Result<bool, FsError> {
    let base = base.clone();
    let caller = caller.clone();
    let shown = caller.display();
    blocking(move || -> Result<bool, FsError> {
        let beneath = base.open()?;
        let Ok(dir) = beneath.open_dir(&caller, OFlags::RDONLY) else {
            return Ok(false);
        };
        struct Seek<'h> {
            root: &'h std::path::Path,
            hidden: &'h walk::Hidden,
            seen: usize,
            found: bool,
        }
        impl Visitor for Seek<'_> {
            fn visit(&mut self, entry: &Entry<'_>) -> io::Result<Visit> {
                self.seen += 1;
                if self.seen > 100_000 || (self.hidden)(&self.root.join(entry.rel_path())) {
                    self.found = true;
                    return Ok(Visit::Stop);
                }
                Ok(Visit::Continue)
            }
            fn unreadable(&mut self, _rel: &str, _error: io::Error) -> io::Result<()> {
                Ok(())
            }
        }
        let mut seek = Seek {
            root: &caller.rel,
            hidden: &hidden,
            seen: 0,
            found: false,
        };
        let rules = Rules {
            max_depth: walk::MAX_TREE_DEPTH,
            order: Order::Interleaved,
        };
        walk::walk(dir.as_fd(), rules, &mut seek).map_err(|e| FsError::io(e, caller.display()))?;
        Ok(seek.found)
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

/// `/files/list`: the JSON text of `{"entries": [...]}`, written directly (a fraction of
/// the cost of building a tree of values), `levels` deep (1: the directory's own
/// entries).
pub async fn list_json(
    base: &BaseDir,
    caller: CallerPath,
    levels: usize,
    hidden: Option<walk::Hidden>,
    max_entries: usize,
) -> Result<Vec<u8>, FsError> {
    let base = base.clone();
    let shown = caller.display();
    blocking(move || -> Result<Vec<u8>, FsError> {
        let beneath = base.open()?;
        let dir = beneath.open_dir(&caller, OFlags::RDONLY)?;
        let mut listing = Listing {
            out: Vec::with_capacity(4096),
            first: true,
            left: max_entries,
        };
        listing.out.extend_from_slice(b"{\"entries\":[");
        let rules = Rules {
            max_depth: levels.saturating_sub(1),
            order: Order::Interleaved,
        };
        let links_out = |rel: &Path| beneath.link_at_leads_out(rel).unwrap_or(true);
        let unseen = walk::Unseen {
            hidden: hidden.as_ref(),
            links_out: Some(&links_out),
        };
        walk::walk_visible(dir.as_fd(), &caller.rel, unseen, rules, &mut listing)
            .map_err(|e| FsError::io(e, caller.display()))?;
        listing.out.extend_from_slice(b"]}");
        Ok(listing.out)
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

struct Listing {
    out: Vec<u8>,
    first: bool,
    /// Entries still to show: the walk stops at 0.
    left: usize,
}

impl Visitor for Listing {
    fn visit(&mut self, entry: &Entry<'_>) -> io::Result<Visit> {
        if self.left == 0 {
            return Ok(Visit::Stop);
        }
        let Ok(stat) = entry.lstat() else {
            return Ok(Visit::Skip);
        };
        self.left -= 1;
        let out = &mut self.out;
        if !self.first {
            out.push(b',');
        }
        self.first = false;
        out.extend_from_slice(b"{\"name\":");
        // The base name, as the reference's `os.scandir` walk names every entry, even
        // in a recursive listing.
        serde_json::to_writer(&mut *out, &String::from_utf8_lossy(entry.name))
            .map_err(io::Error::other)?;
        out.extend_from_slice(if entry.kind == Kind::Directory {
            b",\"type\":\"directory\",\"size\":"
        } else {
            b",\"type\":\"file\",\"size\":"
        });
        out.extend_from_slice(itoa::Buffer::new().format(stat.st_size).as_bytes());
        out.extend_from_slice(b",\"modified\":\"");
        crate::timefmt::push_iso8601_utc(
            out,
            stat.st_mtime,
            (stat.st_mtime_nsec as u32).min(999_999_999),
        );
        out.extend_from_slice(b"\"}");
        Ok(Visit::Continue)
    }

    /// A subdirectory that cannot be entered is listed without its contents, as before.
    fn unreadable(&mut self, rel: &str, error: io::Error) -> io::Result<()> {
        if rel.is_empty() {
            Err(error)
        } else {
            Ok(())
        }
    }
}

/// `lstat` of the caller's path: `None` when nothing is there. From the dentry cache on
/// the worker when possible (it cannot wait for the disk), else on the pool.
pub async fn stat(
    base: &BaseDir,
    caller: &CallerPath,
) -> Result<Option<rustix::fs::Stat>, FsError> {
    match resolve::open_beneath_cached(base.path(), &caller.rel, OFlags::PATH | OFlags::NOFOLLOW) {
        Ok(Some(fd)) => {
            return rustix::fs::fstat(&fd)
                .map(Some)
                .map_err(|e| FsError::io(e.into(), caller.input.clone()));
        }
        // A cached negative entry is as definite as a positive one.
        Err(e) if e.is_missing() => return Ok(None),
        Err(e) => return Err(base.open_error(e, caller)),
        Ok(None) => {}
    }
    let base = base.clone();
    let caller = caller.clone();
    let shown = caller.display();
    blocking(move || {
        let beneath = match base.open() {
            Ok(beneath) => beneath,
            // No base directory: nothing is there.
            Err(FsError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        match beneath.lstat(&caller.rel) {
            Ok(found) => Ok(found),
            // A parent that is missing or not a directory: nothing is there.
            Err(e) if e.is_missing() => Ok(None),
            Err(e) => Err(base.open_error(e, &caller)),
        }
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

/// What `/files/stat` reports on: the caller's path, or where its symlink leads.
pub struct Followed {
    /// The path reported: the caller's, or the link's target beneath the base.
    pub path: CallerPath,
    /// `None` when nothing is there (a dangling link: its target's path, missing).
    pub stat: Option<rustix::fs::Stat>,
}

/// Where the caller's path really leads beneath the base, every symlink followed (as
/// the reference's `realpath`): the longest part that exists is resolved by the kernel
/// (confined beneath the base), the part that does not yet exist is appended as
/// written. A path that leads outside the base is refused (403 `path_not_allowed`).
/// The policy's path rules are checked on this too, so a link inside an allowed
/// directory cannot lead a caller into a denied one.
pub async fn real_path(base: &BaseDir, caller: CallerPath) -> Result<CallerPath, FsError> {
    let base = base.clone();
    let shown = caller.display();
    blocking(move || -> Result<CallerPath, FsError> {
        let beneath = base.open()?;
        let mut existing = caller.rel.clone();
        let mut missing: Vec<std::ffi::OsString> = Vec::new();
        loop {
            match beneath.open(&existing, OFlags::PATH, Mode::empty()) {
                Ok(fd) => {
                    let mut rel = beneath
                        .rel_of(fd.as_fd())
                        .ok_or_else(|| base.not_allowed(&caller.input))?;
                    for name in missing.iter().rev() {
                        rel.push(name);
                    }
                    return Ok(CallerPath {
                        shown: base.path().join(&rel),
                        rel,
                        input: caller.input.clone(),
                    });
                }
                Err(resolve::OpenError::Escape) => return Err(base.not_allowed(&caller.input)),
                Err(e) if e.is_missing() => match existing.file_name() {
                    Some(name) => {
                        missing.push(name.to_owned());
                        existing.pop();
                    }
                    None => return Ok(caller),
                },
                Err(e) => return Err(base.open_error(e, &caller)),
            }
        }
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

/// `stat` of the caller's path, following a symlink as the reference's `realpath`
/// does: the answer names the target. A link leading outside the base is refused like
/// any outside path (403 `path_not_allowed`).
pub async fn stat_followed(base: &BaseDir, caller: CallerPath) -> Result<Followed, FsError> {
    let found = stat(base, &caller).await?;
    if found.as_ref().map(resolve::kind_of) != Some(Kind::Symlink) {
        return Ok(Followed {
            path: caller,
            stat: found,
        });
    }
    let base = base.clone();
    let shown = caller.display();
    blocking(move || {
        let beneath = base.open()?;
        let outside = || base.not_allowed(&caller.input);
        match beneath.open(&caller.rel, OFlags::PATH, Mode::empty()) {
            Ok(fd) => {
                let stat =
                    rustix::fs::fstat(&fd).map_err(|e| FsError::io(e.into(), caller.display()))?;
                let rel = beneath.rel_of(fd.as_fd()).ok_or_else(outside)?;
                let path = CallerPath {
                    shown: base.path().join(&rel),
                    rel,
                    input: caller.input.clone(),
                };
                Ok(Followed {
                    path,
                    stat: Some(stat),
                })
            }
            Err(resolve::OpenError::Escape) => Err(outside()),
            // Dangling: the target's own path, if it is inside the base.
            Err(e) if e.is_missing() => {
                let target = match beneath.readlink(&caller.rel) {
                    Ok(target) => target,
                    // Replaced meanwhile by something that is not a link.
                    Err(e) => return Err(base.open_error(e, &caller)),
                };
                let lexical = base
                    .path()
                    .join(caller.parent_rel())
                    .join(OsStr::from_bytes(&target));
                if beneath.link_leads_out(&caller.rel, &target).unwrap_or(true) {
                    return Err(outside());
                }
                let mut path = base
                    .confine(&lexical.to_string_lossy())
                    .map_err(|_| outside())?;
                path.input = caller.input.clone();
                Ok(Followed { path, stat: None })
            }
            Err(e) => Err(base.open_error(e, &caller)),
        }
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

/// Opens the caller's directory as a descriptor that names the directory itself (a
/// child's working directory: entered through the descriptor, a rename or symlink swap
/// after this check cannot redirect it). Missing, or not a directory: `NotFound`.
pub async fn open_dir(base: &BaseDir, caller: &CallerPath) -> Result<OwnedFd, FsError> {
    let flags = OFlags::PATH | OFlags::DIRECTORY;
    // Failures are worded by the pool path below, which repeats the lookup.
    if let Ok(Some(fd)) = resolve::open_beneath_cached(base.path(), &caller.rel, flags) {
        return Ok(fd);
    }
    let base = base.clone();
    let caller = caller.clone();
    let shown = caller.display();
    blocking(move || base.open()?.open_dir(&caller, flags))
        .await
        .map_err(|e| FsError::io(e, shown))?
}

/// The base directory itself, created first when it is missing (as an upload or a mkdir
/// would create it): the working directory of a command that names none, so a caller who
/// sent no `cwd` is never refused for a base directory that simply does not exist yet.
pub async fn open_base_creating(base: &BaseDir) -> Result<OwnedFd, FsError> {
    let base = base.clone();
    let shown = base.path().to_string_lossy().into_owned();
    blocking(move || base.open_creating().map(super::base::Beneath::into_fd))
        .await
        .map_err(|e| FsError::io(e, shown))?
}

/// `mkdir -p`.
pub async fn mkdir(base: &BaseDir, caller: CallerPath) -> Result<(), FsError> {
    let base = base.clone();
    let shown = caller.display();
    blocking(move || {
        let beneath = base.open_creating()?;
        beneath
            .create_dirs(&caller.rel)
            .map(drop)
            .map_err(|e| base.open_error(e, &caller))
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

/// Refuses the base directory itself as what an operation removes or moves away.
pub fn refuse_base(base: &BaseDir, caller: &CallerPath) -> Result<(), FsError> {
    if caller.is_base() {
        return Err(FsError::BaseDirectory {
            input: caller.input.clone(),
            base: base.path().to_path_buf(),
        });
    }
    Ok(())
}

/// Deletes a file, a symlink (not what it points to) or a whole directory tree.
pub async fn delete(base: &BaseDir, caller: CallerPath) -> Result<(), FsError> {
    refuse_base(base, &caller)?;
    let base = base.clone();
    let shown = caller.display();
    blocking(move || {
        let beneath = base.open()?;
        let parent = beneath.open_parent(&caller, "Path")?;
        let name = caller.file_name().unwrap_or_default();
        match remove_child(parent.as_fd(), name) {
            Ok(()) => Ok(()),
            Err(e) if resolve::is_missing(&e) => Err(FsError::NotFound(format!(
                "Path not found: {}",
                caller.display()
            ))),
            Err(e) => Err(pool_error(e, &caller)),
        }
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

/// Removes child `name` of `dir`; a directory is emptied with the walk (which never
/// follows a symlink, so a link inside cannot redirect the removal) and then removed.
fn remove_child(dir: std::os::fd::BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let stat = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if resolve::kind_of(&stat) == Kind::Directory {
        let child = resolve::open_child_dir(dir, name.as_bytes())?;
        let rules = Rules {
            max_depth: walk::MAX_TREE_DEPTH,
            order: Order::Interleaved,
        };
        walk::walk(child.as_fd(), rules, &mut Remover)?;
        rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    } else {
        rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
    }
    Ok(())
}

/// Unlinks what it visits; directories once their subtree is gone.
struct Remover;

impl Visitor for Remover {
    fn visit(&mut self, entry: &Entry<'_>) -> io::Result<Visit> {
        if entry.kind != Kind::Directory {
            rustix::fs::unlinkat(entry.dir, OsStr::from_bytes(entry.name), AtFlags::empty())?;
        }
        Ok(Visit::Continue)
    }

    fn leave(&mut self, entry: &Entry<'_>) -> io::Result<Visit> {
        rustix::fs::unlinkat(entry.dir, OsStr::from_bytes(entry.name), AtFlags::REMOVEDIR)?;
        Ok(Visit::Continue)
    }
}

/// Moves `source` to `destination` (into it, when it is an existing directory, like
/// `shutil.move`), creating the destination's parents. Returns the final destination.
pub async fn move_path(
    base: &BaseDir,
    source: CallerPath,
    destination: CallerPath,
) -> Result<CallerPath, FsError> {
    refuse_base(base, &source)?;
    let base = base.clone();
    let shown = source.display();
    blocking(move || {
        let beneath = base.open()?;
        let src_parent = beneath.open_parent(&source, "Source")?;
        let src_name = source.file_name().unwrap_or_default().to_os_string();
        if resolve::lstat_child(src_parent.as_fd(), src_name.as_bytes()).is_err() {
            return Err(FsError::NotFound(format!(
                "Source not found: {}",
                source.display()
            )));
        }
        let mut destination = destination;
        if let Ok(st) = beneath
            .open(
                &destination.rel,
                OFlags::PATH | OFlags::DIRECTORY,
                Mode::empty(),
            )
            .and_then(|fd| Ok(rustix::fs::fstat(&fd)?))
        {
            if resolve::kind_of(&st) == Kind::Directory {
                destination = destination.join(&src_name);
            }
        }
        let dst_parent = beneath
            .create_dirs(destination.parent_rel())
            .map_err(|e| base.open_error(e, &destination))?;
        let Some(dst_name) = destination.file_name().map(OsStr::to_os_string) else {
            return Err(FsError::Invalid(
                "destination: must name a path beneath the base directory".into(),
            ));
        };
        rustix::fs::renameat(
            &src_parent,
            src_name.as_os_str(),
            &dst_parent,
            dst_name.as_os_str(),
        )
        .map_err(|e| FsError::io(e.into(), destination.display()))?;
        Ok(destination)
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

/// One `/files/search` hit.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Found {
    pub name: String,
    pub path: String,
}

/// What `/files/search` found.
#[derive(Debug, Default)]
pub struct Search {
    pub results: Vec<Found>,
    pub timed_out: bool,
    /// Part of the tree lies deeper than the walk goes (256 levels) and was not searched.
    pub truncated: bool,
}

/// Finds files whose name matches the fnmatch `pattern`, walking like `os.walk`.
pub async fn search(
    base: &BaseDir,
    root: CallerPath,
    pattern: String,
    max_depth: usize,
    max_results: usize,
    time_limit: Duration,
    hidden: Option<walk::Hidden>,
) -> Result<Search, FsError> {
    let base = base.clone();
    let shown = root.display();
    blocking(move || {
        let beneath = base.open()?;
        let dir = beneath.open_dir(&root, OFlags::RDONLY)?;
        let mut finder = Finder {
            pattern: pattern.as_bytes(),
            shown: root.shown.clone(),
            max_results,
            deadline: Instant::now() + time_limit,
            found: Search::default(),
        };
        // `max_depth` counts levels as the reference's `os.walk` does: 1 is the root's
        // own files, 0 is nothing at all.
        if max_results > 0 && max_depth > 0 {
            let rules = Rules {
                max_depth: (max_depth - 1).min(walk::MAX_TREE_DEPTH),
                order: Order::FilesFirst,
            };
            let links_out = |rel: &Path| beneath.link_at_leads_out(rel).unwrap_or(true);
            let unseen = walk::Unseen {
                hidden: hidden.as_ref(),
                links_out: Some(&links_out),
            };
            walk::walk_visible(dir.as_fd(), &root.rel, unseen, rules, &mut finder)
                .map_err(|e| pool_error(e, &root))?;
        }
        Ok(finder.found)
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

struct Finder<'p> {
    pattern: &'p [u8],
    shown: PathBuf,
    max_results: usize,
    deadline: Instant,
    found: Search,
}

impl Visitor for Finder<'_> {
    fn visit(&mut self, entry: &Entry<'_>) -> io::Result<Visit> {
        if Instant::now() > self.deadline {
            self.found.timed_out = true;
            return Ok(Visit::Stop);
        }
        // os.walk classifies with is_dir(), which follows symlinks; getdents already
        // knows the type of everything else, so only links cost a stat.
        let is_dir = match entry.kind {
            Kind::Directory => true,
            Kind::Symlink => {
                rustix::fs::statat(entry.dir, OsStr::from_bytes(entry.name), AtFlags::empty())
                    .is_ok_and(|st| resolve::kind_of(&st) == Kind::Directory)
            }
            _ => false,
        };
        if is_dir || !fnmatch(self.pattern, entry.name) {
            return Ok(Visit::Continue);
        }
        self.found.results.push(Found {
            name: String::from_utf8_lossy(entry.name).into_owned(),
            path: self
                .shown
                .join(&*entry.rel())
                .to_string_lossy()
                .into_owned(),
        });
        Ok(if self.found.results.len() >= self.max_results {
            Visit::Stop
        } else {
            Visit::Continue
        })
    }

    /// Unreadable directories are passed over, as `os.walk` does by default; a tree
    /// deeper than the walk goes is said in `truncated`.
    fn unreadable(&mut self, _rel: &str, error: io::Error) -> io::Result<()> {
        if walk::is_too_deep(&error) {
            self.found.truncated = true;
        }
        Ok(())
    }
}
