//! Quota response headers: `x-aigw-quota-<metric>-limit|remaining|reset` for the tightest policy
//! of each metric, and the IETF `RateLimit-Policy` / `RateLimit` fields for the tightest overall.
//! The metric is named as the client reads it ([`Metric::client_name`]): `tokens` for
//! `total_tokens` (seed 003), which also goes out under its long name for clients written
//! before.

use std::fmt::Write;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use chrono::{DateTime, Utc};

use super::Metric;
use super::engine::{QuotaDecision, Standing, display_value};

/// `x-aigw-quota-<metric>-limit|remaining|reset`, by metric ([`Metric::client_name`]): static,
/// so a response costs no header-name parsing.
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
            n("x-aigw-quota-tokens-limit"),
            n("x-aigw-quota-tokens-remaining"),
            n("x-aigw-quota-tokens-reset"),
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

/// The `total_tokens` metric's headers under its long name, the same values as `tokens`: what
/// clients written before seed 003's name read.
static LONG_TOKEN_NAMES: [HeaderName; 3] = [
    HeaderName::from_static("x-aigw-quota-total_tokens-limit"),
    HeaderName::from_static("x-aigw-quota-total_tokens-remaining"),
    HeaderName::from_static("x-aigw-quota-total_tokens-reset"),
];

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
    // Three per metric (six for tokens) and the two RateLimit fields, in one growth of the map.
    h.reserve(tightest.len() * 3 + 5);
    for (s, remaining) in &tightest {
        let m = s.rule.metric;
        let (limit, rem) = (amount(m, s.rule.limit), amount(m, *remaining));
        let reset = s.reset_at.map(|r| HeaderValue::from(r.timestamp()));
        if m == Metric::TotalTokens {
            let [l, r, t] = &LONG_TOKEN_NAMES;
            h.insert(l.clone(), limit.clone());
            h.insert(r.clone(), rem.clone());
            if let Some(v) = &reset {
                h.insert(t.clone(), v.clone());
            }
        }
        let [l, r, t] = names(m);
        h.insert(l.clone(), limit);
        h.insert(r.clone(), rem);
        if let Some(v) = reset {
            h.insert(t.clone(), v);
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
            s.rule.metric.client_name(),
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
