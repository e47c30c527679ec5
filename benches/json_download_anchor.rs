//! The floor for a JSON file download in scripts/bench: the least a server can do to
//! answer `GET /files/download-stream?path=NAME` with `{"path": ..., "content_base64":
//! ..., "bytes": N}`, as `bare_spawn.c` is the floor for `/shell`.
//!
//! It does the work `/files/download-stream` cannot avoid and nothing else, on the same
//! I/O model: one monoio io_uring thread, keep-alive, the request line read up to the
//! blank line and `path=` taken from it (no other parsing, no percent-decoding, no
//! confinement, no policy), the file opened and read with io_uring, base64-encoded by
//! base64-simd into the outgoing buffer and written to the socket with io_uring. The
//! answer is byte for byte the server's (the path shown is `BASE/NAME`).
//!
//! `PIECE` raw bytes are read and encoded per write. scripts/bench builds this as the
//! binary `json-download-anchor` and runs `json-download-anchor PORT BASE [PIECE]`.

use std::rc::Rc;

use monoio::buf::IoBufMut;
use monoio::fs::File;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

const DEFAULT_PIECE: usize = 3 * 64 * 1024;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(port), Some(base)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: json-download-anchor PORT BASE [PIECE]");
        std::process::exit(2);
    };
    let port: u16 = port.parse().expect("PORT is a number");
    let piece = args
        .get(3)
        .map_or(DEFAULT_PIECE, |p| p.parse().expect("PIECE is a number"));
    // Whole base64 quanta per piece, so pieces encode without padding in between.
    let piece = (piece / 3).max(1) * 3;
    let base: Rc<str> = Rc::from(base.trim_end_matches('/'));
    let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .build()
        .expect("io_uring runtime (the anchor has no epoll fallback)");
    rt.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind");
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                continue;
            };
            let _ = conn.set_nodelay(true);
            monoio::spawn(serve(conn, base.clone(), piece));
        }
    });
}

async fn serve(mut conn: TcpStream, base: Rc<str>, piece: usize) {
    let mut inbox: Vec<u8> = Vec::with_capacity(8192);
    let mut out: Vec<u8> = Vec::with_capacity(piece / 3 * 4 + 4096);
    let mut spare: Vec<u8> = Vec::with_capacity(piece / 3 * 4 + 4096);
    let mut raw: Vec<u8> = Vec::with_capacity(piece);
    loop {
        let head_end = loop {
            if let Some(end) = memchr::memmem::find(&inbox, b"\r\n\r\n") {
                break end + 4;
            }
            if inbox.capacity() - inbox.len() < 1024 {
                inbox.reserve(8192);
            }
            let (filled, capacity) = (inbox.len(), inbox.capacity());
            let (read, back) = conn.read(inbox.slice_mut(filled..capacity)).await;
            inbox = back.into_inner();
            match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        };
        let name = requested_name(&inbox[..head_end]);
        inbox.drain(..head_end);
        let Some(name) = name else {
            // Anything without `path=` is the harness asking whether the anchor is up.
            let up = b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}";
            if conn.write_all(&up[..]).await.0.is_err() {
                return;
            }
            continue;
        };
        let path = format!("{base}/{name}");
        let Ok(file) = File::open(&path).await else {
            let missing = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
            if conn.write_all(&missing[..]).await.0.is_err() {
                return;
            }
            continue;
        };
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let mut prefix = Vec::with_capacity(path.len() + 40);
        prefix.extend_from_slice(b"{\"path\":");
        serde_json::to_writer(&mut prefix, &path).expect("a string serialises");
        prefix.extend_from_slice(b",\"content_base64\":\"");
        let suffix = format!("\",\"bytes\":{size}}}");
        let length = prefix.len() as u64 + size.div_ceil(3) * 4 + suffix.len() as u64;
        out.clear();
        out.extend_from_slice(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: {length}\r\n\r\n"
            )
            .as_bytes(),
        );
        out.extend_from_slice(&prefix);
        let mut pos = 0u64;
        let Some(filled) = fill(&file, &mut raw, &mut out, &mut pos, size, piece).await else {
            return;
        };
        out = filled;
        if pos == size {
            out.extend_from_slice(suffix.as_bytes());
        }
        // Each piece is written while the next is read and encoded.
        loop {
            if pos == size {
                let (written, back) = conn.write_all(out).await;
                out = back;
                if written.is_err() {
                    return;
                }
                break;
            }
            spare.clear();
            let ((written, sent), next) = monoio::join!(
                conn.write_all(out),
                fill(&file, &mut raw, &mut spare, &mut pos, size, piece)
            );
            if written.is_err() {
                return;
            }
            let Some(mut next) = next else { return };
            if pos == size {
                next.extend_from_slice(suffix.as_bytes());
            }
            spare = sent;
            out = next;
        }
        let _ = file.close().await;
    }
}

/// Reads the next piece at `pos` and appends its encoding to `out`; hands `out` back
/// (`None`: the read failed).
async fn fill(
    file: &File,
    raw: &mut Vec<u8>,
    out: &mut Vec<u8>,
    pos: &mut u64,
    size: u64,
    piece: usize,
) -> Option<Vec<u8>> {
    let want = (size - *pos).min(piece as u64) as usize;
    let mut taken = std::mem::take(out);
    if want > 0 {
        let mut buf = std::mem::take(raw);
        buf.clear();
        let (read, back) = file.read_exact_at(buf.slice_mut(0..want), *pos).await;
        *raw = back.into_inner();
        read.ok()?;
        let encoded = base64_simd::STANDARD.encoded_length(want);
        taken.reserve(encoded + 64);
        let start = taken.len();
        let _ = base64_simd::STANDARD.encode(
            &raw[..want],
            base64_simd::Out::from_uninit_slice(&mut taken.spare_capacity_mut()[..encoded]),
        );
        // SAFETY: the encoder initialised exactly `encoded` bytes after `start`.
        unsafe { taken.set_len(start + encoded) };
        *pos += want as u64;
    }
    Some(taken)
}

/// `NAME` of `GET /anything?path=NAME HTTP/1.1`.
fn requested_name(head: &[u8]) -> Option<String> {
    let line = head.split(|&b| b == b'\r').next()?;
    let target = line.split(|&b| b == b' ').nth(1)?;
    let query = target.splitn(2, |&b| b == b'?').nth(1)?;
    let value = query
        .split(|&b| b == b'&')
        .find_map(|pair| pair.strip_prefix(b"path="))?;
    String::from_utf8(value.to_vec()).ok()
}
