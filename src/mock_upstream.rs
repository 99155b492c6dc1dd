//! A scriptable mock of the providers' APIs, for tests, benchmarks and the README demo.
//!
//! It speaks OpenAI chat completions (streamed or not, with `usage`), embeddings and model lists,
//! and Anthropic messages (streamed or not). By default every call succeeds with deterministic
//! usage; a [`Script`] makes calls for one credential and/or model answer with any status,
//! headers and body (each provider error shape of `shared/seeds/`), a delay, slow chunks, a
//! mid-stream error, a dropped connection, a head followed by a body that stalls, or a provider's
//! own rate limit (a fixed window of so many calls). It records every call so tests can assert that
//! nothing was sent upstream, and counts calls per credential. Control it in-process ([`MockUpstream`]) or over HTTP:
//! `POST /__mock/script` (a [`Script`] as JSON), `GET /__mock/calls`, `POST /__mock/reset`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// One scripted behaviour. Fields left out keep the default success behaviour.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// Only calls made with this credential (bearer token or `x-api-key`); any when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// Only calls for this model; any when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// How many calls this script answers before it is used up; forever when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
    /// Status to answer with; a status ≥ 400 answers `body` (or a generic error) instead of a
    /// completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Extra response headers.
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub headers: HashMap<String, String>,
    /// Response body: JSON, or a string sent as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    /// Wait this long before answering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Wait this long between streamed chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_delay_ms: Option<u64>,
    /// Words in the completion (one streamed chunk each); default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub words: Option<u32>,
    /// Streamed: after this many content chunks, send the provider's mid-stream error event
    /// (OpenAI: a chunk with `finish_reason: "error"`; Anthropic: an `error` event) and end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_after_chunks: Option<u32>,
    /// Streamed: after this many content chunks, close the connection without finishing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_after_chunks: Option<u32>,
    /// Override the reported usage: prompt tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// Send the status and headers at once, then wait this long before the body (a stream:
    /// before its first event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_after_head_ms: Option<u64>,
    /// Streamed: after this many content chunks, send nothing more and keep the connection open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_after_chunks: Option<u32>,
    /// Replaces every `usage` the answer reports (the body's, the stream's usage chunk,
    /// Anthropic's `message_start` and `message_delta` usage) with this JSON value as is, however
    /// absurd; `null` (also over HTTP) leaves usage out of the answer altogether.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub usage: Option<Value>,
    /// Answer with exactly this body, with `status` (any, 200 when absent; even one outside
    /// 100–599) and `content_type`, instead of the endpoint's own answer: a misbehaving upstream
    /// (HTML, truncated JSON, an event stream to a request that asked for none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_body: Option<String>,
    /// The content type of a `raw_body` answer; none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// A provider's rate limit: calls this script matches beyond the window's allowance answer
    /// 429 with `Retry-After` and `retry-after-ms` until the window ends, and OpenAI's
    /// rate-limit body; calls within it are answered as the rest of the script says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// Answer with a call of this tool after the text: OpenAI's `tool_calls` (finish reason
    /// `tool_calls`) or Anthropic's `tool_use` block (stop reason `tool_use`); streamed, its
    /// arguments come in two pieces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call: Option<ToolCall>,
}

/// A tool call the mock answers with.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments, a JSON object.
    pub arguments: Value,
}

impl ToolCall {
    /// The arguments as JSON text, cut in two for a stream.
    fn argument_pieces(&self) -> (String, String) {
        let text = self.arguments.to_string();
        let mid = text
            .char_indices()
            .nth(text.chars().count() / 2)
            .map_or(0, |(i, _)| i);
        (text[..mid].to_owned(), text[mid..].to_owned())
    }
}

/// A fixed-window rate limit: `requests` calls per `window_ms`, windows aligned to the Unix epoch.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Calls allowed in one window.
    pub requests: u32,
    /// The window's length in milliseconds (default 1000).
    #[serde(default = "one_second")]
    pub window_ms: u64,
}

fn one_second() -> u64 {
    1000
}

/// A field that is present, `null` included (serde reads an `Option` field's `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl Script {
    /// A script for every call.
    pub fn any() -> Self {
        Script::default()
    }
    /// Only for this credential.
    pub fn credential(mut self, c: &str) -> Self {
        self.credential = Some(c.to_owned());
        self
    }
    /// Only for this model.
    pub fn model(mut self, m: &str) -> Self {
        self.model = Some(m.to_owned());
        self
    }
    /// Used up after `n` calls.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }
    /// Answer with this status and JSON body.
    pub fn error(mut self, status: u16, body: Value) -> Self {
        self.status = Some(status);
        self.body = Some(body);
        self
    }
    /// Add a response header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.insert(name.to_owned(), value.to_owned());
        self
    }
    /// Answer with exactly `body`, this status and content type.
    pub fn raw(mut self, status: u16, content_type: &str, body: &str) -> Self {
        self.status = Some(status);
        self.content_type = Some(content_type.to_owned());
        self.raw_body = Some(body.to_owned());
        self
    }
    /// Wait between streamed chunks.
    pub fn chunk_delay(mut self, ms: u64) -> Self {
        self.chunk_delay_ms = Some(ms);
        self
    }
    /// Words in the completion.
    pub fn words(mut self, n: u32) -> Self {
        self.words = Some(n);
        self
    }
    /// Report this `usage` value instead of the real one (`Value::Null`: no usage at all).
    pub fn usage(mut self, usage: Value) -> Self {
        self.usage = Some(usage);
        self
    }
    /// Answer with a call of tool `name` with `arguments`.
    pub fn tool_call(mut self, name: &str, arguments: Value) -> Self {
        self.tool_call = Some(ToolCall {
            name: name.to_owned(),
            arguments,
        });
        self
    }
    /// Allow `requests` calls per `window_ms`; refuse the rest with a 429 naming the wait.
    pub fn rate_limit(mut self, requests: u32, window_ms: u64) -> Self {
        self.rate_limit = Some(RateLimit {
            requests,
            window_ms: window_ms.max(1),
        });
        self
    }

    /// This script turned into the provider's refusal of a call over its rate limit, `wait_ms`
    /// before the window ends.
    fn over_rate_limit(mut self, wait_ms: u64) -> Self {
        self.status = Some(429);
        self.raw_body = None;
        self.headers
            .insert("retry-after".to_owned(), wait_ms.div_ceil(1000).to_string());
        self.headers
            .insert("retry-after-ms".to_owned(), wait_ms.to_string());
        self.body = Some(json!({"error": {
            "message": "Rate limit reached for requests. Please try again later.",
            "type": "requests", "param": null, "code": "rate_limit_exceeded"}}));
        self
    }
}

/// One call the mock received.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Call {
    /// Request path.
    pub path: String,
    /// Credential presented.
    pub credential: Option<String>,
    /// Model asked for.
    pub model: Option<String>,
    /// Whether a stream was asked for.
    pub stream: bool,
    /// The request body as JSON (null if it was not JSON).
    pub body: Value,
    /// Status answered.
    pub status: u16,
    /// Usage reported in the answer: (prompt, completion) tokens; for a stream, what the full
    /// stream reports (a dropped or stalled stream reports nothing; nor does a script's `usage`
    /// override).
    pub usage: Option<(u64, u64)>,
}

/// Calls kept for inspection; the count keeps counting past it.
const MAX_KEPT_CALLS: usize = 10_000;

#[derive(Default)]
struct MockState {
    /// Whether calls are kept for inspection (off for benchmarks: only counted).
    keep_calls: bool,
    scripts: Mutex<Vec<Script>>,
    /// Per script (by position) with a rate limit: its current window's start (Unix ms) and the
    /// calls admitted in it.
    windows: Mutex<HashMap<usize, (u64, u32)>>,
    calls: Mutex<Vec<Call>>,
    count: std::sync::atomic::AtomicUsize,
    /// Calls per credential presented (none: `""`), counted even when calls are not kept.
    by_credential: Mutex<HashMap<String, usize>>,
}

impl MockState {
    fn take_script(&self, credential: Option<&str>, model: Option<&str>) -> Option<Script> {
        let mut scripts = self.scripts.lock().unwrap_or_else(|p| p.into_inner());
        let pos = scripts.iter().position(|s| {
            s.credential.as_deref().is_none_or(|c| Some(c) == credential)
                && s.model.as_deref().is_none_or(|m| Some(m) == model)
                && s.times != Some(0)
        })?;
        let s = &mut scripts[pos];
        if let Some(t) = s.times.as_mut() {
            *t -= 1;
        }
        let script = s.clone();
        let Some(limit) = script.rate_limit else {
            return Some(script);
        };
        let now = u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0);
        let start = now - now % limit.window_ms;
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let window = windows.entry(pos).or_insert((start, 0));
        if window.0 != start {
            *window = (start, 0);
        }
        if window.1 < limit.requests {
            window.1 += 1;
            Some(script)
        } else {
            Some(script.over_rate_limit(start + limit.window_ms - now))
        }
    }

    fn reset(&self) {
        self.scripts.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.windows.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.by_credential
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.count.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    fn record(&self, call: Call) {
        self.count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *self
            .by_credential
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(call.credential.clone().unwrap_or_default())
            .or_insert(0) += 1;
        if !self.keep_calls {
            return;
        }
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        // Benchmarks send millions of calls: keep the most recent ones only.
        if calls.len() >= MAX_KEPT_CALLS {
            calls.drain(..MAX_KEPT_CALLS / 2);
        }
        calls.push(call);
    }
}

/// A running mock upstream.
pub struct MockUpstream {
    addr: SocketAddr,
    state: Arc<MockState>,
    stop: CancellationToken,
}

impl MockUpstream {
    /// Starts on 127.0.0.1 with a free port.
    pub async fn start() -> std::io::Result<MockUpstream> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts on `addr`, keeping every call for inspection.
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<MockUpstream> {
        Self::start_with(addr, true).await
    }

    /// Starts on `addr`; with `keep_calls` false calls are only counted (benchmarks).
    pub async fn start_with(addr: SocketAddr, keep_calls: bool) -> std::io::Result<MockUpstream> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let state = Arc::new(MockState {
            keep_calls,
            ..MockState::default()
        });
        let stop = CancellationToken::new();
        let app = router(state.clone());
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(s.cancelled_owned())
                .await;
        });
        Ok(MockUpstream { addr, state, stop })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL to configure as an upstream's `base_url` (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Adds a script; earlier scripts match first.
    pub fn script(&self, s: Script) {
        self.state
            .scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(s);
    }

    /// Forgets scripts and calls.
    pub fn reset(&self) {
        self.state.reset();
    }

    /// Every call received so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many calls were received (control endpoints excluded).
    pub fn call_count(&self) -> usize {
        self.state.count.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many calls each credential made (`""`: calls without one).
    pub fn calls_by_credential(&self) -> HashMap<String, usize> {
        self.state
            .by_credential
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops serving.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn router(state: Arc<MockState>) -> Router {
    Router::new()
        .route("/__mock/script", post(add_script))
        .route("/__mock/calls", get(list_calls))
        .route("/__mock/reset", post(reset))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/messages", post(messages))
        .route("/v1/models", get(models))
        .with_state(state)
}

async fn add_script(State(st): State<Arc<MockState>>, body: Bytes) -> Response {
    match serde_json::from_slice::<Script>(&body) {
        Ok(s) => {
            st.scripts.lock().unwrap_or_else(|p| p.into_inner()).push(s);
            (StatusCode::CREATED, axum::Json(json!({"ok": true}))).into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

async fn list_calls(State(st): State<Arc<MockState>>) -> Response {
    let calls = st.calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let count = st.count.load(std::sync::atomic::Ordering::Relaxed);
    let by_credential = st.by_credential.lock().unwrap_or_else(|p| p.into_inner()).clone();
    axum::Json(json!({"count": count, "by_credential": by_credential, "calls": calls})).into_response()
}

async fn reset(State(st): State<Arc<MockState>>) -> StatusCode {
    st.reset();
    StatusCode::NO_CONTENT
}

fn credential_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::to_owned)
}

/// Words in every string of the messages: the mock's deterministic "token" count.
fn count_words(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.split_whitespace().count() as u64,
        Value::Array(a) => a.iter().map(count_words).sum(),
        Value::Object(o) => o
            .iter()
            .filter(|(k, _)| matches!(k.as_str(), "content" | "text" | "messages" | "input" | "system"))
            .map(|(_, v)| count_words(v))
            .sum(),
        _ => 0,
    }
}

const WORDS: [&str; 8] = ["Hello", "from", "the", "mock", "upstream", "of", "aigw", "today"];

fn reply_words(n: u32) -> Vec<String> {
    (0..n as usize)
        .map(|i| format!("{} ", WORDS[i % WORDS.len()]))
        .collect()
}

/// What a call looks like before it is answered.
struct Incoming {
    path: &'static str,
    credential: Option<String>,
    body: Value,
    model: Option<String>,
    stream: bool,
    script: Script,
}

impl Incoming {
    fn new(st: &MockState, path: &'static str, headers: &HeaderMap, raw: &Bytes) -> Incoming {
        let body: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
        let credential = credential_of(headers);
        let model = body.get("model").and_then(Value::as_str).map(str::to_owned);
        let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let script = st
            .take_script(credential.as_deref(), model.as_deref())
            .unwrap_or_default();
        Incoming {
            path,
            credential,
            body,
            model,
            stream,
            script,
        }
    }

    fn prompt_tokens(&self) -> u64 {
        self.script
            .prompt_tokens
            .unwrap_or_else(|| count_words(&self.body).max(1))
    }

    /// The `usage` value to report in place of `real`: the script's override if any (`None`:
    /// leave usage out).
    fn reported_usage(&self, real: Value) -> Option<Value> {
        match &self.script.usage {
            None => Some(real),
            Some(Value::Null) => None,
            Some(u) => Some(u.clone()),
        }
    }

    /// What [`Call::usage`] records: none when the script overrode the usage.
    fn recorded_usage(&self, real: Option<(u64, u64)>) -> Option<(u64, u64)> {
        real.filter(|_| self.script.usage.is_none())
    }

    fn record(&self, st: &MockState, status: u16, usage: Option<(u64, u64)>) {
        let usage = self.recorded_usage(usage);
        st.record(Call {
            path: self.path.to_owned(),
            credential: self.credential.clone(),
            model: self.model.clone(),
            stream: self.stream,
            body: self.body.clone(),
            status,
            usage,
        });
    }

    /// The scripted raw answer, or else the scripted error response, if the script asks for one.
    fn scripted_error(&self, st: &MockState) -> Option<Response> {
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

    fn apply_headers(&self, resp: &mut Response) {
        for (k, v) in &self.script.headers {
            if let (Ok(k), Ok(v)) = (
                axum::http::HeaderName::from_bytes(k.as_bytes()),
                axum::http::HeaderValue::from_str(v),
            ) {
                resp.headers_mut().insert(k, v);
            }
        }
    }

    async fn delay(&self) {
        if let Some(ms) = self.script.delay_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

fn json_response(inc: &Incoming, body: Value) -> Response {
    let mut resp = axum::Json(body).into_response();
    if let Some(s) = inc.script.status.and_then(|s| StatusCode::from_u16(s).ok()) {
        *resp.status_mut() = s;
    }
    inc.apply_headers(&mut resp);
    stall_after_head(inc, resp)
}

/// The script's stall between the head and the body: the head leaves at once, the body after.
fn stall_after_head(inc: &Incoming, resp: Response) -> Response {
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

/// An SSE response whose events are produced with the script's chunk delay; `None` drops the
/// connection; with `stall`, the last event is followed by nothing, the connection kept open.
fn sse_response(inc: &Incoming, events: Vec<Option<String>>, stall: bool) -> Response {
    let delay = inc.script.chunk_delay_ms.unwrap_or(0);
    let stream = futures::stream::unfold(events.into_iter(), move |mut it| async move {
        let next = it.next()?;
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        match next {
            Some(ev) => Some((Ok::<Bytes, std::io::Error>(Bytes::from(ev)), it)),
            None => Some((Err(std::io::Error::other("mock: dropped connection")), it)),
        }
    });
    let stalled = if stall {
        futures::stream::pending().boxed()
    } else {
        futures::stream::empty().boxed()
    };
    let mut resp = Response::new(Body::from_stream(stream.chain(stalled)));
    resp.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("text/event-stream"),
    );
    inc.apply_headers(&mut resp);
    stall_after_head(inc, resp)
}

async fn chat(State(st): State<Arc<MockState>>, headers: HeaderMap, raw: Bytes) -> Response {
    let inc = Incoming::new(&st, "/v1/chat/completions", &headers, &raw);
    inc.delay().await;
    if let Some(resp) = inc.scripted_error(&st) {
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
        inc.record(&st, 200, Some((prompt, completion)));
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
    inc.record(&st, 200, reported);
    sse_response(&inc, events, stall)
}

async fn embeddings(State(st): State<Arc<MockState>>, headers: HeaderMap, raw: Bytes) -> Response {
    let inc = Incoming::new(&st, "/v1/embeddings", &headers, &raw);
    inc.delay().await;
    if let Some(resp) = inc.scripted_error(&st) {
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
    inc.record(&st, 200, Some((prompt, 0)));
    let mut body = json!({"object": "list", "data": data, "model": inc.model.clone().unwrap_or_default()});
    if let Some(u) = inc.reported_usage(json!({"prompt_tokens": prompt, "total_tokens": prompt})) {
        body["usage"] = u;
    }
    json_response(&inc, body)
}

async fn messages(State(st): State<Arc<MockState>>, headers: HeaderMap, raw: Bytes) -> Response {
    let inc = Incoming::new(&st, "/v1/messages", &headers, &raw);
    inc.delay().await;
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

async fn models(State(st): State<Arc<MockState>>, headers: HeaderMap) -> Response {
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
