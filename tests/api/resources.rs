//! The resources file: applied idempotently at every start, `${VAR}` expanded, bad files refused
//! before anything is written.

use aigw::store::{KeyStore, MemberStore, ModelStore, PolicyStore, UpstreamStore, WorkspaceStore};

use crate::both_backends;
use crate::helpers::{Setup, TestApp, TestDb, spawn_app, try_spawn_app};

both_backends!(
    full_file_applies_and_reapplies_unchanged,
    bad_files_are_refused_and_change_nothing,
    secret_is_sealed_at_rest,
    editing_the_file_updates_in_place,
    what_the_file_declares_is_marked_managed_in_the_admin_api
);

pub const KEY: &str = "sk-aigw-0123456789abcdefghijABCDEFGHIJ01";

pub fn full_file(base_url: &str) -> String {
    format!(
        r#"
[[workspace]]
name = "acme"

[[department]]
workspace = "acme"
name = "research"

[[member]]
workspace = "acme"
department = "research"
email = "ada@acme.test"
role = "member"
password = "ada-password-1"

[[api_key]]
member = "ada@acme.test"
name = "ci"
key = "{KEY}"

[[upstream]]
workspace = "acme"
name = "openai-main"
provider = "openai-compatible"
base_url = "{base_url}"
api_key = "${{AIGW_TEST_UPSTREAM_SECRET}}"
models = ["gpt-4o-mini", {{ name = "fast", upstream = "gpt-4o-mini" }}]
priority = 0
weight = 1
max_in_flight = 64
limits = {{ requests_per_minute = 20, requests_per_day = 50 }}
quota_group = "account-1"

[[model]]
workspace = "acme"
name = "fast"
price = {{ prompt = 0.1, completion = 0.2 }}

[[model]]
workspace = "acme"
name = "gpt-4o-mini"
fallbacks = ["fast"]
price = {{ prompt = 0.15, completion = 0.60 }}

[[policy]]
workspace = "acme"
subject = "apikey"
target = "ada@acme.test/ci"
metric = "total_tokens"
window = "day"
limit = 100000
mode = "enforce"

[[policy]]
workspace = "acme"
subject = "member"
target = "*"
metric = "credits"
window = "5minutes"
limit = 2.5
mode = "shadow"
"#
    )
}

pub const SECRET: &str = "sk-upstream-very-secret-4f1c2b";

fn set_secret_env() {
    // SAFETY: every test that reads it sets the same value; no test unsets it.
    unsafe { std::env::set_var("AIGW_TEST_UPSTREAM_SECRET", SECRET) };
}

/// Everything the file declares, as comparable text.
async fn snapshot(app: &TestApp) -> String {
    let s = &app.state.store;
    let ws = s.workspace_by_name("acme").await.unwrap().unwrap();
    let ada = s.member_by_email("ada@acme.test").await.unwrap().unwrap();
    let keys = s.keys_of_member(ada.id).await.unwrap();
    let ups = s.all_upstreams().await.unwrap();
    let models = s.all_models().await.unwrap();
    let policies = s.all_policies().await.unwrap();
    format!("{ws:?}\n{ada:?}\n{keys:?}\n{ups:?}\n{models:?}\n{policies:?}")
}

async fn full_file_applies_and_reapplies_unchanged(db: TestDb) {
    set_secret_env();
    let text = full_file("http://127.0.0.1:9/v1");
    let app = spawn_app(&db, Setup::resources(text.clone())).await;
    let first = snapshot(&app).await;
    let s = &app.state.store;
    let ws = s.workspace_by_name("acme").await.unwrap().unwrap();
    let up = s.upstream_by_name(ws.id, "openai-main").await.unwrap().unwrap();
    assert_eq!(up.provider, "openai-compatible");
    assert_eq!(up.requests_per_minute, Some(20));
    assert_eq!(up.requests_per_day, Some(50));
    assert_eq!(up.tokens_per_minute, None);
    assert_eq!(up.quota_group.as_deref(), Some("account-1"));
    let served = up.served_models();
    assert_eq!(served.len(), 2);
    assert_eq!(
        (served[1].name.as_str(), served[1].upstream.as_str()),
        ("fast", "gpt-4o-mini")
    );
    assert_eq!(app.state.master_key.open(&up.secret_sealed).unwrap(), SECRET);
    let m = s.model_by_name(ws.id, "gpt-4o-mini").await.unwrap().unwrap();
    assert_eq!(
        (m.price_prompt, m.price_completion),
        (150_000, 600_000),
        "micro-credits per million tokens"
    );
    assert_eq!(m.fallback_names(), vec!["fast".to_owned()]);
    let policies = s.all_policies().await.unwrap();
    assert_eq!(policies.len(), 2);
    let credits = policies.iter().find(|p| p.metric == "credits").unwrap();
    assert_eq!(
        (credits.limit_value, credits.mode.as_str(), credits.target_id),
        (2_500_000, "shadow", 0)
    );
    assert_eq!(credits.time_window, "5minutes");
    let key = s
        .identity_by_hash(&aigw::kernel::crypto::hash_api_key(KEY))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(key.key_name, "ci");
    app.stop().await;

    // Applying the same file again changes nothing at all.
    let app = spawn_app(&db, Setup::resources(text)).await;
    assert_eq!(snapshot(&app).await, first);
    let ws = app.state.store.workspace_by_name("acme").await.unwrap().unwrap();
    let summary = aigw::resources::apply_text(
        &app.state.store,
        &app.state.master_key,
        "again.toml",
        &full_file("http://127.0.0.1:9/v1"),
        &|k| std::env::var(k).ok(),
        0,
    )
    .await
    .unwrap();
    assert_eq!((summary.created, summary.updated), (0, 0), "{summary}");
    assert_eq!(summary.unchanged, 9);
    assert_eq!(snapshot(&app).await, first);
    assert_eq!(ws.name, "acme");
    app.stop().await;
}

async fn editing_the_file_updates_in_place(db: TestDb) {
    set_secret_env();
    let app = spawn_app(&db, Setup::resources(full_file("http://127.0.0.1:9/v1"))).await;
    let before = app.state.store.all_policies().await.unwrap();
    app.stop().await;
    let edited = full_file("http://127.0.0.1:9/v1").replace("limit = 100000", "limit = 5000");
    let app = spawn_app(&db, Setup::resources(edited)).await;
    let after = app.state.store.all_policies().await.unwrap();
    assert_eq!(after.len(), before.len(), "edited, not duplicated");
    let p = after.iter().find(|p| p.subject == "apikey").unwrap();
    assert_eq!(p.limit_value, 5000);
    assert_eq!(
        p.id,
        before.iter().find(|p| p.subject == "apikey").unwrap().id,
        "same row"
    );
    app.stop().await;
}

async fn secret_is_sealed_at_rest(db: TestDb) {
    set_secret_env();
    let app = spawn_app(&db, Setup::resources(full_file("http://127.0.0.1:9/v1"))).await;
    let ups = app.state.store.all_upstreams().await.unwrap();
    assert!(!format!("{ups:?}").contains(SECRET));
    app.stop().await;
    if db.backend == "sqlite" {
        for entry in std::fs::read_dir(db.dir.path()).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if name.starts_with("aigw.db") {
                // The -wal and -shm files vanish when the last connection closes.
                let Ok(bytes) = std::fs::read(&path) else { continue };
                let hay = String::from_utf8_lossy(&bytes);
                assert!(!hay.contains(SECRET), "upstream secret found in {name}");
                assert!(!hay.contains(KEY), "gateway key found in {name}");
                assert!(!hay.contains("ada-password-1"), "password found in {name}");
            }
        }
    }
}

/// Each bad file, and what its refusal must name.
const BAD_FILES: &[(&str, &str, &[&str])] = &[
    (
        "unknown field",
        "[[workspace]]\nname = \"acme\"\ncolour = \"red\"\n",
        &["unknown field `colour`", "line 3"],
    ),
    (
        "unknown table",
        "[[workspaces]]\nname = \"acme\"\n",
        &["unknown field `workspaces`"],
    ),
    (
        "dangling member",
        "[[workspace]]\nname = \"acme\"\n\n[[api_key]]\nmember = \"ghost@acme.test\"\nname = \"ci\"\n",
        &[
            "[[api_key]] #1",
            "line 4",
            "member \"ghost@acme.test\" does not exist",
        ],
    ),
    (
        "bad window",
        "[[workspace]]\nname = \"acme\"\n[[policy]]\nworkspace = \"acme\"\nsubject = \"ws\"\ntarget = \"acme\"\nmetric = \"requests\"\nwindow = \"7minutes\"\nlimit = 10\n",
        &["[[policy]] #1", "line 3", "7minutes"],
    ),
    (
        "unknown workspace",
        "[[department]]\nworkspace = \"nowhere\"\nname = \"r\"\n",
        &["workspace \"nowhere\" does not exist"],
    ),
    (
        "bad provider",
        "[[workspace]]\nname = \"acme\"\n[[upstream]]\nworkspace = \"acme\"\nname = \"u\"\nprovider = \"openia\"\napi_key = \"x\"\n",
        &["[[upstream]] #1", "unknown provider \"openia\""],
    ),
    (
        "missing variable",
        "[[workspace]]\nname = \"acme\"\n[[upstream]]\nworkspace = \"acme\"\nname = \"u\"\nprovider = \"openai\"\napi_key = \"${AIGW_TEST_SURELY_UNSET}\"\n",
        &["AIGW_TEST_SURELY_UNSET is not set"],
    ),
    (
        "bad metric",
        "[[workspace]]\nname = \"acme\"\n[[policy]]\nworkspace = \"acme\"\nsubject = \"ws\"\ntarget = \"*\"\nmetric = \"tokens\"\nwindow = \"day\"\nlimit = 10\n",
        &["unknown metric \"tokens\""],
    ),
    (
        "bad key shape",
        "[[workspace]]\nname = \"acme\"\n[[member]]\nworkspace = \"acme\"\nemail = \"a@acme.test\"\nrole = \"member\"\n[[api_key]]\nmember = \"a@acme.test\"\nname = \"k\"\nkey = \"sk-short\"\n",
        &["[[api_key]] #1", "key must be"],
    ),
    (
        "unknown fallback",
        "[[workspace]]\nname = \"acme\"\n[[model]]\nworkspace = \"acme\"\nname = \"m\"\nfallbacks = [\"nope\"]\n",
        &["fallback model \"nope\" does not exist"],
    ),
    (
        "bad role",
        "[[workspace]]\nname = \"acme\"\n[[member]]\nworkspace = \"acme\"\nemail = \"a@acme.test\"\nrole = \"king\"\n",
        &["unknown role \"king\""],
    ),
    (
        "wrong type",
        "[[workspace]]\nname = 5\n",
        &["line 2", "invalid type"],
    ),
    ("not toml", "[[workspace\nname=", &["resources file"]),
    (
        "empty allow-list",
        "[[workspace]]\nname = \"acme\"\n[[member]]\nworkspace = \"acme\"\nemail = \"a@acme.test\"\nrole = \"member\"\n[[api_key]]\nmember = \"a@acme.test\"\nname = \"k\"\nallowed_models = []\n",
        &[
            "[[api_key]] #1",
            "line 7",
            "allowed_models must list at least one model",
        ],
    ),
    (
        "star inside a pattern",
        "[[workspace]]\nname = \"acme\"\n[[member]]\nworkspace = \"acme\"\nemail = \"a@acme.test\"\nrole = \"member\"\nallowed_models = [\"gpt-*-mini\"]\n",
        &["[[member]] #1", "line 3", "\"gpt-*-mini\"", "a * may only end it"],
    ),
    (
        "a credits limit beyond what micro-credits can store",
        "[[workspace]]\nname = \"acme\"\n[[policy]]\nworkspace = \"acme\"\nsubject = \"ws\"\ntarget = \"acme\"\nmetric = \"credits\"\nwindow = \"day\"\nlimit = 8.9e15\n",
        &["[[policy]] #1", "line 3", "limit of credits", "9,223,372,036,854"],
    ),
    (
        "a requests limit beyond a 64-bit integer",
        "[[workspace]]\nname = \"acme\"\n[[policy]]\nworkspace = \"acme\"\nsubject = \"ws\"\ntarget = \"acme\"\nmetric = \"requests\"\nwindow = \"day\"\nlimit = 1e19\n",
        &["[[policy]] #1", "limit", "9,223,372,036,854,775,807"],
    ),
    (
        "a price beyond what micro-credits can store",
        "[[workspace]]\nname = \"acme\"\n[[model]]\nworkspace = \"acme\"\nname = \"m\"\nprice = { prompt = 1e13, completion = 0 }\n",
        &["[[model]] #1", "price", "9,223,372,036,854"],
    ),
    (
        "zero in flight",
        "[[workspace]]\nname = \"acme\"\n[[member]]\nworkspace = \"acme\"\nemail = \"a@acme.test\"\nrole = \"member\"\nmax_in_flight = 0\n",
        &["[[member]] #1", "max_in_flight must be between 1 and 1000000"],
    ),
];

async fn bad_files_are_refused_and_change_nothing(db: TestDb) {
    for (what, text, needles) in BAD_FILES {
        let err = match try_spawn_app(&db, Setup::resources(*text)).await {
            Ok(_) => panic!("{what}: a bad resources file was accepted"),
            Err(e) => e.to_string(),
        };
        for needle in *needles {
            assert!(err.contains(needle), "{what}: {err:?} should contain {needle:?}");
        }
    }
    // Nothing of the refused files was written: the workspace they all declare does not exist.
    let app = spawn_app(&db, Setup::default()).await;
    assert!(app.state.store.workspace_by_name("acme").await.unwrap().is_none());
    app.stop().await;
}

both_backends!(every_problem_of_a_file_is_named_at_once);

/// A file with several problems names each, with its entry and line, in one refusal: first
/// every entry that does not parse (a mistyped field or table gets the name it most likely
/// meant), then, once all parse, every entry that does not check.
async fn every_problem_of_a_file_is_named_at_once(db: TestDb) {
    let shape = "[[workspace]]\nname = \"acme\"\ntimezon = \"UTC\"\n\n\
                 [[member]]\nworkspace = \"acme\"\nemial = \"a@acme.test\"\nrole = \"member\"\n\n\
                 [[modle]]\nname = \"m\"\n\n\
                 [[upstream]]\nworkspace = \"acme\"\nname = \"u\"\nprovider = \"openai\"\napi_key = \"k\"\npriority = \"high\"\n";
    let err = try_spawn_app(&db, Setup::resources(shape))
        .await
        .err()
        .expect("refused");
    let err = err.to_string();
    let expected = [
        "[[workspace]] #1 (line 3, \"acme\"): unknown field `timezon` (did you mean `timezone`?)",
        "[[member]] #1 (line 7, \"?\"): unknown field `emial` (did you mean `email`?)",
        "line 10: unknown field `modle` (did you mean `model`?)",
        "[[upstream]] #1 (line 18, \"u\"): priority: invalid type: string \"high\", expected i64",
    ];
    for needle in expected {
        assert!(err.contains(needle), "{needle:?} not in:\n{err}");
    }
    assert_eq!(err.lines().count(), expected.len(), "{err}");

    let references = "[[workspace]]\nname = \"acme\"\n\n\
                      [[department]]\nworkspace = \"acne\"\nname = \"r\"\n\n\
                      [[api_key]]\nmember = \"ghost@acme.test\"\nname = \"ci\"\n\n\
                      [[policy]]\nworkspace = \"acme\"\nsubject = \"ws\"\ntarget = \"acme\"\nmetric = \"requests\"\nwindow = \"7minutes\"\nlimit = 1\n";
    let err = try_spawn_app(&db, Setup::resources(references))
        .await
        .err()
        .expect("refused");
    let err = err.to_string();
    let expected = [
        "[[department]] #1 (line 4, \"r\"): workspace \"acne\" does not exist",
        "[[api_key]] #1 (line 8, \"ghost@acme.test/ci\"): member \"ghost@acme.test\" does not exist",
        "[[policy]] #1 (line 12, \"ws acme\")",
    ];
    for needle in expected {
        assert!(err.contains(needle), "{needle:?} not in:\n{err}");
    }
    assert_eq!(err.lines().count(), expected.len(), "{err}");
    let app = spawn_app(&db, Setup::default()).await;
    assert!(app.state.store.workspace_by_name("acme").await.unwrap().is_none());
    app.stop().await;
}

both_backends!(example_file_applies);

/// The README walkthrough's file stays valid.
async fn example_file_applies(db: TestDb) {
    // SAFETY: tests that read these set the same values.
    unsafe {
        std::env::set_var("ADA_PASSWORD", "ada-demo-password");
        std::env::set_var("MOCK_UPSTREAM_KEY", "mock-key");
    }
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/resources.toml")).unwrap();
    let app = spawn_app(&db, Setup::resources(text)).await;
    let ws = app
        .state
        .store
        .workspace_by_name("acme")
        .await
        .unwrap()
        .expect("example workspace");
    let upstreams = app.state.store.all_upstreams().await.unwrap();
    assert_eq!(upstreams.len(), 3);
    // MOCK_PORT is set by no test in this process: the file's default port stands.
    for u in &upstreams {
        assert_eq!(u.base_url, "http://127.0.0.1:18080/v1", "{}", u.name);
    }
    assert!(
        app.state
            .store
            .model_by_name(ws.id, "claude-sonnet")
            .await
            .unwrap()
            .is_some()
    );
    app.stop().await;
}

/// `GET path` as the bootstrap owner (the owner of the file's workspace).
async fn admin_get(app: &TestApp, token: &str, path: &str) -> serde_json::Value {
    let r = app.get_as(&format!("/admin/v1/{path}"), token).await;
    assert_eq!(r.status(), 200, "GET {path}");
    r.json().await.unwrap()
}

/// Every entity the file declares says so in the admin API (an edit to it would be undone at the
/// next start); what was made through the API, or by a gateway started without the file, does not.
async fn what_the_file_declares_is_marked_managed_in_the_admin_api(db: TestDb) {
    set_secret_env();
    let text = full_file("http://127.0.0.1:9/v1");
    let app = spawn_app(&db, Setup::resources(text.clone())).await;
    let token = app.login("owner@example.test", "owner-password").await;
    let created = app
        .client
        .post(format!("{}/admin/v1/departments", app.address))
        .bearer_auth(&token)
        .json(&serde_json::json!({"name": "made-in-the-console"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    let marks = |list: &serde_json::Value, name_field: &str| -> Vec<(String, serde_json::Value)> {
        let mut v: Vec<_> = list["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e[name_field].as_str().unwrap_or("*").to_owned(),
                    e["managed_by"].clone(),
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let file = serde_json::json!("resources_file");
    let none = serde_json::Value::Null;
    assert_eq!(admin_get(&app, &token, "workspace").await["managed_by"], file);
    assert_eq!(
        marks(&admin_get(&app, &token, "departments").await, "name"),
        vec![
            ("made-in-the-console".into(), none.clone()),
            ("research".into(), file.clone())
        ]
    );
    assert_eq!(
        marks(&admin_get(&app, &token, "members").await, "email"),
        vec![
            ("ada@acme.test".into(), file.clone()),
            ("owner@example.test".into(), none.clone())
        ],
        "the bootstrap owner is not in the file"
    );
    assert_eq!(
        marks(&admin_get(&app, &token, "keys").await, "name"),
        vec![("ci".into(), file.clone())]
    );
    assert_eq!(
        marks(&admin_get(&app, &token, "upstreams").await, "name"),
        vec![("openai-main".into(), file.clone())]
    );
    assert_eq!(
        marks(&admin_get(&app, &token, "models").await, "name"),
        vec![
            ("fast".into(), file.clone()),
            ("gpt-4o-mini".into(), file.clone())
        ]
    );
    let policies = admin_get(&app, &token, "policies").await;
    let policies = policies["data"].as_array().unwrap();
    assert_eq!(policies.len(), 2);
    assert!(policies.iter().all(|p| p["managed_by"] == file), "{policies:#?}");
    app.stop().await;

    // Started without the file, nothing will undo an edit: nothing is marked.
    let app = spawn_app(&db, Setup::default()).await;
    let token = app.login("owner@example.test", "owner-password").await;
    assert_eq!(admin_get(&app, &token, "workspace").await["managed_by"], none);
    let members = admin_get(&app, &token, "members").await;
    assert!(
        members["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["managed_by"].is_null())
    );
    app.stop().await;
}
