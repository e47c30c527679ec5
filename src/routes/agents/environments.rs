//! `/v1/agents/environments`: this sandbox as the one environment, its workspace
//! files, and environment templates; three resource declarations over
//! `crate::agents::environments`.

use serde_json::{json, Map, Value};

use super::resource::{Named, Op, Resource};
use super::stored::paging;
use super::{agents_of, args, not_found, path_value, server_runtime};
use crate::agents::environments::{
    self, environment_id, file_object, list_files, parse_template, workspace_dir, workspace_rel,
    Template, Workspace,
};
use crate::agents::files;
use crate::agents::objects::label;
use crate::agents::vaults::list_page;
use crate::agents::AgentError;
use crate::api::{ApiError, Param};
use crate::app::{handler, Call, Endpoint};
use crate::fs::CallerPath;
use crate::http::Response;
use crate::routes::shared::paths_refusal;

const ENVIRONMENT: Named = Named {
    object: "environment",
    param: "environment_id",
};

const FILE: Named = Named {
    object: "environment file",
    param: "file_path",
};

const TEMPLATE: Named = Named {
    object: "environment template",
    param: "environment_template_id",
};

fn template_fields() -> Vec<Param> {
    vec![
        Param::body("name", "string", false).doc("A display name (null clears it)."),
        Param::body("files", "array", false).doc("Inline files ({type: inline, path: /workspace/..., data: base64}); file_id files are refused."),
        Param::body("env", "string_map", false).doc("Variables for the agents (write-only)."),
        Param::body("setup_commands", "array", false).doc("[{command, cwd?}] run with /bin/sh -c (write-only)."),
        Param::body("desktop", "object", false).doc("Only {enabled: false}."),
        Param::body("capability_directories", "array", false).doc("Refused unless empty."),
        Param::body("network", "object", false).doc("Refused: the sandbox's network is the container's."),
        Param::body("packages", "object", false).doc("Refused unless its lists are empty."),
        Param::body("plugins", "array", false).doc("Refused unless empty."),
        Param::body("skills", "array", false).doc("Refused unless empty."),
    ]
}

pub fn endpoints() -> Vec<Endpoint> {
    let mut endpoints = Resource::new("environments", "/v1/agents/environments", ENVIRONMENT)
        .op(Op::create(
            "Apply a configuration (template, inline files, env, setup commands) to this sandbox, the one environment.",
            handler(create),
        )
        .params(vec![
            Param::body("environment", "object", true).doc("{type: openai_hosted, ...}: what a sandbox can honour is applied here."),
            Param::body("vault_ids", "array", false).doc("Refused unless empty: attach vaults to sessions."),
        ]))
        .op(Op::list("This sandbox, as the one self_hosted environment.", handler(list))
            .params(paging())
            .params(vec![Param::query("type", "string", false)
                .one_of(&["openai_hosted", "self_hosted"])
                .doc("openai_hosted lists nothing: the one environment is self_hosted.")]))
        .op(Op::get("This sandbox's environment.", handler(get)))
        .endpoints();
    endpoints.extend(
        Resource::new(
            "environment_files",
            "/v1/agents/environments/{environment_id}/files",
            FILE,
        )
        .within(ENVIRONMENT)
        .op(Op::create(
            "Write one file into the workspace (the base directory).",
            handler(file_create),
        )
        .params(vec![
            Param::body("type", "string", true)
                .one_of(&["inline", "file_id"])
                .doc("inline (data) or file_id (a file of POST /v1/files)."),
            Param::body("path", "string", true).doc("/workspace/...: beneath the base directory."),
            Param::body("data", "string", false)
                .doc("The contents, standard base64 (ABX_MAX_UPLOAD_SIZE decoded bytes at most)."),
            Param::body("file_id", "string", false)
                .doc("With type file_id: the id POST /v1/files answered (yours only)."),
        ]))
        .op(Op::list(
            "The workspace's regular files, in path order, a page at a time.",
            handler(file_list),
        )
        .params(vec![
            Param::query("limit", "integer", false)
                .range(1.0, 100.0)
                .default("20")
                .doc("How many to list (1 to 100)."),
            Param::query("order", "string", false)
                .one_of(&["asc", "desc"])
                .default("\"desc\"")
                .doc("By path components."),
            Param::query("page", "string", false).doc("The previous page's next."),
            Param::query("path", "string", false).doc("A directory: /workspace or beneath it."),
        ]))
        .endpoints(),
    );
    endpoints.extend(
        Resource::new(
            "environment_templates",
            "/v1/agents/environments/templates",
            TEMPLATE,
        )
        .op(
            Op::create("Store an environment template.", handler(template_create))
                .params(template_fields()),
        )
        .op(Op::list_records::<Template>("Your environment templates."))
        .op(Op::get_record::<Template>(
            "An environment template (env, setup commands and file contents are never shown).",
        ))
        .op(Op::update(
            "Replace the fields the body names.",
            handler(template_update),
        )
        .params(template_fields()))
        .op(Op::delete(
            "Delete an environment template.",
            handler(template_delete),
        ))
        .endpoints(),
    );
    // What writes or lists workspace files applies the policy's `paths` (rule_of).
    endpoints
        .into_iter()
        .map(|endpoint| {
            let applies_paths = matches!(
                endpoint.spec.id.as_ref(),
                "environments_create" | "environment_files_create" | "environment_files_list"
            );
            if applies_paths {
                endpoint.enforces(&["paths"])
            } else {
                endpoint
            }
        })
        .collect()
}

/// What a request's environment work touches; `rule` is the endpoint's policy
/// `paths` ([`rule_of`]).
fn workspace<'a>(call: &'a Call, rule: &'a dyn Fn(&CallerPath) -> Option<String>) -> Workspace<'a> {
    let services = call.services();
    Workspace {
        base: &services.base,
        driver: services.driver,
        max_file_bytes: services.max_upload_size,
        environment: &services.environment,
        children: &services.children,
        path_rule: rule,
        id: environment_id(services.base.path()),
    }
}

/// The endpoint's policy `paths` rule, as the workspace asks it.
fn rule_of(call: &Call) -> impl Fn(&CallerPath) -> Option<String> + '_ {
    |caller: &CallerPath| paths_refusal(call.decision(), &call.spec().id, caller).map(|e| e.message)
}

/// The environment the path names, which must be this sandbox's.
fn this_environment(call: &Call) -> Result<String, ApiError> {
    let id = path_value(call, ENVIRONMENT.param);
    if id != environment_id(call.services().base.path()) {
        return Err(not_found("environment", &id, ENVIRONMENT.param));
    }
    Ok(id)
}

async fn create(call: Call) -> Result<Response, ApiError> {
    args(&call, server_runtime)?;
    let body: Map<String, Value> = call.json()?;
    let key = call.header("idempotency-key");
    let rule = rule_of(&call);
    let answer = environments::create_environment(
        &agents_of(&call)?,
        &workspace(&call, &rule),
        &call.identity.id,
        key,
        &body,
    )
    .await?;
    Ok(Response::ok(&answer))
}

async fn list(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let id = environment_id(call.services().base.path());
    let after = args.str("after");
    if after.is_some_and(|a| a != id) {
        return Err(
            AgentError::invalid("after", "after names no environment of this list.").into(),
        );
    }
    let listed = args.str("type") != Some("openai_hosted") && after.is_none();
    let data = match listed {
        true => vec![
            environments::environment_info(
                &agents_of(&call)?,
                &call.identity.id,
                &id,
                call.services().base.path(),
            )
            .await?,
        ],
        false => Vec::new(),
    };
    let mut page = list_page(data, false);
    page["x_agent_sandbox"] = label("agent-sandbox", &["environment_is_this_sandbox"]);
    Ok(Response::ok(&page))
}

async fn get(call: Call) -> Result<Response, ApiError> {
    let id = this_environment(&call)?;
    let info = environments::environment_info(
        &agents_of(&call)?,
        &call.identity.id,
        &id,
        call.services().base.path(),
    )
    .await?;
    Ok(Response::ok(&info))
}

async fn file_create(call: Call) -> Result<Response, ApiError> {
    let mut args = args(&call, server_runtime)?;
    let id = this_environment(&call)?;
    let path = args.string("path");
    let rel = workspace_rel(&path, "path")?;
    let data = if args.str("type") == Some("file_id") {
        // A file POST /v1/files kept for this caller (the reference's param name).
        let Some(Value::String(file_id)) = args.take("file_id") else {
            return Err(AgentError::invalid(
                "file.file_id",
                "file_id is required for a file_id file.",
            )
            .into());
        };
        files::contents(
            &agents_of(&call)?,
            &call.identity.id,
            &file_id,
            "file.file_id",
        )
        .await?
    } else {
        if args.present("file_id") {
            return Err(AgentError::invalid(
                "file_id",
                "file_id goes with type file_id; an inline file sends data.",
            )
            .into());
        }
        let Some(Value::String(data)) = args.take("data") else {
            return Err(AgentError::invalid("data", "data is required for an inline file.").into());
        };
        data
    };
    let limit = call.services().max_upload_size;
    // Standard base64: 4 characters for every 3 bytes.
    if (data.len() as u64 / 4).saturating_mul(3) > limit {
        return Err(AgentError::Rejected {
            status: 413,
            code: "payload_too_large",
            param: Some("data".into()),
            message: format!("data decodes to more than {limit} bytes, the most this server takes (ABX_MAX_UPLOAD_SIZE)."),
        }
        .into());
    }
    let rule = rule_of(&call);
    let size = workspace(&call, &rule).write(&path, data, "path").await?;
    Ok(Response::ok(&file_object(&id, &rel, size)))
}

async fn file_list(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let id = this_environment(&call)?;
    let dir = match args.str("path") {
        Some(path) => workspace_dir(path, "path")?,
        None => String::new(),
    };
    let rule = rule_of(&call);
    workspace(&call, &rule).confine(&dir, "path")?;
    let page = list_files(
        &call.services().base,
        dir,
        args.str("order") != Some("asc"),
        args.uint("limit").unwrap_or(20) as usize,
        args.str("page"),
    )
    .await?;
    let data: Vec<Value> = page
        .files
        .iter()
        .map(|(rel, size)| file_object(&id, rel, *size))
        .collect();
    Ok(Response::ok(&json!({
        "object": "list",
        "data": data,
        "has_more": page.next.is_some(),
        "next": page.next,
        "x_agent_sandbox": label("agent-sandbox", &["environment_is_this_sandbox"]),
    })))
}

async fn template_create(call: Call) -> Result<Response, ApiError> {
    args(&call, server_runtime)?;
    let body: Map<String, Value> = call.json()?;
    let template = parse_template(&body)?;
    let object =
        environments::create_template(&agents_of(&call)?, &call.identity.id, template).await?;
    Ok(Response::ok(&object))
}

async fn template_update(call: Call) -> Result<Response, ApiError> {
    args(&call, server_runtime)?;
    let body: Map<String, Value> = call.json()?;
    let template = parse_template(&body)?;
    let id = path_value(&call, TEMPLATE.param);
    let object =
        environments::update_template(&agents_of(&call)?, &call.identity.id, &id, template).await?;
    Ok(Response::ok(&object))
}

async fn template_delete(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, TEMPLATE.param);
    environments::delete_template(&agents_of(&call)?, &call.identity.id, &id).await?;
    Ok(Response::ok(&json!({
        "id": id, "object": "agent.environment.template.deleted", "deleted": true,
        "x_agent_sandbox": label("agent-sandbox", &["environment_is_this_sandbox"]),
    })))
}
