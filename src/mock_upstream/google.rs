//! Gemini's own API: `POST /v1beta/models/{model}:generateContent` (a `GenerateContentResponse`)
//! , `:batchEmbedContents` (`{"embeddings": [{"values": …}]}`, no token counts, as Google
//! answers) and `:streamGenerateContent?alt=sse` (SSE events, each a `GenerateContentResponse`, `\r\n`
//! line ends as Google sends them, `usageMetadata` on every event and `finishReason` on the
//! last), the key in `x-goog-api-key`. A call without a key is refused as Google refuses it
//! (403 `PERMISSION_DENIED`); a key in the URL (`?key=`) is refused too, so the gateway is held
//! to the header. The model is the path's (scripts match it). A scripted error is sent as
//! scripted: give it Google's `{"error": {"code", "message", "status", "details"}}` body.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::MockState;
use super::answer::{Incoming, json_response, reply_words, sse_response};

fn refusal(status: StatusCode, message: &str, kind: &str) -> Response {
    let code = status.as_u16();
    (
        status,
        axum::Json(json!({"error": {"code": code, "message": message, "status": kind}})),
    )
        .into_response()
}

/// A `batchEmbedContents` call: one 4-value embedding per request, the first value the text's
/// word count.
async fn embed(st: &MockState, model: &str, call: &str, headers: &HeaderMap, raw: &Bytes) -> Response {
    if headers.get("x-goog-api-key").is_none() {
        return refusal(
            StatusCode::FORBIDDEN,
            "Method doesn't allow unregistered callers.",
            "PERMISSION_DENIED",
        );
    }
    let inc = Incoming::for_model(
        st,
        &format!("/v1beta/models/{call}"),
        headers,
        raw,
        Some(model.to_owned()),
    );
    inc.delay(st).await;
    if let Some(resp) = inc.scripted_error(st) {
        return resp;
    }
    let requests = inc
        .body
        .get("requests")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let embeddings: Vec<Value> = requests
        .iter()
        .map(|r| {
            let words = super::answer::count_words(&r["content"]) as f64;
            json!({"values": [words, 0.5, -0.25, 0.125]})
        })
        .collect();
    inc.record(st, 200, None);
    json_response(&inc, json!({"embeddings": embeddings}))
}

/// `/v1beta/models/{model}:{method}` (`generateContent` or `streamGenerateContent`).
pub(super) async fn call(
    State(st): State<Arc<MockState>>,
    Path(call): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    let Some((model, method)) = call.rsplit_once(':') else {
        return refusal(StatusCode::NOT_FOUND, "Method not found.", "NOT_FOUND");
    };
    let stream = match method {
        "batchEmbedContents" => return embed(&st, model, &call, &headers, &raw).await,
        "generateContent" => false,
        "streamGenerateContent" => true,
        _ => return refusal(StatusCode::NOT_FOUND, "Method not found.", "NOT_FOUND"),
    };
    let query = query.unwrap_or_default();
    if query.split('&').any(|p| p.starts_with("key=")) {
        return refusal(
            StatusCode::BAD_REQUEST,
            "the mock refuses a key in the URL: send x-goog-api-key",
            "INVALID_ARGUMENT",
        );
    }
    if headers.get("x-goog-api-key").is_none() {
        return refusal(
            StatusCode::FORBIDDEN,
            "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.",
            "PERMISSION_DENIED",
        );
    }
    let mut inc = Incoming::for_model(
        &st,
        &format!("/v1beta/models/{call}"),
        &headers,
        &raw,
        Some(model.to_owned()),
    );
    inc.stream = stream;
    if inc.body.get("contents").and_then(Value::as_array).is_none() {
        return refusal(
            StatusCode::BAD_REQUEST,
            "* GenerateContentRequest.contents: contents is not specified\n",
            "INVALID_ARGUMENT",
        );
    }
    inc.delay(&st).await;
    if let Some(resp) = inc.scripted_error(&st) {
        return resp;
    }
    let words = reply_words(inc.script.words.unwrap_or(5));
    let prompt = inc.prompt_tokens();
    let completion = words.len() as u64;
    let usage = |candidates: u64| {
        inc.reported_usage(
            json!({"promptTokenCount": prompt, "candidatesTokenCount": candidates,
            "totalTokenCount": prompt + candidates,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}]}),
        )
    };
    let response = |parts: Value, finish: Option<&str>, candidates: u64| {
        let mut c = json!({"content": {"parts": parts, "role": "model"}, "index": 0});
        if let Some(f) = finish {
            c["finishReason"] = json!(f);
        }
        let mut r = json!({"candidates": [c], "modelVersion": model, "responseId": "mockResponseId01"});
        if let Some(u) = usage(candidates) {
            r["usageMetadata"] = u;
        }
        r
    };
    let call_part = inc
        .script
        .tool_call
        .as_ref()
        .map(|t| json!({"functionCall": {"name": t.name, "args": t.arguments}}));
    if !stream {
        inc.record(&st, 200, Some((prompt, completion)));
        let mut parts = vec![json!({"text": words.concat()})];
        parts.extend(call_part);
        return json_response(&inc, response(Value::Array(parts), Some("STOP"), completion));
    }
    let limit = inc.script.error_after_chunks.or(inc.script.drop_after_chunks);
    let mut events: Vec<Option<String>> = Vec::new();
    let n = words.len();
    for (i, w) in words.iter().enumerate() {
        if limit.is_some_and(|l| i as u32 >= l) {
            break;
        }
        let last = i + 1 == n;
        let mut parts = vec![json!({"text": w})];
        if last {
            parts.extend(call_part.clone());
        }
        let ev = response(Value::Array(parts), last.then_some("STOP"), i as u64 + 1);
        events.push(Some(format!("data: {ev}\r\n\r\n")));
    }
    let cut = limit.is_some_and(|l| (l as usize) < n);
    if cut && inc.script.error_after_chunks.is_some() {
        let e = json!({"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}});
        events.push(Some(format!("data: {e}\r\n\r\n")));
        inc.record(&st, 200, None);
    } else if cut {
        events.push(None);
        inc.record(&st, 200, None);
    } else {
        inc.record(&st, 200, Some((prompt, completion)));
    }
    sse_response(&inc, events, inc.script.stall_after_chunks.is_some())
}
