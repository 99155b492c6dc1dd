//! Dispatch: one attempt per candidate, in order, within the attempt budget and the request's
//! [`Deadline`], which bounds every wait here (a response head, an error body, a free slot, a
//! retry's pause); a deadline passed on an upstream is classified as its 5xx would be. Before an
//! attempt, a candidate must be unlocked, within its own limits and hold a free in-flight slot
//! (`admission.rs`); a failure is classified (`classify.rs`) and the classification says what to
//! park and where the request goes next. This is the one retry layer: the HTTP client never
//! retries by itself, and the only retry of the same credential is a single candidate's one retry
//! of a connection failure or of a 5xx whose classification leaves it usable (groot ADR 0008).

mod candidates;
mod exchange;
mod outcome;
mod park;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::http::HeaderMap;
use chrono::{DateTime, Utc};
use rand::Rng;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use self::candidates::candidates;
pub(crate) use self::exchange::request;
use self::exchange::{Unread, read_answer, read_error};
pub use self::outcome::{Answer, Attempt, AttemptLog, Complete, Dispatched, UpstreamError};
pub use self::park::time_out;
use self::park::{park, rfc3339};
use super::adapter::{Endpoint, Fields};
use super::admission::{Admission, Refusal, Slot};
use super::classify::{self, Classification, NextStep, Rule, Sharing, UpstreamFailure};
use super::corroboration::Corroboration;
use super::http;
use super::locks::{LockEntry, LockTarget, Locks};
use super::pool::{Credential, ModelRoute};
use crate::clock::Clock;
use crate::config::Settings;
use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::otel::{AttemptSpan, RequestTrace};
use crate::translate;

/// What dispatching needs of the gateway, borrowed for one request: the settings, the clock, the
/// credentials' locks, admission and corroboration, the HTTP client, and where what a failure
/// parks is persisted. Nothing else of the gateway's state reaches dispatch.
#[derive(Clone, Copy)]
pub struct Upstreams<'a> {
    /// The retry and wait settings (`max_attempts`, `slot_wait_ms`, the single retry's pause).
    pub settings: &'a Settings,
    /// Source of "now".
    pub clock: &'a Clock,
    /// Learned locks, backoff levels and bans.
    pub locks: &'a Locks,
    /// Own limits and in-flight slots.
    pub admission: &'a Admission,
    /// Recent ambiguous 429s per quota group (groot ADR 0008).
    pub corroboration: &'a Corroboration,
    /// The HTTP client to upstreams.
    pub http: &'a http::Client,
    /// Persists locks off the request path.
    pub persist: &'a dyn PersistLocks,
}

/// Persists what a failure parked (extend-only) and a ban, off the request path, so that every
/// gateway on the database honours them.
pub trait PersistLocks: Sync {
    /// Hands `rows` (and `banned`, a credential to mark banned) to a background write.
    fn persist_locks(&self, rows: Vec<(i64, LockTarget, LockEntry)>, banned: Option<i64>);
}

/// The rule an attempt names in the log when it was retried (groot ADR 0008: one retry).
pub const SINGLE_CANDIDATE_RETRY: &str = "single_candidate_retry";
/// The wait a refusal names when the only candidates left are out of rotation with no end
/// (disabled, or banned until a connection test passes): five minutes, the longest backoff;
/// over a minute, so the SDKs are told not to retry by themselves.
const OUT_OF_ROTATION_WAIT_SECS: u64 = 300;
/// What the log says of a credential whose slots stayed full (kRouter's "busy, try another").
const CREDENTIAL_BUSY: &str = "credential busy: no in-flight slot came free in time";

/// Tries the chain's candidates in order until `deadline`. `attempts` collects every attempt for
/// the log; `member_id` is the caller's member (groot ADR 0008 corroboration counts members).
#[expect(
    clippy::too_many_arguments,
    reason = "the request path's inputs, each borrowed from `proxy::handle`"
)]
pub async fn dispatch(
    upstreams: Upstreams<'_>,
    endpoint: Endpoint,
    body: &Fields,
    chain: &[Arc<ModelRoute>],
    headers: &HeaderMap,
    quota_groups: Option<&HashMap<String, Vec<i64>>>,
    member_id: i64,
    deadline: Deadline,
    log: AttemptLog<'_>,
) -> Dispatched {
    let mut run = Run {
        up: upstreams,
        endpoint,
        stream: body.asks_stream(),
        headers,
        quota_groups,
        member_id,
        deadline,
        attempts: log.attempts,
        under_way: log.under_way,
        trace: log.trace,
        sending: None,
        sent: 0,
        last: None,
        earliest_free: None,
        closed_groups: Vec::new(),
        out_of_rotation: false,
    };
    // A model only Anthropic credentials serve, asked for on /v1/embeddings: the request is at
    // the wrong endpoint, nothing is unreachable. (Chat and messages each reach every chat
    // model, translated where needed.)
    if let Some(first) = chain.first()
        && !chain.iter().any(|m| {
            m.credentials.iter().any(|c| endpoint.served_by(c.provider))
                || m.disabled.iter().any(|p| endpoint.served_by(*p))
        })
    {
        let hint = "it is a chat model: call POST /v1/chat/completions or POST /v1/messages";
        return Dispatched::GatewayFailed(ApiError::invalid(
            format!(
                "no upstream credential serves the model `{}` on this endpoint; {hint}",
                first.name
            ),
            Some("model"),
        ));
    }
    let now_ms = upstreams.clock.now_ms();
    'models: for model in chain {
        // A disabled credential exists but cannot serve now (DESIGN.md §6: exhausted).
        if model.disabled.iter().any(|p| endpoint.served_by(*p)) {
            run.out_of_rotation = true;
        }
        let creds = candidates(model, endpoint);
        // groot ADR 0008: one retry layer — only a request with a single candidate (one
        // credential, no fallback) gets a retry of its own.
        let single = chain.len() == 1 && creds.len() == 1;
        // Candidates skipped because every in-flight slot was taken.
        let mut busy: Vec<(Arc<Credential>, Arc<Semaphore>)> = Vec::new();
        for cred in creds {
            if run.spent() {
                break 'models;
            }
            let Some(upstream_model) = cred.models.get(&model.name) else {
                continue;
            };
            if !run.available(&cred, upstream_model, now_ms) {
                continue;
            }
            // DESIGN.md §1: own limits and a free in-flight slot, checked before dispatch.
            let slot = match upstreams.admission.admit(&cred, now_ms) {
                Ok(slot) => slot,
                Err(Refusal::OwnLimit { until_ms }) => {
                    run.free_at(until_ms);
                    continue;
                }
                Err(Refusal::Busy(slots)) => {
                    busy.push((cred, slots));
                    continue;
                }
            };
            match run
                .attempt(body, &cred, model, upstream_model, slot, single)
                .await
            {
                Step::Served(served) => return served,
                Step::Failed(NextStep::NextCredential) => continue,
                Step::Failed(NextStep::NextModel) => continue 'models,
                Step::Failed(NextStep::Stop) => break 'models,
            }
        }
        busy.retain(|(cred, _)| !run.on_closed_group(cred));
        if busy.is_empty() || run.spent() {
            continue;
        }
        // kRouter rule 5: every candidate left is busy: wait briefly for a slot; if none comes
        // free, each gets the gateway's own "credential busy" (short backoff) and the chain moves on.
        let Some((i, permit)) = run.wait_for_slot(&busy).await else {
            run.busy(&busy, model);
            continue;
        };
        let cred = &busy[i].0;
        let Some(upstream_model) = cred.models.get(&model.name) else {
            continue;
        };
        let slot = match upstreams
            .admission
            .admit_waited(cred, permit, upstreams.clock.now_ms())
        {
            Ok(slot) => slot,
            Err(until_ms) => {
                run.free_at(until_ms);
                continue;
            }
        };
        match run.attempt(body, cred, model, upstream_model, slot, single).await {
            Step::Served(served) => return served,
            Step::Failed(NextStep::NextCredential | NextStep::NextModel) => continue,
            Step::Failed(NextStep::Stop) => break 'models,
        }
    }
    run.finish()
}

/// The outcome of one attempt (with its retry, if any).
enum Step {
    /// Served; dispatch is over.
    Served(Dispatched),
    /// Failed; where the request goes now.
    Failed(NextStep),
}

/// One request's walk through its candidates.
struct Run<'a> {
    up: Upstreams<'a>,
    endpoint: Endpoint,
    /// Whether the request asked for a stream.
    stream: bool,
    headers: &'a HeaderMap,
    quota_groups: Option<&'a HashMap<String, Vec<i64>>>,
    member_id: i64,
    /// The end of the request's time budget.
    deadline: Deadline,
    attempts: &'a mut Vec<Attempt>,
    /// The attempt whose request is out ([`AttemptLog::under_way`]).
    under_way: &'a mut Option<(Arc<Credential>, Arc<ModelRoute>)>,
    /// The request's trace, when traces are exported: each request sent carries a `traceparent`.
    trace: Option<&'a RequestTrace>,
    /// The span of the request being sent, given to the attempt it ends in.
    sending: Option<AttemptSpan>,
    /// Requests sent upstream so far (the attempt budget counts these).
    sent: usize,
    /// What to answer if nothing serves.
    last: Option<Dispatched>,
    /// The earliest instant (Unix ms) a skipped candidate is free again: the end of its lock,
    /// the rollover of its own limit's window, or its busy backoff.
    earliest_free: Option<i64>,
    /// Quota groups this request stopped walking: one of their credentials answered a failure
    /// of the shared account quota (groot ADR 0008).
    closed_groups: Vec<String>,
    /// A candidate exists that cannot serve now and names no end: disabled, or banned past its
    /// lock (until a connection test passes).
    out_of_rotation: bool,
}

impl Run<'_> {
    /// Whether the attempt budget or the time budget is spent.
    fn spent(&self) -> bool {
        self.sent >= self.up.settings.max_attempts as usize || self.deadline.passed()
    }

    /// Logs an attempt; the request it sent (if any) gives it its span.
    fn push(&mut self, mut attempt: Attempt) {
        attempt.span = self.sending.take();
        *self.under_way = None;
        self.attempts.push(attempt);
    }

    fn free_at(&mut self, until_ms: i64) {
        self.earliest_free = Some(self.earliest_free.map_or(until_ms, |e| e.min(until_ms)));
    }

    /// Filtered before dispatch: a quota group this request closed, a running lock on the
    /// credential or this model (its end is the earliest a refusal may name), or the
    /// credential's banned mark.
    fn available(&mut self, cred: &Credential, upstream_model: &str, now_ms: i64) -> bool {
        if self.on_closed_group(cred) {
            return false;
        }
        if let Some(until) = self.up.locks.parked_until(cred.id, upstream_model, now_ms) {
            self.free_at(until);
            return false;
        }
        if self.up.locks.is_banned(cred.id) {
            self.out_of_rotation = true;
            return false;
        }
        true
    }

    /// Sends the request to `cred`, holding `slot`; on a failure, classifies it and parks what
    /// it names. A single candidate gets one retry of a 5xx or a connection failure.
    async fn attempt(
        &mut self,
        body: &Fields,
        cred: &Arc<Credential>,
        model: &Arc<ModelRoute>,
        upstream_model: &str,
        slot: Slot,
        single: bool,
    ) -> Step {
        // A request the credential's format cannot express is not sent: the client's 400, unless
        // another candidate serves it or an earlier one failed (its answer says more).
        let out = match translate::request(self.endpoint, cred, body, upstream_model, model.max_output_tokens)
        {
            Ok(out) => out,
            Err(refused) => {
                tracing::debug!(credential = %cred.name, param = %refused.param, "request not translatable");
                self.last.get_or_insert(Dispatched::GatewayFailed(refused.into()));
                return Step::Failed(NextStep::NextCredential);
            }
        };
        let max_tokens_chosen = out.max_tokens_chosen;
        let mut req = request(cred, self.headers, out);
        // The body is bytes, so the request copies cheaply; only a single candidate may need it.
        let mut retry = single.then(|| http::duplicate(&req));
        loop {
            self.sent += 1;
            if let Some(trace) = self.trace {
                self.sending = Some(trace.attempt(req.headers_mut()));
            }
            let started = Instant::now();
            *self.under_way = Some((cred.clone(), model.clone()));
            let sent = self.deadline.bound(self.up.http.send(req)).await;
            if let Some(span) = &mut self.sending {
                span.answered = Some(SystemTime::now());
            }
            let Some(sent) = sent else {
                return self.timed_out(cred, upstream_model, Attempt::of(cred, model));
            };
            let upstream_latency = started.elapsed();
            metrics::histogram!("aigw_upstream_duration_seconds", "provider" => cred.provider.as_str())
                .record(upstream_latency.as_secs_f64());
            let response = match sent {
                Ok(r) => r,
                Err(e) => {
                    let what = cred.mask.mask_str(&e.to_string()).into_owned();
                    let attempt = Attempt {
                        error: Some(what.clone()),
                        ..Attempt::of(cred, model)
                    };
                    // groot ADR 0008: a connection failure of a single candidate, nothing emitted.
                    if let Some(again) = retry.take()
                        && self.retry_pause(cred, upstream_model).await
                    {
                        self.push(Attempt {
                            rule: Some(SINGLE_CANDIDATE_RETRY),
                            ..attempt
                        });
                        req = again;
                        continue;
                    }
                    self.push(attempt);
                    self.last = Some(Dispatched::GatewayFailed(ApiError::UpstreamUnreachable {
                        message: what,
                    }));
                    return Step::Failed(NextStep::NextCredential);
                }
            };
            let status = response.status().as_u16();
            // DESIGN.md §9: a status outside HTTP's range is no answer to pass on.
            if !(100..=599).contains(&status) {
                let reason = format!("status {status} is outside 100–599");
                return Step::Failed(self.invalid(cred, model, upstream_model, status, reason));
            }
            if response.status().is_success() {
                let read =
                    self.deadline
                        .bound(read_answer(self.endpoint, cred.provider, self.stream, response));
                let answer = match read.await {
                    // The head came, the body did not in time: the credential rests as for a 5xx.
                    None => {
                        let attempt = Attempt {
                            status: Some(status),
                            ..Attempt::of(cred, model)
                        };
                        return self.timed_out(cred, upstream_model, attempt);
                    }
                    Some(Ok(answer)) => answer,
                    Some(Err(Unread::Invalid(reason))) => {
                        return Step::Failed(self.invalid(cred, model, upstream_model, status, reason));
                    }
                    // Like a connection failure: nothing parked, the next candidate is tried.
                    Some(Err(Unread::Broken(what))) => {
                        let what = cred.mask.mask_str(&what).into_owned();
                        self.push(Attempt {
                            status: Some(status),
                            error: Some(what.clone()),
                            ..Attempt::of(cred, model)
                        });
                        self.last = Some(Dispatched::GatewayFailed(ApiError::UpstreamUnreachable {
                            message: what,
                        }));
                        return Step::Failed(NextStep::NextCredential);
                    }
                };
                self.push(Attempt {
                    status: Some(status),
                    max_tokens_chosen,
                    ..Attempt::of(cred, model)
                });
                self.up.locks.success(cred.id);
                return Step::Served(Dispatched::Served {
                    answer,
                    credential: cred.clone(),
                    model: model.clone(),
                    upstream_latency,
                    slot,
                });
            }
            let Some(error) = self.deadline.bound(read_error(response, cred)).await else {
                let attempt = Attempt {
                    status: Some(status),
                    ..Attempt::of(cred, model)
                };
                return self.timed_out(cred, upstream_model, attempt);
            };
            // Classified first: the one retry (groot ADR 0008) only when the classification
            // leaves this credential usable; whatever it parks is parked, and not retried.
            let class = self.classify(cred, upstream_model, &error);
            if leaves_credential_usable(&class)
                && let Some(again) = retry.take()
                && self.retry_pause(cred, upstream_model).await
            {
                self.push(Attempt {
                    status: Some(status),
                    rule: Some(SINGLE_CANDIDATE_RETRY),
                    ..Attempt::of(cred, model)
                });
                req = again;
                continue;
            }
            return Step::Failed(self.fail(cred, model, upstream_model, error, class));
        }
    }

    /// The deadline passed while `attempt` waited for a head or an error body: the credential is
    /// classified and parked as for a 5xx, and with the budget spent no other candidate is tried.
    fn timed_out(&mut self, cred: &Credential, upstream_model: &str, mut attempt: Attempt) -> Step {
        let missed = self.deadline.missed();
        time_out(self.up, cred, upstream_model, &missed, &mut attempt);
        self.push(attempt);
        self.last = Some(Dispatched::GatewayFailed(self.deadline.error()));
        Step::Failed(NextStep::Stop)
    }

    /// groot ADR 0008: the pause before a single candidate's one retry, 1 to 3 s with jitter
    /// (`single_candidate_retry_{min,max}_ms`). False — no retry — when the attempt budget is
    /// spent, the pause would use up the time budget, or meanwhile the credential came to rest
    /// (a lock or its banned mark) or reached an own limit; otherwise the retry is counted.
    async fn retry_pause(&mut self, cred: &Credential, upstream_model: &str) -> bool {
        let settings = &self.up.settings;
        if self.spent() {
            return false;
        }
        let (min, max) = (
            settings.single_candidate_retry_min_ms,
            settings.single_candidate_retry_max_ms,
        );
        let pause = Duration::from_millis(rand::thread_rng().gen_range(min..=max));
        if pause >= self.deadline.left() {
            return false;
        }
        tokio::time::sleep(pause).await;
        let now_ms = self.up.clock.now_ms();
        !self.up.locks.is_banned(cred.id)
            && self
                .up
                .locks
                .parked_until(cred.id, upstream_model, now_ms)
                .is_none()
            && self.up.admission.admit_again(cred, now_ms)
    }

    /// Classifies an upstream error of `cred` (nothing is parked yet).
    fn classify(&self, cred: &Credential, upstream_model: &str, error: &UpstreamError) -> Classification {
        let text = String::from_utf8_lossy(&error.body);
        classify::classify(&UpstreamFailure {
            status: error.status,
            headers: &error.headers,
            body: &text,
            provider: cred.provider,
            model: upstream_model,
            now: self.up.clock.now(),
            backoff_level: self.up.locks.backoff_level(cred.id),
            gateway_busy: false,
        })
    }

    /// Parks what the classification of an upstream error names, and keeps the error as the
    /// answer so far.
    fn fail(
        &mut self,
        cred: &Credential,
        model: &ModelRoute,
        upstream_model: &str,
        error: UpstreamError,
        class: Classification,
    ) -> NextStep {
        let lock_until = self.park(cred, upstream_model, &class);
        self.push(Attempt {
            status: Some(error.status),
            rule: Some(class.rule.name()),
            lock_until: lock_until.map(rfc3339),
            ..Attempt::of(cred, model)
        });
        self.last = Some(Dispatched::UpstreamFailed(error));
        class.next
    }

    /// An answer that is not what the endpoint promises (DESIGN.md §9): parked like a 5xx, and
    /// a 502 `upstream_invalid_response` is the request's answer so far.
    fn invalid(
        &mut self,
        cred: &Credential,
        model: &ModelRoute,
        upstream_model: &str,
        status: u16,
        reason: String,
    ) -> NextStep {
        let class = classify::invalid_response(self.up.clock.now());
        let lock_until = self.park(cred, upstream_model, &class);
        tracing::warn!(credential = %cred.name, model = upstream_model, status, reason = %reason, "upstream answer refused");
        self.push(Attempt {
            status: Some(status),
            rule: Some(class.rule.name()),
            error: Some(reason.clone()),
            lock_until: lock_until.map(rfc3339),
            ..Attempt::of(cred, model)
        });
        self.last = Some(Dispatched::GatewayFailed(ApiError::UpstreamInvalidResponse {
            reason,
        }));
        class.next
    }

    /// Waits, within `slot_wait_ms` and the time budget, for a slot of any busy candidate;
    /// returns which one freed first. (`&mut`: a shared `Run` is not `Send`, for the response
    /// body `last` may hold.)
    async fn wait_for_slot(
        &mut self,
        busy: &[(Arc<Credential>, Arc<Semaphore>)],
    ) -> Option<(usize, OwnedSemaphorePermit)> {
        let left = self.deadline.left();
        let wait = Duration::from_millis(self.up.settings.slot_wait_ms).min(left);
        if busy.is_empty() || wait.is_zero() {
            return None;
        }
        let waits = busy.iter().enumerate().map(|(i, (_, slots))| {
            let slots = slots.clone();
            Box::pin(async move { (i, slots.acquire_owned().await) })
        });
        match tokio::time::timeout(wait, futures::future::select_all(waits)).await {
            Ok(((i, Ok(permit)), _, _)) => Some((i, permit)),
            _ => None,
        }
    }

    /// kRouter rule 5: no slot came free in time: the gateway's own "credential busy" on each
    /// busy candidate, classified like any failure (the short backoff on that model).
    fn busy(&mut self, busy: &[(Arc<Credential>, Arc<Semaphore>)], model: &ModelRoute) {
        let now = self.up.clock.now();
        for (cred, _) in busy {
            let Some(upstream_model) = cred.models.get(&model.name) else {
                continue;
            };
            let level = self.up.locks.backoff_level(cred.id);
            let class = classify::classify(&UpstreamFailure::gateway_busy(
                cred.provider,
                upstream_model,
                now,
                level,
            ));
            let lock_until = self.park(cred, upstream_model, &class);
            if let Some(until) = lock_until {
                self.free_at(until.timestamp_millis());
            }
            self.push(Attempt {
                rule: Some(class.rule.name()),
                error: Some(CREDENTIAL_BUSY.to_owned()),
                lock_until: lock_until.map(rfc3339),
                ..Attempt::of(cred, model)
            });
        }
    }

    /// How dispatch ends when nothing served.
    fn finish(self) -> Dispatched {
        // DESIGN.md §6: nothing was sent upstream, and a candidate exists that cannot serve now
        // (parked, banned, disabled, at its own limit, or busy): exhausted, never unreachable,
        // with the earliest end any of them names.
        if self.sent == 0 {
            let retry_after_ms = match self.earliest_free {
                Some(until) => Some(u64::try_from(until - self.up.clock.now_ms()).unwrap_or(0).max(1)),
                None => self.out_of_rotation.then_some(OUT_OF_ROTATION_WAIT_SECS * 1000),
            };
            if let Some(retry_after_ms) = retry_after_ms {
                return Dispatched::GatewayFailed(ApiError::UpstreamQuotaExhausted { retry_after_ms });
            }
        }
        self.last.unwrap_or_else(|| {
            Dispatched::GatewayFailed(ApiError::UpstreamUnreachable {
                message: "no upstream credential serves this model on this endpoint".to_owned(),
            })
        })
    }

    /// Whether `cred` is on a quota group this request closed.
    fn on_closed_group(&self, cred: &Credential) -> bool {
        cred.quota_group
            .as_ref()
            .is_some_and(|g| self.closed_groups.contains(g))
    }

    /// Parks what a classified failure names; returns the lock's end. A failure of the shared
    /// account quota — account-level, or ambiguous whether corroborated or not — closes the
    /// credential's quota group for the rest of this request: groot ADR 0008, "the run stops
    /// walking free routes … still moves to a route off the shared quota". Every credential and
    /// every model of the group would spend the same quota.
    fn park(
        &mut self,
        cred: &Credential,
        upstream_model: &str,
        class: &Classification,
    ) -> Option<DateTime<Utc>> {
        if let (Some(lock), Some(g)) = (&class.lock, &cred.quota_group)
            && matches!(lock.sharing, Sharing::Account | Sharing::AccountIfCorroborated)
            && !self.closed_groups.contains(g)
        {
            self.closed_groups.push(g.clone());
        }
        park(
            self.up,
            self.quota_groups,
            self.member_id,
            cred,
            upstream_model,
            class,
        )
    }
}

/// groot ADR 0008: whether a single candidate's failure, so classified, leaves the credential
/// usable for its one retry. Only the plain server error does (a 5xx no earlier rule named:
/// kRouter parks that model 30 s and tries the next credential, and for a lone credential the
/// retry is that next try; it parks nothing unless the retry fails too). Every other
/// classification rests the credential or ends the walk: a named reset (`Retry-After: 120` on a
/// 503), rate-limit wording, no capacity (stop), an overload's backoff (529), a ban, a request
/// error.
fn leaves_credential_usable(class: &Classification) -> bool {
    class.rule == Rule::ServerError && class.next == NextStep::NextCredential && !class.banned
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::Provider;
    use axum::http::HeaderValue;

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
                gateway_busy: false,
            });
            assert_eq!(leaves_credential_usable(&class), *want, "{name}: {class:?}");
        }
    }
}
