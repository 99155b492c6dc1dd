//! The credential pool end to end: classified failures park exactly what failed for exactly as
//! long, and a parked pool answers `upstream_quota_exhausted` without calling upstream.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, spawn_app, spawn_on_mock};
use crate::proxy::KEY;

/// Two credentials serving `m1` (no fallback), and `m2` with a fallback `m3` on the same pair.
fn pool(mock: &MockUpstream) -> String {
    let url = &mock.base_url();
    ResourcesBuilder::acme(KEY)
        .upstream("acme", "one", url, "cred-one", &["m1", "m2", "m3"])
        .with("priority", 0)
        .upstream("acme", "two", url, "cred-two", &["m1", "m2"])
        .with("priority", 1)
        .model("acme", "m2")
        .with("fallbacks", vec!["m3"])
        .into()
}

pub(crate) use crate::helpers::chat;

/// `boss@acme.test`, an admin of acme who signs in.
fn admin_boss() -> String {
    ResourcesBuilder::new()
        .member_with_password("acme", "boss@acme.test", "admin", "boss-password-1")
        .into()
}

async fn start(db: &TestDb) -> (TestApp, MockUpstream) {
    spawn_on_mock(db, pool).await
}

both_backends!(
    parked_pool_answers_upstream_quota_exhausted,
    a_wait_under_a_second_apart_is_named_exactly_in_retry_after_ms,
    request_errors_lock_nothing,
    fallback_model_serves_when_the_first_is_parked,
    spend_cap_holds_the_credential_for_every_model,
);

/// The gateway knows when the earliest lock ends to the millisecond: `retry-after-ms` says so
/// exactly, `Retry-After` and the body round it up to whole seconds.
async fn a_wait_under_a_second_apart_is_named_exactly_in_retry_after_ms(db: TestDb) {
    let (app, mock) = start(&db).await;
    let limited = json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}});
    for (cred, ms) in [("cred-one", "7750"), ("cred-two", "9100")] {
        mock.script(
            Script::any()
                .credential(cred)
                .header("retry-after-ms", ms)
                .error(429, limited.clone()),
        );
    }
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-aigw-error-source"], "upstream");

    // The manual clock stands still: the earliest lock ends in exactly 7,750 ms.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
    assert_eq!(r.headers()["retry-after-ms"], "7750");
    assert_eq!(r.headers()["retry-after"], "8");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted");
    assert_eq!(body["error"]["retry_after"], 8);

    app.clock.advance(chrono::Duration::milliseconds(7_000));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.headers()["retry-after-ms"], "750", "what is left of the wait");
    assert_eq!(r.headers()["retry-after"], "1");
    app.stop().await;
}

async fn parked_pool_answers_upstream_quota_exhausted(db: TestDb) {
    let (app, mock) = start(&db).await;
    let limited = json!({"error": {"message": "Rate limit exceeded", "type": "rate_limit_error"}});
    mock.script(
        Script::any()
            .credential("cred-one")
            .header("retry-after", "120")
            .error(429, limited.clone()),
    );
    let second = json!({"error": {"message": "rate limit exceeded, slow down", "type": "requests"}});
    mock.script(Script::any().credential("cred-two").error(429, second.clone()));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-aigw-error-source"], "upstream");
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        second,
        "the last credential's error, as is"
    );
    assert_eq!(mock.call_count(), 2);

    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.headers()["retry-after"],
        "90",
        "the earliest lock: 90 s rate-limit wording, not 120 s"
    );
    assert_eq!(r.headers()["x-should-retry"], "false", "a wait over 60 s");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted");
    assert_eq!(
        body["error"]["message"],
        "all upstream credentials for this model are rate limited"
    );
    assert_eq!(body["error"]["retry_after"], 90);
    assert_eq!(mock.call_count(), 2, "nothing was sent upstream");
    // Another model on the same credentials is not parked.
    mock.reset();
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m2"))
            .await
            .status(),
        200
    );
    app.stop().await;

    // A restart parks exactly what was parked.
    let mock2 = MockUpstream::start().await.unwrap();
    let app = spawn_app(
        &db,
        Setup::resources(pool(&mock).replace(&mock.base_url(), &mock2.base_url())),
    )
    .await;
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(mock2.call_count(), 0);
    // After 90 s the second credential is back; the first stays parked until 120 s.
    app.clock.advance(chrono::Duration::seconds(91));
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status(),
        200
    );
    assert_eq!(mock2.calls()[0].credential.as_deref(), Some("cred-two"));
    app.stop().await;
}

async fn request_errors_lock_nothing(db: TestDb) {
    let (app, mock) = start(&db).await;
    let bad =
        json!({"error": {"message": "Invalid value for 'temperature'", "type": "invalid_request_error"}});
    mock.script(
        Script::any()
            .credential("cred-one")
            .times(1)
            .error(400, bad.clone()),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap(), bad);
    assert_eq!(
        mock.call_count(),
        1,
        "the other credential is not tried for a request error"
    );
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status(),
        200
    );
    assert_eq!(
        mock.calls()[1].credential.as_deref(),
        Some("cred-one"),
        "and nothing was locked"
    );
    app.stop().await;
}

async fn fallback_model_serves_when_the_first_is_parked(db: TestDb) {
    let (app, mock) = start(&db).await;
    mock.script(
        Script::any()
            .model("m2")
            .header("retry-after", "300")
            .error(429, json!({"error": {"message": "Too Many Requests"}})),
    );
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m2"))
            .await
            .status(),
        200,
        "m3 served"
    );
    let before = mock.call_count();
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m2")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        mock.call_count(),
        before + 1,
        "the parked m2 credentials are skipped"
    );
    assert_eq!(mock.calls().last().unwrap().model.as_deref(), Some("m3"));
    app.stop().await;
}

async fn spend_cap_holds_the_credential_for_every_model(db: TestDb) {
    let (app, mock) = start(&db).await;
    let cap = json!({"type": "error", "error": {"type": "invalid_request_error",
        "message": "You have reached your specified API usage limits. You will regain access on 2026-12-20 at 00:00 UTC."}});
    mock.script(Script::any().credential("cred-one").times(1).error(400, cap));
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status(),
        200,
        "two took over"
    );
    mock.reset();
    // m3 is served by "one" only: held for every model, so nothing remains.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m3")).await;
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted");
    let until = chrono::DateTime::parse_from_rfc3339("2026-12-20T00:00:00Z").unwrap();
    let want = (until.timestamp() - app.clock.now().timestamp()) as u64;
    assert_eq!(
        body["error"]["retry_after"].as_u64(),
        Some(want),
        "held until the named date"
    );
    assert_eq!(mock.call_count(), 0);
    app.stop().await;
}

both_backends!(admins_see_locks_and_a_connection_test_clears_them);

async fn admins_see_locks_and_a_connection_test_clears_them(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(pool(&mock) + &admin_boss())).await;
    mock.script(
        Script::any()
            .header("retry-after", "120")
            .error(429, json!({"error": {"message": "slow down"}})),
    );
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status(),
        429
    );
    let one = app.credential_id("one").await;
    let token = app.login("boss@acme.test", "boss-password-1").await;
    let url = format!("{}/admin/v1/upstreams/{}", app.address, one);
    let r = app.client.get(&url).bearer_auth(&token).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(!text.contains("cred-one"), "the secret is never returned");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["locks"][0]["target"], "m1");
    assert_eq!(body["locks"][0]["rule"], "provider_named_reset");
    assert_eq!(body["locks"][0]["seconds_left"], 120);
    assert_eq!(body["resumes_at"], "2026-12-01T02:02:00+00:00");
    // The mock recovers; the connection test passes and clears the lock.
    mock.reset();
    let r = app
        .client
        .post(format!("{url}/test"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["ok"], true, "{body}");
    assert_eq!(mock.calls()[0].credential.as_deref(), Some("cred-one"));
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
    assert_eq!(body["locks"], json!([]));
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status(),
        200
    );
    // Unknown ids and unauthenticated calls are refused.
    let r = app.get_as("/admin/v1/upstreams/99999", &token).await;
    assert_eq!(r.status(), 404);
    assert_eq!(
        app.get(&format!("/admin/v1/upstreams/{}", one)).await.status(),
        401
    );
    app.stop().await;
}

both_backends!(a_new_secret_clears_model_locks_not_account_holds);

async fn a_new_secret_clears_model_locks_not_account_holds(db: TestDb) {
    let (app, mock) = start(&db).await;
    // "two" gets a per-model lock on m1; "one" a hold on the whole credential.
    let cap = json!({"type": "error", "error": {"type": "invalid_request_error",
        "message": "You have reached your specified API usage limits. You will regain access on 2026-12-20 at 00:00 UTC."}});
    mock.script(Script::any().credential("cred-one").times(1).error(400, cap));
    mock.script(
        Script::any()
            .credential("cred-two")
            .times(1)
            .header("retry-after", "600")
            .error(429, json!({"error": {"message": "x"}})),
    );
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status(),
        429
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "upstream_quota_exhausted"
    );
    app.stop().await;
    // Both secrets change in the resources file.
    let text = pool(&mock)
        .replace("cred-one", "cred-one-new")
        .replace("cred-two", "cred-two-new");
    let app = spawn_app(&db, Setup::resources(text)).await;
    mock.reset();
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status(),
        200
    );
    let calls = mock.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].credential.as_deref(),
        Some("cred-two-new"),
        "the model lock was cleared; the account hold was not"
    );
    app.stop().await;
}

both_backends!(a_new_secret_resets_the_backoff_on_every_gateway);

/// kRouter: editing a credential's secret clears its per-model locks and its backoff level (not
/// its account holds), on every gateway of the database, not only the one that took the edit.
async fn a_new_secret_resets_the_backoff_on_every_gateway(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let text = pool_of(&[("solo", &mock.base_url(), "cred-solo", r#"["m1"]"#, "")]) + &admin_boss();
    let a = spawn_app(&db, Setup::resources(text.clone())).await;
    let b = spawn_app(&db, Setup::resources(text)).await;
    let solo = a.credential_id("solo").await;
    let token: Value = a
        .client
        .post(format!("{}/admin/v1/auth/login", a.address))
        .json(&json!({"email": "boss@acme.test", "password": "boss-password-1"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = token["token"].as_str().unwrap().to_owned();
    let upstream = |app: &TestApp| {
        let req = app
            .client
            .get(format!("{}/admin/v1/upstreams/{solo}", app.address))
            .bearer_auth(&token);
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    // Both gateways' clocks move together (they share the locks).
    let advance = |secs: i64| {
        a.clock.advance(chrono::Duration::seconds(secs));
        b.clock.advance(chrono::Duration::seconds(secs));
    };
    let overloaded = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    mock.script(Script::any().error(529, overloaded));
    // kRouter rule 5: overloads in a row back off 2, 4, 8 s: level 3 through `a`, 2 through `b`
    // (each gateway keeps its own level); the last one leaves m1 parked for 4 s.
    for (app, wait) in [(&a, 2), (&a, 4), (&a, 8), (&b, 2), (&b, 0)] {
        let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
        assert_eq!(r.status(), 529);
        advance(wait);
    }
    assert_eq!(mock.call_count(), 5);
    assert_eq!(upstream(&a).await["backoff_level"], 3);
    assert_eq!(upstream(&b).await["backoff_level"], 2);
    // `b` persists its lock off the request path: have it written, or it could land after the
    // edit cleared the store's locks and come back with `b`'s reload.
    b.sync().await;
    let persisted = aigw::upstream::pool::locks::Locks::default();
    let now_ms = b.clock.now_ms();
    persisted.load(&b.state.store, now_ms, true).await.unwrap();
    assert!(!persisted.of(solo, now_ms).is_empty(), "`b`'s lock is stored");
    // The secret is edited through `a`.
    let r = a
        .client
        .patch(format!("{}/admin/v1/upstreams/{solo}", a.address))
        .bearer_auth(&token)
        .json(&json!({"api_key": "cred-solo-new"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let after = upstream(&a).await;
    assert_eq!(after["backoff_level"], 0, "{after}");
    assert_eq!(after["locks"], json!([]), "the per-model lock is cleared");
    // `b` learns of the edit through the configuration epoch.
    a.sync().await;
    b.sync().await;
    let seen = upstream(&b).await;
    assert_eq!(seen["backoff_level"], 0, "`b` kept the backoff: {seen}");
    assert_eq!(seen["locks"], json!([]), "`b` kept the lock: {seen}");
    // The next overload parks 2 s again, not 16 s (through `a`) or 8 s (through `b`).
    for app in [&a, &b] {
        let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
        assert_eq!(r.status(), 529, "sent with the new secret, nothing parked");
        assert_eq!(
            mock.calls().last().unwrap().credential.as_deref(),
            Some("cred-solo-new")
        );
        let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
        assert_eq!(body["error"]["retry_after"], 2, "backoff from level 0: {body}");
        advance(2);
    }
    assert_eq!(mock.call_count(), 7);
    a.stop().await;
    b.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Own limits, in-flight slots, corroboration and the single-candidate retry.

/// A second gateway key of the same member (groot ADR 0008 corroboration counts members).
const OTHER_KEY: &str = "sk-aigw-OtherPoolKey0123456789abcdefghij";

/// A workspace with the two keys and the given `[[upstream]]` blocks, each written as
/// (name, base URL, secret, models, extra TOML lines).
pub(crate) fn pool_of(upstreams: &[(&str, &str, &str, &str, &str)]) -> String {
    let mut text = String::from(ResourcesBuilder::acme(KEY).api_key("ada@acme.test", "other", OTHER_KEY));
    for (i, (name, url, secret, models, extra)) in upstreams.iter().enumerate() {
        text.push_str(&format!(
            "[[upstream]]\nworkspace = \"acme\"\nname = \"{name}\"\nprovider = \"openai-compatible\"\n\
             base_url = \"{url}\"\napi_key = \"{secret}\"\nmodels = {models}\npriority = {i}\n{extra}\n"
        ));
    }
    text
}

pub(crate) fn credentials_called(mock: &MockUpstream) -> Vec<String> {
    mock.calls()
        .into_iter()
        .map(|c| c.credential.unwrap_or_default())
        .collect()
}

both_backends!(
    own_limits_skip_a_credential_until_its_window_rolls_over,
    a_pool_at_its_own_limits_answers_like_a_parked_one,
    own_token_limits_count_after_completion,
    replicas_share_a_credentials_own_limits,
);

/// Two gateways on one database send a credential no more than its own limit between them:
/// each counts what the other flushed.
async fn replicas_share_a_credentials_own_limits(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let limits = "limits = { requests_per_minute = 4 }";
    let text = pool_of(&[("solo", &url, "cred-solo", r#"["m1"]"#, limits)]);
    // Only the explicit flushes below run while the test does, so it does not depend on timing.
    let slow = |s: &mut aigw::Settings| s.flush_interval_ms = 60_000;
    let a = spawn_app(
        &db,
        Setup {
            settings: Box::new(slow),
            ..Setup::resources(text.clone())
        },
    )
    .await;
    let b = spawn_app(
        &db,
        Setup {
            settings: Box::new(slow),
            ..Setup::resources(text)
        },
    )
    .await;
    let mut sent = 0;
    for i in 0..8 {
        let app = if i % 2 == 0 { &a } else { &b };
        let status = app
            .post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status();
        if status == 200 {
            sent += 1;
        } else {
            assert_eq!(status, 429, "request {i}");
        }
        // Both gateways flush twice before the next request: what the flush task does within two
        // intervals (docs/upstreams.md), explicit here.
        for g in [&a, &b, &a, &b] {
            g.state
                .admission
                .flush(&g.state.store, g.clock.now_ms())
                .await
                .unwrap();
        }
    }
    assert_eq!(sent, 4, "4 requests/minute between both gateways, not 4 each");
    assert_eq!(mock.call_count(), 4);
    // The next UTC minute gives the credential its requests back, on either gateway.
    for g in [&a, &b] {
        g.clock.advance(chrono::Duration::seconds(60));
    }
    let r = b.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    a.stop().await;
    b.stop().await;
}

async fn own_limits_skip_a_credential_until_its_window_rolls_over(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[
        (
            "one",
            &url,
            "cred-one",
            r#"["m1"]"#,
            "limits = { requests_per_minute = 2 }",
        ),
        ("two", &url, "cred-two", r#"["m1"]"#, ""),
    ]);
    let app = spawn_app(&db, Setup::resources(text)).await;
    for _ in 0..3 {
        let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(
        credentials_called(&mock),
        ["cred-one", "cred-one", "cred-two"],
        "the third request skips `one`, whose 2 requests/minute are used"
    );
    // The next UTC minute gives `one` its requests back.
    app.clock.advance(chrono::Duration::seconds(60));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock.calls()[3].credential.as_deref(), Some("cred-one"));
    app.stop().await;
}

async fn a_pool_at_its_own_limits_answers_like_a_parked_one(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let limits = "limits = { requests_per_minute = 1, requests_per_day = 3 }";
    let text = pool_of(&[("solo", &url, "cred-solo", r#"["m1"]"#, limits)]);
    let app = spawn_app(&db, Setup::resources(text)).await;
    // The clock starts at 02:00:00 UTC: the minute rolls over in 60 s.
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status(),
        200
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "60");
    assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
    assert!(
        !r.headers().contains_key("x-should-retry"),
        "a wait of 60 s is the SDK's to wait out"
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted");
    assert_eq!(body["error"]["retry_after"], 60);
    assert_eq!(mock.call_count(), 1, "nothing was sent upstream");
    for _ in 0..2 {
        app.clock.advance(chrono::Duration::seconds(60));
        assert_eq!(
            app.post_json("/v1/chat/completions", KEY, &chat("m1"))
                .await
                .status(),
            200
        );
    }
    // 3 requests today: the day's limit holds until 00:00 UTC (now 02:02:00).
    app.clock.advance(chrono::Duration::seconds(60));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-should-retry"], "false");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["retry_after"], 22 * 3600 - 3 * 60);
    assert_eq!(mock.call_count(), 3);
    app.clock.advance(chrono::Duration::seconds(22 * 3600 - 3 * 60));
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status(),
        200,
        "a new UTC day"
    );
    app.stop().await;
}

async fn own_token_limits_count_after_completion(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    // The mock reports 1 prompt token for "hi" and 5 completion tokens: 6 a request.
    let limits = "limits = { tokens_per_minute = 10 }";
    let text = pool_of(&[
        ("one", &url, "cred-one", r#"["m1"]"#, limits),
        ("two", &url, "cred-two", r#"["m1"]"#, ""),
    ]);
    let app = spawn_app(&db, Setup::resources(text)).await;
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status(),
        200
    );
    // A streamed request counts its tokens when the stream ends.
    let stream = json!({"model": "m1", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let r = app.post_json("/v1/chat/completions", KEY, &stream).await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("[DONE]"));
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status(),
        200
    );
    assert_eq!(
        credentials_called(&mock),
        ["cred-one", "cred-one", "cred-two"],
        "12 tokens this minute: `one` is skipped (the request that crossed 10 completed)"
    );
    app.stop().await;
}

both_backends!(
    a_credential_without_a_free_slot_is_skipped_until_the_stream_ends,
    a_full_pool_waits_briefly_for_a_slot_then_answers_busy,
);

async fn a_credential_without_a_free_slot_is_skipped_until_the_stream_ends(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[
        ("one", &url, "cred-one", r#"["m1"]"#, "max_in_flight = 1"),
        ("two", &url, "cred-two", r#"["m1"]"#, "max_in_flight = 1"),
    ]);
    let app = spawn_app(&db, Setup::resources(text)).await;
    let one = app.credential_id("one").await;
    mock.script(
        Script::any()
            .credential("cred-one")
            .times(1)
            .chunk_delay(300)
            .words(50),
    );
    let stream = json!({"model": "m1", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let slow = app.post_json("/v1/chat/completions", KEY, &stream).await;
    assert_eq!(slow.status(), 200);
    assert_eq!(app.state.admission.in_flight(one), 1, "the stream holds its slot");
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        credentials_called(&mock),
        ["cred-one", "cred-two"],
        "`one` has no free slot: skipped, not waited for"
    );
    // The client goes away mid-stream: the slot is freed with the stream.
    drop(slow);
    app.until_in_flight(one, 0).await;
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock.calls()[2].credential.as_deref(), Some("cred-one"));
    // A stream read to its end frees the slot too.
    let r = app.post_json("/v1/chat/completions", KEY, &stream).await;
    assert!(r.text().await.unwrap().contains("[DONE]"));
    assert_eq!(app.state.admission.in_flight(one), 0);
    app.stop().await;
}

async fn a_full_pool_waits_briefly_for_a_slot_then_answers_busy(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[("solo", &url, "cred-solo", r#"["m1"]"#, "max_in_flight = 1")]);
    let setup = Setup {
        settings: Box::new(|s| s.slot_wait_ms = 400),
        ..Setup::resources(text)
    };
    let app = spawn_app(&db, setup).await;
    let solo = app.credential_id("solo").await;
    let slow = |ms| Script {
        delay_ms: Some(ms),
        ..Script::any().times(1)
    };
    let send = |app: &TestApp| {
        let (client, url) = (app.client.clone(), format!("{}/v1/chat/completions", app.address));
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(KEY)
                .json(&chat("m1"))
                .send()
                .await
                .unwrap()
        })
    };
    // A slot that frees within the wait serves the waiting request.
    mock.script(slow(100));
    let first = send(&app);
    app.until_in_flight(solo, 1).await;
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200, "waited for the slot");
    assert_eq!(first.await.unwrap().status(), 200);
    assert_eq!(mock.call_count(), 2);
    // A slot that stays taken: "credential busy", a 2 s backoff, and a parked pool's answer.
    mock.script(slow(1500));
    let first = send(&app);
    app.until_in_flight(solo, 1).await;
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "2");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted");
    let log = app
        .logs("acme", 3)
        .await
        .into_iter()
        .find(|l| l.status == 429)
        .unwrap();
    let detail: Value = serde_json::from_str(&log.attempts_detail).unwrap();
    assert_eq!(detail[0]["rule"], "backoff", "{detail}");
    assert!(detail[0]["error"].as_str().unwrap().contains("credential busy"));
    assert_eq!(first.await.unwrap().status(), 200);
    assert_eq!(mock.call_count(), 3, "the busy request was not sent");
    // The busy backoff ends after 2 s.
    app.clock.advance(chrono::Duration::seconds(2));
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat("m1"))
            .await
            .status(),
        200
    );
    app.stop().await;
}

/// A second member, Bob, with one key: corroboration counts members, not keys.
pub(crate) const BOB_KEY: &str = "sk-aigw-BobPoolKey0123456789abcdefghijkl";

pub(crate) fn with_bob(text: String) -> String {
    text + &String::from(
        ResourcesBuilder::new()
            .member("acme", "bob@acme.test", "member")
            .api_key("bob@acme.test", "ci", BOB_KEY),
    )
}

/// No rate-limit headers, no provider marker, no error_type: groot's "ambiguous" 429.
pub(crate) fn ambiguous_429() -> Value {
    json!({"error": {"message": "Too Many Requests", "code": 429}})
}

both_backends!(
    an_ambiguous_429_closes_the_quota_group_for_the_request,
    corroboration_counts_members_not_keys,
);

async fn an_ambiguous_429_closes_the_quota_group_for_the_request(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let group = "quota_group = \"acct\"";
    // `one` and `two` share the account `acct`; `three` is off it. `m2` falls back to `m3`,
    // served only by `two` (on the shared quota), then to `m4`, served only by `three`.
    let text = pool_of(&[
        ("one", &url, "cred-one", r#"["m1", "m2", "m5", "m6"]"#, group),
        (
            "two",
            &url,
            "cred-two",
            r#"["m1", "m3", "m5", "m6", "m7"]"#,
            group,
        ),
        ("three", &url, "cred-three", r#"["m1", "m4", "m7"]"#, ""),
    ]) + &String::from(
        ResourcesBuilder::new()
            .model("acme", "m2")
            .with("fallbacks", vec!["m3", "m4"])
            .model("acme", "m6")
            .with("fallbacks", vec!["m7"]),
    );
    let app = spawn_app(&db, Setup::resources(text)).await;
    mock.script(Script::any().credential("cred-one").error(429, ambiguous_429()));
    // groot ADR 0008: the walk skips every other route of the shared quota, and still moves to a
    // credential off it.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        credentials_called(&mock),
        ["cred-one", "cred-three"],
        "`two` was skipped"
    );
    // The same for the fallback chain: `m3` on `two` is on the shared quota, `m4` is not.
    mock.reset();
    mock.script(Script::any().credential("cred-one").error(429, ambiguous_429()));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m2")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(credentials_called(&mock), ["cred-one", "cred-three"]);
    assert_eq!(mock.calls()[1].model.as_deref(), Some("m4"));
    // Nothing off the group: the upstream's 429 comes back as is after one call.
    mock.reset();
    mock.script(Script::any().credential("cred-one").error(429, ambiguous_429()));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m5")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-aigw-error-source"], "upstream");
    assert_eq!(r.json::<Value>().await.unwrap(), ambiguous_429());
    assert_eq!(credentials_called(&mock), ["cred-one"]);
    // Only the route rests (not corroborated): the next request for m5 goes to `two`.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m5")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(credentials_called(&mock), ["cred-one", "cred-two"]);
    // An account-level 429 (groot: `error_type: rate_limit_exceeded`) closes the group's other
    // models too, not only the failed one: `m7` on `two` is skipped, `m7` on `three` serves.
    mock.reset();
    let account = json!({"error": {"message": "Too Many Requests", "error_type": "rate_limit_exceeded"}});
    mock.script(Script::any().credential("cred-one").error(429, account));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m6")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(credentials_called(&mock), ["cred-one", "cred-three"]);
    app.stop().await;
}

async fn corroboration_counts_members_not_keys(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let models = r#"["m1", "m2", "m3", "m4"]"#;
    let group = "quota_group = \"acct\"";
    let text = with_bob(pool_of(&[
        ("one", &url, "cred-one", models, group),
        ("two", &url, "cred-two", models, group),
    ]));
    let app = spawn_app(&db, Setup::resources(text)).await;
    mock.script(Script::any().credential("cred-one").error(429, ambiguous_429()));
    // Three ambiguous failures within 30 s from one member's two keys (k1, k1, k2).
    for (key, model) in [(KEY, "m1"), (KEY, "m2"), (OTHER_KEY, "m3")] {
        let r = app.post_json("/v1/chat/completions", key, &chat(model)).await;
        assert_eq!(r.status(), 429, "{model}");
        app.clock.advance(chrono::Duration::seconds(5));
    }
    assert_eq!(mock.call_count(), 3);
    // One member is one witness: only `one`'s route rests, `two` still serves m3.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m3")).await;
    assert_eq!(r.status(), 200, "the group was not rested by one member");
    assert_eq!(mock.calls()[3].credential.as_deref(), Some("cred-two"));
    // A failure from a second member within 30 s corroborates: the group rests on m4.
    let r = app.post_json("/v1/chat/completions", BOB_KEY, &chat("m4")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.json::<Value>().await.unwrap(), ambiguous_429());
    assert_eq!(mock.call_count(), 5);
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m4")).await;
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
    assert_eq!(body["error"]["retry_after"], 90, "the rate-limit wording's 90 s");
    assert_eq!(mock.call_count(), 5, "`two` rests with `one`: nothing sent");
    // The rest covers the group's whole quota: `two` no longer serves m3 either.
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m3")).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
    assert_eq!(mock.call_count(), 5);
    app.stop().await;
}

both_backends!(
    a_single_candidate_retries_a_5xx_once,
    a_single_candidate_retries_a_dropped_connection,
    the_single_retry_respects_the_attempt_and_time_budgets,
);

/// Settings with a short single-candidate retry pause (the default is 1 to 3 s).
pub(crate) fn quick_retry(text: String) -> Setup {
    Setup {
        settings: Box::new(|s| {
            s.single_candidate_retry_min_ms = 20;
            s.single_candidate_retry_max_ms = 40;
        }),
        ..Setup::resources(text)
    }
}

async fn a_single_candidate_retries_a_5xx_once(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[
        ("solo", &url, "cred-solo", r#"["m1"]"#, ""),
        ("one", &url, "cred-one", r#"["m2"]"#, ""),
        ("two", &url, "cred-two", r#"["m2"]"#, ""),
    ]);
    let app = spawn_app(&db, quick_retry(text)).await;
    let boom = json!({"error": {"message": "upstream exploded", "type": "server_error"}});
    // One 503, then success: the retry serves.
    mock.script(
        Script::any()
            .credential("cred-solo")
            .times(1)
            .error(503, boom.clone()),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(credentials_called(&mock), ["cred-solo", "cred-solo"]);
    let log = &app.logs("acme", 1).await[0];
    assert_eq!((log.status, log.attempts), (200, 2));
    let detail: Value = serde_json::from_str(&log.attempts_detail).unwrap();
    assert_eq!(detail[0]["status"], 503);
    assert_eq!(detail[0]["rule"], "single_candidate_retry");
    assert_eq!(
        detail[0]["lock_until"], "2026-12-01T02:00:30Z",
        "kRouter's 30 s hold, parked while the retry waited"
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200, "the retry's success lifted the hold");
    // Two 500s: one retry only, then the error as is, and the route is parked.
    mock.reset();
    mock.script(
        Script::any()
            .credential("cred-solo")
            .times(2)
            .error(500, boom.clone()),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 500);
    assert_eq!(r.json::<Value>().await.unwrap(), boom);
    assert_eq!(mock.call_count(), 2);
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "upstream_quota_exhausted"
    );
    // Two candidates: no retry of the same credential, the next one serves.
    mock.reset();
    mock.script(Script::any().credential("cred-one").times(1).error(503, boom));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m2")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(credentials_called(&mock), ["cred-one", "cred-two"]);
    app.stop().await;
}

/// A front for `target` that drops the first connection it accepts, before answering anything,
/// and relays every later one.
async fn drops_first_connection(target: std::net::SocketAddr) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut inbound, _)) = listener.accept().await {
            if std::mem::take(&mut first) {
                drop(inbound);
                continue;
            }
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    addr
}

async fn a_single_candidate_retries_a_dropped_connection(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let front = drops_first_connection(mock.addr()).await;
    let url = format!("http://{front}/v1");
    let text = pool_of(&[("solo", &url, "cred-solo", r#"["m1"]"#, "")]);
    let app = spawn_app(&db, quick_retry(text)).await;
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        mock.call_count(),
        1,
        "the dropped connection never reached the mock"
    );
    let log = &app.logs("acme", 1).await[0];
    assert_eq!(log.attempts, 2);
    let detail: Value = serde_json::from_str(&log.attempts_detail).unwrap();
    assert_eq!(detail[0]["rule"], "single_candidate_retry");
    assert!(detail[0]["error"].is_string(), "{detail}");
    app.stop().await;
}

async fn the_single_retry_respects_the_attempt_and_time_budgets(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let url = mock.base_url();
    let text = pool_of(&[("solo", &url, "cred-solo", r#"["m1"]"#, "")]);
    let boom = json!({"error": {"message": "upstream exploded"}});
    // One attempt per request: nothing left for a retry.
    let setup = Setup {
        settings: Box::new(|s| {
            s.max_attempts = 1;
            s.single_candidate_retry_min_ms = 20;
            s.single_candidate_retry_max_ms = 40;
        }),
        ..Setup::resources(text.clone())
    };
    let app = spawn_app(&db, setup).await;
    mock.script(Script::any().times(1).error(502, boom.clone()));
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 502);
    assert_eq!(mock.call_count(), 1);
    app.stop().await;
    // A pause longer than the time budget left: answered at once, not retried.
    let setup = Setup {
        settings: Box::new(|s| {
            s.request_timeout_secs = 1;
            s.single_candidate_retry_min_ms = 5_000;
            s.single_candidate_retry_max_ms = 5_000;
        }),
        ..Setup::resources(text)
    };
    let app = spawn_app(&db, setup).await;
    // A fresh clock: the 30 s lock of the 502 above has not ended; move past it.
    app.clock.advance(chrono::Duration::seconds(31));
    mock.reset();
    mock.script(Script::any().times(1).error(502, boom));
    let started = std::time::Instant::now();
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 502);
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(mock.call_count(), 1);
    app.stop().await;
}

/// Replicas see each other's locks through the configuration poll, with no restart and no
/// change of configuration: a credential parked through one gateway gets no traffic through the
/// other.
#[tokio::test]
async fn a_lock_reaches_the_other_gateway_through_the_poll() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let a = spawn_app(&db, Setup::resources(pool(&mock))).await;
    let b = spawn_app(
        &db,
        Setup {
            config_poll: Some(std::time::Duration::from_millis(50)),
            ..Setup::resources(pool(&mock))
        },
    )
    .await;
    let limited = json!({"error": {"message": "slow down"}});
    mock.script(Script::any().header("retry-after", "300").error(429, limited));
    let r = a.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(mock.call_count(), 2, "both credentials tried and parked");
    a.sync().await;
    // `b` is not synced: its own poll must bring the locks (every 50 ms here; 10 s at most).
    let ids = [b.credential_id("one").await, b.credential_id("two").await];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ids
        .iter()
        .any(|id| b.state.locks.of(*id, b.clock.now_ms()).is_empty())
    {
        assert!(std::time::Instant::now() < deadline, "`b` never read `a`'s locks");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let r = b.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_quota_exhausted", "{body}");
    assert_eq!(mock.call_count(), 2, "nothing sent upstream by the other gateway");
    a.stop().await;
    b.stop().await;
}
