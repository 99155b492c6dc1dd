//! What a routed answer tells the client about its routing and its wait (DESIGN.md §6, §7, §10,
//! §11): `x-aigw-attempts` counts the upstream requests sent, `x-aigw-model` and
//! `x-aigw-provider` name the last attempt on every answer after dispatch, and a passed-on
//! upstream error whose lock is more than a minute away says `x-should-retry: false` with the
//! real wait.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::helpers::{ResourcesBuilder, Setup, TestDb, spawn_app};
use crate::proxy::KEY;
use crate::upstream::{chat, pool_of};

/// The routing headers of `r`: attempts, model, provider.
fn routed(r: &reqwest::Response) -> (Option<&str>, Option<&str>, Option<&str>) {
    let h = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok());
    (h("x-aigw-attempts"), h("x-aigw-model"), h("x-aigw-provider"))
}

/// A 502 after requests were sent (unreachable, an invalid answer) names the model and provider
/// tried and the requests sent; the `upstream_quota_exhausted` that follows sent nothing: 0
/// attempts, and the model and provider of the first candidate the chain considered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_errors_after_dispatch_name_the_model_provider_and_requests_sent() {
    let db = TestDb::sqlite();
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[
        ("dead", "http://127.0.0.1:1/v1", "cred-dead", r#"["gone"]"#, ""),
        ("liar", &url, "cred-liar", r#"["m-invalid"]"#, ""),
    ]);
    let setup = Setup {
        settings: Box::new(|s| {
            s.single_candidate_retry_min_ms = 10;
            s.single_candidate_retry_max_ms = 20;
        }),
        ..Setup::resources(text)
    };
    let app = spawn_app(&db, setup).await;

    // Unreachable: the single candidate's one retry makes two requests sent.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("gone")).await;
    assert_eq!(r.status(), 502);
    assert_eq!(routed(&r), (Some("2"), Some("gone"), Some("openai-compatible")));
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.code.as_deref(), Some("upstream_unreachable"));

    // An answer that is not the endpoint's JSON: one request sent, the credential parked.
    mock.script(
        Script::any()
            .credential("cred-liar")
            .raw(200, "text/html", "<html>"),
    );
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("m-invalid"))
        .await;
    assert_eq!(r.status(), 502);
    assert_eq!(
        routed(&r),
        (Some("1"), Some("m-invalid"), Some("openai-compatible"))
    );

    // Parked: nothing is sent; the first candidate considered is named.
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("m-invalid"))
        .await;
    assert_eq!(r.status(), 429);
    assert_eq!(
        routed(&r),
        (Some("0"), Some("m-invalid"), Some("openai-compatible"))
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted");
    assert_eq!(mock.call_count(), 1);
    app.stop().await;
}

/// A deadline passed on a request sent (no head; a stream whose head came but not its first
/// byte) is a 504 that names the model and provider and the one request sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_names_the_model_provider_and_requests_sent() {
    let db = TestDb::sqlite();
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[
        ("slow", &url, "cred-slow", r#"["m1"]"#, ""),
        ("stalling", &url, "cred-stalling", r#"["m2"]"#, ""),
    ]);
    let setup = Setup {
        settings: Box::new(|s| {
            s.request_timeout_secs = 1;
            s.stream_first_byte_timeout_secs = 1;
        }),
        ..Setup::resources(text)
    };
    let app = spawn_app(&db, setup).await;
    mock.script(Script {
        delay_ms: Some(30_000),
        ..Script::any().credential("cred-slow")
    });
    mock.script(Script {
        stall_after_head_ms: Some(30_000),
        ..Script::any().credential("cred-stalling")
    });
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 504);
    assert_eq!(routed(&r), (Some("1"), Some("m1"), Some("openai-compatible")));
    let stream = json!({"model": "m2", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let r = app.post_json("/v1/chat/completions", KEY, &stream).await;
    assert_eq!(r.status(), 504, "the head came, the first byte did not");
    assert_eq!(routed(&r), (Some("1"), Some("m2"), Some("openai-compatible")));
    app.stop().await;
}

/// The gateway's own "credential busy" (no slot came free, nothing sent) is no attempt: the
/// fallback that serves is the first request sent, and a chain whose only candidate is busy
/// sent nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_credential_is_no_attempt() {
    let db = TestDb::sqlite();
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[
        ("one", &url, "cred-one", r#"["m1", "m3"]"#, "max_in_flight = 1"),
        ("two", &url, "cred-two", r#"["m2"]"#, ""),
    ]) + &String::from(
        ResourcesBuilder::new()
            .model("acme", "m1")
            .with("fallbacks", vec!["m2"]),
    );
    let setup = Setup {
        settings: Box::new(|s| s.slot_wait_ms = 20),
        ..Setup::resources(text)
    };
    let app = spawn_app(&db, setup).await;
    // A stream not read holds `one`'s only slot.
    mock.script(
        Script::any()
            .credential("cred-one")
            .times(1)
            .chunk_delay(300)
            .words(50),
    );
    let stream = json!({"model": "m3", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let held = app.post_json("/v1/chat/completions", KEY, &stream).await;
    assert_eq!(held.status(), 200);
    app.until_in_flight(app.credential_id("one").await, 1).await;

    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        routed(&r),
        (Some("1"), Some("m2"), Some("openai-compatible")),
        "`one` was busy: only the fallback's request was sent"
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m3")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(routed(&r), (Some("0"), Some("m3"), Some("openai-compatible")));
    assert_eq!(mock.call_count(), 2, "the stream and the fallback");
    drop(held);
    app.stop().await;
}

/// The answer that bans a key (its 5th trip) after a routed failure still names the model,
/// provider and requests sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_that_bans_a_key_names_its_routing() {
    let db = TestDb::sqlite();
    let mock = MockUpstream::start().await.unwrap();
    let text = String::from(ResourcesBuilder::acme(KEY).provider_upstream(
        "acme",
        ("claude", "anthropic"),
        &mock.base_url(),
        "cred-claude",
        &["claude-sonnet"],
    ));
    let app = spawn_app(&db, Setup::resources(text)).await;
    let bad = json!({"model": "claude-sonnet", "messages": "not a list"});
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &bad).await.status(),
        400
    );
    let key_id = app.logs("acme", 1).await[0].key_id;
    // Four trips behind it, the last block over.
    let fourth = aigw::breaker::Trip {
        trip: 4,
        at: app.clock.now().timestamp_millis() - 86_400_000,
        requests: 100,
        failures: 100,
        blocked_until: Some(app.clock.now().timestamp_millis() - 1),
        banned: false,
    };
    aigw::breaker::persist(&app.state.store, key_id, &fourth)
        .await
        .unwrap();
    assert!(app.state.reload().await);
    app.clock.advance(chrono::Duration::seconds(61));
    for _ in 0..99 {
        assert_eq!(
            app.post_json("/v1/chat/completions", KEY, &bad).await.status(),
            400
        );
    }
    // The 100th failure in the window: an upstream 400 passed on, and the 5th trip.
    let refused =
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad field"}});
    mock.script(Script::any().error(400, refused));
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("claude-sonnet"))
        .await;
    assert_eq!(r.status(), 403);
    assert_eq!(routed(&r), (Some("1"), Some("claude-sonnet"), Some("anthropic")));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "api_key_permanently_banned");
    app.stop().await;
}

/// Seed 002, DESIGN.md §7: a passed-on upstream error whose lock (or the reset it named) is more
/// than a minute away says `x-should-retry: false` and gives the real wait in `Retry-After` and
/// `retry-after-ms`, though the provider sent none: the SDK would retry twice and each retry
/// would count toward the key's breaker. Each row: name, provider, model, status, headers, body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_on_error_tells_the_wait_of_the_lock_it_wrote() {
    type Row = (
        &'static str,
        &'static str,
        &'static str,
        u16,
        &'static [(&'static str, &'static str)],
        Value,
    );
    let spend_cap = json!({"type": "error", "error": {"type": "rate_limit_error", "message": "You have reached your API usage limits: your organization has crossed its monthly API usage threshold.", "details": {"error_code": "enforced_spend_limit_reached"}}});
    let rows: Vec<Row> = vec![
        (
            "Anthropic's spend cap: a 429 with no retry-after (seeds 000, 002)",
            "openai-compatible",
            "m-spend",
            429,
            &[],
            spend_cap.clone(),
        ),
        (
            "a spend cap whose Retry-After is shorter than its hold",
            "openai-compatible",
            "m-spend-short",
            429,
            &[("retry-after", "30")],
            spend_cap,
        ),
        (
            "OpenRouter's free daily cap",
            "openrouter",
            "m-daily:free",
            429,
            &[],
            json!({"error": {"message": "Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day", "code": 429}}),
        ),
        (
            "Gemini's RetryInfo.retryDelay",
            "openai-compatible",
            "m-gemini",
            429,
            &[],
            json!([{"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", "status": "RESOURCE_EXHAUSTED", "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "3600s"}]}}]),
        ),
        (
            "Codex's usage limit",
            "openai-compatible",
            "m-codex",
            429,
            &[],
            json!({"error": {"type": "usage_limit_reached", "message": "The usage limit has been reached", "plan_type": "plus", "resets_in_seconds": 1800}}),
        ),
        (
            "x-ratelimit-reset-requests",
            "openai-compatible",
            "m-window",
            429,
            &[
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "6m0s"),
            ],
            json!({"error": {"message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit_exceeded"}}),
        ),
    ];
    let db = TestDb::sqlite();
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let mut text = pool_of(&[("short", &url, "cred-short", r#"["m-short"]"#, "")]);
    for (i, (_, provider, model, ..)) in rows.iter().enumerate() {
        text.push_str(&format!(
            "[[upstream]]\nworkspace = \"acme\"\nname = \"c{i}\"\nprovider = \"{provider}\"\n\
             base_url = \"{url}\"\napi_key = \"cred-{i}\"\nmodels = [\"{model}\"]\n"
        ));
    }
    let app = spawn_app(&db, Setup::resources(text)).await;
    for (i, (name, _, model, status, headers, body)) in rows.iter().enumerate() {
        let mut script = Script::any().credential(&format!("cred-{i}"));
        for (k, v) in *headers {
            script = script.header(k, v);
        }
        mock.script(script.error(*status, body.clone()));
        let r = app.post_json("/v1/chat/completions", KEY, &chat(model)).await;
        assert_eq!(r.status().as_u16(), *status, "{name}");
        assert_eq!(r.headers()["x-aigw-error-source"], "upstream", "{name}");
        assert_eq!(
            r.headers().get("x-should-retry").map(|v| v.to_str().unwrap()),
            Some("false"),
            "{name}"
        );
        // The real wait is the lock the error wrote, as the log shows it.
        let log = &app.logs("acme", 1).await[0];
        let detail: Value = serde_json::from_str(&log.attempts_detail).unwrap();
        let until = chrono::DateTime::parse_from_rfc3339(detail[0]["lock_until"].as_str().unwrap()).unwrap();
        let lock = (until.timestamp() - app.clock.now().timestamp()) as f64;
        assert!(lock > 60.0, "{name}: a lock of {lock} s");
        let secs: f64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
        let ms: f64 = r.headers()["retry-after-ms"].to_str().unwrap().parse().unwrap();
        assert!(
            (secs - lock).abs() <= 1.0,
            "{name}: Retry-After {secs}, lock {lock}"
        );
        assert!(
            (ms / 1000.0 - lock).abs() <= 1.0,
            "{name}: retry-after-ms {ms}, lock {lock}"
        );
        assert_eq!(r.json::<Value>().await.unwrap(), *body, "{name}: the body as is");
    }
    // A lock within the minute is the SDK's to sit out: nothing added.
    mock.script(
        Script::any()
            .credential("cred-short")
            .header("x-ratelimit-reset-requests", "20s")
            .error(
                429,
                json!({"error": {"message": "Rate limit reached for requests"}}),
            ),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m-short")).await;
    assert_eq!(r.status(), 429);
    for h in ["x-should-retry", "retry-after", "retry-after-ms"] {
        assert!(!r.headers().contains_key(h), "{h}: {:?}", r.headers());
    }
    app.stop().await;
}
