//! Webhook endpoints (`/v1/webhook_endpoints`): where this server POSTs the events of an
//! identity's sessions, signed the Standard Webhooks way so OpenAI's
//! `client.webhooks.unwrap` verifies them. An endpoint is a record of its owner like a
//! vault; its `whsec_` secret is shown once (on create and on rotate) and kept sealed
//! ([`super::seal`], bound to the endpoint's id).
//!
//! Events are not sent from where they happen: [`emit`] queues one delivery per
//! subscribed endpoint in the store's outbox, in one transaction, and [`outbox`]'s
//! deliverer sends them from its own thread, retrying with backoff, so an event
//! survives a receiver that is down and a server that restarts. [`post`] is the one
//! outgoing HTTP request (http or https, no redirects, 5 s, destinations checked after
//! resolution).

pub mod outbox;
pub mod post;
pub mod queue;

use std::sync::Arc;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sha2::Sha256;

use super::error::AgentError;
use super::objects::{label, now_unix, Object};
use super::records::{Collection, ListQuery, Order, Record, Scope, StoreError, Transaction};
use super::seal;
use super::surface::Agents;

/// The event types this server sends (`agent.session.action_required` never happens
/// here: a session waiting for a tool result is `requires_action`, which the reference
/// does not announce either).
pub const EVENT_TYPES: [&str; 4] = [
    "agent.session.created",
    "agent.session.in_progress",
    "agent.session.idle",
    "agent.session.failed",
];

/// Endpoints one identity keeps, and the whole server.
pub const MAX_ENDPOINTS_PER_OWNER: usize = 100;
pub const MAX_ENDPOINTS: usize = 10_000;

pub static ENDPOINTS: Collection = Collection {
    name: "webhook_endpoint",
    parent: None,
    max_total: MAX_ENDPOINTS,
    max_per_owner: MAX_ENDPOINTS_PER_OWNER,
    evicts: false,
};

/// What every endpoint object says about itself (the reference's label, less
/// `memory_only`: endpoints and their secrets are kept in the store across restarts).
fn endpoint_label() -> Value {
    label("local_state", &["local_signer"])
}

/// One webhook endpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WebhookEndpoint {
    pub id: String,
    pub created_at: u64,
    pub updated_at: u64,
    pub url: String,
    pub event_types: Vec<String>,
    pub name: String,
    /// The `whsec_` secret, sealed for this endpoint.
    pub sealed: String,
}

impl Record for WebhookEndpoint {
    fn collection() -> &'static Collection {
        &ENDPOINTS
    }
    fn id(&self) -> &str {
        &self.id
    }
}

impl Object for WebhookEndpoint {
    /// The object without its secret (get, list, update).
    fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "webhook_endpoint",
            "created_at": self.created_at,
            "event_types": self.event_types,
            "name": self.name,
            "signing_secret_hint": null,
            "url": self.url,
            "updated_at": self.updated_at,
            "x_agent_sandbox": endpoint_label(),
        })
    }
}

impl WebhookEndpoint {
    /// The secret, opened (on the blocking pool: inside a transaction).
    pub fn secret(&self) -> Result<String, AgentError> {
        let bytes = seal::open(&binding(&self.id), &self.sealed).map_err(sealing_failed)?;
        String::from_utf8(bytes)
            .map_err(|_| AgentError::Failed("a stored secret is damaged".into()))
    }
}

fn binding(endpoint_id: &str) -> String {
    format!("webhook_endpoint:{endpoint_id}:secret")
}

fn sealing_failed(e: seal::SealError) -> AgentError {
    AgentError::Failed(format!("The vault key is unusable: {}", e.0))
}

/// The reference's 400: `invalid_request`, naming `param`.
fn refused(param: &str, message: impl Into<String>) -> AgentError {
    AgentError::Rejected {
        status: 400,
        code: "invalid_request",
        param: Some(param.to_string()),
        message: message.into(),
    }
}

/// A fresh signing secret: `whsec_` and the standard base64 of 32 random bytes.
pub fn new_secret() -> String {
    let mut key = [0u8; 32];
    let _ = rustix::rand::getrandom(&mut key, rustix::rand::GetRandomFlags::empty());
    format!("whsec_{}", base64_simd::STANDARD.encode_to_string(key))
}

/// The HMAC key of a secret: the bytes its base64 after `whsec_` stands for (the text
/// itself when it is not base64, as the reference reads it).
fn key_of(secret: &str) -> Vec<u8> {
    let raw = secret.strip_prefix("whsec_").unwrap_or(secret);
    base64_simd::STANDARD
        .decode_to_vec(raw)
        .unwrap_or_else(|_| raw.as_bytes().to_vec())
}

/// `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<payload>">`.
pub fn sign(secret: &str, msg_id: &str, timestamp: u64, payload: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(&key_of(secret)) {
        Ok(mac) => mac,
        // HMAC takes a key of any length.
        Err(_) => unreachable!("HMAC accepts every key length"),
    };
    mac.update(format!("{msg_id}.{timestamp}.").as_bytes());
    mac.update(payload);
    let digest = mac.finalize().into_bytes();
    format!("v1,{}", base64_simd::STANDARD.encode_to_string(digest))
}

/// The envelope the SDK unwraps: `{id: evt_<24 hex>, object: event, created_at, type,
/// data}`.
pub fn event(event_type: &str, data: Value) -> Value {
    let id = super::records::new_id("evt_");
    json!({
        "id": &id[..4 + 24],
        "object": "event",
        "created_at": now_unix(),
        "type": event_type,
        "data": data,
    })
}

/// What a session event says: the session, in a self-hosted environment (this
/// sandbox).
pub fn session_data(session_id: &str, environment_id: Option<&str>) -> Value {
    json!({"id": session_id, "environment_type": "self_hosted", "environment_id": environment_id})
}

/// A checked `url`: http(s), a host, no credentials, query or fragment; http only with
/// `ABX_AGENTS_WEBHOOK_ALLOW_HTTP=1`; a private or loopback host (by name or literal
/// address) only with `ABX_AGENTS_ALLOW_PRIVATE_URLS=1`. Where the name resolves to is
/// checked again at each delivery ([`post::resolve`]).
pub fn check_url(value: Option<&Value>) -> Result<String, AgentError> {
    let Some(Value::String(url)) = value.filter(|v| !v.is_null()) else {
        return Err(refused("url", "url: expected a URL string"));
    };
    let allow_http = std::env::var("ABX_AGENTS_WEBHOOK_ALLOW_HTTP").as_deref() == Ok("1");
    let target = post::Target::parse(url).map_err(|why| refused("url", format!("url: {why}")))?;
    if target.scheme == post::Scheme::Http && !allow_http {
        return Err(refused("url", "url: must be an https URL"));
    }
    if !post::allow_private() && post::private_name(&target.host) {
        return Err(refused(
            "url",
            "url: private and loopback hosts are not allowed",
        ));
    }
    Ok(url.clone())
}

fn event_types(value: Option<&Value>) -> Result<Vec<String>, AgentError> {
    let list = match value {
        Some(Value::Array(items)) if !items.is_empty() => items,
        _ => {
            return Err(refused(
                "event_types",
                "event_types: a non-empty list of strings",
            ))
        }
    };
    let mut out: Vec<String> = Vec::new();
    for item in list {
        let Value::String(kind) = item else {
            return Err(refused(
                "event_types",
                "event_types: a non-empty list of strings",
            ));
        };
        if !EVENT_TYPES.contains(&kind.as_str()) {
            return Err(refused(
                "event_types",
                format!(
                    "event_types: this server does not send '{kind}'; see /v1/webhook_event_types"
                ),
            ));
        }
        if !out.contains(kind) {
            out.push(kind.clone());
        }
    }
    Ok(out)
}

fn name(value: Option<&Value>) -> Result<String, AgentError> {
    match value {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) if s.chars().count() <= 256 => Ok(s.clone()),
        Some(_) => Err(refused(
            "name",
            "name: expected a string up to 256 characters",
        )),
    }
}

/// Refuses any key but `allowed`, as the reference words it.
fn known_keys(body: &Map<String, Value>, allowed: &[&str]) -> Result<(), AgentError> {
    match body.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) => Err(refused(
            key,
            format!("{key}: unknown or unsupported parameter"),
        )),
        None => Ok(()),
    }
}

/// The reference's 404 for an endpoint this caller does not own (or nobody does).
fn missing(id: &str) -> AgentError {
    AgentError::Rejected {
        status: 404,
        code: "resource_not_found",
        param: Some("webhook_endpoint_id".into()),
        message: format!("webhook endpoint '{id}' not found"),
    }
}

fn store_refusal(id: &str) -> impl FnOnce(StoreError) -> AgentError + '_ {
    move |e| match e {
        StoreError::NotFound => missing(id),
        e => AgentError::store("webhook_endpoint", id, "webhook_endpoint_id")(e),
    }
}

/// The object with its secret: what create and rotate answer, once.
fn with_secret(endpoint: &WebhookEndpoint, secret: &str) -> Value {
    let mut object = endpoint.object();
    object["signing_secret"] = json!(secret);
    object
}

/// `POST /v1/webhook_endpoints`.
pub async fn create(
    agents: &Arc<Agents>,
    owner: &str,
    body: Map<String, Value>,
) -> Result<Value, AgentError> {
    known_keys(&body, &["url", "event_types", "name"])?;
    let url = check_url(body.get("url"))?;
    let event_types = event_types(body.get("event_types"))?;
    let name = name(body.get("name"))?;
    let now = now_unix();
    let id = super::records::new_id("we_")[..3 + 24].to_string();
    let owner = owner.to_string();
    agents
        .transact(move |t| {
            // Sealed on the blocking pool: the first seal may read the key file.
            let secret = new_secret();
            let endpoint = WebhookEndpoint {
                sealed: seal::seal(&binding(&id), secret.as_bytes()).map_err(sealing_failed)?,
                id: id.clone(),
                created_at: now,
                updated_at: now,
                url,
                event_types,
                name,
            };
            let object = with_secret(&endpoint, &secret);
            t.create(Scope::owner(&owner), endpoint)
                .map_err(AgentError::store(
                    "webhook_endpoint",
                    &id,
                    "webhook_endpoint_id",
                ))?;
            Ok(object)
        })
        .await
}

/// `GET /v1/webhook_endpoints/{id}`: never the secret.
pub async fn get(agents: &Arc<Agents>, owner: &str, id: &str) -> Result<Value, AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    agents
        .transact(move |t| {
            t.get::<WebhookEndpoint>(Scope::owner(&owner), &id)
                .map(|e| e.object())
                .map_err(store_refusal(&id))
        })
        .await
}

/// `GET /v1/webhook_endpoints`: a page, newest first unless `order` says otherwise.
pub async fn list(
    agents: &Arc<Agents>,
    owner: &str,
    after: Option<String>,
    limit: usize,
    order: Order,
) -> Result<Value, AgentError> {
    let owner = owner.to_string();
    agents
        .transact(move |t| {
            let query = ListQuery {
                after: after.as_deref(),
                limit,
                order,
            };
            let page = t
                .list::<WebhookEndpoint>(Scope::owner(&owner), &query)
                .map_err(|e| match e {
                    StoreError::UnknownCursor => AgentError::Rejected {
                        status: 404,
                        code: "agents.cursor_not_found",
                        param: Some("after".into()),
                        message: "after cursor not found".into(),
                    },
                    e => AgentError::from(e),
                })?;
            let data: Vec<Value> = page.data.iter().map(Object::object).collect();
            Ok(json!({
                "object": "list",
                "data": data,
                "first_id": page.first_id,
                "last_id": page.last_id,
                "has_more": page.has_more,
            }))
        })
        .await
}

/// `POST /v1/webhook_endpoints/{id}`: replaces the fields the body names.
pub async fn update(
    agents: &Arc<Agents>,
    owner: &str,
    id: &str,
    body: Map<String, Value>,
) -> Result<Value, AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    agents
        .transact(move |t| {
            let scope = Scope::owner(&owner);
            let mut endpoint: WebhookEndpoint = t.get(scope, &id).map_err(store_refusal(&id))?;
            // The endpoint is looked up first: an unknown id is 404 whatever the body.
            known_keys(&body, &["url", "event_types", "name"])?;
            if body.contains_key("url") {
                endpoint.url = check_url(body.get("url"))?;
            }
            if body.contains_key("event_types") {
                endpoint.event_types = event_types(body.get("event_types"))?;
            }
            if body.contains_key("name") {
                endpoint.name = name(body.get("name"))?;
            }
            endpoint.updated_at = endpoint.updated_at.max(now_unix());
            let object = endpoint.object();
            t.put(scope, endpoint)?;
            Ok(object)
        })
        .await
}

/// `DELETE /v1/webhook_endpoints/{id}`. Deliveries still queued for it are dropped
/// when their turn comes (the deliverer finds no endpoint).
pub async fn delete(agents: &Arc<Agents>, owner: &str, id: &str) -> Result<Value, AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    agents
        .transact(move |t| {
            t.delete::<WebhookEndpoint>(Scope::owner(&owner), &id)
                .map_err(store_refusal(&id))?;
            Ok(json!({
                "id": id,
                "object": "webhook_endpoint.deleted",
                "deleted": true,
                "x_agent_sandbox": endpoint_label(),
            }))
        })
        .await
}

/// `POST /v1/webhook_endpoints/{id}/rotate_secret`: a new secret, shown once; events
/// queued before are signed with it when they are sent.
pub async fn rotate(
    agents: &Arc<Agents>,
    owner: &str,
    id: &str,
    body: Map<String, Value>,
) -> Result<Value, AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    agents
        .transact(move |t| {
            let scope = Scope::owner(&owner);
            let mut endpoint: WebhookEndpoint = t.get(scope, &id).map_err(store_refusal(&id))?;
            known_keys(&body, &["keep_old_secret_active_for_24_hours"])?;
            let keep = body.get("keep_old_secret_active_for_24_hours");
            if keep.is_some_and(|v| !matches!(v, Value::Null | Value::Bool(false))) {
                return Err(refused(
                    "keep_old_secret_active_for_24_hours",
                    "keep_old_secret_active_for_24_hours: events are signed with one secret locally",
                ));
            }
            let secret = new_secret();
            endpoint.sealed =
                seal::seal(&binding(&endpoint.id), secret.as_bytes()).map_err(sealing_failed)?;
            endpoint.updated_at = endpoint.updated_at.max(now_unix());
            let object = with_secret(&endpoint, &secret);
            t.put(scope, endpoint)?;
            Ok(object)
        })
        .await
}

/// `POST /v1/webhook_endpoints/{id}/test`: one event sent now, not queued; the
/// receiver's status is the answer, and an unreachable receiver is 400
/// `agents.webhook_delivery_failed`.
pub async fn test(
    agents: &Arc<Agents>,
    owner: &str,
    id: &str,
    body: Map<String, Value>,
) -> Result<Value, AgentError> {
    let (owner, key) = (owner.to_string(), id.to_string());
    let (url, secret) = agents
        .transact(move |t| {
            let endpoint: WebhookEndpoint = t
                .get(Scope::owner(&owner), &key)
                .map_err(store_refusal(&key))?;
            Ok::<_, AgentError>((endpoint.url.clone(), endpoint.secret()?))
        })
        .await?;
    let event_type = match body.get("event_type") {
        Some(Value::String(kind)) if EVENT_TYPES.contains(&kind.as_str()) => kind.clone(),
        _ => {
            return Err(refused(
                "event_type",
                "event_type: not an event type this server sends",
            ))
        }
    };
    let event = event(&event_type, session_data("agsess_test", None));
    let payload = event.to_string();
    let event_id = event["id"].as_str().unwrap_or_default().to_string();
    match post::deliver(&url, &secret, &event_id, payload.as_bytes()).await {
        Ok(status) => Ok(json!({
            "object": "webhook_endpoint.test",
            "event_type": event_type,
            "status_code": status,
            "success": (200..300).contains(&status),
            "webhook_endpoint_id": id,
            "x_agent_sandbox": endpoint_label(),
        })),
        Err(why) => Err(AgentError::Rejected {
            status: 400,
            code: "agents.webhook_delivery_failed",
            param: Some("url".into()),
            message: why.to_string(),
        }),
    }
}

/// `GET /v1/webhook_event_types`.
pub fn event_types_list() -> Value {
    json!({
        "object": "list",
        "data": EVENT_TYPES,
        "x_agent_sandbox": label("none", &["local_signer"]),
    })
}

/// Announces `event_type` about `data` to every endpoint of `owner` subscribed to it:
/// one delivery per endpoint, queued in the outbox in one transaction, then handed to
/// the deliverer. A failure to queue is logged, never the caller's failure (a session
/// goes on whether or not its events can be announced).
pub async fn emit(agents: &Arc<Agents>, owner: &str, event_type: &'static str, data: Value) {
    let owner_key = owner.to_string();
    let queued = agents
        .transact(move |t| {
            let endpoints =
                t.list::<WebhookEndpoint>(Scope::owner(&owner_key), &ListQuery::all())?;
            let mut queued = Vec::new();
            for endpoint in endpoints.data {
                if !endpoint.event_types.iter().any(|e| e == event_type) {
                    continue;
                }
                let event = event(event_type, data.clone());
                queued.push(outbox::enqueue(t, &owner_key, &endpoint.id, &event)?);
            }
            Ok::<_, StoreError>(queued)
        })
        .await;
    match queued {
        Ok(queued) if !queued.is_empty() => outbox::schedule(agents, queued),
        Ok(_) => {}
        Err(e) => crate::log::line(format_args!(
            "webhooks: {event_type} for {owner} was not queued: {e:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_standard_webhooks() {
        // The Standard Webhooks specification's own example.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let payload = br#"{"test": 2432232314}"#;
        assert_eq!(
            sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, payload),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        let fresh = new_secret();
        assert!(fresh.starts_with("whsec_"));
        assert_eq!(key_of(&fresh).len(), 32);
    }

    #[test]
    fn urls_are_admitted_strictly() {
        for url in [
            "http://example.com/h",
            "https://127.0.0.1/h",
            "https://localhost/h",
            "https://user:pw@example.com/h",
            "https://example.com/h?token=1",
            "https://example.com/h#f",
            "ftp://example.com/h",
            "https:///h",
            "https://example.com:0/h",
            "https://example.com:99999/h",
        ] {
            assert!(check_url(Some(&json!(url))).is_err(), "{url}");
        }
        assert!(check_url(Some(&json!("https://example.com/h"))).is_ok());
        assert!(check_url(Some(&json!("https://example.com:8443"))).is_ok());
        assert!(check_url(None).is_err());
    }

    #[test]
    fn events_have_the_sdk_envelope() {
        let e = event("agent.session.idle", session_data("sess_1", None));
        assert_eq!(e["id"].as_str().unwrap().len(), 4 + 24);
        assert_eq!(e["object"], "event");
        assert_eq!(e["data"]["environment_type"], "self_hosted");
    }
}
