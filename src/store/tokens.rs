//! Admin service tokens (DESIGN.md §11): the SHA-256 of each secret and its display prefix, the
//! role and workspace it is scoped to, who created it, its expiry, last use and revocation.

use super::{Store, StoreResult};

/// A service token as stored (never its secret).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ServiceTokenRow {
    /// Row id.
    pub id: i64,
    /// The workspace it acts in.
    pub workspace_id: i64,
    /// What it is for ("terraform", "ci deploy").
    pub name: String,
    /// `owner`, `admin` or `member`: the most it may do.
    pub role: String,
    /// SHA-256 of the secret, hex.
    pub token_hash: String,
    /// `aigw_st_` plus four characters, for display.
    pub prefix: String,
    /// The member who created it, and for whom it acts.
    pub created_by: i64,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms at which it stops working, if it does.
    pub expires_at: Option<i64>,
    /// Unix ms of its last use (exact to [`TOKEN_LAST_USED_STEP_MS`]).
    pub last_used_at: Option<i64>,
    /// Unix ms at which it was revoked.
    pub revoked_at: Option<i64>,
    /// Who revoked it.
    pub revoked_by: Option<i64>,
}

impl ServiceTokenRow {
    /// The role it is scoped to (a stored role outside the CHECK constraint reads as `member`).
    pub fn role(&self) -> super::Role {
        self.role.parse().unwrap_or(super::Role::Member)
    }
}

/// A token to create.
#[derive(Clone, Debug)]
pub struct NewServiceToken<'a> {
    /// Workspace.
    pub workspace_id: i64,
    /// Name.
    pub name: &'a str,
    /// Role.
    pub role: &'a str,
    /// SHA-256 of the secret, hex.
    pub token_hash: &'a str,
    /// Display prefix.
    pub prefix: &'a str,
    /// The creating member.
    pub created_by: i64,
    /// Expiry, Unix ms.
    pub expires_at: Option<i64>,
}

/// How far a token's `last_used_at` must move before it is written again: a script calling the
/// admin API in a loop costs its row a write a minute, not one per call.
pub const TOKEN_LAST_USED_STEP_MS: i64 = 60_000;

/// Service tokens.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait TokenStore {
    /// Creates a token.
    async fn create_service_token(&self, t: &NewServiceToken<'_>, now: i64) -> StoreResult<ServiceTokenRow>;
    /// The token with this hash, revoked or not.
    async fn service_token_by_hash(&self, token_hash: &str) -> StoreResult<Option<ServiceTokenRow>>;
    /// Every token of a workspace, by id.
    async fn service_tokens_in(&self, workspace_id: i64) -> StoreResult<Vec<ServiceTokenRow>>;
    /// The token `id` of a workspace.
    async fn service_token_in(&self, workspace_id: i64, id: i64) -> StoreResult<Option<ServiceTokenRow>>;
    /// Revokes a token that is not revoked yet; whether it did.
    async fn revoke_service_token(&self, id: i64, at: i64, by: i64) -> StoreResult<bool>;
    /// Notes a use at `at`, when the stored one is older by a step or more.
    async fn touch_service_token(&self, id: i64, at: i64) -> StoreResult<()>;
}

impl TokenStore for Store {
    async fn create_service_token(&self, t: &NewServiceToken<'_>, now: i64) -> StoreResult<ServiceTokenRow> {
        Ok(sqlx::query_as(
            "INSERT INTO service_tokens (workspace_id, name, role, token_hash, prefix, created_by, created_at,
               expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING *",
        )
        .bind(t.workspace_id)
        .bind(t.name)
        .bind(t.role)
        .bind(t.token_hash)
        .bind(t.prefix)
        .bind(t.created_by)
        .bind(now)
        .bind(t.expires_at)
        .fetch_one(self.pool())
        .await?)
    }

    async fn service_token_by_hash(&self, token_hash: &str) -> StoreResult<Option<ServiceTokenRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM service_tokens WHERE token_hash = $1")
                .bind(token_hash)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    async fn service_tokens_in(&self, workspace_id: i64) -> StoreResult<Vec<ServiceTokenRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM service_tokens WHERE workspace_id = $1 ORDER BY id")
                .bind(workspace_id)
                .fetch_all(self.pool())
                .await?,
        )
    }

    async fn service_token_in(&self, workspace_id: i64, id: i64) -> StoreResult<Option<ServiceTokenRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM service_tokens WHERE id = $1 AND workspace_id = $2")
                .bind(id)
                .bind(workspace_id)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    async fn revoke_service_token(&self, id: i64, at: i64, by: i64) -> StoreResult<bool> {
        let r = sqlx::query(
            "UPDATE service_tokens SET revoked_at = $1, revoked_by = $2 WHERE id = $3 AND revoked_at IS NULL",
        )
        .bind(at)
        .bind(by)
        .bind(id)
        .execute(self.pool())
        .await?;
        Ok(r.rows_affected() > 0)
    }

    async fn touch_service_token(&self, id: i64, at: i64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE service_tokens SET last_used_at = $1 WHERE id = $2
               AND (last_used_at IS NULL OR last_used_at <= $3)",
        )
        .bind(at)
        .bind(id)
        .bind(at.saturating_sub(TOKEN_LAST_USED_STEP_MS))
        .execute(self.pool())
        .await?;
        Ok(())
    }
}
