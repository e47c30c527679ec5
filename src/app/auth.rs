//! Token authentication as the contract describes it: `ABX_SERVER_TOKEN` read once; when
//! set, routes with `auth_required` need it in `X-Access-Token` or `Authorization: Bearer`.
//!
//! Comparison is constant-time: both sides go through HMAC-SHA256 under a key drawn at
//! startup and the fixed-length tags are compared with `verify_slice`, so neither the
//! content nor the length of the expected token leaks through timing.
//!
//! A policy may add identities (`docs/policy.md`): several tokens, each with an id and
//! scopes, known only by their SHA-256 digest. Every token, `ABX_SERVER_TOKEN` included,
//! is therefore kept as `HMAC(key, SHA-256(token))`, a presented credential is hashed the
//! same way once, and it is compared with every identity's tag (all of them, whichever
//! matches), so which identity matched does not show in the time taken either.

use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::api::ApiError;

/// Who is calling, and what they may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub id: String,
    pub scopes: Vec<String>,
}

impl Identity {
    /// Whether this identity holds `scope`: listed, or covered by `*` or by its
    /// namespace's `ns:*`. `core:read` (discovery) is held by every identity, as on the
    /// reference server.
    pub fn can(&self, scope: &str) -> bool {
        scope == CORE_READ || scope_granted(&self.scopes, scope)
    }

    /// Whether this identity holds every scope in `required`.
    pub fn has_scopes(&self, required: &[String]) -> bool {
        required.iter().all(|r| self.can(r))
    }

    /// The first scope in `required` this identity lacks.
    pub fn missing_scope<'a, S: AsRef<str>>(&self, required: &'a [S]) -> Option<&'a str> {
        required.iter().map(AsRef::as_ref).find(|r| !self.can(r))
    }
}

/// The scope of discovery (`/capabilities`), which no identity lacks.
pub const CORE_READ: &str = "core:read";

/// Whether `granted` covers `required`: `*`, the scope itself, or `<namespace>:*`.
pub fn scope_granted(granted: &[String], required: &str) -> bool {
    let namespace = required.split(':').next().unwrap_or(required);
    granted.iter().any(|g| {
        g == "*" || g == required || g.strip_suffix(":*").is_some_and(|ns| ns == namespace)
    })
}

/// One accepted token: who presents it, and the tag it must produce.
struct Holder {
    identity: Arc<Identity>,
    tag: Vec<u8>,
    /// The token itself, where it is known (not for one a policy gives as a digest):
    /// what envd's signed URLs are checked against.
    token: Option<String>,
}

/// A token known by its SHA-256 digest, with the identity it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIdentity {
    pub id: String,
    pub scopes: Vec<String>,
    pub digest: [u8; 32],
    /// The token, when the policy names where it is (`token_env`), not only its digest.
    pub token: Option<String>,
}

/// The credential check, built once from the configuration.
pub struct Auth {
    key: [u8; 32],
    holders: Vec<Holder>,
    /// Identities come from a policy (not only `ABX_SERVER_TOKEN`).
    per_identity: bool,
    /// A caller without credentials is `anonymous` even though tokens are configured
    /// (the policy's `auth.allow_anonymous`).
    anonymous_allowed: bool,
    /// A token is expected (`ABX_TOKEN_FILE`) but has not arrived: no local mode.
    pending: bool,
    anonymous: Arc<Identity>,
}

/// The credentials a request presented, kept only as their SHA-256 digests, so a
/// long-lived connection can be checked again after a policy reload without holding
/// the tokens themselves.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    digests: Vec<[u8; 32]>,
}

impl Credentials {
    /// `X-Access-Token`, `Authorization: Bearer` and the PTY socket's `?token=`, each
    /// header at most once with one value (two different values are refused as
    /// ambiguous).
    pub fn presented(
        headers: &[(String, String)],
        query_token: Option<&str>,
    ) -> Result<Credentials, ApiError> {
        let mut access_token: Option<&str> = None;
        let mut bearer: Option<&str> = None;
        let mut authorization: Option<&str> = None;
        for (name, value) in headers {
            if name == "x-access-token" {
                match access_token {
                    Some(seen) if seen != value => {
                        return Err(ApiError::new(
                            400,
                            "AuthError",
                            "Two different X-Access-Token values in one request; send the token once, or use Authorization: Bearer",
                        )
                        .with_code("ambiguous_credentials"));
                    }
                    _ => access_token = Some(value),
                }
            } else if name == "authorization" {
                match authorization {
                    Some(seen) if seen != value => {
                        return Err(ApiError::new(
                            400,
                            "AuthError",
                            "Two different Authorization headers in one request; send one",
                        )
                        .with_code("ambiguous_credentials"));
                    }
                    _ => authorization = Some(value),
                }
                // Compare bytes: the header may hold any byte, and slicing a str at 7
                // could cut a multi-byte character.
                let value = value.trim();
                if value.len() > 7 && value.as_bytes()[..7].eq_ignore_ascii_case(b"bearer ") {
                    bearer = value.get(7..).map(str::trim);
                }
            }
        }
        Ok(Credentials {
            digests: [access_token, bearer, query_token]
                .into_iter()
                .flatten()
                .map(token_digest)
                .collect(),
        })
    }
}

/// The identity `ABX_SERVER_TOKEN` stands for, as on the reference server.
pub const SERVER_IDENTITY: &str = "server";

/// SHA-256 of a token, as policies store it.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Auth {
    /// `token` is `ABX_SERVER_TOKEN` (None or empty: local mode).
    pub fn new(token: Option<&str>) -> Auth {
        Auth::with_identities(token, &[])
    }

    /// `ABX_SERVER_TOKEN` (identity `token`, every scope) plus a policy's identities.
    /// With neither, the server is in local mode.
    pub fn with_identities(token: Option<&str>, identities: &[TokenIdentity]) -> Auth {
        let mut key = [0u8; 32];
        // A failed getrandom leaves a zero key: still constant-time, just not secret.
        let _ = rustix::rand::getrandom(&mut key, rustix::rand::GetRandomFlags::empty());
        let mut holders = Vec::new();
        if let Some(token) = token.filter(|t| !t.is_empty()) {
            holders.push(Holder {
                identity: Arc::new(Identity {
                    id: SERVER_IDENTITY.into(),
                    scopes: vec!["*".into()],
                }),
                tag: tag(&key, &token_digest(token)),
                token: Some(token.to_string()),
            });
        }
        for identity in identities {
            holders.push(Holder {
                identity: Arc::new(Identity {
                    id: identity.id.clone(),
                    scopes: identity.scopes.clone(),
                }),
                tag: tag(&key, &identity.digest),
                token: identity.token.clone(),
            });
        }
        Auth {
            key,
            holders,
            pending: false,
            anonymous_allowed: false,
            per_identity: !identities.is_empty(),
            anonymous: Arc::new(Identity {
                id: "anonymous".into(),
                scopes: vec!["*".into()],
            }),
        }
    }

    /// The policy's `auth.allow_anonymous` and `auth.anonymous_scopes`: what a caller
    /// who presents no credential may do (`*` unless scopes are given). In local mode the
    /// scopes narrow the anonymous caller; with tokens, `allow` admits it at all.
    pub fn with_anonymous(mut self, allow: bool, scopes: Option<Vec<String>>) -> Auth {
        self.anonymous_allowed = allow;
        if let Some(scopes) = scopes {
            self.anonymous = Arc::new(Identity {
                id: "anonymous".into(),
                scopes,
            });
        }
        self
    }

    /// Closes the server until its token arrives, when it has none yet (a warm pod
    /// whose `ABX_TOKEN_FILE` is still missing or empty): a caller without a token must
    /// not find it in local mode.
    pub fn expecting_token(mut self) -> Auth {
        self.pending = self.holders.is_empty();
        self
    }

    /// `"token"` when a token is configured, `"pending"` while one is awaited,
    /// `"local"` otherwise.
    pub fn mode(&self) -> &'static str {
        if !self.holders.is_empty() {
            "token"
        } else if self.pending {
            "pending"
        } else {
            "local"
        }
    }

    /// Whether a policy's identities are in use (then no token is handed out in URLs).
    pub fn per_identity(&self) -> bool {
        self.per_identity
    }

    /// The identity `id` as these holders have it now: a token holder's, or the
    /// anonymous caller's where one is admitted (local mode, `allow_anonymous`).
    /// `None` while a token is awaited.
    pub fn named(&self, id: &str) -> Option<Arc<Identity>> {
        if self.pending {
            return None;
        }
        if let Some(holder) = self.holders.iter().find(|h| h.identity.id == id) {
            return Some(holder.identity.clone());
        }
        let anonymous_admitted = self.holders.is_empty() || self.anonymous_allowed;
        (anonymous_admitted && self.anonymous.id == id).then(|| self.anonymous.clone())
    }

    /// The identity of a caller who presents no credential.
    pub fn anonymous(&self) -> Arc<Identity> {
        self.anonymous.clone()
    }

    /// Checks the credentials in `headers` (lower-case names) and, for the PTY socket,
    /// `query_token`. Any one presented credential that matches is enough, so a gateway's
    /// own `X-Access-Token` next to our `Authorization: Bearer` works.
    pub fn authenticate(
        &self,
        headers: &[(String, String)],
        query_token: Option<&str>,
        required: bool,
    ) -> Result<Arc<Identity>, ApiError> {
        if !required {
            return Ok(self.anonymous.clone());
        }
        if self.pending {
            return Err(ApiError::new(
                401,
                "AuthError",
                "unauthorized: the server has no token yet (ABX_TOKEN_FILE is missing or empty)",
            )
            .with_code("token_pending"));
        }
        if self.holders.is_empty() {
            return Ok(self.anonymous.clone());
        }
        let credentials = Credentials::presented(headers, query_token)?;
        if credentials.digests.is_empty() && self.anonymous_allowed {
            return Ok(self.anonymous.clone());
        }
        self.identify(&credentials, required)
    }

    /// The identity `credentials` stand for under these holders (a later policy's, for a
    /// connection that outlives a reload).
    pub fn identify(
        &self,
        credentials: &Credentials,
        required: bool,
    ) -> Result<Arc<Identity>, ApiError> {
        if self.pending && required {
            return Err(ApiError::unauthorized());
        }
        if self.holders.is_empty() || !required {
            return Ok(self.anonymous.clone());
        }
        let mut accepted: Option<&Arc<Identity>> = None;
        // Evaluate every candidate against every holder so the time taken does not
        // depend on which one matched.
        for digest in &credentials.digests {
            for holder in &self.holders {
                if self.matches(&holder.tag, digest) && accepted.is_none() {
                    accepted = Some(&holder.identity);
                }
            }
        }
        accepted.cloned().ok_or_else(ApiError::unauthorized)
    }

    /// The identity whose token signed an envd file URL: `signature` is `v1_` and the
    /// unpadded base64 of SHA-256(`<signed>:<token>`, then `:<expiration>` when it has
    /// one), where `signed` is `<path>:<read|write>:<user>` (e2b's `get_signature`). An
    /// expiration in the past is refused. Every holder's token is tried, so the time
    /// taken does not depend on which one matched.
    pub fn authenticate_signed(
        &self,
        signed: &str,
        expiration: Option<&str>,
        signature: &str,
    ) -> Result<Arc<Identity>, ApiError> {
        let refused = |why: &str| {
            ApiError::new(401, "AuthError", format!("unauthorized: {why}"))
                .with_code("unauthorized")
        };
        if self.pending {
            return Err(ApiError::unauthorized());
        }
        // Local mode: nothing to check a signature against, and nothing to protect.
        if self.holders.is_empty() {
            return Ok(self.anonymous.clone());
        }
        if let Some(expiration) = expiration {
            let at: u64 = expiration
                .parse()
                .map_err(|_| refused("signature_expiration is not a Unix time"))?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if at < now {
                return Err(refused("the signed URL has expired"));
            }
        }
        let mut accepted: Option<&Arc<Identity>> = None;
        for holder in &self.holders {
            let Some(token) = &holder.token else {
                continue;
            };
            let mut message = format!("{signed}:{token}");
            if let Some(expiration) = expiration {
                message.push(':');
                message.push_str(expiration);
            }
            let digest: [u8; 32] = Sha256::digest(message.as_bytes()).into();
            let expected = format!(
                "v1_{}",
                base64_simd::STANDARD_NO_PAD.encode_to_string(digest)
            );
            // Compared through the keyed tags, in constant time.
            let want = tag(&self.key, expected.as_bytes());
            if self.matches(&want, signature.as_bytes()) && accepted.is_none() {
                accepted = Some(&holder.identity);
            }
        }
        accepted
            .cloned()
            .ok_or_else(|| refused("the URL's signature does not match (signed for another path, operation or user, or with another token)"))
    }

    fn matches(&self, expected: &[u8], digest: &[u8]) -> bool {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("any key length");
        mac.update(digest);
        mac.verify_slice(expected).is_ok()
    }
}

fn tag(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn local_mode_is_anonymous_with_all_scopes() {
        let auth = Auth::new(None);
        let id = auth.authenticate(&[], None, true).unwrap();
        assert_eq!(id.id, "anonymous");
        assert_eq!(id.scopes, vec!["*"]);
        assert_eq!(Auth::new(Some("")).mode(), "local");
    }

    #[test]
    fn token_mode_matrix() {
        let auth = Auth::new(Some("s3cret"));
        assert!(auth.authenticate(&[], None, true).is_err());
        assert!(auth.authenticate(&[], None, false).is_ok());
        assert!(auth
            .authenticate(&h(&[("x-access-token", "s3cret")]), None, true)
            .is_ok());
        assert!(auth
            .authenticate(&h(&[("authorization", "Bearer s3cret")]), None, true)
            .is_ok());
        assert!(auth
            .authenticate(&h(&[("authorization", "bearer s3cret")]), None, true)
            .is_ok());
        assert!(auth
            .authenticate(&h(&[("x-access-token", "s3cre")]), None, true)
            .is_err());
        assert!(auth
            .authenticate(&h(&[("x-access-token", "s3cret2")]), None, true)
            .is_err());
        assert!(auth
            .authenticate(&h(&[("authorization", "Basic s3cret")]), None, true)
            .is_err());
        assert!(auth.authenticate(&[], Some("s3cret"), true).is_ok());
        let gateway_plus_bearer =
            h(&[("x-access-token", "gw"), ("authorization", "Bearer s3cret")]);
        assert!(auth.authenticate(&gateway_plus_bearer, None, true).is_ok());
        let err = auth
            .authenticate(
                &h(&[("x-access-token", "a"), ("x-access-token", "s3cret")]),
                None,
                true,
            )
            .unwrap_err();
        assert_eq!((err.status, err.code), (400, Some("ambiguous_credentials")));
        let two_bearers = h(&[
            ("authorization", "Bearer a"),
            ("authorization", "Bearer s3cret"),
        ]);
        assert_eq!(
            auth.authenticate(&two_bearers, None, true)
                .unwrap_err()
                .code,
            Some("ambiguous_credentials")
        );
        let same_twice = h(&[("x-access-token", "s3cret"), ("x-access-token", "s3cret")]);
        assert!(auth.authenticate(&same_twice, None, true).is_ok());
    }

    #[test]
    fn policy_identities_each_get_their_scopes() {
        let reader = TokenIdentity {
            token: None,
            id: "reader".into(),
            scopes: vec!["files:read".into()],
            digest: token_digest("r-token"),
        };
        let writer = TokenIdentity {
            token: None,
            id: "writer".into(),
            scopes: vec!["files:read".into(), "files:write".into()],
            digest: token_digest("w-token"),
        };
        let auth = Auth::with_identities(Some("root"), &[reader, writer]);
        assert!(auth.per_identity());
        let who = |headers: &[(&str, &str)]| {
            auth.authenticate(&h(headers), None, true)
                .map(|i| (i.id.clone(), i.scopes.clone()))
        };
        assert_eq!(who(&[("x-access-token", "r-token")]).unwrap().0, "reader");
        assert_eq!(
            who(&[("authorization", "Bearer w-token")]).unwrap().1,
            vec!["files:read", "files:write"]
        );
        assert_eq!(
            who(&[("x-access-token", "root")]).unwrap(),
            (SERVER_IDENTITY.into(), vec!["*".into()])
        );
        assert!(who(&[("x-access-token", "nobody")]).is_err());
        // Identities alone are token mode.
        let only = Auth::with_identities(
            None,
            &[TokenIdentity {
                token: None,
                id: "a".into(),
                scopes: vec![],
                digest: token_digest("a"),
            }],
        );
        assert_eq!(only.mode(), "token");
        assert!(only.authenticate(&[], None, true).is_err());
    }

    #[test]
    fn scopes() {
        let id = Identity {
            id: "x".into(),
            scopes: vec!["agents:use".into()],
        };
        assert!(id.has_scopes(&["agents:use".into()]));
        assert_eq!(id.missing_scope(&["files:write"]), Some("files:write"));
    }

    #[test]
    fn repeated_identical_credentials_are_one_credential() {
        let auth = Auth::new(Some("s3cret"));
        for name in ["x-access-token", "authorization"] {
            let value = if name == "authorization" {
                "Bearer s3cret"
            } else {
                "s3cret"
            };
            assert!(
                auth.authenticate(&h(&[(name, value), (name, value)]), None, true)
                    .is_ok(),
                "{name} twice"
            );
        }
    }

    #[test]
    fn only_the_bearer_scheme_carries_the_token() {
        let auth = Auth::new(Some("s3cret"));
        for value in [
            "Basic  s3cret",
            "Token: s3cret",
            "bearer\ts3cret",
            "Bearers3cret",
        ] {
            assert!(
                auth.authenticate(&h(&[("authorization", value)]), None, true)
                    .is_err(),
                "{value}"
            );
        }
        assert!(auth
            .authenticate(&h(&[("authorization", "bEaReR s3cret")]), None, true)
            .is_ok());
    }

    #[test]
    fn scopes_are_all_required_unless_wildcard() {
        let id = |scopes: &[&str]| Identity {
            id: "x".into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
        };
        let need = |scopes: &[&str]| scopes.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(id(&["a", "b"]).has_scopes(&need(&["a", "b"])));
        assert!(!id(&["a"]).has_scopes(&need(&["a", "b"])));
        assert!(!id(&[]).has_scopes(&need(&["a"])));
        assert!(id(&[]).has_scopes(&[]));
        assert!(id(&["*"]).has_scopes(&need(&["anything"])));
        assert_eq!(id(&["a"]).missing_scope(&need(&["a", "b"])), Some("b"));
        assert_eq!(id(&["*"]).missing_scope(&need(&["b"])), None);
    }

    #[test]
    fn namespace_wildcards_and_implicit_discovery() {
        let id = |scopes: &[&str]| Identity {
            id: "x".into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
        };
        assert!(id(&["files:*"]).can("files:read"));
        assert!(id(&["files:*"]).can("files:delete"));
        assert!(!id(&["files:*"]).can("process:run"));
        assert!(!id(&["files"]).can("files:read"));
        assert!(!id(&["file:*"]).can("files:read"));
        // Discovery is every identity's, as on the reference server.
        assert!(id(&[]).can("core:read"));
        assert!(!id(&[]).can("core:write"));
    }

    #[test]
    fn anonymous_may_be_admitted_beside_tokens() {
        let auth = Auth::new(Some("s3cret")).with_anonymous(true, Some(vec!["files:read".into()]));
        let who = auth.authenticate(&h(&[]), None, true).unwrap();
        assert_eq!(
            (who.id.as_str(), who.scopes.clone()),
            ("anonymous", vec!["files:read".to_string()])
        );
        // A wrong credential is not anonymous: it is refused.
        assert!(auth
            .authenticate(&h(&[("x-access-token", "nope")]), None, true)
            .is_err());
        assert_eq!(
            auth.authenticate(&h(&[("x-access-token", "s3cret")]), None, true)
                .unwrap()
                .id,
            "server"
        );
        let closed = Auth::new(Some("s3cret"));
        assert!(closed.authenticate(&h(&[]), None, true).is_err());
    }

    /// e2b's `get_signature`, written out: `v1_` + unpadded base64 of SHA-256.
    fn e2b_signature(signed: &str, token: &str, expiration: Option<u64>) -> String {
        let message = match expiration {
            Some(at) => format!("{signed}:{token}:{at}"),
            None => format!("{signed}:{token}"),
        };
        let digest: [u8; 32] = Sha256::digest(message.as_bytes()).into();
        format!(
            "v1_{}",
            base64_simd::STANDARD_NO_PAD.encode_to_string(digest)
        )
    }

    #[test]
    fn signed_urls_name_the_identity_whose_token_signed_them() {
        let auth = Auth::new(Some("tok"));
        let signed = "/w/a.txt:read:";
        let good = e2b_signature(signed, "tok", None);
        assert_eq!(
            auth.authenticate_signed(signed, None, &good).unwrap().id,
            SERVER_IDENTITY
        );
        assert!(auth
            .authenticate_signed("/w/b.txt:read:", None, &good)
            .is_err());
        assert!(auth
            .authenticate_signed(signed, None, &e2b_signature(signed, "other", None))
            .is_err());
        let past = e2b_signature(signed, "tok", Some(1));
        let refused = auth
            .authenticate_signed(signed, Some("1"), &past)
            .unwrap_err();
        assert!(refused.message.contains("expired"), "{}", refused.message);
        let later = 4_000_000_000u64;
        let fresh = e2b_signature(signed, "tok", Some(later));
        assert!(auth
            .authenticate_signed(signed, Some(&later.to_string()), &fresh)
            .is_ok());
        // An expiration is part of what is signed: another one does not pass.
        assert!(auth
            .authenticate_signed(signed, Some("4000000001"), &fresh)
            .is_err());
        assert_eq!(
            Auth::new(None)
                .authenticate_signed(signed, None, "v1_x")
                .unwrap()
                .id,
            "anonymous"
        );
    }
}
