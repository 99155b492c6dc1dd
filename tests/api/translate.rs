//! OpenAI chat ⇄ Anthropic messages through the real HTTP surface: a Claude model called on
//! `/v1/chat/completions`, an OpenAI model on `/v1/messages`, fallback chains across providers,
//! errors and mid-stream errors in the client's shape, usage counted from the provider's report.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, TestApp, TestDb, aliased, price, spawn_on_mock};

pub(crate) const KEY: &str = "sk-aigw-TranslateTestKey0123456789abcdef";

/// `gpt-4o` on an OpenAI credential, falling back to `claude-sonnet` on an Anthropic one;
/// `gpt-4o-mini` on the OpenAI credential alone.
pub(crate) fn resources(mock: &MockUpstream) -> String {
    fixture(mock).into()
}

/// [`resources`] as a builder, for the suites that extend it.
pub(crate) fn fixture(mock: &MockUpstream) -> ResourcesBuilder {
    let url = &mock.base_url();
    ResourcesBuilder::acme(KEY)
        .provider_upstream(
            "acme",
            ("oai", "openai"),
            url,
            "cred-oai",
            &["gpt-4o", "gpt-4o-mini"],
        )
        .provider_upstream("acme", ("claude", "anthropic"), url, "cred-claude", &[])
        .with("models", vec![aliased("claude-sonnet", "claude-sonnet-4-5")])
        .model("acme", "gpt-4o")
        .with("fallbacks", vec!["claude-sonnet"])
        .model("acme", "claude-sonnet")
        .with("price", price(3.0, 15.0))
}

pub(crate) async fn start(db: &TestDb) -> (TestApp, MockUpstream) {
    spawn_on_mock(db, resources).await
}

pub(crate) fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// The `data:` payloads of an OpenAI stream, `[DONE]` as a string.
pub(crate) fn chunks(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| json!(d)))
        .collect()
}

/// The text of a chat stream's `chunks`, its deltas' content in order.
pub(crate) fn delta_text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

/// The attempts of a log record.
pub(crate) fn attempts(log: &aigw::request_log::LogRecord) -> Vec<Value> {
    serde_json::from_str(&log.attempts_detail).unwrap()
}

both_backends!(
    a_claude_model_answers_chat_completions,
    a_translated_stream_is_openai_chunks_with_exact_usage,
    tool_calls_come_back_as_openai_tool_calls,
    a_field_anthropic_cannot_express_is_refused_by_name,
    a_fallback_chain_crosses_providers,
    an_anthropic_error_is_classified_natively_and_rendered_for_openai,
    a_mid_stream_error_in_a_translated_stream,
    an_openai_model_answers_messages,
    models_lists_every_reachable_model,
);

async fn a_claude_model_answers_chat_completions(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().model("claude-sonnet-4-5").usage(
        json!({"input_tokens": 7, "output_tokens": 5, "cache_creation_input_tokens": 4, "cache_read_input_tokens": 3}),
    ));
    let body = json!({"model": "claude-sonnet", "temperature": 0.3, "stop": ["END"], "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "say hello to me"}]});
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-aigw-model"), "claude-sonnet");
    assert_eq!(header(&r, "x-aigw-provider"), "anthropic");
    assert_eq!(header(&r, "x-aigw-attempts"), "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "Hello from the mock upstream "
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 14, "completion_tokens": 5, "total_tokens": 19,
            "prompt_tokens_details": {"cached_tokens": 3, "cache_creation_tokens": 4}})
    );
    // What went upstream is an Anthropic Messages request.
    let call = &mock.calls()[0];
    assert_eq!(call.path, "/v1/messages");
    assert_eq!(call.credential.as_deref(), Some("cred-claude"));
    assert_eq!(call.body["model"], "claude-sonnet-4-5");
    // claude-sonnet-4-5 names no `max_output_tokens`: its family's own output limit (issue 45 item 9).
    assert_eq!(call.body["max_tokens"], 64000);
    assert_eq!(call.body["system"], "Be brief.");
    assert_eq!(call.body["stop_sequences"], json!(["END"]));
    assert_eq!(
        call.body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "say hello to me"}]}])
    );
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.attempts), (200, 1));
    assert_eq!((log.prompt_tokens, log.completion_tokens), (14, 5));
    assert_eq!(log.usage_estimated, 0);
    // 3 credits / M prompt + 15 / M completion tokens, in micro-credits.
    assert_eq!(log.credits, 3 * 14 + 15 * 5);
    assert_eq!(log.endpoint, "chat.completions");
    let a = attempts(log);
    assert_eq!(a[0]["provider"], "anthropic");
    assert_eq!(a[0]["translated"], "chat.completions→messages");
    assert_eq!(a[0]["max_tokens_chosen"], 64000, "the gateway chose it");
    app.stop().await;
}

async fn a_translated_stream_is_openai_chunks_with_exact_usage(db: TestDb) {
    let (app, mock) = start(&db).await;
    for include_usage in [false, true] {
        let mut body = json!({"model": "claude-sonnet", "stream": true, "max_tokens": 50,
            "messages": [{"role": "user", "content": "say hello to me"}]});
        if include_usage {
            body["stream_options"] = json!({"include_usage": true});
        }
        let r = app.post_json("/v1/chat/completions", KEY, &body).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "content-type"), "text/event-stream");
        assert_eq!(header(&r, "x-aigw-provider"), "anthropic");
        let text = r.text().await.unwrap();
        assert!(
            !text.contains("event:"),
            "no Anthropic events reach the client: {text}"
        );
        let c = chunks(&text);
        assert_eq!(c.last().unwrap(), "[DONE]");
        assert_eq!(c[0]["object"], "chat.completion.chunk");
        assert_eq!(c[0]["choices"][0]["delta"]["role"], "assistant");
        let content: String = c
            .iter()
            .filter_map(|c| c.pointer("/choices/0/delta/content").and_then(Value::as_str))
            .collect();
        assert_eq!(content, "Hello from the mock upstream ");
        assert!(
            c.iter()
                .any(|c| c.pointer("/choices/0/finish_reason") == Some(&json!("stop")))
        );
        let usage: Vec<&Value> = c.iter().filter_map(|c| c.get("usage")).collect();
        let (input, output) = mock.calls().last().unwrap().usage.unwrap();
        if include_usage {
            assert_eq!(usage.len(), 1, "{text}");
            assert_eq!(usage[0]["prompt_tokens"], input);
            assert_eq!(usage[0]["completion_tokens"], output);
        } else {
            assert!(usage.is_empty(), "the client did not ask for usage: {text}");
        }
        let call = mock.calls().last().unwrap().clone();
        assert_eq!((call.path.as_str(), call.stream), ("/v1/messages", true));
        assert_eq!(call.body["max_tokens"], 50);
        assert!(call.body.get("stream_options").is_none(), "{}", call.body);
    }
    let logs = app.logs("acme", 2).await;
    for (log, call) in logs.iter().rev().zip(mock.calls()) {
        let (i, o) = call.usage.unwrap();
        assert_eq!((log.prompt_tokens, log.completion_tokens), (i as i64, o as i64));
        assert_eq!((log.stream, log.usage_estimated, log.status), (1, 0, 200));
        assert!(log.code.is_none(), "{log:?}");
    }
    app.stop().await;
}

async fn tool_calls_come_back_as_openai_tool_calls(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().tool_call("get_weather", json!({"city": "Paris"})));
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let body = json!({"model": "claude-sonnet", "tools": tools, "tool_choice": "required",
        "messages": [{"role": "user", "content": "weather in Paris?"}]});
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["id"], "toolu_mock_1");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    let sent = &mock.calls()[0].body;
    assert_eq!(sent["tool_choice"], json!({"type": "any"}));
    assert_eq!(sent["tools"][0]["name"], "get_weather");
    assert_eq!(
        sent["tools"][0]["input_schema"]["properties"]["city"]["type"],
        "string"
    );

    // Streamed: the arguments arrive as tool-call deltas.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let text = app
        .post_json("/v1/chat/completions", KEY, &streamed)
        .await
        .text()
        .await
        .unwrap();
    let c = chunks(&text);
    let calls: Vec<&Value> = c
        .iter()
        .filter_map(|c| c.pointer("/choices/0/delta/tool_calls/0"))
        .collect();
    assert_eq!(calls[0]["id"], "toolu_mock_1");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: String = calls
        .iter()
        .filter_map(|c| c.pointer("/function/arguments").and_then(Value::as_str))
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&args).unwrap(),
        json!({"city": "Paris"})
    );
    assert!(
        c.iter()
            .any(|c| c.pointer("/choices/0/finish_reason") == Some(&json!("tool_calls")))
    );

    // The tool's result goes back as a tool_result block.
    let follow = json!({"model": "claude-sonnet", "tools": tools, "messages": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "toolu_mock_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "toolu_mock_1", "content": "18C"}]});
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &follow).await.status(),
        200
    );
    let sent = mock.calls().last().unwrap().body.clone();
    assert_eq!(
        sent["messages"][2],
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_mock_1", "content": "18C"}]})
    );
    app.stop().await;
}

async fn a_field_anthropic_cannot_express_is_refused_by_name(db: TestDb) {
    let (app, mock) = start(&db).await;
    for (field, value) in [
        ("n", json!(2)),
        ("response_format", json!({"type": "json_object"})),
        ("logprobs", json!(true)),
    ] {
        let mut body = json!({"model": "claude-sonnet", "messages": [{"role": "user", "content": "x"}]});
        body[field] = value;
        let r = app.post_json("/v1/chat/completions", KEY, &body).await;
        assert_eq!(r.status(), 400, "{field}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], field, "{v}");
        assert_eq!(v["error"]["code"], "invalid_request_error", "{v}");
    }
    assert_eq!(mock.call_count(), 0, "nothing was sent upstream");
    // The same field is no obstacle where the model is served natively.
    let body = json!({"model": "gpt-4o", "n": 2, "messages": [{"role": "user", "content": "x"}]});
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &body).await.status(),
        200
    );
    app.stop().await;
}

async fn a_fallback_chain_crosses_providers(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().model("gpt-4o").error(
        503,
        json!({"error": {"message": "The engine is currently overloaded", "type": "server_error"}}),
    ));
    for stream in [false, true] {
        let body = json!({"model": "gpt-4o", "stream": stream,
            "messages": [{"role": "user", "content": "say hello to me"}]});
        let r = app.post_json("/v1/chat/completions", KEY, &body).await;
        assert_eq!(r.status(), 200);
        assert_eq!(
            header(&r, "x-aigw-model"),
            "claude-sonnet",
            "the fallback answered"
        );
        assert_eq!(header(&r, "x-aigw-provider"), "anthropic");
        let text = r.text().await.unwrap();
        if stream {
            assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
            assert!(!text.contains("\"usage\""), "{text}");
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["object"], "chat.completion");
        }
    }
    let calls = mock.calls();
    assert_eq!(calls[0].path, "/v1/chat/completions");
    assert_eq!(calls[1].path, "/v1/messages");
    let logs = app.logs("acme", 2).await;
    let log = logs.iter().find(|l| l.stream == 0).unwrap();
    assert_eq!(log.model_requested.as_deref(), Some("gpt-4o"));
    assert_eq!(log.model_served.as_deref(), Some("claude-sonnet"));
    let (i, o) = calls[1].usage.unwrap();
    assert_eq!((log.prompt_tokens, log.completion_tokens), (i as i64, o as i64));
    let a = attempts(log);
    assert_eq!(
        (a[0]["provider"].as_str(), a[0]["status"].as_u64()),
        (Some("openai"), Some(503))
    );
    assert!(a[0].get("translated").is_none(), "{a:?}");
    assert_eq!(a[1]["provider"], "anthropic");
    assert_eq!(a[1]["translated"], "chat.completions→messages");
    // The second request found gpt-4o parked and went straight to Claude.
    let streamed = logs.iter().find(|l| l.stream == 1).unwrap();
    assert_eq!(streamed.model_served.as_deref(), Some("claude-sonnet"));
    app.stop().await;
}

async fn an_anthropic_error_is_classified_natively_and_rendered_for_openai(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(
        Script::any()
            .model("claude-sonnet-4-5")
            .error(
                429,
                json!({"type": "error", "error": {"type": "rate_limit_error",
                    "message": "Number of request tokens has exceeded your per-minute rate limit"}}),
            )
            .header("retry-after", "30"),
    );
    let body = json!({"model": "claude-sonnet", "messages": [{"role": "user", "content": "x"}]});
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "retry-after"), "30");
    assert_eq!(header(&r, "x-aigw-error-source"), "upstream");
    assert_eq!(header(&r, "x-aigw-provider"), "anthropic");
    assert_eq!(header(&r, "content-type"), "application/json");
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v,
        json!({"error": {"message": "Number of request tokens has exceeded your per-minute rate limit",
            "type": "rate_limit_error", "param": null, "code": "rate_limit_exceeded"}})
    );
    // Classified on Anthropic's own body and Retry-After: the credential rests 30 s, so the
    // next request is refused before anything is sent.
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.code.as_deref(), Some("rate_limit_error"));
    assert!(
        attempts(log)[0]["lock_until"].is_string(),
        "{}",
        log.attempts_detail
    );
    let sent = mock.call_count();
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_quota_exhausted");
    assert_eq!(mock.call_count(), sent);
    app.stop().await;
}

async fn a_mid_stream_error_in_a_translated_stream(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script {
        error_after_chunks: Some(2),
        ..Script::any()
    });
    let body = json!({"model": "claude-sonnet", "stream": true,
        "messages": [{"role": "user", "content": "say hello to me"}]});
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 200, "the head had gone before the error");
    let text = r.text().await.unwrap();
    let c = chunks(&text);
    let content: String = c
        .iter()
        .filter_map(|c| c.pointer("/choices/0/delta/content").and_then(Value::as_str))
        .collect();
    assert_eq!(content, "Hello from ");
    let error = &c[c.len() - 2];
    assert_eq!(error["choices"][0]["finish_reason"], "error", "{text}");
    assert_eq!(error["error"]["message"], "Overloaded");
    assert_eq!(c.last().unwrap(), "[DONE]");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.code.as_deref(), Some("upstream_stream_error"));
    assert_eq!(log.source.as_deref(), Some("upstream"));
    assert_eq!(log.usage_estimated, 1, "cut short: what was delivered is counted");
    assert_eq!(log.completion_tokens, 2);
    let _ = mock;
    app.stop().await;
}

async fn an_openai_model_answers_messages(db: TestDb) {
    let (app, mock) = start(&db).await;
    let body = json!({"model": "gpt-4o", "max_tokens": 64, "system": "Be brief.",
        "messages": [{"role": "user", "content": "say hello to me"}]});
    let r = app.post_messages(KEY, Some("2023-06-01"), &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-aigw-provider"), "openai");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(
        v["content"][0],
        json!({"type": "text", "text": "Hello from the mock upstream "})
    );
    assert_eq!(v["stop_reason"], "end_turn");
    let call = mock.calls()[0].clone();
    assert_eq!(call.path, "/v1/chat/completions");
    assert_eq!(
        call.body["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    let (p, c) = call.usage.unwrap();
    assert_eq!(v["usage"]["input_tokens"], p);
    assert_eq!(v["usage"]["output_tokens"], c);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = app.post_messages(KEY, None, &streamed).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.starts_with("event: message_start\n"), "{text}");
    assert!(text.contains("event: content_block_delta\n"), "{text}");
    assert!(
        text.trim_end().ends_with("data: {\"type\":\"message_stop\"}"),
        "{text}"
    );
    assert!(!text.contains("[DONE]"), "{text}");
    let call = mock.calls()[1].clone();
    assert_eq!(call.body["stream_options"], json!({"include_usage": true}));
    let logs = app.logs("acme", 2).await;
    for (log, call) in logs.iter().rev().zip(mock.calls()) {
        let (p, c) = call.usage.unwrap();
        assert_eq!((log.prompt_tokens, log.completion_tokens), (p as i64, c as i64));
        assert_eq!((log.endpoint.as_str(), log.usage_estimated), ("messages", 0));
        assert_eq!(attempts(log)[0]["translated"], "messages→chat.completions");
    }
    // An OpenAI error reaches an Anthropic client in Anthropic's shape (a model without
    // fallbacks, so that the error is the answer).
    mock.script(Script::any().model("gpt-4o-mini").error(
        400,
        json!({"error": {"message": "Invalid 'messages'", "type": "invalid_request_error", "code": null}}),
    ));
    let mut mini = body.clone();
    mini["model"] = json!("gpt-4o-mini");
    let r = app.post_messages(KEY, None, &mini).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "Invalid 'messages'"}})
    );
    app.stop().await;
}

async fn models_lists_every_reachable_model(db: TestDb) {
    let (app, _mock) = start(&db).await;
    let r = app.get_as("/v1/models", KEY).await;
    let v: Value = r.json().await.unwrap();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["claude-sonnet", "gpt-4o", "gpt-4o-mini"]);
    for id in ids {
        let body = json!({"model": id, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]});
        assert_eq!(
            app.post_json("/v1/chat/completions", KEY, &body).await.status(),
            200,
            "{id}"
        );
        assert_eq!(
            app.post_json("/v1/messages", KEY, &body).await.status(),
            200,
            "{id}"
        );
    }
    app.stop().await;
}
