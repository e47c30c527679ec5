//! `POST /files/search`.

use std::time::Duration;

use serde_json::json;

use super::{named_path, take_string};
use crate::api::ApiError;
use crate::app::Call;
use crate::fs::tree;
use crate::http::Response;
use crate::routes::shared::{confine_followed, fs_error};

pub const DEFAULT_DEPTH: i64 = 5;
pub const DEFAULT_RESULTS: i64 = 100;
pub const TIME_LIMIT: Duration = Duration::from_secs(10);
/// Most results one search returns, whatever `max_results` asks for: each result is
/// held in memory until the answer is written.
pub const MAX_RESULTS: i64 = 10_000;

pub async fn search(call: Call) -> Result<Response, ApiError> {
    let mut args = call.args()?;
    let base = &call.services().base;
    let input = named_path(&mut args, "path")?;
    let pattern = take_string(&mut args, "pattern");
    let max_depth = args.int("max_depth").unwrap_or(DEFAULT_DEPTH);
    let max_results = args.int("max_results").unwrap_or(DEFAULT_RESULTS);
    let root = confine_followed(&call, &input).await?;
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
        crate::routes::shared::hidden_by_policy(&call),
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
