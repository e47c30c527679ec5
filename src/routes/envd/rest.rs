//! envd's REST routes (`envd.yaml`): health, environment, metrics, init, and file
//! bytes in and out. Errors are envd's `{"code": <status>, "message"}`.

use std::io::Write;
use std::pin::Pin;

use serde_json::{json, Value};

use crate::api::ApiError;
use crate::app::endpoint::HandlerFuture;
use crate::app::{Call, RawSink};
use crate::envd::users::Account;
use crate::fs::write::{SmallFirst, Upload};
use crate::http::multipart::{self, Event, Scanner};
use crate::http::{LocalFuture, Response};
use crate::routes::shared::{
    check_extension, confine_followed, fs_error, holdable_body_length, raw_bytes,
};

use super::user;

/// `GET /health`: 204, as envd answers it.
pub async fn health(_call: Call) -> Result<Response, ApiError> {
    Ok(Response::raw(204, "text/plain", Vec::new()))
}

/// `GET /envs`: the environment a started process gets (secrets left out, as they are
/// left out of every child's environment).
pub async fn envs(call: Call) -> Result<Response, ApiError> {
    let env: serde_json::Map<String, Value> = call
        .services()
        .environment
        .with(&[])
        .into_iter()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                Value::String(v.to_string_lossy().into_owned()),
            )
        })
        .collect();
    Ok(Response::ok(&Value::Object(env)))
}

/// `GET /metrics`: the machine's load, in envd's field names.
pub async fn metrics(_call: Call) -> Result<Response, ApiError> {
    let facts = crate::runtime::blocking(|| -> std::io::Result<Value> {
        let meminfo = std::fs::read_to_string("/proc/meminfo")?;
        let field = |name: &str| -> u64 {
            meminfo
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let total = field("MemTotal:") * 1024;
        let available = field("MemAvailable:") * 1024;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let load = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        let disk = rustix::fs::statvfs("/").ok();
        Ok(json!({
            "ts": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            "cpu_count": cpus,
            "cpu_used_pct": ((load / cpus as f64) * 100.0).min(100.0),
            "mem_total": total,
            "mem_used": total.saturating_sub(available),
            "mem_total_mib": total / (1024 * 1024),
            "mem_used_mib": total.saturating_sub(available) / (1024 * 1024),
            "disk_total": disk.as_ref().map_or(0, |d| d.f_blocks * d.f_frsize),
            "disk_used": disk.as_ref().map_or(0, |d| (d.f_blocks - d.f_bfree) * d.f_frsize),
        }))
    })
    .await
    .map_err(|e| ApiError::internal("OSError", e.to_string()))?
    .map_err(|e| ApiError::internal("OSError", e.to_string()))?;
    Ok(Response::ok(&facts))
}

/// `POST /init`: accepted and answered 204. Nothing in it changes this server: not the
/// access token (identities come from the policy), not the environment of later
/// processes (that is `POST /env` on the API port), so a caller can never raise its
/// access through it.
pub async fn init(_call: Call) -> Result<Response, ApiError> {
    Ok(Response::raw(204, "text/plain", Vec::new()))
}

/// `GET /files?path=`: the file's bytes.
pub async fn download(call: Call) -> Result<Response, ApiError> {
    let input = call
        .query("path")
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::bad_request("path is required: GET /files?path=<file>"))?
        .to_string();
    let account = user::account(&call).await?;
    let caller = confine_followed(&call, &user::rooted(&call, &account, &input)).await?;
    let name = caller
        .file_name()
        .map(|n| n.to_string_lossy().replace('"', ""))
        .unwrap_or_default();
    // The file routes' raw download: ETag, one Range, the policy's size limit.
    let bytes = raw_bytes(&call, &caller, "ValueError").await?;
    Ok(bytes.header(
        "Content-Disposition",
        format!("attachment; filename=\"{name}\""),
    ))
}

/// `POST /files/compose {source_paths, destination, username?}`: the sources, in order,
/// become the destination (written atomically), then the sources are removed, as envd's
/// composite upload does. Answers the destination's `{name, type, path}`.
pub async fn compose(call: Call) -> Result<Response, ApiError> {
    #[derive(serde::Deserialize)]
    struct Compose {
        source_paths: Vec<String>,
        destination: String,
        username: Option<String>,
    }
    let request: Compose = call.json()?;
    if request.source_paths.is_empty() {
        return Err(ApiError::bad_request(
            "source_paths must name at least one file",
        ));
    }
    if request.destination.is_empty() {
        return Err(ApiError::bad_request("destination must name a file"));
    }
    let account = user::account_named(&call, request.username.clone()).await?;
    let base = call.services().base.clone();
    let driver = call.services().driver;
    let mut sources = Vec::with_capacity(request.source_paths.len());
    for input in &request.source_paths {
        sources.push(confine_followed(&call, &user::rooted(&call, &account, input)).await?);
    }
    let destination =
        confine_followed(&call, &user::rooted(&call, &account, &request.destination)).await?;
    check_extension(&call, &destination)?;
    let mut upload = Upload::open(&base, destination.clone(), driver)
        .await
        .map_err(fs_error)?;
    for source in &sources {
        if let Err(error) = append_file(&call, &base, source, &mut upload).await {
            upload.abort().await;
            return Err(error);
        }
    }
    let (_, shown) = upload.commit().await.map_err(fs_error)?;
    // The sources go once the destination holds them (not the destination itself, when
    // it was one of them).
    for source in sources.into_iter().filter(|s| s.rel != destination.rel) {
        match crate::fs::tree::delete(&base, source).await {
            Ok(()) | Err(crate::fs::FsError::NotFound(_)) => {}
            Err(e) => return Err(fs_error(e)),
        }
    }
    if user::hands_over(&account) {
        crate::envd::files::give_to(&base, destination.clone(), account.uid, account.gid)
            .await
            .map_err(fs_error)?;
    }
    let name = destination
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Response::ok(
        &json!({"name": name, "type": "file", "path": shown}),
    ))
}

/// Appends the file at `source` to `upload`, streamed from disk.
async fn append_file(
    call: &Call,
    base: &crate::fs::BaseDir,
    source: &crate::fs::CallerPath,
    upload: &mut Upload,
) -> Result<(), ApiError> {
    use crate::http::response::BodyStream;
    let shown = source.display();
    let opened = match crate::fs::read::open_file(base, source, false).await {
        Ok(opened) => opened,
        Err(crate::fs::FsError::NotFound(_)) => {
            return Err(ApiError::new(
                404,
                "FileNotFoundError",
                format!("path '{shown}' does not exist"),
            ))
        }
        Err(e) => return Err(fs_error(e)),
    };
    let size = opened.stat.st_size as u64;
    let file = crate::runtime::AsyncFile::new(opened.fd, call.services().driver)
        .map_err(|e| fs_error(crate::fs::FsError::io(e, shown.clone())))?;
    let mut stream = crate::runtime::FileStream::new(file, 0, size);
    let mut buffer = Vec::new();
    while let Some(piece) = stream
        .next(buffer)
        .await
        .map_err(|e| fs_error(crate::fs::FsError::io(e, shown.clone())))?
    {
        buffer = upload.write(piece).await.map_err(fs_error)?;
        buffer.clear();
    }
    Ok(())
}

/// `POST /files`: a multipart body (one part per file, each part's filename its path,
/// or `?path=` for a single file) or an `application/octet-stream` body (the file at
/// `?path=`, optionally `Content-Encoding: gzip`). Each file is written atomically and
/// only once the whole body arrived.
pub async fn open_upload(call: Call) -> Result<Box<dyn RawSink>, ApiError> {
    let content_type = call.header("content-type").unwrap_or("").to_string();
    let limit = {
        let configured = call.services().max_upload_size;
        call.decision()
            .knob_u64("max_upload_bytes")
            .map_or(configured, |cap| cap.min(configured))
    };
    let gzip = match call.header("content-encoding").map(str::trim) {
        None | Some("") | Some("identity") => false,
        Some(e) if e.eq_ignore_ascii_case("gzip") => true,
        Some(other) => {
            return Err(ApiError::new(
                415,
                "ValueError",
                format!("Content-Encoding '{other}' is not supported: send gzip or identity"),
            ))
        }
    };
    let account = user::account(&call).await?;
    let query_path = call
        .query("path")
        .filter(|p| !p.is_empty())
        .map(str::to_string);
    let mode = if let Some(boundary) = multipart::boundary(&content_type) {
        if gzip {
            return Err(ApiError::bad_request(
                "gzip is accepted with application/octet-stream bodies only",
            ));
        }
        Mode::Multipart(Scanner::new(&boundary))
    } else {
        let target = query_path.clone().ok_or_else(|| {
            ApiError::bad_request(
                "path is required: POST /files?path=<file> with the bytes as the body",
            )
        })?;
        let caller = confine_followed(&call, &user::rooted(&call, &account, &target)).await?;
        check_extension(&call, &caller)?;
        let services = call.services();
        let expected = holdable_body_length(&call);
        let upload = SmallFirst::open(&services.base, caller, services.driver, expected)
            .await
            .map_err(fs_error)?;
        Mode::Raw {
            gunzip: gzip.then(|| Box::new(flate2::write::GzDecoder::new(Vec::new()))),
            upload: Some(upload),
        }
    };
    Ok(Box::new(FilesUpload {
        call,
        account,
        mode,
        query_path,
        current: None,
        done: Vec::new(),
        written: 0,
        limit,
    }))
}

enum Mode {
    Multipart(Scanner),
    Raw {
        gunzip: Option<Box<flate2::write::GzDecoder<Vec<u8>>>>,
        upload: Option<SmallFirst>,
    },
}

struct FilesUpload {
    call: Call,
    /// Who the files are written for: they are handed to this account.
    account: Account,
    mode: Mode,
    query_path: Option<String>,
    /// The multipart part being written.
    current: Option<SmallFirst>,
    /// Files whose bytes all arrived, committed when the body ends.
    done: Vec<SmallFirst>,
    written: u64,
    limit: u64,
}

impl FilesUpload {
    fn count(&mut self, bytes: usize) -> Result<(), ApiError> {
        self.written += bytes as u64;
        if self.written > self.limit {
            return Err(ApiError::new(
                413,
                "ValueError",
                format!(
                    "Upload too large: the limit is {} bytes (ABX_MAX_UPLOAD_SIZE, or the policy's max_upload_bytes when lower)",
                    self.limit
                ),
            ));
        }
        Ok(())
    }

    async fn part(&mut self, event: Event) -> Result<(), ApiError> {
        match event {
            Event::Part { filename, .. } => {
                let target = match (&self.query_path, filename.filter(|f| !f.is_empty())) {
                    (Some(path), _) if self.done.is_empty() => path.clone(),
                    (_, Some(filename)) => filename,
                    (_, None) => return Ok(()),
                };
                let rooted = user::rooted(&self.call, &self.account, &target);
                let caller = confine_followed(&self.call, &rooted).await?;
                check_extension(&self.call, &caller)?;
                let services = self.call.services();
                // No part is larger than the body.
                let expected = holdable_body_length(&self.call);
                let upload = SmallFirst::open(&services.base, caller, services.driver, expected)
                    .await
                    .map_err(fs_error)?;
                self.current = Some(upload);
            }
            Event::Data(data) => {
                self.count(data.len())?;
                if let Some(upload) = self.current.as_mut() {
                    upload.write(data).await.map_err(fs_error)?;
                }
            }
            Event::PartEnd => {
                if let Some(upload) = self.current.take() {
                    self.done.push(upload);
                }
            }
        }
        Ok(())
    }
}

impl RawSink for FilesUpload {
    fn write(&mut self, mut piece: Vec<u8>) -> LocalFuture<'_, Result<Vec<u8>, ApiError>> {
        Box::pin(async move {
            match &mut self.mode {
                Mode::Multipart(scanner) => {
                    let events = scanner.feed(&piece).map_err(|e| {
                        ApiError::bad_request(format!("Invalid multipart body: {}", e.0))
                    })?;
                    for event in events {
                        self.part(event).await?;
                    }
                }
                Mode::Raw { gunzip, upload } => {
                    let bytes = match gunzip {
                        Some(decoder) => {
                            decoder.write_all(&piece).map_err(|e| {
                                ApiError::bad_request(format!("the gzip body is invalid: {e}"))
                            })?;
                            std::mem::take(decoder.get_mut())
                        }
                        None => std::mem::take(&mut piece),
                    };
                    let len = bytes.len();
                    if let Some(upload) = upload.as_mut() {
                        upload.write(bytes).await.map_err(fs_error)?;
                    }
                    self.count(len)?;
                }
            }
            piece.clear();
            Ok(piece)
        })
    }

    fn finish(self: Box<Self>) -> HandlerFuture<Response> {
        Box::pin(async move {
            let mut this = *self;
            let mut uploads = std::mem::take(&mut this.done);
            match this.mode {
                Mode::Multipart(scanner) => {
                    if !scanner.is_done() {
                        for upload in uploads {
                            upload.abort().await;
                        }
                        return Err(ApiError::bad_request(
                            "the multipart body ends before its closing boundary",
                        ));
                    }
                    if uploads.is_empty() {
                        return Err(ApiError::bad_request(
                            "the multipart body holds no file part (a part with a filename)",
                        ));
                    }
                }
                Mode::Raw { gunzip, upload } => {
                    let Some(mut upload) = upload else {
                        return Err(ApiError::bad_request("no file to write"));
                    };
                    if let Some(decoder) = gunzip {
                        let rest = decoder.finish().map_err(|e| {
                            ApiError::bad_request(format!("the gzip body is incomplete: {e}"))
                        });
                        match rest {
                            Ok(rest) => {
                                if let Err(e) = upload.write(rest).await {
                                    upload.abort().await;
                                    return Err(fs_error(e));
                                }
                            }
                            Err(e) => {
                                upload.abort().await;
                                return Err(e);
                            }
                        }
                    }
                    uploads.push(upload);
                }
            }
            // Every file is beside its target before the first is committed, so a
            // target that cannot be written refuses the body before any file changes
            // (a lone file is written from memory when it is small).
            if uploads.len() > 1 {
                let mut failed = None;
                for upload in &mut uploads {
                    if let Err(e) = upload.spill().await {
                        failed = Some(e);
                        break;
                    }
                }
                if let Some(e) = failed {
                    for upload in uploads {
                        upload.abort().await;
                    }
                    return Err(fs_error(e));
                }
            }
            let mut written = Vec::new();
            let mut uploads = uploads.into_iter();
            while let Some(upload) = uploads.next() {
                let shown = match upload.commit().await {
                    Ok((_, shown)) => shown,
                    Err(e) => {
                        for rest in uploads {
                            rest.abort().await;
                        }
                        return Err(fs_error(e));
                    }
                };
                if user::hands_over(&this.account) {
                    let base = &this.call.services().base;
                    let caller = base.confine(&shown).map_err(fs_error)?;
                    crate::envd::files::give_to(base, caller, this.account.uid, this.account.gid)
                        .await
                        .map_err(fs_error)?;
                }
                let name = std::path::Path::new(&shown)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                written.push(json!({"name": name, "type": "file", "path": shown}));
            }
            Ok(Response::ok(&Value::Array(written)))
        })
    }

    fn abort(self: Box<Self>) -> Pin<Box<dyn std::future::Future<Output = ()>>> {
        Box::pin(async move {
            let this = *self;
            if let Some(upload) = this.current {
                upload.abort().await;
            }
            for upload in this.done {
                upload.abort().await;
            }
            if let Mode::Raw {
                upload: Some(upload),
                ..
            } = this.mode
            {
                upload.abort().await;
            }
        })
    }
}
