//! `browser` (opt-in): one shared headless Chromium page, Playwright-style. Each route
//! validates its body, checks the policy (`url_allow`, `url_deny`,
//! `block_private_networks` on navigate, resolving the host on the blocking pool), hands
//! the operation to the browser actor and awaits its answer without blocking the worker.

use std::net::ToSocketAddrs;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::schema_object;
use crate::api::{ApiError, Group, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::browser::guard::{self, Refusal, Verdict};
use crate::browser::{
    keys, BrowserError, ElementState, HistoryStep, MouseButton, Op, WaitUntil, INSTALL_HINT,
};
use crate::http::Response;

/// Playwright's default operation timeout.
const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// The longest timeout a caller may ask for.
const MAX_TIMEOUT_MS: u64 = 600_000;
/// How long a navigation waits for its host to resolve under `block_private_networks`.
const DNS_TIMEOUT: Duration = Duration::from_secs(10);
/// Clicks per `click_count` at most (a triple click selects a paragraph).
const MAX_CLICKS: u64 = 10;

fn post(path: &str, id: &str, summary: &str, f: fn(Call) -> Handled) -> Endpoint {
    Endpoint::new(Method::Post, path, Group::Browser, handler(f))
        .id(id)
        .summary(summary)
        .also_answers(&[400, 408, 429, 500, 503])
        // Every route drives the one shared page: off under `read-only`, and held for
        // its caller alone (a caller that hangs up stops the work).
        .changes()
        .watch_peer()
}

fn get(path: &str, id: &str, summary: &str, f: fn(Call) -> Handled) -> Endpoint {
    Endpoint::new(Method::Get, path, Group::Browser, handler(f))
        .id(id)
        .summary(summary)
        .also_answers(&[400, 408, 429, 500, 503])
        // Every route drives the one shared page: off under `read-only`, and held for
        // its caller alone (a caller that hangs up stops the work).
        .changes()
        .watch_peer()
}

type Handled = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response, ApiError>>>>;

fn boxed(f: impl std::future::Future<Output = Result<Response, ApiError>> + 'static) -> Handled {
    Box::pin(f)
}

fn timeout_param() -> Param {
    Param::body("timeout", "number", false)
}

fn ok_schema() -> Value {
    schema_object(&["ok"], json!({"ok": {"type": "boolean"}}))
}

fn location_schema() -> Value {
    schema_object(
        &["url", "title"],
        json!({"url": {"type": "string"}, "title": {"type": "string"}}),
    )
}

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        post("/browser/navigate", "browser_navigate", "Open a URL in the shared page (policy: url_allow, url_deny, block_private_networks).", |c| boxed(navigate(c)))
            .params(&[Param::body("url", "string", true), Param::body("wait_until", "string", false), timeout_param()])
            .returns(schema_object(&["url", "title", "status"], json!({
                "url": {"type": "string"}, "title": {"type": "string"}, "status": {"type": ["integer", "null"]},
            })))
            .also_answers(&[403])
            .enforces(&["url_allow", "url_deny", "block_private_networks"]),
        post("/browser/screenshot", "browser_screenshot", "PNG of the viewport, the full page, or one element.", |c| boxed(screenshot(c)))
            .params(&[Param::body("selector", "string", false), Param::body("full_page", "boolean", false), timeout_param()])
            .returns(schema_object(&["content_base64", "format", "width", "height", "bytes"], json!({
                "content_base64": {"type": "string"}, "format": {"type": "string"},
                "width": {"type": "integer"}, "height": {"type": "integer"}, "bytes": {"type": "integer"},
            })))
            .also_answers(&[404]),
        post("/browser/click", "browser_click", "Scroll an element into view, wait until it is visible, click its centre.", |c| boxed(click(c)))
            .params(&[Param::body("selector", "string", true), Param::body("button", "string", false), Param::body("click_count", "integer", false), timeout_param()])
            .returns(ok_schema())
            .also_answers(&[404]),
        post("/browser/fill", "browser_fill", "Set an input's value and fire input and change.", |c| boxed(fill(c)))
            .params(&[Param::body("selector", "string", true), Param::body("value", "string", true), timeout_param()])
            .returns(ok_schema())
            .also_answers(&[404]),
        post("/browser/type", "browser_type", "Type text key by key, into the focused element or selector.", |c| boxed(type_text(c)))
            .params(&[Param::body("selector", "string", false), Param::body("text", "string", true), Param::body("delay_ms", "number", false), timeout_param()])
            .returns(ok_schema())
            .also_answers(&[404]),
        post("/browser/press", "browser_press", "Press a key or chord (Enter, Control+A), optionally on an element.", |c| boxed(press(c)))
            .params(&[Param::body("key", "string", true), Param::body("selector", "string", false), timeout_param()])
            .returns(ok_schema())
            .also_answers(&[404]),
        post("/browser/scroll", "browser_scroll", "Scroll an element into view, or the page by dx, dy.", |c| boxed(scroll(c)))
            .params(&[Param::body("selector", "string", false), Param::body("dx", "number", false), Param::body("dy", "number", false), timeout_param()])
            .returns(schema_object(&["scroll_x", "scroll_y"], json!({"scroll_x": {"type": "number"}, "scroll_y": {"type": "number"}})))
            .also_answers(&[404]),
        post("/browser/evaluate", "browser_evaluate", "Evaluate JavaScript in the page; a function is called with arg; promises are awaited.", |c| boxed(evaluate(c)))
            .params(&[Param::body("expression", "string", true), Param::body("arg", "any", false), timeout_param()])
            .returns(schema_object(&["result"], json!({"result": {}}))),
        post("/browser/wait", "browser_wait", "Wait until a selector is attached, detached, visible or hidden.", |c| boxed(wait(c)))
            .params(&[Param::body("selector", "string", true), Param::body("state", "string", false), timeout_param()])
            .returns(ok_schema()),
        get("/browser/content", "browser_content", "The page's URL, title and HTML.", |c| boxed(content(c)))
            .params(&[Param::query("timeout", "number", false)])
            .returns(schema_object(&["url", "title", "html"], json!({
                "url": {"type": "string"}, "title": {"type": "string"}, "html": {"type": "string"},
            }))),
        get("/browser/text", "browser_text", "The visible text of the page or of one element.", |c| boxed(text(c)))
            .params(&[Param::query("selector", "string", false), Param::query("timeout", "number", false)])
            .returns(schema_object(&["text"], json!({"text": {"type": "string"}})))
            .also_answers(&[404]),
        post("/browser/back", "browser_back", "Go back one history entry.", |c| boxed(history(c, HistoryStep::Back)))
            .params(&[timeout_param()])
            .returns(location_schema()),
        post("/browser/forward", "browser_forward", "Go forward one history entry.", |c| boxed(history(c, HistoryStep::Forward)))
            .params(&[timeout_param()])
            .returns(location_schema()),
        post("/browser/reload", "browser_reload", "Reload the page.", |c| boxed(history(c, HistoryStep::Reload)))
            .params(&[timeout_param()])
            .returns(location_schema()),
        get("/browser/info", "browser_info", "Whether Chromium runs, its page's URL and title, version and viewport.", |c| boxed(info(c)))
            .returns(schema_object(&["running", "url", "title", "version", "viewport"], json!({
                "running": {"type": "boolean"}, "url": {"type": ["string", "null"]}, "title": {"type": ["string", "null"]},
                "version": {"type": ["string", "null"]}, "viewport": {"type": "object"}, "pid": {"type": ["integer", "null"]},
            }))),
        post("/browser/close", "browser_close", "End Chromium; the next browser call starts it again.", |c| boxed(close(c)))
            .returns(schema_object(&["closed"], json!({"closed": {"type": "boolean"}}))),
    ]
}

/// The JSON body as an object (an empty body is `{}`).
fn body(call: &Call) -> Result<Map<String, Value>, ApiError> {
    match call.json::<Option<Value>>()? {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(map)) => Ok(map),
        Some(_) => Err(ApiError::bad_request("the body must be a JSON object")),
    }
}

fn string(body: &Map<String, Value>, name: &str) -> Result<Option<String>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request(format!("{name} must be a string"))),
    }
}

fn required(body: &Map<String, Value>, name: &str) -> Result<String, ApiError> {
    string(body, name)?.ok_or_else(|| ApiError::bad_request(format!("{name} is required")))
}

fn selector(body: &Map<String, Value>, required_here: bool) -> Result<Option<String>, ApiError> {
    let selector = string(body, "selector")?;
    match selector {
        Some(s) if s.trim().is_empty() => Err(ApiError::bad_request("selector must not be empty")),
        None if required_here => Err(ApiError::bad_request(
            "selector is required (a CSS selector)",
        )),
        other => Ok(other),
    }
}

fn number(body: &Map<String, Value>, name: &str) -> Result<Option<f64>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|v| v.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(format!("{name} must be a finite number"))),
        Some(_) => Err(ApiError::bad_request(format!("{name} must be a number"))),
    }
}

fn boolean(body: &Map<String, Value>, name: &str) -> Result<bool, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(format!(
            "{name} must be true or false"
        ))),
    }
}

fn timeout_from(value: Option<f64>) -> Result<Duration, ApiError> {
    match value {
        None => Ok(Duration::from_millis(DEFAULT_TIMEOUT_MS)),
        Some(ms) if ms > 0.0 && ms <= MAX_TIMEOUT_MS as f64 => {
            Ok(Duration::from_secs_f64(ms / 1000.0))
        }
        Some(_) => Err(ApiError::bad_request(format!(
            "timeout must be milliseconds above 0 and at most {MAX_TIMEOUT_MS}"
        ))),
    }
}

fn body_timeout(body: &Map<String, Value>) -> Result<Duration, ApiError> {
    timeout_from(number(body, "timeout")?)
}

fn query_timeout(call: &Call) -> Result<Duration, ApiError> {
    match call.query("timeout") {
        None | Some("") => timeout_from(None),
        Some(text) => {
            timeout_from(Some(text.parse::<f64>().map_err(|_| {
                ApiError::bad_request("timeout must be a number of milliseconds")
            })?))
        }
    }
}

/// The contract's envelope for each browser failure.
fn api_error(error: BrowserError, timeout: Duration) -> ApiError {
    match error {
        BrowserError::NotInstalled(m) => {
            ApiError::new(503, "RuntimeError", m).with_field("hint", INSTALL_HINT)
        }
        BrowserError::Timeout => ApiError::new(
            408,
            "TimeoutError",
            format!("Timeout {}ms exceeded.", timeout.as_millis()),
        ),
        e @ BrowserError::NoMatch(_) => ApiError::new(404, "ValueError", e.to_string()),
        e @ (BrowserError::InvalidSelector(_) | BrowserError::Invalid(_)) => {
            ApiError::bad_request(e.to_string())
        }
        e @ BrowserError::Busy(_) => ApiError::new(429, "RuntimeError", e.to_string())
            .with_code("browser_busy")
            .with_header("Retry-After", "1"),
        e @ (BrowserError::Navigation(_)
        | BrowserError::Script(_)
        | BrowserError::Crashed(_)
        | BrowserError::Protocol(_)
        | BrowserError::Abandoned) => ApiError::new(500, "Error", e.to_string()),
    }
}

/// Hands `op` to the browser actor and answers with what it returns.
async fn run(call: &Call, op: Op, timeout: Duration) -> Result<Response, ApiError> {
    let services = call.services();
    let pending = services
        .browser
        .submit(op, timeout, services.environment.snapshot())
        .map_err(|e| api_error(e, timeout))?;
    match pending.wait().await {
        Ok(value) => Ok(Response::ok(&value)),
        Err(error) => Err(api_error(error, timeout)),
    }
}

fn url_refused(message: String) -> ApiError {
    ApiError::new(403, "PermissionError", message)
        .with_code("url_not_allowed")
        .with_field("endpoint", "browser_navigate")
}

async fn navigate(call: Call) -> Result<Response, ApiError> {
    let body = body(&call)?;
    let url = required(&body, "url")?;
    if url.trim().is_empty() {
        return Err(ApiError::bad_request("url must not be empty"));
    }
    let wait_until = match string(&body, "wait_until")? {
        None => WaitUntil::Load,
        Some(name) => WaitUntil::parse(&name).ok_or_else(|| {
            ApiError::bad_request(format!(
                "wait_until must be load, domcontentloaded, networkidle or commit, not {name:?}"
            ))
        })?,
    };
    let timeout = body_timeout(&body)?;
    let decision = call.decision();
    let allow = decision.knob_list("url_allow");
    let deny = decision.knob_list("url_deny");
    let block_private = decision
        .knob_bool("block_private_networks")
        .unwrap_or(false);
    match guard::check(&url, allow.as_deref(), deny.as_deref(), block_private) {
        Err(Refusal::Invalid(message)) => return Err(ApiError::bad_request(message)),
        Err(Refusal::Denied(message)) => return Err(url_refused(message)),
        Ok(Verdict::Allowed) => {}
        Ok(Verdict::Resolve { host, port }) => {
            let lookup_host = host.clone();
            let lookup = monoio::spawn_blocking(move || {
                let addresses = (lookup_host.as_str(), port)
                    .to_socket_addrs()
                    .map(|addrs| addrs.map(|a| a.ip()).collect::<Vec<_>>());
                (addresses, guard::local_addresses())
            });
            // The resolver's own timeouts bound the pool thread; the caller waits no
            // longer than this.
            let (resolved, local) = monoio::time::timeout(DNS_TIMEOUT, lookup)
                .await
                .map_err(|_| {
                    url_refused(format!(
                        "URL {url} is refused by block_private_networks: {host} did not resolve within {} s",
                        DNS_TIMEOUT.as_secs()
                    ))
                })?
                .map_err(|_| ApiError::internal("Error", "the host lookup was cancelled"))?;
            let addresses = resolved.map_err(|e| {
                url_refused(format!(
                    "URL {url} is refused by block_private_networks: {host} could not be resolved to check it ({e})"
                ))
            })?;
            guard::check_resolved(&url, &host, &addresses, &local).map_err(url_refused)?;
        }
    }
    run(&call, Op::Navigate { url, wait_until }, timeout).await
}

async fn screenshot(call: Call) -> Result<Response, ApiError> {
    let body = body(&call)?;
    let op = Op::Screenshot {
        selector: selector(&body, false)?,
        full_page: boolean(&body, "full_page")?,
    };
    run(&call, op, body_timeout(&body)?).await
}

async fn click(call: Call) -> Result<Response, ApiError> {
    let body = body(&call)?;
    let button = match string(&body, "button")? {
        None => MouseButton::Left,
        Some(name) => MouseButton::parse(&name).ok_or_else(|| {
            ApiError::bad_request(format!(
                "button must be left, right or middle, not {name:?}"
            ))
        })?,
    };
    let click_count = match body.get("click_count") {
        None | Some(Value::Null) => 1,
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=MAX_CLICKS).contains(n))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "click_count must be a whole number from 1 to {MAX_CLICKS}"
                ))
            })? as u32,
    };
    let op = Op::Click {
        selector: selector(&body, true)?.unwrap_or_default(),
        button,
        click_count,
    };
    run(&call, op, body_timeout(&body)?).await
}

async fn fill(call: Call) -> Result<Response, ApiError> {
    let body = body(&call)?;
    let op = Op::Fill {
        selector: selector(&body, true)?.unwrap_or_default(),
        value: required(&body, "value")?,
    };
    run(&call, op, body_timeout(&body)?).await
}

async fn type_text(call: Call) -> Result<Response, ApiError> {
    let body = body(&call)?;
    let delay = match number(&body, "delay_ms")? {
        None => Duration::ZERO,
        Some(ms) if (0.0..=10_000.0).contains(&ms) => Duration::from_secs_f64(ms / 1000.0),
        Some(_) => return Err(ApiError::bad_request("delay_ms must be from 0 to 10000")),
    };
    let op = Op::Type {
        selector: selector(&body, false)?,
        text: required(&body, "text")?,
        delay,
    };
    run(&call, op, body_timeout(&body)?).await
}

async fn press(call: Call) -> Result<Response, ApiError> {
    let body = body(&call)?;
    let key = required(&body, "key")?;
    let chord = keys::parse_chord(&key).map_err(ApiError::bad_request)?;
    let op = Op::Press {
        chord,
        selector: selector(&body, false)?,
    };
    run(&call, op, body_timeout(&body)?).await
}

async fn scroll(call: Call) -> Result<Response, ApiError> {
    let body = body(&call)?;
    let target = selector(&body, false)?;
    let (dx, dy) = (number(&body, "dx")?, number(&body, "dy")?);
    let op = match (target, dx, dy) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err(ApiError::bad_request(
                "give either selector or dx/dy, not both",
            ))
        }
        (Some(selector), None, None) => Op::ScrollTo { selector },
        (None, None, None) => {
            return Err(ApiError::bad_request(
                "give selector (scroll it into view) or dx and dy (pixels to scroll by)",
            ))
        }
        (None, dx, dy) => Op::ScrollBy {
            dx: dx.unwrap_or(0.0),
            dy: dy.unwrap_or(0.0),
        },
    };
    run(&call, op, body_timeout(&body)?).await
}

async fn evaluate(call: Call) -> Result<Response, ApiError> {
    let body = body(&call)?;
    let expression = required(&body, "expression")?;
    if expression.trim().is_empty() {
        return Err(ApiError::bad_request("expression must not be empty"));
    }
    let op = Op::Evaluate {
        expression,
        arg: body.get("arg").cloned(),
    };
    run(&call, op, body_timeout(&body)?).await
}

async fn wait(call: Call) -> Result<Response, ApiError> {
    let body = body(&call)?;
    let state = match string(&body, "state")? {
        None => ElementState::Visible,
        Some(name) => ElementState::parse(&name).ok_or_else(|| {
            ApiError::bad_request(format!(
                "state must be attached, detached, visible or hidden, not {name:?}"
            ))
        })?,
    };
    let op = Op::Wait {
        selector: selector(&body, true)?.unwrap_or_default(),
        state,
    };
    run(&call, op, body_timeout(&body)?).await
}

async fn content(call: Call) -> Result<Response, ApiError> {
    let timeout = query_timeout(&call)?;
    run(&call, Op::Content, timeout).await
}

async fn text(call: Call) -> Result<Response, ApiError> {
    let selector = match call.query("selector") {
        None | Some("") => None,
        Some(s) => Some(s.to_string()),
    };
    let timeout = query_timeout(&call)?;
    run(&call, Op::Text { selector }, timeout).await
}

async fn history(call: Call, step: HistoryStep) -> Result<Response, ApiError> {
    let body = body(&call)?;
    run(&call, Op::History(step), body_timeout(&body)?).await
}

async fn info(call: Call) -> Result<Response, ApiError> {
    run(&call, Op::Info, Duration::from_millis(DEFAULT_TIMEOUT_MS)).await
}

async fn close(call: Call) -> Result<Response, ApiError> {
    run(&call, Op::Close, Duration::from_millis(DEFAULT_TIMEOUT_MS)).await
}
