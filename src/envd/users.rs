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

/// Where the accounts are.
const PASSWD: &str = "/etc/passwd";
/// The largest `/etc/passwd` [`passwd_cached`] reads on a worker; a larger one is read on
/// the pool.
const CACHED_PASSWD_BYTES: u64 = 256 * 1024;

/// `/etc/passwd` from the kernel's caches only: opened with `RESOLVE_CACHED` and read with
/// `RWF_NOWAIT`, so it never waits for a disk and may run on a worker (every envd call
/// resolves its account, and a trip to the blocking pool for it cost more than the rest
/// of a small write). Read afresh on every call: an account added a moment ago is there.
/// `None`: some of it was not cached, it changed size while read, or it could not be
/// opened; [`resolve`] on the pool decides as it always did.
pub fn passwd_cached() -> Option<String> {
    cached_text(PASSWD, CACHED_PASSWD_BYTES)
}

/// The text of the regular file at `path` if it is at most `limit` bytes and the kernel
/// can open and read it from its caches alone (see [`passwd_cached`]).
fn cached_text(path: &str, limit: u64) -> Option<String> {
    let fd = rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NONBLOCK,
        rustix::fs::Mode::empty(),
        rustix::fs::ResolveFlags::CACHED,
    )
    .ok()?;
    let stat = rustix::fs::fstat(&fd).ok()?;
    let size = stat.st_size as u64;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile
        || size > limit
    {
        return None;
    }
    // One byte of slack shows whether the file grew since fstat.
    let data =
        crate::runtime::AsyncFile::read_cached(std::os::fd::AsFd::as_fd(&fd), size as usize)?;
    if data.len() as u64 != size {
        return None;
    }
    String::from_utf8(data).ok()
}

/// The account a call runs as (see the module). Blocking: reads `/etc/passwd`.
pub fn resolve(asked: Option<&str>, default: Option<&str>) -> Result<Account, UserError> {
    resolve_in(
        &std::fs::read_to_string(PASSWD).unwrap_or_default(),
        asked,
        default,
    )
}

/// [`resolve`] against `passwd`, the text of `/etc/passwd`.
pub fn resolve_in(
    passwd: &str,
    asked: Option<&str>,
    default: Option<&str>,
) -> Result<Account, UserError> {
    let accounts = parse(passwd);
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
    fn cached_reads_give_the_file_or_nothing() {
        let dir = std::env::temp_dir().join(format!("abx-users-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("passwd");
        let text = "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/sh\n";
        std::fs::write(&file, text).unwrap();
        let path = file.to_str().unwrap();
        // Just written, so in the caches: read on the spot.
        assert_eq!(cached_text(path, 1024).as_deref(), Some(text));
        // Over the limit, a directory, or missing: left to the pool.
        assert_eq!(cached_text(path, text.len() as u64 - 1), None);
        assert_eq!(cached_text(dir.to_str().unwrap(), 1024), None);
        assert_eq!(cached_text(dir.join("none").to_str().unwrap(), 1024), None);
        // The machine's own file: the same text either way.
        if let Some(cached) = passwd_cached() {
            assert_eq!(cached, std::fs::read_to_string(PASSWD).unwrap());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn accounts_resolve_against_the_text_given() {
        let euid = rustix::process::geteuid().as_raw();
        let egid = rustix::process::getegid().as_raw();
        let passwd = format!("me:x:{euid}:{egid}::/home/me:/bin/sh\n");
        let me = Account {
            name: "me".into(),
            uid: euid,
            gid: egid,
            home: PathBuf::from("/home/me"),
        };
        if crate::process::spawn::child_user().is_none() {
            assert_eq!(resolve_in(&passwd, Some("me"), None), Ok(me.clone()));
            // The default applies when the call names no one (or names an empty user).
            assert_eq!(resolve_in(&passwd, None, Some("me")), Ok(me.clone()));
            assert_eq!(resolve_in(&passwd, Some(""), Some("me")), Ok(me));
        }
        assert_eq!(
            resolve_in(&passwd, Some("root-of-nothing"), Some("me")),
            Err(UserError::Unknown("root-of-nothing".into()))
        );
        assert_eq!(
            resolve_in("", None, Some("gone")),
            Err(UserError::Unknown("gone".into()))
        );
    }

    #[test]
    fn an_unknown_user_is_refused() {
        assert_eq!(
            resolve(Some("no-such-account-here"), None),
            Err(UserError::Unknown("no-such-account-here".into()))
        );
    }
}
