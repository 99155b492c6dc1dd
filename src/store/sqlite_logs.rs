//! The request logs' writes on a SQLite file, through rusqlite on a blocking thread instead of
//! sqlx's `Any` driver. A log row binds 29 values; sqlx builds them as `Any` arguments, copies
//! them for its worker thread, looks each placeholder's name up and clears every binding after
//! the statement, which together cost about as much as SQLite's own binding (docs/performance.md,
//! "The budget"). Here each value is bound straight from its record into statements of the sqlx
//! path's fixed sizes, each prepared once for the connection's life. The statements and the
//! transaction are those of the sqlx path ([`super::RequestLogStore::insert_logs`]): the logs, the
//! keys' last-used stamps, the credentials' hourly figures, one commit.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, Value};
use rusqlite::{Connection, OpenFlags, Statement, ToSql, TransactionBehavior, params};

use super::credential_figures::{figures_of, upsert_one_sql};
use super::request_logs::{COLUMNS, LAST_USED_SQL, LAST_USED_STEP_MS, LOG_VALUES, LogValue};
use super::{LogRecord, STATEMENT_ROWS, StoreError, StoreResult, statements};

/// The log writer's own connection to the SQLite file (SQLite has one writer at a time anyway);
/// none once closed.
#[derive(Clone, Debug)]
pub(super) struct SqliteLogs(Arc<Mutex<Option<Connection>>>);

impl SqliteLogs {
    /// Opens `file` as sqlx's connections do: a busy wait of 5 s for the write lock, `NORMAL`
    /// sync (WAL is the file's, set at the store's start), foreign keys checked.
    pub fn open(file: &Path) -> rusqlite::Result<SqliteLogs> {
        let conn = Connection::open_with_flags(
            file,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        Ok(SqliteLogs(Arc::new(Mutex::new(Some(conn)))))
    }

    /// Closes the connection (at the store's close, before the pools: the last connection to a
    /// WAL file folds the log into the file, so that the file alone holds everything).
    pub fn close(&self) {
        if let Some(conn) = self.0.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = conn.close();
        }
    }

    /// Writes `records`, the keys' stamps `last_used` (key, ts) and the credentials' figures of
    /// `records` in one transaction, on a blocking thread.
    pub async fn insert(&self, records: Arc<[LogRecord]>, last_used: Vec<(i64, i64)>) -> StoreResult<()> {
        let conn = Arc::clone(&self.0);
        let written = tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            conn.as_mut().map(|conn| write(conn, &records, &last_used))
        })
        .await;
        match written {
            Ok(Some(result)) => Ok(result?),
            // Closed: the gateway is stopping.
            Ok(None) => Err(StoreError::Unavailable),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down: the write was not even started.
            Err(_) => Err(StoreError::Unavailable),
        }
    }
}

fn write(conn: &mut Connection, records: &[LogRecord], last_used: &[(i64, i64)]) -> rusqlite::Result<()> {
    // IMMEDIATE: the write lock is waited for (busy timeout) at the start, never refused midway.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        // Statements of the sqlx path's fixed sizes: SQLite writes the rows of one statement
        // with its cursors kept where the last row went, where one-row statements would seek
        // the table and each index from the root for every row (measured: a third more).
        let row = format!("({})", vec!["?"; LOG_VALUES].join(", "));
        for chunk in statements(records, STATEMENT_ROWS) {
            let values = vec![row.as_str(); chunk.len()].join(", ");
            // OR ROLLBACK: a failed row undoes the whole batch (retried whole), so SQLite keeps
            // no statement journal: with many keys each row's index pages are new to the
            // statement, and the journal of them spilled to a temporary file (bench/scale.py:
            // a tenth of the gateway's CPU at 100,000 keys).
            let mut insert = tx.prepare_cached(&format!(
                "INSERT OR ROLLBACK INTO request_logs ({COLUMNS}) VALUES {values}"
            ))?;
            for (i, r) in chunk.iter().enumerate() {
                bind_log(&mut insert, i * LOG_VALUES, r)?;
            }
            insert.raw_execute()?;
        }
        // In key order, as on the sqlx path.
        let mut stamp = tx.prepare_cached(LAST_USED_SQL)?;
        for &(key_id, ts) in last_used {
            stamp.execute(params![ts, key_id, ts.saturating_sub(LAST_USED_STEP_MS)])?;
        }
        // The rows every gateway's batches share, last (see the sqlx path).
        let mut add = tx.prepare_cached(&upsert_one_sql())?;
        for ((workspace, hour, credential), f) in figures_of(records) {
            add.execute(params![
                workspace, hour, credential, f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]
            ])?;
        }
    }
    tx.commit()
}

/// Binds `r` to the statement's values after the first `before`, in [`COLUMNS`]' order.
fn bind_log(st: &mut Statement<'_>, before: usize, r: &LogRecord) -> rusqlite::Result<()> {
    for (i, value) in r.values().iter().enumerate() {
        st.raw_bind_parameter(before + i + 1, value)?;
    }
    Ok(())
}

impl ToSql for LogValue<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        match *self {
            LogValue::Int(n) => Ok(ToSqlOutput::from(n)),
            LogValue::OptInt(n) => Ok(n.map_or(ToSqlOutput::Owned(Value::Null), ToSqlOutput::from)),
            LogValue::Text(t) => Ok(ToSqlOutput::from(t)),
            LogValue::OptText(t) => Ok(t.map_or(ToSqlOutput::Owned(Value::Null), ToSqlOutput::from)),
        }
    }
}
