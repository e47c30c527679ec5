//! Integration tests: every test starts the real binary on an ephemeral port and talks
//! real HTTP to it, once per I/O driver.

mod support;

mod agents;
mod agents_api;
mod agents_sessions;
mod agents_store;
mod automations;
mod browser;
mod claude_code;
mod codex_app_server;
mod commands;
mod core_http;
mod envd;
mod faults;
mod files;
mod k8s;
mod mcp;
mod operations;
mod policy;
mod process;
mod reference;
mod reference_policy;
mod system;
mod terminal;
mod upstream;
mod webhooks;
