//! Client connections, driven over raw TCP: the header and idle timeouts, the connection cap,
//! and the protocol-level refusals (431, 400, 405) in the gateway's JSON error shape.
//!
//! No storage is involved, so each test runs on SQLite only.

use serde_json::Value;

use crate::helpers::{Setup, TestDb, spawn_app};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_is_a_405_with_allow_in_the_gateway_shape() {
    let db = TestDb::sqlite();
    let app = spawn_app(&db, Setup::default()).await;
    for (method, path, allow) in [
        ("GET", "/v1/chat/completions", "POST"),
        ("DELETE", "/v1/models", "GET,HEAD"),
        ("POST", "/healthz", "GET,HEAD"),
        ("GET", "/admin/v1/auth/login", "POST"),
    ] {
        let r = app
            .client
            .request(method.parse().unwrap(), format!("{}{path}", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "{method} {path}");
        assert_eq!(r.headers()["x-aigw-error-source"], "gateway", "{method} {path}");
        assert_eq!(r.headers()["allow"], allow, "{method} {path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            body["error"]["code"], "method_not_allowed",
            "{method} {path}: {body}"
        );
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_redirects_to_the_console() {
    let db = TestDb::sqlite();
    let app = spawn_app(&db, Setup::default()).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for method in [reqwest::Method::GET, reqwest::Method::HEAD] {
        let r = client
            .request(method.clone(), format!("{}/", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 307, "{method}");
        assert_eq!(r.headers()["location"], "/console/", "{method}");
    }
    // A console file that does not exist is a refusal like any other.
    let r = app.get("/console/no-such-file.js").await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    app.stop().await;
}
