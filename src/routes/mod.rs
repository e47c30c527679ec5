//! The route table: one declaration per endpoint, grouped by capability group. Each
//! group's folder holds thin adapters: parse the request, call the domain code, shape
//! the answer. Adding an endpoint means adding one [`Endpoint`] to its group's
//! `endpoints()`; the router, `/capabilities`, `/capabilities/check` and the policy
//! engine all read the same list.

pub mod agents;
pub mod browser;
pub mod commands;
pub mod core;
pub mod dev_tools;
pub mod files;
pub mod k8s_runtime;
pub mod mcp;
pub mod process;
pub mod system;
pub mod terminal;

use crate::app::Endpoint;

/// A JSON Schema object with `required` fields and `properties`, for the OpenAPI
/// document's success bodies.
fn schema_object(required: &[&str], properties: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"type": "object", "required": required, "properties": properties})
}

/// Every built-in endpoint, in the order `/capabilities` lists them.
pub fn builtin_endpoints() -> Vec<Endpoint> {
    let mut endpoints = Vec::new();
    endpoints.extend(core::endpoints());
    endpoints.extend(commands::endpoints());
    endpoints.extend(files::endpoints());
    endpoints.extend(process::endpoints());
    endpoints.extend(system::endpoints());
    endpoints.extend(dev_tools::endpoints());
    endpoints.extend(terminal::endpoints());
    endpoints.extend(browser::endpoints());
    endpoints.extend(agents::endpoints());
    endpoints.extend(mcp::endpoints());
    endpoints.extend(k8s_runtime::endpoints());
    endpoints
}
