//! `filesystem.Filesystem`'s unary calls: Stat, MakeDir, Move, ListDir, Remove. Paths
//! are confined as the file routes confine them (beneath the base directory and the
//! endpoint's `paths` rule); a relative path is resolved against the base directory.

use crate::api::ApiError;
use crate::app::Call;
use crate::envd::proto::filesystem::{
    EntryResponse, ListDirRequest, ListDirResponse, MoveRequest, PathRequest,
};
use crate::envd::proto::process::Empty;
use crate::fs::FsError;
use crate::http::connect::Code;
use crate::http::Response;
use crate::routes::shared::{confine_followed, fs_error};

use super::rpc::{self, error};
use super::user;
use crate::envd::users::Account;

/// Most entries one `ListDir` answers with.
const MAX_ENTRIES: usize = 100_000;

/// The caller's path, confined, relative ones against the account's home.
async fn confined(
    call: &Call,
    account: &Account,
    input: &str,
) -> Result<crate::fs::CallerPath, ApiError> {
    if input.is_empty() {
        return Err(error(Code::InvalidArgument, "path must not be empty"));
    }
    let mut caller = confine_followed(call, &user::rooted(call, account, input)).await?;
    caller.input = input.to_string();
    Ok(caller)
}

async fn entry_at(call: &Call, caller: crate::fs::CallerPath) -> Result<EntryResponse, ApiError> {
    let shown = caller.display();
    match crate::envd::files::stat(&call.services().base, caller)
        .await
        .map_err(fs_error)?
    {
        Some(entry) => Ok(EntryResponse { entry: Some(entry) }),
        None => Err(error(
            Code::NotFound,
            format!("path '{shown}' does not exist"),
        )),
    }
}

/// `Stat`.
pub async fn stat(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<PathRequest>(&mut call, false)?;
    let account = user::account(&call).await?;
    let caller = confined(&call, &account, &request.path).await?;
    Ok(rpc::unary(ct, &entry_at(&call, caller).await?))
}

/// `MakeDir`: the directory and its missing parents; `already_exists` when it is there.
pub async fn make_dir(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<PathRequest>(&mut call, false)?;
    let account = user::account(&call).await?;
    let caller = confined(&call, &account, &request.path).await?;
    let base = &call.services().base;
    if let Some(found) = crate::fs::tree::stat(base, &caller)
        .await
        .map_err(fs_error)?
    {
        let what = if crate::fs::resolve::kind_of(&found) == crate::fs::resolve::Kind::Directory {
            "directory"
        } else {
            "file"
        };
        return Err(error(
            Code::AlreadyExists,
            format!("a {what} already exists at '{}'", caller.display()),
        ));
    }
    // The directories this call creates, deepest last, to hand to the account.
    let mut created = vec![caller.clone()];
    let mut above = caller.clone();
    while let Some(parent) = above.rel.parent().filter(|p| !p.as_os_str().is_empty()) {
        above = crate::fs::CallerPath {
            shown: above
                .shown
                .parent()
                .map(|p| p.to_path_buf())
                .unwrap_or_default(),
            rel: parent.to_path_buf(),
            input: above.input.clone(),
        };
        if crate::fs::tree::stat(base, &above)
            .await
            .map_err(fs_error)?
            .is_some()
        {
            break;
        }
        created.push(above.clone());
    }
    crate::fs::tree::mkdir(base, caller.clone())
        .await
        .map_err(fs_error)?;
    if user::hands_over(&account) {
        for dir in created.into_iter().rev() {
            crate::envd::files::give_to(base, dir, account.uid, account.gid)
                .await
                .map_err(fs_error)?;
        }
    }
    Ok(rpc::unary(ct, &entry_at(&call, caller).await?))
}

/// `Move`: renames, making the destination's missing parents.
pub async fn move_path(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<MoveRequest>(&mut call, false)?;
    let account = user::account(&call).await?;
    let source = confined(&call, &account, &request.source).await?;
    let destination = confined(&call, &account, &request.destination).await?;
    let base = &call.services().base;
    if crate::fs::tree::stat(base, &source)
        .await
        .map_err(fs_error)?
        .is_none()
    {
        return Err(error(
            Code::NotFound,
            format!("source '{}' does not exist", source.display()),
        ));
    }
    if !destination.parent_rel().as_os_str().is_empty() {
        let parent = crate::fs::CallerPath {
            shown: destination
                .shown
                .parent()
                .map(|p| p.to_path_buf())
                .unwrap_or_default(),
            rel: destination.parent_rel().to_path_buf(),
            input: destination.input.clone(),
        };
        crate::fs::tree::mkdir(base, parent)
            .await
            .map_err(fs_error)?;
    }
    let moved = crate::fs::tree::move_path(base, source, destination)
        .await
        .map_err(fs_error)?;
    Ok(rpc::unary(ct, &entry_at(&call, moved).await?))
}

/// `ListDir`: `depth` levels (0 counts as 1), each entry with its absolute path.
pub async fn list_dir(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<ListDirRequest>(&mut call, false)?;
    let account = user::account(&call).await?;
    let caller = confined(&call, &account, &request.path).await?;
    let depth = request.depth.max(1) as usize;
    let shown = caller.display();
    let entries =
        match crate::envd::files::list(&call.services().base, caller, depth, MAX_ENTRIES).await {
            Ok(entries) => entries,
            Err(FsError::NotFound(_)) => {
                return Err(error(
                    Code::NotFound,
                    format!("directory '{shown}' does not exist"),
                ))
            }
            Err(FsError::Io { error: e, .. }) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                return Err(error(
                    Code::InvalidArgument,
                    format!("'{shown}' is not a directory"),
                ))
            }
            Err(e) => return Err(fs_error(e)),
        };
    Ok(rpc::unary(ct, &ListDirResponse { entries }))
}

/// `Remove`: a file, or a directory with everything in it.
pub async fn remove(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<PathRequest>(&mut call, false)?;
    let account = user::account(&call).await?;
    let caller = confined(&call, &account, &request.path).await?;
    let shown = caller.display();
    match crate::fs::tree::delete(&call.services().base, caller).await {
        Ok(()) => Ok(rpc::unary(ct, &Empty {})),
        Err(FsError::NotFound(_)) => Err(error(
            Code::NotFound,
            format!("path '{shown}' does not exist"),
        )),
        Err(e) => Err(fs_error(e)),
    }
}
