//! envd's messages (`process/process.proto` and `filesystem/filesystem.proto` of
//! e2b-dev/infra, as the `e2b` SDK's generated code declares them: same names, field
//! numbers and types), encoded and decoded by `prost`. Only the shapes live here; their
//! JSON form is in [`super::json`].

use std::collections::HashMap;

/// `google.protobuf.Timestamp`, declared here rather than pulled from `prost-types`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

pub mod process {
    use super::HashMap;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
    #[repr(i32)]
    pub enum Signal {
        Unspecified = 0,
        Sigterm = 15,
        Sigkill = 9,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Pty {
        #[prost(message, optional, tag = "1")]
        pub size: Option<PtySize>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PtySize {
        #[prost(uint32, tag = "1")]
        pub cols: u32,
        #[prost(uint32, tag = "2")]
        pub rows: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessConfig {
        #[prost(string, tag = "1")]
        pub cmd: String,
        #[prost(string, repeated, tag = "2")]
        pub args: Vec<String>,
        #[prost(map = "string, string", tag = "3")]
        pub envs: HashMap<String, String>,
        #[prost(string, optional, tag = "4")]
        pub cwd: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessInfo {
        #[prost(message, optional, tag = "1")]
        pub config: Option<ProcessConfig>,
        #[prost(uint32, tag = "2")]
        pub pid: u32,
        #[prost(string, optional, tag = "3")]
        pub tag: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListResponse {
        #[prost(message, repeated, tag = "1")]
        pub processes: Vec<ProcessInfo>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StartRequest {
        #[prost(message, optional, tag = "1")]
        pub process: Option<ProcessConfig>,
        #[prost(message, optional, tag = "2")]
        pub pty: Option<Pty>,
        #[prost(string, optional, tag = "3")]
        pub tag: Option<String>,
        #[prost(bool, optional, tag = "4")]
        pub stdin: Option<bool>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateRequest {
        #[prost(message, optional, tag = "1")]
        pub process: Option<ProcessSelector>,
        #[prost(message, optional, tag = "2")]
        pub pty: Option<Pty>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Empty {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessEvent {
        #[prost(oneof = "Event", tags = "1, 2, 3, 4")]
        pub event: Option<Event>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Event {
        #[prost(message, tag = "1")]
        Start(StartEvent),
        #[prost(message, tag = "2")]
        Data(DataEvent),
        #[prost(message, tag = "3")]
        End(EndEvent),
        #[prost(message, tag = "4")]
        Keepalive(Empty),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StartEvent {
        #[prost(uint32, tag = "1")]
        pub pid: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DataEvent {
        #[prost(oneof = "Output", tags = "1, 2, 3")]
        pub output: Option<Output>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Output {
        #[prost(bytes, tag = "1")]
        Stdout(Vec<u8>),
        #[prost(bytes, tag = "2")]
        Stderr(Vec<u8>),
        #[prost(bytes, tag = "3")]
        Pty(Vec<u8>),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EndEvent {
        #[prost(sint32, tag = "1")]
        pub exit_code: i32,
        #[prost(bool, tag = "2")]
        pub exited: bool,
        #[prost(string, tag = "3")]
        pub status: String,
        #[prost(string, optional, tag = "4")]
        pub error: Option<String>,
    }

    /// `StartResponse` and `ConnectResponse` (the same shape).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EventResponse {
        #[prost(message, optional, tag = "1")]
        pub event: Option<ProcessEvent>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SendInputRequest {
        #[prost(message, optional, tag = "1")]
        pub process: Option<ProcessSelector>,
        #[prost(message, optional, tag = "2")]
        pub input: Option<ProcessInput>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessInput {
        #[prost(oneof = "Input", tags = "1, 2")]
        pub input: Option<Input>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Input {
        #[prost(bytes, tag = "1")]
        Stdin(Vec<u8>),
        #[prost(bytes, tag = "2")]
        Pty(Vec<u8>),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StreamInputRequest {
        #[prost(oneof = "StreamInput", tags = "1, 2, 3")]
        pub event: Option<StreamInput>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum StreamInput {
        #[prost(message, tag = "1")]
        Start(StreamInputStart),
        #[prost(message, tag = "2")]
        Data(StreamInputData),
        #[prost(message, tag = "3")]
        Keepalive(Empty),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StreamInputStart {
        #[prost(message, optional, tag = "1")]
        pub process: Option<ProcessSelector>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StreamInputData {
        #[prost(message, optional, tag = "2")]
        pub input: Option<ProcessInput>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SendSignalRequest {
        #[prost(message, optional, tag = "1")]
        pub process: Option<ProcessSelector>,
        #[prost(enumeration = "Signal", tag = "2")]
        pub signal: i32,
    }

    /// `CloseStdinRequest` and `ConnectRequest` (the same shape).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SelectRequest {
        #[prost(message, optional, tag = "1")]
        pub process: Option<ProcessSelector>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessSelector {
        #[prost(oneof = "Selector", tags = "1, 2")]
        pub selector: Option<Selector>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Selector {
        #[prost(uint32, tag = "1")]
        Pid(u32),
        #[prost(string, tag = "2")]
        Tag(String),
    }
}

pub mod filesystem {
    use super::{HashMap, Timestamp};

    #[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
    #[repr(i32)]
    pub enum FileType {
        Unspecified = 0,
        File = 1,
        Directory = 2,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
    #[repr(i32)]
    pub enum EventType {
        Unspecified = 0,
        Create = 1,
        Write = 2,
        Remove = 3,
        Rename = 4,
        Chmod = 5,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MoveRequest {
        #[prost(string, tag = "1")]
        pub source: String,
        #[prost(string, tag = "2")]
        pub destination: String,
    }

    /// `StatRequest`, `MakeDirRequest` and `RemoveRequest` (the same shape).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PathRequest {
        #[prost(string, tag = "1")]
        pub path: String,
    }

    /// `StatResponse`, `MakeDirResponse` and `MoveResponse` (the same shape).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EntryResponse {
        #[prost(message, optional, tag = "1")]
        pub entry: Option<EntryInfo>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EntryInfo {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(enumeration = "FileType", tag = "2")]
        pub r#type: i32,
        #[prost(string, tag = "3")]
        pub path: String,
        #[prost(int64, tag = "4")]
        pub size: i64,
        #[prost(uint32, tag = "5")]
        pub mode: u32,
        #[prost(string, tag = "6")]
        pub permissions: String,
        #[prost(string, tag = "7")]
        pub owner: String,
        #[prost(string, tag = "8")]
        pub group: String,
        #[prost(message, optional, tag = "9")]
        pub modified_time: Option<Timestamp>,
        #[prost(string, optional, tag = "10")]
        pub symlink_target: Option<String>,
        #[prost(map = "string, string", tag = "11")]
        pub metadata: HashMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListDirRequest {
        #[prost(string, tag = "1")]
        pub path: String,
        #[prost(uint32, tag = "2")]
        pub depth: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListDirResponse {
        #[prost(message, repeated, tag = "1")]
        pub entries: Vec<EntryInfo>,
    }

    /// `WatchDirRequest` and `CreateWatcherRequest` (the same shape).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchRequest {
        #[prost(string, tag = "1")]
        pub path: String,
        #[prost(bool, tag = "2")]
        pub recursive: bool,
        #[prost(bool, tag = "3")]
        pub include_entry: bool,
        #[prost(bool, tag = "4")]
        pub allow_network_mounts: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FilesystemEvent {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(enumeration = "EventType", tag = "2")]
        pub r#type: i32,
        #[prost(message, optional, tag = "3")]
        pub entry: Option<EntryInfo>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchDirResponse {
        #[prost(oneof = "WatchEvent", tags = "1, 2, 3")]
        pub event: Option<WatchEvent>,
    }

    // One event at a time passes through; boxing the common variant would cost an
    // allocation per event for nothing.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum WatchEvent {
        #[prost(message, tag = "1")]
        Start(super::process::Empty),
        #[prost(message, tag = "2")]
        Filesystem(FilesystemEvent),
        #[prost(message, tag = "3")]
        Keepalive(super::process::Empty),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatcherId {
        #[prost(string, tag = "1")]
        pub watcher_id: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetWatcherEventsResponse {
        #[prost(message, repeated, tag = "1")]
        pub events: Vec<FilesystemEvent>,
    }
}
