//! Quota response headers: `x-aigw-quota-<metric>-limit|remaining|reset` for the tightest policy
//! of each metric, and the IETF `RateLimit-Policy` / `RateLimit` fields for the tightest overall.
//! The metric is named as the client reads it ([`Metric::client_name`]): `tokens` for
//! `total_tokens` (seed 003), which also goes out under its long name for clients written
//! before.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use bytes::{BufMut, BytesMut};
use chrono::{DateTime, Utc};

use super::Metric;
use super::engine::{QuotaDecision, Standing};
use super::window::Window;

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

/// The header values of one response, each written into one shared buffer and handed out as a
/// slice of it: one allocation for all of them, not one per header, and no `fmt` machinery.
struct Values(BytesMut);

impl Values {
    /// The text written since the last value, as a header value; none if it is not one.
    fn take(&mut self) -> Option<HeaderValue> {
        HeaderValue::from_maybe_shared(self.0.split().freeze()).ok()
    }

    fn push(&mut self, s: &str) {
        self.0.extend_from_slice(s.as_bytes());
    }

    fn push_int(&mut self, v: impl itoa::Integer) {
        self.push(itoa::Buffer::new().format(v));
    }

    /// A metric's amount: a whole number, or decimal credits written as JSON writes them
    /// ([`super::engine::display_value`]).
    fn amount(&mut self, m: Metric, v: i64) -> HeaderValue {
        if m == Metric::Credits {
            let credits = crate::kernel::credits::micros_to_credits(v);
            if serde_json::to_writer((&mut self.0).writer(), &credits).is_err() {
                self.0.clear();
            }
        } else {
            self.push_int(v);
        }
        self.take().unwrap_or(HeaderValue::from_static("0"))
    }

    /// A window as its `Display` names it (`day`, `5minutes`).
    fn push_window(&mut self, w: Window) {
        match w {
            Window::Minute | Window::Minutes(1) => self.push("minute"),
            Window::Minutes(n) => {
                self.push_int(n);
                self.push("minutes");
            }
            Window::Day => self.push("day"),
            Window::Week => self.push("week"),
            Window::Month => self.push("month"),
            Window::Total => self.push("total"),
        }
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
    // Up to 24 bytes a figure, three a metric, and the two RateLimit fields.
    let mut text = Values(BytesMut::with_capacity(tightest.len() * 72 + 192));
    for (s, remaining) in &tightest {
        let m = s.rule.metric;
        let (limit, rem) = (text.amount(m, s.rule.limit), text.amount(m, *remaining));
        let reset = s.reset_at.and_then(|r| {
            text.push_int(r.timestamp());
            text.take()
        });
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
    if let Some((s, remaining)) = overall(&tightest) {
        let unit = |v: i64| whole(s.rule.metric, v);
        // `"<subject>-<metric>-<window>"`, the name both fields start with.
        let name = |text: &mut Values| {
            text.push("\"");
            text.push(s.rule.subject.as_str());
            text.push("-");
            text.push(s.rule.metric.client_name());
            text.push("-");
            text.push_window(s.rule.window);
            text.push("\"");
        };
        name(&mut text);
        text.push(";q=");
        text.push_int(unit(s.rule.limit));
        if let Some(w) = s.window_secs {
            text.push(";w=");
            text.push_int(w);
        }
        if let Some(v) = text.take() {
            h.insert(HeaderName::from_static("ratelimit-policy"), v);
        }
        name(&mut text);
        text.push(";r=");
        text.push_int(unit(*remaining));
        if let Some(r) = s.reset_at {
            text.push(";t=");
            text.push_int(super::window::seconds_until_reset(&r, now));
        }
        if let Some(v) = text.take() {
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

/// The tightest standing overall (the RateLimit fields'): the smallest share left, then the
/// earliest reset.
fn overall<'a>(tightest: &'a [(&'a Standing, i64)]) -> Option<&'a (&'a Standing, i64)> {
    tightest.iter().min_by(|(a, ra), (b, rb)| {
        share(a, *ra)
            .total_cmp(&share(b, *rb))
            .then(reset_key(a).cmp(&reset_key(b)))
    })
}

/// A metric's amount in the RateLimit fields' whole units (credits: whole credits).
fn whole(m: Metric, v: i64) -> i64 {
    if m == Metric::Credits { v / 1_000_000 } else { v }
}

fn reset_key(s: &Standing) -> i64 {
    s.reset_at.map_or(i64::MAX, |r| r.timestamp())
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;

    use chrono::TimeZone;

    use super::super::engine::{CounterKey, PolicyRule, display_value};
    use super::super::{Mode, SubjectKind};
    use super::*;

    fn standing(subject: SubjectKind, metric: Metric, window: Window, limit: i64, used: i64) -> Standing {
        let end = Utc.with_ymd_and_hms(2026, 12, 7, 0, 0, 0).unwrap();
        let bounded = window != Window::Total;
        Standing {
            rule: PolicyRule {
                id: 1,
                subject,
                target_id: 7,
                scope_department_id: 0,
                metric,
                window,
                limit,
                mode: Mode::Enforce,
            },
            key: CounterKey {
                subject,
                subject_id: 7,
                metric,
                window,
                start: 0,
            },
            used,
            reset_at: bounded.then(|| super::super::window::reset_at(end, "apikey:7", chrono_tz::UTC)),
            window_secs: bounded.then_some(300),
            window_end: bounded.then_some(end),
        }
    }

    /// The headers as `fmt` writes them: what the buffer of [`Values`] must reproduce.
    fn expected(decision: &QuotaDecision, extra: i64, now: DateTime<Utc>) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let tightest = decision.tightest(|_| extra);
        for (s, remaining) in &tightest {
            let m = s.rule.metric;
            let mut names = vec![m.client_name()];
            if m == Metric::TotalTokens {
                names.push("total_tokens");
            }
            for n in names {
                out.push((
                    format!("x-aigw-quota-{n}-limit"),
                    display_value(m, s.rule.limit).to_string(),
                ));
                out.push((
                    format!("x-aigw-quota-{n}-remaining"),
                    display_value(m, *remaining).to_string(),
                ));
                if let Some(r) = s.reset_at {
                    out.push((format!("x-aigw-quota-{n}-reset"), r.timestamp().to_string()));
                }
            }
        }
        if let Some((s, remaining)) = overall(&tightest) {
            let unit = |v: i64| whole(s.rule.metric, v);
            let mut policy = format!(
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
                let _ = write!(
                    current,
                    ";t={}",
                    super::super::window::seconds_until_reset(&r, now)
                );
            }
            out.push(("ratelimit-policy".to_owned(), policy));
            out.push(("ratelimit".to_owned(), current));
        }
        out.sort();
        out
    }

    #[test]
    fn headers_are_the_figures_fmt_writes() {
        let now = Utc.with_ymd_and_hms(2026, 12, 6, 23, 59, 30).unwrap();
        let cases: Vec<(Vec<Standing>, i64)> = vec![
            (
                vec![standing(
                    SubjectKind::Apikey,
                    Metric::Requests,
                    Window::Minute,
                    3,
                    1,
                )],
                1,
            ),
            (
                vec![
                    standing(
                        SubjectKind::Apikey,
                        Metric::TotalTokens,
                        Window::Day,
                        1_000_000_000_000,
                        12,
                    ),
                    standing(SubjectKind::Member, Metric::Requests, Window::Minutes(5), 100, 99),
                    standing(SubjectKind::Dept, Metric::Credits, Window::Month, 1_500_000, 1),
                    standing(SubjectKind::Ws, Metric::Requests, Window::Total, i64::MAX, 0),
                ],
                3,
            ),
            (
                vec![standing(SubjectKind::Tag, Metric::Credits, Window::Week, 7, 0)],
                0,
            ),
            (
                vec![standing(SubjectKind::Tag, Metric::Credits, Window::Week, 1, 0)],
                0,
            ),
            (
                vec![standing(
                    SubjectKind::EndUser,
                    Metric::Credits,
                    Window::Minutes(1),
                    123_456_789,
                    5,
                )],
                0,
            ),
            (
                vec![standing(
                    SubjectKind::Ws,
                    Metric::PromptTokens,
                    Window::Minutes(1440),
                    10,
                    40,
                )],
                0,
            ),
            (
                vec![standing(
                    SubjectKind::Member,
                    Metric::CompletionTokens,
                    Window::Total,
                    0,
                    0,
                )],
                0,
            ),
            (
                vec![standing(
                    SubjectKind::Member,
                    Metric::Credits,
                    Window::Total,
                    i64::MAX,
                    1,
                )],
                0,
            ),
        ];
        for (standings, extra) in cases {
            let decision = QuotaDecision {
                standings,
                workspace: 1,
            };
            let mut h = HeaderMap::new();
            quota_headers(&mut h, &decision, |_| extra, now);
            let mut got: Vec<(String, String)> = h
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned()))
                .collect();
            got.sort();
            assert_eq!(got, expected(&decision, extra, now), "{:?}", decision.standings);
        }
    }

    #[test]
    fn windows_are_named_as_display_names_them() {
        for w in [
            Window::Minute,
            Window::Minutes(1),
            Window::Minutes(5),
            Window::Minutes(1440),
            Window::Day,
            Window::Week,
            Window::Month,
            Window::Total,
        ] {
            let mut text = Values(BytesMut::new());
            text.push_window(w);
            assert_eq!(text.0, w.to_string().as_bytes(), "{w:?}");
        }
    }
}
