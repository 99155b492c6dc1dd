//! Every admin route for every role, as the access table says.

use super::*;
use aigw::admin::{AdminRoute, Need, ROUTES};

both_backends!(every_route_for_every_role,);

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
        ("post", "/admin/v1/keys/{id}/rotate") => (
            format!("/admin/v1/keys/{}/rotate", fresh_key().await),
            Some(json!({"grace_seconds": 60})),
        ),
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
        ("post", "/admin/v1/tokens") => (p.to_owned(), Some(json!({"name": unique("t"), "role": "member"}))),
        ("delete", "/admin/v1/tokens/{id}") => {
            let body = json!({"name": unique("t"), "role": "member"});
            let t = admin
                .ok(Method::POST, "/admin/v1/tokens", &owner, Some(body))
                .await;
            (format!("/admin/v1/tokens/{}", id_of(t)), None)
        }
        ("get", "/admin/v1/logs/{request_id}") => (format!("/admin/v1/logs/{request_id}"), None),
        ("post", "/admin/v1/alerts/{id}/retry") => {
            // The alert the matrix's first request fired, never delivered (nothing listens).
            let alerts = admin.ok(Method::GET, "/admin/v1/alerts", &owner, None).await;
            (
                format!("/admin/v1/alerts/{}/retry", alerts["data"][0]["id"]),
                None,
            )
        }
        ("get", "/admin/v1/labels") => (format!("{p}?kind=end_user"), None),
        ("delete", "/admin/v1/labels") => (format!("{p}?kind=tag&unseen_days=30"), None),
        ("get", path) if !path.contains('{') => (path.to_owned(), None),
        ("post", "/admin/v1/auth/logout") => (p.to_owned(), None),
        other => panic!("the matrix has no sample for {other:?}: add one"),
    };
    (path, body, token)
}

async fn every_route_for_every_role(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    // The alert's webhook is on loopback, where nothing listens.
    let loopback = |s: &mut aigw::Settings| {
        s.alert_webhook_allow = vec!["127.0.0.1".parse().unwrap()];
    };
    let setup = Setup {
        settings: Box::new(loopback),
        ..Setup::resources(resources(&mock))
    };
    let app = spawn_app(&db, setup).await;
    let admin = Admin { app: &app };
    // A budget alert on ada's requests whose receiver is down, for the alert routes: it fires at
    // her first request and stays pending.
    let owner = admin.login("owner@acme.test").await;
    let ada = app.member_id(&owner, "ada@acme.test").await;
    let alerting = json!({"subject": "member", "target_id": ada, "metric": "requests", "window": "day",
        "limit": 100, "alerts": {"at": [1], "webhook": "http://127.0.0.1:9/nobody-listens"}});
    admin
        .ok(Method::POST, "/admin/v1/policies", &owner, Some(alerting))
        .await;
    // One request of ada's, so a log exists that every role may read.
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        app.post_json("/v1/chat/completions", KEY, &chat).await.status(),
        200
    );
    let request_id = app.logs("acme", 1).await[0].request_id.clone();
    app.sync().await;

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
                } else if route.path.starts_with("/admin/v1/auth/oidc/") {
                    // Public; without single sign-on configured, not found for everyone (sso.rs
                    // drives them configured).
                    assert_eq!(
                        (status, v["error"]["code"].as_str()),
                        (404, Some("not_found")),
                        "{what}"
                    );
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
