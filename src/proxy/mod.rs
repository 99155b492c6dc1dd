//! The `/v1` proxy. [`handle`] is the whole request path, in the order of DESIGN.md §1.

pub mod auth;
pub mod body;
pub mod completion;
pub mod stream;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::app::{AppState, RequestId};
use crate::error::{ApiError, ERROR_SOURCE};
use crate::upstream::adapter::{self, Endpoint, SseTap};
use crate::upstream::dispatch::{self, Dispatched};
use completion::{Completion, Outcome, Source};

/// The proxy's routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/messages", post(messages))
        .route("/v1/models", get(models))
}

async fn chat_completions(state: State<AppState>, ip: ConnectInfo<SocketAddr>, req: Request) -> Response {
    handle(state.0, Endpoint::ChatCompletions, ip.0, req).await
}

async fn embeddings(state: State<AppState>, ip: ConnectInfo<SocketAddr>, req: Request) -> Response {
    handle(state.0, Endpoint::Embeddings, ip.0, req).await
}

async fn messages(state: State<AppState>, ip: ConnectInfo<SocketAddr>, req: Request) -> Response {
    handle(state.0, Endpoint::Messages, ip.0, req).await
}

/// The request path: authenticate, read and check the body, route, dispatch, respond, and
/// account for the request after it completes.
pub async fn handle(state: AppState, endpoint: Endpoint, peer: SocketAddr, req: Request) -> Response {
    // 1. Authenticate: key → member → department → workspace (cached). Not logged when refused:
    //    an unknown key belongs to no workspace.
    let caller = match state
        .keys
        .authenticate(&state.store, req.headers(), peer.ip())
        .await
    {
        Ok(c) => c,
        Err(e) => {
            metrics::counter!("aigw_requests_total", "endpoint" => endpoint.name(), "status" => e.status().as_str().to_owned(),
                "code" => e.code(), "source" => "gateway")
            .increment(1);
            return e.into_response();
        }
    };
    let request_id = req
        .extensions()
        .get::<RequestId>()
        .map(|r| r.0.to_string())
        .unwrap_or_default();
    let mut completion = Completion::start(
        state.clone(),
        caller.clone(),
        endpoint,
        request_id,
        peer.ip().to_string(),
    );

    // 2. Read and check the body (size limit, JSON, required fields).
    let (parts, body) = req.into_parts();
    let mut body = match body::read(body, &parts.headers, state.settings.max_body_bytes, endpoint).await {
        Ok(b) => b,
        Err(e) => return refuse(completion, e),
    };
    completion.requested(&body.model, body.stream);

    // 3. Route: the model and its fallback chain in the caller's workspace.
    let routes = state.routes.load();
    let chain = routes
        .workspaces
        .get(&caller.workspace_id)
        .map(|ws| ws.chain(&body.model))
        .unwrap_or_default();
    if chain.is_empty() {
        return refuse(completion, ApiError::ModelNotFound { model: body.model });
    }

    // 4. Dispatch within the time budget; failures are classified and the chain moves on.
    let strip_usage =
        body.stream && endpoint == Endpoint::ChatCompletions && adapter::request_stream_usage(&mut body.json);
    let budget = Duration::from_secs(state.settings.request_timeout_secs);
    let dispatched = tokio::time::timeout(
        budget,
        dispatch::dispatch(
            &state,
            endpoint,
            &mut body.json,
            &chain,
            &parts.headers,
            completion.attempts_mut(),
        ),
    )
    .await
    .unwrap_or(Dispatched::GatewayFailed(ApiError::Timeout {
        seconds: state.settings.request_timeout_secs,
    }));

    // 5. Respond; accounting runs when the response (or stream) is complete.
    match dispatched {
        Dispatched::Served {
            response,
            credential,
            model,
            upstream_latency,
        } => {
            completion.served_by(model, credential.id, upstream_latency);
            let status = response.status().as_u16();
            let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
            let is_sse = content_type
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            if body.stream && is_sse {
                let tap = SseTap::new(endpoint, strip_usage);
                let stream = stream::ProxyStream::new(response, tap, completion, body.len);
                let mut resp = Response::new(Body::from_stream(stream));
                *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
                let h = resp.headers_mut();
                h.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/event-stream"),
                );
                h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                return resp;
            }
            let bytes = match response.bytes().await {
                Ok(b) => b,
                Err(e) => {
                    let err = ApiError::UpstreamUnreachable {
                        message: format!("reading the response failed: {}", e.without_url()),
                    };
                    return refuse(completion, err);
                }
            };
            let usage = adapter::usage_of_body(endpoint, &bytes);
            let ttfb = completion.started().elapsed();
            completion.finish(Outcome::ok(status, usage, Some(ttfb)));
            let mut resp = Response::new(Body::from(bytes));
            *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                content_type.unwrap_or(HeaderValue::from_static("application/json")),
            );
            resp
        }
        Dispatched::UpstreamFailed(error) => {
            // After every candidate failed, the last upstream error goes back as is.
            let explanation = format!("Upstream: {}", completion.attempts_summary());
            let code = upstream_code(&error.body);
            completion.finish(Outcome::failed(error.status, code, Source::Upstream, explanation));
            let mut resp = Response::new(Body::from(error.body));
            *resp.status_mut() = StatusCode::from_u16(error.status).unwrap_or(StatusCode::BAD_GATEWAY);
            resp.headers_mut().extend(error.headers);
            resp.headers_mut()
                .insert(ERROR_SOURCE, HeaderValue::from_static("upstream"));
            resp
        }
        Dispatched::GatewayFailed(e) => refuse(completion, e),
    }
}

/// Answers a gateway refusal and logs it.
fn refuse(completion: Completion, e: ApiError) -> Response {
    let summary = completion.attempts_summary();
    let explanation = if summary.is_empty() {
        format!("Gateway: {e}")
    } else {
        format!("Gateway: {e} [{summary}]")
    };
    completion.finish(Outcome::failed(
        e.status().as_u16(),
        e.code(),
        Source::Gateway,
        explanation,
    ));
    e.into_response()
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

/// `GET /v1/models`: the models the caller's workspace offers.
async fn models(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let caller = match state
        .keys
        .authenticate(&state.store, req.headers(), peer.ip())
        .await
    {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let routes = state.routes.load();
    let mut names: Vec<&String> = routes
        .workspaces
        .get(&caller.workspace_id)
        .map(|ws| ws.models.keys().collect())
        .unwrap_or_default();
    names.sort();
    let data: Vec<_> = names
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "aigw"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}
