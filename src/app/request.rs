//! The contract's reading of a request target and body: trailing slashes stripped,
//! query parameters decoded as Python's `parse_qs` decodes them (blank values dropped, a
//! repeated name refused), bodies that must be JSON objects.

use crate::api::ApiError;

/// Splits `target` into the matched path and the decoded query pairs. Blank values are
/// dropped (Python's `parse_qs` default); a repeated name is `duplicate_parameter`,
/// except a name ending in `[]`: OpenAI's clients send a list so (`status[]=active&
/// status[]=archived`), and no contract parameter has such a name.
pub fn split_target(target: &str) -> (String, Result<Vec<(String, String)>, ApiError>) {
    let (raw_path, raw_query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let raw_path = raw_path.split('#').next().unwrap_or("");
    let trimmed = raw_path.trim_end_matches('/');
    let path = if trimmed.is_empty() { "/" } else { trimmed }.to_string();
    (path, raw_query.map(parse_query).unwrap_or(Ok(Vec::new())))
}

fn parse_query(raw_query: &str) -> Result<Vec<(String, String)>, ApiError> {
    let raw_query = raw_query.split('#').next().unwrap_or("");
    let mut query: Vec<(String, String)> = Vec::new();
    // Only `&` separates (Python 3.10+ parse_qs): `;` is part of a value.
    for pair in raw_query.split('&') {
        if pair.is_empty() {
            continue;
        }
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode_query_part(name);
        let value = decode_query_part(value);
        if value.is_empty() {
            continue;
        }
        if !name.ends_with("[]") && query.iter().any(|(n, _)| *n == name) {
            return Err(ApiError::bad_request(format!(
                "Duplicate query parameter: {name}. Send each parameter once."
            ))
            .with_code("duplicate_parameter"));
        }
        query.push((name, value));
    }
    Ok(query)
}

/// `+` is a space in a query string (`unquote_plus`).
fn decode_query_part(part: &str) -> String {
    if part.contains('+') {
        percent_decode(&part.replace('+', " "))
    } else {
        percent_decode(part)
    }
}

/// Percent-decodes `input`. Invalid escapes stay as they are and invalid UTF-8 becomes
/// U+FFFD, as Python's `unquote` does.
pub fn percent_decode(input: &str) -> String {
    percent_encoding::percent_decode_str(input)
        .decode_utf8_lossy()
        .into_owned()
}

/// Checks that a POST/DELETE body is a JSON object (or empty), without building it.
/// `full_syntax: false` checks only the opening brace, for handlers that parse the whole
/// body themselves (a second full pass over a 10 MiB upload costs milliseconds).
pub fn validate_json_object(body: &[u8], full_syntax: bool) -> Result<(), ApiError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_slash_is_stripped() {
        assert_eq!(split_target("/health/").0, "/health");
        assert_eq!(split_target("/").0, "/");
        assert_eq!(split_target("//").0, "/");
    }

    #[test]
    fn query_is_decoded_and_blanks_dropped() {
        let (path, q) = split_target("/download?path=%2Fhome%2Fuser%2Fa+b.txt&x=");
        assert_eq!(path, "/download");
        assert_eq!(
            q.unwrap(),
            vec![("path".to_string(), "/home/user/a b.txt".to_string())]
        );
    }

    #[test]
    fn repeated_parameter_is_refused() {
        let err = split_target("/download?path=a&path=b").1.unwrap_err();
        assert_eq!(err.status, 400);
        assert_eq!(err.code, Some("duplicate_parameter"));
    }

    #[test]
    fn bracket_lists_may_repeat() {
        let q = split_target("/v1/vaults?status%5B%5D=active&status[]=archived").1;
        assert_eq!(
            q.unwrap(),
            vec![
                ("status[]".to_string(), "active".to_string()),
                ("status[]".to_string(), "archived".to_string())
            ]
        );
    }

    #[test]
    fn bad_escapes_survive() {
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%41"), "A");
        assert_eq!(percent_decode("%2B+"), "++");
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
