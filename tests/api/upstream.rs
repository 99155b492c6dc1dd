//! The credential pool end to end: classified failures park exactly what failed for exactly as
//! long, and a parked pool answers `upstream_quota_exhausted` without calling upstream.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{Setup, TestApp, TestDb, spawn_app};
use crate::proxy::KEY;

/// Two credentials serving `m1` (no fallback), and `m2` with a fallback `m3` on the same pair.
fn pool(mock: &MockUpstream) -> String {
    let url = mock.base_url();
    format!(
        r#"
[[workspace]]
name = "acme"
[[member]]
workspace = "acme"
email = "ada@acme.test"
role = "member"
[[api_key]]
member = "ada@acme.test"
name = "ci"
key = "{KEY}"
[[upstream]]
workspace = "acme"
name = "one"
provider = "openai-compatible"
base_url = "{url}"
api_key = "cred-one"
models = ["m1", "m2", "m3"]
priority = 0
[[upstream]]
workspace = "acme"
name = "two"
provider = "openai-compatible"
base_url = "{url}"
api_key = "cred-two"
models = ["m1", "m2"]
priority = 1
[[model]]
workspace = "acme"
name = "m2"
fallbacks = ["m3"]
"#
    )
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

async fn start(db: &TestDb) -> (TestApp, MockUpstream) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(db, Setup::resources(pool(&mock))).await;
    (app, mock)
}

both_backends!(
    parked_pool_answers_upstream_quota_exhausted,
    request_errors_lock_nothing,
    fallback_model_serves_when_the_first_is_parked,
    spend_cap_holds_the_credential_for_every_model,
);

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
    use aigw::store::{UpstreamStore, WorkspaceStore};
    let mock = MockUpstream::start().await.unwrap();
    let admin = "\n[[member]]\nworkspace = \"acme\"\nemail = \"boss@acme.test\"\nrole = \"admin\"\npassword = \"boss-password-1\"\n";
    let app = spawn_app(&db, Setup::resources(pool(&mock) + admin)).await;
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
    let ws = app.state.store.workspace_by_name("acme").await.unwrap().unwrap();
    let one = app
        .state
        .store
        .upstream_by_name(ws.id, "one")
        .await
        .unwrap()
        .unwrap();
    let login: Value = app
        .client
        .post(format!("{}/admin/v1/auth/login", app.address))
        .json(&json!({"email": "boss@acme.test", "password": "boss-password-1"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = login["token"].as_str().unwrap().to_owned();
    let url = format!("{}/admin/v1/upstreams/{}", app.address, one.id);
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
    let r = app
        .client
        .get(format!("{}/admin/v1/upstreams/99999", app.address))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        app.get(&format!("/admin/v1/upstreams/{}", one.id)).await.status(),
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
