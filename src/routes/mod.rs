//! The route table: one declaration per endpoint drives dispatch, `/capabilities`, the
//! policy engine and the OpenAPI-style parameter listing. Adding an endpoint means adding
//! one [`Endpoint`] to [`builtin_endpoints`].

pub mod core;
pub mod files;
mod router;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::http::{Request, Response};

pub use router::{RouteMatch, Router};

/// The methods the dispatcher serves. `Ws` marks the PTY WebSocket, listed in the table
/// but served on its own port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Get,
    Post,
    Delete,
    Ws,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Delete => "DELETE",
            Method::Ws => "WS",
        }
    }

    /// The HTTP methods the dispatcher accepts; anything else is 405.
    pub fn from_http(method: &str) -> Option<Method> {
        match method {
            "GET" => Some(Method::Get),
            "POST" => Some(Method::Post),
            "DELETE" => Some(Method::Delete),
            _ => None,
        }
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
}

impl Group {
    /// Every group, in the order `/capabilities` lists them.
    pub const ALL: [Group; 9] = [
        Group::Core,
        Group::Commands,
        Group::FileOps,
        Group::Process,
        Group::Terminal,
        Group::System,
        Group::DevTools,
        Group::Browser,
        Group::Agents,
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
        }
    }

    pub fn parse(name: &str) -> Option<Group> {
        Group::ALL.into_iter().find(|g| g.name() == name)
    }

    /// Groups that stay off until enabled.
    pub fn opt_in(self) -> bool {
        matches!(self, Group::DevTools | Group::Browser | Group::Agents)
    }
}

/// Where a parameter travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamIn {
    Query,
    Body,
    Path,
}

/// One parameter of an endpoint, as `/capabilities` describes it.
#[derive(Clone, Debug)]
pub struct Param {
    pub name: &'static str,
    pub location: ParamIn,
    /// JSON type name: string, integer, number, boolean, object, array.
    pub kind: &'static str,
    pub required: bool,
}

impl Param {
    pub const fn query(name: &'static str, kind: &'static str, required: bool) -> Param {
        Param {
            name,
            location: ParamIn::Query,
            kind,
            required,
        }
    }
    pub const fn body(name: &'static str, kind: &'static str, required: bool) -> Param {
        Param {
            name,
            location: ParamIn::Body,
            kind,
            required,
        }
    }
    pub const fn path(name: &'static str) -> Param {
        Param {
            name,
            location: ParamIn::Path,
            kind: "string",
            required: true,
        }
    }
}

/// The future a handler returns. Handlers run on one worker thread, so it need not be
/// `Send`.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Response, ApiError>>>>;

/// A handler: a plain function from request to `Result<Response, ApiError>`.
pub type Handler = Arc<dyn Fn(Request) -> HandlerFuture + Send + Sync>;

/// Wraps an async function as a [`Handler`].
pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(Request) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Response, ApiError>> + 'static,
{
    Arc::new(move |request| Box::pin(f(request)))
}

/// One endpoint of the table.
#[derive(Clone)]
pub struct Endpoint {
    pub id: Arc<str>,
    pub method: Method,
    /// Path pattern with `{name}` segments.
    pub path: String,
    pub group: Group,
    pub summary: String,
    pub auth_required: bool,
    pub streaming: bool,
    /// Scopes the caller needs besides a valid credential.
    pub scopes: Vec<String>,
    pub params: Vec<Param>,
    pub limits: Map<String, Value>,
    /// `None` only for endpoints served elsewhere (the WebSocket).
    pub handler: Option<Handler>,
    /// The handler deserialises the entire JSON body itself, so the dispatcher checks
    /// only that it is an object (saves a second pass over large uploads).
    pub parses_whole_body: bool,
    /// With `Content-Type: application/octet-stream` the body is not read by the
    /// dispatcher: the handler answers with a body sink (`Response::accept_body`) and the
    /// connection streams the body into it, up to `ABX_MAX_UPLOAD_SIZE`.
    pub raw_body: bool,
    /// Declared but not served by this build, with the reason: listed in
    /// `/capabilities` as disabled (rule `build:unavailable`), whatever the policy says.
    pub unavailable: Option<&'static str>,
}

impl Endpoint {
    /// A new endpoint with the contract's defaults: auth required, not streaming, no
    /// scopes, params or limits. The id defaults to `"METHOD /path"` (custom routes).
    pub fn new(method: Method, path: &str, group: Group, handler: Handler) -> Endpoint {
        Endpoint {
            id: format!("{} {}", method.as_str(), path).into(),
            method,
            path: path.to_string(),
            group,
            summary: String::new(),
            auth_required: true,
            streaming: false,
            scopes: Vec::new(),
            params: Vec::new(),
            limits: Map::new(),
            handler: Some(handler),
            parses_whole_body: false,
            raw_body: false,
            unavailable: None,
        }
    }

    /// An endpoint served elsewhere than the HTTP dispatcher (the PTY WebSocket).
    pub fn external(method: Method, path: &str, group: Group) -> Endpoint {
        Endpoint {
            handler: None,
            ..Endpoint::new(
                method,
                path,
                group,
                handler(|_| async { Err(ApiError::internal("RuntimeError", "not an HTTP route")) }),
            )
        }
    }

    pub fn unavailable(mut self, reason: &'static str) -> Self {
        self.unavailable = Some(reason);
        self
    }

    pub fn parses_whole_body(mut self) -> Self {
        self.parses_whole_body = true;
        self
    }
    pub fn raw_body(mut self) -> Self {
        self.raw_body = true;
        self
    }

    pub fn id(mut self, id: &str) -> Self {
        self.id = id.into();
        self
    }
    pub fn summary(mut self, summary: &str) -> Self {
        self.summary = summary.to_string();
        self
    }
    pub fn auth_required(mut self, required: bool) -> Self {
        self.auth_required = required;
        self
    }
    pub fn streaming(mut self, streaming: bool) -> Self {
        self.streaming = streaming;
        self
    }
    pub fn scopes(mut self, scopes: &[&str]) -> Self {
        self.scopes = scopes.iter().map(|s| s.to_string()).collect();
        self
    }
    pub fn params(mut self, params: &[Param]) -> Self {
        self.params = params.to_vec();
        self
    }
    pub fn limit(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.limits.insert(name.to_string(), value.into());
        self
    }

    /// The `params` object of `/capabilities`.
    pub fn params_json(&self) -> Value {
        let mut map = Map::new();
        for p in &self.params {
            let location = match p.location {
                ParamIn::Query => "query",
                ParamIn::Body => "body",
                ParamIn::Path => "path",
            };
            map.insert(
                p.name.to_string(),
                serde_json::json!({"in": location, "type": p.kind, "required": p.required}),
            );
        }
        Value::Object(map)
    }
}

/// Every built-in endpoint, in the order `/capabilities` lists them.
pub fn builtin_endpoints() -> Vec<Endpoint> {
    let mut endpoints = Vec::new();
    endpoints.extend(core::endpoints());
    endpoints.extend(files::endpoints());
    // The terminal's WebSocket (port ABX_PTY_PORT), listed as the contract lists it.
    endpoints.push(
        Endpoint::external(Method::Ws, "/pty", Group::Terminal)
            .id("pty_connect")
            .summary("PTY WebSocket on ABX_PTY_PORT (input, resize, signal; output and events).")
            .params(&[Param::query("session_id", "string", true), Param::query("token", "string", false)])
            .unavailable("the terminal group (PTY sessions and their WebSocket) is not part of this build of agent-sandbox"),
    );
    endpoints
}
