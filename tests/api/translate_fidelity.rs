//! Translation that loses nothing (chat ⇄ messages), through the real HTTP surface: what each
//! side asked for reaches the other, or is refused by name; the answer says what the upstream
//! said; errors on one endpoint have one shape.

use aigw::mock_upstream::Script;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{Setup, TestDb, spawn_app};
use crate::translate::{KEY, attempts, start};

both_backends!(
    a_refusal_to_translate_does_not_hide_an_earlier_upstream_error,
    messages_on_openai_bound_the_output_with_max_completion_tokens,
    a_stop_sequence_the_provider_names_reaches_the_anthropic_client,
    errors_have_one_shape_per_endpoint,
    a_chat_request_without_a_bound_gets_the_models_own_output_limit,
);

/// Posts `body` to `/v1/messages` with Anthropic's headers.
async fn post_messages(app: &crate::helpers::TestApp, body: &Value) -> reqwest::Response {
    app.post_messages(KEY, Some("2023-06-01"), body).await
}

/// A chain [gpt-4o: 503, claude-sonnet: cannot express `n: 2`] answers the 503: the refusal is
/// the answer only when nothing else answered.
async fn a_refusal_to_translate_does_not_hide_an_earlier_upstream_error(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().model("gpt-4o").error(
        503,
        json!({"error": {"message": "The engine is currently overloaded", "type": "server_error"}}),
    ));
    let body = json!({"model": "gpt-4o", "n": 2, "messages": [{"role": "user", "content": "x"}]});
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 503);
    assert_eq!(crate::translate::header(&r, "x-aigw-error-source"), "upstream");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["message"], "The engine is currently overloaded", "{v}");
    assert_eq!(mock.call_count(), 1, "the refused translation sent nothing");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.status, 503);
    assert_eq!(attempts(log).len(), 1);
    app.stop().await;
}

/// OpenAI's reasoning models refuse `max_tokens`: an Anthropic client's `max_tokens` reaches an
/// `openai` credential as `max_completion_tokens`; more than four stop sequences are refused by
/// name, as OpenAI would refuse them.
async fn messages_on_openai_bound_the_output_with_max_completion_tokens(db: TestDb) {
    let (app, mock) = start(&db).await;
    let body = json!({"model": "gpt-4o", "max_tokens": 64, "stop_sequences": ["a", "b", "c", "d"],
        "messages": [{"role": "user", "content": "say hello to me"}]});
    assert_eq!(post_messages(&app, &body).await.status(), 200);
    let sent = &mock.calls()[0].body;
    assert_eq!(sent["max_completion_tokens"], 64, "{sent}");
    assert!(sent.get("max_tokens").is_none(), "{sent}");
    assert_eq!(sent["stop"], json!(["a", "b", "c", "d"]));

    // (`gpt-4o-mini`: no fallback that could serve it natively.)
    let mut five = body.clone();
    five["model"] = json!("gpt-4o-mini");
    five["stop_sequences"] = json!(["a", "b", "c", "d", "e"]);
    let r = post_messages(&app, &five).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "stop_sequences", "{v}");
    assert_eq!(mock.call_count(), 1, "nothing more was sent upstream");
    app.stop().await;
}

/// A provider that names the stop sequence that ended the answer (vLLM's `stop_reason`): the
/// Anthropic client reads `stop_reason: "stop_sequence"` and the sequence, streamed or not.
async fn a_stop_sequence_the_provider_names_reaches_the_anthropic_client(db: TestDb) {
    let (app, mock) = start(&db).await;
    let choice = json!({"index": 0, "message": {"role": "assistant", "content": "one two"},
        "finish_reason": "stop", "stop_reason": "three"});
    let answer = json!({"id": "cmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",
        "choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}});
    mock.script(
        Script::any()
            .times(1)
            .raw(200, "application/json", &answer.to_string()),
    );
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 16, "stop_sequences": ["three"],
        "messages": [{"role": "user", "content": "count"}]});
    let v: Value = post_messages(&app, &body).await.json().await.unwrap();
    assert_eq!(
        (&v["stop_reason"], &v["stop_sequence"]),
        (&json!("stop_sequence"), &json!("three")),
        "{v}"
    );

    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "cmpl-2", "object": "chat.completion.chunk", "model": "gpt-4o-mini",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "stop_reason": if finish.is_null() { Value::Null } else { json!("three") }}]})
        )
    };
    let stream = [
        chunk(json!({"role": "assistant", "content": "one two"}), Value::Null),
        chunk(json!({}), json!("stop")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    mock.script(Script::any().times(1).raw(200, "text/event-stream", &stream));
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let text = post_messages(&app, &streamed).await.text().await.unwrap();
    let delta = crate::translate::chunks(&text)
        .into_iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        delta["delta"],
        json!({"stop_reason": "stop_sequence", "stop_sequence": "three"}),
        "{text}"
    );
    app.stop().await;
}

/// issue 45 item 6: `/v1/messages` answers every error in Anthropic's envelope (the gateway's
/// refusals keep their `code` and fields in it); `/v1/chat/completions` answers every error in
/// OpenAI's shape and words, an Anthropic upstream's too.
async fn errors_have_one_shape_per_endpoint(db: TestDb) {
    let (app, mock) = start(&db).await;
    let ask = |model: &str| json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]});
    let rows = [
        (
            ask("no-such-model"),
            404,
            "not_found_error",
            "model_not_found",
            json!("model"),
        ),
        (
            {
                let mut b = ask("gpt-4o-mini");
                b["top_k"] = json!(5);
                b
            },
            400,
            "invalid_request_error",
            "invalid_request_error",
            json!("top_k"),
        ),
    ];
    for (body, status, kind, code, param) in rows {
        let r = post_messages(&app, &body).await;
        assert_eq!(r.status(), status, "{body}");
        assert_eq!(crate::translate::header(&r, "x-aigw-error-source"), "gateway");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(
            (&v["error"]["type"], &v["error"]["code"], &v["error"]["param"]),
            (&json!(kind), &json!(code), &param),
            "{v}"
        );
        assert!(v["error"]["message"].is_string(), "{v}");
    }
    let r = app
        .post_messages("sk-aigw-0000000000000000000000000000nope", None, &ask("gpt-4o"))
        .await;
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (&v["type"], &v["error"]["type"]),
        (&json!("error"), &json!("authentication_error")),
        "{v}"
    );
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");

    // The same refusal on chat keeps OpenAI's shape.
    let r = app
        .post_json("/v1/chat/completions", KEY, &ask("no-such-model"))
        .await;
    let v: Value = r.json().await.unwrap();
    assert!(v.get("type").is_none(), "{v}");
    assert_eq!(
        (&v["error"]["type"], &v["error"]["code"]),
        (&json!("invalid_request_error"), &json!("model_not_found"))
    );

    // An Anthropic upstream's errors reach a chat client in OpenAI's words.
    for (status, anthropic, kind, code) in [
        (
            429,
            "rate_limit_error",
            "rate_limit_error",
            json!("rate_limit_exceeded"),
        ),
        (529, "overloaded_error", "api_error", Value::Null),
    ] {
        // (Past the rest the previous error parked the credential for.)
        app.clock.advance(chrono::Duration::hours(1));
        mock.reset();
        mock.script(Script::any().model("claude-sonnet-4-5").error(
            status,
            json!({"type": "error", "error": {"type": anthropic, "message": "upstream says no"}}),
        ));
        let r = app
            .post_json("/v1/chat/completions", KEY, &ask("claude-sonnet"))
            .await;
        assert_eq!(r.status(), status);
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            v,
            json!({"error": {"message": "upstream says no", "type": kind, "param": null, "code": code}})
        );
    }
    app.stop().await;
}

/// issue 45 item 9: a chat request naming no output bound gets, on an Anthropic credential, the
/// model's own `max_output_tokens` (from the resources file, changed through the admin API),
/// and the log says the gateway chose it; a request naming one gets its own.
async fn a_chat_request_without_a_bound_gets_the_models_own_output_limit(db: TestDb) {
    let mock = aigw::mock_upstream::MockUpstream::start().await.unwrap();
    let resources: String = crate::translate::fixture(&mock)
        .set("model", "claude-sonnet", "max_output_tokens", 20000)
        .member_with_password("acme", "boss@acme.test", "admin", "boss-password-1")
        .into();
    let app = spawn_app(&db, Setup::resources(resources)).await;
    let ask = |max: Option<u64>| {
        let mut b = json!({"model": "claude-sonnet", "messages": [{"role": "user", "content": "write a long story"}]});
        if let Some(m) = max {
            b["max_completion_tokens"] = json!(m);
        }
        b
    };
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &ask(None))
            .await
            .status(),
        200
    );
    assert_eq!(mock.calls()[0].body["max_tokens"], 20000);
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(
        attempts(log)[0]["max_tokens_chosen"],
        20000,
        "{}",
        log.attempts_detail
    );

    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &ask(Some(50)))
            .await
            .status(),
        200
    );
    assert_eq!(mock.calls()[1].body["max_tokens"], 50);
    let log = &app.logs("acme", 1).await[0];
    assert!(
        attempts(log)[0].get("max_tokens_chosen").is_none(),
        "{}",
        log.attempts_detail
    );

    // The admin API shows it and changes it; a bad value is refused by name; null is the default.
    let token = app.login("boss@acme.test", "boss-password-1").await;
    let admin = |method: reqwest::Method, path: String, body: Option<Value>| {
        let mut r = app
            .client
            .request(method, format!("{}{path}", app.address))
            .bearer_auth(&token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        r.send()
    };
    let list: Value = admin(reqwest::Method::GET, "/admin/v1/models".into(), None)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let model = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "claude-sonnet")
        .unwrap()
        .clone();
    assert_eq!(model["max_output_tokens"], 20000, "{model}");
    let path = format!("/admin/v1/models/{}", model["id"]);
    let r = admin(
        reqwest::Method::PATCH,
        path.clone(),
        Some(json!({"max_output_tokens": 0})),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 422);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "max_output_tokens", "{v}");
    let r = admin(
        reqwest::Method::PATCH,
        path.clone(),
        Some(json!({"max_output_tokens": 8192})),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["max_output_tokens"], 8192);
    app.sync().await;
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &ask(None))
            .await
            .status(),
        200
    );
    assert_eq!(mock.calls()[2].body["max_tokens"], 8192);
    let r = admin(
        reqwest::Method::PATCH,
        path,
        Some(json!({"max_output_tokens": null})),
    )
    .await
    .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["max_output_tokens"], Value::Null, "{v}");
    app.sync().await;
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &ask(None))
            .await
            .status(),
        200
    );
    // Unset, the default is the model family's own limit (claude-sonnet-4-5: 64000), not 4096.
    assert_eq!(mock.calls()[3].body["max_tokens"], 64000);
    app.stop().await;
}
