//! A member's own usage (issue 24 §3): a member who does not manage the workspace sees only
//! their own usage, which reads the members' own daily rollup (whole UTC days) and the logs of
//! the partial days at the edges (by day at a whole-hour offset from UTC: their hourly rollup and
//! the partial hours from the logs; at a half-hour offset: the logs); the answer stays equal to
//! the sums of the member's logs, whatever the grouping, range, day offset or retention, and
//! after the backfills of migrations 0017 and 0019 from the logs already stored.

use aigw::request_log::LogRecord;
use aigw::store::{
    AdminStore, DAY_MS, HOUR_MS, MemberStore, RequestLogStore, RollupSums, UsageGrouping, UsageRow,
};

use super::months::{acme, expected};
use super::*;

both_backends!(
    a_members_usage_reads_their_rollup_and_equals_their_logs,
    the_migrations_fill_the_members_rollups_from_the_logs,
);

const GROUPINGS: [UsageGrouping; 5] = [
    UsageGrouping::Day,
    UsageGrouping::Key,
    UsageGrouping::Member,
    UsageGrouping::Dept,
    UsageGrouping::Model,
];

/// Logs of acme over the 6 days before `now`, of members 1..=4 (`ada` among them), each with
/// several keys, a department that changes (or none), served and only asked-for models; some
/// exactly on a day's start or a millisecond before it.
fn days_of_logs(ws: i64, ada: i64, now: i64) -> Vec<LogRecord> {
    let base = now - now.rem_euclid(DAY_MS) - 6 * DAY_MS;
    (0..900i64)
        .map(|i| {
            let ts = match i % 10 {
                0 => base + (i % 7) * DAY_MS,
                1 => base + (i % 7) * DAY_MS - 1,
                _ => base + (i * 7_919_993) % (6 * DAY_MS + 5 * HOUR_MS),
            };
            let member = [1, 2, ada, ada, 4][(i % 5) as usize];
            let asked = ["gpt-4o-mini", "other", ""][(i % 3) as usize];
            LogRecord {
                request_id: format!("member-usage-{i}"),
                ts,
                workspace_id: ws,
                key_id: member * 10 + i % 3,
                member_id: member,
                department_id: (i % 7 != 0).then_some(1 + (i / 100) % 2),
                endpoint: "chat.completions".into(),
                model_requested: (!asked.is_empty()).then(|| asked.to_owned()),
                model_served: (i % 4 != 0)
                    .then(|| ["gpt-4o-mini", "gpt-4o"][(i % 8 / 4) as usize].to_owned()),
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

/// Every member's report over every range, grouping and day offset equals the sums of `logs`.
async fn check(
    store: &aigw::store::Store,
    ws: i64,
    members: &[i64],
    ranges: &[(i64, i64)],
    logs: &[LogRecord],
    when: &str,
) {
    for &range in ranges {
        for by in GROUPINGS {
            for offset in [0, 2 * HOUR_MS, -5 * HOUR_MS, 19_800_000] {
                for &m in members {
                    let mut got = store
                        .usage(ws, Some(m), range.0, range.1, by, offset)
                        .await
                        .unwrap();
                    got.sort_by(|a, b| a.group_key.cmp(&b.group_key));
                    assert_eq!(
                        got,
                        expected(logs, Some(m), range, by, offset),
                        "{when}: {range:?} by {by:?} at offset {offset}, member {m}"
                    );
                }
            }
        }
    }
}

/// The member's reports by every grouping over `range`, days at `offset` from UTC.
async fn reports(
    store: &aigw::store::Store,
    ws: i64,
    member: i64,
    range: (i64, i64),
    offset: i64,
) -> Vec<Vec<UsageRow>> {
    let mut out = Vec::new();
    for by in GROUPINGS {
        let mut got = store
            .usage(ws, Some(member), range.0, range.1, by, offset)
            .await
            .unwrap();
        got.sort_by(|a, b| a.group_key.cmp(&b.group_key));
        out.push(got);
    }
    out
}

/// Deletes the logs of `[from, to)` behind the rollups' back: what a report reads from a rollup
/// is still counted, what it reads from the logs is not.
async fn delete_logs_behind_the_rollup(db: &TestDb, from: i64, to: i64) {
    let pool = sqlx::AnyPool::connect(&db.direct_url).await.unwrap();
    sqlx::query(&format!(
        "DELETE FROM request_logs WHERE ts >= {from} AND ts < {to}"
    ))
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
}

/// A member's reports equal the sums of their logs (partial days at both edges, days offset by
/// whole and half hours, flushes of any size, retention), come from the rollup for whole UTC
/// days (logs deleted behind its back still count), and the API answers a member with them.
async fn a_members_usage_reads_their_rollup_and_equals_their_logs(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let store = &app.state.store;
    let ws = acme(&app).await;
    let ada = store
        .member_by_email("ada@acme.test")
        .await
        .unwrap()
        .expect("ada")
        .id;
    let now = app.clock.now_ms();
    let logs = days_of_logs(ws, ada, now);
    let mut rest = logs.as_slice();
    for n in [1, 9, 90, 300, 500] {
        let (batch, tail) = rest.split_at(n);
        store.insert_logs(batch).await.unwrap();
        store.add_rollups(&RollupSums::of(batch)).await.unwrap();
        rest = tail;
    }
    let day = now - now.rem_euclid(DAY_MS);
    let ranges = [
        (day - 7 * DAY_MS, day + DAY_MS),
        (day - 5 * DAY_MS, day - DAY_MS),
        (day - 5 * DAY_MS + 1, day - DAY_MS - 1),
        (
            day - 5 * DAY_MS + 3 * HOUR_MS + 17,
            day - 2 * DAY_MS + 20 * HOUR_MS,
        ),
        (day - 3 * DAY_MS + 123_456, day - 3 * DAY_MS + 9_000_000),
        (day - 3 * DAY_MS - 1, day - 2 * DAY_MS + 1),
        (now - 30 * DAY_MS, now + 1),
    ];
    let members = [1, 2, ada, 4];
    check(store, ws, &members, &ranges, &logs, "after the flushes").await;

    // Retention at a day boundary, three rows at a time.
    let cutoff = day - 4 * DAY_MS;
    while store.prune_logs_batch(cutoff, 3).await.unwrap() > 0 {}
    let kept: Vec<LogRecord> = logs.iter().filter(|r| r.ts >= cutoff).cloned().collect();
    check(store, ws, &members, &ranges, &kept, "after retention").await;

    // Through the API, as ada (a member): her own usage only, the same figures.
    let range = (day - 3 * DAY_MS - HOUR_MS, day - DAY_MS + 7 * HOUR_MS);
    let offset = {
        use chrono::{Offset, TimeZone};
        let tz = app.state.timezone_of(ws);
        let now = app.state.clock.now().naive_utc();
        i64::from(tz.offset_from_utc_datetime(&now).fix().local_minus_utc()) * 1000
    };
    let admin = Admin { app: &app };
    let token = admin.login("ada@acme.test").await;
    for (by, grouping) in ["day", "key", "member", "dept", "model"]
        .into_iter()
        .zip(GROUPINGS)
    {
        let want = expected(&kept, Some(ada), range, grouping, offset);
        let u = admin
            .ok(
                Method::GET,
                &format!("/admin/v1/usage?by={by}&from={}&to={}", range.0, range.1),
                &token,
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
        let want: Vec<(String, i64, i64)> = want
            .iter()
            .map(|r| (r.group_key.clone(), r.requests, r.total_tokens))
            .collect();
        if by == "model" {
            // The API gathers the models the workspace does not list into one row: the totals.
            let total =
                |rows: &[(String, i64, i64)]| rows.iter().fold((0, 0), |(n, t), r| (n + r.1, t + r.2));
            assert_eq!(total(&got), total(&want), "{u}");
            continue;
        }
        assert_eq!(got, want, "by {by}: {u}");
    }
    // The whole UTC days come from the rollup: logs deleted behind its back still count, and so
    // do the whole hours of local days at a whole-hour offset (days at a half-hour offset read
    // the logs); the partial days at the edges are read from the logs.
    let before = reports(store, ws, ada, range, 0).await;
    let by_local_day = |offset| async move { reports(store, ws, ada, range, offset).await.swap_remove(0) };
    let (whole_hours, half_hours) = (by_local_day(2 * HOUR_MS).await, by_local_day(19_800_000).await);
    delete_logs_behind_the_rollup(&db, day - 3 * DAY_MS, day - DAY_MS).await;
    assert_eq!(reports(store, ws, ada, range, 0).await, before);
    delete_logs_behind_the_rollup(&db, day - DAY_MS, day - DAY_MS + HOUR_MS).await;
    let edge_gone: Vec<LogRecord> = kept
        .iter()
        .filter(|r| !(day - DAY_MS..day - DAY_MS + HOUR_MS).contains(&r.ts))
        .cloned()
        .collect();
    let now_read = reports(store, ws, ada, range, 0).await;
    for (by, got) in GROUPINGS.into_iter().zip(&now_read) {
        assert_eq!(got, &expected(&edge_gone, Some(ada), range, by, 0), "by {by:?}");
    }
    assert_ne!(now_read, before, "the edge is read from the logs");
    assert_eq!(
        by_local_day(2 * HOUR_MS).await,
        whole_hours,
        "whole hours from the rollup"
    );
    assert_ne!(
        by_local_day(19_800_000).await,
        half_hours,
        "half hours from the logs"
    );
    app.stop().await;
}

/// Migrations 0017 and 0019 fill the members' rollups from the logs stored before them: each
/// one's statement, run again over its emptied rollup, gives the rows the log writer wrote.
async fn the_migrations_fill_the_members_rollups_from_the_logs(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let store = &app.state.store;
    let ws = acme(&app).await;
    let ada = store
        .member_by_email("ada@acme.test")
        .await
        .unwrap()
        .expect("ada")
        .id;
    let now = app.clock.now_ms();
    let logs = days_of_logs(ws, ada, now);
    store.insert_logs(logs.as_slice()).await.unwrap();
    store.add_rollups(&RollupSums::of(&logs)).await.unwrap();
    let day = now - now.rem_euclid(DAY_MS);
    let range = (day - 5 * DAY_MS - HOUR_MS, day - DAY_MS + 7 * HOUR_MS);
    let pool = sqlx::AnyPool::connect(&db.direct_url).await.unwrap();
    // (migration, its rollup, the rollup's rows as text, the report offset that reads it)
    let sums = "requests, prompt_tokens, completion_tokens, total_tokens, credits";
    let migrations = [
        (
            "0017_usage_rollup_member",
            "usage_rollup_member",
            format!("member_id, day_start, key_id, dept_group, model_group, {sums}"),
            0,
        ),
        (
            "0019_usage_rollup_member_hourly",
            "usage_rollup_member_hourly",
            format!("member_id, hour_start, {sums}"),
            2 * HOUR_MS,
        ),
    ];
    for (name, table, columns, offset) in migrations {
        let written = reports(store, ws, ada, range, offset).await;
        let migration = std::fs::read_to_string(format!(
            "{}/migrations/{}/{name}.sql",
            env!("CARGO_MANIFEST_DIR"),
            db.backend
        ))
        .unwrap();
        let (_, backfill) = migration
            .split_once("-- The logs already stored.")
            .expect("the backfill");
        // Every column as text, so one row type serves both tables.
        let text: Vec<String> = columns
            .split(", ")
            .map(|c| format!("CAST({c} AS TEXT)"))
            .collect();
        let select = format!(
            "SELECT {} FROM {table} ORDER BY {columns}",
            text.join(" || ',' || ")
        );
        let rows = |pool: sqlx::AnyPool| {
            let select = select.clone();
            async move {
                sqlx::query_scalar::<_, String>(&select)
                    .fetch_all(&pool)
                    .await
                    .unwrap()
            }
        };
        let by_writer = rows(pool.clone()).await;
        assert!(by_writer.len() > 50, "{table}: {}", by_writer.len());
        sqlx::query(&format!("DELETE FROM {table}"))
            .execute(&pool)
            .await
            .unwrap();
        assert_ne!(
            reports(store, ws, ada, range, offset).await,
            written,
            "{table} was emptied"
        );
        sqlx::query(backfill).execute(&pool).await.unwrap();
        assert_eq!(rows(pool.clone()).await, by_writer, "{table}");
        assert_eq!(reports(store, ws, ada, range, offset).await, written, "{table}");
    }
    pool.close().await;
    app.stop().await;
}
