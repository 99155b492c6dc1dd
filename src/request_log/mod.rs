//! Request logs (DESIGN.md §7): written in batches by a background task, never on the request
//! path; queried with filters and cursor pagination; pruned by a retention task.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::store::{AlertStore, Backend, DAY_MS, PRUNE_BATCH, RequestLogStore, Store, StoreResult, day_of};
pub use crate::store::{LogFilter, LogPage, LogRecord};

/// Most rows one flush collects. On SQLite, where one writer takes its turn at the file's lock,
/// a large batch costs less a row: with 100,000 keys each row dirties a page of every by-key
/// index and rollup, and the more rows a batch has, the more of them share pages. bench/scale.py
/// measured 7,340 logs written a second with 10,000-row batches against 4,335 with 2,000, and
/// 45 against 63 KiB written a request (docs/performance.md). On Postgres a batch also holds
/// locks on rollup rows that every gateway's batches share (docs/scaling.md): kept at 2,000,
/// where it was measured.
fn flush_max(backend: Backend) -> usize {
    match backend {
        Backend::Sqlite => 10_000,
        Backend::Postgres => 2_000,
    }
}

/// Batches written at once. SQLite has one writer at a time. On Postgres a batch's transaction
/// runs in one server process, on one core, at 64–79 ms of its CPU per 1,000 logs: one batch at
/// a time stored 9,100–10,600 logs a second in bench/logs.py, less than one gateway serves; two
/// stored 15,700–17,100 (docs/performance.md, "The insert path at full throughput"). Their
/// rollup rows are taken in the same order, as between replicas.
fn writers(backend: Backend) -> usize {
    match backend {
        Backend::Sqlite => 1,
        Backend::Postgres => 2,
    }
}

/// The sending side: cheap, synchronous, never blocks the request path.
#[derive(Clone)]
pub struct LogSink {
    tx: mpsc::UnboundedSender<LogRecord>,
    /// Requests to write what is queued now; answered once it is written.
    flush_tx: mpsc::UnboundedSender<oneshot::Sender<()>>,
    depth: Arc<AtomicI64>,
}

impl LogSink {
    /// Queues a record for the writer.
    pub fn send(&self, record: LogRecord) {
        if self.tx.send(record).is_ok() {
            self.depth.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records queued and not yet written (`aigw_log_queue_depth`, read when scraped).
    pub fn queued(&self) -> i64 {
        self.depth.load(Ordering::Relaxed)
    }

    /// Writes every record queued before the call without waiting for the flush interval, and
    /// returns once they are written (at once when the writer has stopped).
    pub async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.flush_tx.send(done).is_ok() {
            let _ = written.await;
        }
    }
}

/// Starts the writer: woken by a first record, it lets one flush interval pass and then writes
/// everything queued, so a busy gateway writes a few large batches a second (and is woken as
/// often, not once per request) and an idle one nothing; at `stop` it writes what is left.
pub fn start_writer(
    store: Store,
    flush_interval: Duration,
    stop: CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> LogSink {
    let (tx, mut rx) = mpsc::unbounded_channel::<LogRecord>();
    let (flush_tx, mut flush_rx) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
    let depth = Arc::new(AtomicI64::new(0));
    let d = depth.clone();
    tasks.spawn(async move {
        let (max, writers) = (flush_max(store.backend()), writers(store.backend()));
        let mut batch = Vec::new();
        loop {
            // Callers of `flush` to answer once this round is written.
            let mut waiting = Vec::new();
            tokio::select! {
                r = rx.recv() => match r {
                    Some(first) => batch.push(first),
                    None => break,
                },
                Some(done) = flush_rx.recv() => waiting.push(done),
                () = stop.cancelled() => break,
            }
            if waiting.is_empty() {
                // The rest of the interval's records are taken when it ends, not one by one: a
                // waiting receiver would be woken by every request, from the request's thread.
                tokio::select! {
                    () = tokio::time::sleep(flush_interval) => {},
                    Some(done) = flush_rx.recv() => waiting.push(done),
                    () = stop.cancelled() => {},
                }
            }
            // Full batches while a backlog lasts, up to `writers` of them in flight; the round
            // ends when everything it took is written.
            let mut writing = FuturesUnordered::new();
            loop {
                while batch.len() < max {
                    match rx.try_recv() {
                        Ok(r) => batch.push(r),
                        Err(_) => break,
                    }
                }
                if batch.is_empty() {
                    break;
                }
                let full = batch.len() >= max;
                writing.push(write_batch(&store, std::mem::take(&mut batch), &d, &stop));
                if writing.len() >= writers {
                    writing.next().await;
                }
                if !full {
                    break;
                }
            }
            while writing.next().await.is_some() {}
            for done in waiting {
                let _ = done.send(());
            }
        }
        // Shutdown: the server has stopped taking requests; write what is still queued.
        rx.close();
        while let Some(r) = rx.recv().await {
            batch.push(r);
        }
        if !batch.is_empty() {
            write_with_retry(&store, &mut batch, &d, &CancellationToken::new()).await;
        }
    });
    LogSink { tx, flush_tx, depth }
}

async fn write_batch(store: &Store, mut batch: Vec<LogRecord>, depth: &AtomicI64, stop: &CancellationToken) {
    write_with_retry(store, &mut batch, depth, stop).await;
}

async fn write_with_retry(
    store: &Store,
    batch: &mut Vec<LogRecord>,
    depth: &AtomicI64,
    stop: &CancellationToken,
) {
    let mut wait = Duration::from_millis(100);
    for attempt in 1.. {
        match crate::telemetry::timed_flush("request_logs", store.insert_logs(batch)).await {
            Ok(()) => break,
            Err(e) => {
                if !store.note_failure(&e) {
                    tracing::warn!(error = %e, rows = batch.len(), attempt, "request log write failed; retrying");
                }
                // Keep retrying while running (the queue holds the rows); during shutdown give
                // the database a few more tries, then report the loss.
                if stop.is_cancelled() && attempt >= 5 {
                    tracing::error!(
                        rows = batch.len(),
                        "request logs could not be written and were dropped"
                    );
                    break;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
    depth.fetch_sub(batch.len() as i64, Ordering::Relaxed);
    batch.clear();
}

/// Starts the retention task: prunes at start and every hour, in batches of [`PRUNE_BATCH`]
/// rows with a pause between them, so that the log writer (and, on SQLite, every other writer)
/// gets the database between two batches however much there is to delete. The cutoff is a day
/// boundary (UTC): the usage rollups hold whole hours and days and are pruned with the logs they
/// sum, so logs are kept up to a day longer than `days`. After the logs, the budget alert history
/// goes by the same cutoff (what [`AlertStore::prune_alerts_batch`] keeps stays).
pub fn start_retention(
    store: Store,
    clock: Clock,
    days: u32,
    stop: CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) {
    tasks.spawn(async move {
        loop {
            let cutoff = day_of(clock.now_ms() - i64::from(days) * DAY_MS);
            let logs = prune_in_batches(&stop, "request log", |limit| {
                store.prune_logs_batch(cutoff, limit)
            })
            .await;
            let Some(logs) = logs else { return };
            if logs > 0 {
                tracing::info!(rows = logs, days, "pruned request logs past retention");
            }
            let alerts = prune_in_batches(&stop, "budget alert", |limit| {
                store.prune_alerts_batch(cutoff, limit)
            })
            .await;
            let Some(alerts) = alerts else { return };
            if alerts > 0 {
                tracing::info!(rows = alerts, days, "pruned budget alerts past retention");
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(3600)) => {},
                () = stop.cancelled() => break,
            }
        }
    });
}

/// Runs `batch` (one bounded delete of at most [`PRUNE_BATCH`] rows) until it deletes nothing or
/// fails, pausing between two; the rows deleted, or none when the gateway is stopping.
async fn prune_in_batches<F: Future<Output = StoreResult<u64>>>(
    stop: &CancellationToken,
    what: &str,
    mut batch: impl FnMut(i64) -> F,
) -> Option<u64> {
    let mut pruned = 0;
    loop {
        match batch(PRUNE_BATCH).await {
            Ok(0) => return Some(pruned),
            Ok(n) => pruned += n,
            Err(e) => {
                tracing::warn!(error = %e, "{what} retention failed");
                return Some(pruned);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(PRUNE_PAUSE) => {},
            () = stop.cancelled() => return None,
        }
    }
}

/// The pause between two retention batches.
const PRUNE_PAUSE: Duration = Duration::from_millis(20);
