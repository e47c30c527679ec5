//! The request a handler receives: method, stripped path, query, headers, body, path
//! parameters, the caller's identity and the shared server state.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::auth::Identity;
use crate::error::ApiError;
use crate::routes::Method;
use crate::state::AppState;

/// One parsed request, owned by its handler.
pub struct Request {
    pub method: Method,
    /// The path with the query removed and a trailing slash stripped (`/health/` is
    /// `/health`), not percent-decoded, as the contract matches it.
    pub path: String,
    pub(crate) query: Vec<(String, String)>,
    /// Header names in lower case, in arrival order.
    pub(crate) headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The body was not read: this is a raw (`application/octet-stream`) request to a
    /// `raw_body` endpoint, whose handler answers with `Response::accept_body`.
    pub(crate) raw_body: bool,
    pub(crate) path_params: Vec<(String, String)>,
    pub identity: Arc<Identity>,
    pub(crate) state: Arc<AppState>,
    /// Id of the endpoint that matched.
    pub endpoint_id: Arc<str>,
}

impl Request {
    /// The single value of query parameter `name`. Blank values count as absent, as with
    /// Python's `parse_qs`; repeats were refused before the handler ran.
    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// All query parameters in arrival order.
    pub fn query_pairs(&self) -> &[(String, String)] {
        &self.query
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// A `{param}` segment of the route path, percent-decoded.
    pub fn path_param(&self, name: &str) -> Option<&str> {
        self.path_params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the body is left on the wire for a body sink (see `Endpoint::raw_body`).
    pub fn is_raw_body(&self) -> bool {
        self.raw_body
    }

    /// The server's shared, read-only state.
    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// The body as a JSON object deserialised into `T`; an empty body is `{}`. The
    /// dispatcher already refused bodies that are not a JSON object, so an error here is
    /// a field of the wrong type, reported as 400 with serde's description.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        self.json_borrowed()
    }

    /// Like [`Request::json`], but `T` may borrow strings from the body, so a large
    /// base64 field is not copied.
    pub fn json_borrowed<'a, T: Deserialize<'a>>(&'a self) -> Result<T, ApiError> {
        let body: &[u8] = if is_blank(&self.body) {
            b"{}"
        } else {
            &self.body
        };
        serde_json::from_slice(body).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => {
                ApiError::bad_request(format!("Invalid request body: {e}"))
            }
            _ => ApiError::bad_request(format!("Invalid JSON body: {e}")),
        })
    }

    /// Moves the body out, e.g. to parse it on the blocking pool.
    pub fn take_body(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.body)
    }
}

pub(crate) fn is_blank(body: &[u8]) -> bool {
    body.iter().all(u8::is_ascii_whitespace)
}

/// Checks that a POST/DELETE body is a JSON object (or empty), without building it.
/// `full_syntax: false` checks only the opening brace, for handlers that parse the whole
/// body themselves (a second full pass over a 10 MiB upload costs milliseconds).
pub(crate) fn validate_json_object(body: &[u8], full_syntax: bool) -> Result<(), ApiError> {
    let Some(first) = body.iter().find(|b| !b.is_ascii_whitespace()) else {
        return Ok(());
    };
    if full_syntax {
        if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(body) {
            return Err(ApiError::bad_request(format!("Invalid JSON body: {e}")));
        }
    }
    if *first != b'{' {
        return Err(ApiError::bad_request("Request body must be a JSON object"));
    }
    Ok(())
}

/// Splits `target` into the matched path and the decoded query pairs. Blank values are
/// dropped (Python's `parse_qs` default); a repeated name is `duplicate_parameter`.
pub(crate) fn split_target(target: &str) -> Result<(String, Vec<(String, String)>), ApiError> {
    let (raw_path, raw_query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let raw_path = raw_path.split('#').next().unwrap_or("");
    let trimmed = raw_path.trim_end_matches('/');
    let path = if trimmed.is_empty() { "/" } else { trimmed }.to_string();
    let mut query: Vec<(String, String)> = Vec::new();
    if let Some(raw_query) = raw_query {
        let raw_query = raw_query.split('#').next().unwrap_or("");
        // Only `&` separates (Python 3.10+ parse_qs): `;` is part of a value.
        for pair in raw_query.split('&') {
            if pair.is_empty() {
                continue;
            }
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = percent_decode(name, true);
            let value = percent_decode(value, true);
            if value.is_empty() {
                continue;
            }
            if query.iter().any(|(n, _)| *n == name) {
                return Err(ApiError::bad_request(format!(
                    "Duplicate query parameter: {name}. Send each parameter once."
                ))
                .with_code("duplicate_parameter"));
            }
            query.push((name, value));
        }
    }
    Ok((path, query))
}

/// Percent-decodes `input` (and `+` as space in query strings). Invalid escapes stay as
/// they are and invalid UTF-8 becomes U+FFFD, as Python's `unquote` does.
pub fn percent_decode(input: &str, plus_is_space: bool) -> String {
    let bytes = input.as_bytes();
    if !bytes
        .iter()
        .any(|b| *b == b'%' || (plus_is_space && *b == b'+'))
    {
        return input.to_string();
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus_is_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_slash_is_stripped() {
        assert_eq!(split_target("/health/").unwrap().0, "/health");
        assert_eq!(split_target("/").unwrap().0, "/");
        assert_eq!(split_target("//").unwrap().0, "/");
    }

    #[test]
    fn query_is_decoded_and_blanks_dropped() {
        let (path, q) = split_target("/download?path=%2Fhome%2Fuser%2Fa+b.txt&x=").unwrap();
        assert_eq!(path, "/download");
        assert_eq!(
            q,
            vec![("path".to_string(), "/home/user/a b.txt".to_string())]
        );
    }

    #[test]
    fn repeated_parameter_is_refused() {
        let err = split_target("/download?path=a&path=b").unwrap_err();
        assert_eq!(err.status, 400);
        assert_eq!(err.code, Some("duplicate_parameter"));
    }

    #[test]
    fn bad_escapes_survive() {
        assert_eq!(percent_decode("100%", false), "100%");
        assert_eq!(percent_decode("%zz%4", false), "%zz%4");
        assert_eq!(percent_decode("%41", false), "A");
    }

    #[test]
    fn body_must_be_an_object() {
        assert!(validate_json_object(b"", true).is_ok());
        assert!(validate_json_object(b"  {\"a\": 1} ", true).is_ok());
        assert!(validate_json_object(b"[1]", true).is_err());
        assert!(validate_json_object(b"{", false).is_ok());
        assert!(validate_json_object(b"[1]", false).is_err());
        assert!(validate_json_object(b"{", true).is_err());
        assert!(validate_json_object(b"\"x\"", true).is_err());
    }
}
