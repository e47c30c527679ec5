//! WebSocket connections after the engine has handed a socket over (an upgrade):
//! the opening handshake's answer, and the framing, by tungstenite, run sans-IO.
//!
//! tungstenite speaks over any `Read + Write`; here that is a pair of in-memory
//! buffers. Bytes arrive from the socket into `incoming` (a read that finds it empty
//! says `WouldBlock`, and tungstenite keeps its partial frame), and whatever tungstenite
//! writes lands in `outgoing`, which [`WebSocket::flush`] sends with the runtime's own
//! writes. Waiting for the client is a readiness wait plus a non-blocking `recv`, so a
//! connection can wait for the client and for something else at once and drop either
//! wait without losing bytes.

use std::cell::Cell;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use monoio::io::AsyncWriteRentExt;
use monoio::net::TcpStream;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tungstenite::Message;

use super::head::RequestHead;

/// Largest message a client may send (keystrokes and control messages are small).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// The most tungstenite takes from `incoming` per read (see [`WebSocket::new`]).
const READ_BUFFER_BYTES: usize = 4096;
/// The most one `recv` from the socket asks for.
const RECV_PIECE: usize = 16 * 1024;

/// The `101 Switching Protocols` answer to a valid opening handshake, or why the
/// request is not one (answered 400 by the caller).
pub fn accept(head: &RequestHead) -> Result<Vec<u8>, &'static str> {
    let has_token = |name: &str, token: &str| {
        head.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| v.split(','))
            .any(|v| v.trim().eq_ignore_ascii_case(token))
    };
    if head.method != "GET" {
        return Err("a WebSocket handshake is a GET");
    }
    if !has_token("upgrade", "websocket") || !has_token("connection", "upgrade") {
        return Err(
            "this port speaks WebSocket only: send Upgrade: websocket and Connection: Upgrade",
        );
    }
    if head.header("sec-websocket-version").map(str::trim) != Some("13") {
        return Err("unsupported WebSocket version: send Sec-WebSocket-Version: 13");
    }
    let key = head
        .header("sec-websocket-key")
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .ok_or("the handshake has no Sec-WebSocket-Key")?;
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    Ok(format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    )
    .into_bytes())
}

/// tungstenite's view of the socket: two buffers.
#[derive(Default)]
struct Buffers {
    incoming: VecDeque<u8>,
    outgoing: Vec<u8>,
}

impl Read for Buffers {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.incoming.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.incoming.read(buf)?;
        Ok(n)
    }
}

impl Write for Buffers {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.outgoing.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What waiting for the client produced.
pub enum Received {
    Text(String),
    Binary(Vec<u8>),
    /// The client closed (or the connection ended).
    Closed,
}

/// A server-side WebSocket over a handed-over socket.
pub struct WebSocket {
    stream: TcpStream,
    socket: tungstenite::WebSocket<Buffers>,
    /// How long one write may wait for a client that does not read.
    write_timeout: std::time::Duration,
    /// The last `recv` found the kernel empty and the socket has not been seen readable
    /// since: [`WebSocket::try_receive`] then answers from what it holds without asking
    /// the kernel again (a keystroke's turn asked it up to four times, three in vain).
    drained: Cell<bool>,
}

impl WebSocket {
    /// Wraps `stream` after the 101 was sent; `leftover` are bytes the client sent
    /// after its handshake, already read by the engine.
    pub fn new(
        stream: TcpStream,
        leftover: Vec<u8>,
        write_timeout: std::time::Duration,
    ) -> WebSocket {
        let mut config = WebSocketConfig::default();
        config.max_message_size = Some(MAX_MESSAGE_BYTES);
        config.max_frame_size = Some(MAX_MESSAGE_BYTES);
        // tungstenite zero-fills up to this much of its read buffer on every read
        // attempt: at the default 128 KiB that memset was 12 % of a keystroke's time.
        // Its reads come from `incoming` in memory, so small ones cost nothing more.
        config.read_buffer_size = READ_BUFFER_BYTES;
        let buffers = Buffers {
            incoming: leftover.into(),
            outgoing: Vec::new(),
        };
        WebSocket {
            stream,
            socket: tungstenite::WebSocket::from_raw_socket(buffers, Role::Server, Some(config)),
            write_timeout,
            drained: Cell::new(false),
        }
    }

    /// The next message the client has already sent, without waiting: `Ok(None)` when
    /// nothing complete is there yet. Pings are answered (on the next flush). After an
    /// `Ok(None)` the kernel is asked again only once [`WebSocket::readable`] resolved
    /// or the caller said the socket is readable ([`WebSocket::readable_again`]).
    pub fn try_receive(&mut self) -> io::Result<Option<Received>> {
        loop {
            match self.socket.read() {
                Ok(Message::Text(text)) => return Ok(Some(Received::Text(text.to_string()))),
                Ok(Message::Binary(data)) => return Ok(Some(Received::Binary(data.to_vec()))),
                Ok(Message::Close(_)) => return Ok(Some(Received::Closed)),
                Ok(_) => {}
                Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.drained.get() {
                        return Ok(None);
                    }
                    // Take what the kernel holds, without waiting (into memory that is
                    // not zero-filled first: only what arrives is read back).
                    let mut piece = [std::mem::MaybeUninit::<u8>::uninit(); RECV_PIECE];
                    match rustix::net::recv(
                        socket_fd(&self.stream),
                        &mut piece,
                        rustix::net::RecvFlags::DONTWAIT,
                    ) {
                        Ok((([], _), _)) => return Ok(Some(Received::Closed)),
                        Ok(((arrived, _), _)) => {
                            // Less than asked for: the kernel had no more. The next ask
                            // waits for readiness, which answers at once if more came.
                            self.drained.set(arrived.len() < RECV_PIECE);
                            self.socket.get_mut().incoming.extend(&*arrived);
                        }
                        Err(rustix::io::Errno::AGAIN) => {
                            self.drained.set(true);
                            return Ok(None);
                        }
                        Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                    return Ok(Some(Received::Closed))
                }
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            }
        }
    }

    /// Resolves when the client has sent something (or hung up). Dropping it loses
    /// nothing.
    pub async fn readable(&self) -> io::Result<()> {
        if !self.socket.get_ref().incoming.is_empty() {
            return Ok(());
        }
        let ready = self.stream.readable(false).await;
        // An error too is for the next `recv` to report.
        self.readable_again();
        ready
    }

    /// Says the socket became readable, for a caller that waits on it by its own means
    /// (through [`AsFd`]) so its wait can outlive a turn: the next
    /// [`WebSocket::try_receive`] asks the kernel again.
    pub fn readable_again(&self) {
        self.drained.set(false);
    }

    /// Queues a text message and sends everything queued.
    pub async fn send_text(&mut self, text: String) -> io::Result<()> {
        self.socket
            .write(Message::text(text))
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.flush().await
    }

    /// Sends a close frame with `code` and `reason` (cut to the 123 bytes a control
    /// frame has room for), then stops.
    pub async fn close(&mut self, code: u16, reason: &str) -> io::Result<()> {
        let mut end = reason.len().min(123);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let frame = CloseFrame {
            code: CloseCode::from(code),
            reason: reason[..end].to_string().into(),
        };
        let _ = self.socket.close(Some(frame));
        self.flush().await
    }

    /// Sends what tungstenite has queued (a pong, a close echo) as far as the socket's
    /// buffer takes it now, keeping the rest for the next [`WebSocket::flush`]. For a
    /// caller that waits for the client between messages (or beside a turn that may
    /// cancel it): nothing here awaits, so nothing is cut half-sent, and a ping is
    /// answered while nothing else is being said. A client's keep-alive (the OpenAI
    /// SDK's `websockets` pings every 20 s and gives up 20 s later) needs that.
    pub fn send_queued(&mut self) -> io::Result<()> {
        let _ = self.socket.flush();
        let outgoing = &mut self.socket.get_mut().outgoing;
        let mut sent = 0;
        while sent < outgoing.len() {
            let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
            match rustix::net::send(socket_fd(&self.stream), &outgoing[sent..], flags) {
                Ok(n) => sent += n,
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    outgoing.clear();
                    return Err(e.into());
                }
            }
        }
        outgoing.drain(..sent);
        Ok(())
    }

    /// Sends whatever tungstenite has queued (answers to pings, a close echo).
    pub async fn flush(&mut self) -> io::Result<()> {
        // A message usually fits in the socket's send buffer: one non-blocking `send`,
        // where the ring's write would cost a submission, a completion, a wake-up of
        // this task and a timer. The ring takes only what the buffer had no room for.
        self.send_queued()?;
        let outgoing = &mut self.socket.get_mut().outgoing;
        if outgoing.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(outgoing);
        // A client that stops reading for this long is gone: its connection (and what
        // it holds, such as a deleted session) is let go.
        let (written, buffer) =
            match monoio::time::timeout(self.write_timeout, self.stream.write_all(pending)).await {
                Ok(done) => done,
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client did not read for the whole write timeout",
                    ))
                }
            };
        // Keep the allocation for the next message.
        let mut buffer = buffer;
        buffer.clear();
        self.socket.get_mut().outgoing = buffer;
        written.map(drop)
    }
}

impl AsFd for WebSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        socket_fd(&self.stream)
    }
}

/// The socket's descriptor for a non-blocking `recv` beside the runtime's own I/O.
fn socket_fd(stream: &TcpStream) -> BorrowedFd<'_> {
    // SAFETY: the descriptor belongs to `stream`, which outlives the borrow.
    unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) }
}
