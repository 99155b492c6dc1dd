//! The `/v1` proxy. [`handle`] is the whole request path, in the order of DESIGN.md §1.

mod answer_headers;
pub mod authenticated;
pub mod body;
pub mod completion;
mod envelope;
mod my_quota;
mod spans;
pub mod stream;

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::breaker::Refusal;
use crate::config::Locale;
use crate::deadline::Deadline;
use crate::error::{ApiError, ERROR_SOURCE, QuotaRefusal};
use crate::provider::adapter::{self, Endpoint, UsageReport};
use crate::provider::sse::SseTap;
use crate::provider::usage;
use crate::quota::engine::{QuotaDecision, display_value};
use crate::quota::window::format_reset_at;
use crate::quota::{self, Metric};
use crate::request_id::RequestId;
use crate::state::AppState;
use crate::tags::{self, Tags};
use crate::translate::stream::StreamTranslator;
use crate::translate::{self, Translation};
use crate::upstream::dispatch::{self, Answer, Complete, Dispatched};
use answer_headers::{Routed, tell_the_wait};
use authenticated::Authenticated;
use completion::{Completion, Outcome, Source};

crate::state::route_table! {
    /// The proxy's routes.
    pub fn routes;
    post "/v1/chat/completions" => chat_completions;
    post "/v1/embeddings" => embeddings;
    post "/v1/messages" => messages;
    get "/v1/models" => models;
    get "/v1/quota" => my_quota::my_quota;
}

/// The caller of a proxied request, or why its key was refused.
type Authentication = Result<Authenticated, ApiError>;

async fn chat_completions(
    state: State<AppState>,
    peer: ConnectInfo<SocketAddr>,
    caller: Authentication,
    req: Request,
) -> Response {
    handle(state.0, Endpoint::ChatCompletions, peer.0, caller, req).await
}

async fn embeddings(
    state: State<AppState>,
    peer: ConnectInfo<SocketAddr>,
    caller: Authentication,
    req: Request,
) -> Response {
    handle(state.0, Endpoint::Embeddings, peer.0, caller, req).await
}

async fn messages(
    state: State<AppState>,
    peer: ConnectInfo<SocketAddr>,
    caller: Authentication,
    req: Request,
) -> Response {
    envelope::in_anthropic_envelope(handle(state.0, Endpoint::Messages, peer.0, caller, req).await).await
}

/// The request path: authenticate, read and check the body, route, dispatch, respond, and
/// account for the request after it completes.
pub async fn handle(
    state: AppState,
    endpoint: Endpoint,
    peer: SocketAddr,
    caller: Authentication,
    req: Request,
) -> Response {
    // The caller's trace, continued (when traces are exported).
    let trace = state.tracer.request(req.headers());
    // 1. Authenticate (the extractor): key → member → department → workspace (cached), the
    //    key's expiry and a rotated secret's grace judged by the clock. Not logged nor counted
    //    toward a breaker when refused: an unknown key belongs to no workspace, and nothing was
    //    attempted for an expired one.
    let caller = match caller {
        Ok(Authenticated(c)) => c,
        Err(e) => {
            metrics::counter!("aigw_requests_total", "endpoint" => endpoint.name(), "status" => e.status().as_str().to_owned(),
                "code" => e.code(), "source" => "gateway")
            .increment(1);
            spans::refused(&state, trace.as_ref(), endpoint, None, &e);
            return e.into_response();
        }
    };
    // 2. Breaker gate: an open or banned key is refused before anything else, neither counted
    //    nor logged.
    let locale = locale_of(&state, req.headers());
    let admission = match state.breakers.gate(caller.key_id, state.clock.now()) {
        Ok(admission) => admission,
        Err(refusal) => {
            let e = breaker_error(&refusal, locale);
            spans::refused(&state, trace.as_ref(), endpoint, Some(&caller), &e);
            return e.into_response();
        }
    };
    let request_id = req
        .extensions()
        .get::<RequestId>()
        .map(|r| r.encode(&mut [0; 36]).to_owned())
        .unwrap_or_default();
    let client = state.client_ip(peer, req.headers());
    let mut completion = Completion::start(
        state.clone(),
        caller.clone(),
        endpoint,
        request_id,
        client.to_string(),
    );
    completion.locale = locale;
    completion.trace = trace;
    completion.admission = admission;

    // 3. Read and check the body (size and time limits, JSON, required fields).
    let (parts, body) = req.into_parts();
    let settings = &state.settings;
    let read = body::read(
        body,
        &parts.headers,
        settings.max_body_bytes,
        Deadline::for_body(settings),
        endpoint,
    );
    let mut body = match read.await {
        Ok(b) => b,
        Err(e) => return refuse(completion, e),
    };
    completion.requested(&body.model, body.stream);

    // 3b. Tags and end user (`x-aigw-tags`, `x-aigw-end-user` or the body's `user`, on messages
    //     `metadata.user_id` first), stored on the log; a tag outside the key's `allowed_tags`
    //     is refused before any quota or upstream work, like a model outside its allow-list.
    let (tags, end_user) = match labels(&parts.headers, &body, endpoint) {
        Ok(l) => l,
        Err(e) => return refuse(completion, e),
    };
    completion.labelled(&tags, end_user.as_deref());
    if let Err(e) = tags_allowed(&tags, &caller) {
        return refuse(completion, e);
    }

    // 4. Model allow-list (the key's and its member's): before any quota or upstream work.
    if let Err(by) = caller.models.check(&body.model) {
        return refuse(
            completion,
            ApiError::ModelNotAllowed {
                model: body.model,
                by,
            },
        );
    }

    // 5. Quota pre-check: every policy on the key, member, department and workspace, and on
    //    the request's tag values and end user (their subject ids, made on first sight under
    //    the workspace's caps).
    let labels = match state
        .labels
        .resolve(
            &state.store,
            state.label_caps(),
            state.labels_brought_by(caller.key_id),
            caller.workspace_id,
            &tags,
            end_user.as_deref(),
            state.clock.now_ms(),
        )
        .await
    {
        Ok(l) => l,
        Err(e) => return refuse(completion, e),
    };
    let routes = state.routes.load();
    let workspace = routes.workspaces.get(&caller.workspace_id);
    let tz = state.timezone_of(caller.workspace_id);
    let now = state.clock.now();
    let quota = match state
        .quota
        .check_request(&state.store, &state.policies.load(), &caller, &labels, now, tz)
        .await
    {
        Ok(q) => Arc::new(q),
        Err(e) => return refuse(completion, ApiError::from(e)),
    };
    completion.quota_checked(quota.clone());
    count_quota_refusals(&quota);
    let untouched = |_: Metric| 0;
    if let Some(s) = quota.refusal() {
        let err = ApiError::QuotaExceeded(Box::new(QuotaRefusal {
            subject: s.rule.subject.as_str(),
            metric: s.rule.metric.as_str(),
            window: s.rule.window.to_string(),
            limit: display_value(s.rule.metric, s.rule.limit),
            used: display_value(s.rule.metric, s.used),
            reset_at: s.reset_at.as_ref().map(format_reset_at),
            subject_name: labels.name_of(s.rule.subject, s.key.subject_id),
        }));
        return with_quota(refuse(completion, err), &quota, untouched, now);
    }

    // 6. Concurrency cap (the key's and its member's `max_in_flight`, on this gateway): the
    //    place is held until the request ends, its stream finished or cut included.
    match state
        .in_flight
        .admit(caller.in_flight, caller.key_id, caller.member_id)
    {
        Ok(place) => completion.hold_in_flight(place),
        Err(over) => {
            let err = ApiError::ConcurrencyLimit {
                by: over.by,
                limit: over.limit,
            };
            return with_quota(refuse(completion, err), &quota, untouched, now);
        }
    }

    // 7. Route: the model and its fallback chain in the caller's workspace, without the models
    //    the caller may not call.
    let mut chain = workspace.map(|ws| ws.chain(&body.model)).unwrap_or_default();
    chain.retain(|m| caller.models.allows(&m.name));
    if chain.is_empty() {
        let resp = refuse(completion, ApiError::ModelNotFound { model: body.model });
        return with_quota(resp, &quota, untouched, now);
    }

    // 8. Dispatch within the deadline (the whole answer, or a stream's first byte); failures are
    //    classified and the chain moves on.
    let strip_usage = body.stream
        && endpoint == Endpoint::ChatCompletions
        && adapter::request_stream_usage(&mut body.fields);
    let deadline = Deadline::for_request(&state.settings, body.stream);
    let dispatched = dispatch::dispatch(
        state.upstreams(),
        endpoint,
        &body.fields,
        &chain,
        &parts.headers,
        workspace.map(|w| &w.quota_groups),
        caller.member_id,
        deadline,
        completion.dispatch_log(),
    )
    .await;
    // What routed the request, told on every answer from here on (DESIGN.md §10, §11).
    let route = Routed::after_dispatch(completion.attempts(), &chain, endpoint);

    // 9. Respond; accounting runs when the response (or stream) is complete.
    match dispatched {
        Dispatched::Served {
            answer,
            credential,
            model,
            upstream_latency,
            slot,
        } => {
            let translation = Translation::of(endpoint, credential.provider);
            completion.served_by(model, credential.clone(), upstream_latency);
            // The credential's in-flight slot is freed when the request completes.
            completion.hold(slot);
            let Complete {
                status,
                content_type,
                body: mut bytes,
                usage: (native, usage_block),
            } = match answer {
                Answer::Stream(response) => {
                    let status = response.status().as_u16();
                    // The tap reads the upstream's own events (usage, errors); a translated stream
                    // is rewritten after it, in the client's format.
                    let upstream_endpoint = translation.map_or(endpoint, Translation::upstream_endpoint);
                    let mut tap = SseTap::new(
                        upstream_endpoint,
                        strip_usage && translation.is_none(),
                        state.settings.max_usage_tokens,
                    )
                    .masking(credential.mask.clone());
                    if translation.is_some() {
                        // An event too large to translate is not held either.
                        tap = tap.dropping_oversized();
                    }
                    let mut stream = stream::ProxyStream::new(response, tap, completion, body.len, deadline);
                    if let Some(t) = translation {
                        stream = stream.translating(StreamTranslator::new(t, !strip_usage, &body.model));
                    }
                    // What the upstream has already sent leaves with the head, in one write.
                    let first = futures::StreamExt::next(&mut stream).await;
                    if let Some((completion, e)) = stream.failed_before_the_head() {
                        return with_quota(route.on(refuse(completion, e)), &quota, untouched, now);
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
                    route.insert(h);
                    // Headers leave before the body: only this request itself is known.
                    let one_request = |m: Metric| i64::from(m == Metric::Requests);
                    return with_quota(resp, &quota, one_request, now);
                }
                Answer::Complete(complete) => complete,
            };
            // The upstream's usage is counted only if valid; else the gateway's estimate is.
            let ceiling = state.settings.max_usage_tokens;
            let reported = match usage_block {
                Some(block) => UsageReport::read(native, &block, ceiling),
                None => UsageReport::Missing,
            };
            let ttfb = Some(completion.started().elapsed());
            let outcome = match &reported {
                UsageReport::Valid(u) => Outcome::ok(status, Some(*u), ttfb),
                _ => {
                    let answer = usage::answer_tokens(endpoint, &bytes);
                    let estimate = usage::estimate(body.len, answer, &reported, ceiling);
                    if translation.is_some() {
                        // The gateway wrote this answer: it tells the client what it counts.
                        bytes = translate::with_usage(endpoint, &bytes, estimate);
                    }
                    Outcome::estimated(status, estimate, reported.invalid_reason(), ttfb)
                }
            };
            let mut outcome = outcome;
            if completion.traced() {
                outcome.finish_reasons = spans::finish_reasons(endpoint, &bytes);
            }
            let usage = outcome.usage.unwrap_or_default();
            let credits = completion.credits(usage);
            let ban = completion.ban_context();
            if completion.finish(outcome) {
                return route.on(ban.answer());
            }
            let used_here = |m: Metric| quota::engine::amount(m, usage, credits);
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
            route.insert(resp.headers_mut());
            with_quota(resp, &quota, used_here, now)
        }
        Dispatched::UpstreamFailed(error) => {
            // After every candidate failed, the last upstream error goes back as is.
            let explanation = format!("Upstream: {}", completion.attempts_summary());
            // Classified and logged in the provider's own shape; rendered in the client's.
            let code = upstream_code(&error.body);
            let ban = completion.ban_context();
            if completion.finish(Outcome::failed(error.status, code, Source::Upstream, explanation)) {
                return route.on(ban.answer());
            }
            let lock_until = error.lock_until;
            let translation = Translation::of(endpoint, error.provider);
            let body = match translation {
                Some(t) => translate::error_body(t, error.status, &error.body),
                None => error.body,
            };
            let mut resp = Response::new(Body::from(body));
            *resp.status_mut() = StatusCode::from_u16(error.status).unwrap_or(StatusCode::BAD_GATEWAY);
            resp.headers_mut().extend(error.headers);
            if translation.is_some() {
                resp.headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            route.insert(resp.headers_mut());
            resp.headers_mut()
                .insert(ERROR_SOURCE, HeaderValue::from_static("upstream"));
            tell_the_wait(resp.headers_mut(), lock_until, now);
            with_quota(resp, &quota, untouched, now)
        }
        Dispatched::GatewayFailed(e) => with_quota(route.on(refuse(completion, e)), &quota, untouched, now),
    }
}

/// Adds the quota headers of `decision` to a response.
fn with_quota(
    mut resp: Response,
    decision: &QuotaDecision,
    extra: impl Fn(Metric) -> i64,
    now: DateTime<Utc>,
) -> Response {
    if !decision.standings.is_empty() {
        quota::headers::quota_headers(resp.headers_mut(), decision, extra, now);
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
    let ban = completion.ban_context();
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

/// The request's tags and end user (the rules in [`crate::tags`]).
fn labels(
    headers: &axum::http::HeaderMap,
    body: &body::ProxyBody,
    endpoint: Endpoint,
) -> Result<(Tags, Option<String>), ApiError> {
    let user = body.fields.get("user").map(|v| v.get());
    // Anthropic's messages name the end user in `metadata.user_id`; OpenAI's bodies in `user`.
    match endpoint {
        Endpoint::Messages => {
            let user_id = match body.fields.get("metadata") {
                Some(m) => metadata_user_id(m.get())?,
                None => None,
            };
            header_labels(headers, &[("metadata.user_id", user_id), ("user", user)])
        }
        Endpoint::ChatCompletions | Endpoint::Embeddings => header_labels(headers, &[("user", user)]),
    }
}

/// The tags of `x-aigw-tags` and the end user of `x-aigw-end-user`, else of the body's `fields`
/// (name and raw JSON text, in order; [`tags::end_user`]).
fn header_labels(
    headers: &axum::http::HeaderMap,
    fields: &[(&'static str, Option<&str>)],
) -> Result<(Tags, Option<String>), ApiError> {
    let refused = |r: tags::Refused| ApiError::invalid(r.message, Some(r.param));
    let tags =
        Tags::parse(headers.get_all(tags::TAGS_HEADER).iter().map(|v| v.as_bytes())).map_err(refused)?;
    let end_user =
        tags::end_user(headers.get(tags::END_USER_HEADER).map(|v| v.as_bytes()), fields).map_err(refused)?;
    Ok((tags, end_user))
}

/// `tags` within the key's `allowed_tags` (any, when it has none).
fn tags_allowed(tags: &Tags, caller: &crate::caller::Caller) -> Result<(), ApiError> {
    match tags.first_not_allowed(caller.allowed_tags.as_deref()) {
        Some(tag) => Err(ApiError::TagNotAllowed { tag }),
        None => Ok(()),
    }
}

/// The raw JSON text of `user_id` in a messages body's `metadata`, if present; a `metadata`
/// that is neither an object nor null is refused (`param: "metadata"`), as Anthropic does.
fn metadata_user_id(metadata: &str) -> Result<Option<&str>, ApiError> {
    #[derive(serde::Deserialize)]
    struct Metadata<'a> {
        #[serde(borrow, default)]
        user_id: Option<&'a serde_json::value::RawValue>,
    }
    let text = metadata.trim_start();
    if text.starts_with("null") {
        return Ok(None);
    }
    let not_an_object = || ApiError::invalid("metadata must be an object", Some("metadata"));
    if !text.starts_with('{') {
        return Err(not_an_object());
    }
    let m = serde_json::from_str::<Metadata>(metadata).map_err(|_| not_an_object())?;
    Ok(m.user_id.map(|v| v.get()))
}

/// The language of the gateway's own messages: `Accept-Language: zh…` or the configured locale.
fn locale_of(state: &AppState, headers: &axum::http::HeaderMap) -> Locale {
    let zh = headers
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("zh"));
    if zh { Locale::Zh } else { state.settings.locale }
}

/// The refusal of an open or banned breaker.
fn breaker_error(refusal: &Refusal, locale: Locale) -> ApiError {
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
pub struct BanContext {
    state: AppState,
    key_id: i64,
    locale: Locale,
}

impl BanContext {
    /// The ban's first wording, told to the request whose outcome banned the key.
    fn answer(self) -> Response {
        self.state.breakers.announce(self.key_id);
        breaker_error(&Refusal::Banned { first: true }, self.locale).into_response()
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

/// Counts in `aigw_quota_refusals_total` the quota that refuses the request (enforced) and each
/// shadow quota that would have.
fn count_quota_refusals(decision: &QuotaDecision) {
    use crate::quota::Mode;
    for s in decision.standings.iter().filter(|s| s.exhausted()) {
        if s.rule.mode == Mode::Shadow {
            crate::telemetry::quota_refusals(s.rule.subject, Mode::Shadow).increment(1);
        }
    }
    if let Some(s) = decision.refusal() {
        crate::telemetry::quota_refusals(s.rule.subject, Mode::Enforce).increment(1);
    }
}

/// `GET /v1/models`: the models the caller's workspace offers that the caller may call.
async fn models(State(state): State<AppState>, Authenticated(caller): Authenticated) -> Response {
    let routes = state.routes.load();
    let mut names: Vec<&String> = routes
        .workspaces
        .get(&caller.workspace_id)
        .map(|ws| ws.models.keys().filter(|m| caller.models.allows(m)).collect())
        .unwrap_or_default();
    names.sort();
    let data: Vec<_> = names
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "aigw"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}
