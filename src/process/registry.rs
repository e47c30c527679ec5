//! Every live process group the server started, so shutdown can end them all, and the
//! reaper of orphans re-parented to a PID-1 server. Its own module, not `process`'s
//! root: [`super::child`] registers each spawn here, and the root re-exports `child`.

use std::collections::HashSet;
use std::io;
use std::sync::Mutex;

use super::procfs::processes;
use super::{group, guardian};

/// Process-group ids of live children, shared by every thread, and the orphan reaper
/// for when the server is a container's PID 1.
#[derive(Default)]
pub struct ChildRegistry {
    state: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    groups: HashSet<i32>,
    /// Groups whose leader has been reaped while members still ran, until they are
    /// found empty.
    leaderless: HashSet<i32>,
    /// Spawns under way: their pids are not registered yet.
    spawning: usize,
}

impl Registry {
    /// Drops leaderless groups that have ended (cheap: two `kill(…, 0)` per group).
    fn prune(&mut self) {
        self.leaderless.retain(|pgid| {
            let alive = group::outlives_leader(*pgid);
            if !alive {
                guardian::forget(*pgid);
            }
            alive
        });
    }
}

impl ChildRegistry {
    /// Runs `spawn` (which returns the new child's pid) and records the child, whose
    /// group id is its pid. While it runs, the orphan reaper leaves every zombie alone,
    /// so it can never take the exit status of a child that is not registered yet.
    pub fn spawn_registered(&self, spawn: impl FnOnce() -> io::Result<i32>) -> io::Result<i32> {
        guardian::ensure_started();
        self.lock().spawning += 1;
        let spawned = spawn();
        let mut state = self.lock();
        state.spawning -= 1;
        if let Ok(pid) = spawned {
            state.groups.insert(pid);
            // A number in the leaderless set cannot be handed out while that group
            // lives; here it was, so that group is gone.
            state.leaderless.remove(&pid);
            guardian::watch(pid);
            state.prune();
        }
        spawned
    }

    /// Records a child started by other means (tests).
    pub fn register(&self, pgid: i32) {
        guardian::ensure_started();
        self.lock().groups.insert(pgid);
        guardian::watch(pgid);
    }

    /// Called once a group's leader has been reaped: the group is kept, as leaderless,
    /// while members still run in it, so a signal to its pid, a timeout and shutdown
    /// can still end them.
    pub fn unregister(&self, pgid: i32) {
        let mut state = self.lock();
        if state.groups.remove(&pgid) {
            if group::outlives_leader(pgid) {
                state.leaderless.insert(pgid);
            } else {
                guardian::forget(pgid);
            }
        }
    }

    /// Sends `signal` to every registered group (leaderless ones included, checked as
    /// [`group`] describes) and returns how many were signalled.
    pub fn signal_all(&self, signal: nix::sys::signal::Signal) -> usize {
        let (groups, leaderless): (Vec<i32>, Vec<i32>) = {
            let state = self.lock();
            (
                state.groups.iter().copied().collect(),
                state.leaderless.iter().copied().collect(),
            )
        };
        for pgid in &groups {
            // The group may have exited since; ESRCH is expected and harmless.
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(*pgid), signal);
        }
        let signal = rustix::process::Signal::from_named_raw(signal as i32);
        let mut signalled = groups.len();
        for pgid in leaderless {
            if let Some(signal) = signal {
                if let Ok(true) = group::signal_leaderless(pgid, signal) {
                    signalled += 1;
                }
            }
        }
        self.lock().prune();
        signalled
    }

    /// Registered groups, leaderless ones included.
    pub fn len(&self) -> usize {
        let state = self.lock();
        state.groups.len() + state.leaderless.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reaps zombie children of this process that it did not start: descendants of our
    /// children, re-parented to us when their parent exited, which happens when the
    /// server is a container's PID 1 (nothing else would ever reap them). Our own
    /// children are left to their pidfd waits. Returns how many were reaped.
    pub fn reap_orphans(&self) -> usize {
        let me = std::process::id() as i32;
        let mut reaped = 0;
        for pid in zombie_children(me) {
            let state = self.lock();
            if state.spawning > 0 || state.groups.contains(&pid) {
                continue;
            }
            // Under the lock: a spawn cannot register this pid meanwhile.
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                if let Ok(Some(_)) =
                    rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG)
                {
                    reaped += 1;
                }
            }
        }
        reaped
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        // A panic while holding this lock cannot leave the set inconsistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Pids of zombies whose parent is `parent`, from `/proc`.
fn zombie_children(parent: i32) -> Vec<i32> {
    processes()
        .filter(|p| p.state == 'Z' && p.ppid == parent)
        .map(|p| p.pid)
        .collect()
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
