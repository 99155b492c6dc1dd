//! Workspaces, departments, members, upstream credentials, models and policies (API keys: `keys.rs`).

mod label_caps;
mod labels;

pub use label_caps::*;
pub use labels::*;

use super::keys::BULK_ROWS;
use super::{
    Backend, Department, MemberRow, ModelRow, PolicyRow, SqlBuilder, Store, StoreResult, UpstreamRow,
    Workspace,
};

/// Workspaces.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait WorkspaceStore {
    /// The workspace with this name.
    async fn workspace_by_name(&self, name: &str) -> StoreResult<Option<Workspace>>;
    /// The workspace with this id.
    async fn workspace(&self, id: i64) -> StoreResult<Option<Workspace>>;
    /// Creates a workspace.
    async fn create_workspace(&self, name: &str, timezone: Option<&str>, now: i64) -> StoreResult<Workspace>;
    /// Sets a workspace's time zone override.
    async fn set_workspace_timezone(&self, id: i64, timezone: Option<&str>) -> StoreResult<()>;
    /// Every workspace.
    async fn workspaces(&self) -> StoreResult<Vec<Workspace>>;
}

impl WorkspaceStore for Store {
    async fn workspace_by_name(&self, name: &str) -> StoreResult<Option<Workspace>> {
        Ok(sqlx::query_as("SELECT * FROM workspaces WHERE name = $1")
            .bind(name)
            .fetch_optional(self.pool())
            .await?)
    }
    async fn workspace(&self, id: i64) -> StoreResult<Option<Workspace>> {
        Ok(sqlx::query_as("SELECT * FROM workspaces WHERE id = $1")
            .bind(id)
            .fetch_optional(self.pool())
            .await?)
    }
    async fn create_workspace(&self, name: &str, timezone: Option<&str>, now: i64) -> StoreResult<Workspace> {
        Ok(sqlx::query_as(
            "INSERT INTO workspaces (name, timezone, created_at) VALUES ($1, $2, $3) RETURNING *",
        )
        .bind(name)
        .bind(timezone)
        .bind(now)
        .fetch_one(self.pool())
        .await?)
    }
    async fn set_workspace_timezone(&self, id: i64, timezone: Option<&str>) -> StoreResult<()> {
        sqlx::query("UPDATE workspaces SET timezone = $1 WHERE id = $2")
            .bind(timezone)
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }
    async fn workspaces(&self) -> StoreResult<Vec<Workspace>> {
        Ok(sqlx::query_as("SELECT * FROM workspaces ORDER BY id")
            .fetch_all(self.pool())
            .await?)
    }
}

/// Departments.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait DepartmentStore {
    /// The department with this name in a workspace.
    async fn department_by_name(&self, workspace_id: i64, name: &str) -> StoreResult<Option<Department>>;
    /// Creates a department.
    async fn create_department(&self, workspace_id: i64, name: &str, now: i64) -> StoreResult<Department>;
    /// Every department of a workspace.
    async fn departments(&self, workspace_id: i64) -> StoreResult<Vec<Department>>;
    /// Every department of every workspace (the resources file's index).
    async fn all_departments(&self) -> StoreResult<Vec<Department>>;
}

impl DepartmentStore for Store {
    async fn department_by_name(&self, workspace_id: i64, name: &str) -> StoreResult<Option<Department>> {
        Ok(
            sqlx::query_as("SELECT * FROM departments WHERE workspace_id = $1 AND name = $2")
                .bind(workspace_id)
                .bind(name)
                .fetch_optional(self.pool())
                .await?,
        )
    }
    async fn create_department(&self, workspace_id: i64, name: &str, now: i64) -> StoreResult<Department> {
        Ok(sqlx::query_as(
            "INSERT INTO departments (workspace_id, name, created_at) VALUES ($1, $2, $3) RETURNING *",
        )
        .bind(workspace_id)
        .bind(name)
        .bind(now)
        .fetch_one(self.pool())
        .await?)
    }
    async fn all_departments(&self) -> StoreResult<Vec<Department>> {
        Ok(sqlx::query_as("SELECT * FROM departments")
            .fetch_all(self.pool())
            .await?)
    }
    async fn departments(&self, workspace_id: i64) -> StoreResult<Vec<Department>> {
        Ok(
            sqlx::query_as("SELECT * FROM departments WHERE workspace_id = $1 ORDER BY id")
                .bind(workspace_id)
                .fetch_all(self.pool())
                .await?,
        )
    }
}

/// What a member is made of when created.
#[derive(Clone, Debug)]
pub struct NewMember<'a> {
    /// Workspace.
    pub workspace_id: i64,
    /// Department, if any.
    pub department_id: Option<i64>,
    /// Sign-in email.
    pub email: &'a str,
    /// Role name.
    pub role: &'a str,
    /// argon2 hash, if a password is set.
    pub password_hash: Option<&'a str>,
}

/// Members.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait MemberStore {
    /// The member with this email, whatever its case ([`fold_email`]; any workspace: emails are
    /// unique).
    async fn member_by_email(&self, email: &str) -> StoreResult<Option<MemberRow>>;
    /// The member with this id.
    async fn member(&self, id: i64) -> StoreResult<Option<MemberRow>>;
    /// Creates a member.
    async fn create_member(&self, m: &NewMember<'_>, now: i64) -> StoreResult<MemberRow>;
    /// Creates many members in one transaction, in batches (the resources file).
    async fn create_members(&self, members: &[NewMember<'_>], now: i64) -> StoreResult<()>;
    /// Every member of every workspace (the resources file's index).
    async fn all_members(&self) -> StoreResult<Vec<MemberRow>>;
    /// Sets department and role.
    async fn update_member(&self, id: i64, department_id: Option<i64>, role: &str) -> StoreResult<()>;
    /// Sets a member's guardrails: the model allow-list (JSON) and concurrency cap of their keys.
    async fn set_member_guardrails(
        &self,
        id: i64,
        allowed_models: Option<&str>,
        max_in_flight: Option<i64>,
    ) -> StoreResult<()>;
    /// Sets the password hash.
    async fn set_member_password(&self, id: i64, password_hash: &str) -> StoreResult<()>;
    /// How many active owners exist across all workspaces.
    async fn count_owners(&self) -> StoreResult<i64>;
}

/// An email as identities are matched by: its ASCII letters in lower case (the domain is
/// case-insensitive, and no provider or person tells two mailboxes apart by case).
pub fn fold_email(email: &str) -> String {
    email.trim().to_ascii_lowercase()
}

impl MemberStore for Store {
    async fn member_by_email(&self, email: &str) -> StoreResult<Option<MemberRow>> {
        // One identity per email whatever its case (ASCII letters folded, the same on both
        // backends, as `members_email_folded` indexes it); the oldest where members stored
        // before this rule differ only in case, so a deactivated one is never bypassed.
        let folded = match self.backend() {
            Backend::Postgres => "LOWER(email COLLATE \"C\")",
            Backend::Sqlite => "LOWER(email)",
        };
        let sql = format!("SELECT * FROM members WHERE {folded} = $1 ORDER BY id LIMIT 1");
        Ok(sqlx::query_as(&sql)
            .bind(fold_email(email))
            .fetch_optional(self.pool())
            .await?)
    }
    async fn all_members(&self) -> StoreResult<Vec<MemberRow>> {
        Ok(sqlx::query_as("SELECT * FROM members ORDER BY id")
            .fetch_all(self.pool())
            .await?)
    }
    async fn create_members(&self, members: &[NewMember<'_>], now: i64) -> StoreResult<()> {
        let mut tx = self.pool().begin().await?;
        for chunk in members.chunks(BULK_ROWS) {
            let mut b = SqlBuilder::new(
                self,
                "INSERT INTO members (workspace_id, department_id, email, role, password_hash, active, created_at) VALUES ",
            );
            for (i, m) in chunk.iter().enumerate() {
                b.push(if i == 0 { "(" } else { ", (" });
                b.bind(m.workspace_id).push(", ").bind(m.department_id).push(", ");
                b.bind(m.email).push(", ").bind(m.role).push(", ");
                b.bind(m.password_hash).push(", 1, ").bind(now).push(")");
            }
            let (sql, args) = b.finish();
            sqlx::query_with(&sql, args).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
    async fn member(&self, id: i64) -> StoreResult<Option<MemberRow>> {
        Ok(sqlx::query_as("SELECT * FROM members WHERE id = $1")
            .bind(id)
            .fetch_optional(self.pool())
            .await?)
    }
    async fn create_member(&self, m: &NewMember<'_>, now: i64) -> StoreResult<MemberRow> {
        Ok(sqlx::query_as(
            "INSERT INTO members (workspace_id, department_id, email, role, password_hash, active, created_at)
             VALUES ($1, $2, $3, $4, $5, 1, $6) RETURNING *",
        )
        .bind(m.workspace_id)
        .bind(m.department_id)
        .bind(m.email)
        .bind(m.role)
        .bind(m.password_hash)
        .bind(now)
        .fetch_one(self.pool())
        .await?)
    }
    async fn update_member(&self, id: i64, department_id: Option<i64>, role: &str) -> StoreResult<()> {
        sqlx::query("UPDATE members SET department_id = $1, role = $2 WHERE id = $3")
            .bind(department_id)
            .bind(role)
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }
    async fn set_member_guardrails(
        &self,
        id: i64,
        allowed_models: Option<&str>,
        max_in_flight: Option<i64>,
    ) -> StoreResult<()> {
        sqlx::query("UPDATE members SET allowed_models = $1, max_in_flight = $2 WHERE id = $3")
            .bind(allowed_models)
            .bind(max_in_flight)
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }
    async fn set_member_password(&self, id: i64, password_hash: &str) -> StoreResult<()> {
        sqlx::query("UPDATE members SET password_hash = $1 WHERE id = $2")
            .bind(password_hash)
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }
    async fn count_owners(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(
            "SELECT CAST(COUNT(*) AS BIGINT) FROM members WHERE role = 'owner' AND active = 1",
        )
        .fetch_one(self.pool())
        .await?)
    }
}

/// Upstream credentials.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait UpstreamStore {
    /// The credential with this name in a workspace.
    async fn upstream_by_name(&self, workspace_id: i64, name: &str) -> StoreResult<Option<UpstreamRow>>;
    /// Every credential (all workspaces): the routing snapshot.
    async fn all_upstreams(&self) -> StoreResult<Vec<UpstreamRow>>;
    /// The credential with this id.
    async fn upstream(&self, id: i64) -> StoreResult<Option<UpstreamRow>>;
    /// Inserts (id 0) or updates (by id) a credential; returns its id.
    async fn save_upstream(&self, u: &UpstreamRow) -> StoreResult<i64>;
}

impl UpstreamStore for Store {
    async fn upstream_by_name(&self, workspace_id: i64, name: &str) -> StoreResult<Option<UpstreamRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM upstreams WHERE workspace_id = $1 AND name = $2")
                .bind(workspace_id)
                .bind(name)
                .fetch_optional(self.pool())
                .await?,
        )
    }
    async fn all_upstreams(&self) -> StoreResult<Vec<UpstreamRow>> {
        Ok(sqlx::query_as("SELECT * FROM upstreams ORDER BY id")
            .fetch_all(self.pool())
            .await?)
    }
    async fn upstream(&self, id: i64) -> StoreResult<Option<UpstreamRow>> {
        Ok(sqlx::query_as("SELECT * FROM upstreams WHERE id = $1")
            .bind(id)
            .fetch_optional(self.pool())
            .await?)
    }
    async fn save_upstream(&self, u: &UpstreamRow) -> StoreResult<i64> {
        let q = if u.id == 0 {
            sqlx::query_scalar(
                "INSERT INTO upstreams (workspace_id, name, provider, base_url, secret_sealed, models, priority,
                   weight, max_in_flight, requests_per_minute, tokens_per_minute, requests_per_day, quota_group,
                   enabled, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) RETURNING id",
            )
        } else {
            sqlx::query_scalar(
                "UPDATE upstreams SET workspace_id = $1, name = $2, provider = $3, base_url = $4, secret_sealed = $5,
                   models = $6, priority = $7, weight = $8, max_in_flight = $9, requests_per_minute = $10,
                   tokens_per_minute = $11, requests_per_day = $12, quota_group = $13, enabled = $14,
                   created_at = $15, updated_at = $16
                 WHERE id = $17 RETURNING id",
            )
        };
        let q = q
            .bind(u.workspace_id)
            .bind(&u.name)
            .bind(&u.provider)
            .bind(&u.base_url)
            .bind(&u.secret_sealed)
            .bind(&u.models)
            .bind(u.priority)
            .bind(u.weight)
            .bind(u.max_in_flight)
            .bind(u.requests_per_minute)
            .bind(u.tokens_per_minute)
            .bind(u.requests_per_day)
            .bind(&u.quota_group)
            .bind(u.enabled)
            .bind(u.created_at)
            .bind(u.updated_at);
        let q = if u.id == 0 { q } else { q.bind(u.id) };
        Ok(q.fetch_one(self.pool()).await?)
    }
}

/// Public models.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait ModelStore {
    /// The model with this name in a workspace.
    async fn model_by_name(&self, workspace_id: i64, name: &str) -> StoreResult<Option<ModelRow>>;
    /// Every model (all workspaces): the routing snapshot.
    async fn all_models(&self) -> StoreResult<Vec<ModelRow>>;
    /// Inserts (id 0) or updates (by id) a model; returns its id.
    async fn save_model(&self, m: &ModelRow) -> StoreResult<i64>;
}

impl ModelStore for Store {
    async fn model_by_name(&self, workspace_id: i64, name: &str) -> StoreResult<Option<ModelRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM models WHERE workspace_id = $1 AND name = $2")
                .bind(workspace_id)
                .bind(name)
                .fetch_optional(self.pool())
                .await?,
        )
    }
    async fn all_models(&self) -> StoreResult<Vec<ModelRow>> {
        Ok(sqlx::query_as("SELECT * FROM models ORDER BY id")
            .fetch_all(self.pool())
            .await?)
    }
    async fn save_model(&self, m: &ModelRow) -> StoreResult<i64> {
        let q = if m.id == 0 {
            sqlx::query_scalar(
                "INSERT INTO models (workspace_id, name, fallbacks, price_prompt, price_completion, created_at,
                   max_output_tokens) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
            )
        } else {
            sqlx::query_scalar(
                "UPDATE models SET workspace_id = $1, name = $2, fallbacks = $3, price_prompt = $4,
                   price_completion = $5, created_at = $6, max_output_tokens = $7 WHERE id = $8 RETURNING id",
            )
        };
        let q = q
            .bind(m.workspace_id)
            .bind(&m.name)
            .bind(&m.fallbacks)
            .bind(m.price_prompt)
            .bind(m.price_completion)
            .bind(m.created_at)
            .bind(m.max_output_tokens);
        let q = if m.id == 0 { q } else { q.bind(m.id) };
        Ok(q.fetch_one(self.pool()).await?)
    }
}

/// Guardrail quota policies.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait PolicyStore {
    /// The policy with this natural key (one per subject × metric × window).
    async fn policy_by_key(
        &self,
        workspace_id: i64,
        subject: &str,
        target_id: i64,
        scope_department_id: i64,
        metric: &str,
        window: &str,
    ) -> StoreResult<Option<PolicyRow>>;
    /// Every policy (all workspaces): the quota snapshot.
    async fn all_policies(&self) -> StoreResult<Vec<PolicyRow>>;
    /// Inserts (id 0) or updates (by id) a policy; returns its id.
    async fn save_policy(&self, p: &PolicyRow) -> StoreResult<i64>;
}

impl PolicyStore for Store {
    async fn policy_by_key(
        &self,
        workspace_id: i64,
        subject: &str,
        target_id: i64,
        scope_department_id: i64,
        metric: &str,
        window: &str,
    ) -> StoreResult<Option<PolicyRow>> {
        Ok(sqlx::query_as(
            "SELECT * FROM policies WHERE workspace_id = $1 AND subject = $2 AND target_id = $3
               AND scope_department_id = $4 AND metric = $5 AND time_window = $6",
        )
        .bind(workspace_id)
        .bind(subject)
        .bind(target_id)
        .bind(scope_department_id)
        .bind(metric)
        .bind(window)
        .fetch_optional(self.pool())
        .await?)
    }
    async fn all_policies(&self) -> StoreResult<Vec<PolicyRow>> {
        Ok(sqlx::query_as("SELECT * FROM policies ORDER BY id")
            .fetch_all(self.pool())
            .await?)
    }
    async fn save_policy(&self, p: &PolicyRow) -> StoreResult<i64> {
        let q = if p.id == 0 {
            sqlx::query_scalar(
                "INSERT INTO policies (workspace_id, subject, target_id, scope_department_id, metric, time_window,
                   limit_value, mode, created_by, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id",
            )
        } else {
            sqlx::query_scalar(
                "UPDATE policies SET workspace_id = $1, subject = $2, target_id = $3, scope_department_id = $4,
                   metric = $5, time_window = $6, limit_value = $7, mode = $8, created_by = $9, created_at = $10,
                   updated_at = $11 WHERE id = $12 RETURNING id",
            )
        };
        let q = q
            .bind(p.workspace_id)
            .bind(&p.subject)
            .bind(p.target_id)
            .bind(p.scope_department_id)
            .bind(&p.metric)
            .bind(&p.time_window)
            .bind(p.limit_value)
            .bind(&p.mode)
            .bind(p.created_by)
            .bind(p.created_at)
            .bind(p.updated_at);
        let q = if p.id == 0 { q } else { q.bind(p.id) };
        Ok(q.fetch_one(self.pool()).await?)
    }
}
