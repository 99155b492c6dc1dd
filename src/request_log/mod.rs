//! Request logs (DESIGN.md §7): written in batches by a background task, never on the request
//! path; queried with filters and cursor pagination; pruned by a retention task.
//!
//! The logs waiting for the writer are bounded in bytes (`max_log_queue_bytes`, [`LogQueue`]):
//! while the database takes none (an outage) or fewer than are served (SQLite's one writer at
//! its limit), the queue grows to the bound and a log past it is dropped and counted
//! (`aigw_request_logs_dropped_total`), with one warning per episode. A request never waits for
//! the queue (no back-pressure on the request path), and what a dropped log loses is that log
//! and its share of the usage report's rollups, which are the sums of the stored logs
//! (`store::usage_rollup`); quota counters, breaker windows and own-limit counts are kept apart
//! from the logs and lose nothing.
//!
//! The rollups' sums of the stored logs are held by the writer and written once per
//! `rollup_interval_ms` ([`start_writer`]), or sooner once they hold [`ROLLUP_ROWS_HELD`] rows:
//! a failed write keeps them for the next, a graceful stop writes them, a kill loses them (at
//! most one interval's; the logs are complete).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::kernel::clock::Clock;
use crate::store::{
    AlertStore, Backend, DAY_MS, PRUNE_BATCH, RequestLogStore, RollupSums, Store, StoreResult, day_of,
};
pub use crate::store::{LogFilter, LogPage, LogRecord};

/// Most rows one flush collects. On SQLite, where one writer takes its turn at the file's lock,
/// a large batch costs less a row: with 100,000 keys each row dirties a page of every by-key
/// index and rollup, and the more rows a batch has, the more of them share pages. bench/scale.py
/// measured 7,340 logs written a second with 10,000-row batches against 4,335 with 2,000, and
/// 45 against 63 KiB written a request (`python3 bench/scale.py`). On Postgres a batch also holds
/// locks on rollup rows that every gateway's batches share (docs/scaling.md): kept at 2,000,
/// where it was measured.
fn flush_max(backend: Backend) -> usize {
    match backend {
        Backend::Sqlite => 10_000,
        Backend::Postgres => 2_000,
    }
}

/// Rollup rows the writer's sums hold at most before they are written, ahead of the interval.
/// A row is kept per (member, key, model) a day, so with many keys and models nearly every
/// request adds one: after bench/scale.py's random-key load (100 models) the sums were the
/// largest live allocation (heaptrack, 20,000 keys: 12 of the 37 MB live, about 200 bytes a
/// row), growing with the requests of an interval. 50,000 rows hold about 10 MiB; writing them
/// early costs no upsert the interval would have saved, as so many rows are nearly all distinct,
/// and a gateway whose rows merge (few keys and models) never reaches it.
pub const ROLLUP_ROWS_HELD: usize = 50_000;

/// Whether the rollups' sums are written now: their interval ended (`due_ms`), or they hold
/// [`ROLLUP_ROWS_HELD`] rows.
fn rollups_due(now_ms: i64, due_ms: i64, sums: &RollupSums) -> bool {
    now_ms >= due_ms || sums.rows() >= ROLLUP_ROWS_HELD
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

/// The memory a queued record holds: the record, each string's allocation, and the allocator's
/// bookkeeping of each (an estimate within a few percent of what the process grows by).
pub fn queued_bytes(r: &LogRecord) -> usize {
    const PER_ALLOCATION: usize = 16;
    let strings = [&r.request_id, &r.endpoint, &r.attempts_detail, &r.explanation];
    let optional = [
        &r.model_requested,
        &r.model_served,
        &r.code,
        &r.source,
        &r.client_ip,
        &r.would_refuse,
        &r.tags,
        &r.end_user,
    ];
    std::mem::size_of::<LogRecord>()
        + strings
            .iter()
            .map(|s| s.capacity() + PER_ALLOCATION)
            .sum::<usize>()
        + optional
            .iter()
            .filter_map(|s| s.as_ref())
            .map(|s| s.capacity() + PER_ALLOCATION)
            .sum::<usize>()
}

/// The bytes the queued logs hold, against their bound; what was dropped past it.
#[derive(Debug)]
pub struct LogQueue {
    /// `max_log_queue_bytes`.
    max: usize,
    /// Bytes of the records queued or being written.
    bytes: AtomicUsize,
    /// Records dropped at the bound since the start (`aigw_request_logs_dropped_total`).
    dropped: AtomicU64,
    /// Dropped since the warning of the episode under way, which ends once the queue is below
    /// half the bound.
    dropping: AtomicU64,
    /// Whether an episode is under way (warned once).
    full: AtomicBool,
}

impl LogQueue {
    /// A queue of at most `max` bytes.
    pub fn new(max: usize) -> LogQueue {
        LogQueue {
            max,
            bytes: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            dropping: AtomicU64::new(0),
            full: AtomicBool::new(false),
        }
    }

    /// Takes `cost` bytes for a record, or counts it dropped when they would pass the bound
    /// (warning at the first drop of an episode).
    pub fn admit(&self, cost: usize) -> bool {
        let before = self.bytes.fetch_add(cost, Ordering::Relaxed);
        if before.saturating_add(cost) <= self.max {
            return true;
        }
        self.bytes.fetch_sub(cost, Ordering::Relaxed);
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.dropping.fetch_add(1, Ordering::Relaxed);
        if !self.full.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max_bytes = self.max,
                queued_bytes = before,
                "request log queue full: the database is not taking logs as fast as requests end; \
                 request logs are dropped and counted (aigw_request_logs_dropped_total) until it \
                 catches up; quota counters are not affected"
            );
        }
        false
    }

    /// Gives back `cost` bytes of records written (or given up); ends an episode of drops once
    /// the queue is below half its bound, saying how many it dropped.
    pub fn release(&self, cost: usize) {
        let after = self.bytes.fetch_sub(cost, Ordering::Relaxed).saturating_sub(cost);
        if after < self.max / 2 && self.full.swap(false, Ordering::Relaxed) {
            let dropped = self.dropping.swap(0, Ordering::Relaxed);
            tracing::warn!(
                dropped,
                "request log queue below half its bound again; {dropped} request logs were dropped"
            );
        }
    }

    /// Bytes queued now (`aigw_log_queue_bytes`).
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Records dropped since the start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The sending side: cheap, synchronous, never blocks the request path.
#[derive(Clone)]
pub struct LogSink {
    tx: mpsc::UnboundedSender<LogRecord>,
    /// Requests to write what is queued now; answered once it is written.
    flush_tx: mpsc::UnboundedSender<oneshot::Sender<()>>,
    depth: Arc<AtomicI64>,
    queue: Arc<LogQueue>,
}

impl LogSink {
    /// Queues a record for the writer, unless the queue is at its bound (then it is dropped and
    /// counted).
    pub fn send(&self, record: LogRecord) {
        let cost = queued_bytes(&record);
        if !self.queue.admit(cost) {
            return;
        }
        if self.tx.send(record).is_ok() {
            self.depth.fetch_add(1, Ordering::Relaxed);
        } else {
            self.queue.release(cost);
        }
    }

    /// Records queued and not yet written (`aigw_log_queue_depth`, read when scraped).
    pub fn queued(&self) -> i64 {
        self.depth.load(Ordering::Relaxed)
    }

    /// The queue's bytes and drops.
    pub fn queue(&self) -> &LogQueue {
        &self.queue
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
/// The queue holds at most `max_queue_bytes` ([`LogQueue`]).
///
/// The usage rollups' sums of the stored logs are kept in memory ([`RollupSums`]) and written
/// once every `rollup_interval` by `clock` ([`write_rollups`]), and at `stop`: a rollup row is
/// written once per interval, however many batches added to it.
pub fn start_writer(
    store: Store,
    clock: Clock,
    intervals: WriterIntervals,
    max_queue_bytes: usize,
    stop: CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> LogSink {
    let WriterIntervals {
        flush: flush_interval,
        rollup: rollup_interval,
    } = intervals;
    let (tx, mut rx) = mpsc::unbounded_channel::<LogRecord>();
    let (flush_tx, mut flush_rx) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
    let depth = Arc::new(AtomicI64::new(0));
    let queue = Arc::new(LogQueue::new(max_queue_bytes));
    let d = Written {
        depth: depth.clone(),
        queue: queue.clone(),
    };
    tasks.spawn(async move {
        let (max, writers) = (flush_max(store.backend()), writers(store.backend()));
        let rollup_ms = i64::try_from(rollup_interval.as_millis()).unwrap_or(i64::MAX);
        let mut batch = Vec::new();
        let mut rollups = RollupSums::default();
        let mut next_rollup = clock.now_ms().saturating_add(rollup_ms);
        loop {
            // Callers of `flush` to answer once this round is written.
            let mut waiting = Vec::new();
            // Sums waiting are written when their interval ends, even if no log comes.
            let until_due = u64::try_from(next_rollup.saturating_sub(clock.now_ms())).unwrap_or(0);
            tokio::select! {
                r = rx.recv() => match r {
                    Some(first) => batch.push(first),
                    None => break,
                },
                Some(done) = flush_rx.recv() => waiting.push(done),
                () = tokio::time::sleep(Duration::from_millis(until_due)), if !rollups.is_empty() => {},
                () = stop.cancelled() => break,
            }
            if waiting.is_empty() && !batch.is_empty() {
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
                    if let Some(sums) = writing.next().await {
                        rollups.merge(sums);
                    }
                }
                if !full {
                    break;
                }
                // A backlog can last longer than the interval: the sums are due all the same
                // (the reports count on them two intervals on), after the batches in flight.
                if rollups_due(clock.now_ms(), next_rollup, &rollups) {
                    while let Some(sums) = writing.next().await {
                        rollups.merge(sums);
                    }
                    write_rollups(&store, &mut rollups, 1).await;
                    next_rollup = clock.now_ms().saturating_add(rollup_ms);
                }
            }
            while let Some(sums) = writing.next().await {
                rollups.merge(sums);
            }
            if rollups_due(clock.now_ms(), next_rollup, &rollups) {
                write_rollups(&store, &mut rollups, 1).await;
                next_rollup = clock.now_ms().saturating_add(rollup_ms);
            }
            for done in waiting {
                let _ = done.send(());
            }
        }
        // Shutdown: the server has stopped taking requests; write what is still queued, then
        // the rollups' sums.
        rx.close();
        while let Some(r) = rx.recv().await {
            batch.push(r);
        }
        if !batch.is_empty() {
            rollups
                .merge(write_batch(&store, std::mem::take(&mut batch), &d, &CancellationToken::new()).await);
        }
        write_rollups(&store, &mut rollups, 5).await;
    });
    LogSink {
        tx,
        flush_tx,
        depth,
        queue,
    }
}

/// How often the writer writes: the logs (`flush_interval_ms`) and the rollups' sums
/// (`rollup_interval_ms`).
#[derive(Clone, Copy, Debug)]
pub struct WriterIntervals {
    /// The wait between a first record and its batch's write.
    pub flush: Duration,
    /// The longest the rollups' sums of stored logs are held before they are written.
    pub rollup: Duration,
}

/// Writes the rollups' sums in one transaction, in up to `attempts` tries (a pause between two),
/// and empties them; when every try failed (the database away), they are kept, and the logs
/// stored meanwhile add to them, for the next write. Given up on only at a stop, said once.
async fn write_rollups(store: &Store, rollups: &mut RollupSums, attempts: u32) {
    if rollups.is_empty() {
        return;
    }
    let mut wait = Duration::from_millis(100);
    for attempt in 1..=attempts {
        match crate::observability::telemetry::timed_flush("usage_rollups", store.add_rollups(rollups)).await
        {
            Ok(()) => {
                *rollups = RollupSums::default();
                return;
            }
            Err(e) => {
                if !store.note_failure(&e) {
                    tracing::warn!(error = %e, rows = rollups.rows(), attempt, "usage rollup write failed; kept for the next one");
                }
                if attempt < attempts {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
    if attempts > 1 {
        tracing::error!(
            rows = rollups.rows(),
            "the usage rollups' sums could not be written at the stop; the logs are stored, and \
             the usage report of their hours and days is short of them"
        );
    }
}

/// What the writer gives back as records leave the queue.
struct Written {
    depth: Arc<AtomicI64>,
    queue: Arc<LogQueue>,
}

/// Writes `batch`, retrying while the gateway runs; the rollups' sums of what was stored (none
/// when it was given up at a stop).
async fn write_batch(
    store: &Store,
    batch: Vec<LogRecord>,
    written: &Written,
    stop: &CancellationToken,
) -> RollupSums {
    let bytes: usize = batch.iter().map(queued_bytes).sum();
    // Shared with each try, which may run on a thread of its own (SQLite).
    let batch: Arc<[LogRecord]> = batch.into();
    let mut wait = Duration::from_millis(100);
    let mut sums = RollupSums::default();
    for attempt in 1.. {
        match crate::observability::telemetry::timed_flush(
            "request_logs",
            store.insert_logs(Arc::clone(&batch)),
        )
        .await
        {
            Ok(()) => {
                sums.add(&batch);
                break;
            }
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
                    written
                        .queue
                        .dropped
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    break;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
    written.depth.fetch_sub(batch.len() as i64, Ordering::Relaxed);
    written.queue.release(bytes);
    sums
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_takes_records_up_to_its_bound_and_counts_the_rest() {
        let q = LogQueue::new(1000);
        // (admit or release, bytes, admitted, queued after, dropped after, episode under way)
        let steps: &[(&str, usize, bool, usize, u64, bool)] = &[
            ("admit", 600, true, 600, 0, false),
            ("admit", 400, true, 1000, 0, false),
            ("admit", 1, false, 1000, 1, true),
            ("admit", 700, false, 1000, 2, true),
            ("release", 400, true, 600, 2, true),
            ("admit", 300, true, 900, 2, true),
            ("release", 500, true, 400, 2, false),
            ("admit", 2000, false, 400, 3, true),
            ("release", 400, true, 0, 3, false),
        ];
        for (i, (what, bytes, admitted, queued, dropped, full)) in steps.iter().enumerate() {
            let got = match *what {
                "admit" => q.admit(*bytes),
                _ => {
                    q.release(*bytes);
                    true
                }
            };
            assert_eq!(
                (got, q.bytes(), q.dropped(), q.full.load(Ordering::Relaxed)),
                (*admitted, *queued, *dropped, *full),
                "step {i}: {what} {bytes}"
            );
        }
    }

    #[test]
    fn a_records_bytes_count_its_strings() {
        let mut r = LogRecord::default();
        let bare = queued_bytes(&r);
        assert_eq!(bare, std::mem::size_of::<LogRecord>() + 4 * 16);
        r.attempts_detail = "x".repeat(1000);
        r.tags = Some("team=search".to_owned());
        assert!(queued_bytes(&r) >= bare + 1000 + 11 + 16, "{}", queued_bytes(&r));
    }

    #[test]
    fn rollups_are_written_at_their_interval_or_once_they_hold_their_bound() {
        // Each key's log adds rows of its own (the key's day, the member's key and model).
        let logs = |keys: i64| -> Vec<LogRecord> {
            (1..=keys)
                .map(|k| LogRecord {
                    key_id: k,
                    member_id: k,
                    workspace_id: 1,
                    model_requested: Some("m".to_owned()),
                    ..LogRecord::default()
                })
                .collect()
        };
        let few = RollupSums::of(&logs(10));
        // At least a row a key: as many keys as the bound reach it; an eighth of them do not.
        let many = RollupSums::of(&logs(ROLLUP_ROWS_HELD as i64));
        let below = RollupSums::of(&logs(ROLLUP_ROWS_HELD as i64 / 8));
        assert!(below.rows() < ROLLUP_ROWS_HELD, "{} rows", below.rows());
        // (now, due, sums, written now)
        let rows: &[(i64, i64, &RollupSums, bool)] = &[
            (0, 60_000, &few, false),
            (60_000, 60_000, &few, true),
            (0, 60_000, &below, false),
            (0, 60_000, &many, true),
            (70_000, 60_000, &many, true),
        ];
        for (i, (now, due, sums, want)) in rows.iter().enumerate() {
            assert_eq!(
                rollups_due(*now, *due, sums),
                *want,
                "row {i}: {} rows",
                sums.rows()
            );
        }
    }
}
