//! Bad inputs name their field; upstream secrets are write-only.

use super::*;

both_backends!(
    limits_and_prices_that_cannot_be_stored_are_refused,
    bad_inputs_name_the_field,
    the_upstream_secret_is_write_only,
    absurd_instants_in_a_usage_report_are_answered,
);

async fn bad_inputs_name_the_field(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let policy = |patch: Value| {
        let mut p = json!({"subject": "ws", "metric": "requests", "window": "day", "limit": 10});
        for (k, v) in patch.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    };
    let upstream = |patch: Value| {
        let mut u = json!({"name": unique("u"), "provider": "openai", "api_key": "x", "models": ["m"]});
        for (k, v) in patch.as_object().unwrap() {
            u[k] = v.clone();
        }
        u
    };
    // (what, method, path, body, status, code, param)
    type Case<'a> = (&'a str, Method, &'a str, Value, u16, &'a str, Option<&'a str>);
    let cases: Vec<Case> = vec![
        (
            "unknown field",
            Method::POST,
            "/admin/v1/departments",
            json!({"name": "x", "colour": "red"}),
            400,
            "invalid_request_error",
            Some("colour"),
        ),
        (
            "missing field",
            Method::POST,
            "/admin/v1/departments",
            json!({}),
            400,
            "invalid_request_error",
            Some("name"),
        ),
        (
            "wrong type",
            Method::POST,
            "/admin/v1/policies",
            policy(json!({"limit": "ten"})),
            400,
            "invalid_request_error",
            None,
        ),
        (
            "blank name",
            Method::POST,
            "/admin/v1/departments",
            json!({"name": "  "}),
            422,
            "invalid_field",
            Some("name"),
        ),
        (
            "duplicate name",
            Method::POST,
            "/admin/v1/departments",
            json!({"name": "research"}),
            409,
            "conflict",
            None,
        ),
        (
            "bad subject",
            Method::POST,
            "/admin/v1/policies",
            policy(json!({"subject": "team"})),
            422,
            "invalid_field",
            Some("subject"),
        ),
        (
            "bad metric",
            Method::POST,
            "/admin/v1/policies",
            policy(json!({"metric": "bytes"})),
            422,
            "invalid_field",
            Some("metric"),
        ),
        (
            "bad window",
            Method::POST,
            "/admin/v1/policies",
            policy(json!({"window": "7minutes"})),
            422,
            "invalid_field",
            Some("window"),
        ),
        (
            "negative limit",
            Method::POST,
            "/admin/v1/policies",
            policy(json!({"limit": -1})),
            422,
            "invalid_field",
            Some("limit"),
        ),
        (
            "fractional requests",
            Method::POST,
            "/admin/v1/policies",
            policy(json!({"limit": 1.5})),
            422,
            "invalid_field",
            Some("limit"),
        ),
        (
            "bad mode",
            Method::POST,
            "/admin/v1/policies",
            policy(json!({"mode": "loud"})),
            422,
            "invalid_field",
            Some("mode"),
        ),
        (
            "missing target",
            Method::POST,
            "/admin/v1/policies",
            policy(json!({"subject": "member", "target_id": 999999})),
            422,
            "invalid_field",
            Some("target_id"),
        ),
        (
            "bad provider",
            Method::POST,
            "/admin/v1/upstreams",
            upstream(json!({"provider": "acme-ai"})),
            422,
            "invalid_field",
            Some("provider"),
        ),
        (
            "bad base_url",
            Method::POST,
            "/admin/v1/upstreams",
            upstream(json!({"base_url": "ftp://x"})),
            422,
            "invalid_field",
            Some("base_url"),
        ),
        (
            "no base_url",
            Method::POST,
            "/admin/v1/upstreams",
            upstream(json!({"provider": "openai-compatible"})),
            422,
            "invalid_field",
            Some("base_url"),
        ),
        (
            "no secret",
            Method::POST,
            "/admin/v1/upstreams",
            json!({"name": "n", "provider": "openai"}),
            422,
            "invalid_field",
            Some("api_key"),
        ),
        (
            "zero weight",
            Method::POST,
            "/admin/v1/upstreams",
            upstream(json!({"weight": 0})),
            422,
            "invalid_field",
            Some("weight"),
        ),
        (
            "zero limit",
            Method::POST,
            "/admin/v1/upstreams",
            upstream(json!({"limits": {"requests_per_minute": 0}})),
            422,
            "invalid_field",
            Some("limits.requests_per_minute"),
        ),
        (
            "bad timezone",
            Method::PATCH,
            "/admin/v1/workspace",
            json!({"timezone": "Mars/Olympus"}),
            422,
            "invalid_field",
            Some("timezone"),
        ),
        (
            "bad role",
            Method::POST,
            "/admin/v1/members",
            json!({"email": "x@acme.test", "role": "king"}),
            422,
            "invalid_field",
            Some("role"),
        ),
        (
            "bad email",
            Method::POST,
            "/admin/v1/members",
            json!({"email": "nobody", "role": "member"}),
            422,
            "invalid_field",
            Some("email"),
        ),
        (
            "taken email",
            Method::POST,
            "/admin/v1/members",
            json!({"email": "ada@acme.test", "role": "member"}),
            409,
            "conflict",
            None,
        ),
        (
            "self fallback",
            Method::POST,
            "/admin/v1/models",
            json!({"name": "loop", "fallbacks": ["loop"]}),
            422,
            "invalid_field",
            Some("fallbacks"),
        ),
        (
            "unknown fallback",
            Method::POST,
            "/admin/v1/models",
            json!({"name": "x", "fallbacks": ["ghost"]}),
            422,
            "invalid_field",
            Some("fallbacks"),
        ),
        (
            "negative price",
            Method::POST,
            "/admin/v1/models",
            json!({"name": "x", "price": {"prompt": -1}}),
            422,
            "invalid_field",
            Some("price"),
        ),
        (
            "non-numeric id",
            Method::GET,
            "/admin/v1/keys/abc",
            Value::Null,
            404,
            "not_found",
            None,
        ),
        (
            "unknown id",
            Method::DELETE,
            "/admin/v1/policies/999999",
            Value::Null,
            404,
            "not_found",
            None,
        ),
        (
            "no such method",
            Method::DELETE,
            "/admin/v1/members/1",
            Value::Null,
            405,
            "method_not_allowed",
            None,
        ),
        (
            "bad grouping",
            Method::GET,
            "/admin/v1/usage?by=planet",
            Value::Null,
            422,
            "invalid_field",
            Some("by"),
        ),
        (
            "bad log filter",
            Method::GET,
            "/admin/v1/logs?status=abc",
            Value::Null,
            400,
            "invalid_request_error",
            None,
        ),
        (
            "unknown log filter",
            Method::GET,
            "/admin/v1/logs?colour=red",
            Value::Null,
            400,
            "invalid_request_error",
            None,
        ),
        (
            "bad source",
            Method::GET,
            "/admin/v1/logs?source=moon",
            Value::Null,
            422,
            "invalid_field",
            Some("source"),
        ),
    ];
    for (what, method, path, body, status, code, param) in cases {
        let body = (!body.is_null()).then_some(body);
        let (got, v) = admin.call(method, path, Some(&owner), body).await;
        assert_eq!(got, status, "{what}: {v}");
        assert_eq!(v["error"]["code"], code, "{what}: {v}");
        assert_eq!(v["error"]["param"].as_str(), param, "{what}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty(), "{what}");
    }
    // Malformed JSON.
    let r = app
        .client
        .post(format!("{}/admin/v1/departments", app.address))
        .bearer_auth(&owner)
        .header("content-type", "application/json")
        .body("{\"name\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    app.stop().await;
}

async fn the_upstream_secret_is_write_only(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let body = json!({"name": "secretive", "provider": "openai-compatible", "base_url": mock.base_url(),
        "api_key": UPSTREAM_SECRET, "models": [{"name": "gpt-4o-mini", "upstream": "gpt-4o-mini"}],
        "limits": {"requests_per_minute": 20}, "quota_group": "acct-1"});
    let created = admin
        .ok(Method::POST, "/admin/v1/upstreams", &owner, Some(body))
        .await;
    let id = created["id"].as_i64().unwrap();
    assert_eq!(created["limits"]["requests_per_minute"], 20);
    assert_eq!(created["quota_group"], "acct-1");
    let replaced = format!("{UPSTREAM_SECRET}-2");
    let mut seen = vec![created.to_string()];
    seen.push(
        admin
            .ok(
                Method::PATCH,
                &format!("/admin/v1/upstreams/{id}"),
                &owner,
                Some(json!({"api_key": replaced, "quota_group": null})),
            )
            .await
            .to_string(),
    );
    seen.push(
        admin
            .ok(Method::GET, &format!("/admin/v1/upstreams/{id}"), &owner, None)
            .await
            .to_string(),
    );
    seen.push(
        admin
            .ok(Method::GET, "/admin/v1/upstreams", &owner, None)
            .await
            .to_string(),
    );
    seen.push(
        admin
            .ok(Method::GET, "/admin/v1/audit", &owner, None)
            .await
            .to_string(),
    );
    seen.push(
        admin
            .ok(
                Method::POST,
                &format!("/admin/v1/upstreams/{id}/test"),
                &owner,
                None,
            )
            .await
            .to_string(),
    );
    for text in &seen {
        assert!(!text.contains(UPSTREAM_SECRET), "the secret came back: {text}");
    }
    // The credential really uses the new secret.
    let calls = mock.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.credential.as_deref() == Some(replaced.as_str()))
    );
    let row = aigw::store::UpstreamStore::upstream(&app.state.store, id)
        .await
        .unwrap()
        .unwrap();
    assert!(!row.secret_sealed.contains(UPSTREAM_SECRET), "sealed at rest");
    assert_eq!(row.quota_group, None, "null clears the quota group");
    app.stop().await;
}

/// A usage report over instants no log can have (schemathesis found `from=i64::MIN` closing the
/// connection: the hour arithmetic overflowed): answered, never a dropped connection.
async fn absurd_instants_in_a_usage_report_are_answered(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let (min, max) = (i64::MIN, i64::MAX);
    for (query, want) in [
        (format!("by=day&from={min}"), 200),
        (format!("by=model&from={min}&to={max}"), 200),
        (format!("by=day&to={min}"), 422),
        (format!("by=key&from={}&to={max}", max - 1), 422),
    ] {
        let (status, body) = admin
            .call(
                Method::GET,
                &format!("/admin/v1/usage?{query}"),
                Some(&owner),
                None,
            )
            .await;
        assert_eq!(status, want, "{query}: {body}");
    }
}

/// A credits limit is stored in micro-credits (a 64-bit integer): one beyond it is refused
/// naming the field and the bound, never saturated; a price says its real bound.
async fn limits_and_prices_that_cannot_be_stored_are_refused(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let credits = |limit: f64| json!({"subject": "ws", "metric": "credits", "window": "day", "limit": limit});
    let refused = |(status, v): (u16, Value), field: &str, bound: &str| {
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (422, Some("invalid_field")),
            "{v}"
        );
        assert_eq!(v["error"]["param"], field, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(bound), "{message}");
        assert!(!message.contains("non-negative"), "{message}");
    };
    let r = admin
        .call(
            Method::POST,
            "/admin/v1/policies",
            Some(&owner),
            Some(credits(8.9e15)),
        )
        .await;
    refused(r, "limit", "9,223,372,036,854");
    // The most that is stored is kept exactly.
    let (status, created) = admin
        .call(
            Method::POST,
            "/admin/v1/policies",
            Some(&owner),
            Some(credits(9_223_372_036_854.0)),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["limit"].as_f64(), Some(9_223_372_036_854.0), "{created}");
    let path = format!("/admin/v1/policies/{}", created["id"]);
    let r = admin
        .call(Method::PATCH, &path, Some(&owner), Some(json!({"limit": 9.3e12})))
        .await;
    refused(r, "limit", "9,223,372,036,854");
    let (_, got) = admin.call(Method::GET, &path, Some(&owner), None).await;
    assert_eq!(got["limit"].as_f64(), Some(9_223_372_036_854.0), "{got}");
    let r = admin
        .call(
            Method::POST,
            "/admin/v1/models",
            Some(&owner),
            Some(json!({"name": "dear", "price": {"prompt": 1.0e9, "completion": 0}})),
        )
        .await;
    refused(r, "price", "1,000,000,000");
    app.stop().await;
}
