//! The breaker's shared window and standings through Redis (issue 44, DESIGN.md §5 and §11,
//! docs/redis.md). Optional: without `redis_url` nothing here exists and replicas share a key's
//! window through the store alone (`breaker_buckets`, read at each flush).
//!
//! Invariants:
//! - Nothing before dispatch, no round trip on the request path: the outcomes the breaker shares
//!   (a key's, from its first failure: the store path's economy) are queued after completion, and
//!   one writer task sends what has queued in one script ([`APPLY`]) per round trip.
//! - LyRouter seed 003, "Error-rate circuit breaker", across every gateway: the script adds each
//!   key's per-second counts to its current window in Redis (`aigw:{breaker}:<key>:window`, fields
//!   `<second>:t`, `<second>:f` and `trip`, expiring [`super::BUCKETS_KEPT_SECS`] after its last
//!   write) and judges the 60 s window of all gateways: at least 100 requests, more than 90 %
//!   failed, trips the key.
//! - A trip happens once (a burst never walks a key up the ladder): every outcome and every trip a
//!   gateway decided itself carries the trips the key had when it was admitted, and the script
//!   applies it only if that is still the key's trip count in Redis (`aigw:{breaker}:<key>`, field
//!   `trips`): a compare-and-set run atomically by Redis. Outcomes of an earlier window are
//!   dropped; a second gateway's trip of the same step is refused and it adopts Redis's standing.
//! - A trip sets the key's standing in Redis (`blocked_until` or `banned`), is published on the
//!   locks channel (`<origin> breaker <key> <trips> <blocked_until ms, 0 when none> <0|1>`) and
//!   returned to the writer; every gateway applies what it hears as it applies the store's rows
//!   (trips only rise, a block only extends). The gateway whose script tripped the key persists
//!   the trip; the store stays the record, and its rows still reach every gateway at its reload.
//! - Every gateway's outcomes of a failing key reach the window, successes included: a batch that
//!   adds failures to a key's window (and does not trip it) is published
//!   (`<origin> breaker <key> failing`), and a gateway that hears it and holds outcomes of the key
//!   it does not share yet starts sharing them, its whole window first ([`super::Breakers::hear`]),
//!   as the store path's discovery does at each flush. So a gateway whose requests of the key all
//!   succeed is counted within a notice's delivery and one write round trip.
//! - Exactly once: the writer is the gateway's one Redis writer ([`crate::kernel::redis_writer`]),
//!   whose batches carry a sequence number that [`APPLY`] applies once.
//! - An empty Redis (restart, `FLUSHALL`): a key's trip count is set back to the largest the
//!   gateways' batches carry (never lowered), and its window starts empty: at most one window of
//!   outcomes is lost.
//! - Redis away or slower than `redis_timeout_ms`: nothing is queued for it; every gateway judges
//!   keys by the store-shared window, as without Redis (it is kept up all along), logged once.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

use super::{Breakers, LADDER_SECS, MIN_REQUESTS, Trip, WINDOW_SECS, adopt};
use crate::kernel::redis_link::{RedisLink, bounded};
use crate::kernel::redis_writer::{self, Batches};

/// Most keys one write carries (one script holds Redis for its run).
const MAX_BATCH_KEYS: usize = 500;

/// The word of a breaker notice on the locks channel.
pub const NOTICE: &str = "breaker";

/// Applies one batch of one gateway, once. KEYS[1]: the gateway's last applied sequence number;
/// then per key its standing hash and its window hash. ARGV: the batch's number, now (ms), the
/// channel, this gateway's origin, the window's seconds, the seconds it is kept, the requests
/// before a trip, the four steps of the ladder (s); then per key its id and its number of items,
/// each item five values: kind (0 outcome, 1 a trip decided by the gateway), the trips at
/// admission, the second (an outcome) or the instant in ms (a trip), requests, failures.
/// Returns per key: trips, blocked until (ms, 0 none), banned, tripped (0 no, 1 the gateway's
/// trip accepted, 2 tripped by the script), requests and failures of the window that tripped.
/// A key whose window got failures and did not trip is published as failing.
const APPLY: &str = r"
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= last then return {} end
redis.call('SET', KEYS[1], ARGV[1], 'EX', 86400)
local now_ms = tonumber(ARGV[2])
local window, kept, min = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local ladder = {tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])}
local out = {}
local a = 12
for k = 1, (#KEYS - 1) / 2 do
  local st, win = KEYS[2 * k], KEYS[2 * k + 1]
  local key, n = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  local rt = tonumber(redis.call('HGET', st, 'trips') or '0')
  local banned = tonumber(redis.call('HGET', st, 'banned') or '0')
  local until_ms = tonumber(redis.call('HGET', st, 'blocked_until') or '0')
  local seed = tonumber(ARGV[a + 1])
  if n > 0 and seed > rt then
    rt = seed
    redis.call('HSET', st, 'trips', rt)
  end
  if tonumber(redis.call('HGET', win, 'trip') or '-1') ~= rt then redis.call('DEL', win) end
  local tripped, total, failed, newest, failing = 0, 0, 0, nil, false
  local function trip(at, why)
    rt = rt + 1
    redis.call('DEL', win)
    if rt > #ladder then
      banned, until_ms = 1, 0
      redis.call('HSET', st, 'trips', rt, 'banned', 1, 'blocked_until', 0)
    else
      until_ms = at + ladder[rt] * 1000
      redis.call('HSET', st, 'trips', rt, 'blocked_until', until_ms)
    end
    tripped, newest = why, nil
    redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' breaker ' .. key .. ' ' .. rt .. ' ' .. until_ms .. ' ' .. banned)
  end
  for i = 1, n do
    local kind, t, at = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local nt, nf = ARGV[a + 3], ARGV[a + 4]
    a = a + 5
    if banned == 0 and t == rt then
      if kind == 1 then
        total, failed = tonumber(nt), tonumber(nf)
        trip(at, 1)
      else
        redis.call('HINCRBY', win, at .. ':t', nt)
        redis.call('HINCRBY', win, at .. ':f', nf)
        if tonumber(nf) > 0 then failing = true end
        redis.call('HSET', win, 'trip', rt)
        redis.call('EXPIRE', win, kept)
        if newest == nil or at > newest then newest = at end
      end
    end
  end
  if newest ~= nil then
    local fields = redis.call('HGETALL', win)
    local wt, wf = 0, 0
    for j = 1, #fields, 2 do
      local s, what = string.match(fields[j], '^(%-?%d+):(%a)$')
      if s ~= nil then
        s = tonumber(s)
        if s <= newest - kept then
          redis.call('HDEL', win, fields[j])
        elseif s > newest - window and s <= newest then
          if what == 't' then wt = wt + tonumber(fields[j + 1]) else wf = wf + tonumber(fields[j + 1]) end
        end
      end
    end
    if wt >= min and wf * 10 > wt * 9 then
      total, failed = wt, wf
      trip(now_ms, 2)
    end
  end
  if failing and tripped == 0 then
    redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' breaker ' .. key .. ' failing')
  end
  table.insert(out, rt)
  table.insert(out, until_ms)
  table.insert(out, banned)
  table.insert(out, tripped)
  table.insert(out, total)
  table.insert(out, failed)
end
return out
";

/// What the gateway shares of one key: outcomes (trips at admission, second) → (requests,
/// failures), and the trips it decided itself (trips before → the trip).
#[derive(Debug, Default)]
struct Queued {
    outcomes: BTreeMap<(u32, i64), (u32, u32)>,
    trips: BTreeMap<u32, Trip>,
}

/// A key's standing as Redis answered it after a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standing {
    /// The key.
    pub key_id: i64,
    /// Lifetime trips.
    pub trips: u32,
    /// Blocked until, Unix ms.
    pub blocked_until: Option<i64>,
    /// Banned for good.
    pub banned: bool,
    /// The trip the script made in this write, to persist (none when it made none, or when it
    /// accepted the gateway's own trip, which the gateway persists itself).
    pub tripped: Option<Trip>,
}

/// This gateway's side of the shared breaker: the connection, whether Redis answers, and the
/// outcomes and trips queued for the writer.
pub struct SharedBreakers {
    /// The gateway's link (one server's or a cluster's): outcomes are queued only while it is up.
    conn: RedisLink,
    /// What is queued, per key.
    queued: Mutex<BTreeMap<i64, Queued>>,
    /// Wakes the writer.
    wake: tokio::sync::Notify,
    /// Whether the writer holds a batch Redis has not applied yet.
    writing: AtomicBool,
    /// This gateway's sequence key (one per process).
    writer_key: String,
    /// This process's id in its notices (its own are skipped).
    origin: String,
    /// The channel notices go on (the locks' channel: one subscriber per gateway hears both).
    channel: String,
    /// [`APPLY`], sent by its digest.
    script: redis::Script,
}

/// A key's standing hash in Redis. Every breaker key is under the hash tag `{breaker}`: on a
/// cluster the writer's script names keys of one slot.
pub fn standing_key(key_id: i64) -> String {
    format!("aigw:{{breaker}}:{key_id}")
}

/// A key's window hash in Redis.
pub fn window_key(key_id: i64) -> String {
    format!("aigw:{{breaker}}:{key_id}:window")
}

impl SharedBreakers {
    /// The breakers shared through `link`; their trips are published on `channel`.
    pub fn connect(link: &RedisLink, channel: &str) -> SharedBreakers {
        let origin = uuid::Uuid::now_v7().simple().to_string();
        SharedBreakers {
            conn: link.clone(),
            queued: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            writing: AtomicBool::new(false),
            writer_key: format!("aigw:{{breaker}}:writer:{origin}"),
            origin,
            channel: channel.to_owned(),
            script: redis::Script::new(APPLY),
        }
    }

    /// Whether Redis answers: while it does, trips are decided there.
    pub fn is_up(&self) -> bool {
        self.conn.is_up()
    }

    /// Whether everything queued so far has been applied by Redis and adopted here.
    pub fn settled(&self) -> bool {
        !self.writing.load(Ordering::Relaxed)
            && self.queued.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// Queues outcomes of `key_id`: (second, trips at admission, requests, failures).
    pub(super) fn queue_outcomes(
        &self,
        key_id: i64,
        outcomes: impl IntoIterator<Item = (i64, u32, u32, u32)>,
    ) {
        let mut outcomes = outcomes.into_iter().peekable();
        if outcomes.peek().is_none() {
            return;
        }
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        let q = queued.entry(key_id).or_default();
        for (second, trip, total, failed) in outcomes {
            let n = q.outcomes.entry((trip, second)).or_default();
            n.0 = n.0.saturating_add(total);
            n.1 = n.1.saturating_add(failed);
        }
        drop(queued);
        self.wake.notify_one();
    }

    /// Queues a trip this gateway decided on its own window, for Redis to accept once.
    pub(super) fn queue_trip(&self, key_id: i64, t: &Trip) {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        let q = queued.entry(key_id).or_default();
        q.trips.insert(t.trip.saturating_sub(1), t.clone());
        drop(queued);
        self.wake.notify_one();
    }

    /// The writer ([`redis_writer::run`]) until `shutdown`; `learn` gets each key's standing as
    /// Redis answered it.
    pub async fn run(
        &self,
        now_ms: &(dyn Fn() -> i64 + Sync),
        learn: &(dyn Fn(Standing) + Sync),
        shutdown: CancellationToken,
    ) {
        let writer = Writer {
            shared: self,
            now_ms,
            learn,
        };
        redis_writer::run(&self.conn, &writer, &self.wake, shutdown).await;
    }

    /// A notice heard on the channel, if it is a well-formed breaker notice of another gateway
    /// (`None` also for this gateway's own).
    pub fn heard(&self, payload: &[u8]) -> Option<Heard> {
        let (origin, notice) = decode(payload)?;
        (origin != self.origin).then_some(notice)
    }
}

/// The breaker's writer: its queue, the clock of its trips and where Redis's standings go.
struct Writer<'a> {
    shared: &'a SharedBreakers,
    now_ms: &'a (dyn Fn() -> i64 + Sync),
    learn: &'a (dyn Fn(Standing) + Sync),
}

impl Batches for Writer<'_> {
    type Item = (i64, Queued);

    /// Takes up to [`MAX_BATCH_KEYS`] keys' queued outcomes and trips.
    fn take(&self) -> Vec<(i64, Queued)> {
        let mut queued = self.shared.queued.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        while out.len() < MAX_BATCH_KEYS {
            match queued.pop_first() {
                Some(kq) => out.push(kq),
                None => break,
            }
        }
        if !out.is_empty() {
            self.shared.writing.store(true, Ordering::Relaxed);
        }
        out
    }

    /// Runs [`APPLY`] on one batch; each key's standing as Redis answered it goes to `learn`.
    async fn write(&self, seq: u64, items: &[(i64, Queued)]) -> Result<(), String> {
        let s = self.shared;
        let now_ms = (self.now_ms)();
        let mut inv = s.script.prepare_invoke();
        inv.key(&s.writer_key)
            .arg(seq)
            .arg(now_ms)
            .arg(&s.channel)
            .arg(&s.origin)
            .arg(WINDOW_SECS)
            .arg(super::BUCKETS_KEPT_SECS)
            .arg(MIN_REQUESTS);
        for secs in LADDER_SECS {
            inv.arg(secs);
        }
        for (key_id, q) in items {
            inv.key(standing_key(*key_id)).key(window_key(*key_id));
            inv.arg(key_id).arg(q.outcomes.len() + q.trips.len());
            for (kind, trip, at, total, failed) in ordered(q) {
                inv.arg(kind).arg(trip).arg(at).arg(total).arg(failed);
            }
        }
        let mut conn = s.conn.clone();
        let answer = bounded(conn.write_timeout(), inv.invoke_async::<Vec<i64>>(&mut conn)).await?;
        standings(items, &answer, now_ms).into_iter().for_each(self.learn);
        s.writing.store(false, Ordering::Relaxed);
        Ok(())
    }

    fn left(&self, items: &[(i64, Queued)]) {
        tracing::warn!(
            keys = items.len(),
            "stopping with breaker outcomes Redis has not got; the store has them"
        );
    }
}

impl Breakers {
    /// Redis's standing of a key after a write of this gateway: adopted as a row of the store
    /// (trips only rise, a block only extends). A ban the script made here was told to no
    /// request: the next refusal here gets the first wording.
    pub fn learn(&self, s: &Standing) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let was_banned = keys.get(&s.key_id).is_some_and(|k| k.banned);
        adopt(&mut keys, s.key_id, s.trips, s.blocked_until, s.banned);
        if let Some(t) = &s.tripped {
            if t.banned
                && !was_banned
                && let Some(k) = keys.get_mut(&s.key_id)
            {
                k.announced = false;
            }
            let step = if t.banned {
                "ban".to_owned()
            } else {
                t.trip.to_string()
            };
            metrics::counter!("aigw_breaker_trips_total", "step" => step).increment(1);
        }
    }

    /// Applies a breaker notice heard on the locks channel at `now_ms`; false if `payload` is no
    /// breaker notice (it is the locks'). Another gateway's trip applies here at once; a key
    /// another gateway reports failing is shared from now on, if this gateway holds outcomes of
    /// it ([`Breakers::start_sharing`]).
    pub fn hear(&self, payload: &[u8], now_ms: i64) -> bool {
        if !is_notice(payload) {
            return false;
        }
        match self.redis().and_then(|r| r.heard(payload)) {
            Some(Heard::Trip(n)) => {
                let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
                adopt(&mut keys, n.key_id, n.trips, n.blocked_until, n.banned);
            }
            Some(Heard::Failing(key)) => self.start_sharing([key], now_ms.div_euclid(1000)),
            None => {}
        }
        true
    }
}

/// A key's items in the order the script applies them: by the trips they were admitted at, the
/// outcomes of a window before the trip that ended it.
fn ordered(q: &Queued) -> Vec<(u8, u32, i64, u32, u32)> {
    let mut items: Vec<(u8, u32, i64, u32, u32)> = q
        .outcomes
        .iter()
        .map(|(&(trip, second), &(t, f))| (0, trip, second, t, f))
        .chain(
            q.trips
                .iter()
                .map(|(&before, t)| (1, before, t.at, t.requests, t.failures)),
        )
        .collect();
    items.sort_by_key(|&(kind, trip, at, ..)| (trip, kind, at));
    items
}

/// Reads the script's answer: six numbers per key, in the batch's order.
fn standings(items: &[(i64, Queued)], answer: &[i64], now_ms: i64) -> Vec<Standing> {
    items
        .iter()
        .zip(answer.chunks_exact(6))
        .map(|((key_id, _), v)| {
            let trips = u32::try_from(v[0]).unwrap_or(0);
            let blocked_until = (v[1] > 0).then_some(v[1]);
            let banned = v[2] == 1;
            let tripped = (v[3] == 2).then(|| Trip {
                trip: trips,
                at: now_ms,
                requests: u32::try_from(v[4]).unwrap_or(0),
                failures: u32::try_from(v[5]).unwrap_or(0),
                blocked_until: blocked_until.filter(|_| !banned),
                banned,
            });
            Standing {
                key_id: *key_id,
                trips,
                blocked_until,
                banned,
                tripped,
            }
        })
        .collect()
}

/// What a breaker notice tells: another gateway tripped a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The key.
    pub key_id: i64,
    /// Its lifetime trips.
    pub trips: u32,
    /// Blocked until, Unix ms.
    pub blocked_until: Option<i64>,
    /// Banned for good.
    pub banned: bool,
}

/// What a breaker notice tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// Another gateway tripped a key.
    Trip(Notice),
    /// A key's window got failures: every gateway holding outcomes of it shares them.
    Failing(i64),
}

/// Reads a breaker notice: `<origin> breaker <key> <trips> <blocked_until ms|0> <0|1>` (a trip)
/// or `<origin> breaker <key> failing`.
pub fn decode(payload: &[u8]) -> Option<(&str, Heard)> {
    let text = std::str::from_utf8(payload).ok().filter(|t| t.len() <= 256)?;
    let mut f = text.split(' ');
    let origin = f.next().filter(|o| !o.is_empty())?;
    if f.next()? != NOTICE {
        return None;
    }
    let key = f.next()?.parse::<i64>().ok().filter(|k| *k > 0)?;
    let trips = match f.next()? {
        "failing" => return f.next().is_none().then_some((origin, Heard::Failing(key))),
        trips => trips.parse::<u32>().ok()?,
    };
    let until = f.next()?.parse::<i64>().ok().filter(|u| *u >= 0)?;
    let banned = match f.next()? {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    if f.next().is_some() {
        return None;
    }
    let notice = Notice {
        key_id: key,
        trips,
        blocked_until: (until > 0).then_some(until),
        banned,
    };
    Some((origin, Heard::Trip(notice)))
}

/// Whether a message on the channel is a breaker notice (well-formed or not): the breaker's, not
/// the locks'.
pub fn is_notice(payload: &[u8]) -> bool {
    payload
        .split(|b| *b == b' ')
        .nth(1)
        .is_some_and(|w| w == NOTICE.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_read_back_and_malformed_ones_are_refused() {
        // (message, what it tells)
        let n = |key_id, trips, blocked_until, banned| {
            Heard::Trip(Notice {
                key_id,
                trips,
                blocked_until,
                banned,
            })
        };
        let cases: &[(&[u8], Option<Heard>)] = &[
            (
                b"gw breaker 7 1 1764554430000 0",
                Some(n(7, 1, Some(1_764_554_430_000), false)),
            ),
            (b"gw breaker 7 5 0 1", Some(n(7, 5, None, true))),
            (b"gw breaker 0 1 0 0", None),
            (b"gw breaker 7 -1 0 0", None),
            (b"gw breaker 7 1 -5 0", None),
            (b"gw breaker 7 1 0 2", None),
            (b"gw breaker 7 1 0 0 extra", None),
            (b"gw lock 7 1 0 0", None),
            (b"gw breaker \xff", None),
            (b"gw breaker 7 failing", Some(Heard::Failing(7))),
            (b"gw breaker 0 failing", None),
            (b"gw breaker 7 failing 1", None),
            (b"gw breaker 7 failed", None),
        ];
        for (message, want) in cases {
            assert_eq!(decode(message).map(|(_, n)| n), *want, "{message:?}");
        }
        assert!(is_notice(b"gw breaker junk"));
        assert!(!is_notice(b"gw ban 3"));
    }

    /// The outcomes of a window come before the trip that ended it, the next window's after.
    #[test]
    fn a_keys_items_go_in_window_order() {
        let mut q = Queued::default();
        q.outcomes.insert((1, 50), (2, 2));
        q.outcomes.insert((0, 10), (3, 3));
        let t = Trip {
            trip: 1,
            at: 20_000,
            requests: 100,
            failures: 100,
            blocked_until: Some(50_000),
            banned: false,
        };
        q.trips.insert(0, t);
        let kinds: Vec<(u8, u32)> = ordered(&q).into_iter().map(|(k, t, ..)| (k, t)).collect();
        assert_eq!(kinds, [(0, 0), (1, 0), (0, 1)]);
    }
}
