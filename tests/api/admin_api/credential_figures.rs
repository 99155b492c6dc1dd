//! What the console shows of a credential beyond its settings (issue 46): the provider's own
//! words, masked, in the request log's attempts and on the card of the credential they parked;
//! and each credential's figures over a day (attempts, failures, served, latency, time parked),
//! derived from the rollup the log writer adds and the recorded locks.

use aigw::mock_upstream::Script;

use super::*;

both_backends!(
    provider_words_reach_the_log_and_the_parked_card,
    figures_count_each_credential_and_its_time_parked,
);

/// acme with ada's key and two credentials on `mock`, tried in order.
fn two_credentials(mock: &MockUpstream) -> String {
    let url = &mock.base_url();
    ResourcesBuilder::new()
        .workspace("acme")
        .member_with_password("acme", "owner@acme.test", "owner", "pw-owner@acme.test")
        .member_with_password("acme", "ada@acme.test", "member", "pw-ada@acme.test")
        .api_key("ada@acme.test", "ci", KEY)
        .upstream(
            "acme",
            "primary",
            url,
            "cred-primary-0123456789",
            &["gpt-4o-mini"],
        )
        .with("priority", 0)
        .upstream("acme", "backup", url, "cred-backup-0123456789", &["gpt-4o-mini"])
        .with("priority", 1)
        .model("acme", "gpt-4o-mini")
        .into()
}

fn chat() -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
}

async fn upstream_named(admin: &Admin<'_>, token: &str, name: &str) -> Value {
    let list = admin.ok(Method::GET, "/admin/v1/upstreams", token, None).await;
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == name)
        .unwrap()
        .clone()
}

async fn provider_words_reach_the_log_and_the_parked_card(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(two_credentials(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    // The provider echoes the key it was given: the words are kept, the key masked.
    let said = json!({"error": {"message": "Rate limit reached for requests on key cred-primary-0123456789. Please retry in 2 minutes.",
        "type": "requests", "code": "rate_limit_exceeded"}});
    mock.script(
        Script::any()
            .credential("cred-primary-0123456789")
            .times(1)
            .header("retry-after", "120")
            .error(429, said),
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat()).await;
    assert_eq!(r.status(), 200, "the backup served");
    let request_id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    app.logs("acme", 1).await;
    app.sync().await;

    // The log's detail: the failed attempt with the provider's words.
    let log = admin
        .ok(Method::GET, &format!("/admin/v1/logs/{request_id}"), &owner, None)
        .await;
    let attempts: Value = serde_json::from_str(log["attempts_detail"].as_str().unwrap()).unwrap();
    let first = &attempts[0];
    assert_eq!(
        (&first["credential"], &first["status"]),
        (&json!("primary"), &json!(429))
    );
    let words = first["message"]
        .as_str()
        .expect("the provider's words are logged");
    assert!(
        words.starts_with("Rate limit reached for requests on key "),
        "{words}"
    );
    assert!(
        !words.contains("cred-primary-0123456789"),
        "the key is masked: {words}"
    );
    assert_eq!(attempts[1]["message"], Value::Null, "a success has no words");

    // The parked credential's card: its lock with the same words.
    let card = upstream_named(&admin, &owner, "primary").await;
    let lock = &card["locks"][0];
    assert_eq!(lock["message"].as_str(), Some(words), "{card}");
    let one = admin
        .ok(
            Method::GET,
            &format!("/admin/v1/upstreams/{}", card["id"]),
            &owner,
            None,
        )
        .await;
    assert_eq!(one["locks"][0]["message"].as_str(), Some(words));
    assert!(!card.to_string().contains("cred-primary-0123456789"));
    app.stop().await;
}

async fn figures_count_each_credential_and_its_time_parked(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(two_credentials(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    // Signed in afresh each time: the clock moves past a session's hour.
    let figures = async || {
        app.logs("acme", 0).await;
        app.sync().await;
        let owner = admin.login("owner@acme.test").await;
        let v = admin
            .ok(Method::GET, "/admin/v1/upstreams/figures", &owner, None)
            .await;
        let of = |name: &str| {
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["name"] == name)
                .unwrap()
                .clone()
        };
        (of("primary"), of("backup"))
    };
    // Nothing yet: every credential is listed, with no figures.
    let (primary, backup) = figures().await;
    assert_eq!(
        (&primary["attempts"], &primary["error_rate"]),
        (&json!(0), &Value::Null)
    );
    assert_eq!(backup["parked_seconds"], 0);

    // Two served by the primary; then one that fails over: the primary's 429 parks it 120 s.
    for _ in 0..2 {
        assert_eq!(
            app.post_json("/v1/chat/completions", KEY, &chat()).await.status(),
            200
        );
    }
    mock.script(
        Script::any()
            .credential("cred-primary-0123456789")
            .times(1)
            .header("retry-after", "120")
            .error(429, json!({"error": {"message": "slow down"}})),
    );
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat()).await.status(),
        200
    );
    app.logs("acme", 3).await;
    app.clock.advance(chrono::Duration::seconds(60));
    let (primary, backup) = figures().await;
    assert_eq!(
        (&primary["attempts"], &primary["failures"], &primary["served"]),
        (&json!(3), &json!(1), &json!(2)),
        "{primary}"
    );
    assert!((primary["error_rate"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9);
    assert_eq!(
        (&backup["attempts"], &backup["failures"], &backup["served"]),
        (&json!(1), &json!(0), &json!(1)),
        "{backup}"
    );
    assert!(primary["mean_latency_ms"].is_i64() && backup["mean_upstream_ms"].is_i64());
    assert_eq!(primary["parked_seconds"], 60, "parked for the minute that passed");
    assert_eq!(backup["parked_seconds"], 0);

    // A connection test ends the lock: the time parked stops there.
    let id = upstream_named(&admin, &owner, "primary").await["id"].clone();
    let test = admin
        .ok(
            Method::POST,
            &format!("/admin/v1/upstreams/{id}/test"),
            &owner,
            None,
        )
        .await;
    assert_eq!(test["cleared"], true, "{test}");
    app.clock.advance(chrono::Duration::seconds(30));
    let (primary, _) = figures().await;
    assert_eq!(primary["parked_seconds"], 60, "{primary}");

    // A day later the hours have left the figures.
    app.clock.advance(chrono::Duration::hours(25));
    let (primary, _) = figures().await;
    assert_eq!(
        (&primary["attempts"], &primary["parked_seconds"]),
        (&json!(0), &json!(0))
    );
    app.stop().await;
}
