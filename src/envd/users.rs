//! Who an envd call runs as. envd runs each call as a Unix user: the one the caller
//! names (the SDK's `Authorization: Basic <user>:`, or `username=` on `/files`), else
//! the sandbox's default (`ABX_ENVD_DEFAULT_USER`, else `user` where that account
//! exists, as in E2B's templates, else the server's own user). A user other than the
//! server's needs the server to run as root, and under `ABX_CHILD_USER` no call may run
//! as anyone else: that setting confines every child.

use std::path::PathBuf;

/// A Unix account from `/etc/passwd`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// Why a call cannot run as the user it names.
#[derive(Debug, PartialEq, Eq)]
pub enum UserError {
    Unknown(String),
    NeedsRoot(String),
    Confined { asked: String, uid: u32 },
}

impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UserError::Unknown(name) => write!(f, "user '{name}' does not exist in this sandbox"),
            UserError::NeedsRoot(name) => write!(
                f,
                "running as user '{name}' needs the server to run as root; name no user, or the server's own"
            ),
            UserError::Confined { asked, uid } => write!(
                f,
                "every program here runs as uid {uid} (ABX_CHILD_USER); user '{asked}' is not allowed"
            ),
        }
    }
}

/// The accounts of `/etc/passwd` text.
fn parse(passwd: &str) -> Vec<Account> {
    passwd
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() < 7 || line.starts_with('#') {
                return None;
            }
            Some(Account {
                name: fields[0].to_string(),
                uid: fields[2].parse().ok()?,
                gid: fields[3].parse().ok()?,
                home: PathBuf::from(fields[5]),
            })
        })
        .collect()
}

/// The account a call runs as (see the module). Blocking: reads `/etc/passwd`.
pub fn resolve(asked: Option<&str>, default: Option<&str>) -> Result<Account, UserError> {
    let accounts = parse(&std::fs::read_to_string("/etc/passwd").unwrap_or_default());
    let euid = rustix::process::geteuid().as_raw();
    let own = || {
        accounts
            .iter()
            .find(|a| a.uid == euid)
            .cloned()
            .unwrap_or_else(|| Account {
                name: euid.to_string(),
                uid: euid,
                gid: rustix::process::getegid().as_raw(),
                home: std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| "/".into()),
            })
    };
    let confined = crate::process::spawn::child_user();
    let account = match asked.filter(|a| !a.is_empty()).or(default) {
        Some(name) => accounts
            .iter()
            .find(|a| a.name == name)
            .cloned()
            .ok_or_else(|| UserError::Unknown(name.to_string()))?,
        // E2B's templates run as `user`; here only where that account exists and this
        // server may become it.
        None => match accounts.iter().find(|a| a.name == "user") {
            Some(user) if (euid == 0 && confined.is_none()) || user.uid == euid => user.clone(),
            _ => own(),
        },
    };
    if let Some((uid, _)) = confined {
        if account.uid != uid && asked.is_some() {
            return Err(UserError::Confined {
                asked: account.name,
                uid,
            });
        }
        if account.uid != uid {
            return Ok(own());
        }
    }
    if account.uid != euid && euid != 0 {
        return Err(UserError::NeedsRoot(account.name));
    }
    Ok(account)
}

/// The user name of `Authorization: Basic base64(<user>:<password>)`, if that is what
/// the header holds.
pub fn basic_user(authorization: &str) -> Option<String> {
    let value = authorization.trim();
    let encoded = value
        .get(..6)
        .filter(|scheme| scheme.eq_ignore_ascii_case("basic "))
        .and_then(|_| value.get(6..))?;
    let decoded = base64_simd::STANDARD
        .decode_to_vec(encoded.trim().as_bytes())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let user = text.split(':').next()?.to_string();
    (!user.is_empty()).then_some(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lines_become_accounts() {
        let accounts = parse("root:x:0:0:root:/root:/bin/bash\n# note\nuser:x:1000:1000::/home/user:/bin/sh\nbad line\n");
        assert_eq!(accounts.len(), 2);
        assert_eq!(accounts[1].name, "user");
        assert_eq!((accounts[1].uid, accounts[1].gid), (1000, 1000));
        assert_eq!(accounts[1].home, PathBuf::from("/home/user"));
    }

    #[test]
    fn the_basic_header_names_the_user() {
        // base64("user:") and base64("root:secret")
        assert_eq!(basic_user("Basic dXNlcjo="), Some("user".into()));
        assert_eq!(basic_user("basic cm9vdDpzZWNyZXQ="), Some("root".into()));
        assert_eq!(basic_user("Bearer token"), None);
        assert_eq!(basic_user("Basic !!!"), None);
    }

    #[test]
    fn an_unknown_user_is_refused() {
        assert_eq!(
            resolve(Some("no-such-account-here"), None),
            Err(UserError::Unknown("no-such-account-here".into()))
        );
    }
}
