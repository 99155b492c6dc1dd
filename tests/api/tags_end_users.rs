//! Tags and end users (issue 25 item 6): `x-aigw-tags`, `x-aigw-end-user` and the body's `user`
//! are stored on the request log, filterable and exported; a malformed header is a 400 naming
//! it; a key's `allowed_tags` refuses other tags with a 403 `tag_not_allowed` before any quota
//! or upstream work.

use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, TestApp, TestDb};
use crate::model_allow_list::{OTHER, OWNER, OWNER_PASSWORD, admin, key_id, patch, start};
use crate::proxy::KEY;

fn chat(user: Option<Value>) -> Value {
    let mut body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    if let Some(u) = user {
        body["user"] = u;
    }
    body
}

/// A chat call with `headers`: status and JSON body.
async fn call(app: &TestApp, key: &str, headers: &[(&str, &str)], body: &Value) -> (u16, Value) {
    call_to(app, "/v1/chat/completions", key, headers, body).await
}

/// A call of `path` with `headers`: status and JSON body.
async fn call_to(
    app: &TestApp,
    path: &str,
    key: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, Value) {
    let mut req = app
        .client
        .post(format!("{}{path}", app.address))
        .bearer_auth(key)
        .json(body);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The request ids of the logs `GET /admin/v1/logs?{query}` lists.
async fn listed(app: &TestApp, token: &str, query: &str) -> Vec<(Value, Value)> {
    let (status, page) = admin(
        app,
        token,
        reqwest::Method::GET,
        &format!("/admin/v1/logs?{query}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{query}: {page}");
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["tags"].clone(), l["end_user"].clone()))
        .collect()
}

both_backends!(
    tags_and_end_users_are_logged_filtered_and_exported,
    malformed_tags_and_end_users_are_refused_naming_the_header,
    a_key_sends_only_its_allowed_tags,
);

async fn tags_and_end_users_are_logged_filtered_and_exported(db: TestDb) {
    let (app, _mock) = start(&db, "").await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let tagged = [("x-aigw-tags", " team=search , feature=summaries")];
    assert_eq!(call(&app, KEY, &tagged, &chat(None)).await.0, 200);
    // The body's `user` is the end user; the header wins over it.
    assert_eq!(call(&app, KEY, &[], &chat(Some(json!("u-body")))).await.0, 200);
    let both = [("x-aigw-end-user", "u-header"), ("x-aigw-tags", "team=ads")];
    assert_eq!(
        call(&app, OTHER, &both, &chat(Some(json!("u-body")))).await.0,
        200
    );
    assert_eq!(call(&app, KEY, &[], &chat(None)).await.0, 200);
    app.logs("acme", 4).await;

    let all = listed(&app, &token, "").await;
    assert_eq!(
        all,
        [
            (Value::Null, Value::Null),
            (json!("team=ads"), json!("u-header")),
            (Value::Null, json!("u-body")),
            (json!("feature=summaries,team=search"), Value::Null),
        ],
        "newest first, tags sorted by key"
    );
    assert_eq!(
        listed(&app, &token, "tag=team=search").await,
        [(json!("feature=summaries,team=search"), Value::Null)]
    );
    assert_eq!(listed(&app, &token, "tag=feature=summaries").await.len(), 1);
    assert_eq!(
        listed(&app, &token, "tag=team=sea").await.len(),
        0,
        "a whole value only"
    );
    assert_eq!(
        listed(&app, &token, "tag=team=%25").await.len(),
        0,
        "LIKE wildcards are literal"
    );
    assert_eq!(
        listed(&app, &token, "end_user=u-header").await,
        [(json!("team=ads"), json!("u-header"))]
    );
    assert_eq!(
        listed(&app, &token, "end_user=u-body&tag=team=ads").await.len(),
        0,
        "filters combine"
    );
    let (status, bad) = admin(
        &app,
        &token,
        reqwest::Method::GET,
        "/admin/v1/logs?tag=team",
        None,
    )
    .await;
    assert_eq!((status, &bad["error"]["param"]), (422, &json!("tag")), "{bad}");

    let csv = app
        .get_as("/admin/v1/logs/export?tag=team=ads", &token)
        .await
        .text()
        .await
        .unwrap();
    let mut lines = csv.lines();
    assert!(
        lines.next().unwrap().ends_with(",would_refuse,tags,end_user"),
        "{csv}"
    );
    let row = lines.next().unwrap();
    assert!(row.ends_with(",team=ads,u-header"), "{row}");
    assert_eq!(lines.next(), None);
    app.stop().await;
}

async fn malformed_tags_and_end_users_are_refused_naming_the_header(db: TestDb) {
    let (app, mock) = start(&db, "").await;
    let long_user = "u".repeat(257);
    /// Headers, body, and the param the refusal names.
    type Case<'a> = (Vec<(&'a str, &'a str)>, Value, &'a str);
    let cases: Vec<Case> = vec![
        (vec![("x-aigw-tags", "team")], chat(None), "x-aigw-tags"),
        (vec![("x-aigw-tags", "Team=search")], chat(None), "x-aigw-tags"),
        (vec![("x-aigw-tags", "team=a,team=b")], chat(None), "x-aigw-tags"),
        (
            vec![("x-aigw-end-user", long_user.as_str())],
            chat(None),
            "x-aigw-end-user",
        ),
        (vec![], chat(Some(json!(42))), "user"),
        (vec![], chat(Some(json!({"id": "x"}))), "user"),
        (vec![], chat(Some(json!(long_user))), "user"),
    ];
    for (headers, body, param) in &cases {
        let (status, v) = call(&app, KEY, headers, body).await;
        assert_eq!(status, 400, "{headers:?}: {v}");
        assert_eq!(v["error"]["code"], "invalid_request_error");
        assert_eq!(v["error"]["param"], *param, "{v}");
    }
    assert_eq!(mock.call_count(), 0, "nothing went upstream");
    // A blank header names no one; the body's `user` then does.
    let (status, _) = call(&app, KEY, &[("x-aigw-end-user", " ")], &chat(Some(json!("bob")))).await;
    assert_eq!(status, 200);
    let logs = app.logs("acme", cases.len() + 1).await;
    assert_eq!(logs[0].end_user.as_deref(), Some("bob"));
    assert_eq!(
        logs.iter().filter(|l| l.status == 400).count(),
        cases.len(),
        "each refusal is logged"
    );
    app.stop().await;
}

async fn a_key_sends_only_its_allowed_tags(db: TestDb) {
    // One request a minute on the key: a refused tag must use none of it.
    let policy = "[[policy]]\nworkspace = \"acme\"\nsubject = \"apikey\"\ntarget = \"ada@acme.test/ci\"\n\
                  metric = \"requests\"\nwindow = \"minute\"\nlimit = 1\n";
    let (app, mock) = start(&db, policy).await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let key = key_id(&app, &token, "ci").await;
    let path = format!("/admin/v1/keys/{key}");
    let set = patch(
        &app,
        &token,
        &path,
        json!({"allowed_tags": [" team=search ", "feature=*"]}),
    )
    .await;
    assert_eq!(
        set["allowed_tags"],
        json!(["team=search", "feature=*"]),
        "stored trimmed"
    );
    assert_eq!(set["allowed_models"], Value::Null, "other guardrails are kept");

    for tags in ["team=ads", "team=search,env=prod"] {
        let (status, v) = call(&app, KEY, &[("x-aigw-tags", tags)], &chat(None)).await;
        assert_eq!(status, 403, "{tags}: {v}");
        let e = &v["error"];
        assert_eq!(e["code"], "tag_not_allowed");
        assert_eq!(e["type"], "permission_error");
        assert_eq!(e["param"], "x-aigw-tags");
        assert!(
            ["team=ads", "env=prod"].contains(&e["tag"].as_str().unwrap()),
            "{v}"
        );
    }
    assert_eq!(mock.call_count(), 0);
    let ok = [("x-aigw-tags", "team=search,feature=anything")];
    let (status, v) = call(&app, KEY, &ok, &chat(None)).await;
    assert_eq!(status, 200, "{v}");
    // Another key has no list: every tag.
    assert_eq!(
        call(&app, OTHER, &[("x-aigw-tags", "team=ads")], &chat(None))
            .await
            .0,
        200
    );

    // Invalid lists are refused naming the field; null lifts the list.
    for bad in [
        json!([]),
        json!(["team"]),
        json!(["Team=x"]),
        json!(["a=b", "a=b"]),
    ] {
        let (status, v) = admin(
            &app,
            &token,
            reqwest::Method::PATCH,
            &path,
            Some(json!({"allowed_tags": bad})),
        )
        .await;
        assert_eq!(status, 422, "{bad}: {v}");
        assert_eq!(v["error"]["param"], "allowed_tags", "{v}");
    }
    let (status, _) = admin(
        &app,
        &token,
        reqwest::Method::PATCH,
        &path,
        Some(json!({"allowed_tags": "team=x"})),
    )
    .await;
    assert_eq!(status, 400);
    let cleared = patch(&app, &token, &path, json!({"allowed_tags": null})).await;
    assert_eq!(cleared["allowed_tags"], Value::Null);
    // A key created with a list; the resources file sets one too.
    let (status, created) = admin(
        &app,
        &token,
        reqwest::Method::POST,
        "/admin/v1/keys",
        Some(json!({"name": "tagged", "allowed_tags": ["team=*"]})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["allowed_tags"], json!(["team=*"]));
    let plain = created["key"].as_str().unwrap().to_owned();
    let (status, v) = call(&app, &plain, &[("x-aigw-tags", "env=x")], &chat(None)).await;
    assert_eq!((status, &v["error"]["tag"]), (403, &json!("env=x")));
    app.stop().await;

    let declared = carol_tagged();
    let (app, _mock) = start(&db, &declared).await;
    let (status, v) = call(&app, CAROL, &[("x-aigw-tags", "team=ads")], &chat(None)).await;
    assert_eq!((status, &v["error"]["code"]), (403, &json!("tag_not_allowed")));
    let (status, _) = call(&app, CAROL, &[("x-aigw-tags", "team=search")], &chat(None)).await;
    assert_eq!(status, 200);
    let logs = app.logs("acme", 5).await;
    assert_eq!(
        logs.iter()
            .filter(|l| l.code.as_deref() == Some("tag_not_allowed"))
            .count(),
        4,
        "each refusal is logged (with its tags)"
    );
    assert!(
        logs.iter()
            .any(|l| l.code.as_deref() == Some("tag_not_allowed") && l.tags.as_deref() == Some("team=ads"))
    );
    app.stop().await;
}

/// carol's key, declared with a tag allow-list in the resources file.
const CAROL: &str = "sk-aigw-CarolTaggedKey0123456789abcdefgh";

/// carol, a plain member of acme, and her key `svc` ([`CAROL`]) that may send `team=search` only.
fn carol_tagged() -> String {
    ResourcesBuilder::new()
        .member("acme", "carol@acme.test", "member")
        .api_key("carol@acme.test", "svc", CAROL)
        .with("allowed_tags", vec!["team=search"])
        .into()
}

/// [`start`]'s workspace and `extra`, with `settings` adjusted.
async fn start_with(
    db: &TestDb,
    extra: &str,
    settings: impl FnOnce(&mut aigw::Settings) + Send + 'static,
) -> (TestApp, aigw::mock_upstream::MockUpstream) {
    let mock = aigw::mock_upstream::MockUpstream::start().await.unwrap();
    let text = String::from(crate::model_allow_list::owned(&mock)) + extra;
    let setup = crate::helpers::Setup {
        settings: Box::new(settings),
        ..crate::helpers::Setup::resources(text)
    };
    (crate::helpers::spawn_app(db, setup).await, mock)
}

fn policy(subject: &str, target: &str, limit: u32) -> String {
    format!(
        "[[policy]]\nworkspace = \"acme\"\nsubject = \"{subject}\"\ntarget = \"{target}\"\n\
         metric = \"requests\"\nwindow = \"minute\"\nlimit = {limit}\n"
    )
}

both_backends!(
    new_tag_values_and_end_users_past_the_caps_are_refused,
    a_policy_on_a_tag_value_counts_that_value_only,
    a_policy_on_each_end_user_counts_each_one,
    the_admin_api_sets_tag_policies_and_lists_their_standings,
    usage_is_reported_by_the_values_of_a_tag,
    messages_name_the_end_user_in_metadata_user_id,
    the_quota_endpoint_lists_the_quotas_of_the_tags_and_end_user_sent,
);

async fn new_tag_values_and_end_users_past_the_caps_are_refused(db: TestDb) {
    let (app, mock) = start_with(&db, "", |s| {
        s.max_tag_keys = 2;
        s.max_tag_values = 2;
        s.max_end_users = 1;
    })
    .await;
    for tags in ["team=a", "team=b", "team=a,env=x"] {
        assert_eq!(
            call(&app, KEY, &[("x-aigw-tags", tags)], &chat(None)).await.0,
            200,
            "{tags}"
        );
    }
    let calls = mock.call_count();
    let (status, v) = call(&app, KEY, &[("x-aigw-tags", "team=c")], &chat(None)).await;
    assert_eq!(status, 400, "{v}");
    let e = &v["error"];
    assert_eq!(
        (&e["code"], &e["param"], &e["tag_key"], &e["limit"]),
        (
            &json!("tag_value_limit"),
            &json!("x-aigw-tags"),
            &json!("team"),
            &json!(2)
        )
    );
    assert!(e["message"].as_str().unwrap().contains("max_tag_values"), "{v}");
    // Once reached, the cap is remembered: another new value is refused the same way.
    let (status, v) = call(&app, KEY, &[("x-aigw-tags", "team=e")], &chat(None)).await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (400, &json!("tag_value_limit")),
        "{v}"
    );
    let (status, v) = call(&app, KEY, &[("x-aigw-tags", "region=eu")], &chat(None)).await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (400, &json!("tag_value_limit")),
        "a third key: {v}"
    );
    assert!(
        v["error"]["message"].as_str().unwrap().contains("max_tag_keys"),
        "{v}"
    );
    assert_eq!(mock.call_count(), calls, "nothing went upstream");
    // Known values keep working.
    assert_eq!(
        call(&app, KEY, &[("x-aigw-tags", "team=b,env=x")], &chat(None))
            .await
            .0,
        200
    );

    assert_eq!(
        call(&app, KEY, &[("x-aigw-end-user", "alice")], &chat(None))
            .await
            .0,
        200
    );
    let (status, v) = call(&app, KEY, &[], &chat(Some(json!("bob")))).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(
        (&v["error"]["code"], &v["error"]["param"], &v["error"]["limit"]),
        (&json!("end_user_limit"), &json!("x-aigw-end-user"), &json!(1))
    );
    assert_eq!(call(&app, KEY, &[], &chat(Some(json!("alice")))).await.0, 200);
    let (status, v) = call(&app, KEY, &[("x-aigw-end-user", "carol")], &chat(None)).await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (400, &json!("end_user_limit")),
        "{v}"
    );
    assert_eq!(
        call(&app, KEY, &[], &chat(None)).await.0,
        200,
        "no end user: no cap"
    );
    app.stop().await;

    // The caps count what the store holds, across restarts.
    let (app, _mock) = start_with(&db, "", |s| s.max_tag_values = 2).await;
    let (status, v) = call(&app, KEY, &[("x-aigw-tags", "team=d")], &chat(None)).await;
    assert_eq!((status, &v["error"]["code"]), (400, &json!("tag_value_limit")));
    assert_eq!(
        call(&app, KEY, &[("x-aigw-tags", "team=a")], &chat(None)).await.0,
        200
    );
    app.stop().await;
}

/// Asserts a quota refusal on `subject` naming `name`.
fn assert_refused_on((status, v): &(u16, Value), subject: &str, name: &str) {
    assert_eq!(*status, 429, "{v}");
    let e = &v["error"];
    assert_eq!(e["code"], "quota_exceeded", "{v}");
    assert_eq!(e["subject"], subject);
    assert_eq!(e[subject], name, "{v}");
    assert_eq!(
        e["message"],
        format!("rate limit exceeded on {subject} requests/minute")
    );
}

async fn a_policy_on_a_tag_value_counts_that_value_only(db: TestDb) {
    let policies = format!(
        "{}{}",
        policy("tag", "team=search", 1),
        policy("tag", "feature=*", 1)
    );
    let (app, _mock) = start_with(&db, &policies, |_| {}).await;
    let with = |tags: &'static str| [("x-aigw-tags", tags)];
    assert_eq!(call(&app, KEY, &with("team=search"), &chat(None)).await.0, 200);
    assert_refused_on(
        &call(&app, OTHER, &with("team=search,env=x"), &chat(None)).await,
        "tag",
        "team=search",
    );
    for other in ["team=ads", "env=x", ""] {
        assert_eq!(call(&app, KEY, &with(other), &chat(None)).await.0, 200, "{other}");
    }
    // `feature=*`: each value of the key on its own counter.
    assert_eq!(call(&app, KEY, &with("feature=a"), &chat(None)).await.0, 200);
    assert_eq!(call(&app, KEY, &with("feature=b"), &chat(None)).await.0, 200);
    assert_refused_on(
        &call(&app, KEY, &with("feature=a"), &chat(None)).await,
        "tag",
        "feature=a",
    );
    // A new minute: usable again.
    app.clock.advance(chrono::Duration::seconds(60));
    assert_eq!(
        call(&app, KEY, &with("team=search,feature=a"), &chat(None))
            .await
            .0,
        200
    );
    app.stop().await;
}

async fn a_policy_on_each_end_user_counts_each_one(db: TestDb) {
    let policies = format!("{}{}", policy("end_user", "*", 2), policy("end_user", "vip", 1));
    let (app, _mock) = start_with(&db, &policies, |_| {}).await;
    let as_user = |u: &'static str| [("x-aigw-end-user", u)];
    for _ in 0..2 {
        assert_eq!(call(&app, KEY, &as_user("alice"), &chat(None)).await.0, 200);
    }
    // The body's `user` is the same end user, on any key.
    assert_refused_on(
        &call(&app, OTHER, &[], &chat(Some(json!("alice")))).await,
        "end_user",
        "alice",
    );
    assert_eq!(call(&app, KEY, &as_user("bob"), &chat(None)).await.0, 200);
    assert_eq!(call(&app, KEY, &[], &chat(None)).await.0, 200, "no end user");
    assert_eq!(call(&app, KEY, &as_user("vip"), &chat(None)).await.0, 200);
    assert_refused_on(
        &call(&app, KEY, &as_user("vip"), &chat(None)).await,
        "end_user",
        "vip",
    );
    app.stop().await;
}

async fn the_admin_api_sets_tag_policies_and_lists_their_standings(db: TestDb) {
    let (app, _mock) = start(&db, "").await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let create = |body: Value| {
        let (app, token) = (&app, &token);
        async move {
            admin(
                app,
                token,
                reqwest::Method::POST,
                "/admin/v1/policies",
                Some(body),
            )
            .await
        }
    };
    let (status, p) = create(json!({"subject": "tag", "target": "team=*", "metric": "requests",
                                    "window": "day", "limit": 2}))
    .await;
    assert_eq!(status, 201, "{p}");
    assert_eq!((&p["subject"], &p["target"]), (&json!("tag"), &json!("team=*")));
    let (status, p) = create(
        json!({"subject": "end_user", "target": "alice", "metric": "requests",
                                    "window": "day", "limit": 5}),
    )
    .await;
    assert_eq!(status, 201, "{p}");
    assert_eq!(p["target"], "alice");
    for bad in [
        json!({"subject": "tag", "target": "Team=x", "metric": "requests", "window": "day", "limit": 1}),
        json!({"subject": "tag", "target_id": 1, "metric": "requests", "window": "day", "limit": 1}),
        json!({"subject": "member", "target": "x", "metric": "requests", "window": "day", "limit": 1}),
    ] {
        let (status, v) = create(bad.clone()).await;
        assert_eq!(status, 422, "{bad}: {v}");
    }
    for _ in 0..2 {
        let (status, v) = call(&app, KEY, &[("x-aigw-tags", "team=search")], &chat(None)).await;
        assert_eq!(status, 200, "{v}");
    }
    let (status, v) = call(&app, KEY, &[("x-aigw-tags", "team=search")], &chat(None)).await;
    assert_eq!((status, &v["error"]["tag"]), (429, &json!("team=search")), "{v}");
    app.state
        .quota
        .flush(&app.state.store, app.clock.now())
        .await
        .unwrap();
    let (_, standings) = admin(
        &app,
        &token,
        reqwest::Method::GET,
        "/admin/v1/quota/standings",
        None,
    )
    .await;
    let rows = standings["data"].as_array().unwrap();
    assert!(
        rows.iter()
            .any(|s| s["subject"] == "tag" && s["subject_name"] == "team=search" && s["used"] == 2),
        "{standings}"
    );
    let (_, list) = admin(&app, &token, reqwest::Method::GET, "/admin/v1/policies", None).await;
    let targets: Vec<&Value> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["target"])
        .collect();
    assert_eq!(targets, [&json!("team=*"), &json!("alice")]);
    app.stop().await;
}

async fn usage_is_reported_by_the_values_of_a_tag(db: TestDb) {
    let (app, _mock) = start(&db, "").await;
    for tags in [
        "team=search,feature=a",
        "team=search",
        "team=ads",
        "feature=a",
        "",
    ] {
        assert_eq!(
            call(&app, KEY, &[("x-aigw-tags", tags)], &chat(None)).await.0,
            200
        );
    }
    app.logs("acme", 5).await;
    let report = |query: &'static str| {
        let app = &app;
        async move {
            let token = app.login(OWNER, OWNER_PASSWORD).await;
            let token = token.as_str();
            let (status, v) = admin(
                app,
                token,
                reqwest::Method::GET,
                &format!("/admin/v1/usage?{query}"),
                None,
            )
            .await;
            assert_eq!(status, 200, "{query}: {v}");
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r["label"].as_str().unwrap().to_owned(),
                        r["requests"].as_i64().unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    let want = vec![("ads".to_owned(), 1), ("search".to_owned(), 2)];
    // This hour's logs (the edge of the range) …
    assert_eq!(report("by=tag&tag_key=team").await, want);
    assert_eq!(report("by=tag&tag_key=feature").await, [("a".to_owned(), 2)]);
    assert_eq!(report("by=tag&tag_key=region").await, []);
    // … and, hours later (the writer has written its rollup sums since), the hourly rollup:
    // the same figures.
    app.clock.advance(chrono::Duration::hours(3));
    app.sync().await;
    assert_eq!(report("by=tag&tag_key=team").await, want);
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    for bad in ["by=tag", "by=tag&tag_key=Team", "by=day&tag_key=team"] {
        let (status, v) = admin(
            &app,
            &token,
            reqwest::Method::GET,
            &format!("/admin/v1/usage?{bad}"),
            None,
        )
        .await;
        assert_eq!(
            (status, &v["error"]["param"]),
            (422, &json!("tag_key")),
            "{bad}: {v}"
        );
    }
    app.stop().await;
}

/// An Anthropic messages body with these `metadata` and `user` fields.
fn messages(metadata: Option<Value>, user: Option<&str>) -> Value {
    let mut body = json!({"model": "claude-sonnet", "max_tokens": 50,
                          "messages": [{"role": "user", "content": "hi"}]});
    if let Some(m) = metadata {
        body["metadata"] = m;
    }
    if let Some(u) = user {
        body["user"] = json!(u);
    }
    body
}

async fn messages_name_the_end_user_in_metadata_user_id(db: TestDb) {
    let (app, _mock) = start_with(&db, &policy("end_user", "*", 1), |_| {}).await;
    let post = async |key: &str, headers: &[(&str, &str)], body: Value| {
        call_to(&app, "/v1/messages", key, headers, &body).await
    };
    let as_user = |id: &str| Some(json!({"user_id": id}));
    // Anthropic's `metadata.user_id` is the end user, whichever key sends it.
    assert_eq!(post(KEY, &[], messages(as_user("m-alice"), None)).await.0, 200);
    assert_refused_on(
        &post(OTHER, &[], messages(as_user("m-alice"), Some("m-bob"))).await,
        "end_user",
        "m-alice",
    );
    // The header wins over the body, as on chat.
    let carol = [("x-aigw-end-user", "m-carol")];
    assert_eq!(post(KEY, &carol, messages(as_user("m-alice"), None)).await.0, 200);
    // Without `metadata.user_id` (no metadata, none in it, or null), the body's `user` is read.
    assert_eq!(post(KEY, &[], messages(None, Some("m-bob"))).await.0, 200);
    for metadata in [None, Some(json!({})), Some(json!({"user_id": null}))] {
        assert_refused_on(
            &post(KEY, &[], messages(metadata.clone(), Some("m-bob"))).await,
            "end_user",
            "m-bob",
        );
    }
    let (status, v) = post(KEY, &[], messages(Some(json!({"user_id": 7})), None)).await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("metadata.user_id")),
        "{v}"
    );
    // A `metadata` that is no object is refused, as the schema says.
    for metadata in [json!([null, null]), json!("m-alice"), json!(7)] {
        let (status, v) = post(KEY, &[], messages(Some(metadata), None)).await;
        assert_eq!((status, &v["error"]["param"]), (400, &json!("metadata")), "{v}");
    }
    assert_eq!(post(KEY, &[], messages(None, None)).await.0, 200, "no end user");

    let logs = app.logs("acme", 12).await;
    let end_users: Vec<Option<&str>> = logs.iter().rev().map(|l| l.end_user.as_deref()).collect();
    assert_eq!(
        end_users,
        [
            Some("m-alice"),
            Some("m-alice"),
            Some("m-carol"),
            Some("m-bob"),
            Some("m-bob"),
            Some("m-bob"),
            Some("m-bob"),
            None,
            None,
            None,
            None,
            None,
        ],
        "oldest first"
    );
    app.stop().await;
}

/// `GET /v1/quota` with `key` and `headers`: status and JSON body.
async fn quota(app: &TestApp, key: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = app
        .client
        .get(format!("{}/v1/quota", app.address))
        .bearer_auth(key);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Each row as (subject, how it names the subject, limit, used, remaining), sorted.
fn standings(body: &Value) -> Vec<(String, Value, i64, i64, i64)> {
    let mut rows: Vec<_> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let subject = r["subject"].as_str().unwrap().to_owned();
            let name = r.get(&subject).cloned().unwrap_or(Value::Null);
            let n = |f: &str| r[f].as_i64().unwrap();
            (subject, name, n("limit"), n("used"), n("remaining"))
        })
        .collect();
    rows.sort_by_key(|r| (r.0.clone(), r.1.to_string(), r.2));
    rows
}

async fn the_quota_endpoint_lists_the_quotas_of_the_tags_and_end_user_sent(db: TestDb) {
    let carol = carol_tagged();
    let policies = [
        policy("apikey", "ada@acme.test/ci", 10),
        policy("tag", "team=search", 3),
        policy("tag", "feature=*", 2),
        policy("end_user", "*", 4),
        policy("end_user", "vip", 1),
        carol,
    ]
    .concat();
    let (app, _mock) = start_with(&db, &policies, |_| {}).await;
    let labelled = [
        ("x-aigw-tags", "team=search,feature=a"),
        ("x-aigw-end-user", "alice"),
    ];
    assert_eq!(call(&app, KEY, &labelled, &chat(None)).await.0, 200);

    let key_row = ("apikey".to_owned(), Value::Null, 10, 1, 9);
    let (status, v) = quota(&app, KEY, &[]).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        standings(&v),
        std::slice::from_ref(&key_row),
        "without headers: the key's quotas"
    );
    let (status, v) = quota(&app, KEY, &labelled).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        standings(&v),
        [
            key_row.clone(),
            ("end_user".to_owned(), json!("alice"), 4, 1, 3),
            ("tag".to_owned(), json!("feature=a"), 2, 1, 1),
            ("tag".to_owned(), json!("team=search"), 3, 1, 2),
        ],
        "each row names its tag value or end user: {v}"
    );
    // Values not seen yet: the policies on each value and end user apply, nothing used.
    let others = [("x-aigw-tags", "feature=b,env=x"), ("x-aigw-end-user", "vip")];
    let (status, v) = quota(&app, KEY, &others).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        standings(&v),
        [
            key_row,
            ("end_user".to_owned(), json!("vip"), 1, 0, 1),
            ("end_user".to_owned(), json!("vip"), 4, 0, 4),
            ("tag".to_owned(), json!("feature=b"), 2, 0, 2),
        ]
    );
    // The headers are checked as on a request.
    let (status, v) = quota(&app, KEY, &[("x-aigw-tags", "team")]).await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("x-aigw-tags")),
        "{v}"
    );
    let (status, v) = quota(&app, CAROL, &[("x-aigw-tags", "team=ads")]).await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (403, &json!("tag_not_allowed")),
        "{v}"
    );
    let (status, v) = quota(&app, CAROL, &[("x-aigw-tags", "team=search")]).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(standings(&v), [("tag".to_owned(), json!("team=search"), 3, 1, 2)]);
    app.stop().await;
}

both_backends!(
    one_key_cannot_fill_the_workspace_caps,
    a_burst_of_new_labels_on_one_gateway_passes_no_cap,
);

/// The error code and message of a refused call.
fn refusal((status, v): &(u16, Value)) -> (u16, String, String) {
    (
        *status,
        v["error"]["code"].as_str().unwrap_or_default().to_owned(),
        v["error"]["message"].as_str().unwrap_or_default().to_owned(),
    )
}

async fn one_key_cannot_fill_the_workspace_caps(db: TestDb) {
    let (app, mock) = start_with(&db, "", |s| {
        s.max_end_users = 5;
        s.max_end_users_per_key = 2;
        s.max_tag_values = 10;
        s.max_tag_values_per_key = 2;
        s.max_tag_keys = 10;
        s.max_tag_keys_per_key = 2;
    })
    .await;
    let user = |u: &'static str| [("x-aigw-end-user", u)];
    for u in ["alice", "bob"] {
        assert_eq!(call(&app, KEY, &user(u), &chat(None)).await.0, 200, "{u}");
    }
    let calls = mock.call_count();
    let refused = call(&app, KEY, &user("carol"), &chat(None)).await;
    let (status, code, message) = refusal(&refused);
    assert_eq!((status, code.as_str()), (400, "end_user_limit"), "{}", refused.1);
    assert!(message.contains("max_end_users_per_key"), "{message}");
    assert_eq!(refused.1["error"]["limit"], 2);
    assert_eq!(mock.call_count(), calls, "nothing went upstream");
    // The workspace still has room: another key brings carol, and then she is known to all.
    assert_eq!(call(&app, OTHER, &user("carol"), &chat(None)).await.0, 200);
    assert_eq!(call(&app, KEY, &user("carol"), &chat(None)).await.0, 200);
    assert_eq!(call(&app, KEY, &user("alice"), &chat(None)).await.0, 200);
    let (status, code, _) = refusal(&call(&app, KEY, &user("dave"), &chat(None)).await);
    assert_eq!((status, code.as_str()), (400, "end_user_limit"), "remembered");

    let tags = |t: &'static str| [("x-aigw-tags", t)];
    for t in ["team=a", "team=b"] {
        assert_eq!(call(&app, KEY, &tags(t), &chat(None)).await.0, 200, "{t}");
    }
    let refused = call(&app, KEY, &tags("team=c"), &chat(None)).await;
    let (status, code, message) = refusal(&refused);
    assert_eq!((status, code.as_str()), (400, "tag_value_limit"), "{}", refused.1);
    assert!(message.contains("max_tag_values_per_key"), "{message}");
    assert_eq!(refused.1["error"]["tag_key"], "team");
    assert_eq!(call(&app, OTHER, &tags("team=c"), &chat(None)).await.0, 200);
    assert_eq!(call(&app, KEY, &tags("env=x"), &chat(None)).await.0, 200);
    let refused = call(&app, KEY, &tags("region=eu"), &chat(None)).await;
    let (status, code, message) = refusal(&refused);
    assert_eq!((status, code.as_str()), (400, "tag_value_limit"), "{}", refused.1);
    assert!(message.contains("max_tag_keys_per_key"), "{message}");
    assert_eq!(call(&app, OTHER, &tags("region=eu"), &chat(None)).await.0, 200);
    app.stop().await;

    // The per-key caps count what the store holds, across restarts.
    let (app, _mock) = start_with(&db, "", |s| s.max_end_users_per_key = 2).await;
    let (status, code, _) = refusal(&call(&app, KEY, &user("erin"), &chat(None)).await);
    assert_eq!((status, code.as_str()), (400, "end_user_limit"));
    assert_eq!(call(&app, OTHER, &user("erin"), &chat(None)).await.0, 200);
    app.stop().await;
}

/// `n` calls at once with `key`, the i-th with the headers `headers(i)`: their statuses.
async fn burst(app: &TestApp, n: usize, headers: impl Fn(usize) -> (&'static str, String)) -> Vec<u16> {
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..n {
        let (name, value) = headers(i);
        let req = app
            .client
            .post(format!("{}/v1/chat/completions", app.address))
            .bearer_auth(KEY)
            .header(name, value)
            .json(&chat(None));
        calls.spawn(async move { req.send().await.unwrap().status().as_u16() });
    }
    let mut out = Vec::new();
    while let Some(s) = calls.join_next().await {
        out.push(s.unwrap());
    }
    out
}

async fn a_burst_of_new_labels_on_one_gateway_passes_no_cap(db: TestDb) {
    let (app, _mock) = start_with(&db, "", |s| {
        s.max_end_users = 3;
        s.max_tag_values = 3;
        s.max_tag_keys = 3;
    })
    .await;
    let admitted = |statuses: &[u16]| statuses.iter().filter(|s| **s == 200).count();
    let users = burst(&app, 24, |i| ("x-aigw-end-user", format!("user-{i}"))).await;
    assert_eq!(admitted(&users), 3, "end users: {users:?}");
    assert!(users.iter().all(|s| [200, 400].contains(s)), "{users:?}");
    let values = burst(&app, 24, |i| ("x-aigw-tags", format!("team=t{i}"))).await;
    assert_eq!(admitted(&values), 3, "tag values: {values:?}");
    let keys = burst(&app, 24, |i| ("x-aigw-tags", format!("k{i}=v"))).await;
    assert_eq!(admitted(&keys), 2, "tag keys (team is one): {keys:?}");
    app.stop().await;
}

both_backends!(
    labels_unseen_for_label_expiry_days_expire,
    admins_list_and_prune_the_labels_of_their_workspace,
);

/// The values `GET /admin/v1/labels?{query}` lists, and its total.
async fn labels(app: &TestApp, token: &str, query: &str) -> (Vec<String>, i64, Value) {
    let (status, page) = admin(
        app,
        token,
        reqwest::Method::GET,
        &format!("/admin/v1/labels?{query}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{query}: {page}");
    let mut values: Vec<String> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["value"].as_str().unwrap().to_owned())
        .collect();
    values.sort();
    (values, page["total"].as_i64().unwrap(), page)
}

async fn labels_unseen_for_label_expiry_days_expire(db: TestDb) {
    let (app, _mock) = start_with(&db, &policy("end_user", "vip", 100), |s| {
        s.max_end_users = 3;
        s.label_expiry_days = 30;
    })
    .await;
    let user = |u: &'static str| [("x-aigw-end-user", u)];
    for u in ["alice", "bob"] {
        assert_eq!(call(&app, KEY, &user(u), &chat(None)).await.0, 200, "{u}");
    }
    let (status, code, _) = refusal(&call(&app, KEY, &user("carol"), &chat(None)).await);
    assert_eq!(
        (status, code.as_str()),
        (400, "end_user_limit"),
        "vip (a policy's), alice, bob"
    );
    app.clock.advance(chrono::Duration::days(20));
    assert_eq!(call(&app, KEY, &user("alice"), &chat(None)).await.0, 200);
    app.sync().await;
    app.clock.advance(chrono::Duration::days(15));
    app.sync().await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    // bob, unseen for 35 days, went; alice (15 days) and the policy's vip stay.
    assert_eq!(labels(&app, &token, "kind=end_user").await.0, ["alice", "vip"]);
    assert_eq!(call(&app, KEY, &user("carol"), &chat(None)).await.0, 200);
    let (status, code, _) = refusal(&call(&app, KEY, &user("dave"), &chat(None)).await);
    assert_eq!((status, code.as_str()), (400, "end_user_limit"));
    // bob comes back as a new end user, under the cap like any other.
    let (status, code, _) = refusal(&call(&app, KEY, &user("bob"), &chat(None)).await);
    assert_eq!((status, code.as_str()), (400, "end_user_limit"));
    app.stop().await;
}

async fn admins_list_and_prune_the_labels_of_their_workspace(db: TestDb) {
    let (app, _mock) = start_with(&db, &policy("tag", "team=core", 100), |s| {
        s.max_end_users_per_key = 2;
    })
    .await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let ci = key_id(&app, &token, "ci").await;
    let user = |u: &'static str| [("x-aigw-end-user", u)];
    for u in ["alice", "bob"] {
        assert_eq!(call(&app, KEY, &user(u), &chat(None)).await.0, 200, "{u}");
    }
    let (status, code, _) = refusal(&call(&app, KEY, &user("carol"), &chat(None)).await);
    assert_eq!((status, code.as_str()), (400, "end_user_limit"));
    assert_eq!(
        call(&app, KEY, &[("x-aigw-tags", "team=a,env=x")], &chat(None))
            .await
            .0,
        200
    );

    let (values, total, page) = labels(&app, &token, "kind=end_user").await;
    assert_eq!((values, total), (vec!["alice".to_owned(), "bob".to_owned()], 2));
    let row = &page["data"][0];
    assert_eq!(row["api_key_id"], json!(ci), "{page}");
    assert_eq!(row["kind"], "end_user");
    assert!(row["last_seen_at"].is_i64(), "{page}");
    let (values, _, _) = labels(&app, &token, "kind=tag").await;
    assert_eq!(values, ["a", "core", "x"], "a policy's value is listed too");
    let (values, _, page) = labels(&app, &token, "kind=tag&tag_key=team").await;
    assert_eq!(values, ["a", "core"], "{page}");
    assert_eq!(
        labels(&app, &token, &format!("kind=end_user&api_key_id={ci}"))
            .await
            .1,
        2
    );

    let prune = |query: String| {
        let (app, token) = (&app, &token);
        async move {
            admin(
                app,
                token,
                reqwest::Method::DELETE,
                &format!("/admin/v1/labels?{query}"),
                None,
            )
            .await
        }
    };
    let (status, v) = prune("kind=end_user".into()).await;
    assert_eq!(status, 422, "pruning needs a filter: {v}");
    let (status, v) = prune("kind=nothing&value=x".into()).await;
    assert_eq!((status, &v["error"]["param"]), (422, &json!("kind")), "{v}");
    let (status, v) = prune("kind=end_user&value=bob".into()).await;
    assert_eq!((status, &v["deleted"]), (200, &json!(1)), "{v}");
    // The key has room again, at once on this gateway.
    assert_eq!(call(&app, KEY, &user("carol"), &chat(None)).await.0, 200);
    let (status, v) = prune(format!("kind=end_user&api_key_id={ci}")).await;
    assert_eq!((status, &v["deleted"]), (200, &json!(2)), "alice and carol: {v}");
    assert_eq!(labels(&app, &token, "kind=end_user").await.1, 0);
    // A label a policy names is never pruned.
    let (status, v) = prune("kind=tag&tag_key=team".into()).await;
    assert_eq!((status, &v["deleted"]), (200, &json!(1)), "{v}");
    assert_eq!(labels(&app, &token, "kind=tag").await.0, ["core", "x"]);
    // Unseen for a day: env=x, brought two days ago (a session lasts less).
    app.clock.advance(chrono::Duration::days(2));
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let (status, v) = admin(
        &app,
        &token,
        reqwest::Method::DELETE,
        "/admin/v1/labels?kind=tag&unseen_days=1",
        None,
    )
    .await;
    assert_eq!((status, &v["deleted"]), (200, &json!(1)), "{v}");

    let (status, audit) = admin(&app, &token, reqwest::Method::GET, "/admin/v1/audit", None).await;
    assert_eq!(status, 200);
    let prunes: Vec<&Value> = audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "prune" && e["target_kind"] == "labels")
        .collect();
    assert_eq!(prunes.len(), 4, "{audit}");
    assert_eq!(prunes[0]["after"]["deleted"], 1, "newest first: {audit}");
    app.stop().await;
}
