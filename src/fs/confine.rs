//! Caller paths are untrusted. This module answers, without touching the disk, whether a
//! path names something beneath the base directory once `.` and `..` are resolved; the
//! file routes add `openat2(RESOLVE_BENEATH)` on top so symlinks cannot escape either.

use std::path::{Component, Path, PathBuf};

use crate::error::ApiError;

/// Resolves `input` (absolute, or relative to `base`) lexically and checks that it stays
/// within `base`. Returns the absolute, normalised path.
pub fn lexical(base: &Path, input: &str) -> Result<PathBuf, ApiError> {
    if input.contains('\0') {
        return Err(ApiError::bad_request("Path contains a NUL byte"));
    }
    let joined = if input.starts_with('/') {
        PathBuf::from(input)
    } else {
        base.join(input)
    };
    let mut normal = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            Component::ParentDir => {
                normal.pop();
            }
            Component::Normal(part) => normal.push(part),
        }
    }
    if normal.starts_with(base) {
        Ok(normal)
    } else {
        Err(path_not_allowed(input, base))
    }
}

/// The contract's 403 for a path outside the allowed directories.
pub fn path_not_allowed(input: &str, base: &Path) -> ApiError {
    ApiError::new(
        403,
        "PermissionError",
        format!(
            "Path '{input}' is outside the allowed directories ({}); use a path beneath it",
            base.display()
        ),
    )
    .with_code("path_not_allowed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confinement_is_lexical() {
        let base = Path::new("/home/user");
        assert_eq!(
            lexical(base, "/home/user/a.txt").unwrap(),
            PathBuf::from("/home/user/a.txt")
        );
        assert_eq!(
            lexical(base, "a/../b").unwrap(),
            PathBuf::from("/home/user/b")
        );
        assert_eq!(lexical(base, ".").unwrap(), PathBuf::from("/home/user"));
        assert_eq!(
            lexical(base, "/home/user/").unwrap(),
            PathBuf::from("/home/user")
        );
        assert_eq!(
            lexical(base, "../user2").unwrap_err().code,
            Some("path_not_allowed")
        );
        assert!(lexical(base, "/etc/passwd").is_err());
        assert!(lexical(base, "/home/user/../../etc").is_err());
        assert!(lexical(base, "/home/username").is_err());
        assert_eq!(lexical(base, "a\0b").unwrap_err().status, 400);
    }
}
