//! The Connect protocol's framing over HTTP/1.1 (connectrpc.com/docs/protocol), without
//! any message types: which codec a `Content-Type` names, the 5-byte envelopes of
//! streaming bodies (a flag byte, a big-endian length, the message), the end-of-stream
//! envelope that closes every streamed answer, and Connect's error codes with the HTTP
//! statuses they travel under in unary answers.

/// An envelope whose message is compressed (refused here: no compression is offered).
pub const FLAG_COMPRESSED: u8 = 0b01;
/// The last envelope of a streamed answer, carrying JSON: `{}` or `{"error": ...}`.
pub const FLAG_END_STREAM: u8 = 0b10;

/// How a call's messages are encoded, from its `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Json,
    Proto,
}

/// A call's `Content-Type`, understood: the codec and whether bodies are enveloped
/// (streaming calls) or a bare message (unary calls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentType {
    pub codec: Codec,
    pub streaming: bool,
}

impl ContentType {
    /// `application/{json,proto}` (unary) or `application/connect+{json,proto}`
    /// (streaming); parameters such as `charset` are ignored. `None` for anything else.
    pub fn parse(value: &str) -> Option<ContentType> {
        let essence = value
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let (streaming, codec) = match essence.strip_prefix("application/connect+") {
            Some(codec) => (true, codec.to_string()),
            None => (false, essence.strip_prefix("application/")?.to_string()),
        };
        let codec = match codec.as_str() {
            "json" => Codec::Json,
            "proto" => Codec::Proto,
            _ => return None,
        };
        Some(ContentType { codec, streaming })
    }

    /// The `Content-Type` of the answer: the request's own.
    pub fn header(self) -> &'static str {
        match (self.streaming, self.codec) {
            (false, Codec::Json) => "application/json",
            (false, Codec::Proto) => "application/proto",
            (true, Codec::Json) => "application/connect+json",
            (true, Codec::Proto) => "application/connect+proto",
        }
    }
}

/// `message` in one envelope with `flags`.
pub fn envelope(flags: u8, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(flags);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The end-of-stream envelope: `{}`, or `{"error": {"code", "message"}}`.
pub fn end_of_stream(error: Option<(Code, &str)>) -> Vec<u8> {
    let body = match error {
        None => serde_json::json!({}),
        Some((code, message)) => {
            serde_json::json!({"error": {"code": code.name(), "message": message}})
        }
    };
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// Envelopes taken one by one from a body that arrives in pieces.
pub struct Envelopes {
    pending: Vec<u8>,
    max_message: usize,
}

/// One envelope of a request.
#[derive(Debug, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub message: Vec<u8>,
}

impl Envelopes {
    /// Envelopes whose messages may be at most `max_message` bytes.
    pub fn new(max_message: usize) -> Envelopes {
        Envelopes {
            pending: Vec::new(),
            max_message,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// The next whole envelope, `Ok(None)` until one has arrived; `Err` for a message
    /// over the limit or a compressed one.
    pub fn next_envelope(&mut self) -> Result<Option<Envelope>, String> {
        if self.pending.len() < 5 {
            return Ok(None);
        }
        let flags = self.pending[0];
        let length = u32::from_be_bytes([
            self.pending[1],
            self.pending[2],
            self.pending[3],
            self.pending[4],
        ]) as usize;
        if length > self.max_message {
            return Err(format!(
                "a message of {length} bytes is over the limit of {} bytes",
                self.max_message
            ));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err("compressed messages are not accepted: send them uncompressed (Connect-Content-Encoding: identity)".into());
        }
        if self.pending.len() < 5 + length {
            return Ok(None);
        }
        let message = self.pending[5..5 + length].to_vec();
        self.pending.drain(..5 + length);
        Ok(Some(Envelope { flags, message }))
    }
}

/// The Connect error codes this server answers with (the protocol has a few more).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
}

impl Code {
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
        }
    }

    /// The HTTP status a unary answer with this error carries (the protocol's table).
    pub fn status(self) -> u16 {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Internal => 500,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_name_codec_and_framing() {
        let json = ContentType::parse("application/json; charset=utf-8").unwrap();
        assert_eq!((json.codec, json.streaming), (Codec::Json, false));
        let stream = ContentType::parse("Application/Connect+Proto").unwrap();
        assert_eq!((stream.codec, stream.streaming), (Codec::Proto, true));
        assert_eq!(stream.header(), "application/connect+proto");
        assert!(ContentType::parse("text/plain").is_none());
        assert!(ContentType::parse("application/connect+xml").is_none());
    }

    #[test]
    fn envelopes_arrive_in_any_pieces() {
        let mut body = envelope(0, b"first");
        body.extend(envelope(0, b""));
        body.extend(end_of_stream(None));
        let mut envelopes = Envelopes::new(1024);
        let mut seen = Vec::new();
        for byte in &body {
            envelopes.push(std::slice::from_ref(byte));
            while let Some(envelope) = envelopes.next_envelope().unwrap() {
                seen.push(envelope);
            }
        }
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[0].message, b"first");
        assert!(seen[1].message.is_empty());
        assert_eq!(
            (seen[2].flags, &seen[2].message[..]),
            (FLAG_END_STREAM, &b"{}"[..])
        );
    }

    #[test]
    fn oversized_and_compressed_envelopes_are_refused() {
        let mut envelopes = Envelopes::new(4);
        envelopes.push(&envelope(0, b"12345"));
        assert!(envelopes
            .next_envelope()
            .unwrap_err()
            .contains("over the limit of 4 bytes"));
        let mut envelopes = Envelopes::new(64);
        envelopes.push(&envelope(FLAG_COMPRESSED, b"x"));
        assert!(envelopes
            .next_envelope()
            .unwrap_err()
            .contains("uncompressed"));
    }

    #[test]
    fn errors_end_the_stream_with_code_and_message() {
        let end = end_of_stream(Some((Code::NotFound, "process with pid 7 not found")));
        assert_eq!(end[0], FLAG_END_STREAM);
        let body: serde_json::Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(body["error"]["code"], "not_found");
        assert_eq!(body["error"]["message"], "process with pid 7 not found");
    }
}
