//! `/v1/conversations` and their items: two resource declarations over the domain's
//! `crate::agents::conversations`.

use serde_json::json;

use super::resource::{Named, Op, Resource};
use super::{agents_of, args, path_value, server_runtime};
use crate::agents::conversations::{parse_items, Conversation, ConversationItem, DIFFERENCES};
use crate::agents::input::check_metadata;
use crate::agents::objects::label;
use crate::api::{ApiError, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;

const CONVERSATION: Named = Named {
    object: "conversation",
    param: "conversation_id",
};

const ITEM: Named = Named {
    object: "item",
    param: "item_id",
};

fn items(required: bool) -> Param {
    Param::body("items", "array", required)
        .invalid("items must be a list of message items.")
        .doc("Message items (20 at most), their content a string or input_text parts.")
}

fn metadata(required: bool) -> Param {
    Param::body("metadata", "object", required)
        .invalid("metadata must be an object of strings.")
        .doc("16 strings at most, keys up to 64 and values up to 512 characters.")
}

pub fn endpoints() -> Vec<Endpoint> {
    let mut endpoints = Resource::new("conversations", "/v1/conversations", CONVERSATION)
        .op(Op::create(
            "Start a conversation, optionally with items.",
            handler(create),
        )
        .params(vec![items(false), metadata(false)]))
        .op(Op::get_record::<Conversation>("A conversation."))
        .op(
            Op::update("Replace a conversation's metadata.", handler(update))
                .params(vec![metadata(true)]),
        )
        .op(Op::delete(
            "Delete a conversation and its items.",
            handler(delete),
        ))
        .endpoints();
    endpoints.extend(
        Resource::new(
            "conversation_items",
            "/v1/conversations/{conversation_id}/items",
            ITEM,
        )
        .within(CONVERSATION)
        .op(Op::create(
            "Add items; the next turn hands them to the CLI.",
            handler(items_create),
        )
        .params(vec![items(true)]))
        .op(Op::list_records::<ConversationItem>(
            "A conversation's items.",
        ))
        .op(Op::get_record::<ConversationItem>(
            "One item of a conversation.",
        ))
        .op(Op::delete(
            "Remove one item (the CLI's own session keeps what it saw).",
            handler(item_delete),
        ))
        .endpoints(),
    );
    // The reference's agents table has no conversations: all of them are this server's.
    endpoints.into_iter().map(Endpoint::extension).collect()
}

async fn create(call: Call) -> Result<Response, ApiError> {
    let mut args = args(&call, server_runtime)?;
    let items = parse_items(args.value("items"))?;
    let metadata = check_metadata(args.take("metadata"))?;
    let object = agents_of(&call)?
        .create_conversation(&call.identity.id, metadata, items)
        .await?;
    Ok(Response::ok(&object))
}

async fn update(call: Call) -> Result<Response, ApiError> {
    let mut args = args(&call, server_runtime)?;
    let metadata = check_metadata(args.take("metadata"))?;
    let id = path_value(&call, CONVERSATION.param);
    let object = agents_of(&call)?
        .update_conversation(&call.identity.id, &id, metadata)
        .await?;
    Ok(Response::ok(&object))
}

async fn delete(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, CONVERSATION.param);
    agents_of(&call)?
        .delete_conversation(&call.identity.id, &id)
        .await?;
    Ok(Response::ok(
        &json!({"id": id, "object": "conversation.deleted", "deleted": true,
                "x_agent_sandbox": label("agent-sandbox", &DIFFERENCES)}),
    ))
}

async fn items_create(call: Call) -> Result<Response, ApiError> {
    let args = args(&call, server_runtime)?;
    let items = parse_items(args.value("items"))?;
    let id = path_value(&call, CONVERSATION.param);
    let added = agents_of(&call)?
        .add_items(&call.identity.id, &id, items)
        .await?;
    Ok(Response::ok(&json!({
        "object": "list",
        "data": added,
        "first_id": added.first().map(|i| i["id"].clone()),
        "last_id": added.last().map(|i| i["id"].clone()),
        "has_more": false,
        "x_agent_sandbox": label("agent-sandbox", &DIFFERENCES),
    })))
}

async fn item_delete(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, CONVERSATION.param);
    let item = path_value(&call, ITEM.param);
    let object = agents_of(&call)?
        .delete_item(&call.identity.id, &id, &item)
        .await?;
    Ok(Response::ok(&object))
}
