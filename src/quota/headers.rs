//! Quota response headers: `x-aigw-quota-<metric>-limit|remaining|reset` for the tightest policy
//! of each metric, and the IETF `RateLimit-Policy` / `RateLimit` fields for the tightest overall.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use chrono::{DateTime, Utc};

use super::Metric;
use super::engine::{QuotaDecision, Standing, display_value};

/// The headers for a response, `extra` being what this response itself uses of each metric
/// (where the gateway knows it).
pub fn quota_headers(
    decision: &QuotaDecision,
    extra: impl Fn(Metric) -> i64,
    now: DateTime<Utc>,
) -> HeaderMap {
    let mut h = HeaderMap::new();
    let tightest = decision.tightest(extra);
    for (s, remaining) in &tightest {
        let m = s.rule.metric;
        let name =
            |suffix: &str| HeaderName::from_bytes(format!("x-aigw-quota-{}-{suffix}", m.as_str()).as_bytes());
        let mut put = |suffix: &str, value: String| {
            if let (Ok(n), Ok(v)) = (name(suffix), HeaderValue::from_str(&value)) {
                h.insert(n, v);
            }
        };
        put("limit", display_value(m, s.rule.limit).to_string());
        put("remaining", display_value(m, *remaining).to_string());
        if let Some(r) = s.reset_at {
            put("reset", r.timestamp().to_string());
        }
    }
    // Tightest overall: the smallest share left, then the earliest reset.
    let overall = tightest.iter().min_by(|(a, ra), (b, rb)| {
        share(a, *ra)
            .total_cmp(&share(b, *rb))
            .then(reset_key(a).cmp(&reset_key(b)))
    });
    if let Some((s, remaining)) = overall {
        let name = format!(
            "{}-{}-{}",
            s.rule.subject.as_str(),
            s.rule.metric.as_str(),
            s.rule.window
        );
        let unit = |v: i64| {
            if s.rule.metric == Metric::Credits {
                v / 1_000_000
            } else {
                v
            }
        };
        let mut policy = format!("\"{name}\";q={}", unit(s.rule.limit));
        if let Some(w) = s.window_secs {
            policy.push_str(&format!(";w={w}"));
        }
        let mut current = format!("\"{name}\";r={}", unit(*remaining));
        if let Some(r) = s.reset_at {
            current.push_str(&format!(";t={}", super::window::seconds_until_reset(&r, now)));
        }
        if let Ok(v) = HeaderValue::from_str(&policy) {
            h.insert(HeaderName::from_static("ratelimit-policy"), v);
        }
        if let Ok(v) = HeaderValue::from_str(&current) {
            h.insert(HeaderName::from_static("ratelimit"), v);
        }
    }
    h
}

fn share(s: &Standing, remaining: i64) -> f64 {
    if s.rule.limit <= 0 {
        0.0
    } else {
        remaining as f64 / s.rule.limit as f64
    }
}

fn reset_key(s: &Standing) -> i64 {
    s.reset_at.map_or(i64::MAX, |r| r.timestamp())
}
