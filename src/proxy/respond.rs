//! Step 9 of the request path: the answer to a dispatched request, streamed or whole, or the
//! upstream's error passed on. Each ends the path ([`End`]); what every answer tells besides its
//! body and the accounting are the after-work's ([`super::after`]).

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use chrono::{DateTime, Utc};

use crate::deadline::Deadline;
use crate::error::ERROR_SOURCE;
use crate::provider::Credential;
use crate::provider::adapter::{Endpoint, UsageReport};
use crate::provider::sse::SseTap;
use crate::provider::usage;
use crate::state::AppState;
use crate::translate::stream::StreamTranslator;
use crate::translate::{self, Translation};
use crate::upstream::dispatch::{Answer, Complete, Dispatched, UpstreamError};

use super::after::{End, Used};
use super::answer_headers::tell_the_wait;
use super::body::ProxyBody;
use super::completion::{Completion, Outcome, Source};
use super::{spans, stream};

/// What answering needs of the request.
pub(super) struct Asked<'a> {
    pub state: &'a AppState,
    /// The endpoint the client called (its format is the answer's).
    pub endpoint: Endpoint,
    pub body: &'a ProxyBody,
    /// Whether the gateway asked a stream for its usage itself (then not passed on as such).
    pub strip_usage: bool,
    pub deadline: Deadline,
    /// When the quota was checked: the time the answer's waits are told from.
    pub now: DateTime<Utc>,
}

/// The answer to what dispatch came back with: the served answer, streamed or whole, the last
/// upstream error, or the gateway's own failure.
pub(super) async fn dispatched(asked: &Asked<'_>, mut completion: Completion, dispatched: Dispatched) -> End {
    match dispatched {
        Dispatched::Served {
            answer,
            credential,
            model,
            upstream_latency,
            slot,
        } => {
            let translation = Translation::of(asked.endpoint, credential.provider);
            completion.served_by(model, credential.clone(), upstream_latency);
            // The credential's in-flight slot is freed when the request completes.
            completion.hold(slot);
            match answer {
                Answer::Stream(response) => {
                    stream(asked, completion, translation, &credential, response).await
                }
                Answer::Complete(whole) => complete(asked, completion, translation, whole),
            }
        }
        Dispatched::UpstreamFailed(error) => upstream_error(asked, completion, error),
        Dispatched::GatewayFailed(e) => End::Refused(completion, e),
    }
}

/// A served stream: its head leaves with what the upstream has already sent, in one write; the
/// completion ends with the stream. A stream that failed before its first byte is refused.
async fn stream(
    asked: &Asked<'_>,
    completion: Completion,
    translation: Option<Translation>,
    credential: &Credential,
    response: crate::transport::http::Response,
) -> End {
    let status = response.status().as_u16();
    // The tap reads the upstream's own events (usage, errors); a translated stream is rewritten
    // after it, in the client's format.
    let upstream_endpoint = translation.map_or(asked.endpoint, Translation::upstream_endpoint);
    let mut tap = SseTap::new(
        upstream_endpoint,
        asked.strip_usage && translation.is_none(),
        asked.state.settings.max_usage_tokens,
    )
    .masking(credential.mask.clone());
    if translation.is_some() {
        // An event too large to translate is not held either.
        tap = tap.dropping_oversized();
    }
    // Boxed at once: the stream is large, and moved several times on its way into the body.
    let mut stream = Box::new(stream::ProxyStream::new(
        response,
        tap,
        completion,
        asked.body.len,
        asked.deadline,
    ));
    if let Some(t) = translation {
        stream.translate(StreamTranslator::new(t, !asked.strip_usage, &asked.body.model));
    }
    let first = futures::StreamExt::next(&mut stream).await;
    if let Some((completion, e)) = stream.failed_before_the_head() {
        return End::Refused(completion, e);
    }
    let body = futures::StreamExt::chain(futures::stream::iter(first), stream);
    let mut resp = Response::new(Body::from_stream(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    End::Streaming(resp)
}

/// A served complete answer, counted with the upstream's usage if valid, else the gateway's
/// estimate.
fn complete(
    asked: &Asked<'_>,
    completion: Completion,
    translation: Option<Translation>,
    complete: Complete,
) -> End {
    let Complete {
        status,
        content_type,
        body: mut bytes,
        usage: (native, usage_block),
    } = complete;
    let endpoint = asked.endpoint;
    let ceiling = asked.state.settings.max_usage_tokens;
    let reported = match usage_block {
        Some(block) => UsageReport::read_raw(native, &block, ceiling),
        None => UsageReport::Missing,
    };
    let ttfb = Some(completion.started().elapsed());
    let mut outcome = match &reported {
        UsageReport::Valid(u) => Outcome::ok(status, Some(*u), ttfb),
        _ => {
            let answer = usage::answer_tokens(endpoint, &bytes);
            let estimate = usage::estimate(asked.body.len, answer, &reported, ceiling);
            if translation.is_some() {
                // The gateway wrote this answer: it tells the client what it counts.
                bytes = translate::with_usage(endpoint, &bytes, estimate);
            }
            Outcome::estimated(status, estimate, reported.invalid_reason(), ttfb)
        }
    };
    if completion.traced() {
        outcome.finish_reasons = spans::finish_reasons(endpoint, &bytes);
    }
    let usage = outcome.usage.unwrap_or_default();
    let used = Used::Served {
        usage,
        credits: completion.credits(usage),
    };
    let mut resp = Response::new(Body::from(bytes));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let content_type = match translation {
        Some(_) => None,
        None => content_type,
    };
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        content_type.unwrap_or(HeaderValue::from_static("application/json")),
    );
    End::Answered {
        completion,
        outcome,
        response: resp,
        used,
    }
}

/// Every candidate failed: the last upstream error goes back as is, classified and logged in
/// the provider's own shape, rendered in the client's, with the wait its lock tells.
fn upstream_error(asked: &Asked<'_>, completion: Completion, error: UpstreamError) -> End {
    let explanation = format!("Upstream: {}", completion.attempts_summary());
    let code = upstream_code(&error.body);
    let outcome = Outcome::failed(error.status, code, Source::Upstream, explanation);
    let translation = Translation::of(asked.endpoint, error.provider);
    let body = match translation {
        Some(t) => translate::error_body(t, error.status, &error.body),
        None => error.body,
    };
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = StatusCode::from_u16(error.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let h = resp.headers_mut();
    h.extend(error.headers);
    if translation.is_some() {
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    h.insert(ERROR_SOURCE, HeaderValue::from_static("upstream"));
    tell_the_wait(h, error.lock_until, asked.now);
    End::Answered {
        completion,
        outcome,
        response: resp,
        used: Used::Nothing,
    }
}

/// The upstream error's own code, for the log (`error.code`, else `error.type`).
fn upstream_code(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let e = if v.is_array() { &v[0]["error"] } else { &v["error"] };
    e.get("code")
        .and_then(|c| {
            c.as_str()
                .map(str::to_owned)
                .or_else(|| c.as_u64().map(|n| n.to_string()))
        })
        .or_else(|| e.get("type").and_then(|t| t.as_str()).map(str::to_owned))
        .unwrap_or_else(|| "upstream_error".to_owned())
}
