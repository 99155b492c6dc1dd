//! What an operator sets up around the gateway: reverse proxies (`trusted_proxies`), a token on
//! `/metrics`, and the admin surfaces on a listener of their own (`admin_listen`).

use aigw::mock_upstream::MockUpstream;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{Setup, TestApp, TestDb, spawn_app};
use crate::proxy::{KEY, resources};

both_backends!(
    behind_a_trusted_proxy_the_forwarded_client_is_logged_throttled_and_audited,
    without_trusted_proxies_the_forwarded_header_is_ignored,
    a_metrics_token_guards_metrics,
    the_admin_surfaces_on_a_listener_of_their_own,
);

fn chat() -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]})
}

const BAD_KEY: &str = "sk-aigw-0000000000000000000000000000bad0";

async fn start(db: &TestDb, trusted: &'static [&'static str]) -> (TestApp, MockUpstream) {
    let mock = MockUpstream::start().await.unwrap();
    let setup = Setup {
        settings: Box::new(move |s| {
            s.trusted_proxies = trusted.iter().map(|n| n.parse().unwrap()).collect();
        }),
        ..Setup::resources(resources(&mock))
    };
    (spawn_app(db, setup).await, mock)
}

/// `POST path` with a JSON body, a bearer token and `X-Forwarded-For: forwarded`.
async fn post_from(
    app: &TestApp,
    forwarded: &str,
    path: &str,
    token: &str,
    body: &Value,
) -> reqwest::Response {
    app.client
        .post(format!("{}{path}", app.address))
        .header("x-forwarded-for", forwarded)
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// Bad keys from `forwarded` until refused with `auth_rate_limited` (at most 40 tries); whether
/// it came.
async fn bad_keys_until_throttled(app: &TestApp, forwarded: &str) -> bool {
    for _ in 0..40 {
        let r = post_from(app, forwarded, "/v1/chat/completions", BAD_KEY, &chat()).await;
        match r.status().as_u16() {
            401 => continue,
            429 => {
                let v: Value = r.json().await.unwrap();
                assert_eq!(v["error"]["code"], "auth_rate_limited");
                return true;
            }
            other => panic!("unexpected {other}"),
        }
    }
    false
}

/// Failed sign-ins from `forwarded`, a new email each (so only the address's allowance is
/// spent), until one is refused with `auth_rate_limited` (at most 20 tries); whether it came.
async fn failed_sign_ins_until_throttled(app: &TestApp, forwarded: &str) -> bool {
    for i in 0..20 {
        let body =
            json!({"email": format!("nobody{i}.{forwarded}@example.test"), "password": "wrong-password"});
        let r = post_from(app, forwarded, "/admin/v1/auth/login", "", &body).await;
        match r.status().as_u16() {
            401 => continue,
            429 => return true,
            other => panic!("unexpected {other}"),
        }
    }
    false
}

async fn behind_a_trusted_proxy_the_forwarded_client_is_logged_throttled_and_audited(db: TestDb) {
    let (app, _mock) = start(&db, &["127.0.0.1/32"]).await;

    // Request logs: the rightmost address the trusted proxy did not add itself.
    let r = post_from(
        &app,
        "198.51.100.7, 203.0.113.9",
        "/v1/chat/completions",
        KEY,
        &chat(),
    )
    .await;
    assert_eq!(r.status(), 200);
    let logs = app.logs("acme", 1).await;
    assert_eq!(logs[0].client_ip.as_deref(), Some("203.0.113.9"));
    let r = app.post_json("/v1/chat/completions", KEY, &chat()).await;
    assert_eq!(r.status(), 200);
    let logs = app.logs("acme", 2).await;
    assert_eq!(
        logs[0].client_ip.as_deref(),
        Some("127.0.0.1"),
        "without the header, the proxy's own address"
    );

    // The failed-key limiter counts per forwarded client: one client's failures do not lock
    // out another behind the same proxy.
    assert!(bad_keys_until_throttled(&app, "203.0.113.50").await);
    let r = post_from(&app, "203.0.113.51", "/v1/chat/completions", BAD_KEY, &chat()).await;
    assert_eq!(
        r.status(),
        401,
        "another client behind the proxy is not throttled"
    );

    // Admin sign-in likewise.
    assert!(failed_sign_ins_until_throttled(&app, "203.0.113.60").await);
    let body = json!({"email": "owner@example.test", "password": "owner-password"});
    let r = post_from(&app, "203.0.113.61", "/admin/v1/auth/login", "", &body).await;
    assert_eq!(r.status(), 200, "another client signs in");
    let token = r.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();

    // The audit log records where a change came from.
    let r = post_from(
        &app,
        "203.0.113.62",
        "/admin/v1/keys",
        &token,
        &json!({"name": "from-afar"}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let audit: Value = app.get_as("/admin/v1/audit", &token).await.json().await.unwrap();
    let entry = &audit["data"][0];
    assert_eq!(entry["target_kind"], "api_key");
    assert_eq!(entry["client_ip"], "203.0.113.62");
    app.stop().await;
}

async fn without_trusted_proxies_the_forwarded_header_is_ignored(db: TestDb) {
    let (app, _mock) = start(&db, &[]).await;
    let r = post_from(&app, "203.0.113.9", "/v1/chat/completions", KEY, &chat()).await;
    assert_eq!(r.status(), 200);
    let logs = app.logs("acme", 1).await;
    assert_eq!(
        logs[0].client_ip.as_deref(),
        Some("127.0.0.1"),
        "a header anyone can send is not believed"
    );
    // A client cannot escape the limiter by claiming another address.
    assert!(bad_keys_until_throttled(&app, "203.0.113.50").await);
    let r = post_from(&app, "203.0.113.51", "/v1/chat/completions", BAD_KEY, &chat()).await;
    assert_eq!(r.status(), 429, "the same connection address, the same allowance");
    assert!(failed_sign_ins_until_throttled(&app, "203.0.113.60").await);
    let body = json!({"email": "owner@example.test", "password": "owner-password"});
    let r = post_from(&app, "203.0.113.61", "/admin/v1/auth/login", "", &body).await;
    assert_eq!(
        r.status(),
        429,
        "the address's sign-in allowance is spent whatever the header says"
    );
    app.stop().await;
}

async fn a_metrics_token_guards_metrics(db: TestDb) {
    const TOKEN: &str = "scrape-token-0123456789abcdef";
    let mock = MockUpstream::start().await.unwrap();
    let setup = Setup {
        settings: Box::new(|s| s.metrics_token = Some(aigw::config::Secret::new(TOKEN))),
        ..Setup::resources(resources(&mock))
    };
    let app = spawn_app(&db, setup).await;
    let url = format!("{}/metrics", app.address);
    for auth in [
        None,
        Some("Bearer wrong-token"),
        Some("Basic c2NyYXBlOnRva2Vu"),
        Some(TOKEN),
    ] {
        let mut req = app.client.get(&url);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401, "{auth:?}");
        assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_metrics_token", "{auth:?}");
    }
    for auth in [format!("Bearer {TOKEN}"), format!("bearer  {TOKEN} ")] {
        let r = app
            .client
            .get(&url)
            .header("authorization", auth)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.text().await.unwrap().contains("# TYPE aigw_build_info gauge"));
    }
    // Health and the proxy ask for no metrics token.
    assert_eq!(app.get("/healthz").await.status(), 200);
    assert_eq!(app.get("/readyz").await.status(), 200);
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat()).await.status(),
        200
    );
    app.stop().await;
}

async fn the_admin_surfaces_on_a_listener_of_their_own(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let setup = Setup {
        settings: Box::new(|s| s.admin_listen = Some("127.0.0.1:0".parse().unwrap())),
        ..Setup::resources(resources(&mock))
    };
    let app = spawn_app(&db, setup).await;
    let main = app.address.clone();
    let admin = app.admin_address.clone().expect("an admin listener");
    assert_ne!(main, admin);
    let login = json!({"email": "owner@example.test", "password": "owner-password"});
    let get = |url: String| {
        let client = app.client.clone();
        async move { client.get(url).send().await.unwrap() }
    };

    // The main listener: the proxy and health; the admin surfaces are not there at all.
    for path in ["/admin/v1/me", "/console/", "/console/app.js", "/", "/metrics"] {
        let r = get(format!("{main}{path}")).await;
        assert_eq!(r.status(), 404, "{path} on the main listener");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "not_found", "{path}");
    }
    let r = app
        .client
        .post(format!("{main}/admin/v1/auth/login"))
        .json(&login)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "no sign-in on the main listener");
    assert_eq!(get(format!("{main}/healthz")).await.status(), 200);
    assert_eq!(get(format!("{main}/readyz")).await.status(), 200);
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat()).await.status(),
        200
    );

    // The admin listener: sign-in, the admin API, the console, metrics, health; no proxy.
    let r = app
        .client
        .post(format!("{admin}/admin/v1/auth/login"))
        .json(&login)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let token = r.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let me = app
        .client
        .get(format!("{admin}/admin/v1/me"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(me.status(), 200);
    assert_eq!(get(format!("{admin}/console/")).await.status(), 200);
    let metrics = get(format!("{admin}/metrics")).await;
    assert_eq!(metrics.status(), 200);
    assert!(metrics.text().await.unwrap().contains("aigw_requests_total"));
    assert_eq!(get(format!("{admin}/healthz")).await.status(), 200);
    let r = app
        .client
        .post(format!("{admin}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&chat())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "no proxy on the admin listener");
    assert_eq!(get(format!("{admin}/v1/models")).await.status(), 404);

    // Both listeners stop with the gateway.
    app.stop().await;
    assert!(
        reqwest::get(format!("{admin}/healthz")).await.is_err(),
        "the admin listener is closed"
    );
}
