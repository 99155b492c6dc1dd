//! Secrets at rest: upstream secrets sealed with AES-256-GCM under the master key (which never
//! enters the database), gateway API keys kept as SHA-256 hashes, passwords as argon2 hashes.

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use rand::{Rng, RngCore};
use ring::digest;

/// Prefix of every gateway API key.
pub const KEY_PREFIX: &str = "sk-aigw-";
/// Random base62 characters after the prefix.
pub const KEY_RANDOM_LEN: usize = 32;
/// Characters of a key kept for display (`sk-aigw-` plus four).
pub const KEY_DISPLAY_LEN: usize = KEY_PREFIX.len() + 4;

const BASE62: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// The master key that seals upstream secrets.
#[derive(Clone)]
pub struct MasterKey(Aes256Gcm);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(***)")
    }
}

/// A sealed secret could not be opened (wrong master key or damaged data).
#[derive(Debug, thiserror::Error)]
#[error("cannot decrypt a stored secret: wrong master key or damaged data")]
pub struct OpenError;

impl MasterKey {
    /// Parses 32 bytes given as base64 (44 characters) or hex (64 characters).
    pub fn parse(text: &str) -> Result<MasterKey, String> {
        let text = text.trim();
        let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            hex::decode(text).map_err(|e| e.to_string())?
        } else {
            B64.decode(text)
                .map_err(|_| "expected 32 bytes as base64 or hex".to_owned())?
        };
        if bytes.len() != 32 {
            return Err(format!("expected 32 bytes, got {}", bytes.len()));
        }
        Aes256Gcm::new_from_slice(&bytes)
            .map(MasterKey)
            .map_err(|_| "expected 32 bytes".to_owned())
    }

    /// A new random key, as base64 text.
    pub fn generate_text() -> String {
        let mut bytes = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut bytes);
        B64.encode(bytes)
    }

    /// Seals `plain` as base64(nonce ‖ ciphertext ‖ tag); a fresh nonce every time.
    pub fn seal(&self, plain: &str) -> String {
        let mut nonce = [0u8; 12];
        rand::thread_rng().fill_bytes(&mut nonce);
        // Encryption with a valid key and a 12-byte nonce cannot fail for inputs below 64 GiB.
        let ct = self
            .0
            .encrypt(Nonce::from_slice(&nonce), plain.as_bytes())
            .unwrap_or_default();
        let mut out = nonce.to_vec();
        out.extend_from_slice(&ct);
        B64.encode(out)
    }

    /// Opens what `seal` produced.
    pub fn open(&self, sealed: &str) -> Result<String, OpenError> {
        let raw = B64.decode(sealed).map_err(|_| OpenError)?;
        if raw.len() < 12 + 16 {
            return Err(OpenError);
        }
        let (nonce, ct) = raw.split_at(12);
        let plain = self
            .0
            .decrypt(Nonce::from_slice(nonce), ct)
            .map_err(|_| OpenError)?;
        String::from_utf8(plain).map_err(|_| OpenError)
    }
}

/// A new gateway API key: `sk-aigw-` + 32 random base62 characters.
pub fn generate_api_key() -> String {
    let mut rng = rand::thread_rng();
    let mut key = String::with_capacity(KEY_PREFIX.len() + KEY_RANDOM_LEN);
    key.push_str(KEY_PREFIX);
    for _ in 0..KEY_RANDOM_LEN {
        key.push(BASE62[rng.gen_range(0..BASE62.len())] as char);
    }
    key
}

/// Whether `key` has the shape of a gateway API key.
pub fn is_api_key_shape(key: &str) -> bool {
    key.strip_prefix(KEY_PREFIX)
        .is_some_and(|rest| rest.len() == KEY_RANDOM_LEN && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The SHA-256 of a key, hex: what the database stores instead of the key.
pub fn hash_api_key(key: &str) -> String {
    hex::encode(api_key_digest(key))
}

/// The SHA-256 of an API key, raw (`hash_api_key` is its hex form).
pub fn api_key_digest(key: &str) -> [u8; 32] {
    let d = digest::digest(&digest::SHA256, key.as_bytes());
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The part of a key shown in lists.
pub fn display_prefix(key: &str) -> String {
    key.chars().take(KEY_DISPLAY_LEN).collect()
}

/// Prefix of every admin service token: neither a JWT (`eyJ…`) nor a gateway key (`sk-aigw-`),
/// so the admin guard tells the two kinds of bearer apart by their first bytes, and a secret
/// scanner can name what it found.
pub const SERVICE_TOKEN_PREFIX: &str = "aigw_st_";
/// Random base62 characters after the prefix (about 256 bits).
pub const SERVICE_TOKEN_RANDOM_LEN: usize = 43;
/// Characters of a service token kept for display (the prefix plus four).
pub const SERVICE_TOKEN_DISPLAY_LEN: usize = SERVICE_TOKEN_PREFIX.len() + 4;

/// A new admin service token: `aigw_st_` + 43 random base62 characters.
pub fn generate_service_token() -> String {
    let mut rng = rand::thread_rng();
    let mut token = String::with_capacity(SERVICE_TOKEN_PREFIX.len() + SERVICE_TOKEN_RANDOM_LEN);
    token.push_str(SERVICE_TOKEN_PREFIX);
    for _ in 0..SERVICE_TOKEN_RANDOM_LEN {
        token.push(BASE62[rng.gen_range(0..BASE62.len())] as char);
    }
    token
}

/// Whether `token` has the shape of a service token (checked before the store is asked, so a
/// malformed bearer costs no query).
pub fn is_service_token_shape(token: &str) -> bool {
    token.strip_prefix(SERVICE_TOKEN_PREFIX).is_some_and(|rest| {
        rest.len() == SERVICE_TOKEN_RANDOM_LEN && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// The part of a service token shown in lists.
pub fn service_token_prefix(token: &str) -> String {
    token.chars().take(SERVICE_TOKEN_DISPLAY_LEN).collect()
}

/// A random password for invitations and the bootstrap owner (20 base62 characters).
pub fn generate_password() -> String {
    let mut rng = rand::thread_rng();
    (0..20)
        .map(|_| BASE62[rng.gen_range(0..BASE62.len())] as char)
        .collect()
}

/// An argon2id hash (PHC string) of `password`.
pub fn hash_password(password: &str) -> String {
    use argon2::password_hash::{PasswordHasher, SaltString};
    let salt = SaltString::generate(&mut rand::thread_rng());
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        // Hashing with default parameters and a generated salt does not fail.
        .unwrap_or_default()
}

/// Whether `password` matches the argon2 `hash`.
pub fn verify_password(password: &str, hash: &str) -> bool {
    use argon2::password_hash::{PasswordHash, PasswordVerifier};
    PasswordHash::new(hash).is_ok_and(|parsed| {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

/// Runs password work (argon2: tens of milliseconds of CPU per hash) on tokio's blocking pool, so
/// it holds up no runtime worker and none of the requests that worker serves. `None` if the work
/// panicked or the runtime is shutting down.
pub async fn on_blocking_pool<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(work).await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Password work leaves the runtime free: here it waits for a task of the same
    /// single-threaded runtime, which could never run if the work held the runtime's thread.
    #[tokio::test(flavor = "current_thread")]
    async fn password_work_leaves_the_runtime_free() {
        let (tx, rx) = std::sync::mpsc::channel();
        let work = on_blocking_pool(move || rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok());
        let other = tokio::spawn(async move { tx.send(()).is_ok() });
        assert_eq!(work.await, Some(true));
        assert!(other.await.unwrap());
    }

    #[test]
    fn seal_round_trips_and_never_repeats() {
        let key = MasterKey::parse(&MasterKey::generate_text()).unwrap();
        let a = key.seal("sk-upstream-secret");
        let b = key.seal("sk-upstream-secret");
        assert_ne!(a, b, "a fresh nonce every time");
        assert!(!a.contains("sk-upstream-secret"));
        assert_eq!(key.open(&a).unwrap(), "sk-upstream-secret");
        let other = MasterKey::parse(&MasterKey::generate_text()).unwrap();
        assert!(other.open(&a).is_err(), "another master key cannot open it");
        assert!(key.open("not base64!").is_err());
        assert!(key.open("AAAA").is_err());
    }

    #[test]
    fn master_key_forms() {
        assert!(MasterKey::parse(&"ab".repeat(32)).is_ok());
        assert!(MasterKey::parse(&MasterKey::generate_text()).is_ok());
        assert!(MasterKey::parse("short").is_err());
        assert!(MasterKey::parse(&"ab".repeat(16)).is_err());
    }

    #[test]
    fn service_tokens_have_their_own_shape() {
        let t = generate_service_token();
        assert!(is_service_token_shape(&t), "{t}");
        assert_eq!(t.len(), 51);
        assert!(!is_api_key_shape(&t), "a service token is no gateway key");
        assert!(!t.starts_with("eyJ"), "a service token is no JWT");
        assert_eq!(service_token_prefix(&t).len(), 12);
        assert_ne!(t, generate_service_token());
        for bad in [
            "",
            "aigw_st_",
            "aigw_st_short",
            &format!("{t}x"),
            &t.replace("aigw_st_", "aigw-st-"),
            &format!("{}!", &t[..50]),
        ] {
            assert!(!is_service_token_shape(bad), "{bad:?}");
        }
    }

    #[test]
    fn api_keys_have_the_documented_shape() {
        let k = generate_api_key();
        assert!(is_api_key_shape(&k), "{k}");
        assert_eq!(k.len(), 40);
        assert_eq!(display_prefix(&k).len(), 12);
        assert_eq!(hash_api_key(&k).len(), 64);
        assert!(!is_api_key_shape("sk-aigw-short"));
        assert!(!is_api_key_shape("sk-aigw-0123456789abcdefghijABCDEFGHIJ0!"));
        assert!(is_api_key_shape("sk-aigw-0123456789abcdefghijABCDEFGHIJ01"));
    }

    #[test]
    fn passwords_verify() {
        let h = hash_password("correct horse");
        assert!(h.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", &h));
        assert!(!verify_password("wrong", &h));
        assert!(!verify_password("x", "not a hash"));
    }
}
