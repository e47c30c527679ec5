//! `POST /v1/files` (`purpose=user_data`): bytes a caller uploads once and then names by
//! `file_id` where the Agents API takes a file (an environment's files). A file is a
//! record of its owner in the agents store, so it outlives a restart like the
//! caller's other objects (the reference keeps them in memory); another identity's id
//! is refused exactly like an unknown one.
//!
//! The bytes are kept as their standard base64, which is what the workspace writer
//! takes (`environments::Workspace::write`), so using a file costs no re-encoding.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::error::AgentError;
use super::objects::{label, now_unix, Object};
use super::records::{new_id, Collection, Record, Scope, StoreError, Transaction};
use super::surface::Agents;

/// The reference's default cap of one file (`ABX_AGENTS_MAX_FILE_BYTES`).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;

/// Files one identity keeps (their bytes count toward the store's per-identity bytes).
pub const MAX_FILES_PER_OWNER: usize = 1_000;

pub static FILES: Collection = Collection {
    name: "file",
    parent: None,
    max_total: 100_000,
    max_per_owner: MAX_FILES_PER_OWNER,
    evicts: false,
};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Blob {
    pub id: String,
    pub created_at: u64,
    pub filename: String,
    pub bytes: u64,
    /// The contents, standard base64.
    pub data: String,
}

impl Record for Blob {
    fn collection() -> &'static Collection {
        &FILES
    }
    fn id(&self) -> &str {
        &self.id
    }
}

impl Object for Blob {
    fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": "user_data",
            "status": "processed",
            "expires_at": null,
            "x_agent_sandbox": label("local_state", &["local_blob"]),
        })
    }
}

/// `ABX_AGENTS_MAX_FILE_BYTES` (a positive integer), else 10 MiB.
pub fn max_file_bytes() -> u64 {
    std::env::var("ABX_AGENTS_MAX_FILE_BYTES")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|v| *v > 0)
        .unwrap_or(DEFAULT_MAX_FILE_BYTES)
}

fn refused(param: &str, code: &'static str, message: String) -> AgentError {
    AgentError::Rejected {
        status: 400,
        code,
        param: Some(param.to_string()),
        message,
    }
}

fn too_large(param: &str, limit: u64) -> AgentError {
    refused(
        param,
        "agents.file_too_large",
        format!("{param}: larger than {limit} bytes"),
    )
}

/// An upload's checked fields.
pub struct Upload {
    pub filename: Option<Value>,
    /// Standard base64 of the contents.
    pub data: String,
    pub bytes: u64,
}

/// Checks a JSON body as the reference does: only `purpose`, `filename`, `data`,
/// `file`; `data` (or `file`) strict standard base64 within the cap.
pub fn from_json(body: &Map<String, Value>) -> Result<Upload, AgentError> {
    if let Some(key) = body
        .keys()
        .find(|k| !["purpose", "filename", "data", "file"].contains(&k.as_str()))
    {
        return Err(refused(
            key,
            "invalid_request",
            format!("{key}: unknown or unsupported parameter"),
        ));
    }
    check_purpose(body.get("purpose"))?;
    let raw = body.get("data").or_else(|| body.get("file"));
    let Some(Value::String(data)) = raw else {
        return Err(refused(
            "data",
            "invalid_request",
            "data: expected a base64 string".into(),
        ));
    };
    let limit = max_file_bytes();
    if data.len() as u64 > limit * 4 / 3 + 8 {
        return Err(too_large("data", limit));
    }
    let decoded = base64_simd::STANDARD
        .decode_to_vec(data.as_bytes())
        .map_err(|_| refused("data", "invalid_request", "data: invalid base64".into()))?;
    if decoded.len() as u64 > limit {
        return Err(too_large("data", limit));
    }
    Ok(Upload {
        filename: body.get("filename").cloned(),
        data: data.clone(),
        bytes: decoded.len() as u64,
    })
}

fn check_purpose(purpose: Option<&Value>) -> Result<(), AgentError> {
    if purpose.and_then(Value::as_str) != Some("user_data") {
        return Err(refused(
            "purpose",
            "invalid_request",
            "purpose: only user_data is supported".into(),
        ));
    }
    Ok(())
}

/// Stores an upload; answers the `file` object.
pub async fn create(
    agents: &Arc<Agents>,
    owner: &str,
    upload: Upload,
) -> Result<Value, AgentError> {
    let filename = match &upload.filename {
        None | Some(Value::Null) => "upload".to_string(),
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= 255 => s.clone(),
        Some(Value::String(s)) if s.is_empty() => "upload".to_string(),
        Some(_) => {
            return Err(refused(
                "filename",
                "invalid_request",
                "filename: expected a string up to 255 characters".into(),
            ))
        }
    };
    let blob = Blob {
        id: new_id("file-")[..5 + 24].to_string(),
        created_at: now_unix(),
        filename,
        bytes: upload.bytes,
        data: upload.data,
    };
    let object = blob.object();
    let (owner, id) = (owner.to_string(), blob.id.clone());
    agents
        .transact(move |t| {
            t.create(Scope::owner(&owner), blob)
                .map_err(AgentError::store("file", &id, "data"))
        })
        .await?;
    Ok(object)
}

/// The base64 contents of `owner`'s file `file_id`; an unknown or foreign id is the
/// reference's 400 `agents.file_not_found`, naming `param`.
pub async fn contents(
    agents: &Arc<Agents>,
    owner: &str,
    file_id: &str,
    param: &str,
) -> Result<String, AgentError> {
    let (owner, id) = (owner.to_string(), file_id.to_string());
    let found = agents
        .transact(move |t| t.get::<Blob>(Scope::owner(&owner), &id))
        .await;
    match found {
        Ok(blob) => Ok(blob.data),
        Err(StoreError::NotFound) => Err(refused(
            param,
            "agents.file_not_found",
            format!("{param}: this server did not mint that file id; upload it with POST /v1/files and purpose=user_data"),
        )),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_uploads_are_checked_as_the_reference_does() {
        let body = |v: Value| v.as_object().unwrap().clone();
        let ok = from_json(&body(json!({"purpose": "user_data", "data": "aGk="}))).unwrap();
        assert_eq!((ok.bytes, ok.data.as_str()), (2, "aGk="));
        let code = |v: Value| match from_json(&body(v)) {
            Err(AgentError::Rejected { code, param, .. }) => (code, param.unwrap()),
            _ => panic!("accepted"),
        };
        assert_eq!(
            code(json!({"purpose": "assistants", "data": "aGk="})),
            ("invalid_request", "purpose".into())
        );
        assert_eq!(
            code(json!({"purpose": "user_data", "data": "!!"})),
            ("invalid_request", "data".into())
        );
        assert_eq!(
            code(json!({"purpose": "user_data", "data": "aGk=", "x": 1})),
            ("invalid_request", "x".into())
        );
    }
}
