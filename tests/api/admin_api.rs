//! The admin API (issue 7): every route × every role from the access table, ownership and
//! workspace isolation, guardrail changes enforced at once and audited, token revocation, field
//! errors, and secrets that never come back.

use aigw::admin::{AdminRoute, Need, ROUTES};
use aigw::mock_upstream::{MockUpstream, Script};
use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{Setup, TestApp, TestDb, spawn_app};
use crate::proxy::KEY;

const OTHER_KEY: &str = "sk-aigw-OTHERotherOTHERotherOTHERoth1234";
const UPSTREAM_SECRET: &str = "sk-upstream-secret-4f9a0c2e7d";

/// acme with one member of each role (ada is a plain member with a key), and a second workspace
/// whose ids must never be reachable from acme.
fn resources(mock: &MockUpstream) -> String {
    let url = mock.base_url();
    let member = |email: &str, ws: &str, role: &str| {
        format!(
            "[[member]]\nworkspace = \"{ws}\"\nemail = \"{email}\"\nrole = \"{role}\"\npassword = \"pw-{email}\"\n"
        )
    };
    let mut text = String::from("[[workspace]]\nname = \"acme\"\n[[workspace]]\nname = \"other\"\n");
    text += "[[department]]\nworkspace = \"acme\"\nname = \"research\"\n";
    text += &member("owner@acme.test", "acme", "owner");
    text += &member("admin@acme.test", "acme", "admin");
    text += &member("ada@acme.test", "acme", "member");
    text += &member("bob@acme.test", "acme", "member");
    text += &member("boss@other.test", "other", "owner");
    text += &format!(
        r#"
[[api_key]]
member = "ada@acme.test"
name = "ci"
key = "{KEY}"
[[api_key]]
member = "boss@other.test"
name = "ops"
key = "{OTHER_KEY}"
[[upstream]]
workspace = "acme"
name = "primary"
provider = "openai-compatible"
base_url = "{url}"
api_key = "cred-primary"
models = ["gpt-4o-mini"]
[[upstream]]
workspace = "other"
name = "theirs"
provider = "openai-compatible"
base_url = "{url}"
api_key = "cred-theirs"
models = ["gpt-4o-mini"]
[[model]]
workspace = "acme"
name = "gpt-4o-mini"
price = {{ prompt = 1.0, completion = 2.0 }}
[[model]]
workspace = "other"
name = "gpt-4o-mini"
"#
    );
    text
}

/// An admin API client for one test gateway.
struct Admin<'a> {
    app: &'a TestApp,
}

impl Admin<'_> {
    async fn login(&self, email: &str) -> String {
        let r = self
            .call(
                Method::POST,
                "/admin/v1/auth/login",
                None,
                Some(json!({"email": email, "password": format!("pw-{email}")})),
            )
            .await;
        assert_eq!(r.0, 200, "sign-in of {email}: {}", r.1);
        r.1["token"].as_str().unwrap().to_owned()
    }

    /// Status and JSON body (`null` when the body is not JSON).
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .app
            .client
            .request(method, format!("{}{path}", self.app.address));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn ok(&self, method: Method, path: &str, token: &str, body: Option<Value>) -> Value {
        let (status, v) = self.call(method.clone(), path, Some(token), body).await;
        assert!((200..300).contains(&status), "{method} {path}: {status} {v}");
        v
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

both_backends!(
    every_route_for_every_role,
    members_reach_only_their_own_and_no_one_another_workspace,
    a_guardrail_change_is_enforced_on_the_next_request_and_audited,
    sign_out_and_password_change_revoke_tokens,
    bad_inputs_name_the_field,
    the_upstream_secret_is_write_only,
    members_are_invited_changed_and_deactivated,
    logs_usage_and_csv_export,
    usage_by_model_names_only_models_of_the_workspace,
    quota_standings_list_each_subject_near_its_limit,
    a_member_changes_only_the_budgets_it_set,
);

/// The roles of the matrix, with the member who signs in (none: no token).
const ROLES: [(&str, Option<&str>); 4] = [
    ("anonymous", None),
    ("member", Some("ada@acme.test")),
    ("admin", Some("admin@acme.test")),
    ("owner", Some("owner@acme.test")),
];

fn role_allows(need: Need, role: &str) -> bool {
    match role {
        "anonymous" => need == Need::Public,
        "member" => need <= Need::Member,
        "admin" => need <= Need::Admin,
        _ => true,
    }
}

/// Who last set the policy that a `/admin/v1/policies/{id}` request names, always a budget on
/// a key the caller created: the caller itself, or the owner over them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SetBy {
    Caller,
    Owner,
}

/// The policy setters a route's rows run with: both for a route on one policy, else the caller.
fn setters(route: &AdminRoute) -> &'static [SetBy] {
    if route.path == "/admin/v1/policies/{id}" {
        &[SetBy::Caller, SetBy::Owner]
    } else {
        &[SetBy::Caller]
    }
}

/// Whether `role` may make `route`'s request beyond the access table: a member reads the
/// budgets on its keys but changes only the ones it set itself (DESIGN §3).
fn setter_allows(route: &AdminRoute, role: &str, set_by: SetBy) -> bool {
    !(role == "member" && set_by == SetBy::Owner && matches!(route.method, "patch" | "delete"))
}

/// A concrete request for `route` that `email` is entitled to make when its role allows it:
/// path ids point at fresh things the caller owns, bodies are valid and unique. Returns the
/// path, the body, and the token to send (logout and password change get a throwaway one).
async fn sample(
    admin: &Admin<'_>,
    mock: &MockUpstream,
    route: &AdminRoute,
    email: Option<&str>,
    set_by: SetBy,
    request_id: &str,
) -> (String, Option<Value>, Option<String>) {
    let owner = admin.login("owner@acme.test").await;
    // The caller's own token, fresh per call so that sign-out cannot spoil the next row.
    let token = match email {
        Some(e) => Some(admin.login(e).await),
        None => None,
    };
    let me = token.clone().unwrap_or_else(|| owner.clone());
    let id_of = |v: Value| v["id"].as_i64().unwrap();
    let fresh_dept = async || {
        id_of(
            admin
                .ok(
                    Method::POST,
                    "/admin/v1/departments",
                    &owner,
                    Some(json!({"name": unique("d")})),
                )
                .await,
        )
    };
    let fresh_member = async || {
        let body = json!({"email": format!("{}@acme.test", unique("m")), "role": "member"});
        id_of(
            admin
                .ok(Method::POST, "/admin/v1/members", &owner, Some(body))
                .await,
        )
    };
    // Keys and budgets are the caller's own, so a member may touch them.
    let fresh_key = async || {
        id_of(
            admin
                .ok(
                    Method::POST,
                    "/admin/v1/keys",
                    &me,
                    Some(json!({"name": unique("k")})),
                )
                .await,
        )
    };
    let fresh_upstream = async || {
        let body = json!({"name": unique("u"), "provider": "openai-compatible", "base_url": mock.base_url(),
            "api_key": "cred-fresh", "models": ["gpt-4o-mini"]});
        id_of(
            admin
                .ok(Method::POST, "/admin/v1/upstreams", &owner, Some(body))
                .await,
        )
    };
    let fresh_model = async || {
        id_of(
            admin
                .ok(
                    Method::POST,
                    "/admin/v1/models",
                    &owner,
                    Some(json!({"name": unique("model")})),
                )
                .await,
        )
    };
    let p = route.path;
    let (path, body) = match (route.method, p) {
        ("post", "/admin/v1/auth/login") => {
            let e = email.unwrap_or("owner@acme.test");
            (
                p.to_owned(),
                Some(json!({"email": e, "password": format!("pw-{e}")})),
            )
        }
        ("post", "/admin/v1/auth/password") => {
            let e = email.unwrap_or("owner@acme.test");
            let pw = format!("pw-{e}");
            (
                p.to_owned(),
                Some(json!({"current_password": pw, "new_password": pw})),
            )
        }
        ("patch", "/admin/v1/workspace") => (p.to_owned(), Some(json!({"timezone": "Asia/Shanghai"}))),
        ("post", "/admin/v1/departments") => (p.to_owned(), Some(json!({"name": unique("d")}))),
        ("patch", "/admin/v1/departments/{id}") => (
            format!("/admin/v1/departments/{}", fresh_dept().await),
            Some(json!({"name": unique("d")})),
        ),
        ("delete", "/admin/v1/departments/{id}") => {
            (format!("/admin/v1/departments/{}", fresh_dept().await), None)
        }
        ("post", "/admin/v1/members") => (
            p.to_owned(),
            Some(json!({"email": format!("{}@acme.test", unique("m")), "role": "member"})),
        ),
        ("get", "/admin/v1/members/{id}") => (format!("/admin/v1/members/{}", fresh_member().await), None),
        ("patch", "/admin/v1/members/{id}") => (
            format!("/admin/v1/members/{}", fresh_member().await),
            Some(json!({"department_id": null})),
        ),
        ("post", "/admin/v1/members/{id}/reset-password") => (
            format!("/admin/v1/members/{}/reset-password", fresh_member().await),
            None,
        ),
        ("post", "/admin/v1/keys") => (p.to_owned(), Some(json!({"name": unique("k")}))),
        (_, "/admin/v1/keys/{id}") => (format!("/admin/v1/keys/{}", fresh_key().await), None),
        (_, "/admin/v1/keys/{id}/breaker") => (format!("/admin/v1/keys/{}/breaker", fresh_key().await), None),
        ("post", "/admin/v1/policies") => (
            p.to_owned(),
            Some(
                json!({"subject": "apikey", "target_id": fresh_key().await, "metric": "requests",
                "window": "day", "limit": 10}),
            ),
        ),
        (m, "/admin/v1/policies/{id}") => {
            let body = json!({"subject": "apikey", "target_id": fresh_key().await, "metric": "requests",
                "window": "day", "limit": 10});
            let setter = match set_by {
                SetBy::Caller => &me,
                SetBy::Owner => &owner,
            };
            let id = id_of(
                admin
                    .ok(Method::POST, "/admin/v1/policies", setter, Some(body))
                    .await,
            );
            let patch = (m == "patch").then(|| json!({"limit": 20}));
            (format!("/admin/v1/policies/{id}"), patch)
        }
        ("post", "/admin/v1/upstreams") => (
            p.to_owned(),
            Some(json!({"name": unique("u"), "provider": "openai", "api_key": "cred-new", "models": ["m"]})),
        ),
        (m, "/admin/v1/upstreams/{id}") => (
            format!("/admin/v1/upstreams/{}", fresh_upstream().await),
            (m == "patch").then(|| json!({"priority": 3})),
        ),
        ("post", "/admin/v1/upstreams/{id}/test") => (
            format!("/admin/v1/upstreams/{}/test", fresh_upstream().await),
            None,
        ),
        ("post", "/admin/v1/models") => (p.to_owned(), Some(json!({"name": unique("model")}))),
        (m, "/admin/v1/models/{id}") => (
            format!("/admin/v1/models/{}", fresh_model().await),
            (m == "patch").then(|| json!({"price": {"prompt": 0.5, "completion": 1.5}})),
        ),
        ("get", "/admin/v1/logs/{request_id}") => (format!("/admin/v1/logs/{request_id}"), None),
        ("get", path) if !path.contains('{') => (path.to_owned(), None),
        ("post", "/admin/v1/auth/logout") => (p.to_owned(), None),
        other => panic!("the matrix has no sample for {other:?}: add one"),
    };
    (path, body, token)
}

async fn every_route_for_every_role(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    // One request of ada's, so a log exists that every role may read.
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat).await.status(),
        200
    );
    let request_id = app.logs("acme", 1).await[0].request_id.clone();

    let mut checked = 0;
    let mut refused_by_setter = 0;
    for route in ROUTES {
        for (role, email) in ROLES {
            for &set_by in setters(route) {
                let (path, body, token) = sample(&admin, &mock, route, email, set_by, &request_id).await;
                let method = Method::from_bytes(route.method.to_uppercase().as_bytes()).unwrap();
                let (status, v) = admin.call(method, &path, token.as_deref(), body).await;
                let what = format!(
                    "{} {} as {role}, policy set by {set_by:?}",
                    route.method, route.path
                );
                if !role_allows(route.need, role) && role == "anonymous" {
                    assert_eq!(
                        (status, v["error"]["code"].as_str()),
                        (401, Some("invalid_token")),
                        "{what}"
                    );
                } else if !role_allows(route.need, role) {
                    assert_eq!(
                        (status, v["error"]["code"].as_str()),
                        (403, Some("forbidden")),
                        "{what}"
                    );
                } else if !setter_allows(route, role, set_by) {
                    assert_eq!(
                        (status, v["error"]["code"].as_str()),
                        (403, Some("forbidden")),
                        "{what}"
                    );
                    let message = v["error"]["message"].as_str().unwrap_or_default();
                    assert!(
                        message.contains("set by an owner or admin"),
                        "{what}: the refusal says who can change it: {message}"
                    );
                    refused_by_setter += 1;
                } else {
                    assert!(
                        (200..300).contains(&status),
                        "{what}: expected success, got {status} {v}"
                    );
                }
                checked += 1;
            }
        }
    }
    let rows: usize = ROUTES.iter().map(|r| setters(r).len() * ROLES.len()).sum();
    assert_eq!(checked, rows);
    assert_eq!(
        refused_by_setter, 2,
        "a member's PATCH and DELETE of an owner's policy"
    );
    assert!(ROUTES.len() >= 40, "the table covers the whole API");
    app.stop().await;
}

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

async fn a_guardrail_change_is_enforced_on_the_next_request_and_audited(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let members = admin.ok(Method::GET, "/admin/v1/members", &owner, None).await;
    let ada = members["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["email"] == "ada@acme.test")
        .unwrap()["id"]
        .as_i64()
        .unwrap();
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

async fn sign_out_and_password_change_revoke_tokens(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let first = admin.login("ada@acme.test").await;
    let second = admin.login("ada@acme.test").await;
    admin
        .ok(Method::POST, "/admin/v1/auth/logout", &first, None)
        .await;
    for t in [&first, &second] {
        let (status, _) = admin.call(Method::GET, "/admin/v1/me", Some(t), None).await;
        assert_eq!(status, 401, "sign-out revokes every token of the member");
    }

    let token = admin.login("ada@acme.test").await;
    let wrong = json!({"current_password": "not-it", "new_password": "a-brand-new-password"});
    let (status, v) = admin
        .call(Method::POST, "/admin/v1/auth/password", Some(&token), Some(wrong))
        .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (422, Some("current_password"))
    );
    let short = json!({"current_password": "pw-ada@acme.test", "new_password": "short"});
    let (status, v) = admin
        .call(Method::POST, "/admin/v1/auth/password", Some(&token), Some(short))
        .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (422, Some("new_password"))
    );
    let change = json!({"current_password": "pw-ada@acme.test", "new_password": "a-brand-new-password"});
    let v = admin
        .ok(Method::POST, "/admin/v1/auth/password", &token, Some(change))
        .await;
    let fresh = v["token"].as_str().unwrap().to_owned();
    let (status, _) = admin.call(Method::GET, "/admin/v1/me", Some(&token), None).await;
    assert_eq!(status, 401, "the old token is revoked");
    admin.ok(Method::GET, "/admin/v1/me", &fresh, None).await;
    let (status, _) = admin
        .call(
            Method::POST,
            "/admin/v1/auth/login",
            None,
            Some(json!({"email": "ada@acme.test", "password": "a-brand-new-password"})),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = admin
        .call(
            Method::POST,
            "/admin/v1/auth/login",
            None,
            Some(json!({"email": "ada@acme.test", "password": "pw-ada@acme.test"})),
        )
        .await;
    assert_eq!(status, 401);
    app.stop().await;
}

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

async fn members_are_invited_changed_and_deactivated(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let admin_token = admin.login("admin@acme.test").await;
    let depts = admin.ok(Method::GET, "/admin/v1/departments", &owner, None).await;
    let research = depts["data"][0]["id"].as_i64().unwrap();

    let invited = admin
        .ok(
            Method::POST,
            "/admin/v1/members",
            &admin_token,
            Some(json!({"email": "cy@acme.test", "role": "member", "department_id": research})),
        )
        .await;
    let cy = invited["id"].as_i64().unwrap();
    let otp = invited["one_time_password"].as_str().unwrap().to_owned();
    let (status, v) = admin
        .call(
            Method::POST,
            "/admin/v1/auth/login",
            None,
            Some(json!({"email": "cy@acme.test", "password": otp})),
        )
        .await;
    assert_eq!(status, 200);
    let cy_token = v["token"].as_str().unwrap().to_owned();
    let listed = admin
        .ok(Method::GET, "/admin/v1/members", &admin_token, None)
        .await;
    assert!(!listed.to_string().contains("password_hash"));
    assert!(
        !listed.to_string().contains(&otp),
        "the one-time password is shown once"
    );

    // Only the owner grants the owner role; the last owner stays.
    let (status, _) = admin
        .call(
            Method::PATCH,
            &format!("/admin/v1/members/{cy}"),
            Some(&admin_token),
            Some(json!({"role": "owner"})),
        )
        .await;
    assert_eq!(status, 403);
    let me = admin.ok(Method::GET, "/admin/v1/me", &owner, None).await;
    let owner_id = me["id"].as_i64().unwrap();
    let (status, v) = admin
        .call(
            Method::PATCH,
            &format!("/admin/v1/members/{owner_id}"),
            Some(&owner),
            Some(json!({"role": "admin"})),
        )
        .await;
    assert_eq!(status, 409, "{v}");

    // Cy's key works until cy is deactivated; then neither the key nor the token does.
    let key = admin
        .ok(
            Method::POST,
            "/admin/v1/keys",
            &cy_token,
            Some(json!({"name": "laptop"})),
        )
        .await;
    let plaintext = key["key"].as_str().unwrap().to_owned();
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        app.post_json("/v1/chat/completions", &plaintext, &chat)
            .await
            .status(),
        200
    );
    let changed = admin
        .ok(
            Method::PATCH,
            &format!("/admin/v1/members/{cy}"),
            &admin_token,
            Some(json!({"active": false, "department_id": null})),
        )
        .await;
    assert_eq!(
        (changed["active"].as_bool(), changed["department_id"].is_null()),
        (Some(false), true)
    );
    assert_eq!(
        app.post_json("/v1/chat/completions", &plaintext, &chat)
            .await
            .status(),
        401
    );
    let (status, _) = admin
        .call(Method::GET, "/admin/v1/me", Some(&cy_token), None)
        .await;
    assert_eq!(status, 401);

    // A deleted key stops at once.
    let ada = admin.login("ada@acme.test").await;
    let k = admin
        .ok(
            Method::POST,
            "/admin/v1/keys",
            &ada,
            Some(json!({"name": "temp"})),
        )
        .await;
    let temp = k["key"].as_str().unwrap().to_owned();
    assert_eq!(
        app.post_json("/v1/chat/completions", &temp, &chat).await.status(),
        200
    );
    admin
        .ok(Method::DELETE, &format!("/admin/v1/keys/{}", k["id"]), &ada, None)
        .await;
    assert_eq!(
        app.post_json("/v1/chat/completions", &temp, &chat).await.status(),
        401
    );
    app.stop().await;
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
        .client
        .get(format!("{}/admin/v1/logs/export?model=gpt-4o-mini", app.address))
        .bearer_auth(&owner)
        .send()
        .await
        .unwrap();
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
    // A key's last use is written behind with its logs (just after them).
    let mut ci = Value::Null;
    for _ in 0..100 {
        let keys = admin.ok(Method::GET, "/admin/v1/keys", &owner, None).await;
        ci = keys["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == "ci")
            .unwrap()
            .clone();
        if ci["last_used_at"].is_i64() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
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
    let r = app
        .client
        .get(format!("{}/admin/v1/logs/export?status=404", app.address))
        .bearer_auth(&owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let csv = r.text().await.unwrap();
    for cell in [",'=1+2,", ",'\t=1+2,", ",\"'\r=1+2\",", ",'@SUM(A1),"] {
        assert!(csv.contains(cell), "{cell:?} in {csv}");
    }
    app.stop().await;
}

/// A change made through one gateway is enforced by another on the same database within a
/// second, without a restart (the configuration epoch every gateway polls).
#[tokio::test]
async fn a_change_on_one_gateway_reaches_the_other_within_a_second() {
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
    let started = std::time::Instant::now();
    loop {
        let status = b.post_json("/v1/chat/completions", KEY, &chat).await.status();
        if status == 429 {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "the other gateway still serves after a second"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    a.stop().await;
    b.stop().await;
}
