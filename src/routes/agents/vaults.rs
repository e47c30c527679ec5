//! `/v1/vaults` and their credentials: two resource declarations over
//! `crate::agents::vaults`. Secrets travel in, never out: no answer, log line or
//! refusal holds one.

use serde_json::{json, Map, Value};

use super::resource::{Named, Op, Resource};
use super::stored::paging;
use super::{agents_of, args, path_value, server_runtime};
use crate::agents::body::metadata;
use crate::agents::objects::{label, LIST_DIFFERENCES};
use crate::agents::records::Order;
use crate::agents::vaults::{self, parse_name, vault_fields, Credential, Filter, Vault};
use crate::agents::AgentError;
use crate::api::{ApiError, Args, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;

const VAULT: Named = Named {
    object: "vault",
    param: "vault_id",
};

const CREDENTIAL: Named = Named {
    object: "credential",
    param: "credential_id",
};

fn metadata_param() -> Param {
    Param::body("metadata", "string_map", false)
        .doc("16 strings at most, keys up to 64 and values up to 512 characters.")
}

fn filters() -> Vec<Param> {
    let mut params = paging();
    params.push(
        Param::query("status", "string", false)
            .one_of(&["active", "archived"])
            .doc("active or archived (or status[]=... repeated); everything here is active."),
    );
    params
}

pub fn endpoints() -> Vec<Endpoint> {
    let mut endpoints = Resource::new("vaults", "/v1/vaults", VAULT)
        .op(
            Op::create("Create a vault for MCP credentials.", handler(create)).params(vec![
                Param::body("name", "string", false).doc("Trimmed, 1 to 256 bytes."),
                metadata_param(),
            ]),
        )
        .op(Op::list(
            "Your vaults (filters: status, metadata[key]=value).",
            handler(list),
        )
        .params(filters()))
        .op(Op::get_record::<Vault>("A vault."))
        .op(
            Op::update("Rename a vault or replace its metadata.", handler(update)).params(vec![
                Param::body("name", "string", false)
                    .doc("Trimmed, 1 to 256 bytes; null clears it."),
                metadata_param(),
            ]),
        )
        .op(Op::delete(
            "Delete a vault and its credentials.",
            handler(delete),
        ))
        .endpoints();
    endpoints.extend(
        Resource::new("vault_credentials", "/v1/vaults/{vault_id}/credentials", CREDENTIAL)
            .within(VAULT)
            .op(Op::create("Store an MCP server's token (write-only).", handler(credential_create)).params(vec![
                Param::body("auth", "object", true).doc("static_bearer {mcp_server_url, token} or mcp_oauth {mcp_server_url, access_token, expires_at?}."),
                Param::body("name", "string", true).doc("Trimmed, 1 to 256 bytes."),
                metadata_param(),
            ]))
            .op(Op::list("A vault's credentials (filters: status, metadata[key]=value).", handler(credential_list)).params(filters()))
            .op(Op::get_record::<Credential>("A credential, without its secrets."))
            .op(Op::update("Rotate a credential's secret (auth) or replace its metadata.", handler(credential_update)).params(vec![
                Param::body("auth", "object", false).doc("The credential's type with its new secret."),
                metadata_param(),
            ]))
            .op(Op::delete("Delete a credential.", handler(credential_delete)))
            .endpoints(),
    );
    endpoints
}

fn body(call: &Call) -> Result<(Args, Map<String, Value>), ApiError> {
    let args = args(call, server_runtime)?;
    let body: Map<String, Value> = call.json()?;
    Ok((args, body))
}

fn deleted(id: &str, object: &str) -> Response {
    Response::ok(&json!({
        "id": id, "object": object, "deleted": true,
        "x_agent_sandbox": label("agent-sandbox", &LIST_DIFFERENCES),
    }))
}

/// `after`, `limit`, `order` and the filters of a list.
fn page_of(call: &Call) -> Result<(Option<String>, usize, Order, Filter), ApiError> {
    let args = call.args()?;
    let filter = Filter::from_query(call.query_pairs())?;
    Ok((
        args.str("after").map(str::to_string),
        args.uint("limit").unwrap_or(20) as usize,
        args.str("order")
            .and_then(Order::parse)
            .unwrap_or(Order::Desc),
        filter,
    ))
}

async fn create(call: Call) -> Result<Response, ApiError> {
    let (_, body) = body(&call)?;
    let (name, metadata) = vault_fields(&body)?;
    let object =
        vaults::create_vault(&agents_of(&call)?, &call.identity.id, name, metadata).await?;
    Ok(Response::ok(&object))
}

async fn list(call: Call) -> Result<Response, ApiError> {
    let (after, limit, order, filter) = page_of(&call)?;
    let page = vaults::list_vaults(
        &agents_of(&call)?,
        &call.identity.id,
        after,
        limit,
        order,
        filter,
    )
    .await?;
    Ok(Response::ok(&page))
}

async fn update(call: Call) -> Result<Response, ApiError> {
    let (_, body) = body(&call)?;
    let name = match body.get("name") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(Value::String(s)) => Some(Some(parse_name(s, "name")?)),
        Some(_) => return Err(AgentError::invalid("name", "name must be a string.").into()),
    };
    let metadata = match body.get("metadata") {
        None | Some(Value::Null) => None,
        value => Some(metadata(value, "metadata")?),
    };
    let id = path_value(&call, VAULT.param);
    let object =
        vaults::update_vault(&agents_of(&call)?, &call.identity.id, &id, name, metadata).await?;
    Ok(Response::ok(&object))
}

async fn delete(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, VAULT.param);
    vaults::delete_vault(&agents_of(&call)?, &call.identity.id, &id).await?;
    Ok(deleted(&id, "vault.deleted"))
}

async fn credential_create(call: Call) -> Result<Response, ApiError> {
    let (args, body) = body(&call)?;
    let name = parse_name(&args.string("name"), "name")?;
    let metadata = metadata(body.get("metadata"), "metadata")?;
    let auth = body.get("auth").cloned().unwrap_or(Value::Null);
    let vault = path_value(&call, VAULT.param);
    let object = vaults::create_credential(
        &agents_of(&call)?,
        &call.identity.id,
        &vault,
        name,
        metadata,
        &auth,
    )
    .await?;
    Ok(Response::ok(&object))
}

async fn credential_list(call: Call) -> Result<Response, ApiError> {
    let (after, limit, order, filter) = page_of(&call)?;
    let vault = path_value(&call, VAULT.param);
    let page = vaults::list_credentials(
        &agents_of(&call)?,
        &call.identity.id,
        &vault,
        after,
        limit,
        order,
        filter,
    )
    .await?;
    Ok(Response::ok(&page))
}

async fn credential_update(call: Call) -> Result<Response, ApiError> {
    let (_, body) = body(&call)?;
    let auth = body.get("auth").filter(|a| !a.is_null()).cloned();
    let metadata = match body.get("metadata") {
        None | Some(Value::Null) => None,
        value => Some(metadata(value, "metadata")?),
    };
    let vault = path_value(&call, VAULT.param);
    let id = path_value(&call, CREDENTIAL.param);
    let object = vaults::update_credential(
        &agents_of(&call)?,
        &call.identity.id,
        &vault,
        &id,
        auth,
        metadata,
    )
    .await?;
    Ok(Response::ok(&object))
}

async fn credential_delete(call: Call) -> Result<Response, ApiError> {
    let vault = path_value(&call, VAULT.param);
    let id = path_value(&call, CREDENTIAL.param);
    vaults::delete_credential(&agents_of(&call)?, &call.identity.id, &vault, &id).await?;
    Ok(deleted(&id, "vault.credential.deleted"))
}
