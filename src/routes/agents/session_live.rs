//! The live half of sessions as HTTP: inputs handed to the session's actor (with its
//! codex CLI found, or installed on first use), and its events as server-sent events —
//! `GET …/events` for as long as the client listens, a streamed create until its first
//! turn has ended. A stream's headers go out at once (the SDK's helper opens the stream
//! before it posts the input), and a comment every [`KEEPALIVE`] keeps idle streams
//! under the SDK's read timeout.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{agents_of, cli};
use crate::agents::objects::Object;
use crate::agents::records::{ObjectStore, Scope, StoreError};
use crate::agents::sessions::channel::Subscription;
use crate::agents::sessions::inputs::Input;
use crate::agents::sessions::live::{Hub, Launch, SendError};
use crate::agents::sessions::records::{KeyClaim, Session};
use crate::agents::surface::AgentsStore;
use crate::agents::AgentError;
use crate::api::ApiError;
use crate::app::Call;
use crate::http::sse::{self, SseSender};
use crate::http::Response;

/// How often an idle stream gets a comment.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

pub fn hub(call: &Call) -> Result<Arc<Hub>, ApiError> {
    call.group_arc::<Hub>()
}

/// Hands `inputs` to the session's actor; a tool result for no pending call is the
/// sentence the SDK's helper retries on.
pub async fn send(
    call: &Call,
    hub: &Arc<Hub>,
    id: &str,
    inputs: Vec<Input>,
) -> Result<(), ApiError> {
    let session = super::sessions::get_session(call, id).await?;
    let needs_runner = inputs.iter().any(|i| matches!(i, Input::Message(_)));
    let agents = agents_of(call)?;
    let owner = call.identity.id.clone();
    // Built only when no actor runs the session: an input to a running one finds
    // codex, its workspace and its bearers already there.
    let start = || async {
        match needs_runner {
            true => launch(call, &session).await,
            false => Err(ApiError::from(AgentError::invalid(
                "events",
                "This session runs no turn: send an agent.session.input.message first.",
            ))),
        }
    };
    hub.send(&agents, &owner, &session, inputs, start)
        .await
        .map_err(|e| match e {
            SendError::Launch(error) => error,
            SendError::Agent(e) => agent_refusal(e),
        })
}

/// An actor's refusal of inputs, worded for the SDK.
fn agent_refusal(e: AgentError) -> ApiError {
    match e {
        AgentError::Invalid { param, message } if message.starts_with("Unknown pending tool call") => {
            // The SDK's helper matches this code and message exactly (docs/agents-api.md §2.2).
            ApiError::new(400, "invalid_request_error", message)
                .with_code("invalid_request_error")
                .with_field("param", param)
        }
        AgentError::Busy { id, .. } => ApiError::new(
            409,
            "invalid_request_error",
            format!("The running turn cannot take this input now: {id}. Wait for it to end or cancel it."),
        )
        .with_code("active_turn_not_steerable")
        .with_header("x-should-retry", "false"),
        e => ApiError::from(e),
    }
}

/// How the session's app-server would start: the codex CLI, or Claude Code for an agent
/// whose model names it (either installed on first use),
/// the workspace opened beneath the base directory, and the bearers of the agent's MCP
/// servers from the session's vaults.
async fn launch(call: &Call, session: &Session) -> Result<Launch, ApiError> {
    let runtime = crate::agents::sessions::runtime_of(&session.agent);
    let located = cli::ready(call, runtime).await?;
    let env = cli::environment(call, &located);
    let workspace = match &session.workspace {
        Some(rel) => {
            let fd = crate::routes::shared::working_dir(call, Some(rel))
                .await
                .map_err(|e| {
                    ApiError::new(
                        409,
                        "invalid_request_error",
                        format!("The session's workspace directory is gone: {}", e.message),
                    )
                    .with_code("workspace_missing")
                    .with_header("x-should-retry", "false")
                })?;
            let path = call.config().base_dir.join(rel);
            Some((fd, path))
        }
        None => None,
    };
    let (agent, agent_env) = super::session_setup::codex_agent(call, session).await?;
    let mut env = env;
    for (name, value) in agent_env {
        env.push((name.into(), value.into()));
    }
    Ok(Launch {
        program: located.program,
        env,
        workspace,
        scratch: call.config().state_dir.join("sessions").join(&session.id),
        registry: call.services().children.clone(),
        agent,
        relay_base: relay_base(call),
        runtime,
        claude_home: call.config().state_dir.join("claude-code"),
    })
}

/// Where this machine's codex reaches the API port: the bound address, with a wildcard
/// one (`0.0.0.0`, `::`) read as loopback.
pub(super) fn relay_base(call: &Call) -> Option<String> {
    let mut addr = *call.services().bound_api.get()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Some(format!("http://{addr}"))
}

/// An `Idempotency-Key` claimed for one request's inputs; [`KeyClaimed::settle`] says
/// whether they were applied. Dropped unsettled (the client went away mid-request, a
/// panic), the claim is released, so a retry applies the inputs.
pub struct KeyClaimed {
    agents: Arc<crate::agents::Agents>,
    owner: String,
    session: String,
    key: String,
    digest: String,
    settled: bool,
}

impl KeyClaimed {
    /// Ends the claim: remembered when `applied`, else forgotten.
    pub async fn settle(mut self, applied: bool) {
        self.settled = true;
        let settle = self.settlement(applied);
        // The answer does not wait on it failing: an unsettled claim is released at the
        // next restart.
        let _ = self.agents.transact(settle).await;
    }

    fn settlement(
        &self,
        applied: bool,
    ) -> impl FnOnce(&mut <AgentsStore as ObjectStore>::Txn<'_>) -> Result<(), StoreError> + Send + 'static
    {
        let (owner, session, key, digest) = (
            self.owner.clone(),
            self.session.clone(),
            self.key.clone(),
            self.digest.clone(),
        );
        move |t| {
            use crate::agents::records::Transaction;
            t.update::<Session, _>(Scope::owner(&owner), &session, |s| {
                s.settle_key(&key, &digest, applied);
            })
        }
    }
}

impl Drop for KeyClaimed {
    fn drop(&mut self) {
        if !self.settled {
            let release = self.settlement(false);
            self.agents.transact_detached(release);
        }
    }
}

/// Claims `key` (with the body's `digest`) for this request: `None` when the same body
/// was applied already (answer as then), a claim to settle when it is to be applied; a
/// key in use by a request still running, or sent with another body, is refused.
pub async fn claim_key(
    call: &Call,
    id: &str,
    key: &str,
    digest: &str,
) -> Result<Option<KeyClaimed>, ApiError> {
    let agents = agents_of(call)?;
    let (owner, sid, k, d) = (
        call.identity.id.clone(),
        id.to_string(),
        key.to_string(),
        digest.to_string(),
    );
    let claim = agents
        .transact(move |t| {
            use crate::agents::records::Transaction;
            t.update::<Session, _>(Scope::owner(&owner), &sid, |s| s.claim_key(&k, &d))
        })
        .await
        .map_err(|e| super::store_error(e, "session", id, "session_id"))?;
    match claim {
        KeyClaim::Claimed => Ok(Some(KeyClaimed {
            agents,
            owner: call.identity.id.clone(),
            session: id.to_string(),
            key: key.to_string(),
            digest: digest.to_string(),
            settled: false,
        })),
        KeyClaim::Applied => Ok(None),
        // The SDK retries a 409 after a pause, by which time the first has an outcome.
        KeyClaim::InFlight => Err(ApiError::new(
            409,
            "invalid_request_error",
            "A request with this Idempotency-Key is still being applied; retry shortly for its answer.",
        )
        .with_code("idempotency_key_in_use")),
        KeyClaim::Reused => Err(ApiError::new(
            409,
            "invalid_request_error",
            "This Idempotency-Key was used with another request body: use a fresh key for a new request.",
        )
        .with_code("idempotency_key_reused")
        .with_header("x-should-retry", "false")),
    }
}

/// `GET …/events`: the session's events from now on.
pub fn stream(call: &Call, id: &str) -> Result<Response, ApiError> {
    let subscription = hub(call)?.subscribe(id);
    let (tx, rx) = sse::channel(64);
    monoio::spawn(forward(subscription, tx, false));
    Ok(sse::response(rx))
}

/// A streamed create: `agent.session.created`, then the first turn's events until the
/// session is idle (or failed) after it; then the stream ends.
pub async fn create_streamed(
    call: &Call,
    hub: Arc<Hub>,
    session: Session,
    input: Input,
) -> Result<Response, ApiError> {
    let subscription = hub.subscribe(&session.id);
    hub.channels.publish(
        &session.id,
        json!({"type": "agent.session.created", "session": session.object()}),
        false,
    );
    send(call, &hub, &session.id, vec![input]).await?;
    let (tx, rx) = sse::channel(64);
    monoio::spawn(forward(subscription, tx, true));
    Ok(sse::response(rx))
}

/// Copies published events onto the client's stream, with keep-alive comments, until
/// the client goes away (or, for a streamed create, the first turn ended).
async fn forward(mut subscription: Subscription, mut tx: SseSender, until_turn_ends: bool) {
    use futures_core::Stream;
    loop {
        let next = std::future::poll_fn(|cx| std::pin::Pin::new(&mut subscription).poll_next(cx));
        let tick = monoio::time::sleep(KEEPALIVE);
        let event = monoio::select! {
            event = next => Some(event),
            _ = tick => None,
            _ = tx.closed() => return,
        };
        match event {
            None => {
                if tx.send_raw(b": keep-alive\n\n".to_vec()).await.is_err() {
                    return;
                }
            }
            Some(None) => return,
            Some(Some(event)) => {
                let mut framed = Vec::with_capacity(event.json.len() + event.kind.len() + 16);
                framed.extend_from_slice(b"event: ");
                framed.extend_from_slice(event.kind.as_bytes());
                framed.extend_from_slice(b"\ndata: ");
                framed.extend_from_slice(event.json.as_bytes());
                framed.extend_from_slice(b"\n\n");
                if tx.send_raw(framed).await.is_err() {
                    return;
                }
                if until_turn_ends && event.ends_turn {
                    return;
                }
            }
        }
    }
}

/// Stops the session's actor and its streams (it was deleted).
pub fn forget(call: &Call, id: &str) -> Result<(), ApiError> {
    hub(call)?.forget(id);
    Ok(())
}
