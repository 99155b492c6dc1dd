//! AWS Bedrock credentials through the real HTTP surface: chat answered by Converse (streamed
//! by ConverseStream's event-stream frames), signed with SigV4, tools, images and stop sequences
//! on the wire, cache tokens counted, `/v1/messages` through the chat translation,
//! ThrottlingException parking the model for a minute, ValidationException the request's fault,
//! and a bad entry refused by name.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{
    ResourcesBuilder, Setup, TestApp, TestDb, aliased, spawn_app, spawn_on_mock, try_spawn_app,
};
use crate::translate::{attempts, chunks, delta_text, header};

const KEY: &str = "sk-aigw-BedrockTestKey0123456789abcdefgh";
/// The model id, as Bedrock names Claude 3.5 Sonnet (its `:` is percent-encoded on the wire).
const CLAUDE: &str = "anthropic.claude-3-5-sonnet-20240620-v1:0";
const ACCESS_KEY_ID: &str = "AKIAMOCKBEDROCK00001";

/// `claude-bedrock` on a bedrock credential (us-east-1, temporary credentials), falling back to
/// `gpt-4o-mini` on an OpenAI credential.
fn resources(mock: &MockUpstream) -> String {
    fixture(mock).into()
}

/// [`resources`] as a builder.
fn fixture(mock: &MockUpstream) -> ResourcesBuilder {
    ResourcesBuilder::acme(KEY)
        .member_with_password("acme", "root@acme.test", "owner", "owner-password-1")
        .table(
            "upstream",
            &[
                ("workspace", "acme"),
                ("name", "bedrock-east"),
                ("provider", "bedrock"),
                ("base_url", &mock.bedrock_endpoint()),
                ("region", "us-east-1"),
                ("access_key_id", ACCESS_KEY_ID),
                ("secret_access_key", "mock/Secret+Key0123456789abcdefghijklmn"),
                ("session_token", "FwoGZXIvYXdzEMockSessionToken"),
            ],
        )
        .with("models", vec![aliased("claude-bedrock", CLAUDE)])
        .provider_upstream(
            "acme",
            ("openai", "openai"),
            &mock.base_url(),
            "cred-openai",
            &["gpt-4o-mini"],
        )
        .model("acme", "claude-bedrock")
        .with("fallbacks", vec!["gpt-4o-mini"])
}

async fn start(db: &TestDb) -> (TestApp, MockUpstream) {
    spawn_on_mock(db, resources).await
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "say hello to me"}]})
}

/// Bedrock's own throttling answer, as its service sends it (the type rides in a header).
const THROTTLED: &str = r#"{"message":"Too many requests, please wait before trying again."}"#;
const THROTTLED_TYPE: &str = "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/";
const INVALID_MODEL: &str = r#"{"message":"The provided model identifier is invalid."}"#;

both_backends!(
    chat_reaches_converse_signed_with_sigv4,
    a_converse_stream_becomes_openai_chunks_with_its_usage,
    an_exception_frame_is_a_mid_stream_error,
    tools_images_and_stop_sequences_reach_converse,
    cache_tokens_count_as_prompt,
    messages_reach_bedrock_through_the_chat_translation,
    throttling_parks_the_model_for_a_minute,
    a_validation_error_is_the_requests_fault,
    a_bad_bedrock_entry_is_refused_by_name,
    the_admin_api_takes_aws_keys_and_never_shows_the_secret,
);

async fn chat_reaches_converse_signed_with_sigv4(db: TestDb) {
    let (app, mock) = start(&db).await;
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("claude-bedrock"))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-aigw-provider"), "bedrock");
    assert_eq!(header(&r, "x-aigw-model"), "claude-bedrock");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], CLAUDE);
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "Hello from the mock upstream "
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    let calls = mock.calls();
    assert_eq!(calls.len(), 1);
    // The mock refuses a call whose SigV4 Authorization is missing or malformed (403), and
    // takes the access key id from it as the credential.
    assert_eq!(calls[0].path, format!("/model/{CLAUDE}/converse"));
    assert_eq!(calls[0].credential.as_deref(), Some(ACCESS_KEY_ID));
    assert_eq!(calls[0].model.as_deref(), Some(CLAUDE));
    assert_eq!(
        calls[0].body,
        json!({"messages": [{"role": "user", "content": [{"text": "say hello to me"}]}]})
    );
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.status, 200);
    assert_eq!((log.prompt_tokens, log.completion_tokens), (4, 5));
    assert_eq!(log.usage_estimated, 0);
}

async fn a_converse_stream_becomes_openai_chunks_with_its_usage(db: TestDb) {
    let (app, mock) = start(&db).await;
    let mut body = chat("claude-bedrock");
    body["stream"] = json!(true);
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    let events = chunks(&text);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(delta_text(&events), "Hello from the mock upstream ");
    assert!(
        events.iter().any(|e| e["choices"][0]["finish_reason"] == "stop"),
        "{text}"
    );
    assert_eq!(events.last().unwrap(), &json!("[DONE]"));
    // The client asked for no usage chunk: the one the gateway made of `metadata` is taken out.
    assert!(
        events.iter().all(|e| e.get("usage").is_none_or(Value::is_null)),
        "{text}"
    );
    let call = &mock.calls()[0];
    assert_eq!(call.path, format!("/model/{CLAUDE}/converse-stream"));
    app.assert_stream_logged(call.usage.unwrap()).await;
}

async fn tools_images_and_stop_sequences_reach_converse(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().tool_call("weather", json!({"city": "Paris"})));
    let body = json!({
        "model": "claude-bedrock", "max_tokens": 200, "temperature": 0.2, "stop": ["END"],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "text", "text": "Weather where this was taken?"},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQSkZJRg=="}}
            ]}
        ],
        "tools": [{"type": "function", "function": {"name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": "auto"
    });
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    let sent = &mock.calls()[0].body;
    assert_eq!(sent["system"], json!([{"text": "Be brief."}]));
    assert_eq!(
        sent["messages"][0]["content"][1],
        json!({"image": {"format": "jpeg", "source": {"bytes": "/9j/4AAQSkZJRg=="}}})
    );
    assert_eq!(
        sent["inferenceConfig"],
        json!({"maxTokens": 200, "temperature": 0.2, "stopSequences": ["END"]})
    );
    assert_eq!(sent["toolConfig"]["toolChoice"], json!({"auto": {}}));
    assert_eq!(sent["toolConfig"]["tools"][0]["toolSpec"]["name"], "weather");
    // The tool's answer goes back as a toolResult in a user turn.
    let follow = json!({"model": "claude-bedrock", "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}
    ], "tools": body["tools"]});
    let r = app.post_json("/v1/chat/completions", KEY, &follow).await;
    assert_eq!(r.status(), 200);
    let sent = &mock.calls()[1].body;
    assert_eq!(
        sent["messages"][1]["content"][0]["toolUse"]["input"],
        json!({"city": "Paris"})
    );
    assert_eq!(
        sent["messages"][2]["content"][0]["toolResult"]["content"],
        json!([{"text": "sunny"}])
    );
    // What Converse cannot express is not sent to Bedrock (an image by URL): the chain's next
    // model, which can, serves it.
    let mut bad = chat("claude-bedrock");
    bad["messages"][0]["content"] =
        json!([{"type": "image_url", "image_url": {"url": "https://example.test/a.png"}}]);
    let r = app.post_json("/v1/chat/completions", KEY, &bad).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-aigw-model"), "gpt-4o-mini");
    let bedrock_calls = mock
        .calls()
        .iter()
        .filter(|c| c.path.starts_with("/model/"))
        .count();
    assert_eq!(bedrock_calls, 2);
}

async fn cache_tokens_count_as_prompt(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(
        Script::any().usage(json!({"inputTokens": 10, "outputTokens": 5, "totalTokens": 45,
        "cacheReadInputTokens": 20, "cacheWriteInputTokens": 10})),
    );
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("claude-bedrock"))
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], 40);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 20);
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.prompt_tokens, log.completion_tokens), (40, 5));
}

async fn messages_reach_bedrock_through_the_chat_translation(db: TestDb) {
    let (app, mock) = start(&db).await;
    let body = json!({"model": "claude-bedrock", "max_tokens": 64, "system": "Be brief.",
        "stop_sequences": ["END"], "messages": [{"role": "user", "content": "say hello to me"}]});
    let r = app.post_json("/v1/messages", KEY, &body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "Hello from the mock upstream ");
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"]["output_tokens"], 5);
    let sent = &mock.calls()[0].body;
    assert_eq!(sent["system"], json!([{"text": "Be brief."}]));
    assert_eq!(sent["inferenceConfig"]["maxTokens"], 64);
    assert_eq!(sent["inferenceConfig"]["stopSequences"], json!(["END"]));
    // Streamed: Anthropic's events, made of ConverseStream's frames.
    let mut body = body;
    body["stream"] = json!(true);
    let r = app.post_json("/v1/messages", KEY, &body).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("event: message_start"), "{text}");
    assert!(text.contains("\"text\":\"Hello \""), "{text}");
    assert!(text.contains("event: message_stop"), "{text}");
    let log = &app.logs("acme", 2).await;
    assert!(
        log.iter().all(|l| l.status == 200 && l.usage_estimated == 0),
        "{log:?}"
    );
}

async fn throttling_parks_the_model_for_a_minute(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(
        Script::any()
            .model(CLAUDE)
            .times(1)
            .header("x-amzn-errortype", THROTTLED_TYPE)
            .header("x-amzn-requestid", "3f8c0a2e-0000-4000-8000-000000000001")
            .error(429, serde_json::from_str(THROTTLED).unwrap()),
    );
    // Throttled: the chain falls back to gpt-4o-mini at once.
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("claude-bedrock"))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-aigw-model"), "gpt-4o-mini");
    let log = &app.logs("acme", 1).await[0];
    let tried = attempts(log);
    assert_eq!(tried[0]["rule"], "aws_throttling", "{tried:?}");
    // Parked a minute: the next request goes straight to the fallback.
    app.clock.advance(chrono::Duration::seconds(50));
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("claude-bedrock"))
        .await;
    assert_eq!(header(&r, "x-aigw-model"), "gpt-4o-mini");
    assert_eq!(header(&r, "x-aigw-attempts"), "1");
    app.clock.advance(chrono::Duration::seconds(11));
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("claude-bedrock"))
        .await;
    assert_eq!(header(&r, "x-aigw-model"), "claude-bedrock");
    let bedrock_calls = mock
        .calls()
        .iter()
        .filter(|c| c.path.starts_with("/model/"))
        .count();
    assert_eq!(bedrock_calls, 2);
}

async fn a_validation_error_is_the_requests_fault(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    // Without the fallback, the error goes back to the client, in OpenAI's shape.
    let text = fixture(&mock).unset("model", "claude-bedrock", "fallbacks");
    let app = spawn_app(&db, Setup::resources(text)).await;
    mock.script(
        Script::any()
            .times(1)
            .header(
                "x-amzn-errortype",
                "ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/",
            )
            .error(400, serde_json::from_str(INVALID_MODEL).unwrap()),
    );
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("claude-bedrock"))
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(header(&r, "x-aigw-error-source"), "upstream");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["message"], "The provided model identifier is invalid.");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["aws_error_type"], "ValidationException");
    // No lock: the same credential serves the next request at once.
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("claude-bedrock"))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock.calls().len(), 2);
    let logs = app.logs("acme", 2).await;
    let refused = logs.iter().find(|l| l.status == 400).unwrap();
    assert_eq!(attempts(refused)[0]["rule"], "request_error");
    // Embeddings are not Bedrock's (Converse is chat only): a 400 naming the model, nothing sent.
    let r = app
        .post_json(
            "/v1/embeddings",
            KEY,
            &json!({"model": "claude-bedrock", "input": "a"}),
        )
        .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "model", "{v}");
    assert_eq!(mock.calls().len(), 2);
    // The same error on /v1/messages comes back in Anthropic's shape.
    mock.script(
        Script::any()
            .times(1)
            .header("x-amzn-errortype", "ValidationException")
            .error(400, serde_json::from_str(INVALID_MODEL).unwrap()),
    );
    let body =
        json!({"model": "claude-bedrock", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
    let r = app.post_json("/v1/messages", KEY, &body).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["message"], "The provided model identifier is invalid.");
}

async fn a_bad_bedrock_entry_is_refused_by_name(db: TestDb) {
    let entry = |fields: &str| {
        format!(
            "[[workspace]]\nname = \"acme\"\n[[upstream]]\nworkspace = \"acme\"\nname = \"br\"\nprovider = \"bedrock\"\n{fields}\n"
        )
    };
    let keys = "access_key_id = \"AKIA1\"\nsecret_access_key = \"s\"";
    let cases: &[(String, &str)] = &[
        (keys.to_owned(), "region is required for provider \"bedrock\""),
        (
            format!("region = \"US East\"\n{keys}"),
            "region must be an AWS region",
        ),
        (
            "region = \"us-east-1\"\naccess_key_id = \"AKIA1\"".to_owned(),
            "secret_access_key is required",
        ),
        (
            format!("region = \"us-east-1\"\n{keys}\napi_key = \"k\""),
            "api_key is not for provider \"bedrock\"",
        ),
    ];
    for (fields, needle) in cases {
        let err = match try_spawn_app(&db, Setup::resources(entry(fields))).await {
            Ok(_) => panic!("{fields}: a bad bedrock entry was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains(needle),
            "{fields}: {err:?} should contain {needle:?}"
        );
    }
    // The AWS fields belong to bedrock alone.
    let openai = "[[workspace]]\nname = \"acme\"\n[[upstream]]\nworkspace = \"acme\"\nname = \"o\"\nprovider = \"openai\"\napi_key = \"k\"\nregion = \"us-east-1\"\n";
    let err = match try_spawn_app(&db, Setup::resources(openai)).await {
        Ok(_) => panic!("region on an openai entry was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("region is only for provider \"bedrock\""), "{err}");
}

async fn the_admin_api_takes_aws_keys_and_never_shows_the_secret(db: TestDb) {
    let (app, mock) = start(&db).await;
    let token = app.login("root@acme.test", "owner-password-1").await;
    let client = reqwest::Client::new();
    let send = |method: reqwest::Method, path: String, body: Value| {
        client
            .request(method, format!("{}{path}", app.address))
            .bearer_auth(&token)
            .json(&body)
            .send()
    };
    // Create: every key but the token is required, api_key is not bedrock's.
    let base = json!({"name": "br-west", "provider": "bedrock", "region": "us-west-2",
        "access_key_id": "AKIAWEST0000000000001", "models": [{"name": "claude-west", "upstream": CLAUDE}]});
    let r = send(reqwest::Method::POST, "/admin/v1/upstreams".into(), base.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "secret_access_key", "{v}");
    let mut with_key = base.clone();
    with_key["api_key"] = json!("k");
    with_key["secret_access_key"] = json!("west/Secret+Key");
    let r = send(reqwest::Method::POST, "/admin/v1/upstreams".into(), with_key)
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let mut good = base;
    good["secret_access_key"] = json!("west/Secret+Key");
    good["session_token"] = json!("FwoGZXIvYXdzEWestToken");
    let r = send(reqwest::Method::POST, "/admin/v1/upstreams".into(), good)
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let text = r.text().await.unwrap();
    assert!(
        !text.contains("west/Secret+Key") && !text.contains("WestToken"),
        "{text}"
    );
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["base_url"], "https://bedrock-runtime.us-west-2.amazonaws.com");
    assert_eq!(
        v["aws"],
        json!({"region": "us-west-2", "access_key_id": "AKIAWEST0000000000001", "has_session_token": true})
    );
    // A change of region moves the default endpoint; a null token removes it; the secret stays.
    let id = v["id"].as_i64().unwrap();
    let r = send(
        reqwest::Method::PATCH,
        format!("/admin/v1/upstreams/{id}"),
        json!({"region": "eu-central-1", "session_token": null}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["base_url"],
        "https://bedrock-runtime.eu-central-1.amazonaws.com"
    );
    assert_eq!(v["aws"]["has_session_token"], false);
    assert_eq!(v["aws"]["region"], "eu-central-1");
    // The AWS fields belong to bedrock alone; other credentials show no `aws`.
    let r = send(
        reqwest::Method::POST,
        "/admin/v1/upstreams".into(),
        json!({"name": "o2", "provider": "openai", "api_key": "k", "region": "us-east-1"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 422);
    let r = send(reqwest::Method::GET, "/admin/v1/upstreams".into(), json!(null))
        .await
        .unwrap();
    let list: Value = r.json().await.unwrap();
    let openai = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["provider"] == "openai")
        .unwrap();
    assert_eq!(openai["aws"], Value::Null);
    // The resources file's credential signs with its own keys.
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("claude-bedrock"))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock.calls()[0].credential.as_deref(), Some(ACCESS_KEY_ID));
    // The connection test is a signed Converse call too.
    let r = send(reqwest::Method::GET, "/admin/v1/upstreams".into(), json!(null))
        .await
        .unwrap();
    let list: Value = r.json().await.unwrap();
    let east = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "bedrock-east")
        .unwrap();
    let r = send(
        reqwest::Method::POST,
        format!("/admin/v1/upstreams/{}/test", east["id"]),
        json!({}),
    )
    .await
    .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["ok"], true, "{v}");
    let ping = mock.calls().pop().unwrap();
    assert_eq!(ping.path, format!("/model/{CLAUDE}/converse"));
    assert_eq!(ping.body["inferenceConfig"]["maxTokens"], 1);
}

async fn an_exception_frame_is_a_mid_stream_error(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script {
        error_after_chunks: Some(2),
        ..Script::any()
    });
    let mut body = chat("claude-bedrock");
    body["stream"] = json!(true);
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 200, "the head had gone before the error");
    let text = r.text().await.unwrap();
    let c = chunks(&text);
    let content: String = c
        .iter()
        .filter_map(|c| c.pointer("/choices/0/delta/content").and_then(Value::as_str))
        .collect();
    assert_eq!(content, "Hello from ");
    let error = c.iter().find(|e| e.get("error").is_some()).expect(&text);
    assert_eq!(
        error["error"]["message"],
        "Bedrock is unable to process your request."
    );
    assert_eq!(error["error"]["aws_error_type"], "ServiceUnavailableException");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.code.as_deref(), Some("upstream_stream_error"), "{log:?}");
    assert_eq!(log.source.as_deref(), Some("upstream"));
    assert_eq!(log.usage_estimated, 1, "cut short: what was delivered is counted");
    let _ = mock;
}
