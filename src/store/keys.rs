//! Gateway API keys: created one at a time by the admin API or in bulk by the resources file,
//! and resolved by hash on the request path.

use super::{ApiKeyRow, SqlBuilder, Store, StoreResult};

/// Rows one statement of a bulk create inserts (at most 7 values each: under SQLite's and
/// Postgres's parameter limits).
pub(super) const BULK_ROWS: usize = 500;

/// What a key is made of when created.
#[derive(Clone, Debug)]
pub struct NewKey<'a> {
    /// Workspace.
    pub workspace_id: i64,
    /// Owning member.
    pub member_id: i64,
    /// Member who created it.
    pub created_by: Option<i64>,
    /// Name, unique per member.
    pub name: &'a str,
    /// SHA-256 of the key, hex.
    pub key_hash: &'a str,
    /// Display prefix.
    pub prefix: &'a str,
}

/// A key as the request path needs it: the key and who it belongs to, in one read.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct KeyIdentity {
    /// Key id.
    pub key_id: i64,
    /// Key name.
    pub key_name: String,
    /// Owning member.
    pub member_id: i64,
    /// Member's department, if any.
    pub department_id: Option<i64>,
    /// Workspace.
    pub workspace_id: i64,
    /// Member who created the key.
    pub created_by: Option<i64>,
    /// Member still active (1) or deactivated (0).
    pub member_active: i64,
    /// The key's model allow-list (JSON), if any.
    pub allowed_models: Option<String>,
    /// The key's concurrency cap, if any.
    pub max_in_flight: Option<i64>,
    /// The key's tag allow-list (JSON), if any.
    pub allowed_tags: Option<String>,
    /// The member's model allow-list (JSON), if any.
    pub member_allowed_models: Option<String>,
    /// The member's concurrency cap, if any.
    pub member_max_in_flight: Option<i64>,
    /// Unix ms at which the key expires, if it does.
    pub expires_at: Option<i64>,
    /// 1 when the hash matched the secret a rotation replaced (then valid until
    /// `previous_expires_at`), 0 for the current secret.
    pub via_previous: i64,
    /// Unix ms at which the replaced secret stops working.
    pub previous_expires_at: Option<i64>,
}

/// A key's guardrails beside quotas, as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyGuardrails {
    /// The model allow-list (JSON), if any.
    pub allowed_models: Option<String>,
    /// The concurrency cap, if any.
    pub max_in_flight: Option<i64>,
    /// Unix ms at which the key expires, if it does.
    pub expires_at: Option<i64>,
    /// The tag allow-list (JSON), if any.
    pub allowed_tags: Option<String>,
}

impl KeyGuardrails {
    /// The guardrails `row` has.
    pub fn of(row: &ApiKeyRow) -> Self {
        KeyGuardrails {
            allowed_models: row.allowed_models.clone(),
            max_in_flight: row.max_in_flight,
            expires_at: row.expires_at,
            allowed_tags: row.allowed_tags.clone(),
        }
    }

    /// Whether none is set (a new key then needs no second write).
    pub fn is_empty(&self) -> bool {
        *self == KeyGuardrails::default()
    }
}

/// The limits an owner or admin set on a member's keys, as stored on the member (none: not
/// limited); the same shape as a key's own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyLimits {
    /// The model allow-list (JSON).
    pub allowed_models: Option<String>,
    /// The cap of each key.
    pub max_in_flight: Option<i64>,
    /// The tag allow-list (JSON).
    pub allowed_tags: Option<String>,
}

impl KeyLimits {
    /// The limits `member` carries to their keys.
    pub fn of(member: &super::MemberRow) -> Self {
        KeyLimits {
            allowed_models: member.key_allowed_models.clone(),
            max_in_flight: member.key_max_in_flight,
            allowed_tags: member.key_allowed_tags.clone(),
        }
    }
}

/// Gateway API keys.
#[expect(
    async_fn_in_trait,
    reason = "one concrete implementor, always called directly"
)]
pub trait KeyStore {
    /// Resolves a key hash to the key, member, department and workspace.
    async fn identity_by_hash(&self, key_hash: &str) -> StoreResult<Option<KeyIdentity>>;
    /// The key a member has under this name.
    async fn key_by_name(&self, member_id: i64, name: &str) -> StoreResult<Option<ApiKeyRow>>;
    /// Creates a key from its hash and display prefix.
    async fn create_key(&self, k: &NewKey<'_>, now: i64) -> StoreResult<ApiKeyRow>;
    /// Creates many keys in one transaction, in batches (the resources file).
    async fn create_keys(&self, keys: &[NewKey<'_>], now: i64) -> StoreResult<()>;
    /// Every key of every workspace (the resources file's index).
    async fn all_keys(&self) -> StoreResult<Vec<ApiKeyRow>>;
    /// Sets a key's guardrails: its model allow-list (JSON), concurrency cap and expiry.
    async fn set_key_guardrails(&self, id: i64, guardrails: &KeyGuardrails) -> StoreResult<()>;
    /// Replaces a key's hash at once (a resources file that names a new key for the same name):
    /// no secret is left in grace.
    async fn set_key_hash(&self, id: i64, key_hash: &str, prefix: &str) -> StoreResult<()>;
    /// Rotates a key's secret: `key_hash` becomes the secret, the current one keeps working until
    /// `previous_expires_at` (none: it stops at once; a secret still in grace from an earlier
    /// rotation stops at once either way). Returns the key as it is now.
    async fn rotate_key(
        &self,
        id: i64,
        key_hash: &str,
        prefix: &str,
        previous_expires_at: Option<i64>,
    ) -> StoreResult<Option<ApiKeyRow>>;
    /// Deletes a key.
    async fn delete_key(&self, id: i64) -> StoreResult<bool>;
    /// Sets the limits a member's keys carry (DESIGN.md §11).
    async fn set_member_key_limits(&self, member_id: i64, limits: &KeyLimits) -> StoreResult<()>;
    /// Keys of a member.
    async fn keys_of_member(&self, member_id: i64) -> StoreResult<Vec<ApiKeyRow>>;
    /// The key with this id.
    async fn key(&self, id: i64) -> StoreResult<Option<ApiKeyRow>>;
}

impl KeyStore for Store {
    async fn identity_by_hash(&self, key_hash: &str) -> StoreResult<Option<KeyIdentity>> {
        Ok(sqlx::query_as(
            "SELECT k.id AS key_id, k.name AS key_name, k.member_id, m.department_id, k.workspace_id,
                    k.created_by, m.active AS member_active, k.allowed_models, k.max_in_flight, k.allowed_tags,
                    m.allowed_models AS member_allowed_models, m.max_in_flight AS member_max_in_flight,
                    k.expires_at, CAST(CASE WHEN k.key_hash = $1 THEN 0 ELSE 1 END AS BIGINT) AS via_previous,
                    k.previous_expires_at
             FROM api_keys k JOIN members m ON m.id = k.member_id
             WHERE k.key_hash = $2 OR k.previous_key_hash = $3
             ORDER BY via_previous LIMIT 1",
        )
        .bind(key_hash)
        .bind(key_hash)
        .bind(key_hash)
        .fetch_optional(self.pool())
        .await?)
    }
    async fn key_by_name(&self, member_id: i64, name: &str) -> StoreResult<Option<ApiKeyRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM api_keys WHERE member_id = $1 AND name = $2")
                .bind(member_id)
                .bind(name)
                .fetch_optional(self.pool())
                .await?,
        )
    }
    async fn create_key(&self, k: &NewKey<'_>, now: i64) -> StoreResult<ApiKeyRow> {
        Ok(sqlx::query_as(
            "INSERT INTO api_keys (workspace_id, member_id, created_by, name, key_hash, prefix, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING *",
        )
        .bind(k.workspace_id)
        .bind(k.member_id)
        .bind(k.created_by)
        .bind(k.name)
        .bind(k.key_hash)
        .bind(k.prefix)
        .bind(now)
        .fetch_one(self.pool())
        .await?)
    }
    async fn create_keys(&self, keys: &[NewKey<'_>], now: i64) -> StoreResult<()> {
        let mut tx = self.pool().begin().await?;
        for chunk in keys.chunks(BULK_ROWS) {
            let mut b = SqlBuilder::new(
                self,
                "INSERT INTO api_keys (workspace_id, member_id, created_by, name, key_hash, prefix, created_at) VALUES ",
            );
            for (i, k) in chunk.iter().enumerate() {
                b.push(if i == 0 { "(" } else { ", (" });
                b.bind(k.workspace_id).push(", ").bind(k.member_id).push(", ");
                b.bind(k.created_by).push(", ").bind(k.name).push(", ");
                b.bind(k.key_hash)
                    .push(", ")
                    .bind(k.prefix)
                    .push(", ")
                    .bind(now)
                    .push(")");
            }
            let (sql, args) = b.finish();
            sqlx::query_with(&sql, args).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
    async fn all_keys(&self) -> StoreResult<Vec<ApiKeyRow>> {
        Ok(sqlx::query_as("SELECT * FROM api_keys")
            .fetch_all(self.pool())
            .await?)
    }
    async fn set_key_guardrails(&self, id: i64, g: &KeyGuardrails) -> StoreResult<()> {
        sqlx::query(
            "UPDATE api_keys SET allowed_models = $1, max_in_flight = $2, expires_at = $3, allowed_tags = $4
             WHERE id = $5",
        )
        .bind(g.allowed_models.as_deref())
        .bind(g.max_in_flight)
        .bind(g.expires_at)
        .bind(g.allowed_tags.as_deref())
        .bind(id)
        .execute(self.pool())
        .await?;
        Ok(())
    }
    async fn set_key_hash(&self, id: i64, key_hash: &str, prefix: &str) -> StoreResult<()> {
        sqlx::query(
            "UPDATE api_keys SET key_hash = $1, prefix = $2, previous_key_hash = NULL,
                    previous_expires_at = NULL
             WHERE id = $3",
        )
        .bind(key_hash)
        .bind(prefix)
        .bind(id)
        .execute(self.pool())
        .await?;
        Ok(())
    }
    async fn rotate_key(
        &self,
        id: i64,
        key_hash: &str,
        prefix: &str,
        previous_expires_at: Option<i64>,
    ) -> StoreResult<Option<ApiKeyRow>> {
        // The right-hand sides read the row as it was: the current secret becomes the previous.
        let previous = if previous_expires_at.is_some() {
            "key_hash"
        } else {
            "NULL"
        };
        let sql = format!(
            "UPDATE api_keys SET previous_key_hash = {previous}, previous_expires_at = $1,
                    key_hash = $2, prefix = $3
             WHERE id = $4 RETURNING *"
        );
        Ok(sqlx::query_as(&sql)
            .bind(previous_expires_at)
            .bind(key_hash)
            .bind(prefix)
            .bind(id)
            .fetch_optional(self.pool())
            .await?)
    }
    async fn set_member_key_limits(&self, member_id: i64, limits: &KeyLimits) -> StoreResult<()> {
        sqlx::query(
            "UPDATE members SET key_allowed_models = $1, key_max_in_flight = $2, key_allowed_tags = $3 WHERE id = $4",
        )
        .bind(limits.allowed_models.as_deref())
        .bind(limits.max_in_flight)
        .bind(limits.allowed_tags.as_deref())
        .bind(member_id)
        .execute(self.pool())
        .await?;
        Ok(())
    }
    async fn delete_key(&self, id: i64) -> StoreResult<bool> {
        let r = sqlx::query("DELETE FROM api_keys WHERE id = $1")
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(r.rows_affected() > 0)
    }
    async fn keys_of_member(&self, member_id: i64) -> StoreResult<Vec<ApiKeyRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM api_keys WHERE member_id = $1 ORDER BY id")
                .bind(member_id)
                .fetch_all(self.pool())
                .await?,
        )
    }
    async fn key(&self, id: i64) -> StoreResult<Option<ApiKeyRow>> {
        Ok(sqlx::query_as("SELECT * FROM api_keys WHERE id = $1")
            .bind(id)
            .fetch_optional(self.pool())
            .await?)
    }
}
