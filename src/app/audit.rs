//! The audit log the policy's `audit` rule asks for: one JSON line on stderr per
//! decision, `{"ts", "identity", "endpoint", "method", "decision", "status", "code"}`
//! as the reference server's `agent_sandbox.server.audit` logger writes it. `deny` (the
//! default) logs refusals (401, 403, 404, 413, 429, or any answer with a policy
//! `code`), `all` every request, `off` nothing.

use serde_json::json;

use super::state::Catalog;

/// A request the dispatcher refused before its handler ran.
pub fn refused(catalog: &Catalog, index: usize, identity: &str, status: u16, code: Option<&str>) {
    write(catalog, index, identity, status, code);
}

/// A request whose handler answered `status` (with a policy `code`, when it refused).
pub fn answered(catalog: &Catalog, index: usize, identity: &str, status: u16, code: Option<&str>) {
    write(catalog, index, identity, status, code);
}

fn write(catalog: &Catalog, index: usize, identity: &str, status: u16, code: Option<&str>) {
    let mode = catalog.decisions[index].audit.as_ref();
    let denied = matches!(status, 401 | 403 | 404 | 413 | 429) || code.is_some();
    if mode == "off" || (mode == "deny" && !denied) {
        return;
    }
    let spec = &catalog.endpoints[index].spec;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_millis() as f64) / 1000.0)
        .unwrap_or_default();
    let event = json!({
        "ts": now,
        "identity": identity,
        "endpoint": spec.id,
        "method": spec.method_name(),
        "decision": if denied { "deny" } else { "allow" },
        "status": status,
        "code": code,
    });
    crate::log!("audit {event}");
}
