//! Quota response headers: `x-aigw-quota-<metric>-limit|remaining|reset` for the tightest policy
//! of each metric, and the IETF `RateLimit-Policy` / `RateLimit` fields for the tightest overall.

use std::fmt::Write;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use chrono::{DateTime, Utc};

use super::Metric;
use super::engine::{QuotaDecision, Standing, display_value};

/// `x-aigw-quota-<metric>-limit|remaining|reset`, by metric: static, so a response costs no
/// header-name parsing.
static NAMES: [[HeaderName; 3]; 5] = {
    const fn n(s: &'static str) -> HeaderName {
        HeaderName::from_static(s)
    }
    [
        [
            n("x-aigw-quota-requests-limit"),
            n("x-aigw-quota-requests-remaining"),
            n("x-aigw-quota-requests-reset"),
        ],
        [
            n("x-aigw-quota-total_tokens-limit"),
            n("x-aigw-quota-total_tokens-remaining"),
            n("x-aigw-quota-total_tokens-reset"),
        ],
        [
            n("x-aigw-quota-prompt_tokens-limit"),
            n("x-aigw-quota-prompt_tokens-remaining"),
            n("x-aigw-quota-prompt_tokens-reset"),
        ],
        [
            n("x-aigw-quota-completion_tokens-limit"),
            n("x-aigw-quota-completion_tokens-remaining"),
            n("x-aigw-quota-completion_tokens-reset"),
        ],
        [
            n("x-aigw-quota-credits-limit"),
            n("x-aigw-quota-credits-remaining"),
            n("x-aigw-quota-credits-reset"),
        ],
    ]
};

fn names(m: Metric) -> &'static [HeaderName; 3] {
    &NAMES[match m {
        Metric::Requests => 0,
        Metric::TotalTokens => 1,
        Metric::PromptTokens => 2,
        Metric::CompletionTokens => 3,
        Metric::Credits => 4,
    }]
}

/// A metric's amount as a header value: a whole number, or decimal credits.
fn amount(m: Metric, v: i64) -> HeaderValue {
    if m == Metric::Credits {
        HeaderValue::from_str(&display_value(m, v).to_string()).unwrap_or(HeaderValue::from_static("0"))
    } else {
        HeaderValue::from(v)
    }
}

/// Adds the quota headers to a response's `h`, `extra` being what this response itself uses of
/// each metric (where the gateway knows it).
pub fn quota_headers(
    h: &mut HeaderMap,
    decision: &QuotaDecision,
    extra: impl Fn(Metric) -> i64,
    now: DateTime<Utc>,
) {
    let tightest = decision.tightest(extra);
    // Three per metric and the two RateLimit fields, in one growth of the map.
    h.reserve(tightest.len() * 3 + 2);
    for (s, remaining) in &tightest {
        let m = s.rule.metric;
        let [limit, rem, reset] = names(m);
        h.insert(limit.clone(), amount(m, s.rule.limit));
        h.insert(rem.clone(), amount(m, *remaining));
        if let Some(r) = s.reset_at {
            h.insert(reset.clone(), HeaderValue::from(r.timestamp()));
        }
    }
    // Tightest overall: the smallest share left, then the earliest reset.
    let overall = tightest.iter().min_by(|(a, ra), (b, rb)| {
        share(a, *ra)
            .total_cmp(&share(b, *rb))
            .then(reset_key(a).cmp(&reset_key(b)))
    });
    if let Some((s, remaining)) = overall {
        let unit = |v: i64| {
            if s.rule.metric == Metric::Credits {
                v / 1_000_000
            } else {
                v
            }
        };
        // Writing to a String cannot fail.
        let mut policy = String::with_capacity(64);
        let _ = write!(
            policy,
            "\"{}-{}-{}\"",
            s.rule.subject.as_str(),
            s.rule.metric.as_str(),
            s.rule.window
        );
        let mut current = policy.clone();
        let _ = write!(policy, ";q={}", unit(s.rule.limit));
        if let Some(w) = s.window_secs {
            let _ = write!(policy, ";w={w}");
        }
        let _ = write!(current, ";r={}", unit(*remaining));
        if let Some(r) = s.reset_at {
            let _ = write!(current, ";t={}", super::window::seconds_until_reset(&r, now));
        }
        if let Ok(v) = HeaderValue::from_str(&policy) {
            h.insert(HeaderName::from_static("ratelimit-policy"), v);
        }
        if let Ok(v) = HeaderValue::from_str(&current) {
            h.insert(HeaderName::from_static("ratelimit"), v);
        }
    }
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
