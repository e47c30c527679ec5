//! Diagnostics on stderr that can never take the server down: a closed or full stderr
//! (the server piped into `head`, a log collector that went away) loses the line instead
//! of panicking the thread that wrote it, as `eprintln!` would.

use std::io::Write;

/// Writes `agent-sandbox: <message>` as one line to stderr, ignoring any failure.
pub fn line(message: std::fmt::Arguments<'_>) {
    let mut text = Vec::with_capacity(128);
    let _ = writeln!(text, "agent-sandbox: {message}");
    // One write call, so lines from different threads do not interleave.
    let _ = std::io::stderr().lock().write_all(&text);
}

/// Writes one line to stdout, ignoring any failure (a closed pipe must not stop the
/// server from starting).
pub fn stdout_line(message: std::fmt::Arguments<'_>) {
    let mut text = Vec::with_capacity(128);
    let _ = writeln!(text, "{message}");
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(&text);
    let _ = out.flush();
}

/// `log!("...", args)`: [`line`] with `format!` syntax.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => { $crate::log::line(format_args!($($arg)*)) };
}
