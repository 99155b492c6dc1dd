//! The quota counters' shared word across gateways: Redis (issue 44, DESIGN.md §11,
//! docs/scaling.md). Optional: without `redis_url` nothing here exists and each gateway counts as
//! before (its memory, the store's totals at each flush).
//!
//! Invariants:
//! - Before dispatch, at most one round trip: one `MGET` of every counter the request depends on
//!   ([`SharedCounters::read`]); a standing's `used` is the larger of Redis's total and this
//!   gateway's own, so Redis can only make a check stricter, never looser.
//! - Usage is still counted after completion (LyRouter seed 003: the crossing request completes):
//!   [`SharedCounters::add`] queues the delta, and one writer task sends what has queued in one
//!   script per round trip. With every gateway on one Redis, the overshoot of a quota is at most
//!   the requests in flight across all of them, a request being in flight until its count is in
//!   Redis (docs/quotas.md).
//! - Exactly once: each batch carries this gateway's sequence number, and the script applies a
//!   batch only if its number is above the last one applied for this gateway. A batch that timed
//!   out is sent again unchanged until Redis answers, so a batch Redis ran late (a paused or slow
//!   server) and then again is counted once; what was counted meanwhile goes in the next batch.
//! - An empty Redis (a restart without persistence, `FLUSHALL`) is reseeded: a counter missing
//!   from it is set to this gateway's own total (the store's as last read plus its own unwritten
//!   usage, a lower bound of the truth) instead of being incremented from 0.
//! - Redis away or slower than `redis_timeout_ms`: checks use this gateway's own counters (the
//!   bound without Redis) and do not wait on Redis again until the writer's probe (a `PING`
//!   answered within `redis_timeout_ms`, whatever the writes do) finds it back;
//!   the change is logged once each way and shown by `/readyz` and `aigw_redis_up`.
//! - The store stays the system of record: the flush writes each gateway's deltas as before.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustc_hash::FxHashMap;
use tokio_util::sync::CancellationToken;

use super::engine::{CounterKey, Standing};
use crate::kernel::redis_link::RedisLink;

/// Seconds a counter outlives its window's end in Redis at least: past the latest reset a refusal
/// announces (1 to 2 minutes after the end, DESIGN.md §4).
const EXPIRY_MARGIN_SECS: i64 = 300;

/// Most counters one write carries (one script holds Redis for its run).
const MAX_BATCH: usize = 2000;

/// How long the writer waits before it tries an absent Redis again.
const RETRY: Duration = Duration::from_millis(200);

/// Applies one batch of one gateway, once. KEYS[1]: the gateway's last applied sequence number;
/// KEYS[2..]: the counters. ARGV[1]: this batch's number; then per counter its delta, this
/// gateway's own total (the seed of a missing counter) and the seconds it lives on (0: for ever).
/// Numbers stay strings where Lua's doubles would round them.
const APPLY: &str = r"
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', 86400)
for i = 2, #KEYS do
  local a = 2 + (i - 2) * 3
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.pcall('INCRBY', KEYS[i], ARGV[a])
  elseif tonumber(ARGV[a + 1]) >= tonumber(ARGV[a]) then
    redis.call('SET', KEYS[i], ARGV[a + 1])
  else
    redis.call('SET', KEYS[i], ARGV[a])
  end
  if tonumber(ARGV[a + 2]) > 0 then redis.call('EXPIRE', KEYS[i], ARGV[a + 2]) end
end
return 1
";

/// A counter's usage not yet in Redis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Unwritten {
    /// Added here since the last write.
    add: i64,
    /// This gateway's own total of the counter, unwritten usage included.
    seed: i64,
    /// How long Redis keeps it after this write, in seconds (0: for ever).
    ttl: i64,
}

/// The shared counters of one gateway: the connection, whether Redis answers, and what this
/// gateway counted that Redis has not got yet.
pub struct SharedCounters {
    /// One server's or a cluster's; every call is also bounded by `timeout`.
    conn: RedisLink,
    /// Longest a round trip may take (`redis_timeout_ms`).
    timeout: Duration,
    /// Whether the last exchange with Redis succeeded: checks read Redis only while it is.
    up: AtomicBool,
    /// Usage counted here and not yet written, merged per counter.
    unwritten: Mutex<FxHashMap<CounterKey, Unwritten>>,
    /// Wakes the writer when something is queued.
    wake: tokio::sync::Notify,
    /// This gateway's sequence key (one per process).
    writer_key: String,
    /// [`APPLY`], sent by its digest.
    script: redis::Script,
}

/// The Redis key of a counter. Every quota key is under the hash tag `{quota}`: on a cluster the
/// writer's script and the check's `MGET` name keys of one slot.
fn redis_key(k: &CounterKey) -> String {
    format!(
        "aigw:{{quota}}:{}:{}:{}:{}:{}",
        k.subject.as_str(),
        k.subject_id,
        k.metric.as_str(),
        k.window,
        k.start
    )
}

impl SharedCounters {
    /// A client of the Redis at `url` (connected in the background, so an absent Redis does not
    /// stop the start); probes it once before returning, to log and show its state from the start.
    pub async fn connect(url: &str, timeout: Duration) -> Result<SharedCounters, String> {
        let conn = RedisLink::new(url, write_timeout(timeout))?;
        let shared = SharedCounters {
            conn,
            timeout,
            up: AtomicBool::new(true),
            unwritten: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            writer_key: format!("aigw:{{quota}}:writer:{}", uuid::Uuid::now_v7()),
            script: redis::Script::new(APPLY),
        };
        if let Err(e) = shared.ping().await {
            shared.went_down(&e);
        }
        Ok(shared)
    }

    /// Whether Redis answered the last exchange (`aigw_redis_up`, `/readyz`).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Raises each standing's `used` to Redis's total of its counter: one `MGET`, bounded by the
    /// timeout. Redis away: nothing read, nothing waited for; the gateway's own counts stand.
    pub(super) async fn raise(&self, standings: &mut [Standing]) {
        if standings.is_empty() || !self.is_up() {
            return;
        }
        let mut cmd = redis::cmd("MGET");
        for s in standings.iter() {
            cmd.arg(redis_key(&s.key));
        }
        let mut conn = self.conn.clone();
        match bounded(self.timeout, cmd.query_async::<Vec<Option<i64>>>(&mut conn)).await {
            Ok(totals) => {
                for (s, total) in standings.iter_mut().zip(totals) {
                    s.used = s.used.max(total.unwrap_or(0));
                }
            }
            Err(why) => self.went_down(&why),
        }
    }

    /// Queues `add` of counter `key` for Redis; `seed` is this gateway's own total of it, usage
    /// just added included; `window_secs` the length of its window (none for `total`). The
    /// writer is woken by [`SharedCounters::send`] once a request's counters are all queued, so
    /// that they go in one write.
    ///
    /// Redis keeps a counter for a window and a margin after each write: written during its
    /// window, it outlives the window's end by at least the margin, whatever the difference
    /// between the gateways' clocks and Redis's (an absolute `EXPIREAT` would depend on it).
    pub(super) fn add(&self, key: &CounterKey, add: i64, seed: i64, window_secs: Option<i64>) {
        let ttl = window_secs.map_or(0, |w| w.max(1).saturating_add(EXPIRY_MARGIN_SECS));
        {
            let mut map = self.unwritten.lock().unwrap_or_else(|p| p.into_inner());
            let u = map.entry(key.clone()).or_default();
            u.add = u.add.saturating_add(add);
            u.seed = u.seed.max(seed);
            u.ttl = u.ttl.max(ttl);
        }
    }

    /// Wakes the writer for what [`SharedCounters::add`] queued.
    pub(super) fn send(&self) {
        self.wake.notify_one();
    }

    /// The writer: sends what has queued, one batch per round trip, until `shutdown` (then one
    /// last try). A batch that failed is sent again unchanged (the script applies it once).
    pub async fn run(self: std::sync::Arc<Self>, shutdown: CancellationToken) {
        let mut seq: u64 = 0;
        let mut batch: Option<(u64, Vec<(CounterKey, Unwritten)>)> = None;
        loop {
            let stopping = shutdown.is_cancelled();
            if batch.is_none() {
                let taken = self.take_batch();
                if !taken.is_empty() {
                    seq += 1;
                    batch = Some((seq, taken));
                } else if stopping {
                    return;
                } else if !self.is_up() {
                    // Nothing to write: find out whether Redis is back.
                    match self.ping().await {
                        Ok(()) => self.came_back(),
                        Err(_) => {
                            tokio::select! {
                                () = tokio::time::sleep(RETRY) => {},
                                () = self.wake.notified() => {},
                                () = shutdown.cancelled() => {},
                            }
                        }
                    }
                    continue;
                } else {
                    tokio::select! {
                        () = self.wake.notified() => {},
                        () = shutdown.cancelled() => {},
                    }
                    continue;
                }
            }
            let Some((n, items)) = &batch else { continue };
            match self.write(*n, items).await {
                Ok(()) => {
                    batch = None;
                    // A write may wait longer than a check may: only a ping within the checks'
                    // bound says Redis is back, so a Redis slower than `redis_timeout_ms` stays
                    // away instead of coming and going with every write.
                    if !self.is_up() && self.ping().await.is_ok() {
                        self.came_back();
                    }
                }
                Err(e) => {
                    self.went_down(&e);
                    if stopping {
                        tracing::warn!(
                            counters = items.len(),
                            "stopping with quota usage Redis has not got; the store has it"
                        );
                        return;
                    }
                    tokio::select! {
                        () = tokio::time::sleep(RETRY) => {},
                        () = shutdown.cancelled() => {},
                    }
                }
            }
        }
    }

    /// Takes up to [`MAX_BATCH`] queued counters.
    fn take_batch(&self) -> Vec<(CounterKey, Unwritten)> {
        let mut map = self.unwritten.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() <= MAX_BATCH {
            return map.drain().collect();
        }
        let keys: Vec<CounterKey> = map.keys().take(MAX_BATCH).cloned().collect();
        keys.into_iter()
            .filter_map(|k| map.remove(&k).map(|u| (k, u)))
            .collect()
    }

    /// Runs [`APPLY`] on one batch.
    async fn write(&self, seq: u64, items: &[(CounterKey, Unwritten)]) -> Result<(), String> {
        let mut inv = self.script.prepare_invoke();
        inv.key(&self.writer_key).arg(seq);
        for (k, u) in items {
            inv.key(redis_key(k)).arg(u.add).arg(u.seed).arg(u.ttl);
        }
        let mut conn = self.conn.clone();
        bounded(write_timeout(self.timeout), inv.invoke_async::<i64>(&mut conn))
            .await
            .map(|_| ())
    }

    async fn ping(&self) -> Result<(), String> {
        let mut conn = self.conn.clone();
        let ping = redis::cmd("PING");
        bounded(self.timeout, ping.query_async::<String>(&mut conn))
            .await
            .map(|_| ())
    }

    /// Notes Redis away; logs it once per outage.
    fn went_down(&self, why: &str) {
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(error = %why, "redis unreachable: quotas are counted by this gateway alone until it returns");
        }
    }

    /// Notes Redis back; logs it once per outage.
    fn came_back(&self) {
        if !self.up.swap(true, Ordering::Relaxed) {
            tracing::info!("redis reachable again: quota counters shared");
        }
    }
}

/// `call` to Redis, waited on `timeout` at most: its answer, or why there is none (Redis's
/// error, or "timed out"). Every Redis call of the gateway goes through it.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

/// A write carries up to [`MAX_BATCH`] counters and is off the request path: it may take longer
/// than a read before Redis is taken for away.
fn write_timeout(timeout: Duration) -> Duration {
    timeout.max(Duration::from_millis(500))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::window::Window;
    use crate::quota::{Metric, SubjectKind};

    #[test]
    fn a_counter_is_named_by_its_identity_never_its_policy() {
        let cases = [
            (
                SubjectKind::Apikey,
                7,
                Metric::Requests,
                Window::Total,
                0,
                "aigw:{quota}:apikey:7:requests:total:0",
            ),
            (
                SubjectKind::Member,
                3,
                Metric::TotalTokens,
                Window::Day,
                1_764_000_000,
                "aigw:{quota}:member:3:total_tokens:day:1764000000",
            ),
        ];
        for (subject, subject_id, metric, window, start, want) in cases {
            let k = CounterKey {
                subject,
                subject_id,
                metric,
                window,
                start,
            };
            assert_eq!(redis_key(&k), want);
        }
    }
}
