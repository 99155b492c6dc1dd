//! The `/v1` proxy. [`handle`] is the whole request path, in the order of DESIGN.md §1.

mod after;
mod answer_headers;
pub mod authenticated;
pub mod body;
pub mod completion;
mod envelope;
mod my_quota;
mod respond;
mod spans;
pub mod stream;

use std::net::SocketAddr;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::config::Locale;
use crate::deadline::Deadline;
use crate::error::{ApiError, QuotaRefusal};
use crate::kernel::caller::Caller;
use crate::kernel::request_id::RequestId;
use crate::kernel::tags::{self, Tags};
use crate::provider::adapter::{self, Endpoint};
use crate::quota::engine::{QuotaDecision, Standing, display_value};
use crate::quota::policy::Labels;
use crate::quota::window::format_reset_at;
use crate::quota::{Mode, SubjectKind};
use crate::state::AppState;
use crate::upstream::dispatch;
use after::{End, Told};
use answer_headers::Routed;
use authenticated::Authenticated;
use completion::Completion;

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

/// The request path: authenticate, read and check the body, route, dispatch, respond (the
/// numbered steps of [`steps`]), then the after-work, once however the steps ended
/// ([`after::finish`]): the request's end recorded (metrics, span, log row, breaker, usage),
/// and the routing and quota headers its answer tells.
pub async fn handle(
    state: AppState,
    endpoint: Endpoint,
    peer: SocketAddr,
    caller: Authentication,
    req: Request,
) -> Response {
    let mut told = Told::default();
    let end = steps(&state, endpoint, peer, caller, req, &mut told).await;
    after::finish(&state, endpoint, told, end)
}

/// The steps of [`handle`], in order; each refusal ends them, and `told` learns the quota
/// decision and the route as they are known.
async fn steps(
    state: &AppState,
    endpoint: Endpoint,
    peer: SocketAddr,
    caller: Authentication,
    req: Request,
    told: &mut Told,
) -> End {
    // The caller's trace, continued (when traces are exported).
    let trace = state.tracer.request(req.headers());
    // 1. Authenticate (the extractor): key → member → department → workspace (cached), the
    //    key's expiry and a rotated secret's grace judged by the clock. Not logged nor counted
    //    toward a breaker when refused: an unknown key belongs to no workspace, and nothing was
    //    attempted for an expired one.
    let caller = match caller {
        Ok(Authenticated(c)) => c,
        Err(error) => return End::Unauthenticated { error, trace },
    };
    // 2. Breaker gate: an open or banned key is refused before anything else, neither counted
    //    nor logged.
    let locale = locale_of(state, req.headers());
    let admission = match state.breakers.gate(caller.key_id, state.clock.now_ms()) {
        Ok(admission) => admission,
        Err(refusal) => {
            let error = after::breaker_error(&refusal, locale);
            return End::Gated { caller, error, trace };
        }
    };
    let mut completion = start(state, endpoint, peer, &req, &caller);
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
        Err(e) => return End::Refused(completion, e),
    };
    completion.requested(&body.model, body.stream);

    // 3b. Tags and end user (`x-aigw-tags`, `x-aigw-end-user` or the body's `user`, on messages
    //     `metadata.user_id` first), stored on the log; a tag outside the key's `allowed_tags`
    //     is refused before any quota or upstream work, like a model outside its allow-list.
    let (tags, end_user) = match labels(&parts.headers, &body, endpoint) {
        Ok(l) => l,
        Err(e) => return End::Refused(completion, e),
    };
    completion.labelled(&tags, end_user.as_deref());
    if let Err(e) = tags_allowed(&tags, &caller) {
        return End::Refused(completion, e);
    }

    // 4. Model allow-list (the key's and its member's): before any quota or upstream work.
    if let Err(by) = caller.models.check(&body.model) {
        let model = body.model;
        return End::Refused(completion, ApiError::ModelNotAllowed { model, by });
    }

    // 5. Quota pre-check: every policy on the key, member, department and workspace, and on
    //    the request's tag values and end user (their subject ids, made on first sight under
    //    the workspace's caps).
    let now = state.clock.now();
    let (quota, refusal) = match check_quota(state, &caller, &tags, end_user.as_deref(), now).await {
        Ok(checked) => checked,
        Err(e) => return End::Refused(completion, e),
    };
    completion.quota_checked(quota.clone());
    told.quota = Some((quota, now));
    if let Some(e) = refusal {
        return End::Refused(completion, e);
    }

    // 6. Concurrency cap (the key's and its member's `max_in_flight`, on this gateway): the
    //    place is held until the request ends, its stream finished or cut included.
    match state
        .in_flight
        .admit(caller.in_flight, caller.key_id, caller.member_id)
    {
        Ok(place) => completion.hold_in_flight(place),
        Err(over) => {
            let (by, limit) = (over.by, over.limit);
            return End::Refused(completion, ApiError::ConcurrencyLimit { by, limit });
        }
    }

    // 7. Route: the model and its fallback chain in the caller's workspace, without the models
    //    the caller may not call.
    let routes = state.routes.load();
    let workspace = routes.workspaces.get(&caller.workspace_id);
    let mut chain = workspace.map(|ws| ws.chain(&body.model)).unwrap_or_default();
    chain.retain(|m| caller.models.allows(&m.name));
    if chain.is_empty() {
        return End::Refused(completion, ApiError::ModelNotFound { model: body.model });
    }

    // 8. Dispatch within the deadline (the whole answer, or a stream's first byte); failures are
    //    classified and the chain moves on.
    let strip_usage = body.stream
        && endpoint == Endpoint::ChatCompletions
        && adapter::request_stream_usage(&mut body.fields);
    let deadline = Deadline::for_request(&state.settings, body.stream);
    // The two longest steps are boxed: their states are most of a request's future, which the
    // handler chain moves several times before it runs (memcpy, docs/performance.md).
    let dispatched = Box::pin(dispatch::dispatch(
        state.upstreams(),
        endpoint,
        &body.fields,
        &chain,
        &parts.headers,
        workspace.map(|w| &w.quota_groups),
        caller.member_id,
        deadline,
        completion.dispatch_log(),
    ))
    .await;
    // What routed the request, told on every answer from here on (DESIGN.md §10, §11).
    told.route = Some(Routed::after_dispatch(completion.attempts(), &chain, endpoint));

    // 9. Respond; accounting runs when the response (or stream) is complete.
    let asked = respond::Asked {
        state,
        endpoint,
        body: &body,
        strip_usage,
        deadline,
        now,
    };
    Box::pin(respond::dispatched(&asked, completion, dispatched)).await
}

/// Starts the completion of an admitted request.
fn start(
    state: &AppState,
    endpoint: Endpoint,
    peer: SocketAddr,
    req: &Request,
    caller: &Arc<Caller>,
) -> Completion {
    let request_id = req
        .extensions()
        .get::<RequestId>()
        .map(|r| r.encode(&mut [0; 36]).to_owned())
        .unwrap_or_default();
    let client = crate::edge::forwarded::ip_text(state.client_ip(peer, req.headers()));
    Completion::start(state.clone(), caller.clone(), endpoint, request_id, client)
}

/// Step 5: the request's quota decision (its refusals counted), and the refusal of the
/// enforced quota it exhausted, if any.
async fn check_quota(
    state: &AppState,
    caller: &Caller,
    tags: &Tags,
    end_user: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(Arc<QuotaDecision>, Option<ApiError>), ApiError> {
    let (caps, brought_by) = (state.label_caps(), state.labels_brought_by(caller.key_id));
    let (ws, now_ms) = (caller.workspace_id, state.clock.now_ms());
    let labels = state
        .labels
        .resolve(&state.store, caps, brought_by, ws, tags, end_user, now_ms)
        .await?;
    let tz = state.timezone_of(caller.workspace_id);
    let quota = state
        .quota
        .check_request(&state.store, &state.policies.load(), caller, &labels, now, tz)
        .await?;
    count_quota_refusals(&quota);
    let refusal = quota.refusal().map(|s| quota_refused(s, &labels));
    Ok((Arc::new(quota), refusal))
}

/// The refusal of the enforced quota `s` exhausted, its subject named as `labels` name it.
fn quota_refused(s: &Standing, labels: &Labels) -> ApiError {
    ApiError::QuotaExceeded(Box::new(QuotaRefusal {
        subject: s.rule.subject.as_str(),
        metric: s.rule.metric.as_str(),
        window: s.rule.window.to_string(),
        limit: display_value(s.rule.metric, s.rule.limit),
        used: display_value(s.rule.metric, s.used),
        reset_at: s.reset_at.as_ref().map(format_reset_at),
        subject_name: labels.name_of(s.rule.subject, s.key.subject_id),
    }))
}

/// The request's tags and end user (the rules in [`crate::kernel::tags`]).
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
    // Looking a header up hashes its name; most requests carry neither, which one pass over
    // the names tells for less.
    if !headers
        .keys()
        .any(|name| name.as_str().starts_with(tags::HEADERS_PREFIX))
    {
        return Ok((Tags::default(), tags::end_user(None, fields).map_err(refused)?));
    }
    let tags =
        Tags::parse(headers.get_all(tags::TAGS_HEADER).iter().map(|v| v.as_bytes())).map_err(refused)?;
    let end_user =
        tags::end_user(headers.get(tags::END_USER_HEADER).map(|v| v.as_bytes()), fields).map_err(refused)?;
    Ok((tags, end_user))
}

/// `tags` within the key's `allowed_tags` (any, when it has none).
fn tags_allowed(tags: &Tags, caller: &crate::kernel::caller::Caller) -> Result<(), ApiError> {
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

/// Counts in `aigw_quota_refusals_total` the quota that refuses the request (enforced) and each
/// shadow quota that would have.
fn count_quota_refusals(decision: &QuotaDecision) {
    for s in decision.standings.iter().filter(|s| s.exhausted()) {
        if s.rule.mode == Mode::Shadow {
            quota_refusals(s.rule.subject, Mode::Shadow).increment(1);
        }
    }
    if let Some(s) = decision.refusal() {
        quota_refusals(s.rule.subject, Mode::Enforce).increment(1);
    }
}

/// The `aigw_quota_refusals_total` counter of a subject kind and mode, registered once: a
/// refused request increments a handle, with no registry lookup.
fn quota_refusals(subject: SubjectKind, mode: Mode) -> &'static metrics::Counter {
    const SUBJECTS: [SubjectKind; 6] = [
        SubjectKind::Apikey,
        SubjectKind::Member,
        SubjectKind::Dept,
        SubjectKind::Ws,
        SubjectKind::Tag,
        SubjectKind::EndUser,
    ];
    const MODES: [Mode; 2] = [Mode::Enforce, Mode::Shadow];
    static HANDLES: std::sync::OnceLock<[[metrics::Counter; 2]; 6]> = std::sync::OnceLock::new();
    let handles = HANDLES.get_or_init(|| {
        SUBJECTS.map(|s| {
            MODES.map(|m| {
                metrics::counter!("aigw_quota_refusals_total", "subject" => s.as_str(), "mode" => m.as_str())
            })
        })
    });
    let s = SUBJECTS.iter().position(|k| *k == subject).unwrap_or(0);
    let m = MODES.iter().position(|k| *k == mode).unwrap_or(0);
    &handles[s][m]
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
