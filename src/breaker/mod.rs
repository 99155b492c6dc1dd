//! The per-key error-rate circuit breaker (DESIGN.md §5, LyRouter seed 003, "Error-rate circuit
//! breaker"): a key trips when, over the last 60 s, it has at least 100 requests and more than
//! 90 % failed (status ≥ 400, the gateway's own 402/403/429 included). Trip n blocks it for
//! 30 s, 2 min, 10 min, 12 h; the 5th trip bans it for good. Trips are counted over the key's
//! whole life, persisted, and never reset.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use crate::config::Locale;
use crate::store::{BreakerStateRow, BreakerStore, BucketDelta, Store, StoreResult, TripRow};

/// Seconds of the sliding window.
pub const WINDOW_SECS: i64 = 60;
/// Requests in the window before a key can trip.
pub const MIN_REQUESTS: u32 = 100;
/// Block of each trip, in seconds; the trip after the last one bans.
pub const LADDER_SECS: [i64; 4] = [30, 120, 600, 43_200];

/// One second of outcomes.
#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    second: i64,
    total: u32,
    failed: u32,
}

/// One key's breaker.
#[derive(Clone, Debug, Default)]
pub struct KeyBreaker {
    buckets: Vec<Bucket>,
    /// Trips so far (lifetime).
    pub trips: u32,
    /// Blocked until this instant, Unix ms.
    pub blocked_until: Option<i64>,
    /// Banned for good.
    pub banned: bool,
    /// Whether a refusal has already told the client about the ban (first wording once).
    announced: bool,
    /// Requests and failures of the other gateways in the window, as of the last flush.
    others: (u32, u32),
}

impl KeyBreaker {
    /// Requests and failures in the window ending at `now_s` (seconds).
    fn window(&self, now_s: i64) -> (u32, u32) {
        self.buckets
            .iter()
            .filter(|b| b.second > now_s - WINDOW_SECS && b.second <= now_s)
            .fold((0, 0), |(t, f), b| (t + b.total, f + b.failed))
    }

    fn clear_window(&mut self) {
        self.buckets.iter_mut().for_each(|b| *b = Bucket::default());
        self.others = (0, 0);
    }

    /// Adds one outcome; returns the trip it caused, if any.
    fn record(&mut self, now_ms: i64, failed: bool) -> Option<Trip> {
        let now_s = now_ms.div_euclid(1000);
        if self.buckets.len() != WINDOW_SECS as usize {
            self.buckets = vec![Bucket::default(); WINDOW_SECS as usize];
        }
        let slot = &mut self.buckets[now_s.rem_euclid(WINDOW_SECS) as usize];
        if slot.second != now_s {
            *slot = Bucket {
                second: now_s,
                total: 0,
                failed: 0,
            };
        }
        slot.total += 1;
        slot.failed += u32::from(failed);
        let (own_total, own_failures) = self.window(now_s);
        let (total, failures) = (own_total + self.others.0, own_failures + self.others.1);
        // Trip: at least 100 requests and more than 90 % failed.
        if total < MIN_REQUESTS || failures * 10 <= total * 9 {
            return None;
        }
        // On a trip the window starts empty.
        self.clear_window();
        self.trips += 1;
        let blocked_until = match LADDER_SECS.get(self.trips as usize - 1) {
            Some(secs) => Some(now_ms + secs * 1000),
            None => {
                self.banned = true;
                None
            }
        };
        self.blocked_until = blocked_until;
        Some(Trip {
            trip: self.trips,
            at: now_ms,
            requests: total,
            failures,
            blocked_until,
            banned: self.banned,
        })
    }
}

/// A trip, as persisted and shown to admins.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Trip {
    /// Which trip of the key (1-based).
    pub trip: u32,
    /// When, Unix ms.
    pub at: i64,
    /// Requests in the window.
    pub requests: u32,
    /// Failures in the window.
    pub failures: u32,
    /// Blocked until, Unix ms (none when banned).
    pub blocked_until: Option<i64>,
    /// Whether this trip banned the key.
    pub banned: bool,
}

/// Why the gate refuses a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Blocked until this instant.
    Open {
        /// Whole seconds to wait, rounded up.
        retry_after: u64,
        /// The end of the block.
        blocked_until: DateTime<Utc>,
    },
    /// Banned; `first` for the first refusal that tells the client.
    Banned {
        /// Whether this is the first refusal since the ban (LyRouter's first wording).
        first: bool,
    },
}

impl Refusal {
    /// The message in `locale` (LyRouter's exact Chinese wording for `zh`).
    pub fn message(&self, locale: Locale) -> String {
        match (self, locale) {
            (Refusal::Open { retry_after, .. }, Locale::Zh) => {
                format!("API Key 因最近 60 秒错误率过高已临时熔断，请在 {retry_after} 秒后重试。")
            }
            (Refusal::Open { retry_after, .. }, Locale::En) => format!(
                "The API key has been temporarily circuit-broken because its error rate over the last 60 seconds was too high; retry in {retry_after} seconds."
            ),
            (Refusal::Banned { first: true }, Locale::Zh) => {
                "该 API Key 因多次高错误率请求已被永久封禁，无法恢复，请删除后创建新的 API Key。".to_owned()
            }
            (Refusal::Banned { first: false }, Locale::Zh) => {
                "该 API Key 已被永久封禁，无法恢复，请删除后创建新的 API Key。".to_owned()
            }
            (Refusal::Banned { first: true }, Locale::En) => "This API key has been permanently banned after repeated high-error-rate requests and cannot be restored; delete it and create a new API key.".to_owned(),
            (Refusal::Banned { first: false }, Locale::En) => {
                "This API key has been permanently banned and cannot be restored; delete it and create a new API key.".to_owned()
            }
        }
    }
}

/// Every key's breaker in this gateway.
#[derive(Default)]
pub struct Breakers {
    keys: Mutex<HashMap<i64, KeyBreaker>>,
    /// Outcomes not yet written to the shared window: (key, second) → (total, failed).
    pending: Mutex<HashMap<(i64, i64), (u32, u32)>>,
    /// Keys whose window involves other gateways, to refresh at each flush.
    shared: Mutex<std::collections::HashSet<i64>>,
    /// One flush at a time.
    flushing: tokio::sync::Mutex<()>,
}

impl Breakers {
    /// Loads trips, blocks and bans from the store (at start, and when another gateway tripped a
    /// key). Sliding windows stay as they are.
    pub async fn load(&self, store: &Store) -> StoreResult<()> {
        let rows = store.breaker_states().await?;
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        for BreakerStateRow {
            key_id,
            trips,
            blocked_until,
            banned,
        } in rows
        {
            // A ban loaded from the store was told to its client before (restart, replica).
            let k = keys.entry(key_id).or_insert_with(|| KeyBreaker {
                announced: banned == 1,
                ..KeyBreaker::default()
            });
            let trips = u32::try_from(trips).unwrap_or(u32::MAX);
            if trips > k.trips {
                // Another gateway tripped the key: the window starts empty here too.
                k.clear_window();
            }
            if trips >= k.trips {
                k.trips = trips;
                k.blocked_until = blocked_until.max(k.blocked_until);
                // A ban learnt from the store was made, and told, elsewhere (another gateway,
                // or before a restart): only the request that banned the key gets the first
                // wording, so every refusal here gets the second.
                if banned == 1 && !k.banned {
                    k.banned = true;
                    k.announced = true;
                }
            }
        }
        Ok(())
    }

    /// What the console shows of a key's breaker: lifetime trips, blocked until (Unix ms, if the
    /// block is still running at `now_ms`), banned.
    pub fn standing(&self, key_id: i64, now_ms: i64) -> (u32, Option<i64>, bool) {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(&key_id).map_or((0, None, false), |k| {
            (k.trips, k.blocked_until.filter(|u| *u > now_ms), k.banned)
        })
    }

    /// The gate: whether `key_id` may pass at `now`.
    pub fn gate(&self, key_id: i64, now: DateTime<Utc>) -> Result<(), Refusal> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let Some(k) = keys.get_mut(&key_id) else {
            return Ok(());
        };
        if k.banned {
            let first = !k.announced;
            k.announced = true;
            return Err(Refusal::Banned { first });
        }
        match k.blocked_until {
            Some(until) if until > now.timestamp_millis() => {
                let ms = until - now.timestamp_millis();
                Err(Refusal::Open {
                    retry_after: (ms as u64).div_ceil(1000),
                    blocked_until: DateTime::from_timestamp_millis(until).unwrap_or(now),
                })
            }
            _ => Ok(()),
        }
    }

    /// Notes that the client has been told of the ban (its first wording is used once).
    pub fn announce(&self, key_id: i64) {
        if let Some(k) = self
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&key_id)
        {
            k.announced = true;
        }
    }

    /// Counts one outcome of `key_id`; a trip is returned to be persisted.
    pub fn record(&self, key_id: i64, now: DateTime<Utc>, status: u16) -> Option<Trip> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let trip = keys
            .entry(key_id)
            .or_default()
            .record(now.timestamp_millis(), status >= 400);
        drop(keys);
        if trip.is_none() {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            let slot = pending
                .entry((key_id, now.timestamp_millis().div_euclid(1000)))
                .or_default();
            slot.0 += 1;
            slot.1 += u32::from(status >= 400);
        }
        if let Some(t) = &trip {
            let step = if t.banned {
                "ban".to_owned()
            } else {
                t.trip.to_string()
            };
            metrics::counter!("aigw_breaker_trips_total", "step" => step).increment(1);
        }
        trip
    }

    /// Shares this gateway's outcomes with the others and learns theirs: adds the pending
    /// per-second counts to the store, then reads every gateway's last 60 s for the keys
    /// involved. Off the request path (the flush task).
    pub async fn flush(&self, store: &Store, now: DateTime<Utc>) -> StoreResult<()> {
        let _one_at_a_time = self.flushing.lock().await;
        let mut batch: Vec<BucketDelta> =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()))
                .into_iter()
                .collect();
        // In (key, second) order: gateways flushing at once lock the same rows in the same
        // order, so they wait for each other instead of deadlocking (bench/replicas.py saw it).
        batch.sort_unstable_by_key(|(slot, _)| *slot);
        let now_s = now.timestamp_millis().div_euclid(1000);
        let keys: Vec<i64> = {
            let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            shared.extend(batch.iter().map(|((k, _), _)| *k));
            shared.iter().copied().collect()
        };
        if keys.is_empty() {
            return Ok(());
        }
        // What this gateway has counted itself, as of the batch just taken.
        let own: HashMap<i64, (u32, u32)> = {
            let map = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            keys.iter()
                .map(|k| (*k, map.get(k).map_or((0, 0), |b| b.window(now_s))))
                .collect()
        };
        if !batch.is_empty()
            && let Err(e) = store.add_breaker_buckets(&batch).await
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            for (k, (t, f)) in batch {
                let slot = pending.entry(k).or_default();
                slot.0 += t;
                slot.1 += f;
            }
            return Err(e);
        }
        let rows = store.breaker_window(&keys, now_s - WINDOW_SECS).await?;
        let global: HashMap<i64, (i64, i64)> = rows.into_iter().map(|(k, t, f)| (k, (t, f))).collect();
        let mut map = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            let (gt, gf) = global.get(&k).copied().unwrap_or((0, 0));
            let (ot, of) = own.get(&k).copied().unwrap_or((0, 0));
            let others = (
                u32::try_from((gt - i64::from(ot)).max(0)).unwrap_or(u32::MAX),
                u32::try_from((gf - i64::from(of)).max(0)).unwrap_or(u32::MAX),
            );
            if let Some(kb) = map.get_mut(&k) {
                kb.others = others;
            }
            if gt == 0 {
                shared.remove(&k);
            }
        }
        Ok(())
    }

    /// Keys blocked right now by an open breaker (banned keys not counted).
    pub fn open_keys(&self, now: DateTime<Utc>) -> usize {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.values()
            .filter(|k| !k.banned && k.blocked_until.is_some_and(|u| u > now.timestamp_millis()))
            .count()
    }

    /// Keys banned for good.
    pub fn banned_keys(&self) -> usize {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.values().filter(|k| k.banned).count()
    }
}

/// Persists a trip: the key's state, a history row (once, whichever gateway tripped it first),
/// and an empty shared window; then tells every gateway.
pub async fn persist(store: &Store, key_id: i64, t: &Trip) -> StoreResult<()> {
    let row = TripRow {
        trip: i64::from(t.trip),
        at: t.at,
        requests: i64::from(t.requests),
        failures: i64::from(t.failures),
        blocked_until: t.blocked_until,
        banned: i64::from(t.banned),
    };
    // Recorded here or, already, by another gateway: either way the others reload.
    store.record_trip(key_id, &row).await?;
    store.bump_config_epoch().await
}

/// A key's trips, oldest first.
pub async fn history(store: &Store, key_id: i64) -> StoreResult<Vec<Trip>> {
    Ok(store
        .trips_of(key_id)
        .await?
        .into_iter()
        .map(|r| Trip {
            trip: r.trip as u32,
            at: r.at,
            requests: r.requests as u32,
            failures: r.failures as u32,
            blocked_until: r.blocked_until,
            banned: r.banned == 1,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(k: &mut KeyBreaker, start_ms: i64, n: u32, failures: u32) -> Option<Trip> {
        let mut trip = None;
        for i in 0..n {
            trip = trip.or(k.record(start_ms + i64::from(i), i < failures));
        }
        trip
    }

    #[test]
    fn trip_threshold() {
        // (requests, failures, trips?)
        let cases = [
            (100, 91, true),
            (100, 90, false),
            (99, 99, false),
            (100, 100, true),
            (200, 181, true),
        ];
        for (n, f, want) in cases {
            let mut k = KeyBreaker::default();
            assert_eq!(
                run(&mut k, 1_000_000, n, f).is_some(),
                want,
                "{n} requests, {f} failures"
            );
        }
    }

    #[test]
    fn old_failures_fall_out_of_the_window() {
        let mut k = KeyBreaker::default();
        assert!(run(&mut k, 0, 60, 60).is_none());
        // 61 s later the first 60 failures are gone: 60 + 40 is not 100 in the window.
        assert!(run(&mut k, 61_000, 40, 40).is_none());
        assert!(run(&mut k, 61_100, 20, 20).is_none(), "60 in the window");
        assert!(run(&mut k, 62_000, 40, 40).is_some(), "100 in the window");
    }

    #[test]
    fn ladder_then_ban() {
        let mut k = KeyBreaker::default();
        let mut now = 10_000_000;
        for (i, secs) in LADDER_SECS.iter().enumerate() {
            let t = run(&mut k, now, 100, 100).expect("trips");
            assert_eq!(t.trip as usize, i + 1);
            assert_eq!(t.blocked_until, Some(now + 99 + secs * 1000));
            assert!(!t.banned);
            now += secs * 1000 + 100_000;
        }
        let t = run(&mut k, now, 100, 100).expect("5th trip");
        assert!(t.banned && k.banned && t.blocked_until.is_none());
    }

    #[test]
    fn gate_words() {
        let b = Breakers::default();
        let now = Utc::now();
        assert!(b.gate(1, now).is_ok());
        for i in 0..100 {
            b.record(1, now + chrono::Duration::milliseconds(i), 500);
        }
        match b.gate(1, now + chrono::Duration::milliseconds(99)) {
            Err(Refusal::Open { retry_after, .. }) => assert_eq!(retry_after, 30),
            other => panic!("{other:?}"),
        }
        let open = Refusal::Open {
            retry_after: 7,
            blocked_until: now,
        };
        assert_eq!(
            open.message(Locale::Zh),
            "API Key 因最近 60 秒错误率过高已临时熔断，请在 7 秒后重试。"
        );
    }
}
