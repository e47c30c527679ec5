//! Saved agents (`/v1/agents`): a reusable agent configuration a session starts from,
//! and the configuration itself, [`AgentConfig`], which sessions use too.
//!
//! **For sessions.** A session's `agent` is a saved agent's configuration with the
//! session's override on top, or the override alone:
//!
//! ```text
//! let patch = AgentConfig::parse(&override_map, "agent.", true)?;   // errors name agent.tools[0].type
//! let config = match agent_id {
//!     Some(id) => saved::load(t, owner, id)?.config.overridden(patch),
//!     None => AgentConfig::new(patch, "agent.")?,                   // model required
//! };
//! let shown = config.snapshot(agent_id_or_session_id);             // AgentSession.agent
//! ```
//!
//! A session's update (`sessions.update`'s `agent`: `model`, `reasoning.effort`,
//! `service_tier`, `tools`) is the same `parse` with `partial: true`; which keys that
//! route takes is its own declaration's business. The tools of an override may hold secrets (MCP
//! `transport.authorization`, stdio `transport.env`): a session keeping its
//! `AgentConfig` in the store should seal them (`super::seal`).
//!
//! [`AgentConfig::parse`] checks every field of `agent_create_params` (prefix `""`:
//! a saved agent's body, whose tools are `PersistedAgentToolParam`s and which may carry
//! `name`) or of a session's `agent` (any other prefix: `AgentToolParam`s, whose MCP
//! transports may carry `authorization` and stdio `env`, and no `name`). `partial:
//! false` requires `model`. What codex cannot honour is refused there, once, for both
//! (the table in `docs/agents.md`, "Saved agents"), so a config that parses is one a
//! session can hand codex whole: `tools` holds only `function`, `tool_search`, `mcp`,
//! `web_search` and disabled `programmatic_tool_calling` entries, with every default
//! filled in. [`AgentConfig::snapshot`] drops what the session's `AgentTool` union
//! has no member or field for (`tool_search`, MCP `headers`, `authorization` and
//! stdio `env`), so secrets a session passed never come back.
//!
//! The update rules (`agent_update_params`): a field that is absent is kept;
//! `metadata` and `tools` are replaced (null clears them); `experimental` is merged
//! key by key; `compaction`, `reasoning`, `text` and `multi_agent` are replaced by the
//! object given, its omitted fields taking their defaults, and null resets them;
//! `instructions` and `name` null clear them; `service_tier` null is `auto`.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::body::{index, invalid, join, metadata, unsupported, Fields};
use super::error::AgentError;
use super::objects::{label, now_unix, Object, LIST_DIFFERENCES};
use super::records::{json_size, new_id, Collection, ObjectStore, Record, Scope, Transaction};
use super::surface::Agents;

/// Saved agents kept at most.
pub const MAX_AGENTS: usize = 10_000;
/// Saved agents one identity keeps at most.
pub const MAX_AGENTS_PER_OWNER: usize = 500;
/// Bytes of compact JSON an agent's tool list may take (`agent_create_params`).
pub const MAX_TOOLS_BYTES: usize = 3 * 1024 * 1024;
/// Characters of `instructions`.
pub const MAX_INSTRUCTIONS: usize = 1024 * 1024;
/// Subagents one agent may run at once (`multi_agent.max_concurrent_subagents`).
pub const MAX_SUBAGENTS: u64 = 64;

pub static AGENTS: Collection = Collection {
    name: "agent",
    parent: None,
    max_total: MAX_AGENTS,
    max_per_owner: MAX_AGENTS_PER_OWNER,
    evicts: false,
};

const EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];
const SUMMARIES: [&str; 3] = ["concise", "detailed", "auto"];
const VERBOSITIES: [&str; 3] = ["low", "medium", "high"];
const SERVICE_TIERS: [&str; 6] = ["auto", "default", "flex", "priority", "fast", "ultrafast"];
/// The tiers codex forwards to the provider's Responses API as `service_tier`.
const HONOURED_TIERS: [&str; 4] = ["auto", "default", "flex", "priority"];

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reasoning {
    /// `None`: the model's own default.
    pub effort: Option<String>,
    /// `None`: no summaries.
    pub summary: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TextConfig {
    /// `{"type": "text"}` or `{"type": "json_schema", "schema": {...}}`.
    pub format: Value,
    pub verbosity: String,
}

impl Default for TextConfig {
    fn default() -> TextConfig {
        TextConfig {
            format: json!({"type": "text"}),
            verbosity: "medium".into(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MultiAgent {
    pub enabled: bool,
    /// 6 when enabled and not given; `None` when disabled.
    pub max_concurrent_subagents: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Compaction {
    /// `compaction.async`: compact in the background (the default).
    pub background: bool,
}

impl Default for Compaction {
    fn default() -> Compaction {
        Compaction { background: true }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Experimental {
    pub time_awareness: bool,
}

/// An agent's whole configuration, every default filled in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentConfig {
    pub model: String,
    pub instructions: Option<String>,
    pub name: Option<String>,
    /// Normalised tool objects (see the module docs); session overrides may hold MCP
    /// `transport.authorization` and stdio `transport.env`, which are secrets.
    pub tools: Vec<Value>,
    pub reasoning: Reasoning,
    pub text: TextConfig,
    pub multi_agent: MultiAgent,
    pub service_tier: String,
    pub compaction: Compaction,
    pub experimental: Experimental,
}

/// What one body changes: `Some` for each field it carries (null included, as the
/// reset value).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentPatch {
    pub model: Option<String>,
    pub instructions: Option<Option<String>>,
    pub name: Option<Option<String>>,
    pub tools: Option<Vec<Value>>,
    pub reasoning: Option<Reasoning>,
    pub text: Option<TextConfig>,
    pub multi_agent: Option<MultiAgent>,
    pub service_tier: Option<String>,
    pub compaction: Option<Compaction>,
    /// `time_awareness` when the body names it (merged by key).
    pub time_awareness: Option<bool>,
}

/// Which tool params a body's tools are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ToolSet {
    /// `PersistedAgentToolParam` (a saved agent).
    Persisted,
    /// `AgentToolParam` (a session's override).
    Session,
}

impl AgentConfig {
    /// Checks the configuration fields of a body (see the module docs): `prefix` is
    /// `""` for `/v1/agents` bodies and `"agent."` for a session's override, and every
    /// refusal's `param` starts with it. `partial: false` requires `model`.
    pub fn parse(
        fields: &Map<String, Value>,
        prefix: &str,
        partial: bool,
    ) -> Result<AgentPatch, AgentError> {
        let set = if prefix.is_empty() {
            ToolSet::Persisted
        } else {
            ToolSet::Session
        };
        let mut f = Fields::new(fields, prefix);
        let mut patch = AgentPatch::default();
        match fields.get("model") {
            None if !partial => {
                return Err(invalid(
                    f.param("model"),
                    format!("{} is required.", f.param("model")),
                ))
            }
            None => {}
            Some(Value::String(model))
                if !model.trim().is_empty() && model.chars().count() <= 256 =>
            {
                patch.model = Some(model.clone())
            }
            Some(_) => {
                return Err(invalid(
                    f.param("model"),
                    format!(
                        "{} must be a model name (1 to 256 characters).",
                        f.param("model")
                    ),
                ))
            }
        }
        f.get("model");
        if f.has("instructions") {
            let instructions = f.string("instructions")?;
            if instructions
                .as_ref()
                .is_some_and(|s| s.chars().count() > MAX_INSTRUCTIONS)
            {
                return Err(invalid(
                    f.param("instructions"),
                    format!(
                        "{} may hold at most {MAX_INSTRUCTIONS} characters.",
                        f.param("instructions")
                    ),
                ));
            }
            patch.instructions = Some(instructions);
        }
        if set == ToolSet::Persisted && f.has("name") {
            patch.name = Some(f.bounded_string("name", 256)?);
        }
        if f.has("tools") {
            let tools = f.array("tools")?.cloned().unwrap_or_default();
            patch.tools = Some(parse_tools(&tools, &f.param("tools"), set)?);
        }
        if f.has("reasoning") {
            patch.reasoning = Some(match f.object("reasoning")? {
                None => Reasoning::default(),
                Some(mut r) => {
                    let parsed = Reasoning {
                        effort: r.choice("effort", &EFFORTS)?,
                        summary: r.choice("summary", &SUMMARIES)?,
                    };
                    r.done()?;
                    parsed
                }
            });
        }
        if f.has("text") {
            patch.text = Some(match f.object("text")? {
                None => TextConfig::default(),
                Some(mut t) => {
                    let format = match t.object("format")? {
                        None => json!({"type": "text"}),
                        Some(format) => parse_format(format)?,
                    };
                    let verbosity = t
                        .choice("verbosity", &VERBOSITIES)?
                        .unwrap_or_else(|| "medium".into());
                    t.done()?;
                    TextConfig { format, verbosity }
                }
            });
        }
        if f.has("multi_agent") {
            patch.multi_agent = Some(match f.object("multi_agent")? {
                None => MultiAgent::default(),
                Some(mut m) => {
                    let enabled = m.bool("enabled")?.ok_or_else(|| {
                        invalid(
                            m.param("enabled"),
                            format!("{} is required.", m.param("enabled")),
                        )
                    })?;
                    let max = m.uint("max_concurrent_subagents", 1, MAX_SUBAGENTS)?;
                    m.done()?;
                    MultiAgent {
                        enabled,
                        max_concurrent_subagents: enabled.then(|| max.unwrap_or(6)),
                    }
                }
            });
        }
        if f.has("service_tier") {
            let tier = f
                .choice("service_tier", &SERVICE_TIERS)?
                .unwrap_or_else(|| "auto".into());
            if !HONOURED_TIERS.contains(&tier.as_str()) {
                return Err(unsupported(
                    f.param("service_tier"),
                    format!("service_tier '{tier}' cannot be honoured: codex hands the tier to the model provider's Responses API, which knows auto, default, flex and priority (the speed tier codex calls Fast is 'priority')."),
                ));
            }
            patch.service_tier = Some(tier);
        }
        if f.has("compaction") {
            patch.compaction = Some(match f.object("compaction")? {
                None => Compaction::default(),
                Some(mut c) => {
                    let background = c.bool("async")?.unwrap_or(true);
                    c.done()?;
                    Compaction { background }
                }
            });
        }
        if let Some(mut e) = f.object("experimental")? {
            patch.time_awareness = e.bool("time_awareness")?;
            e.done()?;
        }
        f.done()?;
        Ok(patch)
    }

    /// A whole configuration from a body's fields: the defaults, then `patch` (which
    /// must carry `model`; `prefix` names it in the refusal).
    pub fn new(patch: AgentPatch, prefix: &str) -> Result<AgentConfig, AgentError> {
        let Some(model) = patch.model.clone() else {
            return Err(invalid(
                join(prefix, "model"),
                format!("{} is required.", join(prefix, "model")),
            ));
        };
        let mut config = AgentConfig {
            model,
            instructions: None,
            name: None,
            tools: Vec::new(),
            reasoning: Reasoning::default(),
            text: TextConfig::default(),
            multi_agent: MultiAgent::default(),
            service_tier: "auto".into(),
            compaction: Compaction::default(),
            experimental: Experimental::default(),
        };
        config.apply(patch);
        Ok(config)
    }

    /// Applies an update or a session's override (the rules of the module docs).
    pub fn apply(&mut self, patch: AgentPatch) {
        if let Some(model) = patch.model {
            self.model = model;
        }
        if let Some(instructions) = patch.instructions {
            self.instructions = instructions;
        }
        if let Some(name) = patch.name {
            self.name = name;
        }
        if let Some(tools) = patch.tools {
            self.tools = tools;
        }
        if let Some(reasoning) = patch.reasoning {
            self.reasoning = reasoning;
        }
        if let Some(text) = patch.text {
            self.text = text;
        }
        if let Some(multi_agent) = patch.multi_agent {
            self.multi_agent = multi_agent;
        }
        if let Some(tier) = patch.service_tier {
            self.service_tier = tier;
        }
        if let Some(compaction) = patch.compaction {
            self.compaction = compaction;
        }
        if let Some(time_awareness) = patch.time_awareness {
            self.experimental.time_awareness = time_awareness;
        }
    }

    /// This configuration with a session's override on top.
    pub fn overridden(&self, patch: AgentPatch) -> AgentConfig {
        let mut config = self.clone();
        config.apply(patch);
        config
    }

    fn common(&self) -> Map<String, Value> {
        let mut map = Map::new();
        map.insert("model".into(), json!(self.model));
        map.insert("instructions".into(), json!(self.instructions));
        map.insert("name".into(), json!(self.name));
        map.insert(
            "multi_agent".into(),
            json!({"enabled": self.multi_agent.enabled,
                   "max_concurrent_subagents": self.multi_agent.max_concurrent_subagents}),
        );
        map.insert(
            "reasoning".into(),
            json!({"effort": self.reasoning.effort, "summary": self.reasoning.summary}),
        );
        map.insert("service_tier".into(), json!(self.service_tier));
        map.insert(
            "text".into(),
            json!({"format": self.text.format, "verbosity": self.text.verbosity}),
        );
        map.insert(
            "compaction".into(),
            json!({"async": self.compaction.background}),
        );
        map.insert(
            "experimental".into(),
            json!({"time_awareness": self.experimental.time_awareness}),
        );
        map
    }

    /// An automation target's inline `agent` (`AutomationAgentConfig`): the session's
    /// agent object without an identity (no `id`, no `name`), secrets dropped alike.
    pub fn inline_view(&self) -> Value {
        let mut map = self.common();
        map.remove("name");
        let tools: Vec<Value> = self.tools.iter().filter_map(session_tool).collect();
        map.insert("tools".into(), Value::Array(tools));
        Value::Object(map)
    }

    /// The session's `agent` object (`AgentSession.agent`): `id` is the saved agent's
    /// (or whatever the session shows there), `tools` the session's `AgentTool`s.
    pub fn snapshot(&self, id: &str) -> Value {
        let mut map = self.common();
        map.insert("id".into(), json!(id));
        let tools: Vec<Value> = self.tools.iter().filter_map(session_tool).collect();
        map.insert("tools".into(), Value::Array(tools));
        Value::Object(map)
    }
}

/// `text.format`.
fn parse_format(mut format: Fields<'_>) -> Result<Value, AgentError> {
    let kind = format
        .choice("type", &["text", "json_schema"])?
        .ok_or_else(|| {
            invalid(
                format.param("type"),
                format!("{} is required.", format.param("type")),
            )
        })?;
    let value = if kind == "json_schema" {
        let schema = format.raw_object("schema")?.ok_or_else(|| {
            invalid(
                format.param("schema"),
                format!(
                    "{} is required: a JSON Schema object.",
                    format.param("schema")
                ),
            )
        })?;
        json!({"type": "json_schema", "schema": schema})
    } else {
        json!({"type": "text"})
    };
    // A `schema` beside type text is left unread, so it is refused.
    format.done()?;
    Ok(value)
}

/// A function or namespace name codex (and the Responses API) accepts.
fn tool_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tools`: each checked and normalised; refusals name `at[i]...`.
fn parse_tools(tools: &[Value], at: &str, set: ToolSet) -> Result<Vec<Value>, AgentError> {
    if json_size(tools) > MAX_TOOLS_BYTES {
        return Err(invalid(
            at,
            format!("{at} must fit in {MAX_TOOLS_BYTES} bytes of compact JSON."),
        ));
    }
    let mut out = Vec::with_capacity(tools.len());
    let mut names: Vec<String> = Vec::new();
    let mut labels: Vec<String> = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let at = index(at, i);
        let mut f = Fields::of(tool, &at)?;
        let kind = f
            .string("type")?
            .ok_or_else(|| invalid(f.param("type"), format!("{} is required.", f.param("type"))))?;
        let value = match kind.as_str() {
            "function" => {
                let name = f.required_string("name")?;
                if !tool_name(&name) {
                    return Err(invalid(f.param("name"), format!("{} must be 1 to 128 letters, digits, '_' or '-' (codex's rule for tool names).", f.param("name"))));
                }
                if names.contains(&name) {
                    return Err(invalid(f.param("name"), format!("Two function tools are named '{name}'.")));
                }
                if name == crate::agents::codex_map::AUTOMATIONS_TOOL {
                    return Err(unsupported(f.param("name"), "'automations' is the name the automations tool's function has for codex: rename the function, or use {\"type\": \"automations\"}."));
                }
                names.push(name.clone());
                let description = f.required_string("description")?;
                let parameters = f.raw_object("parameters")?.ok_or_else(|| {
                    invalid(f.param("parameters"), format!("{} is required: a JSON Schema object.", f.param("parameters")))
                })?;
                let defer_loading = f.bool("defer_loading")?.unwrap_or(false);
                let mut value = json!({"type": "function", "name": name, "description": description,
                                        "parameters": parameters, "defer_loading": defer_loading});
                match f.bool("async")? {
                    Some(true) => return Err(unsupported(f.param("async"), "async function tools cannot be honoured: codex waits for every tool result before it goes on.")),
                    Some(false) => value["async"] = json!(false),
                    None => {}
                }
                value
            }
            "tool_search" => json!({"type": "tool_search"}),
            "programmatic_tool_calling" => {
                if f.bool("enabled")?.unwrap_or(true) {
                    return Err(unsupported(f.param("type"), "programmatic_tool_calling cannot be honoured: codex has no way to call tools from model-generated code."));
                }
                json!({"type": "programmatic_tool_calling", "enabled": false})
            }
            "mcp" => {
                let value = parse_mcp(&mut f, set)?;
                let label = value["server_label"].as_str().unwrap_or_default().to_string();
                if labels.contains(&label) {
                    return Err(invalid(f.param("server_label"), format!("Two MCP tools use server_label '{label}'.")));
                }
                labels.push(label);
                value
            }
            "web_search" => {
                if out.iter().any(|t: &Value| t["type"] == "web_search") {
                    return Err(invalid(f.param("type"), "An agent has one web_search tool at most."));
                }
                parse_web_search(&mut f)?
            }
            "computer_use" => return Err(unsupported(f.param("type"), "computer_use cannot be honoured: it drives a browser in an OpenAI-hosted session, which this server has not.")),
            "automations" => {
                if out.iter().any(|t: &Value| t["type"] == "automations") {
                    return Err(invalid(f.param("type"), "An agent has one automations tool at most."));
                }
                json!({"type": "automations"})
            }
            other => return Err(invalid(f.param("type"), format!("Unknown tool type '{other}'."))),
        };
        f.done()?;
        out.push(value);
    }
    Ok(out)
}

fn parse_mcp(f: &mut Fields<'_>, set: ToolSet) -> Result<Value, AgentError> {
    let label = f.required_string("server_label")?;
    if !tool_name(&label) || label.len() > 64 {
        return Err(invalid(f.param("server_label"), format!("{} must be 1 to 64 letters, digits, '_' or '-' (it names the server in codex's configuration).", f.param("server_label"))));
    }
    let mut transport = f.object("transport")?.ok_or_else(|| {
        invalid(
            f.param("transport"),
            format!("{} is required.", f.param("transport")),
        )
    })?;
    let kind = transport
        .choice("type", &["http", "stdio"])?
        .ok_or_else(|| {
            invalid(
                transport.param("type"),
                format!("{} is required.", transport.param("type")),
            )
        })?;
    let transport_value = if kind == "http" {
        let url = transport.required_string("server_url")?;
        // The same rule as a credential's URL: a bearer (the tool's own, or a vault's)
        // never travels in clear beyond this machine.
        if !super::vaults::token_url(&url) {
            return Err(invalid(
                transport.param("server_url"),
                format!(
                    "{} must be an https:// URL (http:// only to a loopback address: a bearer sent in clear stays on this machine).",
                    transport.param("server_url")
                ),
            ));
        }
        let headers = transport.string_map("headers")?.unwrap_or_default();
        let mut value = json!({"type": "http", "server_url": url, "headers": headers});
        if set == ToolSet::Session {
            if let Some(authorization) = transport.string("authorization")? {
                value["authorization"] = json!(authorization);
            }
        }
        value
    } else {
        let command = transport.required_string("command")?;
        let cwd = transport.required_string("cwd")?;
        if !cwd.starts_with('/') {
            return Err(invalid(
                transport.param("cwd"),
                format!("{} must be an absolute path.", transport.param("cwd")),
            ));
        }
        let args = transport.strings("args")?.unwrap_or_default();
        let env_vars = transport.strings("env_vars")?.unwrap_or_default();
        let mut value = json!({"type": "stdio", "command": command, "cwd": cwd,
                                "args": args, "env_vars": env_vars});
        if set == ToolSet::Session {
            if let Some(env) = transport.string_map("env")? {
                value["env"] = Value::Object(env);
            }
        }
        value
    };
    transport.done()?;
    let origin = f
        .choice("connection_origin", &["service", "environment"])?
        .unwrap_or_else(|| "service".into());
    let credential_id = f.string("credential_id")?;
    let allowed_tools = f.strings("allowed_tools")?;
    let required = f.bool("required")?.unwrap_or(false);
    let request_metadata = f.raw_object("request_metadata")?.unwrap_or_default();
    if !request_metadata.is_empty() {
        return Err(unsupported(
            f.param("request_metadata"),
            "request_metadata cannot be honoured: codex sends MCP servers no per-request metadata.",
        ));
    }
    Ok(json!({
        "type": "mcp",
        "server_label": label,
        "transport": transport_value,
        "connection_origin": origin,
        "credential_id": credential_id,
        "allowed_tools": allowed_tools,
        "request_metadata": {},
        "required": required,
    }))
}

fn parse_web_search(f: &mut Fields<'_>) -> Result<Value, AgentError> {
    let mode = f
        .choice("mode", &["disabled", "cached", "live"])?
        .unwrap_or_else(|| "live".into());
    let context_size = f
        .choice("context_size", &["low", "medium", "high"])?
        .unwrap_or_else(|| "medium".into());
    let allowed_domains = f.strings("allowed_domains")?;
    let location = match f.object("location")? {
        None => Value::Null,
        Some(mut l) => {
            let value = json!({
                "city": l.string("city")?,
                "country": l.string("country")?,
                "region": l.string("region")?,
                "timezone": l.string("timezone")?,
            });
            l.done()?;
            value
        }
    };
    Ok(
        json!({"type": "web_search", "mode": mode, "context_size": context_size,
              "allowed_domains": allowed_domains, "location": location}),
    )
}

/// A stored tool in the session's `AgentTool` shape, or `None` for what that union has
/// no member for.
fn session_tool(tool: &Value) -> Option<Value> {
    match tool["type"].as_str()? {
        "tool_search" => None,
        "mcp" => {
            let mut tool = tool.clone();
            let transport = &tool["transport"];
            tool["transport"] = if transport["type"] == "http" {
                json!({"type": "http", "server_url": transport["server_url"]})
            } else {
                json!({"type": "stdio", "command": transport["command"], "cwd": transport["cwd"],
                       "args": transport["args"], "env_vars": transport["env_vars"]})
            };
            Some(tool)
        }
        _ => Some(tool.clone()),
    }
}

/// A saved agent.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SavedAgent {
    pub id: String,
    pub created_at: u64,
    pub updated_at: u64,
    pub metadata: Value,
    pub config: AgentConfig,
}

impl Record for SavedAgent {
    fn collection() -> &'static Collection {
        &AGENTS
    }
    fn id(&self) -> &str {
        &self.id
    }
}

impl Object for SavedAgent {
    fn object(&self) -> Value {
        let mut map = self.config.common();
        map.insert("id".into(), json!(self.id));
        map.insert("object".into(), json!("agent"));
        map.insert("created_at".into(), json!(self.created_at));
        map.insert("updated_at".into(), json!(self.updated_at));
        map.insert("metadata".into(), self.metadata.clone());
        map.insert("tools".into(), json!(self.config.tools));
        map.insert(
            "x_agent_sandbox".into(),
            label("agent-sandbox", &LIST_DIFFERENCES),
        );
        Value::Object(map)
    }
}

const PARAM: &str = "agent_id";

/// `owner`'s saved agent `id`, inside a transaction (for sessions).
pub fn load<T: Transaction>(t: &mut T, owner: &str, id: &str) -> Result<SavedAgent, AgentError> {
    t.get::<SavedAgent>(Scope::owner(owner), id)
        .map_err(AgentError::store("agent", id, PARAM))
}

/// A body's `metadata` (for create: `{}` when absent).
pub fn parse_metadata(fields: &Map<String, Value>) -> Result<Option<Value>, AgentError> {
    match fields.get("metadata") {
        None => Ok(None),
        value => metadata(value, "metadata").map(Some),
    }
}

/// A new saved agent of `owner`'s.
pub async fn create_agent<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    config: AgentConfig,
    metadata: Value,
) -> Result<Value, AgentError> {
    let now = now_unix();
    let agent = SavedAgent {
        id: new_id("agent_"),
        created_at: now,
        updated_at: now,
        metadata,
        config,
    };
    let object = agent.object();
    let owner = owner.to_string();
    let id = agent.id.clone();
    agents
        .transact(move |t| {
            t.create(Scope::owner(&owner), agent)
                .map_err(AgentError::store("agent", &id, PARAM))
        })
        .await?;
    Ok(object)
}

/// Applies an update body to `owner`'s agent `id`.
pub async fn update_agent<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    id: &str,
    patch: AgentPatch,
    metadata: Option<Value>,
) -> Result<Value, AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    agents
        .transact(move |t| {
            t.update(Scope::owner(&owner), &id, |agent: &mut SavedAgent| {
                agent.config.apply(patch);
                if let Some(metadata) = metadata {
                    agent.metadata = metadata;
                }
                agent.updated_at = now_unix().max(agent.created_at);
                agent.object()
            })
            .map_err(AgentError::store("agent", &id, PARAM))
        })
        .await
}

pub async fn delete_agent<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    id: &str,
) -> Result<(), AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    agents
        .transact(move |t| {
            t.delete::<SavedAgent>(Scope::owner(&owner), &id)
                .map(drop)
                .map_err(AgentError::store("agent", &id, PARAM))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => unreachable!(),
        }
    }

    fn refused(value: Value, prefix: &str) -> (String, bool) {
        match AgentConfig::parse(&map(value), prefix, false) {
            Err(AgentError::Invalid { param, .. }) => (param, false),
            Err(AgentError::Unsupported { param, .. }) => (param, true),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_body_becomes_a_whole_config() {
        let patch = AgentConfig::parse(
            &map(json!({"model": "gpt-5", "tools": [
                {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}},
                {"type": "mcp", "server_label": "docs", "transport": {"type": "http", "server_url": "https://x/mcp"}},
                {"type": "web_search"},
                {"type": "tool_search"}],
                "multi_agent": {"enabled": true}, "experimental": {"time_awareness": true}})),
            "",
            false,
        )
        .unwrap();
        let config = AgentConfig::new(patch, "").unwrap();
        assert_eq!(config.tools[0]["defer_loading"], false);
        assert_eq!(config.tools[1]["connection_origin"], "service");
        assert_eq!(config.tools[1]["transport"]["headers"], json!({}));
        assert_eq!(config.tools[2]["mode"], "live");
        assert_eq!(config.multi_agent.max_concurrent_subagents, Some(6));
        assert_eq!(config.service_tier, "auto");
        assert!(config.compaction.background && config.experimental.time_awareness);
        let shown = config.snapshot("agent_1");
        assert_eq!(
            shown["tools"].as_array().unwrap().len(),
            3,
            "no tool_search in AgentTool"
        );
        assert_eq!(
            shown["tools"][1]["transport"],
            json!({"type": "http", "server_url": "https://x/mcp"})
        );
    }

    #[test]
    fn what_codex_cannot_honour_is_refused_by_path() {
        let tool = |t: Value| json!({"model": "m", "tools": [{"type": "function", "name": "ok", "description": "", "parameters": {}}, t]});
        assert_eq!(
            refused(tool(json!({"type": "computer_use"})), ""),
            ("tools[1].type".into(), true)
        );
        // The automations tool is honoured, once.
        let twice =
            json!({"model": "m", "tools": [{"type": "automations"}, {"type": "automations"}]});
        assert_eq!(refused(twice, ""), ("tools[1].type".into(), false));
        let once = AgentConfig::parse(&map(tool(json!({"type": "automations"}))), "", false);
        let config = AgentConfig::new(once.unwrap(), "").unwrap();
        assert_eq!(
            config.snapshot("agent_1")["tools"][1],
            json!({"type": "automations"})
        );
        let plan =
            crate::agents::codex_map::thread_plan(&serde_json::to_value(&config).unwrap(), "/w")
                .unwrap();
        let tools = &plan.thread_start["dynamicTools"];
        assert_eq!(tools[1]["name"], "automations", "{tools}");
        assert_eq!(
            tools[1]["inputSchema"]["properties"]["action"]["enum"][0],
            "create"
        );
        // Its function's name is the tool's: an application's function cannot take it.
        let named = json!({"model": "m", "tools": [{"type": "function", "name": "automations", "description": "", "parameters": {}}]});
        assert_eq!(refused(named, ""), ("tools[0].name".into(), true));
        assert_eq!(
            refused(tool(json!({"type": "programmatic_tool_calling"})), "agent."),
            ("agent.tools[1].type".into(), true)
        );
        assert_eq!(
            refused(
                tool(
                    json!({"type": "function", "name": "g", "description": "", "parameters": {}, "async": true})
                ),
                ""
            ),
            ("tools[1].async".into(), true)
        );
        assert_eq!(
            refused(json!({"model": "m", "service_tier": "ultrafast"}), ""),
            ("service_tier".into(), true)
        );
        assert_eq!(
            refused(
                json!({"model": "m", "reasoning": {"effort": "huge"}}),
                "agent."
            ),
            ("agent.reasoning.effort".into(), false)
        );
        assert_eq!(refused(json!({}), "agent."), ("agent.model".into(), false));
        // A saved agent's transport has no authorization; a session's does.
        let auth = json!({"model": "m", "tools": [{"type": "mcp", "server_label": "s",
            "transport": {"type": "http", "server_url": "https://h", "authorization": "Bearer x"}}]});
        assert_eq!(
            refused(auth.clone(), ""),
            ("tools[0].transport.authorization".into(), true)
        );
        let session = AgentConfig::new(
            AgentConfig::parse(&map(auth), "agent.", false).unwrap(),
            "agent.",
        )
        .unwrap();
        assert_eq!(session.tools[0]["transport"]["authorization"], "Bearer x");
        assert!(!session.snapshot("s").to_string().contains("Bearer x"));
        assert_eq!(
            refused(json!({"model": "m", "name": "n"}), "agent."),
            ("agent.name".into(), true)
        );
        assert_eq!(
            refused(json!({"model": "m", "temperature": 1}), ""),
            ("temperature".into(), true)
        );
    }

    #[test]
    fn updates_follow_the_sdk_rules() {
        let base = json!({"model": "m", "instructions": "be brief", "tools": [{"type": "web_search"}],
                          "experimental": {"time_awareness": true}, "reasoning": {"effort": "high"}});
        let mut config =
            AgentConfig::new(AgentConfig::parse(&map(base), "", false).unwrap(), "").unwrap();
        let update = AgentConfig::parse(&map(json!({"instructions": null, "tools": null, "experimental": {}, "reasoning": {"summary": "auto"}})), "", true).unwrap();
        config.apply(update);
        assert_eq!(config.instructions, None);
        assert!(config.tools.is_empty());
        assert!(
            config.experimental.time_awareness,
            "experimental merges by key"
        );
        assert_eq!(
            config.reasoning,
            Reasoning {
                effort: None,
                summary: Some("auto".into())
            }
        );
        assert_eq!(config.model, "m");
        let refused = AgentConfig::parse(&map(json!({"model": null})), "", true);
        assert!(refused.is_err(), "model is not nullable");
    }
}
