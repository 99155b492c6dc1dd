//! Labels first seen while the database is away (issue 40 item 2): a known key that brings a new
//! end user or tag value is served like the rest, from memory. The new label gets a provisional
//! subject id (negative, never a stored row's) that its counters are keyed by; the first quota
//! flush after the database is back stores the label and moves its counters to the stored id
//! ([`QuotaCounters::relabel`]), so nothing counted is lost or counted twice.
//!
//! Bounded like the store: a workspace holds at most `max_end_users` provisional end users,
//! `max_tag_keys` provisional tag keys and `max_tag_values` provisional values of each key; past
//! that, and for a workspace already known to be full, a new label is refused 503
//! `store_unavailable` as before. Labels are stored when the database is back whatever its caps
//! (they were served already), so an outage can take a workspace past a cap by at most that much.

use std::collections::HashMap;
use std::sync::Mutex;

use super::LabelIds;
use crate::error::ApiError;
use crate::quota::SubjectKind;
use crate::quota::engine::QuotaCounters;
use crate::store::{LabelCaps, LabelStore, Store, StoreError, StoreResult};

/// The provisional labels waiting for the database.
#[derive(Default)]
pub(super) struct OutageLabels {
    waiting: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    /// The last provisional id given (0, then -1, -2, …: never reused in a process).
    last_id: i64,
    /// Tag values: (workspace, key, value) to provisional id.
    tags: HashMap<(i64, String, String), i64>,
    /// End users: (workspace, end user) to provisional id.
    end_users: HashMap<(i64, String), i64>,
    /// Provisional values of each (workspace, tag key).
    values_of_key: HashMap<(i64, String), i64>,
    /// Provisional tag keys of each workspace.
    keys_of_ws: HashMap<i64, i64>,
    /// Provisional end users of each workspace.
    users_of_ws: HashMap<i64, i64>,
}

impl Waiting {
    fn next_id(&mut self) -> i64 {
        self.last_id -= 1;
        self.last_id
    }
}

impl OutageLabels {
    /// The provisional id of tag `key=value` in `ws` after the store failed with `e`; the
    /// error itself when it is not an outage, or the bound is reached. `known` caps of 0 mean
    /// the workspace is known to be full.
    pub(super) fn tag(
        &self,
        store: &Store,
        e: StoreError,
        ws: i64,
        key: &str,
        value: &str,
        known: LabelCaps,
    ) -> Result<i64, ApiError> {
        if !store.note_failure(&e) || known.tag_keys == 0 || known.tag_values == 0 {
            return Err(e.into());
        }
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let label = (ws, key.to_owned(), value.to_owned());
        if let Some(id) = w.tags.get(&label) {
            return Ok(*id);
        }
        let values = w.values_of_key.get(&(ws, key.to_owned())).copied().unwrap_or(0);
        let keys = w.keys_of_ws.get(&ws).copied().unwrap_or(0);
        if values >= known.tag_values || (values == 0 && keys >= known.tag_keys) {
            return Err(e.into());
        }
        if values == 0 {
            *w.keys_of_ws.entry(ws).or_default() += 1;
        }
        *w.values_of_key.entry((ws, key.to_owned())).or_default() += 1;
        let id = w.next_id();
        w.tags.insert(label, id);
        Ok(id)
    }

    /// [`OutageLabels::tag`] for end user `user`.
    pub(super) fn end_user(
        &self,
        store: &Store,
        e: StoreError,
        ws: i64,
        user: &str,
        known: LabelCaps,
    ) -> Result<i64, ApiError> {
        if !store.note_failure(&e) || known.end_users == 0 {
            return Err(e.into());
        }
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let label = (ws, user.to_owned());
        if let Some(id) = w.end_users.get(&label) {
            return Ok(*id);
        }
        let users = w.users_of_ws.get(&ws).copied().unwrap_or(0);
        if users >= known.end_users {
            return Err(e.into());
        }
        *w.users_of_ws.entry(ws).or_default() += 1;
        let id = w.next_id();
        w.end_users.insert(label, id);
        Ok(id)
    }
}

impl LabelIds {
    /// Stores the labels first seen while the database was away and moves their counters to
    /// the stored ids; returns how many were stored. Costs nothing when none waits. What cannot
    /// be stored yet (the database away again) waits for the next call.
    pub async fn settle(&self, store: &Store, quota: &QuotaCounters, now_ms: i64) -> StoreResult<usize> {
        let (tags, end_users): (Vec<_>, Vec<_>) = {
            let w = self.outage.waiting.lock().unwrap_or_else(|p| p.into_inner());
            if w.tags.is_empty() && w.end_users.is_empty() {
                return Ok(0);
            }
            (
                w.tags.iter().map(|(k, id)| (k.clone(), *id)).collect(),
                w.end_users.iter().map(|(k, id)| (k.clone(), *id)).collect(),
            )
        };
        store.fail_fast()?;
        let mut moved = Vec::with_capacity(tags.len() + end_users.len());
        let mut outcome = Ok(());
        for ((ws, key, value), provisional) in tags {
            // No caps: the label was served already (module comment).
            let id = match store.tag_value_id(ws, &key, &value, None, now_ms).await {
                Ok(Ok(id)) => id,
                Ok(Err(_)) => continue,
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            };
            self.tags
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((ws, key.clone(), value.clone()), id);
            self.outage.forget_tag(ws, key, value);
            moved.push((SubjectKind::Tag, provisional, id));
        }
        if outcome.is_ok() {
            for ((ws, user), provisional) in end_users {
                let id = match store.end_user_id(ws, &user, None, now_ms).await {
                    Ok(Ok(id)) => id,
                    Ok(Err(_)) => continue,
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                };
                self.end_users
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert((ws, user.clone()), id);
                self.outage.forget_end_user(ws, user);
                moved.push((SubjectKind::EndUser, provisional, id));
            }
        }
        quota.relabel(&moved, now_ms).await;
        if !moved.is_empty() {
            tracing::info!(labels = moved.len(), "labels first seen during the outage stored");
        }
        outcome.map(|()| moved.len())
    }
}

impl OutageLabels {
    fn forget_tag(&self, ws: i64, key: String, value: String) {
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if w.tags.remove(&(ws, key.clone(), value)).is_none() {
            return;
        }
        let left = w.values_of_key.get_mut(&(ws, key.clone())).map(|n| {
            *n -= 1;
            *n
        });
        if left == Some(0) {
            w.values_of_key.remove(&(ws, key));
            if let Some(n) = w.keys_of_ws.get_mut(&ws) {
                *n -= 1;
            }
        }
    }

    fn forget_end_user(&self, ws: i64, user: String) {
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if w.end_users.remove(&(ws, user)).is_some()
            && let Some(n) = w.users_of_ws.get_mut(&ws)
        {
            *n -= 1;
        }
    }
}
