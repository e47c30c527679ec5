//! The handlers a [`super::resource::Resource`] declaration gets for free: a stored
//! record answered by id ([`get`]), and a page of stored records ([`list`], with
//! `limit`, `order` and `after`). A foreign id answers like an unknown one, and an
//! unknown parent (a conversation of an item) is named as such.

use serde_json::json;

use super::{agents_of, path_value, store_error};
use crate::agents::objects::{label, Object, LIST_DIFFERENCES};
use crate::agents::records::{ListQuery, Order, Scope, StoreError};
use crate::api::{ApiError, Param};
use crate::app::{handler, Call, Handler};
use crate::http::Response;

/// A noun and the path parameter that carries an id of it.
#[derive(Clone, Copy, Debug)]
pub struct Named {
    /// What errors call it: `No conversation found with id '...'`.
    pub object: &'static str,
    pub param: &'static str,
}

/// The query's `order` (default `desc`), `limit` (default 20) and `after`, as
/// [`paging`] declares them.
pub fn page_query(args: &crate::api::Args) -> (Order, usize, Option<String>) {
    (
        args.str("order")
            .and_then(Order::parse)
            .unwrap_or(Order::Desc),
        args.uint("limit").unwrap_or(20) as usize,
        args.str("after").map(str::to_string),
    )
}

/// A list page in OpenAI's shape, labelled with the list's `differences`.
pub fn list_page(data: Vec<serde_json::Value>, has_more: bool, differences: &[&str]) -> Response {
    let id = |v: Option<&serde_json::Value>| v.and_then(|v| v.get("id")).cloned();
    Response::ok(&json!({
        "object": "list",
        "first_id": id(data.first()),
        "last_id": id(data.last()),
        "has_more": has_more,
        "data": data,
        "x_agent_sandbox": label("agent-sandbox", differences),
    }))
}

/// `limit`, `order`, `after`: a page of a list, as OpenAI lists.
pub fn paging() -> Vec<Param> {
    vec![
        Param::query("limit", "integer", false)
            .range(1.0, 100.0)
            .default("20")
            .invalid("limit must be a whole number from 1 to 100.")
            .doc("How many to list (1 to 100)."),
        Param::query("order", "string", false)
            .one_of(&["asc", "desc"])
            .default("\"desc\"")
            .invalid("order must be asc or desc.")
            .doc("asc: oldest first; desc: newest first."),
        Param::query("after", "string", false).doc("List what follows this id."),
    ]
}

pub fn get<T: Object>(parent: Option<Named>, target: Named) -> Handler {
    handler(move |call: Call| async move {
        let owner = &call.identity.id;
        let id = path_value(&call, target.param);
        let parent_id = parent.map(|p| path_value(&call, p.param));
        let scope = match &parent_id {
            Some(p) => Scope::within(owner, p),
            None => Scope::owner(owner),
        };
        let record = agents_of(&call)?
            .get::<T>(scope, &id)
            .await
            .map_err(|e| scoped_error(e, parent, parent_id.as_deref(), target, &id))?;
        Ok(Response::ok(&record.object()))
    })
}

pub fn list<T: Object>(parent: Option<Named>) -> Handler {
    handler(move |call: Call| async move {
        let args = call.args()?;
        let owner = &call.identity.id;
        let parent_id = parent.map(|p| path_value(&call, p.param));
        let scope = match &parent_id {
            Some(p) => Scope::within(owner, p),
            None => Scope::owner(owner),
        };
        let query = ListQuery {
            after: args.str("after"),
            limit: args.uint("limit").unwrap_or(20) as usize,
            order: args
                .str("order")
                .and_then(Order::parse)
                .unwrap_or(Order::Desc),
        };
        let none = Named {
            object: "object",
            param: "after",
        };
        let page = agents_of(&call)?
            .list::<T>(scope, &query)
            .await
            .map_err(|e| {
                scoped_error(
                    e,
                    parent,
                    parent_id.as_deref(),
                    none,
                    query.after.unwrap_or(""),
                )
            })?;
        let data: Vec<_> = page.data.iter().map(Object::object).collect();
        Ok(Response::ok(&json!({
            "object": "list",
            "data": data,
            "first_id": page.first_id,
            "last_id": page.last_id,
            "has_more": page.has_more,
            "x_agent_sandbox": label("agent-sandbox", &LIST_DIFFERENCES),
        })))
    })
}

/// A store error of a lookup within `parent`: an unknown parent is named as such.
fn scoped_error(
    error: StoreError,
    parent: Option<Named>,
    parent_id: Option<&str>,
    target: Named,
    id: &str,
) -> ApiError {
    match (error, parent) {
        (StoreError::ParentNotFound, Some(p)) => store_error(
            StoreError::NotFound,
            p.object,
            parent_id.unwrap_or(""),
            p.param,
        ),
        (error, _) => store_error(error, target.object, id, target.param),
    }
}
