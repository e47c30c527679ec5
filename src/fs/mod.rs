//! Files: confinement of caller paths beneath the base directory, and data I/O that never
//! blocks a worker.

pub mod aio;
pub mod confine;
pub mod resolve;
