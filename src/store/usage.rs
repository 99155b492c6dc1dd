//! Shared counters: the upstream credentials' own-limit counts (`upstream_counters`). Each
//! gateway adds what it counted at every flush and reads back every gateway's totals.

use super::{SqlBuilder, Store, StoreResult};

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
        for chunk in batch.chunks(500) {
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
