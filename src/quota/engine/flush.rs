//! The quota counters' flush: this gateway's deltas written, the others' totals read back.

use chrono::{DateTime, Utc};

use super::{CounterKey, QuotaCounters};
use crate::store::{Backend, Store, StoreResult, UsageCounterRow, UsageStore};

impl QuotaCounters {
    /// Writes the deltas counted since the last flush with upserts that return each global
    /// total, all in one transaction, then (Postgres) reads back the counters the other
    /// gateways changed since the last read back ([`UsageStore::add_usage`]). Visits only the
    /// counters that counted something, and makes no store call at all when none did (SQLite)
    /// or none is held. Forgets counters whose own window has ended (in the zone it was aligned
    /// in) and that hold nothing unwritten. Returns how many counters were in the batch
    /// (written, or read back by key), or the error of the first one that was not written.
    ///
    /// Atomic per batch: a delta leaves `flushing` for `global` only once its transaction
    /// committed, and goes back to pending only when it rolled back — never lost, never added
    /// twice. No value can fail the batch: every delta is in `0..=i64::MAX` and the SQL saturates
    /// at `i64::MAX` on both backends (SQLite would turn an overflowing sum into a REAL,
    /// Postgres refuses it with "bigint out of range"). Should the database still refuse the
    /// batch, it is written row by row, so one row it refuses holds back only itself.
    pub async fn flush(&self, store: &Store, now: DateTime<Utc>) -> StoreResult<usize> {
        let mut read_horizon = self.flushing.lock().await;
        // Only the counters that counted something here since the last flush go in the batch:
        // an idle counter costs nothing (issue 40 item 4). On SQLite no other gateway changes
        // them; on Postgres the store reads back every counter the others changed since the
        // horizon. Postgres's first flush has no horizon yet: it reads back every live counter
        // by its key, once.
        let every_counter = read_horizon.is_none() && store.backend() == Backend::Postgres;
        let (mut batch, live) = {
            let mut guard = self.counters.lock().unwrap_or_else(|p| p.into_inner());
            let map = &mut *guard;
            map.move_relabeled();
            map.forget_ended(now);
            map.generation += 1;
            let mut batch: Vec<(CounterKey, i64)> = Vec::with_capacity(map.changed.len());
            let mut held = Vec::new();
            for key in std::mem::take(&mut map.changed) {
                let Some(c) = map.all.get_mut(&key) else { continue };
                if key.subject_id < 0 {
                    // A label first seen during an outage: written once it has its stored id
                    // ([`QuotaCounters::relabel`]).
                    held.push(key);
                    continue;
                }
                c.queued = false;
                let d = std::mem::take(&mut c.pending).max(0);
                c.flushing = d;
                if d != 0 {
                    batch.push((key, d));
                }
            }
            map.changed = held;
            if every_counter {
                batch.extend(
                    map.all
                        .iter()
                        .filter(|(k, c)| c.flushing == 0 && k.subject_id >= 0)
                        .map(|(k, _)| (k.clone(), 0)),
                );
            }
            (batch, !map.all.is_empty())
        };
        // Nothing to write, and (SQLite, or no counter held) nothing to read back: no store call.
        let reads_back = read_horizon.is_some() && live;
        if batch.is_empty() && !reads_back {
            return Ok(0);
        }
        // Rows are locked in one order by every gateway: two flushes on one Postgres never wait
        // on each other in a circle.
        batch.sort_by_cached_key(|(k, _)| {
            (
                k.subject.as_str(),
                k.subject_id,
                k.metric.as_str(),
                k.window.to_string(),
                k.start,
            )
        });
        let written = write(store, &batch, *read_horizon).await;
        if written.horizon.is_some() {
            *read_horizon = written.horizon;
        }
        let mut map = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        for (key, delta) in &batch {
            // Only a flush forgets counters, and this one holds the flush lock: every key is there.
            let Some(c) = map.all.get_mut(key) else { continue };
            if written.rolled_back.contains(key) {
                // Not written: back to pending for the next flush.
                c.pending = c.pending.saturating_add(std::mem::take(&mut c.flushing));
                if c.pending != 0 {
                    map.queue(key);
                }
            } else {
                // Committed (a row that came back unreadable was still written): the total
                // below, if one came back, replaces this.
                c.global = c.global.saturating_add(*delta);
                c.flushing = 0;
                if *delta != 0 {
                    map.alert(key);
                }
            }
        }
        // Every total learned, in order (a later one of a counter is newer), for the counters
        // this gateway holds; the others' are not kept.
        for (key, total) in &written.totals {
            if let Some(c) = map.all.get_mut(key) {
                let moved = c.global != *total;
                c.global = *total;
                c.known = true;
                if moved {
                    map.alert(key);
                }
            }
        }
        match written.error {
            Some(e) => Err(e),
            None => Ok(batch.len()),
        }
    }
}

/// What a flush wrote.
struct Written {
    /// The new global total of each counter written or read back; a later entry of a counter
    /// is newer.
    totals: Vec<(CounterKey, i64)>,
    /// Where the next flush reads back from, when this one read back in one go (Postgres).
    horizon: Option<i64>,
    /// The counters whose deltas were not written (their transaction rolled back).
    rolled_back: rustc_hash::FxHashSet<CounterKey>,
    /// The first error, if any counter was not written.
    error: Option<crate::store::StoreError>,
}

/// Writes `batch` in one transaction and reads back the others' totals changed since the
/// horizon `since` ([`UsageStore::add_usage`]); if the database refuses it (rather than being
/// out of reach), row by row, so that a row it refuses holds back only itself (each reading
/// back its own counter).
async fn write(store: &Store, batch: &[(CounterKey, i64)], since: Option<i64>) -> Written {
    let all_back = |e| Written {
        totals: Vec::new(),
        horizon: None,
        rolled_back: batch.iter().map(|(k, _)| k.clone()).collect(),
        error: Some(e),
    };
    match write_batch(store, batch, since).await {
        Ok((totals, horizon)) => Written {
            totals,
            horizon,
            rolled_back: Default::default(),
            error: None,
        },
        Err(e) if batch.len() > 1 && e.is_refusal() => {
            tracing::warn!(error = %e, rows = batch.len(), "quota flush refused; writing its counters one by one");
            let mut w = Written {
                totals: Vec::new(),
                horizon: None,
                rolled_back: Default::default(),
                error: None,
            };
            for row in batch {
                match write_batch(store, std::slice::from_ref(row), None).await {
                    Ok((totals, _)) => w.totals.extend(totals),
                    Err(e) => {
                        tracing::warn!(error = %e, counter = ?row.0, "quota counter not written; kept for the next flush");
                        w.rolled_back.insert(row.0.clone());
                        w.error.get_or_insert(e);
                    }
                }
            }
            w
        }
        Err(e) => all_back(e),
    }
}

/// Upserts every delta of `batch` in one transaction and reads back the others' totals
/// ([`UsageStore::add_usage`]); returns each total learned, and the next horizon.
async fn write_batch(
    store: &Store,
    batch: &[(CounterKey, i64)],
    since: Option<i64>,
) -> StoreResult<(Vec<(CounterKey, i64)>, Option<i64>)> {
    let rows: Vec<(UsageCounterRow, i64)> = batch.iter().map(|(k, d)| (k.row(), *d)).collect();
    let read = store.add_usage(&rows, since).await?;
    let totals = read
        .totals
        .into_iter()
        .filter_map(|(s, id, m, w, start, used)| {
            Some((
                CounterKey {
                    subject: s.parse().ok()?,
                    subject_id: id,
                    metric: m.parse().ok()?,
                    window: w.parse().ok()?,
                    start,
                },
                used,
            ))
        })
        .collect();
    Ok((totals, read.horizon))
}
