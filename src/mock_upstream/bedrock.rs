//! AWS Bedrock Runtime's shapes: `POST /model/{modelId}/converse` (a Converse answer) and
//! `/converse-stream` (the answer as AWS event-stream frames, `messageStart` to `metadata`, each
//! payload padded with a `p` field as AWS pads it). A call without a well-formed SigV4
//! `Authorization` (algorithm, `Credential=KEY/DATE/REGION/bedrock/aws4_request`, signed
//! headers covering `host` and `x-amz-date`, a 64-hex signature, an `x-amz-date` of the same
//! day) is refused as AWS refuses it: 403 with the type in `x-amzn-errortype`. The signature is
//! not checked: the mock does not hold the secret. The access key id is the call's credential
//! (scripts match it); the model id, from the path, its model. A scripted error is sent as
//! scripted: give it AWS's `x-amzn-errortype` header and `{"message": …}` body.

use std::sync::Arc;

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::MockState;
use super::answer::{Incoming, json_response, paced_response, reply_words};

/// The access key id of a SigV4 `Authorization` header, if the header is one.
pub(super) fn access_key_id(headers: &HeaderMap) -> Option<&str> {
    let auth = headers.get("authorization")?.to_str().ok()?;
    let rest = auth.strip_prefix("AWS4-HMAC-SHA256 Credential=")?;
    rest.split('/').next()
}

/// Why a call's SigV4 signature is malformed, in AWS's words; `None` when it is well-formed.
fn malformed(headers: &HeaderMap) -> Option<(&'static str, String)> {
    let Some(auth) = headers.get("authorization").and_then(|v| v.to_str().ok()) else {
        return Some((
            "MissingAuthenticationTokenException",
            "Missing Authentication Token".to_owned(),
        ));
    };
    let incomplete = |what: &str| Some(("IncompleteSignatureException", what.to_owned()));
    let Some(rest) = auth.strip_prefix("AWS4-HMAC-SHA256 ") else {
        return incomplete("Authorization header requires the AWS4-HMAC-SHA256 algorithm.");
    };
    let field = |name: &str| {
        rest.split(", ")
            .find_map(|p| p.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
    };
    let (Some(credential), Some(signed), Some(signature)) =
        (field("Credential"), field("SignedHeaders"), field("Signature"))
    else {
        return incomplete(
            "Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' parameters.",
        );
    };
    let scope: Vec<&str> = credential.split('/').collect();
    let date = headers
        .get("x-amz-date")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let well_formed = scope.len() == 5
        && !scope[0].is_empty()
        && scope[1].len() == 8
        && date.len() == 16
        && date.starts_with(scope[1])
        && scope[3] == "bedrock"
        && scope[4] == "aws4_request"
        && signed.split(';').any(|h| h == "host")
        && signed.split(';').any(|h| h == "x-amz-date")
        && (headers.get("x-amz-security-token").is_none()
            || signed.split(';').any(|h| h == "x-amz-security-token"))
        && signature.len() == 64
        && signature.bytes().all(|b| b.is_ascii_hexdigit());
    if well_formed {
        None
    } else {
        incomplete("The request signature we calculated does not match the signature you provided.")
    }
}

/// AWS's refusal of a call it cannot authenticate.
fn refusal(kind: &str, message: &str) -> Response {
    let mut resp = (StatusCode::FORBIDDEN, axum::Json(json!({"message": message}))).into_response();
    if let Ok(v) = axum::http::HeaderValue::from_str(kind) {
        resp.headers_mut().insert("x-amzn-errortype", v);
    }
    resp
}

pub(super) async fn converse(
    State(st): State<Arc<MockState>>,
    Path(model): Path<String>,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    answer(&st, model, headers, raw, false).await
}

pub(super) async fn converse_stream(
    State(st): State<Arc<MockState>>,
    Path(model): Path<String>,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    answer(&st, model, headers, raw, true).await
}

/// One event-stream frame of the event `name` with `payload`, padded as AWS pads it.
fn frame(kind: &str, name: &str, mut payload: Value) -> Option<Bytes> {
    payload["p"] = json!("abcdefghijklmnopqrstuvwxyzABCDEF"[..(name.len() % 16) + 4]);
    let type_header = if kind == "event" {
        ":event-type"
    } else {
        ":exception-type"
    };
    let string =
        |name: &str, value: &str| Header::new(name.to_owned(), HeaderValue::String(value.to_owned().into()));
    let message = Message::new_from_parts(
        vec![
            string(type_header, name),
            string(":content-type", "application/json"),
            string(":message-type", kind),
        ],
        payload.to_string().into_bytes(),
    );
    let mut out = Vec::new();
    write_message_to(&message, &mut out).ok()?;
    Some(Bytes::from(out))
}

async fn answer(st: &MockState, model: String, headers: HeaderMap, raw: Bytes, stream: bool) -> Response {
    if let Some((kind, message)) = malformed(&headers) {
        return refusal(kind, &message);
    }
    let action = if stream { "converse-stream" } else { "converse" };
    let mut inc = Incoming::for_model(
        st,
        &format!("/model/{model}/{action}"),
        &headers,
        &raw,
        Some(model),
    );
    inc.stream = stream;
    inc.delay(st).await;
    if let Some(resp) = inc.scripted_error(st) {
        return resp;
    }
    let words = reply_words(inc.script.words.unwrap_or(5));
    let input = inc.prompt_tokens();
    let output = words.len() as u64;
    let usage = inc
        .reported_usage(json!({"inputTokens": input, "outputTokens": output, "totalTokens": input + output}));
    let tool = inc.script.tool_call.clone();
    let stop_reason = if tool.is_some() { "tool_use" } else { "end_turn" };
    if !stream {
        inc.record(st, 200, Some((input, output)));
        let mut content = vec![json!({"text": words.concat()})];
        if let Some(t) = &tool {
            content.push(
                json!({"toolUse": {"toolUseId": "tooluse_mock_1", "name": t.name, "input": t.arguments}}),
            );
        }
        let mut body = json!({"output": {"message": {"role": "assistant", "content": content}},
            "stopReason": stop_reason, "metrics": {"latencyMs": 12}});
        if let Some(u) = usage {
            body["usage"] = u;
        }
        return json_response(&inc, body);
    }
    let event = |name: &str, payload: Value| frame("event", name, payload);
    let mut events = vec![event("messageStart", json!({"role": "assistant"}))];
    let mut reported = Some((input, output));
    let mut stall = false;
    for (i, w) in words.iter().enumerate() {
        let i = i as u32;
        if inc.script.drop_after_chunks == Some(i) {
            events.push(None);
            reported = None;
            break;
        }
        if inc.script.stall_after_chunks == Some(i) {
            stall = true;
            reported = None;
            break;
        }
        if inc.script.error_after_chunks == Some(i) {
            events.push(frame(
                "exception",
                "serviceUnavailableException",
                json!({"message": "Bedrock is unable to process your request."}),
            ));
            reported = None;
            break;
        }
        events.push(event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"text": w}}),
        ));
    }
    if reported.is_some() {
        events.push(event("contentBlockStop", json!({"contentBlockIndex": 0})));
        if let Some(t) = &tool {
            let (a, b) = t.argument_pieces();
            events.push(event(
                "contentBlockStart",
                json!({"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "tooluse_mock_1", "name": t.name}}}),
            ));
            for piece in [a, b] {
                events.push(event(
                    "contentBlockDelta",
                    json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": piece}}}),
                ));
            }
            events.push(event("contentBlockStop", json!({"contentBlockIndex": 1})));
        }
        events.push(event("messageStop", json!({"stopReason": stop_reason})));
        let mut metadata = json!({"metrics": {"latencyMs": 12}});
        if let Some(u) = usage {
            metadata["usage"] = u;
        }
        events.push(event("metadata", metadata));
    }
    inc.record(st, 200, reported);
    paced_response(&inc, events, "application/vnd.amazon.eventstream", stall)
}
