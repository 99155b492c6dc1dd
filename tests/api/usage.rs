//! Usage reported by an upstream is not trusted (DESIGN.md §9): an absurd or missing usage block
//! is replaced by the gateway's estimate and flagged, quotas stay enforced, counters saturate,
//! and one bad counter never blocks, repeats or loses the others' usage.

use std::collections::HashMap;

use aigw::mock_upstream::{MockUpstream, Script};
use aigw::request_log::LogRecord;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, logged_warnings, price, spawn_app};
use crate::proxy::{KEY, fixture};

const BOB_KEY: &str = "sk-aigw-UsageTestKeyBob0123456789abcdefg";

/// The proxy suite's workspace, plus bob (another member with his own key), an owner who signs
/// in, and `extra` (policies, model changes).
fn workspace(mock: &MockUpstream, extra: &str) -> String {
    String::from(with_bob_and_owner(fixture(mock))) + extra
}

/// `file` with bob, his key and the owner of [`workspace`].
fn with_bob_and_owner(file: ResourcesBuilder) -> ResourcesBuilder {
    file.member("acme", "bob@acme.test", "member")
        .api_key("bob@acme.test", "app", BOB_KEY)
        .member_with_password("acme", "owner@acme.test", "owner", "owner-password-1")
}

fn policy(subject: &str, target: &str, metric: &str, window: &str, limit: &str, mode: &str) -> String {
    format!(
        "\n[[policy]]\nworkspace = \"acme\"\nsubject = \"{subject}\"\ntarget = \"{target}\"\nmetric = \"{metric}\"\nwindow = \"{window}\"\nlimit = {limit}\nmode = \"{mode}\"\n"
    )
}

fn chat(stream: bool) -> Value {
    json!({"model": "gpt-4o-mini", "stream": stream, "messages": [{"role": "user", "content": "say hello to me"}]})
}

fn messages(stream: bool) -> Value {
    json!({"model": "claude-sonnet", "max_tokens": 50, "stream": stream,
           "messages": [{"role": "user", "content": "say hello to me"}]})
}

/// The gateway's prompt estimate: 4 bytes of request a token, rounded up.
fn prompt_estimate(body: &Value) -> i64 {
    serde_json::to_vec(body).unwrap().len().div_ceil(4) as i64
}

/// The mock's answer text, "Hello from the mock upstream " (29 bytes): 8 tokens at 4 bytes a
/// token when the answer is read whole; one token per content chunk (5) when streamed.
const ANSWER_ESTIMATE: i64 = 8;
const STREAMED_ANSWER_ESTIMATE: i64 = 5;

/// Sends `body` to `path` and returns the request id of a 200 (the whole body read).
async fn send_ok(app: &TestApp, path: &str, key: &str, body: &Value) -> String {
    let r = app.post_json(path, key, body).await;
    assert_eq!(r.status(), 200);
    let id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    r.bytes().await.unwrap();
    id
}

fn log_of<'a>(logs: &'a [LogRecord], request_id: &str) -> &'a LogRecord {
    logs.iter()
        .find(|l| l.request_id == request_id)
        .unwrap_or_else(|| panic!("no log for {request_id}"))
}

/// Waits (10 s at most) until a warning naming `request_id` and containing `text` was logged.
async fn assert_warned(request_id: &str, text: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let lines = logged_warnings();
        if lines
            .iter()
            .any(|l| l.contains("WARN") && l.contains(request_id) && l.contains(text))
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no warning with {text:?} for {request_id}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Flushes the quota counters now, as the flush task does every interval.
async fn flush(app: &TestApp) {
    let s = &app.state;
    s.quota
        .flush(&s.store, app.clock.now())
        .await
        .expect("a flush never fails because of one counter's value");
}

/// Every stored counter: (subject, subject id, metric) → used.
async fn stored_counters(db: &TestDb) -> HashMap<(String, i64, String), i64> {
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let rows: Vec<(String, i64, String, i64)> =
        sqlx::query_as("SELECT subject, subject_id, metric, used FROM usage_counters")
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    rows.into_iter()
        .map(|(s, id, m, used)| ((s, id, m), used))
        .collect()
}

async fn owner_token(app: &TestApp) -> String {
    let r = app
        .client
        .post(format!("{}/admin/v1/auth/login", app.address))
        .json(&json!({"email": "owner@acme.test", "password": "owner-password-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// `GET /admin/v1/usage?by=…` as the owner: (status, body).
async fn usage_report(app: &TestApp, by: &str) -> (u16, Value) {
    let token = owner_token(app).await;
    let r = app.get_as(&format!("/admin/v1/usage?by={by}"), &token).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

both_backends!(
    absurd_usage_is_replaced_by_the_estimate,
    estimated_usage_still_enforces_the_quota,
    absurd_usage_never_blocks_the_other_counters,
    a_200_without_usage_is_estimated_and_flagged,
    counters_saturate_instead_of_overflowing,
    a_counter_the_database_refuses_holds_back_only_itself,
    the_ceiling_is_a_setting,
    a_backlog_of_logs_is_written_whole,
);

/// A backlog larger than a batch (the writer's rounds take 2,000 logs a batch on Postgres, two
/// batches at once; 10,000 on SQLite) is written whole, each log once: the report counts every
/// request and its tokens.
async fn a_backlog_of_logs_is_written_whole(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(workspace(&mock, ""))).await;
    let first = send_ok(&app, "/v1/chat/completions", KEY, &chat(false)).await;
    let logs = app.logs("acme", 1).await;
    let template = log_of(&logs, &first).clone();
    const BACKLOG: usize = 4_999;
    for i in 0..BACKLOG {
        app.state.logs.send(LogRecord {
            request_id: format!("backlog-{i}"),
            ..template.clone()
        });
    }
    app.state.logs.flush().await;
    assert_eq!(app.state.logs.queued(), 0);
    let (status, report) = usage_report(&app, "key").await;
    assert_eq!(status, 200, "{report}");
    let row = &report["data"][0];
    assert_eq!(row["requests"], BACKLOG as i64 + 1, "{report}");
    assert_eq!(
        row["total_tokens"],
        (BACKLOG as i64 + 1) * template.total_tokens,
        "{report}"
    );
    app.stop().await;
}

async fn the_ceiling_is_a_setting(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(
        &db,
        Setup {
            settings: Box::new(|s: &mut aigw::Settings| s.max_usage_tokens = 10),
            ..Setup::resources(workspace(&mock, ""))
        },
    )
    .await;
    // 4 prompt and 5 completion tokens: within 10.
    let within = send_ok(&app, "/v1/chat/completions", KEY, &chat(false)).await;
    mock.script(Script {
        prompt_tokens: Some(6),
        ..Script::any()
    });
    let over = send_ok(&app, "/v1/chat/completions", KEY, &chat(false)).await;
    let logs = app.logs("acme", 2).await;
    let within = log_of(&logs, &within);
    assert_eq!(
        (
            within.prompt_tokens,
            within.completion_tokens,
            within.usage_estimated
        ),
        (4, 5, 0)
    );
    let over = log_of(&logs, &over);
    assert_eq!(over.usage_estimated, 1, "11 tokens are over the ceiling");
    assert!(
        over.explanation.contains("above the ceiling of 10"),
        "{}",
        over.explanation
    );
    assert_eq!(
        (over.prompt_tokens, over.completion_tokens),
        (10, 0),
        "the estimate is held to the ceiling too"
    );
    app.stop().await;
}

async fn absurd_usage_is_replaced_by_the_estimate(db: TestDb) {
    logged_warnings();
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(workspace(&mock, ""))).await;
    let cases: Vec<(&str, Value)> = vec![
        (
            "i64::MAX",
            json!({"prompt_tokens": i64::MAX, "completion_tokens": i64::MAX, "total_tokens": i64::MAX}),
        ),
        (
            "u64::MAX",
            json!({"prompt_tokens": u64::MAX, "completion_tokens": 1}),
        ),
        ("negative", json!({"prompt_tokens": -5, "completion_tokens": 3})),
        (
            "huge float",
            json!({"prompt_tokens": 1e300, "completion_tokens": 2}),
        ),
        ("fraction", json!({"prompt_tokens": 3.5, "completion_tokens": 2})),
        (
            "strings",
            json!({"prompt_tokens": "12", "completion_tokens": "3"}),
        ),
        (
            "object",
            json!({"prompt_tokens": {"n": 1}, "completion_tokens": 2}),
        ),
        ("not an object", json!([1, 2])),
        (
            "total below its parts",
            json!({"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 5}),
        ),
        (
            "field over the ceiling",
            json!({"prompt_tokens": 100_000_001, "completion_tokens": 0}),
        ),
        (
            "parts over the ceiling together",
            json!({"prompt_tokens": 60_000_000, "completion_tokens": 60_000_000}),
        ),
        (
            "total over the ceiling",
            json!({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 100_000_001}),
        ),
        ("no completion_tokens", json!({"prompt_tokens": 4})),
    ];
    let mut sent = Vec::new();
    for (name, usage) in &cases {
        mock.script(Script::any().usage(usage.clone()).times(1));
        let id = send_ok(&app, "/v1/chat/completions", KEY, &chat(false)).await;
        sent.push((
            name.to_string(),
            id,
            prompt_estimate(&chat(false)),
            ANSWER_ESTIMATE,
        ));
    }
    // Streamed and Anthropic shapes.
    mock.script(
        Script::any()
            .usage(json!({"prompt_tokens": i64::MAX, "completion_tokens": 2}))
            .times(1),
    );
    let id = send_ok(&app, "/v1/chat/completions", KEY, &chat(true)).await;
    sent.push((
        "stream".into(),
        id,
        prompt_estimate(&chat(true)),
        STREAMED_ANSWER_ESTIMATE,
    ));
    mock.script(
        Script::any()
            .usage(json!({"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 1e20}))
            .times(1),
    );
    let id = send_ok(&app, "/v1/messages", KEY, &messages(false)).await;
    sent.push((
        "messages".into(),
        id,
        prompt_estimate(&messages(false)),
        ANSWER_ESTIMATE,
    ));
    mock.script(
        Script::any()
            .usage(json!({"input_tokens": -1, "output_tokens": 5}))
            .times(1),
    );
    let id = send_ok(&app, "/v1/messages", KEY, &messages(true)).await;
    sent.push((
        "messages stream".into(),
        id,
        prompt_estimate(&messages(true)),
        STREAMED_ANSWER_ESTIMATE,
    ));

    let logs = app.logs("acme", sent.len()).await;
    for (name, id, prompt, completion) in &sent {
        let log = log_of(&logs, id);
        assert_eq!(log.status, 200, "{name}");
        assert_eq!(log.usage_estimated, 1, "{name}: flagged as estimated");
        assert_eq!(
            (log.prompt_tokens, log.completion_tokens, log.total_tokens),
            (*prompt, *completion, prompt + completion),
            "{name}: the estimate replaces the reported usage"
        );
        assert!(
            log.explanation.contains("usage estimated"),
            "{name}: {}",
            log.explanation
        );
        assert_warned(id, "invalid usage").await;
    }
    app.stop().await;
}

async fn estimated_usage_still_enforces_the_quota(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let policies = policy(
        "apikey",
        "ada@acme.test/ci",
        "total_tokens",
        "day",
        "20",
        "enforce",
    );
    let app = spawn_app(&db, Setup::resources(workspace(&mock, &policies))).await;
    mock.script(Script::any().usage(json!({"prompt_tokens": -1, "completion_tokens": -1})));
    let estimate = prompt_estimate(&chat(false)) + ANSWER_ESTIMATE;
    assert!(estimate >= 20, "one request uses the quota up");
    let r = app.post_json("/v1/chat/completions", KEY, &chat(false)).await;
    assert_eq!(r.status(), 200, "under the limit before it, so it completes");
    assert_eq!(
        r.headers()["x-aigw-quota-tokens-remaining"],
        "0",
        "the estimate counts in the response's own headers"
    );
    let r = app.post_json("/v1/chat/completions", KEY, &chat(true)).await;
    assert_eq!(r.status(), 429, "the estimate counted");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["used"], estimate);
    assert_eq!(mock.call_count(), 1);
    app.stop().await;
}

async fn absurd_usage_never_blocks_the_other_counters(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let policies = policy("apikey", "*", "requests", "day", "1000", "enforce")
        + &policy("apikey", "*", "total_tokens", "day", "1000000", "enforce")
        + &policy("ws", "acme", "total_tokens", "month", "1000000000000", "shadow")
        + &policy("member", "*", "credits", "month", "1000", "enforce");
    let text = workspace(&mock, &policies);
    let app = spawn_app(&db, Setup::resources(text.clone())).await;
    let absurd = json!({"prompt_tokens": i64::MAX, "completion_tokens": i64::MAX, "total_tokens": i64::MAX});
    // Ada's upstream answers absurd usage twice, a flush after each (the sum of two would
    // overflow a stored counter); then bob's seven ordinary requests, each flushed.
    for _ in 0..2 {
        mock.script(Script::any().usage(absurd.clone()).times(1));
        send_ok(&app, "/v1/chat/completions", KEY, &chat(false)).await;
        flush(&app).await;
    }
    for _ in 0..7 {
        send_ok(&app, "/v1/chat/completions", BOB_KEY, &chat(false)).await;
        flush(&app).await;
    }
    // Later flushes must not add anything again.
    for _ in 0..3 {
        flush(&app).await;
    }
    let logs = app.logs("acme", 9).await;
    app.stop().await; // graceful: the last flush

    let by_key = |key: i64| logs.iter().filter(move |l| l.key_id == key);
    let ada = logs.iter().find(|l| l.usage_estimated == 1).unwrap().clone();
    let bob = logs.iter().find(|l| l.usage_estimated == 0).unwrap().clone();
    assert_eq!(by_key(ada.key_id).count(), 2);
    assert_eq!(by_key(bob.key_id).count(), 7);
    assert!(by_key(bob.key_id).all(|l| l.usage_estimated == 0 && l.total_tokens == 9));
    let sum = |key: i64, f: fn(&LogRecord) -> i64| by_key(key).map(f).sum::<i64>();
    let stored = stored_counters(&db).await;
    let counter = |s: &str, id: i64, m: &str| stored.get(&(s.to_owned(), id, m.to_owned())).copied();
    for l in [&ada, &bob] {
        let n = by_key(l.key_id).count() as i64;
        assert_eq!(
            counter("apikey", l.key_id, "requests"),
            Some(n),
            "stored == delivered"
        );
        assert_eq!(
            counter("apikey", l.key_id, "total_tokens"),
            Some(sum(l.key_id, |l| l.total_tokens))
        );
        assert_eq!(
            counter("member", l.member_id, "credits"),
            Some(sum(l.key_id, |l| l.credits))
        );
    }
    assert_eq!(bob.credits, 4 + 2 * 5, "bob's credits as reported");
    assert_eq!(
        counter("ws", ada.workspace_id, "total_tokens"),
        Some(logs.iter().map(|l| l.total_tokens).sum())
    );

    // After the restart every key is served and its usage is read back.
    let app = spawn_app(&db, Setup::resources(text)).await;
    for key in [KEY, BOB_KEY] {
        let r = app.post_json("/v1/chat/completions", key, &chat(false)).await;
        assert_eq!(r.status(), 200);
    }
    let r = app.post_json("/v1/chat/completions", BOB_KEY, &chat(false)).await;
    assert_eq!(
        r.headers()["x-aigw-quota-requests-remaining"],
        "991",
        "7 stored, 2 since the restart, this one"
    );
    let logs = app.logs("acme", 12).await;
    let (status, report) = usage_report(&app, "member").await;
    assert_eq!(status, 200, "{report}");
    for l in [&ada, &bob] {
        let row = report["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["group"].as_str() == Some(l.member_id.to_string().as_str()))
            .unwrap();
        let mine = logs.iter().filter(|x| x.member_id == l.member_id);
        assert_eq!(row["requests"], mine.clone().count());
        assert_eq!(row["total_tokens"], mine.map(|x| x.total_tokens).sum::<i64>());
    }
    app.stop().await;
}

async fn a_200_without_usage_is_estimated_and_flagged(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(workspace(&mock, ""))).await;
    mock.script(Script::any().usage(Value::Null));
    let embed = json!({"model": "text-embedding-3-small", "input": "say hello to me"});
    let sent = [
        (
            send_ok(&app, "/v1/chat/completions", KEY, &chat(false)).await,
            prompt_estimate(&chat(false)),
            ANSWER_ESTIMATE,
        ),
        (
            send_ok(&app, "/v1/chat/completions", KEY, &chat(true)).await,
            prompt_estimate(&chat(true)),
            STREAMED_ANSWER_ESTIMATE,
        ),
        (
            send_ok(&app, "/v1/messages", KEY, &messages(false)).await,
            prompt_estimate(&messages(false)),
            ANSWER_ESTIMATE,
        ),
        (
            send_ok(&app, "/v1/messages", KEY, &messages(true)).await,
            prompt_estimate(&messages(true)),
            STREAMED_ANSWER_ESTIMATE,
        ),
        (
            send_ok(&app, "/v1/embeddings", KEY, &embed).await,
            prompt_estimate(&embed),
            0,
        ),
    ];
    assert!(
        mock.calls().iter().all(|c| c.usage.is_none()),
        "the upstream reported no usage"
    );
    let logs = app.logs("acme", sent.len()).await;
    for (id, prompt, completion) in &sent {
        let log = log_of(&logs, id);
        assert_eq!(log.usage_estimated, 1, "{}", log.endpoint);
        assert_eq!(
            (log.prompt_tokens, log.completion_tokens),
            (*prompt, *completion),
            "{}",
            log.endpoint
        );
        assert!(log.explanation.contains("usage estimated"), "{}", log.explanation);
    }
    app.stop().await;
}

async fn counters_saturate_instead_of_overflowing(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    // A price so high (the most the resources file stores) that one request at the usage
    // ceiling costs more micro-credits than a counter holds: every credits counter saturates,
    // and the sum of two must too (in memory, in the flush's SQL, in the usage report).
    let policies = policy("member", "*", "credits", "month", "9e12", "shadow")
        + &policy("ws", "acme", "requests", "day", "1000", "enforce");
    let priced = fixture(&mock).set("model", "gpt-4o-mini", "price", price(9e12, 9e12));
    let text = String::from(with_bob_and_owner(priced)) + &policies;
    let app = spawn_app(&db, Setup::resources(text.clone())).await;
    mock.script(Script {
        prompt_tokens: Some(99_999_000),
        ..Script::any()
    });
    for _ in 0..2 {
        send_ok(&app, "/v1/chat/completions", KEY, &chat(false)).await;
        flush(&app).await;
    }
    let logs = app.logs("acme", 2).await;
    assert!(
        logs.iter()
            .all(|l| l.credits == i64::MAX && l.usage_estimated == 0),
        "credits saturate; the usage itself was valid"
    );
    let (status, report) = usage_report(&app, "member").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["data"][0]["requests"], 2);
    assert_eq!(
        report["data"][0]["credits"],
        aigw::kernel::credits::micros_to_credits(i64::MAX)
    );
    app.stop().await;
    let stored = stored_counters(&db).await;
    let ada = &logs[0];
    assert_eq!(
        stored.get(&("member".into(), ada.member_id, "credits".into())),
        Some(&i64::MAX)
    );
    assert_eq!(
        stored.get(&("ws".into(), ada.workspace_id, "requests".into())),
        Some(&2),
        "the other counters of the batch are stored exactly"
    );
    // Read back after a restart.
    let app = spawn_app(&db, Setup::resources(text)).await;
    let r = app.post_json("/v1/chat/completions", KEY, &chat(false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-aigw-quota-requests-remaining"], "997");
    app.stop().await;
}

/// Makes the database refuse every write of ada's requests counter (a fault no usage can cause
/// any more), or lifts that refusal.
async fn refuse_adas_request_counter(db: &TestDb, refuse: bool) {
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let when = "NEW.subject = 'apikey' AND NEW.metric = 'requests' \
                AND NEW.subject_id = (SELECT id FROM api_keys WHERE name = 'ci')";
    let statements: Vec<String> = match (db.backend, refuse) {
        ("postgres", true) => vec![
            format!(
                "CREATE FUNCTION refuse_counter() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 IF {when} THEN RAISE EXCEPTION 'counter refused by the test'; END IF; \
                 RETURN NEW; END $$"
            ),
            "CREATE TRIGGER refuse_counter BEFORE INSERT OR UPDATE ON usage_counters \
             FOR EACH ROW EXECUTE FUNCTION refuse_counter()"
                .to_owned(),
        ],
        ("postgres", false) => vec!["DROP TRIGGER refuse_counter ON usage_counters".to_owned()],
        (_, true) => ["INSERT", "UPDATE"]
            .iter()
            .map(|op| {
                format!(
                    "CREATE TRIGGER refuse_counter_{op} BEFORE {op} ON usage_counters WHEN {when} \
                     BEGIN SELECT RAISE(ABORT, 'counter refused by the test'); END"
                )
            })
            .collect(),
        (_, false) => vec![
            "DROP TRIGGER refuse_counter_INSERT".to_owned(),
            "DROP TRIGGER refuse_counter_UPDATE".to_owned(),
        ],
    };
    for sql in statements {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    pool.close().await;
}

async fn a_counter_the_database_refuses_holds_back_only_itself(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let policies = policy("apikey", "*", "requests", "day", "1000", "enforce")
        + &policy("apikey", "*", "total_tokens", "day", "1000000", "enforce");
    let app = spawn_app(&db, Setup::resources(workspace(&mock, &policies))).await;
    refuse_adas_request_counter(&db, true).await;
    for _ in 0..2 {
        send_ok(&app, "/v1/chat/completions", KEY, &chat(false)).await;
    }
    for _ in 0..3 {
        send_ok(&app, "/v1/chat/completions", BOB_KEY, &chat(false)).await;
    }
    let logs = app.logs("acme", 5).await;
    let requests_of = |key: i64| logs.iter().filter(|l| l.key_id == key).count();
    let key_with = |n: usize| {
        logs.iter()
            .map(|l| l.key_id)
            .find(|k| requests_of(*k) == n)
            .unwrap()
    };
    let (ada, bob) = (key_with(2), key_with(3));
    let s = &app.state;
    let expected = |ada_requests: Option<i64>| {
        let mut m = HashMap::from([
            (("apikey".to_owned(), bob, "requests".to_owned()), 3),
            (("apikey".to_owned(), bob, "total_tokens".to_owned()), 27),
            (("apikey".to_owned(), ada, "total_tokens".to_owned()), 18),
        ]);
        if let Some(n) = ada_requests {
            m.insert(("apikey".to_owned(), ada, "requests".to_owned()), n);
        }
        m
    };
    for _ in 0..3 {
        let flushed = s.quota.flush(&s.store, app.clock.now()).await;
        assert!(flushed.is_err(), "ada's requests counter was refused");
        assert_eq!(
            stored_counters(&db).await,
            expected(None),
            "every other counter is written, once"
        );
    }
    refuse_adas_request_counter(&db, false).await;
    flush(&app).await;
    flush(&app).await;
    assert_eq!(
        stored_counters(&db).await,
        expected(Some(2)),
        "written once refused no more"
    );
    app.stop().await;
    assert_eq!(stored_counters(&db).await, expected(Some(2)));
}
