//! Atomic writes: data goes to a temporary file beside the target and is renamed into
//! place only when complete, so readers never see a partial file and an interrupted
//! upload leaves nothing behind.
//!
//! The temporary file is an anonymous `O_TMPFILE` where the file system supports it
//! (ext4, xfs, btrfs, tmpfs, overlayfs on recent kernels): if the server is killed, the
//! kernel reclaims it and no stray file exists. Elsewhere a named `.<target>.abx-*.tmp`
//! file is used and removed on every failure path we see.

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
    /// A named file in the target's directory.
    Beside(OsString),
    /// A named file in another directory (a detached upload's, in the base directory).
    Elsewhere(OwnedFd, OsString),
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
    let (file, name) = create_temp(&target.parent, &target.name)
        .map_err(|e| FsError::io(e, caller.input.clone()))?;
    Ok(PendingWrite {
        temp: name.map_or(TempName::Anonymous, TempName::Beside),
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
    let beneath = base.open_creating()?;
    let parent = beneath
        .create_dirs(caller.parent_rel())
        .map_err(|e| base.open_error(e, &caller))?;
    // Work relative to a real (not O_PATH) descriptor of the confined parent.
    let parent = rustix::fs::openat(
        &parent,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io(e.into()))?;
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
/// `.<name>.abx-*.tmp` (returned). Read-write, so its data can be copied if the rename
/// must cross a mount.
fn create_temp(dir: &OwnedFd, name: &OsStr) -> io::Result<(OwnedFd, Option<OsString>)> {
    let mode = Mode::from_raw_mode(0o666);
    // Without /proc (and without CAP_DAC_READ_SEARCH) an O_TMPFILE could never be named.
    if std::path::Path::new("/proc/self/fd").is_dir() {
        let flags = OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC;
        if let Ok(file) = rustix::fs::openat(dir, ".", flags, mode) {
            return Ok((file, None));
        }
    }
    let mut temp = OsString::from(".");
    temp.push(name);
    temp.push(format!(
        ".abx-{}-{}.tmp",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let file = rustix::fs::openat(
        dir,
        temp.as_os_str(),
        OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        mode,
    )?;
    Ok((file, Some(temp)))
}

impl PendingWrite {
    /// A second descriptor of the temporary file for writing through the driver.
    pub fn data_file(&self, driver: IoDriver) -> io::Result<AsyncFile> {
        AsyncFile::new(self.file.try_clone()?, driver)
    }

    /// Makes the data visible under the target name (replacing any file there). Blocking.
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
        let (from_dir, from_name) = match &self.temp {
            TempName::Anonymous => {
                let mut name = OsString::from(".");
                name.push(&self.target.name);
                name.push(format!(
                    ".abx-{}-{}.link",
                    std::process::id(),
                    TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
                ));
                match link_anonymous(&self.file, parent, &name) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EXDEV) => return self.copy_across(),
                    Err(e) => return Err(e),
                }
                (parent, name)
            }
            TempName::Beside(name) => (parent, name.clone()),
            TempName::Elsewhere(dir, name) => (dir, name.clone()),
        };
        match rustix::fs::renameat_with(from_dir, from_name.as_os_str(), parent, target, flags) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::XDEV) => self.copy_across(),
            Err(e) => {
                let _ = rustix::fs::unlinkat(from_dir, from_name.as_os_str(), AtFlags::empty());
                Err(e.into())
            }
        }
    }

    /// The temporary file is on another mount than the target (a detached upload whose
    /// path is under a mount point inside the base directory): copy its data into a
    /// temporary file beside the target and commit that. Blocking.
    fn copy_across(self) -> io::Result<()> {
        let (file, name) = create_temp(&self.target.parent, &self.target.name)?;
        let mut from = std::fs::File::from(self.file.try_clone()?);
        let mut to = std::fs::File::from(file.try_clone()?);
        let copied =
            std::io::Seek::rewind(&mut from).and_then(|_| std::io::copy(&mut from, &mut to));
        let PendingWrite {
            target,
            temp,
            caller,
            replace,
            ..
        } = self;
        remove_temp(&temp);
        let beside = PendingWrite {
            target,
            file,
            temp: name.map_or(TempName::Anonymous, TempName::Beside),
            caller,
            replace,
        };
        match copied {
            Ok(_) => beside.commit(),
            Err(e) => {
                beside.abort();
                Err(e)
            }
        }
    }

    /// Removes the temporary file (a no-op for an anonymous one). Blocking.
    pub fn abort(self) {
        let parent = self.target.parent;
        match self.temp {
            TempName::Beside(name) => {
                let _ = rustix::fs::unlinkat(&parent, name.as_os_str(), AtFlags::empty());
            }
            other => remove_temp(&other),
        }
    }
}

fn remove_temp(temp: &TempName) {
    if let TempName::Elsewhere(dir, name) = temp {
        let _ = rustix::fs::unlinkat(dir, name.as_os_str(), AtFlags::empty());
    }
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
        let (file, name) = create_temp(&root, OsStr::new("upload")).map_err(io)?;
        Ok(Detached {
            file,
            temp: name.map_or(TempName::Anonymous, |name| TempName::Elsewhere(root, name)),
        })
    }

    /// Binds the data to `caller` (creating its parents); on error the temporary file
    /// is removed. Blocking.
    pub fn attach(
        self,
        base: &BaseDir,
        caller: CallerPath,
        replace: bool,
    ) -> Result<PendingWrite, FsError> {
        match locate(base, caller, 0) {
            Ok((target, caller)) => Ok(PendingWrite {
                target,
                file: self.file,
                temp: self.temp,
                caller,
                replace,
            }),
            Err(e) => {
                remove_temp(&self.temp);
                Err(e)
            }
        }
    }

    /// Removes the temporary file. Blocking.
    pub fn abort(self) {
        remove_temp(&self.temp);
    }
}

/// Gives an O_TMPFILE a name. `AT_EMPTY_PATH` needs CAP_DAC_READ_SEARCH; the
/// `/proc/self/fd` form works for everyone.
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
        return blocking(move || {
            let mut pending = prepare(&base, caller)?;
            pending.replace = replace;
            let display = pending.caller.display();
            let io = |e: io::Error| FsError::io(e, display.clone());
            let mut file = std::fs::File::from(pending.file.try_clone().map_err(io)?);
            match std::io::Write::write_all(&mut file, &data) {
                Ok(()) => pending.commit().map(|_| (len, display.clone())).map_err(io),
                Err(e) => {
                    pending.abort();
                    Err(io(e))
                }
            }
        })
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
