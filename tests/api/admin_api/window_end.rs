//! The console shows when a quota's window ends (issue 46: a per-minute quota read "resets in
//! 2m 37s"); `reset_at`, one to two minutes later and spread per subject, stays for clients.

use super::*;

both_backends!(guardrails_and_my_quota_name_the_window_end,);

async fn guardrails_and_my_quota_name_the_window_end(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    // 10:00:23 in the workspace's zone (Asia/Shanghai).
    app.clock.advance(chrono::Duration::seconds(23));
    let owner = admin.login("owner@acme.test").await;
    let ada = admin.login("ada@acme.test").await;
    let keys = admin.ok(Method::GET, "/admin/v1/keys", &ada, None).await;
    let key = keys["data"][0]["id"].clone();
    let per_minute =
        json!({"subject": "apikey", "target_id": key, "metric": "requests", "window": "minute", "limit": 5});
    let policy = admin
        .ok(Method::POST, "/admin/v1/policies", &owner, Some(per_minute))
        .await;
    let end = "2026-12-01T10:01:00+08:00";
    let read = |v: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(v[field].as_str().unwrap_or_else(|| panic!("{field} in {v}")))
            .unwrap()
    };
    let policy = admin
        .ok(
            Method::GET,
            &format!("/admin/v1/policies/{}", policy["id"]),
            &owner,
            None,
        )
        .await;
    assert_eq!(policy["window_end"], end, "{policy}");
    let spread = (read(&policy, "reset_at") - read(&policy, "window_end")).num_seconds();
    assert!(
        (60..=120).contains(&spread),
        "reset_at is {spread} s after the end"
    );

    let mine = admin.ok(Method::GET, "/admin/v1/me/quota", &ada, None).await;
    let row = mine["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["window"] == "minute")
        .unwrap()
        .clone();
    assert_eq!(row["window_end"], end, "{row}");

    // The overview's list of standings (every one, from 0 %) names it too.
    let standings = admin
        .ok(
            Method::GET,
            "/admin/v1/quota/standings?min_percent=0",
            &owner,
            None,
        )
        .await;
    let minute = standings["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["window"] == "minute")
        .unwrap()
        .clone();
    assert_eq!(minute["window_end"], end, "{minute}");
    app.stop().await;
}
