//! What `git` prints, parsed: `status --porcelain=v2 -z --branch` and `diff --numstat
//! -z`. Machine formats only, NUL-separated, so paths with spaces, quotes or newlines
//! arrive exactly as they are, never C-quoted. Running git is the caller's job (it
//! goes through the one spawn path); this module has no I/O.

pub mod repo;

use serde::Serialize;

/// One changed path, as `GET /git/status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileStatus {
    /// Relative to the repository root, as git reports it.
    pub path: String,
    /// `modified`, `added`, `deleted`, `renamed`, `copied`, `untracked` or `unmerged`.
    pub status: &'static str,
    /// The path before a rename or copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_path: Option<String>,
}

/// A parsed `git status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The branch, `HEAD` when detached.
    pub branch: String,
    pub files: Vec<FileStatus>,
}

/// Parses `git status --porcelain=v2 -z --branch`.
pub fn parse_status(out: &str) -> Result<Status, String> {
    let mut branch = String::from("HEAD");
    let mut files = Vec::new();
    let mut fields = out.split('\0').filter(|f| !f.is_empty());
    while let Some(entry) = fields.next() {
        if let Some(header) = entry.strip_prefix("# ") {
            if let Some(head) = header.strip_prefix("branch.head ") {
                branch = if head == "(detached)" {
                    "HEAD".into()
                } else {
                    head.into()
                };
            }
            continue;
        }
        let kind = entry.as_bytes()[0];
        let file = match kind {
            // `1 XY sub mH mI mW hH hI path`
            b'1' => {
                let (xy, path) = nth_fields(entry, 8)?;
                FileStatus {
                    path: path.into(),
                    status: ordinary_status(xy),
                    original_path: None,
                }
            }
            // `2 XY sub mH mI mW hH hI Xscore path`, then the original path as its own field.
            b'2' => {
                let (xy, path) = nth_fields(entry, 9)?;
                let original = fields
                    .next()
                    .ok_or_else(|| format!("a rename without its original path: {entry:?}"))?;
                FileStatus {
                    path: path.into(),
                    status: if xy.contains('C') {
                        "copied"
                    } else {
                        "renamed"
                    },
                    original_path: Some(original.into()),
                }
            }
            // `u XY sub m1 m2 m3 mW h1 h2 h3 path`
            b'u' => FileStatus {
                path: nth_fields(entry, 10)?.1.into(),
                status: "unmerged",
                original_path: None,
            },
            b'?' => FileStatus {
                path: entry.get(2..).unwrap_or_default().into(),
                status: "untracked",
                original_path: None,
            },
            // Ignored files (`!`) are not asked for; anything else is a newer format.
            b'!' => continue,
            _ => {
                return Err(format!(
                    "an entry git status is not known to print: {entry:?}"
                ))
            }
        };
        files.push(file);
    }
    Ok(Status { branch, files })
}

/// The XY field and the path of an entry with `skip` space-separated fields before the
/// path (the path itself may contain spaces).
fn nth_fields(entry: &str, skip: usize) -> Result<(&str, &str), String> {
    let mut parts = entry.splitn(skip + 1, ' ');
    let _kind = parts.next();
    let xy = parts.next().unwrap_or_default();
    let path = parts
        .nth(skip - 2)
        .ok_or_else(|| format!("a status entry with too few fields: {entry:?}"))?;
    Ok((xy, path))
}

/// An ordinary change: added in the index wins, then deleted on either side, else
/// modified (content or type).
fn ordinary_status(xy: &str) -> &'static str {
    if xy.starts_with('A') {
        "added"
    } else if xy.contains('D') {
        "deleted"
    } else {
        "modified"
    }
}

/// Totals of `git diff --numstat -z`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct DiffStats {
    pub files_changed: u64,
    pub insertions: u64,
    pub deletions: u64,
}

/// Parses `git diff --numstat -z`: `added\tdeleted\tpath\0`, or for a rename
/// `added\tdeleted\t\0old\0new\0`; binary files show `-` for both counts.
pub fn parse_numstat(out: &str) -> DiffStats {
    let mut stats = DiffStats::default();
    let mut fields = out.split('\0');
    while let Some(entry) = fields.next() {
        let mut parts = entry.splitn(3, '\t');
        let (Some(added), Some(deleted), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if path.is_empty() {
            // A rename: the two paths follow as fields of their own.
            fields.next();
            fields.next();
        }
        stats.files_changed += 1;
        stats.insertions += added.parse::<u64>().unwrap_or(0);
        stats.deletions += deleted.parse::<u64>().unwrap_or(0);
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_entries_of_every_kind() {
        let out = "# branch.oid abc\0# branch.head main\0\
1 .M N... 100644 100644 100644 1111 2222 a file.txt\0\
1 A. N... 000000 100644 100644 0000 3333 new\nline\0\
1 .D N... 100644 100644 000000 4444 4444 gone\0\
2 R. N... 100644 100644 100644 5555 5555 R100 renamed to\0renamed from\0\
u UU N... 100644 100644 100644 100644 6666 7777 8888 both\0\
? untracked dir/\0";
        let status = parse_status(out).unwrap();
        assert_eq!(status.branch, "main");
        let got: Vec<(&str, &str)> = status
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.status))
            .collect();
        assert_eq!(
            got,
            [
                ("a file.txt", "modified"),
                ("new\nline", "added"),
                ("gone", "deleted"),
                ("renamed to", "renamed"),
                ("both", "unmerged"),
                ("untracked dir/", "untracked"),
            ]
        );
        assert_eq!(
            status.files[3].original_path.as_deref(),
            Some("renamed from")
        );
        assert_eq!(
            parse_status("# branch.head (detached)\0").unwrap().branch,
            "HEAD"
        );
        assert!(parse_status("X what\0").is_err());
        assert!(parse_status("2 R. N... 1 1 1 1 1 R100 only\0").is_err());
    }

    #[test]
    fn numstat_totals() {
        let out = "3\t1\ta.txt\0-\t-\tblob.bin\0\
2\t0\t\0old name\0new name\0";
        assert_eq!(
            parse_numstat(out),
            DiffStats {
                files_changed: 3,
                insertions: 5,
                deletions: 1
            }
        );
        assert_eq!(parse_numstat(""), DiffStats::default());
    }
}
