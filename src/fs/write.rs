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

/// A temporary file opened beside its target, not yet visible under the target's name.
pub struct PendingWrite {
    parent: OwnedFd,
    file: OwnedFd,
    /// `None` for an anonymous O_TMPFILE.
    temp_name: Option<OsString>,
    target_name: OsString,
    /// Permission bits of the file being replaced, kept across the rename.
    keep_mode: Option<u32>,
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
    prepare_following(base, caller, 0)
}

/// Most symlinks followed from an upload's path to the file it replaces (as the kernel's
/// limit on nested links, roughly).
const MAX_LINK_HOPS: usize = 8;

/// Like [`prepare`]; a symlink as the last component is followed (as Python's
/// `open(path, "wb")` writes through it), confined like any caller path.
fn prepare_following(
    base: &BaseDir,
    caller: CallerPath,
    hops: usize,
) -> Result<PendingWrite, FsError> {
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
            return prepare_following(base, next, hops + 1);
        }
        _ => None,
    };
    let mode = Mode::from_raw_mode(0o666);
    // Without /proc (and without CAP_DAC_READ_SEARCH) an O_TMPFILE could never be named.
    let anonymous = if std::path::Path::new("/proc/self/fd").is_dir() {
        rustix::fs::openat(
            &parent,
            ".",
            OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
            mode,
        )
        .ok()
    } else {
        None
    };
    if let Some(file) = anonymous {
        return Ok(PendingWrite {
            parent,
            file,
            temp_name: None,
            target_name: name,
            keep_mode,
            replace: true,
            caller,
        });
    }
    let mut temp = OsString::from(".");
    temp.push(&name);
    temp.push(format!(
        ".abx-{}-{}.tmp",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let file = rustix::fs::openat(
        &parent,
        temp.as_os_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        mode,
    )
    .map_err(|e| io(e.into()))?;
    Ok(PendingWrite {
        parent,
        file,
        temp_name: Some(temp),
        target_name: name,
        keep_mode,
        replace: true,
        caller,
    })
}

impl PendingWrite {
    /// A second descriptor of the temporary file for writing through the driver.
    pub fn data_file(&self, driver: IoDriver) -> io::Result<AsyncFile> {
        AsyncFile::new(self.file.try_clone()?, driver)
    }

    /// Makes the data visible under the target name (replacing any file there). Blocking.
    pub fn commit(self) -> io::Result<()> {
        if let Some(mode) = self.keep_mode {
            rustix::fs::fchmod(&self.file, Mode::from_raw_mode(mode))?;
        }
        let temp = match &self.temp_name {
            Some(name) => name.clone(),
            None => {
                let mut name = OsString::from(".");
                name.push(&self.target_name);
                name.push(format!(
                    ".abx-{}-{}.link",
                    std::process::id(),
                    TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
                ));
                link_anonymous(&self.file, &self.parent, &name)?;
                name
            }
        };
        let flags = if self.replace {
            rustix::fs::RenameFlags::empty()
        } else {
            rustix::fs::RenameFlags::NOREPLACE
        };
        if let Err(e) = rustix::fs::renameat_with(
            &self.parent,
            temp.as_os_str(),
            &self.parent,
            self.target_name.as_os_str(),
            flags,
        ) {
            let _ = rustix::fs::unlinkat(&self.parent, temp.as_os_str(), AtFlags::empty());
            return Err(e.into());
        }
        Ok(())
    }

    /// Removes the temporary file (a no-op for an anonymous one). Blocking.
    pub fn abort(self) {
        if let Some(name) = &self.temp_name {
            let _ = rustix::fs::unlinkat(&self.parent, name.as_os_str(), AtFlags::empty());
        }
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
    pending: Option<PendingWrite>,
    file: Option<AsyncFile>,
    written: u64,
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
                pending: Some(pending),
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

    /// The path the data will appear under.
    pub fn display(&self) -> String {
        self.pending
            .as_ref()
            .map(|p| p.caller.display())
            .unwrap_or_default()
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
        if let Some(pending) = &mut self.pending {
            pending.replace = false;
        }
    }

    /// Makes the data visible under the target name; returns the byte count and path.
    pub async fn commit(mut self) -> Result<(usize, String), FsError> {
        drop(self.file.take());
        let display = self.display();
        let Some(pending) = self.pending.take() else {
            return Err(FsError::io(
                io::Error::other("upload already finished"),
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
        if let Some(pending) = self.pending.take() {
            let _ = blocking(move || pending.abort()).await;
        }
    }
}
