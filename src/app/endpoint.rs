//! One declaration per endpoint: its [`EndpointSpec`] (what `/capabilities`, the policy
//! engine and the router read) plus how it is served. Handlers are plain async functions
//! from a [`Call`] to `Result<Response, ApiError>`.
//!
//! The handler types live here, one layer above the vocabulary, because a [`Call`]
//! carries the services handlers use (the confinement object, the I/O driver, the child
//! registry), which belong to the domain layer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::auth::Identity;
use super::policy::Decision;
use super::state::{Catalog, Services};
use crate::api::{
    ApiError, Args, BodyMode, EndpointSpec, ErrorStyle, Group, Listener, Method, Param,
    UnknownFields,
};
use crate::http::{LocalFuture, Response};

/// What a handler receives: the request, the caller, its endpoint's spec and policy
/// decision, and the services it may use.
pub struct Call {
    pub method: Method,
    /// The path with the query removed and a trailing slash stripped (`/health/` is
    /// `/health`), not percent-decoded, as the contract matches it.
    pub path: String,
    pub(crate) query: Vec<(String, String)>,
    /// Header names in lower case, in arrival order.
    pub(crate) headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub(crate) path_params: Vec<(String, String)>,
    pub identity: Arc<Identity>,
    pub(crate) endpoint: usize,
    pub(crate) state: Arc<super::state::AppState>,
    /// The catalog generation the request was admitted under: it keeps it to the end,
    /// whatever a policy reload does meanwhile.
    pub(crate) catalog: super::state::CatalogRef,
}

impl Call {
    /// The single value of query parameter `name`. Blank values count as absent, as with
    /// Python's `parse_qs`; repeats were refused before the handler ran.
    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// A `{param}` segment of the route path, percent-decoded.
    pub fn path_param(&self, name: &str) -> Option<&str> {
        self.path_params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The endpoint being served.
    pub fn spec(&self) -> &EndpointSpec {
        &self.catalog.endpoints[self.endpoint].spec
    }

    /// The policy's decision for this endpoint.
    pub fn decision(&self) -> &Decision {
        &self.catalog.decisions[self.endpoint]
    }

    /// What handlers work with: confinement, the I/O driver, limits, children.
    pub fn services(&self) -> &Services {
        &self.state.services
    }

    /// The state of type `T` a group registered (see [`super::groups`]).
    pub fn group_state<T: Send + Sync + 'static>(&self) -> Result<&T, ApiError> {
        self.state.services.groups.require::<T>()
    }

    /// The server's settings.
    pub fn config(&self) -> &crate::config::Config {
        &self.state.config
    }

    /// The route table and its decisions, for the discovery routes.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The body as a JSON object deserialised into `T`; an empty body is `{}`. The
    /// dispatcher already refused bodies that are not a JSON object, so an error here is
    /// a field of the wrong type, reported as 400 with serde's description.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        parse_json(&self.body)
    }

    /// Like [`Call::json`], but `T` may borrow strings from the body, so a large base64
    /// field is not copied.
    pub fn json_borrowed<'a, T: Deserialize<'a>>(&'a self) -> Result<T, ApiError> {
        parse_json(&self.body)
    }

    /// The endpoint's declared fields, read from the query and the JSON body and checked
    /// against their declarations (see [`crate::api::fields`]); a refusal is worded in
    /// the endpoint's error style.
    pub fn args(&self) -> Result<Args, ApiError> {
        self.args_of(&self.spec().params)
    }

    /// [`Call::args`] for some of the endpoint's declared fields: for a handler that
    /// checks a field only after another check (a lookup, another field's path), as the
    /// contract orders its refusals, or that reads one field by a rule no declaration
    /// states (Python's `int()`).
    pub fn args_of(&self, params: &[Param]) -> Result<Args, ApiError> {
        let spec = self.spec();
        let body = match spec.method.takes_json_body() {
            true => Some(body_object(&self.body, spec.errors)?),
            false => None,
        };
        crate::api::fields::parse(params, spec.errors, spec.unknown_fields, &self.query, body)
    }

    /// The endpoint's declared fields named `names`, in declaration order (for
    /// [`Call::args_of`]).
    pub fn params_named(&self, names: &[&str]) -> Vec<Param> {
        self.spec()
            .params
            .iter()
            .filter(|p| names.contains(&p.name))
            .cloned()
            .collect()
    }

    /// Moves the body out, e.g. to parse it on the blocking pool.
    pub fn take_body(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.body)
    }
}

/// Parses a JSON object body (empty is `{}`), worded as the contract's 400s.
pub fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    let body: &[u8] = if is_blank(body) { b"{}" } else { body };
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => {
            ApiError::bad_request(format!("Invalid request body: {e}"))
        }
        _ => ApiError::bad_request(format!("Invalid JSON body: {e}")),
    })
}

/// The body as a JSON object (empty is `{}`), refused in `style`.
fn body_object(body: &[u8], style: ErrorStyle) -> Result<Map<String, Value>, ApiError> {
    match style {
        ErrorStyle::Contract => parse_json(body),
        ErrorStyle::OpenAi => {
            if is_blank(body) {
                return Ok(Map::new());
            }
            match serde_json::from_slice::<Value>(body) {
                Ok(Value::Object(map)) => Ok(map),
                Ok(_) => Err(crate::api::fields::refusal(
                    style,
                    "body",
                    "The request body must be a JSON object.".into(),
                )),
                Err(e) => Err(crate::api::fields::refusal(
                    style,
                    "body",
                    format!("The request body is not valid JSON: {e}"),
                )),
            }
        }
    }
}

/// Whether a body is empty for the contract's purposes (only whitespace).
pub fn is_blank(body: &[u8]) -> bool {
    body.iter().all(u8::is_ascii_whitespace)
}

/// The future a handler returns. Handlers run on one worker thread, so it need not be
/// `Send`.
pub type HandlerFuture<T> = Pin<Box<dyn Future<Output = Result<T, ApiError>>>>;

/// A handler: a plain async function from the call to its answer.
pub type Handler = Arc<dyn Fn(Call) -> HandlerFuture<Response> + Send + Sync>;

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
pub type SinkHandler = Arc<dyn Fn(Call) -> HandlerFuture<Box<dyn RawSink>> + Send + Sync>;

/// Wraps an async function as a [`Handler`].
pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(Call) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Response, ApiError>> + 'static,
{
    Arc::new(move |call| Box::pin(f(call)))
}

/// Wraps an async function that opens a raw-body sink as a [`SinkHandler`].
pub fn sink_handler<F, Fut>(f: F) -> SinkHandler
where
    F: Fn(Call) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Box<dyn RawSink>, ApiError>> + 'static,
{
    Arc::new(move |call| Box::pin(f(call)))
}

/// A WebSocket connection the dispatcher took over (it already answered `101`), with
/// the outcome of authentication and policy: a refused connection is closed by the
/// handler with the refusal's close code, since a WebSocket has no status to answer.
pub struct Upgraded {
    pub query: Vec<(String, String)>,
    pub admitted: Result<Arc<Identity>, Refusal>,
    /// What the client presented, to admit it again after a policy reload.
    pub(crate) credentials: super::auth::Credentials,
    /// The endpoint's index in the catalog (stable across reloads).
    pub(crate) endpoint: usize,
    pub(crate) state: Arc<super::state::AppState>,
}

impl Upgraded {
    /// The single value of query parameter `name`.
    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn services(&self) -> &Services {
        &self.state.services
    }

    /// The state of type `T` a group registered (see [`super::groups`]).
    pub fn group_state<T: Send + Sync + 'static>(&self) -> Result<&T, ApiError> {
        self.state.services.groups.require::<T>()
    }

    /// The endpoint's declared query fields, checked (see [`Call::args`]).
    pub fn args(&self) -> Result<Args, ApiError> {
        let catalog = self.state.catalog();
        let spec = &catalog.endpoints[self.endpoint].spec;
        crate::api::fields::parse(
            &spec.params,
            spec.errors,
            spec.unknown_fields,
            &self.query,
            None,
        )
    }

    /// The policy reloads seen so far; [`Upgraded::reloaded`] waits for the next.
    pub fn reload_version(&self) -> u64 {
        self.state.reloads().version()
    }

    /// Resolves once a policy reload happened after `seen` (from
    /// [`Upgraded::reload_version`]).
    pub async fn reloaded(&self, seen: u64) {
        self.state.reloads().changed(seen).await
    }

    /// Admits the connection again under the current policy: the same identity must
    /// still present valid credentials and still be allowed this endpoint. A revoked
    /// identity (or token) is a 4001 refusal; a disabled endpoint or a lost scope, 4003.
    pub fn readmit(&self) -> Result<Arc<Identity>, Refusal> {
        let catalog = self.state.catalog();
        let before = self.admitted.as_ref().map_err(Clone::clone)?;
        let required = catalog.endpoints[self.endpoint].spec.auth_required;
        let identity = match catalog.auth.identify(&self.credentials, required) {
            Ok(identity) if identity.id == before.id => identity,
            _ => {
                return Err(Refusal {
                    close_code: 4001,
                    reason: "unauthorized: the credentials were revoked".into(),
                })
            }
        };
        let access = catalog.access(self.endpoint, &identity);
        if !access.allowed {
            return Err(Refusal {
                close_code: 4003,
                reason: access.reason.unwrap_or_else(|| "endpoint disabled".into()),
            });
        }
        Ok(identity)
    }
}

/// Why a WebSocket is closed right after its handshake.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// 4001 for credentials, 4003 for policy (disabled, or a missing scope).
    pub close_code: u16,
    pub reason: String,
}

/// Serves a WebSocket endpoint: takes the upgraded socket (and bytes the client sent
/// after its handshake).
pub type UpgradeHandler = Arc<
    dyn Fn(Upgraded, monoio::net::TcpStream, Vec<u8>) -> crate::http::LocalFuture<'static, ()>
        + Send
        + Sync,
>;

/// How an endpoint is served.
#[derive(Clone)]
pub enum Serve {
    /// A WebSocket on the PTY port.
    Upgrade(UpgradeHandler),
    /// By a handler (with the JSON body, or none for GET).
    Handler(Handler),
    /// The body streams into a sink as it arrives: a JSON body into the one `json`
    /// opens, a raw `application/octet-stream` body (when `raw` is set) into the one
    /// `raw` opens.
    Sinks {
        json: SinkHandler,
        raw: Option<SinkHandler>,
    },
    /// Declared but not part of this build, with the reason: listed in `/capabilities`
    /// as disabled (rule `build:unavailable`), whatever the policy says.
    Unavailable(&'static str),
}

/// One endpoint of the table: the spec and how it is served.
#[derive(Clone)]
pub struct Endpoint {
    pub spec: EndpointSpec,
    pub serve: Serve,
}

impl Endpoint {
    /// A new endpoint with the contract's defaults: auth required, not streaming, no
    /// scopes, params or limits, a JSON body. The id defaults to `"METHOD /path"`
    /// (custom routes).
    pub fn new(method: Method, path: &str, group: Group, handler: Handler) -> Endpoint {
        Endpoint {
            spec: EndpointSpec::new(method, path, group),
            serve: Serve::Handler(handler),
        }
    }

    /// A WebSocket endpoint on the PTY port.
    pub fn websocket(path: &str, group: Group, handler: UpgradeHandler) -> Endpoint {
        let mut spec = EndpointSpec::new(Method::Get, path, group);
        spec.body = BodyMode::Upgrade;
        spec.listener = Listener::Pty;
        Endpoint {
            spec,
            serve: Serve::Upgrade(handler),
        }
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

    /// The handler deserialises the entire JSON body itself (see [`BodyMode::WholeJson`]).
    pub fn whole_json(mut self) -> Self {
        self.spec.body = BodyMode::WholeJson;
        self
    }

    /// An endpoint whose JSON body streams into the sink `json` opens (see
    /// [`BodyMode::StreamedJson`]).
    pub fn streamed(method: Method, path: &str, group: Group, json: SinkHandler) -> Endpoint {
        let mut spec = EndpointSpec::new(method, path, group);
        spec.body = BodyMode::StreamedJson;
        Endpoint {
            spec,
            serve: Serve::Sinks { json, raw: None },
        }
    }

    /// Also accepts a raw `application/octet-stream` body, streamed into the sink `raw`
    /// opens (see [`BodyMode::RawOrStreamedJson`]); for [`Endpoint::streamed`] ones.
    pub fn raw_body(mut self, raw: SinkHandler) -> Self {
        if let Serve::Sinks { json, .. } = self.serve {
            self.serve = Serve::Sinks {
                json,
                raw: Some(raw),
            };
            self.spec.body = BodyMode::RawOrStreamedJson;
        }
        self
    }

    pub fn id(mut self, id: &str) -> Self {
        self.spec.id = id.to_string();
        self
    }
    pub fn summary(mut self, summary: &str) -> Self {
        self.spec.summary = summary.to_string();
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
    pub fn scopes(mut self, scopes: &[&str]) -> Self {
        self.spec.scopes = scopes.iter().map(|s| s.to_string()).collect();
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
    pub fn returns(mut self, schema: Value) -> Self {
        self.spec.returns = Some(schema);
        self
    }
    /// Statuses this endpoint answers besides 200 and the dispatcher's refusals.
    pub fn also_answers(mut self, statuses: &[u16]) -> Self {
        self.spec.also_answers.extend_from_slice(statuses);
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
