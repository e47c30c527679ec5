//! `POST /v1/files`: a `purpose=user_data` upload kept for `file_id` references
//! (`crate::agents::files`). The body is JSON with the contents in base64 (`data`,
//! or `file`), or `multipart/form-data` with the bytes in the part `file` (what the
//! OpenAI SDK's `files.create` sends), as the reference takes both.

use serde_json::{Map, Value};

use super::{agents_of, route};
use crate::agents::files;
use crate::api::{ApiError, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::{multipart, Response};

pub fn endpoints() -> Vec<Endpoint> {
    vec![route(
        Method::Post,
        "/v1/files",
        "agents_files_create",
        "Keep a user_data file for file_id references (environment files).",
        handler(create),
    )
    // Read whole by the handler: a 10 MiB file is 13.3 MiB of base64.
    .json_or_multipart()
    .params(&[
        Param::body("purpose", "string", true).doc("user_data, the only purpose here."),
        Param::body("data", "string", false).doc("The contents, standard base64 (ABX_AGENTS_MAX_FILE_BYTES decoded bytes at most, 10 MiB by default)."),
        Param::body("file", "string", false).doc("The same as data."),
        Param::body("filename", "string", false).doc("Up to 255 characters; upload by default."),
    ])]
}

async fn create(call: Call) -> Result<Response, ApiError> {
    let body: Map<String, Value> = match call.header("content-type").and_then(multipart::boundary) {
        Some(boundary) => form_fields(&boundary, &call.body)?,
        None => call.json()?,
    };
    let upload = files::from_json(&body)?;
    let object = files::create(&agents_of(&call)?, &call.identity.id, upload).await?;
    Ok(Response::ok(&object))
}

/// The parts of a multipart body as the JSON form's fields: text parts as strings, the
/// `file` part's bytes as `data` in base64 (and its filename as `filename` unless a
/// part names one), so both forms are checked by the same rules.
fn form_fields(boundary: &str, body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let bad = |why: String| ApiError::bad_request(format!("Invalid multipart body: {why}"));
    let mut scanner = multipart::Scanner::new(boundary);
    let events = scanner.feed(body).map_err(|e| bad(e.0))?;
    if !scanner.is_done() {
        return Err(bad("it ends before its closing boundary".into()));
    }
    let mut parts: Vec<(String, Option<String>, Vec<u8>)> = Vec::new();
    for event in events {
        match event {
            multipart::Event::Part { name, filename } => {
                parts.push((name.unwrap_or_default(), filename, Vec::new()))
            }
            multipart::Event::Data(bytes) => {
                if let Some((_, _, data)) = parts.last_mut() {
                    data.extend_from_slice(&bytes);
                }
            }
            _ => {}
        }
    }
    let mut fields = Map::new();
    let mut file_name = None;
    for (name, filename, data) in parts {
        if name == "file" {
            file_name = filename;
            fields.insert(
                "data".into(),
                Value::String(base64_simd::STANDARD.encode_to_string(&data)),
            );
        } else {
            fields.insert(
                name,
                Value::String(String::from_utf8_lossy(&data).into_owned()),
            );
        }
    }
    if let Some(file_name) = file_name {
        fields.entry("filename").or_insert(Value::String(file_name));
    }
    Ok(fields)
}
