//! Whether a credential may take one more request before anything is sent (DESIGN.md §1 "own
//! limits and concurrency slot free"): its own limits (requests/minute, tokens/minute,
//! requests/day) and its in-flight slots (`max_in_flight`).
//!
//! Everything here is in memory and per gateway process: nothing on the request path waits on
//! the database, and own limits are not shared by replicas (N gateways may together send up to N
//! times a credential's own limit; see docs/upstreams.md). Windows are aligned in UTC: a minute
//! runs from hh:mm:00.000 to the next minute, a day from 00:00 UTC to the next 00:00 UTC,
//! whatever the workspace's quota time zone — these limits model the provider's, not a tenant's.
//!
//! Requests are counted when they are dispatched (every attempt sent upstream, a failed one
//! included: the provider counts it too); tokens when the request completes, in the minute it
//! completes. Like quotas, `used >= limit` refuses, so the request that crosses a token limit
//! completes and the next one is skipped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::pool::Credential;

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

/// What a credential used in its current UTC minute and day.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnUsage {
    /// Start of the minute counted, Unix ms.
    minute_start: i64,
    /// Requests dispatched in that minute.
    minute_requests: i64,
    /// Tokens of requests completed in that minute.
    minute_tokens: i64,
    /// Start of the UTC day counted, Unix ms.
    day_start: i64,
    /// Requests dispatched that day.
    day_requests: i64,
}

impl OwnUsage {
    /// Starts new windows when `now_ms` is past the counted ones.
    fn roll(&mut self, now_ms: i64) {
        let minute = now_ms - now_ms.rem_euclid(MINUTE_MS);
        if minute != self.minute_start {
            self.minute_start = minute;
            self.minute_requests = 0;
            self.minute_tokens = 0;
        }
        let day = now_ms - now_ms.rem_euclid(DAY_MS);
        if day != self.day_start {
            self.day_start = day;
            self.day_requests = 0;
        }
    }

    /// `None` when one more request fits `limits` at `now_ms`; otherwise the instant (Unix ms)
    /// the credential may take one again: the latest rollover among the windows used up (a
    /// credential out of both its minute and its day is back at the next day).
    pub fn blocked_until(&mut self, limits: &OwnLimits, now_ms: i64) -> Option<i64> {
        self.roll(now_ms);
        let minute_end = self.minute_start + MINUTE_MS;
        let day_end = self.day_start + DAY_MS;
        let used_up = |used: i64, limit: Option<i64>| limit.is_some_and(|l| used >= l);
        [
            (
                used_up(self.minute_requests, limits.requests_per_minute),
                minute_end,
            ),
            (used_up(self.minute_tokens, limits.tokens_per_minute), minute_end),
            (used_up(self.day_requests, limits.requests_per_day), day_end),
        ]
        .into_iter()
        .filter(|(used_up, _)| *used_up)
        .map(|(_, end)| end)
        .max()
    }

    /// One request dispatched at `now_ms`.
    pub fn count_request(&mut self, now_ms: i64) {
        self.roll(now_ms);
        self.minute_requests += 1;
        self.day_requests += 1;
    }

    /// Tokens of a request that completed at `now_ms`.
    pub fn count_tokens(&mut self, tokens: i64, now_ms: i64) {
        self.roll(now_ms);
        self.minute_tokens = self.minute_tokens.saturating_add(tokens);
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
}

impl CredentialLoad {
    fn new(max_in_flight: i64) -> Self {
        CredentialLoad {
            usage: OwnUsage::default(),
            max_in_flight,
            slots: Arc::new(Semaphore::new(permits(max_in_flight))),
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
    credentials: Mutex<HashMap<i64, CredentialLoad>>,
}

impl Admission {
    fn with<T>(&self, cred: &Credential, f: impl FnOnce(&mut CredentialLoad) -> T) -> T {
        let mut map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        let load = map
            .entry(cred.id)
            .or_insert_with(|| CredentialLoad::new(cred.max_in_flight));
        // A changed max_in_flight starts a fresh count of slots; requests still holding slots of
        // the old count finish on them (a brief overshoot, only when an admin changes the limit).
        if load.max_in_flight != cred.max_in_flight {
            load.max_in_flight = cred.max_in_flight;
            load.slots = Arc::new(Semaphore::new(permits(cred.max_in_flight)));
        }
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
            true
        })
    }

    /// Adds the tokens of a completed request to the credential's minute.
    pub fn count_tokens(&self, credential_id: i64, tokens: u64, now_ms: i64) {
        let mut map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(load) = map.get_mut(&credential_id) {
            load.usage
                .count_tokens(i64::try_from(tokens).unwrap_or(i64::MAX), now_ms);
        }
    }

    /// Requests in flight on a credential (metrics, tests).
    pub fn in_flight(&self, credential_id: i64) -> usize {
        let map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&credential_id).map_or(0, |load| {
            permits(load.max_in_flight).saturating_sub(load.slots.available_permits())
        })
    }
}

#[cfg(test)]
mod tests {
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
}
