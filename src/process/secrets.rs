//! Secrets the server reads from its own environment (`ABX_SERVER_TOKEN`, each policy
//! identity's `token_env`), kept in the server's memory only.
//!
//! A child started with the server's environment would read them, and a `/shell`-only
//! identity that reads the full-access token has become the full-access identity. So
//! they leave every environment a child is given ([`super::env::Environment`] hides
//! them), and they leave the server's own environment as well: `/proc/<pid>/environ`
//! reads the block of memory the kernel laid the environment out in at `execve`, which
//! `unsetenv` does not touch (it only edits the `environ` array). [`keep`] copies each
//! value here, removes the variable and overwrites its bytes in that block with NULs.
//! The process is also made non-dumpable ([`make_undumpable`]): its `/proc` files
//! (`environ`, `mem`, `maps`) then belong to root and `ptrace` is refused to processes of
//! the same user, so a child running under `ABX_CHILD_USER` cannot read the server's
//! memory at all.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

fn kept() -> &'static Mutex<HashMap<String, String>> {
    static KEPT: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    KEPT.get_or_init(Mutex::default)
}

/// Moves each variable of `names` that is set from the environment into the server's
/// memory (see the module docs). A name kept before keeps its first value.
pub fn keep(names: &[&str]) {
    let mut kept = kept().lock().unwrap_or_else(|e| e.into_inner());
    for name in names {
        if let Some(value) = std::env::var_os(name) {
            kept.entry(name.to_string())
                .or_insert_with(|| value.to_string_lossy().into_owned());
            std::env::remove_var(name);
        }
        if kept.contains_key(*name) {
            scrub_environment_block(name);
        }
    }
}

/// The value of a secret [`keep`] moved, or the variable if it is still in the
/// environment (a policy reload naming a new `token_env`: kept from then on).
pub fn get(name: &str) -> Option<String> {
    if let Some(value) = kept().lock().unwrap_or_else(|e| e.into_inner()).get(name) {
        return Some(value.clone());
    }
    std::env::var(name).ok().inspect(|_| keep(&[name]))
}

/// `PR_SET_DUMPABLE` off: see the module docs. A child gets the usual dumpable state
/// back at its `execve`.
pub fn make_undumpable() {
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
}

/// Where the kernel laid out this process's environment (`env_start`, `env_end` of
/// `/proc/self/stat`), the block `/proc/<pid>/environ` shows.
pub fn environment_block() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    // env_start and env_end are fields 50 and 51; `after` starts at field 3.
    let start: usize = fields.get(47)?.parse().ok()?;
    let end: usize = fields.get(48)?.trim().parse().ok()?;
    (start != 0 && end > start).then_some((start, end))
}

/// Overwrites the value of every `name=` entry in the environment block with NULs.
fn scrub_environment_block(name: &str) {
    let Some((start, end)) = environment_block() else {
        return;
    };
    let prefix = format!("{name}=");
    // SAFETY: the block is this process's own, mapped writable (it lies in the initial
    // stack) for the whole life of the process; only bytes inside [start, end) are
    // touched, and only a secret's value bytes, which nothing reads once it has been
    // removed from `environ`.
    unsafe {
        let block = std::slice::from_raw_parts_mut(start as *mut u8, end - start);
        let mut at = 0;
        while at < block.len() {
            let len = block[at..]
                .iter()
                .position(|b| *b == 0)
                .unwrap_or(block.len() - at);
            if block[at..at + len].starts_with(prefix.as_bytes()) {
                block[at + prefix.len()..at + len].fill(0);
            }
            at += len + 1;
        }
    }
}

/// Overwrites the whole environment block with NULs: for a forked helper (the guardian)
/// that needs none of it. Async-signal-safe, given the block's bounds found before the
/// fork.
///
/// # Safety
/// `block` must be this process's [`environment_block`].
pub unsafe fn wipe_environment_block(block: (usize, usize)) {
    std::ptr::write_bytes(block.0 as *mut u8, 0, block.1 - block.0);
}
