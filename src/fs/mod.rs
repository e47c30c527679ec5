//! Files: confinement of caller paths beneath the base directory, and data I/O that never
//! blocks a worker.

pub mod aio;
pub mod archive;
pub mod confine;
pub mod fnmatch;
pub mod resolve;
pub mod watch;
pub mod write;
