//! Per-key and per-member model allow-lists (issue 25 item 3): a model outside either list is a
//! 403 `model_not_allowed` before any quota or upstream work, streamed or not, on every
//! endpoint; `/v1/models` lists only what the key may call; the fallback chain skips what it may
//! not; set through the resources file and the admin API.

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, spawn_app, spawn_on_mock};
use crate::proxy::{KEY, fixture};

/// A second key of ada's, and an owner of acme who signs in.
pub const OTHER: &str = "sk-aigw-GuardrailsOtherKey0123456789abcd";
pub const OWNER: &str = "boss@acme.test";
pub const OWNER_PASSWORD: &str = "boss-password";

/// The proxy suite's workspace with an owner and a second key of ada's.
pub fn owned(mock: &MockUpstream) -> ResourcesBuilder {
    fixture(mock)
        .member_with_password("acme", OWNER, "owner", OWNER_PASSWORD)
        .api_key("ada@acme.test", "other", OTHER)
}

/// [`owned`] with `extra` appended.
pub async fn start(db: &TestDb, extra: &str) -> (TestApp, MockUpstream) {
    spawn_on_mock(db, |mock| String::from(owned(mock)) + extra).await
}

/// [`start`] where `extra` declares the `ci` key again (with its guardrails): the proxy suite's
/// own declaration is dropped so the key is declared once.
async fn start_replacing_ci(db: &TestDb, extra: &str) -> (TestApp, MockUpstream) {
    let (app, mock) = spawn_on_mock(db, |mock| {
        let base = String::from(owned(mock).without("api_key", "ci"));
        assert!(
            !base.contains(KEY),
            "the proxy suite's key declaration was dropped"
        );
        base + extra
    })
    .await;
    (app, mock)
}

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

/// Status and body of a call with `key` (a stream is read whole; its body is then `null`).
async fn call(app: &TestApp, key: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = app.post_json(path, key, body).await;
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The ids `GET /v1/models` lists for `key`.
async fn listed(app: &TestApp, key: &str) -> Vec<String> {
    let r = app.get_as("/v1/models", key).await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Asserts a 403 `model_not_allowed` naming `model` and whose list refused it.
fn assert_not_allowed((status, body): &(u16, Value), model: &str, subject: &str) {
    assert_eq!(*status, 403, "{body}");
    let e = &body["error"];
    assert_eq!(e["code"], "model_not_allowed", "{body}");
    assert_eq!(e["type"], "permission_error");
    assert_eq!(e["param"], "model");
    assert_eq!(e["model"], model);
    assert_eq!(e["subject"], subject);
    assert!(e["message"].as_str().unwrap().contains(model), "{body}");
}

both_backends!(
    a_key_calls_only_the_models_its_list_allows,
    key_and_member_lists_both_apply,
    the_fallback_chain_skips_models_the_key_may_not_call,
    the_admin_api_sets_and_clears_allow_lists,
    the_resources_file_sets_both_guardrails,
);

async fn a_key_calls_only_the_models_its_list_allows(db: TestDb) {
    // Two requests a minute: a refused model must use none of them, and an exhausted quota must
    // not hide the allow-list's answer.
    let extra = format!(
        "[[api_key]]\nmember = \"ada@acme.test\"\nname = \"ci\"\nkey = \"{KEY}\"\n\
         allowed_models = [\"gpt-4o*\", \"claude-sonnet\"]\n\
         [[policy]]\nworkspace = \"acme\"\nsubject = \"apikey\"\ntarget = \"ada@acme.test/ci\"\n\
         metric = \"requests\"\nwindow = \"minute\"\nlimit = 2\n"
    );
    // The proxy suite's file declares the key already: this test's declaration replaces it.
    let (app, mock) = start_replacing_ci(&db, &extra).await;
    assert_eq!(
        listed(&app, KEY).await,
        ["claude-sonnet", "gpt-4o-mini"],
        "only what the key may call"
    );
    assert_eq!(listed(&app, OTHER).await.len(), 4, "another key sees every model");

    let pattern_hit = call(&app, KEY, "/v1/chat/completions", &chat("gpt-4o-mini", false)).await;
    assert_eq!(pattern_hit.0, 200, "{}", pattern_hit.1);
    let calls = mock.call_count();
    for stream in [false, true] {
        let miss = call(&app, KEY, "/v1/chat/completions", &chat("fast", stream)).await;
        assert_not_allowed(&miss, "fast", "apikey");
    }
    let embed = json!({"model": "text-embedding-3-small", "input": "hello"});
    assert_not_allowed(
        &call(&app, KEY, "/v1/embeddings", &embed).await,
        "text-embedding-3-small",
        "apikey",
    );
    let unknown = call(&app, KEY, "/v1/chat/completions", &chat("no-such-model", false)).await;
    assert_not_allowed(&unknown, "no-such-model", "apikey");
    assert_eq!(mock.call_count(), calls, "nothing went upstream");

    // The exact name, on the Anthropic endpoint, streamed.
    let r = app
        .post_messages(
            KEY,
            None,
            &json!({"model": "claude-sonnet", "max_tokens": 16, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("message_stop"));
    // The quota counted the two served requests only: it is used up now.
    let quota = call(&app, KEY, "/v1/chat/completions", &chat("gpt-4o-mini", true)).await;
    assert_eq!(
        (quota.0, &quota.1["error"]["code"]),
        (429, &json!("quota_exceeded"))
    );
    assert_not_allowed(
        &call(&app, KEY, "/v1/chat/completions", &chat("fast", false)).await,
        "fast",
        "apikey",
    );
    let logs = app.logs("acme", 8).await;
    let refused = logs
        .iter()
        .filter(|l| l.code.as_deref() == Some("model_not_allowed"))
        .count();
    assert_eq!(refused, 5, "each refusal is logged");
    assert!(
        logs.iter()
            .filter(|l| l.code.as_deref() == Some("model_not_allowed"))
            .all(|l| l.status == 403 && l.source.as_deref() == Some("gateway"))
    );
    app.stop().await;
}

async fn key_and_member_lists_both_apply(db: TestDb) {
    let (app, mock) = start(&db, "").await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let ada = app.member_id(&token, "ada@acme.test").await;
    let key = key_id(&app, &token, "ci").await;
    patch(
        &app,
        &token,
        &format!("/admin/v1/members/{ada}"),
        json!({"allowed_models": ["gpt-4o-mini", "fast"]}),
    )
    .await;
    patch(
        &app,
        &token,
        &format!("/admin/v1/keys/{key}"),
        json!({"allowed_models": ["gpt-*", "fast", "claude-*"]}),
    )
    .await;
    assert_eq!(
        listed(&app, KEY).await,
        ["fast", "gpt-4o-mini"],
        "the intersection"
    );
    assert_eq!(
        listed(&app, OTHER).await,
        ["fast", "gpt-4o-mini"],
        "the member's list covers every key of theirs"
    );
    for model in ["gpt-4o-mini", "fast"] {
        let (status, body) = call(&app, KEY, "/v1/chat/completions", &chat(model, false)).await;
        assert_eq!(status, 200, "{model}: {body}");
    }
    let calls = mock.call_count();
    let by_member = call(&app, KEY, "/v1/chat/completions", &chat("claude-sonnet", true)).await;
    assert_not_allowed(&by_member, "claude-sonnet", "member");
    let by_key = call(
        &app,
        OTHER,
        "/v1/chat/completions",
        &chat("text-embedding-3-small", false),
    )
    .await;
    assert_not_allowed(&by_key, "text-embedding-3-small", "member");
    assert_eq!(mock.call_count(), calls);
    // Cleared with null: the key is back to the member's list only.
    patch(
        &app,
        &token,
        &format!("/admin/v1/members/{ada}"),
        json!({"allowed_models": null}),
    )
    .await;
    assert_eq!(listed(&app, KEY).await, ["claude-sonnet", "fast", "gpt-4o-mini"]);
    assert_eq!(listed(&app, OTHER).await.len(), 4);
    app.stop().await;
}

async fn the_fallback_chain_skips_models_the_key_may_not_call(db: TestDb) {
    let (app, mock) = start(&db, "").await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let key = key_id(&app, &token, "ci").await;
    patch(
        &app,
        &token,
        &format!("/admin/v1/keys/{key}"),
        json!({"allowed_models": ["gpt-4o-mini"]}),
    )
    .await;
    // gpt-4o-mini fails on both its credentials; its fallback `fast` would answer.
    mock.script(
        Script::any()
            .model("gpt-4o-mini")
            .error(500, json!({"error": {"message": "down"}})),
    );
    let r = app
        .post_json("/v1/chat/completions", KEY, &chat("gpt-4o-mini", false))
        .await;
    assert_eq!(r.status(), 500, "the upstream's error, not an answer of fast");
    assert_eq!(r.headers()["x-aigw-error-source"], "upstream");
    assert!(
        mock.calls()
            .iter()
            .all(|c| c.model.as_deref() == Some("gpt-4o-mini")),
        "fast was never tried: {:?}",
        mock.calls()
    );
    // The same model with a key that may call fast: the chain moves on to it.
    let r = app
        .post_json("/v1/chat/completions", OTHER, &chat("gpt-4o-mini", false))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-aigw-model"], "fast");
    app.stop().await;
}

async fn the_admin_api_sets_and_clears_allow_lists(db: TestDb) {
    let (app, _mock) = start(&db, "").await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let key = key_id(&app, &token, "ci").await;
    let path = format!("/admin/v1/keys/{key}");
    let set = patch(
        &app,
        &token,
        &path,
        json!({"allowed_models": [" gpt-4o* ", "fast"]}),
    )
    .await;
    assert_eq!(
        set["allowed_models"],
        json!(["gpt-4o*", "fast"]),
        "stored trimmed"
    );
    assert_eq!(set["max_in_flight"], Value::Null, "absent fields are kept");
    let miss = call(&app, KEY, "/v1/chat/completions", &chat("claude-sonnet", false)).await;
    assert_not_allowed(&miss, "claude-sonnet", "apikey");
    let read = admin(&app, &token, reqwest::Method::GET, &path, None).await;
    assert_eq!(read.1["allowed_models"], json!(["gpt-4o*", "fast"]));
    let cleared = patch(&app, &token, &path, json!({"allowed_models": null})).await;
    assert_eq!(cleared["allowed_models"], Value::Null);
    let (status, _) = call(&app, KEY, "/v1/chat/completions", &chat("claude-sonnet", false)).await;
    assert_eq!(status, 200, "every model again, at once");
    // A key created with a list (a member may narrow a key of their own).
    let created = admin(
        &app,
        &token,
        reqwest::Method::POST,
        "/admin/v1/keys",
        Some(json!({"name": "narrow", "allowed_models": ["fast"], "max_in_flight": 3})),
    )
    .await;
    assert_eq!(created.0, 201, "{}", created.1);
    assert_eq!(created.1["allowed_models"], json!(["fast"]));
    assert_eq!(created.1["max_in_flight"], 3);
    let plain = created.1["key"].as_str().unwrap().to_owned();
    assert_eq!(listed(&app, &plain).await, ["fast"]);
    app.stop().await;
}

async fn the_resources_file_sets_both_guardrails(db: TestDb) {
    let declared = |models: &[&str], cap: i64| {
        String::from(
            ResourcesBuilder::new()
                .member("acme", "carol@acme.test", "member")
                .with("allowed_models", models.to_vec())
                .with("max_in_flight", cap)
                .api_key("carol@acme.test", "svc", CAROL)
                .with("allowed_models", vec!["gpt-4o-mini", "claude-*"])
                .with("max_in_flight", 3),
        )
    };
    let (app, _mock) = start(&db, &declared(&["gpt-*", "claude-sonnet"], 5)).await;
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let read = |path: &'static str| {
        let (app, token) = (&app, &token);
        async move {
            let (_, v) = admin(app, token, reqwest::Method::GET, path, None).await;
            v["data"].as_array().unwrap().clone()
        }
    };
    let carol = read("/admin/v1/members")
        .await
        .into_iter()
        .find(|m| m["email"] == "carol@acme.test")
        .unwrap();
    assert_eq!(carol["allowed_models"], json!(["gpt-*", "claude-sonnet"]));
    assert_eq!(carol["max_in_flight"], 5);
    let svc = read("/admin/v1/keys")
        .await
        .into_iter()
        .find(|k| k["name"] == "svc")
        .unwrap();
    assert_eq!(svc["allowed_models"], json!(["gpt-4o-mini", "claude-*"]));
    assert_eq!(svc["max_in_flight"], 3);
    assert_eq!(listed(&app, CAROL).await, ["claude-sonnet", "gpt-4o-mini"]);
    let key_id = svc["id"].as_i64().unwrap();
    let ok = call(&app, CAROL, "/v1/chat/completions", &chat("gpt-4o-mini", false)).await;
    assert_eq!(ok.0, 200, "{}", ok.1);
    assert_eq!(
        app.state
            .in_flight
            .count(aigw::kernel::caller::Guarded::Key, key_id),
        0
    );
    app.stop().await;

    // Edited in the file: applied at the next start, in place.
    let mock = MockUpstream::start().await.unwrap();
    let edited = String::from(fixture(&mock).member_with_password("acme", OWNER, "owner", OWNER_PASSWORD))
        + &declared(&["claude-sonnet"], 7);
    let app = spawn_app(&db, Setup::resources(edited)).await;
    assert_eq!(listed(&app, CAROL).await, ["claude-sonnet"]);
    assert_not_allowed(
        &call(&app, CAROL, "/v1/chat/completions", &chat("gpt-4o-mini", false)).await,
        "gpt-4o-mini",
        "member",
    );
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let (_, keys) = admin(
        &app,
        &token,
        reqwest::Method::GET,
        &format!("/admin/v1/keys/{key_id}"),
        None,
    )
    .await;
    assert_eq!(keys["name"], "svc", "the same key");
    app.stop().await;
}

/// carol's key, declared with guardrails in the resources file.
const CAROL: &str = "sk-aigw-CarolServiceKey0123456789abcdefg";

/// An admin API call: status and JSON body.
pub async fn admin(
    app: &TestApp,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = app
        .client
        .request(method, format!("{}{path}", app.address))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A successful PATCH's body.
pub async fn patch(app: &TestApp, token: &str, path: &str, body: Value) -> Value {
    let (status, v) = admin(app, token, reqwest::Method::PATCH, path, Some(body)).await;
    assert_eq!(status, 200, "PATCH {path}: {v}");
    v
}

/// The id of ada's key named `name`.
pub async fn key_id(app: &TestApp, token: &str, name: &str) -> i64 {
    let (_, keys) = admin(app, token, reqwest::Method::GET, "/admin/v1/keys", None).await;
    keys["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == name && k["member_email"] == "ada@acme.test")
        .and_then(|k| k["id"].as_i64())
        .expect("the key")
}
