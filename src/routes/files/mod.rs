//! The file_ops group: the contract's twelve file routes, plus the raw streaming forms of
//! upload-stream and download-stream (`docs/api.md`). Adapters only: the work is in
//! `crate::fs`; [`fs_error`] words its failures as the contract does.

mod archive;
mod search;
pub(crate) mod transfer;
mod tree;
mod watch;

use serde_json::Value;

use crate::api::{ApiError, Args, Group, Method, Param};
use crate::app::{handler, sink_handler, Endpoint};

/// The sentence for a missing `path` query parameter.
const PATH_QUERY_MISSING: &str = "path is required (query parameter ?path=)";

pub fn endpoints() -> Vec<Endpoint> {
    let path_q = |doc: &'static str| {
        Param::query("path", "string", true)
            .missing(PATH_QUERY_MISSING)
            .doc(doc)
    };
    let recursive = Param::query("recursive", "boolean", false).default("false");
    let upload_params = || {
        vec![
            Param::body("path", "string", true)
                .doc("Where to write the file (parent directories are created)."),
            Param::body("content_base64", "string", true)
                .doc("The file's bytes in standard base64 (line breaks are tolerated)."),
        ]
    };
    let mut upload_stream_params = upload_params();
    upload_stream_params.push(
        Param::query("path", "string", false)
            .missing(PATH_QUERY_MISSING)
            .doc("Where to write a raw application/octet-stream body (required for that form)."),
    );
    let moved = |name: &'static str, missing: &'static str, invalid: &'static str| {
        Param::body(name, "string", true)
            .missing(missing)
            .invalid(invalid)
    };
    vec![
        Endpoint::streamed(
            Method::Post,
            "/upload",
            Group::FileOps,
            sink_handler(transfer::open_json_upload),
        )
        .id("upload").extension().scopes(&["files:write"])
        .enforces(&[
            "paths",
            "overwrite",
            "allow_extensions",
            "deny_extensions",
            "max_upload_bytes",
        ])
        .changes()
        .returns(schema::path_bytes)
        .also_answers(&[503])
        .summary("Write a file from base64 content (atomic; parent directories created).")
        .params(&upload_params()),
        Endpoint::new(
            Method::Get,
            "/download",
            Group::FileOps,
            handler(transfer::download),
        )
        .id("download").extension().scopes(&["files:read"])
        .enforces(&["paths", "max_bytes"])
        .kept_locked_down()
        .returns(schema::download)
        .also_answers(&[503])
        .summary("Read a file as base64.")
        .params(&[path_q("The file to read.")]),
        Endpoint::new(
            Method::Get,
            "/files/list",
            Group::FileOps,
            handler(tree::list),
        )
        .id("files_list").scopes(&["files:read"])
        .enforces(&["paths", "max_depth", "max_entries"])
        .kept_locked_down()
        .returns(schema::list)
        .also_answers(&[503])
        .summary("List a directory (recursive to depth 3 with recursive=true).")
        .params(&[
            path_q("The directory to list."),
            recursive
                .clone()
                .doc("List subdirectories too, 3 levels deep (the policy's max_depth when lower)."),
            Param::query("max_entries", "integer", false)
                .lenient()
                .default("1000")
                .doc("The most entries listed (walk order); one that is not a positive whole number is 1000. The policy's max_entries caps it."),
        ])
        .limit("max_depth", crate::fs::tree::LIST_MAX_DEPTH)
        .limit("max_entries", crate::fs::tree::LIST_MAX_ENTRIES as u64),
        Endpoint::new(
            Method::Get,
            "/files/stat",
            Group::FileOps,
            handler(tree::stat),
        )
        .id("files_stat").scopes(&["files:read"])
        .enforces(&["paths"])
        .kept_locked_down()
        .returns(schema::stat)
        .also_answers(&[503])
        .summary("Metadata of a path; exists is false when nothing is there.")
        .params(&[path_q("The path to describe (a symlink itself, not its target).")]),
        Endpoint::new(
            Method::Post,
            "/files/mkdir",
            Group::FileOps,
            handler(tree::mkdir),
        )
        .id("files_mkdir").scopes(&["files:write"])
        .enforces(&["paths"])
        .changes()
        .returns(schema::mkdir)
        .also_answers(&[503])
        .summary("Create a directory and its parents.")
        .params(&[Param::body("path", "string", true)
            .doc("The directory to create, with its parents (an existing one is fine).")]),
        Endpoint::new(
            Method::Delete,
            "/files",
            Group::FileOps,
            handler(tree::delete),
        )
        .id("files_delete").scopes(&["files:delete"])
        .enforces(&["paths"])
        .changes()
        .returns(schema::delete)
        .also_answers(&[503])
        .summary("Delete a file or a directory tree.")
        .params(&[path_q("The file or directory tree to delete.")]),
        Endpoint::new(
            Method::Post,
            "/files/move",
            Group::FileOps,
            handler(tree::move_path),
        )
        .id("files_move").scopes(&["files:write", "files:delete"])
        .enforces(&["paths"])
        .changes()
        .returns(schema::r#move)
        .also_answers(&[503])
        .summary("Move or rename a file or directory.")
        .params(&[
            moved(
                "source",
                "source: path is required",
                "source: path must be a string",
            )
            .doc("The file or directory to move."),
            moved(
                "destination",
                "destination: path is required",
                "destination: path must be a string",
            )
            .doc("Where it goes; into an existing directory, beneath it. Parents are created."),
        ]),
        Endpoint::new(
            Method::Post,
            "/files/search",
            Group::FileOps,
            handler(search::search),
        )
        .id("files_search").scopes(&["files:read"])
        .enforces(&["paths", "max_files", "max_depth", "max_duration_seconds"])
        .only_reads()
        .kept_locked_down()
        .returns(schema::search)
        .also_answers(&[503])
        .summary("Find files whose name matches an fnmatch pattern.")
        .params(&[
            Param::body("path", "string", true)
                .blank_is_absent()
                .missing("Missing or invalid 'path'")
                .invalid("Missing or invalid 'path'")
                .doc("The directory to search."),
            Param::body("pattern", "string", true)
                .blank_is_absent()
                .missing("Missing or invalid 'pattern'")
                .invalid("Missing or invalid 'pattern'")
                .doc("fnmatch pattern matched against file names."),
            Param::body("max_depth", "integer", false)
                .python_int()
                .default("5")
                .doc("Directory levels to descend (as Python's int() reads it: \"3\" and 3.0 are 3)."),
            Param::body("max_results", "integer", false)
                .python_int()
                .default("100")
                .doc("Results to return, at most 10000 (read as Python's int() reads it)."),
        ])
        .limit("max_depth", search::DEFAULT_DEPTH)
        .limit("max_results", search::DEFAULT_RESULTS)
        .limit("max_results_cap", search::MAX_RESULTS)
        .limit("timeout_seconds", search::TIME_LIMIT.as_secs()),
        Endpoint::streamed(
            Method::Post,
            "/files/upload-stream",
            Group::FileOps,
            sink_handler(transfer::open_json_upload),
        )
        .id("files_upload_stream").scopes(&["files:write"])
        .enforces(&[
            "paths",
            "overwrite",
            "allow_extensions",
            "deny_extensions",
            "max_upload_bytes",
        ])
        .changes()
        .returns(schema::path_bytes)
        .also_answers(&[503])
        .summary("Upload as /upload does, or stream a raw application/octet-stream body to disk.")
        .params(&upload_stream_params)
        .raw_body(sink_handler(transfer::open_raw_upload)),
        Endpoint::new(
            Method::Get,
            "/files/download-stream",
            Group::FileOps,
            handler(transfer::download_stream),
        )
        .id("files_download_stream").scopes(&["files:read"])
        .enforces(&["paths", "max_bytes"])
        .kept_locked_down()
        .returns(schema::download_stream)
        .also_answers(&[206, 304, 416])
        .also_answers(&[503])
        .summary("Download as /download does plus bytes, or raw bytes with Range and ETag.")
        .params(&[
            path_q("The file to read."),
            Param::query("raw", "boolean", false)
                .default("false")
                .doc("Answer the raw bytes (Range and ETag honoured), as Accept: application/octet-stream does."),
        ]),
        Endpoint::new(
            Method::Post,
            "/files/archive",
            Group::FileOps,
            handler(archive::archive),
        )
        .id("files_archive").scopes(&["files:read"])
        .enforces(&["paths", "max_files", "max_bytes"])
        .only_reads()
        .kept_locked_down()
        .returns(schema::archive)
        .also_answers(&[503])
        .summary("Pack paths into a tar.gz or zip archive, returned as base64.")
        .params(&[
            Param::body("paths", "array", true)
                .missing(archive::PATHS_INVALID)
                .invalid(archive::PATHS_INVALID)
                .doc("The files and directories to pack (a non-empty list of path strings)."),
            Param::body("format", "string", false)
                .default("\"tar.gz\"")
                .invalid("format must be \"tar.gz\" or \"zip\"")
                .doc("tar.gz or zip."),
        ])
        .limit("max_files", archive::MAX_FILES)
        .limit("max_bytes", archive::MAX_BYTES)
        .whole_json(),
        Endpoint::new(
            Method::Get,
            "/files/watch",
            Group::FileOps,
            handler(watch::watch),
        )
        .id("files_watch").scopes(&["files:read"])
        .enforces(&["paths", "max_duration_seconds"])
        .kept_locked_down()
        .summary("Server-sent events for changes below a directory.")
        .streaming(true)
        .params(&[
            path_q("The directory to watch."),
            recursive.doc("Watch subdirectories too."),
            Param::query("interval", "number", false)
                .above(0.0)
                .default("0.5")
                .invalid("interval must be a positive number of seconds")
                .doc("Seconds between polls, clamped to 0.1-5."),
            Param::query("timeout", "number", false)
                .above(0.0)
                .default("300")
                .invalid("timeout must be a positive number of seconds")
                .doc("Seconds until the stream ends with a timeout event, clamped to 0.1-86400 (and to the policy's max_duration_seconds)."),
        ])
        .limit("max_entries", crate::fs::watch::MAX_TRACKED),
    ]
}

/// JSON Schemas of the file routes' success bodies, for the OpenAPI document.
mod schema {
    use serde_json::{json, Value};

    use super::super::schema_object as object;

    pub fn path_bytes() -> Value {
        object(
            &["path", "bytes"],
            json!({"path": {"type": "string"}, "bytes": {"type": "integer"}}),
        )
    }
    pub fn download() -> Value {
        object(
            &["path", "content_base64"],
            json!({"path": {"type": "string"}, "content_base64": {"type": "string"}}),
        )
    }
    pub fn download_stream() -> Value {
        object(
            &["path", "content_base64", "bytes"],
            json!({"path": {"type": "string"}, "content_base64": {"type": "string"}, "bytes": {"type": "integer"}}),
        )
    }
    pub fn list() -> Value {
        let entry = object(
            &["name", "type", "size", "modified"],
            json!({"name": {"type": "string"}, "type": {"enum": ["file", "directory"]}, "size": {"type": "integer"}, "modified": {"type": "string"}}),
        );
        object(
            &["entries"],
            json!({"entries": {"type": "array", "items": entry}}),
        )
    }
    pub fn stat() -> Value {
        object(
            &[
                "name",
                "path",
                "type",
                "size",
                "permissions",
                "modified",
                "accessed",
                "created",
                "exists",
            ],
            json!({
                "name": {"type": "string"}, "path": {"type": "string"},
                "type": {"enum": ["file", "directory", "symlink", "unknown"]},
                "size": {"type": "integer"}, "permissions": {"type": "string"},
                "modified": {"type": "string"}, "accessed": {"type": "string"},
                "created": {"type": "string"}, "exists": {"type": "boolean"},
            }),
        )
    }
    pub fn mkdir() -> Value {
        object(
            &["path", "created"],
            json!({"path": {"type": "string"}, "created": {"const": true}}),
        )
    }
    pub fn delete() -> Value {
        object(
            &["path", "deleted"],
            json!({"path": {"type": "string"}, "deleted": {"const": true}}),
        )
    }
    pub fn r#move() -> Value {
        object(
            &["source", "destination"],
            json!({"source": {"type": "string"}, "destination": {"type": "string"}}),
        )
    }
    pub fn search() -> Value {
        let found = object(
            &["name", "path"],
            json!({"name": {"type": "string"}, "path": {"type": "string"}}),
        );
        object(
            &["results", "timed_out"],
            json!({"results": {"type": "array", "items": found}, "timed_out": {"type": "boolean"}, "truncated": {"type": "boolean"}}),
        )
    }
    pub fn archive() -> Value {
        object(
            &["content_base64", "format", "bytes"],
            json!({"content_base64": {"type": "string"}, "format": {"enum": ["tar.gz", "zip"]}, "bytes": {"type": "integer"}}),
        )
    }
}

/// String field `name` moved out of the checked fields (empty when absent: a required
/// one was checked).
fn take_string(args: &mut Args, name: &str) -> String {
    match args.take(name) {
        Some(Value::String(text)) => text,
        _ => String::new(),
    }
}

/// The path body field `name` names. Its declaration checked that it is a string; an
/// empty one names no path and is refused as a missing one, as the contract's
/// `resolve` refuses it.
fn named_path(args: &mut Args, name: &str) -> Result<String, ApiError> {
    let path = take_string(args, name);
    if path.is_empty() {
        return Err(ApiError::bad_request("path is required"));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str) -> crate::api::EndpointSpec {
        endpoints()
            .into_iter()
            .map(|e| *e.spec)
            .find(|s| s.id == id)
            .unwrap_or_else(|| panic!("{id} is not declared"))
    }

    /// `files_search`'s limits are declared with the defaults the domain documents.
    #[test]
    fn search_limits_are_declared_as_read() {
        let search = spec("files_search");
        for (name, default) in ["max_depth", "max_results"]
            .iter()
            .zip([search::DEFAULT_DEPTH, search::DEFAULT_RESULTS])
        {
            let param = search.params.iter().find(|p| p.name == *name).unwrap();
            assert_eq!(param.kind, crate::api::fields::Kind::Integer, "{name}");
            assert!(param.python_int, "{name}");
            assert_eq!(param.default, Some(default.to_string().as_str()), "{name}");
        }
    }

    /// Every field a file route reads has a one-line doc.
    #[test]
    fn every_field_is_documented() {
        for endpoint in endpoints() {
            for param in &endpoint.spec.params {
                assert!(!param.doc.is_empty(), "{} {}", endpoint.spec.id, param.name);
            }
        }
    }
}
