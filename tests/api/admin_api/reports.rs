//! Request logs, usage, the CSV export and quota standings.

use super::*;

both_backends!(
    usage_by_model_names_only_models_of_the_workspace,
    quota_standings_list_each_subject_near_its_limit,
    logs_usage_and_csv_export,
    a_keys_last_use_is_written_when_it_moves_by_a_minute,
);

/// A key's `last_used_at` is written behind with its logs, and only when it moves by a minute or
/// more: a key in constant use costs its row a write a minute, not one per log batch.
async fn a_keys_last_use_is_written_when_it_moves_by_a_minute(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    let last_used = || async {
        app.sync().await;
        let keys = admin.ok(Method::GET, "/admin/v1/keys", &owner, None).await;
        let ci = keys["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == "ci")
            .unwrap()
            .clone();
        ci["last_used_at"].as_i64()
    };
    assert_eq!(last_used().await, None, "never used");
    let start = app.clock.now();
    let start_ms = start.timestamp_millis();
    // (seconds after the first use, the stamp then stored)
    for (after, stamp) in [(0, 0), (30, 0), (59, 0), (60, 60), (100, 60), (125, 125)] {
        app.clock.set(start + chrono::Duration::seconds(after));
        assert_eq!(
            app.post_json("/v1/chat/completions", KEY, &chat).await.status(),
            200
        );
        assert_eq!(
            last_used().await,
            Some(start_ms + stamp * 1000),
            "used {after} s after the first use"
        );
    }
}

/// Usage by model lists the models of the workspace: a request for a model that does not
/// exist, or with no model at all, is not a model of its own but counts in one "other" row
/// (group ""); a request for a real model that no credential served still counts for it.
async fn usage_by_model_names_only_models_of_the_workspace(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let app_ref = &app;
    let send = |body: Value| async move {
        app_ref
            .post_json("/v1/chat/completions", KEY, &body)
            .await
            .status()
    };
    assert_eq!(send(chat("gpt-4o-mini")).await, 200);
    // The provider refuses the request itself: nothing served it, yet it asked for a real model.
    mock.script(Script::any().times(1).error(
        400,
        json!({"error": {"message": "bad request", "type": "invalid_request_error"}}),
    ));
    assert_eq!(send(chat("gpt-4o-mini")).await, 400);
    assert_eq!(send(chat("no-such-model")).await, 404);
    assert_eq!(send(json!({"messages": []})).await, 400);
    let logged = app.logs("acme", 4).await;
    assert_eq!(logged.len(), 4, "every request is logged");

    let u = admin
        .ok(Method::GET, "/admin/v1/usage?by=model", &owner, None)
        .await;
    let rows: Vec<(String, String, i64)> = u["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["group"].as_str().unwrap().to_owned(),
                r["label"].as_str().unwrap().to_owned(),
                r["requests"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            ("gpt-4o-mini".into(), "gpt-4o-mini".into(), 2),
            ("".into(), "Unknown or no model".into(), 2),
        ],
        "{u}"
    );
    app.stop().await;
}

/// The quotas that need attention: every subject at or above a share of its limit, a policy
/// on each member listing each member, fullest first, and nothing of another workspace.
async fn quota_standings_list_each_subject_near_its_limit(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let policy = |token: String, body: Value| {
        let admin = &admin;
        async move {
            admin
                .ok(Method::POST, "/admin/v1/policies", &token, Some(body))
                .await
        }
    };
    let keys = admin.ok(Method::GET, "/admin/v1/keys", &owner, None).await;
    let ci = keys["data"][0]["id"].as_i64().unwrap();
    policy(
        owner.clone(),
        json!({"subject": "apikey", "target_id": ci, "metric": "requests", "window": "day", "limit": 2}),
    )
    .await;
    policy(
        owner.clone(),
        json!({"subject": "member", "metric": "requests", "window": "day", "limit": 5}),
    )
    .await;
    // Another workspace whose member is at its limit under the same kind of counter.
    let boss = admin.login("boss@other.test").await;
    policy(
        boss,
        json!({"subject": "member", "metric": "requests", "window": "day", "limit": 1}),
    )
    .await;
    let bob = admin.login("bob@acme.test").await;
    let bob_key = admin
        .ok(
            Method::POST,
            "/admin/v1/keys",
            &bob,
            Some(json!({"name": "laptop"})),
        )
        .await["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    for (key, n) in [(KEY, 2), (bob_key.as_str(), 4), (OTHER_KEY, 1)] {
        for _ in 0..n {
            let r = app.post_json("/v1/chat/completions", key, &chat).await;
            assert_eq!(r.status(), 200, "{key}");
        }
    }

    let near = |query: &'static str, token: String| {
        let admin = &admin;
        async move {
            let v = admin
                .ok(
                    Method::GET,
                    &format!("/admin/v1/quota/standings{query}"),
                    &token,
                    None,
                )
                .await;
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    (
                        s["subject_name"].as_str().unwrap().to_owned(),
                        s["each"].as_bool().unwrap(),
                        s["used"].as_i64().unwrap(),
                        s["limit"].as_i64().unwrap(),
                        s["percent"].as_f64().unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        near("", owner.clone()).await,
        vec![
            ("ada@acme.test/ci".to_owned(), false, 2, 2, 100.0),
            ("bob@acme.test".to_owned(), true, 4, 5, 80.0),
        ]
    );
    assert_eq!(
        near("?min_percent=0", admin.login("admin@acme.test").await).await,
        vec![
            ("ada@acme.test/ci".to_owned(), false, 2, 2, 100.0),
            ("bob@acme.test".to_owned(), true, 4, 5, 80.0),
            ("ada@acme.test".to_owned(), true, 2, 5, 40.0),
        ],
        "an admin reads them too; each member is listed once"
    );
    let (status, v) = admin
        .call(
            Method::GET,
            "/admin/v1/quota/standings?min_percent=101",
            Some(&owner),
            None,
        )
        .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (422, Some("min_percent")),
        "{v}"
    );
    let (status, _) = admin
        .call(Method::GET, "/admin/v1/quota/standings", Some(&bob), None)
        .await;
    assert_eq!(status, 403, "a member reads only their own quota");
    app.stop().await;
}

async fn logs_usage_and_csv_export(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..3 {
        assert_eq!(
            app.post_json("/v1/chat/completions", KEY, &chat).await.status(),
            200
        );
    }
    let logs = app.logs("acme", 3).await;
    let tokens: i64 = logs.iter().map(|l| l.total_tokens).sum();

    let page = admin
        .ok(Method::GET, "/admin/v1/logs?limit=2", &owner, None)
        .await;
    assert_eq!(page["data"].as_array().unwrap().len(), 2);
    let cursor = page["next_cursor"].as_i64().unwrap();
    let rest = admin
        .ok(
            Method::GET,
            &format!("/admin/v1/logs?limit=2&cursor={cursor}"),
            &owner,
            None,
        )
        .await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 1);
    assert!(rest["next_cursor"].is_null());
    let filtered = admin
        .ok(
            Method::GET,
            "/admin/v1/logs?status=200&source=gateway",
            &owner,
            None,
        )
        .await;
    assert_eq!(
        filtered["data"].as_array().unwrap().len(),
        0,
        "successes have no error source"
    );

    for (by, label) in [
        ("model", "gpt-4o-mini"),
        ("key", "ada@acme.test/ci"),
        ("member", "ada@acme.test"),
        ("day", "2026-12-01"),
    ] {
        let u = admin
            .ok(Method::GET, &format!("/admin/v1/usage?by={by}"), &owner, None)
            .await;
        let rows = u["data"].as_array().unwrap();
        assert_eq!(rows.len(), 1, "{by}: {u}");
        assert_eq!(rows[0]["label"], label, "{by}");
        assert_eq!(
            (rows[0]["requests"].as_i64(), rows[0]["total_tokens"].as_i64()),
            (Some(3), Some(tokens)),
            "{by}"
        );
    }
    let bob = admin.login("bob@acme.test").await;
    let u = admin
        .ok(Method::GET, "/admin/v1/usage?by=model", &bob, None)
        .await;
    assert_eq!(
        u["data"].as_array().unwrap().len(),
        0,
        "a member sees only their own usage"
    );

    let r = app
        .get_as("/admin/v1/logs/export?model=gpt-4o-mini", &owner)
        .await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    let csv = r.text().await.unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 4, "{csv}");
    assert!(lines[0].starts_with("id,request_id,ts,"));
    assert!(lines[1..].iter().all(|l| l.contains(",gpt-4o-mini,")));
    let one = admin
        .ok(
            Method::GET,
            &format!("/admin/v1/logs/{}", logs[0].request_id),
            &owner,
            None,
        )
        .await;
    assert_eq!(one["request_id"], logs[0].request_id.as_str());
    // A key's last use is written behind with its logs.
    app.sync().await;
    let keys = admin.ok(Method::GET, "/admin/v1/keys", &owner, None).await;
    let ci = keys["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "ci")
        .unwrap()
        .clone();
    assert!(ci["last_used_at"].as_i64().is_some(), "{ci}");
    assert_eq!(ci["member_email"], "ada@acme.test");

    // Text a client chose (here the model asked for) cannot become a spreadsheet formula, even
    // behind a TAB or a CR that some spreadsheets skip.
    for model in ["=1+2", "\t=1+2", "\r=1+2", "@SUM(A1)"] {
        let bad = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(
            app.post_json("/v1/chat/completions", KEY, &bad).await.status(),
            404
        );
    }
    app.logs("acme", 7).await;
    let r = app.get_as("/admin/v1/logs/export?status=404", &owner).await;
    assert_eq!(r.status(), 200);
    let csv = r.text().await.unwrap();
    for cell in [",'=1+2,", ",'\t=1+2,", ",\"'\r=1+2\",", ",'@SUM(A1),"] {
        assert!(csv.contains(cell), "{cell:?} in {csv}");
    }
    app.stop().await;
}
