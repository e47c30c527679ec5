//! Process groups that outlive their leader. Every child leads its own group (its pgid
//! is its pid), and `bash -c 'sleep 300 & exit 0'` leaves the group running after the
//! leader has exited and been reaped. Such a group can still be signalled by its pgid,
//! as long as it is certain that the number still names *that* group.
//!
//! The certainty comes from how Linux hands out ids: a number stays allocated while any
//! process uses it as a process group id, so while a member of the old group lives, no
//! new process can get that number. A group `N` can only be created by process `N`
//! itself. So once our leader `N` has been reaped: if a process `N` exists now, the
//! number was handed out again and group `N` (if any) is not ours; if none exists and
//! group `N` has members, they are the members of our group. The only gap is a group
//! that empties, whose number is reused by a process that makes itself a group leader
//! and exits leaving members, all between two looks: that takes the kernel cycling
//! through the whole pid space in between.

use std::io;

use rustix::io::Errno;
use rustix::process::{Pid, Signal};

/// Whether group `pgid`, whose leader this server has reaped, still has members.
pub fn outlives_leader(pgid: i32) -> bool {
    let Some(pid) = Pid::from_raw(pgid) else {
        return false;
    };
    let leader_number_free = matches!(rustix::process::test_kill_process(pid), Err(Errno::SRCH));
    // EPERM: members exist but changed their credentials; they are still ours to end.
    let members = matches!(
        rustix::process::test_kill_process_group(pid),
        Ok(()) | Err(Errno::PERM)
    );
    leader_number_free && members
}

/// Sends `signal` to what is left of group `pgid` after its leader was reaped, if
/// anything is. Returns whether a group was signalled.
pub fn signal_leaderless(pgid: i32, signal: Signal) -> io::Result<bool> {
    if !outlives_leader(pgid) {
        return Ok(false);
    }
    let Some(pid) = Pid::from_raw(pgid) else {
        return Ok(false);
    };
    match rustix::process::kill_process_group(pid, signal) {
        Ok(()) => Ok(true),
        Err(Errno::SRCH) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    #[test]
    fn a_group_is_found_and_ended_after_its_leader_is_reaped() {
        // The leader starts a member in its group and exits at once.
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "sleep 30 >/dev/null & echo $!"])
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = leader.id() as i32;
        let mut out = String::new();
        std::io::Read::read_to_string(leader.stdout.as_mut().unwrap(), &mut out).unwrap();
        let member: i32 = out.trim().parse().unwrap();
        leader.wait().unwrap();
        assert!(outlives_leader(pgid), "the member still runs in the group");
        assert!(signal_leaderless(pgid, Signal::KILL).unwrap());
        // The member is not our child: it is gone once /proc no longer shows it running.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{member}/stat"))
            .is_ok_and(|s| !s.contains(") Z"))
        {
            assert!(Instant::now() < deadline, "member {member} survived");
            std::thread::sleep(Duration::from_millis(10));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while outlives_leader(pgid) {
            assert!(Instant::now() < deadline, "group {pgid} still there");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!signal_leaderless(pgid, Signal::KILL).unwrap());
        // A live process's own number is never taken for a leaderless group.
        assert!(!outlives_leader(std::process::id() as i32));
    }
}
