//! The environment children start with: the server's own at startup, plus whatever
//! callers set later (`POST /env`), as one shared, thread-safe view. Workers never call
//! `setenv` on the server process (not thread-safe, and invisible to children spawned
//! with an explicit environment); they update this view, and every spawn reads it.

use std::ffi::OsString;
use std::sync::{Arc, RwLock};

/// Variables that make a child run code it was not asked to: the dynamic loader's
/// (`LD_PRELOAD` with an uploaded `.so` runs it inside a command that `commands.allow`
/// permits), shells' start-up and function hooks, and the interpreters' and libraries'
/// "load this too" options. A request's `env` naming one is 400 and `POST /env` 403
/// (`docs/api.md` lists them); the terminal strips the contract's three instead.
pub const CODE_LOADING_PREFIXES: [&str; 3] = ["LD_", "DYLD_", "BASH_FUNC_"];
pub const CODE_LOADING_VARS: [&str; 24] = [
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "ZDOTDIR",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "GCONV_PATH",
    "OPENSSL_CONF",
    "GLIBC_TUNABLES",
    "MALLOC_CONF",
];

/// Whether `name` is one of [`CODE_LOADING_VARS`] or starts with one of
/// [`CODE_LOADING_PREFIXES`] (case-insensitively: a shell variable's case matters, but a
/// refusal that a change of case slips past would protect nothing on other systems).
pub fn loads_code(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    CODE_LOADING_PREFIXES.iter().any(|p| upper.starts_with(p))
        || CODE_LOADING_VARS.contains(&upper.as_str())
        || upper.starts_with("BASH_FUNC")
}

/// The shared environment view.
pub struct Environment {
    vars: RwLock<Arc<Vec<(OsString, OsString)>>>,
    /// What callers set since startup, in order, and a counter bumped by each `set`:
    /// the Python bridge passes these on to its long-running worker.
    changes: RwLock<(u64, Vec<(String, String)>)>,
}

impl Environment {
    /// A snapshot of the server's environment.
    pub fn from_process() -> Environment {
        Environment {
            vars: RwLock::new(Arc::new(std::env::vars_os().collect())),
            changes: RwLock::default(),
        }
    }

    /// The server's environment without the variables named in `hidden` (secrets only
    /// the server may read, such as a policy identity's `token_env`).
    pub fn from_process_without(hidden: &[String]) -> Environment {
        Environment {
            vars: RwLock::new(Arc::new(
                std::env::vars_os()
                    .filter(|(name, _)| !hidden.iter().any(|h| name == h.as_str()))
                    .collect(),
            )),
            changes: RwLock::default(),
        }
    }

    /// Removes `names` from the view (a policy reload's new `token_env` variables).
    pub fn hide(&self, names: &[String]) {
        let mut vars = self.vars.write().unwrap_or_else(|e| e.into_inner());
        if vars
            .iter()
            .any(|(n, _)| names.iter().any(|h| n == h.as_str()))
        {
            let kept = vars
                .iter()
                .filter(|(n, _)| !names.iter().any(|h| n == h.as_str()))
                .cloned()
                .collect();
            *vars = Arc::new(kept);
        }
    }

    /// The current variables.
    pub fn snapshot(&self) -> Arc<Vec<(OsString, OsString)>> {
        self.vars.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The environment of one child: the shared view with `overrides` on top.
    pub fn with(&self, overrides: &[(String, String)]) -> Vec<(OsString, OsString)> {
        let mut vars: Vec<(OsString, OsString)> = self.snapshot().as_ref().clone();
        for (name, value) in overrides {
            match vars.iter_mut().find(|(n, _)| n == name.as_str()) {
                Some(slot) => slot.1 = value.into(),
                None => vars.push((name.into(), value.into())),
            }
        }
        vars
    }

    /// Sets variables for every child started from now on.
    pub fn set(&self, updates: &[(String, String)]) {
        let mut changes = self.changes.write().unwrap_or_else(|e| e.into_inner());
        let merged = self.with(updates);
        *self.vars.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(merged);
        changes.0 += 1;
        for (name, value) in updates {
            match changes.1.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = value.clone(),
                None => changes.1.push((name.clone(), value.clone())),
            }
        }
    }

    /// How many times `set` ran: compare with a remembered value to see whether
    /// [`Environment::changes`] has something new.
    pub fn version(&self) -> u64 {
        self.changes.read().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Every variable set since startup (the latest value of each), with the version.
    pub fn changes(&self) -> (u64, Vec<(String, String)>) {
        self.changes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_loading_names_are_recognised() {
        for name in [
            "LD_PRELOAD",
            "ld_audit",
            "DYLD_INSERT_LIBRARIES",
            "BASH_ENV",
            "ENV",
            "BASH_FUNC_ls%%",
            "NODE_OPTIONS",
            "PYTHONPATH",
        ] {
            assert!(loads_code(name), "{name}");
        }
        for name in ["LANG", "MY_LD", "ENVIRONMENT", "PATH", "TERM"] {
            assert!(!loads_code(name), "{name}");
        }
    }

    #[test]
    fn overrides_replace_and_add() {
        let env = Environment {
            vars: RwLock::new(Arc::new(vec![("A".into(), "1".into())])),
            changes: RwLock::default(),
        };
        let merged = env.with(&[("A".into(), "2".into()), ("B".into(), "3".into())]);
        assert_eq!(
            merged,
            vec![("A".into(), "2".into()), ("B".into(), "3".into())]
        );
        assert_eq!(env.snapshot().len(), 1, "a child's overrides are its own");
        env.set(&[("C".into(), "4".into())]);
        assert_eq!(env.snapshot().len(), 2);
    }
}
