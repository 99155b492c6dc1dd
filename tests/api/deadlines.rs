//! Deadlines: an upstream that sends its head and then stalls, a stream that stops mid-way or never
//! starts, a client that never finishes its body. Each deadline passed is answered (a 504
//! `timeout`, or a final error event on a stream), logged, counted, and the stalling credential is
//! parked as for a 5xx.

use std::time::{Duration, Instant};

use aigw::Settings;
use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, spawn_app};
use crate::proxy::KEY;

/// One OpenAI-compatible credential for `m1` and one Anthropic credential for `claude`: a parked
/// credential leaves its model nothing to fail over to.
fn resources(mock: &MockUpstream) -> String {
    let url = &mock.base_url();
    ResourcesBuilder::acme(KEY)
        .upstream("acme", "solo", url, "cred-solo", &["m1"])
        .provider_upstream(
            "acme",
            ("claude", "anthropic"),
            url,
            "cred-claude",
            &["claude-sonnet"],
        )
        .into()
}

/// A gateway whose deadlines are `settings`' (seconds), on a fresh mock.
async fn start(
    db: &TestDb,
    settings: impl FnOnce(&mut Settings) + Send + 'static,
) -> (TestApp, MockUpstream) {
    let mock = MockUpstream::start().await.unwrap();
    let setup = Setup {
        settings: Box::new(settings),
        ..Setup::resources(resources(&mock))
    };
    (spawn_app(db, setup).await, mock)
}

fn chat(stream: bool) -> Value {
    json!({"model": "m1", "stream": stream, "messages": [{"role": "user", "content": "say hello"}]})
}

/// Far longer than any deadline of these tests: the upstream never gets there.
const FOREVER_MS: u64 = 30_000;
/// What a test allows for a deadline of one second to be noticed and answered.
const SLACK: Duration = Duration::from_millis(1500);

/// The whole answer, or a failure naming how long the test waited: a missing deadline must fail
/// the test, not hang it.
async fn within<T>(wait: Duration, what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(wait, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {wait:?}"))
}

/// Posts `body` to the chat endpoint and expects a 504 within [`SLACK`] of a one-second deadline
/// (`what` names the case when nothing comes back at all).
async fn post_expecting_504(app: &TestApp, what: &str, body: &Value) -> reqwest::Response {
    let started = Instant::now();
    let r = within(
        Duration::from_secs(5),
        what,
        app.post_json("/v1/chat/completions", KEY, body),
    )
    .await;
    let waited = started.elapsed();
    assert_eq!(r.status(), 504, "{what}");
    assert!(waited < SLACK, "{what}: answered after {waited:?}");
    r
}

/// The credential parked by the deadline: the next request finds every credential resting and
/// sends nothing upstream.
async fn assert_parked(app: &TestApp, mock: &MockUpstream, path: &str, body: &Value) {
    let calls = mock.call_count();
    let r = match path {
        "/v1/messages" => app
            .client
            .post(format!("{}{path}", app.address))
            .header("x-api-key", KEY)
            .json(body)
            .send()
            .await
            .unwrap(),
        _ => app.post_json(path, KEY, body).await,
    };
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
    assert_eq!(mock.call_count(), calls, "nothing sent to the parked credential");
}

/// The attempt that ran into the deadline, as the log details it: classified as a 5xx and parked.
fn assert_classified_as_5xx(attempts_detail: &str) {
    let detail: Value = serde_json::from_str(attempts_detail).unwrap();
    let last = &detail[detail.as_array().unwrap().len() - 1];
    assert_eq!(last["rule"], "server_error", "{detail}");
    assert!(last["lock_until"].is_string(), "{detail}");
    assert!(
        last["error"].as_str().is_some_and(|e| e.contains("timeout_secs")),
        "{detail}"
    );
}

both_backends!(
    a_head_then_a_stalled_body_is_a_504_within_the_budget,
    no_head_within_the_budget_is_a_504_that_parks_the_credential,
    an_error_whose_body_stalls_is_a_504,
    a_stream_that_stalls_mid_way_ends_with_a_timeout_event,
    an_anthropic_stream_that_stalls_ends_with_its_error_event,
    a_stream_that_never_starts_is_a_504,
    a_stream_that_keeps_flowing_is_not_cut_off,
    a_whole_stream_on_a_lingering_connection_ends_cleanly,
    a_client_body_that_never_arrives_is_refused_within_its_bound,
);

async fn a_head_then_a_stalled_body_is_a_504_within_the_budget(db: TestDb) {
    let (app, mock) = start(&db, |s| s.request_timeout_secs = 1).await;
    mock.script(Script {
        stall_after_head_ms: Some(FOREVER_MS),
        ..Script::any().times(1)
    });
    let started = Instant::now();
    let r = post_expecting_504(&app, "a stalled body", &chat(false)).await;
    let waited = started.elapsed();
    assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
    let body: Value = within(Duration::from_secs(1), "the 504 body", r.json())
        .await
        .unwrap();
    assert_eq!(body["error"]["code"], "timeout", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("request_timeout_secs"),
        "{body}"
    );
    assert!(waited >= Duration::from_secs(1), "answered after {waited:?}");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.code.as_deref()), (504, Some("timeout")));
    assert_eq!(log.source.as_deref(), Some("gateway"));
    // The head came but no whole answer: the attempt failed, nothing served the request.
    assert_eq!(log.model_served, None);
    assert!(
        log.attempts_detail.contains("\"status\":200"),
        "{}",
        log.attempts_detail
    );
    assert_classified_as_5xx(&log.attempts_detail);
    assert_parked(&app, &mock, "/v1/chat/completions", &chat(false)).await;
    app.stop().await;
}

async fn no_head_within_the_budget_is_a_504_that_parks_the_credential(db: TestDb) {
    let (app, mock) = start(&db, |s| {
        s.request_timeout_secs = 1;
        // A single candidate's retry would have time, were the budget not spent.
        s.single_candidate_retry_min_ms = 10;
        s.single_candidate_retry_max_ms = 10;
    })
    .await;
    mock.script(Script {
        delay_ms: Some(FOREVER_MS),
        ..Script::any().times(1)
    });
    let r = post_expecting_504(&app, "no head", &chat(false)).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "timeout", "{body}");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.code.as_deref()), (504, Some("timeout")));
    assert_eq!(log.attempts, 1, "the spent budget leaves no retry");
    assert_classified_as_5xx(&log.attempts_detail);
    assert_parked(&app, &mock, "/v1/chat/completions", &chat(false)).await;
    app.stop().await;
}

/// A 5xx head whose body never comes: the error cannot be read, let alone passed on.
async fn an_error_whose_body_stalls_is_a_504(db: TestDb) {
    let (app, mock) = start(&db, |s| s.request_timeout_secs = 1).await;
    mock.script(Script {
        stall_after_head_ms: Some(FOREVER_MS),
        ..Script::any()
            .times(1)
            .error(500, json!({"error": {"message": "boom"}}))
    });
    post_expecting_504(&app, "an error body that stalls", &chat(false)).await;
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.code.as_deref()), (504, Some("timeout")));
    let detail: Value = serde_json::from_str(&log.attempts_detail).unwrap();
    assert_eq!(detail[0]["status"], 500, "{detail}");
    assert_classified_as_5xx(&log.attempts_detail);
    assert_parked(&app, &mock, "/v1/chat/completions", &chat(false)).await;
    app.stop().await;
}

async fn a_stream_that_stalls_mid_way_ends_with_a_timeout_event(db: TestDb) {
    let (app, mock) = start(&db, |s| s.stream_idle_timeout_secs = 1).await;
    mock.script(Script {
        stall_after_chunks: Some(2),
        ..Script::any().times(1)
    });
    let started = Instant::now();
    let r = app.post_json("/v1/chat/completions", KEY, &chat(true)).await;
    assert_eq!(r.status(), 200);
    let text = within(Duration::from_secs(5), "a stalled stream", r.text())
        .await
        .unwrap();
    assert!(started.elapsed() < SLACK, "ended after {:?}", started.elapsed());
    // What the upstream sent arrived, then the gateway's final event.
    assert!(
        text.contains("\"content\":\"Hello \"") && text.contains("\"content\":\"from \""),
        "{text}"
    );
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    let event: Value = serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(event["error"]["code"], "timeout", "{text}");
    assert!(
        event["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stream_idle_timeout_secs"),
        "{event}"
    );
    assert!(!text.contains("[DONE]"), "{text}");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.code.as_deref()), (200, Some("timeout")));
    assert_eq!(log.source.as_deref(), Some("gateway"));
    // What was delivered is counted: the two content chunks, and an estimate of the prompt.
    assert_eq!((log.completion_tokens, log.usage_estimated), (2, 1));
    assert!(log.prompt_tokens > 0);
    assert_classified_as_5xx(&log.attempts_detail);
    assert_parked(&app, &mock, "/v1/chat/completions", &chat(true)).await;
    app.stop().await;
}

async fn an_anthropic_stream_that_stalls_ends_with_its_error_event(db: TestDb) {
    let (app, mock) = start(&db, |s| s.stream_idle_timeout_secs = 1).await;
    mock.script(Script {
        stall_after_chunks: Some(1),
        ..Script::any().times(1)
    });
    let body = json!({"model": "claude-sonnet", "max_tokens": 64, "stream": true,
                      "messages": [{"role": "user", "content": "hi there"}]});
    let r = app.post_messages(KEY, None, &body).await;
    assert_eq!(r.status(), 200);
    let text = within(Duration::from_secs(5), "a stalled stream", r.text())
        .await
        .unwrap();
    assert!(text.contains("\"text\":\"Hello \""), "{text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    let data = last
        .strip_prefix("event: error\ndata: ")
        .unwrap_or_else(|| panic!("an Anthropic error event last: {text}"));
    let event: Value = serde_json::from_str(data).unwrap();
    assert_eq!(event["type"], "error");
    assert_eq!(event["error"]["type"], "timeout_error", "{event}");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.code.as_deref()), (200, Some("timeout")));
    assert_eq!((log.completion_tokens, log.usage_estimated), (1, 1));
    assert_parked(&app, &mock, "/v1/messages", &body).await;
    app.stop().await;
}

async fn a_stream_that_never_starts_is_a_504(db: TestDb) {
    let (app, mock) = start(&db, |s| s.stream_first_byte_timeout_secs = 1).await;
    mock.script(Script {
        stall_after_head_ms: Some(FOREVER_MS),
        ..Script::any().times(1)
    });
    // Not a byte had gone to the client: a plain 504 instead of a stream.
    let r = post_expecting_504(&app, "a stream with no first byte", &chat(true)).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "timeout", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stream_first_byte_timeout_secs"),
        "{body}"
    );
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.code.as_deref()), (504, Some("timeout")));
    assert_eq!(log.total_tokens, 0, "nothing was delivered");
    assert_classified_as_5xx(&log.attempts_detail);
    assert_parked(&app, &mock, "/v1/chat/completions", &chat(true)).await;
    app.stop().await;
}

/// The idle deadline is a gap between chunks, and the first-byte deadline ends with the first
/// byte: a stream that takes longer than both, chunk after chunk, is delivered whole.
async fn a_stream_that_keeps_flowing_is_not_cut_off(db: TestDb) {
    let (app, mock) = start(&db, |s| {
        s.stream_first_byte_timeout_secs = 1;
        s.stream_idle_timeout_secs = 1;
    })
    .await;
    // Eight events 300 ms apart: 2.4 s in all.
    mock.script(Script::any().chunk_delay(300).words(5));
    let r = app.post_json("/v1/chat/completions", KEY, &chat(true)).await;
    assert_eq!(r.status(), 200);
    let text = within(Duration::from_secs(6), "a flowing stream", r.text())
        .await
        .unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.code.as_deref()), (200, None));
    assert_eq!(log.usage_estimated, 0);
    app.stop().await;
}

/// An upstream that sends a whole stream (usage and `[DONE]` included) and then keeps the
/// connection open without ending the body.
async fn lingering_upstream() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                let mut request = Vec::new();
                // The gateway's request: its head, then a body of the announced length.
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    let Ok(n @ 1..) = tcp.read(&mut buf).await else {
                        return;
                    };
                    request.extend_from_slice(&buf[..n]);
                }
                let events = concat!(
                    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n",
                    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n",
                    "data: [DONE]\n\n",
                );
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{events}\r\n",
                    events.len()
                );
                let _ = tcp.write_all(answer.as_bytes()).await;
                // No last chunk: the body never ends; the connection stays until the gateway drops it.
                let _ = tcp.read(&mut buf).await;
            });
        }
    });
    format!("http://{addr}/v1")
}

/// A stream that ended properly (`[DONE]`) on a connection the upstream keeps open is whole: the
/// idle deadline ends it without an error event, and nothing is parked.
async fn a_whole_stream_on_a_lingering_connection_ends_cleanly(db: TestDb) {
    let url = lingering_upstream().await;
    let text = ResourcesBuilder::acme(KEY).upstream("acme", "lingering", &url, "cred-lingering", &["m1"]);
    let setup = Setup {
        settings: Box::new(|s| s.stream_idle_timeout_secs = 1),
        ..Setup::resources(text)
    };
    let app = spawn_app(&db, setup).await;
    let r = app.post_json("/v1/chat/completions", KEY, &chat(true)).await;
    assert_eq!(r.status(), 200);
    let text = within(Duration::from_secs(5), "a lingering stream", r.text())
        .await
        .unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.code.as_deref()), (200, None));
    assert_eq!(
        (log.prompt_tokens, log.completion_tokens, log.usage_estimated),
        (3, 1, 0)
    );
    let detail: Value = serde_json::from_str(&log.attempts_detail).unwrap();
    assert!(detail[0]["rule"].is_null(), "nothing parked: {detail}");
    app.stop().await;
}

async fn a_client_body_that_never_arrives_is_refused_within_its_bound(db: TestDb) {
    let (app, mock) = start(&db, |s| s.client_body_timeout_secs = 1).await;
    let addr = app.address.strip_prefix("http://").unwrap();
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    // A body of 100 bytes announced; 10 sent, the rest never.
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"model\":"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // Read until the gateway closes the connection: it does not wait on for the rest of a body
    // it gave up on.
    loop {
        let read = tcp.read(&mut buf);
        let n = within(Duration::from_secs(5), "an unfinished client body", read)
            .await
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    let waited = started.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"request_timeout\""), "{answer}");
    assert!(answer.contains("x-aigw-error-source: gateway"), "{answer}");
    assert!(
        waited >= Duration::from_millis(900) && waited < SLACK,
        "answered after {waited:?}"
    );
    assert_eq!(mock.call_count(), 0, "nothing sent upstream");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.code.as_deref()), (408, Some("request_timeout")));
    app.stop().await;
}
