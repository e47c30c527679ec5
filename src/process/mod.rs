//! Child processes: the one place the server spawns, reaps and kills. Every group that
//! runs programs (process, commands, system, dev_tools, terminal, agents) goes through
//! here.
//!
//! - [`shlex`]: the command string to argv, as Python's `shlex.split`.
//! - [`spawn`]: the `posix_spawn` call itself, the only unsafe code on the way.
//! - [`child`]: spawn (own process group, chosen stdio only), wait on a pidfd on the
//!   worker's driver, kill the group; dropping an unfinished child kills and reaps it.
//! - [`pipe`] and [`run`]: pipes read and written on the worker's driver, as text.
//! - [`table`] and [`output`]: background processes and their captured output.
//! - [`env`]: the shared environment view children start with.
//! - [`registry`] ([`ChildRegistry`]): every live group, including groups whose leader
//!   has exited ([`group`]), so shutdown can end them all; the reaper of orphans
//!   re-parented to a PID-1 server. [`procfs`]: what `/proc` says about processes.
//! - [`tree`]: a child and every descendant, whatever session each put itself in.
//! - [`guardian`]: the process that ends every recorded group if the server dies.

pub mod child;
pub mod env;
pub mod followers;
pub mod group;
pub mod guardian;
pub mod output;
pub mod pipe;
pub mod procfs;
pub mod registry;
pub mod run;
pub mod secrets;
pub mod shlex;
pub mod spawn;
pub mod table;
pub mod tree;

pub use child::{Child, ExitCode, Spawn};
pub use env::Environment;
pub use procfs::processes;
pub use registry::ChildRegistry;
pub use table::ProcessTable;
