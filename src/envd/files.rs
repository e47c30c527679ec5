//! envd's view of files: `EntryInfo` for a path and for a directory's tree, worded as
//! envd words them (Go's `FileMode` bits and string, owner and group names, the target
//! of a symlink). Confinement is the file routes' own: everything is opened beneath the
//! base directory through `fs::BaseDir`.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

use super::proto::filesystem::{EntryInfo, FileType};
use super::proto::Timestamp;
use crate::fs::resolve::{self, Kind};
use crate::fs::walk::{self, Entry, Order, Rules, Visit, Visitor};
use crate::fs::{BaseDir, CallerPath, FsError};
use crate::runtime::blocking;

/// Go's `os.ModeDir` and `os.ModeSymlink`, which envd's `mode` carries.
const GO_MODE_DIR: u32 = 1 << 31;
const GO_MODE_SYMLINK: u32 = 1 << 27;

/// User and group names by id, read once per call from `/etc/passwd` and `/etc/group`.
#[derive(Default)]
struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    fn load() -> Names {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .unwrap_or_default()
                .lines()
                .filter_map(|line| {
                    let mut fields = line.split(':');
                    let name = fields.next()?.to_string();
                    let id = fields.nth(1)?.parse().ok()?;
                    Some((id, name))
                })
                .collect::<HashMap<u32, String>>()
        };
        Names {
            users: read("/etc/passwd"),
            groups: read("/etc/group"),
        }
    }

    fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

/// `drwxr-xr-x`, as Go's `FileMode.String()` writes the common cases.
fn permissions(kind: Kind, mode: u32) -> String {
    let mut text = String::with_capacity(10);
    text.push(match kind {
        Kind::Directory => 'd',
        Kind::Symlink => 'L',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

fn entry(
    names: &Names,
    name: &[u8],
    shown: &Path,
    stat: &rustix::fs::Stat,
    target: Option<(String, Option<rustix::fs::Stat>)>,
) -> EntryInfo {
    let kind = resolve::kind_of(stat);
    let perm = stat.st_mode & 0o777;
    let go_mode = perm
        | match kind {
            Kind::Directory => GO_MODE_DIR,
            Kind::Symlink => GO_MODE_SYMLINK,
            _ => 0,
        };
    // A link is reported as what it leads to (envd's type), with its target's path.
    let (file_type, symlink_target) = match (&kind, &target) {
        (Kind::Symlink, Some((path, target_stat))) => (
            match target_stat.as_ref().map(resolve::kind_of) {
                Some(Kind::Directory) => FileType::Directory,
                _ => FileType::File,
            },
            Some(path.clone()),
        ),
        (Kind::Directory, _) => (FileType::Directory, None),
        _ => (FileType::File, None),
    };
    EntryInfo {
        name: String::from_utf8_lossy(name).into_owned(),
        r#type: file_type as i32,
        path: shown.to_string_lossy().into_owned(),
        size: stat.st_size,
        mode: go_mode,
        permissions: permissions(kind, perm),
        owner: names.user(stat.st_uid),
        group: names.group(stat.st_gid),
        modified_time: Some(Timestamp {
            seconds: stat.st_mtime,
            nanos: (stat.st_mtime_nsec as i32).clamp(0, 999_999_999),
        }),
        symlink_target,
        metadata: Default::default(),
    }
}

/// Where the link at `rel` leads (an absolute path) and what is there, when that is
/// inside the base; `None` for a link that leads out.
fn link_target(
    beneath: &crate::fs::base::Beneath<'_>,
    rel: &Path,
) -> Option<(String, Option<rustix::fs::Stat>)> {
    match beneath.open(rel, OFlags::PATH, Mode::empty()) {
        Ok(fd) => {
            let target_rel = beneath.rel_of(fd.as_fd())?;
            let stat = rustix::fs::fstat(&fd).ok();
            let shown = beneath.base().path().join(target_rel);
            Some((shown.to_string_lossy().into_owned(), stat))
        }
        Err(resolve::OpenError::Escape) => None,
        // Dangling: the target as written, resolved against the link's directory.
        Err(_) => {
            let target = beneath.readlink(rel).ok()?;
            let parent = rel.parent().unwrap_or(Path::new(""));
            let lexical = beneath
                .base()
                .path()
                .join(parent)
                .join(std::ffi::OsStr::from_bytes(&target));
            Some((lexical.to_string_lossy().into_owned(), None))
        }
    }
}

/// The entry at the caller's path; `None` when nothing is there.
pub async fn stat(base: &BaseDir, caller: CallerPath) -> Result<Option<EntryInfo>, FsError> {
    let base = base.clone();
    let shown = caller.display();
    blocking(move || -> Result<Option<EntryInfo>, FsError> {
        let beneath = match base.open() {
            Ok(beneath) => beneath,
            Err(FsError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let stat = match beneath.lstat(&caller.rel) {
            Ok(Some(stat)) => stat,
            Ok(None) => return Ok(None),
            Err(e) if e.is_missing() => return Ok(None),
            Err(e) => return Err(base.open_error(e, &caller)),
        };
        let target = (resolve::kind_of(&stat) == Kind::Symlink)
            .then(|| link_target(&beneath, &caller.rel))
            .flatten();
        let name = caller
            .shown
            .file_name()
            .map(|n| n.as_bytes().to_vec())
            .unwrap_or_else(|| b"/".to_vec());
        Ok(Some(entry(
            &Names::load(),
            &name,
            &caller.shown,
            &stat,
            target,
        )))
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

/// The entries beneath the caller's directory, `depth` levels deep (1: its own
/// entries), at most `max_entries`. Links are listed, never entered; links that lead
/// outside the base are left out, as the file routes leave them out.
pub async fn list(
    base: &BaseDir,
    caller: CallerPath,
    depth: usize,
    max_entries: usize,
) -> Result<Vec<EntryInfo>, FsError> {
    let base = base.clone();
    let shown = caller.display();
    blocking(move || -> Result<Vec<EntryInfo>, FsError> {
        let beneath = base.open()?;
        let dir = beneath.open_dir(&caller, OFlags::RDONLY)?;
        let mut listing = Listing {
            names: Names::load(),
            beneath: &beneath,
            root: &caller,
            entries: Vec::new(),
            left: max_entries,
        };
        let rules = Rules {
            max_depth: depth.saturating_sub(1),
            order: Order::Interleaved,
        };
        let links_out = |rel: &Path| beneath.link_at_leads_out(rel).unwrap_or(true);
        let unseen = walk::Unseen {
            hidden: None,
            links_out: Some(&links_out),
        };
        walk::walk_visible(dir.as_fd(), &caller.rel, unseen, rules, &mut listing)
            .map_err(|e| FsError::io(e, caller.display()))?;
        Ok(listing.entries)
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

struct Listing<'a> {
    names: Names,
    beneath: &'a crate::fs::base::Beneath<'a>,
    root: &'a CallerPath,
    entries: Vec<EntryInfo>,
    left: usize,
}

impl Visitor for Listing<'_> {
    fn visit(&mut self, found: &Entry<'_>) -> io::Result<Visit> {
        if self.left == 0 {
            return Ok(Visit::Stop);
        }
        let Ok(stat) = found.lstat() else {
            return Ok(Visit::Skip);
        };
        self.left -= 1;
        let below = found.rel_path();
        let rel = self.root.rel.join(&below);
        let shown = self.root.shown.join(&below);
        let target = (found.kind == Kind::Symlink)
            .then(|| link_target(self.beneath, &rel))
            .flatten();
        self.entries
            .push(entry(&self.names, found.name, &shown, &stat, target));
        Ok(Visit::Continue)
    }

    fn unreadable(&mut self, rel: &str, error: io::Error) -> io::Result<()> {
        if rel.is_empty() {
            Err(error)
        } else {
            Ok(())
        }
    }
}

/// Hands the entry at the caller's path (a link itself, never its target) to
/// `uid`:`gid`: what a call running as another user creates is that user's.
pub async fn give_to(
    base: &BaseDir,
    caller: CallerPath,
    uid: u32,
    gid: u32,
) -> Result<(), FsError> {
    let base = base.clone();
    let shown = caller.display();
    blocking(move || -> Result<(), FsError> {
        let beneath = base.open()?;
        let fd = beneath
            .open(&caller.rel, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())
            .map_err(|e| base.open_error(e, &caller))?;
        rustix::fs::chownat(
            &fd,
            "",
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            rustix::fs::AtFlags::EMPTY_PATH | rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| FsError::io(e.into(), caller.display()))
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_read_as_go_writes_them() {
        assert_eq!(permissions(Kind::Directory, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(Kind::File, 0o640), "-rw-r-----");
        assert_eq!(permissions(Kind::Symlink, 0o777), "Lrwxrwxrwx");
    }
}
