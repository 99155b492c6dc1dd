//! groot ADR 0008: an ambiguous 429 (one that names no account-level limit,
//! [`Sharing::AccountIfCorroborated`](super::classify::Sharing)) rests only its route — that model
//! on that credential — unless it is corroborated: 3 such failures from 2 different members
//! ("users") within 30 s on the same quota group rest the whole quota group. Members, not gateway
//! API keys: one person with two keys is one witness.
//!
//! The classifier stays pure; this is the memory it needs. [`Witnesses`] is the rule on one
//! group (pure, table-tested); [`Corroboration`] keeps one per quota group, in this process only
//! (each replica corroborates from its own traffic; the group rest it then writes is shared).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// groot ADR 0008: failures older than this corroborate nothing.
pub const WINDOW_MS: i64 = 30_000;
/// groot ADR 0008: this many ambiguous failures …
pub const FAILURES: usize = 3;
/// groot ADR 0008: … from at least this many different members ("2 users").
pub const MEMBERS: usize = 2;
/// Most failures remembered per group; only the most recent matter.
const KEPT: usize = 32;

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
    fn groups_are_counted_apart() {
        let c = Corroboration::default();
        assert!(!c.observe(1, "a", 0, 1));
        assert!(!c.observe(1, "b", 0, 2));
        assert!(!c.observe(2, "a", 0, 2), "same name, another workspace");
        assert!(!c.observe(1, "a", 1_000, 2));
        assert!(c.observe(1, "a", 2_000, 1));
    }
}
