//! Facts about the machine, read from the kernel without helper programs: `/proc`
//! files, `statvfs`, `uname`. Everything here blocks briefly on the file system, so
//! callers run it on the blocking pool.

pub mod ports;

use std::io;
use std::path::Path;

/// Memory from `/proc/meminfo`, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub total_kib: u64,
    pub available_kib: u64,
}

impl Memory {
    pub fn read() -> io::Result<Memory> {
        Self::parse(&std::fs::read_to_string("/proc/meminfo")?)
    }

    /// `MemAvailable` when the kernel has it (3.14+), else free + buffers + cached.
    pub fn parse(text: &str) -> io::Result<Memory> {
        let field = |name: &str| -> Option<u64> {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        };
        let total_kib = field("MemTotal").ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "/proc/meminfo has no MemTotal")
        })?;
        let available_kib = field("MemAvailable").unwrap_or_else(|| {
            field("MemFree").unwrap_or(0)
                + field("Buffers").unwrap_or(0)
                + field("Cached").unwrap_or(0)
        });
        Ok(Memory {
            total_kib,
            available_kib,
        })
    }
}

/// A file system's size in bytes, as Python's `shutil.disk_usage` reports it: `free`
/// is what an unprivileged user may still write (`f_bavail`), `used` is what is
/// allocated (`f_blocks - f_bfree`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disk {
    pub total: u64,
    pub used: u64,
    pub free: u64,
}

impl Disk {
    pub fn of(path: &Path) -> io::Result<Disk> {
        let stat = rustix::fs::statvfs(path)?;
        let unit = stat.f_frsize;
        Ok(Disk {
            total: stat.f_blocks * unit,
            used: (stat.f_blocks - stat.f_bfree) * unit,
            free: stat.f_bavail * unit,
        })
    }
}

/// The 1, 5 and 15 minute load averages from `/proc/loadavg`.
pub fn load_average() -> io::Result<[f64; 3]> {
    parse_load_average(&std::fs::read_to_string("/proc/loadavg")?)
}

fn parse_load_average(text: &str) -> io::Result<[f64; 3]> {
    let mut fields = text.split_whitespace().map(str::parse::<f64>);
    let mut next = || {
        fields.next().and_then(Result::ok).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "/proc/loadavg is not three numbers",
            )
        })
    };
    Ok([next()?, next()?, next()?])
}

/// `uname`: the kernel's name (`Linux`), the machine (`x86_64`) and the host name.
pub struct Uname {
    pub sysname: String,
    pub machine: String,
    pub nodename: String,
}

impl Uname {
    pub fn read() -> Uname {
        let u = rustix::system::uname();
        let text = |c: &std::ffi::CStr| c.to_string_lossy().into_owned();
        Uname {
            sysname: text(u.sysname()),
            machine: text(u.machine()),
            nodename: text(u.nodename()),
        }
    }
}

/// Online CPUs, as Python's `os.cpu_count()` counts them (`_SC_NPROCESSORS_ONLN`).
pub fn cpu_count() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u64::try_from(n).unwrap_or(1).max(1)
}

/// `value` rounded to `places` decimals, as Python's `round` shows it in JSON.
pub fn round_to(value: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (value * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_loadavg_parse() {
        let text =
            "MemTotal:       16303856 kB\nMemFree:         1234 kB\nMemAvailable:   8151928 kB\n";
        assert_eq!(
            Memory::parse(text).unwrap(),
            Memory {
                total_kib: 16303856,
                available_kib: 8151928
            }
        );
        let old = "MemTotal: 100 kB\nMemFree: 10 kB\nBuffers: 5 kB\nCached: 20 kB\n";
        assert_eq!(Memory::parse(old).unwrap().available_kib, 35);
        assert!(Memory::parse("nothing").is_err());
        assert_eq!(
            parse_load_average("0.52 0.58 0.59 2/345 12345\n").unwrap(),
            [0.52, 0.58, 0.59]
        );
        assert!(parse_load_average("0.1").is_err());
        assert!(Memory::read().unwrap().total_kib > 0);
        assert!(Disk::of(Path::new("/")).unwrap().total > 0);
    }
}
