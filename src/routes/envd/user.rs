//! The Unix account an envd call runs as (`envd::users`), and the caller paths that
//! resolve against its home.

use crate::api::ApiError;
use crate::app::Call;
use crate::envd::users::{self, Account, UserError};

/// The account this call runs as: the one its `Authorization: Basic` (or, on `/files`,
/// `username=`) names, else the default.
pub async fn account(call: &Call) -> Result<Account, ApiError> {
    account_named(call, None).await
}

/// [`account`], with a user the request's body names first (`/files/compose`).
pub async fn account_named(call: &Call, named: Option<String>) -> Result<Account, ApiError> {
    let asked = named
        .filter(|u| !u.is_empty())
        .or_else(|| call.header("authorization").and_then(users::basic_user))
        .or_else(|| {
            call.query("username")
                .filter(|u| !u.is_empty())
                .map(str::to_string)
        });
    let default = call.config().envd_default_user.clone();
    let resolved = match users::passwd_cached() {
        Some(passwd) => users::resolve_in(&passwd, asked.as_deref(), default.as_deref()),
        None => {
            crate::runtime::blocking(move || users::resolve(asked.as_deref(), default.as_deref()))
                .await
                .map_err(|e| ApiError::internal("OSError", e.to_string()))?
        }
    };
    resolved.map_err(|e| {
        let status = match e {
            UserError::Unknown(_) => 400,
            UserError::NeedsRoot(_) | UserError::Confined { .. } => 403,
        };
        ApiError::new(status, "PermissionError", e.to_string())
    })
}

/// The caller's path as the file routes take it: a relative one resolves against the
/// account's home when that home lies beneath the base directory (envd's rule), else
/// against the base directory, as every route's does.
pub fn rooted(call: &Call, account: &Account, input: &str) -> String {
    if input.starts_with('/') || !account.home.starts_with(call.services().base.path()) {
        return input.to_string();
    }
    account.home.join(input).to_string_lossy().into_owned()
}

/// Whether what this call creates must be handed to the account (the server runs as
/// another user, root).
pub fn hands_over(account: &Account) -> bool {
    account.uid != rustix::process::geteuid().as_raw()
}
