//! The OpenAI shapes: chat completions (streamed or not, with `usage`), embeddings, the model
//! list.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};

use super::MockState;
use super::answer::{Incoming, json_response, reply_words, sse_response};

pub(super) async fn chat(State(st): State<Arc<MockState>>, headers: HeaderMap, raw: Bytes) -> Response {
    let inc = Incoming::new(&st, "/v1/chat/completions", &headers, &raw);
    chat_answer(&st, inc).await
}

/// A chat call answered, in OpenAI's shape (Azure's when `inc.azure`).
pub(super) async fn chat_answer(st: &MockState, inc: Incoming) -> Response {
    inc.delay(st).await;
    if let Some(resp) = inc.scripted_error(st) {
        return resp;
    }
    let model = inc.model.clone().unwrap_or_default();
    let words = reply_words(inc.script.words.unwrap_or(5));
    let prompt = inc.prompt_tokens();
    let completion = words.len() as u64;
    let id = format!("chatcmpl-mock-{}", uuid::Uuid::now_v7().simple());
    let created = chrono::Utc::now().timestamp();
    let usage = inc.reported_usage(
        json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}),
    );
    if !inc.stream {
        inc.record(st, 200, Some((prompt, completion)));
        let mut body = json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": words.concat()},
                         "finish_reason": "stop"}],
        });
        if let Some(t) = &inc.script.tool_call {
            body["choices"][0]["message"]["tool_calls"] = json!([{"id": "call_mock_1", "type": "function",
                "function": {"name": t.name, "arguments": t.arguments.to_string()}}]);
            body["choices"][0]["finish_reason"] = json!("tool_calls");
        }
        if let Some(u) = usage {
            body["usage"] = u;
        }
        if inc.azure {
            super::azure::add_filter_results(&mut body);
        }
        return json_response(&inc, body);
    }
    let include_usage = inc
        .body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        == Some(true);
    let chunk = |delta: Value, finish: Value| {
        let mut c = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        // As OpenAI does: with include_usage, every other chunk carries "usage": null.
        if include_usage {
            c["usage"] = Value::Null;
        }
        Some(format!("data: {c}\n\n"))
    };
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    if inc.azure {
        events.insert(0, Some(super::azure::prompt_filter_chunk()));
    }
    let mut reported = Some((prompt, completion));
    let mut stall = false;
    for (i, w) in words.iter().enumerate() {
        if inc.script.drop_after_chunks == Some(i as u32) {
            events.push(None);
            reported = None;
            break;
        }
        if inc.script.stall_after_chunks == Some(i as u32) {
            stall = true;
            reported = None;
            break;
        }
        if inc.script.error_after_chunks == Some(i as u32) {
            // OpenRouter's mid-stream shape: an error object and finish_reason "error".
            let c = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                           "error": {"code": 502, "message": "mock: provider error mid-stream"},
                           "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]});
            events.push(Some(format!("data: {c}\n\n")));
            events.push(Some("data: [DONE]\n\n".to_owned()));
            reported = None;
            break;
        }
        events.push(chunk(json!({"content": w}), Value::Null));
    }
    if reported.is_some() {
        let mut finish = json!("stop");
        if let Some(t) = &inc.script.tool_call {
            let (a, b) = t.argument_pieces();
            events.push(chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_mock_1", "type": "function",
                    "function": {"name": t.name, "arguments": a}}]}),
                Value::Null,
            ));
            events.push(chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": b}}]}),
                Value::Null,
            ));
            finish = json!("tool_calls");
        }
        events.push(chunk(json!({}), finish));
        if include_usage && let Some(usage) = usage {
            let c = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": [], "usage": usage});
            events.push(Some(format!("data: {c}\n\n")));
        }
        events.push(Some("data: [DONE]\n\n".to_owned()));
    }
    inc.record(st, 200, reported);
    sse_response(&inc, events, stall)
}

pub(super) async fn embeddings(State(st): State<Arc<MockState>>, headers: HeaderMap, raw: Bytes) -> Response {
    let inc = Incoming::new(&st, "/v1/embeddings", &headers, &raw);
    embeddings_answer(&st, inc).await
}

/// An embeddings call answered (Azure's shape is OpenAI's).
pub(super) async fn embeddings_answer(st: &MockState, inc: Incoming) -> Response {
    inc.delay(st).await;
    if let Some(resp) = inc.scripted_error(st) {
        return resp;
    }
    let inputs = match inc.body.get("input") {
        Some(Value::Array(a)) => a.len().max(1),
        _ => 1,
    };
    let prompt = inc.prompt_tokens();
    let data: Vec<Value> = (0..inputs)
        .map(|i| json!({"object": "embedding", "index": i, "embedding": [0.1, -0.2, 0.3, 0.0, 0.5, -0.6, 0.7, 0.8]}))
        .collect();
    inc.record(st, 200, Some((prompt, 0)));
    let mut body = json!({"object": "list", "data": data, "model": inc.model.clone().unwrap_or_default()});
    if let Some(u) = inc.reported_usage(json!({"prompt_tokens": prompt, "total_tokens": prompt})) {
        body["usage"] = u;
    }
    json_response(&inc, body)
}

pub(super) async fn models(State(st): State<Arc<MockState>>, headers: HeaderMap) -> Response {
    let inc = Incoming::new(&st, "/v1/models", &headers, &Bytes::new());
    if let Some(resp) = inc.scripted_error(&st) {
        return resp;
    }
    inc.record(&st, 200, None);
    json_response(
        &inc,
        json!({"object": "list", "data": [{"id": "mock-model", "object": "model", "owned_by": "mock"}]}),
    )
}
