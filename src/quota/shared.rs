//! The quota counters' shared word across gateways: Redis (issue 44, DESIGN.md §11,
//! docs/scaling.md). Optional: without `redis_url` nothing here exists and each gateway counts as
//! before (its memory, the store's totals at each flush).
//!
//! Invariants:
//! - Before dispatch, at most one round trip: one `MGET` of every counter the request depends on
//!   ([`SharedCounters::raise`]); a standing's `used` is the larger of Redis's total and this
//!   gateway's own, so Redis can only make a check stricter, never looser.
//! - Usage is still counted after completion (LyRouter seed 003: the crossing request completes):
//!   [`SharedCounters::add`] queues the delta, and one writer task sends what has queued in one
//!   round trip (a script per workspace it holds). With every gateway on one Redis, the
//!   overshoot of a quota is at most the requests in flight across all of them, a request being
//!   in flight until its count is in Redis (docs/quotas.md).
//! - Exactly once: the writer is the gateway's one Redis writer ([`crate::kernel::redis_writer`]),
//!   whose batches carry a sequence number that [`APPLY`] applies once per workspace.
//! - One workspace, one hash slot: every counter is named under its workspace's hash tag
//!   (`{quota:<workspace id>}`), as is the writer's sequence number of that workspace. A
//!   request's counters (its key's, member's, department's, workspace's, tags' and end user's)
//!   are all of its workspace, so its check is one `MGET` and its write one script on one slot;
//!   on a cluster, the workspaces spread over the primaries.
//! - An empty Redis (a restart without persistence, `FLUSHALL`) is reseeded: a counter missing
//!   from it is set to this gateway's own total (the store's as last read plus its own unwritten
//!   usage, a lower bound of the truth) instead of being incremented from 0.
//! - Redis away or slower than `redis_timeout_ms`: checks use this gateway's own counters (the
//!   bound without Redis) and do not wait on Redis again until a writer's probe finds it back
//!   ([`RedisLink::is_up`], one word for every user of Redis).
//! - The checks read on connections of their own, so that a read never waits behind a write: one
//!   per serving thread, so that a request's round trip never leaves its thread
//!   ([`RedisLink::on_this_thread`]).
//! - The store stays the system of record: the flush writes each gateway's deltas as before.

use std::sync::Mutex;

use rustc_hash::FxHashMap;
use tokio_util::sync::CancellationToken;

use super::engine::{CounterKey, Standing};
use crate::kernel::redis_link::{RedisLink, bounded};
use crate::kernel::redis_writer::{self, Batches};

/// Seconds a counter outlives its window's end in Redis at least: past the latest reset a refusal
/// announces (1 to 2 minutes after the end, DESIGN.md §4).
const EXPIRY_MARGIN_SECS: i64 = 300;

/// Most counters one write carries (one script holds Redis for its run).
const MAX_BATCH: usize = 2000;

/// Applies one batch of one gateway, once. KEYS[1]: the gateway's last applied sequence number;
/// KEYS[2..]: the counters. ARGV[1]: this batch's number; then per counter its delta, this
/// gateway's own total (the seed of a missing counter) and the seconds it lives on (0: for ever).
/// One command per counter that Redis has: `INCRBY`'s answer equal to the delta means the counter
/// was missing (or at 0), and only then is it set from the seed, with its expiry from now (a
/// counter is first written during its window, so it outlives the window's end by the margin).
/// Numbers stay strings where Lua's doubles would round them.
const APPLY: &str = r"
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', 86400)
for i = 2, #KEYS do
  local a = 2 + (i - 2) * 3
  local add = tonumber(ARGV[a])
  if redis.pcall('INCRBY', KEYS[i], ARGV[a]) == add then
    local v = ARGV[a]
    if tonumber(ARGV[a + 1]) >= add then v = ARGV[a + 1] end
    if tonumber(ARGV[a + 2]) > 0 then
      redis.call('SET', KEYS[i], v, 'EX', ARGV[a + 2])
    else
      redis.call('SET', KEYS[i], v)
    end
  end
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
    /// The workspace of its subject: its hash tag.
    workspace: i64,
}

/// The shared counters of one gateway: the connection, whether Redis answers, and what this
/// gateway counted that Redis has not got yet.
pub struct SharedCounters {
    /// The writes' link (one server's or a cluster's), shared with the gateway's other writers.
    conn: RedisLink,
    /// The checks' connection, of the same link.
    reads: RedisLink,
    /// Usage counted here and not yet written, merged per counter.
    unwritten: Mutex<FxHashMap<CounterKey, Unwritten>>,
    /// Wakes the writer when something is queued.
    wake: tokio::sync::Notify,
    /// This gateway's name in its sequence keys (one per process, [`writer_key`]).
    writer: String,
    /// [`APPLY`], sent by its digest.
    script: redis::Script,
}

/// The start of every Redis key of `workspace`'s counters: `aigw:{quota:<id>}:`, its hash tag.
fn tagged(workspace: i64, capacity: usize) -> String {
    let mut key = String::with_capacity(capacity);
    key.push_str("aigw:{quota:");
    key.push_str(itoa::Buffer::new().format(workspace));
    key.push_str("}:");
    key
}

/// The Redis key of a counter of `workspace`'s, under that workspace's hash tag: on a cluster
/// the writer's script and the check's `MGET` name keys of one slot, and workspaces spread over
/// the slots. Built by hand: each check names every counter it reads, and `format!`'s machinery
/// cost more than the rest of the name.
fn redis_key(workspace: i64, k: &CounterKey) -> String {
    let mut ids = itoa::Buffer::new();
    let mut key = tagged(workspace, 72);
    key.push_str(k.subject.as_str());
    key.push(':');
    key.push_str(ids.format(k.subject_id));
    key.push(':');
    key.push_str(k.metric.as_str());
    key.push(':');
    match k.window.name() {
        Ok(name) => key.push_str(name),
        Err(minutes) => {
            key.push_str(ids.format(minutes));
            key.push_str("minutes");
        }
    }
    key.push(':');
    key.push_str(ids.format(k.start));
    key
}

/// The key of the last batch `writer` applied to `workspace`'s counters (kept a day).
fn writer_key(workspace: i64, writer: &str) -> String {
    let mut key = tagged(workspace, 64);
    key.push_str("writer:");
    key.push_str(writer);
    key
}

/// `items` by workspace, in order of first appearance: one script each.
fn by_workspace(items: &[(CounterKey, Unwritten)]) -> Vec<(i64, Vec<&(CounterKey, Unwritten)>)> {
    let mut groups: Vec<(i64, Vec<&(CounterKey, Unwritten)>)> = Vec::new();
    for item in items {
        let ws = item.1.workspace;
        match groups.iter_mut().find(|(w, _)| *w == ws) {
            Some((_, g)) => g.push(item),
            None => groups.push((ws, vec![item])),
        }
    }
    groups
}

impl SharedCounters {
    /// The counters shared through `link` (connected in the background, so an absent Redis does
    /// not stop the start); probes it once before returning, to log and show its state from the
    /// start.
    pub async fn connect(link: &RedisLink) -> SharedCounters {
        let shared = SharedCounters {
            conn: link.clone(),
            reads: link.another_connection(),
            unwritten: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            writer: uuid::Uuid::now_v7().to_string(),
            script: redis::Script::new(APPLY),
        };
        if !link.probe().await {
            link.went_down("no answer to PING at start");
        }
        shared
    }

    /// Whether Redis answers (`aigw_redis_up`, `/readyz`): the word of every user of the link.
    pub fn is_up(&self) -> bool {
        self.conn.is_up()
    }

    /// Raises each standing's `used` to Redis's total of its counter, every one of `workspace`'s:
    /// one `MGET`, bounded by the timeout. Redis away: nothing read, nothing waited for; the
    /// gateway's own counts stand.
    pub(super) async fn raise(&self, standings: &mut [Standing], workspace: i64) {
        if standings.is_empty() || !self.is_up() {
            return;
        }
        let mut cmd = redis::cmd("MGET");
        for s in standings.iter() {
            cmd.arg(redis_key(workspace, &s.key));
        }
        let mut conn = self.reads.on_this_thread();
        let timeout = conn.timeout();
        match bounded(timeout, cmd.query_async::<Vec<Option<i64>>>(&mut conn)).await {
            Ok(totals) => {
                for (s, total) in standings.iter_mut().zip(totals) {
                    s.used = s.used.max(total.unwrap_or(0));
                }
            }
            Err(why) => self.conn.went_down(&why),
        }
    }

    /// Queues `add` of counter `key`, one of `workspace`'s, for Redis; `seed` is this gateway's
    /// own total of it, usage just added included; `window_secs` the length of its window (none for `total`). The
    /// writer is woken by [`SharedCounters::send`] once a request's counters are all queued, so
    /// that they go in one write.
    ///
    /// Redis keeps a counter for a window and a margin from its first write: first written
    /// during its window (or after it, by a late completion), it outlives the window's end by at
    /// least the margin, whatever the difference between the gateways' clocks and Redis's (an
    /// absolute `EXPIREAT` would depend on it).
    pub(super) fn add(
        &self,
        key: &CounterKey,
        workspace: i64,
        add: i64,
        seed: i64,
        window_secs: Option<i64>,
    ) {
        let ttl = window_secs.map_or(0, |w| w.max(1).saturating_add(EXPIRY_MARGIN_SECS));
        {
            let mut map = self.unwritten.lock().unwrap_or_else(|p| p.into_inner());
            let u = map.entry(key.clone()).or_default();
            u.add = u.add.saturating_add(add);
            u.seed = u.seed.max(seed);
            u.ttl = u.ttl.max(ttl);
            u.workspace = workspace;
        }
    }

    /// Wakes the writer for what [`SharedCounters::add`] queued.
    pub(super) fn send(&self) {
        self.wake.notify_one();
    }

    /// The writer ([`redis_writer::run`]) until `shutdown`.
    pub async fn run(self: std::sync::Arc<Self>, shutdown: CancellationToken) {
        redis_writer::run(&self.conn, &Writer(&self), &self.wake, shutdown).await;
    }
}

/// The quota counters' writer.
struct Writer<'a>(&'a SharedCounters);

impl Batches for Writer<'_> {
    type Item = (CounterKey, Unwritten);

    /// Takes up to [`MAX_BATCH`] queued counters.
    fn take(&self) -> Vec<(CounterKey, Unwritten)> {
        let mut map = self.0.unwritten.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() <= MAX_BATCH {
            return map.drain().collect();
        }
        let keys: Vec<CounterKey> = map.keys().take(MAX_BATCH).cloned().collect();
        keys.into_iter()
            .filter_map(|k| map.remove(&k).map(|u| (k, u)))
            .collect()
    }

    /// Runs [`APPLY`] on one batch: one script per workspace, sent together (one round trip
    /// on one server; on a cluster, one to each primary holding one of them).
    async fn write(&self, seq: u64, items: &[(CounterKey, Unwritten)]) -> Result<(), String> {
        let groups = by_workspace(items);
        let scripts = groups.iter().map(|(ws, group)| {
            let mut inv = self.0.script.prepare_invoke();
            inv.key(writer_key(*ws, &self.0.writer)).arg(seq);
            for (k, u) in group {
                inv.key(redis_key(*ws, k)).arg(u.add).arg(u.seed).arg(u.ttl);
            }
            let mut conn = self.0.conn.clone();
            async move {
                bounded(conn.write_timeout(), inv.invoke_async::<i64>(&mut conn))
                    .await
                    .map(|_| ())
            }
        });
        // A workspace's script that failed is sent again with the batch; those that ran skip it.
        futures::future::try_join_all(scripts).await.map(|_| ())
    }

    fn left(&self, items: &[(CounterKey, Unwritten)]) {
        tracing::warn!(
            counters = items.len(),
            "stopping with quota usage Redis has not got; the store has it"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::window::Window;
    use crate::quota::{Metric, SubjectKind};

    #[test]
    fn a_counter_is_named_by_its_identity_under_its_workspace_never_its_policy() {
        let cases = [
            (
                1,
                SubjectKind::Apikey,
                7,
                Metric::Requests,
                Window::Total,
                0,
                "aigw:{quota:1}:apikey:7:requests:total:0",
            ),
            (
                12,
                SubjectKind::Member,
                3,
                Metric::TotalTokens,
                Window::Day,
                1_764_000_000,
                "aigw:{quota:12}:member:3:total_tokens:day:1764000000",
            ),
            (
                -4,
                SubjectKind::Apikey,
                -2,
                Metric::Requests,
                Window::Minutes(15),
                1_764_000_900,
                "aigw:{quota:-4}:apikey:-2:requests:15minutes:1764000900",
            ),
            (
                9_223_372_036_854_775_807,
                SubjectKind::Apikey,
                9,
                Metric::Requests,
                Window::Minutes(1),
                60,
                "aigw:{quota:9223372036854775807}:apikey:9:requests:minute:60",
            ),
        ];
        for (ws, subject, subject_id, metric, window, start, want) in cases {
            let k = CounterKey {
                subject,
                subject_id,
                metric,
                window,
                start,
            };
            assert_eq!(redis_key(ws, &k), want);
            let by_display = format!(
                "aigw:{{quota:{ws}}}:{}:{subject_id}:{}:{window}:{start}",
                subject.as_str(),
                metric.as_str()
            );
            assert_eq!(redis_key(ws, &k), by_display, "the same name as Display gives");
            let writer = writer_key(ws, "w1");
            assert_eq!(writer, format!("aigw:{{quota:{ws}}}:writer:w1"));
            assert_eq!(
                hash_tag(&writer),
                hash_tag(want),
                "the writer's key shares the slot"
            );
        }
    }

    /// What a cluster hashes: the text between the first `{` and the next `}`.
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').expect("a tag") + 1;
        &key[open..open + key[open..].find('}').expect("closed")]
    }

    /// A batch is split into one script per workspace, each holding all of its counters and
    /// none of another's, in the order the workspaces were first met.
    #[test]
    fn a_batch_is_written_one_script_per_workspace() {
        let item = |ws: i64, id: i64| {
            let k = CounterKey {
                subject: SubjectKind::Apikey,
                subject_id: id,
                metric: Metric::Requests,
                window: Window::Day,
                start: 0,
            };
            let u = Unwritten {
                add: 1,
                seed: 1,
                ttl: 60,
                workspace: ws,
            };
            (k, u)
        };
        // (workspace, key id) queued → (workspace, key ids) per script.
        type Case<'a> = (&'a [(i64, i64)], &'a [(i64, &'a [i64])]);
        let cases: [Case; 4] = [
            (&[], &[]),
            (&[(1, 10)], &[(1, &[10])]),
            (&[(1, 10), (1, 11), (1, 12)], &[(1, &[10, 11, 12])]),
            (
                &[(2, 20), (1, 10), (2, 21), (3, 30), (1, 11)],
                &[(2, &[20, 21]), (1, &[10, 11]), (3, &[30])],
            ),
        ];
        for (items, want) in cases {
            let items: Vec<_> = items.iter().map(|&(ws, id)| item(ws, id)).collect();
            let got: Vec<(i64, Vec<i64>)> = by_workspace(&items)
                .into_iter()
                .map(|(ws, g)| {
                    assert!(g.iter().all(|(_, u)| u.workspace == ws));
                    (ws, g.iter().map(|(k, _)| k.subject_id).collect())
                })
                .collect();
            let want: Vec<(i64, Vec<i64>)> = want.iter().map(|(ws, ids)| (*ws, ids.to_vec())).collect();
            assert_eq!(got, want);
        }
    }
}
