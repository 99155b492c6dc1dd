//! The subject ids of tag values and end users (issue 25 item 6), cached: a request's labels are
//! resolved from memory, and only a value this gateway has not seen yet reads (or makes) its row
//! in the store, where the workspace's caps and the caps of the key that brings it are checked
//! (`gate.rs`). Known values keep working past a cap; only a new one is refused. A cap found
//! reached is remembered until the next upkeep (a minute at most: prunes and expiry delete
//! rows), so a client that keeps sending new values past it costs one indexed lookup each,
//! never a count. While the database is away a new value is served from memory under a
//! provisional id and stored when it is back ([`outage`]).

mod gate;
mod outage;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::policy::Labels;
use crate::error::ApiError;
use crate::kernel::tags::Tags;
use crate::store::{LabelCaps, Store};

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
    /// New labels admitted one at a time per workspace, per-key caps, sightings (`gate.rs`).
    gate: gate::LabelGate,
}

/// The key a request's new labels are brought by, and the caps on what one key brings
/// (`max_*_per_key`).
#[derive(Clone, Copy, Debug)]
pub struct BroughtBy {
    /// The API key.
    pub api_key_id: i64,
    /// Its caps.
    pub caps: LabelCaps,
}

impl LabelIds {
    /// The subject ids of a request's tags and end user in workspace `ws`; a new one past a cap
    /// is refused (`tag_value_limit`, `end_user_limit`).
    #[expect(clippy::too_many_arguments, reason = "the request's parts, each named")]
    pub async fn resolve(
        &self,
        store: &Store,
        caps: LabelCaps,
        by: BroughtBy,
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
                    self.admit_tag(store, caps, by.caps, ws, by.api_key_id, key, value, now_ms)
                        .await?
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
                    self.admit_end_user(store, caps, by.caps, ws, by.api_key_id, user, now_ms)
                        .await?
                }
            };
            labels.end_user = Some((user.to_owned(), id));
        }
        self.gate.saw(&labels, now_ms);
        Ok(labels)
    }
}
