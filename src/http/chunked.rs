//! Sans-IO decoder for HTTP/1.1 chunked request bodies (RFC 9112 §7.1).
//!
//! The decoder owns no buffer: the caller keeps the bytes it has read, hands them to
//! [`ChunkedDecoder::decode`], drops the consumed prefix and appends more when asked. That
//! keeps the connection's read buffer the single place bytes live, so pipelined requests
//! after the body stay where the next request parser expects them.

use std::ops::Range;

/// Longest chunk-size line, extensions included and CRLF excluded. The size itself needs at
/// most 16 digits; the rest only leaves room for extensions, which are ignored.
const MAX_SIZE_LINE: usize = 1024;

/// Largest trailer section, terminating empty line included. Trailers are discarded, so
/// this only bounds how long a client can keep the connection busy with them.
const MAX_TRAILERS: usize = 64 * 1024;

/// Why a chunked body is refused (each maps to a 400 by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkedError {
    /// The chunk-size line is not hex digits optionally followed by extensions, or the size
    /// has more than 16 digits.
    BadSize,
    /// The chunk-size line runs past 1024 bytes without ending.
    SizeLineTooLong,
    /// A chunk announces more bytes than the decoder's `max_chunk_size`.
    ChunkTooLarge,
    /// Chunk data or a trailer line is not followed by CRLF.
    MissingCrlf,
    /// The trailer section runs past 64 KiB.
    TrailersTooLarge,
    /// A line in the framing ends in LF without CR.
    BareLf,
}

impl ChunkedError {
    /// Text for the 400 response body.
    pub fn message(self) -> &'static str {
        match self {
            ChunkedError::BadSize => "Malformed chunked body: bad chunk size",
            ChunkedError::SizeLineTooLong => "Malformed chunked body: chunk-size line too long",
            ChunkedError::ChunkTooLarge => "Malformed chunked body: chunk too large",
            ChunkedError::MissingCrlf => "Malformed chunked body: missing CRLF",
            ChunkedError::TrailersTooLarge => "Malformed chunked body: trailers too large",
            ChunkedError::BareLf => "Malformed chunked body: bare LF",
        }
    }
}

impl std::fmt::Display for ChunkedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for ChunkedError {}

/// What one call to `decode` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// Bytes of `input` used (framing and data).
    pub consumed: usize,
    /// Body data inside `input[..consumed]`, as a range of `input`; empty (`0..0`) when this
    /// call only consumed framing.
    pub data: Range<usize>,
    /// The last chunk and the trailer section are consumed: the body is complete.
    pub done: bool,
}

/// Where the decoder is inside a trailer section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TrailerAt {
    /// At the start of a line: CR here begins the terminating empty line.
    LineStart,
    /// Inside a trailer field line.
    Field,
    /// After the CR that ends a trailer field line.
    FieldCr,
    /// After the CR of the terminating empty line.
    EndCr,
}

/// The decoder's position in the chunked framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting a chunk-size line.
    Size,
    /// Inside chunk data; `left` is never zero.
    Data { left: u64 },
    /// Expecting the CR after chunk data.
    DataCr,
    /// Expecting the LF after chunk data.
    DataLf,
    /// Skipping trailers; `used` counts trailer bytes consumed so far.
    Trailers { used: usize, at: TrailerAt },
    /// The body is complete.
    Done,
    /// A framing error was found; the decoder keeps reporting it.
    Failed(ChunkedError),
}

/// Incremental state machine for one chunked body.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    max_chunk_size: u64,
}

impl ChunkedDecoder {
    /// `max_chunk_size`: a chunk-size above it is refused at once (ChunkTooLarge), so a
    /// client cannot announce a huge chunk.
    pub fn new(max_chunk_size: u64) -> Self {
        ChunkedDecoder {
            state: State::Size,
            max_chunk_size,
        }
    }

    /// Consumes as much of `input` as it can and returns at most one contiguous data span.
    /// `consumed == 0 && !done` means more input is needed (the caller reads more and calls
    /// again with the unconsumed bytes plus the new ones). Never returns data beyond
    /// `max_data` bytes in one call (lets the caller bound each piece).
    ///
    /// A chunk-size line is only consumed whole, so the caller's buffer must be able to hold
    /// 1026 bytes (the longest accepted line and its CRLF). `max_data` must be positive while
    /// data remains, otherwise no progress is possible. Consumption stops at the end of the
    /// message: bytes after it are never part of `consumed`. Once an error is returned, every
    /// later call returns it again.
    pub fn decode(&mut self, input: &[u8], max_data: usize) -> Result<Decoded, ChunkedError> {
        let mut pos = 0;
        let mut data = 0..0;
        loop {
            let rest = input.get(pos..).unwrap_or_default();
            match self.state {
                State::Failed(e) => return Err(e),
                State::Done => break,
                State::Size => match self.size_line(rest) {
                    Ok(Some((len, size))) => {
                        pos += len;
                        self.state = if size == 0 {
                            State::Trailers {
                                used: 0,
                                at: TrailerAt::LineStart,
                            }
                        } else {
                            State::Data { left: size }
                        };
                    }
                    Ok(None) => break,
                    Err(e) => return Err(self.fail(e)),
                },
                State::Data { left } => {
                    // One span per call: the next chunk's data waits for the next call.
                    if !data.is_empty() {
                        break;
                    }
                    let left_here = usize::try_from(left).unwrap_or(usize::MAX);
                    let take = left_here.min(rest.len()).min(max_data);
                    if take == 0 {
                        break;
                    }
                    data = pos..pos + take;
                    pos += take;
                    // `take <= left`, so this cannot underflow.
                    let left = left - take as u64;
                    if left == 0 {
                        self.state = State::DataCr;
                    } else {
                        self.state = State::Data { left };
                        break;
                    }
                }
                State::DataCr => match rest.first() {
                    None => break,
                    Some(b'\r') => {
                        pos += 1;
                        self.state = State::DataLf;
                    }
                    Some(b'\n') => return Err(self.fail(ChunkedError::BareLf)),
                    Some(_) => return Err(self.fail(ChunkedError::MissingCrlf)),
                },
                State::DataLf => match rest.first() {
                    None => break,
                    Some(b'\n') => {
                        pos += 1;
                        self.state = State::Size;
                    }
                    Some(_) => return Err(self.fail(ChunkedError::MissingCrlf)),
                },
                State::Trailers { used, at } => match Self::trailers(rest, used, at) {
                    Ok((len, next)) => {
                        pos += len;
                        self.state = next;
                        if !matches!(next, State::Done) {
                            break;
                        }
                    }
                    Err(e) => return Err(self.fail(e)),
                },
            }
        }
        Ok(Decoded {
            consumed: pos,
            data,
            done: self.is_done(),
        })
    }

    /// Whether the last chunk and the trailer section have been consumed.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Records `e` so later calls report it too, and hands it back.
    fn fail(&mut self, e: ChunkedError) -> ChunkedError {
        self.state = State::Failed(e);
        e
    }

    /// Parses a whole chunk-size line at the start of `rest`: `Some((line length with CRLF,
    /// size))`, or `None` while the line is incomplete.
    fn size_line(&self, rest: &[u8]) -> Result<Option<(usize, u64)>, ChunkedError> {
        // The line may hold 1024 bytes plus CRLF; looking one byte further would only ever
        // find a line that is too long anyway.
        let window = &rest[..rest.len().min(MAX_SIZE_LINE + 2)];
        let Some(lf) = window.iter().position(|&b| b == b'\n') else {
            return if window.len() >= MAX_SIZE_LINE + 2 {
                Err(ChunkedError::SizeLineTooLong)
            } else {
                Ok(None)
            };
        };
        // httparse lets LF through inside extensions, so bare LF is caught here first.
        if lf == 0 || window[lf - 1] != b'\r' {
            return Err(ChunkedError::BareLf);
        }
        // httparse reads an empty size (a line starting with ';' or CRLF) as 0, which would
        // end the body early, so at least one digit is required up front.
        if !window[0].is_ascii_hexdigit() {
            return Err(ChunkedError::BadSize);
        }
        let line = &window[..=lf];
        match httparse::parse_chunk_size(line) {
            Ok(httparse::Status::Complete((len, size))) if len == line.len() => {
                if size > self.max_chunk_size {
                    Err(ChunkedError::ChunkTooLarge)
                } else {
                    Ok(Some((len, size)))
                }
            }
            // httparse stops at the first CRLF, which is this line's end, so anything else
            // means the line is not what it claims to be.
            _ => Err(ChunkedError::BadSize),
        }
    }

    /// Skips trailer bytes at the start of `rest`: how many were consumed and the state
    /// after them. Stops right after the terminating empty line so pipelined bytes stay.
    fn trailers(
        rest: &[u8],
        mut used: usize,
        mut at: TrailerAt,
    ) -> Result<(usize, State), ChunkedError> {
        for (i, &b) in rest.iter().enumerate() {
            used += 1;
            if used > MAX_TRAILERS {
                return Err(ChunkedError::TrailersTooLarge);
            }
            at = match (at, b) {
                (TrailerAt::LineStart, b'\r') => TrailerAt::EndCr,
                (TrailerAt::LineStart | TrailerAt::Field, b'\n') => {
                    return Err(ChunkedError::BareLf)
                }
                (TrailerAt::Field, b'\r') => TrailerAt::FieldCr,
                (TrailerAt::LineStart | TrailerAt::Field, _) => TrailerAt::Field,
                (TrailerAt::FieldCr, b'\n') => TrailerAt::LineStart,
                (TrailerAt::EndCr, b'\n') => return Ok((i + 1, State::Done)),
                // A CR not followed by LF: RFC 9112 §2.2 lets a recipient reject it.
                (TrailerAt::FieldCr | TrailerAt::EndCr, _) => {
                    return Err(ChunkedError::MissingCrlf)
                }
            };
        }
        Ok((rest.len(), State::Trailers { used, at }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body exercising extensions, several chunk sizes and trailers.
    const BODY: &[u8] = b"5;name=value\r\nhello\r\n\
        1A ; a=\"quoted;x\"\r\nabcdefghijklmnopqrstuvwxyz\r\n\
        1\r\n!\r\n\
        0;last\r\nX-Trailer: one\r\nX-Other: two\r\n\r\n";
    const BODY_DATA: &[u8] = b"helloabcdefghijklmnopqrstuvwxyz!";

    /// What a caller sees after feeding a body.
    #[derive(Debug, PartialEq, Eq)]
    struct Outcome {
        data: Vec<u8>,
        consumed: usize,
        calls_with_data: usize,
    }

    /// Acts like a connection: keeps the unconsumed bytes, appends the next piece (sizes from
    /// `pieces`, cycled) whenever the decoder asks for more, and stops when done.
    fn feed(
        input: &[u8],
        pieces: &[usize],
        max_data: usize,
        max_chunk: u64,
    ) -> Result<Outcome, ChunkedError> {
        let mut dec = ChunkedDecoder::new(max_chunk);
        let mut buf: Vec<u8> = Vec::new();
        let mut fed = 0;
        let mut next_piece = pieces.iter().cycle();
        let mut out = Outcome {
            data: Vec::new(),
            consumed: 0,
            calls_with_data: 0,
        };
        loop {
            let d = dec.decode(&buf, max_data)?;
            assert!(d.consumed <= buf.len());
            assert!(d.data.end <= d.consumed);
            assert!(d.data.len() <= max_data);
            assert_eq!(d.done, dec.is_done());
            if !d.data.is_empty() {
                out.calls_with_data += 1;
            }
            out.data.extend_from_slice(&buf[d.data.clone()]);
            buf.drain(..d.consumed);
            out.consumed += d.consumed;
            if d.done {
                return Ok(out);
            }
            if d.consumed == 0 {
                assert!(fed < input.len(), "decoder wants more than the whole input");
                let n = next_piece.next().copied().unwrap_or(1).max(1);
                let end = (fed + n).min(input.len());
                buf.extend_from_slice(&input[fed..end]);
                fed = end;
            }
        }
    }

    /// Decodes `input` given all at once with a generous limit.
    fn whole(input: &[u8]) -> Result<Outcome, ChunkedError> {
        feed(input, &[input.len()], usize::MAX, 1 << 20)
    }

    /// Feeds `input` split at every single point; every split must give the same error.
    fn error_at_every_split(input: &[u8], max_chunk: u64) -> ChunkedError {
        let expected = feed(input, &[input.len()], usize::MAX, max_chunk).unwrap_err();
        for split in 1..input.len() {
            let got = feed(input, &[split, input.len()], usize::MAX, max_chunk);
            assert_eq!(got, Err(expected), "split at {split}");
        }
        assert_eq!(feed(input, &[1], 3, max_chunk), Err(expected));
        expected
    }

    #[test]
    fn single_chunk() {
        let out = whole(b"5\r\nhello\r\n0\r\n\r\n").unwrap();
        assert_eq!(out.data, b"hello");
        assert_eq!(out.consumed, 15);
    }

    #[test]
    fn one_call_consumes_framing_data_and_end() {
        let mut dec = ChunkedDecoder::new(100);
        let input = b"5\r\nhello\r\n0\r\n\r\n";
        let d = dec.decode(input, 100).unwrap();
        assert_eq!(
            d,
            Decoded {
                consumed: input.len(),
                data: 3..8,
                done: true
            }
        );
        // Further calls are harmless and consume nothing.
        assert_eq!(
            dec.decode(b"more", 100).unwrap(),
            Decoded {
                consumed: 0,
                data: 0..0,
                done: true
            }
        );
    }

    #[test]
    fn many_chunks() {
        let mut input = Vec::new();
        let mut expected = Vec::new();
        for i in 1..200usize {
            let chunk: Vec<u8> = (0..i).map(|j| (i * 7 + j) as u8).collect();
            input.extend_from_slice(format!("{i:x}\r\n").as_bytes());
            input.extend_from_slice(&chunk);
            input.extend_from_slice(b"\r\n");
            expected.extend_from_slice(&chunk);
        }
        input.extend_from_slice(b"0\r\n\r\n");
        let out = whole(&input).unwrap();
        assert_eq!(out.data, expected);
        assert_eq!(out.consumed, input.len());
        // At most one span per call, so one call per chunk when all input is present.
        assert_eq!(out.calls_with_data, 199);
    }

    #[test]
    fn extensions_and_trailers() {
        let out = whole(BODY).unwrap();
        assert_eq!(out.data, BODY_DATA);
        assert_eq!(out.consumed, BODY.len());
    }

    #[test]
    fn every_split_point() {
        for split in 0..=BODY.len() {
            let out = feed(BODY, &[split, BODY.len()], usize::MAX, 1 << 20).unwrap();
            assert_eq!(out.data, BODY_DATA, "split at {split}");
            assert_eq!(out.consumed, BODY.len());
        }
    }

    #[test]
    fn every_pair_of_split_points() {
        for a in 1..BODY.len() {
            for b in 1..BODY.len() - a {
                let out = feed(BODY, &[a, b, BODY.len()], 7, 1 << 20).unwrap();
                assert_eq!(out.data, BODY_DATA, "splits {a}, {b}");
                assert_eq!(out.consumed, BODY.len());
            }
        }
    }

    #[test]
    fn byte_by_byte() {
        for max_data in [1, 2, 5, usize::MAX] {
            let out = feed(BODY, &[1], max_data, 1 << 20).unwrap();
            assert_eq!(out.data, BODY_DATA);
            assert_eq!(out.consumed, BODY.len());
        }
    }

    #[test]
    fn random_splits() {
        // xorshift: deterministic, so a failure reproduces.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..500 {
            let pieces: Vec<usize> = (0..8).map(|_| (next() % 20) as usize + 1).collect();
            let max_data = (next() % 12) as usize + 1;
            let out = feed(BODY, &pieces, max_data, 1 << 20).unwrap();
            assert_eq!(
                out.data, BODY_DATA,
                "pieces {pieces:?}, max_data {max_data}"
            );
            assert_eq!(out.consumed, BODY.len());
        }
    }

    #[test]
    fn max_data_bounds_each_span() {
        let mut dec = ChunkedDecoder::new(100);
        let input = b"a\r\n0123456789\r\n0\r\n\r\n";
        let d = dec.decode(input, 4).unwrap();
        assert_eq!((d.consumed, d.data.clone(), d.done), (7, 3..7, false));
        let rest = &input[d.consumed..];
        let d = dec.decode(rest, 4).unwrap();
        assert_eq!((&rest[d.data.clone()], d.done), (&b"4567"[..], false));
        let rest = &rest[d.consumed..];
        let d = dec.decode(rest, 4).unwrap();
        assert_eq!((&rest[d.data.clone()], d.done), (&b"89"[..], true));
        assert_eq!(d.consumed, rest.len());

        let out = feed(BODY, &[BODY.len()], 3, 1 << 20).unwrap();
        assert_eq!(out.data, BODY_DATA);
        // Spans of 5, 26 and 1 bytes split into pieces of at most 3.
        assert_eq!(out.calls_with_data, 2 + 9 + 1);
    }

    #[test]
    fn zero_chunk_alone() {
        let mut dec = ChunkedDecoder::new(0);
        let d = dec.decode(b"0\r\n\r\n", 10).unwrap();
        assert_eq!(
            d,
            Decoded {
                consumed: 5,
                data: 0..0,
                done: true
            }
        );
        assert!(dec.is_done());
    }

    #[test]
    fn needs_more_input() {
        let mut dec = ChunkedDecoder::new(100);
        for partial in [&b""[..], b"5", b"5;ext", b"5\r"] {
            let d = dec.decode(partial, 10).unwrap();
            assert_eq!((d.consumed, d.done), (0, false), "{partial:?}");
        }
        // A size line with no data yet is consumed alone.
        let d = dec.decode(b"5\r\n", 10).unwrap();
        assert_eq!((d.consumed, d.data, d.done), (3, 0..0, false));
        // Half a CRLF after the data is consumed and remembered.
        let d = dec.decode(b"hello\r", 10).unwrap();
        assert_eq!((d.consumed, d.data, d.done), (6, 0..5, false));
        let d = dec.decode(b"\n0\r\nX: y\r", 10).unwrap();
        assert_eq!((d.consumed, d.data, d.done), (9, 0..0, false));
        let d = dec.decode(b"\n\r", 10).unwrap();
        assert_eq!((d.consumed, d.done), (2, false));
        let d = dec.decode(b"\nNEXT", 10).unwrap();
        assert_eq!((d.consumed, d.done), (1, true));
    }

    #[test]
    fn pipelined_bytes_are_not_consumed() {
        let next = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut input = BODY.to_vec();
        input.extend_from_slice(next);
        let out = whole(&input).unwrap();
        assert_eq!(out.consumed, BODY.len());
        for split in 1..input.len() {
            let out = feed(&input, &[split, input.len()], usize::MAX, 1 << 20).unwrap();
            assert_eq!(out.consumed, BODY.len(), "split at {split}");
            assert_eq!(out.data, BODY_DATA);
        }
        let mut dec = ChunkedDecoder::new(10);
        let d = dec.decode(b"0\r\n\r\n0\r\n\r\n", 10).unwrap();
        assert_eq!((d.consumed, d.done), (5, true));
    }

    #[test]
    fn bad_sizes() {
        for input in [
            &b"\r\n"[..],
            b";ext\r\n",
            b" 5\r\n",
            b"\t\r\n",
            b"g\r\n",
            b"0x5\r\n",
            b"-1\r\n",
            b"+5\r\n",
            b"5 5\r\n",
            b"5\rx\r\n",
        ] {
            assert_eq!(
                whole(input).unwrap_err(),
                ChunkedError::BadSize,
                "{input:?}"
            );
        }
        assert_eq!(error_at_every_split(b"5 x\r\n", 100), ChunkedError::BadSize);
    }

    #[test]
    fn size_digit_limits() {
        // 17 digits is refused even when the value would fit.
        let input = b"00000000000000001\r\nx\r\n0\r\n\r\n";
        assert_eq!(error_at_every_split(input, u64::MAX), ChunkedError::BadSize);
        // 16 digits is accepted.
        let input = b"0000000000000001\r\nx\r\n0\r\n\r\n";
        assert_eq!(whole(input).unwrap().data, b"x");
        // The largest 16-digit value is a valid size, just refused by the limit.
        let input = b"ffffffffffffffff\r\n";
        assert_eq!(whole(input).unwrap_err(), ChunkedError::ChunkTooLarge);
        let mut dec = ChunkedDecoder::new(u64::MAX);
        let d = dec.decode(b"FFFFFFFFFFFFFFFF\r\nabc", 10).unwrap();
        assert_eq!((d.consumed, d.data, d.done), (21, 18..21, false));
    }

    #[test]
    fn chunk_size_limit() {
        let mut input = b"400\r\n".to_vec();
        input.extend_from_slice(&[b'x'; 0x400]);
        input.extend_from_slice(b"\r\n0\r\n\r\n");
        let out = feed(&input, &[input.len()], usize::MAX, 0x400).unwrap();
        assert_eq!(out.data.len(), 0x400);
        assert_eq!(
            error_at_every_split(&input, 0x3ff),
            ChunkedError::ChunkTooLarge
        );
        // Refused at once, before any data arrives.
        let mut dec = ChunkedDecoder::new(0x3ff);
        assert_eq!(dec.decode(b"400\r\n", 10), Err(ChunkedError::ChunkTooLarge));
    }

    #[test]
    fn size_line_length_limit() {
        let mut at_limit = b"5;".to_vec();
        at_limit.resize(1024, b'a');
        at_limit.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
        let out = feed(&at_limit, &[1000, 10, 10, 10], usize::MAX, 100).unwrap();
        assert_eq!(out.data, b"hello");

        let mut over = b"5;".to_vec();
        over.resize(1025, b'a');
        over.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
        assert_eq!(
            error_at_every_split(&over, 100),
            ChunkedError::SizeLineTooLong
        );

        // Refused without waiting for a line end that may never come.
        let mut dec = ChunkedDecoder::new(100);
        let mut endless = b"5;".to_vec();
        endless.resize(1025, b'a');
        assert_eq!(dec.decode(&endless, 10).unwrap().consumed, 0);
        endless.push(b'a');
        assert_eq!(dec.decode(&endless, 10), Err(ChunkedError::SizeLineTooLong));
    }

    #[test]
    fn missing_crlf_after_data() {
        for input in [
            &b"5\r\nhelloX\r\n0\r\n\r\n"[..],
            b"5\r\nhello\rX0\r\n\r\n",
            b"5\r\nhello\r\r\n0\r\n\r\n",
            b"5\r\nhello0\r\n\r\n",
            b"5\r\nhello!\r\n0\r\n\r\n",
        ] {
            assert_eq!(
                error_at_every_split(input, 100),
                ChunkedError::MissingCrlf,
                "{input:?}"
            );
        }
    }

    #[test]
    fn bare_cr_in_trailers() {
        for input in [&b"0\r\nX: y\rz\r\n\r\n"[..], b"0\r\nX: y\r\n\rz"] {
            assert_eq!(error_at_every_split(input, 100), ChunkedError::MissingCrlf);
        }
    }

    #[test]
    fn bare_lf_everywhere() {
        for input in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"\n",
            b"5;ext\nhello\r\n0\r\n\r\n",
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhello\r\n0\n\r\n",
            b"0\r\nX: y\n\r\n",
            b"0\r\nX: y\r\n\n",
            b"0\r\n\n",
        ] {
            assert_eq!(
                error_at_every_split(input, 100),
                ChunkedError::BareLf,
                "{input:?}"
            );
        }
    }

    #[test]
    fn trailer_limit() {
        // A trailer section of exactly 64 KiB, final empty line included, is accepted.
        let mut input = b"0\r\nX: ".to_vec();
        input.resize(3 + MAX_TRAILERS - 4, b'a');
        input.extend_from_slice(b"\r\n\r\n");
        let out = feed(&input, &[4096], 10, 100).unwrap();
        assert_eq!(out.consumed, input.len());

        let mut over = b"0\r\nX: ".to_vec();
        over.resize(3 + MAX_TRAILERS - 3, b'a');
        over.extend_from_slice(b"\r\n\r\n");
        assert_eq!(
            feed(&over, &[over.len()], 10, 100),
            Err(ChunkedError::TrailersTooLarge)
        );
        assert_eq!(
            feed(&over, &[1000], 10, 100),
            Err(ChunkedError::TrailersTooLarge)
        );

        // Many short lines count the same as one long one.
        let mut lines = b"0\r\n".to_vec();
        while lines.len() < MAX_TRAILERS + 10 {
            lines.extend_from_slice(b"A: b\r\n");
        }
        lines.extend_from_slice(b"\r\n");
        assert_eq!(whole(&lines), Err(ChunkedError::TrailersTooLarge));
    }

    #[test]
    fn errors_are_sticky() {
        let mut dec = ChunkedDecoder::new(100);
        assert_eq!(dec.decode(b"zz\r\n", 10), Err(ChunkedError::BadSize));
        assert_eq!(dec.decode(b"0\r\n\r\n", 10), Err(ChunkedError::BadSize));
        assert!(!dec.is_done());
    }

    #[test]
    fn zero_max_data_consumes_only_framing() {
        let mut dec = ChunkedDecoder::new(100);
        let d = dec.decode(b"5\r\nhello\r\n0\r\n\r\n", 0).unwrap();
        assert_eq!((d.consumed, d.data, d.done), (3, 0..0, false));
    }

    #[test]
    fn messages_name_the_problem() {
        for e in [
            ChunkedError::BadSize,
            ChunkedError::SizeLineTooLong,
            ChunkedError::ChunkTooLarge,
            ChunkedError::MissingCrlf,
            ChunkedError::TrailersTooLarge,
            ChunkedError::BareLf,
        ] {
            assert!(e.message().starts_with("Malformed chunked body: "));
            assert_eq!(e.to_string(), e.message());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x: u64 = 12345;
        let alphabet = b"0123456789abcdefAF;= \t\r\nxX:";
        for _ in 0..2000 {
            let mut input = Vec::new();
            for _ in 0..40 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                input.push(alphabet[(x % alphabet.len() as u64) as usize]);
            }
            let mut dec = ChunkedDecoder::new(16);
            let mut pos = 0;
            while let Ok(d) = dec.decode(&input[pos..], 3) {
                if d.consumed == 0 {
                    break;
                }
                pos += d.consumed;
            }
        }
    }

    #[test]
    fn trailers_well_past_a_kibibyte_are_accepted() {
        let mut body = b"3\r\nabc\r\n0\r\n".to_vec();
        for i in 0..60 {
            body.extend_from_slice(format!("X-Trailer-{i}: {}\r\n", "v".repeat(40)).as_bytes());
        }
        body.extend_from_slice(b"\r\n");
        assert!(body.len() > 2048);
        let mut decoder = ChunkedDecoder::new(1 << 20);
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let step = decoder
                .decode(&body[at..], usize::MAX)
                .expect("trailers under the cap");
            out.extend_from_slice(&body[at + step.data.start..at + step.data.end]);
            at += step.consumed;
            if step.done {
                break;
            }
            assert!(step.consumed > 0, "no progress");
        }
        assert_eq!((out.as_slice(), at), (&b"abc"[..], body.len()));
    }
}
