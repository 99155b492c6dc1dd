//! Upstreams are not trusted: an error that echoes the credential's key reaches neither the
//! client nor the request log unmasked, and an answer that is not what its endpoint promises is a
//! 502 `upstream_invalid_response` that parks the credential like a 5xx, the chain moving on.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, TestApp, TestDb, chat, spawn_on_mock};
use crate::proxy::KEY;

/// The key of credential `one` (OpenAI's project-key shape).
const SECRET_ONE: &str = "sk-proj-Tq3vX9bLm2Ry7Kd4Wz8Pf1Hs6Jn0Gc5Ae2Ui7Oo3Yt9Rx4wxyz";
/// The key of credential `two`.
const SECRET_TWO: &str = "sk-proj-Bb1Cc2Dd3Ee4Ff5Gg6Hh7Ii8Jj9Kk0Ll1Mm2Nn3Oo4Pp5Qq6abcd";

/// `one` serves `m1` (first) and `solo` (alone); `two` serves `m1` (second). `boss` is an admin.
fn resources(mock: &MockUpstream) -> String {
    let url = &mock.base_url();
    ResourcesBuilder::acme(KEY)
        .member_with_password("acme", "boss@acme.test", "admin", "boss-password-1")
        .upstream("acme", "one", url, SECRET_ONE, &["m1", "solo"])
        .with("priority", 0)
        .upstream("acme", "two", url, SECRET_TWO, &["m1"])
        .with("priority", 1)
        .into()
}

async fn start(db: &TestDb) -> (TestApp, MockUpstream) {
    spawn_on_mock(db, resources).await
}

/// Every spelling of `SECRET_ONE` that must not come out: whole, its first 12 characters, and
/// the truncated forms the tests make the upstream print.
fn assert_no_secret(what: &str, text: &str) {
    for leak in [
        SECRET_ONE,
        &SECRET_ONE[..12],
        "Tq3…wxyz",
        "Tq3\\u2026wxyz",
        "****wxyz",
    ] {
        assert!(!text.contains(leak), "{what} leaks {leak:?}: {text}");
    }
}

both_backends!(
    an_error_body_echoing_the_key_is_masked,
    a_mid_stream_error_echoing_the_key_is_masked,
    a_success_that_is_not_the_endpoints_json_is_a_502,
    an_invalid_answer_parks_the_credential_and_the_chain_moves_on,
    a_status_outside_http_is_a_502,
    the_connection_test_masks_the_key,
);

async fn an_error_body_echoing_the_key_is_masked(db: TestDb) {
    let (app, mock) = start(&db).await;
    // OpenAI's 401 wording, the key echoed whole and in JSON-escaped and starred truncations.
    let body = format!(
        r#"{{"error":{{"message":"Incorrect API key provided: sk-proj-Tq3…wxyz. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}},"debug":{{"key":"{SECRET_ONE}","escaped":"sk-proj-Tq3\u2026wxyz","stars":"****wxyz"}}}}"#
    );
    mock.script(
        Script::any()
            .credential(SECRET_ONE)
            .header("x-ratelimit-debug", &format!("key={SECRET_ONE}"))
            .raw(401, "application/json", &body),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("solo")).await;
    assert_eq!(r.status(), 401, "the upstream's status is passed on");
    assert_eq!(r.headers()["x-aigw-error-source"], "upstream");
    assert_eq!(r.headers()["x-ratelimit-debug"], "key=***");
    let text = r.text().await.unwrap();
    assert_no_secret("the answer", &text);
    let answer: Value = serde_json::from_str(&text).expect("still JSON");
    assert_eq!(
        answer["error"]["message"],
        "Incorrect API key provided: ***. You can find your API key at https://platform.openai.com/account/api-keys."
    );
    assert_eq!(answer["error"]["code"], "invalid_api_key");
    assert_eq!(
        answer["debug"],
        json!({"key": "***", "escaped": "***", "stars": "***"})
    );

    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.code.as_deref()), (401, Some("invalid_api_key")));
    assert_no_secret("the request log", &format!("{log:?}"));
    app.stop().await;
}

async fn a_mid_stream_error_echoing_the_key_is_masked(db: TestDb) {
    let (app, mock) = start(&db).await;
    let events = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Hi\"}}}}]}}\n\n\
         data: {{\"error\":{{\"message\":\"Incorrect API key provided: {SECRET_ONE}\",\"code\":401}},\
         \"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"\"}},\"finish_reason\":\"error\"}}]}}\n\n\
         data: [DONE]\n\n"
    );
    mock.script(
        Script::any()
            .credential(SECRET_ONE)
            .raw(200, "text/event-stream", &events),
    );
    let mut body = chat("solo");
    body["stream"] = json!(true);
    let r = app.post_json("/v1/chat/completions", KEY, &body).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert_no_secret("the stream", &text);
    assert!(text.contains("Incorrect API key provided: ***"), "{text}");
    assert!(text.contains("\"content\":\"Hi\""), "the rest passes on: {text}");

    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.code.as_deref(), Some("upstream_stream_error"));
    assert!(
        log.explanation
            .contains("mid-stream error: Incorrect API key provided: ***"),
        "{}",
        log.explanation
    );
    assert_no_secret("the request log", &format!("{log:?}"));
    app.stop().await;
}

async fn a_success_that_is_not_the_endpoints_json_is_a_502(db: TestDb) {
    let (app, mock) = start(&db).await;
    let embed = json!({"model": "solo", "input": "hi"});
    let cases: &[(&str, &Value, &str, &str, &str)] = &[
        (
            "/v1/chat/completions",
            &chat("solo"),
            "text/html",
            "<html><body><h1>502 Bad Gateway</h1><p>SENTINEL</p></body></html>",
            "not JSON",
        ),
        (
            "/v1/chat/completions",
            &chat("solo"),
            "application/json",
            r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"SENTINEL"#,
            "truncated JSON",
        ),
        (
            "/v1/chat/completions",
            &chat("solo"),
            "text/event-stream",
            "data: {\"choices\":[{\"delta\":{\"content\":\"SENTINEL\"}}]}\n\ndata: [DONE]\n\n",
            "an event stream to a request that asked for none",
        ),
        (
            "/v1/chat/completions",
            &chat("solo"),
            "application/json",
            r#"{"error":{"message":"SENTINEL overloaded"}}"#,
            "without a `choices` array",
        ),
        (
            "/v1/chat/completions",
            &chat("solo"),
            "application/json",
            "",
            "an empty body",
        ),
        (
            "/v1/embeddings",
            &embed,
            "application/json",
            r#"{"object":"list","SENTINEL":1}"#,
            "without a `data` array",
        ),
    ];
    for (i, (path, request, content_type, raw, reason)) in cases.iter().enumerate() {
        mock.reset();
        mock.script(Script::any().credential(SECRET_ONE).raw(200, content_type, raw));
        let r = app.post_json(path, KEY, request).await;
        assert_eq!(r.status(), 502, "{reason}");
        assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
        let text = r.text().await.unwrap();
        assert!(
            !text.contains("SENTINEL"),
            "the upstream's body is not passed on: {text}"
        );
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(answer["error"]["code"], "upstream_invalid_response", "{reason}");
        assert_eq!(answer["error"]["type"], "api_error");
        assert!(
            answer["error"]["message"].as_str().unwrap().contains(reason),
            "{answer}"
        );
        assert_eq!(mock.call_count(), 1, "{reason}: no retry of an invalid answer");

        let logs = app.logs("acme", i + 1).await;
        let log = &logs[0];
        assert_eq!(
            (log.status, log.code.as_deref(), log.total_tokens),
            (502, Some("upstream_invalid_response"), 0),
            "{reason}"
        );
        assert!(
            log.attempts_detail.contains("\"rule\":\"invalid_response\""),
            "{}",
            log.attempts_detail
        );
        // Parked like a 5xx: 30 s.
        app.clock.advance(chrono::Duration::seconds(31));
    }
    app.stop().await;
}

async fn an_invalid_answer_parks_the_credential_and_the_chain_moves_on(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(
        Script::any()
            .credential(SECRET_ONE)
            .raw(200, "text/html", "<html>captive portal</html>"),
    );
    let called = |mock: &MockUpstream| -> Vec<String> {
        mock.calls()
            .into_iter()
            .map(|c| c.credential.unwrap_or_default())
            .collect()
    };
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(
        r.status(),
        200,
        "nothing was sent yet: the next credential serves"
    );
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(called(&mock), [SECRET_ONE, SECRET_TWO]);
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.attempts), (200, 2));
    assert!(log.total_tokens > 0, "the answer that served is counted");

    // `one` is parked for 30 s, like after a 5xx.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(called(&mock), [SECRET_ONE, SECRET_TWO, SECRET_TWO]);
    app.clock.advance(chrono::Duration::seconds(31));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        called(&mock),
        [SECRET_ONE, SECRET_TWO, SECRET_TWO, SECRET_ONE, SECRET_TWO]
    );
    app.stop().await;
}

async fn a_status_outside_http_is_a_502(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().credential(SECRET_ONE).raw(
        999,
        "application/json",
        r#"{"error":{"message":"odd"}}"#,
    ));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("solo")).await;
    assert_eq!(r.status(), 502, "never a 999 to the client");
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["error"]["code"], "upstream_invalid_response");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("status 999"),
        "{answer}"
    );
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(
        (log.status, log.code.as_deref()),
        (502, Some("upstream_invalid_response"))
    );
    // Parked like a 5xx: the next request finds no candidate and sends nothing.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("solo")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(mock.call_count(), 1);
    // With another credential behind it, the chain moves on.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    app.stop().await;
}

async fn the_connection_test_masks_the_key(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(Script::any().credential(SECRET_ONE).error(
        401,
        json!({"error": {"message": format!("Incorrect API key provided: {SECRET_ONE}"), "code": "invalid_api_key"}}),
    ));
    let one = app.credential_id("one").await;
    let token = app.login("boss@acme.test", "boss-password-1").await;
    let r = app
        .client
        .post(format!("{}/admin/v1/upstreams/{}/test", app.address, one))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    assert_no_secret("the connection test", &text);
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (body["ok"].clone(), body["status"].clone()),
        (json!(false), json!(401))
    );
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("Incorrect API key provided: ***"),
        "{body}"
    );
    let audit = app.get_as("/admin/v1/audit", &token).await.text().await.unwrap();
    assert!(
        audit.contains("Incorrect API key provided: ***"),
        "the test is audited: {audit}"
    );
    assert_no_secret("the audit log", &audit);
    app.stop().await;
}
