//! What a request's spans say (OpenTelemetry GenAI semantic conventions, plus aigw's own
//! attributes): ids, models, tokens, statuses and decisions — never a secret, a prompt or an
//! answer.

use crate::error::ApiError;
use crate::kernel::caller::Caller;
use crate::observability::otel::{RequestTrace, SpanRecord};
use crate::provider::Provider;
use crate::provider::adapter::Endpoint;
use crate::quota::engine::QuotaDecision;
use crate::request_log::LogRecord;
use crate::state::AppState;
use crate::upstream::dispatch::Attempt;

/// `gen_ai.operation.name` of an endpoint.
fn operation(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::ChatCompletions | Endpoint::Messages => "chat",
        Endpoint::Embeddings => "embeddings",
    }
}

/// `gen_ai.provider.name`: the convention's well-known value where it has one.
fn provider_name(p: Provider) -> &'static str {
    match p {
        Provider::Gemini => "gcp.gemini",
        Provider::Azure => "azure.ai.openai",
        Provider::Bedrock => "aws.bedrock",
        Provider::Google => "gcp.gemini",
        other => other.as_str(),
    }
}

/// The attributes every request span has.
fn request_span(endpoint: Endpoint, model: Option<&str>) -> SpanRecord {
    let op = operation(endpoint);
    let mut span = SpanRecord::request(match model {
        Some(m) => format!("{op} {m}"),
        None => op.to_owned(),
    });
    span.set("gen_ai.operation.name", op);
    span.set("http.request.method", "POST");
    span.set("http.route", endpoint.path());
    if let Some(m) = model {
        span.set("gen_ai.request.model", m.to_owned());
    }
    span
}

fn caller_ids(span: &mut SpanRecord, caller: &Caller) {
    span.set("aigw.key.id", caller.key_id);
    span.set("aigw.member.id", caller.member_id);
    if let Some(d) = caller.department_id {
        span.set("aigw.department.id", d);
    }
    span.set("aigw.workspace.id", caller.workspace_id);
}

fn status(span: &mut SpanRecord, status: u16, code: Option<&str>) {
    span.set("http.response.status_code", i64::from(status));
    if let Some(code) = code {
        span.set("error.type", code.to_owned());
        // A server span fails on a 5xx; a refusal (4xx) is the caller's error, not ours.
        if status >= 500 {
            span.failed(code.to_owned());
        }
    }
}

/// A request refused before it was logged (unknown or expired key, breaker open or banned): one
/// span, no attempts.
pub fn refused(
    state: &AppState,
    trace: Option<&RequestTrace>,
    endpoint: Endpoint,
    caller: Option<&Caller>,
    e: &ApiError,
) {
    let Some(trace) = trace else { return };
    let mut span = request_span(endpoint, None);
    if let Some(c) = caller {
        caller_ids(&mut span, c);
        let breaker = match e {
            ApiError::KeyBanned { .. } => "banned",
            _ => "open",
        };
        span.set("aigw.breaker.state", breaker);
    }
    status(&mut span, e.status().as_u16(), Some(e.code()));
    state.tracer.finish(trace, span, Vec::new());
}

/// What a logged request leaves for its spans.
pub struct Finished<'a> {
    /// Its request log.
    pub record: &'a LogRecord,
    /// Its attempts.
    pub attempts: &'a [Attempt],
    /// Its quota check, if it got that far.
    pub quota: Option<&'a QuotaDecision>,
    /// The key's breaker after it: closed, tripped or banned.
    pub breaker: &'static str,
    /// Why the model stopped.
    pub finish_reasons: &'a [String],
}

/// The finish reasons of a complete answer in `endpoint`'s format (OpenAI's per-choice
/// `finish_reason`, Anthropic's `stop_reason`).
pub fn finish_reasons(endpoint: Endpoint, body: &[u8]) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Choice {
        finish_reason: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(default)]
        choices: Vec<Choice>,
        stop_reason: Option<String>,
    }
    let Ok(a) = serde_json::from_slice::<Answer>(body) else {
        return Vec::new();
    };
    match endpoint {
        Endpoint::Messages => a.stop_reason.into_iter().collect(),
        _ => a
            .choices
            .into_iter()
            .filter_map(|c| c.finish_reason)
            .take(8)
            .collect(),
    }
}

/// A logged request's spans: the request's, and one per upstream attempt that sent a request.
pub fn finished(
    state: &AppState,
    trace: &RequestTrace,
    endpoint: Endpoint,
    caller: &Caller,
    done: Finished<'_>,
) {
    let Finished {
        record: r,
        attempts,
        quota,
        breaker,
        finish_reasons,
    } = done;
    let op = operation(endpoint);
    let mut span = request_span(endpoint, r.model_requested.as_deref());
    caller_ids(&mut span, caller);
    span.set("aigw.request_id", r.request_id.clone());
    span.set("aigw.stream", r.stream != 0);
    span.set("aigw.attempts", r.attempts);
    span.set("aigw.breaker.state", breaker);
    if let Some(q) = quota {
        let decision = if q.refusal().is_some() {
            "refused"
        } else if r.would_refuse.is_some() {
            "would_refuse"
        } else {
            "allowed"
        };
        span.set("aigw.quota.decision", decision);
    }
    if let Some(m) = &r.model_served {
        span.set("gen_ai.response.model", m.clone());
    }
    let served = r.model_served.is_some();
    if served && let Some(a) = attempts.last() {
        span.set("gen_ai.provider.name", provider_name(a.provider));
        span.set("gen_ai.system", provider_name(a.provider));
    }
    if r.total_tokens > 0 {
        span.set("gen_ai.usage.input_tokens", r.prompt_tokens);
        span.set("gen_ai.usage.output_tokens", r.completion_tokens);
        span.set("aigw.usage.estimated", r.usage_estimated != 0);
    }
    if !finish_reasons.is_empty() {
        let reasons: Vec<opentelemetry::StringValue> =
            finish_reasons.iter().map(|r| r.clone().into()).collect();
        span.set(
            "gen_ai.response.finish_reasons",
            opentelemetry::Value::Array(opentelemetry::Array::String(reasons)),
        );
    }
    let status_code = u16::try_from(r.status).unwrap_or(0);
    status(&mut span, status_code, r.code.as_deref());

    let last = attempts.len().saturating_sub(1);
    let spans = attempts
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let sent = a.span.as_ref()?;
            // The attempt that served lasts until the response to the client ends.
            let serving = served && i == last;
            let mut s = SpanRecord::attempt(format!("{op} {}", a.model), sent, serving);
            s.set("gen_ai.operation.name", op);
            s.set("gen_ai.request.model", a.model.clone());
            s.set("gen_ai.provider.name", provider_name(a.provider));
            s.set("gen_ai.system", provider_name(a.provider));
            s.set("aigw.attempt.number", i as i64 + 1);
            s.set("aigw.credential.id", a.credential_id);
            s.set("aigw.credential.name", a.credential.clone());
            if let Some(st) = a.status {
                s.set("http.response.status_code", i64::from(st));
            }
            if let Some(rule) = a.rule {
                s.set("aigw.classification", rule);
            }
            if let Some(until) = &a.lock_until {
                s.set("aigw.lock_until", until.clone());
            }
            if let Some(t) = a.translated {
                s.set("aigw.translated", t);
            }
            match (a.status, &a.error) {
                (_, Some(e)) => {
                    s.set("error.type", "connection");
                    s.failed(e.clone());
                }
                (Some(st), None) if st >= 400 => {
                    s.set("error.type", st.to_string());
                    s.failed(a.rule.unwrap_or("upstream error"));
                }
                _ => {}
            }
            Some(s)
        })
        .collect();
    state.tracer.finish(trace, span, spans);
}
