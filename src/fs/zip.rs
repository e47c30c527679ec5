//! A streaming zip writer with zip64 support.
//!
//! The output need not be seekable: file members go out as local header, deflated data and
//! data descriptor, and only the central directory (tens of bytes per member) is kept until
//! [`ZipWriter::finish`].
//!
//! Zip64 and members of unknown size: a file member's sizes are only known after its data,
//! so its local header carries zeros and no zip64 field, and the data descriptor after the
//! data uses 4-byte sizes unless a size exceeds 32 bits, then 8-byte ones. The central
//! directory carries the real values, in a zip64 extra field (0x0001) when they need it.
//! This is what Go's archive/zip and Java's ZipOutputStream write. Python's zipfile and
//! Info-ZIP unzip read sizes from the central directory; Java's ZipInputStream picks the
//! descriptor width by the byte counts it saw, which is this rule.
//!
//! The alternative, a zeroed zip64 field in every file's local header and always 8-byte
//! descriptor sizes (APPNOTE 4.3.9.2), was tried and dropped: Java's ZipInputStream before
//! Java 21 then fails on every member ("invalid entry size"), which is far more common than
//! what this layout gives up: libarchive's streaming reader (a zip piped into bsdtar) picks
//! the descriptor width from the local zip64 field, so it loses step after a member whose
//! sizes pass 4 GiB. Its seekable reader, used for files, reads the central directory.

use std::io::{self, Read, Write};

const LOCAL_SIG: u32 = 0x0403_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const DESCRIPTOR_SIG: u32 = 0x0807_4b50;
const END_SIG: u32 = 0x0605_4b50;
const ZIP64_END_SIG: u32 = 0x0606_4b50;
const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
const ZIP64_EXTRA_ID: u16 = 0x0001;

/// General purpose flag: sizes and CRC follow the data in a data descriptor.
const FLAG_DESCRIPTOR: u16 = 1 << 3;
/// General purpose flag: the name is UTF-8.
const FLAG_UTF8: u16 = 1 << 11;

const METHOD_STORED: u16 = 0;
const METHOD_DEFLATED: u16 = 8;

/// Versions needed to extract (APPNOTE 4.4.3.2), in tenths.
const VERSION_STORED: u16 = 10;
const VERSION_DIR_OR_DEFLATE: u16 = 20;
const VERSION_ZIP64: u16 = 45;
/// Upper byte 3: Unix, so readers take the mode from the external attributes' high half.
const MADE_BY: u16 = (3 << 8) | VERSION_ZIP64;

/// Largest value a 32-bit field holds as itself; 0xFFFFFFFF means "see the zip64 field".
const MAX_U32_FIELD: u64 = 0xFFFF_FFFE;
/// Largest entry count the classic end record holds as itself.
const MAX_U16_COUNT: u64 = 0xFFFE;

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;
/// MS-DOS directory attribute, for readers that ignore the Unix half.
const DOS_DIR: u32 = 0x10;

/// Size of each read from a file member and of each compressed piece written.
const CHUNK: usize = 64 * 1024;

/// 1980-01-01T00:00:00Z and 2107-12-31T23:59:59Z, the range of an MS-DOS date.
const DOS_MIN: i64 = 315_532_800;
const DOS_MAX: i64 = 4_354_819_199;

/// Writes a zip archive to `W` as members arrive: deflated file data streams straight into
/// the output (sizes and CRC go in a data descriptor after the data), so no member is held in
/// memory whole.
///
/// After any error the archive is unusable and every later call fails.
pub struct ZipWriter<W: Write> {
    out: W,
    /// Bytes written to `out`: `W` cannot be asked, and offsets are needed for each header.
    offset: u64,
    /// Central directory entries, written out by `finish`.
    central: Vec<u8>,
    entries: u64,
    /// Some member's offset or size needed zip64, so the end records must be zip64 too.
    zip64: bool,
    failed: bool,
    /// Compressor and buffers, made on the first file and reused for the rest.
    deflater: Option<Box<Deflater>>,
}

/// Reusable deflate state: a fresh compressor per member would cost hundreds of KiB each.
struct Deflater {
    compress: flate2::Compress,
    input: Vec<u8>,
    output: Vec<u8>,
}

/// The fields a central directory entry repeats from its member.
struct Entry<'a> {
    name: &'a [u8],
    version: u16,
    flags: u16,
    method: u16,
    time: u16,
    date: u16,
    crc: u32,
    compressed: u64,
    uncompressed: u64,
    offset: u64,
    external: u32,
}

impl<W: Write> ZipWriter<W> {
    /// Starts an archive at the current end of `out`, which is taken to be offset 0.
    pub fn new(out: W) -> Self {
        ZipWriter {
            out,
            offset: 0,
            central: Vec::new(),
            entries: 0,
            zip64: false,
            failed: false,
            deflater: None,
        }
    }

    /// Starts an archive whose first byte lands at `offset` of the file `out` writes to, so
    /// tests can place members beyond 4 GiB without writing that much.
    #[cfg(test)]
    fn starting_at(out: W, offset: u64) -> Self {
        ZipWriter {
            offset,
            ..ZipWriter::new(out)
        }
    }

    /// A directory member; `name` must end with '/'. `mode` is the Unix permission bits (e.g.
    /// 0o755; file type bits are ignored), `mtime` Unix seconds.
    pub fn add_dir(&mut self, name: &str, mode: u32, mtime: i64) -> io::Result<()> {
        check_name(name, true)?;
        self.check_usable()?;
        let (time, date) = dos_time(mtime);
        let entry = Entry {
            name: name.as_bytes(),
            version: VERSION_DIR_OR_DEFLATE,
            flags: FLAG_UTF8,
            method: METHOD_STORED,
            time,
            date,
            crc: 0,
            compressed: 0,
            uncompressed: 0,
            offset: self.offset,
            external: ((S_IFDIR | (mode & 0o7777)) << 16) | DOS_DIR,
        };
        let result = self.write_local(&entry, LocalSizes::Known);
        self.settle(result)?;
        self.push_central(&entry);
        Ok(())
    }

    /// A symbolic link stored as its target (Unix mode 0o120777 in the external attributes,
    /// stored uncompressed). `name` must not end with '/'.
    pub fn add_symlink(&mut self, name: &str, target: &[u8], mtime: i64) -> io::Result<()> {
        check_name(name, false)?;
        self.check_usable()?;
        let (time, date) = dos_time(mtime);
        let size = target.len() as u64;
        let big = size > MAX_U32_FIELD;
        let entry = Entry {
            name: name.as_bytes(),
            version: if big { VERSION_ZIP64 } else { VERSION_STORED },
            flags: FLAG_UTF8,
            method: METHOD_STORED,
            time,
            date,
            crc: crc32fast::hash(target),
            compressed: size,
            uncompressed: size,
            offset: self.offset,
            external: (S_IFLNK | 0o777) << 16,
        };
        let sizes = if big {
            LocalSizes::Zip64
        } else {
            LocalSizes::Known
        };
        let result = self
            .write_local(&entry, sizes)
            .and_then(|()| self.put(target));
        self.settle(result)?;
        self.push_central(&entry);
        Ok(())
    }

    /// A regular file: reads `data` to its end, deflating (flate2, default level) into the
    /// output. Returns the uncompressed byte count. `name` must not end with '/'; `mode` is
    /// the Unix permission bits (file type bits are ignored).
    pub fn add_file(
        &mut self,
        name: &str,
        mode: u32,
        mtime: i64,
        data: impl Read,
    ) -> io::Result<u64> {
        check_name(name, false)?;
        self.check_usable()?;
        let (time, date) = dos_time(mtime);
        let mut entry = Entry {
            name: name.as_bytes(),
            version: VERSION_DIR_OR_DEFLATE,
            flags: FLAG_UTF8 | FLAG_DESCRIPTOR,
            method: METHOD_DEFLATED,
            time,
            date,
            crc: 0,
            compressed: 0,
            uncompressed: 0,
            offset: self.offset,
            external: (S_IFREG | (mode & 0o7777)) << 16,
        };
        let result = self
            .write_local(&entry, LocalSizes::Deferred)
            .and_then(|()| self.deflate(data));
        let (crc, compressed, uncompressed) = self.settle(result)?;
        entry.crc = crc;
        entry.compressed = compressed;
        entry.uncompressed = uncompressed;
        // Java's ZipInputStream reads 8-byte sizes exactly when a count passes u32::MAX, so
        // the width follows that rule (a size of 0xFFFFFFFF still fits in 4 bytes here even
        // though the central directory moves it to the zip64 field).
        let wide = compressed > u64::from(u32::MAX) || uncompressed > u64::from(u32::MAX);
        let mut descriptor = Vec::with_capacity(24);
        descriptor.extend_from_slice(&DESCRIPTOR_SIG.to_le_bytes());
        descriptor.extend_from_slice(&crc.to_le_bytes());
        if wide {
            descriptor.extend_from_slice(&compressed.to_le_bytes());
            descriptor.extend_from_slice(&uncompressed.to_le_bytes());
        } else {
            descriptor.extend_from_slice(&(compressed as u32).to_le_bytes());
            descriptor.extend_from_slice(&(uncompressed as u32).to_le_bytes());
        }
        let result = self.put(&descriptor);
        self.settle(result)?;
        self.push_central(&entry);
        Ok(uncompressed)
    }

    /// Writes the central directory and end records; returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.check_usable()?;
        let central = std::mem::take(&mut self.central);
        let central_offset = self.offset;
        let central_size = central.len() as u64;
        let zip64 = self.zip64
            || self.entries > MAX_U16_COUNT
            || central_size > MAX_U32_FIELD
            || central_offset > MAX_U32_FIELD;

        let mut end = Vec::with_capacity(56 + 20 + 22);
        if zip64 {
            let record_offset = central_offset + central_size;
            end.extend_from_slice(&ZIP64_END_SIG.to_le_bytes());
            // Size of the record after this field.
            end.extend_from_slice(&44u64.to_le_bytes());
            end.extend_from_slice(&MADE_BY.to_le_bytes());
            end.extend_from_slice(&VERSION_ZIP64.to_le_bytes());
            // This disk and the central directory's disk.
            end.extend_from_slice(&[0u8; 8]);
            end.extend_from_slice(&self.entries.to_le_bytes());
            end.extend_from_slice(&self.entries.to_le_bytes());
            end.extend_from_slice(&central_size.to_le_bytes());
            end.extend_from_slice(&central_offset.to_le_bytes());

            end.extend_from_slice(&ZIP64_LOCATOR_SIG.to_le_bytes());
            // Disk holding the zip64 end record.
            end.extend_from_slice(&0u32.to_le_bytes());
            end.extend_from_slice(&record_offset.to_le_bytes());
            // Total number of disks.
            end.extend_from_slice(&1u32.to_le_bytes());
        }
        // With zip64 end records, the classic fields all point readers at them.
        let count = if zip64 { 0xFFFF } else { self.entries as u16 };
        let size = if zip64 {
            0xFFFF_FFFF
        } else {
            central_size as u32
        };
        let offset = if zip64 {
            0xFFFF_FFFF
        } else {
            central_offset as u32
        };
        end.extend_from_slice(&END_SIG.to_le_bytes());
        // This disk and the central directory's disk.
        end.extend_from_slice(&[0u8; 4]);
        end.extend_from_slice(&count.to_le_bytes());
        end.extend_from_slice(&count.to_le_bytes());
        end.extend_from_slice(&size.to_le_bytes());
        end.extend_from_slice(&offset.to_le_bytes());
        // Comment length.
        end.extend_from_slice(&0u16.to_le_bytes());

        self.put(&central)?;
        self.put(&end)?;
        self.out.flush()?;
        Ok(self.out)
    }

    /// Refuses further work once an earlier call failed: the output is cut mid-member.
    fn check_usable(&self) -> io::Result<()> {
        if self.failed {
            Err(io::Error::other(
                "zip writer failed earlier; the archive is incomplete",
            ))
        } else {
            Ok(())
        }
    }

    /// Marks the writer failed when `result` is an error, passing the result through.
    fn settle<T>(&mut self, result: io::Result<T>) -> io::Result<T> {
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    /// Writes all of `bytes` and counts them toward the offset.
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.offset += bytes.len() as u64;
        Ok(())
    }

    /// Writes a member's local header.
    fn write_local(&mut self, entry: &Entry<'_>, sizes: LocalSizes) -> io::Result<()> {
        let extra_len: u16 = match sizes {
            LocalSizes::Known | LocalSizes::Deferred => 0,
            LocalSizes::Zip64 => 20,
        };
        let (crc, compressed, uncompressed) = match sizes {
            LocalSizes::Known => (
                entry.crc,
                entry.compressed as u32,
                entry.uncompressed as u32,
            ),
            // APPNOTE 4.4.4: with a data descriptor these are zero.
            LocalSizes::Deferred => (0, 0, 0),
            LocalSizes::Zip64 => (entry.crc, 0xFFFF_FFFF, 0xFFFF_FFFF),
        };
        let mut header = Vec::with_capacity(30 + entry.name.len() + usize::from(extra_len));
        header.extend_from_slice(&LOCAL_SIG.to_le_bytes());
        header.extend_from_slice(&entry.version.to_le_bytes());
        header.extend_from_slice(&entry.flags.to_le_bytes());
        header.extend_from_slice(&entry.method.to_le_bytes());
        header.extend_from_slice(&entry.time.to_le_bytes());
        header.extend_from_slice(&entry.date.to_le_bytes());
        header.extend_from_slice(&crc.to_le_bytes());
        header.extend_from_slice(&compressed.to_le_bytes());
        header.extend_from_slice(&uncompressed.to_le_bytes());
        // check_name bounded the name to u16.
        header.extend_from_slice(&(entry.name.len() as u16).to_le_bytes());
        header.extend_from_slice(&extra_len.to_le_bytes());
        header.extend_from_slice(entry.name);
        if extra_len > 0 {
            // The local zip64 field holds both sizes, uncompressed first (APPNOTE 4.5.3).
            header.extend_from_slice(&ZIP64_EXTRA_ID.to_le_bytes());
            header.extend_from_slice(&16u16.to_le_bytes());
            header.extend_from_slice(&entry.uncompressed.to_le_bytes());
            header.extend_from_slice(&entry.compressed.to_le_bytes());
        }
        self.put(&header)
    }

    /// Deflates `data` into the output: `(crc, compressed size, uncompressed size)`.
    fn deflate(&mut self, mut data: impl Read) -> io::Result<(u32, u64, u64)> {
        let mut deflater = match self.deflater.take() {
            Some(mut d) => {
                d.compress.reset();
                d
            }
            None => Box::new(Deflater {
                compress: flate2::Compress::new(flate2::Compression::default(), false),
                input: vec![0; CHUNK],
                output: vec![0; CHUNK],
            }),
        };
        let result = self.deflate_with(&mut deflater, &mut data);
        self.deflater = Some(deflater);
        result
    }

    /// The body of `deflate`, with the reusable state lent out.
    fn deflate_with(
        &mut self,
        d: &mut Deflater,
        data: &mut impl Read,
    ) -> io::Result<(u32, u64, u64)> {
        let Deflater {
            compress,
            input,
            output,
        } = d;
        let mut crc = crc32fast::Hasher::new();
        let mut uncompressed = 0u64;
        loop {
            let n = match data.read(input) {
                Ok(0) => break,
                Ok(n) => n.min(input.len()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let mut pending = &input[..n];
            crc.update(pending);
            uncompressed += n as u64;
            while !pending.is_empty() {
                let (used, _) =
                    self.compress_step(compress, output, pending, flate2::FlushCompress::None)?;
                pending = pending.get(used..).unwrap_or_default();
            }
        }
        loop {
            let (_, status) =
                self.compress_step(compress, output, &[], flate2::FlushCompress::Finish)?;
            if status == flate2::Status::StreamEnd {
                break;
            }
        }
        Ok((crc.finalize(), compress.total_out(), uncompressed))
    }

    /// Runs the compressor once and writes what it produced: `(input bytes used, status)`.
    fn compress_step(
        &mut self,
        compress: &mut flate2::Compress,
        output: &mut [u8],
        input: &[u8],
        flush: flate2::FlushCompress,
    ) -> io::Result<(usize, flate2::Status)> {
        let (in_before, out_before) = (compress.total_in(), compress.total_out());
        let status = compress
            .compress(input, output, flush)
            .map_err(io::Error::other)?;
        let used = usize::try_from(compress.total_in() - in_before).unwrap_or(usize::MAX);
        let produced = usize::try_from(compress.total_out() - out_before).unwrap_or(usize::MAX);
        let produced = produced.min(output.len());
        self.put(&output[..produced])?;
        // A step that neither takes input nor produces output (with room to produce) means
        // the compressor is stuck; looping again would never end.
        if used == 0 && produced == 0 && status != flate2::Status::StreamEnd {
            return Err(io::Error::other("deflate made no progress"));
        }
        Ok((used, status))
    }

    /// Appends a member's central directory entry, with a zip64 field for values that do not
    /// fit in 32 bits.
    fn push_central(&mut self, entry: &Entry<'_>) {
        // Values above 32 bits go into the zip64 field in this fixed order (APPNOTE 4.5.3).
        let mut zip64 = [0u8; 24];
        let mut zip64_len = 0;
        let mut field = |value: u64| -> u32 {
            if value > MAX_U32_FIELD {
                zip64[zip64_len..zip64_len + 8].copy_from_slice(&value.to_le_bytes());
                zip64_len += 8;
                0xFFFF_FFFF
            } else {
                value as u32
            }
        };
        let uncompressed = field(entry.uncompressed);
        let compressed = field(entry.compressed);
        let offset = field(entry.offset);
        let (version, extra_len) = if zip64_len > 0 {
            self.zip64 = true;
            (VERSION_ZIP64, 4 + zip64_len as u16)
        } else {
            (entry.version, 0)
        };
        let c = &mut self.central;
        c.extend_from_slice(&CENTRAL_SIG.to_le_bytes());
        c.extend_from_slice(&MADE_BY.to_le_bytes());
        c.extend_from_slice(&version.to_le_bytes());
        c.extend_from_slice(&entry.flags.to_le_bytes());
        c.extend_from_slice(&entry.method.to_le_bytes());
        c.extend_from_slice(&entry.time.to_le_bytes());
        c.extend_from_slice(&entry.date.to_le_bytes());
        c.extend_from_slice(&entry.crc.to_le_bytes());
        c.extend_from_slice(&compressed.to_le_bytes());
        c.extend_from_slice(&uncompressed.to_le_bytes());
        c.extend_from_slice(&(entry.name.len() as u16).to_le_bytes());
        c.extend_from_slice(&extra_len.to_le_bytes());
        // Comment length, disk number start, internal attributes.
        c.extend_from_slice(&[0u8; 6]);
        c.extend_from_slice(&entry.external.to_le_bytes());
        c.extend_from_slice(&offset.to_le_bytes());
        c.extend_from_slice(entry.name);
        if zip64_len > 0 {
            c.extend_from_slice(&ZIP64_EXTRA_ID.to_le_bytes());
            c.extend_from_slice(&(zip64_len as u16).to_le_bytes());
            c.extend_from_slice(&zip64[..zip64_len]);
        }
        self.entries += 1;
    }
}

/// What a local header says about sizes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LocalSizes {
    /// Sizes and CRC are known and fit in 32 bits.
    Known,
    /// Sizes and CRC follow the data in a data descriptor; the header holds zeros.
    Deferred,
    /// Sizes are known but need the zip64 field (a link target past 4 GiB, in theory).
    Zip64,
}

/// Refuses names a header cannot hold, and names whose trailing '/' would make readers see
/// a directory where there is none (or the reverse).
fn check_name(name: &str, dir: bool) -> io::Result<()> {
    if name.len() > usize::from(u16::MAX) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "zip member name longer than 65535 bytes",
        ));
    }
    if name.ends_with('/') != dir {
        let message = if dir {
            "zip directory name must end with '/'"
        } else {
            "zip file or link name must not end with '/'"
        };
        return Err(io::Error::new(io::ErrorKind::InvalidInput, message));
    }
    Ok(())
}

/// MS-DOS time and date fields for `mtime` in UTC (the zip has no time zone; UTC is at least
/// the same everywhere), clamped to the years 1980..=2107 a DOS date can hold.
fn dos_time(mtime: i64) -> (u16, u16) {
    let t = mtime.clamp(DOS_MIN, DOS_MAX);
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    let (year, month, day) = crate::timefmt::civil_from_days(days);
    let (month, day) = (i64::from(month), i64::from(day));
    let time = ((secs / 3600) << 11) | ((secs / 60 % 60) << 5) | (secs % 60 / 2);
    let date = ((year - 1980) << 9) | (month << 5) | day;
    // The clamp keeps both within 16 bits.
    (time as u16, date as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::rc::Rc;

    /// A temporary file removed when dropped, named per test so parallel tests do not clash.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(tag: &str) -> TempFile {
            let name = format!("zipwriter-{}-{tag}.zip", std::process::id());
            TempFile(std::env::temp_dir().join(name))
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Lists an archive with Python's zipfile: testzip's verdict, the entry count, then one
    /// line per entry among the first and last `edge` entries.
    fn python_listing(path: &Path, edge: usize) -> String {
        let script = r#"
import sys, zipfile, zlib
edge = int(sys.argv[2])
with zipfile.ZipFile(sys.argv[1]) as z:
    print("testzip", z.testzip())
    infos = z.infolist()
    print("count", len(infos))
    for n, i in enumerate(infos):
        if edge <= n < len(infos) - edge:
            continue
        data = b"" if i.is_dir() else z.read(i)
        print(i.filename, oct(i.external_attr >> 16), i.create_system, i.compress_type,
              "%04d-%02d-%02d %02d:%02d:%02d" % i.date_time, len(data),
              "%08x" % zlib.crc32(data), data.hex() if len(data) <= 16 else "-")
"#;
        let output = Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(path)
            .arg(edge.to_string())
            .output()
            .expect("python3");
        assert!(
            output.status.success(),
            "python3 failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("utf-8 listing")
    }

    /// Runs `unzip -t` on the archive when unzip is installed; skipped otherwise.
    fn unzip_test(path: &Path) {
        let present = Command::new("sh")
            .args(["-c", "command -v unzip"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !present {
            eprintln!("unzip not installed; skipping unzip -t");
            return;
        }
        let output = Command::new("unzip")
            .arg("-tq")
            .arg(path)
            .output()
            .expect("unzip");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("No errors detected"),
            "unzip -t: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// One expected Python listing line.
    fn line(name: &str, mode: u32, method: u16, date: &str, data: &[u8]) -> String {
        let hex = if data.len() <= 16 {
            data.iter().map(|b| format!("{b:02x}")).collect()
        } else {
            "-".to_string()
        };
        format!(
            "{name} 0o{mode:o} 3 {method} {date} {} {:08x} {hex}\n",
            data.len(),
            crc32fast::hash(data)
        )
    }

    /// Deterministic bytes that deflate barely compresses.
    fn noise(len: usize, mut seed: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    }

    /// A small archive with every member kind, used where the content does not matter.
    fn small_archive<W: Write>(out: W) -> io::Result<W> {
        let mut zip = ZipWriter::new(out);
        zip.add_dir("a/", 0o755, 1_700_000_000)?;
        zip.add_file("a/x.txt", 0o644, 1_700_000_000, &b"hello hello hello"[..])?;
        zip.add_symlink("a/l", b"x.txt", 1_700_000_000)?;
        zip.add_file("a/y.bin", 0o600, 1_700_000_000, &noise(3000, 7)[..])?;
        zip.finish()
    }

    #[test]
    fn round_trip_through_python_and_unzip() {
        let big: Vec<u8> = noise(1 << 20, 1)
            .into_iter()
            .chain(std::iter::repeat_n(b'z', 300_000))
            .collect();
        let file = TempFile::new("round-trip");
        let out = std::fs::File::create(&file.0).unwrap();
        let mut zip = ZipWriter::new(std::io::BufWriter::new(out));
        zip.add_dir("top/", 0o755, 1_700_000_000).unwrap();
        let n = zip
            .add_file("top/hello.txt", 0o644, 1_700_000_001, &b"hello world\n"[..])
            .unwrap();
        assert_eq!(n, 12);
        assert_eq!(
            zip.add_file("top/empty", 0o600, 951_782_400, io::empty())
                .unwrap(),
            0
        );
        assert_eq!(
            zip.add_file("top/big.bin", 0o755, 1_700_000_000, &big[..])
                .unwrap(),
            big.len() as u64
        );
        zip.add_symlink("top/link", b"hello.txt", 1_700_000_000)
            .unwrap();
        zip.add_file("top/ünïcödé.txt", 0o640, 0, &b"utf-8"[..])
            .unwrap();
        zip.add_dir("top/sub/", 0o700, i64::MIN).unwrap();
        zip.add_file("top/sub/late", 0o4755, i64::MAX, &b"future"[..])
            .unwrap();
        zip.finish().unwrap().into_inner().unwrap();

        let expected = [
            "testzip None\ncount 8\n".to_string(),
            line("top/", 0o40755, 0, "2023-11-14 22:13:20", b""),
            line(
                "top/hello.txt",
                0o100644,
                8,
                "2023-11-14 22:13:20",
                b"hello world\n",
            ),
            line("top/empty", 0o100600, 8, "2000-02-29 00:00:00", b""),
            line("top/big.bin", 0o100755, 8, "2023-11-14 22:13:20", &big),
            line("top/link", 0o120777, 0, "2023-11-14 22:13:20", b"hello.txt"),
            line(
                "top/ünïcödé.txt",
                0o100640,
                8,
                "1980-01-01 00:00:00",
                b"utf-8",
            ),
            line("top/sub/", 0o40700, 0, "1980-01-01 00:00:00", b""),
            line(
                "top/sub/late",
                0o104755,
                8,
                "2107-12-31 23:59:58",
                b"future",
            ),
        ]
        .concat();
        assert_eq!(python_listing(&file.0, 100), expected);
        unzip_test(&file.0);
    }

    #[test]
    fn unzip_extracts_links_and_modes() {
        if !Command::new("sh")
            .args(["-c", "command -v unzip"])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            eprintln!("unzip not installed; skipping");
            return;
        }
        let file = TempFile::new("extract");
        std::fs::write(&file.0, small_archive(Vec::new()).unwrap()).unwrap();
        let dir = std::env::temp_dir().join(format!("zipwriter-{}-extract", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let status = Command::new("unzip")
            .arg("-q")
            .arg(&file.0)
            .arg("-d")
            .arg(&dir)
            .status()
            .unwrap();
        let checks = || -> Result<(), String> {
            use std::os::unix::fs::PermissionsExt;
            if !status.success() {
                return Err(format!("unzip: {status}"));
            }
            let link = std::fs::read_link(dir.join("a/l")).map_err(|e| e.to_string())?;
            if link != Path::new("x.txt") {
                return Err(format!("link target {link:?}"));
            }
            let mode = |p: &str| {
                std::fs::symlink_metadata(dir.join(p)).map(|m| m.permissions().mode() & 0o7777)
            };
            let modes = (mode("a/x.txt"), mode("a/y.bin"));
            if !matches!(modes, (Ok(0o644), Ok(0o600))) {
                return Err(format!("modes {modes:?}"));
            }
            let text = std::fs::read(dir.join("a/x.txt")).map_err(|e| e.to_string())?;
            if text != b"hello hello hello" {
                return Err("content".into());
            }
            Ok(())
        };
        let result = checks();
        let _ = std::fs::remove_dir_all(&dir);
        result.unwrap();
    }

    #[test]
    fn zip64_entry_count() {
        let file = TempFile::new("many");
        let out = std::io::BufWriter::new(std::fs::File::create(&file.0).unwrap());
        let mut zip = ZipWriter::new(out);
        for i in 0..70_000 {
            zip.add_dir(&format!("d/{i:05}/"), 0o755, 1_700_000_000)
                .unwrap();
        }
        zip.add_file("f1.txt", 0o644, 1_700_000_000, &b"one"[..])
            .unwrap();
        zip.add_symlink("f2", b"f1.txt", 1_700_000_000).unwrap();
        zip.add_file("f3.txt", 0o644, 1_700_000_000, &b"three"[..])
            .unwrap();
        zip.finish().unwrap().into_inner().unwrap();

        let bytes = std::fs::read(&file.0).unwrap();
        let tail = &bytes[bytes.len() - 98..];
        assert_eq!(tail[0..4], ZIP64_END_SIG.to_le_bytes());
        assert_eq!(tail[24..32], 70_003u64.to_le_bytes());
        assert_eq!(tail[56..60], ZIP64_LOCATOR_SIG.to_le_bytes());
        let record_at = (bytes.len() - 98) as u64;
        assert_eq!(tail[64..72], record_at.to_le_bytes());
        assert_eq!(tail[76..80], END_SIG.to_le_bytes());
        assert_eq!(tail[84..88], [0xFF; 4]);

        let expected = [
            "testzip None\ncount 70003\n".to_string(),
            line("d/00000/", 0o40755, 0, "2023-11-14 22:13:20", b""),
            line("d/00001/", 0o40755, 0, "2023-11-14 22:13:20", b""),
            line("d/00002/", 0o40755, 0, "2023-11-14 22:13:20", b""),
            line("f1.txt", 0o100644, 8, "2023-11-14 22:13:20", b"one"),
            line("f2", 0o120777, 0, "2023-11-14 22:13:20", b"f1.txt"),
            line("f3.txt", 0o100644, 8, "2023-11-14 22:13:20", b"three"),
        ]
        .concat();
        assert_eq!(python_listing(&file.0, 3), expected);
        unzip_test(&file.0);
    }

    #[test]
    fn small_archive_has_no_zip64_end_records() {
        let bytes = small_archive(Vec::new()).unwrap();
        let end = &bytes[bytes.len() - 22..];
        assert_eq!(end[0..4], END_SIG.to_le_bytes());
        assert_eq!(end[8..12], [4, 0, 4, 0]);
        let before = &bytes[bytes.len() - 42..bytes.len() - 38];
        assert_ne!(before, ZIP64_LOCATOR_SIG.to_le_bytes());
    }

    #[test]
    fn file_member_layout() {
        let mut zip = ZipWriter::new(Vec::new());
        zip.add_file("f", 0o644, 0, &b"abc"[..]).unwrap();
        let bytes = zip.finish().unwrap();
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let u32_at =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        // Local header: version 2.0, descriptor + UTF-8 flags, deflate, zero CRC and sizes,
        // no extra field.
        assert_eq!(u32_at(0), LOCAL_SIG);
        assert_eq!((u16_at(4), u16_at(6), u16_at(8)), (20, 0x0808, 8));
        assert_eq!((u32_at(14), u32_at(18), u32_at(22)), (0, 0, 0));
        assert_eq!((u16_at(26), u16_at(28)), (1, 0));
        // Descriptor with 4-byte sizes right before the central directory.
        let central = bytes.len() - 22 - (46 + 1);
        assert_eq!(u32_at(central), CENTRAL_SIG);
        let d = central - 16;
        assert_eq!(u32_at(d), DESCRIPTOR_SIG);
        assert_eq!(u32_at(d + 4), crc32fast::hash(b"abc"));
        assert_eq!(u32_at(d + 8) as usize, d - 31);
        assert_eq!(u32_at(d + 12), 3);
        // Central entry: made by Unix 4.5, sizes and CRC filled in, no extra field.
        assert_eq!(u16_at(central + 4), 0x032D);
        assert_eq!(u32_at(central + 16), crc32fast::hash(b"abc"));
        assert_eq!(u32_at(central + 24), 3);
        assert_eq!(u16_at(central + 30), 0);
        assert_eq!(u32_at(central + 38), 0o100644 << 16);
    }

    #[test]
    fn offsets_beyond_4_gib() {
        // A sparse file puts the archive 5 GiB in without writing that much; offsets are
        // counted from the start of the file, as readers expect.
        let start = 5u64 << 30;
        let file = TempFile::new("far");
        let mut out = std::fs::File::create(&file.0).unwrap();
        out.set_len(start).unwrap();
        io::Seek::seek(&mut out, io::SeekFrom::End(0)).unwrap();
        let mut zip = ZipWriter::starting_at(std::io::BufWriter::new(out), start);
        zip.add_dir("far/", 0o755, 1_700_000_000).unwrap();
        zip.add_file("far/a.txt", 0o644, 1_700_000_000, &b"aaaa"[..])
            .unwrap();
        zip.add_symlink("far/l", b"a.txt", 1_700_000_000).unwrap();
        zip.finish().unwrap().into_inner().unwrap();

        let expected = [
            "testzip None\ncount 3\n".to_string(),
            line("far/", 0o40755, 0, "2023-11-14 22:13:20", b""),
            line("far/a.txt", 0o100644, 8, "2023-11-14 22:13:20", b"aaaa"),
            line("far/l", 0o120777, 0, "2023-11-14 22:13:20", b"a.txt"),
        ]
        .concat();
        assert_eq!(python_listing(&file.0, 10), expected);
        unzip_test(&file.0);
    }

    /// Over 4 GiB of input in one member: slow (deflating and re-reading 4 GiB), so it only
    /// runs on request: `cargo test -- --ignored`.
    #[test]
    #[ignore]
    fn member_larger_than_4_gib() {
        let size = (4u64 << 30) + 12_345;
        let file = TempFile::new("huge");
        let out = std::io::BufWriter::new(std::fs::File::create(&file.0).unwrap());
        let mut zip = ZipWriter::new(out);
        zip.add_file("before", 0o644, 1_700_000_000, &b"x"[..])
            .unwrap();
        let n = zip
            .add_file("huge", 0o644, 1_700_000_000, io::repeat(b'q').take(size))
            .unwrap();
        assert_eq!(n, size);
        zip.add_file("after", 0o644, 1_700_000_000, &b"y"[..])
            .unwrap();
        zip.finish().unwrap().into_inner().unwrap();

        let listing = python_listing(&file.0, 10);
        let mut lines = listing.lines();
        assert_eq!(lines.next(), Some("testzip None"));
        assert_eq!(lines.next(), Some("count 3"));
        assert!(lines.next().unwrap().starts_with("before "));
        let huge = lines.next().unwrap();
        assert!(
            huge.starts_with(&format!("huge 0o100644 3 8 2023-11-14 22:13:20 {size} ")),
            "{huge}"
        );
        assert!(lines.next().unwrap().starts_with("after "));
        unzip_test(&file.0);
    }

    #[test]
    fn empty_archive() {
        let bytes = ZipWriter::new(Vec::new()).finish().unwrap();
        assert_eq!(bytes.len(), 22);
        let file = TempFile::new("empty");
        std::fs::write(&file.0, &bytes).unwrap();
        assert_eq!(python_listing(&file.0, 10), "testzip None\ncount 0\n");
    }

    /// The cap a test writer hits, recognisable after passing through the zip writer.
    #[derive(Debug)]
    struct CapReached;

    impl std::fmt::Display for CapReached {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("archive cap reached")
        }
    }

    impl std::error::Error for CapReached {}

    /// Accepts `left` bytes, a few per call so short writes are exercised, then fails.
    struct Capped {
        data: Vec<u8>,
        left: usize,
    }

    impl Write for Capped {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.left == 0 {
                return Err(io::Error::new(io::ErrorKind::StorageFull, CapReached));
            }
            let n = buf.len().min(self.left).min(5);
            self.data.extend_from_slice(&buf[..n]);
            self.left -= n;
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn writer_errors_propagate_unchanged() {
        let full = small_archive(Vec::new()).unwrap();
        for left in 0..full.len() {
            let err = small_archive(Capped {
                data: Vec::new(),
                left,
            })
            .err()
            .unwrap_or_else(|| panic!("no error with {left} bytes allowed"));
            assert_eq!(err.kind(), io::ErrorKind::StorageFull);
            assert!(err.get_ref().is_some_and(|e| e.is::<CapReached>()));
        }
        // Short writes change nothing in the output.
        let done = small_archive(Capped {
            data: Vec::new(),
            left: full.len(),
        })
        .unwrap();
        assert_eq!(done.data, full);
    }

    #[test]
    fn failed_writer_refuses_more() {
        let mut zip = ZipWriter::new(Capped {
            data: Vec::new(),
            left: 40,
        });
        let err = zip.add_file("a", 0o644, 0, &b"data"[..]).unwrap_err();
        assert!(err.get_ref().is_some_and(|e| e.is::<CapReached>()));
        assert!(zip.add_dir("b/", 0o755, 0).is_err());
        assert!(zip.finish().is_err());
    }

    #[test]
    fn reader_errors_propagate() {
        struct Broken(bool);
        impl Read for Broken {
            fn read(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
                // Interrupted once (to be retried), then a real error.
                if !self.0 {
                    self.0 = true;
                    return Err(io::Error::from(io::ErrorKind::Interrupted));
                }
                Err(io::Error::new(io::ErrorKind::PermissionDenied, "nope"))
            }
        }
        let mut zip = ZipWriter::new(Vec::new());
        let err = zip.add_file("f", 0o644, 0, Broken(false)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(zip.finish().is_err());
    }

    #[test]
    fn bad_names_are_refused_before_writing() {
        let mut zip = ZipWriter::new(Vec::new());
        let kind = |r: io::Result<()>| r.unwrap_err().kind();
        assert_eq!(
            kind(zip.add_dir("nodir", 0o755, 0)),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            kind(zip.add_symlink("dir/", b"x", 0)),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            zip.add_file("dir/", 0o644, 0, io::empty())
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        let long = "x".repeat(65_536);
        assert_eq!(
            zip.add_file(&long, 0o644, 0, io::empty())
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        // Refusals leave the writer usable and the output untouched.
        zip.add_file(&long[..65_535], 0o644, 0, io::empty())
            .unwrap();
        let bytes = zip.finish().unwrap();
        assert_eq!(bytes[0..4], LOCAL_SIG.to_le_bytes());
        let file = TempFile::new("names");
        std::fs::write(&file.0, &bytes).unwrap();
        assert!(python_listing(&file.0, 0).starts_with("testzip None\ncount 1\n"));
    }

    #[test]
    fn file_data_streams_before_the_member_ends() {
        /// Yields noise and records, at its end, how much the writer had already received.
        struct Watched {
            data: Vec<u8>,
            pos: usize,
            written: Rc<Cell<u64>>,
            written_at_end: Rc<Cell<u64>>,
        }
        impl Read for Watched {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(self.data.len() - self.pos);
                buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
                self.pos += n;
                if n == 0 {
                    self.written_at_end.set(self.written.get());
                }
                Ok(n)
            }
        }
        struct Counting(Rc<Cell<u64>>);
        impl Write for Counting {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                self.0.set(self.0.get() + buf.len() as u64);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let written = Rc::new(Cell::new(0));
        let at_end = Rc::new(Cell::new(0));
        let len = 4 << 20;
        let mut zip = ZipWriter::new(Counting(written.clone()));
        zip.add_file(
            "noise",
            0o644,
            0,
            Watched {
                data: noise(len, 3),
                pos: 0,
                written: written.clone(),
                written_at_end: at_end.clone(),
            },
        )
        .unwrap();
        // All but the compressor's last window was out before the input ended.
        assert!(
            at_end.get() > (len as u64) - (512 << 10),
            "{}",
            at_end.get()
        );
        zip.finish().unwrap();
    }

    #[test]
    fn dos_time_fields() {
        let fields = |t| {
            let (time, date) = dos_time(t);
            (
                1980 + (date >> 9),
                (date >> 5) & 15,
                date & 31,
                time >> 11,
                (time >> 5) & 63,
                (time & 31) * 2,
            )
        };
        assert_eq!(fields(1_700_000_001), (2023, 11, 14, 22, 13, 20));
        assert_eq!(fields(951_782_400), (2000, 2, 29, 0, 0, 0));
        assert_eq!(fields(DOS_MIN - 1), (1980, 1, 1, 0, 0, 0));
        assert_eq!(fields(i64::MIN), (1980, 1, 1, 0, 0, 0));
        assert_eq!(fields(DOS_MAX + 1), (2107, 12, 31, 23, 59, 58));
        assert_eq!(fields(i64::MAX), (2107, 12, 31, 23, 59, 58));
        assert_eq!(fields(1_234_567_890), (2009, 2, 13, 23, 31, 30));
    }
}
