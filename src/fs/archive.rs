//! `POST /files/archive`: tar.gz or zip of caller paths, built on the blocking pool (it is
//! compression, CPU-bound) from files opened beneath the base directory only.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use super::base::{BaseDir, Beneath, CallerPath};
use super::error::FsError;
use super::resolve::{self, Kind, OpenError};
use super::walk::{self, Entry, Order, Rules, Visit, Visitor};
use super::zip::ZipWriter;

/// Archive formats the contract names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    TarGz,
    Zip,
}

impl Format {
    pub fn parse(name: &str) -> Option<Format> {
        match name {
            "tar.gz" => Some(Format::TarGz),
            "zip" => Some(Format::Zip),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Format::TarGz => "tar.gz",
            Format::Zip => "zip",
        }
    }
}

/// Limits of one archive (the contract's defaults: 10,000 files, 100 MiB).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_files: usize,
    pub max_bytes: u64,
}

enum Content {
    /// A regular file, opened beneath the base only when its turn to be written comes,
    /// so an archive of any size holds one file descriptor at a time.
    File(PathBuf),
    Dir,
    Symlink(Vec<u8>),
}

struct Member {
    name: String,
    content: Content,
    mode: u32,
    mtime: i64,
}

/// Builds the archive of `inputs` (checked caller paths) and returns its bytes. Blocking.
pub fn build(
    base: &BaseDir,
    inputs: &[String],
    format: Format,
    limits: Limits,
    hidden: Option<walk::Hidden>,
) -> Result<Vec<u8>, FsError> {
    let beneath = base.open()?;
    let mut members = Vec::new();
    for input in inputs {
        // Each input is checked and looked up in order: the first bad one decides.
        let caller = &base.confine(input)?;
        let stat = beneath
            .lstat(&caller.rel)
            .map_err(|e| base.open_error(e, caller))?
            .ok_or_else(|| FsError::NotFound(format!("Path not found: {}", caller.display())))?;
        let top_name = caller
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| {
                base.path()
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "base".into())
            });
        if resolve::kind_of(&stat) == Kind::Directory {
            let dir = beneath
                .open(
                    &caller.rel,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
                    Mode::empty(),
                )
                .map_err(|e| base.open_error(e, caller))?;
            members.push(Member {
                name: format!("{top_name}/"),
                content: Content::Dir,
                mode: stat.st_mode & 0o7777,
                mtime: stat.st_mtime,
            });
            let mut collector = Collector {
                beneath: &beneath,
                top: caller,
                top_name: &top_name,
                members: &mut members,
                limits,
                failure: None,
            };
            let rules = Rules {
                max_depth: walk::MAX_TREE_DEPTH,
                order: Order::Interleaved,
            };
            let walked = walk::walk_visible(
                dir.as_fd(),
                &caller.rel,
                walk::Unseen {
                    hidden: hidden.as_ref(),
                    links_out: None,
                },
                rules,
                &mut collector,
            );
            if let Some(failure) = collector.failure.take() {
                return Err(failure);
            }
            walked.map_err(|e| FsError::io(e, caller.display()))?;
        } else if let Some(member) = member_for(&beneath, &caller.rel, top_name, &stat)? {
            members.push(member);
        }
        check_count(&members, limits)?;
    }
    drop_implied_directories(&mut members);
    match format {
        Format::TarGz => write_tar_gz(&beneath, members, limits),
        Format::Zip => write_zip(&beneath, members, limits),
    }
}

/// Keeps a directory member only when it is empty (as far as the caller may see): the
/// reference's archives hold files and links alone, which implies every directory that
/// holds one; an empty directory, which the reference loses, stays as its own entry.
/// Members are in walk order, so a directory's first member, if any, follows it.
fn drop_implied_directories(members: &mut Vec<Member>) {
    let implied: Vec<bool> = members
        .iter()
        .zip(members.iter().skip(1).map(Some).chain([None]))
        .map(|(member, next)| {
            matches!(member.content, Content::Dir)
                && next.is_some_and(|next| next.name.starts_with(&member.name))
        })
        .collect();
    let mut implied = implied.into_iter();
    members.retain(|_| !implied.next().unwrap_or(false));
}

fn check_count(members: &[Member], limits: Limits) -> Result<(), FsError> {
    let files = members
        .iter()
        .filter(|m| !matches!(m.content, Content::Dir))
        .count();
    if files > limits.max_files {
        return Err(FsError::TooManyFiles {
            limit: limits.max_files,
        });
    }
    Ok(())
}

/// A member for a non-directory entry at `rel`, or `None` when it is skipped (a symlink
/// leading outside the base directory, a socket or device).
fn member_for(
    beneath: &Beneath<'_>,
    rel: &Path,
    name: String,
    stat: &rustix::fs::Stat,
) -> Result<Option<Member>, FsError> {
    let shown = || beneath.display(rel);
    let failed = |e: OpenError| match e {
        OpenError::Escape => beneath.base().not_allowed(&shown()),
        OpenError::Io(e) => FsError::io(e, shown()),
    };
    match resolve::kind_of(stat) {
        Kind::File => Ok(Some(Member {
            name,
            content: Content::File(rel.to_path_buf()),
            mode: stat.st_mode & 0o7777,
            mtime: stat.st_mtime,
        })),
        Kind::Symlink => {
            // Read the link once and judge what was read: a link swapped between a check
            // and a second read could otherwise smuggle an outside target in.
            let target = match beneath.readlink(rel) {
                Ok(target) => target,
                // Gone (or renamed) since the directory was listed: left out.
                Err(e) if e.is_missing() => return Ok(None),
                Err(e) => return Err(failed(e)),
            };
            let leads_out = beneath.link_leads_out(rel, &target).map_err(failed)?;
            Ok((!leads_out).then_some(Member {
                name,
                content: Content::Symlink(target),
                mode: 0o777,
                mtime: stat.st_mtime,
            }))
        }
        _ => Ok(None),
    }
}

/// Gathers the members below one directory input.
struct Collector<'a, 'b> {
    beneath: &'a Beneath<'b>,
    top: &'a CallerPath,
    top_name: &'a str,
    members: &'a mut Vec<Member>,
    limits: Limits,
    /// A domain failure (limit, escape) that ended the walk.
    failure: Option<FsError>,
}

impl Visitor for Collector<'_, '_> {
    fn visit(&mut self, entry: &Entry<'_>) -> std::io::Result<Visit> {
        let stat = match entry.lstat() {
            Ok(stat) => stat,
            // Gone since the directory was listed: the tree changed under the walk.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Visit::Skip),
            Err(e) => return Err(e),
        };
        let member_name = format!("{}/{}", self.top_name, entry.rel());
        let rel = self.top.rel.join(entry.rel_path());
        if entry.kind == Kind::Directory {
            self.members.push(Member {
                name: format!("{member_name}/"),
                content: Content::Dir,
                mode: stat.st_mode & 0o7777,
                mtime: stat.st_mtime,
            });
            return Ok(Visit::Continue);
        }
        let outcome = member_for(self.beneath, &rel, member_name, &stat).and_then(|member| {
            if let Some(member) = member {
                self.members.push(member);
            }
            check_count(self.members, self.limits)
        });
        match outcome {
            Ok(()) => Ok(Visit::Continue),
            Err(failure) => {
                self.failure = Some(failure);
                Ok(Visit::Stop)
            }
        }
    }
}

/// The byte cap surfaces from inside the writers as an I/O error of its own kind; turn
/// it back into the archive's limit.
fn write_error(e: std::io::Error, limits: Limits) -> FsError {
    if e.get_ref().is_some_and(|inner| inner.is::<CapReached>()) {
        FsError::TooLarge {
            limit: limits.max_bytes,
        }
    } else {
        FsError::io(e, "archive")
    }
}

/// The error a [`Capped`] writer fails with at its limit.
#[derive(Debug)]
struct CapReached;

impl std::fmt::Display for CapReached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("archive byte limit reached")
    }
}

impl std::error::Error for CapReached {}

/// Opens a file member beneath the base, confined like any caller path, at the moment
/// it is written. `None`: the file is gone, or was replaced by a symlink, since the walk
/// found it; the archive reflects the tree as it is written and leaves it out.
fn open_member(beneath: &Beneath<'_>, rel: &Path) -> Result<Option<std::fs::File>, FsError> {
    let shown = || beneath.display(rel);
    match beneath.open(
        rel,
        // O_NONBLOCK: a FIFO swapped in must not make the open wait for a writer.
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(std::fs::File::from(fd))),
        Err(e) if e.is_missing() => Ok(None),
        Err(OpenError::Io(e))
            if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) =>
        {
            Ok(None)
        }
        Err(OpenError::Escape) => Err(beneath.base().not_allowed(&shown())),
        Err(OpenError::Io(e)) => Err(FsError::io(e, shown())),
    }
}

/// A writer that refuses to grow past the byte limit, so an oversized archive stops
/// early instead of filling memory first.
struct Capped {
    data: Vec<u8>,
    max: u64,
}

impl Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if (self.data.len() + buf.len()) as u64 > self.max {
            return Err(std::io::Error::other(CapReached));
        }
        self.data.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn write_tar_gz(
    beneath: &Beneath<'_>,
    members: Vec<Member>,
    limits: Limits,
) -> Result<Vec<u8>, FsError> {
    let sink = Capped {
        data: Vec::new(),
        max: limits.max_bytes,
    };
    let gz = flate2::write::GzEncoder::new(sink, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let fail = |e: std::io::Error| write_error(e, limits);
    for member in members {
        let mut header = tar::Header::new_gnu();
        header.set_mode(member.mode);
        header.set_mtime(member.mtime.max(0) as u64);
        match member.content {
            Content::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                tar.append_data(&mut header, &member.name, std::io::empty())
                    .map_err(fail)?;
            }
            Content::Symlink(target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                tar.append_link(
                    &mut header,
                    &member.name,
                    Path::new(OsStr::from_bytes(&target)),
                )
                .map_err(fail)?;
            }
            Content::File(rel) => {
                let Some(mut file) = open_member(beneath, &rel)? else {
                    continue;
                };
                let size = file.metadata().map_err(fail)?.len();
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(size);
                // Exactly `size` bytes, even if the file changes while we read it.
                let reader = (&mut file).take(size).chain(std::io::repeat(0).take(size));
                tar.append_data(&mut header, &member.name, reader.take(size))
                    .map_err(fail)?;
            }
        }
    }
    let gz = tar.into_inner().map_err(fail)?;
    let sink = gz.finish().map_err(fail)?;
    Ok(sink.data)
}

/// Writes a zip through [`ZipWriter`]: members stream through the compressor into the
/// capped output, and zip64 records appear where counts or offsets need them.
fn write_zip(
    beneath: &Beneath<'_>,
    members: Vec<Member>,
    limits: Limits,
) -> Result<Vec<u8>, FsError> {
    let fail = |e: std::io::Error| write_error(e, limits);
    let mut zip = ZipWriter::new(Capped {
        data: Vec::new(),
        max: limits.max_bytes,
    });
    for member in members {
        match member.content {
            Content::Dir => zip
                .add_dir(&member.name, member.mode, member.mtime)
                .map_err(fail)?,
            Content::Symlink(target) => zip
                .add_symlink(&member.name, &target, member.mtime)
                .map_err(fail)?,
            Content::File(rel) => {
                let Some(file) = open_member(beneath, &rel)? else {
                    continue;
                };
                zip.add_file(&member.name, member.mode, member.mtime, file)
                    .map_err(fail)?;
            }
        }
    }
    Ok(zip.finish().map_err(fail)?.data)
}
