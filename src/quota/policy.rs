//! The quota policies as the engine evaluates them: each stored policy parsed once, by workspace,
//! and which of them apply to a caller (DESIGN.md §4).

use std::collections::HashMap;

use super::window::Window;
use super::{Metric, Mode, SubjectKind};
use crate::caller::Caller;
use crate::store::{PolicyRow, PolicyStore, Store, StoreResult};

/// A policy ready to evaluate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyRule {
    /// Row id.
    pub id: i64,
    /// Whose usage.
    pub subject: SubjectKind,
    /// The one subject, or 0 for each.
    pub target_id: i64,
    /// For "each": only inside this department (0: the whole workspace).
    pub scope_department_id: i64,
    /// What is counted.
    pub metric: Metric,
    /// Over which window.
    pub window: Window,
    /// The limit (micro-credits for credits).
    pub limit: i64,
    /// Enforce or shadow.
    pub mode: Mode,
}

/// Every policy, by workspace.
#[derive(Debug, Default)]
pub struct Policies {
    by_workspace: HashMap<i64, Vec<PolicyRule>>,
}

impl Policies {
    /// Loads every policy; a row that does not parse is skipped with an error in the log.
    pub async fn load(store: &Store) -> StoreResult<Policies> {
        let mut p = Policies::default();
        for row in store.all_policies().await? {
            match PolicyRule::from_row(&row) {
                Some(r) => p.by_workspace.entry(row.workspace_id).or_default().push(r),
                None => tracing::error!(policy = row.id, "unreadable policy row skipped"),
            }
        }
        Ok(p)
    }

    /// The policies that apply to `caller`, with the subject each one counts.
    pub fn applying_to<'a>(&'a self, caller: &Caller) -> Vec<(&'a PolicyRule, i64)> {
        let Some(rules) = self.by_workspace.get(&caller.workspace_id) else {
            return Vec::new();
        };
        rules
            .iter()
            .filter_map(|r| {
                let subject_id = match r.subject {
                    SubjectKind::Apikey => caller.key_id,
                    SubjectKind::Member => caller.member_id,
                    SubjectKind::Dept => caller.department_id?,
                    SubjectKind::Ws => caller.workspace_id,
                };
                let named = r.target_id == subject_id;
                let each = r.target_id == 0
                    && (r.scope_department_id == 0 || Some(r.scope_department_id) == caller.department_id);
                (named || each).then_some((r, subject_id))
            })
            .collect()
    }
}

impl PolicyRule {
    /// The rule of a stored policy; none if a field does not parse (a damaged row).
    pub fn from_row(row: &PolicyRow) -> Option<PolicyRule> {
        Some(PolicyRule {
            id: row.id,
            subject: row.subject.parse().ok()?,
            target_id: row.target_id,
            scope_department_id: row.scope_department_id,
            metric: row.metric.parse().ok()?,
            window: row.time_window.parse().ok()?,
            limit: row.limit_value,
            mode: row.mode.parse().ok()?,
        })
    }
}
