//! Guardrails (policies) changed through the admin API: enforced on the next request, on
//! this gateway and the others, audited, and changed only by those allowed to.

use super::*;

both_backends!(
    a_guardrail_change_is_enforced_on_the_next_request_and_audited,
    a_member_changes_only_the_budgets_it_set,
);

async fn a_guardrail_change_is_enforced_on_the_next_request_and_audited(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let ada = app.member_id(&owner, "ada@acme.test").await;
    let body =
        json!({"subject": "member", "target_id": ada, "metric": "requests", "window": "day", "limit": 1});
    let policy = admin
        .ok(Method::POST, "/admin/v1/policies", &owner, Some(body))
        .await;
    assert_eq!(policy["target"], "ada@acme.test");
    assert_eq!(
        (policy["used"].as_i64(), policy["remaining"].as_i64()),
        (Some(0), Some(1))
    );
    let id = policy["id"].as_i64().unwrap();

    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat).await.status(),
        200
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "quota_exceeded");
    assert_eq!(
        v["error"]["message"],
        "rate limit exceeded on member requests/day"
    );
    let shown = admin
        .ok(Method::GET, &format!("/admin/v1/policies/{id}"), &owner, None)
        .await;
    assert_eq!(shown["used"], 1, "the refused request does not count");

    // Raising the limit keeps the usage and lets the next request through at once.
    admin
        .ok(
            Method::PATCH,
            &format!("/admin/v1/policies/{id}"),
            &owner,
            Some(json!({"limit": 5})),
        )
        .await;
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat).await.status(),
        200
    );
    let shown = admin
        .ok(Method::GET, &format!("/admin/v1/policies/{id}"), &owner, None)
        .await;
    assert_eq!(shown["used"], 2);

    let audit = admin.ok(Method::GET, "/admin/v1/audit", &owner, None).await;
    let entries = audit["data"].as_array().unwrap();
    let update = entries
        .iter()
        .find(|e| e["action"] == "update" && e["target_kind"] == "policy")
        .expect("the change is audited");
    assert_eq!(update["actor_email"], "owner@acme.test");
    assert_eq!(update["target_id"], id);
    assert_eq!(
        (
            update["before"]["limit"].as_i64(),
            update["after"]["limit"].as_i64()
        ),
        (Some(1), Some(5))
    );
    assert!(
        entries
            .iter()
            .any(|e| e["action"] == "create" && e["target_kind"] == "policy")
    );
    // Deleting it lifts it.
    admin
        .ok(Method::DELETE, &format!("/admin/v1/policies/{id}"), &owner, None)
        .await;
    let (status, _) = admin
        .call(
            Method::GET,
            &format!("/admin/v1/policies/{id}"),
            Some(&owner),
            None,
        )
        .await;
    assert_eq!(status, 404);
    app.stop().await;
}

/// A limit set over a member by an owner or admin (or by the resources file) is read-only to
/// that member, on its own key too; the member keeps full control of the budgets it set itself;
/// owners and admins change everything as before.
async fn a_member_changes_only_the_budgets_it_set(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let (ada, owner, admin_token) = (
        admin.login("ada@acme.test").await,
        admin.login("owner@acme.test").await,
        admin.login("admin@acme.test").await,
    );
    let key = admin
        .ok(
            Method::POST,
            "/admin/v1/keys",
            &ada,
            Some(json!({"name": "laptop"})),
        )
        .await;
    let key_id = key["id"].as_i64().unwrap();
    let plaintext = key["key"].as_str().unwrap().to_owned();
    let budget = |metric: &str, limit: i64| json!({"subject": "apikey", "target_id": key_id, "metric": metric, "window": "day", "limit": limit});
    let set = async |token: &str, metric: &str, limit: i64| {
        admin
            .ok(
                Method::POST,
                "/admin/v1/policies",
                token,
                Some(budget(metric, limit)),
            )
            .await["id"]
            .as_i64()
            .unwrap()
    };
    let path = |id: i64| format!("/admin/v1/policies/{id}");
    let lift = json!({"limit": 1_000_000_000});
    let refused = async |method: Method, id: i64, body: Option<Value>| {
        let (status, v) = admin.call(method.clone(), &path(id), Some(&ada), body).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (403, Some("forbidden")),
            "{method} policy {id}: {v}"
        );
        let message = v["error"]["message"].as_str().unwrap_or_default().to_owned();
        assert!(
            message.contains("set by an owner or admin") && message.contains("only an owner or admin can"),
            "{method}: the refusal names who can change it: {message}"
        );
    };

    // The owner caps ada's key at 2 requests a day: ada sees it, and can neither lift it nor
    // delete it.
    let capped = set(&owner, "requests", 2).await;
    let seen = admin.ok(Method::GET, &path(capped), &ada, None).await;
    assert_eq!(
        (seen["limit"].as_i64(), seen["created_by"].is_i64()),
        (Some(2), true)
    );
    let listed = admin.ok(Method::GET, "/admin/v1/policies", &ada, None).await;
    assert!(
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["id"] == capped)
    );
    refused(Method::PATCH, capped, Some(lift.clone())).await;
    refused(Method::PATCH, capped, Some(json!({"mode": "shadow"}))).await;
    refused(Method::DELETE, capped, None).await;
    let after = admin.ok(Method::GET, &path(capped), &owner, None).await;
    assert_eq!(
        (after["limit"].as_i64(), after["mode"].as_str()),
        (Some(2), Some("enforce"))
    );
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    let statuses = [
        app.post_json("/v1/chat/completions", &plaintext, &chat)
            .await
            .status(),
        app.post_json("/v1/chat/completions", &plaintext, &chat)
            .await
            .status(),
        app.post_json("/v1/chat/completions", &plaintext, &chat)
            .await
            .status(),
    ];
    assert_eq!(
        statuses.map(|s| s.as_u16()),
        [200, 200, 429],
        "the cap still holds"
    );

    // An admin's budget on the key is read-only to ada too; the admin changes the owner's.
    let admins = set(&admin_token, "total_tokens", 100_000).await;
    refused(Method::PATCH, admins, Some(lift.clone())).await;
    refused(Method::DELETE, admins, None).await;
    admin
        .ok(
            Method::PATCH,
            &path(capped),
            &admin_token,
            Some(json!({"limit": 3})),
        )
        .await;

    // Ada's own budget on her own key is hers: she changes and deletes it.
    let own = set(&ada, "prompt_tokens", 500).await;
    let changed = admin
        .ok(Method::PATCH, &path(own), &ada, Some(json!({"limit": 900})))
        .await;
    assert_eq!(changed["limit"], 900);
    admin.ok(Method::DELETE, &path(own), &ada, None).await;

    // Once an owner changes a budget ada set, the limit is the owner's: read-only to her.
    let own = set(&ada, "completion_tokens", 500).await;
    admin
        .ok(Method::PATCH, &path(own), &owner, Some(json!({"limit": 100})))
        .await;
    refused(Method::PATCH, own, Some(lift.clone())).await;
    refused(Method::DELETE, own, None).await;

    // The owner changes and deletes everything as before.
    for id in [capped, admins, own] {
        admin
            .ok(Method::PATCH, &path(id), &owner, Some(json!({"limit": 7})))
            .await;
        admin.ok(Method::DELETE, &path(id), &owner, None).await;
    }
    app.stop().await;

    // A policy from the resources file counts as set by an owner or admin, whether it is new
    // or takes over a budget ada had set herself.
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let ada = admin.login("ada@acme.test").await;
    let hers = admin
        .ok(
            Method::POST,
            "/admin/v1/policies",
            &ada,
            Some(budget("requests", 5)),
        )
        .await["id"]
        .as_i64()
        .unwrap();
    app.stop().await;
    let file_policy = |metric: &str| {
        format!(
            "\n[[policy]]\nworkspace = \"acme\"\nsubject = \"apikey\"\ntarget = \"ada@acme.test/laptop\"\n\
             metric = \"{metric}\"\nwindow = \"day\"\nlimit = 4\n"
        )
    };
    let text = resources(&mock) + &file_policy("requests") + &file_policy("total_tokens");
    let app = spawn_app(&db, Setup::resources(text)).await;
    let admin = Admin { app: &app };
    let ada = admin.login("ada@acme.test").await;
    let listed = admin.ok(Method::GET, "/admin/v1/policies", &ada, None).await;
    let from_file: Vec<i64> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert!(p["created_by"].is_null(), "{p}");
            p["id"].as_i64().unwrap()
        })
        .collect();
    assert_eq!(from_file.len(), 2, "{listed}");
    assert!(
        from_file.contains(&hers),
        "the file took over ada's budget in place"
    );
    let refused = async |method: Method, id: i64, body: Option<Value>| {
        let (status, v) = admin.call(method.clone(), &path(id), Some(&ada), body).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (403, Some("forbidden")),
            "{method} file policy {id}: {v}"
        );
    };
    for id in from_file {
        refused(Method::PATCH, id, Some(lift.clone())).await;
        refused(Method::DELETE, id, None).await;
    }
    app.stop().await;
}

/// A change made through one gateway is enforced by another on the same database without a
/// restart (the configuration epoch every gateway polls).
#[tokio::test]
async fn a_change_on_one_gateway_reaches_the_other() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let a = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let b = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &a };
    let owner = admin.login("owner@acme.test").await;
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        b.post_json("/v1/chat/completions", KEY, &chat).await.status(),
        200
    );
    let body = json!({"subject": "ws", "metric": "requests", "window": "day", "limit": 0});
    admin
        .ok(Method::POST, "/admin/v1/policies", &owner, Some(body))
        .await;
    b.sync().await;
    assert_eq!(
        b.post_json("/v1/chat/completions", KEY, &chat).await.status(),
        429,
        "the other gateway enforces the new limit"
    );
    a.stop().await;
    b.stop().await;
}
