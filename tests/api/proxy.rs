//! The proxy path against the mock upstream: OpenAI and Anthropic shapes, streaming, usage,
//! errors, failover, request logs.

use std::time::{Duration, Instant};

use aigw::mock_upstream::{MockUpstream, Script};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, aliased, price, spawn_app, spawn_on_mock};

pub const KEY: &str = "sk-aigw-ProxyTestKey0123456789abcdefghij";

/// A workspace with one key, two OpenAI-compatible credentials and one Anthropic credential,
/// all on `mock`.
pub fn resources(mock: &MockUpstream) -> String {
    fixture(mock).into()
}

/// [`resources`] as a builder, for the suites that extend it.
pub fn fixture(mock: &MockUpstream) -> ResourcesBuilder {
    let url = &mock.base_url();
    ResourcesBuilder::acme(KEY)
        .upstream("acme", "primary", url, "cred-primary", &[])
        .with(
            "models",
            vec![
                "gpt-4o-mini".into(),
                "text-embedding-3-small".into(),
                aliased("fast", "fast-upstream"),
            ],
        )
        .with("priority", 0)
        .provider_upstream("acme", ("backup", "openai"), url, "cred-backup", &["gpt-4o-mini"])
        .with("priority", 1)
        .provider_upstream(
            "acme",
            ("claude", "anthropic"),
            url,
            "cred-claude",
            &["claude-sonnet"],
        )
        .model("acme", "gpt-4o-mini")
        .with("fallbacks", vec!["fast"])
        .with("price", price(1.0, 2.0))
        .model("acme", "fast")
}

async fn start(db: &TestDb) -> (TestApp, MockUpstream) {
    spawn_on_mock(db, resources).await
}

fn chat(stream: bool) -> Value {
    json!({"model": "gpt-4o-mini", "stream": stream, "messages": [{"role": "user", "content": "say hello to me"}]})
}

both_backends!(
    chat_non_streamed_logs_the_upstream_usage,
    chat_stream_hides_the_injected_usage_chunk,
    chat_stream_keeps_usage_the_client_asked_for,
    embeddings_and_models,
    anthropic_messages_streamed_and_not,
    bad_requests_get_clear_errors_and_are_logged,
    a_lone_surrogate_escape_is_refused_like_invalid_utf8,
    unknown_keys_are_refused_and_throttled,
    last_upstream_error_goes_back_as_is,
    failover_to_the_next_credential_and_model,
    slow_stream_arrives_chunk_by_chunk,
    client_disconnect_still_logs_delivered_tokens,
    a_request_its_client_abandons_before_the_answer_is_logged,
    a_request_unanswered_past_the_shutdown_grace_is_logged,
    a_stream_running_past_the_shutdown_grace_is_cut_and_logged,
    mid_stream_error_is_passed_logged_and_counted,
    a_deleted_key_stops_working_at_once,
    metrics_are_exposed,
);

async fn chat_non_streamed_logs_the_upstream_usage(db: TestDb) {
    let (app, mock) = start(&db).await;
    let r = app.post_json("/v1/chat/completions", KEY, &chat(false)).await;
    assert_eq!(r.status(), 200);
    let request_id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");
    let call = &mock.calls()[0];
    assert_eq!(
        call.credential.as_deref(),
        Some("cred-primary"),
        "priority 0 first"
    );
    let (prompt, completion) = call.usage.unwrap();
    assert_eq!(body["usage"]["prompt_tokens"], prompt);
    let logs = app.logs("acme", 1).await;
    let log = &logs[0];
    assert_eq!(log.request_id, request_id);
    assert_eq!((log.status, log.attempts), (200, 1));
    assert_eq!(
        (log.prompt_tokens, log.completion_tokens),
        (prompt as i64, completion as i64)
    );
    assert_eq!(log.total_tokens, (prompt + completion) as i64);
    // 1 credit / M prompt + 2 credits / M completion tokens, in micro-credits.
    assert_eq!(log.credits, prompt as i64 + 2 * completion as i64);
    assert_eq!(log.model_requested.as_deref(), Some("gpt-4o-mini"));
    assert_eq!(log.model_served.as_deref(), Some("gpt-4o-mini"));
    assert_eq!(log.endpoint, "chat.completions");
    assert_eq!(log.usage_estimated, 0);
    assert!(log.source.is_none());
    app.stop().await;
}

async fn read_stream(r: reqwest::Response) -> String {
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    r.text().await.unwrap()
}

async fn chat_stream_hides_the_injected_usage_chunk(db: TestDb) {
    let (app, mock) = start(&db).await;
    let text = read_stream(app.post_json("/v1/chat/completions", KEY, &chat(true)).await).await;
    assert!(
        !text.contains("usage"),
        "the client did not ask for usage: {text}"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"));
    let sent = &mock.calls()[0].body;
    assert_eq!(
        sent["stream_options"]["include_usage"], true,
        "the gateway asked for usage itself"
    );
    let (prompt, completion) = mock.calls()[0].usage.unwrap();
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(
        (log.prompt_tokens, log.completion_tokens),
        (prompt as i64, completion as i64)
    );
    assert_eq!((log.stream, log.usage_estimated), (1, 0));
    assert!(log.ttfb_ms.is_some());
    app.stop().await;
}

async fn chat_stream_keeps_usage_the_client_asked_for(db: TestDb) {
    let (app, _mock) = start(&db).await;
    let mut body = chat(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = read_stream(app.post_json("/v1/chat/completions", KEY, &body).await).await;
    assert!(text.contains("\"usage\":{"), "{text}");
    assert!(
        text.contains("\"usage\":null"),
        "untouched when the client asked: {text}"
    );
    app.stop().await;
}

async fn embeddings_and_models(db: TestDb) {
    let (app, mock) = start(&db).await;
    let r = app
        .post_json(
            "/v1/embeddings",
            KEY,
            &json!({"model": "text-embedding-3-small", "input": ["a b c", "d"]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["data"].as_array().unwrap().len(), 2);
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.endpoint.as_str(), log.prompt_tokens), ("embeddings", 4));
    assert_eq!(mock.calls()[0].path, "/v1/embeddings");

    let r = app
        .client
        .get(format!("{}/v1/models", app.address))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["claude-sonnet", "fast", "gpt-4o-mini", "text-embedding-3-small"]
    );
    let r = app.get("/v1/models").await;
    assert_eq!(r.status(), 401);
    app.stop().await;
}

async fn anthropic_messages_streamed_and_not(db: TestDb) {
    let (app, mock) = start(&db).await;
    let body = json!({"model": "claude-sonnet", "max_tokens": 64, "messages": [{"role": "user", "content": "hi there"}]});
    let r = app.post_messages(KEY, Some("2023-06-01"), &body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = app.post_messages(KEY, None, &streamed).await;
    let text = read_stream(r).await;
    assert!(text.contains("event: message_stop"));
    let calls = mock.calls();
    assert!(
        calls
            .iter()
            .all(|c| c.credential.as_deref() == Some("cred-claude") && c.path == "/v1/messages")
    );
    let logs = app.logs("acme", 2).await;
    for (log, call) in logs.iter().rev().zip(&calls) {
        let (i, o) = call.usage.unwrap();
        assert_eq!(
            (log.prompt_tokens, log.completion_tokens),
            (i as i64, o as i64),
            "{log:?}"
        );
        assert_eq!(log.endpoint, "messages");
    }
    // A Claude model is no embedding model: the request is at the wrong endpoint, a 400 that
    // says where, and nothing is sent. (On the chat endpoints every chat model answers, see
    // translate.rs.)
    let calls = mock.call_count();
    let embed = json!({"model": "claude-sonnet", "input": "hi"});
    let r = app.post_json("/v1/embeddings", KEY, &embed).await;
    assert_eq!(r.status(), 400, "the wrong endpoint is the request's mistake");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "model");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("POST /v1/chat/completions"),
        "{v}"
    );
    assert_eq!(mock.call_count(), calls);
    app.stop().await;
}

async fn bad_requests_get_clear_errors_and_are_logged(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(
        &db,
        Setup {
            settings: Box::new(|s| s.max_body_bytes = 4096),
            ..Setup::resources(resources(&mock))
        },
    )
    .await;
    let url = format!("{}/v1/chat/completions", app.address);
    let send = |body: Vec<u8>| {
        app.client
            .post(&url)
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{not json".to_vec(), 400, "invalid_request_error"),
        (vec![0xff, 0xfe, 0x00], 400, "invalid_request_error"),
        (
            br#"{"messages":[{"role":"user","content":"x"}]}"#.to_vec(),
            400,
            "invalid_request_error",
        ),
        (
            br#"{"model":"gpt-4o-mini","messages":"x"}"#.to_vec(),
            400,
            "invalid_request_error",
        ),
        (
            br#"{"model":"no-such-model","messages":[{"role":"user","content":"x"}]}"#.to_vec(),
            404,
            "model_not_found",
        ),
        (
            format!(
                r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{}"}}]}}"#,
                "x".repeat(5000)
            )
            .into_bytes(),
            413,
            "request_too_large",
        ),
    ];
    for (body, status, code) in &cases {
        let r = send(body.clone()).await.unwrap();
        assert_eq!(r.status(), *status, "{}", String::from_utf8_lossy(body));
        assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], *code);
        assert!(v["error"]["message"].as_str().unwrap().len() > 10);
    }
    // A chunked body over the limit (no Content-Length) is refused too.
    let big = futures::stream::iter((0..10).map(|_| Ok::<_, std::io::Error>(vec![b' '; 1000])));
    let r = app
        .client
        .post(&url)
        .bearer_auth(KEY)
        .body(reqwest::Body::wrap_stream(big))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(mock.call_count(), 0, "nothing bad went upstream");
    let logs = app.logs("acme", cases.len() + 1).await;
    assert!(
        logs.iter()
            .all(|l| l.source.as_deref() == Some("gateway") && l.status >= 400)
    );
    assert!(
        logs.iter()
            .any(|l| l.code.as_deref() == Some("request_too_large"))
    );
    assert!(logs.iter().all(|l| l.explanation.starts_with("Gateway: ")));
    app.stop().await;
}

/// A `\uXXXX` escape that is half a surrogate pair names no character: refused before anything
/// goes upstream, with the same answer as raw invalid UTF-8; a whole pair passes.
async fn a_lone_surrogate_escape_is_refused_like_invalid_utf8(db: TestDb) {
    let (app, mock) = start(&db).await;
    let url = format!("{}/v1/chat/completions", app.address);
    let send = |content: &[u8]| {
        let mut body = br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":""#.to_vec();
        body.extend_from_slice(content);
        body.extend_from_slice(br#""}]}"#);
        app.client
            .post(&url)
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let refusal = async |r: reqwest::Response| {
        let status = r.status().as_u16();
        let source = r
            .headers()
            .get("x-aigw-error-source")
            .map(|v| v.to_str().unwrap().to_owned());
        let v: Value = r.json().await.unwrap();
        let message = v["error"]["message"].as_str().unwrap_or_default().to_owned();
        let prefix = message.split(':').next().unwrap_or_default().to_owned();
        (
            (
                status,
                source,
                v["error"]["type"].clone(),
                v["error"]["code"].clone(),
            ),
            prefix,
            message,
        )
    };
    // Raw bytes of the UTF-8 encoding of U+D800, which is not UTF-8.
    let (raw, raw_prefix, _) = refusal(send(b"hi \xed\xa0\x80").await.unwrap()).await;
    assert_eq!((raw.0, raw.1.as_deref()), (400, Some("gateway")));
    for lone in [
        r"hi \ud800",
        r"\udfff",
        r"\uD83D then text",
        r"\ud83d\u0041",
        r"\udc00\ud83d",
        r"\\\udbff",
    ] {
        let (shape, prefix, message) = refusal(send(lone.as_bytes()).await.unwrap()).await;
        assert_eq!(shape, raw, "{lone}: {message}");
        assert_eq!(prefix, raw_prefix, "{lone}: {message}");
        assert!(message.contains("surrogate"), "{lone}: {message}");
    }
    assert_eq!(mock.call_count(), 0, "nothing went upstream");

    for fine in [r"\ud83d\ude00", r"\uD83D\uDE00 and \u00e9", r"\\ud800 is text"] {
        let r = send(fine.as_bytes()).await.unwrap();
        assert_eq!(r.status(), 200, "{fine}: {}", r.text().await.unwrap());
    }
    let sent: Vec<String> = mock
        .calls()
        .iter()
        .map(|c| {
            c.body["messages"][0]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(sent, ["😀", "😀 and é", r"\ud800 is text"]);
    app.stop().await;
}

async fn unknown_keys_are_refused_and_throttled(db: TestDb) {
    let (app, mock) = start(&db).await;
    let url = format!("{}/v1/chat/completions", app.address);
    let r = app.client.post(&url).json(&chat(false)).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    let mut throttled = None;
    for i in 0..30 {
        let r = app
            .post_json(
                "/v1/chat/completions",
                "sk-aigw-0000000000000000000000000000bad0",
                &chat(false),
            )
            .await;
        if r.status() == 429 {
            throttled = Some((i, r));
            break;
        }
        assert_eq!(r.status(), 401);
    }
    let (i, r) = throttled.expect("repeated failures from one address are slowed");
    assert!(i >= 15, "a burst is allowed first ({i})");
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "auth_rate_limited");
    // The good key still works.
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat(false))
            .await
            .status(),
        200
    );
    assert_eq!(mock.call_count(), 1);
    app.stop().await;
}

async fn last_upstream_error_goes_back_as_is(db: TestDb) {
    let (app, mock) = start(&db).await;
    let error = json!({"error": {"message": "Rate limit reached for gpt-4o-mini", "type": "requests", "code": "rate_limit_exceeded"}});
    mock.script(
        Script::any()
            .model("gpt-4o-mini")
            .header("retry-after", "7")
            .error(429, error.clone()),
    );
    mock.script(
        Script::any()
            .model("fast-upstream")
            .header("retry-after", "9")
            .error(429, error.clone()),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat(false)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-aigw-error-source"], "upstream");
    assert_eq!(r.headers()["retry-after"], "9", "the last upstream's Retry-After");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v, error);
    assert_eq!(mock.call_count(), 3, "primary, backup, then the fallback model");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.attempts), (429, 3));
    assert_eq!(log.source.as_deref(), Some("upstream"));
    assert_eq!(log.code.as_deref(), Some("rate_limit_exceeded"));
    assert!(
        log.explanation
            .contains("primary 429 (provider_named_reset, locked until 2026-12-01T02:00:07Z)"),
        "{}",
        log.explanation
    );
    let detail: Value = serde_json::from_str(&log.attempts_detail).unwrap();
    assert_eq!(detail.as_array().unwrap().len(), 3);
    assert_eq!(detail[2]["model"], "fast");
    app.stop().await;
}

async fn failover_to_the_next_credential_and_model(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(
        Script::any()
            .credential("cred-primary")
            .times(1)
            .error(500, json!({"error": {"message": "boom"}})),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat(false)).await;
    assert_eq!(r.status(), 200);
    let calls = mock.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].credential.as_deref(), Some("cred-backup"));
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.attempts), (200, 2));
    // A 400 about the request goes to the next model, not the next credential.
    mock.reset();
    mock.script(Script::any().model("gpt-4o-mini").times(1).error(
        400,
        json!({"error": {"message": "Unsupported parameter: 'foo'", "type": "invalid_request_error"}}),
    ));
    let r = app.post_json("/v1/chat/completions", KEY, &chat(false)).await;
    assert_eq!(r.status(), 200);
    let calls = mock.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[1].model.as_deref(),
        Some("fast-upstream"),
        "mapped upstream name of the fallback"
    );
    let log = &app.logs("acme", 2).await[0];
    assert_eq!(log.model_served.as_deref(), Some("fast"));
    app.stop().await;
}

async fn slow_stream_arrives_chunk_by_chunk(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().chunk_delay(150).words(4));
    let started = Instant::now();
    let r = app.post_json("/v1/chat/completions", KEY, &chat(true)).await;
    let mut stream = r.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    let first_at = started.elapsed();
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    let done_at = started.elapsed();
    // The upstream takes 7 × 150 ms; the first chunk must arrive long before the end.
    assert!(
        first_at < Duration::from_millis(500),
        "first chunk after {first_at:?}"
    );
    assert!(
        done_at - first_at > Duration::from_millis(600),
        "{first_at:?} .. {done_at:?}"
    );
    app.stop().await;
}

async fn client_disconnect_still_logs_delivered_tokens(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().chunk_delay(100).words(20));
    let r = app.post_json("/v1/chat/completions", KEY, &chat(true)).await;
    let mut stream = r.bytes_stream();
    let mut received = String::new();
    while received.matches("\"content\":\"").count() < 4 {
        received.push_str(&String::from_utf8_lossy(&stream.next().await.unwrap().unwrap()));
    }
    drop(stream);
    let delivered = received.matches("\"content\":\"").count() as i64 - 1; // the role chunk is empty
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.usage_estimated, 1);
    assert_eq!(log.code.as_deref(), Some("client_disconnected"));
    assert!(
        log.completion_tokens >= delivered && log.completion_tokens <= delivered + 1,
        "{log:?} vs {delivered}"
    );
    assert!(log.prompt_tokens > 0);
    app.stop().await;
}

/// The client gives up while the upstream still thinks: the request is logged with status 499
/// (no status went to the client) and what was attempted; nothing was served, so nothing counts.
async fn a_request_its_client_abandons_before_the_answer_is_logged(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script {
        delay_ms: Some(10_000),
        ..Script::any().times(1)
    });
    let gave_up = app
        .client
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(KEY)
        .json(&chat(false))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.status, 499, "{log:?}");
    assert_eq!(log.code.as_deref(), Some("client_disconnected"));
    assert!(log.source.is_none());
    assert_eq!(
        log.explanation,
        "client disconnected before the answer [primary no answer yet]"
    );
    assert_eq!(log.attempts, 1);
    assert!(log.upstream_id.is_some(), "the credential it waited for");
    assert_eq!((log.total_tokens, log.credits, log.usage_estimated), (0, 0, 0));
    assert_eq!(log.model_requested.as_deref(), Some("gpt-4o-mini"));
    // Its in-flight places were given back: the next request is served.
    let r = app.post_json("/v1/chat/completions", KEY, &chat(false)).await;
    assert_eq!(r.status(), 200);
    app.stop().await;
}

/// A gateway whose stop gives running requests no grace (`shutdown_grace_secs = 0`).
async fn spawn_without_grace(db: &TestDb, mock: &MockUpstream) -> TestApp {
    let setup = Setup {
        settings: Box::new(|s| s.shutdown_grace_secs = 0),
        ..Setup::resources(resources(mock))
    };
    spawn_app(db, setup).await
}

/// A stop whose grace ends while a request still waits for its upstream: the connection is
/// closed without an answer, and the request is logged as `gateway_stopped`.
async fn a_request_unanswered_past_the_shutdown_grace_is_logged(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_without_grace(&db, &mock).await;
    mock.script(Script {
        delay_ms: Some(20_000),
        ..Script::any().times(1)
    });
    let request = app
        .client
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(KEY)
        .json(&chat(false))
        .send();
    let waiting = tokio::spawn(request);
    let primary = app.credential_id("primary").await;
    let asked = Instant::now();
    while app.state.admission.in_flight(primary) == 0 {
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopping = Instant::now();
    app.stop().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "the stop waited {:?}",
        stopping.elapsed()
    );
    let answer = waiting.await.unwrap();
    assert!(
        answer.is_err(),
        "the connection closes without an answer: {answer:?}"
    );

    let again = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let log = &again.logs("acme", 1).await[0];
    assert_eq!(
        (log.status, log.code.as_deref()),
        (499, Some("gateway_stopped")),
        "{log:?}"
    );
    assert_eq!(log.source.as_deref(), Some("gateway"));
    assert!(
        log.explanation.ends_with("[primary no answer yet]"),
        "{}",
        log.explanation
    );
    assert_eq!((log.total_tokens, log.usage_estimated), (0, 0));
    again.stop().await;
}

/// A stop waits `shutdown_grace_secs` for the running requests (none here), then closes their
/// connections: the client's stream ends without `[DONE]`, the stop does not wait for the
/// upstream's end, and what was delivered is logged as `gateway_stopped`.
async fn a_stream_running_past_the_shutdown_grace_is_cut_and_logged(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_without_grace(&db, &mock).await;
    // 200 words 100 ms apart: 20 s of stream.
    mock.script(Script::any().chunk_delay(100).words(200));
    let r = app.post_json("/v1/chat/completions", KEY, &chat(true)).await;
    let mut stream = r.bytes_stream();
    let mut received = String::new();
    while received.matches("\"content\":\"").count() < 4 {
        received.push_str(&String::from_utf8_lossy(&stream.next().await.unwrap().unwrap()));
    }
    let stopping = Instant::now();
    app.stop().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "the stop waited {:?} for the stream",
        stopping.elapsed()
    );
    while let Some(Ok(chunk)) = stream.next().await {
        received.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(!received.contains("[DONE]"), "{received}");
    let delivered = received.matches("\"content\":\"").count() as i64 - 1; // the role chunk is empty

    let again = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let log = &again.logs("acme", 1).await[0];
    assert_eq!(log.code.as_deref(), Some("gateway_stopped"), "{log:?}");
    assert_eq!(log.usage_estimated, 1);
    assert!(
        log.completion_tokens >= delivered && log.completion_tokens <= delivered + 1,
        "{log:?} vs {delivered}"
    );
    again.stop().await;
}

async fn mid_stream_error_is_passed_logged_and_counted(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script {
        error_after_chunks: Some(2),
        ..Script::any()
    });
    let text = read_stream(app.post_json("/v1/chat/completions", KEY, &chat(true)).await).await;
    assert!(
        text.contains("\"finish_reason\":\"error\""),
        "passed to the client: {text}"
    );
    assert_eq!(mock.call_count(), 1, "nothing fails over once bytes were sent");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.code.as_deref(), Some("upstream_stream_error"));
    assert_eq!(log.source.as_deref(), Some("upstream"));
    assert!(log.explanation.contains("mid-stream error"));
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("aigw_stream_errors_total"));
    app.stop().await;
}

async fn a_deleted_key_stops_working_at_once(db: TestDb) {
    let (app, _mock) = start(&db).await;
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat(false))
            .await
            .status(),
        200
    );
    let owner = app.login("owner@example.test", "owner-password").await;
    let keys: Value = app.get_as("/admin/v1/keys", &owner).await.json().await.unwrap();
    let id = keys["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "ci")
        .expect("the ci key")["id"]
        .clone();
    let r = app
        .client
        .delete(format!("{}/admin/v1/keys/{id}", app.address))
        .bearer_auth(&owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = app.post_json("/v1/chat/completions", KEY, &chat(false)).await;
    assert_eq!(r.status(), 401, "the deleted key is refused on the next request");
    let r = app.get_as("/admin/v1/workspace", &owner).await;
    assert_eq!(r.status(), 200, "the rest of the workspace stays");
    app.stop().await;
}

async fn metrics_are_exposed(db: TestDb) {
    let (app, _mock) = start(&db).await;
    app.post_json("/v1/chat/completions", KEY, &chat(false)).await;
    let text = app.get("/metrics").await.text().await.unwrap();
    for name in [
        "aigw_requests_total",
        "aigw_request_duration_seconds",
        "aigw_upstream_duration_seconds",
        "aigw_tokens_total",
        "aigw_log_queue_depth",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    app.stop().await;
}

both_backends!(log_query_filters_and_pages);

async fn log_query_filters_and_pages(db: TestDb) {
    use aigw::request_log::LogFilter;
    use aigw::store::RequestLogStore;
    let (app, _mock) = start(&db).await;
    for _ in 0..5 {
        assert_eq!(
            app.post_json("/v1/chat/completions", KEY, &chat(false))
                .await
                .status(),
            200
        );
    }
    let emb = json!({"model": "text-embedding-3-small", "input": "x"});
    assert_eq!(app.post_json("/v1/embeddings", KEY, &emb).await.status(), 200);
    let bad = json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]});
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &bad).await.status(),
        404
    );
    let all = app.logs("acme", 7).await;
    let ws = all[0].workspace_id;
    let store = &app.state.store;
    let f = |f: LogFilter| LogFilter {
        workspace_id: ws,
        ..f
    };
    let page = store
        .logs(&f(LogFilter {
            model: Some("text-embedding-3-small".into()),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    let page = store
        .logs(&f(LogFilter {
            status: Some(404),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].code.as_deref(), Some("model_not_found"));
    let page = store
        .logs(&f(LogFilter {
            source: Some("gateway".into()),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    let page = store
        .logs(&f(LogFilter {
            key_id: Some(all[0].key_id),
            member_id: Some(all[0].member_id),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 7);
    let none = store
        .logs(&f(LogFilter {
            from: Some(all[0].ts + 1),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert!(none.items.is_empty());
    let other_ws = store
        .logs(&LogFilter {
            workspace_id: ws + 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(other_ws.items.is_empty(), "never another workspace's logs");
    // Cursor pagination: 3 + 3 + 1, newest first, no overlap.
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .logs(&f(LogFilter {
                limit: Some(3),
                cursor,
                ..Default::default()
            }))
            .await
            .unwrap();
        seen.extend(page.items.iter().map(|r| r.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    sorted.dedup();
    assert_eq!(seen, sorted);
    assert_eq!(seen.len(), 7);
    // Retention: everything older than the cutoff goes.
    assert_eq!(store.prune_logs(all[0].ts + 1).await.unwrap(), 7);
    app.stop().await;
}

both_backends!(a_flush_writes_every_record_once_whatever_its_size);

async fn a_flush_writes_every_record_once_whatever_its_size(db: TestDb) {
    use aigw::request_log::{LogFilter, LogRecord};
    use aigw::store::RequestLogStore;
    let (app, _mock) = start(&db).await;
    let store = &app.state.store;
    // Flushes are written as statements of 100, 20, 5 and 1 rows: sizes below, at and between
    // them.
    let sizes = [1usize, 4, 5, 19, 20, 21, 99, 100, 127];
    // Dated at the test clock's now: the retention task, whose first prune may run at any time
    // during the test, must find nothing of these to delete.
    let start_ms = app.clock.now().timestamp_millis();
    let mut expected = Vec::new();
    for (flush, n) in sizes.into_iter().enumerate() {
        let records: Vec<LogRecord> = (0..n)
            // Every column a value of its own, so that a value bound to another column shows.
            .map(|i| {
                let v = |k: i64| 1000 * k + i as i64;
                LogRecord {
                    id: 0,
                    request_id: format!("flush{flush}-row{i}"),
                    ts: start_ms + expected.len() as i64 + i as i64,
                    workspace_id: 4242,
                    key_id: v(1),
                    member_id: v(2),
                    department_id: Some(v(3)),
                    endpoint: "chat.completions".into(),
                    model_requested: Some(format!("asked-{i}")),
                    model_served: Some(format!("served-{i}")),
                    upstream_id: Some(v(4)),
                    attempts: v(5),
                    attempts_detail: format!("[{i}]"),
                    status: 200,
                    code: Some(format!("code-{i}")),
                    source: Some(format!("source-{i}")),
                    explanation: format!("row {i} of {n}"),
                    stream: i as i64 % 2,
                    prompt_tokens: v(6),
                    completion_tokens: v(7),
                    total_tokens: v(8),
                    credits: v(9),
                    usage_estimated: 1 - i as i64 % 2,
                    latency_ms: v(10),
                    ttfb_ms: Some(v(11)),
                    upstream_latency_ms: Some(v(12)),
                    client_ip: Some(format!("10.0.0.{i}")),
                    would_refuse: Some(format!("policy-{i}")),
                    tags: Some(format!("team=t{i}")),
                    end_user: Some(format!("user-{i}")),
                }
            })
            .collect();
        store.insert_logs(records.as_slice()).await.unwrap();
        expected.extend(records);
    }
    let page = store
        .logs(&LogFilter {
            workspace_id: 4242,
            limit: Some(500),
            ..LogFilter::default()
        })
        .await
        .unwrap();
    let mut stored: Vec<LogRecord> = page.items.into_iter().map(|r| LogRecord { id: 0, ..r }).collect();
    stored.sort_by_key(|r| r.ts);
    assert_eq!(stored.len(), sizes.iter().sum::<usize>());
    assert_eq!(stored, expected);
    app.stop().await;
}
