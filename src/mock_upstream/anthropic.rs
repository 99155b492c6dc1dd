//! The Anthropic shape: messages, streamed or not.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};

use super::MockState;
use super::answer::{Incoming, json_response, reply_words, sse_response};

pub(super) async fn messages(State(st): State<Arc<MockState>>, headers: HeaderMap, raw: Bytes) -> Response {
    let inc = Incoming::new(&st, "/v1/messages", &headers, &raw);
    inc.delay(&st).await;
    if let Some(resp) = inc.scripted_error(&st) {
        return resp;
    }
    let model = inc.model.clone().unwrap_or_default();
    let words = reply_words(inc.script.words.unwrap_or(5));
    let input = inc.prompt_tokens();
    let output = words.len() as u64;
    let id = format!("msg_mock_{}", uuid::Uuid::now_v7().simple());
    if !inc.stream {
        inc.record(&st, 200, Some((input, output)));
        let mut body = json!({"id": id, "type": "message", "role": "assistant", "model": model,
               "content": [{"type": "text", "text": words.concat()}],
               "stop_reason": "end_turn", "stop_sequence": null});
        if let Some(t) = &inc.script.tool_call {
            if let Some(c) = body["content"].as_array_mut() {
                c.push(
                    json!({"type": "tool_use", "id": "toolu_mock_1", "name": t.name, "input": t.arguments}),
                );
            }
            body["stop_reason"] = json!("tool_use");
        }
        if let Some(u) = inc.reported_usage(json!({"input_tokens": input, "output_tokens": output})) {
            body["usage"] = u;
        }
        return json_response(&inc, body);
    }
    let ev = |name: &str, data: Value| Some(format!("event: {name}\ndata: {data}\n\n"));
    let mut start = json!({"id": id, "type": "message", "role": "assistant",
           "model": model, "content": [], "stop_reason": null, "stop_sequence": null});
    if let Some(u) = inc.reported_usage(json!({"input_tokens": input, "output_tokens": 1})) {
        start["usage"] = u;
    }
    let mut events = vec![
        ev(
            "message_start",
            json!({"type": "message_start", "message": start}),
        ),
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    let mut reported = Some((input, output));
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
            events.push(ev(
                "error",
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ));
            reported = None;
            break;
        }
        events.push(ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}),
        ));
    }
    if reported.is_some() {
        events.push(ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ));
        let mut stop_reason = "end_turn";
        if let Some(t) = &inc.script.tool_call {
            let (a, b) = t.argument_pieces();
            events.push(ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 1,
                    "content_block": {"type": "tool_use", "id": "toolu_mock_1", "name": t.name, "input": {}}}),
            ));
            for piece in [a, b] {
                events.push(ev(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 1,
                        "delta": {"type": "input_json_delta", "partial_json": piece}}),
                ));
            }
            events.push(ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            ));
            stop_reason = "tool_use";
        }
        let mut delta =
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}});
        if let Some(u) = inc.reported_usage(json!({"output_tokens": output})) {
            delta["usage"] = u;
        }
        events.push(ev("message_delta", delta));
        events.push(ev("message_stop", json!({"type": "message_stop"})));
    }
    inc.record(&st, 200, reported);
    sse_response(&inc, events, stall)
}
