//! Finding requests in the logs (issue 46): failures only, and one request by the
//! `x-request-id` its client saw (as the README tells users to), in the list and the CSV export.

use super::*;

both_backends!(logs_find_failures_and_one_request_by_its_id,);

async fn logs_find_failures_and_one_request_by_its_id(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let ada = admin.login("ada@acme.test").await;
    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let ok = app
        .post_json("/v1/chat/completions", KEY, &chat("gpt-4o-mini"))
        .await;
    assert_eq!(ok.status(), 200);
    let failed = app
        .post_json("/v1/chat/completions", KEY, &chat("no-such-model"))
        .await;
    assert_eq!(failed.status(), 404);
    let id = |r: &reqwest::Response| r.headers()["x-request-id"].to_str().unwrap().to_owned();
    let (ok_id, failed_id) = (id(&ok), id(&failed));
    app.logs("acme", 2).await;
    let ids = |v: &Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["request_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (ok_id, failed_id) = (ok_id.as_str(), failed_id.as_str());

    let errors = admin
        .ok(Method::GET, "/admin/v1/logs?errors=true", &owner, None)
        .await;
    assert_eq!(ids(&errors), [failed_id]);
    let successes = admin
        .ok(Method::GET, "/admin/v1/logs?errors=false", &owner, None)
        .await;
    assert_eq!(ids(&successes), [ok_id]);

    let one = admin
        .ok(
            Method::GET,
            &format!("/admin/v1/logs?request_id={ok_id}"),
            &owner,
            None,
        )
        .await;
    assert_eq!(ids(&one), [ok_id]);
    // Pasted with the header's name and spaces, it is still found.
    let pasted = format!("/admin/v1/logs?request_id=%20x-request-id:%20{failed_id}%20");
    assert_eq!(
        ids(&admin.ok(Method::GET, &pasted, &owner, None).await),
        [failed_id]
    );
    let none = admin
        .ok(
            Method::GET,
            "/admin/v1/logs?request_id=no-such-request",
            &owner,
            None,
        )
        .await;
    assert!(ids(&none).is_empty());
    // The member whose key made it finds it too; the export holds the one row.
    let mine = admin
        .ok(
            Method::GET,
            &format!("/admin/v1/logs?request_id={ok_id}&errors=false"),
            &ada,
            None,
        )
        .await;
    assert_eq!(ids(&mine), [ok_id]);
    let csv = app
        .get_as(&format!("/admin/v1/logs/export?request_id={failed_id}"), &owner)
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(csv.lines().count(), 2, "{csv}");
    assert!(csv.contains(failed_id) && !csv.contains(ok_id));
    let (status, v) = admin
        .call(Method::GET, "/admin/v1/logs?errors=maybe", Some(&owner), None)
        .await;
    assert_eq!(status, 400, "{v}");
    app.stop().await;
}
