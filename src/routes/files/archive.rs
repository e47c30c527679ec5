//! `POST /files/archive`.

use serde_json::Value;

use crate::api::ApiError;
use crate::app::Call;
use crate::fs::archive::{self, Format, Limits};
use crate::http::{Response, JSON_CONTENT_TYPE};
use crate::routes::shared::fs_error;
use crate::runtime::{blocking, push_base64};

pub const MAX_FILES: usize = 10_000;
pub const MAX_BYTES: u64 = 100 * 1024 * 1024;

/// The refusal for `paths` that is not a non-empty list of non-empty strings.
pub const PATHS_INVALID: &str = "paths must be a non-empty list of path strings";

pub async fn archive(call: Call) -> Result<Response, ApiError> {
    // `format` is read after the member roots are confined, as before the fields were
    // declared: a refused path is reported before a bad format.
    let mut args = call.args_of(&call.params_named(&["paths"]))?;
    let not_a_list = || ApiError::bad_request(PATHS_INVALID);
    let inputs: Vec<String> = match args.take("paths") {
        Some(Value::Array(items)) if !items.is_empty() => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) if !s.is_empty() => Ok(s),
                _ => Err(not_a_list()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(not_a_list()),
    };
    // Each member root passes the same checks as any file route's path, and is named
    // as that check resolved it (relative to the policy's allowed directory, if any).
    let mut confined = Vec::with_capacity(inputs.len());
    for input in &inputs {
        confined.push(
            crate::routes::shared::confine_followed(&call, input)
                .await?
                .display(),
        );
    }
    let inputs: Vec<String> = confined;
    let hidden = crate::routes::shared::hidden_by_policy(&call);
    let args = call.args_of(&call.params_named(&["format"]))?;
    let name = args.str("format").unwrap_or_default();
    let format = Format::parse(name).ok_or_else(|| {
        ApiError::bad_request(format!("Unsupported format: '{name}' (use tar.gz or zip)"))
    })?;
    let base = call.services().base.clone();
    // A policy can lower the built-in limits, never raise them.
    let decision = call.decision();
    let limits = Limits {
        max_files: decision
            .knob_u64("max_files")
            .map_or(MAX_FILES, |cap| (cap as usize).min(MAX_FILES)),
        max_bytes: decision
            .knob_u64("max_bytes")
            .map_or(MAX_BYTES, |cap| cap.min(MAX_BYTES)),
    };
    let body = blocking(move || -> Result<Vec<u8>, ApiError> {
        let data = archive::build(&base, &inputs, format, limits, hidden).map_err(fs_error)?;
        let suffix = format!(
            "\",\"format\":\"{}\",\"bytes\":{}}}",
            format.name(),
            data.len()
        );
        let mut out = b"{\"content_base64\":\"".to_vec();
        push_base64(&mut out, &data, suffix.len());
        out.extend_from_slice(suffix.as_bytes());
        Ok(out)
    })
    .await
    .map_err(|e| ApiError::internal("RuntimeError", e.to_string()))??;
    Ok(Response::raw(200, JSON_CONTENT_TYPE, body))
}
