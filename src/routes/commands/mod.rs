//! `commands`: `GET /commands` and `POST /commands/{name}`, over the frozen command
//! registry. Rust commands run on this worker; Python ones go over the bridge. Both are
//! bound by the same rules ([`crate::commands::coerce`]), so callers cannot tell them
//! apart.

pub mod python;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::schema_object;
use crate::api::{ApiError, Group, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::bridge::link::{self, Answer};
use crate::bridge::BridgeError;
use crate::commands::{coerce, CommandArg, Implementation, Registry};
use crate::http::response::JSON_CONTENT_TYPE;
use crate::http::Response;

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::new(Method::Get, "/commands", Group::Commands, handler(list))
            .id("list_commands")
            .formerly("commands_list").scopes(&["commands:list"])
            .kept_locked_down()
            .summary("Visible named commands with their arguments (hidden ones and those the caller lacks scopes for are left out).")
            .returns(|| schema_object(&["commands"], json!({"commands": {"type": "array"}}))),
        Endpoint::new(Method::Post, "/commands/{name}", Group::Commands, handler(run))
            .id("run_command")
            .formerly("commands_run").scopes(&["commands:run"])
            .changes()
            .kept_locked_down()
            .summary("Run a named command with a JSON object of arguments; answers {\"result\": ...}.")
            // The body is the command's own arguments, bound by the registry's rules
            // (`crate::commands::coerce`), not declared here.
            .params(&[Param::path("name").doc("The command's name, as GET /commands lists it.")])
            .returns(|| schema_object(&["result"], json!({"result": {}})))
            .also_answers(&[400, 403, 404, 500, 503]),
    ]
}

#[derive(Serialize)]
struct Listed<'a> {
    name: &'a str,
    description: &'a str,
    args: &'a [CommandArg],
}

/// `GET /commands`.
async fn list(call: Call) -> Result<Response, ApiError> {
    let identity = &call.identity;
    let commands: Vec<Listed<'_>> = call
        .group_state::<Registry>()?
        .listed(|scopes| identity.has_scopes(scopes))
        .map(|c| Listed {
            name: &c.name,
            description: &c.description,
            args: &c.args,
        })
        .collect();
    Ok(Response::ok(&json!({ "commands": commands })))
}

/// `POST /commands/{name}`.
async fn run(call: Call) -> Result<Response, ApiError> {
    let name = call.path_param("name").unwrap_or_default().to_string();
    let Some(command) = call.group_state::<Registry>()?.get(&name) else {
        return Err(ApiError::new(
            404,
            "ValueError",
            format!("Unknown command: {name}. GET /commands lists the commands you can run"),
        ));
    };
    if let Some(scope) = call.identity.missing_scope(&command.scopes) {
        return Err(ApiError::new(
            403,
            "PermissionError",
            format!(
                "Command '{name}' needs scope '{scope}', which the caller '{}' does not have",
                call.identity.id
            ),
        )
        .with_code("missing_scope"));
    }
    let body: Map<String, Value> = call.json()?;
    let defaults = match command.implementation {
        Implementation::Native(_) => coerce::Defaults::Apply,
        Implementation::Python => coerce::Defaults::Leave,
    };
    let args =
        coerce::bind(&command.args, &body, defaults).map_err(|e| ApiError::bad_request(e.0))?;
    match &command.implementation {
        Implementation::Native(run) => match run(args).await {
            Ok(result) => Ok(Response::ok(&json!({ "result": result }))),
            Err(error) => Err(ApiError::new(500, error.type_name, error.message)),
        },
        Implementation::Python => {
            let bridge = python_worker(&call, "command")?;
            let request = json!({"op": "command", "name": name, "args": args});
            match link::call(&bridge, &call.services().environment, &request)
                .await
                .map_err(bridge_error)?
            {
                Answer::Response { status, body } => Ok(raw_json(status, body)),
                Answer::Stream(_) => Err(ApiError::internal(
                    "RuntimeError",
                    "the Python worker answered a command with an event stream",
                )),
            }
        }
    }
}

/// A JSON body the Python worker produced, passed on as it is.
pub(crate) fn raw_json(status: u16, body: Box<RawValue>) -> Response {
    // The package refuses other statuses (a 1xx would read as an interim answer and
    // break the client's connection); a worker that sends one anyway is a 500.
    let status = if (100..=599).contains(&status) {
        status
    } else {
        500
    };
    let text: Box<str> = body.into();
    Response::raw(status, JSON_CONTENT_TYPE, text.into_string().into_bytes())
}

/// A call the Python worker could not answer: 500 when it died or hung with the call
/// in flight, 503 when none came up in time.
pub(crate) fn bridge_error(error: BridgeError) -> ApiError {
    match error {
        BridgeError::Lost(why) => ApiError::internal(
            "RuntimeError",
            format!("The Python worker ended while running this call: {why}. It has been restarted; the call was not completed"),
        )
        .with_code("worker_lost"),
        BridgeError::Unavailable(why) => {
            ApiError::new(503, "RuntimeError", why).with_code("worker_unavailable")
        }
        BridgeError::Protocol(why) => ApiError::internal("RuntimeError", why).with_code("worker_protocol"),
    }
}

/// The Python worker a Python `what` (command or route) runs on: 500 when this
/// server serves none.
fn python_worker(
    call: &Call,
    what: &str,
) -> Result<std::sync::Arc<crate::bridge::Bridge>, ApiError> {
    call.services()
        .groups
        .get_arc::<crate::bridge::Bridge>()
        .ok_or_else(|| {
            ApiError::internal(
                "RuntimeError",
                format!("this {what} is implemented in Python, but no Python worker is configured"),
            )
        })
}

/// The group's state: the frozen registry of named commands (the embedding program's
/// and the Python worker's), and the Python worker when there is one.
pub fn registrar(
    commands: Vec<crate::commands::Command>,
    bridge: Option<std::sync::Arc<crate::bridge::Bridge>>,
) -> crate::app::Registrar {
    Box::new(move |setup| {
        let (registry, replaced) = crate::commands::Registry::new(commands);
        for name in replaced {
            setup.warn(format!(
                "command '{name}' is registered twice; the later registration wins"
            ));
        }
        setup.provide(std::sync::Arc::new(registry));
        if let Some(bridge) = bridge {
            setup.provide(bridge);
        }
    })
}
