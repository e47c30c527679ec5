//! What `POST /v1/agents/sessions` and its update read besides plain fields: the
//! environment (where in this sandbox the thread runs), the agent (a saved one, with
//! overrides, or an inline one), the first input, and the vaults.

use serde_json::{json, Map, Value};

use super::{agents_of, invalid};
use crate::agents::environments::environment_id;
use crate::agents::input::check_metadata;
use crate::agents::records::{new_id, Scope};
use crate::agents::saved::{self, AgentConfig};
use crate::agents::sessions::inputs::{parse_messages, Input};
use crate::agents::sessions::NewSession;
use crate::agents::Agents;
use crate::api::{ApiError, Args};
use crate::app::Call;

/// A checked session create.
pub struct Setup {
    pub session: NewSession,
    /// The first turn's input, when the request carries one.
    pub input: Option<Input>,
}

pub async fn new_session(
    call: &Call,
    agents: &std::sync::Arc<Agents>,
    args: &mut Args,
) -> Result<Setup, ApiError> {
    let environment = args.take("environment").unwrap_or(Value::Null);
    let (environment, workspace) = environment_of(call, &environment).await?;
    let overrides = match args.take("agent") {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let agent_id = args.str("agent_id").map(str::to_string);
    let (config, agent_id) = session_agent(call, agents, agent_id, overrides).await?;
    let input = match args.value("input") {
        None | Some(Value::Null) => None,
        Some(input) => Some(Input::Message(parse_messages(input, "input")?)),
    };
    if workspace.is_none() && input.is_none() {
        return Err(invalid(
            "input",
            "input is required when environment.type is none: such a session has nothing to run but its first message.",
        ));
    }
    let vault_ids = match args.take("vault_ids") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(ids)) if ids.len() <= 10 => {
            let mut out = Vec::new();
            for (i, id) in ids.iter().enumerate() {
                let id = id.as_str().ok_or_else(|| {
                    invalid(
                        format!("vault_ids[{i}]").as_str(),
                        "vault_ids holds vault ids (strings).",
                    )
                })?;
                out.push(id.to_string());
            }
            out
        }
        Some(_) => {
            return Err(invalid(
                "vault_ids",
                "vault_ids holds at most 10 vault ids.",
            ))
        }
    };
    check_vaults(call, agents, &vault_ids, &config.tools).await?;
    let changes = plain_changes(args)?;
    Ok(Setup {
        session: NewSession {
            config,
            agent_id,
            environment,
            workspace,
            metadata: changes.get("metadata").cloned().unwrap_or(json!({})),
            vault_ids,
            review: changes
                .get("review")
                .and_then(Value::as_str)
                .map(str::to_string),
            prompt_cache_options: changes.get("prompt_cache_options").cloned(),
            spend_control: changes.get("spend_control").cloned(),
        },
        input,
    })
}

/// The environment as answered, and the workspace relative to the base directory (`None`
/// for `none`).
pub(super) async fn environment_of(
    call: &Call,
    environment: &Value,
) -> Result<(Value, Option<String>), ApiError> {
    let kind = environment
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match kind {
        "self_hosted" => {
            if let Some(dirs) = environment.get("capability_directories") {
                if dirs.as_array().is_some_and(|d| !d.is_empty()) {
                    return Err(invalid(
                        "environment.capability_directories",
                        "codex takes no capability directories from a local session; put skills and plugins in its own configuration.",
                    ));
                }
            }
            let given = environment
                .get("workspace_directory")
                .and_then(Value::as_str)
                .unwrap_or("/workspace");
            let relative = workspace_relative(call, given);
            crate::routes::shared::working_dir(call, Some(&relative))
                .await
                .map_err(|e| {
                    invalid(
                        "environment.workspace_directory",
                        format!("workspace_directory '{given}' must be an existing directory beneath the base directory: {}", e.message),
                    )
                })?;
            Ok((
                json!({
                    "type": "self_hosted",
                    "id": environment_id(call.services().base.path()),
                    "capability_directories": [],
                    // No exec-server runs here: the thread runs in this sandbox itself.
                    "remote_url": "",
                    "workspace_directory": given,
                }),
                Some(relative),
            ))
        }
        "none" => Ok((json!({"type": "none"}), None)),
        "openai_hosted" => Err(invalid(
            "environment.type",
            "openai_hosted environments are OpenAI's containers; this server runs sessions in its own sandbox: use {\"type\": \"self_hosted\", \"workspace_directory\": \"/workspace\"}.",
        )),
        "" => Err(invalid("environment.type", "environment.type is required: self_hosted or none.")),
        other => Err(invalid("environment.type", format!("Unknown environment type '{other}': self_hosted or none."))),
    }
}

/// `/workspace[/...]` (the SDK's convention) and absolute paths inside the base
/// directory as paths relative to it; anything else is taken relative to it.
fn workspace_relative(call: &Call, given: &str) -> String {
    if given == "/workspace" {
        return ".".into();
    }
    if let Some(rest) = given.strip_prefix("/workspace/") {
        return rest.to_string();
    }
    let base = call.config().base_dir.to_string_lossy().to_string();
    if let Some(rest) = given.strip_prefix(&base) {
        let rest = rest.trim_start_matches('/');
        return if rest.is_empty() {
            ".".into()
        } else {
            rest.to_string()
        };
    }
    given.trim_start_matches('/').to_string()
}

/// The plain fields of a create or update (metadata, review, prompt cache, spend
/// control), checked, and the agent changes of an update.
fn plain_changes(args: &mut Args) -> Result<Map<String, Value>, ApiError> {
    let mut changes = Map::new();
    if args.sent("metadata") {
        changes.insert("metadata".into(), check_metadata(args.take("metadata"))?);
    }
    if let Some(review) = args.str("review") {
        changes.insert("review".into(), json!(review));
    }
    if let Some(options) = args.take("prompt_cache_options") {
        let ttl = options.get("ttl").and_then(Value::as_str);
        if !matches!(ttl, None | Some("30m") | Some("12h")) {
            return Err(invalid(
                "prompt_cache_options.ttl",
                "ttl must be 30m or 12h.",
            ));
        }
        changes.insert("prompt_cache_options".into(), options);
    }
    if let Some(spend) = args.take("spend_control") {
        if !spend.get("limit").is_some_and(Value::is_null) {
            return Err(invalid(
                "spend_control.limit",
                "No cost meter runs for a local session, so a spend limit cannot be kept: send {\"limit\": null} or leave spend_control out.",
            ));
        }
        changes.insert(
            "spend_control".into(),
            json!({"limit": null, "consumed": null}),
        );
    }
    Ok(changes)
}

/// An update's changes: plain fields, and the agent's (`model`, `reasoning`,
/// `service_tier`, `tools`).
pub fn changes(
    args: &mut Args,
) -> Result<(Map<String, Value>, Option<saved::AgentPatch>), ApiError> {
    let changes = plain_changes(args)?;
    let agent = match args.take("agent") {
        Some(Value::Object(map)) => Some(agent_changes(map)?),
        _ => None,
    };
    Ok((changes, agent))
}

/// The session's agent configuration and the id its snapshot shows: the saved agent
/// `agent_id` (the caller's) with `overrides` on top, or the inline agent
/// `overrides` describes (then `agent.model` is required).
pub(super) async fn session_agent(
    call: &Call,
    agents: &std::sync::Arc<Agents>,
    agent_id: Option<String>,
    overrides: Map<String, Value>,
) -> Result<(AgentConfig, String), ApiError> {
    let patch = AgentConfig::parse(&overrides, "agent.", agent_id.is_some())?;
    let (config, id) = match agent_id {
        None => (AgentConfig::new(patch, "agent.")?, new_id("agent_")),
        Some(id) => {
            let owner = call.identity.id.clone();
            let key = id.clone();
            let saved = agents
                .transact(move |t| saved::load(t, &owner, &key))
                .await?;
            (saved.config.overridden(patch), id)
        }
    };
    // What codex cannot honour is refused now, not at the first turn.
    let agent = serde_json::to_value(&config)
        .map_err(|e| ApiError::new(500, "server_error", e.to_string()))?;
    // A model naming claude-code runs the session on Claude Code; what it cannot
    // honour is refused here.
    crate::agents::sessions::check_runtime(&agent, None)
        .map_err(|e| ApiError::from(e).with_code("unsupported_parameter"))?;
    crate::agents::codex_map::thread_plan(&agent, "/")
        .map_err(|u| invalid(&u.param, u.message).with_code("unsupported_parameter"))?;
    Ok((config, id))
}

/// What an update may change of a session's agent.
fn agent_changes(map: Map<String, Value>) -> Result<saved::AgentPatch, ApiError> {
    if let Some(key) = map
        .keys()
        .find(|k| !matches!(k.as_str(), "model" | "reasoning" | "service_tier" | "tools"))
    {
        return Err(invalid(
            &format!("agent.{key}"),
            format!("Unsupported parameter: a session's update changes its agent's model, reasoning, service_tier or tools, not '{key}'."),
        )
        .with_code("unsupported_parameter"));
    }
    Ok(AgentConfig::parse(&map, "agent.", true)?)
}

/// The vaults a session names must be the caller's, and each MCP tool's credential one
/// of theirs for that tool's URL.
pub(super) async fn check_vaults(
    call: &Call,
    agents: &std::sync::Arc<Agents>,
    ids: &[String],
    tools: &[Value],
) -> Result<(), ApiError> {
    let owner = call.identity.id.clone();
    let (ids, tools) = (ids.to_vec(), tools.to_vec());
    agents
        .read(move |t| {
            use crate::agents::records::Transaction;
            for id in &ids {
                t.get::<crate::agents::vaults::Vault>(Scope::owner(&owner), id)
                    .map_err(crate::agents::AgentError::store("vault", id, "vault_ids"))?;
            }
            crate::agents::vaults::check_mcp_credentials(t, &owner, &ids, &tools, "agent.tools")
        })
        .await?;
    Ok(())
}

/// The session's agent as codex takes it (`codex_map::thread_plan`), each http MCP
/// server's bearer resolved: the tool's own `authorization`, its `credential_id` in
/// the session's vaults, or the vaults' credential for its URL; and the variables the
/// caller's environment setups gave its agents.
pub async fn codex_agent(
    call: &Call,
    session: &crate::agents::sessions::records::Session,
) -> Result<(Value, Vec<(String, String)>), ApiError> {
    let owner = call.identity.id.clone();
    let vaults = session.vault_ids.clone();
    let session = session.clone();
    let found = agents_of(call)?
        .read(move |t| {
            // Opened on the blocking pool: the first open may read the key file.
            let config = crate::agents::sessions::open_config(&session)?;
            let mut agent = serde_json::to_value(&config)
                .map_err(|e| crate::agents::AgentError::Failed(e.to_string()))?;
            for tool in agent["tools"].as_array_mut().into_iter().flatten() {
                if tool["type"] != "mcp" || tool["transport"]["type"] == "stdio" {
                    continue;
                }
                let credential = tool.as_object_mut().and_then(|m| m.remove("credential_id"));
                if tool["transport"]["authorization"].is_string() {
                    continue;
                }
                let url = tool["transport"]["server_url"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let token = match credential.as_ref().and_then(Value::as_str) {
                    Some(id) => Some(crate::agents::vaults::credential_token(
                        t,
                        &owner,
                        &vaults,
                        id,
                        &url,
                        "agent.tools.credential_id",
                    )?),
                    None if vaults.is_empty() => None,
                    None => crate::agents::vaults::bearer_for(t, &owner, &vaults, &url)?,
                };
                if let Some(token) = token {
                    tool["transport"]["authorization"] = json!(token);
                }
            }
            let env = crate::agents::environments::agent_env(t, &owner)?;
            Ok::<_, crate::agents::AgentError>((agent, env))
        })
        .await?;
    Ok(found)
}
