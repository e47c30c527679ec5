//! list, stat, mkdir, delete, move.

use serde_json::{json, Value};

use super::{named_path, take_string};
use crate::api::ApiError;
use crate::app::Call;
use crate::fs::resolve::{self, Kind};
use crate::fs::{tree, CallerPath};
use crate::http::{Response, JSON_CONTENT_TYPE};
use crate::routes::shared::{confine, confine_followed, fs_error};
use crate::timefmt::iso8601_utc;

/// `GET /files/list`.
pub async fn list(call: Call) -> Result<Response, ApiError> {
    let mut args = call.args()?;
    let input = take_string(&mut args, "path");
    let recursive = args.flag("recursive");
    let caller = confine_followed(&call, &input).await?;
    // Levels listed: the directory's own entries, and with `recursive` down to
    // LIST_MAX_DEPTH, or the policy's lower max_depth.
    let levels = if recursive {
        call.decision()
            .knob_u64("max_depth")
            .map_or(tree::LIST_MAX_DEPTH, |d| {
                (d as usize).min(tree::LIST_MAX_DEPTH)
            })
    } else {
        1
    };
    let hidden = crate::routes::shared::hidden_by_policy(&call);
    // The caller's `max_entries` (a value that is not a positive whole number is the
    // default, as on the reference), never more than the policy's.
    let asked = args
        .uint("max_entries")
        .filter(|n| *n > 0)
        .map_or(tree::LIST_MAX_ENTRIES, |n| n as usize);
    let max_entries = call
        .decision()
        .knob_u64("max_entries")
        .map_or(asked, |cap| asked.min(cap as usize));
    let body = tree::list_json(&call.services().base, caller, levels, hidden, max_entries)
        .await
        .map_err(fs_error)?;
    Ok(Response::raw(200, JSON_CONTENT_TYPE, body))
}

/// `GET /files/stat`: 200 even when nothing is there.
pub async fn stat(call: Call) -> Result<Response, ApiError> {
    let input = take_string(&mut call.args()?, "path");
    let caller = confine_followed(&call, &input).await?;
    let followed = tree::stat_followed(&call.services().base, caller.clone())
        .await
        .map_err(fs_error)?;
    // Where a link led is checked against the policy as if it had been asked for.
    let reported = match followed.path.rel == caller.rel {
        true => caller,
        false => confine(&call, &followed.path.display())?,
    };
    Ok(Response::ok(&stat_document(
        &reported,
        followed.stat.as_ref(),
    )))
}

fn iso_of(secs: i64, nanos: i64) -> String {
    iso8601_utc(secs, nanos.clamp(0, 999_999_999) as u32)
}

/// The contract's `/files/stat` object; `None` when nothing is at the path.
fn stat_document(caller: &CallerPath, found: Option<&rustix::fs::Stat>) -> Value {
    let shown = caller.display();
    let name = caller
        .shown
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match found {
        None => json!({
            "name": name, "path": shown, "type": "unknown", "size": 0, "permissions": "",
            "modified": "", "accessed": "", "created": "", "exists": false
        }),
        Some(st) => json!({
            "name": name,
            "path": shown,
            "type": match resolve::kind_of(st) { Kind::Directory => "directory", Kind::Symlink => "symlink", _ => "file" },
            "size": st.st_size,
            "permissions": format!("{:03o}", st.st_mode & 0o777),
            "modified": iso_of(st.st_mtime, st.st_mtime_nsec as i64),
            "accessed": iso_of(st.st_atime, st.st_atime_nsec as i64),
            "created": iso_of(st.st_ctime, st.st_ctime_nsec as i64),
            "exists": true,
        }),
    }
}

/// `POST /files/mkdir`.
pub async fn mkdir(call: Call) -> Result<Response, ApiError> {
    let input = named_path(&mut call.args()?, "path")?;
    let caller = confine_followed(&call, &input).await?;
    let shown = caller.display();
    tree::mkdir(&call.services().base, caller)
        .await
        .map_err(fs_error)?;
    Ok(Response::ok(&json!({"path": shown, "created": true})))
}

/// A directory that holds an entry the policy's `paths` rule refuses cannot be
/// deleted or moved as a whole (403 `path_denied`), as on the reference: that would
/// reach what the caller may not touch.
async fn refuse_hidden_inside(call: &Call, caller: &crate::fs::CallerPath) -> Result<(), ApiError> {
    let Some(hidden) = crate::routes::shared::hidden_by_policy(call) else {
        return Ok(());
    };
    if tree::holds_hidden(&call.services().base, caller, hidden)
        .await
        .map_err(fs_error)?
    {
        return Err(ApiError::new(
            403,
            "PolicyDenied",
            format!(
                "Directory '{}' contains entries denied by policy (endpoints.{}.paths)",
                caller.input,
                call.spec().id
            ),
        )
        .with_code("path_denied"));
    }
    Ok(())
}

/// `DELETE /files`.
pub async fn delete(call: Call) -> Result<Response, ApiError> {
    let input = take_string(&mut call.args()?, "path");
    let caller = confine_followed(&call, &input).await?;
    refuse_hidden_inside(&call, &caller).await?;
    let shown = caller.display();
    tree::delete(&call.services().base, caller)
        .await
        .map_err(fs_error)?;
    Ok(Response::ok(&json!({"path": shown, "deleted": true})))
}

/// `POST /files/move`.
pub async fn move_path(call: Call) -> Result<Response, ApiError> {
    let base = &call.services().base;
    let mut callers = Vec::new();
    // Each field is read and confined before the next, so a refused source is reported
    // before a missing destination, as the contract's reference server does.
    for param in &call.spec().params {
        let field = param.name;
        let prefix = |e: ApiError| ApiError {
            message: format!("{field}: {}", e.message),
            ..e
        };
        let mut args = call.args_of(std::slice::from_ref(param))?;
        let input = named_path(&mut args, field).map_err(prefix)?;
        let caller = confine_followed(&call, &input).await.map_err(prefix)?;
        // Into the base directory is fine; moving the base itself away is not.
        if field == "source" {
            tree::refuse_base(base, &caller)
                .map_err(fs_error)
                .map_err(prefix)?;
            refuse_hidden_inside(&call, &caller).await.map_err(prefix)?;
        }
        callers.push(caller);
    }
    let (Some(destination), Some(source)) = (callers.pop(), callers.pop()) else {
        return Err(ApiError::bad_request("source and destination are required"));
    };
    // Into an existing directory, the file lands beneath it: that final path must pass
    // the policy's `paths` rule too.
    if let (Some(name), Ok(Some(st))) = (source.file_name(), tree::stat(base, &destination).await) {
        if rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() {
            let landing = destination.join(name);
            if let Some(refusal) =
                crate::routes::shared::paths_refusal(call.decision(), &call.spec().id, &landing)
            {
                return Err(refusal);
            }
        }
    }
    let source_shown = source.display();
    let moved = tree::move_path(base, source, destination)
        .await
        .map_err(fs_error)?;
    Ok(Response::ok(
        &json!({"source": source_shown, "destination": moved.display()}),
    ))
}
