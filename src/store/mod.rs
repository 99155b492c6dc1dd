//! The database. One sqlx `Any` pool serves both backends: queries are written once in the SQL
//! both SQLite and Postgres accept (`$n` placeholders, `ON CONFLICT`, `RETURNING`, BIGINT times
//! and flags), and the behaviour suite runs on both. Each aggregate has its own trait, so the
//! surface of, say, API keys is read in one place.

mod admin;
mod entities;
mod tenancy;

pub use admin::*;
pub use entities::*;
pub use tenancy::*;

use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, ConnectOptions};

/// Which database the store runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Embedded SQLite (the default).
    Sqlite,
    /// PostgreSQL (production; several gateways may share one).
    Postgres,
}

/// A failure of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database answered with an error or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Migrations could not be applied.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value does not decode (damaged or hand-edited row).
    #[error("bad stored value: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Whether the database answered and refused the statement (or returned a value that does not
    /// decode), rather than being out of reach: another statement may well succeed.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            StoreError::Database(
                sqlx::Error::Database(_) | sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)
            )
        )
    }

    /// Whether the error is a unique-constraint violation (a duplicate name).
    pub fn is_unique_violation(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::Database(e)) if e.is_unique_violation())
    }
}

/// Result of a store call.
pub type StoreResult<T> = Result<T, StoreError>;

/// Builds SQL for dynamic filters and batches with each backend's placeholders: `$n` for
/// Postgres, `?` for SQLite (sqlx's `QueryBuilder` writes `?` for the `Any` driver, which Postgres
/// rejects; and SQLite looks named parameters up linearly, so a 500-row batch of `$n` costs
/// quadratic time).
pub struct SqlBuilder<'q> {
    sql: String,
    args: sqlx::any::AnyArguments<'q>,
    count: usize,
    numbered: bool,
}

impl<'q> SqlBuilder<'q> {
    /// Starts with `sql`, for `store`'s backend.
    pub fn new(store: &Store, sql: &str) -> Self {
        SqlBuilder {
            sql: sql.to_owned(),
            args: sqlx::any::AnyArguments::default(),
            count: 0,
            numbered: store.backend == Backend::Postgres,
        }
    }

    /// Appends SQL text.
    pub fn push(&mut self, sql: &str) -> &mut Self {
        self.sql.push_str(sql);
        self
    }

    /// Appends a placeholder bound to `value`.
    pub fn bind<T>(&mut self, value: T) -> &mut Self
    where
        T: 'q + sqlx::Encode<'q, sqlx::Any> + sqlx::Type<sqlx::Any>,
    {
        use sqlx::Arguments;
        self.count += 1;
        if self.numbered {
            self.sql.push('$');
            self.sql.push_str(&self.count.to_string());
        } else {
            self.sql.push('?');
        }
        // Encoding into AnyArguments only fails for types the Any driver lacks, which the type
        // bound already excludes.
        let _ = self.args.add(value);
        self
    }

    /// The SQL and its arguments, for `sqlx::query_with` / `query_as_with`.
    pub fn finish(self) -> (String, sqlx::any::AnyArguments<'q>) {
        (self.sql, self.args)
    }
}

static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");
static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// The gateway's database handle. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
}

impl Store {
    /// Connects to `url` (`sqlite://…`, created if missing, WAL; or `postgres://…`) and applies
    /// the migrations of that backend.
    pub async fn connect(url: &str) -> StoreResult<Store> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else {
            Backend::Postgres
        };
        let url = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=rwc")
            }
            _ => url.to_owned(),
        };
        let options = AnyConnectOptions::from_str(&url)?
            .log_statements(tracing::log::LevelFilter::Trace)
            .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(1));
        let pool = AnyPoolOptions::new()
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        use sqlx::Executor;
                        // WAL with NORMAL sync: no fsync per commit, still never corrupt; a power
                        // loss may lose the last commits (the documented flush-interval bound).
                        conn.execute("PRAGMA synchronous = NORMAL").await?;
                    }
                    Ok(())
                })
            })
            .max_connections(match backend {
                Backend::Sqlite => 4,
                Backend::Postgres => 16,
            })
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        if backend == Backend::Sqlite {
            // WAL is a property of the file: set once, kept by every later connection.
            sqlx::query("PRAGMA journal_mode=WAL").execute(&pool).await?;
        }
        let store = Store { pool, backend };
        store.migrator().run(&store.pool).await?;
        Ok(store)
    }

    fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        match self.backend {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        }
    }

    /// The backend this store runs on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The pool, for the aggregates' implementations.
    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Whether the database answers and every migration this build knows is applied.
    pub async fn ready(&self) -> bool {
        let expected = self
            .migrator()
            .iter()
            .filter(|m| m.migration_type.is_up_migration())
            .count() as i64;
        let applied: Result<i64, _> =
            sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM _sqlx_migrations WHERE success = TRUE")
                .fetch_one(&self.pool)
                .await;
        matches!(applied, Ok(n) if n >= expected)
    }

    /// The configuration epoch: bumped by every configuration change, polled by every gateway.
    pub async fn config_epoch(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT epoch FROM config_epoch WHERE id = 1")
            .fetch_one(&self.pool)
            .await?)
    }

    /// Announces a configuration change to every gateway on this database.
    pub async fn bump_config_epoch(&self) -> StoreResult<()> {
        sqlx::query("UPDATE config_epoch SET epoch = epoch + 1 WHERE id = 1")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Closes every connection (graceful shutdown).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}
