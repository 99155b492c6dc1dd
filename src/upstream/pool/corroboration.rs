//! groot ADR 0008: an ambiguous 429 (one that names no account-level limit,
//! [`Sharing::AccountIfCorroborated`](super::classify::Sharing)) rests only its route — that model
//! on that credential — unless it is corroborated: 3 such failures from 2 different members
//! ("users") within 30 s on the same quota group rest the whole quota group. Members, not gateway
//! API keys: one person with two keys is one witness.
//!
//! The classifier stays pure; this is the memory it needs. [`Witnesses`] is the rule on one
//! group (pure, table-tested); [`Corroboration`] keeps one per quota group for this process's
//! own traffic: a gateway whose own failures corroborate rests the group at once.
//!
//! Across gateways (issue 44, with `redis_url`): behind a load balancer each gateway sees only
//! part of the failures, so each is also recorded in Redis, off the request path (the writer of
//! [`super::shared`]), in the sorted set [`shared_key`] `aigw:corroboration:<workspace id>:<group>`
//! scored by the failure's time and valued `<member id>:<unique>`. [`SHARED_OBSERVE`] adds it,
//! drops what fell out of the 30 s window and answers, in the same round trip, whether the
//! group's failures across all gateways now corroborate (the set is then cleared, as
//! [`Witnesses::observe`] starts over); the gateway that recorded the corroborating failure then
//! rests the group as the local rule would ([`GroupRest`], worked out when the failure was seen),
//! and that rest reaches the others as every rest does. A rest by the local rule clears the set.
//! Redis away: the local rule alone, as without it.
//!
//! Clocks: the scores are each gateway's own clock (the injected `Clock`). Gateways' clocks are
//! assumed within a second of each other; a difference only widens or narrows the 30 s window by
//! that much.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use super::locks::LockTarget;

/// groot ADR 0008: failures older than this corroborate nothing.
pub const WINDOW_MS: i64 = 30_000;
/// groot ADR 0008: this many ambiguous failures …
pub const FAILURES: usize = 3;
/// groot ADR 0008: … from at least this many different members ("2 users").
pub const MEMBERS: usize = 2;
/// Most failures remembered per group; only the most recent matter.
pub const KEPT: usize = 32;

/// The recent ambiguous failures of one quota group: (Unix ms, member id).
#[derive(Debug, Default)]
pub struct Witnesses {
    seen: VecDeque<(i64, i64)>,
}

impl Witnesses {
    /// Records one ambiguous failure seen at `at_ms` by the member `member_id`. True when it
    /// corroborates the earlier ones — at least 3 failures from 2 different members within the
    /// last 30 s — and the group must rest; the witnesses then start over (the rest covers them).
    pub fn observe(&mut self, at_ms: i64, member_id: i64) -> bool {
        self.seen.retain(|(t, _)| at_ms - t <= WINDOW_MS);
        if self.seen.len() >= KEPT {
            self.seen.pop_front();
        }
        self.seen.push_back((at_ms, member_id));
        let mut members: Vec<i64> = Vec::with_capacity(MEMBERS);
        for (_, m) in &self.seen {
            if members.len() >= MEMBERS {
                break;
            }
            if !members.contains(m) {
                members.push(*m);
            }
        }
        let corroborated = self.seen.len() >= FAILURES && members.len() >= MEMBERS;
        if corroborated {
            self.seen.clear();
        }
        corroborated
    }
}

/// The witnesses of every quota group, keyed by workspace and group name.
#[derive(Default)]
pub struct Corroboration {
    groups: Mutex<HashMap<(i64, String), Witnesses>>,
}

impl Corroboration {
    /// Records an ambiguous failure on `group` of `workspace_id`, seen by the member `member_id`;
    /// true when the group must rest.
    pub fn observe(&self, workspace_id: i64, group: &str, at_ms: i64, member_id: i64) -> bool {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        // Failures are rare; forget groups whose witnesses have all expired.
        groups.retain(|_, w| w.seen.back().is_some_and(|(t, _)| at_ms - t <= WINDOW_MS));
        groups
            .entry((workspace_id, group.to_owned()))
            .or_default()
            .observe(at_ms, member_id)
    }
}

/// The prefix of a quota group's sorted set of ambiguous failures in Redis.
pub const SHARED_KEY_PREFIX: &str = "aigw:corroboration:";

/// How long Redis keeps a group's failures after the last one (real time; the window itself is
/// applied to the scores): twice the window, so a quiet group leaves nothing behind.
pub const SHARED_EXPIRY_MS: i64 = 2 * WINDOW_MS;

/// The sorted set of `group`'s ambiguous failures in workspace `workspace_id` (group names are
/// unique per workspace only).
pub fn shared_key(workspace_id: i64, group: &str) -> String {
    format!("{SHARED_KEY_PREFIX}{workspace_id}:{group}")
}

/// groot ADR 0008 across gateways, in one round trip. KEYS[1]: the group's set ([`shared_key`]).
/// ARGV: the failure's time (Unix ms, the recording gateway's clock), its value (`<member
/// id>:<unique>`), `1` when the recording gateway's own traffic already corroborated it and
/// rested the group (the count only starts over), the oldest time still in the window (the
/// failure's less [`WINDOW_MS`]), [`FAILURES`], [`MEMBERS`], [`KEPT`], [`SHARED_EXPIRY_MS`].
/// Returns 1 when the failures within the window before it (across every gateway) corroborate,
/// and then clears the set, as [`Witnesses::observe`] does.
pub const SHARED_OBSERVE: &str = r"
if ARGV[3] == '1' then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[4])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[7]) + 1))
local seen = redis.call('ZRANGE', KEYS[1], 0, -1)
local members, distinct = {}, 0
for _, v in ipairs(seen) do
  local m = string.match(v, '^[^:]*')
  if not members[m] then
    members[m] = true
    distinct = distinct + 1
  end
end
if #seen >= tonumber(ARGV[5]) and distinct >= tonumber(ARGV[6]) then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[8])
return 0
";

/// An ambiguous failure a gateway saw on a quota group, to count across gateways.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Witness {
    /// The group's workspace.
    pub workspace_id: i64,
    /// The quota group.
    pub group: String,
    /// When it was seen, Unix ms (the gateway's clock).
    pub at_ms: i64,
    /// The caller's member.
    pub member_id: i64,
}

/// The rest a corroboration across gateways brings, worked out when the failure was seen: what
/// the local rule would have parked then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupRest {
    /// Every credential of the quota group.
    pub credentials: Vec<i64>,
    /// What is parked on each.
    pub targets: Vec<LockTarget>,
    /// The rest's end, Unix ms.
    pub until_ms: i64,
    /// The classification rule that parked.
    pub rule: &'static str,
    /// The provider's words, for the credentials' cards.
    pub said: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_failures_from_two_members_within_thirty_seconds() {
        // (case, failures as (seconds, member), whether the last one rests the group)
        type Row = (&'static str, &'static [(i64, i64)], bool);
        let rows: &[Row] = &[
            ("one failure", &[(0, 1)], false),
            ("two failures, two members", &[(0, 1), (1, 2)], false),
            ("three failures, one member", &[(0, 1), (1, 1), (2, 1)], false),
            ("three failures, two members", &[(0, 1), (1, 1), (2, 2)], true),
            ("three failures, three members", &[(0, 1), (1, 2), (2, 3)], true),
            ("the second member first", &[(0, 2), (1, 1), (2, 1)], true),
            (
                "exactly 30 s apart still counts",
                &[(0, 1), (15, 1), (30, 2)],
                true,
            ),
            (
                "the first fell out of the window",
                &[(0, 2), (20, 1), (31, 1)],
                false,
            ),
            (
                "window slides: the latest three count",
                &[(0, 1), (31, 1), (40, 2), (45, 1)],
                true,
            ),
            (
                "many from one member, then another",
                &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 2)],
                true,
            ),
            (
                "spread over minutes",
                &[(0, 1), (40, 2), (80, 1), (120, 2)],
                false,
            ),
        ];
        for (case, failures, want) in rows {
            let mut w = Witnesses::default();
            let mut last = false;
            for (i, (secs, member)) in failures.iter().enumerate() {
                last = w.observe(secs * 1000, *member);
                if i + 1 < failures.len() {
                    assert!(!last, "{case}: rested early, at failure {}", i + 1);
                }
            }
            assert_eq!(last, *want, "{case}");
        }
    }

    #[test]
    fn a_rest_starts_the_count_over() {
        let mut w = Witnesses::default();
        assert!(!w.observe(0, 1));
        assert!(!w.observe(1_000, 2));
        assert!(w.observe(2_000, 1));
        assert!(
            !w.observe(3_000, 2),
            "the earlier failures are covered by the rest"
        );
    }

    #[test]
    fn a_groups_set_in_redis_is_named_by_its_workspace_and_name() {
        assert_eq!(shared_key(3, "acct"), "aigw:corroboration:3:acct");
        assert_ne!(
            shared_key(1, "a"),
            shared_key(2, "a"),
            "same name, another workspace"
        );
    }

    #[test]
    fn groups_are_counted_apart() {
        let c = Corroboration::default();
        assert!(!c.observe(1, "a", 0, 1));
        assert!(!c.observe(1, "b", 0, 2));
        assert!(!c.observe(2, "a", 0, 2), "same name, another workspace");
        assert!(!c.observe(1, "a", 1_000, 2));
        assert!(c.observe(1, "a", 2_000, 1));
    }
}
