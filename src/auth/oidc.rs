//! OpenID Connect sign-in for the console, as a relying party: discovery, the authorization-code
//! flow with PKCE (S256), and the ID token's checks — its signature against the issuer's published
//! keys (fetched again when a token names a key not yet seen: key rotation), its issuer,
//! audience, expiry and nonce. What a signed-in identity may do is decided by the caller
//! (`admin::sso`), from the groups it carries.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::RwLock;

use crate::config::{Secret, Settings};

/// How long the provider's discovery document is kept, in ms.
const METADATA_TTL_MS: i64 = 3_600_000;
/// The shortest time between two fetches of the provider's keys, in ms: a token naming an
/// unknown key fetches them again (rotation), at most this often.
const KEYS_REFETCH_MS: i64 = 30_000;
/// How long a sign-in may take at the provider, in seconds.
pub const PENDING_TTL_SECS: i64 = 600;
/// Clock skew allowed on the ID token's times, in seconds.
const LEEWAY_SECS: i64 = 60;
/// Requests to the provider: discovery, keys, token.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read from the provider (discovery, keys, token): real ones are a few KiB;
/// a provider that sends more is refused before it fills the gateway's memory.
const MAX_PROVIDER_BODY: usize = 1024 * 1024;

/// The algorithms an ID token may be signed with: asymmetric only (never `none`, never HMAC with
/// the client secret).
const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Why a sign-in failed.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The provider could not be reached or answered something unusable.
    #[error("identity provider: {0}")]
    Provider(String),
    /// The ID token (or the callback) was refused.
    #[error("ID token refused: {0}")]
    Refused(String),
}

/// The identity provider's endpoints, from its discovery document.
#[derive(Clone, Debug, Deserialize)]
struct Metadata {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
    #[serde(default)]
    token_endpoint_auth_methods_supported: Vec<String>,
}

/// A sign-in under way, kept by the browser (sealed with the master key) between the redirect to
/// the provider and its return.
#[derive(Debug, Serialize, Deserialize)]
pub struct Pending {
    /// Returned by the provider as is: ties the callback to this browser.
    pub state: String,
    /// Must come back inside the ID token: ties the token to this sign-in.
    pub nonce: String,
    /// PKCE: proves to the token endpoint that the code is ours.
    pub verifier: String,
    /// Unix seconds after which the sign-in is abandoned.
    pub exp: i64,
}

/// Who signed in.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The provider's subject id.
    pub subject: String,
    /// Their email.
    pub email: String,
    /// Their groups (the groups claim).
    pub groups: Vec<String>,
}

/// The configured identity provider.
pub struct Oidc {
    /// The issuer exactly as configured: the discovery document and every ID token must name
    /// this one, a trailing `/` included or not (OpenID Connect Discovery §4.3, Core §3.1.3.7).
    issuer: String,
    client_id: String,
    client_secret: Option<Secret>,
    redirect_url: String,
    scopes: String,
    groups_claim: String,
    http: reqwest::Client,
    metadata: RwLock<Option<(Arc<Metadata>, i64)>>,
    keys: RwLock<Keys>,
}

#[derive(Default)]
struct Keys {
    set: Option<JwkSet>,
    fetched_ms: Option<i64>,
}

impl Oidc {
    /// The provider `settings` name, if single sign-on is on.
    pub fn from_settings(s: &Settings) -> Result<Option<Oidc>, String> {
        let (Some(issuer), Some(client_id), Some(redirect_url)) =
            (&s.oidc_issuer, &s.oidc_client_id, &s.oidc_redirect_url)
        else {
            return Ok(None);
        };
        let http = reqwest::Client::builder()
            .timeout(PROVIDER_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("oidc client: {e}"))?;
        let mut scopes: Vec<&str> = s.oidc_scopes.split_whitespace().collect();
        if !scopes.contains(&"openid") {
            scopes.insert(0, "openid");
        }
        Ok(Some(Oidc {
            issuer: issuer.trim().to_owned(),
            client_id: client_id.clone(),
            client_secret: s.oidc_client_secret.clone(),
            redirect_url: redirect_url.clone(),
            scopes: scopes.join(" "),
            groups_claim: s.oidc_groups_claim.clone(),
            http,
            metadata: RwLock::new(None),
            keys: RwLock::new(Keys::default()),
        }))
    }

    /// Where the console is, as browsers reach it: beside the redirect URI.
    pub fn console_url(&self) -> String {
        match self.redirect_url.strip_suffix("/admin/v1/auth/oidc/callback") {
            Some(base) => format!("{base}/console/"),
            None => "/console/".to_owned(),
        }
    }

    /// Whether the browser's cookie should be `Secure`.
    pub fn secure(&self) -> bool {
        self.redirect_url.starts_with("https://")
    }

    /// Starts a sign-in: the provider's authorization URL to send the browser to, and what to
    /// keep until it comes back.
    pub async fn begin(&self, now_ms: i64) -> Result<(String, Pending), OidcError> {
        let meta = self.metadata(now_ms).await?;
        let pending = Pending {
            state: random_token(),
            nonce: random_token(),
            verifier: URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>()),
            exp: now_ms / 1000 + PENDING_TTL_SECS,
        };
        let challenge = URL_SAFE_NO_PAD.encode(ring::digest::digest(
            &ring::digest::SHA256,
            pending.verifier.as_bytes(),
        ));
        let query = [
            ("response_type", "code"),
            ("client_id", &self.client_id),
            ("redirect_uri", &self.redirect_url),
            ("scope", &self.scopes),
            ("state", &pending.state),
            ("nonce", &pending.nonce),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
        ];
        let sep = if meta.authorization_endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        let url = format!("{}{sep}{}", meta.authorization_endpoint, form_encode(&query));
        Ok((url, pending))
    }

    /// Ends a sign-in: trades `code` for tokens and checks the ID token against `pending`.
    pub async fn finish(&self, pending: &Pending, code: &str, now_ms: i64) -> Result<Identity, OidcError> {
        let meta = self.metadata(now_ms).await?;
        let id_token = self.exchange(&meta, code, &pending.verifier).await?;
        self.verify(&id_token, &pending.nonce, now_ms).await
    }

    async fn metadata(&self, now_ms: i64) -> Result<Arc<Metadata>, OidcError> {
        if let Some((m, at)) = &*self.metadata.read().await
            && now_ms - at < METADATA_TTL_MS
        {
            return Ok(m.clone());
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.issuer.trim_end_matches('/')
        );
        let meta: Metadata = self.get_json(&url).await?;
        // OpenID Connect Discovery §4.3: the document's issuer is identical to the issuer
        // configured; `https://idp/` and `https://idp` are two issuers.
        if meta.issuer != self.issuer {
            return Err(OidcError::Provider(format!(
                "the discovery document names issuer {:?}, not the configured {:?} (set oidc_issuer to exactly the provider's issuer)",
                meta.issuer, self.issuer
            )));
        }
        let meta = Arc::new(meta);
        *self.metadata.write().await = Some((meta.clone(), now_ms));
        Ok(meta)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, OidcError> {
        let r = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| OidcError::Provider(format!("{url}: {e}")))?;
        if !r.status().is_success() {
            return Err(OidcError::Provider(format!("{url} answered {}", r.status())));
        }
        let body = capped_body(r)
            .await
            .map_err(|e| OidcError::Provider(format!("{url}: {e}")))?;
        serde_json::from_slice(&body)
            .map_err(|e| OidcError::Provider(format!("{url}: not the expected JSON ({e})")))
    }

    async fn exchange(&self, meta: &Metadata, code: &str, verifier: &str) -> Result<String, OidcError> {
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", self.redirect_url.as_str()),
            ("code_verifier", verifier),
            ("client_id", self.client_id.as_str()),
        ];
        let mut req = self.http.post(&meta.token_endpoint);
        if let Some(secret) = &self.client_secret {
            // RFC 6749 §2.3.1: HTTP Basic (the default) unless the provider lists only the form.
            let basic = meta.token_endpoint_auth_methods_supported.is_empty()
                || meta
                    .token_endpoint_auth_methods_supported
                    .iter()
                    .any(|m| m == "client_secret_basic");
            if basic {
                let user = form_encode_one(&self.client_id);
                let pass = form_encode_one(secret.expose());
                req = req.basic_auth(user, Some(pass));
            } else {
                form.push(("client_secret", secret.expose()));
            }
        }
        let r = req
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(form_encode(&form))
            .send()
            .await
            .map_err(|e| OidcError::Provider(format!("token endpoint: {e}")))?;
        let status = r.status();
        let body = capped_body(r)
            .await
            .map_err(|e| OidcError::Provider(format!("token endpoint: {e}")))?;
        let body: Value = serde_json::from_slice(&body).map_err(|e| {
            OidcError::Provider(format!("token endpoint answered {status} without JSON ({e})"))
        })?;
        if !status.is_success() {
            let error = body.get("error").and_then(Value::as_str).unwrap_or("unknown");
            return Err(OidcError::Provider(format!(
                "token endpoint refused the code: {status} {error}"
            )));
        }
        body.get("id_token")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| OidcError::Provider("the token endpoint answered no id_token".into()))
    }

    /// Checks an ID token: signed by one of the issuer's keys with an asymmetric algorithm, for
    /// this client, not expired at `now_ms`, carrying `nonce`; returns who it names.
    pub async fn verify(&self, token: &str, nonce: &str, now_ms: i64) -> Result<Identity, OidcError> {
        let refused = |why: String| OidcError::Refused(why);
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| refused(format!("unreadable header ({e})")))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(refused(format!("algorithm {:?} is not accepted", header.alg)));
        }
        let key = self.key(header.kid.as_deref(), header.alg, now_ms).await?;
        let mut v = Validation::new(header.alg);
        // Core §3.1.3.7: `iss` exactly matches the issuer, which discovery confirmed.
        v.set_issuer(&[&self.issuer]);
        v.set_audience(&[&self.client_id]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        // Times are checked against the gateway's clock below.
        v.validate_exp = false;
        v.validate_nbf = false;
        let claims = jsonwebtoken::decode::<Value>(token, &key, &v)
            .map_err(|e| refused(format!("{e}")))?
            .claims;
        let now = now_ms / 1000;
        let exp = claims.get("exp").and_then(Value::as_i64).unwrap_or(0);
        if exp + LEEWAY_SECS < now {
            return Err(refused("expired".into()));
        }
        if claims
            .get("iat")
            .and_then(Value::as_i64)
            .is_some_and(|iat| iat > now + LEEWAY_SECS)
        {
            return Err(refused("issued in the future".into()));
        }
        // Several audiences: the authorized party must be this client (OIDC Core §3.1.3.7).
        if claims.get("aud").is_some_and(Value::is_array)
            && claims.get("azp").and_then(Value::as_str) != Some(self.client_id.as_str())
        {
            return Err(refused("several audiences and azp is not this client".into()));
        }
        let token_nonce = claims.get("nonce").and_then(Value::as_str).unwrap_or_default();
        if !constant_time_eq(token_nonce.as_bytes(), nonce.as_bytes()) {
            return Err(refused("nonce does not match this sign-in".into()));
        }
        // Absent: the provider does not say (Entra ID); present, it must say true, as a boolean
        // or as the string some providers send (Cognito). `"false"` is not true.
        let verified = match claims.get("email_verified") {
            None | Some(Value::Bool(true)) => true,
            Some(Value::String(s)) => s == "true",
            Some(_) => false,
        };
        if !verified {
            return Err(refused("the email is not verified".into()));
        }
        let email = claims
            .get("email")
            .and_then(Value::as_str)
            .filter(|e| crate::validate::email(e).is_ok())
            .ok_or_else(|| refused("no email claim (ask for the email scope)".into()))?
            .to_owned();
        let groups = match claims.get(&self.groups_claim) {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
            Some(Value::String(s)) => vec![s.clone()],
            _ => Vec::new(),
        };
        Ok(Identity {
            subject: claims
                .get("sub")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            email,
            groups,
        })
    }

    /// The issuer's key `kid` (or its one key of a kind fitting `alg` when the token names none);
    /// the keys are fetched again when it is unknown, at most every [`KEYS_REFETCH_MS`].
    async fn key(&self, kid: Option<&str>, alg: Algorithm, now_ms: i64) -> Result<DecodingKey, OidcError> {
        if let Some(k) = find_key(self.keys.read().await.set.as_ref(), kid, alg)? {
            return Ok(k);
        }
        let mut keys = self.keys.write().await;
        // Another sign-in may have fetched them meanwhile.
        if let Some(k) = find_key(keys.set.as_ref(), kid, alg)? {
            return Ok(k);
        }
        if keys.fetched_ms.is_some_and(|at| now_ms - at < KEYS_REFETCH_MS) {
            return Err(OidcError::Refused(format!("signed with an unknown key {kid:?}")));
        }
        let meta = self.metadata(now_ms).await?;
        let set: JwkSet = self.get_json(&meta.jwks_uri).await?;
        keys.set = Some(set);
        keys.fetched_ms = Some(now_ms);
        find_key(keys.set.as_ref(), kid, alg)?
            .ok_or_else(|| OidcError::Refused(format!("signed with an unknown key {kid:?}")))
    }
}

fn find_key(
    set: Option<&JwkSet>,
    kid: Option<&str>,
    alg: Algorithm,
) -> Result<Option<DecodingKey>, OidcError> {
    let Some(set) = set else { return Ok(None) };
    let fits = |k: &&jsonwebtoken::jwk::Jwk| {
        // A key that says what it is for must be for signatures with this algorithm.
        let alg_ok = k
            .common
            .key_algorithm
            .is_none_or(|a| a.to_string() == format!("{alg:?}"));
        let use_ok = !matches!(
            k.common.public_key_use,
            Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
        );
        alg_ok && use_ok
    };
    let found = match kid {
        Some(kid) => set
            .keys
            .iter()
            .filter(fits)
            .find(|k| k.common.key_id.as_deref() == Some(kid)),
        None => {
            let mut fitting = set.keys.iter().filter(fits);
            match (fitting.next(), fitting.next()) {
                (Some(k), None) => Some(k),
                _ => None,
            }
        }
    };
    found
        .map(|k| DecodingKey::from_jwk(k).map_err(|e| OidcError::Refused(format!("unusable key: {e}"))))
        .transpose()
}

fn random_token() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 18]>())
}

/// Equal bytes, in a time that does not depend on where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `application/x-www-form-urlencoded` of one value.
fn form_encode_one(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn form_encode(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", form_encode_one(k), form_encode_one(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The body of a provider's answer, refused once it passes [`MAX_PROVIDER_BODY`].
async fn capped_body(mut r: reqwest::Response) -> Result<Vec<u8>, String> {
    if r.content_length().is_some_and(|n| n > MAX_PROVIDER_BODY as u64) {
        return Err(format!("answer larger than {MAX_PROVIDER_BODY} bytes"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > MAX_PROVIDER_BODY {
            return Err(format!("answer larger than {MAX_PROVIDER_BODY} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding() {
        assert_eq!(form_encode_one("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
        assert_eq!(form_encode(&[("x", "1"), ("y", "2 3")]), "x=1&y=2+3");
    }

    #[test]
    fn constant_time_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
