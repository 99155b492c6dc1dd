//! Policies on tag values and end users (issue 25 item 6), as the admin API names them: a tag
//! policy's target is a tag value (`team=search`), every value of a key (`team=*`, stored as the
//! key's `*` row) or each value of every key (`*`, target id 0); an end-user policy's target is
//! one end user or each (`*`).

use std::collections::HashMap;

use super::{AdminResult, store_error};
use crate::error::ApiError;
use crate::kernel::tags;
use crate::quota::SubjectKind;
use crate::quota::engine::PolicyRule;
use crate::state::AppState;
use crate::store::{EndUserRow, LabelStore, PolicyRow, Table, TagValueRow};

/// The tag values and end users of one workspace that its policies (or their counters) name.
#[derive(Default)]
pub(super) struct LabelNames {
    tags: HashMap<i64, TagValueRow>,
    end_users: HashMap<i64, EndUserRow>,
}

impl LabelNames {
    /// The targets of workspace `ws`'s tag and end-user policies.
    pub(super) async fn of_policies(state: &AppState, ws: i64) -> AdminResult<LabelNames> {
        use crate::store::AdminStore;
        let rows: Vec<PolicyRow> = state
            .store
            .rows_in(Table::Policies, ws)
            .await
            .map_err(store_error)?;
        LabelNames::of_rows(state, ws, &rows).await
    }

    /// The targets of the tag and end-user policies among `rows` (of workspace `ws`).
    pub(super) async fn of_rows(state: &AppState, ws: i64, rows: &[PolicyRow]) -> AdminResult<LabelNames> {
        let mut names = LabelNames::default();
        for kind in [SubjectKind::Tag, SubjectKind::EndUser] {
            let ids = rows
                .iter()
                .filter(|p| p.subject == kind.as_str() && p.target_id != 0)
                .map(|p| p.target_id);
            names.learn(state, ws, kind, ids).await?;
        }
        Ok(names)
    }

    /// Learns the names of subjects `ids` of `kind` that belong to workspace `ws`.
    pub(super) async fn learn(
        &mut self,
        state: &AppState,
        ws: i64,
        kind: SubjectKind,
        ids: impl Iterator<Item = i64>,
    ) -> AdminResult<()> {
        let ids: Vec<i64> = match kind {
            SubjectKind::Tag => ids.filter(|id| !self.tags.contains_key(id)).collect(),
            SubjectKind::EndUser => ids.filter(|id| !self.end_users.contains_key(id)).collect(),
            _ => return Ok(()),
        };
        if ids.is_empty() {
            return Ok(());
        }
        if kind == SubjectKind::Tag {
            let rows = state.store.tag_values_with_ids(&ids).await.map_err(store_error)?;
            self.tags.extend(
                rows.into_iter()
                    .filter(|r| r.workspace_id == ws)
                    .map(|r| (r.id, r)),
            );
        } else {
            let rows = state.store.end_users_with_ids(&ids).await.map_err(store_error)?;
            self.end_users.extend(
                rows.into_iter()
                    .filter(|r| r.workspace_id == ws)
                    .map(|r| (r.id, r)),
            );
        }
        Ok(())
    }

    /// `team=search` (`team=*` for a key's every value), or the end user's id.
    pub(super) fn name(&self, kind: SubjectKind, id: i64) -> Option<String> {
        match kind {
            SubjectKind::Tag => self
                .tags
                .get(&id)
                .map(|t| format!("{}={}", t.tag_key, t.tag_value)),
            SubjectKind::EndUser => self.end_users.get(&id).map(|e| e.end_user.clone()),
            _ => None,
        }
    }

    /// Whether `rule` is a tag policy on every value of one key (`team=*`).
    pub(super) fn is_each_value(&self, rule: &PolicyRule) -> bool {
        rule.subject == SubjectKind::Tag && self.tags.get(&rule.target_id).is_some_and(|t| t.tag_value == "*")
    }

    /// Whether tag or end-user `rule` counts subject `id` of this workspace.
    pub(super) fn covers(&self, rule: &PolicyRule, id: i64) -> bool {
        match rule.subject {
            SubjectKind::Tag => {
                let Some(value) = self.tags.get(&id).filter(|t| t.tag_value != "*") else {
                    return false;
                };
                match self.tags.get(&rule.target_id) {
                    _ if rule.target_id == 0 => true,
                    Some(t) if t.tag_value == "*" => t.tag_key == value.tag_key,
                    _ => rule.target_id == id,
                }
            }
            SubjectKind::EndUser => {
                self.end_users.contains_key(&id) && (rule.target_id == 0 || rule.target_id == id)
            }
            _ => false,
        }
    }

    /// The target id of a new tag or end-user policy from its `target` text (0: each), made if
    /// new (an admin's target is not held to the caps on what clients send).
    pub(super) async fn target(
        &mut self,
        state: &AppState,
        ws: i64,
        kind: SubjectKind,
        target_id: Option<i64>,
        target: Option<&str>,
    ) -> AdminResult<i64> {
        if target_id.is_some() {
            return Err(ApiError::field(
                "target_id",
                "a tag or end-user policy names its target with `target` (e.g. \"team=search\")",
            ));
        }
        let target = target.map(str::trim).unwrap_or("*");
        if target == "*" {
            return Ok(0);
        }
        let now = state.clock.now_ms();
        let id = if kind == SubjectKind::Tag {
            let Some((key, value)) = target
                .split_once('=')
                .filter(|(k, v)| tags::valid_key(k) && (*v == "*" || tags::valid_value(v)))
            else {
                return Err(ApiError::field(
                    "target",
                    format!("tag target {target:?} must be `key=value`, `key=*` or `*`"),
                ));
            };
            state.store.tag_value_id(ws, key, value, None, now).await
        } else {
            if !matches!(tags::end_user(Some(target.as_bytes()), &[]), Ok(Some(_))) {
                return Err(ApiError::field(
                    "target",
                    format!(
                        "an end user is 1 to {} printable characters, or `*`",
                        tags::MAX_END_USER_LEN
                    ),
                ));
            }
            state.store.end_user_id(ws, target, None, now).await
        };
        let id = id.map_err(store_error)?.unwrap_or_default();
        self.learn(state, ws, kind, [id].into_iter()).await?;
        Ok(id)
    }
}
