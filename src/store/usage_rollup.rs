//! The usage rollups, the sums of the stored logs: requests, tokens and
//! credits per hour (UTC), workspace, and model or department (`usage_rollup`); per day (UTC),
//! workspace, and key or member (`usage_rollup_daily`); per day (UTC), member, key, department
//! and model group (`usage_rollup_member`, a member's own usage); per hour (UTC) and member
//! (`usage_rollup_member_hourly`). A workspace's usage by day, model or department reads whole
//! hours from the first, by key or member whole days from the second, a member's own usage by
//! any grouping whole days of their rows in the third (its primary key starts with workspace and
//! member), and by day at an offset from UTC whole hours of the fourth; only the time at the
//! edges of a range, and the hours and days that end after the horizon, are read from the logs.
//!
//! Each gateway's log writer sums the logs it stored in memory ([`RollupSums`](super::RollupSums)) and writes the
//! sums once per `rollup_interval_ms` (and at a graceful stop), one upsert per row per interval
//! rather than per batch: with many keys that seldom repeat within a batch, each log used to
//! dirty several rollup pages of its own. So an hour or day is read from a rollup only once it
//! ended before the horizon, two intervals ago ([`Store::rollup_horizon`]), when every gateway
//! has written its sums of it; later ones are read from the logs. Exact (a rollup row is the sum
//! of the logs of its hour or day, and the retention task prunes an hour or a day once all its
//! logs are gone), but for the sums a gateway held when it was killed without a graceful stop
//! (at most its last interval's), and for a request whose log was written more than an interval
//! after it started (a long stream), counted in the rollups up to an interval late. Keys and
//! members are rolled up by day because an hourly row per key is about as many rows as the logs
//! with thousands of keys (measured in docs/performance.md, "Months of logs").
//! A member's own usage by day in a workspace whose days start at a half hour from UTC reads the
//! member's logs.

use crate::kernel::clock::Clock;

use super::{Backend, SqlBuilder, Store, StoreResult, UsageGrouping, UsageRow};

/// The clock and `rollup_interval_ms` that place the rollups' horizon
/// ([`Store::rollup_horizon`]).
#[derive(Clone, Debug)]
pub(super) struct RollupTiming {
    clock: Clock,
    interval_ms: i64,
}

impl Default for RollupTiming {
    /// The system clock and the setting's default.
    fn default() -> Self {
        RollupTiming {
            clock: Clock::System,
            interval_ms: 60_000,
        }
    }
}

impl Store {
    /// This store, with the gateway's clock and `rollup_interval_ms`: every gateway writes the
    /// usage rollups' sums at least that often, so the reports read the rollups only before
    /// [`Store::rollup_horizon`].
    pub fn with_rollup_interval(mut self, clock: Clock, interval_ms: i64) -> Store {
        self.rollup_timing = RollupTiming {
            clock,
            interval_ms: interval_ms.max(1),
        };
        self
    }

    /// The instant before which the usage rollups hold every stored log: two rollup intervals
    /// ago. A log's sums reach the rollups at the latest one interval after the log (its
    /// gateway writes them every interval, `request_log::start_writer`); the second interval is
    /// the margin for the request's own time (a log is stamped when its request started) and
    /// the write itself. Hours and days that end after it are read from the logs.
    pub fn rollup_horizon(&self) -> i64 {
        let RollupTiming { clock, interval_ms } = &self.rollup_timing;
        clock.now_ms().saturating_sub(interval_ms.saturating_mul(2))
    }
}

/// An hour, in ms.
pub const HOUR_MS: i64 = 3_600_000;

/// A day, in ms.
pub const DAY_MS: i64 = 86_400_000;

/// The start of the day (UTC) that holds `ts`.
pub fn day_of(ts: i64) -> i64 {
    ts.div_euclid(DAY_MS).saturating_mul(DAY_MS)
}

/// The start of the hour (UTC) that holds `ts`.
pub fn hour_of(ts: i64) -> i64 {
    ts.div_euclid(HOUR_MS).saturating_mul(HOUR_MS)
}

/// A rollup table: its name, the column of its time unit, and that unit in ms.
#[derive(Clone, Copy)]
pub(super) struct Rollup {
    pub(super) table: &'static str,
    pub(super) time: &'static str,
    unit_ms: i64,
}

pub(super) const HOURLY: Rollup = Rollup {
    table: "usage_rollup",
    time: "hour_start",
    unit_ms: HOUR_MS,
};

pub(super) const DAILY: Rollup = Rollup {
    table: "usage_rollup_daily",
    time: "day_start",
    unit_ms: DAY_MS,
};

/// The members' own rollup: a row per member, day, key, department and model group.
pub(super) const MEMBER: Rollup = Rollup {
    table: "usage_rollup_member",
    time: "day_start",
    unit_ms: DAY_MS,
};

/// The members' hourly rollup: a row per member and hour, for their usage by local day.
pub(super) const MEMBER_HOURLY: Rollup = Rollup {
    table: "usage_rollup_member_hourly",
    time: "hour_start",
    unit_ms: HOUR_MS,
};

/// Usage in `[from_ms, to_ms)` grouped by `by` (days at `offset_ms` from UTC): the whole hours
/// or days from the rollup that has the grouping, the rest (the edges, or all of it) from the
/// logs. One member's own (`member_id`): their rows of whole days, and their logs at the edges;
/// by day at an offset from UTC, their rows of whole hours (their logs when days start inside an
/// hour).
pub(super) async fn report(
    store: &Store,
    workspace_id: i64,
    member_id: Option<i64>,
    range: (i64, i64),
    by: UsageGrouping,
    offset_ms: i64,
) -> StoreResult<Vec<UsageRow>> {
    let horizon = store.rollup_horizon();
    let (sql, args) = report_query(store, workspace_id, member_id, range, by, offset_ms, horizon);
    Ok(sqlx::query_as_with(&sql, args).fetch_all(store.pool()).await?)
}

/// The statement of [`report`] and its arguments.
fn report_query(
    store: &Store,
    workspace_id: i64,
    member_id: Option<i64>,
    (from_ms, to_ms): (i64, i64),
    by: UsageGrouping,
    offset_ms: i64,
    horizon: i64,
) -> (String, sqlx::any::AnyArguments<'static>) {
    // Which rollup has the grouping, if any: hours by model or department (and by day when
    // days start on the hour), days by key or member; one member's own usage, their own rows
    // of UTC days (by day when the workspace's days are UTC days: a local day at another offset
    // holds parts of two UTC days, and is summed from the member's hours).
    let (rollup, dimension) = match (member_id, by) {
        (Some(_), UsageGrouping::Day) if offset_ms % HOUR_MS != 0 => (None, ""),
        (Some(_), UsageGrouping::Day) if offset_ms % DAY_MS != 0 => (Some(MEMBER_HOURLY), ""),
        (Some(_), _) => (Some(MEMBER), ""),
        // A day that starts inside an hour cannot be told from hourly sums.
        (None, UsageGrouping::Day) if offset_ms % HOUR_MS == 0 => (Some(HOURLY), "model"),
        (None, UsageGrouping::Day) => (None, "model"),
        (None, UsageGrouping::Model) => (Some(HOURLY), "model"),
        (None, UsageGrouping::Dept) => (Some(HOURLY), "dept"),
        (None, UsageGrouping::Key) => (Some(DAILY), "key"),
        (None, UsageGrouping::Member) => (Some(DAILY), "member"),
    };
    let Rollup { table, time, unit_ms } = rollup.unwrap_or(HOURLY);
    // The rollup's hours or days inside the range that end before the horizon: [first, last).
    let mut first = from_ms.div_euclid(unit_ms).saturating_mul(unit_ms);
    if first < from_ms {
        first = first.saturating_add(unit_ms);
    }
    let mut last = to_ms
        .div_euclid(unit_ms)
        .min(horizon.div_euclid(unit_ms))
        .saturating_mul(unit_ms);
    if last < first {
        (first, last) = (from_ms, from_ms);
    }
    let day = |time: &str| format!("CAST((({time} + {offset_ms}) / 86400000) AS TEXT)");
    let rolled = match (member_id, by) {
        (_, UsageGrouping::Day) => day(time),
        (None, _) => "group_key".to_owned(),
        (Some(_), UsageGrouping::Key) => "CAST(key_id AS TEXT)".to_owned(),
        (Some(_), UsageGrouping::Member) => "CAST(member_id AS TEXT)".to_owned(),
        (Some(_), UsageGrouping::Dept) => "dept_group".to_owned(),
        (Some(_), UsageGrouping::Model) => "model_group".to_owned(),
    };
    let logged = match by {
        UsageGrouping::Day => day("ts"),
        UsageGrouping::Key => "CAST(key_id AS TEXT)".to_owned(),
        UsageGrouping::Member => "CAST(member_id AS TEXT)".to_owned(),
        UsageGrouping::Dept => "COALESCE(CAST(department_id AS TEXT), '')".to_owned(),
        UsageGrouping::Model => "CASE WHEN model_served IS NOT NULL THEN 'served:' || model_served \
             ELSE 'asked:' || COALESCE(model_requested, '') END"
            .to_owned(),
    };
    // Sums saturate at i64::MAX rather than fail the report (SQLite's SUM stops with
    // "integer overflow", a Postgres sum past BIGINT does not cast back). SQLite's TOTAL adds
    // as floats, exact up to 2^53, and its cast to INTEGER saturates.
    let sum = |column: &str| match store.backend() {
        Backend::Sqlite => format!("CAST(TOTAL({column}) AS INTEGER) AS {column}"),
        Backend::Postgres => {
            format!("CAST(LEAST(COALESCE(SUM({column}), 0), 9223372036854775807) AS BIGINT) AS {column}")
        }
    };
    let sums = [
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "credits",
    ]
    .map(sum)
    .join(", ");
    if rollup.is_none() {
        // The logs alone: one plain aggregate, which the database can run in parallel.
        let sums = ["prompt_tokens", "completion_tokens", "total_tokens", "credits"]
            .map(sum)
            .join(", ");
        let mut b = SqlBuilder::new(
            store,
            &format!(
                "SELECT {logged} AS group_key, CAST(COUNT(*) AS BIGINT) AS requests, {sums}
                 FROM request_logs WHERE workspace_id = "
            ),
        );
        b.bind(workspace_id)
            .push(" AND ts >= ")
            .bind(from_ms)
            .push(" AND ts < ")
            .bind(to_ms);
        if let Some(m) = member_id {
            b.push(" AND member_id = ").bind(m);
        }
        b.push(&format!(" GROUP BY {logged} ORDER BY 1"));
        return b.finish();
    }
    let mut b = SqlBuilder::new(
        store,
        &format!(
            "SELECT group_key, {sums} FROM (
               SELECT {rolled} AS group_key, requests, prompt_tokens, completion_tokens, total_tokens, credits
               FROM {table} WHERE workspace_id = "
        ),
    );
    b.bind(workspace_id);
    match member_id {
        Some(m) => b.push(" AND member_id = ").bind(m),
        None => b.push(" AND dimension = ").bind(dimension),
    };
    b.push(&format!(" AND {time} >= "))
        .bind(first)
        .push(&format!(" AND {time} < "))
        .bind(last);
    // The edges, each a plain range of the (workspace_id, ts) index, or of the (member_id, ts)
    // one for a member's own.
    for (lo, hi) in [(from_ms, first.min(to_ms)), (last.max(from_ms), to_ms)] {
        b.push(&format!(
            " UNION ALL
              SELECT {logged} AS group_key, 1, prompt_tokens, completion_tokens, total_tokens, credits
              FROM request_logs WHERE "
        ));
        match member_id {
            Some(m) => member_range(&mut b, "", m, (lo, hi)),
            None => {
                b.push("workspace_id = ")
                    .bind(workspace_id)
                    .push(" AND ts >= ")
                    .bind(lo)
                    .push(" AND ts < ")
                    .bind(hi);
            }
        }
    }
    b.push(") usage GROUP BY group_key ORDER BY 1");
    b.finish()
}

/// Pushes the condition: member `m`'s logs in `[lo, hi)`, as a range of the (member_id, ts)
/// index only: with a plain condition on `ts`, the planners read the range of the (ts) index,
/// every member's logs of those hours, and keep the member's. No condition on the workspace (a
/// member id is one workspace's): with one, SQLite planned a read of every log of the workspace
/// through the (workspace_id, request_id) index, whose sampled statistics (`PRAGMA optimize`'s
/// `analysis_limit`) put as few rows under one workspace as under one member: 4–7 s for a
/// member's usage over 1 million logs (bench/logs.py), 9–18 ms without.
fn member_range(b: &mut SqlBuilder<'_>, alias: &str, m: i64, (lo, hi): (i64, i64)) {
    b.push(&format!("{alias}member_id = "))
        .bind(m)
        .push(&format!(" AND ({alias}member_id, {alias}ts) >= ("))
        .bind(m)
        .push(", ")
        .bind(lo)
        .push(&format!(") AND ({alias}member_id, {alias}ts) < ("))
        .bind(m)
        .push(", ")
        .bind(hi)
        .push(")");
}

/// Usage in `[from_ms, to_ms)` per value of tag `key` (requests without it are not listed): the
/// whole hours from the rollup's `tag:<key>` rows, the edges (and one member's own usage) from
/// the logs, whose value of the tag is cut out of the stored list in SQL.
pub(super) async fn report_by_tag(
    store: &Store,
    workspace_id: i64,
    member_id: Option<i64>,
    (from_ms, to_ms): (i64, i64),
    key: &str,
) -> StoreResult<Vec<UsageRow>> {
    let mut first = hour_of(from_ms);
    if first < from_ms {
        first = first.saturating_add(HOUR_MS);
    }
    let mut last = hour_of(to_ms).min(hour_of(store.rollup_horizon()));
    if last < first || member_id.is_some() {
        (first, last) = (from_ms, from_ms);
    }
    let find = match store.backend() {
        Backend::Sqlite => "instr",
        Backend::Postgres => "strpos",
    };
    // `,k=` found in `,tags,`; the value runs from after it to the next comma. Only a valid tag
    // key (a-z 0-9 _ . -, nothing SQL reads as syntax) is written into the statement.
    if !crate::kernel::tags::valid_key(key) {
        return Ok(Vec::new());
    }
    let needle = format!("',{key}='");
    let after = key.len() + 2;
    let list = "(',' || tags || ',')";
    let rest = format!("substr({list}, {find}({list}, {needle}) + {after})");
    let value = format!("substr({rest}, 1, {find}({rest}, ',') - 1)");
    let sum = |column: &str| match store.backend() {
        Backend::Sqlite => format!("CAST(TOTAL({column}) AS INTEGER) AS {column}"),
        Backend::Postgres => {
            format!("CAST(LEAST(COALESCE(SUM({column}), 0), 9223372036854775807) AS BIGINT) AS {column}")
        }
    };
    let sums = [
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "credits",
    ]
    .map(sum)
    .join(", ");
    let mut b = SqlBuilder::new(
        store,
        &format!(
            "SELECT group_key, {sums} FROM (
           SELECT group_key, requests, prompt_tokens, completion_tokens, total_tokens, credits
           FROM usage_rollup WHERE workspace_id = "
        ),
    );
    b.bind(workspace_id)
        .push(" AND dimension = ")
        .bind(format!("tag:{key}"))
        .push(" AND hour_start >= ")
        .bind(first)
        .push(" AND hour_start < ")
        .bind(last);
    let edges = if first == last && first == from_ms {
        vec![(from_ms, to_ms)]
    } else {
        vec![(from_ms, first.min(to_ms)), (last.max(from_ms), to_ms)]
    };
    for (lo, hi) in edges {
        b.push(&format!(
            " UNION ALL
              SELECT {value} AS group_key, 1, prompt_tokens, completion_tokens, total_tokens, credits
              FROM request_logs WHERE {find}({list}, {needle}) > 0 AND workspace_id = "
        ));
        b.bind(workspace_id)
            .push(" AND ts >= ")
            .bind(lo)
            .push(" AND ts < ")
            .bind(hi);
        if let Some(m) = member_id {
            b.push(" AND member_id = ").bind(m);
        }
    }
    b.push(") usage GROUP BY group_key ORDER BY 1");
    let (sql, args) = b.finish();
    Ok(sqlx::query_as_with(&sql, args).fetch_all(store.pool()).await?)
}

#[cfg(test)]
mod tests {
    use sqlx::{Connection, Row};

    use super::*;
    use crate::store::{LogRecord, RollupSums};

    /// Rollup rows upserted per 1,000 requests over 10,000 keys (1,000 members of 10 keys, 10
    /// departments, one model, no tags; keys drawn uniformly), when each batch of a 250 ms flush
    /// is added to the rollups (before issue 43) and when the sums of a 60 s interval are
    /// written once (after), at several request rates. Counts the rows, not the database's time:
    /// `cargo test --lib rollup_rows_per_request -- --ignored --nocapture`.
    #[test]
    #[ignore = "a figure for docs/performance.md, not a check"]
    fn rollup_rows_per_request() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as i64
        };
        let start = 1_800_000_000_000 - 1_800_000_000_000 % HOUR_MS;
        for rate in [100, 1_000, 10_000] {
            // One interval's requests, a quarter of a second's worth per batch.
            let requests: Vec<LogRecord> = (0..rate * 60)
                .map(|i| {
                    let key = next() % 10_000;
                    LogRecord {
                        ts: start + i * 1000 / rate,
                        workspace_id: 1,
                        key_id: key,
                        member_id: key / 10,
                        department_id: Some(key % 10),
                        model_served: Some("gpt-4o-mini".into()),
                        prompt_tokens: 10,
                        total_tokens: 10,
                        ..LogRecord::default()
                    }
                })
                .collect();
            let batch = usize::try_from(rate / 4).unwrap_or(1).max(1);
            let per_batch: usize = requests.chunks(batch).map(|b| RollupSums::of(b).rows()).sum();
            let per_interval = RollupSums::of(&requests).rows();
            let per_1000 = |rows: usize| rows as f64 * 1000.0 / requests.len() as f64;
            println!(
                "{rate} req/s: {:.0} rollup rows upserted per 1,000 requests per batch, {:.0} per interval",
                per_1000(per_batch),
                per_1000(per_interval)
            );
            assert!(per_interval <= per_batch);
        }
    }

    /// A member's own usage reads the member's logs at the range's edges through the
    /// (member_id, ts) index, whatever the statistics say of the workspace. With the sampled
    /// statistics `PRAGMA optimize` gathered over a million logs of one workspace (as few rows
    /// under the workspace as under one member), SQLite used to read every log of the workspace:
    /// 4–7 s a report in bench/logs.py.
    #[tokio::test]
    async fn a_members_usage_reads_only_the_members_logs() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("plan.db").display());
        let store = Store::connect(&url).await.unwrap();
        // A connection of its own, which loads the statistics written here.
        let mut conn = sqlx::AnyConnection::connect(&url).await.unwrap();
        for sql in [
            "ANALYZE",
            "DELETE FROM sqlite_stat1",
            "INSERT INTO sqlite_stat1 VALUES \
             ('request_logs', 'request_logs_request_id', '1000000 401 1'), \
             ('request_logs', 'request_logs_member_ts', '1000000 401 1 1'), \
             ('request_logs', 'request_logs_key_ts', '1000000 401 1 1'), \
             ('request_logs', 'request_logs_ws_ts', '1000000 401 1 1')",
            "ANALYZE sqlite_schema",
        ] {
            sqlx::query(sql).execute(&mut conn).await.unwrap();
        }
        let now = 1_800_000_000_000;
        for by in [UsageGrouping::Day, UsageGrouping::Key, UsageGrouping::Model] {
            let range = (now - 30 * DAY_MS, now);
            let (sql, args) = report_query(&store, 1, Some(7), range, by, 8 * HOUR_MS, now);
            let plan: Vec<String> = sqlx::query_with(&format!("EXPLAIN QUERY PLAN {sql}"), args)
                .fetch_all(&mut conn)
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<String, _>("detail"))
                .filter(|d| d.contains("request_logs"))
                .collect();
            assert!(!plan.is_empty(), "{by:?}: no read of the logs");
            for step in &plan {
                assert!(step.contains("request_logs_member_ts"), "{by:?}: {plan:?}");
            }
        }
    }
}
