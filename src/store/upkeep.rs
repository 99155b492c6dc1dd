//! The shared counters' upkeep: rows of windows that ended long ago are deleted, in bounded
//! batches, so `breaker_buckets` and `usage_counters` hold what is live and not every second
//! and window since the first request.

use super::{Backend, Store, StoreResult};

/// Rows deleted per statement: short statements that never hold the flushes up for long.
const BATCH: i64 = 5_000;

/// How long a quota counter's row outlives the longest its window can be (a DST day is 25 h,
/// a month 31 days and an hour): a gateway still holding the ended counter, or whose clock is
/// behind, never finds it gone while the window may still be running.
const COUNTER_GRACE_SECS: i64 = 3_600;

/// The longest each window can last, in seconds, by its stored name; `<N>minutes` divides a
/// day, so it lasts at most one. `total` never ends and is never deleted.
const WINDOW_LONGEST: &str = "CASE time_window WHEN 'minute' THEN 60 WHEN 'day' THEN 90000 \
     WHEN 'week' THEN 608400 WHEN 'month' THEN 2682000 ELSE 86400 END";

impl Store {
    /// Deletes the breaker buckets older than `buckets_kept_secs` (how long the breaker needs
    /// them: `breaker::BUCKETS_KEPT_SECS`) and the quota counters of windows that ended more than
    /// an hour ago, at `now_s` (Unix seconds), batch by batch. Returns how many rows of each went.
    pub async fn delete_ended_counts(&self, now_s: i64, buckets_kept_secs: i64) -> StoreResult<(u64, u64)> {
        let row = match self.backend() {
            Backend::Postgres => "ctid",
            Backend::Sqlite => "rowid",
        };
        let buckets = format!(
            "DELETE FROM breaker_buckets WHERE {row} IN
               (SELECT {row} FROM breaker_buckets WHERE second < $1 LIMIT $2)"
        );
        let counters = format!(
            "DELETE FROM usage_counters WHERE {row} IN
               (SELECT {row} FROM usage_counters WHERE time_window <> 'total'
                  AND window_start < $1 - {WINDOW_LONGEST} LIMIT $2)"
        );
        let mut gone = (0, 0);
        for (sql, before, count) in [
            (&buckets, now_s - buckets_kept_secs, &mut gone.0),
            (&counters, now_s - COUNTER_GRACE_SECS, &mut gone.1),
        ] {
            loop {
                let n = sqlx::query(sql)
                    .bind(before)
                    .bind(BATCH)
                    .execute(self.pool())
                    .await?
                    .rows_affected();
                *count += n;
                if n < BATCH as u64 {
                    break;
                }
            }
        }
        Ok(gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{BreakerStore, UsageCounterRow, UsageStore};

    fn counter(time_window: &str, window_start: i64) -> (UsageCounterRow, i64) {
        let row = UsageCounterRow {
            subject: "apikey",
            subject_id: 1,
            metric: "requests",
            time_window: time_window.to_owned(),
            window_start,
        };
        (row, 1)
    }

    /// Each window's counter goes only once the longest that window can last and an hour have
    /// passed since it started; `total` stays; breaker buckets go two breaker windows after
    /// their second.
    #[tokio::test]
    async fn only_long_ended_windows_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("upkeep.db").display());
        let store = Store::connect(&url).await.unwrap();
        let now = 1_800_000_000;
        let buckets_kept = 120;
        // (window, started this long before now, deleted)
        let table = [
            ("minute", 60 + 3_600, false),
            ("minute", 60 + 3_601, true),
            ("5minutes", 86_400 + 3_600, false),
            ("5minutes", 86_400 + 3_601, true),
            ("day", 90_000 + 3_600, false),
            ("day", 90_000 + 3_601, true),
            ("week", 608_400 + 3_600, false),
            ("week", 608_400 + 3_601, true),
            ("month", 2_682_000 + 3_600, false),
            ("month", 2_682_000 + 3_601, true),
        ];
        let mut batch: Vec<_> = table.iter().map(|(w, ago, _)| counter(w, now - ago)).collect();
        batch.push(counter("total", 0));
        store.add_usage(&batch, None).await.unwrap();
        let buckets: Vec<_> = (0..3)
            .map(|i| {
                let n = crate::store::BucketCounts {
                    trip: 0,
                    total: 1,
                    failed: 0,
                };
                ((1, now - buckets_kept - 1 + i), n)
            })
            .collect();
        store.add_breaker_buckets(&buckets).await.unwrap();

        assert_eq!(
            store.delete_ended_counts(now, buckets_kept).await.unwrap(),
            (1, 5)
        );
        for (w, ago, deleted) in table {
            let (row, _) = counter(w, now - ago);
            let kept = store.usage_counter(&row).await.unwrap().is_some();
            assert_eq!(kept, !deleted, "{w} started {ago} s ago");
        }
        assert!(
            store
                .usage_counter(&counter("total", 0).0)
                .await
                .unwrap()
                .is_some()
        );
        let window = store.breaker_window(&[1], 0).await.unwrap();
        assert_eq!(
            window,
            vec![(1, 0, 2, 0)],
            "the two buckets within the kept time stay"
        );
        assert_eq!(
            store.delete_ended_counts(now, buckets_kept).await.unwrap(),
            (0, 0)
        );
    }
}
