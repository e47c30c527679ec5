//! Vaults and their credentials (`/v1/vaults`): bearer tokens for the MCP servers a
//! session's agent calls. A vault is a named set of credentials; a credential holds
//! one MCP server's token (`static_bearer`) or OAuth access token (`mcp_oauth`).
//!
//! Secrets (`token`, `access_token`) are write-only: the record keeps them sealed
//! ([`super::seal`], bound to the credential's id), its object shows only the public
//! part of `auth`, and no refusal repeats them. The one way back to a token is
//! [`bearer_for`] (or [`credential_token`]), which a session calls inside its
//! transaction to hand codex the `Authorization` of an MCP server.
//!
//! What this server cannot keep is refused: `environment_variable` credentials promise
//! that sandbox code never sees the secret (a proxy substitutes a placeholder), which a
//! local sandbox cannot keep; an `mcp_oauth` `refresh` would need this server to run
//! the OAuth refresh itself, which it does not (rotate the access token instead). An
//! MCP server URL is `https://`, or `http://` on a loopback address only (a bearer
//! token sent in clear stays on this machine).
//!
//! Vaults have no archived state here (nothing archives one): every vault and
//! credential is `active`, and a `status=archived` filter lists nothing.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::body::{invalid, metadata, unsupported, Fields};
use super::error::AgentError;
use super::objects::{label, now_unix, Object, LIST_DIFFERENCES};
use super::records::{
    new_id, Collection, ListQuery, ObjectStore, Order, Record, Scope, StoreError, Transaction,
};
use super::seal;
use super::surface::Agents;

/// Vaults kept at most.
pub const MAX_VAULTS: usize = 10_000;
/// Vaults one identity keeps at most.
pub const MAX_VAULTS_PER_OWNER: usize = 100;
/// Credentials one vault holds at most.
pub const MAX_CREDENTIALS: usize = 100;
/// Bytes of one secret.
pub const MAX_SECRET_BYTES: usize = 16 * 1024;

pub static VAULTS: Collection = Collection {
    name: "vault",
    parent: None,
    max_total: MAX_VAULTS,
    max_per_owner: MAX_VAULTS_PER_OWNER,
    evicts: false,
};

pub static CREDENTIALS: Collection = Collection {
    name: "credential",
    parent: Some(&VAULTS),
    max_total: usize::MAX,
    max_per_owner: usize::MAX,
    evicts: false,
};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Vault {
    pub id: String,
    pub created_at: u64,
    pub name: Option<String>,
    pub metadata: Value,
}

impl Record for Vault {
    fn collection() -> &'static Collection {
        &VAULTS
    }
    fn id(&self) -> &str {
        &self.id
    }
}

impl Object for Vault {
    fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "vault",
            "created_at": self.created_at,
            "name": self.name,
            "metadata": self.metadata,
            "x_agent_sandbox": label("agent-sandbox", &LIST_DIFFERENCES),
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Credential {
    pub id: String,
    pub vault_id: String,
    pub name: String,
    pub metadata: Value,
    pub created_at: u64,
    pub updated_at: u64,
    /// The public part of `auth` (what the object shows).
    pub auth: Value,
    /// The secret part, sealed: `{"token": ...}` or `{"access_token": ...}`.
    pub sealed: String,
    /// `auth.expires_at` as Unix seconds, when one is known.
    pub expires: Option<i64>,
}

impl Record for Credential {
    fn collection() -> &'static Collection {
        &CREDENTIALS
    }
    fn id(&self) -> &str {
        &self.id
    }
}

impl Object for Credential {
    fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "vault.credential",
            "vault_id": self.vault_id,
            "name": self.name,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "auth": self.auth,
            "x_agent_sandbox": label("agent-sandbox", &LIST_DIFFERENCES),
        })
    }
}

fn binding(credential_id: &str) -> String {
    format!("credential:{credential_id}:auth")
}

fn sealing_failed(e: seal::SealError) -> AgentError {
    AgentError::Failed(format!("The vault key is unusable: {}", e.0))
}

/// A `name`: trimmed, 1 to 256 bytes of UTF-8.
pub fn parse_name(value: &str, param: &str) -> Result<String, AgentError> {
    let name = value.trim();
    if name.is_empty() || name.len() > 256 {
        return Err(invalid(
            param,
            format!("{param} must hold 1 to 256 bytes once trimmed."),
        ));
    }
    Ok(name.to_string())
}

/// Whether `url` may receive a bearer token: `https://`, or `http://` to a loopback
/// host (a token sent in clear then stays on this machine). Credentials' URLs and every
/// MCP tool's URL are held to it.
pub fn token_url(url: &str) -> bool {
    if url.len() > 2048 || url.chars().any(char::is_whitespace) {
        return false;
    }
    if let Some(rest) = url.strip_prefix("https://") {
        return !rest.is_empty();
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host == "localhost" || host == "::1" || host.starts_with("127.")
}

/// The same URL for matching: a trailing `/` does not count.
fn url_key(url: &str) -> &str {
    url.trim_end_matches('/')
}

/// A secret's text: non-empty, no CR, LF or NUL (it goes into a header).
fn secret(
    f: &mut Fields<'_>,
    key: &'static str,
    required: bool,
) -> Result<Option<String>, AgentError> {
    let param = f.param(key);
    match f.get(key) {
        None if required => Err(invalid(param.clone(), format!("{param} is required."))),
        None => Ok(None),
        Some(Value::String(s))
            if !s.is_empty()
                && s.len() <= MAX_SECRET_BYTES
                && !s.contains(['\r', '\n', '\0']) =>
        {
            Ok(Some(s.clone()))
        }
        Some(_) => Err(invalid(
            param.clone(),
            format!("{param} must be a non-empty string of at most {MAX_SECRET_BYTES} bytes without CR, LF or NUL (its value is not repeated here)."),
        )),
    }
}

/// RFC 3339 (`2026-01-02T03:04:05Z`, fractions and offsets allowed) as Unix seconds.
pub fn rfc3339_seconds(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let o = rest.as_bytes();
            if o.len() != 6 || o[3] != b':' {
                return None;
            }
            let h: i64 = rest[1..3].parse().ok()?;
            let m: i64 = rest[4..6].parse().ok()?;
            sign * (h * 3600 + m * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

/// A checked `auth` of a create body: the public part, the secret part and the expiry.
struct NewAuth {
    public: Value,
    secret: Value,
    expires: Option<i64>,
}

fn parse_auth(value: &Value) -> Result<NewAuth, AgentError> {
    let mut f = Fields::of(value, "auth")?;
    let kind = f
        .string("type")?
        .ok_or_else(|| invalid("auth.type", "auth.type is required."))?;
    let parsed = match kind.as_str() {
        "static_bearer" => {
            let url = server_url(&mut f)?;
            let token = secret(&mut f, "token", true)?;
            NewAuth {
                public: json!({"type": "static_bearer", "mcp_server_url": url}),
                secret: json!({"token": token}),
                expires: None,
            }
        }
        "mcp_oauth" => {
            let url = server_url(&mut f)?;
            let token = secret(&mut f, "access_token", true)?;
            let (expires_at, expires) = expiry(&mut f)?;
            refuse_refresh(&mut f)?;
            NewAuth {
                public: json!({"type": "mcp_oauth", "mcp_server_url": url, "expires_at": expires_at, "refresh": null}),
                secret: json!({"access_token": token}),
                expires,
            }
        }
        "environment_variable" => return Err(unsupported(
            "auth.type",
            "environment_variable credentials cannot be honoured: they promise that sandbox code never sees the secret (a proxy substitutes it), and code in this sandbox could read any variable it is given. Store an MCP server's token as static_bearer or mcp_oauth instead.",
        )),
        other => return Err(invalid("auth.type", format!("Unknown auth type '{other}'; use static_bearer or mcp_oauth."))),
    };
    f.done()?;
    Ok(parsed)
}

fn server_url(f: &mut Fields<'_>) -> Result<String, AgentError> {
    let url = f.required_string("mcp_server_url")?;
    if !token_url(&url) {
        return Err(invalid(
            f.param("mcp_server_url"),
            "auth.mcp_server_url must be an https:// URL (http:// only to a loopback address: a token sent in clear stays on this machine).",
        ));
    }
    Ok(url)
}

/// `expires_at`: the text and its Unix seconds (both `None` when absent or null).
fn expiry(f: &mut Fields<'_>) -> Result<(Option<String>, Option<i64>), AgentError> {
    match f.string("expires_at")? {
        None => Ok((None, None)),
        Some(text) => match rfc3339_seconds(&text) {
            Some(at) => Ok((Some(text), Some(at))),
            None => Err(invalid(
                f.param("expires_at"),
                "auth.expires_at must be an RFC 3339 timestamp (2026-01-02T03:04:05Z).",
            )),
        },
    }
}

fn refuse_refresh(f: &mut Fields<'_>) -> Result<(), AgentError> {
    if f.get("refresh").is_some() {
        return Err(unsupported(
            f.param("refresh"),
            "auth.refresh cannot be honoured: this server does not run OAuth refreshes. Rotate the access token (POST /v1/vaults/{vault_id}/credentials/{credential_id} with auth.access_token) before it expires.",
        ));
    }
    Ok(())
}

/// A rotate `auth` applied to `credential` (its type stays).
fn rotate(credential: &mut Credential, value: &Value) -> Result<(), AgentError> {
    let mut f = Fields::of(value, "auth")?;
    let kind = f
        .string("type")?
        .ok_or_else(|| invalid("auth.type", "auth.type is required."))?;
    let current = credential.auth["type"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if kind == "environment_variable" {
        return Err(unsupported(
            "auth.type",
            "environment_variable credentials cannot be honoured here.",
        ));
    }
    if kind != current {
        return Err(invalid("auth.type", format!("auth.type must be '{current}', the credential's own type; a credential's type does not change.")));
    }
    let mut secrets =
        seal::open_json(&binding(&credential.id), &credential.sealed).map_err(sealing_failed)?;
    if kind == "static_bearer" {
        secrets["token"] = json!(secret(&mut f, "token", true)?);
    } else {
        let token = secret(&mut f, "access_token", false)?;
        if f.has("expires_at") {
            let (text, at) = expiry(&mut f)?;
            credential.auth["expires_at"] = json!(text);
            credential.expires = at;
        } else if token.is_some() {
            // A new token without an expiry has none known.
            credential.auth["expires_at"] = Value::Null;
            credential.expires = None;
        }
        if let Some(token) = token {
            secrets["access_token"] = json!(token);
        }
        refuse_refresh(&mut f)?;
    }
    f.done()?;
    credential.sealed =
        seal::seal_json(&binding(&credential.id), &secrets).map_err(sealing_failed)?;
    Ok(())
}

/// A list filter: which statuses and which metadata pairs must match.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// `None`: both statuses.
    pub statuses: Option<Vec<String>>,
    pub metadata: Vec<(String, String)>,
}

impl Filter {
    /// From the query: `status`, `status[]` (repeated) and `metadata[key]=value`.
    pub fn from_query(pairs: &[(String, String)]) -> Result<Filter, AgentError> {
        let mut filter = Filter::default();
        for (name, value) in pairs {
            if name == "status" || name == "status[]" {
                if value != "active" && value != "archived" {
                    return Err(invalid(
                        "status",
                        "status must be active or archived (or a list of them).",
                    ));
                }
                filter
                    .statuses
                    .get_or_insert_with(Vec::new)
                    .push(value.clone());
            } else if let Some(key) = name
                .strip_prefix("metadata[")
                .and_then(|k| k.strip_suffix(']'))
            {
                if key.is_empty() || key.chars().count() > 64 || value.chars().count() > 512 {
                    return Err(invalid(
                        "metadata",
                        "metadata filters take keys of 1 to 64 and values up to 512 characters.",
                    ));
                }
                filter.metadata.push((key.to_string(), value.clone()));
            }
        }
        if filter.metadata.len() > 16 {
            return Err(invalid("metadata", "At most 16 metadata filters."));
        }
        Ok(filter)
    }

    fn matches(&self, metadata: &Value) -> bool {
        // Everything here is active.
        let status = self
            .statuses
            .as_ref()
            .is_none_or(|s| s.iter().any(|s| s == "active"));
        status
            && self
                .metadata
                .iter()
                .all(|(k, v)| metadata.get(k).and_then(Value::as_str) == Some(v))
    }
}

/// A page of a filtered list: what `list` gives in chunks, kept where `keep` says.
fn filtered_page<T: Record, X: Transaction>(
    t: &mut X,
    scope: Scope<'_>,
    after: Option<String>,
    limit: usize,
    order: Order,
    keep: impl Fn(&T) -> bool,
) -> Result<(Vec<T>, bool), StoreError> {
    let mut cursor = after;
    let mut kept = Vec::new();
    loop {
        let query = ListQuery {
            after: cursor.as_deref(),
            limit: 100,
            order,
        };
        let page = t.list::<T>(scope, &query)?;
        for record in page.data {
            if keep(&record) {
                kept.push(record);
                if kept.len() > limit {
                    kept.truncate(limit);
                    return Ok((kept, true));
                }
            }
        }
        if !page.has_more {
            return Ok((kept, false));
        }
        cursor = page.last_id;
    }
}

/// A page of objects, as every list answers.
pub fn list_page(data: Vec<Value>, has_more: bool) -> Value {
    let first = data.first().map(|o| o["id"].clone());
    let last = data.last().map(|o| o["id"].clone());
    json!({"object": "list", "data": data, "first_id": first, "last_id": last,
           "has_more": has_more, "x_agent_sandbox": label("agent-sandbox", &LIST_DIFFERENCES)})
}

const VAULT: &str = "vault_id";
const CREDENTIAL: &str = "credential_id";

/// The token of `owner`'s active `static_bearer` or `mcp_oauth` credential, in one of
/// `vault_ids`, whose `mcp_server_url` is `mcp_server_url` (a trailing `/` aside);
/// `None` when no credential matches. An unknown vault is refused (naming
/// `vault_ids`), and so are several matching credentials (name one with the tool's
/// `credential_id`). A credential past its `expires_at` does not match.
pub fn bearer_for<T: Transaction>(
    t: &mut T,
    owner: &str,
    vault_ids: &[String],
    mcp_server_url: &str,
) -> Result<Option<String>, AgentError> {
    let now = now_unix() as i64;
    let mut found: Option<Credential> = None;
    for vault in vault_ids {
        t.get::<Vault>(Scope::owner(owner), vault)
            .map_err(AgentError::store("vault", vault, "vault_ids"))?;
        let all = t.list::<Credential>(Scope::within(owner, vault), &ListQuery::all())?;
        for credential in all.data {
            let url = credential.auth["mcp_server_url"]
                .as_str()
                .unwrap_or_default();
            if url_key(url) != url_key(mcp_server_url)
                || credential.expires.is_some_and(|e| e <= now)
            {
                continue;
            }
            if found.is_some() {
                return Err(invalid("vault_ids", format!("More than one credential of these vaults is for {mcp_server_url}; name one with the MCP tool's credential_id.")));
            }
            found = Some(credential);
        }
    }
    found.map(|c| token_of(&c)).transpose()
}

/// The one check of a session's MCP tools against its vaults, run wherever a
/// session's tools or vaults are set (create, update) and again at every launch: each
/// http MCP tool's `credential_id` (named by `prefix`, `agent.tools`) must be a
/// credential of those vaults for exactly the tool's `server_url`.
pub fn check_mcp_credentials<T: Transaction>(
    t: &mut T,
    owner: &str,
    vault_ids: &[String],
    tools: &[Value],
    prefix: &str,
) -> Result<(), AgentError> {
    for (i, tool) in tools.iter().enumerate() {
        if tool["type"] != "mcp" || tool["transport"]["type"] == "stdio" {
            continue;
        }
        if let Some(id) = tool["credential_id"].as_str() {
            let url = tool["transport"]["server_url"].as_str().unwrap_or_default();
            let param = format!("{prefix}[{i}].credential_id");
            credential_token(t, owner, vault_ids, id, url, &param)?;
        }
    }
    Ok(())
}

/// The token of credential `credential_id` for the MCP server at `server_url`: it must
/// be in one of `vault_ids` and be for exactly that URL (a trailing `/` aside), or it
/// is refused naming `param`. A credential reaches only its own server.
pub fn credential_token<T: Transaction>(
    t: &mut T,
    owner: &str,
    vault_ids: &[String],
    credential_id: &str,
    server_url: &str,
    param: &str,
) -> Result<String, AgentError> {
    for vault in vault_ids {
        match t.get::<Credential>(Scope::within(owner, vault), credential_id) {
            Ok(credential) => {
                let own = credential.auth["mcp_server_url"]
                    .as_str()
                    .unwrap_or_default();
                if url_key(own) != url_key(server_url) {
                    return Err(invalid(
                        param,
                        format!("The credential {credential_id} is for {own}, and a credential is sent only to its own mcp_server_url: not to {server_url}. Name a credential for {server_url}, or give the tool that URL."),
                    ));
                }
                return token_of(&credential);
            }
            Err(StoreError::NotFound | StoreError::ParentNotFound) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(AgentError::store(
        "credential",
        credential_id,
        "credential_id",
    )(StoreError::NotFound))
}

fn token_of(credential: &Credential) -> Result<String, AgentError> {
    let secrets =
        seal::open_json(&binding(&credential.id), &credential.sealed).map_err(sealing_failed)?;
    secrets
        .get("token")
        .or_else(|| secrets.get("access_token"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| {
            AgentError::Failed(format!(
                "The credential '{}' holds no token.",
                credential.id
            ))
        })
}

pub async fn create_vault<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    name: Option<String>,
    metadata: Value,
) -> Result<Value, AgentError> {
    let vault = Vault {
        id: new_id("vault_"),
        created_at: now_unix(),
        name,
        metadata,
    };
    let object = vault.object();
    let (owner, id) = (owner.to_string(), vault.id.clone());
    agents
        .transact(move |t| {
            t.create(Scope::owner(&owner), vault)
                .map_err(AgentError::store("vault", &id, VAULT))
        })
        .await?;
    Ok(object)
}

/// `name`: `Some(None)` clears it; `metadata` replaces.
pub async fn update_vault<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    id: &str,
    name: Option<Option<String>>,
    metadata: Option<Value>,
) -> Result<Value, AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    agents
        .transact(move |t| {
            t.update(Scope::owner(&owner), &id, |vault: &mut Vault| {
                if let Some(name) = name {
                    vault.name = name;
                }
                if let Some(metadata) = metadata {
                    vault.metadata = metadata;
                }
                vault.object()
            })
            .map_err(AgentError::store("vault", &id, VAULT))
        })
        .await
}

/// Deletes a vault and its credentials.
pub async fn delete_vault<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    id: &str,
) -> Result<(), AgentError> {
    let (owner, id) = (owner.to_string(), id.to_string());
    agents
        .transact(move |t| {
            t.delete::<Vault>(Scope::owner(&owner), &id)
                .map(drop)
                .map_err(AgentError::store("vault", &id, VAULT))
        })
        .await
}

pub async fn list_vaults<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    after: Option<String>,
    limit: usize,
    order: Order,
    filter: Filter,
) -> Result<Value, AgentError> {
    let owner = owner.to_string();
    let cursor = after.clone().unwrap_or_default();
    agents
        .transact(move |t| {
            let (data, more) =
                filtered_page::<Vault, _>(t, Scope::owner(&owner), after, limit, order, |v| {
                    filter.matches(&v.metadata)
                })
                .map_err(AgentError::store("vault", &cursor, "after"))?;
            Ok(list_page(data.iter().map(Object::object).collect(), more))
        })
        .await
}

/// A new credential in `owner`'s vault `vault_id`, from a create body's `auth`.
pub async fn create_credential<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    vault_id: &str,
    name: String,
    metadata: Value,
    auth: &Value,
) -> Result<Value, AgentError> {
    let auth = parse_auth(auth)?;
    let now = now_unix();
    let id = new_id("cred_");
    let secret = auth.secret;
    let mut credential = Credential {
        id,
        vault_id: vault_id.to_string(),
        name,
        metadata,
        created_at: now,
        updated_at: now,
        auth: auth.public,
        sealed: String::new(),
        expires: auth.expires,
    };
    let object = credential.object();
    let (owner, vault) = (owner.to_string(), vault_id.to_string());
    agents
        .transact(move |t| {
            // Sealed here, on the blocking pool: the key's first use reads (or makes and
            // fsyncs) its file.
            credential.sealed =
                seal::seal_json(&binding(&credential.id), &secret).map_err(sealing_failed)?;
            let within = Scope::within(&owner, &vault);
            let stored = AgentError::store("vault", &vault, VAULT);
            t.get::<Vault>(Scope::owner(&owner), &vault)
                .map_err(AgentError::store("vault", &vault, VAULT))?;
            if t.count::<Credential>(within)? >= MAX_CREDENTIALS {
                return Err(AgentError::Rejected {
                    status: 429,
                    code: "agents_store_quota_exceeded",
                    param: None,
                    message: format!(
                        "A vault holds at most {MAX_CREDENTIALS} credentials; delete one first."
                    ),
                });
            }
            t.create(within, credential).map_err(stored)
        })
        .await?;
    Ok(object)
}

/// Rotates (`auth`) and replaces the metadata of a credential.
pub async fn update_credential<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    vault_id: &str,
    id: &str,
    auth: Option<Value>,
    metadata: Option<Value>,
) -> Result<Value, AgentError> {
    let (owner, vault, id) = (owner.to_string(), vault_id.to_string(), id.to_string());
    agents
        .transact(move |t| {
            let within = Scope::within(&owner, &vault);
            let mut credential = t
                .get::<Credential>(within, &id)
                .map_err(|e| scoped(e, &vault, &id))?;
            if let Some(auth) = &auth {
                rotate(&mut credential, auth)?;
            }
            if let Some(metadata) = metadata {
                credential.metadata = metadata;
            }
            credential.updated_at = now_unix().max(credential.created_at);
            let object = credential.object();
            t.put(within, credential)?;
            Ok(object)
        })
        .await
}

pub async fn delete_credential<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    vault_id: &str,
    id: &str,
) -> Result<(), AgentError> {
    let (owner, vault, id) = (owner.to_string(), vault_id.to_string(), id.to_string());
    agents
        .transact(move |t| {
            t.delete::<Credential>(Scope::within(&owner, &vault), &id)
                .map(drop)
                .map_err(|e| scoped(e, &vault, &id))
        })
        .await
}

pub async fn list_credentials<S: ObjectStore>(
    agents: &std::sync::Arc<Agents<S>>,
    owner: &str,
    vault_id: &str,
    after: Option<String>,
    limit: usize,
    order: Order,
    filter: Filter,
) -> Result<Value, AgentError> {
    let (owner, vault) = (owner.to_string(), vault_id.to_string());
    let cursor = after.clone().unwrap_or_default();
    agents
        .transact(move |t| {
            let (data, more) = filtered_page::<Credential, _>(
                t,
                Scope::within(&owner, &vault),
                after,
                limit,
                order,
                |c| filter.matches(&c.metadata),
            )
            .map_err(|e| match e {
                StoreError::ParentNotFound => {
                    AgentError::store("vault", &vault, VAULT)(StoreError::NotFound)
                }
                e => AgentError::store("credential", &cursor, "after")(e),
            })?;
            Ok(list_page(data.iter().map(Object::object).collect(), more))
        })
        .await
}

/// A credential lookup's refusal: an unknown vault is named as such.
fn scoped(error: StoreError, vault: &str, id: &str) -> AgentError {
    match error {
        StoreError::ParentNotFound => {
            AgentError::store("vault", vault, VAULT)(StoreError::NotFound)
        }
        e => AgentError::store("credential", id, CREDENTIAL)(e),
    }
}

/// A create body's `name` and `metadata` for a vault (`name` optional).
pub fn vault_fields(body: &Map<String, Value>) -> Result<(Option<String>, Value), AgentError> {
    let name = match body.get("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(parse_name(s, "name")?),
        Some(_) => return Err(invalid("name", "name must be a string.")),
    };
    Ok((name, metadata(body.get("metadata"), "metadata")?))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::agents::surface::AgentsStore;

    #[test]
    fn timestamps_parse_as_rfc_3339() {
        assert_eq!(rfc3339_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            rfc3339_seconds("2026-01-02T03:04:05.5+01:00"),
            Some(1_767_323_045 - 3600)
        );
        assert_eq!(rfc3339_seconds("2026-01-02 03:04:05Z"), None);
        assert_eq!(rfc3339_seconds("2026-13-02T03:04:05Z"), None);
    }

    #[test]
    fn urls_that_may_carry_a_token() {
        assert!(token_url("https://mcp.example.com/mcp"));
        assert!(token_url("http://127.0.0.1:8765/mcp"));
        assert!(token_url("http://[::1]:80/"));
        assert!(token_url("http://localhost/mcp"));
        assert!(!token_url("http://mcp.example.com/mcp"));
        assert!(!token_url("ftp://x"));
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        crate::testing::run(f)
    }

    #[test]
    fn secrets_are_sealed_in_the_record_and_found_by_url() {
        let agents = Arc::new(Agents::<AgentsStore>::default());
        run(async {
            let vault = create_vault(&agents, "alice", Some("v".into()), json!({}))
                .await
                .unwrap();
            let vault_id = vault["id"].as_str().unwrap().to_string();
            let created = create_credential(&agents, "alice", &vault_id, "c".into(), json!({}),
                    &json!({"type": "static_bearer", "mcp_server_url": "https://mcp.test/mcp", "token": "tok-SECRET-1"}))
                .await
                .unwrap();
            assert!(!created.to_string().contains("tok-SECRET-1"));
            let id = created["id"].as_str().unwrap().to_string();
            let vaults = vec![vault_id.clone()];
            let (v, i) = (vault_id.clone(), id.clone());
            let record: Credential = agents
                .transact(move |t| {
                    t.get::<Credential>(Scope::within("alice", &v), &i)
                        .map_err(AgentError::from)
                })
                .await
                .unwrap();
            assert!(
                !serde_json::to_string(&record)
                    .unwrap()
                    .contains("tok-SECRET-1"),
                "the stored form is sealed"
            );
            let token = agents
                .transact(move |t| bearer_for(t, "alice", &vaults, "https://mcp.test/mcp/"))
                .await
                .unwrap();
            assert_eq!(token.as_deref(), Some("tok-SECRET-1"));
            let vaults = vec![vault_id.clone()];
            let foreign = agents
                .transact(move |t| bearer_for(t, "bob", &vaults, "https://mcp.test/mcp"))
                .await;
            assert!(foreign.is_err(), "another owner's vault is unknown");
            update_credential(
                &agents,
                "alice",
                &vault_id,
                &id,
                Some(json!({"type": "static_bearer", "token": "tok-2"})),
                None,
            )
            .await
            .unwrap();
            let vaults = vec![vault_id.clone()];
            let token = agents
                .transact(move |t| bearer_for(t, "alice", &vaults, "https://mcp.test/mcp"))
                .await
                .unwrap();
            assert_eq!(token.as_deref(), Some("tok-2"));
            // A credential named by a tool reaches only its own URL.
            let tool = |url: &str| {
                json!({"type": "mcp", "transport": {"type": "http", "server_url": url},
                       "credential_id": id.clone()})
            };
            let (vaults, tools) = (vec![vault_id.clone()], vec![tool("https://mcp.test/mcp/")]);
            agents
                .transact(move |t| {
                    check_mcp_credentials(t, "alice", &vaults, &tools, "agent.tools")
                })
                .await
                .unwrap();
            let (vaults, tools) = (
                vec![vault_id.clone()],
                vec![tool("https://mcp.test/mcp"), tool("http://127.0.0.1:9/mcp")],
            );
            let elsewhere = agents
                .transact(move |t| {
                    check_mcp_credentials(t, "alice", &vaults, &tools, "agent.tools")
                })
                .await
                .unwrap_err();
            assert_eq!(elsewhere.param(), Some("agent.tools[1].credential_id"));
            let tools = vec![tool("https://mcp.test/mcp")];
            let unvaulted = agents
                .transact(move |t| check_mcp_credentials(t, "alice", &[], &tools, "agent.tools"))
                .await;
            assert!(
                unvaulted.is_err(),
                "a credential outside the session's vaults is refused"
            );
            let refused = create_credential(&agents, "alice", &vault_id, "e".into(), json!({}),
                    &json!({"type": "environment_variable", "secret_name": "K", "secret_value": "x", "networking": {"type": "unrestricted"}}))
                .await
                .unwrap_err();
            assert_eq!(refused.param(), Some("auth.type"));
            delete_vault(&agents, "alice", &vault_id).await.unwrap();
            let (v, i) = (vault_id.clone(), id.clone());
            let gone = agents
                .transact(move |t| {
                    t.get::<Credential>(Scope::within("alice", &v), &i)
                        .map_err(AgentError::from)
                })
                .await;
            assert!(gone.is_err(), "a vault's credentials go with it");
        });
    }

    #[test]
    fn the_durable_store_file_holds_no_secret_in_clear() {
        use crate::agents::durable::DurableStore;
        use crate::agents::records::Limits;
        let dir = std::env::temp_dir().join(format!("abx-vault-redb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("agents.redb");
        let agents = Arc::new(Agents::new(
            DurableStore::open(&file, Limits::default()).unwrap(),
        ));
        let vault_id = run(async {
            let vault = create_vault(&agents, "alice", None, json!({}))
                .await
                .unwrap();
            let vault_id = vault["id"].as_str().unwrap().to_string();
            create_credential(&agents, "alice", &vault_id, "c".into(), json!({}),
                &json!({"type": "mcp_oauth", "mcp_server_url": "https://m.test", "access_token": "oauth-SECRET-on-disk"}))
                .await
                .unwrap();
            vault_id
        });
        drop(agents);
        let bytes = std::fs::read(&file).unwrap();
        let needle = b"oauth-SECRET-on-disk";
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle),
            "the token is sealed on disk"
        );
        assert!(
            bytes
                .windows(vault_id.len())
                .any(|w| w == vault_id.as_bytes()),
            "the records are there"
        );
        let agents = Arc::new(Agents::new(
            DurableStore::open(&file, Limits::default()).unwrap(),
        ));
        let vaults = vec![vault_id];
        let token =
            run(agents.transact(move |t| bearer_for(t, "alice", &vaults, "https://m.test")));
        assert_eq!(
            token.unwrap().as_deref(),
            Some("oauth-SECRET-on-disk"),
            "it opens once the file is reopened"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
