//! Azure OpenAI credentials through the real HTTP surface: a deployment per public model, the
//! `api-key` header and `api-version` on the wire, chat streamed and not, embeddings, the v1 API,
//! a 429 that parks the credential as long as Azure says, a content-filter 400 that is the
//! request's fault, and fallback chains crossing Azure and Anthropic.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, aliased, spawn_on_mock, try_spawn_app};
use crate::translate::{chunks, delta_text, header};

const KEY: &str = "sk-aigw-AzureTestKey0123456789abcdefghij";

/// `gpt-4o` on the Azure deployment `gpt4o-prod` (falling back to `claude-sonnet` on an
/// Anthropic credential), `embed` on the deployment `emb-small`, `claude-sonnet` falling back
/// to `gpt-4o`, and `gpt-4o-v1` on a second Azure credential speaking the v1 API.
fn resources(mock: &MockUpstream) -> String {
    let endpoint = mock.azure_endpoint();
    ResourcesBuilder::acme(KEY)
        .provider_upstream("acme", ("azure-east", "azure"), &endpoint, "cred-azure", &[])
        .with("api_version", "2024-10-21")
        .with(
            "models",
            vec![aliased("gpt-4o", "gpt4o-prod"), aliased("embed", "emb-small")],
        )
        .provider_upstream(
            "acme",
            ("azure-v1", "azure"),
            &format!("{endpoint}/openai/v1"),
            "cred-azure-v1",
            &[],
        )
        .with("models", vec![aliased("gpt-4o-v1", "gpt4o-global")])
        .provider_upstream(
            "acme",
            ("claude", "anthropic"),
            &mock.base_url(),
            "cred-claude",
            &[],
        )
        .with("models", vec![aliased("claude-sonnet", "claude-sonnet-4-5")])
        .model("acme", "gpt-4o")
        .with("fallbacks", vec!["claude-sonnet"])
        .model("acme", "claude-sonnet")
        .with("fallbacks", vec!["gpt-4o"])
        .into()
}

async fn start(db: &TestDb) -> (TestApp, MockUpstream) {
    spawn_on_mock(db, resources).await
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "say hello to me"}]})
}

/// Azure's own 429 (its S0 tier's token limit), as its service sends it.
const AZURE_429: &str = r#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 37 seconds. Go here for more details: https://aka.ms/oai/quotaincrease"}}"#;

/// Azure's content-filter refusal of a prompt.
const AZURE_CONTENT_FILTER: &str = r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry. To learn more about our content filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"hate":{"filtered":false,"severity":"safe"},"jailbreak":{"filtered":false,"detected":false},"self_harm":{"filtered":false,"severity":"safe"},"sexual":{"filtered":false,"severity":"safe"},"violence":{"filtered":true,"severity":"high"}}}}}"#;

both_backends!(
    chat_reaches_the_deployment_with_the_api_key_header,
    a_stream_from_azure_is_passed_on_with_its_usage,
    embeddings_reach_their_deployment,
    the_v1_api_takes_the_deployment_as_the_model,
    azures_429_parks_the_credential_as_long_as_it_says,
    a_content_filter_refusal_is_the_requests_fault,
    fallback_chains_cross_azure_and_anthropic,
    a_bad_azure_entry_is_refused_by_name,
);

async fn chat_reaches_the_deployment_with_the_api_key_header(db: TestDb) {
    let (app, mock) = start(&db).await;
    let r = app.post_json("/v1/chat/completions", KEY, &chat("gpt-4o")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-aigw-provider"), "azure");
    assert_eq!(header(&r, "x-aigw-model"), "gpt-4o");
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "Hello from the mock upstream "
    );
    // Azure's own fields come through as the client's Azure-aware code expects them.
    assert_eq!(v["prompt_filter_results"][0]["prompt_index"], 0);
    let calls = mock.calls();
    assert_eq!(calls.len(), 1);
    // The mock refuses a deployments call without `api-version` (404) or `api-key` (401).
    assert_eq!(calls[0].path, "/openai/deployments/gpt4o-prod/chat/completions");
    assert_eq!(calls[0].credential.as_deref(), Some("cred-azure"));
    assert_eq!(calls[0].body["model"], "gpt4o-prod");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.status, 200);
    assert_eq!(log.model_served.as_deref(), Some("gpt-4o"));
    assert_eq!(log.prompt_tokens, 4);
    assert_eq!(log.completion_tokens, 5);
}

async fn a_stream_from_azure_is_passed_on_with_its_usage(db: TestDb) {
    let (app, mock) = start(&db).await;
    let mut body = chat("gpt-4o");
    body["stream"] = json!(true);
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let events = chunks(&text);
    // Azure opens with a chunk of no choices (the prompt's filter results); it is passed on.
    assert_eq!(events[0]["choices"], json!([]));
    assert!(events[0]["prompt_filter_results"].is_array());
    assert_eq!(events.last().unwrap(), &json!("[DONE]"));
    assert_eq!(delta_text(&events), "Hello from the mock upstream ");
    // The client asked for no usage chunk: the gateway asked for it and took it out again.
    assert!(
        events.iter().all(|e| e.get("usage").is_none_or(Value::is_null)),
        "{text}"
    );
    let call = &mock.calls()[0];
    assert_eq!(call.body["stream_options"]["include_usage"], true);
    app.assert_stream_logged(call.usage.unwrap()).await;
}

async fn embeddings_reach_their_deployment(db: TestDb) {
    let (app, mock) = start(&db).await;
    let r = app
        .post_json(
            "/v1/embeddings",
            KEY,
            &json!({"model": "embed", "input": ["a b c", "d"]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    let call = &mock.calls()[0];
    assert_eq!(call.path, "/openai/deployments/emb-small/embeddings");
    assert_eq!(call.credential.as_deref(), Some("cred-azure"));
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.prompt_tokens, 4);
}

async fn the_v1_api_takes_the_deployment_as_the_model(db: TestDb) {
    let (app, mock) = start(&db).await;
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("gpt-4o-v1"))
        .await;
    assert_eq!(r.status(), 200);
    let call = &mock.calls()[0];
    assert_eq!(call.path, "/openai/v1/chat/completions");
    assert_eq!(call.credential.as_deref(), Some("cred-azure-v1"));
    assert_eq!(call.body["model"], "gpt4o-global");
}

async fn azures_429_parks_the_credential_as_long_as_it_says(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(
        Script::any()
            .model("emb-small")
            .times(1)
            .header("retry-after", "37")
            .header("retry-after-ms", "37000")
            .header("x-ratelimit-remaining-requests", "0")
            .header("x-ratelimit-remaining-tokens", "0")
            .error(429, serde_json::from_str(AZURE_429).unwrap()),
    );
    let embed = json!({"model": "embed", "input": "a b c"});
    let r = app.post_json("/v1/embeddings", KEY, &embed).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "x-aigw-error-source"), "upstream");
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Please retry after 37 seconds")
    );
    // Parked for 37 s: nothing goes to Azure meanwhile, and the client is told when to come back.
    app.clock.advance(chrono::Duration::seconds(30));
    let r = app.post_json("/v1/embeddings", KEY, &embed).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "retry-after"), "7");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_quota_exhausted");
    assert_eq!(mock.calls().len(), 1);
    // Once the wait is over, the deployment is called again.
    app.clock.advance(chrono::Duration::seconds(8));
    let r = app.post_json("/v1/embeddings", KEY, &embed).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock.calls().len(), 2);
}

async fn a_content_filter_refusal_is_the_requests_fault(db: TestDb) {
    let (app, mock) = start(&db).await;
    // `gpt-4o-v1` has no fallback: the refusal goes back to the client as Azure wrote it.
    mock.script(
        Script::any()
            .model("gpt4o-global")
            .times(1)
            .error(400, serde_json::from_str(AZURE_CONTENT_FILTER).unwrap()),
    );
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("gpt-4o-v1"))
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(header(&r, "x-aigw-error-source"), "upstream");
    assert_eq!(header(&r, "x-aigw-attempts"), "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "content_filter");
    assert_eq!(v["error"]["innererror"]["code"], "ResponsibleAIPolicyViolation");
    // No lock and no backoff: the same credential serves the next request at once.
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("gpt-4o-v1"))
        .await;
    assert_eq!(r.status(), 200);
    let calls = mock.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].credential.as_deref(), Some("cred-azure-v1"));
    let log = &app.logs("acme", 2).await;
    let refused = log.iter().find(|l| l.status == 400).unwrap();
    assert_eq!(refused.source.as_deref(), Some("upstream"));
    let attempts: Vec<Value> = serde_json::from_str(&refused.attempts_detail).unwrap();
    assert_eq!(attempts[0]["rule"], "request_error", "{attempts:?}");
}

async fn fallback_chains_cross_azure_and_anthropic(db: TestDb) {
    let (app, mock) = start(&db).await;
    // Azure down: `gpt-4o` falls back to Claude, translated back to a chat completion.
    mock.script(
        Script::any()
            .model("gpt4o-prod")
            .times(1)
            .error(503, json!({"error": {"code": "ServiceUnavailable", "message": "The service is temporarily unable to process your request. Please try again later."}})),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("gpt-4o")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-aigw-model"), "claude-sonnet");
    assert_eq!(header(&r, "x-aigw-provider"), "anthropic");
    assert_eq!(header(&r, "x-aigw-attempts"), "2");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    // The 503 parked the deployment for 30 s; past that, Anthropic overloaded: `claude-sonnet` on /v1/messages falls back to the Azure deployment
    // (a chat request translated from messages), answered as an Anthropic message.
    app.clock.advance(chrono::Duration::seconds(31));
    mock.script(Script::any().model("claude-sonnet-4-5").times(1).error(
        529,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ));
    let body = json!({"model": "claude-sonnet", "max_tokens": 50,
        "messages": [{"role": "user", "content": "say hello to me"}]});
    let r = app.post_json("/v1/messages", KEY, &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-aigw-model"), "gpt-4o");
    assert_eq!(header(&r, "x-aigw-provider"), "azure");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "Hello from the mock upstream ");
    let last = mock.calls().pop().unwrap();
    assert_eq!(last.path, "/openai/deployments/gpt4o-prod/chat/completions");
    assert_eq!(last.body["max_completion_tokens"], 50);
}

async fn a_bad_azure_entry_is_refused_by_name(db: TestDb) {
    let entry = |fields: &str| {
        format!(
            "[[workspace]]\nname = \"acme\"\n[[upstream]]\nworkspace = \"acme\"\nname = \"az\"\napi_key = \"k\"\n{fields}\n"
        )
    };
    let cases: &[(&str, &[&str])] = &[
        (
            "provider = \"azure\"",
            &["base_url is required for provider \"azure\""],
        ),
        (
            "provider = \"openai\"\napi_version = \"2024-10-21\"",
            &["api_version is only for provider \"azure\""],
        ),
        (
            "provider = \"azure\"\nbase_url = \"https://a.openai.azure.com?api-version=2024-06-01\"\napi_version = \"2024-10-21\"",
            &["api_version \"2024-10-21\" differs"],
        ),
    ];
    for (fields, needles) in cases {
        let err = match try_spawn_app(&db, Setup::resources(entry(fields))).await {
            Ok(_) => panic!("{fields}: a bad azure entry was accepted"),
            Err(e) => e.to_string(),
        };
        for needle in *needles {
            assert!(
                err.contains(needle),
                "{fields}: {err:?} should contain {needle:?}"
            );
        }
    }
}
