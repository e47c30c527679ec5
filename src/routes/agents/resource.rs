//! One declaration per REST resource of `/v1`, which yields its routes: the collection
//! path, the path parameter naming one member, the noun errors use, and which of
//! create, list, get, update, delete and further actions exist, each with its summary,
//! its declared fields and its handler. Endpoint ids are `<name>_<verb>`; paths are
//! `<path>` (create, list), `<path>/{<id>}` (get, update, delete) and `<path>/{<id>}/
//! <action>` or `<path>/<action>`.
//!
//! Getting and listing stored records needs no handler: [`Op::get_record`] and
//! [`Op::list_records`] (with `super::stored`'s handlers) answer a record of the domain's store (an [`Object`]) by the
//! declaration alone, a foreign id answering like an unknown one, and a list taking
//! `limit`, `order` and `after`.

use super::route;
// `Named` lives with the handlers that answer by it, so they need nothing of this
// module; declarations name it from here.
pub use super::stored::Named;
use super::stored::{get, list, paging};
use crate::agents::objects::Object;
use crate::api::{Method, Param, ParamIn};
use crate::app::{Endpoint, Handler};

/// What an operation does.
enum Does {
    Handler(Handler),
    /// Answers the record `target` names, within `parent`.
    Get(fn(Option<Named>, Named) -> Handler),
    /// Lists the records within `parent` (the caller's own when `None`).
    List(fn(Option<Named>) -> Handler),
}

/// Where an operation sits under its resource.
#[derive(Clone, Copy)]
enum At {
    Collection,
    Member,
}

/// One route of a resource.
pub struct Op {
    verb: &'static str,
    method: Method,
    at: At,
    /// A path segment after the collection or the member (`cancel`).
    action: Option<&'static str>,
    summary: &'static str,
    params: Vec<Param>,
    does: Does,
    streaming: bool,
}

impl Op {
    fn new(verb: &'static str, method: Method, at: At, summary: &'static str, does: Does) -> Op {
        Op {
            verb,
            method,
            at,
            action: None,
            summary,
            params: Vec::new(),
            does,
            streaming: false,
        }
    }

    pub fn create(summary: &'static str, h: Handler) -> Op {
        Op::new(
            "create",
            Method::Post,
            At::Collection,
            summary,
            Does::Handler(h),
        )
    }

    pub fn list(summary: &'static str, h: Handler) -> Op {
        Op::new(
            "list",
            Method::Get,
            At::Collection,
            summary,
            Does::Handler(h),
        )
    }

    pub fn get(summary: &'static str, h: Handler) -> Op {
        Op::new("get", Method::Get, At::Member, summary, Does::Handler(h))
    }

    pub fn update(summary: &'static str, h: Handler) -> Op {
        Op::new(
            "update",
            Method::Post,
            At::Member,
            summary,
            Does::Handler(h),
        )
    }

    pub fn delete(summary: &'static str, h: Handler) -> Op {
        Op::new(
            "delete",
            Method::Delete,
            At::Member,
            summary,
            Does::Handler(h),
        )
    }

    /// `POST|GET <path>/{id}/<name>`, id `<resource>_<name>`.
    pub fn member(name: &'static str, method: Method, summary: &'static str, h: Handler) -> Op {
        let mut op = Op::new(name, method, At::Member, summary, Does::Handler(h));
        op.action = Some(name);
        op
    }

    /// `POST|GET <path>/<name>`, id `<resource>_<name>`.
    pub fn collection(name: &'static str, method: Method, summary: &'static str, h: Handler) -> Op {
        let mut op = Op::new(name, method, At::Collection, summary, Does::Handler(h));
        op.action = Some(name);
        op
    }

    /// `GET <path>/{id}`: the stored record `T`.
    pub fn get_record<T: Object>(summary: &'static str) -> Op {
        Op::new("get", Method::Get, At::Member, summary, Does::Get(get::<T>))
    }

    /// `GET <path>`: a page of the stored records `T`.
    pub fn list_records<T: Object>(summary: &'static str) -> Op {
        Op::new(
            "list",
            Method::Get,
            At::Collection,
            summary,
            Does::List(list::<T>),
        )
        .params(paging())
    }

    /// `GET <path>/{id}/<name>`: a page of the records `T` that belong to the member.
    pub fn member_records<T: Object>(name: &'static str, summary: &'static str) -> Op {
        let mut op = Op::new(
            name,
            Method::Get,
            At::Member,
            summary,
            Does::List(list::<T>),
        );
        op.action = Some(name);
        op.params(paging())
    }

    /// The request's declared fields (after the path's own parameters).
    pub fn params(mut self, params: Vec<Param>) -> Op {
        self.params.extend(params);
        self
    }

    pub fn streaming(mut self) -> Op {
        self.streaming = true;
        self
    }
}

/// A REST resource of `/v1`.
pub struct Resource {
    /// Endpoint ids are `<name>_<verb>`.
    name: &'static str,
    /// The collection's path (`/v1/conversations/{conversation_id}/items`).
    path: &'static str,
    /// Its members: `item` by `{item_id}`.
    member: Named,
    /// The resource its path lies under, if any (items under a conversation).
    parent: Option<Named>,
    ops: Vec<Op>,
}

impl Resource {
    pub fn new(name: &'static str, path: &'static str, member: Named) -> Resource {
        Resource {
            name,
            path,
            member,
            parent: None,
            ops: Vec::new(),
        }
    }

    /// Its records belong to the member of another resource named in its path.
    pub fn within(mut self, parent: Named) -> Resource {
        self.parent = Some(parent);
        self
    }

    pub fn op(mut self, op: Op) -> Resource {
        self.ops.push(op);
        self
    }

    /// The routes, in declaration order.
    pub fn endpoints(self) -> Vec<Endpoint> {
        let mut endpoints = Vec::new();
        for op in self.ops {
            let mut path = self.path.to_string();
            if let At::Member = op.at {
                path.push_str(&format!("/{{{}}}", self.member.param));
            }
            if let Some(action) = op.action {
                path.push('/');
                path.push_str(action);
            }
            let handler = match op.does {
                Does::Handler(h) => h,
                Does::Get(build) => build(self.parent, self.member),
                // A member's own records (a response's input items) list within it.
                Does::List(build) => match op.at {
                    At::Member => build(Some(self.member)),
                    At::Collection => build(self.parent),
                },
            };
            let mut params: Vec<Param> = path_params(self.path).map(Param::path).collect();
            if let At::Member = op.at {
                params.push(Param::path(self.member.param));
            }
            params.extend(op.params);
            let refuses = params.iter().any(|p| p.location == ParamIn::Body);
            let id = format!("{}_{}", self.name, op.verb);
            let mut endpoint = route(op.method, path, id, op.summary, handler).params(&params);
            if refuses {
                // A field the runtime cannot honour is never accepted and ignored.
                endpoint = endpoint.refuse_unknown_fields();
            }
            endpoints.push(endpoint.streaming(op.streaming));
        }
        endpoints
    }
}

/// The names of the `{name}` segments of a path.
fn path_params(path: &'static str) -> impl Iterator<Item = &'static str> {
    path.split('/')
        .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::app::handler;
    use crate::http::Response;

    #[test]
    fn a_declaration_yields_its_routes() {
        let ok = || handler(|_| async { Ok(Response::ok(&json!({}))) });
        let item = Named {
            object: "item",
            param: "item_id",
        };
        let parent = Named {
            object: "conversation",
            param: "conversation_id",
        };
        let routes = Resource::new(
            "conversation_items",
            "/v1/conversations/{conversation_id}/items",
            item,
        )
        .within(parent)
        .op(Op::create("Add.", ok()).params(vec![Param::body("items", "array", true)]))
        .op(Op::list_records::<
            crate::agents::conversations::ConversationItem,
        >("List."))
        .op(Op::get("Get.", ok()))
        .op(Op::member("cancel", Method::Post, "Stop.", ok()))
        .endpoints();
        let seen: Vec<(String, &str, String)> = routes
            .iter()
            .map(|e| {
                (
                    e.spec.id.to_string(),
                    e.spec.method_name(),
                    e.spec.path.to_string(),
                )
            })
            .collect();
        let base = "/v1/conversations/{conversation_id}/items";
        assert_eq!(
            seen,
            [
                (
                    "conversation_items_create".to_string(),
                    "POST",
                    base.to_string()
                ),
                (
                    "conversation_items_list".to_string(),
                    "GET",
                    base.to_string()
                ),
                (
                    "conversation_items_get".to_string(),
                    "GET",
                    format!("{base}/{{item_id}}")
                ),
                (
                    "conversation_items_cancel".to_string(),
                    "POST",
                    format!("{base}/{{item_id}}/cancel")
                ),
            ]
        );
        let names =
            |i: usize| -> Vec<&str> { routes[i].spec.params.iter().map(|p| p.name).collect() };
        assert_eq!(names(0), ["conversation_id", "items"]);
        assert_eq!(names(1), ["conversation_id", "limit", "order", "after"]);
        assert_eq!(names(2), ["conversation_id", "item_id"]);
        assert_eq!(
            routes[0].spec.unknown_fields,
            crate::api::UnknownFields::Refuse,
            "a route with body fields refuses others"
        );
        assert_eq!(
            routes[3].spec.unknown_fields,
            crate::api::UnknownFields::Ignore
        );
    }
}
