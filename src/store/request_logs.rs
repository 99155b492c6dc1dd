//! Request logs (DESIGN.md §7): written in batches by the log writer, queried with filters and
//! cursor pagination, pruned by the retention task.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Backend, HOUR_MS, RollupSums, STATEMENT_ROWS, SqlBuilder, Store, StoreResult, statements};

/// One request, as logged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct LogRecord {
    /// Row id (0 until stored).
    pub id: i64,
    /// The `x-request-id` the client saw.
    pub request_id: String,
    /// Start of the request, Unix ms.
    pub ts: i64,
    /// Workspace.
    pub workspace_id: i64,
    /// Gateway key.
    pub key_id: i64,
    /// Member owning the key.
    pub member_id: i64,
    /// Member's department.
    pub department_id: Option<i64>,
    /// `chat.completions`, `embeddings`, `messages`.
    pub endpoint: String,
    /// Model the client asked for.
    pub model_requested: Option<String>,
    /// Public model that served it (a fallback, perhaps).
    pub model_served: Option<String>,
    /// Credential that served it (or last failed).
    pub upstream_id: Option<i64>,
    /// Upstream attempts made.
    pub attempts: i64,
    /// JSON list of attempts: credential, model, status, rule, lock until.
    pub attempts_detail: String,
    /// Final status to the client.
    pub status: i64,
    /// Error code, if any.
    pub code: Option<String>,
    /// `gateway` or `upstream` for errors.
    pub source: Option<String>,
    /// Status explanation for people.
    pub explanation: String,
    /// 1 if streamed.
    pub stream: i64,
    /// Prompt tokens.
    pub prompt_tokens: i64,
    /// Completion tokens.
    pub completion_tokens: i64,
    /// Total tokens.
    pub total_tokens: i64,
    /// Micro-credits.
    pub credits: i64,
    /// 1 if the usage was estimated (client disconnected before the upstream reported it).
    pub usage_estimated: i64,
    /// Total latency, ms.
    pub latency_ms: i64,
    /// Time to first byte to the client, ms.
    pub ttfb_ms: Option<i64>,
    /// Time until the serving upstream's response headers, ms.
    pub upstream_latency_ms: Option<i64>,
    /// Client address.
    pub client_ip: Option<String>,
    /// Shadow policies that would have refused this request.
    pub would_refuse: Option<String>,
    /// The request's tags, sorted by key: `feature=summaries,team=search` (issue 25 item 6).
    pub tags: Option<String>,
    /// The end user the request named (`x-aigw-end-user`, or the body's `user`).
    pub end_user: Option<String>,
}

pub(super) const COLUMNS: &str = "request_id, ts, workspace_id, key_id, member_id, department_id, endpoint, model_requested, \
    model_served, upstream_id, attempts, attempts_detail, status, code, source, explanation, stream, prompt_tokens, \
    completion_tokens, total_tokens, credits, usage_estimated, latency_ms, ttfb_ms, upstream_latency_ms, client_ip, would_refuse, \
    tags, end_user";

/// The values of one row of [`COLUMNS`].
pub(super) const LOG_VALUES: usize = 29;

/// One value of a log row, as both writers bind it (sqlx here, rusqlite on a SQLite file).
#[derive(Clone, Copy, Debug)]
pub(super) enum LogValue<'a> {
    Int(i64),
    OptInt(Option<i64>),
    Text(&'a str),
    OptText(Option<&'a str>),
}

impl LogRecord {
    /// The row's values in the order of [`COLUMNS`]: the one list both writers bind.
    pub(super) fn values(&self) -> [LogValue<'_>; LOG_VALUES] {
        use LogValue::{Int, OptInt, OptText, Text};
        [
            Text(&self.request_id),
            Int(self.ts),
            Int(self.workspace_id),
            Int(self.key_id),
            Int(self.member_id),
            OptInt(self.department_id),
            Text(&self.endpoint),
            OptText(self.model_requested.as_deref()),
            OptText(self.model_served.as_deref()),
            OptInt(self.upstream_id),
            Int(self.attempts),
            Text(&self.attempts_detail),
            Int(self.status),
            OptText(self.code.as_deref()),
            OptText(self.source.as_deref()),
            Text(&self.explanation),
            Int(self.stream),
            Int(self.prompt_tokens),
            Int(self.completion_tokens),
            Int(self.total_tokens),
            Int(self.credits),
            Int(self.usage_estimated),
            Int(self.latency_ms),
            OptInt(self.ttfb_ms),
            OptInt(self.upstream_latency_ms),
            OptText(self.client_ip.as_deref()),
            OptText(self.would_refuse.as_deref()),
            OptText(self.tags.as_deref()),
            OptText(self.end_user.as_deref()),
        ]
    }
}

/// Advances a key's last-used stamp `$1` (`$2`: the key) when it moved by a step (`$3`: the
/// stamp less [`LAST_USED_STEP_MS`]).
pub(super) const LAST_USED_SQL: &str = "UPDATE api_keys SET last_used_at = $1 WHERE id = $2 \
     AND (last_used_at IS NULL OR last_used_at <= $3)";

/// Filters of the log query (DESIGN.md §7).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogFilter {
    /// Only this workspace (always set by the caller).
    #[serde(skip)]
    pub workspace_id: i64,
    /// From this instant, Unix ms (inclusive).
    pub from: Option<i64>,
    /// Until this instant, Unix ms (exclusive).
    pub to: Option<i64>,
    /// Only this key.
    pub key_id: Option<i64>,
    /// Only this member.
    pub member_id: Option<i64>,
    /// Only this model (asked for or served).
    pub model: Option<String>,
    /// Only this status.
    pub status: Option<i64>,
    /// `true`: only failures (status 400 or above); `false`: only successes.
    pub errors: Option<bool>,
    /// Only the request with this `x-request-id`.
    pub request_id: Option<String>,
    /// Only this source (`gateway` or `upstream`).
    pub source: Option<String>,
    /// Only requests carrying this tag, `key=value` (issue 25 item 6).
    pub tag: Option<String>,
    /// Only requests of this end user.
    pub end_user: Option<String>,
    /// Rows with an id below this (the previous page's `next_cursor`).
    pub cursor: Option<i64>,
    /// Page size (1..=500, default 50).
    pub limit: Option<i64>,
}

/// `text` matched literally by LIKE (with `ESCAPE '\'`).
fn like_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A page of logs, newest first.
#[derive(Clone, Debug, Serialize)]
pub struct LogPage {
    /// The rows.
    pub items: Vec<LogRecord>,
    /// Pass as `cursor` for the next page; `None` at the end.
    pub next_cursor: Option<i64>,
}

/// Request logs.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait RequestLogStore {
    /// Inserts a batch of records in one transaction: all of them or none (a retry never writes a
    /// row twice), with one commit for the whole flush. Also advances the keys' "last used" and
    /// adds to the credentials' hourly figures, in the same transaction. The usage rollups are
    /// not written here: the caller sums the stored batches ([`RollupSums`]) and writes them
    /// with [`RequestLogStore::add_rollups`].
    async fn insert_logs(&self, records: impl Into<Arc<[LogRecord]>>) -> StoreResult<()>;
    /// Adds `sums` (of logs stored before) to the usage rollups, in one transaction: all of them
    /// or none, so that sums kept after a failure are written once.
    async fn add_rollups(&self, sums: &RollupSums) -> StoreResult<()>;
    /// The log of one request in a workspace.
    async fn log_by_request_id(&self, workspace_id: i64, request_id: &str) -> StoreResult<Option<LogRecord>>;
    /// Logs matching `f`, newest first (by `ts`, then `id`), one page.
    async fn logs(&self, f: &LogFilter) -> StoreResult<LogPage>;
    /// Deletes logs older than `cutoff_ms`, in batches; returns how many.
    async fn prune_logs(&self, cutoff_ms: i64) -> StoreResult<u64> {
        let mut total = 0;
        loop {
            let n = self.prune_logs_batch(cutoff_ms, PRUNE_BATCH).await?;
            total += n;
            if n == 0 {
                return Ok(total);
            }
        }
    }
    /// Deletes at most `limit` logs older than `cutoff_ms`, oldest first, in one short
    /// transaction; once none is left, the usage rollups' hours (the workspace's, then the
    /// members'), then days (the workspace's, then the members' own), that end at or before
    /// `cutoff_ms` (at most `limit` rows of one rollup). The rollups stay exact when the cutoff
    /// is a day boundary (UTC). Returns the rows deleted (0: nothing left).
    async fn prune_logs_batch(&self, cutoff_ms: i64, limit: i64) -> StoreResult<u64>;
}

/// Rows one retention batch deletes at most: a few milliseconds of the database's time, so the
/// log writer (on SQLite, waiting for the one write lock) is never held up for long.
pub const PRUNE_BATCH: i64 = 1000;

/// How far a key's `last_used_at` must move before it is written again: it is exact to this
/// (docs/scaling.md), and a key in constant use costs its row a write a minute per gateway.
pub const LAST_USED_STEP_MS: i64 = 60_000;

/// The last-used stamps this gateway wrote, per key: a batch writes only those that moved by
/// [`LAST_USED_STEP_MS`] since.
#[derive(Debug, Default)]
pub(super) struct LastUsedStamps(std::sync::Mutex<rustc_hash::FxHashMap<i64, i64>>);

/// Keys remembered at most; past it the memory starts again (each key is then written once more).
const LAST_USED_KEPT: usize = 200_000;

impl LastUsedStamps {
    /// The (key, latest use) of `records` that moved by a step since this gateway last wrote
    /// them, in key order.
    fn due(&self, records: &[LogRecord]) -> Vec<(i64, i64)> {
        let mut latest: std::collections::BTreeMap<i64, i64> = std::collections::BTreeMap::new();
        for r in records.iter().filter(|r| r.key_id > 0) {
            let t = latest.entry(r.key_id).or_insert(r.ts);
            *t = (*t).max(r.ts);
        }
        let written = self.0.lock().unwrap_or_else(|p| p.into_inner());
        latest
            .into_iter()
            .filter(|(key, ts)| {
                written
                    .get(key)
                    .is_none_or(|w| *ts >= w.saturating_add(LAST_USED_STEP_MS))
            })
            .collect()
    }

    /// Notes stamps committed.
    fn written(&self, stamps: &[(i64, i64)]) {
        let mut written = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if written.len() + stamps.len() > LAST_USED_KEPT {
            written.clear();
        }
        written.extend(stamps.iter().copied());
    }
}

impl RequestLogStore for Store {
    async fn insert_logs(&self, records: impl Into<Arc<[LogRecord]>>) -> StoreResult<()> {
        let records: Arc<[LogRecord]> = records.into();
        let due = self.last_used.due(&records);
        if let Some(logs) = &self.sqlite_logs {
            logs.insert(Arc::clone(&records), due.clone()).await?;
            self.last_used.written(&due);
            return Ok(());
        }
        let records = &records[..];
        let mut tx = self.log_pool().begin().await?;
        // Statements of a few fixed sizes, each prepared once ([`STATEMENT_ROWS`]).
        for chunk in statements(records, STATEMENT_ROWS) {
            let mut b = SqlBuilder::for_rows(
                self,
                &format!("INSERT INTO request_logs ({COLUMNS}) VALUES "),
                chunk.len(),
                LOG_VALUES,
            );
            for (i, r) in chunk.iter().enumerate() {
                b.push(if i == 0 { "(" } else { ", (" });
                // Text is bound borrowed: the records outlive the statement.
                for (j, value) in r.values().into_iter().enumerate() {
                    if j > 0 {
                        b.push(", ");
                    }
                    match value {
                        LogValue::Int(n) => b.bind(n),
                        LogValue::OptInt(n) => b.bind(n),
                        LogValue::Text(t) => b.bind(t),
                        LogValue::OptText(t) => b.bind(t),
                    };
                }
                b.push(")");
            }
            let (sql, args) = b.finish();
            sqlx::query_with(&sql, args).execute(&mut *tx).await?;
        }
        // A key's "last used", written behind with its logs rather than on the request path,
        // and only when it moves by a minute or more (LAST_USED_STEP_MS): a busy key's row is
        // written about once a minute instead of with every batch of every gateway. In
        // ascending key order, so that two gateways' flushes lock the rows in the same order
        // (in a transaction, any other order can deadlock on Postgres).
        for &(key_id, ts) in &due {
            sqlx::query(LAST_USED_SQL)
                .bind(ts)
                .bind(key_id)
                .bind(ts.saturating_sub(LAST_USED_STEP_MS))
                .execute(&mut *tx)
                .await?;
        }
        // The credentials' rollup rows are the ones every gateway's batches share (a few per
        // hour): locked last, so they are held only until the commit that follows. The usage
        // rollups are written apart, once per interval ([`RequestLogStore::add_rollups`]).
        super::credential_figures::add(self, &mut tx, records).await?;
        tx.commit().await?;
        self.last_used.written(&due);
        Ok(())
    }

    async fn add_rollups(&self, sums: &RollupSums) -> StoreResult<()> {
        if sums.is_empty() {
            return Ok(());
        }
        let mut tx = self.log_pool().begin().await?;
        sums.write(self, &mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn log_by_request_id(&self, workspace_id: i64, request_id: &str) -> StoreResult<Option<LogRecord>> {
        Ok(
            sqlx::query_as("SELECT * FROM request_logs WHERE workspace_id = $1 AND request_id = $2")
                .bind(workspace_id)
                .bind(request_id)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    async fn logs(&self, f: &LogFilter) -> StoreResult<LogPage> {
        let limit = f.limit.unwrap_or(50).clamp(1, 500);
        let mut b = SqlBuilder::new(self, "SELECT * FROM request_logs WHERE workspace_id = ");
        b.bind(f.workspace_id);
        if let Some(v) = f.from {
            b.push(" AND ts >= ").bind(v);
        }
        if let Some(v) = f.to {
            b.push(" AND ts < ").bind(v);
        }
        if let Some(v) = f.key_id {
            b.push(" AND key_id = ").bind(v);
        }
        if let Some(v) = f.member_id {
            b.push(" AND member_id = ").bind(v);
        }
        if let Some(v) = &f.model {
            b.push(" AND (model_requested = ").bind(v.clone());
            b.push(" OR model_served = ").bind(v.clone()).push(")");
        }
        if let Some(v) = f.status {
            b.push(" AND status = ").bind(v);
        }
        match f.errors {
            Some(true) => {
                b.push(" AND status >= 400");
            }
            Some(false) => {
                b.push(" AND status < 400");
            }
            None => {}
        }
        if let Some(v) = &f.request_id {
            b.push(" AND request_id = ").bind(v.clone());
        }
        if let Some(v) = &f.source {
            b.push(" AND source = ").bind(v.clone());
        }
        if let Some(v) = &f.end_user {
            b.push(" AND end_user = ").bind(v.clone());
        }
        // Tags are stored sorted and comma-separated, and a value holds no comma: the tag is
        // one whole item of the list.
        if let Some(v) = &f.tag {
            b.push(" AND ',' || tags || ',' LIKE ")
                .bind(format!("%,{},%", like_escaped(v)))
                .push(" ESCAPE '\\'");
        }
        // Keyset pagination on (ts, id), the order of every log index: the cursor is the id of
        // the previous page's last row, whose ts the subquery finds by primary key.
        if let Some(v) = f.cursor {
            b.push(" AND (ts, id) < (SELECT ts, id FROM request_logs WHERE id = ")
                .bind(v)
                .push(")");
        }
        b.push(" ORDER BY ts DESC, id DESC LIMIT ").bind(limit + 1);
        let (sql, args) = b.finish();
        let mut items: Vec<LogRecord> = sqlx::query_as_with(&sql, args).fetch_all(self.pool()).await?;
        let next_cursor = if items.len() as i64 > limit {
            items.truncate(limit as usize);
            items.last().map(|r| r.id)
        } else {
            None
        };
        Ok(LogPage { items, next_cursor })
    }

    async fn prune_logs_batch(&self, cutoff_ms: i64, limit: i64) -> StoreResult<u64> {
        // Workspace by workspace, oldest first, through the (workspace_id, ts, id) index: an index
        // on ts alone would cost every log's insert for the sake of this hourly task. The next
        // workspace with logs is one seek of that index.
        let mut after = i64::MIN;
        while let Some(workspace) = sqlx::query_scalar::<_, Option<i64>>(
            "SELECT MIN(workspace_id) FROM request_logs WHERE workspace_id > $1",
        )
        .bind(after)
        .fetch_one(self.pool())
        .await?
        {
            let r = sqlx::query(
                "DELETE FROM request_logs WHERE id IN
                   (SELECT id FROM request_logs WHERE workspace_id = $1 AND ts < $2 ORDER BY ts LIMIT $3)",
            )
            .bind(workspace)
            .bind(cutoff_ms)
            .bind(limit)
            .execute(self.pool())
            .await?;
            if r.rows_affected() > 0 {
                return Ok(r.rows_affected());
            }
            after = workspace;
        }
        let row = match self.backend() {
            Backend::Postgres => "ctid",
            Backend::Sqlite => "rowid",
        };
        // An hour or a day goes once all of it is before the cutoff (a day boundary for the
        // daily rollups to stay exact: see `request_log::start_retention`).
        let rollups = [
            ("usage_rollup", "hour_start", HOUR_MS),
            ("usage_rollup_member_hourly", "hour_start", HOUR_MS),
            ("usage_rollup_daily", "day_start", super::DAY_MS),
            ("usage_rollup_member", "day_start", super::DAY_MS),
            ("upstream_rollup", "hour_start", HOUR_MS),
            // A lock's record goes once it ended before the cutoff.
            ("upstream_lock_events", "until_ms", 0),
        ];
        for (table, time, unit_ms) in rollups {
            let r = sqlx::query(&format!(
                "DELETE FROM {table} WHERE {row} IN
                   (SELECT {row} FROM {table} WHERE {time} <= $1 ORDER BY {time} LIMIT $2)"
            ))
            .bind(cutoff_ms.saturating_sub(unit_ms))
            .bind(limit)
            .execute(self.pool())
            .await?;
            if r.rows_affected() > 0 {
                return Ok(r.rows_affected());
            }
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Retention goes workspace by workspace: every log before the cutoff goes, in any
    /// workspace (one with none old in between), in batches of the limit, and nothing newer.
    #[tokio::test]
    async fn retention_prunes_old_logs_of_every_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::connect(&format!("sqlite:{}", dir.path().join("prune.db").display()))
            .await
            .unwrap();
        // (workspace, ts): the cutoff is 50.
        let logs: Vec<LogRecord> = [
            (1, 10),
            (1, 20),
            (1, 100),
            (2, 200),
            (3, 5),
            (5, 30),
            (5, 49),
            (5, 50),
        ]
        .iter()
        .enumerate()
        .map(|(i, &(workspace_id, ts))| LogRecord {
            request_id: format!("r{i}"),
            ts,
            workspace_id,
            ..LogRecord::default()
        })
        .collect();
        store.insert_logs(logs.as_slice()).await.unwrap();
        let batches: Vec<u64> = {
            let mut v = Vec::new();
            loop {
                let n = store.prune_logs_batch(50, 1).await.unwrap();
                if n == 0 {
                    break v;
                }
                v.push(n);
            }
        };
        assert_eq!(batches, [1, 1, 1, 1, 1]);
        let left: Vec<(i64, i64)> = sqlx::query_as("SELECT workspace_id, ts FROM request_logs ORDER BY id")
            .fetch_all(store.pool())
            .await
            .unwrap();
        assert_eq!(left, [(1, 100), (2, 200), (5, 50)]);
    }

    #[test]
    fn a_log_row_binds_one_value_per_column() {
        assert_eq!(COLUMNS.split(',').count(), LOG_VALUES);
    }
}
