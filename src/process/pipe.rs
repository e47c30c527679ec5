//! A child's pipes, read and written on the worker's own event loop: the descriptor is
//! made non-blocking, read or written directly, and only when it would block does the
//! task wait for readiness (`runtime::ready`). An idle pipe costs no thread, and waiting
//! is cancel-safe: bytes are consumed only by the synchronous `read`, never by the wait.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::io::Errno;

use crate::runtime::ready::Readiness;

/// Bytes taken from a pipe per read: large enough that a chatty child costs few wake-ups.
pub const READ_PIECE: usize = 64 * 1024;

/// Makes `fd` non-blocking, as the readers and writers here expect.
pub fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)?;
    Ok(())
}

/// Reads in a row that found data without waiting, before the reader lets other tasks
/// run: monoio has no scheduling budget, and a child that writes as fast as the server
/// reads would otherwise hold the worker.
const READS_BEFORE_YIELD: u32 = 16;

/// The read end of a child's stdout or stderr.
pub struct PipeReader {
    fd: OwnedFd,
    ready: Readiness,
    piece: Box<[u8]>,
    reads_without_waiting: u32,
}

impl PipeReader {
    /// Must run on a worker thread: the readiness wait is registered with its driver.
    pub fn new(fd: OwnedFd) -> io::Result<PipeReader> {
        set_nonblocking(&fd)?;
        let ready = Readiness::new(fd.as_fd())?;
        Ok(PipeReader {
            fd,
            ready,
            piece: vec![0; READ_PIECE].into_boxed_slice(),
            reads_without_waiting: 0,
        })
    }

    /// The next bytes the child wrote, or `None` at end of file (every writer, the
    /// child's descendants included, has closed it). The slice is valid until the next
    /// call.
    pub async fn read(&mut self) -> io::Result<Option<&[u8]>> {
        if self.reads_without_waiting >= READS_BEFORE_YIELD {
            self.reads_without_waiting = 0;
            crate::runtime::yield_now().await;
        }
        loop {
            match rustix::io::read(&self.fd, &mut self.piece[..]) {
                Ok(0) => return Ok(None),
                Ok(n) => {
                    self.reads_without_waiting += 1;
                    return Ok(Some(&self.piece[..n]));
                }
                Err(Errno::AGAIN) => {
                    self.reads_without_waiting = 0;
                    self.ready.readable().await?
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// What is readable right now without waiting: `Ok(None)` at end of file,
    /// `Ok(Some(empty))` when nothing is there yet.
    pub fn read_now(&mut self) -> io::Result<Option<&[u8]>> {
        loop {
            match rustix::io::read(&self.fd, &mut self.piece[..]) {
                Ok(0) => return Ok(None),
                Ok(n) => return Ok(Some(&self.piece[..n])),
                Err(Errno::AGAIN) => return Ok(Some(&[])),
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A pipe read as text: each read decoded with [`Utf8Pieces`].
pub struct TextReader {
    pipe: PipeReader,
    text: Utf8Pieces,
    done: bool,
}

impl TextReader {
    /// Must run on a worker thread (see [`PipeReader::new`]).
    pub fn new(fd: OwnedFd) -> io::Result<TextReader> {
        Ok(TextReader {
            pipe: PipeReader::new(fd)?,
            text: Utf8Pieces::default(),
            done: false,
        })
    }

    /// The next text the child wrote (never empty), or `None` once the pipe is at end
    /// of file and everything held back has been returned.
    pub async fn next(&mut self) -> io::Result<Option<String>> {
        while !self.done {
            let text = match self.pipe.read().await? {
                Some(bytes) => self.text.decode(bytes),
                None => self.end(),
            };
            if !text.is_empty() {
                return Ok(Some(text));
            }
        }
        Ok(None)
    }

    /// Like [`TextReader::next`] without waiting: `Some("")` when nothing is there yet.
    pub fn next_now(&mut self) -> io::Result<Option<String>> {
        while !self.done {
            let text = match self.pipe.read_now()? {
                Some([]) => return Ok(Some(String::new())),
                Some(bytes) => self.text.decode(bytes),
                None => self.end(),
            };
            if !text.is_empty() {
                return Ok(Some(text));
            }
        }
        Ok(None)
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    fn end(&mut self) -> String {
        self.done = true;
        self.text.finish()
    }
}

/// Writes all of `data` to a non-blocking pipe, waiting on the current worker's driver
/// whenever the pipe is full. Returns the bytes written before an error, with it.
pub async fn write_all(fd: &OwnedFd, data: &[u8]) -> (usize, io::Result<()>) {
    write_all_within(fd, data, None).await
}

/// Like [`write_all`], but gives up once `deadline` passes with the pipe still full:
/// the error is then `TimedOut`, with the bytes written before it.
pub async fn write_all_until(
    fd: &OwnedFd,
    data: &[u8],
    deadline: std::time::Instant,
) -> (usize, io::Result<()>) {
    write_all_within(fd, data, Some(deadline)).await
}

async fn write_all_within(
    fd: &OwnedFd,
    data: &[u8],
    deadline: Option<std::time::Instant>,
) -> (usize, io::Result<()>) {
    let mut written = 0;
    let mut ready: Option<Readiness> = None;
    while written < data.len() {
        match rustix::io::write(fd, &data[written..]) {
            Ok(n) => written += n,
            Err(Errno::AGAIN) => {
                if ready.is_none() {
                    match Readiness::new(fd.as_fd()) {
                        Ok(r) => ready = Some(r),
                        Err(e) => return (written, Err(e)),
                    }
                }
                let Some(r) = &ready else { continue };
                let Some(deadline) = deadline else {
                    if let Err(e) = r.writable().await {
                        return (written, Err(e));
                    }
                    continue;
                };
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let timed_out = monoio::select! {
                    writable = r.writable() => match writable {
                        Ok(()) => false,
                        Err(e) => return (written, Err(e)),
                    },
                    _ = monoio::time::sleep(left) => true,
                };
                if timed_out {
                    return (written, Err(io::ErrorKind::TimedOut.into()));
                }
            }
            Err(Errno::INTR) => {}
            Err(e) => return (written, Err(e.into())),
        }
    }
    (written, Ok(()))
}

/// Turns bytes into text the way Python's `decode(errors="replace")` does, one piece at
/// a time: a multi-byte character split across two reads comes out whole, not as two
/// replacement characters.
#[derive(Default)]
pub struct Utf8Pieces {
    carry: Vec<u8>,
}

impl Utf8Pieces {
    /// The text of `bytes` after whatever was held back, holding back an incomplete
    /// character at the end.
    pub fn decode(&mut self, bytes: &[u8]) -> String {
        let joined;
        let input: &[u8] = if self.carry.is_empty() {
            bytes
        } else {
            self.carry.extend_from_slice(bytes);
            joined = std::mem::take(&mut self.carry);
            &joined
        };
        let keep = incomplete_tail(input);
        let (text, rest) = input.split_at(input.len() - keep);
        self.carry = rest.to_vec();
        String::from_utf8_lossy(text).into_owned()
    }

    /// Whatever is still held back (an incomplete character at end of file).
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.carry);
        String::from_utf8_lossy(&rest).into_owned()
    }
}

/// How many bytes at the end of `bytes` begin a UTF-8 character that needs more bytes.
fn incomplete_tail(bytes: &[u8]) -> usize {
    for back in 1..=3.min(bytes.len()) {
        let b = bytes[bytes.len() - back];
        if b & 0xC0 != 0x80 {
            let needed = match b {
                0xC2..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF4 => 4,
                _ => return 0,
            };
            return if needed > back { back } else { 0 };
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_characters_come_out_whole() {
        let text = "añb€c😀d";
        let bytes = text.as_bytes();
        for cut in 0..=bytes.len() {
            let mut pieces = Utf8Pieces::default();
            let mut out = pieces.decode(&bytes[..cut]);
            out += &pieces.decode(&bytes[cut..]);
            out += &pieces.finish();
            assert_eq!(out, text, "cut at {cut}");
        }
        for cut_a in 0..bytes.len() {
            for cut_b in cut_a..=bytes.len() {
                let mut pieces = Utf8Pieces::default();
                let mut out = pieces.decode(&bytes[..cut_a]);
                out += &pieces.decode(&bytes[cut_a..cut_b]);
                out += &pieces.decode(&bytes[cut_b..]);
                out += &pieces.finish();
                assert_eq!(out, text);
            }
        }
    }

    #[test]
    fn invalid_bytes_are_replaced_like_python() {
        let mut pieces = Utf8Pieces::default();
        assert_eq!(pieces.decode(b"a\xffb"), "a\u{fffd}b");
        // A lone lead byte at the end is held back, then replaced at end of file.
        assert_eq!(pieces.decode(b"x\xe2\x82"), "x");
        assert_eq!(pieces.finish(), "\u{fffd}");
        assert_eq!(pieces.decode(b"\xe2\x82y"), "\u{fffd}y");
    }
}
