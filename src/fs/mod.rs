//! Files: confinement of caller paths beneath the base directory.

pub mod confine;
