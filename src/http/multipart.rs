//! A sans-IO reader of one `multipart/form-data` body (RFC 7578) as it arrives: it
//! yields each part's headers once they are complete and the part's content in pieces,
//! so a file part of any size passes through in constant memory. Only what an upload
//! needs is read from a part's headers: the `name` and `filename` of its
//! `Content-Disposition`.

/// Bytes a part's header block may take: far above what any client sends, low enough
/// that a body that never ends its headers is refused early.
const MAX_HEADER_BYTES: usize = 16 * 1024;

/// What the scanner found in the bytes fed so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// A part begins; its content follows in `Data` events.
    Part {
        name: Option<String>,
        filename: Option<String>,
    },
    /// Content of the current part.
    Data(Vec<u8>),
    /// The current part's content is complete.
    PartEnd,
}

/// Why a body is not a multipart body.
#[derive(Debug, PartialEq, Eq)]
pub struct MultipartError(pub String);

enum State {
    /// Before the first delimiter (the preamble is ignored).
    Preamble,
    Headers,
    Content,
    /// After the closing delimiter (the epilogue is ignored).
    Done,
}

pub struct Scanner {
    /// `\r\n--boundary`: what ends a part's content.
    delimiter: Vec<u8>,
    held: Vec<u8>,
    state: State,
}

/// The `boundary` parameter of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';');
    let kind = params.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|p| {
        let (name, value) = p.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let value = value.trim().trim_matches('"');
        // RFC 2046: 1 to 70 characters.
        (!value.is_empty() && value.len() <= 70).then(|| value.to_string())
    })
}

impl Scanner {
    pub fn new(boundary: &str) -> Scanner {
        let mut delimiter = b"\r\n--".to_vec();
        delimiter.extend_from_slice(boundary.as_bytes());
        // The preamble is matched as if preceded by a line end, so a body that starts
        // with the delimiter (they all do) needs no special case.
        Scanner {
            delimiter,
            held: b"\r\n".to_vec(),
            state: State::Preamble,
        }
    }

    /// Whether the closing delimiter has been read.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Takes the next bytes of the body and returns what they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Event>, MultipartError> {
        if self.is_done() {
            return Ok(Vec::new());
        }
        self.held.extend_from_slice(bytes);
        let mut events = Vec::new();
        loop {
            match self.state {
                State::Done => {
                    self.held.clear();
                    return Ok(events);
                }
                State::Preamble => match find(&self.held, &self.delimiter) {
                    Some(at) => {
                        self.held.drain(..at + self.delimiter.len());
                        if !self.after_delimiter()? {
                            return Ok(events);
                        }
                    }
                    None => {
                        let keep = self.delimiter.len().min(self.held.len());
                        self.held.drain(..self.held.len() - keep);
                        return Ok(events);
                    }
                },
                State::Headers => match find(&self.held, b"\r\n\r\n") {
                    Some(at) => {
                        let block = String::from_utf8_lossy(&self.held[..at]).into_owned();
                        self.held.drain(..at + 4);
                        let (name, filename) = disposition(&block);
                        events.push(Event::Part { name, filename });
                        self.state = State::Content;
                    }
                    None if self.held.len() > MAX_HEADER_BYTES => {
                        return Err(MultipartError(format!(
                            "a part's headers exceed {MAX_HEADER_BYTES} bytes"
                        )))
                    }
                    None => return Ok(events),
                },
                State::Content => match find(&self.held, &self.delimiter) {
                    Some(at) => {
                        if at > 0 {
                            events.push(Event::Data(self.held[..at].to_vec()));
                        }
                        self.held.drain(..at + self.delimiter.len());
                        events.push(Event::PartEnd);
                        self.state = State::Preamble;
                        if !self.after_delimiter()? {
                            // The two bytes after the delimiter have not arrived yet.
                            return Ok(events);
                        }
                    }
                    None => {
                        // All but a possible start of the delimiter is content.
                        let keep = (self.delimiter.len() - 1).min(self.held.len());
                        let cut = self.held.len() - keep;
                        if cut > 0 {
                            let rest = self.held.split_off(cut);
                            events.push(Event::Data(std::mem::replace(&mut self.held, rest)));
                        }
                        return Ok(events);
                    }
                },
            }
        }
    }

    /// After a delimiter: `--` closes the body, a line end starts a part's headers.
    /// `Ok(false)` when those bytes are still to come (the delimiter is put back).
    fn after_delimiter(&mut self) -> Result<bool, MultipartError> {
        if self.held.len() < 2 {
            let mut back = self.delimiter.clone();
            back.append(&mut self.held);
            self.held = back;
            self.state = State::Preamble;
            return Ok(false);
        }
        if self.held.starts_with(b"--") {
            self.state = State::Done;
            return Ok(true);
        }
        // Transport padding (RFC 2046) may sit between the boundary and its line end.
        let line_end = find(&self.held, b"\r\n");
        match line_end {
            Some(at) if self.held[..at].iter().all(|b| *b == b' ' || *b == b'\t') => {
                self.held.drain(..at + 2);
                self.state = State::Headers;
                Ok(true)
            }
            Some(_) => Err(MultipartError(
                "a boundary delimiter is followed by something other than a line end".into(),
            )),
            None if self.held.len() > 256 => Err(MultipartError(
                "a boundary delimiter is followed by something other than a line end".into(),
            )),
            None => {
                let mut back = self.delimiter.clone();
                back.append(&mut self.held);
                self.held = back;
                self.state = State::Preamble;
                Ok(false)
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

/// The `name` and `filename` parameters of a part's `Content-Disposition` header.
/// `filename*` (RFC 5987) wins over `filename` when both are given, as RFC 6266 asks.
fn disposition(block: &str) -> (Option<String>, Option<String>) {
    let Some(value) = block.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-disposition")
            .then(|| value.trim())
    }) else {
        return (None, None);
    };
    let (mut name, mut filename, mut extended) = (None, None, None);
    for (key, raw) in parameters(value) {
        match key.to_ascii_lowercase().as_str() {
            "name" => name = Some(raw),
            "filename" => filename = Some(raw),
            "filename*" => {
                extended = raw
                    .split_once("''")
                    .map(|(_, encoded)| percent_decode(encoded))
            }
            _ => {}
        }
    }
    (name, extended.or(filename))
}

/// `key=value` and `key="quoted value"` parameters after the disposition type. A
/// quoted value keeps what is between the quotes, with `\x` read as `x`.
fn parameters(value: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let bytes = value.as_bytes();
    let mut i = match value.find(';') {
        Some(at) => at + 1,
        None => return out,
    };
    while i < bytes.len() {
        while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b';' || bytes[i] == b'\t') {
            i += 1;
        }
        let key_start = i;
        while i < bytes.len() && bytes[i] != b'=' && bytes[i] != b';' {
            i += 1;
        }
        let key = value[key_start..i].trim().to_string();
        if i >= bytes.len() || bytes[i] == b';' {
            continue;
        }
        i += 1;
        let mut text = Vec::new();
        if i < bytes.len() && bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                if bytes[i] == b'\\' && i + 1 < bytes.len() {
                    i += 1;
                }
                text.push(bytes[i]);
                i += 1;
            }
            i += 1;
        } else {
            while i < bytes.len() && bytes[i] != b';' {
                text.push(bytes[i]);
                i += 1;
            }
            while text.last().is_some_and(|b| *b == b' ' || *b == b'\t') {
                text.pop();
            }
        }
        out.push((key, String::from_utf8_lossy(&text).into_owned()));
    }
    out
}

fn percent_decode(input: &str) -> String {
    percent_encoding::percent_decode_str(input)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(boundary: &str, filename: &str, content: &[u8]) -> Vec<u8> {
        let filename = filename.replace('"', "\\\"");
        let mut out = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        out.extend_from_slice(content);
        out.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        out
    }

    fn scan(bytes: &[u8], piece: usize) -> Result<(Vec<Event>, bool), MultipartError> {
        let mut scanner = Scanner::new("b0undary");
        let mut events = Vec::new();
        for chunk in bytes.chunks(piece) {
            events.extend(scanner.feed(chunk)?);
        }
        // Adjacent data pieces are one stream of content.
        let mut merged: Vec<Event> = Vec::new();
        for event in events {
            match (merged.last_mut(), event) {
                (Some(Event::Data(held)), Event::Data(more)) => held.extend(more),
                (_, event) => merged.push(event),
            }
        }
        Ok((merged, scanner.is_done()))
    }

    #[test]
    fn a_file_part_arrives_whole_whatever_the_piece_size() {
        let content: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let mut tricky = content.clone();
        // A near-delimiter inside the content is content.
        tricky.extend_from_slice(b"\r\n--b0undar");
        let bytes = body("b0undary", "dir/a \"b\".bin", &tricky);
        for piece in [1, 2, 3, 7, 64, 4096, bytes.len()] {
            let (events, done) = scan(&bytes, piece).unwrap();
            assert!(done, "piece {piece}");
            assert_eq!(
                events,
                vec![
                    Event::Part {
                        name: Some("file".into()),
                        filename: Some("dir/a \"b\".bin".into())
                    },
                    Event::Data(tricky.clone()),
                    Event::PartEnd
                ],
                "piece {piece}"
            );
        }
    }

    #[test]
    fn an_empty_part_and_an_unfinished_body() {
        let bytes = body("b0undary", "empty.txt", b"");
        let (events, done) = scan(&bytes, 5).unwrap();
        assert!(done);
        assert_eq!(events.len(), 2);
        let (_, done) = scan(&bytes[..bytes.len() - 8], 5).unwrap();
        assert!(!done);
    }

    #[test]
    fn boundaries_are_read_from_the_content_type() {
        assert_eq!(
            boundary("multipart/form-data; boundary=abc").as_deref(),
            Some("abc")
        );
        assert_eq!(
            boundary("Multipart/Form-Data; charset=x; boundary=\"a b\"").as_deref(),
            Some("a b")
        );
        assert_eq!(boundary("application/json; boundary=abc"), None);
        assert_eq!(boundary("multipart/form-data"), None);
    }

    #[test]
    fn endless_headers_are_refused() {
        let mut bytes = b"--b0undary\r\nX: ".to_vec();
        bytes.extend(std::iter::repeat_n(b'a', MAX_HEADER_BYTES + 10));
        assert!(scan(&bytes, 1024).is_err());
    }
}
