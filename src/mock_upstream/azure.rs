//! Azure OpenAI's shapes: the deployments API
//! (`/openai/deployments/{deployment}/chat/completions?api-version=V`, and `/embeddings`) and
//! the v1 API (`/openai/v1/chat/completions`, the deployment as the body's `model`), the key in
//! the `api-key` header. Answers are OpenAI's with Azure's content-filter results: a non-streamed
//! answer carries `prompt_filter_results` and each choice its `content_filter_results`; a stream
//! opens with a chunk of no choices that carries the prompt's results. A call without a key, or a
//! deployments call without `api-version`, is refused as Azure refuses it. The deployment is the
//! call's model (scripts match it).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::MockState;
use super::answer::Incoming;
use super::openai::{chat_answer, embeddings_answer};

/// Azure's answer to a call without a valid key.
const NO_KEY: &str = "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.";

/// The results of Azure's default content filter on text that passed.
fn passed() -> Value {
    json!({
        "hate": {"filtered": false, "severity": "safe"},
        "self_harm": {"filtered": false, "severity": "safe"},
        "sexual": {"filtered": false, "severity": "safe"},
        "violence": {"filtered": false, "severity": "safe"}
    })
}

/// Adds Azure's content-filter results to a non-streamed chat answer.
pub(super) fn add_filter_results(body: &mut Value) {
    body["prompt_filter_results"] = json!([{"prompt_index": 0, "content_filter_results": passed()}]);
    if let Some(choices) = body["choices"].as_array_mut() {
        for c in choices {
            c["content_filter_results"] = passed();
        }
    }
}

/// The chunk an Azure stream opens with: no choices, no id or model, the prompt's filter results.
pub(super) fn prompt_filter_chunk() -> String {
    let c = json!({"choices": [], "created": 0, "id": "", "model": "", "object": "",
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": passed()}]});
    format!("data: {c}\n\n")
}

/// Azure's refusal of a call it cannot take: no key, or no `api-version` on a deployments call.
fn refusal(headers: &HeaderMap, query: Option<&str>, deployments: bool) -> Option<Response> {
    let error = |status: StatusCode, message: &str| {
        let code = status.as_u16().to_string();
        Some(
            (
                status,
                axum::Json(json!({"error": {"code": code, "message": message}})),
            )
                .into_response(),
        )
    };
    if headers.get("api-key").is_none() && headers.get("authorization").is_none() {
        return error(StatusCode::UNAUTHORIZED, NO_KEY);
    }
    let has_version = query.is_some_and(|q| {
        q.split('&')
            .any(|p| p.starts_with("api-version=") && p.len() > 12)
    });
    if deployments && !has_version {
        return error(StatusCode::NOT_FOUND, "Resource not found");
    }
    None
}

/// The Azure call at `path`, its model the deployment when the path names one.
fn incoming(
    st: &MockState,
    path: String,
    headers: &HeaderMap,
    raw: &Bytes,
    deployment: Option<String>,
) -> Incoming {
    let mut inc = Incoming::for_model(st, &path, headers, raw, deployment);
    inc.azure = true;
    inc
}

pub(super) async fn deployment_chat(
    State(st): State<Arc<MockState>>,
    Path(deployment): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    if let Some(r) = refusal(&headers, query.as_deref(), true) {
        return r;
    }
    let path = format!("/openai/deployments/{deployment}/chat/completions");
    chat_answer(&st, incoming(&st, path, &headers, &raw, Some(deployment))).await
}

pub(super) async fn deployment_embeddings(
    State(st): State<Arc<MockState>>,
    Path(deployment): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    if let Some(r) = refusal(&headers, query.as_deref(), true) {
        return r;
    }
    let path = format!("/openai/deployments/{deployment}/embeddings");
    embeddings_answer(&st, incoming(&st, path, &headers, &raw, Some(deployment))).await
}

pub(super) async fn v1_chat(
    State(st): State<Arc<MockState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    if let Some(r) = refusal(&headers, query.as_deref(), false) {
        return r;
    }
    let path = "/openai/v1/chat/completions".to_owned();
    chat_answer(&st, incoming(&st, path, &headers, &raw, None)).await
}

pub(super) async fn v1_embeddings(
    State(st): State<Arc<MockState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    if let Some(r) = refusal(&headers, query.as_deref(), false) {
        return r;
    }
    let path = "/openai/v1/embeddings".to_owned();
    embeddings_answer(&st, incoming(&st, path, &headers, &raw, None)).await
}
