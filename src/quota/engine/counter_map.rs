//! The quota counters of one gateway, indexed so that a flush and the alert check visit only the
//! counters that moved (issue 40 item 4).

use chrono::{DateTime, Utc};
use rustc_hash::FxHashMap;

use super::{Counter, CounterKey};
use crate::quota::SubjectKind;

/// The counters, with what lets a flush and the alert check visit only the counters that moved:
/// an idle counter costs them nothing (issue 40 item 4: 50,000 idle end users' counters cost a
/// SQLite gateway 1.4 s a flush when every flush visited and read back each of them).
#[derive(Default)]
pub(super) struct CounterMap {
    /// Every counter.
    pub(super) all: FxHashMap<CounterKey, Counter>,
    /// The counters added to since the last flush (each once: [`Counter::queued`]).
    pub(super) changed: Vec<CounterKey>,
    /// The counters whose global total changed since the alert check last looked.
    pub(super) alert_due: Vec<CounterKey>,
    /// Which flush this is: bumped by each, so a counter's `seen` tells whether it was used since.
    pub(super) generation: u64,
    /// The earliest end of a counter's window: no counter can be forgotten before it, so a flush
    /// looks for ended counters only once it has passed (none: no counter ends).
    pub(super) next_end: Option<DateTime<Utc>>,
    /// Labels first seen during an outage, now stored ([`QuotaCounters::relabel`]): (subject
    /// kind, provisional id) to the stored id and when it was learned (Unix ms). Kept for a day,
    /// for the requests in flight under the provisional id.
    pub(super) relabeled: FxHashMap<(SubjectKind, i64), (i64, i64)>,
}

impl CounterMap {
    /// The counter of `key`, made (with a window ending at `ends`) if new, marked as used now.
    pub(super) fn entry(&mut self, key: &CounterKey, ends: Option<DateTime<Utc>>) -> &mut Counter {
        let next_end = &mut self.next_end;
        let c = self.all.entry(key.clone()).or_insert_with(|| {
            if let Some(end) = ends {
                *next_end = Some(next_end.map_or(end, |n| n.min(end)));
            }
            Counter::new(ends)
        });
        c.seen = self.generation;
        c
    }

    /// Lists `key` for the next flush (once).
    pub(super) fn queue(&mut self, key: &CounterKey) {
        if let Some(c) = self.all.get_mut(key)
            && !c.queued
        {
            c.queued = true;
            self.changed.push(key.clone());
        }
    }

    /// Lists `key` for the next alert check (once).
    pub(super) fn alert(&mut self, key: &CounterKey) {
        if let Some(c) = self.all.get_mut(key)
            && !c.alert_check
        {
            c.alert_check = true;
            self.alert_due.push(key.clone());
        }
    }

    /// Moves what was counted under provisional subject ids that now have a stored one to the
    /// stored id's counters (only counters with something unwritten are visited: the others
    /// hold nothing and are forgotten when their window ends).
    pub(super) fn move_relabeled(&mut self) {
        if self.relabeled.is_empty() {
            return;
        }
        let mut held = Vec::new();
        for key in std::mem::take(&mut self.changed) {
            let stored = (key.subject_id < 0)
                .then(|| self.relabeled.get(&(key.subject, key.subject_id)))
                .flatten();
            let (Some((id, _)), Some(old)) = (stored, self.all.get(&key)) else {
                held.push(key);
                continue;
            };
            let to = CounterKey {
                subject_id: *id,
                ..key.clone()
            };
            let ends = old.ends;
            let Some(old) = self.all.remove(&key) else {
                continue;
            };
            let c = self.entry(&to, ends);
            c.pending = c.pending.saturating_add(old.pending);
            for (policy, fired) in old.watchers {
                match c.watchers.iter_mut().find(|(p, _)| *p == policy) {
                    Some((_, known)) => {
                        for t in fired {
                            if !known.contains(&t) {
                                known.push(t);
                            }
                        }
                    }
                    None => c.watchers.push((policy, fired)),
                }
            }
            if c.pending != 0 && !c.queued {
                c.queued = true;
                held.push(to);
            }
        }
        self.changed.extend(held);
    }

    /// Forgets the counters a flush at `now` may forget, when a window has ended since the last
    /// look (a scan of every counter then, once per window end, not at every flush).
    pub(super) fn forget_ended(&mut self, now: DateTime<Utc>) {
        if self.next_end.is_none_or(|end| end > now) {
            return;
        }
        let generation = self.generation;
        self.all.retain(|_, c| !c.done_with(now, generation));
        self.next_end = self.all.values().filter_map(|c| c.ends).min();
    }
}
