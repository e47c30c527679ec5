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
//! - [`ChildRegistry`]: every live group, so shutdown can end them all.

pub mod child;
pub mod env;
pub mod output;
pub mod pipe;
pub mod run;
pub mod shlex;
pub mod spawn;
pub mod table;

pub use child::{Child, Spawn};
pub use env::Environment;
pub use table::ProcessTable;

use std::collections::HashSet;
use std::sync::Mutex;

/// Process-group ids of live children, shared by every thread.
#[derive(Default)]
pub struct ChildRegistry {
    groups: Mutex<HashSet<i32>>,
}

impl ChildRegistry {
    /// Records a child started with `setpgid(0, 0)`, whose group id is its pid.
    pub fn register(&self, pgid: i32) {
        self.lock().insert(pgid);
    }

    /// Forgets a group once its leader has been reaped.
    pub fn unregister(&self, pgid: i32) {
        self.lock().remove(&pgid);
    }

    /// Sends `signal` to every registered group and returns how many there were.
    pub fn signal_all(&self, signal: nix::sys::signal::Signal) -> usize {
        let groups: Vec<i32> = self.lock().iter().copied().collect();
        for pgid in &groups {
            // The group may have exited since; ESRCH is expected and harmless.
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(*pgid), signal);
        }
        groups.len()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<i32>> {
        // A panic while holding this lock cannot leave the set inconsistent.
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn signal_all_ends_registered_groups() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let registry = ChildRegistry::default();
        registry.register(child.id() as i32);
        assert_eq!(registry.signal_all(nix::sys::signal::Signal::SIGTERM), 1);
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(15));
        registry.unregister(child.id() as i32);
        assert!(registry.is_empty());
    }
}
