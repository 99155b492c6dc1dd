//! How streams end, translated or passed through, on both endpoints: at the message's end and
//! nothing after it; with a final error event in the client's format when the upstream cuts
//! them short; with the usage the gateway counts, never an absurd one; and at a bounded cost.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{TestApp, TestDb};
use crate::translate::{KEY, chunks, start};

both_backends!(
    nothing_after_the_end_of_a_message_reaches_the_client_or_the_counters,
    a_stream_cut_short_ends_with_a_final_error_event,
    an_answer_that_named_its_stop_gets_the_end_it_lacked,
    the_client_is_told_the_usage_that_is_counted,
    the_anthropic_client_reads_early_usage_refusals_and_typed_errors,
    an_event_too_large_to_translate_ends_the_stream,
);

/// The client's stream and the request's log, for a streamed `model` on `path`.
async fn stream(app: &TestApp, path: &str, model: &str) -> String {
    let mut body = json!({"model": model, "max_tokens": 32, "stream": true,
        "messages": [{"role": "user", "content": "say hello to me"}]});
    if path == "/v1/chat/completions" {
        body["stream_options"] = json!({"include_usage": true});
    }
    let r = app
        .client
        .post(format!("{}{path}", app.address))
        .header("x-api-key", KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{path} {model}: {text}");
    text
}

/// Anthropic's events, `event: name` + `data`.
fn ev(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// An Anthropic message answering `text`, reporting `input` tokens and `output` tokens.
fn anthropic_message(text: &str, input: u64, output: u64) -> String {
    [
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": [], "usage": {"input_tokens": input, "output_tokens": 1}}}),
        ),
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        ),
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        ev(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": output}}),
        ),
        ev("message_stop", json!({"type": "message_stop"})),
    ]
    .concat()
}

/// An OpenAI chunk of `delta`, finishing with `finish` (or not).
fn chunk(delta: Value, finish: Value) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    )
}

fn openai_usage(prompt: u64, completion: u64) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o-mini", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})
    )
}

fn answer_stream(mock: &MockUpstream, model: &str, body: &str) {
    mock.reset();
    mock.script(Script::any().model(model).raw(200, "text/event-stream", body));
}

/// The last event of a stream: its `event:` name (none for OpenAI's) and its data.
fn last_event(text: &str) -> (Option<&str>, Value) {
    let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default();
    let name = last.lines().find_map(|l| l.strip_prefix("event: "));
    let data = last
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or_else(|| panic!("no data in the last event: {text}"));
    (name, serde_json::from_str(data).unwrap_or_else(|_| json!(data)))
}

/// issue 40 item 7: a second message after `message_stop` (a new start, 5,000 more tokens,
/// another end) reaches neither the client nor the counters, translated or passed through.
async fn nothing_after_the_end_of_a_message_reaches_the_client_or_the_counters(db: TestDb) {
    let (app, mock) = start(&db).await;
    let twice = format!(
        "{}{}",
        anthropic_message("Hi", 10, 2),
        anthropic_message("again", 5000, 5000)
    );
    answer_stream(&mock, "claude-sonnet-4-5", &twice);
    let text = stream(&app, "/v1/chat/completions", "claude-sonnet").await;
    let c = chunks(&text);
    assert_eq!(c.iter().filter(|c| *c == "[DONE]").count(), 1, "{text}");
    assert_eq!(
        c.iter()
            .filter(|c| c.pointer("/choices/0/delta/role").is_some())
            .count(),
        1,
        "{text}"
    );
    let usage: Vec<&Value> = c.iter().filter_map(|c| c.get("usage")).collect();
    assert_eq!(usage.len(), 1, "{text}");
    assert_eq!(
        (&usage[0]["prompt_tokens"], &usage[0]["completion_tokens"]),
        (&json!(10), &json!(2))
    );
    assert!(!text.contains("again"), "{text}");
    assert_eq!(c.last().unwrap(), "[DONE]");

    let text = stream(&app, "/v1/messages", "claude-sonnet").await;
    assert_eq!(text.matches("event: message_stop").count(), 1, "{text}");
    assert!(!text.contains("again"), "{text}");

    for log in app.logs("acme", 2).await {
        assert_eq!((log.prompt_tokens, log.completion_tokens), (10, 2), "{log:?}");
        assert_eq!((log.usage_estimated, log.code.as_deref()), (0, None), "{log:?}");
    }
    app.stop().await;
}

/// issue 40 item 8, issue 45 item 2: an upstream body that ends inside the answer (half a JSON
/// line) or whose connection breaks: the client's stream ends with a final error event in its
/// own format, half-sent lines never reach it, and the request is logged as broken; passed
/// through or translated, on both endpoints.
async fn a_stream_cut_short_ends_with_a_final_error_event(db: TestDb) {
    let (app, mock) = start(&db).await;
    let anthropic_cut = [
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": [], "usage": {"input_tokens": 4, "output_tokens": 1}}}),
        ),
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
        ),
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo wor".to_owned(),
    ]
    .concat();
    let openai_cut = [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": "Hel"}), Value::Null),
        "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo wor".to_owned(),
    ]
    .concat();
    let cases = [
        ("/v1/chat/completions", "gpt-4o-mini", "gpt-4o-mini", &openai_cut),
        (
            "/v1/chat/completions",
            "claude-sonnet",
            "claude-sonnet-4-5",
            &anthropic_cut,
        ),
        (
            "/v1/messages",
            "claude-sonnet",
            "claude-sonnet-4-5",
            &anthropic_cut,
        ),
        ("/v1/messages", "gpt-4o-mini", "gpt-4o-mini", &openai_cut),
    ];
    for broken in [false, true] {
        for (path, model, upstream, cut) in cases {
            if broken {
                mock.reset();
                // (Paced, so that the head leaves before the connection drops.)
                mock.script(Script {
                    drop_after_chunks: Some(2),
                    ..Script::any().model(upstream).chunk_delay(5)
                });
            } else {
                answer_stream(&mock, upstream, cut);
            }
            let text = stream(&app, path, model).await;
            let case = format!("{path} {model} broken={broken}: {text}");
            assert!(!text.contains("lo wor"), "{case}");
            assert!(
                !text.contains("[DONE]") && !text.contains("message_stop"),
                "{case}"
            );
            let (name, data) = last_event(&text);
            if path == "/v1/messages" {
                assert_eq!(name, Some("error"), "{case}");
                assert_eq!(data["type"], "error", "{case}");
                assert_eq!(data["error"]["type"], "api_error", "{case}");
            } else {
                assert_eq!(name, None, "{case}");
                assert_eq!(data["error"]["code"], "upstream_invalid_response", "{case}");
                assert_eq!(data["error"]["type"], "api_error", "{case}");
            }
            let log = &app.logs("acme", 1).await[0];
            assert_eq!(
                (log.status, log.code.as_deref()),
                (200, Some("upstream_stream_broken")),
                "{case}"
            );
            assert_eq!(log.source.as_deref(), Some("upstream"), "{case}");
            assert_eq!(log.usage_estimated, 1, "{case}");
        }
    }
    // A stream that ended before its first byte is answered with the error itself.
    answer_stream(&mock, "gpt-4o-mini", "");
    let r = app
        .post_json(
            "/v1/chat/completions",
            KEY,
            &json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_invalid_response", "{v}");
    app.stop().await;
}

/// issue 45 item 2: an answer that named its stop and usage, whose body then ended without
/// `[DONE]`: the Anthropic client gets its `message_delta` and `message_stop`, the OpenAI client
/// its `[DONE]`, and the request is complete, its usage exact.
async fn an_answer_that_named_its_stop_gets_the_end_it_lacked(db: TestDb) {
    let (app, mock) = start(&db).await;
    let no_done = [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": "Hi"}), Value::Null),
        chunk(json!({}), json!("stop")),
        openai_usage(6, 1),
    ]
    .concat();
    answer_stream(&mock, "gpt-4o-mini", &no_done);
    let text = stream(&app, "/v1/messages", "gpt-4o-mini").await;
    let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(
        names[names.len() - 2..],
        ["message_delta", "message_stop"],
        "{text}"
    );
    let delta = chunks(&text)
        .into_iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(delta["usage"]["input_tokens"], 6);
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");

    let text = stream(&app, "/v1/chat/completions", "gpt-4o-mini").await;
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    for log in app.logs("acme", 2).await {
        assert_eq!(log.code, None, "{log:?}");
        assert_eq!(
            (log.prompt_tokens, log.completion_tokens, log.usage_estimated),
            (6, 1, 0)
        );
    }
    app.stop().await;
}

/// issue 40 item 13: absurd upstream usage is replaced by the estimate in what the client sees
/// too: the usage a translated answer reports is the usage counted, streamed or not, in either
/// direction; never a saturated total below its parts.
async fn the_client_is_told_the_usage_that_is_counted(db: TestDb) {
    let (app, mock) = start(&db).await;
    let huge = u64::MAX;
    mock.script(
        Script::any()
            .model("claude-sonnet-4-5")
            .usage(json!({"input_tokens": huge, "output_tokens": 5})),
    );
    mock.script(
        Script::any()
            .model("gpt-4o-mini")
            .usage(json!({"prompt_tokens": huge, "completion_tokens": 5, "total_tokens": 4})),
    );
    let ask = |model: &str, stream: bool| {
        json!({"model": model, "max_tokens": 32, "stream": stream, "stream_options": null,
            "messages": [{"role": "user", "content": "say hello to me"}]})
    };
    // Chat on Claude, not streamed, then streamed with the usage chunk.
    let mut body = ask("claude-sonnet", false);
    body.as_object_mut().unwrap().remove("stream_options");
    let v: Value = app
        .post_json("/v1/chat/completions", KEY, &body)
        .await
        .json()
        .await
        .unwrap();
    let told = (
        v["usage"]["prompt_tokens"].as_i64(),
        v["usage"]["completion_tokens"].as_i64(),
    );
    assert_eq!(
        v["usage"]["total_tokens"].as_i64(),
        Some(told.0.unwrap() + told.1.unwrap()),
        "{v}"
    );
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.usage_estimated, 1);
    assert_eq!((Some(log.prompt_tokens), Some(log.completion_tokens)), told);

    let text = stream(&app, "/v1/chat/completions", "claude-sonnet").await;
    let usage = chunks(&text)
        .into_iter()
        .find_map(|c| c.get("usage").cloned())
        .unwrap();
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.usage_estimated, 1);
    assert_eq!(
        usage,
        json!({"prompt_tokens": log.prompt_tokens, "completion_tokens": log.completion_tokens,
            "total_tokens": log.prompt_tokens + log.completion_tokens})
    );

    // Messages on GPT, not streamed, then streamed.
    let r = app.post_messages(
        KEY,
        None,
        &json!({"model": "gpt-4o-mini", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}),
    ).await;
    let v: Value = r.json().await.unwrap();
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.usage_estimated, 1);
    assert_eq!(
        (&v["usage"]["input_tokens"], &v["usage"]["output_tokens"]),
        (&json!(log.prompt_tokens), &json!(log.completion_tokens)),
        "{v}"
    );
    let text = stream(&app, "/v1/messages", "gpt-4o-mini").await;
    let delta = chunks(&text)
        .into_iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.usage_estimated, 1);
    assert_eq!(
        (&delta["usage"]["input_tokens"], &delta["usage"]["output_tokens"]),
        (&json!(log.prompt_tokens), &json!(log.completion_tokens)),
        "{text}"
    );
    app.stop().await;
}

/// issue 45 items 4 and 5: usage an upstream reports on its first chunk reaches
/// `message_start`; a streamed refusal is text; a mid-stream error is typed by what it says (a
/// 429 is a `rate_limit_error`), and an Anthropic error reaches a chat client in OpenAI's words.
async fn the_anthropic_client_reads_early_usage_refusals_and_typed_errors(db: TestDb) {
    let (app, mock) = start(&db).await;
    let early = format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-1", "model": "gpt-4o-mini", "usage": {"prompt_tokens": 42, "completion_tokens": 0, "total_tokens": 42},
            "choices": [{"index": 0, "delta": {"role": "assistant", "refusal": ""}, "finish_reason": null}]})
    );
    let body = [
        early,
        chunk(json!({"refusal": "I can't help with that."}), Value::Null),
        chunk(json!({}), json!("content_filter")),
        openai_usage(42, 6),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    answer_stream(&mock, "gpt-4o-mini", &body);
    let text = stream(&app, "/v1/messages", "gpt-4o-mini").await;
    let events = chunks(&text);
    assert_eq!(events[0]["message"]["usage"]["input_tokens"], 42, "{text}");
    let said: String = events
        .iter()
        .filter_map(|e| e.pointer("/delta/text").and_then(Value::as_str))
        .collect();
    assert_eq!(said, "I can't help with that.", "{text}");
    let delta = events.iter().find(|e| e["type"] == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "refusal");

    let error = [
        chunk(json!({"role": "assistant", "content": "Hi"}), Value::Null),
        "data: {\"error\":{\"code\":429,\"message\":\"Rate limit exceeded upstream\"},\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"error\"}]}\n\ndata: [DONE]\n\n".to_owned(),
    ]
    .concat();
    answer_stream(&mock, "gpt-4o-mini", &error);
    let text = stream(&app, "/v1/messages", "gpt-4o-mini").await;
    let (name, data) = last_event(&text);
    assert_eq!(name, Some("error"), "{text}");
    assert_eq!(data["error"]["type"], "rate_limit_error", "{text}");

    mock.reset();
    mock.script(Script {
        error_after_chunks: Some(2),
        ..Script::any()
    });
    let text = stream(&app, "/v1/chat/completions", "claude-sonnet").await;
    let c = chunks(&text);
    let error = &c[c.len() - 2]["error"];
    assert_eq!(error["message"], "Overloaded", "{text}");
    assert_eq!(
        error["type"], "api_error",
        "OpenAI's words, not overloaded_error: {text}"
    );
    app.stop().await;
}

/// issue 40 item 12: an upstream event over the tap's bound (1 MiB) is neither held nor
/// translated: the stream ends with a final error event instead of going on with a hole, and
/// the log says why.
async fn an_event_too_large_to_translate_ends_the_stream(db: TestDb) {
    let (app, mock) = start(&db).await;
    let giant = "g".repeat(aigw::provider::sse::MAX_EVENT_BYTES + 1);
    let body = [
        chunk(json!({"role": "assistant", "content": "a"}), Value::Null),
        chunk(json!({"content": giant}), Value::Null),
        chunk(json!({"content": "b"}), Value::Null),
        chunk(json!({}), json!("stop")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    answer_stream(&mock, "gpt-4o-mini", &body);
    let text = stream(&app, "/v1/messages", "gpt-4o-mini").await;
    assert!(
        text.len() < 10_000,
        "nothing of the giant event: {} bytes",
        text.len()
    );
    assert!(text.contains("\"text\":\"a\""), "{text}");
    assert!(!text.contains("\"text\":\"b\""), "{text}");
    let (name, data) = last_event(&text);
    assert_eq!(name, Some("error"), "{text}");
    assert_eq!(data["error"]["type"], "api_error", "{text}");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.code.as_deref(), Some("upstream_invalid_response"), "{log:?}");
    app.stop().await;
}
