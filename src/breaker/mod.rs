//! The per-key error-rate circuit breaker (DESIGN.md §5, LyRouter seed 003, "Error-rate circuit
//! breaker"): a key trips when, over the last 60 s, it has at least 100 requests and more than
//! 90 % failed (status ≥ 400, the gateway's own 402/403/429 included). Trip n blocks it for
//! 30 s, 2 min, 10 min, 12 h; the 5th trip bans it for good. Trips are counted over the key's
//! whole life, persisted, and never reset.
//!
//! A trip starts a fresh window (DESIGN.md §11): outcomes of requests admitted before a trip, or
//! that end while the key is blocked or banned, are not counted ([`Admission`]), here nor in the
//! shared window, where each second's outcomes carry the trip that began their window
//! ([`BucketCounts`]) and only the key's current window is read. So a burst of failures in flight
//! trips a key once, whatever its size, and nothing is counted, nor tripped, after the ban.
//!
//! Replicas share a key's window through the store (`breaker_buckets`), but only once the key has
//! failed ("shared from the first failure"): a key with no failure anywhere cannot trip, so a
//! gateway writes nothing for a key that only succeeds, and starts writing its whole window at
//! the key's first failure here or when it learns that another gateway shared failures of it
//! (each flush looks for keys with failures shared in the last seconds, [`DISCOVERY_SECS`]).
//! With 100,000 keys that mostly succeed, that is no row a request instead of one.
//!
//! With `redis_url`, the same outcomes also go to Redis after completion, where every gateway's
//! window is judged at once and a trip is made once across them ([`shared`]); the store path
//! keeps running beside it, and is what judges keys while Redis is away.

pub mod shared;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use chrono::{DateTime, Utc};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::config::Locale;
use crate::store::{BreakerStateRow, BreakerStore, BucketCounts, BucketDelta, Store, StoreResult, TripRow};

/// Seconds of the sliding window.
pub const WINDOW_SECS: i64 = 60;
/// How long the store keeps a breaker bucket: two windows (the window read is the last
/// [`WINDOW_SECS`]), so a gateway whose clock runs a little behind still finds what it reads.
pub const BUCKETS_KEPT_SECS: i64 = 2 * WINDOW_SECS;
/// Requests in the window before a key can trip.
pub const MIN_REQUESTS: u32 = 100;
/// Block of each trip, in seconds; the trip after the last one bans.
pub const LADDER_SECS: [i64; 4] = [30, 120, 600, 43_200];
/// How far before its last look a flush looks for failures other gateways shared: a failure
/// shared later than this after its second (a flush stalled that long) is not noticed by the
/// gateways that hold only successes of the key, until its next failure is shared.
pub const DISCOVERY_SECS: i64 = 5;

/// One second of outcomes.
#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    second: i64,
    total: u32,
    failed: u32,
}

/// What the gate let through: the key's trips when its request was admitted, which names the
/// window the request's outcome belongs to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    trips: u32,
}

/// One key's breaker.
#[derive(Clone, Debug, Default)]
pub struct KeyBreaker {
    /// The seconds that had outcomes, in the order first seen: only those (a key with one
    /// request holds one bucket, not sixty), none older than the window after a record. The
    /// first two are held inline, as most keys of a large tenancy have one or two such seconds:
    /// no allocation a key (heaptrack: 5.25 MiB of them at 100,000 keys).
    buckets: SmallVec<[Bucket; 2]>,
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
    /// Whether this gateway writes the key's outcomes to the shared window: from the key's
    /// first failure here or elsewhere, until it is forgotten.
    sharing: bool,
}

impl KeyBreaker {
    /// Requests and failures in the window ending at `now_s` (seconds).
    fn window(&self, now_s: i64) -> (u32, u32) {
        self.buckets
            .iter()
            .filter(|b| b.second > now_s - WINDOW_SECS && b.second <= now_s)
            .fold((0, 0), |(t, f), b| (t + b.total, f + b.failed))
    }

    /// Starts sharing the key's outcomes: its window ending at `now_s`, to add to the store
    /// (keyed by second; the key id is left 0 for the caller).
    fn start_sharing(&mut self, now_s: i64) -> impl Iterator<Item = BucketDelta> + '_ {
        self.sharing = true;
        let trip = self.trips;
        self.buckets
            .iter()
            .filter(move |b| b.second > now_s - WINDOW_SECS && b.second <= now_s)
            .map(move |b| {
                let n = BucketCounts {
                    trip,
                    total: b.total,
                    failed: b.failed,
                };
                ((0, b.second), n)
            })
    }

    /// Whether an outcome at `now_ms` of a request admitted as `admitted` counts. LyRouter's
    /// ladder, each trip following the end of the one before (DESIGN.md §11): not after the ban,
    /// not while the key is blocked, not from a request admitted before the last trip (here or,
    /// as this gateway knows it, on another gateway).
    fn counts(&self, now_ms: i64, admitted: Admission) -> bool {
        !self.banned && admitted.trips == self.trips && self.blocked_until.is_none_or(|until| until <= now_ms)
    }

    fn clear_window(&mut self) {
        self.buckets = SmallVec::new();
        self.others = (0, 0);
    }

    /// Whether the key holds nothing worth keeping at `now_s`: never tripped, and no outcome of
    /// its own or of another gateway in the window (forgetting it changes no answer).
    fn idle(&self, now_s: i64) -> bool {
        self.trips == 0 && !self.banned && self.others == (0, 0) && self.window(now_s) == (0, 0)
    }

    /// Adds one outcome of a request admitted as `admitted`, if it counts; returns the trip it
    /// caused, if any.
    fn record(&mut self, now_ms: i64, failed: bool, admitted: Admission) -> Option<Trip> {
        if !self.counts(now_ms, admitted) {
            return None;
        }
        let now_s = now_ms.div_euclid(1000);
        // Seconds out of the window are dropped (and, should the clock step back, seconds a
        // window ahead of it), so a key holds at most two windows of buckets.
        self.buckets
            .retain(|b| b.second > now_s - WINDOW_SECS && b.second <= now_s + WINDOW_SECS);
        let slot = match self.buckets.iter().rposition(|b| b.second == now_s) {
            Some(i) => &mut self.buckets[i],
            None => {
                self.buckets.push(Bucket {
                    second: now_s,
                    total: 0,
                    failed: 0,
                });
                let last = self.buckets.len() - 1;
                &mut self.buckets[last]
            }
        };
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
    keys: Mutex<FxHashMap<i64, KeyBreaker>>,
    /// Outcomes not yet written to the shared window: (key, second) → counts of one window.
    pending: Mutex<FxHashMap<(i64, i64), BucketCounts>>,
    /// Keys whose window other gateways were using at the last read, to refresh at each flush.
    shared: Mutex<std::collections::HashSet<i64>>,
    /// One flush at a time.
    flushing: tokio::sync::Mutex<()>,
    /// The second of the last sweep of idle keys.
    swept: std::sync::atomic::AtomicI64,
    /// The second of the last look for failures the other gateways shared.
    looked: std::sync::atomic::AtomicI64,
    /// The window and standings shared through Redis, when `redis_url` is set.
    redis: OnceLock<Arc<shared::SharedBreakers>>,
}

/// How often a flush forgets the keys with nothing in their window, in seconds.
const SWEEP_SECS: i64 = 10;

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
            let trips = u32::try_from(trips).unwrap_or(u32::MAX);
            adopt(&mut keys, key_id, trips, blocked_until, banned == 1);
        }
        Ok(())
    }

    /// Shares the window and standings through Redis from now on ([`shared`]).
    pub fn share_through(&self, redis: Arc<shared::SharedBreakers>) {
        let _ = self.redis.set(redis);
    }

    /// The Redis side, when `redis_url` is set.
    pub fn redis(&self) -> Option<&Arc<shared::SharedBreakers>> {
        self.redis.get()
    }

    /// What the console shows of a key's breaker: lifetime trips, blocked until (Unix ms, if the
    /// block is still running at `now_ms`), banned.
    pub fn standing(&self, key_id: i64, now_ms: i64) -> (u32, Option<i64>, bool) {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(&key_id).map_or((0, None, false), |k| {
            (k.trips, k.blocked_until.filter(|u| *u > now_ms), k.banned)
        })
    }

    /// The gate: whether `key_id` may pass at `now_ms`; the admission is handed back with the
    /// request's outcome ([`Breakers::record`]).
    pub fn gate(&self, key_id: i64, now_ms: i64) -> Result<Admission, Refusal> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let Some(k) = keys.get_mut(&key_id) else {
            // Not held: never tripped (a tripped key is never forgotten).
            return Ok(Admission::default());
        };
        if k.banned {
            let first = !k.announced;
            k.announced = true;
            return Err(Refusal::Banned { first });
        }
        match k.blocked_until {
            Some(until) if until > now_ms => {
                let ms = until - now_ms;
                Err(Refusal::Open {
                    retry_after: (ms as u64).div_ceil(1000),
                    blocked_until: DateTime::from_timestamp_millis(until).unwrap_or_default(),
                })
            }
            _ => Ok(Admission { trips: k.trips }),
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

    /// Counts one outcome of `key_id`, whose request the gate let through as `admitted`, unless
    /// it belongs to an earlier window or the key is blocked ([`KeyBreaker::counts`]); a trip is
    /// returned to be persisted.
    pub fn record(&self, key_id: i64, now_ms: i64, status: u16, admitted: Admission) -> Option<Trip> {
        let failed = status >= 400;
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let k = keys.entry(key_id).or_default();
        if !k.counts(now_ms, admitted) {
            return None;
        }
        let trip = k.record(now_ms, failed, admitted);
        // What to share: nothing on a trip (the shared window starts empty) or while the key has
        // only succeeded; this outcome once the key is shared; at its first failure, its window.
        let share: SmallVec<[BucketDelta; 2]> = match (&trip, k.sharing, failed) {
            (Some(_), ..) | (None, false, false) => SmallVec::new(),
            (None, true, _) => smallvec::smallvec![(
                (key_id, now_ms.div_euclid(1000)),
                BucketCounts {
                    trip: k.trips,
                    total: 1,
                    failed: u32::from(failed),
                }
            )],
            (None, false, true) => {
                let now_s = now_ms.div_euclid(1000);
                k.start_sharing(now_s)
                    .map(|((_, s), n)| ((key_id, s), n))
                    .collect()
            }
        };
        drop(keys);
        if let Some(r) = self.redis().filter(|r| r.is_up()) {
            r.queue_outcomes(
                key_id,
                share.iter().map(|((_, s), n)| (*s, n.trip, n.total, n.failed)),
            );
            if let Some(t) = &trip {
                r.queue_trip(key_id, t);
            }
        }
        self.add_pending(share);
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

    /// Adds outcomes to those the next flush writes.
    fn add_pending(&self, deltas: impl IntoIterator<Item = BucketDelta>) {
        let mut deltas = deltas.into_iter().peekable();
        if deltas.peek().is_none() {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        for (slot, n) in deltas {
            pending.entry(slot).and_modify(|sums| sums.merge(n)).or_insert(n);
        }
    }

    /// Shares this gateway's outcomes with the others and learns theirs: adds the pending
    /// per-second counts to the store, then reads every gateway's last 60 s for the keys
    /// involved: those with outcomes shared here since the last flush and those the others were
    /// using at the last read; last, looks for keys with failures the others shared since the
    /// last look, and starts sharing those of them it holds outcomes of. Off the request path
    /// (the flush task).
    pub async fn flush(&self, store: &Store, now: DateTime<Utc>) -> StoreResult<()> {
        let _one_at_a_time = self.flushing.lock().await;
        let now_s = now.timestamp_millis().div_euclid(1000);
        if now_s - self.swept.load(Ordering::Relaxed) >= SWEEP_SECS {
            self.swept.store(now_s, Ordering::Relaxed);
            self.forget_idle(now_s);
        }
        self.exchange(store, now_s).await?;
        self.discover(store, now_s).await
    }

    /// Starts sharing the keys that hold outcomes here, not shared yet, and whose failures other
    /// gateways shared since the last look (less [`DISCOVERY_SECS`]): their window goes with the
    /// next flush, and is read back from then on.
    async fn discover(&self, store: &Store, now_s: i64) -> StoreResult<()> {
        let since = self.looked.load(Ordering::Relaxed).min(now_s) - DISCOVERY_SECS;
        let failing = store
            .breaker_failing_after(since.max(now_s - WINDOW_SECS))
            .await?;
        self.looked.store(now_s, Ordering::Relaxed);
        self.start_sharing(failing, now_s);
        Ok(())
    }

    /// Starts sharing those of `failing` (keys other gateways shared failures of) that hold
    /// outcomes here and are not shared yet: their window at `now_s` goes to the store's next
    /// flush and to Redis, and every outcome after it.
    pub(crate) fn start_sharing(&self, failing: impl IntoIterator<Item = i64>, now_s: i64) {
        let mut share = Vec::new();
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        for key in failing {
            if let Some(k) = keys.get_mut(&key)
                && !k.sharing
                && k.window(now_s) != (0, 0)
            {
                share.extend(k.start_sharing(now_s).map(|((_, s), n)| ((key, s), n)));
            }
        }
        drop(keys);
        if let Some(r) = self.redis().filter(|r| r.is_up()) {
            for (key, n) in &share {
                r.queue_outcomes(key.0, [(key.1, n.trip, n.total, n.failed)]);
            }
        }
        self.add_pending(share);
    }

    /// Writes the outcomes shared since the last flush and reads back the windows of the keys
    /// involved.
    async fn exchange(&self, store: &Store, now_s: i64) -> StoreResult<()> {
        let mut batch: Vec<BucketDelta> =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()))
                .into_iter()
                .collect();
        // In (key, second) order: gateways flushing at once lock the same rows in the same
        // order, so they wait for each other instead of deadlocking (bench/replicas.py saw it).
        batch.sort_unstable_by_key(|(slot, _)| *slot);
        // The keys to read back: those with outcomes of this gateway in the batch, and those the
        // others were using at the last read. A key idle here whose window the others were not
        // using is not read again at every flush: its others are read with its next outcome here.
        let keys: Vec<i64> = {
            let shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            let mut keys: Vec<i64> = batch.iter().map(|((k, _), _)| *k).collect();
            keys.extend(shared.iter().copied());
            keys.sort_unstable();
            keys.dedup();
            keys
        };
        if keys.is_empty() {
            return Ok(());
        }
        // What this gateway has counted itself and shared, as of the batch just taken, and the
        // window (trip) it belongs to: only that window is read back.
        let own: HashMap<i64, (u32, (u32, u32))> = {
            let map = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            keys.iter()
                .map(|k| {
                    let held = map.get(k);
                    let shared = held.filter(|b| b.sharing);
                    let trips = held.map_or(0, |b| b.trips);
                    (*k, (trips, shared.map_or((0, 0), |b| b.window(now_s))))
                })
                .collect()
        };
        if !batch.is_empty()
            && let Err(e) = store.add_breaker_buckets(&batch).await
        {
            self.add_pending(batch);
            return Err(e);
        }
        let rows = match store.breaker_window(&keys, now_s - WINDOW_SECS).await {
            Ok(rows) => rows,
            Err(e) => {
                // Read again at the next flush, outcomes here or not.
                let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                shared.extend(keys);
                return Err(e);
            }
        };
        let global: HashMap<(i64, i64), (i64, i64)> = rows
            .into_iter()
            .map(|(k, trip, t, f)| ((k, trip), (t, f)))
            .collect();
        let mut map = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            let (trips, (ot, of)) = own.get(&k).copied().unwrap_or_default();
            if map.get(&k).is_some_and(|b| b.trips != trips) {
                // Tripped since: its window started empty, read it at the next flush.
                shared.insert(k);
                continue;
            }
            let (gt, gf) = global.get(&(k, i64::from(trips))).copied().unwrap_or((0, 0));
            let others = (
                u32::try_from((gt - i64::from(ot)).max(0)).unwrap_or(u32::MAX),
                u32::try_from((gf - i64::from(of)).max(0)).unwrap_or(u32::MAX),
            );
            // A key forgotten while idle here is held again once the others use it.
            if others != (0, 0) {
                map.entry(k).or_default().others = others;
            } else if let Some(kb) = map.get_mut(&k) {
                kb.others = others;
            }
            if others == (0, 0) {
                shared.remove(&k);
            } else {
                shared.insert(k);
            }
        }
        Ok(())
    }

    /// Forgets the keys that hold nothing at `now_s` (never tripped, an empty window here and
    /// on the other gateways as last read): a key used once costs no memory a window later.
    fn forget_idle(&self, now_s: i64) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.retain(|_, k| !k.idle(now_s));
        if keys.capacity() > 4 * keys.len().max(256) {
            keys.shrink_to_fit();
        }
    }

    /// Keys held in memory.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.keys.lock().unwrap_or_else(|p| p.into_inner()).len()
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

/// Adopts a key's standing learnt elsewhere (the store, Redis, another gateway's notice): trips
/// only rise (a rise empties the window here too), a block only extends, a ban stays.
fn adopt(
    keys: &mut FxHashMap<i64, KeyBreaker>,
    key_id: i64,
    trips: u32,
    blocked_until: Option<i64>,
    banned: bool,
) {
    // A ban learnt from elsewhere was made, and told, elsewhere (another gateway, or before a
    // restart): only the request that banned the key gets the first wording.
    let k = keys.entry(key_id).or_insert_with(|| KeyBreaker {
        announced: banned,
        ..KeyBreaker::default()
    });
    if trips > k.trips {
        k.clear_window();
    }
    if trips >= k.trips {
        k.trips = trips;
        k.blocked_until = blocked_until.max(k.blocked_until);
        if banned && !k.banned {
            k.banned = true;
            k.announced = true;
        }
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
            trip = trip.or(k.record(
                start_ms + i64::from(i),
                i < failures,
                Admission { trips: k.trips },
            ));
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

    /// DESIGN.md §11: an outcome counts only in the window its request was admitted to, and
    /// not while the key is blocked or after its ban.
    #[test]
    fn an_outcome_counts_only_in_the_window_it_was_admitted_to() {
        let tripped = |trips, blocked_until, banned| KeyBreaker {
            trips,
            blocked_until,
            banned,
            ..KeyBreaker::default()
        };
        // (key, admitted at trips, now, counts?)
        let cases = [
            (tripped(0, None, false), 0, 1_000, true),
            (tripped(1, Some(31_000), false), 0, 20_000, false),
            (tripped(1, Some(31_000), false), 0, 40_000, false),
            (tripped(1, Some(31_000), false), 1, 40_000, true),
            (tripped(1, Some(31_000), false), 1, 31_000, true),
            (tripped(1, Some(31_000), false), 1, 30_999, false),
            (tripped(5, None, true), 5, 40_000, false),
        ];
        for (i, (k, trips, now, want)) in cases.into_iter().enumerate() {
            assert_eq!(k.counts(now, Admission { trips }), want, "case {i}");
        }
    }

    /// 520 requests of one key fail together: one trip, whatever the burst's size; at the 5th
    /// trip, one ban and no 6th trip.
    #[test]
    fn a_burst_in_flight_trips_once() {
        let mut k = KeyBreaker::default();
        let admitted = Admission { trips: 0 };
        let trips: Vec<u32> = (0..520)
            .filter_map(|i| k.record(1_000_000 + i, true, admitted))
            .map(|t| t.trip)
            .collect();
        assert_eq!(trips, [1]);
        k.trips = 4;
        k.blocked_until = None;
        let admitted = Admission { trips: 4 };
        let trips: Vec<(u32, bool)> = (0..520)
            .filter_map(|i| k.record(2_000_000 + i, true, admitted))
            .map(|t| (t.trip, t.banned))
            .collect();
        assert_eq!(trips, [(5, true)]);
        assert_eq!(k.window(2_000), (0, 0), "nothing counted after the ban");
    }

    #[test]
    fn a_key_holds_only_the_seconds_it_was_used() {
        let mut k = KeyBreaker::default();
        assert!(run(&mut k, 5_000_000, 3, 0).is_none());
        assert_eq!(k.buckets.len(), 1, "one second of outcomes");
        k.record(5_001_000, false, Admission::default());
        assert_eq!(k.buckets.len(), 2);
        // A window later the old seconds are dropped, not kept beside the new one.
        k.record(5_000_000 + WINDOW_SECS * 1000 + 1000, false, Admission::default());
        assert_eq!(k.buckets.len(), 1);
        assert_eq!(k.window(5_000 + WINDOW_SECS + 1), (1, 0));
    }

    #[test]
    fn idle_keys_are_forgotten_tripped_ones_kept() {
        let b = Breakers::default();
        let now_ms = Utc::now().timestamp_millis();
        let s = now_ms.div_euclid(1000);
        b.record(1, now_ms, 200, Admission::default());
        for i in 0..100 {
            b.record(2, now_ms + i, 500, Admission::default());
        }
        b.forget_idle(s + 1);
        assert_eq!(b.held(), 2, "key 1 still has an outcome in the window");
        b.forget_idle(s + WINDOW_SECS + 1);
        assert_eq!(b.held(), 1, "key 1 is forgotten, tripped key 2 kept");
        assert_eq!(b.standing(2, now_ms).0, 1);
        assert!(b.gate(2, now_ms + 200).is_err());
        assert!(b.gate(1, now_ms).is_ok());
    }

    /// Two gateways on one store: a key only one of them uses is not read back at every flush
    /// (its window is its own), a key the other uses is, with or without outcomes here since.
    #[tokio::test]
    async fn only_keys_in_use_here_or_by_the_others_are_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("breaker.db").display());
        let store = Store::connect(&url).await.unwrap();
        let (a, b) = (Breakers::default(), Breakers::default());
        let now = Utc::now();
        let at = |ms: i64| now + chrono::Duration::milliseconds(ms);
        let ms = |d: i64| at(d).timestamp_millis();
        for i in 0..50 {
            a.record(7, ms(i), 500, Admission::default());
        }
        a.flush(&store, at(100)).await.unwrap();
        let read_back = |g: &Breakers| g.shared.lock().unwrap().len();
        assert_eq!(read_back(&a), 0, "only gateway A uses key 7");
        b.record(7, ms(200), 500, Admission::default());
        b.flush(&store, at(300)).await.unwrap();
        assert_eq!(read_back(&b), 1, "B learnt that A uses key 7");
        for i in 0..40 {
            a.record(7, ms(400 + i), 500, Admission::default());
        }
        a.flush(&store, at(500)).await.unwrap();
        assert_eq!(read_back(&a), 1, "A learnt that B uses key 7");
        // No outcome on B since its last flush: it still reads the key the others use.
        b.flush(&store, at(600)).await.unwrap();
        let trips: Vec<bool> = (0..9)
            .map(|i| b.record(7, ms(700 + i), 500, Admission::default()).is_some())
            .collect();
        assert_eq!(
            trips,
            [false, false, false, false, false, false, false, false, true]
        );
    }

    /// A key that only succeeds is not written to the shared window; once another gateway
    /// shares failures of it, this one shares its successes, which keep the other from tripping
    /// the key on failures that are not 90 % of the two gateways' requests.
    #[tokio::test]
    async fn successes_are_shared_once_another_gateway_shares_failures() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("breaker.db").display());
        let store = Store::connect(&url).await.unwrap();
        let (a, b) = (Breakers::default(), Breakers::default());
        let now = Utc::now();
        let at = |ms: i64| now + chrono::Duration::milliseconds(ms);
        let ms = |d: i64| at(d).timestamp_millis();
        let stored = async |key: i64, after: i64| {
            let rows = store
                .breaker_window(&[key], now.timestamp() - after)
                .await
                .unwrap();
            rows.first().map_or((0, 0), |&(_, _, t, f)| (t, f))
        };
        for i in 0..60 {
            a.record(7, ms(i), 200, Admission::default());
        }
        a.flush(&store, at(100)).await.unwrap();
        assert_eq!(stored(7, 60).await, (0, 0), "successes alone are not shared");
        b.record(7, ms(200), 500, Admission::default());
        b.flush(&store, at(300)).await.unwrap();
        assert_eq!(
            stored(7, 60).await,
            (1, 1),
            "a failure is, with the window before it"
        );
        a.flush(&store, at(400)).await.unwrap();
        a.flush(&store, at(500)).await.unwrap();
        assert_eq!(stored(7, 60).await, (61, 1), "A shares its 60 successes");
        b.record(7, ms(600), 500, Admission::default());
        b.flush(&store, at(700)).await.unwrap();
        let trips = (0..98)
            .filter(|i| b.record(7, ms(800 + i), 500, Admission::default()).is_some())
            .count();
        assert_eq!(trips, 0, "100 failures of 160 requests are not more than 90 %");
        // Alone, B would have tripped the key at its 100th failure.
        let alone = Breakers::default();
        let trips = (0..100)
            .filter(|i| alone.record(8, ms(*i), 500, Admission::default()).is_some())
            .count();
        assert_eq!(trips, 1);
        // Another gateway's successes of a key it already shares are written as they come.
        a.record(7, ms(1000), 200, Admission::default());
        a.flush(&store, at(1100)).await.unwrap();
        b.flush(&store, at(1200)).await.unwrap();
        assert_eq!(stored(7, 60).await, (161, 100));
    }

    #[test]
    fn gate_words() {
        let b = Breakers::default();
        let now = Utc::now();
        let now_ms = now.timestamp_millis();
        assert!(b.gate(1, now_ms).is_ok());
        for i in 0..100 {
            b.record(1, now_ms + i, 500, Admission::default());
        }
        match b.gate(1, now_ms + 99) {
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
