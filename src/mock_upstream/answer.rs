//! How the mock reads a call and shapes its answer, whatever the provider: the call's credential,
//! model and script, its recording, scripted errors, headers and delays, and JSON or SSE bodies.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};

use super::{Call, MockState, Script};

pub(super) fn credential_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .or_else(|| headers.get("api-key").and_then(|v| v.to_str().ok()))
        .or_else(|| super::bedrock::access_key_id(headers))
        .or_else(|| headers.get("x-goog-api-key").and_then(|v| v.to_str().ok()))
        .map(str::to_owned)
}

/// Words in every string of the messages: the mock's deterministic "token" count.
pub(super) fn count_words(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.split_whitespace().count() as u64,
        Value::Array(a) => a.iter().map(count_words).sum(),
        Value::Object(o) => o
            .iter()
            .filter(|(k, _)| {
                matches!(
                    k.as_str(),
                    "content"
                        | "text"
                        | "messages"
                        | "input"
                        | "system"
                        | "contents"
                        | "parts"
                        | "systemInstruction"
                )
            })
            .map(|(_, v)| count_words(v))
            .sum(),
        _ => 0,
    }
}

pub(super) const WORDS: [&str; 8] = ["Hello", "from", "the", "mock", "upstream", "of", "aigw", "today"];

pub(super) fn reply_words(n: u32) -> Vec<String> {
    (0..n as usize)
        .map(|i| format!("{} ", WORDS[i % WORDS.len()]))
        .collect()
}

/// What a call looks like before it is answered.
pub(super) struct Incoming {
    pub(super) path: String,
    pub(super) credential: Option<String>,
    pub(super) body: Value,
    pub(super) model: Option<String>,
    pub(super) stream: bool,
    pub(super) script: Script,
    pub(super) traceparent: Option<String>,
    /// Answered in Azure OpenAI's shape (its content-filter results beside OpenAI's fields).
    pub(super) azure: bool,
}

impl Incoming {
    pub(super) fn new(st: &MockState, path: &str, headers: &HeaderMap, raw: &Bytes) -> Incoming {
        Incoming::for_model(st, path, headers, raw, None)
    }

    /// A call whose model is `model` when named (Azure's deployment, in the path), else the
    /// body's `model`.
    pub(super) fn for_model(
        st: &MockState,
        path: &str,
        headers: &HeaderMap,
        raw: &Bytes,
        model: Option<String>,
    ) -> Incoming {
        let body: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
        let credential = credential_of(headers);
        let model = model.or_else(|| body.get("model").and_then(Value::as_str).map(str::to_owned));
        let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let script = st
            .take_script(credential.as_deref(), model.as_deref())
            .unwrap_or_default();
        Incoming {
            path: path.to_owned(),
            credential,
            body,
            model,
            stream,
            script,
            traceparent: headers
                .get("traceparent")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            azure: false,
        }
    }

    pub(super) fn prompt_tokens(&self) -> u64 {
        self.script
            .prompt_tokens
            .unwrap_or_else(|| count_words(&self.body).max(1))
    }

    /// The `usage` value to report in place of `real`: the script's override if any (`None`:
    /// leave usage out).
    pub(super) fn reported_usage(&self, real: Value) -> Option<Value> {
        match &self.script.usage {
            None => Some(real),
            Some(Value::Null) => None,
            Some(u) => Some(u.clone()),
        }
    }

    /// What [`Call::usage`] records: none when the script overrode the usage.
    pub(super) fn recorded_usage(&self, real: Option<(u64, u64)>) -> Option<(u64, u64)> {
        real.filter(|_| self.script.usage.is_none())
    }

    pub(super) fn record(&self, st: &MockState, status: u16, usage: Option<(u64, u64)>) {
        let usage = self.recorded_usage(usage);
        st.record(Call {
            path: self.path.clone(),
            credential: self.credential.clone(),
            model: self.model.clone(),
            stream: self.stream,
            body: self.body.clone(),
            status,
            usage,
            traceparent: self.traceparent.clone(),
        });
    }

    /// The scripted raw answer, or else the scripted error response, if the script asks for one.
    pub(super) fn scripted_error(&self, st: &MockState) -> Option<Response> {
        if let Some(raw) = &self.script.raw_body {
            let status = self.script.status.unwrap_or(200);
            self.record(st, status, None);
            let mut resp = Response::new(Body::from(raw.clone()));
            *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            if let Some(ct) = &self.script.content_type {
                resp.headers_mut().insert("content-type", ct.parse().ok()?);
            }
            self.apply_headers(&mut resp);
            return Some(resp);
        }
        let status = self.script.status.filter(|s| *s >= 400)?;
        self.record(st, status, None);
        let body = match &self.script.body {
            Some(Value::String(s)) => Body::from(s.clone()),
            Some(v) => Body::from(v.to_string()),
            None => Body::from(json!({"error": {"message": "mock error", "type": "mock_error"}}).to_string()),
        };
        let mut resp = Response::new(body);
        *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if !matches!(self.script.body, Some(Value::String(_))) {
            resp.headers_mut()
                .insert("content-type", "application/json".parse().ok()?);
        }
        self.apply_headers(&mut resp);
        Some(stall_after_head(self, resp))
    }

    pub(super) fn apply_headers(&self, resp: &mut Response) {
        for (k, v) in &self.script.headers {
            if let (Ok(k), Ok(v)) = (
                axum::http::HeaderName::from_bytes(k.as_bytes()),
                axum::http::HeaderValue::from_str(v),
            ) {
                resp.headers_mut().insert(k, v);
            }
        }
    }

    /// Waits while the mock is held, then the script's delay.
    pub(super) async fn delay(&self, st: &MockState) {
        let mut held = st.held.subscribe();
        if *held.borrow_and_update() {
            st.arrived_held.send_modify(|n| *n += 1);
            let _ = held.wait_for(|h| !*h).await;
        }
        if let Some(ms) = self.script.delay_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

pub(super) fn json_response(inc: &Incoming, body: Value) -> Response {
    let mut resp = axum::Json(body).into_response();
    if let Some(s) = inc.script.status.and_then(|s| StatusCode::from_u16(s).ok()) {
        *resp.status_mut() = s;
    }
    inc.apply_headers(&mut resp);
    stall_after_head(inc, resp)
}

/// The script's stall between the head and the body: the head leaves at once, the body after.
pub(super) fn stall_after_head(inc: &Incoming, resp: Response) -> Response {
    let Some(ms) = inc.script.stall_after_head_ms else {
        return resp;
    };
    let (mut parts, body) = resp.into_parts();
    // The length is known only once the body comes: the head must not promise it.
    parts.headers.remove("content-length");
    let stall = futures::stream::once(tokio::time::sleep(Duration::from_millis(ms)))
        .filter_map(|()| async { None::<Result<Bytes, axum::Error>> });
    let body = stall.chain(body.into_data_stream());
    Response::from_parts(parts, Body::from_stream(body))
}

/// An SSE response whose events are produced with the script's chunk delay (and jitter after the
/// first); `None` drops the connection; with `stall`, the last event is followed by nothing, the
/// connection kept open.
pub(super) fn sse_response(inc: &Incoming, events: Vec<Option<String>>, stall: bool) -> Response {
    let events = events.into_iter().map(|e| e.map(Bytes::from)).collect();
    paced_response(inc, events, "text/event-stream", stall)
}

/// [`sse_response`] for events of any framing and content type (Bedrock's binary event stream).
pub(super) fn paced_response(
    inc: &Incoming,
    events: Vec<Option<Bytes>>,
    content_type: &'static str,
    stall: bool,
) -> Response {
    let delay = inc.script.chunk_delay_ms.unwrap_or(0);
    let jitter = inc.script.chunk_jitter_ms.unwrap_or(0);
    let stream = futures::stream::unfold((events.into_iter(), true), move |(mut it, first)| async move {
        let next = it.next()?;
        let wait = if first || jitter == 0 {
            delay
        } else {
            delay + rand::Rng::gen_range(&mut rand::thread_rng(), 0..=jitter)
        };
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        match next {
            Some(ev) => Some((Ok::<Bytes, std::io::Error>(ev), (it, false))),
            None => Some((
                Err(std::io::Error::other("mock: dropped connection")),
                (it, false),
            )),
        }
    });
    let stalled = if stall {
        futures::stream::pending().boxed()
    } else {
        futures::stream::empty().boxed()
    };
    let mut resp = Response::new(Body::from_stream(stream.chain(stalled)));
    resp.headers_mut()
        .insert("content-type", axum::http::HeaderValue::from_static(content_type));
    inc.apply_headers(&mut resp);
    stall_after_head(inc, resp)
}
