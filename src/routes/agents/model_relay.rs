//! `/v1/agents/model_relay/{capability}/v1/messages`: the model relay's route
//! (`crate::agents::claude::relay`). A Claude Code the server started reaches the model
//! API here; the capability in the path is the only credential (the CLI holds a
//! placeholder key), and the relay adds the real key on the way and streams the answer
//! back as it comes.

use super::{path_value, route};
use crate::agents::claude::relay::{self, AnswerBody};
use crate::api::{ApiError, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::response::{BodyStream, LocalFuture};
use crate::http::Response;

pub fn endpoints() -> Vec<Endpoint> {
    vec![route(
        Method::Post,
        "/v1/agents/model_relay/{capability}/v1/messages",
        "agents_model_relay",
        "A Claude Code the server started to the model API: the Messages API request, with the key added here.",
        handler(relayed),
    )
    .params(&[Param::path("capability").doc("What one Claude Code process was given.")])
    // The capability is the credential: the CLI sends only a placeholder key.
    .auth_required(false)
    .scopes::<&str>(&[])
    .extension()
    // The model API's own statuses pass through; 502 when it cannot be reached.
    .also_answers(&[400, 401, 403, 429, 500, 502, 529])]
}

/// The model API's body, handed on piece by piece.
struct Relayed(AnswerBody);

impl BodyStream for Relayed {
    fn length(&self) -> Option<u64> {
        None
    }

    fn next(&mut self, _buf: Vec<u8>) -> LocalFuture<'_, std::io::Result<Option<Vec<u8>>>> {
        Box::pin(self.0.next())
    }
}

async fn relayed(call: Call) -> Result<Response, ApiError> {
    let capability = path_value(&call, "capability");
    let Some(upstream) = relay::route(&capability) else {
        return Err(ApiError::new(
            404,
            "not_found_error",
            "No model relay is open under this capability: it closes when the Claude Code it was given to stops.",
        ));
    };
    let mut path = "/v1/messages".to_string();
    let query: Vec<String> = call
        .query_pairs()
        .iter()
        .map(|(k, v)| {
            let enc = |s: &str| {
                percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC)
                    .to_string()
            };
            format!("{}={}", enc(k), enc(v))
        })
        .collect();
    if !query.is_empty() {
        path.push('?');
        path.push_str(&query.join("&"));
    }
    let headers: Vec<(&str, &str)> = relay::PASSED_ON
        .iter()
        .filter_map(|name| call.header(name).map(|value| (*name, value)))
        .collect();
    let answer = relay::forward(&upstream, &path, &headers, &call.body)
        .await
        .map_err(|e| ApiError::new(502, "server_error", e.0))?;
    let content_type = match answer.content_type.as_str() {
        t if t.starts_with("text/event-stream") => "text/event-stream",
        t if t.contains("json") => "application/json",
        _ => "application/octet-stream",
    };
    Ok(Response::stream(
        answer.status,
        content_type,
        Box::new(Relayed(answer.body)),
    ))
}
