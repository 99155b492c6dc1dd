//! Credential locks, quota-group rests, banned marks and backoff levels shared through Redis
//! (issue 44, DESIGN.md §11, docs/scaling.md). Optional: without `redis_url` nothing here exists,
//! and the others learn a lock by the store poll (every `config_poll`) as before.
//!
//! Invariants:
//! - The store stays the record: a park is written there as before; Redis only makes it known
//!   at once. A gateway that parks publishes one message per lock (and per banned mark) on
//!   [`CHANNEL`], off the request path; every gateway keeps one subscriber connection and applies
//!   what it hears through the same extend-only path as the poll ([`Locks::park`]), so the order
//!   and duplicates of messages do not matter (kRouter; groot ADR 0008 "extend-only rests").
//!   A gateway's own messages are recognised by its origin and skipped.
//! - kRouter rule 5, "the backoff level belongs to the account": the level of a credential lives
//!   in the hash [`BACKOFF_KEY`] (field: the credential's id). A bump raises it there to the
//!   larger of Redis's level plus one and this gateway's own, and publishes the result; a
//!   success deletes the field and publishes 0. At start and at each reconnection a gateway reads
//!   the hash and keeps the larger of its own and Redis's levels, so a level survives the restart
//!   of every gateway.
//! - Redis is not trusted to be well-formed: a message longer than [`MAX_MESSAGE`] bytes, or one
//!   that does not parse, or whose lock ends more than five years away, is ignored and counted;
//!   the first one is logged (the store poll still brings what it meant).
//! - groot ADR 0008 across gateways: each ambiguous failure is also counted in Redis by the
//!   same writer ([`Share::Witnessed`], `corroboration.rs` says how); a corroboration it answers
//!   rests the group through the caller's hand, and that rest is then published as any park.
//! - Redis away: nothing on the request path waits on it. Publications fail in the background
//!   (logged once per outage), the subscriber reconnects with a doubling wait, and meanwhile the
//!   store poll still brings every lock, as without Redis.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::PubSubStream;

use super::corroboration::{self, GroupRest, Witness};
use super::locks::{LockEntry, LockTarget, Locks};
use crate::kernel::redis_link::{RedisLink, bounded};

/// The channel parks are published on.
pub const CHANNEL: &str = "aigw:locks";

/// The hash of backoff levels: field the credential's id, value its level.
pub const BACKOFF_KEY: &str = "aigw:backoff";

/// The longest message applied, in bytes (a lock's target is a model name).
pub const MAX_MESSAGE: usize = 1024;

/// How far ahead a lock heard from Redis may end: five years, past any park but a long run of
/// Kiro monthly holds (30 days more each). A lock that ends further is left to the store poll.
const MAX_AHEAD_MS: i64 = 5 * 365 * 24 * 3600 * 1000;

/// Longest wait between two tries of the subscriber to reconnect.
const MAX_RECONNECT_WAIT: Duration = Duration::from_secs(10);

/// Raises a credential's level in [`BACKOFF_KEY`] to the larger of Redis's plus one and this
/// gateway's own, and publishes it. KEYS[1]: the hash; ARGV: the credential, this gateway's
/// level, the channel, this gateway's origin. Returns the level.
const BUMP: &str = r"
local v = (tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') or 0) + 1
local own = tonumber(ARGV[2])
if own > v then v = own end
redis.call('HSET', KEYS[1], ARGV[1], v)
redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' backoff ' .. ARGV[1] .. ' ' .. v)
return v
";

/// What one message tells the other gateways.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A lock was written (extend-only).
    Lock {
        /// The credential.
        credential: i64,
        /// What it parks.
        target: LockTarget,
        /// Its end, Unix ms, and the rule that wrote it.
        entry: LockEntry,
    },
    /// The credential carries the banned mark.
    Banned {
        /// The credential.
        credential: i64,
    },
    /// The credential's backoff level is now `level` (0: reset by a success).
    Backoff {
        /// The credential.
        credential: i64,
        /// The account's level.
        level: u32,
    },
}

/// One message on [`CHANNEL`]: `<origin> lock <credential> <until_ms> <rule> <target>`,
/// `<origin> ban <credential>` or `<origin> backoff <credential> <level>`. The target comes
/// last, so a model name may hold anything but a newline.
pub fn encode(origin: &str, notice: &Notice) -> String {
    match notice {
        Notice::Lock {
            credential,
            target,
            entry,
        } => format!(
            "{origin} lock {credential} {} {} {}",
            entry.until_ms,
            entry.rule,
            target.to_db()
        ),
        Notice::Banned { credential } => format!("{origin} ban {credential}"),
        Notice::Backoff { credential, level } => format!("{origin} backoff {credential} {level}"),
    }
}

/// Reads a message: its origin and what it tells, if it is well-formed and no longer than
/// [`MAX_MESSAGE`]; `now_ms` bounds how far ahead a lock may end.
pub fn decode(payload: &[u8], now_ms: i64) -> Option<(&str, Notice)> {
    if payload.len() > MAX_MESSAGE {
        return None;
    }
    let text = std::str::from_utf8(payload).ok()?;
    if text.contains(['\n', '\r']) {
        return None;
    }
    let mut parts = text.splitn(3, ' ');
    let origin = parts.next().filter(|o| !o.is_empty())?;
    let kind = parts.next()?;
    let rest = parts.next()?;
    let credential = |s: &str| s.parse::<i64>().ok().filter(|c| *c > 0);
    let notice = match kind {
        "lock" => {
            let mut f = rest.splitn(4, ' ');
            let credential = credential(f.next()?)?;
            let until_ms = f.next()?.parse::<i64>().ok()?;
            let rule = f.next()?;
            let target = f.next()?;
            let rule_ok = !rule.is_empty() && rule.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !rule_ok
                || target.is_empty()
                || until_ms <= 0
                || until_ms > now_ms.saturating_add(MAX_AHEAD_MS)
            {
                return None;
            }
            Notice::Lock {
                credential,
                target: LockTarget::from_db(target),
                entry: LockEntry {
                    until_ms,
                    rule: rule.to_owned(),
                },
            }
        }
        "ban" => Notice::Banned {
            credential: credential(rest)?,
        },
        "backoff" => {
            let (c, level) = rest.split_once(' ')?;
            Notice::Backoff {
                credential: credential(c)?,
                level: level.parse().ok()?,
            }
        }
        _ => return None,
    };
    Some((origin, notice))
}

/// Applies what another gateway told, as the store poll would: a lock only extends, a banned
/// mark is set, a backoff level is raised to the account's or reset by its success.
pub fn apply(locks: &Locks, notice: Notice) {
    match notice {
        Notice::Lock {
            credential,
            target,
            entry,
        } => {
            locks.park(&[credential], &target, entry.until_ms, &entry.rule);
        }
        Notice::Banned { credential } => locks.ban(credential),
        Notice::Backoff { credential, level } => locks.learn_backoff(credential, level),
    }
}

/// Most changes queued for Redis; past it a change is dropped (Redis away for long: the store
/// still has every lock, and a level is at worst off by what was dropped).
const MAX_QUEUED: usize = 10_000;

/// A change to share, queued on the request path and sent by one writer in the order queued (a
/// success's reset is never overtaken by the bump before it).
#[derive(Debug)]
pub enum Share {
    /// Locks a park wrote, and a banned mark.
    Parks(Vec<(i64, LockTarget, LockEntry)>, Option<i64>),
    /// The credential's level rose to this gateway's `.1`.
    Bumped(i64, u32),
    /// The credential's level went back to 0.
    Reset(i64),
    /// An ambiguous failure, counted across gateways; the group rests with `.1` if that
    /// corroborates it. `None`: this gateway's own traffic corroborated it and rested the group,
    /// so the count across gateways only starts over.
    Witnessed(Witness, Option<GroupRest>),
}

/// This gateway's side of the shared locks: a connection to publish and write levels, the
/// subscriber's client, the writer's queue and whether Redis answered.
pub struct SharedLocks {
    /// Changes for the writer ([`SharedLocks::run_writer`]).
    queue: tokio::sync::mpsc::Sender<Share>,
    /// The writer's end of `queue`, taken when it starts.
    queued: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<Share>>>,
    /// Whether the subscriber is connected (its loss is logged once per outage).
    subscribed: AtomicBool,
    /// The subscriber's tries so far: each connects to the next seed (a pub/sub connection takes
    /// no other command; on a cluster every node hears every publication).
    subscriptions: AtomicUsize,
    /// Publications and the backoff hash: the gateway's link, one server's or a cluster's.
    conn: RedisLink,
    /// Longest a round trip may take (off the request path: [`RedisLink::write_timeout`]).
    timeout: Duration,
    /// This process's id in its messages (its own are skipped).
    origin: String,
    /// Messages ignored as malformed (the first is logged).
    malformed: AtomicU64,
    /// [`BUMP`], sent by its digest.
    bump: redis::Script,
    /// [`corroboration::SHARED_OBSERVE`], sent by its digest.
    observe: redis::Script,
    /// Makes each failure this gateway records a value of its own in a group's set.
    witnessed: AtomicU64,
}

impl SharedLocks {
    /// The locks shared through `link` (connected lazily: an absent Redis does not stop the
    /// start).
    pub fn connect(link: &RedisLink) -> SharedLocks {
        let (queue, queued) = tokio::sync::mpsc::channel(MAX_QUEUED);
        SharedLocks {
            queue,
            queued: std::sync::Mutex::new(Some(queued)),
            subscribed: AtomicBool::new(false),
            subscriptions: AtomicUsize::new(0),
            conn: link.clone(),
            timeout: link.write_timeout(),
            origin: uuid::Uuid::now_v7().simple().to_string(),
            malformed: AtomicU64::new(0),
            bump: redis::Script::new(BUMP),
            observe: redis::Script::new(corroboration::SHARED_OBSERVE),
            witnessed: AtomicU64::new(0),
        }
    }

    /// Queues `change` for the writer; never waits (a full queue drops it).
    pub fn share(&self, change: Share) {
        if self.queue.try_send(change).is_err() {
            tracing::debug!("redis write queue full: a lock change is left to the store poll");
        }
    }

    /// The writer: sends each queued change in order until `shutdown`, then what is left.
    /// `locks` learns the account's level a bump returns; `rest` rests a quota group whose
    /// ambiguous failures corroborate across gateways (as the local rule's rest: in memory,
    /// persisted, published).
    pub async fn run_writer(
        &self,
        locks: &Locks,
        rest: &(dyn Fn(GroupRest) + Sync),
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let taken = self.queued.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(mut queued) = taken else { return };
        loop {
            let change = tokio::select! {
                c = queued.recv() => c,
                () = shutdown.cancelled() => None,
            };
            let Some(change) = change else { break };
            self.write(change, locks, rest).await;
        }
        queued.close();
        while let Ok(change) = queued.try_recv() {
            self.write(change, locks, rest).await;
        }
    }

    async fn write(&self, change: Share, locks: &Locks, rest: &(dyn Fn(GroupRest) + Sync)) {
        match change {
            Share::Parks(rows, banned) => self.publish_parks(&rows, banned).await,
            Share::Bumped(credential, own) => {
                let account = self.bump_backoff(credential, own).await;
                // A success here since the bump reset the level: it stays reset.
                if let Some(level) = account.filter(|_| locks.backoff_level(credential) > 0) {
                    locks.learn_backoff(credential, level);
                }
            }
            Share::Reset(credential) => self.reset_backoff(credential).await,
            Share::Witnessed(witness, group_rest) => {
                let rested_here = group_rest.is_none();
                let corroborated = self.observe(&witness, rested_here).await;
                if let (Some(true), Some(r)) = (corroborated, group_rest) {
                    tracing::info!(quota_group = %witness.group, "ambiguous 429 corroborated across gateways; the quota group rests");
                    rest(r);
                }
            }
        }
    }

    /// Counts `witness` in its group's set ([`corroboration::SHARED_OBSERVE`]), or only clears
    /// the set when the group `rested_here`; whether the group's failures across every gateway
    /// now corroborate, if Redis answered.
    async fn observe(&self, witness: &Witness, rested_here: bool) -> Option<bool> {
        let n = self.witnessed.fetch_add(1, Ordering::Relaxed);
        let mut inv = self.observe.prepare_invoke();
        inv.key(corroboration::shared_key(witness.workspace_id, &witness.group))
            .arg(witness.at_ms)
            .arg(format!("{}:{}:{n}", witness.member_id, self.origin))
            .arg(if rested_here { 1 } else { 0 })
            .arg(witness.at_ms - corroboration::WINDOW_MS)
            .arg(corroboration::FAILURES)
            .arg(corroboration::MEMBERS)
            .arg(corroboration::KEPT)
            .arg(corroboration::SHARED_EXPIRY_MS);
        let mut conn = self.conn.clone();
        let sent = bounded(self.timeout, inv.invoke_async::<i64>(&mut conn)).await;
        self.note(sent, "counting an ambiguous 429").map(|v| v == 1)
    }

    /// Notes the subscriber connected (`true`) or lost; logs a change once per outage.
    pub fn note_subscribed(&self, now: bool, why: &str) {
        let was = self.subscribed.swap(now, Ordering::Relaxed);
        match (was, now) {
            (false, true) => tracing::info!(
                channel = CHANNEL,
                "redis subscriber connected: locks of other gateways heard at once"
            ),
            (true, false) => {
                tracing::warn!(error = %why, channel = CHANNEL, "redis subscriber lost: locks of other gateways come by the store poll until it reconnects")
            }
            _ => {}
        }
    }

    /// Publishes what a park wrote: each lock `rows` holds and the banned mark of `banned`.
    async fn publish_parks(&self, rows: &[(i64, LockTarget, LockEntry)], banned: Option<i64>) {
        let mut pipe = redis::pipe();
        for (credential, target, entry) in rows {
            let notice = Notice::Lock {
                credential: *credential,
                target: target.clone(),
                entry: entry.clone(),
            };
            let message = encode(&self.origin, &notice);
            // A target too long to be heard is left to the store poll.
            if message.len() <= MAX_MESSAGE {
                pipe.publish(CHANNEL, message).ignore();
            }
        }
        if let Some(credential) = banned {
            pipe.publish(CHANNEL, encode(&self.origin, &Notice::Banned { credential }))
                .ignore();
        }
        let mut conn = self.conn.clone();
        let sent = bounded(self.timeout, pipe.query_async::<()>(&mut conn)).await;
        self.note(sent, "publishing a park");
    }

    /// Raises the credential's level in Redis to the larger of Redis's plus one and `own` (this
    /// gateway's, just bumped) and publishes it; returns the account's level, if Redis answered.
    async fn bump_backoff(&self, credential: i64, own: u32) -> Option<u32> {
        let mut inv = self.bump.prepare_invoke();
        inv.key(BACKOFF_KEY)
            .arg(credential)
            .arg(own)
            .arg(CHANNEL)
            .arg(&self.origin);
        let mut conn = self.conn.clone();
        let sent = bounded(self.timeout, inv.invoke_async::<u32>(&mut conn)).await;
        self.note(sent, "sharing a backoff level")
    }

    /// Deletes the credential's level from Redis (a success, a new secret, a passed connection
    /// test) and publishes 0.
    async fn reset_backoff(&self, credential: i64) {
        let reset = Notice::Backoff { credential, level: 0 };
        let mut pipe = redis::pipe();
        pipe.atomic()
            .hdel(BACKOFF_KEY, credential)
            .ignore()
            .publish(CHANNEL, encode(&self.origin, &reset))
            .ignore();
        let mut conn = self.conn.clone();
        let sent = bounded(self.timeout, pipe.query_async::<()>(&mut conn)).await;
        self.note(sent, "resetting a backoff level");
    }

    /// Every level in [`BACKOFF_KEY`] (fields that are not a credential and a level are skipped).
    pub async fn backoff_levels(&self) -> Result<Vec<(i64, u32)>, String> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(BACKOFF_KEY);
        let read = cmd.query_async::<std::collections::HashMap<String, String>>(&mut conn);
        let fields = bounded(self.timeout, read).await?;
        Ok(fields
            .into_iter()
            .filter_map(|(c, l)| Some((c.parse().ok().filter(|c: &i64| *c > 0)?, l.parse().ok()?)))
            .collect())
    }

    /// Raises this gateway's backoff levels to Redis's (at start and at each reconnection); a
    /// level read never lowers one (a 0 read is no success heard).
    pub async fn load_backoff(&self, locks: &Locks) -> Result<(), String> {
        for (credential, level) in self.backoff_levels().await? {
            if level > 0 {
                locks.learn_backoff(credential, level);
            }
        }
        Ok(())
    }

    /// Subscribes ([`SharedLocks::subscribe`]) and, once subscribed, notes it and raises this
    /// gateway's backoff levels to Redis's (it may have missed some while not subscribed): at
    /// start and at each reconnection.
    pub async fn resubscribe(&self, locks: &Locks) -> Result<PubSubStream, String> {
        let stream = self.subscribe().await?;
        self.note_subscribed(true, "");
        if let Err(e) = self.load_backoff(locks).await {
            tracing::warn!(error = %e, "reading the backoff levels from redis failed");
        }
        Ok(stream)
    }

    /// A subscriber connection to [`CHANNEL`], subscribed, on the next seed by turns.
    pub async fn subscribe(&self) -> Result<PubSubStream, String> {
        let n = self.subscriptions.fetch_add(1, Ordering::Relaxed);
        let subscribed = async {
            let seed = self.conn.seed(n).await?;
            let mut pubsub = seed.get_async_pubsub().await?;
            pubsub.subscribe(CHANNEL).await?;
            Ok::<_, redis::RedisError>(pubsub.into_on_message())
        };
        bounded(self.timeout, subscribed).await
    }

    /// Applies one message heard on [`CHANNEL`], unless it is this gateway's own or malformed.
    pub fn hear(&self, locks: &Locks, payload: &[u8], now_ms: i64) {
        match decode(payload, now_ms) {
            Some((origin, _)) if origin == self.origin => {}
            Some((_, notice)) => apply(locks, notice),
            None => {
                if self.malformed.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        bytes = payload.len(),
                        channel = CHANNEL,
                        "malformed message from redis ignored (later ones are ignored silently)"
                    );
                }
            }
        }
    }

    /// How many messages were ignored as malformed.
    pub fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }

    /// The wait before the subscriber's next try after `failures` failed ones in a row: 200 ms
    /// doubling, at most [`MAX_RECONNECT_WAIT`].
    pub fn reconnect_wait(failures: u32) -> Duration {
        Duration::from_millis(200)
            .saturating_mul(1 << failures.min(6))
            .min(MAX_RECONNECT_WAIT)
    }

    /// Notes how an exchange went: a failure takes Redis for away, for every user of the link
    /// (logged once per outage; a writer's probe brings it back).
    fn note<T>(&self, sent: Result<T, String>, what: &str) -> Option<T> {
        sent.map_err(|why| self.conn.went_down(&format!("{what}: {why}")))
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_554_400_000;

    fn lock(credential: i64, target: LockTarget, until_ms: i64, rule: &str) -> Notice {
        Notice::Lock {
            credential,
            target,
            entry: LockEntry {
                until_ms,
                rule: rule.to_owned(),
            },
        }
    }

    #[test]
    fn every_notice_reads_back_as_written() {
        let notices = [
            lock(
                7,
                LockTarget::Model("openai/gpt-4o mini:free".into()),
                NOW + 2000,
                "backoff",
            ),
            lock(7, LockTarget::AllFree, NOW + 1, "free_daily_cap"),
            lock(8, LockTarget::Credential, NOW + 30 * 86_400_000, "monthly_hold"),
            Notice::Banned { credential: 9 },
            Notice::Backoff {
                credential: 9,
                level: 4,
            },
            Notice::Backoff {
                credential: 9,
                level: 0,
            },
        ];
        for n in notices {
            let text = encode("gw1", &n);
            assert_eq!(decode(text.as_bytes(), NOW), Some(("gw1", n)), "{text}");
        }
    }

    #[test]
    fn malformed_messages_are_refused() {
        let long = format!("gw1 lock 1 {} backoff {}", NOW + 1, "m".repeat(MAX_MESSAGE));
        let far = format!("gw1 lock 1 {} backoff m1", NOW + MAX_AHEAD_MS + 1);
        // (what, message)
        let cases: &[(&str, &[u8])] = &[
            ("empty", b""),
            ("no kind", b"gw1"),
            ("unknown kind", b"gw1 unpark 1"),
            ("no origin", b" ban 1"),
            ("a credential that is no id", b"gw1 ban one"),
            ("a credential below 1", b"gw1 ban 0"),
            ("a negative level", b"gw1 backoff 1 -2"),
            ("a lock without target", b"gw1 lock 1 1764554401000 backoff"),
            ("a lock that ended before 1970", b"gw1 lock 1 -5 backoff m1"),
            ("a rule with odd bytes", b"gw1 lock 1 1764554401000 back;off m1"),
            ("not UTF-8", b"gw1 ban \xff"),
            ("two lines", b"gw1 ban 1\ngw1 ban 2"),
            ("too long", long.as_bytes()),
            ("ends too far away", far.as_bytes()),
        ];
        for (what, message) in cases {
            assert_eq!(decode(message, NOW), None, "{what}");
        }
    }

    #[tokio::test]
    async fn heard_locks_only_extend_and_own_messages_are_skipped() {
        let link = RedisLink::new("redis://127.0.0.1:1/", Duration::from_millis(50)).expect("a url");
        let shared = SharedLocks::connect(&link);
        let locks = Locks::default();
        let other = |n: &Notice| encode("other", n);
        shared.hear(
            &locks,
            other(&lock(1, LockTarget::Model("m".into()), NOW + 5000, "backoff")).as_bytes(),
            NOW,
        );
        shared.hear(
            &locks,
            other(&lock(1, LockTarget::Model("m".into()), NOW + 1000, "backoff")).as_bytes(),
            NOW,
        );
        assert_eq!(
            locks.parked_until(1, "m", NOW),
            Some(NOW + 5000),
            "never shortened"
        );
        let own = encode(&shared.origin, &lock(2, LockTarget::Credential, NOW + 5000, "x"));
        shared.hear(&locks, own.as_bytes(), NOW);
        assert_eq!(locks.parked_until(2, "m", NOW), None, "its own message");
        shared.hear(&locks, other(&Notice::Banned { credential: 3 }).as_bytes(), NOW);
        assert!(locks.is_banned(3));
        for level in [3, 2] {
            let n = Notice::Backoff { credential: 4, level };
            shared.hear(&locks, other(&n).as_bytes(), NOW);
        }
        assert_eq!(locks.backoff_level(4), 3, "a level is only raised");
        let reset = Notice::Backoff {
            credential: 4,
            level: 0,
        };
        shared.hear(&locks, other(&reset).as_bytes(), NOW);
        assert_eq!(locks.backoff_level(4), 0, "a success elsewhere resets it");
        assert_eq!(shared.malformed(), 0);
        shared.hear(&locks, b"garbage", NOW);
        shared.hear(&locks, b"more garbage", NOW);
        assert_eq!(shared.malformed(), 2);
    }

    #[test]
    fn the_subscriber_waits_longer_after_each_failure_up_to_ten_seconds() {
        let waits: Vec<u64> = [0, 1, 2, 5, 6, 40]
            .into_iter()
            .map(|n| SharedLocks::reconnect_wait(n).as_millis() as u64)
            .collect();
        assert_eq!(waits, [200, 400, 800, 6400, 10_000, 10_000]);
    }
}
