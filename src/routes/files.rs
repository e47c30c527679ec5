//! The file_ops group: the contract's twelve file routes, plus the raw streaming forms of
//! upload-stream and download-stream (`docs/api.md`).

use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{handler, Endpoint, Group, Method, Param};
use crate::error::ApiError;
use crate::fs::aio::{blocking, AsyncFile};
use crate::fs::archive::{self, Format};
use crate::fs::resolve::{self, CallerPath, Kind, OpenError};
use crate::fs::{fnmatch::fnmatch, watch, write};
use crate::http::response::JSON_CONTENT_TYPE;
use crate::http::{sse, Request, Response};
use crate::timefmt::iso8601_utc;

/// Recursion depth of `/files/list`.
pub const LIST_MAX_DEPTH: usize = 3;
const SEARCH_DEFAULT_DEPTH: i64 = 5;
const SEARCH_DEFAULT_RESULTS: i64 = 100;
const SEARCH_TIME_LIMIT: Duration = Duration::from_secs(10);
const ARCHIVE_MAX_FILES: usize = 10_000;
const ARCHIVE_MAX_BYTES: u64 = 100 * 1024 * 1024;
/// Bodies and payloads above this are parsed, decoded and encoded on the blocking pool,
/// so one large transfer does not stall the other connections of its worker.
const OFFLOAD_BYTES: usize = 256 * 1024;

pub fn endpoints() -> Vec<Endpoint> {
    let path_q = Param::query("path", "string", true);
    vec![
        Endpoint::new(Method::Post, "/upload", Group::FileOps, handler(upload))
            .id("upload")
            .summary("Write a file from base64 content (atomic; parent directories created).")
            .params(&[
                Param::body("path", "string", true),
                Param::body("content_base64", "string", true),
            ])
            .parses_whole_body(),
        Endpoint::new(Method::Get, "/download", Group::FileOps, handler(download))
            .id("download")
            .summary("Read a file as base64.")
            .params(std::slice::from_ref(&path_q)),
        Endpoint::new(Method::Get, "/files/list", Group::FileOps, handler(list))
            .id("files_list")
            .summary("List a directory (recursive to depth 3 with recursive=true).")
            .params(&[path_q.clone(), Param::query("recursive", "boolean", false)])
            .limit("max_depth", LIST_MAX_DEPTH),
        Endpoint::new(Method::Get, "/files/stat", Group::FileOps, handler(stat))
            .id("files_stat")
            .summary("Metadata of a path; exists is false when nothing is there.")
            .params(std::slice::from_ref(&path_q)),
        Endpoint::new(Method::Post, "/files/mkdir", Group::FileOps, handler(mkdir))
            .id("files_mkdir")
            .summary("Create a directory and its parents.")
            .params(&[Param::body("path", "string", true)]),
        Endpoint::new(Method::Delete, "/files", Group::FileOps, handler(delete))
            .id("files_delete")
            .summary("Delete a file or a directory tree.")
            .params(std::slice::from_ref(&path_q)),
        Endpoint::new(
            Method::Post,
            "/files/move",
            Group::FileOps,
            handler(move_path),
        )
        .id("files_move")
        .summary("Move or rename a file or directory.")
        .params(&[
            Param::body("source", "string", true),
            Param::body("destination", "string", true),
        ]),
        Endpoint::new(
            Method::Post,
            "/files/search",
            Group::FileOps,
            handler(search),
        )
        .id("files_search")
        .summary("Find files whose name matches an fnmatch pattern.")
        .params(&[
            Param::body("path", "string", false),
            Param::body("pattern", "string", false),
            Param::body("max_depth", "integer", false),
            Param::body("max_results", "integer", false),
        ])
        .limit("max_depth", SEARCH_DEFAULT_DEPTH)
        .limit("max_results", SEARCH_DEFAULT_RESULTS)
        .limit("timeout_seconds", SEARCH_TIME_LIMIT.as_secs()),
        Endpoint::new(
            Method::Post,
            "/files/upload-stream",
            Group::FileOps,
            handler(upload_stream),
        )
        .id("files_upload_stream")
        .summary("Upload as /upload does, or stream a raw application/octet-stream body to disk.")
        .params(&[
            Param::body("path", "string", true),
            Param::body("content_base64", "string", true),
            Param::query("path", "string", false),
        ])
        .parses_whole_body()
        .raw_body(),
        Endpoint::new(
            Method::Get,
            "/files/download-stream",
            Group::FileOps,
            handler(download_stream),
        )
        .id("files_download_stream")
        .summary("Download as /download does plus bytes, or raw bytes with Range and ETag.")
        .params(&[path_q.clone(), Param::query("raw", "boolean", false)]),
        Endpoint::new(
            Method::Post,
            "/files/archive",
            Group::FileOps,
            handler(archive_paths),
        )
        .id("files_archive")
        .summary("Pack paths into a tar.gz or zip archive, returned as base64.")
        .params(&[
            Param::body("paths", "array", true),
            Param::body("format", "string", false),
        ])
        .limit("max_files", ARCHIVE_MAX_FILES)
        .limit("max_bytes", ARCHIVE_MAX_BYTES)
        .parses_whole_body(),
        Endpoint::new(
            Method::Get,
            "/files/watch",
            Group::FileOps,
            handler(watch_dir),
        )
        .id("files_watch")
        .summary("Server-sent events for changes below a directory.")
        .streaming(true)
        .params(&[
            path_q,
            Param::query("recursive", "boolean", false),
            Param::query("interval", "number", false),
            Param::query("timeout", "number", false),
        ])
        .limit("max_entries", watch::MAX_TRACKED),
    ]
}

// ---- helpers ---------------------------------------------------------------------------

fn base_of(request: &Request) -> PathBuf {
    request.state().base_dir.clone()
}

fn driver_of(request: &Request) -> &'static str {
    request.state().io_driver
}

/// The `path` query parameter, required.
fn query_path(request: &Request) -> Result<String, ApiError> {
    request
        .query("path")
        .map(str::to_string)
        .ok_or_else(|| ApiError::bad_request("path is required (query parameter ?path=)"))
}

/// A required string body field.
fn body_string(value: Option<&Value>, field: &str) -> Result<String, ApiError> {
    match value {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            Err(ApiError::bad_request(format!("{field} is required")))
        }
        Some(_) => Err(ApiError::bad_request(format!("{field} must be a string"))),
    }
}

fn truthy(value: Option<&str>) -> bool {
    matches!(
        value.map(str::to_ascii_lowercase).as_deref(),
        Some("1" | "true" | "yes" | "on")
    )
}

/// An integer field as Python's `int()` takes it: integers, integral floats (truncated),
/// numeric strings and booleans.
fn int_field(body: &Value, field: &str, default: i64) -> Result<i64, ApiError> {
    let bad = || ApiError::bad_request(format!("{field} must be an integer"));
    match body.get(field) {
        None => Ok(default),
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.is_finite())
                    .map(|f| f.trunc() as i64)
            })
            .ok_or_else(bad),
        Some(Value::Bool(b)) => Ok(i64::from(*b)),
        Some(Value::String(s)) => s.trim().parse::<i64>().map_err(|_| bad()),
        Some(_) => Err(bad()),
    }
}

fn iso_of(secs: i64, nanos: i64) -> String {
    iso8601_utc(secs, nanos.clamp(0, 999_999_999) as u32)
}

/// Decodes standard base64; if strict decoding fails, retries without ASCII whitespace
/// (line-wrapped output of `base64`), as Python's `b64decode` tolerates.
fn decode_base64(text: &str, limit: u64) -> Result<Vec<u8>, ApiError> {
    // Decoded size is at most 3/4 of the text; refuse before allocating when clearly over.
    if (text.len() as u64 / 4).saturating_mul(3) > limit + 3 {
        return Err(upload_too_large(limit));
    }
    let decoded = match base64_simd::STANDARD.decode_to_vec(text.as_bytes()) {
        Ok(data) => data,
        Err(_) => {
            let compact: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
            base64_simd::STANDARD
                .decode_to_vec(&compact)
                .map_err(|_| ApiError::bad_request("content_base64 is not valid standard base64"))?
        }
    };
    if decoded.len() as u64 > limit {
        return Err(upload_too_large(limit));
    }
    Ok(decoded)
}

fn upload_too_large(limit: u64) -> ApiError {
    ApiError::new(
        413,
        "ValueError",
        format!("Upload too large: the limit is {limit} bytes (ABX_MAX_UPLOAD_SIZE)"),
    )
    .with_code("payload_too_large")
}

fn blocking_open_error(e: OpenError, input: &str, base: &Path) -> ApiError {
    e.into_api(input, base)
}

/// Opens the caller's directory beneath the base; a missing path, or one that is not a
/// directory, is the contract's 404. Blocking.
fn open_dir_or_404(
    base_fd: std::os::fd::BorrowedFd<'_>,
    base: &Path,
    caller: &CallerPath,
    input: &str,
    flags: OFlags,
) -> Result<std::os::fd::OwnedFd, ApiError> {
    match resolve::open_beneath(
        base_fd,
        base,
        &caller.rel,
        flags | OFlags::DIRECTORY,
        Mode::empty(),
    ) {
        Ok(dir) => Ok(dir),
        Err(OpenError::Io(e))
            if matches!(
                e.raw_os_error().map(rustix::io::Errno::from_raw_os_error),
                Some(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR)
            ) =>
        {
            Err(ApiError::new(
                404,
                "FileNotFoundError",
                format!("Directory not found: {}", caller.display()),
            ))
        }
        Err(e) => Err(blocking_open_error(e, input, base)),
    }
}

// ---- upload ----------------------------------------------------------------------------

#[derive(Deserialize)]
struct UploadBody<'a> {
    #[serde(borrow, default)]
    path: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    content_base64: Option<std::borrow::Cow<'a, str>>,
}

fn parse_upload(body: &[u8], limit: u64) -> Result<(String, Vec<u8>), ApiError> {
    let body: &[u8] = if crate::http::request::is_blank(body) {
        b"{}"
    } else {
        body
    };
    let parsed: UploadBody = serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => {
            ApiError::bad_request(format!("Invalid request body: {e}"))
        }
        _ => ApiError::bad_request(format!("Invalid JSON body: {e}")),
    })?;
    let path = parsed
        .path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::bad_request("path is required"))?;
    let content = parsed
        .content_base64
        .ok_or_else(|| ApiError::bad_request("content_base64 is required"))?;
    Ok((path.into_owned(), decode_base64(&content, limit)?))
}

async fn upload(mut request: Request) -> Result<Response, ApiError> {
    let limit = request.state().config.max_upload_size;
    let body = request.take_body();
    let (input, data) = if body.len() > OFFLOAD_BYTES {
        blocking(move || parse_upload(&body, limit)).await??
    } else {
        parse_upload(&body, limit)?
    };
    let base = base_of(&request);
    let caller = CallerPath::new(&base, &input)?;
    let (bytes, shown) =
        write::write_atomic(base, caller, input, data, driver_of(&request)).await?;
    Ok(Response::ok(&json!({"path": shown, "bytes": bytes})))
}

async fn upload_stream(request: Request) -> Result<Response, ApiError> {
    if !request.is_raw_body() {
        return upload(request).await;
    }
    let input = query_path(&request)?;
    let base = base_of(&request);
    let caller = CallerPath::new(&base, &input)?;
    let sink = write::UploadSink::open(base, caller, input, driver_of(&request)).await?;
    Ok(Response::accept_body(Box::new(sink)))
}

// ---- download --------------------------------------------------------------------------

struct Opened {
    fd: std::os::fd::OwnedFd,
    stat: rustix::fs::Stat,
    /// The whole content, when the file was small enough to read in the same pool task.
    small: Option<Vec<u8>>,
}

/// Files up to this size are read in the pool task that opens them: one hand-off instead
/// of an open on the pool followed by an io_uring read (docs/architecture.md).
const SMALL_FILE_BYTES: u64 = 64 * 1024;

/// Opens a regular file beneath the base for reading (404 when missing or not a file).
async fn open_regular(
    request: &Request,
    input: &str,
    read_small: bool,
) -> Result<(CallerPath, Opened), ApiError> {
    let base = base_of(request);
    let caller = CallerPath::new(&base, input)?;
    // Fast path: everything cached, no hand-off to the pool at all.
    let not_a_file =
        |shown: &str| ApiError::new(404, "FileNotFoundError", format!("Not a file: {shown}"));
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    match resolve::open_beneath_cached(&base, &caller.rel, OFlags::RDONLY | OFlags::NONBLOCK) {
        Ok(Some(fd)) => {
            let shown = caller.display();
            let stat = rustix::fs::fstat(&fd).map_err(|e| resolve::io_error(&e.into(), &shown))?;
            if resolve::kind_of(&stat) != Kind::File {
                return Err(not_a_file(&shown));
            }
            let mut small = None;
            if read_small && stat.st_size as u64 <= SMALL_FILE_BYTES {
                // One byte of slack shows whether the file grew since fstat.
                small = AsyncFile::read_cached(fd.as_fd(), stat.st_size as usize)
                    .filter(|data| data.len() as u64 <= stat.st_size as u64);
            }
            return Ok((caller, Opened { fd, stat, small }));
        }
        Err(e) if e.is_not_found() => {
            return Err(ApiError::new(
                404,
                "FileNotFoundError",
                format!("File not found: {}", caller.display()),
            ));
        }
        Err(OpenError::Io(e))
            if e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) =>
        {
            return Err(ApiError::new(
                404,
                "FileNotFoundError",
                format!("File not found: {}", caller.display()),
            ));
        }
        Err(e) => return Err(e.into_api(input, &base)),
        Ok(None) => {}
    }
    let rel = caller.rel.clone();
    let shown = caller.display();
    let input_owned = input.to_string();
    let opened = blocking(move || -> Result<Opened, ApiError> {
        let base_fd = resolve::open_base(&base).map_err(|e| resolve::io_error(&e, &input_owned))?;
        let fd = match resolve::open_beneath(
            base_fd.as_fd(),
            &base,
            &rel,
            OFlags::RDONLY | OFlags::NONBLOCK,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) if e.is_not_found() => {
                return Err(ApiError::new(
                    404,
                    "FileNotFoundError",
                    format!("File not found: {shown}"),
                ))
            }
            Err(e) => return Err(blocking_open_error(e, &input_owned, &base)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(|e| resolve::io_error(&e.into(), &shown))?;
        if resolve::kind_of(&stat) != Kind::File {
            return Err(ApiError::new(
                404,
                "FileNotFoundError",
                format!("Not a file: {shown}"),
            ));
        }
        let mut small = None;
        if read_small && stat.st_size as u64 <= SMALL_FILE_BYTES {
            use std::io::Read;
            // One byte of slack shows whether the file grew since fstat.
            let mut data = Vec::with_capacity(stat.st_size as usize + 1);
            let mut file =
                std::fs::File::from(fd.try_clone().map_err(|e| resolve::io_error(&e, &shown))?);
            (&mut file)
                .take(SMALL_FILE_BYTES + 1)
                .read_to_end(&mut data)
                .map_err(|e| resolve::io_error(&e, &shown))?;
            if data.len() as u64 <= SMALL_FILE_BYTES {
                small = Some(data);
            }
        }
        Ok(Opened { fd, stat, small })
    })
    .await??;
    Ok((caller, opened))
}

/// Builds `{"path": ..., "content_base64": ..., ["bytes": n]}` with the base64 written
/// straight into the response buffer (no intermediate string, no JSON escaping pass).
fn download_body(shown: &str, data: &[u8], with_bytes: bool) -> Vec<u8> {
    let encoded_len = base64_simd::STANDARD.encoded_length(data.len());
    let mut out = Vec::with_capacity(encoded_len + shown.len() + 64);
    out.extend_from_slice(b"{\"path\":");
    serde_json::to_writer(&mut out, shown).expect("string serialises");
    out.extend_from_slice(b",\"content_base64\":\"");
    let start = out.len();
    out.resize(start + encoded_len, 0);
    let written = base64_simd::STANDARD
        .encode(data, base64_simd::Out::from_slice(&mut out[start..]))
        .len();
    debug_assert_eq!(written, encoded_len);
    out.push(b'"');
    if with_bytes {
        out.extend_from_slice(b",\"bytes\":");
        out.extend_from_slice(itoa::Buffer::new().format(data.len()).as_bytes());
    }
    out.push(b'}');
    out
}

async fn download_json(request: &Request, with_bytes: bool) -> Result<Response, ApiError> {
    let input = query_path(request)?;
    let limit = request.state().config.max_upload_size;
    let (caller, opened) = open_regular(request, &input, true).await?;
    let shown = caller.display();
    if let Some(data) = opened.small.filter(|d| d.len() as u64 <= limit) {
        return Ok(Response::raw(
            200,
            JSON_CONTENT_TYPE,
            download_body(&shown, &data, with_bytes),
        ));
    }
    let size = opened.stat.st_size as u64;
    if size > limit {
        return Err(ApiError::new(
            413,
            "ValueError",
            format!("File too large: {size} bytes (limit {limit})"),
        )
        .with_code("payload_too_large"));
    }
    let file =
        AsyncFile::new(opened.fd, driver_of(request)).map_err(|e| resolve::io_error(&e, &shown))?;
    // One byte more than the stat size tells us if the file grew meanwhile.
    let (result, data) = file
        .read_full_at(Vec::with_capacity(size as usize + 1), 0)
        .await;
    result.map_err(|e| resolve::io_error(&e, &shown))?;
    if data.len() as u64 > limit {
        return Err(ApiError::new(
            413,
            "ValueError",
            format!("File too large: over {limit} bytes"),
        )
        .with_code("payload_too_large"));
    }
    let body = if data.len() > OFFLOAD_BYTES {
        blocking(move || download_body(&shown, &data, with_bytes)).await?
    } else {
        download_body(&shown, &data, with_bytes)
    };
    Ok(Response::raw(200, JSON_CONTENT_TYPE, body))
}

async fn download(request: Request) -> Result<Response, ApiError> {
    download_json(&request, false).await
}

async fn download_stream(request: Request) -> Result<Response, ApiError> {
    let wants_raw = truthy(request.query("raw"))
        || request.header("accept").is_some_and(|a| {
            a.split(',').any(|t| {
                t.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .eq_ignore_ascii_case("application/octet-stream")
            })
        });
    if !wants_raw {
        return download_json(&request, true).await;
    }
    let input = query_path(&request)?;
    let (caller, opened) = open_regular(&request, &input, false).await?;
    let shown = caller.display();
    let size = opened.stat.st_size as u64;
    let etag = format!(
        "\"{:x}-{:x}-{:x}.{:x}\"",
        opened.stat.st_ino, size, opened.stat.st_mtime, opened.stat.st_mtime_nsec
    );
    if let Some(tags) = request.header("if-none-match") {
        if tags.split(',').any(|t| {
            let t = t.trim();
            t == "*" || t.trim_start_matches("W/") == etag
        }) {
            return Ok(
                Response::raw(304, "application/octet-stream", Vec::new()).header("ETag", etag)
            );
        }
    }
    let (status, offset, len) = match request.header("range") {
        None => (200, 0, size),
        Some(range) => match parse_range(range, size) {
            RangeAnswer::Whole => (200, 0, size),
            RangeAnswer::Part(start, end) => (206, start, end - start + 1),
            RangeAnswer::Unsatisfiable => {
                return Ok(ApiError::new(
                    416,
                    "ValueError",
                    format!("Range '{range}' is outside the file ({size} bytes)"),
                )
                .with_header("Content-Range", format!("bytes */{size}"))
                .into_response());
            }
        },
    };
    let file = AsyncFile::new(opened.fd, driver_of(&request))
        .map_err(|e| resolve::io_error(&e, &shown))?;
    let mut response = Response::file(status, "application/octet-stream", file, offset, len)
        .header("ETag", etag)
        .header("Accept-Ranges", "bytes");
    if status == 206 {
        response = response.header(
            "Content-Range",
            format!("bytes {}-{}/{size}", offset, offset + len - 1),
        );
    }
    Ok(response)
}

enum RangeAnswer {
    Whole,
    Part(u64, u64),
    Unsatisfiable,
}

/// One `bytes=` range (RFC 9110 §14.1.2). Several ranges, or a header we cannot read,
/// are answered with the whole file, which the RFC allows.
fn parse_range(header: &str, size: u64) -> RangeAnswer {
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return RangeAnswer::Whole;
    };
    if spec.contains(',') {
        return RangeAnswer::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeAnswer::Whole;
    };
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        let Ok(suffix) = last.parse::<u64>() else {
            return RangeAnswer::Whole;
        };
        if suffix == 0 || size == 0 {
            return RangeAnswer::Unsatisfiable;
        }
        return RangeAnswer::Part(size.saturating_sub(suffix), size - 1);
    }
    let Ok(start) = first.parse::<u64>() else {
        return RangeAnswer::Whole;
    };
    if start >= size {
        return RangeAnswer::Unsatisfiable;
    }
    let end = if last.is_empty() {
        size - 1
    } else {
        match last.parse::<u64>() {
            Ok(end) if end >= start => end.min(size - 1),
            _ => return RangeAnswer::Whole,
        }
    };
    RangeAnswer::Part(start, end)
}

// ---- list, stat, mkdir, delete, move -----------------------------------------------------

async fn list(request: Request) -> Result<Response, ApiError> {
    let input = query_path(&request)?;
    let recursive = truthy(request.query("recursive"));
    let base = base_of(&request);
    let caller = CallerPath::new(&base, &input)?;
    // The whole answer is produced on the pool: directory reads may wait for the disk,
    // and writing JSON text directly costs a fraction of building a tree of values.
    let body = blocking(move || -> Result<Vec<u8>, ApiError> {
        let shown = caller.display();
        let base_fd = resolve::open_base(&base).map_err(|e| resolve::io_error(&e, &input))?;
        let dir = open_dir_or_404(base_fd.as_fd(), &base, &caller, &input, OFlags::RDONLY)?;
        let mut out = Vec::with_capacity(4096);
        out.extend_from_slice(b"{\"entries\":[");
        let mut first = true;
        list_into(dir.as_fd(), "", 1, recursive, &mut out, &mut first)
            .map_err(|e| resolve::io_error(&e, &shown))?;
        out.extend_from_slice(b"]}");
        Ok(out)
    })
    .await??;
    Ok(Response::raw(200, JSON_CONTENT_TYPE, body))
}

fn list_into(
    dir: std::os::fd::BorrowedFd<'_>,
    prefix: &str,
    depth: usize,
    recursive: bool,
    out: &mut Vec<u8>,
    first: &mut bool,
) -> std::io::Result<()> {
    let mut number = itoa::Buffer::new();
    for name in resolve::read_dir_sorted(dir)? {
        let Ok(stat) = resolve::lstat_child(dir, &name) else {
            continue;
        };
        let is_dir = resolve::kind_of(&stat) == Kind::Directory;
        let display = format!("{prefix}{}", String::from_utf8_lossy(&name));
        if !*first {
            out.push(b',');
        }
        *first = false;
        out.extend_from_slice(b"{\"name\":");
        serde_json::to_writer(&mut *out, &display).expect("a string serialises");
        out.extend_from_slice(if is_dir {
            b",\"type\":\"directory\",\"size\":"
        } else {
            b",\"type\":\"file\",\"size\":"
        });
        out.extend_from_slice(number.format(stat.st_size).as_bytes());
        out.extend_from_slice(b",\"modified\":\"");
        crate::timefmt::push_iso8601_utc(
            out,
            stat.st_mtime,
            (stat.st_mtime_nsec as u32).min(999_999_999),
        );
        out.extend_from_slice(b"\"}");
        if recursive && is_dir && depth < LIST_MAX_DEPTH {
            if let Ok(child) = resolve::open_child_dir(dir, &name) {
                list_into(
                    child.as_fd(),
                    &format!("{display}/"),
                    depth + 1,
                    recursive,
                    out,
                    first,
                )?;
            }
        }
    }
    Ok(())
}

async fn stat(request: Request) -> Result<Response, ApiError> {
    let input = query_path(&request)?;
    let base = base_of(&request);
    let caller = CallerPath::new(&base, &input)?;
    // Fast path: from the dentry cache (fstat of an open descriptor does not wait for
    // the disk either), answered without leaving the worker.
    match resolve::open_beneath_cached(&base, &caller.rel, OFlags::PATH | OFlags::NOFOLLOW) {
        Ok(Some(fd)) => {
            let st = rustix::fs::fstat(&fd).map_err(|e| resolve::io_error(&e.into(), &input))?;
            return Ok(Response::ok(&stat_document(&caller, Some(&st))));
        }
        // A cached negative entry is as definite as a positive one.
        Err(e) if e.is_missing() => return Ok(Response::ok(&stat_document(&caller, None))),
        Err(e) => return Err(e.into_api(&input, &base)),
        Ok(None) => {}
    }
    let document = blocking(move || -> Result<Value, ApiError> {
        let base_fd = resolve::open_base(&base).map_err(|e| resolve::io_error(&e, &input))?;
        let found = match resolve::lstat_beneath(base_fd.as_fd(), &base, &caller.rel) {
            Ok(found) => found,
            // A parent that is missing or not a directory: nothing is there.
            Err(e) if e.is_missing() => None,
            Err(e) => return Err(blocking_open_error(e, &input, &base)),
        };
        Ok(stat_document(&caller, found.as_ref()))
    })
    .await??;
    Ok(Response::ok(&document))
}

/// The contract's `/files/stat` object; `None` when nothing is at the path.
fn stat_document(caller: &CallerPath, found: Option<&rustix::fs::Stat>) -> Value {
    let shown = caller.display();
    let name = caller
        .shown
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match found {
        None => json!({
            "name": name, "path": shown, "type": "unknown", "size": 0, "permissions": "",
            "modified": "", "accessed": "", "created": "", "exists": false
        }),
        Some(st) => json!({
            "name": name,
            "path": shown,
            "type": match resolve::kind_of(st) { Kind::Directory => "directory", Kind::Symlink => "symlink", _ => "file" },
            "size": st.st_size,
            "permissions": format!("{:03o}", st.st_mode & 0o777),
            "modified": iso_of(st.st_mtime, st.st_mtime_nsec as i64),
            "accessed": iso_of(st.st_atime, st.st_atime_nsec as i64),
            "created": iso_of(st.st_ctime, st.st_ctime_nsec as i64),
            "exists": true,
        }),
    }
}

async fn mkdir(request: Request) -> Result<Response, ApiError> {
    let body: Value = request.json()?;
    let input = body_string(body.get("path"), "path")?;
    let base = base_of(&request);
    let caller = CallerPath::new(&base, &input)?;
    let shown = caller.display();
    blocking(move || {
        resolve::create_dirs(base_fd_or(&base, &input)?.as_fd(), &base, &caller.rel)
            .map(drop)
            .map_err(|e| blocking_open_error(e, &input, &base))
    })
    .await??;
    Ok(Response::ok(&json!({"path": shown, "created": true})))
}

fn base_fd_or(base: &Path, input: &str) -> Result<std::os::fd::OwnedFd, ApiError> {
    resolve::open_base(base).map_err(|e| resolve::io_error(&e, input))
}

/// Opens the directory that holds the caller's path; when it is missing the path is,
/// answered as `<what> not found: <path>` (404). Blocking.
fn open_parent_or_404(
    base_fd: std::os::fd::BorrowedFd<'_>,
    base: &Path,
    caller: &CallerPath,
    input: &str,
    what: &str,
) -> Result<std::os::fd::OwnedFd, ApiError> {
    match resolve::open_beneath(
        base_fd,
        base,
        caller.parent_rel(),
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    ) {
        Ok(parent) => Ok(parent),
        Err(e) if e.is_missing() => Err(ApiError::new(
            404,
            "FileNotFoundError",
            format!("{what} not found: {}", caller.display()),
        )),
        Err(e) => Err(blocking_open_error(e, input, base)),
    }
}

/// The base directory itself is never deleted or moved away: every later file request
/// would fail (see docs/api.md).
fn refuse_base(caller: &CallerPath, input: &str, base: &Path) -> Result<(), ApiError> {
    if caller.rel.as_os_str().is_empty() {
        return Err(ApiError::new(
            403,
            "PermissionError",
            format!(
                "Path '{input}' is the base directory ({}), which cannot be deleted or moved",
                base.display()
            ),
        )
        .with_code("path_not_allowed"));
    }
    Ok(())
}

async fn delete(request: Request) -> Result<Response, ApiError> {
    let input = query_path(&request)?;
    let base = base_of(&request);
    let caller = CallerPath::new(&base, &input)?;
    refuse_base(&caller, &input, &base)?;
    let shown = caller.display();
    blocking(move || -> Result<(), ApiError> {
        let shown = caller.display();
        let base_fd = base_fd_or(&base, &input)?;
        let parent = open_parent_or_404(base_fd.as_fd(), &base, &caller, &input, "Path")?;
        let name = caller.file_name().expect("not the base");
        match resolve::remove_child(parent.as_fd(), name) {
            Ok(()) => Ok(()),
            Err(e) if resolve::is_missing(&e) => Err(ApiError::new(
                404,
                "FileNotFoundError",
                format!("Path not found: {shown}"),
            )),
            Err(e) => Err(resolve::io_error(&e, &shown)),
        }
    })
    .await??;
    Ok(Response::ok(&json!({"path": shown, "deleted": true})))
}

async fn move_path(request: Request) -> Result<Response, ApiError> {
    let body: Value = request.json()?;
    let base = base_of(&request);
    let mut callers = Vec::new();
    for field in ["source", "destination"] {
        let prefix = |e: ApiError| ApiError {
            message: format!("{field}: {}", e.message),
            ..e
        };
        let input = body_string(body.get(field), "path").map_err(prefix)?;
        let caller = CallerPath::new(&base, &input).map_err(prefix)?;
        // Into the base directory is fine; moving the base itself away is not.
        if field == "source" {
            refuse_base(&caller, &input, &base).map_err(prefix)?;
        }
        callers.push((input, caller));
    }
    let (dst_input, destination) = callers.pop().expect("two fields");
    let (src_input, source) = callers.pop().expect("two fields");
    let (source_shown, final_shown) = blocking(move || -> Result<(String, String), ApiError> {
        let base_fd = base_fd_or(&base, &src_input)?;
        let source_shown = source.display();
        let src_parent = open_parent_or_404(base_fd.as_fd(), &base, &source, &src_input, "Source")?;
        let src_name = source.file_name().expect("not the base").to_os_string();
        if resolve::lstat_child(src_parent.as_fd(), src_name.as_encoded_bytes()).is_err() {
            return Err(ApiError::new(
                404,
                "FileNotFoundError",
                format!("Source not found: {source_shown}"),
            ));
        }
        // Like shutil.move: onto an existing directory means into it.
        let mut destination = destination;
        if let Ok(Some(st)) = resolve::open_beneath(
            base_fd.as_fd(),
            &base,
            &destination.rel,
            OFlags::PATH | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .map(|fd| rustix::fs::fstat(&fd).ok())
        {
            if resolve::kind_of(&st) == Kind::Directory {
                destination = CallerPath {
                    shown: destination.shown.join(&src_name),
                    rel: destination.rel.join(&src_name),
                };
            }
        }
        let dst_parent = resolve::create_dirs(base_fd.as_fd(), &base, destination.parent_rel())
            .map_err(|e| blocking_open_error(e, &dst_input, &base))?;
        let dst_name = destination
            .file_name()
            .ok_or_else(|| {
                ApiError::bad_request("destination: must name a path beneath the base directory")
            })?
            .to_os_string();
        rustix::fs::renameat(
            &src_parent,
            src_name.as_os_str(),
            &dst_parent,
            dst_name.as_os_str(),
        )
        .map_err(|e| resolve::io_error(&e.into(), &destination.display()))?;
        Ok((source_shown, destination.display()))
    })
    .await??;
    Ok(Response::ok(
        &json!({"source": source_shown, "destination": final_shown}),
    ))
}

// ---- search ------------------------------------------------------------------------------

async fn search(request: Request) -> Result<Response, ApiError> {
    let body: Value = request.json()?;
    let base = base_of(&request);
    let input = match body.get("path") {
        None | Some(Value::Null) => base.to_string_lossy().into_owned(),
        other => body_string(other, "path")?,
    };
    let pattern = match body.get("pattern") {
        None | Some(Value::Null) => "*".to_string(),
        Some(Value::String(p)) => p.clone(),
        Some(_) => return Err(ApiError::bad_request("pattern must be a string")),
    };
    let max_depth = int_field(&body, "max_depth", SEARCH_DEFAULT_DEPTH)?;
    let max_results = int_field(&body, "max_results", SEARCH_DEFAULT_RESULTS)?;
    let caller = CallerPath::new(&base, &input)?;
    let found = blocking(move || -> Result<Value, ApiError> {
        let base_fd = base_fd_or(&base, &input)?;
        let root = open_dir_or_404(base_fd.as_fd(), &base, &caller, &input, OFlags::RDONLY)?;
        let mut walk = Search {
            pattern: pattern.as_bytes(),
            max_depth: max_depth.min(resolve::MAX_TREE_DEPTH as i64),
            max_results: max_results.max(0) as usize,
            deadline: Instant::now() + SEARCH_TIME_LIMIT,
            results: Vec::new(),
            timed_out: false,
        };
        if walk.max_results > 0 {
            walk.dir(root.as_fd(), &caller.shown, 0);
        }
        Ok(json!({"results": walk.results, "timed_out": walk.timed_out}))
    })
    .await??;
    Ok(Response::ok(&found))
}

struct Search<'p> {
    pattern: &'p [u8],
    max_depth: i64,
    max_results: usize,
    deadline: Instant,
    results: Vec<Value>,
    timed_out: bool,
}

impl Search<'_> {
    /// Walks like `os.walk`: a directory's matching files (sorted) first, then its
    /// subdirectories in order; symlinks to directories are not entered.
    /// Returns false when the walk must stop.
    fn dir(&mut self, dir: std::os::fd::BorrowedFd<'_>, shown: &Path, depth: i64) -> bool {
        if Instant::now() > self.deadline {
            self.timed_out = true;
            return false;
        }
        let Ok(names) = resolve::read_dir_typed(dir) else {
            return true;
        };
        let mut subdirs = Vec::new();
        for (name, kind) in names {
            // os.walk classifies with is_dir(), which follows symlinks; getdents already
            // knows the type of everything else, so only links and unknowns cost a stat.
            let is_dir = match kind {
                Some(Kind::Directory) => true,
                Some(Kind::File) | Some(Kind::Other) => false,
                Some(Kind::Symlink) | None => rustix::fs::statat(
                    dir,
                    std::ffi::OsStr::from_bytes(&name),
                    rustix::fs::AtFlags::empty(),
                )
                .map(|st| resolve::kind_of(&st) == Kind::Directory)
                .unwrap_or(false),
            };
            if is_dir {
                subdirs.push(name);
            } else if fnmatch(self.pattern, &name) {
                let name_text = String::from_utf8_lossy(&name).into_owned();
                self.results.push(
                    json!({"name": name_text, "path": shown.join(&name_text).to_string_lossy()}),
                );
                if self.results.len() >= self.max_results {
                    return false;
                }
            }
        }
        if depth >= self.max_depth {
            return true;
        }
        for name in subdirs {
            let Ok(child) = resolve::open_child_dir(dir, &name) else {
                continue;
            };
            if !self.dir(
                child.as_fd(),
                &shown.join(String::from_utf8_lossy(&name).as_ref()),
                depth + 1,
            ) {
                return false;
            }
        }
        true
    }
}

// ---- archive -----------------------------------------------------------------------------

#[derive(Deserialize)]
struct ArchiveBody {
    #[serde(default)]
    paths: Option<Value>,
    #[serde(default)]
    format: Option<Value>,
}

async fn archive_paths(request: Request) -> Result<Response, ApiError> {
    let body: ArchiveBody = request.json()?;
    let paths: Vec<String> = match body.paths {
        Some(Value::Array(items)) if !items.is_empty() => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) if !s.is_empty() => Ok(s),
                _ => Err(ApiError::bad_request(
                    "paths must be a non-empty list of path strings",
                )),
            })
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(ApiError::bad_request(
                "paths must be a non-empty list of path strings",
            ))
        }
    };
    let format = match body.format {
        None | Some(Value::Null) => Format::TarGz,
        Some(Value::String(name)) => Format::parse(&name).ok_or_else(|| {
            ApiError::bad_request(format!("Unsupported format: '{name}' (use tar.gz or zip)"))
        })?,
        Some(_) => {
            return Err(ApiError::bad_request(
                "format must be \"tar.gz\" or \"zip\"",
            ))
        }
    };
    let base = base_of(&request);
    let limits = archive::Limits {
        max_files: ARCHIVE_MAX_FILES,
        max_bytes: ARCHIVE_MAX_BYTES,
    };
    let body = blocking(move || -> Result<Vec<u8>, ApiError> {
        let data = archive::build(&base, &paths, format, limits)?;
        let encoded_len = base64_simd::STANDARD.encoded_length(data.len());
        let mut out = Vec::with_capacity(encoded_len + 64);
        out.extend_from_slice(b"{\"content_base64\":\"");
        let start = out.len();
        out.resize(start + encoded_len, 0);
        let _ =
            base64_simd::STANDARD.encode(&data, base64_simd::Out::from_slice(&mut out[start..]));
        out.extend_from_slice(
            format!(
                "\",\"format\":\"{}\",\"bytes\":{}}}",
                format.name(),
                data.len()
            )
            .as_bytes(),
        );
        Ok(out)
    })
    .await??;
    Ok(Response::raw(200, JSON_CONTENT_TYPE, body))
}

// ---- watch -------------------------------------------------------------------------------

fn seconds_param(
    request: &Request,
    name: &str,
    default: f64,
    min: f64,
    max: f64,
) -> Result<Duration, ApiError> {
    let value = match request.query(name) {
        None => default,
        Some(text) => text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| {
                ApiError::bad_request(format!("{name} must be a positive number of seconds"))
            })?,
    };
    Ok(Duration::from_secs_f64(value.clamp(min, max)))
}

async fn watch_dir(request: Request) -> Result<Response, ApiError> {
    let input = query_path(&request)?;
    let recursive = truthy(request.query("recursive"));
    let interval = seconds_param(&request, "interval", 0.5, 0.1, 5.0)?;
    let timeout = seconds_param(&request, "timeout", 300.0, 0.1, 86_400.0)?;
    let base = base_of(&request);
    let caller = CallerPath::new(&base, &input)?;
    let check_base = base.clone();
    let check_caller = caller.clone();
    blocking(move || -> Result<(), ApiError> {
        let base_fd = base_fd_or(&check_base, &input)?;
        open_dir_or_404(
            base_fd.as_fd(),
            &check_base,
            &check_caller,
            &input,
            OFlags::PATH,
        )
        .map(drop)
    })
    .await??;
    let (tx, rx) = sse::channel(64);
    monoio::spawn(watch::run(
        watch::WatchSpec {
            base,
            caller,
            recursive,
            interval,
            timeout,
        },
        tx,
    ));
    Ok(Response::sse(rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert!(matches!(
            parse_range("bytes=0-99", 1000),
            RangeAnswer::Part(0, 99)
        ));
        assert!(matches!(
            parse_range("bytes=900-", 1000),
            RangeAnswer::Part(900, 999)
        ));
        assert!(matches!(
            parse_range("bytes=-100", 1000),
            RangeAnswer::Part(900, 999)
        ));
        assert!(matches!(
            parse_range("bytes=990-5000", 1000),
            RangeAnswer::Part(990, 999)
        ));
        assert!(matches!(
            parse_range("bytes=1000-", 1000),
            RangeAnswer::Unsatisfiable
        ));
        assert!(matches!(
            parse_range("bytes=0-1,5-6", 1000),
            RangeAnswer::Whole
        ));
        assert!(matches!(parse_range("items=0-1", 1000), RangeAnswer::Whole));
        assert!(matches!(parse_range("bytes=5-1", 1000), RangeAnswer::Whole));
    }

    #[test]
    fn base64_tolerates_wrapping_and_enforces_the_limit() {
        assert_eq!(decode_base64("aGVs\nbG8=", 100).unwrap(), b"hello");
        assert_eq!(decode_base64("aGVsbG8=", 100).unwrap(), b"hello");
        assert_eq!(
            decode_base64("aGVsbG8=", 4).unwrap_err().code,
            Some("payload_too_large")
        );
        assert_eq!(decode_base64("not base64!", 100).unwrap_err().status, 400);
    }

    #[test]
    fn download_body_is_valid_json() {
        let body = download_body("/home/user/a \"b\".bin", &[0, 1, 2, 255], true);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["content_base64"], "AAEC/w==");
        assert_eq!(v["bytes"], 4);
        assert_eq!(v["path"], "/home/user/a \"b\".bin");
    }
}
