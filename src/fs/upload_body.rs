//! The upload body `{"path": ..., "content_base64": "..."}` read as it arrives, so a
//! 10 MiB upload never sits in memory whole (sans-IO: bytes in, decoded bytes out).
//!
//! The scanner splits the body in two. The value of the top-level `content_base64`
//! string is decoded piece by piece into the caller's buffer (base64 needs no JSON
//! unescaping, so the string's end is found with a SIMD search for `"` or `\`, and the
//! decoder itself rejects any byte outside the alphabet: no separate UTF-8 or escape
//! pass). Everything else, the *skeleton*, is kept with that value emptied to `""`, and
//! is small: the caller parses it whole afterwards with the same JSON parser and the same
//! errors as any other body, which is what makes the split safe. A body the scanner
//! misreads is not valid JSON, and the skeleton's parse refuses it; a valid body always
//! scans right, because the scanner tracks strings, escapes and nesting exactly.
//!
//! What the whole-body path accepted is still accepted: JSON escapes inside the value
//! (`\/` from encoders that escape the solidus, `\n` from line-wrapped base64), and
//! whitespace between base64 characters. A key spelled with escapes
//! (`"content\u005fbase64"`) is not recognised here; its value then stays in the skeleton
//! and the caller decodes it the old way.

/// Why a body was refused while it streamed.
#[derive(Debug, PartialEq, Eq)]
pub enum UploadBodyError {
    /// Not JSON (a control character inside the string, a bad escape).
    Json(&'static str),
    /// `content_base64` is not standard base64.
    Base64,
    /// More decoded bytes than the limit.
    TooLarge,
}

/// Where the scanner is in the top-level object's `content_base64` member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Member {
    /// Not at it.
    Elsewhere,
    /// Just read the key; a `:` should follow.
    AfterKey,
    /// Read the `:`; the value follows.
    AfterColon,
    /// Inside the value: bytes are base64.
    InValue,
    /// The value was streamed; a second one (a duplicate key) stays in the skeleton.
    Done,
}

/// The member whose value streams (the upload endpoints declare it as a body field).
pub const KEY: &[u8] = b"content_base64";

/// Streams one upload body. Feed it every piece in order, then [`UploadScanner::finish`].
pub struct UploadScanner {
    limit: u64,
    skeleton: Vec<u8>,
    depth: u32,
    in_string: bool,
    escaped: bool,
    expect_key: bool,
    /// The top-level value opened with `{` (members are only recognised in an object).
    object: bool,
    seen_first: bool,
    /// A depth-1 key being read, and whether it can still be `content_base64`.
    key_len: usize,
    key_matches: bool,
    collecting_key: bool,
    member: Member,
    /// A JSON escape inside the value, split across pieces: `\` and up to 5 more bytes.
    escape: [u8; 6],
    escape_len: usize,
    /// Base64 characters of an incomplete quad.
    quad: [u8; 4],
    quad_len: usize,
    /// A quad ended with `=`: only whitespace may follow in the value.
    padded: bool,
    decoded: u64,
}

impl UploadScanner {
    /// A scanner refusing more than `limit` decoded bytes.
    pub fn new(limit: u64) -> Self {
        UploadScanner {
            limit,
            skeleton: Vec::new(),
            depth: 0,
            in_string: false,
            escaped: false,
            expect_key: false,
            object: false,
            seen_first: false,
            key_len: 0,
            key_matches: false,
            collecting_key: false,
            member: Member::Elsewhere,
            escape: [0; 6],
            escape_len: 0,
            quad: [0; 4],
            quad_len: 0,
            padded: false,
            decoded: 0,
        }
    }

    /// Takes the next piece of the body; appends the bytes it decodes to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), UploadBodyError> {
        while !input.is_empty() {
            if self.member == Member::InValue {
                let used = self.feed_value(input, out)?;
                input = &input[used..];
            } else {
                let used = self.feed_skeleton(input);
                input = &input[used..];
            }
        }
        if self.decoded > self.limit {
            return Err(UploadBodyError::TooLarge);
        }
        Ok(())
    }

    /// The body ended: the skeleton to parse, and whether the value was streamed (then
    /// the skeleton holds `""` in its place).
    pub fn finish(self) -> Result<(Vec<u8>, bool), UploadBodyError> {
        // A value that never closed leaves the skeleton open too: its parse names the
        // JSON error.
        Ok((self.skeleton, self.member == Member::Done))
    }

    /// Reads JSON outside the value; returns the bytes used (up to and including the
    /// value's opening quote, which switches to the value).
    fn feed_skeleton(&mut self, input: &[u8]) -> usize {
        for (i, &b) in input.iter().enumerate() {
            self.skeleton.push(b);
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                    self.key_matches = false;
                } else if b == b'\\' {
                    self.escaped = true;
                    self.key_matches = false;
                } else if b == b'"' {
                    self.in_string = false;
                    if self.collecting_key {
                        self.collecting_key = false;
                        let first = self.member != Member::Done;
                        if first && self.key_matches && self.key_len == KEY.len() {
                            self.member = Member::AfterKey;
                        }
                    }
                } else if self.collecting_key {
                    self.key_matches &= KEY.get(self.key_len) == Some(&b);
                    self.key_len += 1;
                }
                continue;
            }
            if !self.seen_first && !b.is_ascii_whitespace() {
                self.seen_first = true;
                self.object = b == b'{';
            }
            match b {
                b'"' => {
                    if self.member == Member::AfterColon && self.depth == 1 {
                        self.member = Member::InValue;
                        return i + 1;
                    }
                    self.in_string = true;
                    self.collecting_key = self.object && self.depth == 1 && self.expect_key;
                    self.key_len = 0;
                    self.key_matches = true;
                }
                b'{' | b'[' => {
                    self.depth += 1;
                    if self.depth == 1 {
                        self.expect_key = b == b'{';
                    }
                    self.not_at_value();
                }
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    self.not_at_value();
                }
                b',' => {
                    if self.depth == 1 {
                        self.expect_key = true;
                    }
                    self.not_at_value();
                }
                b':' => {
                    if self.depth == 1 {
                        self.expect_key = false;
                        if self.member == Member::AfterKey {
                            self.member = Member::AfterColon;
                            continue;
                        }
                    }
                    self.not_at_value();
                }
                b' ' | b'\t' | b'\n' | b'\r' => {}
                _ => self.not_at_value(),
            }
        }
        input.len()
    }

    fn not_at_value(&mut self) {
        if matches!(self.member, Member::AfterKey | Member::AfterColon) {
            self.member = Member::Elsewhere;
        }
    }

    /// Reads inside the value; returns the bytes used (through the closing quote).
    fn feed_value(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, UploadBodyError> {
        let mut used = 0;
        if self.escape_len > 0 {
            used = self.continue_escape(input, out)?;
            if self.escape_len > 0 {
                return Ok(used);
            }
        }
        let rest = &input[used..];
        let stop = memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
        self.base64_run(&rest[..stop], out)?;
        used += stop;
        match rest.get(stop) {
            Some(b'"') => {
                if self.quad_len != 0 {
                    return Err(UploadBodyError::Base64);
                }
                self.skeleton.push(b'"');
                self.member = Member::Done;
                Ok(used + 1)
            }
            Some(_) => {
                self.escape[0] = b'\\';
                self.escape_len = 1;
                Ok(used + 1)
            }
            None => Ok(used),
        }
    }

    /// Completes an escape sequence begun earlier; returns the bytes used.
    fn continue_escape(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize, UploadBodyError> {
        let mut used = 0;
        while self.escape_len > 0 {
            let Some(&b) = input.get(used) else {
                return Ok(used);
            };
            used += 1;
            self.escape[self.escape_len] = b;
            self.escape_len += 1;
            let unescaped = match (self.escape[1], self.escape_len) {
                (b'u', 6) => {
                    // Four hex digits exactly (`from_str_radix` alone would take a `+`).
                    let hex = &self.escape[2..6];
                    let code = std::str::from_utf8(hex)
                        .ok()
                        .filter(|_| hex.iter().all(u8::is_ascii_hexdigit))
                        .and_then(|h| u32::from_str_radix(h, 16).ok())
                        .ok_or(UploadBodyError::Json("invalid \\u escape"))?;
                    // Anything outside ASCII is outside base64 too.
                    u8::try_from(code).map_err(|_| UploadBodyError::Base64)?
                }
                (b'u', _) => continue,
                (b'"', _) => b'"',
                (b'\\', _) => b'\\',
                (b'/', _) => b'/',
                (b'b', _) => 0x08,
                (b'f', _) => 0x0C,
                (b'n', _) => b'\n',
                (b'r', _) => b'\r',
                (b't', _) => b'\t',
                _ => return Err(UploadBodyError::Json("invalid escape")),
            };
            self.escape_len = 0;
            self.push_char(unescaped, out)?;
        }
        Ok(used)
    }

    /// Decodes a run of raw value bytes (no quote, no backslash).
    fn base64_run(&mut self, mut run: &[u8], out: &mut Vec<u8>) -> Result<(), UploadBodyError> {
        while self.quad_len > 0 && !run.is_empty() {
            self.push_raw(run[0], out)?;
            run = &run[1..];
        }
        let bulk = run.len() / 4 * 4;
        if bulk > 0 && !self.padded {
            let before = out.len();
            out.reserve(bulk / 4 * 3);
            if base64_simd::STANDARD
                .decode_append(&run[..bulk], out)
                .is_ok()
            {
                self.decoded += (out.len() - before) as u64;
                self.padded = run[bulk - 1] == b'=';
                run = &run[bulk..];
            } else {
                out.truncate(before);
            }
        }
        // What the bulk decoder did not take: a partial quad, or characters it refused
        // (whitespace is skipped here; anything else is an error with its position).
        for &b in run {
            self.push_raw(b, out)?;
        }
        Ok(())
    }

    /// One raw byte of the value: JSON forbids control characters unescaped.
    fn push_raw(&mut self, b: u8, out: &mut Vec<u8>) -> Result<(), UploadBodyError> {
        if b < 0x20 {
            return Err(UploadBodyError::Json(
                "control character (\\u0000-\\u001F) found while parsing a string",
            ));
        }
        self.push_char(b, out)
    }

    /// One character of the value after unescaping.
    fn push_char(&mut self, b: u8, out: &mut Vec<u8>) -> Result<(), UploadBodyError> {
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0C) {
            return Ok(());
        }
        let alphabet = b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=');
        // Nothing but whitespace may follow a padded quad.
        if !alphabet || self.padded {
            return Err(UploadBodyError::Base64);
        }
        self.quad[self.quad_len] = b;
        self.quad_len += 1;
        if self.quad_len == 4 {
            self.quad_len = 0;
            let before = out.len();
            base64_simd::STANDARD
                .decode_append(self.quad, out)
                .map_err(|_| UploadBodyError::Base64)?;
            self.decoded += (out.len() - before) as u64;
            self.padded = self.quad[3] == b'=';
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The skeleton, whether the value streamed, and the decoded bytes.
    type Scanned = Result<(Vec<u8>, bool, Vec<u8>), UploadBodyError>;

    /// Feeds `body` in pieces of `size` bytes.
    fn scan(body: &[u8], size: usize) -> Scanned {
        let mut scanner = UploadScanner::new(u64::MAX);
        let mut out = Vec::new();
        for piece in body.chunks(size.max(1)) {
            scanner.feed(piece, &mut out)?;
        }
        assert_eq!(scanner.decoded, out.len() as u64);
        let (skeleton, streamed) = scanner.finish()?;
        Ok((skeleton, streamed, out))
    }

    fn every_split(body: &[u8]) -> Vec<Scanned> {
        (1..=body.len().max(1))
            .map(|size| scan(body, size))
            .collect()
    }

    #[test]
    fn value_streams_and_skeleton_keeps_the_rest() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let encoded = base64_simd::STANDARD.encode_to_string(&data);
        for body in [
            format!(r#"{{"path": "a.bin", "content_base64": "{encoded}"}}"#),
            format!(r#"{{"content_base64":"{encoded}","path":"a.bin"}}"#),
            format!(
                r#"{{ "x": {{"content_base64": "no"}}, "content_base64" : "{encoded}", "path": "a.bin" }}"#
            ),
        ] {
            for result in every_split(body.as_bytes()) {
                let (skeleton, streamed, out) = result.unwrap();
                assert!(streamed, "{body}");
                assert_eq!(out, data);
                let parsed: serde_json::Value = serde_json::from_slice(&skeleton).unwrap();
                assert_eq!(parsed["content_base64"], "");
                assert_eq!(parsed["path"], "a.bin");
            }
        }
    }

    #[test]
    fn escapes_and_whitespace_inside_the_value_decode() {
        // `\/` from encoders escaping the solidus, `\n` from wrapped lines, spaces.
        let data = b"\xff\xff\xfe hello world?>>";
        let encoded = base64_simd::STANDARD.encode_to_string(data);
        assert!(encoded.contains('/'));
        let escaped = encoded.replace('/', "\\/");
        let wrapped = format!("{}\n{} ", &encoded[..6], &encoded[6..])
            .replace('/', "\\/")
            .replace('\n', "\\n");
        for body in [
            format!(r#"{{"path":"p","content_base64":"{escaped}"}}"#),
            format!(r#"{{"path":"p","content_base64":"{wrapped}"}}"#),
        ] {
            for result in every_split(body.as_bytes()) {
                let (_, streamed, out) = result.unwrap();
                assert!(streamed);
                assert_eq!(out, data);
            }
        }
        // A \u escape of an alphabet character is that character.
        let body = br#"{"content_base64":"\u0041\u0041\u0041\u0041"}"#;
        for result in every_split(body) {
            assert_eq!(result.unwrap().2, vec![0, 0, 0]);
        }
    }

    #[test]
    fn bad_base64_is_refused_wherever_it_is() {
        let good = "QUJD".repeat(100);
        for bad in [
            format!("*{good}"),
            format!("{}*{}", &good[..200], &good[200..]),
            format!("{good}*"),
            format!("{good}Q"),
            format!("QQ=={good}"),
            "QUJD\\u00e9".to_string(),
        ] {
            let body = format!(r#"{{"path":"p","content_base64":"{bad}"}}"#);
            for result in every_split(body.as_bytes()) {
                assert_eq!(result.unwrap_err(), UploadBodyError::Base64, "{bad}");
            }
        }
    }

    #[test]
    fn json_errors_inside_the_value_are_json_errors() {
        for body in [
            &b"{\"content_base64\":\"QU\nJD\"}"[..],
            br#"{"content_base64":"QU\xJD"}"#,
            br#"{"content_base64":"\u+051UJD"}"#,
        ] {
            for result in every_split(body) {
                assert!(matches!(result, Err(UploadBodyError::Json(_))));
            }
        }
        // An unterminated value leaves a skeleton that does not parse.
        let (skeleton, streamed, _) = scan(br#"{"content_base64":"QUJD"#, 3).unwrap();
        assert!(!streamed);
        assert!(serde_json::from_slice::<serde_json::Value>(&skeleton).is_err());
    }

    #[test]
    fn only_the_top_level_string_member_streams() {
        for body in [
            &br#"{"a": {"content_base64": "QUJD"}}"#[..],
            br#"["content_base64", "QUJD"]"#,
            br#"{"content_base64": 5, "b": "QUJD"}"#,
            br#"{"x": "content_base64", "y": "QUJD"}"#,
            br#"{"content\u005fbase64": "QUJD"}"#,
        ] {
            for result in every_split(body) {
                let (skeleton, streamed, out) = result.unwrap();
                assert!(!streamed);
                assert!(out.is_empty());
                assert_eq!(skeleton, body);
            }
        }
    }

    #[test]
    fn a_duplicate_value_stays_in_the_skeleton() {
        let body = br#"{"content_base64": "QUJD", "content_base64": "REVG"}"#;
        let (skeleton, streamed, out) = scan(body, 7).unwrap();
        assert!(streamed);
        assert_eq!(out, b"ABC");
        assert_eq!(
            skeleton,
            br#"{"content_base64": "", "content_base64": "REVG"}"#
        );
    }

    #[test]
    fn the_limit_counts_decoded_bytes() {
        let body = br#"{"content_base64": "QUJDREVG"}"#;
        let mut scanner = UploadScanner::new(5);
        let mut out = Vec::new();
        assert_eq!(scanner.feed(body, &mut out), Err(UploadBodyError::TooLarge));
        let mut scanner = UploadScanner::new(6);
        assert!(scanner.feed(body, &mut Vec::new()).is_ok());
    }
}
