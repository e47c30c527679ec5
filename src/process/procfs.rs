//! What `/proc` says about processes.

/// One process as `/proc/<pid>/stat` describes it.
pub struct ProcessStat {
    pub pid: i32,
    pub state: char,
    pub ppid: i32,
    pub session: i32,
}

/// Every process `/proc` shows (ones that vanish while it is read are skipped).
/// Blocking: reads a file per process.
pub fn processes() -> impl Iterator<Item = ProcessStat> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // The command name may contain spaces and parentheses: parse after the last
            // ')': state ppid pgrp session ...
            let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
            let state = fields.next()?.chars().next()?;
            let ppid = fields.next()?.parse().ok()?;
            let session = fields.nth(1)?.parse().ok()?;
            Some(ProcessStat {
                pid,
                state,
                ppid,
                session,
            })
        })
}
