//! Captured output of a background process: numbered events in a bounded log, and a
//! notifier that wakes long-polls on any worker thread when something changes.
//!
//! Sequence numbers are never reused, so a caller's cursor (`since`) stays meaningful
//! after old events are discarded: everything at or after the cursor that is still held
//! comes back, in order, and `dropped` is true exactly when some event at or after the
//! cursor was discarded before the caller read it.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

/// Which pipe an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// One read from one pipe, as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputEvent {
    pub seq: u64,
    pub stream: Stream,
    pub data: String,
}

/// The capture buffer: at most `cap` bytes of event text; the oldest events go first.
pub struct OutputLog {
    events: VecDeque<OutputEvent>,
    next_seq: u64,
    bytes: usize,
    cap: usize,
    /// Bytes each event counts beyond its text, so a writer of many tiny pieces cannot
    /// hold far more memory than the cap says (0: the text alone, as `/process`'s
    /// contract counts it).
    event_overhead: usize,
    /// The last event whose head was cut to fit the cap on its own: a reader from at
    /// or before it has lost text too.
    last_cut: Option<u64>,
}

/// What a caller reads from a cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputPage {
    pub events: Vec<OutputEvent>,
    /// The cursor for the next read.
    pub next: u64,
    /// Events at or after the requested cursor were discarded unread, or one of them lost
    /// its head to the cap.
    pub dropped: bool,
}

impl OutputLog {
    pub fn new(cap: usize) -> OutputLog {
        OutputLog {
            events: VecDeque::new(),
            next_seq: 0,
            bytes: 0,
            cap,
            event_overhead: 0,
            last_cut: None,
        }
    }

    /// A log whose cap also counts `overhead` bytes per event.
    pub fn with_event_overhead(cap: usize, overhead: usize) -> OutputLog {
        OutputLog {
            event_overhead: overhead,
            ..OutputLog::new(cap)
        }
    }

    /// Appends one event, discarding the oldest until the text fits in the cap. An
    /// event larger than the cap on its own keeps only its last `cap` bytes.
    pub fn push(&mut self, stream: Stream, mut data: String) {
        if data.is_empty() {
            return;
        }
        if data.len() > self.cap {
            let mut cut = data.len() - self.cap;
            while !data.is_char_boundary(cut) {
                cut += 1;
            }
            data.drain(..cut);
            self.last_cut = Some(self.next_seq);
        }
        let cost = data.len() + self.event_overhead;
        while self.bytes + cost > self.cap {
            match self.events.pop_front() {
                Some(old) => self.bytes -= old.data.len() + self.event_overhead,
                None => break,
            }
        }
        self.bytes += cost;
        self.events.push_back(OutputEvent {
            seq: self.next_seq,
            stream,
            data,
        });
        self.next_seq += 1;
    }

    /// What the events at or after `since` count against the cap (all that is held
    /// when `since` is older than the oldest kept).
    pub fn held_from(&self, since: u64) -> usize {
        let first_held = self.events.front().map_or(self.next_seq, |e| e.seq);
        let skip = since.saturating_sub(first_held) as usize;
        self.events
            .iter()
            .skip(skip)
            .map(|e| e.data.len() + self.event_overhead)
            .sum()
    }

    /// The most the log holds (texts and per-event overhead).
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The sequence number the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Everything held at or after `since`. A cursor past the end reads as the end.
    pub fn read(&self, since: u64) -> OutputPage {
        self.read_at_most(since, usize::MAX)
    }

    /// Like [`OutputLog::read`], but stops once `max_bytes` of text are taken (always
    /// taking at least one event), so a slow reader copies one piece at a time.
    pub fn read_at_most(&self, since: u64, max_bytes: usize) -> OutputPage {
        let since = since.min(self.next_seq);
        let first_held = self.events.front().map_or(self.next_seq, |e| e.seq);
        let skip = since.saturating_sub(first_held) as usize;
        let mut taken = 0;
        let events: Vec<OutputEvent> = self
            .events
            .iter()
            .skip(skip)
            .take_while(|e| {
                let fits = taken == 0 || taken + e.data.len() <= max_bytes;
                taken += e.data.len();
                fits
            })
            .cloned()
            .collect();
        OutputPage {
            next: events.last().map_or(self.next_seq, |e| e.seq + 1),
            events,
            dropped: since < first_held || self.last_cut.is_some_and(|cut| since <= cut),
        }
    }
}

/// A change counter with wakers, safe to signal from any thread.
#[derive(Default)]
pub struct Notify {
    state: Mutex<NotifyState>,
}

#[derive(Default)]
struct NotifyState {
    version: u64,
    /// Waiting futures by id; a future removes its own entry when dropped, so waits
    /// that end by timeout (a long-poll on a quiet process) leave nothing behind.
    wakers: Vec<(u64, Waker)>,
    next_id: u64,
}

impl Notify {
    fn lock(&self) -> std::sync::MutexGuard<'_, NotifyState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current version; pass it to [`Notify::changed`] before checking the state,
    /// so a change between the check and the wait is not missed.
    pub fn version(&self) -> u64 {
        self.lock().version
    }

    /// Wakes everyone waiting.
    pub fn notify(&self) {
        let wakers = {
            let mut state = self.lock();
            state.version += 1;
            std::mem::take(&mut state.wakers)
        };
        for (_, waker) in wakers {
            waker.wake();
        }
    }

    /// Resolves once the version differs from `seen`.
    pub fn changed(&self, seen: u64) -> Changed<'_> {
        Changed {
            notify: self,
            seen,
            id: None,
        }
    }

    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().wakers.len()
    }
}

/// The future of [`Notify::changed`].
pub struct Changed<'a> {
    notify: &'a Notify,
    seen: u64,
    id: Option<u64>,
}

impl Future for Changed<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.notify.lock();
        if state.version != self.seen {
            return Poll::Ready(());
        }
        let id = match self.id {
            Some(id) => id,
            None => {
                state.next_id += 1;
                state.next_id
            }
        };
        match state.wakers.iter_mut().find(|(i, _)| *i == id) {
            Some((_, waker)) => waker.clone_from(cx.waker()),
            None => state.wakers.push((id, cx.waker().clone())),
        }
        drop(state);
        self.id = Some(id);
        Poll::Pending
    }
}

impl Drop for Changed<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.notify.lock().wakers.retain(|(i, _)| *i != id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datas(page: &OutputPage) -> Vec<&str> {
        page.events.iter().map(|e| e.data.as_str()).collect()
    }

    #[test]
    fn cursor_reads_and_discards_are_exact() {
        let mut log = OutputLog::new(10);
        log.push(Stream::Stdout, "aaaa".into());
        log.push(Stream::Stderr, "bbbb".into());
        let page = log.read(0);
        assert_eq!(
            (datas(&page), page.next, page.dropped),
            (vec!["aaaa", "bbbb"], 2, false)
        );
        log.push(Stream::Stdout, "cccc".into()); // evicts "aaaa"
        let late = log.read(0);
        assert_eq!(
            (datas(&late), late.next, late.dropped),
            (vec!["bbbb", "cccc"], 3, true)
        );
        // A caller who had read up to 1 lost nothing.
        let current = log.read(1);
        assert_eq!(
            (datas(&current), current.dropped),
            (vec!["bbbb", "cccc"], false)
        );
        let beyond = log.read(99);
        assert_eq!(
            (beyond.events.len(), beyond.next, beyond.dropped),
            (0, 3, false)
        );
        log.push(Stream::Stdout, String::new());
        assert_eq!(log.next_seq(), 3, "empty reads are not events");
    }

    #[test]
    fn bounded_reads_and_per_event_overhead() {
        let mut log = OutputLog::new(100);
        for piece in ["aaaa", "bbbb", "cccc"] {
            log.push(Stream::Stdout, piece.into());
        }
        let page = log.read_at_most(0, 8);
        let texts: Vec<&str> = page.events.iter().map(|e| e.data.as_str()).collect();
        assert_eq!((texts, page.next), (vec!["aaaa", "bbbb"], 2));
        let page = log.read_at_most(page.next, 1);
        assert_eq!((page.events.len(), page.next), (1, 3), "one event at least");
        assert_eq!(log.read_at_most(3, 8).next, 3, "at the end");

        // With 10 bytes of overhead per event, a cap of 30 holds two 5-byte events.
        let mut log = OutputLog::with_event_overhead(30, 10);
        for piece in ["11111", "22222", "33333"] {
            log.push(Stream::Stdout, piece.into());
        }
        let page = log.read(0);
        let texts: Vec<&str> = page.events.iter().map(|e| e.data.as_str()).collect();
        assert_eq!((texts, page.dropped), (vec!["22222", "33333"], true));
    }

    /// One piece larger than the cap keeps its tail, and a reader from before it is
    /// told text was lost (a policy's small max_output_bytes meets this at once).
    #[test]
    fn a_piece_cut_to_the_cap_counts_as_dropped() {
        let mut log = OutputLog::new(4);
        log.push(Stream::Stdout, "ab".into());
        assert!(!log.read(0).dropped);
        log.push(Stream::Stdout, "123456".into());
        let page = log.read(0);
        let texts: Vec<&str> = page.events.iter().map(|e| e.data.as_str()).collect();
        assert_eq!((texts, page.dropped), (vec!["3456"], true));
        assert!(log.read(1).dropped, "the cut piece itself lost its head");
        log.push(Stream::Stdout, "x".into());
        assert!(!log.read(2).dropped, "a reader after it lost nothing");
    }

    #[test]
    fn abandoned_waits_leave_no_wakers() {
        let notify = Notify::default();
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..100 {
            let mut wait = std::pin::pin!(notify.changed(notify.version()));
            assert!(wait.as_mut().poll(&mut cx).is_pending());
            assert!(wait.as_mut().poll(&mut cx).is_pending());
            assert_eq!(notify.waiting(), 1);
        }
        assert_eq!(notify.waiting(), 0);
        let seen = notify.version();
        let mut wait = std::pin::pin!(notify.changed(seen));
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        notify.notify();
        assert!(wait.as_mut().poll(&mut cx).is_ready());
    }

    #[test]
    fn an_oversized_event_keeps_its_tail_on_a_char_boundary() {
        let mut log = OutputLog::new(4);
        log.push(Stream::Stdout, "a€cd".into());
        assert_eq!(datas(&log.read(0)), vec!["cd"]);
    }
}
