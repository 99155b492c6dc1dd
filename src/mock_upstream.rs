//! A scriptable mock of the providers' APIs, for tests, benchmarks and the README demo.
//!
//! It speaks OpenAI chat completions (streamed or not, with `usage`), embeddings and model lists,
//! Anthropic messages (streamed or not), Azure OpenAI's deployments and v1 paths (`azure.rs`), AWS Bedrock's Converse and
//! ConverseStream, event-stream frames and all (`bedrock.rs`), and Gemini's own `generateContent` /
//! `streamGenerateContent` (`google.rs`). By default every call succeeds with deterministic
//! usage; a [`Script`] makes calls for one credential and/or model answer with any status,
//! headers and body (each provider error shape of `shared/seeds/`), a delay, slow chunks, a
//! mid-stream error, a dropped connection, a head followed by a body that stalls, or a provider's
//! own rate limit (a fixed window of so many calls). It records every call so tests can assert
//! that nothing was sent upstream, and counts calls per credential; in-process, it holds calls
//! until released (requests in flight for as long as a test needs). Control it in-process
//! ([`MockUpstream`]) or over HTTP:
//! `POST /__mock/script` (a [`Script`] as JSON), `GET /__mock/calls`, `POST /__mock/reset`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

mod answer;
mod anthropic;
mod azure;
mod bedrock;
mod google;
mod openai;

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
    /// Streamed: add up to this many milliseconds, at random, to every wait between chunks after
    /// the first (the first chunk still comes `chunk_delay_ms` after the head): an LLM's uneven
    /// pace, e.g. `chunk_delay_ms` 20 and `chunk_jitter_ms` 30 for events 20–50 ms apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_jitter_ms: Option<u64>,
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
    /// Add up to `ms` at random to every wait between streamed chunks after the first.
    pub fn chunk_jitter(mut self, ms: u64) -> Self {
        self.chunk_jitter_ms = Some(ms);
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
    /// The W3C `traceparent` the call carried.
    #[serde(default)]
    pub traceparent: Option<String>,
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
    /// While true, chat and messages calls wait on arrival ([`MockUpstream::hold`]).
    held: tokio::sync::watch::Sender<bool>,
    /// Calls that arrived while held, since the hold began.
    arrived_held: tokio::sync::watch::Sender<usize>,
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
        self.held.send_replace(false);
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

    /// Also serves on `addr` over TLS with the certificate chain and key of the PEM files
    /// `cert` and `key`, offering HTTP/2 and HTTP/1.1 (ALPN) as the large providers do; hyper's
    /// server allows 200 concurrent streams a connection. Returns the bound address.
    pub async fn serve_tls(
        &self,
        addr: SocketAddr,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> std::io::Result<SocketAddr> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|e| bad(&e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(&e))?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(&e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| bad(&e))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let app = router(self.state.clone());
        let stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    () = stop.cancelled() => return,
                };
                let Ok((tcp, _)) = accepted else {
                    // Out of descriptors, say: wait for some to close rather than spin.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let _ =
                        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                            .serve_connection(
                                hyper_util::rt::TokioIo::new(tls),
                                hyper_util::service::TowerToHyperService::new(app),
                            )
                            .await;
                });
            }
        });
        Ok(addr)
    }

    /// Base URL to configure as an upstream's `base_url` (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// An Azure OpenAI resource endpoint to configure as an `azure` upstream's `base_url`
    /// (`http://127.0.0.1:PORT`).
    pub fn azure_endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A Bedrock Runtime endpoint to configure as a `bedrock` upstream's `base_url`
    /// (`http://127.0.0.1:PORT`).
    pub fn bedrock_endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Gemini's API root to configure as a `google` upstream's `base_url`
    /// (`http://127.0.0.1:PORT/v1beta`).
    pub fn google_base_url(&self) -> String {
        format!("http://{}/v1beta", self.addr)
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

    /// Holds the chat and messages calls that arrive from now on (before the script's delay)
    /// until [`MockUpstream::release`]: requests in flight upstream for as long as a test needs.
    pub fn hold(&self) {
        self.state.arrived_held.send_replace(0);
        self.state.held.send_replace(true);
    }

    /// Lets every held call, and those that arrive later, go on.
    pub fn release(&self) {
        self.state.held.send_replace(false);
    }

    /// Waits until `n` calls have arrived since [`MockUpstream::hold`].
    pub async fn until_held(&self, n: usize) {
        let mut arrived = self.state.arrived_held.subscribe();
        let _ = arrived.wait_for(|a| *a >= n).await;
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
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/models", get(openai::models))
        .route(
            "/openai/deployments/{deployment}/chat/completions",
            post(azure::deployment_chat),
        )
        .route(
            "/openai/deployments/{deployment}/embeddings",
            post(azure::deployment_embeddings),
        )
        .route("/openai/v1/chat/completions", post(azure::v1_chat))
        .route("/openai/v1/embeddings", post(azure::v1_embeddings))
        .route("/model/{model}/converse", post(bedrock::converse))
        .route("/model/{model}/converse-stream", post(bedrock::converse_stream))
        .route("/v1beta/models/{call}", post(google::call))
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
