//! `POST /files/search`.

use std::time::Duration;

use serde_json::{json, Value};

use super::{body_string, confine, fs_error};
use crate::api::ApiError;
use crate::app::Call;
use crate::fs::tree;
use crate::http::Response;

pub const DEFAULT_DEPTH: i64 = 5;
pub const DEFAULT_RESULTS: i64 = 100;
pub const TIME_LIMIT: Duration = Duration::from_secs(10);
/// Most results one search returns, whatever `max_results` asks for: each result is
/// held in memory until the answer is written.
pub const MAX_RESULTS: i64 = 10_000;

/// An integer field as Python's `int()` takes it: integers, integral floats (truncated),
/// numeric strings and booleans.
fn int_field(body: &Value, field: &str, default: i64) -> Result<i64, ApiError> {
    let bad = || ApiError::bad_request(format!("{field} must be an integer"));
    match body.get(field) {
        None => Ok(default),
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.is_finite())
                    .map(|f| f.trunc() as i64)
            })
            .ok_or_else(bad),
        Some(Value::Bool(b)) => Ok(i64::from(*b)),
        Some(Value::String(s)) => s.trim().parse::<i64>().map_err(|_| bad()),
        Some(_) => Err(bad()),
    }
}

pub async fn search(call: Call) -> Result<Response, ApiError> {
    let body: Value = call.json()?;
    let base = &call.services().base;
    let input = match body.get("path") {
        None | Some(Value::Null) => base.path().to_string_lossy().into_owned(),
        other => body_string(other, "path")?,
    };
    let pattern = match body.get("pattern") {
        None | Some(Value::Null) => "*".to_string(),
        Some(Value::String(p)) => p.clone(),
        Some(_) => return Err(ApiError::bad_request("pattern must be a string")),
    };
    let max_depth = int_field(&body, "max_depth", DEFAULT_DEPTH)?;
    let max_results = int_field(&body, "max_results", DEFAULT_RESULTS)?;
    let root = confine(&call, &input)?;
    // A policy can lower the depth, the number of results and the time, never raise them.
    let decision = call.decision();
    let depth_cap = decision
        .knob_u64("max_depth")
        .map_or(usize::MAX, |d| d as usize);
    let results_cap = decision.knob_u64("max_files").map_or(MAX_RESULTS, |n| {
        i64::try_from(n).unwrap_or(i64::MAX).min(MAX_RESULTS)
    });
    let time_limit = decision
        .knob_seconds("max_duration_seconds")
        .map_or(TIME_LIMIT, |s| {
            Duration::try_from_secs_f64(s).map_or(TIME_LIMIT, |d| TIME_LIMIT.min(d))
        });
    let found = tree::search(
        base,
        root,
        pattern,
        (max_depth.max(0) as usize).min(depth_cap),
        max_results.clamp(0, results_cap) as usize,
        time_limit,
    )
    .await
    .map_err(fs_error)?;
    let mut answer = json!({"results": found.results, "timed_out": found.timed_out});
    // Only when it happened, so answers match the reference server's shape otherwise.
    if found.truncated {
        answer["truncated"] = json!(true);
    }
    Ok(Response::ok(&answer))
}
