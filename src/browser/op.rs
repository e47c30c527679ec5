//! One operation on the shared page and how one can fail: what the routes, the actor and
//! the page all speak. Its own module, not `browser`'s root: [`super::page`] runs these,
//! and the root uses `page`.

use std::time::Duration;

use serde_json::Value;

use super::keys;

/// The page's viewport (Playwright's default).
pub const VIEWPORT: (u32, u32) = (1280, 720);

/// Why an operation failed; the routes map each to a status.
#[derive(Debug)]
pub enum BrowserError {
    /// No usable Chromium: what is missing and how to install it (503).
    NotInstalled(String),
    /// The operation's timeout passed (408).
    Timeout,
    /// The selector matched no element (404).
    NoMatch(String),
    /// The selector is not valid CSS (400).
    InvalidSelector(String),
    /// The operation cannot apply to what it found (400).
    Invalid(String),
    /// Chromium could not load the URL: its `net::ERR_*` text and the URL.
    Navigation(String),
    /// The page's script threw.
    Script(String),
    /// Chromium or the page went away during the operation.
    Crashed(String),
    /// The queue is full: this many operations wait already (429).
    Busy(usize),
    /// Chromium answered something unexpected.
    Protocol(String),
    /// The caller went away; the operation stopped early.
    Abandoned,
}

impl std::fmt::Display for BrowserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BrowserError::NotInstalled(m)
            | BrowserError::Invalid(m)
            | BrowserError::Navigation(m)
            | BrowserError::Crashed(m)
            | BrowserError::Protocol(m) => f.write_str(m),
            BrowserError::Timeout => f.write_str("the operation timed out"),
            BrowserError::Abandoned => f.write_str("the caller went away"),
            BrowserError::NoMatch(selector) => write!(f, "Selector not found: no element matches {selector}"),
            BrowserError::InvalidSelector(m) => write!(f, "Invalid selector: {m}"),
            BrowserError::Script(m) => write!(f, "Evaluation failed: {m}"),
            BrowserError::Busy(waiting) => write!(
                f,
                "the browser is busy: {waiting} operations are waiting for the one shared page; retry shortly"
            ),
        }
    }
}

/// When `navigate` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitUntil {
    /// The response arrived and the new document committed.
    Commit,
    DomContentLoaded,
    Load,
    /// No network connections for 500 ms.
    NetworkIdle,
}

impl WaitUntil {
    pub fn parse(name: &str) -> Option<WaitUntil> {
        match name {
            "commit" => Some(WaitUntil::Commit),
            "domcontentloaded" => Some(WaitUntil::DomContentLoaded),
            "load" => Some(WaitUntil::Load),
            "networkidle" => Some(WaitUntil::NetworkIdle),
            _ => None,
        }
    }

    /// Chromium's lifecycle event for this point (none for commit: the reply to
    /// `Page.navigate` comes at commit).
    pub(super) fn lifecycle_event(self) -> Option<&'static str> {
        match self {
            WaitUntil::Commit => None,
            WaitUntil::DomContentLoaded => Some("DOMContentLoaded"),
            WaitUntil::Load => Some("load"),
            WaitUntil::NetworkIdle => Some("networkIdle"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MouseButton {
    Left,
    Right,
    Middle,
}

impl MouseButton {
    pub fn parse(name: &str) -> Option<MouseButton> {
        match name {
            "left" => Some(MouseButton::Left),
            "right" => Some(MouseButton::Right),
            "middle" => Some(MouseButton::Middle),
            _ => None,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            MouseButton::Left => "left",
            MouseButton::Right => "right",
            MouseButton::Middle => "middle",
        }
    }
}

/// What `wait` waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElementState {
    Attached,
    Detached,
    Visible,
    Hidden,
}

impl ElementState {
    pub fn parse(name: &str) -> Option<ElementState> {
        match name {
            "attached" => Some(ElementState::Attached),
            "detached" => Some(ElementState::Detached),
            "visible" => Some(ElementState::Visible),
            "hidden" => Some(ElementState::Hidden),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ElementState::Attached => "attached",
            ElementState::Detached => "detached",
            ElementState::Visible => "visible",
            ElementState::Hidden => "hidden",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistoryStep {
    Back,
    Forward,
    Reload,
}

/// One operation on the shared page, already validated by its route.
#[derive(Debug)]
pub enum Op {
    Navigate {
        url: String,
        wait_until: WaitUntil,
    },
    Screenshot {
        selector: Option<String>,
        full_page: bool,
        /// JPEG rather than PNG (the reference's `format`).
        jpeg: bool,
    },
    Click {
        selector: String,
        button: MouseButton,
        click_count: u32,
    },
    Fill {
        selector: String,
        value: String,
    },
    Type {
        selector: Option<String>,
        text: String,
        delay: Duration,
        /// Empty the element (as a fill with "") before typing.
        clear: bool,
    },
    Press {
        chord: keys::Chord,
        selector: Option<String>,
    },
    ScrollTo {
        selector: String,
    },
    ScrollBy {
        dx: f64,
        dy: f64,
    },
    Evaluate {
        expression: String,
        arg: Option<Value>,
    },
    Wait {
        selector: String,
        state: ElementState,
    },
    /// The page's HTML, or with `text` the body's visible text.
    Content {
        text: bool,
    },
    Text {
        selector: Option<String>,
    },
    History(HistoryStep),
    Info,
    Close,
    /// The page printed to PDF on paper of `paper` inches (width, height).
    Pdf {
        paper: (f64, f64),
        landscape: bool,
    },
    /// The console messages since the last call, taken (none while Chromium is off).
    Console,
}

/// Playwright's paper formats (`page.pdf(format=...)`, case-insensitive) as width and
/// height in inches.
pub fn paper_size(format: &str) -> Option<(f64, f64)> {
    let size = match format.to_ascii_lowercase().as_str() {
        "letter" => (8.5, 11.0),
        "legal" => (8.5, 14.0),
        "tabloid" => (11.0, 17.0),
        "ledger" => (17.0, 11.0),
        "a0" => (33.1, 46.8),
        "a1" => (23.4, 33.1),
        "a2" => (16.54, 23.4),
        "a3" => (11.7, 16.54),
        "a4" => (8.27, 11.7),
        "a5" => (5.83, 8.27),
        "a6" => (4.13, 5.83),
        _ => return None,
    };
    Some(size)
}
