//! envd, E2B's in-sandbox daemon, as domain code: its messages ([`proto`]), their JSON
//! form ([`json`]), and turning a call's body into a request and an answer into bytes
//! in the codec the caller chose. The routes in `routes::envd` adapt these to HTTP.

pub mod files;
pub mod json;
pub mod processes;
pub mod proto;
pub mod users;
pub mod watchers;

use crate::http::connect::Codec;

pub use json::{FromJson, ToJson};

/// A request message from a body in `codec`; `Err` says what was wrong with it.
pub fn decode<M: prost::Message + Default + FromJson>(
    codec: Codec,
    body: &[u8],
) -> Result<M, String> {
    match codec {
        Codec::Proto => {
            M::decode(body).map_err(|e| format!("the message is not valid protobuf: {e}"))
        }
        Codec::Json => {
            // An empty body is the empty message, as connect-go reads it.
            if body.iter().all(u8::is_ascii_whitespace) {
                return M::from_json(&serde_json::json!({}));
            }
            let value: serde_json::Value = serde_json::from_slice(body)
                .map_err(|e| format!("the message is not valid JSON: {e}"))?;
            M::from_json(&value)
        }
    }
}

/// An answer message in `codec`.
pub fn encode<M: prost::Message + ToJson>(codec: Codec, message: &M) -> Vec<u8> {
    match codec {
        Codec::Proto => message.encode_to_vec(),
        Codec::Json => message.to_json().to_string().into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::proto::filesystem::{EntryInfo, FileType};
    use super::proto::process::{
        DataEvent, EndEvent, Event, EventResponse, Output, ProcessEvent, Selector,
        SendSignalRequest, StartRequest,
    };
    use super::proto::Timestamp;
    use super::*;

    #[test]
    fn json_requests_read_either_spelling_and_loose_numbers() {
        let body = br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo"],"envs":{"A":"1"},"cwd":"/w"},"pty":{"size":{"cols":"80","rows":24}},"tag":"t","stdin":false,"unknown":1}"#;
        let start: StartRequest = decode(Codec::Json, body).unwrap();
        let process = start.process.unwrap();
        assert_eq!(process.args, ["-l", "-c", "echo"]);
        assert_eq!(process.envs["A"], "1");
        assert_eq!(process.cwd.as_deref(), Some("/w"));
        let size = start.pty.unwrap().size.unwrap();
        assert_eq!((size.cols, size.rows), (80, 24));
        assert_eq!(
            (start.tag.as_deref(), start.stdin),
            (Some("t"), Some(false))
        );
        let signal: SendSignalRequest = decode(
            Codec::Json,
            br#"{"process":{"pid":7},"signal":"SIGNAL_SIGKILL"}"#,
        )
        .unwrap();
        assert_eq!(signal.signal, 9);
        assert_eq!(signal.process.unwrap().selector, Some(Selector::Pid(7)));
        let empty: StartRequest = decode(Codec::Json, b"").unwrap();
        assert!(empty.process.is_none());
        let wrong = decode::<SendSignalRequest>(Codec::Json, br#"{"signal":"SIGHUP"}"#);
        assert!(wrong.unwrap_err().contains("SIGNAL_SIGKILL"));
        let wrong = decode::<StartRequest>(Codec::Json, br#"{"process":{"args":"x"}}"#);
        assert!(wrong.unwrap_err().contains("args must be an array"));
    }

    #[test]
    fn answers_are_written_as_protojson_writes_them() {
        let data = EventResponse {
            event: Some(ProcessEvent {
                event: Some(Event::Data(DataEvent {
                    output: Some(Output::Stdout(b"hi\n".to_vec())),
                })),
            }),
        };
        assert_eq!(
            String::from_utf8(encode(Codec::Json, &data)).unwrap(),
            r#"{"event":{"data":{"stdout":"aGkK"}}}"#
        );
        // Defaults are left out: exit code 0 and an error never set.
        let end = EventResponse {
            event: Some(ProcessEvent {
                event: Some(Event::End(EndEvent {
                    exit_code: 0,
                    exited: true,
                    status: "exit status 0".into(),
                    error: None,
                })),
            }),
        };
        assert_eq!(
            String::from_utf8(encode(Codec::Json, &end)).unwrap(),
            r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#
        );
        let entry = EntryInfo {
            name: "a".into(),
            r#type: FileType::File as i32,
            path: "/w/a".into(),
            size: 5,
            mode: 0o644,
            permissions: "-rw-r--r--".into(),
            owner: "root".into(),
            group: "root".into(),
            modified_time: Some(Timestamp {
                seconds: 1_700_000_000,
                nanos: 5_000_000,
            }),
            symlink_target: None,
            metadata: Default::default(),
        };
        let json = entry.to_json();
        assert_eq!(json["type"], "FILE_TYPE_FILE");
        assert_eq!(json["size"], "5");
        assert_eq!(json["modifiedTime"], "2023-11-14T22:13:20.005Z");
        // The binary codec carries the same message back whole.
        let bytes = encode(Codec::Proto, &entry);
        assert_eq!(
            <EntryInfo as prost::Message>::decode(&bytes[..]).unwrap(),
            entry
        );
    }
}
