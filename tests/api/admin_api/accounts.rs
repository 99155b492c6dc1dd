//! Sign-in, sign-out and password changes, and the members of a workspace.

use super::*;

both_backends!(
    sign_out_and_password_change_revoke_tokens,
    members_are_invited_changed_and_deactivated,
);

async fn sign_out_and_password_change_revoke_tokens(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let first = admin.login("ada@acme.test").await;
    let second = admin.login("ada@acme.test").await;
    admin
        .ok(Method::POST, "/admin/v1/auth/logout", &first, None)
        .await;
    for t in [&first, &second] {
        let (status, _) = admin.call(Method::GET, "/admin/v1/me", Some(t), None).await;
        assert_eq!(status, 401, "sign-out revokes every token of the member");
    }

    let token = admin.login("ada@acme.test").await;
    let wrong = json!({"current_password": "not-it", "new_password": "a-brand-new-password"});
    let (status, v) = admin
        .call(Method::POST, "/admin/v1/auth/password", Some(&token), Some(wrong))
        .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (422, Some("current_password"))
    );
    let short = json!({"current_password": "pw-ada@acme.test", "new_password": "short"});
    let (status, v) = admin
        .call(Method::POST, "/admin/v1/auth/password", Some(&token), Some(short))
        .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (422, Some("new_password"))
    );
    let change = json!({"current_password": "pw-ada@acme.test", "new_password": "a-brand-new-password"});
    let v = admin
        .ok(Method::POST, "/admin/v1/auth/password", &token, Some(change))
        .await;
    let fresh = v["token"].as_str().unwrap().to_owned();
    let (status, _) = admin.call(Method::GET, "/admin/v1/me", Some(&token), None).await;
    assert_eq!(status, 401, "the old token is revoked");
    admin.ok(Method::GET, "/admin/v1/me", &fresh, None).await;
    let (status, _) = admin
        .call(
            Method::POST,
            "/admin/v1/auth/login",
            None,
            Some(json!({"email": "ada@acme.test", "password": "a-brand-new-password"})),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = admin
        .call(
            Method::POST,
            "/admin/v1/auth/login",
            None,
            Some(json!({"email": "ada@acme.test", "password": "pw-ada@acme.test"})),
        )
        .await;
    assert_eq!(status, 401);
    app.stop().await;
}

async fn members_are_invited_changed_and_deactivated(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let admin_token = admin.login("admin@acme.test").await;
    let depts = admin.ok(Method::GET, "/admin/v1/departments", &owner, None).await;
    let research = depts["data"][0]["id"].as_i64().unwrap();

    let invited = admin
        .ok(
            Method::POST,
            "/admin/v1/members",
            &admin_token,
            Some(json!({"email": "cy@acme.test", "role": "member", "department_id": research})),
        )
        .await;
    let cy = invited["id"].as_i64().unwrap();
    let otp = invited["one_time_password"].as_str().unwrap().to_owned();
    let (status, v) = admin
        .call(
            Method::POST,
            "/admin/v1/auth/login",
            None,
            Some(json!({"email": "cy@acme.test", "password": otp})),
        )
        .await;
    assert_eq!(status, 200);
    let cy_token = v["token"].as_str().unwrap().to_owned();
    let listed = admin
        .ok(Method::GET, "/admin/v1/members", &admin_token, None)
        .await;
    assert!(!listed.to_string().contains("password_hash"));
    assert!(
        !listed.to_string().contains(&otp),
        "the one-time password is shown once"
    );

    // Only the owner grants the owner role; the last owner stays.
    let (status, _) = admin
        .call(
            Method::PATCH,
            &format!("/admin/v1/members/{cy}"),
            Some(&admin_token),
            Some(json!({"role": "owner"})),
        )
        .await;
    assert_eq!(status, 403);
    let me = admin.ok(Method::GET, "/admin/v1/me", &owner, None).await;
    let owner_id = me["id"].as_i64().unwrap();
    let (status, v) = admin
        .call(
            Method::PATCH,
            &format!("/admin/v1/members/{owner_id}"),
            Some(&owner),
            Some(json!({"role": "admin"})),
        )
        .await;
    assert_eq!(status, 409, "{v}");

    // Cy's key works until cy is deactivated; then neither the key nor the token does.
    let key = admin
        .ok(
            Method::POST,
            "/admin/v1/keys",
            &cy_token,
            Some(json!({"name": "laptop"})),
        )
        .await;
    let plaintext = key["key"].as_str().unwrap().to_owned();
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        app.post_json("/v1/chat/completions", &plaintext, &chat)
            .await
            .status(),
        200
    );
    let changed = admin
        .ok(
            Method::PATCH,
            &format!("/admin/v1/members/{cy}"),
            &admin_token,
            Some(json!({"active": false, "department_id": null})),
        )
        .await;
    assert_eq!(
        (changed["active"].as_bool(), changed["department_id"].is_null()),
        (Some(false), true)
    );
    assert_eq!(
        app.post_json("/v1/chat/completions", &plaintext, &chat)
            .await
            .status(),
        401
    );
    let (status, _) = admin
        .call(Method::GET, "/admin/v1/me", Some(&cy_token), None)
        .await;
    assert_eq!(status, 401);

    // A deleted key stops at once.
    let ada = admin.login("ada@acme.test").await;
    let k = admin
        .ok(
            Method::POST,
            "/admin/v1/keys",
            &ada,
            Some(json!({"name": "temp"})),
        )
        .await;
    let temp = k["key"].as_str().unwrap().to_owned();
    assert_eq!(
        app.post_json("/v1/chat/completions", &temp, &chat).await.status(),
        200
    );
    admin
        .ok(Method::DELETE, &format!("/admin/v1/keys/{}", k["id"]), &ada, None)
        .await;
    assert_eq!(
        app.post_json("/v1/chat/completions", &temp, &chat).await.status(),
        401
    );
    app.stop().await;
}
