//! The browser group against the real binary and Debian's real Chromium, on pages a small
//! HTTP server in this test process serves on 127.0.0.1 (it records every request, so a
//! test can tell what Chromium really fetched or submitted).

use std::io::Write;
use std::time::Duration;

use serde_json::{json, Value};

use crate::on_both_drivers;
use crate::support::{request_at, serve_stub, unused_addr, Launch, Server, Stub, TempDir};

/// The page server, with each request it received: method, path and body.
type Pages = Stub<(String, String, String)>;

impl Pages {
    fn requests_for(&self, path: &str) -> Vec<(String, String, String)> {
        let seen = self.seen.lock().unwrap();
        seen.iter().filter(|(_, p, _)| p == path).cloned().collect()
    }
}

const HOME: &str = r#"<!doctype html><html><head><title>Home</title></head><body>
<p id="para">Hello <b>pages</b></p>
<button id="btn" onclick="document.body.dataset.clicks = (+(document.body.dataset.clicks||0) + 1)"
  ondblclick="document.body.dataset.dbl = 'yes'">Press</button>
<form id="form" method="post" action="/submit">
  <input id="q" name="q" oninput="window.inputs = (window.inputs||0) + 1" onchange="window.changes = (window.changes||0) + 1">
</form>
<textarea id="notes"></textarea>
<input id="box" type="checkbox">
<div id="hidden" style="display:none">secret</div>
<div style="height: 2000px"></div>
<p id="bottom">bottom</p>
</body></html>"#;

const LATE: &str = r#"<!doctype html><html><head><title>Late</title></head><body>
<script>setTimeout(() => { const d = document.createElement('div'); d.id = 'late'; d.textContent = 'here'; document.body.appendChild(d); }, 300);</script>
</body></html>"#;

const TALL: &str = r#"<!doctype html><html><head><title>Tall</title><style>body{margin:0}</style></head><body>
<div style="height: 3000px; width: 100px; background: #36c"></div></body></html>"#;

const SHAPES: &str = r#"<!doctype html><html><head><title>Shapes</title><style>body{margin:0}</style></head><body>
<div style="height: 40px"></div>
<div id="shape" style="width: 200px; height: 100px; margin-left: 30px; background: #c33"></div>
</body></html>"#;

const LOGS: &str = r#"<!doctype html><html><head><title>Logs</title></head><body>
<script>console.log("one", 2, null, undefined); console.warn("careful"); console.error("bad", true);</script>
</body></html>"#;

fn page_for(path: &str) -> (u16, String) {
    match path {
        "/" => (200, HOME.into()),
        "/late" => (200, LATE.into()),
        "/tall" => (200, TALL.into()),
        "/shapes" => (200, SHAPES.into()),
        "/logs" => (200, LOGS.into()),
        "/one" | "/two" | "/three" => (
            200,
            format!(
                "<!doctype html><title>Page {}</title><p>{path}</p>",
                &path[1..]
            ),
        ),
        "/submit" => (
            200,
            "<!doctype html><title>Thanks</title><p>got it</p>".into(),
        ),
        _ => (
            404,
            "<!doctype html><title>Missing</title><p>no such page</p>".into(),
        ),
    }
}

/// Serves the test pages until the test process ends, recording each request.
fn serve_pages() -> Pages {
    serve_stub(
        Some(Duration::from_secs(10)),
        |received| {
            let path_only = received.target.split('?').next().unwrap_or("").to_string();
            (
                received.method.clone(),
                path_only,
                String::from_utf8_lossy(&received.body).into_owned(),
            )
        },
        |mut stream, _, (_, path_only, _)| {
            let (status, html) = page_for(&path_only);
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{html}",
                html.len()
            );
        },
    )
}

/// A server whose browser may open this machine's test pages (by default, as on the
/// reference, loopback and private addresses are refused).
fn browser_server(driver: &'static str) -> Server {
    Launch::new(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", "browser")
        .env("ABX_SERVER_POLICY", OPEN_TO_THIS_MACHINE)
        .start()
}

const OPEN_TO_THIS_MACHINE: &str =
    r#"{"endpoints": {"browser_navigate": {"allow_private_networks": true}}}"#;

fn eval(server: &Server, expression: &str) -> Value {
    let (status, body) = server.post_json("/browser/evaluate", json!({"expression": expression}));
    assert_eq!(status, 200, "{expression}: {body}");
    body["result"].clone()
}

fn navigate(server: &Server, url: &str) -> Value {
    let (status, body) = server.post_json("/browser/navigate", json!({"url": url}));
    assert_eq!(status, 200, "{url}: {body}");
    body
}

/// Width and height of a base64 PNG, read from its header.
fn png_size(base64: &str) -> (u32, u32) {
    let bytes = decode_base64(&base64[..32]);
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    (
        u32::from_be_bytes(bytes[16..20].try_into().unwrap()),
        u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
    )
}

fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let clean: Vec<u8> = text.bytes().filter(|b| *b != b'=').collect();
    let mut out = Vec::new();
    for chunk in clean.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= (value(*c) as u32) << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

fn navigation_content_and_history(driver: &'static str) {
    let pages = serve_pages();
    let server = browser_server(driver);
    let (status, info) = server.get_json("/browser/info");
    assert_eq!(status, 200);
    assert_eq!(
        info["running"], false,
        "an idle server runs no Chromium: {info}"
    );

    let home = navigate(&server, &pages.url("/"));
    assert_eq!(home["title"], "Home");
    assert_eq!(home["status"], 200);
    assert_eq!(home["url"], pages.url("/"));
    let missing = navigate(&server, &pages.url("/nope"));
    assert_eq!(
        (missing["status"].clone(), missing["title"].clone()),
        (json!(404), json!("Missing"))
    );

    for wait_until in ["domcontentloaded", "networkidle", "commit"] {
        let (status, body) = server.post_json(
            "/browser/navigate",
            json!({"url": pages.url("/one"), "wait_until": wait_until}),
        );
        assert_eq!(
            (status, body["status"].clone()),
            (200, json!(200)),
            "{wait_until}: {body}"
        );
    }
    let (status, body) = server.post_json(
        "/browser/navigate",
        json!({"url": pages.url("/"), "wait_until": "soon"}),
    );
    assert_eq!(
        (status, body["type"].clone()),
        (400, json!("ValueError")),
        "{body}"
    );
    let (status, body) = server.post_json("/browser/navigate", json!({}));
    assert_eq!(status, 400, "{body}");

    // A port nobody listens on: Chromium's own error name reaches the caller.
    let closed = unused_addr();
    let (status, body) = server.post_json(
        "/browser/navigate",
        json!({"url": format!("http://{closed}/")}),
    );
    assert_eq!(status, 500, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("net::ERR_CONNECTION_REFUSED"),
        "{body}"
    );

    navigate(&server, &pages.url("/"));
    let (status, content) = server.get_json("/browser/content");
    assert_eq!(status, 200);
    assert_eq!(content["title"], "Home");
    // `content`, as the reference answers (its client reads that field).
    let html = content["content"].as_str().unwrap();
    assert!(
        html.starts_with("<!DOCTYPE html>") && html.contains("id=\"para\""),
        "{html}"
    );
    let (_, visible) = server.get_json("/browser/content?type=text");
    let visible = visible["content"].as_str().unwrap();
    assert!(
        visible.contains("Hello pages") && !visible.contains("<"),
        "{visible}"
    );
    assert_eq!(server.get_json("/browser/content?type=pdf").0, 400);
    // The reference's name for the expression, which its client sends.
    let (status, body) = server.post_json("/browser/evaluate", json!({"script": "document.title"}));
    assert_eq!(
        (status, body["result"].clone()),
        (200, json!("Home")),
        "{body}"
    );
    let (status, _) = server.post_json("/browser/evaluate", json!({}));
    assert_eq!(status, 400);
    let (_, text) = server.get_json("/browser/text?selector=%23para");
    assert_eq!(text["text"], "Hello pages");
    let (_, all) = server.get_json("/browser/text");
    assert!(
        all["text"].as_str().unwrap().contains("Hello pages"),
        "{all}"
    );
    let (status, body) = server.get_json("/browser/text?selector=%23nothing");
    assert_eq!(status, 404, "{body}");

    navigate(&server, &pages.url("/one"));
    navigate(&server, &pages.url("/two"));
    let (status, back) = server.post_json("/browser/back", json!({}));
    assert_eq!(
        (status, back["title"].clone()),
        (200, json!("Page one")),
        "{back}"
    );
    let (_, forward) = server.post_json("/browser/forward", json!({}));
    assert_eq!(forward["url"], pages.url("/two"));
    let fetched = pages.requests_for("/two").len();
    let (_, reloaded) = server.post_json("/browser/reload", json!({}));
    assert_eq!(reloaded["title"], "Page two");
    assert_eq!(
        pages.requests_for("/two").len(),
        fetched + 1,
        "reload fetches the page again"
    );

    let (_, info) = server.get_json("/browser/info");
    assert_eq!(info["running"], true);
    assert_eq!(info["url"], pages.url("/two"));
    assert!(
        info["version"].as_str().unwrap().contains("Chrome"),
        "{info}"
    );
    assert_eq!(info["viewport"], json!({"width": 1280, "height": 720}));
}

fn input_routes_drive_the_page(driver: &'static str) {
    let pages = serve_pages();
    let server = browser_server(driver);
    navigate(&server, &pages.url("/"));

    let (status, body) = server.post_json("/browser/click", json!({"selector": "#btn"}));
    assert_eq!(
        (status, body),
        (200, json!({"clicked": true, "selector": "#btn"}))
    );
    assert_eq!(eval(&server, "document.body.dataset.clicks"), "1");
    let (status, _) = server.post_json(
        "/browser/click",
        json!({"selector": "#btn", "click_count": 2}),
    );
    assert_eq!(status, 200);
    assert_eq!(eval(&server, "document.body.dataset.dbl"), "yes");
    let (status, body) = server.post_json(
        "/browser/click",
        json!({"selector": "#btn", "button": "sideways"}),
    );
    assert_eq!(status, 400, "{body}");

    let (status, _) =
        server.post_json("/browser/fill", json!({"selector": "#q", "value": "hello"}));
    assert_eq!(status, 200);
    assert_eq!(
        eval(
            &server,
            "[document.querySelector('#q').value, window.inputs, window.changes]"
        ),
        json!(["hello", 1, 1])
    );
    let (status, body) =
        server.post_json("/browser/fill", json!({"selector": "#box", "value": "x"}));
    assert_eq!(status, 400, "{body}");

    let (status, body) = server.post_json(
        "/browser/type",
        json!({"selector": "#notes", "text": "abc", "delay_ms": 5}),
    );
    assert_eq!(
        (status, body),
        (
            200,
            json!({"typed": true, "selector": "#notes", "text": "abc"})
        )
    );
    assert_eq!(
        eval(&server, "document.querySelector('#notes').value"),
        "abc"
    );
    // `clear` empties the field first (the reference's client sends it); `delay` is
    // the reference's name for the pause between keys.
    let (status, _) = server.post_json(
        "/browser/type",
        json!({"selector": "#notes", "text": "xy", "clear": true, "delay": 1}),
    );
    assert_eq!(status, 200);
    assert_eq!(
        eval(&server, "document.querySelector('#notes').value"),
        "xy"
    );
    let (status, body) = server.post_json("/browser/type", json!({"text": "q", "clear": true}));
    assert_eq!(status, 400, "{body}");
    server.post_json(
        "/browser/type",
        json!({"selector": "#notes", "text": "abc", "clear": true, "delay": 0}),
    );
    // Control+A selects what was typed; the next key replaces it.
    let (status, _) = server.post_json(
        "/browser/press",
        json!({"key": "Control+A", "selector": "#notes"}),
    );
    assert_eq!(status, 200);
    server.post_json("/browser/type", json!({"text": "Z"}));
    assert_eq!(eval(&server, "document.querySelector('#notes').value"), "Z");
    let (status, body) = server.post_json("/browser/press", json!({"key": "Hyper+Q"}));
    assert_eq!(status, 400, "{body}");

    // Enter in the form's field submits it: the page server receives the POST.
    server.post_json(
        "/browser/fill",
        json!({"selector": "#q", "value": "rust io_uring"}),
    );
    let (status, _) = server.post_json("/browser/press", json!({"key": "Enter", "selector": "#q"}));
    assert_eq!(status, 200);
    let submitted = pages.requests_for("/submit");
    assert_eq!(submitted.len(), 1, "{submitted:?}");
    assert_eq!(submitted[0].0, "POST");
    assert_eq!(submitted[0].2, "q=rust+io_uring");
    let (_, info) = server.get_json("/browser/info");
    assert_eq!(
        info["title"], "Thanks",
        "the press waited for the navigation it started"
    );

    navigate(&server, &pages.url("/"));
    let (status, scrolled) = server.post_json("/browser/scroll", json!({"dy": 500}));
    assert_eq!(
        (status, scrolled["scroll_y"].clone()),
        (200, json!(500)),
        "{scrolled}"
    );
    let (_, scrolled) = server.post_json("/browser/scroll", json!({"selector": "#bottom"}));
    assert!(
        scrolled["scroll_y"].as_f64().unwrap() > 1000.0,
        "{scrolled}"
    );
    let (status, _) = server.post_json("/browser/scroll", json!({}));
    assert_eq!(status, 400);

    assert_eq!(
        eval(&server, "new Promise(r => setTimeout(() => r(6 * 7), 50))"),
        42
    );
    let (_, called) = server.post_json(
        "/browser/evaluate",
        json!({"expression": "async ({a, b}) => a + b", "arg": {"a": 2, "b": 3}}),
    );
    assert_eq!(called["result"], 5);
    assert_eq!(
        eval(&server, "({n: 1, list: [true, null]})"),
        json!({"n": 1, "list": [true, null]})
    );
    assert_eq!(eval(&server, "undefined"), Value::Null);
    // A function is evaluated once and called by reference: no side effect twice, and
    // a trailing semicolon is fine.
    let (_, once) = server.post_json("/browser/evaluate",
        json!({"expression": "(window.runs = (window.runs || 0) + 1, (x) => [x * 2, window.runs]);", "arg": 21}),
    );
    assert_eq!(once["result"], json!([42, 1]), "{once}");
    let (status, body) = server.post_json(
        "/browser/evaluate",
        json!({"expression": "missingName + 1"}),
    );
    assert_eq!(status, 500);
    assert!(
        body["error"].as_str().unwrap().contains("ReferenceError"),
        "{body}"
    );

    for (path, body) in [
        ("/browser/click", json!({"selector": "#none"})),
        ("/browser/fill", json!({"selector": "#none", "value": "v"})),
        ("/browser/type", json!({"selector": "#none", "text": "v"})),
        ("/browser/press", json!({"selector": "#none", "key": "a"})),
        ("/browser/scroll", json!({"selector": "#none"})),
        ("/browser/screenshot", json!({"selector": "#none"})),
    ] {
        let (status, answer) = server.post_json(path, body);
        assert_eq!(status, 404, "{path}: {answer}");
        assert_eq!(
            answer["error"],
            "Selector not found: no element matches #none"
        );
    }
    let (status, body) = server.post_json("/browser/click", json!({"selector": "p[["}));
    assert_eq!(status, 400, "{body}");
    // Found but never visible: the wait for visibility runs out.
    let (status, body) = server.post_json(
        "/browser/click",
        json!({"selector": "#hidden", "timeout": 300}),
    );
    assert_eq!(
        (status, body["type"].clone()),
        (408, json!("TimeoutError")),
        "{body}"
    );
}

fn waits_and_screenshots(driver: &'static str) {
    let pages = serve_pages();
    let server = browser_server(driver);
    navigate(&server, &pages.url("/late"));
    let (status, body) = server.post_json("/browser/wait", json!({"selector": "#late"}));
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.post_json(
        "/browser/wait",
        json!({"selector": "#never", "timeout": 400}),
    );
    assert_eq!(status, 408, "{body}");
    assert_eq!(
        body,
        json!({"error": "Timeout 400ms exceeded.", "type": "TimeoutError"})
    );
    let (status, _) = server.post_json(
        "/browser/wait",
        json!({"selector": "#never", "state": "detached"}),
    );
    assert_eq!(status, 200);
    let (status, _) = server.post_json(
        "/browser/wait",
        json!({"selector": "#late", "state": "gone"}),
    );
    assert_eq!(status, 400);

    let (status, shot) = server.post_json("/browser/screenshot", json!({"full_page": false}));
    assert_eq!(status, 200);
    let data = shot["image_base64"].as_str().unwrap();
    assert_eq!(png_size(data), (1280, 720));
    assert_eq!(
        (
            shot["width"].clone(),
            shot["height"].clone(),
            shot["format"].clone()
        ),
        (json!(1280), json!(720), json!("png"))
    );
    assert_eq!(shot["bytes"], decode_base64(data).len());

    navigate(&server, &pages.url("/tall"));
    // The whole page is the default, as on the reference.
    let (_, full) = server.post_json("/browser/screenshot", json!({}));
    let (width, height) = png_size(full["image_base64"].as_str().unwrap());
    assert_eq!((width, height), (1280, 3000), "{}", full["height"]);
    // JPEG when asked (the reference's `format`), sized as captured.
    let (status, jpeg) = server.post_json(
        "/browser/screenshot",
        json!({"format": "jpeg", "full_page": false}),
    );
    assert_eq!(status, 200, "{jpeg}");
    let bytes = decode_base64(jpeg["image_base64"].as_str().unwrap());
    assert_eq!(&bytes[..3], b"\xff\xd8\xff", "a JPEG's first bytes");
    assert_eq!(
        (
            jpeg["format"].clone(),
            jpeg["width"].clone(),
            jpeg["height"].clone()
        ),
        (json!("jpeg"), json!(1280), json!(720))
    );

    navigate(&server, &pages.url("/shapes"));
    let (_, element) = server.post_json("/browser/screenshot", json!({"selector": "#shape"}));
    assert_eq!(
        png_size(element["image_base64"].as_str().unwrap()),
        (200, 100)
    );
}

/// The reference's `pdf` and `console`: Playwright's paper formats and page count, the
/// console's messages taken once, and no Chromium started just to say there are none.
fn pdf_and_console(driver: &'static str) {
    let pages = serve_pages();
    let server = browser_server(driver);
    assert_eq!(server.get("/browser/console").json(), json!({"logs": []}));
    assert_eq!(server.get("/browser/info").json()["running"], false);

    navigate(&server, &pages.url("/logs"));
    let logs = server.get("/browser/console").json()["logs"].clone();
    let seen: Vec<(String, String)> = logs
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            assert!(l["timestamp"].as_f64().unwrap() > 1.7e9, "{l}");
            (
                l["type"].as_str().unwrap().into(),
                l["text"].as_str().unwrap().into(),
            )
        })
        .collect();
    let expected = [
        ("log", "one 2 null undefined"),
        ("warning", "careful"),
        ("error", "bad true"),
    ];
    assert_eq!(
        seen,
        expected.map(|(t, x)| (t.to_string(), x.to_string())),
        "{logs}"
    );
    assert_eq!(server.get("/browser/console").json(), json!({"logs": []}));

    let (status, pdf) = server.post_json("/browser/pdf", json!({}));
    assert_eq!(status, 200, "{pdf}");
    let bytes = decode_base64(pdf["pdf_base64"].as_str().unwrap());
    assert!(bytes.starts_with(b"%PDF-"));
    assert_eq!(pdf["pages"], 1);
    // Letter in landscape: 11 by 8.5 inches, 792 by 612 points.
    let (_, wide) = server.post_json(
        "/browser/pdf",
        json!({"format": "letter", "landscape": true}),
    );
    let wide =
        String::from_utf8_lossy(&decode_base64(wide["pdf_base64"].as_str().unwrap())).into_owned();
    assert!(
        wide.contains("/MediaBox [0 0 792 612]"),
        "{}",
        &wide[..wide.len().min(600)]
    );
    // 3,000 pixels at 96 per inch over A4's 11.7 inches: 3 pages.
    navigate(&server, &pages.url("/tall"));
    let (_, tall) = server.post_json("/browser/pdf", json!({"format": "A4"}));
    assert_eq!(tall["pages"], 3, "{}", tall["pages"]);
    let (status, refused) = server.post_json("/browser/pdf", json!({"format": "B5"}));
    assert_eq!(
        (status, refused["type"].as_str()),
        (400, Some("ValueError")),
        "{refused}"
    );
}

#[test]
fn without_chromium_the_routes_answer_503_with_the_hint() {
    let server = Launch::new("uring")
        .env("ABX_SERVER_ENABLED_GROUPS", "browser")
        .env("ABX_BROWSER_PATH", "/nonexistent/chromium")
        .start();
    // The reference's URL guard runs before Chromium is needed: this machine, private
    // and link-local addresses are refused, and only http(s) URLs open.
    for (url, status, code) in [
        ("http://127.0.0.1:9/", 403, "url_denied"),
        ("http://localhost/", 403, "url_denied"),
        (
            "http://169.254.169.254/latest/meta-data/",
            403,
            "url_denied",
        ),
        ("http://[::ffff:10.0.0.1]/", 403, "url_denied"),
        ("file:///etc/passwd", 400, "url_invalid"),
        ("data:text/html,<b>x</b>", 400, "url_invalid"),
    ] {
        let (got, body) = server.post_json("/browser/navigate", json!({"url": url}));
        assert_eq!(
            (got, body["code"].as_str()),
            (status, Some(code)),
            "{url}: {body}"
        );
    }
    let (status, body) = server.post_json("/browser/navigate", json!({"url": "about:blank"}));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["type"], "RuntimeError");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("apt-get install chromium"),
        "{body}"
    );
    assert!(
        body["error"].as_str().unwrap().contains("ABX_BROWSER_PATH"),
        "{body}"
    );
    let (_, info) = server.get_json("/browser/info");
    assert_eq!(info["running"], false);
}

#[test]
fn the_group_is_opt_in() {
    let server = Server::start("uring");
    let (status, body) = server.post_json("/browser/navigate", json!({"url": "about:blank"}));
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["code"], "endpoint_disabled");
    assert_eq!(body["rule"], "default:opt-in:browser");
    let (_, caps) = server.get_json("/capabilities");
    assert_eq!(caps["groups"]["browser"], false);
    assert_eq!(
        // The reference's 8 and this server's 10.
        caps["group_summary"]["browser"]["total"],
        18,
        "{}",
        caps["group_summary"]
    );
    let on = browser_server("uring");
    let (_, caps) = on.get_json("/capabilities");
    assert_eq!(caps["group_summary"]["browser"]["enabled"], 18);
}

/// Evaluations that each record when they ran, in page time.
fn timed_evaluation(ms: u32) -> Value {
    json!({"expression": format!(
        "new Promise(r => {{ const s = performance.now(); setTimeout(() => r([s, performance.now()]), {ms}); }})"
    )})
}

fn operations_serialise_and_a_full_queue_is_refused(driver: &'static str) {
    let server = browser_server(driver);
    let addr = server.addr;
    let evaluate_at = move |ms: u32| {
        let body = timed_evaluation(ms).to_string();
        request_at(
            addr,
            "POST",
            "/browser/evaluate",
            &[],
            Some(body.as_bytes()),
        )
    };
    navigate(&server, "about:blank");
    let handles: Vec<_> = (0..20)
        .map(|_| {
            std::thread::spawn(move || {
                let reply = evaluate_at(20);
                (reply.status, reply.json())
            })
        })
        .collect();
    // Other routes answer while the page works through its queue.
    for _ in 0..5 {
        assert_eq!(server.get("/health").status, 200);
    }
    let mut spans: Vec<(f64, f64)> = handles
        .into_iter()
        .map(|h| {
            let (status, body) = h.join().unwrap();
            assert_eq!(status, 200, "{body}");
            (
                body["result"][0].as_f64().unwrap(),
                body["result"][1].as_f64().unwrap(),
            )
        })
        .collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    for pair in spans.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "operations overlapped: {pair:?}");
    }

    // More than the queue holds while the page is busy: the overflow is refused at
    // once, the rest all run.
    let busy = std::thread::spawn(move || evaluate_at(1500).status);
    std::thread::sleep(Duration::from_millis(300));
    let handles: Vec<_> = (0..45)
        .map(|_| {
            std::thread::spawn(move || {
                let reply = evaluate_at(5);
                (
                    reply.status,
                    reply.header("retry-after").map(str::to_string),
                    reply.json(),
                )
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(busy.join().unwrap(), 200);
    let refused: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    // 45 behind a busy page, 32 places: 13 refused (fewer only if some arrived late).
    assert!(
        (1..=13).contains(&refused.len()),
        "{} refused",
        refused.len()
    );
    assert!(
        results.iter().all(|r| r.0 == 200 || r.0 == 429),
        "{results:?}"
    );
    assert_eq!(refused[0].1.as_deref(), Some("1"));
    assert_eq!(refused[0].2["code"], "browser_busy");
}

fn a_killed_or_closed_chromium_is_started_again(driver: &'static str) {
    let pages = serve_pages();
    let server = browser_server(driver);
    navigate(&server, &pages.url("/one"));
    let (_, info) = server.get_json("/browser/info");
    let pid = info["pid"].as_i64().unwrap() as i32;
    nix_kill(-pid);
    // The next call finds it gone and starts a new one.
    let mut answered = None;
    for _ in 0..3 {
        let (status, body) =
            server.post_json("/browser/navigate", json!({"url": pages.url("/two")}));
        if status == 200 {
            answered = Some(body);
            break;
        }
        assert_eq!(
            status, 500,
            "only the call that met the crash may fail: {body}"
        );
    }
    assert_eq!(answered.expect("Chromium came back")["title"], "Page two");
    let (_, info) = server.get_json("/browser/info");
    let second = info["pid"].as_i64().unwrap();
    assert_ne!(second as i32, pid);

    let (status, closed) = server.post_json("/browser/close", json!({}));
    assert_eq!((status, closed), (200, json!({"closed": true})));
    let (_, info) = server.get_json("/browser/info");
    assert_eq!(info["running"], false);
    assert!(
        std::fs::metadata(format!("/proc/{second}")).is_err(),
        "close ended the process and reaped it"
    );
    assert_eq!(
        navigate(&server, &pages.url("/three"))["title"],
        "Page three"
    );
}

fn caller_environment_and_departures_do_not_steer_the_browser(driver: &'static str) {
    let pages = serve_pages();
    let server = browser_server(driver);
    // A proxy on a closed port, and launcher flags that would open a debugging port:
    // set for children, kept from Chromium.
    let closed = unused_addr();
    let (status, _) = server.post_json(
        "/env",
        json!({"vars": {
            "http_proxy": format!("http://{closed}"),
            "all_proxy": format!("http://{closed}"),
            "CHROMIUM_FLAGS": "--remote-debugging-port=9333",
        }}),
    );
    assert_eq!(status, 200);
    assert_eq!(navigate(&server, &pages.url("/one"))["title"], "Page one");
    assert!(
        std::net::TcpStream::connect("127.0.0.1:9333").is_err(),
        "a debugging port opened"
    );

    // A client that leaves mid-wait frees the page for the next caller.
    let mut leaving = server.connect();
    let body = json!({"selector": "#never", "timeout": 60000}).to_string();
    write!(
        leaving,
        "POST /browser/wait HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(leaving);
    // Were the wait still running, this would queue behind it for a minute and the
    // client's 20 s read timeout would fail the test.
    assert_eq!(eval(&server, "1 + 1"), 2);
}

fn nix_kill(target: i32) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", "--", &target.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn block_private_networks_refuses_this_machine(driver: &'static str) {
    let pages = serve_pages();
    let dir = TempDir::new("browserpolicy");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "groups: {browser: true}\nendpoints:\n  browser_navigate:\n    block_private_networks: true\n    url_deny: [\"*.blocked.example\"]\n",
    )
    .unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    let port = pages.addr.port();
    for url in [
        format!("http://127.0.0.1:{port}/"),
        format!("http://[::1]:{port}/"),
        format!("http://localhost:{port}/"),
        format!("http://2130706433:{port}/"),
        "file:///etc/passwd".to_string(),
        "http://www.blocked.example/".to_string(),
    ] {
        let (status, body) = server.post_json("/browser/navigate", json!({"url": url}));
        assert_eq!(status, 403, "{url}: {body}");
        assert_eq!(body["code"], "url_not_allowed", "{body}");
        assert_eq!(body["endpoint"], "browser_navigate");
    }
    assert!(
        pages.seen.lock().unwrap().is_empty(),
        "a refused URL reached the page server"
    );
    // A data: page could send itself anywhere with a meta refresh.
    let (status, body) = server.post_json("/browser/navigate",
        json!({"url": format!("data:text/html,<meta http-equiv=refresh content='0;url=http://127.0.0.1:{port}/'>")}),
    );
    assert_eq!(status, 403, "{body}");
    // What is no URL at all is outside the policy's rules too (403, as the reference).
    let (status, body) = server.post_json("/browser/navigate", json!({"url": "not a url"}));
    assert_eq!(
        (status, body["code"].clone()),
        (403, json!("url_not_allowed")),
        "{body}"
    );
    let (_, info) = server.get_json("/browser/info");
    assert_eq!(info["running"], false, "Chromium never saw a refused URL");
    // about:blank reaches no network and is allowed.
    assert_eq!(navigate(&server, "about:blank")["url"], "about:blank");
}

fn url_allow_lists_what_may_be_opened(driver: &'static str) {
    let pages = serve_pages();
    let dir = TempDir::new("browserallow");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "groups: {{browser: true}}\nendpoints:\n  browser_navigate:\n    allow_private_networks: true\n    url_allow: [\"http://{}/one\"]\n",
            pages.addr
        ),
    )
    .unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    assert_eq!(navigate(&server, &pages.url("/one"))["title"], "Page one");
    let (status, body) = server.post_json("/browser/navigate", json!({"url": pages.url("/two")}));
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("url_allow"),
        "{body}"
    );
    assert!(pages.requests_for("/two").is_empty());
}

/// `url_deny` of an IPv4 address also refuses that address spelled as IPv6
/// (`[::ffff:127.0.0.1]`, `[::127.0.0.1]`) and every loopback name, and the page server
/// is never asked for them.
fn url_deny_sees_ipv4_in_ipv6_and_localhost(driver: &'static str) {
    let pages = serve_pages();
    let port = pages.addr.port();
    let dir = TempDir::new("browserdeny");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "groups: {browser: true}\nendpoints:\n  browser_navigate:\n    allow_private_networks: true\n    url_deny: [\"127.0.0.1\"]\n",
    )
    .unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    for url in [
        format!("http://[::ffff:127.0.0.1]:{port}/one"),
        format!("http://[::ffff:7f00:1]:{port}/one"),
        format!("http://[::127.0.0.1]:{port}/one"),
        format!("http://localhost:{port}/one"),
        format!("http://app.localhost:{port}/one"),
        format!("http://[::1]:{port}/one"),
    ] {
        let (status, body) = server.post_json("/browser/navigate", json!({"url": url}));
        assert_eq!(status, 403, "{url}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains("url_deny"),
            "{url}: {body}"
        );
    }
    assert!(pages.requests_for("/one").is_empty());
}

on_both_drivers!(
    url_deny_sees_ipv4_in_ipv6_and_localhost,
    pdf_and_console,
    navigation_content_and_history,
    input_routes_drive_the_page,
    waits_and_screenshots,
    operations_serialise_and_a_full_queue_is_refused,
    a_killed_or_closed_chromium_is_started_again,
    block_private_networks_refuses_this_machine,
    url_allow_lists_what_may_be_opened,
    caller_environment_and_departures_do_not_steer_the_browser,
);
