//! Key expiry and rotation (issue 25 item 2): a key past its `expires_at` answers 401
//! `api_key_expired` before any quota or upstream work, without counting toward its breaker;
//! rotating a key issues a new secret on the same key (same quotas, usage and logs) while the
//! replaced one works until its grace ends, then answers like an unknown key. Time is moved by
//! the manual clock.

use chrono::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{Setup, TestApp, TestDb, spawn_app, try_spawn_app};
use crate::model_allow_list::{OWNER, OWNER_PASSWORD, admin, key_id, patch, start};
use crate::proxy::{KEY, fixture, resources};

/// A member who signs in and owns no key of the suite.
const BOB: &str = "bob@acme.test";
const BOB_PASSWORD: &str = "bob-password";

fn chat() -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
}

/// Status and body of a chat call with `key`.
async fn call(app: &TestApp, key: &str) -> (u16, Value) {
    let r = app.post_json("/v1/chat/completions", key, &chat()).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The code of a refusal (or `"ok"` for a 200).
async fn outcome(app: &TestApp, key: &str) -> String {
    let (status, body) = call(app, key).await;
    if status == 200 {
        return "ok".into();
    }
    format!("{status} {}", body["error"]["code"].as_str().unwrap_or("?"))
}

/// The key `id` as the admin API shows it to `token`.
async fn key_json(app: &TestApp, token: &str, id: i64) -> Value {
    let (status, body) = admin(app, token, Method::GET, &format!("/admin/v1/keys/{id}"), None).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// `[[api_key]]` ada's `ci` (the suite's key) with `expires_at`, replacing the suite's own
/// declaration of it.
fn ci_expiring(mock: &aigw::mock_upstream::MockUpstream, expires_at: &str) -> String {
    fixture(mock)
        .set("api_key", "ci", "expires_at", expires_at)
        .member_with_password("acme", OWNER, "owner", OWNER_PASSWORD)
        .into()
}

both_backends!(
    an_expired_key_is_refused_with_its_own_code,
    rotation_keeps_the_old_secret_for_its_grace_only,
    who_may_rotate_and_what_the_admin_api_refuses,
    the_resources_file_checks_expires_at,
    a_key_unknown_a_second_ago_works_once_created_elsewhere,
);

async fn an_expired_key_is_refused_with_its_own_code(db: TestDb) {
    // The suite starts at 10:00 in Beijing; the key expires at 11:00 there.
    let mock = aigw::mock_upstream::MockUpstream::start().await.unwrap();
    let app = spawn_app(
        &db,
        Setup::resources(ci_expiring(&mock, "2026-12-01T11:00:00+08:00")),
    )
    .await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let id = key_id(&app, &token, "ci").await;
    let shown = key_json(&app, &token, id).await;
    assert_eq!(shown["expires_at"], "2026-12-01T03:00:00+00:00", "{shown}");
    assert_eq!(shown["expired"], false);

    assert_eq!(outcome(&app, KEY).await, "ok", "not yet expired");
    app.clock.advance(Duration::seconds(3599));
    assert_eq!(outcome(&app, KEY).await, "ok", "a second before");
    app.clock.advance(Duration::seconds(1));
    let calls = mock.call_count();
    let (status, body) = call(&app, KEY).await;
    assert_eq!(status, 401, "{body}");
    // An hour on, the admin token has expired too.
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let e = &body["error"];
    assert_eq!(e["code"], "api_key_expired");
    assert_eq!(e["type"], "authentication_error");
    assert_eq!(e["expired_at"], "2026-12-01T03:00:00+00:00");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("expired at 2026-12-01T03:00:00+00:00"),
        "{message}"
    );
    assert!(key_json(&app, &token, id).await["expired"] == true);

    // Not throttled as guesses, and not counted toward the breaker: more than enough failures
    // to trip it, then the admin extends the key and it works at once.
    for _ in 0..120 {
        assert_eq!(outcome(&app, KEY).await, "401 api_key_expired");
    }
    assert_eq!(mock.call_count(), calls, "nothing went upstream");
    patch(
        &app,
        &token,
        &format!("/admin/v1/keys/{id}"),
        json!({"expires_at": "2027-01-01T00:00:00+08:00"}),
    )
    .await;
    assert_eq!(outcome(&app, KEY).await, "ok", "extended, and no breaker trip");
    let shown = key_json(&app, &token, id).await;
    assert_eq!(shown["breaker"]["trips"], 0, "{shown}");
    // Only the two served requests and this one are logged: the refusals are not.
    app.sync().await;
    let logs = app.logs("acme", 3).await;
    assert_eq!(logs.len(), 3, "{logs:?}");
    assert!(logs.iter().all(|l| l.status == 200));

    // Expired through the admin API too (a past time expires it at once), and cleared with null.
    patch(
        &app,
        &token,
        &format!("/admin/v1/keys/{id}"),
        json!({"expires_at": "2026-12-01T00:00:00Z"}),
    )
    .await;
    assert_eq!(outcome(&app, KEY).await, "401 api_key_expired");
    let cleared = patch(
        &app,
        &token,
        &format!("/admin/v1/keys/{id}"),
        json!({"expires_at": null}),
    )
    .await;
    assert_eq!(cleared["expires_at"], Value::Null);
    assert_eq!(outcome(&app, KEY).await, "ok");
    app.stop().await;
}

async fn rotation_keeps_the_old_secret_for_its_grace_only(db: TestDb) {
    // Three requests a day on the key, whichever secret presents it.
    let policy = "[[policy]]\nworkspace = \"acme\"\nsubject = \"apikey\"\ntarget = \"ada@acme.test/ci\"\n\
                  metric = \"requests\"\nwindow = \"day\"\nlimit = 3\n";
    let (app, _mock) = start(&db, policy).await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let id = key_id(&app, &token, "ci").await;
    assert_eq!(outcome(&app, KEY).await, "ok");

    let path = format!("/admin/v1/keys/{id}/rotate");
    let (status, rotated) = admin(
        &app,
        &token,
        Method::POST,
        &path,
        Some(json!({"grace_seconds": 3600})),
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    assert_eq!(rotated["id"], id, "the same key");
    let new = rotated["key"].as_str().expect("the new secret, once").to_owned();
    assert!(new.starts_with("sk-aigw-") && new != KEY);
    assert_eq!(rotated["prefix"].as_str(), Some(&new[..12]));
    assert_eq!(
        rotated["previous_secret_expires_at"], "2026-12-01T03:00:00+00:00",
        "an hour from now"
    );
    assert_eq!(
        key_json(&app, &token, id).await.get("key"),
        None,
        "shown once only"
    );

    assert_eq!(outcome(&app, &new).await, "ok", "the new secret works at once");
    assert_eq!(outcome(&app, KEY).await, "ok", "the old one within its grace");
    app.clock.advance(Duration::seconds(3599));
    app.sync().await;
    assert_eq!(
        outcome(&app, KEY).await,
        "429 quota_exceeded",
        "both secrets count toward the key's one quota (3 a day)"
    );
    app.clock.advance(Duration::seconds(1));
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    assert_eq!(
        outcome(&app, KEY).await,
        "401 invalid_api_key",
        "the grace is over: an unknown key"
    );
    assert_eq!(outcome(&app, &new).await, "429 quota_exceeded");
    let shown = key_json(&app, &token, id).await;
    assert_eq!(shown["previous_secret_expires_at"], Value::Null, "{shown}");

    // Every request but the unknown key's, by either secret, is logged under the one key.
    let logs = app.logs("acme", 5).await;
    assert_eq!(logs.len(), 5);
    assert!(logs.iter().all(|l| l.key_id == id), "{logs:?}");

    // Rotated again with no grace: the secret it replaces stops at once.
    let (status, again) = admin(
        &app,
        &token,
        Method::POST,
        &path,
        Some(json!({"grace_seconds": 0})),
    )
    .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["previous_secret_expires_at"], Value::Null);
    assert_eq!(outcome(&app, &new).await, "401 invalid_api_key");
    let newest = again["key"].as_str().unwrap();
    assert_eq!(
        outcome(&app, newest).await,
        "429 quota_exceeded",
        "the same quota"
    );

    // Audited, without any secret.
    let (status, audit) = admin(&app, &token, Method::GET, "/admin/v1/audit", None).await;
    assert_eq!(status, 200);
    let text = audit.to_string();
    assert!(text.contains("\"rotate\""), "{text}");
    assert!(!text.contains(&new[8..]) && !text.contains(&newest[8..]));
    app.stop().await;
}

async fn who_may_rotate_and_what_the_admin_api_refuses(db: TestDb) {
    let bob = format!(
        "[[member]]\nworkspace = \"acme\"\nemail = \"{BOB}\"\nrole = \"member\"\npassword = \"{BOB_PASSWORD}\"\n"
    );
    let (app, _mock) = start(&db, &bob).await;
    let owner = app.login(OWNER, OWNER_PASSWORD).await;
    let member = app.login(BOB, BOB_PASSWORD).await;
    let ada_key = key_id(&app, &owner, "ci").await;

    // A member rotates their own keys, not another member's (as with deleting).
    let (status, _) = admin(
        &app,
        &member,
        Method::POST,
        &format!("/admin/v1/keys/{ada_key}/rotate"),
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, own) = admin(
        &app,
        &member,
        Method::POST,
        "/admin/v1/keys",
        Some(json!({"name": "laptop", "expires_at": "2026-12-08T10:00:00+08:00"})),
    )
    .await;
    assert_eq!(status, 201, "{own}");
    assert_eq!(own["expires_at"], "2026-12-08T02:00:00+00:00");
    let own_id = own["id"].as_i64().unwrap();
    let rotate = format!("/admin/v1/keys/{own_id}/rotate");
    let (status, rotated) = admin(&app, &member, Method::POST, &rotate, None).await;
    assert_eq!(status, 200, "{rotated}");
    assert_eq!(
        rotated["previous_secret_expires_at"], "2026-12-02T02:00:00+00:00",
        "a day's grace by default"
    );
    assert_eq!(
        rotated["expires_at"], "2026-12-08T02:00:00+00:00",
        "the expiry stays"
    );

    let field_error = |(status, body): (u16, Value), param: &str| {
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["code"], "invalid_field");
        assert_eq!(body["error"]["param"], param, "{body}");
    };
    for grace in [json!(-1), json!(30 * 86_400 + 1)] {
        let r = admin(
            &app,
            &member,
            Method::POST,
            &rotate,
            Some(json!({"grace_seconds": grace})),
        )
        .await;
        field_error(r, "grace_seconds");
    }
    let (status, body) = admin(
        &app,
        &member,
        Method::POST,
        &rotate,
        Some(json!({"grace_seconds": "soon"})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    for expires_at in ["tomorrow", "2027-01-01", "2026-11-30T00:00:00Z"] {
        let r = admin(
            &app,
            &member,
            Method::POST,
            "/admin/v1/keys",
            Some(json!({"name": "bad", "expires_at": expires_at})),
        )
        .await;
        field_error(r, "expires_at");
    }
    let r = admin(
        &app,
        &owner,
        Method::PATCH,
        &format!("/admin/v1/keys/{ada_key}"),
        Some(json!({"expires_at": "2026-13-01T00:00:00Z"})),
    )
    .await;
    field_error(r, "expires_at");
    // Setting an expiry afterwards is an owner's or admin's edit, as the other guardrails are.
    let (status, _) = admin(
        &app,
        &member,
        Method::PATCH,
        &format!("/admin/v1/keys/{own_id}"),
        Some(json!({"expires_at": null})),
    )
    .await;
    assert_eq!(status, 403);
    app.stop().await;
}

async fn the_resources_file_checks_expires_at(db: TestDb) {
    let mock = aigw::mock_upstream::MockUpstream::start().await.unwrap();
    let refused = try_spawn_app(&db, Setup::resources(ci_expiring(&mock, "next year")))
        .await
        .err()
        .expect("a bad expires_at stops the start");
    let message = refused.to_string();
    assert!(
        message.contains("[[api_key]]") && message.contains("ada@acme.test/ci"),
        "{message}"
    );
    assert!(
        message.contains("expires_at must be an RFC 3339 time"),
        "{message}"
    );
    // A time already past is accepted (the key has expired since the file was written).
    let app = spawn_app(
        &db,
        Setup::resources(ci_expiring(&mock, "2026-01-01T00:00:00+08:00")),
    )
    .await;
    assert_eq!(outcome(&app, KEY).await, "401 api_key_expired");
    app.stop().await;
}

/// An unknown key's refusal is remembered for a second only (UNKNOWN_MS in src/proxy/auth.rs): a
/// key another gateway creates (a row in the shared store, no configuration change here) works
/// here a second after it was refused, by the gateway's clock.
async fn a_key_unknown_a_second_ago_works_once_created_elsewhere(db: TestDb) {
    use sqlx::Connection;
    let mock = aigw::mock_upstream::MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let later = KEY.replace("ghij", "GHIJ");
    assert_eq!(outcome(&app, &later).await, "401 invalid_api_key");

    sqlx::any::install_default_drivers();
    let mut other = sqlx::AnyConnection::connect(&db.url).await.unwrap();
    let hash = aigw::kernel::crypto::hash_api_key(&later);
    sqlx::query(&format!(
        "INSERT INTO api_keys (workspace_id, member_id, name, key_hash, prefix, created_at) \
         SELECT workspace_id, member_id, 'later', '{hash}', prefix, created_at FROM api_keys \
         WHERE name = 'ci'"
    ))
    .execute(&mut other)
    .await
    .unwrap();
    other.close().await.unwrap();

    assert_eq!(
        outcome(&app, &later).await,
        "401 invalid_api_key",
        "still the remembered answer"
    );
    app.clock.advance(Duration::milliseconds(999));
    assert_eq!(outcome(&app, &later).await, "401 invalid_api_key");
    app.clock.advance(Duration::milliseconds(1));
    assert_eq!(outcome(&app, &later).await, "ok", "a second on, read again");
    app.stop().await;
}
