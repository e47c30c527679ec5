//! The one directory-tree walk every file route uses (list, search, archive, watch,
//! delete), with its rules stated once:
//!
//! - Descriptors only: each directory is opened relative to its already-open parent with
//!   `O_NOFOLLOW`, so the walk never leaves the subtree it started in, whatever is
//!   renamed or swapped meanwhile. Symlinks are reported, never entered.
//! - Entries come sorted by name; `.` and `..` are skipped.
//! - Depth: `Rules::max_depth` levels below the root are entered (the request's limit);
//!   beyond [`MAX_TREE_DEPTH`] the walk refuses to go on (a `too_deep` error offered to
//!   the visitor), so a hostile tree cannot exhaust a thread's stack or descriptors.
//! - Order: [`Order::Interleaved`] visits an entry and then its subtree (list, archive,
//!   watch), [`Order::Descending`] the same with names in descending order (a file
//!   listing in descending path order); [`Order::FilesFirst`] visits all of a
//!   directory's entries before entering any subdirectory, as Python's `os.walk` does
//!   (search); `leave` is called after a directory's subtree in all (delete removes
//!   the emptied directory there).
//! - Failures to read a directory go to [`Visitor::unreadable`], which decides whether
//!   the walk skips that directory or stops with the error.
//!
//! Blocking: runs on the blocking pool.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStringExt;

use super::resolve::{self, Kind};

/// Deepest directory nesting a walk descends.
pub const MAX_TREE_DEPTH: usize = 256;

/// The error a walk offers when a tree is deeper than [`MAX_TREE_DEPTH`].
pub fn too_deep() -> io::Error {
    io::Error::other(TooDeep)
}

/// Whether `error` is the walk's [`too_deep`] refusal.
pub fn is_too_deep(error: &io::Error) -> bool {
    error.get_ref().is_some_and(|inner| inner.is::<TooDeep>())
}

#[derive(Debug)]
struct TooDeep;

impl std::fmt::Display for TooDeep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "directory tree is deeper than {MAX_TREE_DEPTH} levels")
    }
}

impl std::error::Error for TooDeep {}

/// The order of visits within a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Interleaved,
    /// [`Order::Interleaved`], each directory's entries in descending name order.
    Descending,
    FilesFirst,
}

/// How far and in which order to walk.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// Levels below the root to enter: 0 visits the root's entries only.
    pub max_depth: usize,
    pub order: Order,
}

/// One directory entry as the walk sees it.
pub struct Entry<'a> {
    /// The open directory holding the entry.
    pub dir: BorrowedFd<'a>,
    pub name: &'a [u8],
    /// The type without following a symlink.
    pub kind: Kind,
    /// The holding directory's path from the walk's root (empty at the root), as text
    /// and as the bytes on disk.
    parent: &'a str,
    parent_raw: &'a [u8],
}

impl Entry<'_> {
    /// `lstat` of the entry.
    pub fn lstat(&self) -> io::Result<rustix::fs::Stat> {
        resolve::lstat_child(self.dir, self.name)
    }

    /// The path from the walk's root, `/`-separated (lossy UTF-8), for display. Built
    /// on demand: a search reads it only for matches, and at the root it borrows.
    pub fn rel(&self) -> std::borrow::Cow<'_, str> {
        let name = String::from_utf8_lossy(self.name);
        if self.parent.is_empty() {
            name
        } else {
            std::borrow::Cow::Owned(format!("{}/{name}", self.parent))
        }
    }

    /// The same path as the bytes on disk, for opening it again.
    pub fn rel_path(&self) -> std::path::PathBuf {
        let mut raw = self.parent_raw.to_vec();
        if !raw.is_empty() {
            raw.push(b'/');
        }
        raw.extend_from_slice(self.name);
        std::path::PathBuf::from(std::ffi::OsString::from_vec(raw))
    }
}

/// What to do after a visit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visit {
    /// Go on (and enter the entry if it is a directory within the depth limit).
    Continue,
    /// Go on, but do not enter this directory.
    Skip,
    /// End the whole walk.
    Stop,
}

/// Receives a walk's entries.
pub trait Visitor {
    fn visit(&mut self, entry: &Entry<'_>) -> io::Result<Visit>;

    /// A directory was opened to be entered (the root included, with `rel` empty).
    fn entered(&mut self, _rel: &str, _dir: BorrowedFd<'_>) {}

    /// A directory's subtree is done.
    fn leave(&mut self, _entry: &Entry<'_>) -> io::Result<Visit> {
        Ok(Visit::Continue)
    }

    /// A directory could not be listed or entered (`rel` empty for the root). `Ok`
    /// skips it; `Err` ends the walk with that error.
    fn unreadable(&mut self, _rel: &str, error: io::Error) -> io::Result<()> {
        Err(error)
    }
}

/// Which paths (beneath the base directory) a caller may not see: a walk leaves them
/// and everything below them out (a policy's `paths` rule on a listing, search or
/// archive, as the reference filters them).
pub type Hidden = std::sync::Arc<dyn Fn(&std::path::Path) -> bool + Send + Sync>;

/// Whether the symlink at this path (beneath the base directory) leads outside it.
pub type LeadsOut<'a> = &'a dyn Fn(&std::path::Path) -> bool;

/// What a walk leaves out besides what the caller asked for.
#[derive(Clone, Copy, Default)]
pub struct Unseen<'a> {
    /// The policy's hidden paths, and everything below them.
    pub hidden: Option<&'a Hidden>,
    /// Symlinks whose target is outside the base directory: the reference's path guard
    /// judges an entry by where it leads, so a listing or search never names them.
    pub links_out: Option<LeadsOut<'a>>,
}

/// A visitor that passes on only the entries [`Unseen`] lets through; `root` is the
/// walk's root beneath the base directory.
pub struct Hiding<'v> {
    pub inner: &'v mut dyn Visitor,
    pub root: &'v std::path::Path,
    pub unseen: Unseen<'v>,
}

impl Visitor for Hiding<'_> {
    fn visit(&mut self, entry: &Entry<'_>) -> io::Result<Visit> {
        let hidden = self.unseen.hidden;
        let links_out = self
            .unseen
            .links_out
            .filter(|_| entry.kind == Kind::Symlink);
        if hidden.is_some() || links_out.is_some() {
            let rel = self.root.join(entry.rel_path());
            if hidden.is_some_and(|h| h(&rel)) || links_out.is_some_and(|out| out(&rel)) {
                return Ok(Visit::Skip);
            }
        }
        self.inner.visit(entry)
    }

    fn entered(&mut self, rel: &str, dir: BorrowedFd<'_>) {
        self.inner.entered(rel, dir)
    }

    fn leave(&mut self, entry: &Entry<'_>) -> io::Result<Visit> {
        self.inner.leave(entry)
    }

    fn unreadable(&mut self, rel: &str, error: io::Error) -> io::Result<()> {
        self.inner.unreadable(rel, error)
    }
}

/// [`walk`], leaving out what `unseen` names.
pub fn walk_visible(
    root: BorrowedFd<'_>,
    root_rel: &std::path::Path,
    unseen: Unseen<'_>,
    rules: Rules,
    visitor: &mut dyn Visitor,
) -> io::Result<bool> {
    if unseen.hidden.is_none() && unseen.links_out.is_none() {
        return walk(root, rules, visitor);
    }
    walk(
        root,
        rules,
        &mut Hiding {
            inner: visitor,
            root: root_rel,
            unseen,
        },
    )
}

/// Walks the tree below the open directory `root`. Returns false when a visitor
/// stopped the walk.
pub fn walk(root: BorrowedFd<'_>, rules: Rules, visitor: &mut dyn Visitor) -> io::Result<bool> {
    visitor.entered("", root);
    // One pair of path buffers for the whole walk (text and raw bytes) holding the
    // current directory's path: entering a directory appends its name, leaving it
    // truncates, so no path is built per entry.
    let mut path = Paths::default();
    walk_dir(root, &mut path, 0, rules, visitor)
}

#[derive(Default)]
struct Paths {
    text: String,
    raw: Vec<u8>,
}

impl Paths {
    fn mark(&self) -> (usize, usize) {
        (self.text.len(), self.raw.len())
    }

    fn push(&mut self, name: &[u8]) {
        if !self.raw.is_empty() {
            self.text.push('/');
            self.raw.push(b'/');
        }
        self.text.push_str(&String::from_utf8_lossy(name));
        self.raw.extend_from_slice(name);
    }

    fn reset(&mut self, mark: (usize, usize)) {
        self.text.truncate(mark.0);
        self.raw.truncate(mark.1);
    }
}

fn walk_dir(
    dir: BorrowedFd<'_>,
    path: &mut Paths,
    depth: usize,
    rules: Rules,
    visitor: &mut dyn Visitor,
) -> io::Result<bool> {
    let entries = match resolve::read_dir_typed(dir) {
        Ok(entries) => entries,
        Err(e) => {
            visitor.unreadable(&path.text, e)?;
            return Ok(true);
        }
    };
    let mut pending = Vec::new();
    let ordered: Box<dyn Iterator<Item = &(Vec<u8>, Option<Kind>)>> = match rules.order {
        Order::Descending => Box::new(entries.iter().rev()),
        _ => Box::new(entries.iter()),
    };
    for (name, kind) in ordered {
        let kind = match kind {
            Some(kind) => *kind,
            // The file system did not say: ask.
            None => match resolve::lstat_child(dir, name) {
                Ok(stat) => resolve::kind_of(&stat),
                Err(_) => continue,
            },
        };
        let entry = Entry {
            dir,
            name,
            kind,
            parent: &path.text,
            parent_raw: &path.raw,
        };
        let visit = visitor.visit(&entry)?;
        if visit == Visit::Stop {
            return Ok(false);
        }
        if visit == Visit::Skip || kind != Kind::Directory || depth >= rules.max_depth {
            continue;
        }
        match rules.order {
            Order::Interleaved | Order::Descending => {
                if !descend(dir, name, path, depth, rules, visitor)? {
                    return Ok(false);
                }
            }
            Order::FilesFirst => pending.push(name),
        }
    }
    for name in pending {
        if !descend(dir, name, path, depth, rules, visitor)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Enters the directory `name` of `dir`; `path` holds `dir`'s path.
fn descend(
    dir: BorrowedFd<'_>,
    name: &[u8],
    path: &mut Paths,
    depth: usize,
    rules: Rules,
    visitor: &mut dyn Visitor,
) -> io::Result<bool> {
    let mark = path.mark();
    path.push(name);
    let outcome = enter(dir, name, path, depth, rules, visitor);
    path.reset(mark);
    if !outcome? {
        return Ok(false);
    }
    let entry = Entry {
        dir,
        name,
        kind: Kind::Directory,
        parent: &path.text,
        parent_raw: &path.raw,
    };
    Ok(visitor.leave(&entry)? != Visit::Stop)
}

/// Walks the directory `name` of `dir`, whose own path `path` now holds.
fn enter(
    dir: BorrowedFd<'_>,
    name: &[u8],
    path: &mut Paths,
    depth: usize,
    rules: Rules,
    visitor: &mut dyn Visitor,
) -> io::Result<bool> {
    if depth + 1 >= MAX_TREE_DEPTH {
        visitor.unreadable(&path.text, too_deep())?;
        return Ok(true);
    }
    let child = match resolve::open_child_dir(dir, name) {
        Ok(child) => child,
        Err(e) => {
            visitor.unreadable(&path.text, e)?;
            return Ok(true);
        }
    };
    visitor.entered(&path.text, child.as_fd());
    walk_dir(child.as_fd(), path, depth + 1, rules, visitor)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Names(Vec<String>);
    impl Visitor for Names {
        fn visit(&mut self, entry: &Entry<'_>) -> io::Result<Visit> {
            self.0.push(entry.rel().into_owned());
            Ok(Visit::Continue)
        }
    }

    #[test]
    fn orders_and_depth() {
        let dir = std::env::temp_dir().join(format!("abx-walk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/deep/deeper")).unwrap();
        std::fs::write(dir.join("a/f"), b"").unwrap();
        std::fs::write(dir.join("b"), b"").unwrap();
        std::os::unix::fs::symlink(&dir, dir.join("loop")).unwrap();
        let root = std::fs::File::open(&dir).unwrap();
        let run = |order, max_depth| {
            let mut names = Names(Vec::new());
            walk(root.as_fd(), Rules { max_depth, order }, &mut names).unwrap();
            names.0
        };
        assert_eq!(
            run(Order::Interleaved, 10),
            ["a", "a/deep", "a/deep/deeper", "a/f", "b", "loop"]
        );
        assert_eq!(
            run(Order::FilesFirst, 10),
            ["a", "b", "loop", "a/deep", "a/f", "a/deep/deeper"]
        );
        assert_eq!(run(Order::Interleaved, 0), ["a", "b", "loop"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
