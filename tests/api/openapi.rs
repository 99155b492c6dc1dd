//! `openapi.yaml` describes every route the gateway serves and no other: its operations are
//! compared with the route tables the routers are built from (`aigw::admin::ROUTES`,
//! `aigw::proxy::ROUTES`, `aigw::app::HEALTH_ROUTES` and `METRICS_ROUTES`), and each admin operation's `x-aigw-least-role`
//! with the role the admin guard enforces. schemathesis (`tests/openapi/run`, in `.ci/run`) checks
//! the rest of the spec against a running gateway.
//!
//! The console's static files (`/console`, `/console/`, `/console/{*path}`, src/console.rs) are not
//! an API and are deliberately left out of the spec; the test checks that the spec names none.
//!
//! The `paths:` block is read by hand rather than with a YAML crate: the spec keeps one plain
//! layout (a path per 2-space key, an operation per 4-space key), and anything else in that
//! block fails the test instead of being skipped.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::both_backends;
use crate::helpers::{Setup, TestDb, spawn_app};

/// (method in lowercase, path template).
type Route = (String, String);

const SPEC: &str = include_str!("../../openapi.yaml");

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Keys a path item may hold besides its operations.
const PATH_ITEM_KEYS: &[&str] = &["parameters", "summary", "description", "servers"];

/// Every operation of the spec's `paths:` block, with its `x-aigw-least-role` if it has one.
fn spec_operations(text: &str) -> BTreeMap<Route, Option<String>> {
    let mut ops = BTreeMap::new();
    let mut lines = text.lines().skip_while(|l| *l != "paths:");
    assert!(lines.next().is_some(), "openapi.yaml has no top-level `paths:`");
    let mut path: Option<String> = None;
    let mut operation: Option<Route> = None;
    for line in lines {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        if indent == 0 {
            break; // the next top-level key
        }
        let key = || {
            trimmed
                .strip_suffix(':')
                .unwrap_or_else(|| panic!("openapi.yaml: expected a block key, found {line:?}"))
        };
        match indent {
            2 => {
                let p = key().trim_matches(|c| c == '\'' || c == '"');
                assert!(
                    p.starts_with('/'),
                    "openapi.yaml: {p:?} under paths: is not a path"
                );
                path = Some(p.to_owned());
                operation = None;
            }
            4 => {
                let k = trimmed.split_once(':').map_or(trimmed, |(k, _)| k);
                let p = path
                    .clone()
                    .unwrap_or_else(|| panic!("openapi.yaml: {line:?} outside a path"));
                if METHODS.contains(&k) {
                    key(); // an operation is a block
                    let route = (k.to_owned(), p);
                    assert!(
                        ops.insert(route.clone(), None).is_none(),
                        "openapi.yaml: {route:?} twice"
                    );
                    operation = Some(route);
                } else {
                    assert!(
                        PATH_ITEM_KEYS.contains(&k),
                        "openapi.yaml: unexpected key {k:?} in path {p}"
                    );
                    operation = None;
                }
            }
            6 => {
                if let (Some(op), Some(role)) = (&operation, trimmed.strip_prefix("x-aigw-least-role:")) {
                    ops.insert(op.clone(), Some(role.trim().to_owned()));
                }
            }
            _ => {}
        }
    }
    ops
}

/// Every route the server has, as the routers are built.
fn server_routes() -> BTreeSet<Route> {
    let admin = aigw::admin::ROUTES.iter().map(|r| (r.method, r.path));
    let proxy = aigw::proxy::ROUTES.iter().copied();
    let ops = aigw::app::HEALTH_ROUTES
        .iter()
        .chain(aigw::app::METRICS_ROUTES)
        .copied();
    admin
        .chain(proxy)
        .chain(ops)
        .map(|(m, p)| (m.to_owned(), p.to_owned()))
        .collect()
}

/// What the spec lacks, and what it has that the server does not.
fn differences(spec: &BTreeSet<Route>, server: &BTreeSet<Route>) -> (Vec<Route>, Vec<Route>) {
    (
        server.difference(spec).cloned().collect(),
        spec.difference(server).cloned().collect(),
    )
}

#[test]
fn the_spec_describes_every_route_and_no_other() {
    let spec: BTreeSet<Route> = spec_operations(SPEC).into_keys().collect();
    let server = server_routes();
    assert!(server.len() > 40, "the route tables look empty: {server:?}");
    let (missing, extra) = differences(&spec, &server);
    assert!(
        missing.is_empty() && extra.is_empty(),
        "openapi.yaml and the server disagree.\n  routes the spec lacks: {missing:?}\n  \
         operations the server does not have: {extra:?}"
    );
    let console: Vec<_> = spec.iter().filter(|(_, p)| p.starts_with("/console")).collect();
    assert!(
        console.is_empty(),
        "the console is left out of the spec: {console:?}"
    );
}

#[test]
fn each_admin_operation_names_the_role_the_guard_enforces() {
    let spec = spec_operations(SPEC);
    for route in aigw::admin::ROUTES {
        let key = (route.method.to_owned(), route.path.to_owned());
        let expected = format!("{:?}", route.need).to_lowercase();
        assert_eq!(
            spec.get(&key).cloned().flatten().as_deref(),
            Some(expected.as_str()),
            "x-aigw-least-role of {} {}",
            route.method,
            route.path
        );
    }
}

#[test]
fn an_extra_route_on_either_side_is_reported() {
    let yaml = "openapi: 3.1.0\npaths:\n  /a:\n    parameters: []\n    get:\n      summary: a\n      \
                x-aigw-least-role: member\n  '/b/{id}':\n    delete:\n      responses: {}\ncomponents: {}\n";
    let ops = spec_operations(yaml);
    let route = |m: &str, p: &str| (m.to_owned(), p.to_owned());
    assert_eq!(ops.get(&route("get", "/a")), Some(&Some("member".to_owned())));
    let spec: BTreeSet<Route> = ops.into_keys().collect();
    assert_eq!(
        spec,
        BTreeSet::from([route("get", "/a"), route("delete", "/b/{id}")])
    );
    let server = BTreeSet::from([route("get", "/a"), route("post", "/c")]);
    assert_eq!(
        differences(&spec, &server),
        (vec![route("post", "/c")], vec![route("delete", "/b/{id}")])
    );
}

#[test]
#[should_panic(expected = "unexpected key")]
fn an_unreadable_paths_block_fails_instead_of_being_skipped() {
    spec_operations("paths:\n  /a:\n    $ref: '#/x'\n");
}

both_backends!(what_schemathesis_found_stays_fixed);

/// Two server bugs schemathesis found against this spec: a JSON array read as a struct, field by
/// field (`[null, null]` took a member out of their department), and `to` near i64::MIN
/// overflowing the default `from` of the usage query (a panic in debug builds).
async fn what_schemathesis_found_stays_fixed(db: TestDb) {
    let app = spawn_app(&db, Setup::default()).await;
    let token = &app.login("owner@example.test", "owner-password").await;
    let me: Value = app.get_as("/admin/v1/me", token).await.json().await.unwrap();
    for body in ["[null, null]", " [\"member\"]", "\"x\"", "1"] {
        let r = app
            .client
            .patch(format!("{}/admin/v1/members/{}", app.address, me["id"]))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], "invalid_request_error", "{body}");
    }
    let r = app
        .get_as(&format!("/admin/v1/usage?to={}", i64::MIN), token)
        .await;
    assert_eq!(r.status(), 422);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "from");
}
