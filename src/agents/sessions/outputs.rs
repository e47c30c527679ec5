//! Artifacts: the files a turn created or changed under `outputs/` of its session's
//! workspace (the directory the SDK's file helpers reserve for what a turn publishes).
//! A turn takes a snapshot of that tree when it starts and compares it with the tree
//! when it ends; a regular file that is new, or whose size, modification time or inode
//! changed, is published. Symlinks are never followed (a link pointing outside the base
//! directory publishes nothing), and the walk is bounded in depth and entries.
//!
//! Both walks run on the blocking pool (they are getdents and lstat calls), from an fd
//! of the workspace opened beneath the base directory.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::fs::resolve::{kind_of, lstat_child, open_child_dir, read_dir_typed, Kind};

/// The directory, under the workspace, whose files are published.
pub const OUTPUTS: &str = "outputs";
/// How deep and how many entries a walk looks at.
pub const MAX_DEPTH: usize = 8;
pub const MAX_ENTRIES: usize = 10_000;

/// What identifies one version of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    pub size: u64,
    mtime: (i64, i64),
    ino: u64,
}

/// `outputs/`'s regular files, by path relative to `outputs/`.
pub type Snapshot = HashMap<String, Version>;

/// The files under `outputs/` of the open workspace `dir` (empty when there is none).
pub fn snapshot(workspace: BorrowedFd<'_>) -> Snapshot {
    let mut files = Snapshot::new();
    if let Ok(outputs) = open_child_dir(workspace, OUTPUTS.as_bytes()) {
        let mut budget = MAX_ENTRIES;
        walk(outputs, String::new(), 0, &mut budget, &mut files);
    }
    files
}

fn walk(dir: OwnedFd, prefix: String, depth: usize, budget: &mut usize, files: &mut Snapshot) {
    let Ok(entries) = read_dir_typed(dir.as_fd()) else {
        return;
    };
    for (name, _) in entries {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let Ok(stat) = lstat_child(dir.as_fd(), &name) else {
            continue;
        };
        let Ok(name) = String::from_utf8(name) else {
            continue;
        };
        let path = format!("{prefix}{name}");
        match kind_of(&stat) {
            Kind::File => {
                files.insert(
                    path,
                    Version {
                        size: stat.st_size as u64,
                        mtime: (stat.st_mtime, stat.st_mtime_nsec as i64),
                        ino: stat.st_ino,
                    },
                );
            }
            Kind::Directory if depth + 1 < MAX_DEPTH => {
                if let Ok(child) = open_child_dir(dir.as_fd(), name.as_bytes()) {
                    walk(child, format!("{path}/"), depth + 1, budget, files);
                }
            }
            _ => {}
        }
    }
}

/// The files of `after` that are not in `before` as they are now, sorted by path.
pub fn changed(before: &Snapshot, after: &Snapshot) -> Vec<(String, u64)> {
    let mut changed: Vec<(String, u64)> = after
        .iter()
        .filter(|(path, version)| before.get(*path) != Some(version))
        .map(|(path, version)| (path.clone(), version.size))
        .collect();
    changed.sort();
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_and_changed_files_are_published_and_links_are_not_followed() {
        let dir = std::env::temp_dir().join(format!("abx-outputs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("outputs/sub")).unwrap();
        std::fs::write(dir.join("outputs/same.txt"), "a").unwrap();
        std::fs::write(dir.join("outputs/edited.txt"), "a").unwrap();
        let open = || crate::fs::resolve::open_base(&dir).unwrap();
        let before = snapshot(open().as_fd());
        assert_eq!(before.len(), 2);
        std::fs::write(dir.join("outputs/edited.txt"), "longer").unwrap();
        std::fs::write(dir.join("outputs/sub/new.bin"), [0u8; 10]).unwrap();
        std::fs::write(dir.join("secret"), "outside").unwrap();
        std::os::unix::fs::symlink(dir.join("secret"), dir.join("outputs/link")).unwrap();
        std::os::unix::fs::symlink(&dir, dir.join("outputs/loop")).unwrap();
        let after = snapshot(open().as_fd());
        assert_eq!(
            changed(&before, &after),
            [
                ("edited.txt".to_string(), 6),
                ("sub/new.bin".to_string(), 10)
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
        let none = std::env::temp_dir().join(format!("abx-no-outputs-{}", std::process::id()));
        std::fs::create_dir_all(&none).unwrap();
        assert!(snapshot(crate::fs::resolve::open_base(&none).unwrap().as_fd()).is_empty());
        let _ = std::fs::remove_dir_all(&none);
    }
}
