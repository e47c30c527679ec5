//! Custom routes a `commands.py` registered with `@table.route`: one endpoint each,
//! declared from the worker's manifest, answered by calling the Python handler over the
//! bridge. A streaming route's events are passed through as the handler yields them.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value};

use super::{bridge_error, raw_json};
use crate::api::{ApiError, Group, Method};
use crate::app::{handler, Call, Endpoint};
use crate::bridge::link::{self, Answer, StreamItem};
use crate::bridge::manifest::RouteEntry;
use crate::http::{sse, Response};

/// The endpoints of `routes`, or why one cannot be declared.
pub fn endpoints(routes: &[RouteEntry]) -> Result<Vec<Endpoint>, String> {
    routes
        .iter()
        .map(|route| {
            let method = Method::from_http(&route.method).ok_or_else(|| {
                format!(
                    "route '{}': method {} is not GET, POST or DELETE",
                    route.name, route.method
                )
            })?;
            let group = Group::parse(&route.group).ok_or_else(|| {
                format!("route '{}': unknown group '{}'", route.name, route.group)
            })?;
            let name = route.name.clone();
            let streaming = route.streaming;
            let mut endpoint = Endpoint::new(
                method,
                route.path.clone(),
                group,
                handler(move |call| serve(call, name.clone(), streaming)),
            )
            .id(route.name.clone())
            .auth_required(route.auth_required)
            .streaming(route.streaming)
            .scopes(&route.scopes);
            if !route.summary.is_empty() {
                endpoint = endpoint.summary(route.summary.clone());
            }
            Ok(endpoint)
        })
        .collect()
}

/// What the Python handler's `request` holds.
#[derive(Serialize)]
struct RouteRequest<'a> {
    method: &'static str,
    path: &'a str,
    path_params: BTreeMap<&'a str, &'a str>,
    query: BTreeMap<&'a str, &'a str>,
    headers: BTreeMap<&'a str, &'a str>,
    body: Value,
    identity: Value,
}

async fn serve(call: Call, route: String, streaming: bool) -> Result<Response, ApiError> {
    let bridge = super::python_worker(&call, "route")?;
    let body: Value = if matches!(call.method, Method::Get) {
        json!({})
    } else {
        call.json()?
    };
    let request = RouteRequest {
        method: call.method.as_str(),
        path: &call.path,
        path_params: call
            .path_params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect(),
        query: call
            .query
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect(),
        headers: call
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect(),
        body,
        identity: json!({"id": call.identity.id, "scopes": call.identity.scopes}),
    };
    let message = json!({"op": "route", "route": route, "request": request});
    match link::call(&bridge, &call.services().environment, &message)
        .await
        .map_err(bridge_error)?
    {
        Answer::Response { status, body } => Ok(raw_json(status, body)),
        Answer::Stream(mut events) => {
            if !streaming {
                return Err(ApiError::internal(
                    "RuntimeError",
                    format!("route '{route}' returned an SSEResponse but is not registered with streaming=True"),
                ));
            }
            let (mut tx, rx) = sse::channel(4);
            monoio::spawn(async move {
                loop {
                    let item = monoio::select! {
                        item = events.next() => item,
                        _ = tx.closed() => return,
                    };
                    let sent = match item {
                        None => return,
                        Some(Ok(StreamItem::Event(text))) => tx.send_raw(text.into_bytes()).await,
                        Some(Ok(StreamItem::Failed { message, kind })) => {
                            let _ = tx
                                .send("error", &json!({"error": message, "type": kind}))
                                .await;
                            return;
                        }
                        Some(Err(error)) => {
                            let error = bridge_error(error);
                            let _ = tx
                                .send(
                                    "error",
                                    &json!({"error": error.message, "type": error.kind}),
                                )
                                .await;
                            return;
                        }
                    };
                    if sent.is_err() {
                        return;
                    }
                }
            });
            Ok(sse::response(rx))
        }
    }
}
