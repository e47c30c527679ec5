//! Upload and download: JSON with base64 content, or raw bytes streamed in constant
//! memory (`application/octet-stream` uploads; `raw=true` downloads with Range and ETag).

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use serde::Deserialize;
use serde_json::json;

use super::take_string;
use crate::api::{ApiError, Param, ParamIn};
use crate::app::endpoint::HandlerFuture;
use crate::app::request::validate_json_object;
use crate::app::state::parse_json;
use crate::app::{Call, RawSink};
use crate::fs::read::{open_file, Opened};
use crate::fs::upload_body::{UploadBodyError, UploadScanner};
use crate::fs::write::{write_atomic, SmallFirst, Upload};
use crate::fs::FsError;
use crate::http::{LocalFuture, Response, JSON_CONTENT_TYPE};
use crate::routes::shared::{
    check_extension, confine_followed, fs_error, holdable_body_length, over_policy_limit,
    raw_bytes, refused_overwrite,
};
use crate::runtime::{blocking, push_base64, AsyncFile, Base64FileStream};

/// Bodies and payloads above this are parsed, decoded and encoded on the blocking pool,
/// so one large transfer does not stall the other connections of its worker.
const OFFLOAD_BYTES: usize = 256 * 1024;

fn pool_failed(error: std::io::Error) -> ApiError {
    ApiError::internal("RuntimeError", error.to_string())
}

#[derive(Deserialize)]
struct UploadBody<'a> {
    #[serde(borrow, default)]
    path: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content_base64: Option<Cow<'a, str>>,
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

/// Decoded upload bytes allowed: `ABX_MAX_UPLOAD_SIZE`, or the policy's
/// `max_upload_bytes` for this endpoint when lower.
fn upload_limit(call: &Call) -> u64 {
    let configured = call.services().max_upload_size;
    call.decision()
        .knob_u64("max_upload_bytes")
        .map_or(configured, |cap| cap.min(configured))
}

/// The policy's `overwrite: false` met a file at the target: 409 `FileExistsError`.
fn exists_error(call: &Call, error: crate::fs::FsError) -> ApiError {
    refused_overwrite(error, call.decision().knob_bool("overwrite") != Some(false))
}

fn upload_too_large(limit: u64) -> ApiError {
    ApiError::new(
        413,
        "ValueError",
        format!("Upload too large: the limit is {limit} bytes (ABX_MAX_UPLOAD_SIZE, or the policy's max_upload_bytes when lower)"),
    )
    .with_code("payload_too_large")
}

/// Decoded bytes gathered before they are written: an upload that ends below this is
/// written by one pool task (`write_atomic`), a larger one streams.
const SPILL_BYTES: usize = 64 * 1024;

/// Body bytes per piece of a JSON upload, fed to the scanner [`FEED_BYTES`] at a time:
/// with the decoded bytes (at most [`SPILL_BYTES`] plus one feed's 48 KiB) an upload
/// holds about 240 KiB, so 64 at once fit in 16 MiB (measured in
/// `docs/architecture.md`). Larger pieces measured no faster.
const JSON_PIECE_BYTES: usize = 128 * 1024;
const FEED_BYTES: usize = 64 * 1024;

/// `POST /upload` and the JSON form of `/files/upload-stream`: the body is decoded as
/// it arrives ([`UploadScanner`]) into a temporary file in the base directory, which is
/// linked under `path` once the body is complete and valid, wherever `path` was in it.
pub async fn open_json_upload(call: Call) -> Result<Box<dyn RawSink>, ApiError> {
    let limit = upload_limit(&call);
    Ok(Box::new(JsonUpload {
        call,
        scanner: UploadScanner::new(limit),
        decoded: Vec::new(),
        upload: None,
        failed: None,
    }))
}

struct JsonUpload {
    call: Call,
    scanner: UploadScanner,
    /// Decoded bytes not yet written.
    decoded: Vec<u8>,
    /// The temporary file, once more than [`SPILL_BYTES`] arrived.
    upload: Option<Upload>,
    /// Why the temporary file could not take the data (a full disk). The answer waits
    /// for the end of the body, because only the body's `path` names what the caller
    /// was writing; the rest of the content is decoded and dropped meanwhile.
    failed: Option<FsError>,
}

fn scan_error(error: UploadBodyError, limit: u64) -> ApiError {
    match error {
        UploadBodyError::Json(message) => {
            ApiError::bad_request(format!("Invalid JSON body: {message}"))
        }
        UploadBodyError::Base64 => {
            ApiError::bad_request("content_base64 is not valid standard base64")
        }
        UploadBodyError::TooLarge => upload_too_large(limit),
    }
}

impl JsonUpload {
    /// Writes the decoded bytes to the temporary file; once that failed, drops them.
    async fn spill(&mut self) {
        if self.failed.is_some() {
            self.decoded.clear();
            return;
        }
        if let Err(error) = self.try_spill().await {
            self.decoded.clear();
            if let Some(upload) = self.upload.take() {
                upload.abort().await;
            }
            self.failed = Some(error);
        }
    }

    async fn try_spill(&mut self) -> Result<(), FsError> {
        if self.upload.is_none() {
            let services = self.call.services();
            self.upload = Some(Upload::open_detached(&services.base, services.driver).await?);
        }
        if let Some(upload) = self.upload.as_mut() {
            let pending = std::mem::take(&mut self.decoded);
            let mut back = upload.write(pending).await?;
            back.clear();
            self.decoded = back;
        }
        Ok(())
    }

    /// The body is complete: checks it as a whole and commits the data under its path.
    async fn complete(&mut self) -> Result<Response, ApiError> {
        let limit = upload_limit(&self.call);
        let scanner = std::mem::replace(&mut self.scanner, UploadScanner::new(0));
        let (skeleton, streamed) = scanner.finish().map_err(|e| scan_error(e, limit))?;
        validate_json_object(&skeleton, false)?;
        let (input, inline) = if skeleton.len() > OFFLOAD_BYTES {
            blocking(move || parse_skeleton(&skeleton, streamed, limit))
                .await
                .map_err(pool_failed)??
        } else {
            parse_skeleton(&skeleton, streamed, limit)?
        };
        // `/files/upload-stream` refuses empty content, as the reference does (`/upload`,
        // which the reference does not serve, writes an empty file).
        let empty = inline.as_ref().map_or_else(
            || self.upload.is_none() && self.decoded.is_empty(),
            Vec::is_empty,
        );
        if empty && self.call.spec().id == "files_upload_stream" {
            return Err(ApiError::bad_request("Missing or invalid 'content_base64'"));
        }
        let caller = confine_followed(&self.call, &input).await?;
        check_extension(&self.call, &caller)?;
        if let Some(failed) = self.failed.take() {
            // The temporary file lives in the base directory, but what the caller was
            // writing is `path`: that is the path the answer names.
            return Err(fs_error(match failed {
                FsError::Io { error, .. } => FsError::io(error, caller.display()),
                other => other,
            }));
        }
        let services = self.call.services();
        let replace = self.call.decision().knob_bool("overwrite") != Some(false);
        let data = inline.unwrap_or_else(|| std::mem::take(&mut self.decoded));
        let Some(mut upload) = self.upload.take() else {
            let (bytes, shown) =
                write_atomic(&services.base, caller, data, services.driver, replace)
                    .await
                    .map_err(|e| exists_error(&self.call, e))?;
            return Ok(Response::ok(&json!({"path": shown, "bytes": bytes})));
        };
        let written = async {
            if !data.is_empty() {
                upload.write(data).await?;
            }
            upload.attach(&services.base, caller, replace).await
        };
        if let Err(e) = written.await {
            upload.abort().await;
            return Err(exists_error(&self.call, e));
        }
        let (bytes, shown) = upload
            .commit()
            .await
            .map_err(|e| exists_error(&self.call, e))?;
        Ok(Response::ok(&json!({"path": shown, "bytes": bytes})))
    }
}

/// The body without the streamed value: `path`, and the content when it was not
/// streamed (decoded here, as the whole-body path did).
fn parse_skeleton(
    skeleton: &[u8],
    streamed: bool,
    limit: u64,
) -> Result<(String, Option<Vec<u8>>), ApiError> {
    let parsed: UploadBody = parse_json(skeleton)?;
    let path = parsed
        .path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::bad_request("path is required"))?;
    let content = parsed
        .content_base64
        .ok_or_else(|| ApiError::bad_request("content_base64 is required"))?;
    let inline = if streamed {
        None
    } else {
        Some(decode_base64(&content, limit)?)
    };
    Ok((path.into_owned(), inline))
}

impl RawSink for JsonUpload {
    fn write(&mut self, piece: Vec<u8>) -> LocalFuture<'_, Result<Vec<u8>, ApiError>> {
        Box::pin(async move {
            let limit = upload_limit(&self.call);
            if self.decoded.capacity() == 0 {
                // Sized to what this piece can decode to, at most what is gathered
                // before a spill: a 112 KiB buffer for a 1 KiB upload cost a
                // `malloc_consolidate` per request.
                let most = SPILL_BYTES + FEED_BYTES / 4 * 3 + 64;
                self.decoded = Vec::with_capacity((piece.len() / 4 * 3 + 64).min(most));
            }
            for slice in piece.chunks(FEED_BYTES) {
                self.scanner
                    .feed(slice, &mut self.decoded)
                    .map_err(|e| scan_error(e, limit))?;
                if self.decoded.len() >= SPILL_BYTES {
                    self.spill().await;
                }
            }
            Ok(piece)
        })
    }

    fn finish(mut self: Box<Self>) -> HandlerFuture<Response> {
        Box::pin(async move {
            let answer = self.complete().await;
            if answer.is_err() {
                if let Some(upload) = self.upload.take() {
                    upload.abort().await;
                }
            }
            answer
        })
    }

    fn abort(mut self: Box<Self>) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(async move {
            if let Some(upload) = self.upload.take() {
                upload.abort().await;
            }
        })
    }

    fn piece_size(&self) -> usize {
        JSON_PIECE_BYTES
    }
}

/// The raw form of `/files/upload-stream`: opens the temporary file the body streams
/// into, before the body is read.
pub async fn open_raw_upload(call: Call) -> Result<Box<dyn RawSink>, ApiError> {
    // This form takes its fields from the query, where they are required; the body
    // fields are the JSON form's.
    let query: Vec<Param> = (call.spec().params.iter())
        .filter(|p| p.location == ParamIn::Query)
        .map(|p| Param {
            required: true,
            ..p.clone()
        })
        .collect();
    let input = take_string(&mut call.args_of(&query)?, "path");
    let caller = confine_followed(&call, &input).await?;
    check_extension(&call, &caller)?;
    let services = call.services();
    let expected = holdable_body_length(&call);
    let mut upload = SmallFirst::open(&services.base, caller, services.driver, expected)
        .await
        .map_err(fs_error)?;
    let overwrite = call.decision().knob_bool("overwrite") != Some(false);
    if !overwrite {
        upload.keep_existing();
    }
    Ok(Box::new(RawUpload(upload, overwrite)))
}

/// The upload, and whether the policy lets it replace a file.
struct RawUpload(SmallFirst, bool);

impl RawSink for RawUpload {
    fn write(&mut self, piece: Vec<u8>) -> LocalFuture<'_, Result<Vec<u8>, ApiError>> {
        Box::pin(async move { self.0.write(piece).await.map_err(fs_error) })
    }

    fn finish(self: Box<Self>) -> HandlerFuture<Response> {
        Box::pin(async move {
            let overwrite = self.1;
            let (bytes, shown) = self
                .0
                .commit()
                .await
                .map_err(|e| refused_overwrite(e, overwrite))?;
            Ok(Response::ok(&json!({"path": shown, "bytes": bytes})))
        })
    }

    fn abort(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(self.0.abort())
    }
}

/// Builds `{"path": ..., "content_base64": ..., ["bytes": n]}` with the base64 written
/// straight into the response buffer (no intermediate string, no JSON escaping pass).
fn download_body(shown: &str, data: &[u8], with_bytes: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(shown.len() + 40);
    out.extend_from_slice(b"{\"path\":");
    // A string always serialises.
    let _ = serde_json::to_writer(&mut out, shown);
    out.extend_from_slice(b",\"content_base64\":\"");
    // `"`, `,"bytes":`, up to 20 digits, `}`.
    push_base64(&mut out, data, 32);
    out.push(b'"');
    if with_bytes {
        out.extend_from_slice(b",\"bytes\":");
        out.extend_from_slice(itoa::Buffer::new().format(data.len()).as_bytes());
    }
    out.push(b'}');
    out
}

fn file_too_large(message: String) -> ApiError {
    ApiError::new(413, "ValueError", message).with_code("payload_too_large")
}

async fn download_json(call: &Call, input: String, with_bytes: bool) -> Result<Response, ApiError> {
    let services = call.services();
    let limit = services.max_upload_size;
    let caller = confine_followed(call, &input).await?;
    let opened: Opened = open_file(&services.base, &caller, true)
        .await
        .map_err(fs_error)?;
    over_policy_limit(call, opened.stat.st_size as u64)?;
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
        return Err(file_too_large(format!(
            "File too large: {size} bytes (limit {limit})"
        )));
    }
    let io = |e: std::io::Error| fs_error(crate::fs::FsError::io(e, shown.clone()));
    let file = AsyncFile::new(opened.fd, services.driver).map_err(io)?;
    // The answer's length is known from the size: stream it, one piece in memory at a
    // time. A file that changes size meanwhile ends the connection short (the length
    // announced cannot be met), as with the raw download.
    let mut prefix = Vec::with_capacity(shown.len() + 40);
    prefix.extend_from_slice(b"{\"path\":");
    let _ = serde_json::to_writer(&mut prefix, &shown);
    prefix.extend_from_slice(b",\"content_base64\":\"");
    let mut suffix = b"\"".to_vec();
    if with_bytes {
        suffix.extend_from_slice(b",\"bytes\":");
        suffix.extend_from_slice(itoa::Buffer::new().format(size).as_bytes());
    }
    suffix.push(b'}');
    let stream = Base64FileStream::new(file, 0, size, prefix, suffix);
    Ok(Response::stream(200, JSON_CONTENT_TYPE, Box::new(stream)))
}

/// `GET /download`.
pub async fn download(call: Call) -> Result<Response, ApiError> {
    let input = take_string(&mut call.args()?, "path");
    download_json(&call, input, false).await
}

/// `GET /files/download-stream`: JSON plus `bytes`, or raw bytes with Range and ETag.
pub async fn download_stream(call: Call) -> Result<Response, ApiError> {
    let mut args = call.args()?;
    let input = take_string(&mut args, "path");
    let wants_raw = args.flag("raw")
        || call.header("accept").is_some_and(|a| {
            a.split(',').any(|t| {
                t.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .eq_ignore_ascii_case("application/octet-stream")
            })
        });
    if !wants_raw {
        return download_json(&call, input, true).await;
    }
    let caller = confine_followed(&call, &input).await?;
    raw_bytes(&call, &caller, "ValueError").await
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The field names a `Deserialize` struct accepts, read from its derive.
    fn struct_fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
        struct Capture(&'static [&'static str]);
        impl<'de> serde::Deserializer<'de> for &mut Capture {
            type Error = serde::de::value::Error;
            fn deserialize_any<V: serde::de::Visitor<'de>>(
                self,
                _: V,
            ) -> Result<V::Value, Self::Error> {
                Err(serde::de::Error::custom("not a struct"))
            }
            fn deserialize_struct<V: serde::de::Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Self::Error> {
                self.0 = fields;
                Err(serde::de::Error::custom("captured"))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
                byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
                enum identifier ignored_any
            }
        }
        let mut capture = Capture(&[]);
        let _ = T::deserialize(&mut capture);
        capture.0
    }

    /// The streamed JSON upload is not parsed by `Call::args`: its fields (the scanner's
    /// streamed member and the skeleton's struct) and their required-ness must be the
    /// body fields the upload endpoints declare, with the same sentences.
    #[test]
    fn the_streaming_parser_accepts_the_declared_fields() {
        for endpoint in crate::routes::builtin_endpoints() {
            let spec = &endpoint.spec;
            if !matches!(spec.id.as_ref(), "upload" | "files_upload_stream") {
                continue;
            }
            let body: Vec<&Param> = (spec.params.iter())
                .filter(|p| p.location == ParamIn::Body)
                .collect();
            let mut declared: Vec<&str> = body.iter().map(|p| p.name).collect();
            let mut accepted = struct_fields::<UploadBody>().to_vec();
            declared.sort_unstable();
            accepted.sort_unstable();
            assert_eq!(declared, accepted, "{}", spec.id);
            let streamed = std::str::from_utf8(crate::fs::upload_body::KEY).unwrap();
            assert!(declared.contains(&streamed), "{}", spec.id);
            for param in &body {
                assert!(param.required, "{} {}", spec.id, param.name);
                let others: serde_json::Map<String, serde_json::Value> = (body.iter())
                    .filter(|p| p.name != param.name)
                    .map(|p| (p.name.to_string(), json!("aGk=")))
                    .collect();
                let skeleton = serde_json::to_vec(&others).unwrap();
                let err = parse_skeleton(&skeleton, false, 100).unwrap_err();
                let sentence = param
                    .missing
                    .map_or_else(|| format!("{} is required", param.name), str::to_string);
                assert_eq!(err.message, sentence, "{} {}", spec.id, param.name);
            }
            let whole = br#"{"path": "a.txt", "content_base64": "aGk="}"#;
            let (path, inline) = parse_skeleton(whole, false, 100).unwrap();
            assert_eq!(
                (path.as_str(), inline.as_deref()),
                ("a.txt", Some(&b"hi"[..]))
            );
        }
    }

    #[test]
    fn download_body_is_valid_json() {
        let body = download_body("/home/user/a \"b\".bin", &[0, 1, 2, 255], true);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["content_base64"], "AAEC/w==");
        assert_eq!(v["bytes"], 4);
        assert_eq!(v["path"], "/home/user/a \"b\".bin");
    }
}
