//! Opening a regular file for reading: from the kernel's caches on the worker when they
//! can answer without waiting (most downloads), else on the blocking pool.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};

use super::base::{BaseDir, CallerPath};
use super::error::FsError;
use super::resolve::{self, Kind};
use crate::runtime::{blocking, AsyncFile};

/// Files up to this size are read in the same step that opens them: one hand-off to the
/// pool instead of an open there followed by an io_uring read (docs/architecture.md).
pub const SMALL_FILE_BYTES: u64 = 64 * 1024;

/// An open regular file.
pub struct Opened {
    pub fd: OwnedFd,
    pub stat: rustix::fs::Stat,
    /// The whole content, when the file was small and `read_small` was asked for.
    pub small: Option<Vec<u8>>,
}

fn missing(caller: &CallerPath) -> FsError {
    FsError::NotFound(format!("File not found: {}", caller.display()))
}

fn not_a_file(caller: &CallerPath) -> FsError {
    FsError::NotFound(format!("Not a file: {}", caller.display()))
}

/// Opens the caller's regular file (`NotFound` when missing or not a file).
pub async fn open_file(
    base: &BaseDir,
    caller: &CallerPath,
    read_small: bool,
) -> Result<Opened, FsError> {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    let flags = OFlags::RDONLY | OFlags::NONBLOCK;
    match resolve::open_beneath_cached(base.path(), &caller.rel, flags) {
        Ok(Some(fd)) => {
            let stat =
                rustix::fs::fstat(&fd).map_err(|e| FsError::io(e.into(), caller.display()))?;
            if resolve::kind_of(&stat) != Kind::File {
                return Err(not_a_file(caller));
            }
            let mut small = None;
            if read_small && stat.st_size as u64 <= SMALL_FILE_BYTES {
                // One byte of slack shows whether the file grew since fstat.
                small = AsyncFile::read_cached(fd.as_fd(), stat.st_size as usize)
                    .filter(|data| data.len() as u64 <= stat.st_size as u64);
            }
            return Ok(Opened { fd, stat, small });
        }
        Err(e) if e.is_missing() => return Err(missing(caller)),
        Err(e) => return Err(base.open_error(e, caller)),
        Ok(None) => {}
    }
    let base = base.clone();
    let caller = caller.clone();
    let shown = caller.display();
    blocking(move || -> Result<Opened, FsError> {
        let beneath = base.open()?;
        let fd = match beneath.open(&caller.rel, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(e) if e.is_missing() => return Err(missing(&caller)),
            Err(e) => return Err(base.open_error(e, &caller)),
        };
        let io = |e: std::io::Error| FsError::io(e, caller.display());
        let stat = rustix::fs::fstat(&fd).map_err(|e| io(e.into()))?;
        if resolve::kind_of(&stat) != Kind::File {
            return Err(not_a_file(&caller));
        }
        let mut small = None;
        if read_small && stat.st_size as u64 <= SMALL_FILE_BYTES {
            // One byte of slack shows whether the file grew since fstat.
            let mut data = Vec::with_capacity(stat.st_size as usize + 1);
            let mut file = std::fs::File::from(fd.try_clone().map_err(io)?);
            (&mut file)
                .take(SMALL_FILE_BYTES + 1)
                .read_to_end(&mut data)
                .map_err(io)?;
            if data.len() as u64 <= SMALL_FILE_BYTES {
                small = Some(data);
            }
        }
        Ok(Opened { fd, stat, small })
    })
    .await
    .map_err(|e| FsError::io(e, shown))?
}
