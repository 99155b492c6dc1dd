//! Members reach only what is theirs, and nothing of another workspace.

use super::*;

both_backends!(members_reach_only_their_own_and_no_one_another_workspace,);

async fn members_reach_only_their_own_and_no_one_another_workspace(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let (ada, bob, owner, boss) = (
        admin.login("ada@acme.test").await,
        admin.login("bob@acme.test").await,
        admin.login("owner@acme.test").await,
        admin.login("boss@other.test").await,
    );
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat).await.status(),
        200
    );
    let log = app.logs("acme", 1).await[0].clone();

    let keys = admin.ok(Method::GET, "/admin/v1/keys", &ada, None).await;
    let ada_key = keys["data"][0]["id"].as_i64().unwrap();
    assert_eq!(keys["data"].as_array().unwrap().len(), 1);
    assert_eq!(keys["data"][0]["prefix"].as_str().unwrap(), &KEY[..12]);
    assert!(!keys.to_string().contains(KEY), "the plaintext is never listed");

    // Bob, a member too, cannot see, delete or budget ada's key, nor read her logs.
    let bob_sees = admin.ok(Method::GET, "/admin/v1/keys", &bob, None).await;
    assert_eq!(bob_sees["data"].as_array().unwrap().len(), 0);
    for (m, path) in [
        (Method::GET, format!("/admin/v1/keys/{ada_key}")),
        (Method::GET, format!("/admin/v1/keys/{ada_key}/breaker")),
        (Method::DELETE, format!("/admin/v1/keys/{ada_key}")),
        (Method::GET, format!("/admin/v1/logs/{}", log.request_id)),
    ] {
        let (status, v) = admin.call(m.clone(), &path, Some(&bob), None).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (404, Some("not_found")),
            "{m} {path}"
        );
    }
    let budget =
        json!({"subject": "apikey", "target_id": ada_key, "metric": "requests", "window": "day", "limit": 1});
    let (status, v) = admin
        .call(
            Method::POST,
            "/admin/v1/policies",
            Some(&bob),
            Some(budget.clone()),
        )
        .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (422, Some("target_id")),
        "{v}"
    );
    let (status, _) = admin
        .call(
            Method::GET,
            &format!("/admin/v1/logs?member_id={}", log.member_id),
            Some(&bob),
            None,
        )
        .await;
    assert_eq!(status, 403);
    let bob_logs = admin.ok(Method::GET, "/admin/v1/logs", &bob, None).await;
    assert_eq!(bob_logs["data"].as_array().unwrap().len(), 0, "only his own logs");
    let ada_logs = admin.ok(Method::GET, "/admin/v1/logs", &ada, None).await;
    assert_eq!(ada_logs["data"].as_array().unwrap().len(), 1);

    // A member's budget on her own key works; a member policy is not hers to set.
    admin
        .ok(Method::POST, "/admin/v1/policies", &ada, Some(budget))
        .await;
    let member_policy = json!({"subject": "member", "target_id": log.member_id, "metric": "requests", "window": "day", "limit": 1});
    let (status, _) = admin
        .call(
            Method::POST,
            "/admin/v1/policies",
            Some(&ada),
            Some(member_policy),
        )
        .await;
    assert_eq!(status, 403);
    // An admin sets no department or workspace guardrail.
    let admin_token = admin.login("admin@acme.test").await;
    let ws_policy = json!({"subject": "ws", "metric": "requests", "window": "day", "limit": 1000});
    let (status, _) = admin
        .call(
            Method::POST,
            "/admin/v1/policies",
            Some(&admin_token),
            Some(ws_policy),
        )
        .await;
    assert_eq!(status, 403);

    // Every id of another workspace answers 404 to acme's owner, as if it did not exist.
    let theirs = |path: &'static str| {
        let boss = boss.clone();
        let admin = &admin;
        async move {
            admin.ok(Method::GET, path, &boss, None).await["data"][0]["id"]
                .as_i64()
                .unwrap()
        }
    };
    let (their_key, their_upstream, their_model) = (
        theirs("/admin/v1/keys").await,
        theirs("/admin/v1/upstreams").await,
        theirs("/admin/v1/models").await,
    );
    let their_member = admin.ok(Method::GET, "/admin/v1/me", &boss, None).await["id"]
        .as_i64()
        .unwrap();
    for path in [
        format!("/admin/v1/keys/{their_key}"),
        format!("/admin/v1/upstreams/{their_upstream}"),
        format!("/admin/v1/models/{their_model}"),
        format!("/admin/v1/members/{their_member}"),
    ] {
        let write = if path.contains("/members/") {
            Method::PATCH
        } else {
            Method::DELETE
        };
        for m in [Method::GET, write] {
            let (status, _) = admin.call(m.clone(), &path, Some(&owner), None).await;
            assert_eq!(status, 404, "{m} {path}");
        }
    }
    let (status, _) = admin
        .call(
            Method::POST,
            &format!("/admin/v1/upstreams/{their_upstream}/test"),
            Some(&owner),
            None,
        )
        .await;
    assert_eq!(status, 404);
    // Their things are untouched and still serve them.
    let r = app.post_json("/v1/chat/completions", OTHER_KEY, &chat).await;
    assert_eq!(r.status(), 200);
    app.stop().await;
}
