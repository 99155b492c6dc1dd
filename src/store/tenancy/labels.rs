//! Tag values and end users (issue 25 item 6): the row id each one gets in its workspace is the
//! subject id of its quota counters and policies. Rows are made on first sight, under the caps.

use super::super::{Store, StoreResult};

/// A tag value as stored (`tag_value` `*`: every value of the key, a policy's target).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct TagValueRow {
    /// Row id: the subject id.
    pub id: i64,
    /// Workspace.
    pub workspace_id: i64,
    /// The tag's key.
    pub tag_key: String,
    /// The value.
    pub tag_value: String,
}

/// An end user as stored.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct EndUserRow {
    /// Row id: the subject id.
    pub id: i64,
    /// Workspace.
    pub workspace_id: i64,
    /// The id the client sent.
    pub end_user: String,
}

/// Which cap a new tag value or end user would pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverCap {
    /// A new tag key past `max_tag_keys`.
    TagKeys,
    /// A new value of a key past `max_tag_values`.
    TagValues,
    /// A new end user past `max_end_users`.
    EndUsers,
}

/// The caps on what a workspace may have (none: no cap, for what an admin names). A cap of 0
/// means the caller knows it is reached: a new one is refused without counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LabelCaps {
    /// Distinct tag keys.
    pub tag_keys: i64,
    /// Distinct values per tag key.
    pub tag_values: i64,
    /// Distinct end users.
    pub end_users: i64,
}

/// Tag values and end users.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait LabelStore {
    /// The id of tag `key=value` in `ws`, made if new and within `caps`.
    async fn tag_value_id(
        &self,
        ws: i64,
        key: &str,
        value: &str,
        caps: Option<LabelCaps>,
        now: i64,
    ) -> StoreResult<Result<i64, OverCap>>;
    /// The id of end user `end_user` in `ws`, made if new and within `caps`.
    async fn end_user_id(
        &self,
        ws: i64,
        end_user: &str,
        caps: Option<LabelCaps>,
        now: i64,
    ) -> StoreResult<Result<i64, OverCap>>;
    /// The tag values with these ids.
    async fn tag_values_with_ids(&self, ids: &[i64]) -> StoreResult<Vec<TagValueRow>>;
    /// The end users with these ids.
    async fn end_users_with_ids(&self, ids: &[i64]) -> StoreResult<Vec<EndUserRow>>;
}

/// `IN (…)` of `n` placeholders from `$first`.
fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl LabelStore for Store {
    async fn tag_value_id(
        &self,
        ws: i64,
        key: &str,
        value: &str,
        caps: Option<LabelCaps>,
        now: i64,
    ) -> StoreResult<Result<i64, OverCap>> {
        let find = || {
            sqlx::query_scalar::<_, i64>(
                "SELECT id FROM tag_values WHERE workspace_id = $1 AND tag_key = $2 AND tag_value = $3",
            )
            .bind(ws)
            .bind(key)
            .bind(value)
            .fetch_optional(self.pool())
        };
        if let Some(id) = find().await? {
            return Ok(Ok(id));
        }
        // Two gateways may both count under the cap and both add: a cap holds to within the
        // values first seen at the same moment.
        if let Some(caps) = caps {
            if caps.tag_values == 0 {
                return Ok(Err(OverCap::TagValues));
            }
            let values: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM tag_values WHERE workspace_id = $1 AND tag_key = $2 AND tag_value <> '*'",
            )
            .bind(ws)
            .bind(key)
            .fetch_one(self.pool())
            .await?;
            if values >= caps.tag_values {
                return Ok(Err(OverCap::TagValues));
            }
            if values == 0 && caps.tag_keys == 0 {
                return Ok(Err(OverCap::TagKeys));
            }
            if values == 0 {
                let keys: i64 = sqlx::query_scalar(
                    "SELECT COUNT(DISTINCT tag_key) FROM tag_values WHERE workspace_id = $1 AND tag_value <> '*'",
                )
                .bind(ws)
                .fetch_one(self.pool())
                .await?;
                if keys >= caps.tag_keys {
                    return Ok(Err(OverCap::TagKeys));
                }
            }
        }
        sqlx::query(
            "INSERT INTO tag_values (workspace_id, tag_key, tag_value, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (workspace_id, tag_key, tag_value) DO NOTHING",
        )
        .bind(ws)
        .bind(key)
        .bind(value)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(Ok(find().await?.unwrap_or_default()))
    }

    async fn end_user_id(
        &self,
        ws: i64,
        end_user: &str,
        caps: Option<LabelCaps>,
        now: i64,
    ) -> StoreResult<Result<i64, OverCap>> {
        let find = || {
            sqlx::query_scalar::<_, i64>("SELECT id FROM end_users WHERE workspace_id = $1 AND end_user = $2")
                .bind(ws)
                .bind(end_user)
                .fetch_optional(self.pool())
        };
        if let Some(id) = find().await? {
            return Ok(Ok(id));
        }
        if let Some(caps) = caps {
            if caps.end_users == 0 {
                return Ok(Err(OverCap::EndUsers));
            }
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM end_users WHERE workspace_id = $1")
                .bind(ws)
                .fetch_one(self.pool())
                .await?;
            if n >= caps.end_users {
                return Ok(Err(OverCap::EndUsers));
            }
        }
        sqlx::query(
            "INSERT INTO end_users (workspace_id, end_user, created_at) VALUES ($1, $2, $3)
             ON CONFLICT (workspace_id, end_user) DO NOTHING",
        )
        .bind(ws)
        .bind(end_user)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(Ok(find().await?.unwrap_or_default()))
    }

    async fn tag_values_with_ids(&self, ids: &[i64]) -> StoreResult<Vec<TagValueRow>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(500) {
            let sql = format!(
                "SELECT id, workspace_id, tag_key, tag_value FROM tag_values WHERE id IN ({})",
                placeholders(1, chunk.len())
            );
            let mut q = sqlx::query_as::<_, TagValueRow>(&sql);
            for id in chunk {
                q = q.bind(*id);
            }
            out.extend(q.fetch_all(self.pool()).await?);
        }
        Ok(out)
    }

    async fn end_users_with_ids(&self, ids: &[i64]) -> StoreResult<Vec<EndUserRow>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(500) {
            let sql = format!(
                "SELECT id, workspace_id, end_user FROM end_users WHERE id IN ({})",
                placeholders(1, chunk.len())
            );
            let mut q = sqlx::query_as::<_, EndUserRow>(&sql);
            for id in chunk {
                q = q.bind(*id);
            }
            out.extend(q.fetch_all(self.pool()).await?);
        }
        Ok(out)
    }
}
