//! After completion: what a finished request leaves behind — usage, the request log, metrics.
//! Runs exactly once per logged request: at the end of a response, at the end of a stream, when
//! a stream is dropped because the client went away, or when the request itself is dropped before
//! its answer (cancellation never drops accounting).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use metrics::{Counter, Histogram};

use crate::deadline::Missed;
use crate::kernel::caller::Caller;
use crate::kernel::in_flight::InFlightGuard;
use crate::kernel::usage::Usage;
use crate::provider::Credential;
use crate::provider::adapter::Endpoint;
use crate::quota::engine::QuotaDecision;
use crate::request_log::LogRecord;
use crate::state::AppState;
use crate::translate::Translation;
use crate::upstream::dispatch::{self, Attempt, AttemptLog};
use crate::upstream::pool::admission::Slot;
use crate::upstream::pool::routes::ModelRoute;

/// Who produced an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The gateway refused or failed.
    Gateway,
    /// The upstream answered with an error.
    Upstream,
}

impl Source {
    /// Wire name (`x-aigw-error-source`, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Gateway => "gateway",
            Source::Upstream => "upstream",
        }
    }
}

/// How a request ended.
#[derive(Debug)]
pub struct Outcome {
    /// Final status to the client.
    pub status: u16,
    /// Tokens used, if any.
    pub usage: Option<Usage>,
    /// Whether `usage` is the gateway's estimate: a stream cut short, or an answer whose upstream
    /// reported no usage or an invalid one.
    pub estimated: bool,
    /// Why the upstream's usage was refused, if it was (warned about with the request's ids).
    pub invalid_usage: Option<String>,
    /// Error code, if the request failed (or the stream broke).
    pub code: Option<String>,
    /// Who failed.
    pub source: Option<Source>,
    /// Status explanation for people.
    pub explanation: String,
    /// Time to the first byte sent to the client.
    pub ttfb: Option<Duration>,
    /// Why the model stopped, per choice (read only for traced requests).
    pub finish_reasons: Vec<String>,
}

impl Outcome {
    /// A successful, complete response.
    pub fn ok(status: u16, usage: Option<Usage>, ttfb: Option<Duration>) -> Self {
        Outcome {
            status,
            usage,
            estimated: false,
            invalid_usage: None,
            code: None,
            source: None,
            explanation: String::new(),
            ttfb,
            finish_reasons: Vec::new(),
        }
    }

    /// A successful response whose usage the upstream did not report validly: `estimate` is
    /// counted, and the log says why.
    pub fn estimated(
        status: u16,
        estimate: Usage,
        invalid_usage: Option<&str>,
        ttfb: Option<Duration>,
    ) -> Self {
        let mut outcome = Outcome::ok(status, Some(estimate), ttfb);
        outcome.estimated = true;
        outcome.invalid_usage = invalid_usage.map(str::to_owned);
        outcome
    }

    /// A failure.
    pub fn failed(
        status: u16,
        code: impl Into<String>,
        source: Source,
        explanation: impl Into<String>,
    ) -> Self {
        Outcome {
            status,
            usage: None,
            estimated: false,
            invalid_usage: None,
            code: Some(code.into()),
            source: Some(source),
            explanation: explanation.into(),
            ttfb: None,
            finish_reasons: Vec::new(),
        }
    }
}

/// Handles of the metrics every completed request updates, registered once: a labelled
/// `metrics::counter!` builds its key and looks it up in the registry on every call. Other
/// outcomes than a plain 200 use the macro.
struct RequestMetrics {
    /// `aigw_requests_total` of a 200 without error code, per endpoint.
    ok: [Counter; 3],
    /// `aigw_request_duration_seconds` per endpoint.
    duration: [Histogram; 3],
    prompt_tokens: Counter,
    completion_tokens: Counter,
}

impl RequestMetrics {
    fn get() -> &'static RequestMetrics {
        static HANDLES: OnceLock<RequestMetrics> = OnceLock::new();
        HANDLES.get_or_init(|| {
            // Handles taken before the recorder is installed would record nowhere.
            crate::observability::telemetry::metrics_handle();
            RequestMetrics {
                ok: Endpoint::ALL.map(|e| {
                    metrics::counter!("aigw_requests_total", "endpoint" => e.name(), "status" => "200",
                        "code" => "", "source" => "")
                }),
                duration: Endpoint::ALL
                    .map(|e| metrics::histogram!("aigw_request_duration_seconds", "endpoint" => e.name())),
                prompt_tokens: metrics::counter!("aigw_tokens_total", "kind" => "prompt"),
                completion_tokens: metrics::counter!("aigw_tokens_total", "kind" => "completion"),
            }
        })
    }
}

/// A request in progress, from authentication to its end.
pub struct Completion {
    state: AppState,
    caller: Arc<Caller>,
    endpoint: Endpoint,
    started: Instant,
    record: LogRecord,
    attempts: Vec<Attempt>,
    /// The credential and model whose request is out, until dispatch logs its attempt.
    under_way: Option<(Arc<Credential>, Arc<ModelRoute>)>,
    route: Option<Arc<ModelRoute>>,
    /// The credential that served (its answer may still be read).
    credential: Option<Arc<Credential>>,
    quota: Option<Arc<QuotaDecision>>,
    /// The serving credential's in-flight slot, freed when this completion ends (finished, or
    /// dropped with the stream when the client goes away).
    slot: Option<Slot>,
    /// The caller's place under its key's and member's `max_in_flight`, released the same way.
    in_flight: Option<InFlightGuard>,
    /// Language of the gateway's own messages for this request.
    pub locale: crate::config::Locale,
    /// The request's trace, when traces are exported.
    pub trace: Option<crate::observability::otel::RequestTrace>,
    /// How the breaker let the request through: the window its outcome belongs to.
    pub admission: crate::breaker::Admission,
    /// Whether its end was recorded (else dropping it records one: the request was abandoned).
    ended: bool,
}

impl Completion {
    /// Starts accounting for an authenticated request.
    pub fn start(
        state: AppState,
        caller: Arc<Caller>,
        endpoint: Endpoint,
        request_id: String,
        client_ip: String,
    ) -> Self {
        let record = LogRecord {
            request_id,
            ts: state.clock.now_ms(),
            workspace_id: caller.workspace_id,
            key_id: caller.key_id,
            member_id: caller.member_id,
            department_id: caller.department_id,
            endpoint: endpoint.name().to_owned(),
            client_ip: Some(client_ip),
            ..LogRecord::default()
        };
        let state_locale = state.settings.locale;
        Completion {
            state,
            caller,
            endpoint,
            started: Instant::now(),
            record,
            attempts: Vec::new(),
            under_way: None,
            route: None,
            credential: None,
            quota: None,
            slot: None,
            in_flight: None,
            locale: state_locale,
            trace: None,
            admission: crate::breaker::Admission::default(),
            ended: false,
        }
    }

    /// Whether the request's spans are recorded (its finish reasons are then read).
    pub fn traced(&self) -> bool {
        self.trace
            .as_ref()
            .is_some_and(crate::observability::otel::RequestTrace::sampled)
    }

    /// When the request started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Whether what ends now was cut by the gateway's stop (its `shutdown_grace_secs` over, the
    /// request dropped), not by its client.
    pub fn cut_by_stop(&self) -> bool {
        self.state.grace_over.is_cancelled()
    }

    /// The endpoint the client called (its format is the answer's).
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint
    }

    /// Notes the model asked for and whether it streams.
    pub fn requested(&mut self, model: &str, stream: bool) {
        self.record.model_requested = Some(model.to_owned());
        self.record.stream = i64::from(stream);
    }

    /// Notes the request's tags and end user.
    pub fn labelled(&mut self, tags: &crate::kernel::tags::Tags, end_user: Option<&str>) {
        self.record.tags = tags.stored();
        self.record.end_user = end_user.map(str::to_owned);
    }

    /// The gateway's shared state, and the key the request came with.
    pub fn state_and_key(&self) -> (&AppState, i64) {
        (&self.state, self.caller.key_id)
    }

    /// Notes the quota check; usage is added to its counters when the request completes.
    pub fn quota_checked(&mut self, decision: Arc<QuotaDecision>) {
        self.record.would_refuse = decision.would_refuse();
        self.quota = Some(decision);
    }

    /// Micro-credits of `usage` on the model that served (0 before one did).
    pub fn credits(&self, usage: Usage) -> i64 {
        self.route
            .as_ref()
            .map_or(0, |r| r.credits(usage.prompt, usage.completion))
    }

    /// The attempts made so far.
    pub fn attempts(&self) -> &[Attempt] {
        &self.attempts
    }

    /// What dispatch fills: the attempts, each with its span when the request is traced.
    pub fn dispatch_log(&mut self) -> AttemptLog<'_> {
        AttemptLog {
            attempts: &mut self.attempts,
            under_way: &mut self.under_way,
            trace: self.trace.as_ref(),
        }
    }

    /// Notes who served the request.
    pub fn served_by(
        &mut self,
        route: Arc<ModelRoute>,
        credential: Arc<Credential>,
        upstream_latency: Duration,
    ) {
        self.record.model_served = Some(route.name.clone());
        self.record.upstream_id = Some(credential.id);
        self.record.upstream_latency_ms = Some(upstream_latency.as_millis() as i64);
        self.route = Some(route);
        self.credential = Some(credential);
    }

    /// A deadline passed while the serving credential's answer was read (its body stalled): the
    /// credential is classified and parked as for an upstream 5xx, and its attempt in the log
    /// says so.
    pub fn serving_timed_out(&mut self, missed: &Missed) {
        let (Some(cred), Some(route)) = (&self.credential, &self.route) else {
            return;
        };
        let Some(upstream_model) = cred.models.get(&route.name) else {
            return;
        };
        // The served attempt is the last one; it gets the classification of its stall.
        let mut attempt = self.attempts.pop().unwrap_or_else(|| Attempt::of(cred, route));
        dispatch::time_out(self.state.upstreams(), cred, upstream_model, missed, &mut attempt);
        self.attempts.push(attempt);
    }

    /// Holds the serving credential's in-flight slot until the request completes.
    pub fn hold(&mut self, slot: Slot) {
        self.slot = Some(slot);
    }

    /// Holds the caller's in-flight place until the request completes.
    pub fn hold_in_flight(&mut self, guard: InFlightGuard) {
        self.in_flight = Some(guard);
    }

    /// What the attempts say, for the status explanation.
    pub fn attempts_summary(&self) -> String {
        self.attempts
            .iter()
            .map(|a| match (a.status, a.rule, &a.error) {
                (Some(s), Some(rule), _) => match &a.lock_until {
                    Some(until) => format!("{} {s} ({rule}, locked until {until})", a.credential),
                    None => format!("{} {s} ({rule})", a.credential),
                },
                (Some(s), None, _) => format!("{} {s}", a.credential),
                (None, _, Some(e)) => format!("{} {e}", a.credential),
                (None, _, None) => a.credential.clone(),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Records the end of the request: usage, breaker outcome, log, metrics. Returns true when
    /// this outcome banned the key (its answer then carries the ban's first wording).
    pub fn finish(mut self, outcome: Outcome) -> bool {
        self.end(outcome, true)
    }

    /// What `finish` records; an abandoned request (no status went to its client) is not a
    /// breaker outcome.
    fn end(&mut self, outcome: Outcome, breaker_outcome: bool) -> bool {
        self.ended = true;
        let elapsed = self.started.elapsed();
        let usage = outcome.usage.unwrap_or_default();
        let credits = self.credits(usage);
        // Counted after completion: only what an upstream served (client disconnect included).
        if let (Some(_), Some(q)) = (&self.route, &self.quota) {
            self.state.quota.record(q, usage, credits);
        }
        // The credential's own tokens/minute count what it served, in the minute it completed.
        if let (Some(_), Some(credential)) = (&self.route, self.record.upstream_id)
            && usage.total() > 0
        {
            self.state
                .admission
                .count_tokens(credential, usage.total(), self.state.clock.now_ms());
        }
        self.slot = None;
        self.in_flight = None;
        let r = &mut self.record;
        if let Some(why) = &outcome.invalid_usage {
            tracing::warn!(
                request_id = %r.request_id,
                upstream = r.upstream_id,
                model = r.model_served.as_deref().unwrap_or_default(),
                reason = %why,
                "upstream reported invalid usage; counting the gateway's estimate instead"
            );
        }
        r.status = i64::from(outcome.status);
        r.code = outcome.code;
        r.source = outcome.source.map(|s| s.as_str().to_owned());
        r.explanation = outcome.explanation;
        if outcome.estimated && r.explanation.is_empty() {
            r.explanation = match &outcome.invalid_usage {
                Some(why) => format!("usage estimated: the upstream's usage was invalid ({why})"),
                None => "usage estimated: the upstream reported none".to_owned(),
            };
        }
        let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        r.prompt_tokens = tokens(usage.prompt);
        r.completion_tokens = tokens(usage.completion);
        r.total_tokens = tokens(usage.total());
        r.credits = credits;
        r.usage_estimated = i64::from(outcome.estimated);
        r.latency_ms = elapsed.as_millis() as i64;
        r.ttfb_ms = outcome.ttfb.map(|t| t.as_millis() as i64);
        r.attempts = self.attempts.len() as i64;
        for a in &mut self.attempts {
            a.translated = Translation::of(self.endpoint, a.provider).map(Translation::name);
        }
        if r.upstream_id.is_none() {
            r.upstream_id = self.attempts.last().map(|a| a.credential_id);
        }
        r.attempts_detail = serde_json::to_string(&self.attempts).unwrap_or_else(|_| "[]".to_owned());

        let m = RequestMetrics::get();
        let e = self.endpoint as usize;
        if outcome.status == 200 && r.code.is_none() && r.source.is_none() {
            m.ok[e].increment(1);
        } else {
            metrics::counter!(
                "aigw_requests_total",
                "endpoint" => self.endpoint.name(),
                "status" => outcome.status.to_string(),
                "code" => r.code.clone().unwrap_or_default(),
                "source" => r.source.clone().unwrap_or_default()
            )
            .increment(1);
        }
        m.duration[e].record(elapsed.as_secs_f64());
        if usage.total() > 0 {
            m.prompt_tokens.increment(usage.prompt);
            m.completion_tokens.increment(usage.completion);
        }
        let record = std::mem::take(&mut self.record);

        // Every logged request's final status is a breaker outcome (status >= 400 fails).
        let trip = breaker_outcome
            .then(|| {
                self.state.breakers.record(
                    self.caller.key_id,
                    self.state.clock.now_ms(),
                    outcome.status,
                    self.admission,
                )
            })
            .flatten();
        let banned = trip.as_ref().is_some_and(|t| t.banned);
        if let Some(trace) = &self.trace {
            let breaker = match &trip {
                Some(t) if t.banned => "banned",
                Some(_) => "tripped",
                None => "closed",
            };
            let quota = self.quota.as_deref();
            let done = super::spans::Finished {
                record: &record,
                attempts: &self.attempts,
                quota,
                breaker,
                finish_reasons: &outcome.finish_reasons,
            };
            super::spans::finished(&self.state, trace, self.endpoint, &self.caller, done);
        }
        self.state.logs.send(record);
        if let Some(t) = trip {
            tracing::warn!(
                key = self.caller.key_id,
                trip = t.trip,
                banned = t.banned,
                "API key breaker tripped"
            );
            let (state, key) = (self.state.clone(), self.caller.key_id);
            // Trips are rare; persisting one never holds up the response.
            self.state.spawn_background(async move {
                state
                    .store
                    .write_until_done("persisting a breaker trip", &state.shutdown, || {
                        crate::breaker::persist(&state.store, key, &t)
                    })
                    .await;
            });
        }
        banned
    }
}

/// The status logged for a request abandoned before its answer (nginx's "client closed request"):
/// no status went to the client.
const ABANDONED: u16 = 499;

impl Drop for Completion {
    /// Dropped before its end was recorded: the request's future was dropped while it waited
    /// (its client went away, or the stop's grace ended, before the upstream answered), or a
    /// bug panicked on its path. Logged with what was attempted; nothing was served, so nothing
    /// is counted.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // The attempt under way, if one was, is the last: the credential it was waiting for.
        if let Some((credential, model)) = self.under_way.take() {
            self.attempts.push(Attempt {
                error: Some("no answer yet".to_owned()),
                ..Attempt::of(&credential, &model)
            });
        }
        let summary = match self.attempts_summary() {
            s if s.is_empty() => s,
            s => format!(" [{s}]"),
        };
        let outcome = if std::thread::panicking() {
            // The connection is closed without an answer, as for a 500 of the gateway's own.
            Outcome::failed(
                500,
                "internal_error",
                Source::Gateway,
                format!("Gateway: the request failed inside the gateway (a bug: see its log){summary}"),
            )
        } else if self.cut_by_stop() {
            Outcome::failed(
                ABANDONED,
                "gateway_stopped",
                Source::Gateway,
                format!("Gateway: stopped before the answer (shutdown_grace_secs over){summary}"),
            )
        } else {
            Outcome {
                source: None,
                ..Outcome::failed(
                    ABANDONED,
                    "client_disconnected",
                    Source::Gateway,
                    format!("client disconnected before the answer{summary}"),
                )
            }
        };
        self.end(outcome, false);
    }
}
