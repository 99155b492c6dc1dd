//! How a new label is admitted (issue 40 item 3 and item 13): under the workspace's caps and
//! the caps of the key that brings it, one at a time per workspace on this gateway, so that a
//! burst of new labels passes no cap here (across gateways a cap may be passed by one label per
//! other gateway admitting at the same moment). And the upkeep that lets labels expire: when a
//! request last brought each one is noted in memory and written in batches (never a write per
//! request); unseen ones are deleted after `label_expiry_days`; what a prune or an expiry
//! deleted is forgotten here, and caps remembered as reached are forgotten each upkeep, since
//! rows may have gone.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::LabelIds;
use crate::error::ApiError;
use crate::quota::policy::Labels;
use crate::store::{LabelCaps, LabelKind, NewLabel, OverCap, Refused, Store, StoreResult};

/// A day, in ms.
const DAY_MS: i64 = 86_400_000;

/// A sighting is noted to the minute: one statement per minute and 500 labels at each upkeep.
const MINUTE_MS: i64 = 60_000;

/// The admission side of [`LabelIds`]: locks, per-key caps found reached, sightings.
#[derive(Default)]
pub(super) struct LabelGate {
    /// One lock per workspace: its new labels are counted and added one at a time here.
    admitting: Mutex<HashMap<i64, Arc<tokio::sync::Mutex<()>>>>,
    /// Per-key caps found reached: (key, cap, the tag key for a tag's values).
    full_keys: Mutex<HashSet<(i64, CapOf, Option<String>)>>,
    /// Tag values seen since the last upkeep: id → the minute last seen (Unix ms).
    seen_tags: Mutex<HashMap<i64, i64>>,
    /// End users seen since the last upkeep, likewise.
    seen_end_users: Mutex<HashMap<i64, i64>>,
}

/// [`OverCap`] as a set's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum CapOf {
    TagKeys,
    TagValues,
    EndUsers,
}

impl From<OverCap> for CapOf {
    fn from(o: OverCap) -> CapOf {
        match o {
            OverCap::TagKeys => CapOf::TagKeys,
            OverCap::TagValues => CapOf::TagValues,
            OverCap::EndUsers => CapOf::EndUsers,
        }
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LabelGate {
    /// The lock of workspace `ws`'s new labels.
    fn admitting(&self, ws: i64) -> Arc<tokio::sync::Mutex<()>> {
        locked(&self.admitting).entry(ws).or_default().clone()
    }

    /// `per_key` with the caps of `api_key` found reached set to 0 (refused without counting).
    fn known(&self, api_key: i64, tag_key: Option<&str>, per_key: LabelCaps) -> LabelCaps {
        let full = locked(&self.full_keys);
        let reached = |cap: CapOf, k: Option<&str>| full.contains(&(api_key, cap, k.map(str::to_owned)));
        LabelCaps {
            tag_keys: if reached(CapOf::TagKeys, None) {
                0
            } else {
                per_key.tag_keys
            },
            tag_values: if reached(CapOf::TagValues, tag_key) {
                0
            } else {
                per_key.tag_values
            },
            end_users: if reached(CapOf::EndUsers, None) {
                0
            } else {
                per_key.end_users
            },
        }
    }

    /// Notes the labels of a request served at `now_ms`.
    pub(super) fn saw(&self, labels: &Labels, now_ms: i64) {
        let minute = now_ms - now_ms.rem_euclid(MINUTE_MS);
        if !labels.tags.is_empty() {
            let mut seen = locked(&self.seen_tags);
            for (_, _, id) in &labels.tags {
                seen.insert(*id, minute);
            }
        }
        if let Some((_, id)) = &labels.end_user {
            locked(&self.seen_end_users).insert(*id, minute);
        }
    }
}

impl LabelIds {
    /// The id of tag `key=value`, new to this gateway: found in the store, or made for
    /// `api_key` within the workspace's caps and the key's.
    #[expect(clippy::too_many_arguments, reason = "the request's parts, each named")]
    pub(super) async fn admit_tag(
        &self,
        store: &Store,
        caps: LabelCaps,
        per_key: LabelCaps,
        ws: i64,
        api_key: i64,
        key: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<i64, ApiError> {
        let workspace = {
            let full = locked(&self.full_tags);
            LabelCaps {
                tag_keys: if full.contains(&(ws, None)) {
                    0
                } else {
                    caps.tag_keys
                },
                tag_values: if full.contains(&(ws, Some(key.to_owned()))) {
                    0
                } else {
                    caps.tag_values
                },
                ..caps
            }
        };
        let by = NewLabel {
            api_key_id: api_key,
            workspace,
            per_key: self.gate.known(api_key, Some(key), per_key),
        };
        let lock = self.gate.admitting(ws);
        let (k, v) = (key.to_owned(), value.to_owned());
        let found = match store.fail_fast() {
            Ok(()) => {
                store
                    .at_home(|s| async move {
                        let _one_at_a_time = lock.lock_owned().await;
                        s.admit_tag_value(ws, &k, &v, by, now_ms).await
                    })
                    .await
            }
            Err(e) => Err(e),
        };
        let found = match found {
            Ok(found) => found,
            // The database away: served from memory, stored when it is back (`outage.rs`).
            Err(e) => {
                let id = self.outage.tag(store, e, ws, key, value, workspace)?;
                locked(&self.tags).insert((ws, key.to_owned(), value.to_owned()), id);
                return Ok(id);
            }
        };
        let refused = match found {
            Ok(id) => {
                locked(&self.tags).insert((ws, key.to_owned(), value.to_owned()), id);
                return Ok(id);
            }
            Err(r) => r,
        };
        let scope = (refused.over == OverCap::TagValues).then(|| key.to_owned());
        if refused.per_key {
            locked(&self.gate.full_keys).insert((api_key, refused.over.into(), scope));
        } else {
            locked(&self.full_tags).insert((ws, scope));
        }
        Err(refusal(refused, Some(key), caps, per_key))
    }

    /// The id of end user `user`, new to this gateway, as [`LabelIds::admit_tag`].
    #[expect(clippy::too_many_arguments, reason = "the request's parts, each named")]
    pub(super) async fn admit_end_user(
        &self,
        store: &Store,
        caps: LabelCaps,
        per_key: LabelCaps,
        ws: i64,
        api_key: i64,
        user: &str,
        now_ms: i64,
    ) -> Result<i64, ApiError> {
        let workspace = LabelCaps {
            end_users: if locked(&self.full_end_users).contains(&ws) {
                0
            } else {
                caps.end_users
            },
            ..caps
        };
        let by = NewLabel {
            api_key_id: api_key,
            workspace,
            per_key: self.gate.known(api_key, None, per_key),
        };
        let lock = self.gate.admitting(ws);
        let u = user.to_owned();
        let found = match store.fail_fast() {
            Ok(()) => {
                store
                    .at_home(|s| async move {
                        let _one_at_a_time = lock.lock_owned().await;
                        s.admit_end_user(ws, &u, by, now_ms).await
                    })
                    .await
            }
            Err(e) => Err(e),
        };
        let found = match found {
            Ok(found) => found,
            // The database away: served from memory, stored when it is back (`outage.rs`).
            Err(e) => {
                let id = self.outage.end_user(store, e, ws, user, workspace)?;
                locked(&self.end_users).insert((ws, user.to_owned()), id);
                return Ok(id);
            }
        };
        match found {
            Ok(id) => {
                locked(&self.end_users).insert((ws, user.to_owned()), id);
                Ok(id)
            }
            Err(refused) => {
                if refused.per_key {
                    locked(&self.gate.full_keys).insert((api_key, CapOf::EndUsers, None));
                } else {
                    locked(&self.full_end_users).insert(ws);
                }
                Err(refusal(refused, None, caps, per_key))
            }
        }
    }

    /// The labels' upkeep, every minute on every gateway (and at each sync of the tests): writes
    /// the sightings ([`LabelIds::write_sightings`]), deletes the labels unseen for
    /// `expiry_days` (0: never), and forgets the caps remembered as reached.
    pub async fn upkeep(&self, store: &Store, expiry_days: u32, now_ms: i64) -> StoreResult<()> {
        self.write_sightings(store).await?;
        if expiry_days > 0 {
            let before = now_ms.saturating_sub(i64::from(expiry_days) * DAY_MS);
            for kind in [LabelKind::Tag, LabelKind::EndUser] {
                let gone = store
                    .at_home(|s| async move { s.delete_unseen_labels(kind, before).await })
                    .await?;
                self.forget(kind, &gone);
            }
        }
        self.forget_reached_caps();
        Ok(())
    }

    /// Writes when the labels seen since the last write were last seen (one statement per minute
    /// and 500 labels), and forgets those no longer stored. A failed write keeps its sightings
    /// for the next.
    pub async fn write_sightings(&self, store: &Store) -> StoreResult<()> {
        for kind in [LabelKind::Tag, LabelKind::EndUser] {
            let seen = match kind {
                LabelKind::Tag => &self.gate.seen_tags,
                LabelKind::EndUser => &self.gate.seen_end_users,
            };
            let batch: Vec<(i64, i64)> = std::mem::take(&mut *locked(seen)).into_iter().collect();
            if batch.is_empty() {
                continue;
            }
            let written = {
                let batch = batch.clone();
                store
                    .at_home(|s| async move { s.touch_labels(kind, &batch).await })
                    .await
            };
            match written {
                Ok(gone) => self.forget(kind, &gone),
                Err(e) => {
                    let mut seen = locked(seen);
                    for (id, at) in batch {
                        let t = seen.entry(id).or_insert(at);
                        *t = (*t).max(at);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Forgets labels of `kind` deleted from the store (pruned or expired): their next request
    /// reads or makes their row again, under the caps.
    pub fn forget(&self, kind: LabelKind, ids: &[i64]) {
        if ids.is_empty() {
            return;
        }
        let ids: HashSet<i64> = ids.iter().copied().collect();
        match kind {
            LabelKind::Tag => {
                locked(&self.tags).retain(|_, id| !ids.contains(id));
                locked(&self.gate.seen_tags).retain(|id, _| !ids.contains(id));
            }
            LabelKind::EndUser => {
                locked(&self.end_users).retain(|_, id| !ids.contains(id));
                locked(&self.gate.seen_end_users).retain(|id, _| !ids.contains(id));
            }
        }
        self.forget_reached_caps();
    }

    /// Forgets every cap remembered as reached: rows may have been deleted since.
    fn forget_reached_caps(&self) {
        locked(&self.full_tags).clear();
        locked(&self.full_end_users).clear();
        locked(&self.gate.full_keys).clear();
    }
}

/// The refusal of a new label past a cap, naming the cap.
fn refusal(refused: Refused, tag_key: Option<&str>, caps: LabelCaps, per_key: LabelCaps) -> ApiError {
    let of = if refused.per_key { per_key } else { caps };
    let limit = match refused.over {
        OverCap::TagKeys => of.tag_keys,
        OverCap::TagValues => of.tag_values,
        OverCap::EndUsers => of.end_users,
    };
    ApiError::LabelLimit {
        over: refused.over,
        tag_key: tag_key
            .filter(|_| refused.over != OverCap::EndUsers)
            .map(str::to_owned),
        limit,
        per_key: refused.per_key,
    }
}
