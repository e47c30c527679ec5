//! One server worker's connection to the Python worker: a call socket read and written
//! on the worker's own event loop (never a pool thread), carrying many calls at once.
//!
//! Each request is one JSON line with a fresh `id`; answers come back in any order and
//! are matched by it. A writer task sends queued lines in batches; a reader task splits
//! the incoming bytes into lines and completes the waiting calls. When the socket ends
//! (the Python worker died or was killed) every call still waiting fails with
//! [`BridgeError::Lost`], and the next call waits for the restarted worker's socket.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_channel::{mpsc, oneshot};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{Bridge, BridgeError};
use crate::process::pipe::{self, PipeReader};
use crate::process::Environment;

/// How long a call waits for a worker to come up (a restart, or the first start).
const WAIT_FOR_WORKER: Duration = Duration::from_secs(30);
/// Longest answer line accepted: a command's result is held whole, as Python holds it.
const MAX_LINE: usize = 256 * 1024 * 1024;

/// What the Python side answered to a call.
pub enum Answer {
    /// A complete JSON answer: `{"result": ...}`, a route's body, or an error envelope.
    Response { status: u16, body: Box<RawValue> },
    /// A streaming route's events, each a complete `event: ...\ndata: ...\n\n` chunk.
    Stream(EventStream),
}

/// One item of an event stream.
pub enum StreamItem {
    Event(String),
    /// The iterator raised: its message and exception type.
    Failed {
        message: String,
        kind: String,
    },
}

/// The events of one streaming call. Dropping it cancels the call on the Python side.
pub struct EventStream {
    link: Rc<Link>,
    id: u64,
    events: mpsc::UnboundedReceiver<Result<StreamItem, BridgeError>>,
}

impl EventStream {
    /// The next event, `None` when the iterator is exhausted. Each event taken lets the
    /// Python side produce one more (it runs at most a small window ahead).
    pub async fn next(&mut self) -> Option<Result<StreamItem, BridgeError>> {
        let item = std::future::poll_fn(|cx| {
            futures_core::Stream::poll_next(std::pin::Pin::new(&mut self.events), cx)
        })
        .await?;
        if let Ok(StreamItem::Event(_)) = &item {
            self.link.send_op(self.id, "ack");
        }
        Some(item)
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        if self.link.pending.borrow_mut().remove(&self.id).is_some() {
            self.link.send_op(self.id, "cancel");
        }
    }
}

/// Sends `request` (a JSON object; the link adds its `id`) and waits for the answer.
/// Variables set in `environment` since this link last passed them on travel with the
/// call, so the worker's `os.environ` (and what its commands spawn) sees them first.
/// They carry their version and the worker applies only a newer one: each server
/// worker's link is read by its own thread there, so an older set may arrive last.
pub async fn call<T: Serialize>(
    bridge: &Arc<Bridge>,
    environment: &Environment,
    request: &T,
) -> Result<Answer, BridgeError> {
    let body = serde_json::to_vec(request)
        .map_err(|e| BridgeError::Protocol(format!("cannot encode the call: {e}")))?;
    let link = link(bridge).await?;
    let env_changes = (link.env_version.get() != environment.version()).then(|| {
        let (version, changes) = environment.changes();
        link.env_version.set(version);
        let object: serde_json::Map<String, serde_json::Value> = changes
            .into_iter()
            .map(|(name, value)| (name, serde_json::Value::String(value)))
            .collect();
        (
            version,
            serde_json::to_vec(&object).unwrap_or_else(|_| b"{}".to_vec()),
        )
    });
    let id = link.next_id.get();
    link.next_id.set(id + 1);
    let (tx, rx) = oneshot::channel();
    link.pending.borrow_mut().insert(id, Waiter::Call(tx));
    let guard = Forget {
        link: &link,
        id,
        armed: true,
    };
    let mut line = Vec::with_capacity(body.len() + 24);
    line.extend_from_slice(b"{\"id\":");
    line.extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
    if let Some((version, env)) = env_changes {
        line.extend_from_slice(b",\"env_version\":");
        line.extend_from_slice(itoa::Buffer::new().format(version).as_bytes());
        line.extend_from_slice(b",\"env\":");
        line.extend_from_slice(&env);
    }
    if body.len() > 2 {
        line.push(b',');
    }
    line.extend_from_slice(&body[1..]);
    line.push(b'\n');
    link.send(line);
    let answer = rx
        .await
        .unwrap_or_else(|_| Err(BridgeError::Lost("the call was dropped".into())));
    let mut guard = guard;
    guard.armed = false;
    answer
}

/// Removes a call's waiter when the caller stops waiting (a client that went away).
struct Forget<'a> {
    link: &'a Rc<Link>,
    id: u64,
    armed: bool,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.link.pending.borrow_mut().remove(&self.id);
        }
    }
}

enum Waiter {
    Call(oneshot::Sender<Result<Answer, BridgeError>>),
    Stream(mpsc::UnboundedSender<Result<StreamItem, BridgeError>>),
}

/// The connection of this worker thread to one Python worker generation.
struct Link {
    bridge: Arc<Bridge>,
    generation: u64,
    outgoing: mpsc::UnboundedSender<Vec<u8>>,
    pending: RefCell<HashMap<u64, Waiter>>,
    next_id: Cell<u64>,
    closed: Cell<bool>,
    /// The environment version last passed on over this link.
    env_version: Cell<u64>,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<Link>>> = const { RefCell::new(None) };
}

/// This thread's link to the live worker, opening one (or waiting for a worker to come
/// up) when there is none.
async fn link(bridge: &Arc<Bridge>) -> Result<Rc<Link>, BridgeError> {
    let deadline = Instant::now() + WAIT_FOR_WORKER;
    loop {
        let seen = bridge.changed.version();
        let live = bridge.live_generation();
        if let Some(link) = CURRENT.with(|c| c.borrow().clone()) {
            if !link.closed.get() && Some(link.generation) == live {
                return Ok(link);
            }
            CURRENT.with(|c| c.borrow_mut().take());
        }
        if let Some((generation, fd)) = bridge.take_socket() {
            let link = Link::open(bridge.clone(), generation, fd).map_err(|e| {
                BridgeError::Unavailable(format!("cannot use the Python worker's socket: {e}"))
            })?;
            CURRENT.with(|c| *c.borrow_mut() = Some(link.clone()));
            return Ok(link);
        }
        if let Some(generation) = live {
            // Alive, but every socket is taken: this thread lost its own to a protocol
            // error. A fresh worker brings a full set.
            bridge.restart(generation, "a server worker has no call socket left");
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero()
            || monoio::time::timeout(remaining, bridge.changed.changed(seen))
                .await
                .is_err()
        {
            let last = bridge.last_exit();
            return Err(BridgeError::Unavailable(format!(
                "the Python worker is not running ({}); it is being restarted, try again",
                if last.is_empty() {
                    "it has not started"
                } else {
                    last.as_str()
                }
            )));
        }
    }
}

impl Link {
    fn open(bridge: Arc<Bridge>, generation: u64, fd: OwnedFd) -> std::io::Result<Rc<Link>> {
        let reader = PipeReader::new(fd.try_clone()?)?;
        let (outgoing, queue) = mpsc::unbounded();
        let link = Rc::new(Link {
            bridge,
            generation,
            outgoing,
            pending: RefCell::new(HashMap::new()),
            next_id: Cell::new(1),
            closed: Cell::new(false),
            env_version: Cell::new(0),
        });
        monoio::spawn(write_loop(link.clone(), fd, queue));
        monoio::spawn(read_loop(link.clone(), reader));
        Ok(link)
    }

    fn send(&self, line: Vec<u8>) {
        // A closed link already failed every waiter; the line has nowhere to go.
        let _ = self.outgoing.unbounded_send(line);
    }

    fn send_op(&self, id: u64, op: &str) {
        if !self.closed.get() {
            self.send(format!("{{\"id\":{id},\"op\":\"{op}\"}}\n").into_bytes());
        }
    }

    /// Fails every waiting call with `error` and retires the link.
    fn close(&self, error: BridgeError) {
        if self.closed.replace(true) {
            return;
        }
        self.outgoing.close_channel();
        let waiters: Vec<Waiter> = self.pending.borrow_mut().drain().map(|(_, w)| w).collect();
        for waiter in waiters {
            match waiter {
                Waiter::Call(tx) => {
                    let _ = tx.send(Err(error.clone()));
                }
                Waiter::Stream(tx) => {
                    let _ = tx.unbounded_send(Err(error.clone()));
                }
            }
        }
    }

    /// Hands one answer line to its waiter. A line without a readable `id` breaks the
    /// protocol (`Err`: the worker is restarted); a line whose other fields do not
    /// parse fails only its own call.
    fn deliver(self: &Rc<Self>, line: &[u8]) -> Result<(), String> {
        #[derive(Deserialize)]
        struct IdOnly {
            id: u64,
        }
        let id = serde_json::from_slice::<IdOnly>(line)
            .map_err(|e| format!("an answer without an id ({e})"))?
            .id;
        let mut pending = self.pending.borrow_mut();
        let Some(waiter) = pending.remove(&id) else {
            // The caller went away; its late answer is dropped, and a stream that is
            // still producing is told to stop.
            if line.windows(8).any(|w| w == b"\"event\":") {
                drop(pending);
                self.send_op(id, "cancel");
            }
            return Ok(());
        };
        let incoming: Incoming<'_> = match serde_json::from_slice(line) {
            Ok(incoming) => incoming,
            Err(e) => {
                let error = BridgeError::Protocol(format!(
                    "the Python worker's answer could not be read ({e})"
                ));
                match waiter {
                    Waiter::Call(tx) => {
                        let _ = tx.send(Err(error));
                    }
                    Waiter::Stream(tx) => {
                        let _ = tx.unbounded_send(Err(error));
                        drop(pending);
                        self.send_op(id, "cancel");
                    }
                }
                return Ok(());
            }
        };
        match waiter {
            Waiter::Call(tx) => {
                if let (Some(status), Some(body)) = (incoming.status, incoming.body) {
                    let _ = tx.send(Ok(Answer::Response {
                        status,
                        body: body.to_owned(),
                    }));
                    return Ok(());
                }
                // The first message of an event stream.
                let (events_tx, events_rx) = mpsc::unbounded();
                let stream = EventStream {
                    link: self.clone(),
                    id,
                    events: events_rx,
                };
                let ended = match push_stream_item(&events_tx, incoming) {
                    Ok(ended) => ended,
                    Err(why) => {
                        let _ = tx.send(Err(BridgeError::Protocol(why)));
                        return Ok(());
                    }
                };
                if !ended {
                    pending.insert(id, Waiter::Stream(events_tx));
                }
                drop(pending);
                if let Err(Ok(Answer::Stream(stream))) = tx.send(Ok(Answer::Stream(stream))) {
                    // The caller left before the stream began: cancel it.
                    drop(stream);
                }
            }
            Waiter::Stream(tx) => match push_stream_item(&tx, incoming) {
                Ok(false) => {
                    pending.insert(id, Waiter::Stream(tx));
                }
                Ok(true) => {}
                Err(why) => {
                    let _ = tx.unbounded_send(Err(BridgeError::Protocol(why)));
                    drop(pending);
                    self.send_op(id, "cancel");
                }
            },
        }
        Ok(())
    }
}

/// Queues one stream message; true when the stream ended with it.
fn push_stream_item(
    tx: &mpsc::UnboundedSender<Result<StreamItem, BridgeError>>,
    incoming: Incoming<'_>,
) -> Result<bool, String> {
    if let Some(event) = incoming.event {
        let _ = tx.unbounded_send(Ok(StreamItem::Event(event)));
        return Ok(false);
    }
    if incoming.end == Some(true) {
        if let Some(error) = incoming.error {
            let _ = tx.unbounded_send(Ok(StreamItem::Failed {
                message: error.message,
                kind: error.kind,
            }));
        }
        return Ok(true);
    }
    Err("a stream message with neither event nor end".into())
}

/// An answer line from the Python worker.
#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(default)]
    status: Option<u16>,
    #[serde(borrow, default)]
    body: Option<&'a RawValue>,
    #[serde(default)]
    event: Option<String>,
    #[serde(default)]
    end: Option<bool>,
    #[serde(default)]
    error: Option<StreamError>,
}

#[derive(Deserialize)]
struct StreamError {
    message: String,
    #[serde(rename = "type")]
    kind: String,
}

async fn write_loop(link: Rc<Link>, fd: OwnedFd, mut queue: mpsc::UnboundedReceiver<Vec<u8>>) {
    loop {
        let next = std::future::poll_fn(|cx| {
            futures_core::Stream::poll_next(std::pin::Pin::new(&mut queue), cx)
        })
        .await;
        let Some(mut batch) = next else { return };
        // Everything queued meanwhile goes in the same write.
        while let Ok(more) = queue.try_recv() {
            batch.extend_from_slice(&more);
        }
        let (_, written) = pipe::write_all(&fd, &batch).await;
        if let Err(e) = written {
            link.close(BridgeError::Lost(format!(
                "writing to the Python worker failed: {e}"
            )));
            return;
        }
    }
}

async fn read_loop(link: Rc<Link>, mut reader: PipeReader) {
    let mut buffer: Vec<u8> = Vec::new();
    let error = loop {
        let seen = link.bridge.changed.version();
        if link.bridge.live_generation() != Some(link.generation) {
            // Retired (hung and killed, or shutting down) even if the socket lingers.
            break lost(&link, None).await;
        }
        let read = monoio::select! {
            read = reader.read() => Some(read.map(|piece| piece.map(<[u8]>::to_vec))),
            _ = link.bridge.changed.changed(seen) => None,
        };
        let piece = match read {
            None => continue,
            Some(Ok(Some(piece))) => piece,
            Some(Ok(None)) => break lost(&link, None).await,
            // A reset is how a killed worker's socket usually ends.
            Some(Err(e)) => break lost(&link, Some(e)).await,
        };
        let scanned = buffer.len();
        buffer.extend_from_slice(&piece);
        let mut start = 0;
        let mut from = scanned;
        let mut broken = None;
        while let Some(offset) = memchr(&buffer[from..]) {
            let end = from + offset;
            if let Err(why) = link.deliver(&buffer[start..end]) {
                broken = Some(why);
                break;
            }
            start = end + 1;
            from = start;
        }
        if let Some(why) = broken {
            link.bridge.restart(link.generation, &why);
            break BridgeError::Protocol(format!("the Python worker sent {why}"));
        }
        buffer.drain(..start);
        if buffer.len() > MAX_LINE {
            link.bridge
                .restart(link.generation, "an answer line over 256 MiB");
            break BridgeError::Protocol("the Python worker sent an answer over 256 MiB".into());
        }
    };
    link.close(error);
    CURRENT.with(|c| {
        let mut current = c.borrow_mut();
        if current.as_ref().is_some_and(|l| Rc::ptr_eq(l, &link)) {
            current.take();
        }
    });
}

/// The error for calls in flight when the worker's socket ended: waits briefly for the
/// supervisor to say why (hung and killed, crashed with a status).
async fn lost(link: &Link, error: Option<std::io::Error>) -> BridgeError {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        // Read the version before the state, so a retire in between still wakes us.
        let seen = link.bridge.changed.version();
        if link.bridge.live_generation() != Some(link.generation) {
            break;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero()
            || monoio::time::timeout(remaining, link.bridge.changed.changed(seen))
                .await
                .is_err()
        {
            break;
        }
    }
    let why = link.bridge.last_exit();
    BridgeError::Lost(match (why.is_empty(), error) {
        (false, _) => why,
        (true, Some(e)) => format!("reading from the Python worker failed: {e}"),
        (true, None) => "the Python worker closed its socket".into(),
    })
}

fn memchr(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|b| *b == b'\n')
}
