//! Dispatch's answers around classification: a pool that exists but cannot serve now is
//! exhausted (never unreachable), the single-candidate retry fires only after classification
//! left the credential usable, and a passed-on upstream wait over a minute is not for the SDK.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{Setup, TestDb, spawn_app};
use crate::proxy::KEY;
use crate::upstream::{chat, credentials_called, pool_of, quick_retry};

both_backends!(
    a_banned_credential_makes_the_request_exhausted_not_unreachable,
    a_disabled_credential_makes_the_request_exhausted,
    the_single_retry_waits_for_the_classification,
    a_passed_on_wait_over_a_minute_tells_the_sdk_not_to_retry,
    the_single_retry_counts_only_credentials_that_can_serve_now,
    a_5xx_is_held_while_its_retry_waits,
);

/// Asserts `r` is the gateway's `upstream_quota_exhausted` naming `secs`.
async fn assert_exhausted(r: reqwest::Response, secs: u64) {
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
    assert_eq!(r.headers()["retry-after"].to_str().unwrap(), secs.to_string());
    assert_eq!(r.headers()["x-should-retry"], "false", "a wait over 60 s");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
    assert_eq!(body["error"]["retry_after"], secs);
}

async fn a_banned_credential_makes_the_request_exhausted_not_unreachable(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[("solo", &url, "cred-solo", r#"["m1"]"#, "")]);
    let app = spawn_app(&db, Setup::resources(text)).await;
    let verify = json!({"error": {"code": 403, "message": "To continue, verify your account at https://accounts.example/signin", "status": "PERMISSION_DENIED"}});
    mock.script(Script::any().error(403, verify.clone()));
    // The request that meets the ban gets the upstream's own answer.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 403);
    assert_eq!(r.headers()["x-aigw-error-source"], "upstream");
    assert_eq!(r.json::<Value>().await.unwrap(), verify);
    // Every later one: exhausted until the earliest lock ends (the ban's 24 h lock).
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_exhausted(r, 24 * 3600).await;
    // Past its lock the banned mark keeps it out until a connection test: still exhausted.
    app.clock
        .advance(chrono::Duration::hours(24) + chrono::Duration::seconds(1));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_exhausted(r, 300).await;
    assert_eq!(mock.call_count(), 1, "nothing more was sent upstream");
    app.stop().await;
}

async fn a_disabled_credential_makes_the_request_exhausted(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[
        ("off", &url, "cred-off", r#"["m1"]"#, "enabled = false"),
        ("on", &url, "cred-on", r#"["m2"]"#, ""),
    ]);
    let app = spawn_app(&db, Setup::resources(text)).await;
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_exhausted(r, 300).await;
    assert_eq!(mock.call_count(), 0);
    // A model no credential serves stays unknown.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("nope")).await;
    assert_eq!(r.status(), 404);
    app.stop().await;
}

async fn the_single_retry_waits_for_the_classification(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[("solo", &url, "cred-solo", r#"["m1", "m2"]"#, "")]);
    let app = spawn_app(&db, quick_retry(text)).await;
    // A 503 that names its wait parks the model for it: no retry of the same credential.
    let busy = json!({"error": {"message": "Service busy", "type": "server_error"}});
    mock.script(
        Script::any()
            .model("m1")
            .header("retry-after", "120")
            .error(503, busy.clone()),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().await.unwrap(), busy);
    assert_eq!(mock.call_count(), 1, "not retried: the model rests 120 s");
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.attempts, 1);
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted");
    assert_eq!(body["error"]["retry_after"], 120);
    // "No capacity available": 5 s on that model and stop; no retry either.
    mock.reset();
    let none = json!({"error": {"message": "No capacity available for model m2 on the server"}});
    mock.script(Script::any().model("m2").error(503, none.clone()));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m2")).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().await.unwrap(), none);
    assert_eq!(
        mock.call_count(),
        1,
        "not retried: another try finds no capacity either"
    );
    app.stop().await;
}

async fn a_passed_on_wait_over_a_minute_tells_the_sdk_not_to_retry(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[("solo", &url, "cred-solo", r#"["m1", "m2"]"#, "")]);
    let app = spawn_app(&db, Setup::resources(text)).await;
    let limited = json!({"error": {"message": "Too many requests", "type": "requests"}});
    mock.script(
        Script::any()
            .model("m1")
            .header("retry-after", "120")
            .error(429, limited.clone()),
    );
    mock.script(
        Script::any()
            .model("m2")
            .header("retry-after", "30")
            .error(429, limited.clone()),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-aigw-error-source"], "upstream");
    assert_eq!(r.headers()["retry-after"], "120");
    assert_eq!(r.headers()["x-should-retry"], "false", "a wait over 60 s");
    assert_eq!(r.json::<Value>().await.unwrap(), limited, "the body as is");
    // A wait of a minute or less is the SDK's to sit out.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m2")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "30");
    assert!(!r.headers().contains_key("x-should-retry"));
    app.stop().await;
}

/// groot ADR 0008: "a run with one route gets one retry". Routes are counted as they can serve
/// now: a model with two credentials, one of them parked, has one route, and its 5xx is retried.
async fn the_single_retry_counts_only_credentials_that_can_serve_now(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[
        ("one", &url, "cred-one", r#"["m1"]"#, ""),
        ("two", &url, "cred-two", r#"["m1"]"#, ""),
    ]);
    let app = spawn_app(&db, quick_retry(text)).await;
    // `one` parks m1 for 120 s; `two` serves.
    let limited = json!({"error": {"message": "Too many requests", "type": "requests"}});
    mock.script(
        Script::any()
            .credential("cred-one")
            .times(1)
            .header("retry-after", "120")
            .error(429, limited),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    // Now `two` is the only credential that can serve m1: its plain 503 gets the one retry.
    mock.reset();
    let boom = json!({"error": {"message": "upstream exploded", "type": "server_error"}});
    mock.script(Script::any().credential("cred-two").times(1).error(503, boom));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200, "retried on the only credential that can serve");
    assert_eq!(credentials_called(&mock), ["cred-two", "cred-two"]);
    let log = &app.logs("acme", 1).await[0];
    let detail: Value = serde_json::from_str(&log.attempts_detail).unwrap();
    assert_eq!(detail[0]["rule"], "single_candidate_retry", "{detail}");
    app.stop().await;
}

/// Seed 000 holds a 500–504 for 30 s, and the single retry's pause is no exception: another
/// request arriving while the retry waits is not sent to the failing route. The retry is the
/// request's own next try; when it serves, the hold is lifted.
async fn a_5xx_is_held_while_its_retry_waits(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[("solo", &url, "cred-solo", r#"["m1"]"#, "")]);
    let setup = Setup {
        settings: Box::new(|s| {
            s.single_candidate_retry_min_ms = 500;
            s.single_candidate_retry_max_ms = 500;
        }),
        ..Setup::resources(text)
    };
    let app = spawn_app(&db, setup).await;
    let boom = json!({"error": {"message": "upstream exploded", "type": "server_error"}});
    mock.script(Script::any().times(1).error(503, boom));
    let body = chat("m1");
    let first = app.post_json("/v1/chat/completions", KEY, &body);
    let meanwhile = async {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while mock.call_count() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the first request never went out"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        app.post_json("/v1/chat/completions", KEY, &chat("m1")).await
    };
    let (first, meanwhile) = tokio::join!(first, meanwhile);
    assert_eq!(first.status(), 200, "the retry served");
    assert_eq!(meanwhile.status(), 429, "held while the retry waited");
    let body: Value = meanwhile.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
    assert_eq!(body["error"]["retry_after"], 30);
    assert_eq!(mock.call_count(), 2, "the failure and its retry, nothing else");
    // The retry's success lifted the hold.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock.call_count(), 3);
    app.stop().await;
}
