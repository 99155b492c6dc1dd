//! Whether a credential may take one more request before anything is sent (DESIGN.md §1 "own
//! limits and concurrency slot free"): its own limits (requests/minute, tokens/minute,
//! requests/day) and its in-flight slots (`max_in_flight`).
//!
//! Admission is decided in memory: nothing on the request path waits on the database. Own-limit
//! counts are shared by replicas the way quota counters are: each gateway adds what it counted
//! to `upstream_counters` at every flush and reads back every gateway's totals, so a gateway
//! misses at most two flush intervals of the others' traffic (docs/upstreams.md). With
//! `redis_url`, the counts also go to Redis after dispatch and completion ([`super::own_shared`]),
//! whose totals each gateway keeps as they come back: it then misses at most the others' traffic
//! since their last write round trip. In-flight slots stay per process. Windows are aligned in UTC: a minute
//! runs from hh:mm:00.000 to the next minute, a day from 00:00 UTC to the next 00:00 UTC,
//! whatever the workspace's quota time zone — these limits model the provider's, not a tenant's.
//!
//! Requests are counted when they are dispatched (every attempt sent upstream, a failed one
//! included: the provider counts it too); tokens when the request completes, in the minute it
//! completes. Like quotas, `used >= limit` refuses, so the request that crosses a token limit
//! completes and the next one is skipped.

use std::sync::{Arc, Mutex, OnceLock};

use rustc_hash::FxHashMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::own_shared::SharedOwnLimits;
use crate::provider::Credential;
use crate::store::{OwnLimitStore, Store, StoreResult};

const MINUTE_MS: i64 = 60_000;
const DAY_MS: i64 = 86_400_000;

/// A credential's own limits; `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnLimits {
    /// Requests per UTC minute.
    pub requests_per_minute: Option<i64>,
    /// Tokens (prompt + completion) per UTC minute.
    pub tokens_per_minute: Option<i64>,
    /// Requests per UTC day.
    pub requests_per_day: Option<i64>,
}

impl OwnLimits {
    /// The limits configured on `cred`.
    pub fn of(cred: &Credential) -> Self {
        OwnLimits {
            requests_per_minute: cred.requests_per_minute,
            tokens_per_minute: cred.tokens_per_minute,
            requests_per_day: cred.requests_per_day,
        }
    }
}

/// One own-limit count of the current window. Every figure is in `0..=i64::MAX` and all
/// arithmetic on them saturates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Shared {
    /// Every gateway's total as the store answered at this gateway's last flush.
    global: i64,
    /// Added here since the last flush.
    pending: i64,
    /// Taken by the flush under way, not yet in `global`.
    flushing: i64,
    /// Every gateway's total as Redis last answered it (a write of this gateway or a notice).
    redis: i64,
    /// Queued for Redis here and not in an answer of it yet.
    unsent: i64,
}

impl Shared {
    /// This gateway's own total: the store's and what it has not written there yet.
    fn own(&self) -> i64 {
        self.global
            .saturating_add(self.pending)
            .saturating_add(self.flushing)
    }

    /// The count as this gateway sees it: its own total, or Redis's and what Redis has not
    /// answered yet if that is more (Redis only makes admission stricter).
    fn used(&self) -> i64 {
        self.own().max(self.redis.saturating_add(self.unsent))
    }

    fn add(&mut self, n: i64) {
        self.pending = self.pending.saturating_add(n.max(0));
    }
}

/// The three own-limit counts, as stored in `upstream_counters.counter`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Count {
    /// Requests of a UTC minute.
    MinuteRequests,
    /// Tokens of a UTC minute.
    MinuteTokens,
    /// Requests of a UTC day.
    DayRequests,
}

impl Count {
    const ALL: [Count; 3] = [Count::MinuteRequests, Count::MinuteTokens, Count::DayRequests];

    fn as_str(self) -> &'static str {
        match self {
            Count::MinuteRequests => "minute_requests",
            Count::MinuteTokens => "minute_tokens",
            Count::DayRequests => "day_requests",
        }
    }

    fn parse(s: &str) -> Option<Count> {
        Count::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Its name in Redis's keys and notices.
    pub fn short(self) -> &'static str {
        match self {
            Count::MinuteRequests => "rpm",
            Count::MinuteTokens => "tpm",
            Count::DayRequests => "rpd",
        }
    }

    /// The count named `s` in Redis.
    pub fn parse_short(s: &str) -> Option<Count> {
        Count::ALL.into_iter().find(|c| c.short() == s)
    }
}

/// What a credential used in its current UTC minute and day.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnUsage {
    /// Start of the minute counted, Unix ms.
    minute_start: i64,
    /// Requests dispatched in that minute.
    minute_requests: Shared,
    /// Tokens of requests completed in that minute.
    minute_tokens: Shared,
    /// Start of the UTC day counted, Unix ms.
    day_start: i64,
    /// Requests dispatched that day.
    day_requests: Shared,
}

impl OwnUsage {
    /// Starts new windows when `now_ms` is past the counted ones; never goes back to an earlier
    /// window (a flush that read the time before a request moved the windows on must not reset
    /// them). What an ended window had not written yet is dropped: no limit counts it any more.
    fn roll(&mut self, now_ms: i64) {
        let minute = now_ms - now_ms.rem_euclid(MINUTE_MS);
        if minute > self.minute_start {
            self.minute_start = minute;
            self.minute_requests = Shared::default();
            self.minute_tokens = Shared::default();
        }
        let day = now_ms - now_ms.rem_euclid(DAY_MS);
        if day > self.day_start {
            self.day_start = day;
            self.day_requests = Shared::default();
        }
    }

    /// The start of the current window of `count`.
    fn start_of(&self, count: Count) -> i64 {
        match count {
            Count::DayRequests => self.day_start,
            Count::MinuteRequests | Count::MinuteTokens => self.minute_start,
        }
    }

    /// The count `count` of the window starting at `start`, if that is the current one.
    fn count_mut(&mut self, count: Count, start: i64) -> Option<&mut Shared> {
        match count {
            Count::MinuteRequests => (self.minute_start == start).then_some(&mut self.minute_requests),
            Count::MinuteTokens => (self.minute_start == start).then_some(&mut self.minute_tokens),
            Count::DayRequests => (self.day_start == start).then_some(&mut self.day_requests),
        }
    }

    /// `None` when one more request fits `limits` at `now_ms`; otherwise the instant (Unix ms)
    /// the credential may take one again: the latest rollover among the windows used up (a
    /// credential out of both its minute and its day is back at the next day).
    pub fn blocked_until(&mut self, limits: &OwnLimits, now_ms: i64) -> Option<i64> {
        self.roll(now_ms);
        let minute_end = self.minute_start + MINUTE_MS;
        let day_end = self.day_start + DAY_MS;
        let used_up = |used: &Shared, limit: Option<i64>| limit.is_some_and(|l| used.used() >= l);
        [
            (
                used_up(&self.minute_requests, limits.requests_per_minute),
                minute_end,
            ),
            (used_up(&self.minute_tokens, limits.tokens_per_minute), minute_end),
            (used_up(&self.day_requests, limits.requests_per_day), day_end),
        ]
        .into_iter()
        .filter(|(used_up, _)| *used_up)
        .map(|(_, end)| end)
        .max()
    }

    /// One request dispatched at `now_ms`.
    pub fn count_request(&mut self, now_ms: i64) {
        self.roll(now_ms);
        self.minute_requests.add(1);
        self.day_requests.add(1);
    }

    /// Tokens of a request that completed at `now_ms`.
    pub fn count_tokens(&mut self, tokens: i64, now_ms: i64) {
        self.roll(now_ms);
        self.minute_tokens.add(tokens);
    }
}

/// Why a credential is not a candidate right now.
pub enum Refusal {
    /// An own limit is used up until this instant (Unix ms).
    OwnLimit {
        /// When the credential may take a request again.
        until_ms: i64,
    },
    /// Every in-flight slot is taken; the semaphore to wait on for one.
    Busy(Arc<Semaphore>),
}

/// One in-flight slot of a credential, held until the request completes (the end of the
/// response, the end of a stream, or the client going away); dropping it frees the slot.
#[derive(Debug)]
pub struct Slot(
    #[expect(dead_code, reason = "held for its Drop, which frees the slot")] OwnedSemaphorePermit,
);

struct CredentialLoad {
    usage: OwnUsage,
    max_in_flight: i64,
    slots: Arc<Semaphore>,
    /// Whether the credential had an own limit when it was last admitted to: only then are its
    /// counts shared through Redis (a credential without one has nothing to hold across
    /// gateways; the store still counts it).
    limited: bool,
}

impl CredentialLoad {
    fn new(max_in_flight: i64) -> Self {
        CredentialLoad {
            usage: OwnUsage::default(),
            max_in_flight,
            slots: Arc::new(Semaphore::new(permits(max_in_flight))),
            limited: false,
        }
    }
}

fn permits(max_in_flight: i64) -> usize {
    usize::try_from(max_in_flight.max(1))
        .unwrap_or(1)
        .min(Semaphore::MAX_PERMITS)
}

/// Every credential's own-limit usage and in-flight slots, by credential id. Kept apart from the
/// routing snapshot so that a configuration reload neither resets the counts nor frees slots.
#[derive(Default)]
pub struct Admission {
    credentials: Mutex<FxHashMap<i64, CredentialLoad>>,
    /// One flush at a time: a second one would see `flushing` counts as written. Holds the
    /// minute whose ended rows the last flush deleted.
    flushing: tokio::sync::Mutex<i64>,
    /// The counts' shared word through Redis, when `redis_url` is set.
    redis: OnceLock<Arc<SharedOwnLimits>>,
}

impl Admission {
    fn with<T>(&self, cred: &Credential, f: impl FnOnce(&mut CredentialLoad) -> T) -> T {
        let mut map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        let load = map
            .entry(cred.id)
            .or_insert_with(|| CredentialLoad::new(cred.max_in_flight));
        // A load made by a flush (`UNKNOWN_MAX_IN_FLIGHT`) gets its slots here, before any is taken.
        // A changed max_in_flight starts a fresh count of slots; requests still holding slots of
        // the old count finish on them (a brief overshoot, only when an admin changes the limit).
        if load.max_in_flight != cred.max_in_flight {
            load.max_in_flight = cred.max_in_flight;
            load.slots = Arc::new(Semaphore::new(permits(cred.max_in_flight)));
        }
        load.limited = OwnLimits::of(cred) != OwnLimits::default();
        f(load)
    }

    /// Admits one request on `cred` at `now_ms`: its own limits have room and a slot is free.
    /// The request is counted and holds the returned slot.
    pub fn admit(&self, cred: &Credential, now_ms: i64) -> Result<Slot, Refusal> {
        let limits = OwnLimits::of(cred);
        self.with(cred, |load| {
            if let Some(until_ms) = load.usage.blocked_until(&limits, now_ms) {
                return Err(Refusal::OwnLimit { until_ms });
            }
            let permit = load
                .slots
                .clone()
                .try_acquire_owned()
                .map_err(|_| Refusal::Busy(load.slots.clone()))?;
            load.usage.count_request(now_ms);
            self.share(cred.id, load, REQUESTS, 1);
            Ok(Slot(permit))
        })
    }

    /// Admits one request on `cred` with a slot obtained by waiting: its own limits are checked
    /// again (they may have filled meanwhile) and the request is counted.
    pub fn admit_waited(
        &self,
        cred: &Credential,
        permit: OwnedSemaphorePermit,
        now_ms: i64,
    ) -> Result<Slot, i64> {
        let limits = OwnLimits::of(cred);
        self.with(cred, |load| {
            if let Some(until_ms) = load.usage.blocked_until(&limits, now_ms) {
                return Err(until_ms);
            }
            load.usage.count_request(now_ms);
            self.share(cred.id, load, REQUESTS, 1);
            Ok(Slot(permit))
        })
    }

    /// Counts a second request of one admitted request (the single-candidate retry) if its own
    /// limits have room; false when they do not.
    pub fn admit_again(&self, cred: &Credential, now_ms: i64) -> bool {
        let limits = OwnLimits::of(cred);
        self.with(cred, |load| {
            if load.usage.blocked_until(&limits, now_ms).is_some() {
                return false;
            }
            load.usage.count_request(now_ms);
            self.share(cred.id, load, REQUESTS, 1);
            true
        })
    }

    /// Whether `cred`'s own limits have room for one more request at `now_ms`; nothing is counted.
    pub fn has_room(&self, cred: &Credential, now_ms: i64) -> bool {
        let limits = OwnLimits::of(cred);
        self.with(cred, |load| load.usage.blocked_until(&limits, now_ms).is_none())
    }

    /// Adds the tokens of a completed request to the credential's minute.
    pub fn count_tokens(&self, credential_id: i64, tokens: u64, now_ms: i64) {
        let mut map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(load) = map.get_mut(&credential_id) {
            let tokens = i64::try_from(tokens).unwrap_or(i64::MAX);
            load.usage.count_tokens(tokens, now_ms);
            if tokens > 0 {
                self.share(credential_id, load, &[Count::MinuteTokens], tokens);
            }
        }
    }

    /// Shares the own-limit counts through `shared` from now on (`redis_url` set).
    pub fn share_through(&self, shared: Arc<SharedOwnLimits>) {
        let _ = self.redis.set(shared);
    }

    /// The counts' shared word through Redis, if any.
    pub fn redis(&self) -> Option<&Arc<SharedOwnLimits>> {
        self.redis.get()
    }

    /// Queues for Redis the `n` just counted on `counts` of credential `id`, while Redis answers
    /// and the credential has an own limit; they stay `unsent` until an answer of Redis holds
    /// them.
    fn share(&self, id: i64, load: &mut CredentialLoad, counts: &[Count], n: i64) {
        let Some(redis) = self.redis.get().filter(|r| load.limited && r.is_up()) else {
            return;
        };
        let usage = &mut load.usage;
        for &count in counts {
            let start = usage.start_of(count);
            if let Some(c) = usage.count_mut(count, start) {
                c.unsent = c.unsent.saturating_add(n);
                redis.queue((id, count, start), n, c.own());
            }
        }
    }

    /// Redis's answer to a write of this gateway: (counter, what the write added, the total).
    pub fn learn_written(&self, written: &[((i64, Count, i64), i64, i64)]) {
        let mut map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        for ((id, count, start), added, total) in written {
            let Some(c) = map.get_mut(id).and_then(|l| l.usage.count_mut(*count, *start)) else {
                continue; // its window ended meanwhile
            };
            c.unsent = c.unsent.saturating_sub(*added).max(0);
            c.redis = c.redis.max(*total);
        }
    }

    /// Applies an own-limit notice another gateway's write published on the locks channel; false
    /// if `payload` is no own-limit notice.
    pub fn hear(&self, payload: &[u8], now_ms: i64) -> bool {
        if !super::own_shared::is_notice(payload) {
            return false;
        }
        let Some(totals) = self.redis.get().and_then(|r| r.heard(payload)) else {
            return true;
        };
        let mut map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        for ((id, count, start), total) in totals {
            let load = map
                .entry(id)
                .or_insert_with(|| CredentialLoad::new(UNKNOWN_MAX_IN_FLIGHT));
            load.usage.roll(now_ms);
            if let Some(c) = load.usage.count_mut(count, start) {
                c.redis = c.redis.max(total);
            }
        }
        true
    }

    /// What this gateway counts of a credential's current windows as it last saw them: requests
    /// and tokens of the minute, requests of the day (tests, diagnostics).
    pub fn used(&self, credential_id: i64, now_ms: i64) -> [i64; 3] {
        let mut map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        map.get_mut(&credential_id).map_or([0; 3], |load| {
            load.usage.roll(now_ms);
            let u = &load.usage;
            [
                u.minute_requests.used(),
                u.minute_tokens.used(),
                u.day_requests.used(),
            ]
        })
    }

    /// Writes what this gateway counted since the last flush to `upstream_counters` in one
    /// transaction, then reads every gateway's totals of the current windows (of credentials
    /// this gateway has not used yet too, so its first request already sees them) and deletes
    /// the rows of ended windows. Returns how many counts were written.
    ///
    /// A count leaves `flushing` for `global` only once its transaction committed, and goes back
    /// to pending when it rolled back: never lost, never added twice.
    pub async fn flush(&self, store: &Store, now_ms: i64) -> StoreResult<usize> {
        let mut swept_minute = self.flushing.lock().await;
        let mut batch: Vec<(i64, Count, i64, i64)> = {
            let mut map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
            let mut batch = Vec::new();
            for (id, load) in map.iter_mut() {
                load.usage.roll(now_ms);
                let (minute, day) = (load.usage.minute_start, load.usage.day_start);
                for count in Count::ALL {
                    let start = if count == Count::DayRequests { day } else { minute };
                    if let Some(c) = load.usage.count_mut(count, start) {
                        let delta = std::mem::take(&mut c.pending);
                        if delta > 0 {
                            c.flushing = delta;
                            batch.push((*id, count, start, delta));
                        }
                    }
                }
            }
            batch
        };
        // Rows are locked in one order by every gateway: two flushes never wait in a circle.
        batch.sort_unstable();
        let written = write_counts(store, &batch).await;
        let totals = match &written {
            Ok(()) => read_totals(store, now_ms).await,
            Err(_) => Ok(Vec::new()),
        };
        {
            let mut map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
            for (id, count, start, delta) in &batch {
                let Some(c) = map.get_mut(id).and_then(|l| l.usage.count_mut(*count, *start)) else {
                    continue; // its window ended meanwhile
                };
                let flushed = std::mem::take(&mut c.flushing);
                if written.is_ok() {
                    // Committed: in the total read below, or counted here should the read fail.
                    c.global = c.global.saturating_add(*delta);
                } else {
                    c.pending = c.pending.saturating_add(flushed);
                }
            }
            for (id, count, start, total) in totals.as_ref().map(Vec::as_slice).unwrap_or_default() {
                let load = map
                    .entry(*id)
                    .or_insert_with(|| CredentialLoad::new(UNKNOWN_MAX_IN_FLIGHT));
                load.usage.roll(now_ms);
                if let Some(c) = load.usage.count_mut(*count, *start) {
                    // The store's total already holds every committed count of this gateway.
                    c.global = c.global.max(*total);
                }
            }
        }
        written?;
        totals?;
        // Once a minute: the rows of ended minutes, and of ended days.
        let minute = now_ms - now_ms.rem_euclid(MINUTE_MS);
        if minute > *swept_minute {
            let day = now_ms - now_ms.rem_euclid(DAY_MS);
            store
                .delete_ended_own_limit_counts(minute, Count::DayRequests.as_str(), day)
                .await?;
            *swept_minute = minute;
        }
        Ok(batch.len())
    }

    /// Requests in flight on a credential (metrics, tests).
    pub fn in_flight(&self, credential_id: i64) -> usize {
        let map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&credential_id).map_or(0, |load| {
            permits(load.max_in_flight).saturating_sub(load.slots.available_permits())
        })
    }
}

/// The counts a dispatched request adds to.
const REQUESTS: &[Count] = &[Count::MinuteRequests, Count::DayRequests];

/// The `max_in_flight` of a load a flush made for a credential this gateway has not admitted
/// yet: no credential has it, so the first admission sets the real slots.
const UNKNOWN_MAX_IN_FLIGHT: i64 = i64::MIN;

/// Adds `batch` (credential, count, window start, delta) to the shared counts.
async fn write_counts(store: &Store, batch: &[(i64, Count, i64, i64)]) -> StoreResult<()> {
    let rows: Vec<_> = batch
        .iter()
        .map(|(id, count, start, delta)| (*id, count.as_str(), *start, *delta))
        .collect();
    store.add_own_limit_counts(&rows).await
}

/// Every gateway's totals of the windows current at `now_ms` (rows of ended minutes the next
/// delete removes are read too and ignored by the caller).
async fn read_totals(store: &Store, now_ms: i64) -> StoreResult<Vec<(i64, Count, i64, i64)>> {
    let day = now_ms - now_ms.rem_euclid(DAY_MS);
    Ok(store
        .own_limit_totals(day)
        .await?
        .into_iter()
        .filter_map(|(id, c, start, used)| Some((id, Count::parse(&c)?, start, used)))
        .collect())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// 2026-12-01T02:00:00Z, a minute and not a day boundary.
    const T0: i64 = 1_796_090_400_000;
    const DAY0_END: i64 = T0 - 2 * 3_600_000 + DAY_MS;

    fn limits(rpm: Option<i64>, tpm: Option<i64>, rpd: Option<i64>) -> OwnLimits {
        OwnLimits {
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
            requests_per_day: rpd,
        }
    }

    #[test]
    fn own_limit_windows() {
        // (name, limits, requests before, tokens before, asked at, blocked until)
        type Row = (&'static str, OwnLimits, i64, i64, i64, Option<i64>);
        let rows: &[Row] = &[
            ("no limits", limits(None, None, None), 1000, 1_000_000, T0, None),
            ("rpm room", limits(Some(2), None, None), 1, 0, T0 + 59_999, None),
            (
                "rpm used up",
                limits(Some(2), None, None),
                2,
                0,
                T0 + 1,
                Some(T0 + MINUTE_MS),
            ),
            (
                "rpm used up, last ms of the minute",
                limits(Some(2), None, None),
                2,
                0,
                T0 + 59_999,
                Some(T0 + MINUTE_MS),
            ),
            (
                "rpm rolled over at the minute",
                limits(Some(2), None, None),
                2,
                0,
                T0 + MINUTE_MS,
                None,
            ),
            (
                "tpm room: the crossing request completed",
                limits(None, Some(100), None),
                0,
                99,
                T0,
                None,
            ),
            (
                "tpm used up",
                limits(None, Some(100), None),
                0,
                100,
                T0 + 30_000,
                Some(T0 + MINUTE_MS),
            ),
            (
                "tpm rolled over",
                limits(None, Some(100), None),
                0,
                500,
                T0 + MINUTE_MS + 1,
                None,
            ),
            (
                "rpd used up",
                limits(None, None, Some(2)),
                2,
                0,
                T0 + 5 * MINUTE_MS,
                Some(DAY0_END),
            ),
            (
                "rpd rolled over at 00:00 UTC",
                limits(None, None, Some(2)),
                2,
                0,
                DAY0_END,
                None,
            ),
            (
                "rpd room, rpm used up",
                limits(Some(2), None, Some(5)),
                2,
                0,
                T0,
                Some(T0 + MINUTE_MS),
            ),
            (
                "minute and day used up: back the next day",
                limits(Some(2), None, Some(2)),
                2,
                0,
                T0,
                Some(DAY0_END),
            ),
            (
                "nothing used yet",
                limits(Some(1), Some(1), Some(1)),
                0,
                0,
                T0,
                None,
            ),
        ];
        for (name, limits, requests, tokens, at, want) in rows {
            let mut u = OwnUsage::default();
            for _ in 0..*requests {
                u.count_request(T0);
            }
            u.count_tokens(*tokens, T0);
            assert_eq!(u.blocked_until(limits, *at), *want, "{name}");
        }
    }

    #[test]
    fn tokens_count_in_the_minute_they_complete() {
        let l = limits(None, Some(10), None);
        let mut u = OwnUsage::default();
        u.count_request(T0 + 59_000);
        u.count_tokens(50, T0 + MINUTE_MS + 1);
        assert_eq!(u.blocked_until(&l, T0 + MINUTE_MS + 2), Some(T0 + 2 * MINUTE_MS));
    }

    async fn temp_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("own.db").display());
        let store = Store::connect(&url).await.unwrap();
        (dir, store)
    }

    /// Counts `n` requests on credential `id` at `now_ms`, as `admit` does.
    fn count_requests(adm: &Admission, id: i64, n: usize, now_ms: i64) {
        let mut map = adm.credentials.lock().unwrap();
        let load = map.entry(id).or_insert_with(|| CredentialLoad::new(1));
        for _ in 0..n {
            load.usage.count_request(now_ms);
        }
    }

    fn blocked(adm: &Admission, id: i64, l: &OwnLimits, now_ms: i64) -> Option<i64> {
        let mut map = adm.credentials.lock().unwrap();
        map.get_mut(&id)
            .and_then(|load| load.usage.blocked_until(l, now_ms))
    }

    async fn rows(store: &Store) -> usize {
        store.own_limit_totals(i64::MIN).await.unwrap().len()
    }

    #[tokio::test]
    async fn gateways_see_each_others_counts_after_their_flushes() {
        let (_dir, store) = temp_store().await;
        let (a, b) = (Admission::default(), Admission::default());
        count_requests(&a, 7, 2, T0);
        a.count_tokens(7, 10, T0);
        b.flush(&store, T0 + 1).await.unwrap();
        assert_eq!(
            blocked(&b, 7, &limits(Some(2), None, None), T0 + 1),
            None,
            "a has not flushed"
        );
        assert_eq!(a.flush(&store, T0 + 1).await.unwrap(), 3);
        assert_eq!(a.flush(&store, T0 + 1).await.unwrap(), 0, "nothing new to write");
        // b never admitted on credential 7: its flush still learns the totals.
        b.flush(&store, T0 + 2).await.unwrap();
        let minute_end = Some(T0 + MINUTE_MS);
        assert_eq!(blocked(&b, 7, &limits(Some(2), None, None), T0 + 2), minute_end);
        assert_eq!(
            blocked(&b, 7, &limits(Some(3), None, None), T0 + 2),
            None,
            "counted once"
        );
        assert_eq!(blocked(&b, 7, &limits(None, Some(10), None), T0 + 2), minute_end);
        assert_eq!(
            blocked(&b, 7, &limits(None, None, Some(2)), T0 + 2),
            Some(DAY0_END)
        );
        // b adds its own on top of a's: a sees 3 after both flushed.
        count_requests(&b, 7, 1, T0 + 3);
        b.flush(&store, T0 + 3).await.unwrap();
        a.flush(&store, T0 + 4).await.unwrap();
        assert_eq!(blocked(&a, 7, &limits(Some(3), None, None), T0 + 4), minute_end);
        assert_eq!(blocked(&a, 7, &limits(Some(4), None, None), T0 + 4), None);
        // The next minute starts from 0 for both; the day goes on; the ended minute's rows go.
        let next = T0 + MINUTE_MS;
        a.flush(&store, next).await.unwrap();
        b.flush(&store, next).await.unwrap();
        assert_eq!(blocked(&b, 7, &limits(Some(1), Some(1), None), next), None);
        assert_eq!(blocked(&b, 7, &limits(None, None, Some(3)), next), Some(DAY0_END));
        assert_eq!(rows(&store).await, 1, "only the day's row is left");
    }

    #[tokio::test]
    async fn a_failed_flush_keeps_its_counts_for_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("own.db").display());
        let (a, b) = (Admission::default(), Admission::default());
        count_requests(&a, 7, 2, T0);
        let gone = Store::connect(&url).await.unwrap();
        gone.close().await;
        assert!(a.flush(&gone, T0 + 1).await.is_err());
        let two = limits(Some(2), None, None);
        assert_eq!(
            blocked(&a, 7, &two, T0 + 1),
            Some(T0 + MINUTE_MS),
            "still counted here"
        );
        let store = Store::connect(&url).await.unwrap();
        assert_eq!(a.flush(&store, T0 + 2).await.unwrap(), 2);
        b.flush(&store, T0 + 3).await.unwrap();
        assert_eq!(blocked(&b, 7, &two, T0 + 3), Some(T0 + MINUTE_MS));
        assert_eq!(
            blocked(&b, 7, &limits(Some(3), None, None), T0 + 3),
            None,
            "written once"
        );
        assert_eq!(
            blocked(&a, 7, &limits(Some(3), None, None), T0 + 3),
            None,
            "not doubled here"
        );
    }

    #[tokio::test]
    async fn redis_totals_only_make_admission_stricter() {
        let adm = Admission::default();
        // Connected lazily: nothing is sent, the writer is not running.
        let link =
            crate::kernel::redis_link::RedisLink::new("redis://127.0.0.1:1/", Duration::from_millis(50))
                .expect("a url");
        adm.share_through(Arc::new(SharedOwnLimits::connect(&link, "c")));
        count_requests(&adm, 7, 1, T0);
        adm.count_tokens(7, 10, T0);
        assert_eq!(adm.used(7, T0), [1, 10, 1]);
        let tpm = (7, Count::MinuteTokens, T0);
        // Redis answers this gateway's 10 tokens within a total of 25.
        adm.learn_written(&[(tpm, 10, 25)]);
        assert_eq!(adm.used(7, T0)[1], 25);
        assert_eq!(
            blocked(&adm, 7, &limits(None, Some(25), None), T0),
            Some(T0 + MINUTE_MS)
        );
        // A lower total, or one of an ended window, never lowers the count.
        adm.learn_written(&[(tpm, 0, 3), ((7, Count::MinuteTokens, T0 - MINUTE_MS), 0, 99)]);
        assert_eq!(adm.used(7, T0)[1], 25);
        // Another gateway's notice, for a credential this one has not used too.
        let notice = format!("other own 7:rpm:{T0}:4 8:rpd:{}:9", DAY0_END - DAY_MS);
        assert!(adm.hear(notice.as_bytes(), T0));
        assert_eq!(adm.used(7, T0), [4, 25, 1]);
        assert_eq!(adm.used(8, T0), [0, 0, 9]);
        assert!(
            adm.hear(b"other own 7:rpm:nope", T0),
            "an own notice, malformed: dropped"
        );
        assert!(!adm.hear(b"other lock 7 0 x y", T0), "the locks' notice");
        // The store's count stands when it is the larger.
        count_requests(&adm, 7, 5, T0);
        assert_eq!(adm.used(7, T0)[0], 6);
    }

    #[test]
    fn a_flush_that_read_the_time_earlier_does_not_reset_a_newer_window() {
        let mut u = OwnUsage::default();
        u.count_request(T0 + MINUTE_MS);
        u.roll(T0 + MINUTE_MS - 1);
        assert_eq!(
            u.blocked_until(&limits(Some(1), None, None), T0 + MINUTE_MS),
            Some(T0 + 2 * MINUTE_MS)
        );
    }
}
