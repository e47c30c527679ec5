//! `POST /v1/files`: a `purpose=user_data` upload kept for `file_id` references
//! (`crate::agents::files`). The body is JSON with the contents in base64 (`data`,
//! or `file`), as the reference's JSON form takes it.

use serde_json::{Map, Value};

use super::{agents_of, route};
use crate::agents::files;
use crate::api::{ApiError, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;

pub fn endpoints() -> Vec<Endpoint> {
    vec![route(
        Method::Post,
        "/v1/files",
        "agents_files_create",
        "Keep a user_data file for file_id references (environment files).",
        handler(create),
    )
    // Read whole by the handler: a 10 MiB file is 13.3 MiB of base64.
    .whole_json()
    .params(&[
        Param::body("purpose", "string", true).doc("user_data, the only purpose here."),
        Param::body("data", "string", false).doc("The contents, standard base64 (ABX_AGENTS_MAX_FILE_BYTES decoded bytes at most, 10 MiB by default)."),
        Param::body("file", "string", false).doc("The same as data."),
        Param::body("filename", "string", false).doc("Up to 255 characters; upload by default."),
    ])]
}

async fn create(call: Call) -> Result<Response, ApiError> {
    let body: Map<String, Value> = call.json()?;
    let upload = files::from_json(&body)?;
    let object = files::create(&agents_of(&call)?, &call.identity.id, upload).await?;
    Ok(Response::ok(&object))
}
