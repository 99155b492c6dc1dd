//! The usage already recorded for a policy's subjects in one window, and the quota counters a
//! policy created in the middle of a window starts from (DESIGN.md §11).
//!
//! What is recorded comes from the members' own rollup (`usage_rollup_member`: per UTC day,
//! member, key, department and model group) for the whole UTC days of the range, and from the
//! logs for the part of its first day before them. The model group tells a request an upstream
//! served (`served:`) from one that was refused or failed, as the counters count only the
//! first: a refused request is no request, and its tokens and credits are 0. A day is read from
//! the rollup once it ended before the rollups' horizon (`Store::rollup_horizon`, two
//! `rollup_interval_ms` ago); the current day, and the first minutes of the next, from the logs
//! (at most a day's worth, or the range's own few minutes).

use super::{Backend, NARROW_STATEMENT_ROWS, SqlBuilder, Store, StoreResult, UsageCounterRow, statements};
use crate::store::usage_rollup::DAY_MS;

/// Whose usage, of what, over which range.
#[derive(Clone, Debug)]
pub struct RecordedUsage<'a> {
    /// The workspace.
    pub workspace_id: i64,
    /// `apikey`, `member`, `dept` or `ws` (the subject kinds the rollup keeps).
    pub subject: &'a str,
    /// One subject's id, or every subject of the kind (`None`).
    pub target: Option<i64>,
    /// Only the usage recorded in this department (a policy on each key or member of one).
    pub department: Option<i64>,
    /// `requests`, `prompt_tokens`, `completion_tokens`, `total_tokens` or `credits`.
    pub metric: &'a str,
    /// The range, Unix ms: `[from, to)`.
    pub range: (i64, i64),
}

/// The recorded usage and the counters seeded from it.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait RecordedUsageStore {
    /// The usage `q` names, per subject id (subjects with none recorded are left out). Sums
    /// saturate at `i64::MAX`.
    async fn recorded_usage(&self, q: &RecordedUsage<'_>) -> StoreResult<Vec<(i64, i64)>>;
    /// Creates each counter of `rows` that has no row yet, with its total; a counter that
    /// exists (a policy of the same subject, metric and window counts into it) is kept as it
    /// is. Returns the counters created: (subject id, total).
    async fn seed_usage_counters(&self, rows: &[(UsageCounterRow, i64)]) -> StoreResult<Vec<(i64, i64)>>;
}

/// The SQL of a subject kind's id: in the members' rollup, and in the logs.
fn subject_columns(subject: &str) -> Option<(&'static str, &'static str)> {
    Some(match subject {
        "apikey" => ("key_id", "key_id"),
        "member" => ("member_id", "member_id"),
        // Requests of members without a department are the department group ''.
        "dept" => (
            "CASE WHEN dept_group = '' THEN 0 ELSE CAST(dept_group AS BIGINT) END",
            "COALESCE(department_id, 0)",
        ),
        "ws" => ("workspace_id", "workspace_id"),
        _ => return None,
    })
}

/// A metric's column in the rollup, and its amount in one log.
fn metric_columns(metric: &str) -> Option<(&'static str, &'static str)> {
    Some(match metric {
        "requests" => ("requests", "1"),
        "prompt_tokens" => ("prompt_tokens", "prompt_tokens"),
        "completion_tokens" => ("completion_tokens", "completion_tokens"),
        "total_tokens" => ("total_tokens", "total_tokens"),
        "credits" => ("credits", "credits"),
        _ => return None,
    })
}

impl RecordedUsageStore for Store {
    async fn recorded_usage(&self, q: &RecordedUsage<'_>) -> StoreResult<Vec<(i64, i64)>> {
        let (Some((rolled, logged)), Some((rolled_amount, logged_amount))) =
            (subject_columns(q.subject), metric_columns(q.metric))
        else {
            return Ok(Vec::new());
        };
        let (from, to) = q.range;
        // The whole UTC days of the range start at `first`; those that end before the rollups'
        // horizon (`cut`) are read from the rollup, the logs cover [from, first) and, when the
        // horizon falls inside the range, [cut, to).
        let mut first = from.div_euclid(DAY_MS).saturating_mul(DAY_MS);
        if first < from {
            first = first.saturating_add(DAY_MS);
        }
        let cut = self.rollup_horizon().div_euclid(DAY_MS).saturating_mul(DAY_MS);
        let mut edges = vec![(from, first.min(to))];
        if cut < to {
            edges.push((cut.max(first), to));
        }
        let sum = match self.backend() {
            Backend::Sqlite => "CAST(TOTAL(amount) AS INTEGER)",
            Backend::Postgres => "CAST(LEAST(COALESCE(SUM(amount), 0), 9223372036854775807) AS BIGINT)",
        };
        let mut b = SqlBuilder::new(
            self,
            &format!(
                "SELECT subject_id, {sum} FROM (
                   SELECT {rolled} AS subject_id, {rolled_amount} AS amount FROM usage_rollup_member
                   WHERE workspace_id = "
            ),
        );
        b.bind(q.workspace_id)
            .push(" AND day_start >= ")
            .bind(first)
            .push(" AND day_start < ")
            .bind(to)
            .push(" AND day_start < ")
            .bind(cut)
            .push(" AND model_group LIKE 'served:%'");
        match (q.subject, q.target) {
            ("apikey", Some(t)) => b.push(" AND key_id = ").bind(t),
            ("member", Some(t)) => b.push(" AND member_id = ").bind(t),
            ("dept", Some(t)) => b.push(" AND dept_group = ").bind(t.to_string()),
            _ => &mut b,
        };
        if let Some(d) = q.department {
            b.push(" AND dept_group = ").bind(d.to_string());
        }
        for edge in edges {
            b.push(&format!(
                " UNION ALL
               SELECT {logged} AS subject_id, {logged_amount} AS amount FROM request_logs WHERE "
            ));
            // Each a plain range of an index: (member_id, ts), (key_id, ts) or (workspace_id, ts).
            match (q.subject, q.target) {
                ("member", Some(m)) => {
                    b.push("member_id = ")
                        .bind(m)
                        .push(" AND (member_id, ts) >= (")
                        .bind(m)
                        .push(", ")
                        .bind(edge.0)
                        .push(") AND (member_id, ts) < (")
                        .bind(m)
                        .push(", ")
                        .bind(edge.1)
                        .push(")");
                }
                ("apikey", Some(k)) => {
                    b.push("key_id = ")
                        .bind(k)
                        .push(" AND ts >= ")
                        .bind(edge.0)
                        .push(" AND ts < ")
                        .bind(edge.1);
                }
                (subject, target) => {
                    b.push("workspace_id = ")
                        .bind(q.workspace_id)
                        .push(" AND ts >= ")
                        .bind(edge.0)
                        .push(" AND ts < ")
                        .bind(edge.1);
                    if let ("dept", Some(t)) = (subject, target) {
                        b.push(" AND department_id = ").bind(t);
                    }
                }
            }
            b.push(" AND model_served IS NOT NULL");
            if let Some(d) = q.department {
                b.push(" AND department_id = ").bind(d);
            }
        }
        b.push(") recorded GROUP BY subject_id");
        let (sql, args) = b.finish();
        let rows: Vec<(i64, i64)> = sqlx::query_as_with(&sql, args).fetch_all(self.pool()).await?;
        Ok(rows
            .into_iter()
            .filter(|(id, used)| *id != 0 && *used > 0)
            .collect())
    }

    async fn seed_usage_counters(&self, rows: &[(UsageCounterRow, i64)]) -> StoreResult<Vec<(i64, i64)>> {
        let mut created = Vec::new();
        for chunk in statements(rows, NARROW_STATEMENT_ROWS) {
            let mut b = SqlBuilder::new(
                self,
                "INSERT INTO usage_counters (subject, subject_id, metric, time_window, window_start, used) VALUES ",
            );
            for (i, (k, used)) in chunk.iter().enumerate() {
                b.push(if i == 0 { "(" } else { ", (" });
                b.bind(k.subject)
                    .push(", ")
                    .bind(k.subject_id)
                    .push(", ")
                    .bind(k.metric)
                    .push(", ")
                    .bind(k.time_window.as_str())
                    .push(", ")
                    .bind(k.window_start)
                    .push(", ")
                    .bind((*used).max(0))
                    .push(")");
            }
            // A new row's `changed_tx` (Postgres) is its default: the next read back of every
            // gateway sees it.
            b.push(
                " ON CONFLICT (subject, subject_id, metric, time_window, window_start) DO NOTHING \
                 RETURNING subject_id, used",
            );
            let (sql, args) = b.finish();
            let done: Vec<(i64, i64)> = sqlx::query_as_with(&sql, args).fetch_all(self.pool()).await?;
            created.extend(done);
        }
        Ok(created)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{LogRecord, RequestLogStore, RollupSums};

    const H: i64 = 3_600_000;
    /// 2026-12-01T00:00:00Z.
    const DEC_1: i64 = 1_796_083_200_000;

    /// A log at `ts` of member `m` (key `m`0, department 3 for member 7, none for 8), served
    /// or refused, with `tokens` total tokens (half prompt) and `tokens` micro-credits.
    fn log(i: usize, ts: i64, m: i64, served: bool, tokens: i64) -> LogRecord {
        LogRecord {
            request_id: format!("r{i}"),
            ts,
            workspace_id: 1,
            key_id: m * 10,
            member_id: m,
            department_id: (m == 7).then_some(3),
            endpoint: "chat".into(),
            model_requested: Some("m".into()),
            model_served: served.then(|| "m".into()),
            status: if served { 200 } else { 429 },
            prompt_tokens: tokens / 2,
            completion_tokens: tokens - tokens / 2,
            total_tokens: tokens,
            credits: tokens,
            ..LogRecord::default()
        }
    }

    /// The recorded usage against a sum over the logs themselves: whole UTC days read from the
    /// rollup, the first day's part before them from the logs, refused requests left out.
    #[tokio::test]
    async fn recorded_usage_is_the_served_usage_of_the_logs_in_the_range() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("recorded.db").display());
        // Two minutes after the last log: its day is read from the logs, the days before it
        // from the rollup.
        let clock =
            crate::kernel::clock::Clock::Manual(std::sync::Arc::new((DEC_1 + 2 * H + 181_000).into()));
        let store = Store::connect(&url)
            .await
            .unwrap()
            .with_rollup_interval(clock, 60_000);
        #[rustfmt::skip]
        let logs: Vec<LogRecord> = [
            (DEC_1 - 14 * H, 7, true, 100),     // 10:00Z the day before: outside a Shanghai day
            (DEC_1 - 6 * H, 7, true, 20),       // 18:00Z: the Shanghai day's first UTC day, from the logs
            (DEC_1 - 5 * H, 8, true, 40),
            (DEC_1 - 5 * H, 7, false, 0),       // refused: no request, no tokens
            (DEC_1 + 2 * H, 7, true, 9),        // the current UTC day, from the logs
            (DEC_1 + 2 * H + 30_000, 8, true, 5),
            (DEC_1 + 2 * H + 61_000, 7, true, 3), // the next minute
        ]
        .iter()
        .enumerate()
        .map(|(i, (ts, m, served, t))| log(i, *ts, *m, *served, *t))
        .collect();
        store.insert_logs(logs.as_slice()).await.unwrap();
        store.add_rollups(&RollupSums::of(&logs)).await.unwrap();
        let shanghai_day = (DEC_1 - 8 * H, DEC_1 + 16 * H);
        let minute = (DEC_1 + 2 * H, DEC_1 + 2 * H + 60_000);
        let total = (0, i64::MAX);
        // (subject, target, department, metric, range)
        type Case = (&'static str, Option<i64>, Option<i64>, &'static str, (i64, i64));
        let cases: &[Case] = &[
            ("ws", Some(1), None, "total_tokens", shanghai_day),
            ("ws", None, None, "requests", shanghai_day),
            ("member", Some(7), None, "requests", shanghai_day),
            ("member", None, None, "credits", total),
            ("apikey", Some(80), None, "prompt_tokens", shanghai_day),
            ("apikey", None, Some(3), "completion_tokens", total),
            ("dept", Some(3), None, "total_tokens", shanghai_day),
            ("dept", None, None, "requests", total),
            ("ws", Some(1), None, "total_tokens", minute),
            ("member", None, None, "requests", minute),
        ];
        for (subject, target, department, metric, range) in cases {
            let q = RecordedUsage {
                workspace_id: 1,
                subject,
                target: *target,
                department: *department,
                metric,
                range: *range,
            };
            let mut got = store.recorded_usage(&q).await.unwrap();
            got.sort();
            // The same, summed over the logs.
            let mut want: std::collections::BTreeMap<i64, i64> = Default::default();
            for l in logs.iter().filter(|l| l.model_served.is_some()) {
                let id = match *subject {
                    "apikey" => l.key_id,
                    "member" => l.member_id,
                    "dept" => l.department_id.unwrap_or(0),
                    _ => l.workspace_id,
                };
                let amount = match *metric {
                    "requests" => 1,
                    "prompt_tokens" => l.prompt_tokens,
                    "completion_tokens" => l.completion_tokens,
                    "credits" => l.credits,
                    _ => l.total_tokens,
                };
                let inside = (range.0..range.1).contains(&l.ts)
                    && target.is_none_or(|t| t == id)
                    && department.is_none_or(|d| l.department_id == Some(d));
                if inside && id != 0 {
                    *want.entry(id).or_default() += amount;
                }
            }
            let want: Vec<(i64, i64)> = want.into_iter().filter(|(_, u)| *u > 0).collect();
            assert_eq!(
                got, want,
                "{subject} {target:?} {department:?} {metric} {range:?}"
            );
        }
    }

    /// A counter that exists is kept; the others are created with their totals.
    #[tokio::test]
    async fn seeding_creates_only_the_counters_that_have_no_row() {
        use crate::store::UsageStore;
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("seed.db").display());
        let store = Store::connect(&url).await.unwrap();
        let row = |id: i64| UsageCounterRow {
            subject: "member",
            subject_id: id,
            metric: "requests",
            time_window: "day".into(),
            window_start: 1_796_054_400,
        };
        store.add_usage(&[(row(1), 5)], None).await.unwrap();
        let created = store
            .seed_usage_counters(&[(row(1), 50), (row(2), 20)])
            .await
            .unwrap();
        assert_eq!(created, vec![(2, 20)]);
        assert_eq!(store.usage_counter(&row(1)).await.unwrap(), Some(5), "kept");
        assert_eq!(store.usage_counter(&row(2)).await.unwrap(), Some(20));
    }
}
