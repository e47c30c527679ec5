//! The one error type of every handler and of the dispatcher. It is data only: the
//! dispatcher renders it, in one place, to the envelope its endpoint's [`ErrorStyle`]
//! names.

use std::borrow::Cow;

use serde_json::{Map, Value};

/// The JSON error envelopes: the contract's two, and envd's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ErrorStyle {
    /// `{"error": <message>, "type": <ExceptionName>, "code"?: ..., ...}`.
    #[default]
    Contract,
    /// OpenAI's `{"error": {"message", "type", "param", "code"}}`, used by `/v1`.
    OpenAi,
    /// Connect's `{"code": "not_found", "message"}`, used by envd's RPC routes. The code
    /// is the one set with [`ApiError::with_connect_code`], else the status's.
    Connect,
    /// envd's REST routes: `{"code": <status>, "message"}`.
    Envd,
}

/// The Connect code a client reads for an HTTP status (the protocol's table, read
/// backwards), for errors that did not name one.
fn connect_code_of_status(status: u16) -> &'static str {
    match status {
        400 | 415 => "invalid_argument",
        401 => "unauthenticated",
        403 => "permission_denied",
        404 => "not_found",
        408 | 504 => "deadline_exceeded",
        409 => "already_exists",
        413 | 429 | 507 => "resource_exhausted",
        499 => "canceled",
        501 | 505 => "unimplemented",
        502 | 503 => "unavailable",
        500 => "internal",
        _ => "unknown",
    }
}

/// An error a handler (or the dispatcher) answers with. `kind` is the Python exception
/// name the contract shows in `type` (or OpenAI's error type under `/v1`); `code` is set
/// for policy and protocol refusals.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: Cow<'static, str>,
    pub code: Option<&'static str>,
    /// Further fields of the envelope, such as `endpoint`, `rule` or `param`.
    pub extra: Vec<(&'static str, Value)>,
    /// Extra response headers, such as `Allow` on a 405.
    pub headers: Vec<(&'static str, String)>,
}

impl ApiError {
    pub fn new(
        status: u16,
        kind: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: kind.into(),
            code: None,
            extra: Vec::new(),
            headers: Vec::new(),
        }
    }

    /// 400 `ValueError`: the caller sent something we cannot use.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "ValueError", message)
    }

    /// 404 `ValueError` for a path no route serves, worded as the contract words it.
    pub fn not_found_path(path: &str) -> Self {
        Self::new(404, "ValueError", format!("Not found: {path}"))
    }

    /// 413 `payload_too_large` for a body over `limit` bytes.
    pub fn payload_too_large(limit: u64) -> Self {
        Self::new(
            413,
            "ValueError",
            format!("Request body too large: the limit is {limit} bytes"),
        )
        .with_code("payload_too_large")
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "AuthError", "unauthorized").with_code("unauthorized")
    }

    /// 500 with the message of whatever failed inside a handler.
    pub fn internal(kind: &'static str, message: impl Into<String>) -> Self {
        Self::new(500, kind, message)
    }

    /// Replaces the exception name in `type`.
    pub fn with_kind(mut self, kind: &'static str) -> Self {
        self.kind = Cow::Borrowed(kind);
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn with_field(mut self, name: &'static str, value: impl Into<Value>) -> Self {
        self.extra.push((name, value.into()));
        self
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// The Connect code envd's RPC routes answer with (`failed_precondition`, ...),
    /// instead of the one its status implies.
    pub fn with_connect_code(self, code: &'static str) -> Self {
        self.with_field("connect_code", code)
    }

    /// Whether the envelope already carries field `name`.
    pub fn has_field(&self, name: &str) -> bool {
        self.extra.iter().any(|(n, _)| *n == name)
    }

    /// OpenAI's error type: the kind itself when it is one (`invalid_request_error`),
    /// else the one OpenAI uses for the status, so the dispatcher's refusals (a Python
    /// exception name in the contract's envelope) read right under `/v1`.
    fn openai_type(&self) -> Cow<'static, str> {
        if self.kind.ends_with("_error") {
            return self.kind.clone();
        }
        Cow::Borrowed(match self.status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500.. => "server_error",
            _ => "invalid_request_error",
        })
    }

    /// The JSON envelope in `style`. Field order follows the contract's examples.
    pub fn body(&self, style: ErrorStyle) -> Value {
        match style {
            ErrorStyle::Contract => {
                let mut map = Map::new();
                map.insert("error".into(), Value::String(self.message.clone()));
                map.insert("type".into(), Value::String(self.kind.to_string()));
                if let Some(code) = self.code {
                    map.insert("code".into(), Value::String(code.into()));
                }
                for (name, value) in &self.extra {
                    map.insert((*name).into(), value.clone());
                }
                Value::Object(map)
            }
            ErrorStyle::OpenAi => {
                let field = |name: &str| {
                    self.extra
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, v)| v.clone())
                        .unwrap_or(Value::Null)
                };
                let kind = self.openai_type();
                // A refusal without a code of its own gets the reference's, so a client
                // that branches on `code` reads the same word on both servers.
                let code = self.code.or(match kind.as_ref() {
                    "not_found_error" => Some("resource_not_found"),
                    "invalid_request_error" => Some("invalid_request"),
                    _ => None,
                });
                let mut error = serde_json::json!({
                    "message": self.message,
                    "type": kind,
                    "param": field("param"),
                    "code": code,
                });
                // A disabled endpoint names the rule that decided, as the contract's
                // envelope does beside `error`.
                if let Value::String(rule) = field("rule") {
                    error["rule"] = Value::String(rule);
                }
                // What this server adds (an install failure's runtime and npm lines).
                if let details @ Value::Object(_) = field("x_agent_sandbox") {
                    error["x_agent_sandbox"] = details;
                }
                serde_json::json!({ "error": error })
            }
            ErrorStyle::Connect => {
                let code = self
                    .extra
                    .iter()
                    .find(|(n, _)| *n == "connect_code")
                    .and_then(|(_, v)| v.as_str().map(str::to_string))
                    .unwrap_or_else(|| connect_code_of_status(self.status).to_string());
                serde_json::json!({"code": code, "message": self.message})
            }
            ErrorStyle::Envd => serde_json::json!({"code": self.status, "message": self.message}),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.kind, self.message)
    }
}

impl std::error::Error for ApiError {}

impl From<std::io::Error> for ApiError {
    fn from(err: std::io::Error) -> Self {
        super::errno::os_error(&err, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_envelopes() {
        let error = ApiError::bad_request("no")
            .with_code("bad")
            .with_field("param", "model");
        assert_eq!(
            error.body(ErrorStyle::Contract),
            serde_json::json!({"error": "no", "type": "ValueError", "code": "bad", "param": "model"})
        );
        assert_eq!(
            error.body(ErrorStyle::OpenAi),
            serde_json::json!({"error": {"message": "no", "type": "invalid_request_error", "param": "model", "code": "bad"}})
        );
    }
}
