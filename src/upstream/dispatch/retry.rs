//! groot ADR 0008's one retry: "a run with one route gets one retry of its own on a 5xx or a
//! network failure, after 1 to 3 s with jitter, if nothing was emitted and the account is not
//! resting". Routes are counted as they can serve now, and the 5xx's own hold (kRouter rule 5:
//! 30 s on that model) is parked before the pause, for every other request.

use std::time::Duration;

use axum::http::Request;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use rand::Rng;

use super::park::{Written, persist, write};
use super::{Run, Upstreams, request};
use crate::provider::Credential;
use crate::provider::adapter::Fields;
use crate::upstream::pool::classify::{Classification, NextStep, Rule};
use crate::upstream::pool::routes::ModelRoute;

/// The rule an attempt names in the log when it was retried (groot ADR 0008: one retry).
pub const SINGLE_CANDIDATE_RETRY: &str = "single_candidate_retry";

/// The hold a failure that is retried parks at once (in this gateway's memory): every other
/// request skips the failing route while the retry waits. The retry is the request's own next
/// try and goes ahead of it: the one exception to "a locked credential gets no traffic until its
/// lock ends" (DESIGN.md §9), made for the request whose own failure wrote the lock. A retry that serves shows the route serves, and lifts the hold (as
/// a success resets the backoff); otherwise the hold is persisted like any other, so that every
/// gateway honours it (a second failure parks anew from its own time).
pub(super) struct Held {
    /// The locks parked in memory.
    written: Written,
    /// The rule that parked them and the provider's words, recorded when they are persisted.
    said: Option<(&'static str, Option<String>)>,
}

impl Held {
    pub(super) fn new() -> Self {
        Held {
            written: Vec::new(),
            said: None,
        }
    }

    /// Parks what `class` names on `cred` for the retry's wait; returns the lock's end.
    pub(super) fn park(
        &mut self,
        up: Upstreams<'_>,
        cred: &Credential,
        upstream_model: &str,
        class: &Classification,
        said: Option<String>,
    ) -> Option<DateTime<Utc>> {
        // A plain server error rests this route alone: no quota group is consulted.
        let (until, rows) = write(up, None, 0, cred, upstream_model, class, said.as_deref());
        self.written.extend(rows);
        self.said = Some((class.rule.name(), said));
        until
    }

    /// The attempt is over: lift the hold if it `served`, else persist it.
    pub(super) fn settle(self, up: Upstreams<'_>, served: bool) {
        if self.written.is_empty() {
            return;
        }
        if served {
            up.locks.lift(&self.written);
        } else {
            let (rule, said) = self.said.unwrap_or_default();
            persist(up, self.written, None, rule, said.as_deref());
        }
    }
}

impl Run<'_> {
    /// groot ADR 0008: whether `model` on `cred`, which just failed, is the run's one route:
    /// the first request this run sent, and no other credential of any model of the chain can
    /// serve now. A credential that is parked for that model, banned, on a quota this request
    /// closed or at its own limit cannot; one whose slots are all taken can, after a wait.
    pub(super) fn only_route(&self, cred: &Credential, model: &ModelRoute) -> bool {
        if self.sent > 1 {
            return false;
        }
        let now_ms = self.up.clock.now_ms();
        !self.chain.iter().any(|m| {
            m.credentials.iter().any(|c| {
                (c.id != cred.id || m.name != model.name)
                    && self.endpoint.served_by(c.provider)
                    && c.models
                        .get(&m.name)
                        .is_some_and(|um| self.can_serve(c, um, now_ms))
            })
        })
    }

    fn can_serve(&self, cred: &Credential, upstream_model: &str, now_ms: i64) -> bool {
        !self.on_closed_group(cred, upstream_model)
            && self
                .up
                .locks
                .parked_until(cred.id, upstream_model, now_ms)
                .is_none()
            && !self.up.locks.is_banned(cred.id)
            && self.up.admission.has_room(cred, now_ms)
    }

    /// groot ADR 0008: the pause before the one retry, 1 to 3 s with jitter
    /// (`single_candidate_retry_{min,max}_ms`), then the request again. None — no retry — when
    /// the attempt budget is spent, the pause would use up the time budget, or meanwhile the
    /// credential came to rest (a lock besides the hold `held` parked, or its banned mark) or
    /// reached an own limit; otherwise the retry is counted.
    pub(super) async fn retry(
        &mut self,
        body: &Fields,
        cred: &Credential,
        model: &ModelRoute,
        upstream_model: &str,
        held: &Held,
    ) -> Option<Request<Bytes>> {
        let settings = &self.up.settings;
        if self.spent() {
            return None;
        }
        let (min, max) = (
            settings.single_candidate_retry_min_ms,
            settings.single_candidate_retry_max_ms,
        );
        let pause = Duration::from_millis(rand::thread_rng().gen_range(min..=max));
        if pause >= self.deadline.left() {
            return None;
        }
        tokio::time::sleep(pause).await;
        let now_ms = self.up.clock.now_ms();
        let resting = self.up.locks.is_banned(cred.id)
            || self
                .up
                .locks
                .parked_until_besides(cred.id, upstream_model, now_ms, &held.written)
                .is_some();
        if resting || !self.up.admission.admit_again(cred, now_ms) {
            return None;
        }
        // Built again rather than copied ahead of every request: only a retry pays for it.
        let out =
            super::exchange::outgoing(self.endpoint, cred, body, upstream_model, model.max_output_tokens)
                .ok()?;
        Some(request(cred, self.headers, out))
    }
}

/// groot ADR 0008: whether the only route's failure, so classified, leaves the credential usable
/// for its one retry. Only the plain server error does (a 5xx no earlier rule named: kRouter
/// parks that model 30 s and tries the next credential, and for the only route the retry is that
/// next try; its hold keeps every other request off the route meanwhile). Every other
/// classification rests the credential or ends the walk: a named reset (`Retry-After: 120` on a
/// 503), rate-limit wording, no capacity (stop), an overload's backoff (529), a ban, a request
/// error.
pub(super) fn leaves_credential_usable(class: &Classification) -> bool {
    class.rule == Rule::ServerError && class.next == NextStep::NextCredential && !class.banned
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Provider;
    use crate::upstream::pool::classify::{self, UpstreamFailure};
    use axum::http::HeaderMap;
    use axum::http::HeaderValue;
    use chrono::Utc;

    /// groot ADR 0008 after classification: which failures of a lone credential get its one
    /// retry. Each row: name, status, headers, body, whether the retry may fire.
    #[test]
    fn the_single_retry_follows_the_classification() {
        type Row = (
            &'static str,
            u16,
            &'static [(&'static str, &'static str)],
            &'static str,
            bool,
        );
        let rows: &[Row] = &[
            (
                "a plain 503 leaves the credential usable",
                503,
                &[],
                r#"{"error":{"message":"upstream exploded"}}"#,
                true,
            ),
            ("a plain 500", 500, &[], "Internal Server Error", true),
            (
                "a 503 naming Retry-After: 120 parks the model 120 s",
                503,
                &[("retry-after", "120")],
                r#"{"error":{"message":"busy"}}"#,
                false,
            ),
            (
                "no capacity: 5 s and stop",
                503,
                &[],
                r#"{"error":{"message":"No capacity available for model gpt-x on the server"}}"#,
                false,
            ),
            (
                "a 529 overload backs off",
                529,
                &[],
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                false,
            ),
            (
                "a 429 is never retried",
                429,
                &[],
                r#"{"error":{"message":"slow down"}}"#,
                false,
            ),
            (
                "a request error is never retried",
                400,
                &[],
                r#"{"error":{"message":"bad field"}}"#,
                false,
            ),
            (
                "a ban is never retried",
                403,
                &[],
                r#"{"error":{"message":"To continue, verify your account at https://x"}}"#,
                false,
            ),
        ];
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-01T10:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default();
        for (name, status, headers, body, want) in rows {
            let mut map = HeaderMap::new();
            for (k, v) in *headers {
                map.insert(*k, HeaderValue::from_static(v));
            }
            let class = classify::classify(&UpstreamFailure {
                status: *status,
                headers: &map,
                body,
                provider: Provider::OpenAiCompatible,
                model: "gpt-x",
                now,
                backoff_level: 0,
                kiro_holds: 0,
                gateway_busy: false,
            });
            assert_eq!(leaves_credential_usable(&class), *want, "{name}: {class:?}");
        }
    }
}
