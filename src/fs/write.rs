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
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags};

use super::aio::{blocking, AsyncFile};
use super::resolve::{self, CallerPath, Kind, OpenError};
use crate::error::ApiError;
use crate::http::response::{BodySink, SinkFuture};
use crate::http::Response;

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
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Uploads up to this size are written by the pool task that creates the file.
const SMALL_WRITE_BYTES: usize = 64 * 1024;

/// Creates missing parent directories and the temporary file. Blocking.
pub fn prepare(base: PathBuf, caller: CallerPath, input: String) -> Result<PendingWrite, ApiError> {
    prepare_following(base, caller, input, 0)
}

/// Most symlinks followed from an upload's path to the file it replaces (as the kernel's
/// limit on nested links, roughly).
const MAX_LINK_HOPS: usize = 8;

/// Like [`prepare`]; a symlink as the last component is followed (as Python's
/// `open(path, "wb")` writes through it), confined like any caller path.
fn prepare_following(
    base: PathBuf,
    caller: CallerPath,
    input: String,
    hops: usize,
) -> Result<PendingWrite, ApiError> {
    let Some(name) = caller.file_name().map(OsStr::to_os_string) else {
        return Err(ApiError::bad_request(
            "path must name a file, not the base directory",
        ));
    };
    let map = |e: OpenError| e.into_api(&input, &base);
    let base_fd = resolve::open_base(&base).map_err(|e| resolve::io_error(&e, &input))?;
    let parent = resolve::create_dirs(base_fd.as_fd(), &base, caller.parent_rel()).map_err(map)?;
    // Work relative to a real (not O_PATH) descriptor of the confined parent.
    let parent = rustix::fs::openat(
        &parent,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| resolve::io_error(&e.into(), &input))?;
    let keep_mode = match rustix::fs::statat(&parent, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) if resolve::kind_of(&stat) == Kind::Directory => {
            return Err(ApiError::internal(
                "IsADirectoryError",
                format!("Is a directory: '{}'", caller.display()),
            ));
        }
        Ok(stat) if resolve::kind_of(&stat) == Kind::File => Some(stat.st_mode & 0o7777),
        Ok(stat) if resolve::kind_of(&stat) == Kind::Symlink => {
            if hops >= MAX_LINK_HOPS {
                return Err(ApiError::internal(
                    "OSError",
                    format!("Too many levels of symbolic links: '{}'", caller.display()),
                ));
            }
            let target = rustix::fs::readlinkat(&parent, name.as_os_str(), Vec::new())
                .map_err(|e| resolve::io_error(&e.into(), &input))?;
            let target = std::path::Path::new(OsStr::from_bytes(target.as_bytes()));
            let next = caller.shown.parent().unwrap_or(&base).join(target);
            let next = CallerPath::new(&base, &next.to_string_lossy())
                .map_err(|_| crate::fs::confine::path_not_allowed(&input, &base))?;
            return prepare_following(base, next, input, hops + 1);
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
    .map_err(|e| resolve::io_error(&e.into(), &input))?;
    Ok(PendingWrite {
        parent,
        file,
        temp_name: Some(temp),
        target_name: name,
        keep_mode,
        caller,
    })
}

impl PendingWrite {
    /// A second descriptor of the temporary file for writing through the driver.
    pub fn data_file(&self, io_driver: &str) -> io::Result<AsyncFile> {
        AsyncFile::new(self.file.try_clone()?, io_driver)
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
        if let Err(e) = rustix::fs::renameat(
            &self.parent,
            temp.as_os_str(),
            &self.parent,
            self.target_name.as_os_str(),
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

/// Writes `data` to the caller's path atomically and returns the byte count.
pub async fn write_atomic(
    base: PathBuf,
    caller: CallerPath,
    input: String,
    data: Vec<u8>,
    io_driver: &'static str,
) -> Result<(usize, String), ApiError> {
    let len = data.len();
    if len <= SMALL_WRITE_BYTES {
        // Creating, filling and renaming a small file in one pool task costs one
        // hand-off instead of two plus an io_uring write (docs/architecture.md).
        return blocking(move || {
            let pending = prepare(base, caller, input)?;
            let display = pending.caller.display();
            let mut file = std::fs::File::from(
                pending
                    .file
                    .try_clone()
                    .map_err(|e| resolve::io_error(&e, &display))?,
            );
            match std::io::Write::write_all(&mut file, &data) {
                Ok(()) => pending
                    .commit()
                    .map(|_| (len, display.clone()))
                    .map_err(|e| resolve::io_error(&e, &display)),
                Err(e) => {
                    pending.abort();
                    Err(resolve::io_error(&e, &display))
                }
            }
        })
        .await?;
    }
    let pending = blocking(move || prepare(base, caller, input)).await??;
    let display = pending.caller.display();
    let file = match pending.data_file(io_driver) {
        Ok(file) => file,
        Err(e) => {
            blocking(move || pending.abort()).await?;
            return Err(resolve::io_error(&e, &display));
        }
    };
    if len > 0 {
        let (result, _) = file.write_all_at(data, 0).await;
        if let Err(e) = result {
            drop(file);
            blocking(move || pending.abort()).await?;
            return Err(resolve::io_error(&e, &display));
        }
    }
    drop(file);
    blocking(move || pending.commit())
        .await?
        .map_err(|e| resolve::io_error(&e, &display))?;
    Ok((len, display))
}

/// Streams a raw upload body into a pending write (the `BodySink` of upload-stream).
pub struct UploadSink {
    pending: Option<PendingWrite>,
    file: Option<AsyncFile>,
    written: u64,
}

impl UploadSink {
    pub async fn open(
        base: PathBuf,
        caller: CallerPath,
        input: String,
        io_driver: &'static str,
    ) -> Result<UploadSink, ApiError> {
        let pending = blocking(move || prepare(base, caller, input)).await??;
        match pending.data_file(io_driver) {
            Ok(file) => Ok(UploadSink {
                pending: Some(pending),
                file: Some(file),
                written: 0,
            }),
            Err(e) => {
                let display = pending.caller.display();
                blocking(move || pending.abort()).await?;
                Err(resolve::io_error(&e, &display))
            }
        }
    }
}

impl BodySink for UploadSink {
    fn write(&mut self, chunk: Vec<u8>) -> SinkFuture<'_, Result<Vec<u8>, ApiError>> {
        Box::pin(async move {
            let file = self.file.as_ref().expect("file present until finish");
            let len = chunk.len() as u64;
            let (result, chunk) = file.write_all_at(chunk, self.written).await;
            if let Err(e) = result {
                let display = self
                    .pending
                    .as_ref()
                    .map(|p| p.caller.display())
                    .unwrap_or_default();
                return Err(resolve::io_error(&e, &display));
            }
            self.written += len;
            Ok(chunk)
        })
    }

    fn finish(mut self: Box<Self>) -> SinkFuture<'static, Result<Response, ApiError>> {
        Box::pin(async move {
            drop(self.file.take());
            let pending = self.pending.take().expect("pending write present");
            let display = pending.caller.display();
            blocking(move || pending.commit())
                .await?
                .map_err(|e| resolve::io_error(&e, &display))?;
            Ok(Response::ok(
                &serde_json::json!({"path": display, "bytes": self.written}),
            ))
        })
    }

    fn abort(mut self: Box<Self>) -> SinkFuture<'static, ()> {
        Box::pin(async move {
            drop(self.file.take());
            if let Some(pending) = self.pending.take() {
                let _ = blocking(move || pending.abort()).await;
            }
        })
    }
}
