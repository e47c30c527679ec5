//! The confinement object. A [`BaseDir`] is the directory caller paths must stay
//! beneath; [`BaseDir::confine`] checks a caller's path lexically (no disk access) and
//! [`BaseDir::open`] opens the base for a blocking operation, whose every further open
//! goes through `openat2(RESOLVE_BENEATH)` (see `resolve`). Routes pass one `BaseDir`
//! and one [`CallerPath`] instead of the base path, its descriptor, the caller's input
//! and the resolved path separately.
//!
//! The base is opened per operation, not once at startup, so a base directory created
//! (or recreated) after the server started is picked up.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use super::error::FsError;
use super::resolve::{self, OpenError};

/// The directory caller paths are confined to.
#[derive(Debug, Clone)]
pub struct BaseDir {
    path: PathBuf,
}

/// A caller path after the lexical check: what answers show, the part beneath the base
/// that is actually opened (empty for the base itself), and what the caller sent.
#[derive(Debug, Clone)]
pub struct CallerPath {
    pub shown: PathBuf,
    pub rel: PathBuf,
    pub input: String,
}

impl CallerPath {
    /// The last component, or `None` for the base directory itself.
    pub fn file_name(&self) -> Option<&OsStr> {
        self.rel.file_name()
    }

    /// The parent's part beneath the base (empty when the parent is the base).
    pub fn parent_rel(&self) -> &Path {
        self.rel.parent().unwrap_or(Path::new(""))
    }

    /// The path as answers show it.
    pub fn display(&self) -> String {
        self.shown.to_string_lossy().into_owned()
    }

    /// The same caller input naming `name` inside this directory.
    pub fn join(&self, name: &OsStr) -> CallerPath {
        CallerPath {
            shown: self.shown.join(name),
            rel: self.rel.join(name),
            input: self.input.clone(),
        }
    }

    /// Whether this is the base directory itself.
    pub fn is_base(&self) -> bool {
        self.rel.as_os_str().is_empty()
    }
}

impl BaseDir {
    pub fn new(path: PathBuf) -> BaseDir {
        BaseDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Resolves `input` (absolute, or relative to the base) lexically and checks that it
    /// stays beneath the base. Symlinks are the kernel's business at open time.
    pub fn confine(&self, input: &str) -> Result<CallerPath, FsError> {
        if input.contains('\0') {
            return Err(FsError::Invalid("Path contains a NUL byte".into()));
        }
        let joined = if input.starts_with('/') {
            PathBuf::from(input)
        } else {
            self.path.join(input)
        };
        let mut normal = PathBuf::from("/");
        for component in joined.components() {
            match component {
                Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
                Component::ParentDir => {
                    normal.pop();
                }
                Component::Normal(part) => normal.push(part),
            }
        }
        match normal.strip_prefix(&self.path) {
            Ok(rel) => Ok(CallerPath {
                rel: rel.to_path_buf(),
                shown: normal.clone(),
                input: input.to_string(),
            }),
            Err(_) => Err(self.not_allowed(input)),
        }
    }

    /// The refusal for a path outside the base.
    pub fn not_allowed(&self, input: &str) -> FsError {
        FsError::NotAllowed {
            input: input.to_string(),
            base: self.path.clone(),
        }
    }

    /// Opens the base for a blocking operation. A base directory that does not exist is
    /// `NotFound`: nothing beneath it exists either. Blocking.
    pub fn open(&self) -> Result<Beneath<'_>, FsError> {
        match resolve::open_base(&self.path) {
            Ok(fd) => Ok(Beneath { base: self, fd }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(FsError::NotFound(format!(
                "Directory not found: {} (the base directory does not exist)",
                self.path.display()
            ))),
            Err(e) => Err(FsError::io(e, self.path.to_string_lossy())),
        }
    }

    /// What the startup line and `/capabilities` say while the base directory is missing
    /// (`None` once it exists). Blocking (one `stat`).
    pub fn missing_warning(&self) -> Option<String> {
        (!self.path.is_dir()).then(|| {
            format!(
                "base directory {} does not exist: reads and listings fail until it is created (an upload, a mkdir, or a command without a cwd creates it)",
                self.path.display()
            )
        })
    }

    /// Like [`BaseDir::open`], but creates a missing base directory first, as writes do
    /// in the Python reference (`os.makedirs` of the target's parents). Blocking.
    pub fn open_creating(&self) -> Result<Beneath<'_>, FsError> {
        // The base nearly always exists: open it first, and create it only when that
        // fails (a `mkdir` that fails with EEXIST and its `stat` cost every write two
        // system calls).
        if let Ok(fd) = resolve::open_base(&self.path) {
            return Ok(Beneath { base: self, fd });
        }
        if let Err(e) = std::fs::create_dir_all(&self.path) {
            return Err(FsError::io(e, self.path.to_string_lossy()));
        }
        self.open()
    }

    /// The base directory itself, opened readable: a write whose parent is the base
    /// needs no `openat2` beneath it (one `open` instead of `open`, `openat2` and
    /// `close`). `None` when that open fails (the base is missing, say): the caller
    /// then takes the general path, which creates it and words the error. Blocking.
    pub fn open_readable(&self) -> Option<OwnedFd> {
        resolve::open_base_as(&self.path, OFlags::RDONLY).ok()
    }

    /// Turns a resolution failure into the caller-facing error.
    pub fn open_error(&self, error: OpenError, caller: &CallerPath) -> FsError {
        match error {
            OpenError::Escape => self.not_allowed(&caller.input),
            // Python names the path as the caller spelled it.
            OpenError::Io(e) => FsError::io(e, caller.input.clone()),
        }
    }
}

/// An opened base directory: every open beneath it is confined by the kernel.
pub struct Beneath<'a> {
    base: &'a BaseDir,
    fd: OwnedFd,
}

impl Beneath<'_> {
    /// The base directory's own descriptor (`O_PATH`).
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

impl Beneath<'_> {
    pub fn base(&self) -> &BaseDir {
        self.base
    }

    /// The absolute path of `rel`, as answers show it.
    pub fn display(&self, rel: &Path) -> String {
        self.base.path.join(rel).to_string_lossy().into_owned()
    }

    /// Opens `rel` beneath the base (`resolve::open_beneath`).
    pub fn open(&self, rel: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, OpenError> {
        resolve::open_beneath(self.fd.as_fd(), &self.base.path, rel, flags, mode)
    }

    /// Opens the caller's directory; a missing path, or one that is not a directory, is
    /// `NotFound("Directory not found: ...")`.
    pub fn open_dir(&self, caller: &CallerPath, flags: OFlags) -> Result<OwnedFd, FsError> {
        match self.open(&caller.rel, flags | OFlags::DIRECTORY, Mode::empty()) {
            Ok(dir) => Ok(dir),
            Err(e) if e.is_missing() => Err(FsError::NotFound(format!(
                "Directory not found: {}",
                caller.display()
            ))),
            Err(e) => Err(self.base.open_error(e, caller)),
        }
    }

    /// Opens the directory holding the caller's path; when it is missing so is the path:
    /// `NotFound("<what> not found: ...")`.
    pub fn open_parent(&self, caller: &CallerPath, what: &str) -> Result<OwnedFd, FsError> {
        match self.open(
            caller.parent_rel(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        ) {
            Ok(parent) => Ok(parent),
            Err(e) if e.is_missing() => Err(FsError::NotFound(format!(
                "{what} not found: {}",
                caller.display()
            ))),
            Err(e) => Err(self.base.open_error(e, caller)),
        }
    }

    /// `mkdir -p` of `rel`, returning the directory.
    pub fn create_dirs(&self, rel: &Path) -> Result<OwnedFd, OpenError> {
        resolve::create_dirs(self.fd.as_fd(), &self.base.path, rel)
    }

    /// `mkdir -p` of `rel`, returning the directory opened with `flags`.
    pub fn create_dirs_opened(&self, rel: &Path, flags: OFlags) -> Result<OwnedFd, OpenError> {
        resolve::create_dirs_opened(self.fd.as_fd(), &self.base.path, rel, flags)
    }

    /// `lstat` of `rel`; `Ok(None)` when nothing is there.
    pub fn lstat(&self, rel: &Path) -> Result<Option<rustix::fs::Stat>, OpenError> {
        resolve::lstat_beneath(self.fd.as_fd(), &self.base.path, rel)
    }

    /// The target of the symlink `rel`, read through a descriptor of the link itself.
    pub fn readlink(&self, rel: &Path) -> Result<Vec<u8>, OpenError> {
        resolve::readlink_beneath(self.fd.as_fd(), &self.base.path, rel)
    }

    /// Whether the symlink at `rel`, whose target `target` was read once, leads outside
    /// the base: lexically, or as the kernel resolves it (a relative target may pass
    /// through further links). A dangling link whose target would be inside stays in.
    pub fn link_leads_out(&self, rel: &Path, target: &[u8]) -> Result<bool, OpenError> {
        let resolved = self
            .base
            .path
            .join(rel)
            .parent()
            .unwrap_or(&self.base.path)
            .join(OsStr::from_bytes(target));
        if self.base.confine(&resolved.to_string_lossy()).is_err() {
            return Ok(true);
        }
        match self.open(rel, OFlags::PATH, Mode::empty()) {
            Ok(_) => Ok(false),
            Err(OpenError::Escape) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// [`Self::link_leads_out`], reading the link first; a link gone since stays in.
    pub fn link_at_leads_out(&self, rel: &Path) -> Result<bool, OpenError> {
        match self.readlink(rel) {
            Ok(target) => self.link_leads_out(rel, &target),
            Err(e) if e.is_missing() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The path beneath the base that `fd` (opened beneath it) names now, as the
    /// kernel reports it: where a followed symlink led. `None` if the kernel names a
    /// place outside the base (the base was moved meanwhile).
    pub fn rel_of(&self, fd: BorrowedFd<'_>) -> Option<PathBuf> {
        let named = |fd: BorrowedFd<'_>| {
            std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()
        };
        let base = named(self.fd.as_fd())?;
        named(fd)?.strip_prefix(&base).ok().map(Path::to_path_buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confinement_is_lexical() {
        let base = BaseDir::new(PathBuf::from("/home/user"));
        let shown = |input: &str| base.confine(input).map(|c| c.shown);
        assert_eq!(
            shown("/home/user/a.txt").unwrap(),
            PathBuf::from("/home/user/a.txt")
        );
        assert_eq!(shown("a/../b").unwrap(), PathBuf::from("/home/user/b"));
        assert_eq!(shown(".").unwrap(), PathBuf::from("/home/user"));
        assert!(base.confine(".").unwrap().is_base());
        assert_eq!(shown("/home/user/").unwrap(), PathBuf::from("/home/user"));
        assert!(matches!(
            base.confine("../user2"),
            Err(FsError::NotAllowed { .. })
        ));
        assert!(shown("/etc/passwd").is_err());
        assert!(shown("/home/user/../../etc").is_err());
        assert!(shown("/home/username").is_err());
        assert!(matches!(base.confine("a\0b"), Err(FsError::Invalid(_))));
        assert_eq!(base.confine("x/y").unwrap().rel, PathBuf::from("x/y"));
    }
}
