//! Gateway API keys on the request path: key → member → department → workspace through a
//! `quick_cache` cache (unknown keys cached briefly too; known ones kept as the last good copy
//! while the store is unreachable), and a governor limiter that slows repeated failed
//! authentication from one address. The cached answer carries when the key expires and, for a
//! secret a rotation replaced, when its grace ends, so both are judged by the clock without a
//! database read.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::HeaderMap;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use quick_cache::sync::Cache;

use crate::error::ApiError;
use crate::kernel::caller::{Caller, InFlightCaps, ModelAccess, decode_cap, decode_model_list};
use crate::kernel::crypto;
use crate::store::{KeyStore, Store, StoreError};

/// How long a cached answer is trusted before the store is asked again (configuration changes
/// make every answer stale sooner). While the store is unreachable, a stale answer keeps serving.
const FRESH_MS: i64 = 300_000;
/// How long an unknown key is remembered at all: short, so a key created elsewhere works at once.
const UNKNOWN_MS: i64 = 1_000;
/// Keys held at most. A key first seen takes the place of one seen once and not since, before
/// that of one in steady use (S3-FIFO), so a flood of unknown keys does not evict the known.
const CACHED_KEYS: usize = 100_000;

/// A cached answer of the store: the caller (none for an unknown key) and until when the
/// presented secret is good, and when and under which configuration it was read.
#[derive(Clone)]
struct Answer {
    caller: Option<(Arc<Caller>, Validity)>,
    read_at_ms: i64,
    epoch: u64,
}

/// Until when a presented secret works (Unix ms; none: no end).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Validity {
    /// The key's `expires_at`: from then on, 401 `api_key_expired`.
    key_expires_at: Option<i64>,
    /// For a secret a rotation replaced, the end of its grace: from then on it is an unknown key
    /// (401 `invalid_api_key`), as a retired secret is not kept and its holder learns nothing.
    secret_retires_at: Option<i64>,
}

/// Why a known key's secret does not work at an instant.
#[derive(Debug, PartialEq, Eq)]
enum Lapsed {
    /// The secret was replaced by a rotation and its grace is over.
    Retired,
    /// The key expired at this instant (Unix ms).
    Expired(i64),
}

impl Validity {
    /// Whether the secret works at `now_ms` (a retired secret first: it no longer names the key).
    fn check(&self, now_ms: i64) -> Result<(), Lapsed> {
        if self.secret_retires_at.is_some_and(|t| now_ms >= t) {
            return Err(Lapsed::Retired);
        }
        match self.key_expires_at {
            Some(t) if now_ms >= t => Err(Lapsed::Expired(t)),
            _ => Ok(()),
        }
    }
}

/// A presented key's name in the cache: SipHash-2-4's 128 bits under a key drawn at start, a
/// pseudo-random function of the key no client can predict, so none can present a key whose
/// name is another's. The store's SHA-256 is worked out only to read it (a cache miss): on every
/// request it cost about 2,500 instructions, the tag under 400 (docs/performance.md).
type KeyTag = u128;

/// Resolves keys and throttles failed attempts.
pub struct KeyResolver {
    cache: Cache<KeyTag, Answer>,
    /// The key of [`KeyResolver::tag`], drawn at start.
    tag_key: (u64, u64),
    /// Bumped by every configuration change: answers read before it are stale.
    epoch: AtomicU64,
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
            cache: Cache::new(CACHED_KEYS),
            tag_key: rand::random(),
            epoch: AtomicU64::new(0),
            failures: RateLimiter::keyed(quota),
        }
    }

    /// Makes every cached answer stale (after a configuration change): the next request of each
    /// key asks the store, unless it is unreachable.
    pub fn invalidate_all(&self) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
        self.failures.retain_recent();
    }

    /// The caller presenting `headers` at `now_ms`, or the refusal.
    pub async fn authenticate(
        &self,
        store: &Store,
        headers: &HeaderMap,
        ip: IpAddr,
        now_ms: i64,
    ) -> Result<Arc<Caller>, ApiError> {
        let caller = match presented_key(headers) {
            Some(key) if crypto::is_api_key_shape(key) => self.lookup(store, key, now_ms).await?,
            _ => None,
        };
        let Some((caller, validity)) = caller else {
            return Err(self.refuse(ip));
        };
        match validity.check(now_ms) {
            Ok(()) => Ok(caller),
            Err(Lapsed::Retired) => Err(self.refuse(ip)),
            // Not throttled as a guess: the key is real, and the client must read why.
            Err(Lapsed::Expired(at)) => Err(ApiError::KeyExpired {
                expired_at: chrono::DateTime::from_timestamp_millis(at)
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default(),
            }),
        }
    }

    /// The cached answer while fresh; else the store's (stale-if-error: the cached one while the
    /// store is unreachable, however long that lasts; 503 `store_unavailable` for a key with no
    /// answer at all).
    async fn lookup(
        &self,
        store: &Store,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<(Arc<Caller>, Validity)>, ApiError> {
        let tag = self.tag(key);
        let epoch = self.epoch.load(Ordering::Relaxed);
        // An age outside [0, limit) is stale: a clock stepped back re-reads rather than trusts.
        let age = |a: &Answer| now_ms.saturating_sub(a.read_at_ms);
        // An unknown key is forgotten after a second: a key created since must work.
        let forgotten = |a: &Answer| a.caller.is_none() && !(0..UNKNOWN_MS).contains(&age(a));
        let cached = match self.cache.get(&tag) {
            Some(a) if forgotten(&a) => {
                self.cache.remove_if(&tag, forgotten);
                None
            }
            other => other,
        };
        if let Some(a) = &cached
            && a.epoch == epoch
            && (0..FRESH_MS).contains(&age(a))
        {
            return Ok(a.caller.clone());
        }
        let Some(stale) = cached else {
            // First sight: the requests of one key arriving together share one read (the
            // others wait for it; should it fail, the next of them reads).
            let read = self
                .cache
                .get_or_insert_async(&tag, async {
                    read(store, key).await.map(|caller| Answer {
                        caller,
                        read_at_ms: now_ms,
                        epoch,
                    })
                })
                .await;
            return match read {
                Ok(answer) => Ok(answer.caller),
                Err(e) => {
                    store.note_failure(&e);
                    Err(ApiError::from(&e))
                }
            };
        };
        match read(store, key).await {
            Ok(caller) => {
                let answer = Answer {
                    caller: caller.clone(),
                    read_at_ms: now_ms,
                    epoch,
                };
                self.cache.insert(tag, answer);
                Ok(caller)
            }
            // Stale-if-error: the last good answer while the store is out of reach.
            Err(e) if store.note_failure(&e) => Ok(stale.caller),
            Err(e) => Err(ApiError::from(&e)),
        }
    }

    /// The cache's name of `key` ([`KeyTag`]).
    fn tag(&self, key: &str) -> KeyTag {
        use siphasher::sip128::Hasher128;
        use std::hash::Hasher;
        let mut h = siphasher::sip128::SipHasher24::new_with_keys(self.tag_key.0, self.tag_key.1);
        h.write(key.as_bytes());
        h.finish128().into()
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

/// The caller of `key` and until when that secret works, from the store (none: unknown, or its
/// member disabled).
async fn read(store: &Store, key: &str) -> Result<Option<(Arc<Caller>, Validity)>, StoreError> {
    store.fail_fast()?;
    let hash = crypto::hash_api_key(key);
    let found = store
        .at_home(|s| async move { s.identity_by_hash(&hash).await })
        .await?;
    let Some(k) = found.filter(|k| k.member_active == 1) else {
        return Ok(None);
    };
    let list = |stored: &Option<String>| decode_model_list(stored.as_deref()).map_err(StoreError::Corrupt);
    let validity = Validity {
        key_expires_at: k.expires_at,
        // A replaced secret without a grace end never works (a row written by hand).
        secret_retires_at: (k.via_previous != 0).then_some(k.previous_expires_at.unwrap_or(i64::MIN)),
    };
    let caller = Arc::new(Caller {
        models: ModelAccess {
            key: list(&k.allowed_models)?,
            member: list(&k.member_allowed_models)?,
        },
        in_flight: InFlightCaps {
            key: decode_cap(k.max_in_flight),
            member: decode_cap(k.member_max_in_flight),
        },
        allowed_tags: list(&k.allowed_tags)?,
        key_id: k.key_id,
        member_id: k.member_id,
        department_id: k.department_id,
        workspace_id: k.workspace_id,
    });
    Ok(Some((caller, validity)))
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

/// The most entries a model allow-list may have.
pub const MAX_ALLOWED_MODELS: usize = 100;

/// A model allow-list (of a key or a member): 1 to 100 entries, each a model [`name`](crate::validate::name) or a
/// prefix followed by one trailing `*` (`gpt-4o*`, `claude-*`; `*` alone allows every model),
/// none listed twice. An empty list is refused: it would allow nothing (`null` allows every
/// model).
pub fn allowed_models(field: &str, list: &[String]) -> Result<Vec<String>, String> {
    if list.is_empty() {
        return Err(format!(
            "{field} must list at least one model or pattern; null (or leaving it out) allows every model"
        ));
    }
    if list.len() > MAX_ALLOWED_MODELS {
        return Err(format!(
            "{field} may list at most {MAX_ALLOWED_MODELS} models or patterns"
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for entry in list {
        let v = crate::validate::name(field, entry)?;
        if v.trim_end_matches('*').contains('*') || v.ends_with("**") {
            return Err(format!(
                "{field}: {v:?} is not a model name or a pattern: a * may only end it (e.g. \"gpt-4o*\")"
            ));
        }
        if out.contains(&v) {
            return Err(format!("{field}: {v:?} is listed twice"));
        }
        out.push(v);
    }
    Ok(out)
}

/// A key's or member's cap on requests in flight: 1 to a million, or none.
pub fn max_in_flight(field: &str, value: Option<i64>) -> Result<Option<i64>, String> {
    if value.is_some_and(|v| !(1..=1_000_000).contains(&v)) {
        return Err(format!(
            "{field} must be between 1 and 1000000, or null for no cap"
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key's name in the cache is stable within a resolver, tells keys apart (one character
    /// changed, a prefix, the empty key), and depends on the resolver's own key: another
    /// resolver names the same key otherwise.
    #[test]
    fn a_key_is_named_in_the_cache_by_a_keyed_tag() {
        let (a, b) = (KeyResolver::new(), KeyResolver::new());
        let key = "sk-aigw-ProxyTestKey0123456789abcdefghij";
        assert_eq!(a.tag(key), a.tag(key));
        let others = [
            "sk-aigw-ProxyTestKey0123456789abcdefghiJ",
            "sk-aigw-ProxyTestKey0123456789abcdefghi",
            "",
        ];
        for other in others {
            assert_ne!(a.tag(key), a.tag(other), "{other:?}");
        }
        assert_ne!(a.tag(key), b.tag(key), "drawn per resolver");
        // The resolver's key is used: SipHash-2-4-128 of the same bytes under key (0, 0) differs.
        use siphasher::sip128::Hasher128;
        use std::hash::Hasher;
        let mut zero = siphasher::sip128::SipHasher24::new_with_keys(0, 0);
        zero.write(key.as_bytes());
        assert_ne!(a.tag(key), u128::from(zero.finish128()));
    }

    #[test]
    fn model_allow_lists() {
        let list = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        // (the list given, the list kept or the error's words)
        type Case<'a> = (&'a [&'a str], Result<&'a [&'a str], &'a str>);
        let cases: &[Case] = &[
            (&["gpt-4o-mini", "claude-*"], Ok(&["gpt-4o-mini", "claude-*"])),
            (&[" gpt-4o* "], Ok(&["gpt-4o*"])),
            (&["*"], Ok(&["*"])),
            (&[], Err("at least one")),
            (&["gpt-*-mini"], Err("a * may only end it")),
            (&["gpt**"], Err("a * may only end it")),
            (&["a", "a"], Err("listed twice")),
            (&[""], Err("1 to 100 characters")),
        ];
        for (input, want) in cases {
            match (allowed_models("allowed_models", &list(input)), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, list(w), "{input:?}"),
                (Err(got), Err(w)) => assert!(got.contains(w), "{input:?}: {got}"),
                (got, w) => panic!("{input:?}: got {got:?}, want {w:?}"),
            }
        }
        assert!(allowed_models("m", &vec!["x".to_owned(); 101]).is_err());
        assert_eq!(max_in_flight("max_in_flight", Some(1)), Ok(Some(1)));
        assert_eq!(max_in_flight("max_in_flight", None), Ok(None));
        assert!(max_in_flight("max_in_flight", Some(0)).is_err());
    }

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

    #[test]
    fn validity_at_an_instant() {
        let v = |key_expires_at, secret_retires_at| Validity {
            key_expires_at,
            secret_retires_at,
        };
        let rows: &[(Validity, i64, Result<(), Lapsed>)] = &[
            (v(None, None), i64::MAX, Ok(())),
            (v(Some(100), None), 99, Ok(())),
            (v(Some(100), None), 100, Err(Lapsed::Expired(100))),
            (v(None, Some(50)), 49, Ok(())),
            (v(None, Some(50)), 50, Err(Lapsed::Retired)),
            (v(Some(100), Some(50)), 60, Err(Lapsed::Retired)),
            (v(Some(40), Some(50)), 45, Err(Lapsed::Expired(40))),
        ];
        for (validity, now, want) in rows {
            assert_eq!(validity.check(*now), *want, "{validity:?} at {now}");
        }
    }
}
