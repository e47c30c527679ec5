//! `browser` (opt-in): one shared headless Chromium page, Playwright-style. Each route
//! validates its body, checks the policy (`url_allow`, `url_deny`,
//! `block_private_networks` on navigate, resolving the host on the blocking pool), hands
//! the operation to the browser actor and awaits its answer without blocking the worker.

use std::net::ToSocketAddrs;
use std::time::Duration;

use serde_json::{json, Value};

use super::schema_object;
use crate::api::{ApiError, Args, Group, Method, Param};
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

fn post(
    path: &'static str,
    id: &'static str,
    summary: &'static str,
    f: fn(Call) -> Handled,
) -> Endpoint {
    Endpoint::new(Method::Post, path, Group::Browser, handler(f))
        .id(id)
        // Running a script in the page is its own scope, as on the reference server.
        .scopes(&[if id == "browser_evaluate" {
            "browser:evaluate"
        } else {
            "browser:use"
        }])
        .summary(summary)
        .also_answers(&[400, 408, 429, 500, 503])
        // Every route drives the one shared page: off under `read-only`, and held for
        // its caller alone (a caller that hangs up stops the work).
        .changes()
        .watch_peer()
}

fn get(
    path: &'static str,
    id: &'static str,
    summary: &'static str,
    f: fn(Call) -> Handled,
) -> Endpoint {
    Endpoint::new(Method::Get, path, Group::Browser, handler(f))
        .id(id)
        // Running a script in the page is its own scope, as on the reference server.
        .scopes(&[if id == "browser_evaluate" {
            "browser:evaluate"
        } else {
            "browser:use"
        }])
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

/// The `timeout` of every route but `info` and `close`: a body field, or a query
/// parameter on the GET routes.
fn timeout_param(location: fn(&'static str, &str, bool) -> Param) -> Param {
    let param = location("timeout", "number", false);
    let wrong_type = match param.location {
        crate::api::ParamIn::Query => "timeout must be a number of milliseconds",
        _ => "timeout must be a number",
    };
    param
        .above(0.0)
        .at_most(MAX_TIMEOUT_MS as f64)
        .default("30000")
        .invalid(TIMEOUT_SENTENCE)
        .wrong_type(wrong_type)
        .doc("Milliseconds the call may take on the page, above 0 and at most 600000.")
}

/// What a `timeout` out of its bounds (or not a number) is told.
const TIMEOUT_SENTENCE: &str = "timeout must be milliseconds above 0 and at most 600000";

fn selector_param(required: bool, doc: &'static str) -> Param {
    let param = Param::body("selector", "string", required).doc(doc);
    match required {
        true => param.missing("selector is required (a CSS selector)"),
        false => param,
    }
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
    let mut endpoints = served();
    endpoints.extend([
        post(
            "/browser/pdf",
            "browser_pdf",
            "The page printed to PDF (Playwright's paper formats, no margins).",
            |c| boxed(pdf(c)),
        )
        .params(&[
            Param::body("format", "string", false)
                .default("\"A4\"")
                .doc("Letter, Legal, Tabloid, Ledger, or A0 to A6 (any case)."),
            Param::body("landscape", "boolean", false)
                .default("false")
                .invalid("landscape must be true or false")
                .doc("Print in landscape orientation."),
            timeout_param(Param::body),
        ])
        .returns(|| {
            schema_object(
                &["pdf_base64", "pages"],
                json!({
                    "pdf_base64": {"type": "string"}, "pages": {"type": "integer"},
                }),
            )
        }),
        get(
            "/browser/console",
            "browser_console",
            "The page's console messages since the last call, taken (at most 1,000).",
            |c| boxed(console(c)),
        )
        .returns(|| {
            schema_object(
                &["logs"],
                json!({
                    "logs": {"type": "array", "items": {"type": "object"}},
                }),
            )
        }),
    ]);
    endpoints
}

fn served() -> Vec<Endpoint> {
    vec![
        post("/browser/navigate", "browser_navigate", "Open a URL in the shared page (policy: url_allow, url_deny, block_private_networks).", |c| boxed(navigate(c)))
            .params(&[
                Param::body("url", "string", true).doc("The URL to open (policy: url_allow, url_deny, block_private_networks)."),
                Param::body("wait_until", "string", false)
                    .default("\"load\"")
                    .doc("load, domcontentloaded, networkidle (no connections for 500 ms) or commit: when the navigation counts as done."),
                timeout_param(Param::body),
            ])
            .returns(|| schema_object(&["url", "title", "status"], json!({
                "url": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
            })))
            .also_answers(&[403])
            .enforces(&["url_allow", "url_deny", "block_private_networks", "allow_private_networks"]),
        post("/browser/screenshot", "browser_screenshot", "PNG or JPEG of the full page, the viewport, or one element.", |c| boxed(screenshot(c)))
            .params(&[
                selector_param(false, "CSS selector of the element to capture; without it the full page or the viewport."),
                Param::body("full_page", "boolean", false)
                    .default("true")
                    .invalid("full_page must be true or false")
                    .doc("Capture the whole page at its layout size (the default, as on the reference); false: the viewport."),
                Param::body("format", "string", false)
                    .default("\"png\"")
                    .doc("png or jpeg; any other word is png, as on the reference."),
                timeout_param(Param::body),
            ])
            .returns(|| schema_object(&["image_base64", "format", "width", "height", "bytes"], json!({
                "image_base64": {"type": "string"}, "format": {"type": "string"},
                "width": {"type": "integer"}, "height": {"type": "integer"}, "bytes": {"type": "integer"},
            })))
            .also_answers(&[404]),
        post("/browser/click", "browser_click", "Scroll an element into view, wait until it is visible, click its centre.", |c| boxed(click(c)))
            .params(&[
                selector_param(true, "CSS selector of the element to click (the first match)."),
                Param::body("button", "string", false)
                    .default("\"left\"")
                    .doc("left, right or middle."),
                Param::body("click_count", "integer", false)
                    .range(1.0, MAX_CLICKS as f64)
                    .default("1")
                    .invalid("click_count must be a whole number from 1 to 10")
                    .doc("Clicks in a row, 1 to 10 (2 is a double click)."),
                timeout_param(Param::body),
            ])
            .returns(|| schema_object(&["clicked", "selector"], json!({
                "clicked": {"type": "boolean"}, "selector": {"type": "string"},
            })))
            .also_answers(&[404]),
        post("/browser/fill", "browser_fill", "Set an input's value and fire input and change.", |c| boxed(fill(c)))
            .extension()
            .params(&[
                selector_param(true, "CSS selector of the input, textarea, select or contenteditable element."),
                Param::body("value", "string", true).doc("The value to set."),
                timeout_param(Param::body),
            ])
            .returns(ok_schema)
            .also_answers(&[404]),
        post("/browser/type", "browser_type", "Type text key by key, into the focused element or selector.", |c| boxed(type_text(c)))
            .params(&[
                selector_param(false, "CSS selector of the element to focus first; without it the focused element."),
                Param::body("text", "string", true).doc("The text to type, one key at a time (\\n is Enter, \\t Tab)."),
                Param::body("delay", "number", false)
                    .range(0.0, 10_000.0)
                    .default("50")
                    .invalid("delay must be from 0 to 10000")
                    .wrong_type("delay must be a number")
                    .doc("Milliseconds to wait between keys, 0 to 10000 (the reference's name and default)."),
                Param::body("delay_ms", "number", false)
                    .range(0.0, 10_000.0)
                    .invalid("delay_ms must be from 0 to 10000")
                    .wrong_type("delay_ms must be a number")
                    .doc("The same as delay (this server's earlier name); wins when both are given."),
                Param::body("clear", "boolean", false)
                    .default("false")
                    .invalid("clear must be true or false")
                    .doc("Empty the element first (needs selector)."),
                timeout_param(Param::body),
            ])
            .returns(|| schema_object(&["typed", "selector", "text"], json!({
                "typed": {"type": "boolean"}, "selector": {"type": ["string", "null"]}, "text": {"type": "string"},
            })))
            .also_answers(&[404]),
        post("/browser/press", "browser_press", "Press a key or chord (Enter, Control+A), optionally on an element.", |c| boxed(press(c)))
            .extension()
            .params(&[
                Param::body("key", "string", true).doc("A key or chord in Playwright's names: Enter, Control+A, Shift+ArrowDown."),
                selector_param(false, "CSS selector of the element to focus first."),
                timeout_param(Param::body),
            ])
            .returns(ok_schema)
            .also_answers(&[404]),
        post("/browser/scroll", "browser_scroll", "Scroll an element into view, or the page by dx, dy.", |c| boxed(scroll(c)))
            .extension()
            .params(&[
                selector_param(false, "CSS selector of the element to scroll into view (not with dx, dy)."),
                Param::body("dx", "number", false).doc("Pixels to scroll the page right by (0 when only dy is given)."),
                Param::body("dy", "number", false).doc("Pixels to scroll the page down by (0 when only dx is given)."),
                timeout_param(Param::body),
            ])
            .returns(|| schema_object(&["scroll_x", "scroll_y"], json!({"scroll_x": {"type": "number"}, "scroll_y": {"type": "number"}})))
            .also_answers(&[404]),
        post("/browser/evaluate", "browser_evaluate", "Evaluate JavaScript in the page; a function is called with arg; promises are awaited.", |c| boxed(evaluate(c)))
            .params(&[
                Param::body("expression", "string", false).doc("JavaScript evaluated in the page; a function is called with arg."),
                Param::body("script", "string", false).doc("The reference server's name for expression (its client sends it); one of the two is required."),
                Param::body("arg", "any", false).doc("The argument a function expression is called with (any JSON value)."),
                timeout_param(Param::body),
            ])
            .returns(|| schema_object(&["result"], json!({"result": {}}))),
        post("/browser/wait", "browser_wait", "Wait until a selector is attached, detached, visible or hidden.", |c| boxed(wait(c)))
            .extension()
            .params(&[
                selector_param(true, "CSS selector to wait for."),
                Param::body("state", "string", false)
                    .default("\"visible\"")
                    .doc("attached, detached, visible or hidden: what to wait for."),
                timeout_param(Param::body),
            ])
            .returns(ok_schema),
        get("/browser/content", "browser_content", "The page's URL, title and HTML (or, with type=text, its visible text).", |c| boxed(content(c)))
            .params(&[
                Param::query("type", "string", false)
                    .default("\"html\"")
                    .doc("html (the page's markup) or text (the body's visible text)."),
                timeout_param(Param::query),
            ])
            .returns(|| schema_object(&["url", "title", "content"], json!({
                "url": {"type": "string"}, "title": {"type": "string"}, "content": {"type": "string"},
            }))),
        get("/browser/text", "browser_text", "The visible text of the page or of one element.", |c| boxed(text(c)))
            .extension()
            .params(&[
                Param::query("selector", "string", false).doc("CSS selector of the element whose text to read; without it the page's body."),
                timeout_param(Param::query),
            ])
            .returns(|| schema_object(&["text"], json!({"text": {"type": "string"}})))
            .also_answers(&[404]),
        post("/browser/back", "browser_back", "Go back one history entry.", |c| boxed(history(c, HistoryStep::Back)))
            .extension()
            .params(&[timeout_param(Param::body)])
            .returns(location_schema),
        post("/browser/forward", "browser_forward", "Go forward one history entry.", |c| boxed(history(c, HistoryStep::Forward)))
            .extension()
            .params(&[timeout_param(Param::body)])
            .returns(location_schema),
        post("/browser/reload", "browser_reload", "Reload the page.", |c| boxed(history(c, HistoryStep::Reload)))
            .extension()
            .params(&[timeout_param(Param::body)])
            .returns(location_schema),
        get("/browser/info", "browser_info", "Whether Chromium runs, its page's URL and title, version and viewport.", |c| boxed(info(c)))
            .extension()
            .returns(|| schema_object(&["running", "url", "title", "version", "viewport"], json!({
                "running": {"type": "boolean"}, "url": {"type": ["string", "null"]}, "title": {"type": ["string", "null"]},
                "version": {"type": ["string", "null"]}, "viewport": {"type": "object"}, "pid": {"type": ["integer", "null"]},
            }))),
        post("/browser/close", "browser_close", "End Chromium; the next browser call starts it again.", |c| boxed(close(c)))
            .extension()
            .returns(|| schema_object(&["closed"], json!({"closed": {"type": "boolean"}}))),
    ]
}

/// The `selector` field, refused when blank (a CSS selector of only spaces matches
/// nothing a caller meant).
fn selector(args: &Args) -> Result<Option<String>, ApiError> {
    match args.str("selector") {
        Some(s) if s.trim().is_empty() => Err(ApiError::bad_request("selector must not be empty")),
        other => Ok(other.map(str::to_string)),
    }
}

/// The declared `timeout` (milliseconds, default 30000).
fn timeout(args: &Args) -> Duration {
    let ms = args.number("timeout").unwrap_or(DEFAULT_TIMEOUT_MS as f64);
    Duration::from_secs_f64(ms / 1000.0)
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
    let pending = call
        .group_state::<crate::browser::Browser>()?
        .submit(op, timeout, call.services().environment.snapshot())
        .map_err(|e| api_error(e, timeout))?;
    match pending.wait().await {
        Ok(value) => Ok(Response::ok(&value)),
        Err(error) => Err(api_error(error, timeout)),
    }
}

fn url_refused(message: String) -> ApiError {
    ApiError::new(403, "PolicyDenied", message)
        .with_code("url_not_allowed")
        .with_field("endpoint", "browser_navigate")
}

async fn navigate(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let url = args.string("url");
    if url.trim().is_empty() {
        return Err(ApiError::bad_request("url must not be empty"));
    }
    let name = args.str("wait_until").unwrap_or("load");
    let wait_until = WaitUntil::parse(name).ok_or_else(|| {
        ApiError::bad_request(format!(
            "wait_until must be load, domcontentloaded, networkidle or commit, not {name:?}"
        ))
    })?;
    let timeout = timeout(&args);
    let decision = call.decision();
    let allow = decision.knob_list("url_allow");
    let deny = decision.knob_list("url_deny");
    let block_private = decision
        .knob_bool("block_private_networks")
        .unwrap_or(false);
    let allow_private = decision
        .knob_bool("allow_private_networks")
        .unwrap_or(false);
    // The policy's URL rules are checked first, as on the reference: with any rule, a
    // URL that is not http(s) is theirs to refuse (403 `url_not_allowed`).
    let has_rules = allow.is_some() || deny.is_some() || block_private;
    if allow.is_some() || deny.is_some() {
        // URL lists speak of http(s) pages: any other scheme (file:, javascript:,
        // ftp:) is outside them, as on the reference; so is what is no URL at all.
        let lower = url.trim().to_ascii_lowercase();
        let rest = lower
            .strip_prefix("https://")
            .or_else(|| lower.strip_prefix("http://"));
        let host = rest.map(|r| r.split(['/', '?', '#']).next().unwrap_or(""));
        // about:blank reaches no network (docs/policy.md).
        if host.is_none_or(str::is_empty) && lower != "about:blank" {
            return Err(url_refused(format!(
                "URL {url} is refused: only http(s) URLs with a host are allowed where the policy sets url_allow or url_deny"
            )));
        }
    }
    match guard::check(&url, allow.as_deref(), deny.as_deref(), block_private) {
        Err(Refusal::Invalid(message)) if has_rules => return Err(url_refused(message)),
        // Without rules the default check below words it, unless it is off.
        Err(Refusal::Invalid(message)) if allow_private => {
            return Err(ApiError::bad_request(message).with_code("url_invalid"))
        }
        Err(Refusal::Invalid(_)) => {}
        Err(Refusal::Denied(message)) => return Err(url_refused(message)),
        Ok(Verdict::Allowed) => {}
        Ok(Verdict::Resolve { host, port }) => {
            let lookup_host = host.clone();
            let lookup = crate::runtime::blocking(move || {
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
    if !block_private && !allow_private {
        match guard::check_default(&url) {
            Err(Refusal::Invalid(message)) => {
                return Err(ApiError::bad_request(message).with_code("url_invalid"))
            }
            Err(Refusal::Denied(message)) => {
                return Err(ApiError::new(403, "PolicyDenied", message)
                    .with_code("url_denied")
                    .with_field("endpoint", "browser_navigate"))
            }
            Ok(()) => {}
        }
    }
    run(&call, Op::Navigate { url, wait_until }, timeout).await
}

async fn screenshot(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    // The reference's leniency: any format but jpeg is png.
    let jpeg = args
        .str("format")
        .is_some_and(|f| f.eq_ignore_ascii_case("jpeg"));
    let op = Op::Screenshot {
        selector: selector(&args)?,
        full_page: args.bool("full_page").unwrap_or(true),
        jpeg,
    };
    run(&call, op, timeout(&args)).await
}

async fn click(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let name = args.str("button").unwrap_or("left");
    let button = MouseButton::parse(name).ok_or_else(|| {
        ApiError::bad_request(format!(
            "button must be left, right or middle, not {name:?}"
        ))
    })?;
    let op = Op::Click {
        selector: selector(&args)?.unwrap_or_default(),
        button,
        // Declared from 1 to MAX_CLICKS.
        click_count: args.uint("click_count").unwrap_or(1) as u32,
    };
    run(&call, op, timeout(&args)).await
}

async fn fill(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let op = Op::Fill {
        selector: selector(&args)?.unwrap_or_default(),
        value: args.string("value"),
    };
    run(&call, op, timeout(&args)).await
}

/// Between two typed keys, as on the reference (Playwright's `type` with `delay=50`).
const DEFAULT_TYPE_DELAY_MS: f64 = 50.0;

async fn type_text(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let selector = selector(&args)?;
    let clear = args.flag("clear");
    if clear && selector.is_none() {
        return Err(ApiError::bad_request(
            "clear needs a selector: name the element to empty",
        ));
    }
    let delay_ms = args
        .number("delay_ms")
        .or_else(|| args.number("delay"))
        .unwrap_or(DEFAULT_TYPE_DELAY_MS);
    let op = Op::Type {
        selector,
        text: args.string("text"),
        delay: Duration::from_secs_f64(delay_ms / 1000.0),
        clear,
    };
    run(&call, op, timeout(&args)).await
}

async fn press(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let chord =
        keys::parse_chord(args.str("key").unwrap_or_default()).map_err(ApiError::bad_request)?;
    let op = Op::Press {
        chord,
        selector: selector(&args)?,
    };
    run(&call, op, timeout(&args)).await
}

async fn scroll(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let target = selector(&args)?;
    let (dx, dy) = (args.number("dx"), args.number("dy"));
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
    run(&call, op, timeout(&args)).await
}

async fn evaluate(call: Call) -> Result<Response, ApiError> {
    let mut args = call.args()?;
    let expression = match args.str("expression") {
        Some(expression) => expression.to_string(),
        None => args.string("script"),
    };
    if expression.trim().is_empty() {
        return Err(ApiError::bad_request(
            "expression (or script, as the reference names it) is required and must not be empty",
        ));
    }
    let timeout = timeout(&args);
    let op = Op::Evaluate {
        expression,
        arg: args.take("arg"),
    };
    run(&call, op, timeout).await
}

async fn wait(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let name = args.str("state").unwrap_or("visible");
    let state = ElementState::parse(name).ok_or_else(|| {
        ApiError::bad_request(format!(
            "state must be attached, detached, visible or hidden, not {name:?}"
        ))
    })?;
    let op = Op::Wait {
        selector: selector(&args)?.unwrap_or_default(),
        state,
    };
    run(&call, op, timeout(&args)).await
}

async fn content(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let text = match args.str("type").unwrap_or("html") {
        "html" => false,
        "text" => true,
        other => {
            return Err(ApiError::bad_request(format!(
                "type must be html or text, not {other:?}"
            )))
        }
    };
    run(&call, Op::Content { text }, timeout(&args)).await
}

async fn text(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let selector = args.str("selector").map(str::to_string);
    run(&call, Op::Text { selector }, timeout(&args)).await
}

async fn history(call: Call, step: HistoryStep) -> Result<Response, ApiError> {
    let args = call.args()?;
    run(&call, Op::History(step), timeout(&args)).await
}

async fn pdf(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let format = args.str("format").unwrap_or("A4");
    let paper = crate::browser::paper_size(format).ok_or_else(|| {
        ApiError::bad_request(format!(
            "Unknown paper format: {format} (use Letter, Legal, Tabloid, Ledger or A0 to A6)"
        ))
    })?;
    let op = Op::Pdf {
        paper,
        landscape: args.flag("landscape"),
    };
    run(&call, op, timeout(&args)).await
}

async fn console(call: Call) -> Result<Response, ApiError> {
    run(
        &call,
        Op::Console,
        Duration::from_millis(DEFAULT_TIMEOUT_MS),
    )
    .await
}

async fn info(call: Call) -> Result<Response, ApiError> {
    run(&call, Op::Info, Duration::from_millis(DEFAULT_TIMEOUT_MS)).await
}

async fn close(call: Call) -> Result<Response, ApiError> {
    run(&call, Op::Close, Duration::from_millis(DEFAULT_TIMEOUT_MS)).await
}

/// The group's state: the one Chromium page (started on first use), stopped at
/// shutdown.
pub fn registrar() -> crate::app::Registrar {
    Box::new(|setup| {
        let browser = std::sync::Arc::new(crate::browser::Browser::new(
            setup.config.browser_path.clone(),
            setup.children.clone(),
        ));
        let stopping = browser.clone();
        setup.on_shutdown(move || stopping.stop());
        setup.provide(browser);
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refusal(id: &str, query: &[(&str, &str)], body: Value) -> String {
        match crate::routes::declared_args(&endpoints(), id, query, body) {
            Ok(_) => panic!("{id} took it"),
            Err(sentence) => sentence,
        }
    }

    /// The declarations keep the sentences the hand-written checks said.
    #[test]
    fn refusals_keep_their_sentences() {
        assert_eq!(
            refusal("browser_navigate", &[], json!({})),
            "url is required"
        );
        assert_eq!(
            refusal("browser_navigate", &[], json!({"url": 1})),
            "url must be a string"
        );
        assert_eq!(
            refusal(
                "browser_navigate",
                &[],
                json!({"url": "x", "wait_until": 2})
            ),
            "wait_until must be a string"
        );
        for timeout in [json!(0), json!(-1), json!(600_001)] {
            assert_eq!(
                refusal("browser_back", &[], json!({"timeout": timeout})),
                TIMEOUT_SENTENCE
            );
        }
        assert_eq!(
            refusal("browser_back", &[], json!({"timeout": "soon"})),
            "timeout must be a number"
        );
        assert_eq!(
            refusal("browser_content", &[("timeout", "soon")], json!(null)),
            "timeout must be a number of milliseconds"
        );
        assert_eq!(
            refusal("browser_text", &[("timeout", "0")], json!(null)),
            TIMEOUT_SENTENCE
        );
        assert!(TIMEOUT_SENTENCE.ends_with(&format!("at most {MAX_TIMEOUT_MS}")));
        assert_eq!(
            refusal("browser_click", &[], json!({})),
            "selector is required (a CSS selector)"
        );
        assert_eq!(
            refusal("browser_screenshot", &[], json!({"selector": 1})),
            "selector must be a string"
        );
        for count in [json!(0), json!(11), json!(1.5), json!("2")] {
            assert_eq!(
                refusal(
                    "browser_click",
                    &[],
                    json!({"selector": "a", "click_count": count})
                ),
                format!("click_count must be a whole number from 1 to {MAX_CLICKS}")
            );
        }
        assert_eq!(
            refusal("browser_screenshot", &[], json!({"full_page": "yes"})),
            "full_page must be true or false"
        );
        assert_eq!(
            refusal("browser_fill", &[], json!({"selector": "a"})),
            "value is required"
        );
        assert_eq!(
            refusal(
                "browser_type",
                &[],
                json!({"text": "a", "delay_ms": 10_001})
            ),
            "delay_ms must be from 0 to 10000"
        );
        assert_eq!(
            refusal(
                "browser_type",
                &[],
                json!({"text": "a", "delay_ms": "slow"})
            ),
            "delay_ms must be a number"
        );
        assert_eq!(
            refusal(
                "browser_click",
                &[],
                json!({"selector": "a", "timeout": "1"})
            ),
            "timeout must be a number"
        );
        assert_eq!(refusal("browser_type", &[], json!({})), "text is required");
        assert_eq!(refusal("browser_press", &[], json!({})), "key is required");
        assert_eq!(
            refusal("browser_scroll", &[], json!({"dx": "1"})),
            "dx must be a number"
        );
        assert_eq!(
            refusal(
                "browser_wait",
                &[],
                json!({"selector": "a", "state": false})
            ),
            "state must be a string"
        );
    }

    #[test]
    fn defaults_are_the_old_ones() {
        let args = crate::routes::declared_args(
            &endpoints(),
            "browser_click",
            &[],
            json!({"selector": "a"}),
        )
        .unwrap();
        assert_eq!(timeout(&args), Duration::from_millis(DEFAULT_TIMEOUT_MS));
        assert_eq!(args.uint("click_count"), Some(1));
        assert_eq!(args.str("button"), Some("left"));
        let args = crate::routes::declared_args(
            &endpoints(),
            "browser_text",
            &[("timeout", "250")],
            json!(null),
        )
        .unwrap();
        assert_eq!(timeout(&args), Duration::from_millis(250));
        let args = crate::routes::declared_args(
            &endpoints(),
            "browser_evaluate",
            &[],
            json!({"expression": "x", "arg": [1]}),
        )
        .unwrap();
        assert_eq!(args.value("arg"), Some(&json!([1])));
    }
}
