//! One declaration per endpoint: its [`EndpointSpec`] (what `/capabilities`, the policy
//! engine and the router read) plus how it is served. Handlers are plain async functions
//! from a call to `Result<Response, ApiError>`.
//!
//! The declaration is generic over what a handler receives (`C`, the app's
//! [`super::state::Call`]; `U`, its [`super::state::Upgraded`]): those carry the app's
//! state, and the state holds the route table, so naming them here would tie this
//! module and the state into a cycle. `super::state` names the concrete types
//! (`Endpoint`, `Handler`, ...).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::api::{
    ApiError, BodyMode, EndpointSpec, Group, Listener, Method, Param, Text, UnknownFields,
};
use crate::http::{LocalFuture, Response};
use serde_json::Value;

/// The future a handler returns. Handlers run on one worker thread, so it need not be
/// `Send`.
pub type HandlerFuture<T> = Pin<Box<dyn Future<Output = Result<T, ApiError>>>>;

/// A handler: a plain async function from the call (`C`, [`super::state::Call`]) to
/// its answer.
pub type Handler<C> = Arc<dyn Fn(C) -> HandlerFuture<Response> + Send + Sync>;

/// Receives a raw request body (an `application/octet-stream` upload) piece by piece.
pub trait RawSink {
    /// Takes one piece and returns the buffer for reuse.
    fn write(&mut self, piece: Vec<u8>) -> LocalFuture<'_, Result<Vec<u8>, ApiError>>;
    /// The body arrived whole: commit it and produce the answer.
    fn finish(self: Box<Self>) -> HandlerFuture<Response>;
    /// The body did not arrive whole: undo.
    fn abort(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()>>>;
    /// The most bytes one piece should carry (the engine's default: 256 KiB).
    fn piece_size(&self) -> usize {
        crate::http::service::STREAM_CHUNK
    }
}

/// Opens the sink a raw body streams into (after the dispatcher accepted the request).
pub type SinkHandler<C> = Arc<dyn Fn(C) -> HandlerFuture<Box<dyn RawSink>> + Send + Sync>;

/// Serves a WebSocket endpoint: takes the upgraded socket (and bytes the client sent
/// after its handshake).
pub type UpgradeHandler<U> = Arc<
    dyn Fn(U, monoio::net::TcpStream, Vec<u8>) -> crate::http::LocalFuture<'static, ()>
        + Send
        + Sync,
>;

/// How an endpoint is served.
pub enum Serve<C, U> {
    /// A WebSocket on the PTY port.
    Upgrade(UpgradeHandler<U>),
    /// By a handler (with the JSON body, or none for GET).
    Handler(Handler<C>),
    /// The body streams into a sink as it arrives: a JSON body into the one `json`
    /// opens, a raw `application/octet-stream` body (when `raw` is set) into the one
    /// `raw` opens.
    Sinks {
        json: SinkHandler<C>,
        raw: Option<SinkHandler<C>>,
    },
    /// Declared but not part of this build, with the reason: listed in `/capabilities`
    /// as disabled (rule `build:unavailable`), whatever the policy says.
    Unavailable(&'static str),
}

/// One endpoint of the table: the spec and how it is served.
pub struct Endpoint<C, U> {
    /// Boxed: the table is built at every start and each builder step moves the
    /// endpoint, so it stays a few words (the spec alone is over 300 bytes).
    pub spec: Box<EndpointSpec>,
    pub serve: Serve<C, U>,
    /// A WebSocket the same route opens on the API port when the request asks for the
    /// upgrade (after the same admission); other requests reach `serve`.
    pub upgrade: Option<UpgradeHandler<U>>,
}

// By hand: a derive would ask `C: Clone` and `U: Clone`, which the shared handlers do
// not need.
impl<C, U> Clone for Endpoint<C, U> {
    fn clone(&self) -> Self {
        Self {
            spec: self.spec.clone(),
            serve: self.serve.clone(),
            upgrade: self.upgrade.clone(),
        }
    }
}

impl<C, U> Clone for Serve<C, U> {
    fn clone(&self) -> Self {
        match self {
            Serve::Upgrade(h) => Serve::Upgrade(h.clone()),
            Serve::Handler(h) => Serve::Handler(h.clone()),
            Serve::Sinks { json, raw } => Serve::Sinks {
                json: json.clone(),
                raw: raw.clone(),
            },
            Serve::Unavailable(reason) => Serve::Unavailable(reason),
        }
    }
}

impl<C, U> Endpoint<C, U> {
    /// A new endpoint with the contract's defaults: auth required, not streaming, no
    /// scopes, params or limits, a JSON body. The id defaults to `"METHOD /path"`
    /// (custom routes).
    pub fn new(method: Method, path: impl Into<Text>, group: Group, handler: Handler<C>) -> Self {
        Self {
            spec: Box::new(EndpointSpec::new(method, path, group)),
            serve: Serve::Handler(handler),
            upgrade: None,
        }
    }

    /// An endpoint the table declares (its id, method, path and group are known to
    /// policies, `/capabilities` and `/capabilities/check`) that this build does not
    /// serve: always off with rule `build:unavailable`, and a request for it is 404
    /// `endpoint_disabled` saying `reason`.
    pub fn not_served(
        method: Method,
        path: impl Into<Text>,
        group: Group,
        reason: &'static str,
    ) -> Self {
        Self {
            spec: Box::new(EndpointSpec::new(method, path, group)),
            serve: Serve::Unavailable(reason),
            upgrade: None,
        }
    }

    /// A WebSocket endpoint on the PTY port.
    pub fn websocket(path: impl Into<Text>, group: Group, handler: UpgradeHandler<U>) -> Self {
        let mut spec = EndpointSpec::new(Method::Get, path, group);
        spec.body = BodyMode::Upgrade;
        spec.listener = Listener::Pty;
        Self {
            spec: Box::new(spec),
            serve: Serve::Upgrade(handler),
            upgrade: None,
        }
    }

    /// A request that asks for a WebSocket upgrade (`Upgrade: websocket`) is admitted as
    /// any other, then answered `101` and handed to `handler` on the API port.
    pub fn also_upgrades(mut self, handler: UpgradeHandler<U>) -> Self {
        self.upgrade = Some(handler);
        self
    }

    /// The body is a JSON-RPC message or batch (see [`BodyMode::JsonRpc`]).
    pub fn json_rpc(mut self) -> Self {
        self.spec.body = BodyMode::JsonRpc;
        self
    }

    /// The body is `multipart/form-data`, streamed into the sink (see
    /// [`BodyMode::Multipart`]); for [`Endpoint::streamed`] ones.
    pub fn multipart(mut self) -> Self {
        self.spec.body = BodyMode::Multipart;
        self
    }

    /// The handler reads the whole body itself, JSON or multipart (see
    /// [`BodyMode::JsonOrMultipart`]).
    pub fn json_or_multipart(mut self) -> Self {
        self.spec.body = BodyMode::JsonOrMultipart;
        self
    }

    /// The handler deserialises the entire JSON body itself (see [`BodyMode::WholeJson`]).
    pub fn whole_json(mut self) -> Self {
        self.spec.body = BodyMode::WholeJson;
        self
    }

    /// Admits envd's signed URLs for `operation` (see [`crate::api::EndpointSpec::signed_urls`]).
    pub fn signed_urls(mut self, operation: &'static str) -> Self {
        self.spec.signed_urls = Some(operation);
        self
    }

    /// The handler decodes the body itself (see [`BodyMode::Opaque`]).
    pub fn opaque_body(mut self) -> Self {
        self.spec.body = BodyMode::Opaque;
        self
    }

    /// An endpoint whose JSON body streams into the sink `json` opens (see
    /// [`BodyMode::StreamedJson`]).
    pub fn streamed(
        method: Method,
        path: impl Into<Text>,
        group: Group,
        json: SinkHandler<C>,
    ) -> Self {
        let mut spec = EndpointSpec::new(method, path, group);
        spec.body = BodyMode::StreamedJson;
        Self {
            spec: Box::new(spec),
            serve: Serve::Sinks { json, raw: None },
            upgrade: None,
        }
    }

    /// Also accepts a raw `application/octet-stream` body, streamed into the sink `raw`
    /// opens (see [`BodyMode::RawOrStreamedJson`]); for [`Endpoint::streamed`] ones.
    pub fn raw_body(mut self, raw: SinkHandler<C>) -> Self {
        if let Serve::Sinks { json, .. } = self.serve {
            self.serve = Serve::Sinks {
                json,
                raw: Some(raw),
            };
            self.spec.body = BodyMode::RawOrStreamedJson;
        }
        self
    }

    pub fn id(mut self, id: impl Into<Text>) -> Self {
        self.spec.id = id.into();
        self
    }
    /// An id this endpoint had before it took the reference server's, which policy
    /// documents may still name.
    pub fn formerly(mut self, id: impl Into<Text>) -> Self {
        self.spec.aliases.push(id.into());
        self
    }
    /// Gives the endpoint the id `id`, keeping its current one as a former id that
    /// policy documents may still name.
    pub fn renamed(mut self, id: impl Into<Text>) -> Self {
        let id = id.into();
        let old = std::mem::replace(&mut self.spec.id, id);
        if old != self.spec.id {
            self.spec.aliases.push(old);
        }
        self
    }
    pub fn summary(mut self, summary: impl Into<Text>) -> Self {
        self.spec.summary = summary.into();
        self
    }
    pub fn auth_required(mut self, required: bool) -> Self {
        self.spec.auth_required = required;
        self
    }
    pub fn streaming(mut self, streaming: bool) -> Self {
        self.spec.streaming = streaming;
        self
    }
    /// The error envelope the endpoint answers in (OpenAI's under `/v1`).
    pub fn errors(mut self, style: crate::api::ErrorStyle) -> Self {
        self.spec.errors = style;
        self
    }
    pub fn scopes<S: Clone + Into<Text>>(mut self, scopes: &[S]) -> Self {
        self.spec.scopes = scopes.iter().cloned().map(Into::into).collect();
        self
    }
    pub fn params(mut self, params: &[Param]) -> Self {
        self.spec.params = params.to_vec();
        self
    }
    /// A header every answer carries, refusals included.
    pub fn header(mut self, name: &'static str, value: &'static str) -> Self {
        self.spec.headers.push((name, value));
        self
    }
    /// The endpoint-level policy knobs its handler applies.
    pub fn enforces(mut self, knobs: &[&'static str]) -> Self {
        self.spec.enforces.extend_from_slice(knobs);
        self
    }
    /// It writes, runs or navigates though it is a GET: off under `read-only`.
    pub fn changes(mut self) -> Self {
        self.spec.effect = crate::api::Effect::Changes;
        self
    }
    /// It takes a body yet only reads: on under `read-only`.
    pub fn only_reads(mut self) -> Self {
        self.spec.effect = crate::api::Effect::Reads;
        self
    }
    /// This server's own endpoint, which the reference server does not have.
    pub fn extension(mut self) -> Self {
        self.spec.extension = true;
        self
    }
    /// `locked-down` leaves it on.
    pub fn kept_locked_down(mut self) -> Self {
        self.spec.kept_locked_down = true;
        self
    }
    /// Body fields no param declares are refused (400 `unsupported_parameter`).
    pub fn refuse_unknown_fields(mut self) -> Self {
        self.spec.unknown_fields = UnknownFields::Refuse;
        self
    }
    /// The JSON Schema of the success body, for the OpenAPI document.
    pub fn returns(mut self, schema: crate::api::Schema) -> Self {
        self.spec.returns = Some(schema);
        self
    }
    /// Statuses this endpoint answers besides 200 and the dispatcher's refusals.
    pub fn also_answers(mut self, statuses: &[u16]) -> Self {
        self.spec.also_answers.extend_from_slice(statuses);
        self
    }

    /// The schema of the body its own refusals carry (see [`EndpointSpec::own_refusals`]).
    pub fn own_refusals(mut self, schema: crate::api::Schema) -> Self {
        self.spec.own_refusals = Some(schema);
        self
    }

    /// A caller that hangs up drops the handler (see [`EndpointSpec::watch_peer`]).
    pub fn watch_peer(mut self) -> Self {
        self.spec.watch_peer = true;
        self
    }
    pub fn limit(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.spec.limits.insert(name.to_string(), value.into());
        self
    }

    /// The reason this build does not serve the endpoint, if it does not.
    pub fn unavailable(&self) -> Option<&'static str> {
        match self.serve {
            Serve::Unavailable(reason) => Some(reason),
            _ => None,
        }
    }
}
