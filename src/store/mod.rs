//! The database. One sqlx `Any` pool serves both backends: queries are written once in the SQL
//! both SQLite and Postgres accept (`$n` placeholders, `ON CONFLICT`, `RETURNING`, BIGINT times
//! and flags), and the behaviour suite runs on both. Each aggregate has its own trait, so the
//! surface of, say, API keys is read in one place.

mod admin;
mod alerts;
mod breaker;
mod credential_figures;
mod entities;
mod health;
mod keys;
mod locks;
mod request_logs;
mod rollup_sums;
mod sql;
mod sqlite_logs;
mod sqlite_memory;
mod tenancy;
mod tokens;
mod upkeep;
mod usage;
mod usage_recorded;
mod usage_rollup;

pub use admin::*;
pub use alerts::*;
pub use breaker::*;
pub use credential_figures::*;
pub use entities::*;
pub use keys::*;
pub use locks::*;
pub use request_logs::*;
pub use rollup_sums::RollupSums;
pub use sqlite_memory::sqlite_on_mimalloc;
pub use tenancy::*;
pub use tokens::*;
pub use usage::*;
pub use usage_recorded::{RecordedUsage, RecordedUsageStore};
pub use usage_rollup::{DAY_MS, HOUR_MS, day_of, hour_of};

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, ConnectOptions};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use health::Health;
use sql::SqlBuilder;
pub(crate) use sql::{NARROW_STATEMENT_ROWS, STATEMENT_ROWS, statements};
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
    /// SQLite answered the log writer with an error (`store::sqlite_logs`).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Migrations could not be applied.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value does not decode (damaged or hand-edited row).
    #[error("bad stored value: {0}")]
    Corrupt(String),
    /// The database is known to be unreachable: the call was not even tried (see
    /// [`Store::available`]).
    #[error("the database is unreachable")]
    Unavailable,
    /// The database was migrated by a newer aigw (a rollback after an upgrade).
    #[error(
        "the database has migration {version}, which this aigw does not know: a newer aigw has \
         migrated it. Run that version or a later one, or restore the backup taken before the upgrade"
    )]
    Newer {
        /// The unknown migration.
        version: i64,
    },
    /// The database server could not be reached at start.
    #[error("cannot connect to {server}: {cause}")]
    Unreachable {
        /// Which server: backend, host and port, database and user (never the password).
        server: String,
        /// Why, in the operating system's or the server's words.
        cause: String,
    },
}

impl StoreError {
    /// Whether the database answered and refused the statement (or returned a value that does not
    /// decode), rather than being out of reach: another statement may well succeed.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            StoreError::Database(
                sqlx::Error::Database(_) | sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)
            ) | StoreError::Sqlite(_)
        )
    }

    /// Whether the database is out of reach (down, restarting, the network between cut) rather
    /// than refusing the statement: the call may succeed unchanged once it is back.
    pub fn is_unreachable(&self) -> bool {
        match self {
            StoreError::Unavailable => true,
            StoreError::Database(e) => match e {
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::Protocol(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed => true,
                // Postgres: class 08 (connection exception), and the server shutting down,
                // crashed or still starting (57P01–57P03).
                sqlx::Error::Database(d) => d
                    .code()
                    .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
                _ => false,
            },
            StoreError::Unreachable { .. } => true,
            StoreError::Migrate(_)
            | StoreError::Corrupt(_)
            | StoreError::Newer { .. }
            | StoreError::Sqlite(_) => false,
        }
    }

    /// Whether the error is a unique-constraint violation (a duplicate name).
    pub fn is_unique_violation(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::Database(e)) if e.is_unique_violation())
    }
}

/// Result of a store call.
pub type StoreResult<T> = Result<T, StoreError>;

/// How long the start waits for a first connection the pool cannot open at once.
const START_PATIENCE: Duration = Duration::from_secs(15);

static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");
static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// The gateway's database handle. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    /// The usage rollups' and, on Postgres, the request logs' writes: on a SQLite file, a pool
    /// of its own with one connection, so each of its few statements is prepared once for the
    /// gateway's life instead of once on each of the pool's connections in turn (a 100-row
    /// insert's preparation costs as much as writing hundreds of rows); SQLite has one writer
    /// at a time anyway. Elsewhere the main pool.
    log_pool: AnyPool,
    /// The request logs' writes on a SQLite file ([`RequestLogStore::insert_logs`]).
    sqlite_logs: Option<sqlite_logs::SqliteLogs>,
    backend: Backend,
    /// The SQLite database file (none for Postgres or an in-memory database).
    sqlite_file: Option<PathBuf>,
    /// Whether the database answers, shared by every clone.
    health: Arc<Health>,
    /// The keys' last-used stamps this gateway wrote (`request_logs::LastUsedStamps`).
    last_used: Arc<LastUsedStamps>,
    /// What places the rollups' horizon ([`Store::rollup_horizon`]).
    rollup_timing: usage_rollup::RollupTiming,
    /// The runtime the store was opened on, which drives its connections ([`Store::at_home`]).
    home: tokio::runtime::Handle,
}

/// `host:port` of a Postgres URL, for log lines (never the user or password).
fn database_host(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or_default().to_owned()
}

/// Opens `path` (created if missing) and locks it exclusively, waiting while another process or
/// another open file holds it.
#[expect(
    clippy::incompatible_msrv,
    reason = "`File::lock` is std's file lock (Rust 1.89); the declared rust-version is stale: \
              the crate's let chains already need 1.88"
)]
fn lock_file(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            tracing::info!(
                file = %path.display(),
                "another gateway is starting on this database; waiting for it to finish"
            );
            file.lock()?;
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    Ok(file)
}

/// How long the first connection to Postgres may take at start.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens one connection to the Postgres at `url` and closes it again: a pool would only say
/// "timed out" after its acquire wait, where this names the server and the real cause (connection
/// refused, an unknown host, a wrong password, a missing database) at once.
async fn probe_postgres(url: &str) -> StoreResult<()> {
    use sqlx::Connection;
    let options = sqlx::postgres::PgConnectOptions::from_str(url)?;
    let server = format!(
        "Postgres at {}:{} (database {:?}, user {:?})",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or(options.get_username()),
        options.get_username()
    );
    let cause = match tokio::time::timeout(PROBE_TIMEOUT, sqlx::PgConnection::connect_with(&options)).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            return Ok(());
        }
        Ok(Err(sqlx::Error::Io(e))) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            format!("{e}; is the server running and listening there?")
        }
        Ok(Err(sqlx::Error::Io(e))) => e.to_string(),
        Ok(Err(sqlx::Error::Database(e))) => e.message().to_owned(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!(
            "no answer within {} s (a wrong host, or a firewall dropping the packets?)",
            PROBE_TIMEOUT.as_secs()
        ),
    };
    Err(StoreError::Unreachable { server, cause })
}

/// The start lock of a database ([`Store::start_lock`]); dropping it releases it too.
#[must_use = "the lock is released when this is dropped"]
pub struct StartLock(Held);

enum Held {
    Postgres(sqlx::AnyConnection),
    SqliteFile(std::fs::File),
    Nothing,
}

impl StartLock {
    /// Releases the lock: the next gateway waiting for it goes on.
    pub async fn release(self) {
        match self.0 {
            Held::Postgres(conn) => {
                use sqlx::Connection;
                // Ending the session releases its advisory locks; if the goodbye fails, the
                // server notices the closed socket and releases them all the same.
                let _ = conn.close().await;
            }
            Held::SqliteFile(file) => drop(file),
            Held::Nothing => {}
        }
    }
}

impl Store {
    /// Connects to `url` (`sqlite://…`, created if missing, WAL; or `postgres://…`) and applies
    /// the migrations of that backend under the start lock.
    pub async fn connect(url: &str) -> StoreResult<Store> {
        let store = Store::open(url).await?;
        let lock = store.start_lock().await?;
        store.migrate().await?;
        lock.release().await;
        Ok(store)
    }

    /// Connects to `url` without applying migrations: the gateway's start takes the start lock
    /// first and migrates under it. A Postgres pool of
    /// [`crate::config::DEFAULT_POSTGRES_CONNECTIONS`].
    pub async fn open(url: &str) -> StoreResult<Store> {
        Store::open_with(url, crate::config::DEFAULT_POSTGRES_CONNECTIONS).await
    }

    /// [`Store::open`] with a Postgres pool of at most `postgres_connections` (the setting
    /// `database_max_connections`); SQLite keeps its own four.
    pub async fn open_with(url: &str, postgres_connections: u32) -> StoreResult<Store> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else {
            Backend::Postgres
        };
        let sqlite_file = match backend {
            Backend::Sqlite => Some(crate::config::sqlite_path(url))
                .filter(|p| !p.is_empty() && !p.starts_with(":memory:") && !url.contains("mode=memory"))
                .map(PathBuf::from),
            Backend::Postgres => None,
        };
        let url = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=rwc")
            }
            // TLS to Postgres only when the URL asks for it (`sslmode=require`, `verify-ca`,
            // `verify-full`): libpq's default `prefer` would use it whenever the server offers
            // it, unverified, and change what a connection costs without a word.
            Backend::Postgres if !url.contains("sslmode=") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}sslmode=disable")
            }
            _ => url.to_owned(),
        };
        if backend == Backend::Postgres {
            probe_postgres(&url).await?;
        }
        let options = AnyConnectOptions::from_str(&url)?
            .log_statements(tracing::log::LevelFilter::Trace)
            .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(1));
        // The health probe's own connection (store/health.rs): the pool's may all be busy.
        let probe = (backend == Backend::Postgres).then(|| options.clone());
        let pool_options = AnyPoolOptions::new()
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        use sqlx::Executor;
                        // WAL with NORMAL sync: no fsync per commit, still never corrupt; a power
                        // loss may lose the last commits (the documented flush-interval bound).
                        conn.execute("PRAGMA synchronous = NORMAL").await?;
                        // Bounds the work of `PRAGMA optimize` on large tables ([`Store::optimize`]).
                        conn.execute("PRAGMA analysis_limit = 400").await?;
                        // A multi-row upsert's statement journal in memory, not spilled to a
                        // temporary file (bench/scale.py: 2 % of the CPU at 100,000 keys).
                        conn.execute("PRAGMA temp_store = MEMORY").await?;
                    }
                    Ok(())
                })
            })
            .max_connections(match backend {
                Backend::Sqlite => 4,
                Backend::Postgres => postgres_connections.max(1),
            })
            // A Postgres that went away fails a call in under a second, the answer included (the
            // pool retries a refused connection until then; the chaos run saw 1.05 s end to end
            // with a one-second limit on a loaded machine); SQLite's waits are for its own lock,
            // never an outage.
            .acquire_timeout(match backend {
                Backend::Sqlite => Duration::from_secs(10),
                Backend::Postgres => Duration::from_millis(750),
            });
        let pool = pool_options.clone().connect_with(options.clone()).await?;
        if backend == Backend::Sqlite {
            // WAL is a property of the file: set once, kept by every later connection.
            sqlx::query("PRAGMA journal_mode=WAL").execute(&pool).await?;
        }
        // An in-memory database is one per connection of the pool that opened it: it keeps one.
        let log_pool = match &sqlite_file {
            Some(_) => pool_options.max_connections(1).connect_with(options).await?,
            None => pool.clone(),
        };
        let sqlite_logs = match &sqlite_file {
            Some(file) => Some(sqlite_logs::SqliteLogs::open(file)?),
            None => None,
        };
        let target = match &sqlite_file {
            Some(file) => file.display().to_string(),
            None => database_host(&url),
        };
        Ok(Store {
            pool,
            log_pool,
            sqlite_logs,
            backend,
            sqlite_file,
            health: Arc::new(Health::new(target, probe)),
            last_used: Arc::default(),
            rollup_timing: usage_rollup::RollupTiming::default(),
            home: tokio::runtime::Handle::current(),
        })
    }

    /// The most connections the pool opens.
    pub fn max_connections(&self) -> u32 {
        self.pool.options().get_max_connections()
    }

    /// Whether the database has been migrated at all (by any version of aigw): a database
    /// without the migrations' table is new, and holds nothing a resources file could refer to.
    pub async fn has_schema(&self) -> StoreResult<bool> {
        let sql = match self.backend {
            Backend::Sqlite => {
                "SELECT CAST(COUNT(*) AS BIGINT) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'"
            }
            Backend::Postgres => {
                "SELECT CAST(COUNT(*) AS BIGINT) FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_name = '_sqlx_migrations'"
            }
        };
        let n: i64 = sqlx::query_scalar(sql).fetch_one(&self.pool).await?;
        Ok(n > 0)
    }

    /// How many of this build's migrations the database lacks (0 when it is up to date).
    pub async fn migrations_pending(&self) -> StoreResult<usize> {
        let expected = self
            .migrator()
            .iter()
            .filter(|m| m.migration_type.is_up_migration())
            .count();
        if !self.has_schema().await? {
            return Ok(expected);
        }
        let applied: i64 =
            sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM _sqlx_migrations WHERE success = TRUE")
                .fetch_one(&self.pool)
                .await?;
        Ok(expected.saturating_sub(usize::try_from(applied).unwrap_or(usize::MAX)))
    }

    /// Applies the migrations this build knows that the database lacks.
    pub async fn migrate(&self) -> StoreResult<()> {
        let mut conn = self.acquire_at_start().await?;
        match self.migrator().run(&mut *conn).await {
            Err(sqlx::migrate::MigrateError::VersionMissing(version)) => {
                return Err(StoreError::Newer { version });
            }
            other => other?,
        }
        drop(conn);
        // Migrations may have built indexes the planner has no statistics for yet.
        self.optimize().await;
        Ok(())
    }

    /// SQLite: `PRAGMA optimize`, which gathers the query planner's statistics (`ANALYZE`) of the
    /// tables and indexes that lack them or have changed much since, bounded by
    /// `analysis_limit`; as SQLite's documentation recommends for long-lived connections, at
    /// start (after the migrations), every hour, and at shutdown. Postgres analyzes by itself
    /// (autovacuum). A failure is logged: the statistics are only a hint to the planner.
    pub async fn optimize(&self) {
        if self.backend != Backend::Sqlite {
            return;
        }
        if let Err(e) = sqlx::query("PRAGMA optimize = 0x10002")
            .execute(self.pool())
            .await
        {
            tracing::warn!(error = %e, "PRAGMA optimize failed");
        }
    }

    /// A connection for the start's own work (the start lock, migrations): the pool's acquire
    /// timeout is short so that the request path fails fast in an outage, but a server slow to
    /// accept a connection at start (a busy Postgres) is waited for, up to [`START_PATIENCE`].
    async fn acquire_at_start(&self) -> StoreResult<sqlx::pool::PoolConnection<sqlx::Any>> {
        let deadline = tokio::time::Instant::now() + START_PATIENCE;
        loop {
            match self.pool.acquire().await {
                Err(sqlx::Error::PoolTimedOut) if tokio::time::Instant::now() < deadline => continue,
                other => return Ok(other?),
            }
        }
    }

    /// Takes the start lock of this database, waiting while another gateway holds it. Held
    /// around migrations, the resources file and the bootstrap owner, so that gateways started at
    /// the same instant on one database do that work one after another: the first creates, the
    /// others find everything in place.
    ///
    /// Postgres: a session advisory lock keyed by the schema, on a connection of its own that
    /// leaves the pool; the server releases it when that connection ends, so a gateway that dies
    /// while starting never leaves it held. SQLite: an exclusive lock on `<database>.lock` beside
    /// the file, released when the file closes (also at process exit).
    pub async fn start_lock(&self) -> StoreResult<StartLock> {
        match self.backend {
            Backend::Postgres => {
                let mut conn = self.acquire_at_start().await?.detach();
                // The key names the schema: gateways on other schemas of the server start freely.
                const KEY: &str = "hashtextextended('aigw:start:' || COALESCE(current_schema(), ''), 0)";
                let taken: bool = sqlx::query_scalar(&format!("SELECT pg_try_advisory_lock({KEY})"))
                    .fetch_one(&mut conn)
                    .await?;
                if !taken {
                    tracing::info!("another gateway is starting on this database; waiting for it to finish");
                    // `pg_advisory_lock` returns void, which the Any driver cannot decode.
                    sqlx::query_scalar::<_, i64>(&format!(
                        "SELECT CAST(1 AS BIGINT) FROM (SELECT pg_advisory_lock({KEY})) AS held"
                    ))
                    .fetch_one(&mut conn)
                    .await?;
                }
                Ok(StartLock(Held::Postgres(conn)))
            }
            Backend::Sqlite => {
                let Some(db) = self.sqlite_file.clone() else {
                    // An in-memory database belongs to this process alone.
                    return Ok(StartLock(Held::Nothing));
                };
                let mut name = db.into_os_string();
                name.push(".lock");
                let path = PathBuf::from(name);
                let file = tokio::task::spawn_blocking(move || lock_file(&path))
                    .await
                    .map_err(std::io::Error::other)
                    .and_then(|locked| locked)
                    .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
                Ok(StartLock(Held::SqliteFile(file)))
            }
        }
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

    /// The pool, for the aggregates' implementations in this module: SQL lives in `store/` only
    /// (the `sql_stays_in_the_store` test checks it). Only on the store's home runtime: a
    /// connection the pool opened on a serving thread would be driven by that thread's runtime,
    /// which ends with its last request, while the pool keeps the connection
    /// ([`Store::at_home`]).
    fn pool(&self) -> &AnyPool {
        debug_assert!(
            !self.away_from_home(),
            "the store was used away from its runtime (a serving thread?): go through Store::at_home"
        );
        &self.pool
    }

    /// The pool of the request logs' writes (the field `log_pool`), under the same rule as
    /// [`Store::pool`].
    fn log_pool(&self) -> &AnyPool {
        debug_assert!(!self.away_from_home(), "the store was used away from its runtime");
        &self.log_pool
    }

    /// Whether the caller runs on a runtime other than the one the store was opened on (a
    /// serving thread's); outside any runtime it is not away.
    fn away_from_home(&self) -> bool {
        tokio::runtime::Handle::try_current().is_ok_and(|here| here.id() != self.home.id())
    }

    /// Runs `work` on a clone of this store, on the runtime the store was opened on (the main
    /// one) when called from another (a serving thread's), in place otherwise. The database's connections are
    /// thus all opened and driven by the main runtime, which outlives every request; the hop
    /// between threads is paid only where the request path misses its caches (a key seen for the
    /// first time, a counter not yet loaded), by readiness probes and by the admin API.
    pub async fn at_home<T, Work>(&self, work: impl FnOnce(Store) -> Work) -> StoreResult<T>
    where
        T: Send + 'static,
        Work: Future<Output = StoreResult<T>> + Send + 'static,
    {
        let work = work(self.clone());
        if !self.away_from_home() {
            return work.await;
        }
        match self.home.spawn(work).await {
            Ok(done) => done,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(StoreError::Unavailable),
        }
    }

    /// Whether the database answers and every migration this build knows is applied.
    pub async fn ready(&self) -> bool {
        if !self.available() {
            return false;
        }
        let expected = self
            .migrator()
            .iter()
            .filter(|m| m.migration_type.is_up_migration())
            .count() as i64;
        // Through the health probe's connection: ready while the pooled ones are all busy.
        let applied = self
            .probe_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM _sqlx_migrations WHERE success = TRUE")
            .await;
        match applied {
            Ok(n) => n >= expected,
            Err(e) => {
                // The probe itself may be the first to find the database gone.
                self.note_failure(&e);
                false
            }
        }
    }

    /// The configuration epoch: bumped by every configuration change, polled by every gateway.
    pub async fn config_epoch(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT epoch FROM config_epoch WHERE id = 1")
            .fetch_one(self.pool())
            .await?)
    }

    /// Announces a configuration change to every gateway on this database.
    pub async fn bump_config_epoch(&self) -> StoreResult<()> {
        sqlx::query("UPDATE config_epoch SET epoch = epoch + 1 WHERE id = 1")
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Closes every connection (graceful shutdown).
    pub async fn close(&self) {
        self.optimize().await;
        if let Some(logs) = &self.sqlite_logs {
            logs.close();
        }
        self.log_pool.close().await;
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_of_any_size_make_few_statements() {
        let mut sizes = std::collections::BTreeSet::new();
        for n in 0..=1_234 {
            let rows: Vec<usize> = (0..n).collect();
            let chunks: Vec<&[usize]> = statements(&rows, NARROW_STATEMENT_ROWS).collect();
            assert_eq!(chunks.concat(), rows, "every row once, in order");
            sizes.extend(chunks.iter().map(|c| c.len()));
        }
        assert_eq!(sizes.into_iter().collect::<Vec<_>>(), [1, 5, 20, 100, 500]);
    }

    #[test]
    fn wide_rows_make_four_statements() {
        let rows: Vec<usize> = (0..347).collect();
        let sizes: Vec<usize> = statements(&rows, STATEMENT_ROWS).map(<[usize]>::len).collect();
        assert_eq!(sizes, [100, 100, 100, 20, 20, 5, 1, 1]);
    }
}
