//! The subject ids of tag values and end users (issue 25 item 6), cached: a request's labels are
//! resolved from memory, and only a value this gateway has not seen yet reads (or makes) its row
//! in the store, where the workspace's caps are checked. Known values keep working past a cap;
//! only a new one is refused. A cap once reached stays reached (rows are never deleted, caps
//! change with a restart): it is remembered, so a client that keeps sending new values past it
//! costs one indexed lookup each, never a count. While the database is away a new value is served
//! from memory under a provisional id and stored when it is back ([`outage`]).

mod outage;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::policy::Labels;
use crate::error::ApiError;
use crate::store::{LabelCaps, LabelStore, OverCap, Store};
use crate::tags::Tags;

/// Tag values and end users this gateway has seen, by workspace, with their ids. Bounded by the
/// caps: no more entries than the store has rows.
#[derive(Default)]
pub struct LabelIds {
    tags: Mutex<HashMap<(i64, String, String), i64>>,
    end_users: Mutex<HashMap<(i64, String), i64>>,
    /// Caps found reached: (workspace, the tag key for its values; none for the tag keys
    /// themselves) and workspaces full of end users.
    full_tags: Mutex<HashSet<(i64, Option<String>)>>,
    full_end_users: Mutex<HashSet<i64>>,
    /// New labels served while the database is away, stored when it is back.
    outage: outage::OutageLabels,
}

impl LabelIds {
    /// The subject ids of a request's tags and end user in workspace `ws`; a new one past a cap
    /// is refused (`tag_value_limit`, `end_user_limit`).
    pub async fn resolve(
        &self,
        store: &Store,
        caps: LabelCaps,
        ws: i64,
        tags: &Tags,
        end_user: Option<&str>,
        now_ms: i64,
    ) -> Result<Labels, ApiError> {
        let mut labels = Labels::default();
        for (key, value) in tags.iter() {
            let cached = self
                .tags
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&(ws, key.to_owned(), value.to_owned()))
                .copied();
            let id = match cached {
                Some(id) => id,
                None => {
                    let (k, v) = (key.to_owned(), value.to_owned());
                    let known = {
                        let full = self.full_tags.lock().unwrap_or_else(|p| p.into_inner());
                        LabelCaps {
                            tag_keys: if full.contains(&(ws, None)) {
                                0
                            } else {
                                caps.tag_keys
                            },
                            tag_values: if full.contains(&(ws, Some(k.clone()))) {
                                0
                            } else {
                                caps.tag_values
                            },
                            ..caps
                        }
                    };
                    let found = match store.fail_fast() {
                        Ok(()) => {
                            store
                                .at_home(
                                    |s| async move { s.tag_value_id(ws, &k, &v, Some(known), now_ms).await },
                                )
                                .await
                        }
                        Err(e) => Err(e),
                    };
                    let found = match found {
                        Ok(found) => found,
                        Err(e) => Ok(self.outage.tag(store, e, ws, key, value, known)?),
                    };
                    let id = found.map_err(|over| {
                        let scope = (over == OverCap::TagValues).then(|| key.to_owned());
                        self.full_tags
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert((ws, scope));
                        refusal(over, key, caps)
                    })?;
                    self.tags
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert((ws, key.to_owned(), value.to_owned()), id);
                    id
                }
            };
            labels.tags.push((key.to_owned(), value.to_owned(), id));
        }
        if let Some(user) = end_user {
            let cached = self
                .end_users
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&(ws, user.to_owned()))
                .copied();
            let id = match cached {
                Some(id) => id,
                None => {
                    let u = user.to_owned();
                    let known = LabelCaps {
                        end_users: if self
                            .full_end_users
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .contains(&ws)
                        {
                            0
                        } else {
                            caps.end_users
                        },
                        ..caps
                    };
                    let found = match store.fail_fast() {
                        Ok(()) => {
                            store
                                .at_home(|s| async move { s.end_user_id(ws, &u, Some(known), now_ms).await })
                                .await
                        }
                        Err(e) => Err(e),
                    };
                    let found = match found {
                        Ok(found) => found,
                        Err(e) => Ok(self.outage.end_user(store, e, ws, user, known)?),
                    };
                    let id = found.map_err(|over| {
                        self.full_end_users
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(ws);
                        refusal(over, user, caps)
                    })?;
                    self.end_users
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert((ws, user.to_owned()), id);
                    id
                }
            };
            labels.end_user = Some((user.to_owned(), id));
        }
        Ok(labels)
    }
}

fn refusal(over: OverCap, key: &str, caps: LabelCaps) -> ApiError {
    let limit = match over {
        OverCap::TagKeys => caps.tag_keys,
        OverCap::TagValues => caps.tag_values,
        OverCap::EndUsers => caps.end_users,
    };
    ApiError::LabelLimit {
        over,
        tag_key: (over != OverCap::EndUsers).then(|| key.to_owned()),
        limit,
    }
}
