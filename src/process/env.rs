//! The environment children start with: the server's own at startup, plus whatever
//! callers set later (`POST /env`), as one shared, thread-safe view. Workers never call
//! `setenv` on the server process (not thread-safe, and invisible to children spawned
//! with an explicit environment); they update this view, and every spawn reads it.

use std::ffi::OsString;
use std::sync::{Arc, RwLock};

/// The shared environment view.
pub struct Environment {
    vars: RwLock<Arc<Vec<(OsString, OsString)>>>,
}

impl Environment {
    /// A snapshot of the server's environment.
    pub fn from_process() -> Environment {
        Environment {
            vars: RwLock::new(Arc::new(std::env::vars_os().collect())),
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
        let merged = self.with(updates);
        *self.vars.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(merged);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_replace_and_add() {
        let env = Environment {
            vars: RwLock::new(Arc::new(vec![("A".into(), "1".into())])),
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
