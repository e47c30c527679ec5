//! The proto3 JSON form of envd's messages (what the `e2b` SDK sends: `json_format`'s
//! output, parsed here as `protojson` would: either field spelling, numbers as numbers
//! or strings, enums by name or number, bytes in either base64 alphabet, unknown fields
//! ignored as connect-go ignores them). Answers are written as `protojson` writes them:
//! lowerCamelCase names, fields at their default left out, 64-bit integers as strings,
//! enums by name, bytes in standard base64, timestamps in RFC 3339.

use serde_json::{json, Map, Value};

use super::proto::filesystem::{
    EntryInfo, EntryResponse, EventType, FileType, FilesystemEvent, GetWatcherEventsResponse,
    ListDirRequest, ListDirResponse, MoveRequest, PathRequest, WatchDirResponse, WatchEvent,
    WatchRequest, WatcherId,
};
use super::proto::process::{
    DataEvent, Empty, EndEvent, Event, EventResponse, Input, ListResponse, Output, ProcessConfig,
    ProcessEvent, ProcessInfo, ProcessInput, ProcessSelector, Pty, PtySize, SelectRequest,
    Selector, SendInputRequest, SendSignalRequest, StartRequest, StreamInput, StreamInputData,
    StreamInputRequest, StreamInputStart, UpdateRequest,
};
use super::proto::Timestamp;

/// A message read from its JSON form; `Err` says which field was wrong and why.
pub trait FromJson: Sized {
    fn from_json(value: &Value) -> Result<Self, String>;
}

/// A message in its JSON form.
pub trait ToJson {
    fn to_json(&self) -> Value;
}

/// The fields of one JSON object, looked up by either spelling.
struct Fields<'a>(&'a Map<String, Value>);

fn object<'a>(value: &'a Value, what: &str) -> Result<Fields<'a>, String> {
    match value {
        Value::Object(map) => Ok(Fields(map)),
        other => Err(format!("{what} must be a JSON object, not {}", kind(other))),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'a> Fields<'a> {
    /// The field by its JSON name or its proto name; `null` counts as absent.
    fn get(&self, json_name: &str, proto_name: &str) -> Option<&'a Value> {
        self.0
            .get(json_name)
            .or_else(|| self.0.get(proto_name))
            .filter(|v| !v.is_null())
    }

    fn string(&self, json_name: &str, proto_name: &str) -> Result<Option<String>, String> {
        match self.get(json_name, proto_name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!("{json_name} must be a string, not {}", kind(other))),
        }
    }

    fn bool(&self, json_name: &str, proto_name: &str) -> Result<Option<bool>, String> {
        match self.get(json_name, proto_name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(format!(
                "{json_name} must be a boolean, not {}",
                kind(other)
            )),
        }
    }

    fn u32(&self, json_name: &str, proto_name: &str) -> Result<Option<u32>, String> {
        let Some(value) = self.get(json_name, proto_name) else {
            return Ok(None);
        };
        let number = match value {
            Value::Number(n) => n.as_u64().or_else(|| {
                // `1.0` is an integer in proto3 JSON.
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                    .map(|f| f as u64)
            }),
            Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        };
        number
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| format!("{json_name} must be an integer from 0 to 4294967295"))
    }

    fn bytes(&self, json_name: &str, proto_name: &str) -> Result<Option<Vec<u8>>, String> {
        match self.get(json_name, proto_name) {
            None => Ok(None),
            Some(Value::String(s)) => decode_base64(s)
                .map(Some)
                .ok_or_else(|| format!("{json_name} must be base64")),
            Some(other) => Err(format!(
                "{json_name} must be a base64 string, not {}",
                kind(other)
            )),
        }
    }

    fn message<T: FromJson>(&self, json_name: &str, proto_name: &str) -> Result<Option<T>, String> {
        self.get(json_name, proto_name)
            .map(|v| T::from_json(v).map_err(|e| format!("{json_name}: {e}")))
            .transpose()
    }

    fn strings(&self, json_name: &str, proto_name: &str) -> Result<Vec<String>, String> {
        match self.get(json_name, proto_name) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(format!(
                        "{json_name} must hold strings, not {}",
                        kind(other)
                    )),
                })
                .collect(),
            Some(other) => Err(format!("{json_name} must be an array, not {}", kind(other))),
        }
    }

    fn string_map(
        &self,
        json_name: &str,
        proto_name: &str,
    ) -> Result<std::collections::HashMap<String, String>, String> {
        match self.get(json_name, proto_name) {
            None => Ok(Default::default()),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    other => Err(format!(
                        "{json_name}.{k} must be a string, not {}",
                        kind(other)
                    )),
                })
                .collect(),
            Some(other) => Err(format!(
                "{json_name} must be an object, not {}",
                kind(other)
            )),
        }
    }

    /// An enum field by name (`SIGNAL_SIGKILL`) or number.
    fn enumeration(
        &self,
        json_name: &str,
        proto_name: &str,
        names: &[(&str, i32)],
    ) -> Result<i32, String> {
        match self.get(json_name, proto_name) {
            None => Ok(0),
            Some(Value::String(s)) => names
                .iter()
                .find(|(name, _)| name == s)
                .map(|(_, n)| *n)
                .ok_or_else(|| {
                    let known: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
                    format!("{json_name} must be one of {}, not '{s}'", known.join(", "))
                }),
            Some(Value::Number(n)) => n
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| format!("{json_name} must be an enum value")),
            Some(other) => Err(format!(
                "{json_name} must be an enum name, not {}",
                kind(other)
            )),
        }
    }
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    // protojson accepts standard or URL-safe base64, padded or not.
    let standard: String = text
        .trim_end_matches('=')
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    base64_simd::STANDARD_NO_PAD
        .decode_to_vec(standard.as_bytes())
        .ok()
}

fn encode_base64(bytes: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(bytes)
}

/// Writes the non-default fields of a message in order.
#[derive(Default)]
struct Out(Map<String, Value>);

impl Out {
    fn string(mut self, name: &str, value: &str) -> Self {
        if !value.is_empty() {
            self.0.insert(name.into(), Value::String(value.into()));
        }
        self
    }

    fn optional_string(mut self, name: &str, value: &Option<String>) -> Self {
        if let Some(value) = value {
            self.0.insert(name.into(), Value::String(value.clone()));
        }
        self
    }

    fn number(mut self, name: &str, value: i64) -> Self {
        if value != 0 {
            self.0.insert(name.into(), json!(value));
        }
        self
    }

    /// A 64-bit integer: a string in proto3 JSON.
    fn int64(mut self, name: &str, value: i64) -> Self {
        if value != 0 {
            self.0.insert(name.into(), Value::String(value.to_string()));
        }
        self
    }

    fn bool(mut self, name: &str, value: bool) -> Self {
        if value {
            self.0.insert(name.into(), Value::Bool(true));
        }
        self
    }

    fn value(mut self, name: &str, value: Value) -> Self {
        self.0.insert(name.into(), value);
        self
    }

    fn message<T: ToJson>(self, name: &str, value: &Option<T>) -> Self {
        match value {
            Some(value) => self.value(name, value.to_json()),
            None => self,
        }
    }

    fn list<T: ToJson>(self, name: &str, items: &[T]) -> Self {
        if items.is_empty() {
            return self;
        }
        self.value(
            name,
            Value::Array(items.iter().map(ToJson::to_json).collect()),
        )
    }

    fn string_map(self, name: &str, map: &std::collections::HashMap<String, String>) -> Self {
        if map.is_empty() {
            return self;
        }
        // Sorted, so the same message always reads the same.
        let sorted: std::collections::BTreeMap<_, _> = map.iter().collect();
        self.value(name, json!(sorted))
    }

    fn done(self) -> Value {
        Value::Object(self.0)
    }
}

const SIGNALS: [(&str, i32); 3] = [
    ("SIGNAL_UNSPECIFIED", 0),
    ("SIGNAL_SIGTERM", 15),
    ("SIGNAL_SIGKILL", 9),
];

fn file_type_name(value: i32) -> Option<&'static str> {
    match FileType::try_from(value).ok()? {
        FileType::Unspecified => None,
        FileType::File => Some("FILE_TYPE_FILE"),
        FileType::Directory => Some("FILE_TYPE_DIRECTORY"),
    }
}

fn event_type_name(value: i32) -> Option<&'static str> {
    match EventType::try_from(value).ok()? {
        EventType::Unspecified => None,
        EventType::Create => Some("EVENT_TYPE_CREATE"),
        EventType::Write => Some("EVENT_TYPE_WRITE"),
        EventType::Remove => Some("EVENT_TYPE_REMOVE"),
        EventType::Rename => Some("EVENT_TYPE_RENAME"),
        EventType::Chmod => Some("EVENT_TYPE_CHMOD"),
    }
}

// ---- requests ----

impl FromJson for Empty {
    fn from_json(value: &Value) -> Result<Self, String> {
        object(value, "the message")?;
        Ok(Empty {})
    }
}

impl FromJson for ProcessSelector {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "process")?;
        let selector = match (f.u32("pid", "pid")?, f.string("tag", "tag")?) {
            (Some(pid), _) => Some(Selector::Pid(pid)),
            (None, Some(tag)) => Some(Selector::Tag(tag)),
            (None, None) => None,
        };
        Ok(ProcessSelector { selector })
    }
}

impl FromJson for PtySize {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "size")?;
        Ok(PtySize {
            cols: f.u32("cols", "cols")?.unwrap_or(0),
            rows: f.u32("rows", "rows")?.unwrap_or(0),
        })
    }
}

impl FromJson for Pty {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "pty")?;
        Ok(Pty {
            size: f.message("size", "size")?,
        })
    }
}

impl FromJson for ProcessConfig {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "process")?;
        Ok(ProcessConfig {
            cmd: f.string("cmd", "cmd")?.unwrap_or_default(),
            args: f.strings("args", "args")?,
            envs: f.string_map("envs", "envs")?,
            cwd: f.string("cwd", "cwd")?,
        })
    }
}

impl FromJson for StartRequest {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "the request")?;
        Ok(StartRequest {
            process: f.message("process", "process")?,
            pty: f.message("pty", "pty")?,
            tag: f.string("tag", "tag")?,
            stdin: f.bool("stdin", "stdin")?,
        })
    }
}

impl FromJson for UpdateRequest {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "the request")?;
        Ok(UpdateRequest {
            process: f.message("process", "process")?,
            pty: f.message("pty", "pty")?,
        })
    }
}

impl FromJson for ProcessInput {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "input")?;
        let input = match (f.bytes("stdin", "stdin")?, f.bytes("pty", "pty")?) {
            (Some(bytes), _) => Some(Input::Stdin(bytes)),
            (None, Some(bytes)) => Some(Input::Pty(bytes)),
            (None, None) => None,
        };
        Ok(ProcessInput { input })
    }
}

impl FromJson for SendInputRequest {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "the request")?;
        Ok(SendInputRequest {
            process: f.message("process", "process")?,
            input: f.message("input", "input")?,
        })
    }
}

impl FromJson for StreamInputStart {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "start")?;
        Ok(StreamInputStart {
            process: f.message("process", "process")?,
        })
    }
}

impl FromJson for StreamInputData {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "data")?;
        Ok(StreamInputData {
            input: f.message("input", "input")?,
        })
    }
}

impl FromJson for StreamInputRequest {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "the request")?;
        let event = if let Some(start) = f.message("start", "start")? {
            Some(StreamInput::Start(start))
        } else if let Some(data) = f.message("data", "data")? {
            Some(StreamInput::Data(data))
        } else {
            f.message::<Empty>("keepalive", "keepalive")?
                .map(StreamInput::Keepalive)
        };
        Ok(StreamInputRequest { event })
    }
}

impl FromJson for SendSignalRequest {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "the request")?;
        Ok(SendSignalRequest {
            process: f.message("process", "process")?,
            signal: f.enumeration("signal", "signal", &SIGNALS)?,
        })
    }
}

impl FromJson for SelectRequest {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "the request")?;
        Ok(SelectRequest {
            process: f.message("process", "process")?,
        })
    }
}

impl FromJson for PathRequest {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "the request")?;
        Ok(PathRequest {
            path: f.string("path", "path")?.unwrap_or_default(),
        })
    }
}

impl FromJson for MoveRequest {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "the request")?;
        Ok(MoveRequest {
            source: f.string("source", "source")?.unwrap_or_default(),
            destination: f.string("destination", "destination")?.unwrap_or_default(),
        })
    }
}

impl FromJson for ListDirRequest {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "the request")?;
        Ok(ListDirRequest {
            path: f.string("path", "path")?.unwrap_or_default(),
            depth: f.u32("depth", "depth")?.unwrap_or(0),
        })
    }
}

impl FromJson for WatchRequest {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "the request")?;
        Ok(WatchRequest {
            path: f.string("path", "path")?.unwrap_or_default(),
            recursive: f.bool("recursive", "recursive")?.unwrap_or(false),
            include_entry: f.bool("includeEntry", "include_entry")?.unwrap_or(false),
            allow_network_mounts: f
                .bool("allowNetworkMounts", "allow_network_mounts")?
                .unwrap_or(false),
        })
    }
}

impl FromJson for WatcherId {
    fn from_json(value: &Value) -> Result<Self, String> {
        let f = object(value, "the request")?;
        Ok(WatcherId {
            watcher_id: f.string("watcherId", "watcher_id")?.unwrap_or_default(),
        })
    }
}

// ---- answers ----

impl ToJson for Empty {
    fn to_json(&self) -> Value {
        json!({})
    }
}

impl ToJson for ProcessConfig {
    fn to_json(&self) -> Value {
        let out = Out::default().string("cmd", &self.cmd);
        let out = if self.args.is_empty() {
            out
        } else {
            out.value("args", json!(self.args))
        };
        out.string_map("envs", &self.envs)
            .optional_string("cwd", &self.cwd)
            .done()
    }
}

impl ToJson for ProcessInfo {
    fn to_json(&self) -> Value {
        Out::default()
            .message("config", &self.config)
            .number("pid", i64::from(self.pid))
            .optional_string("tag", &self.tag)
            .done()
    }
}

impl ToJson for ListResponse {
    fn to_json(&self) -> Value {
        Out::default().list("processes", &self.processes).done()
    }
}

impl ToJson for EndEvent {
    fn to_json(&self) -> Value {
        Out::default()
            .number("exitCode", i64::from(self.exit_code))
            .bool("exited", self.exited)
            .string("status", &self.status)
            .optional_string("error", &self.error)
            .done()
    }
}

impl ToJson for DataEvent {
    fn to_json(&self) -> Value {
        let out = Out::default();
        match &self.output {
            Some(Output::Stdout(b)) => out.value("stdout", Value::String(encode_base64(b))),
            Some(Output::Stderr(b)) => out.value("stderr", Value::String(encode_base64(b))),
            Some(Output::Pty(b)) => out.value("pty", Value::String(encode_base64(b))),
            None => out,
        }
        .done()
    }
}

impl ToJson for ProcessEvent {
    fn to_json(&self) -> Value {
        let out = Out::default();
        match &self.event {
            Some(Event::Start(start)) => out.value(
                "start",
                Out::default().number("pid", i64::from(start.pid)).done(),
            ),
            Some(Event::Data(data)) => out.value("data", data.to_json()),
            Some(Event::End(end)) => out.value("end", end.to_json()),
            Some(Event::Keepalive(_)) => out.value("keepalive", json!({})),
            None => out,
        }
        .done()
    }
}

impl ToJson for EventResponse {
    fn to_json(&self) -> Value {
        Out::default().message("event", &self.event).done()
    }
}

/// RFC 3339 in UTC with as many fraction digits as `protojson` writes (0, 3, 6 or 9).
pub fn timestamp_text(stamp: &Timestamp) -> String {
    let days = stamp.seconds.div_euclid(86_400);
    let rem = stamp.seconds.rem_euclid(86_400);
    let (y, m, d) = crate::timefmt::civil_from_days(days);
    let nanos = stamp.nanos.clamp(0, 999_999_999);
    let fraction = if nanos == 0 {
        String::new()
    } else if nanos % 1_000_000 == 0 {
        format!(".{:03}", nanos / 1_000_000)
    } else if nanos % 1000 == 0 {
        format!(".{:06}", nanos / 1000)
    } else {
        format!(".{nanos:09}")
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{fraction}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

impl ToJson for EntryInfo {
    fn to_json(&self) -> Value {
        let out = Out::default().string("name", &self.name);
        let out = match file_type_name(self.r#type) {
            Some(name) => out.value("type", Value::String(name.into())),
            None => out,
        };
        let out = out
            .string("path", &self.path)
            .int64("size", self.size)
            .number("mode", i64::from(self.mode))
            .string("permissions", &self.permissions)
            .string("owner", &self.owner)
            .string("group", &self.group);
        let out = match &self.modified_time {
            Some(stamp) => out.value("modifiedTime", Value::String(timestamp_text(stamp))),
            None => out,
        };
        out.optional_string("symlinkTarget", &self.symlink_target)
            .string_map("metadata", &self.metadata)
            .done()
    }
}

impl ToJson for EntryResponse {
    fn to_json(&self) -> Value {
        Out::default().message("entry", &self.entry).done()
    }
}

impl ToJson for ListDirResponse {
    fn to_json(&self) -> Value {
        Out::default().list("entries", &self.entries).done()
    }
}

impl ToJson for FilesystemEvent {
    fn to_json(&self) -> Value {
        let out = Out::default().string("name", &self.name);
        let out = match event_type_name(self.r#type) {
            Some(name) => out.value("type", Value::String(name.into())),
            None => out,
        };
        out.message("entry", &self.entry).done()
    }
}

impl ToJson for WatchDirResponse {
    fn to_json(&self) -> Value {
        let out = Out::default();
        match &self.event {
            Some(WatchEvent::Start(_)) => out.value("start", json!({})),
            Some(WatchEvent::Filesystem(event)) => out.value("filesystem", event.to_json()),
            Some(WatchEvent::Keepalive(_)) => out.value("keepalive", json!({})),
            None => out,
        }
        .done()
    }
}

impl ToJson for WatcherId {
    fn to_json(&self) -> Value {
        Out::default().string("watcherId", &self.watcher_id).done()
    }
}

impl ToJson for GetWatcherEventsResponse {
    fn to_json(&self) -> Value {
        Out::default().list("events", &self.events).done()
    }
}
