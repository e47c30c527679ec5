//! Data I/O on an open file without blocking the event loop: io_uring read/write ops under
//! the io_uring driver; the blocking pool under epoll, where monoio would otherwise run
//! `pread`/`pwrite` on the event-loop thread. Buffers pass by value and come back, as
//! monoio's ops do.
//!
//! Files on tmpfs or ramfs are the exception: their data lives in memory, so `pread` and
//! `pwrite` cannot wait for a disk and run on the worker. io_uring would hand them to an
//! io-wq thread (tmpfs does not do non-blocking I/O), a context switch per piece that
//! measured 15-20 % of a JSON upload's throughput (`docs/architecture.md`).

use std::any::Any;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use monoio::buf::IoBufMut;

use super::driver::IoDriver;
use crate::http::{BodyStream, LocalFuture};

/// An open file bound to the calling worker's driver.
pub enum AsyncFile {
    Uring(monoio::fs::File),
    Pool(Arc<std::fs::File>),
    /// On tmpfs or ramfs: plain `pread`/`pwrite` on the worker.
    Memory(std::fs::File),
}

impl AsyncFile {
    /// Wraps `fd` for the driver the calling worker runs.
    pub fn new(fd: OwnedFd, driver: IoDriver) -> io::Result<AsyncFile> {
        if memory_backed(fd.as_fd()) {
            return Ok(AsyncFile::Memory(std::fs::File::from(fd)));
        }
        let file = std::fs::File::from(fd);
        match driver {
            IoDriver::IoUring => Ok(AsyncFile::Uring(monoio::fs::File::from_std(file)?)),
            IoDriver::Epoll => Ok(AsyncFile::Pool(Arc::new(file))),
        }
    }

    /// Reads into `buf[..capacity]` at `pos`, setting its length to what was read.
    pub async fn read_at(&self, mut buf: Vec<u8>, pos: u64) -> (io::Result<usize>, Vec<u8>) {
        buf.clear();
        match self {
            AsyncFile::Memory(file) => {
                let result = rustix::io::pread(file, rustix::buffer::spare_capacity(&mut buf), pos);
                (result.map_err(io::Error::from), buf)
            }
            AsyncFile::Uring(file) => file.read_at(buf, pos).await,
            AsyncFile::Pool(file) => {
                // Page-cached data is copied inline (RWF_NOWAIT never waits for the disk);
                // anything else goes to the pool.
                let capacity = buf.capacity();
                buf.resize(capacity, 0);
                match rustix::io::preadv2(
                    &**file,
                    &mut [std::io::IoSliceMut::new(&mut buf)],
                    pos,
                    rustix::io::ReadWriteFlags::NOWAIT,
                ) {
                    Ok(n) if n > 0 || capacity == 0 => {
                        buf.truncate(n);
                        return (Ok(n), buf);
                    }
                    _ => buf.clear(),
                }
                let file = file.clone();
                let joined = blocking(move || {
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

    /// Fills `buf` with the `wanted` bytes from `pos` unless the file ends first.
    pub async fn read_full_at(
        &self,
        mut buf: Vec<u8>,
        pos: u64,
        wanted: usize,
    ) -> (io::Result<usize>, Vec<u8>) {
        buf.clear();
        buf.reserve(wanted);
        while buf.len() < wanted {
            let filled = buf.len();
            let (result, back) = match self {
                AsyncFile::Memory(file) => {
                    let spare = &mut buf.spare_capacity_mut()[..wanted - filled];
                    let result = rustix::io::pread(file, spare, pos + filled as u64)
                        .map(|(read, _)| read.len());
                    if let Ok(read) = result {
                        // SAFETY: pread initialised `read` bytes after `filled`.
                        unsafe { buf.set_len(filled + read) };
                    }
                    (result.map_err(io::Error::from), buf)
                }
                AsyncFile::Uring(file) => {
                    // Read straight into the spare capacity: no second buffer, no copy.
                    let (result, slice) = file
                        .read_at(buf.slice_mut(filled..wanted), pos + filled as u64)
                        .await;
                    (result, slice.into_inner())
                }
                AsyncFile::Pool(_) => {
                    let (result, chunk) = self
                        .read_at(Vec::with_capacity(wanted - filled), pos + filled as u64)
                        .await;
                    buf.extend_from_slice(&chunk);
                    (result, buf)
                }
            };
            buf = back;
            match result {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => return (Err(e), buf),
            }
        }
        let n = buf.len();
        (Ok(n), buf)
    }

    /// Reads up to `len` bytes at `pos` only if they are in the page cache: a plain
    /// `preadv2(RWF_NOWAIT)`, which never waits for the disk and so may run on a worker.
    /// `None` means some of it was not cached; use [`AsyncFile::read_full_at`].
    pub fn read_cached(fd: BorrowedFd<'_>, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len + 1];
        let mut filled = 0;
        let mut flags = rustix::io::ReadWriteFlags::NOWAIT;
        while filled < buf.len() {
            match rustix::io::preadv2(
                fd,
                &mut [std::io::IoSliceMut::new(&mut buf[filled..])],
                filled as u64,
                flags,
            ) {
                Ok(0) => break,
                Ok(n) => filled += n,
                // tmpfs and ramfs do not implement RWF_NOWAIT, but their data lives in
                // memory, so a plain read cannot wait for a disk either.
                Err(rustix::io::Errno::OPNOTSUPP) if !flags.is_empty() && memory_backed(fd) => {
                    flags = rustix::io::ReadWriteFlags::empty();
                }
                Err(_) => return None,
            }
        }
        buf.truncate(filled);
        Some(buf)
    }

    /// Writes all of `buf` at `pos`.
    pub async fn write_all_at(&self, buf: Vec<u8>, pos: u64) -> (io::Result<()>, Vec<u8>) {
        match self {
            AsyncFile::Memory(file) => {
                use std::os::unix::fs::FileExt;
                (file.write_all_at(&buf, pos), buf)
            }
            AsyncFile::Uring(file) => file.write_all_at(buf, pos).await,
            AsyncFile::Pool(file) => {
                let file = file.clone();
                let joined = blocking(move || {
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

/// Runs a short blocking call (open, getdents, fork) on the blocking pool and awaits it
/// without blocking the worker. The error is the pool dropping the task (it panicked).
///
/// Every call goes through one task type: the closure and its result are boxed, so the
/// pool's task machinery (poll, join, drop, with each closure inlined into its poll) is
/// compiled once, not once per call site: 508 KB of the binary over 85 call sites. The
/// two boxes are two small allocations beside a thread hand-off.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    let out = blocking_erased(Box::new(move || Box::new(work()) as Box<dyn Any + Send>)).await?;
    Ok(*out
        .downcast::<T>()
        .expect("the erased task returns what its closure returned"))
}

type ErasedWork = Box<dyn FnOnce() -> Box<dyn Any + Send> + Send>;

async fn blocking_erased(work: ErasedWork) -> io::Result<Box<dyn Any + Send>> {
    monoio::spawn_blocking(work)
        .await
        .map_err(|_| io::Error::other("blocking task was cancelled (it panicked)"))
}

/// A region of an open file as a response body of known length: each piece is read
/// while the previous one is being sent (the engine overlaps them).
pub struct FileStream {
    file: AsyncFile,
    pos: u64,
    end: u64,
}

impl FileStream {
    /// The `len` bytes of `file` from `offset`.
    pub fn new(file: AsyncFile, offset: u64, len: u64) -> FileStream {
        FileStream {
            file,
            pos: offset,
            end: offset + len,
        }
    }
}

/// Largest piece of a file held in memory at once.
const FILE_PIECE: usize = 256 * 1024;

impl BodyStream for FileStream {
    fn length(&self) -> Option<u64> {
        Some(self.end - self.pos)
    }

    fn next(&mut self, mut buf: Vec<u8>) -> LocalFuture<'_, io::Result<Option<Vec<u8>>>> {
        Box::pin(async move {
            if self.pos >= self.end {
                return Ok(None);
            }
            let want = ((self.end - self.pos) as usize).min(FILE_PIECE);
            buf.clear();
            if buf.capacity() < want {
                buf.reserve(want);
            }
            let (result, mut buf) = self.file.read_at(buf, self.pos).await;
            let n = result?;
            if n == 0 || buf.is_empty() {
                // The file shrank since its size was announced.
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            buf.truncate(want.min(n));
            self.pos += buf.len() as u64;
            Ok(Some(buf))
        })
    }
}

/// The most raw bytes per base64 piece: a multiple of 3, so pieces encode without padding
/// and concatenate into one valid encoding (256 KiB of base64 out per piece).
const BASE64_PIECE: usize = 3 * 64 * 1024;
/// Three pages: the smallest piece that is both whole base64 quanta and whole pages.
const ALIGNED_QUANTUM: usize = 3 * 4096;

/// A file region as standard base64 between a `prefix` and a `suffix` (the value of a
/// JSON string field, with the object around it), as a body of known length. Each
/// piece is read straight into a reused buffer, encoded into the outgoing buffer's
/// spare capacity (nothing is zero-filled first) and sent while the next is read, so
/// memory stays at one piece per response whatever the file's size.
pub struct Base64FileStream {
    file: AsyncFile,
    pos: u64,
    end: u64,
    prefix: Option<Vec<u8>>,
    suffix: Option<Vec<u8>>,
    raw: Vec<u8>,
    length: u64,
}

/// Appends the base64 of `data` to `out`, growing it once to hold that and `room_after`
/// bytes more (what the caller writes after it): a JSON answer whose string is the base64
/// of a file read whole (a small download, an archive), written in place. It encodes every
/// byte, so it lives in the engine, built for speed, beside the streamed
/// [`Base64FileStream`] (docs/architecture.md, "Packages").
pub fn push_base64(out: &mut Vec<u8>, data: &[u8], room_after: usize) {
    let encoded_len = base64_simd::STANDARD.encoded_length(data.len());
    out.reserve(encoded_len + room_after);
    let start = out.len();
    out.resize(start + encoded_len, 0);
    let written = base64_simd::STANDARD
        .encode(data, base64_simd::Out::from_slice(&mut out[start..]))
        .len();
    debug_assert_eq!(written, encoded_len);
}

impl Base64FileStream {
    /// The `len` bytes of `file` from `offset`, encoded, after `prefix` and before
    /// `suffix`.
    pub fn new(file: AsyncFile, offset: u64, len: u64, prefix: Vec<u8>, suffix: Vec<u8>) -> Self {
        let length = prefix.len() as u64 + len.div_ceil(3) * 4 + suffix.len() as u64;
        Base64FileStream {
            file,
            pos: offset,
            end: offset + len,
            prefix: Some(prefix),
            suffix: Some(suffix),
            raw: Vec::new(),
            length,
        }
    }
}

impl Drop for Base64FileStream {
    fn drop(&mut self) {
        crate::http::chunks::give(std::mem::take(&mut self.raw));
    }
}

impl BodyStream for Base64FileStream {
    fn length(&self) -> Option<u64> {
        Some(self.length)
    }

    fn next(&mut self, mut buf: Vec<u8>) -> LocalFuture<'_, io::Result<Option<Vec<u8>>>> {
        Box::pin(async move {
            buf.clear();
            if let Some(prefix) = self.prefix.take() {
                buf.extend_from_slice(&prefix);
            }
            if self.pos < self.end {
                // Fill the outgoing buffer without outgrowing it (the engine hands the
                // same two buffers back and forth): a reallocation per piece showed as
                // page faults in the profile.
                let suffix = self.suffix.as_ref().map_or(0, Vec::len);
                let free = buf.capacity().saturating_sub(buf.len());
                let left = (self.end - self.pos) as usize;
                let want = if base64_simd::STANDARD.encoded_length(left) + suffix <= free {
                    // The last piece, with the suffix after it.
                    left
                } else {
                    // A middle piece: whole pages of the file, so that every read after
                    // the first starts on a page boundary (a piece shortened by the
                    // prefix or the suffix shifted every later read off it).
                    let room = (free / 4 * 3).min(BASE64_PIECE);
                    let aligned = room / ALIGNED_QUANTUM * ALIGNED_QUANTUM;
                    let piece = if aligned > 0 {
                        aligned
                    } else if room >= 3 {
                        room / 3 * 3
                    } else {
                        BASE64_PIECE
                    };
                    if piece < left {
                        piece
                    } else {
                        // The rest does not fit beside the suffix: all of it but its last
                        // quantum now, that quantum with the suffix next time.
                        match (left - 1) / 3 * 3 {
                            0 => left,
                            most => most,
                        }
                    }
                };
                let mut raw = std::mem::take(&mut self.raw);
                if raw.capacity() < BASE64_PIECE {
                    raw = crate::http::chunks::take();
                }
                // Exactly this piece's bytes: reading to the buffer's capacity would copy
                // bytes the next piece reads again.
                let (result, raw) = self.file.read_full_at(raw, self.pos, want).await;
                result?;
                if raw.len() < want {
                    // The file shrank since its size was announced.
                    return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                }
                let encoded = base64_simd::STANDARD.encoded_length(want);
                // No slack: the piece was chosen to fit what is free (with the suffix only
                // after the last piece), and growing the buffer here meant a realloc and
                // fresh pages per piece (6 % of a 1 MiB download's time went to those page
                // faults).
                buf.reserve(encoded + if want == left { suffix } else { 0 });
                let start = buf.len();
                let written = base64_simd::STANDARD
                    .encode(
                        &raw,
                        base64_simd::Out::from_uninit_slice(
                            &mut buf.spare_capacity_mut()[..encoded],
                        ),
                    )
                    .len();
                debug_assert_eq!(written, encoded);
                // SAFETY: the encoder initialised exactly `encoded` bytes after `start`.
                unsafe { buf.set_len(start + encoded) };
                self.pos += want as u64;
                self.raw = raw;
            }
            if self.pos >= self.end {
                if let Some(suffix) = self.suffix.take() {
                    buf.extend_from_slice(&suffix);
                }
            }
            Ok((!buf.is_empty()).then_some(buf))
        })
    }
}

/// Whether `fd` is on a memory-only file system (tmpfs, ramfs).
fn memory_backed(fd: BorrowedFd<'_>) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    rustix::fs::fstatfs(fd).is_ok_and(|st| {
        // `f_type` is i64 on x86_64 but narrower or unsigned on other architectures.
        #[allow(clippy::unnecessary_cast)]
        let kind = st.f_type as i64;
        kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
    })
}
