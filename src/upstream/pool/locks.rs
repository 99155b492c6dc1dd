//! Learned locks on upstream credentials: a model on a credential, every free model of it, or
//! the whole credential, each parked until the end its failure's classification named. Kept in
//! memory for the request path, persisted and shared through the store; a concurrent writer only
//! ever extends a lock (kRouter; groot ADR 0008 "extend-only rests").

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use rustc_hash::FxHashMap;

use super::classify::is_free_model;
use crate::store::{ALL_FREE_TARGET, LockRow, LockStore, Store, StoreResult, WHOLE_CREDENTIAL_TARGET};

/// What a lock parks on one credential.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LockTarget {
    /// One upstream model.
    Model(String),
    /// Every `:free` model (they share one allowance).
    AllFree,
    /// The whole credential.
    Credential,
}

impl LockTarget {
    /// As stored (`upstream_locks.target`).
    pub fn to_db(&self) -> String {
        match self {
            LockTarget::Model(m) => m.clone(),
            LockTarget::AllFree => ALL_FREE_TARGET.to_owned(),
            LockTarget::Credential => WHOLE_CREDENTIAL_TARGET.to_owned(),
        }
    }

    /// As stored, or as another gateway published it.
    pub fn from_db(s: &str) -> LockTarget {
        match s {
            WHOLE_CREDENTIAL_TARGET => LockTarget::Credential,
            ALL_FREE_TARGET => LockTarget::AllFree,
            m => LockTarget::Model(m.to_owned()),
        }
    }
}

/// A running lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockEntry {
    /// End, Unix ms.
    pub until_ms: i64,
    /// The classification rule that wrote it.
    pub rule: String,
}

/// Every credential's locks, backoff level, Kiro monthly holds and banned mark.
#[derive(Default)]
pub struct Locks {
    locks: Mutex<FxHashMap<(i64, LockTarget), LockEntry>>,
    backoff: Mutex<FxHashMap<i64, u32>>,
    /// kRouter rule 5: Kiro monthly holds since the credential's last success, a count of its
    /// own: the backoff level rises with every 429 and overload, and a Kiro hold read from it
    /// would last 30 days times any run of those.
    kiro_holds: Mutex<FxHashMap<i64, u32>>,
    banned: Mutex<HashSet<i64>>,
}

impl Locks {
    /// The latest end of the running locks that park `upstream_model` on `credential`, if any.
    pub fn parked_until(&self, credential: i64, upstream_model: &str, now_ms: i64) -> Option<i64> {
        self.parked_until_besides(credential, upstream_model, now_ms, &[])
    }

    /// [`Locks::parked_until`], leaving out each of the locks `own` wrote that is still as it
    /// wrote it (a hold the caller itself is entitled to go past).
    pub fn parked_until_besides(
        &self,
        credential: i64,
        upstream_model: &str,
        now_ms: i64,
        own: &[(i64, LockTarget, LockEntry)],
    ) -> Option<i64> {
        let locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        let mut targets = vec![
            LockTarget::Credential,
            LockTarget::Model(upstream_model.to_owned()),
        ];
        if is_free_model(upstream_model) {
            targets.push(LockTarget::AllFree);
        }
        targets
            .into_iter()
            .filter_map(|t| {
                let e = locks.get(&(credential, t.clone()))?;
                let mine = own
                    .iter()
                    .any(|(c, ot, oe)| *c == credential && *ot == t && oe == e);
                (!mine).then_some(e.until_ms)
            })
            .filter(|u| *u > now_ms)
            .max()
    }

    /// Lifts each of `rows` that is still as it was written: a lock another writer extended
    /// meanwhile stays.
    pub fn lift(&self, rows: &[(i64, LockTarget, LockEntry)]) {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        for (c, t, e) in rows {
            let key = (*c, t.clone());
            if locks.get(&key) == Some(e) {
                locks.remove(&key);
            }
        }
    }

    /// Whether the credential carries the banned mark (until a connection test passes).
    pub fn is_banned(&self, credential: i64) -> bool {
        self.banned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&credential)
    }

    /// The credential's consecutive backoff failures.
    pub fn backoff_level(&self, credential: i64) -> u32 {
        self.backoff
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&credential)
            .copied()
            .unwrap_or(0)
    }

    /// One more backoff failure in a row; returns the new level.
    pub fn bump_backoff(&self, credential: i64) -> u32 {
        let mut levels = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        let level = levels.entry(credential).or_default();
        *level = level.saturating_add(1);
        *level
    }

    /// A level another gateway reached or reset (kRouter rule 5: "the backoff level belongs to
    /// the account"): 0 resets it (a success there), any other level raises this gateway's to it
    /// and never lowers it.
    pub fn learn_backoff(&self, credential: i64, level: u32) {
        let mut levels = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        if level == 0 {
            levels.remove(&credential);
        } else {
            let own = levels.entry(credential).or_default();
            *own = (*own).max(level);
        }
    }

    /// The credential's Kiro monthly holds since its last success.
    pub fn kiro_holds(&self, credential: i64) -> u32 {
        self.kiro_holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&credential)
            .copied()
            .unwrap_or(0)
    }

    /// One more Kiro monthly hold before a success.
    pub fn count_kiro_hold(&self, credential: i64) {
        let mut holds = self.kiro_holds.lock().unwrap_or_else(|p| p.into_inner());
        let n = holds.entry(credential).or_default();
        *n = n.saturating_add(1);
    }

    /// A success: the backoff level and the Kiro monthly holds go back to zero (kRouter rule 5:
    /// "longer if it happens again before a success"). Returns whether there was a level to
    /// reset (only then do the other gateways need telling).
    pub fn success(&self, credential: i64) -> bool {
        let had_level = self.reset_backoff(credential);
        self.kiro_holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&credential);
        had_level
    }

    fn reset_backoff(&self, credential: i64) -> bool {
        self.backoff
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&credential)
            .is_some_and(|l| l > 0)
    }

    /// Parks `target` on each of `credentials` until `until_ms`, extending, never shortening.
    /// Returns the rows to persist.
    pub fn park(
        &self,
        credentials: &[i64],
        target: &LockTarget,
        until_ms: i64,
        rule: &str,
    ) -> Vec<(i64, LockTarget, LockEntry)> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for c in credentials {
            let e = locks.entry((*c, target.clone())).or_insert(LockEntry {
                until_ms: 0,
                rule: String::new(),
            });
            if until_ms > e.until_ms {
                *e = LockEntry {
                    until_ms,
                    rule: rule.to_owned(),
                };
                out.push((*c, target.clone(), e.clone()));
            }
        }
        out
    }

    /// Marks a credential banned.
    pub fn ban(&self, credential: i64) {
        self.banned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(credential);
    }

    /// Running locks of a credential: (target, end, rule).
    pub fn of(&self, credential: i64, now_ms: i64) -> Vec<(String, i64, String)> {
        let locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks
            .iter()
            .filter(|((c, _), e)| *c == credential && e.until_ms > now_ms)
            .map(|((_, t), e)| (t.to_db(), e.until_ms, e.rule.clone()))
            .collect()
    }

    /// Running locks counted by what they park (`model`, `free_models`, `credential`) and the
    /// rule that wrote them (metrics, read at scrape time). Sorted.
    pub fn running_by_rule(&self, now_ms: i64) -> Vec<((&'static str, String), usize)> {
        let locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        let mut counts: HashMap<(&'static str, String), usize> = HashMap::new();
        for ((_, target), e) in locks.iter().filter(|(_, e)| e.until_ms > now_ms) {
            let scope = match target {
                LockTarget::Model(_) => "model",
                LockTarget::AllFree => "free_models",
                LockTarget::Credential => "credential",
            };
            *counts.entry((scope, e.rule.clone())).or_default() += 1;
        }
        let mut counts: Vec<_> = counts.into_iter().collect();
        counts.sort_unstable();
        counts
    }

    /// How many credentials carry the banned mark.
    pub fn banned_count(&self) -> usize {
        self.banned.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// A new secret (kRouter: "editing its key … clears its per-model locks and resets the
    /// backoff — but not a running account-wide hold or the banned mark"): forgets the
    /// credential's per-model locks and its backoff level, keeps the whole-credential hold, the
    /// shared free allowance's hold, the banned mark and the count of Kiro monthly holds (it
    /// belongs to the account hold, and a new key is no success). Every gateway calls it when its
    /// configuration reload sees the secret changed.
    pub fn secret_replaced(&self, credential: i64) {
        self.locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(c, target), _| *c != credential || !matches!(target, LockTarget::Model(_)));
        self.reset_backoff(credential);
    }

    /// Forgets every lock, the banned mark and the backoff of a credential (a passed connection
    /// test).
    pub fn clear(&self, credential: i64) {
        self.locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(c, _), _| *c != credential);
        self.banned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&credential);
        let _ = self.success(credential);
    }

    /// Merges the store's running locks and banned marks (other gateways, restarts); with
    /// `replace`, the store's view replaces this gateway's (after a configuration change, so a
    /// connection test on another gateway clears the locks here too).
    pub async fn load(&self, store: &Store, now_ms: i64, replace: bool) -> StoreResult<()> {
        let rows = store.running_locks(now_ms).await?;
        let banned = store.banned_credentials().await?;
        {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.retain(|_, e| e.until_ms > now_ms && !replace);
            for LockRow {
                credential_id: c,
                target,
                until_ms,
                rule,
            } in rows
            {
                let e = locks
                    .entry((c, LockTarget::from_db(&target)))
                    .or_insert(LockEntry {
                        until_ms: 0,
                        rule: String::new(),
                    });
                if until_ms > e.until_ms {
                    *e = LockEntry { until_ms, rule };
                }
            }
        }
        let mut marks = self.banned.lock().unwrap_or_else(|p| p.into_inner());
        if replace {
            marks.clear();
        }
        marks.extend(banned);
        Ok(())
    }
}

/// Clears a credential's locks and banned mark in the store.
pub async fn clear(store: &Store, credential: i64) -> StoreResult<()> {
    store.clear_locks(credential).await?;
    store.bump_config_epoch().await
}

/// Clears a credential's per-model locks in the store (its secret changed), keeping the
/// account-wide holds (the whole credential, the shared free allowance) and the banned mark,
/// which need a test. The same as [`Locks::secret_replaced`] does in memory.
pub async fn clear_model_locks(store: &Store, credential: i64) -> StoreResult<()> {
    store.clear_model_locks(credential).await
}

/// Writes locks, extending and never shortening what another gateway wrote.
pub async fn persist(
    store: &Store,
    rows: &[(i64, LockTarget, LockEntry)],
    banned: Option<i64>,
) -> StoreResult<()> {
    let rows: Vec<LockRow> = rows
        .iter()
        .map(|(c, t, e)| LockRow {
            credential_id: *c,
            target: t.to_db(),
            until_ms: e.until_ms,
            rule: e.rule.clone(),
        })
        .collect();
    store.extend_locks(&rows).await?;
    if let Some(c) = banned {
        store.mark_banned(c).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_only_extend_and_cover_their_target() {
        let l = Locks::default();
        assert_eq!(l.park(&[1], &LockTarget::Model("m".into()), 1000, "a").len(), 1);
        assert!(
            l.park(&[1], &LockTarget::Model("m".into()), 500, "b").is_empty(),
            "never shortened"
        );
        assert_eq!(l.parked_until(1, "m", 0), Some(1000));
        assert_eq!(
            l.parked_until(1, "other", 0),
            None,
            "another model on the same credential is free"
        );
        assert_eq!(l.parked_until(1, "m", 1000), None, "ended");
        l.park(&[1, 2], &LockTarget::AllFree, 2000, "free");
        assert_eq!(l.parked_until(2, "x:free", 0), Some(2000));
        assert_eq!(l.parked_until(2, "paid", 0), None);
        l.park(&[3], &LockTarget::Credential, 3000, "monthly");
        assert_eq!(l.parked_until(3, "anything", 0), Some(3000));
    }

    #[test]
    fn a_hold_is_lifted_and_looked_past_only_as_written() {
        let l = Locks::default();
        let own = l.park(&[1], &LockTarget::Model("m".into()), 1000, "server_error");
        assert_eq!(l.parked_until_besides(1, "m", 0, &own), None, "its own hold");
        l.park(&[1], &LockTarget::Credential, 500, "account_wide");
        assert_eq!(
            l.parked_until_besides(1, "m", 0, &own),
            Some(500),
            "another lock is not looked past"
        );
        l.lift(&own);
        assert_eq!(l.parked_until(1, "m", 0), Some(500));
        let own = l.park(&[2], &LockTarget::Model("m".into()), 1000, "server_error");
        l.park(&[2], &LockTarget::Model("m".into()), 2000, "backoff");
        assert_eq!(
            l.parked_until_besides(2, "m", 0, &own),
            Some(2000),
            "extended meanwhile"
        );
        l.lift(&own);
        assert_eq!(l.parked_until(2, "m", 0), Some(2000), "an extended hold stays");
    }

    #[test]
    fn kiro_holds_are_counted_apart_from_the_backoff_level() {
        let l = Locks::default();
        l.bump_backoff(1);
        l.count_kiro_hold(1);
        l.count_kiro_hold(1);
        assert_eq!((l.backoff_level(1), l.kiro_holds(1)), (1, 2));
        assert_eq!(l.kiro_holds(2), 0, "per credential");
        l.secret_replaced(1);
        assert_eq!(
            (l.backoff_level(1), l.kiro_holds(1)),
            (0, 2),
            "a new key is no success: the count stays with the account hold"
        );
        l.success(1);
        assert_eq!(l.kiro_holds(1), 0, "a success starts the count over");
        l.count_kiro_hold(1);
        l.clear(1);
        assert_eq!(l.kiro_holds(1), 0, "a passed connection test too");
    }

    #[test]
    fn a_new_secret_forgets_model_locks_and_backoff_not_account_holds() {
        let l = Locks::default();
        l.park(&[1], &LockTarget::Model("m".into()), 1000, "backoff");
        l.park(&[1], &LockTarget::AllFree, 2000, "free");
        l.park(&[2], &LockTarget::Model("m".into()), 1000, "backoff");
        l.park(&[3], &LockTarget::Credential, 3000, "monthly");
        l.park(&[3], &LockTarget::Model("m".into()), 1000, "backoff");
        l.ban(3);
        for c in [1, 2, 3] {
            for _ in 0..8 {
                l.bump_backoff(c);
            }
        }
        l.secret_replaced(1);
        l.secret_replaced(3);
        // (credential, model, parked until, backoff level, banned)
        type Row = (i64, &'static str, Option<i64>, u32, bool);
        let rows: &[Row] = &[
            (1, "m", None, 0, false),
            (1, "x:free", Some(2000), 0, false),
            (2, "m", Some(1000), 8, false),
            (3, "m", Some(3000), 0, true),
        ];
        for (c, model, until, level, banned) in rows {
            assert_eq!(l.parked_until(*c, model, 0), *until, "{c} {model}");
            assert_eq!(l.backoff_level(*c), *level, "{c}");
            assert_eq!(l.is_banned(*c), *banned, "{c}");
        }
        assert_eq!(
            l.of(3, 0).into_iter().map(|(t, _, _)| t).collect::<Vec<_>>(),
            ["*"],
            "the hold on the whole credential stays"
        );
    }
}
