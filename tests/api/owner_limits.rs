//! Limits an owner or admin sets on a member's key survive what the member does to their keys
//! (DESIGN.md §11): deleting and re-creating the key, re-creating it under another name, or
//! opening a second key. The member attacks through the admin API, as they would.

use aigw::mock_upstream::MockUpstream;
use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, chat, spawn_app};
use crate::model_allow_list::admin;

fn resources(mock: &MockUpstream) -> String {
    ResourcesBuilder::new()
        .workspace("acme")
        .member_with_password("acme", "boss@acme.test", "owner", "boss-password-1")
        .member_with_password("acme", "ada@acme.test", "member", "ada-password-1")
        .upstream(
            "acme",
            "primary",
            &mock.base_url(),
            "cred-primary",
            &["gpt-4o-mini", "gpt-4o"],
        )
        .with("max_in_flight", 100)
        .into()
}

/// Status and error code of one call of `model` with `key`.
async fn call(app: &TestApp, key: &str, model: &str) -> (u16, String) {
    let r = app.post_json("/v1/chat/completions", key, &chat(model)).await;
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    (status, body["error"]["code"].as_str().unwrap_or("").to_owned())
}

/// A key ada creates for herself: its JSON, with the plaintext in `key`.
async fn create(app: &TestApp, ada: &str, body: Value) -> (u16, Value) {
    admin(app, ada, Method::POST, "/admin/v1/keys", Some(body)).await
}

async fn created(app: &TestApp, ada: &str, name: &str) -> (i64, String) {
    let (status, k) = create(app, ada, json!({"name": name})).await;
    assert_eq!(status, 201, "{k}");
    (k["id"].as_i64().unwrap(), k["key"].as_str().unwrap().to_owned())
}

/// Asserts the key carries the owner's limits: gpt-4o only, one request in flight.
fn assert_carries(k: &Value) {
    assert_eq!(k["allowed_models"], json!(["gpt-4o"]), "{k}");
    assert_eq!(k["max_in_flight"], 1, "{k}");
}

both_backends!(owner_limits_survive_what_the_member_does_to_keys);

/// The owner narrows ada's key to gpt-4o, one request in flight and 3 requests a day. Ada opens
/// a second key, deletes both and re-creates hers, then re-creates it under another name: every
/// key she holds refuses gpt-4o-mini, carries the cap, and the budget keeps counting her
/// requests through all of them.
async fn owner_limits_survive_what_the_member_does_to_keys(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let owner = app.login("boss@acme.test", "boss-password-1").await;
    let ada = app.login("ada@acme.test", "ada-password-1").await;
    let (ci, ci_key) = created(&app, &ada, "ci").await;
    let (status, _) = admin(
        &app,
        &owner,
        Method::PATCH,
        &format!("/admin/v1/keys/{ci}"),
        Some(json!({"allowed_models": ["gpt-4o"], "max_in_flight": 1})),
    )
    .await;
    assert_eq!(status, 200);
    let budget =
        json!({"subject": "apikey", "target_id": ci, "metric": "requests", "window": "day", "limit": 3});
    let (status, v) = admin(&app, &owner, Method::POST, "/admin/v1/policies", Some(budget)).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(call(&app, &ci_key, "gpt-4o-mini").await.1, "model_not_allowed");
    assert_eq!(call(&app, &ci_key, "gpt-4o").await.0, 200);

    // A second key: it carries the owner's limits, and the budget counts both keys.
    let (status, laptop) = create(&app, &ada, json!({"name": "laptop"})).await;
    assert_eq!(status, 201, "{laptop}");
    assert_carries(&laptop);
    let laptop_key = laptop["key"].as_str().unwrap().to_owned();
    assert_eq!(
        call(&app, &laptop_key, "gpt-4o-mini").await.1,
        "model_not_allowed"
    );
    assert_eq!(call(&app, &laptop_key, "gpt-4o").await.0, 200);

    // Deleted and re-created: the same limits, and the budget's usage is still there.
    for id in [ci, laptop["id"].as_i64().unwrap()] {
        let (status, v) = admin(&app, &ada, Method::DELETE, &format!("/admin/v1/keys/{id}"), None).await;
        assert_eq!(status, 204, "{v}");
    }
    let (status, again) = create(&app, &ada, json!({"name": "ci"})).await;
    assert_eq!(status, 201, "{again}");
    assert_carries(&again);
    let again_key = again["key"].as_str().unwrap().to_owned();
    assert_eq!(call(&app, &again_key, "gpt-4o-mini").await.1, "model_not_allowed");
    // The cap: one request in flight, the next refused.
    mock.hold();
    let held = {
        let (client, url) = (app.client.clone(), format!("{}/v1/chat/completions", app.address));
        let key = again_key.clone();
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(key)
                .json(&chat("gpt-4o"))
                .send()
                .await
        })
    };
    mock.until_held(1).await;
    assert_eq!(call(&app, &again_key, "gpt-4o").await.1, "concurrency_limit");
    mock.release();
    assert_eq!(
        held.await.unwrap().unwrap().status(),
        200,
        "the 3rd request of the day"
    );
    app.logs("acme", 7).await; // its usage counted
    assert_eq!(
        call(&app, &again_key, "gpt-4o").await,
        (429, "quota_exceeded".to_owned()),
        "the 4th: the budget counted the deleted keys' requests"
    );

    // Re-created under another name, or asking for more than the owner allowed.
    let (_, renamed) = create(&app, &ada, json!({"name": "ci-2"})).await;
    assert_carries(&renamed);
    for wider in [
        json!({"name": "wide", "allowed_models": ["gpt-4o-mini"]}),
        json!({"name": "wide", "allowed_models": ["*"]}),
        json!({"name": "wide", "max_in_flight": 2}),
    ] {
        let (status, v) = create(&app, &ada, wider.clone()).await;
        assert_eq!(status, 422, "{wider}: {v}");
    }
    let (status, narrower) = create(
        &app,
        &ada,
        json!({"name": "narrow", "allowed_models": ["gpt-4o"]}),
    )
    .await;
    assert_eq!(status, 201, "within the owner's limits: {narrower}");

    // The owner sees the budget on ada now, and lifts it there.
    let (_, policies) = admin(&app, &owner, Method::GET, "/admin/v1/policies", None).await;
    let on_ada: Vec<&Value> = policies["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["subject"] == "member" && p["target"] == "ada@acme.test")
        .collect();
    assert_eq!(on_ada.len(), 1, "{policies}");
    assert_eq!(
        (on_ada[0]["limit"].as_i64(), on_ada[0]["used"].as_i64()),
        (Some(3), Some(3))
    );
    let (status, _) = admin(
        &app,
        &ada,
        Method::DELETE,
        &format!("/admin/v1/policies/{}", on_ada[0]["id"]),
        None,
    )
    .await;
    assert_eq!(status, 403, "ada cannot lift the owner's budget");

    // The owner sees what ada's keys carry on ada, and lifts the allow-list on any of her keys.
    let members = admin(&app, &owner, Method::GET, "/admin/v1/members", None)
        .await
        .1;
    let on_member = members["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["email"] == "ada@acme.test")
        .map(|m| m["key_limits"].clone());
    let carried = json!({"allowed_models": ["gpt-4o"], "max_in_flight": 1, "allowed_tags": null});
    assert_eq!(on_member, Some(carried));
    let path = format!("/admin/v1/keys/{}", renamed["id"]);
    let lift = json!({"allowed_models": null});
    assert_eq!(admin(&app, &owner, Method::PATCH, &path, Some(lift)).await.0, 200);
    let (_, free) = create(&app, &ada, json!({"name": "free"})).await;
    assert_eq!(
        (free["allowed_models"].clone(), free["max_in_flight"].clone()),
        (Value::Null, json!(1))
    );
    app.stop().await;
}
