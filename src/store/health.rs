//! Whether the database answers, as the gateway's own calls and its health probe find it.
//!
//! An outage begins with the first call that finds the database out of reach and ends with the
//! next answer of the health probe (the configuration poll, every half second). While it lasts
//! the request path serves from memory and does not wait on the database at all; the outage and
//! the recovery are each logged once.
//!
//! A database that is busy is not out of reach: when every connection of the pool is open and
//! in use (flushes of several gateways queued on the same row locks, say), a call that waited
//! past the pool's acquire timeout fails, and is retried or served from memory like an
//! unreachable one, but no outage begins. The probe reads over a connection of its own, so it
//! is never queued behind the pool: it still finds a database that stopped answering while every
//! pooled connection was waiting on it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use sqlx::ConnectOptions;
use sqlx::any::AnyConnectOptions;

use super::{Store, StoreError, StoreResult};

/// The state shared by every clone of a [`Store`].
#[derive(Debug)]
pub(super) struct Health {
    /// When the outage began (ms since the Unix epoch); 0 while the database answers.
    down_since_ms: AtomicI64,
    /// When a busy pool was last logged (ms since the Unix epoch).
    busy_logged_ms: AtomicI64,
    /// `host:port` (Postgres) or the file (SQLite): named in the outage's log lines.
    target: String,
    /// The probe's own connection (Postgres); none for SQLite, which is read through the pool
    /// (it is embedded: it never goes away, and an in-memory database exists only in the pool).
    probe: Option<Probe>,
}

impl Health {
    /// Healthy, naming `target` in log lines; probing over a connection of its own made with
    /// `probe` (Postgres).
    pub(super) fn new(target: String, probe: Option<AnyConnectOptions>) -> Health {
        Health {
            down_since_ms: AtomicI64::new(0),
            busy_logged_ms: AtomicI64::new(0),
            target,
            probe: probe.map(|options| Probe {
                options,
                conn: tokio::sync::Mutex::new(None),
            }),
        }
    }
}

/// How long the probe waits for its answer, a new connection included: longer than a loaded
/// database takes to answer one small read, short enough that an outage hidden behind a busy
/// pool is found within a few seconds.
const PROBE_PATIENCE: Duration = Duration::from_secs(2);

/// How often a busy pool is logged at most.
const BUSY_LOG_EVERY_MS: i64 = 10_000;

/// The health probe's connection, opened when first needed and again after any failure.
struct Probe {
    options: AnyConnectOptions,
    conn: tokio::sync::Mutex<Option<sqlx::AnyConnection>>,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe").finish_non_exhaustive()
    }
}

impl Probe {
    async fn scalar(&self, sql: &'static str) -> StoreResult<i64> {
        let mut slot = self.conn.lock().await;
        let answer = tokio::time::timeout(PROBE_PATIENCE, async {
            if slot.is_none() {
                *slot = Some(self.options.connect().await?);
            }
            match slot.as_mut() {
                Some(conn) => sqlx::query_scalar(sql).fetch_one(conn).await,
                None => Err(sqlx::Error::PoolClosed),
            }
        })
        .await;
        match answer {
            Ok(Ok(epoch)) => Ok(epoch),
            Ok(Err(e)) => {
                *slot = None;
                Err(e.into())
            }
            Err(_) => {
                // The connection may be stuck mid-answer: a new one next time.
                *slot = None;
                Err(StoreError::Database(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no answer to the health probe within {} s",
                        PROBE_PATIENCE.as_secs()
                    ),
                ))))
            }
        }
    }
}

/// Whether failure `e` begins an outage, given whether every connection of the pool was open
/// when it happened: a pool that timed out with all its connections open timed out because they
/// were busy (the database accepted every one of them), not because it could not open one.
fn begins_outage(e: &StoreError, pool_full: bool) -> bool {
    e.is_unreachable() && !(pool_full && matches!(e, StoreError::Database(sqlx::Error::PoolTimedOut)))
}

impl Store {
    /// The configuration epoch, read as the database's health probe (the configuration poll).
    pub async fn probe_epoch(&self) -> StoreResult<i64> {
        self.probe_scalar("SELECT epoch FROM config_epoch WHERE id = 1")
            .await
    }

    /// Reads one number as a health probe: over a connection of its own on Postgres (never
    /// queued behind busy pooled connections), with a time limit; through the pool on SQLite.
    pub(super) async fn probe_scalar(&self, sql: &'static str) -> StoreResult<i64> {
        match &self.health.probe {
            Some(probe) => probe.scalar(sql).await,
            None => Ok(sqlx::query_scalar(sql).fetch_one(self.pool()).await?),
        }
    }

    /// Whether every connection the pool may hold is open.
    fn pool_full(&self) -> bool {
        self.pool.size() >= self.pool.options().get_max_connections()
    }

    /// Whether the database answered the last calls: while it does not, the request path serves
    /// from memory and what needs the database fails at once with [`StoreError::Unavailable`].
    pub fn available(&self) -> bool {
        self.health.down_since_ms.load(Ordering::Relaxed) == 0
    }

    /// `Err(Unavailable)` at once while the database is known to be out of reach.
    pub fn fail_fast(&self) -> StoreResult<()> {
        if self.available() {
            Ok(())
        } else {
            Err(StoreError::Unavailable)
        }
    }

    /// Notes a failed call. Returns whether it was a failure to reach the database (out of reach,
    /// or every pooled connection busy past the acquire timeout), which the caller may retry or
    /// serve from memory, and which it does not log itself. An unreachable database marks the
    /// store down (logged once, when the outage begins); a busy pool does not (logged at most
    /// every 10 s).
    pub fn note_failure(&self, e: &StoreError) -> bool {
        if !e.is_unreachable() {
            return false;
        }
        let now = chrono::Utc::now().timestamp_millis().max(1);
        if !begins_outage(e, self.pool_full()) {
            let last = self.health.busy_logged_ms.load(Ordering::Relaxed);
            if now - last >= BUSY_LOG_EVERY_MS
                && self
                    .health
                    .busy_logged_ms
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                tracing::warn!(
                    database = %self.health.target,
                    error = %e,
                    "database busy: every pooled connection was in use past the acquire \
                     timeout; the call is retried or served from memory (not an outage)"
                );
            }
            return true;
        }
        if self
            .health
            .down_since_ms
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::error!(
                database = %self.health.target,
                error = %e,
                "database unreachable: serving keys, policies and routes from memory; \
                 what needs the database answers 503 store_unavailable; counts are kept for later"
            );
        }
        true
    }

    /// Notes a call that succeeded: ends an outage (logged once, with its length).
    pub fn note_success(&self) {
        let since = self.health.down_since_ms.swap(0, Ordering::Relaxed);
        if since != 0 {
            let secs = (chrono::Utc::now().timestamp_millis() - since).max(0) as f64 / 1000.0;
            tracing::warn!(
                database = %self.health.target,
                outage_secs = secs,
                "database reachable again: writing what was counted meanwhile"
            );
        }
    }

    /// Logs a failed background call as `what`, unless the database is out of reach (the outage
    /// is logged once, when it begins).
    pub fn log_failure(&self, e: &StoreError, what: &str) {
        if !self.note_failure(e) {
            tracing::warn!(error = %e, "{what}");
        }
    }

    /// Runs `write` until it is written: while the database is out of reach it is retried, with
    /// waits from 100 ms doubling to 5 s, so that what was learned during an outage (a lock, a
    /// breaker trip) reaches the store when it is back. A refusal is logged and not retried. Once
    /// `stop` is cancelled (shutdown) it gets five more tries, then the loss is logged.
    pub async fn write_until_done<F, Fut>(
        &self,
        what: &str,
        stop: &tokio_util::sync::CancellationToken,
        mut write: F,
    ) where
        F: FnMut() -> Fut,
        Fut: Future<Output = StoreResult<()>>,
    {
        let mut wait = Duration::from_millis(100);
        let mut tries_after_stop = 0;
        loop {
            let e = match write().await {
                Ok(()) => return,
                Err(e) => e,
            };
            if !self.note_failure(&e) {
                tracing::error!(error = %e, "{what}: the database refused it");
                return;
            }
            if stop.is_cancelled() {
                tries_after_stop += 1;
                if tries_after_stop >= 5 {
                    tracing::error!(error = %e, "{what}: lost, the database stayed unreachable until shutdown");
                    return;
                }
            }
            // At shutdown the remaining tries come a little apart, not minutes.
            let pause = if stop.is_cancelled() {
                Duration::from_millis(200)
            } else {
                wait
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = stop.cancelled(), if !stop.is_cancelled() => {}
            }
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_timeout_with_every_connection_open_is_not_an_outage() {
        let timed_out = || StoreError::Database(sqlx::Error::PoolTimedOut);
        let refused = || StoreError::Database(sqlx::Error::Io(std::io::ErrorKind::ConnectionRefused.into()));
        // (failure, every connection of the pool open, begins an outage)
        let cases = [
            (timed_out(), true, false),
            (timed_out(), false, true),
            (refused(), true, true),
            (refused(), false, true),
            (StoreError::Unavailable, true, true),
            (StoreError::Corrupt("x".into()), false, false),
        ];
        for (e, full, want) in cases {
            assert_eq!(begins_outage(&e, full), want, "{e} with the pool full = {full}");
        }
    }
}
