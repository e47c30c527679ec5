//! Atomic writes: data goes to a temporary file beside the target and is renamed into
//! place only when complete, so readers never see a partial file and an interrupted
//! upload leaves nothing behind.
//!
//! A streamed upload's temporary file is an anonymous `O_TMPFILE` where the file system
//! supports it (ext4, xfs, btrfs, tmpfs, overlayfs on recent kernels): if the server is
//! killed mid-upload, the kernel reclaims it and no stray file exists. Elsewhere a named
//! `.<target>.abx-*.tmp` file (with a random part, so no other process can guess it) is
//! used, removed when it is dropped on any path, and committed through its descriptor,
//! never by its name. A small file whose bytes are all in hand is created, written and
//! renamed by one call ([`write_small`]), so its named temporary file lives only as long
//! as one `write`.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags};

use super::base::{BaseDir, CallerPath};
use super::error::FsError;
use super::resolve::{self, Kind};
use crate::runtime::{blocking, AsyncFile, IoDriver};

/// Where a write lands: the confined parent directory and the name in it.
struct Target {
    parent: OwnedFd,
    name: OsString,
    /// Permission bits of the file being replaced, kept across the rename.
    keep_mode: Option<u32>,
}

/// How the temporary file is named until the commit.
enum TempName {
    /// An anonymous O_TMPFILE: nothing to clean up, the kernel reclaims it.
    Anonymous,
    /// A named file (where the file system lacks O_TMPFILE), in the target's directory
    /// or, for a detached upload, in the base directory.
    Named(NamedTemp),
}

/// A named temporary file. Dropping it removes the name if it still is this file, so
/// every path out (success, error, panic) leaves no temporary file behind, and a file
/// someone put in its place is never removed or committed.
struct NamedTemp {
    dir: OwnedFd,
    name: OsString,
    dev: u64,
    ino: u64,
}

impl NamedTemp {
    /// Whether the name still refers to this file.
    fn is_ours(&self) -> bool {
        rustix::fs::statat(&self.dir, self.name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| st.st_dev == self.dev && st.st_ino == self.ino)
    }
}

impl Drop for NamedTemp {
    fn drop(&mut self) {
        if self.is_ours() {
            let _ = rustix::fs::unlinkat(&self.dir, self.name.as_os_str(), AtFlags::empty());
        }
    }
}

/// A temporary file bound to its target, not yet visible under the target's name.
pub struct PendingWrite {
    target: Target,
    file: OwnedFd,
    temp: TempName,
    pub caller: CallerPath,
    /// Replace a file already at the target (the default); `false` makes the commit
    /// fail with EEXIST instead, decided by the kernel at the rename itself
    /// (`RENAME_NOREPLACE`), so a file created meanwhile is never overwritten either.
    pub replace: bool,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Uploads up to this size are written by the pool task that creates the file.
const SMALL_WRITE_BYTES: usize = 64 * 1024;

/// Creates missing parent directories and the temporary file. Blocking.
pub fn prepare(base: &BaseDir, caller: CallerPath) -> Result<PendingWrite, FsError> {
    let (target, caller) = locate(base, caller, 0)?;
    let (file, temp) = create_temp(&target.parent, &target.name)
        .map_err(|e| FsError::io(e, caller.input.clone()))?;
    Ok(PendingWrite {
        temp,
        target,
        file,
        caller,
        replace: true,
    })
}

/// Most symlinks followed from an upload's path to the file it replaces (as the kernel's
/// limit on nested links, roughly).
const MAX_LINK_HOPS: usize = 8;

/// Finds (creating missing parents) where `caller` is written; a symlink as the last
/// component is followed (as Python's `open(path, "wb")` writes through it), confined
/// like any caller path. Returns the caller path actually written. Blocking.
fn locate(
    base: &BaseDir,
    caller: CallerPath,
    hops: usize,
) -> Result<(Target, CallerPath), FsError> {
    let Some(name) = caller.file_name().map(OsStr::to_os_string) else {
        return Err(FsError::Invalid(
            "path must name a file, not the base directory".into(),
        ));
    };
    let input = caller.input.clone();
    let io = |e: io::Error| FsError::io(e, input.clone());
    let at_top = caller.parent_rel().as_os_str().is_empty();
    // Work relative to a real (not O_PATH) descriptor of the confined parent.
    let parent = match at_top.then(|| base.open_readable()).flatten() {
        Some(parent) => parent,
        None => base
            .open_creating()?
            .create_dirs_opened(
                caller.parent_rel(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            )
            .map_err(|e| base.open_error(e, &caller))?,
    };
    let keep_mode = match rustix::fs::statat(&parent, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) if resolve::kind_of(&stat) == Kind::Directory => {
            return Err(FsError::Os {
                errno: rustix::io::Errno::ISDIR.raw_os_error(),
                message: format!("Is a directory: '{}'", caller.display()),
            });
        }
        Ok(stat) if resolve::kind_of(&stat) == Kind::File => Some(stat.st_mode & 0o7777),
        Ok(stat) if resolve::kind_of(&stat) == Kind::Symlink => {
            if hops >= MAX_LINK_HOPS {
                return Err(FsError::Os {
                    errno: rustix::io::Errno::LOOP.raw_os_error(),
                    message: format!("Too many levels of symbolic links: '{}'", caller.display()),
                });
            }
            let target = rustix::fs::readlinkat(&parent, name.as_os_str(), Vec::new())
                .map_err(|e| io(e.into()))?;
            let target = std::path::Path::new(OsStr::from_bytes(target.as_bytes()));
            let next = caller.shown.parent().unwrap_or(base.path()).join(target);
            let mut next = base
                .confine(&next.to_string_lossy())
                .map_err(|_| base.not_allowed(&input))?;
            next.input = input;
            return locate(base, next, hops + 1);
        }
        _ => None,
    };
    Ok((
        Target {
            parent,
            name,
            keep_mode,
        },
        caller,
    ))
}

/// A temporary file in `dir`: anonymous where the file system allows, else named
/// `.<name>.abx-<pid>-<n>-<random>.tmp`. Read-write, so its data can be copied if the
/// commit must cross a mount.
fn create_temp(dir: &OwnedFd, name: &OsStr) -> io::Result<(OwnedFd, TempName)> {
    let mode = Mode::from_raw_mode(0o666);
    // Without /proc (and without CAP_DAC_READ_SEARCH) an O_TMPFILE could never be named.
    // /proc is mounted or not for the life of the server: asked once.
    static HAS_PROC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let has_proc = *HAS_PROC.get_or_init(|| std::path::Path::new("/proc/self/fd").is_dir());
    if has_proc && !named_only() {
        let flags = OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC;
        if let Ok(file) = rustix::fs::openat(dir, ".", flags, mode) {
            return Ok((file, TempName::Anonymous));
        }
    }
    let temp = temp_name(name, "tmp");
    let file = rustix::fs::openat(
        dir,
        temp.as_os_str(),
        OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        mode,
    )?;
    let stat = rustix::fs::fstat(&file)?;
    let named = NamedTemp {
        dir: dir.try_clone()?,
        name: temp,
        dev: stat.st_dev,
        ino: stat.st_ino,
    };
    Ok((file, TempName::Named(named)))
}

/// How much of the target's name a temporary name repeats (so a listing shows whose it
/// is); with the suffix the name stays far below NAME_MAX.
const TEMP_NAME_PREFIX_BYTES: usize = 64;

/// `.<name>.abx-<pid>-<counter>-<random>.<suffix>`: unique, and not guessable by other
/// processes that can write the directory.
fn temp_name(name: &OsStr, suffix: &str) -> OsString {
    // The counter keyed with SipHash under random keys drawn once per process: as
    // unguessable as a `getrandom` per name, without a system call per upload.
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let counter = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let random = std::hash::BuildHasher::hash_one(KEYS.get_or_init(Default::default), counter);
    let mut temp = OsString::from(".");
    // At most a prefix of the target's name: the rest of a name near NAME_MAX (255
    // bytes) would not leave room for the suffix, and the name must still be writable.
    let name = name.as_bytes();
    temp.push(OsStr::from_bytes(
        &name[..name.len().min(TEMP_NAME_PREFIX_BYTES)],
    ));
    // The pid once: `std::process::id` is a system call each time.
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let pid = *PID.get_or_init(std::process::id);
    temp.push(format!(".abx-{pid}-{counter}-{random:016x}.{suffix}"));
    temp
}

impl PendingWrite {
    /// A second descriptor of the temporary file for writing through the driver.
    pub fn data_file(&self, driver: IoDriver) -> io::Result<AsyncFile> {
        AsyncFile::new(self.file.try_clone()?, driver)
    }

    /// Makes the data visible under the target name (replacing any file there). On
    /// failure the temporary file is gone. Blocking.
    pub fn commit(self) -> io::Result<()> {
        if let Some(mode) = self.target.keep_mode {
            rustix::fs::fchmod(&self.file, Mode::from_raw_mode(mode))?;
        }
        let flags = if self.replace {
            rustix::fs::RenameFlags::empty()
        } else {
            rustix::fs::RenameFlags::NOREPLACE
        };
        let parent = &self.target.parent;
        let target = self.target.name.as_os_str();
        // The data is linked into the target's directory through its descriptor, never
        // by its temporary name, so a file put in that name's place cannot be committed.
        let link = temp_name(&self.target.name, "link");
        match link_anonymous(&self.file, parent, &link) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => return self.copy_across(),
            Err(e) => match &self.temp {
                // No /proc and no CAP_DAC_READ_SEARCH: only the name is left to rename.
                TempName::Named(named) if named.is_ours() => {
                    return match rustix::fs::renameat_with(
                        &named.dir,
                        named.name.as_os_str(),
                        parent,
                        target,
                        flags,
                    ) {
                        Ok(()) => Ok(()),
                        Err(rustix::io::Errno::XDEV) => self.copy_across(),
                        Err(e) => Err(e.into()),
                    };
                }
                // The name was replaced, which unlinked our file (and the kernel links
                // no unlinked file that was not made O_TMPFILE): the data is still
                // there through the descriptor, so copy it.
                TempName::Named(_) => return self.copy_across(),
                TempName::Anonymous => return Err(e),
            },
        }
        if let Err(e) = rustix::fs::renameat_with(parent, link.as_os_str(), parent, target, flags) {
            let _ = rustix::fs::unlinkat(parent, link.as_os_str(), AtFlags::empty());
            return Err(e.into());
        }
        // A named temporary file's own name goes when `self` is dropped.
        Ok(())
    }

    /// The temporary file is on another mount than the target (a detached upload whose
    /// path is under a mount point inside the base directory): copy its data into a
    /// temporary file beside the target and commit that. Blocking.
    fn copy_across(self) -> io::Result<()> {
        let PendingWrite {
            target,
            file,
            temp,
            caller,
            replace,
        } = self;
        // The data stays reachable through `file`.
        drop(temp);
        let (copy, temp) = create_temp(&target.parent, &target.name)?;
        let beside = PendingWrite {
            target,
            file: copy,
            temp,
            caller,
            replace,
        };
        let copied = (|| {
            let mut from = std::fs::File::from(file);
            std::io::Seek::rewind(&mut from)?;
            let mut to = std::fs::File::from(beside.file.try_clone()?);
            std::io::copy(&mut from, &mut to)
        })();
        match copied {
            Ok(_) => beside.commit(),
            Err(e) => Err(e),
        }
    }

    /// Removes the temporary file (dropping it does the same). Blocking.
    pub fn abort(self) {}
}

/// A temporary file in the base directory whose target is not known yet: a JSON upload
/// whose `path` may arrive after its content. [`Detached::attach`] binds it to the
/// target once the path is known and confined.
pub struct Detached {
    file: OwnedFd,
    temp: TempName,
}

impl Detached {
    /// Creates the temporary file in the base directory. Blocking.
    pub fn create(base: &BaseDir) -> Result<Detached, FsError> {
        let shown = base.path().to_string_lossy().into_owned();
        let io = |e: io::Error| FsError::io(e, shown.clone());
        let beneath = base.open_creating()?;
        let root = beneath
            .open(
                std::path::Path::new(""),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| match e {
                super::resolve::OpenError::Io(e) => io(e),
                super::resolve::OpenError::Escape => io(io::Error::other("base directory")),
            })?;
        let (file, temp) = create_temp(&root, OsStr::new("upload")).map_err(io)?;
        Ok(Detached { file, temp })
    }

    /// Binds the data to `caller` (creating its parents); on error the temporary file
    /// is removed. Blocking.
    pub fn attach(
        self,
        base: &BaseDir,
        caller: CallerPath,
        replace: bool,
    ) -> Result<PendingWrite, FsError> {
        let (target, caller) = locate(base, caller, 0)?;
        Ok(PendingWrite {
            target,
            file: self.file,
            temp: self.temp,
            caller,
            replace,
        })
    }

    /// Removes the temporary file (dropping it does the same). Blocking.
    pub fn abort(self) {}
}

/// Links an open file (anonymous or not) under `name`. `AT_EMPTY_PATH` needs
/// CAP_DAC_READ_SEARCH; the `/proc/self/fd` form works for everyone with /proc.
fn link_anonymous(file: &OwnedFd, parent: &OwnedFd, name: &OsStr) -> io::Result<()> {
    if rustix::fs::linkat(file, "", parent, name, AtFlags::EMPTY_PATH).is_ok() {
        return Ok(());
    }
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    rustix::fs::linkat(
        rustix::fs::CWD,
        OsStr::from_bytes(proc_path.as_bytes()),
        parent,
        name,
        AtFlags::SYMLINK_FOLLOW,
    )?;
    Ok(())
}

/// Writes `data` to the caller's path atomically; returns the byte count and the path
/// written (a symlink at the path is written through).
pub async fn write_atomic(
    base: &BaseDir,
    caller: CallerPath,
    data: Vec<u8>,
    driver: IoDriver,
    replace: bool,
) -> Result<(usize, String), FsError> {
    let len = data.len();
    let shown = caller.display();
    let gone = |e: io::Error| FsError::io(e, shown.clone());
    if len <= SMALL_WRITE_BYTES {
        // Creating, filling and renaming a small file in one pool task costs one
        // hand-off instead of two plus an io_uring write (docs/architecture.md).
        let base = base.clone();
        return blocking(move || write_small(&base, caller, &data, replace))
            .await
            .map_err(gone)?;
    }
    let mut upload = Upload::open(base, caller, driver).await?;
    if !replace {
        upload.keep_existing();
    }
    if let Err(e) = upload.write(data).await {
        upload.abort().await;
        return Err(e);
    }
    upload.commit().await
}

/// A whole small file, written by one pool task: a named temporary file beside the
/// target, created, filled and renamed over it in this one call. Blocking.
///
/// Against the streamed path's anonymous file, which is linked under a name and then
/// renamed, this saves the `linkat`, and the `fchmod` where the umask keeps the mode
/// (docs/benchmarks.md, "Small uploads"). It keeps the same guarantees:
/// - Readers see the old file or the new one, never a part: the rename is atomic.
/// - Nothing is left behind on an error or a panic (the name is removed, if it is
///   still this file), and a crash leaves at most a hidden `.<name>.abx-*` file, as the streamed
///   path can between its `linkat` and its rename. The name lives for a `write` here.
/// - The rename is by name, as the streamed path's rename of its link name is. Whoever
///   could put another file under that name can write the directory, and so could
///   rename that file over the target themselves; in a sticky directory they can do
///   neither (the name is created with `O_EXCL` and owned by the server).
fn write_small(
    base: &BaseDir,
    caller: CallerPath,
    data: &[u8],
    replace: bool,
) -> Result<(usize, String), FsError> {
    let (target, caller) = locate(base, caller, 0)?;
    let display = caller.display();
    let io = |e: io::Error| FsError::io(e, display.clone());
    let temp = temp_name(&target.name, "tmp");
    let mode = target.keep_mode.unwrap_or(0o666);
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let file = match rustix::fs::openat(
        &target.parent,
        temp.as_os_str(),
        flags,
        Mode::from_raw_mode(mode),
    ) {
        Ok(file) => file,
        // A file system that refuses this name may still take an anonymous file (and
        // words the failure the way every other write does).
        Err(_) => return write_pending(target, caller, data, replace),
    };
    let uncommitted = Uncommitted {
        dir: &target.parent,
        name: &temp,
        file: &file,
    };
    let written = (|| {
        write_all(&file, data)?;
        // The create applied the umask; restore what it took from a kept mode.
        if target.keep_mode.is_some_and(|mode| !umask_keeps(mode)) {
            rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))?;
        }
        let flags = if replace {
            rustix::fs::RenameFlags::empty()
        } else {
            rustix::fs::RenameFlags::NOREPLACE
        };
        rustix::fs::renameat_with(
            &target.parent,
            temp.as_os_str(),
            &target.parent,
            target.name.as_os_str(),
            flags,
        )?;
        Ok(())
    })();
    // Renamed: the name is the target's now, not ours to remove.
    if written.is_ok() {
        std::mem::forget(uncommitted);
    }
    written.map_err(io)?;
    Ok((data.len(), display))
}

/// [`write_small`]'s temporary name until the rename: any other way out (an error, a
/// panic) removes it, if it is still this file.
struct Uncommitted<'a> {
    dir: &'a OwnedFd,
    name: &'a OsStr,
    file: &'a OwnedFd,
}

impl Drop for Uncommitted<'_> {
    fn drop(&mut self) {
        remove_if_ours(self.dir, self.name, self.file);
    }
}

/// [`write_small`] through an anonymous temporary file, as a streamed upload commits.
fn write_pending(
    target: Target,
    caller: CallerPath,
    data: &[u8],
    replace: bool,
) -> Result<(usize, String), FsError> {
    let display = caller.display();
    let io = |e: io::Error| FsError::io(e, display.clone());
    let (file, temp) = create_temp(&target.parent, &target.name)
        .map_err(|e| FsError::io(e, caller.input.clone()))?;
    let pending = PendingWrite {
        target,
        file,
        temp,
        caller,
        replace,
    };
    write_all(&pending.file, data).map_err(io)?;
    pending.commit().map_err(io)?;
    Ok((data.len(), display))
}

/// Removes `name` from `dir` if it is still the file open as `file`: a file someone put
/// in its place stays.
fn remove_if_ours(dir: &OwnedFd, name: &OsStr, file: &OwnedFd) {
    let (Ok(ours), Ok(there)) = (
        rustix::fs::fstat(file),
        rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW),
    ) else {
        return;
    };
    if (ours.st_dev, ours.st_ino) == (there.st_dev, there.st_ino) {
        let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
    }
}

/// Whether a file created with `mode` gets exactly that mode under this process's
/// umask (and no set-id or sticky bit, which a create may drop). When the umask cannot
/// be read, the answer is no and the mode is set explicitly.
fn umask_keeps(mode: u32) -> bool {
    // The server never changes its umask, so it is read once (`umask(2)` can only be
    // read by setting it, which would race the pool's other creates).
    static UMASK: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    let umask = UMASK.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
        u32::from_str_radix(line.trim(), 8).ok()
    });
    umask.is_some_and(|umask| mode & !0o777 == 0 && mode & umask == 0)
}

/// Writes all of `data` at the file's offset, through the descriptor itself (a `File`
/// would own it: a duplicate and its `close` per upload). Blocking.
fn write_all(file: &OwnedFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match rustix::io::write(file, data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A streamed upload: pieces are written at increasing offsets to the temporary file,
/// which becomes visible under the target name only on [`Upload::commit`].
pub struct Upload {
    stage: Option<Stage>,
    file: Option<AsyncFile>,
    written: u64,
}

/// Whether the upload knows its target yet.
enum Stage {
    Bound(PendingWrite),
    Detached(Detached),
}

impl Upload {
    /// Creates the temporary file beside the target (and the target's parents).
    pub async fn open(
        base: &BaseDir,
        caller: CallerPath,
        driver: IoDriver,
    ) -> Result<Upload, FsError> {
        let shown = caller.display();
        let base = base.clone();
        let pending = blocking(move || prepare(&base, caller))
            .await
            .map_err(|e| FsError::io(e, shown))??;
        match pending.data_file(driver) {
            Ok(file) => Ok(Upload {
                stage: Some(Stage::Bound(pending)),
                file: Some(file),
                written: 0,
            }),
            Err(e) => {
                let display = pending.caller.display();
                let _ = blocking(move || pending.abort()).await;
                Err(FsError::io(e, display))
            }
        }
    }

    /// Creates the temporary file in the base directory before the target is known;
    /// [`Upload::attach`] names the target before the commit.
    pub async fn open_detached(base: &BaseDir, driver: IoDriver) -> Result<Upload, FsError> {
        let shown = base.path().to_string_lossy().into_owned();
        let base = base.clone();
        let detached = blocking(move || Detached::create(&base))
            .await
            .map_err(|e| FsError::io(e, shown.clone()))??;
        match detached
            .file
            .try_clone()
            .and_then(|fd| AsyncFile::new(fd, driver))
        {
            Ok(file) => Ok(Upload {
                stage: Some(Stage::Detached(detached)),
                file: Some(file),
                written: 0,
            }),
            Err(e) => {
                let _ = blocking(move || detached.abort()).await;
                Err(FsError::io(e, shown))
            }
        }
    }

    /// Binds a detached upload to its target (a no-op for one opened bound). On error
    /// the temporary file is gone and the upload is spent.
    pub async fn attach(
        &mut self,
        base: &BaseDir,
        caller: CallerPath,
        replace: bool,
    ) -> Result<(), FsError> {
        let Some(Stage::Detached(detached)) = self.stage.take() else {
            return Ok(());
        };
        let shown = caller.display();
        let base = base.clone();
        let pending = blocking(move || detached.attach(&base, caller, replace))
            .await
            .map_err(|e| FsError::io(e, shown))??;
        self.stage = Some(Stage::Bound(pending));
        Ok(())
    }

    /// The path the data will appear under (empty while detached).
    pub fn display(&self) -> String {
        match &self.stage {
            Some(Stage::Bound(p)) => p.caller.display(),
            _ => String::new(),
        }
    }

    /// Appends one piece; returns the buffer for reuse.
    pub async fn write(&mut self, piece: Vec<u8>) -> Result<Vec<u8>, FsError> {
        let Some(file) = self.file.as_ref() else {
            return Err(FsError::io(
                io::Error::other("upload already finished"),
                self.display(),
            ));
        };
        let len = piece.len() as u64;
        let (result, piece) = file.write_all_at(piece, self.written).await;
        result.map_err(|e| FsError::io(e, self.display()))?;
        self.written += len;
        Ok(piece)
    }

    /// Commit will fail with EEXIST rather than replace a file at the target.
    pub fn keep_existing(&mut self) {
        if let Some(Stage::Bound(pending)) = &mut self.stage {
            pending.replace = false;
        }
    }

    /// Makes the data visible under the target name; returns the byte count and path.
    pub async fn commit(mut self) -> Result<(usize, String), FsError> {
        drop(self.file.take());
        let display = self.display();
        let Some(Stage::Bound(pending)) = self.stage.take() else {
            return Err(FsError::io(
                io::Error::other("upload has no target or already finished"),
                display,
            ));
        };
        let io = |e: io::Error| FsError::io(e, display.clone());
        blocking(move || pending.commit())
            .await
            .map_err(io)?
            .map_err(io)?;
        Ok((self.written as usize, display))
    }

    /// Removes the temporary file.
    pub async fn abort(mut self) {
        drop(self.file.take());
        match self.stage.take() {
            Some(Stage::Bound(pending)) => {
                let _ = blocking(move || pending.abort()).await;
            }
            Some(Stage::Detached(detached)) => {
                let _ = blocking(move || detached.abort()).await;
            }
            None => {}
        }
    }
}

/// A streamed write that starts out in memory: while its bytes stay within
/// [`SMALL_WRITE_BYTES`] they are held, and a write that ends there is created, filled
/// and renamed by one pool task ([`write_small`]) instead of an [`Upload`]'s two pool
/// tasks and an io_uring write. Past that it becomes an [`Upload`] and streams.
///
/// A route opens it held when the request announces a small body (its
/// `Content-Length`), so a large upload still creates its temporary file, and meets a
/// bad target, before reading the body; a held write meets the same refusals, worded
/// the same, at its commit or when it outgrows memory.
pub struct SmallFirst {
    state: Held,
    replace: bool,
}

/// Where a [`SmallFirst`]'s bytes are.
enum Held {
    /// Bytes in memory and where they go; nothing exists on disk yet.
    Memory {
        base: BaseDir,
        caller: CallerPath,
        driver: IoDriver,
        bytes: Vec<u8>,
    },
    /// Past what is held: a temporary file beside the target.
    Streaming(Upload),
    /// Committed, or failed while moving to a temporary file.
    Spent,
}

impl SmallFirst {
    /// Holds the first bytes in memory when `expected` (the body's announced size) is
    /// small; otherwise creates the temporary file now, as [`Upload::open`] does.
    pub async fn open(
        base: &BaseDir,
        caller: CallerPath,
        driver: IoDriver,
        expected: Option<u64>,
    ) -> Result<SmallFirst, FsError> {
        let state = match expected {
            Some(len) if len <= SMALL_WRITE_BYTES as u64 => Held::Memory {
                base: base.clone(),
                caller,
                driver,
                bytes: Vec::new(),
            },
            _ => Held::Streaming(Upload::open(base, caller, driver).await?),
        };
        Ok(SmallFirst {
            state,
            replace: true,
        })
    }

    /// The commit will refuse (EEXIST) rather than replace a file at the target.
    pub fn keep_existing(&mut self) {
        self.replace = false;
        if let Held::Streaming(upload) = &mut self.state {
            upload.keep_existing();
        }
    }

    /// Appends one piece; returns a buffer for the next.
    pub async fn write(&mut self, mut piece: Vec<u8>) -> Result<Vec<u8>, FsError> {
        if let Held::Memory { bytes, .. } = &mut self.state {
            if bytes.len() + piece.len() <= SMALL_WRITE_BYTES {
                if bytes.is_empty() {
                    std::mem::swap(bytes, &mut piece);
                } else {
                    bytes.extend_from_slice(&piece);
                }
                piece.clear();
                return Ok(piece);
            }
            self.spill().await?;
        }
        match &mut self.state {
            Held::Streaming(upload) => upload.write(piece).await,
            _ => Err(finished()),
        }
    }

    /// Moves held bytes to a temporary file beside the target (which creates the
    /// target's parents and meets what refuses the target), so that several files can
    /// be made ready before any of them is committed.
    pub async fn spill(&mut self) -> Result<(), FsError> {
        let state = std::mem::replace(&mut self.state, Held::Spent);
        let Held::Memory {
            base,
            caller,
            driver,
            bytes,
        } = state
        else {
            self.state = state;
            return Ok(());
        };
        let mut upload = Upload::open(&base, caller, driver).await?;
        if !self.replace {
            upload.keep_existing();
        }
        if !bytes.is_empty() {
            if let Err(e) = upload.write(bytes).await {
                upload.abort().await;
                return Err(e);
            }
        }
        self.state = Held::Streaming(upload);
        Ok(())
    }

    /// Makes the data visible under the target name; returns the byte count and the
    /// path written (a symlink at the path is written through).
    pub async fn commit(mut self) -> Result<(usize, String), FsError> {
        match std::mem::replace(&mut self.state, Held::Spent) {
            Held::Memory {
                base,
                caller,
                driver,
                bytes,
            } => write_atomic(&base, caller, bytes, driver, self.replace).await,
            Held::Streaming(upload) => upload.commit().await,
            Held::Spent => Err(finished()),
        }
    }

    /// Removes the temporary file, if one was created.
    pub async fn abort(mut self) {
        if let Held::Streaming(upload) = std::mem::replace(&mut self.state, Held::Spent) {
            upload.abort().await;
        }
    }
}

/// A write to a [`SmallFirst`] that was committed, or failed on its way to disk.
fn finished() -> FsError {
    FsError::io(io::Error::other("upload already finished"), String::new())
}

/// Whether this thread must use named temporary files: tests set it to exercise what
/// file systems without O_TMPFILE get.
#[cfg(not(test))]
fn named_only() -> bool {
    false
}

#[cfg(test)]
fn named_only() -> bool {
    tests::NAMED.with(std::cell::Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        pub static NAMED: Cell<bool> = const { Cell::new(false) };
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("abx-write-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn write_data(pending: &PendingWrite, data: &[u8]) {
        let mut file = std::fs::File::from(pending.file.try_clone().unwrap());
        std::io::Write::write_all(&mut file, data).unwrap();
    }

    #[test]
    fn named_temporary_files_commit_and_clean_up() {
        NAMED.with(|n| n.set(true));
        let dir = scratch("named");
        let base = BaseDir::new(dir.clone());
        // Committed: the target has the data and no temporary name is left.
        let pending = prepare(&base, base.confine("a.txt").unwrap()).unwrap();
        assert!(matches!(pending.temp, TempName::Named(_)));
        write_data(&pending, b"one");
        pending.commit().unwrap();
        assert_eq!(std::fs::read(dir.join("a.txt")).unwrap(), b"one");
        assert_eq!(names(&dir), ["a.txt"]);
        // Dropped without a commit (an error, a panic): the name goes.
        let pending = prepare(&base, base.confine("b.txt").unwrap()).unwrap();
        assert_eq!(names(&dir).len(), 2);
        drop(pending);
        assert_eq!(names(&dir), ["a.txt"]);
        // Another file put in the temporary name's place is neither committed nor
        // removed, and the data still arrives.
        let pending = prepare(&base, base.confine("c.txt").unwrap()).unwrap();
        write_data(&pending, b"ours");
        let temp = names(&dir)
            .into_iter()
            .find(|n| n.starts_with(".c.txt"))
            .unwrap();
        std::fs::write(dir.join("swap"), b"theirs").unwrap();
        std::fs::rename(dir.join("swap"), dir.join(&temp)).unwrap();
        pending.commit().unwrap();
        assert_eq!(std::fs::read(dir.join("c.txt")).unwrap(), b"ours");
        assert_eq!(std::fs::read(dir.join(&temp)).unwrap(), b"theirs");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn small_writes_replace_refuse_and_clean_up() {
        let dir = scratch("small");
        let base = BaseDir::new(dir.clone());
        let write = |path: &str, data: &[u8], replace: bool| {
            write_small(&base, base.confine(path).unwrap(), data, replace)
        };
        assert_eq!(write("a.txt", b"one", true).unwrap().0, 3);
        assert_eq!(write("a.txt", b"two", true).unwrap().0, 3);
        assert_eq!(std::fs::read(dir.join("a.txt")).unwrap(), b"two");
        assert_eq!(names(&dir), ["a.txt"]);
        // Refused by the rename itself: the old data stays and the temporary name goes.
        match write("a.txt", b"three", false) {
            Err(FsError::Io { error, .. }) => {
                assert_eq!(error.raw_os_error(), Some(libc::EEXIST))
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        assert_eq!(std::fs::read(dir.join("a.txt")).unwrap(), b"two");
        assert_eq!(names(&dir), ["a.txt"]);
        // A name near NAME_MAX: the temporary name is shorter than the target's.
        let long = "x".repeat(255);
        write(&long, b"long", true).unwrap();
        assert_eq!(std::fs::read(dir.join(&long)).unwrap(), b"long");
        assert_eq!(names(&dir), ["a.txt".to_string(), long]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_umask_keeps_only_modes_it_does_not_narrow() {
        let umask = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("Umask:"))
            .map(|u| u32::from_str_radix(u.trim(), 8).unwrap())
            .unwrap();
        assert_eq!(umask_keeps(0o666), umask & 0o666 == 0);
        assert_eq!(umask_keeps(0o600), umask & 0o600 == 0);
        // A set-id or sticky bit is always set explicitly.
        assert!(!umask_keeps(0o4755));
        assert!(!umask_keeps(0o1700));
    }

    #[test]
    fn detached_files_land_under_the_path_given_later() {
        for named in [false, true] {
            NAMED.with(|n| n.set(named));
            let dir = scratch(if named { "detached-named" } else { "detached" });
            let base = BaseDir::new(dir.clone());
            let detached = Detached::create(&base).unwrap();
            {
                let mut file = std::fs::File::from(detached.file.try_clone().unwrap());
                std::io::Write::write_all(&mut file, b"late path").unwrap();
            }
            let pending = detached
                .attach(&base, base.confine("sub/dir/x.bin").unwrap(), false)
                .unwrap();
            pending.commit().unwrap();
            assert_eq!(
                std::fs::read(dir.join("sub/dir/x.bin")).unwrap(),
                b"late path"
            );
            assert_eq!(names(&dir), ["sub"]);
            assert_eq!(names(&dir.join("sub/dir")), ["x.bin"]);
            // overwrite: false refuses an existing target, and nothing is left.
            let detached = Detached::create(&base).unwrap();
            let pending = detached
                .attach(&base, base.confine("sub/dir/x.bin").unwrap(), false)
                .unwrap();
            let error = pending.commit().unwrap_err();
            assert_eq!(error.raw_os_error(), Some(libc::EEXIST));
            assert_eq!(names(&dir), ["sub"]);
            assert_eq!(names(&dir.join("sub/dir")), ["x.bin"]);
            // A target that cannot be written: the temporary file goes with the error.
            std::fs::create_dir(dir.join("sub/dir/y")).unwrap();
            let detached = Detached::create(&base).unwrap();
            assert!(detached
                .attach(&base, base.confine("sub/dir/y").unwrap(), true)
                .is_err());
            assert_eq!(names(&dir), ["sub"]);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
