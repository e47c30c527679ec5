//! `/v1/agents/runtimes` and `/v1/models`: the declared runtimes, and the implemented
//! ones as OpenAI models.

use serde_json::{json, Value};

use super::resource::{Named, Op, Resource};
use super::{cannot, cli, default_runtime, not_implemented, path_value, route};
use crate::agents::objects::{label, now_unix};
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
                        "agents_cannot_delete_models",
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
        let cli = runtime.cli();
        data.push(json!({
            "id": runtime.name(),
            "object": "agents.runtime",
            "aliases": runtime.aliases(),
            "implemented": runtime.implemented(),
            "installed": usable.is_some(),
            "version": usable.map(|u| u.version.clone()),
            "source": usable.map(|u| u.source.name()),
            "program": usable.map(|u| u.program.display().to_string()),
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
            "x_agent_sandbox": label(runtime.name(), &[]),
        }));
    }
    Ok(Response::ok(
        &json!({"object": "list", "data": data, "x_agent_sandbox": label("agent-sandbox", &[])}),
    ))
}

fn model_object(runtime: Runtime, created: u64) -> Value {
    json!({
        "id": runtime.name(),
        "object": "model",
        "created": created,
        "owned_by": "agent-sandbox",
        "x_agent_sandbox": label(runtime.name(), &["model_is_runtime"]),
    })
}

async fn models_list(call: Call) -> Result<Response, ApiError> {
    let created = started_unix(&call);
    let data: Vec<Value> = Runtime::ALL
        .into_iter()
        .filter(|r| r.implemented())
        .map(|r| model_object(r, created))
        .collect();
    Ok(Response::ok(
        &json!({"object": "list", "data": data, "x_agent_sandbox": label("agent-sandbox", &[])}),
    ))
}

async fn models_get(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, "model");
    match Runtime::parse(&id) {
        Some(runtime) if runtime.implemented() => {
            Ok(Response::ok(&model_object(runtime, started_unix(&call))))
        }
        Some(runtime) => Err(not_implemented(runtime)),
        None => Err(ApiError::new(
            404,
            "not_found_error",
            format!("The model '{id}' does not exist. GET /v1/models lists the local runtimes."),
        )
        .with_code("model_not_found")
        .with_field("param", "model")),
    }
}

/// When the server started, as a Unix time (the models' `created`).
fn started_unix(call: &Call) -> u64 {
    now_unix().saturating_sub(call.services().started.elapsed().as_secs())
}
