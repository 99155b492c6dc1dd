//! Dispatch: one attempt per candidate, in order, within the attempt budget and the request's
//! [`Deadline`], which bounds every wait here (a response head, an error body, a free slot, a
//! retry's pause); a deadline passed on an upstream is classified as its 5xx would be. Before an
//! attempt, a candidate must be unlocked, within its own limits and hold a free in-flight slot
//! (`admission.rs`); a failure is classified (`classify.rs`) and the classification says what to
//! park and where the request goes next. This is the one retry layer: the HTTP client never
//! retries by itself, and the only retry of the same credential is the one retry of a run's only
//! route, on a connection failure or a 5xx whose classification leaves it usable (groot ADR 0008;
//! `retry.rs`).

mod candidates;
mod exchange;
mod outcome;
mod park;
mod retry;

use rustc_hash::FxHashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::http::HeaderMap;
use chrono::{DateTime, Utc};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use self::candidates::candidates;
use self::exchange::{Unread, read_answer, read_error};
pub(crate) use self::exchange::{outgoing, request};
pub use self::outcome::{Answer, Attempt, AttemptLog, Complete, Dispatched, UpstreamError, provider_words};
use self::park::{GroupClosure, park, rfc3339};
pub use self::park::{PersistLocks, rest_group, time_out};
pub use self::retry::SINGLE_CANDIDATE_RETRY;
use self::retry::{Held, leaves_credential_usable};
use crate::config::Settings;
use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::kernel::clock::Clock;
use crate::observability::otel::{AttemptSpan, RequestTrace};
use crate::provider::Credential;
use crate::provider::adapter::{Endpoint, Fields};
use crate::transport::http;
use crate::upstream::pool::admission::{Admission, Refusal, Slot};
use crate::upstream::pool::classify::{self, Classification, NextStep, UpstreamFailure};
use crate::upstream::pool::corroboration::Corroboration;
use crate::upstream::pool::locks::Locks;
use crate::upstream::pool::routes::ModelRoute;

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

/// The wait a refusal names when the only candidates left are out of rotation with no end
/// (disabled, or banned until a connection test passes): five minutes, the longest backoff;
/// over a minute, so the SDKs are told not to retry by themselves.
const OUT_OF_ROTATION_WAIT_SECS: u64 = 300;
/// What the log says of a credential whose slots stayed full (kRouter's "busy, try another");
/// the credentials' figures leave such an attempt out, as nothing was sent.
const CREDENTIAL_BUSY: &str = crate::store::BUSY_ATTEMPT;

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
    quota_groups: Option<&FxHashMap<String, Vec<i64>>>,
    member_id: i64,
    deadline: Deadline,
    log: AttemptLog<'_>,
) -> Dispatched {
    let mut run = Run {
        up: upstreams,
        endpoint,
        chain,
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
            match run.attempt(body, &cred, model, upstream_model, slot).await {
                Step::Served(served) => return served,
                Step::Failed(NextStep::NextCredential) => continue,
                Step::Failed(NextStep::NextModel) => continue 'models,
                Step::Failed(NextStep::Stop) => break 'models,
            }
        }
        busy.retain(|(cred, _)| {
            cred.models
                .get(&model.name)
                .is_some_and(|m| !run.on_closed_group(cred, m))
        });
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
        match run.attempt(body, cred, model, upstream_model, slot).await {
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
    /// The model asked for and its fallbacks.
    chain: &'a [Arc<ModelRoute>],
    /// Whether the request asked for a stream.
    stream: bool,
    headers: &'a HeaderMap,
    quota_groups: Option<&'a FxHashMap<String, Vec<i64>>>,
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
    /// What this request stopped walking: the models of a quota group whose shared quota one
    /// of its credentials answered closed (groot ADR 0008).
    closed_groups: Vec<GroupClosure>,
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
        if self.on_closed_group(cred, upstream_model) {
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
    /// it names. The only route that can serve gets one retry of a 5xx or a connection failure;
    /// the 5xx's hold, parked meanwhile, is lifted when the retry serves and persisted otherwise.
    async fn attempt(
        &mut self,
        body: &Fields,
        cred: &Arc<Credential>,
        model: &Arc<ModelRoute>,
        upstream_model: &str,
        slot: Slot,
    ) -> Step {
        let mut held = Held::new();
        let step = self
            .exchange(body, cred, model, upstream_model, slot, &mut held)
            .await;
        held.settle(self.up, matches!(step, Step::Served(_)));
        step
    }

    /// [`Run::attempt`]'s exchanges with `cred`, the retry included; `held` collects the hold
    /// parked while the retry waits.
    async fn exchange(
        &mut self,
        body: &Fields,
        cred: &Arc<Credential>,
        model: &Arc<ModelRoute>,
        upstream_model: &str,
        slot: Slot,
        held: &mut Held,
    ) -> Step {
        // A request the credential's format cannot express is not sent: the client's 400, unless
        // another candidate serves it or an earlier one failed (its answer says more).
        let out = match exchange::outgoing(self.endpoint, cred, body, upstream_model, model.max_output_tokens)
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
        let mut retried = false;
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
                    // groot ADR 0008: a connection failure of the only route, nothing emitted.
                    if !std::mem::replace(&mut retried, true)
                        && self.only_route(cred, model)
                        && let Some(again) = self.retry(body, cred, model, upstream_model, held).await
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
                let read = self.deadline.bound(read_answer(
                    self.endpoint,
                    cred.provider,
                    upstream_model,
                    self.stream,
                    response,
                ));
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
                if self.up.locks.success(cred.id) {
                    self.up.persist.share_backoff(cred.id, 0);
                }
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
            // leaves this credential usable. Its hold (kRouter rule 5: 30 s) is parked at once,
            // so no other request walks into the failing route while the retry waits; the retry
            // is this request's own next try on it.
            let class = self.classify(cred, upstream_model, &error);
            if leaves_credential_usable(&class)
                && !std::mem::replace(&mut retried, true)
                && self.only_route(cred, model)
            {
                let said = provider_words(&error.body);
                let lock_until = held.park(self.up, cred, upstream_model, &class, said.clone());
                if let Some(again) = self.retry(body, cred, model, upstream_model, held).await {
                    self.push(Attempt {
                        status: Some(status),
                        rule: Some(SINGLE_CANDIDATE_RETRY),
                        lock_until: lock_until.map(rfc3339),
                        message: said,
                        ..Attempt::of(cred, model)
                    });
                    req = again;
                    continue;
                }
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
        self.last = Some(Dispatched::GatewayFailed(ApiError::from(&self.deadline)));
        Step::Failed(NextStep::Stop)
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
            kiro_holds: self.up.locks.kiro_holds(cred.id),
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
        mut error: UpstreamError,
        class: Classification,
    ) -> NextStep {
        let words = provider_words(&error.body);
        let lock_until = self.park(cred, upstream_model, &class, words.as_deref());
        error.lock_until = lock_until;
        self.push(Attempt {
            status: Some(error.status),
            rule: Some(class.rule.name()),
            lock_until: lock_until.map(rfc3339),
            message: words,
            ..Attempt::of(cred, model)
        });
        exchange::in_openai_shape(&mut error);
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
        let lock_until = self.park(cred, upstream_model, &class, Some(&reason));
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
            let lock_until = self.park(cred, upstream_model, &class, Some(CREDENTIAL_BUSY));
            if let Some(until) = lock_until {
                self.free_at(until.timestamp_millis());
            }
            self.push(Attempt {
                rule: Some(class.rule.name()),
                error: Some(CREDENTIAL_BUSY.to_owned()),
                lock_until: lock_until.map(rfc3339),
                sent: false,
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

    /// Whether `upstream_model` on `cred` draws on a quota this request found closed.
    fn on_closed_group(&self, cred: &Credential, upstream_model: &str) -> bool {
        self.closed_groups.iter().any(|c| c.covers(cred, upstream_model))
    }

    /// Parks what a classified failure names; returns the lock's end. A failure of the shared
    /// account quota — account-level, or ambiguous whether corroborated or not — closes the
    /// models that quota covers on the group for the rest of this request ([`GroupClosure`],
    /// the rule the group's rest follows too): groot ADR 0008, "the run stops walking free
    /// routes … still moves to a route off the shared quota".
    fn park(
        &mut self,
        cred: &Credential,
        upstream_model: &str,
        class: &Classification,
        said: Option<&str>,
    ) -> Option<DateTime<Utc>> {
        self.closed_groups
            .extend(GroupClosure::of(cred, upstream_model, class));
        park(
            self.up,
            self.quota_groups,
            self.member_id,
            cred,
            upstream_model,
            class,
            said,
        )
    }
}
