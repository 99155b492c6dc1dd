//! The audit log names each target as people know it (issue 46: not "api_key #5").

use super::*;

both_backends!(the_audit_log_names_its_targets,);

async fn the_audit_log_names_its_targets(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let bob = app.member_id(&owner, "bob@acme.test").await;
    let key = admin
        .ok(
            Method::POST,
            "/admin/v1/keys",
            &owner,
            Some(json!({"name": "deploy", "member_id": bob})),
        )
        .await;
    let policy = json!({"subject": "apikey", "target_id": key["id"], "metric": "requests", "window": "day", "limit": 10});
    admin
        .ok(Method::POST, "/admin/v1/policies", &owner, Some(policy))
        .await;
    admin
        .ok(
            Method::POST,
            &format!("/admin/v1/members/{bob}/reset-password"),
            &owner,
            None,
        )
        .await;
    admin
        .ok(
            Method::DELETE,
            &format!("/admin/v1/keys/{}", key["id"]),
            &owner,
            None,
        )
        .await;
    let audit = admin.ok(Method::GET, "/admin/v1/audit", &owner, None).await;
    let names: Vec<(String, String, Option<String>)> = audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_owned(),
                e["target_kind"].as_str().unwrap().to_owned(),
                e["target_name"].as_str().map(str::to_owned),
            )
        })
        .collect();
    let has = |action: &str, kind: &str, name: &str| {
        assert!(
            names.contains(&(action.to_owned(), kind.to_owned(), Some(name.to_owned()))),
            "{action} {kind} {name} not in {names:?}"
        );
    };
    has("create", "api_key", "bob@acme.test/deploy");
    has("delete", "api_key", "bob@acme.test/deploy");
    has("create", "policy", "apikey bob@acme.test/deploy 10 requests/day");
    // The reset records no entity: the member is named as they are now.
    has("reset_password", "member", "bob@acme.test");
    app.stop().await;
}
