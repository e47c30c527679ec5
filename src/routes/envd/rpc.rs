//! The Connect side of envd's RPC routes: reading a call's message in the codec its
//! `Content-Type` names, answering unary calls, and streaming answers as enveloped
//! messages that end with the end-of-stream envelope (an error in a stream travels
//! there, under HTTP 200, as Connect says).

use std::time::{Duration, Instant};

use crate::api::ApiError;
use crate::app::Call;
use crate::envd::{FromJson, ToJson};
use crate::http::connect::{self, Code, ContentType, Envelopes};
use crate::http::response::{BodyStream, LocalFuture};
use crate::http::Response;

/// The most a request message may be (envd's messages are small; file bytes travel
/// over `/files`).
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// A Connect error with `code` and a message that says what to do.
pub fn error(code: Code, message: impl Into<String>) -> ApiError {
    ApiError::new(code.status(), "ConnectError", message).with_connect_code(code.name())
}

/// The call's `Content-Type`, which must be a unary one (`streaming` false) or a
/// streaming one.
pub fn content_type(call: &Call, streaming: bool) -> Result<ContentType, ApiError> {
    let value = call.header("content-type").unwrap_or("");
    let wanted = if streaming {
        "application/connect+json or application/connect+proto"
    } else {
        "application/json or application/proto"
    };
    match ContentType::parse(value) {
        Some(ct) if ct.streaming == streaming => Ok(ct),
        _ => Err(ApiError::new(
            415,
            "ConnectError",
            format!("Content-Type '{value}' is not served here: send {wanted}"),
        )
        .with_connect_code(Code::InvalidArgument.name())),
    }
}

/// The call's request message.
pub fn request<M: prost::Message + Default + FromJson>(
    call: &mut Call,
    streaming: bool,
) -> Result<(ContentType, M), ApiError> {
    let ct = content_type(call, streaming)?;
    if let Some(encoding) = call
        .header(if streaming {
            "connect-content-encoding"
        } else {
            "content-encoding"
        })
        .filter(|e| !e.eq_ignore_ascii_case("identity"))
    {
        return Err(error(
            Code::Unimplemented,
            format!("compression '{encoding}' is not supported: send messages uncompressed"),
        ));
    }
    let body = call.take_body();
    let message = if streaming {
        let mut envelopes = Envelopes::new(MAX_MESSAGE);
        envelopes.push(&body);
        match envelopes.next_envelope() {
            Ok(Some(envelope)) => envelope.message,
            Ok(None) => {
                return Err(error(
                    Code::InvalidArgument,
                    "the request holds no whole message envelope",
                ))
            }
            Err(why) => return Err(error(Code::InvalidArgument, why)),
        }
    } else {
        body
    };
    let decoded = crate::envd::decode::<M>(ct.codec, &message)
        .map_err(|why| error(Code::InvalidArgument, why))?;
    Ok((ct, decoded))
}

/// A unary answer.
pub fn unary<M: prost::Message + ToJson>(ct: ContentType, message: &M) -> Response {
    Response::raw(200, ct.header(), crate::envd::encode(ct.codec, message))
}

/// How long a stream may last (`Connect-Timeout-Ms`) and how often it sends a keepalive
/// (`Keepalive-Ping-Interval`, seconds, as the e2b SDK sends it).
pub struct Timing {
    pub deadline: Option<Instant>,
    pub keepalive: Option<Duration>,
}

impl Timing {
    pub fn of(call: &Call) -> Timing {
        let deadline = call
            .header("connect-timeout-ms")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map(|ms| Instant::now() + Duration::from_millis(ms.min(1 << 40)));
        let keepalive = call
            .header("keepalive-ping-interval")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(s.min(24 * 3600)));
        Timing {
            deadline,
            keepalive,
        }
    }
}

/// What a streamed answer produces next.
pub enum Next {
    /// A message, already encoded in the call's codec.
    Message(Vec<u8>),
    /// The stream is over: `None` for success, or the error the end carries.
    End(Option<(Code, String)>),
}

/// The source of a streamed answer's messages: `next` waits for the next one (it must
/// be cancel-safe: it is dropped when the keepalive or the deadline fires first, or the
/// server drains), `keepalive` encodes a keepalive message, `deadline` runs when the
/// caller's timeout passed (the answer then ends with `deadline_exceeded`).
pub trait Events {
    fn next(&mut self) -> LocalFuture<'_, Next>;
    fn keepalive(&self) -> Vec<u8>;
    fn deadline(&mut self) {}
}

/// A streamed answer over `events`.
pub fn stream(ct: ContentType, timing: Timing, events: Box<dyn Events>) -> Response {
    Response::stream(
        200,
        ct.header(),
        Box::new(EventBody {
            events,
            timing,
            done: false,
        }),
    )
}

struct EventBody {
    events: Box<dyn Events>,
    timing: Timing,
    done: bool,
}

impl BodyStream for EventBody {
    fn length(&self) -> Option<u64> {
        None
    }

    fn next(&mut self, _buf: Vec<u8>) -> LocalFuture<'_, std::io::Result<Option<Vec<u8>>>> {
        Box::pin(async move {
            if self.done {
                return Ok(None);
            }
            let keepalive = self.timing.keepalive;
            let deadline = self.timing.deadline;
            let sleep_until = |at: Option<Instant>| async move {
                match at {
                    Some(at) => {
                        monoio::time::sleep(at.saturating_duration_since(Instant::now())).await
                    }
                    None => std::future::pending().await,
                }
            };
            let next_ping = keepalive.map(|every| Instant::now() + every);
            let next = monoio::select! {
                next = self.events.next() => Some(next),
                _ = sleep_until(next_ping) => None,
                _ = sleep_until(deadline) => {
                    self.events.deadline();
                    Some(Next::End(Some((
                        Code::DeadlineExceeded,
                        "the call's timeout (Connect-Timeout-Ms) passed".to_string(),
                    ))))
                },
            };
            Ok(Some(match next {
                None => connect::envelope(0, &self.events.keepalive()),
                Some(Next::Message(message)) => connect::envelope(0, &message),
                Some(Next::End(error)) => {
                    self.done = true;
                    connect::end_of_stream(error.as_ref().map(|(code, m)| (*code, m.as_str())))
                }
            }))
        })
    }
}
