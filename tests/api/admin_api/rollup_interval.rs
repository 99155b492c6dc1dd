//! The usage rollups written once per `rollup_interval_ms` (issue 43): the log writer sums the
//! logs it stored in memory and writes the sums when the interval has passed, at a graceful stop,
//! and again after a failed write; the usage report reads the hours and days that end within two
//! intervals of now from the logs, so it equals the sums of the logs before and after the write.

use aigw::request_log::LogRecord;
use aigw::store::{DAY_MS, UsageGrouping, day_of};
use chrono::{DateTime, Utc};

use super::months::expected;
use super::*;

both_backends!(
    the_report_equals_the_logs_before_and_after_the_rollups_are_written,
    a_graceful_stop_writes_the_pending_rollup_sums,
);

/// Keys of ada and bob, on top of the admin suite's fixture: many keys, each used a few times.
const KEYS: usize = 12;

fn key(i: usize) -> String {
    format!("sk-aigw-RollupTestKey{i:02}abcdefghijklmnopq")
}

fn many_keys(mock: &MockUpstream) -> String {
    let mut file = ResourcesBuilder::new();
    for i in 0..KEYS {
        let member = if i % 2 == 0 {
            "ada@acme.test"
        } else {
            "bob@acme.test"
        };
        file = file.api_key(member, &format!("rollup-{i}"), &key(i));
    }
    resources(mock) + "\n" + &String::from(file)
}

/// Serves `rounds` chat completions on each of the [`KEYS`] keys.
async fn serve(app: &TestApp, rounds: usize) {
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..rounds {
        for i in 0..KEYS {
            let r = app.post_json("/v1/chat/completions", &key(i), &chat).await;
            assert_eq!(r.status(), 200, "key {i}");
        }
    }
}

/// (requests, total tokens) of each usage rollup (one dimension of the two shared ones), then of
/// the logs, read from the database itself.
async fn rollup_totals(db: &TestDb) -> Vec<(&'static str, i64, i64)> {
    let pool = sqlx::AnyPool::connect(&db.direct_url).await.unwrap();
    let mut out = Vec::new();
    for (name, from) in [
        ("usage_rollup", "usage_rollup WHERE dimension = 'model'"),
        ("usage_rollup_daily", "usage_rollup_daily WHERE dimension = 'key'"),
        ("usage_rollup_member", "usage_rollup_member"),
        ("usage_rollup_member_hourly", "usage_rollup_member_hourly"),
    ] {
        let (requests, tokens): (i64, i64) = sqlx::query_as(&format!(
            "SELECT CAST(COALESCE(SUM(requests), 0) AS BIGINT), \
             CAST(COALESCE(SUM(total_tokens), 0) AS BIGINT) FROM {from}"
        ))
        .fetch_one(&pool)
        .await
        .unwrap();
        out.push((name, requests, tokens));
    }
    pool.close().await;
    out
}

/// What [`rollup_totals`] reads once every log is in the rollups.
fn totals_of(logs: &[LogRecord]) -> Vec<(&'static str, i64, i64)> {
    let tokens = logs.iter().map(|l| l.total_tokens).sum();
    let n = logs.len() as i64;
    [
        "usage_rollup",
        "usage_rollup_daily",
        "usage_rollup_member",
        "usage_rollup_member_hourly",
    ]
    .into_iter()
    .map(|t| (t, n, tokens))
    .collect()
}

/// The usage report of `[from, to)` by each grouping, through the API: (group, requests, total
/// tokens) by key and by member (the daily rollup), the totals by department and by model (the
/// hourly one).
async fn reports(admin: &Admin<'_>, token: &str, (from, to): (i64, i64)) -> Vec<Vec<(String, i64, i64)>> {
    let mut out = Vec::new();
    for by in ["key", "member", "dept", "model"] {
        let u = admin
            .ok(
                Method::GET,
                &format!("/admin/v1/usage?by={by}&from={from}&to={to}"),
                token,
                None,
            )
            .await;
        let rows: Vec<(String, i64, i64)> = u["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["group"].as_str().unwrap_or_default().to_owned(),
                    r["requests"].as_i64().unwrap(),
                    r["total_tokens"].as_i64().unwrap(),
                )
            })
            .collect();
        out.push(match by {
            "key" | "member" => rows,
            _ => vec![total(&rows)],
        });
    }
    out
}

fn total(rows: &[(String, i64, i64)]) -> (String, i64, i64) {
    rows.iter()
        .fold((String::new(), 0, 0), |(g, n, t), r| (g, n + r.1, t + r.2))
}

/// [`reports`] summed from the logs themselves.
fn from_logs(logs: &[LogRecord], range: (i64, i64)) -> Vec<Vec<(String, i64, i64)>> {
    let rows = |by| {
        expected(logs, None, range, by, 0)
            .into_iter()
            .map(|r| (r.group_key, r.requests, r.total_tokens))
            .collect::<Vec<_>>()
    };
    vec![
        rows(UsageGrouping::Key),
        rows(UsageGrouping::Member),
        vec![total(&rows(UsageGrouping::Dept))],
        vec![total(&rows(UsageGrouping::Model))],
    ]
}

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
}

/// Requests of many keys half an hour before midnight (UTC). Stored, their logs are not yet in
/// the rollups (the interval has not passed); a minute after midnight their hour and day have
/// ended, but within two intervals: the report reads them from the logs and is exact though the
/// rollups are still empty. Two minutes later the writer's next round writes the sums, and the
/// report, which now reads that hour and day from the rollups, is the same.
async fn the_report_equals_the_logs_before_and_after_the_rollups_are_written(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let setup = Setup {
        start: at("2026-12-01T23:30:00Z"),
        ..Setup::resources(many_keys(&mock))
    };
    let app = spawn_app(&db, setup).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    serve(&app, 3).await;
    let logs = app.logs("acme", 3 * KEYS).await;
    assert_eq!(logs.len(), 3 * KEYS);
    assert!(
        rollup_totals(&db).await.iter().all(|(_, n, _)| *n == 0),
        "the sums wait for the interval: {:?}",
        rollup_totals(&db).await
    );
    let day = day_of(app.clock.now_ms());
    let range = (day, day + DAY_MS);
    let want = from_logs(&logs, range);
    assert_eq!(want[0].len(), KEYS, "a row per key");

    // 00:01: the day and its last hour ended within two intervals, and no sums are written.
    app.clock.advance(chrono::Duration::minutes(31));
    assert_eq!(reports(&admin, &owner, range).await, want, "read from the logs");
    assert!(rollup_totals(&db).await.iter().all(|(_, n, _)| *n == 0));

    // 00:03: the interval passed long ago; the writer's next round writes the sums, and the
    // report reads the hour and the day from the rollups.
    app.clock.advance(chrono::Duration::minutes(2));
    app.sync().await;
    assert_eq!(rollup_totals(&db).await, totals_of(&logs));
    assert_eq!(
        reports(&admin, &owner, range).await,
        want,
        "read from the rollups"
    );
    app.stop().await;
}

/// The sums of logs stored within the interval are written at a graceful stop.
async fn a_graceful_stop_writes_the_pending_rollup_sums(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(many_keys(&mock))).await;
    serve(&app, 2).await;
    let logs = app.logs("acme", 2 * KEYS).await;
    assert!(rollup_totals(&db).await.iter().all(|(_, n, _)| *n == 0));
    app.stop().await;
    assert_eq!(rollup_totals(&db).await, totals_of(&logs));
}

/// The database away when the sums are due: the write fails and the sums are kept; the logs
/// stored after the recovery add to them, and the next write carries both, each log once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rollup_write_keeps_the_sums_for_the_next() {
    let Some((db, switch)) = TestDb::postgres_behind_switch().await else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(many_keys(&mock))).await;
    serve(&app, 2).await;
    app.logs("acme", 2 * KEYS).await;

    switch.cut();
    app.clock.advance(chrono::Duration::minutes(2));
    app.state.logs.flush().await;
    assert!(
        rollup_totals(&db).await.iter().all(|(_, n, _)| *n == 0),
        "the write failed"
    );

    switch.restore();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while app.get("/readyz").await.status() != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the database never came back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    serve(&app, 1).await;
    let logs = app.logs("acme", 3 * KEYS).await;
    assert_eq!(logs.len(), 3 * KEYS);
    app.clock.advance(chrono::Duration::minutes(2));
    app.sync().await;
    assert_eq!(rollup_totals(&db).await, totals_of(&logs));
    app.stop().await;
    assert_eq!(
        rollup_totals(&db).await,
        totals_of(&logs),
        "written once, not again at the stop"
    );
}
