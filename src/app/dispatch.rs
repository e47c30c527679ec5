//! The application's answer to each request, as named steps:
//! route → authenticate → authorize → body plan → invoke → decorate.
//! [`ApiService`] implements the engine's [`Service`]: the engine asks it what to do
//! with a head (`plan`) and hands it the body it asked for (`respond`). Every
//! [`ApiError`] becomes bytes in exactly one place, [`render`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::audit;
use super::auth::Identity;
use super::endpoint::RawSink;
use super::request::{split_target, validate_json_object};
use super::state::AppState;
use super::state::{Call, Handler, Refusal, Serve, Upgraded};
use crate::api::{ApiError, BodyMode, ErrorStyle, Listener, Method};
use crate::config::MAX_JSON_BODY;
use crate::http::conn::{describe_panic, CatchPanic};
use crate::http::{
    BodySink, LocalFuture, Plan, ProtocolError, RequestHead, Response, Service, Timeouts,
};
use crate::runtime::shutdown::{Drained, InFlight, Shutdown};

/// The HTTP API as one worker serves it.
pub struct ApiService {
    state: Arc<AppState>,
    shutdown: Arc<Shutdown>,
    listener: Listener,
    /// Requests made by the server itself for an identity (an automation's run, in
    /// process only): admitted as that identity as the policy has it now, with no
    /// credential. A socket's service never has one.
    acting_as: Option<String>,
}

/// A routed, authorised request waiting for its body.
pub struct Accepted {
    index: usize,
    method: Method,
    path: String,
    query: Vec<(String, String)>,
    path_params: Vec<(String, String)>,
    identity: Arc<Identity>,
    catalog: super::state::CatalogRef,
    /// The request's places under the endpoint's `max_concurrency` and `max_processes`,
    /// held until the answer (a streamed one to its end) is out.
    slots: Vec<Slot>,
}

impl ApiService {
    pub fn new(state: Arc<AppState>, shutdown: Arc<Shutdown>, listener: Listener) -> ApiService {
        ApiService {
            state,
            shutdown,
            listener,
            acting_as: None,
        }
    }

    /// The service of requests the server makes itself for identity `id` (see
    /// `acting_as`).
    pub(crate) fn acting_as(mut self, id: &str) -> ApiService {
        self.acting_as = Some(id.to_string());
        self
    }

    /// Route, authenticate and authorize; `Err` is the refusal to answer.
    fn admit(&self, head: &RequestHead) -> Result<Accepted, Response> {
        let catalog_ref = self.state.catalog();
        let catalog = &**catalog_ref;
        // route
        let Some(method) = Method::from_http(&head.method) else {
            let error = ApiError::new(
                405,
                "ValueError",
                format!(
                    "Method {} is not allowed; use GET, POST or DELETE",
                    head.method
                ),
            )
            .with_header("Allow", "GET, POST, DELETE");
            return Err(render(error, ErrorStyle::Contract).closing());
        };
        if !head.target.starts_with('/') {
            let error = ApiError::bad_request("Request target must be a path starting with /");
            return Err(render(error, ErrorStyle::Contract).closing());
        }
        let (path, query) = split_target(&head.target);
        let router = match self.listener {
            Listener::Api => Some(&catalog.router),
            Listener::K8sRuntime => Some(&catalog.k8s_router),
            Listener::Envd => Some(&catalog.envd_router),
            Listener::Pty => None,
        };
        let found = match router.and_then(|r| r.lookup(method, &path)) {
            Some(found) => found,
            // envd's port answers in envd's words, and says why a route of E2B's envd
            // (its VM-level ones: /freeze, /fsfreeze, ...) is not here.
            None if self.listener == Listener::Envd => {
                let error = ApiError::new(
                    404,
                    "ValueError",
                    format!(
                        "Not found: {path}. This port serves envd's process.Process and filesystem.Filesystem RPCs, /files, /health, /metrics, /envs and /init; the sandbox is a container, so envd's VM-level routes are not served"
                    ),
                );
                return Err(render(error, ErrorStyle::Envd));
            }
            None => {
                return Err(render(
                    ApiError::not_found_path(&path),
                    ErrorStyle::Contract,
                ))
            }
        };
        let endpoint = &catalog.endpoints[found.index];
        let style = endpoint.spec.errors;
        // origin: a page of another site may drive nothing (GET routes run programs too:
        // git, pip)
        if let Some(error) = cross_origin_refusal(head, &catalog.policy.allow_origins) {
            let error = error.with_field("endpoint", endpoint.spec.id.clone());
            return Err(self.decorate(found.index, render(error, style)));
        }
        // authenticate
        let signed = endpoint.spec.signed_urls.and_then(|operation| {
            let pairs = query.as_ref().ok()?;
            let value = |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.as_str())
            };
            let signature = value("signature")?;
            let signed = format!(
                "{}:{operation}:{}",
                value("path").unwrap_or(""),
                value("username").unwrap_or("")
            );
            Some((signed, value("signature_expiration"), signature))
        });
        let identity = match (&self.acting_as, signed) {
            (Some(id), _) => catalog.auth.named(id).ok_or_else(|| {
                ApiError::new(
                    401,
                    "AuthError",
                    format!("unauthorized: the identity '{id}' is not in the policy in force"),
                )
                .with_code("unknown_identity")
            }),
            (None, Some((signed, expiration, signature))) if endpoint.spec.auth_required => catalog
                .auth
                .authenticate_signed(&signed, expiration, signature),
            (None, _) => {
                catalog
                    .auth
                    .authenticate(&head.headers, None, endpoint.spec.auth_required)
            }
        }
        .map_err(|e| self.decorate(found.index, render(e, style)))?;
        // A refusal once the caller is known: audited, then worded as the route words it.
        let refused = |error: ApiError| {
            audit::refused(catalog, found.index, &identity.id, error.status, error.code);
            self.decorate(found.index, render(error, style))
        };
        // authorize
        let access = catalog.access(found.index, &identity);
        if let Some(error) = access.refusal(&endpoint.spec.id, &identity) {
            return Err(refused(error));
        }
        // rate limit
        if let Some((requests, per_seconds)) = catalog.decisions[found.index].rate_limit() {
            if let Err(wait) = take_token(found.index, &identity.id, requests, per_seconds) {
                let seconds = wait.ceil().max(1.0) as u64;
                let error = ApiError::new(
                    429,
                    "RateLimited",
                    format!(
                        "Rate limit exceeded: endpoint '{}' allows {requests} requests per {per_seconds} s for '{}'; retry in {seconds} s",
                        endpoint.spec.id, identity.id
                    ),
                )
                .with_code("rate_limited")
                .with_field("endpoint", endpoint.spec.id.clone())
                .with_field("retry_after", seconds)
                .with_header("Retry-After", seconds.to_string());
                return Err(refused(error));
            }
        }
        // concurrency
        let mut slots = Vec::new();
        let decision = &catalog.decisions[found.index];
        if let Some(most) = decision.knob_u64("max_concurrency") {
            match Slot::take(found.index, &identity.id, most) {
                Some(slot) => slots.push(slot),
                None => {
                    let error = ApiError::new(
                        429,
                        "RateLimited",
                        format!(
                            "Too many concurrent requests: endpoint '{}' serves {most} at once for '{}'; retry in 1 s",
                            endpoint.spec.id, identity.id
                        ),
                    )
                    .with_code("concurrency_limited")
                    .with_field("endpoint", endpoint.spec.id.clone())
                    .with_field("retry_after", 1)
                    .with_header("Retry-After", "1");
                    return Err(refused(error));
                }
            }
        }
        // `max_processes` on `shell` and `shell_stream`: the commands the endpoint runs at
        // once, for every caller together (`process_start` counts its process table).
        if let Some(most) = decision
            .knob_u64("max_processes")
            .filter(|_| endpoint.spec.id != "process_start")
        {
            match Slot::take(found.index, "", most) {
                Some(slot) => slots.push(slot),
                None => {
                    let error = ApiError::new(
                        429,
                        "ResourceError",
                        format!("Process limit reached ({most})"),
                    )
                    .with_code("process_limit");
                    return Err(refused(error));
                }
            }
        }
        // A body over the limit is refused from its header alone, after the caller is
        // known (an unauthenticated caller learns nothing of the limits, as on the
        // reference) and before anything reads it: it is never read.
        let limit = self.body_limit(found.index, method, head);
        if head.content_length.is_some_and(|n| n > limit) {
            audit::refused(
                catalog,
                found.index,
                &identity.id,
                413,
                Some("payload_too_large"),
            );
            return Err(self
                .refuse(ProtocolError::body_too_large(limit), Some(head))
                .closing());
        }
        let query = query.map_err(|e| self.decorate(found.index, render(e, style)))?;
        Ok(Accepted {
            index: found.index,
            method,
            path,
            query,
            path_params: found.params,
            identity,
            catalog: catalog_ref.clone(),
            slots,
        })
    }

    /// A request on the PTY port: route to its WebSocket endpoint, answer the opening
    /// handshake, and hand the socket over with the outcome of authentication and
    /// policy (a refusal becomes a close code: 4001 credentials, 4003 policy).
    fn plan_upgrade(&self, head: &RequestHead) -> Plan<Accepted> {
        let catalog_ref = self.state.catalog();
        let catalog = &**catalog_ref;
        let (path, query) = split_target(&head.target);
        let on_port = |i: &usize| {
            let e = &catalog.endpoints[*i];
            e.spec.listener == Listener::Pty && matches!(e.serve, Serve::Upgrade(_))
        };
        let all = 0..catalog.endpoints.len();
        let found = all
            .clone()
            .filter(on_port)
            .find(|i| catalog.endpoints[*i].spec.path == path)
            .or_else(|| {
                // The reference's terminal server answers on every path of its port (its
                // own tests open `ws://host:port/?session_id=`): with one socket on the
                // port, any path is that socket.
                let mut sockets = all.filter(on_port);
                match (sockets.next(), sockets.next()) {
                    (Some(index), None) => Some(index),
                    _ => None,
                }
            });
        let Some(index) = found else {
            return Plan::Answer(
                render(ApiError::not_found_path(&path), ErrorStyle::Contract).closing(),
            );
        };
        let Serve::Upgrade(handler) = catalog.endpoints[index].serve.clone() else {
            return Plan::Answer(
                render(ApiError::not_found_path(&path), ErrorStyle::Contract).closing(),
            );
        };
        let query = match query {
            Ok(query) => query,
            Err(error) => return Plan::Answer(render(error, ErrorStyle::Contract).closing()),
        };
        let handshake = match crate::http::websocket::accept(head) {
            Ok(bytes) => bytes,
            Err(why) => {
                return Plan::Answer(
                    render(ApiError::bad_request(why), ErrorStyle::Contract)
                        .header("Sec-WebSocket-Version", "13")
                        .closing(),
                )
            }
        };
        let token = query
            .iter()
            .find(|(n, _)| n == "token")
            .map(|(_, v)| v.as_str());
        let spec = &catalog.endpoints[index].spec;
        let cross_origin = cross_origin_refusal(head, &catalog.policy.allow_origins);
        // Ambiguous credentials are refused by `authenticate` below; kept empty here.
        let credentials =
            super::auth::Credentials::presented(&head.headers, token).unwrap_or_default();
        let admitted = match catalog
            .auth
            .authenticate(&head.headers, token, spec.auth_required)
        {
            // A terminal is input to a shell: another site's page may not open one.
            _ if cross_origin.is_some() => Err(Refusal {
                close_code: 4003,
                reason: "cross_origin_refused".into(),
            }),
            Err(_) => Err(Refusal {
                close_code: 4001,
                reason: "unauthorized".into(),
            }),
            Ok(identity) => {
                let access = catalog.access(index, &identity);
                if access.allowed {
                    Ok(identity)
                } else {
                    Err(Refusal {
                        close_code: 4003,
                        reason: access.reason.unwrap_or_else(|| "endpoint disabled".into()),
                    })
                }
            }
        };
        let upgraded = Upgraded {
            query,
            admitted,
            credentials,
            endpoint: index,
            state: self.state.clone(),
        };
        hand_over(handshake, handler, upgraded)
    }

    /// A WebSocket on the API port, for a request already admitted (credentials,
    /// scopes, policy, rate): answer the handshake and hand the socket over.
    fn plan_api_upgrade(
        &self,
        head: &RequestHead,
        accepted: Accepted,
        handler: super::endpoint::UpgradeHandler<Upgraded>,
    ) -> Plan<Accepted> {
        let index = accepted.index;
        let style = accepted.catalog.endpoints[index].spec.errors;
        let handshake = match crate::http::websocket::accept(head) {
            Ok(bytes) => bytes,
            Err(why) => {
                let error = ApiError::bad_request(format!("invalid WebSocket handshake: {why}"))
                    .with_code("agents.websocket_handshake_invalid");
                return Plan::Answer(
                    self.decorate(index, render(error, style))
                        .header("Sec-WebSocket-Version", "13")
                        .closing(),
                );
            }
        };
        let token = accepted
            .query
            .iter()
            .find(|(n, _)| n == "token")
            .map(|(_, v)| v.as_str());
        let credentials =
            super::auth::Credentials::presented(&head.headers, token).unwrap_or_default();
        let upgraded = Upgraded {
            query: accepted.query,
            admitted: Ok(accepted.identity),
            credentials,
            endpoint: index,
            state: self.state.clone(),
        };
        hand_over(handshake, handler, upgraded)
    }

    /// Whether this request streams a raw `application/octet-stream` body into a sink.
    fn is_raw(&self, index: usize, method: Method, head: &RequestHead) -> bool {
        self.state.catalog().endpoints[index].spec.body == BodyMode::RawOrStreamedJson
            && method == Method::Post
            && head.header("content-type").is_some_and(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .eq_ignore_ascii_case("application/octet-stream")
            })
    }

    /// The most body bytes this request may send.
    fn body_limit(&self, index: usize, method: Method, head: &RequestHead) -> u64 {
        let multipart = self.state.catalog().endpoints[index].spec.body == BodyMode::Multipart;
        if multipart || self.is_raw(index, method, head) {
            let knob = self.state.catalog().decisions[index].knob_u64("max_upload_bytes");
            let limit = knob.map_or(self.state.services.max_upload_size, |cap| {
                cap.min(self.state.services.max_upload_size)
            });
            // A multipart body carries its framing besides the file; the sink holds the
            // file itself to the limit.
            if multipart {
                limit.saturating_add(64 * 1024)
            } else {
                limit
            }
        } else {
            // The policy's `limits.max_request_bytes` replaces the contract's 10 MiB.
            let limit = self.state.catalog().decisions[index]
                .knob_u64("max_request_bytes")
                .unwrap_or(MAX_JSON_BODY as u64);
            // A file sent as multipart carries its framing besides the bytes.
            if self.state.catalog().endpoints[index].spec.body == BodyMode::JsonOrMultipart
                && is_multipart(head)
            {
                limit.saturating_add(64 * 1024)
            } else {
                limit
            }
        }
    }

    fn call(&self, accepted: Accepted, head: RequestHead, body: Vec<u8>) -> Call {
        Call {
            method: accepted.method,
            path: accepted.path,
            query: accepted.query,
            headers: head.headers,
            body,
            path_params: accepted.path_params,
            identity: accepted.identity,
            endpoint: accepted.index,
            state: self.state.clone(),
            catalog: accepted.catalog,
        }
    }

    /// The headers the endpoint declares for every answer, errors included.
    fn decorate(&self, index: usize, mut response: Response) -> Response {
        for (name, value) in &self.state.catalog().endpoints[index].spec.headers {
            response = response.header(*name, *value);
        }
        response
    }

    /// Runs a handler, turning an error or a panic into its rendered answer.
    async fn invoke(&self, index: usize, handler: Handler, call: Call) -> Response {
        let catalog = call.catalog.clone();
        let identity = call.identity.clone();
        let spec = &catalog.endpoints[index].spec;
        let outcome = guarded(move || handler(call)).await;
        let (response, code) = match outcome {
            Ok(Ok(response)) => (response, None),
            Ok(Err(error)) => {
                let code = error.code;
                (render(with_endpoint(error, &spec.id), spec.errors), code)
            }
            Err(message) => (render(panicked(&spec.id, &message), spec.errors), None),
        };
        audit::answered(&catalog, index, &identity.id, response.status, code);
        self.decorate(index, response)
    }
}

impl Service for ApiService {
    type Call = Accepted;
    type InFlight = InFlight;

    fn timeouts(&self) -> Timeouts {
        Timeouts {
            idle: self.state.config.idle_timeout,
            read: self.state.config.read_timeout,
        }
    }

    fn draining(&self) -> bool {
        self.shutdown.is_shutting_down()
    }

    fn request_started(&self) -> InFlight {
        self.shutdown.request_started()
    }

    fn drained(&self) -> impl std::future::Future<Output = ()> {
        Drained::new()
    }

    fn farewell(&self) -> Option<Vec<u8>> {
        Some(crate::http::sse::format_event(
            "shutdown",
            &serde_json::json!({"reason": "the server is stopping"}),
        ))
    }

    async fn plan(&self, head: &RequestHead) -> Plan<Accepted> {
        if self.listener == Listener::Pty {
            return self.plan_upgrade(head);
        }
        let accepted = match self.admit(head) {
            Ok(accepted) => accepted,
            Err(refusal) => return Plan::Answer(refusal),
        };
        // body plan
        let index = accepted.index;
        let catalog = accepted.catalog.clone();
        let endpoint = &catalog.endpoints[index];
        if let Some(handler) = endpoint.upgrade.clone().filter(|_| asks_websocket(head)) {
            return self.plan_api_upgrade(head, accepted, handler);
        }
        let limit = self.body_limit(index, accepted.method, head);
        let open_sink = match &endpoint.serve {
            Serve::Sinks { raw: Some(raw), .. } if self.is_raw(index, accepted.method, head) => raw,
            Serve::Sinks { json, .. } if accepted.method.takes_json_body() => json,
            _ => {
                return Plan::Read {
                    limit,
                    call: accepted,
                    watch_peer: endpoint.spec.watch_peer,
                };
            }
        };
        // invoke (the sink opens before the body is read; it answers when it is done)
        let style = endpoint.spec.errors;
        let id = endpoint.spec.id.clone();
        let open_sink = open_sink.clone();
        let mut accepted = accepted;
        let slots = std::mem::take(&mut accepted.slots);
        let call = self.call(accepted, head.clone(), Vec::new());
        // A raw body the handler refuses is still on the wire; the connection closes
        // rather than read it.
        match guarded(move || open_sink(call)).await {
            Ok(Ok(sink)) => Plan::Stream {
                limit,
                sink: Box::new(SinkAnswers {
                    sink,
                    style,
                    id: id.to_string(),
                    slots,
                }),
            },
            Ok(Err(error)) => Plan::Answer(
                self.decorate(index, render(with_endpoint(error, &id), style))
                    .closing(),
            ),
            Err(message) => Plan::Answer(
                self.decorate(index, render(panicked(&id, &message), style))
                    .closing(),
            ),
        }
    }

    async fn respond(&self, accepted: Accepted, head: RequestHead, body: Vec<u8>) -> Response {
        let index = accepted.index;
        let catalog = accepted.catalog.clone();
        let endpoint = &catalog.endpoints[index];
        if accepted.method.takes_json_body() && endpoint.spec.body == BodyMode::JsonRpc {
            if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
                let error = ApiError::bad_request(format!("Invalid JSON body: {e}"));
                return self.decorate(index, render(error, endpoint.spec.errors));
            }
        } else if endpoint.spec.body == BodyMode::JsonOrMultipart && is_multipart(&head) {
            // The handler parses the parts.
        } else if accepted.method.takes_json_body() && endpoint.spec.body != BodyMode::Opaque {
            let full_syntax = endpoint.spec.body == BodyMode::Json;
            if let Err(error) = validate_json_object(&body, full_syntax) {
                return self.decorate(index, render(error, endpoint.spec.errors));
            }
        }
        let handler = match &endpoint.serve {
            Serve::Handler(handler) => handler.clone(),
            Serve::Unavailable(_) | Serve::Upgrade(_) | Serve::Sinks { .. } => {
                // An unavailable endpoint is always disabled (refused before its body
                // is read), WebSockets are not on the API port, and bodies that stream
                // never reach here.
                return render(
                    ApiError::not_found_path(&accepted.path),
                    endpoint.spec.errors,
                );
            }
        };
        let mut accepted = accepted;
        let slots = std::mem::take(&mut accepted.slots);
        let call = self.call(accepted, head, body);
        let response = self.invoke(index, handler, call).await;
        hold_until_sent(response, slots)
    }

    fn refuse(&self, error: ProtocolError, head: Option<&RequestHead>) -> Response {
        let mut api = ApiError::new(error.status, "ValueError", error.message);
        api.code = error.code;
        if let Some(limit) = error.limit {
            api = api.with_field("limit", limit);
        }
        // A refusal of a request whose route is known is worded as that route words its
        // errors (OpenAI's envelope under /v1), with its headers.
        let route = head.and_then(|head| {
            let method = Method::from_http(&head.method)?;
            let (path, _) = split_target(&head.target);
            let catalog = self.state.catalog();
            catalog
                .router
                .lookup(method, &path)
                .map(|found| found.index)
        });
        match route {
            Some(index) => {
                let style = self.state.catalog().endpoints[index].spec.errors;
                self.decorate(index, render(api, style))
            }
            None => render(api, ErrorStyle::Contract),
        }
    }

    fn unavailable(&self) -> Response {
        let api = ApiError::new(
            503,
            "OSError",
            "The server has no file descriptors left for this connection; retry shortly",
        )
        .with_code("resource_exhausted")
        .with_header("Retry-After", "1");
        render(api, ErrorStyle::Contract).closing()
    }
}

/// A place under an endpoint's `max_concurrency` for one identity (as the reference
/// counts: per identity and endpoint, across every worker); dropping it frees it.
struct Slot {
    key: (usize, String),
}

type InFlightCounts = std::collections::HashMap<(usize, String), u64>;

fn in_flight_counts() -> std::sync::MutexGuard<'static, InFlightCounts> {
    static COUNTS: std::sync::OnceLock<std::sync::Mutex<InFlightCounts>> =
        std::sync::OnceLock::new();
    COUNTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

impl Slot {
    /// A place among `most`, or `None` when they are all taken.
    fn take(index: usize, identity: &str, most: u64) -> Option<Slot> {
        let key = (index, identity.to_string());
        let mut counts = in_flight_counts();
        let count = counts.entry(key.clone()).or_insert(0);
        if *count >= most {
            return None;
        }
        *count += 1;
        Some(Slot { key })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = in_flight_counts();
        if let Some(count) = counts.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// A streamed answer keeps `slots` until its last piece is out (or the connection
/// drops it); a full one frees them now, as it is written at once.
fn hold_until_sent(mut response: Response, slots: Vec<Slot>) -> Response {
    if slots.is_empty() {
        return response;
    }
    if let crate::http::response::Body::Stream(inner) = response.body {
        response.body = crate::http::response::Body::Stream(Box::new(HoldingSlots {
            inner,
            _slots: slots,
        }));
    }
    response
}

struct HoldingSlots {
    inner: Box<dyn crate::http::response::BodyStream>,
    _slots: Vec<Slot>,
}

impl crate::http::response::BodyStream for HoldingSlots {
    fn length(&self) -> Option<u64> {
        self.inner.length()
    }

    fn next(&mut self, buf: Vec<u8>) -> LocalFuture<'_, std::io::Result<Option<Vec<u8>>>> {
        self.inner.next(buf)
    }

    fn ready(&mut self) -> Option<Vec<u8>> {
        self.inner.ready()
    }
}

/// A token bucket per (endpoint, identity) for the policy's rate limit, shared by every
/// worker, so a caller gets exactly the limit however its connections spread (as on
/// the reference). The lock is taken only by requests to an endpoint that has a limit.
struct Bucket {
    tokens: f64,
    refilled: std::time::Instant,
}

type Buckets = std::collections::HashMap<(usize, String), Bucket>;

fn buckets() -> std::sync::MutexGuard<'static, Buckets> {
    static BUCKETS: std::sync::OnceLock<std::sync::Mutex<Buckets>> = std::sync::OnceLock::new();
    BUCKETS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Takes one token of endpoint `index`'s bucket for `identity`, or says how many
/// seconds until one is there.
fn take_token(index: usize, identity: &str, requests: f64, per_seconds: f64) -> Result<(), f64> {
    let rate = requests / per_seconds;
    {
        let mut buckets = buckets();
        let now = std::time::Instant::now();
        let bucket = buckets
            .entry((index, identity.to_string()))
            .or_insert(Bucket {
                tokens: requests,
                refilled: now,
            });
        let elapsed = now.duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(requests);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err((1.0 - bucket.tokens) / rate)
        }
    }
}

/// Renders `error` in `style`: the only place an [`ApiError`] becomes a response.
pub fn render(error: ApiError, style: ErrorStyle) -> Response {
    let mut response = Response::json(error.status, &error.body(style));
    for (name, value) in error.headers {
        response = response.header(name, value);
    }
    response
}

/// Sends the `101` handshake answer, then runs `handler` on the socket (on either port).
fn hand_over(
    handshake: Vec<u8>,
    handler: super::endpoint::UpgradeHandler<Upgraded>,
    upgraded: Upgraded,
) -> Plan<Accepted> {
    Plan::Upgrade(Box::new(move |mut stream, leftover| {
        Box::pin(async move {
            use monoio::io::AsyncWriteRentExt;
            let (written, _) = stream.write_all(handshake).await;
            if written.is_ok() {
                handler(upgraded, stream, leftover).await;
            }
        })
    }))
}

/// Whether the request asks for a WebSocket (`Upgrade: websocket`).
fn asks_websocket(head: &RequestHead) -> bool {
    head.headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("upgrade"))
        .flat_map(|(_, v)| v.split(','))
        .any(|v| v.trim().eq_ignore_ascii_case("websocket"))
}

/// Whether the request's body is `multipart/form-data`.
fn is_multipart(head: &RequestHead) -> bool {
    head.header("content-type").is_some_and(|v| {
        v.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case("multipart/form-data")
    })
}

/// Policy refusals name the endpoint that refused (the contract's common rules), as
/// every `PolicyDenied` of the reference does, whatever its status.
fn with_endpoint(error: ApiError, id: &str) -> ApiError {
    const POLICY_CODES: [&str; 20] = [
        "path_not_allowed",
        "command_not_allowed",
        "extension_not_allowed",
        "rate_limited",
        "missing_scope",
        "endpoint_disabled",
        "path_denied",
        "invalid_path",
        "read_only",
        "symlink_denied",
        "shell_not_allowed",
        "signal_not_allowed",
        "language_not_allowed",
        "process_denied",
        "env_invalid",
        "env_var_denied",
        "env_var_not_allowed",
        "url_invalid",
        "url_not_allowed",
        "url_denied",
    ];
    let is_policy = error.code.is_some_and(|c| POLICY_CODES.contains(&c));
    if is_policy && !error.has_field("endpoint") {
        error.with_field("endpoint", id.to_string())
    } else {
        error
    }
}

fn panicked(id: &str, message: &str) -> ApiError {
    crate::log!("handler for endpoint '{id}' panicked: {message}");
    ApiError::internal(
        "RuntimeError",
        format!("Internal error in endpoint '{id}': {message}"),
    )
}

/// Builds and polls a handler's future, turning a panic in either into `Err` with the
/// panic's message.
async fn guarded<'a, T, F>(start: F) -> Result<Result<T, ApiError>, String>
where
    F: FnOnce() -> Pin<Box<dyn Future<Output = Result<T, ApiError>> + 'a>>,
{
    let future = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(start)) {
        Ok(future) => future,
        Err(panic) => return Err(describe_panic(&*panic)),
    };
    CatchPanic(future)
        .await
        .map_err(|panic| describe_panic(&*panic))
}

/// Renders a raw sink's errors for the engine.
struct SinkAnswers {
    sink: Box<dyn RawSink>,
    style: ErrorStyle,
    id: String,
    slots: Vec<Slot>,
}

/// A sink's panic is a 500 for its request, as a handler's is; the engine then aborts
/// the sink (after `write`) or drops it (after `finish`, which consumed it).
impl BodySink for SinkAnswers {
    fn write(&mut self, piece: Vec<u8>) -> LocalFuture<'_, Result<Vec<u8>, Response>> {
        Box::pin(async move {
            let (style, id) = (self.style, self.id.clone());
            match guarded(|| self.sink.write(piece)).await {
                Ok(Ok(buffer)) => Ok(buffer),
                Ok(Err(error)) => Err(render(with_endpoint(error, &id), style)),
                Err(message) => Err(render(panicked(&id, &message), style)),
            }
        })
    }

    fn finish(self: Box<Self>) -> LocalFuture<'static, Response> {
        Box::pin(async move {
            let SinkAnswers {
                sink,
                style,
                id,
                slots,
            } = *self;
            let response = match guarded(move || sink.finish()).await {
                Ok(Ok(response)) => response,
                Ok(Err(error)) => render(with_endpoint(error, &id), style),
                Err(message) => render(panicked(&id, &message), style),
            };
            hold_until_sent(response, slots)
        })
    }

    fn abort(self: Box<Self>) -> LocalFuture<'static, ()> {
        self.sink.abort()
    }

    fn piece_size(&self) -> usize {
        self.sink.piece_size()
    }
}

/// Makes one service per listener slot on each worker.
pub fn service_factory(
    state: Arc<AppState>,
    shutdown: Arc<Shutdown>,
    slots: Vec<Listener>,
) -> impl Fn(usize) -> ApiService + Send + Sync + 'static {
    move |slot| ApiService::new(state.clone(), shutdown.clone(), slots[slot])
}

/// A request a browser sent for a page of another origin, unless the policy's
/// `allow_origins` admits that origin. In local mode any page the sandbox's own
/// Chromium (or a user's browser) loads could otherwise `POST /shell` with a
/// cross-origin `text/plain` form: browsers send such requests without a preflight.
/// Browsers mark them with `Origin` and `Sec-Fetch-Site`; clients that send neither
/// (curl, the SDKs) are not browsers and pass. The server's own origin is the one whose
/// host and port are the request's `Host`.
fn cross_origin_refusal(head: &RequestHead, allow: &[String]) -> Option<ApiError> {
    if allow.iter().any(|o| o == "*") {
        return None;
    }
    let origin = head.header("origin").map(|o| o.trim().to_ascii_lowercase());
    let fetch_site = head.header("sec-fetch-site").map(str::to_ascii_lowercase);
    let listed = |origin: &str| allow.iter().any(|o| o == origin.trim_end_matches('/'));
    let host = head
        .header("host")
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    // A name that is not this machine's own could be rebound to it: a page of
    // `http://rebind.example:9000` whose name later resolves to 127.0.0.1 sends its own
    // origin as Host and Origin. So only an address, a `localhost` name, or a host the
    // policy lists counts as the server's own.
    let hostname = host
        .strip_prefix('[')
        .and_then(|h| h.split_once(']').map(|(ip, _)| ip))
        .unwrap_or_else(|| {
            host.rsplit_once(':')
                .map_or(host.as_str(), |(name, _)| name)
        });
    let host_is_ours = hostname.parse::<std::net::IpAddr>().is_ok()
        || hostname == "localhost"
        || hostname.ends_with(".localhost")
        || allow.iter().any(|o| {
            o.split_once("://")
                .is_some_and(|(_, authority)| authority == host || authority == hostname)
        });
    let own = host_is_ours
        && origin.as_deref().is_some_and(|origin| {
            origin.split_once("://").is_some_and(|(scheme, authority)| {
                matches!(scheme, "http" | "https") && authority == host
            })
        });
    let foreign_origin = origin.as_deref().is_some_and(|o| !own && !listed(o));
    let foreign_site = matches!(fetch_site.as_deref(), Some("cross-site" | "same-site"))
        && !own
        && !origin.as_deref().is_some_and(listed);
    (foreign_origin || foreign_site).then(|| {
        let named = origin.as_deref().unwrap_or("(none)");
        ApiError::new(
            403,
            "PermissionError",
            format!(
                "Cross-origin request refused: Origin {named} (Sec-Fetch-Site {}) is not this server's own (Host {host}); a policy's allow_origins can admit it",
                fetch_site.as_deref().unwrap_or("absent")
            ),
        )
        .with_code("cross_origin_refused")
    })
}
