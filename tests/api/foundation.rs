//! Health, readiness, request ids, restarts and the bootstrap owner.

use aigw::store::{MemberStore, Role, WorkspaceStore};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestDb, spawn_app};

both_backends!(
    health_and_readiness,
    data_survive_a_restart,
    bootstrap_owner_from_settings,
    unknown_route_is_a_gateway_error
);

async fn health_and_readiness(db: TestDb) {
    let app = spawn_app(&db, Setup::default()).await;
    let r = app.get("/healthz").await;
    assert_eq!(r.status(), 200);
    let id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    let uuid = uuid::Uuid::parse_str(&id).expect("x-request-id is a UUID");
    assert_eq!(uuid.get_version_num(), 7, "UUID v7");
    let r = app.get("/readyz").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "ready");
    app.stop().await;
}

async fn unknown_route_is_a_gateway_error(db: TestDb) {
    let app = spawn_app(&db, Setup::default()).await;
    let r = app.get("/v2/nothing").await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
    assert!(r.headers().contains_key("x-request-id"));
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    app.stop().await;
}

async fn data_survive_a_restart(db: TestDb) {
    let resources = ResourcesBuilder::new()
        .workspace("acme")
        .department("acme", "research")
        .member("acme", "ada@acme.test", "admin")
        .with("department", "research");
    let app = spawn_app(&db, Setup::resources(resources)).await;
    app.stop().await;
    // Second start without the file: everything is still there.
    let app = spawn_app(&db, Setup::default()).await;
    let ws = app
        .state
        .store
        .workspace_by_name("acme")
        .await
        .unwrap()
        .expect("workspace kept");
    let ada = app
        .state
        .store
        .member_by_email("ada@acme.test")
        .await
        .unwrap()
        .expect("member kept");
    assert_eq!(ada.workspace_id, ws.id);
    assert_eq!(ada.role(), Role::Admin);
    assert!(ada.department_id.is_some());
    app.stop().await;
}

async fn bootstrap_owner_from_settings(db: TestDb) {
    let app = spawn_app(&db, Setup::default()).await;
    let owner = app
        .state
        .store
        .member_by_email("owner@example.test")
        .await
        .unwrap()
        .expect("owner created");
    assert_eq!(owner.role(), Role::Owner);
    let hash = owner.password_hash.clone().expect("password set");
    assert!(aigw::kernel::crypto::verify_password("owner-password", &hash));
    assert_eq!(app.state.store.count_owners().await.unwrap(), 1);
    app.stop().await;
    // A second start does not create another owner or change the password.
    let app = spawn_app(&db, Setup::default()).await;
    assert_eq!(app.state.store.count_owners().await.unwrap(), 1);
    let again = app
        .state
        .store
        .member_by_email("owner@example.test")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.password_hash.as_deref(), Some(hash.as_str()));
    app.stop().await;
}
