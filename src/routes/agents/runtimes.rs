//! `/v1/agents/runtimes` and `/v1/models`: the declared runtimes, and the implemented
//! ones as OpenAI models.

use serde_json::{json, Value};

use super::resource::{Named, Op, Resource};
use super::{
    agents_of, cannot, cli, default_runtime, not_implemented, path_value, route, store_error,
};
use crate::agents::objects::{label, now_unix};
use crate::agents::records::{ListQuery, Order, Scope};
use crate::agents::saved::SavedAgent;
use crate::agents::Runtime;
use crate::api::{ApiError, Method};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;

pub fn endpoints() -> Vec<Endpoint> {
    let model = Named {
        object: "model",
        param: "model",
    };
    let mut endpoints = vec![route(
        Method::Get,
        "/v1/agents/runtimes",
        "agents_runtimes",
        "Every declared agent runtime: implemented, installed, version.",
        handler(runtimes),
    )];
    endpoints.extend(
        Resource::new("models", "/v1/models", model)
            .op(Op::list("The implemented runtimes, as models.", handler(models_list)))
            .op(Op::get("One runtime, as a model.", handler(models_get)))
            .op(Op::delete(
                "Refused: local runtimes cannot be deleted.",
                handler(|_| async {
                    Err(cannot(
                        "Models are the local agent runtimes; they cannot be deleted through the API.",
                    ))
                }),
            ))
            .endpoints(),
    );
    endpoints
}

async fn runtimes(call: Call) -> Result<Response, ApiError> {
    let default = default_runtime(&call);
    let auto_install = call.config().agents_auto_install;
    let mut data = Vec::new();
    for runtime in Runtime::ALL {
        let status = match runtime.implemented() {
            true => Some(cli::status(&call, runtime).await?),
            false => None,
        };
        let usable = status.as_ref().and_then(|s| s.usable.as_ref());
        // The reference repeats `implemented` in its label.
        let mut runtime_label = label(runtime.name(), &[]);
        runtime_label["implemented"] = json!(runtime.implemented());
        let cli = runtime.cli();
        let program = usable.map(|u| u.program.display().to_string());
        data.push(json!({
            "id": runtime.name(),
            "object": "agent.runtime",
            // The reference's descriptive fields, so its clients read them here too.
            "name": runtime.name(),
            "binary": runtime.binary(),
            "path": program,
            "experimental": runtime.experimental(),
            "install_steps": match cli.as_ref() {
                Some(cli) => json!([["npm", "install", "-g", format!("{}@{}", cli.package, cli.version)]]),
                None => json!([]),
            },
            "aliases": runtime.aliases(),
            "implemented": runtime.implemented(),
            "installed": usable.is_some(),
            "version": usable.map(|u| u.version.clone()),
            "source": usable.map(|u| u.source.name()),
            "program": program,
            "installing": status.as_ref().is_some_and(|s| s.installing),
            "auto_install": runtime.implemented() && auto_install,
            "ignored_on_path": status.as_ref().and_then(|s| s.ignored.as_ref()).map(|(path, version)| {
                json!({"program": path.display().to_string(), "version": version})
            }),
            "last_install_error": status.as_ref().and_then(|s| s.last_failure.as_ref()).map(|f| {
                json!({"code": f.code, "message": f.message})
            }),
            "default": runtime == default,
            "cli": cli.as_ref().map(|c| c.program),
            "pinned_version": cli.as_ref().map(|c| c.version),
            "install": runtime.install_command(),
            "x_agent_sandbox": runtime_label,
        }));
    }
    Ok(Response::ok(
        &json!({"object": "list", "data": data, "x_agent_sandbox": label("agent-sandbox", &[])}),
    ))
}

/// Who owns every model here, as the reference names it.
const OWNED_BY: &str = "agent-sandbox-local";

fn model_object(runtime: Runtime, created: u64) -> Value {
    let mut label = label(runtime.name(), &["model_is_runtime"]);
    label["kind"] = json!("adapter");
    json!({
        "id": runtime.name(),
        "object": "model",
        "created": created,
        "owned_by": OWNED_BY,
        "x_agent_sandbox": label,
    })
}

/// A saved agent as a model: `/v1/responses` runs it when `model` is its id.
fn saved_agent_model(agent: &SavedAgent) -> Value {
    let mut label = label("agent-sandbox", &[]);
    label["kind"] = json!("agent_definition");
    json!({
        "id": agent.id,
        "object": "model",
        "created": agent.created_at,
        "owned_by": OWNED_BY,
        "x_agent_sandbox": label,
    })
}

/// The caller's saved agents, then the implemented runtimes (the reference's order).
async fn models(call: &Call) -> Result<Vec<Value>, ApiError> {
    let agents = agents_of(call)?;
    let mut data = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let query = ListQuery {
            after: after.as_deref(),
            limit: 100,
            order: Order::Asc,
        };
        let page = agents
            .list::<SavedAgent>(Scope::owner(&call.identity.id), &query)
            .await
            .map_err(|e| store_error(e, "agent", "", "model"))?;
        data.extend(page.data.iter().map(saved_agent_model));
        match (page.has_more, page.last_id) {
            (true, Some(last)) => after = Some(last),
            _ => break,
        }
    }
    let created = started_unix(call);
    data.extend(
        Runtime::ALL
            .into_iter()
            .filter(|r| r.implemented())
            .map(|r| model_object(r, created)),
    );
    Ok(data)
}

async fn models_list(call: Call) -> Result<Response, ApiError> {
    let data = models(&call).await?;
    Ok(Response::ok(
        &json!({"object": "list", "data": data, "x_agent_sandbox": label("agent-sandbox", &[])}),
    ))
}

async fn models_get(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, "model");
    if let Some(runtime) = Runtime::parse(&id).filter(|r| !r.implemented()) {
        return Err(not_implemented(runtime));
    }
    let found = match Runtime::parse(&id) {
        Some(runtime) => Some(model_object(runtime, started_unix(&call))),
        None => models(&call)
            .await?
            .into_iter()
            .find(|m| m["id"] == id.as_str()),
    };
    found.map(|model| Response::ok(&model)).ok_or_else(|| {
        ApiError::new(
            404,
            "not_found_error",
            format!("The model '{id}' does not exist. GET /v1/models lists the local runtimes and your saved agents."),
        )
        .with_code("model_not_found")
        .with_field("param", "model")
    })
}

/// When the server started, as a Unix time (the models' `created`).
fn started_unix(call: &Call) -> u64 {
    now_unix().saturating_sub(call.services().started.elapsed().as_secs())
}
