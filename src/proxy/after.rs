//! The after-work of a proxied request, in one place: however [`super::handle`]'s steps end
//! ([`End`]), [`finish`] records the end (request metrics, span, log row, breaker outcome,
//! usage: [`Completion::finish`]) and adds what the answer tells besides its body: the routing
//! headers once dispatched, then the quota headers once the quota was checked ([`Told`]).

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};

use crate::breaker::Refusal;
use crate::config::Locale;
use crate::error::ApiError;
use crate::kernel::caller::Caller;
use crate::kernel::usage::Usage;
use crate::observability::otel::RequestTrace;
use crate::provider::adapter::Endpoint;
use crate::quota::engine::{self, QuotaDecision};
use crate::quota::{self, Metric};
use crate::state::AppState;

use super::answer_headers::Routed;
use super::completion::{Completion, Outcome, Source};
use super::spans;

/// How the request path ended.
#[expect(
    clippy::large_enum_variant,
    reason = "one per request, moved once into the after-work; boxing would allocate on every request"
)]
pub(super) enum End {
    /// The key was refused (step 1): counted and traced, neither logged nor a breaker outcome.
    Unauthenticated {
        error: ApiError,
        trace: Option<RequestTrace>,
    },
    /// The key's breaker is open or banned (step 2): traced only.
    Gated {
        caller: Arc<Caller>,
        error: ApiError,
        trace: Option<RequestTrace>,
    },
    /// Refused by the gateway after the completion started: logged as its refusal.
    Refused(Completion, ApiError),
    /// Answered whole (served, or the upstream's error passed on): logged with its outcome.
    Answered {
        completion: Completion,
        outcome: Outcome,
        response: Response,
        used: Used,
    },
    /// A stream whose head leaves now: its completion rides in the body and ends with it.
    Streaming(Response),
}

/// What the request used of its quota when its answer leaves, for the quota headers.
#[derive(Clone, Copy)]
pub(super) enum Used {
    /// Nothing was served.
    Nothing,
    /// A stream's head leaves before its body: only the request itself is known.
    OneRequest,
    /// A complete answer: its usage and credits.
    Served { usage: Usage, credits: i64 },
}

impl Used {
    fn amount(self, m: Metric) -> i64 {
        match self {
            Used::Nothing => 0,
            Used::OneRequest => i64::from(m == Metric::Requests),
            Used::Served { usage, credits } => engine::amount(m, usage, credits),
        }
    }
}

/// What the answer tells besides its body, learnt as the steps pass: the quota decision (and
/// the time it was made at) from step 5, the route from step 8.
#[derive(Default)]
pub(super) struct Told {
    pub quota: Option<(Arc<QuotaDecision>, DateTime<Utc>)>,
    pub route: Option<Routed>,
}

/// The after-work, once, for every end of the request path.
pub(super) fn finish(state: &AppState, endpoint: Endpoint, told: Told, end: End) -> Response {
    let (mut resp, used) = match end {
        End::Unauthenticated { error, trace } => {
            metrics::counter!("aigw_requests_total", "endpoint" => endpoint.name(), "status" => error.status().as_str().to_owned(),
                "code" => error.code(), "source" => "gateway")
            .increment(1);
            spans::refused(state, trace.as_ref(), endpoint, None, &error);
            return error.into_response();
        }
        End::Gated { caller, error, trace } => {
            spans::refused(state, trace.as_ref(), endpoint, Some(&caller), &error);
            return error.into_response();
        }
        End::Refused(completion, e) => (refuse(completion, e), Used::Nothing),
        End::Answered {
            completion,
            outcome,
            response,
            used,
        } => {
            let ban = BanContext::of(&completion);
            if completion.finish(outcome) {
                // The ban's first wording replaces the answer; it tells the route, not the quota.
                let mut resp = ban.answer();
                if let Some(route) = &told.route {
                    route.insert(resp.headers_mut());
                }
                return resp;
            }
            (response, used)
        }
        End::Streaming(resp) => (resp, Used::OneRequest),
    };
    if let Some(route) = &told.route {
        route.insert(resp.headers_mut());
    }
    if let Some((decision, now)) = &told.quota
        && !decision.standings.is_empty()
    {
        quota::headers::quota_headers(resp.headers_mut(), decision, |m| used.amount(m), *now);
    }
    resp
}

/// Answers a gateway refusal and logs it.
fn refuse(completion: Completion, e: ApiError) -> Response {
    let summary = completion.attempts_summary();
    let explanation = if summary.is_empty() {
        format!("Gateway: {e}")
    } else {
        format!("Gateway: {e} [{summary}]")
    };
    let ban = BanContext::of(&completion);
    if completion.finish(Outcome::failed(
        e.status().as_u16(),
        e.code(),
        Source::Gateway,
        explanation,
    )) {
        return ban.answer();
    }
    e.into_response()
}

/// The refusal of an open or banned breaker.
pub(super) fn breaker_error(refusal: &Refusal, locale: Locale) -> ApiError {
    match refusal {
        Refusal::Open {
            retry_after,
            blocked_until,
        } => ApiError::CircuitOpen {
            message: refusal.message(locale),
            retry_after: *retry_after,
            blocked_until: blocked_until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        },
        Refusal::Banned { .. } => ApiError::KeyBanned {
            message: refusal.message(locale),
        },
    }
}

/// What is needed to answer the request that banned its key.
struct BanContext {
    state: AppState,
    key_id: i64,
    locale: Locale,
}

impl BanContext {
    /// What answering a ban needs, taken before `finish` consumes the completion.
    fn of(completion: &Completion) -> BanContext {
        let (state, key_id) = completion.state_and_key();
        BanContext {
            state: state.clone(),
            key_id,
            locale: completion.locale,
        }
    }

    /// The ban's first wording, told to the request whose outcome banned the key.
    fn answer(self) -> Response {
        self.state.breakers.announce(self.key_id);
        breaker_error(&Refusal::Banned { first: true }, self.locale).into_response()
    }
}
