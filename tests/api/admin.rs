//! Admin sign-in (JWT) and the signed-in member's own quota.

use aigw::mock_upstream::MockUpstream;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{Setup, TestDb, spawn_app};
use crate::proxy::{KEY, fixture};

both_backends!(sign_in_and_my_quota, bad_tokens_and_sign_ins_are_refused);

async fn sign_in_and_my_quota(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let text: String = fixture(&mock)
        .set("member", "ada@acme.test", "password", "ada-password-1")
        .policy("acme", "member", "ada@acme.test", ("requests", "day"), 10.0)
        .policy(
            "acme",
            "apikey",
            "ada@acme.test/ci",
            ("total_tokens", "month"),
            1000.0,
        )
        .into();
    let app = spawn_app(&db, Setup::resources(text)).await;
    let r = app.sign_in("ada@acme.test", "ada-password-1").await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    let token = body["token"].as_str().unwrap().to_owned();
    assert_eq!(token.split('.').count(), 3, "a JWT");
    let me: Value = app.get_as("/admin/v1/me", &token).await.json().await.unwrap();
    assert_eq!(me["email"], "ada@acme.test");
    assert_eq!(me["role"], "member");

    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "say hello to me"}]});
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat).await.status(),
        200
    );
    let r = app.get_as("/admin/v1/me/quota", &token).await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["timezone"], "Asia/Shanghai");
    let quotas = body["quotas"].as_array().unwrap();
    assert_eq!(quotas.len(), 2, "{body}");
    let member = quotas.iter().find(|q| q["subject"] == "member").unwrap();
    assert_eq!(
        (member["used"].as_i64(), member["remaining"].as_i64()),
        (Some(1), Some(9))
    );
    assert!(member["reset_at"].as_str().unwrap().ends_with("+08:00"));
    let key = quotas.iter().find(|q| q["subject"] == "apikey").unwrap();
    assert_eq!(key["key_name"], "ci");
    assert_eq!(key["used"], 9);
    app.stop().await;
}

async fn bad_tokens_and_sign_ins_are_refused(db: TestDb) {
    let app = spawn_app(&db, Setup::default()).await;
    let r = app.sign_in("owner@example.test", "owner-password").await;
    let token = r.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(app.get_as("/admin/v1/me", &token).await.status(), 200);

    // Tampered, wrong algorithm (none), wrong audience, wrong secret, expired.
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    let tampered = format!("{}.{}.{}x", parts[0], parts[1], parts[2]);
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let claims: Value = serde_json::from_slice(&b64.decode(&parts[1]).unwrap()).unwrap();
    let none_header = b64.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let alg_none = format!("{none_header}.{}.", parts[1]);
    let mut wrong_aud = claims.clone();
    wrong_aud["aud"] = json!("someone-else");
    let sign = |c: &Value, secret: &str| {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            c,
            &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    };
    let secret = "test-jwt-secret-0123456789abcdef";
    let wrong_audience = sign(&wrong_aud, secret);
    let wrong_secret = sign(&claims, "another-secret-entirely-000000000");
    let hs512 = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS512),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap();
    parts[1] = b64.encode(serde_json::to_vec(&json!({"sub": "1"})).unwrap());
    for (what, bad) in [
        ("tampered", tampered),
        ("alg none", alg_none),
        ("wrong audience", wrong_audience),
        ("wrong secret", wrong_secret),
        ("HS512", hs512),
        ("garbage", "not.a.jwt".to_owned()),
    ] {
        let r = app.get_as("/admin/v1/me/quota", &bad).await;
        assert_eq!(r.status(), 401, "{what}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_token", "{what}");
    }
    assert_eq!(app.get("/admin/v1/me").await.status(), 401, "no token");
    // Expired: the gateway's clock moves past the hour.
    app.clock.advance(chrono::Duration::minutes(61));
    assert_eq!(app.get_as("/admin/v1/me", &token).await.status(), 401, "expired");

    // Bad sign-ins: wrong password, unknown email, unknown fields; then slowed.
    let r = app.sign_in("owner@example.test", "wrong").await;
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "invalid_credentials"
    );
    assert_eq!(app.sign_in("nobody@example.test", "x").await.status(), 401);
    let r = app
        .client
        .post(format!("{}/admin/v1/auth/login", app.address))
        .json(&json!({"email": "a", "password": "b", "extra": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let mut throttled = false;
    for _ in 0..15 {
        if app.sign_in("owner@example.test", "wrong").await.status() == 429 {
            throttled = true;
            break;
        }
    }
    assert!(throttled, "repeated failed sign-ins are slowed");
    app.stop().await;
}
