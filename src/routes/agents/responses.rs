//! `/v1/responses`: a turn of a local CLI as an OpenAI Response, answered whole or as
//! server-sent events, and the stored responses afterwards. The turn itself is the
//! domain's (`crate::agents::run`); this is the declaration and the adapters.

use serde_json::{json, Map, Value};

use super::resource::{Named, Op, Resource};
use super::session_live::KEEPALIVE;
use super::{agents_of, args, cannot, cli, default_runtime, path_value};
use crate::agents::install::{Located, Progress};
use crate::agents::objects::label;
use crate::agents::responses::{
    prepare, select_runtime, InputItem, Prepared, ResponseRecord, TurnRequest,
};
use crate::agents::run::{start, Event, Gone, Launch, Sink, TurnRun};
use crate::agents::surface::AgentsStore;
use crate::agents::Runtime;
use crate::api::{ApiError, Args, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::{sse, Response};

const RESPONSE: Named = Named {
    object: "response",
    param: "response_id",
};

/// The fields `POST /v1/responses` honours; any other is a 400.
fn turn_fields() -> Vec<Param> {
    vec![
        Param::body("input", "any", true)
            .missing("input is required: a string or a list of message items.")
            .doc("A string, or a list of message items whose content is text."),
        Param::body("model", "string", false)
            .doc("A runtime (`codex`), a runtime and its CLI's model (`codex/gpt-5`), or the CLI's model."),
        Param::body("runtime", "string", false)
            .doc("The runtime (a name or alias); an extension of this server."),
        Param::body("instructions", "string", false).doc("Put ahead of the prompt."),
        Param::body("stream", "boolean", false)
            .default("false")
            .invalid("stream must be true or false.")
            .doc("Answer with server-sent events."),
        Param::body("store", "boolean", false)
            .default("true")
            .invalid("store must be true or false.")
            .doc("false keeps nothing: the response cannot be retrieved or cancelled."),
        Param::body("metadata", "object", false)
            .invalid("metadata must be an object of strings.")
            .doc("16 strings at most."),
        Param::body("conversation", "any", false)
            .doc("A conversation id or {\"id\": ...}: the turn continues it."),
        Param::body("previous_response_id", "string", false)
            .doc("The turn continues that response's CLI session."),
    ]
}

pub fn endpoints() -> Vec<Endpoint> {
    let mut endpoints = Resource::new("responses", "/v1/responses", RESPONSE)
        .op(Op::create(
            "Run one turn of a local coding agent (stream: true for server-sent events).",
            handler(create),
        )
        .params(turn_fields())
        .streaming())
        .op(Op::get_record::<ResponseRecord>("A stored response."))
        .op(Op::delete(
            "Forget a response (a running one is cancelled first).",
            handler(delete),
        ))
        .op(Op::member(
            "cancel",
            Method::Post,
            "Stop a running response: its CLI's process group is killed.",
            handler(cancel),
        ))
        .op(Op::member_records::<InputItem>(
            "input_items",
            "The input items of a response.",
        ))
        .op(Op::collection(
            "input_tokens",
            Method::Post,
            "Refused: the CLIs count no tokens ahead of a turn.",
            handler(|_| async {
                Err(cannot(
                    "Counting input tokens is not available: the local runtimes report usage only after a turn (see usage on the response).",
                ))
            }),
        ))
        .endpoints();
    endpoints.push(
        super::route(
            Method::Post,
            "/v1/responses/compact",
            "agents_responses_compact",
            "Compress the CLI session a response continues (qwen-code's /compress); codex cannot.",
            handler(compact),
        )
        .params(&[
            Param::body("previous_response_id", "string", true)
                .missing("previous_response_id: required; the summary is of that conversation")
                .doc("The response whose CLI session is compressed; a later turn continuing it starts from the summary."),
            Param::body("model", "string", false).doc("Accepted and unused: the session's runtime compresses it."),
            Param::body("runtime", "string", false).doc("Accepted and unused, as model."),
            Param::body("adapter", "string", false).doc("Accepted and unused (the reference's name for runtime)."),
        ]),
    );
    endpoints.push(
        super::route(
            Method::Get,
            "/v1/responses",
            "agents_responses_connect",
            "The Responses WebSocket (responses.connect): response.create and response.steer messages, each answered with the turn's stream events.",
            handler(|_| async { Err(upgrade_required()) }),
        )
        .also_upgrades(std::sync::Arc::new(|upgraded, stream, leftover| {
            Box::pin(socket::serve(upgraded, stream, leftover))
        })),
    );
    endpoints
}

/// `POST /v1/responses/compact` (the reference's R-07): a turn of the session's CLI that
/// runs qwen-code's `/compress` (kept out of the stored responses), answered as a
/// `response.compaction` with the token counts qwen reports. codex compacts only inside
/// its own turns, so it is refused.
async fn compact(call: Call) -> Result<Response, ApiError> {
    let body: Map<String, Value> = call.json()?;
    if let Some(key) = body
        .keys()
        .find(|k| !["model", "previous_response_id", "adapter", "runtime"].contains(&k.as_str()))
    {
        return Err(super::invalid(
            key,
            format!("{key}: compaction takes the stored conversation only"),
        ));
    }
    let previous = match body.get("previous_response_id") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        _ => {
            return Err(super::invalid(
                "previous_response_id",
                "previous_response_id: required; the summary is of that conversation",
            ))
        }
    };
    let owner = &call.identity.id;
    let agents = agents_of(&call)?;
    match agents.session_runtime(owner, &previous).await? {
        Some(Runtime::QwenCode) => {}
        Some(runtime) => {
            return Err(super::invalid(
                "model",
                format!(
                    "compaction is not supported for {}: only qwen-code's /compress is run as a compaction here (codex exec emits no compaction item; Claude Code compacts its own context when it needs to)",
                    runtime.name()
                ),
            )
            .with_code("agents.compact_unsupported"))
        }
        None => {
            return Err(super::invalid(
                "previous_response_id",
                format!("Response '{previous}' has no session to compact (it failed before the agent started)."),
            ))
        }
    }
    let request = TurnRequest {
        input: json!("/compress"),
        model: None,
        runtime: Some(Runtime::QwenCode.name().to_string()),
        instructions: None,
        store: false,
        metadata: None,
        conversation: None,
        previous_response_id: Some(previous.clone()),
    };
    let turn = prepare(&agents, owner, request, default_runtime(&call)).await?;
    let launch = match ready_launch(&call, turn.runtime).await {
        Ok(launch) => launch,
        Err(error) => return Err(abandoned(turn, error).await),
    };
    let answer = start(&agents, owner, turn, launch).await?.whole().await;
    let output: Vec<Value> = answer["output"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|item| item["type"] == "message")
        .cloned()
        .collect();
    let said: Vec<&str> = output
        .iter()
        .flat_map(|item| {
            item["content"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
        })
        .filter_map(|part| part["text"].as_str())
        .collect();
    let said = said.join(" ");
    if answer["status"] != "completed" {
        let why = answer["error"]["message"].as_str().unwrap_or(&said);
        return Err(super::invalid(
            "previous_response_id",
            format!("the CLI could not compress the conversation: {why}"),
        )
        .with_code("agents.compact_failed"));
    }
    let mut note = label(
        Runtime::QwenCode.name(),
        &["summary_not_encrypted_compaction", "response_is_cli_turn"],
    );
    if let Some((before, after)) = compressed_counts(&said) {
        note["original_token_count"] = json!(before);
        note["new_token_count"] = json!(after);
    }
    Ok(Response::ok(&json!({
        "id": crate::agents::records::new_id("resp_cmp_"),
        "object": "response.compaction",
        "created_at": answer["created_at"],
        "output": output,
        "usage": answer["usage"],
        "x_agent_sandbox": note,
    })))
}

/// The counts of qwen-code's `Context compressed (N -> M).` (an estimate is `~M`).
fn compressed_counts(said: &str) -> Option<(u64, u64)> {
    let rest = &said[said.find("Context compressed (")? + "Context compressed (".len()..];
    let (counts, _) = rest.split_once(')')?;
    let (before, after) = counts.split_once("->")?;
    let number = |s: &str| s.trim().trim_start_matches('~').parse::<u64>().ok();
    Some((number(before)?, number(after)?))
}

/// A plain GET of `/v1/responses`, as the reference answers it.
fn upgrade_required() -> ApiError {
    ApiError::new(
        400,
        "invalid_request_error",
        "responses.connect needs a WebSocket upgrade (Upgrade: websocket); use POST /v1/responses for one response",
    )
    .with_code("agents.websocket_upgrade_required")
}

/// The runtime a refused field is named against, chosen as the turn would choose it.
fn turn_runtime(call: &Call) -> Result<&'static str, ApiError> {
    let body: Map<String, Value> = serde_json::from_slice(&call.body).unwrap_or_default();
    let text = |name: &str| body.get(name).and_then(Value::as_str);
    let (runtime, _) = select_runtime(text("model"), text("runtime"), default_runtime(call))?;
    Ok(runtime.name())
}

async fn create(call: Call) -> Result<Response, ApiError> {
    let (turn, stream) = prepare_turn(&call).await?;
    if !stream {
        let agents = agents_of(&call)?;
        let launch = match ready_launch(&call, turn.runtime).await {
            Ok(launch) => launch,
            Err(error) => return Err(abandoned(turn, error).await),
        };
        let run = start(&agents, &call.identity.id, turn, launch).await?;
        return Ok(Response::ok(&run.whole().await));
    }
    let (tx, rx) = sse::channel(64);
    let (ended, keep_alive) = futures_channel::oneshot::channel::<()>();
    monoio::spawn(keep_alive_until(tx.clone(), keep_alive));
    match begin(&call, turn).await? {
        Begun::Running(run) => {
            monoio::spawn(async move {
                run.stream(&mut Events(tx)).await;
                drop(ended);
            });
        }
        Begun::Installing(installing) => {
            let (turn, watch) = *installing;
            monoio::spawn(async move {
                stream_after_install(&call, turn, watch, &mut Events(tx)).await;
                drop(ended);
            });
        }
    }
    Ok(sse::response(rx))
}

/// A `: keep-alive` comment on a streamed turn every [`KEEPALIVE`] until the turn's
/// writer is done (`ended` fires when its sender drops) or the client leaves. A CLI can
/// be silent for minutes (a long command, a provider it keeps retrying), and the OpenAI
/// SDK's reader gives up on a stream after 600 s without a byte (its default read
/// timeout). SSE readers skip comments.
async fn keep_alive_until(
    mut tx: sse::SseSender,
    mut ended: futures_channel::oneshot::Receiver<()>,
) {
    loop {
        monoio::select! {
            _ = monoio::time::sleep(KEEPALIVE) => {
                if tx.send_raw(b": keep-alive\n\n".to_vec()).await.is_err() {
                    return;
                }
            }
            _ = &mut ended => return,
            _ = tx.closed() => return,
        }
    }
}

/// A turn's request read and prepared (its conversation held), and whether it asked
/// for a stream.
async fn prepare_turn(call: &Call) -> Result<(Prepared<AgentsStore>, bool), ApiError> {
    let mut args = args(call, turn_runtime)?;
    let text = |args: &Args, name: &str| args.str(name).map(str::to_string);
    let request = TurnRequest {
        model: text(&args, "model"),
        runtime: text(&args, "runtime"),
        instructions: text(&args, "instructions"),
        previous_response_id: text(&args, "previous_response_id"),
        store: args.flag("store"),
        input: args.take("input").unwrap_or_default(),
        metadata: args.take("metadata"),
        conversation: args.take("conversation"),
    };
    let agents = agents_of(call)?;
    let turn = prepare(&agents, &call.identity.id, request, default_runtime(call)).await?;
    Ok((turn, args.flag("stream")))
}

/// A streamed turn under way: its CLI started, or being installed first.
enum Begun {
    // Both boxed: each is large, and the other variant's size would be paid for too.
    Running(Box<TurnRun<AgentsStore>>),
    Installing(Box<(Prepared<AgentsStore>, crate::agents::install::Watch)>),
}

/// Starts a prepared turn that streams; a refusal frees its conversation first.
async fn begin(call: &Call, turn: Prepared<AgentsStore>) -> Result<Begun, ApiError> {
    let found = match cli::find(call, turn.runtime).await {
        Ok(found) => found,
        Err(error) => return Err(abandoned(turn, error).await),
    };
    match found {
        cli::Found::Ready(located) => {
            let launch = match launch(call, &located).await {
                Ok(launch) => launch,
                Err(error) => return Err(abandoned(turn, error).await),
            };
            let agents = agents_of(call)?;
            Ok(Begun::Running(Box::new(
                start(&agents, &call.identity.id, turn, launch).await?,
            )))
        }
        cli::Found::Installing(watch) => Ok(Begun::Installing(Box::new((turn, watch)))),
    }
}

/// The CLI of `runtime` found (or installed) and how it is started.
async fn ready_launch(call: &Call, runtime: Runtime) -> Result<Launch<'_>, ApiError> {
    let located = cli::ready(call, runtime).await?;
    launch(call, &located).await
}

/// A turn that will not start: its conversation is freed before the refusal is
/// answered, so a retry finds it free.
async fn abandoned(turn: Prepared<AgentsStore>, error: ApiError) -> ApiError {
    turn.abandon().await;
    error
}

/// How the turn's CLI is started: the base directory, the children's environment with
/// the CLI's own directories first on `PATH`.
async fn launch<'a>(call: &'a Call, located: &Located) -> Result<Launch<'a>, ApiError> {
    let cwd = crate::routes::shared::working_dir(call, None)
        .await
        .map_err(|e| {
            ApiError::new(
                500,
                "server_error",
                format!("The base directory cannot be opened: {}", e.message),
            )
        })?;
    Ok(Launch {
        program: located.program.clone(),
        cwd,
        env: cli::environment(call, located),
        children: &call.services().children,
        claude_home: call.config().state_dir.join("claude-code"),
        relay_base: super::session_live::relay_base(call),
    })
}

/// A streamed turn whose CLI is being installed: the response is shown at once
/// (`response.created`), each batch of npm's lines is a `response.in_progress` whose
/// `x_agent_sandbox.install` says so, then the turn streams on; a failed install is
/// an `error` event with the failure's code.
async fn stream_after_install(
    call: &Call,
    turn: Prepared<AgentsStore>,
    mut watch: crate::agents::install::Watch,
    events: &mut impl Sink,
) {
    let runtime = turn.runtime;
    let mut response = turn.preview();
    let mut sent = 0u64;
    let send = |name: &'static str, mut data: Value, sent: &mut u64| {
        data["type"] = json!(name);
        data["sequence_number"] = json!(*sent);
        *sent += 1;
        Event { name, data }
    };
    let created = send("response.created", json!({"response": response}), &mut sent);
    if events.send(created).await.is_err() {
        return;
    }
    let failure = loop {
        match watch.next().await {
            Progress::Lines(lines) => {
                response["x_agent_sandbox"]["install"] = cli::install_note(runtime, &lines);
                let note = send(
                    "response.in_progress",
                    json!({"response": response}),
                    &mut sent,
                );
                if events.send(note).await.is_err() {
                    return;
                }
            }
            Progress::Done(Ok(())) => break None,
            Progress::Done(Err(failure)) => break Some(cli::install_failed(runtime, &failure)),
        }
    };
    let launched = match failure {
        Some(error) => Err(error),
        None => match cli::installed(call, runtime).await {
            Ok(located) => launch(call, &located).await,
            Err(error) => Err(error),
        },
    };
    let launch = match launched {
        Ok(launch) => launch,
        Err(error) => return refuse(events, abandoned(turn, error).await, &mut sent).await,
    };
    let agents = match agents_of(call) {
        Ok(agents) => agents,
        Err(error) => return refuse(events, abandoned(turn, error).await, &mut sent).await,
    };
    match start(&agents, &call.identity.id, turn, launch).await {
        Ok(run) => run.stream_after(events, sent).await,
        Err(error) => refuse(events, error.into(), &mut sent).await,
    }
}

/// Ends a stream with OpenAI's `error` event for `error`.
async fn refuse(events: &mut impl Sink, error: ApiError, sent: &mut u64) {
    let data = json!({
        "type": "error",
        "code": error.code,
        "message": error.message,
        "param": null,
        "sequence_number": *sent,
    });
    *sent += 1;
    let _ = events
        .send(Event {
            name: "error",
            data,
        })
        .await;
}

/// A turn's events as server-sent events.
struct Events(sse::SseSender);

impl Sink for Events {
    async fn send(&mut self, event: Event) -> Result<(), Gone> {
        self.0.send(event.name, &event.data).await.map_err(|_| Gone)
    }

    async fn gone(&mut self) {
        self.0.closed().await
    }
}

async fn delete(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, RESPONSE.param);
    agents_of(&call)?
        .delete_response(&call.identity.id, &id)
        .await?;
    Ok(Response::ok(&json!({
        "id": id, "object": "response", "deleted": true,
        "x_agent_sandbox": label("agent-sandbox", &[]),
    })))
}

async fn cancel(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, RESPONSE.param);
    let object = agents_of(&call)?.cancel(&call.identity.id, &id).await?;
    Ok(Response::ok(&object))
}

/// `responses.connect`: the Responses API over a WebSocket on the API port. Each text
/// message is a client event; `response.create` runs the same turn as a streamed `POST
/// /v1/responses` and sends its events, one message each. The CLIs take no input
/// mid-turn, so `response.steer` is the next turn, run once the current one has ended
/// (the reference queues it the same way). Messages are handled in order; one that
/// arrives during a turn waits for it.
mod socket {
    use std::collections::VecDeque;
    use std::time::Duration;

    use monoio::net::TcpStream;
    use serde_json::{json, Value};

    use super::{begin, prepare_turn, stream_after_install, Begun};
    use crate::agents::run::{Event, Gone, Sink};
    use crate::api::{ApiError, ErrorStyle};
    use crate::app::Upgraded;
    use crate::http::websocket::{Received, WebSocket};

    /// How long one message may wait for a client that does not read.
    const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

    pub async fn serve(upgraded: Upgraded, stream: TcpStream, leftover: Vec<u8>) {
        let mut frames = Frames {
            socket: WebSocket::new(stream, leftover, WRITE_TIMEOUT),
            held: VecDeque::new(),
            closed: false,
        };
        while let Some(message) = frames.next().await {
            match message {
                Received::Text(text) => handle(&upgraded, &mut frames, &text).await,
                Received::Binary(_) => {
                    let _ = frames.socket.close(1003, "text frames only").await;
                    return;
                }
                Received::Closed => {
                    let _ = frames.socket.close(1000, "").await;
                    return;
                }
            }
            if frames.closed {
                return;
            }
        }
    }

    /// One client event, answered with a turn's events or one `error` event.
    async fn handle(upgraded: &Upgraded, frames: &mut Frames, text: &str) {
        let event: Value = match serde_json::from_str(text) {
            Ok(Value::Object(event)) => Value::Object(event),
            _ => {
                let error =
                    json!({"message": "a client event is a JSON object", "code": "bad_frame"});
                return frames.error(error).await;
            }
        };
        let kind = event["type"].as_str().unwrap_or_default().to_string();
        if kind != "response.create" && kind != "response.steer" {
            let error = ApiError::new(
                400,
                "invalid_request_error",
                format!("type: unsupported client event '{kind}'"),
            )
            .with_field("param", "type");
            return frames.refuse(error).await;
        }
        let mut body = event;
        if let Some(fields) = body.as_object_mut() {
            fields.remove("type");
            // Every turn here streams.
            fields.insert("stream".into(), json!(true));
        }
        let call = match upgraded.call_to("agents_responses_create", body.to_string().into_bytes())
        {
            Ok(call) => call,
            Err(error) => return frames.refuse(error).await,
        };
        let turn = match prepare_turn(&call).await {
            Ok((turn, _)) => turn,
            Err(error) => return frames.refuse(error).await,
        };
        match begin(&call, turn).await {
            Ok(Begun::Running(run)) => run.stream(frames).await,
            Ok(Begun::Installing(installing)) => {
                let (turn, watch) = *installing;
                stream_after_install(&call, turn, watch, frames).await
            }
            Err(error) => frames.refuse(error).await,
        }
    }

    /// The socket as a turn's sink, keeping what the client sends meanwhile.
    struct Frames {
        socket: WebSocket,
        /// Messages that arrived while a turn was sending.
        held: VecDeque<Received>,
        closed: bool,
    }

    impl Frames {
        /// The next message: one held, or the next to arrive; `None` once the
        /// connection is gone.
        async fn next(&mut self) -> Option<Received> {
            if let Some(message) = self.held.pop_front() {
                return Some(message);
            }
            // What the socket already holds first: frames that came in one read wait
            // inside the WebSocket, where a readiness wait would not see them.
            loop {
                match self.socket.try_receive() {
                    Ok(Some(message)) => return Some(message),
                    Ok(None) => {}
                    Err(_) => return None,
                }
                // A ping read above is answered now, not with the next turn's events.
                if self.socket.send_queued().is_err() || self.socket.readable().await.is_err() {
                    return None;
                }
            }
        }

        /// An `error` event with an OpenAI error object.
        async fn error(&mut self, error: Value) {
            let message = json!({"type": "error", "error": error}).to_string();
            if self.socket.send_text(message).await.is_err() {
                self.closed = true;
            }
        }

        async fn refuse(&mut self, error: ApiError) {
            let body = error.body(ErrorStyle::OpenAi);
            self.error(body["error"].clone()).await
        }
    }

    impl Sink for Frames {
        async fn send(&mut self, event: Event) -> Result<(), Gone> {
            let sent = self.socket.send_text(event.data.to_string()).await;
            sent.map_err(|_| {
                self.closed = true;
                Gone
            })
        }

        async fn gone(&mut self) {
            loop {
                match self.socket.try_receive() {
                    Ok(Some(Received::Closed)) | Err(_) => {
                        self.closed = true;
                        return;
                    }
                    Ok(Some(message)) => self.held.push_back(message),
                    Ok(None) => {}
                }
                // A ping during a quiet turn is answered now (cancel-safe: no await).
                if self.socket.send_queued().is_err() || self.socket.readable().await.is_err() {
                    self.closed = true;
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::compressed_counts;

    #[test]
    fn qwen_compression_counts() {
        assert_eq!(
            compressed_counts("Context compressed (22745 -> ~12895)."),
            Some((22745, 12895))
        );
        assert_eq!(
            compressed_counts("Note. Context compressed (~10 -> 4)."),
            Some((10, 4))
        );
        assert_eq!(compressed_counts("Compression was not beneficial."), None);
    }
}
