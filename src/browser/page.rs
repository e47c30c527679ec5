//! One Chromium and its one page: launching it, speaking to the page over the pipe, and
//! the operations the routes offer, with Playwright's semantics where a caller would
//! notice the difference (a click scrolls the element into view, waits until it is
//! visible and sends real mouse events at its centre; `fill` fires `input` and
//! `change`; a full-page shot covers the layout size; dialogs are dismissed so they
//! never block the page).
//!
//! Everything here blocks the calling thread, which is the browser actor's own.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::cdp::{Incoming, Pipe, PipeError};
use super::keys::{key_for_char, Chord, Key};
use super::op::{BrowserError, HistoryStep, Op, WaitUntil, VIEWPORT};
use crate::process::{spawn, ChildRegistry};

/// How long Chromium may take to start and open its page.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(30);
/// After a click or key press: how long to watch for a navigation it started.
const NAVIGATION_GRACE: Duration = Duration::from_millis(25);
/// Poll interval while waiting for an element to become visible.
const VISIBILITY_POLL: Duration = Duration::from_millis(20);

/// The object group of evaluation results, released after each operation.
const OBJECT_GROUP: &str = "abx";
/// The longest a blocking read waits before checking whether the caller went away.
const ABANDON_CHECK: Duration = Duration::from_millis(100);

/// The install hint a 503 carries.
pub const INSTALL_HINT: &str = "apt-get install chromium";

/// Flags for a headless Chromium that reaches nothing on its own: no background
/// networking, updates or sync (a closed network refuses those, many at a time), no GPU,
/// no back/forward cache (history steps always load the page, so they can be awaited).
const FLAGS: [&str; 19] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--disable-back-forward-cache",
    "--disable-breakpad",
    "--mute-audio",
    "--hide-scrollbars",
    "--password-store=basic",
    "--remote-debugging-pipe",
    // Proxy variables a caller set through POST /env would route every request past
    // the navigation guard.
    "--no-proxy-server",
];

/// The only variables Chromium starts with. Callers can set any variable for children
/// (`POST /env`); Chromium and its launcher read some as instructions (`http_proxy`,
/// `CHROMIUM_FLAGS` with `--remote-debugging-port` or `--host-resolver-rules`), which
/// would undo the pipe's privacy and the navigation guard.
fn chromium_env(env: &[(OsString, OsString)]) -> Vec<(OsString, OsString)> {
    env.iter()
        .filter(|(name, _)| {
            let name = name.to_string_lossy();
            matches!(
                name.as_ref(),
                "PATH" | "HOME" | "LANG" | "LANGUAGE" | "TZ" | "TMPDIR"
            ) || name.starts_with("LC_")
        })
        .cloned()
        .collect()
}

/// Finds the browser: `ABX_BROWSER_PATH` when set, else `chromium` or
/// `chromium-headless-shell` on the children's `PATH`.
fn find_executable(
    configured: Option<&Path>,
    env: &[(OsString, OsString)],
) -> Result<PathBuf, BrowserError> {
    if let Some(path) = configured {
        let usable =
            rustix::fs::access(path, rustix::fs::Access::EXEC_OK).is_ok() && path.is_file();
        if !usable {
            return Err(BrowserError::NotInstalled(format!(
                "ABX_BROWSER_PATH={} is not an executable file; point it at Chromium, or unset it and {INSTALL_HINT}",
                path.display()
            )));
        }
        return Ok(path.to_path_buf());
    }
    let path_var = env
        .iter()
        .find(|(name, _)| name == "PATH")
        .map(|(_, value)| value.clone());
    let root = rustix::fs::open(
        "/",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| BrowserError::Protocol(format!("cannot open /: {e}")))?;
    for name in ["chromium", "chromium-headless-shell"] {
        if let Ok(found) = spawn::find_program(name, path_var.as_deref(), root.as_fd()) {
            return Ok(found);
        }
    }
    Err(BrowserError::NotInstalled(format!(
        "Chromium is not installed (no chromium or chromium-headless-shell on PATH, and ABX_BROWSER_PATH is not set): {INSTALL_HINT}"
    )))
}

/// Where one page's navigation stands, kept up to date from Chromium's events.
#[derive(Default)]
struct PageState {
    /// Lifecycle event names seen per loader (the newest few loaders).
    lifecycle: Vec<(String, Vec<String>)>,
    /// The HTTP status of each loader's document.
    statuses: Vec<(String, u16)>,
    /// Main-frame navigations requested or started.
    navigations: u64,
    /// Main-frame loads that stopped (finished or failed).
    stopped: u64,
    /// `load` events of the main frame.
    loads: u64,
    /// Same-document navigations (history.pushState, #fragment).
    same_document: u64,
    /// The page's renderer crashed or the page was closed.
    gone: Option<String>,
    /// Console messages not yet taken (`/browser/console`), at most [`MAX_CONSOLE`].
    console: Vec<Value>,
}

/// Console messages kept between two `/browser/console` calls, as the reference keeps.
const MAX_CONSOLE: usize = 1000;

impl PageState {
    fn saw(&self, loader: &str, name: &str) -> bool {
        self.lifecycle
            .iter()
            .any(|(l, names)| l == loader && names.iter().any(|n| n == name))
    }

    fn status_of(&self, loader: &str) -> Option<u16> {
        self.statuses
            .iter()
            .find(|(l, _)| l == loader)
            .map(|(_, s)| *s)
    }
}

/// The geometry and visibility of an element, as the page reported it.
struct Element {
    visible: bool,
    /// Centre in viewport coordinates (for mouse events).
    x: f64,
    y: f64,
    /// Box in page coordinates (for a clip).
    left: f64,
    top: f64,
    width: f64,
    height: f64,
}

/// A running Chromium with one attached page.
pub struct Chromium {
    pid: i32,
    dir: PathBuf,
    pipe: Pipe,
    session: String,
    main_frame: String,
    pub version: String,
    state: PageState,
    children: Arc<ChildRegistry>,
    /// Set when the pipe broke or the page went away: the actor drops this Chromium
    /// and the next call starts a new one.
    pub broken: bool,
    reaped: bool,
    /// An evaluation was sent and not answered (it timed out): its script may still run.
    evaluating: bool,
    /// Set when the caller of the running operation went away: loops stop early.
    pub abandoned: Arc<AtomicBool>,
}

static LAUNCHES: AtomicU64 = AtomicU64::new(0);

impl Chromium {
    /// Starts Chromium on a fresh temporary profile, in its own process group, and
    /// attaches to its page.
    pub fn launch(
        configured: Option<&Path>,
        env: &[(OsString, OsString)],
        children: &Arc<ChildRegistry>,
    ) -> Result<Chromium, BrowserError> {
        let executable = find_executable(configured, env)?;
        let dir = std::env::temp_dir().join(format!(
            "abx-browser-{}-{}",
            std::process::id(),
            LAUNCHES.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("profile"))
            .map_err(|e| BrowserError::Protocol(format!("cannot create {}: {e}", dir.display())))?;
        let started = Self::spawn(&executable, &dir, env, children);
        let (pid, pipe) = match started {
            Ok(started) => started,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(BrowserError::NotInstalled(format!(
                    "cannot start {}: {e}; {INSTALL_HINT}",
                    executable.display()
                )));
            }
        };
        let mut chromium = Chromium {
            pid,
            dir,
            pipe,
            session: String::new(),
            main_frame: String::new(),
            version: String::new(),
            state: PageState::default(),
            children: children.clone(),
            broken: false,
            reaped: false,
            evaluating: false,
            abandoned: Arc::default(),
        };
        let deadline = Instant::now() + LAUNCH_TIMEOUT;
        match chromium.attach(deadline) {
            Ok(()) => Ok(chromium),
            Err(e) => {
                let log =
                    std::fs::read_to_string(chromium.dir.join("stderr.log")).unwrap_or_default();
                let last = log
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty() && !l.contains("dbus"))
                    .unwrap_or("")
                    .to_string();
                let why = match e {
                    BrowserError::Timeout => {
                        format!("it did not answer within {} s", LAUNCH_TIMEOUT.as_secs())
                    }
                    other => other.to_string(),
                };
                Err(BrowserError::NotInstalled(format!(
                    "Chromium ({}) did not start: {why}{}{last}",
                    executable.display(),
                    if last.is_empty() { "" } else { "; it said: " }
                )))
            }
        }
    }

    fn spawn(
        executable: &Path,
        dir: &Path,
        env: &[(OsString, OsString)],
        children: &ChildRegistry,
    ) -> std::io::Result<(i32, Pipe)> {
        let cloexec = rustix::pipe::PipeFlags::CLOEXEC;
        let (chromium_reads, we_write) = rustix::pipe::pipe_with(cloexec)?;
        let (we_read, chromium_writes) = rustix::pipe::pipe_with(cloexec)?;
        let stderr = std::fs::File::create(dir.join("stderr.log"))?;
        let cwd = rustix::fs::open(
            dir,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        let mut argv = vec![executable.display().to_string()];
        argv.extend(FLAGS.iter().map(|f| f.to_string()));
        argv.push(format!("--user-data-dir={}", dir.join("profile").display()));
        argv.push(format!("--window-size={},{}", VIEWPORT.0, VIEWPORT.1));
        argv.push("about:blank".into());
        let pid = children.spawn_registered(|| {
            spawn::spawn(
                executable,
                &argv,
                &chromium_env(env),
                cwd.as_fd(),
                spawn::Stdio {
                    stdin: None,
                    stdout: None,
                    stderr: Some(stderr.as_fd()),
                    extra: vec![chromium_reads.as_fd(), chromium_writes.as_fd()],
                    terminal: None,
                },
                None,
            )
        })?;
        Ok((pid, Pipe::new(we_write, we_read)?))
    }

    /// Finds the page Chromium opened (or opens one), attaches to it and turns on the
    /// events navigation waits on.
    fn attach(&mut self, deadline: Instant) -> Result<(), BrowserError> {
        let version = self.browser_call("Browser.getVersion", json!({}), deadline)?;
        self.version = version["product"].as_str().unwrap_or("").to_string();
        let targets = self.browser_call("Target.getTargets", json!({}), deadline)?;
        let page = targets["targetInfos"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["type"] == "page"))
            .and_then(|t| t["targetId"].as_str())
            .map(str::to_string);
        let target = match page {
            Some(id) => id,
            None => self.browser_call(
                "Target.createTarget",
                json!({"url": "about:blank"}),
                deadline,
            )?["targetId"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        };
        let attached = self.browser_call(
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
            deadline,
        )?;
        self.session = attached["sessionId"].as_str().unwrap_or("").to_string();
        self.call("Page.enable", json!({}), deadline)?;
        self.call(
            "Page.setLifecycleEventsEnabled",
            json!({"enabled": true}),
            deadline,
        )?;
        self.call("Network.enable", json!({}), deadline)?;
        // For the console's messages (`Runtime.consoleAPICalled`).
        self.call("Runtime.enable", json!({}), deadline)?;
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": VIEWPORT.0, "height": VIEWPORT.1, "deviceScaleFactor": 1, "mobile": false}),
            deadline,
        )?;
        let tree = self.call("Page.getFrameTree", json!({}), deadline)?;
        self.main_frame = tree["frameTree"]["frame"]["id"]
            .as_str()
            .unwrap_or("")
            .to_string();
        Ok(())
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The temporary directory holding the profile and Chromium's stderr.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the process still runs (reaps it if it exited).
    pub fn alive(&mut self) -> bool {
        if self.broken || self.reaped {
            return false;
        }
        let Some(pid) = rustix::process::Pid::from_raw(self.pid) else {
            return false;
        };
        match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG) {
            Ok(None) => true,
            _ => {
                self.reaped = true;
                false
            }
        }
    }

    fn browser_call(
        &mut self,
        method: &str,
        params: Value,
        deadline: Instant,
    ) -> Result<Value, BrowserError> {
        self.raw_call(method, params, false, deadline)
    }

    /// Sends a command to the page and waits for its reply, handling events meanwhile.
    fn call(
        &mut self,
        method: &str,
        params: Value,
        deadline: Instant,
    ) -> Result<Value, BrowserError> {
        self.raw_call(method, params, true, deadline)
    }

    fn raw_call(
        &mut self,
        method: &str,
        params: Value,
        to_page: bool,
        deadline: Instant,
    ) -> Result<Value, BrowserError> {
        let session = to_page.then(|| self.session.clone());
        let id = self
            .pipe
            .send(method, &params, session.as_deref(), deadline)
            .map_err(|e| self.pipe_failed(e))?;
        loop {
            let Some(message) = self.next_message(deadline)? else {
                continue;
            };
            if message.id == Some(id) {
                if let Some(error) = message.error {
                    return Err(BrowserError::Protocol(format!(
                        "{method}: {}",
                        error.message
                    )));
                }
                return Ok(message.result.unwrap_or(Value::Null));
            }
        }
    }

    /// The next message, or `None` after a slice of at most [`ABANDON_CHECK`] without
    /// one; fails at `deadline`, when Chromium is gone, or when the caller went away.
    fn next_message(&mut self, deadline: Instant) -> Result<Option<Incoming>, BrowserError> {
        if self.abandoned.load(Ordering::Relaxed) {
            return Err(BrowserError::Abandoned);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(BrowserError::Timeout);
        }
        match self.pipe.receive(deadline.min(now + ABANDON_CHECK)) {
            Ok(message) => {
                if let Some(event) = &message.method {
                    self.observe(event, &message.params);
                }
                if let Some(gone) = &self.state.gone {
                    self.broken = true;
                    return Err(BrowserError::Crashed(gone.clone()));
                }
                Ok(Some(message))
            }
            Err(PipeError::Timeout) => Ok(None),
            Err(e) => Err(self.pipe_failed(e)),
        }
    }

    /// Handles what Chromium sent while no operation ran (network events of a page
    /// that keeps polling, say), so it never piles up in the pipe.
    pub fn drain(&mut self) {
        let until = Instant::now() + Duration::from_millis(5);
        while self.pipe.receive(until).is_ok_and(|message| {
            if let Some(event) = &message.method {
                self.observe(event, &message.params);
            }
            true
        }) {}
    }

    fn pipe_failed(&mut self, error: PipeError) -> BrowserError {
        match error {
            PipeError::Timeout => BrowserError::Timeout,
            PipeError::Closed(why) => {
                self.broken = true;
                BrowserError::Crashed(format!(
                    "Chromium went away during the call ({why}); the next call starts it again"
                ))
            }
        }
    }

    /// Handles events until `until` (a quiet pipe is not an error here).
    fn pump(&mut self, until: Instant) -> Result<(), BrowserError> {
        while Instant::now() < until {
            match self.next_message(until) {
                Ok(_) => {}
                Err(BrowserError::Timeout) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Handles events until `done` holds, or fails with a timeout at `deadline`.
    fn wait_for(
        &mut self,
        deadline: Instant,
        done: impl Fn(&PageState) -> bool,
    ) -> Result<(), BrowserError> {
        while !done(&self.state) {
            self.next_message(deadline)?;
        }
        Ok(())
    }

    fn observe(&mut self, event: &str, params: &Value) {
        let main = |p: &Value| p["frameId"].as_str() == Some(self.main_frame.as_str());
        match event {
            "Page.lifecycleEvent" if main(params) => {
                let loader = params["loaderId"].as_str().unwrap_or("").to_string();
                let name = params["name"].as_str().unwrap_or("").to_string();
                if name == "init" {
                    self.state.navigations += 1;
                }
                match self.state.lifecycle.iter_mut().find(|(l, _)| *l == loader) {
                    Some((_, names)) => names.push(name),
                    None => {
                        if self.state.lifecycle.len() >= 8 {
                            self.state.lifecycle.remove(0);
                        }
                        self.state.lifecycle.push((loader, vec![name]));
                    }
                }
            }
            "Page.frameRequestedNavigation" | "Page.frameStartedLoading" if main(params) => {
                self.state.navigations += 1;
            }
            "Page.frameStoppedLoading" if main(params) => self.state.stopped += 1,
            "Page.loadEventFired" => self.state.loads += 1,
            "Runtime.consoleAPICalled" if self.state.console.len() < MAX_CONSOLE => {
                self.state.console.push(console_entry(params));
            }
            "Page.navigatedWithinDocument" if main(params) => self.state.same_document += 1,
            "Network.responseReceived" if main(params) && params["type"] == "Document" => {
                if let (Some(loader), Some(status)) = (
                    params["loaderId"].as_str(),
                    params["response"]["status"].as_u64(),
                ) {
                    if self.state.statuses.len() >= 8 {
                        self.state.statuses.remove(0);
                    }
                    self.state
                        .statuses
                        .push((loader.to_string(), status as u16));
                }
            }
            // A dialog blocks the page until answered; Playwright dismisses it when
            // nobody listens, and so do we (a `beforeunload` one is accepted, so the
            // navigation that raised it goes ahead).
            "Page.javascriptDialogOpening" => {
                let accept = params["type"] == "beforeunload";
                let session = self.session.clone();
                let sent = self.pipe.send(
                    "Page.handleJavaScriptDialog",
                    &json!({"accept": accept}),
                    Some(&session),
                    Instant::now() + Duration::from_secs(1),
                );
                if let Err(PipeError::Closed(why)) = sent {
                    self.state.gone = Some(format!("Chromium's pipe broke ({why})"));
                }
            }
            "Inspector.targetCrashed" | "Target.targetCrashed" => {
                self.state.gone =
                    Some("the page crashed; the next call starts Chromium again".into());
            }
            "Target.detachedFromTarget" | "Inspector.detached" => {
                self.state.gone =
                    Some("the page was closed; the next call starts Chromium again".into());
            }
            _ => {}
        }
    }

    /// Evaluates `expression` in the page (promises awaited) and returns its value.
    fn evaluate(&mut self, expression: &str, deadline: Instant) -> Result<Value, BrowserError> {
        self.evaluate_object(expression, true, deadline)
            .map(|r| remote_value(&r))
    }

    /// Evaluates `expression` and returns the result's `RemoteObject` (by value). A
    /// navigation that replaces the page's context meanwhile is waited out and the
    /// evaluation retried.
    fn evaluate_object(
        &mut self,
        expression: &str,
        by_value: bool,
        deadline: Instant,
    ) -> Result<Value, BrowserError> {
        loop {
            // A script runs in the page only while this is set: a timeout then stops it.
            self.evaluating = true;
            let reply = self.call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": by_value, "awaitPromise": true,
                       "userGesture": true, "objectGroup": OBJECT_GROUP}),
                deadline,
            );
            if !matches!(reply, Err(BrowserError::Timeout)) {
                self.evaluating = false;
            }
            let retry = match &reply {
                Err(BrowserError::Protocol(m)) => context_gone(m),
                Ok(r) => r
                    .get("exceptionDetails")
                    .is_some_and(|d| context_gone(&exception_text(d))),
                Err(_) => false,
            };
            if retry {
                self.pump((Instant::now() + VISIBILITY_POLL).min(deadline))?;
                if Instant::now() >= deadline {
                    return Err(BrowserError::Timeout);
                }
                continue;
            }
            let mut reply = reply?;
            if let Some(details) = reply.get("exceptionDetails") {
                return Err(BrowserError::Script(exception_text(details)));
            }
            return Ok(reply["result"].take());
        }
    }

    /// `evaluate`: the expression is evaluated once; a function it yields is then
    /// called with `arg` by reference (never evaluated a second time), any other object
    /// fetched by value.
    fn evaluate_call(
        &mut self,
        expression: &str,
        arg: Option<Value>,
        deadline: Instant,
    ) -> Result<Value, BrowserError> {
        let result = self.evaluate_object(expression, false, deadline)?;
        let Some(object) = result["objectId"].as_str().map(str::to_string) else {
            return Ok(remote_value(&result));
        };
        let (declaration, arguments) = if result["type"] == "function" {
            (
                "function(arg) { return this(arg); }",
                json!([{"value": arg.unwrap_or(Value::Null)}]),
            )
        } else {
            ("function() { return this; }", json!([]))
        };
        self.evaluating = true;
        let reply = self.call(
            "Runtime.callFunctionOn",
            json!({"objectId": object, "functionDeclaration": declaration, "arguments": arguments,
                   "returnByValue": true, "awaitPromise": true, "userGesture": true}),
            deadline,
        );
        if !matches!(reply, Err(BrowserError::Timeout)) {
            self.evaluating = false;
        }
        let reply = reply?;
        if let Some(details) = reply.get("exceptionDetails") {
            return Err(BrowserError::Script(exception_text(details)));
        }
        Ok(remote_value(&reply["result"]))
    }

    /// Lets the page free the objects evaluations handed us references to.
    fn release_objects(&mut self, deadline: Instant) {
        let _ = self.call(
            "Runtime.releaseObjectGroup",
            json!({"objectGroup": OBJECT_GROUP}),
            deadline.max(Instant::now() + Duration::from_millis(500)),
        );
    }

    /// The page's URL and title.
    fn location(&mut self, deadline: Instant) -> Result<(String, String), BrowserError> {
        let value = self.evaluate("[location.href, document.title]", deadline)?;
        Ok((
            value[0].as_str().unwrap_or("").to_string(),
            value[1].as_str().unwrap_or("").to_string(),
        ))
    }

    fn location_json(&mut self, deadline: Instant) -> Result<Value, BrowserError> {
        let (url, title) = self.location(deadline)?;
        Ok(json!({"url": url, "title": title}))
    }

    /// Runs the element script in `mode` for `selector`: `None` when nothing matches.
    fn element(
        &mut self,
        selector: &str,
        mode: &str,
        deadline: Instant,
    ) -> Result<Option<Element>, BrowserError> {
        let script = format!(
            "({ELEMENT_JS})({}, {})",
            js_string(selector),
            js_string(mode)
        );
        let value = self.evaluate(&script, deadline).map_err(selector_error)?;
        if value["found"] != true {
            return Ok(None);
        }
        let number = |name: &str| value[name].as_f64().unwrap_or(0.0);
        Ok(Some(Element {
            visible: value["visible"] == true,
            x: number("x"),
            y: number("y"),
            left: number("left"),
            top: number("top"),
            width: number("width"),
            height: number("height"),
        }))
    }

    /// The element, once visible: 404 if nothing matches now, 408 if it stays hidden.
    fn visible_element(
        &mut self,
        selector: &str,
        mode: &str,
        deadline: Instant,
    ) -> Result<Element, BrowserError> {
        loop {
            match self.element(selector, mode, deadline)? {
                None => return Err(BrowserError::NoMatch(selector.to_string())),
                Some(element) if element.visible => return Ok(element),
                Some(_) => {
                    if Instant::now() + VISIBILITY_POLL >= deadline {
                        return Err(BrowserError::Timeout);
                    }
                    self.pump(Instant::now() + VISIBILITY_POLL)?;
                }
            }
        }
    }

    /// After an input event: if it started a navigation, waits (within the deadline)
    /// until that navigation has stopped loading, so the next call sees the new page.
    fn settle(&mut self, before: (u64, u64), deadline: Instant) -> Result<(), BrowserError> {
        let (navigations_before, stopped_before) = before;
        self.pump((Instant::now() + NAVIGATION_GRACE).min(deadline))?;
        if self.state.navigations > navigations_before {
            // Counted from before the input: a fast page may be done already.
            match self.wait_for(deadline, |s| s.stopped > stopped_before) {
                // The action itself succeeded; a slow page is not its failure.
                Err(BrowserError::Timeout) => {}
                other => other?,
            }
        }
        Ok(())
    }

    fn mouse(
        &mut self,
        kind: &str,
        x: f64,
        y: f64,
        button: &str,
        count: u32,
        deadline: Instant,
    ) -> Result<(), BrowserError> {
        self.call(
            "Input.dispatchMouseEvent",
            json!({"type": kind, "x": x, "y": y, "button": button, "clickCount": count}),
            deadline,
        )
        .map(drop)
    }

    fn key_event(
        &mut self,
        kind: &str,
        key: &Key,
        modifiers: u32,
        deadline: Instant,
    ) -> Result<(), BrowserError> {
        let mut params = json!({
            "type": kind,
            "key": key.key,
            "code": key.code,
            "windowsVirtualKeyCode": key.key_code,
            "nativeVirtualKeyCode": key.key_code,
            "modifiers": modifiers,
        });
        if kind == "keyDown" {
            if let Some(text) = &key.text {
                params["text"] = json!(text);
                params["unmodifiedText"] = json!(text);
            }
        }
        self.call("Input.dispatchKeyEvent", params, deadline)
            .map(drop)
    }

    /// Presses and releases one key; a key that types text sends `keyDown` (which
    /// inserts it), any other `rawKeyDown`.
    fn tap(&mut self, key: &Key, modifiers: u32, deadline: Instant) -> Result<(), BrowserError> {
        let down = if key.text.is_some() {
            "keyDown"
        } else {
            "rawKeyDown"
        };
        self.key_event(down, key, modifiers, deadline)?;
        self.key_event("keyUp", key, modifiers, deadline)
    }

    fn press_chord(&mut self, chord: &Chord, deadline: Instant) -> Result<(), BrowserError> {
        let mut held = 0;
        for (modifier, bit) in chord.modifiers.iter().zip(modifier_bits(chord)) {
            held |= bit;
            self.key_event("rawKeyDown", modifier, held, deadline)?;
        }
        self.tap(&chord.key, chord.modifier_bits, deadline)?;
        for (modifier, bit) in chord.modifiers.iter().zip(modifier_bits(chord)).rev() {
            held &= !bit;
            self.key_event("keyUp", modifier, held, deadline)?;
        }
        Ok(())
    }

    /// Asks the page to stop a script that overran its call (a busy loop would
    /// otherwise stall every later call).
    pub fn interrupt(&mut self) {
        // Only a script that is still running: otherwise this would stop whatever the
        // page runs next, the next caller's evaluation included.
        if !std::mem::take(&mut self.evaluating) {
            return;
        }
        let session = self.session.clone();
        let _ = self.pipe.send(
            "Runtime.terminateExecution",
            &json!({}),
            Some(&session),
            Instant::now() + Duration::from_millis(200),
        );
    }

    /// `GET /browser/info` while running.
    pub fn info(&mut self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(2);
        let (url, title) = match self.location(deadline) {
            Ok((url, title)) => (Value::String(url), Value::String(title)),
            Err(_) => (Value::Null, Value::Null),
        };
        json!({
            "running": true,
            "url": url,
            "title": title,
            "version": self.version,
            "viewport": {"width": VIEWPORT.0, "height": VIEWPORT.1},
            "pid": self.pid,
        })
    }

    /// Runs one operation against the page.
    pub fn run(&mut self, op: Op, deadline: Instant) -> Result<Value, BrowserError> {
        match op {
            Op::Navigate { url, wait_until } => self.navigate(&url, wait_until, deadline),
            Op::Screenshot { selector, full_page, jpeg } => {
                self.screenshot(selector.as_deref(), full_page, jpeg, deadline)
            }
            Op::Click { selector, button, click_count } => {
                let element = self.visible_element(&selector, "box", deadline)?;
                let before = (self.state.navigations, self.state.stopped);
                let button = button.name();
                self.mouse("mouseMoved", element.x, element.y, "none", 0, deadline)?;
                for count in 1..=click_count {
                    self.mouse("mousePressed", element.x, element.y, button, count, deadline)?;
                    self.mouse("mouseReleased", element.x, element.y, button, count, deadline)?;
                }
                self.settle(before, deadline)?;
                Ok(json!({"clicked": true, "selector": selector}))
            }
            Op::Fill { selector, value } => loop {
                let script = format!("({FILL_JS})({}, {})", js_string(&selector), js_string(&value));
                let answer = self.evaluate(&script, deadline).map_err(selector_error)?;
                if answer["found"] != true {
                    return Err(BrowserError::NoMatch(selector));
                }
                if let Some(problem) = answer["error"].as_str() {
                    return Err(BrowserError::Invalid(format!("cannot fill {selector}: {problem}")));
                }
                if answer["visible"] == true {
                    return Ok(json!({"ok": true}));
                }
                if Instant::now() + VISIBILITY_POLL >= deadline {
                    return Err(BrowserError::Timeout);
                }
                self.pump(Instant::now() + VISIBILITY_POLL)?;
            },
            Op::Type { selector, text, delay, clear } => {
                if let Some(selector) = &selector {
                    if clear {
                        let value = String::new();
                        self.run(Op::Fill { selector: selector.clone(), value }, deadline)?;
                    }
                    self.visible_element(selector, "focus", deadline)?;
                }
                let before = (self.state.navigations, self.state.stopped);
                for (i, c) in text.chars().enumerate() {
                    if i > 0 && !delay.is_zero() {
                        if Instant::now() + delay > deadline {
                            return Err(BrowserError::Timeout);
                        }
                        self.pump(Instant::now() + delay)?;
                    }
                    self.tap(&key_for_char(c), 0, deadline)?;
                }
                self.settle(before, deadline)?;
                Ok(json!({"typed": true, "selector": selector, "text": text}))
            }
            Op::Press { chord, selector } => {
                if let Some(selector) = &selector {
                    self.visible_element(selector, "focus", deadline)?;
                }
                let before = (self.state.navigations, self.state.stopped);
                self.press_chord(&chord, deadline)?;
                self.settle(before, deadline)?;
                Ok(json!({"ok": true}))
            }
            Op::ScrollTo { selector } => {
                if self.element(&selector, "box", deadline)?.is_none() {
                    return Err(BrowserError::NoMatch(selector));
                }
                self.evaluate("({scroll_x: window.scrollX, scroll_y: window.scrollY})", deadline)
            }
            Op::ScrollBy { dx, dy } => self.evaluate(
                &format!("(window.scrollBy({{left: {dx}, top: {dy}, behavior: 'instant'}}), {{scroll_x: window.scrollX, scroll_y: window.scrollY}})"),
                deadline,
            ),
            Op::Evaluate { expression, arg } => {
                let evaluated = self.evaluate_call(&expression, arg, deadline);
                self.release_objects(deadline);
                Ok(json!({"result": evaluated?}))
            }
            Op::Wait { selector, state } => {
                loop {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    if remaining.is_zero() {
                        return Err(BrowserError::Timeout);
                    }
                    let script = format!(
                        "({WAIT_JS})({}, {}, {})",
                        js_string(&selector),
                        js_string(state.name()),
                        remaining.as_millis()
                    );
                    // The page polls; a navigation meanwhile restarts the wait there.
                    if self.evaluate(&script, deadline).map_err(selector_error)? == true {
                        return Ok(json!({"ok": true, "selector": selector, "state": state.name()}));
                    }
                }
            }
            Op::Content { text } => {
                let (url, title) = self.location(deadline)?;
                let script = if text {
                    "document.body ? document.body.innerText : ''"
                } else {
                    "(document.doctype ? new XMLSerializer().serializeToString(document.doctype) + '\\n' : '') + document.documentElement.outerHTML"
                };
                let content = self.evaluate(script, deadline)?;
                // `content`, as the reference answers it (and its client reads it).
                Ok(json!({"url": url, "title": title, "content": content}))
            }
            Op::Text { selector } => {
                let text = match &selector {
                    None => self.evaluate("document.body ? document.body.innerText : ''", deadline)?,
                    Some(selector) => {
                        let script = format!("({ELEMENT_JS})({}, 'text')", js_string(selector));
                        let answer = self.evaluate(&script, deadline).map_err(selector_error)?;
                        if answer["found"] != true {
                            return Err(BrowserError::NoMatch(selector.clone()));
                        }
                        answer["text"].clone()
                    }
                };
                Ok(json!({"text": text}))
            }
            Op::History(step) => self.history(step, deadline),
            Op::Pdf { paper, landscape } => self.pdf(paper, landscape, deadline),
            Op::Console => {
                // Messages Chromium sent since the last operation are read first.
                self.pump(Instant::now().min(deadline) + Duration::from_millis(20))?;
                Ok(json!({"logs": std::mem::take(&mut self.state.console)}))
            }
            Op::Info | Op::Close => Err(BrowserError::Protocol("handled by the actor".into())),
        }
    }

    fn navigate(
        &mut self,
        url: &str,
        wait_until: WaitUntil,
        deadline: Instant,
    ) -> Result<Value, BrowserError> {
        let reply = self.call("Page.navigate", json!({"url": url}), deadline);
        let reply = match reply {
            Err(BrowserError::Protocol(m)) if m.contains("invalid URL") => {
                return Err(BrowserError::Invalid(format!(
                    "Cannot navigate to invalid URL: {url}"
                )))
            }
            other => other?,
        };
        if let Some(error) = reply["errorText"].as_str().filter(|e| !e.is_empty()) {
            return Err(BrowserError::Navigation(format!("{error} at {url}")));
        }
        let loader = reply["loaderId"].as_str().map(str::to_string);
        if let (Some(loader), Some(event)) = (&loader, wait_until.lifecycle_event()) {
            self.wait_for(deadline, |s| s.saw(loader, event))?;
        }
        // The document's response arrives before the commit the reply waits for.
        let status = loader.as_deref().and_then(|l| self.state.status_of(l));
        let (url, title) = self.location(deadline)?;
        // 0 when the navigation had no HTTP response (about:blank, a fragment), as the
        // reference answers (its client reads an integer).
        Ok(json!({"url": url, "title": title, "status": status.unwrap_or(0)}))
    }

    fn screenshot(
        &mut self,
        selector: Option<&str>,
        full_page: bool,
        jpeg: bool,
        deadline: Instant,
    ) -> Result<Value, BrowserError> {
        let format = if jpeg { "jpeg" } else { "png" };
        let mut params = json!({"format": format, "optimizeForSpeed": true});
        // What a JPEG's size is read from (a PNG's is read from its header).
        let mut area = (VIEWPORT.0 as f64, VIEWPORT.1 as f64);
        if let Some(selector) = selector {
            let element = self.visible_element(selector, "box", deadline)?;
            params["clip"] = json!({"x": element.left, "y": element.top, "width": element.width, "height": element.height, "scale": 1});
            params["captureBeyondViewport"] = json!(true);
            area = (element.width, element.height);
        } else if full_page {
            let metrics = self.call("Page.getLayoutMetrics", json!({}), deadline)?;
            let size = &metrics["cssContentSize"];
            let width = size["width"].as_f64().unwrap_or(VIEWPORT.0 as f64).ceil();
            let height = size["height"].as_f64().unwrap_or(VIEWPORT.1 as f64).ceil();
            params["clip"] = json!({"x": 0, "y": 0, "width": width, "height": height, "scale": 1});
            params["captureBeyondViewport"] = json!(true);
            area = (width, height);
        }
        let shot = self.call("Page.captureScreenshot", params, deadline)?;
        let Some(data) = shot["data"].as_str() else {
            return Err(BrowserError::Protocol(
                "Page.captureScreenshot returned no data".into(),
            ));
        };
        let (width, height) = match jpeg {
            true => (area.0.round() as u32, area.1.round() as u32),
            false => png_size(data).ok_or_else(|| {
                BrowserError::Protocol("Chromium's screenshot is not a PNG".into())
            })?,
        };
        let padding = data.bytes().rev().take_while(|b| *b == b'=').count();
        let bytes = data.len() / 4 * 3 - padding;
        Ok(
            json!({"image_base64": data, "format": format, "width": width, "height": height, "bytes": bytes}),
        )
    }

    /// `Page.printToPDF` with Playwright's defaults (no margins, no backgrounds).
    fn pdf(
        &mut self,
        paper: (f64, f64),
        landscape: bool,
        deadline: Instant,
    ) -> Result<Value, BrowserError> {
        let params = json!({
            "landscape": landscape, "paperWidth": paper.0, "paperHeight": paper.1,
            "marginTop": 0, "marginBottom": 0, "marginLeft": 0, "marginRight": 0,
            "printBackground": false,
        });
        let printed = self.call("Page.printToPDF", params, deadline)?;
        let Some(data) = printed["data"].as_str() else {
            return Err(BrowserError::Protocol(
                "Page.printToPDF returned no data".into(),
            ));
        };
        let bytes = base64_simd::STANDARD
            .decode_to_vec(data.as_bytes())
            .map_err(|_| BrowserError::Protocol("Chromium's PDF is not base64".into()))?;
        Ok(json!({"pdf_base64": data, "pages": pdf_pages(&bytes)}))
    }

    fn history(&mut self, step: HistoryStep, deadline: Instant) -> Result<Value, BrowserError> {
        let loads = self.state.loads;
        let same_document = self.state.same_document;
        match step {
            HistoryStep::Reload => {
                self.call("Page.reload", json!({}), deadline)?;
            }
            HistoryStep::Back | HistoryStep::Forward => {
                let history = self.call("Page.getNavigationHistory", json!({}), deadline)?;
                let current = history["currentIndex"].as_i64().unwrap_or(0);
                let target = current + if step == HistoryStep::Back { -1 } else { 1 };
                let entry = history["entries"]
                    .as_array()
                    .and_then(|e| usize::try_from(target).ok().and_then(|i| e.get(i)))
                    .and_then(|e| e["id"].as_i64());
                let Some(entry) = entry else {
                    // Nothing to go to: Playwright answers null; we answer where we are.
                    return self.location_json(deadline);
                };
                self.call(
                    "Page.navigateToHistoryEntry",
                    json!({"entryId": entry}),
                    deadline,
                )?;
            }
        }
        self.wait_for(deadline, |s| {
            s.loads > loads || s.same_document > same_document
        })?;
        self.location_json(deadline)
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        // The whole group: the renderers and helpers Chromium started die with it.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        if !self.reaped {
            if let Some(pid) = rustix::process::Pid::from_raw(self.pid) {
                let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
            }
        }
        self.children.unregister(self.pid);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn modifier_bits(chord: &Chord) -> Vec<u32> {
    chord
        .modifiers
        .iter()
        .map(|m| match m.key.as_str() {
            "Alt" => super::keys::ALT,
            "Control" => super::keys::CONTROL,
            "Meta" => super::keys::META,
            _ => super::keys::SHIFT,
        })
        .collect()
}

/// A JSON string literal, which is also a JavaScript one.
fn js_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

fn context_gone(message: &str) -> bool {
    message.contains("Execution context was destroyed")
        || message.contains("Cannot find context with specified id")
}

fn exception_text(details: &Value) -> String {
    details["exception"]["description"]
        .as_str()
        .or(details["text"].as_str())
        .unwrap_or("the script threw")
        .to_string()
}

/// A script error from a bad selector is the caller's mistake (400).
fn selector_error(error: BrowserError) -> BrowserError {
    match error {
        BrowserError::Script(m) if m.contains("is not a valid selector") => {
            BrowserError::InvalidSelector(m.lines().next().unwrap_or(&m).to_string())
        }
        other => other,
    }
}

/// A by-value `RemoteObject` as JSON: `undefined` is null, and the values JSON cannot
/// hold (`NaN`, `Infinity`, `-0`, bigints) come back as their JavaScript spelling.
fn remote_value(object: &Value) -> Value {
    if let Some(unserializable) = object["unserializableValue"].as_str() {
        return Value::String(unserializable.to_string());
    }
    object.get("value").cloned().unwrap_or(Value::Null)
}

/// Width and height from a base64 PNG's IHDR chunk (bytes 16 to 24).
pub fn png_size(base64: &str) -> Option<(u32, u32)> {
    let head = base64.get(..32)?;
    let bytes = base64_simd::STANDARD.decode_to_vec(head).ok()?;
    if bytes.get(..8)? != b"\x89PNG\r\n\x1a\n" {
        return None;
    }
    let width = u32::from_be_bytes(bytes.get(16..20)?.try_into().ok()?);
    let height = u32::from_be_bytes(bytes.get(20..24)?.try_into().ok()?);
    Some((width, height))
}

/// Finds an element; in mode `box` or `focus` scrolls it into view and reports its
/// geometry (and focuses it for `focus`), in mode `text` returns its text.
const ELEMENT_JS: &str = r#"(sel, mode) => {
  const el = document.querySelector(sel);
  if (!el) return {found: false};
  if (mode === 'text') return {found: true, text: el instanceof HTMLElement ? el.innerText : el.textContent};
  el.scrollIntoView({block: 'center', inline: 'center', behavior: 'instant'});
  const r = el.getBoundingClientRect();
  const style = getComputedStyle(el);
  const visible = r.width > 0 && r.height > 0 && style.visibility !== 'hidden';
  if (visible && mode === 'focus') el.focus();
  return {found: true, visible, x: r.left + r.width / 2, y: r.top + r.height / 2,
          left: r.left + window.scrollX, top: r.top + window.scrollY, width: r.width, height: r.height};
}"#;

/// Sets a field's value the way a user's typing would end, through the element's own
/// value setter (so frameworks that wrap it see the change), then fires `input` and
/// `change`.
const FILL_JS: &str = r#"(sel, value) => {
  const el = document.querySelector(sel);
  if (!el) return {found: false};
  el.scrollIntoView({block: 'center', inline: 'center', behavior: 'instant'});
  const r = el.getBoundingClientRect();
  if (!(r.width > 0 && r.height > 0 && getComputedStyle(el).visibility !== 'hidden')) return {found: true, visible: false};
  const unfillable = ['checkbox', 'radio', 'file', 'submit', 'button', 'image', 'reset', 'range', 'color'];
  if (el instanceof HTMLInputElement && unfillable.includes(el.type)) return {found: true, visible: true, error: `an <input type=${el.type}> cannot be filled`};
  if (el.disabled) return {found: true, visible: true, error: 'the element is disabled'};
  el.focus();
  if (el instanceof HTMLInputElement || el instanceof HTMLTextAreaElement || el instanceof HTMLSelectElement) {
    const setter = Object.getOwnPropertyDescriptor(Object.getPrototypeOf(el), 'value')?.set;
    if (setter) setter.call(el, value); else el.value = value;
  } else if (el.isContentEditable) {
    el.textContent = value;
  } else {
    return {found: true, visible: true, error: 'it is not an <input>, <textarea>, <select> or [contenteditable] element'};
  }
  el.dispatchEvent(new Event('input', {bubbles: true}));
  el.dispatchEvent(new Event('change', {bubbles: true}));
  return {found: true, visible: true};
}"#;

/// Polls in the page until the selector reaches `state` or `ms` pass: true or false.
const WAIT_JS: &str = r#"async (sel, state, ms) => {
  const end = Date.now() + ms;
  const reached = () => {
    const el = document.querySelector(sel);
    if (state === 'attached') return !!el;
    if (state === 'detached') return !el;
    let visible = false;
    if (el) {
      const r = el.getBoundingClientRect();
      visible = r.width > 0 && r.height > 0 && getComputedStyle(el).visibility !== 'hidden';
    }
    return state === 'visible' ? visible : !visible;
  };
  while (true) {
    if (reached()) return true;
    if (Date.now() >= end) return false;
    await new Promise(resolve => setTimeout(resolve, 20));
  }
}"#;

/// A PDF's page count: its `/Type /Page` objects (not the `/Type /Pages` tree nodes, which
/// the reference's count includes); at least 1.
fn pdf_pages(pdf: &[u8]) -> usize {
    const PAGE: &[u8] = b"/Type /Page";
    let pages = pdf
        .windows(PAGE.len() + 1)
        .filter(|w| w.starts_with(PAGE) && !w[PAGE.len()].is_ascii_alphanumeric())
        .count();
    pages.max(1)
}

/// A console message as the reference reports it (Playwright's `msg.type` and
/// `msg.text`: the arguments' values, or their descriptions, joined by spaces).
fn console_entry(params: &Value) -> Value {
    let text: Vec<String> = params["args"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|arg| match &arg["value"] {
            Value::String(s) => s.clone(),
            Value::Null if arg["type"] == "undefined" => "undefined".into(),
            Value::Null if arg.get("value").is_none() => arg["description"]
                .as_str()
                .or(arg["unserializableValue"].as_str())
                .unwrap_or_default()
                .to_string(),
            other => other.to_string(),
        })
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    json!({
        "type": params["type"].as_str().unwrap_or("log"),
        "text": text.join(" "),
        "timestamp": now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chromium_gets_no_caller_instructions() {
        let env: Vec<(OsString, OsString)> = [
            ("PATH", "/usr/bin"),
            ("http_proxy", "http://127.0.0.1:1"),
            ("CHROMIUM_FLAGS", "--remote-debugging-port=9222"),
            ("LC_ALL", "C.UTF-8"),
        ]
        .iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .collect();
        let kept: Vec<String> = chromium_env(&env)
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert_eq!(kept, ["PATH", "LC_ALL"]);
    }

    #[test]
    fn png_size_reads_the_header() {
        // 1x1 PNG.
        let one = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
        assert_eq!(png_size(one), Some((1, 1)));
        assert_eq!(png_size("bm90IGEgcG5n"), None);
    }

    #[test]
    fn missing_browser_is_a_503_with_the_hint() {
        let env = vec![(OsString::from("PATH"), OsString::from("/nonexistent"))];
        let err = find_executable(None, &env).unwrap_err();
        assert!(
            matches!(&err, BrowserError::NotInstalled(m) if m.contains(INSTALL_HINT)),
            "{err}"
        );
        let err = find_executable(Some(Path::new("/nonexistent/chromium")), &env).unwrap_err();
        assert!(err.to_string().contains("ABX_BROWSER_PATH"), "{err}");
    }

    #[test]
    fn values_json_cannot_hold_keep_their_spelling() {
        assert_eq!(
            remote_value(&json!({"type": "number", "unserializableValue": "NaN"})),
            json!("NaN")
        );
        assert_eq!(remote_value(&json!({"type": "undefined"})), Value::Null);
        assert_eq!(
            remote_value(&json!({"type": "number", "value": 3})),
            json!(3)
        );
    }

    #[test]
    fn pdf_pages_counts_page_objects_not_the_tree() {
        let pdf =
            b"1 0 obj <</Type /Pages /Count 2>> 2 0 obj <</Type /Page>> 3 0 obj <</Type /Page\n>>";
        assert_eq!(pdf_pages(pdf), 2);
        assert_eq!(pdf_pages(b"%PDF-1.4 nothing"), 1);
    }

    #[test]
    fn console_entries_read_as_playwright_words_them() {
        let params = json!({"type": "warning", "args": [
            {"type": "string", "value": "one"}, {"type": "number", "value": 2},
            {"type": "object", "subtype": "null", "value": null}, {"type": "undefined"},
            {"type": "object", "className": "Object", "description": "Object"},
            {"type": "number", "unserializableValue": "NaN", "description": "NaN"},
        ]});
        let entry = console_entry(&params);
        assert_eq!(entry["type"], "warning");
        assert_eq!(entry["text"], "one 2 null undefined Object NaN");
        assert!(entry["timestamp"].as_f64().unwrap() > 1.7e9);
    }
}
