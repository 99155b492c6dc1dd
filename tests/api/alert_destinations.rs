//! Where a budget alert's webhook may point (issue 40 item 5, DESIGN.md §11): destinations on
//! loopback, link-local, private or reserved ranges, or the gateway's own listeners, are refused
//! unless `alert_webhook_allow` names the host or range; the URL's address is checked when the
//! alert is set, the resolved address at each delivery; redirects are not followed; the history
//! shows the receiver's status, never its body.
//!
//! Every receiver here is on 127.0.0.1, and every refused address either is on this machine
//! (loopback, 0.0.0.0, the gateway itself) or is only ever set, never delivered to: even with the
//! check broken, no test makes the gateway connect off this machine.

use std::sync::{Arc, Mutex};

use aigw::mock_upstream::MockUpstream;
use axum::http::{HeaderMap, StatusCode};
use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::budget_alerts::{OWNER, alert_policy, call, chat, history, setup};
use crate::helpers::{Setup, TestApp, TestDb, spawn_app};
use crate::proxy::KEY;

/// A receiver on 127.0.0.1 that answers every POST with `status`, a `location` and a body that
/// must never reach the alert history; counts what it got.
struct Answering {
    url: String,
    got: Arc<Mutex<usize>>,
}

impl Answering {
    async fn start(status: u16, location: &str) -> Answering {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let got = Arc::new(Mutex::new(0));
        let (g, location) = (got.clone(), location.to_owned());
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |_: HeaderMap| {
                let (g, location) = (g.clone(), location.clone());
                async move {
                    *g.lock().unwrap() += 1;
                    (
                        StatusCode::from_u16(status).unwrap(),
                        [("location", location)],
                        "internal answer: db password hunter2",
                    )
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Answering { url, got }
    }

    fn count(&self) -> usize {
        *self.got.lock().unwrap()
    }
}

fn allowing(entries: &'static [&'static str]) -> impl FnOnce(&mut aigw::Settings) + Send {
    move |s: &mut aigw::Settings| {
        s.alert_webhook_allow = entries.iter().map(|e| e.parse().unwrap()).collect();
    }
}

/// Creates a workspace policy whose alerts go to `webhook`; `n` makes its window its own (one
/// policy per subject, metric and window).
async fn create(app: &TestApp, token: &str, webhook: &str, n: usize) -> (u16, Value) {
    let window = [
        "day",
        "week",
        "month",
        "total",
        "minute",
        "5minutes",
        "10minutes",
        "15minutes",
        "30minutes",
    ][n];
    let policy = json!({"subject": "ws", "metric": "requests", "window": window, "limit": 10,
        "alerts": {"at": [50], "webhook": webhook}});
    call(app, Method::POST, "/admin/v1/policies", token, Some(policy)).await
}

both_backends!(
    a_webhook_on_this_machine_or_a_private_range_is_refused_when_set,
    each_delivery_checks_the_address_and_the_history_shows_the_status_only,
);

async fn a_webhook_on_this_machine_or_a_private_range_is_refused_when_set(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(setup(&mock, ""))).await;
    let owner = app.login(OWNER, "boss-password").await;
    let own = format!("{}/admin/v1/policies", app.address);
    #[rustfmt::skip]
    let refused = [
        "http://127.0.0.1:9/hook", "http://127.1:9/", "http://2130706433:9/", "http://0x7f000001:9/",
        "http://0177.0.0.1:9/", "http://0x7f.0.0.1:9/", "http://[::1]:9/", "http://[::ffff:127.0.0.1]:9/",
        "http://[0:0:0:0:0:ffff:7f00:1]:9/", "http://0.0.0.0:9/", "http://0:9/", "http://localhost:9/",
        "http://LocalHost.:9/", "http://api.localhost:9/", "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/", "http://172.16.0.1/", "http://192.168.1.1/", "http://100.64.0.1/",
        "http://[fc00::1]/", "http://[fd12:3456::1]/", "http://[fe80::1]/", "http://[64:ff9b::a9fe:a9fe]/",
        "http://[2002:a9fe:a9fe::1]/", "http://224.0.0.1/", "http://255.255.255.255/", &own,
    ];
    for url in refused {
        let (status, v) = create(&app, &owner, url, 8).await;
        assert_eq!(status, 422, "{url}: {v}");
        assert_eq!(v["error"]["param"], "alerts.webhook", "{url}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("alert_webhook_allow"), "{url}: {message}");
    }
    for (n, url) in ["https://hooks.example/aigw", "http://hooks.example:8080/x"]
        .into_iter()
        .enumerate()
    {
        let (status, v) = create(&app, &owner, url, n).await;
        assert_eq!(status, 201, "{url}: {v}");
    }
    app.stop().await;

    // Allowed by range: that range passes; the gateway's own listeners and other ranges do not.
    let app = spawn_app(
        &db,
        Setup {
            settings: Box::new(allowing(&["127.0.0.0/8", "hooks.internal"])),
            ..Setup::resources(setup(&mock, ""))
        },
    )
    .await;
    let owner = app.login(OWNER, "boss-password").await;
    let own = format!("{}/hook", app.address);
    for (n, (url, status)) in [
        ("http://127.0.0.1:9/hook", 201),
        ("http://2130706433:9/", 201),
        ("http://hooks.internal:9/", 201),
        (own.as_str(), 422),
        (&own.replace("127.0.0.1", "0.0.0.0"), 422),
        ("http://[::1]:9/", 422),
        ("http://10.0.0.1/", 422),
    ]
    .into_iter()
    .enumerate()
    {
        let (got, v) = create(&app, &owner, url, n + 2).await;
        assert_eq!(got, status, "{url}: {v}");
    }
    app.stop().await;
}

async fn each_delivery_checks_the_address_and_the_history_shows_the_status_only(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let elsewhere = Answering::start(200, "").await;
    let hook = Answering::start(307, &elsewhere.url).await;
    let by_name = hook.url.replace("127.0.0.1", "localhost");
    let policies = alert_policy(
        "ws",
        "acme",
        "requests",
        2,
        &format!("{{ at = [50], webhook = \"{}\" }}", hook.url),
    ) + &alert_policy(
        "apikey",
        "ada@acme.test/ci",
        "requests",
        2,
        &format!("{{ at = [50], webhook = \"{by_name}\" }}"),
    );
    let text = setup(&mock, &policies);

    // Allowed: delivered to the receiver, whose redirect is not followed and whose body is not
    // kept.
    let app = spawn_app(
        &db,
        Setup {
            settings: Box::new(allowing(&["127.0.0.1", "::1"])),
            ..Setup::resources(text.clone())
        },
    )
    .await;
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat()).await.status(),
        200
    );
    app.sync().await;
    assert_eq!(hook.count(), 2, "both alerts reached the receiver");
    assert_eq!(elsewhere.count(), 0, "the redirect was not followed");
    let listed = history(&app).await;
    assert_eq!(listed.len(), 2);
    for a in &listed {
        assert_eq!(a["last_status"], 307, "{a}");
        assert_eq!(a["last_error"], "HTTP 307", "only the status: {a}");
    }
    let later = app.clock.now() + chrono::Duration::seconds(5);
    app.stop().await;

    // The same alerts, now that nothing allows loopback: each try is refused before it connects,
    // by address and by name.
    let app = spawn_app(
        &db,
        Setup {
            start: later,
            ..Setup::resources(text)
        },
    )
    .await;
    app.sync().await;
    assert_eq!(hook.count(), 2, "no delivery to loopback");
    let listed = history(&app).await;
    for a in &listed {
        assert_eq!(a["attempts"], 2, "{a}");
        assert_eq!(a["status"], "pending", "{a}");
        assert_eq!(a["last_status"], Value::Null, "{a}");
        let error = a["last_error"].as_str().unwrap();
        assert!(
            error.contains("not allowed") && error.contains("alert_webhook_allow"),
            "{error}"
        );
        assert!(!error.contains("hunter2"), "{error}");
    }
    app.stop().await;
}
