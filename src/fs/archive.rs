//! `POST /files/archive`: tar.gz or zip of caller paths, built on the blocking pool (it is
//! compression, CPU-bound) from files opened beneath the base directory only.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use super::resolve::{self, CallerPath, Kind, OpenError};
use crate::error::ApiError;

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
    File(OwnedFd),
    Dir,
    Symlink(Vec<u8>),
}

struct Member {
    name: String,
    content: Content,
    mode: u32,
    mtime: i64,
}

/// Builds the archive of `inputs` (caller paths) and returns its bytes.
pub fn build(
    base: &Path,
    inputs: &[String],
    format: Format,
    limits: Limits,
) -> Result<Vec<u8>, ApiError> {
    let base_fd =
        resolve::open_base(base).map_err(|e| resolve::io_error(&e, &base.to_string_lossy()))?;
    let mut members = Vec::new();
    for input in inputs {
        let caller = CallerPath::new(base, input)?;
        let stat = resolve::lstat_beneath(base_fd.as_fd(), base, &caller.rel)
            .map_err(|e| e.into_api(input, base))?
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    "FileNotFoundError",
                    format!("Path not found: {}", caller.display()),
                )
            })?;
        let top_name = caller
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| {
                base.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "base".into())
            });
        match resolve::kind_of(&stat) {
            Kind::Directory => {
                let dir = resolve::open_beneath(
                    base_fd.as_fd(),
                    base,
                    &caller.rel,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
                    Mode::empty(),
                )
                .map_err(|e| e.into_api(input, base))?;
                members.push(Member {
                    name: format!("{top_name}/"),
                    content: Content::Dir,
                    mode: stat.st_mode & 0o7777,
                    mtime: stat.st_mtime,
                });
                let walk = Walk {
                    base_fd: base_fd.as_fd(),
                    base,
                    limits,
                };
                collect_dir(&walk, &caller.rel, dir.as_fd(), &top_name, &mut members, 0)?;
            }
            _ => {
                if let Some(member) =
                    member_for(base_fd.as_fd(), base, &caller.rel, top_name, &stat)?
                {
                    members.push(member);
                }
            }
        }
        check_count(&members, limits)?;
    }
    match format {
        Format::TarGz => write_tar_gz(members, limits),
        Format::Zip => write_zip(members, limits),
    }
}

fn check_count(members: &[Member], limits: Limits) -> Result<(), ApiError> {
    let files = members
        .iter()
        .filter(|m| !matches!(m.content, Content::Dir))
        .count();
    if files > limits.max_files {
        return Err(ApiError::bad_request(format!(
            "Too many files: more than {} in one archive",
            limits.max_files
        )));
    }
    Ok(())
}

/// A member for a non-directory entry at `rel`, or `None` when it is skipped (a symlink
/// leading outside the base directory, a socket or device).
fn member_for(
    base_fd: BorrowedFd<'_>,
    base: &Path,
    rel: &Path,
    name: String,
    stat: &rustix::fs::Stat,
) -> Result<Option<Member>, ApiError> {
    let shown = base.join(rel).to_string_lossy().into_owned();
    match resolve::kind_of(stat) {
        Kind::File => {
            let fd = resolve::open_beneath(
                base_fd,
                base,
                rel,
                // O_NONBLOCK: a FIFO swapped in must not make the open wait for a writer.
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
                Mode::empty(),
            )
            .map_err(|e| e.into_api(&shown, base))?;
            Ok(Some(Member {
                name,
                content: Content::File(fd),
                mode: stat.st_mode & 0o7777,
                mtime: stat.st_mtime,
            }))
        }
        Kind::Symlink => {
            match resolve::open_beneath(base_fd, base, rel, OFlags::PATH, Mode::empty()) {
                // Its target lies beneath the base: keep the link itself.
                Ok(_) => {
                    let target = resolve::readlink_beneath(base_fd, base, rel)
                        .map_err(|e| e.into_api(&shown, base))?;
                    Ok(Some(Member {
                        name,
                        content: Content::Symlink(target),
                        mode: 0o777,
                        mtime: stat.st_mtime,
                    }))
                }
                Err(OpenError::Escape) => Ok(None),
                // A dangling link inside the base is kept as a link too.
                Err(e) if e.is_not_found() => {
                    let target = resolve::readlink_beneath(base_fd, base, rel)
                        .map_err(|e| e.into_api(&shown, base))?;
                    let stays_inside = resolve::CallerPath::new(
                        base,
                        &base
                            .join(rel)
                            .parent()
                            .unwrap_or(base)
                            .join(OsStr::from_bytes(&target))
                            .to_string_lossy(),
                    )
                    .is_ok();
                    Ok(stays_inside.then(|| Member {
                        name,
                        content: Content::Symlink(target),
                        mode: 0o777,
                        mtime: stat.st_mtime,
                    }))
                }
                Err(e) => Err(e.into_api(&shown, base)),
            }
        }
        _ => Ok(None),
    }
}

/// What every level of an archive walk shares.
struct Walk<'a> {
    base_fd: BorrowedFd<'a>,
    base: &'a Path,
    limits: Limits,
}

fn collect_dir(
    walk: &Walk<'_>,
    rel: &Path,
    dir: BorrowedFd<'_>,
    prefix: &str,
    members: &mut Vec<Member>,
    depth: usize,
) -> Result<(), ApiError> {
    let (base_fd, base, limits) = (walk.base_fd, walk.base, walk.limits);
    if depth > resolve::MAX_TREE_DEPTH {
        return Err(resolve::io_error(
            &resolve::too_deep(),
            &base.join(rel).to_string_lossy(),
        ));
    }
    let shown = base.join(rel).to_string_lossy().into_owned();
    let names = resolve::read_dir_sorted(dir).map_err(|e| resolve::io_error(&e, &shown))?;
    for name in names {
        let child_rel: PathBuf = rel.join(OsStr::from_bytes(&name));
        let member_name = format!("{prefix}/{}", String::from_utf8_lossy(&name));
        let stat = resolve::lstat_child(dir, &name).map_err(|e| resolve::io_error(&e, &shown))?;
        if resolve::kind_of(&stat) == Kind::Directory {
            let child =
                resolve::open_child_dir(dir, &name).map_err(|e| resolve::io_error(&e, &shown))?;
            members.push(Member {
                name: format!("{member_name}/"),
                content: Content::Dir,
                mode: stat.st_mode & 0o7777,
                mtime: stat.st_mtime,
            });
            collect_dir(
                walk,
                &child_rel,
                child.as_fd(),
                &member_name,
                members,
                depth + 1,
            )?;
        } else if let Some(member) = member_for(base_fd, base, &child_rel, member_name, &stat)? {
            members.push(member);
            check_count(members, limits)?;
        }
    }
    Ok(())
}

/// The byte cap surfaces from inside the writers as an I/O error; turn it back into 413.
fn write_error(e: std::io::Error, limits: Limits) -> ApiError {
    if e.to_string() == CAP_REACHED {
        too_large(limits)
    } else {
        ApiError::internal("OSError", e.to_string())
    }
}

const CAP_REACHED: &str = "archive byte limit";

fn too_large(limits: Limits) -> ApiError {
    ApiError::new(
        413,
        "ValueError",
        format!("Archive too large: over {} bytes", limits.max_bytes),
    )
    .with_code("payload_too_large")
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
            return Err(std::io::Error::other(CAP_REACHED));
        }
        self.data.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn write_tar_gz(members: Vec<Member>, limits: Limits) -> Result<Vec<u8>, ApiError> {
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
            Content::File(fd) => {
                let mut file = std::fs::File::from(fd);
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

/// Writes a zip (deflate, no zip64: the 100 MiB cap keeps every offset in 32 bits).
fn write_zip(members: Vec<Member>, limits: Limits) -> Result<Vec<u8>, ApiError> {
    let mut out = Capped {
        data: Vec::new(),
        max: limits.max_bytes,
    };
    let mut central = Vec::new();
    let mut count: u16 = 0;
    let fail = |e: std::io::Error| write_error(e, limits);
    for member in members {
        let (data, method, crc, raw_len, external, name) = match member.content {
            Content::Dir => (
                Vec::new(),
                0u16,
                0u32,
                0u64,
                (0o40000 | member.mode) << 16 | 0x10,
                member.name,
            ),
            Content::Symlink(target) => {
                let crc = crc32fast::hash(&target);
                let len = target.len() as u64;
                (target, 0, crc, len, (0o120000 | 0o777) << 16, member.name)
            }
            Content::File(fd) => {
                // Streamed through the compressor in 1 MiB reads: the raw file is never
                // held whole, and the compressed member is capped like the archive.
                let mut file = std::fs::File::from(fd);
                let mut crc = crc32fast::Hasher::new();
                let packed = Capped {
                    data: Vec::new(),
                    max: limits.max_bytes,
                };
                let mut deflater =
                    flate2::write::DeflateEncoder::new(packed, flate2::Compression::default());
                let mut chunk = vec![0u8; 1 << 20];
                let mut raw_len = 0u64;
                loop {
                    let n = file.read(&mut chunk).map_err(fail)?;
                    if n == 0 {
                        break;
                    }
                    crc.update(&chunk[..n]);
                    raw_len += n as u64;
                    deflater.write_all(&chunk[..n]).map_err(fail)?;
                }
                if raw_len > u32::MAX as u64 {
                    // Beyond 4 GiB a member needs zip64; compressed it would pass the cap anyway.
                    return Err(too_large(limits));
                }
                let data = deflater.finish().map_err(fail)?.data;
                let (method, crc) = (8u16, crc.finalize());
                (
                    data,
                    method,
                    crc,
                    raw_len,
                    (0o100000 | member.mode) << 16,
                    member.name,
                )
            }
        };
        let (time, date) = dos_time(member.mtime);
        let offset = out.data.len() as u32;
        let name = name.as_bytes();
        let mut local = Vec::with_capacity(30 + name.len());
        local.extend_from_slice(&0x04034b50u32.to_le_bytes());
        local.extend_from_slice(&20u16.to_le_bytes()); // version needed
        local.extend_from_slice(&0x0800u16.to_le_bytes()); // UTF-8 names
        local.extend_from_slice(&method.to_le_bytes());
        local.extend_from_slice(&time.to_le_bytes());
        local.extend_from_slice(&date.to_le_bytes());
        local.extend_from_slice(&crc.to_le_bytes());
        local.extend_from_slice(&(data.len() as u32).to_le_bytes());
        local.extend_from_slice(&(raw_len as u32).to_le_bytes());
        local.extend_from_slice(&(name.len() as u16).to_le_bytes());
        local.extend_from_slice(&0u16.to_le_bytes());
        local.extend_from_slice(name);
        out.write_all(&local).map_err(fail)?;
        out.write_all(&data).map_err(fail)?;

        central.extend_from_slice(&0x02014b50u32.to_le_bytes());
        central.extend_from_slice(&(3u16 << 8 | 20).to_le_bytes()); // made by: Unix
        central.extend_from_slice(&20u16.to_le_bytes());
        central.extend_from_slice(&0x0800u16.to_le_bytes());
        central.extend_from_slice(&method.to_le_bytes());
        central.extend_from_slice(&time.to_le_bytes());
        central.extend_from_slice(&date.to_le_bytes());
        central.extend_from_slice(&crc.to_le_bytes());
        central.extend_from_slice(&(data.len() as u32).to_le_bytes());
        central.extend_from_slice(&(raw_len as u32).to_le_bytes());
        central.extend_from_slice(&(name.len() as u16).to_le_bytes());
        central.extend_from_slice(&[0u8; 8]); // extra len, comment len, disk start, internal attrs
        central.extend_from_slice(&external.to_le_bytes());
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name);
        count = count.saturating_add(1);
    }
    let central_offset = out.data.len() as u32;
    out.write_all(&central).map_err(fail)?;
    let mut end = Vec::with_capacity(22);
    end.extend_from_slice(&0x06054b50u32.to_le_bytes());
    end.extend_from_slice(&[0u8; 4]);
    end.extend_from_slice(&count.to_le_bytes());
    end.extend_from_slice(&count.to_le_bytes());
    end.extend_from_slice(&(central.len() as u32).to_le_bytes());
    end.extend_from_slice(&central_offset.to_le_bytes());
    end.extend_from_slice(&0u16.to_le_bytes());
    out.write_all(&end).map_err(fail)?;
    Ok(out.data)
}

/// MS-DOS time and date fields (local time is unknown here; UTC is used).
fn dos_time(mtime: i64) -> (u16, u16) {
    let mtime = mtime.max(315_532_800); // 1980-01-01, the earliest DOS date
    let days = mtime.div_euclid(86_400);
    let secs = mtime.rem_euclid(86_400);
    let (y, m, d) = crate::timefmt::civil_from_days(days);
    let time = (((secs / 3600) << 11) | ((secs / 60 % 60) << 5) | ((secs % 60) / 2)) as u16;
    let date = (((y - 1980).clamp(0, 127)) << 9 | (m as i64) << 5 | d as i64) as u16;
    (time, date)
}
