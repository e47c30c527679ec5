//! The contract's vocabulary: capability groups, methods, parameters, how an endpoint
//! takes its body and words its errors, and the one error type. Everything above reads
//! these types; this module imports nothing else of the crate, so the route table,
//! `/capabilities`, the policy engine and the OpenAPI document can all be built from the
//! same declarations without depending on the engine or on any domain code.

pub mod errno;
mod error;
pub mod fields;

use serde_json::{Map, Value};

pub use error::{ApiError, ErrorStyle};
pub use fields::{Args, Param, ParamIn, UnknownFields};

/// The HTTP methods the contract's dispatcher serves; anything else is 405.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Get,
    Post,
    Delete,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        }
    }

    /// Parses a request line's method; `None` for the methods the contract does not serve.
    pub fn from_http(method: &str) -> Option<Method> {
        match method {
            "GET" => Some(Method::Get),
            "POST" => Some(Method::Post),
            "DELETE" => Some(Method::Delete),
            _ => None,
        }
    }

    /// Whether the contract reads a JSON object body for this method.
    pub fn takes_json_body(self) -> bool {
        matches!(self, Method::Post | Method::Delete)
    }
}

/// Capability groups: names for sets of endpoint ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    Core,
    Commands,
    FileOps,
    Process,
    Terminal,
    System,
    DevTools,
    Browser,
    Agents,
    Mcp,
    K8sRuntime,
    Envd,
}

impl Group {
    /// Every group, in the order `/capabilities` lists them.
    pub const ALL: [Group; 12] = [
        Group::Core,
        Group::Commands,
        Group::FileOps,
        Group::Process,
        Group::Terminal,
        Group::System,
        Group::DevTools,
        Group::Browser,
        Group::Agents,
        Group::Mcp,
        Group::K8sRuntime,
        Group::Envd,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Group::Core => "core",
            Group::Commands => "commands",
            Group::FileOps => "file_ops",
            Group::Process => "process",
            Group::Terminal => "terminal",
            Group::System => "system",
            Group::DevTools => "dev_tools",
            Group::Browser => "browser",
            Group::Agents => "agents",
            Group::Mcp => "mcp",
            Group::K8sRuntime => "k8s_runtime",
            Group::Envd => "envd",
        }
    }

    pub fn parse(name: &str) -> Option<Group> {
        Group::ALL.into_iter().find(|g| g.name() == name)
    }

    /// Groups that stay off until enabled.
    pub fn opt_in(self) -> bool {
        matches!(
            self,
            Group::DevTools | Group::Browser | Group::Agents | Group::K8sRuntime | Group::Envd
        )
    }
}

/// How an endpoint takes its request body. The dispatcher plans the body from this
/// before the handler runs, so a refused request never has its body read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyMode {
    /// A JSON object (POST/DELETE), syntax-checked by the dispatcher; an empty body is
    /// `{}`. GET endpoints take no body.
    Json,
    /// A JSON object the handler deserialises whole itself: the dispatcher checks only
    /// that it starts like an object (saves a second pass over a 10 MiB upload).
    WholeJson,
    /// A JSON object streamed into the sink the endpoint opens as it arrives, so a large
    /// body is never held whole; the sink checks its syntax.
    StreamedJson,
    /// `StreamedJson`, or with `Content-Type: application/octet-stream` a raw body
    /// streamed into a second sink, up to `ABX_MAX_UPLOAD_SIZE`.
    RawOrStreamedJson,
    /// A WebSocket upgrade (listed in `/capabilities` with method `WS`).
    Upgrade,
    /// A JSON-RPC message: an object, or an array (a batch), syntax-checked by the
    /// dispatcher like `Json`.
    JsonRpc,
    /// A `multipart/form-data` body streamed into the sink the endpoint opens, up to
    /// `ABX_MAX_UPLOAD_SIZE` (plus the framing).
    Multipart,
    /// `WholeJson`, or a whole `multipart/form-data` body (the JSON limit plus the
    /// framing) the handler reads itself: an SDK's file upload.
    JsonOrMultipart,
    /// A body the handler decodes itself (a Connect message, JSON or protobuf), up to
    /// the JSON limit; the dispatcher checks nothing in it.
    Opaque,
}

/// Which listening port serves an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Listener {
    /// The HTTP API (`ABX_SERVER_PORT`, default 9000).
    Api,
    /// The PTY WebSocket (`ABX_PTY_PORT`, default 9001).
    Pty,
    /// kubernetes-sigs/agent-sandbox's runtime contract (`ABX_K8S_RUNTIME_PORT`,
    /// default 8888).
    K8sRuntime,
    /// E2B's envd protocol (`ABX_ENVD_PORT`, default 49983).
    Envd,
}

/// A JSON Schema, built on demand.
pub type Schema = fn() -> Value;

/// A declaration's text: borrowed from the binary for the built-in table (which is
/// built at every start, and copying its strings was most of its allocations), owned
/// for routes declared at run time (the Python bridge's, an embedding program's).
pub type Text = std::borrow::Cow<'static, str>;

/// Everything the table says about one endpoint except how it is served: what
/// `/capabilities`, the policy engine and the router read.
#[derive(Clone, Debug)]
pub struct EndpointSpec {
    pub id: Text,
    /// Former ids a policy document may still name (each named one is a startup
    /// warning): the ids this server used before it took the reference server's.
    pub aliases: Vec<Text>,
    pub method: Method,
    /// Path pattern with `{name}` segments.
    pub path: Text,
    pub group: Group,
    pub summary: Text,
    pub auth_required: bool,
    pub streaming: bool,
    /// Scopes the caller needs besides a valid credential.
    pub scopes: Vec<Text>,
    pub params: Vec<Param>,
    pub limits: Map<String, Value>,
    pub body: BodyMode,
    pub errors: ErrorStyle,
    pub listener: Listener,
    /// JSON Schema of the success body (the OpenAPI document's 200), when declared:
    /// built when the OpenAPI document is, not at start (building every endpoint's
    /// schema was a fifth of the route table's start).
    pub returns: Option<Schema>,
    /// Statuses this endpoint answers besides 200 and the ones every endpoint may
    /// (see [`EndpointSpec::statuses`]).
    pub also_answers: Vec<u16>,
    /// JSON Schema of the body the handler's own refusals (`also_answers` statuses of
    /// 400 and above) carry, when it is not the endpoint's error envelope: MCP's
    /// transport answers JSON-RPC error objects.
    pub own_refusals: Option<Schema>,
    /// The engine watches the caller's socket while the handler runs, and a caller
    /// that hangs up drops the handler (what it holds is freed at once).
    pub watch_peer: bool,
    /// envd's signed file URLs: a request with `signature` (and no credentials) is
    /// admitted as the identity whose token signed its `path`, this operation (`read`
    /// or `write`) and `username`.
    pub signed_urls: Option<&'static str>,
    /// What a body field no param declares gets: ignored, or refused.
    pub unknown_fields: UnknownFields,
    /// Headers every answer of the endpoint carries, its refusals included.
    pub headers: Vec<(&'static str, &'static str)>,
    /// The endpoint-level policy knobs (`endpoints.<id>.<knob>`) its handler applies;
    /// a knob set on an endpoint that does not apply it is a published warning.
    pub enforces: Vec<&'static str>,
    /// What the endpoint does to the sandbox, for the `read-only` preset.
    pub effect: Effect,
    /// Whether the `locked-down` preset leaves it on.
    pub kept_locked_down: bool,
    /// This server's own: the reference server has no such endpoint (`/capabilities`
    /// says `"extension": true`).
    pub extension: bool,
}

/// What an endpoint does to the sandbox, as the presets see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Reads only: on under `read-only`.
    Reads,
    /// Writes a file, starts a program, changes the environment or navigates: off under
    /// `read-only`.
    Changes,
}

impl EndpointSpec {
    /// A spec with the contract's defaults: auth required, not streaming, no scopes,
    /// params or limits, a JSON body, the contract's error envelope. The id defaults to
    /// `"METHOD /path"`, as custom routes are named.
    pub fn new(method: Method, path: impl Into<Text>, group: Group) -> EndpointSpec {
        let path = path.into();
        EndpointSpec {
            id: Text::Owned(format!("{} {}", method.as_str(), path)),
            aliases: Vec::new(),
            method,
            path,
            group,
            summary: Text::Borrowed(""),
            auth_required: true,
            streaming: false,
            scopes: Vec::new(),
            params: Vec::new(),
            limits: Map::new(),
            body: BodyMode::Json,
            errors: ErrorStyle::Contract,
            listener: Listener::Api,
            returns: None,
            also_answers: Vec::new(),
            own_refusals: None,
            watch_peer: false,
            signed_urls: None,
            unknown_fields: UnknownFields::Ignore,
            headers: Vec::new(),
            enforces: Vec::new(),
            // A route that takes a body is taken to change something unless declared
            // otherwise, so a custom POST is off under `read-only`.
            effect: match method {
                Method::Get => Effect::Reads,
                _ => Effect::Changes,
            },
            kept_locked_down: false,
            extension: false,
        }
    }

    /// Every status this endpoint can answer: 200, the dispatcher's refusals that apply
    /// to it, and its own.
    pub fn statuses(&self) -> Vec<u16> {
        let mut statuses = vec![200, 400, 404, 500];
        if self.auth_required {
            statuses.push(401);
        }
        if !self.scopes.is_empty() || self.group != Group::Core {
            statuses.push(403);
        }
        if self.method.takes_json_body() || self.body != BodyMode::Json {
            statuses.push(413);
        }
        statuses.extend(&self.also_answers);
        statuses.sort_unstable();
        statuses.dedup();
        statuses
    }

    /// The method as `/capabilities` shows it: `WS` for a WebSocket.
    pub fn method_name(&self) -> &'static str {
        match self.body {
            BodyMode::Upgrade => "WS",
            _ => self.method.as_str(),
        }
    }

    /// The `params` object of `/capabilities`.
    pub fn params_json(&self) -> Value {
        let mut map = Map::new();
        for p in &self.params {
            map.insert(p.name.to_string(), p.capability());
        }
        Value::Object(map)
    }
}
