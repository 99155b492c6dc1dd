//! Budget alerts (issue 25 item 1): a policy's thresholds fire once per window and subject, to a
//! webhook (a receiver inside the test), signed, retried from a persisted outbox, once across
//! replicas; set through the resources file and the admin API, listed in the alert history.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use aigw::mock_upstream::MockUpstream;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::Sha256;

use crate::both_backends;
use crate::helpers::{Setup, TestApp, TestDb, spawn_app, try_spawn_app};
use crate::proxy::{KEY, resources};

const SECRET: &str = "whsec-0123456789abcdef";
pub(crate) const OWNER: &str = "boss@acme.test";

/// A webhook receiver on 127.0.0.1: keeps every POST it gets, answers with `status`.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
    status: Arc<AtomicU16>,
}

impl Receiver {
    async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let got: Arc<Mutex<Vec<(HeaderMap, Bytes)>>> = Arc::default();
        let status = Arc::new(AtomicU16::new(200));
        let (g, s) = (got.clone(), status.clone());
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let (g, s) = (g.clone(), s.clone());
                async move {
                    g.lock().unwrap().push((headers, body));
                    StatusCode::from_u16(s.load(Ordering::SeqCst)).unwrap()
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { url, got, status }
    }

    fn answer(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    /// The bodies received so far.
    fn bodies(&self) -> Vec<Value> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| serde_json::from_slice(b).unwrap())
            .collect()
    }
}

/// The proxy suite's workspace with an owner who signs in, and `policy` (TOML) appended.
pub(crate) fn setup(mock: &MockUpstream, policy: &str) -> String {
    resources(mock)
        + &format!(
            "\n[[member]]\nworkspace = \"acme\"\nemail = \"{OWNER}\"\nrole = \"owner\"\npassword = \"boss-password\"\n"
        )
        + policy
}

/// A start with `text` whose webhooks may reach the receivers on 127.0.0.1.
fn loopback(text: String) -> Setup {
    Setup {
        settings: Box::new(allow_loopback),
        ..Setup::resources(text)
    }
}

fn allow_loopback(s: &mut aigw::Settings) {
    s.alert_webhook_allow = vec!["127.0.0.1".parse().unwrap()];
}

pub(crate) fn alert_policy(subject: &str, target: &str, metric: &str, limit: u32, alerts: &str) -> String {
    format!(
        "\n[[policy]]\nworkspace = \"acme\"\nsubject = \"{subject}\"\ntarget = \"{target}\"\nmetric = \"{metric}\"\nwindow = \"day\"\nlimit = {limit}\nalerts = {alerts}\n"
    )
}

pub(crate) fn chat() -> Value {
    // The mock counts 4 prompt words and answers 5: 9 tokens a request.
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "say hello to me"}]})
}

pub(crate) async fn call(
    app: &TestApp,
    method: Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = app
        .client
        .request(method, format!("{}{path}", app.address))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

pub(crate) async fn history(app: &TestApp) -> Vec<Value> {
    let token = app.login(OWNER, "boss-password").await;
    let (status, v) = call(app, Method::GET, "/admin/v1/alerts", &token, None).await;
    assert_eq!(status, 200, "{v}");
    v["data"].as_array().unwrap().clone()
}

both_backends!(
    each_threshold_fires_once_per_window_and_subject_signed,
    a_receiver_that_is_down_gets_the_alert_later_even_across_a_restart,
    two_replicas_fire_each_threshold_once,
    alert_settings_are_checked_and_the_secret_never_comes_back,
    the_resources_file_sets_alerts_idempotently,
);

async fn the_resources_file_sets_alerts_idempotently(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let with = |alerts: &str| setup(&mock, &alert_policy("ws", "acme", "requests", 10, alerts));
    let signed =
        format!("{{ at = [80, 100], webhook = \"https://hooks.example/a\", secret = \"{SECRET}\" }}");
    let app = spawn_app(&db, Setup::resources(with(&signed))).await;
    let apply = async |text: String| {
        aigw::resources::apply_text(
            &app.state.store,
            &app.state.master_key,
            "again.toml",
            &text,
            &|_| None,
            0,
        )
        .await
        .unwrap()
    };
    let shown = async || {
        app.sync().await;
        let owner = app.login(OWNER, "boss-password").await;
        let (_, v) = call(&app, Method::GET, "/admin/v1/policies", &owner, None).await;
        v["data"][0]["alerts"].clone()
    };
    assert_eq!(
        shown().await,
        json!({"at": [80, 100], "webhook": "https://hooks.example/a", "has_secret": true})
    );
    let again = apply(with(&signed)).await;
    assert_eq!(
        (again.created, again.updated),
        (0, 0),
        "the same file changes nothing: {again}"
    );
    let unsigned = apply(with("{ at = [90], webhook = \"https://hooks.example/a\" }")).await;
    assert_eq!(unsigned.updated, 1, "{unsigned}");
    assert_eq!(
        shown().await,
        json!({"at": [90], "webhook": "https://hooks.example/a", "has_secret": false})
    );
    let text = setup(
        &mock,
        &alert_policy(
            "ws",
            "acme",
            "requests",
            10,
            "{ at = [90], webhook = \"https://hooks.example/a\" }",
        ),
    );
    let without = apply(text.replace(
        "alerts = { at = [90], webhook = \"https://hooks.example/a\" }\n",
        "",
    ))
    .await;
    assert_eq!(without.updated, 1, "{without}");
    assert_eq!(shown().await, Value::Null, "the file's policy has no alerts now");
    app.stop().await;
}

async fn each_threshold_fires_once_per_window_and_subject_signed(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let hook = Receiver::start().await;
    let alerts = format!(
        "{{ at = [100, 50], webhook = \"{}\", secret = \"{SECRET}\" }}",
        hook.url
    );
    let policy = alert_policy("apikey", "ada@acme.test/ci", "total_tokens", 30, &alerts);
    let app = spawn_app(&db, loopback(setup(&mock, &policy))).await;
    let mut counts = Vec::new();
    for _ in 0..5 {
        // 9, 18, 27, 36 tokens; the fifth is refused and counts nothing.
        app.post_json("/v1/chat/completions", KEY, &chat()).await;
        app.sync().await;
        counts.push(hook.bodies().len());
    }
    assert_eq!(
        counts,
        [0, 1, 1, 2, 2],
        "50 % at 18 tokens, 100 % at 36, once each"
    );
    app.sync().await;
    assert_eq!(hook.bodies().len(), 2, "a later flush fires nothing again");

    let got = hook.got.lock().unwrap().clone();
    let (headers, raw) = &got[0];
    let body: Value = serde_json::from_slice(raw).unwrap();
    assert_eq!(body["workspace"], "acme");
    assert_eq!(body["subject"]["kind"], "apikey");
    assert_eq!(body["subject"]["name"], "ada@acme.test/ci");
    assert_eq!(
        (
            &body["metric"],
            &body["window"],
            &body["limit"],
            &body["used"],
            &body["threshold"]
        ),
        (
            &json!("total_tokens"),
            &json!("day"),
            &json!(30),
            &json!(18),
            &json!(50)
        )
    );
    assert_eq!(body["policy"]["target"], "ada@acme.test/ci");
    assert!(body["policy"]["id"].as_i64().is_some());
    // The day ends at 2026-12-02T00:00+08:00; reset_at is 60–120 s after, as in a refusal.
    let reset = body["reset_at"].as_str().unwrap();
    assert!(
        reset.starts_with("2026-12-02T00:0") && reset.ends_with("+08:00"),
        "{reset}"
    );
    assert_eq!(body["window_start"], "2026-12-01T00:00:00+08:00");
    assert_eq!(
        headers["x-aigw-alert-id"].to_str().unwrap(),
        body["id"].to_string()
    );
    assert_eq!(headers["content-type"], "application/json");
    // x-aigw-signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">.
    let sig = headers["x-aigw-signature"].to_str().unwrap();
    let (t, v1) = sig.strip_prefix("t=").and_then(|s| s.split_once(",v1=")).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(raw);
    mac.verify_slice(&hex::decode(v1).unwrap())
        .expect("a valid signature");
    assert_eq!(
        t.parse::<i64>().unwrap(),
        app.clock.now().timestamp(),
        "signed at the gateway's time"
    );
    assert_eq!(hook.bodies()[1]["threshold"], 100);
    assert_eq!(hook.bodies()[1]["used"], 36);

    // The next day is a new window: its thresholds fire again.
    app.clock.advance(chrono::Duration::days(1));
    for _ in 0..2 {
        assert_eq!(
            app.post_json("/v1/chat/completions", KEY, &chat()).await.status(),
            200
        );
        app.sync().await;
    }
    let bodies = hook.bodies();
    assert_eq!(bodies.len(), 3);
    assert_eq!(
        (&bodies[2]["threshold"], &bodies[2]["window_start"]),
        (&json!(50), &json!("2026-12-02T00:00:00+08:00"))
    );
    let listed = history(&app).await;
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[0]["id"], bodies[2]["id"], "newest first");
    for a in &listed {
        assert_eq!(
            (&a["status"], &a["attempts"]),
            (&json!("delivered"), &json!(1)),
            "{a}"
        );
        assert_eq!(a["last_status"], 200);
    }
    let text = app.get("/metrics").await.text().await.unwrap();
    assert!(text.contains("aigw_budget_alerts_total{event=\"delivered\"}"));
    app.stop().await;
}

async fn a_receiver_that_is_down_gets_the_alert_later_even_across_a_restart(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let hook = Receiver::start().await;
    hook.answer(503);
    let alerts = format!("{{ at = [100], webhook = \"{}\" }}", hook.url);
    let text = setup(
        &mock,
        &alert_policy("member", "ada@acme.test", "requests", 2, &alerts),
    );
    let app = spawn_app(&db, loopback(text.clone())).await;
    for _ in 0..2 {
        app.post_json("/v1/chat/completions", KEY, &chat()).await;
    }
    app.sync().await;
    assert_eq!(hook.bodies().len(), 1, "tried at once");
    let a = &history(&app).await[0];
    assert_eq!((&a["status"], &a["attempts"]), (&json!("pending"), &json!(1)));
    assert_eq!(a["last_status"], 503);
    assert!(a["last_error"].as_str().unwrap().contains("503"), "{a}");
    assert!(a["next_attempt_at"].is_string());
    app.sync().await;
    assert_eq!(hook.bodies().len(), 1, "the next try waits for its backoff");
    app.clock.advance(chrono::Duration::seconds(1));
    app.sync().await;
    assert_eq!(hook.bodies().len(), 2, "tried again after a second");
    let later = app.clock.now() + chrono::Duration::seconds(30);
    app.stop().await;

    // A new gateway on the same database finds the alert in the outbox and delivers it.
    hook.answer(204);
    let app = spawn_app(
        &db,
        Setup {
            start: later,
            ..loopback(text)
        },
    )
    .await;
    app.sync().await;
    let bodies = hook.bodies();
    assert_eq!(bodies.len(), 3);
    assert!(
        bodies.iter().all(|b| b["id"] == bodies[0]["id"]),
        "one alert, tried three times"
    );
    assert_eq!(bodies[2]["subject"]["name"], "ada@acme.test");
    let listed = history(&app).await;
    assert_eq!(listed.len(), 1, "fired once");
    assert_eq!(
        (&listed[0]["status"], &listed[0]["attempts"]),
        (&json!("delivered"), &json!(3))
    );
    assert_eq!(listed[0]["last_error"], Value::Null);
    app.sync().await;
    assert_eq!(hook.bodies().len(), 3, "a delivered alert is not sent again");
    app.stop().await;
}

async fn two_replicas_fire_each_threshold_once(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let hook = Receiver::start().await;
    let alerts = format!("{{ at = [50, 100], webhook = \"{}\" }}", hook.url);
    let text = setup(&mock, &alert_policy("ws", "acme", "requests", 4, &alerts));
    // Only the explicit syncs below flush, so the test does not depend on timing.
    let slow = |s: &mut aigw::Settings| {
        s.flush_interval_ms = 60_000;
        allow_loopback(s);
    };
    let start = |text: String| Setup {
        settings: Box::new(slow),
        ..Setup::resources(text)
    };
    let a = spawn_app(&db, start(text.clone())).await;
    let b = spawn_app(&db, start(text)).await;
    for round in 1..=2 {
        for g in [&a, &b] {
            assert_eq!(
                g.post_json("/v1/chat/completions", KEY, &chat()).await.status(),
                200
            );
        }
        // Each learns the other's count, and both see the threshold crossed.
        for g in [&a, &b, &a, &b] {
            g.sync().await;
        }
        assert_eq!(hook.bodies().len(), round, "round {round}");
    }
    let thresholds: Vec<Value> = hook.bodies().iter().map(|b| b["threshold"].clone()).collect();
    assert_eq!(thresholds, [json!(50), json!(100)]);
    assert_eq!(history(&b).await.len(), 2);
    a.stop().await;
    b.stop().await;
}

async fn alert_settings_are_checked_and_the_secret_never_comes_back(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    // A bad alert in the resources file stops the start, naming the entry and the field.
    let bad = alert_policy(
        "ws",
        "acme",
        "requests",
        4,
        "{ at = [0], webhook = \"https://h.example/x\" }",
    );
    let refused = try_spawn_app(&db, Setup::resources(setup(&mock, &bad)))
        .await
        .err()
        .expect("refused");
    assert!(refused.to_string().contains("[[policy]]"), "{refused}");
    assert!(refused.to_string().contains("alerts.at"), "{refused}");

    let app = spawn_app(&db, Setup::resources(setup(&mock, ""))).await;
    let owner = app.login(OWNER, "boss-password").await;
    let policy = |alerts: Value| json!({"subject": "ws", "metric": "requests", "window": "day", "limit": 10, "alerts": alerts});
    let hook = "https://hooks.example/aigw";
    let eleven: Vec<i64> = (1..=11).collect();
    #[rustfmt::skip]
    let cases = [
        (json!({"at": [], "webhook": hook}), 422, "alerts.at"),
        (json!({"at": [0], "webhook": hook}), 422, "alerts.at"),
        (json!({"at": [1001], "webhook": hook}), 422, "alerts.at"),
        (json!({"at": eleven, "webhook": hook}), 422, "alerts.at"),
        (json!({"at": [80], "webhook": "ftp://hooks.example/x"}), 422, "alerts.webhook"),
        (json!({"at": [80], "webhook": "not a url"}), 422, "alerts.webhook"),
        (json!({"at": [80], "webhook": "https://u:p@hooks.example/x"}), 422, "alerts.webhook"),
        (json!({"at": [80], "webhook": hook, "secret": "short"}), 422, "alerts.secret"),
        (json!({"at": ["80"], "webhook": hook}), 400, ""),
        (json!({"at": [80], "webhook": hook, "url": hook}), 400, ""),
        (json!({"at": [80]}), 400, ""),
        (json!({"at": [9_223_372_036_854_775_807_i64], "webhook": hook}), 422, "alerts.at"),
    ];
    for (alerts, status, param) in cases {
        let (got, v) = call(
            &app,
            Method::POST,
            "/admin/v1/policies",
            &owner,
            Some(policy(alerts.clone())),
        )
        .await;
        assert_eq!(got, status, "{alerts}: {v}");
        assert!(v["error"]["message"].is_string(), "{v}");
        if !param.is_empty() {
            assert_eq!(v["error"]["param"], param, "{alerts}: {v}");
        }
    }
    // A member sets no webhook.
    let ada_token = {
        let ada = app.member_id(&owner, "ada@acme.test").await;
        let (_, v) = call(
            &app,
            Method::POST,
            &format!("/admin/v1/members/{ada}/reset-password"),
            &owner,
            None,
        )
        .await;
        app.login("ada@acme.test", v["one_time_password"].as_str().unwrap())
            .await
    };
    let keys = call(&app, Method::GET, "/admin/v1/keys", &ada_token, None)
        .await
        .1;
    let key_id = keys["data"][0]["id"].clone();
    let (status, v) = call(
        &app,
        Method::POST,
        "/admin/v1/policies",
        &ada_token,
        Some(json!({
        "subject": "apikey", "target_id": key_id, "metric": "requests", "window": "day", "limit": 10,
        "alerts": {"at": [80], "webhook": hook}})),
    )
    .await;
    assert_eq!(status, 403, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("budget alerts"),
        "{v}"
    );

    // Created with a secret: shown as has_secret, never as the secret.
    let (status, created) = call(
        &app,
        Method::POST,
        "/admin/v1/policies",
        &owner,
        Some(policy(
            json!({"at": [100, 80, 80], "webhook": hook, "secret": SECRET}),
        )),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(
        created["alerts"],
        json!({"at": [80, 100], "webhook": hook, "has_secret": true})
    );
    let id = created["id"].as_i64().unwrap();
    let path = format!("/admin/v1/policies/{id}");
    // Changed without naming the secret: kept.
    let (_, v) = call(
        &app,
        Method::PATCH,
        &path,
        &owner,
        Some(json!({"alerts": {"at": [90], "webhook": hook}})),
    )
    .await;
    assert_eq!(
        v["alerts"],
        json!({"at": [90], "webhook": hook, "has_secret": true})
    );
    let (_, v) = call(&app, Method::PATCH, &path, &owner, Some(json!({"limit": 20}))).await;
    assert_eq!(
        v["alerts"]["at"],
        json!([90]),
        "a PATCH without alerts keeps them"
    );
    let (_, v) = call(
        &app,
        Method::PATCH,
        &path,
        &owner,
        Some(json!({"alerts": {"at": [90], "webhook": hook, "secret": null}})),
    )
    .await;
    assert_eq!(v["alerts"]["has_secret"], false);
    let (_, v) = call(&app, Method::PATCH, &path, &owner, Some(json!({"alerts": null}))).await;
    assert_eq!(v["alerts"], Value::Null);
    let (status, _) = call(
        &app,
        Method::PATCH,
        &path,
        &ada_token,
        Some(json!({"alerts": null})),
    )
    .await;
    assert_eq!(status, 404, "a member does not see the workspace's policy");
    for path in ["/admin/v1/policies", "/admin/v1/audit"] {
        let text = app.get_as(path, &owner).await.text().await.unwrap();
        assert!(!text.contains(SECRET), "{path} shows the secret");
    }
    // The history: bad filters and pages are 4xx, a member may not read it.
    for q in ["?limit=0", "?limit=x", "?cursor=x", "?policy_id=x", "?what=1"] {
        let (status, v) = call(&app, Method::GET, &format!("/admin/v1/alerts{q}"), &owner, None).await;
        assert!(status == 400 || status == 422, "{q}: {status} {v}");
    }
    let (status, _) = call(&app, Method::GET, "/admin/v1/alerts", &ada_token, None).await;
    assert_eq!(status, 403);
    let (status, _) = call(&app, Method::POST, "/admin/v1/alerts/999/retry", &owner, None).await;
    assert_eq!(status, 404);
    app.stop().await;
}

both_backends!(
    old_alerts_are_pruned_unless_pending_total_or_their_window_may_count,
    log_retention_prunes_the_alert_history,
);

async fn old_alerts_are_pruned_unless_pending_total_or_their_window_may_count(db: TestDb) {
    use aigw::store::{AlertAttempt, AlertStore, NewAlert, WorkspaceStore};

    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(setup(&mock, ""))).await;
    let store = &app.state.store;
    let ws = store.workspace_by_name("acme").await.unwrap().unwrap().id;
    // A day boundary well after the cutoff of the gateway's own retention task (30 days before
    // its clock), so that task, whose first prune may run at any time, leaves these rows alone.
    let cutoff = chrono::DateTime::parse_from_rfc3339("2026-11-25T00:00:00Z")
        .unwrap()
        .timestamp_millis();
    const H: i64 = 3_600_000;
    const D: i64 = 24 * H;
    // (case, window, its start and when it fired (ms from the cutoff), status, kept)
    #[rustfmt::skip]
    let cases: &[(&str, &str, i64, i64, &str, bool)] = &[
        ("old, delivered", "day", -5 * D - 2 * H, -5 * D, "delivered", false),
        ("old, given up", "5minutes", -5 * D - 60_000, -5 * D, "failed", false),
        ("old, still being retried", "day", -5 * D - 2 * H, -5 * D, "pending", true),
        ("recent", "day", -10 * H, -H, "delivered", true),
        ("fired at the cutoff", "day", -10 * H, 0, "delivered", true),
        ("a total window, never fires again", "total", 0, -40 * D, "delivered", true),
        ("a month that may still count", "month", -20 * D, -5 * D, "delivered", true),
        ("a month long over", "month", -40 * D, -10 * D, "delivered", false),
        ("a week that may still count", "week", -6 * D, -5 * D, "failed", true),
        ("a week long over", "week", -9 * D, -5 * D, "delivered", false),
    ];
    let mut ids = Vec::new();
    for (i, (case, window, start, fired, status, _)) in cases.iter().enumerate() {
        let now = cutoff + fired;
        let new = store
            .insert_alert(&NewAlert {
                workspace_id: ws,
                policy_id: 1000 + i as i64,
                subject: "ws",
                subject_id: ws,
                time_window: (*window).to_owned(),
                window_start: if *window == "total" {
                    0
                } else {
                    (cutoff + start) / 1000
                },
                threshold: 80,
                payload: "{}".to_owned(),
                now,
                give_up_at: now + D,
            })
            .await
            .unwrap();
        assert!(new, "{case}");
        let id = store
            .alert_page(ws, Some(1000 + i as i64), None, 1)
            .await
            .unwrap()[0]
            .id;
        let (error, next_attempt_at) = match *status {
            "delivered" => (None, None),
            "failed" => (Some("503 from the receiver"), None),
            _ => (Some("503 from the receiver"), Some(now + 60_000)),
        };
        store
            .record_alert_attempt(&AlertAttempt {
                id,
                status: Some(if error.is_some() { 503 } else { 200 }),
                error,
                now,
                next_attempt_at,
            })
            .await
            .unwrap();
        ids.push(id);
    }
    let deletable = cases.iter().filter(|c| !c.5).count() as u64;
    assert_eq!(
        store.prune_alerts_batch(cutoff, 2).await.unwrap(),
        2,
        "at most the batch"
    );
    let mut pruned = 2;
    loop {
        let n = store.prune_alerts_batch(cutoff, 2).await.unwrap();
        if n == 0 {
            break;
        }
        pruned += n;
    }
    assert_eq!(pruned, deletable);
    for ((case, .., kept), id) in cases.iter().zip(&ids) {
        let found = store.alert_in(ws, *id).await.unwrap();
        assert_eq!(found.is_some(), *kept, "{case}");
    }
    app.stop().await;
}

async fn log_retention_prunes_the_alert_history(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let hook = Receiver::start().await;
    let alerts = format!("{{ at = [50], webhook = \"{}\" }}", hook.url);
    let policies = alert_policy("apikey", "ada@acme.test/ci", "requests", 2, &alerts)
        + &alert_policy("ws", "acme", "requests", 2, &alerts).replace("\"day\"", "\"total\"");
    let text = setup(&mock, &policies);
    let one_day = |s: &mut aigw::Settings| {
        s.log_retention_days = 1;
        allow_loopback(s);
    };
    let start = |at| Setup {
        start: at,
        settings: Box::new(one_day),
        ..Setup::resources(text.clone())
    };
    let t0 = crate::helpers::default_start();
    let app = spawn_app(&db, start(t0)).await;
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat()).await.status(),
        200
    );
    app.sync().await;
    app.sync().await;
    let windows = |h: &[Value]| {
        let mut w: Vec<String> = h
            .iter()
            .map(|a| a["window"].as_str().unwrap().to_owned())
            .collect();
        w.sort();
        w
    };
    let fired = history(&app).await;
    assert_eq!(windows(&fired), ["day", "total"], "{fired:?}");
    assert!(fired.iter().all(|a| a["status"] == "delivered"), "{fired:?}");
    app.stop().await;

    // Four days later, with a day of retention, the gateway prunes at start: the day's alert
    // goes with the logs; the total's stays, so its crossing does not fire again.
    let app = spawn_app(&db, start(t0 + chrono::Duration::days(4))).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut left = history(&app).await;
    while left.len() > 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        left = history(&app).await;
    }
    assert_eq!(windows(&left), ["total"], "{left:?}");
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat()).await.status(),
        200
    );
    app.sync().await;
    app.sync().await;
    let sent: Vec<Value> = hook.bodies().iter().map(|b| b["window"].clone()).collect();
    let count = |w: &str| sent.iter().filter(|s| **s == w).count();
    assert_eq!(
        (count("day"), count("total")),
        (2, 1),
        "a new day fires again, the total never: {sent:?}"
    );
    app.stop().await;
}
