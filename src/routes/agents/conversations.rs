//! `/v1/conversations`: a thread of items that responses continue. A response created
//! with `conversation` resumes the CLI session that conversation started (one per
//! runtime) and appends its input and output items; items added here directly are
//! handed to the CLI, as a transcript ahead of the prompt, by the next turn.

use serde_json::{json, Value};

use super::responses::{conversation_items, list_page, new_conversation};
use super::{body, invalid, label, metadata, not_found, now_unix, only_known, route, store_error};
use crate::agents::store::{new_id, MAX_ITEMS};
use crate::api::{ApiError, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;

const DIFFERENCES: [&str; 2] = ["cli_session", "objects_in_memory"];

pub fn endpoints() -> Vec<Endpoint> {
    let id = Param::path("conversation_id");
    vec![
        route(
            Method::Post,
            "/v1/conversations",
            "conversations_create",
            "Start a conversation, optionally with items.",
            handler(create),
        )
        .params(&[
            Param::body("items", "array", false),
            Param::body("metadata", "object", false),
        ]),
        route(
            Method::Get,
            "/v1/conversations/{conversation_id}",
            "conversations_get",
            "A conversation.",
            handler(get),
        )
        .params(std::slice::from_ref(&id)),
        route(
            Method::Post,
            "/v1/conversations/{conversation_id}",
            "conversations_update",
            "Replace a conversation's metadata.",
            handler(update),
        )
        .params(&[id.clone(), Param::body("metadata", "object", true)]),
        route(
            Method::Delete,
            "/v1/conversations/{conversation_id}",
            "conversations_delete",
            "Delete a conversation and its items.",
            handler(delete),
        )
        .params(std::slice::from_ref(&id)),
        route(
            Method::Post,
            "/v1/conversations/{conversation_id}/items",
            "conversation_items_create",
            "Add items; the next turn hands them to the CLI.",
            handler(items_create),
        )
        .params(&[id.clone(), Param::body("items", "array", true)]),
        route(
            Method::Get,
            "/v1/conversations/{conversation_id}/items",
            "conversation_items_list",
            "A conversation's items.",
            handler(items_list),
        )
        .params(&[
            id.clone(),
            Param::query("limit", "integer", false),
            Param::query("order", "string", false),
            Param::query("after", "string", false),
        ]),
        route(
            Method::Get,
            "/v1/conversations/{conversation_id}/items/{item_id}",
            "conversation_items_get",
            "One item of a conversation.",
            handler(item_get),
        )
        .params(&[id.clone(), Param::path("item_id")]),
        route(
            Method::Delete,
            "/v1/conversations/{conversation_id}/items/{item_id}",
            "conversation_items_delete",
            "Remove one item (the CLI's own session keeps what it saw).",
            handler(item_delete),
        )
        .params(&[id, Param::path("item_id")]),
    ]
}

fn conversation_object(id: &str, created_at: u64, metadata: Value) -> Value {
    json!({
        "id": id,
        "object": "conversation",
        "created_at": created_at,
        "metadata": metadata,
        "x_agent_sandbox": label("agent-sandbox", &DIFFERENCES),
    })
}

fn conversation_id(call: &Call) -> String {
    call.path_param("conversation_id")
        .unwrap_or_default()
        .to_string()
}

async fn create(call: Call) -> Result<Response, ApiError> {
    let body = body(&call)?;
    only_known(&body, &["items", "metadata"], "agent-sandbox")?;
    let items = conversation_items(body.get("items"), "items")?;
    let id = new_id("conv_");
    let object = conversation_object(&id, now_unix(), metadata(&body)?);
    call.services()
        .agents
        .insert_conversation(
            id.clone(),
            new_conversation(&call.identity.id, object.clone(), items),
        )
        .map_err(|e| store_error(e, "conversation", &id, "conversation_id"))?;
    Ok(Response::ok(&object))
}

async fn get(call: Call) -> Result<Response, ApiError> {
    let id = conversation_id(&call);
    let object = call
        .services()
        .agents
        .with_conversation(&call.identity.id, &id, |c| c.object.clone())
        .map_err(|e| store_error(e, "conversation", &id, "conversation_id"))?;
    Ok(Response::ok(&object))
}

async fn update(call: Call) -> Result<Response, ApiError> {
    let id = conversation_id(&call);
    let body = body(&call)?;
    only_known(&body, &["metadata"], "agent-sandbox")?;
    if !body.contains_key("metadata") {
        return Err(invalid("metadata", "metadata is required."));
    }
    let metadata = metadata(&body)?;
    let object = call
        .services()
        .agents
        .with_conversation(&call.identity.id, &id, |c| {
            c.object["metadata"] = metadata;
            c.object.clone()
        })
        .map_err(|e| store_error(e, "conversation", &id, "conversation_id"))?;
    Ok(Response::ok(&object))
}

async fn delete(call: Call) -> Result<Response, ApiError> {
    let id = conversation_id(&call);
    call.services()
        .agents
        .remove_conversation(&call.identity.id, &id)
        .map_err(|e| store_error(e, "conversation", &id, "conversation_id"))?;
    Ok(Response::ok(
        &json!({"id": id, "object": "conversation.deleted", "deleted": true,
                "x_agent_sandbox": label("agent-sandbox", &DIFFERENCES)}),
    ))
}

async fn items_create(call: Call) -> Result<Response, ApiError> {
    let id = conversation_id(&call);
    let body = body(&call)?;
    only_known(&body, &["items"], "agent-sandbox")?;
    if !body.contains_key("items") {
        return Err(invalid("items", "items is required."));
    }
    let items = conversation_items(body.get("items"), "items")?;
    let added = call
        .services()
        .agents
        .with_conversation(&call.identity.id, &id, |c| {
            // Items added while a turn runs would be marked seen by its end unseen.
            if c.busy {
                return Err(store_error(
                    crate::agents::store::StoreError::Busy,
                    "conversation",
                    &id,
                    "conversation_id",
                ));
            }
            if c.items.len() + items.len() > MAX_ITEMS {
                return Err(invalid(
                    "items",
                    format!("A conversation holds at most {MAX_ITEMS} items."),
                ));
            }
            c.items.extend(items.iter().cloned());
            Ok(items.clone())
        })
        .map_err(|e| store_error(e, "conversation", &id, "conversation_id"))??;
    Ok(Response::ok(&json!({
        "object": "list",
        "data": added,
        "first_id": added.first().map(|i| i["id"].clone()),
        "last_id": added.last().map(|i| i["id"].clone()),
        "has_more": false,
        "x_agent_sandbox": label("agent-sandbox", &DIFFERENCES),
    })))
}

async fn items_list(call: Call) -> Result<Response, ApiError> {
    let id = conversation_id(&call);
    // The page is built under the store's lock: only its items are copied (a copy of
    // every item per listing held 1.5 GB under concurrent listings).
    let page = call
        .services()
        .agents
        .with_conversation(&call.identity.id, &id, |c| {
            list_page(&call, &c.items, "desc")
        })
        .map_err(|e| store_error(e, "conversation", &id, "conversation_id"))??;
    Ok(Response::ok(&page))
}

async fn item_get(call: Call) -> Result<Response, ApiError> {
    let id = conversation_id(&call);
    let item_id = call.path_param("item_id").unwrap_or_default().to_string();
    let item = call
        .services()
        .agents
        .with_conversation(&call.identity.id, &id, |c| {
            c.items
                .iter()
                .find(|i| i["id"] == item_id.as_str())
                .cloned()
        })
        .map_err(|e| store_error(e, "conversation", &id, "conversation_id"))?;
    item.map(|i| Response::ok(&i))
        .ok_or_else(|| not_found("item", &item_id, "item_id"))
}

async fn item_delete(call: Call) -> Result<Response, ApiError> {
    let id = conversation_id(&call);
    let item_id = call.path_param("item_id").unwrap_or_default().to_string();
    let object = call
        .services()
        .agents
        .with_conversation(&call.identity.id, &id, |c| {
            let position = c.items.iter().position(|i| i["id"] == item_id.as_str())?;
            c.items.remove(position);
            if position < c.unseen_from {
                c.unseen_from -= 1;
            }
            Some(c.object.clone())
        })
        .map_err(|e| store_error(e, "conversation", &id, "conversation_id"))?;
    object
        .map(|o| Response::ok(&o))
        .ok_or_else(|| not_found("item", &item_id, "item_id"))
}
