//! What an answer after routing tells the client besides its body: which model and provider
//! answered after how many upstream requests (DESIGN.md §10, §11), and, on an upstream's error
//! passed on, how long to wait and whether the SDK may retry by itself (§6, §7; seed 002).

use std::sync::Arc;

use axum::http::{HeaderValue, header};
use chrono::{DateTime, Utc};

use crate::error::{MAX_SDK_WAIT_SECS, SHOULD_RETRY};
use crate::provider::Provider;
use crate::provider::adapter::Endpoint;
use crate::upstream::dispatch::Attempt;
use crate::upstream::pool::routes::ModelRoute;

/// What routed a request, told in its response headers (DESIGN.md §10, §11): the public model
/// and the provider of the last attempt, and the upstream requests sent.
pub(super) struct Routed {
    model: Option<String>,
    provider: Option<Provider>,
    attempts: usize,
}

impl Routed {
    /// After dispatch, success or failure: the requests sent upstream (the gateway's own
    /// "credential busy" sent none), and the model and provider of the last one. When none was
    /// sent (`upstream_quota_exhausted`), those of the first candidate the chain considered: the
    /// first model with a credential for the endpoint, and the provider of its first credential
    /// by priority (enabled ones first).
    pub(super) fn after_dispatch(
        attempts: &[Attempt],
        chain: &[Arc<ModelRoute>],
        endpoint: Endpoint,
    ) -> Routed {
        let sent = attempts.iter().filter(|a| a.sent).count();
        let (model, provider) = match attempts.iter().rev().find(|a| a.sent) {
            Some(a) => (Some(a.model.clone()), Some(a.provider)),
            None => chain
                .iter()
                .find_map(|m| {
                    let mut providers = m
                        .credentials
                        .iter()
                        .map(|c| c.provider)
                        .chain(m.disabled.iter().copied());
                    providers
                        .find(|p| endpoint.served_by(*p))
                        .map(|p| (Some(m.name.clone()), Some(p)))
                })
                .unwrap_or_default(),
        };
        Routed {
            model,
            provider,
            attempts: sent,
        }
    }

    /// Adds the routing headers to `h`.
    pub(super) fn insert(&self, h: &mut axum::http::HeaderMap) {
        if let Some(v) = self.model.as_deref().and_then(|m| HeaderValue::from_str(m).ok()) {
            h.insert(AIGW_MODEL, v);
        }
        if let Some(p) = self.provider {
            h.insert(AIGW_PROVIDER, HeaderValue::from_static(p.as_str()));
        }
        h.insert(AIGW_ATTEMPTS, HeaderValue::from(self.attempts));
    }
}

/// The public model that answered.
const AIGW_MODEL: header::HeaderName = header::HeaderName::from_static("x-aigw-model");
/// The provider of the credential that answered.
const AIGW_PROVIDER: header::HeaderName = header::HeaderName::from_static("x-aigw-provider");
/// Upstream attempts made for the request.
const AIGW_ATTEMPTS: header::HeaderName = header::HeaderName::from_static("x-aigw-attempts");

/// DESIGN.md §6, §7 (seed 002: one retry layer): the wait a passed-on upstream error tells the
/// client. The lock its classification wrote (`lock_until`) is the real wait when it is more
/// than a minute away and later than what the error names itself (`Retry-After`,
/// `retry-after-ms`): Anthropic's spend cap and OpenRouter's daily cap name none, and the SDKs
/// read no `x-ratelimit-reset*`, Gemini `retryDelay` or Codex `resets_at`. It then replaces
/// `Retry-After` (whole seconds, rounded up) and `retry-after-ms`. A wait over a minute is not
/// the SDK's to sit out (each retry counts toward the key's breaker, and the next request gets
/// `upstream_quota_exhausted` from that lock anyway): `x-should-retry: false`.
pub(super) fn tell_the_wait(
    h: &mut axum::http::HeaderMap,
    lock_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) {
    const MINUTE_MS: i64 = MAX_SDK_WAIT_SECS as i64 * 1000;
    let named_ms = upstream_wait_secs(h, now).map(|s| s.saturating_mul(1000));
    let lock_ms = lock_until
        .map(|t| (t - now).num_milliseconds())
        .filter(|ms| *ms > MINUTE_MS && named_ms.is_none_or(|n| ms > &n));
    if let Some(ms) = lock_ms {
        let secs = ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) > 0);
        h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        h.insert(RETRY_AFTER_MS, HeaderValue::from(ms));
    }
    if lock_ms.or(named_ms).is_some_and(|ms| ms > MINUTE_MS) {
        h.insert(SHOULD_RETRY, HeaderValue::from_static("false"));
    }
}

/// The wait in milliseconds, which the OpenAI SDK reads before `Retry-After`.
const RETRY_AFTER_MS: header::HeaderName = header::HeaderName::from_static("retry-after-ms");

/// The wait an upstream error asks for, in whole seconds from `now`: the longer of its
/// `Retry-After` (seconds or an HTTP-date) and `retry-after-ms`, which the SDKs read.
fn upstream_wait_secs(headers: &axum::http::HeaderMap, now: DateTime<Utc>) -> Option<i64> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let retry_after = text("retry-after")
        .and_then(|v| crate::upstream::pool::classify::parse_retry_after(v, now))
        .map(|at| (at - now).num_seconds());
    let retry_after_ms = text("retry-after-ms")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite())
        .map(|ms| (ms / 1000.0).ceil() as i64);
    retry_after.max(retry_after_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wait a passed-on upstream error names, which decides `x-should-retry: false`.
    #[test]
    fn upstream_waits() {
        let now = DateTime::parse_from_rfc3339("2026-12-01T10:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default();
        /// Name, headers, the wait in seconds.
        type Row = (&'static str, &'static [(&'static str, &'static str)], Option<i64>);
        let rows: &[Row] = &[
            ("seconds", &[("retry-after", "120")], Some(120)),
            ("a minute is the SDK's", &[("retry-after", "60")], Some(60)),
            (
                "an HTTP-date",
                &[("retry-after", "Tue, 01 Dec 2026 10:02:00 GMT")],
                Some(120),
            ),
            ("milliseconds", &[("retry-after-ms", "90000")], Some(90)),
            (
                "the longer of both",
                &[("retry-after", "30"), ("retry-after-ms", "90500")],
                Some(91),
            ),
            ("unreadable", &[("retry-after", "soon")], None),
            ("none", &[], None),
        ];
        for (name, headers, want) in rows {
            let mut map = axum::http::HeaderMap::new();
            for (k, v) in *headers {
                map.insert(*k, HeaderValue::from_static(v));
            }
            assert_eq!(upstream_wait_secs(&map, now), *want, "{name}");
        }
    }

    /// What a passed-on upstream error tells the client of its wait, from its own headers and
    /// the lock it wrote.
    #[test]
    fn passed_on_waits() {
        let now = DateTime::parse_from_rfc3339("2026-12-01T10:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default();
        /// Name, headers, the lock's end in ms from now, then `Retry-After`, `retry-after-ms`
        /// and `x-should-retry` as sent.
        type Row = (
            &'static str,
            &'static [(&'static str, &'static str)],
            Option<i64>,
            (Option<&'static str>, Option<&'static str>, Option<&'static str>),
        );
        let rows: &[Row] = &[
            ("no lock, no wait", &[], None, (None, None, None)),
            (
                "a lock named nowhere",
                &[],
                Some(7_200_000),
                (Some("7200"), Some("7200000"), Some("false")),
            ),
            (
                "rounded up to whole seconds",
                &[],
                Some(90_500),
                (Some("91"), Some("90500"), Some("false")),
            ),
            (
                "a lock of a minute is the SDK's",
                &[],
                Some(60_000),
                (None, None, None),
            ),
            (
                "a short Retry-After under a long lock",
                &[("retry-after", "30")],
                Some(3_600_000),
                (Some("3600"), Some("3600000"), Some("false")),
            ),
            (
                "the error's own longer wait stays",
                &[("retry-after", "7200")],
                Some(3_600_000),
                (Some("7200"), None, Some("false")),
            ),
            (
                "the same wait as the lock stays as sent",
                &[("retry-after", "120")],
                Some(120_000),
                (Some("120"), None, Some("false")),
            ),
            (
                "a named wait over a minute with a short lock",
                &[("retry-after-ms", "90000")],
                Some(30_000),
                (None, Some("90000"), Some("false")),
            ),
            (
                "a short wait and a short lock",
                &[("retry-after", "20")],
                Some(20_000),
                (Some("20"), None, None),
            ),
            ("a lock already past", &[], Some(-5_000), (None, None, None)),
        ];
        for (name, headers, lock_ms, want) in rows {
            let mut map = axum::http::HeaderMap::new();
            for (k, v) in *headers {
                map.insert(*k, HeaderValue::from_static(v));
            }
            let lock = lock_ms.map(|ms| now + chrono::TimeDelta::milliseconds(ms));
            tell_the_wait(&mut map, lock, now);
            let text = |h: &str| map.get(h).and_then(|v| v.to_str().ok());
            let got = (
                text("retry-after"),
                text("retry-after-ms"),
                text("x-should-retry"),
            );
            assert_eq!(got, *want, "{name}");
        }
    }
}
