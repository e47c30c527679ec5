//! Secrets at rest: what the agents store keeps that must never be read back in clear
//! (vault credentials' tokens, environment templates' `env` and `setup_commands`) is
//! sealed with XChaCha20-Poly1305 before it becomes part of a record, so the store
//! (memory now, `agents.redb` on disk) holds only ciphertext.
//!
//! The key (32 bytes) comes from `ABX_AGENTS_VAULT_KEY` (64 hex digits, or 32 bytes in
//! standard base64), which the server moves into its memory and scrubs from its
//! environment at startup (`crate::process::secrets`), else from `<state_dir>/vault.key`
//! (mode 0600, made from the kernel's random source on first use, in the state
//! directory of mode 0700). `docs/agents.md` ("Secrets") states what each protects
//! against: a key file beside the database only protects a copy of the database taken
//! without the state directory (a backup, a volume snapshot of the store alone); the
//! environment key also protects against someone who reads the whole state directory.
//!
//! Each sealed value is bound to the record and field it belongs to (the AEAD's
//! associated data), so a sealed token copied into another credential does not open,
//! and carries the id of the key that sealed it, so a changed key is reported as such.
//! A sealed value is text: `v1.<key id>.<base64 of nonce and ciphertext>`.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};

/// The setting that carries the key.
pub const KEY_VAR: &str = "ABX_AGENTS_VAULT_KEY";

/// The key file's name in the state directory.
pub const KEY_FILE: &str = "vault.key";

/// The sealing key and its id.
struct Key {
    cipher: XChaCha20Poly1305,
    /// The first 8 hex digits of the key's SHA-256 (under a label), stored with every
    /// sealed value: not the key, and enough to tell two keys apart.
    id: String,
}

/// Where the key comes from, set once when the agents group is built.
static STATE_DIR: OnceLock<PathBuf> = OnceLock::new();
/// The key once loaded. A failure is not kept: the next use tries again (a state
/// directory mounted late, a permission fixed), so a transient error does not last until
/// a restart.
static KEY: OnceLock<Key> = OnceLock::new();

/// Names the state directory the key file lives in. The key itself is read on first
/// use, so a server that never seals anything creates no key file.
pub fn configure(state_dir: &Path) {
    let _ = STATE_DIR.set(state_dir.to_path_buf());
}

/// Parses the setting's value: 64 hex digits, or standard base64 of 32 bytes.
pub fn parse_key(text: &str) -> Result<[u8; 32], String> {
    let text = text.trim();
    let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        (0..32)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap_or(0))
            .collect::<Vec<u8>>()
    } else {
        base64_simd::STANDARD
            .decode_to_vec(text)
            .map_err(|_| format!("{KEY_VAR} must be 64 hex digits or 32 bytes in base64"))?
    };
    bytes
        .try_into()
        .map_err(|_| format!("{KEY_VAR} must be 64 hex digits or 32 bytes in base64"))
}

fn key_id(key: &[u8; 32]) -> String {
    let digest = Sha256::new()
        .chain_update(b"agent-sandbox vault key id\0")
        .chain_update(key)
        .finalize();
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

fn make_key(bytes: [u8; 32]) -> Key {
    let id = key_id(&bytes);
    let cipher = XChaCha20Poly1305::new(&bytes.into());
    Key { cipher, id }
}

/// The key file's 32 bytes, created (exclusively, mode 0600) when missing.
fn key_file(dir: &Path) -> Result<[u8; 32], String> {
    let path = dir.join(KEY_FILE);
    let shown = path.display();
    match std::fs::read(&path) {
        Ok(bytes) => {
            return bytes.try_into().map_err(|_| {
                format!("{shown} does not hold a 32-byte key; remove it only if no vault credential needs it")
            })
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("cannot read {shown}: {e}"))
        }
        Err(_) => {}
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut key = [0u8; 32];
    rustix::rand::getrandom(&mut key, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| format!("no random bytes for a vault key: {e}"))?;
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path);
    match created {
        Ok(mut file) => {
            file.write_all(&key)
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("cannot write {shown}: {e}"))?;
            Ok(key)
        }
        // Another thread made it first: use that one.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => key_file(dir),
        Err(e) => Err(format!("cannot create {shown}: {e}")),
    }
}

fn key() -> Result<&'static Key, String> {
    if let Some(key) = KEY.get() {
        return Ok(key);
    }
    let loaded = if let Some(text) = crate::process::secrets::get(KEY_VAR) {
        parse_key(&text).map(make_key)?
    } else {
        match STATE_DIR.get() {
            Some(dir) => key_file(dir).map(make_key)?,
            // Unit tests: a key of this process alone.
            None => {
                let mut key = [0u8; 32];
                let _ = rustix::rand::getrandom(&mut key, rustix::rand::GetRandomFlags::empty());
                make_key(key)
            }
        }
    };
    // Two first uses at once load the same key (the file's creation is exclusive); the
    // first one kept wins either way.
    Ok(KEY.get_or_init(|| loaded))
}

/// Why a sealed value could not be made or opened. The message never holds the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealError(pub String);

/// Seals `plain` for the record field `binding` (e.g. `credential:<id>:auth`).
pub fn seal(binding: &str, plain: &[u8]) -> Result<String, SealError> {
    let key = key().map_err(SealError)?;
    let mut nonce = [0u8; 24];
    rustix::rand::getrandom(&mut nonce, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| SealError(format!("no random bytes for a nonce: {e}")))?;
    let sealed = key
        .cipher
        .encrypt(
            &XNonce::from(nonce),
            Payload {
                msg: plain,
                aad: binding.as_bytes(),
            },
        )
        .map_err(|_| SealError("the secret could not be sealed".into()))?;
    let mut bytes = nonce.to_vec();
    bytes.extend_from_slice(&sealed);
    Ok(format!(
        "v1.{}.{}",
        key.id,
        base64_simd::STANDARD.encode_to_string(&bytes)
    ))
}

/// Opens a value [`seal`] made for the same `binding`.
pub fn open(binding: &str, sealed: &str) -> Result<Vec<u8>, SealError> {
    let key = key().map_err(SealError)?;
    let mut parts = sealed.splitn(3, '.');
    let (Some("v1"), Some(id), Some(data)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(SealError("a stored secret is not in a known format".into()));
    };
    if id != key.id {
        return Err(SealError(format!(
            "a stored secret was sealed with another key (id {id}; this server's is {}); restore that {KEY_VAR} or {KEY_FILE}",
            key.id
        )));
    }
    let bytes = base64_simd::STANDARD
        .decode_to_vec(data)
        .map_err(|_| SealError("a stored secret is damaged".into()))?;
    if bytes.len() < 24 {
        return Err(SealError("a stored secret is damaged".into()));
    }
    let (nonce, body) = bytes.split_at(24);
    let nonce: [u8; 24] = nonce.try_into().unwrap_or([0; 24]);
    key.cipher
        .decrypt(
            &XNonce::from(nonce),
            Payload {
                msg: body,
                aad: binding.as_bytes(),
            },
        )
        .map_err(|_| {
            SealError(
                "a stored secret does not open (damaged, or moved from another record)".into(),
            )
        })
}

/// [`seal`] of a JSON value.
pub fn seal_json(binding: &str, value: &serde_json::Value) -> Result<String, SealError> {
    seal(binding, value.to_string().as_bytes())
}

/// [`open`] of a JSON value.
pub fn open_json(binding: &str, sealed: &str) -> Result<serde_json::Value, SealError> {
    let bytes = open(binding, sealed)?;
    serde_json::from_slice(&bytes).map_err(|_| SealError("a stored secret is damaged".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_for_their_binding() {
        let sealed = seal("credential:a:auth", b"tok-123").unwrap();
        assert!(!sealed.contains("tok-123"));
        assert!(sealed.starts_with("v1."));
        assert_eq!(open("credential:a:auth", &sealed).unwrap(), b"tok-123");
        assert!(open("credential:b:auth", &sealed).is_err());
        let other = seal("credential:a:auth", b"tok-123").unwrap();
        assert_ne!(sealed, other, "a fresh nonce per seal");
        let mut damaged = sealed.clone();
        damaged.pop();
        damaged.push(if sealed.ends_with('A') { 'B' } else { 'A' });
        assert!(open("credential:a:auth", &damaged).is_err());
    }

    #[test]
    fn keys_parse_from_hex_or_base64() {
        let hex = "00".repeat(31) + "ff";
        assert_eq!(parse_key(&hex).unwrap()[31], 0xff);
        let b64 = base64_simd::STANDARD.encode_to_string([7u8; 32]);
        assert_eq!(parse_key(&b64).unwrap(), [7u8; 32]);
        assert!(parse_key("short").is_err());
        assert!(parse_key(&base64_simd::STANDARD.encode_to_string([7u8; 16])).is_err());
    }

    #[test]
    fn a_key_file_is_made_once_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("abx-seal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = key_file(&dir).unwrap();
        assert_eq!(key_file(&dir).unwrap(), first);
        let mode = std::fs::metadata(dir.join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
