//! A process and everything it started, whatever group or session each descendant put
//! itself in. Killing a child's process group is not enough for an agent CLI: Claude
//! Code's Bash tool runs each command in a session of its own, so a command outlives a
//! group kill, re-parented to init, where nothing can tell it came from the CLI.
//!
//! The descendants are found by their parent links in `/proc` while the root still
//! lives (after its death they are re-parented and the links are gone), and each is
//! stopped as soon as it is found: a stopped process forks nothing more, so a rescan
//! that finds no new pid has the whole tree, which then gets SIGKILL. A pid in the set
//! cannot be reused meanwhile: a stopped process does not exit by itself.

use std::collections::HashSet;

use rustix::process::{Pid, Signal};

use super::procfs::processes;

/// Scans after which a tree still growing is killed as found (a process that forks
/// faster than the scan stops it is killed with its group).
const MAX_SCANS: usize = 16;

/// Stops `root` (the leader of its own group) and every descendant, then kills them
/// all, the root's group last. Returns how many descendants were outside the root's
/// group. Blocking: it reads `/proc`; call it on the pool.
pub fn kill_tree(root: i32) -> usize {
    let Some(root_pid) = Pid::from_raw(root) else {
        return 0;
    };
    // The root first: it forks no new command while the tree is walked.
    let _ = rustix::process::kill_process_group(root_pid, Signal::STOP);
    let mut found: HashSet<i32> = HashSet::new();
    for _ in 0..MAX_SCANS {
        let fresh: Vec<i32> = descendants(root)
            .into_iter()
            .filter(|pid| !found.contains(pid))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for pid in fresh {
            if let Some(p) = Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(p, Signal::STOP);
            }
            found.insert(pid);
        }
    }
    let mut outside = 0;
    for pid in &found {
        let Some(p) = Pid::from_raw(*pid) else {
            continue;
        };
        // Its group too: a command's own children may share it and not yet be seen.
        if let Ok(group) = rustix::process::getpgid(Some(p)) {
            if group != root_pid {
                outside += 1;
                let _ = rustix::process::kill_process_group(group, Signal::KILL);
            }
        }
        let _ = rustix::process::kill_process(p, Signal::KILL);
    }
    let _ = rustix::process::kill_process_group(root_pid, Signal::KILL);
    // Stopped processes that got SIGKILL die at once; a SIGCONT is for any that had
    // it blocked (it cannot be, but a stopped group left behind would be worse).
    let _ = rustix::process::kill_process_group(root_pid, Signal::CONT);
    outside
}

/// Every live descendant of `root`, by parent links.
fn descendants(root: i32) -> Vec<i32> {
    let table: Vec<(i32, i32)> = processes()
        .filter(|p| p.state != 'Z')
        .map(|p| (p.pid, p.ppid))
        .collect();
    let mut tree = vec![root];
    let mut at = 0;
    while at < tree.len() {
        let parent = tree[at];
        tree.extend(
            table
                .iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        at += 1;
    }
    tree.remove(0);
    tree
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    fn alive(pid: i32) -> bool {
        // A zombie is dead: its parent (this test, or init) has yet to reap it.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .is_some_and(|zombie| !zombie)
    }

    #[test]
    fn a_command_in_a_session_of_its_own_dies_with_its_tree() {
        let dir = std::env::temp_dir().join(format!("abx-tree-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("pid");
        // The root starts a command in a new session (as Claude Code's Bash tool does),
        // which starts a child of its own; the group kill alone leaves both.
        let script = format!(
            "setsid sh -c 'sleep 300 & echo $! > {p}; wait' & wait",
            p = pidfile.display()
        );
        let mut root = std::process::Command::new("sh")
            .args(["-c", &script])
            .process_group(0)
            .spawn()
            .unwrap();
        let started = Instant::now();
        let sleeper = loop {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                break pid;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no command started"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(alive(sleeper));
        let outside = kill_tree(root.id() as i32);
        assert!(outside >= 1, "the command's own session was not found");
        root.wait().unwrap();
        let gone = Instant::now();
        while alive(sleeper) && gone.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !alive(sleeper),
            "the command in its own session outlived the kill"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
