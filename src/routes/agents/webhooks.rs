//! `/v1/webhook_endpoints` and `/v1/webhook_event_types`: thin adapters over
//! `crate::agents::webhooks`, which checks every field itself and words its refusals
//! as the reference does (so the declarations below document the fields; they do not
//! refuse unknown ones: the domain does, with the reference's wording). The signing
//! secret is in the answers of create and rotate_secret only.

use serde_json::{Map, Value};

use super::stored::paging;
use super::{agents_of, path_value, route};
use crate::agents::records::Order;
use crate::agents::webhooks;
use crate::api::{ApiError, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;

const MEMBER: &str = "/v1/webhook_endpoints/{webhook_endpoint_id}";
const ID: &str = "webhook_endpoint_id";

fn fields() -> Vec<Param> {
    vec![
        Param::body("url", "string", false).doc("https (http with ABX_AGENTS_WEBHOOK_ALLOW_HTTP=1), no credentials, query or fragment; private hosts only with ABX_AGENTS_ALLOW_PRIVATE_URLS=1. Required on create."),
        Param::body("event_types", "array", false).doc("A non-empty list of GET /v1/webhook_event_types. Required on create."),
        Param::body("name", "string", false).doc("Up to 256 characters."),
    ]
}

pub fn endpoints() -> Vec<Endpoint> {
    // The path parameter first, then the body's (`params` replaces the list).
    let member = |method, path: &'static str, id: &'static str, summary, h, body: Vec<Param>| {
        let mut params = vec![Param::path(ID)];
        params.extend(body);
        route(method, path, id, summary, h).params(&params)
    };
    vec![
        route(
            Method::Post,
            "/v1/webhook_endpoints",
            "agents_webhooks_create",
            "Register a webhook endpoint; its signing secret is answered this once.",
            handler(create),
        )
        .params(&fields()),
        route(
            Method::Get,
            "/v1/webhook_endpoints",
            "agents_webhooks_list",
            "Your webhook endpoints (without secrets).",
            handler(list),
        )
        .params(&paging()),
        member(
            Method::Get,
            MEMBER,
            "agents_webhooks_get",
            "A webhook endpoint (without its secret).",
            handler(get),
            Vec::new(),
        ),
        member(
            Method::Post,
            MEMBER,
            "agents_webhooks_update",
            "Change a webhook endpoint's url, event_types or name.",
            handler(update),
            fields(),
        ),
        member(
            Method::Delete,
            MEMBER,
            "agents_webhooks_delete",
            "Delete a webhook endpoint (its queued deliveries are dropped).",
            handler(delete),
            Vec::new(),
        ),
        member(
            Method::Post,
            "/v1/webhook_endpoints/{webhook_endpoint_id}/rotate_secret",
            "agents_webhooks_rotate_secret",
            "A new signing secret, answered this once.",
            handler(rotate),
            vec![
                Param::body("keep_old_secret_active_for_24_hours", "boolean", false)
                    .doc("Refused when true: events are signed with one secret."),
            ],
        ),
        member(
            Method::Post,
            "/v1/webhook_endpoints/{webhook_endpoint_id}/test",
            "agents_webhooks_test",
            "Send one signed test event now and answer the receiver's status.",
            handler(test),
            vec![Param::body("event_type", "string", true)
                .doc("One of GET /v1/webhook_event_types.")],
        ),
        route(
            Method::Get,
            "/v1/webhook_event_types",
            "agents_webhook_event_types",
            "The event types this server sends.",
            handler(|_| async { Ok(Response::ok(&webhooks::event_types_list())) }),
        ),
    ]
}

async fn create(call: Call) -> Result<Response, ApiError> {
    let body: Map<String, Value> = call.json()?;
    let object = webhooks::create(&agents_of(&call)?, &call.identity.id, body).await?;
    Ok(Response::ok(&object))
}

async fn list(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let page = webhooks::list(
        &agents_of(&call)?,
        &call.identity.id,
        args.str("after").map(str::to_string),
        args.uint("limit").unwrap_or(20) as usize,
        args.str("order")
            .and_then(Order::parse)
            .unwrap_or(Order::Desc),
    )
    .await?;
    Ok(Response::ok(&page))
}

async fn get(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, ID);
    let object = webhooks::get(&agents_of(&call)?, &call.identity.id, &id).await?;
    Ok(Response::ok(&object))
}

async fn update(call: Call) -> Result<Response, ApiError> {
    let body: Map<String, Value> = call.json()?;
    let id = path_value(&call, ID);
    let object = webhooks::update(&agents_of(&call)?, &call.identity.id, &id, body).await?;
    Ok(Response::ok(&object))
}

async fn delete(call: Call) -> Result<Response, ApiError> {
    let id = path_value(&call, ID);
    let object = webhooks::delete(&agents_of(&call)?, &call.identity.id, &id).await?;
    Ok(Response::ok(&object))
}

async fn rotate(call: Call) -> Result<Response, ApiError> {
    let body: Map<String, Value> = call.json()?;
    let id = path_value(&call, ID);
    let object = webhooks::rotate(&agents_of(&call)?, &call.identity.id, &id, body).await?;
    Ok(Response::ok(&object))
}

async fn test(call: Call) -> Result<Response, ApiError> {
    let body: Map<String, Value> = call.json()?;
    let id = path_value(&call, ID);
    let object = webhooks::test(&agents_of(&call)?, &call.identity.id, &id, body).await?;
    Ok(Response::ok(&object))
}
