//! Gateway API keys on the request path: key → member → department → workspace through a moka
//! cache (unknown keys cached briefly too), and a governor limiter that slows repeated failed
//! authentication from one address.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use moka::Expiry;
use moka::future::Cache;

use crate::crypto;
use crate::error::ApiError;
use crate::store::{KeyStore, Store};

/// Who is calling: the key and everything above it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// Key id.
    pub key_id: i64,
    /// Key name.
    pub key_name: String,
    /// Owning member.
    pub member_id: i64,
    /// Member's department.
    pub department_id: Option<i64>,
    /// Workspace.
    pub workspace_id: i64,
}

/// How long a known key is cached (config changes invalidate the cache sooner).
const KNOWN_TTL: Duration = Duration::from_secs(300);
/// How long an unknown key is cached: short, so a key created elsewhere works at once.
const UNKNOWN_TTL: Duration = Duration::from_secs(1);

struct KeyExpiry;

impl Expiry<KeyDigest, Option<Arc<Caller>>> for KeyExpiry {
    fn expire_after_create(
        &self,
        _key: &KeyDigest,
        value: &Option<Arc<Caller>>,
        _now: Instant,
    ) -> Option<Duration> {
        Some(if value.is_some() { KNOWN_TTL } else { UNKNOWN_TTL })
    }
}

/// A key's SHA-256, the cache's key (hex-encoded only for the store lookup on a miss).
type KeyDigest = [u8; 32];

/// Resolves keys and throttles failed attempts.
pub struct KeyResolver {
    cache: Cache<KeyDigest, Option<Arc<Caller>>>,
    failures: DefaultKeyedRateLimiter<IpAddr>,
}

impl Default for KeyResolver {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyResolver {
    /// A resolver with an empty cache. Failed authentication: a burst of 20 per address, then
    /// one every 2 seconds.
    pub fn new() -> Self {
        let quota = Quota::with_period(Duration::from_secs(2))
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(20).unwrap_or(NonZeroU32::MIN));
        KeyResolver {
            cache: Cache::builder()
                .max_capacity(100_000)
                .expire_after(KeyExpiry)
                .build(),
            failures: RateLimiter::keyed(quota),
        }
    }

    /// Forgets every cached key (after a configuration change).
    pub fn invalidate_all(&self) {
        self.cache.invalidate_all();
        self.failures.retain_recent();
    }

    /// The caller presenting `headers`, or the refusal.
    pub async fn authenticate(
        &self,
        store: &Store,
        headers: &HeaderMap,
        ip: IpAddr,
    ) -> Result<Arc<Caller>, ApiError> {
        let caller = match presented_key(headers) {
            Some(key) if crypto::is_api_key_shape(key) => {
                self.lookup(store, crypto::api_key_digest(key)).await?
            }
            _ => None,
        };
        match caller {
            Some(c) => Ok(c),
            None => Err(self.refuse(ip)),
        }
    }

    async fn lookup(&self, store: &Store, digest: KeyDigest) -> Result<Option<Arc<Caller>>, ApiError> {
        let store = store.clone();
        self.cache
            .try_get_with(digest, async move {
                let found = store.identity_by_hash(&hex::encode(digest)).await?;
                Ok::<_, crate::store::StoreError>(found.filter(|k| k.member_active == 1).map(|k| {
                    Arc::new(Caller {
                        key_id: k.key_id,
                        key_name: k.key_name,
                        member_id: k.member_id,
                        department_id: k.department_id,
                        workspace_id: k.workspace_id,
                    })
                }))
            })
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "key lookup failed");
                ApiError::Internal
            })
    }

    fn refuse(&self, ip: IpAddr) -> ApiError {
        match self.failures.check_key(&ip) {
            Ok(()) => ApiError::InvalidApiKey,
            Err(not_until) => {
                let wait = not_until.wait_time_from(governor::clock::Clock::now(
                    &governor::clock::DefaultClock::default(),
                ));
                ApiError::AuthThrottled {
                    retry_after: wait.as_secs_f64().ceil().max(1.0) as u64,
                }
            }
        }
    }
}

/// The key from `Authorization: Bearer …` or `x-api-key`.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let v = v.trim();
        if v.len() > 7 && v[..7].eq_ignore_ascii_case("bearer ") {
            return Some(v[7..].trim());
        }
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_headers() {
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
        let cases: &[Case] = &[
            (&[("authorization", "Bearer sk-aigw-x")], Some("sk-aigw-x")),
            (&[("authorization", "bearer  sk-aigw-x ")], Some("sk-aigw-x")),
            (&[("x-api-key", "sk-aigw-y")], Some("sk-aigw-y")),
            (
                &[("authorization", "Basic abc"), ("x-api-key", "sk-aigw-y")],
                Some("sk-aigw-y"),
            ),
            (&[("authorization", "Bearer")], None),
            (&[], None),
        ];
        for (headers, want) in cases {
            let mut h = HeaderMap::new();
            for (k, v) in *headers {
                h.insert(*k, v.parse().unwrap());
            }
            assert_eq!(presented_key(&h), *want, "{headers:?}");
        }
    }
}
