//! Opening caller paths beneath the base directory, race-free.
//!
//! Every open goes through `openat2(base_fd, rel, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`:
//! the kernel resolves each component, symlinks included, and refuses (EXDEV) any step
//! that would leave the base directory, so no `..`, symlink or rename race can escape.
//! An absolute symlink is refused by RESOLVE_BENEATH even when it points back inside; for
//! that case we canonicalise the path, check that the result lies beneath the base, and
//! open the canonical path with RESOLVE_NO_SYMLINKS added, so a symlink swapped in
//! between the check and the open makes the open fail instead of escaping.
//!
//! These are blocking syscalls; callers run them on the blocking pool.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// Why an open failed, before a route words it.
#[derive(Debug)]
pub enum OpenError {
    /// Resolution would leave the base directory.
    Escape,
    Io(io::Error),
}

impl From<io::Error> for OpenError {
    fn from(e: io::Error) -> Self {
        OpenError::Io(e)
    }
}

impl From<rustix::io::Errno> for OpenError {
    fn from(e: rustix::io::Errno) -> Self {
        OpenError::Io(e.into())
    }
}

impl OpenError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, OpenError::Io(e) if e.kind() == io::ErrorKind::NotFound)
    }

    /// Nothing is at that path: missing, or a parent component is not a directory.
    pub fn is_missing(&self) -> bool {
        matches!(self, OpenError::Io(e) if is_missing(e))
    }
}

/// Whether an I/O error means "nothing is there" (ENOENT, or ENOTDIR on a parent).
pub fn is_missing(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error())
}

/// Opens the base directory itself. Opened per request, so a base directory created (or
/// recreated) after startup is picked up.
pub fn open_base(base: &Path) -> io::Result<OwnedFd> {
    open_base_as(base, OFlags::PATH)
}

/// [`open_base`] with another access mode: `RDONLY` for a real descriptor to create and
/// rename files in (the parent of a file written at the top of the base).
pub fn open_base_as(base: &Path, access: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        base,
        access | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn rel_arg(rel: &Path) -> &Path {
    if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    }
}

/// Opens `rel` beneath `base_fd` (see the module docs for the guarantees).
pub fn open_beneath(
    base_fd: BorrowedFd<'_>,
    base: &Path,
    rel: &Path,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, OpenError> {
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(
        base_fd,
        rel_arg(rel),
        flags | OFlags::CLOEXEC,
        mode,
        resolve,
    ) {
        Ok(fd) => Ok(fd),
        Err(rustix::io::Errno::XDEV) => open_canonical(base_fd, base, rel, flags, mode),
        Err(e) => Err(e.into()),
    }
}

/// Opens `rel` beneath the base from the kernel's lookup cache only
/// (`RESOLVE_CACHED`, Linux 5.12+), which by construction never waits for the disk, so
/// it may run on a worker thread. `Ok(None)` means "would need the disk, or the kernel
/// cannot say": the caller retries with [`open_beneath`] on the blocking pool. Only for
/// opens that create nothing (the kernel refuses O_CREAT and O_TRUNC here).
pub fn open_beneath_cached(
    base: &Path,
    rel: &Path,
    flags: OFlags,
) -> Result<Option<OwnedFd>, OpenError> {
    use rustix::io::Errno;
    let retry_elsewhere =
        |e: Errno| matches!(e, Errno::AGAIN | Errno::INVAL | Errno::NOSYS | Errno::XDEV);
    let base_fd = match rustix::fs::openat2(
        rustix::fs::CWD,
        base,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::CACHED,
    ) {
        Ok(fd) => fd,
        Err(e) if retry_elsewhere(e) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS | ResolveFlags::CACHED;
    match rustix::fs::openat2(
        &base_fd,
        rel_arg(rel),
        flags | OFlags::CLOEXEC,
        Mode::empty(),
        resolve,
    ) {
        Ok(fd) => Ok(Some(fd)),
        // EXDEV may be an absolute symlink that stays inside: the pool path decides.
        Err(e) if retry_elsewhere(e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The EXDEV fallback: allowed only when the canonical path is beneath the base.
fn open_canonical(
    base_fd: BorrowedFd<'_>,
    base: &Path,
    rel: &Path,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, OpenError> {
    let canonical_base = std::fs::canonicalize(base)?;
    let joined = base.join(rel);
    // With O_NOFOLLOW (or O_CREAT of a new name) the last component is not followed.
    let canonical = if flags.contains(OFlags::NOFOLLOW) || flags.contains(OFlags::CREATE) {
        let parent = joined
            .parent()
            .map(std::fs::canonicalize)
            .transpose()?
            .unwrap_or_default();
        match joined.file_name() {
            Some(name) => parent.join(name),
            None => parent,
        }
    } else {
        match std::fs::canonicalize(&joined) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Missing: decide by the deepest ancestor that exists. Inside the base
                // it is an honest "not found" (so mkdir -p can create it); outside, or
                // through a dangling link, it is an escape.
                return match deepest_existing_ancestor(&joined) {
                    Some(found) if found.starts_with(&canonical_base) => Err(OpenError::Io(e)),
                    _ => Err(OpenError::Escape),
                };
            }
            Err(e) => return Err(e.into()),
        }
    };
    let Ok(inner) = canonical.strip_prefix(&canonical_base) else {
        return Err(OpenError::Escape);
    };
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS;
    match rustix::fs::openat2(
        base_fd,
        rel_arg(inner),
        flags | OFlags::CLOEXEC,
        mode,
        resolve,
    ) {
        Ok(fd) => Ok(fd),
        // A symlink appeared since we looked: refuse rather than follow it.
        Err(rustix::io::Errno::XDEV) | Err(rustix::io::Errno::LOOP) => Err(OpenError::Escape),
        Err(e) => Err(e.into()),
    }
}

/// The canonical form of the nearest ancestor of `path` that exists.
fn deepest_existing_ancestor(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .skip(1)
        .find_map(|p| std::fs::canonicalize(p).ok())
}

/// Reads the target of the symlink `rel` beneath the base, through a descriptor of the
/// link itself, so a component swapped mid-request cannot redirect the read.
pub fn readlink_beneath(
    base_fd: BorrowedFd<'_>,
    base: &Path,
    rel: &Path,
) -> Result<Vec<u8>, OpenError> {
    let link = open_beneath(
        base_fd,
        base,
        rel,
        OFlags::PATH | OFlags::NOFOLLOW,
        Mode::empty(),
    )?;
    Ok(rustix::fs::readlinkat(&link, "", Vec::new())?.into_bytes())
}

/// Opens the directory `rel` beneath the base, creating it and its missing parents
/// (`mkdir -p`), each component created relative to an already-confined parent.
pub fn create_dirs(base_fd: BorrowedFd<'_>, base: &Path, rel: &Path) -> Result<OwnedFd, OpenError> {
    create_dirs_opened(base_fd, base, rel, OFlags::PATH | OFlags::DIRECTORY)
}

/// [`create_dirs`], the directory opened with `flags` (which include `O_DIRECTORY`):
/// when it exists, as it nearly always does, that is one `openat2`.
pub fn create_dirs_opened(
    base_fd: BorrowedFd<'_>,
    base: &Path,
    rel: &Path,
    flags: OFlags,
) -> Result<OwnedFd, OpenError> {
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
    match open_beneath(base_fd, base, rel, flags, Mode::empty()) {
        Ok(fd) => return Ok(fd),
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    let mut prefix = PathBuf::new();
    let mut parent = open_beneath(base_fd, base, Path::new(""), dir_flags, Mode::empty())?;
    for component in rel.components() {
        let Component::Normal(name) = component else {
            continue;
        };
        prefix.push(name);
        match open_beneath(base_fd, base, &prefix, dir_flags, Mode::empty()) {
            Ok(fd) => parent = fd,
            Err(e) if e.is_not_found() => {
                match rustix::fs::mkdirat(parent.as_fd(), name, Mode::from_raw_mode(0o777)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                parent = open_beneath(base_fd, base, &prefix, dir_flags, Mode::empty())?;
            }
            Err(e) => return Err(e),
        }
    }
    if flags == dir_flags {
        return Ok(parent);
    }
    Ok(rustix::fs::openat(&parent, ".", flags, Mode::empty()).map_err(io::Error::from)?)
}

/// `lstat` of `rel` beneath the base: the last component is not followed, so a symlink is
/// reported as itself. `Ok(None)` when nothing is there.
pub fn lstat_beneath(
    base_fd: BorrowedFd<'_>,
    base: &Path,
    rel: &Path,
) -> Result<Option<rustix::fs::Stat>, OpenError> {
    match open_beneath(
        base_fd,
        base,
        rel,
        OFlags::PATH | OFlags::NOFOLLOW,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(rustix::fs::fstat(&fd)?)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Kinds of directory entry the file routes tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Directory,
    Symlink,
    Other,
}

pub fn kind_of(stat: &rustix::fs::Stat) -> Kind {
    match rustix::fs::FileType::from_raw_mode(stat.st_mode) {
        rustix::fs::FileType::RegularFile => Kind::File,
        rustix::fs::FileType::Directory => Kind::Directory,
        rustix::fs::FileType::Symlink => Kind::Symlink,
        _ => Kind::Other,
    }
}

/// The entries of an open directory with the type `getdents` reported (`Other` where
/// the file system does not say), sorted by name, without `.` and `..`.
pub fn read_dir_typed(dir: BorrowedFd<'_>) -> io::Result<Vec<(Vec<u8>, Option<Kind>)>> {
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut entries = Vec::new();
    for entry in rustix::fs::Dir::new(fd)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let kind = match entry.file_type() {
            rustix::fs::FileType::RegularFile => Some(Kind::File),
            rustix::fs::FileType::Directory => Some(Kind::Directory),
            rustix::fs::FileType::Symlink => Some(Kind::Symlink),
            rustix::fs::FileType::Unknown => None,
            _ => Some(Kind::Other),
        };
        entries.push((name.to_vec(), kind));
    }
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(entries)
}

/// Opens child `name` of `dir` as a directory without following a symlink.
pub fn open_child_dir(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        OsStr::from_bytes(name),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// `lstat` of child `name` of `dir`.
pub fn lstat_child(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<rustix::fs::Stat> {
    Ok(rustix::fs::statat(
        dir,
        OsStr::from_bytes(name),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("abx-resolve-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("base/sub")).unwrap();
        std::fs::write(dir.join("base/sub/f.txt"), b"hi").unwrap();
        std::fs::write(dir.join("secret.txt"), b"no").unwrap();
        dir
    }

    #[test]
    fn symlinks_cannot_escape_but_may_stay_inside() {
        let dir = scratch("links");
        let base = dir.join("base");
        symlink("../secret.txt", base.join("rel-out")).unwrap();
        symlink(dir.join("secret.txt"), base.join("abs-out")).unwrap();
        symlink("sub/f.txt", base.join("rel-in")).unwrap();
        symlink(base.join("sub/f.txt"), base.join("abs-in")).unwrap();
        symlink("/", base.join("root")).unwrap();
        let fd = open_base(&base).unwrap();
        let open = |rel: &str| {
            open_beneath(
                fd.as_fd(),
                &base,
                Path::new(rel),
                OFlags::RDONLY,
                Mode::empty(),
            )
        };
        assert!(matches!(open("rel-out"), Err(OpenError::Escape)));
        assert!(matches!(open("abs-out"), Err(OpenError::Escape)));
        assert!(matches!(open("root/etc/passwd"), Err(OpenError::Escape)));
        assert!(open("rel-in").is_ok());
        assert!(open("abs-in").is_ok());
        assert!(open("sub/f.txt").is_ok());
        assert!(open("nope").unwrap_err().is_not_found());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn create_dirs_and_remove_tree() {
        let dir = scratch("dirs");
        let base = dir.join("base");
        let fd = open_base(&base).unwrap();
        create_dirs(fd.as_fd(), &base, Path::new("a/b/c")).unwrap();
        assert!(base.join("a/b/c").is_dir());
        symlink(&dir, base.join("a/escape")).unwrap();
        assert!(matches!(
            create_dirs(fd.as_fd(), &base, Path::new("a/escape/x")),
            Err(OpenError::Escape)
        ));
        assert!(!dir.join("x").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
