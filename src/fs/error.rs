//! What file operations report, before any route words it: the route adapters turn an
//! [`FsError`] into the contract's status, message and Python exception name.

use std::io;
use std::path::PathBuf;

/// A file operation's failure.
#[derive(Debug)]
pub enum FsError {
    /// The caller's path leaves the allowed directories (lexically, or through a symlink).
    NotAllowed { input: String, base: PathBuf },
    /// The caller's input cannot name anything (a NUL byte, the base where a file is
    /// needed).
    Invalid(String),
    /// Nothing of the needed kind is there; the message names what and where.
    NotFound(String),
    /// The operation would remove or move the base directory itself.
    BaseDirectory { input: String, base: PathBuf },
    /// More members than an archive may hold.
    TooManyFiles { limit: usize },
    /// An archive grew past its byte cap.
    TooLarge { limit: u64 },
    /// The operating system refused; `path` is what it concerned.
    Io { error: io::Error, path: String },
    /// An operating-system condition worded the way Python words it (`Is a directory:
    /// '<path>'`), with the errno that names its exception type.
    Os { errno: i32, message: String },
}

impl FsError {
    /// Wraps an OS error with the path it concerned.
    pub fn io(error: io::Error, path: impl Into<String>) -> FsError {
        FsError::Io {
            error,
            path: path.into(),
        }
    }
}

impl std::fmt::Display for FsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsError::NotAllowed { input, base } => write!(
                f,
                "Path '{input}' is outside the allowed directories ({}); use a path beneath it",
                base.display()
            ),
            FsError::Invalid(message) | FsError::NotFound(message) => f.write_str(message),
            FsError::BaseDirectory { input, base } => write!(
                f,
                "Path '{input}' is the base directory ({}), which cannot be deleted or moved",
                base.display()
            ),
            FsError::TooManyFiles { limit } => {
                write!(f, "Too many files: more than {limit} in one archive")
            }
            FsError::TooLarge { limit } => write!(f, "Archive too large: over {limit} bytes"),
            FsError::Io { error, path } => write!(f, "{error}: '{path}'"),
            FsError::Os { message, .. } => f.write_str(message),
        }
    }
}

impl std::error::Error for FsError {}
