//! The one place an operating-system error becomes the contract's answer: the Python
//! exception the same failure raises in the reference server (`FileNotFoundError`,
//! `PermissionError`, ...), which clients match on in `type`.

use super::error::ApiError;

/// The Python exception class `OSError(errno)` is raised as.
pub fn python_exception(errno: Option<i32>) -> &'static str {
    use rustix::io::Errno;
    match errno.map(Errno::from_raw_os_error) {
        Some(Errno::NOENT) => "FileNotFoundError",
        Some(Errno::EXIST) => "FileExistsError",
        Some(Errno::NOTDIR) => "NotADirectoryError",
        Some(Errno::ISDIR) => "IsADirectoryError",
        Some(Errno::ACCESS) | Some(Errno::PERM) => "PermissionError",
        Some(Errno::INTR) => "InterruptedError",
        Some(Errno::TIMEDOUT) => "TimeoutError",
        Some(Errno::CHILD) => "ChildProcessError",
        Some(Errno::PIPE) => "BrokenPipeError",
        Some(Errno::CONNREFUSED) => "ConnectionRefusedError",
        Some(Errno::CONNRESET) => "ConnectionResetError",
        Some(Errno::AGAIN) => "BlockingIOError",
        _ => "OSError",
    }
}

/// The machine-readable `code` of an operating-system error that clients act on
/// without parsing the message: a full disk (ENOSPC) or a spent quota (EDQUOT) is
/// `no_space`, which freeing space cures.
pub fn os_error_code(errno: Option<i32>) -> Option<&'static str> {
    match errno {
        Some(libc::ENOSPC | libc::EDQUOT) => Some("no_space"),
        _ => None,
    }
}

/// A 500 named like the Python exception, with the path it concerned when there is one
/// (`[Errno 2] No such file or directory: '/home/user/x'` reads the same way).
pub fn os_error(error: &std::io::Error, path: Option<&str>) -> ApiError {
    let kind = python_exception(error.raw_os_error());
    let mut api = match path {
        Some(path) => ApiError::internal(kind, format!("{error}: '{path}'")),
        None => ApiError::internal(kind, error.to_string()),
    };
    api.code = os_error_code(error.raw_os_error());
    api
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_python() {
        assert_eq!(python_exception(Some(2)), "FileNotFoundError");
        assert_eq!(python_exception(Some(13)), "PermissionError");
        assert_eq!(python_exception(Some(21)), "IsADirectoryError");
        assert_eq!(python_exception(None), "OSError");
        let error = os_error(&std::io::Error::from_raw_os_error(20), Some("/a"));
        assert_eq!(
            (error.status, error.kind.as_ref()),
            (500, "NotADirectoryError")
        );
        assert!(error.message.ends_with(": '/a'"));
        assert_eq!(error.code, None);
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let full = os_error(&std::io::Error::from_raw_os_error(errno), Some("/a"));
            assert_eq!((full.status, full.code), (500, Some("no_space")));
            assert_eq!(full.kind.as_ref(), "OSError");
        }
    }
}
