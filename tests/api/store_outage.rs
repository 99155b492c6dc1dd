//! The database away (Postgres behind a relay the test cuts): what is cached keeps serving, what
//! needs the store fails fast with 503 `store_unavailable`, `/readyz` says not ready, the outage
//! is logged once, and nothing counted meanwhile is lost. SQLite is embedded: it does not go away.

use std::time::{Duration, Instant};

use aigw::mock_upstream::{MockUpstream, Script};
use serde_json::{Value, json};

use crate::helpers::{DbSwitch, Setup, TestApp, TestDb, logged_warnings, spawn_app};
use crate::proxy::{KEY, resources};

/// A key of the right shape that the store has never held.
const UNSEEN_KEY: &str = "sk-aigw-NeverCreatedKey0123456789abcdefg";

fn chat() -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "say hello to me"}]})
}

const POLICY: &str = "\n[[policy]]\nworkspace = \"acme\"\nsubject = \"apikey\"\ntarget = \"ada@acme.test/ci\"\nmetric = \"requests\"\nwindow = \"day\"\nlimit = 1000\nmode = \"enforce\"\n";

async fn start(
    settings: impl FnOnce(&mut aigw::Settings) + Send + 'static,
) -> Option<(TestDb, DbSwitch, TestApp, MockUpstream)> {
    let (db, switch) = TestDb::postgres_behind_switch().await?;
    let mock = MockUpstream::start().await.unwrap();
    let setup = Setup {
        settings: Box::new(settings),
        ..Setup::resources(resources(&mock) + POLICY)
    };
    let app = spawn_app(&db, setup).await;
    Some((db, switch, app, mock))
}

/// `POST` a chat completion; the status and how long the answer took.
async fn timed_chat(app: &TestApp, key: &str) -> (u16, Duration, reqwest::Response) {
    let t = Instant::now();
    let r = app.post_json("/v1/chat/completions", key, &chat()).await;
    (r.status().as_u16(), t.elapsed(), r)
}

async fn status_of(app: &TestApp, path: &str) -> u16 {
    app.get(path).await.status().as_u16()
}

async fn metrics(app: &TestApp) -> String {
    app.get("/metrics").await.text().await.unwrap()
}

/// Waits (10 s at most) until `/readyz` answers `want`.
async fn wait_ready(app: &TestApp, want: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while status_of(app, "/readyz").await != want {
        assert!(Instant::now() < deadline, "/readyz never answered {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads the stored totals straight from the database (not through the gateway's relay).
async fn stored_requests(db: &TestDb, window_start_min: i64) -> i64 {
    let pool = sqlx::AnyPool::connect(&db.direct_url).await.unwrap();
    sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(used), 0) AS BIGINT) FROM usage_counters
         WHERE subject = 'apikey' AND metric = 'requests' AND window_start >= $1",
    )
    .bind(window_start_min)
    .fetch_one(&pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_keys_serve_through_an_outage_and_nothing_counted_is_lost() {
    logged_warnings(); // installs the capture before the outage
    let Some((db, switch, app, mock)) = start(|_| {}).await else {
        return;
    };
    for _ in 0..3 {
        assert_eq!(timed_chat(&app, KEY).await.0, 200);
    }

    switch.cut();
    // Longer than any cache lifetime: the last good copy serves however long the outage lasts.
    app.clock.advance(chrono::Duration::minutes(30));
    // The first credential parks during the outage; the lock must reach the store afterwards.
    mock.script(
        Script::any()
            .credential("cred-primary")
            .times(1)
            .header("retry-after", "600")
            .error(429, json!({"error": {"message": "Too Many Requests"}})),
    );
    for i in 0..5 {
        let (status, took, _) = timed_chat(&app, KEY).await;
        assert_eq!(status, 200, "request {i} with a known key during the outage");
        assert!(took < Duration::from_secs(1), "served from memory, took {took:?}");
    }

    // What needs the store fails fast, with a short Retry-After.
    let (status, took, r) = timed_chat(&app, UNSEEN_KEY).await;
    assert_eq!(status, 503, "a key never seen cannot be checked");
    assert!(took <= Duration::from_millis(1500), "failed fast, took {took:?}");
    let retry: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=10).contains(&retry), "short Retry-After, got {retry}");
    assert_eq!(r.headers()["x-aigw-error-source"], "gateway");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "store_unavailable");

    let t = Instant::now();
    let r = app.sign_in("owner@example.test", "owner-password").await;
    assert_eq!(r.status(), 503, "sign-in needs the store");
    assert!(t.elapsed() <= Duration::from_millis(1500), "sign-in failed fast");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "store_unavailable");

    assert_eq!(status_of(&app, "/healthz").await, 200, "the process is alive");
    wait_ready(&app, 503).await;
    assert!(
        metrics(&app).await.contains("\naigw_store_available 0\n"),
        "the gauge says down"
    );

    switch.restore();
    wait_ready(&app, 200).await;
    assert!(
        metrics(&app).await.contains("\naigw_store_available 1\n"),
        "the gauge says up"
    );
    assert_eq!(timed_chat(&app, KEY).await.0, 200);
    // What was held during the outage (counts, logs, the lock) is written now.
    app.sync().await;

    // Nothing counted during the outage is lost: 3 before, 5 during, 1 after.
    assert_eq!(stored_requests(&db, 0).await, 9, "stored usage equals delivered");
    assert_eq!(app.logs("acme", 9).await.len(), 9, "every request is logged");
    let pool = sqlx::AnyPool::connect(&db.direct_url).await.unwrap();
    let locks: i64 = sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM upstream_locks")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(locks >= 1, "the lock learned during the outage is stored");

    // Logged once each, not per request or per poll.
    let relay = format!("127.0.0.1:{}", switch.port);
    let lines: Vec<String> = logged_warnings()
        .into_iter()
        .filter(|l| l.contains(&relay))
        .collect();
    let count = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    assert_eq!(count("database unreachable"), 1, "{lines:#?}");
    assert_eq!(count("database reachable again"), 1, "{lines:#?}");
    app.stop().await;
}

/// A counter this gateway never read (here: a new day's window) during the outage: `serve` counts
/// it from 0 in memory and adds it to the stored total on recovery; `refuse` answers 503 until
/// the store is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unseen_counter_serves_or_refuses_as_the_setting_says() {
    for refuse in [false, true] {
        let Some((db, switch, app, _mock)) = start(move |s| {
            if refuse {
                s.store_outage_counters = aigw::config::OutageCounters::Refuse;
            }
        })
        .await
        else {
            return;
        };
        assert_eq!(timed_chat(&app, KEY).await.0, 200);
        switch.cut();
        app.clock.advance(chrono::Duration::days(1));
        let since = app.clock.now().timestamp() - 86_400; // after the first window began
        let (status, took, r) = timed_chat(&app, KEY).await;
        assert!(
            took <= Duration::from_millis(1500),
            "answered fast, took {took:?}"
        );
        if refuse {
            assert_eq!(status, 503);
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "store_unavailable");
        } else {
            assert_eq!(status, 200, "serve: counted from 0 in memory");
        }
        switch.restore();
        wait_ready(&app, 200).await;
        assert_eq!(timed_chat(&app, KEY).await.0, 200);
        app.sync().await;
        let want = if refuse { 1 } else { 2 };
        assert_eq!(
            stored_requests(&db, since).await,
            want,
            "the new window's stored total (refuse = {refuse})"
        );
        app.stop().await;
    }
}

/// A chat call of `KEY` naming end user `user` with tags `tags`: its status and body.
async fn labelled_chat(app: &TestApp, user: &str, tags: &str) -> (u16, Value) {
    let mut body = chat();
    body["user"] = json!(user);
    let r = app
        .client
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(KEY)
        .header("x-aigw-tags", tags)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// The stored total of requests today of end user `user` or tag `team=<value>` (by its name,
/// straight from the database); none without a row for the label.
async fn stored_label_requests(db: &TestDb, subject: &str, name: &str) -> Option<i64> {
    let pool = sqlx::AnyPool::connect(&db.direct_url).await.unwrap();
    let id: Option<i64> = match subject {
        "end_user" => sqlx::query_scalar("SELECT id FROM end_users WHERE end_user = $1"),
        _ => sqlx::query_scalar("SELECT id FROM tag_values WHERE tag_key = 'team' AND tag_value = $1"),
    }
    .bind(name)
    .fetch_optional(&pool)
    .await
    .unwrap();
    let id = id?;
    let used: i64 = sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(used), 0) AS BIGINT) FROM usage_counters
         WHERE subject = $1 AND subject_id = $2 AND metric = 'requests'",
    )
    .bind(subject)
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    Some(used)
}

const LABEL_POLICIES: &str = "\n[[policy]]\nworkspace = \"acme\"\nsubject = \"end_user\"\ntarget = \"*\"\nmetric = \"requests\"\nwindow = \"day\"\nlimit = 3\nmode = \"enforce\"\n\
[[policy]]\nworkspace = \"acme\"\nsubject = \"tag\"\ntarget = \"team=*\"\nmetric = \"requests\"\nwindow = \"day\"\nlimit = 1000\nmode = \"enforce\"\n";

/// Issue 40 item 2: a known key that brings an end user or tag first seen during the outage is
/// served from memory like the rest (its quotas counted and enforced there); the labels are
/// stored when the database is back, with what was counted meanwhile on their stored ids:
/// nothing lost, nothing counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_end_users_and_tags_are_served_through_an_outage_and_stored_after() {
    let Some((db, switch)) = TestDb::postgres_behind_switch().await else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock) + POLICY + LABEL_POLICIES)).await;
    assert_eq!(labelled_chat(&app, "known-user", "team=known").await.0, 200);

    switch.cut();
    for i in 0..3 {
        let (status, body) = labelled_chat(&app, "new-user", "team=new").await;
        assert_eq!(
            status, 200,
            "request {i} of a new end user during the outage: {body}"
        );
    }
    let (status, body) = labelled_chat(&app, "new-user", "team=new").await;
    assert_eq!(
        status, 429,
        "the new end user's quota is counted in memory: {body}"
    );
    assert_eq!(body["error"]["subject"], "end_user");
    assert_eq!(body["error"]["end_user"], "new-user");
    assert_eq!(labelled_chat(&app, "second-user", "team=new").await.0, 200);
    assert_eq!(labelled_chat(&app, "known-user", "team=known").await.0, 200);

    switch.restore();
    wait_ready(&app, 200).await;
    app.sync().await;
    // Stored, with what was counted meanwhile.
    assert_eq!(stored_label_requests(&db, "end_user", "new-user").await, Some(3));
    assert_eq!(
        stored_label_requests(&db, "end_user", "second-user").await,
        Some(1)
    );
    assert_eq!(
        stored_label_requests(&db, "end_user", "known-user").await,
        Some(2)
    );
    assert_eq!(stored_label_requests(&db, "tag", "new").await, Some(4));
    // No provisional id reached the store.
    let pool = sqlx::AnyPool::connect(&db.direct_url).await.unwrap();
    let negative: i64 =
        sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM usage_counters WHERE subject_id < 0")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(negative, 0);
    // The gateway goes on with the stored ids: the new user's quota is still used up.
    let (status, body) = labelled_chat(&app, "new-user", "team=new").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(labelled_chat(&app, "second-user", "team=new").await.0, 200);
    app.sync().await;
    assert_eq!(
        stored_label_requests(&db, "end_user", "second-user").await,
        Some(2)
    );
    assert_eq!(stored_label_requests(&db, "tag", "new").await, Some(5));
    // Every request served is in the key's count too: 1 before, 5 during, 1 after.
    assert_eq!(stored_requests(&db, 0).await, 7);
    app.stop().await;
}
