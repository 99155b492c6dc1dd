//! The request logs' writes on a SQLite file, through rusqlite on a blocking thread instead of
//! sqlx's `Any` driver. A log row binds 29 values; sqlx builds them as `Any` arguments, copies
//! them for its worker thread, looks each placeholder's name up and clears every binding after
//! the statement, which together cost about as much as SQLite's own binding (docs/performance.md,
//! "The budget"). Here each value is bound straight from its record into statements of the sqlx
//! path's fixed sizes, each prepared once for the connection's life ([`LogInsert`]: text bound
//! without a copy). The statements and the transaction are those of the sqlx path
//! ([`super::RequestLogStore::insert_logs`]): the logs, the keys' last-used stamps, the
//! credentials' hourly figures, one commit.

use std::ffi::c_int;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, TransactionBehavior, ffi, params};

use super::credential_figures::{figures_of, upsert_one_sql};
use super::request_logs::{COLUMNS, LAST_USED_SQL, LAST_USED_STEP_MS, LOG_VALUES, LogValue};
use super::{LogRecord, STATEMENT_ROWS, StoreError, StoreResult, statements};

/// The log writer's own connection to the SQLite file (SQLite has one writer at a time anyway);
/// none once closed.
#[derive(Clone)]
pub(super) struct SqliteLogs(Arc<Mutex<Option<Writer>>>);

impl std::fmt::Debug for SqliteLogs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteLogs")
    }
}

/// The connection and its inserts of the logs, by rows. The inserts are declared first, so
/// that they are finalized before the connection closes (SQLite refuses to close a connection
/// whose statements are not).
struct Writer {
    inserts: Vec<LogInsert>,
    conn: Connection,
}

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
        Ok(SqliteLogs(Arc::new(Mutex::new(Some(Writer {
            inserts: Vec::new(),
            conn,
        })))))
    }

    /// Closes the connection (at the store's close, before the pools: the last connection to a
    /// WAL file folds the log into the file, so that the file alone holds everything).
    pub fn close(&self) {
        if let Some(Writer { inserts, conn }) = self.0.lock().unwrap_or_else(PoisonError::into_inner).take() {
            drop(inserts);
            let _ = conn.close();
        }
    }

    /// Writes `records`, the keys' stamps `last_used` (key, ts) and the credentials' figures of
    /// `records` in one transaction, on a blocking thread.
    pub async fn insert(&self, records: Arc<[LogRecord]>, last_used: Vec<(i64, i64)>) -> StoreResult<()> {
        let conn = Arc::clone(&self.0);
        let written = tokio::task::spawn_blocking(move || {
            let mut writer = conn.lock().unwrap_or_else(PoisonError::into_inner);
            writer
                .as_mut()
                .map(|w| write(&mut w.conn, &mut w.inserts, &records, &last_used))
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

fn write(
    conn: &mut Connection,
    inserts: &mut Vec<LogInsert>,
    records: &[LogRecord],
    last_used: &[(i64, i64)],
) -> rusqlite::Result<()> {
    // IMMEDIATE: the write lock is waited for (busy timeout) at the start, never refused midway.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        // Statements of the sqlx path's fixed sizes: SQLite writes the rows of one statement
        // with its cursors kept where the last row went, where one-row statements would seek
        // the table and each index from the root for every row (measured: a third more).
        for chunk in statements(records, STATEMENT_ROWS) {
            let at = match inserts.iter().position(|i| i.rows == chunk.len()) {
                Some(at) => at,
                None => {
                    inserts.push(LogInsert::prepare(&tx, chunk.len())?);
                    inserts.len() - 1
                }
            };
            inserts[at].run(&tx, chunk)?;
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

/// The insert of `rows` logs, prepared once for the connection's life, on SQLite's own API:
/// rusqlite copies every text it binds (`SQLITE_TRANSIENT`) and clears every binding when a
/// cached statement is put back, which cost about 2,000 instructions a request
/// (docs/performance.md, "The budget"). Used only under the writer's mutex, with its connection.
struct LogInsert {
    stmt: NonNull<ffi::sqlite3_stmt>,
    rows: usize,
}

// SAFETY: a statement belongs to its connection, which is opened without SQLite's own mutex and
// moves between threads with it: both are only ever used under the writer's mutex.
unsafe impl Send for LogInsert {}

impl LogInsert {
    fn prepare(conn: &Connection, rows: usize) -> rusqlite::Result<LogInsert> {
        let row = format!("({})", vec!["?"; LOG_VALUES].join(", "));
        // OR ROLLBACK: a failed row undoes the whole batch (retried whole), so SQLite keeps no
        // statement journal: with many keys each row's index pages are new to the statement,
        // and the journal of them spilled to a temporary file (bench/scale.py: a tenth of the
        // gateway's CPU at 100,000 keys).
        let sql = format!(
            "INSERT OR ROLLBACK INTO request_logs ({COLUMNS}) VALUES {}",
            vec![row.as_str(); rows].join(", ")
        );
        let len = c_int::try_from(sql.len()).map_err(|_| failure(ffi::SQLITE_TOOBIG))?;
        let mut stmt = std::ptr::null_mut();
        // SAFETY: the connection is open; `sql` is valid for `len` bytes and outlives the call.
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                conn.handle(),
                sql.as_ptr().cast(),
                len,
                ffi::SQLITE_PREPARE_PERSISTENT,
                &mut stmt,
                std::ptr::null_mut(),
            )
        };
        checked(conn, rc)?;
        let stmt = NonNull::new(stmt).ok_or_else(|| failure(ffi::SQLITE_MISUSE))?;
        Ok(LogInsert { stmt, rows })
    }

    /// Binds `records` (as many as the statement's rows) and runs the statement.
    fn run(&mut self, conn: &Connection, records: &[LogRecord]) -> rusqlite::Result<()> {
        debug_assert_eq!(records.len(), self.rows);
        let st = self.stmt.as_ptr();
        let mut at: c_int = 0;
        for r in records {
            for value in r.values() {
                at += 1;
                // SAFETY: `st` is this connection's prepared statement, `at` one of its
                // parameters. A text is bound `SQLITE_STATIC`, uncopied: SQLite reads a bound
                // value only while the statement steps, below, while `records` is borrowed; the
                // bindings left after the reset are never read, every parameter being bound
                // anew before the next step.
                let rc = unsafe {
                    match value {
                        LogValue::Int(n) | LogValue::OptInt(Some(n)) => ffi::sqlite3_bind_int64(st, at, n),
                        LogValue::OptInt(None) | LogValue::OptText(None) => ffi::sqlite3_bind_null(st, at),
                        LogValue::Text(t) | LogValue::OptText(Some(t)) => {
                            let len = c_int::try_from(t.len()).map_err(|_| failure(ffi::SQLITE_TOOBIG))?;
                            ffi::sqlite3_bind_text(st, at, t.as_ptr().cast(), len, ffi::SQLITE_STATIC())
                        }
                    }
                };
                checked(conn, rc)?;
            }
        }
        // SAFETY: as above; the reset makes the statement ready for its next run (its error,
        // if the step failed, is the step's).
        let (stepped, reset) = unsafe { (ffi::sqlite3_step(st), ffi::sqlite3_reset(st)) };
        match stepped {
            ffi::SQLITE_DONE => Ok(()),
            _ => checked(conn, reset).and(Err(failure(stepped))),
        }
    }
}

impl Drop for LogInsert {
    fn drop(&mut self) {
        // SAFETY: the statement was prepared and is finalized once, before its connection
        // closes (`Writer`'s field order, `SqliteLogs::close`).
        unsafe { ffi::sqlite3_finalize(self.stmt.as_ptr()) };
    }
}

/// `Ok` for `SQLITE_OK`, else the connection's error.
fn checked(conn: &Connection, rc: c_int) -> rusqlite::Result<()> {
    if rc == ffi::SQLITE_OK {
        return Ok(());
    }
    // SAFETY: the connection is open; SQLite's message is copied before any other call.
    let message = unsafe {
        let text = ffi::sqlite3_errmsg(conn.handle());
        (!text.is_null()).then(|| std::ffi::CStr::from_ptr(text).to_string_lossy().into_owned())
    };
    Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), message))
}

/// An error of code `rc` without SQLite's message.
fn failure(rc: c_int) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None)
}

#[cfg(test)]
mod tests {
    use super::super::request_logs::RequestLogStore;
    use super::super::{LogRecord, Store};

    /// Every statement size writes its rows' values as given, texts and nulls included; a batch
    /// one row of which SQLite refuses is written not at all, and the statements serve the next.
    #[tokio::test]
    async fn a_batch_is_written_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::connect(&format!("sqlite:{}", dir.path().join("logs.db").display()))
            .await
            .unwrap();
        let record = |i: i64| LogRecord {
            request_id: format!("r{i}"),
            ts: i,
            workspace_id: 1,
            model_requested: (i % 2 == 0).then(|| format!("model {i}")),
            explanation: "é".repeat(usize::try_from(i % 3).unwrap()),
            ttfb_ms: (i % 2 == 1).then_some(i),
            ..LogRecord::default()
        };
        // 126 rows: statements of 100, 20, 5 and 1.
        let first: Vec<LogRecord> = (0..126).map(record).collect();
        store.insert_logs(first.as_slice()).await.unwrap();
        sqlx::query(
            "CREATE TRIGGER refuse BEFORE INSERT ON request_logs WHEN NEW.request_id = 'r240' \
             BEGIN SELECT RAISE(ROLLBACK, 'refused by the test'); END",
        )
        .execute(store.pool())
        .await
        .unwrap();
        let second: Vec<LogRecord> = (126..252).map(record).collect();
        let refused = store.insert_logs(second.as_slice()).await.unwrap_err();
        assert!(refused.to_string().contains("refused by the test"), "{refused}");
        sqlx::query("DROP TRIGGER refuse")
            .execute(store.pool())
            .await
            .unwrap();
        store.insert_logs(second.as_slice()).await.unwrap();

        type Row = (String, i64, Option<String>, String, Option<i64>);
        let written: Vec<Row> = sqlx::query_as(
            "SELECT request_id, ts, model_requested, explanation, ttfb_ms FROM request_logs ORDER BY id",
        )
        .fetch_all(store.pool())
        .await
        .unwrap();
        let given: Vec<Row> = first
            .iter()
            .chain(&second)
            .map(|r| {
                (
                    r.request_id.clone(),
                    r.ts,
                    r.model_requested.clone(),
                    r.explanation.clone(),
                    r.ttfb_ms,
                )
            })
            .collect();
        assert_eq!(written, given);
    }
}
