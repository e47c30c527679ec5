//! The state every thread reads: configuration, route table, policy decisions, auth.
//! Built once before the first worker starts and never mutated afterwards, so it is shared
//! as a plain `Arc` without locks.

use std::path::PathBuf;
use std::time::Instant;

use crate::auth::{Auth, Identity};
use crate::config::Config;
use crate::policy::{Decision, Policy};
use crate::process::ChildRegistry;
use crate::routes::{Endpoint, Group, Router};

/// Shared, immutable server state.
pub struct AppState {
    pub config: Config,
    pub endpoints: Vec<Endpoint>,
    /// `decisions[i]` is the policy decision for `endpoints[i]`.
    pub decisions: Vec<Decision>,
    pub router: Router,
    pub policy: Policy,
    pub auth: Auth,
    pub warnings: Vec<String>,
    /// The directory caller paths are confined to (policy `base_dir` beats config).
    pub base_dir: PathBuf,
    /// Process groups of children we started, ended at shutdown.
    pub children: ChildRegistry,
    /// The I/O driver the workers actually run (`io_uring` or `epoll`).
    pub io_driver: &'static str,
    pub started: Instant,
}

/// Whether a caller may use an endpoint, and if not, the refusal's code, rule and reason.
pub struct Access<'a> {
    pub allowed: bool,
    pub code: Option<&'static str>,
    pub rule: Option<&'a str>,
    pub reason: Option<String>,
}

impl AppState {
    /// Builds the state from the configuration and the full endpoint list (built-ins plus
    /// custom routes). Errors are one line for stderr.
    pub fn build(
        config: Config,
        endpoints: Vec<Endpoint>,
        io_driver: &'static str,
    ) -> Result<AppState, String> {
        let policy = match &config.policy_path {
            Some(path) => Policy::load(path)?,
            None => Policy::empty(),
        };
        let mut seen = std::collections::HashSet::new();
        for ep in &endpoints {
            if !seen.insert(ep.id.clone()) {
                return Err(format!("two endpoints share the id '{}'", ep.id));
            }
        }
        let mut warnings = policy
            .validate(&endpoints)
            .map_err(|e| format!("ABX_SERVER_POLICY: {e}"))?;
        let decisions: Vec<Decision> = endpoints
            .iter()
            .map(|ep| policy.decide(ep, &config.enabled_groups))
            .collect();
        let empty: Vec<&str> = Group::ALL
            .into_iter()
            .filter(|g| {
                !endpoints
                    .iter()
                    .any(|e| e.group == *g && e.unavailable.is_none())
            })
            .map(Group::name)
            .collect();
        if !empty.is_empty() {
            warnings.push(format!(
                "groups with no endpoints in this build of agent-sandbox: {}",
                empty.join(", ")
            ));
        }
        let base_dir = policy
            .base_dir
            .clone()
            .unwrap_or_else(|| config.base_dir.clone());
        if !base_dir.is_dir() {
            warnings.push(format!(
                "base directory {} does not exist; file routes will fail until it is created",
                base_dir.display()
            ));
        }
        let router = Router::new(&endpoints);
        let auth = Auth::new(config.token.as_deref());
        Ok(AppState {
            config,
            endpoints,
            decisions,
            router,
            policy,
            auth,
            warnings,
            base_dir,
            children: ChildRegistry::default(),
            io_driver,
            started: Instant::now(),
        })
    }

    /// The decision for the endpoint with id `id`, with its index.
    pub fn endpoint(&self, id: &str) -> Option<(usize, &Endpoint)> {
        self.endpoints
            .iter()
            .enumerate()
            .find(|(_, e)| &*e.id == id)
    }

    /// Whether `identity` may call endpoint `index`.
    pub fn access(&self, index: usize, identity: &Identity) -> Access<'_> {
        let decision = &self.decisions[index];
        if !decision.enabled {
            return Access {
                allowed: false,
                code: Some("endpoint_disabled"),
                rule: Some(&decision.rule),
                reason: decision.message.clone(),
            };
        }
        if let Some(scope) = identity.missing_scope(&decision.scopes) {
            return Access {
                allowed: false,
                code: Some("missing_scope"),
                rule: Some(&decision.scopes_rule),
                reason: Some(format!(
                    "Endpoint '{}' needs scope '{scope}', which the caller '{}' does not have",
                    self.endpoints[index].id, identity.id
                )),
            };
        }
        Access {
            allowed: true,
            code: None,
            rule: None,
            reason: None,
        }
    }

    /// Whether any endpoint of `group` is enabled.
    pub fn group_enabled(&self, group: Group) -> bool {
        self.endpoints
            .iter()
            .zip(&self.decisions)
            .any(|(e, d)| e.group == group && d.enabled)
    }

    /// One line describing the enabled groups, for the startup banner.
    pub fn enabled_groups_line(&self) -> String {
        Group::ALL
            .into_iter()
            .filter(|g| self.group_enabled(*g))
            .map(Group::name)
            .collect::<Vec<_>>()
            .join(",")
    }
}
