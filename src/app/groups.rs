//! Per-group state. A group whose handlers share something across requests (the
//! process table, the terminal sessions, the browser page, the agents store, the named
//! commands) registers it here when the server is built, with what must happen to it at
//! shutdown. The app keeps no field per group, so adding a group touches neither
//! [`super::state`] nor the server: its routes module brings its registrar along with
//! its endpoints.

use std::any::{Any, TypeId};
use std::sync::Arc;

use crate::api::ApiError;
use crate::config::Config;
use crate::process::ChildRegistry;

/// What a registrar sees while the server is built.
pub struct GroupSetup<'a> {
    pub config: &'a Config,
    /// The registry every child the server starts joins (ended at shutdown).
    pub children: &'a Arc<ChildRegistry>,
    states: &'a mut GroupStates,
    warnings: &'a mut Vec<String>,
}

impl GroupSetup<'_> {
    /// Makes `value` the group state of type `T` (one per type).
    pub fn provide<T: Send + Sync + 'static>(&mut self, value: Arc<T>) {
        self.states.provide(value);
    }

    /// Runs `hook` when the server shuts down, before the remaining children are
    /// signalled (hooks run in registration order).
    pub fn on_shutdown(&mut self, hook: impl Fn() + Send + Sync + 'static) {
        self.states.hooks.push(Box::new(hook));
    }

    /// A startup warning, published in `/capabilities`.
    pub fn warn(&mut self, warning: String) {
        self.warnings.push(warning);
    }
}

/// Registers one group's state; see [`GroupSetup`].
pub type Registrar = Box<dyn FnOnce(&mut GroupSetup<'_>) + Send>;

/// The state every group registered, by type.
#[derive(Default)]
pub struct GroupStates {
    /// A handful of entries: a scan beats hashing.
    entries: Vec<(TypeId, Arc<dyn Any + Send + Sync>)>,
    hooks: Vec<Box<dyn Fn() + Send + Sync>>,
}

impl GroupStates {
    /// Runs every registrar in order.
    pub fn build(
        registrars: Vec<Registrar>,
        config: &Config,
        children: &Arc<ChildRegistry>,
        warnings: &mut Vec<String>,
    ) -> GroupStates {
        let mut states = GroupStates::default();
        for registrar in registrars {
            registrar(&mut GroupSetup {
                config,
                children,
                states: &mut states,
                warnings,
            });
        }
        states
    }

    fn provide<T: Send + Sync + 'static>(&mut self, value: Arc<T>) {
        let id = TypeId::of::<T>();
        self.entries.retain(|(entry, _)| *entry != id);
        self.entries.push((id, value));
    }

    /// The state of type `T`, if its group registered one.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        let id = TypeId::of::<T>();
        self.entries
            .iter()
            .find(|(entry, _)| *entry == id)
            .and_then(|(_, value)| value.downcast_ref::<T>())
    }

    /// The shared handle of the state of type `T`, to keep beyond the request.
    pub fn get_arc<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        let id = TypeId::of::<T>();
        let (_, value) = self.entries.iter().find(|(entry, _)| *entry == id)?;
        value.clone().downcast::<T>().ok()
    }

    /// Like [`GroupStates::get`], as a handler wants it: a group state that is missing
    /// is a server built without its group's registrar, a 500 that says so.
    pub fn require<T: Send + Sync + 'static>(&self) -> Result<&T, ApiError> {
        self.get::<T>().ok_or_else(|| {
            ApiError::internal(
                "RuntimeError",
                format!(
                    "this server was built without the state of {} (its group's registrar did not run)",
                    std::any::type_name::<T>()
                ),
            )
        })
    }

    /// Runs the shutdown hooks.
    pub fn shut_down(&self) {
        for hook in &self.hooks {
            hook();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn states_by_type_and_hooks_in_order() {
        let config = Config::default();
        let children = Arc::new(ChildRegistry::default());
        let ran = Arc::new(AtomicUsize::new(0));
        let seen = ran.clone();
        let registrars: Vec<Registrar> = vec![
            Box::new(|setup| setup.provide(Arc::new(7u32))),
            Box::new(move |setup| {
                setup.provide(Arc::new(String::from("table")));
                setup.on_shutdown(move || {
                    seen.fetch_add(1, Ordering::SeqCst);
                });
                setup.warn("careful".into());
            }),
        ];
        let mut warnings = Vec::new();
        let states = GroupStates::build(registrars, &config, &children, &mut warnings);
        assert_eq!(states.get::<u32>(), Some(&7));
        assert_eq!(states.get::<String>().map(String::as_str), Some("table"));
        assert!(states.get::<u64>().is_none());
        assert_eq!(states.require::<u64>().unwrap_err().status, 500);
        assert_eq!(warnings, ["careful"]);
        states.shut_down();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }
}
