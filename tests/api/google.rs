//! Gemini's own API (`google`) through the real HTTP surface: `generateContent` and
//! `streamGenerateContent?alt=sse` with the key in `x-goog-api-key`, chat translated both ways
//! (system text, tools, images, stop sequences, usage), `/v1/messages` through the chat
//! translation, a per-day quota parked to midnight Pacific, and a request Gemini refuses that
//! is the request's fault.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, aliased, spawn_app, spawn_on_mock};
use crate::translate::{chunks, delta_text, header};

const KEY: &str = "sk-aigw-GoogleTestKey0123456789abcdefghi";

fn resources(mock: &MockUpstream) -> String {
    fixture(mock).into()
}

/// [`resources`] as a builder.
fn fixture(mock: &MockUpstream) -> ResourcesBuilder {
    ResourcesBuilder::acme(KEY)
        .provider_upstream(
            "acme",
            ("gemini-direct", "google"),
            &mock.google_base_url(),
            "cred-google",
            &[],
        )
        .with("models", vec![aliased("flash", "gemini-2.5-flash")])
}

async fn start(db: &TestDb) -> (TestApp, MockUpstream) {
    spawn_on_mock(db, resources).await
}

/// Google's own per-day free-tier 429: a `QuotaFailure` naming a per-day quota, and a
/// `RetryInfo` of seconds that does not mean the quota is back then.
const PER_DAY_429: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.5-flash"},"quotaValue":"250"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"17s"}]}}"#;

both_backends!(
    chat_reaches_generate_content_with_the_goog_key_header,
    a_stream_is_translated_with_its_usage,
    messages_reach_google_through_chat,
    a_per_day_quota_parks_until_midnight_pacific,
    invalid_argument_is_the_requests_fault,
    an_image_by_url_is_refused_by_name,
    embeddings_go_to_batch_embed_contents,
    the_connection_test_pings_generate_content_and_clears_the_day,
);

async fn the_connection_test_pings_generate_content_and_clears_the_day(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let text = fixture(&mock).member_with_password("acme", "boss@acme.test", "admin", "boss-password-1");
    let app = spawn_app(&db, Setup::resources(text)).await;
    mock.script(
        Script::any()
            .times(1)
            .error(429, serde_json::from_str(PER_DAY_429).unwrap()),
    );
    let chat = json!({"model": "flash", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat).await.status(),
        429
    );
    let up = app.credential_id("gemini-direct").await;
    let token = app.login("boss@acme.test", "boss-password-1").await;
    let url = format!("{}/admin/v1/upstreams/{}", app.address, up);
    let body: Value = app
        .client
        .get(&url)
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["locks"][0]["rule"], "google_daily_quota", "{body}");
    let r = app
        .client
        .post(format!("{url}/test"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["ok"], true, "{body}");
    let ping = mock.calls().last().cloned().unwrap();
    assert_eq!(ping.path, "/v1beta/models/gemini-2.5-flash:generateContent");
    assert_eq!(ping.body["generationConfig"]["maxOutputTokens"], 1);
    // The test cleared the day's park: the model is served again at once.
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat).await.status(),
        200
    );
}

async fn embeddings_go_to_batch_embed_contents(db: TestDb) {
    let (app, mock) = start(&db).await;
    let r = app
        .post_json(
            "/v1/embeddings",
            KEY,
            &json!({"model": "flash", "input": ["a b c", "d"]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert_eq!(v["data"][0]["embedding"][0], 3.0);
    assert_eq!(v["data"][1]["index"], 1);
    let call = &mock.calls()[0];
    assert_eq!(call.path, "/v1beta/models/gemini-2.5-flash:batchEmbedContents");
    assert_eq!(call.body["requests"][1]["model"], "models/gemini-2.5-flash");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.status, 200);
    assert_eq!(log.usage_estimated, 1);
}

async fn chat_reaches_generate_content_with_the_goog_key_header(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().tool_call("lookup", json!({"q": "x"})));
    let body = json!({
        "model": "flash",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "say hello to me"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}
        ],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
        "stop": ["END"],
        "max_tokens": 64,
        "temperature": 0.5
    });
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-aigw-provider"), "google");
    let v: Value = r.json().await.unwrap();
    let message = &v["choices"][0]["message"];
    assert_eq!(message["content"], "Hello from the mock upstream ");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "lookup");
    assert_eq!(message["tool_calls"][0]["function"]["arguments"], "{\"q\":\"x\"}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(v["object"], "chat.completion");
    let calls = mock.calls();
    assert_eq!(calls.len(), 1);
    // The mock refuses a call without x-goog-api-key, or with the key in the URL.
    assert_eq!(calls[0].path, "/v1beta/models/gemini-2.5-flash:generateContent");
    assert_eq!(calls[0].credential.as_deref(), Some("cred-google"));
    let sent = &calls[0].body;
    assert_eq!(sent["systemInstruction"]["parts"][0]["text"], "be brief");
    assert_eq!(sent["contents"][0]["role"], "user");
    assert_eq!(
        sent["contents"][0]["parts"][1]["inlineData"]["mimeType"],
        "image/png"
    );
    assert_eq!(sent["tools"][0]["functionDeclarations"][0]["name"], "lookup");
    assert_eq!(
        sent["generationConfig"],
        json!({"stopSequences": ["END"], "maxOutputTokens": 64, "temperature": 0.5})
    );
    let (prompt, completion) = calls[0].usage.unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], prompt);
    assert_eq!(v["usage"]["total_tokens"], prompt + completion);
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.status, 200);
    assert_eq!(
        (log.prompt_tokens, log.completion_tokens),
        (prompt as i64, completion as i64)
    );
}

async fn a_stream_is_translated_with_its_usage(db: TestDb) {
    let (app, mock) = start(&db).await;
    let body = json!({"model": "flash", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "say hello to me"}]});
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let events = chunks(&text);
    assert_eq!(events.last().unwrap(), &json!("[DONE]"));
    assert_eq!(delta_text(&events), "Hello from the mock upstream ");
    assert!(
        events.iter().any(|e| e["choices"][0]["finish_reason"] == "stop"),
        "{text}"
    );
    let call = &mock.calls()[0];
    assert_eq!(call.path, "/v1beta/models/gemini-2.5-flash:streamGenerateContent");
    let (prompt, completion) = call.usage.unwrap();
    let usage = events.iter().find(|e| e["usage"].is_object()).expect(&text);
    assert_eq!(usage["usage"]["completion_tokens"], completion);
    app.assert_stream_logged((prompt, completion)).await;
}

async fn messages_reach_google_through_chat(db: TestDb) {
    let (app, mock) = start(&db).await;
    let body = json!({"model": "flash", "max_tokens": 100, "system": "be brief",
        "messages": [{"role": "user", "content": "say hello to me"}]});
    let r = app.post_json("/v1/messages", KEY, &body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "Hello from the mock upstream ");
    assert_eq!(v["stop_reason"], "end_turn");
    let call = &mock.calls()[0];
    assert_eq!(call.body["systemInstruction"]["parts"][0]["text"], "be brief");
    assert_eq!(call.body["generationConfig"]["maxOutputTokens"], 100);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = app.post_json("/v1/messages", KEY, &streamed).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("message_stop"), "{text}");
    assert!(text.contains("Hello"), "{text}");
}

async fn a_per_day_quota_parks_until_midnight_pacific(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(
        Script::any()
            .times(1)
            .error(429, serde_json::from_str(PER_DAY_429).unwrap()),
    );
    let chat = json!({"model": "flash", "messages": [{"role": "user", "content": "hi"}]});
    let r = app.post_json("/v1/chat/completions", KEY, &chat).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "x-aigw-error-source"), "upstream");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "RESOURCE_EXHAUSTED");
    // Not the 17 s retryDelay: an hour later the model is still parked, and the wait named is
    // long enough that the client is told not to retry.
    app.clock.advance(chrono::Duration::hours(1));
    let r = app.post_json("/v1/chat/completions", KEY, &chat).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "x-should-retry"), "false");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_quota_exhausted");
    assert_eq!(mock.calls().len(), 1);
    // After the next midnight Pacific (within a day), it is called again.
    app.clock.advance(chrono::Duration::hours(24));
    let r = app.post_json("/v1/chat/completions", KEY, &chat).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock.calls().len(), 2);
}

async fn invalid_argument_is_the_requests_fault(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().times(1).error(
        400,
        json!({"error": {"code": 400, "message": "* GenerateContentRequest.generation_config.max_output_tokens: must be positive", "status": "INVALID_ARGUMENT"}}),
    ));
    let chat = json!({"model": "flash", "messages": [{"role": "user", "content": "hi"}]});
    let r = app.post_json("/v1/chat/completions", KEY, &chat).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], "INVALID_ARGUMENT");
    // No lock: the next request is served at once.
    let r = app.post_json("/v1/chat/completions", KEY, &chat).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock.calls().len(), 2);
}

async fn an_image_by_url_is_refused_by_name(db: TestDb) {
    let (app, mock) = start(&db).await;
    let chat = json!({"model": "flash", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}}]}]});
    let r = app.post_json("/v1/chat/completions", KEY, &chat).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "messages[0].content[0]");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("data: URLs"),
        "{v}"
    );
    assert_eq!(mock.calls().len(), 0);
}
