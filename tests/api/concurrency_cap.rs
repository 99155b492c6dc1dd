//! Per-key and per-member concurrency caps (issue 25 item 4): with `max_in_flight` n, the
//! (n+1)th request while n are open is a 429 `concurrency_limit` with a short `Retry-After`,
//! counted toward the breaker; a place is released when its request ends, a stream finished or
//! cut included.

use std::time::{Duration, Instant};

use aigw::kernel::caller::Guarded;
use aigw::mock_upstream::{MockUpstream, Script};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{TestApp, TestDb};
use crate::model_allow_list::{OTHER, OWNER, OWNER_PASSWORD, admin, key_id, patch, start};
use crate::proxy::KEY;

fn chat(stream: bool) -> Value {
    json!({"model": "gpt-4o-mini", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

/// A stream the upstream keeps open after its first chunk (the gateway's idle deadline is far
/// away): read until that chunk arrived, then held by the caller; dropping it cuts it.
async fn open_stream(app: &TestApp, mock: &MockUpstream, key: &str) -> impl Sized + use<> {
    mock.script(Script {
        stall_after_chunks: Some(1),
        ..Script::any().times(1)
    });
    let r = app.post_json("/v1/chat/completions", key, &chat(true)).await;
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    body
}

/// Waits until the gateway counts `n` requests in flight for `by` `id` (a cut stream is noticed
/// when its connection closes, a moment after the client dropped it).
async fn until_in_flight(app: &TestApp, by: Guarded, id: i64, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.state.in_flight.count(by, id) != n {
        assert!(
            Instant::now() < deadline,
            "{by:?} {id}: {} in flight, expected {n}",
            app.state.in_flight.count(by, id)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn assert_over_cap(
    status: u16,
    headers: &reqwest::header::HeaderMap,
    body: &Value,
    subject: &str,
    limit: u32,
) {
    assert_eq!(status, 429, "{body}");
    let e = &body["error"];
    assert_eq!(e["code"], "concurrency_limit", "{body}");
    assert_eq!(e["type"], "rate_limit_error");
    assert_eq!(e["subject"], subject);
    assert_eq!(e["limit"], limit);
    assert_eq!(e["retry_after"], 2);
    assert_eq!(headers["retry-after"], "2");
    assert_eq!(headers["retry-after-ms"], "2000");
    assert_eq!(headers["x-aigw-error-source"], "gateway");
    assert!(
        headers.get("x-should-retry").is_none(),
        "a short wait the SDKs sit out"
    );
}

async fn send(app: &TestApp, key: &str, stream: bool) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = app.post_json("/v1/chat/completions", key, &chat(stream)).await;
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

both_backends!(
    the_cap_refuses_the_next_request_while_n_are_open,
    a_members_cap_spans_their_keys,
    refusals_count_toward_the_breaker,
    the_admin_api_checks_the_new_fields,
);

async fn the_cap_refuses_the_next_request_while_n_are_open(db: TestDb) {
    let extra = "[[policy]]\nworkspace = \"acme\"\nsubject = \"apikey\"\ntarget = \"ada@acme.test/ci\"\n\
                 metric = \"requests\"\nwindow = \"day\"\nlimit = 1000\n";
    let (app, mock) = start(&db, extra).await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let key = key_id(&app, &token, "ci").await;
    let set = patch(
        &app,
        &token,
        &format!("/admin/v1/keys/{key}"),
        json!({"max_in_flight": 2}),
    )
    .await;
    assert_eq!(set["max_in_flight"], 2);
    // Requests one after another never meet the cap: each releases its place when it ends.
    for stream in [false, true, false, true] {
        assert_eq!(send(&app, KEY, stream).await.0, 200);
    }
    assert_eq!(app.state.in_flight.count(Guarded::Key, key), 0);

    let first = open_stream(&app, &mock, KEY).await;
    let second = open_stream(&app, &mock, KEY).await;
    assert_eq!(app.state.in_flight.count(Guarded::Key, key), 2);
    let calls = mock.call_count();
    for stream in [false, true] {
        let (status, headers, body) = send(&app, KEY, stream).await;
        assert_over_cap(status, &headers, &body, "apikey", 2);
        assert!(
            headers.contains_key("x-aigw-quota-requests-remaining"),
            "past the quota check: its headers"
        );
    }
    assert_eq!(mock.call_count(), calls, "nothing went upstream");
    assert_eq!(
        send(&app, OTHER, false).await.0,
        200,
        "another key of the member is not capped"
    );

    // A cut stream frees its place.
    drop(first);
    until_in_flight(&app, Guarded::Key, key, 1).await;
    assert_eq!(send(&app, KEY, false).await.0, 200);
    let third = open_stream(&app, &mock, KEY).await;
    assert_over_cap_now(&app).await;
    drop((second, third));
    until_in_flight(&app, Guarded::Key, key, 0).await;
    // Lifted with null.
    patch(
        &app,
        &token,
        &format!("/admin/v1/keys/{key}"),
        json!({"max_in_flight": null}),
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(open_stream(&app, &mock, KEY).await);
    }
    assert_eq!(send(&app, KEY, false).await.0, 200, "no cap");
    let logs = app.logs("acme", 13).await;
    let refused: Vec<_> = logs
        .iter()
        .filter(|l| l.code.as_deref() == Some("concurrency_limit"))
        .collect();
    assert_eq!(refused.len(), 3, "each refusal is logged");
    assert!(
        refused
            .iter()
            .all(|l| l.status == 429 && l.source.as_deref() == Some("gateway"))
    );
    drop(held);
    app.stop().await;
}

async fn assert_over_cap_now(app: &TestApp) {
    let (status, headers, body) = send(app, KEY, false).await;
    assert_over_cap(status, &headers, &body, "apikey", 2);
}

async fn a_members_cap_spans_their_keys(db: TestDb) {
    let (app, mock) = start(&db, "").await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let ada = app.member_id(&token, "ada@acme.test").await;
    let set = patch(
        &app,
        &token,
        &format!("/admin/v1/members/{ada}"),
        json!({"max_in_flight": 1}),
    )
    .await;
    assert_eq!(set["max_in_flight"], 1);
    let held = open_stream(&app, &mock, KEY).await;
    let (status, headers, body) = send(&app, OTHER, true).await;
    assert_over_cap(status, &headers, &body, "member", 1);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("member"),
        "{body}"
    );
    drop(held);
    until_in_flight(&app, Guarded::Member, ada, 0).await;
    assert_eq!(send(&app, OTHER, false).await.0, 200);
    app.stop().await;
}

async fn refusals_count_toward_the_breaker(db: TestDb) {
    let (app, mock) = start(&db, "").await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let key = key_id(&app, &token, "ci").await;
    patch(
        &app,
        &token,
        &format!("/admin/v1/keys/{key}"),
        json!({"max_in_flight": 1}),
    )
    .await;
    let held = open_stream(&app, &mock, KEY).await;
    // 100 requests in the window, all refused: more than 90 % failed, the key trips.
    for _ in 0..100 {
        assert_eq!(send(&app, KEY, false).await.0, 429);
    }
    let (status, headers, body) = send(&app, KEY, false).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (429, &json!("api_key_circuit_open")),
        "{body}"
    );
    assert_eq!(headers["retry-after"], "30");
    drop(held);
    app.stop().await;
}

async fn the_admin_api_checks_the_new_fields(db: TestDb) {
    let (app, _mock) = start(&db, "").await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let key = key_id(&app, &token, "ci").await;
    let ada = app.member_id(&token, "ada@acme.test").await;
    let key_path = format!("/admin/v1/keys/{key}");
    let member_path = format!("/admin/v1/members/{ada}");
    // (path, body, status, code, param)
    let cases: Vec<(&str, Value, u16, &str, Option<&str>)> = vec![
        (
            &key_path,
            json!({"max_in_flight": 0}),
            422,
            "invalid_field",
            Some("max_in_flight"),
        ),
        (
            &key_path,
            json!({"max_in_flight": 2_000_000}),
            422,
            "invalid_field",
            Some("max_in_flight"),
        ),
        (
            &key_path,
            json!({"max_in_flight": "8"}),
            400,
            "invalid_request_error",
            None,
        ),
        (
            &key_path,
            json!({"allowed_models": []}),
            422,
            "invalid_field",
            Some("allowed_models"),
        ),
        (
            &key_path,
            json!({"allowed_models": ["gpt-*-mini"]}),
            422,
            "invalid_field",
            Some("allowed_models"),
        ),
        (
            &key_path,
            json!({"allowed_models": ["a", "a"]}),
            422,
            "invalid_field",
            Some("allowed_models"),
        ),
        (
            &key_path,
            json!({"allowed_models": "gpt-4o"}),
            400,
            "invalid_request_error",
            None,
        ),
        (
            &key_path,
            json!({"name": "renamed"}),
            400,
            "invalid_request_error",
            Some("name"),
        ),
        (
            &member_path,
            json!({"allowed_models": [""]}),
            422,
            "invalid_field",
            Some("allowed_models"),
        ),
        (
            &member_path,
            json!({"max_in_flight": -1}),
            422,
            "invalid_field",
            Some("max_in_flight"),
        ),
        (
            "/admin/v1/keys",
            json!({"name": "x", "max_in_flight": 0}),
            422,
            "invalid_field",
            Some("max_in_flight"),
        ),
        (
            "/admin/v1/members",
            json!({"email": "new@acme.test", "role": "member", "allowed_models": []}),
            422,
            "invalid_field",
            Some("allowed_models"),
        ),
    ];
    for (path, body, status, code, param) in cases {
        let method = if path.ends_with("/keys") || path.ends_with("/members") {
            reqwest::Method::POST
        } else {
            reqwest::Method::PATCH
        };
        let (got, answer) = admin(&app, &token, method, path, Some(body.clone())).await;
        assert_eq!(got, status, "{path} {body}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{path} {body}");
        if let Some(p) = param {
            assert_eq!(answer["error"]["param"], p, "{path} {body}");
        }
    }
    // Nothing was changed by the refused requests.
    let (_, k) = admin(&app, &token, reqwest::Method::GET, &key_path, None).await;
    assert_eq!(
        (k["allowed_models"].clone(), k["max_in_flight"].clone()),
        (Value::Null, Value::Null)
    );
    // A member does not lift (or set) the guardrails of an existing key, even their own.
    let ada_token = {
        let (s, r) = admin(
            &app,
            &token,
            reqwest::Method::POST,
            &format!("/admin/v1/members/{ada}/reset-password"),
            None,
        )
        .await;
        assert_eq!(s, 200);
        app.login("ada@acme.test", r["one_time_password"].as_str().unwrap())
            .await
    };
    let (s, body) = admin(
        &app,
        &ada_token,
        reqwest::Method::PATCH,
        &key_path,
        Some(json!({"max_in_flight": 5})),
    )
    .await;
    assert_eq!((s, &body["error"]["code"]), (403, &json!("forbidden")), "{body}");
    // The member's own new key may be narrowed at creation.
    let (s, body) = admin(
        &app,
        &ada_token,
        reqwest::Method::POST,
        "/admin/v1/keys",
        Some(json!({"name": "mine", "max_in_flight": 1, "allowed_models": ["gpt-4o-mini"]})),
    )
    .await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(body["max_in_flight"], 1);
    app.stop().await;
}
