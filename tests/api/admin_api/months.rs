//! Months of logs (issue 24 §3): the usage reports read rollups (hourly, and daily by key and
//! member) summed from the stored logs and stay equal to the sums of the logs, retention deletes in bounded batches and keeps them
//! equal, the CSV export streams page after page, and log pages follow the requests' time.

use aigw::request_log::LogRecord;
use aigw::store::{
    AdminStore, HOUR_MS, RequestLogStore, RollupSums, UsageGrouping, UsageRow, WorkspaceStore,
};

use super::*;

both_backends!(
    usage_from_the_rollup_equals_the_sums_of_the_logs,
    the_csv_export_streams_every_page,
    log_pages_follow_the_requests_time,
);

/// SQLite gathers the query planner's statistics (`PRAGMA optimize`) at start, after the
/// migrations, and at shutdown: without them it plans the reports' queries blind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_gathers_the_planners_statistics() {
    let db = TestDb::sqlite();
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let ws = acme(&app).await;
    let logs = varied_logs(ws, app.clock.now_ms());
    app.state.store.insert_logs(logs.as_slice()).await.unwrap();
    app.stop().await;
    let stats = || async {
        let pool = sqlx::AnyPool::connect(&db.direct_url).await.unwrap();
        let n: i64 = sqlx::query_scalar(
            "SELECT CAST(COUNT(*) AS BIGINT) FROM sqlite_master WHERE name = 'sqlite_stat1'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if n == 0 {
            return 0;
        }
        sqlx::query_scalar::<_, i64>(
            "SELECT CAST(COUNT(*) AS BIGINT) FROM sqlite_stat1 WHERE tbl = 'request_logs'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert!(
        stats().await > 0,
        "the logs' indexes have statistics after a stop"
    );
}

/// The workspace id of acme.
pub(super) async fn acme(app: &TestApp) -> i64 {
    app.state
        .store
        .workspace_by_name("acme")
        .await
        .unwrap()
        .expect("acme")
        .id
}

/// Varied logs of acme over the 50 hours before `now`, some exactly on an hour's start or a
/// millisecond before it.
fn varied_logs(ws: i64, now: i64) -> Vec<LogRecord> {
    let base = now - now.rem_euclid(HOUR_MS) - 50 * HOUR_MS;
    (0..400i64)
        .map(|i| {
            let ts = match i % 10 {
                0 => base + (i % 50) * HOUR_MS,
                1 => base + (i % 50) * HOUR_MS - 1,
                _ => base + (i * 7_919_993) % (50 * HOUR_MS),
            };
            let asked = ["gpt-4o-mini", "other", ""][(i % 3) as usize];
            LogRecord {
                request_id: format!("months-{i}"),
                ts,
                workspace_id: ws,
                key_id: 1 + i % 3,
                member_id: 1 + i % 4,
                department_id: (i % 5 != 0).then_some(1 + i % 2),
                endpoint: "chat.completions".into(),
                model_requested: (!asked.is_empty()).then(|| asked.to_owned()),
                model_served: (i % 4 != 0).then(|| "gpt-4o-mini".to_owned()),
                status: if i % 4 == 0 { 429 } else { 200 },
                prompt_tokens: i * 3,
                completion_tokens: i % 17,
                total_tokens: i * 3 + i % 17,
                credits: i * 1_001,
                ..LogRecord::default()
            }
        })
        .collect()
}

/// The usage report computed from the logs themselves, the way the store groups them.
pub(super) fn expected(
    logs: &[LogRecord],
    member: Option<i64>,
    (from, to): (i64, i64),
    by: UsageGrouping,
    offset: i64,
) -> Vec<UsageRow> {
    let mut groups: Vec<UsageRow> = Vec::new();
    for r in logs
        .iter()
        .filter(|r| r.ts >= from && r.ts < to && member.is_none_or(|m| r.member_id == m))
    {
        let key = match by {
            UsageGrouping::Day => ((r.ts + offset) / 86_400_000).to_string(),
            UsageGrouping::Key => r.key_id.to_string(),
            UsageGrouping::Member => r.member_id.to_string(),
            UsageGrouping::Dept => r.department_id.map(|d| d.to_string()).unwrap_or_default(),
            UsageGrouping::Model => match &r.model_served {
                Some(m) => format!("served:{m}"),
                None => format!("asked:{}", r.model_requested.as_deref().unwrap_or("")),
            },
        };
        let row = UsageRow {
            group_key: key.clone(),
            requests: 1,
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            total_tokens: r.total_tokens,
            credits: r.credits,
        };
        match groups.iter_mut().find(|g| g.group_key == key) {
            Some(g) => g.add(&row),
            None => groups.push(row),
        }
    }
    groups.sort_by(|a, b| a.group_key.cmp(&b.group_key));
    groups
}

/// Compares every report of `ranges` with the sums of `logs`.
async fn check(store: &aigw::store::Store, ws: i64, ranges: &[(i64, i64)], logs: &[LogRecord], when: &str) {
    for &range in ranges {
        for by in [
            UsageGrouping::Day,
            UsageGrouping::Key,
            UsageGrouping::Member,
            UsageGrouping::Dept,
            UsageGrouping::Model,
        ] {
            for offset in [0, 2 * HOUR_MS, -5 * HOUR_MS, 19_800_000] {
                for member in [None, Some(2)] {
                    let mut got = store
                        .usage(ws, member, range.0, range.1, by, offset)
                        .await
                        .unwrap();
                    got.sort_by(|a, b| a.group_key.cmp(&b.group_key));
                    assert_eq!(
                        got,
                        expected(logs, member, range, by, offset),
                        "{when}: {range:?} by {by:?} at offset {offset}, member {member:?}"
                    );
                }
            }
        }
    }
}

/// Every grouping, day offsets of whole and half hours, ranges aligned to hours or not (one
/// inside a single hour), a member's own: the report equals the sums of the logs, after flushes
/// of any size and after retention deleted the oldest logs in bounded batches.
async fn usage_from_the_rollup_equals_the_sums_of_the_logs(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let store = &app.state.store;
    let ws = acme(&app).await;
    let now = app.clock.now_ms();
    let logs = varied_logs(ws, now);
    // Flushes of several sizes: the rollup adds to rows an earlier flush wrote.
    let mut rest = logs.as_slice();
    for n in [1, 7, 50, 142, 200] {
        let (batch, tail) = rest.split_at(n);
        store.insert_logs(batch).await.unwrap();
        store.add_rollups(&RollupSums::of(batch)).await.unwrap();
        rest = tail;
    }
    let hour = now - now.rem_euclid(HOUR_MS);
    let ranges = [
        (hour - 50 * HOUR_MS, hour + HOUR_MS),
        (hour - 40 * HOUR_MS, hour - 10 * HOUR_MS),
        (hour - 40 * HOUR_MS + 1, hour - 10 * HOUR_MS - 1),
        (hour - 30 * HOUR_MS + 123_456, hour - 30 * HOUR_MS + 2_000_000),
        (hour - 29 * HOUR_MS - 1, hour - 28 * HOUR_MS + 1),
        (now - 30 * 86_400_000, now + 1),
    ];
    check(store, ws, &ranges, &logs, "after the flushes").await;

    // Retention at a day boundary (as the retention task cuts), five rows at a time: never
    // more, until nothing is left.
    let cutoff = (hour - 20 * HOUR_MS).div_euclid(86_400_000) * 86_400_000;
    let mut deleted = 0;
    loop {
        let n = store.prune_logs_batch(cutoff, 5).await.unwrap();
        assert!(n <= 5, "a batch deleted {n} rows");
        if n == 0 {
            break;
        }
        deleted += n;
    }
    let kept: Vec<LogRecord> = logs.iter().filter(|r| r.ts >= cutoff).cloned().collect();
    assert!(
        deleted > (logs.len() - kept.len()) as u64,
        "logs and rollup rows were deleted"
    );
    check(store, ws, &ranges, &kept, "after retention").await;

    // The report through the API: the same figures.
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let (from, to) = (hour - 30 * HOUR_MS + 1, hour);
    let u = admin
        .ok(
            Method::GET,
            &format!("/admin/v1/usage?by=key&from={from}&to={to}"),
            &owner,
            None,
        )
        .await;
    let got: Vec<(String, i64, i64)> = u["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["group"].as_str().unwrap().to_owned(),
                r["requests"].as_i64().unwrap(),
                r["total_tokens"].as_i64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, i64, i64)> = expected(&kept, None, (from, to), UsageGrouping::Key, 0)
        .into_iter()
        .map(|r| (r.group_key, r.requests, r.total_tokens))
        .collect();
    assert_eq!(got, want, "{u}");
    app.stop().await;
}

/// An export of more rows than a page is written page after page as it is read (chunked, no
/// length known up front), every row once, newest first.
async fn the_csv_export_streams_every_page(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let ws = acme(&app).await;
    let now = app.clock.now_ms();
    let logs: Vec<LogRecord> = (0..1234i64)
        .map(|i| LogRecord {
            request_id: format!("export-{i}"),
            // Arrival order is not time order: every third log is of a request that started
            // earlier than the one logged before it.
            ts: now - 10_000 + i * 5 - if i % 3 == 0 { 7 } else { 0 },
            workspace_id: ws,
            key_id: 1,
            member_id: 1,
            endpoint: "chat.completions".into(),
            status: 200,
            ..LogRecord::default()
        })
        .collect();
    for batch in logs.chunks(400) {
        app.state.store.insert_logs(batch).await.unwrap();
    }
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let r = app.get_as("/admin/v1/logs/export", &owner).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("content-length").is_none(), "{:?}", r.headers());
    assert_eq!(r.headers()["transfer-encoding"], "chunked");
    let csv = r.text().await.unwrap();
    let ids: Vec<String> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap().to_owned())
        .collect();
    let mut want = logs.clone();
    want.sort_by_key(|r| std::cmp::Reverse(r.ts));
    let want: Vec<String> = want.into_iter().map(|r| r.request_id).collect();
    assert_eq!(ids, want);
    app.stop().await;
}

/// Pages are newest first by the time the request started (then by arrival), a cursor page
/// after page gives every log once, with a time range too.
async fn log_pages_follow_the_requests_time(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let ws = acme(&app).await;
    let now = app.clock.now_ms();
    // Logged in arrival order; some started at the same instant.
    let starts = [5, 1, 9, 3, 3, 7, 2, 9, 0, 6, 4, 8];
    let logs: Vec<LogRecord> = starts
        .iter()
        .enumerate()
        .map(|(i, s)| LogRecord {
            request_id: format!("page-{i}"),
            ts: now - 1000 + s,
            workspace_id: ws,
            key_id: 1,
            member_id: 1,
            endpoint: "chat.completions".into(),
            status: 200,
            ..LogRecord::default()
        })
        .collect();
    app.state.store.insert_logs(logs.as_slice()).await.unwrap();
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    for (range, len) in [
        (String::new(), 12),
        (format!("&from={}&to={}", now - 998, now - 992), 7),
    ] {
        let mut seen: Vec<(i64, i64)> = Vec::new();
        let mut cursor: Option<i64> = None;
        loop {
            let path = format!(
                "/admin/v1/logs?limit=3{range}{}",
                cursor.map(|c| format!("&cursor={c}")).unwrap_or_default()
            );
            let page = admin.ok(Method::GET, &path, &owner, None).await;
            seen.extend(
                page["data"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| (l["ts"].as_i64().unwrap(), l["id"].as_i64().unwrap())),
            );
            match page["next_cursor"].as_i64() {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        let mut sorted = seen.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        sorted.dedup();
        assert_eq!(seen, sorted, "newest first by (ts, id), no repeat: {range}");
        assert_eq!(seen.len(), len, "{range}");
    }
    app.stop().await;
}
