//! Shared counters: the quota counters (`usage_counters`) and the upstream credentials'
//! own-limit counts (`upstream_counters`). Each gateway adds what it counted at every flush and
//! reads back every gateway's totals.

use super::{Backend, NARROW_STATEMENT_ROWS, SqlBuilder, Store, StoreResult, statements};

/// A quota counter's identity as stored: subject, metric, window and window start.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UsageCounterRow {
    /// Subject kind (`apikey`, `member`, `dept`, `ws`).
    pub subject: &'static str,
    /// Subject id.
    pub subject_id: i64,
    /// Metric name.
    pub metric: &'static str,
    /// Window name.
    pub time_window: String,
    /// Window start, Unix seconds (0 for total).
    pub window_start: i64,
}

/// The quota counters.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait UsageStore {
    /// The stored total of a counter, if it has a row.
    async fn usage_counter(&self, key: &UsageCounterRow) -> StoreResult<Option<i64>>;
    /// Adds every nonzero delta of `batch` (each in `0..=i64::MAX`) in one transaction, then
    /// reads back what the zero deltas' counters hold now, and returns every total learned
    /// (the upserts' first; a read back is later, so as new or newer).
    ///
    /// On SQLite, and on Postgres without `since`, each zero delta's counter is read by its
    /// key (0 without a row). On Postgres with `since` (the horizon the last call returned),
    /// every counter changed since is read instead, any subject's: those changed by
    /// transactions not yet complete when that horizon was taken (`changed_tx >= since`), so a
    /// transaction that committed after an earlier one with a higher id is not missed. An idle
    /// counter then costs no read at all. The horizon returned (Postgres only) is the xmin of
    /// a snapshot taken before anything is read (the read stops at its xmax: later ones are
    /// read by the next call); one below `since` (another database, restored from a backup)
    /// falls back to reading by key.
    async fn add_usage(&self, batch: &[(UsageCounterRow, i64)], since: Option<i64>) -> StoreResult<ReadBack>;
    /// Every subject's stored total of one metric in one window: (subject id, used).
    async fn usage_in_window(
        &self,
        subject: &str,
        metric: &str,
        time_window: &str,
        window_start: i64,
    ) -> StoreResult<Vec<(i64, i64)>>;
    /// Raises a counter to at least `used` (a budget moved from a key to its member keeps what
    /// the key had used); every gateway reads it back at its next flush.
    async fn raise_usage(&self, key: &UsageCounterRow, used: i64) -> StoreResult<()>;
}

/// A counter's total as the store returns it: (subject, subject id, metric, window, window
/// start, used).
pub type UsageTotal = (String, i64, String, String, i64, i64);

/// What [`UsageStore::add_usage`] learned.
#[derive(Debug)]
pub struct ReadBack {
    /// Every total written or read back; a later entry of a counter is newer.
    pub totals: Vec<UsageTotal>,
    /// Where the next call reads back from (Postgres).
    pub horizon: Option<i64>,
}

impl UsageStore for Store {
    async fn raise_usage(&self, key: &UsageCounterRow, used: i64) -> StoreResult<()> {
        let changed = match self.backend() {
            Backend::Postgres => ", changed_tx = txid_current()",
            Backend::Sqlite => "",
        };
        let sql = format!(
            "INSERT INTO usage_counters (subject, subject_id, metric, time_window, window_start, used)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (subject, subject_id, metric, time_window, window_start) DO UPDATE SET used = CASE
               WHEN usage_counters.used < excluded.used THEN excluded.used ELSE usage_counters.used END{changed}"
        );
        sqlx::query(&sql)
            .bind(key.subject)
            .bind(key.subject_id)
            .bind(key.metric)
            .bind(key.time_window.as_str())
            .bind(key.window_start)
            .bind(used.max(0))
            .execute(self.pool())
            .await?;
        Ok(())
    }
    async fn usage_counter(&self, key: &UsageCounterRow) -> StoreResult<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT used FROM usage_counters WHERE subject = $1 AND subject_id = $2 AND metric = $3
               AND time_window = $4 AND window_start = $5",
        )
        .bind(key.subject)
        .bind(key.subject_id)
        .bind(key.metric)
        .bind(key.time_window.as_str())
        .bind(key.window_start)
        .fetch_optional(self.pool())
        .await?)
    }

    async fn add_usage(&self, batch: &[(UsageCounterRow, i64)], since: Option<i64>) -> StoreResult<ReadBack> {
        // Taken before anything is read: whatever commits after the reads below was not yet
        // complete then (its id is xmin or more), so the next read back, from xmin, sees it. No
        // transaction had an id of xmax or more yet: the read below stops there.
        let snapshot: Option<(i64, i64)> = match self.backend() {
            Backend::Postgres => Some(
                sqlx::query_as(
                    "SELECT txid_snapshot_xmin(s), txid_snapshot_xmax(s) FROM txid_current_snapshot() AS s",
                )
                .fetch_one(self.pool())
                .await?,
            ),
            Backend::Sqlite => None,
        };
        let horizon = snapshot.map(|(xmin, _)| xmin);
        // A zero delta only reads: an idle counter costs a shared read at most, not a row lock
        // and a write (on every flush of every gateway).
        let (adds, reads): (Vec<_>, Vec<_>) = batch.iter().cloned().partition(|(_, d)| *d != 0);
        let mut totals = Vec::with_capacity(batch.len());
        if !adds.is_empty() {
            let mut tx = self.pool().begin().await?;
            for chunk in statements(&adds, NARROW_STATEMENT_ROWS) {
                totals.extend(upsert_usage(self, &mut tx, chunk).await?);
            }
            tx.commit().await?;
        }
        match (since, snapshot) {
            (Some(since), Some((xmin, xmax))) if xmin >= since => {
                totals.extend(changed_since(self, since, xmax).await?);
            }
            _ => totals.extend(read_usage(self, reads.into_iter().map(|(k, _)| k).collect()).await?),
        }
        Ok(ReadBack { totals, horizon })
    }

    async fn usage_in_window(
        &self,
        subject: &str,
        metric: &str,
        time_window: &str,
        window_start: i64,
    ) -> StoreResult<Vec<(i64, i64)>> {
        Ok(sqlx::query_as(
            "SELECT subject_id, used FROM usage_counters WHERE subject = $1 AND metric = $2
               AND time_window = $3 AND window_start = $4",
        )
        .bind(subject)
        .bind(metric)
        .bind(time_window)
        .bind(window_start)
        .fetch_all(self.pool())
        .await?)
    }
}

/// The stored totals of `keys` (a counter without a row has used 0): one statement per window
/// and metric of a subject kind and up to 500 subject ids.
async fn read_usage(store: &Store, mut keys: Vec<UsageCounterRow>) -> StoreResult<Vec<UsageTotal>> {
    keys.sort_by(|a, b| {
        (a.subject, a.metric, &a.time_window, a.window_start, a.subject_id).cmp(&(
            b.subject,
            b.metric,
            &b.time_window,
            b.window_start,
            b.subject_id,
        ))
    });
    let same_window = |a: &UsageCounterRow, b: &UsageCounterRow| {
        (a.subject, a.metric, &a.time_window, a.window_start)
            == (b.subject, b.metric, &b.time_window, b.window_start)
    };
    let mut totals = Vec::with_capacity(keys.len());
    for group in keys.chunk_by(same_window) {
        let k = &group[0];
        for ids in statements(group, NARROW_STATEMENT_ROWS) {
            // One lookup of the whole primary key per subject id (a correlated subquery over
            // a VALUES list): the plan cannot depend on the table's statistics. A plain
            // `subject_id IN (...)` let Postgres, with statistics taken while the table was
            // small, scan every counter of the window for each statement (1.3 s each at
            // 100,000 subjects, bench/replicas.py).
            let mut b = SqlBuilder::new(
                store,
                "SELECT v.column1, COALESCE((SELECT c.used FROM usage_counters c WHERE c.subject = ",
            );
            b.bind(k.subject)
                .push(" AND c.subject_id = v.column1 AND c.metric = ")
                .bind(k.metric);
            b.push(" AND c.time_window = ")
                .bind(k.time_window.as_str())
                .push(" AND c.window_start = ")
                .bind(k.window_start)
                .push("), 0) FROM (VALUES ");
            for (i, id) in ids.iter().enumerate() {
                b.push(if i > 0 { ", (" } else { "(" });
                b.bind(id.subject_id).push(")");
            }
            b.push(") AS v");
            let (sql, args) = b.finish();
            // One row per id: the id and its total (0 without a row).
            let stored: Vec<(i64, i64)> = sqlx::query_as_with(&sql, args).fetch_all(store.pool()).await?;
            totals.extend(stored.into_iter().map(|(id, used)| {
                (
                    k.subject.to_owned(),
                    id,
                    k.metric.to_owned(),
                    k.time_window.clone(),
                    k.window_start,
                    used,
                )
            }));
        }
    }
    Ok(totals)
}

/// Every counter changed by a transaction with an id in `since..below` (Postgres).
async fn changed_since(store: &Store, since: i64, below: i64) -> StoreResult<Vec<UsageTotal>> {
    // Bounded on both sides, so that the plan is an index scan whatever the statistics: with a
    // lower bound alone, and `changed_tx` not analyzed since the table grew, Postgres guessed a
    // third of the table and read all of it at every flush (bench/replicas.py: 800,000 rows a
    // second at 100,000 idle counters).
    Ok(sqlx::query_as(
        "SELECT subject, subject_id, metric, time_window, window_start, used FROM usage_counters
          WHERE changed_tx >= $1 AND changed_tx < $2",
    )
    .bind(since)
    .bind(below)
    .fetch_all(store.pool())
    .await?)
}

async fn upsert_usage(
    store: &Store,
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    chunk: &[(UsageCounterRow, i64)],
) -> StoreResult<Vec<UsageTotal>> {
    let mut b = SqlBuilder::new(
        store,
        "INSERT INTO usage_counters (subject, subject_id, metric, time_window, window_start, used) VALUES ",
    );
    for (i, (k, d)) in chunk.iter().enumerate() {
        b.push(if i == 0 { "(" } else { ", (" });
        b.bind(k.subject)
            .push(", ")
            .bind(k.subject_id)
            .push(", ")
            .bind(k.metric);
        b.push(", ")
            .bind(k.time_window.as_str())
            .push(", ")
            .bind(k.window_start)
            .push(", ")
            .bind(*d)
            .push(")");
    }
    // Saturating addition, the same on both backends: with `excluded.used` in 0..=i64::MAX the
    // subtraction cannot overflow, and a total past i64::MAX stays at i64::MAX.
    b.push(
        " ON CONFLICT (subject, subject_id, metric, time_window, window_start) \
         DO UPDATE SET used = CASE \
           WHEN usage_counters.used > 9223372036854775807 - excluded.used THEN 9223372036854775807 \
           ELSE usage_counters.used + excluded.used END",
    );
    // A new row's `changed_tx` is its column default, the same.
    if store.backend() == Backend::Postgres {
        b.push(", changed_tx = txid_current()");
    }
    b.push(" RETURNING subject, subject_id, metric, time_window, window_start, used");
    let (sql, args) = b.finish();
    Ok(sqlx::query_as_with(&sql, args).fetch_all(&mut **tx).await?)
}

/// One own-limit count: (credential, counter name, window start in Unix ms, used).
pub type OwnLimitCount<C> = (i64, C, i64, i64);

/// The upstream credentials' own-limit counts.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait OwnLimitStore {
    /// Adds `batch` (credential, counter, window start, delta) to the stored counts in one
    /// transaction; the sum saturates at `i64::MAX` on both backends.
    async fn add_own_limit_counts(&self, batch: &[OwnLimitCount<&str>]) -> StoreResult<()>;
    /// Every gateway's totals of the windows starting at `since_ms` or later.
    async fn own_limit_totals(&self, since_ms: i64) -> StoreResult<Vec<OwnLimitCount<String>>>;
    /// Deletes the counts of windows that started before `minute_ms`, except those of
    /// `day_counter`, whose windows are days: deleted only when they started before `day_ms`.
    async fn delete_ended_own_limit_counts(
        &self,
        minute_ms: i64,
        day_counter: &str,
        day_ms: i64,
    ) -> StoreResult<()>;
}

impl OwnLimitStore for Store {
    async fn add_own_limit_counts(&self, batch: &[OwnLimitCount<&str>]) -> StoreResult<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool().begin().await?;
        for chunk in statements(batch, NARROW_STATEMENT_ROWS) {
            let mut b = SqlBuilder::new(
                self,
                "INSERT INTO upstream_counters (credential_id, counter, window_start, used) VALUES ",
            );
            for (i, (id, count, start, delta)) in chunk.iter().enumerate() {
                b.push(if i == 0 { "(" } else { ", (" });
                b.bind(*id)
                    .push(", ")
                    .bind(*count)
                    .push(", ")
                    .bind(*start)
                    .push(", ")
                    .bind(*delta)
                    .push(")");
            }
            b.push(
                " ON CONFLICT (credential_id, counter, window_start) DO UPDATE SET used = CASE \
                   WHEN upstream_counters.used > 9223372036854775807 - excluded.used THEN 9223372036854775807 \
                   ELSE upstream_counters.used + excluded.used END",
            );
            let (sql, args) = b.finish();
            sqlx::query_with(&sql, args).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn own_limit_totals(&self, since_ms: i64) -> StoreResult<Vec<OwnLimitCount<String>>> {
        Ok(sqlx::query_as(
            "SELECT credential_id, counter, window_start, used FROM upstream_counters WHERE window_start >= $1",
        )
        .bind(since_ms)
        .fetch_all(self.pool())
        .await?)
    }

    async fn delete_ended_own_limit_counts(
        &self,
        minute_ms: i64,
        day_counter: &str,
        day_ms: i64,
    ) -> StoreResult<()> {
        sqlx::query(
            "DELETE FROM upstream_counters WHERE window_start < $1 AND (counter <> $2 OR window_start < $3)",
        )
        .bind(minute_ms)
        .bind(day_counter)
        .bind(day_ms)
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(subject_id: i64, time_window: &str) -> UsageCounterRow {
        UsageCounterRow {
            subject: "apikey",
            subject_id,
            metric: "requests",
            time_window: time_window.to_owned(),
            window_start: if time_window == "total" { 0 } else { 1_800_000_000 },
        }
    }

    /// A flush's zero deltas read the stored totals (0 without a row) and create no row; the
    /// others add, in one batch, each total coming back for its own counter.
    #[tokio::test]
    async fn a_zero_delta_reads_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("usage.db").display());
        let store = Store::connect(&url).await.unwrap();
        let seeded: Vec<_> = (1..=150).map(|id| (row(id, "day"), id)).collect();
        store.add_usage(&seeded, None).await.unwrap();

        // Ids 1..=150 read (0) or add (1) alternately; 151..=160 have no row and read only.
        let mut batch: Vec<_> = (1..=160)
            .map(|id| (row(id, "day"), i64::from(id % 2 == 0)))
            .collect();
        batch.push((row(1, "total"), 0));
        batch.push((row(2, "total"), 5));
        let totals = store.add_usage(&batch, None).await.unwrap().totals;
        assert_eq!(totals.len(), batch.len(), "one total per counter");
        for (key, delta) in &batch {
            let stored = if key.time_window == "total" || key.subject_id > 150 {
                0
            } else {
                key.subject_id
            };
            let total = totals
                .iter()
                .find(|t| t.1 == key.subject_id && t.3 == key.time_window)
                .map(|t| t.5);
            assert_eq!(total, Some(stored + delta), "{key:?}");
            let row = store.usage_counter(key).await.unwrap();
            assert_eq!(
                row.is_some(),
                stored + delta > 0 || key.subject_id <= 150 && key.time_window == "day",
                "{key:?}"
            );
        }
    }
}
