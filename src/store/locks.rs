//! Learned locks on upstream credentials (`upstream_locks`) and their banned marks
//! (`upstream_health`), shared by every gateway on the database. A write only ever extends a
//! lock (kRouter; groot ADR 0008 "extend-only rests").

use super::{Store, StoreResult};

/// The stored target of a lock on the whole credential.
pub const WHOLE_CREDENTIAL_TARGET: &str = "*";
/// The stored target of a lock on every `:free` model of a credential (they share one allowance).
pub const ALL_FREE_TARGET: &str = "*:free";

/// A lock as stored: the credential, what it parks (an upstream model or one of the targets
/// above), its end and the classification rule that wrote it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct LockRow {
    /// The credential.
    pub credential_id: i64,
    /// An upstream model, [`WHOLE_CREDENTIAL_TARGET`] or [`ALL_FREE_TARGET`].
    pub target: String,
    /// End, Unix ms.
    pub until_ms: i64,
    /// The classification rule that wrote it.
    pub rule: String,
}

/// Upstream locks and banned marks.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait LockStore {
    /// The locks still running at `now_ms`.
    async fn running_locks(&self, now_ms: i64) -> StoreResult<Vec<LockRow>>;
    /// The credentials carrying the banned mark.
    async fn banned_credentials(&self) -> StoreResult<Vec<i64>>;
    /// Writes locks, extending and never shortening what another gateway wrote.
    async fn extend_locks(&self, rows: &[LockRow]) -> StoreResult<()>;
    /// Sets a credential's banned mark.
    async fn mark_banned(&self, credential: i64) -> StoreResult<()>;
    /// Deletes every lock and the banned mark of a credential.
    async fn clear_locks(&self, credential: i64) -> StoreResult<()>;
    /// Deletes a credential's per-model locks, keeping the whole-credential and free-allowance
    /// holds and the banned mark.
    async fn clear_model_locks(&self, credential: i64) -> StoreResult<()>;
}

impl LockStore for Store {
    async fn running_locks(&self, now_ms: i64) -> StoreResult<Vec<LockRow>> {
        Ok(sqlx::query_as(
            "SELECT credential_id, target, until_ms, rule FROM upstream_locks WHERE until_ms > $1",
        )
        .bind(now_ms)
        .fetch_all(self.pool())
        .await?)
    }

    async fn banned_credentials(&self) -> StoreResult<Vec<i64>> {
        Ok(
            sqlx::query_scalar("SELECT credential_id FROM upstream_health WHERE banned = 1")
                .fetch_all(self.pool())
                .await?,
        )
    }

    async fn extend_locks(&self, rows: &[LockRow]) -> StoreResult<()> {
        for r in rows {
            sqlx::query(
                "INSERT INTO upstream_locks (credential_id, target, until_ms, rule) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (credential_id, target) DO UPDATE SET
                   rule = CASE WHEN excluded.until_ms > upstream_locks.until_ms THEN excluded.rule ELSE upstream_locks.rule END,
                   until_ms = CASE WHEN excluded.until_ms > upstream_locks.until_ms THEN excluded.until_ms ELSE upstream_locks.until_ms END",
            )
            .bind(r.credential_id)
            .bind(r.target.as_str())
            .bind(r.until_ms)
            .bind(r.rule.as_str())
            .execute(self.pool())
            .await?;
        }
        Ok(())
    }

    async fn mark_banned(&self, credential: i64) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO upstream_health (credential_id, banned) VALUES ($1, 1)
             ON CONFLICT (credential_id) DO UPDATE SET banned = 1",
        )
        .bind(credential)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn clear_locks(&self, credential: i64) -> StoreResult<()> {
        sqlx::query("DELETE FROM upstream_locks WHERE credential_id = $1")
            .bind(credential)
            .execute(self.pool())
            .await?;
        sqlx::query("DELETE FROM upstream_health WHERE credential_id = $1")
            .bind(credential)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn clear_model_locks(&self, credential: i64) -> StoreResult<()> {
        sqlx::query("DELETE FROM upstream_locks WHERE credential_id = $1 AND target NOT IN ($2, $3)")
            .bind(credential)
            .bind(WHOLE_CREDENTIAL_TARGET)
            .bind(ALL_FREE_TARGET)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}
