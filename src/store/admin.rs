//! What the admin API reads and writes beyond the request path's needs: rows addressed by id
//! inside one workspace (an id of another workspace reads as absent, so the API answers 404 and
//! leaks nothing), the audit log, and usage aggregates over the request logs.

use serde::Serialize;

use super::{AuditRow, SqlBuilder, Store, StoreResult};

/// The tables the admin API addresses by id inside a workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// `departments`.
    Departments,
    /// `members`.
    Members,
    /// `api_keys`.
    ApiKeys,
    /// `upstreams`.
    Upstreams,
    /// `models`.
    Models,
    /// `policies`.
    Policies,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Departments => "departments",
            Table::Members => "members",
            Table::ApiKeys => "api_keys",
            Table::Upstreams => "upstreams",
            Table::Models => "models",
            Table::Policies => "policies",
        }
    }
}

/// A change to record in the audit log.
#[derive(Clone, Debug)]
pub struct AuditEntry<'a> {
    /// Workspace.
    pub workspace_id: i64,
    /// The address the change came from.
    pub client_ip: &'a str,
    /// Unix ms.
    pub at: i64,
    /// Who.
    pub actor_id: i64,
    /// Their email.
    pub actor_email: &'a str,
    /// The service token they acted through (name and display prefix), if any.
    pub actor_token: Option<&'a str>,
    /// What they did.
    pub action: &'a str,
    /// To what kind of thing.
    pub target_kind: &'a str,
    /// Its id.
    pub target_id: i64,
    /// Before (no secrets).
    pub before: Option<serde_json::Value>,
    /// After (no secrets).
    pub after: Option<serde_json::Value>,
}

/// Usage over the request logs, grouped one way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageGrouping {
    /// By calendar day in the workspace's zone.
    Day,
    /// By API key.
    Key,
    /// By member.
    Member,
    /// By department.
    Dept,
    /// By model: `served:` and the model that served, or, for a request nothing served,
    /// `asked:` and the model it asked for (`asked:` alone when it named none).
    Model,
}

impl std::str::FromStr for UsageGrouping {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "day" => UsageGrouping::Day,
            "key" => UsageGrouping::Key,
            "member" => UsageGrouping::Member,
            "dept" => UsageGrouping::Dept,
            "model" => UsageGrouping::Model,
            other => {
                return Err(format!(
                    "unknown grouping {other:?} (expected day, key, member, dept or model)"
                ));
            }
        })
    }
}

/// One group of a usage aggregate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct UsageRow {
    /// The group: a day (`YYYY-MM-DD`), an id, or a model name.
    pub group_key: String,
    /// Requests.
    pub requests: i64,
    /// Prompt tokens.
    pub prompt_tokens: i64,
    /// Completion tokens.
    pub completion_tokens: i64,
    /// Total tokens.
    pub total_tokens: i64,
    /// Micro-credits.
    pub credits: i64,
}

impl UsageRow {
    /// A group with nothing in it yet.
    pub fn empty(group_key: &str) -> UsageRow {
        UsageRow {
            group_key: group_key.to_owned(),
            requests: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            total_tokens: 0,
            credits: 0,
        }
    }

    /// Adds `other`'s figures to this group's (saturating, like the sums in the store).
    pub fn add(&mut self, other: &UsageRow) {
        self.requests = self.requests.saturating_add(other.requests);
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self.completion_tokens.saturating_add(other.completion_tokens);
        self.total_tokens = self.total_tokens.saturating_add(other.total_tokens);
        self.credits = self.credits.saturating_add(other.credits);
    }
}

/// Admin reads and writes.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait AdminStore {
    /// The row `id` of `table` if it belongs to `workspace_id`.
    async fn row_in<T>(&self, table: Table, workspace_id: i64, id: i64) -> StoreResult<Option<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::any::AnyRow> + Send + Unpin;
    /// Every row of `table` in `workspace_id`, by id.
    async fn rows_in<T>(&self, table: Table, workspace_id: i64) -> StoreResult<Vec<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::any::AnyRow> + Send + Unpin;
    /// A page of `table`'s rows in `workspace_id`: ids above `after`, ascending, at most `limit`.
    async fn page_in<T>(
        &self,
        table: Table,
        workspace_id: i64,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::any::AnyRow> + Send + Unpin;
    /// The rows of `table` in `workspace_id` with these ids (a page's references).
    async fn rows_with_ids<T>(&self, table: Table, workspace_id: i64, ids: &[i64]) -> StoreResult<Vec<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::any::AnyRow> + Send + Unpin;
    /// Deletes row `id` of `table` if it belongs to `workspace_id`; whether it did.
    async fn delete_in(&self, table: Table, workspace_id: i64, id: i64) -> StoreResult<bool>;
    /// Renames a department.
    async fn rename_department(&self, id: i64, name: &str) -> StoreResult<()>;
    /// Activates or deactivates a member; deactivation also revokes their tokens.
    async fn set_member_active(&self, id: i64, active: bool) -> StoreResult<()>;
    /// Revokes every token of a member (sign-out, password change).
    async fn bump_session_epoch(&self, id: i64) -> StoreResult<()>;
    /// Records a change.
    async fn audit(&self, e: &AuditEntry<'_>) -> StoreResult<()>;
    /// A page of the audit log, newest first, ids below `cursor`.
    async fn audit_page(
        &self,
        workspace_id: i64,
        cursor: Option<i64>,
        limit: i64,
    ) -> StoreResult<Vec<AuditRow>>;
    /// Usage of a workspace between two instants, grouped; optionally one member's only.
    /// `offset_ms` shifts timestamps into the workspace's zone for day grouping.
    async fn usage(
        &self,
        workspace_id: i64,
        member_id: Option<i64>,
        from_ms: i64,
        to_ms: i64,
        by: UsageGrouping,
        offset_ms: i64,
    ) -> StoreResult<Vec<UsageRow>>;
    /// Usage of a workspace between two instants per value of tag `key`; optionally one
    /// member's only.
    async fn usage_by_tag(
        &self,
        workspace_id: i64,
        member_id: Option<i64>,
        from_ms: i64,
        to_ms: i64,
        key: &str,
    ) -> StoreResult<Vec<UsageRow>>;
}

impl AdminStore for Store {
    async fn row_in<T>(&self, table: Table, workspace_id: i64, id: i64) -> StoreResult<Option<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::any::AnyRow> + Send + Unpin,
    {
        let sql = format!(
            "SELECT * FROM {} WHERE id = $1 AND workspace_id = $2",
            table.name()
        );
        Ok(sqlx::query_as(&sql)
            .bind(id)
            .bind(workspace_id)
            .fetch_optional(self.pool())
            .await?)
    }

    async fn rows_in<T>(&self, table: Table, workspace_id: i64) -> StoreResult<Vec<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::any::AnyRow> + Send + Unpin,
    {
        let sql = format!(
            "SELECT * FROM {} WHERE workspace_id = $1 ORDER BY id",
            table.name()
        );
        Ok(sqlx::query_as(&sql)
            .bind(workspace_id)
            .fetch_all(self.pool())
            .await?)
    }

    async fn page_in<T>(&self, table: Table, workspace_id: i64, after: i64, limit: i64) -> StoreResult<Vec<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::any::AnyRow> + Send + Unpin,
    {
        let sql = format!(
            "SELECT * FROM {} WHERE workspace_id = $1 AND id > $2 ORDER BY id LIMIT $3",
            table.name()
        );
        Ok(sqlx::query_as(&sql)
            .bind(workspace_id)
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?)
    }

    async fn rows_with_ids<T>(&self, table: Table, workspace_id: i64, ids: &[i64]) -> StoreResult<Vec<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::any::AnyRow> + Send + Unpin,
    {
        let mut rows = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let mut b = SqlBuilder::new(
                self,
                &format!("SELECT * FROM {} WHERE workspace_id = ", table.name()),
            );
            b.bind(workspace_id).push(" AND id IN (");
            for (i, id) in chunk.iter().enumerate() {
                if i > 0 {
                    b.push(", ");
                }
                b.bind(*id);
            }
            b.push(") ORDER BY id");
            let (sql, args) = b.finish();
            rows.extend(sqlx::query_as_with(&sql, args).fetch_all(self.pool()).await?);
        }
        Ok(rows)
    }

    async fn delete_in(&self, table: Table, workspace_id: i64, id: i64) -> StoreResult<bool> {
        let sql = format!("DELETE FROM {} WHERE id = $1 AND workspace_id = $2", table.name());
        let r = sqlx::query(&sql)
            .bind(id)
            .bind(workspace_id)
            .execute(self.pool())
            .await?;
        Ok(r.rows_affected() > 0)
    }

    async fn rename_department(&self, id: i64, name: &str) -> StoreResult<()> {
        sqlx::query("UPDATE departments SET name = $1 WHERE id = $2")
            .bind(name)
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn set_member_active(&self, id: i64, active: bool) -> StoreResult<()> {
        sqlx::query("UPDATE members SET active = $1, session_epoch = session_epoch + 1 WHERE id = $2")
            .bind(i64::from(active))
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn bump_session_epoch(&self, id: i64) -> StoreResult<()> {
        sqlx::query("UPDATE members SET session_epoch = session_epoch + 1 WHERE id = $1")
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn audit(&self, e: &AuditEntry<'_>) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO audit_log (workspace_id, at, actor_id, actor_email, action, target_kind, target_id,
               before_json, after_json, client_ip, actor_token)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(e.workspace_id)
        .bind(e.at)
        .bind(e.actor_id)
        .bind(e.actor_email)
        .bind(e.action)
        .bind(e.target_kind)
        .bind(e.target_id)
        .bind(e.before.as_ref().map(|v| v.to_string()))
        .bind(e.after.as_ref().map(|v| v.to_string()))
        .bind(e.client_ip)
        .bind(e.actor_token)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn audit_page(
        &self,
        workspace_id: i64,
        cursor: Option<i64>,
        limit: i64,
    ) -> StoreResult<Vec<AuditRow>> {
        Ok(sqlx::query_as(
            "SELECT * FROM audit_log WHERE workspace_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3",
        )
        .bind(workspace_id)
        .bind(cursor.unwrap_or(i64::MAX))
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    async fn usage(
        &self,
        workspace_id: i64,
        member_id: Option<i64>,
        from_ms: i64,
        to_ms: i64,
        by: UsageGrouping,
        offset_ms: i64,
    ) -> StoreResult<Vec<UsageRow>> {
        // The day of a row in the workspace's zone is its shifted time divided by a day; the
        // handler turns that day number into a date.
        super::usage_rollup::report(self, workspace_id, member_id, (from_ms, to_ms), by, offset_ms).await
    }
    async fn usage_by_tag(
        &self,
        workspace_id: i64,
        member_id: Option<i64>,
        from_ms: i64,
        to_ms: i64,
        key: &str,
    ) -> StoreResult<Vec<UsageRow>> {
        super::usage_rollup::report_by_tag(self, workspace_id, member_id, (from_ms, to_ms), key).await
    }
}
