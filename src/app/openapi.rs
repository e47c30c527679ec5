//! The OpenAPI 3.1 document of this server, generated from the route table: every
//! endpoint this listener serves, its parameters, body fields, success body (where the
//! table declares one) and every status with the error envelope. It grows with each
//! group, because it reads the same declarations as the router and `/capabilities`.

use serde_json::{json, Map, Value};

use super::state::{Endpoint, Serve};
use crate::api::{BodyMode, ErrorStyle, Listener, ParamIn};

/// The document for the endpoints of `listener`.
pub fn document(endpoints: &[Endpoint], listener: Listener) -> Value {
    let mut paths = Map::new();
    for endpoint in endpoints {
        let spec = &endpoint.spec;
        if spec.listener != listener || matches!(endpoint.serve, Serve::Unavailable(_)) {
            continue;
        }
        let mut operation = Map::new();
        operation.insert("operationId".into(), json!(spec.id));
        operation.insert("summary".into(), json!(spec.summary));
        operation.insert("tags".into(), json!([spec.group.name()]));
        let mut parameters = Vec::new();
        let mut body_properties = Map::new();
        let mut body_required = Vec::new();
        for param in &spec.params {
            let schema = param.schema();
            match param.location {
                ParamIn::Body => {
                    body_properties.insert(param.name.into(), schema);
                    if param.required {
                        body_required.push(param.name);
                    }
                }
                ParamIn::Query | ParamIn::Path => parameters.push(json!({
                    "name": param.name,
                    "in": param.location.name(),
                    // A path segment is always there; a query parameter only when sent.
                    "required": param.required || param.location == ParamIn::Path,
                    "schema": schema,
                })),
            }
        }
        if !parameters.is_empty() {
            operation.insert("parameters".into(), Value::Array(parameters));
        }
        if spec.method.takes_json_body() {
            let mut content = Map::new();
            content.insert(
                "application/json".into(),
                json!({"schema": {
                    "type": "object",
                    "properties": body_properties,
                    "required": body_required,
                }}),
            );
            if spec.body == BodyMode::RawOrStreamedJson {
                content.insert(
                    "application/octet-stream".into(),
                    json!({"schema": {"type": "string", "format": "binary"}}),
                );
            }
            operation.insert(
                "requestBody".into(),
                json!({"required": false, "content": content}),
            );
        }
        let mut responses = Map::new();
        for status in spec.statuses() {
            let response = if status == 200 {
                // An endpoint with a `raw` flag answers raw bytes when asked to.
                let raw = spec.params.iter().any(|p| p.name == "raw");
                success(spec.streaming, raw, spec.returns.map(|schema| schema()))
            } else if (200..400).contains(&status) {
                json!({"description": reason(status)})
            } else if let Some(own) = spec
                .own_refusals
                .filter(|_| spec.also_answers.contains(&status))
                .map(|schema| schema())
            {
                // The handler's own refusals have their own shape; the dispatcher's
                // (bad JSON, auth) are still the endpoint's envelope.
                json!({
                    "description": reason(status),
                    "content": {"application/json": {"schema": {"anyOf": [
                        own,
                        {"$ref": envelope(spec.errors)},
                    ]}}},
                })
            } else {
                json!({
                    "description": reason(status),
                    "content": {"application/json": {"schema": {"$ref": envelope(spec.errors)}}},
                })
            };
            responses.insert(status.to_string(), response);
        }
        operation.insert("responses".into(), Value::Object(responses));
        let path = paths
            .entry(spec.path.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(path) = path {
            path.insert(
                spec.method.as_str().to_ascii_lowercase(),
                Value::Object(operation),
            );
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "agent-sandbox",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The HTTP API of an agent-sandbox container: files, processes, terminals, system facts, dev tools, a browser and coding agents. docs/api.md is the reference in prose.",
        },
        "paths": paths,
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error", "type"],
                    "properties": {
                        "error": {"type": "string"},
                        "type": {"type": "string"},
                        "code": {"type": "string"},
                        "endpoint": {"type": "string"},
                        "rule": {"type": "string"},
                    },
                },
                "OpenAiError": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {"error": {
                        "type": "object",
                        "required": ["message", "type"],
                        "properties": {
                            "message": {"type": "string"},
                            "type": {"type": "string"},
                            "param": {"type": ["string", "null"]},
                            "code": {"type": ["string", "null"]},
                        },
                    }},
                },
                "ConnectError": {
                    "type": "object",
                    "required": ["code", "message"],
                    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                },
                "EnvdError": {
                    "type": "object",
                    "required": ["code", "message"],
                    "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
                },
            },
            "securitySchemes": {
                "accessToken": {"type": "apiKey", "in": "header", "name": "X-Access-Token"},
                "bearer": {"type": "http", "scheme": "bearer"},
            },
        },
        "security": [{}, {"accessToken": []}, {"bearer": []}],
    })
}

fn envelope(style: ErrorStyle) -> &'static str {
    match style {
        ErrorStyle::Contract => "#/components/schemas/Error",
        ErrorStyle::OpenAi => "#/components/schemas/OpenAiError",
        ErrorStyle::Connect => "#/components/schemas/ConnectError",
        ErrorStyle::Envd => "#/components/schemas/EnvdError",
    }
}

fn success(streaming: bool, raw: bool, schema: Option<Value>) -> Value {
    if streaming {
        return json!({
            "description": "Server-sent events",
            // Each event: `event: <name>` and `data: <json>` (docs/api.md lists them).
            "content": {"text/event-stream": {"schema": {
                "type": "object",
                "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
            }}},
        });
    }
    let mut content = Map::new();
    content.insert(
        "application/json".into(),
        json!({"schema": schema.unwrap_or_else(|| json!({"type": "object"}))}),
    );
    if raw {
        content.insert(
            "application/octet-stream".into(),
            json!({"schema": {"type": "string", "format": "binary"}}),
        );
    }
    json!({"description": "OK", "content": content})
}

fn reason(status: u16) -> &'static str {
    match status {
        202 => "Accepted",
        204 => "No content",
        206 => "Partial content",
        304 => "Not modified",
        400 => "Bad request",
        401 => "Missing or wrong credentials",
        403 => "Refused by policy (path_not_allowed, missing_scope, ...)",
        404 => "Not found, or the endpoint is disabled",
        409 => "Conflict",
        413 => "Payload too large",
        416 => "Range not satisfiable",
        429 => "Too many requests",
        500 => "The operation failed (the type names the Python exception)",
        503 => "Temporarily out of resources; retry after Retry-After",
        _ => "See docs/api.md",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The names an operation of the document takes: its parameters and the properties
    /// of its JSON body.
    fn operation_fields(operation: &Value) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for parameter in operation["parameters"].as_array().into_iter().flatten() {
            names.insert(parameter["name"].as_str().unwrap_or_default().to_string());
        }
        let body = &operation["requestBody"]["content"]["application/json"]["schema"];
        if let Some(properties) = body["properties"].as_object() {
            names.extend(properties.keys().cloned());
        }
        names
    }

    /// For every built-in endpoint, `/capabilities` (`params`) and the OpenAPI document
    /// name the same fields: both read the one declaration its handler parses with.
    #[test]
    fn capabilities_and_openapi_name_the_same_fields() {
        let endpoints = crate::routes::builtin_endpoints();
        let mut checked = 0;
        for listener in [
            Listener::Api,
            Listener::Pty,
            Listener::K8sRuntime,
            Listener::Envd,
        ] {
            let doc = document(&endpoints, listener);
            for endpoint in &endpoints {
                let spec = &endpoint.spec;
                if spec.listener != listener || endpoint.unavailable().is_some() {
                    continue;
                }
                let method = spec.method.as_str().to_ascii_lowercase();
                let operation = &doc["paths"][&*spec.path][&method];
                assert_eq!(operation["operationId"], json!(spec.id), "{}", spec.id);
                let capabilities: BTreeSet<String> = match spec.params_json() {
                    Value::Object(params) => params.keys().cloned().collect(),
                    _ => BTreeSet::new(),
                };
                assert_eq!(capabilities, operation_fields(operation), "{}", spec.id);
                for param in &spec.params {
                    let schema = param.schema();
                    let documented = match param.location {
                        ParamIn::Body => {
                            &operation["requestBody"]["content"]["application/json"]["schema"]
                                ["properties"][param.name]
                        }
                        ParamIn::Query | ParamIn::Path => operation["parameters"]
                            .as_array()
                            .and_then(|ps| {
                                ps.iter().find(|p| {
                                    p["name"] == param.name && p["in"] == param.location.name()
                                })
                            })
                            .map(|p| &p["schema"])
                            .unwrap_or(&Value::Null),
                    };
                    assert_eq!(*documented, schema, "{} {}", spec.id, param.name);
                }
                checked += 1;
            }
        }
        assert!(checked > 40, "only {checked} endpoints checked");
    }
}
