//! Files, as domain code with no HTTP in it: the confinement object ([`BaseDir`]), race-free
//! resolution beneath it (`resolve`), the one tree walk (`walk`), and the operations the
//! file routes adapt: reads, atomic writes, tree operations, archives and watches. Each
//! reports an [`FsError`]; the routes word it for the caller.

pub mod archive;
pub mod base;
pub mod error;
pub mod fnmatch;
pub mod read;
pub mod resolve;
pub mod tree;
pub mod upload_body;
pub mod walk;
pub mod watch;
pub mod write;
pub mod zip;

pub use base::{BaseDir, CallerPath};
pub use error::FsError;
