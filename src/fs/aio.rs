//! Data I/O on an open file without blocking the event loop: io_uring read/write ops under
//! the io_uring driver; the blocking pool under epoll, where monoio would otherwise run
//! `pread`/`pwrite` on the event-loop thread. Buffers pass by value and come back, as
//! monoio's ops do.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::error::ApiError;

/// An open file bound to the calling worker's driver.
pub enum AsyncFile {
    Uring(monoio::fs::File),
    Pool(Arc<std::fs::File>),
}

impl AsyncFile {
    /// Wraps `fd` for the driver named by `io_driver` (`AppState::io_driver`).
    pub fn new(fd: OwnedFd, io_driver: &str) -> io::Result<AsyncFile> {
        let file = std::fs::File::from(fd);
        if io_driver == "io_uring" {
            Ok(AsyncFile::Uring(monoio::fs::File::from_std(file)?))
        } else {
            Ok(AsyncFile::Pool(Arc::new(file)))
        }
    }

    /// Reads into `buf[..capacity]` at `pos`, setting its length to what was read.
    pub async fn read_at(&self, mut buf: Vec<u8>, pos: u64) -> (io::Result<usize>, Vec<u8>) {
        buf.clear();
        match self {
            AsyncFile::Uring(file) => file.read_at(buf, pos).await,
            AsyncFile::Pool(file) => {
                let file = file.clone();
                let joined = monoio::spawn_blocking(move || {
                    use std::os::unix::fs::FileExt;
                    let capacity = buf.capacity();
                    buf.resize(capacity, 0);
                    let result = file.read_at(&mut buf, pos);
                    buf.truncate(*result.as_ref().unwrap_or(&0));
                    (result, buf)
                })
                .await;
                joined.unwrap_or_else(|_| {
                    (
                        Err(io::Error::other("blocking pool task was cancelled")),
                        Vec::new(),
                    )
                })
            }
        }
    }

    /// Fills `buf` to capacity from `pos` unless the file ends first.
    pub async fn read_full_at(&self, mut buf: Vec<u8>, pos: u64) -> (io::Result<usize>, Vec<u8>) {
        let wanted = buf.capacity();
        let mut data = std::mem::take(&mut buf);
        data.clear();
        while data.len() < wanted {
            let filled = data.len();
            let spare = Vec::with_capacity(wanted - filled);
            let (result, chunk) = self.read_at(spare, pos + filled as u64).await;
            match result {
                Ok(0) => break,
                Ok(_) => data.extend_from_slice(&chunk),
                Err(e) => return (Err(e), data),
            }
        }
        let n = data.len();
        (Ok(n), data)
    }

    /// Writes all of `buf` at `pos`.
    pub async fn write_all_at(&self, buf: Vec<u8>, pos: u64) -> (io::Result<()>, Vec<u8>) {
        match self {
            AsyncFile::Uring(file) => file.write_all_at(buf, pos).await,
            AsyncFile::Pool(file) => {
                let file = file.clone();
                let joined = monoio::spawn_blocking(move || {
                    use std::os::unix::fs::FileExt;
                    (file.write_all_at(&buf, pos), buf)
                })
                .await;
                joined.unwrap_or_else(|_| {
                    (
                        Err(io::Error::other("blocking pool task was cancelled")),
                        Vec::new(),
                    )
                })
            }
        }
    }
}

/// Runs blocking file-system work on the blocking pool and awaits it without blocking
/// the worker.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    monoio::spawn_blocking(work)
        .await
        .map_err(|_| ApiError::internal("RuntimeError", "blocking task was cancelled"))
}
