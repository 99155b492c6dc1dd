//! The key breaker's shared state: trips, blocks and bans (`breaker_state`), the history of trips
//! (`breaker_trips`) and every gateway's per-second outcomes (`breaker_buckets`) of the keys that
//! have failed (src/breaker/mod.rs, "shared from the first failure").

use super::{NARROW_STATEMENT_ROWS, SqlBuilder, Store, StoreResult, statements};

/// A key's standing as stored: lifetime trips, block end and ban.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct BreakerStateRow {
    /// The key.
    pub key_id: i64,
    /// Trips so far (lifetime).
    pub trips: i64,
    /// Blocked until, Unix ms.
    pub blocked_until: Option<i64>,
    /// 1 banned for good, 0 not.
    pub banned: i64,
}

/// One trip of a key, as stored in its history.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct TripRow {
    /// Which trip of the key (1-based).
    pub trip: i64,
    /// When, Unix ms.
    pub at: i64,
    /// Requests in the window.
    pub requests: i64,
    /// Failures in the window.
    pub failures: i64,
    /// Blocked until, Unix ms (none when banned).
    pub blocked_until: Option<i64>,
    /// 1 if this trip banned the key.
    pub banned: i64,
}

/// Outcomes of one key in one second, of the window its `trip`-th trip began (0: before any).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketCounts {
    /// The key's trips when the requests were admitted: the window they belong to.
    pub trip: u32,
    /// Requests.
    pub total: u32,
    /// Failures.
    pub failed: u32,
}

impl BucketCounts {
    /// Adds `other`, of the same key and second. A trip starts a fresh window (DESIGN.md §11):
    /// outcomes of an older window than the newest one seen are dropped, never added to it. The
    /// store's upsert does the same ([`BreakerStore::add_breaker_buckets`]).
    pub fn merge(&mut self, other: BucketCounts) {
        if other.trip > self.trip {
            *self = other;
        } else if other.trip == self.trip {
            self.total = self.total.saturating_add(other.total);
            self.failed = self.failed.saturating_add(other.failed);
        }
    }
}

/// Outcomes of one key in one second: ((key, second), counts).
pub type BucketDelta = ((i64, i64), BucketCounts);

/// A key's shared outcomes in a window: (key, the trip that began the window, requests, failures).
pub type WindowRow = (i64, i64, i64, i64);

/// The breaker's state, shared by every gateway on the database.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait BreakerStore {
    /// Every key's stored standing.
    async fn breaker_states(&self) -> StoreResult<Vec<BreakerStateRow>>;
    /// Adds per-second outcomes to the shared window: a second holds the outcomes of one window,
    /// the newest ([`BucketCounts::merge`]).
    async fn add_breaker_buckets(&self, batch: &[BucketDelta]) -> StoreResult<()>;
    /// Every gateway's requests and failures of `keys` in the seconds after `after_second`, by
    /// the window (trip) they belong to; keys without any left out.
    async fn breaker_window(&self, keys: &[i64], after_second: i64) -> StoreResult<Vec<WindowRow>>;
    /// The keys with a failure shared in the seconds after `after_second`, by any gateway.
    async fn breaker_failing_after(&self, after_second: i64) -> StoreResult<Vec<i64>>;
    /// Records trip `t` of `key_id`: its standing (only if it advances the stored one and the key
    /// is not banned: no trip after the ban), its history row (once per trip, for any trip up to
    /// the stored standing, whatever order the trips' writes land in), and an empty shared
    /// window up to the trip. Whether this call advanced the standing (false: another gateway,
    /// or a later trip's write, got there first).
    async fn record_trip(&self, key_id: i64, t: &TripRow) -> StoreResult<bool>;
    /// A key's trips, oldest first.
    async fn trips_of(&self, key_id: i64) -> StoreResult<Vec<TripRow>>;
}

impl BreakerStore for Store {
    async fn breaker_states(&self) -> StoreResult<Vec<BreakerStateRow>> {
        Ok(
            sqlx::query_as("SELECT key_id, trips, blocked_until, banned FROM breaker_state")
                .fetch_all(self.pool())
                .await?,
        )
    }

    async fn add_breaker_buckets(&self, batch: &[BucketDelta]) -> StoreResult<()> {
        // One transaction: a flush that fails is retried whole, so no part may have been added.
        let mut tx = self.pool().begin().await?;
        for chunk in statements(batch, NARROW_STATEMENT_ROWS) {
            let mut b = SqlBuilder::new(
                self,
                "INSERT INTO breaker_buckets (key_id, second, trip, total, failed) VALUES ",
            );
            for (i, ((key, second), n)) in chunk.iter().enumerate() {
                b.push(if i == 0 { "(" } else { ", (" });
                b.bind(*key).push(", ").bind(*second).push(", ");
                b.bind(i64::from(n.trip)).push(", ");
                b.bind(i64::from(n.total))
                    .push(", ")
                    .bind(i64::from(n.failed))
                    .push(")");
            }
            // BucketCounts::merge: a newer window replaces the second's outcomes, an older one
            // is dropped, the same one adds.
            b.push(
                " ON CONFLICT (key_id, second) DO UPDATE SET \
                 total = CASE WHEN excluded.trip > breaker_buckets.trip THEN excluded.total \
                   WHEN excluded.trip = breaker_buckets.trip THEN breaker_buckets.total + excluded.total \
                   ELSE breaker_buckets.total END, \
                 failed = CASE WHEN excluded.trip > breaker_buckets.trip THEN excluded.failed \
                   WHEN excluded.trip = breaker_buckets.trip THEN breaker_buckets.failed + excluded.failed \
                   ELSE breaker_buckets.failed END, \
                 trip = CASE WHEN excluded.trip > breaker_buckets.trip THEN excluded.trip \
                   ELSE breaker_buckets.trip END",
            );
            let (sql, args) = b.finish();
            sqlx::query_with(&sql, args).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn breaker_window(&self, keys: &[i64], after_second: i64) -> StoreResult<Vec<WindowRow>> {
        let mut rows = Vec::with_capacity(keys.len());
        // In chunks: one statement's placeholders are bounded (32,766 on SQLite), the keys that
        // answered in a flush interval are not.
        for chunk in statements(keys, NARROW_STATEMENT_ROWS) {
            let mut b = SqlBuilder::new(
                self,
                "SELECT key_id, trip, CAST(SUM(total) AS BIGINT), CAST(SUM(failed) AS BIGINT) FROM breaker_buckets WHERE second > ",
            );
            b.bind(after_second).push(" AND key_id IN (");
            for (i, k) in chunk.iter().enumerate() {
                if i > 0 {
                    b.push(", ");
                }
                b.bind(*k);
            }
            b.push(") GROUP BY key_id, trip");
            let (sql, args) = b.finish();
            let found: Vec<WindowRow> = sqlx::query_as_with(&sql, args).fetch_all(self.pool()).await?;
            rows.extend(found);
        }
        Ok(rows)
    }

    async fn breaker_failing_after(&self, after_second: i64) -> StoreResult<Vec<i64>> {
        Ok(
            sqlx::query_scalar(
                "SELECT DISTINCT key_id FROM breaker_buckets WHERE second > $1 AND failed > 0",
            )
            .bind(after_second)
            .fetch_all(self.pool())
            .await?,
        )
    }

    async fn record_trip(&self, key_id: i64, t: &TripRow) -> StoreResult<bool> {
        let advanced = sqlx::query(
            "INSERT INTO breaker_state (key_id, trips, blocked_until, banned) VALUES ($1, $2, $3, $4)
             ON CONFLICT (key_id) DO UPDATE SET trips = excluded.trips, blocked_until = excluded.blocked_until,
               banned = excluded.banned
             WHERE breaker_state.trips < excluded.trips AND breaker_state.banned = 0",
        )
        .bind(key_id)
        .bind(t.trip)
        .bind(t.blocked_until)
        .bind(t.banned)
        .execute(self.pool())
        .await?
        .rows_affected();
        sqlx::query("DELETE FROM breaker_buckets WHERE key_id = $1 AND second <= $2")
            .bind(key_id)
            .bind(t.at.div_euclid(1000))
            .execute(self.pool())
            .await?;
        // The history row is written whether or not this write advanced the state: each trip
        // is persisted by a task of its own, so trip 4's state may land before trip 3's. Once
        // per trip (the unique index), and only for a trip the state has reached (none after
        // the ban).
        sqlx::query(
            "INSERT INTO breaker_trips (key_id, trip, at, requests, failures, blocked_until, banned)
             SELECT $1, $2, $3, $4, $5, $6, $7
             WHERE EXISTS (SELECT 1 FROM breaker_state WHERE key_id = $1 AND trips >= $2)
             ON CONFLICT (key_id, trip) DO NOTHING",
        )
        .bind(key_id)
        .bind(t.trip)
        .bind(t.at)
        .bind(t.requests)
        .bind(t.failures)
        .bind(t.blocked_until)
        .bind(t.banned)
        .execute(self.pool())
        .await?;
        Ok(advanced != 0)
    }

    async fn trips_of(&self, key_id: i64) -> StoreResult<Vec<TripRow>> {
        Ok(sqlx::query_as(
            "SELECT trip, at, requests, failures, blocked_until, banned FROM breaker_trips WHERE key_id = $1 ORDER BY trip",
        )
        .bind(key_id)
        .fetch_all(self.pool())
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second holds the outcomes of one window, the newest: the store's upsert and
    /// `BucketCounts::merge` agree on each step.
    #[tokio::test]
    async fn a_second_holds_the_outcomes_of_its_newest_window() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("breaker.db").display());
        let store = Store::connect(&url).await.unwrap();
        let n = |trip, total, failed| BucketCounts { trip, total, failed };
        // (added, the second's counts after it)
        let steps = [
            (n(1, 5, 5), n(1, 5, 5)),
            (n(0, 3, 3), n(1, 5, 5)),
            (n(1, 1, 0), n(1, 6, 5)),
            (n(2, 2, 1), n(2, 2, 1)),
            (n(1, 9, 9), n(2, 2, 1)),
        ];
        let mut merged: Option<BucketCounts> = None;
        for (added, want) in steps {
            store.add_breaker_buckets(&[((7, 100), added)]).await.unwrap();
            let rows = store.breaker_window(&[7], 99).await.unwrap();
            let stored = (
                7,
                i64::from(want.trip),
                i64::from(want.total),
                i64::from(want.failed),
            );
            assert_eq!(rows, [stored], "stored, after adding {added:?}");
            match merged.as_mut() {
                Some(m) => m.merge(added),
                None => merged = Some(added),
            }
            assert_eq!(merged, Some(want), "merged, after adding {added:?}");
        }
    }

    /// A flush interval in which more keys answered than one statement may name (SQLite allows
    /// 32,766 placeholders): the buckets are added and the window read back whole.
    #[tokio::test]
    async fn a_flush_of_more_keys_than_one_statement_may_name() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("breaker.db").display());
        let store = Store::connect(&url).await.unwrap();
        let keys: Vec<i64> = (1..=40_000).collect();
        let n = BucketCounts {
            trip: 0,
            total: 2,
            failed: 1,
        };
        let batch: Vec<BucketDelta> = keys.iter().map(|k| ((*k, 100), n)).collect();
        store.add_breaker_buckets(&batch).await.unwrap();
        let rows = store.breaker_window(&keys, 99).await.unwrap();
        assert_eq!(rows.len(), keys.len());
        assert!(
            rows.iter()
                .all(|&(_, trip, total, failed)| trip == 0 && total == 2 && failed == 1)
        );
    }

    /// Trips persisted out of order (each trip's write runs in a task of its own, retried while
    /// the store is slow): every trip keeps its history row, once, oldest first; a trip after
    /// the ban is not recorded; a second gateway recording the same trip adds nothing.
    #[tokio::test]
    async fn trips_written_out_of_order_keep_their_history() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("breaker.db").display());
        let store = Store::connect(&url).await.unwrap();
        let trip = |trip: i64, banned: bool| TripRow {
            trip,
            at: trip * 1_000,
            requests: 100,
            failures: 100,
            blocked_until: (!banned).then_some(trip * 1_000 + 30_000),
            banned: i64::from(banned),
        };
        for (n, banned) in [
            (1, false),
            (2, false),
            (4, false),
            (3, false),
            (3, false),
            (5, true),
            (6, true),
        ] {
            store.record_trip(7, &trip(n, banned)).await.unwrap();
        }
        let trips: Vec<i64> = store.trips_of(7).await.unwrap().iter().map(|t| t.trip).collect();
        assert_eq!(trips, [1, 2, 3, 4, 5]);
    }
}
