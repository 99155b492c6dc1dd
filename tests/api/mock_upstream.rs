//! The mock upstream speaks each provider's success, stream and error shapes and counts calls.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

async fn post(mock: &MockUpstream, path: &str, key: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("http://{}{path}", mock.addr()))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn chat_non_streamed_reports_usage() {
    let mock = MockUpstream::start().await.unwrap();
    let r = post(
        &mock,
        "/v1/chat/completions",
        "k1",
        json!({"model": "m", "messages": [{"role": "user", "content": "one two three"}]}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    assert_eq!(body["usage"]["completion_tokens"], 5);
    assert_eq!(body["usage"]["total_tokens"], 8);
    assert_eq!(mock.call_count(), 1);
    assert_eq!(mock.calls()[0].usage, Some((3, 5)));
}

#[tokio::test]
async fn chat_stream_ends_with_usage_only_when_asked() {
    let mock = MockUpstream::start().await.unwrap();
    for (include, want_usage) in [(true, true), (false, false)] {
        let r = post(
            &mock,
            "/v1/chat/completions",
            "k1",
            json!({"model": "m", "stream": true, "stream_options": {"include_usage": include},
                   "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let text = r.text().await.unwrap();
        assert!(text.trim_end().ends_with("data: [DONE]"));
        assert_eq!(text.contains("\"usage\""), want_usage, "{text}");
        assert_eq!(text.matches("\"content\":\"").count(), 6, "role chunk + 5 words");
    }
}

#[tokio::test]
async fn scripts_match_credential_and_model_and_are_used_up() {
    let mock = MockUpstream::start().await.unwrap();
    mock.script(
        Script::any()
            .credential("k1")
            .model("m")
            .times(1)
            .header("retry-after", "120")
            .error(
                429,
                json!({"error": {"message": "Rate limit exceeded", "type": "rate_limit_error"}}),
            ),
    );
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    let other_key = post(&mock, "/v1/chat/completions", "k2", body.clone()).await;
    assert_eq!(other_key.status(), 200, "another credential is not scripted");
    let r = post(&mock, "/v1/chat/completions", "k1", body.clone()).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "120");
    let again = post(&mock, "/v1/chat/completions", "k1", body).await;
    assert_eq!(again.status(), 200, "times(1) is used up");
    assert_eq!(mock.call_count(), 3);
}

#[tokio::test]
async fn scripts_over_http_and_reset() {
    let mock = MockUpstream::start().await.unwrap();
    let c = reqwest::Client::new();
    let r = c
        .post(format!("http://{}/__mock/script", mock.addr()))
        .json(&json!({"model": "claude", "status": 529,
                      "body": {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let bad = c
        .post(format!("http://{}/__mock/script", mock.addr()))
        .body("{\"nope\":1}")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400, "unknown script fields are refused");
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/messages", mock.addr()))
        .header("x-api-key", "ak")
        .json(&json!({"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 529);
    let calls: Value = c
        .get(format!("http://{}/__mock/calls", mock.addr()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(calls["count"], 1);
    assert_eq!(calls["calls"][0]["credential"], "ak");
    c.post(format!("http://{}/__mock/reset", mock.addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(mock.call_count(), 0);
}

#[tokio::test]
async fn anthropic_messages_stream_carries_usage_events() {
    let mock = MockUpstream::start().await.unwrap();
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/messages", mock.addr()))
        .header("x-api-key", "ak")
        .json(&json!({"model": "claude", "max_tokens": 5, "stream": true,
                      "messages": [{"role": "user", "content": "a b"}]}))
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    assert!(text.starts_with("event: message_start"));
    assert!(text.contains("\"input_tokens\":2"));
    assert!(text.contains("event: message_delta") && text.contains("\"output_tokens\":5"));
    assert!(text.contains("event: message_stop"));
}

#[tokio::test]
async fn mid_stream_error_and_embeddings() {
    let mock = MockUpstream::start().await.unwrap();
    mock.script(Script {
        error_after_chunks: Some(2),
        ..Script::any()
    });
    let r = post(
        &mock,
        "/v1/chat/completions",
        "k",
        json!({"model": "m", "stream": true, "messages": []}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("\"finish_reason\":\"error\""));
    mock.reset();
    let r = post(
        &mock,
        "/v1/embeddings",
        "k",
        json!({"model": "e", "input": ["a b", "c"]}),
    )
    .await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["data"].as_array().unwrap().len(), 2);
    assert_eq!(body["usage"]["prompt_tokens"], 3);
}

#[tokio::test]
async fn a_rate_limit_refuses_calls_over_the_windows_allowance() {
    let mock = MockUpstream::start().await.unwrap();
    // An hour's window: the three calls below fall in one window.
    mock.script(Script::any().credential("k1").rate_limit(2, 3_600_000));
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    for _ in 0..2 {
        let r = post(&mock, "/v1/chat/completions", "k1", body.clone()).await;
        assert_eq!(r.status(), 200, "within the allowance");
    }
    let r = post(&mock, "/v1/chat/completions", "k1", body.clone()).await;
    assert_eq!(r.status(), 429);
    let secs: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    let ms: u64 = r.headers()["retry-after-ms"].to_str().unwrap().parse().unwrap();
    assert!((1..=3600).contains(&secs), "{secs}");
    assert_eq!(secs, ms.div_ceil(1000), "the same wait, rounded up to seconds");
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "rate_limit_exceeded");
    let other = post(&mock, "/v1/chat/completions", "k2", body).await;
    assert_eq!(other.status(), 200, "another credential is not limited");
    let counts = mock.calls_by_credential();
    assert_eq!((counts["k1"], counts["k2"]), (3, 1));
    let listed: Value = reqwest::get(format!("http://{}/__mock/calls", mock.addr()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["by_credential"], json!({"k1": 3, "k2": 1}));
}

#[tokio::test]
async fn a_script_paces_streams_with_a_delay_and_jitter() {
    let mock = MockUpstream::start().await.unwrap();
    let r = reqwest::Client::new()
        .post(format!("http://{}/__mock/script", mock.addr()))
        .json(&json!({"words": 2, "chunk_delay_ms": 5, "chunk_jitter_ms": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "chunk_jitter_ms is a script field");
    let started = std::time::Instant::now();
    let r = post(
        &mock,
        "/v1/chat/completions",
        "k1",
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    let text = r.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let events = text.matches("data: ").count();
    assert_eq!(events, 5, "role, two words, finish, [DONE]: {text}");
    // Each event waits at least the delay (the jitter only adds to it).
    assert!(started.elapsed() >= std::time::Duration::from_millis(5 * events as u64));
}
