//! The upstream credentials' own-limit counts shared through Redis (issue 44, DESIGN.md §1 and
//! §11, docs/redis.md). Optional: without `redis_url` nothing here exists and replicas share the
//! counts through the store alone (`upstream_counters`, read at each flush).
//!
//! Invariants:
//! - Nothing on the request path waits on Redis: admission decides in memory. What a gateway
//!   counts (requests at dispatch, tokens at completion) is queued, and one writer task sends what
//!   has queued in one script ([`APPLY`]) per round trip: `INCRBY` of
//!   `aigw:{own}:<credential>:<rpm|tpm|rpd>:<window start, Unix ms>`, kept a window and
//!   [`EXPIRY_MARGIN_SECS`] after each write.
//! - The script returns each counter's total after the write, which the writer's gateway keeps,
//!   and publishes them on the locks' channel (`<origin> own <credential>:<count>:<start>:<total>
//!   …`), which every other gateway keeps too: each gateway misses at most the others' traffic
//!   since their last write round trip (and the notice's delivery). A count is the larger of
//!   Redis's and the store's: Redis can only make admission stricter.
//! - Exactly once: the writer is the gateway's one Redis writer ([`crate::kernel::redis_writer`]),
//!   whose batches carry a sequence number that [`APPLY`] applies once.
//! - An empty Redis (restart, `FLUSHALL`): a missing counter is set to this gateway's own total
//!   (the store's as last read plus its unwritten counts), never counted from 0.
//! - Redis away or slower than `redis_timeout_ms`: nothing is queued for it, and admission counts
//!   through the store as without Redis, logged once each way.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

use super::admission::{Admission, Count};
use crate::kernel::redis_link::{RedisLink, bounded};
use crate::kernel::redis_writer::{self, Batches};

/// The word of an own-limit notice on the locks channel.
pub const NOTICE: &str = "own";

/// Seconds a counter outlives its window's end in Redis at least.
const EXPIRY_MARGIN_SECS: i64 = 300;

/// Most counters one write carries (one script holds Redis for its run; one notice lists them).
const MAX_BATCH: usize = 200;

/// Applies one batch of one gateway, once, and answers every counter's total. KEYS[1]: the
/// gateway's last applied sequence number; KEYS[2..]: the counters. ARGV: the batch's number,
/// this gateway's origin, the channel; then per counter its label in the notice, its delta, this
/// gateway's own total (the seed of a missing counter) and the seconds it lives on. A batch
/// already applied is not applied again, nor published; its totals are answered all the same.
const APPLY: &str = r"
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
local fresh = tonumber(ARGV[1]) > last
if fresh then redis.call('SET', KEYS[1], ARGV[1], 'EX', 86400) end
local out = {}
local notice = ARGV[2] .. ' own'
for i = 2, #KEYS do
  local a = 4 + (i - 2) * 4
  if fresh then
    if redis.call('EXISTS', KEYS[i]) == 1 then
      redis.pcall('INCRBY', KEYS[i], ARGV[a + 1])
    elseif tonumber(ARGV[a + 2]) >= tonumber(ARGV[a + 1]) then
      redis.call('SET', KEYS[i], ARGV[a + 2])
    else
      redis.call('SET', KEYS[i], ARGV[a + 1])
    end
    redis.call('EXPIRE', KEYS[i], ARGV[a + 3])
  end
  local total = redis.call('GET', KEYS[i]) or '0'
  table.insert(out, tonumber(total))
  notice = notice .. ' ' .. ARGV[a] .. ':' .. total
end
if fresh then redis.call('PUBLISH', ARGV[3], notice) end
return out
";

/// One counter: credential, count, window start (Unix ms).
pub type Counter = (i64, Count, i64);

/// A counter's counts not yet in Redis.
#[derive(Clone, Copy, Debug, Default)]
struct Queued {
    /// Added here since the last write.
    add: i64,
    /// This gateway's own total of the counter (the seed of a missing one).
    seed: i64,
}

/// This gateway's side of the shared own-limit counts: the connection, whether Redis answers,
/// and what is queued for the writer.
pub struct SharedOwnLimits {
    /// The gateway's link (one server's or a cluster's): counts are queued only while it is up.
    conn: RedisLink,
    /// What is queued, per counter.
    queued: Mutex<BTreeMap<Counter, Queued>>,
    /// Wakes the writer.
    wake: tokio::sync::Notify,
    /// This gateway's sequence key (one per process).
    writer_key: String,
    /// This process's id in its notices (its own are skipped).
    origin: String,
    /// The channel notices go on (the locks' channel: one subscriber per gateway hears all).
    channel: String,
    /// [`APPLY`], sent by its digest.
    script: redis::Script,
}

/// A counter's key in Redis. Every own-limit key is under the hash tag `{own}`: on a cluster the
/// writer's script names keys of one slot.
pub fn redis_key(credential_id: i64, count: Count, start_ms: i64) -> String {
    format!("aigw:{{own}}:{credential_id}:{}:{start_ms}", count.short())
}

impl SharedOwnLimits {
    /// The own-limit counts shared through `link`; its notices go on `channel`.
    pub fn connect(link: &RedisLink, channel: &str) -> SharedOwnLimits {
        let origin = uuid::Uuid::now_v7().simple().to_string();
        SharedOwnLimits {
            conn: link.clone(),
            queued: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            writer_key: format!("aigw:{{own}}:writer:{origin}"),
            origin,
            channel: channel.to_owned(),
            script: redis::Script::new(APPLY),
        }
    }

    /// Whether Redis answers: while it does, counts are queued for it.
    pub fn is_up(&self) -> bool {
        self.conn.is_up()
    }

    /// Queues `add` of `counter`; `seed` is this gateway's own total of it, `add` included.
    pub(super) fn queue(&self, counter: Counter, add: i64, seed: i64) {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        let q = queued.entry(counter).or_default();
        q.add = q.add.saturating_add(add);
        q.seed = q.seed.max(seed);
        drop(queued);
        self.wake.notify_one();
    }

    /// The writer ([`redis_writer::run`]) until `shutdown`; `admission` keeps the totals Redis
    /// answers.
    pub async fn run(&self, admission: &Admission, shutdown: CancellationToken) {
        let writer = Writer {
            shared: self,
            admission,
        };
        redis_writer::run(&self.conn, &writer, &self.wake, shutdown).await;
    }

    /// The totals of a notice heard on the channel, if it is a well-formed own-limit notice of
    /// another gateway (`None` also for this gateway's own).
    pub fn heard(&self, payload: &[u8]) -> Option<Vec<(Counter, i64)>> {
        let (origin, totals) = decode(payload)?;
        (origin != self.origin).then_some(totals)
    }
}

/// The own limits' writer: its queue and the admission that keeps the totals.
struct Writer<'a> {
    shared: &'a SharedOwnLimits,
    admission: &'a Admission,
}

impl Batches for Writer<'_> {
    type Item = (Counter, Queued);

    /// Takes up to [`MAX_BATCH`] queued counters.
    fn take(&self) -> Vec<(Counter, Queued)> {
        let mut queued = self.shared.queued.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        while out.len() < MAX_BATCH {
            match queued.pop_first() {
                Some(cq) => out.push(cq),
                None => break,
            }
        }
        out
    }

    /// Runs [`APPLY`] on one batch; the admission learns every counter's total.
    async fn write(&self, seq: u64, items: &[(Counter, Queued)]) -> Result<(), String> {
        let s = self.shared;
        let mut inv = s.script.prepare_invoke();
        inv.key(&s.writer_key).arg(seq).arg(&s.origin).arg(&s.channel);
        for ((id, count, start), q) in items {
            let window_secs = if *count == Count::DayRequests { 86_400 } else { 60 };
            inv.key(redis_key(*id, *count, *start))
                .arg(format!("{id}:{}:{start}", count.short()))
                .arg(q.add)
                .arg(q.seed)
                .arg(window_secs + EXPIRY_MARGIN_SECS);
        }
        let mut conn = s.conn.clone();
        let totals = bounded(conn.write_timeout(), inv.invoke_async::<Vec<i64>>(&mut conn)).await?;
        if totals.len() != items.len() {
            return Err("unexpected answer from the own-limit script".to_owned());
        }
        let learnt: Vec<(Counter, i64, i64)> = items
            .iter()
            .zip(totals)
            .map(|((c, q), total)| (*c, q.add, total))
            .collect();
        self.admission.learn_written(&learnt);
        Ok(())
    }

    fn left(&self, items: &[(Counter, Queued)]) {
        tracing::warn!(
            counters = items.len(),
            "stopping with upstream own-limit counts Redis has not got; the store has them"
        );
    }
}

/// Whether `payload` is an own-limit notice (well-formed or not: no other reader wants it).
pub fn is_notice(payload: &[u8]) -> bool {
    payload
        .split(|b| *b == b' ')
        .nth(1)
        .is_some_and(|w| w == NOTICE.as_bytes())
}

/// `<origin> own <credential>:<count>:<start>:<total> …`: the origin and the totals; `None` if
/// any part is malformed.
fn decode(payload: &[u8]) -> Option<(&str, Vec<(Counter, i64)>)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut f = text.split(' ');
    let origin = f.next().filter(|o| !o.is_empty())?;
    if f.next()? != NOTICE {
        return None;
    }
    f.map(|item| {
        let mut p = item.split(':');
        let id = p.next()?.parse::<i64>().ok()?;
        let count = Count::parse_short(p.next()?)?;
        let start = p.next()?.parse::<i64>().ok()?;
        let total = p.next()?.parse::<i64>().ok().filter(|t| *t >= 0)?;
        p.next().is_none().then_some(((id, count, start), total))
    })
    .collect::<Option<Vec<_>>>()
    .map(|totals| (origin, totals))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_notices() {
        assert_eq!(
            redis_key(7, Count::MinuteTokens, 1_796_090_400_000),
            "aigw:{own}:7:tpm:1796090400000"
        );
        let n = b"abc own 7:rpm:60000:3 7:rpd:0:12";
        assert!(is_notice(n));
        assert_eq!(
            decode(n),
            Some((
                "abc",
                vec![
                    ((7, Count::MinuteRequests, 60_000), 3),
                    ((7, Count::DayRequests, 0), 12)
                ]
            ))
        );
        for bad in [
            &b"abc own 7:rpm:60000"[..],
            b"abc own 7:xyz:0:1",
            b"abc own 7:rpm:0:-1",
            b" own 7:rpm:0:1",
        ] {
            assert_eq!(decode(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert!(!is_notice(b"abc breaker 7 1 0 0"));
    }
}
