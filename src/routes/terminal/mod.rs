//! `terminal`: PTY sessions over HTTP (`/pty/sessions`), and their WebSocket on the PTY
//! port (`socket.rs`).

mod socket;

use std::ffi::OsString;
use std::sync::Arc;

use serde_json::{json, Value};

use super::schema_object;
use crate::api::{ApiError, Args, Group, Method, Param};
use crate::app::{handler, Call, Endpoint};
use crate::http::Response;
use crate::pty::{
    CreateError, NewSession, Session, SessionInfo, Sessions, ALLOWED_SHELLS, MAX_SESSIONS,
    STRIPPED_VARS,
};
use crate::routes::shared::working_dir;

const DEFAULT_SHELL: &str = "/bin/bash";

fn session_schema() -> serde_json::Value {
    schema_object(
        &["id", "pid", "created_at", "cols", "rows", "alive"],
        json!({
            "id": {"type": "string"}, "pid": {"type": "integer"}, "created_at": {"type": "number"},
            "cols": {"type": "integer"}, "rows": {"type": "integer"}, "alive": {"type": "boolean"},
        }),
    )
}

pub fn endpoints() -> Vec<Endpoint> {
    let id = Param::path("id").doc("The session_id POST /pty/sessions answered.");
    let size = |name: &'static str, doc: &'static str| {
        Param::body(name, "integer", false)
            .range(1.0, 1000.0)
            .doc(doc)
    };
    vec![
        Endpoint::new(Method::Post, "/pty/sessions", Group::Terminal, handler(create))
            .id("pty_create_session")
            .formerly("pty_create").scopes(&["terminal:use"])
            .enforces(&["paths", "max_sessions", "env_deny", "shells"])
            .changes()
            .summary("Start a shell on a new terminal; answers its WebSocket URL.")
            .params(&[
                Param::body("shell", "string", false)
                    .default("\"/bin/bash\"")
                    .invalid(SHELL_NOT_A_STRING)
                    .doc("One of /bin/bash, /bin/sh, /bin/zsh, /usr/bin/bash, /usr/bin/zsh."),
                size("cols", "Columns.").default("80"),
                size("rows", "Rows.").default("24"),
                Param::body("env", "string_map", false)
                    .doc("Variables added to the shell's environment (LD_* and others that load code are dropped)."),
            ])
            .limit("max_sessions", MAX_SESSIONS)
            .returns(|| schema_object(&["session_id", "ws_url", "pid"], json!({
                "session_id": {"type": "string"}, "ws_url": {"type": "string"}, "pid": {"type": "integer"},
            })))
            .also_answers(&[400, 429]),
        Endpoint::new(Method::Get, "/pty/sessions", Group::Terminal, handler(list))
            .id("pty_list_sessions")
            .formerly("pty_list").scopes(&["terminal:use"])
            .summary("Terminal sessions (idle ones are reaped first).")
            .returns(|| schema_object(&["sessions"], json!({"sessions": {"type": "array"}}))),
        Endpoint::new(Method::Get, "/pty/sessions/{id}", Group::Terminal, handler(get))
            .id("pty_detail")
            .formerly("pty_get").scopes(&["terminal:use"])
            .summary("One terminal session.")
            .params(std::slice::from_ref(&id))
            .returns(session_schema)
            .also_answers(&[404]),
        Endpoint::new(Method::Post, "/pty/sessions/{id}/resize", Group::Terminal, handler(resize))
            .id("pty_resize").scopes(&["terminal:use"])
            .changes()
            .summary("Set a terminal's size (1-1000 columns and rows).")
            .params(&[
                id.clone(),
                Param { required: true, ..size("cols", "Columns.") }
                    .missing("cols must be an integer from 1 to 1000"),
                Param { required: true, ..size("rows", "Rows.") }
                    .missing("rows must be an integer from 1 to 1000"),
            ])
            .returns(session_schema)
            .also_answers(&[400, 404]),
        Endpoint::new(Method::Delete, "/pty/sessions/{id}", Group::Terminal, handler(delete))
            .id("pty_delete_session")
            .formerly("pty_delete").scopes(&["terminal:use"])
            .changes()
            .summary("End a terminal session and its processes.")
            .params(&[id])
            .returns(|| schema_object(&["status", "session_id"], json!({
                "status": {"const": "closed"}, "session_id": {"type": "string"},
            })))
            .also_answers(&[404]),
        socket::endpoint(),
    ]
}

fn session_json(info: &SessionInfo) -> Value {
    json!({
        "id": info.id,
        "pid": info.pid,
        "created_at": info.created_at,
        "cols": info.cols,
        "rows": info.rows,
        "alive": info.alive,
    })
}

/// The refusal for a `shell` that is not a string (one that is not allowed names itself).
const SHELL_NOT_A_STRING: &str = "Shell not allowed: shell must be a string (allowed: /bin/bash, /bin/sh, /bin/zsh, /usr/bin/bash, /usr/bin/zsh)";

/// A declared `cols` or `rows` (checked from 1 to 1000).
fn dimension(args: &Args, name: &str) -> u16 {
    args.uint(name).map_or(1, |v| v.clamp(1, 1000) as u16)
}

/// Kills the processes of sessions that were removed from the table, on the blocking
/// pool (each kill scans `/proc` for the session's jobs).
async fn kill_off_the_loop(sessions: Vec<Arc<Session>>) {
    if sessions.is_empty() {
        return;
    }
    let _ = crate::runtime::blocking(move || {
        for session in sessions {
            session.kill();
        }
    })
    .await;
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(404, "ValueError", format!("Session not found: {id}"))
}

/// `POST /pty/sessions`.
async fn create(call: Call) -> Result<Response, ApiError> {
    let args = call.args()?;
    let shell = args.str("shell").unwrap_or(DEFAULT_SHELL).to_string();
    if !ALLOWED_SHELLS.contains(&shell.as_str()) {
        return Err(ApiError::bad_request(format!(
            "Shell not allowed: {shell} (allowed: {})",
            ALLOWED_SHELLS.join(", ")
        )));
    }
    let cols = dimension(&args, "cols");
    let rows = dimension(&args, "rows");
    let overrides = env_overrides(args.pairs("env"))?;
    refuse_by_policy(&call, &shell, &overrides)?;
    // Besides the contract's three (stripped below from every source), the caller's
    // `env` loses every other variable that loads code, the list the other routes refuse:
    // a terminal's program could otherwise be made to load an uploaded library, or under
    // ABX_CHILD_USER the helper while it is still root.
    let mut overrides = overrides;
    overrides.retain(|(name, _)| !crate::process::env::loads_code(name));
    let services = call.services();
    let mut env: Vec<(OsString, OsString)> = services
        .environment
        .with(&overrides)
        .into_iter()
        .filter(|(name, _)| !STRIPPED_VARS.iter().any(|v| name == v))
        .collect();
    if !env.iter().any(|(name, _)| name == "TERM") {
        env.push(("TERM".into(), "xterm-256color".into()));
    }
    let cwd = working_dir(&call, None).await?;
    let sessions = call.group_state::<Sessions>()?;
    kill_off_the_loop(sessions.take_idle()).await;
    let session = sessions
        .create(
            NewSession {
                owner: call.identity.id.clone(),
                shell: shell.clone(),
                cols,
                rows,
                env,
                cwd,
                most: call
                    .decision()
                    .knob_u64("max_sessions")
                    .map_or(MAX_SESSIONS, |most| most as usize),
            },
            &services.children,
        )
        .await
        .map_err(|e| match e {
            CreateError::Full => ApiError::new(
                429,
                "ResourceError",
                format!(
                    "Session limit reached: at most {} terminal sessions; delete one first (DELETE /pty/sessions/<id>)",
                    call.decision()
                        .knob_u64("max_sessions")
                        .map_or(MAX_SESSIONS, |most| (most as usize).min(MAX_SESSIONS))
                ),
            ),
            CreateError::Io(error) => crate::routes::shared::spawn_error(&error, &shell),
        })?;
    let mut ws_url = format!(
        "ws://localhost:{}/pty?session_id={}",
        services.pty_port(),
        session.id
    );
    // With a policy's identities, each caller has a token of their own: none is handed out.
    let shared_token = (!call.catalog().auth.per_identity())
        .then(|| call.state.server_token())
        .flatten();
    if let Some(token) = shared_token.as_deref().filter(|t| !t.is_empty()) {
        ws_url.push_str("&token=");
        ws_url.extend(percent_encoding::utf8_percent_encode(
            token,
            percent_encoding::NON_ALPHANUMERIC,
        ));
    }
    Ok(Response::ok(&json!({
        "session_id": session.id,
        "ws_url": ws_url,
        "pid": session.pid,
    })))
}

/// What the policy and the server's own rules refuse of a new terminal, in the
/// reference's order and words: an `ABX_*` variable (403 `env_var_denied`), a shell the
/// policy's `shells` leaves out (403 `shell_not_allowed`), a variable its `env_deny`
/// names or an identity's `token_env` (403 `env_var_not_allowed`).
fn refuse_by_policy(
    call: &Call,
    shell: &str,
    overrides: &[(String, String)],
) -> Result<(), ApiError> {
    if let Some((name, _)) = overrides
        .iter()
        .find(|(name, _)| name.to_ascii_uppercase().starts_with("ABX_"))
    {
        return Err(ApiError::new(
            403,
            "PolicyDenied",
            format!("Environment variable '{name}' cannot be overwritten"),
        )
        .with_code("env_var_denied"));
    }
    let decision = call.decision();
    if let Some(shells) = decision.knob_list("shells") {
        if !shells.contains(&shell) {
            return Err(ApiError::new(
                403,
                "PolicyDenied",
                format!("Shell '{shell}' is not permitted by policy"),
            )
            .with_code("shell_not_allowed"));
        }
    }
    let denied = decision.knob_list("env_deny").unwrap_or_default();
    let secrets = call.catalog().policy.token_env_names();
    let mut blocked: Vec<&str> = overrides
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|name| denied.contains(name) || secrets.iter().any(|s| s == name))
        .collect();
    if !blocked.is_empty() {
        blocked.sort_unstable();
        let listed: Vec<String> = blocked.iter().map(|n| format!("'{n}'")).collect();
        return Err(ApiError::new(
            403,
            "PolicyDenied",
            format!(
                "Environment variable(s) not allowed: [{}]",
                listed.join(", ")
            ),
        )
        .with_code("env_var_not_allowed"));
    }
    Ok(())
}

/// The caller's variables: a name must be non-empty without `=`, and neither may
/// contain NUL (the declaration checked they are strings).
fn env_overrides(pairs: Vec<(String, String)>) -> Result<Vec<(String, String)>, ApiError> {
    for (name, value) in &pairs {
        if name.is_empty() || name.contains('=') || name.contains('\0') || value.contains('\0') {
            return Err(ApiError::bad_request(format!(
                "env: '{name}' cannot be set (names must be non-empty without '=', and neither may contain NUL)"
            )));
        }
    }
    Ok(pairs)
}

/// `GET /pty/sessions`.
async fn list(call: Call) -> Result<Response, ApiError> {
    let table = call.group_state::<Sessions>()?;
    kill_off_the_loop(table.take_idle()).await;
    let sessions: Vec<Value> = table
        .list(&call.identity.id)
        .iter()
        .map(|s| session_json(&s.info()))
        .collect();
    Ok(Response::ok(&json!({ "sessions": sessions })))
}

/// `GET /pty/sessions/{id}`.
async fn get(call: Call) -> Result<Response, ApiError> {
    let id = call.path_param("id").unwrap_or_default();
    let session = call
        .group_state::<Sessions>()?
        .get(id, &call.identity.id)
        .ok_or_else(|| not_found(id))?;
    Ok(Response::ok(&session_json(&session.info())))
}

/// `POST /pty/sessions/{id}/resize`.
async fn resize(call: Call) -> Result<Response, ApiError> {
    let id = call.path_param("id").unwrap_or_default().to_string();
    let args = call.args()?;
    let cols = dimension(&args, "cols");
    let rows = dimension(&args, "rows");
    let session = call
        .group_state::<Sessions>()?
        .get(&id, &call.identity.id)
        .ok_or_else(|| not_found(&id))?;
    session
        .resize(cols, rows)
        .map_err(|e| crate::api::errno::os_error(&e, None))?;
    Ok(Response::ok(&session_json(&session.info())))
}

/// `DELETE /pty/sessions/{id}`.
async fn delete(call: Call) -> Result<Response, ApiError> {
    let id = call.path_param("id").unwrap_or_default().to_string();
    let session = call
        .group_state::<Sessions>()?
        .remove(&id, &call.identity.id)
        .ok_or_else(|| not_found(&id))?;
    kill_off_the_loop(vec![session]).await;
    Ok(Response::ok(&json!({"status": "closed", "session_id": id})))
}

/// The group's state: the terminal sessions, killed at shutdown (their jobs live in
/// process groups of their own, out of the child registry).
pub fn registrar() -> crate::app::Registrar {
    Box::new(|setup| {
        let sessions = std::sync::Arc::new(crate::pty::Sessions::default());
        let ending = sessions.clone();
        setup.on_shutdown(move || {
            for session in ending.all() {
                session.kill();
            }
        });
        setup.provide(sessions);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixed sentences name the shells the handler allows.
    #[test]
    fn shell_sentences_list_the_allowed_shells() {
        let allowed = ALLOWED_SHELLS.join(", ");
        assert!(SHELL_NOT_A_STRING.ends_with(&format!("(allowed: {allowed})")));
        let create = endpoints()
            .into_iter()
            .find(|e| e.spec.id == "pty_create_session")
            .unwrap();
        let shell = create
            .spec
            .params
            .iter()
            .find(|p| p.name == "shell")
            .unwrap();
        assert!(shell.doc.contains(&allowed), "{}", shell.doc);
        assert_eq!(shell.default, Some("\"/bin/bash\""));
        assert_eq!(DEFAULT_SHELL, "/bin/bash");
    }
}
